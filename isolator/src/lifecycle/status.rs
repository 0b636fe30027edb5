//! What the isolator reports about containers: their GPUs (`usage`), kind and cgroup
//! (`status`), who holds which GPU (`allocations`), and how many entries its tables hold
//! (`tracked_entries`).
//!
//! `usage` carries NVML figures (utilisation, and memory used by the container's own processes)
//! when a driver is attached with [`Isolator::attach_health`] and the container has a cgroup of
//! its own; otherwise none, as nothing is reported that was not measured (Mesos's `usage` is
//! empty, §1.6).

use std::path::PathBuf;

use super::{ContainerId, Isolator, LifecycleError};
use mesos_gpu_placement::allocator::GpuSet;

/// Who holds which GPUs, for tests, `status` pages and metrics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allocations {
    /// GPUs nobody holds (healthy and free).
    pub free: Vec<u32>,
    /// Every owner (container id, or [`QUARANTINE_OWNER`]) and its GPUs by NVML index.
    pub owners: Vec<(String, Vec<u32>)>,
    /// Quarantined GPUs and the containers whose cleanup frees them.
    pub quarantined: Vec<(u32, Vec<ContainerId>)>,
}

/// One GPU a container holds, with NVML's figures when they were measured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuUsage {
    /// NVML index.
    pub index: u32,
    /// Minor of `/dev/nvidia<minor>`.
    pub minor: u32,
    /// UUID.
    pub uuid: String,
    /// The container's use of the GPU, read from NVML now; `None` without an attached driver
    /// or for a Docker container (its processes' cgroup is Docker's).
    pub nvml: Option<mesos_gpu_node::usage::GpuUsage>,
}

/// What `usage` reports for a container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Usage {
    /// The GPUs it holds (its parent's, for a nested container).
    pub gpus: Vec<GpuUsage>,
}

/// What kind of container a status is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ContainerKind {
    /// A Mesos containerizer container with its own cgroup.
    Mesos,
    /// A nested container sharing its parent's GPUs.
    Nested {
        /// The parent.
        parent: ContainerId,
    },
    /// A Docker containerizer container (Docker applies its devices).
    Docker,
}

/// What `status` reports for a container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerStatus {
    /// The kind of container.
    pub kind: ContainerKind,
    /// GPUs it may use, by NVML index.
    pub gpus: Vec<u32>,
    /// Its device cgroup directory, if it has one.
    pub cgroup: Option<PathBuf>,
    /// Its share of a shared GPU (the GPU is in `gpus`; a shared MIG device is not, as a MIG
    /// device held whole is not), when it holds one.
    pub share: Option<mesos_gpu_placement::sharing::PlacedShare>,
    /// Its MIG devices, by `MIG-…` UUID.
    pub mig: Vec<String>,
    /// Whose container it is (a nested container: its top-level ancestor's), when the
    /// containerizer said.
    pub holder: Option<mesos_gpu_pool::Holder>,
}

impl Isolator {
    /// The GPUs the container holds (its parent's, for a nested container), with NVML's
    /// figures when a driver is attached. NVML is read without holding the isolator's lock.
    #[tracing::instrument(level = "debug", skip_all, fields(container = %id))]
    pub fn usage(&self, id: &ContainerId) -> Result<Usage, LifecycleError> {
        let status = self.status(id)?;
        let held =
            self.gpus_of(GpuSet::from_indices(status.gpus.iter().copied()).unwrap_or_default());
        let mut figures = self
            .nvml_usage(&status, &held)
            .map(|u| u.gpus)
            .unwrap_or_default();
        let gpus = held
            .into_iter()
            .map(|g| {
                let nvml = figures
                    .iter()
                    .position(|f| f.index == g.index)
                    .map(|at| figures.swap_remove(at));
                GpuUsage {
                    index: g.index,
                    minor: g.minor,
                    uuid: g.uuid,
                    nvml,
                }
            })
            .collect();
        Ok(Usage { gpus })
    }

    /// The container's kind, GPUs and cgroup.
    pub fn status(&self, id: &ContainerId) -> Result<ContainerStatus, LifecycleError> {
        let state = self.lock_local()?;
        let (kind, root) = match state.nested.get(id) {
            Some(parent) => (
                ContainerKind::Nested {
                    parent: parent.clone(),
                },
                parent,
            ),
            None => (ContainerKind::Mesos, id),
        };
        if let Some(entry) = state.containers.get(root) {
            let cgroup = entry.cgroup.as_ref().map(|c| c.path().to_owned());
            return Ok(ContainerStatus {
                kind,
                gpus: entry.visible().to_vec(),
                cgroup,
                share: entry.share.clone(),
                mig: entry.mig.clone(),
                holder: state.holders.get(root).cloned(),
            });
        }
        match state.docker.get(id) {
            Some(set) => {
                let share = state.docker_shares.get(id).cloned();
                let shared = share.as_ref().map(|g| g.index);
                let mut gpus = set.to_vec();
                gpus.extend(shared);
                Ok(ContainerStatus {
                    kind: ContainerKind::Docker,
                    gpus,
                    cgroup: None,
                    share,
                    mig: state.docker_mig.get(id).cloned().unwrap_or_default(),
                    holder: state.holders.get(id).cloned(),
                })
            }
            None => Err(LifecycleError::UnknownContainer {
                container: id.clone(),
                step: "report",
            }),
        }
    }

    /// Runs `read` on the allocator under the isolator's lock: its counters and fragmentation,
    /// for metrics. `read` must be quick; every call of the isolator waits for it.
    pub fn inspect_allocator<R>(
        &self,
        read: impl FnOnce(&mesos_gpu_placement::allocator::Allocator) -> R,
    ) -> Result<R, LifecycleError> {
        Ok(read(&self.lock_local()?.allocator))
    }

    /// Every container the isolator knows: Mesos containers, nested ones and Docker ones, by id.
    pub fn containers(&self) -> Result<Vec<ContainerId>, LifecycleError> {
        let state = self.lock_local()?;
        let mut ids: Vec<ContainerId> = state
            .containers
            .keys()
            .chain(state.nested.keys())
            .chain(state.docker.keys())
            .cloned()
            .collect();
        ids.sort_by(|a, b| a.as_str().cmp(b.as_str()));
        ids.dedup();
        Ok(ids)
    }

    /// Who holds which GPUs now.
    pub fn allocations(&self) -> Result<Allocations, LifecycleError> {
        let state = self.lock_local()?;
        Ok(Allocations {
            free: state.allocator.free().to_vec(),
            owners: state
                .allocator
                .owners()
                .into_iter()
                .map(|(o, set)| (o.to_owned(), set.to_vec()))
                .collect(),
            quarantined: state
                .quarantine
                .iter()
                .map(|(&i, ids)| (i, ids.iter().cloned().collect()))
                .collect(),
        })
    }

    /// How many entries each of the isolator's own tables holds, by table name: every table
    /// that grows with containers, so that a leak per container shows as a count that does
    /// not return to its idle value (metrics, the soak benchmark). Idle, every count is 0 but
    /// `mps_daemons` (a shared GPU's daemon outlives its shares).
    pub fn tracked_entries(&self) -> Result<Vec<(&'static str, usize)>, LifecycleError> {
        let state = self.lock_local()?;
        let mps_daemons = self
            .sharing
            .as_ref()
            .map_or(0, super::shares::Sharing::daemons);
        Ok(vec![
            ("containers", state.containers.len()),
            ("nested", state.nested.len()),
            ("nested_cgroups", state.nested_cgroups.len()),
            ("docker", state.docker.len()),
            ("docker_shares", state.docker_shares.len()),
            ("docker_mig", state.docker_mig.len()),
            ("docker_starts", state.docker_starts.len()),
            ("quarantine", state.quarantine.len()),
            ("failed", state.failed.len()),
            ("allocator_owners", state.allocator.owners().len()),
            ("mig_held", state.mig.held()),
            ("limitations", self.limitations.tracked()),
            ("mps_daemons", mps_daemons),
        ])
    }
}
