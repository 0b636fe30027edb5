//! Recovery after an agent restart: rebuild the state from the checkpoint **and** the live
//! cgroups, and report every inconsistency instead of guessing.
//!
//! Facts relied on (`docs/reference/mesos-gpu-isolator.md` §1.2, §5.2, §5.3):
//! - Mesos v1 recovery counts a GPU as held when `devices.list` has an entry with its exact
//!   major:minor; we do the same, so a wildcard is never read as a claim on every GPU;
//! - a v2 device program cannot be read back, so v2 relies on the checkpoint, and we check that
//!   our program is still attached (then attach the checkpointed list again);
//! - Mesos frees orphans' GPUs at once, so a new container can get a GPU an orphan still uses.
//!
//! Rules (safe by construction, see the module docs of [`super`] for the write ordering):
//! - every container found (checkpoint or cgroup) keeps its GPUs until `cleanup`, whether the
//!   agent lists it as running, as an orphan, or not at all (reported as unclaimed);
//! - v1: the GPUs held are the union of the checkpoint's and `devices.list`'s; a difference is
//!   reported and the cgroup is set to allow the union (it is reserved for that container);
//! - a cgroup without a checkpoint entry (lost checkpoint, or made by someone else): its v1
//!   GPUs, or on v2 — where the list is unknowable — every GPU when processes are in it, are
//!   quarantined until that container's cleanup. Where Mesos makes the container cgroups
//!   ([`CgroupMaker::Mesos`]) every container has one, GPUs or not: a v1 cgroup granting no GPU
//!   and a v2 cgroup without our program are Mesos's containers without GPUs and are left
//!   alone, as are Mesos's own `<cgroups_root>/agent` (v2) and `<cgroups_root>/slave` (v1);
//! - v1 with Mesos's cgroups: a mismatch is repaired by adding the union's entries, never by
//!   rewriting Mesos's list;
//! - a GPU claimed by two containers is quarantined until both are cleaned up;
//! - a recorded GPU this process cannot map (its discovery failed, it sees fewer GPUs, or another
//!   GPU at that index) is *carried*: its record is written back as it was, none of its GPUs is
//!   granted, and a GPU it may name (same UUID, index or minor) is held out (quarantined, not
//!   checkpointed) while this process runs or until the container goes; the report lists these
//!   records ([`RecoveryReport::unchecked`]) for the caller's warning.

use std::collections::{BTreeMap, BTreeSet};

use mesos_gpu_os::error_chain;

use super::checkpoint::{Checkpoint, ContainerRecord, GpuRecord};
use super::docker_owner::DockerStart;
use super::launch::allowed_minors;
use super::placement::PlacedCgroup;
use super::state::{Carried, Container, QUARANTINE_OWNER, State, TxSlot};
use super::{CgroupMaker, Isolator, LifecycleError, health};
use mesos_gpu_enforce::cgroup::CgroupVersion;
use mesos_gpu_enforce::{
    cgroup::Access, cgroup::DeviceCgroup, cgroup::DeviceKind, cgroup::DeviceRule,
    cgroup::V2DeviceCgroup, cgroup::read_procs,
};
use mesos_gpu_grant::device_rules;
use mesos_gpu_node::inventory::DevNum;
use mesos_gpu_os::container_id::ContainerId;
use mesos_gpu_placement::sharing::PlacedShare;
use mesos_gpu_placement::{allocator::Allocator, allocator::GpuSet};
use mesos_gpu_pool::Liveness;

/// A container the agent recovered (Mesos's `ContainerState`, the part the isolator reads).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecoverState {
    /// The container.
    pub id: ContainerId,
    /// Its parent, for a nested container.
    pub parent: Option<ContainerId>,
    /// Where Mesos puts a nested container's own cgroup, relative to the cgroups root
    /// ([`super::PrepareConfig::nested_cgroup`]).
    pub nested_cgroup: Option<std::path::PathBuf>,
}

/// Something recovery found that does not add up, and what it did about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecoveryIssue {
    /// The checkpoint names the container but its cgroup is gone; its GPUs stay reserved until
    /// cleanup.
    CgroupMissing {
        /// The container.
        container: ContainerId,
        /// Its checkpointed GPUs.
        gpus: Vec<u32>,
    },
    /// A cgroup exists with no checkpoint entry; `quarantined` GPUs are held until its cleanup.
    NoCheckpoint {
        /// The container (the cgroup's name).
        container: ContainerId,
        /// The GPUs quarantined for it.
        quarantined: Vec<u32>,
    },
    /// A container the agent recovered with no checkpoint entry (started before the module was
    /// loaded, e.g. by Mesos's `gpu/nvidia`): it now holds `gpus`, the GPUs its cgroup allows,
    /// until its cleanup.
    Adopted {
        /// The container.
        container: ContainerId,
        /// The GPUs it holds.
        gpus: Vec<u32>,
    },
    /// v1: `devices.list` and the checkpoint disagree (a crash mid-update); the union is kept.
    Mismatch {
        /// The container.
        container: ContainerId,
        /// GPUs in the checkpoint.
        checkpointed: Vec<u32>,
        /// GPUs in `devices.list`.
        live: Vec<u32>,
    },
    /// Several containers claim one GPU; it is quarantined until all of them are cleaned up.
    ClaimedTwice {
        /// NVML index.
        gpu: u32,
        /// The claimants.
        claimants: Vec<ContainerId>,
    },
    /// Found in the checkpoint or the cgroups, but the agent named it neither running nor
    /// orphan; its GPUs stay reserved until `cleanup`.
    Unclaimed {
        /// The container.
        container: ContainerId,
    },
    /// A checkpointed MIG device the node no longer has (MIG reconfigured under running tasks).
    MigChanged {
        /// The container.
        container: ContainerId,
        /// The device's `MIG-…` UUID.
        uuid: String,
        /// MIG devices of the new layout the container's cgroup can open (it allows their
        /// capability nodes), held out of service until its cleanup.
        quarantined: Vec<String>,
    },
    /// v2: our device program was not attached; the checkpointed list was attached again.
    ProgramMissing {
        /// The container.
        container: ContainerId,
    },
    /// The checkpoint names a GPU the node does not have (or a different UUID at that index).
    UnknownGpu {
        /// The container.
        container: ContainerId,
        /// NVML index as checkpointed.
        index: u32,
        /// UUID as checkpointed.
        uuid: String,
    },
    /// The container's cgroup could not be recovered; its GPUs are quarantined until cleanup.
    Unrecoverable {
        /// The container.
        container: ContainerId,
        /// Why, with its causes.
        error: String,
    },
}

/// What recovery did.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RecoveryReport {
    /// Mesos containers the agent listed, with their GPUs restored.
    pub recovered: Vec<ContainerId>,
    /// Orphans, whose GPUs stay reserved until their cleanup.
    pub orphans: Vec<ContainerId>,
    /// Docker containers restored.
    pub docker: Vec<ContainerId>,
    /// Everything inconsistent.
    pub issues: Vec<RecoveryIssue>,
    /// Records kept as written because this process cannot check their GPUs.
    pub unchecked: Option<Unchecked>,
}

/// Records whose GPUs this process cannot map onto the GPUs it sees (it sees none, fewer, or
/// others): kept as written, in the checkpoint and the node's pool, and none of their GPUs
/// granted. Its `Display` is the line to warn with: the records, then why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unchecked {
    /// The containers, each with the GPUs it cannot check (`UUID@index` as recorded, and MIG
    /// device UUIDs).
    pub records: Vec<(ContainerId, Vec<String>)>,
    /// Why: discovery's reason when this process sees no GPU, else the GPUs it sees.
    pub why: String,
}

impl std::fmt::Display for Unchecked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (n, (id, gpus)) in self.records.iter().enumerate() {
            let sep = if n == 0 { "" } else { ", " };
            write!(f, "{sep}{id} ({})", gpus.join(" "))?;
        }
        write!(f, ": {}", self.why)
    }
}

impl RecoveryReport {
    /// True when nothing inconsistent was found.
    pub fn is_clean(&self) -> bool {
        self.issues.is_empty()
    }
}

/// Recorded GPUs as this process maps them ([`Isolator::map_records`]).
#[derive(Default)]
struct Mapped {
    /// Those it can map.
    set: GpuSet,
    /// Those it cannot, as written.
    carried: Vec<GpuRecord>,
    /// GPUs it manages that a carried record may name.
    touched: GpuSet,
}

/// One container as found.
struct Found {
    gpus: GpuSet,
    rules: Vec<DeviceRule>,
    cgroup: Option<PlacedCgroup>,
}

/// The checkpointed holders of the containers `state` kept (Mesos or Docker).
fn holders_kept(ckpt: &Checkpoint, state: &State) -> BTreeMap<ContainerId, mesos_gpu_pool::Holder> {
    ckpt.holders
        .iter()
        .filter_map(|(id, holder)| Some((ContainerId::new(id.as_str()).ok()?, holder.clone())))
        .filter(|(id, _)| state.containers.contains_key(id) || state.docker.contains_key(id))
        .collect()
}

/// What recovery has found so far, before the state is rebuilt from it.
#[derive(Default)]
struct Scan {
    /// The report under way.
    report: RecoveryReport,
    /// Mesos containers kept, with their GPUs, rules and cgroup.
    found: BTreeMap<ContainerId, Found>,
    /// Mesos containers' shares of shared GPUs.
    shares: BTreeMap<ContainerId, PlacedShare>,
    /// Mesos containers' MIG devices that this process sees.
    migs: BTreeMap<ContainerId, Vec<String>>,
    /// Every container claiming each GPU, by index.
    claims: BTreeMap<u32, BTreeSet<ContainerId>>,
    /// Quarantined GPUs by index, with the containers whose cleanup frees them.
    quarantine: BTreeMap<u32, BTreeSet<ContainerId>>,
    /// Records this process cannot map onto the GPUs it sees.
    carried: BTreeMap<ContainerId, Carried>,
    /// MIG devices of a new layout that a container's cgroup can open, held out of service.
    mig_quarantine: BTreeMap<ContainerId, Vec<String>>,
    /// Docker containers still alive, with their GPUs.
    docker: BTreeMap<ContainerId, GpuSet>,
    /// Where each Docker container runs and who starts it.
    docker_starts: BTreeMap<ContainerId, DockerStart>,
    /// Docker containers' shares of shared GPUs.
    docker_shares: BTreeMap<ContainerId, PlacedShare>,
    /// Docker containers' MIG devices by UUID.
    docker_mig: BTreeMap<ContainerId, Vec<String>>,
}

/// What the node's pool says of its other publishers, read once when recovery starts.
struct PoolView {
    /// Owner ids other publishers record: their cgroups are theirs.
    elsewhere: BTreeSet<String>,
    /// UUIDs of the GPUs and MIG devices other publishers hold.
    others: BTreeSet<String>,
    /// The GPUs of `others` that this process sees, by index.
    reserved_elsewhere: GpuSet,
}

impl Scan {
    /// Keeps a recorded container whose cgroup was recovered, with its share, and counts its
    /// claims.
    fn keep_recorded(
        &mut self,
        id: ContainerId,
        mut entry: Found,
        rules: &[DeviceRule],
        share: Option<PlacedShare>,
    ) {
        if self.carried.get(&id).is_some_and(|c| !c.gpus.is_empty()) {
            // Rules recomputed from the GPUs this process sees (Mesos's cgroups) lack the
            // carried GPUs' entries: keep the recorded ones.
            entry.rules = mesos_gpu_enforce::cgroup::normalize(
                &entry.rules.iter().chain(rules).cloned().collect::<Vec<_>>(),
            );
        }
        if let Some(grant) = share {
            self.shares.insert(id.clone(), grant);
        }
        for i in entry.gpus.iter() {
            self.claims.entry(i).or_default().insert(id.clone());
        }
        self.found.insert(id, entry);
    }

    /// Reports a recorded container whose cgroup could not be recovered and quarantines its
    /// GPUs, mapped or carried, until its cleanup.
    fn unrecoverable(&mut self, id: ContainerId, gpus: GpuSet, error: String) {
        self.report.issues.push(RecoveryIssue::Unrecoverable {
            container: id.clone(),
            error,
        });
        // Its carried GPUs stay quarantined by their recorded index.
        let recorded = self.carried.remove(&id).unwrap_or_default().gpus;
        for i in gpus.iter().chain(recorded.iter().map(|r| r.index)) {
            self.quarantine.entry(i).or_default().insert(id.clone());
        }
    }

    /// Adds the checkpoint's quarantine, then quarantines every GPU with several claimants, or
    /// already quarantined, for all of them.
    fn settle_claims(&mut self, ckpt: &Checkpoint) {
        for (&index, names) in &ckpt.quarantine {
            for name in names {
                if let Ok(id) = ContainerId::new(name.as_str()) {
                    self.quarantine.entry(index).or_default().insert(id);
                }
            }
        }
        for (index, claimants) in &self.claims {
            if claimants.len() > 1 || self.quarantine.contains_key(index) {
                let all = self.quarantine.entry(*index).or_default();
                all.extend(claimants.iter().cloned());
                if claimants.len() > 1 {
                    self.report.issues.push(RecoveryIssue::ClaimedTwice {
                        gpu: *index,
                        claimants: all.iter().cloned().collect(),
                    });
                }
            }
        }
    }
}

impl Isolator {
    /// Rebuilds the state from the checkpoint and the live cgroups (see the module docs). Must
    /// be the first call; `states` are the containers the agent recovered, `orphans` those it
    /// will destroy.
    #[tracing::instrument(skip_all, fields(states = states.len(), orphans = orphans.len()))]
    pub fn recover(
        &self,
        states: &[RecoverState],
        orphans: &[ContainerId],
    ) -> Result<RecoveryReport, LifecycleError> {
        const STEP: &str = "recover";
        let mut guard = self.lock()?;
        if !guard.is_empty() {
            return Err(LifecycleError::RecoverAfterUse);
        }
        let ckpt = self
            .store
            .load()
            .map_err(|source| LifecycleError::Checkpoint { step: STEP, source })?;
        let pool = self.pool_view(&guard.tx);
        let mut scan = Scan::default();
        let mut adoptable = self.adoptable(states, &ckpt);
        for id in self.candidates(&ckpt, &pool.elsewhere) {
            self.recover_candidate(id, &ckpt, &adoptable, &pool, &mut scan);
        }
        adoptable.retain(|id| !scan.found.contains_key(id));
        for id in adoptable {
            self.adopt(&id, &mut scan);
        }
        self.recover_docker_records(&ckpt, &mut scan);
        scan.settle_claims(&ckpt);
        scan.report.unchecked = self.unchecked(&scan.carried);
        let (mut state, mut report) = self.restore(scan)?;
        state.holders = holders_kept(&ckpt, &state);
        sort_by_agent(&state, states, orphans, &mut report);
        self.recover_nested(&mut state, states);
        self.install(&mut guard, state);
        self.save(&guard, STEP)?;
        for issue in &report.issues {
            tracing::warn!(?issue, "recovery found an inconsistency");
        }
        tracing::info!(
            recovered = report.recovered.len(), orphans = report.orphans.len(), docker = report.docker.len(),
            issues = report.issues.len(), free = %guard.allocator.free(), "recovered GPU allocations"
        );
        Ok(report)
    }

    /// Reads what the node's pool (in `tx`, when there is one) says of its other publishers.
    fn pool_view(&self, tx: &TxSlot) -> PoolView {
        let slot = tx.borrow();
        let elsewhere: BTreeSet<String> = slot
            .as_ref()
            .map(|tx| {
                tx.state
                    .reservations
                    .iter()
                    .filter(|(_, r)| Some(r.publisher.as_str()) != self.pool_publisher())
                    .map(|(id, _)| id.clone())
                    .collect()
            })
            .unwrap_or_default();
        let others: BTreeSet<String> = slot
            .as_ref()
            .zip(self.pool_publisher())
            .map(|(tx, publisher)| {
                tx.state
                    .held_by_others(publisher)
                    .into_iter()
                    .map(str::to_owned)
                    .collect()
            })
            .unwrap_or_default();
        let reserved_elsewhere = GpuSet::from_indices(
            self.inventory
                .gpus
                .iter()
                .filter(|g| others.contains(&g.uuid))
                .map(|g| g.index),
        )
        .unwrap_or_default();
        PoolView {
            elsewhere,
            others,
            reserved_elsewhere,
        }
    }

    /// The agent's own top-level containers without a record here (started before the module
    /// was loaded, e.g. by Mesos's gpu/nvidia): the agent will update and clean them up, so they
    /// are adopted with the GPUs their cgroup allows. Only on cgroup v1, where `devices.list`
    /// says which; a v2 cgroup may carry a device program of Mesos's that the module cannot
    /// read (the guide says to drain before such a move).
    fn adoptable(&self, states: &[RecoverState], ckpt: &Checkpoint) -> BTreeSet<ContainerId> {
        if self.layout.version() != CgroupVersion::V1 {
            return BTreeSet::new();
        }
        states
            .iter()
            .filter(|s| s.parent.is_none() && !ckpt.containers.contains_key(s.id.as_str()))
            .map(|s| s.id.clone())
            .collect()
    }

    /// Recovers one candidate: from its record when it has one; else adopts it when the agent
    /// recovered it, or quarantines the GPUs its cgroup may reach.
    fn recover_candidate(
        &self,
        id: ContainerId,
        ckpt: &Checkpoint,
        adoptable: &BTreeSet<ContainerId>,
        pool: &PoolView,
        scan: &mut Scan,
    ) {
        let (gpus, touched) =
            self.checkpointed_gpus(ckpt, &id, &mut scan.report, &mut scan.carried);
        match ckpt.containers.get(id.as_str()) {
            Some(record) => self.recover_recorded(id, record, gpus, touched, &pool.others, scan),
            None if adoptable.contains(&id) => self.adopt(&id, scan),
            None => self.quarantine_unexplained(&id, pool.reserved_elsewhere, scan),
        }
    }

    /// Recovers a container from its record: its MIG devices, its share, and its cgroup
    /// holding `gpus` (mapped) and `touched` (GPUs its carried records may name).
    fn recover_recorded(
        &self,
        id: ContainerId,
        record: &ContainerRecord,
        gpus: GpuSet,
        touched: GpuSet,
        others: &BTreeSet<String>,
        scan: &mut Scan,
    ) {
        let rules: Vec<DeviceRule> = record.rules.iter().filter_map(|r| r.parse().ok()).collect();
        // A share stays a share, whatever this process's sharing plan: it is a fact about a
        // running container, and the pool counts it as such.
        let share = record.share.clone();
        self.recover_recorded_mig(&id, record, &rules, others, scan);
        // A MIG device's parent is no GPU of the container's (its nodes are added with the
        // device's, in `rebuild`).
        let share_set = share
            .as_ref()
            .filter(|g| !g.is_mig())
            .map_or(GpuSet::EMPTY, |g| {
                GpuSet::from_indices([g.index]).unwrap_or_default()
            });
        let claimed = gpus.union(share_set).union(touched);
        match self.recover_cgroup(&id, claimed, &rules, &mut scan.report) {
            Ok(mut entry) => {
                entry.gpus = entry.gpus.difference(share_set).difference(touched);
                scan.keep_recorded(id, entry, &rules, share);
            }
            Err(error) => scan.unrecoverable(id, gpus, error),
        }
    }

    /// Sorts a record's MIG devices into those the node still has and those gone (reported,
    /// or carried as written when this process sees no MIG device at all), and holds out the
    /// devices of a new layout its cgroup can open.
    fn recover_recorded_mig(
        &self,
        id: &ContainerId,
        record: &ContainerRecord,
        rules: &[DeviceRule],
        others: &BTreeSet<String>,
        scan: &mut Scan,
    ) {
        let (known_mig, mut gone): (Vec<String>, Vec<String>) = record
            .mig
            .iter()
            .cloned()
            .partition(|uuid| self.inventory.mig.by_uuid(uuid).is_some());
        if self.inventory.mig.devices.is_empty() && !gone.is_empty() {
            // This process sees no MIG device at all: it cannot tell a device that is gone
            // from one it does not see, so the record stays as written.
            let entry = scan.carried.entry(id.clone()).or_default();
            entry.mig = std::mem::take(&mut gone);
            entry.mig_written.clone_from(&record.mig);
        }
        let held_out = self.mig_held_out(record, rules, &known_mig, !gone.is_empty(), others);
        for uuid in gone {
            scan.report.issues.push(RecoveryIssue::MigChanged {
                container: id.clone(),
                uuid,
                quarantined: held_out.clone(),
            });
        }
        if !held_out.is_empty() {
            scan.mig_quarantine.insert(id.clone(), held_out);
        }
        if !known_mig.is_empty() {
            scan.migs.insert(id.clone(), known_mig);
        }
    }

    /// Quarantines, until its cleanup, the GPUs a cgroup without a record may reach (but those
    /// another publisher of the node's pool reserves), and reports it.
    fn quarantine_unexplained(
        &self,
        id: &ContainerId,
        reserved_elsewhere: GpuSet,
        scan: &mut Scan,
    ) {
        let Some(held) = self.unexplained_cgroup(id) else {
            return;
        };
        // GPUs another publisher of the node's pool reserves are not ours to quarantine.
        let held = held.difference(reserved_elsewhere);
        for i in held.iter() {
            scan.quarantine.entry(i).or_default().insert(id.clone());
        }
        scan.report.issues.push(RecoveryIssue::NoCheckpoint {
            container: id.clone(),
            quarantined: held.to_vec(),
        });
    }

    /// Restores the checkpointed Docker containers that are still alive, with their GPUs,
    /// shares, MIG devices and starts; a dead one's GPUs go back to the pool.
    fn recover_docker_records(&self, ckpt: &Checkpoint, scan: &mut Scan) {
        for (name, records) in &ckpt.docker {
            let Ok(id) = ContainerId::new(name.as_str()) else {
                continue;
            };
            let start = ckpt.docker_starts.get(name);
            // A Docker container whose starter is gone and whose daemon has no running
            // container of its name never gets its GPUs back otherwise.
            if let Liveness::Dead(why) = self.docker_liveness(&id, start) {
                tracing::info!(container = %id, why, "Docker container is gone; its GPUs go back to the pool");
                continue;
            }
            if let Some(start) = start {
                scan.docker_starts.insert(id.clone(), start.clone());
            }
            let mapped = self.map_records(records);
            if !mapped.carried.is_empty() {
                let entry = scan.carried.entry(id.clone()).or_default();
                entry.gpus = mapped.carried;
                entry.touched = mapped.touched;
            }
            let set = mapped.set;
            for i in set.iter() {
                scan.claims.entry(i).or_default().insert(id.clone());
            }
            scan.report.docker.push(id.clone());
            if let Some(grant) = ckpt.docker_shares.get(name) {
                scan.docker_shares.insert(id.clone(), grant.clone());
            }
            if let Some(uuids) = ckpt.docker_mig.get(name) {
                scan.docker_mig.insert(id.clone(), uuids.clone());
            }
            scan.docker.insert(id, set);
        }
    }

    /// A fresh state from what the scan found, holding out the GPUs carried records may name,
    /// the Docker containers' MIG devices and the MIG devices of a new layout; with the report.
    fn restore(&self, scan: Scan) -> Result<(State, RecoveryReport), LifecycleError> {
        let Scan {
            mut report,
            found,
            shares,
            migs,
            claims: _,
            quarantine,
            carried,
            mig_quarantine,
            docker,
            docker_starts,
            docker_shares,
            docker_mig,
        } = scan;
        let mut state = self.rebuild(found, shares, migs, docker, quarantine)?;
        // GPUs a carried record may name are held out while this view lasts (not checkpointed:
        // the next view decides again).
        let touched = carried
            .values()
            .fold(GpuSet::EMPTY, |all, c| all.union(c.touched))
            .difference(state.allocator.allocated());
        if let Err(e) = state.allocator.recover(QUARANTINE_OWNER, touched) {
            tracing::error!(gpus = %touched, error = %e, "cannot hold out the GPUs records this process cannot map may name");
        }
        state.carried = carried;
        state.docker_starts = docker_starts;
        state.docker_shares = docker_shares;
        hold_docker_mig(&mut state, &docker_mig, &mut report);
        state.docker_mig = docker_mig;
        hold_mig_quarantine(&mut state, mig_quarantine);
        Ok((state, report))
    }

    /// Puts the recovered `state` in place of `current`: GPUs the health monitor failed stay
    /// out of the pool, the node pool's transaction moves over, and owners of other publishers
    /// that died while nobody looked free their GPUs.
    fn install(&self, current: &mut State, mut state: State) {
        // The allocator is rebuilt: GPUs the health monitor failed stay out of the pool.
        health::reapply(
            &mut state,
            std::mem::take(&mut current.failed),
            &self.limitations,
        );
        state.tx = std::mem::take(&mut current.tx);
        if let Some(tx) = state.tx.get_mut().take() {
            self.mark_elsewhere(&mut state, &tx.state);
            if let Some(sharing) = &self.sharing {
                sharing.report_mode_changes(&tx.state);
            }
            *state.tx.get_mut() = Some(tx);
        }
        *current = state;
        // Owners of other publishers that died while nobody looked (an agent SIGKILLed before
        // its Docker container existed, a container that died with its daemon) free their GPUs.
        self.reconcile_pool(current);
    }

    /// Reconciles the Docker containers' GPUs with what Docker reports (`held`: container and
    /// the minors of its `--device` GPUs). Checkpointed Docker containers Docker no longer has
    /// are released; a GPU held elsewhere is quarantined for both.
    #[tracing::instrument(skip_all, fields(held = held.len()))]
    pub fn recover_docker(
        &self,
        held: &[(ContainerId, Vec<u32>)],
    ) -> Result<RecoveryReport, LifecycleError> {
        const STEP: &str = "recover Docker containers";
        let mut guard = self.lock()?;
        let state = &mut *guard;
        let mut report = RecoveryReport::default();
        let live: BTreeSet<&ContainerId> = held.iter().map(|(id, _)| id).collect();
        // A container still being started (its starter runs) is not running yet.
        let gone: Vec<ContainerId> = state
            .docker
            .keys()
            .filter(|id| !live.contains(id) && self.docker_starter_runs(state, id).is_none())
            .cloned()
            .collect();
        for id in gone {
            state.docker.remove(&id);
            state.drop_carried(&id);
            state.docker_starts.remove(&id);
            state.docker_shares.remove(&id);
            state.docker_mig.remove(&id);
            state.mig.release(id.as_str());
            let released = state.allocator.release_all(id.as_str());
            tracing::info!(container = %id, gpus = %released, "Docker container is gone; released its GPUs");
        }
        for (id, minors) in held {
            if state.containers.contains_key(id) || state.nested.contains_key(id) {
                return Err(LifecycleError::WrongContainerizer {
                    container: id.clone(),
                    step: STEP,
                    containerizer: "mesos",
                });
            }
            let mut want = Vec::new();
            for &minor in minors {
                match self.inventory.gpus.iter().find(|g| g.minor == minor) {
                    Some(g) => want.push(g.index),
                    None => report.issues.push(RecoveryIssue::UnknownGpu {
                        container: id.clone(),
                        index: minor,
                        uuid: String::new(),
                    }),
                }
            }
            let want = GpuSet::from_indices(want).unwrap_or_default();
            let have = state.allocator.held_by(id.as_str());
            for index in want.difference(have).iter() {
                let single = GpuSet::from_indices([index]).unwrap_or_default();
                match state.allocator.owner_of(index).map(str::to_owned) {
                    None => {
                        if state.allocator.recover(id.as_str(), single).is_err() {
                            report.issues.push(RecoveryIssue::UnknownGpu {
                                container: id.clone(),
                                index,
                                uuid: String::new(),
                            });
                        }
                    }
                    Some(other) => {
                        let claimants = quarantine_gpu(state, index, &other, id);
                        report.issues.push(RecoveryIssue::ClaimedTwice {
                            gpu: index,
                            claimants,
                        });
                    }
                }
            }
            let extra = have.difference(want);
            if !extra.is_empty() {
                let _ = state.allocator.release(id.as_str(), extra);
            }
            state
                .docker
                .insert(id.clone(), state.allocator.held_by(id.as_str()));
            report.docker.push(id.clone());
        }
        self.save(state, STEP)?;
        tracing::info!(
            docker = report.docker.len(),
            issues = report.issues.len(),
            "recovered Docker GPU allocations"
        );
        Ok(report)
    }

    /// The MIG devices to hold out of service for a container recovered from `record`: those
    /// already held out that the node still has and, when one of its own MIG devices is gone
    /// (`layout_changed`), every other MIG device whose capability node its `rules` let it open
    /// (read or write): a new layout reuses GPU and compute instance ids, and their nodes' minors
    /// with them. Devices another publisher of the pool (`others`) reserves are its own and only
    /// reported.
    fn mig_held_out(
        &self,
        record: &ContainerRecord,
        rules: &[DeviceRule],
        own: &[String],
        layout_changed: bool,
        others: &BTreeSet<String>,
    ) -> Vec<String> {
        let opens = |dev: DevNum| {
            rules.iter().any(|r| {
                r.covers(DeviceKind::Char, dev)
                    && (r.access.contains(Access::READ) || r.access.contains(Access::WRITE))
            })
        };
        let mut out: Vec<String> = record
            .mig_quarantine
            .iter()
            .filter(|u| self.inventory.mig.by_uuid(u).is_some())
            .cloned()
            .collect();
        if !layout_changed {
            return out;
        }
        for d in &self.inventory.mig.devices {
            let Some(caps) = &d.caps else { continue };
            if own.contains(&d.uuid)
                || out.contains(&d.uuid)
                || !(opens(caps.gpu_instance) || opens(caps.compute_instance))
            {
                continue;
            }
            if others.contains(&d.uuid) {
                tracing::error!(mig = %d.uuid, "a MIG device a recovered container's cgroup can open is reserved by another publisher of the pool; run `mesos-gpu gpu list`");
                continue;
            }
            out.push(d.uuid.clone());
        }
        out
    }

    /// Every container id in the checkpoint or with a cgroup under our parent.
    fn candidates(&self, ckpt: &Checkpoint, elsewhere: &BTreeSet<String>) -> BTreeSet<ContainerId> {
        let mut ids: BTreeSet<ContainerId> = ckpt
            .containers
            .keys()
            .filter_map(|k| ContainerId::new(k.as_str()).ok())
            .collect();
        // With the node's pool, only the agent adopts cgroups it has no record of, and never
        // one another publisher of the pool records.
        let adopts = self.pool.as_ref().is_none_or(|link| link.adopts_cgroups());
        if !adopts {
            return ids;
        }
        if let Ok(dir) = std::fs::read_dir(self.layout.parent_dir()) {
            for entry in dir.flatten() {
                if entry.file_type().is_ok_and(|t| t.is_dir())
                    && let Some(id) = entry
                        .file_name()
                        .to_str()
                        .and_then(|n| ContainerId::new(n).ok())
                    && !elsewhere.contains(id.as_str())
                {
                    ids.insert(id);
                }
            }
        }
        ids
    }

    /// The checkpointed GPUs of `id` that this process can map (same index, minor and UUID,
    /// managed here), and the GPUs it manages that a record it cannot map may name; the records
    /// it cannot map go to `carried`, each reported.
    fn checkpointed_gpus(
        &self,
        ckpt: &Checkpoint,
        id: &ContainerId,
        report: &mut RecoveryReport,
        carried: &mut BTreeMap<ContainerId, Carried>,
    ) -> (GpuSet, GpuSet) {
        let Some(record) = ckpt.containers.get(id.as_str()) else {
            return (GpuSet::EMPTY, GpuSet::EMPTY);
        };
        let mapped = self.map_records(&record.gpus);
        for gpu in &mapped.carried {
            report.issues.push(RecoveryIssue::UnknownGpu {
                container: id.clone(),
                index: gpu.index,
                uuid: gpu.uuid.to_string(),
            });
        }
        if !mapped.carried.is_empty() {
            let entry = carried.entry(id.clone()).or_default();
            entry.gpus = mapped.carried;
            entry.touched = mapped.touched;
        }
        (mapped.set, mapped.touched)
    }

    /// Splits `records` into the GPUs this process can map (the GPU at that index has that
    /// minor and UUID, and the allocator manages it) and the records it carries as written,
    /// with the managed GPUs a carried record may name (same UUID, index or minor: a container's
    /// cgroup or `--device` grants by minor).
    fn map_records(&self, records: &[GpuRecord]) -> Mapped {
        let managed = |i: u32| self.whole.contains(&i);
        let mut set = Vec::new();
        let mut out = Mapped::default();
        let mut touched = Vec::new();
        for r in records {
            let here = self.inventory.by_index(r.index);
            if here.is_some_and(|g| g.uuid == r.uuid.as_str() && g.minor == r.minor)
                && managed(r.index)
            {
                set.push(r.index);
                continue;
            }
            touched.extend(
                self.inventory
                    .gpus
                    .iter()
                    .filter(|g| {
                        g.uuid == r.uuid.as_str() || g.index == r.index || g.minor == r.minor
                    })
                    .map(|g| g.index)
                    .filter(|&i| managed(i)),
            );
            out.carried.push(r.clone());
        }
        out.set = GpuSet::from_indices(set).unwrap_or_default();
        out.touched = GpuSet::from_indices(touched).unwrap_or_default();
        out
    }

    /// What recovery keeps unchecked, for the report (`None` when nothing).
    fn unchecked(&self, carried: &BTreeMap<ContainerId, Carried>) -> Option<Unchecked> {
        if carried.is_empty() {
            return None;
        }
        let records = carried
            .iter()
            .map(|(id, c)| {
                let gpus = c
                    .gpus
                    .iter()
                    .map(|r| format!("{}@{}", r.uuid, r.index))
                    .chain(c.mig.iter().cloned())
                    .collect();
                (id.clone(), gpus)
            })
            .collect();
        let why = match (&self.inventory.absent_reason, self.inventory.gpus.len()) {
            (Some(reason), 0) => format!("this process sees no GPU ({reason})"),
            (None, 0) => "this process sees no GPU".to_owned(),
            (_, n) => format!(
                "not among the {n} GPUs this process sees ({})",
                self.inventory
                    .gpus
                    .iter()
                    .map(|g| format!("{}@{}", g.uuid, g.index))
                    .collect::<Vec<_>>()
                    .join(" ")
            ),
        };
        Some(Unchecked { records, why })
    }

    /// Takes over a checkpointed container's cgroup; the error text when that fails.
    fn recover_cgroup(
        &self,
        id: &ContainerId,
        gpus: GpuSet,
        rules: &[DeviceRule],
        report: &mut RecoveryReport,
    ) -> Result<Found, String> {
        let cgroup_dir = self.layout.container_dir(id);
        if !cgroup_dir.is_dir() {
            report.issues.push(RecoveryIssue::CgroupMissing {
                container: id.clone(),
                gpus: gpus.to_vec(),
            });
            return Ok(Found {
                gpus,
                rules: rules.to_vec(),
                cgroup: None,
            });
        }
        match self.layout.version() {
            CgroupVersion::V1 => {
                let mut cgroup =
                    PlacedCgroup::open(self.cgroup_maker, &self.layout, id, cgroup_dir)
                        .map_err(|e| error_chain(&e))?;
                let live_rules = cgroup.cgroup().allowed().map_err(|e| error_chain(&e))?;
                let live = self.indices_of_minors(&allowed_minors(&live_rules));
                if live == gpus {
                    // Own cgroups hold exactly our list; Mesos's hold its entries and ours.
                    let rules = match self.cgroup_maker {
                        CgroupMaker::Own => live_rules,
                        CgroupMaker::Mesos => self.rules_of(gpus),
                    };
                    return Ok(Found {
                        gpus,
                        rules,
                        cgroup: Some(cgroup),
                    });
                }
                report.issues.push(RecoveryIssue::Mismatch {
                    container: id.clone(),
                    checkpointed: gpus.to_vec(),
                    live: live.to_vec(),
                });
                let union = gpus.union(live);
                let rules = self.rules_of(union);
                cgroup
                    .grant(&rules, &self.base)
                    .map_err(|e| error_chain(&e))?;
                Ok(Found {
                    gpus: union,
                    rules,
                    cgroup: Some(cgroup),
                })
            }
            CgroupVersion::V2 => {
                let attached = V2DeviceCgroup::open(&self.layout, id)
                    .and_then(|cg| cg.attached_program())
                    .map_err(|e| error_chain(&e))?;
                if attached.is_none() {
                    report.issues.push(RecoveryIssue::ProgramMissing {
                        container: id.clone(),
                    });
                }
                let cgroup = DeviceCgroup::recover(&self.layout, id, Some(rules))
                    .map_err(|e| error_chain(&e))?;
                Ok(Found {
                    gpus,
                    rules: rules.to_vec(),
                    cgroup: Some(PlacedCgroup::from_parts(self.cgroup_maker, cgroup)),
                })
            }
        }
    }

    /// Takes on a container the agent recovered that has no record here (cgroup v1), holding
    /// the GPUs its `devices.list` allows, so that the agent's `update` and `cleanup` of it
    /// succeed; one whose cgroup cannot be read has those GPUs quarantined until its cleanup, as
    /// before.
    fn adopt(&self, id: &ContainerId, scan: &mut Scan) {
        let held = self.unexplained_cgroup(id).unwrap_or(GpuSet::EMPTY);
        match self.recover_cgroup(id, held, &self.rules_of(held), &mut scan.report) {
            Ok(entry) => {
                for i in entry.gpus.iter() {
                    scan.claims.entry(i).or_default().insert(id.clone());
                }
                scan.report.issues.push(RecoveryIssue::Adopted {
                    container: id.clone(),
                    gpus: entry.gpus.to_vec(),
                });
                scan.found.insert(id.clone(), entry);
            }
            Err(error) => {
                for i in held.iter() {
                    scan.quarantine.entry(i).or_default().insert(id.clone());
                }
                scan.report.issues.push(RecoveryIssue::Unrecoverable {
                    container: id.clone(),
                    error,
                });
            }
        }
    }

    /// The whole allow list of a container holding `gpus`.
    fn rules_of(&self, gpus: GpuSet) -> Vec<DeviceRule> {
        device_rules(&self.nodes, &self.base, &self.minors(gpus), &[])
    }

    /// The GPUs a cgroup without a checkpoint entry may reach: v1 from `devices.list`; v2, whose
    /// list cannot be read, every offered GPU while processes are in it, none when it is empty.
    /// `None` for a cgroup of Mesos that is none of ours (see the module docs).
    fn unexplained_cgroup(&self, id: &ContainerId) -> Option<GpuSet> {
        let path = self.layout.container_dir(id);
        let every = || GpuSet::from_indices(self.devices.iter().copied()).unwrap_or_default();
        let mesos = self.cgroup_maker == CgroupMaker::Mesos;
        match self.layout.version() {
            CgroupVersion::V1 => {
                match DeviceCgroup::recover(&self.layout, id, None).and_then(|cg| cg.allowed()) {
                    Ok(rules) => {
                        let held = self.indices_of_minors(&allowed_minors(&rules));
                        (!mesos || !held.is_empty()).then_some(held)
                    }
                    Err(e) => {
                        tracing::error!(container = %id, error = %e, "cannot read the device list; quarantining every GPU");
                        Some(every())
                    }
                }
            }
            CgroupVersion::V2 => {
                if mesos {
                    match V2DeviceCgroup::open(&self.layout, id)
                        .and_then(|cg| cg.attached_program())
                    {
                        Ok(None) => return None,
                        Ok(Some(_)) => {}
                        Err(e) => {
                            tracing::error!(container = %id, error = %e, "cannot query the cgroup's device programs; quarantining every GPU");
                            return Some(every());
                        }
                    }
                }
                match read_procs(&path) {
                    Ok(pids) if pids.is_empty() && !mesos => Some(GpuSet::EMPTY),
                    _ => {
                        tracing::error!(container = %id, "cgroup2 cgroup with our device program and no checkpoint; quarantining every GPU");
                        Some(every())
                    }
                }
            }
        }
    }

    fn indices_of_minors(&self, minors: &[u32]) -> GpuSet {
        let indices = self
            .inventory
            .gpus
            .iter()
            .filter(|g| minors.contains(&g.minor) && self.devices.contains(&g.index))
            .map(|g| g.index);
        GpuSet::from_indices(indices).unwrap_or_default()
    }

    /// A fresh state holding exactly what was found.
    fn rebuild(
        &self,
        found: BTreeMap<ContainerId, Found>,
        mut shares: BTreeMap<ContainerId, PlacedShare>,
        mut migs: BTreeMap<ContainerId, Vec<String>>,
        docker: BTreeMap<ContainerId, GpuSet>,
        quarantine: BTreeMap<u32, BTreeSet<ContainerId>>,
    ) -> Result<State, LifecycleError> {
        let allocator = Allocator::with_devices(&self.inventory, &self.whole, self.policy)
            .map_err(|source| LifecycleError::SetupAllocator { source })?;
        let mut state = State::new(allocator, self.mig_units());
        // Quarantine entries on GPUs the allocator does not manage are kept as checkpointed.
        let quarantined = GpuSet::from_indices(
            quarantine
                .keys()
                .copied()
                .filter(|i| self.whole.contains(i)),
        )
        .unwrap_or_default();
        let take = |state: &mut State, owner: &str, set: GpuSet| {
            if let Err(e) = state.allocator.recover(owner, set) {
                tracing::error!(owner, gpus = %set, error = %e, "cannot restore an allocation");
            }
        };
        take(&mut state, QUARANTINE_OWNER, quarantined);
        for (id, f) in found {
            let own = f.gpus.difference(quarantined);
            take(&mut state, id.as_str(), own);
            let share = shares.remove(&id);
            let mig = migs.remove(&id).unwrap_or_default();
            for uuid in &mig {
                if !state.mig.hold(id.as_str(), uuid) {
                    tracing::error!(container = %id, mig = %uuid, "a checkpointed MIG device is held twice");
                }
            }
            let mut entry = Container {
                gpus: own,
                rules: Vec::new(),
                cgroup: f.cgroup,
                share,
                mig,
                mig_quarantine: Vec::new(),
            };
            // Rules recomputed from the GPUs (Mesos's cgroups) lack the MIG devices' (held
            // whole or shared): add them.
            entry.rules = match self.mig_accesses(&id, &entry.mig_devices()) {
                Ok(accesses) => device_rules(&self.nodes, &f.rules, &[], &accesses),
                Err(e) => {
                    tracing::error!(container = %id, error = %e, "cannot tell what the container's MIG devices need");
                    f.rules
                }
            };
            state.containers.insert(id, entry);
        }
        for (id, set) in docker {
            let own = set.difference(quarantined);
            take(&mut state, id.as_str(), own);
            state.docker.insert(id, own);
        }
        state.quarantine = quarantine;
        Ok(state)
    }
}

/// Moves GPU `index` from `owner` to quarantine, claimed by `owner` and `claimant`; returns
/// every claimant.
fn quarantine_gpu(
    state: &mut State,
    index: u32,
    owner: &str,
    claimant: &ContainerId,
) -> Vec<ContainerId> {
    let single = GpuSet::from_indices([index]).unwrap_or_default();
    if owner != QUARANTINE_OWNER {
        let _ = state.allocator.release(owner, single);
        let _ = state.allocator.recover(QUARANTINE_OWNER, single);
        if let Ok(owner_id) = ContainerId::new(owner) {
            if let Some(c) = state.containers.get_mut(&owner_id) {
                c.gpus = c.gpus.difference(single);
            }
            if let Some(d) = state.docker.get_mut(&owner_id) {
                *d = d.difference(single);
            }
            state.quarantine.entry(index).or_default().insert(owner_id);
        }
    }
    let claimants = state.quarantine.entry(index).or_default();
    claimants.insert(claimant.clone());
    claimants.iter().cloned().collect()
}

/// Sorts the recovered containers by what the agent said of them: listed (recovered), orphans,
/// or neither (unclaimed, reported).
fn sort_by_agent(
    state: &State,
    states: &[RecoverState],
    orphans: &[ContainerId],
    report: &mut RecoveryReport,
) {
    let known: BTreeSet<&ContainerId> = states.iter().map(|s| &s.id).collect();
    let orphan_set: BTreeSet<&ContainerId> = orphans.iter().collect();
    for id in state.containers.keys() {
        if known.contains(id) {
            report.recovered.push(id.clone());
        } else if orphan_set.contains(id) {
            report.orphans.push(id.clone());
        } else {
            report.issues.push(RecoveryIssue::Unclaimed {
                container: id.clone(),
            });
        }
    }
}

/// Holds the Docker containers' checkpointed MIG devices; one the node no longer has, or
/// already held, is reported.
fn hold_docker_mig(
    state: &mut State,
    docker_mig: &BTreeMap<ContainerId, Vec<String>>,
    report: &mut RecoveryReport,
) {
    for (id, uuids) in docker_mig {
        for uuid in uuids {
            if !state.mig.hold(id.as_str(), uuid) {
                report.issues.push(RecoveryIssue::MigChanged {
                    container: id.clone(),
                    uuid: uuid.clone(),
                    quarantined: Vec::new(),
                });
            }
        }
    }
}

/// Holds out of service, for the container whose cgroup can open them, the MIG devices of a
/// new layout.
fn hold_mig_quarantine(state: &mut State, mig_quarantine: BTreeMap<ContainerId, Vec<String>>) {
    for (id, uuids) in mig_quarantine {
        let Some(container) = state.containers.get_mut(&id) else {
            continue;
        };
        for uuid in uuids {
            if state.mig.hold(id.as_str(), &uuid) {
                tracing::warn!(container = %id, mig = %uuid, "MIG device of a new layout held out of service: the container's cgroup can open it");
                container.mig_quarantine.push(uuid);
            } else {
                tracing::error!(container = %id, mig = %uuid, "a MIG device this container's cgroup can open is held by another container; run `mesos-gpu gpu list`");
            }
        }
    }
}
