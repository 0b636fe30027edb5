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
        assert_eq!(NVLINK_MAX_LINKS, b::NVML_NVLINK_MAX_LINKS);
        assert_eq!(INIT_FLAG_NO_GPUS, b::NVML_INIT_FLAG_NO_GPUS);
    }
}
