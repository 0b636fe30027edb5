//! End-to-end lifecycle figures: prepare → isolate → cleanup per container with real cgroups (v1
//! and v2) against a simulated 8-GPU node (nvml-sim `dgx1-v100`), printing p50/p99 per step and
//! containers per second. Target: under 2 ms p99 for the whole cycle. Needs root.
//!
//! `cargo run --release -p mesos-gpu-isolator --example lifecycle_figures [-- ROUNDS [pool]]`
//!
//! With `pool`, the isolator draws from a node pool (issue 13) as the module does: each call
//! also locks, reads and (on change) rewrites `<tmp>/pool/gpu/pool.json`.
//!
//! One long-lived `sleep` stands in for every container's process: it is isolated into each new
//! cgroup and moved back to the hierarchy root (untimed) before cleanup, as its exit would be.
//! The checkpoint (fsync'ed twice per cycle) lives in a temp dir under `$TMPDIR`.

use std::error::Error;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use mesos_gpu_isolator::{
    lifecycle::CgroupChoice, lifecycle::ContainerId, lifecycle::Isolator,
    lifecycle::IsolatorConfig, lifecycle::PoolConfig, lifecycle::PoolRole,
    lifecycle::PrepareConfig,
};
use mesos_gpu_node::devices::DeviceNodes;
use mesos_gpu_node::{discovery::Discovery, discovery::GpuDriver};
use mesos_gpu_testkit::nvml_sim::SimNode;

type Result<T> = std::result::Result<T, Box<dyn Error>>;

fn main() -> Result<()> {
    let rounds: usize = std::env::args().nth(1).map_or(Ok(2000), |s| s.parse())?;
    let pooled = std::env::args().nth(2).as_deref() == Some("pool");
    let sim = SimNode::shipped("dgx1-v100");
    let inventory = match GpuDriver::open(Some(&sim.lib_path()))? {
        Discovery::Driver(d) => d.inventory().clone(),
        Discovery::NoDriver(_) => return Err("nvml-sim reported no driver".into()),
    };
    let dev = tempfile::tempdir()?;
    for (name, major, minor) in inventory
        .gpus
        .iter()
        .map(|g| (format!("nvidia{}", g.minor), 195, g.minor))
        .chain([
            ("nvidiactl".to_owned(), 195, 255),
            ("nvidia-uvm".to_owned(), 240, 0),
        ])
    {
        let ok = Command::new("mknod")
            .arg(dev.path().join(name))
            .args(["c", &major.to_string(), &minor.to_string()])
            .status()?;
        if !ok.success() {
            return Err("mknod failed (root needed)".into());
        }
    }
    let nodes = DeviceNodes::scan(dev.path(), &inventory)?;
    let v2_mount = mesos_gpu_testkit::cgroup2_root().ok_or("no cgroup2 mount")?;
    println!(
        "lifecycle_figures: {rounds} containers per run, 8-GPU dgx1-v100 (nvml-sim), GPUs 1/2/4 in turn"
    );
    for (choice, root) in [
        (CgroupChoice::V1, PathBuf::from("/sys/fs/cgroup/devices")),
        (CgroupChoice::V2, v2_mount.clone()),
    ] {
        let work = tempfile::tempdir()?;
        let mut config = IsolatorConfig::new(work.path());
        config.cgroup_version = choice;
        config.v2_mount = Some(v2_mount.clone());
        config.cgroups_root = format!("mgpu-bench-{}", std::process::id());
        if pooled {
            config.pool = Some(PoolConfig {
                dir: work.path().join("pool"),
                role: PoolRole::Agent,
            });
        }
        let parent = root.join(&config.cgroups_root);
        let isolator = Isolator::new(config, inventory.clone(), nodes.clone())?;
        isolator.recover(&[], &[])?;
        let result = run(&isolator, &root, rounds);
        let _ = std::fs::remove_dir(&parent);
        let (prepare, isolate, cleanup, total, wall) = result?;
        println!("{:?} (checkpoint in {}):", choice, work.path().display());
        for (name, mut samples) in [
            ("prepare", prepare),
            ("isolate", isolate),
            ("cleanup", cleanup),
            ("total", total.clone()),
        ] {
            samples.sort_unstable();
            println!(
                "  {name:<8} p50 {:>8.3} ms  p99 {:>8.3} ms  max {:>8.3} ms",
                ms(pct(&samples, 50)),
                ms(pct(&samples, 99)),
                ms(*samples.last().unwrap_or(&Duration::ZERO))
            );
        }
        let busy: Duration = total.iter().sum();
        println!(
            "  {:.0} containers/s (lifecycle time only), {:.0} containers/s wall clock",
            rounds as f64 / busy.as_secs_f64(),
            rounds as f64 / wall.as_secs_f64()
        );
    }
    Ok(())
}

type Figures = (
    Vec<Duration>,
    Vec<Duration>,
    Vec<Duration>,
    Vec<Duration>,
    Duration,
);

fn run(isolator: &Isolator, root: &Path, rounds: usize) -> Result<Figures> {
    let mut sleeper = Command::new("sleep").arg("100000").spawn()?;
    let pid = sleeper.id();
    let (mut prepare, mut isolate, mut cleanup, mut total) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let sizes = [1.0, 2.0, 4.0];
    let start = Instant::now();
    let mut outcome = Ok(());
    for n in 0..rounds {
        let id = ContainerId::new(format!("bench-{n}"))?;
        let t0 = Instant::now();
        if let Err(e) = isolator.prepare(
            &id,
            PrepareConfig {
                gpus: sizes[n % 3],
                ..PrepareConfig::default()
            },
        ) {
            outcome = Err(e.into());
            break;
        }
        let t1 = Instant::now();
        isolator.isolate(&id, pid)?;
        let t2 = Instant::now();
        // Untimed: the process leaves the container, as its exit would take it out.
        std::fs::write(root.join("cgroup.procs"), pid.to_string())?;
        let t3 = Instant::now();
        isolator.cleanup(&id)?;
        let t4 = Instant::now();
        prepare.push(t1 - t0);
        isolate.push(t2 - t1);
        cleanup.push(t4 - t3);
        total.push((t2 - t0) + (t4 - t3));
    }
    let wall = start.elapsed();
    let _ = sleeper.kill();
    let _ = sleeper.wait();
    outcome.map(|()| (prepare, isolate, cleanup, total, wall))
}

fn pct(sorted: &[Duration], p: usize) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[(sorted.len() * p / 100).min(sorted.len() - 1)]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}
