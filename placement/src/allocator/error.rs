//! [`AllocError`]: every way an allocator call can be refused.
//!
//! Each variant names what was asked and why it cannot be done, so the lifecycle and the Docker
//! bridge can pass the message on unchanged; callers branch on the variant, never on the text.

use super::GpuSet;

/// Why an allocator call was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum AllocError {
    /// Fewer healthy free GPUs than requested.
    #[error(
        "cannot allocate {requested} GPUs to {owner}: {free} free, {unhealthy} unhealthy, {total} in all"
    )]
    NotEnough {
        /// Who asked.
        owner: String,
        /// How many GPUs were asked for.
        requested: u32,
        /// How many were free and healthy.
        free: u32,
        /// How many are unhealthy (allocated or not).
        unhealthy: u32,
        /// How many the allocator manages.
        total: u32,
    },
    /// A `gpus` value that is not a whole number from 0 to the GPUs offered.
    #[error("gpus={got}: expected a whole number from 0 to {max}")]
    BadRequest {
        /// The value as given.
        got: f64,
        /// The number of GPUs offered.
        max: u32,
    },
    /// GPUs given back that the owner does not hold.
    #[error("GPUs {gpus} are not allocated to {owner}")]
    NotAllocated {
        /// Who gave them back.
        owner: String,
        /// The GPUs it does not hold.
        gpus: GpuSet,
    },
    /// A shrink by more GPUs than the owner holds.
    #[error("cannot give back {fewer} GPUs from {owner}: it holds {held}")]
    ShrinkBeyondHeld {
        /// Who shrinks.
        owner: String,
        /// How many GPUs it wanted to give back.
        fewer: u32,
        /// What it holds.
        held: GpuSet,
    },
    /// GPUs asked for by name that another (or the same) owner already holds.
    #[error("GPUs {gpus} are already allocated to {owner}")]
    AlreadyAllocated {
        /// The GPUs already held.
        gpus: GpuSet,
        /// Who holds them.
        owner: String,
    },
    /// A GPU this allocator does not manage.
    #[error("GPU {index} is not managed by this allocator (managed: {managed})")]
    UnknownGpu {
        /// The NVML index given.
        index: u32,
        /// The NVML indices managed.
        managed: GpuSet,
    },
    /// An NVML index that no [`GpuSet`] can hold.
    #[error("GPU index {index} is out of range: expected 0 to 63")]
    IndexOutOfRange {
        /// The NVML index given.
        index: u32,
    },
    /// A GPU in MIG mode offered whole: CUDA sees only its MIG devices.
    #[error(
        "GPU {index} is in MIG mode and cannot be given whole; leave it out of the GPU list (its MIG devices are offered instead) or disable MIG on it (nvidia-smi -i {index} -mig 0, then reset the GPU)"
    )]
    MigEnabled {
        /// The NVML index given.
        index: u32,
    },
    /// The same GPU offered twice.
    #[error("GPU {index} is listed more than once")]
    DuplicateGpu {
        /// The repeated NVML index.
        index: u32,
    },
    /// GPUs asked for by name that are unhealthy.
    #[error("GPUs {gpus} are unhealthy")]
    Unhealthy {
        /// The unhealthy GPUs asked for.
        gpus: GpuSet,
    },
    /// A policy name that is not one of [`Policy::NAMES`](super::Policy::NAMES).
    #[error("unknown allocation policy {got:?}: expected one of first-fit, topology")]
    UnknownPolicy {
        /// The name given.
        got: String,
    },
}
