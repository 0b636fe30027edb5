//! The CDI specs mesos-gpu generates, against the CDI JSON schema (`tests/cdi-schema/`, from the
//! CDI repository) and the rules the reference consumer (CDI's Go package) applies on load that
//! the schema does not express: device names, the declared version being the minimum its
//! content needs (`specs-go/version.go`), and nothing but known fields.
//!
//! Each spec is made from a shipped nvml-sim node, through the same dynamic NVML loading and
//! discovery as production, with device numbers computed (no device nodes are needed here; the
//! podman test reads real ones). Each device of a spec is also checked against the CDI rendering
//! of the grant of that device alone (issue 35).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};

use mesos_gpu_docker::args::{ImageInfo, LaunchPlan};
use mesos_gpu_docker::cdi::{
    ContainerEdits, DeviceNumbers, Gathered, NodeDevices, container_edits,
};
use mesos_gpu_grant::env::{CUDA_VISIBLE_DEVICES, NVIDIA_VISIBLE_DEVICES};
use mesos_gpu_grant::{Grant, MigAccess, NodeKind};
use mesos_gpu_node::devices::DeviceNodes;
use mesos_gpu_node::inventory::Inventory;
use mesos_gpu_os::error_chain;
use mesos_gpu_testkit::nvml_sim::SimNode;
use mesos_gpu_volume::VolumeManager;
use serde_json::{Value, json};

const VOLUME_ROOT: &str = "/var/run/mesos/isolators/gpu";

fn schema_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/cdi-schema")
}

fn read_json(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// Serves `defs.json`, which `schema.json` refers to relatively, from the test data.
struct Defs(Value);

impl jsonschema::Retrieve for Defs {
    fn retrieve(
        &self,
        uri: &jsonschema::Uri<String>,
    ) -> Result<Value, Box<dyn std::error::Error + Send + Sync>> {
        if uri.as_str().ends_with("/defs.json") {
            Ok(self.0.clone())
        } else {
            Err(format!(
                "the CDI schema refers only to defs.json, not {}",
                uri.as_str()
            )
            .into())
        }
    }
}

fn validator() -> jsonschema::Validator {
    let dir = schema_dir();
    jsonschema::options()
        .with_draft(jsonschema::Draft::Draft7)
        .with_base_uri("file:///cdi/schema.json")
        .with_retriever(Defs(read_json(&dir.join("defs.json"))))
        .build(&read_json(&dir.join("schema.json")))
        .expect("the CDI schema compiles")
}

fn schema_errors(validator: &jsonschema::Validator, doc: &Value) -> Vec<String> {
    validator
        .iter_errors(doc)
        .map(|e| format!("{} at {}", e, e.instance_path()))
        .collect()
}

/// The shipped node `node` as the module discovers it: through its library and its driver
/// `/proc` files, so that MIG devices come with their capability nodes.
fn inventory(node: &str) -> Inventory {
    SimNode::shipped(node).inventory().expect("nvml-sim loads")
}

/// The devices a spec of `inventory` offers: each healthy GPU not in MIG mode, and each healthy
/// MIG device with capability nodes of a healthy GPU in MIG mode.
fn offered(inventory: &Inventory) -> usize {
    inventory
        .gpus
        .iter()
        .filter(|g| g.healthy)
        .map(|g| {
            if inventory.mig.is_enabled(g.index) {
                inventory
                    .mig
                    .of_parent(g.index)
                    .filter(|d| d.healthy && d.caps.is_some())
                    .count()
            } else {
                1
            }
        })
        .sum()
}

fn computed(inventory: &Inventory) -> Gathered {
    NodeDevices::gather(
        inventory,
        &DeviceNumbers::Computed,
        &VolumeManager::at(VOLUME_ROOT),
    )
    .expect("gather")
}

fn spec_json(node: &str) -> Value {
    match computed(&inventory(node)) {
        Gathered::Devices(devices) => {
            serde_json::from_slice(&devices.spec().expect("spec").to_json()).expect("json")
        }
        Gathered::NoGpus { reason } => panic!("{node}: no GPUs: {reason}"),
    }
}

/// The minimum version of `doc` by CDI's own table (`specs-go/version.go`), over every field a
/// spec may have, so a field added to the structs without its version shows up here.
fn required_version(doc: &Value) -> &'static str {
    let devices = doc["devices"].as_array().cloned().unwrap_or_default();
    let mut edits = vec![doc["containerEdits"].clone()];
    edits.extend(devices.iter().map(|d| d["containerEdits"].clone()));
    let any_edit = |f: &dyn Fn(&Value) -> bool| edits.iter().any(f);
    let non_empty = |v: &Value| v.as_array().is_some_and(|a| !a.is_empty());
    let rdt_v110 = |e: &Value| {
        e.get("intelRdt")
            .is_some_and(|r| r.get("schemata").is_some() || r["enableMonitoring"] == json!(true))
    };
    if any_edit(&|e| rdt_v110(e) || non_empty(&e["netDevices"])) {
        return "1.1.0";
    }
    if any_edit(&|e| e.get("intelRdt").is_some() || non_empty(&e["additionalGids"])) {
        return "0.7.0";
    }
    let class_dot = doc["kind"]
        .as_str()
        .and_then(|k| k.split_once('/'))
        .is_some_and(|(_, class)| class.contains('.'));
    let annotated = |v: &Value| v["annotations"].as_object().is_some_and(|a| !a.is_empty());
    if annotated(doc) || devices.iter().any(annotated) || class_dot {
        return "0.6.0";
    }
    let digit_name = devices.iter().any(|d| {
        d["name"]
            .as_str()
            .is_some_and(|n| n.starts_with(|c: char| c.is_ascii_digit()))
    });
    let host_path = any_edit(&|e| {
        e["deviceNodes"]
            .as_array()
            .is_some_and(|ns| ns.iter().any(|n| n.get("hostPath").is_some()))
    });
    if digit_name || host_path {
        return "0.5.0";
    }
    let mount_type = any_edit(&|e| {
        e["mounts"]
            .as_array()
            .is_some_and(|ms| ms.iter().any(|m| m.get("type").is_some()))
    });
    if mount_type { "0.4.0" } else { "0.3.0" }
}

/// Fields CDI's Go structs know (`specs-go/config.go`); its loader refuses any other.
fn unknown_fields(doc: &Value) -> Vec<String> {
    fn check(v: &Value, known: &[&str], at: &str, out: &mut Vec<String>) {
        if let Some(map) = v.as_object() {
            out.extend(
                map.keys()
                    .filter(|k| !known.contains(&k.as_str()))
                    .map(|k| format!("{at}.{k}")),
            );
        }
    }
    const EDITS: &[&str] = &[
        "env",
        "deviceNodes",
        "hooks",
        "mounts",
        "intelRdt",
        "additionalGids",
        "netDevices",
    ];
    const NODE: &[&str] = &[
        "path",
        "hostPath",
        "type",
        "major",
        "minor",
        "fileMode",
        "permissions",
        "uid",
        "gid",
    ];
    const MOUNT: &[&str] = &["hostPath", "containerPath", "options", "type"];
    let mut out = Vec::new();
    check(
        doc,
        &[
            "cdiVersion",
            "kind",
            "annotations",
            "devices",
            "containerEdits",
        ],
        "",
        &mut out,
    );
    let mut edits = vec![(doc["containerEdits"].clone(), "containerEdits".to_owned())];
    for (i, d) in doc["devices"].as_array().into_iter().flatten().enumerate() {
        check(
            d,
            &["name", "annotations", "containerEdits"],
            &format!("devices[{i}]"),
            &mut out,
        );
        edits.push((
            d["containerEdits"].clone(),
            format!("devices[{i}].containerEdits"),
        ));
    }
    for (e, at) in &edits {
        check(e, EDITS, at, &mut out);
        for n in e["deviceNodes"].as_array().into_iter().flatten() {
            check(n, NODE, &format!("{at}.deviceNodes"), &mut out);
        }
        for m in e["mounts"].as_array().into_iter().flatten() {
            check(m, MOUNT, &format!("{at}.mounts"), &mut out);
        }
    }
    out
}

fn shipped_nodes() -> Vec<String> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../nvml-sim/topologies");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .map(|p| p.file_stem().unwrap().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert!(names.len() >= 5, "shipped nodes: {names:?}");
    names
}

/// Every shipped node with a healthy GPU gets a spec valid by the schema at its minimum version,
/// offering each whole GPU and, on a MIG node, each MIG device (by index and UUID) plus `all`.
#[test]
fn every_shipped_node_gives_a_valid_minimal_spec() {
    let validator = validator();
    let mut checked = 0;
    for node in shipped_nodes() {
        let inventory = inventory(&node);
        let Gathered::Devices(devices) = computed(&inventory) else {
            assert!(
                inventory.gpus.iter().all(|g| !g.healthy),
                "{node}: GPUs but no spec"
            );
            continue;
        };
        let spec = devices.spec().expect("spec");
        let doc: Value = serde_json::from_slice(&spec.to_json()).unwrap();
        let errors = schema_errors(&validator, &doc);
        assert!(errors.is_empty(), "{node}: schema: {errors:#?}");
        assert_eq!(
            doc["cdiVersion"],
            json!(required_version(&doc)),
            "{node}: not the minimum version"
        );
        assert_eq!(unknown_fields(&doc), Vec::<String>::new(), "{node}");
        let names: Vec<&str> = doc["devices"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d["name"].as_str().unwrap())
            .collect();
        // A GPU in MIG mode is offered as its MIG devices, never whole.
        let offered = offered(&inventory);
        assert!(offered > 0, "{node}: a spec offering nothing");
        assert_eq!(names.len(), 2 * offered + 1, "{node}: {names:?}");
        let unique: std::collections::BTreeSet<_> = names.iter().collect();
        assert_eq!(unique.len(), names.len(), "{node}: repeated names");
        checked += 1;
    }
    assert!(checked >= 5, "only {checked} nodes had GPUs");
}

#[test]
fn the_schema_refuses_what_runtimes_refuse() {
    let validator = validator();
    let good = spec_json("k80");
    assert!(schema_errors(&validator, &good).is_empty());
    let mut no_devices = good.clone();
    no_devices.as_object_mut().unwrap().remove("devices");
    assert!(!schema_errors(&validator, &no_devices).is_empty());
    let mut nameless = good.clone();
    nameless["devices"][0]
        .as_object_mut()
        .unwrap()
        .remove("name");
    assert!(!schema_errors(&validator, &nameless).is_empty());
    let mut bad_node = good.clone();
    bad_node["containerEdits"]["deviceNodes"][0]["major"] = json!("195");
    assert!(!schema_errors(&validator, &bad_node).is_empty());
    let mut pathless_mount = good;
    pathless_mount["containerEdits"]["mounts"][0]
        .as_object_mut()
        .unwrap()
        .remove("containerPath");
    assert!(!schema_errors(&validator, &pathless_mount).is_empty());
}

#[test]
fn the_version_table_is_cdis() {
    let base = json!({"cdiVersion": "x", "kind": "nvidia.com/gpu",
        "devices": [{"name": "gpu0", "containerEdits": {}}]});
    assert_eq!(required_version(&base), "0.3.0");
    let mut v = base.clone();
    v["containerEdits"] =
        json!({"mounts": [{"hostPath": "/a", "containerPath": "/b", "type": "bind"}]});
    assert_eq!(required_version(&v), "0.4.0");
    let mut v = base.clone();
    v["devices"][0]["name"] = json!("0");
    assert_eq!(required_version(&v), "0.5.0");
    let mut v = base.clone();
    v["kind"] = json!("nvidia.com/gpu.x");
    assert_eq!(required_version(&v), "0.6.0");
    let mut v = base.clone();
    v["containerEdits"] = json!({"additionalGids": [5]});
    assert_eq!(required_version(&v), "0.7.0");
    let mut v = base;
    v["devices"][0]["containerEdits"] =
        json!({"netDevices": [{"hostInterfaceName": "a", "name": "b"}]});
    assert_eq!(required_version(&v), "1.1.0");
}

#[test]
fn dgx1_spec_names_every_gpu_by_index_uuid_and_all() {
    let inventory = inventory("dgx1-v100");
    let doc = spec_json("dgx1-v100");
    assert_eq!(doc["cdiVersion"], "0.5.0");
    assert_eq!(doc["kind"], "nvidia.com/gpu");
    let devices = doc["devices"].as_array().unwrap();
    assert_eq!(devices.len(), 17);
    for gpu in &inventory.gpus {
        let by_index = devices
            .iter()
            .find(|d| d["name"] == json!(gpu.index.to_string()))
            .unwrap();
        let by_uuid = devices
            .iter()
            .find(|d| d["name"] == json!(gpu.uuid))
            .unwrap();
        assert_eq!(by_index["containerEdits"], by_uuid["containerEdits"]);
        assert_eq!(
            by_index["containerEdits"],
            json!({
                "deviceNodes": [{"path": format!("/dev/nvidia{}", gpu.minor), "type": "c",
                    "major": 195, "minor": gpu.minor, "permissions": "rwm"}]
            }),
            "a device's edits are its nodes only: no NVIDIA_VISIBLE_DEVICES of its own"
        );
    }
    let all = devices.last().unwrap();
    assert_eq!(all["name"], "all");
    let all_nodes: Vec<&str> = all["containerEdits"]["deviceNodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["path"].as_str().unwrap())
        .collect();
    assert_eq!(all_nodes.len(), 8);
    assert!(all["containerEdits"].get("env").is_none(), "{all}");
    let common = &doc["containerEdits"];
    assert_eq!(
        common["env"].as_array().unwrap().last().unwrap(),
        "NVIDIA_VISIBLE_DEVICES=void",
        "as nvidia-ctk: NVIDIA's legacy hook injects nothing more"
    );
    assert_eq!(
        common["deviceNodes"],
        json!([
            {"path": "/dev/nvidiactl", "type": "c", "major": 195, "minor": 255, "permissions": "rwm"},
            {"path": "/dev/nvidia-uvm", "permissions": "rwm"}
        ])
    );
    let version = &inventory.driver.as_ref().unwrap().version;
    assert_eq!(
        common["mounts"],
        json!([{"hostPath": format!("{VOLUME_ROOT}/nvidia_{version}"),
            "containerPath": "/usr/local/nvidia", "options": ["ro", "nosuid", "nodev", "bind"]}])
    );
}

/// The spec's environment is what the Docker path gives the same GPUs, except the variables that
/// name the devices: `NVIDIA_VISIBLE_DEVICES` is `void`, as nvidia-ctk writes it, and
/// `CUDA_VISIBLE_DEVICES` is not set, since CDI selects the devices (a grant's own edits,
/// `cdi::node::container_edits`, name them: see `ffi/tests/parity.rs`).
#[test]
fn env_is_the_docker_paths_with_selection_left_to_cdi() {
    let inventory = inventory("pcie-t4x4");
    let doc = spec_json("pcie-t4x4");
    let host = DeviceNodes::named(Path::new("/dev"), &inventory);
    let image = ImageInfo {
        env: vec!["NVIDIA_VISIBLE_DEVICES=all".to_owned()],
        ..ImageInfo::default()
    };
    let driver = mesos_gpu_docker::args::DriverSpec {
        info: inventory.driver.clone().unwrap(),
        volume: mesos_gpu_docker::args::VolumeSource::Bind {
            host_path: PathBuf::from("/v"),
        },
    };
    let gpu = &inventory.gpus[2];
    let grant = mesos_gpu_grant::Grant::new(&host, &[], vec![gpu.clone()], vec![], None).unwrap();
    let plan = LaunchPlan::new(&grant, &image, Some(&driver)).unwrap();
    let docker_env = plan.env_strings();
    let device = doc["devices"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["name"] == "2")
        .unwrap();
    assert!(device["containerEdits"].get("env").is_none(), "{device}");
    let cdi_env: Vec<String> =
        serde_json::from_value(doc["containerEdits"]["env"].clone()).unwrap();
    let mut expected: Vec<String> = docker_env
        .iter()
        .filter(|e| {
            !e.starts_with("NVIDIA_VISIBLE_DEVICES=") && !e.starts_with("CUDA_VISIBLE_DEVICES=")
        })
        .cloned()
        .collect();
    assert_eq!(
        docker_env.len(),
        expected.len() + 2,
        "the Docker path names the GPUs: {docker_env:?}"
    );
    expected.push("NVIDIA_VISIBLE_DEVICES=void".to_owned());
    assert_eq!(cdi_env, expected);
}

#[test]
fn no_spec_without_healthy_gpus() {
    let inventory = inventory("driver-no-gpus");
    assert!(matches!(computed(&inventory), Gathered::NoGpus { .. }));
    let mut sick = self::inventory("k80");
    for gpu in &mut sick.gpus {
        gpu.healthy = false;
    }
    let Gathered::NoGpus { reason } = computed(&sick) else {
        panic!("a spec for unhealthy GPUs");
    };
    assert!(reason.contains("unhealthy"), "{reason}");
    let mut one_sick = self::inventory("k80");
    one_sick.gpus[0].healthy = false;
    let Gathered::Devices(devices) = computed(&one_sick) else {
        panic!("no spec");
    };
    assert_eq!(devices.left_out, vec![one_sick.gpus[0].index]);
    assert!(
        devices
            .devices
            .iter()
            .all(|d| d.uuid != one_sick.gpus[0].uuid)
    );
}

#[test]
fn bad_values_are_named() {
    let mut inventory = inventory("k80");
    inventory.gpus[1].uuid = "GPU 1".to_owned();
    let Gathered::Devices(devices) = computed(&inventory) else {
        panic!("no devices");
    };
    let err = devices.spec().expect_err("bad name");
    let text = error_chain(&err);
    assert!(text.contains("\"GPU 1\""), "{text}");
    inventory.gpus[1].uuid = "GPU-1".to_owned();
    inventory.driver.as_mut().unwrap().version = "../etc".to_owned();
    let err = NodeDevices::gather(
        &inventory,
        &DeviceNumbers::Computed,
        &VolumeManager::at(VOLUME_ROOT),
    )
    .expect_err("bad version");
    assert!(error_chain(&err).contains("\"../etc\""), "{err}");
}

/// The grant of one device alone, made here as for any container (`Grant::new` over the nodes the
/// driver names under `/dev`), with the spec's names for the device; one per healthy GPU not in
/// MIG mode and per healthy MIG device with capability nodes.
fn grants_alone(inventory: &Inventory) -> Vec<([String; 2], Grant)> {
    let nodes = DeviceNodes::named(Path::new("/dev"), inventory);
    let grant = |gpus, mig| Grant::new(&nodes, &[], gpus, mig, None).expect("grant");
    let mut grants = Vec::new();
    for gpu in inventory.gpus.iter().filter(|g| g.healthy) {
        if !inventory.mig.is_enabled(gpu.index) {
            let names = [gpu.index.to_string(), gpu.uuid.clone()];
            grants.push((names, grant(vec![gpu.clone()], Vec::new())));
            continue;
        }
        for mig in inventory.mig.of_parent(gpu.index).filter(|d| d.healthy) {
            let Ok(access) = MigAccess::of(mig, Path::new("/dev"), Path::new("/proc")) else {
                continue;
            };
            let names = [format!("{}:{}", gpu.index, mig.index), mig.uuid.clone()];
            grants.push((names, grant(Vec::new(), vec![access])));
        }
    }
    grants
}

/// Issue 35: the node's spec is the rendering of one grant per GPU and per MIG device. On every
/// shipped node (whole GPUs, MIG devices, both), each device of the spec has exactly the device
/// nodes, variables and mounts of `container_edits` of its grant, less what the common edits
/// hold instead: the grant's control nodes (the common edits' nodes, the same for every grant)
/// and the variables naming its devices (`NVIDIA_VISIBLE_DEVICES=void` there); `all` has every
/// device's nodes.
#[test]
fn issue_35_each_device_is_the_rendering_of_its_grant_alone() {
    let (mut gpus, mut migs) = (0, 0);
    for node in shipped_nodes() {
        let inventory = inventory(&node);
        let Gathered::Devices(devices) = computed(&inventory) else {
            continue;
        };
        let spec = devices.spec().expect("spec");
        let device = |name: &str| {
            spec.devices()
                .iter()
                .find(|d| d.name == name)
                .unwrap_or_else(|| panic!("{node}: no device {name}"))
        };
        let common = spec.common_edits();
        let mut all = ContainerEdits::default();
        let mut named = vec!["all".to_owned()];
        for (names, grant) in grants_alone(&inventory) {
            if grant.mig().is_empty() {
                gpus += 1;
            } else {
                migs += 1;
            }
            let whole = container_edits(&grant).expect("container edits");
            assert_eq!(whole.device_nodes.len(), grant.devices().len(), "{node}");
            let (control, own): (Vec<_>, Vec<_>) = grant
                .devices()
                .iter()
                .zip(whole.device_nodes)
                .partition(|(granted, _)| granted.kind == NodeKind::Control);
            let control: Vec<_> = control.into_iter().map(|(_, n)| n).collect();
            assert_eq!(
                control, common.device_nodes,
                "{node} {names:?}: control nodes"
            );
            let naming = |var: &String| {
                [NVIDIA_VISIBLE_DEVICES, CUDA_VISIBLE_DEVICES]
                    .iter()
                    .any(|key| var.starts_with(&format!("{key}=")))
            };
            let expected = ContainerEdits {
                env: whole.env.into_iter().filter(|v| !naming(v)).collect(),
                device_nodes: own.into_iter().map(|(_, n)| n).collect(),
                mounts: whole.mounts,
            };
            for name in &names {
                assert_eq!(device(name).container_edits, expected, "{node} {name}");
            }
            for n in expected.device_nodes {
                if !all.device_nodes.iter().any(|a| a.path == n.path) {
                    all.device_nodes.push(n);
                }
            }
            named.extend(names);
        }
        assert_eq!(device("all").container_edits, all, "{node} all");
        let mut in_spec: Vec<&str> = spec.devices().iter().map(|d| d.name.as_str()).collect();
        let mut named: Vec<&str> = named.iter().map(String::as_str).collect();
        in_spec.sort_unstable();
        named.sort_unstable();
        assert_eq!(in_spec, named, "{node}: devices that are not one grant's");
    }
    assert!(
        gpus > 0 && migs > 0,
        "whole GPUs {gpus}, MIG devices {migs}"
    );
}
