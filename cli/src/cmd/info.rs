//! `mesos-gpu info`: the node's GPUs, driver, device nodes and interconnect topology.
//!
//! `--json` prints one object with these stable fields:
//! - `simulated`: the `--simulate` node, or null;
//! - `driver`: `{"version": "550.54.14", "cuda_version": "12.4" | null}` or null;
//! - `absent_reason`: why there are no GPUs, or null;
//! - `gpus`: one object per GPU in NVML index order: `index`, `minor` (null when unknown),
//!   `uuid`, `name`, `memory_total_bytes`, `pci_bus_id`, `numa_node` (null when unknown),
//!   `compute_capability` (`"7.0"` or null), `healthy`, `cpu_affinity` (CPU list such as
//!   `"0-19,40-59"`, or null), `memory_affinity` (memory node list such as `"0"`, or null),
//!   `pinned_cpus` and `pinned_mems` (what NUMA pinning gives a task holding this GPU: its
//!   local CPUs and memory nodes within the machine's online ones, or null when it would not be
//!   pinned), `device` (`"195:0"`, or null when the node was not read),
//!   `health` (the health monitor's checkpointed state of this GPU, matched by UUID, from
//!   `<--agent-work-dir>/gpu/health.json`: `{"state": "healthy"}` or `{"state": "unhealthy",
//!   "reason": {"kind": "xid", "xid": 79}, "since_ms": …, "last_error_ms": …, "errors": …}`;
//!   null when nothing is checkpointed for it), `health_unknown` (true, only when the checkpoint
//!   exists but cannot be read: then nothing is known of the GPU's health). `healthy` is
//!   discovery's flag (NVML answers);
//! - `topology`: an N×N matrix of `nvidia-smi topo -m` labels (`X`, `NV2`, `PIX`, `PXB`, `PHB`,
//!   `NODE`, `SYS`, `PSB`, `?`), row = from, column = to, by position in `gpus`;
//! - `control_devices`: `[{"path": "/dev/nvidiactl", "device": "195:255"}, …]`;
//! - `mig` (absent on a node without MIG): `enabled` (NVML indices of the GPUs in MIG mode, which
//!   are never given whole), `caps_major` (the `nvidia-caps` major, or null), `devices`: one
//!   object per MIG device: `parent` (NVML index), `parent_minor`, `index` (MIG device index),
//!   `uuid` (`MIG-…`), `gpu_instance`, `compute_instance`, `profile` (GPU instance profile id,
//!   or null), `profile_name`, `memory_total` (bytes), `multiprocessors`,
//!   `gpu_instance_slices`, `compute_instance_slices`, `caps` (`gpu_instance` and
//!   `compute_instance` as `{"major", "minor"}` of `/dev/nvidia-caps/nvidia-cap<minor>`, and
//!   the `/proc`-relative `gpu_instance_file` and `compute_instance_file`; null when the driver
//!   does not number them), `healthy`;
//! - `notes`: human-readable remarks (simulation, unreadable device nodes, unhealthy GPUs, an
//!   unreadable health checkpoint).
//!
//! The table's HEALTH column is `LOST` when discovery could not reach the GPU, else
//! `UNHEALTHY:<reason>` (`xid-79`, `ecc-dbe`, `lost`, `unwatchable`) when the health checkpoint
//! says so, `unknown` when the checkpoint cannot be read, else `ok`.

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::Path;
use std::process::ExitCode;

use mesos_gpu_health::{Failure, GpuHealth, GpuRecord, HealthStore};
use mesos_gpu_node::devices::DeviceNodes;
use mesos_gpu_node::{discovery::GpuDriver, discovery::UNKNOWN_MINOR};
use mesos_gpu_node::{inventory::Gpu, inventory::Inventory, inventory::MigLayout};
use mesos_gpu_placement::numa;
use serde::Serialize;

use crate::ctx::Ctx;

#[derive(clap::Args)]
#[command(after_help = "Examples:\n  \
    mesos-gpu info\n  \
    mesos-gpu info --simulate dgx1-v100\n  \
    mesos-gpu info --simulate list\n  \
    mesos-gpu info --json --nvml-lib \\\n      \
    /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1\n  \
    mesos-gpu info --agent-work-dir /var/lib/mesos")]
pub(crate) struct Args {
    /// Print JSON (fields documented in the module) instead of tables.
    #[arg(long)]
    json: bool,

    /// The agent whose GPU health checkpoint (`<DIR>/gpu/health.json`) is shown beside
    /// discovery's health.
    #[command(flatten)]
    agent: super::AgentWorkDirCompatArgs,
}

#[derive(Serialize)]
struct Report {
    simulated: Option<String>,
    driver: Option<DriverJson>,
    absent_reason: Option<String>,
    gpus: Vec<GpuJson>,
    topology: Vec<Vec<String>>,
    control_devices: Vec<DeviceJson>,
    #[serde(skip_serializing_if = "MigLayout::is_empty")]
    mig: MigLayout,
    notes: Vec<String>,
}

#[derive(Serialize)]
struct DriverJson {
    version: String,
    cuda_version: Option<String>,
}

#[derive(Serialize)]
struct GpuJson {
    index: u32,
    minor: Option<u32>,
    uuid: String,
    name: String,
    memory_total_bytes: u64,
    pci_bus_id: String,
    numa_node: Option<u32>,
    compute_capability: Option<String>,
    healthy: bool,
    cpu_affinity: Option<String>,
    memory_affinity: Option<String>,
    pinned_cpus: Option<String>,
    pinned_mems: Option<String>,
    device: Option<String>,
    health: Option<GpuHealth>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    health_unknown: bool,
}

#[derive(Serialize)]
struct DeviceJson {
    path: String,
    device: String,
}

pub(crate) fn run(args: &Args, ctx: &Ctx) -> anyhow::Result<ExitCode> {
    let mut out = std::io::stdout().lock();
    if ctx.list_simulations(&mut out)? {
        return Ok(ExitCode::SUCCESS);
    }
    let report = build(ctx, &args.agent.dir(ctx)?)?;
    if args.json {
        serde_json::to_writer_pretty(&mut out, &report)?;
        writeln!(out)?;
    } else {
        out.write_all(render(&report).as_bytes())?;
    }
    Ok(ExitCode::SUCCESS)
}

fn build(ctx: &Ctx, work_dir: &Path) -> anyhow::Result<Report> {
    let simulated = ctx.simulation()?.map(|s| s.name().to_owned());
    let inventory = ctx.inventory()?;
    let driver = ctx.driver()?;
    let mut notes = Vec::new();
    let nodes = device_nodes(ctx, inventory, &mut notes);
    let store = HealthStore::at(work_dir);
    let (records, mig_records, health_unknown) = match store.load() {
        Ok(snapshot) => {
            let (gpus, mig) = snapshot.map(|s| (s.gpus, s.mig)).unwrap_or_default();
            (gpus, mig, false)
        }
        Err(err) => {
            notes.push(format!(
                "GPU health checkpoint not shown: {:#}",
                anyhow::Error::new(err)
            ));
            (Vec::new(), Vec::new(), true)
        }
    };
    let recorded = |g: &Gpu| -> Option<&GpuRecord> { records.iter().find(|r| r.uuid == g.uuid) };
    let affinities = driver.map(GpuDriver::affinities).unwrap_or_default();
    let online = online_cpus(simulated.as_deref(), driver, inventory, &mut notes);
    let pinned = |g: &Gpu| match online
        .as_ref()
        .map(|o| numa::plan(&[g.index], &affinities, o, None))
    {
        Some(numa::Decision::Pin(p)) => (Some(p.cpus.to_string()), p.mems.map(|m| m.to_string())),
        _ => (None, None),
    };
    unhealthy_notes(inventory, &records, &mig_records, &store, &mut notes);
    let gpus = (0..)
        .zip(&inventory.gpus)
        .map(|(pos, g): (usize, &Gpu)| GpuJson {
            index: g.index,
            minor: (g.minor != UNKNOWN_MINOR).then_some(g.minor),
            uuid: g.uuid.clone(),
            name: g.name.clone(),
            memory_total_bytes: g.memory_total,
            pci_bus_id: g.pci_bus_id.clone(),
            numa_node: g.numa_node,
            compute_capability: g.compute_capability.map(|(a, b)| format!("{a}.{b}")),
            healthy: g.healthy,
            cpu_affinity: driver.and_then(|d| d.cpu_affinity(pos)).map(cpu_list),
            memory_affinity: driver.and_then(|d| d.memory_affinity(pos)).map(cpu_list),
            pinned_cpus: pinned(g).0,
            pinned_mems: pinned(g).1,
            device: nodes
                .as_ref()
                .and_then(|n| n.gpu(g.index))
                .map(|n| n.dev.to_string()),
            health: recorded(g).map(|r| r.health.clone()),
            health_unknown,
        })
        .collect();
    let control_devices = nodes
        .iter()
        .flat_map(|n| &n.control)
        .map(|n| DeviceJson {
            path: n.path.display().to_string(),
            device: n.dev.to_string(),
        })
        .collect();
    Ok(Report {
        simulated,
        driver: inventory.driver.as_ref().map(|d| DriverJson {
            version: d.version.clone(),
            cuda_version: d.cuda_version.map(|(a, b)| format!("{a}.{b}")),
        }),
        absent_reason: inventory.absent_reason.clone(),
        gpus,
        topology: matrix(inventory),
        control_devices,
        mig: inventory.mig.clone(),
        notes,
    })
}

/// The device nodes under `--dev-root` (none without a driver, or for a simulated node without
/// `--dev-root`); why they are not shown goes to `notes`.
fn device_nodes(ctx: &Ctx, inventory: &Inventory, notes: &mut Vec<String>) -> Option<DeviceNodes> {
    match ctx.dev_root() {
        _ if inventory.driver.is_none() => None,
        None => {
            notes.push(
                "simulated node: device nodes are not read (a simulated node has none); \
                 give --dev-root to read a directory of nodes"
                    .to_owned(),
            );
            None
        }
        Some(root) => match DeviceNodes::scan(root, inventory) {
            Ok(nodes) => Some(nodes),
            Err(err) => {
                notes.push(format!("device nodes not usable: {err:#}"));
                None
            }
        },
    }
}

/// The CPUs and memory nodes NUMA pinning chooses among: this host's online ones, or for
/// simulated node `simulated` those its GPUs are local to; why none goes to `notes`.
fn online_cpus(
    simulated: Option<&str>,
    driver: Option<&GpuDriver>,
    inventory: &Inventory,
    notes: &mut Vec<String>,
) -> Option<numa::Allowed> {
    match (simulated, driver) {
        // A simulated node's facts only: its CPUs are those its GPUs are local to.
        (Some(name), Some(driver)) => {
            notes.push(format!(
                "simulated node {name}: NUMA pinning is shown within the CPUs its GPUs are local \
                 to, not this host's CPUs (host CPUs are not shown under --simulate)"
            ));
            Some(simulated_cpus(driver, inventory.gpus.len()))
        }
        (Some(_), None) => None,
        (None, _) => match mesos_gpu_node::numa::online(Path::new("/sys")) {
            Ok(online) => Some(online),
            Err(err) => {
                notes.push(format!(
                    "NUMA pinning not shown: {:#}",
                    anyhow::Error::new(err)
                ));
                None
            }
        },
    }
}

/// A note for each GPU and MIG device the health checkpoint in `store` records unhealthy, with
/// the command that clears it.
fn unhealthy_notes(
    inventory: &Inventory,
    records: &[GpuRecord],
    mig_records: &[GpuRecord],
    store: &HealthStore,
    notes: &mut Vec<String>,
) {
    for g in &inventory.gpus {
        let health = records.iter().find(|r| r.uuid == g.uuid).map(|r| &r.health);
        if let Some(GpuHealth::Unhealthy { reason, .. }) = health {
            notes.push(format!(
                "GPU {} ({}) is checkpointed unhealthy in {}: {reason}; `mesos-gpu gpu mark-healthy {}` clears it",
                g.index,
                g.uuid,
                store.checkpoint_path().display(),
                g.index
            ));
        }
    }
    for r in mig_records {
        if let (Some(m), GpuHealth::Unhealthy { reason, .. }) = (&r.mig, &r.health) {
            notes.push(format!(
                "MIG device {} (GPU {}, GPU instance {}, compute instance {}) is checkpointed \
                 unhealthy in {}: {reason}; `mesos-gpu gpu mark-healthy {}` clears it",
                r.uuid,
                r.index,
                m.gpu_instance,
                m.compute_instance,
                store.checkpoint_path().display(),
                r.uuid
            ));
        }
    }
}

fn matrix(inventory: &Inventory) -> Vec<Vec<String>> {
    let n = inventory.gpus.len();
    (0..n)
        .map(|a| {
            (0..n)
                .map(|b| {
                    if a == b {
                        "X".to_owned()
                    } else {
                        inventory.topology.get(a, b).label()
                    }
                })
                .collect()
        })
        .collect()
}

/// `[0,1,2,5,7,8]` → `0-2,5,7-8`.
/// The CPUs and memory nodes of a simulated node: the union of its GPUs' local ones (memory
/// node 0 when none is described).
fn simulated_cpus(driver: &GpuDriver, gpus: usize) -> numa::Allowed {
    let mut cpus = numa::CpuList::default();
    let mut mems = numa::CpuList::default();
    for position in 0..gpus {
        let ids =
            |found: Option<&[u32]>| numa::CpuList::from_ids(found.unwrap_or_default().to_vec());
        cpus = cpus.union(&ids(driver.cpu_affinity(position)));
        mems = mems.union(&ids(driver.memory_affinity(position)));
    }
    if mems.is_empty() {
        mems = numa::CpuList::from_ids([0]);
    }
    numa::Allowed { cpus, mems }
}

fn cpu_list(cpus: &[u32]) -> String {
    let mut out = String::new();
    let mut i = 0;
    while i < cpus.len() {
        let start = cpus[i];
        let mut end = start;
        while i + 1 < cpus.len() && cpus[i + 1] == end + 1 {
            i += 1;
            end = cpus[i];
        }
        if !out.is_empty() {
            out.push(',');
        }
        let _ = if start == end {
            write!(out, "{start}")
        } else {
            write!(out, "{start}-{end}")
        };
        i += 1;
    }
    out
}

/// The HEALTH cell: discovery's flag, then the checkpointed health (see the module docs).
fn health_cell(g: &GpuJson) -> String {
    match (&g.health, g.healthy) {
        (_, false) => "LOST".to_owned(),
        (_, true) if g.health_unknown => "unknown".to_owned(),
        (Some(GpuHealth::Unhealthy { reason, .. }), true) => {
            let short = match reason {
                Failure::Xid { xid } => format!("xid-{xid}"),
                Failure::DoubleBitEcc => "ecc-dbe".to_owned(),
                Failure::Lost => "lost".to_owned(),
                Failure::Unwatchable { .. } => "unwatchable".to_owned(),
            };
            format!("UNHEALTHY:{short}")
        }
        (Some(GpuHealth::Healthy) | None, true) => "ok".to_owned(),
    }
}

/// Left-aligned columns separated by two spaces.
fn table(rows: &[Vec<String>]) -> String {
    let cols = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..cols)
        .map(|c| {
            rows.iter()
                .filter_map(|r| r.get(c))
                .map(|s| s.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for row in rows {
        let mut line = String::new();
        for (c, cell) in row.iter().enumerate() {
            let _ = write!(line, "{cell:<w$}  ", w = widths[c]);
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

const LEGEND: &str = "Legend:
  X    = Self
  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)
  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node
  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)
  PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)
  PIX  = Connection traversing at most a single PCIe bridge
  PSB  = On the same board (NVML_TOPOLOGY_INTERNAL, e.g. the two GPUs of a K80)
  NV#  = Connection traversing a bonded set of # NVLinks
  ?    = Unknown
";

fn render(r: &Report) -> String {
    let mut out = String::new();
    if let Some(sim) = &r.simulated {
        let _ = writeln!(out, "Simulated node: {sim}");
    }
    if let Some(d) = &r.driver {
        let cuda = d.cuda_version.as_deref().unwrap_or("unknown");
        let _ = writeln!(out, "NVIDIA driver {}, CUDA {cuda}", d.version);
    }
    if r.gpus.is_empty() {
        let _ = writeln!(
            out,
            "no GPUs: {}",
            r.absent_reason.as_deref().unwrap_or("NVML reports none")
        );
        return out;
    }
    let _ = writeln!(out, "{} GPUs\n", r.gpus.len());
    let unknown = || "?".to_owned();
    let mut rows = vec![
        [
            "IDX",
            "MINOR",
            "NAME",
            "MEMORY",
            "CC",
            "PCI BUS ID",
            "NUMA",
            "HEALTH",
            "DEVICE",
            "UUID",
        ]
        .map(str::to_owned)
        .to_vec(),
    ];
    for g in &r.gpus {
        rows.push(vec![
            g.index.to_string(),
            g.minor.map_or_else(unknown, |m| m.to_string()),
            if g.name.is_empty() {
                unknown()
            } else {
                g.name.clone()
            },
            if g.memory_total_bytes == 0 {
                unknown()
            } else {
                format!("{} MiB", g.memory_total_bytes >> 20)
            },
            g.compute_capability.clone().unwrap_or_else(unknown),
            if g.pci_bus_id.is_empty() {
                unknown()
            } else {
                g.pci_bus_id.clone()
            },
            g.numa_node
                .map_or_else(|| "N/A".to_owned(), |n| n.to_string()),
            health_cell(g),
            g.device.clone().unwrap_or_else(|| "-".to_owned()),
            if g.uuid.is_empty() {
                unknown()
            } else {
                g.uuid.clone()
            },
        ]);
    }
    out.push_str(&table(&rows));
    if !r.control_devices.is_empty() {
        let list: Vec<String> = r
            .control_devices
            .iter()
            .map(|d| format!("{} ({})", d.path, d.device))
            .collect();
        let _ = writeln!(out, "\nControl devices: {}", list.join(", "));
    }
    if !r.mig.is_empty() {
        out.push_str(&render_mig(r));
    }
    let mut rows = vec![Vec::with_capacity(r.gpus.len() + 3)];
    rows[0].push(String::new());
    rows[0].extend(r.gpus.iter().map(|g| format!("GPU{}", g.index)));
    rows[0].extend(["CPU Affinity".to_owned(), "NUMA Affinity".to_owned()]);
    for (g, links) in r.gpus.iter().zip(&r.topology) {
        let mut row = vec![format!("GPU{}", g.index)];
        row.extend(links.iter().cloned());
        row.push(g.cpu_affinity.clone().unwrap_or_else(|| "N/A".to_owned()));
        row.push(
            g.numa_node
                .map_or_else(|| "N/A".to_owned(), |n| n.to_string()),
        );
        rows.push(row);
    }
    let _ = writeln!(out, "\nTopology:");
    out.push_str(&table(&rows));
    out.push('\n');
    out.push_str(LEGEND);
    if r.gpus.iter().any(|g| g.pinned_cpus.is_some()) {
        let _ = writeln!(
            out,
            "\nNUMA pinning (module parameter numa_pinning=on, --numa-pinning) narrows a task to its GPUs' local CPUs and memory nodes:"
        );
        for g in &r.gpus {
            let _ = writeln!(
                out,
                "  GPU{}: CPUs {}, memory nodes {}",
                g.index,
                g.pinned_cpus.as_deref().unwrap_or("unknown (not pinned)"),
                g.pinned_mems.as_deref().unwrap_or("unchanged")
            );
        }
        let _ = writeln!(
            out,
            "  A task with several GPUs gets the union; one asking for more CPUs than that is not pinned."
        );
    }
    for note in &r.notes {
        let _ = writeln!(out, "\nNote: {note}");
    }
    out
}

/// The MIG layout as `nvidia-smi -L` prints it, with each MIG device's GPU/compute instance
/// ids, profile id and the capability device nodes a container needs.
fn render_mig(r: &Report) -> String {
    let mut out = String::new();
    let list = |v: &[u32]| v.iter().map(u32::to_string).collect::<Vec<_>>().join(", ");
    let _ = writeln!(
        out,
        "\nMIG: GPU {} in MIG mode (never given whole; their MIG devices are the units), nvidia-caps major {}",
        list(&r.mig.enabled),
        r.mig
            .caps_major
            .map_or_else(|| "unknown".to_owned(), |m| m.to_string())
    );
    for g in r.gpus.iter().filter(|g| r.mig.is_enabled(g.index)) {
        let _ = writeln!(out, "GPU {}: {} (UUID: {})", g.index, g.name, g.uuid);
        for d in r.mig.of_parent(g.index) {
            let _ = writeln!(
                out,
                "  MIG {:<12}Device {:>2}: (UUID: {})",
                d.profile_name, d.index, d.uuid
            );
            let caps = d.caps.as_ref().map_or_else(
                || "caps unknown: cannot be isolated".to_owned(),
                |c| {
                    format!(
                        "caps /dev/nvidia-caps/nvidia-cap{} ({}), /dev/nvidia-caps/nvidia-cap{} ({})",
                        c.gpu_instance.minor, c.gpu_instance, c.compute_instance.minor, c.compute_instance
                    )
                },
            );
            let _ = writeln!(
                out,
                "      GI {} CI {}, profile {}, {} SMs, {} MiB, {caps}{}",
                d.gpu_instance,
                d.compute_instance,
                d.profile.map_or_else(|| "?".to_owned(), |p| p.to_string()),
                d.multiprocessors,
                d.memory_total >> 20,
                if d.healthy { "" } else { ", LOST" }
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_are_ranges() {
        assert_eq!(cpu_list(&[0, 1, 2, 5, 7, 8]), "0-2,5,7-8");
        assert_eq!(cpu_list(&[3]), "3");
        assert_eq!(cpu_list(&[]), "");
    }

    #[test]
    fn tables_align() {
        let rows = vec![
            vec!["a".to_owned(), "bb".to_owned()],
            vec!["ccc".to_owned(), "d".to_owned()],
        ];
        assert_eq!(table(&rows), "a    bb\nccc  d\n");
    }
}
