//! The container lifecycle of the `gpu/nvidia` isolator: Mesos's `Isolator` interface
//! (`recover`, `prepare`, `isolate`, `update`, `usage`, `status`, `cleanup`) over one allocator
//! shared with the Docker containerizer, device cgroups (v1 or v2) and a crash-safe checkpoint.
//!
//! Facts and decisions (`docs/reference/mesos-gpu-isolator.md` §1, §5, §9):
//! - Mesos runs each isolator as one libprocess actor, so its calls are serialized. We do the
//!   same with one `Mutex` held for a whole call, cgroup writes and checkpoint included: a call
//!   takes well under a millisecond, and holding the lock is what makes the write-ahead order
//!   below true for every interleaving.
//! - **The container's device cgroup** is `<v1 root>/devices/<cgroups root>/<id>` or
//!   `<cgroup2 mount>/<cgroups root>/<id>`, Mesos's own layout, made by Mesos or by us
//!   ([`CgroupMaker`], `placement`): with [`CgroupMaker::Mesos`] (the module in an agent
//!   whose Mesos makes a devices cgroup: v1 with `cgroups/devices`, and always v2) we add our
//!   rules to the cgroup Mesos made before our `prepare`, never move a process and never remove
//!   it; with [`CgroupMaker::Own`] (v1 without `cgroups/devices`, `mesos-gpu exec`) we make it
//!   deny-all with the base whitelist (Mesos's default), the control devices and the GPUs,
//!   move the process in at `isolate` and remove it at `cleanup`; `prepare` fails if it
//!   already exists. Either way the cgroups root is the agent's own `--cgroups_root`, and the
//!   two cannot collide: in an agent the cgroup maker follows from its flags, which decide whether
//!   Mesos makes a devices cgroup.
//! - A container that asked for no GPU gets nothing beyond what isolation requires: no rule of
//!   ours in Mesos's v1 cgroup (its whitelist already denies every GPU), the base list in our own
//!   cgroup or v2 program (which must deny the GPUs), no environment without an image.
//! - Crash safety is by ordering: the checkpoint always names a superset of the GPUs any cgroup
//!   allows. GPUs are checkpointed *before* a cgroup grants them (prepare, update grow) and
//!   revoked *before* the checkpoint forgets them (update shrink, cleanup). So recovery may keep a
//!   GPU reserved that a crash left unused, but never frees one a process can still open.
//! - Nested containers share their parent's GPUs and cgroup (Mesos `share_cgroups=true`):
//!   no allocation, and `update` is refused for them as in Mesos. One Mesos made a v1 devices
//!   cgroup of its own for (`share_cgroups=false`) gets its parent's rules there too.
//! - Unlike Mesos, GPUs of orphans and of anything recovery cannot account for stay reserved
//!   until `cleanup` (`recover`).
//! - With the node's pool ([`PoolConfig`], issue 13) every call that can change a reservation
//!   also holds the pool's `flock` for its duration, and publishes this isolator's
//!   reservations to the pool before its own checkpoint (`shared_pool`); `isolate`, `status`,
//!   `usage` and metrics do not take the pool lock.

mod checkpoint;
mod config;
mod docker;
mod docker_owner;
mod error;
pub mod fault;
mod health;
mod launch;
mod mig;
mod nested;
mod placement;
mod recover;
mod shared_pool;
mod shares;
mod state;
mod status;
mod taking;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

pub use checkpoint::CheckpointError;
pub use config::{CgroupChoice, CgroupMaker, IsolatorConfig};
pub use docker::DockerGuard;
pub use docker_owner::{DockerStart, MESOS_NAME_PREFIX, docker_name};
pub use error::LifecycleError;
pub use launch::{LaunchInfo, Mount, PrepareConfig, mesos_launch_info};
pub use mesos_gpu_enforce::pinning::{PinOutcome, PinningConfig};
pub use mig::MigConfig;
pub use recover::{RecoverState, RecoveryIssue, RecoveryReport, Unchecked};
pub use shared_pool::ELSEWHERE_OWNER;
pub use shared_pool::{PoolConfig, PoolRole};
pub use shares::{MpsRestart, SharingConfig};
pub use state::QUARANTINE_OWNER;
pub use status::{Allocations, ContainerKind, ContainerStatus, GpuUsage, Usage};

use checkpoint::Store;
use launch::launch_info;
use mesos_gpu_enforce::pinning::Pinner;
use mesos_gpu_enforce::{cgroup::CgroupLayout, cgroup::CgroupVersion, cgroup::DeviceRule};
use mesos_gpu_grant::device_rules;
use mesos_gpu_health::Limitations;
use mesos_gpu_node::devices::DeviceNodes;
use mesos_gpu_node::{inventory::Gpu, inventory::Inventory};
use mesos_gpu_os::chain::error_chain;
pub use mesos_gpu_os::container_id::ContainerId;
use mesos_gpu_placement::{
    allocator::AllocError, allocator::Allocator, allocator::GpuSet, allocator::Policy,
    allocator::Resize,
};
use placement::PlacedCgroup;
use state::{Container, State};
use taking::{Resizing, Taking};

/// The `gpu/nvidia` isolator. All methods take `&self` and may be called from many threads.
#[derive(Debug)]
pub struct Isolator {
    layout: CgroupLayout,
    cgroup_maker: CgroupMaker,
    inventory: Inventory,
    nodes: DeviceNodes,
    base: Vec<DeviceRule>,
    driver_volume: Option<PathBuf>,
    policy: Policy,
    devices: Vec<u32>,
    store: Store,
    work_dir: PathBuf,
    /// Shared with the health monitor's callback, which runs on the monitor thread.
    state: Arc<Mutex<State>>,
    limitations: Arc<Limitations>,
    health: OnceLock<health::HealthLink>,
    pinning: Pinner,
    /// The node's pool, when this isolator draws from one.
    pool: Option<shared_pool::PoolLink>,
    /// GPU sharing, when the operator declared replicas.
    sharing: Option<shares::Sharing>,
    /// The GPUs the allocator manages: the offered ones that are not shared.
    whole: Vec<u32>,
    /// How MIG devices are handed out.
    mig: MigConfig,
    /// Acts on nothing on the host ([`IsolatorConfig::dry_run`]).
    dry_run: bool,
}

impl Isolator {
    /// Sets up the isolator: picks the cgroup hierarchy, builds the allocator and locks the work
    /// directory. Call [`Isolator::recover`] next, even on a fresh agent.
    pub fn new(
        config: IsolatorConfig,
        inventory: Inventory,
        nodes: DeviceNodes,
    ) -> Result<Isolator, LifecycleError> {
        let layout = config::layout(&config).map_err(|source| LifecycleError::Setup { source })?;
        let devices = config
            .devices
            .clone()
            .unwrap_or_else(|| inventory.whole_gpus().map(|g| g.index).collect());
        let sharing = match &config.sharing {
            Some(c) => Some(shares::Sharing::new(
                c,
                &inventory,
                &devices,
                config.pool.is_some(),
                config.dry_run,
            )?),
            None => None,
        };
        let whole: Vec<u32> = devices
            .iter()
            .copied()
            .filter(|&i| !sharing.as_ref().is_some_and(|s| s.is_shared(i)))
            .collect();
        let allocator = Allocator::with_devices(&inventory, &whole, config.policy)
            .map_err(|source| LifecycleError::SetupAllocator { source })?;
        let store = Store::open(&config.work_dir).map_err(|source| LifecycleError::Checkpoint {
            step: "set up",
            source,
        })?;
        let pool = match &config.pool {
            Some(pool) => Some(shared_pool::PoolLink::new(pool, store.path())?),
            None => None,
        };
        tracing::info!(
            pool = %pool.as_ref().map_or_else(|| "none".to_owned(), |p| p.pool().state_path().display().to_string()),
            cgroups = %layout.version(), parent = %layout.parent_dir().display(), cgroup_maker = %config.cgroup_maker, policy = %config.policy,
            offered = allocator.offered(), checkpoint = %store.path().display(), "GPU isolator ready"
        );
        let pinning = Pinner::new(config.pinning, &layout, &config.v1_root);
        let mig_units = mig::units_of(&inventory, sharing.as_ref(), config.mig.allow_multiple);
        Ok(Isolator {
            layout,
            cgroup_maker: config.cgroup_maker,
            inventory,
            nodes,
            base: config.allowed_devices,
            driver_volume: config.driver_volume,
            policy: config.policy,
            devices,
            store,
            work_dir: config.work_dir,
            state: Arc::new(Mutex::new(State::new(allocator, mig_units))),
            limitations: Arc::new(Limitations::new()),
            health: OnceLock::new(),
            pinning,
            pool,
            sharing,
            whole,
            mig: config.mig,
            dry_run: config.dry_run,
        })
    }

    /// The cgroup version in use.
    pub fn cgroup_version(&self) -> CgroupVersion {
        self.layout.version()
    }

    /// Who makes the container cgroups.
    pub fn cgroup_maker(&self) -> CgroupMaker {
        self.cgroup_maker
    }

    /// The cgroup directory a container gets.
    pub fn cgroup_path(&self, id: &ContainerId) -> PathBuf {
        self.layout.container_dir(id)
    }

    /// The checkpoint file.
    pub fn checkpoint_path(&self) -> &Path {
        self.store.path()
    }

    /// Allocates the container's GPUs, checkpoints, creates its device cgroup and (NUMA pinning
    /// on, [`PinningConfig`]) narrows its cpuset to its GPUs' local CPUs and memory nodes, never
    /// below its `cpus`; returns what to launch it with and what pinning did. All or nothing: a
    /// failed step gives back what the earlier ones took. A nested container shares its parent's
    /// GPUs (and is not pinned: its parent's cpuset rules it).
    #[tracing::instrument(skip_all, fields(container = %id, requested = config.gpus))]
    pub fn prepare(
        &self,
        id: &ContainerId,
        config: PrepareConfig,
    ) -> Result<LaunchInfo, LifecycleError> {
        const STEP: &str = "prepare";
        let mut state = self.lock()?;
        if state.knows(id) {
            return Err(LifecycleError::AlreadyPrepared {
                container: id.clone(),
                step: STEP,
            });
        }
        if let Some(parent) = &config.parent {
            return self.prepare_nested(&mut state, id, parent, &config);
        }
        self.refuse_blind(id, &config, STEP)?;
        let mut taking = Taking::new(&mut state, id);
        let grant = self.take(&mut taking, id, &config, STEP, config.sharing)?;
        fault::point("prepare.allocated");
        let dir = self.layout.container_dir(id);
        let mut info = launch_info(
            &grant,
            &config,
            self.driver_volume.as_deref(),
            Some(dir.clone()),
        )
        .map_err(|source| LifecycleError::Grant {
            container: id.clone(),
            source,
        })?;
        taking
            .containers
            .insert(id.clone(), taking::container_of(&grant));
        if let Some(holder) = &config.holder {
            taking.holders.insert(id.clone(), holder.clone());
        }
        // Write-ahead: the checkpoint names the GPUs before any cgroup grants them.
        self.save(&taking, STEP)?;
        fault::point("prepare.checkpointed");
        if !self.dry_run {
            let cgroup = match self.place(id, dir, grant.rules()) {
                Ok(cgroup) => cgroup,
                Err(e) => {
                    drop(taking);
                    self.save_or_log(&state, STEP);
                    return Err(e);
                }
            };
            fault::point("prepare.cgroup_created");
            let entry = taking.containers.get_mut(id);
            let cgroup = entry.map(|entry| entry.cgroup.insert(cgroup));
            // NUMA pinning, decided over the grant's local GPUs (MIG parents included) as for
            // a Docker container (`DockerGuard::pin`); a failed write undoes the whole prepare.
            match self.pinning.pin(id, &grant.local_gpus(), config.cpus) {
                Ok(outcome) => info.pinning = outcome,
                Err(source) => {
                    if let Some(cgroup) = cgroup
                        && let Err(e) = cgroup.release(grant.rules(), &self.base)
                    {
                        tracing::error!(error = %error_chain(&e), "cannot remove the device cgroup of a container whose pinning failed");
                    }
                    drop(taking);
                    self.save_or_log(&state, STEP);
                    return Err(LifecycleError::Cgroup {
                        container: id.clone(),
                        step: STEP,
                        source,
                    });
                }
            }
        }
        taking.keep();
        match grant.share() {
            Some(share) => {
                let g = &share.placed;
                tracing::info!(gpu = %g.uuid, units = g.units, replicas = g.replicas, mode = %g.mode, cgroup = %self.layout.container_dir(id).display(), mounts = info.mounts.len(), "prepared container with a GPU share")
            }
            None => {
                tracing::info!(gpus = ?grant.uuids(), cgroup = %self.layout.container_dir(id).display(), mounts = info.mounts.len(), "prepared container")
            }
        }
        Ok(info)
    }

    /// The container's device cgroup, allowing `rules`: its own, made deny-all, or Mesos's at
    /// `dir`, joined ([`CgroupMaker`]).
    fn place(
        &self,
        id: &ContainerId,
        dir: PathBuf,
        rules: &[DeviceRule],
    ) -> Result<PlacedCgroup, LifecycleError> {
        match self.cgroup_maker {
            CgroupMaker::Own => PlacedCgroup::create(&self.layout, id, rules).map_err(|source| {
                LifecycleError::Cgroup {
                    container: id.clone(),
                    step: "prepare",
                    source,
                }
            }),
            CgroupMaker::Mesos => PlacedCgroup::join(&self.layout, id, dir, rules, &self.base),
        }
    }

    /// The cpuset cgroup a pinned container gets (v1: in the cpuset hierarchy).
    pub fn cpuset_path(&self, id: &ContainerId) -> PathBuf {
        self.pinning.cpuset_dir(id)
    }

    /// The GPUs' local CPUs and memory nodes the isolator was configured with.
    pub fn affinities(&self) -> &mesos_gpu_node::numa::Affinities {
        self.pinning.affinities()
    }

    /// Moves process `pid` into the container's own cgroup (its root parent's for a nested
    /// container); in a cgroup of Mesos, Mesos placed it already and nothing is done.
    #[tracing::instrument(skip_all, fields(container = %id, pid))]
    pub fn isolate(&self, id: &ContainerId, pid: u32) -> Result<(), LifecycleError> {
        const STEP: &str = "isolate";
        let state = self.lock_local()?;
        let root = state.nested.get(id).unwrap_or(id);
        let cgroup = self.cgroup_of(&state, root, STEP)?;
        fault::point("isolate.before_move");
        cgroup
            .add_process(pid)
            .map_err(|source| LifecycleError::Cgroup {
                container: id.clone(),
                step: STEP,
                source,
            })?;
        fault::point("isolate.moved");
        self.pinning
            .isolate(root, pid)
            .map_err(|source| LifecycleError::Cgroup {
                container: id.clone(),
                step: STEP,
                source,
            })?;
        tracing::info!(cgroup = %cgroup.path().display(), cgroup_maker = %self.cgroup_maker, "isolated process");
        Ok(())
    }

    /// Grows or shrinks the container's GPUs to `gpus`: allocator, device rules, checkpoint,
    /// all or nothing.
    #[tracing::instrument(skip_all, fields(container = %id, requested = gpus))]
    pub fn update(&self, id: &ContainerId, gpus: f64) -> Result<(), LifecycleError> {
        const STEP: &str = "update";
        let mut state = self.lock()?;
        self.cgroup_of(&state, id, STEP)?;
        if let Some(carried) = state.carried.get(id) {
            // Its device rules would be rebuilt from the GPUs this process sees, taking the
            // others away from a running container.
            return Err(LifecycleError::Blind {
                container: id.clone(),
                step: STEP,
                why: format!(
                    "it holds GPUs this process cannot see ({})",
                    carried
                        .gpus
                        .iter()
                        .map(|r| r.uuid.to_string())
                        .chain(carried.mig.iter().cloned())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            });
        }
        if let Some(grant) = state.containers.get(id).and_then(|c| c.share.as_ref()) {
            return self.update_share(id, grant, gpus);
        }
        if let Some(entry) = state.containers.get(id).filter(|c| !c.mig.is_empty()) {
            return self.update_mig(id, entry, gpus);
        }
        let resize = self.resize(&mut state, id, gpus, STEP)?;
        if resize.added.is_empty() && resize.released.is_empty() {
            // Mesos calls `update` whenever any resource of the container changes (twice per
            // launch): the same GPUs change nothing, and nothing is written.
            tracing::debug!(gpus, "update keeps the container's GPUs");
            return Ok(());
        }
        fault::point("update.allocated");
        let mut resizing = Resizing::new(&mut state, id, resize, STEP)?;
        let (old_rules, new_gpus) = (resizing.old_rules().to_vec(), resizing.new_gpus());
        let new_rules = device_rules(&self.nodes, &self.base, &self.minors(new_gpus), &[]);
        if resize.released.is_empty() {
            // Grow (or no change): checkpoint first, then grant.
            resizing.set(new_gpus, &new_rules);
            self.save(&resizing, STEP)?;
            fault::point("update.checkpointed");
            if let Err(e) = self.apply_rules(&mut resizing, id, &old_rules, &new_rules) {
                drop(resizing);
                self.save_or_log(&state, STEP);
                return Err(e);
            }
            fault::point("update.applied");
        } else {
            // Shrink: revoke first, then checkpoint. The lock keeps the released GPUs from being
            // granted elsewhere until both are done.
            self.apply_rules(&mut resizing, id, &old_rules, &new_rules)?;
            fault::point("update.applied");
            resizing.set(new_gpus, &new_rules);
            if let Err(e) = self.save(&resizing, STEP) {
                if let Err(restore) = self.apply_rules(&mut resizing, id, &new_rules, &old_rules) {
                    tracing::error!(error = %restore, "cannot restore the device rules of a failed update");
                }
                return Err(e);
            }
            fault::point("update.checkpointed");
        }
        resizing.keep();
        tracing::info!(added = %resize.added, released = %resize.released, gpus = %new_gpus, "updated container");
        Ok(())
    }

    /// Resizes what `id` holds in the allocator to `gpus`; when too few are free, frees the
    /// pool's dead owners and tries once more, then refuses with the pool's counts.
    fn resize(
        &self,
        state: &mut State,
        id: &ContainerId,
        gpus: f64,
        step: &'static str,
    ) -> Result<Resize, LifecycleError> {
        let alloc = |source| LifecycleError::Allocation {
            container: id.clone(),
            step,
            source,
        };
        let count = state.allocator.request(gpus).map_err(alloc)?.count();
        let resize = match state.allocator.resize(id.as_str(), count) {
            Err(AllocError::NotEnough { .. }) if self.reconcile_pool(state) => {
                state.allocator.resize(id.as_str(), count)
            }
            other => other,
        };
        match resize {
            Err(AllocError::NotEnough { .. }) if self.pool.is_some() => {
                let held = state.allocator.held_by(id.as_str()).len();
                Err(LifecycleError::Refused {
                    container: id.clone(),
                    step,
                    shortage: self.shortage(state, count.saturating_sub(held)),
                })
            }
            other => other.map_err(alloc),
        }
    }

    /// Changes the rules of `id`'s cgroup from `old` to `new`, and passes the change on to its
    /// nested containers with cgroups of their own.
    fn apply_rules(
        &self,
        state: &mut State,
        id: &ContainerId,
        old: &[DeviceRule],
        new: &[DeviceRule],
    ) -> Result<(), LifecycleError> {
        const STEP: &str = "update";
        let Some(cgroup) = state.containers.get_mut(id).and_then(|e| e.cgroup.as_mut()) else {
            return Err(LifecycleError::NoCgroup {
                container: id.clone(),
                step: STEP,
            });
        };
        cgroup
            .apply(old, new, &self.base)
            .map_err(|source| LifecycleError::Cgroup {
                container: id.clone(),
                step: STEP,
                source,
            })?;
        nested::regrant_nested(&self.layout, state, id, old, new, &self.base);
        Ok(())
    }

    /// Removes the container's cgroup (refused while processes remain), releases its GPUs and
    /// its claims on quarantined GPUs, and checkpoints. An unknown container is not an error.
    #[tracing::instrument(skip_all, fields(container = %id))]
    pub fn cleanup(&self, id: &ContainerId) -> Result<(), LifecycleError> {
        const STEP: &str = "clean up";
        let mut guard = self.lock()?;
        let state = &mut *guard;
        if let Some(root) = state.nested.remove(id) {
            if let Some(mut cgroup) = state.nested_cgroups.remove(id) {
                let rules = state
                    .containers
                    .get(&root)
                    .map(|e| e.rules.clone())
                    .unwrap_or_default();
                cgroup
                    .release(&rules, &self.base)
                    .map_err(|source| LifecycleError::Cgroup {
                        container: id.clone(),
                        step: STEP,
                        source,
                    })?;
            }
            tracing::info!("cleaned up nested container");
            return Ok(());
        }
        if state.docker.contains_key(id) {
            return Err(LifecycleError::WrongContainerizer {
                container: id.clone(),
                step: STEP,
                containerizer: "docker",
            });
        }
        let cgroup_err = |source| LifecycleError::Cgroup {
            container: id.clone(),
            step: STEP,
            source,
        };
        self.pinning.release(id).map_err(cgroup_err)?;
        match state.containers.get_mut(id) {
            Some(entry) => {
                if let Some(cgroup) = &mut entry.cgroup {
                    cgroup
                        .release(&entry.rules, &self.base)
                        .map_err(cgroup_err)?;
                }
            }
            None if state.quarantine.values().any(|c| c.contains(id)) => {
                // Recovery found a cgroup it could not account for: remove it before freeing
                // (one of Mesos's is Mesos's to remove, after its processes were killed).
                if self.cgroup_maker == CgroupMaker::Own {
                    mesos_gpu_enforce::cgroup::remove_cgroup_dir(&self.layout.container_dir(id))
                        .map_err(cgroup_err)?;
                }
            }
            None => {
                tracing::debug!("cleanup of an unknown container");
                return Ok(());
            }
        }
        fault::point("cleanup.cgroup_removed");
        let (released, released_mig) = state.forget(id);
        let children: Vec<ContainerId> = state
            .nested
            .iter()
            .filter(|(_, parent)| *parent == id)
            .map(|(child, _)| child.clone())
            .collect();
        for child in children {
            state.nested.remove(&child);
            state.nested_cgroups.remove(&child);
        }
        let freed = state.release_quarantine(id);
        fault::point("cleanup.released");
        self.limitations.forget(id.as_str());
        // Nothing can use the GPUs any more (the cgroup is gone, or Mesos killed its processes
        // and our rules are revoked): a failed write leaves the checkpoint holding more than
        // memory, which recovery handles.
        self.save(state, STEP)?;
        fault::point("cleanup.checkpointed");
        if state.containers.is_empty() && self.layout.version() == CgroupVersion::V2 {
            // Idle: hold no device program for lists no cgroup may ask for again.
            mesos_gpu_enforce::cgroup::V2DeviceCgroup::forget_cached_programs();
        }
        tracing::info!(released = %released, mig = ?released_mig, quarantine_freed = %freed, "cleaned up container");
        Ok(())
    }

    fn cgroup_of<'s>(
        &self,
        state: &'s State,
        id: &ContainerId,
        step: &'static str,
    ) -> Result<&'s PlacedCgroup, LifecycleError> {
        if let Some(parent) = state.nested.get(id)
            && step == "update"
        {
            return Err(LifecycleError::Nested {
                container: id.clone(),
                parent: parent.clone(),
                step,
            });
        }
        if state.docker.contains_key(id) {
            return Err(LifecycleError::WrongContainerizer {
                container: id.clone(),
                step,
                containerizer: "docker",
            });
        }
        match state.containers.get(id) {
            Some(Container {
                cgroup: Some(cgroup),
                ..
            }) => Ok(cgroup),
            Some(_) => Err(LifecycleError::NoCgroup {
                container: id.clone(),
                step,
            }),
            None => Err(LifecycleError::UnknownContainer {
                container: id.clone(),
                step,
            }),
        }
    }

    /// Refuses a request for GPUs when this process sees none: what it cannot see it could not
    /// place among the records it cannot check, nor record.
    fn refuse_blind(
        &self,
        id: &ContainerId,
        request: &PrepareConfig,
        step: &'static str,
    ) -> Result<(), LifecycleError> {
        let asks = request.gpus > 0.0 || request.mig.values().any(|&n| n > 0);
        if !asks || !self.inventory.gpus.is_empty() {
            return Ok(());
        }
        Err(LifecycleError::Blind {
            container: id.clone(),
            step,
            why: match &self.inventory.absent_reason {
                Some(reason) => format!("this process sees no GPU ({reason})"),
                None => "this process sees no GPU".to_owned(),
            },
        })
    }

    /// Publishes to the node's pool (first: a reservation is in the pool before any record of
    /// ours grants it), then checkpoints.
    fn save(&self, state: &State, step: &'static str) -> Result<(), LifecycleError> {
        self.publish(state)
            .map_err(|source| LifecycleError::Pool { step, source })?;
        self.store
            .save(&state.checkpoint(&self.inventory))
            .map_err(|source| LifecycleError::Checkpoint { step, source })
    }

    /// Saves during a rollback, where the first error is the one to report.
    fn save_or_log(&self, state: &State, step: &'static str) {
        if let Err(e) = self.save(state, step) {
            tracing::error!(error = %e, "cannot checkpoint after rolling back");
        }
    }

    fn minors(&self, set: GpuSet) -> Vec<u32> {
        set.iter()
            .filter_map(|i| self.inventory.by_index(i).map(|g| g.minor))
            .collect()
    }

    fn gpus_of(&self, set: GpuSet) -> Vec<Gpu> {
        set.iter()
            .filter_map(|i| self.inventory.by_index(i))
            .cloned()
            .collect()
    }
}
