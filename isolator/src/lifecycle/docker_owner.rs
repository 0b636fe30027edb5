//! The pool owner of a Docker container: its name, the daemon it runs under and the process
//! that starts it ([`DockerStart`]), recorded so that any publisher of the node's pool can tell
//! whether the container still runs.

use serde::{Deserialize, Serialize};

use mesos_gpu_os::container_id::ContainerId;
use mesos_gpu_pool::{Owner, ProcessStamp};

/// Where a Docker container runs and which process starts it, for its owner record.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DockerStart {
    /// The daemon's endpoint (`unix:///var/run/docker.sock`).
    pub daemon: Option<String>,
    /// The process that starts the container: the reservation is alive while it runs.
    pub starter: Option<ProcessStamp>,
}

/// The Docker name of the container with Mesos id `id`.
pub(crate) fn docker_name(id: &ContainerId) -> String {
    format!("mesos-{id}")
}

/// The pool owner of Docker container `id`.
pub(crate) fn docker_owner(id: &ContainerId, start: Option<&DockerStart>) -> Owner {
    Owner::Docker {
        name: docker_name(id),
        daemon: start.and_then(|s| s.daemon.clone()),
        starter: start.and_then(|s| s.starter.clone()),
    }
}
