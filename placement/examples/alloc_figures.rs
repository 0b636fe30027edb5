//! Allocation latency (p50/p99) for every request size, the score of each topology pick
//! against the brute-force best, on the DGX-1 V100 and on two DGX-1 boards (16 GPUs, nvml-sim's
//! `hgx16`), and the topology pick against NVIDIA go-gpuallocator's best-effort pick
//! (re-implemented in `support/besteffort.rs`) by NVIDIA's own score, over every free set of the
//! DGX-1 and 400 random free sets of the 16-GPU node, every request size.
//!
//! Then the MIG unit allocator (issue 16) on nvml-sim's `dgx-a100-mig` (56 1g.5gb MIG devices,
//! discovered through the simulated driver) with 0, 28 and 55 units already held.
//!
//! Run: `cargo run --release -p mesos-gpu-placement --example alloc_figures [-- ROUNDS]`.
//! Exits non-zero if any chosen set scores below the brute-force best or below best-effort's.

#[path = "support/besteffort.rs"]
mod besteffort;

use std::process::ExitCode;
use std::time::{Duration, Instant};

use mesos_gpu_node::{discovery::Discovery, discovery::GpuDriver};
use mesos_gpu_placement::{
    allocator::AllocError, allocator::Allocator, allocator::GpuSet, allocator::Policy,
};
use mesos_gpu_placement::{mig::MigKind, mig::MigUnits};
use mesos_gpu_testkit::nodes::{NodeBuilder, dgx1_v100, dual_dgx1_v100};
use mesos_gpu_testkit::nvml_sim::SimNode;

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

/// Latency of one-MIG-device requests on the 56 MIG units of `dgx-a100-mig`.
fn mig_latency_table(rounds: usize) -> Result<(), Box<dyn std::error::Error>> {
    let sim = SimNode::shipped("dgx-a100-mig");
    let inventory = match GpuDriver::open_at(Some(&sim.lib_path()), &sim.proc_root())? {
        Discovery::Driver(driver) => driver.inventory().clone(),
        Discovery::NoDriver(_) => return Err("nvml-sim reports no driver".into()),
    };
    println!(
        "MIG unit allocation latency over {rounds} allocations (dgx-a100-mig: {} MIG devices)",
        inventory.mig.devices.len()
    );
    println!(
        "{:<6} {:<8} {:>9} {:>9} {:>9}",
        "held", "profile", "p50", "p99", "max"
    );
    for held in [0, 28, 55] {
        for profile in [None, Some(MigKind::whole(19))] {
            let mut units = MigUnits::new(&inventory.mig, false);
            for n in 0..held {
                units.allocate(&format!("holder-{n}"), 1, None)?;
            }
            let mut times = Vec::with_capacity(rounds);
            for _ in 0..rounds {
                let began = Instant::now();
                let got = units.allocate("bench", 1, profile)?;
                times.push(began.elapsed());
                std::hint::black_box(got);
                units.release("bench");
            }
            times.sort_unstable();
            println!(
                "{:<6} {:<8} {:>9.2?} {:>9.2?} {:>9.2?}",
                held,
                profile.map_or_else(|| "any".to_owned(), |p| p.profile.to_string()),
                percentile(&times, 50),
                percentile(&times, 99),
                times[times.len() - 1]
            );
        }
    }
    println!();
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

/// Counts, over free sets and sizes, where our pick scores below, equal to and above the
/// best-effort pick; false on any case below.
fn against_best_effort() -> Result<bool, AllocError> {
    println!();
    println!("topology policy against go-gpuallocator's best-effort policy, by NVIDIA's score");
    println!(
        "{:<10} {:>9} {:>6} {:>6} {:>6}  largest gain",
        "node", "cases", "lower", "equal", "higher"
    );
    let mut never_lower = true;
    // SplitMix64 over 16-bit masks: 400 free sets of the 16-GPU node, the same every run.
    let mut seed = 15u64;
    let mut random_sets = std::iter::repeat_with(move || {
        seed = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = seed;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        (z ^ (z >> 31)) & 0xffff
    });
    let nodes: [(&str, NodeBuilder, Vec<u64>); 2] = [
        ("dgx1", dgx1_v100(), (1..256).collect()),
        (
            "dual-dgx1",
            dual_dgx1_v100(),
            random_sets.by_ref().filter(|&m| m != 0).take(400).collect(),
        ),
    ];
    for (name, builder, free_sets) in nodes {
        let inventory = builder.inventory();
        let pair =
            |a: u32, b: u32| u64::from(inventory.topology.pair_score(a as usize, b as usize));
        let (mut cases, mut lower, mut equal, mut higher, mut gain) = (0, 0, 0, 0, 0);
        for free_mask in free_sets {
            let free = GpuSet::from_indices((0..16).filter(|&i| free_mask & 1 << i != 0))?;
            let mut alloc = Allocator::new(&inventory, Policy::Topology)?;
            alloc.allocate_specific("other", alloc.managed().difference(free))?;
            for size in 1..=free.len() {
                let got = alloc.allocate("probe", size)?;
                let ours = alloc.score(got);
                alloc.release_all("probe");
                let theirs = besteffort::best_effort(free_mask, size, &pair)
                    .map_or(0, |c| alloc.score(to_set(c.set)));
                cases += 1;
                match ours.cmp(&theirs) {
                    std::cmp::Ordering::Less => lower += 1,
                    std::cmp::Ordering::Equal => equal += 1,
                    std::cmp::Ordering::Greater => higher += 1,
                }
                gain = gain.max(ours.saturating_sub(theirs));
            }
        }
        never_lower &= lower == 0;
        println!("{name:<10} {cases:>9} {lower:>6} {equal:>6} {higher:>6}  {gain}");
    }
    Ok(never_lower)
}

fn to_set(mask: u64) -> GpuSet {
    GpuSet::from_indices((0..64).filter(|&i| mask & 1 << i != 0)).unwrap_or(GpuSet::EMPTY)
}

fn main() -> ExitCode {
    let rounds = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(10_000);
    if let Err(err) = mig_latency_table(rounds) {
        eprintln!("error: {err}");
        return ExitCode::FAILURE;
    }
    let outcome = latency_table(rounds).and_then(|()| {
        let exact = score_table()?;
        let never_lower = against_best_effort()?;
        Ok(exact && never_lower)
    });
    match outcome {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!("error: a chosen set scored below the brute-force best or best-effort's");
            ExitCode::FAILURE
        }
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::FAILURE
        }
    }
}
