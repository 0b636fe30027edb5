//! Concurrency figures of the node's one GPU pool (issue 13): N processes, each with its own
//! isolator (as `docker-args`, `run` or an agent would be) on one pool directory, reserve 1 to 3
//! GPUs, hold them, and release them in a loop for S seconds against a simulated 8-GPU node
//! (nvml-sim `dgx1-v100`). Prints allocations per second, refusals, reserve latency, and the
//! double-bookings seen: every holder creates `held/<uuid>` with `O_EXCL` while it holds a GPU,
//! so a GPU granted twice at once is caught by the second creation. No root needed.
//!
//! `cargo run --release -p mesos-gpu-isolator --example pool_figures [-- PROCS [SECONDS]]`

use std::error::Error;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use mesos_gpu_isolator::{
    lifecycle::ContainerId, lifecycle::Isolator, lifecycle::IsolatorConfig, lifecycle::PoolConfig,
    lifecycle::PoolRole,
};
use mesos_gpu_node::devices::DeviceNodes;
use mesos_gpu_node::{discovery::Discovery, discovery::GpuDriver};
use mesos_gpu_testkit::nvml_sim::SimNode;

type Result<T> = std::result::Result<T, Box<dyn Error>>;

const CHILD_ENV: &str = "MGPU_POOL_FIGURES_CHILD";

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let Ok(index) = std::env::var(CHILD_ENV) {
        let dir = PathBuf::from(&args[0]);
        let seconds: f64 = args[1].parse()?;
        return child(index.parse()?, &dir, Duration::from_secs_f64(seconds));
    }
    let procs: usize = args.first().map_or(Ok(4), |s| s.parse())?;
    let seconds: f64 = args.get(1).map_or(Ok(10.0), |s| s.parse())?;
    let dir = tempfile::tempdir()?;
    std::fs::create_dir_all(dir.path().join("held"))?;
    println!(
        "pool_figures: {procs} processes, {seconds} s, 8-GPU dgx1-v100 (nvml-sim), 1-3 GPUs per reservation, one pool in {}",
        dir.path().display()
    );
    let children: Vec<_> = (0..procs)
        .map(|i| {
            Command::new(std::env::current_exe()?)
                .arg(dir.path())
                .arg(seconds.to_string())
                .env(CHILD_ENV, i.to_string())
                .stdout(Stdio::piped())
                .spawn()
        })
        .collect::<std::io::Result<_>>()?;
    let (mut allocs, mut refused, mut doubles) = (0u64, 0u64, 0u64);
    let mut latencies: Vec<u64> = Vec::new();
    for c in children {
        let out = c.wait_with_output()?;
        let text = String::from_utf8_lossy(&out.stdout);
        let mut fields = text.split_whitespace();
        let mut next = || -> Result<u64> { Ok(fields.next().ok_or("short child line")?.parse()?) };
        allocs += next()?;
        refused += next()?;
        doubles += next()?;
        latencies.extend(fields.filter_map(|s| s.parse::<u64>().ok()));
    }
    latencies.sort_unstable();
    let pct = |p: usize| {
        latencies
            .get(latencies.len().saturating_sub(1) * p / 100)
            .copied()
            .unwrap_or(0)
    };
    println!(
        "  allocations {allocs} ({:.0}/s), refused (pool full) {refused}, double-bookings {doubles}",
        allocs as f64 / seconds
    );
    println!(
        "  reserve latency p50 {:.3} ms  p99 {:.3} ms  max {:.3} ms",
        pct(50) as f64 / 1000.0,
        pct(99) as f64 / 1000.0,
        latencies.last().copied().unwrap_or(0) as f64 / 1000.0
    );
    if doubles > 0 {
        return Err(format!("{doubles} GPUs were booked twice").into());
    }
    Ok(())
}

fn child(index: u64, dir: &Path, length: Duration) -> Result<()> {
    let sim = SimNode::shipped("dgx1-v100");
    let inventory = match GpuDriver::open(Some(&sim.lib_path()))? {
        Discovery::Driver(d) => d.inventory().clone(),
        Discovery::NoDriver(_) => return Err("nvml-sim reported no driver".into()),
    };
    let mut config = IsolatorConfig::new(dir.join(format!("w{index}")));
    config.pool = Some(PoolConfig {
        dir: dir.join("pool"),
        role: PoolRole::Docker,
    });
    let isolator = Isolator::new(config, inventory, DeviceNodes::default())?;
    isolator.recover(&[], &[])?;
    let (mut allocs, mut refused, mut doubles) = (0u64, 0u64, 0u64);
    let mut latencies = Vec::new();
    let mut seed = 0x9e37_79b9_7f4a_7c15_u64 ^ (index + 1);
    let deadline = Instant::now() + length;
    let mut n = 0u64;
    while Instant::now() < deadline {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let want = 1 + seed % 3;
        let id = ContainerId::new(format!("c{index}-{n}"))?;
        n += 1;
        let start = Instant::now();
        match reserve(&isolator, &id, want as f64) {
            Ok(gpus) => {
                latencies.push(start.elapsed().as_micros());
                allocs += 1;
                let markers: Vec<PathBuf> = gpus
                    .iter()
                    .map(|g| dir.join("held").join(&g.uuid))
                    .collect();
                for m in &markers {
                    match std::fs::File::create_new(m) {
                        Ok(_) => {}
                        Err(e) if e.kind() == ErrorKind::AlreadyExists => doubles += 1,
                        Err(e) => return Err(e.into()),
                    }
                }
                std::thread::sleep(Duration::from_micros(200));
                for m in &markers {
                    let _ = std::fs::remove_file(m);
                }
                isolator.release_docker(&id)?;
            }
            Err(e) if e.is_not_enough() => {
                refused += 1;
                std::thread::sleep(Duration::from_micros(100));
            }
            Err(e) => return Err(e.into()),
        }
    }
    let lat: Vec<String> = latencies.iter().map(ToString::to_string).collect();
    println!("{allocs} {refused} {doubles} {}", lat.join(" "));
    Ok(())
}

/// Reserves `gpus` GPUs for Docker container `id` through [`DockerGuard`], as every entry point
/// does, and keeps them.
fn reserve(
    iso: &mesos_gpu_isolator::lifecycle::Isolator,
    id: &mesos_gpu_isolator::lifecycle::ContainerId,
    gpus: f64,
) -> std::result::Result<
    Vec<mesos_gpu_node::inventory::Gpu>,
    mesos_gpu_isolator::lifecycle::LifecycleError,
> {
    mesos_gpu_isolator::lifecycle::DockerGuard::reserve(
        iso,
        id,
        gpus,
        mesos_gpu_isolator::lifecycle::DockerStart::default(),
    )
    .map(mesos_gpu_isolator::lifecycle::DockerGuard::keep)
}
