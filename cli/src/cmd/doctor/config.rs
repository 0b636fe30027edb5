//! What the node's configuration files say about the GPU pool, the Docker reservations, the
//! driver volume and sharing, and whether they agree: the module's `modules.json` (the isolator's
//! parameters and the Docker hook's `docker_args` command line), the `--docker` wrapper script,
//! `/etc/default/mesos-gpu` and the `mesos-gpu` systemd unit. Parsing and comparing are pure; only
//! [`Sources::read`] touches files.
//!
//! Every process handing out the node's GPUs must name the same pool directory (the module's
//! `pool_dir`, `docker-args --pool-dir`, the wrapper's and `serve`'s), the Docker side the same
//! record of the Docker containers' reservations (`--docker-state-dir`, formerly `--work-dir`, of
//! `docker-args`, the wrapper and `serve`), and the module and the Docker side the same volume
//! root; `serve --agent-work-dir` is the agent's work directory (the module's `work_dir`), whose
//! health checkpoint it reports. Every process that grants GPUs (the module, the hook's
//! `docker-args`, `serve`) must open the same NVML library and read the same device root: one
//! that names none uses the default (`/dev`, and the `libnvidia-ml.so.1` the dynamic loader
//! finds). The wrapper loads no NVML and reads no device node, so it is not asked for either.
//!
//! A process that sees other GPUs than those recorded keeps the records it cannot check and
//! grants none of their GPUs (`docs/architecture.md`, "The node's GPU pool"), so a disagreement
//! costs GPUs, never isolation. The unit tests run this check on the shipped files (`examples/`,
//! the guides' wrapper scripts, `docker-wrapper --help`): they must agree.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use mesos_gpu_isolator::agent_flags::ModuleParameters;
use mesos_gpu_pool::{DEFAULT_POOL_DIR, POOL_DIR_ENV};
use serde::Serialize;

use super::report::{Check, Status};

/// The module's name in `modules.json`, and the symbol its library defines.
pub(crate) const ISOLATOR_MODULE: &str = "org_apache_mesos_gpu_MesosGpuIsolator";
/// The Docker hook's name, and the symbol its library defines.
pub(crate) const HOOK_MODULE: &str = "org_apache_mesos_gpu_MesosGpuDockerHook";
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

/// What a `modules.json` loads of ours, as Mesos reads it.
#[derive(Debug, Clone, Default)]
pub(crate) struct Modules {
    /// The file.
    pub(crate) path: PathBuf,
    /// The isolator module's parameters as the module gets them (a key given twice kept).
    pub(crate) isolator: Option<ModuleParameters>,
    /// Each library that one of our modules is loaded from.
    pub(crate) libraries: Vec<Library>,
}

/// A library `modules.json` loads our modules from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Library {
    /// Its `file`; `None` when the entry names the library by `name` only (the loader's search).
    pub(crate) file: Option<String>,
    /// Our modules loaded from it, each the name of a symbol it must define.
    pub(crate) modules: Vec<&'static str>,
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
    /// What `modules.json` loads, for the module's own checks.
    pub(crate) modules: Option<Modules>,
    /// `serve`'s command line as systemd runs it, its variables expanded, with its name.
    pub(crate) serve_command: Option<(String, Vec<String>)>,
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
        sources.parse(&Texts {
            modules: modules.as_ref().map(|(p, t)| (*p, t.as_str())),
            wrapper: wrapper.as_ref().map(|(p, t)| (*p, t.as_str())),
            defaults: defaults.as_deref().map(|t| (files.defaults, t)),
            unit: unit.as_deref().map(|t| (files.unit, t)),
        });
        sources
    }

    /// Adds the views `texts` give; a modules file or wrapper that cannot be used is recorded in
    /// `unreadable`.
    fn parse(&mut self, texts: &Texts<'_>) {
        if let Some((path, text)) = texts.modules {
            match parse_modules(text) {
                Ok((modules, hook)) => {
                    self.module = modules.isolator.as_ref().map(|params| View {
                        name: format!("the module ({})", path.display()),
                        given: compared_parameters(params),
                    });
                    self.hook = hook.map(|given| View {
                        name: format!("the Docker hook's docker_args ({})", path.display()),
                        given,
                    });
                    self.modules = Some(Modules {
                        path: path.to_owned(),
                        ..modules
                    });
                }
                Err(e) => self.unreadable.push(format!("{}: {e:#}", path.display())),
            }
        }
        if let Some((path, text)) = texts.wrapper {
            match parse_wrapper(text) {
                Some(given) => {
                    self.wrapper = Some(View {
                        name: format!("the --docker wrapper ({})", path.display()),
                        given,
                    });
                }
                None => self.unreadable.push(format!(
                    "{}: no `mesos-gpu docker-wrapper` command line in it",
                    path.display()
                )),
            }
        }
        if let Some((view, command)) = serve_view(texts.unit, texts.defaults) {
            self.serve_command = Some((view.name.clone(), command));
            self.serve = Some(view);
        }
    }
}

/// The files' texts, each with its path; `None` was not found.
struct Texts<'a> {
    modules: Option<(&'a Path, &'a str)>,
    wrapper: Option<(&'a Path, &'a str)>,
    defaults: Option<(&'a Path, &'a str)>,
    unit: Option<(&'a Path, &'a str)>,
}

/// What a `modules.json` loads of ours (its `path` left empty), and the hook's settings.
fn parse_modules(text: &str) -> anyhow::Result<(Modules, Option<BTreeMap<&'static str, String>>)> {
    let json: serde_json::Value = serde_json::from_str(text).context("not JSON")?;
    let mut modules = Modules::default();
    let mut hook = None;
    for library in json["libraries"].as_array().into_iter().flatten() {
        let mut ours = Vec::new();
        for m in library["modules"].as_array().into_iter().flatten() {
            let params: Vec<(&str, &str)> = m["parameters"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|p| Some((p["key"].as_str()?, p["value"].as_str()?)))
                .collect();
            match m["name"].as_str() {
                Some(ISOLATOR_MODULE) => {
                    ours.push(ISOLATOR_MODULE);
                    modules.isolator = Some(
                        params
                            .iter()
                            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                            .collect(),
                    );
                }
                Some(HOOK_MODULE) => {
                    ours.push(HOOK_MODULE);
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
        if !ours.is_empty() {
            modules.libraries.push(Library {
                file: library["file"].as_str().map(str::to_owned),
                modules: ours,
            });
        }
    }
    Ok((modules, hook))
}

/// The isolator's parameters that matter here, under the names the report uses.
fn compared_parameters(params: &ModuleParameters) -> BTreeMap<&'static str, String> {
    let mut given = BTreeMap::new();
    for (key, value) in params.entries() {
        if let Some(known) = MODULE_KEYS.iter().find(|k| *k == key) {
            given.insert(*known, value.clone());
        }
    }
    given
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
    ("--docker-state-dir", "docker_state_dir"),
    ("--volume-root", "volume_root"),
    ("--agent-work-dir", "work_dir"),
    ("--dev-root", "dev_root"),
    ("--nvml-lib", "nvml_lib"),
    ("--gpu-replicas", "gpu_replicas"),
    ("--gpu-sharing", "gpu_sharing"),
    ("--mps-control", "mps_control"),
    ("--mig-strategy", "mig_strategy"),
];

/// Old flag names still accepted, and the key each is reported under when the new name is not
/// given (`--work-dir` of `docker-args`, `docker-wrapper` and `serve` is `--docker-state-dir`).
const LEGACY_FLAGS: &[(&str, &str)] = &[("--work-dir", "docker_state_dir")];

/// The settings `words` (a mesos-gpu command line) gives: `--flag VALUE` and `--flag=VALUE`, up
/// to a `--` (what follows is another program's). `--simulate NODE` names the NVML library (the
/// simulated node's). `VAR=value` words before the program (`VAR=… exec mesos-gpu`, `exec env
/// VAR=… mesos-gpu`) give `MESOS_GPU_NVML_LIB` and `MESOS_GPU_POOL_DIR`, which a flag overrides.
fn command_settings(words: &[String]) -> BTreeMap<&'static str, String> {
    let words: Vec<&String> = words.iter().take_while(|w| *w != "--").collect();
    let mut given = BTreeMap::new();
    let mut legacy = BTreeMap::new();
    let mut simulate = None;
    for (i, word) in words.iter().enumerate() {
        let value = |flag: &str| match word.strip_prefix(flag)? {
            "" => words.get(i + 1).map(|v| (*v).clone()),
            rest => rest.strip_prefix('=').map(str::to_owned),
        };
        for (flag, key) in FLAGS {
            if let Some(v) = value(flag) {
                given.insert(*key, v);
            }
        }
        for (flag, key) in LEGACY_FLAGS {
            if let Some(v) = value(flag) {
                legacy.insert(*key, v);
            }
        }
        if let Some(node) = value("--simulate") {
            simulate = Some(node);
        }
    }
    for (key, v) in legacy {
        given.entry(key).or_insert(v);
    }
    if let Some(node) = simulate {
        given.insert("nvml_lib", format!("the simulated node {node}"));
    }
    let environment = words
        .iter()
        .take_while(|w| ["exec", "env"].contains(&w.as_str()) || is_assignment(w));
    for word in environment {
        if let Some(value) = word.strip_prefix("MESOS_GPU_NVML_LIB=") {
            given.entry("nvml_lib").or_insert_with(|| value.to_owned());
        }
        if let Some(value) = word.strip_prefix(&format!("{POOL_DIR_ENV}=")) {
            given.entry("pool_dir").or_insert_with(|| value.to_owned());
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
    Some(command_settings(&split_words(line)))
}

/// A shell assignment `NAME=value`: the name a letter or `_`, then letters, digits or `_`.
fn is_assignment(word: &str) -> bool {
    let Some((name, _)) = word.split_once('=') else {
        return false;
    };
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// `serve`'s settings and command line: the unit's `ExecStart` with its `$VARIABLES` taken from
/// its `Environment=` lines and the defaults file, else (no unit) the defaults file's
/// `MESOS_GPU_SERVE_OPTS`.
fn serve_view(
    unit: Option<(&Path, &str)>,
    defaults: Option<(&Path, &str)>,
) -> Option<(View, Vec<String>)> {
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
    if let Some(pool) = env.get(POOL_DIR_ENV) {
        given.entry("pool_dir").or_insert_with(|| pool.clone());
    }
    if let Some(lib) = env.get("MESOS_GPU_NVML_LIB") {
        given.entry("nvml_lib").or_insert_with(|| lib.clone());
    }
    Some((View { name, given }, words))
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
    pub(crate) docker_state_dir: String,
    pub(crate) volume_root: String,
    pub(crate) agent_work_dir: String,
    /// The NVML library a program naming none opens: the file the dynamic loader finds for
    /// `libnvidia-ml.so.1` where known, else that name.
    pub(crate) nvml_lib: String,
    pub(crate) dev_root: String,
}

impl Defaults {
    /// The defaults of this build's module and commands, with `nvml_lib` for the library a
    /// program naming none opens.
    pub(crate) fn of_this_build(nvml_lib: String) -> Defaults {
        Defaults {
            pool_dir: DEFAULT_POOL_DIR.to_owned(),
            docker_state_dir: crate::cmd::DEFAULT_DOCKER_STATE_DIR.to_owned(),
            volume_root: mesos_gpu_volume::volume::DEFAULT_ROOT.to_owned(),
            agent_work_dir: crate::cmd::DEFAULT_AGENT_WORK_DIR.to_owned(),
            nvml_lib,
            dev_root: crate::ctx::DEFAULT_DEV_ROOT.to_owned(),
        }
    }
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
        "docker_state_dir",
        "the Docker containers' records directory (--docker-state-dir)",
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
        &["module", "hook", "serve"],
        true,
    ),
    (
        "dev_root",
        "the device root",
        &["module", "hook", "serve"],
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
                "give every program the same directories, NVML library and device root: the \
                 module's parameters, the hook's docker_args command line, the --docker wrapper \
                 and MESOS_GPU_SERVE_OPTS in /etc/default/mesos-gpu (operator guide, \"The \
                 node's GPU pool\")"
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
        "docker_state_dir" => defaults.docker_state_dir.clone(),
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
    use super::super::accepted;
    use super::*;

    fn defaults() -> Defaults {
        Defaults {
            pool_dir: "/var/lib/mesos-gpu".into(),
            docker_state_dir: "/var/run/mesos-gpu".into(),
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
        {"key": "docker_args", "value": "/usr/bin/mesos-gpu docker-args --pool-dir /var/lib/mesos-gpu --docker-state-dir '/var/run/mesos-gpu' --volume-root=/var/lib/mesos-gpu/volumes"}]}]}]}"#;

    const WRAPPER: &str = "#!/bin/sh\n# comment naming docker-wrapper\nexec /usr/bin/mesos-gpu docker-wrapper --docker /usr/bin/docker \\\n  --pool-dir /var/lib/mesos-gpu --work-dir /var/run/mesos-gpu -- \"$@\"\n";

    /// True when a detail of `check` mentions `needle`.
    fn has_detail(check: &Check, needle: &str) -> bool {
        check.details.iter().any(|d| d.contains(needle))
    }

    fn sources(wrapper: &str) -> Sources {
        let (modules, hook) = parse_modules(MODULES).expect("modules");
        Sources {
            module: modules.isolator.as_ref().map(|params| View {
                name: "module".into(),
                given: compared_parameters(params),
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
        assert!(has_detail(&check, "wrapper: /tmp/pool"), "{check:#?}");
    }

    #[test]
    fn a_hook_naming_another_nvml_disagrees_one_naming_none_uses_the_loaders() {
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
            has_detail(&check, "hook: /usr/lib64/libnvidia-ml.so.1 (default)"),
            "{check:#?}"
        );
        let hook_line = "exec env MESOS_GPU_NVML_LIB=/opt/nvml.so /usr/bin/mesos-gpu docker-args";
        s.hook = Some(View {
            name: "hook".into(),
            given: command_settings(&split_words(hook_line)),
        });
        let check = s.agreement(&defaults());
        assert_eq!(check.status, Status::Fail, "{check:#?}");
        assert!(check.summary.contains("the NVML library"), "{check:#?}");
        assert!(has_detail(&check, "hook: /opt/nvml.so"), "{check:#?}");
    }

    #[test]
    fn the_wrapper_is_not_asked_for_an_nvml_library_it_does_not_load() {
        let named = WRAPPER.replace(
            "exec /usr/bin/mesos-gpu",
            "exec env MESOS_GPU_NVML_LIB=/opt/nvml.so /usr/bin/mesos-gpu",
        );
        let check = sources(&named).agreement(&defaults());
        assert_eq!(check.status, Status::Ok, "{check:#?}");
        let pooled = WRAPPER.replace(
            "exec /usr/bin/mesos-gpu",
            "MESOS_GPU_POOL_DIR=/tmp/pool exec /usr/bin/mesos-gpu",
        );
        let pooled = pooled.replace("--pool-dir /var/lib/mesos-gpu ", "");
        let check = sources(&pooled).agreement(&defaults());
        assert_eq!(check.status, Status::Fail, "{check:#?}");
        assert!(has_detail(&check, "wrapper: /tmp/pool"), "{check:#?}");
    }

    #[test]
    fn flags_give_the_docker_state_dir_under_its_old_name_and_the_simulated_nvml() {
        let given = |line: &str| command_settings(&split_words(line));
        assert_eq!(
            given("mesos-gpu docker-args --work-dir=/w")["docker_state_dir"],
            "/w"
        );
        assert_eq!(
            given("mesos-gpu docker-args --work-dir /w --docker-state-dir /s")["docker_state_dir"],
            "/s"
        );
        assert_eq!(
            given("mesos-gpu --simulate dgx1-v100 docker-args")["nvml_lib"],
            "the simulated node dgx1-v100"
        );
        let after =
            given("MESOS_GPU_POOL_DIR=/e mesos-gpu docker-args --pool-dir /f -- --pool-dir=/g");
        assert_eq!(
            after["pool_dir"], "/f",
            "a flag beats the environment; after -- is docker's"
        );
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
        let (view, command) = serve_view(
            Some((Path::new("/u"), unit)),
            Some((Path::new("/d"), defaults_file)),
        )
        .expect("view");
        assert_eq!(
            command,
            [
                "/usr/bin/mesos-gpu",
                "serve",
                "--volume-root",
                "/v",
                "--work-dir",
                "/w",
                "--agent-work-dir",
                "/a"
            ]
        );
        let want: BTreeMap<&str, String> = [
            ("volume_root", "/v"),
            ("docker_state_dir", "/w"),
            ("work_dir", "/a"),
            ("pool_dir", "/p"),
        ]
        .into_iter()
        .map(|(k, v)| (k, v.to_owned()))
        .collect();
        assert_eq!(view.given, want);
    }

    /// What Mesos would load: the isolator's parameters as given (a key twice kept, for the
    /// module's parser to refuse), and each library with the modules of ours it loads.
    #[test]
    fn modules_json_gives_the_isolators_parameters_and_our_libraries() {
        let text = r#"{"libraries": [
          {"file": "/a.so", "modules": [{"name": "org_apache_mesos_gpu_MesosGpuIsolator",
            "parameters": [{"key": "work_dir", "value": "/w"}, {"key": "work_dir", "value": "/v"},
                           {"key": "numa_pinning", "value": "on"}]}]},
          {"file": "/other.so", "modules": [{"name": "com_example_Other"}]},
          {"name": "mesos_gpu_module", "modules": [{"name": "org_apache_mesos_gpu_MesosGpuDockerHook",
            "parameters": [{"key": "docker_args", "value": "mesos-gpu docker-args"}]}]}]}"#;
        let (modules, hook) = parse_modules(text).expect("modules");
        let params = modules.isolator.expect("the isolator");
        assert_eq!(
            params.entries(),
            [
                ("work_dir".to_owned(), "/w".to_owned()),
                ("work_dir".to_owned(), "/v".to_owned()),
                ("numa_pinning".to_owned(), "on".to_owned())
            ]
        );
        assert_eq!(
            compared_parameters(&params),
            [("work_dir", "/v".to_owned())].into_iter().collect()
        );
        assert_eq!(
            modules.libraries,
            [
                Library {
                    file: Some("/a.so".into()),
                    modules: vec![ISOLATOR_MODULE],
                },
                Library {
                    file: None,
                    modules: vec![HOOK_MODULE],
                },
            ]
        );
        assert!(hook.is_some());
    }

    #[test]
    fn words_split_as_the_shell_splits_them() {
        assert_eq!(
            split_words(r#"a 'b c' "d \"e\"" f\ g  --x=1"#),
            ["a", "b c", "d \"e\"", "f g", "--x=1"]
        );
        assert!(split_words("   ").is_empty());
    }

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

    /// Every `--docker` wrapper script shipped, with where it is: the script the package
    /// installs, those the operator guide and the example README show, and the one
    /// `docker-wrapper --help` shows.
    fn shipped_wrappers() -> Vec<(String, String)> {
        let mut out = vec![(
            "examples/mesos-agent/mesos-gpu-docker".to_owned(),
            shipped("examples/mesos-agent/mesos-gpu-docker"),
        )];
        let guide = wrapper_blocks(&shipped("docs/operator-guide.md"));
        assert!(
            !guide.is_empty(),
            "the operator guide shows no docker-wrapper script"
        );
        out.extend(
            guide
                .into_iter()
                .map(|b| ("docs/operator-guide.md".to_owned(), b)),
        );
        out.extend(
            wrapper_blocks(&shipped("examples/mesos-agent/README.md"))
                .into_iter()
                .map(|b| ("examples/mesos-agent/README.md".to_owned(), b)),
        );
        let mut cli = <crate::Cli as clap::CommandFactory>::command();
        let help = cli
            .find_subcommand_mut("docker-wrapper")
            .expect("docker-wrapper")
            .render_long_help()
            .to_string();
        // The example script, not the usage line above it.
        let (_, script) = help
            .split_once("#!/bin/sh")
            .expect("docker-wrapper --help shows no script");
        out.push((
            "`mesos-gpu docker-wrapper --help`".to_owned(),
            script.to_owned(),
        ));
        out
    }

    /// A shipped setup: a shipped modules file, a shipped wrapper (or none), the systemd unit
    /// with `/etc/default/mesos-gpu` (edited by `edit`).
    fn shipped_setup(
        modules: &str,
        wrapper: Option<(&str, &str)>,
        edit: &dyn Fn(String) -> String,
    ) -> Sources {
        let modules_text = shipped(modules);
        let unit = shipped("examples/systemd/mesos-gpu.service");
        let defaults_file = edit(shipped("examples/default/mesos-gpu"));
        let mut s = Sources::default();
        s.parse(&Texts {
            modules: Some((Path::new(modules), &modules_text)),
            wrapper: wrapper.map(|(path, text)| (Path::new(path), text)),
            defaults: Some((Path::new("examples/default/mesos-gpu"), &defaults_file)),
            unit: Some((Path::new("examples/systemd/mesos-gpu.service"), &unit)),
        });
        assert!(s.unreadable.is_empty(), "{:?}", s.unreadable);
        assert!(
            s.module.is_some() && s.serve.is_some() && s.wrapper.is_some() == wrapper.is_some(),
            "{s:#?}"
        );
        s
    }

    fn this_build() -> Defaults {
        Defaults::of_this_build(mesos_gpu_node::discovery::DEFAULT_NVML_LIB.to_owned())
    }

    /// Issue 34: every combination of the shipped files an operator may install together (the
    /// package's one `/etc/default/mesos-gpu` and unit, either modules file, any shipped
    /// wrapper or none) agrees on directories, NVML and device root, and each is accepted by
    /// its program: the isolator's parameters by the module's parser, serve's options by
    /// serve's (before: `modules-docker.json` and `/etc/default/mesos-gpu` named two volume
    /// roots, and `doctor` said NOT READY on the shipped files). The module library is not
    /// installed here, so its symbols are checked on built ones (`accepted.rs`).
    #[test]
    fn shipped_files_agree_on_directories_nvml_and_device_root() {
        let wrappers = shipped_wrappers();
        let wrappers = std::iter::once(None)
            .chain(wrappers.iter().map(|(p, t)| Some((p.as_str(), t.as_str()))));
        for wrapper in wrappers {
            for modules in [
                "examples/mesos-agent/modules.json",
                "examples/mesos-agent/modules-docker.json",
            ] {
                let s = shipped_setup(modules, wrapper, &|text| text);
                let which = format!("{modules} with {:?}", wrapper.map(|w| w.0));
                let check = s.agreement(&this_build());
                assert_eq!(check.status, Status::Ok, "{which}: {check:#?}");
                let mut wants = vec![
                    "the node's GPU pool directory: /var/lib/mesos-gpu everywhere",
                    "the driver volume root: /var/lib/mesos-gpu/volumes everywhere",
                    "the NVML library: libnvidia-ml.so.1 everywhere",
                    "the device root: /dev everywhere",
                ];
                if s.hook.is_some() || s.wrapper.is_some() {
                    wants.push(
                        "the Docker containers' records directory (--docker-state-dir): \
                         /var/run/mesos-gpu everywhere",
                    );
                }
                for want in wants {
                    assert!(
                        check.details.iter().any(|d| d == want),
                        "{which}: {want}: {check:#?}"
                    );
                }
                let params = s.modules.as_ref().and_then(|m| m.isolator.as_ref());
                let accepted = accepted::module_parameters(params.expect("params"));
                assert!(accepted.is_ok(), "{which}: {accepted:?}");
                let (_, command) = s.serve_command.as_ref().expect("serve's command line");
                let accepted = accepted::serve_command(command);
                assert!(accepted.is_ok(), "{which}: {accepted:?}");
            }
        }
    }

    #[test]
    fn a_shipped_setup_changed_names_both_programs_and_values() {
        let wrapper = "#!/bin/sh\nexec mesos-gpu docker-wrapper --pool-dir /srv/pool/ \\\n  --work-dir=/srv/work -- \"$@\"\n";
        let edit = |_: String| {
            "MESOS_GPU_SERVE_OPTS=\"--work-dir /var/run/mesos-gpu --dev-root /tmp/nodes --volume-root /var/lib/mesos-gpu/volumes\"\nMESOS_GPU_NVML_LIB=/opt/libnvidia-ml.so.1\n"
                .to_owned()
        };
        let s = shipped_setup(
            "examples/mesos-agent/modules-docker.json",
            Some(("/usr/bin/mesos-gpu-docker", wrapper)),
            &edit,
        );
        let check = s.agreement(&this_build());
        assert_eq!(check.status, Status::Fail, "{check:#?}");
        for what in [
            "the node's GPU pool directory",
            "the Docker containers' records directory",
            "the NVML library",
            "the device root",
        ] {
            assert!(check.summary.contains(what), "{what}: {check:#?}");
        }
        let differs: Vec<&String> = check
            .details
            .iter()
            .filter(|d| d.contains(" differs: "))
            .collect();
        assert_eq!(differs.len(), 4, "{check:#?}");
        let mentions = |what: &str| differs.iter().any(|d| d.contains(what));
        assert!(
            mentions("the module (examples/mesos-agent/modules-docker.json): /var/lib/mesos-gpu; ")
                && mentions("the --docker wrapper (/usr/bin/mesos-gpu-docker): /srv/pool/"),
            "{check:#?}"
        );
        // serve's --work-dir is the old name of --docker-state-dir: it agrees with the hook.
        assert!(
            mentions("--docker wrapper (/usr/bin/mesos-gpu-docker): /srv/work")
                && mentions(
                    "serve (examples/systemd/mesos-gpu.service with examples/default/mesos-gpu): /var/run/mesos-gpu"
                ),
            "{check:#?}"
        );
        assert!(
            mentions("/tmp/nodes") && mentions("/opt/libnvidia-ml.so.1"),
            "{check:#?}"
        );
    }
}
