//! The driver's word on recovery through NVML's C ABI: the recovery action field
//! (`nvmlDeviceGetFieldValues`, `NVML_FI_DEV_GET_GPU_RECOVERY_ACTION` = 230), the row remapper
//! (`nvmlDeviceGetRemappedRows`), pages pending retirement and volatile ECC counters, as the
//! node description sets them and as events-file lines change them while a client runs.
#![allow(clippy::unwrap_used)] // a failed unwrap fails the test at its line

mod common;

use nvml_wrapper::enum_wrappers::device::{EccCounter, MemoryError};
use nvml_wrapper::enums::device::SampleValue;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::structs::device::FieldId;
use nvml_wrapper_sys::bindings::{field_id, nvmlDevice_t};

use mesos_gpu_testkit::nvml_sim::SimNode;

/// GPU 0 as an H200 answers (driver 580): recovery action field, row remapper, no page
/// retirement, ECC on. GPU 1 as an older driver and GPU: none of the three.
fn node() -> SimNode {
    SimNode::from_json(&common::node_json(&[
        common::gpu_json(
            0,
            r#""recovery_action": "none", "remapped_rows": { "correctable": 2 },
               "ecc": {}"#,
        ),
        common::gpu_json(1, r#""retired_pages_pending": false"#),
    ]))
}

/// `nvmlDeviceGetRemappedRows` through NVIDIA's prototype.
fn remapped_rows(sim: &SimNode, device: nvmlDevice_t) -> Result<[u32; 4], u32> {
    let lib = common::raw(sim);
    let mut v = [0u32; 4];
    let [a, b, c, d] = &mut v;
    // SAFETY: the prototype is nvml.h's; the device handle comes from this node's library
    // (same file, so the same loaded instance), and each out-pointer is a live u32.
    let rc = unsafe { lib.nvmlDeviceGetRemappedRows(device, a, b, c, d) };
    if rc == 0 { Ok(v) } else { Err(rc) }
}

fn recovery_action(nvml: &nvml_wrapper::Nvml, index: u32) -> Result<u32, NvmlError> {
    let device = nvml.device_by_index(index).unwrap();
    let mut samples = device
        .field_values_for(&[FieldId(field_id::NVML_FI_DEV_GET_GPU_RECOVERY_ACTION)])
        .unwrap();
    let sample = samples.pop().unwrap()?;
    match sample.value? {
        SampleValue::U32(v) => Ok(v),
        other => panic!("recovery action of unexpected type {other:?}"),
    }
}

#[test]
fn recovery_state_is_read_as_the_driver_reports_it() {
    let sim = node();
    let nvml = common::open(&sim);
    let gpu0 = nvml.device_by_index(0).unwrap();
    let gpu1 = nvml.device_by_index(1).unwrap();
    assert_eq!(recovery_action(&nvml, 0).unwrap(), 0, "NONE, as on an H200");
    assert!(matches!(
        recovery_action(&nvml, 1),
        Err(NvmlError::NotSupported)
    ));
    // SAFETY: reading the raw handle to pass it back into the same library.
    let (h0, h1) = unsafe { (gpu0.handle(), gpu1.handle()) };
    assert_eq!(remapped_rows(&sim, h0), Ok([2, 0, 0, 0]));
    assert_eq!(
        remapped_rows(&sim, h1),
        Err(3),
        "NOT_SUPPORTED without a row remapper"
    );
    assert!(matches!(
        gpu0.are_pages_pending_retired(),
        Err(NvmlError::NotSupported)
    ));
    assert!(!gpu1.are_pages_pending_retired().unwrap());
    // Several fields at once, each with its own status.
    let samples = gpu0
        .field_values_for(&[
            FieldId(field_id::NVML_FI_DEV_REMAPPED_PENDING),
            FieldId(field_id::NVML_FI_DEV_RETIRED_PENDING),
            FieldId(field_id::NVML_FI_DEV_REMAPPED_COR),
        ])
        .unwrap();
    assert!(matches!(
        samples[0].as_ref().unwrap().value,
        Ok(SampleValue::U32(0))
    ));
    assert!(matches!(
        samples[1].as_ref().unwrap().value,
        Err(NvmlError::NotSupported)
    ));
    assert!(matches!(
        samples[2].as_ref().unwrap().value,
        Ok(SampleValue::U32(2))
    ));
}

#[test]
fn events_change_the_recovery_state_while_a_client_runs_and_a_reset_clears_it() {
    let sim = node();
    let nvml = common::open(&sim);
    let gpu0 = nvml.device_by_index(0).unwrap();
    // SAFETY: reading the raw handle to pass it back into the same library.
    let h0 = unsafe { gpu0.handle() };
    sim.append_event("xid 0 94");
    sim.append_event("ecc-dbe 0");
    sim.append_event("remap-pending 0");
    sim.append_event("recovery-action 0 drain_and_reset");
    assert_eq!(recovery_action(&nvml, 0).unwrap(), 4);
    assert_eq!(remapped_rows(&sim, h0), Ok([2, 0, 1, 0]));
    let volatile = gpu0
        .total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile)
        .unwrap();
    assert_eq!(volatile, 1);

    sim.append_event("reset 0");
    assert_eq!(recovery_action(&nvml, 0).unwrap(), 0);
    assert_eq!(
        remapped_rows(&sim, h0),
        Ok([2, 1, 0, 0]),
        "the pending remapping is done at the reset"
    );
    assert_eq!(
        gpu0.total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile)
            .unwrap(),
        0,
        "volatile counters start again at a reset"
    );
    assert_eq!(
        gpu0.total_ecc_errors(MemoryError::Uncorrected, EccCounter::Aggregate)
            .unwrap(),
        1
    );
    sim.append_event("remap-failure 0");
    sim.append_event("reset 0");
    assert_eq!(
        remapped_rows(&sim, h0).unwrap()[3],
        1,
        "a failed remapping stays recorded"
    );
}

#[test]
fn a_lost_gpu_is_back_after_a_reset() {
    let sim = node();
    sim.append_event("lost 1");
    let nvml = common::open(&sim);
    assert!(matches!(
        nvml.device_by_index(1).and_then(|d| d.uuid()),
        Err(NvmlError::GpuLost)
    ));
    sim.append_event("reset 1");
    assert!(nvml.device_by_index(1).unwrap().uuid().is_ok());
}

#[test]
fn lines_a_gpu_cannot_have_are_refused_naming_the_field() {
    let sim = node();
    // Found at init: a bad line fails init like a bad description.
    sim.append_event("recovery-action 1 gpu_reset");
    let lib = sim.lib_path();
    let err = nvml_wrapper::Nvml::builder()
        .lib_path(lib.as_os_str())
        .init()
        .unwrap_err();
    assert!(matches!(err, NvmlError::DriverNotLoaded), "{err:?}");
    let bad = r#"{ "driver_version": "550.54.14", "cuda_driver_version": "12.4", "gpus": [
        { "index": 0, "minor": 0, "uuid": "GPU-00000000-0000-4000-8000-000000000000",
          "name": "NVIDIA H200", "brand": "nvidia", "pci": { "bus_id": "00000000:06:00.0" },
          "memory": { "total": 1 }, "recovery_action": "reboot" } ] }"#;
    let err = nvml_sim::validate(bad).unwrap_err();
    let text = mesos_gpu_os::error_chain(&err);
    assert!(
        text.contains("recovery_action") && text.contains("node_reboot"),
        "{text}"
    );
}
