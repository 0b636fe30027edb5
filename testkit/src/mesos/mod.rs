//! A real Apache Mesos for end-to-end tests: a master and agents on 127.0.0.1 with free ports
//! and private work and runtime directories, the C++ module built with its CMakeLists.txt,
//! mknod'ed device nodes, a static device probe, `mesos-execute` frameworks, a pymesos framework
//! that launches many tasks ([`framework`]), and agents in a private view of the host where
//! Mesos's own `gpu/nvidia` finds the simulated driver ([`PrivateHost`]).
//!
//! The Mesos is the install prefix `shared/mesos/install` beside the workspace (`../shared`, or
//! further up for a worktree; its README: Mesos 1.12.0 built on Debian 12), or
//! `$MESOS_GPU_MESOS_PREFIX`.
//!
//! Facts this relies on (Mesos 1.12 source, `src/`):
//! - the agent logs "Registered with master" / "Re-registered with master" once registered
//!   (`slave/slave.cpp` 1700, 1795-ish); a command task's executor id is the task id and its
//!   sandbox is `<work_dir>/slaves/<agent>/frameworks/<framework>/executors/<task>/runs/latest`;
//! - `mesos-execute` prints `Received status update TASK_<STATE> for task '<name>'` per update
//!   (`cli/execute.cpp`) and only launches on an offer holding all the resources asked for, so a
//!   request no agent can satisfy stays pending;
//! - the agent with `filesystem/linux` bind-mounts its work directory onto itself, and cgroups
//!   under `--cgroups_root` outlive it (and its checkpointed executors survive a SIGKILL): the
//!   [`Agent`] guard kills what is left in them, unmounts and removes them;
//! - cgroup v2: Mesos wants cgroup2 at `/sys/fs/cgroup` (`src/linux/cgroups2.cpp` 276-294); on
//!   a hybrid host an agent gets that in a private mount namespace (`unshare --mount`, v1 mounts
//!   unmounted, cgroup2 mounted there: the same hierarchy the host has at
//!   `/sys/fs/cgroup/unified`). Its cgroups isolator needs `<cgroups_root>` to exist before the
//!   first container (`isolators/cgroups2/cgroups2.cpp` 192 `CHECK`s it), which only the agent's
//!   start with `--agent_subsystems` makes (`slave/main.cpp` 211-290): v2 agents get
//!   `--agent_subsystems=` (no controller).

mod agent;
pub mod framework;
mod master;
mod module;
mod private_host;
mod probe;
mod task;

use std::fs;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub use agent::{Agent, AgentCgroups, AgentSpec};
pub use master::{Master, http_get, http_post_json};
pub use module::{
    DOCKER_HOOK_MODULE, ISOLATOR_MODULE, add_docker_hook, build_module, modules_json,
};
pub use private_host::{DevNode, PrivateHost};
pub use probe::{DevNodes, ProbeReport, build_probe};
pub use task::Task;

/// Where a Mesos install is looked for: this variable, else `<workspace>/../shared/mesos/install`.
pub const PREFIX_ENV: &str = "MESOS_GPU_MESOS_PREFIX";

/// A test result with a message.
pub type MesosResult<T = ()> = Result<T, String>;

/// A Mesos install prefix: `sbin/`, `bin/`, `libexec/mesos/`, `include/`, `lib/`.
#[derive(Debug, Clone)]
pub struct MesosInstall {
    prefix: PathBuf,
}

impl MesosInstall {
    /// Finds the install (see [`PREFIX_ENV`]); an error says where it looked.
    pub fn locate() -> MesosResult<MesosInstall> {
        let prefix = match std::env::var_os(PREFIX_ENV) {
            Some(p) => PathBuf::from(p),
            None => default_prefix(),
        };
        let agent = prefix.join("sbin/mesos-agent");
        if !agent.is_file() {
            return Err(format!(
                "no Mesos install at {} (no {}); set {PREFIX_ENV} to a Mesos install prefix",
                prefix.display(),
                agent.display()
            ));
        }
        let prefix = prefix
            .canonicalize()
            .map_err(|e| format!("{}: {e}", prefix.display()))?;
        Ok(MesosInstall { prefix })
    }

    /// The install prefix.
    pub fn prefix(&self) -> &Path {
        &self.prefix
    }

    /// `<prefix>/sbin/<name>`.
    pub fn sbin(&self, name: &str) -> PathBuf {
        self.prefix.join("sbin").join(name)
    }

    /// `<prefix>/bin/<name>`.
    pub fn bin(&self, name: &str) -> PathBuf {
        self.prefix.join("bin").join(name)
    }

    /// The agent's `--launcher_dir`.
    pub fn launcher_dir(&self) -> PathBuf {
        self.prefix.join("libexec/mesos")
    }

    /// Checks that the agent binary runs (its libraries load).
    pub fn check_runs(&self) -> MesosResult {
        let out = Command::new(self.sbin("mesos-agent"))
            .arg("--version")
            .output()
            .map_err(|e| format!("mesos-agent --version: {e}"))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "mesos-agent --version failed ({}): {} (install the packages in runtime-packages.txt)",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ))
        }
    }
}

/// `shared/mesos/install` in the nearest directory above the workspace that has one: the
/// workspace's `../shared/mesos` (a checkout beside it), or further up (a worktree).
fn default_prefix() -> PathBuf {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let workspace = workspace.canonicalize().unwrap_or(workspace);
    workspace
        .ancestors()
        .skip(1)
        .map(|dir| dir.join("shared/mesos/install"))
        .find(|p| p.is_dir())
        .unwrap_or_else(|| workspace.join("../shared/mesos/install"))
}

pub(crate) fn run(cmd: &mut Command, what: &str) -> MesosResult<String> {
    let out = cmd.output().map_err(|e| format!("{what}: {e}"))?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if out.status.success() {
        Ok(text)
    } else {
        let tail: Vec<&str> = text.lines().rev().take(40).collect();
        Err(format!(
            "{what} failed ({}):\n{}",
            out.status,
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        ))
    }
}

/// A TCP port free on 127.0.0.1 right now.
pub fn free_port() -> MesosResult<u16> {
    let listener = TcpListener::bind("127.0.0.1:0").map_err(|e| format!("bind: {e}"))?;
    listener
        .local_addr()
        .map(|a| a.port())
        .map_err(|e| format!("local_addr: {e}"))
}

/// Polls `f` every 50 ms until it answers `Some`, or fails with `what` after `timeout`.
pub fn wait_for<T>(
    timeout: Duration,
    what: impl Fn() -> String,
    mut f: impl FnMut() -> Option<T>,
) -> MesosResult<T> {
    let start = Instant::now();
    loop {
        if let Some(v) = f() {
            return Ok(v);
        }
        if start.elapsed() > timeout {
            return Err(format!(
                "timed out after {timeout:?} waiting for {}",
                what()
            ));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

pub(crate) fn spawn_logged(cmd: &mut Command, log: &Path) -> MesosResult<Child> {
    let out = fs::File::create(log).map_err(|e| format!("{}: {e}", log.display()))?;
    let err = out
        .try_clone()
        .map_err(|e| format!("{}: {e}", log.display()))?;
    cmd.stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .map_err(|e| format!("{cmd:?}: {e}"))
}

pub(crate) fn read_lossy(path: &Path) -> String {
    fs::read(path)
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_default()
}

/// The last `n` lines of `text`.
pub fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}
