//! Test-only helpers shared by the workspace's integration tests.
//!
//! Privileged test targets use `harness = false` with libtest-mimic. [`Host::probe`] looks at the
//! machine once; [`needs`] wraps a trial so that it is *ignored* (and counted as such) when a
//! requirement is missing, or *fails* when that requirement is listed in `MESOS_GPU_REQUIRE`
//! (CI sets `MESOS_GPU_REQUIRE=root,cgroup1,cgroup2,dockerd,cc,mesos`). A test never passes
//! without running.
#![forbid(unsafe_code)]
#![warn(unreachable_pub, missing_docs)]

pub mod cuda_sim;
pub mod dockerd;
pub mod mesos;
pub mod modes;
pub mod mps;
pub mod nvml_sim;
pub mod pool;
pub mod serve;

/// Nodes built in code (an NVLink table and PCIe groups) and the reference nodes of
/// `docs/reference/topology.md` §3: the isolator's test fixtures, compiled into it only for its
/// own unit tests and through this crate (feature `fixtures`), never into a release build.
pub use mesos_gpu_node::nodes;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use libtest_mimic::{Failed, Trial};

/// Something a privileged test needs from the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    /// Effective uid 0.
    Root,
    /// A writable cgroup v1 `devices` hierarchy at `/sys/fs/cgroup/devices`.
    Cgroup1,
    /// A writable cgroup2 hierarchy at `/sys/fs/cgroup/unified` (or `/sys/fs/cgroup`).
    Cgroup2,
    /// A Docker daemon answering `/_ping` on `/var/run/docker.sock`.
    Dockerd,
    /// A C compiler (`cc`) on PATH.
    Cc,
    /// `python3` on PATH with NVIDIA's NVML binding (`pip install nvidia-ml-py`, module `pynvml`).
    Pynvml,
    /// A runnable Apache Mesos install ([`mesos::MesosInstall::locate`]).
    Mesos,
    /// `podman` on PATH (Debian's package), a CDI consumer.
    Podman,
    /// A writable cgroup v1 `cpuset` hierarchy at `/sys/fs/cgroup/cpuset`.
    Cpuset1,
    /// The `cpuset` controller offered by the cgroup2 hierarchy (absent on a hybrid host whose
    /// `cpuset` is bound to a v1 hierarchy).
    Cpuset2,
    /// `python3` with pymesos (PyPI), the client library of the real-agent frameworks.
    Pymesos,
    /// What building and installing Debian packages takes: `dpkg`, `dpkg-deb` and
    /// `dpkg-shlibdeps` (dpkg-dev); `scripts/package.sh` installs its pinned cargo-deb itself.
    Dpkg,
    /// systemd (`/lib/systemd/systemd`, run as PID 1 of private namespaces) with `unshare` and
    /// `nsenter`, to run a package's unit as on a node.
    Systemd,
}

impl Need {
    /// The word used for this need in `MESOS_GPU_REQUIRE`.
    pub fn word(self) -> &'static str {
        match self {
            Need::Root => "root",
            Need::Cgroup1 => "cgroup1",
            Need::Cgroup2 => "cgroup2",
            Need::Dockerd => "dockerd",
            Need::Cc => "cc",
            Need::Pynvml => "pynvml",
            Need::Mesos => "mesos",
            Need::Podman => "podman",
            Need::Cpuset1 => "cpuset1",
            Need::Cpuset2 => "cgroup2-cpuset",
            Need::Pymesos => "pymesos",
            Need::Dpkg => "dpkg",
            Need::Systemd => "systemd",
        }
    }
}

/// What the host offers, probed once per test binary.
#[derive(Debug, Clone)]
pub struct Host {
    missing: Vec<(Need, String)>,
    required: Vec<String>,
}

impl Host {
    /// Probes every [`Need`] and prints one line per missing one to stderr.
    pub fn probe() -> Host {
        let mut missing = Vec::new();
        if !is_root() {
            missing.push((Need::Root, "not running as root".to_owned()));
        }
        if !Path::new("/sys/fs/cgroup/devices/devices.allow").exists() {
            missing.push((
                Need::Cgroup1,
                "no cgroup v1 devices hierarchy at /sys/fs/cgroup/devices".to_owned(),
            ));
        }
        if cgroup2_root().is_none() {
            missing.push((
                Need::Cgroup2,
                "no cgroup2 hierarchy at /sys/fs/cgroup/unified or /sys/fs/cgroup".to_owned(),
            ));
        }
        if let Err(why) = ping_dockerd(Path::new("/var/run/docker.sock")) {
            missing.push((Need::Dockerd, format!("no Docker daemon: {why}")));
        }
        if std::process::Command::new("cc")
            .arg("--version")
            .output()
            .map(|o| !o.status.success())
            .unwrap_or(true)
        {
            missing.push((Need::Cc, "no working `cc` on PATH".to_owned()));
        }
        if std::process::Command::new("python3")
            .args(["-c", "import pynvml"])
            .output()
            .map(|o| !o.status.success())
            .unwrap_or(true)
        {
            missing.push((
                Need::Pynvml,
                "no `python3` with module pynvml (pip install nvidia-ml-py)".to_owned(),
            ));
        }
        if let Err(why) = mesos::MesosInstall::locate().and_then(|m| m.check_runs()) {
            missing.push((Need::Mesos, why));
        }
        if std::process::Command::new("podman")
            .arg("--version")
            .output()
            .map(|o| !o.status.success())
            .unwrap_or(true)
        {
            missing.push((
                Need::Podman,
                "no working `podman` on PATH (apt-get install podman)".to_owned(),
            ));
        }
        if !Path::new("/sys/fs/cgroup/cpuset/cpuset.cpus").exists() {
            missing.push((
                Need::Cpuset1,
                "no cgroup v1 cpuset hierarchy at /sys/fs/cgroup/cpuset".to_owned(),
            ));
        }
        let v2_controllers = cgroup2_root()
            .and_then(|root| std::fs::read_to_string(root.join("cgroup.controllers")).ok())
            .unwrap_or_default();
        if !v2_controllers.split_whitespace().any(|c| c == "cpuset") {
            missing.push((
                Need::Cpuset2,
                format!(
                    "cgroup2 offers no cpuset controller (cgroup.controllers: {:?}; on a hybrid host it is bound to the v1 hierarchy)",
                    v2_controllers.trim_end()
                ),
            ));
        }
        if let Err(why) = mesos::framework::check_pymesos() {
            missing.push((Need::Pymesos, why));
        }
        let runs = |program: &str, args: &[&str]| {
            std::process::Command::new(program)
                .args(args)
                .output()
                .is_ok_and(|o| o.status.success())
        };
        if !(runs("dpkg", &["--version"])
            && runs("dpkg-deb", &["--version"])
            && runs("dpkg-shlibdeps", &["--version"]))
        {
            missing.push((
                Need::Dpkg,
                "no working dpkg, dpkg-deb or dpkg-shlibdeps (apt-get install dpkg-dev)".to_owned(),
            ));
        }
        if !(Path::new("/lib/systemd/systemd").is_file()
            && runs("unshare", &["--version"])
            && runs("nsenter", &["--version"]))
        {
            missing.push((
                Need::Systemd,
                "no /lib/systemd/systemd (apt-get install systemd), unshare or nsenter".to_owned(),
            ));
        }
        let required: Vec<String> = std::env::var("MESOS_GPU_REQUIRE")
            .unwrap_or_default()
            .split(',')
            .map(|s| s.trim().to_owned())
            .filter(|s| !s.is_empty())
            .collect();
        for (need, why) in &missing {
            let verdict = if required.iter().any(|r| r == need.word()) {
                "FAIL (required)"
            } else {
                "tests ignored"
            };
            eprintln!("host: missing {}: {why}: {verdict}", need.word());
        }
        Host { missing, required }
    }

    /// Why `need` is missing, or `None` when the host has it.
    pub fn missing(&self, need: Need) -> Option<&str> {
        self.missing
            .iter()
            .find(|(n, _)| *n == need)
            .map(|(_, why)| why.as_str())
    }

    fn is_required(&self, need: Need) -> bool {
        self.required.iter().any(|r| r == need.word())
    }
}

/// Wraps `trial`: ignored when a need is missing, failed when that need is required.
pub fn needs(host: &Host, needs: &[Need], trial: Trial) -> Trial {
    let mut required_missing = Vec::new();
    let mut optional_missing = Vec::new();
    for &need in needs {
        if let Some(why) = host.missing(need) {
            let line = format!("{}: {why}", need.word());
            if host.is_required(need) {
                required_missing.push(line)
            } else {
                optional_missing.push(line)
            }
        }
    }
    if !required_missing.is_empty() {
        let name = trial.name().to_owned();
        let msg = format!(
            "required by MESOS_GPU_REQUIRE but missing: {}",
            required_missing.join("; ")
        );
        return Trial::test(name, move || Err(Failed::from(msg)));
    }
    if !optional_missing.is_empty() {
        return trial.with_ignored_flag(true);
    }
    trial
}

/// The cgroup2 mount used for tests: `/sys/fs/cgroup/unified` on hybrid hosts, else
/// `/sys/fs/cgroup` when that is itself cgroup2.
pub fn cgroup2_root() -> Option<PathBuf> {
    ["/sys/fs/cgroup/unified", "/sys/fs/cgroup"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.join("cgroup.procs").exists() && p.join("cgroup.subtree_control").exists())
}

/// The subdirectories of `path` (none when it cannot be read): the cgroups left under a parent
/// cgroup, the agents of a Mesos work directory.
pub fn subdirs(path: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(path)
        .map(|d| {
            d.flatten()
                .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                .map(|e| e.path())
                .collect()
        })
        .unwrap_or_default()
}

/// A name unique to this process and call: `mgpu-test-<pid>-<n>`.
pub fn unique_name(tag: &str) -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "mgpu-test-{}-{}-{tag}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(2).map(|euid| euid == "0"))
        })
        .unwrap_or(false)
}

fn ping_dockerd(sock: &Path) -> Result<(), String> {
    let mut s = UnixStream::connect(sock).map_err(|e| format!("{}: {e}", sock.display()))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .map_err(|e| e.to_string())?;
    s.write_all(b"GET /_ping HTTP/1.0\r\nHost: docker\r\n\r\n")
        .map_err(|e| e.to_string())?;
    let mut reply = String::new();
    s.read_to_string(&mut reply).map_err(|e| e.to_string())?;
    if reply.starts_with("HTTP/1.0 200") || reply.starts_with("HTTP/1.1 200") {
        Ok(())
    } else {
        Err(format!(
            "unexpected reply to /_ping: {:?}",
            reply.lines().next().unwrap_or("")
        ))
    }
}

/// Runs `cmd` and returns its trimmed stdout; a failure to start or a non-zero exit is an error
/// naming the command, its status and its stderr.
pub fn run_checked(cmd: &mut Command) -> Result<String, String> {
    let out = cmd.output().map_err(|e| format!("{cmd:?}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{cmd:?}: {}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}
