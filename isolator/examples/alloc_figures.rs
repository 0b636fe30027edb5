//! Allocation latency (p50/p99) for every request size, and the score of each topology pick
//! against the brute-force best, on the DGX-1 V100 and on two DGX-1 boards (16 GPUs).
//!
//! Run: `cargo run --release -p mesos-gpu-isolator --example alloc_figures [-- ROUNDS]`.
//! Exits non-zero if any chosen set scores below the brute-force best.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use mesos_gpu_isolator::allocator::nodes::{NodeBuilder, dgx1_v100, dual_dgx1_v100};
use mesos_gpu_isolator::allocator::{AllocError, Allocator, GpuSet, Policy};

/// One starting state: a node, and the GPUs some other container holds already.
struct Case {
    node: &'static str,
    builder: NodeBuilder,
    state: &'static str,
    taken: &'static [u32],
}

fn cases() -> Vec<Case> {
    vec![
        Case {
            node: "dgx1",
            builder: dgx1_v100(),
            state: "free",
            taken: &[],
        },
        Case {
            node: "dgx1",
            builder: dgx1_v100(),
            state: "partly",
            taken: &[1, 6],
        },
        Case {
            node: "dual-dgx1",
            builder: dual_dgx1_v100(),
            state: "free",
            taken: &[],
        },
        Case {
            node: "dual-dgx1",
            builder: dual_dgx1_v100(),
            state: "partly",
            taken: &[1, 6, 11, 12],
        },
    ]
}

fn start(case: &Case, policy: Policy) -> Result<Allocator, AllocError> {
    let mut alloc = Allocator::new(&case.builder.inventory(), policy)?;
    alloc.allocate_specific("other", GpuSet::from_indices(case.taken.iter().copied())?)?;
    Ok(alloc)
}

fn percentile(sorted: &[Duration], p: usize) -> Duration {
    sorted[(sorted.len() * p / 100).min(sorted.len() - 1)]
}

/// The highest score of any `size` GPUs of `free`, by trying every subset.
fn brute_force_best(alloc: &Allocator, free: GpuSet, size: u32) -> u64 {
    let members = free.to_vec();
    (0u64..1 << members.len())
        .filter(|sub| sub.count_ones() == size)
        .map(|sub| {
            let chosen = (0..members.len())
                .filter(|&p| sub & 1 << p != 0)
                .map(|p| members[p]);
            GpuSet::from_indices(chosen).map_or(0, |set| alloc.score(set))
        })
        .max()
        .unwrap_or(0)
}

fn latency_table(rounds: usize) -> Result<(), AllocError> {
    println!(
        "allocation latency over {rounds} allocations per size (allocate only, release untimed)"
    );
    println!(
        "{:<10} {:<7} {:<10} {:>4} {:>9} {:>9} {:>9}",
        "node", "state", "policy", "size", "p50", "p99", "max"
    );
    for case in cases() {
        for policy in [Policy::Topology, Policy::FirstFit] {
            let mut alloc = start(&case, policy)?;
            for size in 1..=alloc.free().len() {
                let mut times = Vec::with_capacity(rounds);
                for _ in 0..rounds {
                    let began = Instant::now();
                    let got = alloc.allocate("bench", size)?;
                    times.push(began.elapsed());
                    std::hint::black_box(got);
                    alloc.release_all("bench");
                }
                times.sort_unstable();
                println!(
                    "{:<10} {:<7} {:<10} {:>4} {:>9.2?} {:>9.2?} {:>9.2?}",
                    case.node,
                    case.state,
                    policy.name(),
                    size,
                    percentile(&times, 50),
                    percentile(&times, 99),
                    times[times.len() - 1]
                );
            }
        }
    }
    Ok(())
}

/// Prints the chosen set and its score against the brute-force best; false on any shortfall.
fn score_table() -> Result<bool, AllocError> {
    println!();
    println!("topology policy on the 16-GPU node: chosen set against the brute-force best");
    println!(
        "{:<7} {:>4} {:>7} {:>7} {:<6} chosen",
        "state", "size", "chosen", "best", "equal"
    );
    let mut all_equal = true;
    for case in cases().into_iter().filter(|c| c.node == "dual-dgx1") {
        let mut alloc = start(&case, Policy::Topology)?;
        let free = alloc.free();
        for size in 1..=free.len() {
            let got = alloc.allocate("probe", size)?;
            alloc.release_all("probe");
            let (score, best) = (alloc.score(got), brute_force_best(&alloc, free, size));
            all_equal &= score == best;
            let equal = if score == best { "yes" } else { "NO" };
            println!(
                "{:<7} {:>4} {:>7} {:>7} {:<6} {got}",
                case.state, size, score, best, equal
            );
        }
    }
    Ok(all_equal)
}

fn main() -> ExitCode {
    let rounds = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(10_000);
    let outcome = latency_table(rounds).and_then(|()| score_table());
    match outcome {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!("error: a chosen set scored below the brute-force best");
            ExitCode::FAILURE
        }
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::FAILURE
        }
    }
}
