//! The variables a container is given, every name in one place: the devices it holds
//! ([`visible`]), a share's ([`share`]) and an MPS client's ([`mps_client`]).
//!
//! Facts relied on (`docs/reference/mesos-gpu-isolator.md` §6.4, `nvidia-docker.md` §1,
//! `mps.md` §1):
//! - `NVIDIA_VISIBLE_DEVICES` is read by NVIDIA's container toolkit, `CUDA_VISIBLE_DEVICES` by
//!   CUDA; both name devices by UUID (`GPU-…`, `MIG-…`). With no device they are `none` and
//!   empty, overriding an image's `all`;
//! - an MPS client finds its daemon through `CUDA_MPS_PIPE_DIRECTORY` and is limited by
//!   `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` and `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT` (`<ordinal>=<N>M`;
//!   inside the container its one GPU is ordinal 0), set before its CUDA context exists. The
//!   daemon itself is started with the pipe and log directories ([`CUDA_MPS_LOG_DIRECTORY`]).

use std::path::Path;

use mesos_gpu_placement::sharing::{PlacedShare, ShareLimits};

/// The variable the NVIDIA container toolkit reads to choose a container's devices.
pub const NVIDIA_VISIBLE_DEVICES: &str = "NVIDIA_VISIBLE_DEVICES";
/// The variable CUDA reads to choose its devices.
pub const CUDA_VISIBLE_DEVICES: &str = "CUDA_VISIBLE_DEVICES";
/// A share's size, `k/R` units of its GPU.
pub const MESOS_GPU_SHARE: &str = "MESOS_GPU_SHARE";
/// A share's mode, `time-slicing` or `mps`.
pub const MESOS_GPU_SHARING: &str = "MESOS_GPU_SHARING";
/// Where an MPS daemon's socket is, for its clients and the daemon.
pub const CUDA_MPS_PIPE_DIRECTORY: &str = "CUDA_MPS_PIPE_DIRECTORY";
/// Where an MPS control daemon writes its logs.
pub const CUDA_MPS_LOG_DIRECTORY: &str = "CUDA_MPS_LOG_DIRECTORY";
/// An MPS client's share of the GPU's threads, in percent.
pub const CUDA_MPS_ACTIVE_THREAD_PERCENTAGE: &str = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE";
/// An MPS client's device memory limit.
pub const CUDA_MPS_PINNED_DEVICE_MEM_LIMIT: &str = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT";

/// Whether a container is told its grant's variables ([`crate::Grant::env`]): when it holds a
/// device, or its image asks for the driver (an image naming `NVIDIA_VISIBLE_DEVICES` is told
/// `none` when it holds nothing). Every launch renderer asks this: the Mesos launch info and the
/// Docker launch rendered for an image.
pub fn told(holds_devices: bool, image_asks_for_driver: bool) -> bool {
    holds_devices || image_asks_for_driver
}

/// `NVIDIA_VISIBLE_DEVICES` and `CUDA_VISIBLE_DEVICES` naming the devices `uuids` (`none` and
/// empty with none).
pub fn visible(uuids: &[&str]) -> Vec<(String, String)> {
    let list = uuids.join(",");
    let nvidia = if list.is_empty() {
        "none".to_owned()
    } else {
        list.clone()
    };
    vec![
        (NVIDIA_VISIBLE_DEVICES.to_owned(), nvidia),
        (CUDA_VISIBLE_DEVICES.to_owned(), list),
    ]
}

/// What every owner of `share` is told: `MESOS_GPU_SHARE=k/R` and `MESOS_GPU_SHARING=<mode>`.
pub fn share(share: &PlacedShare) -> Vec<(String, String)> {
    vec![
        (
            MESOS_GPU_SHARE.to_owned(),
            format!("{}/{}", share.units, share.replicas),
        ),
        (MESOS_GPU_SHARING.to_owned(), share.mode.to_string()),
    ]
}

/// What an MPS client holding `limits` needs: the daemon's pipe directory `pipe_dir` (mounted at
/// the same path) and its limits.
pub fn mps_client(pipe_dir: &Path, limits: &ShareLimits) -> Vec<(String, String)> {
    vec![
        (
            CUDA_MPS_PIPE_DIRECTORY.to_owned(),
            pipe_dir.display().to_string(),
        ),
        (
            CUDA_MPS_ACTIVE_THREAD_PERCENTAGE.to_owned(),
            limits.active_thread_percentage.to_string(),
        ),
        (
            CUDA_MPS_PINNED_DEVICE_MEM_LIMIT.to_owned(),
            format!("0={}M", limits.pinned_mem_limit_mib),
        ),
    ]
}
