//! `mesos-gpu demo` on a node with GPUs in MIG mode (`--simulate dgx-a100-mig`,
//! `dgx-a100-mixed`): the stream replayed with the single strategy, as the module serves it.
//!
//! Every decision is the isolator's own pieces: a `gpus:k` request takes k MIG devices
//! ([`MigUnits::allocate`], one per task unless allowed) and else k whole GPUs (the allocator over
//! the GPUs not in MIG mode), else it is refused with both reasons; a MIG owner's device rules
//! (its parent and its two capability nodes) and its variables are those of its grant
//! ([`mesos_gpu_grant::Grant`]), as every renderer reads them. The same stream on the same
//! GPUs without MIG (every GPU whole) is counted for comparison. Nothing is started.

use std::collections::BTreeMap;
use std::path::Path;

use mesos_gpu_enforce::cgroup::default_whitelist;
use mesos_gpu_grant::{Grant, mig::MigAccess};
use mesos_gpu_isolator::lifecycle::ContainerId;
use mesos_gpu_node::devices::DeviceNodes;
use mesos_gpu_node::inventory::Inventory;
use mesos_gpu_placement::mig::MigUnits;
use mesos_gpu_placement::{allocator::Allocator, allocator::Policy};
use serde::Serialize;

use crate::agent::simulated_nodes;
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

/// Replays `stream` on `inventory` with the single strategy; capability nodes are named under
/// `/dev`, the driver's files under `proc_root`.
pub fn run_mig(
    stream: &Stream,
    inventory: &Inventory,
    policy: Policy,
    proc_root: &Path,
) -> Result<MigReport, DemoError> {
    let mut units = MigUnits::new(&inventory.mig, false);
    let whole_indices: Vec<u32> = inventory.whole_gpus().map(|g| g.index).collect();
    let mut whole = Allocator::with_devices(inventory, &whole_indices, policy)?;
    let mut plain_inventory = inventory.clone();
    plain_inventory.mig = Default::default();
    let mut plain = Allocator::new(&plain_inventory, policy)?;
    let nodes = simulated_nodes(Path::new("/dev"), inventory);
    let base = default_whitelist();
    let mut running: Vec<(u64, String)> = Vec::new();
    let mut devices: BTreeMap<String, u32> = BTreeMap::new();
    for d in &inventory.mig.devices {
        *devices.entry(d.profile_name.clone()).or_default() += 1;
    }
    let mut report = MigReport {
        mig_gpus: inventory.mig.enabled.clone(),
        units: u32::try_from(inventory.mig.devices.len() + whole_indices.len()).unwrap_or(0),
        devices,
        tasks: Vec::new(),
        refused: 0,
        refused_without_mig: 0,
    };
    let mut seq = 0u32;
    for (arrival, app) in &stream.arrivals {
        running.retain(|(end, id)| {
            let over = *end <= arrival.at;
            if over {
                units.release(id);
                whole.release_all(id);
                plain.release_all(id);
            }
            !over
        });
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
            let got = serve(
                &mut units,
                &mut whole,
                inventory,
                &nodes,
                &base,
                proc_root,
                &id,
                app.gpus,
                report.units,
            );
            match &got {
                Got::Refused { .. } => report.refused += 1,
                _ => running.push((arrival.at + arrival.runs_for, id.to_string())),
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

/// One `gpus` request, decided as the module's single strategy decides it.
#[allow(clippy::too_many_arguments)]
fn serve(
    units: &mut MigUnits,
    whole: &mut Allocator,
    inventory: &Inventory,
    nodes: &DeviceNodes,
    base: &[mesos_gpu_enforce::cgroup::DeviceRule],
    proc_root: &Path,
    id: &ContainerId,
    gpus: f64,
    offered: u32,
) -> Got {
    let k = match whole::units(gpus, offered) {
        Ok(k) => k,
        Err(error) => return Got::Refused { error },
    };
    let mig_error = match units.allocate(id.as_str(), k, None) {
        Ok(uuids) => {
            let device = uuids
                .first()
                .and_then(|u| inventory.mig.by_uuid(u))
                .and_then(|d| {
                    let access = MigAccess::of(d, Path::new("/dev"), proc_root).ok()?;
                    Some((d, Grant::new(nodes, base, vec![], vec![access], None).ok()?))
                });
            if let Some((d, grant)) = device {
                return Got::Unit(MigDevice {
                    uuid: d.uuid.clone(),
                    profile: d.profile_name.clone(),
                    parent: d.parent,
                    device_rules: grant
                        .rules()
                        .iter()
                        .filter(|r| !base.contains(r))
                        .map(ToString::to_string)
                        .collect(),
                    environment: grant
                        .env()
                        .into_iter()
                        .map(|(k, v)| format!("{k}={v}"))
                        .collect(),
                });
            }
            units.release(id.as_str());
            "its MIG device cannot be isolated".to_owned()
        }
        Err(e) => e.to_string(),
    };
    Got::whole(whole, id.as_str(), k, mig_error)
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
