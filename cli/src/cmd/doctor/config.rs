//! What the node's configuration files say about the GPU pool, the Docker reservations, the
//! driver volume and sharing, and whether they agree: the module's `modules.json` (the isolator's
//! parameters and the Docker hook's `docker_args` command line), the `--docker` wrapper script,
//! `/etc/default/mesos-gpu` and the `mesos-gpu` systemd unit. Parsing and comparing are pure; only
//! [`Sources::read`] touches files.
//!
//! Every process handing out the node's GPUs must name the same pool directory (the module's
//! `pool_dir`, `docker-args --pool-dir`, the wrapper's and `serve`'s), the Docker side the same
//! reservations directory (`--work-dir` of `docker-args`, the wrapper and `serve`), and the module
//! and the Docker side the same volume root; `serve --agent-work-dir` is the agent's work
//! directory (the module's `work_dir`), whose health checkpoint it reports. All of them must open
//! the same NVML library and read the same device root: one that names none uses the default
//! (`/dev`, and the `libnvidia-ml.so.1` the dynamic loader finds).

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::Context as _;
use serde::Serialize;

use super::report::{Check, Status};

/// The module's name in `modules.json`.
pub(crate) const ISOLATOR_MODULE: &str = "org_apache_mesos_gpu_MesosGpuIsolator";
/// The Docker hook's name.
const HOOK_MODULE: &str = "org_apache_mesos_gpu_MesosGpuDockerHook";
/// The variable of `/etc/default/mesos-gpu` holding `serve`'s flags.
const SERVE_OPTS: &str = "MESOS_GPU_SERVE_OPTS";

/// A setting, as named by one source, with the default applied when the source omits it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct Setting {
    /// What names it: `modules.json pool_dir`, `wrapper --pool-dir`.
    pub(crate) source: String,
    /// The value.
    pub(crate) value: String,
    /// True when the source does not name it and the value is the default.
    pub(crate) defaulted: bool,
}

/// One program's view: its settings by key (`pool_dir`, `work_dir`, …).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct View {
    /// The program and file, e.g. `the module (modules.json)`.
    pub(crate) name: String,
    /// Settings given explicitly.
    pub(crate) given: BTreeMap<&'static str, String>,
}

/// Every view found.
#[derive(Debug, Clone, Default)]
pub(crate) struct Sources {
    /// The isolator module's parameters.
    pub(crate) module: Option<View>,
    /// The Docker hook's `docker_args` command line.
    pub(crate) hook: Option<View>,
    /// The `--docker` wrapper's `docker-wrapper` command line.
    pub(crate) wrapper: Option<View>,
    /// `serve`'s flags (the unit's `ExecStart`, with `/etc/default/mesos-gpu`'s variables).
    pub(crate) serve: Option<View>,
    /// Files that were named but could not be used, with why.
    pub(crate) unreadable: Vec<String>,
}

/// The files to read; `None` is not looked at.
pub(crate) struct Files<'a> {
    pub(crate) modules: Option<&'a Path>,
    pub(crate) wrapper: Wrapper<'a>,
    pub(crate) defaults: &'a Path,
    pub(crate) unit: &'a Path,
}

/// Where the `--docker` wrapper script is.
pub(crate) enum Wrapper<'a> {
    /// Named by the operator: it must be readable.
    Named(&'a Path),
    /// Where the guide installs it: looked at when present.
    Installed(&'a Path),
}

impl Sources {
    /// Reads `files`. A modules or wrapper file that was named must be readable; the defaults
    /// file, the unit and a wrapper at its installed place may be absent (not installed).
    pub(crate) fn read(files: &Files<'_>) -> Sources {
        let mut sources = Sources::default();
        let mut read = |path: &Path, required: bool| match std::fs::read_to_string(path) {
            Ok(text) => Some(text),
            Err(e) if !required && e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => {
                sources.unreadable.push(format!("{}: {e}", path.display()));
                None
            }
        };
        let modules = files.modules.and_then(|p| read(p, true).map(|t| (p, t)));
        let wrapper = match files.wrapper {
            Wrapper::Named(p) => read(p, true).map(|t| (p, t)),
            Wrapper::Installed(p) => read(p, false).map(|t| (p, t)),
        };
        let defaults = read(files.defaults, false);
        let unit = read(files.unit, false);
        if let Some((path, text)) = modules {
            match parse_modules(&text) {
                Ok((module, hook)) => {
                    sources.module = module.map(|given| View {
                        name: format!("the module ({})", path.display()),
                        given,
                    });
                    sources.hook = hook.map(|given| View {
                        name: format!("the Docker hook's docker_args ({})", path.display()),
                        given,
                    });
                }
                Err(e) => sources
                    .unreadable
                    .push(format!("{}: {e:#}", path.display())),
            }
        }
        if let Some((path, text)) = wrapper {
            match parse_wrapper(&text) {
                Some(given) => {
                    sources.wrapper = Some(View {
                        name: format!("the --docker wrapper ({})", path.display()),
                        given,
                    });
                }
                None => sources.unreadable.push(format!(
                    "{}: no `mesos-gpu docker-wrapper` command line in it",
                    path.display()
                )),
            }
        }
        sources.serve = serve_view(
            unit.as_deref().map(|t| (files.unit, t)),
            defaults.as_deref().map(|t| (files.defaults, t)),
        );
        sources
    }
}

/// The module's and the hook's settings in a `modules.json`.
#[allow(clippy::type_complexity)]
fn parse_modules(
    text: &str,
) -> anyhow::Result<(
    Option<BTreeMap<&'static str, String>>,
    Option<BTreeMap<&'static str, String>>,
)> {
    let json: serde_json::Value = serde_json::from_str(text).context("not JSON")?;
    let (mut module, mut hook) = (None, None);
    for library in json["libraries"].as_array().into_iter().flatten() {
        for m in library["modules"].as_array().into_iter().flatten() {
            let params: Vec<(&str, &str)> = m["parameters"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|p| Some((p["key"].as_str()?, p["value"].as_str()?)))
                .collect();
            match m["name"].as_str() {
                Some(ISOLATOR_MODULE) => {
                    let mut given = BTreeMap::new();
                    for (key, value) in params {
                        if let Some(known) = MODULE_KEYS.iter().find(|k| **k == key) {
                            given.insert(*known, value.to_owned());
                        }
                    }
                    module = Some(given);
                }
                Some(HOOK_MODULE) => {
                    let line = params
                        .iter()
                        .find(|(k, _)| *k == "docker_args")
                        .map(|(_, v)| *v)
                        .context("the Docker hook has no docker_args parameter")?;
                    hook = Some(command_settings(&split_words(line)));
                }
                _ => {}
            }
        }
    }
    Ok((module, hook))
}

/// Module parameters that matter here, under the names the report uses.
const MODULE_KEYS: &[&str] = &[
    "work_dir",
    "pool_dir",
    "volume_root",
    "dev_root",
    "nvml_lib",
    "gpu_replicas",
    "gpu_sharing",
    "mps_control",
    "mig_strategy",
];

/// Command-line flags that matter here, and the key each is reported under.
const FLAGS: &[(&str, &str)] = &[
    ("--pool-dir", "pool_dir"),
    ("--work-dir", "docker_work_dir"),
    ("--volume-root", "volume_root"),
    ("--agent-work-dir", "work_dir"),
    ("--dev-root", "dev_root"),
    ("--nvml-lib", "nvml_lib"),
    ("--gpu-replicas", "gpu_replicas"),
    ("--gpu-sharing", "gpu_sharing"),
    ("--mps-control", "mps_control"),
    ("--mig-strategy", "mig_strategy"),
];

/// The settings `words` (a mesos-gpu command line) gives: `--flag VALUE` and `--flag=VALUE`, up
/// to a `--` (what follows is another program's).
fn command_settings(words: &[String]) -> BTreeMap<&'static str, String> {
    let mut given = BTreeMap::new();
    let mut words = words.iter().take_while(|w| *w != "--");
    while let Some(word) = words.next() {
        for (flag, key) in FLAGS {
            if word == flag {
                if let Some(value) = words.next() {
                    given.insert(*key, value.clone());
                }
            } else if let Some(value) = word.strip_prefix(flag).and_then(|r| r.strip_prefix('=')) {
                given.insert(*key, value.to_owned());
            }
        }
    }
    given
}

/// The `mesos-gpu docker-wrapper …` command line of a wrapper script, continuation lines joined.
fn parse_wrapper(text: &str) -> Option<BTreeMap<&'static str, String>> {
    let joined = text.replace("\\\n", " ");
    let line = joined
        .lines()
        .map(str::trim)
        .filter(|l| !l.starts_with('#'))
        .find(|l| l.contains("docker-wrapper"))?;
    let words = split_words(line);
    let mut given = command_settings(&words);
    // `VAR=value` words before the subcommand (`VAR=… exec mesos-gpu`, `exec env VAR=…
    // mesos-gpu`): the environment mesos-gpu reads.
    for word in words
        .iter()
        .take_while(|w| *w != "docker-wrapper")
        .filter(|w| w.split_once('=').is_some_and(|(name, _)| is_variable(name)))
    {
        if let Some(value) = word.strip_prefix("MESOS_GPU_NVML_LIB=") {
            given.entry("nvml_lib").or_insert_with(|| value.to_owned());
        }
        if let Some(value) =
            word.strip_prefix(&format!("{}=", mesos_gpu_isolator::pool::POOL_DIR_ENV))
        {
            given.entry("pool_dir").or_insert_with(|| value.to_owned());
        }
    }
    Some(given)
}

/// A shell variable name: a letter or `_`, then letters, digits or `_`.
fn is_variable(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// `serve`'s settings: the unit's `ExecStart` with its `$VARIABLES` taken from its `Environment=`
/// lines and the defaults file, else (no unit) the defaults file's `MESOS_GPU_SERVE_OPTS`.
fn serve_view(unit: Option<(&Path, &str)>, defaults: Option<(&Path, &str)>) -> Option<View> {
    let mut env = defaults.map(|(_, t)| env_file(t)).unwrap_or_default();
    let (name, line) = match unit {
        Some((path, text)) => {
            let mut exec = None;
            for line in text.lines().map(str::trim) {
                if let Some(assignments) = line.strip_prefix("Environment=") {
                    for word in split_words(assignments) {
                        if let Some((k, v)) = word.split_once('=') {
                            env.insert(k.to_owned(), v.to_owned());
                        }
                    }
                } else if let Some(command) = line.strip_prefix("ExecStart=") {
                    exec = Some(command.trim_start_matches(['-', '@', '+', '!']).to_owned());
                }
            }
            let name = match defaults {
                Some((d, _)) => format!("serve ({} with {})", path.display(), d.display()),
                None => format!("serve ({})", path.display()),
            };
            (name, exec?)
        }
        None => {
            let (path, _) = defaults?;
            let opts = env.get(SERVE_OPTS)?.clone();
            (
                format!("serve ({} {SERVE_OPTS})", path.display()),
                format!("mesos-gpu serve {opts}"),
            )
        }
    };
    let mut words = Vec::new();
    for word in split_words(&line) {
        let var = word
            .strip_prefix("${")
            .and_then(|w| w.strip_suffix('}'))
            .or_else(|| word.strip_prefix('$'));
        match var {
            // systemd splits an unbraced `$VAR` into words, keeps `${VAR}` as one.
            Some(var) => words.extend(split_words(env.get(var).map_or("", String::as_str))),
            None => words.push(word),
        }
    }
    let mut given = command_settings(&words);
    if let Some(pool) = env.get(mesos_gpu_isolator::pool::POOL_DIR_ENV) {
        given.entry("pool_dir").or_insert_with(|| pool.clone());
    }
    if let Some(lib) = env.get("MESOS_GPU_NVML_LIB") {
        given.entry("nvml_lib").or_insert_with(|| lib.clone());
    }
    Some(View { name, given })
}

/// `VAR="value"` lines of an environment file (systemd's `EnvironmentFile`), comments skipped.
fn env_file(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .filter_map(|l| {
            let (k, v) = l.split_once('=')?;
            let v = v.trim();
            let v = v
                .strip_prefix('"')
                .and_then(|v| v.strip_suffix('"'))
                .or_else(|| v.strip_prefix('\'').and_then(|v| v.strip_suffix('\'')))
                .unwrap_or(v);
            Some((k.trim().to_owned(), v.to_owned()))
        })
        .collect()
}

/// Splits a command line into words as a POSIX shell would without expanding anything: blanks
/// separate words, quotes group, a backslash escapes the next character (outside single quotes).
pub(crate) fn split_words(line: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut in_word = false;
    let mut chars = line.chars();
    let mut quote: Option<char> = None;
    while let Some(c) = chars.next() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some('"'), '\\') => {
                if let Some(next) = chars.next() {
                    word.push(next);
                }
            }
            (Some(_), c) => word.push(c),
            (None, '\'' | '"') => {
                quote = Some(c);
                in_word = true;
            }
            (None, '\\') => {
                if let Some(next) = chars.next() {
                    word.push(next);
                    in_word = true;
                }
            }
            (None, c) if c.is_whitespace() => {
                if in_word {
                    words.push(std::mem::take(&mut word));
                    in_word = false;
                }
            }
            (None, c) => {
                word.push(c);
                in_word = true;
            }
        }
    }
    if in_word {
        words.push(word);
    }
    words
}

/// The defaults every program applies when a setting is not given.
pub(crate) struct Defaults {
    pub(crate) pool_dir: String,
    pub(crate) docker_work_dir: String,
    pub(crate) volume_root: String,
    pub(crate) agent_work_dir: String,
    /// The NVML library a program naming none opens: the file the dynamic loader finds for
    /// `libnvidia-ml.so.1` where known, else that name.
    pub(crate) nvml_lib: String,
    pub(crate) dev_root: String,
}

/// What must agree, and between whom: (key, what it is, which views, whether a view that does
/// not name it counts with the default).
const AGREEMENTS: &[(&str, &str, &[&str], bool)] = &[
    (
        "pool_dir",
        "the node's GPU pool directory",
        &["module", "hook", "wrapper", "serve"],
        true,
    ),
    (
        "docker_work_dir",
        "the Docker reservations directory (--work-dir)",
        &["hook", "wrapper", "serve"],
        true,
    ),
    (
        "volume_root",
        "the driver volume root",
        &["module", "hook", "serve"],
        true,
    ),
    (
        "work_dir",
        "the agent's work directory (health checkpoint)",
        &["module", "serve"],
        true,
    ),
    (
        "nvml_lib",
        "the NVML library",
        &["module", "hook", "wrapper", "serve"],
        true,
    ),
    (
        "dev_root",
        "the device root",
        &["module", "hook", "wrapper", "serve"],
        true,
    ),
    (
        "gpu_replicas",
        "the GPU replicas (sharing)",
        &["module", "hook"],
        false,
    ),
    (
        "gpu_sharing",
        "how shares are enforced",
        &["module", "hook"],
        false,
    ),
    (
        "mig_strategy",
        "the MIG strategy",
        &["module", "hook"],
        false,
    ),
];

impl Sources {
    fn views(&self) -> [(&'static str, Option<&View>); 4] {
        [
            ("module", self.module.as_ref()),
            ("hook", self.hook.as_ref()),
            ("wrapper", self.wrapper.as_ref()),
            ("serve", self.serve.as_ref()),
        ]
    }

    /// The `directories` check: every setting of [`AGREEMENTS`] the same in every view that has
    /// it (defaults applied where the program applies them; `serve`'s agent work dir only when
    /// given, the module's `work_dir` always).
    pub(crate) fn agreement(&self, defaults: &Defaults) -> Check {
        let found: Vec<&str> = self
            .views()
            .iter()
            .filter_map(|(_, v)| v.map(|v| v.name.as_str()))
            .collect();
        let mut details = Vec::new();
        let mut disagreements = Vec::new();
        for (key, what, who, with_default) in AGREEMENTS {
            let mut settings: Vec<Setting> = Vec::new();
            for (role, view) in self.views() {
                let Some(view) = view.filter(|_| who.contains(&role)) else {
                    continue;
                };
                let value = match view.given.get(key) {
                    Some(v) => Some((v.clone(), false)),
                    None if *with_default && !(role == "serve" && *key == "work_dir") => {
                        default_of(key, defaults).map(|d| (d, true))
                    }
                    None => None,
                };
                if let Some((value, defaulted)) = value {
                    settings.push(Setting {
                        source: view.name.clone(),
                        value,
                        defaulted,
                    });
                }
            }
            if settings.len() < 2 {
                continue;
            }
            let agree = settings
                .windows(2)
                .all(|w| same_path(&w[0].value, &w[1].value));
            let listed: Vec<String> = settings
                .iter()
                .map(|s| {
                    format!(
                        "{}: {}{}",
                        s.source,
                        s.value,
                        if s.defaulted { " (default)" } else { "" }
                    )
                })
                .collect();
            if agree {
                details.push(format!("{what}: {} everywhere", settings[0].value));
            } else {
                disagreements.push(*what);
                details.push(format!("{what} differs: {}", listed.join("; ")));
            }
        }
        details.extend(self.unreadable.iter().map(|u| format!("cannot use {u}")));
        let status = if !disagreements.is_empty() || !self.unreadable.is_empty() {
            Status::Fail
        } else {
            Status::Ok
        };
        let summary = match (found.len(), disagreements.len()) {
            (0, _) if self.unreadable.is_empty() => {
                "no configuration found to compare (give --modules and --wrapper)".to_owned()
            }
            (_, 0) if status == Status::Ok => format!("{} agree", found.join(", ")),
            (_, 0) => "a configuration file cannot be used".to_owned(),
            _ => format!(
                "{} disagree on {}",
                found.join(", "),
                disagreements.join(", ")
            ),
        };
        Check {
            name: "directories",
            status,
            summary,
            details,
            fix: (status == Status::Fail).then(|| {
                "give every program the same directories: the module's parameters, the hook's \
                 docker_args command line, the --docker wrapper and MESOS_GPU_SERVE_OPTS in \
                 /etc/default/mesos-gpu (operator guide, \"The node's GPU pool\")"
                    .to_owned()
            }),
        }
    }

    /// A setting as the module has it, else as the hook does.
    pub(crate) fn agent_setting(&self, key: &str) -> Option<&str> {
        [self.module.as_ref(), self.hook.as_ref()]
            .into_iter()
            .flatten()
            .find_map(|v| v.given.get(key).map(String::as_str))
    }
}

fn default_of(key: &str, defaults: &Defaults) -> Option<String> {
    Some(match key {
        "pool_dir" => defaults.pool_dir.clone(),
        "docker_work_dir" => defaults.docker_work_dir.clone(),
        "volume_root" => defaults.volume_root.clone(),
        "work_dir" => defaults.agent_work_dir.clone(),
        "nvml_lib" => defaults.nvml_lib.clone(),
        "dev_root" => defaults.dev_root.clone(),
        _ => return None,
    })
}

/// Two paths naming one directory or file: equal once trailing slashes are dropped, or once
/// resolved (`/var/run` is `/run`; `libnvidia-ml.so.1` is a link to the driver's file).
fn same_path(a: &str, b: &str) -> bool {
    let trim = |p: &str| p.trim_end_matches('/').to_owned();
    if trim(a) == trim(b) {
        return true;
    }
    let canonical = |p: &str| std::fs::canonicalize(p).ok();
    canonical(a).is_some_and(|x| Some(x) == canonical(b))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn defaults() -> Defaults {
        Defaults {
            pool_dir: "/var/lib/mesos-gpu".into(),
            docker_work_dir: "/var/run/mesos-gpu".into(),
            volume_root: "/var/run/mesos/isolators/gpu".into(),
            agent_work_dir: "/var/lib/mesos".into(),
            nvml_lib: "/usr/lib/libnvidia-ml.so.1".into(),
            dev_root: "/dev".into(),
        }
    }

    const MODULES: &str = r#"{"libraries": [{"file": "/m.so", "modules": [
      {"name": "org_apache_mesos_gpu_MesosGpuIsolator", "parameters": [
        {"key": "work_dir", "value": "/var/lib/mesos"},
        {"key": "pool_dir", "value": "/var/lib/mesos-gpu"},
        {"key": "volume_root", "value": "/var/lib/mesos-gpu/volumes"}]},
      {"name": "org_apache_mesos_gpu_MesosGpuDockerHook", "parameters": [
        {"key": "docker_args", "value": "/usr/bin/mesos-gpu docker-args --pool-dir /var/lib/mesos-gpu --work-dir '/var/run/mesos-gpu' --volume-root=/var/lib/mesos-gpu/volumes"}]}]}]}"#;

    const WRAPPER: &str = "#!/bin/sh\n# comment naming docker-wrapper\nexec /usr/bin/mesos-gpu docker-wrapper --docker /usr/bin/docker \\\n  --pool-dir /var/lib/mesos-gpu --work-dir /var/run/mesos-gpu -- \"$@\"\n";

    fn sources(wrapper: &str) -> Sources {
        let (module, hook) = parse_modules(MODULES).expect("modules");
        Sources {
            module: module.map(|given| View {
                name: "module".into(),
                given,
            }),
            hook: hook.map(|given| View {
                name: "hook".into(),
                given,
            }),
            wrapper: parse_wrapper(wrapper).map(|given| View {
                name: "wrapper".into(),
                given,
            }),
            ..Sources::default()
        }
    }

    #[test]
    fn the_shipped_docker_configuration_agrees() {
        let check = sources(WRAPPER).agreement(&defaults());
        assert_eq!(check.status, Status::Ok, "{check:#?}");
    }

    #[test]
    fn a_wrapper_on_another_pool_disagrees() {
        let wrapper = WRAPPER.replace("--pool-dir /var/lib/mesos-gpu", "--pool-dir /tmp/pool");
        let check = sources(&wrapper).agreement(&defaults());
        assert_eq!(check.status, Status::Fail);
        assert!(
            check.summary.contains("the node's GPU pool directory"),
            "{check:#?}"
        );
        assert!(
            check
                .details
                .iter()
                .any(|d| d.contains("wrapper: /tmp/pool")),
            "{check:#?}"
        );
    }

    #[test]
    fn a_wrapper_naming_another_nvml_disagrees_one_naming_none_uses_the_loaders() {
        let mut s = sources(WRAPPER);
        s.module
            .as_mut()
            .expect("module")
            .given
            .insert("nvml_lib", "/usr/lib/libnvidia-ml.so.1".into());
        assert_eq!(s.agreement(&defaults()).status, Status::Ok);
        let elsewhere = Defaults {
            nvml_lib: "/usr/lib64/libnvidia-ml.so.1".into(),
            ..defaults()
        };
        let check = s.agreement(&elsewhere);
        assert_eq!(check.status, Status::Fail, "{check:#?}");
        assert!(
            check
                .details
                .iter()
                .any(|d| d.contains("wrapper: /usr/lib64/libnvidia-ml.so.1 (default)")),
            "{check:#?}"
        );
        let named = WRAPPER.replace(
            "exec /usr/bin/mesos-gpu",
            "exec env MESOS_GPU_NVML_LIB=/opt/nvml.so /usr/bin/mesos-gpu",
        );
        let mut s2 = sources(&named);
        s2.module = s.module.clone();
        let check = s2.agreement(&defaults());
        assert_eq!(check.status, Status::Fail, "{check:#?}");
        assert!(check.summary.contains("the NVML library"), "{check:#?}");
    }

    #[test]
    fn serve_on_another_device_root_disagrees() {
        let mut s = sources(WRAPPER);
        s.serve = Some(View {
            name: "serve".into(),
            given: [("dev_root", "/srv/dev".to_owned())].into_iter().collect(),
        });
        let check = s.agreement(&defaults());
        assert_eq!(check.status, Status::Fail, "{check:#?}");
        assert!(
            check
                .details
                .iter()
                .any(|d| d.starts_with("the device root differs")
                    && d.contains("module: /dev (default)")
                    && d.contains("serve: /srv/dev")),
            "{check:#?}"
        );
    }

    #[test]
    fn serve_flags_come_from_the_unit_and_the_defaults_file() {
        let unit = "[Service]\nEnvironmentFile=-/etc/default/mesos-gpu\nExecStart=/usr/bin/mesos-gpu serve $MESOS_GPU_SERVE_OPTS\n";
        let defaults_file = "# c\nMESOS_GPU_SERVE_OPTS=\"--volume-root /v --work-dir /w --agent-work-dir /a\"\nMESOS_GPU_POOL_DIR=/p\n";
        let view = serve_view(
            Some((Path::new("/u"), unit)),
            Some((Path::new("/d"), defaults_file)),
        )
        .expect("view");
        let want: BTreeMap<&str, String> = [
            ("volume_root", "/v"),
            ("docker_work_dir", "/w"),
            ("work_dir", "/a"),
            ("pool_dir", "/p"),
        ]
        .into_iter()
        .map(|(k, v)| (k, v.to_owned()))
        .collect();
        assert_eq!(view.given, want);
    }

    #[test]
    fn words_split_as_the_shell_splits_them() {
        assert_eq!(
            split_words(r#"a 'b c' "d \"e\"" f\ g  --x=1"#),
            ["a", "b c", "d \"e\"", "f g", "--x=1"]
        );
        assert!(split_words("   ").is_empty());
    }
}
