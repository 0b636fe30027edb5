//! NVML's return codes (`nvmlReturn_t`) and the texts `nvmlErrorString` gives for them.
//!
//! Numbers are those of `nvml.h` (`NVML_SUCCESS` = 0 … `NVML_ERROR_RESET_TYPE_NOT_SUPPORTED` =
//! 30, `NVML_ERROR_UNKNOWN` = 999). The texts follow what libnvidia-ml prints, as NVIDIA's own
//! DCGM copy of that table (`nvml_error_strings.h`) records them, e.g. "Driver/library version
//! mismatch" for code 18 (the text `nvidia-smi` shows as "Failed to initialize NVML: …").
//! Codes that table lacks use the wording of their `nvml.h` comment.

use std::ffi::CStr;

/// The raw C type of every NVML return value.
pub(crate) type NvmlReturn = std::ffi::c_uint;

/// `NVML_SUCCESS`.
pub(crate) const SUCCESS: NvmlReturn = 0;

/// Every NVML error code (everything but `NVML_SUCCESS`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum NvmlError {
    /// `NVML_ERROR_UNINITIALIZED` (1).
    Uninitialized,
    /// `NVML_ERROR_INVALID_ARGUMENT` (2).
    InvalidArgument,
    /// `NVML_ERROR_NOT_SUPPORTED` (3).
    NotSupported,
    /// `NVML_ERROR_NO_PERMISSION` (4).
    NoPermission,
    /// `NVML_ERROR_ALREADY_INITIALIZED` (5).
    AlreadyInitialized,
    /// `NVML_ERROR_NOT_FOUND` (6).
    NotFound,
    /// `NVML_ERROR_INSUFFICIENT_SIZE` (7).
    InsufficientSize,
    /// `NVML_ERROR_INSUFFICIENT_POWER` (8).
    InsufficientPower,
    /// `NVML_ERROR_DRIVER_NOT_LOADED` (9).
    DriverNotLoaded,
    /// `NVML_ERROR_TIMEOUT` (10).
    Timeout,
    /// `NVML_ERROR_IRQ_ISSUE` (11).
    IrqIssue,
    /// `NVML_ERROR_LIBRARY_NOT_FOUND` (12).
    LibraryNotFound,
    /// `NVML_ERROR_FUNCTION_NOT_FOUND` (13).
    FunctionNotFound,
    /// `NVML_ERROR_CORRUPTED_INFOROM` (14).
    CorruptedInforom,
    /// `NVML_ERROR_GPU_IS_LOST` (15).
    GpuIsLost,
    /// `NVML_ERROR_RESET_REQUIRED` (16).
    ResetRequired,
    /// `NVML_ERROR_OPERATING_SYSTEM` (17).
    OperatingSystem,
    /// `NVML_ERROR_LIB_RM_VERSION_MISMATCH` (18).
    LibRmVersionMismatch,
    /// `NVML_ERROR_IN_USE` (19).
    InUse,
    /// `NVML_ERROR_MEMORY` (20).
    Memory,
    /// `NVML_ERROR_NO_DATA` (21).
    NoData,
    /// `NVML_ERROR_VGPU_ECC_NOT_SUPPORTED` (22).
    VgpuEccNotSupported,
    /// `NVML_ERROR_INSUFFICIENT_RESOURCES` (23).
    InsufficientResources,
    /// `NVML_ERROR_FREQ_NOT_SUPPORTED` (24).
    FreqNotSupported,
    /// `NVML_ERROR_ARGUMENT_VERSION_MISMATCH` (25).
    ArgumentVersionMismatch,
    /// `NVML_ERROR_DEPRECATED` (26).
    Deprecated,
    /// `NVML_ERROR_NOT_READY` (27).
    NotReady,
    /// `NVML_ERROR_GPU_NOT_FOUND` (28).
    GpuNotFound,
    /// `NVML_ERROR_INVALID_STATE` (29).
    InvalidState,
    /// `NVML_ERROR_RESET_TYPE_NOT_SUPPORTED` (30).
    ResetTypeNotSupported,
    /// `NVML_ERROR_UNKNOWN` (999).
    Unknown,
}

/// (error, code, `nvml.h` name, `nvmlErrorString` text) for every error.
const TABLE: &[(NvmlError, NvmlReturn, &str, &CStr)] = &[
    (
        NvmlError::Uninitialized,
        1,
        "NVML_ERROR_UNINITIALIZED",
        c"Uninitialized",
    ),
    (
        NvmlError::InvalidArgument,
        2,
        "NVML_ERROR_INVALID_ARGUMENT",
        c"Invalid Argument",
    ),
    (
        NvmlError::NotSupported,
        3,
        "NVML_ERROR_NOT_SUPPORTED",
        c"Not Supported",
    ),
    (
        NvmlError::NoPermission,
        4,
        "NVML_ERROR_NO_PERMISSION",
        c"Insufficient Permissions",
    ),
    (
        NvmlError::AlreadyInitialized,
        5,
        "NVML_ERROR_ALREADY_INITIALIZED",
        c"Already Initialized",
    ),
    (NvmlError::NotFound, 6, "NVML_ERROR_NOT_FOUND", c"Not Found"),
    (
        NvmlError::InsufficientSize,
        7,
        "NVML_ERROR_INSUFFICIENT_SIZE",
        c"Insufficient Size",
    ),
    (
        NvmlError::InsufficientPower,
        8,
        "NVML_ERROR_INSUFFICIENT_POWER",
        c"Insufficient External Power",
    ),
    (
        NvmlError::DriverNotLoaded,
        9,
        "NVML_ERROR_DRIVER_NOT_LOADED",
        c"Driver Not Loaded",
    ),
    (NvmlError::Timeout, 10, "NVML_ERROR_TIMEOUT", c"Timeout"),
    (
        NvmlError::IrqIssue,
        11,
        "NVML_ERROR_IRQ_ISSUE",
        c"Interrupt Request Issue",
    ),
    (
        NvmlError::LibraryNotFound,
        12,
        "NVML_ERROR_LIBRARY_NOT_FOUND",
        c"NVML Shared Library Not Found",
    ),
    (
        NvmlError::FunctionNotFound,
        13,
        "NVML_ERROR_FUNCTION_NOT_FOUND",
        c"Function Not Found",
    ),
    (
        NvmlError::CorruptedInforom,
        14,
        "NVML_ERROR_CORRUPTED_INFOROM",
        c"Corrupted infoROM",
    ),
    (
        NvmlError::GpuIsLost,
        15,
        "NVML_ERROR_GPU_IS_LOST",
        c"GPU is lost",
    ),
    (
        NvmlError::ResetRequired,
        16,
        "NVML_ERROR_RESET_REQUIRED",
        c"GPU requires reset",
    ),
    (
        NvmlError::OperatingSystem,
        17,
        "NVML_ERROR_OPERATING_SYSTEM",
        c"GPU access blocked by the operating system",
    ),
    (
        NvmlError::LibRmVersionMismatch,
        18,
        "NVML_ERROR_LIB_RM_VERSION_MISMATCH",
        c"Driver/library version mismatch",
    ),
    (
        NvmlError::InUse,
        19,
        "NVML_ERROR_IN_USE",
        c"In use by another client",
    ),
    (
        NvmlError::Memory,
        20,
        "NVML_ERROR_MEMORY",
        c"Insufficient Memory",
    ),
    (NvmlError::NoData, 21, "NVML_ERROR_NO_DATA", c"No data"),
    (
        NvmlError::VgpuEccNotSupported,
        22,
        "NVML_ERROR_VGPU_ECC_NOT_SUPPORTED",
        c"The requested vgpu operation is not available on target device, because ECC is enabled",
    ),
    (
        NvmlError::InsufficientResources,
        23,
        "NVML_ERROR_INSUFFICIENT_RESOURCES",
        c"Insufficient Resources",
    ),
    (
        NvmlError::FreqNotSupported,
        24,
        "NVML_ERROR_FREQ_NOT_SUPPORTED",
        c"Requested frequency is not supported",
    ),
    (
        NvmlError::ArgumentVersionMismatch,
        25,
        "NVML_ERROR_ARGUMENT_VERSION_MISMATCH",
        c"Argument version mismatch",
    ),
    (
        NvmlError::Deprecated,
        26,
        "NVML_ERROR_DEPRECATED",
        c"Deprecated",
    ),
    (
        NvmlError::NotReady,
        27,
        "NVML_ERROR_NOT_READY",
        c"System is not ready",
    ),
    (
        NvmlError::GpuNotFound,
        28,
        "NVML_ERROR_GPU_NOT_FOUND",
        c"No supported GPUs were found",
    ),
    (
        NvmlError::InvalidState,
        29,
        "NVML_ERROR_INVALID_STATE",
        c"Invalid state",
    ),
    (
        NvmlError::ResetTypeNotSupported,
        30,
        "NVML_ERROR_RESET_TYPE_NOT_SUPPORTED",
        c"Reset type not supported",
    ),
    (
        NvmlError::Unknown,
        999,
        "NVML_ERROR_UNKNOWN",
        c"Unknown Error",
    ),
];

impl NvmlError {
    fn row(self) -> &'static (NvmlError, NvmlReturn, &'static str, &'static CStr) {
        // Every variant has a row: the table test below checks it.
        TABLE
            .iter()
            .find(|row| row.0 == self)
            .unwrap_or(&TABLE[TABLE.len() - 1])
    }

    /// The numeric `nvmlReturn_t` value.
    pub(crate) fn code(self) -> NvmlReturn {
        self.row().1
    }

    /// The error for an `nvml.h` name such as `NVML_ERROR_UNKNOWN`.
    pub(crate) fn from_name(name: &str) -> Option<NvmlError> {
        TABLE.iter().find(|row| row.2 == name).map(|row| row.0)
    }

    /// Every error name, for messages listing what is accepted.
    pub(crate) fn names() -> impl Iterator<Item = &'static str> {
        TABLE.iter().map(|row| row.2)
    }
}

/// The text `nvmlErrorString` returns for `code`: "Success" for 0, "Unknown Error" for codes
/// NVML does not define.
pub(crate) fn message(code: NvmlReturn) -> &'static CStr {
    if code == SUCCESS {
        return c"Success";
    }
    TABLE
        .iter()
        .find(|row| row.1 == code)
        .map_or(c"Unknown Error", |row| row.3)
}

/// The C return value for a call's outcome.
pub(crate) fn to_return(result: Result<(), NvmlError>) -> NvmlReturn {
    match result {
        Ok(()) => SUCCESS,
        Err(e) => e.code(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_nvml_h_numbers_and_unique() {
        let mut codes: Vec<_> = TABLE.iter().map(|r| r.1).collect();
        codes.sort_unstable();
        codes.dedup();
        assert_eq!(codes.len(), TABLE.len());
        assert_eq!(NvmlError::GpuIsLost.code(), 15);
        assert_eq!(NvmlError::Timeout.code(), 10);
        assert_eq!(NvmlError::ArgumentVersionMismatch.code(), 25);
        assert_eq!(NvmlError::GpuNotFound.code(), 28);
        assert_eq!(NvmlError::Unknown.code(), 999);
    }

    #[test]
    fn every_variant_has_its_own_row() {
        for row in TABLE {
            assert_eq!(row.0.row().1, row.1, "{}", row.2);
            assert_eq!(NvmlError::from_name(row.2), Some(row.0));
        }
    }

    #[test]
    fn messages() {
        assert_eq!(message(0), c"Success");
        assert_eq!(message(1), c"Uninitialized");
        assert_eq!(message(15), c"GPU is lost");
        assert_eq!(message(18), c"Driver/library version mismatch");
        assert_eq!(message(12345), c"Unknown Error");
        assert_eq!(to_return(Err(NvmlError::NotFound)), 6);
        assert_eq!(to_return(Ok(())), 0);
    }
}
