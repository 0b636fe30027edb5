//! Reading the driver's evidence on a GPU through NVML ([`DriverEvidence`]): its recovery
//! action (`nvmlDeviceGetFieldValues`, field `NVML_FI_DEV_GET_GPU_RECOVERY_ACTION` = 230, an
//! unsigned int), its row remapper (`nvmlDeviceGetRemappedRows`), pages pending retirement
//! (`nvmlDeviceGetRetiredPagesPendingStatus`) and its volatile uncorrected ECC count
//! (`nvmlDeviceGetTotalEccErrors`). Each reading is a value, `NOT_SUPPORTED` (older GPUs and
//! drivers lack some), or another error; a GPU that answers `GPU_IS_LOST` is lost.

use nvml_wrapper::Device;
use nvml_wrapper::enum_wrappers::device::{EccCounter, MemoryError};
use nvml_wrapper::enums::device::SampleValue;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::structs::device::FieldId;

use super::recovery::{DriverEvidence, Reading};
use mesos_gpu_node::discovery::GpuDriver;

/// `NVML_FI_DEV_GET_GPU_RECOVERY_ACTION` (`nvml.h` of NVML 12.8 and later).
const FI_GPU_RECOVERY_ACTION: u32 = 230;

fn reading<T>(result: Result<T, NvmlError>) -> Reading<T> {
    match result {
        Ok(v) => Reading::Value(v),
        Err(NvmlError::NotSupported) => Reading::Unsupported,
        Err(e) => Reading::Failed(e.to_string()),
    }
}

/// The driver's recovery action for `device`.
pub(crate) fn recovery_action(device: &Device<'_>) -> Reading<u32> {
    let sample = device
        .field_values_for(&[FieldId(FI_GPU_RECOVERY_ACTION)])
        .and_then(|mut v| v.pop().unwrap_or(Err(NvmlError::NotSupported)))
        .and_then(|s| s.value);
    match sample {
        Ok(SampleValue::U32(a)) => Reading::Value(a),
        Ok(SampleValue::U64(a)) => u32::try_from(a).map_or_else(
            |_| Reading::Failed(format!("value {a} out of range")),
            Reading::Value,
        ),
        Ok(other) => Reading::Failed(format!("unexpected value {other:?}")),
        Err(e) => reading(Err(e)),
    }
}

/// Everything the driver says about GPU `index` (NVML index of `driver`'s session).
pub fn read(driver: &GpuDriver, index: u32) -> DriverEvidence {
    let nvml = driver.nvml();
    let device = match nvml.device_by_index(index) {
        Ok(device) => device,
        Err(e) => {
            let text = e.to_string();
            return DriverEvidence {
                lost: matches!(e, NvmlError::GpuLost),
                recovery_action: Reading::Failed(text.clone()),
                remapped_rows: Reading::Failed(text.clone()),
                retired_pages_pending: Reading::Failed(text.clone()),
                volatile_uncorrected: Reading::Failed(text),
            };
        }
    };
    let lost = matches!(device.uuid(), Err(NvmlError::GpuLost));
    DriverEvidence {
        lost,
        recovery_action: recovery_action(&device),
        remapped_rows: reading(mesos_gpu_node::discovery::remapped_rows(nvml, &device)),
        retired_pages_pending: reading(device.are_pages_pending_retired()),
        volatile_uncorrected: reading(
            device.total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile),
        ),
    }
}
