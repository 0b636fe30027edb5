//! Docker argument building and the `/docker/cli` page, for an 8-GPU node.

use std::path::PathBuf;
use std::sync::Arc;

use criterion::{Criterion, criterion_group, criterion_main};
use hyper::Method;
use mesos_gpu_docker::args::{
    DriverSpec, ImageInfo, LaunchPlan, VOLUMES_NEEDED_LABEL, VolumeSource,
};
use mesos_gpu_docker::client::host_config;
use mesos_gpu_docker::rest::status::NoStatus;
use mesos_gpu_docker::rest::{Devices, RestApi};
use mesos_gpu_grant::Grant;
use mesos_gpu_node::devices::DeviceNodes;
use mesos_gpu_node::{
    inventory::DriverInfo, inventory::Gpu, inventory::Inventory, inventory::Topology,
};

fn inventory() -> Inventory {
    let gpus = (0..8u32)
        .map(|i| Gpu {
            index: i,
            minor: 7 - i,
            uuid: format!("GPU-{i:08x}-0000-0000-0000-000000000000"),
            name: "Tesla V100-SXM2-16GB".to_owned(),
            memory_total: 16 << 30,
            pci_bus_id: format!("00000000:{:02X}:00.0", 0x10 + i),
            numa_node: Some(i / 4),
            compute_capability: Some((7, 0)),
            healthy: true,
        })
        .collect();
    Inventory {
        driver: Some(DriverInfo {
            version: "550.54.14".to_owned(),
            cuda_version: Some((12, 4)),
        }),
        gpus,
        topology: Topology::unknown(8),
        absent_reason: None,
        mig: Default::default(),
    }
}

fn bench(c: &mut Criterion) {
    let inv = inventory();
    let host = Devices {
        nodes: DeviceNodes::named(std::path::Path::new("/dev"), &inv),
        dev_root: PathBuf::from("/dev"),
        proc_root: PathBuf::from("/proc"),
    };
    let image = ImageInfo {
        labels: [(VOLUMES_NEEDED_LABEL.to_owned(), "nvidia_driver".to_owned())].into(),
        env: vec!["PATH=/usr/local/cuda/bin:/usr/bin:/bin".to_owned()],
    };
    let driver = DriverSpec {
        info: DriverInfo {
            version: "550.54.14".to_owned(),
            cuda_version: Some((12, 4)),
        },
        volume: VolumeSource::Bind {
            host_path: PathBuf::from("/var/run/mesos/isolators/gpu/nvidia_550.54.14"),
        },
    };
    let gpus: Vec<Gpu> = inv.gpus.iter().take(4).cloned().collect();
    let grant = || Grant::new(&host.nodes, &[], gpus.clone(), vec![], None).expect("grant");
    c.bench_function("plan_4_of_8_gpus_cli_args", |b| {
        b.iter(|| LaunchPlan::new(&grant(), &image, Some(&driver)).map(|p| p.cli_args()))
    });
    let plan = LaunchPlan::new(&grant(), &image, Some(&driver)).expect("plan");
    c.bench_function("host_config_4_gpus", |b| b.iter(|| host_config(&plan)));
    let api = RestApi::new(
        Arc::new(inv.clone()),
        host.clone(),
        VolumeSource::Plugin {
            plugin: "nvidia-docker".to_owned(),
        },
        Arc::new(NoStatus),
    );
    c.bench_function("rest_docker_cli_dev_0_1", |b| {
        b.iter(|| api.respond(&Method::GET, "/v1.0/docker/cli", Some("dev=0+1")))
    });
    c.bench_function("rest_gpu_info_text_8_gpus", |b| {
        b.iter(|| api.respond(&Method::GET, "/gpu/info", None))
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
