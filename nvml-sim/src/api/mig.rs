//! MIG: mode and MIG device handles, GPU instance profiles and placements, and the read-only
//! GPU instance / compute instance calls a client uses to name a MIG device's profile.
//!
//! Semantics follow `nvml.h` (12495-13490): `nvmlDeviceGetMaxMigDeviceCount` is 0 with MIG off;
//! MIG device indices are sparse (`NOT_FOUND` for an empty slot, `INVALID_ARGUMENT` from the
//! maximum on); `nvmlDeviceGetGpuInstanceProfileInfo` works with MIG off while the `V` variants,
//! the instance lists and lookups need MIG on (`NOT_SUPPORTED`); profile indices from
//! `NVML_GPU_INSTANCE_PROFILE_COUNT` on are `INVALID_ARGUMENT`, lower ones the GPU lacks are
//! `NOT_SUPPORTED`; placements are listed whatever the mode. Calls the header marks "Requires
//! privileged user" answer `NO_PERMISSION` unless the caller's effective uid is 0. Arrays a
//! client passes for instance lists must hold the profile's `instanceCount` entries, and for
//! placements the count the NULL call returned, as with NVML. Instances cannot be created or
//! destroyed here: the layout is the node description's.

use std::ffi::c_uint;

use super::{Out, OutArray, any_device_call, device_call, fill_chars, guard};
use crate::abi::{
    COMPUTE_INSTANCE_PROFILE_INFO_V2, COMPUTE_INSTANCE_PROFILE_INFO_V3,
    GPU_INSTANCE_PROFILE_INFO_V2, GPU_INSTANCE_PROFILE_INFO_V3, NvmlComputeInstance,
    NvmlComputeInstanceInfo, NvmlComputeInstanceProfileInfo, NvmlComputeInstanceProfileInfoV2,
    NvmlComputeInstanceProfileInfoV3, NvmlDevice, NvmlDeviceAttributes, NvmlGpuInstance,
    NvmlGpuInstanceInfo, NvmlGpuInstanceProfileInfo, NvmlGpuInstanceProfileInfoV2,
    NvmlGpuInstanceProfileInfoV3, NvmlPlacement,
};
use crate::mig::profiles::{
    self, CI_ENGINE_PROFILE_SHARED, CI_PROFILE_COUNT, CiProfile, GI_PROFILE_COUNT, GiProfile,
    ProfileTable,
};
use crate::mig::{ComputeInstance, GpuInstance, Mig};
use crate::state::{self, Dev, Sim};
use crate::status::{NvmlError, NvmlReturn};

/// `NO_PERMISSION` unless the caller runs with effective uid 0, as NVML's privileged calls.
pub(crate) fn privileged() -> Result<(), NvmlError> {
    // SAFETY: geteuid has no preconditions, touches no memory of ours and cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        Ok(())
    } else {
        Err(NvmlError::NoPermission)
    }
}

/// The GPU's MIG layout and profile table, or `NOT_SUPPORTED` for a GPU without MIG.
fn mig_of(sim: &Sim, gpu: usize) -> Result<(&Mig, &'static ProfileTable), NvmlError> {
    let mig = sim.node.gpus[gpu]
        .mig
        .as_ref()
        .ok_or(NvmlError::NotSupported)?;
    let table = mig.table.ok_or(NvmlError::NotSupported)?;
    Ok((mig, table))
}

/// Like [`mig_of`], and `NOT_SUPPORTED` unless MIG mode is on.
fn mig_on(sim: &Sim, gpu: usize) -> Result<(&Mig, &'static ProfileTable), NvmlError> {
    let (mig, table) = mig_of(sim, gpu)?;
    if mig.enabled() {
        Ok((mig, table))
    } else {
        Err(NvmlError::NotSupported)
    }
}

/// The v1 profile info of a GI profile.
fn gi_info(p: &GiProfile) -> NvmlGpuInstanceProfileInfo {
    NvmlGpuInstanceProfileInfo {
        id: p.id,
        is_p2p_supported: 0,
        slice_count: p.slices,
        instance_count: p.instances,
        multiprocessor_count: p.sms,
        copy_engine_count: p.copy_engines,
        decoder_count: p.decoders,
        encoder_count: p.encoders,
        jpeg_count: p.jpegs,
        ofa_count: p.ofas,
        memory_size_mb: p.memory_mib,
    }
}

/// `nvmlDeviceGetMaxMigDeviceCount`: 0 unless MIG is on.
///
/// # Safety
/// `count` is NULL or writable for one `unsigned int`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMaxMigDeviceCount(
    device: NvmlDevice,
    count: *mut c_uint,
) -> NvmlReturn {
    guard(|| {
        // SAFETY: this function's contract.
        let out = unsafe { Out::new(count) };
        out.put(device_call(
            "nvmlDeviceGetMaxMigDeviceCount",
            device,
            out.ok(),
            |sim, i| {
                Ok(match &sim.node.gpus[i].mig {
                    Some(m) if m.enabled() => m.table.map_or(0, |t| t.max_mig_devices),
                    _ => 0,
                })
            },
        )?)
    })
}

/// `nvmlDeviceGetMigDeviceHandleByIndex`: the MIG device at `index` of a MIG-enabled GPU.
///
/// # Safety
/// `mig_device` is NULL or writable for one `nvmlDevice_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMigDeviceHandleByIndex(
    device: NvmlDevice,
    index: c_uint,
    mig_device: *mut NvmlDevice,
) -> NvmlReturn {
    guard(|| {
        // SAFETY: this function's contract.
        let out = unsafe { Out::new(mig_device) };
        let handle = any_device_call(
            "nvmlDeviceGetMigDeviceHandleByIndex",
            device,
            out.ok(),
            |sim, dev| {
                let Dev::Gpu(gpu) = dev else {
                    return Err(NvmlError::InvalidArgument);
                };
                let (mig, table) = mig_on(sim, gpu)?;
                if index >= table.max_mig_devices {
                    return Err(NvmlError::InvalidArgument);
                }
                let d = mig.device_at_index(index).ok_or(NvmlError::NotFound)?;
                Ok(sim.mig_handle(gpu, d))
            },
        )?;
        out.put(handle)
    })
}

/// `nvmlDeviceIsMigDeviceHandle`: 1 for a MIG device handle, 0 for a GPU handle.
///
/// # Safety
/// `is_mig_device` is NULL or writable for one `unsigned int`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceIsMigDeviceHandle(
    device: NvmlDevice,
    is_mig_device: *mut c_uint,
) -> NvmlReturn {
    guard(|| {
        // SAFETY: this function's contract.
        let out = unsafe { Out::new(is_mig_device) };
        out.put(any_device_call(
            "nvmlDeviceIsMigDeviceHandle",
            device,
            out.ok(),
            |_, dev| Ok(c_uint::from(matches!(dev, Dev::Mig { .. }))),
        )?)
    })
}

/// `nvmlDeviceGetDeviceHandleFromMigDeviceHandle`: the parent GPU; a GPU handle is
/// `INVALID_ARGUMENT`.
///
/// # Safety
/// `device` is NULL or writable for one `nvmlDevice_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetDeviceHandleFromMigDeviceHandle(
    mig_device: NvmlDevice,
    device: *mut NvmlDevice,
) -> NvmlReturn {
    guard(|| {
        // SAFETY: this function's contract.
        let out = unsafe { Out::new(device) };
        out.put(any_device_call(
            "nvmlDeviceGetDeviceHandleFromMigDeviceHandle",
            mig_device,
            out.ok(),
            |sim, dev| match dev {
                Dev::Mig { gpu, .. } => Ok(sim.handle(gpu)),
                Dev::Gpu(_) => Err(NvmlError::InvalidArgument),
            },
        )?)
    })
}

/// Runs `query` on a MIG device handle's GI and CI; a GPU handle is `NOT_SUPPORTED`.
fn on_mig_device<T>(
    function: &str,
    device: NvmlDevice,
    args_ok: bool,
    query: impl FnOnce(&Sim, usize, usize) -> T,
) -> Result<T, NvmlError> {
    any_device_call(function, device, args_ok, |sim, dev| match dev {
        Dev::Mig { gpu, dev } => Ok(query(sim, gpu, dev)),
        Dev::Gpu(_) => Err(NvmlError::NotSupported),
    })
}

/// The shared body of the two id queries of a MIG device: `pick` takes the id from its GPU
/// instance and compute instance.
///
/// # Safety
/// `id` is NULL or writable for one `unsigned int`.
unsafe fn mig_instance_id(
    function: &str,
    device: NvmlDevice,
    id: *mut c_uint,
    pick: impl FnOnce(&GpuInstance, &ComputeInstance) -> u32,
) -> NvmlReturn {
    guard(|| {
        // SAFETY: this function's contract.
        let out = unsafe { Out::new(id) };
        out.put(on_mig_device(function, device, out.ok(), |sim, g, d| {
            sim.node.gpus[g].mig.as_ref().map_or(0, |m| {
                let (gi, ci) = m.device(d);
                pick(gi, ci)
            })
        })?)
    })
}

/// `nvmlDeviceGetGpuInstanceId`: the GPU instance id of a MIG device.
///
/// # Safety
/// `id` is NULL or writable for one `unsigned int`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceId(
    device: NvmlDevice,
    id: *mut c_uint,
) -> NvmlReturn {
    // SAFETY: the same contract, forwarded.
    unsafe { mig_instance_id("nvmlDeviceGetGpuInstanceId", device, id, |gi, _| gi.id) }
}

/// `nvmlDeviceGetComputeInstanceId`: the compute instance id of a MIG device.
///
/// # Safety
/// `id` is NULL or writable for one `unsigned int`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetComputeInstanceId(
    device: NvmlDevice,
    id: *mut c_uint,
) -> NvmlReturn {
    // SAFETY: the same contract, forwarded.
    unsafe { mig_instance_id("nvmlDeviceGetComputeInstanceId", device, id, |_, ci| ci.id) }
}

/// `nvmlDeviceGetAttributes_v2`: engine and slice counts of a MIG device (MIG handles only).
///
/// # Safety
/// `attributes` is NULL or writable for one `nvmlDeviceAttributes_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetAttributes_v2(
    device: NvmlDevice,
    attributes: *mut NvmlDeviceAttributes,
) -> NvmlReturn {
    guard(|| {
        // SAFETY: this function's contract.
        let out = unsafe { Out::new(attributes) };
        let attrs = on_mig_device(
            "nvmlDeviceGetAttributes_v2",
            device,
            out.ok(),
            |sim, g, d| {
                sim.node.gpus[g].mig.as_ref().map(|m| {
                    let (gi, ci) = m.device(d);
                    let p = gi.profile;
                    NvmlDeviceAttributes {
                        multiprocessor_count: ci.profile.sms,
                        shared_copy_engine_count: p.copy_engines,
                        shared_decoder_count: p.decoders,
                        shared_encoder_count: p.encoders,
                        shared_jpeg_count: p.jpegs,
                        shared_ofa_count: p.ofas,
                        gpu_instance_slice_count: p.slices,
                        compute_instance_slice_count: ci.profile.slices,
                        memory_size_mb: p.memory_mib,
                    }
                })
            },
        )?;
        out.put(attrs.ok_or(NvmlError::NotSupported)?)
    })
}

/// `nvmlDeviceGetGpuInstanceProfileInfo`: a profile by `NVML_GPU_INSTANCE_PROFILE_*` index,
/// whatever the MIG mode.
///
/// # Safety
/// `info` is NULL or writable for one `nvmlGpuInstanceProfileInfo_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceProfileInfo(
    device: NvmlDevice,
    profile: c_uint,
    info: *mut NvmlGpuInstanceProfileInfo,
) -> NvmlReturn {
    guard(|| {
        // SAFETY: this function's contract.
        let out = unsafe { Out::new(info) };
        let args_ok = out.ok() && profile < GI_PROFILE_COUNT;
        out.put(device_call(
            "nvmlDeviceGetGpuInstanceProfileInfo",
            device,
            args_ok,
            |sim, i| {
                let (_, table) = mig_of(sim, i)?;
                table
                    .by_index(profile)
                    .map(gi_info)
                    .ok_or(NvmlError::NotSupported)
            },
        )?)
    })
}

/// Reads the `version` a caller put in the first field of a versioned struct.
///
/// # Safety
/// `ptr` is NULL or valid for reading a `c_uint` at its start.
unsafe fn version_of<T>(ptr: *mut T) -> Option<c_uint> {
    if ptr.is_null() {
        None
    } else {
        // SAFETY: non-null and, per this function's contract, readable for the leading field.
        Some(unsafe { ptr.cast::<c_uint>().read() })
    }
}

/// Writes a v2 or v3 GI profile info into `info` according to its `version`.
///
/// # Safety
/// `info` is valid for writing the struct its version names (v2 and v3 are the same size).
unsafe fn put_gi_info_v(
    info: *mut NvmlGpuInstanceProfileInfoV2,
    version: c_uint,
    p: &GiProfile,
    total: u64,
) -> Result<(), NvmlError> {
    let v1 = gi_info(p);
    let name = fill_chars(&profiles::gi_profile_name(p, total));
    if version == GPU_INSTANCE_PROFILE_INFO_V3 {
        let v3 = NvmlGpuInstanceProfileInfoV3 {
            version,
            id: v1.id,
            slice_count: v1.slice_count,
            instance_count: v1.instance_count,
            multiprocessor_count: v1.multiprocessor_count,
            copy_engine_count: v1.copy_engine_count,
            decoder_count: v1.decoder_count,
            encoder_count: v1.encoder_count,
            jpeg_count: v1.jpeg_count,
            ofa_count: v1.ofa_count,
            memory_size_mb: v1.memory_size_mb,
            name,
            capabilities: 0,
        };
        // SAFETY: the caller set version 3, promising a v3 struct at `info`.
        unsafe { Out::new(info.cast::<NvmlGpuInstanceProfileInfoV3>()) }.put(v3)
    } else {
        let v2 = NvmlGpuInstanceProfileInfoV2 {
            version,
            id: v1.id,
            is_p2p_supported: v1.is_p2p_supported,
            slice_count: v1.slice_count,
            instance_count: v1.instance_count,
            multiprocessor_count: v1.multiprocessor_count,
            copy_engine_count: v1.copy_engine_count,
            decoder_count: v1.decoder_count,
            encoder_count: v1.encoder_count,
            jpeg_count: v1.jpeg_count,
            ofa_count: v1.ofa_count,
            memory_size_mb: v1.memory_size_mb,
            name,
        };
        // SAFETY: the caller set version 2, promising a v2 struct at `info`.
        unsafe { Out::new(info) }.put(v2)
    }
}

/// The shared body of the two `V` profile queries: `find` picks the profile.
///
/// # Safety
/// `info` is NULL or valid for reading and writing the struct its `version` field names.
unsafe fn profile_info_v(
    function: &str,
    device: NvmlDevice,
    info: *mut NvmlGpuInstanceProfileInfoV2,
    profile_ok: bool,
    find: impl FnOnce(&'static ProfileTable) -> Result<&'static GiProfile, NvmlError>,
) -> NvmlReturn {
    guard(|| {
        // SAFETY: this function's contract.
        let version = unsafe { version_of(info) };
        let args_ok = profile_ok
            && matches!(version, Some(v) if v == GPU_INSTANCE_PROFILE_INFO_V2 || v == GPU_INSTANCE_PROFILE_INFO_V3);
        let (p, total) = device_call(function, device, args_ok, |sim, i| {
            let (_, table) = mig_on(sim, i)?;
            Ok((find(table)?, sim.node.gpus[i].memory.total))
        })?;
        // SAFETY: checked non-null with a v2/v3 version above; this function's contract.
        unsafe { put_gi_info_v(info, version.unwrap_or_default(), p, total) }
    })
}

/// `nvmlDeviceGetGpuInstanceProfileInfoV`: v2/v3 info (with the profile's name) by profile
/// index; MIG must be on.
///
/// # Safety
/// `info` is NULL or valid for reading and writing the struct its `version` field names.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceProfileInfoV(
    device: NvmlDevice,
    profile: c_uint,
    info: *mut NvmlGpuInstanceProfileInfoV2,
) -> NvmlReturn {
    // SAFETY: the same contract, forwarded.
    unsafe {
        profile_info_v(
            "nvmlDeviceGetGpuInstanceProfileInfoV",
            device,
            info,
            profile < GI_PROFILE_COUNT,
            |t| t.by_index(profile).ok_or(NvmlError::NotSupported),
        )
    }
}

/// `nvmlDeviceGetGpuInstanceProfileInfoByIdV`: v2/v3 info by profile id; MIG must be on.
///
/// # Safety
/// `info` is NULL or valid for reading and writing the struct its `version` field names.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceProfileInfoByIdV(
    device: NvmlDevice,
    profile_id: c_uint,
    info: *mut NvmlGpuInstanceProfileInfoV2,
) -> NvmlReturn {
    // SAFETY: the same contract, forwarded.
    unsafe {
        profile_info_v(
            "nvmlDeviceGetGpuInstanceProfileInfoByIdV",
            device,
            info,
            true,
            |t| t.by_id(profile_id).ok_or(NvmlError::NotSupported),
        )
    }
}

/// `nvmlDeviceGetGpuInstancePossiblePlacements_v2`: `{start, size}` in memory slices, whatever
/// the MIG mode; NULL `placements` asks for the count. Privileged.
///
/// # Safety
/// `count` is NULL or writable for one `unsigned int`; `placements` is NULL or writable for as
/// many `nvmlGpuInstancePlacement_t` as the profile has placements.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstancePossiblePlacements_v2(
    device: NvmlDevice,
    profile_id: c_uint,
    placements: *mut NvmlPlacement,
    count: *mut c_uint,
) -> NvmlReturn {
    guard(|| {
        // SAFETY: this function's contract.
        let count_out = unsafe { Out::new(count) };
        let list = device_call(
            "nvmlDeviceGetGpuInstancePossiblePlacements_v2",
            device,
            count_out.ok(),
            |sim, i| {
                privileged()?;
                let (_, table) = mig_of(sim, i)?;
                let p = table.by_id(profile_id).ok_or(NvmlError::NotSupported)?;
                Ok(p.starts
                    .iter()
                    .map(|&start| NvmlPlacement {
                        start,
                        size: p.memory_slices,
                    })
                    .collect::<Vec<_>>())
            },
        )?;
        // SAFETY: this function's contract: room for every placement of the profile.
        unsafe { put_list(&list, placements, &count_out) }
    })
}

/// The memory slices and compute slices the GPU's instances use.
fn used_slices(mig: &Mig) -> (u32, u32) {
    mig.gpu_instances.iter().fold((0, 0), |(mem, compute), gi| {
        let mask = ((1u32 << gi.profile.memory_slices) - 1) << gi.start;
        (mem | mask, compute + gi.profile.slices)
    })
}

/// `nvmlDeviceGetGpuInstanceRemainingCapacity`: how many more instances of a profile fit.
/// Privileged; MIG must be on.
///
/// # Safety
/// `count` is NULL or writable for one `unsigned int`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceRemainingCapacity(
    device: NvmlDevice,
    profile_id: c_uint,
    count: *mut c_uint,
) -> NvmlReturn {
    guard(|| {
        // SAFETY: this function's contract.
        let out = unsafe { Out::new(count) };
        out.put(device_call(
            "nvmlDeviceGetGpuInstanceRemainingCapacity",
            device,
            out.ok(),
            |sim, i| {
                privileged()?;
                let (mig, table) = mig_on(sim, i)?;
                let p = table.by_id(profile_id).ok_or(NvmlError::NotSupported)?;
                let (mem, compute) = used_slices(mig);
                let free_places = p
                    .starts
                    .iter()
                    .filter(|&&s| mem & (((1u32 << p.memory_slices) - 1) << s) == 0)
                    .count();
                let same = mig
                    .gpu_instances
                    .iter()
                    .filter(|g| g.profile.id == p.id)
                    .count();
                let by_count = (p.instances as usize).saturating_sub(same);
                let by_compute = ((table.compute_slices - compute.min(table.compute_slices))
                    / p.slices) as usize;
                Ok(c_uint::try_from(free_places.min(by_count).min(by_compute)).unwrap_or(0))
            },
        )?)
    })
}

/// `nvmlDeviceGetGpuInstances`: the GPU instances of a profile. Privileged; MIG must be on.
///
/// # Safety
/// `count` is NULL or writable for one `unsigned int`; `gpu_instances` is NULL or writable for
/// the profile's `instanceCount` handles.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstances(
    device: NvmlDevice,
    profile_id: c_uint,
    gpu_instances: *mut NvmlGpuInstance,
    count: *mut c_uint,
) -> NvmlReturn {
    guard(|| {
        // SAFETY: this function's contract.
        let count_out = unsafe { Out::new(count) };
        let args_ok = count_out.ok() && !gpu_instances.is_null();
        let list = device_call("nvmlDeviceGetGpuInstances", device, args_ok, |sim, i| {
            privileged()?;
            let (mig, table) = mig_on(sim, i)?;
            let p = table.by_id(profile_id).ok_or(NvmlError::InvalidArgument)?;
            Ok(mig
                .gpu_instances
                .iter()
                .enumerate()
                .filter(|(_, g)| g.profile.id == p.id)
                .map(|(pos, _)| sim.gi_handle(i, pos))
                .collect::<Vec<_>>())
        })?;
        // SAFETY: this function's contract: room for the profile's instance count, which bounds
        // the list.
        unsafe { put_list(&list, gpu_instances, &count_out) }
    })
}

/// `nvmlDeviceGetGpuInstanceById`: a GPU instance by id (`NOT_FOUND` when absent). Privileged;
/// MIG must be on.
///
/// # Safety
/// `gpu_instance` is NULL or writable for one `nvmlGpuInstance_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceById(
    device: NvmlDevice,
    id: c_uint,
    gpu_instance: *mut NvmlGpuInstance,
) -> NvmlReturn {
    guard(|| {
        // SAFETY: this function's contract.
        let out = unsafe { Out::new(gpu_instance) };
        out.put(device_call(
            "nvmlDeviceGetGpuInstanceById",
            device,
            out.ok(),
            |sim, i| {
                privileged()?;
                let (mig, _) = mig_on(sim, i)?;
                let pos = mig.gpu_instance(id).ok_or(NvmlError::NotFound)?;
                Ok(sim.gi_handle(i, pos))
            },
        )?)
    })
}

/// Runs `query` for the GPU or compute instance `resolve` finds (its GPU and its position),
/// after the parent GPU's checks.
fn instance_call<T>(
    function: &str,
    resolve: impl FnOnce(&Sim) -> Result<(usize, usize), NvmlError>,
    args_ok: bool,
    query: impl FnOnce(&Sim, usize, usize) -> Result<T, NvmlError>,
) -> Result<T, NvmlError> {
    let mut reg = state::lock();
    let sim = reg.sim()?;
    sim.poll_events();
    let (gpu, pos) = resolve(sim)?;
    if !args_ok {
        return Err(NvmlError::InvalidArgument);
    }
    sim.usable(gpu, function)?;
    query(sim, gpu, pos)
}

/// Runs `query` for the GPU instance a handle names, after the parent GPU's checks.
fn gi_call<T>(
    function: &str,
    handle: NvmlGpuInstance,
    args_ok: bool,
    query: impl FnOnce(&Sim, usize, usize) -> Result<T, NvmlError>,
) -> Result<T, NvmlError> {
    instance_call(function, |sim| sim.resolve_gi(handle), args_ok, query)
}

/// Writes a list: its length to `count`, and its entries to `array` unless that is NULL.
///
/// # Safety
/// `array` is NULL or writable for `list.len()` entries.
unsafe fn put_list<T: Copy>(
    list: &[T],
    array: *mut T,
    count: &Out<c_uint>,
) -> Result<(), NvmlError> {
    let n = c_uint::try_from(list.len()).unwrap_or(c_uint::MAX);
    if !array.is_null() {
        // SAFETY: this function's contract.
        unsafe { OutArray::new(array, n) }.put(list)?;
    }
    count.put(n)
}

/// `nvmlGpuInstanceGetInfo`: parent, id, profile id and placement of a GPU instance.
///
/// # Safety
/// `info` is NULL or writable for one `nvmlGpuInstanceInfo_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceGetInfo(
    gpu_instance: NvmlGpuInstance,
    info: *mut NvmlGpuInstanceInfo,
) -> NvmlReturn {
    guard(|| {
        // SAFETY: this function's contract.
        let out = unsafe { Out::new(info) };
        out.put(gi_call(
            "nvmlGpuInstanceGetInfo",
            gpu_instance,
            out.ok(),
            |sim, g, pos| {
                let (mig, _) = mig_on(sim, g)?;
                let gi = &mig.gpu_instances[pos];
                Ok(NvmlGpuInstanceInfo {
                    device: sim.handle(g),
                    id: gi.id,
                    profile_id: gi.profile.id,
                    placement: NvmlPlacement {
                        start: gi.start,
                        size: gi.profile.memory_slices,
                    },
                })
            },
        )?)
    })
}

/// The CI profile `profile` of the GPU instance at `pos`, with its GI profile.
fn ci_profile_of(
    sim: &Sim,
    g: usize,
    pos: usize,
    profile: c_uint,
) -> Result<(&'static GiProfile, CiProfile, u64), NvmlError> {
    let (mig, table) = mig_on(sim, g)?;
    let gi = mig.gpu_instances[pos].profile;
    let ci = table
        .ci_profile(gi, profile)
        .ok_or(NvmlError::NotSupported)?;
    Ok((gi, ci, sim.node.gpus[g].memory.total))
}

fn ci_info(gi: &GiProfile, ci: &CiProfile) -> NvmlComputeInstanceProfileInfo {
    NvmlComputeInstanceProfileInfo {
        id: ci.id,
        slice_count: ci.slices,
        instance_count: ci.instances,
        multiprocessor_count: ci.sms,
        shared_copy_engine_count: gi.copy_engines,
        shared_decoder_count: gi.decoders,
        shared_encoder_count: gi.encoders,
        shared_jpeg_count: gi.jpegs,
        shared_ofa_count: gi.ofas,
    }
}

/// `nvmlGpuInstanceGetComputeInstanceProfileInfo`: a CI profile of a GPU instance
/// (`NVML_COMPUTE_INSTANCE_PROFILE_*`, engine profile `SHARED` only).
///
/// # Safety
/// `info` is NULL or writable for one `nvmlComputeInstanceProfileInfo_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceGetComputeInstanceProfileInfo(
    gpu_instance: NvmlGpuInstance,
    profile: c_uint,
    eng_profile: c_uint,
    info: *mut NvmlComputeInstanceProfileInfo,
) -> NvmlReturn {
    guard(|| {
        // SAFETY: this function's contract.
        let out = unsafe { Out::new(info) };
        let args_ok =
            out.ok() && profile < CI_PROFILE_COUNT && eng_profile == CI_ENGINE_PROFILE_SHARED;
        out.put(gi_call(
            "nvmlGpuInstanceGetComputeInstanceProfileInfo",
            gpu_instance,
            args_ok,
            |sim, g, pos| {
                let (gi, ci, _) = ci_profile_of(sim, g, pos, profile)?;
                Ok(ci_info(gi, &ci))
            },
        )?)
    })
}

/// `nvmlGpuInstanceGetComputeInstanceProfileInfoV`: v2/v3 CI profile info with its name.
///
/// # Safety
/// `info` is NULL or valid for reading and writing the struct its `version` field names.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceGetComputeInstanceProfileInfoV(
    gpu_instance: NvmlGpuInstance,
    profile: c_uint,
    eng_profile: c_uint,
    info: *mut NvmlComputeInstanceProfileInfoV2,
) -> NvmlReturn {
    guard(|| {
        // SAFETY: this function's contract.
        let version = unsafe { version_of(info) };
        let v_ok = matches!(version, Some(v) if v == COMPUTE_INSTANCE_PROFILE_INFO_V2 || v == COMPUTE_INSTANCE_PROFILE_INFO_V3);
        let args_ok = v_ok && profile < CI_PROFILE_COUNT && eng_profile == CI_ENGINE_PROFILE_SHARED;
        let (gi, ci, total) = gi_call(
            "nvmlGpuInstanceGetComputeInstanceProfileInfoV",
            gpu_instance,
            args_ok,
            |sim, g, pos| ci_profile_of(sim, g, pos, profile),
        )?;
        let name = fill_chars::<96>(&format!(
            "MIG {}",
            profiles::mig_device_profile_name(gi, &ci, total)
        ));
        let version = version.unwrap_or_default();
        if version == COMPUTE_INSTANCE_PROFILE_INFO_V3 {
            let v3 = NvmlComputeInstanceProfileInfoV3 {
                version,
                info: ci_info(gi, &ci),
                name,
                capabilities: 0,
            };
            // SAFETY: the caller set version 3, promising a v3 struct at `info`.
            unsafe { Out::new(info.cast::<NvmlComputeInstanceProfileInfoV3>()) }.put(v3)
        } else {
            // SAFETY: the caller set version 2, promising a v2 struct at `info`.
            unsafe { Out::new(info) }.put(NvmlComputeInstanceProfileInfoV2 {
                version,
                info: ci_info(gi, &ci),
                name,
            })
        }
    })
}

/// `nvmlGpuInstanceGetComputeInstances`: the compute instances of a CI profile. Privileged.
///
/// # Safety
/// `count` is NULL or writable for one `unsigned int`; `compute_instances` is NULL or writable
/// for the CI profile's `instanceCount` handles.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceGetComputeInstances(
    gpu_instance: NvmlGpuInstance,
    profile_id: c_uint,
    compute_instances: *mut NvmlComputeInstance,
    count: *mut c_uint,
) -> NvmlReturn {
    guard(|| {
        // SAFETY: this function's contract.
        let count_out = unsafe { Out::new(count) };
        let args_ok =
            count_out.ok() && !compute_instances.is_null() && profile_id < CI_PROFILE_COUNT;
        let list = gi_call(
            "nvmlGpuInstanceGetComputeInstances",
            gpu_instance,
            args_ok,
            |sim, g, pos| {
                privileged()?;
                ci_profile_of(sim, g, pos, profile_id)?;
                let (mig, _) = mig_on(sim, g)?;
                Ok((0..mig.devices.len())
                    .filter(|&d| {
                        mig.devices[d].gi == pos && mig.device(d).1.profile.id == profile_id
                    })
                    .map(|d| sim.ci_handle(g, d))
                    .collect::<Vec<_>>())
            },
        )?;
        // SAFETY: this function's contract: room for the profile's instance count, which bounds
        // the list.
        unsafe { put_list(&list, compute_instances, &count_out) }
    })
}

/// `nvmlGpuInstanceGetComputeInstanceById`: a compute instance by id (`NOT_FOUND` when absent).
/// Privileged.
///
/// # Safety
/// `compute_instance` is NULL or writable for one `nvmlComputeInstance_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceGetComputeInstanceById(
    gpu_instance: NvmlGpuInstance,
    id: c_uint,
    compute_instance: *mut NvmlComputeInstance,
) -> NvmlReturn {
    guard(|| {
        // SAFETY: this function's contract.
        let out = unsafe { Out::new(compute_instance) };
        out.put(gi_call(
            "nvmlGpuInstanceGetComputeInstanceById",
            gpu_instance,
            out.ok(),
            |sim, g, pos| {
                privileged()?;
                let (mig, _) = mig_on(sim, g)?;
                let d = (0..mig.devices.len())
                    .find(|&d| mig.devices[d].gi == pos && mig.device(d).1.id == id)
                    .ok_or(NvmlError::NotFound)?;
                Ok(sim.ci_handle(g, d))
            },
        )?)
    })
}

/// `nvmlComputeInstanceGetInfo_v2`: parent GPU and GPU instance, id, profile id, placement.
///
/// # Safety
/// `info` is NULL or writable for one `nvmlComputeInstanceInfo_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlComputeInstanceGetInfo_v2(
    compute_instance: NvmlComputeInstance,
    info: *mut NvmlComputeInstanceInfo,
) -> NvmlReturn {
    guard(|| {
        // SAFETY: this function's contract.
        let out = unsafe { Out::new(info) };
        out.put(instance_call(
            "nvmlComputeInstanceGetInfo_v2",
            |sim| sim.resolve_ci(compute_instance),
            out.ok(),
            |sim, g, d| {
                let (mig, _) = mig_on(sim, g)?;
                let ci = mig.device(d).1;
                Ok(NvmlComputeInstanceInfo {
                    device: sim.handle(g),
                    gpu_instance: sim.gi_handle(g, mig.devices[d].gi),
                    id: ci.id,
                    profile_id: ci.profile.id,
                    placement: NvmlPlacement {
                        start: ci.start,
                        size: ci.profile.slices,
                    },
                })
            },
        )?)
    })
}

/// A MIG device's display name: `<parent name> MIG <profile>`, e.g.
/// `NVIDIA A100-SXM4-40GB MIG 1g.5gb` (as CUDA and `nvidia-smi -L` show it).
pub(crate) fn mig_device_name(sim: &Sim, gpu: usize, dev: usize) -> String {
    let g = &sim.node.gpus[gpu];
    let Some(mig) = &g.mig else {
        return g.name.clone();
    };
    let (gi, ci) = mig.device(dev);
    format!(
        "{} MIG {}",
        g.name,
        profiles::mig_device_profile_name(gi.profile, &ci.profile, g.memory.total)
    )
}
