//! GPU health: which NVML events count (`policy`), what each XID means and how its GPU comes
//! back (`xid`, the XID policy table), the per-GPU state (`state`), evidence-based recovery
//! (`recovery`: the checks; `evidence`: what the driver says; `probe`: the active probe run in a
//! one-GPU cgroup; `gpu_check`: what `mesos-gpu gpu probe` checks), the event loop
//! (`monitor`), the checkpoint and operator requests (`store`), and the glue to the allocator
//! and `watch` (`watch`).
//!
//! GPUs fail far more often than CPUs (XID errors, ECC errors, GPUs falling off the bus);
//! Mesos hands a broken GPU to the next task. Here a failure takes the GPU out of the free pool
//! at once and resolves the owner's `watch` with a limitation naming the GPU and the error.
//!
//! Wiring, for the lifecycle: start one [`HealthMonitor`] per agent with a callback that, under
//! the allocator's lock, calls [`apply_to_allocator`] and resolves the returned
//! [`Limitation`] in a [`Limitations`] registry that `watch(container)` waits on.
#![forbid(unsafe_code)]
#![warn(unreachable_pub, missing_docs)]

mod evidence;
pub mod gpu_check;
mod monitor;
mod policy;
pub mod probe;
mod recovery;
mod state;
mod store;
mod watch;
mod xid;

use std::io;
use std::path::PathBuf;

pub use evidence::read as driver_evidence;
pub use mesos_gpu_node::discovery::RemappedRows;
pub use monitor::{ChangeCallback, HealthMonitor, LoopStats, MonitorConfig};
pub use policy::{HealthPolicy, PolicyError};
pub use probe::{ProbeCgroup, ProbeConfig, ProbeError, ProbeOutcome, ProbeTarget};
pub use recovery::{
    Baseline, Check, DriverEvidence, Episode, Finding, QuietTimes, Reading, RecoveryConfig,
    RecoveryError, RecoveryRecord, parse_duration, recovery_action_words,
};
pub use state::{Failure, GpuHealth, GpuRecord, GpuRef, HealthChange, HealthSnapshot};
pub use store::HealthStore;
pub use watch::{Limitation, Limitations, apply_to_allocator};
pub use xid::{Comeback, EventClass, Remedy, XID_RULES, XidRule, xid_rule};

/// Why a health operation failed.
#[derive(Debug, thiserror::Error)]
pub enum HealthError {
    /// A GPU the node does not have.
    #[error("GPU {gpu} is not on this node (GPUs: {known})")]
    UnknownGpu {
        /// The GPU as given.
        gpu: String,
        /// The node's GPUs, `index uuid` each.
        known: String,
    },
    /// The operator asked to mark healthy a GPU that NVML still reports lost.
    #[error(
        "GPU {gpu} is still lost: NVML answers NVML_ERROR_GPU_IS_LOST; reset it (nvidia-smi -r) \
         or reboot the node, then mark it healthy"
    )]
    StillLost {
        /// The GPU as given.
        gpu: String,
    },
    /// The operator asked to mark healthy a GPU whose driver asks for a reset or reboot.
    #[error(
        "GPU {gpu}: the driver asks for {asks} (NVML's GPU recovery action); do that first \
         (`nvidia-smi -r -i <index>` once no process uses it, or reboot), then mark it healthy"
    )]
    DriverAsks {
        /// The GPU as given.
        gpu: String,
        /// What the driver asks for (`a GPU reset`).
        asks: String,
    },
    /// Text that names no GPU.
    #[error(
        "{got:?} is not a GPU: expected an NVML index such as 3 or a UUID such as GPU-8a2d4c6e-…"
    )]
    BadGpuRef {
        /// The text given.
        got: String,
    },
    /// A file operation on the health store failed.
    #[error(transparent)]
    Io(#[from] mesos_gpu_os::IoError),
    /// The checkpoint is not valid JSON of the expected shape.
    #[error("GPU health checkpoint {path} is damaged; fix or remove it")]
    CheckpointParse {
        /// The checkpoint file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: serde_json::Error,
    },
    /// The checkpoint could not be read or written (another schema version, a failed write).
    #[error(transparent)]
    Checkpoint(#[from] mesos_gpu_os::StoreError),
    /// Another monitor holds the store.
    #[error("another GPU health monitor is running on {path}")]
    InUse {
        /// The checkpoint it guards.
        path: PathBuf,
    },
    /// The lock file could not be opened or locked.
    #[error(transparent)]
    Lock(#[from] mesos_gpu_os::LockError),
    /// A health file could not be replaced.
    #[error(transparent)]
    Write(#[from] mesos_gpu_os::DurableError),
    /// A health directory could not be made, or is refused as others can write it.
    #[error(transparent)]
    Dir(#[from] mesos_gpu_os::FsModeError),
    /// The monitor thread could not be started.
    #[error("cannot start the GPU health thread")]
    Thread {
        /// The cause.
        #[source]
        source: io::Error,
    },
}

impl HealthError {
    /// True when the error names a GPU the node does not have or text that is no GPU.
    pub fn is_unknown_gpu(&self) -> bool {
        matches!(
            self,
            HealthError::UnknownGpu { .. } | HealthError::BadGpuRef { .. }
        )
    }
}
