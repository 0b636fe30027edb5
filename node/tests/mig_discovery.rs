//! Issue 16: MIG discovery against nvml-sim's MIG nodes, through the same dynamic NVML loading
//! a real driver uses and the `/proc` files the sim writes as NVIDIA's driver does.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use mesos_gpu_node::{discovery::Discovery, discovery::DiscoveryError, discovery::GpuDriver};
use mesos_gpu_node::{inventory::DevNum, inventory::Inventory, inventory::MigDevice};
use mesos_gpu_testkit::nvml_sim::SimNode;
use serde_json::Value;

fn shipped_json(name: &str) -> Value {
    let (_, text) = nvml_sim::TOPOLOGIES
        .iter()
        .find(|(n, _)| *n == name)
        .expect("shipped topology");
    serde_json::from_str(text).expect("shipped JSON")
}

fn discover(node: &SimNode) -> Inventory {
    match GpuDriver::open_at(Some(&node.lib_path()), &node.proc_root()).expect("discovery") {
        Discovery::Driver(driver) => driver.inventory().clone(),
        Discovery::NoDriver(inv) => panic!("no driver: {:?}", inv.absent_reason),
    }
}

/// `(parent index, GI id, CI id, GI profile id)` of every MIG device the description makes,
/// sorted; a GPU instance without `compute_instances` has one, id 0.
fn described(spec: &Value) -> Vec<(u32, u32, u32, u32)> {
    let mut out = Vec::new();
    for gpu in spec["gpus"].as_array().unwrap() {
        let mig = &gpu["mig"];
        if mig["current"] != true {
            continue;
        }
        let index = u32::try_from(gpu["index"].as_u64().unwrap()).unwrap();
        for gi in mig["gpu_instances"].as_array().unwrap() {
            let gi_id = u32::try_from(gi["id"].as_u64().unwrap()).unwrap();
            let profile = u32::try_from(gi["profile"].as_u64().unwrap()).unwrap();
            match gi["compute_instances"].as_array() {
                None => out.push((index, gi_id, 0, profile)),
                Some(cis) => out.extend(cis.iter().map(|ci| {
                    (
                        index,
                        gi_id,
                        u32::try_from(ci["id"].as_u64().unwrap()).unwrap(),
                        profile,
                    )
                })),
            }
        }
    }
    out.sort_unstable();
    out
}

fn found(inv: &Inventory) -> Vec<(u32, u32, u32, u32)> {
    let mut out: Vec<_> = inv
        .mig
        .devices
        .iter()
        .map(|d| {
            (
                d.parent,
                d.gpu_instance,
                d.compute_instance,
                d.profile.expect("profile id"),
            )
        })
        .collect();
    out.sort_unstable();
    out
}

/// Caps nodes as NVIDIA's driver numbers them (the sim's table), major from `/proc/devices`.
fn check_caps(d: &MigDevice, caps_major: u32) {
    let caps = d
        .caps
        .as_ref()
        .unwrap_or_else(|| panic!("{}: no caps", d.uuid));
    let gi = nvml_sim::driver_files::mig_cap_minor(d.parent_minor, d.gpu_instance, None).unwrap();
    let ci = nvml_sim::driver_files::mig_cap_minor(
        d.parent_minor,
        d.gpu_instance,
        Some(d.compute_instance),
    )
    .unwrap();
    assert_eq!(
        caps.gpu_instance,
        DevNum {
            major: caps_major,
            minor: gi
        },
        "{}",
        d.uuid
    );
    assert_eq!(
        caps.compute_instance,
        DevNum {
            major: caps_major,
            minor: ci
        },
        "{}",
        d.uuid
    );
    assert_eq!(
        caps.gpu_instance_file,
        format!(
            "driver/nvidia/capabilities/gpu{}/mig/gi{}/access",
            d.parent_minor, d.gpu_instance
        )
    );
    assert_eq!(
        caps.compute_instance_file,
        format!(
            "driver/nvidia/capabilities/gpu{}/mig/gi{}/ci{}/access",
            d.parent_minor, d.gpu_instance, d.compute_instance
        )
    );
}

#[test]
fn every_shipped_mig_node_is_discovered_as_described() {
    for name in ["dgx-a100-mig", "dgx-a100-mixed", "hgx-h100", "dgx-a100"] {
        let spec = shipped_json(name);
        let node = SimNode::shipped(name);
        let inv = discover(&node);
        assert_eq!(found(&inv), described(&spec), "{name}");
        let enabled: Vec<u32> = spec["gpus"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|g| g["mig"]["current"] == true)
            .map(|g| u32::try_from(g["index"].as_u64().unwrap()).unwrap())
            .collect();
        assert_eq!(inv.mig.enabled, enabled, "{name}");
        let whole: Vec<u32> = inv.whole_gpus().map(|g| g.index).collect();
        let others: Vec<u32> = (0..8).filter(|i| !enabled.contains(i)).collect();
        assert_eq!(
            whole, others,
            "{name}: MIG parents leave the whole-GPU pool"
        );
        let major = spec["proc_devices"]["nvidia_caps"]
            .as_u64()
            .map_or(235, |m| u32::try_from(m).unwrap());
        if enabled.is_empty() {
            assert_eq!(inv.mig.caps_major, None, "{name}");
            continue;
        }
        assert_eq!(inv.mig.caps_major, Some(major), "{name}");
        for d in &inv.mig.devices {
            assert!(
                d.uuid.starts_with("MIG-") && d.uuid.len() == 40,
                "{name}: {}",
                d.uuid
            );
            let parent = inv.by_index(d.parent).unwrap();
            assert_eq!(d.parent_minor, parent.minor);
            assert!(d.healthy);
            check_caps(d, major);
        }
        let mut uuids: Vec<&str> = inv.mig.devices.iter().map(|d| d.uuid.as_str()).collect();
        uuids.sort_unstable();
        uuids.dedup();
        assert_eq!(
            uuids.len(),
            inv.mig.devices.len(),
            "{name}: MIG UUIDs are unique"
        );
    }
}

#[test]
fn profiles_carry_nvidias_sms_memory_and_names() {
    // (profile id) -> (name, SMs, MiB, GI slices), from the MIG user guide and nvidia-smi -lgip
    // (docs/reference/mig.md §4).
    let a100 = [
        (19, "1g.5gb", 14, 4864, 1),
        (14, "2g.10gb", 28, 9856, 2),
        (9, "3g.20gb", 42, 19968, 3),
    ];
    let h100 = [
        (19, "1g.10gb", 16, 9984, 1),
        (9, "3g.40gb", 60, 40448, 3),
        (5, "4g.40gb", 64, 40448, 4),
        (15, "1g.20gb", 26, 20096, 1),
    ];
    for (name, table) in [("dgx-a100-mixed", &a100[..]), ("hgx-h100", &h100[..])] {
        let inv = discover(&SimNode::shipped(name));
        for &(id, profile, sms, mib, slices) in table {
            let d = inv
                .mig
                .devices
                .iter()
                .find(|d| d.profile == Some(id))
                .unwrap_or_else(|| panic!("{name}: no profile {id}"));
            assert_eq!(d.profile_name, profile, "{name} {id}");
            assert_eq!(d.multiprocessors, sms, "{name} {id}");
            assert_eq!(d.memory_total, mib << 20, "{name} {id}");
            assert_eq!(d.gpu_instance_slices, slices, "{name} {id}");
            assert_eq!(d.compute_instance_slices, slices, "{name} {id}");
        }
    }
}

#[test]
fn a_driver_contradicting_itself_about_a_cap_minor_is_an_error() {
    let node = SimNode::shipped("dgx-a100-mixed");
    let inv = discover(&node);
    let d = &inv.mig.devices[0];
    let file = node
        .proc_root()
        .join(&d.caps.as_ref().unwrap().compute_instance_file);
    std::fs::write(&file, "DeviceFileMinor: 4000\nDeviceFileMode: 292\n").unwrap();
    let err = GpuDriver::open_at(Some(&node.lib_path()), &node.proc_root()).expect_err("refused");
    assert!(matches!(err, DiscoveryError::MigCaps { .. }), "{err:?}");
    assert_eq!(
        format!("{}", err),
        format!(
            "cannot find the capability device nodes of MIG device {}",
            d.uuid
        )
    );
}

#[test]
fn missing_caps_files_leave_the_device_unisolatable_not_hidden() {
    let node = SimNode::shipped("dgx-a100-mig");
    std::fs::remove_dir_all(node.proc_root().join("driver/nvidia/capabilities")).unwrap();
    let inv = discover(&node);
    assert_eq!(inv.mig.devices.len(), 56);
    assert!(inv.mig.devices.iter().all(|d| d.caps.is_none()));
}
