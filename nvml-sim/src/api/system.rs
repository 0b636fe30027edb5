//! Initialisation, error strings and system-wide queries.
//!
//! `nvmlInit_v2` fails with `NVML_ERROR_GPU_NOT_FOUND` ("No supported GPUs were found") on a
//! node without GPUs unless `nvmlInitWithFlags` passed `NVML_INIT_FLAG_NO_GPUS`; a missing or
//! invalid node description is `NVML_ERROR_DRIVER_NOT_LOADED`, as for a host without the
//! kernel driver. The NVML version string is `<CUDA major>.<driver version>`
//! (`12.550.54.14`), as `nvidia-smi -q` shows it.

use std::ffi::{c_char, c_int, c_uint};

use super::{Out, OutStr, guard, system_call};
use crate::state;
use crate::status::{self, NvmlReturn};

/// `nvmlInit_v2`: initialises NVML (reference counted).
///
/// # Safety
/// None beyond NVML's: may be called from any thread.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlInit_v2() -> NvmlReturn {
    guard(|| state::init("nvmlInit_v2", 0))
}

/// `nvmlInitWithFlags`: initialises NVML with `NVML_INIT_FLAG_*` flags (reference counted).
///
/// # Safety
/// None beyond NVML's: may be called from any thread.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlInitWithFlags(flags: c_uint) -> NvmlReturn {
    guard(|| state::init("nvmlInitWithFlags", flags))
}

/// `nvmlShutdown`: drops one initialisation; the last one releases every handle.
///
/// # Safety
/// No handle from this library may be used after the last shutdown.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlShutdown() -> NvmlReturn {
    guard(state::shutdown)
}

/// `nvmlErrorString`: a static description of a return code.
///
/// # Safety
/// None: the returned string is static and must not be freed.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlErrorString(result: NvmlReturn) -> *const c_char {
    status::message(result).as_ptr()
}

/// `nvmlSystemGetDriverVersion`.
///
/// # Safety
/// `version` is NULL or writable for `length` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetDriverVersion(
    version: *mut c_char,
    length: c_uint,
) -> NvmlReturn {
    guard(|| {
        // SAFETY: this function's contract.
        let out = unsafe { OutStr::new(version, length) };
        let text = system_call("nvmlSystemGetDriverVersion", out.ok(), |sim| {
            Ok(sim.node.driver_version.clone())
        })?;
        out.put(&text)
    })
}

/// `nvmlSystemGetNVMLVersion`.
///
/// # Safety
/// `version` is NULL or writable for `length` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetNVMLVersion(
    version: *mut c_char,
    length: c_uint,
) -> NvmlReturn {
    guard(|| {
        // SAFETY: this function's contract.
        let out = unsafe { OutStr::new(version, length) };
        let text = system_call("nvmlSystemGetNVMLVersion", out.ok(), |sim| {
            Ok(format!(
                "{}.{}",
                sim.node.cuda_version / 1000,
                sim.node.driver_version
            ))
        })?;
        out.put(&text)
    })
}

fn cuda_version(function: &str, out: *mut c_int) -> NvmlReturn {
    guard(|| {
        // SAFETY: the exported callers' contract: `out` is NULL or writable for one int.
        let out = unsafe { Out::new(out) };
        let version = system_call(function, out.ok(), |sim| Ok(sim.node.cuda_version))?;
        out.put(version)
    })
}

/// `nvmlSystemGetCudaDriverVersion`: `major * 1000 + minor * 10`.
///
/// # Safety
/// `cuda_driver_version` is NULL or writable for one `int`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion(
    cuda_driver_version: *mut c_int,
) -> NvmlReturn {
    cuda_version("nvmlSystemGetCudaDriverVersion", cuda_driver_version)
}

/// `nvmlSystemGetCudaDriverVersion_v2`: `major * 1000 + minor * 10`.
///
/// # Safety
/// `cuda_driver_version` is NULL or writable for one `int`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion_v2(
    cuda_driver_version: *mut c_int,
) -> NvmlReturn {
    cuda_version("nvmlSystemGetCudaDriverVersion_v2", cuda_driver_version)
}

/// `nvmlDeviceGetCount`, NVML's first version, which Mesos's own NVML code loads
/// (`isolators/gpu/nvml.cpp` 113): NVML's v1 leaves out GPUs the caller may not access, and
/// a simulated caller may access every one, so it answers as `nvmlDeviceGetCount_v2`.
///
/// # Safety
/// `device_count` is NULL or writable for one `unsigned int`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCount(device_count: *mut c_uint) -> NvmlReturn {
    guard(|| {
        // SAFETY: this function's contract.
        let out = unsafe { Out::new(device_count) };
        let count = system_call("nvmlDeviceGetCount", out.ok(), |sim| Ok(sim.gpus.len()))?;
        out.put(c_uint::try_from(count).unwrap_or(c_uint::MAX))
    })
}

/// `nvmlDeviceGetCount_v2`: the number of GPUs, lost ones included.
///
/// # Safety
/// `device_count` is NULL or writable for one `unsigned int`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCount_v2(device_count: *mut c_uint) -> NvmlReturn {
    guard(|| {
        // SAFETY: this function's contract.
        let out = unsafe { Out::new(device_count) };
        let count = system_call("nvmlDeviceGetCount_v2", out.ok(), |sim| Ok(sim.gpus.len()))?;
        out.put(c_uint::try_from(count).unwrap_or(c_uint::MAX))
    })
}
