//! A framework that launches many tasks: `testkit/python/gpu_framework.py`, written with
//! pymesos (PyPI, Mesos's HTTP scheduler API), driven through its standard input.
//!
//! `mesos-execute` registers one framework per task and takes seconds to do so; benchmarks and
//! soaks that run thousands of tasks launch them through one [`Framework`] instead. Times in its
//! events are `CLOCK_BOOTTIME` seconds, the clock of `/proc/uptime`, so a task that prints its
//! uptime can be placed on the framework's time line.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tempfile::TempDir;

use super::{Master, MesosResult, read_lossy, tail, wait_for};

/// Terminal task states.
pub const TERMINAL: [&str; 7] = [
    "TASK_FINISHED",
    "TASK_FAILED",
    "TASK_KILLED",
    "TASK_LOST",
    "TASK_ERROR",
    "TASK_DROPPED",
    "TASK_GONE",
];

/// How the framework registers.
#[derive(Debug, Clone)]
pub struct FrameworkSpec {
    /// The framework's name.
    pub name: String,
    /// Its role (`*` for none).
    pub role: String,
    /// Declares `GPU_RESOURCES` (pymesos's default on Mesos ≥ 1.0).
    pub gpu_capability: bool,
    /// Checkpoints, so its tasks survive an agent restart.
    pub checkpoint: bool,
}

impl FrameworkSpec {
    /// A checkpointing framework with `GPU_RESOURCES` and no role.
    pub fn gpu(name: &str) -> FrameworkSpec {
        FrameworkSpec {
            name: name.to_owned(),
            role: "*".to_owned(),
            gpu_capability: true,
            checkpoint: true,
        }
    }
}

/// One event the framework reported (see the script's doc string).
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    /// `registered`, `offer`, `accept`, `status`, `error`, …
    pub kind: String,
    /// The task id, for `accept` and `status`.
    pub id: String,
    /// The task state, for `status`.
    pub state: String,
    /// `CLOCK_BOOTTIME` seconds.
    pub t: f64,
    /// The whole event.
    pub json: serde_json::Value,
}

/// A running pymesos framework; dropping it tears it down (its tasks are killed).
#[derive(Debug)]
pub struct Framework {
    child: Child,
    stdin: Option<ChildStdin>,
    events: PathBuf,
    log: Mutex<EventLog>,
    stderr: PathBuf,
    _dir: TempDir,
}

/// The events read so far from the events file, and where reading stopped.
#[derive(Debug, Default)]
struct EventLog {
    offset: u64,
    events: Vec<Event>,
    /// Task id → the indices of its `status` events.
    updates: BTreeMap<String, Vec<usize>>,
}

impl EventLog {
    /// Reads the lines appended to `path` since the last call (whole lines only).
    fn refresh(&mut self, path: &Path) {
        use std::io::{BufRead as _, Seek as _};
        let Ok(mut file) = std::fs::File::open(path) else {
            return;
        };
        if file.seek(std::io::SeekFrom::Start(self.offset)).is_err() {
            return;
        }
        let mut reader = std::io::BufReader::new(file);
        let mut line = String::new();
        while let Ok(n) = reader.read_line(&mut line) {
            if n == 0 || !line.ends_with('\n') {
                break;
            }
            self.offset += n as u64;
            if let Ok(json) = serde_json::from_str::<serde_json::Value>(&line) {
                let event = Event {
                    kind: json["event"].as_str().unwrap_or_default().to_owned(),
                    id: json["id"].as_str().unwrap_or_default().to_owned(),
                    state: json["state"].as_str().unwrap_or_default().to_owned(),
                    t: json["t"].as_f64().unwrap_or_default(),
                    json,
                };
                if event.kind == "status" {
                    self.updates
                        .entry(event.id.clone())
                        .or_default()
                        .push(self.events.len());
                }
                self.events.push(event);
            }
            line.clear();
        }
    }
}

/// The framework's script.
pub fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("python/gpu_framework.py")
}

/// Checks that `python3` imports pymesos; the error says how to install it.
pub fn check_pymesos() -> MesosResult {
    let out = Command::new("python3")
        .args(["-c", "import pymesos"])
        .output()
        .map_err(|e| format!("python3: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "python3 cannot import pymesos (./scripts/test.sh installs it): {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

impl Framework {
    /// Starts the framework against `master` and waits until it registered.
    pub fn start(master: &Master, spec: &FrameworkSpec) -> MesosResult<Framework> {
        let dir = tempfile::Builder::new()
            .prefix("mgpu-framework")
            .tempdir()
            .map_err(|e| format!("tempdir: {e}"))?;
        let events = dir.path().join("events.jsonl");
        let stderr = dir.path().join("stderr");
        let mut cmd = Command::new("python3");
        cmd.arg(script())
            .arg(format!("--master={}", master.address()))
            .arg(format!("--events={}", events.display()))
            .arg(format!("--name={}", spec.name))
            .arg(format!("--role={}", spec.role));
        if !spec.gpu_capability {
            cmd.arg("--no-gpu-capability");
        }
        if !spec.checkpoint {
            cmd.arg("--no-checkpoint");
        }
        let err =
            std::fs::File::create(&stderr).map_err(|e| format!("{}: {e}", stderr.display()))?;
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(err)
            .spawn()
            .map_err(|e| format!("python3 {}: {e}", script().display()))?;
        let stdin = child.stdin.take();
        let fw = Framework {
            child,
            stdin,
            events,
            log: Mutex::new(EventLog::default()),
            stderr,
            _dir: dir,
        };
        wait_for(
            Duration::from_secs(30),
            || format!("the framework to register; stderr:\n{}", fw.stderr_tail()),
            || {
                fw.events()
                    .iter()
                    .any(|e| e.kind == "registered")
                    .then_some(())
            },
        )?;
        Ok(fw)
    }

    /// Asks for task `id` with `resources` (name → scalar) running `command` (a shell
    /// command), on the agent with HTTP port `port` when given.
    pub fn launch(
        &mut self,
        id: &str,
        resources: &[(&str, f64)],
        command: &str,
        port: Option<u16>,
    ) -> MesosResult {
        self.launch_in(id, resources, command, port, None)
    }

    /// [`Framework::launch`] with a `ContainerInfo` (as JSON, e.g. `{"type": "DOCKER",
    /// "docker": {"image": …}}`).
    pub fn launch_in(
        &mut self,
        id: &str,
        resources: &[(&str, f64)],
        command: &str,
        port: Option<u16>,
        container: Option<serde_json::Value>,
    ) -> MesosResult {
        let resources: serde_json::Map<String, serde_json::Value> = resources
            .iter()
            .map(|(k, v)| ((*k).to_owned(), serde_json::json!(v)))
            .collect();
        let mut cmd = serde_json::json!({
            "op": "launch", "id": id, "resources": resources, "command": command,
        });
        if let Some(port) = port {
            cmd["port"] = serde_json::json!(port);
        }
        if let Some(container) = container {
            cmd["container"] = container;
        }
        self.send(&cmd)
    }

    /// Kills task `id`.
    pub fn kill(&mut self, id: &str) -> MesosResult {
        self.send(&serde_json::json!({ "op": "kill", "id": id }))
    }

    fn send(&mut self, cmd: &serde_json::Value) -> MesosResult {
        let stdin = self.stdin.as_mut().ok_or("the framework was stopped")?;
        writeln!(stdin, "{cmd}")
            .and_then(|()| stdin.flush())
            .map_err(|e| format!("framework stdin: {e}; stderr:\n{}", self.stderr_tail()))
    }

    /// Runs `f` on every event so far, in order.
    pub fn with_events<T>(&self, f: impl FnOnce(&[Event]) -> T) -> T {
        let mut log = self.log.lock().unwrap_or_else(PoisonError::into_inner);
        log.refresh(&self.events);
        f(&log.events)
    }

    /// Every event so far, in order.
    pub fn events(&self) -> Vec<Event> {
        self.with_events(<[Event]>::to_vec)
    }

    /// The first event of `kind` for task `id`.
    pub fn first(&self, kind: &str, id: &str) -> Option<Event> {
        self.with_events(|events| {
            events
                .iter()
                .find(|e| e.kind == kind && e.id == id)
                .cloned()
        })
    }

    /// Waits until task `id` reached `state`; a terminal state that is not `state` fails at once.
    pub fn wait_state(&self, id: &str, state: &str, timeout: Duration) -> MesosResult<Event> {
        wait_for(
            timeout,
            || {
                format!(
                    "task {id} to reach {state}; its updates: {:?}; stderr:\n{}",
                    self.updates(id),
                    self.stderr_tail()
                )
            },
            || {
                let updates = self.updates(id);
                if let Some(e) = updates.iter().find(|e| e.state == state) {
                    return Some(Ok(e.clone()));
                }
                updates
                    .iter()
                    .find(|e| TERMINAL.contains(&e.state.as_str()))
                    .map(|e| {
                        Err(format!(
                            "task {id} ended {} ({}), not {state}",
                            e.state, e.json["message"]
                        ))
                    })
            },
        )?
    }

    /// Waits until task `id` reached a terminal state; returns that update.
    pub fn wait_terminal(&self, id: &str, timeout: Duration) -> MesosResult<Event> {
        wait_for(
            timeout,
            || format!("task {id} to end; its updates: {:?}", self.updates(id)),
            || {
                self.updates(id)
                    .into_iter()
                    .find(|e| TERMINAL.contains(&e.state.as_str()))
            },
        )
    }

    /// The status updates of task `id`, in order.
    pub fn updates(&self, id: &str) -> Vec<Event> {
        let mut log = self.log.lock().unwrap_or_else(PoisonError::into_inner);
        log.refresh(&self.events);
        log.updates
            .get(id)
            .map(|at| at.iter().map(|&i| log.events[i].clone()).collect())
            .unwrap_or_default()
    }

    /// The latest state of task `id`, if it has one.
    pub fn state(&self, id: &str) -> Option<String> {
        self.updates(id).pop().map(|e| e.state)
    }

    /// The last lines the script wrote to stderr.
    pub fn stderr_tail(&self) -> String {
        tail(&read_lossy(&self.stderr), 20)
    }

    /// Tears the framework down and waits for the script to exit.
    pub fn stop(&mut self) -> MesosResult {
        if self.stdin.is_some() {
            let _ = self.send(&serde_json::json!({ "op": "stop" }));
            self.stdin = None;
        }
        let child = &mut self.child;
        let waited = wait_for(
            Duration::from_secs(20),
            || "the framework to exit".to_owned(),
            || child.try_wait().ok().flatten(),
        );
        if waited.is_err() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        waited.map(|_| ())
    }
}

impl Drop for Framework {
    fn drop(&mut self) {
        let _ = self.stop();
    }
}
