//! A simulated day of GPU requests on the shipped nodes, placed by `first-fit`, our `topology`
//! policy and a re-implementation of NVIDIA go-gpuallocator's best-effort policy
//! (`support/besteffort.rs`), printing one table row per node and policy.
//!
//! Run: `cargo run --release -p mesos-gpu-placement --example alloc_stream [-- SEED [LOAD]]`
//! (defaults: seed 15, load 1.0). The committed output is `docs/benchmarks/allocator-stream.txt`.
//!
//! # The day
//! Nodes are read through NVML from nvml-sim (`dgx1-v100`, `dgx-a100`, `hgx16`, `pcie-t4x4`), as
//! the agent reads a real node. Requests arrive as a Poisson process for 24 hours; each asks for
//! 1 to 8 GPUs (weights below; sizes above the node's GPU count are left out) and holds them for
//! an exponentially distributed time, mean 6 minutes. The arrival rate makes the GPU-hours asked
//! `LOAD` times what the node has. The same requests, from the same seed, go to every policy.
//!
//! # What is counted
//! Each policy lives the day twice:
//! - **strict**: a topology-strict scheduler refuses a placement that is not well-connected (the
//!   request is dropped, its GPUs stay free). A set of `k` GPUs is *well-connected* when its
//!   score (NVIDIA's: the sum of its pair scores, PCIe points + 100 per NVLink) is the best any
//!   `k` GPUs of the node score when all are free; a single GPU always is. Counted: requests
//!   refused because fewer GPUs were free than asked (**capacity**), and because the policy's
//!   pick was not well-connected (**not well**).
//! - **lenient**: every request that finds enough free GPUs gets the policy's pick, as the agent
//!   does. Free counts do not depend on placement, so every policy grants the same requests.
//!   Counted: the granted sets of two or more GPUs, their **mean score**, the mean of each one's
//!   score over the best for its size (**% of best**), and how many were not well-connected.
//! - **decision p50/p99/max**, over both days: time to choose the set (our `Allocator::allocate`;
//!   for the best-effort policy, its choice, computed by dynamic programming, where NVIDIA's
//!   enumeration takes seconds on 16 GPUs, `docs/reference/topology.md` §2).

#[path = "support/besteffort.rs"]
mod besteffort;
#[path = "support/rng.rs"]
mod rng;

use rng::Rng;

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::error::Error;
use std::time::{Duration, Instant};

use mesos_gpu_node::inventory::Inventory;
use mesos_gpu_node::{discovery::Discovery, discovery::GpuDriver};
use mesos_gpu_placement::{allocator::Allocator, allocator::GpuSet, allocator::Policy};
use mesos_gpu_testkit::nvml_sim::SimNode;

type Result<T> = std::result::Result<T, Box<dyn Error>>;

/// The nodes of the day, as nvml-sim ships them.
const NODES: [&str; 4] = ["dgx1-v100", "dgx-a100", "hgx16", "pcie-t4x4"];

/// Relative frequency of requests for 1, 2, … 8 GPUs.
const SIZE_WEIGHTS: [u32; 8] = [30, 24, 6, 18, 3, 3, 2, 14];

/// Mean time a request holds its GPUs, in hours.
const MEAN_HOLD_HOURS: f64 = 0.1;

/// An index of `weights`, drawn in proportion to them.
fn weighted(rng: &mut Rng, weights: &[u32]) -> usize {
    let total: u32 = weights.iter().sum();
    let mut pick = u32::try_from(rng.next() % u64::from(total)).unwrap_or(0);
    for (i, &w) in weights.iter().enumerate() {
        if pick < w {
            return i;
        }
        pick -= w;
    }
    weights.len() - 1
}

/// One request of the day.
struct Request {
    at: f64,
    size: u32,
    hold: f64,
}

fn day(gpus: u32, seed: u64, load: f64) -> Vec<Request> {
    let sizes = usize::try_from(gpus.min(8)).unwrap_or(8);
    let weights = &SIZE_WEIGHTS[..sizes];
    let total: u32 = weights.iter().sum();
    let mean_size: f64 = weights
        .iter()
        .zip(1u32..)
        .map(|(&w, s)| f64::from(w * s))
        .sum::<f64>()
        / f64::from(total);
    let rate = load * f64::from(gpus) / (mean_size * MEAN_HOLD_HOURS);
    let mut rng = Rng(seed);
    let mut at = 0.0;
    let mut requests = Vec::new();
    loop {
        at += rng.exponential(1.0 / rate);
        if at >= 24.0 {
            return requests;
        }
        let size = u32::try_from(weighted(&mut rng, weights) + 1).unwrap_or(1);
        let hold = rng.exponential(MEAN_HOLD_HOURS);
        requests.push(Request { at, size, hold });
    }
}

/// The best score any set of each size has on the free node (index: the size).
struct Ideal {
    score: Vec<u64>,
}

impl Ideal {
    fn of(inventory: &Inventory) -> Ideal {
        let n = inventory.gpus.len();
        let mut score = vec![0; n + 1];
        for set in 0u32..1 << n {
            let members: Vec<usize> = (0..n).filter(|&p| set & 1 << p != 0).collect();
            let k = members.len();
            score[k] = score[k].max(set_score(inventory, &members));
        }
        Ideal { score }
    }

    /// Whether `members` (positions) score as well as the best set of their size.
    fn well_connected(&self, inventory: &Inventory, members: &[usize]) -> bool {
        set_score(inventory, members) >= self.score[members.len()]
    }
}

/// NVIDIA's set score of `members` (positions): the sum of their pair scores.
fn set_score(inventory: &Inventory, members: &[usize]) -> u64 {
    let mut score = 0;
    for (i, &a) in members.iter().enumerate() {
        for &b in &members[i + 1..] {
            score += u64::from(inventory.topology.pair_score(a, b));
        }
    }
    score
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Placer {
    Ours(Policy),
    BestEffort,
}

impl Placer {
    fn name(self) -> &'static str {
        match self {
            Placer::Ours(policy) => policy.name(),
            Placer::BestEffort => "go-besteffort",
        }
    }
}

/// Whether a placement that is not well-connected is refused (strict) or granted anyway.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Strict,
    Lenient,
}

#[derive(Default)]
struct Outcome {
    requests: u32,
    refused_capacity: u32,
    not_well_connected: u32,
    granted_multi: u32,
    score_sum: u64,
    share_sum: f64,
    padded: u32,
    times: Vec<Duration>,
}

fn run(
    inventory: &Inventory,
    ideal: &Ideal,
    requests: &[Request],
    placer: Placer,
    mode: Mode,
) -> Result<Outcome> {
    let policy = match placer {
        Placer::Ours(policy) => policy,
        Placer::BestEffort => Policy::FirstFit,
    };
    let mut alloc = Allocator::new(inventory, policy)?;
    let position = |index: u32| inventory.gpus.iter().position(|g| g.index == index);
    let pair = |a: u32, b: u32| match (position(a), position(b)) {
        (Some(a), Some(b)) => u64::from(inventory.topology.pair_score(a, b)),
        _ => 0,
    };
    let mut out = Outcome::default();
    // Departures by time (as integer nanoseconds of the day, for ordering), with the owner.
    let mut leaving: BinaryHeap<Reverse<(u64, String)>> = BinaryHeap::new();
    let nanos = |hours: f64| {
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)] // < 2⁶³ ns
        let ns = (hours * 3.6e12) as u64;
        ns
    };
    for (n, request) in requests.iter().enumerate() {
        while let Some(Reverse((at, owner))) = leaving.peek().cloned() {
            if at > nanos(request.at) {
                break;
            }
            leaving.pop();
            alloc.release_all(&owner);
        }
        out.requests += 1;
        let owner = format!("r{n}");
        let free = alloc.free();
        if free.len() < request.size {
            out.refused_capacity += 1;
            continue;
        }
        let (set, took) = match placer {
            Placer::Ours(_) => {
                let began = Instant::now();
                let set = alloc.allocate(&owner, request.size)?;
                (set, began.elapsed())
            }
            Placer::BestEffort => {
                let free_bits = free.to_vec().iter().fold(0u64, |acc, &i| acc | 1 << i);
                let began = Instant::now();
                let choice = besteffort::best_effort(free_bits, request.size, &pair)
                    .ok_or("best-effort found no set")?;
                let took = began.elapsed();
                out.padded += u32::from(choice.padded);
                let set = GpuSet::from_indices((0..64).filter(|&i| choice.set & 1 << i != 0))?;
                alloc.allocate_specific(&owner, set)?;
                (set, took)
            }
        };
        out.times.push(took);
        let members: Vec<usize> = set.to_vec().into_iter().filter_map(position).collect();
        if !ideal.well_connected(inventory, &members) {
            out.not_well_connected += 1;
            if mode == Mode::Strict {
                alloc.release_all(&owner);
                continue;
            }
        }
        if request.size >= 2 {
            let score = set_score(inventory, &members);
            out.granted_multi += 1;
            out.score_sum += score;
            #[allow(clippy::cast_precision_loss)] // scores are far below 2⁵³
            let share = score as f64 / ideal.score[members.len()] as f64;
            out.share_sum += share;
        }
        leaving.push(Reverse((nanos(request.at + request.hold), owner)));
    }
    out.times.sort_unstable();
    Ok(out)
}

fn percentile(sorted: &[Duration], p: usize) -> Duration {
    sorted
        .get((sorted.len() * p / 100).min(sorted.len().saturating_sub(1)))
        .copied()
        .unwrap_or_default()
}

fn load_node(name: &str) -> Result<Inventory> {
    let sim = SimNode::shipped(name);
    match GpuDriver::open(Some(&sim.lib_path()))? {
        Discovery::Driver(d) => Ok(d.inventory().clone()),
        Discovery::NoDriver(_) => Err(format!("nvml-sim {name} reported no driver").into()),
    }
}

fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let seed: u64 = args.next().map_or(Ok(15), |s| s.parse())?;
    let load: f64 = args.next().map_or(Ok(1.0), |s| s.parse())?;
    println!(
        "alloc_stream: a simulated day per node (seed {seed}, load {load}, sizes 1-8 weighted {SIZE_WEIGHTS:?}, mean hold {} min)",
        MEAN_HOLD_HOURS * 60.0
    );
    println!(
        "{:<10} {:<13} {:>5} | {:>8} {:>8} | {:>7} {:>8} {:>6} {:>8} | {:>8} {:>8} {:>8}",
        "", "", "", "strict:", "strict:", "lenient", "lenient:", "", "lenient:", "decision", "", ""
    );
    println!(
        "{:<10} {:<13} {:>5} | {:>8} {:>8} | {:>7} {:>8} {:>6} {:>8} | {:>8} {:>8} {:>8}",
        "node",
        "policy",
        "asked",
        "refused",
        "refused",
        "granted",
        "mean",
        "% of",
        "not well",
        "p50",
        "p99",
        "max"
    );
    println!(
        "{:<10} {:<13} {:>5} | {:>8} {:>8} | {:>7} {:>8} {:>6} {:>8} | {:>8} {:>8} {:>8}",
        "", "", "", "capacity", "not well", "k>=2", "score", "best", "conn.", "", "", ""
    );
    for name in NODES {
        let inventory = load_node(name)?;
        let gpus = u32::try_from(inventory.gpus.len())?;
        let ideal = Ideal::of(&inventory);
        let requests = day(gpus, seed, load);
        for placer in [
            Placer::Ours(Policy::FirstFit),
            Placer::BestEffort,
            Placer::Ours(Policy::Topology),
        ] {
            let strict = run(&inventory, &ideal, &requests, placer, Mode::Strict)?;
            let lenient = run(&inventory, &ideal, &requests, placer, Mode::Lenient)?;
            let granted = f64::from(lenient.granted_multi.max(1));
            #[allow(clippy::cast_precision_loss)] // sums far below 2⁵³
            let mean = lenient.score_sum as f64 / granted;
            let mut times = [strict.times, lenient.times].concat();
            times.sort_unstable();
            println!(
                "{:<10} {:<13} {:>5} | {:>8} {:>8} | {:>7} {:>8.1} {:>5.1}% {:>8} | {:>8.2?} {:>8.2?} {:>8.2?}",
                name,
                placer.name(),
                strict.requests,
                strict.refused_capacity,
                strict.not_well_connected,
                lenient.granted_multi,
                mean,
                100.0 * lenient.share_sum / granted,
                lenient.not_well_connected,
                percentile(&times, 50),
                percentile(&times, 99),
                times.last().copied().unwrap_or_default(),
            );
            let padded = strict.padded + lenient.padded;
            if padded > 0 {
                println!(
                    "{:<10} {:<13} (NVIDIA's step 3 picked a padded set {padded} times, where its Allocate panics; we took its best whole set)",
                    "", ""
                );
            }
        }
    }
    Ok(())
}
