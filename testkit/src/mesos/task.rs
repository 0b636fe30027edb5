//! `mesos-execute` frameworks: one task, or a task group through the default executor.

use std::fs;
use std::path::PathBuf;
use std::process::{Child, Command};
use std::time::Duration;

use tempfile::TempDir;

use super::framework::TERMINAL;
use super::{Master, MesosInstall, MesosResult, read_lossy, spawn_logged, tail, wait_for};

/// A `mesos-execute` framework running one task; killed on drop.
#[derive(Debug)]
pub struct Task {
    name: String,
    child: Child,
    out: PathBuf,
    _dir: TempDir,
}

impl Task {
    /// Launches task `name` with `resources` running `command`, through a framework with the
    /// `GPU_RESOURCES` capability that checkpoints (so the task survives an agent restart).
    pub fn launch(
        install: &MesosInstall,
        master: &Master,
        name: &str,
        resources: &str,
        command: &str,
    ) -> MesosResult<Task> {
        Task::launch_with(
            install,
            master,
            name,
            resources,
            command,
            &["--framework_capabilities=GPU_RESOURCES", "--checkpoint"],
        )
    }

    /// Launches task `name` as [`Task::launch`] through a framework set up by `framework`
    /// (`mesos-execute` flags such as `--role=batch`; no capability unless named there).
    pub fn launch_with(
        install: &MesosInstall,
        master: &Master,
        name: &str,
        resources: &str,
        command: &str,
        framework: &[&str],
    ) -> MesosResult<Task> {
        Task::execute(install, master, name, task_dir()?, |cmd| {
            cmd.arg(format!("--name={name}"))
                .args(framework)
                .arg(format!("--resources={resources}"))
                .arg(format!("--command={command}"));
        })
    }

    /// Launches the task group `group` (a `TaskGroupInfo` as JSON; `agent_id` may be empty)
    /// through the default executor (executor id `default-executor`); `name` names it in this
    /// harness only (`mesos-execute` takes no `--name` with a task group).
    pub fn launch_group(
        install: &MesosInstall,
        master: &Master,
        name: &str,
        group: &serde_json::Value,
    ) -> MesosResult<Task> {
        let dir = task_dir()?;
        let file = dir.path().join("task_group.json");
        fs::write(&file, group.to_string()).map_err(|e| format!("{}: {e}", file.display()))?;
        Task::execute(install, master, name, dir, |cmd| {
            cmd.arg("--framework_capabilities=GPU_RESOURCES")
                .arg("--checkpoint")
                .arg(format!("--task_group=file://{}", file.display()));
        })
    }

    /// Starts `mesos-execute --master=<master>` with the flags `flags` adds, logging to
    /// `execute.log` in `dir`, which the task keeps.
    fn execute(
        install: &MesosInstall,
        master: &Master,
        name: &str,
        dir: TempDir,
        flags: impl FnOnce(&mut Command),
    ) -> MesosResult<Task> {
        let out = dir.path().join("execute.log");
        let mut cmd = Command::new(install.bin("mesos-execute"));
        cmd.arg(format!("--master={}", master.address()));
        flags(&mut cmd);
        let child = spawn_logged(&mut cmd, &out)?;
        Ok(Task {
            name: name.to_owned(),
            child,
            out,
            _dir: dir,
        })
    }

    /// The task's name (its id and its executor's).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// What `mesos-execute` printed.
    pub fn output(&self) -> String {
        read_lossy(&self.out)
    }

    /// The states received so far for any task, in order (`TASK_RUNNING`, …).
    pub fn states(&self) -> Vec<String> {
        self.output()
            .lines()
            .filter_map(|l| l.strip_prefix("Received status update "))
            .filter_map(|l| l.split_whitespace().next())
            .map(str::to_owned)
            .collect()
    }

    /// The states received so far for task `task`, in order.
    pub fn task_states(&self, task: &str) -> Vec<String> {
        let suffix = format!(" for task '{task}'");
        self.output()
            .lines()
            .filter_map(|l| l.strip_prefix("Received status update "))
            .filter_map(|l| l.strip_suffix(suffix.as_str()))
            .map(str::to_owned)
            .collect()
    }

    /// Waits until this framework's task (named as the framework) reached `state`; a terminal
    /// state that is not `state` fails at once.
    pub fn wait_state(&mut self, state: &str, timeout: Duration) -> MesosResult {
        let name = self.name.clone();
        self.wait_task_state(&name, state, timeout)
    }

    /// Waits until task `task` reached `state`, as [`Task::wait_state`].
    pub fn wait_task_state(&mut self, task: &str, state: &str, timeout: Duration) -> MesosResult {
        wait_for(
            timeout,
            || {
                format!(
                    "{task} to reach {state}; mesos-execute:\n{}",
                    tail(&self.output(), 20)
                )
            },
            || {
                let states = self.task_states(task);
                if states.iter().any(|s| s == state) {
                    return Some(Ok(()));
                }
                states
                    .iter()
                    .find(|s| TERMINAL.contains(&s.as_str()))
                    .map(|s| {
                        Err(format!(
                            "{task} ended {s}, not {state}; mesos-execute:\n{}",
                            tail(&self.output(), 20)
                        ))
                    })
            },
        )?
    }

    /// True while `mesos-execute` runs.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

impl Drop for Task {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A fresh directory for one task's files.
fn task_dir() -> MesosResult<TempDir> {
    tempfile::Builder::new()
        .prefix("mgpu-mesos-task")
        .tempdir()
        .map_err(|e| format!("tempdir: {e}"))
}
