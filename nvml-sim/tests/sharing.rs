//! What GPU sharing and NUMA pinning read from NVML: compute mode get/set (shared by every
//! process through the runtime state file), per-process memory, CPU and memory affinity by
//! scope; each with its error cases, through nvml-wrapper as a client loads real NVML.
#![allow(clippy::unwrap_used)] // a failed unwrap fails the test at its line

mod common;

use std::ptr;

use common::{gpu_json, node_json, open, raw};
use mesos_gpu_testkit::nvml_sim::SimNode;
use nvml_wrapper::enum_wrappers::device::ComputeMode;
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper_sys::bindings as b;

const NODE: u32 = b::NVML_AFFINITY_SCOPE_NODE;
const SOCKET: u32 = b::NVML_AFFINITY_SCOPE_SOCKET;

fn bits(words: &[std::ffi::c_ulong]) -> Vec<u32> {
    (0..u32::try_from(words.len() * 64).unwrap())
        .filter(|&c| words[(c / 64) as usize] & (1 << (c % 64)) != 0)
        .collect()
}

#[test]
fn compute_mode_is_driver_state_seen_by_every_client() {
    let sim = SimNode::shipped("numa-2cpu");
    let first = open(&sim);
    let second = open(&sim);
    let mut dev = first.device_by_index(1).unwrap();
    assert_eq!(dev.compute_mode().unwrap(), ComputeMode::Default);
    dev.set_compute_mode(ComputeMode::ExclusiveProcess).unwrap();
    assert_eq!(dev.compute_mode().unwrap(), ComputeMode::ExclusiveProcess);
    assert_eq!(
        second.device_by_index(1).unwrap().compute_mode().unwrap(),
        ComputeMode::ExclusiveProcess
    );
    assert_eq!(
        first.device_by_index(0).unwrap().compute_mode().unwrap(),
        ComputeMode::Default,
        "other GPUs keep theirs"
    );
    // Another process (a new library instance reading the same state file) sees it too.
    first.shutdown().unwrap();
    second.shutdown().unwrap();
    let again = open(&sim);
    let mut dev = again.device_by_index(1).unwrap();
    assert_eq!(dev.compute_mode().unwrap(), ComputeMode::ExclusiveProcess);
    assert!(
        matches!(
            dev.set_compute_mode(ComputeMode::ExclusiveThread),
            Err(NvmlError::NotSupported)
        ),
        "EXCLUSIVE_THREAD support was removed"
    );
    dev.set_compute_mode(ComputeMode::Prohibited).unwrap();
    dev.set_compute_mode(ComputeMode::Default).unwrap();
    assert_eq!(dev.compute_mode().unwrap(), ComputeMode::Default);
    let state = std::fs::read_to_string(sim.state_path()).unwrap();
    assert!(state.contains("\"default\""), "{state}");
}

#[test]
fn compute_mode_errors() {
    let sim = SimNode::shipped("dgx-a100-mixed");
    let lib = raw(&sim);
    let mut mode = 99;
    // SAFETY: nvml.h prototypes; pointers are live locals; handles come from the library.
    unsafe {
        assert_eq!(lib.nvmlInit_v2(), 0);
        let mut whole = ptr::null_mut();
        let mut split = ptr::null_mut();
        let mut m = ptr::null_mut();
        assert_eq!(lib.nvmlDeviceGetHandleByIndex_v2(0, &mut whole), 0);
        assert_eq!(lib.nvmlDeviceGetHandleByIndex_v2(4, &mut split), 0);
        assert_eq!(lib.nvmlDeviceGetMigDeviceHandleByIndex(split, 0, &mut m), 0);
        assert_eq!(
            lib.nvmlDeviceSetComputeMode(whole, 4),
            b::nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT,
            "past NVML_COMPUTEMODE_COUNT"
        );
        assert_eq!(
            lib.nvmlDeviceGetComputeMode(whole, ptr::null_mut()),
            b::nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT
        );
        assert_eq!(
            lib.nvmlDeviceGetComputeMode(split, &mut mode),
            b::nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED,
            "with MIG on, the mode belongs to MIG devices"
        );
        assert_eq!(
            lib.nvmlDeviceSetComputeMode(split, 3),
            b::nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED
        );
        assert_eq!(lib.nvmlDeviceSetComputeMode(m, 3), 0);
        assert_eq!(lib.nvmlDeviceGetComputeMode(m, &mut mode), 0);
        assert_eq!(mode, 3);
        assert_eq!(lib.nvmlShutdown(), 0);
    }
    // Described modes, and injected failures.
    let node = node_json(&[
        gpu_json(0, r#""compute_mode": "prohibited""#),
        gpu_json(
            1,
            r#""fail": {"nvmlDeviceSetComputeMode": "NVML_ERROR_NO_PERMISSION"}"#,
        ),
    ]);
    let sim = SimNode::from_json(&node);
    let nvml = open(&sim);
    assert_eq!(
        nvml.device_by_index(0).unwrap().compute_mode().unwrap(),
        ComputeMode::Prohibited
    );
    assert!(matches!(
        nvml.device_by_index(1)
            .unwrap()
            .set_compute_mode(ComputeMode::ExclusiveProcess),
        Err(NvmlError::NoPermission)
    ));
    let err = nvml_sim::validate(&node_json(&[gpu_json(
        0,
        r#""compute_mode": "exclusive_thread""#,
    )]))
    .unwrap_err();
    assert!(format!("{err:?}").contains("exclusive_thread"), "{err:?}");
}

#[test]
fn per_process_memory_comes_from_the_state_file() {
    let sim = SimNode::shipped("numa-2cpu");
    let nvml = open(&sim);
    let dev = nvml.device_by_index(0).unwrap();
    assert!(dev.running_compute_processes().unwrap().is_empty());
    let uuid = dev.uuid().unwrap();
    sim.set_processes(&uuid, &[(4242, 1 << 30), (4343, 512 << 20)]);
    let got: Vec<(u32, u64)> = dev
        .running_compute_processes()
        .unwrap()
        .into_iter()
        .map(|p| match p.used_gpu_memory {
            UsedGpuMemory::Used(b) => (p.pid, b),
            UsedGpuMemory::Unavailable => panic!("memory unavailable"),
        })
        .collect();
    assert_eq!(got, [(4242, 1 << 30), (4343, 512 << 20)]);
    assert_eq!(dev.running_compute_processes_count().unwrap(), 2);
    assert!(
        nvml.device_by_index(1)
            .unwrap()
            .running_compute_processes()
            .unwrap()
            .is_empty()
    );
    // A GPU whose description has no process list gains one from the state file.
    let bare = SimNode::from_json(&node_json(&[gpu_json(0, "")]));
    let nvml = open(&bare);
    let dev = nvml.device_by_index(0).unwrap();
    assert!(matches!(
        dev.running_compute_processes(),
        Err(NvmlError::NotSupported)
    ));
    bare.set_processes(&dev.uuid().unwrap(), &[(7, 9)]);
    assert_eq!(dev.running_compute_processes().unwrap().len(), 1);
    // A broken state file is reported and ignored, not a crash.
    std::fs::write(bare.state_path(), "{not json").unwrap();
    assert!(matches!(
        dev.running_compute_processes(),
        Err(NvmlError::NotSupported)
    ));
}

#[test]
fn affinity_by_scope_matches_the_description() {
    let sim = SimNode::shipped("numa-2cpu");
    let nvml = open(&sim);
    for (index, cpu) in [(0u32, 0u32), (1, 1)] {
        let dev = nvml.device_by_index(index).unwrap();
        assert_eq!(bits(&dev.cpu_affinity(1).unwrap()), [cpu]);
        assert_eq!(
            bits(&dev.cpu_affinity_within_scope(1, NODE).unwrap()),
            [cpu]
        );
        assert_eq!(
            bits(&dev.cpu_affinity_within_scope(2, SOCKET).unwrap()),
            [0, 1]
        );
        assert_eq!(bits(&dev.memory_affinity(1, NODE).unwrap()), [0]);
        assert_eq!(bits(&dev.memory_affinity(1, SOCKET).unwrap()), [0]);
    }
    let h100 = SimNode::shipped("hgx-h100");
    let nvml = open(&h100);
    let dev = nvml.device_by_index(5).unwrap();
    assert_eq!(bits(&dev.memory_affinity(1, NODE).unwrap()), [1]);
    let cpus = bits(&dev.cpu_affinity_within_scope(4, NODE).unwrap());
    assert_eq!(cpus.len(), 112);
    assert_eq!((cpus[0], cpus[55], cpus[56]), (56, 111, 168));
    // A description without memory_affinity reports numa_node; without socket_affinity the
    // socket scope falls back to the node scope, as NVML falls back to the nearest ancestor.
    let a100 = SimNode::shipped("dgx-a100");
    let nvml = open(&a100);
    let dev = nvml.device_by_index(6).unwrap();
    assert_eq!(bits(&dev.memory_affinity(1, SOCKET).unwrap()), [1]);
    assert_eq!(
        dev.cpu_affinity_within_scope(4, SOCKET).unwrap(),
        dev.cpu_affinity(4).unwrap()
    );
}

#[test]
fn affinity_errors() {
    let sim = SimNode::from_json(&node_json(&[gpu_json(0, "")]));
    let nvml = open(&sim);
    let dev = nvml.device_by_index(0).unwrap();
    assert!(matches!(
        dev.memory_affinity(1, NODE),
        Err(NvmlError::NotSupported)
    ));
    assert!(matches!(
        dev.cpu_affinity_within_scope(1, SOCKET),
        Err(NvmlError::NotSupported)
    ));
    let numa = SimNode::shipped("numa-2cpu");
    let nvml = open(&numa);
    let dev = nvml.device_by_index(0).unwrap();
    assert!(matches!(
        dev.cpu_affinity_within_scope(1, 2),
        Err(NvmlError::InvalidArg)
    ));
    assert!(matches!(
        dev.memory_affinity(1, 7),
        Err(NvmlError::InvalidArg)
    ));
    let lib = raw(&numa);
    let mut word = 0;
    // SAFETY: nvml.h prototypes; `word` is a live local of one unsigned long.
    unsafe {
        assert_eq!(lib.nvmlInit_v2(), 0);
        let mut h = ptr::null_mut();
        assert_eq!(lib.nvmlDeviceGetHandleByIndex_v2(1, &mut h), 0);
        assert_eq!(
            lib.nvmlDeviceGetMemoryAffinity(h, 0, &mut word, NODE),
            b::nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT,
            "nodeSetSize == 0"
        );
        assert_eq!(
            lib.nvmlDeviceGetCpuAffinityWithinScope(h, 1, ptr::null_mut(), NODE),
            b::nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT
        );
        assert_eq!(
            lib.nvmlDeviceGetCpuAffinityWithinScope(h, 1, &mut word, NODE),
            0
        );
        assert_eq!(word, 0b10);
        assert_eq!(lib.nvmlShutdown(), 0);
    }
    for (extra, needle) in [
        (
            r#""memory_affinity": "2-1""#,
            "gpu 0 memory_affinity = \"2-1\"",
        ),
        (
            r#""cpu_affinity": "0-3", "socket_affinity": {"cpus": "0-1", "memory": "0"}"#,
            "superset of cpu_affinity",
        ),
        (
            r#""memory_affinity": "0,1", "socket_affinity": {"cpus": "0", "memory": "1"}"#,
            "superset of memory_affinity",
        ),
        (r#""memory_affinity": "1024""#, "numbers up to 1023"),
    ] {
        let err = nvml_sim::validate(&node_json(&[gpu_json(0, extra)]))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(needle),
            "{extra}: expected {needle:?} in {err:?}"
        );
    }
}
