//! A soak of real `mesos-agent`s loading the module: thousands of tasks through a real master,
//! with the agents SIGKILLed and restarted every few hundred tasks, looking for anything that
//! leaks per task and for any GPU open to two tasks at once.
//!
//! Two agents (cgroup v1, `cgroups/devices` + the module) under one master, because the module
//! refuses GPU sharing on a node with MIG devices ("sharing GPUs of a node with MIG devices is
//! not supported"):
//! - **shares**: 12 simulated A100s (nvml-sim's `dgx-a100` GPU descriptions, 8 + 4 copies):
//!   GPUs 0-9 whole, 10 and 11 shared four ways (`gpu_replicas=1,10=4,11=4`,
//!   `gpu_sharing=mps` with nvml-sim's `nvidia-cuda-mps-control` stand-in); offers `gpus:18`;
//! - **mig**: nvml-sim's shipped `dgx-a100-mixed` (GPUs 0-3 whole, 4-7 in MIG mode, 3g.20gb +
//!   2g.10gb + 1g.5gb + 1g.5gb each), `mig_strategy=mixed`: `gpus:4` and the MIG profiles as
//!   `mig-<profile>` scalars.
//!
//! Tasks come from a seeded mix: `gpus:0/1/2/4/8` (on the shares agent 1, 2 and 4 are shares of
//! GPU 10 or 11 while one has room, else whole GPUs; 8 fits only there), `mig-1g.5gb:1`,
//! `mig-2g.10gb:1`, `mig-3g.20gb:1` (without CAP_SYS_ADMIN); each sleeps 0.2-2 s and exits 0,
//! exits 1, or is killed by the framework. They run through one pymesos framework
//! (`testkit/python/gpu_framework.py`), at most 8 at a time, placed by Mesos's offers. Each task
//! prints its uptime and every device node it can open, at its start and its end. Both agents are
//! SIGKILLed and restarted with tasks running half-way through every `--restart-every` tasks,
//! and the nodes are drained to idle at the end of each such segment.
//!
//! Every 100 tasks (and at each idle point) it samples, per agent: the agent's RSS and open fds,
//! the devices-cgroup entries under its `--cgroups_root` (`devices.list` lines), the cgroups
//! under that root (all hierarchies), the pool's entries (`pool.json`: reservations, shares,
//! MPS daemons), the module's checkpoint (bytes, containers), the live MPS daemons, our device
//! programs attached under the root and the agent's BPF fds (cgroup v2), and, from the agent's
//! `/mesos-gpu/metrics`, the module's own heap (bytes, blocks) and table entries: flat module
//! figures under a growing RSS put the growth on Mesos. `--without-module` runs the same tasks
//! and restarts on agents without the module (and without GPUs) to measure Mesos's own growth.
//!
//! Checks, each printed with its count:
//! - no GPU is open to two tasks at once: on each agent, for every pair of tasks whose lives
//!   (their own uptime stamps; for a killed task without an end stamp, its terminal update)
//!   overlap, no whole GPU and no MIG capability node opens in both, a MIG parent opens only
//!   for MIG owners, and the owners of a shared GPU at any moment hold at most 4 units;
//! - every task opened what it asked for, at its start and its end: `gpus:k` whole GPUs exactly
//!   k GPU nodes, a share one, a MIG device its parent and two capability nodes, `gpus:0` none;
//! - every resource is back to its baseline at each idle point (fds within 8; the module's
//!   tables empty; RSS and the module's heap reported);
//! - no GPU is lost: at the end the pools and checkpoints hold nothing, and one wave of tasks
//!   asking for every GPU, share unit and MIG device of both nodes runs at once.
//!
//! Run: `cargo bench -p mesos-gpu-ffi --bench agent_soak -- [--tasks N] [--seed S]
//! [--restart-every R] [--cgroups v1|v2] [--without-module] [--agent-env NAME=VALUE]
//! [--svg FILE] [--logs DIR]` (root, cgroup v1 or v2, the Mesos in `../shared/mesos`, pymesos).
//! `./scripts/test.sh` runs `--tasks 200`. It exits non-zero when a check fails.

#[path = "../tests/support/mod.rs"]
mod support;

#[path = "../tests/agents/mod.rs"]
mod agents;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use agents::{Hold, ModuleNode, TaskProbe, dev_nodes, module_isolation_v1, probe, probe_command};
use mesos_gpu_enforce::cgroup::{
    CgroupError, CgroupLayout, CgroupVersion, Hierarchy, V2DeviceCgroup,
};
use mesos_gpu_isolator::agent_flags::{MigOffer, MigStrategy};
use mesos_gpu_isolator::lifecycle::ContainerId;
use mesos_gpu_node::inventory::Inventory;
use mesos_gpu_testkit::mesos::framework::{
    Event, Framework, FrameworkSpec, TERMINAL, check_pymesos,
};
use mesos_gpu_testkit::mesos::{
    Agent, AgentCgroups, AgentSpec, DevNodes, ISOLATOR_MODULE, Master, MesosInstall, http_get,
    tail, wait_for,
};
use mesos_gpu_testkit::mps::MpsControl;
use mesos_gpu_testkit::nvml_sim::SimNode;
use support::TestResult;

/// The shares agent's GPUs: 0-9 whole, 10 and 11 shared `REPLICAS` ways.
const SHARES_GPUS: u32 = 12;
const SHARED: [u32; 2] = [10, 11];
/// How many GPUs are shared.
const SHARED_COUNT: u32 = 2;
const REPLICAS: u32 = 4;
const MAX_IN_FLIGHT: usize = 8;
const SAMPLE_EVERY: usize = 100;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let opts = match Options::parse(&args) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("agent_soak: {e}");
            return ExitCode::from(2);
        }
    };
    if let Err(why) = ready(&opts) {
        eprintln!("agent_soak: cannot run here: {why}");
        return ExitCode::from(if opts.required { 1 } else { 0 });
    }
    match soak(&opts) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!("agent_soak: a check failed (see above)");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("agent_soak: {e}");
            ExitCode::FAILURE
        }
    }
}

struct Options {
    tasks: usize,
    seed: u64,
    restart_every: usize,
    cgroups: AgentCgroups,
    /// The agents run Mesos's own isolation only, no module: the same tasks and restarts, with
    /// every task's GPU ask left out, to tell the module's memory from the agent's.
    without_module: bool,
    /// Extra environment of the agents (`--agent-env K=V`), e.g. glibc's `MALLOC_ARENA_MAX`.
    agent_env: Vec<(String, String)>,
    svg: Option<PathBuf>,
    /// Where to copy the agents' logs at the end.
    logs: Option<PathBuf>,
    /// Fail (not skip) when the host lacks what the soak needs.
    required: bool,
}

impl Options {
    fn parse(args: &[String]) -> Result<Options, String> {
        let mut o = Options {
            tasks: 2000,
            seed: 27,
            restart_every: 500,
            cgroups: AgentCgroups::V1,
            without_module: false,
            agent_env: Vec::new(),
            svg: None,
            logs: None,
            required: std::env::var("MESOS_GPU_REQUIRE").is_ok_and(|r| r.contains("mesos")),
        };
        let mut it = args.iter();
        while let Some(a) = it.next() {
            let mut value = |name: &str| {
                it.next()
                    .cloned()
                    .ok_or_else(|| format!("{name} needs a value"))
            };
            match a.as_str() {
                "--tasks" => o.tasks = number(&value("--tasks")?, "--tasks")?,
                "--seed" => o.seed = number(&value("--seed")?, "--seed")?,
                "--restart-every" => {
                    o.restart_every = number(&value("--restart-every")?, "--restart-every")?
                }
                "--cgroups" => {
                    o.cgroups = match value("--cgroups")?.as_str() {
                        "v1" => AgentCgroups::V1,
                        "v2" => AgentCgroups::V2,
                        other => {
                            return Err(format!("--cgroups {other:?}: expected v1 or v2"));
                        }
                    }
                }
                "--without-module" => o.without_module = true,
                "--agent-env" => {
                    let kv = value("--agent-env")?;
                    let (k, v) = kv
                        .split_once('=')
                        .ok_or_else(|| format!("--agent-env {kv:?}: expected NAME=VALUE"))?;
                    o.agent_env.push((k.to_owned(), v.to_owned()));
                }
                "--svg" => o.svg = Some(PathBuf::from(value("--svg")?)),
                "--logs" => o.logs = Some(PathBuf::from(value("--logs")?)),
                // What `cargo bench` passes to a harness-less bench.
                "--bench" => {}
                other => {
                    return Err(format!(
                        "unknown argument {other:?}: expected --tasks N, --seed S, \
                         --restart-every R, --cgroups v1|v2, --without-module, \
                         --agent-env NAME=VALUE, --svg FILE, --logs DIR"
                    ));
                }
            }
        }
        if o.tasks == 0 || o.restart_every < 2 {
            return Err("--tasks must be at least 1 and --restart-every at least 2".into());
        }
        Ok(o)
    }
}

fn number<T: std::str::FromStr>(text: &str, name: &str) -> Result<T, String> {
    text.parse()
        .map_err(|_| format!("{name} {text:?}: expected a whole number"))
}

fn ready(opts: &Options) -> Result<(), String> {
    let is_root = std::fs::read_to_string("/proc/self/status").is_ok_and(|s| {
        s.lines()
            .any(|l| l.starts_with("Uid:") && l.contains("\t0\t"))
    });
    if !is_root {
        return Err("not root".into());
    }
    match opts.cgroups {
        AgentCgroups::V1 if !Path::new("/sys/fs/cgroup/devices/devices.allow").exists() => {
            return Err("no cgroup v1 devices hierarchy".into());
        }
        AgentCgroups::V2 if mesos_gpu_testkit::cgroup2_root().is_none() => {
            return Err("no cgroup2 hierarchy".into());
        }
        _ => {}
    }
    MesosInstall::locate()?.check_runs()?;
    check_pymesos()?;
    build_stand_ins()
}

/// Builds nvml-sim's program stand-ins (`nvidia-cuda-mps-control` for the shared GPUs) in this
/// bench's profile when they are not built yet: `cargo bench` builds the bench, not another
/// package's binaries (issue 37: the soak panicked on a fresh checkout).
fn build_stand_ins() -> Result<(), String> {
    let Err(missing) = mesos_gpu_testkit::mps::find_program() else {
        return Ok(());
    };
    let exe = std::env::current_exe().map_err(|e| format!("this bench's path: {e}"))?;
    let profile = mesos_gpu_testkit::mps::profile_of(&exe)
        .ok_or_else(|| format!("{missing}; and this bench's profile is unknown"))?;
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    eprintln!(
        "agent_soak: building nvml-sim's program stand-ins (cargo build --profile {profile} -p nvml-sim --bins)"
    );
    let status = std::process::Command::new(&cargo)
        .args([
            "build",
            "--quiet",
            "--profile",
            &profile,
            "-p",
            "nvml-sim",
            "--bins",
        ])
        .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join(".."))
        .status()
        .map_err(|e| format!("{missing}; and {cargo} cannot run: {e}"))?;
    if !status.success() {
        return Err(format!("{missing}; and building them failed ({status})"));
    }
    mesos_gpu_testkit::mps::find_program().map(drop)
}

/// A seeded generator (splitmix64).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A whole number below `n`.
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// An index picked with these weights.
    fn pick(&mut self, weights: &[u64]) -> usize {
        let mut r = self.below(weights.iter().sum());
        for (i, w) in weights.iter().enumerate() {
            if r < *w {
                return i;
            }
            r -= w;
        }
        weights.len() - 1
    }
}

/// What a task asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Ask {
    Gpus(u32),
    Mig(&'static str),
}

impl Ask {
    fn resource(self) -> (&'static str, f64) {
        match self {
            Ask::Gpus(n) => ("gpus", f64::from(n)),
            Ask::Mig(profile) => (profile, 1.0),
        }
    }

    /// MIG tasks run without CAP_SYS_ADMIN (which opens every MIG device whatever the
    /// device files say, so the module refuses it): effective capabilities CHOWN and
    /// DAC_OVERRIDE (`linux/capabilities`).
    fn container(self) -> Option<serde_json::Value> {
        matches!(self, Ask::Mig(_)).then(|| {
            serde_json::json!({
                "type": "MESOS",
                "linux_info": {
                    "effective_capabilities": { "capabilities": ["CHOWN", "DAC_OVERRIDE"] }
                }
            })
        })
    }

    fn label(self) -> String {
        match self {
            Ask::Gpus(n) => format!("gpus:{n}"),
            Ask::Mig(p) => format!("{p}:1"),
        }
    }
}

/// How a task ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fate {
    Exit,
    Fail,
    Kill,
}

#[derive(Debug, Clone)]
struct Planned {
    id: String,
    ask: Ask,
    secs: f64,
    fate: Fate,
}

fn plan(n: usize, seed: u64) -> Vec<Planned> {
    let asks = [
        Ask::Gpus(0),
        Ask::Gpus(1),
        Ask::Gpus(2),
        Ask::Gpus(4),
        Ask::Gpus(8),
        Ask::Mig("mig-1g.5gb"),
        Ask::Mig("mig-2g.10gb"),
        Ask::Mig("mig-3g.20gb"),
    ];
    let weights = [14, 24, 16, 8, 5, 16, 9, 8];
    let mut rng = Rng(seed);
    (0..n)
        .map(|i| {
            let ask = asks[rng.pick(&weights)];
            let secs = 0.2 + 0.01 * rng.below(180) as f64;
            let fate = [Fate::Exit, Fate::Fail, Fate::Kill][rng.pick(&[70, 15, 15])];
            Planned {
                id: format!("soak-{i:05}"),
                ask,
                secs,
                fate,
            }
        })
        .collect()
}

/// The shares agent's node: `dgx-a100`'s GPU descriptions, copied to 12 GPUs.
fn shares_node() -> TestResult<String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../nvml-sim/topologies/dgx-a100.json");
    let mut node: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path)?)?;
    let base = node["gpus"]
        .as_array()
        .cloned()
        .ok_or("dgx-a100 has no gpus")?;
    let mut gpus = Vec::new();
    for i in 0..SHARES_GPUS {
        let mut g = base[i as usize % base.len()].clone();
        g["index"] = i.into();
        g["minor"] = i.into();
        g["uuid"] = format!("GPU-50a50a50-0000-4000-8000-{i:012x}").into();
        g["serial"] = format!("15620200027{i:02}").into();
        g["pci"]["bus_id"] = format!("00000000:{:02X}:00.0", 0x10 + 8 * i).into();
        gpus.push(g);
    }
    node["gpus"] = gpus.into();
    Ok(node.to_string())
}

/// Which of the two agents.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Role {
    Shares,
    Mig,
}

impl Role {
    fn name(self) -> &'static str {
        match self {
            Role::Shares => "shares",
            Role::Mig => "mig",
        }
    }
}

/// One sample of an agent and its node.
#[derive(Debug, Clone, Default)]
struct Sample {
    label: String,
    agent: &'static str,
    done: usize,
    running: usize,
    idle: bool,
    rss_kib: u64,
    fds: usize,
    device_entries: usize,
    /// Our device programs attached to the cgroups under the agent's root (cgroup v2).
    bpf_programs: usize,
    /// The agent's fds to BPF programs.
    bpf_fds: usize,
    cgroups: usize,
    reservations: usize,
    shares: usize,
    pool_mps: usize,
    checkpoint_bytes: u64,
    checkpoint_containers: usize,
    mps_daemons: usize,
    /// The module's own heap (`mesos_gpu_module_heap_bytes`), when it answered.
    module_heap_kib: Option<u64>,
    /// In how many blocks (`mesos_gpu_module_heap_blocks`).
    module_heap_blocks: Option<u64>,
    /// The entries of the module's tables (`mesos_gpu_module_entries`) but its MPS daemons.
    module_entries: Option<u64>,
}

/// One agent of the soak and its node.
struct SoakAgent {
    role: Role,
    node: ModuleNode,
    agent: Agent,
    inventory: Inventory,
    mps: Option<MpsControl>,
    resources: String,
    /// Whether the agent loads the module.
    module: bool,
}

impl SoakAgent {
    fn start(
        role: Role,
        sim: SimNode,
        dev: &Path,
        install: &MesosInstall,
        master: &Master,
        opts: &Options,
    ) -> TestResult<SoakAgent> {
        let inventory = sim.inventory()?;
        let node = ModuleNode::with_dev_root(sim, dev)?;
        let mut extra: Vec<(String, String)> = Vec::new();
        let (gpus, mps) = match role {
            Role::Shares => {
                let mps = MpsControl::install("{}");
                extra.extend([
                    (
                        "gpu_replicas".to_owned(),
                        format!("1,{}", SHARED.map(|g| format!("{g}={REPLICAS}")).join(",")),
                    ),
                    ("gpu_sharing".into(), "mps".into()),
                    ("mps_control".into(), mps.program().display().to_string()),
                    (
                        "mps_root".into(),
                        node.scratch.path().join("mps").display().to_string(),
                    ),
                ]);
                let whole = SHARES_GPUS - SHARED_COUNT;
                (
                    vec![format!("gpus:{}", whole + SHARED_COUNT * REPLICAS)],
                    Some(mps),
                )
            }
            Role::Mig => {
                extra.push(("mig_strategy".into(), "mixed".into()));
                (
                    MigOffer::of(&inventory, MigStrategy::Mixed).resources(),
                    None,
                )
            }
        };
        let mut spec = if opts.without_module {
            // Mesos's own isolation: the same filesystem and capabilities, its devices cgroup
            // on v1 (v2 agents refuse `cgroups/devices` beside nothing here, and the module
            // is what would add device control there), and no GPU at all.
            let isolation = match opts.cgroups {
                AgentCgroups::V1 => "filesystem/linux,linux/capabilities,cgroups/devices",
                AgentCgroups::V2 => "filesystem/linux,linux/capabilities",
            };
            let mut spec = AgentSpec::new(isolation, opts.cgroups, 0);
            spec.resources = "cpus:4;mem:8192".to_owned();
            spec
        } else {
            let resources = format!("cpus:4;mem:8192;{}", gpus.join(";"));
            let extra: Vec<(&str, &str)> = extra
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect();
            let isolation = match opts.cgroups {
                AgentCgroups::V1 => module_isolation_v1(),
                AgentCgroups::V2 => {
                    format!("filesystem/linux,linux/capabilities,{ISOLATOR_MODULE}")
                }
            };
            node.spec(&isolation, opts.cgroups, &resources, &extra)?
        };
        spec.env.extend(opts.agent_env.iter().cloned());
        let resources = spec.resources.clone();
        let agent = Agent::start(install, master, spec)?;
        Ok(SoakAgent {
            role,
            node,
            agent,
            inventory,
            mps: mps.filter(|_| !opts.without_module),
            resources,
            module: !opts.without_module,
        })
    }

    fn is_shared(&self, minor: u32) -> bool {
        self.role == Role::Shares && SHARED.contains(&minor)
    }

    fn is_mig_parent(&self, minor: u32) -> bool {
        self.inventory
            .gpus
            .iter()
            .any(|g| g.minor == minor && self.inventory.mig.is_enabled(g.index))
    }

    fn sample(&mut self, label: &str, done: usize, running: usize, idle: bool) -> Sample {
        let pid = self.agent.pid();
        let status = pid
            .map(|p| std::fs::read_to_string(format!("/proc/{p}/status")).unwrap_or_default())
            .unwrap_or_default();
        let rss_kib = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or(0);
        let fds = pid
            .and_then(|p| std::fs::read_dir(format!("/proc/{p}/fd")).ok())
            .map_or(0, |d| d.count());
        let devices = Path::new("/sys/fs/cgroup/devices").join(&self.agent.spec().cgroups_root);
        let unified =
            mesos_gpu_testkit::cgroup2_root().map(|r| r.join(&self.agent.spec().cgroups_root));
        let mut device_entries = 0;
        let mut bpf_programs = 0;
        let mut cgroups = 0;
        for dir in self.agent.cgroup_roots() {
            walk(&dir, &mut |d| {
                if d != dir {
                    cgroups += 1;
                }
                if d.starts_with(&devices) && d != devices {
                    device_entries += std::fs::read_to_string(d.join("devices.list"))
                        .map_or(0, |t| t.lines().count());
                }
                if let Some(unified) = &unified
                    && d.starts_with(unified)
                {
                    bpf_programs += device_programs(d);
                }
            });
        }
        let bpf_fds = pid
            .and_then(|p| std::fs::read_dir(format!("/proc/{p}/fd")).ok())
            .map_or(0, |d| {
                d.flatten()
                    .filter(|e| {
                        std::fs::read_link(e.path())
                            .is_ok_and(|l| l.as_os_str() == "anon_inode:bpf-prog")
                    })
                    .count()
            });
        let module = if self.module {
            module_figures(self.agent.port())
        } else {
            ModuleSample::default()
        };
        let pool = self.node.pool();
        let count = |k: &str| pool[k].as_object().map_or(0, serde_json::Map::len);
        let checkpoint = self.node.checkpoint();
        Sample {
            label: label.to_owned(),
            agent: self.role.name(),
            done,
            running,
            idle,
            rss_kib,
            fds,
            device_entries,
            bpf_programs,
            bpf_fds,
            cgroups,
            reservations: count("reservations"),
            shares: count("shares"),
            pool_mps: count("mps"),
            checkpoint_bytes: std::fs::metadata(self.node.checkpoint_path()).map_or(0, |m| m.len()),
            checkpoint_containers: checkpoint["containers"]
                .as_object()
                .map_or(0, serde_json::Map::len),
            mps_daemons: self.mps.as_ref().map_or(0, |m| daemons(m).len()),
            module_heap_kib: module.heap_kib,
            module_heap_blocks: module.heap_blocks,
            module_entries: module.entries,
        }
    }
}

/// How many of our device programs are attached to cgroup `dir` (the module's own v2 code
/// asks the kernel: `BPF_PROG_QUERY`, then each program's name).
fn device_programs(dir: &Path) -> usize {
    let (Some(parent), Some(name)) = (dir.parent(), dir.file_name()) else {
        return 0;
    };
    let hierarchy = Hierarchy {
        version: CgroupVersion::V2,
        mount: parent.to_path_buf(),
    };
    let Ok(layout) = CgroupLayout::new(hierarchy, "") else {
        return 0;
    };
    let Ok(id) = ContainerId::new(name.to_string_lossy().into_owned()) else {
        return 0;
    };
    match V2DeviceCgroup::open(&layout, &id).map(|c| c.attached_program()) {
        Ok(Ok(found)) => usize::from(found.is_some()),
        Ok(Err(CgroupError::TooManyPrograms { ids, .. })) => ids.len(),
        // Gone since the walk.
        _ => 0,
    }
}

/// The module's own figures from the agent's `/mesos-gpu/metrics`; all `None` when the agent
/// does not answer (restarting).
#[derive(Default)]
struct ModuleSample {
    heap_kib: Option<u64>,
    heap_blocks: Option<u64>,
    /// The entries of its tables but its MPS daemons.
    entries: Option<u64>,
}

fn module_figures(port: u16) -> ModuleSample {
    let mut m = ModuleSample::default();
    let Ok(text) = http_get(port, "/mesos-gpu/metrics") else {
        return m;
    };
    for line in text.lines() {
        if let Some(v) = line.strip_prefix("mesos_gpu_module_heap_bytes ") {
            m.heap_kib = v.trim().parse::<u64>().ok().map(|b| b / 1024);
        } else if let Some(v) = line.strip_prefix("mesos_gpu_module_heap_blocks ") {
            m.heap_blocks = v.trim().parse::<u64>().ok();
        } else if let Some(rest) = line.strip_prefix("mesos_gpu_module_entries{table=\"")
            && let Some((table, v)) = rest.split_once("\"} ")
            && table != "mps_daemons"
        {
            *m.entries.get_or_insert(0) += v.trim().parse::<u64>().unwrap_or(0);
        }
    }
    m
}

/// The pids of the live MPS control daemons started from `mps`'s program.
fn daemons(mps: &MpsControl) -> Vec<String> {
    let program = mps.program();
    std::fs::read_dir("/proc")
        .map(|d| {
            d.flatten()
                .filter(|e| std::fs::read_link(e.path().join("exe")).is_ok_and(|x| x == program))
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

struct Soak {
    agents: Vec<SoakAgent>,
    fw: Framework,
    probe: PathBuf,
    dev: DevNodes,
    /// Kept for the soak's life.
    _master: Master,
}

impl Soak {
    fn sample(&mut self, label: &str, done: usize, running: usize, idle: bool) -> Vec<Sample> {
        self.agents
            .iter_mut()
            .map(|a| a.sample(label, done, running, idle))
            .collect()
    }

    fn agent_at(&self, port: u16) -> Option<&SoakAgent> {
        self.agents.iter().find(|a| a.agent.port() == port)
    }

    /// The HTTP port of the agent task `id` was launched on (0 before it was).
    fn port_of(&self, id: &str) -> u16 {
        self.fw
            .first("accept", id)
            .and_then(|e| e.json["port"].as_u64())
            .and_then(|p| u16::try_from(p).ok())
            .unwrap_or(0)
    }

    /// Task `id`'s stdout, from the agent that ran it.
    fn stdout(&self, id: &str, port: u16) -> String {
        self.agent_at(port)
            .and_then(|a| a.agent.sandbox(id).ok())
            .map(|d| std::fs::read_to_string(d.join("stdout")).unwrap_or_default())
            .unwrap_or_default()
    }
}

fn walk(dir: &Path, f: &mut impl FnMut(&Path)) {
    f(dir);
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                walk(&e.path(), f);
            }
        }
    }
}

/// What became of one task.
#[derive(Debug, Clone)]
struct Outcome {
    planned: Planned,
    /// The HTTP port of the agent it was launched on.
    port: u16,
    /// When TASK_RUNNING arrived.
    running: Option<f64>,
    /// The terminal state, when it arrived, and its message.
    state: String,
    ended: f64,
    message: String,
    probe: TaskProbe,
    /// What the task printed.
    stdout: String,
}

impl Outcome {
    /// The task's life: its own start and end stamps, else its RUNNING and terminal updates
    /// (which enclose it).
    fn life(&self) -> Option<(f64, f64)> {
        let start = self.probe.start.or(self.running)?;
        Some((start, self.probe.end.unwrap_or(self.ended)))
    }

    /// Reads what became of task `p` from the framework's events and its sandbox.
    fn of(s: &Soak, p: &Planned, updates: &[Event], end: &Event) -> Outcome {
        let port =
            s.fw.first("accept", &p.id)
                .and_then(|e| e.json["port"].as_u64())
                .and_then(|p| u16::try_from(p).ok())
                .unwrap_or(0);
        let stdout = s.stdout(&p.id, port);
        Outcome {
            planned: p.clone(),
            port,
            running: updates
                .iter()
                .find(|e| e.state == "TASK_RUNNING")
                .map(|e| e.t),
            state: end.state.clone(),
            ended: end.t,
            message: end.json["message"].as_str().unwrap_or_default().to_owned(),
            probe: TaskProbe::parse(&stdout),
            stdout,
        }
    }
}

fn soak(opts: &Options) -> TestResult<bool> {
    let started = Instant::now();
    let install = MesosInstall::locate()?;
    let shares = SimNode::from_json(&shares_node()?);
    let mig = SimNode::shipped("dgx-a100-mixed");
    let dev = dev_nodes(&[&shares, &mig])?;
    let master = Master::start(&install)?;
    let agents = vec![
        SoakAgent::start(Role::Shares, shares, dev.path(), &install, &master, opts)?,
        SoakAgent::start(Role::Mig, mig, dev.path(), &install, &master, opts)?,
    ];
    let fw = Framework::start(&master, &FrameworkSpec::gpu("mesos-gpu-soak"))?;
    let mut s = Soak {
        agents,
        fw,
        probe: probe()?,
        dev,
        _master: master,
    };
    println!(
        "agent_soak: {} tasks, seed {}, cgroup {}, {}, both agents SIGKILLed + restarted \
         half-way through every {} tasks",
        opts.tasks,
        opts.seed,
        match opts.cgroups {
            AgentCgroups::V1 => "v1",
            AgentCgroups::V2 => "v2",
        },
        if opts.without_module {
            "WITHOUT the module (Mesos's own isolation; GPU asks left out)"
        } else {
            "with the module"
        },
        opts.restart_every
    );
    for (k, v) in &opts.agent_env {
        println!("  agents' environment: {k}={v}");
    }
    for a in &s.agents {
        println!("  agent {}: --resources={}", a.role.name(), a.resources);
    }
    let result = run_soak(&mut s, opts);
    if let (Some(dir), Ok((_, outcomes))) = (&opts.logs, &result) {
        let _ = std::fs::create_dir_all(dir);
        let lines: Vec<String> = outcomes
            .iter()
            .map(|o| {
                serde_json::json!({
                    "id": o.planned.id, "ask": o.planned.ask.label(), "port": o.port,
                    "state": o.state, "message": o.message, "running": o.running,
                    "ended": o.ended, "stdout": o.stdout,
                })
                .to_string()
            })
            .collect();
        let _ = std::fs::write(dir.join("tasks.jsonl"), lines.join("\n"));
    }
    let result = result.map(|(ok, _)| ok);
    if let Some(dir) = &opts.logs {
        let _ = std::fs::create_dir_all(dir);
        for a in &s.agents {
            let _ = std::fs::write(
                dir.join(format!("agent-{}.log", a.role.name())),
                a.agent.log(),
            );
        }
    }
    // MPS daemons outlive the agent: stop them whatever happened.
    for a in &s.agents {
        if let Some(mps) = &a.mps {
            for pid in daemons(mps) {
                let _ = std::process::Command::new("kill")
                    .args(["-9", &pid])
                    .status();
            }
        }
    }
    let ok = result?;
    println!("agent_soak: done in {:.0?}", started.elapsed());
    Ok(ok)
}

/// One SIGKILL + restart of both agents.
struct Restart {
    /// Tasks launched by then.
    after: usize,
    /// Tasks in flight.
    live: usize,
    took: Duration,
    /// `CLOCK_BOOTTIME` when the agents were killed and when both had re-registered.
    down: (f64, f64),
}

fn run_soak(s: &mut Soak, opts: &Options) -> TestResult<(bool, Vec<Outcome>)> {
    let plan = plan(opts.tasks, opts.seed);
    let mut samples = s.sample("baseline", 0, 0, true);
    println!("  {}", header());
    for sample in &samples {
        println!("  {}", row(sample));
    }
    let mut outcomes: BTreeMap<String, Outcome> = BTreeMap::new();
    let mut in_flight: BTreeMap<String, Planned> = BTreeMap::new();
    let mut killed: BTreeSet<String> = BTreeSet::new();
    let mut done = 0;
    let mut restarts = Vec::new();
    for segment in plan.chunks(opts.restart_every) {
        let mut launched = 0;
        let mut last_progress = Instant::now();
        while launched < segment.len() || !in_flight.is_empty() {
            while in_flight.len() < MAX_IN_FLIGHT && launched < segment.len() {
                let p = &segment[launched];
                let code = i32::from(p.fate == Fate::Fail);
                // A task to be killed sleeps long enough to be killed while it runs.
                let secs = if p.fate == Fate::Kill { 60.0 } else { p.secs };
                let command = probe_command(&s.probe, s.dev.path(), Hold::Secs(secs), code);
                let mut resources = vec![("cpus", 0.1), ("mem", 32.0)];
                if !opts.without_module {
                    resources.push(p.ask.resource());
                }
                s.fw.launch_in(&p.id, &resources, &command, None, p.ask.container())?;
                in_flight.insert(p.id.clone(), p.clone());
                launched += 1;
                if launched == segment.len() / 2 && segment.len() >= 2 {
                    // Both agents SIGKILLed and restarted with tasks running: once every task in
                    // flight runs (a task the agent has not checkpointed yet would be lost).
                    let deadline = Instant::now() + Duration::from_secs(120);
                    while Instant::now() < deadline
                        && !in_flight.keys().all(|id| {
                            s.fw.updates(id).iter().any(|e| {
                                e.state == "TASK_RUNNING" || TERMINAL.contains(&e.state.as_str())
                            })
                        })
                    {
                        std::thread::sleep(Duration::from_millis(100));
                    }
                    let t = Instant::now();
                    let down = now();
                    let live = in_flight.len();
                    for a in &mut s.agents {
                        a.agent.kill()?;
                    }
                    for a in &mut s.agents {
                        a.agent.restart()?;
                    }
                    restarts.push(Restart {
                        after: done + live,
                        live,
                        took: t.elapsed(),
                        down: (down, now()),
                    });
                    println!(
                        "  agents SIGKILLed with {live} tasks in flight; restarted and \
                         re-registered in {:.1?}",
                        t.elapsed()
                    );
                }
            }
            let mut ended = Vec::new();
            for (id, p) in &in_flight {
                let updates = s.fw.updates(id);
                let running = updates.iter().find(|e| e.state == "TASK_RUNNING");
                // Killed once it has probed (a kill during its first probe would leave no
                // record of what it could open).
                if let Some(running) = running
                    && p.fate == Fate::Kill
                    && !killed.contains(id)
                    && running.t + p.secs < now()
                    && s.stdout(id, s.port_of(id)).contains("\nprobed\n")
                {
                    s.fw.kill(id)?;
                    killed.insert(id.clone());
                }
                if let Some(end) = updates
                    .iter()
                    .find(|e| TERMINAL.contains(&e.state.as_str()))
                {
                    ended.push(Outcome::of(s, p, &updates, end));
                }
            }
            for outcome in ended {
                in_flight.remove(&outcome.planned.id);
                outcomes.insert(outcome.planned.id.clone(), outcome);
                done += 1;
                last_progress = Instant::now();
                if done % SAMPLE_EVERY == 0 {
                    for sample in s.sample(&format!("{done} ended"), done, in_flight.len(), false) {
                        println!("  {}", row(&sample));
                        samples.push(sample);
                    }
                }
            }
            if last_progress.elapsed() > Duration::from_secs(300) {
                let logs: Vec<String> = s
                    .agents
                    .iter()
                    .map(|a| format!("{}:\n{}", a.role.name(), tail(&a.agent.log(), 20)))
                    .collect();
                return Err(format!(
                    "no task ended for 5 minutes; in flight: {:?}; agent logs:\n{}",
                    in_flight.keys().collect::<Vec<_>>(),
                    logs.join("\n")
                )
                .into());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        for sample in settle_idle(s, &format!("idle after {done}"), done) {
            println!("  {}", row(&sample));
            samples.push(sample);
        }
    }
    // Without the module the agents offer no GPU: no wave.
    let wave = if opts.without_module {
        Vec::new()
    } else {
        final_wave(s)?
    };
    for sample in settle_idle(s, "idle after the full wave", done) {
        println!("  {}", row(&sample));
        samples.push(sample);
    }
    let ok = report(s, opts, &samples, &outcomes, &restarts, &wave);
    Ok((ok, outcomes.into_values().chain(wave).collect()))
}

/// `CLOCK_BOOTTIME` now, in seconds (the clock of `/proc/uptime` and the framework's events).
fn now() -> f64 {
    std::fs::read_to_string("/proc/uptime")
        .ok()
        .and_then(|t| t.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0)
}

/// Waits (up to a minute) until the pools, the checkpoints and the agents' cgroups hold no
/// task, then samples.
fn settle_idle(s: &mut Soak, label: &str, done: usize) -> Vec<Sample> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let samples = s.sample(label, done, 0, true);
        let settled = samples.iter().all(|x| {
            x.reservations == 0
                && x.shares == 0
                && x.checkpoint_containers == 0
                && x.cgroups == 0
                && x.bpf_programs == 0
                && x.module_entries.is_none_or(|n| n == 0)
        });
        if settled || Instant::now() > deadline {
            return samples;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// Every GPU, share unit and MIG device of both nodes asked for at once: the whole GPUs of each
/// agent in one task, each shared GPU's units in one task, each MIG device in one task.
fn final_wave(s: &mut Soak) -> TestResult<Vec<Outcome>> {
    let mut asks = Vec::new();
    for a in &s.agents {
        let port = a.agent.port();
        let whole = a
            .inventory
            .gpus
            .iter()
            .filter(|g| !a.is_shared(g.minor) && !a.inventory.mig.is_enabled(g.index))
            .map(|_| 1)
            .sum();
        asks.push((Ask::Gpus(whole), port));
        if a.role == Role::Shares {
            asks.extend(SHARED.map(|_| (Ask::Gpus(REPLICAS), port)));
        }
        for d in &a.inventory.mig.devices {
            let profile = match d.profile_name.as_str() {
                "1g.5gb" => "mig-1g.5gb",
                "2g.10gb" => "mig-2g.10gb",
                "3g.20gb" => "mig-3g.20gb",
                other => return Err(format!("unexpected MIG profile {other}").into()),
            };
            asks.push((Ask::Mig(profile), port));
        }
    }
    // Every wave task holds its grant until all of them run and have probed.
    // In the device directory (the probe looks at `nvidia*` only), removed with it.
    let go = s.dev.path().join("wave-go");
    let mut planned = Vec::new();
    for (i, (ask, port)) in asks.into_iter().enumerate() {
        let p = Planned {
            id: format!("wave-{i:02}"),
            ask,
            secs: 8.0,
            fate: Fate::Exit,
        };
        let command = probe_command(&s.probe, s.dev.path(), Hold::Until(&go), 0);
        s.fw.launch_in(
            &p.id,
            &[("cpus", 0.1), ("mem", 32.0), ask.resource()],
            &command,
            Some(port),
            ask.container(),
        )?;
        planned.push(p);
    }
    let all_probed = wait_for(
        Duration::from_secs(300),
        || "every task of the final wave to run and probe".to_owned(),
        || {
            planned
                .iter()
                .all(|p| {
                    let port = s.port_of(&p.id);
                    port != 0 && s.stdout(&p.id, port).contains("\nprobed\n")
                })
                .then_some(())
        },
    );
    std::fs::write(&go, b"")?;
    all_probed?;
    let mut outcomes = Vec::new();
    for p in planned {
        let end = s.fw.wait_terminal(&p.id, Duration::from_secs(300))?;
        let updates = s.fw.updates(&p.id);
        outcomes.push(Outcome::of(s, &p, &updates, &end));
    }
    Ok(outcomes)
}

/// What a task opened, by kind of node, on the agent that ran it.
struct Opened {
    whole: Vec<u32>,
    shared: Vec<u32>,
    mig_parents: Vec<u32>,
    caps: Vec<String>,
}

fn classify(a: &SoakAgent, probe: &TaskProbe) -> Opened {
    let mut o = Opened {
        whole: Vec::new(),
        shared: Vec::new(),
        mig_parents: Vec::new(),
        caps: Vec::new(),
    };
    for node in probe.opened() {
        if let Some(m) = node
            .strip_prefix("nvidia")
            .and_then(|m| m.parse::<u32>().ok())
        {
            if a.is_shared(m) {
                o.shared.push(m);
            } else if a.is_mig_parent(m) {
                o.mig_parents.push(m);
            } else {
                o.whole.push(m);
            }
        } else if node.starts_with("nvidia-cap") {
            o.caps.push(node.to_owned());
        }
    }
    o.caps.sort();
    o
}

/// The share units a task holds (`MESOS_GPU_SHARE=k/R`), or R when it printed none.
fn units(probe: &TaskProbe) -> u32 {
    probe
        .env
        .get("MESOS_GPU_SHARE")
        .and_then(|v| v.split_once('/')?.0.parse().ok())
        .unwrap_or(REPLICAS)
}

/// Why a task's grant does not match what it asked for, if it does not.
fn wrong_grant(a: &SoakAgent, o: &Outcome) -> Option<String> {
    // A task whose first probes did not complete (it never ran, or ended during them) left no
    // record of what it could open.
    if !o.probe.probed {
        return None;
    }
    let at_end = TaskProbe {
        opened_at_start: o.probe.opened_at_end.clone(),
        ..TaskProbe::default()
    };
    if !o.probe.opened_at_end.is_empty() && at_end.opened() != o.probe.opened() {
        return Some(format!(
            "opened {:?} at start but {:?} at end; it printed:\n{}",
            o.probe.opened(),
            at_end.opened(),
            o.stdout.trim_end()
        ));
    }
    let got = classify(a, &o.probe);
    // Without the module a task gets no GPU whatever the mix says.
    let ask = if a.module {
        o.planned.ask
    } else {
        Ask::Gpus(0)
    };
    let share = o
        .probe
        .env
        .get("MESOS_GPU_SHARE")
        .filter(|v| *v != "(unset)");
    let ok = match ask {
        Ask::Gpus(0) => {
            got.whole.is_empty()
                && got.shared.is_empty()
                && got.mig_parents.is_empty()
                && got.caps.is_empty()
        }
        Ask::Gpus(k) => {
            let as_share = share.is_some_and(|v| *v == format!("{k}/{REPLICAS}"))
                && got.shared.len() == 1
                && got.whole.is_empty();
            let as_whole =
                share.is_none() && got.whole.len() == k as usize && got.shared.is_empty();
            (as_share || as_whole) && got.mig_parents.is_empty() && got.caps.is_empty()
        }
        Ask::Mig(profile) => {
            let device = a.inventory.mig.devices.iter().find(|d| {
                d.caps.as_ref().is_some_and(|c| {
                    let mut want = vec![
                        format!("nvidia-cap{}", c.gpu_instance.minor),
                        format!("nvidia-cap{}", c.compute_instance.minor),
                    ];
                    want.sort();
                    got.caps == want
                })
            });
            device.is_some_and(|d| {
                format!("mig-{}", d.profile_name) == profile && got.mig_parents == [d.parent_minor]
            }) && got.whole.is_empty()
                && got.shared.is_empty()
        }
    };
    (!ok).then(|| {
        format!(
            "asked {} on {} and opened {:?} (share {share:?}); it printed:\n{}",
            o.planned.ask.label(),
            a.role.name(),
            o.probe.opened(),
            o.stdout.trim_end()
        )
    })
}

/// On one agent, every task that opened a node while another task whose life overlaps held it
/// (or a shared GPU over-committed, or a MIG parent opened by a task holding no MIG device).
fn double_bookings(a: &SoakAgent, outcomes: &[&Outcome]) -> Vec<String> {
    let mut found = Vec::new();
    // node -> (start, end, task, units)
    let mut owners: BTreeMap<String, Vec<(f64, f64, &str, u32)>> = BTreeMap::new();
    for o in outcomes {
        let Some((start, end)) = o.life() else {
            continue;
        };
        let got = classify(a, &o.probe);
        let id = o.planned.id.as_str();
        let mut hold = |node: String, units: u32| {
            owners
                .entry(node)
                .or_default()
                .push((start, end, id, units));
        };
        for m in &got.whole {
            hold(format!("nvidia{m}"), REPLICAS);
        }
        for m in &got.shared {
            hold(format!("nvidia{m}"), units(&o.probe));
        }
        for c in &got.caps {
            hold(c.clone(), REPLICAS);
        }
        if !got.mig_parents.is_empty() && !matches!(o.planned.ask, Ask::Mig(_)) {
            found.push(format!(
                "{id} ({}) opened MIG parents {:?}",
                o.planned.ask.label(),
                got.mig_parents
            ));
        }
    }
    for (node, mut lives) in owners {
        lives.sort_by(|x, y| x.0.total_cmp(&y.0));
        for (i, x) in lives.iter().enumerate() {
            // Units held by the tasks alive when `x` started (x included).
            let at_start: u32 = lives[..=i]
                .iter()
                .filter(|y| y.0 <= x.0 && x.0 < y.1)
                .map(|y| y.3)
                .sum();
            if at_start > REPLICAS {
                let with: Vec<&str> = lives[..i]
                    .iter()
                    .filter(|y| x.0 < y.1)
                    .map(|y| y.2)
                    .collect();
                found.push(format!(
                    "{} {node}: {} opened it at {:.2} while {with:?} held it ({at_start} of \
                     {REPLICAS} units)",
                    a.role.name(),
                    x.2,
                    x.0
                ));
            }
        }
    }
    found
}

fn header() -> String {
    format!(
        "{:<24} {:<6} {:>5} {:>4} {:>8} {:>4} {:>7} {:>4} {:>6} {:>7} {:>5} {:>6} {:>4} {:>7} {:>5} {:>4} {:>8} {:>6} {:>4}",
        "sample",
        "agent",
        "ended",
        "live",
        "RSS KiB",
        "fds",
        "dev-ent",
        "bpf",
        "bpf-fd",
        "cgroups",
        "resv",
        "shares",
        "mps",
        "ckpt B",
        "ckpt",
        "MPSd",
        "heap KiB",
        "blocks",
        "tbl"
    )
}

fn row(s: &Sample) -> String {
    let opt = |v: Option<u64>| v.map_or_else(|| "-".to_owned(), |v| v.to_string());
    format!(
        "{:<24} {:<6} {:>5} {:>4} {:>8} {:>4} {:>7} {:>4} {:>6} {:>7} {:>5} {:>6} {:>4} {:>7} {:>5} {:>4} {:>8} {:>6} {:>4}",
        s.label,
        s.agent,
        s.done,
        s.running,
        s.rss_kib,
        s.fds,
        s.device_entries,
        s.bpf_programs,
        s.bpf_fds,
        s.cgroups,
        s.reservations,
        s.shares,
        s.pool_mps,
        s.checkpoint_bytes,
        s.checkpoint_containers,
        s.mps_daemons,
        opt(s.module_heap_kib),
        opt(s.module_heap_blocks),
        opt(s.module_entries)
    )
}

/// How the agents' RSS moved: per agent life (between restarts), from its first sample to its
/// last, per 100 tasks ended; and the step across each restart between the samples around it.
fn rss_lines(samples: &[Sample], restarts: &[Restart]) -> Vec<String> {
    let mut out = Vec::new();
    // The number of tasks ended when each restart happened.
    let cuts: Vec<usize> = restarts.iter().map(|r| r.after - r.live).collect();
    for agent in ["shares", "mig"] {
        let mine: Vec<&Sample> = samples.iter().filter(|x| x.agent == agent).collect();
        if mine.is_empty() {
            continue;
        }
        let life = |x: &Sample| cuts.iter().filter(|&&c| c < x.done).count();
        let mut lives: BTreeMap<usize, Vec<&Sample>> = BTreeMap::new();
        for x in &mine {
            lives.entry(life(x)).or_default().push(x);
        }
        let mut slopes = Vec::new();
        for (n, xs) in &lives {
            let (Some(first), Some(last)) = (xs.first(), xs.last()) else {
                continue;
            };
            if last.done <= first.done {
                continue;
            }
            let per100 = (last.rss_kib as f64 - first.rss_kib as f64) * 100.0
                / (last.done - first.done) as f64;
            slopes.push(per100);
            let heap = match (
                first.module_heap_kib.zip(first.module_heap_blocks),
                last.module_heap_kib.zip(last.module_heap_blocks),
            ) {
                (Some((a, ab)), Some((b, bb))) => {
                    format!("; module heap {a} → {b} KiB, {ab} → {bb} blocks")
                }
                _ => String::new(),
            };
            out.push(format!(
                "agent {agent} life {}: tasks {}-{}: RSS {} → {} KiB ({per100:+.0} KiB per 100 \
                 tasks){heap}",
                n + 1,
                first.done,
                last.done,
                first.rss_kib,
                last.rss_kib
            ));
        }
        for (n, pair) in lives.values().collect::<Vec<_>>().windows(2).enumerate() {
            if let (Some(before), Some(after)) = (pair[0].last(), pair[1].first()) {
                out.push(format!(
                    "agent {agent} restart {}: RSS {} KiB at {} ended (last sample before) → {} \
                     KiB at {} ended (first after)",
                    n + 1,
                    before.rss_kib,
                    before.done,
                    after.rss_kib,
                    after.done
                ));
            }
        }
        if !slopes.is_empty() {
            let mean = slopes.iter().sum::<f64>() / slopes.len() as f64;
            out.push(format!(
                "agent {agent}: mean slope over its lives {mean:+.0} KiB per 100 tasks"
            ));
        }
    }
    out
}

fn report(
    s: &Soak,
    opts: &Options,
    samples: &[Sample],
    outcomes: &BTreeMap<String, Outcome>,
    restarts: &[Restart],
    wave: &[Outcome],
) -> bool {
    let mut ok = true;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "\n## Samples (every {SAMPLE_EVERY} tasks ended, and at each idle point)\n\n```"
    );
    let _ = writeln!(out, "{}", header());
    for x in samples {
        let _ = writeln!(out, "{}", row(x));
    }
    let _ = writeln!(
        out,
        "```\n\ncolumns: live = tasks in flight (both agents); dev-ent = `devices.list` lines of \
         the cgroups under the agent's root (v1); bpf = our device programs attached to the \
         cgroups under that root (v2), bpf-fd = the agent's fds to BPF programs; cgroups = \
         cgroups under that root (all hierarchies); resv/shares/mps = entries of the node's \
         `pool.json`; ckpt B = bytes of the module's checkpoint, ckpt = its containers; MPSd = \
         live MPS control daemons; heap KiB = the module's own heap \
         (`mesos_gpu_module_heap_bytes`), blocks = its live heap blocks, tbl = entries of its tables but MPS daemons \
         (`mesos_gpu_module_entries`), `-` without the module or while the agent restarts"
    );

    let mut by: BTreeMap<(String, String), usize> = BTreeMap::new();
    let mut unplanned = Vec::new();
    let mut asks: BTreeMap<Ask, usize> = BTreeMap::new();
    let mut per_agent: BTreeMap<&str, usize> = BTreeMap::new();
    for o in outcomes.values() {
        let fate = format!("{:?}", o.planned.fate).to_lowercase();
        *by.entry((fate, o.state.clone())).or_default() += 1;
        *asks.entry(o.planned.ask).or_default() += 1;
        if let Some(a) = s.agent_at(o.port) {
            *per_agent.entry(a.role.name()).or_default() += 1;
        }
        let expected = matches!(
            (o.planned.fate, o.state.as_str()),
            (Fate::Exit, "TASK_FINISHED")
                | (Fate::Fail, "TASK_FAILED")
                | (Fate::Kill, "TASK_KILLED")
        );
        if !expected {
            // A command that ended while the agents were down: Mesos's command executor exits
            // once the restarted agent reconnects, and the agent reports the task failed with
            // "Executor terminated" instead of its own end.
            let while_down = o
                .probe
                .end
                .is_some_and(|end| restarts.iter().any(|r| r.down.0 <= end && end <= r.down.1));
            unplanned.push(format!(
                "{} ({}): {} {}{}",
                o.planned.id,
                o.planned.ask.label(),
                o.state,
                o.message,
                if while_down {
                    " (its command had ended while the agents were down)"
                } else {
                    ""
                }
            ));
        }
    }
    let _ = writeln!(out, "\n## Tasks\n");
    let _ = writeln!(
        out,
        "- asked: {}",
        asks.iter()
            .map(|(a, n)| format!("{} {n}", a.label()))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let _ = writeln!(out, "- ran on: {per_agent:?}");
    for ((fate, state), n) in &by {
        let _ = writeln!(out, "- planned to {fate}, ended {state}: {n}");
    }
    let shares = outcomes
        .values()
        .filter(|o| {
            o.probe
                .env
                .get("MESOS_GPU_SHARE")
                .is_some_and(|v| v != "(unset)")
        })
        .count();
    let _ = writeln!(out, "- tasks that held a share of GPU 10 or 11: {shares}");
    let _ = writeln!(
        out,
        "- agent SIGKILL + restart (both agents): {}",
        restarts.len()
    );
    for r in restarts {
        let _ = writeln!(
            out,
            "  - after ~{} tasks, {} in flight (all running); both re-registered in {:.1?}",
            r.after, r.live, r.took
        );
    }
    let _ = writeln!(
        out,
        "- tasks that did not end as planned: {}",
        unplanned.len()
    );
    for r in unplanned.iter().take(40) {
        let _ = writeln!(out, "  - {r}");
    }

    let _ = writeln!(out, "\n## Checks\n");
    let mut doubles = Vec::new();
    let mut wrong = Vec::new();
    for a in &s.agents {
        let mine: Vec<&Outcome> = outcomes
            .values()
            .chain(wave.iter())
            .filter(|o| o.port == a.agent.port())
            .collect();
        doubles.extend(double_bookings(a, &mine));
        wrong.extend(
            mine.iter()
                .filter_map(|o| wrong_grant(a, o).map(|w| format!("{}: {w}", o.planned.id))),
        );
    }
    let unprobed = outcomes
        .values()
        .filter(|o| o.running.is_some() && !o.probe.probed)
        .count();
    let _ = writeln!(
        out,
        "- double-bookings (a node open to two tasks at once): {}",
        doubles.len()
    );
    for d in doubles.iter().take(20) {
        let _ = writeln!(out, "  - {d}");
    }
    let _ = writeln!(out, "- grants that differ from the ask: {}", wrong.len());
    for w in wrong.iter().take(20) {
        let _ = writeln!(out, "  - {w}");
    }
    let _ = writeln!(
        out,
        "- tasks that ran but ended before their first probes completed: {unprobed}"
    );
    ok &= doubles.is_empty() && wrong.is_empty();

    let wave_ok = wave.iter().all(|o| o.state == "TASK_FINISHED");
    let latest_start = wave
        .iter()
        .filter_map(|o| o.probe.start)
        .fold(f64::MIN, f64::max);
    let earliest_end = wave
        .iter()
        .filter_map(|o| o.probe.end)
        .fold(f64::MAX, f64::min);
    let together = latest_start < earliest_end;
    let failed: Vec<String> = wave
        .iter()
        .filter(|o| o.state != "TASK_FINISHED")
        .map(|o| format!("{} {} {}", o.planned.ask.label(), o.state, o.message))
        .collect();
    if opts.without_module {
        let _ = writeln!(out, "- GPUs lost: not checked (no GPU without the module)");
    } else {
        let _ = writeln!(
            out,
            "- GPUs lost: {} (a final wave of {} tasks asking for every whole GPU, share unit and \
             MIG device of both nodes: {}; all running at once: {together})",
            if wave_ok && together { "0" } else { "some" },
            wave.len(),
            if wave_ok {
                "all TASK_FINISHED".to_owned()
            } else {
                failed.join("; ")
            }
        );
        ok &= wave_ok && together;
    }

    let mut flat = Vec::new();
    let mut idle_points = 0;
    for a in &s.agents {
        let name = a.role.name();
        let mine: Vec<&Sample> = samples.iter().filter(|x| x.agent == name).collect();
        let Some(base) = mine.first() else { continue };
        for x in mine.iter().filter(|x| x.idle).skip(1) {
            idle_points += 1;
            let mut bad = Vec::new();
            if x.device_entries != base.device_entries {
                bad.push(format!(
                    "devices entries {} (baseline {})",
                    x.device_entries, base.device_entries
                ));
            }
            if x.cgroups != base.cgroups {
                bad.push(format!("cgroups {} (baseline {})", x.cgroups, base.cgroups));
            }
            if x.bpf_programs != base.bpf_programs || x.bpf_fds != base.bpf_fds {
                bad.push(format!(
                    "BPF programs {} attached, {} fds (baseline {}, {})",
                    x.bpf_programs, x.bpf_fds, base.bpf_programs, base.bpf_fds
                ));
            }
            if x.module_entries.is_some_and(|n| n != 0) || (a.module && x.module_entries.is_none())
            {
                bad.push(format!(
                    "module tables hold {:?} entries (expected 0)",
                    x.module_entries
                ));
            }
            if x.reservations + x.shares != 0 || x.checkpoint_containers != 0 {
                bad.push(format!(
                    "pool {} reservations {} shares, checkpoint {} containers",
                    x.reservations, x.shares, x.checkpoint_containers
                ));
            }
            if x.fds.abs_diff(base.fds) > 8 {
                bad.push(format!("fds {} (baseline {})", x.fds, base.fds));
            }
            if x.mps_daemons > SHARED.len() || x.pool_mps > SHARED.len() {
                bad.push(format!(
                    "{} MPS daemons ({} in the pool)",
                    x.mps_daemons, x.pool_mps
                ));
            }
            if !bad.is_empty() {
                flat.push(format!("{name} {}: {}", x.label, bad.join(", ")));
            }
        }
        let rss: Vec<String> = mine
            .iter()
            .filter(|x| x.idle)
            .map(|x| format!("{}", x.rss_kib))
            .collect();
        let _ = writeln!(
            out,
            "- agent {name} RSS (KiB) at baseline and each idle point: {} (it restarts half-way \
             through each segment)",
            rss.join(", ")
        );
        if a.module {
            let heap: Vec<String> = mine
                .iter()
                .filter(|x| x.idle)
                .map(|x| match x.module_heap_kib.zip(x.module_heap_blocks) {
                    Some((kib, blocks)) => format!("{kib} ({blocks})"),
                    None => "-".to_owned(),
                })
                .collect();
            let _ = writeln!(
                out,
                "- agent {name} module heap KiB (blocks) at baseline and each idle point: {}",
                heap.join(", ")
            );
        }
    }
    let _ = writeln!(out, "\n## Agent RSS\n");
    for line in rss_lines(samples, restarts) {
        let _ = writeln!(out, "- {line}");
    }
    let _ = writeln!(
        out,
        "- resources not back to their baseline at an idle point: {} (of {idle_points} idle \
         points, both agents)",
        flat.len()
    );
    for f in &flat {
        let _ = writeln!(out, "  - {f}");
    }
    ok &= flat.is_empty();
    print!("{out}");
    if let Some(path) = &opts.svg {
        match std::fs::write(path, svg(samples)) {
            Ok(()) => println!("plot: {}", path.display()),
            Err(e) => {
                println!("plot: cannot write {}: {e}", path.display());
                ok = false;
            }
        }
    }
    ok
}

/// A small line plot of the samples: one panel per resource, tasks ended on x.
fn svg(samples: &[Sample]) -> String {
    type Get = fn(&Sample) -> f64;
    let series: [(&str, Get); 10] = [
        ("agent RSS (MiB)", |s| s.rss_kib as f64 / 1024.0),
        ("module heap (KiB)", |s| {
            s.module_heap_kib.unwrap_or(0) as f64
        }),
        ("agent open fds", |s| s.fds as f64),
        ("module table entries", |s| {
            s.module_entries.unwrap_or(0) as f64
        }),
        ("devices.list entries (v1)", |s| s.device_entries as f64),
        ("BPF programs attached (v2)", |s| s.bpf_programs as f64),
        ("cgroups under the root", |s| s.cgroups as f64),
        ("pool entries", |s| (s.reservations + s.shares) as f64),
        ("checkpoint (KiB)", |s| s.checkpoint_bytes as f64 / 1024.0),
        ("tasks in flight", |s| s.running as f64),
    ];
    let (w, h, cols) = (300.0, 150.0, 2);
    let rows = series.len().div_ceil(cols);
    let max_x = samples.iter().map(|s| s.done).max().unwrap_or(1).max(1) as f64;
    let mut out = format!(
        "<!-- agent_soak: blue = shares agent, green = mig agent, red dots = idle points -->\n<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" font-family=\"sans-serif\" font-size=\"11\">\n",
        w * cols as f64 + 20.0,
        h * rows as f64 + 20.0
    );
    for (i, (name, get)) in series.iter().enumerate() {
        let (ox, oy) = (10.0 + w * (i % cols) as f64, 10.0 + h * (i / cols) as f64);
        let max_y = samples.iter().map(get).fold(1.0, f64::max) * 1.1;
        let (pw, ph) = (w - 60.0, h - 45.0);
        let _ = writeln!(
            out,
            "<g transform=\"translate({ox},{oy})\"><text x=\"40\" y=\"12\">{name}</text>\
             <rect x=\"40\" y=\"20\" width=\"{pw}\" height=\"{ph}\" fill=\"none\" stroke=\"#999\"/>\
             <text x=\"36\" y=\"26\" text-anchor=\"end\">{max_y:.0}</text>\
             <text x=\"36\" y=\"{}\" text-anchor=\"end\">0</text>\
             <text x=\"{}\" y=\"{}\" text-anchor=\"end\">{max_x:.0} tasks</text>",
            20.0 + ph,
            40.0 + pw,
            ph + 34.0
        );
        for (agent, colour) in [("shares", "#1f77b4"), ("mig", "#2ca02c")] {
            let points: Vec<String> = samples
                .iter()
                .filter(|s| s.agent == agent)
                .map(|s| {
                    format!(
                        "{:.1},{:.1}",
                        40.0 + pw * s.done as f64 / max_x,
                        20.0 + ph - ph * get(s) / max_y
                    )
                })
                .collect();
            let _ = writeln!(
                out,
                "<polyline fill=\"none\" stroke=\"{colour}\" stroke-width=\"1.5\" points=\"{}\"/>",
                points.join(" ")
            );
        }
        for s in samples.iter().filter(|s| s.idle) {
            let _ = writeln!(
                out,
                "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"2.5\" fill=\"#d62728\"/>",
                40.0 + pw * s.done as f64 / max_x,
                20.0 + ph - ph * get(s) / max_y
            );
        }
        out.push_str("</g>\n");
    }
    out.push_str("</svg>\n");
    out
}
