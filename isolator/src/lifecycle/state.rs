//! The isolator's in-memory state: one allocator for the whole agent and what each container
//! holds, and its conversion to the checkpoint.
//!
//! Invariant: the allocator holds exactly the union of every container's GPUs (under the
//! container id), every Docker container's GPUs (under its id) and the quarantined GPUs (under
//! [`QUARANTINE_OWNER`], which no container id can spell because of the `!`).

use std::collections::{BTreeMap, BTreeSet};

use super::checkpoint::{Checkpoint, ContainerRecord, GpuRecord};
use super::placement::PlacedCgroup;
use mesos_gpu_enforce::cgroup::DeviceRule;
use mesos_gpu_enforce::container_id::ContainerId;
use mesos_gpu_health::HealthChange;
use mesos_gpu_node::inventory::Inventory;
use mesos_gpu_placement::sharing::ShareGrant;
use mesos_gpu_placement::{allocator::Allocator, allocator::GpuSet};

/// The allocator owner of GPUs whose owner is uncertain after a recovery.
pub const QUARANTINE_OWNER: &str = "!quarantine";

/// A Mesos containerizer container.
#[derive(Debug)]
pub(crate) struct Container {
    /// The GPUs it holds in the allocator.
    pub(crate) gpus: GpuSet,
    /// Its full allow list, as checkpointed and (once created) in force.
    pub(crate) rules: Vec<DeviceRule>,
    /// Its device cgroup; `None` when recovery found it gone.
    pub(crate) cgroup: Option<PlacedCgroup>,
    /// Its share of a shared GPU (then `gpus` is empty), recorded in the node's pool.
    pub(crate) share: Option<ShareGrant>,
    /// Its MIG devices, by `MIG-…` UUID.
    pub(crate) mig: Vec<String>,
    /// MIG devices of a layout made after it started that its cgroup can reach (recovery found
    /// its own MIG device gone): held out of service until its cleanup, never granted to it.
    pub(crate) mig_quarantine: Vec<String>,
}

impl Container {
    /// Every GPU it may open: its whole GPUs and the GPU of its share.
    pub(crate) fn visible(&self) -> GpuSet {
        match &self.share {
            Some(share) => self
                .gpus
                .union(GpuSet::from_indices([share.index]).unwrap_or_default()),
            None => self.gpus,
        }
    }
}

/// Everything behind the isolator's mutex.
#[derive(Debug)]
pub(crate) struct State {
    pub(crate) allocator: Allocator,
    /// The node's MIG devices and who holds them (the allocator never manages their parents).
    pub(crate) mig: mesos_gpu_placement::mig::MigUnits,
    pub(crate) containers: BTreeMap<ContainerId, Container>,
    /// Nested containers and their top-level ancestor (they share its GPUs and cgroup).
    pub(crate) nested: BTreeMap<ContainerId, ContainerId>,
    /// The devices cgroups Mesos made for nested containers of their own (cgroup v1,
    /// `share_cgroups=false`), which get their ancestor's entries too.
    pub(crate) nested_cgroups: BTreeMap<ContainerId, PlacedCgroup>,
    pub(crate) docker: BTreeMap<ContainerId, GpuSet>,
    /// Docker containers holding a share of a shared GPU (their `docker` entry is empty).
    pub(crate) docker_shares: BTreeMap<ContainerId, ShareGrant>,
    /// Docker containers' MIG devices by `MIG-…` UUID.
    pub(crate) docker_mig: BTreeMap<ContainerId, Vec<String>>,
    /// Where each Docker container runs and who starts it (for its owner record).
    pub(crate) docker_starts: BTreeMap<ContainerId, super::DockerStart>,
    /// Quarantined GPUs by index, with the containers whose cleanup frees them.
    pub(crate) quarantine: BTreeMap<u32, BTreeSet<ContainerId>>,
    /// GPUs and MIG devices the health monitor reported unhealthy, by UUID, with the report
    /// (marked in the allocator or the MIG units).
    pub(crate) failed: BTreeMap<String, HealthChange>,
    /// The node pool's transaction while a call holds the lock ([`super::shared_pool`]).
    pub(crate) tx: super::shared_pool::TxSlot,
}

impl State {
    pub(crate) fn new(allocator: Allocator, mig: mesos_gpu_placement::mig::MigUnits) -> State {
        State {
            allocator,
            mig,
            containers: BTreeMap::new(),
            nested: BTreeMap::new(),
            nested_cgroups: BTreeMap::new(),
            docker: BTreeMap::new(),
            docker_shares: BTreeMap::new(),
            docker_mig: BTreeMap::new(),
            docker_starts: BTreeMap::new(),
            quarantine: BTreeMap::new(),
            failed: BTreeMap::new(),
            tx: Default::default(),
        }
    }

    /// True when `id` names any container this state knows.
    pub(crate) fn knows(&self, id: &ContainerId) -> bool {
        self.containers.contains_key(id)
            || self.nested.contains_key(id)
            || self.docker.contains_key(id)
    }

    /// True when nothing is held or known.
    pub(crate) fn is_empty(&self) -> bool {
        self.containers.is_empty()
            && self.docker.is_empty()
            && self.quarantine.is_empty()
            && self.nested.is_empty()
    }

    /// Forgets container `id` (Mesos or Docker): its entries, and the GPUs and MIG devices it
    /// holds go back to the allocator; returns those. Its claims on quarantined GPUs and its
    /// nested containers are the caller's (`cleanup`).
    pub(crate) fn forget(&mut self, id: &ContainerId) -> (GpuSet, Vec<String>) {
        self.containers.remove(id);
        self.docker.remove(id);
        self.docker_shares.remove(id);
        self.docker_mig.remove(id);
        self.docker_starts.remove(id);
        let mig = self.mig.release(id.as_str());
        (self.allocator.release_all(id.as_str()), mig)
    }

    /// Drops `id`'s claims on quarantined GPUs and frees those nobody else claims.
    pub(crate) fn release_quarantine(&mut self, id: &ContainerId) -> GpuSet {
        let mut freed = Vec::new();
        self.quarantine.retain(|&index, claimants| {
            claimants.remove(id);
            if claimants.is_empty() {
                freed.push(index);
                false
            } else {
                true
            }
        });
        let freed = GpuSet::from_indices(freed).unwrap_or_default();
        if !freed.is_empty() {
            if let Err(e) = self.allocator.release(QUARANTINE_OWNER, freed) {
                tracing::error!(error = %e, gpus = %freed, "quarantine bookkeeping is inconsistent");
            }
            tracing::info!(container = %id, gpus = %freed, "released quarantined GPUs");
        }
        freed
    }

    /// The checkpoint of this state.
    pub(crate) fn checkpoint(&self, inventory: &Inventory) -> Checkpoint {
        let records = |set: GpuSet| -> Vec<GpuRecord> {
            set.iter()
                .filter_map(|i| inventory.by_index(i))
                .map(|g| GpuRecord {
                    index: g.index,
                    minor: g.minor,
                    uuid: g.uuid.clone(),
                })
                .collect()
        };
        Checkpoint {
            containers: self
                .containers
                .iter()
                .map(|(id, c)| {
                    let rules = c.rules.iter().map(ToString::to_string).collect();
                    (
                        id.to_string(),
                        ContainerRecord {
                            gpus: records(c.gpus),
                            rules,
                            share: c.share.clone(),
                            mig: c.mig.clone(),
                            mig_quarantine: c.mig_quarantine.clone(),
                        },
                    )
                })
                .collect(),
            docker: self
                .docker
                .iter()
                .map(|(id, &set)| (id.to_string(), records(set)))
                .collect(),
            docker_shares: self
                .docker_shares
                .iter()
                .map(|(id, grant)| (id.to_string(), grant.clone()))
                .collect(),
            docker_mig: self
                .docker_mig
                .iter()
                .map(|(id, uuids)| (id.to_string(), uuids.clone()))
                .collect(),
            docker_starts: self
                .docker_starts
                .iter()
                .filter(|(id, _)| self.docker.contains_key(*id))
                .map(|(id, start)| (id.to_string(), start.clone()))
                .collect(),
            quarantine: self
                .quarantine
                .iter()
                .map(|(&index, ids)| (index, ids.iter().map(ToString::to_string).collect()))
                .collect(),
        }
    }
}
