//! What the driver says a GPU needs before it can be trusted again: its recovery action, its
//! row remapper and its pages pending retirement.
//!
//! Facts followed (`nvml.h` of NVML 13 as NVIDIA's go-nvml ships it):
//! - `nvmlDeviceGetFieldValues(device, valuesCount, values)` fills each `nvmlFieldValue_t`
//!   whose `fieldId` the caller set: its own `nvmlReturn` (the value is undefined unless it is
//!   `NVML_SUCCESS`), `valueType`, `value` and `timestamp`. The call itself succeeds when the
//!   device is valid and `values` is not NULL; a field the device does not have answers
//!   `NVML_ERROR_NOT_SUPPORTED` in its own `nvmlReturn`.
//! - `NVML_FI_DEV_GET_GPU_RECOVERY_ACTION` (230) is an unsigned int `nvmlDeviceGpuRecoveryAction_t`:
//!   `NONE` 0, `GPU_RESET` 1, `NODE_REBOOT` 2, `DRAIN_P2P` 3, `DRAIN_AND_RESET` 4,
//!   `RECOVER_IMEX_DOMAIN` 5 (read as `NONE`, unsigned int, on an H200 with driver 580.159.04).
//!   `NVML_FI_DEV_REMAPPED_COR`/`_UNC`/`_PENDING`/`_FAILURE` (142-145) and
//!   `NVML_FI_DEV_RETIRED_PENDING` (31) answer what the two calls below answer.
//! - `nvmlDeviceGetRemappedRows(device, corrRows, uncRows, isPending, failureOccurred)`: Ampere
//!   and later; `NOT_SUPPORTED` with MIG enabled or on older GPUs. "A reset will be required to
//!   actually remap the row"; `failureOccurred` stays set once a remapping failed.
//! - `nvmlDeviceGetRetiredPagesPendingStatus(device, isPending)`: pages waiting for a reboot to
//!   be retired; `NOT_SUPPORTED` where the GPU remaps rows instead (an H200 answers so).
//!
//! The values start as the node description's (`recovery_action`, `remapped_rows`,
//! `retired_pages_pending`) and change with the events file's `recovery-action`,
//! `remap-pending`, `remap-failure`, `retire-pending` and `reset` lines.

use std::ffi::{c_int, c_uint};
use std::time::{SystemTime, UNIX_EPOCH};

use super::{Out, device_call, guard};
use crate::abi::{
    FI_DEV_GET_GPU_RECOVERY_ACTION, FI_DEV_REMAPPED_COR, FI_DEV_REMAPPED_FAILURE,
    FI_DEV_REMAPPED_PENDING, FI_DEV_REMAPPED_UNC, FI_DEV_RETIRED_PENDING, NvmlDevice,
    NvmlFieldValue, NvmlValue, VALUE_TYPE_UNSIGNED_INT, enable_state,
};
use crate::state::{GpuState, Sim};
use crate::status::{NvmlError, NvmlReturn, SUCCESS};

/// The answer to one field of GPU `state`: its value, or why there is none.
fn field(state: &GpuState, mig_on: bool, id: c_uint) -> Result<c_uint, NvmlError> {
    let rows = || {
        state
            .remapped_rows
            .filter(|_| !mig_on)
            .ok_or(NvmlError::NotSupported)
    };
    match id {
        FI_DEV_GET_GPU_RECOVERY_ACTION => state.recovery_action.ok_or(NvmlError::NotSupported),
        FI_DEV_REMAPPED_COR => rows().map(|r| r.correctable),
        FI_DEV_REMAPPED_UNC => rows().map(|r| r.uncorrectable),
        FI_DEV_REMAPPED_PENDING => rows().map(|r| c_uint::from(r.pending)),
        FI_DEV_REMAPPED_FAILURE => rows().map(|r| c_uint::from(r.failure)),
        FI_DEV_RETIRED_PENDING => state
            .retired_pages_pending
            .map(c_uint::from)
            .ok_or(NvmlError::NotSupported),
        _ => Err(NvmlError::NotSupported),
    }
}

fn mig_enabled(sim: &Sim, index: usize) -> bool {
    sim.node.gpus[index]
        .mig
        .as_ref()
        .is_some_and(|m| m.enabled())
}

fn now_usec() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
}

/// `nvmlDeviceGetFieldValues`: the recovery action, remapped-row and retired-page fields;
/// every other field answers `NOT_SUPPORTED` in its own `nvmlReturn`.
///
/// # Safety
/// `values` is NULL or valid for reading and writing `values_count` `nvmlFieldValue_t`s.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetFieldValues(
    device: NvmlDevice,
    values_count: c_int,
    values: *mut NvmlFieldValue,
) -> NvmlReturn {
    guard(|| {
        let count = usize::try_from(values_count).unwrap_or(0);
        let ids: Vec<c_uint> = if values.is_null() {
            Vec::new()
        } else {
            // SAFETY: non-null, and the caller promised `values_count` readable elements.
            (0..count)
                .map(|i| unsafe { (*values.add(i)).field_id })
                .collect()
        };
        let answers = device_call(
            "nvmlDeviceGetFieldValues",
            device,
            !values.is_null(),
            |sim, i| {
                let mig_on = mig_enabled(sim, i);
                Ok(ids
                    .iter()
                    .map(|&id| field(&sim.gpus[i], mig_on, id))
                    .collect::<Vec<_>>())
            },
        )?;
        let timestamp = now_usec();
        for (i, answer) in answers.into_iter().enumerate() {
            // SAFETY: `values` is non-null (`device_call` refused NULL), `i < values_count`,
            // and the caller promised that many writable elements.
            let slot = unsafe { &mut *values.add(i) };
            slot.timestamp = timestamp;
            slot.latency_usec = 0;
            match answer {
                Ok(value) => {
                    slot.value_type = VALUE_TYPE_UNSIGNED_INT;
                    slot.nvml_return = SUCCESS;
                    // The upper bytes zero, as a driver writing `uiVal` into a zeroed union.
                    let mut v = NvmlValue { ull: 0 };
                    v.ui = value;
                    slot.value = v;
                }
                Err(e) => slot.nvml_return = e.code(),
            }
        }
        Ok(())
    })
}

/// `nvmlDeviceGetRemappedRows`.
///
/// # Safety
/// Each pointer is NULL or writable for one `unsigned int`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetRemappedRows(
    device: NvmlDevice,
    corr_rows: *mut c_uint,
    unc_rows: *mut c_uint,
    is_pending: *mut c_uint,
    failure_occurred: *mut c_uint,
) -> NvmlReturn {
    guard(|| {
        // SAFETY: this function's contract.
        let outs = unsafe {
            (
                Out::new(corr_rows),
                Out::new(unc_rows),
                Out::new(is_pending),
                Out::new(failure_occurred),
            )
        };
        let args_ok = outs.0.ok() && outs.1.ok() && outs.2.ok() && outs.3.ok();
        let rows = device_call("nvmlDeviceGetRemappedRows", device, args_ok, |sim, i| {
            if mig_enabled(sim, i) {
                return Err(NvmlError::NotSupported);
            }
            sim.gpus[i].remapped_rows.ok_or(NvmlError::NotSupported)
        })?;
        outs.0.put(rows.correctable)?;
        outs.1.put(rows.uncorrectable)?;
        outs.2.put(c_uint::from(rows.pending))?;
        outs.3.put(c_uint::from(rows.failure))
    })
}

/// `nvmlDeviceGetRetiredPagesPendingStatus`: `NVML_FEATURE_ENABLED` while pages wait.
///
/// # Safety
/// `is_pending` is NULL or writable for one `nvmlEnableState_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetRetiredPagesPendingStatus(
    device: NvmlDevice,
    is_pending: *mut c_uint,
) -> NvmlReturn {
    guard(|| {
        // SAFETY: this function's contract.
        let out = unsafe { Out::new(is_pending) };
        let pending = device_call(
            "nvmlDeviceGetRetiredPagesPendingStatus",
            device,
            out.ok(),
            |sim, i| {
                sim.gpus[i]
                    .retired_pages_pending
                    .ok_or(NvmlError::NotSupported)
            },
        )?;
        out.put(enable_state(pending))
    })
}
