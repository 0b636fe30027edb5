//! Mesos's own `gpu/nvidia` isolator beside the module, in the same run, on the same simulated
//! node, through the same real master and framework: the measured rows behind the README's
//! comparison table (`docs/benchmarks/gpu-nvidia-vs-module.md`).
//!
//! Two real agents register with one master, each on its own copy of nvml-sim's `dgx1-v100`
//! (8 V100s, minors 0-7, NVLink hybrid cube-mesh), cgroup v1:
//! - **gpu/nvidia**: `--isolation=filesystem/linux,cgroups/devices,gpu/nvidia
//!   --resources=gpus:8 --nvidia_gpu_devices=0,…,7`, as Mesos's GPU guide has it;
//! - **module**: `--isolation=filesystem/linux,cgroups/devices,<module>` with the module's
//!   defaults (`policy=topology`, `dev_root=/dev`, `nvml_lib=libnvidia-ml.so.1`).
//!
//! Both find everything where a driver install puts it, because `gpu/nvidia` cannot be pointed
//! elsewhere: each agent runs in a private mount namespace ([`PrivateHost`]) whose `/dev` holds
//! mknod'ed `nvidia0`-`nvidia7`, `nvidiactl`, `nvidia-uvm`, `nvidia-uvm-tools` (opening one
//! gives ENXIO when the device cgroup allows it, EPERM when it denies it), whose
//! `/etc/ld.so.cache` names nvml-sim as `libnvidia-ml.so.1` (Mesos `dlopen`s it and copies what
//! the cache names into its driver volume), and whose `/run` is a tmpfs (the volume goes to
//! `/var/run/mesos/isolators/gpu/nvidia_<version>` there). Nothing is made on the host: the
//! namespaces go away with their last process, which the agents' guards kill.
//!
//! Tasks go through one pymesos framework (`testkit/python/gpu_framework.py`) to one agent or
//! the other; each runs the static probe on `/dev`. Sections:
//! 1. launch latency, the framework's ACCEPT to its TASK_RUNNING update, for `gpus:0/1/2/4`,
//!    `--reps` tasks of each size on each agent (`--reps 50` for the p50's bootstrap confidence
//!    interval to mean something), the two agents' tasks launched together, with the module's
//!    own time per call from its `served call` log lines (issue 36); then, module only (no
//!    `gpu/nvidia` equivalent), `--reps` tasks holding a quarter of a GPU shared 4 ways
//!    (`gpu_replicas=4`) and `--reps` holding a `mig-1g.5gb` MIG device (nvml-sim's
//!    `dgx-a100-mixed`, `mig_strategy=mixed`), each on an agent of its own and each launched
//!    together with a `gpus:1` task on `gpu/nvidia`, the baseline beside it;
//! 2. what a task could open, and which GPUs it got;
//! 3. a stream of requests (seeded; sizes 1, 2, 4; each held until a later step) run in
//!    lockstep on both agents: NVIDIA's pair score of each grant (`docs/allocator.md`), against
//!    the best score any set of that size had on the agent's free GPUs at that moment;
//! 4. agent SIGKILL + restart with tasks running: a checkpointed task keeps running, a task of a
//!    framework that does not checkpoint becomes an orphan, and a `gpus:6` task is launched
//!    as soon as the agent re-registered;
//! 5. a Docker-containerizer task with `gpus:1` (agents with `--containerizers=docker,mesos`).
//!
//! Run: `cargo bench -p mesos-gpu-ffi --bench gpu_nvidia_vs_module -- [--reps N] [--seed S]
//! [--only latency|stream|restart|docker]`
//! (root, cgroup v1, dockerd, the Mesos in `../shared/mesos`, pymesos; the Docker section also
//! needs `cargo build -p mesos-gpu` for the module's Docker wrapper).

#[path = "../tests/support/mod.rs"]
mod support;

#[path = "../tests/agents/mod.rs"]
mod agents;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use agents::{TaskProbe, mesos_gpu_exe, module, probe, which};
use mesos_gpu_isolator::agent_flags::{MigOffer, MigStrategy};
use mesos_gpu_node::inventory::Inventory;
use mesos_gpu_placement::allocator::{Allocator, GpuSet, Policy};
use mesos_gpu_testkit::mesos::framework::{Framework, FrameworkSpec, check_pymesos};
use mesos_gpu_testkit::mesos::{
    Agent, AgentCgroups, AgentSpec, DOCKER_HOOK_MODULE, DevNode, DevNodes, ISOLATOR_MODULE, Master,
    MesosInstall, PrivateHost, add_docker_hook, http_get, modules_json, tail,
};
use mesos_gpu_testkit::nvml_sim::{SimNode, mknod_mig_caps};
use support::{TestResult, check};

const NODE: &str = "dgx1-v100";
/// The MIG node of the module-only MIG row: GPUs 0-3 whole, 4-7 split 3g+2g+1g+1g.
const MIG_NODE: &str = "dgx-a100-mixed";
const MINORS: [u32; 8] = [0, 1, 2, 3, 4, 5, 6, 7];
const CONTROL: [&str; 3] = ["nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"];
const TIMEOUT: Duration = Duration::from_secs(120);

fn main() -> ExitCode {
    let mut reps = 15usize;
    let mut seed = 27u64;
    let mut only: Option<String> = None;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--reps" => reps = args.next().and_then(|v| v.parse().ok()).unwrap_or(reps),
            "--seed" => seed = args.next().and_then(|v| v.parse().ok()).unwrap_or(seed),
            "--only" => only = args.next(),
            "--bench" => {}
            other => {
                eprintln!(
                    "gpu_nvidia_vs_module: unknown argument {other:?}: expected --reps N, --seed S, --only latency|stream|restart|docker"
                );
                return ExitCode::from(2);
            }
        }
    }
    if let Err(why) = MesosInstall::locate()
        .and_then(|m| m.check_runs())
        .and_then(|()| check_pymesos())
    {
        eprintln!("gpu_nvidia_vs_module: cannot run here: {why}");
        return ExitCode::SUCCESS;
    }
    match run(reps, seed, only.as_deref()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gpu_nvidia_vs_module: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The summary table: one row per measured aspect, `[aspect, gpu/nvidia, module]`.
type Summary = Vec<[String; 3]>;

/// Which isolator an agent runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    GpuNvidia,
    Module,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::GpuNvidia => "gpu/nvidia",
            Kind::Module => "module",
        }
    }
}

/// How a module-only agent of the latency section holds its GPUs (issue 36). `gpu/nvidia` has
/// neither: it gives whole GPUs only and knows no MIG device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Extra {
    /// `gpu_replicas=4` on `dgx1-v100` (offered as `gpus:32`, time-slicing): a `gpus:1` task
    /// gets a quarter of one GPU.
    Share,
    /// `mig_strategy=mixed` on `dgx-a100-mixed` (GPUs 0-3 whole, 4-7 split 3g+2g+1g+1g): a task
    /// asks for `mig-1g.5gb:1`.
    Mig,
}

impl Extra {
    fn name(self) -> &'static str {
        match self {
            Extra::Share => "share",
            Extra::Mig => "mig",
        }
    }

    /// What the row is, for the tables.
    fn label(self) -> &'static str {
        match self {
            Extra::Share => "share: `gpus:1` of a GPU shared 4 ways",
            Extra::Mig => "MIG: `mig-1g.5gb:1`",
        }
    }

    fn node(self) -> &'static str {
        match self {
            Extra::Share => NODE,
            Extra::Mig => MIG_NODE,
        }
    }

    /// The task's `ContainerInfo`: a MIG task runs without CAP_SYS_ADMIN, which would grant
    /// every MIG capability whatever its device files (the module refuses it MIG devices).
    fn container(self) -> Option<serde_json::Value> {
        match self {
            Extra::Share => None,
            Extra::Mig => Some(serde_json::json!({
                "type": "MESOS",
                "linux_info": {
                    "effective_capabilities": { "capabilities": ["CHOWN", "DAC_OVERRIDE"] }
                }
            })),
        }
    }

    /// The task's GPU resource.
    fn ask(self) -> (&'static str, f64) {
        match self {
            Extra::Share => ("gpus", 1.0),
            Extra::Mig => ("mig-1g.5gb", 1.0),
        }
    }
}

/// One agent of the comparison with its node.
struct Side {
    kind: Kind,
    /// A module-only configuration (`kind` is then [`Kind::Module`]).
    extra: Option<Extra>,
    agent: Agent,
    sim: SimNode,
    _host: PrivateHost,
    /// Device nodes outside the agent's private `/dev`: for the module's Docker wrapper
    /// (dockerd resolves `--device` paths in its own mount namespace, not the agent's), and for
    /// a MIG node's module (`dev_root`: the private `/dev` has no `nvidia-caps`).
    _dev_nodes: Option<DevNodes>,
    scratch: tempfile::TempDir,
}

impl Side {
    /// Starts an agent of `kind` on its own copy of the node; `docker` adds the Docker
    /// containerizer (and, for the module, its hook and `--docker` wrapper).
    fn start(
        install: &MesosInstall,
        master: &Master,
        kind: Kind,
        docker: bool,
    ) -> TestResult<Side> {
        Side::start_with(install, master, kind, None, docker)
    }

    /// Starts a module agent configured as `extra` (no Docker).
    fn start_extra(install: &MesosInstall, master: &Master, extra: Extra) -> TestResult<Side> {
        Side::start_with(install, master, Kind::Module, Some(extra), false)
    }

    fn start_with(
        install: &MesosInstall,
        master: &Master,
        kind: Kind,
        extra: Option<Extra>,
        docker: bool,
    ) -> TestResult<Side> {
        let sim = SimNode::shipped(extra.map_or(NODE, Extra::node));
        let inventory = sim.inventory()?;
        let minors: Vec<u32> = inventory.gpus.iter().map(|g| g.minor).collect();
        let host = PrivateHost::new(&DevNode::nvidia(&minors), &[sim.dir()])?;
        let scratch = tempfile::Builder::new().prefix("mgpu-vs").tempdir()?;
        let isolation = match kind {
            Kind::GpuNvidia => "filesystem/linux,cgroups/devices,gpu/nvidia".to_owned(),
            Kind::Module => format!("filesystem/linux,cgroups/devices,{ISOLATOR_MODULE}"),
        };
        let mut spec = AgentSpec::new(&isolation, AgentCgroups::V1, 8);
        spec.private_host = Some(host.setup_script());
        let dev_nodes = if (docker && kind == Kind::Module) || extra == Some(Extra::Mig) {
            let dev = DevNodes::nvidia(&minors)?;
            mknod_mig_caps(dev.path(), &inventory)?;
            Some(dev)
        } else {
            None
        };
        match kind {
            Kind::GpuNvidia => spec
                .flags
                .push("--nvidia_gpu_devices=0,1,2,3,4,5,6,7".into()),
            Kind::Module => {
                let mut params: Vec<(String, String)> = vec![
                    (
                        "work_dir".into(),
                        scratch.path().join("module-work").display().to_string(),
                    ),
                    (
                        "pool_dir".into(),
                        scratch.path().join("pool").display().to_string(),
                    ),
                    ("proc_root".into(), sim.proc_root().display().to_string()),
                    ("driver_volume".into(), "off".into()),
                ];
                match extra {
                    None => {}
                    Some(Extra::Share) => {
                        params.push(("gpu_replicas".into(), "4".into()));
                        spec.resources = format!("cpus:4;mem:4096;gpus:{}", 4 * minors.len());
                    }
                    Some(Extra::Mig) => {
                        let dev = dev_nodes.as_ref().ok_or("no device nodes for MIG")?;
                        params.extend([
                            ("dev_root".into(), dev.path().display().to_string()),
                            ("mig_strategy".into(), "mixed".into()),
                        ]);
                        // Its tasks run without CAP_SYS_ADMIN ([`Extra::container`]).
                        spec.isolation = format!(
                            "filesystem/linux,linux/capabilities,cgroups/devices,{ISOLATOR_MODULE}"
                        );
                        let offer = MigOffer::of(&inventory, MigStrategy::Mixed);
                        spec.resources = format!("cpus:4;mem:4096;{}", offer.resources().join(";"));
                    }
                }
                let mut json = modules_json(&module()?, &params);
                if docker {
                    let dev = dev_nodes.as_ref().ok_or("no device nodes for Docker")?;
                    let docker_args = docker_wrapper(&scratch, &sim, dev.path(), &mut spec)?;
                    add_docker_hook(&mut json, &docker_args)
                        .ok_or("modules.json has no modules")?;
                    spec.flags.push(format!("--hooks={DOCKER_HOOK_MODULE}"));
                }
                let modules = scratch.path().join("modules.json");
                std::fs::write(&modules, json.to_string())?;
                spec.modules = Some(modules);
            }
        }
        if docker {
            spec.flags.extend([
                "--containerizers=docker,mesos".to_owned(),
                "--docker_remove_delay=1secs".to_owned(),
                // Other agents share the machine's dockerd: leave their containers alone.
                "--docker_kill_orphans=false".to_owned(),
            ]);
        }
        let agent = Agent::start(install, master, spec)?;
        Ok(Side {
            kind,
            extra,
            agent,
            sim,
            _host: host,
            _dev_nodes: dev_nodes,
            scratch,
        })
    }

    fn port(&self) -> u16 {
        self.agent.port()
    }
}

/// The module's Docker wrapper (`mesos-gpu docker-wrapper`) as the agent's `--docker`, and the
/// hook's `docker_args` command line, on this node's pool, with the device nodes in `dev`.
fn docker_wrapper(
    scratch: &tempfile::TempDir,
    sim: &SimNode,
    dev: &Path,
    spec: &mut AgentSpec,
) -> TestResult<String> {
    let exe = mesos_gpu_exe()?;
    let s = scratch.path();
    let global = format!(
        "{} --nvml-lib {} --dev-root {}",
        exe.display(),
        sim.lib_path().display(),
        dev.display()
    );
    let (pool, work, volumes) = (s.join("pool"), s.join("docker-work"), s.join("volumes"));
    std::fs::create_dir_all(&volumes)?;
    let docker_args = format!(
        "{global} docker-args --pool-dir {} --work-dir {} --volume-root {}",
        pool.display(),
        work.display(),
        volumes.display()
    );
    let wrapper = s.join("mesos-gpu-docker");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\nexec {global} docker-wrapper --docker {} --pool-dir {} --work-dir {} -- \"$@\"\n",
            which("docker")?.display(),
            pool.display(),
            work.display()
        ),
    )?;
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755))?;
    spec.flags.push(format!("--docker={}", wrapper.display()));
    Ok(docker_args)
}

/// A task that probes `/dev` and, with `hold`, waits until `<go>` exists (printing
/// `alive <uptime>` every 50 ms while it waits when `heartbeat`).
fn command(probe: &Path, hold: Option<&Path>, heartbeat: bool) -> String {
    let mut cmd = format!(
        "up() {{ cut -d' ' -f1 /proc/uptime; }}; echo start $(up); {} /dev",
        probe.display()
    );
    if let Some(go) = hold {
        let beat = if heartbeat { "echo alive $(up); " } else { "" };
        let _ = write!(
            cmd,
            "; while [ ! -e {} ]; do {beat}sleep 0.05; done; echo phase end; {} /dev",
            go.display(),
            probe.display()
        );
    }
    cmd.push_str("; echo end $(up)");
    cmd
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    // The nearest-rank percentile: the smallest value with at least p % of values at or below.
    let below = |i: usize| (i as f64) < p / 100.0 * sorted.len() as f64;
    let rank = (1..=sorted.len())
        .find(|&i| !below(i))
        .unwrap_or(sorted.len());
    sorted[rank - 1]
}

/// The 95 % bootstrap confidence interval of the median of `sorted` (1,000 resamples, seeded).
fn bootstrap_p50(sorted: &[f64], seed: u64) -> (f64, f64) {
    if sorted.is_empty() {
        return (f64::NAN, f64::NAN);
    }
    // xorshift64*: reproducible, and good enough to pick resample indices.
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut next = |n: usize| {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        let r = x.wrapping_mul(0x2545_F491_4F6C_DD1D);
        usize::try_from(r % n as u64).unwrap_or(0)
    };
    let mut medians: Vec<f64> = (0..1000)
        .map(|_| {
            let mut sample: Vec<f64> = (0..sorted.len())
                .map(|_| sorted[next(sorted.len())])
                .collect();
            sample.sort_by(f64::total_cmp);
            percentile(&sample, 50.0)
        })
        .collect();
    medians.sort_by(f64::total_cmp);
    (percentile(&medians, 2.5), percentile(&medians, 97.5))
}

/// One call's time from a module's `served call` log line, and the part of it spent in its
/// durable writes (`pool_write` and `ckpt_write` steps), both in milliseconds.
#[derive(Debug, Clone, Copy)]
struct Served {
    ms: f64,
    durable_ms: f64,
}

/// The module's `served call` log lines in an agent's log, by call name.
fn served_calls(log: &str) -> BTreeMap<String, Vec<Served>> {
    let mut calls: BTreeMap<String, Vec<Served>> = BTreeMap::new();
    for line in log.lines().filter(|l| l.contains("served call")) {
        let field = |name: &str| {
            line.split_whitespace()
                .find_map(|t| t.strip_prefix(name))
                .map(|v| v.trim_matches('"').to_owned())
        };
        // `steps=pool_lock=48 pool_write=829 ckpt_write=806x2 …`: µs, `xN` for N spans.
        let durable_us: f64 = line
            .split_whitespace()
            .map(|t| t.strip_prefix("steps=").unwrap_or(t))
            .filter_map(|t| {
                t.strip_prefix("pool_write=")
                    .or_else(|| t.strip_prefix("ckpt_write="))
            })
            .filter_map(|v| v.split('x').next()?.parse::<f64>().ok())
            .fold(0.0, |a, b| a + b);
        if let (Some(call), Some(us)) = (field("call="), field("us="))
            && let Ok(us) = us.parse::<f64>()
        {
            calls.entry(call).or_default().push(Served {
                ms: us / 1000.0,
                durable_ms: durable_us / 1000.0,
            });
        }
    }
    calls
}

fn run(reps: usize, seed: u64, only: Option<&str>) -> TestResult {
    let wanted = |section: &str| only.is_none_or(|o| o == section);
    let started = Instant::now();
    let install = MesosInstall::locate()?;
    let master = Master::start(&install)?;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# Mesos's `gpu/nvidia` beside the module\n\n\
         Measured by `cargo bench -p mesos-gpu-ffi --bench gpu_nvidia_vs_module -- --reps {reps} --seed {seed}`: \
         two real agents (Mesos 1.12, cgroup v1) under one master, each on its own nvml-sim \
         `dgx1-v100` (8 V100s), in a private mount namespace with `/dev/nvidia*`, \
         `/etc/ld.so.cache` and `/run` of its own; tasks from one pymesos framework run a probe \
         that opens every `/dev/nvidia*` node (ENXIO: the device cgroup allows it; EPERM: it \
         denies it). Machine: 2-core VM shared with other builds; latencies are comparable only \
         within this run."
    );
    let probe = probe()?;
    let mut summary = Summary::new();
    let sides = [
        Side::start(&install, &master, Kind::GpuNvidia, false)?,
        Side::start(&install, &master, Kind::Module, false)?,
    ];
    let mut fw = Framework::start(&master, &FrameworkSpec::gpu("gpu-nvidia-vs-module"))?;
    let inventory = sides[1].sim.inventory()?;

    if wanted("latency") {
        let extras = [
            Side::start_extra(&install, &master, Extra::Share)?,
            Side::start_extra(&install, &master, Extra::Mig)?,
        ];
        latency_and_matrix(
            &mut out,
            &mut summary,
            &mut fw,
            &sides,
            &extras,
            &probe,
            reps,
        )?;
    }
    println!("{out}");
    if wanted("stream") {
        let mut part = String::new();
        stream(
            &mut part,
            &mut summary,
            &mut fw,
            &sides,
            &probe,
            &inventory,
            seed,
        )?;
        println!("{part}");
        out.push_str(&part);
    }
    drop(fw);
    let mut sides = sides;
    if wanted("restart") {
        let mut part = String::new();
        restart(&mut part, &mut summary, &master, &mut sides, &probe)?;
        println!("{part}");
        out.push_str(&part);
    }
    drop(sides);
    if wanted("docker") {
        let mut part = String::new();
        docker(&mut part, &mut summary, &install, &master, &probe)?;
        println!("{part}");
        out.push_str(&part);
    }
    let _ = writeln!(out, "\nWhole run: {:.0?}.", started.elapsed());
    let mut table = String::from(
        "\n## Summary (every cell measured in this run; details below)\n\n\
         | | Mesos `gpu/nvidia` | module |\n|---|---|---|\n",
    );
    for [aspect, mesos, module] in &summary {
        let _ = writeln!(table, "| {aspect} | {mesos} | {module} |");
    }
    let at = out
        .find("\n## 1.")
        .or_else(|| out.find("\n## "))
        .unwrap_or(out.len());
    out.insert_str(at, &table);
    println!("\n----- the whole report -----\n{out}");
    Ok(())
}

/// The outcome of every node for one task, in a fixed order: GPUs, then control nodes.
fn matrix_row(probe: &TaskProbe) -> String {
    let mut cells = Vec::new();
    for m in MINORS {
        let o = probe
            .opened_at_start
            .get(&format!("nvidia{m}"))
            .map_or("-", String::as_str);
        cells.push(short(o));
    }
    for c in CONTROL {
        cells.push(short(
            probe.opened_at_start.get(c).map_or("-", String::as_str),
        ));
    }
    cells.join(" | ")
}

fn short(outcome: &str) -> &str {
    match outcome {
        "ENXIO" => "open",
        "EPERM" => "EPERM",
        other => other,
    }
}

fn sandbox_probe(side: &Side, id: &str) -> TaskProbe {
    side.agent
        .sandbox(id)
        .map(|d| TaskProbe::parse(&std::fs::read_to_string(d.join("stdout")).unwrap_or_default()))
        .unwrap_or_default()
}

fn latency_and_matrix(
    out: &mut String,
    summary: &mut Summary,
    fw: &mut Framework,
    sides: &[Side; 2],
    extras: &[Side],
    probe: &Path,
    reps: usize,
) -> TestResult {
    let mut latency: BTreeMap<(Kind, u32), Vec<f64>> = BTreeMap::new();
    let mut first: BTreeMap<(Kind, u32), TaskProbe> = BTreeMap::new();
    let mut got: BTreeMap<(Kind, u32), BTreeMap<Vec<u32>, usize>> = BTreeMap::new();
    for gpus in [0u32, 1, 2, 4] {
        for rep in 0..reps {
            let mut ids = Vec::new();
            for side in sides {
                let id = format!("lat-{}-{gpus}-{rep}", side.kind.name().replace('/', "-"));
                fw.launch(
                    &id,
                    &[("cpus", 0.1), ("mem", 32.0), ("gpus", f64::from(gpus))],
                    &command(probe, None, false),
                    Some(side.port()),
                )?;
                ids.push((side, id));
            }
            for (side, id) in ids {
                let running = fw.wait_state(&id, "TASK_RUNNING", TIMEOUT)?;
                let accepted = fw.first("accept", &id).ok_or("no accept event")?;
                fw.wait_terminal(&id, TIMEOUT)?;
                latency
                    .entry((side.kind, gpus))
                    .or_default()
                    .push(running.t - accepted.t);
                let p = sandbox_probe(side, &id);
                *got.entry((side.kind, gpus))
                    .or_default()
                    .entry(p.gpus())
                    .or_default() += 1;
                first.entry((side.kind, gpus)).or_insert(p);
            }
        }
    }
    let _ = writeln!(
        out,
        "\n## 1. Launch latency (framework's ACCEPT → its TASK_RUNNING update)\n\n\
         {reps} tasks per size and isolator; the two agents' tasks were launched together. \
         The p50's 95 % confidence interval is a bootstrap's (1,000 resamples).\n\n\
         | gpus | gpu/nvidia p50 | 95 % CI | p95 | p99 | module p50 | 95 % CI | p95 | p99 |\n\
         |---|---|---|---|---|---|---|---|---|"
    );
    for gpus in [0u32, 1, 2, 4] {
        let mut cells = Vec::new();
        for kind in [Kind::GpuNvidia, Kind::Module] {
            let mut v = latency.get(&(kind, gpus)).cloned().unwrap_or_default();
            v.sort_by(f64::total_cmp);
            cells.push(latency_cells(&v, u64::from(gpus) + 1));
        }
        let _ = writeln!(
            out,
            "| {gpus} | {} | {} |",
            cells[0].join(" | "),
            cells[1].join(" | ")
        );
        summary.push([
            format!("launch latency `gpus:{gpus}`, p50 / p99 ({reps} tasks)"),
            format!("{} / {}", cells[0][0], cells[0][3]),
            format!("{} / {}", cells[1][0], cells[1][3]),
        ]);
    }
    module_only(out, summary, fw, sides, extras, probe, reps)?;
    served_table(out, sides.iter().chain(extras));
    let _ = writeln!(
        out,
        "\n## 2. What a task could open, and which GPUs it got\n\n\
         The first task of each size (the node free); `open` = ENXIO (the device cgroup allows \
         it), EPERM = denied.\n\n\
         | isolator | gpus | nvidia0 | 1 | 2 | 3 | 4 | 5 | 6 | 7 | nvidiactl | nvidia-uvm | nvidia-uvm-tools |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|---|"
    );
    for gpus in [0u32, 1, 2, 4] {
        for kind in [Kind::GpuNvidia, Kind::Module] {
            if let Some(p) = first.get(&(kind, gpus)) {
                let _ = writeln!(out, "| {} | {gpus} | {} |", kind.name(), matrix_row(p));
            }
        }
    }
    let opens = |kind: Kind, gpus: u32| -> String {
        let Some(p) = first.get(&(kind, gpus)) else {
            return "-".into();
        };
        let nodes = p.opened();
        if nodes.is_empty() {
            "nothing".into()
        } else {
            nodes.join(", ")
        }
    };
    summary.push([
        "a `gpus:0` task can open".into(),
        opens(Kind::GpuNvidia, 0),
        opens(Kind::Module, 0),
    ]);
    let pair = |kind: Kind| -> String {
        first
            .get(&(kind, 2))
            .map_or("-".into(), |p| format!("GPUs {:?}", p.gpus()))
    };
    summary.push([
        "a `gpus:2` task on the free node gets (every other GPU: EPERM)".into(),
        pair(Kind::GpuNvidia),
        pair(Kind::Module),
    ]);
    let _ = writeln!(
        out,
        "\nGPUs granted over all {reps} tasks of each size (set: tasks):\n"
    );
    for gpus in [1u32, 2, 4] {
        for kind in [Kind::GpuNvidia, Kind::Module] {
            let sets: Vec<String> = got
                .get(&(kind, gpus))
                .map(|m| m.iter().map(|(s, n)| format!("{s:?}: {n}")).collect())
                .unwrap_or_default();
            let _ = writeln!(out, "- {} gpus:{gpus}: {}", kind.name(), sets.join(", "));
        }
    }
    Ok(())
}

/// Launch latency of the module-only configurations ([`Extra`]): per rep, one task on the
/// module agent of that configuration and one `gpus:1` task on `gpu/nvidia`, launched
/// together, so each row has a baseline measured beside it.
fn module_only(
    out: &mut String,
    summary: &mut Summary,
    fw: &mut Framework,
    sides: &[Side; 2],
    extras: &[Side],
    probe: &Path,
    reps: usize,
) -> TestResult {
    let baseline = sides
        .iter()
        .find(|s| s.kind == Kind::GpuNvidia)
        .ok_or("no gpu/nvidia agent")?;
    let mut latency: BTreeMap<(Extra, bool), Vec<f64>> = BTreeMap::new();
    for side in extras {
        let extra = side
            .extra
            .ok_or("a module-only agent without its configuration")?;
        for rep in 0..reps {
            let base_id = format!("lat-gpu-nvidia-beside-{}-{rep}", extra.name());
            let id = format!("lat-module-{}-{rep}", extra.name());
            fw.launch(
                &base_id,
                &[("cpus", 0.1), ("mem", 32.0), ("gpus", 1.0)],
                &command(probe, None, false),
                Some(baseline.port()),
            )?;
            fw.launch_in(
                &id,
                &[("cpus", 0.1), ("mem", 32.0), extra.ask()],
                &command(probe, None, false),
                Some(side.port()),
                extra.container(),
            )?;
            for (id, is_module) in [(&base_id, false), (&id, true)] {
                let running = fw.wait_state(id, "TASK_RUNNING", TIMEOUT)?;
                let accepted = fw.first("accept", id).ok_or("no accept event")?;
                fw.wait_terminal(id, TIMEOUT)?;
                latency
                    .entry((extra, is_module))
                    .or_default()
                    .push(running.t - accepted.t);
            }
        }
    }
    let _ = writeln!(
        out,
        "\n**Module only** (`gpu/nvidia` has no share and no MIG device): {reps} tasks of each \
         on a module agent of that configuration, each launched together with a `gpus:1` task on \
         the `gpu/nvidia` agent, the baseline beside it.\n\n\
         | module task | p50 | 95 % CI | p95 | p99 | gpu/nvidia `gpus:1` beside it: p50 | 95 % CI | p95 | p99 |\n\
         |---|---|---|---|---|---|---|---|---|"
    );
    for side in extras {
        let Some(extra) = side.extra else { continue };
        let mut cells = Vec::new();
        for is_module in [true, false] {
            let mut v = latency
                .get(&(extra, is_module))
                .cloned()
                .unwrap_or_default();
            v.sort_by(f64::total_cmp);
            cells.push(latency_cells(&v, 11 + u64::from(is_module)));
        }
        let _ = writeln!(
            out,
            "| {} | {} | {} |",
            extra.label(),
            cells[0].join(" | "),
            cells[1].join(" | ")
        );
        summary.push([
            format!(
                "launch latency, {}, p50 / p99 ({reps} tasks)",
                extra.label()
            ),
            format!(
                "no equivalent; `gpus:1` beside it: {} / {}",
                cells[1][0], cells[1][3]
            ),
            format!("{} / {}", cells[0][0], cells[0][3]),
        ]);
    }
    Ok(())
}

/// p50, its bootstrap 95 % interval, p95 and p99 of `sorted` (seconds) as table cells in ms.
fn latency_cells(sorted: &[f64], seed: u64) -> Vec<String> {
    let (lo, hi) = bootstrap_p50(sorted, seed);
    vec![
        format!("{:.0} ms", 1000.0 * percentile(sorted, 50.0)),
        format!("{:.0}-{:.0} ms", 1000.0 * lo, 1000.0 * hi),
        format!("{:.0} ms", 1000.0 * percentile(sorted, 95.0)),
        format!("{:.0} ms", 1000.0 * percentile(sorted, 99.0)),
    ]
}

/// The module's own time per call it served in the latency section, from each module agent's
/// `served call` log lines (issue 36).
fn served_table<'a>(out: &mut String, sides: impl Iterator<Item = &'a Side>) {
    let _ = writeln!(
        out,
        "\nThe module's own time per call it served in this section, from its `served call` \
         log lines (issue 36), beside the launches above:\n\n\
         | agent | call | calls | p50 | p95 | p99 | durable writes p50 | p99 |\n\
         |---|---|---|---|---|---|---|---|"
    );
    for side in sides.filter(|s| s.kind == Kind::Module) {
        let agent = side.extra.map_or("module", Extra::name);
        // The agent cleans a container up after its executor exits, a moment after the task's
        // last update: wait for the last cleanups (for at most 30 s).
        let deadline = Instant::now() + Duration::from_secs(30);
        let served = loop {
            let served = served_calls(&side.agent.log());
            let count = |call: &str| served.get(call).map_or(0, Vec::len);
            if count("cleanup") >= count("prepare") || Instant::now() > deadline {
                break served;
            }
            std::thread::sleep(Duration::from_millis(200));
        };
        for (call, v) in served {
            let mut ms: Vec<f64> = v.iter().map(|s| s.ms).collect();
            let mut durable: Vec<f64> = v.iter().map(|s| s.durable_ms).collect();
            ms.sort_by(f64::total_cmp);
            durable.sort_by(f64::total_cmp);
            let _ = writeln!(
                out,
                "| {agent} | {call} | {} | {:.2} ms | {:.2} ms | {:.2} ms | {:.2} ms | {:.2} ms |",
                v.len(),
                percentile(&ms, 50.0),
                percentile(&ms, 95.0),
                percentile(&ms, 99.0),
                percentile(&durable, 50.0),
                percentile(&durable, 99.0)
            );
        }
    }
}

/// One step of the allocation stream.
#[derive(Debug, Clone, Copy)]
enum Step {
    Arrive(u32),
    /// The n-th held task (in arrival order among those still held) departs.
    Depart(usize),
}

fn stream_steps(seed: u64, n: usize) -> Vec<Step> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut rnd = move |m: usize| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        usize::try_from(x % m as u64).unwrap_or(0)
    };
    let mut held = 0usize;
    let mut free = 8u32;
    let mut sizes_held: Vec<u32> = Vec::new();
    let mut steps = Vec::new();
    while steps.len() < n {
        let size = [1u32, 1, 2, 2, 2, 4][rnd(6)];
        if size <= free && (held == 0 || rnd(100) < 55) {
            steps.push(Step::Arrive(size));
            free -= size;
            held += 1;
            sizes_held.push(size);
        } else if held > 0 {
            let i = rnd(held);
            steps.push(Step::Depart(i));
            free += sizes_held.remove(i);
            held -= 1;
        }
    }
    steps
}

fn stream(
    out: &mut String,
    summary: &mut Summary,
    fw: &mut Framework,
    sides: &[Side; 2],
    probe: &Path,
    inventory: &Inventory,
    seed: u64,
) -> TestResult {
    let steps = stream_steps(seed, 40);
    let index_of_minor: BTreeMap<u32, u32> =
        inventory.gpus.iter().map(|g| (g.minor, g.index)).collect();
    let mut stats: BTreeMap<Kind, (usize, u64, u64, usize, Vec<String>)> = BTreeMap::new();
    let mut held: BTreeMap<Kind, Vec<(String, Vec<u32>)>> = BTreeMap::new();
    for (n, step) in steps.iter().enumerate() {
        match *step {
            Step::Arrive(size) => {
                let mut ids = Vec::new();
                for side in sides {
                    let id = format!("stream-{}-{n}", side.kind.name().replace('/', "-"));
                    let go = side.scratch.path().join(format!("{id}.go"));
                    fw.launch(
                        &id,
                        &[("cpus", 0.1), ("mem", 32.0), ("gpus", f64::from(size))],
                        &command(probe, Some(&go), false),
                        Some(side.port()),
                    )?;
                    ids.push((side, id));
                }
                for (side, id) in ids {
                    fw.wait_state(&id, "TASK_RUNNING", TIMEOUT)?;
                    let p = wait_probe(side, &id)?;
                    let minors = p.gpus();
                    let holding: Vec<u32> = held
                        .get(&side.kind)
                        .map(|h| h.iter().flat_map(|(_, m)| m.iter().copied()).collect())
                        .unwrap_or_default();
                    let mut alloc = Allocator::new(inventory, Policy::Topology)?;
                    let to_set =
                        |ms: &[u32]| GpuSet::from_indices(ms.iter().map(|m| index_of_minor[m]));
                    alloc.allocate_specific("others", to_set(&holding)?)?;
                    let best = alloc.fragmentation().best_score[size as usize];
                    let score = alloc.score(to_set(&minors)?);
                    let e = stats.entry(side.kind).or_default();
                    e.0 += 1;
                    e.1 += score;
                    e.2 += best;
                    if score < best {
                        e.3 += 1;
                    }
                    e.4.push(format!("{minors:?}={score}/{best}"));
                    held.entry(side.kind).or_default().push((id, minors));
                }
            }
            Step::Depart(i) => {
                let mut ids = Vec::new();
                for side in sides {
                    let list = held.entry(side.kind).or_default();
                    let (id, _) = list.remove(i);
                    std::fs::write(side.scratch.path().join(format!("{id}.go")), b"")?;
                    ids.push(id);
                }
                for id in ids {
                    fw.wait_terminal(&id, TIMEOUT)?;
                }
            }
        }
    }
    // Let the rest go.
    for side in sides {
        for (id, _) in held.remove(&side.kind).unwrap_or_default() {
            std::fs::write(side.scratch.path().join(format!("{id}.go")), b"")?;
            fw.wait_terminal(&id, TIMEOUT)?;
        }
    }
    let arrivals = steps
        .iter()
        .filter(|s| matches!(s, Step::Arrive(_)))
        .count();
    let _ = writeln!(
        out,
        "\n## 3. Allocation quality over a stream\n\n\
         {} steps (seed {seed}): {arrivals} arrivals of `gpus:1`, `gpus:2` or `gpus:4`, each held \
         until a later departure, never more than the 8 GPUs at once (so Mesos always offers \
         enough); the same steps in lockstep on both agents. Score: NVIDIA's pair score of the \
         granted set (`docs/allocator.md`: PCIe level + 100 per NVLink, every pair); best: the \
         highest score any set of that size had among that agent's free GPUs at that moment.\n\n\
         | isolator | grants | sum of scores | sum of best scores | grants below the best | refused |\n\
         |---|---|---|---|---|---|",
        steps.len()
    );
    let mut cells = Vec::new();
    for kind in [Kind::GpuNvidia, Kind::Module] {
        let (grants, score, best, below, _) = stats.get(&kind).cloned().unwrap_or_default();
        let _ = writeln!(
            out,
            "| {} | {grants} | {score} | {best} | {below} | 0 |",
            kind.name()
        );
        cells.push(format!(
            "{score} of {best} possible; {below} of {grants} grants below the best; 0 refused"
        ));
    }
    summary.push([
        format!("a stream of {arrivals} requests on a fragmenting node: summed pair score"),
        cells[0].clone(),
        cells[1].clone(),
    ]);
    let _ = writeln!(
        out,
        "\nNeither isolator refuses a request the master offered: on a fragmented node both \
         grant any free GPUs of the asked count (gpu/nvidia the lowest minors, the module the \
         best-scored set), so the difference is the score, not refusals. Grants in order \
         (minors=score/best):\n"
    );
    for kind in [Kind::GpuNvidia, Kind::Module] {
        let list = stats.get(&kind).map(|s| s.4.join(" ")).unwrap_or_default();
        let _ = writeln!(out, "- {}: {list}", kind.name());
    }
    Ok(())
}

/// Waits until task `id`'s first probe printed, then parses it.
fn wait_probe(side: &Side, id: &str) -> TestResult<TaskProbe> {
    let text = side.agent.wait_stdout(id, "before nvidiactl", TIMEOUT)?;
    Ok(TaskProbe::parse(&text))
}

fn restart(
    out: &mut String,
    summary: &mut Summary,
    master: &Master,
    sides: &mut [Side; 2],
    probe: &Path,
) -> TestResult {
    let mut kept = Vec::new();
    let mut orphans = Vec::new();
    let mut news = Vec::new();
    let _ = writeln!(
        out,
        "\n## 4. Agent SIGKILL + restart with tasks running\n\n\
         Two checkpointed `gpus:2` tasks run: `keep`, and `orphan`, whose executor's checkpoint \
         (`<work_dir>/meta/…/executors/orphan`) is removed while the agent is down, so that the \
         restarted agent does not know it and its containerizer finds the container as an \
         orphan (destroyed after recovery). The agent is SIGKILLed and restarted; a `gpus:6` \
         task (`new`) is launched as soon as it re-registered: only the orphan's GPUs and four \
         free ones can serve it. `orphan` prints `alive <uptime>` every 50 ms until it dies; \
         `new` prints its uptime before it probes.\n\n\
         | isolator | keep's GPUs before → after | orphan's GPUs | orphan's last heartbeat | new started | new's GPUs | new ∩ keep | new got orphan's GPUs while orphan alive |\n\
         |---|---|---|---|---|---|---|---|"
    );
    let mut logs = Vec::new();
    for side in sides.iter_mut() {
        let mut fw = Framework::start(master, &FrameworkSpec::gpu("restart"))?;
        let go_keep = side.scratch.path().join("keep.go");
        let go_orphan = side.scratch.path().join("orphan.go");
        let go_new = side.scratch.path().join("new.go");
        for (id, go, beat) in [("keep", &go_keep, false), ("orphan", &go_orphan, true)] {
            fw.launch(
                id,
                &[("cpus", 0.1), ("mem", 32.0), ("gpus", 2.0)],
                &command(probe, Some(go), beat),
                Some(side.port()),
            )?;
            fw.wait_state(id, "TASK_RUNNING", TIMEOUT)?;
        }
        let keep_before = wait_probe(side, "keep")?.gpus();
        let orphan = wait_probe(side, "orphan")?.gpus();
        let orphan_sandbox = side.agent.sandbox("orphan")?;
        side.agent.kill()?;
        // The executor's checkpoint: the same path under `<work_dir>/meta`.
        let work = side.agent.work_dir();
        let relative = orphan_sandbox
            .strip_prefix(&work)
            .map_err(|_| "the sandbox is not under the work directory")?;
        let executor_meta = work
            .join("meta")
            .join(relative)
            .parent()
            .and_then(Path::parent)
            .map(Path::to_path_buf)
            .ok_or("no executor directory")?;
        std::fs::remove_dir_all(&executor_meta)
            .map_err(|e| format!("{}: {e}", executor_meta.display()))?;
        side.agent.restart()?;
        fw.launch(
            "new",
            &[("cpus", 0.1), ("mem", 32.0), ("gpus", 6.0)],
            &command(probe, Some(&go_new), false),
            Some(side.port()),
        )?;
        let new_state = fw.wait_state("new", "TASK_RUNNING", TIMEOUT);
        let new = match &new_state {
            Ok(_) => wait_probe(side, "new")?,
            Err(_) => TaskProbe::default(),
        };
        std::fs::write(&go_keep, b"")?;
        let keep_end = fw.wait_terminal("keep", TIMEOUT)?;
        let keep_text = side.agent.wait_stdout("keep", "end", TIMEOUT)?;
        let keep_after: Vec<u32> = TaskProbe::parse(&keep_text)
            .opened_at_end
            .iter()
            .filter(|(_, o)| *o == "ENXIO")
            .filter_map(|(n, _)| n.strip_prefix("nvidia")?.parse().ok())
            .collect();
        let orphan_text =
            std::fs::read_to_string(orphan_sandbox.join("stdout")).unwrap_or_default();
        let last_alive: Option<f64> = orphan_text
            .lines()
            .rev()
            .find_map(|l| l.strip_prefix("alive ")?.trim().parse().ok());
        std::fs::write(&go_new, b"")?;
        let _ = fw.wait_terminal("new", TIMEOUT);
        let _ = std::fs::write(&go_orphan, b"");
        let new_gpus = new.gpus();
        let with_keep: Vec<u32> = new_gpus
            .iter()
            .copied()
            .filter(|m| keep_before.contains(m))
            .collect();
        let with_orphan: Vec<u32> = new_gpus
            .iter()
            .copied()
            .filter(|m| orphan.contains(m))
            .collect();
        let overlap_alive = match (new.start, last_alive) {
            (Some(start), Some(alive)) if !with_orphan.is_empty() => {
                if start < alive {
                    format!(
                        "**yes**: {with_orphan:?}, {:.2} s before the orphan's last heartbeat",
                        alive - start
                    )
                } else {
                    format!(
                        "no: it got {with_orphan:?} {:.2} s after the orphan's last heartbeat",
                        start - alive
                    )
                }
            }
            _ => "no".to_owned(),
        };
        let _ = writeln!(
            out,
            "| {} | {keep_before:?} → {keep_after:?} ({}) | {orphan:?} | {} | {} | {new_gpus:?} | {with_keep:?} | {overlap_alive} |",
            side.kind.name(),
            keep_end.state,
            last_alive.map_or("-".to_owned(), |t| format!("{t:.2}")),
            match (&new_state, new.start) {
                (Ok(_), Some(t)) => format!("{t:.2}"),
                (Err(e), _) => format!("not running: {e}"),
                _ => "-".into(),
            },
        );
        kept.push(format!(
            "{keep_before:?} → {keep_after:?}, {}",
            keep_end.state
        ));
        news.push(format!(
            "{new_gpus:?}: none of keep's; orphan's {with_orphan:?} {}",
            match (new.start, last_alive) {
                (Some(start), Some(alive)) =>
                    format!("{:.1} s after the orphan died", start - alive),
                _ => "-".into(),
            }
        ));
        let log = side.agent.log();
        orphans.push(match side.kind {
            // `gpu/nvidia`'s `recover` re-allocates the GPUs of known containers only
            // (`isolator.cpp` `_recover`); it logs nothing about GPUs.
            Kind::GpuNvidia => {
                "free at recovery (its `recover` skips orphans; source, not logged)".to_owned()
            }
            Kind::Module => log
                .lines()
                .find(|l| l.contains("recover{") && l.contains("orphans=1"))
                .and_then(|l| l.split("free=").nth(1))
                .map_or("-".to_owned(), |free| {
                    format!(
                        "held until its cleanup (logged at recovery: free={})",
                        free.trim()
                    )
                }),
        });
        let lines: Vec<String> = log
            .lines()
            .filter(|l| {
                (l.contains("gpu_isolator.cpp") && (l.contains("recover") || l.contains("orphan")))
                    || (l.contains("orphan") && l.contains("containerizer.cpp"))
            })
            .map(|l| l.chars().take(400).collect())
            .collect();
        logs.push((side.kind, lines));
        fw.stop()?;
    }
    summary.push([
        "agent SIGKILL + restart: a running task's GPUs".into(),
        kept[0].clone(),
        kept[1].clone(),
    ]);
    summary.push([
        "the orphan's GPUs".into(),
        orphans[0].clone(),
        orphans[1].clone(),
    ]);
    summary.push([
        "a `gpus:6` task launched right after the restart gets".into(),
        news[0].clone(),
        news[1].clone(),
    ]);
    for (kind, lines) in logs {
        let _ = writeln!(
            out,
            "\n{}'s agent log about the recovery and the orphan:\n\n```\n{}\n```",
            kind.name(),
            lines.join("\n")
        );
    }
    Ok(())
}

fn docker(
    out: &mut String,
    summary: &mut Summary,
    install: &MesosInstall,
    master: &Master,
    probe: &Path,
) -> TestResult {
    let mut cells = Vec::new();
    let _ = writeln!(
        out,
        "\n## 5. A Docker-containerizer task with `gpus:1`\n\n\
         Agents with `--containerizers=docker,mesos`: Mesos alone (`gpu/nvidia` among the \
         isolators; its Docker containerizer builds its own GPU allocator), and the module with \
         its Docker hook and `mesos-gpu docker-wrapper` as `--docker`. The task runs in a \
         busybox image holding the probe and probes its own `/dev`.\n"
    );
    let image = DockerImage::build(probe)?;
    for kind in [Kind::GpuNvidia, Kind::Module] {
        let side = Side::start(install, master, kind, true)?;
        let mut fw = Framework::start(master, &FrameworkSpec::gpu("docker-gpus"))?;
        let id = format!("docker-{}", kind.name().replace('/', "-"));
        fw.launch_in(
            &id,
            &[("cpus", 0.1), ("mem", 32.0), ("gpus", 1.0)],
            "up() { cut -d' ' -f1 /proc/uptime; }; /probe /dev; echo end $(up)",
            Some(side.port()),
            Some(serde_json::json!({
                "type": "DOCKER",
                "docker": { "image": image.name, "network": "HOST" }
            })),
        )?;
        let end = fw.wait_terminal(&id, TIMEOUT)?;
        let text = side
            .agent
            .sandbox(&id)
            .map(|d| std::fs::read_to_string(d.join("stdout")).unwrap_or_default())
            .unwrap_or_default();
        let p = TaskProbe::parse(&text);
        let nodes: Vec<String> = p
            .opened_at_start
            .iter()
            .map(|(n, o)| format!("{n} {}", short(o)))
            .collect();
        let booked = booked_gpus(side.port());
        let _ = writeln!(
            out,
            "- {}: task {} ({}); the agent's `/state` booked gpus {booked}; `/dev/nvidia*` in \
             the container: {}; NVIDIA_VISIBLE_DEVICES={}",
            kind.name(),
            end.state,
            end.json["message"].as_str().unwrap_or_default(),
            if nodes.is_empty() {
                "none".to_owned()
            } else {
                nodes.join(", ")
            },
            p.env
                .get("NVIDIA_VISIBLE_DEVICES")
                .map_or("(unset)", String::as_str),
        );
        cells.push(format!(
            "booked gpus {booked}; `/dev/nvidia*` in the container: {}",
            if nodes.is_empty() {
                "none".to_owned()
            } else {
                nodes.join(", ")
            }
        ));
        if end.state != "TASK_FINISHED" {
            let _ = writeln!(
                out,
                "  agent log:\n```\n{}\n```",
                tail(&side.agent.log(), 15)
            );
        }
        drop(fw);
    }
    summary.push([
        "a Docker-containerizer task with `gpus:1`".into(),
        cells[0].clone(),
        cells[1].clone(),
    ]);
    Ok(())
}

/// The `gpus` the agent's `/state` counts used while its last task ran (from its completed
/// executors' resources), as text.
fn booked_gpus(port: u16) -> String {
    let Ok(body) = http_get(port, "/state") else {
        return "?".into();
    };
    let Ok(state) = serde_json::from_str::<serde_json::Value>(&body) else {
        return "?".into();
    };
    let mut found = Vec::new();
    for fw in state["completed_frameworks"]
        .as_array()
        .into_iter()
        .flatten()
        .chain(state["frameworks"].as_array().into_iter().flatten())
    {
        for ex in fw["completed_executors"]
            .as_array()
            .into_iter()
            .flatten()
            .chain(fw["executors"].as_array().into_iter().flatten())
        {
            for task in ex["completed_tasks"]
                .as_array()
                .into_iter()
                .flatten()
                .chain(ex["tasks"].as_array().into_iter().flatten())
            {
                if let Some(g) = task["resources"]["gpus"].as_f64() {
                    found.push(g);
                }
            }
        }
    }
    found
        .iter()
        .map(|g| format!("{g}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// A busybox image `FROM scratch` holding the probe at `/probe`; removed on drop.
struct DockerImage {
    name: String,
    _dir: tempfile::TempDir,
}

impl DockerImage {
    fn build(probe: &Path) -> TestResult<DockerImage> {
        let dir = tempfile::Builder::new().prefix("mgpu-vs-image").tempdir()?;
        std::fs::copy("/bin/busybox", dir.path().join("busybox"))?;
        std::fs::copy(probe, dir.path().join("probe"))?;
        let name = format!("{}:1", mesos_gpu_testkit::unique_name("mesos-vs"));
        std::fs::write(
            dir.path().join("Dockerfile"),
            format!(
                "FROM scratch\nCOPY busybox /bin/busybox\nRUN [\"/bin/busybox\", \"--install\", \"-s\", \"/bin\"]\n\
                 COPY probe /probe\nLABEL mgpu.test={name}\n"
            ),
        )?;
        let out = std::process::Command::new("docker")
            .args(["build", "-q", "-t", &name])
            .arg(dir.path())
            .output()?;
        check(
            out.status.success(),
            format!("docker build: {}", String::from_utf8_lossy(&out.stderr)),
        )?;
        Ok(DockerImage { name, _dir: dir })
    }
}

impl Drop for DockerImage {
    fn drop(&mut self) {
        if let Ok(out) = std::process::Command::new("docker")
            .args(["ps", "-aq", "--filter"])
            .arg(format!("ancestor={}", self.name))
            .output()
        {
            for id in String::from_utf8_lossy(&out.stdout).split_whitespace() {
                let _ = std::process::Command::new("docker")
                    .args(["rm", "-f", id])
                    .output();
            }
        }
        let _ = std::process::Command::new("docker")
            .args(["rmi", "-f", "--no-prune", &self.name])
            .output();
    }
}
