//! Container start time through the bridge against a plain start of the same image, in one run.
//!
//! Alternates N plain and N bridged `create + start + wait` of a busybox `true` container (built
//! `FROM scratch` with Debian's static busybox, nothing pulled) and prints the medians, p90s and
//! the bridged/plain ratio of the medians. A bridged start also reserves 2 GPUs in a real
//! isolator (checkpoint fsync included), maps 4 device nodes (mknod'ed in a temp dir) and gives
//! the GPUs back when the container ends. Removing containers is not timed.
//!
//! Needs root and dockerd: `cargo run --release -p mesos-gpu-docker --example start_figures [N]`.

use std::error::Error;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mesos_gpu_docker::args::LaunchPlan;
use mesos_gpu_docker::bridge::DockerBridge;
use mesos_gpu_docker::client::{ContainerSpec, DockerClient};
use mesos_gpu_isolator::{
    lifecycle::CgroupChoice, lifecycle::ContainerId, lifecycle::Isolator, lifecycle::IsolatorConfig,
};
use mesos_gpu_node::devices::DeviceNodes;
use mesos_gpu_node::{inventory::Gpu, inventory::Inventory, inventory::Topology};

type Result<T> = std::result::Result<T, Box<dyn Error>>;

const SOCKET: &str = "/var/run/docker.sock";

fn sh(cmd: &mut Command) -> Result<String> {
    let out = cmd.output()?;
    if !out.status.success() {
        return Err(format!("{cmd:?}: {}", String::from_utf8_lossy(&out.stderr)).into());
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

fn gpu(index: u32) -> Gpu {
    Gpu {
        index,
        minor: index,
        uuid: format!("GPU-{index:08x}-1111-2222-3333-444444444444"),
        name: "Simulated GPU".to_owned(),
        memory_total: 16 << 30,
        pci_bus_id: format!("00000000:{:02x}:00.0", 0x10 + index),
        numa_node: Some(0),
        compute_capability: Some((8, 0)),
        healthy: true,
    }
}

fn uuid(n: u32) -> Result<ContainerId> {
    Ok(ContainerId::new(format!(
        "{:08x}-0000-4000-8000-{:012x}",
        std::process::id(),
        n
    ))?)
}

fn percentile(sorted: &[Duration], p: usize) -> Duration {
    sorted[(sorted.len() * p / 100).min(sorted.len() - 1)]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn main() -> Result<()> {
    let n: u32 = std::env::args().nth(1).map_or(Ok(20), |s| s.parse())?;
    let dir = tempfile::tempdir()?;
    let dev = dir.path().join("dev");
    std::fs::create_dir(&dev)?;
    let gpus: Vec<Gpu> = (0..4).map(gpu).collect();
    for g in &gpus {
        sh(Command::new("mknod")
            .arg(dev.join(format!("nvidia{}", g.minor)))
            .args(["c", "195", &g.minor.to_string()]))?;
    }
    sh(Command::new("mknod")
        .arg(dev.join("nvidiactl"))
        .args(["c", "195", "255"]))?;
    sh(Command::new("mknod")
        .arg(dev.join("nvidia-uvm"))
        .args(["c", "511", "0"]))?;
    let image_dir = dir.path().join("image");
    std::fs::create_dir(&image_dir)?;
    std::fs::copy("/bin/busybox", image_dir.join("busybox"))?;
    std::fs::write(
        image_dir.join("Dockerfile"),
        "FROM scratch\nCOPY busybox /bin/true\n",
    )?;
    let image = format!("mgpu-start-figures-{}:1", std::process::id());
    sh(Command::new("docker")
        .args(["build", "-q", "-t", &image])
        .arg(&image_dir))?;

    let inventory = Inventory {
        driver: None,
        topology: Topology::unknown(gpus.len()),
        gpus: gpus.clone(),
        absent_reason: None,
        mig: Default::default(),
    };
    let nodes = DeviceNodes::scan(&dev, &inventory)?;
    let mut config = IsolatorConfig::new(dir.path().join("work"));
    config.cgroup_version = CgroupChoice::V1;
    let isolator = Isolator::new(config, inventory, nodes)?;
    isolator.recover(&[], &[])?;

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let result = rt.block_on(async {
        let client = DockerClient::connect(Path::new(SOCKET)).await?;
        let bridge = DockerBridge::new(Arc::new(isolator), client.clone(), None, gpus);
        let cmd = vec!["true".to_owned()];
        let (mut plain, mut bridged) = (Vec::new(), Vec::new());
        // One untimed round of each warms the image and the daemon's caches.
        for i in 0..=n {
            let name = format!("mgpu-start-plain-{}-{i}", std::process::id());
            let spec = ContainerSpec {
                name,
                image: image.clone(),
                cmd: cmd.clone(),
                env: vec![],
            };
            let t = Instant::now();
            let id = client.create(&spec, &LaunchPlan::default()).await?;
            client.start(&id).await?;
            let code = client.wait(&id).await?;
            let took = t.elapsed();
            client.remove(&id, true).await?;
            if code != 0 {
                return Err(format!("plain container exited {code}").into());
            }

            let cid = uuid(i)?;
            let t = Instant::now();
            let c = bridge.launch(&cid, 2.0, &image, &cmd).await?;
            let code = bridge.wait_and_release(&c).await?;
            let took_bridged = t.elapsed();
            client.remove(&c.docker_id, true).await?;
            if code != 0 {
                return Err(format!("bridged container exited {code}").into());
            }
            if i > 0 {
                plain.push(took);
                bridged.push(took_bridged);
            }
        }
        Ok::<_, Box<dyn Error>>((plain, bridged))
    });
    let _ = Command::new("docker")
        .args(["rmi", "-f", "--no-prune", &image])
        .output();
    let (mut plain, mut bridged) = result?;
    plain.sort();
    bridged.sort();
    let (p50, b50) = (percentile(&plain, 50), percentile(&bridged, 50));
    println!("container start (create + start + wait of `true`), {n} runs each, alternating:");
    println!(
        "  plain    p50 {:8.1} ms  p90 {:8.1} ms",
        ms(p50),
        ms(percentile(&plain, 90))
    );
    println!(
        "  bridged  p50 {:8.1} ms  p90 {:8.1} ms  (2 GPUs reserved, 4 devices, released after)",
        ms(b50),
        ms(percentile(&bridged, 90))
    );
    println!(
        "  ratio of medians bridged/plain: {:.3} ({:+.1}%)",
        ms(b50) / ms(p50),
        (ms(b50) / ms(p50) - 1.0) * 100.0
    );
    Ok(())
}
