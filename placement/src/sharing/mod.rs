//! Sharing a GPU between tasks: replicas offered as whole `gpus` units.
//!
//! Facts this relies on (`docs/reference/mps.md`):
//! - The Mesos master refuses fractional `gpus` (`src/common/validation.cpp` 325-330), so a
//!   shared GPU is offered as R whole units (R = its replica count): the agent advertises
//!   `gpus` = Σ R over shared GPUs + the whole GPUs, and every `gpus:1` is a 1/R share. This is
//!   NVIDIA's k8s device plugin `replicas` model; Marathon and Metronome work unchanged.
//! - The count check between `gpus` and `--nvidia_gpu_devices` lives only in Mesos's built-in
//!   `gpu/nvidia` allocator (`isolators/gpu/allocator.cpp` 197-228), which this module replaces.
//! - A task asking k units of a shared GPU gets a k/R share of ONE GPU (k ≤ R); a request that
//!   fits no single GPU is refused with the reason, never spread across GPUs.
//! - MPS (`nvidia-cuda-mps-control`) needs Volta (compute capability 7.0) or later for its
//!   per-client limits; `mps` is refused on older GPUs. Each GPU has its own mode
//!   (`time-slicing`, `mps`, or `none` to keep it whole), so exclusive, time-sliced and MPS GPUs
//!   serve side by side; a task picks one with `MESOS_GPU_SHARE_MODE` ([`Wanted`]).
//!
//! Modules: [`plan`] (which GPUs are shared, with which R, parsed from the operator's spec and
//! checked against the inventory), [`offer`] (the agent flags and attributes that advertise the
//! split), [`placement`] (where a share goes: pack onto partly used GPUs first), [`store`] (share
//! reservations in the node's GPU pool, under the pool's transactions), [`mps`] (one MPS control
//! daemon per shared GPU, started, told its limits, supervised and stopped).

pub mod packing;
pub mod plan;

pub use packing::{
    PlacedShare, Placement, PlacementError, SHARE_MODE_ENV, ShareBook, ShareLimits, Wanted,
};
pub use plan::{
    Among, ModeChoice, ModeSpec, SharedGpu, SharingError, SharingMode, SharingPlan, SharingSpec,
    mig_max_clients,
};
