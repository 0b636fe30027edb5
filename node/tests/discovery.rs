//! Discovery against nvml-sim, loaded through nvml-wrapper's dynamic loading exactly as a real
//! `libnvidia-ml.so.1` would be: every inventory field and topology link of the shipped nodes,
//! lost GPUs, missing topology data, injected NVML failures and hosts without a driver.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

use mesos_gpu_node::usage::GpuReadings;
use mesos_gpu_node::{
    discovery::Discovery, discovery::DiscoveryError, discovery::GpuDriver, discovery::UNKNOWN_MINOR,
};
use mesos_gpu_node::{inventory::Inventory, inventory::Link, inventory::PcieLevel};
use mesos_gpu_testkit::nodes::{NodeBuilder, dgx1_v100, dual_dgx1_v100};
use mesos_gpu_testkit::nvml_sim::SimNode;
use serde_json::{Value, json};

fn shipped_json(name: &str) -> Value {
    let (_, text) = nvml_sim::TOPOLOGIES
        .iter()
        .find(|(n, _)| *n == name)
        .expect("shipped topology");
    serde_json::from_str(text).expect("shipped JSON")
}

fn open(node: &SimNode) -> GpuDriver {
    match GpuDriver::open(Some(&node.lib_path())).expect("discovery") {
        Discovery::Driver(driver) => *driver,
        Discovery::NoDriver(inv) => panic!("no driver: {:?}", inv.absent_reason),
    }
}

/// The link matrix as `nvidia-smi topo -m` labels, `X` on the diagonal.
fn labels(inv: &Inventory) -> Vec<Vec<String>> {
    let n = inv.gpus.len();
    assert_eq!(inv.topology.size(), n);
    (0..n)
        .map(|a| {
            (0..n)
                .map(|b| {
                    if a == b {
                        "X".into()
                    } else {
                        inv.topology.get(a, b).label()
                    }
                })
                .collect()
        })
        .collect()
}

fn matrix(rows: &[&str]) -> Vec<Vec<String>> {
    rows.iter()
        .map(|r| r.split_whitespace().map(str::to_owned).collect())
        .collect()
}

/// "0-19,40-59" → the CPU numbers.
fn cpu_list(text: &str) -> Vec<u32> {
    let mut cpus = Vec::new();
    for part in text.split(',') {
        match part.split_once('-') {
            Some((a, b)) => cpus.extend(a.parse::<u32>().unwrap()..=b.parse::<u32>().unwrap()),
            None => cpus.push(part.parse().unwrap()),
        }
    }
    cpus
}

/// Every GPU field and the driver against the node description the sim was given.
fn check_fields(name: &str, driver: &GpuDriver) {
    let spec = shipped_json(name);
    let inv = driver.inventory();
    let d = inv.driver.as_ref().expect("driver info");
    assert_eq!(
        d.version,
        spec["driver_version"].as_str().unwrap(),
        "{name}"
    );
    let (major, minor) = spec["cuda_driver_version"]
        .as_str()
        .unwrap()
        .split_once('.')
        .unwrap();
    assert_eq!(
        d.cuda_version,
        Some((major.parse().unwrap(), minor.parse().unwrap())),
        "{name}"
    );
    let gpus = spec["gpus"].as_array().unwrap();
    assert_eq!(inv.gpus.len(), gpus.len(), "{name}");
    for (pos, (gpu, s)) in inv.gpus.iter().zip(gpus).enumerate() {
        let what = format!("{name} GPU {pos}");
        assert_eq!(u64::from(gpu.index), s["index"].as_u64().unwrap(), "{what}");
        assert_eq!(u64::from(gpu.minor), s["minor"].as_u64().unwrap(), "{what}");
        assert_eq!(gpu.uuid, s["uuid"].as_str().unwrap(), "{what}");
        assert_eq!(gpu.name, s["name"].as_str().unwrap(), "{what}");
        assert_eq!(
            gpu.memory_total,
            s["memory"]["total"].as_u64().unwrap(),
            "{what}"
        );
        assert_eq!(
            gpu.pci_bus_id,
            s["pci"]["bus_id"].as_str().unwrap(),
            "{what}"
        );
        assert_eq!(
            gpu.numa_node.map(u64::from),
            s["numa_node"].as_u64(),
            "{what}"
        );
        let cc = s["compute_capability"].as_str().map(|cc| {
            let (a, b) = cc.split_once('.').unwrap();
            (a.parse().unwrap(), b.parse().unwrap())
        });
        assert_eq!(gpu.compute_capability, cc, "{what}");
        assert!(gpu.healthy, "{what}");
        assert_eq!(
            driver.cpu_affinity(pos).map(<[u32]>::to_vec),
            s["cpu_affinity"].as_str().map(cpu_list),
            "{what}"
        );
    }
    assert_eq!(inv.absent_reason, None, "{name}");
    assert!(inv.by_uuid(&inv.gpus[0].uuid).is_some());
}

const DGX1: [&str; 8] = [
    "X   NV1 NV1 NV2 NV2 SYS SYS SYS",
    "NV1 X   NV2 NV1 SYS NV2 SYS SYS",
    "NV1 NV2 X   NV2 SYS SYS NV1 SYS",
    "NV2 NV1 NV2 X   SYS SYS SYS NV1",
    "NV2 SYS SYS SYS X   NV1 NV1 NV2",
    "SYS NV2 SYS SYS NV1 X   NV2 NV1",
    "SYS SYS NV1 SYS NV1 NV2 X   NV2",
    "SYS SYS SYS NV1 NV2 NV1 NV2 X",
];

#[test]
fn dgx1_v100_matches_nvidias_hybrid_cube_mesh() {
    let node = SimNode::shipped("dgx1-v100");
    let driver = open(&node);
    check_fields("dgx1-v100", &driver);
    assert_eq!(labels(driver.inventory()), matrix(&DGX1));
    let topology = &driver.inventory().topology;
    assert_eq!(
        topology.get(0, 3),
        Link::pcie(PcieLevel::HostBridge).with_nvlinks(2)
    );
    assert_eq!(topology.pair_score(0, 3), 230);
    assert_eq!(topology.pair_score(0, 5), 10);
}

/// Every pair's PCIe level and NVLink count, as one comparable matrix.
fn links(inv: &Inventory) -> Vec<Vec<Link>> {
    let n = inv.topology.size();
    (0..n)
        .map(|a| (0..n).map(|b| inv.topology.get(a, b)).collect())
        .collect()
}

/// Regression (issue 15): an NVLinked pair lost its PCIe level, so its score missed the PCIe
/// points NVIDIA's allocator adds. Discovery now keeps both, for every pair of the shipped
/// cube-mesh nodes, equal to the reference nodes the allocator tests use.
#[test]
fn every_pair_keeps_its_pcie_level_and_nvlinks() {
    let expected: [(&str, NodeBuilder); 2] =
        [("dgx1-v100", dgx1_v100()), ("hgx16", dual_dgx1_v100())];
    for (name, builder) in expected {
        let node = SimNode::shipped(name);
        let inv = open(&node).inventory().clone();
        assert_eq!(links(&inv), links(&builder.inventory()), "{name}");
    }
}

/// NVSwitch pairs keep their PCIe level too: same leaf pair `PXB`, same socket `NODE`, else `SYS`.
#[test]
fn nvswitch_pairs_keep_their_pcie_level() {
    let node = SimNode::shipped("dgx-a100");
    let inv = open(&node).inventory().clone();
    let expected = NodeBuilder::new(8, PcieLevel::CrossSocket)
        .pcie(PcieLevel::SameNumaNode, &[0, 1, 2, 3])
        .pcie(PcieLevel::SameNumaNode, &[4, 5, 6, 7])
        .pcie(PcieLevel::MultipleSwitches, &[0, 1])
        .pcie(PcieLevel::MultipleSwitches, &[2, 3])
        .pcie(PcieLevel::MultipleSwitches, &[4, 5])
        .pcie(PcieLevel::MultipleSwitches, &[6, 7])
        .nvlinks(
            &(0..8)
                .flat_map(|a| ((a + 1)..8).map(move |b| (a, b, 12)))
                .collect::<Vec<_>>(),
        );
    assert_eq!(links(&inv), links(&expected.inventory()));
    assert_eq!(inv.topology.pair_score(0, 1), 1240);
    assert_eq!(inv.topology.pair_score(0, 7), 1210);
}

#[test]
fn dgx_a100_nvswitch_fabric_joins_every_pair_with_twelve_links() {
    let node = SimNode::shipped("dgx-a100");
    let driver = open(&node);
    check_fields("dgx-a100", &driver);
    let inv = driver.inventory();
    for a in 0..8 {
        for b in (0..8).filter(|&b| b != a) {
            assert_eq!(inv.topology.get(a, b).nvlinks, 12, "{a}-{b}");
        }
    }
}

#[test]
fn pcie_t4x4_switches_and_sockets() {
    let node = SimNode::shipped("pcie-t4x4");
    let driver = open(&node);
    check_fields("pcie-t4x4", &driver);
    assert_eq!(
        labels(driver.inventory()),
        matrix(&[
            "X PIX SYS SYS",
            "PIX X SYS SYS",
            "SYS SYS X PIX",
            "SYS SYS PIX X"
        ])
    );
}

#[test]
fn k80_boards_and_minors_that_differ_from_indices() {
    let node = SimNode::shipped("k80");
    let driver = open(&node);
    check_fields("k80", &driver);
    let inv = driver.inventory();
    let minors: Vec<u32> = inv.gpus.iter().map(|g| g.minor).collect();
    assert_eq!(minors, [2, 3, 0, 1]);
    assert!(
        inv.gpus.iter().all(|g| g.numa_node.is_none()),
        "k80 description gives no NUMA node"
    );
    assert_eq!(
        labels(inv),
        matrix(&[
            "X PSB PHB PHB",
            "PSB X PHB PHB",
            "PHB PHB X PSB",
            "PHB PHB PSB X"
        ])
    );
}

#[test]
fn hgx16_two_boards_across_sockets() {
    let node = SimNode::shipped("hgx16");
    let driver = open(&node);
    check_fields("hgx16", &driver);
    let got = labels(driver.inventory());
    let dgx1 = matrix(&DGX1);
    for a in 0..16 {
        for b in 0..16 {
            let want = if a / 8 == b / 8 {
                dgx1[a % 8][b % 8].clone()
            } else {
                "SYS".to_owned()
            };
            assert_eq!(got[a][b], want, "{a}-{b}");
        }
    }
}

#[test]
fn driver_without_gpus() {
    let node = SimNode::shipped("driver-no-gpus");
    let driver = open(&node);
    let inv = driver.inventory();
    assert!(inv.gpus.is_empty());
    assert_eq!(inv.topology.size(), 0);
    assert_eq!(
        inv.driver.as_ref().map(|d| d.version.as_str()),
        Some("550.54.14")
    );
    assert_eq!(
        inv.absent_reason.as_deref(),
        Some("NVIDIA driver 550.54.14 reports no GPUs")
    );
}

#[test]
fn every_shipped_topology_opens() {
    for (name, _) in nvml_sim::TOPOLOGIES {
        let node = SimNode::shipped(name);
        let driver = open(&node);
        assert_eq!(driver.lib_path(), node.lib_path(), "{name}");
        let gpus = &driver.inventory().gpus;
        assert!(
            gpus.iter()
                .all(|gpu| GpuReadings::read(&driver, gpu).memory_total.is_some()),
            "{name}: the session stays usable"
        );
    }
}

fn with_gpu(name: &str, index: usize, key: &str, value: Value) -> SimNode {
    let mut spec = shipped_json(name);
    spec["gpus"][index][key] = value;
    SimNode::from_json(&spec.to_string())
}

#[test]
fn lost_gpu_is_listed_unhealthy_with_its_index() {
    let node = with_gpu("dgx1-v100", 3, "lost", json!(true));
    let driver = open(&node);
    let inv = driver.inventory();
    assert_eq!(inv.gpus.len(), 8);
    let lost = &inv.gpus[3];
    assert_eq!(
        (lost.index, lost.minor, lost.healthy),
        (3, UNKNOWN_MINOR, false)
    );
    assert!(lost.uuid.is_empty() && lost.name.is_empty() && lost.pci_bus_id.is_empty());
    assert!(inv.gpus.iter().filter(|g| g.index != 3).all(|g| g.healthy));
    for other in (0..8).filter(|&o| o != 3) {
        assert_eq!(inv.topology.get(3, other), Link::UNKNOWN, "3-{other}");
        assert_eq!(inv.topology.get(other, 3), Link::UNKNOWN, "{other}-3");
    }
    assert_eq!(
        inv.topology.get(0, 1),
        Link::pcie(PcieLevel::SingleSwitch).with_nvlinks(1)
    );
    assert_eq!(
        inv.topology.get(1, 5),
        Link::pcie(PcieLevel::CrossSocket).with_nvlinks(2)
    );
    assert_eq!(driver.cpu_affinity(3), None);
}

#[test]
fn gpu_lost_midway_keeps_what_was_read() {
    let node = with_gpu(
        "pcie-t4x4",
        2,
        "fail",
        json!({"nvmlDeviceGetUUID": "NVML_ERROR_GPU_IS_LOST"}),
    );
    let inv = open(&node).inventory().clone();
    let gpu = &inv.gpus[2];
    assert_eq!(
        (gpu.minor, gpu.healthy, gpu.uuid.as_str(), gpu.name.as_str()),
        (2, false, "", "Tesla T4")
    );
    assert_eq!(inv.topology.get(2, 3), Link::UNKNOWN);
    assert_eq!(inv.topology.get(0, 1), Link::pcie(PcieLevel::SingleSwitch));
}

#[test]
fn missing_topology_data_is_unknown() {
    let mut spec = shipped_json("pcie-t4x4");
    for gpu in spec["gpus"].as_array_mut().unwrap() {
        let gpu = gpu.as_object_mut().unwrap();
        for key in ["pcie", "numa_node", "cpu_affinity", "compute_capability"] {
            gpu.remove(key);
        }
    }
    let node = SimNode::from_json(&spec.to_string());
    let driver = open(&node);
    let inv = driver.inventory();
    assert_eq!(
        labels(inv),
        matrix(&["X ? ? ?", "? X ? ?", "? ? X ?", "? ? ? X"])
    );
    for (pos, gpu) in inv.gpus.iter().enumerate() {
        assert!(gpu.healthy && gpu.numa_node.is_none() && gpu.compute_capability.is_none());
        assert_eq!(driver.cpu_affinity(pos), None);
    }
}

#[test]
fn unsupported_queries_leave_fields_unknown() {
    let fails = json!({
        "nvmlDeviceGetNumaNodeId": "NVML_ERROR_NOT_SUPPORTED",
        "nvmlDeviceGetMemoryInfo_v2": "NVML_ERROR_NOT_SUPPORTED",
        "nvmlDeviceGetTopologyCommonAncestor": "NVML_ERROR_NOT_SUPPORTED",
        "nvmlDeviceGetCpuAffinity": "NVML_ERROR_UNKNOWN",
    });
    let node = with_gpu("pcie-t4x4", 0, "fail", fails);
    let driver = open(&node);
    let inv = driver.inventory();
    let gpu = &inv.gpus[0];
    assert!(gpu.healthy);
    assert_eq!((gpu.numa_node, gpu.memory_total), (None, 0));
    assert_eq!(driver.cpu_affinity(0), None);
    assert_eq!(inv.topology.get(0, 1), Link::UNKNOWN);
    assert_eq!(inv.topology.get(2, 3), Link::pcie(PcieLevel::SingleSwitch));
}

#[test]
fn nvlink_read_on_one_side_counts_for_both() {
    let node = with_gpu(
        "dgx1-v100",
        0,
        "fail",
        json!({"nvmlDeviceGetNvLinkState": "NVML_ERROR_UNKNOWN"}),
    );
    let inv = open(&node).inventory().clone();
    assert_eq!(labels(&inv), matrix(&DGX1));
}

#[test]
fn a_gpu_that_cannot_be_enumerated_is_an_error() {
    let node = with_gpu(
        "k80",
        1,
        "fail",
        json!({"nvmlDeviceGetMinorNumber": "NVML_ERROR_UNKNOWN"}),
    );
    let err = GpuDriver::open(Some(&node.lib_path())).expect_err("broken GPU");
    assert!(
        matches!(
            err,
            DiscoveryError::Gpu {
                index: 1,
                what: "minor number",
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(err.to_string(), "cannot read the minor number of GPU 1");
}

fn with_node_fail(fails: Value) -> SimNode {
    let mut spec = shipped_json("pcie-t4x4");
    spec["fail"] = fails;
    SimNode::from_json(&spec.to_string())
}

#[test]
fn driver_not_loaded_means_no_gpus() {
    let error = "NVML_ERROR_DRIVER_NOT_LOADED";
    let node = with_node_fail(json!({"nvmlInit_v2": error, "nvmlInitWithFlags": error}));
    let found = GpuDriver::open(Some(&node.lib_path())).expect("not an error");
    assert!(found.driver().is_none());
    let reason = found.inventory().absent_reason.clone().expect("reason");
    assert!(reason.starts_with("NVIDIA driver not loaded: "), "{reason}");
}

#[test]
fn broken_driver_is_an_error() {
    let error = "NVML_ERROR_LIB_RM_VERSION_MISMATCH";
    let node = with_node_fail(json!({"nvmlInit_v2": error, "nvmlInitWithFlags": error}));
    let err = GpuDriver::open(Some(&node.lib_path())).expect_err("broken driver");
    assert!(matches!(err, DiscoveryError::Init { .. }), "{err}");
    assert!(
        err.to_string().starts_with("cannot initialise NVML from /"),
        "{err}"
    );
    let node = with_node_fail(json!({"nvmlDeviceGetCount_v2": "NVML_ERROR_UNKNOWN"}));
    let err = GpuDriver::open(Some(&node.lib_path())).expect_err("count fails");
    assert!(
        matches!(
            err,
            DiscoveryError::System {
                what: "GPU count",
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn a_named_library_that_is_missing_is_an_error() {
    // Only a missing *default* library means "no GPUs" (issue 14): a named one is an error.
    let err = GpuDriver::open(Some(Path::new("/nonexistent/libnvidia-ml.so.1")))
        .expect_err("a named library that cannot be loaded");
    assert!(matches!(err, DiscoveryError::Load { .. }), "{err}");
    assert_eq!(
        err.to_string(),
        "cannot load the NVML library /nonexistent/libnvidia-ml.so.1"
    );
}
