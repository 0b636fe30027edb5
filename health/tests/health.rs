//! GPU health monitor and usage on nvml-sim: events appended to the simulated node's events file
//! reach the monitor's subscribers; usage matches real processes in real cgroups (root).

use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::mpsc::Receiver;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use libtest_mimic::{Arguments, Failed, Trial};
use mesos_gpu_health::{
    ChangeCallback, Failure, GpuRef, HealthChange, HealthError, HealthMonitor, HealthPolicy,
    HealthStore, Limitations, MonitorConfig, apply_to_allocator,
};
use mesos_gpu_node::{discovery::Discovery, discovery::GpuDriver};
use mesos_gpu_node::{usage::ContainerCgroup, usage::UsageReader};
use mesos_gpu_placement::{allocator::Allocator, allocator::GpuSet, allocator::Policy};
use mesos_gpu_testkit::nvml_sim::SimNode;
use mesos_gpu_testkit::{Host, Need, needs, unique_name};
use serde_json::{Value, json};

type TestResult = Result<(), Failed>;

/// Long enough for any event to arrive on a loaded 2-core machine; not a performance bound.
const PATIENCE: Duration = Duration::from_secs(5);

fn ensure(cond: bool, msg: impl Into<String>) -> TestResult {
    if cond { Ok(()) } else { Err(msg.into().into()) }
}

/// `pcie-t4x4` with ECC on every GPU, changed by `edit`.
fn node(edit: impl FnOnce(&mut Value)) -> SimNode {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../nvml-sim/topologies/pcie-t4x4.json"
    );
    let mut value: Value =
        serde_json::from_str(&std::fs::read_to_string(path).expect("topology")).expect("json");
    for gpu in value["gpus"].as_array_mut().expect("gpus") {
        gpu["ecc"] = json!({});
    }
    edit(&mut value);
    SimNode::from_json(&value.to_string())
}

fn open(sim: &SimNode) -> Result<Arc<GpuDriver>, Failed> {
    match GpuDriver::open(Some(&sim.lib_path())).map_err(|e| format!("{e:#}"))? {
        Discovery::Driver(driver) => Ok(Arc::new(*driver)),
        Discovery::NoDriver(inv) => Err(format!("no driver: {:?}", inv.absent_reason).into()),
    }
}

fn config(policy: &str) -> MonitorConfig {
    MonitorConfig {
        policy: HealthPolicy::parse(policy).expect("policy"),
        wait_timeout: Duration::from_millis(20),
        retry_min: Duration::from_millis(10),
        retry_max: Duration::from_millis(40),
        ..MonitorConfig::default()
    }
}

struct Running {
    monitor: HealthMonitor,
    changes: Receiver<HealthChange>,
    _driver: Arc<GpuDriver>,
}

fn start(
    sim: &SimNode,
    config: MonitorConfig,
    callbacks: Vec<ChangeCallback>,
) -> Result<Running, Failed> {
    let driver = open(sim)?;
    let monitor =
        HealthMonitor::start(Arc::clone(&driver), config, callbacks).map_err(|e| e.to_string())?;
    let changes = monitor.subscribe();
    wait_until("events registered", || monitor.stats().registrations >= 1)?;
    Ok(Running {
        monitor,
        changes,
        _driver: driver,
    })
}

fn wait_until(what: &str, mut cond: impl FnMut() -> bool) -> TestResult {
    let deadline = Instant::now() + PATIENCE;
    while !cond() {
        if Instant::now() > deadline {
            return Err(format!("timed out waiting for {what}").into());
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    Ok(())
}

fn next(r: &Running) -> Result<HealthChange, Failed> {
    r.changes
        .recv_timeout(PATIENCE)
        .map_err(|_| Failed::from("no health change arrived"))
}

fn healthy(r: &Running, indices: &[u32]) -> TestResult {
    for &i in indices {
        let h = r.monitor.health(i);
        ensure(
            h.as_ref().is_some_and(|h| h.is_healthy()),
            format!("GPU {i}: {h:?}"),
        )?;
    }
    Ok(())
}

fn xid79_takes_the_gpu_out_and_tells_its_holder() -> TestResult {
    let sim = node(|_| {});
    let driver = open(&sim)?;
    let mut alloc =
        Allocator::new(driver.inventory(), Policy::FirstFit).map_err(|e| e.to_string())?;
    alloc
        .allocate_specific(
            "task-1",
            GpuSet::from_indices([2, 3]).map_err(|e| e.to_string())?,
        )
        .map_err(|e| e.to_string())?;
    let alloc = Arc::new(Mutex::new(alloc));
    let limits = Arc::new(Limitations::new());
    let callback: ChangeCallback = {
        let (alloc, limits) = (Arc::clone(&alloc), Arc::clone(&limits));
        Arc::new(move |change: &HealthChange| {
            let mut alloc = alloc.lock().expect("allocator lock");
            if let Ok(Some(limitation)) = apply_to_allocator(&mut alloc, change) {
                limits.resolve(limitation);
            }
        })
    };
    let r = start(&sim, config(""), vec![callback])?;
    sim.append_event("xid 2 79");
    let change = next(&r)?;
    ensure(change.index == 2, format!("{change:?}"))?;
    let limitation = limits
        .wait("task-1", Some(PATIENCE))
        .ok_or("watch(task-1) never resolved")?;
    let want = format!(
        "GPU 2 ({}) failed: XID 79 (GPU has fallen off the bus)",
        change.uuid
    );
    ensure(
        limitation.message == want,
        format!("{} != {want}", limitation.message),
    )?;
    let alloc = alloc.lock().expect("allocator lock");
    ensure(
        alloc.unhealthy().to_vec() == [2],
        format!("unhealthy {}", alloc.unhealthy()),
    )?;
    ensure(
        alloc.free().to_vec() == [0, 1],
        format!("free {}", alloc.free()),
    )?;
    healthy(&r, &[0, 1, 3])?;
    ensure(
        r.monitor.records()[2].xids.get(&79) == Some(&1),
        "XID 79 counted",
    )
}

fn ignored_xids_change_nothing() -> TestResult {
    let sim = node(|_| {});
    let r = start(&sim, config("94"), vec![])?;
    for line in [
        "xid 0 13",
        "xid 1 43",
        "xid 0 31",
        "xid 1 94",
        "xid 0 109",
        "xid 3 48",
    ] {
        sim.append_event(line);
    }
    let change = next(&r)?;
    ensure(
        change.index == 3 && change.health.failure() == Some(&Failure::Xid { xid: 48 }),
        format!("{change:?}"),
    )?;
    healthy(&r, &[0, 1, 2])?;
    let records = r.monitor.records();
    ensure(
        records[0].xids.get(&13) == Some(&1) && records[1].xids.get(&94) == Some(&1),
        "ignored XIDs still counted",
    )
}

fn disabled_checks_ignore_everything() -> TestResult {
    let sim = node(|_| {});
    let r = start(&sim, config("all,+48"), vec![])?;
    for line in ["xid 0 79", "ecc-dbe 1", "lost 2", "xid 3 48"] {
        sim.append_event(line);
    }
    let change = next(&r)?;
    ensure(
        change.index == 3,
        format!("only the explicitly counted XID 48: {change:?}"),
    )?;
    healthy(&r, &[0, 1, 2])?;

    let sim = node(|_| {});
    let driver = open(&sim)?;
    let monitor = HealthMonitor::start(Arc::clone(&driver), config("all"), vec![])
        .map_err(|e| e.to_string())?;
    let changes = monitor.subscribe();
    for line in ["xid 0 79", "ecc-dbe 1", "lost 2"] {
        sim.append_event(line);
    }
    ensure(
        changes.recv_timeout(Duration::from_millis(300)).is_err(),
        "checks off: no change",
    )?;
    ensure(
        monitor.stats().registrations == 0,
        "checks off: no event set",
    )?;
    ensure(
        (0..4).all(|i| monitor.health(i).is_some_and(|h| h.is_healthy())),
        "all healthy",
    )
}

fn double_bit_ecc_marks_single_bit_does_not() -> TestResult {
    let sim = node(|_| {});
    let r = start(&sim, config(""), vec![])?;
    sim.append_event("ecc-sbe 0");
    sim.append_event("ecc-dbe 1");
    let change = next(&r)?;
    ensure(
        change.index == 1 && change.health.failure() == Some(&Failure::DoubleBitEcc),
        format!("{change:?}"),
    )?;
    let limitation = change.limitation().unwrap_or_default();
    ensure(limitation.contains("double-bit ECC"), limitation)?;
    healthy(&r, &[0, 2, 3])?;
    let records = r.monitor.records();
    ensure(
        records[0].ecc_single_bit == 1 && records[1].ecc_double_bit == 1,
        format!("{records:?}"),
    )
}

fn lost_gpu_is_lost_until_the_operator_says() -> TestResult {
    let sim = node(|_| {});
    let mut cfg = config("");
    cfg.quiet_period = Some(Duration::from_millis(50));
    let r = start(&sim, cfg, vec![])?;
    sim.append_event("lost 3");
    let change = next(&r)?;
    ensure(
        change.index == 3 && change.health.failure() == Some(&Failure::Lost),
        format!("{change:?}"),
    )?;
    ensure(
        r.changes.recv_timeout(Duration::from_millis(300)).is_err(),
        "lost GPUs do not recover by themselves",
    )?;
    healthy(&r, &[0, 1, 2])?;
    // The operator's word is refused while NVML still says so (issue 14's test below).
    ensure(
        r.monitor.mark_healthy(&GpuRef::Index(3)).is_err(),
        "still lost",
    )?;
    // A GPU failed by an XID is the operator's to bring back.
    sim.append_event("xid 1 62");
    ensure(next(&r)?.index == 1, "XID 62 fails GPU 1")?;
    let back = r
        .monitor
        .mark_healthy(&GpuRef::Index(1))
        .map_err(|e| e.to_string())?;
    ensure(
        back.is_some_and(|c| c.health.is_healthy()),
        "mark_healthy returns the change",
    )?;
    ensure(next(&r)?.health.is_healthy(), "subscribers hear of it")
}

fn issue_14_a_gpu_nvml_reports_lost_cannot_be_marked_healthy() -> TestResult {
    let sim = node(|_| {});
    let work = tempfile::tempdir().map_err(|e| e.to_string())?;
    let mut cfg = config("");
    cfg.work_dir = Some(work.path().to_owned());
    let store = HealthStore::at(work.path());
    let r = start(&sim, cfg, vec![])?;
    sim.append_event("lost 2");
    ensure(next(&r)?.index == 2, "GPU 2 lost")?;
    let err = r
        .monitor
        .mark_healthy(&GpuRef::Index(2))
        .expect_err("refused");
    ensure(
        matches!(err, HealthError::StillLost { .. })
            && err
                .to_string()
                .starts_with("GPU 2 is still lost: NVML answers NVML_ERROR_GPU_IS_LOST"),
        err.to_string(),
    )?;
    // Through a request, as `mesos-gpu gpu mark-healthy` asks a running agent.
    let request = store
        .request_mark_healthy(&GpuRef::Index(2))
        .map_err(|e| e.to_string())?;
    wait_until("the request is taken", || !request.exists())?;
    let answer = store
        .take_answer(&request)
        .map_err(|e| e.to_string())?
        .ok_or("no answer")?;
    ensure(
        !answer.ok && answer.message.contains("still lost"),
        format!("{answer:?}"),
    )?;
    ensure(
        r.monitor.health(2).is_some_and(|h| !h.is_healthy()),
        "GPU 2 stays out of the pool",
    )
}

fn issue_14_a_request_is_checkpointed_before_it_disappears() -> TestResult {
    let sim = node(|_| {});
    let work = tempfile::tempdir().map_err(|e| e.to_string())?;
    let mut cfg = config("");
    cfg.work_dir = Some(work.path().to_owned());
    let store = HealthStore::at(work.path());
    let r = start(&sim, cfg, vec![])?;
    for round in 0..30 {
        sim.append_event("xid 1 62");
        ensure(next(&r)?.index == 1, format!("round {round}: GPU 1 failed"))?;
        let request = store
            .request_mark_healthy(&GpuRef::Index(1))
            .map_err(|e| e.to_string())?;
        let deadline = Instant::now() + PATIENCE;
        while request.exists() {
            ensure(Instant::now() < deadline, "the request is taken")?;
            std::hint::spin_loop();
        }
        // What the command reads the moment the request is gone.
        let saved = store
            .load()
            .map_err(|e| e.to_string())?
            .ok_or("no checkpoint")?;
        ensure(
            saved.gpus[1].health.is_healthy(),
            format!(
                "round {round}: the checkpoint still says {:?}",
                saved.gpus[1].health
            ),
        )?;
        let answer = store.take_answer(&request).map_err(|e| e.to_string())?;
        ensure(
            answer.as_ref().is_some_and(|a| a.ok),
            format!("round {round}: {answer:?}"),
        )?;
        ensure(next(&r)?.health.is_healthy(), "subscribers hear of it")?;
    }
    Ok(())
}

fn quiet_period_brings_it_back() -> TestResult {
    let sim = node(|_| {});
    let mut cfg = config("");
    cfg.quiet_period = Some(Duration::from_millis(150));
    let r = start(&sim, cfg, vec![])?;
    sim.append_event("xid 1 62");
    let down = next(&r)?;
    ensure(
        down.index == 1 && !down.health.is_healthy(),
        format!("{down:?}"),
    )?;
    let up = next(&r)?;
    ensure(up.index == 1 && up.health.is_healthy(), format!("{up:?}"))
}

fn checkpoint_requests_and_restart() -> TestResult {
    let sim = node(|_| {});
    let work = tempfile::tempdir().map_err(|e| e.to_string())?;
    let mut cfg = config("");
    cfg.work_dir = Some(work.path().to_owned());
    let store = HealthStore::at(work.path());
    {
        let r = start(&sim, cfg.clone(), vec![])?;
        let again = HealthMonitor::start(open(&sim)?, cfg.clone(), vec![]);
        ensure(
            again.is_err_and(|e| e.to_string().contains("another GPU health monitor")),
            "one monitor per work dir",
        )?;
        sim.append_event("xid 0 94");
        sim.append_event("xid 2 74");
        ensure(next(&r)?.index == 0 && next(&r)?.index == 2, "two failures")?;
        let request = store
            .request_mark_healthy(&GpuRef::Index(0))
            .map_err(|e| e.to_string())?;
        let up = next(&r)?;
        ensure(up.index == 0 && up.health.is_healthy(), format!("{up:?}"))?;
        wait_until("the request is answered", || !request.exists())?;
    }
    let saved = store
        .load()
        .map_err(|e| e.to_string())?
        .ok_or("no checkpoint")?;
    ensure(
        saved.gpus[0].health.is_healthy() && !saved.gpus[2].health.is_healthy(),
        format!("{saved:?}"),
    )?;

    let restored = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::clone(&restored);
    let callback: ChangeCallback =
        Arc::new(move |c: &HealthChange| seen.lock().expect("lock").push(c.clone()));
    let r = start(&sim, cfg, vec![callback])?;
    let restored = restored.lock().expect("lock").clone();
    ensure(
        restored.len() == 1 && restored[0].index == 2 && restored[0].restored,
        format!("{restored:?}"),
    )?;
    ensure(
        r.monitor
            .health(2)
            .is_some_and(|h| h.failure() == Some(&Failure::Xid { xid: 74 })),
        "restored reason",
    )
}

fn event_loop_failure_is_retried_not_blamed_on_gpus() -> TestResult {
    let sim = node(|v| v["fail"] = json!({"nvmlEventSetWait_v2": "NVML_ERROR_UNKNOWN"}));
    let driver = open(&sim)?;
    let monitor =
        HealthMonitor::start(Arc::clone(&driver), config(""), vec![]).map_err(|e| e.to_string())?;
    let changes = monitor.subscribe();
    wait_until("three loop failures", || monitor.stats().loop_failures >= 3)?;
    let stats = monitor.stats();
    ensure(
        stats.registrations >= 3,
        format!("each retry registers again: {stats:?}"),
    )?;
    ensure(changes.try_recv().is_err(), "no GPU changed")?;
    ensure(
        (0..4).all(|i| monitor.health(i).is_some_and(|h| h.is_healthy())),
        "all healthy",
    )
}

fn registration_errors_are_per_gpu() -> TestResult {
    let sim = node(|v| {
        v["gpus"][0]["fail"] = json!({"nvmlDeviceRegisterEvents": "NVML_ERROR_UNKNOWN"});
        v["gpus"][1]["fail"] = json!({"nvmlDeviceRegisterEvents": "NVML_ERROR_NOT_SUPPORTED"});
    });
    let driver = open(&sim)?;
    let monitor =
        HealthMonitor::start(Arc::clone(&driver), config(""), vec![]).map_err(|e| e.to_string())?;
    let changes = monitor.subscribe();
    wait_until("registration", || monitor.stats().registrations >= 1)?;
    let gpu0 = monitor.health(0);
    ensure(
        matches!(
            gpu0.as_ref().and_then(|h| h.failure()),
            Some(Failure::Unwatchable { .. })
        ),
        format!("{gpu0:?}"),
    )?;
    ensure(
        monitor.health(1).is_some_and(|h| h.is_healthy()),
        "NOT_SUPPORTED: healthy, unwatched",
    )?;
    sim.append_event("xid 1 79");
    sim.append_event("xid 2 79");
    // GPU 0's own change may arrive before or after subscribing; skip it.
    let change = std::iter::from_fn(|| changes.recv_timeout(PATIENCE).ok())
        .find(|c| c.index != 0)
        .ok_or("no change")?;
    ensure(
        change.index == 2,
        format!("GPU 1 is unwatched, GPU 2 watched: {change:?}"),
    )
}

/// A `sleep` child moved into a fresh cgroup; killed and the cgroup removed on drop.
struct Caged {
    child: Child,
    dirs: Vec<std::path::PathBuf>,
}

impl Caged {
    fn spawn(dirs: Vec<std::path::PathBuf>) -> Result<Caged, Failed> {
        let child = Command::new("sleep")
            .arg("60")
            .stdin(Stdio::null())
            .spawn()
            .map_err(|e| e.to_string())?;
        let caged = Caged { child, dirs };
        for dir in &caged.dirs {
            std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
            std::fs::write(dir.join("cgroup.procs"), caged.child.id().to_string())
                .map_err(|e| format!("{}: {e}", dir.display()))?;
        }
        Ok(caged)
    }
}

impl Drop for Caged {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        for dir in &self.dirs {
            for _ in 0..100 {
                if std::fs::remove_dir(dir).is_ok() || !dir.exists() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }
}

fn usage_matches_processes_to_their_container() -> TestResult {
    let v2 = mesos_gpu_testkit::cgroup2_root().ok_or("no cgroup2")?;
    let v1 = std::path::Path::new("/sys/fs/cgroup/devices");
    let (a, b) = (unique_name("usage-a"), unique_name("usage-b"));
    let mine = Caged::spawn(vec![v2.join(&a), v1.join(&a)])?;
    let other = Caged::spawn(vec![v2.join(&b), v1.join(&b)])?;
    let (pa, pb) = (mine.child.id(), other.child.id());
    let sim = node(|v| {
        v["gpus"][0]["processes"] =
            json!([{"pid": pa, "used_memory": 1000}, {"pid": pb, "used_memory": 7}]);
        v["gpus"][0]["utilization"] = json!({"gpu": 55, "memory": 20});
        if let Some(gpu) = v["gpus"][1].as_object_mut() {
            gpu.remove("utilization");
        }
        v["gpus"][1]["processes"] =
            json!([{"pid": pa, "used_memory": 300}, {"pid": 4_000_000, "used_memory": 9}]);
        v["gpus"][2]["processes"] = json!([{"pid": pb, "used_memory": 5}]);
    });
    let driver = open(&sim)?;
    let gpus = &driver.inventory().gpus[0..3];
    let reader = UsageReader::default();
    for cgroup in [
        ContainerCgroup::V2 {
            path: format!("/{a}"),
        },
        ContainerCgroup::V1 {
            devices: format!("/{a}"),
        },
    ] {
        let usage = reader.container_usage(&driver, gpus, &cgroup);
        let figures: Vec<_> = usage
            .gpus
            .iter()
            .map(|g| (g.index, g.memory_used, g.pids.clone()))
            .collect();
        let want = vec![
            (0, Some(1000), Some(vec![pa])),
            (1, Some(300), Some(vec![pa])),
            (2, Some(0), Some(vec![])),
        ];
        ensure(
            figures == want,
            format!("{cgroup:?}: {figures:?} != {want:?}"),
        )?;
        ensure(
            usage.gpus[0].utilization_gpu == Some(55) && usage.gpus[1].utilization_gpu.is_none(),
            "utilization as NVML has it",
        )?;
        ensure(
            usage.gpus[0].memory_total == Some(driver.inventory().gpus[0].memory_total),
            "memory total",
        )?;
    }
    let theirs = reader.container_usage(
        &driver,
        gpus,
        &ContainerCgroup::V2 {
            path: format!("/{b}"),
        },
    );
    ensure(
        theirs.gpus[0].memory_used == Some(7) && theirs.gpus[2].memory_used == Some(5),
        format!("{theirs:?}"),
    )
}

fn main() -> ExitCode {
    let host = Host::probe();
    let plain = |name: &str, f: fn() -> TestResult| Trial::test(name, f);
    let trials = vec![
        plain(
            "xid79_takes_the_gpu_out_and_tells_its_holder",
            xid79_takes_the_gpu_out_and_tells_its_holder,
        ),
        plain("ignored_xids_change_nothing", ignored_xids_change_nothing),
        plain(
            "disabled_checks_ignore_everything",
            disabled_checks_ignore_everything,
        ),
        plain(
            "double_bit_ecc_marks_single_bit_does_not",
            double_bit_ecc_marks_single_bit_does_not,
        ),
        plain(
            "lost_gpu_is_lost_until_the_operator_says",
            lost_gpu_is_lost_until_the_operator_says,
        ),
        plain(
            "issue_14_a_gpu_nvml_reports_lost_cannot_be_marked_healthy",
            issue_14_a_gpu_nvml_reports_lost_cannot_be_marked_healthy,
        ),
        plain(
            "issue_14_a_request_is_checkpointed_before_it_disappears",
            issue_14_a_request_is_checkpointed_before_it_disappears,
        ),
        plain("quiet_period_brings_it_back", quiet_period_brings_it_back),
        plain(
            "checkpoint_requests_and_restart",
            checkpoint_requests_and_restart,
        ),
        plain(
            "event_loop_failure_is_retried_not_blamed_on_gpus",
            event_loop_failure_is_retried_not_blamed_on_gpus,
        ),
        plain(
            "registration_errors_are_per_gpu",
            registration_errors_are_per_gpu,
        ),
        needs(
            &host,
            &[Need::Root, Need::Cgroup1, Need::Cgroup2],
            Trial::test(
                "usage_matches_processes_to_their_container",
                usage_matches_processes_to_their_container,
            ),
        ),
    ];
    libtest_mimic::run(&Arguments::from_args(), trials).exit_code()
}
