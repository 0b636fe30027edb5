//! A simulated day of GPU-share requests on a DGX-1 V100 (8 GPUs) whose GPUs are all shared R
//! ways, placed by packing (`Placement::Pack`, what the node does) and by spreading
//! (`Placement::Spread`, least used GPU first), printing one row per R, load and policy.
//!
//! Run: `cargo run --release -p mesos-gpu-placement --example share_packing [-- SEED]`
//! (default seed 17). The committed output is `docs/benchmarks/share-packing.txt`.
//!
//! Requests arrive as a Poisson process for 24 hours; each asks k units of one GPU (k from 1
//! to R, weights below: mostly 1-unit inference tasks, some half and whole-GPU-sized shares) and
//! holds them for an exponentially distributed time, mean 6 minutes. The arrival rate makes the
//! units asked `LOAD` times what the node offers. The same requests go to both policies.
//! Counted: requests **refused** (no single GPU had k free units), of which **fragmented**
//! (the node had k free units in all, but spread over GPUs: a share never spans GPUs), and the
//! mean number of **idle GPUs** (no owner) seen by arriving requests.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use mesos_gpu_placement::sharing::{
    ModeSpec, Placement, ShareBook, SharingMode, SharingSpec, Wanted,
};
use mesos_gpu_testkit::nodes::dgx1_v100;

#[path = "support/rng.rs"]
mod rng;

use rng::Rng;

/// Mean time a share is held, in hours.
const MEAN_HOLD_HOURS: f64 = 0.1;

/// Share sizes k for a replica count R: half the requests 1 unit, a quarter R/2, a fifth R
/// (a whole GPU's worth), the rest 2 units.
fn size(rng: &mut Rng, replicas: u32) -> u32 {
    match rng.next() % 20 {
        0..=9 => 1,
        10..=14 => (replicas / 2).max(1),
        15..=18 => replicas,
        _ => 2.min(replicas),
    }
}

struct Request {
    at: f64,
    hold: f64,
    units: u32,
}

fn day(seed: u64, replicas: u32, load: f64) -> Vec<Request> {
    let mut rng = Rng(seed);
    // Mean units per request, from `size`'s weights.
    let mean_units = (10.0
        + 5.0 * f64::from((replicas / 2).max(1))
        + 4.0 * f64::from(replicas)
        + f64::from(2.min(replicas)))
        / 20.0;
    let offered = 8.0 * f64::from(replicas);
    let rate = load * offered / (mean_units * MEAN_HOLD_HOURS);
    let mut out = Vec::new();
    let mut at = 0.0;
    loop {
        at += rng.exponential(1.0 / rate);
        if at > 24.0 {
            return out;
        }
        out.push(Request {
            at,
            hold: rng.exponential(MEAN_HOLD_HOURS),
            units: size(&mut rng, replicas),
        });
    }
}

#[derive(Default)]
struct Figures {
    requests: u32,
    refused: u32,
    fragmented: u32,
    idle_sum: usize,
}

fn live(book: &ShareBook, requests: &[Request], policy: Placement) -> Figures {
    let mut book = book.clone();
    let mut ends: BinaryHeap<Reverse<(u64, usize)>> = BinaryHeap::new();
    let mut f = Figures::default();
    for (i, r) in requests.iter().enumerate() {
        // Integer microhours keep the heap ordered without float comparisons.
        let now = hours_key(r.at);
        while let Some(Reverse((end, id))) = ends.peek().copied() {
            if end > now {
                break;
            }
            ends.pop();
            book.release(&id.to_string());
        }
        f.requests += 1;
        f.idle_sum += book.idle().len();
        match book.place(&i.to_string(), r.units, policy, Wanted::Any) {
            Ok(_) => ends.push(Reverse((hours_key(r.at + r.hold), i))),
            Err(_) => {
                f.refused += 1;
                if book.free().values().sum::<u32>() >= r.units {
                    f.fragmented += 1;
                }
            }
        }
    }
    f
}

#[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)] // hours in [0, 48)
fn hours_key(h: f64) -> u64 {
    (h * 1e6) as u64
}

fn pct(part: u32, whole: u32) -> f64 {
    100.0 * f64::from(part) / f64::from(whole.max(1))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let seed = match std::env::args().nth(1) {
        Some(s) => s.parse()?,
        None => 17,
    };
    let inventory = dgx1_v100().inventory();
    let all: Vec<u32> = (0..8).collect();
    println!("share placement on dgx1-v100 (8 GPUs, all shared), seed {seed}, mean hold 6 min");
    println!(
        "{:>3} {:>5} {:>7} {:>9} {:>9} {:>12} {:>10}",
        "R", "load", "policy", "requests", "refused%", "fragmented%", "idle GPUs"
    );
    for replicas in [4, 8] {
        let plan = SharingSpec::parse(&replicas.to_string(), ModeSpec::uniform(SharingMode::Mps))?
            .resolve(&inventory, &all)?;
        let book = ShareBook::new(&plan);
        for load in [0.5, 0.8, 1.0] {
            let requests = day(seed, replicas, load);
            for policy in [Placement::Pack, Placement::Spread] {
                let f = live(&book, &requests, policy);
                #[allow(clippy::cast_precision_loss)] // small counts
                let idle = f.idle_sum as f64 / f64::from(f.requests.max(1));
                println!(
                    "{replicas:>3} {load:>5.1} {:>7} {:>9} {:>9.2} {:>12.2} {idle:>10.2}",
                    policy.to_string(),
                    f.requests,
                    pct(f.refused, f.requests),
                    pct(f.fragmented, f.requests),
                );
            }
        }
    }
    Ok(())
}
