//! The pool owner of a Docker container: its name, the daemon it runs under and the process
//! that starts it ([`DockerStart`]), recorded so that any publisher of the node's pool can tell
//! whether the container still runs.

use serde::{Deserialize, Serialize};

use mesos_gpu_os::container_id::ContainerId;
use mesos_gpu_pool::{Holder, Owner, ProcessStamp};

/// Where a Docker container runs and which process starts it, for its owner record.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DockerStart {
    /// The daemon's endpoint (`unix:///var/run/docker.sock`).
    pub daemon: Option<String>,
    /// The process that starts the container: the reservation is alive while it runs.
    pub starter: Option<ProcessStamp>,
}

/// Prefix of the names Mesos's Docker containerizer gives its containers (`mesos-<id>`): the one
/// spelling of it, used by the pool's owner records, `mesos_gpu_docker` (which re-exports it)
/// and the agent's Docker hook.
pub const MESOS_NAME_PREFIX: &str = "mesos-";

/// The Docker name of the container with Mesos id `id` (`mesos-<id>`); the name's id is
/// `mesos_gpu_docker::client::mesos_container_id`.
pub fn docker_name(id: &ContainerId) -> String {
    format!("{MESOS_NAME_PREFIX}{id}")
}

/// The pool owner of Docker container `id`, held by `holder`.
pub(crate) fn docker_owner(
    id: &ContainerId,
    start: Option<&DockerStart>,
    holder: Option<&Holder>,
) -> Owner {
    Owner::Docker {
        name: docker_name(id),
        daemon: start.and_then(|s| s.daemon.clone()),
        starter: start.and_then(|s| s.starter.clone()),
        holder: holder.cloned(),
    }
}
