//! Allocate GPUs with the isolator crate used as a library: discover the node through NVML (a
//! real driver, or nvml-sim loaded the same way), pick GPUs with the topology policy and show
//! the choice next to first-fit's.
//!
//! ```text
//! allocate [--nvml-lib PATH] COUNT...
//! ```
//!
//! Each COUNT is one request, granted in order on the same node (so later ones see fewer free
//! GPUs). Without `--nvml-lib` the system's `libnvidia-ml.so.1` is loaded.

#![forbid(unsafe_code)]

use std::path::PathBuf;

use anyhow::{Context as _, bail};
use mesos_gpu_node::discovery::GpuDriver;
use mesos_gpu_placement::{allocator::Allocator, allocator::Policy};

fn main() -> anyhow::Result<()> {
    let mut lib: Option<PathBuf> = None;
    let mut counts: Vec<f64> = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--nvml-lib" => lib = Some(args.next().context("--nvml-lib needs a path")?.into()),
            "-h" | "--help" => {
                println!("usage: allocate [--nvml-lib PATH] COUNT...");
                return Ok(());
            }
            count => counts.push(
                count
                    .parse()
                    .with_context(|| format!("{count:?}: expected a GPU count such as 2"))?,
            ),
        }
    }
    if counts.is_empty() {
        bail!("usage: allocate [--nvml-lib PATH] COUNT...");
    }

    let discovery = GpuDriver::open(lib.as_deref()).context("GPU discovery failed")?;
    let inventory = discovery.inventory();
    println!(
        "{} GPUs, driver {}",
        inventory.gpus.len(),
        inventory
            .driver
            .as_ref()
            .map_or("none", |d| d.version.as_str())
    );

    let mut topology = Allocator::new(inventory, Policy::Topology)?;
    let mut first_fit = Allocator::new(inventory, Policy::FirstFit)?;
    for (n, &value) in counts.iter().enumerate() {
        let owner = format!("task-{n}");
        // Validate the `gpus` scalar exactly as the isolator does (whole, 0..=offered).
        let count = match topology.request(value) {
            Ok(request) => request.count(),
            Err(err) => {
                println!("{owner}: refused: {err}");
                continue;
            }
        };
        // What first-fit would take from the same free GPUs, without keeping it.
        let naive = first_fit.clone().allocate(&owner, count);
        match topology.allocate(&owner, count) {
            Ok(set) => {
                first_fit.allocate_specific(&owner, set)?;
                let naive = naive.map_or_else(
                    |e| format!("refused ({e})"),
                    |s| format!("{{{s}}} (score {})", topology.score(s)),
                );
                println!(
                    "{owner}: {count} GPU(s) -> {{{set}}} (score {}); first-fit: {naive}",
                    topology.score(set)
                );
            }
            Err(err) => println!("{owner}: refused: {err}"),
        }
    }
    let frag = topology.fragmentation();
    println!(
        "free: {} GPU(s), largest all-NVLink set {}",
        frag.free, frag.nvlink_set
    );
    Ok(())
}
