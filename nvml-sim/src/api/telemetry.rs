//! What a GPU is doing: MIG mode, utilisation, temperature, power, processes and ECC counts.
//!
//! Each value is `NOT_SUPPORTED` when the node description leaves it out, as on parts without
//! the feature (MIG before Ampere, ECC on GeForce). The process queries follow `nvml.h`:
//! `*infoCount` is the array's capacity on entry and the number of processes on return; when
//! the array is too small NVML writes the needed count and returns `INSUFFICIENT_SIZE` (so
//! `*infoCount = 0` with `infos = NULL` asks for the count). Processes carry their MIG GPU and
//! compute instance ids, `0xFFFFFFFF` off MIG; a MIG-enabled GPU lists every instance's
//! processes, a MIG device handle its own. A device's list in the runtime state file replaces
//! the description's. Utilisation is `NOT_SUPPORTED` on MIG-enabled GPUs ("On MIG-enabled GPUs,
//! querying device utilization rates is not currently supported", `nvml.h` 7096). ECC
//! counters grow with `ecc-sbe` / `ecc-dbe` lines of the events file.

use std::ffi::{c_uint, c_ulonglong};

use super::{Out, OutArray, any_device_call, device_call, device_pair, guard};
use mesos_gpu_os::error_chain;

use crate::abi::{ID_NOT_AVAILABLE, NvmlDevice, NvmlProcessInfo, NvmlUtilization, enable_state};
use crate::runtime::{self, RuntimeState};
use crate::state::{self, Dev, Sim};
use crate::status::{NvmlError, NvmlReturn};

/// `NVML_TEMPERATURE_GPU`, the only `nvmlTemperatureSensors_t` value.
const TEMPERATURE_GPU: c_uint = 0;

/// `nvmlDeviceGetMigMode`: `NVML_DEVICE_MIG_ENABLE` (1) or `…_DISABLE` (0), now and pending.
///
/// # Safety
/// `current_mode` and `pending_mode` are each NULL or writable for one `unsigned int`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMigMode(
    device: NvmlDevice,
    current_mode: *mut c_uint,
    pending_mode: *mut c_uint,
) -> NvmlReturn {
    // SAFETY: the same contract, forwarded.
    unsafe {
        device_pair(
            "nvmlDeviceGetMigMode",
            device,
            current_mode,
            pending_mode,
            |sim, i| {
                let mig = sim.node.gpus[i]
                    .mig
                    .as_ref()
                    .ok_or(NvmlError::NotSupported)?;
                Ok((c_uint::from(mig.current), c_uint::from(mig.pending)))
            },
        )
    }
}

/// `nvmlDeviceGetUtilizationRates`: percent busy over the last sample period.
///
/// # Safety
/// `utilization` is NULL or writable for one `nvmlUtilization_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetUtilizationRates(
    device: NvmlDevice,
    utilization: *mut NvmlUtilization,
) -> NvmlReturn {
    guard(|| {
        // SAFETY: this function's contract.
        let out = unsafe { Out::new(utilization) };
        let (gpu, memory) = device_call(
            "nvmlDeviceGetUtilizationRates",
            device,
            out.ok(),
            |sim, i| {
                let g = &sim.node.gpus[i];
                if g.mig.as_ref().is_some_and(|m| m.enabled()) {
                    return Err(NvmlError::NotSupported);
                }
                g.utilization.ok_or(NvmlError::NotSupported)
            },
        )?;
        out.put(NvmlUtilization { gpu, memory })
    })
}

/// `nvmlDeviceGetTemperature`: degrees C of `NVML_TEMPERATURE_GPU`; other sensors are
/// `INVALID_ARGUMENT`.
///
/// # Safety
/// `temp` is NULL or writable for one `unsigned int`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetTemperature(
    device: NvmlDevice,
    sensor_type: c_uint,
    temp: *mut c_uint,
) -> NvmlReturn {
    guard(|| {
        // SAFETY: this function's contract.
        let out = unsafe { Out::new(temp) };
        let args_ok = out.ok() && sensor_type == TEMPERATURE_GPU;
        out.put(device_call(
            "nvmlDeviceGetTemperature",
            device,
            args_ok,
            |sim, i| {
                sim.node.gpus[i]
                    .temperature_c
                    .ok_or(NvmlError::NotSupported)
            },
        )?)
    })
}

/// `nvmlDeviceGetPowerUsage`: milliwatts.
///
/// # Safety
/// `power` is NULL or writable for one `unsigned int`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPowerUsage(
    device: NvmlDevice,
    power: *mut c_uint,
) -> NvmlReturn {
    guard(|| {
        // SAFETY: this function's contract.
        let out = unsafe { Out::new(power) };
        out.put(device_call(
            "nvmlDeviceGetPowerUsage",
            device,
            out.ok(),
            |sim, i| sim.node.gpus[i].power_mw.ok_or(NvmlError::NotSupported),
        )?)
    })
}

/// The runtime state, when the node has a state file (a broken file is reported and ignored).
pub(crate) fn runtime_state(sim: &Sim) -> Option<RuntimeState> {
    let path = sim.node.state_file.as_ref()?;
    runtime::read(path)
        .map_err(|e| state::report(&error_chain(&e)))
        .ok()
}

/// The compute processes on a device: a MIG-enabled GPU lists every instance's.
pub(crate) fn process_list(sim: &mut Sim, dev: Dev) -> Result<Vec<NvmlProcessInfo>, NvmlError> {
    let st = runtime_state(sim);
    let from_state = |uuid: &str| {
        st.as_ref()
            .and_then(|s| s.processes.get(uuid))
            .map(|l| l.iter().map(|p| (p.pid, p.used_memory)).collect::<Vec<_>>())
    };
    let gpu = &sim.node.gpus[dev.gpu()];
    let entry = |(pid, used): (u32, u64), gi: u32, ci: u32| NvmlProcessInfo {
        pid,
        used_gpu_memory: used,
        gpu_instance_id: gi,
        compute_instance_id: ci,
    };
    let mig = gpu.mig.as_ref().filter(|m| m.enabled());
    let devices: Vec<usize> = match (dev, mig) {
        (Dev::Mig { dev, .. }, Some(_)) => vec![dev],
        (Dev::Gpu(_), Some(m)) => (0..m.devices.len()).collect(),
        (Dev::Mig { .. }, None) => return Err(NvmlError::NotSupported),
        (Dev::Gpu(_), None) => {
            let list = from_state(&gpu.uuid)
                .or_else(|| gpu.processes.clone())
                .ok_or(NvmlError::NotSupported)?;
            return Ok(list
                .into_iter()
                .map(|p| entry(p, ID_NOT_AVAILABLE, ID_NOT_AVAILABLE))
                .collect());
        }
    };
    let Some(m) = mig else { return Ok(Vec::new()) };
    let mut out = Vec::new();
    for d in devices {
        let (gi, ci) = m.device(d);
        let list = from_state(&ci.uuid).unwrap_or_else(|| ci.processes.clone());
        out.extend(list.into_iter().map(|p| entry(p, gi.id, ci.id)));
    }
    Ok(out)
}

/// The shared body of the `_v2` and `_v3` process queries (same `nvmlProcessInfo_t` layout).
///
/// # Safety
/// `info_count` is NULL or valid for reading and writing one `unsigned int`; `infos` is NULL or
/// writable for `*info_count` `nvmlProcessInfo_t`s.
unsafe fn running_processes(
    function: &str,
    device: NvmlDevice,
    info_count: *mut c_uint,
    infos: *mut NvmlProcessInfo,
) -> NvmlReturn {
    guard(|| {
        // SAFETY: non-null checked first; then valid for reading per this function's contract.
        let capacity = (!info_count.is_null()).then(|| unsafe { info_count.read() });
        // SAFETY: this function's contract.
        let count_out = unsafe { Out::new(info_count) };
        let entries = any_device_call(function, device, capacity.is_some(), process_list)?;
        let capacity = capacity.unwrap_or_default();
        let needed = c_uint::try_from(entries.len()).unwrap_or(c_uint::MAX);
        if needed > capacity {
            count_out.put(needed)?;
            return Err(NvmlError::InsufficientSize);
        }
        // SAFETY: this function's contract: `infos` holds `capacity` entries or is NULL.
        unsafe { OutArray::new(infos, capacity) }.put(&entries)?;
        count_out.put(needed)
    })
}

/// `nvmlDeviceGetComputeRunningProcesses_v3`.
///
/// # Safety
/// `info_count` is NULL or valid for reading and writing one `unsigned int`; `infos` is NULL or
/// writable for `*info_count` `nvmlProcessInfo_t`s.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v3(
    device: NvmlDevice,
    info_count: *mut c_uint,
    infos: *mut NvmlProcessInfo,
) -> NvmlReturn {
    // SAFETY: the same contract, forwarded.
    unsafe {
        running_processes(
            "nvmlDeviceGetComputeRunningProcesses_v3",
            device,
            info_count,
            infos,
        )
    }
}

/// `nvmlDeviceGetComputeRunningProcesses_v2`.
///
/// # Safety
/// `info_count` is NULL or valid for reading and writing one `unsigned int`; `infos` is NULL or
/// writable for `*info_count` `nvmlProcessInfo_v2_t`s.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v2(
    device: NvmlDevice,
    info_count: *mut c_uint,
    infos: *mut NvmlProcessInfo,
) -> NvmlReturn {
    // SAFETY: the same contract, forwarded.
    unsafe {
        running_processes(
            "nvmlDeviceGetComputeRunningProcesses_v2",
            device,
            info_count,
            infos,
        )
    }
}

/// `nvmlDeviceGetEccMode`: enabled now and pending when the GPU has ECC, else `NOT_SUPPORTED`.
///
/// # Safety
/// `current` and `pending` are each NULL or writable for one `nvmlEnableState_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetEccMode(
    device: NvmlDevice,
    current: *mut c_uint,
    pending: *mut c_uint,
) -> NvmlReturn {
    // SAFETY: the same contract, forwarded.
    unsafe {
        device_pair(
            "nvmlDeviceGetEccMode",
            device,
            current,
            pending,
            |sim, i| {
                sim.gpus[i].ecc.ok_or(NvmlError::NotSupported)?;
                Ok((enable_state(true), enable_state(true)))
            },
        )
    }
}

/// `nvmlDeviceGetTotalEccErrors`: `errorType` 0 corrected / 1 uncorrected, `counterType`
/// 0 volatile / 1 aggregate; other values are `INVALID_ARGUMENT`.
///
/// # Safety
/// `ecc_counts` is NULL or writable for one `unsigned long long`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetTotalEccErrors(
    device: NvmlDevice,
    error_type: c_uint,
    counter_type: c_uint,
    ecc_counts: *mut c_ulonglong,
) -> NvmlReturn {
    guard(|| {
        // SAFETY: this function's contract.
        let out = unsafe { Out::new(ecc_counts) };
        let args_ok = out.ok() && error_type < 2 && counter_type < 2;
        out.put(device_call(
            "nvmlDeviceGetTotalEccErrors",
            device,
            args_ok,
            |sim, i| {
                let ecc = sim.gpus[i].ecc.ok_or(NvmlError::NotSupported)?;
                Ok(match (error_type, counter_type) {
                    (0, 0) => ecc.volatile_corrected,
                    (1, 0) => ecc.volatile_uncorrected,
                    (0, _) => ecc.aggregate_corrected,
                    _ => ecc.aggregate_uncorrected,
                })
            },
        )?)
    })
}
