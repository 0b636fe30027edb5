//! Issue 13, bounded chaos: for `MGPU_CHAOS_SECS` seconds (default 60) several processes
//! allocate and release GPUs of one simulated 8-GPU node through different entry points of the
//! node's one pool — agent-module workers (the isolator with the module's role, in a child of
//! this binary), `mesos-gpu exec`, `mesos-gpu docker-args`, and `docker-args` then
//! `mesos-gpu docker-wrapper` (the agent's `--docker` program, with no NVML, as shipped) on the
//! same Docker record — while a killer SIGKILLs random ones at random moments (seeded by
//! `MGPU_CHAOS_SEED`, bounded). Every holder marks each GPU it holds in `held/<uuid>` (`O_EXCL`,
//! with its pid and start time, so pid reuse cannot fool it), so a GPU granted twice at once is
//! caught.
//!
//! Issue 24: the node's NVML fails at random (nvml-sim's `random_failures`: 10 % of inits answer
//! `NVML_ERROR_DRIVER_NOT_LOADED` or `NVML_ERROR_UNKNOWN`, a few calls `NVML_ERROR_UNKNOWN`; each
//! process draws its own stream, `NVML_SIM_SEED` from the chaos seed), so some processes see no
//! GPU or fail discovery: they must refuse saying why, and never change another's reservation.
//! Afterwards one reconciliation (`gpu release --dead`) must leave 0 GPUs double-booked and 0
//! lost: every GPU free, or held by an owner that is alive or uncertain with a reason, or
//! quarantined with a reason.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use libtest_mimic::{Arguments, Failed, Trial};
use mesos_gpu_isolator::{
    lifecycle::CgroupChoice, lifecycle::ContainerId, lifecycle::Isolator,
    lifecycle::IsolatorConfig, lifecycle::PoolConfig, lifecycle::PoolRole,
    lifecycle::PrepareConfig,
};
use mesos_gpu_node::devices::DeviceNodes;
use mesos_gpu_node::{discovery::Discovery, discovery::GpuDriver};
use mesos_gpu_testkit::dockerd::FakeDockerd;
use mesos_gpu_testkit::nvml_sim::SimNode;
use mesos_gpu_testkit::{Host, Need, needs, unique_name};

const WORKER_ENV: &str = "MGPU_CHAOS_AGENT_WORKER";
/// The exit status of an agent worker whose discovery failed: the module refuses to start.
const REFUSED_TO_START: u8 = 4;
/// Refusals that are the node's answer, not failures: too few GPUs, or no view of them.
const EXPECTED_REFUSALS: [&str; 3] = [" asked; ", "granting no GPU", "GPU discovery failed"];

/// The simulated node: a DGX-1 whose NVML fails at random (nvml-sim `random_failures`).
fn flaky_node() -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../nvml-sim/topologies/dgx1-v100.json");
    let mut json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    json["random_failures"] = serde_json::json!({
        "init": { "probability": 0.1, "errors": ["NVML_ERROR_DRIVER_NOT_LOADED", "NVML_ERROR_UNKNOWN"] },
        "calls": { "probability": 0.0005, "errors": ["NVML_ERROR_UNKNOWN"] },
    });
    json.to_string()
}

/// True when `stderr` is one of the node's expected refusals.
fn expected_refusal(stderr: &str) -> bool {
    EXPECTED_REFUSALS.iter().any(|r| stderr.contains(r))
}

fn main() -> ExitCode {
    if let Ok(spec) = std::env::var(WORKER_ENV) {
        return agent_worker(&spec);
    }
    let host = Host::probe();
    let trial = Trial::test("chaos_leaves_nothing_double_booked_or_lost", chaos);
    let trials = vec![needs(&host, &[Need::Root, Need::Cgroup1], trial)];
    libtest_mimic::run(&Arguments::from_args(), trials).exit_code()
}

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// The start time of `pid` (field 22 of `/proc/<pid>/stat`, in clock ticks since boot), so that
/// a marker left by a killed holder whose pid was reused is not taken for a live holder.
fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after_comm = &stat[stat.rfind(')')? + 1..];
    after_comm.split_whitespace().nth(19)?.parse().ok()
}

/// Marks `uuids` held by `pid` (as `<pid> <start time>`); a marker of another live holder is a
/// double-booking. A marker whose holder is gone (its pid dead or reused) is taken over.
fn mark(held: &Path, uuids: &[String], pid: u32) -> u64 {
    let me = format!("{pid} {}", start_time(pid).unwrap());
    let mut doubles = 0;
    for u in uuids {
        let path = held.join(u);
        loop {
            match std::fs::File::create_new(&path) {
                Ok(_) => {
                    std::fs::write(&path, &me).unwrap();
                    break;
                }
                Err(e) if e.kind() == ErrorKind::AlreadyExists => {
                    let other = std::fs::read_to_string(&path).unwrap_or_default();
                    let mut fields = other.split_whitespace();
                    let holder = fields.next().and_then(|p| p.parse::<u32>().ok());
                    let started = fields.next().and_then(|t| t.parse::<u64>().ok());
                    if let (Some(holder), Some(started)) = (holder, started)
                        && other.trim() != me
                        && start_time(holder) == Some(started)
                    {
                        eprintln!("chaos: {u} held by {other} and granted to {me}");
                        doubles += 1;
                        break;
                    }
                    // A holder that was killed left it (or it is being written): take it over.
                    let _ = std::fs::remove_file(&path);
                }
                Err(e) => panic!("{e}"),
            }
        }
    }
    doubles
}

fn unmark(held: &Path, uuids: &[String]) {
    for u in uuids {
        let _ = std::fs::remove_file(held.join(u));
    }
}

/// An agent-module worker: the isolator with the module's role (own v1 cgroups), preparing and
/// cleaning up containers in a loop until killed or its time is up. Spec:
/// `<scratch>|<cgroups root>|<seed>|<seconds>`.
fn agent_worker(spec: &str) -> ExitCode {
    let parts: Vec<&str> = spec.split('|').collect();
    let scratch = PathBuf::from(parts[0]);
    let mut rng = Rng(parts[2].parse().unwrap());
    let until = Instant::now() + Duration::from_secs_f64(parts[3].parse().unwrap());
    let sim = SimNode::from_json(&flaky_node());
    // A module whose discovery fails (or finds no driver) refuses to start.
    let Ok(Discovery::Driver(driver)) = GpuDriver::open(Some(&sim.lib_path())) else {
        return ExitCode::from(REFUSED_TO_START);
    };
    let inventory = driver.inventory().clone();
    let work = scratch.join(format!("agent-{}", std::process::id()));
    let mut config = IsolatorConfig::new(&work);
    config.cgroup_version = CgroupChoice::V1;
    config.cgroups_root = parts[1].to_owned();
    config.pool = Some(PoolConfig {
        dir: scratch.clone(),
        role: PoolRole::Agent,
    });
    let isolator = Isolator::new(config, inventory, DeviceNodes::default()).unwrap();
    isolator.recover(&[], &[]).unwrap();
    let held = scratch.join("held");
    let mut doubles = 0;
    let mut n = 0;
    while Instant::now() < until {
        n += 1;
        let id = ContainerId::new(format!("agent-{}-{n}", std::process::id())).unwrap();
        let gpus = 1 + rng.next() % 3;
        match isolator.prepare(
            &id,
            PrepareConfig {
                gpus: gpus as f64,
                ..PrepareConfig::default()
            },
        ) {
            Ok(info) => {
                let uuids: Vec<String> = info.gpus.iter().map(|g| g.uuid.clone()).collect();
                doubles += mark(&held, &uuids, std::process::id());
                std::thread::sleep(Duration::from_millis(rng.next() % 100));
                unmark(&held, &uuids);
                isolator.cleanup(&id).unwrap();
            }
            Err(e) if e.is_not_enough() => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => {
                eprintln!("agent worker: {e:#}");
                return ExitCode::FAILURE;
            }
        }
    }
    if doubles > 0 {
        eprintln!("agent worker saw {doubles} double-bookings");
        return ExitCode::from(3);
    }
    ExitCode::SUCCESS
}

struct Chaos {
    scratch: PathBuf,
    dev: PathBuf,
    root: String,
    until: Instant,
    seed: u64,
    children: Mutex<Vec<Child>>,
    doubles: AtomicU64,
    grants: AtomicU64,
    kills: AtomicU64,
    /// Requests refused because the process saw no GPU or its discovery failed.
    blind: AtomicU64,
    failures: Mutex<Vec<String>>,
    /// The node description with random NVML failures.
    node: PathBuf,
    /// The Docker daemon `docker-args` records and the wrapper asks about images.
    dockerd: FakeDockerd,
    /// Draws the NVML seed of each process.
    draws: Mutex<Rng>,
}

/// `mesos-gpu` on the flaky node, with an NVML stream of its own.
fn mesos_gpu(c: &Chaos) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_mesos-gpu"));
    cmd.arg("--simulate")
        .arg(&c.node)
        .arg("--dev-root")
        .arg(&c.dev)
        .env(
            nvml_sim::SEED_ENV,
            c.draws.lock().unwrap().next().to_string(),
        )
        .env("MESOS_GPU_POOL_DIR", &c.scratch)
        .env("MESOS_GPU_LOG", "error")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

/// Runs a reserving `docker-args` (`what`), killable; its output when it reserved. A kill is
/// counted, and so is a refusal the node explains (a moment passes before the next try); any
/// other failure is one of the test's.
fn docker_args(c: &Chaos, cmd: Command, what: &str) -> Option<std::process::Output> {
    let Some(out) = run_killable(c, cmd) else {
        c.kills.fetch_add(1, Ordering::Relaxed);
        return None;
    };
    if out.status.success() {
        return Some(out);
    }
    refused_or_failed(c, what, &String::from_utf8_lossy(&out.stderr));
    std::thread::sleep(Duration::from_millis(20));
    None
}

/// Counts what `what` said on failing: a refusal the node explains, or one of the test's failures.
fn refused_or_failed(c: &Chaos, what: &str, stderr: &str) {
    if expected_refusal(stderr) {
        count_blind(c, stderr);
    } else {
        c.failures
            .lock()
            .unwrap()
            .push(format!("{what} failed: {stderr}"));
    }
}

/// Counts a refusal for want of a view of the GPUs.
fn count_blind(c: &Chaos, stderr: &str) {
    if stderr.contains("granting no GPU") || stderr.contains("GPU discovery failed") {
        c.blind.fetch_add(1, Ordering::Relaxed);
    }
}

/// Spawns `cmd`, registers it with the killer, waits for it; `None` when it was killed.
fn run_killable(c: &Chaos, mut cmd: Command) -> Option<std::process::Output> {
    let child = cmd.spawn().unwrap();
    let pid = child.id();
    c.children.lock().unwrap().push(child);
    loop {
        let mut kids = c.children.lock().unwrap();
        let pos = kids.iter().position(|k| k.id() == pid)?;
        if kids[pos].try_wait().unwrap().is_some() {
            let child = kids.remove(pos);
            drop(kids);
            let out = child.wait_with_output().unwrap();
            return (out.status.signal_is_kill())
                .then_some(())
                .map_or(Some(out), |()| None);
        }
        drop(kids);
        std::thread::sleep(Duration::from_millis(5));
    }
}

trait KillStatus {
    fn signal_is_kill(&self) -> bool;
}

impl KillStatus for std::process::ExitStatus {
    fn signal_is_kill(&self) -> bool {
        use std::os::unix::process::ExitStatusExt as _;
        self.signal() == Some(9)
    }
}

fn exec_loop(c: &Chaos, seed: u64) {
    let mut rng = Rng(seed);
    let held = c.scratch.join("held");
    while Instant::now() < c.until {
        let gpus = 1 + rng.next() % 3;
        let hold = rng.next() % 150;
        // The command marks its GPUs (CUDA_VISIBLE_DEVICES), holds them, unmarks: it outlives a
        // killed exec, so its markers are always removed.
        let script = format!(
            "me=\"$$ $(cut -d' ' -f22 /proc/$$/stat)\"; \
             for u in $(echo $CUDA_VISIBLE_DEVICES | tr , ' '); do \
               if ( set -C; echo \"$me\" > {h}/$u ) 2>/dev/null; then :; \
               else set -- $(cat {h}/$u); \
                 if [ -n \"$2\" ] && [ \"$(cut -d' ' -f22 /proc/$1/stat 2>/dev/null)\" = \"$2\" ]; \
                 then echo DOUBLE $u held by $1; else echo \"$me\" > {h}/$u; fi; fi; done; \
             busybox sleep 0.{hold:03}; \
             for u in $(echo $CUDA_VISIBLE_DEVICES | tr , ' '); do rm -f {h}/$u; done",
            h = held.display()
        );
        let mut cmd = mesos_gpu(c);
        cmd.args([
            "exec",
            "--gpus",
            &gpus.to_string(),
            "--cgroup-version",
            "v1",
        ])
        .args([
            "--cgroups-root",
            &c.root,
            "--",
            "busybox",
            "sh",
            "-c",
            &script,
        ]);
        match run_killable(c, cmd) {
            None => {
                c.kills.fetch_add(1, Ordering::Relaxed);
            }
            Some(out) => {
                let stdout = String::from_utf8_lossy(&out.stdout);
                let stderr = String::from_utf8_lossy(&out.stderr);
                if stdout.contains("DOUBLE") {
                    c.doubles.fetch_add(1, Ordering::Relaxed);
                    c.failures.lock().unwrap().push(format!("exec: {stdout}"));
                }
                if out.status.success() {
                    c.grants.fetch_add(1, Ordering::Relaxed);
                } else {
                    refused_or_failed(c, "exec", &stderr);
                }
            }
        }
    }
}

fn docker_loop(c: &Chaos, seed: u64) {
    let mut rng = Rng(seed);
    let held = c.scratch.join("held");
    let work = c.scratch.join("docker");
    while Instant::now() < c.until {
        let gpus = 1 + rng.next() % 3;
        let mut cmd = mesos_gpu(c);
        cmd.args(["docker-args", "--gpus", &gpus.to_string(), "--plugin"])
            .arg("--docker-state-dir")
            .arg(&work);
        let Some(out) = docker_args(c, cmd, "docker-args") else {
            continue;
        };
        let args: Vec<String> = String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .map(str::to_owned)
            .collect();
        let id = args
            .iter()
            .find_map(|a| a.strip_prefix("--name=mesos-"))
            .unwrap()
            .to_owned();
        let uuids: Vec<String> = args
            .iter()
            .find_map(|a| a.strip_prefix("--env=NVIDIA_VISIBLE_DEVICES="))
            .map(|v| v.split(',').map(str::to_owned).collect())
            .unwrap_or_default();
        c.grants.fetch_add(1, Ordering::Relaxed);
        let d = mark(&held, &uuids, std::process::id());
        c.doubles.fetch_add(d, Ordering::Relaxed);
        std::thread::sleep(Duration::from_millis(rng.next() % 100));
        unmark(&held, &uuids);
        release(c, &id, &work);
    }
}

/// The `docker` program the wrapper runs: `run` marks the GPUs of `NVIDIA_VISIBLE_DEVICES` as
/// held by the wrapper (its parent: the reservation's starter, alive while it runs), holds them
/// a moment and unmarks those still its own; `inspect` says the container is not running.
fn fake_docker(c: &Chaos) -> PathBuf {
    let path = c.scratch.join("fake-docker");
    let script = format!(
        "#!/bin/sh\n\
         case \" $* \" in *\" inspect \"*) echo false; exit 0;; *\" run \"*) ;; *) exit 0;; esac\n\
         me=\"$PPID $(cut -d' ' -f22 /proc/$PPID/stat)\"\n\
         uuids=$(printf '%s\\n' \"$@\" | sed -n 's/^--env=NVIDIA_VISIBLE_DEVICES=//p' | tr , ' ')\n\
         for u in $uuids; do \
           if ( set -C; echo \"$me\" > {h}/$u ) 2>/dev/null; then :; \
           else set -- $(cat {h}/$u); \
             if [ -n \"$2\" ] && [ \"$(cut -d' ' -f22 /proc/$1/stat 2>/dev/null)\" = \"$2\" ]; \
             then echo DOUBLE $u held by $1; else echo \"$me\" > {h}/$u; fi; fi; done\n\
         busybox sleep 0.0$(( $$ % 10 ))\n\
         for u in $uuids; do [ \"$(cat {h}/$u 2>/dev/null)\" = \"$me\" ] && rm -f {h}/$u; done\n\
         exit 0\n",
        h = c.scratch.join("held").display()
    );
    std::fs::write(&path, script).unwrap();
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

/// As the agent's Docker hook and `--docker` program do: `docker-args` reserves for a container
/// (its starter a stand-in for the agent, which goes when the round ends, as an agent that
/// removed the executor), the wrapper (no NVML, as shipped) claims the reservation, runs
/// `docker run` and gives the GPUs back, then the hook's `--release`.
fn wrapper_loop(c: &Chaos, seed: u64) {
    let mut rng = Rng(seed);
    let docker = fake_docker(c);
    while Instant::now() < c.until {
        let mut agent = Command::new("sleep").arg("60").spawn().unwrap();
        wrapper_round(c, &mut rng, &docker, agent.id());
        let _ = agent.kill();
        let _ = agent.wait();
    }
}

/// One container of [`wrapper_loop`], reserved for the starter `agent`.
fn wrapper_round(c: &Chaos, rng: &mut Rng, docker: &Path, agent: u32) {
    let work = c.scratch.join("docker");
    let socket = c.dockerd.socket();
    let gpus = 1 + rng.next() % 3;
    let id = format!(
        "{:08x}-1c5e-4f5a-9c1e-{:012x}",
        rng.next() >> 32,
        rng.next() >> 16
    );
    let mut reserve = mesos_gpu(c);
    reserve
        .args(["docker-args", "--plugin", "--json", "--gpus"])
        .arg(gpus.to_string())
        .args(["--container-id", &id, "--starter-pid"])
        .arg(agent.to_string())
        .arg("--docker-socket")
        .arg(socket)
        .arg("--docker-state-dir")
        .arg(&work);
    let Some(out) = docker_args(c, reserve, "docker-args (hook)") else {
        return;
    };
    let json = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    let mut wrapper = Command::new(env!("CARGO_BIN_EXE_mesos-gpu"));
    wrapper
        .args(["docker-wrapper", "--docker"])
        .arg(docker)
        .arg("--docker-state-dir")
        .arg(&work)
        .arg("--")
        .arg("-H")
        .arg(format!("unix://{}", socket.display()))
        .args(["run", "-e"])
        .arg(format!("MESOS_GPU_DOCKER_ARGS={json}"))
        .args(["--name", &format!("mesos-{id}"), "img", "true"])
        .env("MESOS_GPU_POOL_DIR", &c.scratch)
        .env("MESOS_GPU_LOG", "error")
        .env_remove("LD_LIBRARY_PATH")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    match run_killable(c, wrapper) {
        None => {
            c.kills.fetch_add(1, Ordering::Relaxed);
        }
        Some(out) => {
            let stdout = String::from_utf8_lossy(&out.stdout);
            if stdout.contains("DOUBLE") {
                c.doubles.fetch_add(1, Ordering::Relaxed);
                c.failures
                    .lock()
                    .unwrap()
                    .push(format!("wrapper: {stdout}"));
            }
            if out.status.success() {
                c.grants.fetch_add(1, Ordering::Relaxed);
            } else {
                c.failures.lock().unwrap().push(format!(
                    "docker-wrapper failed: {}",
                    String::from_utf8_lossy(&out.stderr)
                ));
            }
        }
    }
    release(c, &id, &work);
}

/// `docker-args --release <id>` of the records in `work`, killable.
fn release(c: &Chaos, id: &str, work: &Path) {
    let mut release = mesos_gpu(c);
    release
        .args(["docker-args", "--release", id, "--docker-state-dir"])
        .arg(work);
    if run_killable(c, release).is_none() {
        c.kills.fetch_add(1, Ordering::Relaxed);
    }
}

fn agent_loop(c: &Chaos, seed: u64) {
    let mut rng = Rng(seed);
    let mut starts = 0;
    while Instant::now() < c.until {
        starts += 1;
        // Each agent has a cgroups root of its own, as agents on one node must.
        let root = format!("{}/a{seed}-{starts}", c.root);
        let left = c
            .until
            .saturating_duration_since(Instant::now())
            .as_secs_f64();
        let mut cmd = Command::new(std::env::current_exe().unwrap());
        cmd.env(
            WORKER_ENV,
            format!(
                "{}|{}|{}|{}",
                c.scratch.display(),
                root,
                rng.next() | 1,
                left.min(5.0)
            ),
        )
        .env(
            nvml_sim::SEED_ENV,
            c.draws.lock().unwrap().next().to_string(),
        )
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
        match run_killable(c, cmd) {
            None => {
                c.kills.fetch_add(1, Ordering::Relaxed);
            }
            Some(out) if out.status.code() == Some(3) => {
                c.doubles.fetch_add(1, Ordering::Relaxed);
            }
            Some(out) if out.status.code() == Some(i32::from(REFUSED_TO_START)) => {
                c.blind.fetch_add(1, Ordering::Relaxed);
            }
            Some(out) if !out.status.success() => c.failures.lock().unwrap().push(format!(
                "agent worker: {}",
                String::from_utf8_lossy(&out.stderr)
            )),
            Some(_) => {
                c.grants.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

fn chaos() -> Result<(), Failed> {
    let secs: f64 = std::env::var("MGPU_CHAOS_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(60.0);
    let seed: u64 = std::env::var("MGPU_CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(13);
    let scratch = tempfile::Builder::new()
        .prefix("mgpu-test-chaos")
        .tempdir()?;
    let dev = scratch.path().join("dev");
    std::fs::create_dir_all(&dev)?;
    std::fs::create_dir_all(scratch.path().join("held"))?;
    for (name, major, minor) in (0..8).map(|m| (format!("nvidia{m}"), 195, m)).chain([
        ("nvidiactl".to_owned(), 195, 255),
        ("nvidia-uvm".to_owned(), 240, 0),
    ]) {
        let ok = Command::new("mknod")
            .arg(dev.join(name))
            .args(["c", &major.to_string(), &minor.to_string()])
            .status()?;
        assert!(ok.success(), "mknod");
    }
    let node = scratch.path().join("flaky-dgx1.json");
    std::fs::write(&node, flaky_node())?;
    // Images ask for the driver: the wrapper passes NVIDIA_VISIBLE_DEVICES on.
    let dockerd = FakeDockerd::start(
        &scratch.path().join("docker.sock"),
        &[("com.nvidia.volumes.needed", "nvidia_driver")],
    )?;
    let c = Arc::new(Chaos {
        scratch: scratch.path().to_owned(),
        dev,
        root: unique_name("chaos"),
        until: Instant::now() + Duration::from_secs_f64(secs),
        seed,
        children: Mutex::new(Vec::new()),
        doubles: AtomicU64::new(0),
        grants: AtomicU64::new(0),
        kills: AtomicU64::new(0),
        blind: AtomicU64::new(0),
        failures: Mutex::new(Vec::new()),
        node,
        dockerd,
        draws: Mutex::new(Rng(seed ^ 0x5eed_f00d)),
    });
    let parent = Path::new("/sys/fs/cgroup/devices").join(&c.root);
    let stop = Arc::new(AtomicBool::new(false));
    let mut threads = Vec::new();
    for (i, f) in [
        agent_loop as fn(&Chaos, u64),
        agent_loop,
        exec_loop,
        exec_loop,
        docker_loop,
        wrapper_loop,
    ]
    .into_iter()
    .enumerate()
    {
        let c = Arc::clone(&c);
        let s = c.seed.wrapping_mul(31).wrapping_add(i as u64 + 1);
        threads.push(std::thread::spawn(move || f(&c, s)));
    }
    // The killer: every 100-400 ms, SIGKILL one random running child.
    let killer = {
        let (c, stop) = (Arc::clone(&c), Arc::clone(&stop));
        std::thread::spawn(move || {
            let mut rng = Rng(c.seed ^ 0xdead_beef);
            while !stop.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(100 + rng.next() % 300));
                let mut kids = c.children.lock().unwrap();
                if !kids.is_empty() {
                    let i = usize::try_from(rng.next() % kids.len() as u64).unwrap_or(0);
                    let _ = kids[i].kill();
                }
            }
        })
    };
    for t in threads {
        t.join().unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    killer.join().unwrap();
    // Commands of killed execs end within their hold time; then one reconciliation.
    std::thread::sleep(Duration::from_millis(500));
    let out = Command::new(env!("CARGO_BIN_EXE_mesos-gpu"))
        .args(["gpu", "release", "--dead", "--pool-dir"])
        .arg(scratch.path())
        .output()?;
    let released = String::from_utf8_lossy(&out.stdout).into_owned();
    let listing: serde_json::Value = serde_json::from_slice(
        &Command::new(env!("CARGO_BIN_EXE_mesos-gpu"))
            .args(["gpu", "list", "--json", "--pool-dir"])
            .arg(scratch.path())
            .output()?
            .stdout,
    )?;
    let _ = remove_tree(&parent);
    let mut owners: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut unaccounted = Vec::new();
    for r in listing["reservations"]
        .as_array()
        .cloned()
        .unwrap_or_default()
    {
        let state = r["liveness"]["state"].as_str().unwrap_or_default();
        let why = r["liveness"]["why"].as_str().unwrap_or_default();
        if state == "dead" || why.is_empty() {
            unaccounted.push(format!("{r}"));
        }
        for g in r["gpus"].as_array().cloned().unwrap_or_default() {
            owners
                .entry(g.as_str().unwrap_or_default().to_owned())
                .or_default()
                .push(r["id"].as_str().unwrap_or_default().to_owned());
        }
    }
    let twice: Vec<_> = owners.iter().filter(|(_, o)| o.len() > 1).collect();
    let (grants, kills, doubles, blind) = (
        c.grants.load(Ordering::Relaxed),
        c.kills.load(Ordering::Relaxed),
        c.doubles.load(Ordering::Relaxed),
        c.blind.load(Ordering::Relaxed),
    );
    println!(
        "chaos: {secs} s, seed {seed}: {grants} grants, {kills} kills, {blind} refusals without a view of the GPUs, {doubles} double-bookings seen; \
         after one reconciliation: {} reservations, {} GPUs held, {} double-booked, {} unaccounted\n{released}",
        listing["reservations"].as_array().map_or(0, Vec::len),
        owners.len(),
        twice.len(),
        unaccounted.len()
    );
    let failures = c.failures.lock().unwrap().clone();
    if doubles > 0 || !twice.is_empty() || !unaccounted.is_empty() || !failures.is_empty() {
        return Err(format!(
            "double-bookings seen {doubles}; booked twice {twice:?}; unaccounted {unaccounted:?}; failures {failures:?}"
        )
        .into());
    }
    if grants == 0 || kills == 0 || blind == 0 {
        return Err(format!(
            "no chaos: {grants} grants, {kills} kills, {blind} refusals without a view of the GPUs"
        )
        .into());
    }
    Ok(())
}

/// Removes the cgroup `dir` and every cgroup below it, deepest first, killing what is left.
fn remove_tree(dir: &Path) -> std::io::Result<()> {
    for e in std::fs::read_dir(dir)?.flatten() {
        if e.file_type()?.is_dir() {
            let _ = remove_tree(&e.path());
        }
    }
    for _ in 0..50 {
        let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
        for p in procs.split_whitespace() {
            let _ = Command::new("kill").args(["-9", p]).status();
        }
        if std::fs::remove_dir(dir).is_ok() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    std::fs::remove_dir(dir)
}
