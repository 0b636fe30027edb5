//! `--simulate` leaves nothing in the temporary directory, however the command ends: normally,
//! by SIGINT, SIGTERM or SIGHUP (handled by the command or by the simulation's watcher), or by
//! SIGKILL (swept by the next simulation).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long a command may take to reach the point tested on a loaded machine; not a bound.
const PATIENCE: Duration = Duration::from_secs(30);

/// The simulation directories of process `pid`.
fn sim_dirs(pid: u32) -> Vec<PathBuf> {
    let prefix = format!("mesos-gpu-sim-{pid}-");
    std::fs::read_dir(std::env::temp_dir())
        .unwrap()
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_str().unwrap_or("").starts_with(&prefix))
        .map(|e| e.path())
        .collect()
}

fn wait_for_dir(child: &mut Child) -> PathBuf {
    let deadline = Instant::now() + PATIENCE;
    loop {
        if let Some(dir) = sim_dirs(child.id()).pop() {
            return dir;
        }
        if let Some(status) = child.try_wait().unwrap() {
            panic!("exited early: {status}");
        }
        assert!(
            Instant::now() < deadline,
            "no simulation directory appeared"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn signal(child: &Child, name: &str) {
    let status = Command::new("kill")
        .arg(format!("-{name}"))
        .arg(child.id().to_string())
        .status()
        .unwrap();
    assert!(status.success());
}

/// `docker-args` on a simulated node, stuck waiting for the pool lock that `work` holds.
fn blocked_docker_args(work: &Path) -> Child {
    Command::new(env!("CARGO_BIN_EXE_mesos-gpu"))
        .args([
            "docker-args",
            "--simulate",
            "dgx1-v100",
            "--gpus",
            "1",
            "--plugin",
        ])
        .arg("--docker-state-dir")
        .arg(work)
        .env("MESOS_GPU_POOL_DIR", work.join("pool"))
        .env("MESOS_GPU_LOG", "error")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

fn pool_lock(work: &Path) -> File {
    std::fs::create_dir_all(work.join("gpu")).unwrap();
    let lock = File::create(work.join("gpu/allocations.lock")).unwrap();
    lock.lock().unwrap();
    lock
}

#[test]
fn signals_leave_no_simulation_behind() {
    let work = tempfile::tempdir().unwrap();
    let _held = pool_lock(work.path());
    for (name, number) in [("TERM", 15), ("INT", 2), ("HUP", 1)] {
        let mut child = blocked_docker_args(work.path());
        let dir = wait_for_dir(&mut child);
        signal(&child, name);
        let status = child.wait().unwrap();
        assert_eq!(status.code(), Some(128 + number), "SIG{name}");
        assert!(!dir.exists(), "SIG{name} left {}", dir.display());
    }
    // A command with its own handler (serve) ends normally and removes it too.
    let mut serve = mesos_gpu_testkit::serve::command(
        env!("CARGO_BIN_EXE_mesos-gpu"),
        "dgx1-v100",
        work.path(),
    )
    .args(["--driver-poll", "0", "--listen", "127.0.0.1:0"])
    .env("MESOS_GPU_LOG", "error")
    .stdout(Stdio::null())
    .stderr(Stdio::null())
    .spawn()
    .unwrap();
    let dir = wait_for_dir(&mut serve);
    let deadline = Instant::now() + PATIENCE;
    while !work.path().join("nvidia-docker.sock").exists() {
        assert!(Instant::now() < deadline, "serve did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    signal(&serve, "TERM");
    assert!(serve.wait().unwrap().success());
    assert!(!dir.exists(), "serve left {}", dir.display());
}

#[test]
fn a_killed_simulation_is_swept_by_the_next() {
    let work = tempfile::tempdir().unwrap();
    let held = pool_lock(work.path());
    let mut child = blocked_docker_args(work.path());
    let dir = wait_for_dir(&mut child);
    signal(&child, "KILL");
    child.wait().unwrap();
    drop(held);
    assert!(dir.exists(), "SIGKILL runs no cleanup");
    let out = Command::new(env!("CARGO_BIN_EXE_mesos-gpu"))
        .args(["info", "--simulate", "k80"])
        .env("MESOS_GPU_LOG", "error")
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(!dir.exists(), "{} was not swept", dir.display());
}
