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

/// Issue 37: under `--simulate`, state a command keeps goes to the node's scratch directory
/// (`<tmp>/mesos-gpu-sim/<node>/`) unless a path is given, never to the host's: the reservation
/// of `docker-args` lands in the scratch pool and record, `gpu list` of the same node finds it,
/// `--help` shows the scratch default, and an explicit `--pool-dir` still wins.
#[test]
fn simulated_state_defaults_to_the_nodes_scratch_directory() {
    let tmp = tempfile::tempdir().unwrap();
    let dev = tmp.path().join("dev");
    std::fs::create_dir(&dev).unwrap();
    for (name, major, minor) in (0..8).map(|m| (format!("nvidia{m}"), 195, m)).chain([
        ("nvidiactl".to_owned(), 195, 255),
        ("nvidia-uvm".to_owned(), 240, 0),
    ]) {
        let made = Command::new("mknod")
            .arg(dev.join(name))
            .args(["c", &major.to_string(), &minor.to_string()])
            .status()
            .unwrap();
        assert!(made.success(), "mknod (needs root)");
    }
    let mesos_gpu = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_mesos-gpu"))
            .args(["--simulate", "dgx1-v100", "--dev-root"])
            .arg(&dev)
            .args(args)
            .env("TMPDIR", tmp.path())
            .env_remove("MESOS_GPU_POOL_DIR")
            .env("MESOS_GPU_LOG", "warn")
            .output()
            .unwrap()
    };
    let id = "3d8a52b4-1c5e-4f5a-9c1e-2b7d9a0e6f19";
    let out = mesos_gpu(&["docker-args", "--gpus", "2", "--container-id", id]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let scratch = tmp.path().join("mesos-gpu-sim/dgx1-v100");
    let pool = std::fs::read_to_string(scratch.join("pool/gpu/pool.json")).unwrap();
    assert!(pool.contains(id), "{pool}");
    let record = std::fs::read_to_string(scratch.join("docker/gpu/allocations.json")).unwrap();
    assert!(record.contains(id), "{record}");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains(&format!(
            "--volume={}",
            scratch.join("volumes/nvidia_550.54.14").display()
        )),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let host_pool = std::fs::read_to_string("/var/lib/mesos-gpu/gpu/pool.json").unwrap_or_default();
    assert!(
        !host_pool.contains(id),
        "the host's pool was written: {host_pool}"
    );
    let listed = mesos_gpu(&["gpu", "list"]);
    let listed = String::from_utf8_lossy(&listed.stdout).into_owned();
    assert!(listed.contains(id), "{listed}");
    // Who holds each GPU, by NVML index: two GPUs held by the reservation, six free.
    let view: Vec<&str> = listed
        .split("HELD BY\n")
        .nth(1)
        .unwrap_or_default()
        .lines()
        .collect();
    assert_eq!(view.len(), 8, "{listed}");
    assert_eq!(
        view.iter()
            .filter(|l| l.ends_with(&format!("{id} (docker, alive)")))
            .count(),
        2,
        "{listed}"
    );
    assert_eq!(
        view.iter().filter(|l| l.ends_with(" free")).count(),
        6,
        "{listed}"
    );
    assert!(
        view.iter()
            .enumerate()
            .all(|(i, l)| l.starts_with(&format!("{i} "))),
        "{listed}"
    );
    let help = mesos_gpu(&["gpu", "list", "--help"]);
    assert!(
        String::from_utf8_lossy(&help.stdout)
            .contains(&format!("[default: {}]", scratch.join("pool").display())),
        "{}",
        String::from_utf8_lossy(&help.stdout)
    );
    let elsewhere = tmp.path().join("given");
    std::fs::create_dir(&elsewhere).unwrap();
    let listed = mesos_gpu(&["gpu", "list", "--pool-dir", elsewhere.to_str().unwrap()]);
    assert!(
        String::from_utf8_lossy(&listed.stdout).contains("no pool file there"),
        "{}",
        String::from_utf8_lossy(&listed.stdout)
    );
    let out = mesos_gpu(&["docker-args", "--release", id, "--force"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Issue 37: a simulated node's driver stays where it is, as a real one does, so the volume one
/// command builds verifies in the next (each process had a driver tree of its own, so every
/// volume was "damaged"), and both live in the node's scratch state, not the host's volume root.
#[test]
fn a_simulated_nodes_volume_verifies_in_the_next_command() {
    let tmp = tempfile::tempdir().unwrap();
    let volume = |verb: &str| {
        Command::new(env!("CARGO_BIN_EXE_mesos-gpu"))
            .args(["--simulate", "dgx1-v100", "volume", verb])
            .env("TMPDIR", tmp.path())
            .env("MESOS_GPU_LOG", "warn")
            .output()
            .unwrap()
    };
    let created = volume("create");
    assert!(
        created.status.success(),
        "{}",
        String::from_utf8_lossy(&created.stderr)
    );
    let root = tmp
        .path()
        .join("mesos-gpu-sim/dgx1-v100/volumes/nvidia_550.54.14");
    assert!(
        String::from_utf8_lossy(&created.stdout).contains(&format!("created {}", root.display())),
        "{}",
        String::from_utf8_lossy(&created.stdout)
    );
    let verified = volume("verify");
    assert!(
        verified.status.success()
            && String::from_utf8_lossy(&verified.stdout).starts_with("intact"),
        "{}{}",
        String::from_utf8_lossy(&verified.stdout),
        String::from_utf8_lossy(&verified.stderr)
    );
    // `doctor` on the same node checks that volume, not the host's volume root (it warned
    // "cannot open /run/mesos/isolators/gpu/…/manifest.json" for ever).
    let doctor = Command::new(env!("CARGO_BIN_EXE_mesos-gpu"))
        .args(["--simulate", "dgx1-v100", "doctor"])
        .env("TMPDIR", tmp.path())
        .env("MESOS_GPU_LOG", "warn")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&doctor.stdout);
    let line = text
        .lines()
        .find(|l| l.contains("driver-volume"))
        .unwrap_or_else(|| panic!("no driver-volume check in {text}"));
    assert!(
        line.starts_with("ok") && !text.contains("/run/mesos"),
        "{text}"
    );
}

/// Issue 37: `docker-args` without `--image` does not know the image's `PATH`, so it sets none
/// (before: `--env=PATH=<a fixed list>`, replacing the image's) and no `LD_LIBRARY_PATH`; it
/// still gives the driver volume and the devices' variables, as nvidia-docker 1.0's
/// `/docker/cli` did. Its `--json` launch carries only the grant's variables.
#[test]
fn issue_37_docker_args_without_an_image_sets_no_path() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().to_str().unwrap();
    let docker_args = |extra: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_mesos-gpu"))
            .args(["--simulate", "dgx1-v100", "docker-args", "--gpus", "2"])
            .args(["--plugin", "--docker-state-dir", dir, "--pool-dir", dir])
            .args(extra)
            .env("MESOS_GPU_LOG", "warn")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let line = docker_args(&[]);
    let args: Vec<&str> = line.split_whitespace().collect();
    for variable in ["PATH", "LD_LIBRARY_PATH"] {
        assert!(
            !args
                .iter()
                .any(|a| a.starts_with(&format!("--env={variable}="))),
            "{variable} set for an image not known: {line}"
        );
    }
    assert!(
        args.iter()
            .any(|a| a.starts_with("--volume=nvidia_driver_")
                && a.ends_with(":/usr/local/nvidia:ro")),
        "{line}"
    );
    assert!(
        args.iter()
            .any(|a| a.starts_with("--env=NVIDIA_VISIBLE_DEVICES=GPU-")),
        "{line}"
    );
    let json: serde_json::Value = serde_json::from_str(&docker_args(&["--json"])).unwrap();
    assert_eq!(json["version"], 1, "{json}");
    let names: Vec<&str> = json["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|pair| pair[0].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        ["NVIDIA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"],
        "{json}"
    );
}
