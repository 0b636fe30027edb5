//! What the lifecycle examples (`lifecycle_figures`, `growth_figures`) share: the node's device
//! nodes, one timed container cycle, the load average they ran under, and percentiles.

use std::error::Error;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use mesos_gpu_enforce::timing::{self, Breakdown};
use mesos_gpu_isolator::lifecycle::{ContainerId, Isolator, PrepareConfig};
use mesos_gpu_node::devices::DeviceNodes;
use mesos_gpu_node::inventory::Inventory;

/// `mknod`s `inventory`'s GPU nodes, `nvidiactl` and `nvidia-uvm` under `dir` (root) and scans
/// them.
pub(crate) fn device_nodes(
    dir: &Path,
    inventory: &Inventory,
) -> Result<DeviceNodes, Box<dyn Error>> {
    for (name, major, minor) in inventory
        .gpus
        .iter()
        .map(|g| (format!("nvidia{}", g.minor), 195, g.minor))
        .chain([
            ("nvidiactl".to_owned(), 195, 255),
            ("nvidia-uvm".to_owned(), 240, 0),
        ])
    {
        let ok = Command::new("mknod")
            .arg(dir.join(name))
            .args(["c", &major.to_string(), &minor.to_string()])
            .status()?;
        if !ok.success() {
            return Err("mknod failed (root needed)".into());
        }
    }
    Ok(DeviceNodes::scan(dir, inventory)?)
}

/// One call's time, and where it went ([`timing`]).
pub(crate) struct Call {
    pub(crate) took: Duration,
    pub(crate) steps: Breakdown,
}

/// Container `id` prepared with `gpus`, process `pid` moved in, moved back out to the cgroup
/// `root` (untimed: as its exit would take it out), and cleaned up: the prepare, isolate and
/// cleanup calls, timed.
pub(crate) fn cycle(
    isolator: &Isolator,
    id: &ContainerId,
    gpus: f64,
    pid: u32,
    root: &Path,
) -> Result<[Call; 3], Box<dyn Error>> {
    let timed = |f: &dyn Fn() -> Result<(), Box<dyn Error>>| {
        let _ = timing::take();
        let t0 = Instant::now();
        f()?;
        let took = t0.elapsed();
        Ok::<_, Box<dyn Error>>(Call {
            took,
            steps: timing::take(),
        })
    };
    let config = PrepareConfig {
        gpus,
        ..PrepareConfig::default()
    };
    let prepared = timed(&|| Ok(isolator.prepare(id, config.clone()).map(drop)?))?;
    let isolated = timed(&|| Ok(isolator.isolate(id, pid)?))?;
    std::fs::write(root.join("cgroup.procs"), pid.to_string())?;
    let cleaned = timed(&|| Ok(isolator.cleanup(id)?))?;
    Ok([prepared, isolated, cleaned])
}

/// The 1, 5 and 15 minute load averages.
pub(crate) fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".to_owned())
}

/// The `p`th percentile of `sorted`.
pub(crate) fn pct(sorted: &[Duration], p: usize) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[(sorted.len() * p / 100).min(sorted.len() - 1)]
}

/// `d` in milliseconds.
pub(crate) fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}
