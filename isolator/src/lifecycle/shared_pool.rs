//! The isolator on the node's one GPU pool ([`mesos_gpu_pool`]).
//!
//! Every call that takes the isolator's lock also takes the pool's `flock` for the same
//! duration (a call, well under a millisecond plus cgroup writes): it reads the pool, puts the
//! GPUs other publishers reserve (and those a registered health checkpoint marks unhealthy) under
//! [`ELSEWHERE_OWNER`] in the allocator, decides, and at every checkpoint write publishes this
//! isolator's reservations to the pool first, then its own checkpoint. A request the free GPUs
//! cannot serve reconciles the pool (freeing dead owners) and is tried once more before it is
//! refused with the pool's counts.

use std::ops::{Deref, DerefMut};
use std::path::{Path, PathBuf};
use std::sync::MutexGuard;

use super::state::{QUARANTINE_OWNER, State};
use super::{ContainerId, Isolator, LifecycleError};
use mesos_gpu_placement::{allocator::AllocError, allocator::GpuSet};
use mesos_gpu_pool as pool;
use mesos_gpu_pool::shares::ShareReservation;
use mesos_gpu_pool::{GpuUuid, Host, Owner, Pool, PoolState, ProcessStamp, Shortage, Transaction};

/// The allocator owner of GPUs other publishers of the node's pool reserve, or that a health
/// checkpoint marks unhealthy (no container id can spell the `!`).
pub const ELSEWHERE_OWNER: &str = "!pool";

/// Which pool an isolator draws from, and what its reservations are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolConfig {
    /// The pool directory (files under `<dir>/gpu/`).
    pub dir: PathBuf,
    /// What this isolator's containers are.
    pub role: PoolRole,
}

/// What the containers of an isolator are, for their owner records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PoolRole {
    /// The Mesos agent's module: containers are the agent's (alive while the agent runs or
    /// their cgroup has processes). Only this role adopts cgroups it has no record of.
    Agent,
    /// `mesos-gpu exec`: one process holding GPUs for its cgroup, with a private checkpoint
    /// directory removed with it.
    Exec {
        /// The private directory (the isolator's work directory).
        private_dir: PathBuf,
    },
    /// `docker-args`, `run`, `serve`: Docker containers only.
    Docker,
}

/// The link of one isolator to the pool.
#[derive(Debug)]
pub(crate) struct PoolLink {
    pool: Pool,
    /// The isolator's checkpoint path: the publisher name of its reservations.
    publisher: String,
    role: PoolRole,
    host: Host,
    me: ProcessStamp,
}

impl PoolLink {
    pub(crate) fn new(config: &PoolConfig, checkpoint: &Path) -> Result<PoolLink, LifecycleError> {
        let host = Host::default();
        let me = host.this_process().map_err(|source| LifecycleError::Pool {
            step: "set up",
            source: pool::PoolError::Io(mesos_gpu_os::IoError::new(
                "read the stamp of",
                "/proc/self/stat",
                source,
            )),
        })?;
        Ok(PoolLink {
            pool: Pool::at(&config.dir),
            publisher: checkpoint.display().to_string(),
            role: config.role.clone(),
            host,
            me,
        })
    }

    /// True when cgroups without a record are adopted (quarantined) at recovery.
    pub(crate) fn adopts_cgroups(&self) -> bool {
        self.role == PoolRole::Agent
    }

    /// The pool.
    pub(crate) fn pool(&self) -> &Pool {
        &self.pool
    }
}

impl Isolator {
    /// The publisher name of this isolator's reservations in the node's pool.
    pub(crate) fn pool_publisher(&self) -> Option<&str> {
        self.pool.as_ref().map(|l| l.publisher.as_str())
    }

    /// Where the liveness of the pool's owners is read from.
    pub(crate) fn pool_host(&self) -> Option<&Host> {
        self.pool.as_ref().map(|l| &l.host)
    }

    /// Asks `daemons` about Docker owners when reconciling the pool (a Docker client: this
    /// crate does not speak Docker's API). Call it before [`Isolator::recover`].
    pub fn set_docker_daemons(&mut self, daemons: std::sync::Arc<dyn pool::DockerDaemons>) {
        if let Some(link) = &mut self.pool {
            link.host = link.host.clone().with_docker(daemons);
        }
    }
}

/// The isolator's state, locked, with the pool's transaction (if any) held alongside.
pub(crate) struct Locked<'a> {
    guard: MutexGuard<'a, State>,
}

impl Deref for Locked<'_> {
    type Target = State;
    fn deref(&self) -> &State {
        &self.guard
    }
}

impl DerefMut for Locked<'_> {
    fn deref_mut(&mut self) -> &mut State {
        &mut self.guard
    }
}

impl Drop for Locked<'_> {
    fn drop(&mut self) {
        // Unlocks the pool before the state.
        self.guard.tx.get_mut().take();
    }
}

impl Isolator {
    /// Locks the state and, with a pool, the pool, whose other reservations are then marked in
    /// the allocator.
    pub(crate) fn lock(&self) -> Result<Locked<'_>, LifecycleError> {
        let mut guard = self.state.lock().map_err(|_| LifecycleError::Poisoned)?;
        if let Some(link) = &self.pool {
            let mut tx = link.pool.begin().map_err(|source| LifecycleError::Pool {
                step: "lock",
                source,
            })?;
            if tx.state.holds_unnamed() {
                self.repair_unnamed(link, &mut tx);
            }
            self.mark_elsewhere(&mut guard, &tx.state);
            *guard.tx.get_mut() = Some(tx);
        }
        Ok(Locked { guard })
    }

    /// Locks the state only, for calls that change no reservation (`isolate`, `status`,
    /// `usage`, metrics): other publishers' reservations are as the last change saw them.
    pub(crate) fn lock_local(&self) -> Result<Locked<'_>, LifecycleError> {
        let guard = self.state.lock().map_err(|_| LifecycleError::Poisoned)?;
        Ok(Locked { guard })
    }

    /// Names the GPUs of the pool's records that hold some without a UUID (written by a
    /// mesos-gpu from before the fix for processes that cannot see the GPUs), from what their
    /// owners' devices allow, and drops those whose owner is gone ([`pool::repair_unnamed`]);
    /// commits what changed. A process that sees no GPU names nothing.
    fn repair_unnamed(&self, link: &PoolLink, tx: &mut Transaction) {
        if self.inventory.gpus.is_empty() {
            return;
        }
        let before = tx.state.clone();
        let done = pool::repair_unnamed(&mut tx.state, &link.host, &|owner| {
            self.gpus_opened_by(&link.host, owner)
        });
        for (id, count, why) in &done.unnamed {
            tracing::error!(owner = %id, gpus = count, why, "a live owner's pool record holds GPUs without naming them and its devices cannot be read: no GPU is granted until it ends or is released (`mesos-gpu gpu release`)");
        }
        if tx.state != before
            && let Err(e) = tx.commit()
        {
            tracing::warn!(error = %e, "cannot record the repaired pool records");
        }
    }

    /// The GPUs (as this process names them) that `owner`'s devices let it open: a Mesos or
    /// `exec` owner's devices cgroup (`devices.list`, cgroup v1), a Docker owner's container
    /// devices as its daemon reports them.
    fn gpus_opened_by(&self, host: &Host, owner: &Owner) -> Result<Vec<GpuUuid>, String> {
        let minors = match owner {
            Owner::Docker { name, daemon, .. } => {
                host.docker_gpu_minors(name, daemon.as_deref())?
            }
            Owner::Mesos {
                cgroup: Some(cgroup),
                ..
            }
            | Owner::Process {
                cgroup: Some(cgroup),
                ..
            } => {
                let list = cgroup.join("devices.list");
                let text = std::fs::read_to_string(&list).map_err(|e| {
                    format!(
                        "cannot read {} ({e}): a cgroup v2 cgroup has no device list to read",
                        list.display()
                    )
                })?;
                let rules = mesos_gpu_enforce::cgroup::parse_list(&text)
                    .map_err(|e| format!("{}: {e}", list.display()))?;
                if rules
                    .iter()
                    .any(mesos_gpu_enforce::cgroup::DeviceRule::is_allow_all)
                {
                    return Err(format!("{} allows every device", list.display()));
                }
                super::launch::allowed_minors(&rules)
            }
            Owner::Mesos { cgroup: None, .. } | Owner::Process { cgroup: None, .. } => {
                return Err("its record names no cgroup".into());
            }
            Owner::Quarantine { reason } => return Err(reason.clone()),
        };
        let mut uuids = Vec::new();
        for minor in minors {
            let gpu = self
                .inventory
                .gpus
                .iter()
                .find(|g| g.minor == minor)
                .ok_or_else(|| {
                    format!("it may open /dev/nvidia{minor}, no GPU this process sees")
                })?;
            // A GPU in MIG mode: any of its MIG devices may be the one it uses.
            let mig = self
                .inventory
                .mig
                .devices
                .iter()
                .filter(|d| d.parent_minor == minor)
                .map(|d| d.uuid.as_str());
            uuids.extend(
                std::iter::once(gpu.uuid.as_str())
                    .chain(mig)
                    .filter_map(|u| GpuUuid::new(u).ok()),
            );
        }
        Ok(uuids)
    }

    /// Puts the GPUs other publishers reserve, and the unhealthy ones, under [`ELSEWHERE_OWNER`];
    /// while a record holds GPUs without naming them, every GPU (and MIG device) this isolator
    /// does not hold, since any may be one of them.
    pub(crate) fn mark_elsewhere(&self, state: &mut State, pool: &PoolState) {
        let Some(link) = &self.pool else {
            return;
        };
        let unhealthy = pool.unhealthy();
        let unnamed = pool.holds_unnamed();
        let mut others = pool.held_by_others(&link.publisher);
        if unnamed {
            others.extend(self.inventory.mig.devices.iter().map(|d| d.uuid.as_str()));
        }
        let wanted: Vec<u32> = self
            .inventory
            .gpus
            .iter()
            .filter(|g| {
                unnamed || others.contains(g.uuid.as_str()) || unhealthy.contains_key(&g.uuid)
            })
            .map(|g| g.index)
            .collect();
        let wanted = GpuSet::from_indices(wanted).unwrap_or_default();
        let clash: Vec<u32> = wanted
            .iter()
            .filter(|&i| {
                others.contains(self.uuid(i))
                    && state
                        .allocator
                        .owner_of(i)
                        .is_some_and(|o| o != ELSEWHERE_OWNER)
            })
            .collect();
        if !clash.is_empty() {
            tracing::error!(gpus = ?clash, pool = %link.pool.state_path().display(), "GPUs this isolator holds are reserved by another publisher of the pool too (run `mesos-gpu gpu list`)");
        }
        state.allocator.hold_elsewhere(ELSEWHERE_OWNER, wanted);
        state.mig.hold_only(ELSEWHERE_OWNER, &others);
        let parents = self
            .inventory
            .gpus
            .iter()
            .filter(|g| unhealthy.contains_key(&g.uuid))
            .map(|g| g.index)
            .collect();
        let unhealthy = unhealthy.keys().map(String::as_str).collect();
        state.mig.mark_out_elsewhere(&unhealthy, &parents);
    }

    /// Publishes this isolator's reservations into the pool and commits (no-op without one).
    pub(crate) fn publish(&self, state: &State) -> Result<(), pool::PoolError> {
        let Some(link) = &self.pool else {
            return Ok(());
        };
        let mut slot = state.tx.borrow_mut();
        let Some(tx) = slot.as_mut() else {
            return Ok(());
        };
        let records = |id: &ContainerId, set: GpuSet| -> Vec<GpuUuid> {
            state
                .gpu_records(id, set, &self.inventory)
                .into_iter()
                .map(|r| r.uuid)
                .collect()
        };
        let mut entries = Vec::new();
        for (id, c) in &state.containers {
            let mut held = records(id, c.gpus);
            let mig = state.mig_records(id, &c.mig);
            held.extend(named(mig.iter().chain(&c.mig_quarantine)));
            entries.push((id.to_string(), self.owner_of(link, state, id), held));
        }
        for (id, &set) in &state.docker {
            let mut held = records(id, set);
            held.extend(named(state.docker_mig.get(id).into_iter().flatten()));
            entries.push((
                id.to_string(),
                super::docker_owner::docker_owner(
                    id,
                    state.docker_starts.get(id),
                    state.holders.get(id),
                ),
                held,
            ));
        }
        let quarantined = state.allocator.held_by(QUARANTINE_OWNER);
        let key = format!("quarantine@{}", link.publisher);
        let mut held: Vec<GpuUuid> = quarantined
            .iter()
            .filter_map(|i| self.inventory.by_index(i))
            .filter_map(|g| GpuUuid::new(g.uuid.as_str()).ok())
            .collect();
        let managed = state.allocator.managed();
        if state.quarantine.keys().any(|&i| !managed.contains(i)) {
            // Quarantined GPUs this process does not manage: it cannot name them, so the UUIDs
            // published for them before, which it does not see, are kept as they were.
            let unseen = tx
                .state
                .reservations
                .get(&key)
                .filter(|r| r.publisher == link.publisher)
                .into_iter()
                .flat_map(|r| r.gpus.iter())
                .filter(|u| self.inventory.by_uuid(u.as_str()).is_none() && !held.contains(u))
                .cloned()
                .collect::<Vec<_>>();
            held.extend(unseen);
        }
        if !held.is_empty() {
            let claimants: Vec<String> = state
                .quarantine
                .values()
                .flatten()
                .chain(
                    state
                        .carried
                        .iter()
                        .filter(|(_, c)| !c.touched.is_empty())
                        .map(|(id, _)| id),
                )
                .map(ToString::to_string)
                .collect::<std::collections::BTreeSet<_>>()
                .into_iter()
                .collect();
            entries.push((
                key,
                Owner::Quarantine {
                    reason: format!(
                        "recovery of {} could not account for containers {}; freed when they are cleaned up",
                        link.publisher,
                        claimants.join(", ")
                    ),
                },
                held,
            ));
        }
        tx.state.publish(&link.publisher, entries);
        let share =
            |id: &ContainerId, owner: Owner, grant: &mesos_gpu_placement::sharing::PlacedShare| {
                (
                    id.to_string(),
                    ShareReservation {
                        publisher: link.publisher.clone(),
                        owner,
                        grant: grant.clone(),
                        since: pool::now(),
                    },
                )
            };
        let shares = state
            .containers
            .iter()
            .filter_map(|(id, c)| {
                Some(share(id, self.owner_of(link, state, id), c.share.as_ref()?))
            })
            .chain(state.docker_shares.iter().map(|(id, grant)| {
                let owner = super::docker_owner::docker_owner(
                    id,
                    state.docker_starts.get(id),
                    state.holders.get(id),
                );
                share(id, owner, grant)
            }))
            .collect();
        tx.state.publish_shares(&link.publisher, shares);
        if self.health.get().is_some() {
            tx.state.health_dirs.insert(self.work_dir.clone());
        }
        commit(tx)
    }

    /// Allocates `count` GPUs to `id`; when too few are free, frees the pool's dead owners and
    /// tries once more, then refuses with the pool's counts.
    pub(crate) fn allocate_shared(
        &self,
        state: &mut State,
        id: &ContainerId,
        count: u32,
        step: &'static str,
    ) -> Result<GpuSet, LifecycleError> {
        let alloc = |source| LifecycleError::Allocation {
            container: id.clone(),
            step,
            source,
        };
        match state.allocator.allocate(id.as_str(), count) {
            Err(AllocError::NotEnough { .. }) if self.pool.is_some() => {}
            other => return other.map_err(alloc),
        }
        if self.reconcile_pool(state) {
            match state.allocator.allocate(id.as_str(), count) {
                Err(AllocError::NotEnough { .. }) => {}
                other => return other.map_err(alloc),
            }
        }
        Err(LifecycleError::Refused {
            container: id.clone(),
            step,
            shortage: self.shortage(state, count),
        })
    }

    /// Frees the pool's dead owners (other publishers'), and marks the rest again; true when
    /// something was freed.
    pub(crate) fn reconcile_pool(&self, state: &mut State) -> bool {
        let Some(link) = &self.pool else {
            return false;
        };
        let Some(mut tx) = state.tx.get_mut().take() else {
            return false;
        };
        let done = pool::reconcile(&mut tx.state, &link.host, Some(&link.publisher));
        let freed = !done.freed.is_empty();
        if freed {
            if let Err(e) = commit(&mut tx) {
                tracing::warn!(error = %e, "cannot record the freed GPUs of dead owners");
            }
            self.mark_elsewhere(state, &tx.state);
        }
        *state.tx.get_mut() = Some(tx);
        freed
    }

    /// What the node's GPUs are doing, for a refusal.
    pub(crate) fn shortage(&self, state: &State, asked: u32) -> Shortage {
        let slot = state.tx.borrow();
        let pool = slot.as_ref().map(|tx| &tx.state);
        let unhealthy_elsewhere = pool.map(PoolState::unhealthy).unwrap_or_default();
        let quarantined_elsewhere = pool.map(PoolState::quarantined).unwrap_or_default();
        let mut s = Shortage {
            asked,
            free: 0,
            unhealthy: 0,
            quarantined: 0,
            held: 0,
            unnamed: pool.map_or(0, |p| p.unnamed().values().sum()),
        };
        for i in state.allocator.managed().iter() {
            let uuid = self.uuid(i);
            let owner = state.allocator.owner_of(i);
            if owner == Some(QUARANTINE_OWNER) || quarantined_elsewhere.contains(uuid) {
                s.quarantined += 1;
            } else if owner.is_some_and(|o| o != ELSEWHERE_OWNER)
                || (owner == Some(ELSEWHERE_OWNER) && !unhealthy_elsewhere.contains_key(uuid))
            {
                s.held += 1;
            } else if state.allocator.unhealthy().contains(i)
                || unhealthy_elsewhere.contains_key(uuid)
            {
                s.unhealthy += 1;
            } else {
                s.free += 1;
            }
        }
        s
    }

    fn owner_of(&self, link: &PoolLink, state: &State, id: &ContainerId) -> Owner {
        let cgroup = Some(self.layout.container_dir(id));
        match &link.role {
            PoolRole::Agent => Owner::Mesos {
                agent: link.me.clone(),
                cgroup,
                holder: state.holders.get(id).cloned(),
            },
            PoolRole::Exec { private_dir } => Owner::Process {
                process: link.me.clone(),
                cgroup,
                private_dir: Some(private_dir.clone()),
            },
            PoolRole::Docker => Owner::Process {
                process: link.me.clone(),
                cgroup,
                private_dir: None,
            },
        }
    }

    fn uuid(&self, index: u32) -> &str {
        self.inventory
            .by_index(index)
            .map_or("", |g| g.uuid.as_str())
    }
}

/// MIG device UUIDs as records name them (NVML gives every MIG device one).
fn named<'a>(uuids: impl Iterator<Item = &'a String>) -> Vec<GpuUuid> {
    uuids
        .filter_map(|u| GpuUuid::new(u.as_str()).ok())
        .collect()
}

fn commit(tx: &mut Transaction) -> Result<(), pool::PoolError> {
    tx.commit()
}
