//! Compute mode: `nvmlDeviceGetComputeMode` / `nvmlDeviceSetComputeMode`.
//!
//! NVML facts (`nvml.h` 997-1006, 6778-6800, 8780-8809): modes are `DEFAULT` (0),
//! `EXCLUSIVE_THREAD` (1, "Support Removed": setting it is `NOT_SUPPORTED`), `PROHIBITED` (2) and
//! `EXCLUSIVE_PROCESS` (3); values from `NVML_COMPUTEMODE_COUNT` on are `INVALID_ARGUMENT`.
//! Setting "requires root/admin permissions" (`NO_PERMISSION` otherwise), takes effect
//! immediately and is lost when the driver reloads. "If MIG is enabled on a GPU, device must be
//! MIG device handle": the parent then answers `NOT_SUPPORTED`, and each MIG device has its own
//! mode. A mode set through one process is seen by every other (it is driver state): with a
//! `state_file` the sim keeps it there (see [`crate::runtime`]), else in this process only.

use std::ffi::c_uint;

use super::mig::privileged;
use super::{Out, any_device_call, guard};
use mesos_gpu_os::error_chain;

use crate::abi::{COMPUTEMODE_COUNT, COMPUTEMODE_EXCLUSIVE_THREAD, NvmlDevice};
use crate::runtime;
use crate::state::{self, Dev, Sim};
use crate::status::{NvmlError, NvmlReturn};

/// The UUID of a GPU or MIG device, after refusing a MIG-enabled parent.
fn mode_key(sim: &Sim, dev: Dev) -> Result<String, NvmlError> {
    let gpu = &sim.node.gpus[dev.gpu()];
    match dev {
        Dev::Gpu(_) if gpu.mig.as_ref().is_some_and(|m| m.enabled()) => {
            Err(NvmlError::NotSupported)
        }
        Dev::Gpu(_) => Ok(gpu.uuid.clone()),
        Dev::Mig { dev, .. } => Ok(gpu
            .mig
            .as_ref()
            .map(|m| m.device(dev).1.uuid.clone())
            .unwrap_or_default()),
    }
}

/// The current mode of a device: the state file's, else this process's, else the description's.
fn current_mode(sim: &Sim, dev: Dev, key: &str) -> Result<u32, NvmlError> {
    let described = match dev {
        Dev::Gpu(g) => sim.node.gpus[g].compute_mode,
        Dev::Mig { .. } => 0,
    };
    match &sim.node.state_file {
        Some(path) => {
            let st = runtime::read(path).map_err(|e| {
                state::report(&error_chain(&e));
                NvmlError::Unknown
            })?;
            match st.compute_modes.get(key) {
                Some(name) => runtime::mode_value(name).ok_or_else(|| {
                    state::report(&format!(
                        "runtime state file {}: compute mode {name:?} of {key} is not default, prohibited or exclusive_process",
                        path.display()
                    ));
                    NvmlError::Unknown
                }),
                None => Ok(described),
            }
        }
        None => Ok(sim.compute_modes.get(key).copied().unwrap_or(described)),
    }
}

/// `nvmlDeviceGetComputeMode`: an `nvmlComputeMode_t`.
///
/// # Safety
/// `mode` is NULL or writable for one `nvmlComputeMode_t` (`unsigned int`-sized).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetComputeMode(
    device: NvmlDevice,
    mode: *mut c_uint,
) -> NvmlReturn {
    guard(|| {
        // SAFETY: this function's contract.
        let out = unsafe { Out::new(mode) };
        out.put(any_device_call(
            "nvmlDeviceGetComputeMode",
            device,
            out.ok(),
            |sim, dev| {
                let key = mode_key(sim, dev)?;
                current_mode(sim, dev, &key)
            },
        )?)
    })
}

/// `nvmlDeviceSetComputeMode`: root only; `EXCLUSIVE_THREAD` is no longer supported.
///
/// # Safety
/// None beyond passing a handle from this library.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceSetComputeMode(device: NvmlDevice, mode: c_uint) -> NvmlReturn {
    guard(|| {
        any_device_call(
            "nvmlDeviceSetComputeMode",
            device,
            mode < COMPUTEMODE_COUNT,
            |sim, dev| {
                privileged()?;
                let key = mode_key(sim, dev)?;
                if mode == COMPUTEMODE_EXCLUSIVE_THREAD {
                    return Err(NvmlError::NotSupported);
                }
                let name = runtime::mode_name(mode).ok_or(NvmlError::InvalidArgument)?;
                match &sim.node.state_file {
                    Some(path) => runtime::update(path, |s| {
                        s.compute_modes.insert(key, name.to_owned());
                    })
                    .map_err(|e| {
                        state::report(&error_chain(&e));
                        NvmlError::Unknown
                    }),
                    None => {
                        sim.compute_modes.insert(key, mode);
                        Ok(())
                    }
                }
            },
        )
    })
}
