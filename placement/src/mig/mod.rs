//! MIG devices as allocation units, and what a container holding one needs.
//!
//! A unit is a whole GPU (the [`crate::allocator`]) or one MIG device (here, keyed by its
//! `MIG-…` UUID, as the node pool keys reservations). A GPU in MIG mode is never a whole-GPU
//! unit ([`mesos_gpu_node::inventory::Inventory::whole_gpus`]), so a MIG device and its parent are never
//! held together.
//!
//! Facts relied on (`docs/reference/mig.md` §2-3):
//! - CUDA uses only one MIG device per process (klueska, k8s-device-plugin #728): a task asking
//!   for two gets nothing from the second, so more than one is refused unless the operator
//!   allows it.
//! - A container with one MIG device needs the control nodes, the parent's `/dev/nvidia<minor>`,
//!   and the GPU instance's and compute instance's `access` capability nodes
//!   (`/dev/nvidia-caps/nvidia-cap<N>`, the nvidia-caps major); NVIDIA's device plugin grants
//!   them `rw` in the device cgroup. libnvidia-container also bind-mounts the two
//!   `/proc/driver/nvidia/capabilities/…/access` files read-only.
//! - `NVIDIA_VISIBLE_DEVICES` and `CUDA_VISIBLE_DEVICES` name the device as `MIG-<uuid>`.
//! - CAP_SYS_ADMIN implicitly grants every NVIDIA capability (MIG user guide, "Device Nodes and
//!   Capabilities"): only the device cgroup then stops the task, so such a task is refused
//!   unless the operator allows it.

mod units;

pub use units::{MigUnits, UnitState};

use mesos_gpu_node::inventory::MigDevice;

/// A kind of MIG device, what a request names: the GPU instance profile id and, for a compute
/// instance smaller than its GPU instance, its compute slices. A 3g.40gb GPU instance split in
/// three compute instances gives three `1c.3g.40gb` devices of profile 9, which are not
/// `3g.40gb` devices (profile 9 too): NVIDIA's device plugin offers them as other resources.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct MigKind {
    /// The GPU instance profile id (`NVML_GPU_INSTANCE_PROFILE_*`).
    pub profile: u32,
    /// The compute instance's slices when it spans less than its GPU instance; `None` for a
    /// compute instance spanning it (what `nvidia-smi mig -cgi … -C` makes).
    pub compute_slices: Option<u32>,
}

impl MigKind {
    /// A device spanning its whole GPU instance of `profile` (`--mig 19:1`).
    pub fn whole(profile: u32) -> MigKind {
        MigKind {
            profile,
            compute_slices: None,
        }
    }

    /// The kind of `device`; `None` when NVML did not say its profile.
    pub fn of(device: &MigDevice) -> Option<MigKind> {
        Some(MigKind {
            profile: device.profile?,
            compute_slices: (device.compute_instance_slices < device.gpu_instance_slices)
                .then_some(device.compute_instance_slices),
        })
    }
}

impl std::fmt::Display for MigKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.compute_slices {
            None => write!(f, "id {}", self.profile),
            Some(c) => write!(f, "id {}, compute instances of {c} slices", self.profile),
        }
    }
}

/// Why a MIG request or a MIG container's set-up was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MigError {
    /// More than one MIG device asked for while the operator has not allowed it.
    #[error(
        "{owner} asks for {requested} MIG devices; CUDA uses only one MIG device per process, so \
         more than one is refused unless the agent's operator allows it"
    )]
    TooMany {
        /// Who asked.
        owner: String,
        /// How many were asked for.
        requested: u32,
    },
    /// A kind of MIG device this node does not have at all.
    #[error(
        "{owner} asks for MIG devices of profile {profile}: no such profile on this node \
         (profiles on this node: {known})"
    )]
    NoSuchProfile {
        /// Who asked.
        owner: String,
        /// The kind asked for.
        profile: String,
        /// The kinds the node has, labelled (or `none`).
        known: String,
    },
    /// Fewer free, healthy, isolatable MIG devices of the kind asked for than requested.
    #[error("cannot allocate {requested} MIG devices{} to {owner}: {free} free", profile.as_ref().map_or_else(String::new, |p| format!(" of profile {p}")))]
    NotEnough {
        /// Who asked.
        owner: String,
        /// How many were asked for.
        requested: u32,
        /// The profile asked for (its name), when one was.
        profile: Option<String>,
        /// How many of that kind are free and healthy.
        free: u32,
    },
    /// A MIG device whose capability nodes the driver does not number: it cannot be isolated.
    #[error(
        "MIG device {uuid} cannot be isolated: the driver's /proc files do not number its \
         capability nodes (driver/nvidia-caps/mig-minors, driver/nvidia/capabilities)"
    )]
    NoCaps {
        /// The device.
        uuid: String,
    },
    /// A task holding MIG devices would run with CAP_SYS_ADMIN.
    #[error(
        "{owner} would run with CAP_SYS_ADMIN, which grants every MIG capability whatever its \
         device files; drop the capability, or have the agent's operator allow it"
    )]
    SysAdmin {
        /// Who asked.
        owner: String,
    },
}
