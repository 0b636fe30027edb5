//! `mesos-gpu gpu health` and `gpu mark-healthy` run as processes on work directories with and
//! without a checkpoint, with simulated nodes (one with a lost GPU), and against a stand-in for
//! a running monitor that answers requests as the module's monitor does.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

fn mesos_gpu(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_mesos-gpu"))
        .args(args)
        .env_remove("NVML_SIM_CONFIG")
        .env_remove("MESOS_GPU_WORK_DIR")
        .env_remove("MESOS_GPU_AGENT_WORK_DIR")
        .env("MESOS_GPU_LOG", "warn")
        .output()
        .expect("run mesos-gpu")
}

fn dgx1() -> Value {
    serde_json::from_str(
        &std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../nvml-sim/topologies/dgx1-v100.json"
        ))
        .unwrap(),
    )
    .unwrap()
}

/// A checkpoint of the DGX-1's 8 GPUs, GPU 3 failed by XID 79.
fn write_checkpoint(work: &Path) {
    std::fs::create_dir_all(work.join("gpu")).unwrap();
    std::fs::write(
        work.join("gpu/health.json"),
        mesos_gpu_testkit::nvml_sim::health_checkpoint("dgx1-v100", 3).to_string(),
    )
    .unwrap();
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn gpu_health_creates_nothing() {
    let work = tempfile::tempdir().unwrap();
    let dir = work.path().to_str().unwrap();
    let out = mesos_gpu(&["gpu", "health", "--agent-work-dir", dir]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(!work.path().join("gpu").exists(), "gpu/ created");
    write_checkpoint(work.path());
    for extra in [None, Some("--json")] {
        let mut args = vec!["gpu", "health", "--agent-work-dir", dir];
        args.extend(extra);
        let out = mesos_gpu(&args);
        assert!(out.status.success(), "{}", stderr(&out));
        assert!(!work.path().join("gpu/health.lock").exists(), "{args:?}");
    }
    let out = mesos_gpu(&["gpu", "health", "--agent-work-dir", dir]);
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("(no monitor running)"),
        "{out:?}"
    );
}

#[test]
fn mark_healthy_refuses_what_it_cannot_find() {
    let work = tempfile::tempdir().unwrap();
    let dir = work.path().to_str().unwrap();
    // A wrong --agent-work-dir: nothing there, nothing created, exit 1 naming where it looked.
    let out = mesos_gpu(&["gpu", "mark-healthy", "3", "--agent-work-dir", dir]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains(&format!(
            "no GPU health checkpoint at {dir}/gpu/health.json and no health monitor running there"
        )),
        "{}",
        stderr(&out)
    );
    assert!(!work.path().join("gpu").exists());
    // A GPU the node does not have.
    write_checkpoint(work.path());
    let before = std::fs::read(work.path().join("gpu/health.json")).unwrap();
    let out = mesos_gpu(&[
        "gpu",
        "mark-healthy",
        "99",
        "--agent-work-dir",
        dir,
        "--simulate",
        "dgx1-v100",
    ]);
    assert_eq!(out.status.code(), Some(1));
    let uuid0 = dgx1()["gpus"][0]["uuid"].as_str().unwrap().to_owned();
    assert!(
        stderr(&out).contains(&format!(
            "GPU 99 is not in the health checkpoint {dir}/gpu/health.json (GPUs: 0 {uuid0}, "
        )),
        "{}",
        stderr(&out)
    );
    assert_eq!(
        std::fs::read(work.path().join("gpu/health.json")).unwrap(),
        before
    );
}

#[test]
fn mark_healthy_refuses_a_gpu_nvml_still_reports_lost() {
    let work = tempfile::tempdir().unwrap();
    let dir = work.path().to_str().unwrap();
    write_checkpoint(work.path());
    let mut node = dgx1();
    node["gpus"][3]["lost"] = json!(true);
    let file = work.path().join("node.json");
    std::fs::write(&file, node.to_string()).unwrap();
    let out = mesos_gpu(&[
        "gpu",
        "mark-healthy",
        "3",
        "--agent-work-dir",
        dir,
        "--simulate",
        file.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("GPU 3 is still lost: NVML answers NVML_ERROR_GPU_IS_LOST"),
        "{}",
        stderr(&out)
    );
    // The same GPU answering again (reset): marked healthy.
    let out = mesos_gpu(&[
        "gpu",
        "mark-healthy",
        "3",
        "--agent-work-dir",
        dir,
        "--simulate",
        "dgx1-v100",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("marked healthy"));
    let saved: Value =
        serde_json::from_slice(&std::fs::read(work.path().join("gpu/health.json")).unwrap())
            .unwrap();
    assert_eq!(saved["gpus"][3]["health"]["state"], "healthy");
}

#[test]
fn mark_healthy_reports_the_running_monitors_answer() {
    let work = tempfile::tempdir().unwrap();
    let dir = work.path().to_str().unwrap();
    write_checkpoint(work.path());
    // Stands in for the agent's monitor: holds the lock, answers the request.
    let lock = std::fs::File::create(work.path().join("gpu/health.lock")).unwrap();
    lock.try_lock().unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_mesos-gpu"))
        .args([
            "gpu",
            "mark-healthy",
            "3",
            "--wait",
            "20",
            "--agent-work-dir",
            dir,
        ])
        .env("MESOS_GPU_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let requests = work.path().join("gpu/health-requests");
    let deadline = Instant::now() + Duration::from_secs(20);
    let request = loop {
        let found = std::fs::read_dir(&requests).ok().and_then(|entries| {
            entries.filter_map(Result::ok).map(|e| e.path()).find(|p| {
                p.file_name()
                    .unwrap()
                    .to_str()
                    .unwrap()
                    .starts_with("mark-healthy-")
            })
        });
        if let Some(found) = found {
            break found;
        }
        assert!(Instant::now() < deadline, "no request appeared");
        std::thread::sleep(Duration::from_millis(10));
    };
    assert_eq!(std::fs::read_to_string(&request).unwrap(), "3");
    let id = request
        .file_name()
        .unwrap()
        .to_str()
        .unwrap()
        .strip_prefix("mark-healthy-")
        .unwrap()
        .to_owned();
    std::fs::write(
        requests.join(format!("done-{id}")),
        r#"{"ok":false,"message":"GPU 3 is still lost: NVML answers NVML_ERROR_GPU_IS_LOST"}"#,
    )
    .unwrap();
    std::fs::remove_file(&request).unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("the running monitor refused: GPU 3 is still lost"),
        "{}",
        stderr(&out)
    );
    assert!(
        !requests.join(format!("done-{id}")).exists(),
        "the answer is taken"
    );
}

/// `gpu health --json` without a checkpoint (before: `null`): an object saying the checkpoint
/// is absent, with NVML's view of each GPU when there is a driver; with one, the checkpoint's
/// object plus where it was read and that it is present.
#[test]
fn gpu_health_json_says_what_it_read() {
    let work = tempfile::tempdir().unwrap();
    let dir = work.path().to_str().unwrap();
    let out = mesos_gpu(&[
        "gpu",
        "health",
        "--agent-work-dir",
        dir,
        "--json",
        "--simulate",
        "dgx1-v100",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["checkpoint_state"], "absent", "{v}");
    assert_eq!(v["monitor_running"], false);
    assert_eq!(
        v["checkpoint"],
        work.path().join("gpu/health.json").to_str().unwrap()
    );
    let gpus = v["gpus"].as_array().unwrap();
    assert_eq!(gpus.len(), 8, "{v}");
    assert_eq!(gpus[0]["health"]["state"], "healthy");
    assert_eq!(gpus[0]["source"], "nvml");
    write_checkpoint(work.path());
    let out = mesos_gpu(&["gpu", "health", "--agent-work-dir", dir, "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["checkpoint_state"], "present", "{v}");
    assert!(v["version"].is_number() && v["gpus"].is_array(), "{v}");
}

/// `gpu health` shows how a GPU out of the pool comes back, its last check and its history;
/// `mark-healthy` (no monitor running) says which evidence was missing.
#[test]
fn gpu_health_shows_the_recovery_and_mark_healthy_the_missing_evidence() {
    let work = tempfile::tempdir().unwrap();
    let dir = work.path().to_str().unwrap();
    write_checkpoint(work.path());
    let path = work.path().join("gpu/health.json");
    let mut snap: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    snap["gpus"][1]["health"] = json!({"state": "unhealthy", "reason": {"kind": "xid", "xid": 94},
                                       "since_ms": 1, "last_error_ms": 1, "errors": 1});
    snap["gpus"][1]["recovery"] = json!({
        "recoveries": 2, "probe_failures": 3, "flaps": 2,
        "episode": {"comeback": {"by": "evidence", "class": "memory"}, "attempts": 3,
                    "next_try_ms": 1,
                    "findings": [
                        {"check": "quiet_time", "ok": true, "detail": "400.0s without an error, 300.0s needed"},
                        {"check": "probe", "ok": false, "detail": "cuMemAlloc_v2 returned CUDA_ERROR_ECC_UNCORRECTABLE (214)"}]}});
    snap["gpus"][3]["recovery"] = json!({
        "episode": {"comeback": {"by": "reset", "remedy": "node_reboot"}}});
    std::fs::write(&path, snap.to_string()).unwrap();
    let out = mesos_gpu(&["gpu", "health", "--agent-work-dir", dir]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", stderr(&out));
    for want in [
        "comes back by itself on evidence (memory quiet time)",
        "last check (failed attempts 3, next in now):",
        "probe: FAILED (cuMemAlloc_v2 returned CUDA_ERROR_ECC_UNCORRECTABLE (214))",
        "history: 2 automatic recovery(ies), 3 failed probe(s), FLAPPING: 2 recovery(ies)",
        "it needs a node reboot (or at least a GPU reset)",
    ] {
        assert!(text.contains(want), "missing {want:?} in:\n{text}");
    }
    let out = mesos_gpu(&["gpu", "mark-healthy", "1", "--agent-work-dir", dir]);
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        said.contains("the evidence that was missing: probe: FAILED (cuMemAlloc_v2"),
        "{said}"
    );
}

#[test]
fn gpu_list_and_docker_args_release_say_what_they_did_not_find() {
    let scratch = tempfile::tempdir().unwrap();
    // A pool directory that does not exist is a typo: an error naming it, not an empty pool.
    let typo = scratch.path().join("mesos-gpu-typo");
    let out = mesos_gpu(&["gpu", "list", "--pool-dir", typo.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains(&format!(
            "--pool-dir {} (or MESOS_GPU_POOL_DIR): no such directory",
            typo.display()
        )) && out.stdout.is_empty(),
        "{}",
        stderr(&out)
    );
    assert!(!typo.exists(), "gpu list created the pool directory");
    // One that exists but where nothing has reserved GPUs says so, not "no reservations".
    let empty = scratch.path().join("empty-pool");
    std::fs::create_dir(&empty).unwrap();
    let out = mesos_gpu(&["gpu", "list", "--pool-dir", empty.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        text.contains("no pool file there: nothing has reserved GPUs through")
            && text.contains(empty.to_str().unwrap())
            && !text.contains("no reservations"),
        "{text}"
    );
    let state = scratch.path().join("docker-state");
    let out = mesos_gpu(&[
        "docker-args",
        "--release",
        "3d8a52b4-1c5e-4f5a-9c1e-2b7d9a0e6f11",
        "--docker-state-dir",
        state.to_str().unwrap(),
        "--pool-dir",
        scratch.path().join("pool").to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains(
            "container 3d8a52b4-1c5e-4f5a-9c1e-2b7d9a0e6f11 holds no GPUs in the Docker record in"
        ),
        "{}",
        stderr(&out)
    );
}

/// On a terminal `gpu top` refreshes like top (home, clear, the table again every
/// `--interval`) until stopped; piped, it prints the table once, without escapes, and exits.
#[test]
fn gpu_top_refreshes_on_a_terminal_and_prints_once_when_piped() {
    let tmp = tempfile::tempdir().unwrap();
    let top = format!(
        "{} --simulate dgx1-v100 gpu top --source pool --interval 0.2",
        env!("CARGO_BIN_EXE_mesos-gpu")
    );
    // script(1) (bsdutils, essential on Debian) runs it on a pseudo-terminal; timeout stops it.
    let tty = Command::new("timeout")
        .args(["2", "script", "-q", "-c", &top, "/dev/null"])
        .env("TMPDIR", tmp.path())
        .env("MESOS_GPU_LOG", "warn")
        .stdin(Stdio::null())
        .output()
        .expect("run script");
    let screen = String::from_utf8_lossy(&tty.stdout);
    let redraws = screen.matches("\x1b[H\x1b[2J").count();
    assert!(
        redraws >= 3 && screen.matches("GPU  UUID").count() == redraws,
        "{redraws} redraws on a terminal:\n{screen}"
    );
    let piped = Command::new(env!("CARGO_BIN_EXE_mesos-gpu"))
        .args(["--simulate", "dgx1-v100", "gpu", "top", "--source", "pool"])
        .env("TMPDIR", tmp.path())
        .env("MESOS_GPU_LOG", "warn")
        .output()
        .expect("run mesos-gpu");
    let text = String::from_utf8_lossy(&piped.stdout);
    assert!(piped.status.success(), "{}", stderr(&piped));
    assert!(
        !text.contains('\x1b')
            && text.matches("GPU  UUID").count() == 1
            && text.matches(" free").count() == 8,
        "piped:\n{text}"
    );
}
