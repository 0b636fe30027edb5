//! What the pieces of a node's GPU setup must agree on, read from their files: the agent
//! module's parameters and its Docker hook's `docker_args` command line (`modules-docker.json`),
//! the agent's `--docker` wrapper script (`mesos-gpu-docker`), and `serve`'s options
//! (`/etc/default/mesos-gpu`).
//!
//! Every process that grants GPUs (the module, the hook's `docker-args`, `serve`) must load one
//! NVML library and read one device root; every piece uses one GPU pool directory; and
//! `docker-args`, the wrapper and `serve` keep the Docker containers' records in one
//! `--docker-state-dir`. A process that sees other GPUs than those recorded keeps the records it cannot
//! check and grants none of their GPUs (`docs/architecture.md`, "The node's GPU pool"), so a
//! disagreement costs GPUs, never isolation; [`disagreements`] names it. The wrapper loads no
//! NVML and reads no device node, so it names neither.
//!
//! Only its tests (the shipped files agree) use it for now; `mesos-gpu doctor` is to run it on a
//! node's installed files.

use std::collections::BTreeMap;
use std::fmt;

use anyhow::Context as _;
use mesos_gpu_isolator::discovery::DEFAULT_NVML_LIB;
use mesos_gpu_isolator::pool::{DEFAULT_POOL_DIR, POOL_DIR_ENV};

use crate::cmd::DEFAULT_DOCKER_STATE_DIR;

/// The isolator module's name in a modules file.
const ISOLATOR_MODULE: &str = "org_apache_mesos_gpu_MesosGpuIsolator";
/// The Docker hook module's name in a modules file.
const HOOK_MODULE: &str = "org_apache_mesos_gpu_MesosGpuDockerHook";
/// The device root every command and the module read by default.
const DEFAULT_DEV_ROOT: &str = "/dev";

/// A setting the pieces must agree on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Setting {
    /// The NVML library loaded.
    NvmlLib,
    /// The directory of the `nvidia*` device nodes.
    DevRoot,
    /// The node's GPU pool directory.
    PoolDir,
    /// The Docker containers' records (`docker-args --docker-state-dir`).
    DockerStateDir,
}

impl fmt::Display for Setting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Setting::NvmlLib => "NVML library",
            Setting::DevRoot => "device root",
            Setting::PoolDir => "GPU pool directory",
            Setting::DockerStateDir => "Docker records directory",
        })
    }
}

/// What one piece of the setup uses, defaults included.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Piece {
    /// The piece and where it was read (`the Docker hook's docker_args in modules-docker.json`).
    pub(crate) name: String,
    /// The settings it uses, with their values.
    pub(crate) values: BTreeMap<Setting, String>,
}

/// Each pair of pieces naming different values for one setting, as a sentence.
pub(crate) fn disagreements(pieces: &[Piece]) -> Vec<String> {
    let mut by_setting: BTreeMap<Setting, Vec<(&str, &str)>> = BTreeMap::new();
    for piece in pieces {
        for (setting, value) in &piece.values {
            by_setting
                .entry(*setting)
                .or_default()
                .push((&piece.name, value));
        }
    }
    let mut out = Vec::new();
    for (setting, named) in by_setting {
        let Some(&(first, value)) = named.first() else {
            continue;
        };
        for &(other, theirs) in &named[1..] {
            if theirs != value {
                out.push(format!(
                    "{setting}: {first} uses {value}, {other} uses {theirs}"
                ));
            }
        }
    }
    out
}

/// The isolator module and the Docker hook of a modules file (`where_` names it); a module the
/// file does not load is left out.
pub(crate) fn modules_file(where_: &str, json: &str) -> anyhow::Result<Vec<Piece>> {
    let parsed: serde_json::Value =
        serde_json::from_str(json).with_context(|| format!("{where_} is not JSON"))?;
    let mut pieces = Vec::new();
    let modules = parsed["libraries"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|l| l["modules"].as_array().into_iter().flatten());
    for module in modules {
        let params: BTreeMap<&str, &str> = module["parameters"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|p| Some((p["key"].as_str()?, p["value"].as_str()?)))
            .collect();
        match module["name"].as_str() {
            Some(ISOLATOR_MODULE) => pieces.push(Piece {
                name: format!("the isolator module in {where_}"),
                values: BTreeMap::from([
                    (
                        Setting::NvmlLib,
                        param(&params, "nvml_lib", DEFAULT_NVML_LIB),
                    ),
                    (
                        Setting::DevRoot,
                        param(&params, "dev_root", DEFAULT_DEV_ROOT),
                    ),
                    (
                        Setting::PoolDir,
                        param(&params, "pool_dir", DEFAULT_POOL_DIR),
                    ),
                ]),
            }),
            Some(HOOK_MODULE) => {
                let line = params.get("docker_args").with_context(|| {
                    format!("{where_}: the Docker hook has no docker_args parameter")
                })?;
                let args = words(line);
                pieces.push(Piece {
                    name: format!("the Docker hook's docker_args in {where_}"),
                    values: granting(&args, None, DEFAULT_POOL_DIR.to_owned()),
                });
            }
            _ => {}
        }
    }
    Ok(pieces)
}

/// The `docker-wrapper` command line of a `--docker` script or example (`where_` names it).
pub(crate) fn wrapper_script(where_: &str, script: &str) -> anyhow::Result<Piece> {
    let joined = script.replace("\\\n", " ");
    let line = joined
        .lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .find(|l| l.contains("docker-wrapper"))
        .with_context(|| format!("{where_} runs no `mesos-gpu docker-wrapper`"))?;
    let args = words(line);
    Ok(Piece {
        name: format!("the docker-wrapper of {where_}"),
        values: BTreeMap::from([
            (
                Setting::PoolDir,
                flag(&args, "--pool-dir").unwrap_or_else(|| DEFAULT_POOL_DIR.to_owned()),
            ),
            (Setting::DockerStateDir, docker_state_dir(&args)),
        ]),
    })
}

/// `serve` as an environment file of its unit configures it (`MESOS_GPU_SERVE_OPTS`,
/// `MESOS_GPU_NVML_LIB`, `MESOS_GPU_POOL_DIR`; `where_` names it).
pub(crate) fn serve_environment(where_: &str, file: &str) -> anyhow::Result<Piece> {
    let vars: BTreeMap<&str, String> = file
        .lines()
        .map(str::trim)
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (k, v) = l.split_once('=')?;
            Some((k.trim(), v.trim().trim_matches('"').to_owned()))
        })
        .collect();
    let opts = vars
        .get("MESOS_GPU_SERVE_OPTS")
        .with_context(|| format!("{where_} sets no MESOS_GPU_SERVE_OPTS"))?;
    let pool = vars
        .get(POOL_DIR_ENV)
        .cloned()
        .unwrap_or_else(|| DEFAULT_POOL_DIR.to_owned());
    let nvml = vars.get("MESOS_GPU_NVML_LIB").map(String::as_str);
    Ok(Piece {
        name: format!("serve as {where_} starts it"),
        values: granting(&words(opts), nvml, pool),
    })
}

/// What a command that grants GPUs (`docker-args`, `serve`) uses, from its arguments: its NVML
/// library (`--nvml-lib`, else `nvml` from its environment), device root, pool (`--pool-dir`,
/// else `pool`) and Docker records directory.
fn granting(args: &[String], nvml: Option<&str>, pool: String) -> BTreeMap<Setting, String> {
    let nvml = match (flag(args, "--simulate"), flag(args, "--nvml-lib")) {
        (Some(node), _) => format!("the simulated node {node}"),
        (None, Some(lib)) => lib,
        (None, None) => nvml.unwrap_or(DEFAULT_NVML_LIB).to_owned(),
    };
    BTreeMap::from([
        (Setting::NvmlLib, nvml),
        (
            Setting::DevRoot,
            flag(args, "--dev-root").unwrap_or_else(|| DEFAULT_DEV_ROOT.to_owned()),
        ),
        (Setting::PoolDir, flag(args, "--pool-dir").unwrap_or(pool)),
        (Setting::DockerStateDir, docker_state_dir(args)),
    ])
}

/// `--docker-state-dir`, else its old name `--work-dir`, else the default.
fn docker_state_dir(args: &[String]) -> String {
    flag(args, "--docker-state-dir")
        .or_else(|| flag(args, "--work-dir"))
        .unwrap_or_else(|| DEFAULT_DOCKER_STATE_DIR.to_owned())
}

fn param(params: &BTreeMap<&str, &str>, key: &str, default: &str) -> String {
    params.get(key).copied().unwrap_or(default).to_owned()
}

/// The words of a command line, quotes removed (no expansion).
fn words(line: &str) -> Vec<String> {
    line.split_whitespace()
        .map(|w| w.trim_matches(|c| c == '"' || c == '\'').to_owned())
        .collect()
}

/// The value of `--name VALUE` or `--name=VALUE`, trailing slashes dropped.
fn flag(args: &[String], name: &str) -> Option<String> {
    let value = args.iter().enumerate().find_map(|(i, a)| {
        if a == name {
            args.get(i + 1).cloned()
        } else {
            a.strip_prefix(name)?.strip_prefix('=').map(str::to_owned)
        }
    })?;
    let trimmed = value.trim_end_matches('/');
    Some(if trimmed.is_empty() {
        value
    } else {
        trimmed.to_owned()
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::path::Path;

    use super::*;

    fn shipped(rel: &str) -> String {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(rel);
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    }

    /// The fenced shell blocks of `text` that run `docker-wrapper`.
    fn wrapper_blocks(text: &str) -> Vec<String> {
        let mut out = Vec::new();
        let mut block: Option<String> = None;
        for line in text.lines() {
            if line.trim_start().starts_with("```") {
                match block.take() {
                    Some(b) if b.contains("docker-wrapper") => out.push(b),
                    Some(_) => {}
                    None => block = Some(String::new()),
                }
                continue;
            }
            if let Some(b) = &mut block {
                b.push_str(line);
                b.push('\n');
            }
        }
        out
    }

    /// Every piece of the shipped setup: the Docker modules file, the wrapper script, the serve
    /// environment file, the wrapper scripts the operator guide and the example README show, and
    /// the one `docker-wrapper --help` shows.
    fn shipped_setup() -> Vec<Piece> {
        let mut pieces = modules_file(
            "examples/mesos-agent/modules-docker.json",
            &shipped("examples/mesos-agent/modules-docker.json"),
        )
        .unwrap();
        assert_eq!(pieces.len(), 2, "the isolator and the hook: {pieces:?}");
        pieces.push(
            wrapper_script(
                "examples/mesos-agent/mesos-gpu-docker",
                &shipped("examples/mesos-agent/mesos-gpu-docker"),
            )
            .unwrap(),
        );
        pieces.push(
            serve_environment(
                "examples/default/mesos-gpu",
                &shipped("examples/default/mesos-gpu"),
            )
            .unwrap(),
        );
        let guide = wrapper_blocks(&shipped("docs/operator-guide.md"));
        assert!(
            !guide.is_empty(),
            "the operator guide shows no docker-wrapper script"
        );
        for block in guide {
            pieces.push(wrapper_script("docs/operator-guide.md", &block).unwrap());
        }
        for block in wrapper_blocks(&shipped("examples/mesos-agent/README.md")) {
            pieces.push(wrapper_script("examples/mesos-agent/README.md", &block).unwrap());
        }
        let mut cli = <crate::Cli as clap::CommandFactory>::command();
        let help = cli
            .find_subcommand_mut("docker-wrapper")
            .unwrap()
            .render_long_help()
            .to_string();
        pieces.push(wrapper_script("`mesos-gpu docker-wrapper --help`", &help).unwrap());
        pieces
    }

    #[test]
    fn shipped_files_agree_on_nvml_dev_root_pool_and_docker_state_dirs() {
        let pieces = shipped_setup();
        let found = disagreements(&pieces);
        assert!(found.is_empty(), "{found:#?}");
        // The settings are named by each piece that uses them.
        let hook = &pieces[1];
        assert_eq!(hook.values[&Setting::PoolDir], DEFAULT_POOL_DIR);
        assert_eq!(
            hook.values[&Setting::DockerStateDir],
            DEFAULT_DOCKER_STATE_DIR
        );
        assert!(
            !pieces[2].values.contains_key(&Setting::NvmlLib),
            "the wrapper loads no NVML"
        );
    }

    #[test]
    fn a_disagreement_names_both_pieces_and_values() {
        let mut pieces = shipped_setup();
        pieces.push(
            wrapper_script(
                "/usr/local/bin/mesos-gpu-docker",
                "#!/bin/sh\nexec mesos-gpu docker-wrapper --pool-dir /srv/pool/ \\\n  --work-dir=/srv/work -- \"$@\"\n",
            )
            .unwrap(),
        );
        pieces.push(
            serve_environment(
                "/etc/default/mesos-gpu",
                "MESOS_GPU_SERVE_OPTS=\"--work-dir /var/run/mesos-gpu --dev-root /tmp/nodes\"\nMESOS_GPU_NVML_LIB=/opt/libnvidia-ml.so.1\n",
            )
            .unwrap(),
        );
        let found = disagreements(&pieces);
        let mentions = |what: &str| found.iter().any(|d| d.contains(what));
        assert!(
            mentions(
                "GPU pool directory: the isolator module in examples/mesos-agent/modules-docker.json uses /var/lib/mesos-gpu, the docker-wrapper of /usr/local/bin/mesos-gpu-docker uses /srv/pool"
            ),
            "{found:#?}"
        );
        assert!(
            mentions("Docker records directory") && mentions("/srv/work"),
            "{found:#?}"
        );
        assert!(
            mentions("device root") && mentions("/tmp/nodes"),
            "{found:#?}"
        );
        assert!(
            mentions("NVML library") && mentions("/opt/libnvidia-ml.so.1"),
            "{found:#?}"
        );
        assert_eq!(found.len(), 4, "{found:#?}");
    }
}
