//! Every field of every shipped topology, read back through nvml-wrapper exactly as a client
//! loads real NVML, compared with the JSON file; and the DGX-1 V100 NVLink/PCIe answers compared
//! with the reference table (`docs/reference/topology.md` §3).
#![allow(clippy::unwrap_used)] // a failed unwrap fails the test at its line

mod common;

use std::collections::BTreeMap;

use mesos_gpu_testkit::nodes::DGX1_V100_NVLINKS;
use mesos_gpu_testkit::nvml_sim::SimNode;
use nvml_wrapper::bitmasks::InitFlags;
use nvml_wrapper::enum_wrappers::device::{
    EccCounter, MemoryError, TemperatureSensor, TopologyLevel,
};
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::{Device, Nvml};
use serde_json::Value;

fn text(v: &Value) -> &str {
    v.as_str()
        .unwrap_or_else(|| panic!("expected a string, got {v}"))
}

fn num(v: &Value) -> u64 {
    v.as_u64()
        .unwrap_or_else(|| panic!("expected a number, got {v}"))
}

fn hex(v: &Value) -> u32 {
    u32::from_str_radix(text(v).trim_start_matches("0x"), 16).expect("hex id")
}

fn cpus(list: &str) -> Vec<u32> {
    let mut out = Vec::new();
    for part in list.split(',') {
        match part.split_once('-') {
            Some((lo, hi)) => out.extend(lo.parse::<u32>().unwrap()..=hi.parse().unwrap()),
            None => out.push(part.parse().unwrap()),
        }
    }
    out
}

/// The level the README's rules give for two GPU descriptions.
fn expected_level(a: &Value, b: &Value) -> TopologyLevel {
    if a.get("board").is_some() && a.get("board") == b.get("board") {
        return TopologyLevel::Internal;
    }
    let (pa, pb) = (&a["pcie"], &b["pcie"]);
    if pa["socket"] != pb["socket"] {
        return TopologyLevel::System;
    }
    if pa["host_bridge"] != pb["host_bridge"] {
        return TopologyLevel::Node;
    }
    let sa = pa["switches"].as_array().unwrap();
    let sb = pb["switches"].as_array().unwrap();
    let shared = sa.iter().zip(sb).take_while(|(x, y)| x == y).count();
    match shared {
        0 => TopologyLevel::HostBridge,
        n if n == sa.len() && n == sb.len() => TopologyLevel::Single,
        _ => TopologyLevel::Multiple,
    }
}

/// Active NVLinks of a device, counted per remote PCI bus id.
fn nvlinks_by_remote(dev: &Device<'_>) -> BTreeMap<String, u32> {
    let mut out = BTreeMap::new();
    for link in 0..18 {
        let wrapper = dev.link_wrapper_for(link);
        match wrapper.is_active() {
            Ok(true) => {
                *out.entry(wrapper.remote_pci_info().expect("remote pci").bus_id)
                    .or_insert(0) += 1
            }
            Ok(false) => {}
            Err(NvmlError::NotSupported) => {}
            Err(e) => panic!("link {link}: {e}"),
        }
    }
    out
}

fn check_gpu(nvml: &Nvml, node: &Value, g: &Value) {
    let index = u32::try_from(num(&g["index"])).unwrap();
    let dev = nvml.device_by_index(index).expect("handle by index");
    let ctx = format!("GPU {index}");
    assert_eq!(dev.index().unwrap(), index, "{ctx}");
    assert_eq!(
        u64::from(dev.minor_number().unwrap()),
        num(&g["minor"]),
        "{ctx}"
    );
    assert_eq!(dev.uuid().unwrap(), text(&g["uuid"]), "{ctx}");
    assert_eq!(dev.name().unwrap(), text(&g["name"]), "{ctx}");
    let brand = format!("{:?}", dev.brand().unwrap()).to_lowercase();
    assert_eq!(brand, text(&g["brand"]).replace('_', ""), "{ctx}");
    match g.get("serial") {
        Some(s) => assert_eq!(dev.serial().unwrap(), text(s), "{ctx}"),
        None => assert!(
            matches!(dev.serial(), Err(NvmlError::NotSupported)),
            "{ctx}"
        ),
    }

    let pci = dev.pci_info().unwrap();
    assert_eq!(pci.bus_id, text(&g["pci"]["bus_id"]), "{ctx}");
    let parts: Vec<u32> = pci
        .bus_id
        .split([':', '.'])
        .map(|p| u32::from_str_radix(p, 16).unwrap())
        .collect();
    assert_eq!(
        (pci.domain, pci.bus, pci.device),
        (parts[0], parts[1], parts[2]),
        "{ctx}"
    );
    assert_eq!(pci.pci_device_id, hex(&g["pci"]["device_id"]), "{ctx}");
    assert_eq!(
        pci.pci_sub_system_id,
        Some(hex(&g["pci"]["subsystem_id"])),
        "{ctx}"
    );
    assert_eq!(
        nvml.device_by_pci_bus_id(pci.bus_id.as_str())
            .unwrap()
            .index()
            .unwrap(),
        index,
        "{ctx}"
    );
    assert_eq!(
        nvml.device_by_uuid(text(&g["uuid"]))
            .unwrap()
            .index()
            .unwrap(),
        index,
        "{ctx}"
    );

    let mem = dev.memory_info().unwrap();
    let m = &g["memory"];
    assert_eq!(mem.total, num(&m["total"]), "{ctx}");
    assert_eq!(mem.reserved, num(&m["reserved"]), "{ctx}");
    assert_eq!(mem.used, num(&m["used"]), "{ctx}");
    assert_eq!(mem.free, mem.total - mem.reserved - mem.used, "{ctx}");

    let cc = dev.cuda_compute_capability().unwrap();
    assert_eq!(
        format!("{}.{}", cc.major, cc.minor),
        text(&g["compute_capability"]),
        "{ctx}"
    );
    match g.get("numa_node") {
        Some(n) => assert_eq!(u64::from(dev.numa_node_id().unwrap()), num(n), "{ctx}"),
        None => assert!(
            matches!(dev.numa_node_id(), Err(NvmlError::NotSupported)),
            "{ctx}"
        ),
    }
    let words = dev.cpu_affinity(4).unwrap();
    let got: Vec<u32> = (0..256u32)
        .filter(|&c| words[(c / 64) as usize] & (1 << (c % 64)) != 0)
        .collect();
    assert_eq!(got, cpus(text(&g["cpu_affinity"])), "{ctx}");

    let mut want_links = BTreeMap::new();
    for entry in g
        .get("nvlinks")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let bus = match (entry.get("peer"), entry.get("nvswitch")) {
            (Some(peer), None) => {
                text(&node["gpus"][usize::try_from(num(peer)).unwrap()]["pci"]["bus_id"]).to_owned()
            }
            (None, Some(sw)) => {
                text(&node["nvswitches"][usize::try_from(num(sw)).unwrap()]["pci_bus_id"])
                    .to_owned()
            }
            _ => panic!("bad nvlink entry {entry}"),
        };
        *want_links.entry(bus).or_insert(0) += u32::try_from(num(&entry["links"])).unwrap();
    }
    assert_eq!(nvlinks_by_remote(&dev), want_links, "{ctx} NVLinks");

    match g.get("mig") {
        Some(mig) => {
            let mode = dev.mig_mode().unwrap();
            assert_eq!(
                mode.current,
                u32::from(mig["current"].as_bool().unwrap()),
                "{ctx}"
            );
        }
        None => assert!(
            matches!(dev.mig_mode(), Err(NvmlError::NotSupported)),
            "{ctx}"
        ),
    }
    let mig_on = g.get("mig").is_some_and(|m| m["current"] == true);
    if mig_on {
        assert!(
            matches!(dev.utilization_rates(), Err(NvmlError::NotSupported)),
            "{ctx}: utilisation on a MIG-enabled GPU"
        );
    } else {
        let util = dev.utilization_rates().unwrap();
        assert_eq!(
            (u64::from(util.gpu), u64::from(util.memory)),
            (
                num(&g["utilization"]["gpu"]),
                num(&g["utilization"]["memory"])
            )
        );
    }
    assert_eq!(
        u64::from(dev.temperature(TemperatureSensor::Gpu).unwrap()),
        num(&g["temperature_c"]),
        "{ctx}"
    );
    assert_eq!(
        u64::from(dev.power_usage().unwrap()),
        num(&g["power_mw"]),
        "{ctx}"
    );
    let procs = dev.running_compute_processes().unwrap();
    // With MIG on, the GPU lists the processes of all its compute instances.
    let listed: Vec<&Value> = if mig_on {
        g["mig"]["gpu_instances"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|gi| {
                gi.get("compute_instances")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
            })
            .flat_map(|ci| {
                ci.get("processes")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
            })
            .collect()
    } else {
        g["processes"].as_array().unwrap().iter().collect()
    };
    let want: Vec<(u64, u64)> = listed
        .iter()
        .map(|p| (num(&p["pid"]), num(&p["used_memory"])))
        .collect();
    let got: Vec<(u64, u64)> = procs
        .iter()
        .map(|p| match p.used_gpu_memory {
            UsedGpuMemory::Used(b) => (u64::from(p.pid), b),
            UsedGpuMemory::Unavailable => panic!("{ctx}: memory unavailable"),
        })
        .collect();
    assert_eq!(got, want, "{ctx}");
    let ecc = dev.is_ecc_enabled().unwrap();
    assert!(ecc.currently_enabled && ecc.pending_enabled, "{ctx}");
    assert_eq!(
        dev.total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile)
            .unwrap(),
        0,
        "{ctx}"
    );

    for other in node["gpus"].as_array().unwrap() {
        let j = u32::try_from(num(&other["index"])).unwrap();
        if j == index {
            continue;
        }
        let peer = nvml.device_by_index(j).unwrap();
        assert_eq!(
            dev.topology_common_ancestor(nvml.device_by_index(j).unwrap())
                .unwrap(),
            expected_level(g, other),
            "GPUs {index}-{j}"
        );
        let same_board = g.get("board").is_some() && g.get("board") == other.get("board");
        assert_eq!(
            dev.is_on_same_board_as(&peer).unwrap(),
            same_board,
            "GPUs {index}-{j}"
        );
    }
}

#[test]
fn every_field_of_every_shipped_topology() {
    for (name, json) in nvml_sim::TOPOLOGIES {
        let node: Value = serde_json::from_str(json).unwrap();
        let sim = SimNode::shipped(name);
        let lib = sim.lib_path();
        let gpus = node["gpus"].as_array().unwrap();
        let nvml = if gpus.is_empty() {
            let plain = Nvml::builder().lib_path(lib.as_os_str()).init();
            assert!(
                matches!(plain, Err(NvmlError::UnexpectedVariant(28))),
                "{name}: init without NO_GPUS"
            );
            Nvml::builder()
                .lib_path(lib.as_os_str())
                .flags(InitFlags::NO_GPUS)
                .init()
                .unwrap()
        } else {
            common::open(&sim)
        };
        let driver = text(&node["driver_version"]);
        assert_eq!(nvml.sys_driver_version().unwrap(), driver, "{name}");
        let (major, minor) = text(&node["cuda_driver_version"]).split_once('.').unwrap();
        let cuda: i32 = major.parse::<i32>().unwrap() * 1000 + minor.parse::<i32>().unwrap() * 10;
        assert_eq!(nvml.sys_cuda_driver_version().unwrap(), cuda, "{name}");
        assert_eq!(
            nvml.sys_nvml_version().unwrap(),
            format!("{major}.{driver}"),
            "{name}"
        );
        assert_eq!(nvml.device_count().unwrap() as usize, gpus.len(), "{name}");
        for g in gpus {
            check_gpu(&nvml, &node, g);
        }
    }
}

#[test]
fn shipped_topologies_have_the_promised_shape() {
    let shape = |name: &str| -> Value {
        serde_json::from_str(nvml_sim::TOPOLOGIES.iter().find(|t| t.0 == name).unwrap().1).unwrap()
    };
    let count = |v: &Value| v["gpus"].as_array().unwrap().len();
    assert_eq!(count(&shape("dgx-a100")), 8);
    assert_eq!(count(&shape("dgx1-v100")), 8);
    assert_eq!(count(&shape("pcie-t4x4")), 4);
    assert_eq!(count(&shape("k80")), 4);
    assert_eq!(count(&shape("hgx16")), 16);
    assert_eq!(count(&shape("driver-no-gpus")), 0);
    assert_eq!(count(&shape("dgx-a100-mig")), 8);
    assert_eq!(count(&shape("dgx-a100-mixed")), 8);
    assert_eq!(count(&shape("hgx-h100")), 8);
    assert_eq!(count(&shape("numa-2cpu")), 2);
    let k80 = shape("k80");
    assert!(
        k80["gpus"]
            .as_array()
            .unwrap()
            .iter()
            .any(|g| g["index"] != g["minor"]),
        "k80 minors must differ from indices"
    );
}

/// NVLinks between GPUs `a` and `b` of a DGX-1 V100 board.
fn dgx1_links(a: u32, b: u32) -> u32 {
    let pair = (a.min(b) as usize, a.max(b) as usize);
    DGX1_V100_NVLINKS
        .iter()
        .find(|&&(x, y, _)| (x, y) == pair)
        .map_or(0, |l| l.2)
}

fn dgx1_level(a: u32, b: u32) -> TopologyLevel {
    match (a / 2 == b / 2, a / 4 == b / 4) {
        (true, _) => TopologyLevel::Single,
        (false, true) => TopologyLevel::HostBridge,
        (false, false) => TopologyLevel::System,
    }
}

fn check_cube_mesh(nvml: &Nvml, offset: u32) {
    let devices: Vec<Device<'_>> = (0..8)
        .map(|i| nvml.device_by_index(offset + i).unwrap())
        .collect();
    let bus_ids: Vec<String> = devices
        .iter()
        .map(|d| d.pci_info().unwrap().bus_id)
        .collect();
    for a in 0..8 {
        let links = nvlinks_by_remote(&devices[a as usize]);
        for b in 0..8 {
            let want = if a == b { 0 } else { dgx1_links(a, b) };
            let got = links.get(&bus_ids[b as usize]).copied().unwrap_or(0);
            assert_eq!(got, want, "NVLinks {}-{}", offset + a, offset + b);
            if a != b {
                let level = devices[a as usize]
                    .topology_common_ancestor(nvml.device_by_index(offset + b).unwrap())
                    .unwrap();
                assert_eq!(
                    level,
                    dgx1_level(a, b),
                    "PCIe {}-{}",
                    offset + a,
                    offset + b
                );
            }
        }
        assert_eq!(links.values().sum::<u32>(), 6, "a V100 has 6 NVLinks");
    }
}

#[test]
fn dgx1_matches_the_reference_table() {
    let sim = SimNode::shipped("dgx1-v100");
    let nvml = common::open(&sim);
    assert_eq!(nvml.sys_driver_version().unwrap(), "550.54.14");
    assert_eq!(nvml.sys_cuda_driver_version().unwrap(), 12040);
    check_cube_mesh(&nvml, 0);
    for i in 0..8 {
        let dev = nvml.device_by_index(i).unwrap();
        assert_eq!(dev.name().unwrap(), "Tesla V100-SXM2-16GB");
        let cc = dev.cuda_compute_capability().unwrap();
        assert_eq!((cc.major, cc.minor), (7, 0));
        assert_eq!(
            dev.numa_node_id().unwrap(),
            i / 4,
            "GPUs 0-3 on socket 0, 4-7 on socket 1"
        );
    }
}

#[test]
fn hgx16_is_two_cube_meshes_across_sockets() {
    let sim = SimNode::shipped("hgx16");
    let nvml = common::open(&sim);
    check_cube_mesh(&nvml, 0);
    check_cube_mesh(&nvml, 8);
    let level = |a: u32, b: u32| {
        nvml.device_by_index(a)
            .unwrap()
            .topology_common_ancestor(nvml.device_by_index(b).unwrap())
            .unwrap()
    };
    // Each board keeps the DGX-1 layout (its halves on two sockets); the boards sit on
    // different sockets of one four-socket host.
    assert_eq!(level(8, 10), TopologyLevel::HostBridge);
    assert_eq!(level(3, 8), TopologyLevel::System);
    assert_eq!(level(7, 12), TopologyLevel::System);
    assert_eq!(nvml.device_by_index(13).unwrap().numa_node_id().unwrap(), 3);
}

#[test]
fn other_topologies_spot_checks() {
    let level = |nvml: &Nvml, a: u32, b: u32| {
        nvml.device_by_index(a)
            .unwrap()
            .topology_common_ancestor(nvml.device_by_index(b).unwrap())
            .unwrap()
    };
    let a100 = SimNode::shipped("dgx-a100");
    let nvml = common::open(&a100);
    assert_eq!(level(&nvml, 0, 1), TopologyLevel::Multiple);
    assert_eq!(level(&nvml, 0, 2), TopologyLevel::Node);
    assert_eq!(level(&nvml, 0, 4), TopologyLevel::System);
    let links = nvlinks_by_remote(&nvml.device_by_index(0).unwrap());
    assert_eq!(links.len(), 6, "one entry per NVSwitch");
    assert!(links.values().all(|&n| n == 2));
    drop(nvml);

    let t4 = SimNode::shipped("pcie-t4x4");
    let nvml = common::open(&t4);
    assert_eq!(level(&nvml, 0, 1), TopologyLevel::Single);
    assert_eq!(level(&nvml, 2, 3), TopologyLevel::Single);
    assert_eq!(level(&nvml, 1, 2), TopologyLevel::System);
    assert!(nvlinks_by_remote(&nvml.device_by_index(0).unwrap()).is_empty());
    drop(nvml);

    let k80 = SimNode::shipped("k80");
    let nvml = common::open(&k80);
    assert_eq!(level(&nvml, 0, 1), TopologyLevel::Internal);
    assert_eq!(level(&nvml, 2, 3), TopologyLevel::Internal);
    assert_eq!(level(&nvml, 1, 2), TopologyLevel::HostBridge);
    assert_eq!(nvml.sys_driver_version().unwrap(), "470.256.02");
    assert_eq!(nvml.device_by_index(0).unwrap().minor_number().unwrap(), 2);
}
