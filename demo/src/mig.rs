//! `mesos-gpu demo` on a node with GPUs in MIG mode (`--simulate dgx-a100-mig`,
//! `dgx-a100-mixed`): the stream replayed with the single strategy, as the module serves it.
//!
//! Every decision is the isolator's: each task is prepared by an isolator that acts on nothing
//! (`IsolatorConfig::dry_run`) with the single strategy, as the module would prepare it — a
//! `gpus:k` request takes k MIG devices (one per task unless allowed), else k whole GPUs, else it
//! is refused with both reasons — and the report shows its launch info: the MIG owner's device
//! rules (its parent and its two capability nodes) and variables. The same stream on the same
//! GPUs without MIG (every GPU whole) is counted for comparison. Nothing is started.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use mesos_gpu_enforce::cgroup::default_whitelist;
use mesos_gpu_isolator::agent_flags::MigStrategy;
use mesos_gpu_isolator::lifecycle::{
    ContainerId, IsolatorConfig, LaunchInfo, MigConfig, PrepareConfig,
};
use mesos_gpu_node::inventory::Inventory;
use mesos_gpu_os::chain::error_chain;
use mesos_gpu_placement::{allocator::Allocator, allocator::Policy};
use serde::Serialize;

use crate::agent::dry_isolator;
use crate::error::DemoError;
use crate::stream::Stream;
use crate::whole;

/// One MIG device, as a task got it.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "outcome", rename = "mig")]
pub(crate) struct MigDevice {
    /// Its `MIG-…` UUID.
    uuid: String,
    /// Its GPU instance profile, as the driver names it.
    profile: String,
    /// The parent GPU's NVML index.
    parent: u32,
    /// Its device rules beyond the base whitelist.
    device_rules: Vec<String>,
    /// `NVIDIA_VISIBLE_DEVICES` and `CUDA_VISIBLE_DEVICES`.
    environment: Vec<String>,
}

/// What one task got: a MIG device, whole GPUs (not in MIG mode), or a refusal.
type Got = whole::Got<MigDevice>;

/// The MIG scenario's report: what each task of the stream got on a node with GPUs in MIG
/// mode (single strategy), against the same GPUs without MIG; `--json` prints it.
#[derive(Debug, Clone, Serialize)]
pub struct MigReport {
    /// GPUs in MIG mode.
    mig_gpus: Vec<u32>,
    /// MIG devices by profile name.
    devices: BTreeMap<String, u32>,
    /// `gpus` units the agent offers (single strategy): MIG devices and whole GPUs.
    units: u32,
    /// Tasks in arrival order.
    tasks: Vec<whole::Task<MigDevice>>,
    /// Tasks refused.
    refused: u32,
    /// Tasks refused by the same GPUs without MIG (every GPU whole).
    refused_without_mig: u32,
}

/// Replays `stream` on `inventory` with the single strategy, each task asking a dry isolator
/// (checkpointing under `work`) as the module would; capability nodes are named under `/dev`,
/// the driver's files under `proc_root`.
pub fn run_mig(
    stream: &Stream,
    inventory: &Inventory,
    policy: Policy,
    proc_root: &Path,
    work: &Path,
) -> Result<MigReport, DemoError> {
    let mut config = IsolatorConfig::new(work);
    config.policy = policy;
    config.mig = MigConfig {
        strategy: MigStrategy::Single,
        dev_root: PathBuf::from("/dev"),
        proc_root: proc_root.to_owned(),
        ..MigConfig::default()
    };
    let isolator = dry_isolator(config, inventory)?;
    let whole_gpus = inventory.whole_gpus().count();
    let mut plain_inventory = inventory.clone();
    plain_inventory.mig = Default::default();
    let mut plain = Allocator::new(&plain_inventory, policy)?;
    let base = default_whitelist();
    let mut running: Vec<(u64, ContainerId)> = Vec::new();
    let mut devices: BTreeMap<String, u32> = BTreeMap::new();
    for d in &inventory.mig.devices {
        *devices.entry(d.profile_name.clone()).or_default() += 1;
    }
    let mut report = MigReport {
        mig_gpus: inventory.mig.enabled.clone(),
        units: u32::try_from(inventory.mig.devices.len() + whole_gpus).unwrap_or(0),
        devices,
        tasks: Vec::new(),
        refused: 0,
        refused_without_mig: 0,
    };
    let mut seq = 0u32;
    for (arrival, app) in &stream.arrivals {
        let (over, on): (Vec<_>, Vec<_>) =
            running.drain(..).partition(|(end, _)| *end <= arrival.at);
        running = on;
        for (_, id) in over {
            isolator.cleanup(&id)?;
            plain.release_all(id.as_str());
        }
        for _ in 0..app.instances {
            seq += 1;
            let id = app.task_id(seq)?;
            if plain
                .request(app.gpus)
                .and_then(|r| plain.allocate(id.as_str(), r.count()))
                .is_err()
            {
                report.refused_without_mig += 1;
            }
            let asked = PrepareConfig {
                gpus: app.gpus,
                ..PrepareConfig::default()
            };
            let got = match isolator.prepare(&id, asked) {
                Ok(info) => got(&info, inventory, &base, app.gpus),
                Err(e) => Got::Refused {
                    error: error_chain(&e),
                },
            };
            match &got {
                Got::Refused { .. } => report.refused += 1,
                _ => running.push((arrival.at + arrival.runs_for, id.clone())),
            }
            report.tasks.push(whole::Task {
                task: id.to_string(),
                container: None,
                arrival: arrival.at,
                requested: app.gpus,
                got,
            });
        }
    }
    Ok(report)
}

/// What the isolator's launch info `info` gives a task that asked for `gpus`: its MIG device,
/// or whole GPUs (a task holds one MIG device; more asked, or none free, take whole GPUs).
fn got(
    info: &LaunchInfo,
    inventory: &Inventory,
    base: &[mesos_gpu_enforce::cgroup::DeviceRule],
    gpus: f64,
) -> Got {
    let Some(device) = info.mig.first().and_then(|u| inventory.mig.by_uuid(u)) else {
        let why = if gpus > 1.0 {
            "a task holds one MIG device"
        } else {
            "no MIG device free"
        };
        return Got::Whole {
            gpus: info.gpus.iter().map(|g| g.index).collect(),
            why: why.to_owned(),
        };
    };
    let (device_rules, environment) = whole::launched(info, base);
    Got::Unit(MigDevice {
        uuid: device.uuid.clone(),
        profile: device.profile_name.clone(),
        parent: device.parent,
        device_rules,
        environment,
    })
}

impl MigReport {
    /// The report as text, `node` the node's name.
    pub fn text(&self, node: &str) -> String {
        text(self, node)
    }
}

fn text(report: &MigReport, node: &str) -> String {
    let mut out = format!(
        "MIG on {node} (single strategy): GPUs {:?} in MIG mode with {} MIG devices {:?}; the agent offers gpus:{}\n\n",
        report.mig_gpus,
        report.devices.values().sum::<u32>(),
        report.devices,
        report.units
    );
    out.push_str(&format!(
        "{:>6}  {:<28} {:>5}  got\n",
        "t(s)", "task", "asks"
    ));
    for t in &report.tasks {
        let got = t.got.text(|d| {
            format!(
                "MIG {} on GPU {} ({}) [{}]",
                d.profile,
                d.parent,
                d.uuid.get(..13).unwrap_or(&d.uuid),
                d.device_rules.join(", ")
            )
        });
        out.push_str(&format!(
            "{:>6}  {:<28} {:>5}  {got}\n",
            t.arrival, t.task, t.requested
        ));
    }
    let on_mig = report
        .tasks
        .iter()
        .filter(|t| matches!(t.got, Got::Unit(_)))
        .count();
    out.push_str(&format!(
        "\n{} tasks: {on_mig} on MIG devices, {} on whole GPUs, {} refused. The same GPUs without MIG: {} refused.\n",
        report.tasks.len(),
        report
            .tasks
            .iter()
            .filter(|t| matches!(t.got, Got::Whole { .. }))
            .count(),
        report.refused,
        report.refused_without_mig
    ));
    out
}
