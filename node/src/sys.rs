//! The NVML calls nvml-wrapper 0.13 has no safe wrapper for: a MIG device's GPU instance id
//! and compute instance id (`nvmlDeviceGetGpuInstanceId`, `nvmlDeviceGetComputeInstanceId`,
//! `nvml.h` 13398 and 13419; `docs/reference/mig.md` §1), an event wait
//! that keeps the MIG instance the event names (nvml-wrapper's `EventData` drops it), and the
//! row remapper's state (`nvmlDeviceGetRemappedRows`, `nvml.h` 8434: Ampere and later,
//! `NOT_SUPPORTED` with MIG enabled).
//!
//! nvml-wrapper loads every symbol at init and keeps each as a `Result`; its raw
//! `NvmlLib::nvmlDevice…` methods `expect` the symbol, so a driver without it would panic. The
//! symbol is therefore taken from the `Result` field and a missing one is
//! [`NvmlError::FailedToLoadSymbol`], as for nvml-wrapper's own calls.
//!
//! [`cuda`] holds the CUDA driver calls of the GPU probe (`libcuda.so.1` loaded at run time).
#![allow(unsafe_code)]

pub mod cuda;

use std::os::raw::c_uint;

use nvml_wrapper::Device;
use nvml_wrapper::Nvml;
use nvml_wrapper::error::{NvmlError, nvml_sym, nvml_try};
use nvml_wrapper::event::EventSet;
use nvml_wrapper::struct_wrappers::event::EventData;
use nvml_wrapper_sys::bindings::nvmlEventData_t;

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

/// The MIG instance an event is attributed to (`nvmlEventData_t`'s `gpuInstanceId` and
/// `computeInstanceId`, `nvml.h` 3243-3255): the GPU instance, and the compute instance when
/// NVML names one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EventInstance {
    /// The GPU instance id.
    pub gpu_instance: u32,
    /// The compute instance id, when NVML names one.
    pub compute_instance: Option<u32>,
}

/// `nvmlEventData_t`'s value for "no instance".
const NO_INSTANCE: c_uint = 0xFFFF_FFFF;

/// `nvmlEventSetWait_v2` on `set`, keeping what nvml-wrapper's `EventSet::wait` drops: the MIG
/// instance the event is attributed to (`None` when NVML attributes it to the whole GPU).
pub fn wait_event<'n>(
    nvml: &'n Nvml,
    set: &EventSet<'n>,
    timeout_ms: u32,
) -> Result<(EventData<'n>, Option<EventInstance>), NvmlError> {
    let sym = nvml_sym(nvml.lib().nvmlEventSetWait_v2.as_ref())?;
    let mut data = nvmlEventData_t {
        device: std::ptr::null_mut(),
        eventType: 0,
        eventData: 0,
        gpuInstanceId: NO_INSTANCE,
        computeInstanceId: NO_INSTANCE,
    };
    // SAFETY: `sym` is the driver's `nvmlReturn_t f(nvmlEventSet_t, nvmlEventData_t *,
    // unsigned int)`, loaded from the library `nvml` was initialised from and kept loaded while
    // `nvml` lives (borrowed for 'n). `set.handle()` is a live event set of that session (the
    // `EventSet` is borrowed, so it is neither freed nor duplicated here), and `&mut data` is a
    // valid, aligned `nvmlEventData_t` the callee fills and does not keep.
    nvml_try(unsafe { sym(set.handle(), &mut data, timeout_ms) })?;
    let instance = (data.gpuInstanceId != NO_INSTANCE).then(|| EventInstance {
        gpu_instance: data.gpuInstanceId,
        compute_instance: (data.computeInstanceId != NO_INSTANCE).then_some(data.computeInstanceId),
    });
    // SAFETY: `data` was filled by a successful `nvmlEventSetWait_v2` of this session, so its
    // `device` is a handle NVML gave for `nvml`, which outlives the returned `EventData<'n>`.
    let event = unsafe { EventData::new(data, nvml) };
    Ok((event, instance))
}

/// `nvmlDeviceGetRemappedRows`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RemappedRows {
    /// Rows remapped for correctable errors.
    pub correctable: u32,
    /// Rows remapped for uncorrectable errors.
    pub uncorrectable: u32,
    /// A remapping waits for the next reset.
    pub pending: bool,
    /// A remapping ever failed.
    pub failure: bool,
}

/// `nvmlDeviceGetRemappedRows`: rows remapped for correctable and uncorrectable errors, whether a
/// remapping is pending (it takes effect at the next reset) and whether one ever failed.
pub fn remapped_rows(nvml: &Nvml, device: &Device<'_>) -> Result<RemappedRows, NvmlError> {
    let sym = nvml_sym(nvml.lib().nvmlDeviceGetRemappedRows.as_ref())?;
    let (mut corr, mut unc, mut pending, mut failure): (c_uint, c_uint, c_uint, c_uint) =
        (0, 0, 0, 0);
    // SAFETY: `sym` is the driver's `nvmlReturn_t f(nvmlDevice_t, unsigned int *, unsigned int *,
    // unsigned int *, unsigned int *)`, loaded by nvml-wrapper from the library `nvml` was
    // initialised from and kept loaded while `nvml` lives (borrowed for this call).
    // `device.handle()` is a handle of that session (`Device<'_>` cannot outlive `Nvml`); the
    // four out-pointers are distinct, aligned locals the callee writes and does not keep.
    nvml_try(unsafe {
        sym(
            device.handle(),
            &mut corr,
            &mut unc,
            &mut pending,
            &mut failure,
        )
    })?;
    Ok(RemappedRows {
        correctable: corr,
        uncorrectable: unc,
        pending: pending != 0,
        failure: failure != 0,
    })
}
