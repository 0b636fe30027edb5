//! nvml-sim: a stand-in `libnvidia-ml.so` that simulates a GPU node from a JSON description.
//!
//! Built as a cdylib it exports NVML's C functions under their real (versioned) symbol names,
//! with NVML's struct layouts and return codes, so any NVML client loading it through
//! `dlopen` (nvml-wrapper, go-nvml, pynvml, C) sees a consistent node: identity, PCIe and
//! NVLink topology, telemetry, injected faults and XID/ECC events read from a growing file.
//! `README.md` in this crate documents the node description and the events file.
//!
//! As an rlib it offers safe Rust only: the shipped node descriptions ([`TOPOLOGIES`]), a
//! validator for descriptions ([`validate`]), the `/proc` files the driver would provide for a
//! node ([`driver_files`]) and the runtime state file ([`runtime`]).
#![warn(unreachable_pub, missing_docs)]

pub mod abi;
pub mod api;
mod config;
pub mod driver_files;
mod events;
mod failable;
mod fields;
mod mig;
mod node;
pub mod runtime;
mod state;
mod status;

pub use config::{ConfigError, validate};

/// Node descriptions shipped in `nvml-sim/topologies/`: (name without `.json`, JSON text).
pub const TOPOLOGIES: &[(&str, &str)] = &[
    ("dgx-a100", include_str!("../topologies/dgx-a100.json")),
    ("dgx1-v100", include_str!("../topologies/dgx1-v100.json")),
    ("pcie-t4x4", include_str!("../topologies/pcie-t4x4.json")),
    ("k80", include_str!("../topologies/k80.json")),
    ("hgx16", include_str!("../topologies/hgx16.json")),
    (
        "driver-no-gpus",
        include_str!("../topologies/driver-no-gpus.json"),
    ),
    (
        "dgx-a100-mig",
        include_str!("../topologies/dgx-a100-mig.json"),
    ),
    (
        "dgx-a100-mixed",
        include_str!("../topologies/dgx-a100-mixed.json"),
    ),
    ("hgx-h100", include_str!("../topologies/hgx-h100.json")),
    ("numa-2cpu", include_str!("../topologies/numa-2cpu.json")),
];

/// The environment variable naming the node description file, read at the first `nvmlInit*`.
pub const CONFIG_ENV: &str = state::CONFIG_ENV;

/// The node description file looked for beside the loaded library when [`CONFIG_ENV`] is unset.
pub const CONFIG_FILE: &str = state::CONFIG_FILE;

/// The environment variable seeding the description's `random_failures` (a whole number),
/// instead of its `seed`.
pub const SEED_ENV: &str = state::SEED_ENV;

#[cfg(test)]
mod tests {
    use super::*;
    use mesos_gpu_os::error_chain;

    #[test]
    fn the_readme_example_is_valid() {
        let readme = include_str!("../README.md");
        let start = readme
            .find("## Full example")
            .and_then(|i| readme[i..].find("```json\n").map(|j| i + j + 8));
        let json = start.and_then(|s| readme[s..].find("```").map(|e| &readme[s..s + e]));
        let json = json.unwrap_or_else(|| panic!("README has no full example"));
        if let Err(e) = validate(json) {
            panic!("README example: {}", error_chain(&e));
        }
    }

    #[test]
    fn the_readme_mig_example_is_valid() {
        let readme = include_str!("../README.md");
        let start = readme
            .find("Example (a 3g.20gb")
            .and_then(|i| readme[i..].find("```json\n").map(|j| i + j + 8));
        let mig = start.and_then(|s| readme[s..].find("```").map(|e| &readme[s..s + e]));
        let mig = mig.unwrap_or_else(|| panic!("README has no MIG example"));
        let node = format!(
            r#"{{"driver_version": "550.54.14", "cuda_driver_version": "12.4", "gpus": [{{
                "index": 0, "minor": 0, "uuid": "GPU-2a4af22f-b062-5764-b45c-719582e82505",
                "name": "NVIDIA A100-SXM4-40GB", "brand": "nvidia",
                "pci": {{"bus_id": "00000000:07:00.0"}}, "memory": {{"total": 42949672960}},
                "mig": {mig}}}]}}"#
        );
        if let Err(e) = validate(&node) {
            panic!("README MIG example: {}", error_chain(&e));
        }
    }

    #[test]
    fn every_shipped_topology_is_valid() {
        for (name, json) in TOPOLOGIES {
            if let Err(e) = validate(json) {
                panic!("{name}: {}", error_chain(&e));
            }
        }
    }
}
