//! The `configuration` check: every configuration file is one its program accepts, checked as
//! that program checks it, so that what would stop the agent or `serve` at start is found before:
//! - the isolator module's parameters in `modules.json`, by the module's own parser
//!   ([`ModuleConfig::parse`], what `mgpu_isolator_new` runs when the agent loads the module);
//! - the library `modules.json` loads our modules from: it exists and defines each module's name
//!   as a dynamic symbol, which Mesos looks up with `dlsym` (`src/module/manager.cpp`,
//!   `ModuleManager::load`); read from its ELF dynamic symbol table, never loaded;
//! - `serve`'s command line as systemd runs it (`MESOS_GPU_SERVE_OPTS` expanded), by this
//!   binary's own argument parser, which `serve` parses it with.
//!
//! A file that cannot be read or parsed at all is reported by the `directories` check.

use std::path::Path;

use mesos_gpu_isolator::agent_flags::{ModuleConfig, ModuleParameters, check_agent_resources};
use mesos_gpu_node::inventory::Inventory;
use mesos_gpu_os::error_chain;
use mesos_gpu_volume::elf_info::missing_dynamic_symbols;

use super::config::{Library, Sources};
use super::report::{Check, Status};
use crate::cmd::Command;

/// What one look at a file found: accepted (a detail) or refused (what is wrong).
type Finding = Result<String, String>;

/// The agent's `--resources` and the node they are checked on (see [`agent_resources`]).
pub(crate) struct AgentResources<'a> {
    /// `--resources`, as the agent gets it.
    pub(crate) resources: &'a str,
    /// This node's GPUs.
    pub(crate) inventory: &'a Inventory,
}

/// The `configuration` check over everything `sources` found, and the agent's `--resources`
/// when given.
pub(crate) fn configuration(sources: &Sources, agent: Option<&AgentResources<'_>>) -> Check {
    let mut findings = Vec::new();
    if let Some(modules) = &sources.modules {
        let file = modules.path.display();
        if let Some(params) = &modules.isolator {
            findings.push(
                module_parameters(params)
                    .map(|ok| format!("{file}: {ok}"))
                    .map_err(|refused| format!("{file}: {refused}")),
            );
            if let Some(finding) = agent.and_then(|agent| agent_resources(params, agent)) {
                findings.push(finding.map_err(|refused| format!("{file}: {refused}")));
            }
        }
        findings.extend(
            modules
                .libraries
                .iter()
                .map(|l| library(l).map_err(|refused| format!("{file}: {refused}"))),
        );
    }
    if let Some((name, command)) = &sources.serve_command {
        findings.push(
            serve_command(command)
                .map(|ok| format!("{name}: {ok}"))
                .map_err(|refused| format!("{name}: {refused}")),
        );
    }
    let (accepted, refused): (Vec<Finding>, Vec<Finding>) =
        findings.into_iter().partition(Result::is_ok);
    let refused: Vec<String> = refused.into_iter().filter_map(Result::err).collect();
    let mut details: Vec<String> = accepted.into_iter().filter_map(Result::ok).collect();
    let (status, summary) = match refused.as_slice() {
        [] if details.is_empty() => (
            Status::Ok,
            "no modules.json or serve options to check (give --modules)".to_owned(),
        ),
        [] => (
            Status::Ok,
            "the module and serve would accept their configuration".to_owned(),
        ),
        [one] => (Status::Fail, one.clone()),
        many => (
            Status::Fail,
            format!(
                "{} configuration problems would stop the agent or serve",
                many.len()
            ),
        ),
    };
    if refused.len() > 1 {
        details.splice(0..0, refused);
    }
    Check {
        name: "configuration",
        status,
        summary,
        details,
        fix: (status == Status::Fail).then(|| {
            "correct what is named: the module's parameters in modules.json (ffi/README.md, \
             \"Module parameters\"), the library's `file` (libmesos_gpu_module.so built for this \
             agent's Mesos, operator guide \"Building the module\"), MESOS_GPU_SERVE_OPTS in \
             /etc/default/mesos-gpu (`mesos-gpu serve --help`)"
                .to_owned()
        }),
    }
}

/// The isolator module's parameters, checked by the module's own parser.
pub(crate) fn module_parameters(params: &ModuleParameters) -> Finding {
    match ModuleConfig::parse(params) {
        Ok(_) => Ok("the module accepts its parameters".to_owned()),
        Err(e) => Err(format!(
            "the module would refuse its parameters: {}",
            error_chain(&e)
        )),
    }
}

/// The agent's `--resources` against what the module's parameters hand out on this node, by the
/// rule the module applies when the agent starts ([`check_agent_resources`]); `None` when the
/// parameters are refused (reported by themselves) or the node has no driver (the `driver`
/// check says so, and the module refuses to start).
fn agent_resources(params: &ModuleParameters, agent: &AgentResources<'_>) -> Option<Finding> {
    let config = ModuleConfig::parse(params).ok()?;
    agent.inventory.driver.as_ref()?;
    Some(
        match check_agent_resources(Some(agent.resources), agent.inventory, &config.gpus()) {
            Ok(offer) => Ok(format!(
                "the agent's --resources advertise what the module hands out ({})",
                offer.what
            )),
            Err(e) => Err(format!(
                "the module would stop the agent: {}",
                error_chain(&e)
            )),
        },
    )
}

/// A library our modules are loaded from: it exists and defines every module's symbol.
fn library(library: &Library) -> Finding {
    let modules = library.modules.join(", ");
    let Some(file) = &library.file else {
        return Ok(format!(
            "{modules}: the library is named by `name`, found by the loader; not checked"
        ));
    };
    let path = Path::new(file);
    if !path.exists() {
        return Err(format!(
            "the module library {file} does not exist: Mesos cannot load {modules}"
        ));
    }
    match missing_dynamic_symbols(path, &library.modules) {
        Ok(missing) if missing.is_empty() => Ok(format!("{file} defines {modules}")),
        Ok(missing) => Err(format!(
            "the module library {file} does not define {} as a dynamic symbol: Mesos cannot \
             load that module from it",
            missing.join(", ")
        )),
        Err(e) => Err(format!(
            "the module library {file} cannot be read: {}",
            error_chain(&e)
        )),
    }
}

/// `serve`'s command line, from the program on, checked by this binary's own parser.
pub(crate) fn serve_command(command: &[String]) -> Finding {
    let Some(start) = command
        .iter()
        .position(|w| Path::new(w).file_name().is_some_and(|n| n == "mesos-gpu"))
    else {
        return Err(format!(
            "the command line runs no mesos-gpu: {}",
            command.join(" ")
        ));
    };
    match <crate::Cli as clap::Parser>::try_parse_from(&command[start..]) {
        Ok(cli) if matches!(cli.command, Command::Serve(_)) => {
            Ok("serve accepts its options".to_owned())
        }
        Ok(_) => Err(format!(
            "the command line is not `mesos-gpu serve`: {}",
            command.join(" ")
        )),
        Err(e) => {
            let text = e.to_string();
            let first = text.lines().next().unwrap_or_default();
            Err(format!(
                "serve would refuse its options: {}",
                first.strip_prefix("error: ").unwrap_or(first)
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::config::{HOOK_MODULE, ISOLATOR_MODULE, Modules};
    use super::*;

    /// The check without the agent's `--resources`.
    fn configuration(sources: &Sources) -> Check {
        super::configuration(sources, None)
    }

    #[test]
    fn the_agents_resources_are_checked_by_the_modules_start_rule() {
        let mut inventory = mesos_gpu_node::nodes::dgx1_v100().inventory();
        inventory.driver = Some(mesos_gpu_node::inventory::DriverInfo {
            version: "550.54.14".into(),
            cuda_version: Some((12, 4)),
        });
        let sources = with_modules(
            params(&[("work_dir", "/var/lib/mesos"), ("nvidia_gpu_devices", "0")]),
            Vec::new(),
        );
        let check = |resources| {
            super::configuration(
                &sources,
                Some(&AgentResources {
                    resources,
                    inventory: &inventory,
                }),
            )
        };
        let phantom = check("cpus:4;gpus:2");
        assert_eq!(phantom.status, Status::Fail, "{phantom:#?}");
        assert!(
            phantom
                .summary
                .contains("advertise gpus:2, but the GPU module hands out gpus:1"),
            "{phantom:#?}"
        );
        let exact = check("cpus:4;gpus:1");
        assert_eq!(exact.status, Status::Ok, "{exact:#?}");
        assert!(
            exact
                .details
                .iter()
                .any(|d| d.contains("advertise what the module hands out")),
            "{exact:#?}"
        );
    }

    fn params(pairs: &[(&str, &str)]) -> ModuleParameters {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn with_modules(isolator: ModuleParameters, libraries: Vec<Library>) -> Sources {
        Sources {
            modules: Some(Modules {
                path: "/etc/mesos/modules.json".into(),
                isolator: Some(isolator),
                libraries,
            }),
            ..Sources::default()
        }
    }

    fn words(line: &str) -> Vec<String> {
        line.split_whitespace().map(str::to_owned).collect()
    }

    /// Issue 34: parameters the module would refuse make the host not ready, in the module's
    /// words (before: `doctor` said READY).
    #[test]
    fn parameters_the_module_refuses_fail_with_its_message() {
        for (pairs, says) in [
            (
                &[("work_dir", "/var/lib/mesos"), ("bogus_key", "1")][..],
                "/etc/mesos/modules.json: the module would refuse its parameters: unknown module \
                 parameter \"bogus_key\": expected one of work_dir, pool_dir",
            ),
            (
                &[("work_dir", "/var/lib/mesos"), ("numa_pinning", "maybe")][..],
                "module parameter numa_pinning=\"maybe\": expected one of off, on",
            ),
            (
                &[("pool_dir", "/var/lib/mesos-gpu")][..],
                "module parameter \"work_dir\" is required",
            ),
            (
                &[("work_dir", "/a"), ("work_dir", "/b")][..],
                "module parameter \"work_dir\" is given twice",
            ),
        ] {
            let check = configuration(&with_modules(params(pairs), Vec::new()));
            assert_eq!(check.status, Status::Fail, "{check:#?}");
            assert!(check.summary.contains(says), "{says}: {check:#?}");
            assert!(check.fix.is_some());
        }
        let check = configuration(&with_modules(
            params(&[("work_dir", "/var/lib/mesos"), ("numa_pinning", "on")]),
            Vec::new(),
        ));
        assert_eq!(check.status, Status::Ok, "{check:#?}");
    }

    /// A shared object built by `cc` from `source`, in `dir`.
    fn shared_object(dir: &Path, name: &str, source: &str) -> String {
        let c = dir.join(format!("{name}.c"));
        let so = dir.join(format!("{name}.so"));
        std::fs::write(&c, source).expect("write the C source");
        let out = std::process::Command::new("cc")
            .args(["-shared", "-fPIC", "-o"])
            .arg(&so)
            .arg(&c)
            .output()
            .expect("run cc");
        assert!(
            out.status.success(),
            "cc: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        so.display().to_string()
    }

    /// Issue 34: the library must exist and define each module of ours it loads as a dynamic
    /// symbol (before: a missing library was READY). Real ELF files from `cc`.
    #[test]
    fn the_module_library_must_define_each_modules_symbol() {
        let dir = tempfile::tempdir().expect("tempdir");
        let both = shared_object(
            dir.path(),
            "both",
            "int org_apache_mesos_gpu_MesosGpuIsolator = 1;\n\
             int org_apache_mesos_gpu_MesosGpuDockerHook = 2;\n",
        );
        // Refers to the isolator's symbol without defining it: undefined in .dynsym.
        let isolator_only = shared_object(
            dir.path(),
            "isolator_only",
            "int org_apache_mesos_gpu_MesosGpuIsolator = 1;\n\
             extern int org_apache_mesos_gpu_MesosGpuDockerHook;\n\
             int hook(void) { return org_apache_mesos_gpu_MesosGpuDockerHook; }\n",
        );
        let good = params(&[("work_dir", "/var/lib/mesos")]);
        let lib = |file: &str, modules: &[&'static str]| Library {
            file: Some(file.to_owned()),
            modules: modules.to_vec(),
        };
        let check = configuration(&with_modules(
            good.clone(),
            vec![lib(&both, &[ISOLATOR_MODULE, HOOK_MODULE])],
        ));
        assert_eq!(check.status, Status::Ok, "{check:#?}");
        assert!(
            check
                .details
                .iter()
                .any(|d| d == &format!("{both} defines {ISOLATOR_MODULE}, {HOOK_MODULE}")),
            "{check:#?}"
        );
        let check = configuration(&with_modules(
            good.clone(),
            vec![lib(&isolator_only, &[ISOLATOR_MODULE])],
        ));
        assert_eq!(check.status, Status::Ok, "{check:#?}");

        let missing_hook = configuration(&with_modules(
            good.clone(),
            vec![lib(&isolator_only, &[ISOLATOR_MODULE, HOOK_MODULE])],
        ));
        assert_eq!(missing_hook.status, Status::Fail, "{missing_hook:#?}");
        assert_eq!(
            missing_hook.summary,
            format!(
                "/etc/mesos/modules.json: the module library {isolator_only} does not define \
                 {HOOK_MODULE} as a dynamic symbol: Mesos cannot load that module from it"
            )
        );

        let gone = dir.path().join("gone.so").display().to_string();
        let check = configuration(&with_modules(
            good.clone(),
            vec![lib(&gone, &[ISOLATOR_MODULE])],
        ));
        assert_eq!(check.status, Status::Fail, "{check:#?}");
        assert!(
            check.summary.ends_with(&format!(
                "the module library {gone} does not exist: Mesos cannot load {ISOLATOR_MODULE}"
            )),
            "{check:#?}"
        );

        let text = dir.path().join("both.c").display().to_string();
        let check = configuration(&with_modules(good, vec![lib(&text, &[ISOLATOR_MODULE])]));
        assert_eq!(check.status, Status::Fail, "{check:#?}");
        assert!(
            check.summary.contains("is not a readable ELF file"),
            "{check:#?}"
        );
    }

    /// Issue 34: serve's options are checked by serve's own parser (before: `--defaults` with an
    /// option serve refuses said ok).
    #[test]
    fn serve_options_serve_would_refuse_fail_naming_them() {
        let serve = |line: &str| Sources {
            serve_command: Some(("serve (/etc/default/mesos-gpu)".to_owned(), words(line))),
            ..Sources::default()
        };
        let check = configuration(&serve(
            "/usr/bin/mesos-gpu serve --listen 127.0.0.1:3476 --driver-poll 30",
        ));
        assert_eq!(check.status, Status::Ok, "{check:#?}");
        for (line, says) in [
            (
                "/usr/bin/mesos-gpu serve --listen 127.0.0.1:3476 --bogus-flag 1",
                "serve (/etc/default/mesos-gpu): serve would refuse its options: unexpected \
                 argument '--bogus-flag' found",
            ),
            (
                "mesos-gpu serve --driver-poll soon",
                "serve would refuse its options: invalid value 'soon' for '--driver-poll",
            ),
            (
                "mesos-gpu info",
                "the command line is not `mesos-gpu serve`",
            ),
        ] {
            let check = configuration(&serve(line));
            assert_eq!(check.status, Status::Fail, "{line}: {check:#?}");
            assert!(check.summary.contains(says), "{says}: {check:#?}");
        }
    }

    #[test]
    fn several_problems_are_each_listed() {
        let mut sources = with_modules(params(&[("bogus", "1")]), Vec::new());
        sources.serve_command = Some(("serve".to_owned(), words("mesos-gpu serve --nope")));
        let check = configuration(&sources);
        assert_eq!(check.status, Status::Fail);
        assert_eq!(
            check.summary,
            "2 configuration problems would stop the agent or serve"
        );
        assert!(check.details[0].contains("unknown module parameter \"bogus\""));
        assert!(check.details[1].contains("unexpected argument '--nope'"));
    }

    #[test]
    fn nothing_to_check_is_ok() {
        let check = configuration(&Sources::default());
        assert_eq!(check.status, Status::Ok);
        assert!(check.summary.starts_with("no modules.json"), "{check:#?}");
    }
}
