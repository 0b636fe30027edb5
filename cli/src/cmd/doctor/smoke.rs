//! `doctor --smoke`: `nvidia-smi -L` from the driver volume, run by `mesos-gpu exec` in a fresh
//! container cgroup holding one GPU (it must list exactly one) and one holding none (it must list
//! none), as a task with `gpus:1` and one with `gpus:0` would run.
//!
//! The volume is built from the plan into a scratch root on a file system that allows exec, so
//! the node's own volume is left as it is; exec takes its GPU from the node's pool like any task.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use mesos_gpu_os::{ErrorChain, MountTable};
use mesos_gpu_volume::plan::VolumePlan;
use mesos_gpu_volume::{VolumeManager, mountinfo};

use super::report::{Check, Status};

/// How long one run may take before it is stopped.
const RUN_TIMEOUT: Duration = Duration::from_secs(60);

/// How to run `mesos-gpu exec` as this command was run.
pub(crate) struct Smoke {
    /// Global options for the child (`--simulate …`, `--dev-root …`, `--nvml-lib …`).
    pub(crate) global: Vec<OsString>,
    /// `exec`'s own options (`--pool-dir`, `--cgroup-version`).
    pub(crate) exec: Vec<OsString>,
    /// Environment for `nvidia-smi` (the simulated node's, on one).
    pub(crate) env: Vec<(String, String)>,
}

/// Builds a scratch copy of `plan`'s volume and runs the two smoke tests.
pub(crate) fn run(smoke: &Smoke, plan: Option<&VolumePlan>) -> Vec<Check> {
    let failed = |why: String| {
        vec![Check {
            name: "smoke",
            status: Status::Fail,
            summary: why,
            details: Vec::new(),
            fix: Some("fix the driver-volume check first".into()),
        }]
    };
    let Some(plan) = plan else {
        return failed("no volume plan, so no nvidia-smi to run".into());
    };
    let scratch = match scratch_dir() {
        Ok(dir) => dir,
        Err(why) => return failed(why),
    };
    let volume = match VolumeManager::at(scratch.path()).create(plan) {
        Ok(volume) => volume.path,
        Err(e) => {
            return failed(format!(
                "cannot build a scratch volume in {}: {}",
                scratch.path().display(),
                ErrorChain(&e)
            ));
        }
    };
    vec![one(smoke, &volume, 1), one(smoke, &volume, 0)]
}

/// A private directory on a file system that allows exec: the temp dir, else `/var/tmp`.
fn scratch_dir() -> Result<tempfile::TempDir, String> {
    let table = MountTable::read(Path::new("/proc/self/mountinfo")).ok();
    let bases = [std::env::temp_dir(), PathBuf::from("/var/tmp")];
    let base = bases
        .iter()
        .find(|b| {
            table
                .as_ref()
                .is_none_or(|t| !mountinfo::exec_blocked(t, b))
        })
        .ok_or_else(|| {
            format!(
                "{} and /var/tmp are mounted noexec: nowhere to run the volume's nvidia-smi from",
                bases[0].display()
            )
        })?;
    tempfile::Builder::new()
        .prefix("mesos-gpu-doctor-")
        .tempdir_in(base)
        .map_err(|e| format!("cannot make a scratch directory in {}: {e}", base.display()))
}

/// `nvidia-smi -L` in a container with `gpus` GPUs.
fn one(smoke: &Smoke, volume: &Path, gpus: u32) -> Check {
    let name = if gpus == 0 {
        "smoke-no-gpu"
    } else {
        "smoke-one-gpu"
    };
    let smi = volume.join("bin/nvidia-smi");
    let libs = format!(
        "{}:{}",
        volume.join("lib64").display(),
        volume.join("lib").display()
    );
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(e) => return fail(name, format!("cannot find this program to run exec: {e}")),
    };
    let mut cmd = Command::new(exe);
    cmd.args(&smoke.global)
        .arg("exec")
        .arg("--gpus")
        .arg(gpus.to_string())
        .args(&smoke.exec)
        .arg("--")
        .arg("env")
        .arg(format!("LD_LIBRARY_PATH={libs}"));
    for (k, v) in &smoke.env {
        cmd.arg(format!("{k}={v}"));
    }
    cmd.arg(&smi)
        .arg("-L")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let shown = format!("mesos-gpu exec --gpus {gpus} -- {} -L", smi.display());
    let output = match run_with_timeout(cmd) {
        Ok(output) => output,
        Err(why) => return fail(name, format!("`{shown}`: {why}")),
    };
    let stdout = String::from_utf8_lossy(&output.stdout);
    let listed: Vec<&str> = stdout.lines().filter(|l| l.starts_with("GPU ")).collect();
    let mut details: Vec<String> = stdout.lines().map(|l| format!("stdout: {l}")).collect();
    details.extend(
        String::from_utf8_lossy(&output.stderr)
            .lines()
            .map(|l| format!("stderr: {l}")),
    );
    details.push(output.status.to_string());
    let (ok, summary) = if gpus == 0 {
        (
            listed.is_empty(),
            if listed.is_empty() {
                format!("`{shown}` sees no GPU")
            } else {
                format!(
                    "`{shown}` sees {} GPU(s): the container is not isolated",
                    listed.len()
                )
            },
        )
    } else {
        (
            listed.len() == 1 && output.status.success(),
            match listed[..] {
                [gpu] if output.status.success() => {
                    format!("`{shown}` sees exactly its GPU: {gpu}")
                }
                _ => format!(
                    "`{shown}` sees {} GPU(s), expected 1 ({})",
                    listed.len(),
                    output.status
                ),
            },
        )
    };
    Check {
        name,
        status: if ok { Status::Ok } else { Status::Fail },
        summary,
        details,
        fix: (!ok).then(|| {
            "check the device-nodes and cgroups checks; run the command above by hand to see its output".to_owned()
        }),
    }
}

fn fail(name: &'static str, summary: String) -> Check {
    Check {
        name,
        status: Status::Fail,
        summary,
        details: Vec::new(),
        fix: None,
    }
}

/// Runs `cmd`, stopping it (SIGTERM, which exec forwards and cleans up after) past
/// [`RUN_TIMEOUT`].
fn run_with_timeout(mut cmd: Command) -> Result<std::process::Output, String> {
    let mut child = cmd.spawn().map_err(|e| format!("cannot start: {e}"))?;
    let deadline = Instant::now() + RUN_TIMEOUT;
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(50)),
            Ok(None) => {
                let pid =
                    rustix::process::Pid::from_raw(i32::try_from(child.id()).unwrap_or(i32::MAX));
                if let Some(pid) = pid {
                    let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
                }
                let _ = child.wait();
                return Err(format!(
                    "did not finish within {} s; stopped",
                    RUN_TIMEOUT.as_secs()
                ));
            }
            Err(e) => return Err(format!("cannot wait for it: {e}")),
        }
    }
    child
        .wait_with_output()
        .map_err(|e| format!("cannot read its output: {e}"))
}
