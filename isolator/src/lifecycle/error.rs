//! [`LifecycleError`]: why a lifecycle call failed, with the container and the step.

use std::path::PathBuf;

use super::{CheckpointError, ContainerId};
use mesos_gpu_enforce::cgroup::CgroupError;
use mesos_gpu_health::HealthError;
use mesos_gpu_placement::allocator::AllocError;

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
    /// The node's pool has too few GPUs for the request, after freeing those of dead owners.
    #[error("cannot {step} container {container}: {shortage}")]
    Refused {
        /// The container.
        container: ContainerId,
        /// The lifecycle call.
        step: &'static str,
        /// What the pool holds.
        shortage: mesos_gpu_pool::Shortage,
    },
    /// A share request that no shared GPU has room for, and that whole GPUs cannot serve either.
    #[error("cannot {step} container {container}: {placement}; whole GPUs: {whole}")]
    ShareRefused {
        /// The container.
        container: ContainerId,
        /// The lifecycle call.
        step: &'static str,
        /// Why no shared GPU takes it.
        placement: Box<mesos_gpu_placement::sharing::PlacementError>,
        /// What the whole GPUs are doing.
        whole: mesos_gpu_pool::Shortage,
    },
    /// A request for a share mode no GPU of the node is shared under (`MESOS_GPU_SHARE_MODE`).
    #[error("cannot {step} container {container}: {placement}")]
    ShareMode {
        /// The container.
        container: ContainerId,
        /// The lifecycle call.
        step: &'static str,
        /// What was asked, and the node's modes.
        placement: Box<mesos_gpu_placement::sharing::PlacementError>,
    },
    /// A MIG request that cannot be served.
    #[error("cannot {step} container {container}")]
    Mig {
        /// The container.
        container: ContainerId,
        /// The lifecycle call.
        step: &'static str,
        /// Why.
        #[source]
        source: Box<mesos_gpu_placement::mig::MigError>,
    },
    /// A `gpus` request neither MIG devices nor whole GPUs can serve (single strategy).
    #[error("cannot {step} container {container}: {mig}; whole GPUs: {whole}")]
    MigRefused {
        /// The container.
        container: ContainerId,
        /// The lifecycle call.
        step: &'static str,
        /// Why no MIG devices.
        mig: Box<mesos_gpu_placement::mig::MigError>,
        /// What the whole GPUs are doing.
        whole: mesos_gpu_pool::Shortage,
    },
    /// A request that does not fit the MIG strategy.
    #[error("cannot prepare container {container}: {why}")]
    MigStrategy {
        /// The container.
        container: ContainerId,
        /// Why.
        why: String,
    },
    /// A container holding MIG devices asked for another number of them.
    #[error(
        "cannot update container {container}: it holds MIG devices {devices}, which cannot be resized (asked gpus:{asked}); relaunch the task"
    )]
    MigResize {
        /// The container.
        container: ContainerId,
        /// Its MIG devices.
        devices: String,
        /// The `gpus` value asked.
        asked: f64,
    },
    /// A container holding a GPU share asked for another number of units.
    #[error(
        "cannot update container {container}: it holds a share of {units}/{replicas} of GPU {gpu}, and a share cannot be resized (asked gpus:{asked}); relaunch the task with the new size"
    )]
    ShareResize {
        /// The container.
        container: ContainerId,
        /// Its GPU.
        gpu: String,
        /// Units it holds.
        units: u32,
        /// The GPU's replica count.
        replicas: u32,
        /// The `gpus` value asked.
        asked: f64,
    },
    /// GPU sharing is misconfigured.
    #[error("GPU sharing: {why}")]
    SharingSetup {
        /// What is wrong.
        why: String,
    },
    /// The MPS control daemon of a shared GPU could not be started.
    #[error(
        "cannot prepare container {container}: the MPS control daemon of GPU {gpu} is not running"
    )]
    Mps {
        /// The container.
        container: ContainerId,
        /// The GPU.
        gpu: String,
        /// Why.
        #[source]
        source: Box<mesos_gpu_enforce::mps::MpsError>,
    },
    /// The node's GPU pool could not be read or written.
    #[error("cannot {step}: the node's GPU pool failed")]
    Pool {
        /// The lifecycle call.
        step: &'static str,
        /// Why.
        #[source]
        source: mesos_gpu_pool::PoolError,
    },
    /// A grant this process cannot place: it sees no GPU, or the container holds GPUs it cannot
    /// see. What it cannot see it could not record, so it grants nothing.
    #[error("cannot {step} container {container}: {why}: granting no GPU")]
    Blind {
        /// The container.
        container: ContainerId,
        /// The lifecycle call.
        step: &'static str,
        /// What this process cannot see, and why.
        why: String,
    },
    /// `prepare` (or `DockerGuard::reserve`) of an id already in use.
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
    #[error("cannot {step} container {container}: it belongs to the {containerizer} containerizer")]
    WrongContainerizer {
        /// The container.
        container: ContainerId,
        /// The lifecycle call.
        step: &'static str,
        /// `docker` or `mesos`.
        containerizer: &'static str,
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
    /// What was taken cannot be granted to one container (MIG devices with whole GPUs, a GPU
    /// without a known minor, a GPU without a device node to mount).
    #[error("cannot grant container {container} what it asked for")]
    Grant {
        /// The container.
        container: ContainerId,
        /// Why.
        #[source]
        source: mesos_gpu_grant::GrantError,
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
    /// A container-cgroups maker name that is not `mesos` or `own`.
    #[error("container cgroups {got:?}: expected one of mesos, own")]
    UnknownCgroupMaker {
        /// The name given.
        got: String,
    },
    /// With Mesos owning the container cgroups, Mesos made none for the container.
    #[error(
        "cannot prepare container {container}: Mesos made no cgroup for it at {path} (on cgroup v1 the module needs `cgroups/devices` in the agent's --isolation to work on Mesos's devices cgroups; on cgroup v2, the agent's linux launcher)"
    )]
    NoMesosCgroup {
        /// The container.
        container: ContainerId,
        /// Where Mesos makes its cgroup.
        path: PathBuf,
    },
    /// v1: the devices cgroup Mesos made allows every device, so nobody isolates it.
    #[error(
        "cannot prepare container {container}: its devices cgroup {path} allows every device (`a *:* rwm`), so Mesos's `cgroups/devices` isolator does not manage it; add `cgroups/devices` to the agent's --isolation"
    )]
    MesosCgroupAllowsAll {
        /// The container.
        container: ContainerId,
        /// The cgroup.
        path: PathBuf,
    },
    /// v2: another device program is attached to the container's cgroup.
    #[error(
        "cannot prepare container {container}: cgroup {path} already has a device program that is not ours (BPF program ids {ids:?}); Mesos's `cgroups/devices` (or `cgroups/all`) isolator attaches one, and a cgroup v2 device program can only take access away, so the GPUs would stay denied: drop `cgroups/devices` (and `cgroups/all`) from --isolation on cgroup v2 hosts"
    )]
    ForeignDeviceProgram {
        /// The container.
        container: ContainerId,
        /// The cgroup.
        path: PathBuf,
        /// The other programs' ids.
        ids: Vec<u32>,
    },
    /// `recover` after containers were already prepared.
    #[error("recover must be the first call: the isolator already tracks containers")]
    RecoverAfterUse,
    /// A panic in another thread left the state unusable.
    #[error("the isolator state is unusable after a panic in another thread")]
    Poisoned,
    /// A health call on an isolator without a health monitor ([`super::Isolator::attach_health`]).
    #[error("cannot {step}: no GPU health monitor is attached to the isolator")]
    NoHealthMonitor {
        /// The call.
        step: &'static str,
    },
    /// `attach_health` on an isolator that already has a monitor.
    #[error("a GPU health monitor is already attached to the isolator")]
    HealthAttached,
    /// The health monitor refused (store in use, unknown GPU, …).
    #[error("cannot {step}: GPU health")]
    Health {
        /// The call.
        step: &'static str,
        /// The monitor's reason.
        #[source]
        source: HealthError,
    },
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
            } | LifecycleError::MigStrategy { .. }
                | LifecycleError::MigResize { .. }
                | LifecycleError::ShareResize { .. }
                | LifecycleError::Grant {
                    source: mesos_gpu_grant::GrantError::MigWithGpus { .. },
                    ..
                }
        ) || matches!(self, LifecycleError::Mig { source, .. }
            if !matches!(**source, mesos_gpu_placement::mig::MigError::NotEnough { .. }))
    }

    /// True when there were not enough free GPUs.
    pub fn is_not_enough(&self) -> bool {
        matches!(
            self,
            LifecycleError::Allocation {
                source: AllocError::NotEnough { .. },
                ..
            } | LifecycleError::Refused { .. }
                | LifecycleError::ShareRefused { .. }
                | LifecycleError::MigRefused { .. }
        ) || matches!(self, LifecycleError::Mig { source, .. }
            if matches!(**source, mesos_gpu_placement::mig::MigError::NotEnough { .. }))
    }

    /// True when a health call named a GPU the node does not have, or text that is no GPU.
    pub fn is_unknown_gpu(&self) -> bool {
        matches!(self, LifecycleError::Health { source, .. } if source.is_unknown_gpu())
    }

    /// For an error of [`super::Isolator::new`]: true when it refused the configuration's values
    /// against the node (a device list or a sharing spec naming GPUs it lacks, a GPU listed
    /// twice or in MIG mode), as opposed to a failure of the host.
    pub fn is_refused_setup(&self) -> bool {
        matches!(
            self,
            LifecycleError::SetupAllocator { .. } | LifecycleError::SharingSetup { .. }
        )
    }

    /// True when a cgroup could not be removed because processes remain in it.
    pub fn is_busy(&self) -> bool {
        matches!(self, LifecycleError::Cgroup { source, .. } if source.is_busy())
    }
}
