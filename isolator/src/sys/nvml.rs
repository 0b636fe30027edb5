//! The two NVML calls nvml-wrapper 0.13 has no safe wrapper for: a MIG device's GPU instance id
//! and compute instance id (`nvmlDeviceGetGpuInstanceId`, `nvmlDeviceGetComputeInstanceId`,
//! `nvml.h` 13398 and 13419; `shared/reference/mig_cdi_sharing.md` §1.1).
//!
//! nvml-wrapper loads every symbol at init and keeps each as a `Result`; its raw
//! `NvmlLib::nvmlDevice…` methods `expect` the symbol, so a driver without it would panic. The
//! symbol is therefore taken from the `Result` field and a missing one is
//! [`NvmlError::FailedToLoadSymbol`], as for nvml-wrapper's own calls.
#![allow(unsafe_code)]

use std::os::raw::c_uint;

use nvml_wrapper::Device;
use nvml_wrapper::Nvml;
use nvml_wrapper::error::{NvmlError, nvml_sym, nvml_try};

/// Which id of a MIG device to read.
#[derive(Debug, Clone, Copy)]
pub(crate) enum InstanceId {
    /// `nvmlDeviceGetGpuInstanceId`: unique per GPU.
    Gpu,
    /// `nvmlDeviceGetComputeInstanceId`: unique per GPU instance.
    Compute,
}

/// The GPU or compute instance id of the MIG device `device` (a handle from
/// `nvmlDeviceGetMigDeviceHandleByIndex`); `NotSupported` for a whole-GPU handle.
pub(crate) fn instance_id(
    nvml: &Nvml,
    device: &Device<'_>,
    which: InstanceId,
) -> Result<u32, NvmlError> {
    let lib = nvml.lib();
    let sym = match which {
        InstanceId::Gpu => nvml_sym(lib.nvmlDeviceGetGpuInstanceId.as_ref())?,
        InstanceId::Compute => nvml_sym(lib.nvmlDeviceGetComputeInstanceId.as_ref())?,
    };
    let mut id: c_uint = 0;
    // SAFETY: `sym` is the driver's `nvmlReturn_t f(nvmlDevice_t, unsigned int *)`, loaded by
    // nvml-wrapper from the library `nvml` was initialised from; it stays loaded while `nvml`
    // lives, which the borrow of `nvml` guarantees for this call. `device.handle()` is a handle
    // NVML gave for that same session (`Device<'_>` cannot outlive `Nvml`), and `&mut id` is a
    // valid, aligned `unsigned int` the callee writes once and does not keep.
    nvml_try(unsafe { sym(device.handle(), &mut id) })?;
    Ok(id)
}
