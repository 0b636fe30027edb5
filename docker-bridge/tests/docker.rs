//! Against a real Docker daemon: GPU device nodes, the driver volume, the nvidia-docker REST
//! output and recovery, inside real containers.
//!
//! No GPU is needed: the test makes `nvidia<minor>` (`c 195 <minor>`), `nvidiactl` (`c 195 255`)
//! and `nvidia-uvm` (an unused major) with mknod in a temporary device root. With no driver
//! behind those numbers, opening an *allowed* node fails with ENXIO ("No such device or
//! address"), while a node the device cgroup denies fails with EPERM even after mknod. Images
//! are built `FROM scratch` with Debian's static busybox; nothing is pulled.
//!
//! Needs root (mknod) and dockerd on `/var/run/docker.sock`. Every container and image has a
//! unique name and is removed on drop.

use std::collections::BTreeMap;
use std::io::{Read as _, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use libtest_mimic::{Arguments, Failed, Trial};
use mesos_gpu_docker::args::{ArgsError, DriverSpec, ImageInfo, LaunchPlan, VolumeSource};
use mesos_gpu_docker::client::{ContainerSpec, DockerClient};
use mesos_gpu_docker::plugin::{DEFAULT_BUILD_WAIT, DriverVolumes, PluginApi};
use mesos_gpu_docker::rest::status::NoStatus;
use mesos_gpu_docker::rest::{Devices, RestApi};
use mesos_gpu_docker::server::{Server, ServerConfig};
use mesos_gpu_grant::Grant;
use mesos_gpu_node::devices::DeviceNodes;
use mesos_gpu_node::{
    inventory::DriverInfo, inventory::Gpu, inventory::Inventory, inventory::Topology,
};
use mesos_gpu_testkit::{Host, Need, needs, unique_name};

const SOCKET: &str = "/var/run/docker.sock";
const UVM_MAJOR: u32 = 511;

type TestResult = Result<(), Failed>;

fn run(cmd: &mut Command) -> Result<String, Failed> {
    Ok(mesos_gpu_testkit::run_checked(cmd)?)
}

/// Removes the named containers and images when dropped.
#[derive(Default)]
struct Cleanup {
    containers: Mutex<Vec<String>>,
    images: Mutex<Vec<String>>,
}

impl Cleanup {
    fn container(&self, name: &str) {
        self.containers.lock().expect("lock").push(name.to_owned());
    }
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        for name in self.containers.lock().expect("lock").drain(..) {
            let _ = Command::new("docker").args(["rm", "-f", &name]).output();
        }
        for image in self.images.lock().expect("lock").drain(..) {
            let _ = Command::new("docker")
                .args(["rmi", "-f", "--no-prune", &image])
                .output();
        }
    }
}

/// What every trial shares: the device root, the fake volume, the images.
struct Fixture {
    dir: tempfile::TempDir,
    host: Devices,
    inventory: Inventory,
    plain: String,
    labelled: String,
    cleanup: Cleanup,
}

fn gpu(index: u32, minor: u32) -> Gpu {
    Gpu {
        index,
        minor,
        uuid: format!("GPU-{index:08x}-1111-2222-3333-{minor:012x}"),
        name: "Simulated GPU".to_owned(),
        memory_total: 16 << 30,
        pci_bus_id: format!("00000000:{:02x}:00.0", 0x10 + index),
        numa_node: Some(0),
        compute_capability: Some((8, 0)),
        healthy: true,
    }
}

impl Fixture {
    fn new() -> Result<Fixture, Failed> {
        let dir = tempfile::Builder::new()
            .prefix("mgpu-docker-")
            .tempdir()
            .map_err(|e| e.to_string())?;
        let dev = dir.path().join("dev");
        std::fs::create_dir(&dev).map_err(|e| e.to_string())?;
        // NVML index order differs from minor order on purpose.
        let gpus = vec![gpu(0, 2), gpu(1, 0), gpu(2, 3), gpu(3, 1)];
        for g in &gpus {
            run(Command::new("mknod")
                .arg(dev.join(format!("nvidia{}", g.minor)))
                .args(["c", "195", &g.minor.to_string()]))?;
        }
        run(Command::new("mknod")
            .arg(dev.join("nvidiactl"))
            .args(["c", "195", "255"]))?;
        run(Command::new("mknod").arg(dev.join("nvidia-uvm")).args([
            "c",
            &UVM_MAJOR.to_string(),
            "0",
        ]))?;

        let volume = dir.path().join("volume/nvidia_550.54.14");
        for sub in ["bin", "lib", "lib64"] {
            std::fs::create_dir_all(volume.join(sub)).map_err(|e| e.to_string())?;
        }
        std::fs::write(volume.join("bin/nvidia-smi"), "#!/bin/sh\necho fake\n")
            .map_err(|e| e.to_string())?;
        std::fs::write(volume.join("lib64/libnvidia-ml.so.550.54.14"), "fake")
            .map_err(|e| e.to_string())?;

        let cleanup = Cleanup::default();
        let plain = build_image(dir.path(), "plain", &[], &cleanup)?;
        let labelled = build_image(
            dir.path(),
            "labelled",
            &[
                "LABEL com.nvidia.volumes.needed=nvidia_driver",
                "LABEL com.nvidia.cuda.version=11.0.3",
            ],
            &cleanup,
        )?;
        let inventory = Inventory {
            driver: Some(DriverInfo {
                version: "550.54.14".to_owned(),
                cuda_version: Some((12, 4)),
            }),
            topology: Topology::unknown(gpus.len()),
            gpus,
            absent_reason: None,
            mig: Default::default(),
        };
        let host = Devices {
            nodes: DeviceNodes::scan(&dev, &inventory).map_err(|e| e.to_string())?,
            dev_root: dev.clone(),
            proc_root: PathBuf::from("/proc"),
        };
        Ok(Fixture {
            dir,
            host,
            inventory,
            plain,
            labelled,
            cleanup,
        })
    }

    fn volume_dir(&self) -> PathBuf {
        self.dir.path().join("volume/nvidia_550.54.14")
    }

    fn driver(&self, cuda: (u32, u32)) -> DriverSpec {
        DriverSpec {
            info: DriverInfo {
                version: "550.54.14".to_owned(),
                cuda_version: Some(cuda),
            },
            volume: VolumeSource::Bind {
                host_path: self.volume_dir(),
            },
        }
    }

    fn gpus(&self, minors: &[u32]) -> Vec<&Gpu> {
        self.inventory
            .gpus
            .iter()
            .filter(|g| minors.contains(&g.minor))
            .collect()
    }

    /// The `docker run` plan for `image` of a container granted the GPUs with `minors` whole.
    fn plan(
        &self,
        minors: &[u32],
        image: &ImageInfo,
        driver: Option<&DriverSpec>,
    ) -> Result<LaunchPlan, ArgsError> {
        let gpus = self.gpus(minors).into_iter().cloned().collect();
        LaunchPlan::new(
            &Grant::new(&self.host.nodes, &[], gpus, vec![], None)?,
            image,
            driver,
        )
    }
}

fn build_image(dir: &Path, tag: &str, extra: &[&str], cleanup: &Cleanup) -> Result<String, Failed> {
    let ctx = dir.join(format!("image-{tag}"));
    std::fs::create_dir(&ctx).map_err(|e| e.to_string())?;
    std::fs::copy("/bin/busybox", ctx.join("busybox"))
        .map_err(|e| format!("/bin/busybox (busybox-static): {e}"))?;
    let mut dockerfile = "FROM scratch\nCOPY busybox /bin/busybox\nRUN [\"/bin/busybox\", \"--install\", \"-s\", \"/bin\"]\n".to_owned();
    for line in extra {
        dockerfile.push_str(line);
        dockerfile.push('\n');
    }
    std::fs::write(ctx.join("Dockerfile"), dockerfile).map_err(|e| e.to_string())?;
    let name = format!("{}:1", unique_name(tag));
    cleanup.images.lock().expect("lock").push(name.clone());
    run(Command::new("docker")
        .args(["build", "--no-cache", "-q", "-t", &name])
        .arg(&ctx))?;
    Ok(name)
}

/// A shell script that checks the container's view and prints every failure; exit 0 = all ok.
fn check_script(present: &[u32], absent: &[u32], volume: bool) -> String {
    let mut s = String::from("fail=0\n");
    let mut expect_enxio = |node: &str| {
        s.push_str(&format!(
            "[ -c {node} ] || {{ echo \"missing {node}\"; fail=1; }}\n\
             out=$(cat {node} 2>&1); case \"$out\" in *'No such device or address'*) ;; *) echo \"{node}: $out\"; fail=1;; esac\n"
        ));
    };
    for node in ["/dev/nvidiactl", "/dev/nvidia-uvm"] {
        expect_enxio(node);
    }
    for m in present {
        expect_enxio(&format!("/dev/nvidia{m}"));
    }
    for m in absent {
        s.push_str(&format!(
            "[ -e /dev/nvidia{m} ] && {{ echo \"unexpected /dev/nvidia{m}\"; fail=1; }}\n\
             mknod /dev/probe{m} c 195 {m} || {{ echo \"mknod probe{m} failed\"; fail=1; }}\n\
             out=$(cat /dev/probe{m} 2>&1); \
             case \"$out\" in *'Operation not permitted'*) ;; *) echo \"nvidia{m} not denied: $out\"; fail=1;; esac\n"
        ));
    }
    if volume {
        s.push_str(
            "[ -f /usr/local/nvidia/bin/nvidia-smi ] || { echo 'volume missing'; fail=1; }\n\
             touch /usr/local/nvidia/x 2>/dev/null && { echo 'volume writable'; fail=1; }\n\
             grep -q ' /usr/local/nvidia [^ ]* ro[, ]' /proc/mounts || { echo 'volume not ro in /proc/mounts'; fail=1; }\n",
        );
    } else {
        s.push_str(
            "[ -e /usr/local/nvidia ] && { echo '/usr/local/nvidia should be absent'; fail=1; }\n",
        );
    }
    s.push_str("exit $fail\n");
    s
}

fn logs(name: &str) -> String {
    let out = Command::new("docker").args(["logs", name]).output();
    out.map(|o| {
        format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )
    })
    .unwrap_or_default()
}

fn rt() -> Result<tokio::runtime::Runtime, Failed> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| e.to_string().into())
}

/// Runs `script` in a container of `image` with `plan`; returns the exit code and the output.
async fn run_in(
    fx: &Fixture,
    client: &DockerClient,
    image: &str,
    plan: &LaunchPlan,
    script: String,
) -> Result<(i64, String, String), Failed> {
    let name = unique_name("run");
    fx.cleanup.container(&name);
    let spec = ContainerSpec {
        name: name.clone(),
        image: image.to_owned(),
        cmd: vec!["sh".into(), "-c".into(), script],
        env: vec![],
    };
    let id = client
        .create(&spec, plan)
        .await
        .map_err(|e| format!("{e:#?}"))?;
    client.start(&id).await.map_err(|e| format!("{e:#?}"))?;
    let code = client.wait(&id).await.map_err(|e| format!("{e:#?}"))?;
    Ok((code, logs(&name), id))
}

fn devices_and_denials_in_a_plain_image(fx: &Fixture) -> TestResult {
    rt()?.block_on(async {
        let client = DockerClient::connect(Path::new(SOCKET))
            .await
            .map_err(|e| format!("{e:#}"))?;
        let info = client
            .image_info(&fx.plain)
            .await
            .map_err(|e| format!("{e:#}"))?;
        assert!(!info.wants_driver());
        let plan = fx
            .plan(&[1, 3], &info, Some(&fx.driver((12, 4))))
            .map_err(|e| e.to_string())?;
        // A plain image gets no driver volume and none of its variables, only the grant's
        // visible-device variables (every Docker path sets them for a container holding a
        // device, as the Mesos path does).
        let names: Vec<&str> = plan.env.iter().map(|(k, _)| k.as_str()).collect();
        assert!(plan.volume.is_none(), "{plan:?}");
        assert_eq!(
            names,
            ["NVIDIA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"],
            "{plan:?}"
        );
        let (code, out, id) = run_in(
            fx,
            &client,
            &fx.plain,
            &plan,
            check_script(&[1, 3], &[0, 2], false),
        )
        .await?;
        if code != 0 {
            return Err(format!("checks failed in the container (exit {code}):\n{out}").into());
        }
        // Read the devices back from the daemon.
        let minors = client
            .gpu_minors(&id, &fx.inventory.gpus)
            .await
            .map_err(|e| format!("{e:#}"))?;
        assert_eq!(minors, [1, 3]);
        let devices = client.devices(&id).await.map_err(|e| format!("{e:#}"))?;
        assert_eq!(devices.len(), 4);
        assert!(
            devices
                .iter()
                .all(|d| d.cgroup_permissions.as_deref() == Some("rwm"))
        );
        client
            .remove(&id, true)
            .await
            .map_err(|e| format!("{e:#}"))?;
        Ok(())
    })
}

fn labelled_image_gets_the_volume_read_only(fx: &Fixture) -> TestResult {
    rt()?.block_on(async {
        let client = DockerClient::connect(Path::new(SOCKET)).await.map_err(|e| format!("{e:#}"))?;
        let info = client.image_info(&fx.labelled).await.map_err(|e| format!("{e:#}"))?;
        assert!(info.wants_driver(), "{info:?}");
        let gpus = fx.gpus(&[0, 2]);
        let plan = fx.plan(&[0, 2], &info, Some(&fx.driver((12, 4)))).map_err(|e| e.to_string())?;
        // The grant names its GPUs in NVML index order, in every renderer.
        let mut by_index = gpus.clone();
        by_index.sort_by_key(|g| g.index);
        let uuids = by_index.iter().map(|g| g.uuid.as_str()).collect::<Vec<_>>().join(",");
        let mut script = check_script(&[0, 2], &[1, 3], true);
        script = format!("[ \"$NVIDIA_VISIBLE_DEVICES\" = \"{uuids}\" ] || {{ echo \"env: $NVIDIA_VISIBLE_DEVICES\"; exit 9; }}\n{script}");
        let (code, out, _) = run_in(fx, &client, &fx.labelled, &plan, script).await?;
        if code != 0 {
            return Err(format!("checks failed in the container (exit {code}):\n{out}").into());
        }
        Ok(())
    })
}

fn too_new_cuda_is_refused_from_the_real_label(fx: &Fixture) -> TestResult {
    rt()?.block_on(async {
        let client = DockerClient::connect(Path::new(SOCKET))
            .await
            .map_err(|e| format!("{e:#}"))?;
        let info = client
            .image_info(&fx.labelled)
            .await
            .map_err(|e| format!("{e:#}"))?;
        let err = fx
            .plan(&[0], &info, Some(&fx.driver((10, 2))))
            .expect_err("refused");
        let msg = err.to_string();
        assert!(
            msg.contains("CUDA 11.0") && msg.contains("up to 10.2"),
            "{msg}"
        );
        let missing = client
            .image_info(&unique_name("no-such-image"))
            .await
            .expect_err("no image");
        assert!(missing.is_not_found(), "{missing:#}");
        Ok(())
    })
}

fn http_get(addr: std::net::SocketAddr, target: &str) -> Result<String, Failed> {
    let mut s = std::net::TcpStream::connect(addr).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(|e| e.to_string())?;
    write!(
        s,
        "GET {target} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    )
    .map_err(|e| e.to_string())?;
    let mut out = String::new();
    s.read_to_string(&mut out).map_err(|e| e.to_string())?;
    let (head, body) = out.split_once("\r\n\r\n").ok_or("no HTTP body")?;
    if !head.starts_with("HTTP/1.1 200") {
        return Err(format!("GET {target}: {head}\n{body}").into());
    }
    Ok(body.to_owned())
}

fn rest_docker_cli_output_works_verbatim_in_docker_run(fx: &Fixture) -> TestResult {
    let rt = rt()?;
    let volumes = DriverVolumes::new(Arc::new(NoBuild));
    let rest = Arc::new(RestApi::new(
        Arc::new(fx.inventory.clone()),
        fx.host.clone(),
        VolumeSource::Bind {
            host_path: fx.volume_dir(),
        },
        Arc::new(NoStatus),
    ));
    let plugin = Arc::new(PluginApi::new(volumes, DEFAULT_BUILD_WAIT));
    let config = ServerConfig {
        rest_listen: Some("127.0.0.1:0".parse().map_err(|e| format!("{e}"))?),
        plugin_socket: None,
    };
    let server = rt
        .block_on(Server::bind(&config, rest, plugin))
        .map_err(|e| e.to_string())?;
    let addr = server.rest_addr().ok_or("no address")?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = rt.spawn(server.run(async move {
        let _ = stopped.await;
    }));
    // NVML indices 0 and 2 are minors 2 and 3.
    let cli = http_get(addr, "/v1.0/docker/cli?dev=0+2");
    let _ = stop.send(());
    let _ = rt.block_on(task);
    let cli = cli?;
    let name = unique_name("rest");
    fx.cleanup.container(&name);
    let mut cmd = Command::new("docker");
    cmd.args(["run", "--name", &name]);
    cmd.args(cli.split(' '));
    cmd.args([
        fx.labelled.as_str(),
        "sh",
        "-c",
        &check_script(&[2, 3], &[0, 1], true),
    ]);
    let out = cmd.output().map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(format!(
            "docker run {cli} failed ({}):\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
        .into());
    }
    Ok(())
}

struct NoBuild;

impl mesos_gpu_docker::plugin::VolumeBuilder for NoBuild {
    fn build(&self, version: &str) -> Result<PathBuf, mesos_gpu_docker::plugin::BuildError> {
        Err(format!("no volume manager in this test (driver {version})").into())
    }

    fn hold(
        &self,
        version: &str,
        _holder: &str,
        _held: bool,
    ) -> Result<(), mesos_gpu_docker::plugin::BuildError> {
        Err(format!("no volume manager in this test (driver {version})").into())
    }
}

fn recovery_finds_the_gpus_of_running_mesos_containers(fx: &Fixture) -> TestResult {
    rt()?.block_on(async {
        let client = DockerClient::connect(Path::new(SOCKET))
            .await
            .map_err(|e| format!("{e:#}"))?;
        let info = ImageInfo {
            labels: BTreeMap::new(),
            env: vec![],
        };
        let mesos_id = format!(
            "{:08x}-{:04x}-4000-8000-{:012x}",
            std::process::id(),
            0xbeef,
            0x1234_5678u64
        );
        let cases = [
            (format!("mesos-{mesos_id}"), vec![0u32, 2]),
            (
                format!("mesos-0fa1b2c3-S0.{}", mesos_id.replace("4000", "4001")),
                vec![3],
            ),
            (unique_name("not-mesos"), vec![1]),
        ];
        let mut ids = Vec::new();
        for (name, minors) in &cases {
            fx.cleanup.container(name);
            let plan = fx.plan(minors, &info, None).map_err(|e| e.to_string())?;
            let spec = ContainerSpec {
                name: name.clone(),
                image: fx.plain.clone(),
                cmd: vec!["sleep".into(), "120".into()],
                env: vec![],
            };
            let id = client
                .create(&spec, &plan)
                .await
                .map_err(|e| format!("{e:#}"))?;
            client.start(&id).await.map_err(|e| format!("{e:#}"))?;
            ids.push(id);
        }
        let found = client
            .recover(&fx.inventory.gpus)
            .await
            .map_err(|e| format!("{e:#}"))?;
        let ours: Vec<_> = found
            .iter()
            .filter(|c| ids.contains(&c.docker_id))
            .collect();
        assert_eq!(ours.len(), 2, "{found:#?}");
        let first = ours
            .iter()
            .find(|c| c.docker_name == cases[0].0)
            .ok_or("mesos- container not recovered")?;
        assert_eq!(first.gpu_minors, [0, 2]);
        assert_eq!(first.mesos_container_id, mesos_id);
        let legacy = ours
            .iter()
            .find(|c| c.docker_name == cases[1].0)
            .ok_or("legacy name not recovered")?;
        assert_eq!(legacy.gpu_minors, [3]);
        assert!(ours.iter().all(|c| c.unknown_minors.is_empty()));
        // A stopped container holds nothing.
        client
            .remove(&ids[0], true)
            .await
            .map_err(|e| format!("{e:#}"))?;
        let again = client
            .recover(&fx.inventory.gpus)
            .await
            .map_err(|e| format!("{e:#}"))?;
        assert!(!again.iter().any(|c| c.docker_id == ids[0]), "{again:#?}");
        for id in &ids[1..] {
            client
                .remove(id, true)
                .await
                .map_err(|e| format!("{e:#}"))?;
        }
        Ok(())
    })
}

/// Serves the fixture's volume directory for any version, as the volume manager would, and
/// records the holders Docker's mounts give it.
struct FixtureVolume(PathBuf, Arc<Mutex<Vec<(String, bool)>>>);

impl mesos_gpu_docker::plugin::VolumeBuilder for FixtureVolume {
    fn build(&self, _version: &str) -> Result<PathBuf, mesos_gpu_docker::plugin::BuildError> {
        Ok(self.0.clone())
    }

    fn hold(
        &self,
        _version: &str,
        holder: &str,
        held: bool,
    ) -> Result<(), mesos_gpu_docker::plugin::BuildError> {
        self.1
            .lock()
            .map_err(|_| "poisoned")?
            .push((holder.to_owned(), held));
        Ok(())
    }
}

fn plugin_volume_is_mounted_by_dockerd(fx: &Fixture) -> TestResult {
    let rt = rt()?;
    // Not nvidia-docker's name, so a real plugin is never disturbed. The name is fixed rather
    // than unique because dockerd caches every v1 plugin it has used until it restarts, and
    // `docker volume ls` then waits ~15 s per plugin whose socket is gone; a fixed name keeps
    // that to one entry, which the next run revives. The driver version is unique.
    let plugin_name = "mgpu-test-nvidia-docker".to_owned();
    let version = format!("1.{}", std::process::id());
    let volume_name = format!("nvidia_driver_{version}");
    let socket = PathBuf::from(format!("/run/docker/plugins/{plugin_name}.sock"));
    let holds = Arc::new(Mutex::new(Vec::new()));
    let volumes = DriverVolumes::new(Arc::new(FixtureVolume(fx.volume_dir(), Arc::clone(&holds))));
    let mut inventory = fx.inventory.clone();
    if let Some(d) = inventory.driver.as_mut() {
        d.version = version.clone();
    }
    let rest = Arc::new(RestApi::new(
        Arc::new(inventory),
        fx.host.clone(),
        VolumeSource::Plugin {
            plugin: plugin_name.clone(),
        },
        Arc::new(NoStatus),
    ));
    let plugin = Arc::new(PluginApi::new(Arc::clone(&volumes), DEFAULT_BUILD_WAIT));
    let config = ServerConfig {
        rest_listen: Some("127.0.0.1:0".parse().map_err(|e| format!("{e}"))?),
        plugin_socket: Some(socket.clone()),
    };
    let server = rt.block_on(async {
        volumes.set_driver(Some(&version));
        Server::bind(&config, rest, plugin).await
    });
    let server = server.map_err(|e| e.to_string())?;
    let addr = server.rest_addr().ok_or("no address")?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = rt.spawn(server.run(async move {
        let _ = stopped.await;
    }));
    let result = (|| {
        let cli = http_get(addr, "/docker/cli?dev=1")?;
        let want =
            format!("--volume-driver={plugin_name} --volume={volume_name}:/usr/local/nvidia:ro");
        if !cli.starts_with(&want) {
            return Err(Failed::from(format!("unexpected /docker/cli: {cli}")));
        }
        let name = unique_name("plugin-run");
        fx.cleanup.container(&name);
        let mut cmd = Command::new("docker");
        cmd.args(["run", "--rm", "--name", &name])
            .args(cli.split(' '));
        // NVML index 1 is minor 0.
        cmd.args([
            fx.labelled.as_str(),
            "sh",
            "-c",
            &check_script(&[0], &[1, 2, 3], true),
        ]);
        let out = cmd.output().map_err(|e| e.to_string())?;
        if !out.status.success() {
            return Err(Failed::from(format!(
                "docker run {cli} failed ({}):\n{}{}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )));
        }
        let inspect = run(Command::new("docker").args([
            "volume",
            "inspect",
            "-f",
            "{{.Driver}} {{.Mountpoint}}",
            &volume_name,
        ]))?;
        if inspect != format!("{plugin_name} {}", fx.volume_dir().display()) {
            return Err(Failed::from(format!("docker volume inspect: {inspect}")));
        }
        // The container's mount held the volume while it ran, under Docker's mount ID, and let
        // go of it when it ended (issue 37: `volume list` showed no holder).
        let held = holds.lock().map_err(|_| "poisoned")?.clone();
        match held.as_slice() {
            [(on, true), (off, false)] if on == off && on.starts_with("docker-") => {}
            other => {
                return Err(Failed::from(format!(
                    "Docker's mount and unmount of the volume held it as {other:?}"
                )));
            }
        }
        // A name for another driver version is refused by the plugin, through dockerd.
        let wrong = Command::new("docker")
            .args([
                "volume",
                "create",
                "-d",
                &plugin_name,
                "nvidia_driver_0.0.1",
            ])
            .output()
            .map_err(|e| e.to_string())?;
        let stderr = String::from_utf8_lossy(&wrong.stderr);
        if wrong.status.success() || !stderr.contains("invalid volume version") {
            return Err(Failed::from(format!(
                "wrong version accepted or unclear: {stderr}"
            )));
        }
        Ok(())
    })();
    // Docker remembers plugin volumes; forget ours while the plugin still answers.
    let _ = Command::new("docker")
        .args(["volume", "rm", "-f", &volume_name])
        .output();
    let _ = stop.send(());
    let _ = rt.block_on(task);
    if socket.exists() {
        return Err(format!("{} left behind", socket.display()).into());
    }
    result
}

#[path = "bridge/mod.rs"]
mod pool;
use pool::{
    a_docker_owners_unnamed_gpus_are_named_from_its_containers_devices,
    concurrent_launches_never_share_a_gpu, mesos_and_docker_containers_share_one_pool,
    restart_keeps_running_gpus_and_frees_dead_ones,
};

/// Trials that run `mesos-<id>` GPU containers or scan for them: one at a time, since a scan
/// adopts every such container on the daemon, as the agent would.
const SCANNED: [&str; 4] = [
    "a_docker_owners_unnamed_gpus_are_named_from_its_containers_devices",
    "recovery_finds_the_gpus_of_running_mesos_containers",
    "concurrent_launches_never_share_a_gpu",
    "restart_keeps_running_gpus_and_frees_dead_ones",
];

fn main() -> ExitCode {
    let args = Arguments::from_args();
    let host = Host::probe();
    let ready = host.missing(Need::Root).is_none() && host.missing(Need::Dockerd).is_none();
    let fixture: Option<Arc<Result<Fixture, String>>> = ready.then(|| {
        Arc::new(Fixture::new().map_err(|e| format!("fixture: {}", e.message().unwrap_or(""))))
    });
    type Case = fn(&Fixture) -> TestResult;
    let cases: [(&str, Case); 9] = [
        (
            "devices_and_denials_in_a_plain_image",
            devices_and_denials_in_a_plain_image,
        ),
        (
            "labelled_image_gets_the_volume_read_only",
            labelled_image_gets_the_volume_read_only,
        ),
        (
            "too_new_cuda_is_refused_from_the_real_label",
            too_new_cuda_is_refused_from_the_real_label,
        ),
        (
            "rest_docker_cli_output_works_verbatim_in_docker_run",
            rest_docker_cli_output_works_verbatim_in_docker_run,
        ),
        (
            "recovery_finds_the_gpus_of_running_mesos_containers",
            recovery_finds_the_gpus_of_running_mesos_containers,
        ),
        (
            "plugin_volume_is_mounted_by_dockerd",
            plugin_volume_is_mounted_by_dockerd,
        ),
        (
            "concurrent_launches_never_share_a_gpu",
            concurrent_launches_never_share_a_gpu,
        ),
        (
            "restart_keeps_running_gpus_and_frees_dead_ones",
            restart_keeps_running_gpus_and_frees_dead_ones,
        ),
        (
            "a_docker_owners_unnamed_gpus_are_named_from_its_containers_devices",
            a_docker_owners_unnamed_gpus_are_named_from_its_containers_devices,
        ),
    ];
    let trials = cases
        .into_iter()
        .map(|(name, case)| {
            let fx = fixture.clone();
            needs(
                &host,
                &[Need::Root, Need::Dockerd],
                Trial::test(name, move || match fx.as_deref() {
                    Some(Ok(fx)) if SCANNED.contains(&name) => {
                        let _one = pool::DAEMON_SCAN.lock().unwrap_or_else(|p| p.into_inner());
                        case(fx)
                    }
                    Some(Ok(fx)) => case(fx),
                    Some(Err(e)) => Err(e.clone().into()),
                    None => Err("host requirements missing".into()),
                }),
            )
        })
        .collect::<Vec<_>>();
    let mut trials = trials;
    let fx = fixture.clone();
    trials.push(needs(
        &host,
        &[Need::Root, Need::Dockerd, Need::Cgroup1],
        Trial::test(
            "mesos_and_docker_containers_share_one_pool",
            move || match fx.as_deref() {
                Some(Ok(fx)) => {
                    let _one = pool::DAEMON_SCAN.lock().unwrap_or_else(|p| p.into_inner());
                    mesos_and_docker_containers_share_one_pool(fx)
                }
                Some(Err(e)) => Err(e.clone().into()),
                None => Err("host requirements missing".into()),
            },
        ),
    ));
    let conclusion = libtest_mimic::run(&args, trials);
    drop(fixture);
    conclusion.exit_code()
}
