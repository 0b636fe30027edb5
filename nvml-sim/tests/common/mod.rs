//! Helpers shared by the integration tests: loading a SimNode the way NVML clients do, and
//! small node descriptions.
#![allow(clippy::unwrap_used)] // a failed unwrap fails the test at its line
#![allow(dead_code, unreachable_pub)] // each test target uses a different subset

use mesos_gpu_testkit::nvml_sim::SimNode;
use nvml_wrapper::Nvml;
use nvml_wrapper_sys::bindings::NvmlLib;

/// Initialises NVML from the node's library, as any nvml-wrapper client would.
pub fn open(node: &SimNode) -> Nvml {
    let lib = node.lib_path();
    Nvml::builder()
        .lib_path(lib.as_os_str())
        .init()
        .unwrap_or_else(|e| panic!("init {}: {e}", lib.display()))
}

/// The node's library with NVIDIA's prototypes (nvml-wrapper-sys), for raw calls.
pub fn raw(node: &SimNode) -> NvmlLib {
    // SAFETY: loading runs the library's initialisers; libnvml_sim.so has none beyond Rust's
    // own, and every symbol is looked up with the prototype nvml.h gives it.
    unsafe { NvmlLib::new(node.lib_path()) }.expect("load the sim")
}

/// One GPU's description with the given index; `extra` is spliced in as more fields.
pub fn gpu_json(index: u32, extra: &str) -> String {
    let sep = if extra.is_empty() { "" } else { "," };
    format!(
        r#"{{
            "index": {index}, "minor": {minor}, "uuid": "GPU-00000000-0000-4000-8000-{index:012x}",
            "name": "Tesla V100-SXM2-16GB", "brand": "tesla", "serial": "03236170000{index:02}",
            "pci": {{ "bus_id": "00000000:{bus:02X}:00.0", "device_id": "0x1DB110DE" }},
            "memory": {{ "total": 17179869184, "used": 1048576 }}{sep}{extra}
        }}"#,
        minor = index + 10,
        bus = index + 4
    )
}

/// A node of the given GPU descriptions.
pub fn node_json(gpus: &[String]) -> String {
    format!(
        r#"{{ "driver_version": "550.54.14", "cuda_driver_version": "12.4", "gpus": [{}] }}"#,
        gpus.join(",")
    )
}

/// A node of `count` plain GPUs.
pub fn plain_node(count: u32) -> SimNode {
    SimNode::from_json(&node_json(
        &(0..count).map(|i| gpu_json(i, "")).collect::<Vec<_>>(),
    ))
}
