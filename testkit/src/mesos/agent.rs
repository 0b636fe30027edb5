//! A `mesos-agent`, on cgroup v1 or (in a private mount namespace) v2, and its clean-up.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus};
use std::time::Duration;

use mesos_gpu_os::MountTable;
use tempfile::TempDir;

use crate::subdirs;

use super::{
    Master, MesosInstall, MesosResult, free_port, read_lossy, spawn_logged, tail, wait_for,
};

/// Which cgroup version the agent runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AgentCgroups {
    /// The host's cgroup v1 hierarchies.
    V1,
    /// cgroup v2, with cgroup2 mounted at `/sys/fs/cgroup` in a private mount namespace.
    V2,
}

/// How to start an agent.
#[derive(Debug, Clone)]
pub struct AgentSpec {
    /// `--isolation`.
    pub isolation: String,
    /// `--cgroups_root` (unique per test: the guard removes it).
    pub cgroups_root: String,
    /// `--resources`.
    pub resources: String,
    /// `--modules=file://<path>`, when set.
    pub modules: Option<PathBuf>,
    /// The cgroup version.
    pub cgroups: AgentCgroups,
    /// Extra environment (e.g. `LD_LIBRARY_PATH` to the simulated NVML).
    pub env: Vec<(String, String)>,
    /// Extra flags, `--name=value`; one named here replaces the flag of that name the agent
    /// would otherwise get from the fields above (`--isolation`, `--resources`, `--modules`,
    /// v2's `--agent_subsystems`, …).
    pub flags: Vec<String>,
    /// The agent's `--work_dir`; `None` for a private directory.
    pub work_dir: Option<PathBuf>,
    /// A [`super::PrivateHost`]'s setup script: the agent then runs in a private mount
    /// namespace set up by it (on cgroup v1 too).
    pub private_host: Option<PathBuf>,
    /// A shell command that starts `mesos-agent` itself (e.g. `examples/mesos-agent/agent.sh`
    /// as the operator guide runs it), run by `sh -c` in place of the agent: its GPU
    /// configuration (`--isolation`, `--resources`, `--modules`, `--agent_subsystems`, and
    /// [`Self::flags`]) is its own, and what only this harness knows (`--master`, `--ip`,
    /// `--port`, `--work_dir`, `--runtime_dir`, `--launcher_dir`, `--cgroups_root`, …) reaches
    /// the agent as `MESOS_*` variables, which the command's own flags override.
    pub script: Option<String>,
}

impl AgentSpec {
    /// An agent with `isolation` on `cgroups`, 4 CPUs, 4 GiB and `gpus` GPUs, under a unique
    /// cgroups root.
    pub fn new(isolation: &str, cgroups: AgentCgroups, gpus: u32) -> AgentSpec {
        AgentSpec {
            isolation: isolation.to_owned(),
            cgroups_root: crate::unique_name("agent").replace('-', "_"),
            resources: format!("cpus:4;mem:4096;gpus:{gpus}"),
            modules: None,
            cgroups,
            env: Vec::new(),
            flags: Vec::new(),
            work_dir: None,
            private_host: None,
            script: None,
        }
    }

    /// An agent on `cgroups` started by the shell command `script` (see [`Self::script`]), with
    /// `env` (the command's own variables, e.g. `PATH` and `AGENT_FLAGS_OPTS`).
    pub fn with_script(
        cgroups: AgentCgroups,
        script: &str,
        env: Vec<(String, String)>,
    ) -> AgentSpec {
        let mut spec = AgentSpec::new("posix/cpu,posix/mem", cgroups, 0);
        spec.script = Some(script.to_owned());
        spec.env = env;
        spec
    }

    /// An agent on `cgroups` started with `flags` as its GPU configuration, exactly as given
    /// (e.g. what `mesos-gpu agent-flags` printed): their `--isolation`, `--resources`,
    /// `--modules` and `--agent_subsystems` are the agent's, in place of the harness's.
    /// Without a flag for them, the agent gets Mesos's default `--isolation`
    /// (`posix/cpu,posix/mem`) and 4 CPUs and 4 GiB.
    pub fn with_flags(cgroups: AgentCgroups, flags: Vec<String>) -> AgentSpec {
        let mut spec = AgentSpec::new("posix/cpu,posix/mem", cgroups, 0);
        spec.resources = "cpus:4;mem:4096".to_owned();
        spec.flags = flags;
        spec
    }
}

/// A `mesos-agent` with private work and runtime directories. Dropping it kills the agent and
/// everything left in its cgroups, unmounts what it mounted and removes its cgroups.
#[derive(Debug)]
pub struct Agent {
    install: MesosInstall,
    master: String,
    spec: AgentSpec,
    port: u16,
    dir: TempDir,
    child: Option<Child>,
    starts: usize,
}

impl Agent {
    /// Starts an agent registered with `master` and waits for its registration.
    pub fn start(install: &MesosInstall, master: &Master, spec: AgentSpec) -> MesosResult<Agent> {
        let mut agent = Agent::new(install, master, spec)?;
        agent.launch()?;
        agent.wait_registered()?;
        Ok(agent)
    }

    /// An agent not started yet, with its own work directory and port.
    fn new(install: &MesosInstall, master: &Master, spec: AgentSpec) -> MesosResult<Agent> {
        let dir = tempfile::Builder::new()
            .prefix("mgpu-mesos-agent")
            .tempdir()
            .map_err(|e| format!("tempdir: {e}"))?;
        Ok(Agent {
            install: install.clone(),
            master: master.address(),
            spec,
            port: free_port()?,
            dir,
            child: None,
            starts: 0,
        })
    }

    /// Starts an agent that is expected to refuse to start; returns its exit status and log.
    pub fn start_refused(
        install: &MesosInstall,
        master: &Master,
        spec: AgentSpec,
    ) -> MesosResult<(ExitStatus, String)> {
        let mut agent = Agent::new(install, master, spec)?;
        agent.launch()?;
        let log = agent.dir.path().join("agent-1.log");
        let mut child = agent.child.take().ok_or("the agent did not start")?;
        let waited = wait_for(
            Duration::from_secs(30),
            || format!("the agent to exit; log:\n{}", tail(&read_lossy(&log), 30)),
            || child.try_wait().ok().flatten(),
        );
        if waited.is_err() {
            let _ = child.kill();
            let _ = child.wait();
        }
        Ok((waited?, agent.log()))
    }

    /// The agent's process id while it runs (the `mesos-agent` process itself: a private
    /// namespace's `unshare` and shell `exec` it).
    pub fn pid(&mut self) -> Option<u32> {
        let child = self.child.as_mut()?;
        matches!(child.try_wait(), Ok(None)).then(|| child.id())
    }

    /// The agent's HTTP port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The agent's work directory.
    pub fn work_dir(&self) -> PathBuf {
        self.spec
            .work_dir
            .clone()
            .unwrap_or_else(|| self.dir.path().join("work"))
    }

    /// The agent's runtime directory.
    pub fn runtime_dir(&self) -> PathBuf {
        self.dir.path().join("run")
    }

    /// The spec it runs with.
    pub fn spec(&self) -> &AgentSpec {
        &self.spec
    }

    /// The spec the next [`Agent::restart`] runs with (e.g. another `--isolation`).
    pub fn spec_mut(&mut self) -> &mut AgentSpec {
        &mut self.spec
    }

    /// Everything the agent logged, over all its starts.
    pub fn log(&self) -> String {
        (1..=self.starts)
            .map(|n| read_lossy(&self.dir.path().join(format!("agent-{n}.log"))))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// SIGKILLs the agent (its checkpointed executors live on).
    pub fn kill(&mut self) -> MesosResult {
        if let Some(mut child) = self.child.take() {
            child.kill().map_err(|e| format!("kill agent: {e}"))?;
            child.wait().map_err(|e| format!("wait agent: {e}"))?;
        }
        Ok(())
    }

    /// Starts the agent again with the same flags and directories and waits until it
    /// re-registered.
    pub fn restart(&mut self) -> MesosResult {
        self.kill()?;
        self.launch()?;
        self.wait_registered()
    }

    /// The first existing `stdout` of task `task`'s sandbox.
    pub fn sandbox_stdout(&self, task: &str) -> MesosResult<String> {
        let path = self.sandbox(task)?.join("stdout");
        Ok(read_lossy(&path))
    }

    /// The `stdout` of task `task` of a task group, run by the default executor of the
    /// framework whose task group includes it.
    pub fn group_task_stdout(&self, task: &str) -> MesosResult<String> {
        let slaves = self.work_dir().join("slaves");
        for agent in subdirs(&slaves) {
            for framework in subdirs(&agent.join("frameworks")) {
                let path = framework
                    .join("executors/default-executor/runs/latest/tasks")
                    .join(task)
                    .join("stdout");
                if path.exists() {
                    return Ok(read_lossy(&path));
                }
            }
        }
        Err(format!(
            "no sandbox for task {task} under {}",
            slaves.display()
        ))
    }

    /// The sandbox (`runs/latest`) of task `task`'s executor.
    pub fn sandbox(&self, task: &str) -> MesosResult<PathBuf> {
        let slaves = self.work_dir().join("slaves");
        for agent in subdirs(&slaves) {
            for framework in subdirs(&agent.join("frameworks")) {
                let run = framework.join("executors").join(task).join("runs/latest");
                if run.exists() {
                    return Ok(run);
                }
            }
        }
        Err(format!(
            "no sandbox for task {task} under {}",
            slaves.display()
        ))
    }

    /// Waits until task `task`'s sandbox stdout contains `needle`.
    pub fn wait_stdout(&self, task: &str, needle: &str, timeout: Duration) -> MesosResult<String> {
        wait_for(
            timeout,
            || {
                format!(
                    "{needle:?} in the stdout of {task}: {:?}; agent log:\n{}",
                    self.sandbox_stdout(task),
                    tail(&self.log(), 30)
                )
            },
            || {
                self.sandbox_stdout(task)
                    .ok()
                    .filter(|out| out.contains(needle))
            },
        )
    }

    /// Waits until the agent's log (over all its starts) contains `needle`.
    pub fn wait_log(&self, needle: &str, timeout: Duration) -> MesosResult {
        wait_for(
            timeout,
            || format!("{needle:?} in the agent log:\n{}", tail(&self.log(), 30)),
            || self.log().contains(needle).then_some(()),
        )
    }

    /// The cgroup directories of the agent's `--cgroups_root` on the host: one per v1
    /// hierarchy that has it, and the cgroup2 one.
    pub fn cgroup_roots(&self) -> Vec<PathBuf> {
        let mut roots: Vec<PathBuf> = subdirs(Path::new("/sys/fs/cgroup"))
            .into_iter()
            .map(|h| h.join(&self.spec.cgroups_root))
            .filter(|p| p.is_dir())
            .collect();
        if let Some(v2) = crate::cgroup2_root() {
            let p = v2.join(&self.spec.cgroups_root);
            if p.is_dir() && !roots.contains(&p) {
                roots.push(p);
            }
        }
        roots
    }

    fn launch(&mut self) -> MesosResult {
        self.starts += 1;
        let log = self.dir.path().join(format!("agent-{}.log", self.starts));
        let agent = self.install.sbin("mesos-agent");
        if let Some(script) = self.spec.script.clone() {
            return self.launch_script(&script, &log);
        }
        let mut flags = vec![
            format!("--master={}", self.master),
            "--ip=127.0.0.1".to_owned(),
            format!("--port={}", self.port),
            format!("--work_dir={}", self.work_dir().display()),
            format!("--runtime_dir={}", self.runtime_dir().display()),
            format!("--launcher_dir={}", self.install.launcher_dir().display()),
            format!("--isolation={}", self.spec.isolation),
            format!("--cgroups_root={}", self.spec.cgroups_root),
            format!("--resources={}", self.spec.resources),
            "--no-systemd_enable_support".to_owned(),
            "--executor_registration_timeout=30secs".to_owned(),
        ];
        if let Some(modules) = &self.spec.modules {
            flags.push(format!("--modules=file://{}", modules.display()));
        }
        if self.spec.cgroups == AgentCgroups::V2 {
            flags.push("--agent_subsystems=".to_owned());
        }
        let name = |flag: &str| flag.split('=').next().unwrap_or_default().to_owned();
        let given: Vec<String> = self.spec.flags.iter().map(|f| name(f)).collect();
        flags.retain(|f| !given.contains(&name(f)));
        flags.extend(self.spec.flags.iter().cloned());
        let mut setup = Vec::new();
        if let Some(script) = &self.spec.private_host {
            setup.push(format!(". {}", script.display()));
        }
        if self.spec.cgroups == AgentCgroups::V2 {
            setup.push(
                "umount -R /sys/fs/cgroup && mount -t cgroup2 cgroup2 /sys/fs/cgroup".to_owned(),
            );
        }
        let mut cmd = if setup.is_empty() {
            let mut cmd = Command::new(&agent);
            cmd.args(&flags);
            cmd
        } else {
            setup.push("exec \"$0\" \"$@\"".to_owned());
            let mut cmd = Command::new("unshare");
            cmd.args(["--mount", "--propagation", "private", "/bin/sh", "-c"])
                .arg(setup.join(" && "))
                .arg(&agent)
                .args(&flags);
            cmd
        };
        self.set_env(&mut cmd);
        self.child = Some(spawn_logged(&mut cmd, &log)?);
        Ok(())
    }

    /// Starts `script` (see [`AgentSpec::script`]) with the harness's flags as `MESOS_*`
    /// variables.
    fn launch_script(&mut self, script: &str, log: &Path) -> MesosResult {
        let harness = [
            ("MASTER", self.master.clone()),
            ("IP", "127.0.0.1".to_owned()),
            ("PORT", self.port.to_string()),
            ("WORK_DIR", self.work_dir().display().to_string()),
            ("RUNTIME_DIR", self.runtime_dir().display().to_string()),
            (
                "LAUNCHER_DIR",
                self.install.launcher_dir().display().to_string(),
            ),
            ("CGROUPS_ROOT", self.spec.cgroups_root.clone()),
            ("SYSTEMD_ENABLE_SUPPORT", "false".to_owned()),
            ("EXECUTOR_REGISTRATION_TIMEOUT", "30secs".to_owned()),
        ];
        let mut setup = vec!["set -e".to_owned()];
        if let Some(private) = &self.spec.private_host {
            setup.push(format!(". {}", private.display()));
        }
        if self.spec.cgroups == AgentCgroups::V2 {
            setup.push(
                "umount -R /sys/fs/cgroup && mount -t cgroup2 cgroup2 /sys/fs/cgroup".to_owned(),
            );
        }
        setup.push(script.to_owned());
        let mut cmd = Command::new("unshare");
        cmd.args(["--mount", "--propagation", "private", "/bin/sh", "-c"])
            .arg(setup.join("\n"));
        for (name, value) in harness {
            cmd.env(format!("MESOS_{name}"), value);
        }
        self.set_env(&mut cmd);
        self.child = Some(spawn_logged(&mut cmd, log)?);
        Ok(())
    }

    /// The agent's environment: this process's without `LD_LIBRARY_PATH`, plus the spec's.
    /// `cargo test` puts `target/<profile>` ahead of `target/<profile>/deps` there, so an agent
    /// inheriting it loads whatever `libmesos_gpu.so` an earlier `cargo build` left in
    /// `target/<profile>` in place of the one the module was linked with (its RUNPATH), and a
    /// test runs stale module code (seen in issue 34: a v2 agent ran a module without the
    /// commit under test).
    fn set_env(&self, cmd: &mut Command) {
        cmd.env_remove("LD_LIBRARY_PATH");
        cmd.envs(self.spec.env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    }

    /// Waits until the agent (re-)registered: up to 2 minutes, as a restarted agent first
    /// recovers every executor checkpointed under its work_dir (thousands after a soak; 30 s
    /// was not enough for 1,750 on a loaded 2-core host).
    fn wait_registered(&mut self) -> MesosResult {
        let log = self.dir.path().join(format!("agent-{}.log", self.starts));
        let child = &mut self.child;
        wait_for(
            Duration::from_secs(120),
            || {
                format!(
                    "the agent to register; log:\n{}",
                    tail(&read_lossy(&log), 40)
                )
            },
            || {
                if let Some(Ok(Some(status))) = child.as_mut().map(Child::try_wait) {
                    return Some(Err(format!(
                        "mesos-agent exited ({status}):\n{}",
                        tail(&read_lossy(&log), 40)
                    )));
                }
                let text = read_lossy(&log);
                (text.contains("Registered with master")
                    || text.contains("Re-registered with master"))
                .then_some(Ok(()))
            },
        )?
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.kill();
        // Executors and tasks outlive a killed agent: kill whatever is in its cgroups.
        for _ in 0..100 {
            let mut pids = Vec::new();
            for root in self.cgroup_roots() {
                collect_pids(&root, &mut pids);
            }
            if pids.is_empty() {
                break;
            }
            for pid in pids {
                let _ = Command::new("kill").args(["-9", &pid]).status();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        unmount_below(self.dir.path());
        // A killed process leaves its cgroup only once it is reaped: retry for a while.
        for _ in 0..250 {
            let roots = self.cgroup_roots();
            if roots.is_empty() {
                break;
            }
            roots.iter().for_each(|root| remove_tree(root));
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

fn collect_pids(dir: &Path, pids: &mut Vec<String>) {
    pids.extend(
        read_lossy(&dir.join("cgroup.procs"))
            .split_whitespace()
            .map(str::to_owned),
    );
    for child in subdirs(dir) {
        collect_pids(&child, pids);
    }
}

/// Removes a cgroup tree, deepest first.
fn remove_tree(dir: &Path) {
    for child in subdirs(dir) {
        remove_tree(&child);
    }
    let _ = fs::remove_dir(dir);
}

/// Lazily unmounts every mount at or below `dir` in this mount namespace, deepest first.
fn unmount_below(dir: &Path) {
    let table = MountTable::read(Path::new("/proc/self/mountinfo")).unwrap_or_default();
    let mut points: Vec<PathBuf> = table
        .entries()
        .iter()
        .map(|m| m.mount_point.clone())
        .filter(|p| p.starts_with(dir))
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    for point in points {
        let _ = Command::new("umount").arg("-l").arg(&point).status();
    }
}
