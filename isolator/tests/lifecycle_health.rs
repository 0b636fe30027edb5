//! GPU health wired into the isolator lifecycle, on nvml-sim (`dgx1-v100`) and real cgroups: an
//! XID on a container's GPU resolves that container's `watch` only and keeps the GPU out of the
//! pool; ignored XIDs change nothing; the operator brings it back; `usage` carries NVML figures
//! of the container's own processes; cleanup forgets the limitation; a restart keeps failed GPUs
//! out; and no interleaving of lifecycle calls with health changes deadlocks. Needs root and the
//! cgroup version.
#![allow(clippy::unwrap_used)]

mod lifecycle_common;

use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::Arc;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use libtest_mimic::{Arguments, Trial};
use lifecycle_common::{Node, Setup, TestResult, check, make_nodes, trial};
use mesos_gpu_enforce::cgroup::CgroupVersion;
use mesos_gpu_enforce::mps::MpsConfig;
use mesos_gpu_health::{GpuRef, HealthPolicy, MonitorConfig};
use mesos_gpu_isolator::{
    lifecycle::CgroupMaker, lifecycle::ContainerId, lifecycle::Isolator, lifecycle::PoolConfig,
    lifecycle::PoolRole, lifecycle::PrepareConfig, lifecycle::RecoverState,
    lifecycle::SharingConfig,
};
use mesos_gpu_node::devices::DeviceNodes;
use mesos_gpu_node::{discovery::Discovery, discovery::GpuDriver};
use mesos_gpu_placement::allocator::Policy;
use mesos_gpu_placement::sharing::{ModeSpec, SharingMode, SharingSpec};
use mesos_gpu_testkit::nvml_sim::SimNode;
use mesos_gpu_testkit::{Host, Need, needs};
use serde_json::{Value, json};

/// Long enough for any event to arrive on a loaded 2-core machine; not a performance bound.
const PATIENCE: Duration = Duration::from_secs(10);

/// Framebuffer bytes the container's own process uses on each GPU.
const MINE: u64 = 1000;

fn main() -> ExitCode {
    let host = Host::probe();
    let mut trials: Vec<Trial> = Vec::new();
    for (version, need, tag) in [
        (CgroupVersion::V1, Need::Cgroup1, "v1"),
        (CgroupVersion::V2, Need::Cgroup2, "v2"),
    ] {
        let mut add = |name: &str, f: fn(CgroupVersion) -> TestResult| {
            let t = trial(format!("{tag}_{name}"), move || f(version));
            trials.push(needs(&host, &[Need::Root, need], t));
        };
        add(
            "failed_gpu_limits_its_owner_only",
            failed_gpu_limits_its_owner_only,
        );
        add(
            "health_changes_never_deadlock_the_lifecycle",
            health_changes_never_deadlock_the_lifecycle,
        );
        add(
            "usage_and_watch_in_mesos_cgroups",
            usage_and_watch_in_mesos_cgroups,
        );
        add(
            "share_owners_usage_and_a_failed_shared_gpu",
            share_owners_usage_and_failure,
        );
    }
    libtest_mimic::run(&Arguments::from_args(), trials).exit_code()
}

fn id(s: &str) -> ContainerId {
    ContainerId::new(s).unwrap()
}

fn gpus(n: f64) -> PrepareConfig {
    PrepareConfig {
        gpus: n,
        ..Default::default()
    }
}

/// A `sleep` child, killed on drop.
struct Sleeper(Child);

impl Sleeper {
    fn spawn() -> TestResult<Sleeper> {
        Ok(Sleeper(
            Command::new("sleep")
                .arg("600")
                .stdin(Stdio::null())
                .spawn()?,
        ))
    }

    fn pid(&self) -> u32 {
        self.0.id()
    }

    fn kill(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for Sleeper {
    fn drop(&mut self) {
        self.kill();
    }
}

/// `dgx1-v100` where `pid` uses [`MINE`] bytes and a stranger 9 bytes on every GPU.
fn node(pid: u32) -> TestResult<Node> {
    node_with(&[(pid, MINE)])
}

/// `dgx1-v100` where each `(pid, bytes)` and a stranger (9 bytes) use every GPU.
fn node_with(processes: &[(u32, u64)]) -> TestResult<Node> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../nvml-sim/topologies/dgx1-v100.json"
    );
    let mut value: Value = serde_json::from_str(&std::fs::read_to_string(path)?)?;
    let mut list: Vec<Value> = processes
        .iter()
        .map(|(pid, used)| json!({"pid": pid, "used_memory": used}))
        .collect();
    list.push(json!({"pid": 4_000_000, "used_memory": 9}));
    for gpu in value["gpus"].as_array_mut().ok_or("no gpus")? {
        gpu["processes"] = Value::Array(list.clone());
        gpu["utilization"] = json!({"gpu": 42, "memory": 7});
    }
    let sim = SimNode::from_json(&value.to_string());
    let inventory = open(&sim)?.inventory().clone();
    let dev = tempfile::Builder::new().prefix("mgpu-test-dev").tempdir()?;
    make_nodes(dev.path(), &inventory)?;
    let nodes = DeviceNodes::scan(dev.path(), &inventory)?;
    Ok(Node {
        sim,
        inventory,
        dev,
        nodes,
    })
}

fn open(sim: &SimNode) -> TestResult<Arc<GpuDriver>> {
    match GpuDriver::open(Some(&sim.lib_path()))? {
        Discovery::Driver(driver) => Ok(Arc::new(*driver)),
        Discovery::NoDriver(inv) => Err(format!("no driver: {:?}", inv.absent_reason).into()),
    }
}

fn monitor_config() -> MonitorConfig {
    MonitorConfig {
        policy: HealthPolicy::default(),
        wait_timeout: Duration::from_millis(20),
        retry_min: Duration::from_millis(10),
        retry_max: Duration::from_millis(40),
        ..MonitorConfig::default()
    }
}

/// A new isolator on `setup`'s work dir with health attached before `recover(states)`.
fn isolator(node: &Node, setup: &Setup, states: &[RecoverState]) -> TestResult<Arc<Isolator>> {
    let iso = Isolator::new(
        setup.config.clone(),
        node.inventory.clone(),
        node.nodes.clone(),
    )?;
    iso.attach_health(open(&node.sim)?, monitor_config())?;
    let monitor = iso.health_monitor().ok_or("no monitor")?;
    wait_until("events registered", || monitor.stats().registrations >= 1)?;
    iso.recover(states, &[])?;
    Ok(Arc::new(iso))
}

fn wait_until(what: &str, mut cond: impl FnMut() -> bool) -> TestResult {
    let deadline = Instant::now() + PATIENCE;
    while !cond() {
        if Instant::now() > deadline {
            return Err(format!("timed out waiting for {what}").into());
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    Ok(())
}

fn held(iso: &Isolator, c: &ContainerId) -> TestResult<Vec<u32>> {
    Ok(iso.status(c)?.gpus)
}

fn free(iso: &Isolator) -> TestResult<Vec<u32>> {
    Ok(iso.allocations()?.free)
}

/// In the cgroups Mesos makes (v1: its devices cgroup holds the process; v2: the process is in
/// `<id>/leaf`, below the cgroup the module knows), usage finds the container's process and
/// counts only its memory, and an XID on a held GPU resolves the container's watch.
fn usage_and_watch_in_mesos_cgroups(version: CgroupVersion) -> TestResult {
    let child = Sleeper::spawn()?;
    let node = node(child.pid())?;
    let mut setup = Setup::new(version)?;
    setup.config.policy = Policy::FirstFit;
    setup.config.cgroup_maker = CgroupMaker::Mesos;
    let dir = setup.guard.parent.join("mesos-c");
    let procs = match version {
        CgroupVersion::V1 => {
            std::fs::create_dir_all(&dir)?;
            std::fs::write(dir.join("devices.deny"), "a")?;
            std::fs::write(dir.join("devices.allow"), "c 1:3 rwm")?;
            dir.join("cgroup.procs")
        }
        CgroupVersion::V2 => {
            std::fs::create_dir_all(dir.join("leaf"))?;
            dir.join("leaf/cgroup.procs")
        }
    };
    std::fs::write(procs, child.pid().to_string())?;
    let iso = isolator(&node, &setup, &[])?;
    let c = id("mesos-c");
    iso.prepare(&c, gpus(2.0))?;
    iso.isolate(&c, child.pid())?;
    let usage = iso.usage(&c)?;
    check(usage.gpus.len() == 2, format!("{usage:?}"))?;
    for gpu in &usage.gpus {
        let nvml = gpu.nvml.as_ref().ok_or("no NVML figures")?;
        check(
            nvml.memory_used == Some(MINE) && nvml.pids.as_ref() == Some(&vec![child.pid()]),
            format!("the process in Mesos's cgroup is the container's: {nvml:?}"),
        )?;
    }
    let g = held(&iso, &c)?[0];
    node.sim.append_event(&format!("xid {g} 79"));
    let limitation = iso
        .watch(&c, Some(PATIENCE))?
        .ok_or("the watch never resolved")?;
    check(
        limitation.container == c.as_str() && limitation.gpu == g,
        format!("{limitation:?}"),
    )?;
    drop(child);
    lifecycle_common::kill_cgroup(&dir);
    iso.cleanup(&c)?;
    check(dir.is_dir(), "Mesos's cgroup is Mesos's to remove")?;
    Ok(())
}

fn failed_gpu_limits_its_owner_only(version: CgroupVersion) -> TestResult {
    let mut child = Sleeper::spawn()?;
    let node = node(child.pid())?;
    let mut setup = Setup::new(version)?;
    setup.config.policy = Policy::FirstFit;
    let iso = isolator(&node, &setup, &[])?;
    let (a, b) = (id("health-a"), id("health-b"));
    iso.prepare(&a, gpus(2.0))?;
    iso.prepare(&b, gpus(2.0))?;
    iso.isolate(&a, child.pid())?;
    let (a_gpus, b_gpus) = (held(&iso, &a)?, held(&iso, &b)?);
    check(
        a_gpus.iter().all(|i| !b_gpus.contains(i)),
        format!("A {a_gpus:?} and B {b_gpus:?} share a GPU"),
    )?;
    let g = a_gpus[0];

    // usage: NVML figures, memory of the container's own process only.
    for (c, mine, pids) in [(&a, MINE, vec![child.pid()]), (&b, 0, vec![])] {
        let usage = iso.usage(c)?;
        check(usage.gpus.len() == 2, format!("{c}: {usage:?}"))?;
        for gpu in &usage.gpus {
            let nvml = gpu.nvml.as_ref().ok_or(format!("{c}: no NVML figures"))?;
            check(
                nvml.index == gpu.index
                    && nvml.memory_used == Some(mine)
                    && nvml.pids.as_ref() == Some(&pids)
                    && nvml.utilization_gpu == Some(42),
                format!("{c}: {nvml:?}"),
            )?;
        }
    }

    let watch = |c: &ContainerId, timeout: Option<Duration>| {
        let (iso, c) = (Arc::clone(&iso), c.clone());
        std::thread::spawn(move || iso.watch(&c, timeout).map_err(|e| e.to_string()))
    };
    let watch_a = watch(&a, Some(PATIENCE));

    // An ignored XID is counted and changes nothing.
    let free_before = free(&iso)?;
    let monitor = iso.health_monitor().ok_or("no monitor")?;
    node.sim.append_event(&format!("xid {g} 13"));
    wait_until("XID 13 counted", || {
        monitor.records()[g as usize].xids.get(&13) == Some(&1)
    })?;
    check(free(&iso)? == free_before, "XID 13 changed the pool")?;
    check(
        iso.watch(&a, Some(Duration::ZERO))?.is_none(),
        "XID 13 limited A",
    )?;

    node.sim.append_event(&format!("xid {g} 79"));
    let limitation = watch_a.join().unwrap()?.ok_or("A's watch never resolved")?;
    check(
        limitation.container == a.as_str()
            && limitation.gpu == g
            && limitation.message.contains("XID 79"),
        format!("{limitation:?}"),
    )?;
    check(
        iso.watch(&b, Some(Duration::from_millis(200)))?.is_none(),
        "B's watch resolved for A's GPU",
    )?;
    check(!free(&iso)?.contains(&g), "failed GPU is free")?;

    // Cleanup of A: the failed GPU is not handed out again; A's limitation is forgotten.
    child.kill();
    iso.cleanup(&a)?;
    let left = free(&iso)?;
    check(
        !left.contains(&g) && left.len() == 8 - 2 - 1,
        format!("free {left:?}"),
    )?;
    let c = id("health-c");
    iso.prepare(&c, gpus(left.len() as f64))?;
    check(!held(&iso, &c)?.contains(&g), "failed GPU granted")?;
    check(
        iso.prepare(&id("health-d"), gpus(1.0))
            .is_err_and(|e| e.is_not_enough()),
        "more GPUs than healthy ones",
    )?;
    iso.cleanup(&c)?;
    iso.prepare(&a, gpus(1.0))?;
    check(
        iso.watch(&a, Some(Duration::ZERO))?.is_none(),
        "a new A inherited the old limitation",
    )?;
    iso.cleanup(&a)?;

    // A waiter of a container being cleaned up wakes with nothing.
    let waiter = watch(&b, Some(3 * PATIENCE));
    std::thread::sleep(Duration::from_millis(300));
    let cleaned = Instant::now();
    iso.cleanup(&b)?;
    check(
        waiter.join().unwrap()?.is_none() && cleaned.elapsed() < PATIENCE,
        "cleanup did not wake the waiter",
    )?;

    // The operator brings it back.
    let change = iso.mark_healthy(&GpuRef::Index(g))?;
    check(
        change.is_some_and(|c| c.index == g),
        "mark_healthy changed nothing",
    )?;
    check(free(&iso)?.contains(&g), "healthy GPU not back in the pool")?;
    check(iso.mark_healthy(&GpuRef::Index(g))?.is_none(), "twice")?;
    check(
        iso.mark_healthy(&GpuRef::Index(99))
            .is_err_and(|e| e.is_unknown_gpu()),
        "unknown GPU",
    )?;

    // Restart: B holds b0, which fails; h (free) fails too. Both stay out after a restart with
    // health attached before recovery, and B's watch resolves again.
    iso.prepare(&b, gpus(2.0))?;
    let b_gpus_now = held(&iso, &b)?;
    let b0 = b_gpus_now[0];
    let h = *free(&iso)?.last().ok_or("nothing free")?;
    node.sim.append_event(&format!("xid {b0} 79"));
    node.sim.append_event(&format!("xid {h} 48"));
    check(
        iso.watch(&b, Some(PATIENCE))?.is_some_and(|l| l.gpu == b0),
        "B not limited",
    )?;
    wait_until("GPU h unhealthy", || {
        monitor.health(h).is_some_and(|s| !s.is_healthy())
    })?;
    drop(monitor);
    drop(iso);
    let iso = isolator(
        &node,
        &setup,
        &[RecoverState {
            id: b.clone(),
            parent: None,
            nested_cgroup: None,
        }],
    )?;
    check(held(&iso, &b)? == b_gpus_now, "B's GPUs recovered")?;
    let after = free(&iso)?;
    check(
        !after.contains(&b0) && !after.contains(&h) && after.len() == 8 - 2 - 1,
        format!("free after restart {after:?}"),
    )?;
    check(
        iso.watch(&b, Some(PATIENCE))?.is_some_and(|l| l.gpu == b0),
        "B not limited after restart",
    )?;
    iso.cleanup(&b)?;
    check(!free(&iso)?.contains(&b0), "failed GPU freed by cleanup")
}

fn health_changes_never_deadlock_the_lifecycle(version: CgroupVersion) -> TestResult {
    let child = Sleeper::spawn()?;
    let node = Arc::new(node(child.pid())?);
    let setup = Setup::new(version)?;
    let iso = isolator(&node, &setup, &[])?;
    let (done_tx, done_rx) = mpsc::channel::<TestResult>();
    let rounds = 30;
    let mut workers = Vec::new();
    for w in 0..2 {
        let (iso, done) = (Arc::clone(&iso), done_tx.clone());
        workers.push(std::thread::spawn(move || {
            let run = || -> TestResult {
                for r in 0..rounds {
                    let c = id(&format!("dl-{w}-{r}"));
                    if iso.prepare(&c, gpus(1.0)).is_err() {
                        continue; // failed GPUs may leave too few
                    }
                    iso.usage(&c)?;
                    iso.watch(&c, Some(Duration::from_millis(1)))?;
                    iso.cleanup(&c)?;
                }
                Ok(())
            };
            let _ = done.send(run());
        }));
    }
    {
        let (iso, node, done) = (Arc::clone(&iso), Arc::clone(&node), done_tx.clone());
        workers.push(std::thread::spawn(move || {
            let run = || -> TestResult {
                for r in 0..rounds {
                    let g = r % 8;
                    node.sim.append_event(&format!("xid {g} 79"));
                    std::thread::sleep(Duration::from_millis(5));
                    iso.mark_healthy(&GpuRef::Index(g))?;
                }
                Ok(())
            };
            let _ = done.send(run());
        }));
    }
    drop(done_tx);
    for _ in 0..workers.len() {
        done_rx
            .recv_timeout(Duration::from_secs(60))
            .map_err(|_| "deadlock: a worker did not finish in 60 s")??;
    }
    for w in workers {
        w.join().map_err(|_| "worker panicked")?;
    }
    // Everything healthy again once the last events are seen.
    wait_until("all GPUs back", || {
        for g in 0..8 {
            let _ = iso.mark_healthy(&GpuRef::Index(g));
        }
        iso.allocations().is_ok_and(|a| a.free.len() == 8)
    })?;
    drop(child);
    Ok(())
}

/// Issue 17: two tasks holding shares of GPU 0 (shared two ways) each see in `usage` only their
/// own process and its memory on that GPU; an XID on it limits both owners.
fn share_owners_usage_and_failure(version: CgroupVersion) -> TestResult {
    let (a_proc, b_proc) = (Sleeper::spawn()?, Sleeper::spawn()?);
    let node = node_with(&[(a_proc.pid(), 1000), (b_proc.pid(), 2000)])?;
    let mut setup = Setup::new(version)?;
    setup.config.pool = Some(PoolConfig {
        dir: setup.work.path().join("pool"),
        role: PoolRole::Agent,
    });
    setup.config.sharing = Some(SharingConfig {
        spec: SharingSpec::parse("1,0=2", ModeSpec::uniform(SharingMode::TimeSlicing))?,
        mps: MpsConfig::new(setup.work.path().join("mps")),
    });
    let iso = isolator(&node, &setup, &[])?;
    let (a, b) = (id("share-a"), id("share-b"));
    for (c, p) in [(&a, &a_proc), (&b, &b_proc)] {
        iso.prepare(c, gpus(1.0))?;
        iso.isolate(c, p.pid())?;
        check(held(&iso, c)? == [0], format!("{c} holds a share of GPU 0"))?;
    }
    for (c, pid, used) in [(&a, a_proc.pid(), 1000), (&b, b_proc.pid(), 2000)] {
        let usage = iso.usage(c)?;
        let nvml = usage
            .gpus
            .first()
            .and_then(|g| g.nvml.as_ref())
            .ok_or(format!("{c}: no NVML figures: {usage:?}"))?;
        check(
            usage.gpus.len() == 1
                && nvml.index == 0
                && nvml.memory_used == Some(used)
                && nvml.pids.as_ref() == Some(&vec![pid]),
            format!("{c}: {nvml:?}"),
        )?;
    }
    node.sim.append_event("xid 0 79");
    for c in [&a, &b] {
        let limitation = iso
            .watch(c, Some(PATIENCE))?
            .ok_or(format!("{c} was not told"))?;
        check(
            limitation.gpu == 0 && limitation.message.contains("XID 79"),
            format!("{c}: {limitation:?}"),
        )?;
    }
    drop((a_proc, b_proc));
    for c in [&a, &b] {
        lifecycle_common::kill_cgroup(&iso.cgroup_path(c));
        iso.cleanup(c)?;
    }
    Ok(())
}
