//! Time from an injected XID (a line appended to nvml-sim's events file) to the GPU being out of
//! the allocator's free pool and a channel subscriber notified, p50/p99 over many injections,
//! on a simulated DGX-1 (8 GPUs) with the monitor's production defaults and no checkpoint.
//!
//! Run: `cargo build --release -p mesos-gpu-health --example health_figures && \
//! NVML_SIM_LIB=$CARGO_TARGET_DIR/release/deps/libnvml_sim.so \
//! $CARGO_TARGET_DIR/release/examples/health_figures [ROUNDS]` (examples run from
//! `release/examples/`, where testkit does not look for the simulator library).
//! NVIDIA's device plugin waits in 5 s rounds; the target here is under 50 ms p99. nvml-sim's
//! `nvmlEventSetWait_v2` polls its events file every 5 ms, which bounds the figures from below
//! (a real driver wakes the waiter at once).

use std::process::ExitCode;
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};

use mesos_gpu_health::{
    ChangeCallback, GpuRef, HealthChange, HealthMonitor, MonitorConfig, apply_to_allocator,
};
use mesos_gpu_node::{discovery::Discovery, discovery::GpuDriver};
use mesos_gpu_placement::{allocator::Allocator, allocator::Policy};
use mesos_gpu_testkit::nvml_sim::SimNode;

/// Nearest-rank percentile, `per_mille` of 1000.
fn percentile(sorted: &[Duration], per_mille: usize) -> Duration {
    let rank = (sorted.len().saturating_sub(1) * per_mille + 500) / 1000;
    sorted[rank.min(sorted.len().saturating_sub(1))]
}

fn main() -> anyhow::Result<ExitCode> {
    let rounds: usize = std::env::args()
        .nth(1)
        .map_or(Ok(300), |a| a.parse())
        .context("ROUNDS")?;
    let sim = SimNode::shipped("dgx1-v100");
    let Discovery::Driver(driver) = GpuDriver::open(Some(&sim.lib_path()))? else {
        anyhow::bail!("nvml-sim did not load");
    };
    let driver = Arc::new(*driver);
    let allocator = Arc::new(Mutex::new(Allocator::new(
        driver.inventory(),
        Policy::Topology,
    )?));
    let (out_tx, out_rx) = mpsc::channel::<(u32, Instant)>();
    let callback: ChangeCallback = {
        let allocator = Arc::clone(&allocator);
        let out_tx = Mutex::new(out_tx);
        Arc::new(move |change: &HealthChange| {
            let mut alloc = allocator
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if apply_to_allocator(&mut alloc, change).is_ok() && !change.health.is_healthy() {
                let _ = out_tx
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .send((change.index, Instant::now()));
            }
        })
    };
    let monitor = HealthMonitor::start(
        Arc::clone(&driver),
        MonitorConfig::default(),
        vec![callback],
    )?;
    let subscriber = monitor.subscribe();
    while monitor.stats().registrations == 0 {
        std::thread::sleep(Duration::from_millis(1));
    }

    let mut out_of_pool = Vec::with_capacity(rounds);
    let mut notified = Vec::with_capacity(rounds);
    for round in 0..rounds {
        let gpu = u32::try_from(round % 8)?;
        let start = Instant::now();
        sim.append_event(&format!("xid {gpu} 79"));
        let (index, pulled) = out_rx
            .recv_timeout(Duration::from_secs(5))
            .context("no pool change")?;
        let change = subscriber
            .recv_timeout(Duration::from_secs(5))
            .context("no notification")?;
        let heard = Instant::now();
        if index != gpu || change.index != gpu {
            bail!("injected on GPU {gpu}, saw {index} / {}", change.index);
        }
        if allocator
            .lock()
            .map_err(|_| anyhow::anyhow!("poisoned"))?
            .free()
            .contains(gpu)
        {
            bail!("GPU {gpu} still free after its XID");
        }
        out_of_pool.push(pulled - start);
        notified.push(heard - start);
        monitor.mark_healthy(&GpuRef::Index(gpu))?;
        subscriber
            .recv_timeout(Duration::from_secs(5))
            .context("no recovery notification")?;
        // Spread injections over the 5 ms poll so the figures are not phase-locked to it.
        std::thread::sleep(Duration::from_micros(1_000 + (round as u64 * 737) % 5_000));
    }
    out_of_pool.sort();
    notified.sort();
    for (what, figures) in [
        ("out of the pool", &out_of_pool),
        ("subscriber notified", &notified),
    ] {
        println!(
            "XID → {what:<20} p50 {:>6.2} ms  p99 {:>6.2} ms  max {:>6.2} ms  ({} injections)",
            percentile(figures, 500).as_secs_f64() * 1e3,
            percentile(figures, 990).as_secs_f64() * 1e3,
            figures.last().copied().unwrap_or_default().as_secs_f64() * 1e3,
            figures.len(),
        );
    }
    println!("event loop: {:?}", monitor.stats());
    let p99 = percentile(&notified, 990);
    Ok(if p99 < Duration::from_millis(50) {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
