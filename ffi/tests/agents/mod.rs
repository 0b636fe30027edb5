//! Real agents loading the module on simulated nodes, for the real-agent tests
//! (`tests/mesos_agent.rs`, `tests/mesos_cluster.rs`) and the benchmarks that drive many tasks
//! through them (`benches/agent_soak.rs`, `benches/gpu_nvidia_vs_module.rs`): the module, the
//! device probe and the `mesos-gpu` binary, one node's files (nvml-sim, device nodes, pool, work
//! directory) and its module parameters, and what a task's probe printed.
#![allow(dead_code)]

pub(crate) mod docker;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use mesos_gpu_testkit::mesos::{
    Agent, AgentCgroups, AgentSpec, DevNodes, ISOLATOR_MODULE, MesosInstall, build_module,
    build_probe, http_get, modules_json,
};
use mesos_gpu_testkit::nvml_sim::{SimNode, mknod_mig_caps};

use crate::support::{TestResult, cdylib, check};

/// The module, built once per process against the `libmesos_gpu.so` of this build profile, in
/// `target/tmp/mesos-module-<profile>` (cmake rebuilds only what changed), with
/// `compile_commands.json` beside it.
pub(crate) fn module() -> TestResult<PathBuf> {
    static MODULE_SO: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let built = MODULE_SO.get_or_init(|| {
        let install = MesosInstall::locate()?;
        let lib = cdylib().map_err(|e| e.to_string())?;
        let lib_dir = lib.parent().ok_or("libmesos_gpu.so has no directory")?;
        // `target/<profile>/deps` (or `target/<profile>`): one build per profile.
        let profile = lib_dir
            .ancestors()
            .find(|d| d.file_name().is_some_and(|n| n != "deps"))
            .and_then(Path::file_name)
            .map_or("default".into(), |n| n.to_string_lossy().into_owned());
        let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("mesos-module");
        let build = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("mesos-module-{profile}"));
        build_module(
            &install,
            &source,
            lib_dir,
            &build,
            &["-DCMAKE_EXPORT_COMPILE_COMMANDS=ON"],
        )
    });
    Ok(built.clone()?)
}

/// The static device probe, built once per process.
pub(crate) fn probe() -> TestResult<PathBuf> {
    static PROBE: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let built = PROBE.get_or_init(|| {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("mesos-probe");
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        build_probe(&dir)
    });
    Ok(built.clone()?)
}

/// The `mesos-gpu` binary of this build (`target/<profile>/mesos-gpu`), built by the cli crate.
pub(crate) fn mesos_gpu_exe() -> TestResult<PathBuf> {
    let exe = std::env::current_exe()?;
    let dir = exe
        .parent()
        .and_then(Path::parent)
        .ok_or("no target directory")?;
    let found = dir.join("mesos-gpu");
    check(
        found.is_file(),
        format!(
            "{} missing: build it first (cargo build -p mesos-gpu)",
            found.display()
        ),
    )?;
    Ok(found)
}

/// `program` in `/usr/local/bin`, `/usr/bin` or `/bin`.
pub(crate) fn which(program: &str) -> TestResult<PathBuf> {
    ["/usr/local/bin", "/usr/bin", "/bin"]
        .iter()
        .map(|d| Path::new(d).join(program))
        .find(|p| p.is_file())
        .ok_or_else(|| format!("no {program} program in /usr/local/bin, /usr/bin or /bin").into())
}

/// One simulated node for a module-loaded agent: nvml-sim, the GPUs' device nodes (and MIG
/// capability nodes) in a private directory, and the module's work and pool directories.
pub(crate) struct ModuleNode {
    pub(crate) sim: SimNode,
    /// The module's `dev_root`.
    pub(crate) dev_root: PathBuf,
    _dev: Option<DevNodes>,
    pub(crate) scratch: tempfile::TempDir,
}

/// The device nodes of `nodes`' GPUs (the union of their minors) and MIG capability nodes, in
/// one private directory.
pub(crate) fn dev_nodes(nodes: &[&SimNode]) -> TestResult<DevNodes> {
    let mut minors = std::collections::BTreeSet::new();
    let mut inventories = Vec::new();
    for sim in nodes {
        let inventory = sim.inventory()?;
        minors.extend(inventory.gpus.iter().map(|g| g.minor));
        inventories.push(inventory);
    }
    let dev = DevNodes::nvidia(&minors.into_iter().collect::<Vec<_>>())?;
    for inventory in &inventories {
        mknod_mig_caps(dev.path(), inventory)?;
    }
    Ok(dev)
}

impl ModuleNode {
    /// The node `sim`, its device nodes made.
    pub(crate) fn new(sim: SimNode) -> TestResult<ModuleNode> {
        let dev = dev_nodes(&[&sim])?;
        let mut node = ModuleNode::with_dev_root(sim, dev.path())?;
        node._dev = Some(dev);
        Ok(node)
    }

    /// The node `sim` with its device nodes in `dev_root` (made by the caller, e.g. shared by
    /// several agents' nodes with [`dev_nodes`]).
    pub(crate) fn with_dev_root(sim: SimNode, dev_root: &Path) -> TestResult<ModuleNode> {
        let scratch = tempfile::Builder::new().prefix("mgpu-agents").tempdir()?;
        Ok(ModuleNode {
            sim,
            dev_root: dev_root.to_path_buf(),
            _dev: None,
            scratch,
        })
    }

    /// An agent spec running `isolation` (which names the module) on `cgroups` with
    /// `resources`, the module set up for this node with `extra` parameters.
    pub(crate) fn spec(
        &self,
        isolation: &str,
        cgroups: AgentCgroups,
        resources: &str,
        extra: &[(&str, &str)],
    ) -> TestResult<AgentSpec> {
        self.spec_loading(&module()?, isolation, cgroups, resources, extra)
    }

    /// [`Self::spec`] loading the module library `module` (e.g. one of an earlier release).
    pub(crate) fn spec_loading(
        &self,
        module: &Path,
        isolation: &str,
        cgroups: AgentCgroups,
        resources: &str,
        extra: &[(&str, &str)],
    ) -> TestResult<AgentSpec> {
        let mut spec = AgentSpec::new(isolation, cgroups, 0);
        spec.resources = resources.to_owned();
        let mut params: Vec<(String, String)> = vec![
            ("work_dir".into(), self.module_work().display().to_string()),
            ("pool_dir".into(), self.pool_dir().display().to_string()),
            ("dev_root".into(), self.dev_root.display().to_string()),
            (
                "proc_root".into(),
                self.sim.proc_root().display().to_string(),
            ),
            ("driver_volume".into(), "off".into()),
            ("cgroups_root".into(), spec.cgroups_root.clone()),
        ];
        params.extend(
            extra
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned())),
        );
        let modules = self.scratch.path().join("modules.json");
        std::fs::write(&modules, modules_json(module, &params).to_string())?;
        spec.modules = Some(modules);
        spec.env.push((
            "LD_LIBRARY_PATH".into(),
            self.sim.dir().display().to_string(),
        ));
        Ok(spec)
    }

    /// The module's `work_dir`.
    pub(crate) fn module_work(&self) -> PathBuf {
        self.scratch.path().join("module-work")
    }

    /// The module's `pool_dir`.
    pub(crate) fn pool_dir(&self) -> PathBuf {
        self.scratch.path().join("pool")
    }

    /// The node's pool file, `{}` while there is none.
    pub(crate) fn pool(&self) -> serde_json::Value {
        read_json(&self.pool_dir().join("gpu/pool.json"))
    }

    /// The module's checkpoint file.
    pub(crate) fn checkpoint_path(&self) -> PathBuf {
        self.module_work().join("gpu/allocations.json")
    }

    /// The module's checkpoint, `{}` while there is none.
    pub(crate) fn checkpoint(&self) -> serde_json::Value {
        read_json(&self.checkpoint_path())
    }
}

/// The isolation of a cgroup v1 agent loading the module in Mesos's devices cgroup.
pub(crate) fn module_isolation_v1() -> String {
    format!("filesystem/linux,linux/capabilities,cgroups/devices,{ISOLATOR_MODULE}")
}

/// A JSON file, `{}` when it is missing or not JSON.
pub(crate) fn read_json(path: &Path) -> serde_json::Value {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or_else(|| serde_json::json!({}))
}

/// What a task printed with [`probe_command`]: its uptime at start and end, and for each probe
/// (start, end) what each device node opened with (`ENXIO`: allowed, `EPERM`: denied).
#[derive(Debug, Clone, Default)]
pub(crate) struct TaskProbe {
    pub(crate) start: Option<f64>,
    pub(crate) end: Option<f64>,
    /// Node name → outcome, at start.
    pub(crate) opened_at_start: BTreeMap<String, String>,
    /// Node name → outcome, at end (empty when it ended before).
    pub(crate) opened_at_end: BTreeMap<String, String>,
    /// Environment variables the probe printed.
    pub(crate) env: BTreeMap<String, String>,
    /// Whether the probes at start completed (`probed` printed after them).
    pub(crate) probed: bool,
}

impl TaskProbe {
    /// Parses a task's stdout.
    pub(crate) fn parse(text: &str) -> TaskProbe {
        let mut p = TaskProbe::default();
        let mut at_end = false;
        for line in text.lines() {
            let words: Vec<&str> = line.split_whitespace().collect();
            match words.as_slice() {
                ["start", t] => p.start = t.parse().ok(),
                ["end", t] => p.end = t.parse().ok(),
                ["phase", "end"] => at_end = true,
                ["probed"] => p.probed = true,
                ["before", node, outcome] => {
                    let map = if at_end {
                        &mut p.opened_at_end
                    } else {
                        &mut p.opened_at_start
                    };
                    map.insert((*node).to_owned(), (*outcome).to_owned());
                }
                ["env", kv] => {
                    if let Some((k, v)) = kv.split_once('=') {
                        p.env.insert(k.to_owned(), v.to_owned());
                    }
                }
                _ => {}
            }
        }
        p
    }

    /// The nodes that opened (`ENXIO`) at start.
    pub(crate) fn opened(&self) -> Vec<&str> {
        self.opened_at_start
            .iter()
            .filter(|(_, o)| *o == "ENXIO")
            .map(|(n, _)| n.as_str())
            .collect()
    }

    /// The GPU minors that opened at start.
    pub(crate) fn gpus(&self) -> Vec<u32> {
        self.opened()
            .iter()
            .filter_map(|n| n.strip_prefix("nvidia")?.parse().ok())
            .collect()
    }
}

/// How long a [`probe_command`] task holds its GPUs between its two probes.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Hold<'a> {
    /// This many seconds.
    Secs(f64),
    /// Until this file exists.
    Until(&'a Path),
}

/// A task command: prints its uptime, probes every `nvidia*` node of `dev` (and
/// `dev/nvidia-caps` when it has one) and prints `probed`, holds (`hold`), probes again and
/// prints its uptime, then exits with `code`. On SIGTERM (a kill) it prints its uptime and exits
/// at once.
pub(crate) fn probe_command(probe: &Path, dev: &Path, hold: Hold<'_>, code: i32) -> String {
    let p = probe.display();
    let d = dev.display();
    let both = format!("{p} {d}; if [ -d {d}/nvidia-caps ]; then {p} {d}/nvidia-caps; fi");
    let wait = match hold {
        Hold::Secs(secs) => format!("sleep {secs:.2} & wait $!"),
        Hold::Until(go) => format!(
            "while [ ! -e {} ]; do sleep 0.1 & wait $!; done",
            go.display()
        ),
    };
    format!(
        "up() {{ cut -d' ' -f1 /proc/uptime; }}; echo start $(up); {both}; echo probed; \
         trap 'echo end $(up); exit 143' TERM; {wait}; \
         echo phase end; {both}; echo end $(up); exit {code}"
    )
}

/// `text` split into words as the shell reads it (`eval "set -- $text"`, lines joined), as
/// `agent.sh` takes `agent-flags`' lines and as a documented command is run.
pub(crate) fn shell_words(text: &str) -> TestResult<Vec<String>> {
    let out = std::process::Command::new("sh")
        .args(["-c", r#"eval "set -- $1"; printf '%s\0' "$@""#, "sh"])
        .arg(text.replace('\n', " "))
        .output()?;
    check(
        out.status.success(),
        format!(
            "sh could not read {text:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        ),
    )?;
    Ok(String::from_utf8(out.stdout)?
        .split('\0')
        .filter(|w| !w.is_empty())
        .map(str::to_owned)
        .collect())
}

/// A task command that runs until the file `go` exists.
pub(crate) fn until(go: &Path) -> String {
    format!("while [ ! -e {} ]; do sleep 0.2; done", go.display())
}

/// The container id of each task the agent runs, by task name (from its `/state`).
pub(crate) fn task_containers(agent: &Agent) -> TestResult<BTreeMap<String, String>> {
    let state: serde_json::Value = serde_json::from_str(&http_get(agent.port(), "/state")?)?;
    let mut out = BTreeMap::new();
    let executors = state["frameworks"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|f| f["executors"].as_array().into_iter().flatten());
    for executor in executors {
        for task in executor["tasks"].as_array().into_iter().flatten() {
            if let (Some(name), Some(container)) =
                (task["name"].as_str(), executor["container"].as_str())
            {
                out.insert(name.to_owned(), container.to_owned());
            }
        }
    }
    Ok(out)
}

/// The GPU minors (not the control devices) the cgroup v1 devices cgroup of `agent`'s
/// container `container` allows.
pub(crate) fn allowed_minors(
    agent: &Agent,
    container: &str,
) -> TestResult<std::collections::BTreeSet<u32>> {
    let list = Path::new("/sys/fs/cgroup/devices")
        .join(&agent.spec().cgroups_root)
        .join(container)
        .join("devices.list");
    let text = std::fs::read_to_string(&list).map_err(|e| format!("{}: {e}", list.display()))?;
    Ok(text
        .lines()
        .filter_map(|l| l.strip_prefix("c 195:"))
        .filter_map(|l| l.split_whitespace().next()?.parse::<u32>().ok())
        .filter(|m| *m < 255)
        .collect())
}
