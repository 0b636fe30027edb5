//! The Docker containerizer's share of the pool: one agent, one allocator, one policy. Docker
//! applies `--device` itself, so these calls book GPUs and checkpoint them, and make no cgroup.

use super::{ContainerId, Isolator, LifecycleError};
use crate::inventory::Gpu;

impl Isolator {
    /// Reserves GPUs for a Docker containerizer container from the same pool (Docker applies
    /// the devices itself, so no cgroup is made).
    #[tracing::instrument(skip_all, fields(container = %id, requested = gpus))]
    pub fn reserve_docker(&self, id: &ContainerId, gpus: f64) -> Result<Vec<Gpu>, LifecycleError> {
        const STEP: &str = "reserve GPUs for";
        let mut state = self.lock()?;
        if state.knows(id) {
            return Err(LifecycleError::AlreadyPrepared {
                container: id.clone(),
                step: STEP,
            });
        }
        let alloc = |source| LifecycleError::Allocation {
            container: id.clone(),
            step: STEP,
            source,
        };
        let count = state.allocator.request(gpus).map_err(alloc)?.count();
        let set = self.allocate_shared(&mut state, id, count, STEP)?;
        state.docker.insert(id.clone(), set);
        if let Err(e) = self.save(&state, STEP) {
            state.docker.remove(id);
            state.allocator.release_all(id.as_str());
            return Err(e);
        }
        tracing::info!(gpus = %set, "reserved GPUs for a Docker container");
        Ok(self.gpus_of(set))
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
                owner: "mesos",
            });
        }
        if state.docker.remove(id).is_none() {
            tracing::debug!("release of an unknown Docker container");
            return Ok(());
        }
        let released = state.allocator.release_all(id.as_str());
        state.release_quarantine(id);
        self.limitations.forget(id.as_str());
        self.save(&state, STEP)?;
        tracing::info!(released = %released, "released GPUs of a Docker container");
        Ok(())
    }
}
