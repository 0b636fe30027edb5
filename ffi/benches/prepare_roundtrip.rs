//! `prepare` + `cleanup` through the C ABI against the same calls in Rust, to measure what the
//! ABI costs per call: protobuf encode of the `ContainerID` and `ContainerConfig`, decode on the
//! Rust side, conversion both ways, encode of the `ContainerLaunchInfo`, the copy into the
//! caller's buffer, `catch_unwind`, and the decode back on the caller's side.
//!
//! What is prepared: a **nested** container (of a parent holding 2 GPUs of a simulated 4-GPU
//! node) with a rootfs, so the answer is realistic (4 device mounts, 2 environment variables)
//! while no cgroup is created per iteration: cgroup mkdir/rmdir would dominate and hide the ABI.
//! The Rust baseline calls `Isolator::prepare`/`cleanup` with the same container directly.
//!
//! Needs root (mknod'ed device nodes, the parent's cgroup); without it, it says so and exits.
//! Prints criterion's figures and, at the end, the overhead per round trip (target < 10 µs).

#[path = "../tests/support/mod.rs"]
mod support;

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::Criterion;
use mesos_gpu::proto::mesos::ContainerId;
use mesos_gpu::proto::mesos::slave::{ContainerConfig, ContainerLaunchInfo};
use mesos_gpu_isolator::{
    lifecycle::CgroupChoice, lifecycle::ContainerId as Cid, lifecycle::Isolator,
    lifecycle::IsolatorConfig, lifecycle::PoolConfig, lifecycle::PoolRole,
    lifecycle::PrepareConfig,
};
use mesos_gpu_node::devices::DeviceNodes;
use mesos_gpu_node::{discovery::Discovery, discovery::GpuDriver};
use prost::Message;
use support::{Cg, Fixture, Handle, call_plain, cid, config};

fn nested(parent: &ContainerId) -> ContainerId {
    ContainerId {
        value: "child".into(),
        parent: Some(Box::new(parent.clone())),
    }
}

fn child_config() -> ContainerConfig {
    ContainerConfig {
        rootfs: Some("/var/lib/mesos/provisioner/rootfs".into()),
        directory: "/sandbox".into(),
        ..ContainerConfig::default()
    }
}

/// One round trip through the C ABI: encode, prepare, decode, cleanup.
fn abi_round_trip(h: &Handle, id: &ContainerId, buf: &mut [u8]) -> ContainerLaunchInfo {
    let id_bytes = id.encode_to_vec();
    let cfg = child_config().encode_to_vec();
    let mut len = 0usize;
    let mut err = [0u8; 256];
    // SAFETY: live handle; every buffer is a live local of the length given.
    let status = unsafe {
        mesos_gpu::mgpu_prepare(
            h.0,
            id_bytes.as_ptr(),
            id_bytes.len(),
            cfg.as_ptr(),
            cfg.len(),
            buf.as_mut_ptr(),
            buf.len(),
            &mut len,
            err.as_mut_ptr().cast(),
            err.len(),
        )
    };
    assert_eq!(
        status,
        mesos_gpu::MgpuStatus::MgpuOk,
        "{}",
        support::text(&err)
    );
    let info = ContainerLaunchInfo::decode(&buf[..len]).unwrap_or_default();
    // SAFETY: as above.
    let a = call_plain(|e, c| unsafe {
        mesos_gpu::mgpu_cleanup(h.0, id_bytes.as_ptr(), id_bytes.len(), e, c)
    });
    assert_eq!(a.status, mesos_gpu::MgpuStatus::MgpuOk, "{}", a.err);
    info
}

/// The same in Rust: prepare and clean up the nested container through the lifecycle API.
fn rust_round_trip(iso: &Isolator, id: &Cid, parent: &Cid) -> usize {
    let config = PrepareConfig {
        rootfs: Some("/var/lib/mesos/provisioner/rootfs".into()),
        parent: Some(parent.clone()),
        ..PrepareConfig::default()
    };
    let info = iso.prepare(id, config).unwrap_or_else(|e| panic!("{e}"));
    iso.cleanup(id).unwrap_or_else(|e| panic!("{e}"));
    info.mounts.len()
}

fn rust_isolator(f: &Fixture) -> Isolator {
    let inventory = match GpuDriver::open(Some(&f.sim.lib_path())) {
        Ok(Discovery::Driver(d)) => d.inventory().clone(),
        other => panic!("no simulated driver: {other:?}"),
    };
    let nodes = DeviceNodes::scan(f.dev.path(), &inventory).unwrap_or_else(|e| panic!("{e}"));
    let mut config = IsolatorConfig::new(f.work.path());
    config.cgroup_version = CgroupChoice::V1;
    config.cgroups_root = f.cgroups_root.clone();
    // Like the module (the fixture's `pool_dir`): the node's pool, so only the ABI differs.
    config.pool = Some(PoolConfig {
        dir: f.work.path().join("pool"),
        role: PoolRole::Agent,
    });
    Isolator::new(config, inventory, nodes).unwrap_or_else(|e| panic!("{e}"))
}

/// Median of `rounds` batch means of `batch` calls of `f`.
fn median_per_call(rounds: usize, batch: u32, mut f: impl FnMut()) -> Duration {
    let mut means: Vec<Duration> = (0..rounds)
        .map(|_| {
            let start = Instant::now();
            for _ in 0..batch {
                f();
            }
            start.elapsed() / batch
        })
        .collect();
    means.sort();
    means[rounds / 2]
}

fn main() {
    if !std::fs::read_to_string("/proc/self/status").is_ok_and(|s| {
        s.lines()
            .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(2) == Some("0"))
    }) {
        println!("prepare_roundtrip: needs root (device nodes, a cgroup for the parent); not run");
        return;
    }
    let abi_fixture = Fixture::new(Cg::V1).unwrap_or_else(|e| panic!("{e}"));
    let h = Handle::new(&abi_fixture.params(&[])).unwrap_or_else(|e| panic!("{e}"));
    let parent = cid("bench-parent");
    h.prepare(&parent, &config(2.0))
        .ok()
        .unwrap_or_else(|e| panic!("{e}"));
    let child = nested(&parent);
    let mut buf = vec![0u8; 64 * 1024];
    let info = abi_round_trip(&h, &child, &mut buf);
    assert_eq!(info.mounts.len(), 4, "{info:?}");

    let rust_fixture = Fixture::new(Cg::V1).unwrap_or_else(|e| panic!("{e}"));
    let iso = rust_isolator(&rust_fixture);
    let rparent = Cid::new("bench-parent").unwrap_or_else(|e| panic!("{e}"));
    iso.prepare(
        &rparent,
        PrepareConfig {
            gpus: 2.0,
            ..PrepareConfig::default()
        },
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let rchild = Cid::new("bench-parent.child").unwrap_or_else(|e| panic!("{e}"));

    let mut c = Criterion::default()
        .configure_from_args()
        .measurement_time(Duration::from_secs(3));
    let mut group = c.benchmark_group("prepare_cleanup_nested");
    group.bench_function("c_abi", |b| {
        b.iter(|| black_box(abi_round_trip(&h, &child, &mut buf)))
    });
    group.bench_function("rust", |b| {
        b.iter(|| black_box(rust_round_trip(&iso, &rchild, &rparent)))
    });
    group.finish();

    let abi = median_per_call(21, 2000, || {
        black_box(abi_round_trip(&h, &child, &mut buf));
    });
    let rust = median_per_call(21, 2000, || {
        black_box(rust_round_trip(&iso, &rchild, &rparent));
    });
    let overhead = abi.saturating_sub(rust);
    println!(
        "prepare+cleanup round trip (median of 21 batches of 2000): C ABI {:.2} µs, Rust {:.2} µs, overhead {:.2} µs per round trip (target < 10 µs)",
        abi.as_secs_f64() * 1e6,
        rust.as_secs_f64() * 1e6,
        overhead.as_secs_f64() * 1e6
    );
    h.cleanup(&parent).ok().unwrap_or_else(|e| panic!("{e}"));
    iso.cleanup(&rparent).unwrap_or_else(|e| panic!("{e}"));
    c.final_summary();
}
