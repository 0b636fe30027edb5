//! How the cost of one transaction grows with what the node holds (issue 36): a prepare →
//! isolate → cleanup cycle of a container taking one GPU share, on a simulated 16-GPU node
//! (nvml-sim `hgx16`) with every GPU shared 8 ways (128 shares) and the node's pool on, while
//! this isolator already holds C live containers (the first 127 with a share each, the others
//! with no GPU) and `pool.json` holds R records of another publisher. Prints, per (C, R), the
//! cycle's p50/p95/p99 and the p50 of the steps that read or write state (pool read, pool
//! write, checkpoint write) and of the rest. It should stay flat. Cgroup v1, own cgroups; needs
//! root.
//!
//! `cargo run --release -p mesos-gpu-isolator --example growth_figures [-- ROUNDS]`

use std::error::Error;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use mesos_gpu_enforce::mps::MpsConfig;
use mesos_gpu_enforce::timing::{Breakdown, Step};
use mesos_gpu_isolator::lifecycle::{
    CgroupChoice, ContainerId, Isolator, IsolatorConfig, PoolConfig, PoolRole, PrepareConfig,
    SharingConfig,
};
use mesos_gpu_node::devices::DeviceNodes;
use mesos_gpu_node::inventory::Inventory;
use mesos_gpu_node::{discovery::Discovery, discovery::GpuDriver};
use mesos_gpu_placement::sharing::{ModeSpec, SharingMode, SharingSpec};
use mesos_gpu_pool::{GpuUuid, Host, Owner, Pool};
use mesos_gpu_testkit::nvml_sim::SimNode;

mod figures;

use figures::{cycle, loadavg, ms, pct};

type Result<T> = std::result::Result<T, Box<dyn Error>>;

/// Live containers held, records of another publisher in `pool.json`.
const SIZES: [(usize, usize); 8] = [
    (0, 0),
    (50, 0),
    (100, 0),
    (200, 0),
    (0, 250),
    (0, 500),
    (0, 1000),
    (200, 1000),
];

fn main() -> Result<()> {
    let rounds: usize = std::env::args().nth(1).map_or(Ok(200), |s| s.parse())?;
    let sim = SimNode::shipped("hgx16");
    let inventory = match GpuDriver::open(Some(&sim.lib_path()))? {
        Discovery::Driver(d) => d.inventory().clone(),
        Discovery::NoDriver(_) => return Err("nvml-sim reported no driver".into()),
    };
    let dev = tempfile::tempdir()?;
    let nodes = figures::device_nodes(dev.path(), &inventory)?;
    println!(
        "growth_figures: {rounds} cycles per size, 16-GPU hgx16 (nvml-sim) shared 8 ways, pool on, cgroup v1, loadavg {}",
        loadavg()
    );
    println!(
        "  {:>5} {:>6} {:>6}  {:>9} {:>9} {:>9}  {:>9} {:>9} {:>9} {:>9}  {:>8} {:>8}",
        "live",
        "pool",
        "shares",
        "p50 ms",
        "p95 ms",
        "p99 ms",
        "pool_rd",
        "pool_wr",
        "ckpt_wr",
        "rest",
        "pool KiB",
        "ckpt KiB"
    );
    for (live, records) in SIZES {
        let row = size(&inventory, &nodes, live, records, rounds)?;
        println!(
            "  {live:>5} {records:>6} {:>6}  {:>9.3} {:>9.3} {:>9.3}  {:>9.3} {:>9.3} {:>9.3} {:>9.3}  {:>8.1} {:>8.1}",
            live.min(127) + 1,
            ms(pct(&row.cycles, 50)),
            ms(pct(&row.cycles, 95)),
            ms(pct(&row.cycles, 99)),
            ms(row.median(Some(Step::PoolRead))),
            ms(row.median(Some(Step::PoolWrite))),
            ms(row.median(Some(Step::CheckpointWrite))),
            ms(row.median(None)),
            row.pool_bytes as f64 / 1024.0,
            row.checkpoint_bytes as f64 / 1024.0,
        );
    }
    println!(
        "  (step columns: p50 per cycle, prepare and cleanup together; loadavg now {})",
        loadavg()
    );
    Ok(())
}

struct Row {
    cycles: Vec<Duration>,
    /// Per cycle: the steps of prepare, isolate and cleanup together, and the cycle's time.
    steps: Vec<(Breakdown, Duration)>,
    pool_bytes: u64,
    checkpoint_bytes: u64,
}

impl Row {
    /// The median per cycle of `step`, or (`None`) of the time outside every step.
    fn median(&self, step: Option<Step>) -> Duration {
        let mut v: Vec<Duration> = self
            .steps
            .iter()
            .map(|(b, took)| match step {
                Some(s) => b.time(s),
                None => took.saturating_sub(b.total()),
            })
            .collect();
        v.sort_unstable();
        pct(&v, 50)
    }
}

fn size(
    inventory: &Inventory,
    nodes: &DeviceNodes,
    live: usize,
    records: usize,
    rounds: usize,
) -> Result<Row> {
    let work = tempfile::tempdir()?;
    let pool_dir = work.path().join("pool");
    fill_pool(&pool_dir, records)?;
    let mut config = IsolatorConfig::new(work.path().join("agent"));
    config.cgroup_version = CgroupChoice::V1;
    config.cgroups_root = format!("mgpu-growth-{}", std::process::id());
    config.pool = Some(PoolConfig {
        dir: pool_dir.clone(),
        role: PoolRole::Agent,
    });
    config.sharing = Some(SharingConfig {
        spec: SharingSpec::parse("8", ModeSpec::uniform(SharingMode::TimeSlicing))?,
        mps: MpsConfig::new(work.path().join("mps")),
    });
    let root = PathBuf::from("/sys/fs/cgroup/devices");
    let parent = root.join(&config.cgroups_root);
    let isolator = Isolator::new(config, inventory.clone(), nodes.clone())?;
    isolator.recover(&[], &[])?;
    let result = cycles(
        &isolator,
        &root,
        live,
        rounds,
        &Pool::at(&pool_dir).state_path(),
    );
    let _ = std::fs::remove_dir(&parent);
    let ((cycles, steps), pool_bytes, checkpoint_bytes) = result?;
    Ok(Row {
        cycles,
        steps,
        pool_bytes,
        checkpoint_bytes,
    })
}

type Cycles = (Vec<Duration>, Vec<(Breakdown, Duration)>);

/// Prepares the `live` containers, measures `rounds` cycles beside them and cleans them up;
/// returns the cycles and the sizes of the pool file and of the checkpoint while they live.
fn cycles(
    isolator: &Isolator,
    root: &Path,
    live: usize,
    rounds: usize,
    pool_file: &Path,
) -> Result<(Cycles, u64, u64)> {
    let held: Vec<ContainerId> = (0..live)
        .map(|n| ContainerId::new(format!("held-{n}")))
        .collect::<std::result::Result<_, _>>()?;
    let mut outcome = Ok(());
    for (n, id) in held.iter().enumerate() {
        let gpus = if n < 127 { 1.0 } else { 0.0 };
        if let Err(e) = isolator.prepare(
            id,
            PrepareConfig {
                gpus,
                ..PrepareConfig::default()
            },
        ) {
            outcome = Err(e.into());
            break;
        }
    }
    let bytes = |p: &Path| std::fs::metadata(p).map_or(0, |m| m.len());
    let sizes = (bytes(pool_file), bytes(isolator.checkpoint_path()));
    let measured = outcome.and_then(|()| measure(isolator, root, rounds));
    for id in &held {
        isolator.cleanup(id)?;
    }
    measured.map(|m| (m, sizes.0, sizes.1))
}

fn measure(isolator: &Isolator, root: &Path, rounds: usize) -> Result<Cycles> {
    let mut sleeper = Command::new("sleep").arg("100000").spawn()?;
    let pid = sleeper.id();
    let (mut cycles, mut steps) = (Vec::with_capacity(rounds), Vec::with_capacity(rounds));
    let mut outcome = Ok(());
    for n in 0..rounds {
        let id = ContainerId::new(format!("bench-{n}"))?;
        let [prepared, isolated, cleaned] = match cycle(isolator, &id, 1.0, pid, root) {
            Ok(calls) => calls,
            Err(e) => {
                outcome = Err(e);
                break;
            }
        };
        let took = prepared.took + isolated.took + cleaned.took;
        let mut both = cleaned.steps;
        both.merge(&prepared.steps);
        both.merge(&isolated.steps);
        cycles.push(took);
        steps.push((both, took));
    }
    let _ = sleeper.kill();
    let _ = sleeper.wait();
    cycles.sort_unstable();
    outcome.map(|()| (cycles, steps))
}

/// Writes `records` reservations of another publisher, each of a live process (this one) holding
/// one GPU of another node (a UUID no GPU here has), so that reconciliation keeps them and the
/// allocator holds nothing for them.
fn fill_pool(dir: &Path, records: usize) -> Result<()> {
    let me = Host::default().this_process()?;
    let mut tx = Pool::at(dir).begin()?;
    let entries = (0..records)
        .map(|n| {
            Ok((
                format!("other-{n}"),
                Owner::Process {
                    process: me.clone(),
                    cgroup: None,
                    private_dir: None,
                },
                vec![GpuUuid::new(format!("GPU-elsewhere-{n}"))?],
            ))
        })
        .collect::<Result<_>>()?;
    tx.state.publish("/other/allocations.json", entries);
    tx.commit()?;
    Ok(())
}
