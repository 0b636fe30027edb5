//! The C types of NVML's ABI that the exported functions read and write.
//!
//! Layouts follow NVIDIA's `nvml.h` (API version 12/13, as bindgen renders it in
//! `nvml-wrapper-sys` 0.10 `bindings.rs`); the tests at the bottom compare size and field offsets
//! against those bindings. Handles are opaque pointers: the sim never dereferences one it is
//! given, it only compares its address with the handles it issued.

use std::ffi::{c_char, c_uint, c_ulonglong};

/// `struct nvmlDevice_st`: opaque.
#[repr(C)]
pub struct NvmlDeviceSt {
    _opaque: [u8; 0],
}

/// `nvmlDevice_t`.
pub type NvmlDevice = *mut NvmlDeviceSt;

/// `struct nvmlEventSet_st`: opaque.
#[repr(C)]
pub struct NvmlEventSetSt {
    _opaque: [u8; 0],
}

/// `nvmlEventSet_t`.
pub type NvmlEventSet = *mut NvmlEventSetSt;

/// `struct nvmlGpuInstance_st`: opaque.
#[repr(C)]
pub struct NvmlGpuInstanceSt {
    _opaque: [u8; 0],
}

/// `nvmlGpuInstance_t`.
pub type NvmlGpuInstance = *mut NvmlGpuInstanceSt;

/// `struct nvmlComputeInstance_st`: opaque.
#[repr(C)]
pub struct NvmlComputeInstanceSt {
    _opaque: [u8; 0],
}

/// `nvmlComputeInstance_t`.
pub type NvmlComputeInstance = *mut NvmlComputeInstanceSt;

/// `nvmlPciInfo_t` (the v3 layout with `busIdLegacy` first).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct NvmlPciInfo {
    /// `"%04X:%02X:%02X.0"`, NUL-terminated.
    pub bus_id_legacy: [c_char; 16],
    /// PCI domain.
    pub domain: c_uint,
    /// PCI bus.
    pub bus: c_uint,
    /// PCI device.
    pub device: c_uint,
    /// `device id << 16 | vendor id`.
    pub pci_device_id: c_uint,
    /// `subsystem id << 16 | subsystem vendor id`.
    pub pci_sub_system_id: c_uint,
    /// `"%08X:%02X:%02X.0"`, NUL-terminated.
    pub bus_id: [c_char; 32],
}

/// `nvmlMemory_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct NvmlMemory {
    /// Total installed framebuffer memory in bytes.
    pub total: c_ulonglong,
    /// Unallocated memory in bytes.
    pub free: c_ulonglong,
    /// Allocated memory in bytes (including what the driver reserves).
    pub used: c_ulonglong,
}

/// `nvmlMemory_v2_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct NvmlMemoryV2 {
    /// Must be [`NVML_MEMORY_V2`].
    pub version: c_uint,
    /// Total memory in bytes.
    pub total: c_ulonglong,
    /// Memory the driver and firmware reserve, in bytes.
    pub reserved: c_ulonglong,
    /// Unallocated memory in bytes.
    pub free: c_ulonglong,
    /// Allocated memory in bytes (not counting `reserved`).
    pub used: c_ulonglong,
}

/// `nvmlMemory_v2` = `NVML_STRUCT_VERSION(Memory, 2)` = `sizeof(nvmlMemory_v2_t) | 2 << 24`.
#[allow(clippy::cast_possible_truncation)] // the struct is 40 bytes
pub const NVML_MEMORY_V2: c_uint = (size_of::<NvmlMemoryV2>() as c_uint) | (2 << 24);

/// `nvmlUtilization_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct NvmlUtilization {
    /// Percent of time a kernel ran over the last sample period.
    pub gpu: c_uint,
    /// Percent of time device memory was read or written.
    pub memory: c_uint,
}

/// `nvmlProcessInfo_t` = `nvmlProcessInfo_v2_t` (used by the `_v2` and `_v3` process queries).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct NvmlProcessInfo {
    /// Process id.
    pub pid: c_uint,
    /// Bytes of framebuffer the process uses.
    pub used_gpu_memory: c_ulonglong,
    /// MIG GPU instance, `0xFFFFFFFF` when MIG is off.
    pub gpu_instance_id: c_uint,
    /// MIG compute instance, `0xFFFFFFFF` when MIG is off.
    pub compute_instance_id: c_uint,
}

/// `nvmlEventData_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct NvmlEventData {
    /// The device the event happened on.
    pub device: NvmlDevice,
    /// One `nvmlEventType*` bit.
    pub event_type: c_ulonglong,
    /// The XID for `nvmlEventTypeXidCriticalError`, else 0.
    pub event_data: c_ulonglong,
    /// MIG GPU instance, `0xFFFFFFFF` when not applicable.
    pub gpu_instance_id: c_uint,
    /// MIG compute instance, `0xFFFFFFFF` when not applicable.
    pub compute_instance_id: c_uint,
}

/// `nvmlDeviceAttributes_t` (MIG device handles only).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct NvmlDeviceAttributes {
    /// SMs of the compute instance.
    pub multiprocessor_count: c_uint,
    /// Copy engines of the GPU instance, shared by its compute instances.
    pub shared_copy_engine_count: c_uint,
    /// Decoders of the GPU instance.
    pub shared_decoder_count: c_uint,
    /// Encoders of the GPU instance.
    pub shared_encoder_count: c_uint,
    /// JPEG engines of the GPU instance.
    pub shared_jpeg_count: c_uint,
    /// OFA engines of the GPU instance.
    pub shared_ofa_count: c_uint,
    /// Compute slices of the GPU instance.
    pub gpu_instance_slice_count: c_uint,
    /// Compute slices of the compute instance.
    pub compute_instance_slice_count: c_uint,
    /// Memory of the GPU instance in MiB.
    pub memory_size_mb: c_ulonglong,
}

/// `nvmlGpuInstancePlacement_t` / `nvmlComputeInstancePlacement_t`: slices `[start, start+size)`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NvmlPlacement {
    /// First slice.
    pub start: c_uint,
    /// Number of slices.
    pub size: c_uint,
}

/// `nvmlGpuInstanceProfileInfo_t` (v1, unversioned).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct NvmlGpuInstanceProfileInfo {
    /// Profile id.
    pub id: c_uint,
    /// Peer-to-peer support (0 on every profile the sim knows).
    pub is_p2p_supported: c_uint,
    /// Compute slices.
    pub slice_count: c_uint,
    /// Instances of this profile that fit the GPU.
    pub instance_count: c_uint,
    /// SMs.
    pub multiprocessor_count: c_uint,
    /// Copy engines.
    pub copy_engine_count: c_uint,
    /// Decoders.
    pub decoder_count: c_uint,
    /// Encoders.
    pub encoder_count: c_uint,
    /// JPEG engines.
    pub jpeg_count: c_uint,
    /// OFA engines.
    pub ofa_count: c_uint,
    /// Memory in MiB.
    pub memory_size_mb: c_ulonglong,
}

/// `nvmlGpuInstanceProfileInfo_v2_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct NvmlGpuInstanceProfileInfoV2 {
    /// `nvmlGpuInstanceProfileInfo_v2`.
    pub version: c_uint,
    /// The v1 fields.
    pub id: c_uint,
    /// See [`NvmlGpuInstanceProfileInfo`].
    pub is_p2p_supported: c_uint,
    /// See [`NvmlGpuInstanceProfileInfo`].
    pub slice_count: c_uint,
    /// See [`NvmlGpuInstanceProfileInfo`].
    pub instance_count: c_uint,
    /// See [`NvmlGpuInstanceProfileInfo`].
    pub multiprocessor_count: c_uint,
    /// See [`NvmlGpuInstanceProfileInfo`].
    pub copy_engine_count: c_uint,
    /// See [`NvmlGpuInstanceProfileInfo`].
    pub decoder_count: c_uint,
    /// See [`NvmlGpuInstanceProfileInfo`].
    pub encoder_count: c_uint,
    /// See [`NvmlGpuInstanceProfileInfo`].
    pub jpeg_count: c_uint,
    /// See [`NvmlGpuInstanceProfileInfo`].
    pub ofa_count: c_uint,
    /// See [`NvmlGpuInstanceProfileInfo`].
    pub memory_size_mb: c_ulonglong,
    /// `MIG 1g.5gb`.
    pub name: [c_char; 96],
}

/// `nvmlGpuInstanceProfileInfo_v3_t`: v2 without `isP2pSupported`, plus `capabilities`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct NvmlGpuInstanceProfileInfoV3 {
    /// `nvmlGpuInstanceProfileInfo_v3`.
    pub version: c_uint,
    /// See [`NvmlGpuInstanceProfileInfo`].
    pub id: c_uint,
    /// See [`NvmlGpuInstanceProfileInfo`].
    pub slice_count: c_uint,
    /// See [`NvmlGpuInstanceProfileInfo`].
    pub instance_count: c_uint,
    /// See [`NvmlGpuInstanceProfileInfo`].
    pub multiprocessor_count: c_uint,
    /// See [`NvmlGpuInstanceProfileInfo`].
    pub copy_engine_count: c_uint,
    /// See [`NvmlGpuInstanceProfileInfo`].
    pub decoder_count: c_uint,
    /// See [`NvmlGpuInstanceProfileInfo`].
    pub encoder_count: c_uint,
    /// See [`NvmlGpuInstanceProfileInfo`].
    pub jpeg_count: c_uint,
    /// See [`NvmlGpuInstanceProfileInfo`].
    pub ofa_count: c_uint,
    /// See [`NvmlGpuInstanceProfileInfo`].
    pub memory_size_mb: c_ulonglong,
    /// `MIG 1g.5gb`.
    pub name: [c_char; 96],
    /// `NVML_GPU_INSTANCE_PROFILE_CAPS_*` (0: no P2P, no graphics).
    pub capabilities: c_uint,
}

/// `nvmlGpuInstanceInfo_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct NvmlGpuInstanceInfo {
    /// Parent GPU.
    pub device: NvmlDevice,
    /// GPU instance id.
    pub id: c_uint,
    /// GPU instance profile id.
    pub profile_id: c_uint,
    /// Memory slices.
    pub placement: NvmlPlacement,
}

/// `nvmlComputeInstanceProfileInfo_t` (v1).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct NvmlComputeInstanceProfileInfo {
    /// Profile id (`NVML_COMPUTE_INSTANCE_PROFILE_*`).
    pub id: c_uint,
    /// Compute slices.
    pub slice_count: c_uint,
    /// Instances that fit the GPU instance.
    pub instance_count: c_uint,
    /// SMs.
    pub multiprocessor_count: c_uint,
    /// The GPU instance's copy engines.
    pub shared_copy_engine_count: c_uint,
    /// The GPU instance's decoders.
    pub shared_decoder_count: c_uint,
    /// The GPU instance's encoders.
    pub shared_encoder_count: c_uint,
    /// The GPU instance's JPEG engines.
    pub shared_jpeg_count: c_uint,
    /// The GPU instance's OFA engines.
    pub shared_ofa_count: c_uint,
}

/// `nvmlComputeInstanceProfileInfo_v2_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct NvmlComputeInstanceProfileInfoV2 {
    /// `nvmlComputeInstanceProfileInfo_v2`.
    pub version: c_uint,
    /// The v1 fields.
    pub info: NvmlComputeInstanceProfileInfo,
    /// `MIG 1c.7g.40gb`.
    pub name: [c_char; 96],
}

/// `nvmlComputeInstanceProfileInfo_v3_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct NvmlComputeInstanceProfileInfoV3 {
    /// `nvmlComputeInstanceProfileInfo_v3`.
    pub version: c_uint,
    /// The v1 fields.
    pub info: NvmlComputeInstanceProfileInfo,
    /// `MIG 1c.7g.40gb`.
    pub name: [c_char; 96],
    /// `NVML_COMPUTE_INSTANCE_PROFILE_CAPS_*` (0).
    pub capabilities: c_uint,
}

/// `nvmlComputeInstanceInfo_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct NvmlComputeInstanceInfo {
    /// Parent GPU.
    pub device: NvmlDevice,
    /// Parent GPU instance.
    pub gpu_instance: NvmlGpuInstance,
    /// Compute instance id.
    pub id: c_uint,
    /// Compute instance profile id.
    pub profile_id: c_uint,
    /// Compute slices within the GPU instance.
    pub placement: NvmlPlacement,
}

/// `NVML_STRUCT_VERSION(name, ver)`: `sizeof(struct) | ver << 24`.
#[allow(clippy::cast_possible_truncation)] // every versioned struct here is under 2^24 bytes
const fn struct_version(size: usize, version: c_uint) -> c_uint {
    (size as c_uint) | (version << 24)
}

/// `nvmlGpuInstanceProfileInfo_v2`.
pub const GPU_INSTANCE_PROFILE_INFO_V2: c_uint =
    struct_version(size_of::<NvmlGpuInstanceProfileInfoV2>(), 2);
/// `nvmlGpuInstanceProfileInfo_v3`.
pub const GPU_INSTANCE_PROFILE_INFO_V3: c_uint =
    struct_version(size_of::<NvmlGpuInstanceProfileInfoV3>(), 3);
/// `nvmlComputeInstanceProfileInfo_v2`.
pub const COMPUTE_INSTANCE_PROFILE_INFO_V2: c_uint =
    struct_version(size_of::<NvmlComputeInstanceProfileInfoV2>(), 2);
/// `nvmlComputeInstanceProfileInfo_v3`.
pub const COMPUTE_INSTANCE_PROFILE_INFO_V3: c_uint =
    struct_version(size_of::<NvmlComputeInstanceProfileInfoV3>(), 3);

/// `NVML_DEVICE_MIG_ENABLE`.
pub const DEVICE_MIG_ENABLE: c_uint = 1;

/// `NVML_COMPUTEMODE_COUNT`: compute modes are below it.
pub const COMPUTEMODE_COUNT: c_uint = 4;
/// `NVML_COMPUTEMODE_EXCLUSIVE_THREAD`: "Support Removed".
pub const COMPUTEMODE_EXCLUSIVE_THREAD: c_uint = 1;

/// `NVML_AFFINITY_SCOPE_NODE`.
pub const AFFINITY_SCOPE_NODE: c_uint = 0;
/// `NVML_AFFINITY_SCOPE_SOCKET`.
pub const AFFINITY_SCOPE_SOCKET: c_uint = 1;

/// `NVML_VALUE_NOT_AVAILABLE` as an unsigned id (MIG instance ids when MIG is off).
pub const ID_NOT_AVAILABLE: c_uint = 0xFFFF_FFFF;

/// `nvmlEventTypeSingleBitEccError`.
pub const EVENT_SINGLE_BIT_ECC: u64 = 0x1;
/// `nvmlEventTypeDoubleBitEccError`.
pub const EVENT_DOUBLE_BIT_ECC: u64 = 0x2;
/// `nvmlEventTypePState`.
pub const EVENT_PSTATE: u64 = 0x4;
/// `nvmlEventTypeXidCriticalError`.
pub const EVENT_XID: u64 = 0x8;
/// `nvmlEventTypeClock`.
pub const EVENT_CLOCK: u64 = 0x10;

/// `nvmlValue_t`: the value of one field, read as the member `valueType` names.
#[repr(C)]
#[derive(Clone, Copy)]
pub union NvmlValue {
    /// `dVal`.
    pub d: f64,
    /// `uiVal` (`NVML_VALUE_TYPE_UNSIGNED_INT`).
    pub ui: c_uint,
    /// `ullVal` (`NVML_VALUE_TYPE_UNSIGNED_LONG_LONG`).
    pub ull: c_ulonglong,
}

/// `nvmlFieldValue_t`: one field asked for (`fieldId`, `scopeId` set by the caller) and its
/// answer (`timestamp`, `latencyUsec`, `valueType`, `nvmlReturn`, `value`).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct NvmlFieldValue {
    /// `NVML_FI_*`.
    pub field_id: c_uint,
    /// Link or other scope of the field; unused by the fields served here.
    pub scope_id: c_uint,
    /// CPU time of the value, microseconds since 1970.
    pub timestamp: i64,
    /// How long the value took to read, microseconds.
    pub latency_usec: i64,
    /// `nvmlValueType_t` of `value`.
    pub value_type: c_uint,
    /// This field's own status; `value` is undefined unless it is `NVML_SUCCESS`.
    pub nvml_return: c_uint,
    /// The value.
    pub value: NvmlValue,
}

/// `NVML_VALUE_TYPE_UNSIGNED_INT`.
pub const VALUE_TYPE_UNSIGNED_INT: c_uint = 1;
/// `NVML_FI_DEV_RETIRED_PENDING`: pages are pending retirement, 1 or 0.
pub const FI_DEV_RETIRED_PENDING: c_uint = 31;
/// `NVML_FI_DEV_REMAPPED_COR`: rows remapped for correctable errors.
pub const FI_DEV_REMAPPED_COR: c_uint = 142;
/// `NVML_FI_DEV_REMAPPED_UNC`: rows remapped for uncorrectable errors.
pub const FI_DEV_REMAPPED_UNC: c_uint = 143;
/// `NVML_FI_DEV_REMAPPED_PENDING`: rows are pending remapping, 1 or 0.
pub const FI_DEV_REMAPPED_PENDING: c_uint = 144;
/// `NVML_FI_DEV_REMAPPED_FAILURE`: a remapping failed, 1 or 0.
pub const FI_DEV_REMAPPED_FAILURE: c_uint = 145;
/// `NVML_FI_DEV_GET_GPU_RECOVERY_ACTION`: an `nvmlDeviceGpuRecoveryAction_t`.
pub const FI_DEV_GET_GPU_RECOVERY_ACTION: c_uint = 230;

/// `NVML_NVLINK_MAX_LINKS`.
pub const NVLINK_MAX_LINKS: c_uint = 18;

/// `NVML_INIT_FLAG_NO_GPUS`: do not fail init when no GPUs are found.
pub const INIT_FLAG_NO_GPUS: c_uint = 1;

/// `NVML_FEATURE_DISABLED` / `NVML_FEATURE_ENABLED` (`nvmlEnableState_t`).
pub const fn enable_state(on: bool) -> c_uint {
    on as c_uint
}

#[cfg(test)]
mod tests {
    use std::mem::{offset_of, size_of};

    use nvml_wrapper_sys::bindings as b;

    use super::*;

    #[test]
    fn layouts_match_nvml_h() {
        assert_eq!(size_of::<NvmlPciInfo>(), size_of::<b::nvmlPciInfo_t>());
        assert_eq!(
            offset_of!(NvmlPciInfo, domain),
            offset_of!(b::nvmlPciInfo_t, domain)
        );
        assert_eq!(
            offset_of!(NvmlPciInfo, pci_sub_system_id),
            offset_of!(b::nvmlPciInfo_t, pciSubSystemId)
        );
        assert_eq!(
            offset_of!(NvmlPciInfo, bus_id),
            offset_of!(b::nvmlPciInfo_t, busId)
        );

        assert_eq!(size_of::<NvmlMemory>(), size_of::<b::nvmlMemory_t>());
        assert_eq!(
            offset_of!(NvmlMemory, free),
            offset_of!(b::nvmlMemory_t, free)
        );
        assert_eq!(
            offset_of!(NvmlMemory, used),
            offset_of!(b::nvmlMemory_t, used)
        );

        assert_eq!(size_of::<NvmlMemoryV2>(), size_of::<b::nvmlMemory_v2_t>());
        assert_eq!(
            offset_of!(NvmlMemoryV2, total),
            offset_of!(b::nvmlMemory_v2_t, total)
        );
        assert_eq!(
            offset_of!(NvmlMemoryV2, reserved),
            offset_of!(b::nvmlMemory_v2_t, reserved)
        );
        assert_eq!(
            offset_of!(NvmlMemoryV2, used),
            offset_of!(b::nvmlMemory_v2_t, used)
        );
        assert_eq!(NVML_MEMORY_V2, 0x0200_0028);

        assert_eq!(
            size_of::<NvmlUtilization>(),
            size_of::<b::nvmlUtilization_t>()
        );

        assert_eq!(
            size_of::<NvmlProcessInfo>(),
            size_of::<b::nvmlProcessInfo_t>()
        );
        assert_eq!(
            offset_of!(NvmlProcessInfo, used_gpu_memory),
            offset_of!(b::nvmlProcessInfo_t, usedGpuMemory)
        );
        assert_eq!(
            offset_of!(NvmlProcessInfo, compute_instance_id),
            offset_of!(b::nvmlProcessInfo_t, computeInstanceId)
        );

        assert_eq!(size_of::<NvmlEventData>(), size_of::<b::nvmlEventData_t>());
        assert_eq!(
            offset_of!(NvmlEventData, event_type),
            offset_of!(b::nvmlEventData_t, eventType)
        );
        assert_eq!(
            offset_of!(NvmlEventData, event_data),
            offset_of!(b::nvmlEventData_t, eventData)
        );
        assert_eq!(
            offset_of!(NvmlEventData, gpu_instance_id),
            offset_of!(b::nvmlEventData_t, gpuInstanceId)
        );
    }

    #[test]
    fn mig_layouts_match_nvml_h() {
        assert_eq!(
            size_of::<NvmlDeviceAttributes>(),
            size_of::<b::nvmlDeviceAttributes_t>()
        );
        assert_eq!(
            offset_of!(NvmlDeviceAttributes, compute_instance_slice_count),
            offset_of!(b::nvmlDeviceAttributes_t, computeInstanceSliceCount)
        );
        assert_eq!(
            offset_of!(NvmlDeviceAttributes, memory_size_mb),
            offset_of!(b::nvmlDeviceAttributes_t, memorySizeMB)
        );
        assert_eq!(
            size_of::<NvmlGpuInstanceProfileInfo>(),
            size_of::<b::nvmlGpuInstanceProfileInfo_t>()
        );
        assert_eq!(
            offset_of!(NvmlGpuInstanceProfileInfo, memory_size_mb),
            offset_of!(b::nvmlGpuInstanceProfileInfo_t, memorySizeMB)
        );
        assert_eq!(
            size_of::<NvmlGpuInstanceProfileInfoV2>(),
            size_of::<b::nvmlGpuInstanceProfileInfo_v2_t>()
        );
        assert_eq!(
            offset_of!(NvmlGpuInstanceProfileInfoV2, name),
            offset_of!(b::nvmlGpuInstanceProfileInfo_v2_t, name)
        );
        assert_eq!(
            size_of::<NvmlGpuInstanceProfileInfoV3>(),
            size_of::<b::nvmlGpuInstanceProfileInfo_v3_t>()
        );
        assert_eq!(
            offset_of!(NvmlGpuInstanceProfileInfoV3, capabilities),
            offset_of!(b::nvmlGpuInstanceProfileInfo_v3_t, capabilities)
        );
        assert_eq!(
            size_of::<NvmlGpuInstanceInfo>(),
            size_of::<b::nvmlGpuInstanceInfo_t>()
        );
        assert_eq!(
            offset_of!(NvmlGpuInstanceInfo, placement),
            offset_of!(b::nvmlGpuInstanceInfo_t, placement)
        );
        assert_eq!(
            size_of::<NvmlComputeInstanceProfileInfoV2>(),
            size_of::<b::nvmlComputeInstanceProfileInfo_v2_t>()
        );
        assert_eq!(
            offset_of!(NvmlComputeInstanceProfileInfoV2, name),
            offset_of!(b::nvmlComputeInstanceProfileInfo_v2_t, name)
        );
        assert_eq!(
            size_of::<NvmlComputeInstanceProfileInfoV3>(),
            size_of::<b::nvmlComputeInstanceProfileInfo_v3_t>()
        );
        assert_eq!(
            size_of::<NvmlComputeInstanceInfo>(),
            size_of::<b::nvmlComputeInstanceInfo_t>()
        );
        assert_eq!(
            offset_of!(NvmlComputeInstanceInfo, placement),
            offset_of!(b::nvmlComputeInstanceInfo_t, placement)
        );
        // The values pynvml hard-codes (nvidia-ml-py 13: nvmlGpuInstanceProfileInfo_v2 = 0x02000098).
        assert_eq!(GPU_INSTANCE_PROFILE_INFO_V2, 0x0200_0098);
        assert_eq!(GPU_INSTANCE_PROFILE_INFO_V3, 0x0300_0098);
        assert_eq!(COMPUTE_INSTANCE_PROFILE_INFO_V2, 0x0200_0088);
        assert_eq!(COMPUTE_INSTANCE_PROFILE_INFO_V3, 0x0300_008C);
    }

    #[test]
    fn constants_match_nvml_h() {
        assert_eq!(
            EVENT_SINGLE_BIT_ECC,
            u64::from(b::nvmlEventTypeSingleBitEccError)
        );
        assert_eq!(
            EVENT_DOUBLE_BIT_ECC,
            u64::from(b::nvmlEventTypeDoubleBitEccError)
        );
        assert_eq!(EVENT_PSTATE, u64::from(b::nvmlEventTypePState));
        assert_eq!(EVENT_XID, u64::from(b::nvmlEventTypeXidCriticalError));
        assert_eq!(EVENT_CLOCK, u64::from(b::nvmlEventTypeClock));
        assert_eq!(
            size_of::<NvmlFieldValue>(),
            size_of::<b::nvmlFieldValue_t>()
        );
        assert_eq!(
            offset_of!(NvmlFieldValue, value_type),
            offset_of!(b::nvmlFieldValue_t, valueType)
        );
        assert_eq!(
            offset_of!(NvmlFieldValue, nvml_return),
            offset_of!(b::nvmlFieldValue_t, nvmlReturn)
        );
        assert_eq!(
            offset_of!(NvmlFieldValue, value),
            offset_of!(b::nvmlFieldValue_t, value)
        );
        assert_eq!(
            VALUE_TYPE_UNSIGNED_INT,
            b::nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_INT
        );
        assert_eq!(
            FI_DEV_GET_GPU_RECOVERY_ACTION,
            b::field_id::NVML_FI_DEV_GET_GPU_RECOVERY_ACTION
        );
        assert_eq!(
            FI_DEV_RETIRED_PENDING,
            b::field_id::NVML_FI_DEV_RETIRED_PENDING
        );
        assert_eq!(FI_DEV_REMAPPED_COR, b::field_id::NVML_FI_DEV_REMAPPED_COR);
        assert_eq!(FI_DEV_REMAPPED_UNC, b::field_id::NVML_FI_DEV_REMAPPED_UNC);
        assert_eq!(
            FI_DEV_REMAPPED_PENDING,
            b::field_id::NVML_FI_DEV_REMAPPED_PENDING
        );
        assert_eq!(
            FI_DEV_REMAPPED_FAILURE,
            b::field_id::NVML_FI_DEV_REMAPPED_FAILURE
        );
        assert_eq!(NVLINK_MAX_LINKS, b::NVML_NVLINK_MAX_LINKS);
        assert_eq!(INIT_FLAG_NO_GPUS, b::NVML_INIT_FLAG_NO_GPUS);
        assert_eq!(DEVICE_MIG_ENABLE, b::NVML_DEVICE_MIG_ENABLE);
        assert_eq!(AFFINITY_SCOPE_NODE, b::NVML_AFFINITY_SCOPE_NODE);
        assert_eq!(AFFINITY_SCOPE_SOCKET, b::NVML_AFFINITY_SCOPE_SOCKET);
        assert_eq!(
            COMPUTEMODE_COUNT,
            b::nvmlComputeMode_enum_NVML_COMPUTEMODE_COUNT
        );
        assert_eq!(
            COMPUTEMODE_EXCLUSIVE_THREAD,
            b::nvmlComputeMode_enum_NVML_COMPUTEMODE_EXCLUSIVE_THREAD
        );
    }
}
