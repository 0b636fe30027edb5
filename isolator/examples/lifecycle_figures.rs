//! End-to-end lifecycle figures: prepare → isolate → cleanup per container with real cgroups (v1
//! and v2) against a simulated 8-GPU node (nvml-sim `dgx1-v100`), printing p50/p95/p99 per call
//! and, per call, per step that touches the host (issue 36: pool lock, pool read, pool write,
//! checkpoint write, cgroup mkdir/read/write/rmdir, eBPF build/load/attach; `rest` is the call's
//! time outside them: the isolator's own logic and its lock). Also, alone on the checkpoint's
//! disk: one `fsync` of a small file, and (after the runs) one crash-safe replace
//! (`mesos_gpu_os::durable::replace`: temp file, write, `fsync`, `rename`, `fsync` of the
//! directory) of a file the size of `pool.json` with two containers in it, the floor of each of
//! a transition's two durable writes. Target (issue 36): a whole cycle under load p99 ≤ 5 ms.
//! Needs root.
//!
//! `cargo run --release -p mesos-gpu-isolator --example lifecycle_figures [-- ROUNDS [pool]]`
//!
//! With `pool`, the isolator draws from a node pool (issue 13) as the module does: each call
//! also locks, reads and (on change) rewrites `<tmp>/pool/gpu/pool.json`.
//!
//! One long-lived `sleep` stands in for every container's process: it is isolated into each new
//! cgroup and moved back to the hierarchy root (untimed) before cleanup, as its exit would be.
//! One container holding one GPU lives through the whole run, as on a node with a task running
//! (an isolator left with no container closes its cached v2 device programs). The checkpoint
//! lives in a temp dir under `$TMPDIR`.

use std::error::Error;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use mesos_gpu_enforce::timing::Step;
use mesos_gpu_isolator::{
    lifecycle::CgroupChoice, lifecycle::ContainerId, lifecycle::Isolator,
    lifecycle::IsolatorConfig, lifecycle::PoolConfig, lifecycle::PoolRole,
    lifecycle::PrepareConfig,
};
use mesos_gpu_node::{discovery::Discovery, discovery::GpuDriver};
use mesos_gpu_testkit::nvml_sim::SimNode;

mod figures;

use figures::{Call, cycle, loadavg, ms, pct};

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
    let nodes = figures::device_nodes(dev.path(), &inventory)?;
    let v2_mount = mesos_gpu_testkit::cgroup2_root().ok_or("no cgroup2 mount")?;
    println!(
        "lifecycle_figures: {rounds} containers per run beside one holding a GPU, 8-GPU dgx1-v100 (nvml-sim), GPUs 1/2/4 in turn, pool {}, loadavg {}",
        if pooled { "on" } else { "off" },
        loadavg()
    );
    fsync_alone(rounds.min(500))?;
    let mut pool_bytes = 0;
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
        let result = run(
            &isolator,
            &root,
            &work.path().join("pool/gpu/pool.json"),
            rounds,
        );
        let _ = std::fs::remove_dir(&parent);
        let figures = result?;
        pool_bytes = pool_bytes.max(figures.pool_bytes);
        println!(
            "{:?} (checkpoint in {}), loadavg {}:",
            choice,
            work.path().display(),
            loadavg()
        );
        figures.print(rounds);
    }
    replace_alone(rounds.min(500), pool_bytes)?;
    Ok(())
}

#[derive(Default)]
struct Figures {
    prepare: Vec<Call>,
    isolate: Vec<Call>,
    cleanup: Vec<Call>,
    total: Vec<Duration>,
    wall: Duration,
    /// The size of `pool.json` with two containers holding GPUs (0 without a pool).
    pool_bytes: u64,
}

impl Figures {
    fn print(&self, rounds: usize) {
        println!(
            "  {:<8} {:<11} {:>9} {:>9} {:>9} {:>9}  {:>5}",
            "call", "step", "p50 ms", "p95 ms", "p99 ms", "max ms", "n/call"
        );
        for (name, calls) in [
            ("prepare", &self.prepare),
            ("isolate", &self.isolate),
            ("cleanup", &self.cleanup),
        ] {
            row(name, "(call)", calls.iter().map(|c| c.took).collect(), None);
            for step in Step::ALL {
                let runs: u32 = calls.iter().map(|c| c.steps.count(step)).sum();
                if runs == 0 {
                    continue;
                }
                let per_call = f64::from(runs) / calls.len() as f64;
                row(
                    "",
                    step.name(),
                    calls.iter().map(|c| c.steps.time(step)).collect(),
                    Some(per_call),
                );
            }
            row(
                "",
                "rest",
                calls
                    .iter()
                    .map(|c| c.took.saturating_sub(c.steps.total()))
                    .collect(),
                None,
            );
        }
        row("cycle", "(total)", self.total.clone(), None);
        let busy: Duration = self.total.iter().sum();
        println!(
            "  {:.0} containers/s (lifecycle time only), {:.0} containers/s wall clock",
            rounds as f64 / busy.as_secs_f64(),
            rounds as f64 / self.wall.as_secs_f64()
        );
    }
}

fn row(call: &str, step: &str, mut samples: Vec<Duration>, per_call: Option<f64>) {
    samples.sort_unstable();
    let per_call = per_call.map_or_else(String::new, |n| format!("{n:.1}"));
    println!(
        "  {call:<8} {step:<11} {:>9.3} {:>9.3} {:>9.3} {:>9.3}  {per_call:>5}",
        ms(pct(&samples, 50)),
        ms(pct(&samples, 95)),
        ms(pct(&samples, 99)),
        ms(samples.last().copied().unwrap_or(Duration::ZERO)),
    );
}

fn run(isolator: &Isolator, root: &Path, pool_json: &Path, rounds: usize) -> Result<Figures> {
    let mut figures = Figures {
        pool_bytes: pool_size(isolator, pool_json)?,
        ..Figures::default()
    };
    let mut sleeper = Command::new("sleep").arg("100000").spawn()?;
    let pid = sleeper.id();
    let anchor = ContainerId::new("bench-anchor")?;
    isolator.prepare(
        &anchor,
        PrepareConfig {
            gpus: 1.0,
            ..PrepareConfig::default()
        },
    )?;
    let sizes = [1.0, 2.0, 4.0];
    let start = Instant::now();
    let mut outcome = Ok(());
    for n in 0..rounds {
        let id = ContainerId::new(format!("bench-{n}"))?;
        let [prepared, isolated, cleaned] = match cycle(isolator, &id, sizes[n % 3], pid, root) {
            Ok(calls) => calls,
            Err(e) => {
                outcome = Err(e);
                break;
            }
        };
        figures
            .total
            .push(prepared.took + isolated.took + cleaned.took);
        figures.prepare.push(prepared);
        figures.isolate.push(isolated);
        figures.cleanup.push(cleaned);
    }
    figures.wall = start.elapsed();
    isolator.cleanup(&anchor)?;
    let _ = sleeper.kill();
    let _ = sleeper.wait();
    outcome.map(|()| figures)
}

/// One `fsync` of a freshly written small file (the size of a checkpoint), and one of its
/// directory, on the disk under `$TMPDIR`, `n` times each.
fn fsync_alone(n: usize) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let dir_handle = std::fs::File::open(dir.path())?;
    let (mut file_syncs, mut dir_syncs) = (Vec::with_capacity(n), Vec::with_capacity(n));
    let body = vec![b'x'; 2048];
    for i in 0..n {
        let mut f = std::fs::File::create(dir.path().join(format!("f{}", i % 2)))?;
        f.write_all(&body)?;
        let t0 = Instant::now();
        f.sync_all()?;
        file_syncs.push(t0.elapsed());
        let t1 = Instant::now();
        dir_handle.sync_all()?;
        dir_syncs.push(t1.elapsed());
    }
    println!(
        "fsync alone ({n} times, 2 KiB file in {}):",
        dir.path().display()
    );
    println!(
        "  {:<8} {:<11} {:>9} {:>9} {:>9} {:>9}",
        "", "", "p50 ms", "p95 ms", "p99 ms", "max ms"
    );
    row("fsync", "file", file_syncs, None);
    row("fsync", "directory", dir_syncs, None);
    Ok(())
}

/// The size of `pool.json` during a cycle (the anchor and one container: two containers with
/// GPUs), from two containers prepared, measured and cleaned up here, untimed, before the run.
fn pool_size(isolator: &Isolator, pool_json: &Path) -> Result<u64> {
    let ids = [
        ContainerId::new("bench-size-1")?,
        ContainerId::new("bench-size-2")?,
    ];
    for (id, gpus) in ids.iter().zip([1.0, 2.0]) {
        isolator.prepare(
            id,
            PrepareConfig {
                gpus,
                ..PrepareConfig::default()
            },
        )?;
    }
    let bytes = std::fs::metadata(pool_json).map_or(0, |m| m.len());
    for id in &ids {
        isolator.cleanup(id)?;
    }
    Ok(bytes)
}

/// One crash-safe replace of a `bytes`-long file (at least 1 KiB) on the disk under `$TMPDIR`,
/// `n` times, as the pool and the checkpoint are written: the floor of one durable write.
fn replace_alone(n: usize, bytes: u64) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("pool.json");
    let body = vec![b'x'; usize::try_from(bytes.max(1024))?];
    let mut took = Vec::with_capacity(n);
    for _ in 0..n {
        let t0 = Instant::now();
        mesos_gpu_os::durable::replace(&path, &body, 0o644)?;
        took.push(t0.elapsed());
    }
    println!(
        "crash-safe replace alone ({n} times, {} B file, the size of pool.json with two containers, in {}), loadavg {}:",
        body.len(),
        dir.path().display(),
        loadavg()
    );
    println!(
        "  {:<8} {:<11} {:>9} {:>9} {:>9} {:>9}",
        "", "", "p50 ms", "p95 ms", "p99 ms", "max ms"
    );
    row("replace", "durable", took, None);
    Ok(())
}
