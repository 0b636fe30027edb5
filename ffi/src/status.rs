//! Status codes of the C ABI and the one mapping from Rust errors to them.
//!
//! Numbers are part of the ABI: they are stable and never reused. A code that goes away keeps
//! its number reserved; a new one takes the next free number. Codes that come *in* from C (a
//! status to name, a log level) arrive as `u32` and pass through `TryFrom<u32>`, so an unknown
//! number is an error, never undefined behaviour.

use std::ffi::CStr;

use mesos_gpu_health::HealthError;
use mesos_gpu_isolator::lifecycle::LifecycleError;
use mesos_gpu_placement::allocator::AllocError;

use crate::convert::ConvertError;
use crate::params::ParamError;

/// The result of every fallible `mgpu_` function.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MgpuStatus {
    /// Success.
    MgpuOk = 0,
    /// A value was refused (module parameter, container id, argument out of range); the error
    /// text names it and what is accepted.
    MgpuBadArgument = 1,
    /// A pointer argument that must not be NULL was NULL.
    MgpuNullArgument = 2,
    /// The output buffer is too small: `*len` holds the size needed and nothing else changed;
    /// call again with a buffer of that size.
    MgpuBufferTooSmall = 3,
    /// Input bytes are not the protobuf message the call takes.
    MgpuDecodeError = 4,
    /// The container is not known to the isolator.
    MgpuUnknownContainer = 5,
    /// `prepare` of a container already prepared.
    MgpuAlreadyPrepared = 6,
    /// Not enough free GPUs for the request.
    MgpuNotEnoughGpus = 7,
    /// The request itself was refused (e.g. `gpus` negative, fractional or above the GPUs
    /// offered).
    MgpuBadRequest = 8,
    /// An earlier call panicked: the handle refuses every call but `mgpu_isolator_free`.
    MgpuPoisoned = 9,
    /// The call panicked; the handle is now poisoned.
    MgpuPanic = 10,
    /// A system operation failed (cgroup, checkpoint, NVML, device nodes).
    MgpuInternal = 11,
    /// `mgpu_watch`: no limitation arrived within the timeout.
    MgpuTimedOut = 12,
    /// The call does not apply to this container in its state (update of a nested container,
    /// a Docker container given to a Mesos-containerizer call, recover after use, …).
    MgpuInvalidState = 13,
}

impl MgpuStatus {
    /// Every status, in number order.
    pub(crate) const ALL: [MgpuStatus; 14] = [
        MgpuStatus::MgpuOk,
        MgpuStatus::MgpuBadArgument,
        MgpuStatus::MgpuNullArgument,
        MgpuStatus::MgpuBufferTooSmall,
        MgpuStatus::MgpuDecodeError,
        MgpuStatus::MgpuUnknownContainer,
        MgpuStatus::MgpuAlreadyPrepared,
        MgpuStatus::MgpuNotEnoughGpus,
        MgpuStatus::MgpuBadRequest,
        MgpuStatus::MgpuPoisoned,
        MgpuStatus::MgpuPanic,
        MgpuStatus::MgpuInternal,
        MgpuStatus::MgpuTimedOut,
        MgpuStatus::MgpuInvalidState,
    ];

    /// The C name of the status, e.g. `MGPU_NOT_ENOUGH_GPUS`.
    pub fn name(self) -> &'static CStr {
        match self {
            MgpuStatus::MgpuOk => c"MGPU_OK",
            MgpuStatus::MgpuBadArgument => c"MGPU_BAD_ARGUMENT",
            MgpuStatus::MgpuNullArgument => c"MGPU_NULL_ARGUMENT",
            MgpuStatus::MgpuBufferTooSmall => c"MGPU_BUFFER_TOO_SMALL",
            MgpuStatus::MgpuDecodeError => c"MGPU_DECODE_ERROR",
            MgpuStatus::MgpuUnknownContainer => c"MGPU_UNKNOWN_CONTAINER",
            MgpuStatus::MgpuAlreadyPrepared => c"MGPU_ALREADY_PREPARED",
            MgpuStatus::MgpuNotEnoughGpus => c"MGPU_NOT_ENOUGH_GPUS",
            MgpuStatus::MgpuBadRequest => c"MGPU_BAD_REQUEST",
            MgpuStatus::MgpuPoisoned => c"MGPU_POISONED",
            MgpuStatus::MgpuPanic => c"MGPU_PANIC",
            MgpuStatus::MgpuInternal => c"MGPU_INTERNAL",
            MgpuStatus::MgpuTimedOut => c"MGPU_TIMED_OUT",
            MgpuStatus::MgpuInvalidState => c"MGPU_INVALID_STATE",
        }
    }
}

/// A status number that is not one of [`MgpuStatus`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("status code {got}: expected 0 to {max}")]
pub struct UnknownStatus {
    /// The number given.
    pub got: u32,
    /// The highest known number.
    pub max: u32,
}

impl TryFrom<u32> for MgpuStatus {
    type Error = UnknownStatus;

    fn try_from(code: u32) -> Result<MgpuStatus, UnknownStatus> {
        let max = MgpuStatus::ALL.len() - 1;
        usize::try_from(code)
            .ok()
            .and_then(|i| MgpuStatus::ALL.get(i).copied())
            .ok_or(UnknownStatus {
                got: code,
                max: u32::try_from(max).unwrap_or(u32::MAX),
            })
    }
}

/// Why a C ABI call failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum FfiError {
    /// A `mig-…` resource this agent does not offer.
    #[error(
        "container {container} asks for {name}, which this agent does not offer (MIG profiles offered: {known})"
    )]
    MigResource {
        /// The container.
        container: String,
        /// The resource's name.
        name: String,
        /// The `mig-…` resources offered.
        known: String,
    },
    /// A `mig-…` resource that is not a whole number.
    #[error("container {container}: {name}:{got} is not a whole number of MIG devices")]
    MigCount {
        /// The container.
        container: String,
        /// The resource's name.
        name: String,
        /// The value.
        got: f64,
    },
    /// The Docker hook's container is not named `mesos-<container id>`.
    #[error("Docker container name '{name}' is not mesos-<container id>")]
    HookContainerName {
        /// The name given.
        name: String,
    },
    /// The Docker hook's `docker_args` command line is empty.
    #[error(
        "the docker_args command line is empty; give e.g. '/usr/bin/mesos-gpu docker-args --pool-dir /var/lib/mesos-gpu'"
    )]
    HookCommand,
    /// A pointer argument was NULL.
    #[error("argument `{what}` is NULL")]
    Null {
        /// The argument's name.
        what: &'static str,
    },
    /// Input bytes did not decode.
    #[error("cannot decode `{what}` ({len} bytes) as {message}")]
    Decode {
        /// The argument's name.
        what: &'static str,
        /// The protobuf message expected.
        message: &'static str,
        /// How many bytes were given.
        len: usize,
        /// prost's reason.
        #[source]
        source: prost::DecodeError,
    },
    /// Input bytes decoded but lack proto2 `required` fields, which libprotobuf refuses.
    #[error(
        "cannot decode `{what}` ({len} bytes) as {message}: missing required fields: {missing}"
    )]
    MissingRequired {
        /// The argument's name.
        what: &'static str,
        /// The protobuf message expected.
        message: &'static str,
        /// How many bytes were given.
        len: usize,
        /// The missing fields' paths, as libprotobuf lists them.
        missing: String,
    },
    /// The metrics could not be encoded.
    #[error("cannot encode the GPU metrics")]
    Metrics,
    /// The containers' view could not be encoded as JSON.
    #[error("cannot encode the containers' GPU usage as JSON")]
    Containers {
        /// The cause.
        #[source]
        source: serde_json::Error,
    },
    /// The caller's output buffer is too small.
    #[error("the output buffer holds {cap} bytes; {needed} are needed")]
    BufferTooSmall {
        /// The size needed.
        needed: usize,
        /// The buffer's capacity.
        cap: usize,
    },
    /// A decoded message does not fit the isolator's types.
    #[error(transparent)]
    Convert(#[from] ConvertError),
    /// A module parameter was refused, or set-up failed.
    #[error(transparent)]
    Params(#[from] ParamError),
    /// The isolator refused or failed.
    #[error(transparent)]
    Lifecycle(#[from] LifecycleError),
    /// A key `mgpu_agent_resources` does not take.
    #[error(
        "unknown agent flag {key:?}: expected one of resources, nvidia_gpu_devices, attributes"
    )]
    UnknownFlag {
        /// The key given.
        key: String,
    },
    /// The agent flags are refused.
    #[error("cannot describe the agent's GPUs")]
    AgentFlags {
        /// Why.
        #[source]
        source: mesos_gpu_isolator::agent_flags::AgentFlagsError,
    },
    /// `prepare` retried after `MGPU_BUFFER_TOO_SMALL` with other input.
    #[error(
        "{call} of container {container} was retried with a different request; retry a call that \
         answered MGPU_BUFFER_TOO_SMALL with the same bytes"
    )]
    RetryMismatch {
        /// The call.
        call: &'static str,
        /// The container.
        container: String,
    },
    /// `mgpu_watch` found no limitation in time.
    #[error("no limitation for container {container} within {timeout_ms} ms")]
    TimedOut {
        /// The container.
        container: String,
        /// The timeout given.
        timeout_ms: u64,
    },
    /// A status or level number from C that is not known.
    #[error(transparent)]
    UnknownCode(#[from] UnknownStatus),
    /// A log level number from C that is not known.
    #[error("log level {got}: expected 0 (error) to 4 (trace)")]
    UnknownLevel {
        /// The number given.
        got: u32,
    },
    /// A string argument that is not UTF-8.
    #[error("argument `{what}` is not UTF-8: {got:?}")]
    NotUtf8 {
        /// The argument's name.
        what: &'static str,
        /// The value given, invalid bytes replaced by U+FFFD.
        got: String,
    },
    /// `mgpu_gpu_mark_healthy` named no GPU.
    #[error("argument `gpu`")]
    GpuRef {
        /// Why (names the value and the accepted forms).
        #[source]
        source: HealthError,
    },
    /// A process id that is not a positive number.
    #[error("pid {got}: expected a positive process id")]
    BadPid {
        /// The pid given.
        got: i32,
    },
    /// The handle panicked earlier.
    #[error(
        "the isolator handle is poisoned: an earlier call panicked; free it and create a new one"
    )]
    Poisoned,
}

impl FfiError {
    /// The status code of this error: the one mapping from Rust errors to C status codes.
    pub(crate) fn status(&self) -> MgpuStatus {
        match self {
            FfiError::Null { .. } => MgpuStatus::MgpuNullArgument,
            FfiError::Decode { .. } | FfiError::MissingRequired { .. } => {
                MgpuStatus::MgpuDecodeError
            }
            FfiError::BufferTooSmall { .. } => MgpuStatus::MgpuBufferTooSmall,
            FfiError::Convert(_)
            | FfiError::UnknownCode(_)
            | FfiError::UnknownLevel { .. }
            | FfiError::BadPid { .. }
            | FfiError::NotUtf8 { .. }
            | FfiError::GpuRef { .. }
            | FfiError::UnknownFlag { .. }
            | FfiError::RetryMismatch { .. } => MgpuStatus::MgpuBadArgument,
            FfiError::Params(e) if e.is_bad_value() => MgpuStatus::MgpuBadArgument,
            FfiError::Params(_) | FfiError::Metrics | FfiError::Containers { .. } => {
                MgpuStatus::MgpuInternal
            }
            FfiError::Lifecycle(e) => lifecycle_status(e),
            FfiError::AgentFlags { .. }
            | FfiError::MigResource { .. }
            | FfiError::MigCount { .. }
            | FfiError::HookContainerName { .. }
            | FfiError::HookCommand => MgpuStatus::MgpuBadRequest,
            FfiError::TimedOut { .. } => MgpuStatus::MgpuTimedOut,
            FfiError::Poisoned => MgpuStatus::MgpuPoisoned,
        }
    }
}

fn lifecycle_status(e: &LifecycleError) -> MgpuStatus {
    if e.is_unknown_container() {
        return MgpuStatus::MgpuUnknownContainer;
    }
    if e.is_already_prepared() {
        return MgpuStatus::MgpuAlreadyPrepared;
    }
    if e.is_not_enough() {
        return MgpuStatus::MgpuNotEnoughGpus;
    }
    if e.is_bad_request() {
        return MgpuStatus::MgpuBadRequest;
    }
    if e.is_unknown_gpu() {
        return MgpuStatus::MgpuBadArgument;
    }
    match e {
        LifecycleError::Poisoned => MgpuStatus::MgpuPoisoned,
        LifecycleError::UnknownParent { .. } => MgpuStatus::MgpuUnknownContainer,
        LifecycleError::Nested { .. }
        | LifecycleError::WrongContainerizer { .. }
        | LifecycleError::NoCgroup { .. }
        | LifecycleError::RecoverAfterUse
        | LifecycleError::NoHealthMonitor { .. }
        | LifecycleError::HealthAttached
        | LifecycleError::NoMesosCgroup { .. }
        | LifecycleError::MesosCgroupAllowsAll { .. }
        | LifecycleError::ForeignDeviceProgram { .. }
        | LifecycleError::Blind { .. } => MgpuStatus::MgpuInvalidState,
        LifecycleError::UnknownCgroupChoice { .. } | LifecycleError::UnknownCgroupMaker { .. } => {
            MgpuStatus::MgpuBadArgument
        }
        LifecycleError::Allocation {
            source: AllocError::AlreadyAllocated { .. },
            ..
        } => MgpuStatus::MgpuInvalidState,
        _ => MgpuStatus::MgpuInternal,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_stable_and_dense() {
        for (i, status) in MgpuStatus::ALL.iter().enumerate() {
            assert_eq!(*status as usize, i, "{status:?}");
            assert_eq!(
                MgpuStatus::try_from(u32::try_from(i).unwrap_or(u32::MAX)),
                Ok(*status)
            );
        }
        assert_eq!(MgpuStatus::MgpuOk as u32, 0);
        assert_eq!(MgpuStatus::MgpuInvalidState as u32, 13);
    }

    #[test]
    fn unknown_numbers_are_refused() {
        let err = MgpuStatus::try_from(14).expect_err("14 is no status");
        assert_eq!(err.to_string(), "status code 14: expected 0 to 13");
        assert!(MgpuStatus::try_from(u32::MAX).is_err());
    }

    #[test]
    fn names_match_the_header_spelling() {
        assert_eq!(
            MgpuStatus::MgpuNotEnoughGpus.name(),
            c"MGPU_NOT_ENOUGH_GPUS"
        );
        for status in MgpuStatus::ALL {
            let name = status.name().to_str().unwrap_or("");
            assert!(name.starts_with("MGPU_"), "{name}");
        }
    }
}
