//! The isolator's in-memory state: one allocator for the whole agent and what each container
//! holds, and its conversion to the checkpoint.
//!
//! Invariant: the allocator holds exactly the union of every container's GPUs (under the
//! container id), every Docker container's GPUs (under its id) and the quarantined GPUs it
//! manages (under [`QUARANTINE_OWNER`], which no container id can spell because of the `!`).
//!
//! A record's GPUs are their UUIDs, written once. GPUs of a record that this process cannot map
//! onto the GPUs it sees (its discovery failed, sees fewer GPUs, or others than recorded) are
//! *carried* ([`State::carried`]): written back to the checkpoint and the pool exactly as they
//! were, never granted, and dropped only with their container (its cleanup or release: evidence
//! about its owner). Quarantine entries on GPUs the allocator does not manage are kept the same
//! way.

use std::collections::{BTreeMap, BTreeSet};

use super::checkpoint::{Checkpoint, ContainerRecord, GpuRecord};
use super::placement::PlacedCgroup;
use mesos_gpu_enforce::cgroup::DeviceRule;
use mesos_gpu_health::HealthChange;
use mesos_gpu_node::inventory::{Gpu, Inventory};
use mesos_gpu_os::container_id::ContainerId;
use mesos_gpu_placement::sharing::PlacedShare;
use mesos_gpu_placement::{allocator::Allocator, allocator::GpuSet};
use mesos_gpu_pool::GpuUuid;

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
    pub(crate) share: Option<PlacedShare>,
    /// Its MIG devices, by `MIG-…` UUID.
    pub(crate) mig: Vec<String>,
    /// MIG devices of a layout made after it started that its cgroup can reach (recovery found
    /// its own MIG device gone): held out of service until its cleanup, never granted to it.
    pub(crate) mig_quarantine: Vec<String>,
}

impl Container {
    /// Every GPU it may open whole: its whole GPUs and the GPU of its share (not a MIG
    /// device's parent: see [`Container::mig_devices`]).
    pub(crate) fn visible(&self) -> GpuSet {
        match &self.share {
            Some(share) if !share.is_mig() => self
                .gpus
                .union(GpuSet::from_indices([share.index]).unwrap_or_default()),
            _ => self.gpus,
        }
    }

    /// The MIG devices it may open: those it holds whole, then the one it holds a share of.
    pub(crate) fn mig_devices(&self) -> Vec<String> {
        let shared = self.share.as_ref().filter(|g| g.is_mig());
        self.mig
            .iter()
            .cloned()
            .chain(shared.map(|g| g.uuid.clone()))
            .collect()
    }
}

/// What a container's record holds that this process cannot map onto the GPUs it sees, kept
/// as it was written.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Carried {
    /// Whole GPUs, as recorded (index, minor and UUID).
    pub(crate) gpus: Vec<GpuRecord>,
    /// MIG devices of a Mesos container that this process does not see, by UUID.
    pub(crate) mig: Vec<String>,
    /// With `mig`: the record's whole MIG list as written, for its order.
    pub(crate) mig_written: Vec<String>,
    /// GPUs this process manages that the carried records may name (same UUID, index or minor):
    /// held under [`QUARANTINE_OWNER`] while the view lasts, never checkpointed.
    pub(crate) touched: GpuSet,
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
    pub(crate) docker_shares: BTreeMap<ContainerId, PlacedShare>,
    /// Docker containers' MIG devices by `MIG-…` UUID.
    pub(crate) docker_mig: BTreeMap<ContainerId, Vec<String>>,
    /// Where each Docker container runs and who starts it (for its owner record).
    pub(crate) docker_starts: BTreeMap<ContainerId, super::docker_owner::DockerStart>,
    /// Whose each container is (Mesos or Docker), when the containerizer said.
    pub(crate) holders: BTreeMap<ContainerId, mesos_gpu_pool::Holder>,
    /// Quarantined GPUs by index, with the containers whose cleanup frees them (indices the
    /// allocator does not manage included: they are kept as checkpointed).
    pub(crate) quarantine: BTreeMap<u32, BTreeSet<ContainerId>>,
    /// What records hold that this process cannot map onto the GPUs it sees, by container
    /// (see the module docs).
    pub(crate) carried: BTreeMap<ContainerId, Carried>,
    /// GPUs and MIG devices the health monitor reported unhealthy, by UUID, with the report
    /// (marked in the allocator or the MIG units).
    pub(crate) failed: BTreeMap<String, HealthChange>,
    /// The node pool's transaction while a call holds the lock ([`super::shared_pool`]).
    pub(crate) tx: TxSlot,
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
            holders: BTreeMap::new(),
            quarantine: BTreeMap::new(),
            carried: BTreeMap::new(),
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
        // Its own record: the GPUs it holds as written go with it, seen or not.
        self.drop_carried(id);
        self.containers.remove(id);
        self.docker.remove(id);
        self.docker_shares.remove(id);
        self.docker_mig.remove(id);
        self.docker_starts.remove(id);
        self.holders.remove(id);
        let mig = self.mig.release(id.as_str());
        (self.allocator.release_all(id.as_str()), mig)
    }

    /// Forgets what `id`'s record held that this process cannot map (its owner is gone), and
    /// frees the GPUs held for it that no quarantine entry claims.
    pub(crate) fn drop_carried(&mut self, id: &ContainerId) {
        let Some(carried) = self.carried.remove(id) else {
            return;
        };
        let still: GpuSet = GpuSet::from_indices(
            self.quarantine
                .keys()
                .copied()
                .chain(self.carried.values().flat_map(|c| c.touched.iter())),
        )
        .unwrap_or_default();
        let free = carried
            .touched
            .difference(still)
            .intersection(self.allocator.held_by(QUARANTINE_OWNER));
        if !free.is_empty()
            && let Err(e) = self.allocator.release(QUARANTINE_OWNER, free)
        {
            tracing::error!(error = %e, gpus = %free, "quarantine bookkeeping is inconsistent");
        }
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
        // Entries on GPUs the allocator does not manage (kept as checkpointed) go with no more;
        // GPUs a carried record may name stay held.
        let managed = self.allocator.managed();
        let touched: Vec<u32> = self
            .carried
            .values()
            .flat_map(|c| c.touched.iter())
            .collect();
        freed.retain(|&i| managed.contains(i) && !touched.contains(&i));
        let freed = GpuSet::from_indices(freed).unwrap_or_default();
        if !freed.is_empty() {
            if let Err(e) = self.allocator.release(QUARANTINE_OWNER, freed) {
                tracing::error!(error = %e, gpus = %freed, "quarantine bookkeeping is inconsistent");
            }
            tracing::info!(container = %id, gpus = %freed, "released quarantined GPUs");
        }
        freed
    }

    /// The GPU records of container `id` holding `set`: those of `set` as `inventory` names them,
    /// and those carried as written, by index (the order they are always written in).
    pub(crate) fn gpu_records(
        &self,
        id: &ContainerId,
        set: GpuSet,
        inventory: &Inventory,
    ) -> Vec<GpuRecord> {
        let mut records: Vec<GpuRecord> = set
            .iter()
            .filter_map(|i| inventory.by_index(i))
            .filter_map(record_of)
            .collect();
        if let Some(carried) = self.carried.get(id) {
            records.extend(carried.gpus.iter().cloned());
            records.sort_by_key(|r| r.index);
        }
        records
    }

    /// The MIG devices of Mesos container `id` holding `held`: with devices carried, the list as
    /// written (those still held or carried, in their order), then any added since.
    pub(crate) fn mig_records(&self, id: &ContainerId, held: &[String]) -> Vec<String> {
        let Some(carried) = self.carried.get(id).filter(|c| !c.mig.is_empty()) else {
            return held.to_vec();
        };
        let written = &carried.mig_written;
        written
            .iter()
            .filter(|u| held.contains(u) || carried.mig.contains(u))
            .chain(held.iter().filter(|u| !written.contains(u)))
            .cloned()
            .collect()
    }

    /// The checkpoint of this state.
    pub(crate) fn checkpoint(&self, inventory: &Inventory) -> Checkpoint {
        Checkpoint {
            containers: self
                .containers
                .iter()
                .map(|(id, c)| {
                    let rules = c.rules.iter().map(ToString::to_string).collect();
                    (
                        id.to_string(),
                        ContainerRecord {
                            gpus: self.gpu_records(id, c.gpus, inventory),
                            rules,
                            share: c.share.clone(),
                            mig: self.mig_records(id, &c.mig),
                            mig_quarantine: c.mig_quarantine.clone(),
                        },
                    )
                })
                .collect(),
            docker: self
                .docker
                .iter()
                .map(|(id, &set)| (id.to_string(), self.gpu_records(id, set, inventory)))
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
            holders: self
                .holders
                .iter()
                .filter(|(id, _)| {
                    self.containers.contains_key(*id) || self.docker.contains_key(*id)
                })
                .map(|(id, holder)| (id.to_string(), holder.clone()))
                .collect(),
            quarantine: self
                .quarantine
                .iter()
                .map(|(&index, ids)| (index, ids.iter().map(ToString::to_string).collect()))
                .collect(),
        }
    }
}

/// The record of `gpu`, as it is written once: `None` for a GPU NVML gave no UUID (lost at
/// discovery), which is never granted.
pub(crate) fn record_of(gpu: &Gpu) -> Option<GpuRecord> {
    match GpuUuid::new(gpu.uuid.clone()) {
        Ok(uuid) => Some(GpuRecord {
            index: gpu.index,
            minor: gpu.minor,
            uuid,
        }),
        Err(_) => {
            tracing::error!(index = gpu.index, "a GPU without a UUID cannot be recorded");
            None
        }
    }
}

/// A transaction slot in the state (filled while the pool is locked, see `shared_pool`).
pub(crate) type TxSlot = std::cell::RefCell<Option<mesos_gpu_pool::Transaction>>;
