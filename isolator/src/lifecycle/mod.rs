//! The container lifecycle of the `gpu/nvidia` isolator: Mesos's `Isolator` interface
//! (`recover`, `prepare`, `isolate`, `update`, `usage`, `status`, `cleanup`) over one allocator
//! shared with the Docker containerizer, device cgroups (v1 or v2) and a crash-safe checkpoint.
//!
//! Facts and decisions (`shared/reference/mesos_gpu.md` §1, §3, §9):
//! - Mesos runs each isolator as one libprocess actor, so its calls are serialized. We do the
//!   same with one `Mutex` held for a whole call, cgroup writes and checkpoint included: a call
//!   takes well under a millisecond, and holding the lock is what makes the write-ahead order
//!   below true for every interleaving.
//! - **We create the container's device cgroup** (`<v1 root>/devices/<cgroups root>/<id>` or
//!   `<cgroup2 mount>/<cgroups root>/<id>`): deny-all, then the base whitelist (Mesos's default,
//!   what its `cgroups/devices` isolator would apply), the control devices and the allocated
//!   GPUs; `cleanup` removes it. So the cgroups root given here must not also be managed by
//!   Mesos's `cgroups/devices` isolator. `prepare` fails if the cgroup already exists.
//! - Crash safety is by ordering: the checkpoint always names a superset of the GPUs any cgroup
//!   allows. GPUs are checkpointed *before* a cgroup grants them (prepare, update grow) and
//!   revoked *before* the checkpoint forgets them (update shrink, cleanup). So recovery may keep a
//!   GPU reserved that a crash left unused, but never frees one a process can still open.
//! - Nested containers share their parent's GPUs and cgroup (Mesos `share_cgroups=true`):
//!   no allocation, and `update` is refused for them as in Mesos.
//! - Unlike Mesos, GPUs of orphans and of anything recovery cannot account for stay reserved
//!   until `cleanup` ([`recover`]).

mod checkpoint;
pub mod fault;
mod launch;
mod recover;
mod state;

use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::{Mutex, MutexGuard};

pub use checkpoint::CheckpointError;
pub use launch::{
    CUDA_VISIBLE_DEVICES_ENV, LaunchInfo, Mount, MountKind, PrepareConfig, plan_launch,
};
pub use recover::{RecoverState, RecoveryIssue, RecoveryReport};
pub use state::QUARANTINE_OWNER;

use crate::allocator::{AllocError, Allocator, GpuSet, Policy};
pub use crate::cgroup::ContainerId;
use crate::cgroup::{
    CgroupError, CgroupLayout, CgroupMounts, CgroupVersion, DeviceCgroup, DeviceRule, Hierarchy,
    default_whitelist,
};
use crate::devices::DeviceNodes;
use crate::inventory::{Gpu, Inventory};
use checkpoint::Store;
use launch::{allow_list, launch_info};
use state::{Container, State};

/// Which cgroup interface to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CgroupChoice {
    /// v1 `devices` when mounted, else cgroup2 ([`CgroupMounts::hierarchy`]).
    #[default]
    Auto,
    /// cgroups v1 `devices` under [`IsolatorConfig::v1_root`].
    V1,
    /// cgroup2 at [`IsolatorConfig::v2_mount`] (or the mounted one).
    V2,
}

impl FromStr for CgroupChoice {
    type Err = LifecycleError;

    fn from_str(s: &str) -> Result<CgroupChoice, LifecycleError> {
        match s {
            "auto" => Ok(CgroupChoice::Auto),
            "v1" => Ok(CgroupChoice::V1),
            "v2" => Ok(CgroupChoice::V2),
            _ => Err(LifecycleError::UnknownCgroupChoice { got: s.to_owned() }),
        }
    }
}

/// How the isolator is set up.
#[derive(Debug, Clone, PartialEq)]
pub struct IsolatorConfig {
    /// How GPUs are chosen.
    pub policy: Policy,
    /// Only these NVML indices are offered (`--nvidia_gpu_devices`); `None` offers all.
    pub devices: Option<Vec<u32>>,
    /// Which cgroup interface to use.
    pub cgroup_version: CgroupChoice,
    /// The cgroups v1 root (the `devices` hierarchy is `<root>/devices`).
    pub v1_root: PathBuf,
    /// The cgroup2 mount; `None` finds it in the mount table.
    pub v2_mount: Option<PathBuf>,
    /// The parent of container cgroups (Mesos `--cgroups_root`).
    pub cgroups_root: String,
    /// Where the checkpoint lives (`<work_dir>/gpu/allocations.json`).
    pub work_dir: PathBuf,
    /// Host path of the `nvidia_<version>` driver volume, when one exists.
    pub driver_volume: Option<PathBuf>,
    /// The base allow list of every container (Mesos's default whitelist plus `--allowed_devices`).
    pub allowed_devices: Vec<DeviceRule>,
}

impl IsolatorConfig {
    /// Mesos's defaults (topology policy, auto cgroups, `/sys/fs/cgroup`, `mesos`) with the
    /// checkpoint under `work_dir`.
    pub fn new(work_dir: impl Into<PathBuf>) -> IsolatorConfig {
        IsolatorConfig {
            policy: Policy::default(),
            devices: None,
            cgroup_version: CgroupChoice::Auto,
            v1_root: PathBuf::from("/sys/fs/cgroup"),
            v2_mount: None,
            cgroups_root: crate::cgroup::DEFAULT_PARENT.to_owned(),
            work_dir: work_dir.into(),
            driver_volume: None,
            allowed_devices: default_whitelist(),
        }
    }
}

/// Why a lifecycle call failed. Every failed call leaves state, cgroups and checkpoint as they were.
#[derive(Debug, thiserror::Error)]
pub enum LifecycleError {
    /// The allocator refused (bad `gpus` value, not enough GPUs, …).
    #[error("cannot {step} container {container}")]
    Allocation {
        /// The container.
        container: ContainerId,
        /// The lifecycle call.
        step: &'static str,
        /// The allocator's reason.
        #[source]
        source: AllocError,
    },
    /// `prepare` (or `reserve_docker`) of an id already in use.
    #[error("cannot {step} container {container}: it has already been prepared")]
    AlreadyPrepared {
        /// The container.
        container: ContainerId,
        /// The lifecycle call.
        step: &'static str,
    },
    /// A call about a container the isolator does not know.
    #[error("cannot {step} container {container}: unknown container")]
    UnknownContainer {
        /// The container.
        container: ContainerId,
        /// The lifecycle call.
        step: &'static str,
    },
    /// A nested container whose parent is unknown.
    #[error("cannot prepare nested container {container}: its parent {parent} is unknown")]
    UnknownParent {
        /// The nested container.
        container: ContainerId,
        /// Its parent.
        parent: ContainerId,
    },
    /// `update` of a nested container (it shares its parent's GPUs).
    #[error(
        "cannot {step} nested container {container}: not supported for nested containers (update its parent {parent})"
    )]
    Nested {
        /// The nested container.
        container: ContainerId,
        /// Its parent.
        parent: ContainerId,
        /// The lifecycle call.
        step: &'static str,
    },
    /// A Mesos-containerizer call for a Docker container, or the reverse.
    #[error("cannot {step} container {container}: it belongs to the {owner} containerizer")]
    WrongContainerizer {
        /// The container.
        container: ContainerId,
        /// The lifecycle call.
        step: &'static str,
        /// `docker` or `mesos`.
        owner: &'static str,
    },
    /// `isolate`/`update` of a recovered container whose cgroup was gone.
    #[error(
        "cannot {step} container {container}: its cgroup was gone at recovery; only cleanup is possible"
    )]
    NoCgroup {
        /// The container.
        container: ContainerId,
        /// The lifecycle call.
        step: &'static str,
    },
    /// A device cgroup operation failed.
    #[error("cannot {step} container {container}")]
    Cgroup {
        /// The container.
        container: ContainerId,
        /// The lifecycle call.
        step: &'static str,
        /// The cgroup error.
        #[source]
        source: CgroupError,
    },
    /// The checkpoint could not be read or written.
    #[error("cannot {step}: checkpoint")]
    Checkpoint {
        /// The lifecycle call.
        step: &'static str,
        /// The checkpoint error.
        #[source]
        source: CheckpointError,
    },
    /// An allocated GPU has no device node to mount.
    #[error(
        "cannot prepare container {container}: GPU {index} has no device node (was it healthy at start?)"
    )]
    MissingNode {
        /// The container.
        container: ContainerId,
        /// NVML index of the GPU.
        index: u32,
    },
    /// Set-up failed: the cgroup hierarchy could not be chosen.
    #[error("cannot set up the isolator's cgroups")]
    Setup {
        /// Why.
        #[source]
        source: CgroupError,
    },
    /// Set-up failed: the allocator refused the configuration.
    #[error("cannot set up the isolator's allocator")]
    SetupAllocator {
        /// Why.
        #[source]
        source: AllocError,
    },
    /// A cgroup version name that is not `auto`, `v1` or `v2`.
    #[error("cgroup version {got:?}: expected one of auto, v1, v2")]
    UnknownCgroupChoice {
        /// The name given.
        got: String,
    },
    /// `recover` after containers were already prepared.
    #[error("recover must be the first call: the isolator already tracks containers")]
    RecoverAfterUse,
    /// A panic in another thread left the state unusable.
    #[error("the isolator state is unusable after a panic in another thread")]
    Poisoned,
}

impl LifecycleError {
    /// True for a call about a container the isolator does not know.
    pub fn is_unknown_container(&self) -> bool {
        matches!(self, LifecycleError::UnknownContainer { .. })
    }

    /// True when `prepare` named a container already prepared.
    pub fn is_already_prepared(&self) -> bool {
        matches!(self, LifecycleError::AlreadyPrepared { .. })
    }

    /// True when the `gpus` value itself was refused (negative, fractional, NaN, too many).
    pub fn is_bad_request(&self) -> bool {
        matches!(
            self,
            LifecycleError::Allocation {
                source: AllocError::BadRequest { .. },
                ..
            }
        )
    }

    /// True when there were not enough free GPUs.
    pub fn is_not_enough(&self) -> bool {
        matches!(
            self,
            LifecycleError::Allocation {
                source: AllocError::NotEnough { .. },
                ..
            }
        )
    }

    /// True when a cgroup could not be removed because processes remain in it.
    pub fn is_busy(&self) -> bool {
        matches!(self, LifecycleError::Cgroup { source, .. } if source.is_busy())
    }
}

/// Who holds which GPUs, for tests, `status` pages and metrics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allocations {
    /// GPUs nobody holds (healthy and free).
    pub free: Vec<u32>,
    /// Every holder (container id, or [`QUARANTINE_OWNER`]) and its GPUs by NVML index.
    pub owners: Vec<(String, Vec<u32>)>,
    /// Quarantined GPUs and the containers whose cleanup frees them.
    pub quarantined: Vec<(u32, Vec<ContainerId>)>,
}

/// One GPU a container holds. NVML utilization and memory figures will be added here by the
/// monitoring work; nothing is reported that was not measured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuUsage {
    /// NVML index.
    pub index: u32,
    /// Minor of `/dev/nvidia<minor>`.
    pub minor: u32,
    /// UUID.
    pub uuid: String,
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
}

/// The `gpu/nvidia` isolator. All methods take `&self` and may be called from many threads.
#[derive(Debug)]
pub struct Isolator {
    layout: CgroupLayout,
    inventory: Inventory,
    nodes: DeviceNodes,
    base: Vec<DeviceRule>,
    driver_volume: Option<PathBuf>,
    policy: Policy,
    devices: Vec<u32>,
    store: Store,
    state: Mutex<State>,
}

impl Isolator {
    /// Sets up the isolator: picks the cgroup hierarchy, builds the allocator and locks the work
    /// directory. Call [`Isolator::recover`] next, even on a fresh agent.
    pub fn new(
        config: IsolatorConfig,
        inventory: Inventory,
        nodes: DeviceNodes,
    ) -> Result<Isolator, LifecycleError> {
        let layout = layout(&config).map_err(|source| LifecycleError::Setup { source })?;
        let devices = config
            .devices
            .clone()
            .unwrap_or_else(|| inventory.gpus.iter().map(|g| g.index).collect());
        let allocator = Allocator::with_devices(&inventory, &devices, config.policy)
            .map_err(|source| LifecycleError::SetupAllocator { source })?;
        let store = Store::open(&config.work_dir).map_err(|source| LifecycleError::Checkpoint {
            step: "set up",
            source,
        })?;
        tracing::info!(
            cgroups = %layout.version(), parent = %layout.parent_dir().display(), policy = %config.policy,
            offered = allocator.offered(), checkpoint = %store.path().display(), "GPU isolator ready"
        );
        Ok(Isolator {
            layout,
            inventory,
            nodes,
            base: config.allowed_devices,
            driver_volume: config.driver_volume,
            policy: config.policy,
            devices,
            store,
            state: Mutex::new(State::new(allocator)),
        })
    }

    /// The cgroup version in use.
    pub fn cgroup_version(&self) -> CgroupVersion {
        self.layout.version()
    }

    /// The cgroup directory a container gets.
    pub fn cgroup_path(&self, id: &ContainerId) -> PathBuf {
        self.layout.container_dir(id)
    }

    /// The checkpoint file.
    pub fn checkpoint_path(&self) -> &Path {
        self.store.path()
    }

    /// Allocates the container's GPUs, creates its device cgroup and checkpoints, and returns
    /// what to launch it with. A nested container shares its parent's GPUs.
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
        let alloc = |source| LifecycleError::Allocation {
            container: id.clone(),
            step: STEP,
            source,
        };
        let count = state.allocator.request(config.gpus).map_err(alloc)?.count();
        let gpus = state
            .allocator
            .allocate(id.as_str(), count)
            .map_err(alloc)?;
        fault::point("prepare.allocated");
        let rules = allow_list(&self.base, &self.nodes, self.minors(&state, gpus));
        let info = launch_info(
            &config,
            &self.gpus_of(gpus),
            &self.nodes,
            self.driver_volume.as_deref(),
            rules.clone(),
            Some(self.layout.container_dir(id)),
        );
        let info = match info {
            Ok(info) => info,
            Err(missing) => {
                state.allocator.release_all(id.as_str());
                return Err(LifecycleError::MissingNode {
                    container: id.clone(),
                    index: missing.index,
                });
            }
        };
        state.containers.insert(
            id.clone(),
            Container {
                gpus,
                rules: rules.clone(),
                cgroup: None,
            },
        );
        // Write-ahead: the checkpoint names the GPUs before any cgroup grants them.
        if let Err(e) = self.save(&state, STEP) {
            state.containers.remove(id);
            state.allocator.release_all(id.as_str());
            return Err(e);
        }
        fault::point("prepare.checkpointed");
        let cgroup = match DeviceCgroup::create(&self.layout, id, &rules) {
            Ok(cgroup) => cgroup,
            Err(source) => {
                state.containers.remove(id);
                state.allocator.release_all(id.as_str());
                self.save_or_log(&state, STEP);
                return Err(LifecycleError::Cgroup {
                    container: id.clone(),
                    step: STEP,
                    source,
                });
            }
        };
        fault::point("prepare.cgroup_created");
        if let Some(entry) = state.containers.get_mut(id) {
            entry.cgroup = Some(cgroup);
        }
        tracing::info!(gpus = %gpus, cgroup = %self.layout.container_dir(id).display(), mounts = info.mounts.len(), "prepared container");
        Ok(info)
    }

    fn prepare_nested(
        &self,
        state: &mut State,
        id: &ContainerId,
        parent: &ContainerId,
        config: &PrepareConfig,
    ) -> Result<LaunchInfo, LifecycleError> {
        let root = state.nested.get(parent).unwrap_or(parent).clone();
        let Some(entry) = state.containers.get(&root) else {
            return Err(LifecycleError::UnknownParent {
                container: id.clone(),
                parent: parent.clone(),
            });
        };
        let cgroup = entry.cgroup.as_ref().map(|c| c.path().to_owned());
        let info = launch_info(
            config,
            &self.gpus_of(entry.gpus),
            &self.nodes,
            self.driver_volume.as_deref(),
            entry.rules.clone(),
            cgroup,
        )
        .map_err(|m| LifecycleError::MissingNode {
            container: id.clone(),
            index: m.index,
        })?;
        state.nested.insert(id.clone(), root.clone());
        tracing::info!(parent = %root, gpus = info.gpus.len(), "prepared nested container sharing its parent's GPUs");
        Ok(info)
    }

    /// Moves process `pid` into the container's cgroup (its root parent's for a nested container).
    #[tracing::instrument(skip_all, fields(container = %id, pid))]
    pub fn isolate(&self, id: &ContainerId, pid: u32) -> Result<(), LifecycleError> {
        const STEP: &str = "isolate";
        let state = self.lock()?;
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
        tracing::info!(cgroup = %cgroup.path().display(), "isolated process");
        Ok(())
    }

    /// Grows or shrinks the container's GPUs to `gpus`: allocator, device rules, checkpoint,
    /// all or nothing.
    #[tracing::instrument(skip_all, fields(container = %id, requested = gpus))]
    pub fn update(&self, id: &ContainerId, gpus: f64) -> Result<(), LifecycleError> {
        const STEP: &str = "update";
        let mut guard = self.lock()?;
        let state = &mut *guard;
        self.cgroup_of(state, id, STEP)?;
        let alloc = |source| LifecycleError::Allocation {
            container: id.clone(),
            step: STEP,
            source,
        };
        let count = state.allocator.request(gpus).map_err(alloc)?.count();
        let resize = state.allocator.resize(id.as_str(), count).map_err(alloc)?;
        fault::point("update.allocated");
        let Some(entry) = state.containers.get(id) else {
            return Err(LifecycleError::UnknownContainer {
                container: id.clone(),
                step: STEP,
            });
        };
        let (old_gpus, old_rules) = (entry.gpus, entry.rules.clone());
        let new_gpus = old_gpus.union(resize.added).difference(resize.released);
        let new_rules = allow_list(&self.base, &self.nodes, self.minors(state, new_gpus));
        let undo_alloc = |state: &mut State| {
            let undone = if resize.added.is_empty() {
                state.allocator.recover(id.as_str(), resize.released)
            } else {
                state.allocator.release(id.as_str(), resize.added)
            };
            if let Err(e) = undone {
                tracing::error!(error = %e, "cannot undo the allocation of a failed update");
            }
        };
        let set_entry = |state: &mut State, gpus: GpuSet, rules: &[DeviceRule]| {
            if let Some(entry) = state.containers.get_mut(id) {
                entry.gpus = gpus;
                entry.rules = rules.to_vec();
            }
        };
        let apply = |state: &mut State, rules: &[DeviceRule]| -> Result<(), LifecycleError> {
            match state.containers.get_mut(id).and_then(|e| e.cgroup.as_mut()) {
                Some(cgroup) => {
                    cgroup
                        .set_allowed(rules)
                        .map_err(|source| LifecycleError::Cgroup {
                            container: id.clone(),
                            step: STEP,
                            source,
                        })
                }
                None => Err(LifecycleError::NoCgroup {
                    container: id.clone(),
                    step: STEP,
                }),
            }
        };
        if resize.released.is_empty() {
            // Grow (or no change): checkpoint first, then grant.
            set_entry(state, new_gpus, &new_rules);
            if let Err(e) = self.save(state, STEP) {
                set_entry(state, old_gpus, &old_rules);
                undo_alloc(state);
                return Err(e);
            }
            fault::point("update.checkpointed");
            if let Err(e) = apply(state, &new_rules) {
                set_entry(state, old_gpus, &old_rules);
                undo_alloc(state);
                self.save_or_log(state, STEP);
                return Err(e);
            }
            fault::point("update.applied");
        } else {
            // Shrink: revoke first, then checkpoint. The lock keeps the released GPUs from being
            // granted elsewhere until both are done.
            if let Err(e) = apply(state, &new_rules) {
                undo_alloc(state);
                return Err(e);
            }
            fault::point("update.applied");
            set_entry(state, new_gpus, &new_rules);
            if let Err(e) = self.save(state, STEP) {
                if let Err(restore) = apply(state, &old_rules) {
                    tracing::error!(error = %restore, "cannot restore the device rules of a failed update");
                }
                set_entry(state, old_gpus, &old_rules);
                undo_alloc(state);
                return Err(e);
            }
            fault::point("update.checkpointed");
        }
        tracing::info!(added = %resize.added, released = %resize.released, gpus = %new_gpus, "updated container");
        Ok(())
    }

    /// The GPUs the container holds (its parent's, for a nested container).
    #[tracing::instrument(level = "debug", skip_all, fields(container = %id))]
    pub fn usage(&self, id: &ContainerId) -> Result<Usage, LifecycleError> {
        let status = self.status(id)?;
        let gpus = self
            .gpus_of(GpuSet::from_indices(status.gpus).unwrap_or_default())
            .into_iter()
            .map(|g| GpuUsage {
                index: g.index,
                minor: g.minor,
                uuid: g.uuid,
            })
            .collect();
        Ok(Usage { gpus })
    }

    /// The container's kind, GPUs and cgroup.
    pub fn status(&self, id: &ContainerId) -> Result<ContainerStatus, LifecycleError> {
        let state = self.lock()?;
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
                gpus: entry.gpus.to_vec(),
                cgroup,
            });
        }
        match state.docker.get(id) {
            Some(set) => Ok(ContainerStatus {
                kind: ContainerKind::Docker,
                gpus: set.to_vec(),
                cgroup: None,
            }),
            None => Err(LifecycleError::UnknownContainer {
                container: id.clone(),
                step: "report",
            }),
        }
    }

    /// Removes the container's cgroup (refused while processes remain), releases its GPUs and
    /// its claims on quarantined GPUs, and checkpoints. An unknown container is not an error.
    #[tracing::instrument(skip_all, fields(container = %id))]
    pub fn cleanup(&self, id: &ContainerId) -> Result<(), LifecycleError> {
        const STEP: &str = "clean up";
        let mut state = self.lock()?;
        if state.nested.remove(id).is_some() {
            tracing::info!("cleaned up nested container");
            return Ok(());
        }
        if state.docker.contains_key(id) {
            return Err(LifecycleError::WrongContainerizer {
                container: id.clone(),
                step: STEP,
                owner: "docker",
            });
        }
        let cgroup_err = |source| LifecycleError::Cgroup {
            container: id.clone(),
            step: STEP,
            source,
        };
        match state.containers.get(id) {
            Some(entry) => {
                if let Some(cgroup) = &entry.cgroup {
                    cgroup.destroy().map_err(cgroup_err)?;
                }
            }
            None if state.quarantine.values().any(|c| c.contains(id)) => {
                // Recovery found a cgroup it could not account for: remove it before freeing.
                crate::cgroup::remove_cgroup_dir(&self.layout.container_dir(id))
                    .map_err(cgroup_err)?;
            }
            None => {
                tracing::debug!("cleanup of an unknown container");
                return Ok(());
            }
        }
        fault::point("cleanup.cgroup_removed");
        let released = state.allocator.release_all(id.as_str());
        state.containers.remove(id);
        state.nested.retain(|_, parent| parent != id);
        let freed = state.release_quarantine(id);
        fault::point("cleanup.released");
        // The cgroup is gone, so nothing can use the GPUs: a failed write leaves the checkpoint
        // holding more than memory, which recovery handles.
        self.save(&state, STEP)?;
        fault::point("cleanup.checkpointed");
        tracing::info!(released = %released, quarantine_freed = %freed, "cleaned up container");
        Ok(())
    }

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
        let set = state
            .allocator
            .allocate(id.as_str(), count)
            .map_err(alloc)?;
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
        self.save(&state, STEP)?;
        tracing::info!(released = %released, "released GPUs of a Docker container");
        Ok(())
    }

    /// Who holds which GPUs now.
    pub fn allocations(&self) -> Result<Allocations, LifecycleError> {
        let state = self.lock()?;
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

    fn lock(&self) -> Result<MutexGuard<'_, State>, LifecycleError> {
        self.state.lock().map_err(|_| LifecycleError::Poisoned)
    }

    fn cgroup_of<'s>(
        &self,
        state: &'s State,
        id: &ContainerId,
        step: &'static str,
    ) -> Result<&'s DeviceCgroup, LifecycleError> {
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
                owner: "docker",
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

    fn save(&self, state: &State, step: &'static str) -> Result<(), LifecycleError> {
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

    fn minors(&self, state: &State, set: GpuSet) -> Vec<u32> {
        set.iter()
            .filter_map(|i| state.allocator.minor(i))
            .collect()
    }

    fn gpus_of(&self, set: GpuSet) -> Vec<Gpu> {
        set.iter()
            .filter_map(|i| self.inventory.by_index(i))
            .cloned()
            .collect()
    }
}

/// The container cgroup layout the configuration asks for.
fn layout(config: &IsolatorConfig) -> Result<CgroupLayout, CgroupError> {
    let hierarchy = match config.cgroup_version {
        CgroupChoice::Auto => CgroupMounts::read()?.hierarchy()?,
        CgroupChoice::V1 => Hierarchy {
            version: CgroupVersion::V1,
            mount: config.v1_root.join("devices"),
        },
        CgroupChoice::V2 => {
            let mount = match &config.v2_mount {
                Some(mount) => mount.clone(),
                None => CgroupMounts::read()?.v2.ok_or(CgroupError::NoHierarchy)?,
            };
            Hierarchy {
                version: CgroupVersion::V2,
                mount,
            }
        }
    };
    CgroupLayout::new(hierarchy, &config.cgroups_root)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn cgroup_choice_names() {
        assert_eq!("v1".parse::<CgroupChoice>().unwrap(), CgroupChoice::V1);
        assert_eq!("auto".parse::<CgroupChoice>().unwrap(), CgroupChoice::Auto);
        let err = "v3".parse::<CgroupChoice>().unwrap_err();
        assert_eq!(
            err.to_string(),
            "cgroup version \"v3\": expected one of auto, v1, v2"
        );
    }

    #[test]
    fn bad_cgroups_root_is_refused_before_anything_is_made() {
        let dir = tempfile::tempdir().unwrap();
        let mut config = IsolatorConfig::new(dir.path());
        config.cgroup_version = CgroupChoice::V1;
        config.cgroups_root = "../escape".into();
        let err = Isolator::new(config, Inventory::default(), DeviceNodes::default()).unwrap_err();
        assert!(
            matches!(
                err,
                LifecycleError::Setup {
                    source: CgroupError::InvalidParent { .. }
                }
            ),
            "{err}"
        );
        assert!(!dir.path().join("gpu").exists());
    }
}
