//! One decision, whatever the entry point: each kind of request is sent through every way a
//! container gets GPUs on a simulated node, and what each finally gives the container is
//! compared with what the module gives it through its C ABI. Where `ffi/tests/parity.rs` hands
//! every renderer the same hand-made grant, here each entry point makes its own, as in
//! production:
//!
//! - **module**: `mgpu_prepare` (then the cpuset the module wrote into the container's cpuset
//!   cgroup), the reference;
//! - **hook → wrapper**: the Docker hook's C ABI (`mgpu_docker_hook_launch_argv`) gives the
//!   `docker-args` command the agent runs; its answer goes, as the agent passes it, into
//!   `MESOS_GPU_DOCKER_ARGS` of a `docker run` given to the real `mesos-gpu docker-wrapper`, and
//!   what the wrapper finally passes to `docker` is compared (a stand-in `docker` records it);
//! - **docker-args**: the command as an operator runs it, `--image` named;
//! - **run**: `mesos-gpu run` of a plain busybox image in the real dockerd (it takes whole GPUs,
//!   pinned or not), what Docker gave the container read back with `docker inspect`;
//! - **CDI**: the node's spec from `mesos-gpu cdi generate`, the devices the module granted asked
//!   by UUID (a CDI device is a whole GPU or MIG device: a share or a pinned request is not
//!   asked; a CDI device carries no variables, as NVIDIA's: the common edits'
//!   `NVIDIA_VISIBLE_DEVICES=void` is checked instead);
//! - **REST**: nvidia-docker 1.0's `/docker/cli/json` for the same devices (it reserves nothing,
//!   so neither shares nor pins: those requests are not asked).
//!
//! A request that cannot be granted (MIG devices with a GPU) must be refused by the module and by
//! every Docker entry point, each naming why.
//!
//! Each Docker entry point runs twice: for an image that asks for the driver (a CUDA image's
//! `com.nvidia.volumes.needed` label) and for a plain one. A container holding a device gets the
//! same device nodes, `NVIDIA_VISIBLE_DEVICES`, `CUDA_VISIBLE_DEVICES`, share variables, MPS
//! mounts and cpuset either way (e1d0892's wrapper gave a plain image only the device nodes).
//! The driver volume is not compared: the module runs with `driver_volume=off`.

mod support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::sync::Arc;

use http_body_util::BodyExt as _;
use hyper::{Method, StatusCode};
use libtest_mimic::Arguments;
use mesos_gpu::MgpuStatus;
use mesos_gpu::proto::mesos::slave::{ContainerConfig, ContainerLaunchInfo};
use mesos_gpu::proto::mesos::{Resource, value};
use mesos_gpu_docker::args::VolumeSource;
use mesos_gpu_docker::rest::status::NoStatus;
use mesos_gpu_docker::rest::{Devices, RestApi};
use mesos_gpu_node::devices::DeviceNodes;
use mesos_gpu_node::inventory::Inventory;
use mesos_gpu_testkit::dockerd::FakeDockerd;
use mesos_gpu_testkit::mps::MpsControl;
use mesos_gpu_testkit::nvml_sim::SimNode;
use mesos_gpu_testkit::{Host, Need, needs};
use prost::Message as _;
use support::parts::{Parts, differences, docker_parts, launch_parts};
use support::{Handle, TestResult, check, mesos_gpu_bin, mknod, trial};

/// The label by which an image asks for the driver (CUDA images carry it).
const DRIVER_LABEL: (&str, &str) = ("com.nvidia.volumes.needed", "nvidia_driver");

fn main() -> ExitCode {
    let host = Host::probe();
    let trials = vec![needs(
        &host,
        &[Need::Root, Need::Cgroup1, Need::Cpuset1, Need::Dockerd],
        trial(
            "every_entry_point_gives_every_kind_of_request_what_the_module_gives",
            every_entry_point_agrees,
        ),
    )];
    libtest_mimic::run(&Arguments::from_args(), trials).exit_code()
}

/// One kind of request, as a Mesos task asks for it.
struct Case {
    name: &'static str,
    /// The simulated node (`nvml-sim/topologies/<node>.json`).
    node: &'static str,
    /// `gpus`.
    gpus: f64,
    /// `mig-<profile>` scalars.
    mig: Vec<(&'static str, f64)>,
    /// `cpus`, when NUMA pinning is on.
    pinned_cpus: Option<f64>,
    /// Module parameters and the same as `docker-args` options.
    params: Vec<(&'static str, &'static str)>,
    docker_options: Vec<&'static str>,
    /// Whether CDI and REST can be asked: they name devices, and neither shares nor pins one.
    names_devices: bool,
    /// Whether `mesos-gpu run` can be asked: it takes whole GPUs, pinned or not (no share, no
    /// MIG device).
    whole: bool,
    /// A request every entry point must refuse, each naming why (the reason must mention
    /// `refusal`).
    refusal: Option<&'static str>,
    /// Shares under MPS: each entry point starts its own daemons (the stand-in
    /// `nvidia-cuda-mps-control`) under its own MPS root, written `<mps>` when compared.
    mps: bool,
}

fn cases() -> Vec<Case> {
    let plain = |name, node, gpus| Case {
        name,
        node,
        gpus,
        mig: Vec::new(),
        pinned_cpus: None,
        params: Vec::new(),
        docker_options: Vec::new(),
        names_devices: true,
        whole: true,
        refusal: None,
        mps: false,
    };
    vec![
        plain("one GPU", "numa-2cpu", 1.0),
        plain("two GPUs", "numa-2cpu", 2.0),
        plain("no GPU", "numa-2cpu", 0.0),
        Case {
            pinned_cpus: Some(1.0),
            params: vec![("numa_pinning", "on")],
            docker_options: vec!["--numa-pinning"],
            names_devices: false,
            ..plain("one GPU, NUMA-pinned", "numa-2cpu", 1.0)
        },
        Case {
            params: vec![("gpu_replicas", "4")],
            docker_options: vec!["--gpu-replicas", "4"],
            names_devices: false,
            whole: false,
            // On a node sharing its GPUs `gpus` counts units: one of a GPU's four.
            ..plain("a share, time-slicing (1 of 4)", "numa-2cpu", 1.0)
        },
        Case {
            params: vec![("gpu_replicas", "4")],
            docker_options: vec!["--gpu-replicas", "4"],
            names_devices: false,
            whole: false,
            mps: true,
            ..plain("a share, MPS (2 of 4)", "numa-2cpu", 2.0)
        },
        Case {
            params: vec![("mig_strategy", "mixed")],
            docker_options: vec!["--mig-strategy", "mixed"],
            ..plain(
                "a whole GPU beside MIG devices (mixed)",
                "dgx-a100-mixed",
                1.0,
            )
        },
        Case {
            mig: vec![("mig-1g.5gb", 1.0)],
            params: vec![("mig_strategy", "mixed")],
            docker_options: vec!["--mig-strategy", "mixed"],
            whole: false,
            ..plain("one MIG device (mixed)", "dgx-a100-mixed", 0.0)
        },
        Case {
            mig: vec![("mig-1g.5gb", 1.0)],
            pinned_cpus: Some(1.0),
            params: vec![("mig_strategy", "mixed"), ("numa_pinning", "on")],
            docker_options: vec!["--mig-strategy", "mixed", "--numa-pinning"],
            names_devices: false,
            whole: false,
            // A MIG device has no affinity of its own: its parent GPU's decides.
            ..plain("one MIG device, NUMA-pinned", "dgx-a100-mixed@2cpu", 0.0)
        },
        Case {
            params: vec![("mig_strategy", "single")],
            docker_options: vec!["--mig-strategy", "single"],
            whole: false,
            // Every GPU in MIG mode: `gpus:1` is one MIG device.
            ..plain("one MIG device (single)", "dgx-a100-mig", 1.0)
        },
        Case {
            params: vec![("mig_strategy", "single"), ("gpu_replicas", "4")],
            docker_options: vec!["--mig-strategy", "single", "--gpu-replicas", "4"],
            names_devices: false,
            whole: false,
            mps: true,
            // One unit of four of a MIG device, under its own MPS daemon.
            ..plain("a share of a MIG device, MPS (single)", "dgx-a100-mig", 1.0)
        },
        Case {
            mig: vec![("mig-1g.5gb", 1.0)],
            params: vec![("mig_strategy", "mixed")],
            docker_options: vec!["--mig-strategy", "mixed"],
            names_devices: false,
            whole: false,
            // A CUDA process enumerates one MIG device and no GPU beside it.
            refusal: Some("MIG devices"),
            ..plain(
                "a GPU and a MIG device together (refused)",
                "dgx-a100-mixed",
                1.0,
            )
        },
    ]
}

/// A simulated node with its device nodes, and the places each entry point keeps its state.
struct Node {
    sim: SimNode,
    inventory: Inventory,
    dev: tempfile::TempDir,
    scratch: tempfile::TempDir,
    mps: MpsControl,
    /// MPS roots, short: a daemon's socket path must fit in `sun_path`.
    mps_roots: tempfile::TempDir,
}

impl Node {
    /// The shipped node `name`; `<name>@2cpu`: the same with every GPU local to CPUs 0-1 and
    /// memory node 0, so that pinning has CPUs of this host to give.
    fn new(name: &str) -> TestResult<Node> {
        let sim = match name.strip_suffix("@2cpu") {
            None => SimNode::shipped(name),
            Some(base) => {
                let path = Path::new(env!("CARGO_MANIFEST_DIR"))
                    .join("../nvml-sim/topologies")
                    .join(format!("{base}.json"));
                let mut json: serde_json::Value =
                    serde_json::from_str(&std::fs::read_to_string(path)?)?;
                for gpu in json["gpus"].as_array_mut().into_iter().flatten() {
                    gpu["cpu_affinity"] = "0-1".into();
                    gpu["memory_affinity"] = "0".into();
                }
                SimNode::from_json(&json.to_string())
            }
        };
        let inventory = sim.inventory()?;
        let dev = tempfile::Builder::new()
            .prefix("mgpu-entry-dev")
            .tempdir()?;
        let mut specs: Vec<(String, u32, u32)> = inventory
            .gpus
            .iter()
            .map(|g| (format!("nvidia{}", g.minor), 195, g.minor))
            .collect();
        specs.push(("nvidiactl".into(), 195, 255));
        specs.push(("nvidia-uvm".into(), 240, 0));
        for (name, major, minor) in specs {
            mknod(&dev.path().join(name), major, minor)?;
        }
        mesos_gpu_testkit::nvml_sim::mknod_mig_caps(dev.path(), &inventory)?;
        let scratch = tempfile::Builder::new()
            .prefix("mgpu-entry-state")
            .tempdir()?;
        Ok(Node {
            sim,
            inventory,
            dev,
            scratch,
            mps: MpsControl::install("{}"),
            mps_roots: tempfile::Builder::new().prefix("mps").tempdir_in("/tmp")?,
        })
    }

    /// A fresh state directory `name` (each entry point gets an empty pool).
    fn state(&self, name: &str) -> TestResult<PathBuf> {
        let dir = self.scratch.path().join(name);
        std::fs::create_dir_all(&dir)?;
        Ok(dir)
    }

    /// The MPS root of the entry point whose state is `state`.
    fn mps_root(&self, state: &Path) -> PathBuf {
        self.mps_roots
            .path()
            .join(state.file_name().unwrap_or_default())
    }

    /// `mesos-gpu` on this node.
    fn cli(&self) -> TestResult<Command> {
        let mut cmd = Command::new(mesos_gpu_bin()?);
        cmd.arg("--nvml-lib")
            .arg(self.sim.lib_path())
            .arg("--dev-root")
            .arg(self.dev.path())
            .arg("--proc-root")
            .arg(self.sim.proc_root());
        Ok(cmd)
    }

    /// The `docker-args` command line for `case` with its state under `state` (as the hook's
    /// module parameter gives it: split on spaces).
    fn docker_args_line(&self, case: &Case, state: &Path, socket: &Path) -> TestResult<String> {
        let mut line = vec![
            mesos_gpu_bin()?.display().to_string(),
            "--nvml-lib".into(),
            self.sim.lib_path().display().to_string(),
            "--dev-root".into(),
            self.dev.path().display().to_string(),
            "--proc-root".into(),
            self.sim.proc_root().display().to_string(),
            "docker-args".into(),
            "--plugin".into(),
            "--pool-dir".into(),
            state.join("pool").display().to_string(),
            "--docker-state-dir".into(),
            state.join("docker").display().to_string(),
            "--docker-socket".into(),
            socket.display().to_string(),
        ];
        line.extend(case.docker_options.iter().map(|o| (*o).to_owned()));
        if case.mps {
            line.extend([
                "--gpu-sharing".to_owned(),
                "mps".to_owned(),
                "--mps-root".to_owned(),
                self.mps_root(state).display().to_string(),
                "--mps-control".to_owned(),
                self.mps.program().display().to_string(),
            ]);
        }
        Ok(line.join(" "))
    }
}

fn scalar(name: &str, v: f64) -> Resource {
    Resource {
        name: name.into(),
        r#type: value::Type::Scalar as i32,
        scalar: Some(value::Scalar { value: v }),
        ..Resource::default()
    }
}

/// The task's resources.
fn resources(case: &Case) -> Vec<Resource> {
    let mut out = vec![scalar("gpus", case.gpus)];
    out.extend(case.mig.iter().map(|(name, n)| scalar(name, *n)));
    if let Some(cpus) = case.pinned_cpus {
        out.push(scalar("cpus", cpus));
    }
    out
}

/// The module, through its C ABI: the launch info, and the cpuset it wrote.
fn module(node: &Node, case: &Case) -> TestResult<Parts> {
    let state = node.state("module")?;
    let cgroups_root = mesos_gpu_testkit::unique_name("entry");
    let mut pairs: Vec<(String, String)> = vec![
        ("nvml_lib".into(), node.sim.lib_path().display().to_string()),
        ("dev_root".into(), node.dev.path().display().to_string()),
        (
            "proc_root".into(),
            node.sim.proc_root().display().to_string(),
        ),
        ("work_dir".into(), state.join("work").display().to_string()),
        ("pool_dir".into(), state.join("pool").display().to_string()),
        ("cgroups_root".into(), cgroups_root.clone()),
        ("cgroup_version".into(), "v1".into()),
        ("cgroups_hierarchy".into(), "/sys/fs/cgroup".into()),
        ("driver_volume".into(), "off".into()),
    ];
    pairs.extend(
        case.params
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned())),
    );
    if case.mps {
        pairs.extend([
            ("gpu_sharing".to_owned(), "mps".to_owned()),
            (
                "mps_root".to_owned(),
                node.mps_root(&state).display().to_string(),
            ),
            (
                "mps_control".to_owned(),
                node.mps.program().display().to_string(),
            ),
        ]);
    }
    let params = mesos_gpu::proto::mesos::Parameters {
        parameter: pairs
            .into_iter()
            .map(|(key, value)| mesos_gpu::proto::mesos::Parameter { key, value })
            .collect(),
    };
    let handle = Handle::new(&params)?;
    let rootfs = node.state("module-rootfs")?;
    let config = ContainerConfig {
        resources: resources(case),
        directory: "/tmp/sandbox".into(),
        rootfs: Some(rootfs.display().to_string()),
        // Not root, so without CAP_SYS_ADMIN (a MIG device is refused to a task with it).
        user: Some("nobody".into()),
        ..ContainerConfig::default()
    }
    .encode_to_vec();
    let id = support::cid("entry-parity");
    let answer = handle.prepare(&id, &config);
    let bytes = answer.ok()?;
    let info = ContainerLaunchInfo::decode(bytes.as_slice())?;
    let mut parts =
        launch_parts(&info, &rootfs, node.dev.path()).with_mps_root(&node.mps_root(&state));
    let cpuset = Path::new("/sys/fs/cgroup/cpuset")
        .join(&cgroups_root)
        .join(&id.value);
    // No cpuset cgroup: the module pinned nothing (checked by the caller).
    if case.pinned_cpus.is_some() && cpuset.is_dir() {
        let read = |f: &str| std::fs::read_to_string(cpuset.join(f)).map(|s| s.trim().to_owned());
        parts.cpuset = Some((read("cpuset.cpus")?, Some(read("cpuset.mems")?)));
    }
    let cleaned = handle.cleanup(&id);
    check(
        cleaned.status == MgpuStatus::MgpuOk,
        format!("cleanup: {:?} {}", cleaned.status, cleaned.err),
    )?;
    for dir in [
        PathBuf::from("/sys/fs/cgroup/cpuset").join(&cgroups_root),
        PathBuf::from("/sys/fs/cgroup/devices").join(&cgroups_root),
    ] {
        let _ = std::fs::remove_dir(dir);
    }
    Ok(parts)
}

/// The `docker-args` command the hook runs for `case`, through the hook's C ABI.
fn hook_argv(line: &str, case: &Case, image: &str, name: &str) -> TestResult<Vec<String>> {
    let config = ContainerConfig {
        resources: resources(case),
        container_info: Some(mesos_gpu::proto::mesos::ContainerInfo {
            docker: Some(mesos_gpu::proto::mesos::container_info::DockerInfo {
                image: image.into(),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..ContainerConfig::default()
    }
    .encode_to_vec();
    Ok(support::hook_launch_argv(line, &config, name)?)
}

/// Runs `argv`, its stdout when it succeeds.
fn output(argv: &[String]) -> TestResult<String> {
    let out = Command::new(&argv[0]).args(&argv[1..]).output()?;
    check(
        out.status.success(),
        format!(
            "{}: {}",
            argv.join(" "),
            String::from_utf8_lossy(&out.stderr)
        ),
    )?;
    Ok(String::from_utf8(out.stdout)?.trim().to_owned())
}

/// The agent's Docker path: the hook's command, its answer in `MESOS_GPU_DOCKER_ARGS`, the real
/// `docker-wrapper`, and what it passes to `docker` (recorded by a stand-in).
fn hook_and_wrapper(
    node: &Node,
    case: &Case,
    daemon: &FakeDockerd,
    tag: &str,
) -> TestResult<Parts> {
    let state = node.state(&format!("hook-{tag}"))?;
    let line = node.docker_args_line(case, &state, daemon.socket())?;
    let id = "3d8a52b4-1c5e-4f5a-9c1e-2b7d9a0e6f11";
    let name = format!("mesos-{id}");
    let argv = hook_argv(&line, case, "img", &name)?;
    if argv.is_empty() {
        return Ok(Parts::default());
    }
    let answer = output(&argv)?;
    let recorded = state.join("docker-run.args");
    let fake = state.join("docker-cli");
    std::fs::write(
        &fake,
        format!(
            "#!/bin/sh\ncase \" $* \" in\n  *\" inspect \"*) echo false;;\n  *) for a in \"$@\"; do printf '%s\\n' \"$a\"; done > {};;\nesac\nexit 0\n",
            recorded.display()
        ),
    )?;
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755))?;
    let out = Command::new(mesos_gpu_bin()?)
        .args(["docker-wrapper", "--docker"])
        .arg(&fake)
        .arg("--pool-dir")
        .arg(state.join("pool"))
        .arg("--docker-state-dir")
        .arg(state.join("docker"))
        .arg("--")
        .arg("-H")
        .arg(format!("unix://{}", daemon.socket().display()))
        .args(["run", "-e"])
        .arg(format!("MESOS_GPU_DOCKER_ARGS={answer}"))
        .args([
            "-e",
            "MESOS_SANDBOX=/mnt/mesos/sandbox",
            "--name",
            &name,
            "img",
            "true",
        ])
        .output()?;
    check(
        out.status.success(),
        format!("docker-wrapper: {}", String::from_utf8_lossy(&out.stderr)),
    )?;
    let args: Vec<String> = std::fs::read_to_string(&recorded)?
        .lines()
        .map(str::to_owned)
        .collect();
    Ok(docker_parts(&args).with_mps_root(&node.mps_root(&state)))
}

/// `docker-args` as an operator runs it, for the image of `daemon`; its reservation given back.
fn docker_args(node: &Node, case: &Case, daemon: &FakeDockerd, tag: &str) -> TestResult<Parts> {
    let state = node.state(&format!("docker-args-{tag}"))?;
    let line = node.docker_args_line(case, &state, daemon.socket())?;
    let mut argv: Vec<String> = line.split(' ').map(str::to_owned).collect();
    argv.push(format!("--gpus={}", case.gpus));
    for (name, n) in &case.mig {
        argv.push(format!("--mig={name}:{n}"));
    }
    if let Some(cpus) = case.pinned_cpus {
        argv.push(format!("--cpus={cpus}"));
    }
    let id = "0f5f4a36-0d43-4a8b-9a4b-6c2f1e0b7a11";
    argv.extend([format!("--container-id={id}"), "--image=img".to_owned()]);
    let answer = output(&argv)?;
    let args: Vec<String> = answer.split(' ').map(str::to_owned).collect();
    output(
        &[
            argv[..argv.iter().position(|a| a == "docker-args").unwrap_or(0) + 1].to_vec(),
            vec![
                "--pool-dir".into(),
                state.join("pool").display().to_string(),
                "--docker-state-dir".into(),
                state.join("docker").display().to_string(),
                format!("--release={id}"),
                "--force".into(),
            ],
        ]
        .concat(),
    )?;
    Ok(docker_parts(&args).with_mps_root(&node.mps_root(&state)))
}

/// `mesos-gpu run` of `image` (built here, in the real dockerd) with the container kept: what
/// Docker gave it, read back with `docker inspect`.
fn run_entry(node: &Node, case: &Case, image: &str) -> TestResult<Parts> {
    let state = node.state("run")?;
    let mut cmd = node.cli()?;
    cmd.arg("run")
        .arg("--pool-dir")
        .arg(state.join("pool"))
        .arg("--docker-state-dir")
        .arg(state.join("docker"))
        .arg(format!("--gpus={}", case.gpus));
    if let Some(cpus) = case.pinned_cpus {
        cmd.args(["--numa-pinning", &format!("--cpus={cpus}")]);
    }
    let out = cmd.args(["--keep", image, "true"]).output()?;
    check(
        out.status.success(),
        format!("mesos-gpu run: {}", String::from_utf8_lossy(&out.stderr)),
    )?;
    let docker = |args: &[&str]| -> TestResult<String> {
        let out = Command::new("docker").args(args).output()?;
        check(
            out.status.success(),
            format!(
                "docker {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr)
            ),
        )?;
        Ok(String::from_utf8(out.stdout)?.trim().to_owned())
    };
    let id = docker(&["ps", "-alq", "--filter", &format!("ancestor={image}")])?;
    let inspected = docker(&["inspect", &id]);
    docker(&["rm", "-f", &id])?;
    let doc: serde_json::Value = serde_json::from_str(&inspected?)?;
    let container = &doc[0];
    let mut args: Vec<String> = Vec::new();
    for d in container["HostConfig"]["Devices"]
        .as_array()
        .into_iter()
        .flatten()
    {
        args.push(format!(
            "--device={}",
            d["PathOnHost"].as_str().unwrap_or_default()
        ));
    }
    for e in container["Config"]["Env"].as_array().into_iter().flatten() {
        args.push(format!("--env={}", e.as_str().unwrap_or_default()));
    }
    for b in container["HostConfig"]["Binds"]
        .as_array()
        .into_iter()
        .flatten()
    {
        args.push(format!("--volume={}", b.as_str().unwrap_or_default()));
    }
    for (key, option) in [
        ("CpusetCpus", "--cpuset-cpus"),
        ("CpusetMems", "--cpuset-mems"),
    ] {
        match container["HostConfig"][key].as_str() {
            Some(v) if !v.is_empty() => args.push(format!("{option}={v}")),
            _ => {}
        }
    }
    Ok(docker_parts(&args))
}

/// A plain busybox image, built `FROM scratch` in the real dockerd under a name of its own.
fn busybox_image(dir: &Path) -> TestResult<String> {
    std::fs::copy("/bin/busybox", dir.join("busybox"))?;
    let name = format!("{}:1", mesos_gpu_testkit::unique_name("entry-parity"));
    std::fs::write(
        dir.join("Dockerfile"),
        "FROM scratch\nCOPY busybox /bin/busybox\nRUN [\"/bin/busybox\", \"--install\", \"-s\", \"/bin\"]\n",
    )?;
    let out = Command::new("docker")
        .args(["build", "--no-cache", "-q", "-t", &name])
        .arg(dir)
        .output()?;
    check(
        out.status.success(),
        format!("docker build: {}", String::from_utf8_lossy(&out.stderr)),
    )?;
    Ok(name)
}

/// The node's CDI spec (`cdi generate`), for the devices `uuids` names: the common edits and
/// each device's.
fn cdi(node: &Node, uuids: &[String]) -> TestResult<Parts> {
    let out = node
        .cli()?
        .args(["cdi", "generate", "--output", "-"])
        .output()?;
    check(
        out.status.success(),
        format!("cdi generate: {}", String::from_utf8_lossy(&out.stderr)),
    )?;
    let spec: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    let mut edits = vec![spec["containerEdits"].clone()];
    for uuid in uuids {
        let device = spec["devices"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|d| d["name"] == uuid.as_str())
            .ok_or_else(|| format!("the CDI spec has no device {uuid}"))?;
        edits.push(device["containerEdits"].clone());
    }
    let mut parts = Parts::default();
    for e in &edits {
        for node in e["deviceNodes"].as_array().into_iter().flatten() {
            let path = node["hostPath"].as_str().or(node["path"].as_str());
            parts.devices.insert(path.unwrap_or_default().to_owned());
        }
        for env in e["env"].as_array().into_iter().flatten() {
            let env = env.as_str().unwrap_or_default();
            let (k, v) = env.split_once('=').unwrap_or((env, ""));
            parts.keep_env([(k, v)]);
        }
        for m in e["mounts"].as_array().into_iter().flatten() {
            let (source, target) = (m["hostPath"].as_str(), m["containerPath"].as_str());
            if target != Some("/usr/local/nvidia") {
                parts.mounts.insert((
                    source.unwrap_or_default().to_owned(),
                    target.unwrap_or_default().to_owned(),
                ));
            }
        }
    }
    Ok(parts)
}

/// nvidia-docker 1.0's `/docker/cli/json` for the devices `uuids` names.
fn rest(node: &Node, uuids: &[String]) -> TestResult<Parts> {
    let api = RestApi::new(
        Arc::new(node.inventory.clone()),
        Devices {
            nodes: DeviceNodes::scan(node.dev.path(), &node.inventory)?,
            dev_root: node.dev.path().to_owned(),
            proc_root: node.sim.proc_root(),
        },
        VolumeSource::Plugin {
            plugin: "nvidia-docker".to_owned(),
        },
        Arc::new(NoStatus),
    );
    let query = format!("dev={}", uuids.join("+"));
    let resp = api.respond(&Method::GET, "/docker/cli/json", Some(&query));
    let status = resp.status();
    let body = futures_util::FutureExt::now_or_never(resp.into_body().collect())
        .ok_or("the REST answer is not ready")??
        .to_bytes();
    let text = String::from_utf8(body.to_vec())?;
    check(status == StatusCode::OK, format!("REST {query}: {text}"))?;
    let doc: serde_json::Value = serde_json::from_str(&text)?;
    let mut args: Vec<String> = Vec::new();
    for d in doc["Devices"].as_array().into_iter().flatten() {
        args.push(format!("--device={}", d.as_str().unwrap_or_default()));
    }
    for e in doc["Env"].as_array().into_iter().flatten() {
        args.push(format!("--env={}", e.as_str().unwrap_or_default()));
    }
    Ok(docker_parts(&args))
}

fn every_entry_point_agrees() -> TestResult {
    let sockets = tempfile::Builder::new().prefix("mgpu-entry-d").tempdir()?;
    let cuda = FakeDockerd::start(&sockets.path().join("cuda.sock"), &[DRIVER_LABEL])?;
    let plain = FakeDockerd::start(&sockets.path().join("plain.sock"), &[])?;
    let image = busybox_image(sockets.path())?;
    let checked = check_every_case(&cuda, &plain, &image);
    let _ = Command::new("docker").args(["rmi", "-f", &image]).output();
    checked
}

/// What is wrong with `case`'s refusals: the module, and the hook → wrapper and `docker-args`
/// for each image, must each refuse, with a reason that mentions `reason`.
fn refusals(node: &Node, case: &Case, daemons: [&FakeDockerd; 2], reason: &str) -> Vec<String> {
    let mut got = vec![("module".to_owned(), module(node, case).map(drop))];
    for (tag, daemon) in ["cuda", "plain"].into_iter().zip(daemons) {
        got.push((
            format!("hook→wrapper ({tag} image)"),
            hook_and_wrapper(node, case, daemon, tag).map(drop),
        ));
        got.push((
            format!("docker-args ({tag} image)"),
            docker_args(node, case, daemon, tag).map(drop),
        ));
    }
    got.into_iter()
        .filter_map(|(who, result)| match result {
            Ok(()) => Some(format!("{}: {who} granted it", case.name)),
            Err(e) if !e.to_string().contains(reason) => Some(format!(
                "{}: {who} refused without naming {reason}: {e}",
                case.name
            )),
            Err(_) => None,
        })
        .collect()
}

fn check_every_case(cuda: &FakeDockerd, plain: &FakeDockerd, image: &str) -> TestResult {
    let mut problems = Vec::new();
    let mut table = vec![format!(
        "{:<40} {:<28} {}",
        "request",
        "module",
        "CUDA image: hook→wrapper · docker-args, plain image: the same, run, CDI, REST"
    )];
    for case in cases() {
        let node = Node::new(case.node)?;
        if let Some(reason) = case.refusal {
            let found = refusals(&node, &case, [cuda, plain], reason);
            table.push(format!(
                "{:<40} {:<28} {}",
                case.name,
                "refused",
                if found.is_empty() {
                    "every Docker entry point refuses too"
                } else {
                    "DIFFERS"
                }
            ));
            problems.extend(found);
            continue;
        }
        let want = module(&node, &case).map_err(|e| format!("{}: module: {e}", case.name))?;
        check(
            case.gpus == 0.0 && case.mig.is_empty() || !want.devices.is_empty(),
            format!("{}: the module granted no device: {want:?}", case.name),
        )?;
        check(
            case.pinned_cpus.is_none() || want.cpuset.is_some(),
            format!("{}: the module pinned nothing", case.name),
        )?;
        let holds = !want.devices.is_empty();
        let mut row = Vec::new();
        for (tag, daemon) in [("cuda", cuda), ("plain", plain)] {
            for (who, got) in [
                ("hook→wrapper", hook_and_wrapper(&node, &case, daemon, tag)),
                ("docker-args", docker_args(&node, &case, daemon, tag)),
            ] {
                let who = format!("{who} ({tag} image)");
                let found = match got {
                    Ok(got) if holds => {
                        differences(case.name, &who, ("the module", &want), &got, true)
                    }
                    // No device: no NVIDIA node, and the variables, when set, name none.
                    Ok(got) => {
                        let mut found = Vec::new();
                        if !got.devices.is_empty() || got.uuids().iter().any(|u| !u.is_empty()) {
                            found.push(format!("{}: {who} gives {got:?} for no GPU", case.name));
                        }
                        found
                    }
                    Err(e) => vec![format!("{}: {who} failed: {e}", case.name)],
                };
                row.push(if found.is_empty() { "same" } else { "DIFFERS" });
                problems.extend(found);
            }
        }
        if case.whole {
            let found = match run_entry(&node, &case, image) {
                Ok(got) if holds => differences(
                    case.name,
                    "run (plain image)",
                    ("the module", &want),
                    &got,
                    true,
                ),
                Ok(got) if got.devices.is_empty() && got.uuids().is_empty() => Vec::new(),
                Ok(got) => vec![format!("{}: run gives {got:?} for no GPU", case.name)],
                Err(e) => vec![format!("{}: run failed: {e}", case.name)],
            };
            row.push(if found.is_empty() { "same" } else { "DIFFERS" });
            problems.extend(found);
        } else {
            row.push("n/a");
        }
        let uuids = want.uuids();
        if holds && case.names_devices {
            for (who, got) in [("CDI", cdi(&node, &uuids)), ("REST", rest(&node, &uuids))] {
                let found = match got {
                    // A CDI device carries no variables (devices asked together would overwrite
                    // each other's, as in NVIDIA's specs): the runtime makes only the granted
                    // nodes, and the common edits set `NVIDIA_VISIBLE_DEVICES=void` so NVIDIA's
                    // legacy hook adds none.
                    Ok(mut got) if who == "CDI" => {
                        let mut found = Vec::new();
                        let void = BTreeMap::from([(
                            "NVIDIA_VISIBLE_DEVICES".to_owned(),
                            "void".to_owned(),
                        )]);
                        if got.env != void {
                            found.push(format!("{}: CDI sets {:?}, not void", case.name, got.env));
                        }
                        got.env = want.env.clone();
                        found.extend(differences(
                            case.name,
                            who,
                            ("the module", &want),
                            &got,
                            false,
                        ));
                        found
                    }
                    Ok(got) => differences(case.name, who, ("the module", &want), &got, false),
                    Err(e) => vec![format!("{}: {who} failed: {e}", case.name)],
                };
                row.push(if found.is_empty() { "same" } else { "DIFFERS" });
                problems.extend(found);
            }
        } else {
            row.extend(["n/a", "n/a"]);
        }
        // The daemons the entry points started (the stand-in's own copy, unique to this node).
        let _ = Command::new("pkill")
            .arg("-f")
            .arg(node.mps.program())
            .status();
        table.push(format!(
            "{:<40} {:<28} {}",
            case.name,
            format!("{} node(s)", want.devices.len()),
            row.join(" · ")
        ));
    }
    println!("{}", table.join("\n"));
    check(problems.is_empty(), problems.join("\n"))
}
