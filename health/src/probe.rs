//! The active probe: a command run against one GPU, by default `mesos-gpu gpu probe --gpu
//! <UUID>` (NVML and CUDA checks, [`super::gpu_check`]), in a device cgroup of its own that
//! allows that GPU alone, so the probe tests the GPU the way a task would use it and touches no
//! other GPU.
//!
//! How it runs: the cgroup is made like a container's (`<cgroups root>/gpu-probe-<index>-…`,
//! the default allow list, the control devices and `c 195:<minor> rw`; v1 `devices` or the v2
//! device program), the command joins it between fork and exec (`mesos_gpu_enforce::spawn_in_cgroup`),
//! with `CUDA_VISIBLE_DEVICES` and `NVIDIA_VISIBLE_DEVICES` set to the GPU's UUID. It passes on
//! exit status 0; it is killed after the timeout; whatever it left in the cgroup is killed and
//! the cgroup removed. Without a cgroup layout (tests that are not root) it runs unconfined.
//! `{uuid}` and `{index}` in the command's arguments are replaced by the GPU's.

use std::fs::OpenOptions;
use std::io::Read as _;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use mesos_gpu_enforce::cgroup::{CgroupLayout, DeviceCgroup, DeviceRule};
use mesos_gpu_node::devices::DeviceNodes;
use mesos_gpu_os::container_id::ContainerId;

/// The default probe command.
pub const DEFAULT_PROBE: &str = "mesos-gpu gpu probe --gpu {uuid}";
/// The default probe timeout.
pub const DEFAULT_PROBE_TIMEOUT: Duration = Duration::from_secs(60);
/// How much of the probe's output is kept for the log.
const OUTPUT_KEPT: usize = 4096;

/// Why a probe command cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProbeError {
    /// An empty command.
    #[error(
        "probe command {got:?} is empty: expected a program and its arguments, e.g. `{DEFAULT_PROBE}`"
    )]
    Empty {
        /// The text given.
        got: String,
    },
}

/// Where the probe's one-GPU cgroup is made.
#[derive(Debug, Clone)]
pub struct ProbeCgroup {
    /// The container cgroups' hierarchy and parent.
    pub layout: CgroupLayout,
    /// The allow list every container gets (Mesos's default devices).
    pub base: Vec<DeviceRule>,
    /// The node's device nodes (the control devices' numbers).
    pub nodes: DeviceNodes,
}

/// How the probe runs.
#[derive(Debug, Clone)]
pub struct ProbeConfig {
    /// The program and its arguments; `{uuid}` and `{index}` are replaced by the GPU's.
    pub argv: Vec<String>,
    /// More environment for the probe (e.g. `MESOS_GPU_NVML_LIB`).
    pub env: Vec<(String, String)>,
    /// Killed after this long.
    pub timeout: Duration,
    /// The one-GPU cgroup; `None` runs the probe unconfined.
    pub cgroup: Option<ProbeCgroup>,
}

impl ProbeConfig {
    /// `argv` with the default timeout, no extra environment, unconfined.
    pub fn command(argv: Vec<String>) -> ProbeConfig {
        ProbeConfig {
            argv,
            env: Vec::new(),
            timeout: DEFAULT_PROBE_TIMEOUT,
            cgroup: None,
        }
    }

    /// Splits a command line on blanks (no quoting: arguments hold no blanks).
    pub fn parse_command(text: &str) -> Result<Vec<String>, ProbeError> {
        let argv: Vec<String> = text.split_whitespace().map(str::to_owned).collect();
        if argv.is_empty() {
            return Err(ProbeError::Empty {
                got: text.to_owned(),
            });
        }
        Ok(argv)
    }

    /// The command line, for logs.
    pub fn describe(&self) -> String {
        self.argv.join(" ")
    }
}

/// The GPU a probe runs against.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeTarget {
    /// NVML index.
    pub index: u32,
    /// UUID.
    pub uuid: String,
    /// `/dev/nvidia<minor>`.
    pub minor: u32,
}

impl ProbeTarget {
    /// The probe's target for a GPU of the inventory.
    pub fn of(gpu: &mesos_gpu_node::inventory::Gpu) -> ProbeTarget {
        ProbeTarget {
            index: gpu.index,
            uuid: gpu.uuid.clone(),
            minor: gpu.minor,
        }
    }
}

/// How a probe ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeOutcome {
    /// True on exit status 0.
    pub passed: bool,
    /// What happened, e.g. `exit status 0 after 1.2s in cgroup …` or `timed out after 60s`.
    pub detail: String,
    /// The end of what it printed (stdout, then stderr).
    pub output: String,
}

fn tail(text: &str) -> String {
    let text = text.trim_end();
    let mut start = text.len().saturating_sub(OUTPUT_KEPT);
    while !text.is_char_boundary(start) {
        start += 1;
    }
    text[start..].to_owned()
}

/// Runs the probe against `gpu` and waits for it (at most the timeout).
pub fn run_probe(config: &ProbeConfig, gpu: &ProbeTarget) -> ProbeOutcome {
    let failed = |detail: String| ProbeOutcome {
        passed: false,
        detail,
        output: String::new(),
    };
    let Some((program, args)) = config.argv.split_first() else {
        return failed("no probe command".to_owned());
    };
    let fill = |a: &String| {
        a.replace("{uuid}", &gpu.uuid)
            .replace("{index}", &gpu.index.to_string())
    };
    let mut command = Command::new(program);
    command
        .args(args.iter().map(fill))
        .envs(config.env.iter().map(|(k, v)| (k, v)))
        .envs(mesos_gpu_grant::env::visible(&[gpu.uuid.as_str()]))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let cgroup = match &config.cgroup {
        Some(c) => match make_cgroup(c, gpu) {
            Ok(cg) => Some(cg),
            Err(why) => return failed(format!("cannot make the probe's cgroup: {why}")),
        },
        None => None,
    };
    let outcome = spawn_and_wait(&mut command, cgroup.as_ref(), config.timeout, program);
    if let Some(cg) = &cgroup {
        remove_cgroup(cg);
    }
    outcome
}

fn make_cgroup(c: &ProbeCgroup, gpu: &ProbeTarget) -> Result<DeviceCgroup, String> {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let id = ContainerId::new(format!(
        "gpu-probe-{}-{}-{nanos}",
        gpu.index,
        std::process::id()
    ))
    .map_err(|e| e.to_string())?;
    let rules = mesos_gpu_grant::device_rules(&c.nodes, &c.base, &[gpu.minor], &[]);
    DeviceCgroup::create(&c.layout, &id, &rules).map_err(|e| mesos_gpu_os::error_chain(&e))
}

fn spawn_and_wait(
    command: &mut Command,
    cgroup: Option<&DeviceCgroup>,
    timeout: Duration,
    program: &str,
) -> ProbeOutcome {
    let started = Instant::now();
    let spawned = match cgroup {
        Some(cg) => {
            let procs: PathBuf = cg.path().join("cgroup.procs");
            OpenOptions::new()
                .write(true)
                .open(&procs)
                .and_then(|f| mesos_gpu_enforce::spawn_in_cgroup(command, &f.into()))
        }
        None => command.spawn(),
    };
    let mut child = match spawned {
        Ok(child) => child,
        Err(e) => {
            return ProbeOutcome {
                passed: false,
                detail: format!("cannot run {program}: {e}"),
                output: String::new(),
            };
        }
    };
    // Read in threads: a probe printing more than a pipe holds must not block. Collected with a
    // deadline, so a grandchild left holding the pipes (unconfined) cannot hang the monitor.
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    let streams: Vec<Box<dyn std::io::Read + Send>> = [
        child
            .stdout
            .take()
            .map(|s| Box::new(s) as Box<dyn std::io::Read + Send>),
        child
            .stderr
            .take()
            .map(|s| Box::new(s) as Box<dyn std::io::Read + Send>),
    ]
    .into_iter()
    .flatten()
    .collect();
    let streams_count = streams.len();
    for mut stream in streams {
        let tx = tx.clone();
        std::thread::spawn(move || {
            let mut text = String::new();
            let _ = stream.read_to_string(&mut text);
            let _ = tx.send(text);
        });
    }
    let where_ = cgroup.map_or_else(
        || "unconfined".to_owned(),
        |cg| format!("in cgroup {}", cg.path().display()),
    );
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Ok(status),
            Ok(None) if started.elapsed() >= timeout => {
                let _ = child.kill();
                let _ = child.wait();
                break Err(format!(
                    "timed out after {}s {where_}; killed",
                    timeout.as_secs()
                ));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => break Err(format!("cannot wait for {program}: {e}")),
        }
    };
    if let Some(cg) = cgroup {
        kill_all(cg);
    }
    let deadline = Instant::now() + Duration::from_secs(1);
    let output: Vec<String> = (0..streams_count)
        .map_while(|_| {
            rx.recv_timeout(deadline.saturating_duration_since(Instant::now()))
                .ok()
        })
        .collect();
    let output = tail(&output.join(""));
    let elapsed = started.elapsed().as_secs_f64();
    match status {
        Ok(status) if status.success() => ProbeOutcome {
            passed: true,
            detail: format!("{program} exited 0 after {elapsed:.1}s {where_}"),
            output,
        },
        Ok(status) => {
            // The first failed step (`FAIL …`, as `gpu probe` prints them), else the last line.
            let last = output
                .lines()
                .find(|l| l.trim_start().starts_with("FAIL "))
                .or_else(|| output.lines().last())
                .unwrap_or("no output")
                .trim()
                .to_owned();
            ProbeOutcome {
                passed: false,
                detail: format!("{program} {status} after {elapsed:.1}s {where_}: {last}"),
                output,
            }
        }
        Err(detail) => ProbeOutcome {
            passed: false,
            detail,
            output,
        },
    }
}

/// Kills whatever is left in the cgroup (the probe's children).
fn kill_all(cg: &DeviceCgroup) {
    for _ in 0..50 {
        let pids = cg.processes().unwrap_or_default();
        if pids.is_empty() {
            return;
        }
        for pid in pids {
            let _ = mesos_gpu_enforce::kill(pid);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn remove_cgroup(cg: &DeviceCgroup) {
    kill_all(cg);
    for _ in 0..50 {
        match cg.destroy() {
            Ok(()) => return,
            Err(e) if e.is_busy() => std::thread::sleep(Duration::from_millis(10)),
            Err(e) => {
                tracing::warn!(cgroup = %cg.path().display(), error = %mesos_gpu_os::ErrorChain(&e), "cannot remove the GPU probe's cgroup");
                return;
            }
        }
    }
    tracing::warn!(cgroup = %cg.path().display(), "the GPU probe's cgroup stays busy; left in place");
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a failed unwrap fails the test at its line
mod tests {
    use super::*;

    fn target() -> ProbeTarget {
        ProbeTarget {
            index: 3,
            uuid: "GPU-0000".to_owned(),
            minor: 3,
        }
    }

    fn sh(script: &str) -> ProbeConfig {
        ProbeConfig::command(vec![
            "sh".into(),
            "-c".into(),
            script.into(),
            "probe".into(),
        ])
    }

    #[test]
    fn the_probe_passes_on_exit_0_and_sees_its_gpu() {
        let mut c = sh(r#"test "$CUDA_VISIBLE_DEVICES" = GPU-0000 && echo "gpu $1""#);
        c.argv.push("{index}".into());
        let out = run_probe(&c, &target());
        assert!(out.passed, "{out:?}");
        assert_eq!(out.output, "gpu 3");
        assert!(out.detail.contains("exited 0") && out.detail.contains("unconfined"));
    }

    #[test]
    fn a_failing_or_hanging_probe_fails_saying_how() {
        let out = run_probe(&sh("echo cuInit failed >&2; exit 3"), &target());
        assert!(!out.passed);
        assert!(
            out.detail.contains("exit status: 3") && out.detail.contains("cuInit failed"),
            "{out:?}"
        );
        let mut slow = sh("sleep 30 & wait");
        slow.timeout = Duration::from_millis(200);
        let started = Instant::now();
        let out = run_probe(&slow, &target());
        assert!(!out.passed && out.detail.contains("timed out"), "{out:?}");
        assert!(started.elapsed() < Duration::from_secs(10));
        let missing = ProbeConfig::command(vec!["/nonexistent/probe".into()]);
        let out = run_probe(&missing, &target());
        assert!(
            out.detail.contains("cannot run /nonexistent/probe"),
            "{out:?}"
        );
        assert!(matches!(
            ProbeConfig::parse_command("  "),
            Err(ProbeError::Empty { .. })
        ));
        assert_eq!(
            ProbeConfig::parse_command(DEFAULT_PROBE).unwrap(),
            ["mesos-gpu", "gpu", "probe", "--gpu", "{uuid}"]
        );
    }
}
