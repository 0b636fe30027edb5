//! One grant, every rendering: for each kind of request (whole GPUs, a share under time-slicing,
//! a share under MPS, MIG devices of the single and of the mixed strategy, a share of a MIG
//! device under MPS by either strategy, NUMA-pinned GPUs, no GPU) every renderer of what a container gets is asked, and each must give the same device
//! nodes and variables (`NVIDIA_VISIBLE_DEVICES`, `CUDA_VISIBLE_DEVICES`, a share's
//! `MESOS_GPU_SHARE*` and `CUDA_MPS_*`, an MPS share's pipe directory and `/dev/shm`, the
//! cpuset), or refuse the part it cannot carry with the reason. Never drop a part silently.
//!
//! The renderers:
//! - **Mesos**: the isolator's launch info ([`mesos_launch_info`]) as the module hands it to the agent
//!   ([`launch_info`], the `ContainerLaunchInfo` protobuf). The cpuset is not part of
//!   it: the isolator writes it into the container's cpuset cgroup at `isolate`
//!   (`mesos_gpu_enforce::pinning`), so this column checks that the launch info carries
//!   everything else and leaves the cpuset to the cgroup.
//! - **Docker** ([`LaunchPlan`]): `docker-args`, `docker-wrapper`, the REST API,
//!   `run` and the demo render every Docker container with it (`DockerLaunch::render`).
//! - **Hook**: the agent's Docker hook (the module's C ABI `mgpu_docker_hook_launch_argv`) runs
//!   `docker-args` for the task, which renders with [`LaunchPlan`]: this column checks that the
//!   command asks for every part of the request (GPUs or share units, each MIG profile, the
//!   task's CPUs for pinning).
//! - **CDI** container edits ([`container_edits`]): CDI edits cannot set a cpuset, so a pinned
//!   grant is refused.
//! - **REST** `/docker/cli/json` (nvidia-docker 1.0's API, [`RestApi`]): it reserves nothing, so a
//!   share or pinning is refused with the reason; it cannot ask for no GPU (an empty `dev=` means
//!   all GPUs, as in nvidia-docker).
//!
//! A MIG device's `/proc/driver/nvidia/capabilities/…/access` files are mounted by Mesos only:
//! runc refuses bind mounts inside `/proc`, so Docker and CDI leave them out (see
//! `mesos_gpu_grant::MountKind::MigAccessFile`); they are not compared.

mod support;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use http_body_util::BodyExt as _;
use hyper::{Method, StatusCode};
use mesos_gpu::proto::mesos::slave::ContainerConfig;
use mesos_gpu::proto::mesos::{Resource, value};
use mesos_gpu::testing::launch_info;
use mesos_gpu_docker::args::{ImageInfo, LaunchPlan, VOLUMES_NEEDED_LABEL, VolumeSource};
use mesos_gpu_docker::cdi::node::container_edits;
use mesos_gpu_docker::rest::status::NoStatus;
use mesos_gpu_docker::rest::{Devices, RestApi};
use mesos_gpu_enforce::cgroup::default_whitelist;
use mesos_gpu_grant::{Grant, MigAccess, ShareAccess};
use mesos_gpu_isolator::lifecycle::{ContainerId, PrepareConfig, mesos_launch_info};
use mesos_gpu_node::devices::DeviceNodes;
use mesos_gpu_node::inventory::{DevNum, DriverInfo, Gpu, Inventory, MigCaps, MigDevice};
use mesos_gpu_placement::numa::Pinning;
use mesos_gpu_placement::sharing::{PlacedShare, ShareLimits, SharingMode};
use prost::Message as _;
use support::parts::{COMPARED_ENV, Parts, differences, docker_parts, launch_parts};

/// Where the container's root is, for Mesos's launch info (mount targets are under it).
const ROOTFS: &str = "/rootfs";
/// An MPS daemon's pipe directory.
const PIPE: &str = "/run/mesos-gpu/mps/GPU-2/pipe";
/// The hook's `docker_args` module parameter.
const HOOK_COMMAND: &str = "/usr/bin/mesos-gpu docker-args --numa-pinning";

/// One kind of request: the grant placement and the pool would make, and how the other paths
/// ask for the same thing.
struct Case {
    name: &'static str,
    grant: Grant,
    /// The task's resources, for the hook.
    resources: Vec<Resource>,
    /// What the hook's command must ask for.
    hook_asks: Vec<String>,
    /// The `/docker/cli/json` query, or why REST cannot be asked for this kind.
    rest_query: Result<String, &'static str>,
}

fn inventory() -> Inventory {
    let gpu = |index: u32| Gpu {
        index,
        minor: index,
        uuid: format!("GPU-{index}"),
        name: if index < 4 { "T4" } else { "A100" }.to_owned(),
        memory_total: 16 << 30,
        pci_bus_id: String::new(),
        numa_node: Some(index / 2),
        compute_capability: Some((8, 0)),
        healthy: true,
    };
    let mig = |uuid: &str, parent: u32, profile: u32, name: &str, cap: u32| MigDevice {
        parent,
        parent_minor: parent,
        index: 0,
        uuid: uuid.to_owned(),
        gpu_instance: cap,
        compute_instance: 0,
        profile: Some(profile),
        profile_name: name.to_owned(),
        memory_total: 10 << 30,
        multiprocessors: 14,
        gpu_instance_slices: 1,
        compute_instance_slices: 1,
        caps: Some(MigCaps {
            gpu_instance: DevNum {
                major: 237,
                minor: cap,
            },
            compute_instance: DevNum {
                major: 237,
                minor: cap + 1,
            },
            gpu_instance_file: format!("driver/nvidia/capabilities/gpu{parent}/mig/gi{cap}/access"),
            compute_instance_file: format!(
                "driver/nvidia/capabilities/gpu{parent}/mig/gi{cap}/ci0/access"
            ),
        }),
        healthy: true,
    };
    let mut inventory = Inventory {
        driver: Some(DriverInfo {
            version: "550.54.14".to_owned(),
            cuda_version: Some((12, 4)),
        }),
        gpus: (0..6).map(gpu).collect(),
        ..Inventory::default()
    };
    inventory.mig.enabled = vec![4, 5];
    inventory.mig.caps_major = Some(237);
    inventory.mig.devices = vec![
        mig("MIG-a", 4, 19, "1g.10gb", 21),
        mig("MIG-b", 5, 14, "2g.20gb", 31),
    ];
    inventory
}

fn scalar(name: &str, v: f64) -> Resource {
    Resource {
        name: name.into(),
        r#type: value::Type::Scalar as i32,
        scalar: Some(value::Scalar { value: v }),
        ..Resource::default()
    }
}

fn cases(inventory: &Inventory, nodes: &DeviceNodes) -> Vec<Case> {
    let base = default_whitelist();
    let gpus = |indices: &[u32]| -> Vec<Gpu> {
        indices
            .iter()
            .map(|&i| inventory.gpus[i as usize].clone())
            .collect()
    };
    let mig = |uuid: &str| {
        let device = inventory.mig.by_uuid(uuid).expect("MIG device");
        MigAccess::of(device, Path::new("/dev"), Path::new("/proc")).expect("caps")
    };
    let share = |mode: SharingMode, pipe: Option<PathBuf>| {
        ShareAccess::new(
            PlacedShare {
                uuid: "GPU-2".to_owned(),
                index: 2,
                units: 1,
                replicas: 4,
                mode,
                limits: ShareLimits::of(1, 4, 16 << 30),
            },
            pipe,
        )
    };
    // A share of a MIG device: its UUID names the device, its index the parent GPU; the pipe
    // directory is that of the device's own daemon.
    let mig_share = |uuid: &str, units: u32, replicas: u32| {
        let device = inventory.mig.by_uuid(uuid).expect("MIG device");
        ShareAccess::new(
            PlacedShare {
                uuid: uuid.to_owned(),
                index: device.parent,
                units,
                replicas,
                mode: SharingMode::Mps,
                limits: ShareLimits::of(units, replicas, device.memory_total),
            },
            Some(PathBuf::from(format!("/run/mesos-gpu/mps/{uuid}/pipe"))),
        )
    };
    let grant = |gpus: Vec<Gpu>, mig: Vec<MigAccess>, share: Option<ShareAccess>| {
        Grant::new(nodes, &base, gpus, mig, share).expect("grant")
    };
    let pinning = Pinning {
        cpus: "0-3".parse().expect("cpus"),
        mems: Some("0".parse().expect("mems")),
    };
    vec![
        Case {
            name: "whole GPUs",
            grant: grant(gpus(&[1, 3]), vec![], None),
            resources: vec![scalar("gpus", 2.0)],
            hook_asks: vec!["--gpus=2".into()],
            rest_query: Ok("dev=1+3".into()),
        },
        Case {
            name: "a share under time-slicing",
            grant: grant(
                gpus(&[2]),
                vec![],
                Some(share(SharingMode::TimeSlicing, None)),
            ),
            resources: vec![scalar("gpus", 1.0)],
            hook_asks: vec!["--gpus=1".into()],
            rest_query: Ok("dev=2&gpu_replicas=4".into()),
        },
        Case {
            name: "a share under MPS",
            grant: grant(
                gpus(&[2]),
                vec![],
                Some(share(SharingMode::Mps, Some(PathBuf::from(PIPE)))),
            ),
            resources: vec![scalar("gpus", 1.0)],
            hook_asks: vec!["--gpus=1".into()],
            rest_query: Ok("dev=2&gpu_replicas=4&gpu_sharing=mps".into()),
        },
        Case {
            name: "a MIG device (single strategy)",
            grant: grant(vec![], vec![mig("MIG-a")], None),
            resources: vec![scalar("gpus", 1.0)],
            hook_asks: vec!["--gpus=1".into()],
            rest_query: Ok("dev=MIG-a".into()),
        },
        Case {
            name: "MIG devices of two profiles (mixed strategy)",
            grant: grant(vec![], vec![mig("MIG-a"), mig("MIG-b")], None),
            resources: vec![scalar("mig-1g.10gb", 1.0), scalar("mig-2g.20gb", 1.0)],
            hook_asks: vec![
                "--gpus=0".into(),
                "--mig=mig-1g.10gb:1".into(),
                "--mig=mig-2g.20gb:1".into(),
            ],
            rest_query: Ok("dev=MIG-a+MIG-b".into()),
        },
        Case {
            name: "a share of a MIG device under MPS (single strategy)",
            grant: grant(vec![], vec![mig("MIG-a")], Some(mig_share("MIG-a", 1, 2))),
            resources: vec![scalar("gpus", 1.0)],
            hook_asks: vec!["--gpus=1".into()],
            rest_query: Ok("dev=MIG-a&gpu_replicas=2&gpu_sharing=mps".into()),
        },
        Case {
            name: "a share of a MIG device under MPS (mixed strategy)",
            grant: grant(vec![], vec![mig("MIG-b")], Some(mig_share("MIG-b", 3, 4))),
            resources: vec![scalar("mig-2g.20gb", 3.0)],
            hook_asks: vec!["--gpus=0".into(), "--mig=mig-2g.20gb:3".into()],
            rest_query: Ok("dev=MIG-b&gpu_replicas=4&gpu_sharing=mps".into()),
        },
        Case {
            name: "NUMA-pinned GPUs",
            grant: grant(gpus(&[0, 1]), vec![], None).pinned(Some(pinning)),
            resources: vec![scalar("gpus", 2.0), scalar("cpus", 4.0)],
            hook_asks: vec!["--gpus=2".into(), "--cpus=4".into()],
            rest_query: Ok("dev=0+1&numa_pinning=1&cpus=4".into()),
        },
        Case {
            name: "no GPU",
            grant: grant(vec![], vec![], None),
            resources: vec![scalar("cpus", 1.0)],
            hook_asks: vec![],
            rest_query: Err("an empty dev= means every GPU (nvidia-docker 1.0)"),
        },
    ]
}

/// What the grant itself says the container gets.
fn expected(grant: &Grant) -> Parts {
    let mut parts = Parts {
        devices: grant
            .devices()
            .iter()
            .map(|d| d.host.display().to_string())
            .collect(),
        cpuset: grant
            .cpuset()
            .map(|p| (p.cpus.to_string(), p.mems.as_ref().map(ToString::to_string))),
        mounts: grant
            .mounts()
            .iter()
            .filter(|m| m.kind == mesos_gpu_grant::MountKind::Mps)
            .map(|m| {
                (
                    m.source.display().to_string(),
                    m.target.display().to_string(),
                )
            })
            .collect(),
        ..Parts::default()
    };
    let env = grant.env();
    parts.keep_env(env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    parts
}

/// The image every Docker-side renderer is given: it asks for the driver (as CUDA images do), so
/// a container without GPUs still gets `NVIDIA_VISIBLE_DEVICES=none`.
fn image() -> ImageInfo {
    ImageInfo {
        labels: [(VOLUMES_NEEDED_LABEL.to_owned(), "nvidia_driver".to_owned())].into(),
        env: Vec::new(),
    }
}

fn mesos(grant: &Grant) -> Result<Parts, String> {
    // The same image as the Docker side's: it asks for the driver.
    let config = PrepareConfig {
        rootfs: Some(PathBuf::from(ROOTFS)),
        image_labels: image().labels.into_keys().collect(),
        ..PrepareConfig::default()
    };
    let id = ContainerId::new("parity").expect("id");
    let info = mesos_launch_info(&id, &config, grant, None, None).map_err(|e| e.to_string())?;
    let proto = launch_info(&info);
    Ok(launch_parts(&proto, Path::new(ROOTFS), Path::new("/dev")))
}

fn docker(grant: &Grant) -> Result<Parts, String> {
    let plan = LaunchPlan::new(grant, &image(), Some(&driver())).map_err(|e| e.to_string())?;
    Ok(docker_parts(&plan.cli_args()))
}

fn driver() -> mesos_gpu_docker::args::DriverSpec {
    mesos_gpu_docker::args::DriverSpec {
        info: inventory().driver.expect("driver"),
        volume: VolumeSource::Bind {
            host_path: PathBuf::from("/var/run/mesos/isolators/gpu/nvidia_550.54.14"),
        },
    }
}

fn cdi(grant: &Grant) -> Result<Parts, String> {
    let edits = container_edits(grant).map_err(|e| e.to_string())?;
    let mut parts = Parts::default();
    for node in &edits.device_nodes {
        parts
            .devices
            .insert(node.host_path.clone().unwrap_or_else(|| node.path.clone()));
    }
    for env in &edits.env {
        let (k, v) = env.split_once('=').unwrap_or((env, ""));
        parts.keep_env([(k, v)]);
    }
    for m in &edits.mounts {
        parts
            .mounts
            .insert((m.host_path.clone(), m.container_path.clone()));
    }
    Ok(parts)
}

fn rest(api: &RestApi, query: &str) -> Result<Parts, String> {
    let resp = api.respond(&Method::GET, "/docker/cli/json", Some(query));
    let status = resp.status();
    let body = futures_util::FutureExt::now_or_never(resp.into_body().collect())
        .expect("ready")
        .expect("body")
        .to_bytes();
    let text = String::from_utf8(body.to_vec()).expect("utf-8");
    if status != StatusCode::OK {
        return Err(text.trim_end().to_owned());
    }
    let doc: serde_json::Value = serde_json::from_str(&text).expect("json");
    let mut parts = Parts::default();
    for d in doc["Devices"].as_array().into_iter().flatten() {
        let d = d.as_str().expect("device");
        parts
            .devices
            .insert(d.split(':').next().unwrap_or(d).to_owned());
    }
    for e in doc["Env"].as_array().into_iter().flatten() {
        let e = e.as_str().expect("env");
        let (k, v) = e.split_once('=').unwrap_or((e, ""));
        parts.keep_env([(k, v)]);
    }
    Ok(parts)
}

/// The docker-args command line the hook runs for a task with `resources`, through the C ABI.
fn hook(resources: &[Resource]) -> Result<Vec<String>, String> {
    let config = ContainerConfig {
        resources: resources.to_vec(),
        ..ContainerConfig::default()
    }
    .encode_to_vec();
    support::hook_launch_argv(HOOK_COMMAND, &config, "mesos-parity")
}

/// `same` when `found` is empty, else `DIFFERS` (the differences go to `problems`).
fn verdict(problems: &mut Vec<String>, found: Vec<String>) -> String {
    let text = if found.is_empty() { "same" } else { "DIFFERS" };
    problems.extend(found);
    text.to_owned()
}

#[test]
fn every_renderer_gives_every_kind_of_request_the_same_devices_and_variables_or_refuses() {
    let inventory = inventory();
    let nodes = DeviceNodes::named(Path::new("/dev"), &inventory);
    let api = RestApi::new(
        Arc::new(inventory.clone()),
        Devices {
            nodes: nodes.clone(),
            dev_root: PathBuf::from("/dev"),
            proc_root: PathBuf::from("/proc"),
        },
        VolumeSource::Plugin {
            plugin: "nvidia-docker".to_owned(),
        },
        Arc::new(NoStatus),
    );
    let mut problems = Vec::new();
    let mut table = Vec::new();
    for case in cases(&inventory, &nodes) {
        let want = expected(&case.grant);
        let shares = case.grant.share().is_some();
        let pinned = case.grant.cpuset().is_some();
        let mut row = vec![case.name.to_owned()];

        // Mesos: everything but the cpuset, which the isolator writes into the cpuset cgroup.
        match mesos(&case.grant) {
            Ok(got) => row.push(verdict(
                &mut problems,
                differences(case.name, "Mesos", ("the grant", &want), &got, false),
            )),
            Err(e) => problems.push(format!("{}: Mesos refused: {e}", case.name)),
        }

        // Docker: every part.
        match docker(&case.grant) {
            Ok(got) => row.push(verdict(
                &mut problems,
                differences(case.name, "Docker", ("the grant", &want), &got, true),
            )),
            Err(e) => problems.push(format!("{}: Docker refused: {e}", case.name)),
        }

        // Hook: the docker-args command asks for every part of the request.
        match hook(&case.resources) {
            Ok(argv) => {
                for ask in &case.hook_asks {
                    if !argv.contains(ask) {
                        problems.push(format!(
                            "{}: the hook's command does not ask {ask}: {argv:?}",
                            case.name
                        ));
                    }
                }
                if case.hook_asks.is_empty() && !argv.is_empty() {
                    problems.push(format!(
                        "{}: the hook runs {argv:?} for a task without GPUs",
                        case.name
                    ));
                }
                row.push("asks all".into());
            }
            Err(e) => problems.push(format!("{}: the hook refused: {e}", case.name)),
        }

        // CDI: every part but a cpuset, which it refuses naming it.
        match (cdi(&case.grant), pinned) {
            (Ok(got), false) => row.push(verdict(
                &mut problems,
                differences(case.name, "CDI", ("the grant", &want), &got, true),
            )),
            (Err(e), true) if e.contains("cpuset") && e.contains("0-3") => {
                row.push(format!("refused: {e}"));
            }
            (Ok(_), true) => problems.push(format!("{}: CDI dropped the cpuset", case.name)),
            (Err(e), _) => problems.push(format!("{}: CDI refused: {e}", case.name)),
        }

        // REST: what it can ask for, the same; a share or pinning refused with the reason.
        match (&case.rest_query, shares || pinned) {
            (Err(why), _) => row.push(format!("n/a: {why}")),
            (Ok(query), false) => match rest(&api, query) {
                Ok(got) => row.push(verdict(
                    &mut problems,
                    differences(
                        case.name,
                        "REST /docker/cli",
                        ("the grant", &want),
                        &got,
                        true,
                    ),
                )),
                Err(e) => problems.push(format!("{}: REST refused {query}: {e}", case.name)),
            },
            (Ok(query), true) => match rest(&api, query) {
                Err(e) if e.contains("reserves nothing") && e.contains("docker-args") => {
                    row.push(format!("refused: {e}"));
                }
                Err(e) => problems.push(format!(
                    "{}: REST refused {query} without saying why it cannot: {e}",
                    case.name
                )),
                Ok(got) => problems.push(format!(
                    "{}: REST answered {query} without the share or pinning: {got:?}",
                    case.name
                )),
            },
        }
        table.push(row.join(" | "));
    }
    println!("{}", table.join("\n"));
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_table_covers_every_part_it_compares() {
    let inventory = inventory();
    let nodes = DeviceNodes::named(Path::new("/dev"), &inventory);
    let cases = cases(&inventory, &nodes);
    let all: Vec<Parts> = cases.iter().map(|c| expected(&c.grant)).collect();
    for key in COMPARED_ENV {
        assert!(
            all.iter().any(|p| p.env.contains_key(key)),
            "no case sets {key}"
        );
    }
    assert!(all.iter().any(|p| p.cpuset.is_some()), "no pinned case");
    assert!(
        all.iter().any(|p| {
            p.env
                .get("CUDA_VISIBLE_DEVICES")
                .is_some_and(|v| v.starts_with("MIG-"))
                && p.env.contains_key("CUDA_MPS_PIPE_DIRECTORY")
        }),
        "no share of a MIG device"
    );
    assert!(all.iter().any(|p| !p.mounts.is_empty()), "no MPS mounts");
    assert!(
        all.iter()
            .any(|p| p.devices.iter().any(|d| d.contains("nvidia-caps"))),
        "no MIG capability node"
    );
    assert!(
        all.iter()
            .any(|p| p.env.get("NVIDIA_VISIBLE_DEVICES").map(String::as_str) == Some("none")),
        "no case without GPUs"
    );
}
