//! One GPU pool for both containerizers: a Docker container's `gpus` are drawn from the same
//! lifecycle [`Isolator`] as the Mesos containerizer's (its `DockerGuard`), checkpointed in
//! the same work directory, so the two never get the same GPU. Docker applies the devices itself
//! from the [`LaunchPlan`] rendered for the image from the reserved GPUs
//! ([`crate::args::DockerLaunch::render`]).
//!
//! Facts and decisions (`docs/reference/mesos-gpu-isolator.md` §8, §9; `nvidia-docker.md` §4):
//! - Upstream Mesos books GPUs for its Docker containerizer but never passes them to Docker, and
//!   never recovers them after an agent restart; here the reservation, the `--device`s and the
//!   recovery are one path.
//! - Containers are named `mesos-<ContainerID>`, as Mesos's Docker containerizer names them, and
//!   the ContainerID must be a UUID (Mesos's own `parse()` accepts nothing else): that name is
//!   how [`DockerBridge::recover`] finds the container again after a restart
//!   ([`DockerClient::recover`]), reading its GPUs back from `HostConfig.Devices`.
//! - Order of effects: the image is read and the plan checked (CUDA label against the driver)
//!   before anything is reserved; GPUs are reserved (and checkpointed) before the container is
//!   created, and released when creating or starting it fails. So the checkpoint always names a
//!   superset of the GPUs any container was given; a crash between the reservation and
//!   `docker create` leaves a reservation that the next [`DockerBridge::recover`] releases.
//! - A container's GPUs are released only once Docker reports it ended
//!   ([`DockerBridge::wait_and_release`]); a failed wait keeps them reserved.
//! - The isolator's calls take a mutex and fsync the checkpoint, so they run on tokio's blocking
//!   pool; [`Isolator::recover`] must have been called before the bridge is used.

use std::collections::BTreeSet;
use std::sync::Arc;

use mesos_gpu_grant::Grant;

use mesos_gpu_isolator::{
    lifecycle::ContainerId, lifecycle::ContainerKind, lifecycle::DockerGuard,
    lifecycle::DockerStart, lifecycle::Isolator, lifecycle::LifecycleError,
    lifecycle::RecoveryReport,
};
use mesos_gpu_node::inventory::Gpu;
use mesos_gpu_placement::numa::{Affinities, Allowed};

use crate::args::{ArgsError, DriverSpec, ImageInfo, LaunchPlan};
use crate::client::{
    ContainerSpec, DockerClient, DockerError, MESOS_NAME_PREFIX, RecoveredContainer, docker_name,
    mesos_container_id,
};

/// Why a bridge call failed. A failed launch leaves no reservation and no container behind.
#[derive(Debug, thiserror::Error)]
pub enum BridgeError {
    /// The container id cannot be found again by recovery.
    #[error(
        "container id {id}: expected a UUID (a Mesos ContainerID), so that recovery finds the \
         Docker container {MESOS_NAME_PREFIX}{id} again"
    )]
    UnrecoverableId {
        /// The id given.
        id: ContainerId,
    },
    /// The image could not be read.
    #[error("cannot read image {image}")]
    Image {
        /// The image reference.
        image: String,
        /// Docker's error.
        #[source]
        source: DockerError,
    },
    /// No plan could be made for the image (CUDA too new, no driver, …).
    #[error("cannot give GPUs to container {container} of image {image}")]
    Plan {
        /// The container.
        container: ContainerId,
        /// The image reference.
        image: String,
        /// Why.
        #[source]
        source: ArgsError,
    },
    /// The shared GPU pool refused or failed.
    #[error("the shared GPU pool")]
    Pool {
        /// The isolator's error (names the container and the call).
        #[source]
        source: LifecycleError,
    },
    /// A Docker call about a container failed.
    #[error("cannot {step} container {container}")]
    Docker {
        /// What was being done.
        step: &'static str,
        /// The container.
        container: ContainerId,
        /// Docker's error.
        #[source]
        source: DockerError,
    },
    /// The daemon could not be scanned for GPU containers.
    #[error("cannot list the GPU containers of the Docker daemon")]
    Scan {
        /// Docker's error.
        #[source]
        source: DockerError,
    },
    /// A pool call panicked on its blocking thread.
    #[error("the GPU pool call panicked")]
    Panicked {
        /// The join error.
        #[source]
        source: tokio::task::JoinError,
    },
}

impl BridgeError {
    /// True when there were not enough free GPUs.
    pub fn is_not_enough(&self) -> bool {
        matches!(self, BridgeError::Pool { source } if source.is_not_enough())
    }

    /// True when the `gpus` value itself was refused.
    pub fn is_bad_request(&self) -> bool {
        matches!(self, BridgeError::Pool { source } if source.is_bad_request())
    }
}

/// A container the bridge created, holding GPUs from the pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BridgedContainer {
    /// The pool's id (the Mesos ContainerID).
    pub id: ContainerId,
    /// Docker's container id.
    pub docker_id: String,
    /// Docker's container name, `mesos-<id>`.
    pub name: String,
    /// The GPUs reserved for it, by NVML index.
    pub gpus: Vec<Gpu>,
    /// What Docker was given.
    pub plan: LaunchPlan,
}

/// What [`DockerBridge::recover`] found and did.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct BridgeRecovery {
    /// Running `mesos-<id>` containers holding GPUs; their GPUs are held by the pool now.
    pub running: Vec<RecoveredContainer>,
    /// Of those, the ones the pool had no reservation for (started outside the bridge, or the
    /// checkpoint was lost); their GPUs were taken into the pool.
    pub adopted: Vec<ContainerId>,
    /// Docker containers the pool had reserved GPUs for that are no longer running; released.
    pub released: Vec<ContainerId>,
    /// Containers holding `/dev/nvidia<minor>` nodes of GPUs the node's inventory does not have.
    pub unknown_gpus: Vec<RecoveredContainer>,
    /// The pool's own report (GPUs claimed twice are quarantined, and so on).
    pub report: RecoveryReport,
}

/// What NUMA pinning needs: the CPUs a container asks for, the GPUs' local CPUs and memory
/// nodes, and what it may be pinned within.
#[derive(Debug, Clone)]
struct Pinned {
    cpus: Option<f64>,
    affinities: Affinities,
    allowed: Allowed,
}

/// The Docker containerizer's side of the shared GPU pool.
#[derive(Debug, Clone)]
pub struct DockerBridge {
    isolator: Arc<Isolator>,
    client: DockerClient,
    driver: Option<DriverSpec>,
    gpus: Vec<Gpu>,
    /// NUMA pinning ([`DockerBridge::pinned`]).
    pin: Option<Pinned>,
}

impl DockerBridge {
    /// A bridge drawing from `isolator` (already recovered), launching through `client`, with
    /// the driver volume offered to images that ask for it, and the
    /// node's GPUs (`Inventory::gpus`, to read containers' GPUs back by minor).
    pub fn new(
        isolator: Arc<Isolator>,
        client: DockerClient,
        driver: Option<DriverSpec>,
        gpus: Vec<Gpu>,
    ) -> DockerBridge {
        DockerBridge {
            isolator,
            client,
            driver,
            gpus,
            pin: None,
        }
    }

    /// The same bridge pinning each container it creates to its GPUs' local CPUs and memory
    /// nodes (`affinities`) within `allowed` (the machine's online ones), never fewer CPUs than
    /// `cpus` ([`DockerGuard::pin`]): its `HostConfig` carries the cpuset.
    pub fn pinned(
        mut self,
        cpus: Option<f64>,
        affinities: Affinities,
        allowed: Allowed,
    ) -> DockerBridge {
        self.pin = Some(Pinned {
            cpus,
            affinities,
            allowed,
        });
        self
    }

    /// The pool.
    pub fn isolator(&self) -> &Arc<Isolator> {
        &self.isolator
    }

    /// The Docker client.
    pub fn client(&self) -> &DockerClient {
        &self.client
    }

    /// Reserves `gpus` for `id` and creates (does not start) its container running `cmd` (the
    /// image's command when empty) in `image`. Nothing is reserved when the image cannot run
    /// here; the reservation is given back when `docker create` fails.
    #[tracing::instrument(skip_all, fields(container = %id, requested = gpus, image))]
    pub async fn create(
        &self,
        id: &ContainerId,
        gpus: f64,
        image: &str,
        cmd: &[String],
    ) -> Result<BridgedContainer, BridgeError> {
        let name = docker_name(id);
        if mesos_container_id(&name) != Some(id.as_str()) {
            return Err(BridgeError::UnrecoverableId { id: id.clone() });
        }
        let info = self
            .client
            .image_info(image)
            .await
            .map_err(|source| BridgeError::Image {
                image: image.to_owned(),
                source,
            })?;
        let plan_err = |source| BridgeError::Plan {
            container: id.clone(),
            image: image.to_owned(),
            source,
        };
        // Everything but the GPUs themselves, checked before anything is reserved.
        LaunchPlan::check_image(Some(&info), self.driver.as_ref()).map_err(plan_err)?;
        let mut reservation = self.reserve(id, gpus).await?;
        if let Some(p) = &self.pin {
            reservation.pin(p.cpus, &p.affinities, &p.allowed);
        }
        let created = self
            .create_reserved(id, &name, reservation.grant(), &info, image, cmd)
            .await;
        match created {
            Ok((docker_id, plan)) => Ok(BridgedContainer {
                id: id.clone(),
                docker_id,
                name,
                gpus: reservation.keep(),
                plan,
            }),
            Err(e) => {
                self.give_back_or_log(reservation).await;
                Err(e)
            }
        }
    }

    /// [`DockerBridge::create`], then start; a container that does not start is removed and
    /// its GPUs released.
    pub async fn launch(
        &self,
        id: &ContainerId,
        gpus: f64,
        image: &str,
        cmd: &[String],
    ) -> Result<BridgedContainer, BridgeError> {
        let container = self.create(id, gpus, image, cmd).await?;
        if let Err(source) = self.client.start(&container.docker_id).await {
            if let Err(e) = self.client.remove(&container.docker_id, true).await {
                tracing::error!(container = %id, error = %e, "cannot remove a container that failed to start");
            }
            self.release_or_log(id).await;
            return Err(BridgeError::Docker {
                step: "start",
                container: id.clone(),
                source,
            });
        }
        tracing::info!(container = %id, docker = %container.docker_id, gpus = ?minors(&container.gpus), "started GPU container");
        // Running now: from here the daemon alone says whether it still holds its GPUs (this
        // process may outlive it).
        let isolator = Arc::clone(&self.isolator);
        let owned = id.clone();
        let start = DockerStart {
            daemon: Some(self.client.endpoint().to_owned()),
            starter: None,
        };
        match tokio::task::spawn_blocking(move || isolator.claim_docker(&owned, start)).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => {
                tracing::warn!(container = %id, error = %e, "cannot hand the container's reservation to its daemon")
            }
            Err(e) => {
                tracing::warn!(container = %id, error = %e, "handing the container's reservation to its daemon panicked")
            }
        }
        Ok(container)
    }

    /// Waits for the container to end, then gives its GPUs back; returns its exit code. When the
    /// wait fails the GPUs stay reserved (the container may still run).
    pub async fn wait_and_release(&self, container: &BridgedContainer) -> Result<i64, BridgeError> {
        let code = self
            .client
            .wait(&container.docker_id)
            .await
            .map_err(|source| BridgeError::Docker {
                step: "wait for",
                container: container.id.clone(),
                source,
            })?;
        self.release(&container.id).await?;
        tracing::info!(container = %container.id, code, "GPU container ended; GPUs released");
        Ok(code)
    }

    /// Stops the container (SIGTERM, SIGKILL after `grace_secs`); its GPUs stay reserved until
    /// [`DockerBridge::wait_and_release`] sees it end.
    pub async fn stop(
        &self,
        container: &BridgedContainer,
        grace_secs: i32,
    ) -> Result<(), BridgeError> {
        self.client
            .stop(&container.docker_id, grace_secs)
            .await
            .map_err(|source| BridgeError::Docker {
                step: "stop",
                container: container.id.clone(),
                source,
            })
    }

    /// Gives container `id`'s GPUs back to the pool (nothing when it holds none).
    pub async fn release(&self, id: &ContainerId) -> Result<(), BridgeError> {
        let isolator = Arc::clone(&self.isolator);
        let id = id.clone();
        tokio::task::spawn_blocking(move || isolator.release_docker(&id))
            .await
            .map_err(|source| BridgeError::Panicked { source })?
            .map_err(|source| BridgeError::Pool { source })
    }

    /// After an agent restart: scans the daemon for running `mesos-<id>` containers and makes
    /// the pool hold exactly their GPUs. Reservations of containers that ended meanwhile are
    /// released; running containers the pool did not know are adopted; a GPU also held by a
    /// Mesos container is quarantined for both (see [`RecoveryReport::issues`]).
    #[tracing::instrument(skip_all)]
    pub async fn recover(&self) -> Result<BridgeRecovery, BridgeError> {
        let found = self
            .client
            .recover(&self.gpus)
            .await
            .map_err(|source| BridgeError::Scan { source })?;
        let isolator = Arc::clone(&self.isolator);
        let held: Vec<(ContainerId, Vec<u32>)> = found
            .iter()
            .filter_map(|c| {
                let id = ContainerId::new(c.mesos_container_id.as_str()).ok()?;
                Some((id, c.gpu_minors.clone()))
            })
            .collect();
        let (before, report) = tokio::task::spawn_blocking(move || {
            let before = docker_owners(&isolator)?;
            isolator
                .recover_docker(&held)
                .map(|report| (before, report))
        })
        .await
        .map_err(|source| BridgeError::Panicked { source })?
        .map_err(|source| BridgeError::Pool { source })?;
        let live: BTreeSet<&str> = found
            .iter()
            .map(|c| c.mesos_container_id.as_str())
            .collect();
        let recovery = BridgeRecovery {
            adopted: found
                .iter()
                .filter(|c| !c.gpu_minors.is_empty())
                .filter_map(|c| ContainerId::new(c.mesos_container_id.as_str()).ok())
                .filter(|id| !before.contains(id))
                .collect(),
            released: before
                .iter()
                .filter(|id| !live.contains(id.as_str()))
                .cloned()
                .collect(),
            unknown_gpus: found
                .iter()
                .filter(|c| !c.unknown_minors.is_empty())
                .cloned()
                .collect(),
            running: found,
            report,
        };
        tracing::info!(
            running = recovery.running.len(),
            adopted = ?recovery.adopted,
            released = ?recovery.released,
            unknown = recovery.unknown_gpus.len(),
            issues = recovery.report.issues.len(),
            "recovered the GPUs of Docker containers"
        );
        Ok(recovery)
    }

    async fn reserve(
        &self,
        id: &ContainerId,
        gpus: f64,
    ) -> Result<DockerGuard<Arc<Isolator>>, BridgeError> {
        let isolator = Arc::clone(&self.isolator);
        let owned = id.clone();
        // The reservation names the daemon and this process, which starts the container: it is
        // alive while this process runs (or, once `launch` started the container, while the
        // daemon runs it), then as long as the daemon runs the container (without them it stayed
        // "uncertain" for ever).
        let start = DockerStart {
            daemon: Some(self.client.endpoint().to_owned()),
            starter: mesos_gpu_pool::Host::default().this_process().ok(),
        };
        tokio::task::spawn_blocking(move || DockerGuard::reserve(isolator, &owned, gpus, start))
            .await
            .map_err(|source| BridgeError::Panicked { source })?
            .map_err(|source| BridgeError::Pool { source })
    }

    /// Gives a failed launch's GPUs back off the async threads (the pool's file lock).
    async fn give_back_or_log(&self, reservation: DockerGuard<Arc<Isolator>>) {
        if let Err(e) = tokio::task::spawn_blocking(move || drop(reservation)).await {
            tracing::error!(error = %e, "giving back the GPUs of a failed launch panicked");
        }
    }

    async fn create_reserved(
        &self,
        id: &ContainerId,
        name: &str,
        grant: &Grant,
        info: &ImageInfo,
        image: &str,
        cmd: &[String],
    ) -> Result<(String, LaunchPlan), BridgeError> {
        let plan = LaunchPlan::new(grant, info, self.driver.as_ref()).map_err(|source| {
            BridgeError::Plan {
                container: id.clone(),
                image: image.to_owned(),
                source,
            }
        })?;
        let spec = ContainerSpec {
            name: name.to_owned(),
            image: image.to_owned(),
            cmd: cmd.to_vec(),
            env: Vec::new(),
        };
        let docker_id =
            self.client
                .create(&spec, &plan)
                .await
                .map_err(|source| BridgeError::Docker {
                    step: "create",
                    container: id.clone(),
                    source,
                })?;
        Ok((docker_id, plan))
    }

    async fn release_or_log(&self, id: &ContainerId) {
        if let Err(e) = self.release(id).await {
            tracing::error!(container = %id, error = %e, "cannot give back the GPUs of a failed launch");
        }
    }
}

/// The Docker containers holding GPUs in the pool now.
fn docker_owners(isolator: &Isolator) -> Result<BTreeSet<ContainerId>, LifecycleError> {
    let mut owners = BTreeSet::new();
    for (owner, _) in isolator.allocations()?.owners {
        let Ok(id) = ContainerId::new(owner) else {
            continue;
        };
        if matches!(isolator.status(&id), Ok(s) if s.kind == ContainerKind::Docker) {
            owners.insert(id);
        }
    }
    Ok(owners)
}

fn minors(gpus: &[Gpu]) -> Vec<u32> {
    gpus.iter().map(|g| g.minor).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn docker_names_round_trip_only_for_uuids() {
        let uuid = ContainerId::new("3d8a52b4-1c5e-4f5a-9c1e-2b7d9a0e6f11").expect("id");
        let name = docker_name(&uuid);
        assert_eq!(name, "mesos-3d8a52b4-1c5e-4f5a-9c1e-2b7d9a0e6f11");
        assert_eq!(mesos_container_id(&name), Some(uuid.as_str()));
        let plain = ContainerId::new("task-1").expect("id");
        assert_eq!(mesos_container_id(&docker_name(&plain)), None);
    }

    #[test]
    fn errors_name_the_id_and_predicates_see_the_pool() {
        let id = ContainerId::new("task-1").expect("id");
        let err = BridgeError::UnrecoverableId { id };
        assert!(
            err.to_string()
                .contains("container id task-1: expected a UUID")
        );
        assert!(!err.is_not_enough() && !err.is_bad_request());
    }
}
