//! Who a reservation belongs to, and whether that owner is still there.
//!
//! A process owner (a Mesos agent, `mesos-gpu exec`) is checked through
//! [`mesos_gpu_os::liveness`]: its pid, start time and boot id, and its cgroup's processes.
//!
//! A Docker container's reservation is made before the container exists (the agent's hook
//! reserves, the agent pulls the image, then `docker run` creates the container), so it names
//! the process that will start it (its `starter`: the agent, then the
//! `docker-wrapper` running `docker run`): while that process runs the reservation is alive.
//! Once it is gone, the daemon that ran the container decides ([`DockerDaemons`], which this
//! crate leaves to a Docker client): running, paused, restarting or stopping is alive; any other state,
//! or no such container, is dead (Docker's container states: `docker inspect` `.State.Status`);
//! a daemon that does not answer leaves the reservation uncertain.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use mesos_gpu_os::Processes;

use crate::holder::Holder;
pub use mesos_gpu_os::{Liveness, ProcessStamp};
use serde::{Deserialize, Serialize};

/// Who a reservation belongs to, with what it takes to check that it is still there.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Owner {
    /// A container of a Mesos agent's unified containerizer (the module).
    Mesos {
        /// The agent process.
        agent: ProcessStamp,
        /// The container's device cgroup.
        cgroup: Option<PathBuf>,
        /// Whose container it is (absent when Mesos did not say, and in older records).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        holder: Option<Holder>,
    },
    /// A Docker container, named as Docker knows it.
    Docker {
        /// The container's name (`mesos-<container id>`).
        name: String,
        /// The daemon that runs it (`unix:///var/run/docker.sock`); `None` in records of an
        /// older mesos-gpu, which are never freed by a daemon check.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        daemon: Option<String>,
        /// The process that starts the container (the agent that reserved, then the
        /// `docker-wrapper` that runs `docker run`): alive while it runs, whatever the daemon
        /// says.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        starter: Option<ProcessStamp>,
        /// Whose container it is (absent when the starter did not say, and in older records).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        holder: Option<Holder>,
    },
    /// A process that holds GPUs for the processes of its cgroup (`mesos-gpu exec`).
    Process {
        /// The process.
        process: ProcessStamp,
        /// The cgroup its command runs in; made by it, so removed when found empty.
        cgroup: Option<PathBuf>,
        /// Its private checkpoint directory, removed with the reservation.
        private_dir: Option<PathBuf>,
    },
    /// GPUs whose owner recovery could not establish, held until the named containers are
    /// cleaned up by the publisher that recorded them.
    Quarantine {
        /// Why, for the operator.
        reason: String,
    },
}

impl Owner {
    /// A short name of the kind, for listings.
    pub fn kind(&self) -> &'static str {
        match self {
            Owner::Mesos { .. } => "mesos",
            Owner::Docker { .. } => "docker",
            Owner::Process { .. } => "process",
            Owner::Quarantine { .. } => "quarantine",
        }
    }

    /// Whose container this is, when recorded (Mesos and Docker containers only).
    pub fn holder(&self) -> Option<&Holder> {
        match self {
            Owner::Mesos { holder, .. } | Owner::Docker { holder, .. } => holder.as_ref(),
            Owner::Process { .. } | Owner::Quarantine { .. } => None,
        }
    }

    /// The cgroup this owner's processes run in, if any.
    pub fn cgroup(&self) -> Option<&Path> {
        match self {
            Owner::Mesos { cgroup, .. } | Owner::Process { cgroup, .. } => cgroup.as_deref(),
            Owner::Docker { .. } | Owner::Quarantine { .. } => None,
        }
    }
}

/// What a Docker daemon says of a container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DaemonAnswer {
    /// It has the container, in this state (`.State.Status`: `created`, `running`, `paused`,
    /// `restarting`, `removing`, `exited`, `dead`).
    State(String),
    /// It has no container of that name.
    NoSuchContainer,
    /// It did not answer (why).
    Unreachable(String),
}

/// Asks Docker daemons about containers. The isolator does not speak Docker's API: a Docker
/// client (docker-bridge) implements this, and [`Host::with_docker`] plugs it in.
pub trait DockerDaemons: fmt::Debug + Send + Sync {
    /// What the daemon at `endpoint` (`unix:///PATH`) says of container `name`.
    fn container(&self, endpoint: &str, name: &str) -> DaemonAnswer;

    /// The minors of the GPU device nodes (`…/nvidia<minor>`) the daemon at `endpoint` gave
    /// container `name` (its `HostConfig.Devices`), or why it cannot say.
    fn gpu_minors(&self, endpoint: &str, name: &str) -> Result<Vec<u32>, String>;
}

/// Where liveness is read from: `/proc` (rooted, for tests), and Docker daemons when a client
/// is plugged in.
#[derive(Debug, Clone)]
pub struct Host {
    procs: Processes,
    docker: Option<Arc<dyn DockerDaemons>>,
}

impl Default for Host {
    fn default() -> Host {
        Host::at("/proc")
    }
}

impl Host {
    /// Reads processes under `proc_root` (normally `/proc`).
    pub fn at(proc_root: impl Into<PathBuf>) -> Host {
        Host {
            procs: Processes::at(proc_root),
            docker: None,
        }
    }

    /// This host, asking `daemons` whether Docker owners' containers still run.
    pub fn with_docker(mut self, daemons: Arc<dyn DockerDaemons>) -> Host {
        self.docker = Some(daemons);
        self
    }

    /// Whether the container of a Docker owner runs, asked of its daemon (the starter process
    /// is not consulted); uncertain without a Docker client or a recorded daemon.
    pub fn docker_container(&self, name: &str, daemon: Option<&str>) -> Liveness {
        let Some(daemon) = daemon else {
            return Liveness::Uncertain(format!(
                "Docker container {name} was recorded without its daemon (by `serve`, `run` or the module's C API, which release it themselves): `mesos-gpu gpu release` it once it is gone"
            ));
        };
        let Some(daemons) = &self.docker else {
            return Liveness::Uncertain(format!(
                "Docker container {name} on {daemon} is checked by processes with a Docker client (`mesos-gpu gpu list`, docker-args, docker-wrapper, serve, the agent's module)"
            ));
        };
        match daemons.container(daemon, name) {
            DaemonAnswer::State(state)
                if matches!(
                    state.as_str(),
                    "running" | "paused" | "restarting" | "stopping"
                ) =>
            {
                Liveness::Alive(format!("Docker container {name} is {state} on {daemon}"))
            }
            DaemonAnswer::State(state) => {
                Liveness::Dead(format!("Docker container {name} is {state} on {daemon}"))
            }
            DaemonAnswer::NoSuchContainer => {
                Liveness::Dead(format!("{daemon} has no Docker container {name}"))
            }
            DaemonAnswer::Unreachable(why) => Liveness::Uncertain(format!(
                "cannot ask {daemon} about Docker container {name}: {why}"
            )),
        }
    }

    /// The minors of the GPU device nodes the daemon of a Docker owner gave its container, or
    /// why they cannot be read (no Docker client, no recorded daemon, no answer).
    pub fn docker_gpu_minors(&self, name: &str, daemon: Option<&str>) -> Result<Vec<u32>, String> {
        let daemon = daemon
            .ok_or_else(|| format!("Docker container {name} was recorded without its daemon"))?;
        let daemons = self.docker.as_ref().ok_or_else(|| {
            format!("this process has no Docker client to ask {daemon} about container {name}")
        })?;
        daemons.gpu_minors(daemon, name)
    }

    /// The stamp of this process.
    pub fn this_process(&self) -> io::Result<ProcessStamp> {
        self.procs.this_process()
    }

    /// The stamp of process `pid`.
    pub fn stamp(&self, pid: u32) -> io::Result<ProcessStamp> {
        self.procs.stamp(pid)
    }

    /// Whether the stamped process still runs.
    pub fn process(&self, stamp: &ProcessStamp) -> Liveness {
        self.procs.process(stamp)
    }

    /// Whether `owner` is still there. A process owner (a Mesos agent, `exec`) is dead only
    /// when the process is gone **and** its cgroup has no process left; a Docker owner is alive
    /// while its starter runs, then as [`Host::docker_container`] says.
    pub fn liveness(&self, owner: &Owner) -> Liveness {
        let (process, cgroup) = match owner {
            Owner::Mesos { agent, cgroup, .. } => (agent, cgroup),
            Owner::Process {
                process, cgroup, ..
            } => (process, cgroup),
            Owner::Docker {
                name,
                daemon,
                starter,
                ..
            } => {
                if let Some(starter) = starter {
                    match self.process(starter) {
                        Liveness::Alive(why) => {
                            return Liveness::Alive(format!(
                                "{why}: it starts (or runs) Docker container {name}"
                            ));
                        }
                        Liveness::Uncertain(why) => return Liveness::Uncertain(why),
                        Liveness::Dead(_) => {}
                    }
                }
                return self.docker_container(name, daemon.as_deref());
            }
            Owner::Quarantine { reason } => return Liveness::Uncertain(reason.clone()),
        };
        self.procs.process_or_cgroup(process, cgroup.as_deref())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn fake_proc(pid: u32, state: char, start: u64) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("sys/kernel/random")).unwrap();
        std::fs::write(dir.path().join("sys/kernel/random/boot_id"), "boot-a\n").unwrap();
        let p = dir.path().join(pid.to_string());
        std::fs::create_dir_all(&p).unwrap();
        let mut fields: Vec<String> = (4..=52).map(|n| n.to_string()).collect();
        fields[18] = start.to_string();
        std::fs::write(
            p.join("stat"),
            format!("{pid} (a (b) c) {state} {}\n", fields.join(" ")),
        )
        .unwrap();
        dir
    }

    fn stamp(pid: u32, start: u64, boot: &str) -> ProcessStamp {
        ProcessStamp {
            pid,
            start_time: start,
            boot_id: boot.into(),
        }
    }

    #[test]
    fn a_dead_process_with_a_busy_cgroup_is_alive() {
        let proc = fake_proc(7, 'S', 500);
        let host = Host::at(proc.path());
        let cgroup = tempfile::tempdir().unwrap();
        let owner = Owner::Process {
            process: stamp(9, 1, "boot-a"),
            cgroup: Some(cgroup.path().to_owned()),
            private_dir: None,
        };
        std::fs::write(cgroup.path().join("cgroup.procs"), "7\n").unwrap();
        assert!(matches!(host.liveness(&owner), Liveness::Alive(_)));
        std::fs::write(cgroup.path().join("cgroup.procs"), "").unwrap();
        assert!(host.liveness(&owner).is_dead());
        let docker = Owner::Docker {
            name: "x".into(),
            daemon: Some("unix:///run/docker.sock".into()),
            starter: None,
            holder: None,
        };
        assert!(matches!(host.liveness(&docker), Liveness::Uncertain(_)));
    }

    #[test]
    fn the_holder_is_recorded_in_the_owner_and_older_records_read_without_it() {
        let owner = Owner::Docker {
            name: "mesos-c1".into(),
            daemon: None,
            starter: None,
            holder: Some(Holder {
                task_id: Some("t1".into()),
                framework_id: Some("f1".into()),
                ..Holder::default()
            }),
        };
        let text = serde_json::to_string(&owner).unwrap();
        assert_eq!(
            text,
            r#"{"kind":"docker","name":"mesos-c1","holder":{"framework_id":"f1","task_id":"t1"}}"#
        );
        assert_eq!(serde_json::from_str::<Owner>(&text).unwrap(), owner);
        assert_eq!(
            owner.holder().and_then(|h| h.task_id.as_deref()),
            Some("t1")
        );
        let older: Owner = serde_json::from_str(
            r#"{"kind":"mesos","agent":{"pid":1,"start_time":2,"boot_id":"b"},"cgroup":null}"#,
        )
        .unwrap();
        assert_eq!(older.holder(), None);
    }
}
