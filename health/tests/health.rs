//! GPU health monitor and usage on nvml-sim: events appended to the simulated node's events file
//! reach the monitor's subscribers; usage matches real processes in real cgroups (root).

use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::mpsc::Receiver;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use libtest_mimic::{Arguments, Failed, Trial};
use mesos_gpu_enforce::cgroup::CgroupVersion;
use mesos_gpu_health::{
    ChangeCallback, Check, Failure, GpuRef, HealthChange, HealthError, HealthMonitor, HealthPolicy,
    HealthStore, Limitations, MonitorConfig, ProbeConfig, QuietTimes, RecoveryConfig,
    apply_to_allocator,
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

fn xid79_takes_the_gpu_out_and_tells_its_owner() -> TestResult {
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
        "GPU 2 ({}) failed: XID 79 (GPU has fallen off the bus); it needs a node reboot",
        change.uuid
    );
    ensure(
        limitation.message.starts_with(&want),
        format!("{} does not start with {want}", limitation.message),
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
    cfg.recovery = Some(recovery(&Probe::new()?, 50));
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

fn a_gpu_nvml_reports_lost_cannot_be_marked_healthy() -> TestResult {
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

fn a_request_is_checkpointed_before_it_disappears() -> TestResult {
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

/// A probe command whose outcome a test sets: it appends `<index> <CUDA_VISIBLE_DEVICES>` to a
/// log, then fails while `fail` exists.
struct Probe {
    dir: tempfile::TempDir,
}

impl Probe {
    fn new() -> Result<Probe, Failed> {
        Ok(Probe {
            dir: tempfile::tempdir().map_err(|e| e.to_string())?,
        })
    }

    fn config(&self) -> ProbeConfig {
        let log = self.dir.path().join("runs");
        let fail = self.dir.path().join("fail");
        let script = format!(
            r#"echo "$1 $CUDA_VISIBLE_DEVICES" >> {log}; if test -e {fail}; then echo "cuMemAlloc failed" >&2; exit 1; fi"#,
            log = log.display(),
            fail = fail.display()
        );
        ProbeConfig::command(vec![
            "sh".into(),
            "-c".into(),
            script,
            "probe".into(),
            "{index}".into(),
        ])
    }

    fn set_failing(&self, failing: bool) -> TestResult {
        let fail = self.dir.path().join("fail");
        if failing {
            std::fs::write(&fail, b"").map_err(|e| e.to_string())?;
        } else {
            let _ = std::fs::remove_file(&fail);
        }
        Ok(())
    }

    /// The GPU indices probed so far, in order.
    fn runs(&self) -> Vec<u32> {
        std::fs::read_to_string(self.dir.path().join("runs"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.split(' ').next()?.parse().ok())
            .collect()
    }
}

/// Recovery with `quiet_ms` for every class and quick retries (100 ms doubling to 800 ms).
fn recovery(probe: &Probe, quiet_ms: u64) -> RecoveryConfig {
    let mut r = RecoveryConfig::new(probe.config());
    r.quiet = QuietTimes::uniform(Duration::from_millis(quiet_ms));
    r.retry_min = Duration::from_millis(100);
    r.retry_max = Duration::from_millis(800);
    r
}

/// `pcie-t4x4` (ECC on) whose GPUs report the recovery action field and a row remapper, as an
/// H200 with driver 580 does.
fn recovery_node() -> SimNode {
    node(|v| {
        for gpu in v["gpus"].as_array_mut().expect("gpus") {
            gpu["recovery_action"] = json!("none");
            gpu["remapped_rows"] = json!({});
        }
    })
}

fn findings(r: &Running, index: u32) -> String {
    r.monitor.records()[index as usize]
        .recovery
        .episode
        .as_ref()
        .map(|e| format!("{:?}", e.findings))
        .unwrap_or_default()
}

fn xid_94_comes_back_once_the_probe_passes_and_not_before() -> TestResult {
    let sim = recovery_node();
    let probe = Probe::new()?;
    probe.set_failing(true)?;
    let mut cfg = config("");
    cfg.recovery = Some(recovery(&probe, 200));
    let r = start(&sim, cfg, vec![])?;
    sim.append_event("xid 1 94");
    let down = next(&r)?;
    ensure(
        down.index == 1
            && down
                .limitation()
                .is_some_and(|l| l.contains("it comes back by itself")),
        format!("{down:?}"),
    )?;
    // The probe fails: the GPU stays out and the failure is counted and backed off.
    wait_until("a failed probe", || {
        r.monitor.records()[1].recovery.probe_failures >= 1
    })?;
    ensure(
        r.monitor.health(1).is_some_and(|h| !h.is_healthy()),
        "out while the probe fails",
    )?;
    let episode = r.monitor.records()[1]
        .recovery
        .episode
        .clone()
        .ok_or("no episode")?;
    let probe_finding = episode
        .findings
        .iter()
        .find(|f| f.check == Check::Probe)
        .ok_or("no probe finding")?;
    ensure(
        !probe_finding.ok && probe_finding.detail.contains("cuMemAlloc failed"),
        format!("{:?}", episode.findings),
    )?;
    ensure(
        episode
            .findings
            .iter()
            .filter(|f| f.check != Check::Probe)
            .all(|f| f.ok),
        format!("only the probe failed: {:?}", episode.findings),
    )?;
    probe.set_failing(false)?;
    let up = next(&r)?;
    ensure(up.index == 1 && up.health.is_healthy(), format!("{up:?}"))?;
    let record = &r.monitor.records()[1];
    ensure(
        record.recovery.recoveries == 1 && record.recovery.episode.is_none(),
        format!("{:?}", record.recovery),
    )?;
    ensure(
        probe.runs().iter().all(|&i| i == 1),
        format!("only GPU 1 was probed: {:?}", probe.runs()),
    )?;
    healthy(&r, &[0, 1, 2, 3])
}

fn a_pending_row_remapping_keeps_xid_63_out_until_a_reset() -> TestResult {
    let sim = recovery_node();
    let probe = Probe::new()?;
    let mut cfg = config("");
    cfg.recovery = Some(recovery(&probe, 100));
    let r = start(&sim, cfg, vec![])?;
    sim.append_event("remap-pending 2");
    sim.append_event("xid 2 63");
    ensure(next(&r)?.index == 2, "XID 63 takes GPU 2 out")?;
    wait_until("a recovery check", || {
        findings(&r, 2).contains("a row remapping is pending")
    })?;
    std::thread::sleep(Duration::from_millis(500));
    ensure(
        r.changes.try_recv().is_err() && probe.runs().is_empty(),
        format!(
            "no probe while the driver's evidence is missing: {:?}",
            probe.runs()
        ),
    )?;
    // The operator resets the GPU: the remapping is done, and it comes back by itself.
    sim.append_event("reset 2");
    let up = next(&r)?;
    ensure(up.index == 2 && up.health.is_healthy(), format!("{up:?}"))?;
    ensure(probe.runs() == [2], format!("{:?}", probe.runs()))
}

fn failures_needing_a_reset_never_come_back_by_themselves() -> TestResult {
    let sim = recovery_node();
    let probe = Probe::new()?;
    let mut cfg = config("");
    cfg.recovery = Some(recovery(&probe, 50));
    let r = start(&sim, cfg, vec![])?;
    // 48 (double-bit ECC), 64 with a failed remapping, 95 (uncontained), 79 (off the bus).
    sim.append_event("xid 0 48");
    sim.append_event("remap-failure 1");
    sim.append_event("xid 1 64");
    sim.append_event("recovery-action 2 gpu_reset");
    sim.append_event("xid 2 95");
    sim.append_event("lost 3");
    let mut down = Vec::new();
    for _ in 0..4 {
        down.push(next(&r)?);
    }
    down.sort_by_key(|c| c.index);
    let messages: Vec<String> = down.iter().filter_map(HealthChange::limitation).collect();
    ensure(
        messages[0].contains("XID 48") && messages[0].contains("nvidia-smi -r -i 0"),
        format!("{messages:?}"),
    )?;
    ensure(
        messages[1].contains("XID 64") && messages[1].contains("nvidia-smi -r -i 1"),
        format!("{messages:?}"),
    )?;
    ensure(
        messages[2].contains("the driver asks for a GPU reset"),
        format!("{messages:?}"),
    )?;
    ensure(messages[3].contains("node reboot"), format!("{messages:?}"))?;
    std::thread::sleep(Duration::from_millis(800));
    ensure(
        r.changes.try_recv().is_err() && probe.runs().is_empty(),
        format!("nothing comes back, nothing is probed: {:?}", probe.runs()),
    )?;
    // The operator's word still works, and says what was missing; not while the driver asks
    // for a reset.
    let missing = r
        .monitor
        .missing_evidence(&GpuRef::Index(0))
        .map_err(|e| e.to_string())?;
    ensure(
        missing == ["the failure needs a GPU reset: it never comes back by itself"],
        format!("{missing:?}"),
    )?;
    let err = r
        .monitor
        .mark_healthy(&GpuRef::Index(2))
        .expect_err("refused while the driver asks for a reset");
    ensure(
        matches!(err, HealthError::DriverAsks { .. }) && err.to_string().contains("a GPU reset"),
        err.to_string(),
    )?;
    sim.append_event("reset 2");
    let back = r
        .monitor
        .mark_healthy(&GpuRef::Index(2))
        .map_err(|e| e.to_string())?;
    ensure(
        back.is_some_and(|c| c.health.is_healthy()),
        "marked after the reset",
    )?;
    ensure(
        r.monitor.health(0).is_some_and(|h| !h.is_healthy()),
        "XID 48 stays out",
    )
}

/// Each XID the issue names, on a driver reporting no recovery action and nothing pending, with a
/// probe that passes: what the policy table says happens. 13, 31 and 43 change nothing; 63 and 94
/// come back by themselves, probed; 48, 64 and 95 need a GPU reset and 79 a node reboot: out for
/// good, never probed.
fn each_xid_ends_as_the_policy_table_says() -> TestResult {
    // (events on GPUs 0-3, the XIDs that come back, what each GPU that goes out is told)
    let rounds: [(&[&str], &[u32], [&str; 4]); 2] = [
        (
            &[
                "xid 0 13", "xid 0 31", "xid 0 43", "xid 1 48", "xid 2 64", "xid 3 95",
            ],
            &[],
            ["", "XID 48", "XID 64", "XID 95"],
        ),
        (
            &["xid 0 63", "xid 1 79", "xid 2 94"],
            &[0, 2],
            ["XID 63", "XID 79", "XID 94", ""],
        ),
    ];
    for (events, back, told) in rounds {
        let sim = recovery_node();
        let probe = Probe::new()?;
        let mut cfg = config("");
        cfg.recovery = Some(recovery(&probe, 100));
        let r = start(&sim, cfg, vec![])?;
        for line in events {
            sim.append_event(line);
        }
        let out = told.iter().filter(|t| !t.is_empty()).count();
        let mut changes = Vec::new();
        for _ in 0..out + back.len() {
            changes.push(next(&r)?);
        }
        std::thread::sleep(Duration::from_millis(800));
        ensure(
            r.changes.try_recv().is_err(),
            format!("{events:?}: no other change"),
        )?;
        for (index, told) in (0u32..).zip(told) {
            let mine: Vec<&HealthChange> = changes.iter().filter(|c| c.index == index).collect();
            let comes_back = back.contains(&index);
            match (told.is_empty(), comes_back) {
                (true, _) => ensure(mine.is_empty(), format!("GPU {index}: {mine:?}"))?,
                (false, _) => {
                    let message = mine
                        .first()
                        .and_then(|c| c.limitation())
                        .unwrap_or_default();
                    let how = if comes_back {
                        "it comes back by itself"
                    } else if told == "XID 79" {
                        "it needs a node reboot"
                    } else {
                        "it needs a GPU reset"
                    };
                    ensure(
                        message.contains(told) && message.contains(how),
                        format!("GPU {index}: {message:?} should name {told} and say {how:?}"),
                    )?;
                    ensure(
                        mine.last().is_some_and(|c| c.health.is_healthy()) == comes_back,
                        format!("GPU {index} ({told}) back: {comes_back}? {mine:?}"),
                    )?;
                }
            }
        }
        let mut probed = probe.runs();
        probed.sort_unstable();
        probed.dedup();
        ensure(
            probed == back,
            format!("{events:?}: probed {probed:?}, only {back:?} may be"),
        )?;
    }
    Ok(())
}

fn a_flapping_gpu_is_backed_off_not_probed_in_a_loop() -> TestResult {
    let sim = recovery_node();
    let probe = Probe::new()?;
    let mut cfg = config("");
    let mut rc = recovery(&probe, 100);
    rc.retry_max = Duration::from_millis(1600);
    cfg.recovery = Some(rc);
    let r = start(&sim, cfg, vec![])?;
    // Fails, comes back, fails again at once: each quiet time doubles (100, 200, 400, 800 ms).
    let mut outs = Vec::new();
    for round in 0..4 {
        sim.append_event("xid 3 94");
        let down = next(&r)?;
        ensure(
            down.index == 3 && !down.health.is_healthy(),
            format!("round {round}: {down:?}"),
        )?;
        let left = Instant::now();
        let up = next(&r)?;
        ensure(
            up.index == 3 && up.health.is_healthy(),
            format!("round {round}: {up:?}"),
        )?;
        outs.push(left.elapsed());
    }
    let record = &r.monitor.records()[3];
    ensure(record.recovery.flaps == 3, format!("{:?}", record.recovery))?;
    ensure(
        outs[3] >= Duration::from_millis(800) && outs[2] >= Duration::from_millis(400),
        format!("the quiet time grows: {outs:?}"),
    )?;
    // Now the probe fails for good: attempts back off (100, 200, 400, 800, 1600, 1600 ms…),
    // so in 2.5 s there are a handful, not hundreds.
    probe.set_failing(true)?;
    sim.append_event("xid 3 94");
    ensure(next(&r)?.index == 3, "out again")?;
    let before = probe.runs().len();
    std::thread::sleep(Duration::from_millis(2500));
    let tries = probe.runs().len() - before;
    ensure(
        (1..=5).contains(&tries),
        format!("{tries} probes in 2.5 s: backed off, not looped"),
    )?;
    let record = &r.monitor.records()[3];
    let episode = record.recovery.episode.as_ref().ok_or("no episode")?;
    ensure(
        episode.attempts >= 1 && record.recovery.probe_failures >= 1,
        format!("{:?}", record.recovery),
    )
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

/// The probe runs in a device cgroup of its own that allows its GPU alone: from inside, its GPU's
/// node opens with ENXIO (allowed; no driver behind the mknod'ed node) and another GPU's with
/// EPERM (denied); the cgroup is gone afterwards.
fn the_probe_runs_in_a_one_gpu_cgroup_of_its_own(version: CgroupVersion) -> TestResult {
    use mesos_gpu_enforce::cgroup::{CgroupLayout, Hierarchy, default_whitelist};
    use mesos_gpu_health::{ProbeCgroup, ProbeTarget, probe::run_probe};
    use mesos_gpu_node::devices::DeviceNodes;
    let sim = node(|_| {});
    let driver = open(&sim)?;
    let dev =
        mesos_gpu_testkit::mesos::DevNodes::nvidia(&[0, 1, 2, 3]).map_err(|e| e.to_string())?;
    let nodes = DeviceNodes::scan(dev.path(), driver.inventory()).map_err(|e| e.to_string())?;
    let mount = match version {
        CgroupVersion::V1 => std::path::PathBuf::from("/sys/fs/cgroup/devices"),
        CgroupVersion::V2 => mesos_gpu_testkit::cgroup2_root().ok_or("no cgroup2")?,
    };
    let parent = unique_name("probe");
    let layout = CgroupLayout::new(
        Hierarchy {
            version,
            mount: mount.clone(),
        },
        &parent,
    )
    .map_err(|e| e.to_string())?;
    let script = format!(
        "for m in 0 1 2; do printf 'nvidia%s: ' $m; (exec 3<>{dir}/nvidia$m) 2>&1 | sed 's/.*: //'; echo; done; cat /proc/self/cgroup",
        dir = dev.path().display()
    );
    let mut config = ProbeConfig::command(vec!["sh".into(), "-c".into(), script]);
    config.cgroup = Some(ProbeCgroup {
        layout,
        base: default_whitelist(),
        nodes,
    });
    let gpu = &driver.inventory().gpus[1];
    let outcome = run_probe(&config, &ProbeTarget::of(gpu));
    let leftover = std::fs::read_dir(mount.join(&parent))
        .map(|d| {
            d.filter_map(Result::ok)
                .filter(|e| e.file_name().to_string_lossy().starts_with("gpu-probe"))
                .count()
        })
        .unwrap_or(0);
    let _ = std::fs::remove_dir(mount.join(&parent));
    println!("{outcome:?}");
    ensure(outcome.passed, format!("{outcome:?}"))?;
    let line = |m: u32| {
        outcome
            .output
            .lines()
            .find(|l| l.starts_with(&format!("nvidia{m}: ")))
            .unwrap_or_default()
            .to_owned()
    };
    let minor = gpu.minor;
    let other = if minor == 0 { 2 } else { 0 };
    ensure(
        line(minor).contains("No such device or address"),
        format!("its own GPU is allowed: {}", outcome.output),
    )?;
    ensure(
        line(other).contains("Operation not permitted"),
        format!("another GPU is denied: {}", outcome.output),
    )?;
    ensure(
        outcome
            .output
            .contains(&format!("{parent}/gpu-probe-{}-", gpu.index))
            && outcome.detail.contains("in cgroup"),
        format!("it ran in its cgroup: {outcome:?}"),
    )?;
    ensure(leftover == 0, "the probe's cgroup is removed")
}

fn main() -> ExitCode {
    let host = Host::probe();
    let plain = |name: &str, f: fn() -> TestResult| Trial::test(name, f);
    let trials = vec![
        plain(
            "xid79_takes_the_gpu_out_and_tells_its_owner",
            xid79_takes_the_gpu_out_and_tells_its_owner,
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
            "a_gpu_nvml_reports_lost_cannot_be_marked_healthy",
            a_gpu_nvml_reports_lost_cannot_be_marked_healthy,
        ),
        plain(
            "a_request_is_checkpointed_before_it_disappears",
            a_request_is_checkpointed_before_it_disappears,
        ),
        plain(
            "xid_94_comes_back_once_the_probe_passes_and_not_before",
            xid_94_comes_back_once_the_probe_passes_and_not_before,
        ),
        plain(
            "a_pending_row_remapping_keeps_xid_63_out_until_a_reset",
            a_pending_row_remapping_keeps_xid_63_out_until_a_reset,
        ),
        plain(
            "failures_needing_a_reset_never_come_back_by_themselves",
            failures_needing_a_reset_never_come_back_by_themselves,
        ),
        plain(
            "each_xid_ends_as_the_policy_table_says",
            each_xid_ends_as_the_policy_table_says,
        ),
        plain(
            "a_flapping_gpu_is_backed_off_not_probed_in_a_loop",
            a_flapping_gpu_is_backed_off_not_probed_in_a_loop,
        ),
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
            &[Need::Root, Need::Cgroup1],
            Trial::test("the_probe_runs_in_a_one_gpu_cgroup_of_its_own_v1", || {
                the_probe_runs_in_a_one_gpu_cgroup_of_its_own(CgroupVersion::V1)
            }),
        ),
        needs(
            &host,
            &[Need::Root, Need::Cgroup2],
            Trial::test("the_probe_runs_in_a_one_gpu_cgroup_of_its_own_v2", || {
                the_probe_runs_in_a_one_gpu_cgroup_of_its_own(CgroupVersion::V2)
            }),
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
