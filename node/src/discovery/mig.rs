//! MIG discovery: which GPUs are in MIG mode and the MIG devices they hold.
//!
//! Facts relied on (`docs/reference/mig.md` §1-3, `nvml.h`):
//! - `nvmlDeviceGetMigMode` gives current and pending mode; `NOT_SUPPORTED` means the GPU is not
//!   MIG-capable. Only the *current* mode matters until the GPU is reset.
//! - `nvmlDeviceGetMaxMigDeviceCount` bounds the index loop of
//!   `nvmlDeviceGetMigDeviceHandleByIndex`, whose indices are sparse: an empty slot answers
//!   `NOT_FOUND` (go-nvlib also skips `INVALID_ARGUMENT`).
//! - On a MIG handle: `nvmlDeviceGetUUID` is the canonical `MIG-<uuid>`, `…GetName` is
//!   `<GPU name> MIG <profile>`, `…GetMemoryInfo` the GPU instance's memory,
//!   `nvmlDeviceGetAttributes_v2` its SMs, engines and slices, and
//!   `nvmlDeviceGetGpuInstanceId`/`…ComputeInstanceId` its ids (raw calls: nvml-wrapper 0.13 has
//!   no safe form, see [`crate::sys`]).
//! - The GPU instance profile id (19, 15, 14, 9, 5, 0, 20 …) is the one
//!   `nvmlDeviceGetGpuInstanceProfileInfo(parent, NVML_GPU_INSTANCE_PROFILE_*)` returns in
//!   `info.id`; go-nvlib finds it through the privileged GPU-instance handle. Here it is the
//!   profile whose slices, memory and media engines equal the device's attributes, which needs
//!   no privilege; on the profile tables of A100 and H100 exactly one profile matches.

use nvml_wrapper::error::NvmlError;
use nvml_wrapper::struct_wrappers::device::{DeviceAttributes, ProfileInfo};
use nvml_wrapper::{Device, Nvml};

use super::caps::CapsTable;
use super::{DiscoveryError, NvmlFailure, is_unsupported};
use crate::{inventory::Gpu, inventory::MigDevice};
use crate::{sys::InstanceId, sys::instance_id};

/// `NVML_DEVICE_MIG_ENABLE`.
const MIG_ENABLE: u32 = 1;

/// `NVML_GPU_INSTANCE_PROFILE_COUNT`: profile indices are 0 to this, exclusive (`nvml.h` 12550).
const GPU_INSTANCE_PROFILE_COUNT: u32 = 0x12;

/// What [`read_gpu`] found on one GPU.
pub(crate) struct GpuMig {
    /// The GPU's current MIG mode is on.
    pub(crate) enabled: bool,
    /// Its MIG devices, by MIG index.
    pub(crate) devices: Vec<MigDevice>,
}

/// Reads the MIG mode and MIG devices of `gpu` (whose handle is `device`).
pub(crate) fn read_gpu(
    nvml: &Nvml,
    gpu: &Gpu,
    device: &Device<'_>,
    caps: &CapsTable,
) -> Result<GpuMig, DiscoveryError> {
    let off = GpuMig {
        enabled: false,
        devices: Vec::new(),
    };
    let mode = match device.mig_mode() {
        Ok(mode) => mode,
        Err(err) if is_unsupported(&err) => return Ok(off),
        Err(source) => return Err(mig_error(gpu.index, None, "MIG mode", source)),
    };
    if mode.current != MIG_ENABLE {
        if mode.pending == MIG_ENABLE {
            tracing::warn!(
                index = gpu.index,
                "MIG mode is pending: the GPU is used whole until it is reset"
            );
        }
        return Ok(off);
    }
    if mode.pending != MIG_ENABLE {
        tracing::warn!(
            index = gpu.index,
            "MIG mode is on until the GPU is reset; its MIG devices are used until then"
        );
    }
    let max = device
        .mig_device_count()
        .map_err(|source| mig_error(gpu.index, None, "MIG device count", source))?;
    let profiles = profile_infos(device);
    let mut devices = Vec::new();
    for index in 0..max {
        let mig = match device.mig_device_by_index(index) {
            Ok(mig) => mig,
            Err(NvmlError::NotFound | NvmlError::InvalidArg) => continue,
            Err(source) => return Err(mig_error(gpu.index, Some(index), "handle", source)),
        };
        devices.push(read_device(nvml, gpu, index, &mig, &profiles, caps)?);
    }
    if devices.is_empty() {
        tracing::warn!(
            index = gpu.index,
            "MIG mode is on but the GPU has no MIG device: nothing of it can be allocated"
        );
    }
    Ok(GpuMig {
        enabled: true,
        devices,
    })
}

fn read_device(
    nvml: &Nvml,
    gpu: &Gpu,
    index: u32,
    mig: &Device<'_>,
    profiles: &[ProfileInfo],
    caps: &CapsTable,
) -> Result<MigDevice, DiscoveryError> {
    let err = |what, source| mig_error(gpu.index, Some(index), what, source);
    let uuid = mig.uuid().map_err(|s| err("UUID", s))?;
    let gpu_instance =
        instance_id(nvml, mig, InstanceId::Gpu).map_err(|s| err("GPU instance id", s))?;
    let compute_instance =
        instance_id(nvml, mig, InstanceId::Compute).map_err(|s| err("compute instance id", s))?;
    let attributes = mig.attributes().map_err(|s| err("attributes", s))?;
    let memory_total = match mig.memory_info() {
        Ok(m) => m.total,
        Err(_) => attributes.memory_size_mb.saturating_mul(1 << 20),
    };
    let profile_name = mig
        .name()
        .ok()
        .and_then(|name| name.rsplit_once(" MIG ").map(|(_, p)| p.to_owned()))
        .unwrap_or_default();
    let profile = profile_of(&attributes, profiles);
    if profile.is_none() {
        tracing::warn!(parent = gpu.index, %uuid, profile = %profile_name, "no GPU instance profile matches this MIG device; it is offered by name only");
    }
    let caps = caps
        .instance(gpu.minor, gpu_instance, compute_instance)
        .map_err(|source| DiscoveryError::MigCaps {
            uuid: uuid.clone(),
            source,
        })?;
    if caps.is_none() {
        tracing::warn!(parent = gpu.index, %uuid, gpu_instance, compute_instance, "the driver's /proc files do not number this MIG device's capabilities; it cannot be isolated");
    }
    let device = MigDevice {
        parent: gpu.index,
        parent_minor: gpu.minor,
        index,
        uuid,
        gpu_instance,
        compute_instance,
        profile,
        profile_name,
        memory_total,
        multiprocessors: attributes.multiprocessor_count,
        gpu_instance_slices: attributes.gpu_instance_slice_count,
        compute_instance_slices: attributes.compute_instance_slice_count,
        caps,
        healthy: gpu.healthy,
    };
    tracing::debug!(?device, "read MIG device");
    Ok(device)
}

/// The GPU instance profiles the parent offers (`NVML_GPU_INSTANCE_PROFILE_*` 0 to COUNT,
/// skipping the ones it answers `INVALID_ARGUMENT`/`NOT_SUPPORTED` for).
fn profile_infos(device: &Device<'_>) -> Vec<ProfileInfo> {
    (0..GPU_INSTANCE_PROFILE_COUNT)
        .filter_map(|p| device.profile_info(p).ok())
        .collect()
}

/// The id of the one profile whose slices, memory and media engines are the device's.
fn profile_of(attributes: &DeviceAttributes, profiles: &[ProfileInfo]) -> Option<u32> {
    let mut matching = profiles.iter().filter(|p| {
        p.slice_count == attributes.gpu_instance_slice_count
            && p.memory_size_mb == attributes.memory_size_mb
            && p.decoder_count == attributes.shared_decoder_count
            && p.encoder_count == attributes.shared_encoder_count
            && p.jpeg_count == attributes.shared_jpeg_count
            && p.ofa_count == attributes.shared_ofa_count
    });
    let first = matching.next()?;
    matching.next().is_none().then_some(first.id)
}

fn mig_error(
    index: u32,
    mig_index: Option<u32>,
    what: &'static str,
    source: NvmlError,
) -> DiscoveryError {
    DiscoveryError::Mig {
        index,
        mig_index,
        what,
        source: NvmlFailure(source),
    }
}
