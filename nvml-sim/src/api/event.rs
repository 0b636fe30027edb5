//! Event sets: create, register devices, wait, free.
//!
//! `nvmlEventSetWait_v2` returns at once when an event is pending, else polls the events file
//! every `POLL_INTERVAL` (5 ms) until `timeoutms` has passed and then returns `NVML_ERROR_TIMEOUT`.
//! The global lock is released between polls, so other threads' NVML calls (and the writer
//! appending to the file) proceed while one thread waits. Registering types a GPU does not
//! support is `NOT_SUPPORTED` (`nvml.h`, `nvmlDeviceRegisterEvents`).

use std::ffi::{c_uint, c_ulonglong};
use std::time::{Duration, Instant};

use super::{Out, device_call, guard, system_call};
use crate::abi::{NvmlDevice, NvmlEventData, NvmlEventSet};
use crate::status::{NvmlError, NvmlReturn};

/// How often a waiting call looks at the events file again.
pub(crate) const POLL_INTERVAL: Duration = Duration::from_millis(5);

/// `nvmlEventSetCreate`.
///
/// # Safety
/// `set` is NULL or writable for one `nvmlEventSet_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlEventSetCreate(set: *mut NvmlEventSet) -> NvmlReturn {
    guard(|| {
        // SAFETY: this function's contract.
        let out = unsafe { Out::new(set) };
        out.put(system_call("nvmlEventSetCreate", out.ok(), |sim| {
            Ok(sim.events.create_set())
        })?)
    })
}

/// `nvmlEventSetFree`: a set this instance did not create (or already freed) is
/// `INVALID_ARGUMENT`.
///
/// # Safety
/// `set` must not be used after this call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlEventSetFree(set: NvmlEventSet) -> NvmlReturn {
    guard(|| {
        system_call("nvmlEventSetFree", true, |sim| {
            if sim.events.free_set(set) {
                Ok(())
            } else {
                Err(NvmlError::InvalidArgument)
            }
        })
    })
}

/// `nvmlDeviceGetSupportedEventTypes`: an `nvmlEventType*` bitmask.
///
/// # Safety
/// `event_types` is NULL or writable for one `unsigned long long`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetSupportedEventTypes(
    device: NvmlDevice,
    event_types: *mut c_ulonglong,
) -> NvmlReturn {
    guard(|| {
        // SAFETY: this function's contract.
        let out = unsafe { Out::new(event_types) };
        out.put(device_call(
            "nvmlDeviceGetSupportedEventTypes",
            device,
            out.ok(),
            |sim, i| Ok(sim.node.gpus[i].supported_events()),
        )?)
    })
}

/// `nvmlDeviceRegisterEvents`: adds `event_types` for `device` to `set`. Events that happened
/// before this call are not delivered.
///
/// # Safety
/// None beyond passing handles from this library.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceRegisterEvents(
    device: NvmlDevice,
    event_types: c_ulonglong,
    set: NvmlEventSet,
) -> NvmlReturn {
    guard(|| {
        device_call(
            "nvmlDeviceRegisterEvents",
            device,
            !set.is_null(),
            |sim, i| {
                if event_types & !sim.node.gpus[i].supported_events() != 0 {
                    return Err(NvmlError::NotSupported);
                }
                if sim.events.register(set, i, event_types) {
                    Ok(())
                } else {
                    Err(NvmlError::InvalidArgument)
                }
            },
        )
    })
}

/// `nvmlEventSetWait_v2`: the oldest pending event of `set`, waiting up to `timeoutms`.
///
/// # Safety
/// `data` is NULL or writable for one `nvmlEventData_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlEventSetWait_v2(
    set: NvmlEventSet,
    data: *mut NvmlEventData,
    timeoutms: c_uint,
) -> NvmlReturn {
    guard(|| {
        // SAFETY: this function's contract.
        let out = unsafe { Out::new(data) };
        let deadline = Instant::now() + Duration::from_millis(u64::from(timeoutms));
        loop {
            let taken = system_call("nvmlEventSetWait_v2", out.ok(), |sim| {
                let pending = sim.events.take(set).ok_or(NvmlError::InvalidArgument)?;
                Ok(pending.map(|p| NvmlEventData {
                    device: sim.handle(p.gpu),
                    event_type: p.event_type,
                    event_data: p.data,
                    gpu_instance_id: p.gpu_instance,
                    compute_instance_id: p.compute_instance,
                }))
            })?;
            if let Some(event) = taken {
                return out.put(event);
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(NvmlError::Timeout);
            }
            std::thread::sleep(POLL_INTERVAL.min(deadline - now));
        }
    })
}
