//! Allocation latency for every request size on the 8-GPU DGX-1 V100 and on the 16-GPU node of
//! two DGX-1 boards, both policies, fully free and partly allocated. Each iteration grants from
//! a fresh copy of the allocator (the copy is made outside the timed part).
//!
//! p50/p99 over 10 000 allocations and the score check against brute force are printed by
//! `cargo run --release -p mesos-gpu-placement --example alloc_figures`.

use std::hint::black_box;

use criterion::{BatchSize, BenchmarkId, Criterion, criterion_group, criterion_main};
use mesos_gpu_placement::{allocator::Allocator, allocator::GpuSet, allocator::Policy};
use mesos_gpu_testkit::nodes::{NodeBuilder, dgx1_v100, dual_dgx1_v100};

/// An allocator over `builder`'s node with `taken` already held by another container.
fn allocator(builder: &NodeBuilder, policy: Policy, taken: &[u32]) -> Allocator {
    let mut alloc =
        Allocator::new(&builder.inventory(), policy).expect("reference nodes are valid");
    let taken = GpuSet::from_indices(taken.iter().copied()).expect("indices below 64");
    alloc
        .allocate_specific("other", taken)
        .expect("taken GPUs are free");
    alloc
}

fn allocation(c: &mut Criterion) {
    let nodes: [(&str, NodeBuilder, &[u32]); 4] = [
        ("dgx1/free", dgx1_v100(), &[]),
        ("dgx1/partly", dgx1_v100(), &[1, 6]),
        ("dual-dgx1/free", dual_dgx1_v100(), &[]),
        ("dual-dgx1/partly", dual_dgx1_v100(), &[1, 6, 11, 12]),
    ];
    for (name, builder, taken) in &nodes {
        for policy in [Policy::Topology, Policy::FirstFit] {
            let base = allocator(builder, policy, taken);
            let mut group = c.benchmark_group(format!("allocate/{name}/{policy}"));
            for size in 1..=base.free().len() {
                group.bench_with_input(BenchmarkId::from_parameter(size), &size, |b, &size| {
                    b.iter_batched_ref(
                        || base.clone(),
                        |alloc| black_box(alloc.allocate("bench", size)),
                        BatchSize::SmallInput,
                    );
                });
            }
            group.finish();
        }
    }
}

criterion_group!(benches, allocation);
criterion_main!(benches);
