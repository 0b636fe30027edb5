//! Handler tests: every route called in-process through [`RestApi::respond`].

use std::io::Read as _;
use std::path::{Path, PathBuf};

use mesos_gpu_node::devices::{DeviceNode, DeviceNodes};
use mesos_gpu_node::inventory::DevNum;

use base64::Engine as _;
use http_body_util::BodyExt as _;
use mesos_gpu_node::{
    inventory::DriverInfo, inventory::Gpu, inventory::Link, inventory::PcieLevel,
    inventory::Topology,
};

use super::status::{GpuDetails, GpuProcess, GpuStatus, NoStatus, Utilization};
use super::*;

fn gpu(index: u32, minor: u32) -> Gpu {
    Gpu {
        index,
        minor,
        uuid: format!("GPU-{index}{index}{index}{index}aaaa-0000-0000-0000-00000000000{minor}"),
        name: "Tesla V100-SXM2-16GB".to_owned(),
        memory_total: 16 << 30,
        pci_bus_id: format!("00000000:{:02X}:00.0", 6 + index),
        numa_node: Some(index / 2),
        compute_capability: Some((7, 0)),
        healthy: true,
    }
}

fn inventory() -> Inventory {
    // NVML index order differs from minor order on purpose.
    let gpus = vec![gpu(0, 1), gpu(1, 0), gpu(2, 2)];
    let mut topology = Topology::unknown(3);
    for (a, b, l) in [
        (0, 1, Link::pcie(PcieLevel::SingleSwitch).with_nvlinks(2)),
        (0, 2, Link::pcie(PcieLevel::CrossSocket)),
        (1, 2, Link::pcie(PcieLevel::SingleSwitch)),
    ] {
        topology.set(a, b, l);
        topology.set(b, a, l);
    }
    Inventory {
        driver: Some(DriverInfo {
            version: "550.54.14".to_owned(),
            cuda_version: Some((12, 4)),
        }),
        gpus,
        topology,
        absent_reason: None,
        mig: Default::default(),
    }
}

/// The node's device nodes as named under `/dev`, `nvidia-uvm-tools` included.
fn devices(inventory: &Inventory) -> Devices {
    let mut nodes = DeviceNodes::named(Path::new("/dev"), inventory);
    nodes.control.push(DeviceNode {
        path: PathBuf::from("/dev/nvidia-uvm-tools"),
        dev: DevNum { major: 0, minor: 1 },
    });
    Devices {
        nodes,
        dev_root: PathBuf::from("/dev"),
        proc_root: PathBuf::from("/proc"),
    }
}

fn api_with(
    inventory: Inventory,
    volume: VolumeSource,
    status: Arc<dyn GpuStatusSource>,
) -> RestApi {
    let devices = devices(&inventory);
    RestApi::new(Arc::new(inventory), devices, volume, status)
}

fn api() -> RestApi {
    api_with(
        inventory(),
        VolumeSource::Plugin {
            plugin: "nvidia-docker".to_owned(),
        },
        Arc::new(NoStatus),
    )
}

fn get(api: &RestApi, target: &str) -> (StatusCode, String, String) {
    let (path, query) = match target.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (target, None),
    };
    let resp = api.respond(&Method::GET, path, query);
    let status = resp.status();
    let ctype = resp
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    let bytes = futures_util::FutureExt::now_or_never(resp.into_body().collect())
        .expect("ready")
        .expect("body")
        .to_bytes();
    (
        status,
        ctype,
        String::from_utf8(bytes.to_vec()).expect("utf-8"),
    )
}

/// Every GPU: the devices in minor order, then the grant's variables naming them by UUID in NVML
/// index order (as `docker-args` sets them).
const ALL_CLI: &str = "--volume-driver=nvidia-docker --volume=nvidia_driver_550.54.14:/usr/local/nvidia:ro \
--device=/dev/nvidiactl --device=/dev/nvidia-uvm --device=/dev/nvidia-uvm-tools \
--device=/dev/nvidia0 --device=/dev/nvidia1 --device=/dev/nvidia2 \
--env=NVIDIA_VISIBLE_DEVICES=GPU-0000aaaa-0000-0000-0000-000000000001,GPU-1111aaaa-0000-0000-0000-000000000000,GPU-2222aaaa-0000-0000-0000-000000000002 --env=CUDA_VISIBLE_DEVICES=GPU-0000aaaa-0000-0000-0000-000000000001,GPU-1111aaaa-0000-0000-0000-000000000000,GPU-2222aaaa-0000-0000-0000-000000000002";

#[test]
fn every_route_answers_with_and_without_prefix() {
    let api = api();
    for route in [
        "/gpu/info",
        "/gpu/info/json",
        "/gpu/status",
        "/gpu/status/json",
        "/docker/cli",
        "/docker/cli/json",
        "/mesos/cli",
    ] {
        let plain = get(&api, route);
        let versioned = get(&api, &format!("/v1.0{route}"));
        assert_eq!(plain.0, StatusCode::OK, "{route}: {}", plain.2);
        assert_eq!(plain, versioned, "{route}");
        let json = route.ends_with("/json");
        assert_eq!(plain.1, if json { JSON } else { TEXT }, "{route}");
    }
}

#[test]
fn unknown_paths_are_404_and_other_methods_405() {
    let api = api();
    for path in [
        "/",
        "/v1.0",
        "/v1.0/",
        "/gpu",
        "/gpu/info/",
        "/v1.1/gpu/info",
        "/v1.0x/gpu/info",
        "/docker/cli/json/x",
    ] {
        let (status, _, body) = get(&api, path);
        assert_eq!(status, StatusCode::NOT_FOUND, "{path}");
        assert_eq!(body, "404 page not found\n");
    }
    let resp = api.respond(&Method::POST, "/docker/cli", None);
    assert_eq!(resp.status(), StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(resp.headers().get(ALLOW).expect("allow"), "GET, HEAD");
    assert_eq!(
        api.respond(&Method::HEAD, "/gpu/info", None).status(),
        StatusCode::OK
    );
}

#[test]
fn docker_cli_lists_everything_in_minor_order_without_newline() {
    let api = api();
    assert_eq!(get(&api, "/v1.0/docker/cli").2, ALL_CLI);
    assert_eq!(get(&api, "/docker/cli?dev=*&vol=*").2, ALL_CLI);
    assert_eq!(get(&api, "/docker/cli?dev=&vol=nvidia_driver").2, ALL_CLI);
}

#[test]
fn docker_cli_selects_by_nvml_index_and_uuid_prefix() {
    let api = api();
    // Index 0 is minor 1, index 1 is minor 0: output is by minor whatever the request order.
    for q in ["dev=0+1", "dev=1%200", "dev=1+0+1", "dev=GPU-0000+GPU-1111"] {
        let body = get(&api, &format!("/docker/cli?{q}")).2;
        assert!(
            body.contains(
                "--device=/dev/nvidia-uvm-tools --device=/dev/nvidia0 --device=/dev/nvidia1 --env"
            ) && body.ends_with("--env=CUDA_VISIBLE_DEVICES=GPU-0000aaaa-0000-0000-0000-000000000001,GPU-1111aaaa-0000-0000-0000-000000000000"),
            "{q}: {body}"
        );
    }
    let body = get(&api, "/docker/cli?dev=2").2;
    assert!(
        body.contains("--device=/dev/nvidia-uvm-tools --device=/dev/nvidia2 --env=NVIDIA_VISIBLE_DEVICES=GPU-2222aaaa-0000-0000-0000-000000000002 "),
        "{body}"
    );
}

#[test]
fn docker_cli_rejects_bad_parameters_with_400() {
    let api = api();
    for (q, reason) in [
        ("dev=0,1", "invalid device: 0,1"),
        ("dev=7", "no GPU 7 on this node (its GPUs: 0-2)"),
        ("dev=GPU-ffff", "invalid device: GPU-ffff"),
        ("dev=GPU-", "ambiguous device: GPU-"),
        ("vol=nvidia_other", "invalid volume: nvidia_other"),
    ] {
        for route in ["/docker/cli", "/v1.0/docker/cli/json"] {
            let (status, ctype, body) = get(&api, &format!("{route}?{q}"));
            assert_eq!(status, StatusCode::BAD_REQUEST, "{q}");
            assert_eq!(ctype, TEXT);
            assert!(
                body.starts_with(reason) && body.ends_with('\n'),
                "{q}: {body}"
            );
        }
    }
}

#[test]
fn docker_cli_json_has_nvidia_docker_fields() {
    let (_, _, body) = get(&api(), "/docker/cli/json?dev=2");
    assert!(body.ends_with('\n'));
    let doc: serde_json::Value = serde_json::from_str(&body).expect("json");
    assert_eq!(
        doc,
        serde_json::json!({
            "VolumeDriver": "nvidia-docker",
            "Volumes": ["nvidia_driver_550.54.14:/usr/local/nvidia:ro"],
            "Devices": ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia2"],
            "Env": ["NVIDIA_VISIBLE_DEVICES=GPU-2222aaaa-0000-0000-0000-000000000002", "CUDA_VISIBLE_DEVICES=GPU-2222aaaa-0000-0000-0000-000000000002"],
        })
    );
}

#[test]
fn bind_mode_names_the_host_directory_once_it_exists() {
    let dir = tempfile::tempdir().expect("tempdir");
    let vol = dir.path().join("nvidia_550.54.14");
    let api = api_with(
        inventory(),
        VolumeSource::Bind {
            host_path: vol.clone(),
        },
        Arc::new(NoStatus),
    );
    let (status, _, body) = get(&api, "/docker/cli?dev=0");
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(body.contains("not built yet"), "{body}");
    std::fs::create_dir(&vol).expect("mkdir");
    let (status, _, body) = get(&api, "/docker/cli?dev=0");
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        body,
        format!(
            "--volume={}:/usr/local/nvidia:ro --device=/dev/nvidiactl --device=/dev/nvidia-uvm \
             --device=/dev/nvidia-uvm-tools --device=/dev/nvidia1 \
             --env=NVIDIA_VISIBLE_DEVICES=GPU-0000aaaa-0000-0000-0000-000000000001 --env=CUDA_VISIBLE_DEVICES=GPU-0000aaaa-0000-0000-0000-000000000001",
            vol.display()
        )
    );
    let doc: serde_json::Value =
        serde_json::from_str(&get(&api, "/docker/cli/json").2).expect("json");
    assert_eq!(doc["VolumeDriver"], "");
}

#[test]
fn no_driver_means_503_for_docker_cli_and_na_in_info() {
    let inv = Inventory {
        driver: None,
        gpus: vec![],
        topology: Topology::unknown(0),
        absent_reason: Some("no NVML".into()),
        mig: Default::default(),
    };
    let api = api_with(
        inv,
        VolumeSource::Plugin {
            plugin: "nvidia-docker".into(),
        },
        Arc::new(NoStatus),
    );
    assert_eq!(get(&api, "/docker/cli").0, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        get(&api, "/gpu/info").2,
        "\nDriver version:          N/A\nSupported CUDA version:  N/A\n\n"
    );
    let doc: serde_json::Value =
        serde_json::from_str(&get(&api, "/gpu/info/json").2).expect("json");
    assert_eq!(
        doc,
        serde_json::json!({"Version": {"Driver": null, "CUDA": null}, "Devices": []})
    );
    assert_eq!(get(&api, "/mesos/cli").0, StatusCode::OK);
}

#[test]
fn info_text_matches_the_go_template_layout() {
    // Go's tabwriter aligns every run of consecutive "label\tvalue" lines: the Clocks lines and
    // the P2P line form one run.
    let inv = Inventory {
        gpus: vec![gpu(0, 0)],
        topology: Topology::unknown(1),
        ..inventory()
    };
    let api = api_with(
        inv,
        VolumeSource::Plugin {
            plugin: "nvidia-docker".into(),
        },
        Arc::new(NoStatus),
    );
    let want = "
Driver version:          550.54.14
Supported CUDA version:  12.4

Device #0
  Model:         Tesla V100-SXM2-16GB
  UUID:          GPU-0000aaaa-0000-0000-0000-000000000000
  Path:          /dev/nvidia0
  Family:        Volta
  Arch:          7.0
  Cores:         N/A
  Power:         N/A
  CPU Affinity:  NUMA node0
  PCI
    Bus ID:     00000000:06:00.0
    BAR1:       N/A
    Bandwidth:  N/A
  Memory
    ECC:        N/A
    Global:     16384 MiB
    Constant:   N/A
    Shared:     N/A
    L2 Cache:   N/A
    Bandwidth:  N/A
  Clocks
    Cores:        N/A
    Memory:       N/A
  P2P Available:  None

";
    assert_eq!(get(&api, "/gpu/info").2, want);
}

#[test]
fn info_lists_p2p_peers_with_link_text() {
    let body = get(&api(), "/gpu/info").2;
    assert!(body.contains("  P2P Available\n    00000000:07:00.0 - 2 NVLinks\n    00000000:08:00.0 - Cross CPU socket\n"), "{body}");
    assert!(body.contains("Device #2\n"), "{body}");
}

#[test]
fn info_json_uses_go_names_and_nulls_for_unknown() {
    let doc: serde_json::Value =
        serde_json::from_str(&get(&api(), "/gpu/info/json").2).expect("json");
    assert_eq!(
        doc["Version"],
        serde_json::json!({"Driver": "550.54.14", "CUDA": "12.4"})
    );
    let d0 = &doc["Devices"][0];
    assert_eq!(d0["UUID"], "GPU-0000aaaa-0000-0000-0000-000000000001");
    assert_eq!(d0["Path"], "/dev/nvidia1");
    assert_eq!(d0["Model"], "Tesla V100-SXM2-16GB");
    assert_eq!(d0["Power"], serde_json::Value::Null);
    assert_eq!(d0["CPUAffinity"], 0);
    assert_eq!(
        d0["PCI"],
        serde_json::json!({"BusID": "00000000:06:00.0", "BAR1": null, "Bandwidth": null})
    );
    assert_eq!(
        d0["Topology"],
        serde_json::json!([{"BusID": "00000000:07:00.0", "Link": 8}, {"BusID": "00000000:08:00.0", "Link": 1}])
    );
    assert_eq!(d0["Family"], "Volta");
    assert_eq!(d0["Arch"], "7.0");
    assert_eq!(d0["Memory"]["Global"], 16384);
    assert_eq!(d0["Memory"]["ECC"], serde_json::Value::Null);
    let keys: Vec<&str> = d0
        .as_object()
        .expect("object")
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(keys.len(), 12, "{keys:?}");
}

struct Fixed;

impl GpuStatusSource for Fixed {
    fn details(&self, _gpu: &Gpu) -> GpuDetails {
        GpuDetails {
            power_limit_w: Some(300),
            bar1_mib: Some(16384),
            ..Default::default()
        }
    }

    fn status(&self, gpu: &Gpu) -> GpuStatus {
        GpuStatus {
            power_w: Some(41),
            temperature_c: Some(35),
            utilization: Utilization {
                gpu: Some(gpu.index * 10),
                memory: Some(0),
                encoder: None,
                decoder: None,
            },
            memory_used_mib: Some(512),
            processes: Some(if gpu.index == 0 {
                vec![GpuProcess {
                    pid: 4242,
                    name: Some("python".into()),
                    memory_used_mib: Some(500),
                }]
            } else {
                vec![]
            }),
            ..Default::default()
        }
    }
}

#[test]
fn status_shows_known_values_and_na_for_unknown() {
    let api = api_with(
        inventory(),
        VolumeSource::Plugin {
            plugin: "nvidia-docker".into(),
        },
        Arc::new(Fixed),
    );
    let body = get(&api, "/gpu/status").2;
    let first = body.split("Device #1").next().expect("device 0");
    for line in [
        "\nDevice #0\n",
        "  Power:        41 / 300 W\n",
        "  Temperature:  35 °C\n",
        "    GPU:      0 %\n",
        "    Encoder:  N/A\n",
        "    Global:  512 / 16384 MiB\n",
        "      L1 Cache:  N/A\n",
        "    BAR1:  N/A\n",
        "  Processes\n    - PID:     4242\n      Name:    python\n      Memory:  500 MiB\n",
    ] {
        assert!(first.contains(line), "missing {line:?} in\n{first}");
    }
    assert!(body.contains("  Processes:  None\n"), "{body}");
    let unknown = get(
        &api_with(
            inventory(),
            VolumeSource::Plugin { plugin: "x".into() },
            Arc::new(NoStatus),
        ),
        "/gpu/status",
    )
    .2;
    assert!(
        unknown.contains("  Power:        N/A\n") && unknown.contains("  Processes:  N/A\n"),
        "{unknown}"
    );
    let invented: Vec<&str> = unknown
        .lines()
        .filter(|l| {
            l.split_once(':')
                .is_some_and(|(_, v)| v.chars().any(|c| c.is_ascii_digit()))
        })
        .collect();
    assert_eq!(invented, Vec::<&str>::new(), "no numbers without a source");
}

#[test]
fn status_json_nulls_unknown_fields() {
    let doc: serde_json::Value =
        serde_json::from_str(&get(&api(), "/gpu/status/json").2).expect("json");
    let d = &doc["Devices"][0];
    assert_eq!(
        *d,
        serde_json::json!({
            "Power": null, "Temperature": null,
            "Utilization": {"GPU": null, "Memory": null, "Encoder": null, "Decoder": null},
            "Memory": {"GlobalUsed": null, "ECCErrors": {"L1Cache": null, "L2Cache": null, "Global": null}},
            "Clocks": {"Cores": null, "Memory": null},
            "PCI": {"BAR1Used": null, "Throughput": {"RX": null, "TX": null}},
            "Processes": null,
        })
    );
    let api = api_with(
        inventory(),
        VolumeSource::Plugin { plugin: "x".into() },
        Arc::new(Fixed),
    );
    let doc: serde_json::Value =
        serde_json::from_str(&get(&api, "/gpu/status/json").2).expect("json");
    assert_eq!(
        doc["Devices"][0]["Processes"],
        serde_json::json!([{"PID": 4242, "Name": "python", "MemoryUsed": 500}])
    );
    assert_eq!(doc["Devices"][1]["Processes"], serde_json::json!([]));
}

#[test]
fn mesos_cli_carries_compressed_info_and_uuids() {
    let api = api();
    let body = get(&api, "/mesos/cli").2;
    let (attr, res) = body.split_once(' ').expect("two flags");
    let b64 = attr.strip_prefix("--attributes=gpus:").expect("attributes");
    assert!(
        !b64.contains('=') && !b64.contains('+') && !b64.contains('/'),
        "{b64}"
    );
    let zipped = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(b64)
        .expect("base64");
    let mut json = String::new();
    flate2::read::ZlibDecoder::new(zipped.as_slice())
        .read_to_string(&mut json)
        .expect("zlib");
    assert_eq!(json, get(&api, "/gpu/info/json").2);
    let inv = inventory();
    let uuids: Vec<&str> = inv.gpus.iter().map(|g| g.uuid.as_str()).collect();
    assert_eq!(res, format!("--resources=gpus:{{{}}}", uuids.join(",")));
}

#[test]
fn metrics_are_served_only_when_given() {
    use crate::metrics::{CONTENT_TYPE_OPENMETRICS, FigureSource, Metrics, NodeFigures};

    struct Empty;
    impl FigureSource for Empty {
        fn collect(&self) -> NodeFigures {
            NodeFigures::default()
        }
    }
    assert_eq!(get(&api(), "/metrics").0, StatusCode::NOT_FOUND);
    let metrics = Arc::new(Metrics::new(Arc::new(Empty), std::time::Duration::ZERO));
    let api = api().with_metrics(metrics);
    let (status, ctype, body) = get(&api, "/metrics");
    assert_eq!(
        (status, ctype.as_str()),
        (StatusCode::OK, CONTENT_TYPE_OPENMETRICS)
    );
    assert!(body.ends_with("# EOF\n"), "{body}");
    assert_eq!(get(&api, "/v1.0/metrics").0, StatusCode::NOT_FOUND);
    let post = api.respond(&Method::POST, "/metrics", None);
    assert_eq!(post.status(), StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(get(&api, "/gpu/info").0, StatusCode::OK);
}
