//! NVML's error codes as clients see them: before init, reference-counted init and shutdown,
//! bad arguments, short buffers, lost GPUs, injected failures, unsupported values, bad node
//! descriptions, and independence of two simulated nodes in one process.
#![allow(clippy::unwrap_used)] // a failed unwrap fails the test at its line

mod common;

use std::ffi::{CStr, c_char, c_int, c_uint};
use std::ptr;

use common::{gpu_json, node_json, open, plain_node, raw};
use mesos_gpu_testkit::nvml_sim::SimNode;
use nvml_wrapper::Nvml;
use nvml_wrapper::bitmasks::InitFlags;
use nvml_wrapper::enum_wrappers::device::TemperatureSensor;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper_sys::bindings::{self as b, NvmlLib, nvmlDevice_t};

const SUCCESS: u32 = b::nvmlReturn_enum_NVML_SUCCESS;
const UNINITIALIZED: u32 = b::nvmlReturn_enum_NVML_ERROR_UNINITIALIZED;
const INVALID_ARGUMENT: u32 = b::nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;
const INSUFFICIENT_SIZE: u32 = b::nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE;
const NOT_SUPPORTED: u32 = b::nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED;
const GPU_IS_LOST: u32 = b::nvmlReturn_enum_NVML_ERROR_GPU_IS_LOST;

fn handle(lib: &NvmlLib, index: u32) -> nvmlDevice_t {
    let mut dev: nvmlDevice_t = ptr::null_mut();
    // SAFETY: `dev` is a live local the call writes one handle into.
    let rc = unsafe { lib.nvmlDeviceGetHandleByIndex_v2(index, &mut dev) };
    assert_eq!(rc, SUCCESS);
    dev
}

#[test]
fn calls_before_init_are_uninitialized() {
    let node = plain_node(2);
    // SAFETY: loading the sim runs no initialiser of ours; each symbol is used with its nvml.h
    // prototype, spelled out here.
    let lib = unsafe { libloading::Library::new(node.lib_path()) }.unwrap();
    // SAFETY: the prototypes below are those of nvml.h; pointers passed are live locals.
    unsafe {
        let count: libloading::Symbol<'_, unsafe extern "C" fn(*mut c_uint) -> c_uint> =
            lib.get(b"nvmlDeviceGetCount_v2\0").unwrap();
        let mut n = 99;
        assert_eq!(count(&mut n), UNINITIALIZED);
        assert_eq!(n, 99, "nothing written on failure");
        let shutdown: libloading::Symbol<'_, unsafe extern "C" fn() -> c_uint> =
            lib.get(b"nvmlShutdown\0").unwrap();
        assert_eq!(shutdown(), UNINITIALIZED);
        let by_index: libloading::Symbol<
            '_,
            unsafe extern "C" fn(c_uint, *mut nvmlDevice_t) -> c_uint,
        > = lib.get(b"nvmlDeviceGetHandleByIndex_v2\0").unwrap();
        let mut dev = ptr::null_mut();
        assert_eq!(by_index(0, &mut dev), UNINITIALIZED);
        let version: libloading::Symbol<'_, unsafe extern "C" fn(*mut c_char, c_uint) -> c_uint> =
            lib.get(b"nvmlSystemGetDriverVersion\0").unwrap();
        let mut buf = [0 as c_char; 80];
        assert_eq!(version(buf.as_mut_ptr(), 80), UNINITIALIZED);
        let error_string: libloading::Symbol<'_, unsafe extern "C" fn(c_uint) -> *const c_char> =
            lib.get(b"nvmlErrorString\0").unwrap();
        assert_eq!(
            CStr::from_ptr(error_string(UNINITIALIZED)),
            c"Uninitialized"
        );
        assert_eq!(CStr::from_ptr(error_string(GPU_IS_LOST)), c"GPU is lost");
        assert_eq!(CStr::from_ptr(error_string(0)), c"Success");
        assert_eq!(CStr::from_ptr(error_string(4242)), c"Unknown Error");
    }
}

#[test]
fn init_and_shutdown_are_reference_counted() {
    let node = plain_node(2);
    let lib = raw(&node);
    let mut n = 0;
    // SAFETY: nvml.h prototypes via nvml-wrapper-sys; `n` is a live local.
    unsafe {
        assert_eq!(lib.nvmlInit_v2(), SUCCESS);
        assert_eq!(lib.nvmlInitWithFlags(0), SUCCESS);
        assert_eq!(lib.nvmlShutdown(), SUCCESS);
        assert_eq!(
            lib.nvmlDeviceGetCount_v2(&mut n),
            SUCCESS,
            "one reference left"
        );
        assert_eq!(n, 2);
        assert_eq!(lib.nvmlShutdown(), SUCCESS);
        assert_eq!(lib.nvmlDeviceGetCount_v2(&mut n), UNINITIALIZED);
        assert_eq!(lib.nvmlShutdown(), UNINITIALIZED);
        assert_eq!(
            lib.nvmlInit_v2(),
            SUCCESS,
            "init again after the last shutdown"
        );
        assert_eq!(lib.nvmlShutdown(), SUCCESS);
    }

    // The same through nvml-wrapper: two clients of one library share the driver.
    let first = open(&node);
    let second = open(&node);
    let dev = first.device_by_index(1).unwrap();
    assert_eq!(dev.index().unwrap(), 1);
    second.shutdown().unwrap();
    assert_eq!(
        dev.index().unwrap(),
        1,
        "handles stay valid until the last shutdown"
    );
}

#[test]
fn handles_do_not_survive_the_last_shutdown() {
    let node = plain_node(1);
    let lib = raw(&node);
    let mut index = 0;
    // SAFETY: nvml.h prototypes; the stale handle is only compared by the sim, never dereferenced.
    unsafe {
        assert_eq!(lib.nvmlInit_v2(), SUCCESS);
        let dev = handle(&lib, 0);
        assert_eq!(lib.nvmlShutdown(), SUCCESS);
        assert_eq!(lib.nvmlDeviceGetIndex(dev, &mut index), UNINITIALIZED);
        assert_eq!(lib.nvmlInit_v2(), SUCCESS);
        let fresh = handle(&lib, 0);
        assert_eq!(lib.nvmlDeviceGetIndex(fresh, &mut index), SUCCESS);
        assert_eq!(lib.nvmlShutdown(), SUCCESS);
    }
}

#[test]
fn bad_arguments_are_invalid_argument() {
    let node = plain_node(2);
    let nvml = open(&node);
    assert!(matches!(
        nvml.device_by_index(2),
        Err(NvmlError::InvalidArg)
    ));
    assert!(matches!(
        nvml.device_by_uuid("GPU-00000000-0000-4000-8000-00000000ffff"),
        Err(NvmlError::NotFound)
    ));
    assert!(matches!(
        nvml.device_by_uuid("not-a-uuid"),
        Err(NvmlError::InvalidArg)
    ));
    assert!(matches!(
        nvml.device_by_pci_bus_id("0000:99:00.0"),
        Err(NvmlError::NotFound)
    ));
    assert!(matches!(
        nvml.device_by_pci_bus_id("zz"),
        Err(NvmlError::InvalidArg)
    ));
    assert_eq!(
        nvml.device_by_pci_bus_id("5:0.0").unwrap().index().unwrap(),
        1,
        "short form bus:device.function"
    );
    assert_eq!(
        nvml.device_by_uuid("GPU-00000000-0000-4000-8000-000000000001")
            .unwrap()
            .index()
            .unwrap(),
        1
    );
    let dev = nvml.device_by_index(0).unwrap();
    assert!(matches!(
        dev.topology_common_ancestor(nvml.device_by_index(0).unwrap()),
        Err(NvmlError::InvalidArg)
    ));
    assert!(matches!(
        dev.link_wrapper_for(18).is_active(),
        Err(NvmlError::InvalidArg)
    ));

    let lib = raw(&node);
    let forged = 0x1000 as nvmlDevice_t;
    let mut value: c_uint = 0;
    // SAFETY: nvml.h prototypes; NULL out-pointers and a forged handle are what is under test,
    // and the sim must reject them without touching them.
    unsafe {
        assert_eq!(lib.nvmlDeviceGetIndex(forged, &mut value), INVALID_ARGUMENT);
        let dev = handle(&lib, 0);
        assert_eq!(
            lib.nvmlDeviceGetIndex(dev, ptr::null_mut()),
            INVALID_ARGUMENT
        );
        assert_eq!(
            lib.nvmlDeviceGetMinorNumber(dev, ptr::null_mut()),
            INVALID_ARGUMENT
        );
        assert_eq!(
            lib.nvmlDeviceGetPciInfo_v3(dev, ptr::null_mut()),
            INVALID_ARGUMENT
        );
        assert_eq!(
            lib.nvmlDeviceGetName(dev, ptr::null_mut(), 96),
            INVALID_ARGUMENT
        );
        assert_eq!(lib.nvmlDeviceGetCount_v2(ptr::null_mut()), INVALID_ARGUMENT);
        assert_eq!(
            lib.nvmlDeviceGetHandleByIndex_v2(0, ptr::null_mut()),
            INVALID_ARGUMENT
        );
        assert_eq!(
            lib.nvmlDeviceGetHandleByUUID(ptr::null(), &mut ptr::null_mut()),
            INVALID_ARGUMENT
        );
        assert_eq!(
            lib.nvmlDeviceGetCpuAffinity(dev, 0, ptr::null_mut()),
            INVALID_ARGUMENT
        );
        assert_eq!(
            lib.nvmlDeviceGetTemperature(dev, 1, &mut value),
            INVALID_ARGUMENT,
            "unknown sensor"
        );
        assert_eq!(
            lib.nvmlEventSetWait_v2(ptr::null_mut(), ptr::null_mut(), 0),
            INVALID_ARGUMENT
        );
        assert_eq!(
            lib.nvmlEventSetFree(0x2000 as b::nvmlEventSet_t),
            INVALID_ARGUMENT
        );
        let mut total: u64 = 0;
        assert_eq!(
            lib.nvmlDeviceGetTotalEccErrors(dev, 2, 0, &mut total),
            INVALID_ARGUMENT
        );
    }
}

#[test]
fn short_buffers_are_insufficient_size_with_the_needed_size() {
    let processes =
        r#""processes": [{"pid": 100, "used_memory": 1024}, {"pid": 200, "used_memory": 2048}]"#;
    let node = SimNode::from_json(&node_json(&[gpu_json(0, processes)]));
    let lib = raw(&node);
    // SAFETY: nvml.h prototypes; buffers are live locals of the lengths passed.
    unsafe {
        assert_eq!(lib.nvmlInit_v2(), SUCCESS);
        let dev = handle(&lib, 0);
        let mut name = [0 as c_char; 96];
        let full = "Tesla V100-SXM2-16GB";
        let len = c_uint::try_from(full.len()).unwrap();
        assert_eq!(
            lib.nvmlDeviceGetName(dev, name.as_mut_ptr(), len),
            INSUFFICIENT_SIZE,
            "no room for NUL"
        );
        assert_eq!(
            lib.nvmlDeviceGetName(dev, name.as_mut_ptr(), len + 1),
            SUCCESS
        );
        assert_eq!(CStr::from_ptr(name.as_ptr()).to_str().unwrap(), full);
        let mut version = [0 as c_char; 80];
        assert_eq!(
            lib.nvmlSystemGetDriverVersion(version.as_mut_ptr(), 4),
            INSUFFICIENT_SIZE
        );
        assert_eq!(
            lib.nvmlSystemGetNVMLVersion(version.as_mut_ptr(), 80),
            SUCCESS
        );
        assert_eq!(
            CStr::from_ptr(version.as_ptr()).to_str().unwrap(),
            "12.550.54.14"
        );
        assert_eq!(
            lib.nvmlDeviceGetUUID(dev, version.as_mut_ptr(), 40),
            INSUFFICIENT_SIZE,
            "a UUID is 40 chars"
        );
        assert_eq!(
            lib.nvmlDeviceGetSerial(dev, version.as_mut_ptr(), 13),
            INSUFFICIENT_SIZE
        );

        let mut count: c_uint = 0;
        assert_eq!(
            lib.nvmlDeviceGetComputeRunningProcesses_v3(dev, &mut count, ptr::null_mut()),
            INSUFFICIENT_SIZE
        );
        assert_eq!(count, 2, "the needed count is written back");
        let mut infos = [std::mem::zeroed::<b::nvmlProcessInfo_t>(); 2];
        count = 1;
        assert_eq!(
            lib.nvmlDeviceGetComputeRunningProcesses_v3(dev, &mut count, infos.as_mut_ptr()),
            INSUFFICIENT_SIZE
        );
        assert_eq!(count, 2);
        count = 2;
        assert_eq!(
            lib.nvmlDeviceGetComputeRunningProcesses_v3(dev, &mut count, infos.as_mut_ptr()),
            SUCCESS
        );
        assert_eq!(count, 2);
        assert_eq!((infos[1].pid, infos[1].usedGpuMemory), (200, 2048));
        assert_eq!(
            (infos[1].gpuInstanceId, infos[1].computeInstanceId),
            (0xFFFF_FFFF, 0xFFFF_FFFF)
        );

        let mut memory: b::nvmlMemory_v2_t = std::mem::zeroed();
        memory.version = 1;
        assert_eq!(
            lib.nvmlDeviceGetMemoryInfo_v2(dev, &mut memory),
            b::nvmlReturn_enum_NVML_ERROR_ARGUMENT_VERSION_MISMATCH
        );
        let mut v1: b::nvmlMemory_t = std::mem::zeroed();
        assert_eq!(lib.nvmlDeviceGetMemoryInfo(dev, &mut v1), SUCCESS);
        assert_eq!(
            (v1.total, v1.used, v1.free),
            (17_179_869_184, 1_048_576, 17_179_869_184 - 1_048_576)
        );
        let dl = libloading::Library::new(node.lib_path()).unwrap();
        let v2: libloading::Symbol<
            '_,
            unsafe extern "C" fn(nvmlDevice_t, *mut c_uint, *mut b::nvmlProcessInfo_v2_t) -> c_uint,
        > = dl
            .get(b"nvmlDeviceGetComputeRunningProcesses_v2\0")
            .unwrap();
        let mut v2_infos = [std::mem::zeroed::<b::nvmlProcessInfo_v2_t>(); 3];
        count = 3;
        assert_eq!(v2(dev, &mut count, v2_infos.as_mut_ptr()), SUCCESS);
        assert_eq!((count, v2_infos[0].pid, v2_infos[1].pid), (2, 100, 200));
        assert_eq!(lib.nvmlShutdown(), SUCCESS);
    }
}

#[test]
fn lost_gpu_answers_gpu_is_lost() {
    let node = SimNode::from_json(&node_json(&[
        gpu_json(0, ""),
        gpu_json(1, r#""lost": true"#),
    ]));
    let nvml = open(&node);
    assert_eq!(
        nvml.device_count().unwrap(),
        2,
        "a lost GPU is still counted"
    );
    assert!(matches!(nvml.device_by_index(1), Err(NvmlError::GpuLost)));
    assert!(matches!(
        nvml.device_by_uuid("GPU-00000000-0000-4000-8000-000000000001"),
        Err(NvmlError::GpuLost)
    ));
    assert!(matches!(
        nvml.device_by_pci_bus_id("00000000:05:00.0"),
        Err(NvmlError::GpuLost)
    ));
    assert_eq!(nvml.device_by_index(0).unwrap().minor_number().unwrap(), 10);

    // A GPU lost after its handle was taken: every device call fails.
    let dev = nvml.device_by_index(0).unwrap();
    node.append_event("lost 0");
    assert!(matches!(dev.uuid(), Err(NvmlError::GpuLost)));
    assert!(matches!(dev.minor_number(), Err(NvmlError::GpuLost)));
    assert!(matches!(dev.pci_info(), Err(NvmlError::GpuLost)));
    assert!(matches!(dev.memory_info(), Err(NvmlError::GpuLost)));
    assert!(matches!(dev.index(), Err(NvmlError::GpuLost)));
}

#[test]
fn injected_failures_fail_only_the_named_call() {
    let fail = r#""temperature_c": 50, "power_mw": 70000, "fail": {"nvmlDeviceGetPowerUsage": "NVML_ERROR_UNKNOWN", "nvmlDeviceGetUUID": "NVML_ERROR_CORRUPTED_INFOROM"}"#;
    let node = SimNode::from_json(&node_json(&[
        gpu_json(0, fail),
        gpu_json(1, r#""power_mw": 1"#),
    ]));
    let nvml = open(&node);
    let dev = nvml.device_by_index(0).unwrap();
    assert!(matches!(dev.power_usage(), Err(NvmlError::Unknown)));
    assert!(matches!(dev.uuid(), Err(NvmlError::CorruptedInfoROM)));
    assert_eq!(dev.temperature(TemperatureSensor::Gpu).unwrap(), 50);
    assert_eq!(
        nvml.device_by_index(1).unwrap().power_usage().unwrap(),
        1,
        "other GPUs unaffected"
    );

    let refuse = r#"{"driver_version": "550.54.14", "cuda_driver_version": 12040, "fail": {"nvmlInit_v2": "NVML_ERROR_NO_PERMISSION"}, "gpus": []}"#;
    let node = SimNode::from_json(refuse);
    assert!(matches!(
        Nvml::builder().lib_path(node.lib_path().as_os_str()).init(),
        Err(NvmlError::NoPermission)
    ));
}

#[test]
fn absent_values_are_not_supported() {
    let node = SimNode::from_json(&node_json(&[gpu_json(0, r#""ecc": {}"#), gpu_json(1, "")]));
    let nvml = open(&node);
    let dev = nvml.device_by_index(1).unwrap();
    assert!(matches!(
        dev.utilization_rates(),
        Err(NvmlError::NotSupported)
    ));
    assert!(matches!(
        dev.temperature(TemperatureSensor::Gpu),
        Err(NvmlError::NotSupported)
    ));
    assert!(matches!(dev.power_usage(), Err(NvmlError::NotSupported)));
    assert!(matches!(
        dev.running_compute_processes(),
        Err(NvmlError::NotSupported)
    ));
    assert!(matches!(dev.mig_mode(), Err(NvmlError::NotSupported)));
    assert!(matches!(dev.numa_node_id(), Err(NvmlError::NotSupported)));
    assert!(matches!(dev.cpu_affinity(1), Err(NvmlError::NotSupported)));
    assert!(matches!(
        dev.cuda_compute_capability(),
        Err(NvmlError::NotSupported)
    ));
    assert!(matches!(dev.is_ecc_enabled(), Err(NvmlError::NotSupported)));
    assert!(matches!(
        dev.link_wrapper_for(0).is_active(),
        Err(NvmlError::NotSupported)
    ));
    let other = nvml.device_by_index(0).unwrap();
    assert!(matches!(
        dev.topology_common_ancestor(nvml.device_by_index(0).unwrap()),
        Err(NvmlError::NotSupported)
    ));
    assert!(other.is_ecc_enabled().unwrap().currently_enabled);

    let lib = raw(&node);
    // SAFETY: nvml.h prototypes; `set` is a live local.
    unsafe {
        assert_eq!(lib.nvmlInit_v2(), SUCCESS);
        let mut set = ptr::null_mut();
        assert_eq!(lib.nvmlEventSetCreate(&mut set), SUCCESS);
        let ecc = u64::from(b::nvmlEventTypeDoubleBitEccError);
        assert_eq!(
            lib.nvmlDeviceRegisterEvents(handle(&lib, 1), ecc, set),
            NOT_SUPPORTED,
            "no ECC on GPU 1"
        );
        assert_eq!(
            lib.nvmlDeviceRegisterEvents(handle(&lib, 0), ecc, set),
            SUCCESS
        );
        assert_eq!(lib.nvmlEventSetFree(set), SUCCESS);
        assert_eq!(lib.nvmlShutdown(), SUCCESS);
    }
}

#[test]
fn bad_node_descriptions_mean_no_driver() {
    let driver_not_loaded = |json: &str| {
        let node = SimNode::from_json(json);
        let result = Nvml::builder().lib_path(node.lib_path().as_os_str()).init();
        assert!(
            matches!(result, Err(NvmlError::DriverNotLoaded)),
            "{json}: {result:?}"
        );
    };
    driver_not_loaded(r#"{"driver_version": "550.54.14", "gpus": []}"#);
    driver_not_loaded(&node_json(&[gpu_json(0, ""), gpu_json(0, "")]));
    driver_not_loaded(&node_json(&[
        gpu_json(0, r#""nvlinks": [{"peer": 1, "links": 2}]"#),
        gpu_json(1, ""),
    ]));
    driver_not_loaded(&node_json(&[gpu_json(
        0,
        r#""nvlinks": [{"peer": 5, "links": 1}]"#,
    )]));
    driver_not_loaded(&node_json(&[gpu_json(0, r#""colour": "green""#)]));

    let node = plain_node(1);
    std::fs::remove_file(node.config_path()).unwrap();
    let result = Nvml::builder().lib_path(node.lib_path().as_os_str()).init();
    assert!(
        matches!(result, Err(NvmlError::DriverNotLoaded)),
        "no description at all: {result:?}"
    );

    let node = plain_node(1);
    std::fs::write(node.events_path(), "xid 7 13\n").unwrap();
    let result = Nvml::builder().lib_path(node.lib_path().as_os_str()).init();
    assert!(
        matches!(result, Err(NvmlError::DriverNotLoaded)),
        "bad line in the events file: {result:?}"
    );
}

#[test]
fn a_node_without_gpus_needs_the_no_gpus_flag() {
    let node = SimNode::shipped("driver-no-gpus");
    let lib = node.lib_path();
    let plain = Nvml::builder().lib_path(lib.as_os_str()).init();
    assert!(
        matches!(plain, Err(NvmlError::UnexpectedVariant(code)) if code == b::nvmlReturn_enum_NVML_ERROR_GPU_NOT_FOUND)
    );
    let nvml = Nvml::builder()
        .lib_path(lib.as_os_str())
        .flags(InitFlags::NO_GPUS)
        .init()
        .unwrap();
    assert_eq!(nvml.device_count().unwrap(), 0);
    assert!(matches!(
        nvml.device_by_index(0),
        Err(NvmlError::InvalidArg)
    ));
}

#[test]
fn two_nodes_in_one_process_are_independent() {
    let a = SimNode::shipped("dgx1-v100");
    let b = SimNode::shipped("k80");
    let lib_a = raw(&a);
    let lib_b = raw(&b);
    let mut n = 0;
    let mut minor = 0;
    // SAFETY: nvml.h prototypes; handles of one instance are passed to the other only to be
    // compared and rejected.
    unsafe {
        assert_eq!(lib_a.nvmlInit_v2(), SUCCESS);
        assert_eq!(
            lib_b.nvmlDeviceGetCount_v2(&mut n),
            UNINITIALIZED,
            "b not initialised by a's init"
        );
        assert_eq!(lib_b.nvmlInit_v2(), SUCCESS);
        assert_eq!(lib_a.nvmlDeviceGetCount_v2(&mut n), SUCCESS);
        assert_eq!(n, 8);
        assert_eq!(lib_b.nvmlDeviceGetCount_v2(&mut n), SUCCESS);
        assert_eq!(n, 4);
        let dev_a = handle(&lib_a, 0);
        let dev_b = handle(&lib_b, 0);
        assert_eq!(
            lib_b.nvmlDeviceGetMinorNumber(dev_a, &mut minor),
            INVALID_ARGUMENT,
            "a's handle in b"
        );
        assert_eq!(lib_b.nvmlDeviceGetMinorNumber(dev_b, &mut minor), SUCCESS);
        assert_eq!(minor, 2);
        assert_eq!(lib_a.nvmlShutdown(), SUCCESS);
        assert_eq!(
            lib_b.nvmlDeviceGetMinorNumber(dev_b, &mut minor),
            SUCCESS,
            "a's shutdown leaves b alone"
        );
        assert_eq!(lib_b.nvmlShutdown(), SUCCESS);
    }
}

#[test]
fn ecc_counters_follow_events() {
    let ecc = r#""ecc": {"aggregate": {"corrected": 5}}"#;
    let node = SimNode::from_json(&node_json(&[gpu_json(0, ecc)]));
    let lib = raw(&node);
    let count = |error: u32, counter: u32| {
        let mut n: u64 = 0;
        let dev = handle(&lib, 0);
        // SAFETY: nvml.h prototype; `n` is a live local.
        let rc = unsafe { lib.nvmlDeviceGetTotalEccErrors(dev, error, counter, &mut n) };
        assert_eq!(rc, SUCCESS);
        n
    };
    // SAFETY: nvml.h prototype.
    assert_eq!(unsafe { lib.nvmlInit_v2() }, SUCCESS);
    assert_eq!((count(0, 0), count(0, 1), count(1, 0)), (0, 5, 0));
    node.append_event("ecc-sbe 0");
    node.append_event("ecc-dbe 0");
    node.append_event("ecc-dbe 0");
    assert_eq!(
        (count(0, 0), count(0, 1), count(1, 0), count(1, 1)),
        (1, 6, 2, 2)
    );
    let mut major: c_int = 0;
    // SAFETY: nvml.h prototypes; NULL `minor` is the case under test.
    unsafe {
        assert_eq!(
            lib.nvmlDeviceGetCudaComputeCapability(handle(&lib, 0), &mut major, ptr::null_mut()),
            INVALID_ARGUMENT
        );
        assert_eq!(lib.nvmlShutdown(), SUCCESS);
    }
}

#[test]
fn cpu_affinity_fills_the_whole_array() {
    let node = SimNode::from_json(&node_json(&[gpu_json(0, r#""cpu_affinity": "0-3,200""#)]));
    let lib = raw(&node);
    let mut words = vec![u64::MAX; 300];
    // SAFETY: nvml.h prototypes; `words` holds the 300 elements passed.
    unsafe {
        assert_eq!(lib.nvmlInit_v2(), SUCCESS);
        assert_eq!(
            lib.nvmlDeviceGetCpuAffinity(handle(&lib, 0), 300, words.as_mut_ptr()),
            SUCCESS
        );
        assert_eq!(lib.nvmlShutdown(), SUCCESS);
    }
    assert_eq!((words[0], words[3]), (0xF, 1 << 8));
    assert!(
        words
            .iter()
            .enumerate()
            .all(|(i, w)| i == 0 || i == 3 || *w == 0),
        "the rest is zeroed"
    );
}

/// `random_failures`: init fails as asked and initialises nothing (the next try draws anew);
/// other calls fail at about the asked rate with the listed errors, the same seed giving the
/// same failures and another seed others.
#[test]
fn random_failures_are_seeded_and_at_the_asked_rate() {
    const DRIVER_NOT_LOADED: u32 = b::nvmlReturn_enum_NVML_ERROR_DRIVER_NOT_LOADED;
    const UNKNOWN: u32 = b::nvmlReturn_enum_NVML_ERROR_UNKNOWN;
    let flaky = |seed: u64, init: f64, calls: f64| {
        SimNode::from_json(&format!(
            r#"{{ "driver_version": "550.54.14", "cuda_driver_version": "12.4",
                 "random_failures": {{ "seed": {seed},
                   "init": {{ "probability": {init}, "errors": ["NVML_ERROR_DRIVER_NOT_LOADED"] }},
                   "calls": {{ "probability": {calls}, "errors": ["NVML_ERROR_UNKNOWN", "NVML_ERROR_GPU_IS_LOST"] }} }},
                 "gpus": [{}] }}"#,
            gpu_json(0, "")
        ))
    };
    let node = flaky(1, 1.0, 0.0);
    let lib = raw(&node);
    let mut n = 0;
    // SAFETY: nvml.h prototypes via nvml-wrapper-sys; `n` is a live local.
    unsafe {
        assert_eq!(lib.nvmlInit_v2(), DRIVER_NOT_LOADED);
        assert_eq!(lib.nvmlInitWithFlags(0), DRIVER_NOT_LOADED);
        assert_eq!(lib.nvmlDeviceGetCount_v2(&mut n), UNINITIALIZED);
    }
    let half = flaky(5, 0.5, 0.0);
    let lib = raw(&half);
    // SAFETY: as above.
    let inits: Vec<u32> = (0..40)
        .map(|_| unsafe {
            let rc = lib.nvmlInit_v2();
            if rc == SUCCESS {
                assert_eq!(lib.nvmlShutdown(), SUCCESS);
            }
            rc
        })
        .collect();
    assert!(
        inits.contains(&SUCCESS) && inits.contains(&DRIVER_NOT_LOADED),
        "a failed init is tried again with a new draw: {inits:?}"
    );
    let pattern = |seed: u64| -> Vec<u32> {
        let node = flaky(seed, 0.0, 0.25);
        let lib = raw(&node);
        // SAFETY: as above; each call writes the count into a live local.
        unsafe {
            assert_eq!(lib.nvmlInit_v2(), SUCCESS);
            let codes = (0..400)
                .map(|_| {
                    let mut n = 0;
                    lib.nvmlDeviceGetCount_v2(&mut n)
                })
                .collect();
            assert_eq!(
                lib.nvmlShutdown(),
                SUCCESS,
                "shutdown never fails at random"
            );
            codes
        }
    };
    let (a, b, c) = (pattern(7), pattern(7), pattern(8));
    assert_eq!(a, b, "the same seed gives the same failures");
    assert_ne!(a, c, "another seed gives others");
    let failed = a.iter().filter(|&&rc| rc != SUCCESS).count();
    assert!(
        (60..=140).contains(&failed),
        "{failed} of 400 calls failed at a probability of 0.25"
    );
    assert!(a.contains(&UNKNOWN) && a.contains(&GPU_IS_LOST), "{a:?}");
    assert!(
        a.iter()
            .all(|&rc| [SUCCESS, UNKNOWN, GPU_IS_LOST].contains(&rc)),
        "{a:?}"
    );
}
