//! The Docker containerizer's share of the pool: one agent, one allocator, one policy. Docker
//! applies `--device` itself, so these calls book GPUs and checkpoint them, and make no cgroup.
//!
//! A reservation is made before its container exists; it records the daemon that will run the
//! container and the process that starts it ([`DockerStart`]), so that the pool can tell a
//! container that is still being started from one that never will be (see
//! [`mesos_gpu_pool::owner`]). The container is named `mesos-<container id>`, as Mesos's Docker
//! containerizer names its containers (`src/slave/containerizer/docker.cpp`, `DOCKER_NAME_PREFIX`).

use std::ops::Deref;

use super::docker_owner::{DockerStart, docker_name, docker_owner};
use super::state::State;
use super::taking::Taking;
use super::{ContainerId, Isolator, LifecycleError};
use mesos_gpu_enforce::pinning::PinOutcome;
use mesos_gpu_grant::Grant;
use mesos_gpu_node::inventory::Gpu;
use mesos_gpu_placement::numa::{self, Affinities, Allowed, Decision};
use mesos_gpu_placement::sharing::Wanted;
use mesos_gpu_pool::{Host, Liveness};

/// GPUs reserved for a Docker container that is not running yet: the one reserve → plan →
/// roll back sequence of every entry point (the module's hook, `docker-args`, the bridge, the
/// demo). Dropped without [`DockerGuard::keep`], it gives the GPUs back (a failed give-back
/// is logged); [`DockerGuard::give_back`] does the same and returns the error. `D` is
/// whatever reaches the isolator: `&Isolator`, or `Arc<Isolator>` to carry it across threads.
#[derive(Debug)]
#[must_use = "a reservation dropped without `keep` gives its GPUs back"]
pub struct DockerGuard<D: Deref<Target = Isolator>> {
    isolator: D,
    id: ContainerId,
    grant: Grant,
    kept: bool,
}

impl<D: Deref<Target = Isolator>> DockerGuard<D> {
    /// Reserves `gpus` GPUs for Docker container `id`, recording `start` in its owner.
    pub fn reserve(
        isolator: D,
        id: &ContainerId,
        gpus: f64,
        start: DockerStart,
    ) -> Result<Self, LifecycleError> {
        let request = super::PrepareConfig {
            gpus,
            ..super::PrepareConfig::default()
        };
        Self::reserve_request(isolator, id, &request, start)
    }

    /// Reserves what `request` asks (`gpus`, and on a MIG node `mig` profiles) for Docker
    /// container `id`, recording `start` in its owner.
    pub fn reserve_request(
        isolator: D,
        id: &ContainerId,
        request: &super::PrepareConfig,
        start: DockerStart,
    ) -> Result<Self, LifecycleError> {
        let grant = isolator.reserve_docker_units(id, request, start)?;
        Ok(DockerGuard {
            isolator,
            id: id.clone(),
            grant,
            kept: false,
        })
    }

    /// What the container gets: GPUs (for a share, its one GPU), MIG devices, the share, and
    /// once [`DockerGuard::pin`] pinned it, its cpuset.
    pub fn grant(&self) -> &Grant {
        &self.grant
    }

    /// NUMA pinning of the container, decided as for a Mesos container
    /// ([`mesos_gpu_placement::numa::plan`] over the GPUs whose affinity counts,
    /// [`Grant::local_gpus`]: MIG parents included) by the GPUs' `affinities`, within `allowed`
    /// (the machine's online CPUs and memory nodes: a Docker container is in no cgroup of ours),
    /// never leaving it fewer than `cpus`. A pinned grant
    /// carries its cpuset, so every Docker renderer gives it; a skipped one is logged.
    pub fn pin(
        &mut self,
        cpus: Option<f64>,
        affinities: &Affinities,
        allowed: &Allowed,
    ) -> PinOutcome {
        let local = self.grant.local_gpus();
        match numa::plan(&local, affinities, allowed, cpus) {
            Decision::Pin(pinning) => {
                self.grant = self.grant.clone().pinned(Some(pinning.clone()));
                PinOutcome::Pinned(pinning)
            }
            Decision::Skip(reason) => {
                tracing::warn!(container = %self.id, %reason, "not pinning the container to its GPUs' local CPUs");
                PinOutcome::Skipped(reason)
            }
        }
    }

    /// The reserved GPUs (for a share, its one GPU).
    pub fn gpus(&self) -> &[Gpu] {
        self.grant.gpus()
    }

    /// The container launches: the GPUs stay reserved until it is released.
    pub fn keep(mut self) -> Vec<Gpu> {
        self.kept = true;
        self.grant.gpus().to_vec()
    }

    /// The launch failed: gives the GPUs back now.
    pub fn give_back(mut self) -> Result<(), LifecycleError> {
        self.kept = true;
        self.isolator.release_docker(&self.id)
    }
}

impl<D: Deref<Target = Isolator>> Drop for DockerGuard<D> {
    fn drop(&mut self) {
        if self.kept {
            return;
        }
        match self.isolator.release_docker(&self.id) {
            Ok(()) => {
                tracing::info!(container = %self.id, "launch failed; its GPUs are given back")
            }
            Err(e) => tracing::error!(
                container = %self.id,
                error = %mesos_gpu_os::error_chain(&e),
                "cannot give back the GPUs of a Docker container whose launch failed"
            ),
        }
    }
}

impl Isolator {
    /// Whether Docker container `id` (recorded with `start`) is still there, as this
    /// isolator's pool host tells (see [`Host::liveness`]).
    pub(crate) fn docker_liveness(
        &self,
        id: &ContainerId,
        start: Option<&DockerStart>,
    ) -> Liveness {
        let owner = docker_owner(id, start, None);
        match self.pool_host() {
            Some(host) => host.liveness(&owner),
            None => Host::default().liveness(&owner),
        }
    }

    /// Why the process that starts Docker container `id` still runs, if it does.
    pub(crate) fn docker_starter_runs(&self, state: &State, id: &ContainerId) -> Option<String> {
        let starter = state.docker_starts.get(id)?.starter.as_ref()?;
        let host = self.pool_host().cloned().unwrap_or_default();
        match host.process(starter) {
            Liveness::Alive(why) => Some(why),
            Liveness::Dead(_) | Liveness::Uncertain(_) => None,
        }
    }

    /// Reserves what `request` asks for Docker container `id`: whole GPUs, a share of one GPU
    /// on a sharing node or MIG devices, as [`Isolator::prepare`] decides. Only through
    /// [`DockerGuard`], which gives them back unless the launch keeps them.
    #[tracing::instrument(skip_all, fields(container = %id, requested = request.gpus, daemon = ?start.daemon))]
    fn reserve_docker_units(
        &self,
        id: &ContainerId,
        request: &super::PrepareConfig,
        start: DockerStart,
    ) -> Result<Grant, LifecycleError> {
        const STEP: &str = "reserve GPUs for";
        let mut state = self.lock()?;
        if state.knows(id) {
            return Err(LifecycleError::AlreadyPrepared {
                container: id.clone(),
                step: STEP,
            });
        }
        self.refuse_blind(id, request, STEP)?;
        let mut taking = Taking::new(&mut state, id);
        let grant = self.take(&mut taking, id, request, STEP, Wanted::Any)?;
        let entry = super::taking::container_of(&grant);
        taking.docker.insert(id.clone(), entry.gpus);
        if let Some(share) = entry.share {
            taking.docker_shares.insert(id.clone(), share);
        }
        if !entry.mig.is_empty() {
            taking.docker_mig.insert(id.clone(), entry.mig);
        }
        taking.docker_starts.insert(id.clone(), start);
        if let Some(holder) = &request.holder {
            taking.holders.insert(id.clone(), holder.clone());
        }
        self.save(&taking, STEP)?;
        taking.keep();
        match grant.share() {
            Some(share) => {
                let g = &share.placed;
                tracing::info!(gpu = %g.uuid, units = g.units, replicas = g.replicas, mode = %g.mode, "reserved a GPU share for a Docker container")
            }
            None => tracing::info!(gpus = ?grant.uuids(), "reserved GPUs for a Docker container"),
        }
        Ok(grant)
    }

    /// Releases a Docker container's GPUs; an unknown container is not an error.
    #[tracing::instrument(skip_all, fields(container = %id))]
    pub fn release_docker(&self, id: &ContainerId) -> Result<(), LifecycleError> {
        const STEP: &str = "release GPUs of";
        let mut state = self.lock()?;
        if state.containers.contains_key(id) {
            return Err(LifecycleError::WrongContainerizer {
                container: id.clone(),
                step: STEP,
                containerizer: "mesos",
            });
        }
        if !state.docker.contains_key(id) {
            tracing::debug!("release of an unknown Docker container");
            return Ok(());
        }
        let (released, _) = state.forget(id);
        state.release_quarantine(id);
        self.limitations.forget(id.as_str());
        self.save(&state, STEP)?;
        tracing::info!(released = %released, "released GPUs of a Docker container");
        Ok(())
    }

    /// Records who starts Docker container `id` now (the `docker-wrapper` at `docker run`), and
    /// on which daemon; refused when `id` holds no reservation (it was freed: its starter died
    /// before the container existed), so that no container runs with GPUs it does not hold.
    #[tracing::instrument(skip_all, fields(container = %id, daemon = ?start.daemon))]
    pub fn claim_docker(
        &self,
        id: &ContainerId,
        start: DockerStart,
    ) -> Result<Vec<Gpu>, LifecycleError> {
        const STEP: &str = "start";
        let mut state = self.lock()?;
        let Some(&set) = state.docker.get(id) else {
            return Err(LifecycleError::UnknownContainer {
                container: id.clone(),
                step: STEP,
            });
        };
        let before = state.docker_starts.insert(id.clone(), start);
        if let Err(e) = self.save(&state, STEP) {
            match before {
                Some(before) => state.docker_starts.insert(id.clone(), before),
                None => state.docker_starts.remove(id),
            };
            return Err(e);
        }
        tracing::info!(gpus = %set, "the Docker container's starter is recorded");
        let shared = state
            .docker_shares
            .get(id)
            .filter(|g| !g.is_mig())
            .map(|g| g.index);
        let visible = set.union(
            mesos_gpu_placement::allocator::GpuSet::from_indices(shared).unwrap_or_default(),
        );
        Ok(self.gpus_of(visible))
    }

    /// True when Docker container `id` holds a reservation of this isolator.
    pub fn holds_docker(&self, id: &ContainerId) -> Result<bool, LifecycleError> {
        Ok(self.lock_local()?.docker.contains_key(id))
    }

    /// Releases Docker container `id`'s GPUs unless its daemon says the container still runs,
    /// or cannot tell: then nothing changes and the answer says why. A record without a daemon
    /// (an older release, `serve`, `run`) is released as [`Isolator::release_docker`] does.
    pub fn release_docker_if_gone(
        &self,
        id: &ContainerId,
    ) -> Result<Option<String>, LifecycleError> {
        let daemon = {
            let state = self.lock_local()?;
            state.docker_starts.get(id).and_then(|s| s.daemon.clone())
        };
        if let Some(daemon) = daemon {
            let host = self.pool_host().cloned().unwrap_or_default();
            match host.docker_container(&docker_name(id), Some(&daemon)) {
                Liveness::Dead(_) => {}
                Liveness::Alive(why) | Liveness::Uncertain(why) => return Ok(Some(why)),
            }
        }
        self.release_docker(id)?;
        Ok(None)
    }
}
