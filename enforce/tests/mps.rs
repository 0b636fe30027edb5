//! The MPS control daemons of shared GPUs (issue 17), run for real through the same code path a
//! node uses, with nvml-sim's `nvidia-cuda-mps-control` stand-in (NVIDIA's program cannot run
//! without a GPU): started with the GPU's directories and limits, told the per-replica defaults,
//! restarted when killed, adopted after an agent restart, stopped with `quit`. The stand-in's
//! record shows what each daemon was told.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mesos_gpu_enforce::{mps::MpsConfig, mps::MpsDaemons, mps::MpsError};
use mesos_gpu_node::{discovery::Discovery, discovery::GpuDriver};
use mesos_gpu_placement::sharing::ShareLimits;
use mesos_gpu_testkit::mps::MpsControl;
use mesos_gpu_testkit::nvml_sim::SimNode;
use serde_json::Value;

/// GPU 2 of nvml-sim's `dgx1-v100`.
const GPU: &str = "GPU-10f69e9b-726d-531c-b5c4-5da30ba37e29";
const V100_MEMORY: u64 = 16_944_988_160;

/// Daemons run by the stand-in; with `driver`, compute modes are set through NVML (nvml-sim).
fn daemons(
    mps: &MpsControl,
    root: &std::path::Path,
    driver: Option<&Arc<GpuDriver>>,
) -> MpsDaemons {
    let mut config = MpsConfig::new(root);
    config.program = mps.program();
    config.compute_modes = driver.map(|d| Arc::clone(d) as _);
    MpsDaemons::new(config)
}

fn driver(node: &SimNode) -> Arc<GpuDriver> {
    match GpuDriver::open(Some(&node.lib_path())).expect("NVML") {
        Discovery::Driver(driver) => Arc::new(*driver),
        Discovery::NoDriver(inv) => panic!("no driver: {:?}", inv.absent_reason),
    }
}

fn events<'a>(records: &'a [Value], event: &str) -> Vec<&'a Value> {
    records.iter().filter(|r| r["event"] == event).collect()
}

fn commands(records: &[Value]) -> Vec<String> {
    events(records, "command")
        .iter()
        .map(|r| r["command"].as_str().unwrap_or_default().to_owned())
        .collect()
}

fn kill(pid: u32) {
    let status = Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success(), "kill -KILL {pid}");
}

fn wait_until_dead(pid: u32) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        // Gone, or a zombie waiting for init.
        if stat.is_empty()
            || stat
                .rsplit(')')
                .next()
                .is_some_and(|s| s.trim_start().starts_with('Z'))
        {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("pid {pid} still runs");
}

#[test]
fn a_daemon_per_gpu_is_started_told_its_limits_supervised_and_stopped() {
    let mps = MpsControl::install("{}");
    let root = tempfile::tempdir().unwrap();
    let sim = SimNode::shipped("dgx1-v100");
    let nvml = driver(&sim);
    assert!(!nvml.is_exclusive_process(GPU).unwrap());
    let mut node = daemons(&mps, root.path(), Some(&nvml));
    // R = 4 on a 16 GiB V100: one unit is 25 % and a quarter of the framebuffer.
    let per_replica = ShareLimits::of(1, 4, V100_MEMORY);
    assert_eq!(per_replica.active_thread_percentage, 25);
    assert_eq!(per_replica.pinned_mem_limit_mib, 4040);

    let first = node.ensure(GPU, per_replica).unwrap().clone();
    assert!(
        nvml.is_exclusive_process(GPU).unwrap(),
        "EXCLUSIVE_PROCESS while shared"
    );
    assert_eq!(first.pipe_dir, root.path().join(GPU).join("pipe"));
    assert_eq!(first.log_dir, root.path().join(GPU).join("log"));
    let records = mps.records();
    let starts = events(&records, "start");
    assert_eq!(starts.len(), 1, "{records:?}");
    assert_eq!(starts[0]["daemon_pid"], first.process.pid);
    assert_eq!(starts[0]["env"]["CUDA_VISIBLE_DEVICES"], GPU);
    assert_eq!(
        starts[0]["pipe_dir"].as_str(),
        Some(first.pipe_dir.to_str().unwrap())
    );
    assert_eq!(
        commands(&records),
        [
            "set_default_active_thread_percentage 25".to_owned(),
            format!("set_default_device_pinned_mem_limit {GPU} 4040M"),
        ]
    );
    assert!(events(&records, "command").iter().all(|r| r["ok"] == true));
    assert_eq!(
        node.ask(GPU, "get_default_active_thread_percentage")
            .unwrap(),
        "25.0"
    );

    // A live daemon is kept.
    assert_eq!(
        node.ensure(GPU, per_replica).unwrap().process,
        first.process
    );
    assert_eq!(events(&mps.records(), "start").len(), 1);

    // Killed: supervision starts another with the same limits and says why.
    kill(first.process.pid);
    wait_until_dead(first.process.pid);
    let restarts = node.supervise();
    assert_eq!(restarts.len(), 1);
    assert_eq!(restarts[0].gpu, GPU);
    assert!(
        restarts[0].why.contains("has exited"),
        "{}",
        restarts[0].why
    );
    let second = restarts[0].outcome.as_ref().unwrap().clone();
    assert_ne!(second.process, first.process);
    assert_eq!(node.get(GPU).unwrap().process, second.process);
    let records = mps.records();
    assert_eq!(events(&records, "start").len(), 2);
    assert_eq!(
        commands(&records)
            .iter()
            .filter(|c| c.starts_with("set_default_"))
            .count(),
        4,
        "the new daemon is told the defaults again: {records:?}"
    );
    assert!(node.supervise().is_empty(), "a live daemon is left alone");

    // An agent restart: a new supervisor adopts the live daemon without starting another.
    let recorded: Vec<_> = node.all().map(|d| (d.clone(), per_replica)).collect();
    let mut restarted = daemons(&mps, root.path(), Some(&nvml));
    assert!(restarted.adopt(recorded.clone()).is_empty());
    assert_eq!(restarted.get(GPU).unwrap().process, second.process);
    assert_eq!(events(&mps.records(), "start").len(), 2);

    // Stopped when the GPU leaves sharing: `quit`, and the daemon is gone.
    restarted.stop(GPU).unwrap();
    wait_until_dead(second.process.pid);
    assert!(restarted.get(GPU).is_none());
    assert!(
        !nvml.is_exclusive_process(GPU).unwrap(),
        "DEFAULT once it left sharing"
    );
    let exits = events(&mps.records(), "exit")
        .iter()
        .map(|r| r["reason"].clone())
        .collect::<Vec<_>>();
    assert_eq!(exits, [Value::from("quit")]);

    // Adopting a daemon that died while the agent was down starts a new one.
    let mut after_reboot = daemons(&mps, root.path(), None);
    let restarts = after_reboot.adopt(recorded);
    assert_eq!(restarts.len(), 1);
    let third = restarts[0].outcome.as_ref().unwrap();
    assert_eq!(events(&mps.records(), "start").len(), 3);
    after_reboot.stop(GPU).unwrap();
    wait_until_dead(third.process.pid);
}

#[test]
fn clients_get_the_pipe_and_their_share_of_the_limits() {
    let mps = MpsControl::install("{}");
    let root = tempfile::tempdir().unwrap();
    let mut node = daemons(&mps, root.path(), None);
    let daemon = node
        .ensure(GPU, ShareLimits::of(1, 4, V100_MEMORY))
        .unwrap()
        .clone();
    // A task holding 2 of the 4 units.
    let env =
        mesos_gpu_grant::env::mps_client(&daemon.pipe_dir, &ShareLimits::of(2, 4, V100_MEMORY));
    assert_eq!(
        env,
        [
            (
                "CUDA_MPS_PIPE_DIRECTORY".to_owned(),
                daemon.pipe_dir.display().to_string()
            ),
            (
                "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE".to_owned(),
                "50".to_owned()
            ),
            (
                "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT".to_owned(),
                "0=8080M".to_owned()
            ),
        ]
    );
    // The pipe directory a client mounts is the daemon's: a client there reaches it.
    let reply = mps.run(
        &[],
        &daemon.pipe_dir,
        &daemon.log_dir,
        "get_default_active_thread_percentage\n",
    );
    assert!(reply.status.success(), "{reply:?}");
    assert_eq!(String::from_utf8_lossy(&reply.stdout).trim(), "25.0");
    node.stop(GPU).unwrap();
}

#[test]
fn a_daemon_that_cannot_start_is_an_error_with_its_reason() {
    let mps = MpsControl::install(r#"{"refuse_start": "MPS is not supported on this GPU"}"#);
    let root = tempfile::tempdir().unwrap();
    let sim = SimNode::shipped("dgx1-v100");
    let nvml = driver(&sim);
    let mut node = daemons(&mps, root.path(), Some(&nvml));
    let err = node
        .ensure(GPU, ShareLimits::of(1, 4, V100_MEMORY))
        .unwrap_err();
    assert!(matches!(err, MpsError::Failed { .. }), "{err:?}");
    let text = mesos_gpu_os::error_chain(&err);
    assert!(
        text.contains(GPU) && text.contains("MPS is not supported on this GPU"),
        "{text}"
    );
    assert!(node.get(GPU).is_none());
    assert!(
        !nvml.is_exclusive_process(GPU).unwrap(),
        "a daemon that did not start leaves the GPU in DEFAULT"
    );

    let mut missing = MpsConfig::new(root.path());
    missing.program = root.path().join("no-such-program");
    let err = MpsDaemons::new(missing)
        .ensure(GPU, ShareLimits::of(1, 4, V100_MEMORY))
        .unwrap_err();
    assert!(matches!(err, MpsError::Spawn { .. }), "{err:?}");
    assert!(err.to_string().contains("no-such-program"), "{err}");
}
