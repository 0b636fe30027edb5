//! Device handles and identity: lookups by index, UUID and PCI bus id; name, serial, PCI info,
//! memory and compute capability.
//!
//! Lookups of a lost GPU fail with `GPU_IS_LOST`, as NVML does for a GPU that fell off the bus
//! (`nvidia-smi` then prints "Unable to determine the device handle for GPU …: GPU is lost").
//! `nvmlDeviceGetHandleByUUID` and `…ByPciBusId_v2` answer `INVALID_ARGUMENT` for text that is
//! not a UUID / bus id and `NOT_FOUND` for one that names no GPU.
//!
//! MIG device handles answer the identity calls NVML documents for them: `nvmlDeviceGetUUID`
//! gives the canonical `MIG-<uuid>` (`nvml.h` 5189), `nvmlDeviceGetIndex` the MIG device index
//! (4839), `nvmlDeviceGetMemoryInfo[_v2]` the instance's memory (6699), `nvmlDeviceGetName`
//! `<parent name> MIG <profile>`; `nvmlDeviceGetHandleByUUID` takes `MIG-<uuid>` and the old
//! `MIG-GPU-<uuid>/<gi>/<ci>` form. The other calls here are for whole GPUs (`NOT_SUPPORTED`).

use std::ffi::{c_char, c_int, c_uint};

use super::{Out, OutStr, any_device_call, device_call, device_pair, fill_chars, guard, in_str};
use crate::abi::{NVML_MEMORY_V2, NvmlDevice, NvmlMemory, NvmlMemoryV2, NvmlPciInfo};
use crate::fields::{self, PciAddr};
use crate::node::Memory;
use crate::state::{self, Dev, Sim};
use crate::status::{NvmlError, NvmlReturn};

/// Finds a GPU with `find`, then applies the lost / injected-failure checks for `function`.
fn lookup(
    function: &str,
    args_ok: bool,
    find: impl FnOnce(&Sim) -> Result<usize, NvmlError>,
) -> Result<NvmlDevice, NvmlError> {
    lookup_any(function, args_ok, |sim| find(sim).map(Dev::Gpu))
}

/// Finds a GPU or MIG device with `find`, then applies its GPU's checks for `function`.
fn lookup_any(
    function: &str,
    args_ok: bool,
    find: impl FnOnce(&Sim) -> Result<Dev, NvmlError>,
) -> Result<NvmlDevice, NvmlError> {
    let mut reg = state::lock();
    let sim = reg.sim()?;
    sim.poll_events();
    if !args_ok {
        return Err(NvmlError::InvalidArgument);
    }
    let dev = find(sim)?;
    sim.usable(dev.gpu(), function)?;
    Ok(sim.dev_handle(dev))
}

/// The MIG device a `MIG-<uuid>` or `MIG-GPU-<uuid>/<gi>/<ci>` names (MIG on only).
fn find_mig(sim: &Sim, uuid: &str) -> Result<Dev, NvmlError> {
    let enabled = |g: &crate::node::Gpu| g.mig.as_ref().filter(|m| m.enabled()).cloned();
    if let Some(rest) = uuid.strip_prefix("MIG-GPU-") {
        let mut parts = rest.split('/');
        let (Some(gpu), Some(gi), Some(ci), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(NvmlError::InvalidArgument);
        };
        let gpu_uuid = format!("GPU-{gpu}");
        let (Ok(gi), Ok(ci), true) = (
            gi.parse::<u32>(),
            ci.parse::<u32>(),
            fields::is_gpu_uuid(&gpu_uuid),
        ) else {
            return Err(NvmlError::InvalidArgument);
        };
        let g = sim
            .node
            .gpus
            .iter()
            .position(|g| g.uuid.eq_ignore_ascii_case(&gpu_uuid))
            .ok_or(NvmlError::NotFound)?;
        let mig = enabled(&sim.node.gpus[g]).ok_or(NvmlError::NotFound)?;
        let dev = mig.device_by_ids(gi, ci).ok_or(NvmlError::NotFound)?;
        return Ok(Dev::Mig { gpu: g, dev });
    }
    if !crate::mig::is_mig_uuid(uuid) {
        return Err(NvmlError::InvalidArgument);
    }
    for (g, gpu) in sim.node.gpus.iter().enumerate() {
        if let Some(m) = enabled(gpu)
            && let Some(dev) =
                (0..m.devices.len()).find(|&d| m.device(d).1.uuid.eq_ignore_ascii_case(uuid))
        {
            return Ok(Dev::Mig { gpu: g, dev });
        }
    }
    Err(NvmlError::NotFound)
}

/// The PCI info NVML reports for an address and ids.
pub(crate) fn pci_info(addr: PciAddr, device_id: u32, subsystem_id: u32) -> NvmlPciInfo {
    NvmlPciInfo {
        bus_id_legacy: fill_chars(&addr.bus_id_legacy()),
        domain: addr.domain,
        bus: addr.bus,
        device: addr.device,
        pci_device_id: device_id,
        pci_sub_system_id: subsystem_id,
        bus_id: fill_chars(&addr.bus_id()),
    }
}

/// `nvmlDeviceGetHandleByIndex`, NVML's first version, which Mesos's own NVML code loads
/// (`isolators/gpu/nvml.cpp` 114): as `nvmlDeviceGetHandleByIndex_v2`, since a simulated caller
/// may access every GPU (v1 skips those it may not).
///
/// # Safety
/// `device` is NULL or writable for one `nvmlDevice_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex(
    index: c_uint,
    device: *mut NvmlDevice,
) -> NvmlReturn {
    // SAFETY: this function's contract is `handle_by_index`'s.
    unsafe { handle_by_index("nvmlDeviceGetHandleByIndex", index, device) }
}

/// `nvmlDeviceGetHandleByIndex_v2`.
///
/// # Safety
/// `device` is NULL or writable for one `nvmlDevice_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex_v2(
    index: c_uint,
    device: *mut NvmlDevice,
) -> NvmlReturn {
    // SAFETY: this function's contract is `handle_by_index`'s.
    unsafe { handle_by_index("nvmlDeviceGetHandleByIndex_v2", index, device) }
}

/// Both versions of `nvmlDeviceGetHandleByIndex`, as `name`.
///
/// # Safety
/// `device` is NULL or writable for one `nvmlDevice_t`.
unsafe fn handle_by_index(
    name: &'static str,
    index: c_uint,
    device: *mut NvmlDevice,
) -> NvmlReturn {
    guard(|| {
        // SAFETY: this function's contract.
        let out = unsafe { Out::new(device) };
        let handle = lookup(name, out.ok(), |sim| {
            let index = index as usize;
            if index < sim.gpus.len() {
                Ok(index)
            } else {
                Err(NvmlError::InvalidArgument)
            }
        })?;
        out.put(handle)
    })
}

/// `nvmlDeviceGetHandleByUUID`.
///
/// # Safety
/// `uuid` is NULL or a NUL-terminated string; `device` is NULL or writable for one handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByUUID(
    uuid: *const c_char,
    device: *mut NvmlDevice,
) -> NvmlReturn {
    guard(|| {
        // SAFETY: this function's contract.
        let (uuid, out) = unsafe { (in_str(uuid), Out::new(device)) };
        let handle = lookup_any(
            "nvmlDeviceGetHandleByUUID",
            out.ok() && uuid.is_some(),
            |sim| {
                let uuid = uuid.unwrap_or_default();
                if uuid.starts_with("MIG-") {
                    return find_mig(sim, uuid);
                }
                if !fields::is_gpu_uuid(uuid) {
                    return Err(NvmlError::InvalidArgument);
                }
                sim.node
                    .gpus
                    .iter()
                    .position(|g| g.uuid.eq_ignore_ascii_case(uuid))
                    .map(Dev::Gpu)
                    .ok_or(NvmlError::NotFound)
            },
        )?;
        out.put(handle)
    })
}

/// `nvmlDeviceGetHandleByPciBusId_v2`.
///
/// # Safety
/// `pci_bus_id` is NULL or a NUL-terminated string; `device` is NULL or writable for one handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByPciBusId_v2(
    pci_bus_id: *const c_char,
    device: *mut NvmlDevice,
) -> NvmlReturn {
    guard(|| {
        // SAFETY: this function's contract.
        let (bus_id, out) = unsafe { (in_str(pci_bus_id), Out::new(device)) };
        let handle = lookup(
            "nvmlDeviceGetHandleByPciBusId_v2",
            out.ok() && bus_id.is_some(),
            |sim| {
                let addr = fields::parse_bus_id(bus_id.unwrap_or_default())
                    .ok_or(NvmlError::InvalidArgument)?;
                sim.node
                    .gpus
                    .iter()
                    .position(|g| g.pci == addr)
                    .ok_or(NvmlError::NotFound)
            },
        )?;
        out.put(handle)
    })
}

/// `nvmlDeviceGetIndex`.
///
/// # Safety
/// `index` is NULL or writable for one `unsigned int`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetIndex(device: NvmlDevice, index: *mut c_uint) -> NvmlReturn {
    guard(|| {
        // SAFETY: this function's contract.
        let out = unsafe { Out::new(index) };
        out.put(any_device_call(
            "nvmlDeviceGetIndex",
            device,
            out.ok(),
            |sim, dev| {
                Ok(match dev {
                    Dev::Gpu(i) => sim.node.gpus[i].index,
                    Dev::Mig { gpu, dev } => sim.node.gpus[gpu]
                        .mig
                        .as_ref()
                        .map_or(0, |m| m.device(dev).1.index),
                })
            },
        )?)
    })
}

/// `nvmlDeviceGetName`.
///
/// # Safety
/// `name` is NULL or writable for `length` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetName(
    device: NvmlDevice,
    name: *mut c_char,
    length: c_uint,
) -> NvmlReturn {
    guard(|| {
        // SAFETY: this function's contract.
        let out = unsafe { OutStr::new(name, length) };
        out.put(&any_device_call(
            "nvmlDeviceGetName",
            device,
            out.ok(),
            |sim, dev| {
                Ok(match dev {
                    Dev::Gpu(i) => sim.node.gpus[i].name.clone(),
                    Dev::Mig { gpu, dev } => super::mig::mig_device_name(sim, gpu, dev),
                })
            },
        )?)
    })
}

/// `nvmlDeviceGetBrand`: an `nvmlBrandType_t`.
///
/// # Safety
/// `brand` is NULL or writable for one `nvmlBrandType_t` (an `unsigned int`-sized enum).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetBrand(device: NvmlDevice, brand: *mut c_uint) -> NvmlReturn {
    guard(|| {
        // SAFETY: this function's contract.
        let out = unsafe { Out::new(brand) };
        out.put(device_call(
            "nvmlDeviceGetBrand",
            device,
            out.ok(),
            |sim, i| Ok(sim.node.gpus[i].brand),
        )?)
    })
}

/// `nvmlDeviceGetSerial`: `NOT_SUPPORTED` when the description gives no serial.
///
/// # Safety
/// `serial` is NULL or writable for `length` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetSerial(
    device: NvmlDevice,
    serial: *mut c_char,
    length: c_uint,
) -> NvmlReturn {
    guard(|| {
        // SAFETY: this function's contract.
        let out = unsafe { OutStr::new(serial, length) };
        out.put(&device_call(
            "nvmlDeviceGetSerial",
            device,
            out.ok(),
            |sim, i| {
                sim.node.gpus[i]
                    .serial
                    .clone()
                    .ok_or(NvmlError::NotSupported)
            },
        )?)
    })
}

/// `nvmlDeviceGetUUID`.
///
/// # Safety
/// `uuid` is NULL or writable for `length` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetUUID(
    device: NvmlDevice,
    uuid: *mut c_char,
    length: c_uint,
) -> NvmlReturn {
    guard(|| {
        // SAFETY: this function's contract.
        let out = unsafe { OutStr::new(uuid, length) };
        out.put(&any_device_call(
            "nvmlDeviceGetUUID",
            device,
            out.ok(),
            |sim, dev| {
                Ok(match dev {
                    Dev::Gpu(i) => sim.node.gpus[i].uuid.clone(),
                    Dev::Mig { gpu, dev } => sim.node.gpus[gpu]
                        .mig
                        .as_ref()
                        .map(|m| m.device(dev).1.uuid.clone())
                        .unwrap_or_default(),
                })
            },
        )?)
    })
}

/// `nvmlDeviceGetMinorNumber`: the `N` of `/dev/nvidiaN`.
///
/// # Safety
/// `minor_number` is NULL or writable for one `unsigned int`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMinorNumber(
    device: NvmlDevice,
    minor_number: *mut c_uint,
) -> NvmlReturn {
    guard(|| {
        // SAFETY: this function's contract.
        let out = unsafe { Out::new(minor_number) };
        out.put(device_call(
            "nvmlDeviceGetMinorNumber",
            device,
            out.ok(),
            |sim, i| Ok(sim.node.gpus[i].minor),
        )?)
    })
}

/// `nvmlDeviceGetPciInfo_v3`.
///
/// # Safety
/// `pci` is NULL or writable for one `nvmlPciInfo_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPciInfo_v3(
    device: NvmlDevice,
    pci: *mut NvmlPciInfo,
) -> NvmlReturn {
    guard(|| {
        // SAFETY: this function's contract.
        let out = unsafe { Out::new(pci) };
        out.put(device_call(
            "nvmlDeviceGetPciInfo_v3",
            device,
            out.ok(),
            |sim, i| {
                let g = &sim.node.gpus[i];
                Ok(pci_info(g.pci, g.pci_device_id, g.pci_subsystem_id))
            },
        )?)
    })
}

/// A device's memory: the GPU's as described; a MIG device's is its GPU instance's
/// (`memorySizeMB` of the profile), used by the processes of that GPU instance.
fn memory_of(sim: &mut Sim, dev: Dev) -> Result<Memory, NvmlError> {
    let Dev::Mig { gpu, dev: d } = dev else {
        return Ok(sim.node.gpus[dev.gpu()].memory);
    };
    let Some(mig) = sim.node.gpus[gpu].mig.clone() else {
        return Err(NvmlError::NotSupported);
    };
    let gi_pos = mig.devices[d].gi;
    let gi = &mig.gpu_instances[gi_pos];
    let total = gi.profile.memory_mib << 20;
    let mut used = 0u64;
    for other in (0..mig.devices.len()).filter(|&o| mig.devices[o].gi == gi_pos) {
        let list = super::telemetry::process_list(sim, Dev::Mig { gpu, dev: other })?;
        used = used.saturating_add(list.iter().map(|p| p.used_gpu_memory).sum::<u64>());
    }
    Ok(Memory {
        total,
        reserved: 0,
        used: used.min(total),
    })
}

/// `nvmlDeviceGetMemoryInfo`: `used` includes what the driver reserves.
///
/// # Safety
/// `memory` is NULL or writable for one `nvmlMemory_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo(
    device: NvmlDevice,
    memory: *mut NvmlMemory,
) -> NvmlReturn {
    guard(|| {
        // SAFETY: this function's contract.
        let out = unsafe { Out::new(memory) };
        out.put(any_device_call(
            "nvmlDeviceGetMemoryInfo",
            device,
            out.ok(),
            |sim, dev| {
                let m = memory_of(sim, dev)?;
                Ok(NvmlMemory {
                    total: m.total,
                    free: m.free(),
                    used: m.used + m.reserved,
                })
            },
        )?)
    })
}

/// `nvmlDeviceGetMemoryInfo_v2`: `version` must be `nvmlMemory_v2`, else
/// `ARGUMENT_VERSION_MISMATCH`.
///
/// # Safety
/// `memory` is NULL or valid for reading and writing one `nvmlMemory_v2_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(
    device: NvmlDevice,
    memory: *mut NvmlMemoryV2,
) -> NvmlReturn {
    guard(|| {
        let version = if memory.is_null() {
            None
        } else {
            // SAFETY: non-null and, per this function's contract, valid for reading the struct,
            // whose first field the caller sets to the struct version.
            Some(unsafe { (&raw const (*memory).version).read() })
        };
        // SAFETY: this function's contract.
        let out = unsafe { Out::new(memory) };
        out.put(any_device_call(
            "nvmlDeviceGetMemoryInfo_v2",
            device,
            out.ok(),
            |sim, dev| {
                if version != Some(NVML_MEMORY_V2) {
                    return Err(NvmlError::ArgumentVersionMismatch);
                }
                let m = memory_of(sim, dev)?;
                Ok(NvmlMemoryV2 {
                    version: NVML_MEMORY_V2,
                    total: m.total,
                    reserved: m.reserved,
                    free: m.free(),
                    used: m.used,
                })
            },
        )?)
    })
}

/// `nvmlDeviceGetCudaComputeCapability`: `NOT_SUPPORTED` when the description gives none.
///
/// # Safety
/// `major` and `minor` are each NULL or writable for one `int`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCudaComputeCapability(
    device: NvmlDevice,
    major: *mut c_int,
    minor: *mut c_int,
) -> NvmlReturn {
    let int = |n: u32| c_int::try_from(n).unwrap_or(c_int::MAX);
    // SAFETY: the same contract, forwarded.
    unsafe {
        device_pair(
            "nvmlDeviceGetCudaComputeCapability",
            device,
            major,
            minor,
            |sim, i| {
                let (ma, mi) = sim.node.gpus[i]
                    .compute_capability
                    .ok_or(NvmlError::NotSupported)?;
                Ok((int(ma), int(mi)))
            },
        )
    }
}
