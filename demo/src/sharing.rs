//! `mesos-gpu demo --gpu-replicas SPEC`: the stream replayed on a node that shares GPUs.
//!
//! Every decision is the isolator's own: the node's split ([`SharingPlan`]), which requests are
//! shares ([`SharingPlan::takes_as_share`]), where a share goes ([`ShareBook::place`], packed),
//! whole GPUs for the rest and for shares no shared GPU has room for (the allocator over the
//! whole GPUs, as the lifecycle does), each owner's limits ([`ShareLimits`]) and what it is
//! launched with (its device rules from its [`Grant`], [`PlacedShare::env`] and, under `mps`,
//! [`client_env`] with the daemon's pipe directory). DOCKER apps are refused: Mesos's Docker
//! containerizer cannot run on an agent that offers shares (see the operator guide). The same stream on the same node without sharing is counted for
//! comparison. Nothing is started: no cgroup, no MPS daemon.

use std::collections::BTreeMap;

use mesos_gpu_enforce::cgroup::default_whitelist;
use mesos_gpu_enforce::mps::MpsConfig;
use mesos_gpu_grant::{Grant, ShareAccess};
use mesos_gpu_isolator::lifecycle::ContainerId;
use mesos_gpu_node::devices::DeviceNodes;
use mesos_gpu_node::{inventory::Gpu, inventory::Inventory};
use mesos_gpu_placement::{allocator::Allocator, allocator::Policy};
use mesos_gpu_placement::{
    sharing::Placement, sharing::ShareBook, sharing::SharingMode, sharing::SharingPlan,
    sharing::Wanted,
};
use serde::Serialize;

use crate::agent::simulated_nodes;
use crate::error::DemoError;
use crate::stream::{ContainerType, Stream};
use crate::whole;

/// k of R units of one GPU, as a task got them.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "outcome", rename = "share")]
pub(crate) struct Share {
    /// The GPU's NVML index.
    gpu: u32,
    /// Units held.
    units: u32,
    /// The GPU's replica count.
    replicas: u32,
    /// Its device rules beyond the base whitelist.
    device_rules: Vec<String>,
    /// What it is told (`MESOS_GPU_SHARE`, and under mps its limits and pipe directory).
    environment: Vec<String>,
}

/// What one task got: a share, whole GPUs (more units than a GPU holds, or no shared GPU had
/// room), or a refusal.
type Got = whole::Got<Share>;

/// The sharing scenario's report: what each task of the stream got on a node that shares GPUs,
/// against the same node without sharing; `--json` prints it.
#[derive(Debug, Clone, Serialize)]
pub struct SharingReport {
    /// The shared GPUs' modes: `time-slicing`, `mps`, or both joined with `+`.
    mode: String,
    /// Shared GPUs: (index, replicas).
    shared: Vec<(u32, u32)>,
    /// GPUs kept whole.
    whole: Vec<u32>,
    /// `gpus` units the agent offers.
    units: u32,
    /// Tasks in arrival order.
    tasks: Vec<whole::Task<Share>>,
    /// Most units held at once, shares and whole GPUs together.
    peak_units: u32,
    /// Tasks refused with sharing.
    refused: u32,
    /// Tasks refused by the same node without sharing (whole GPUs only).
    refused_without_sharing: u32,
}

/// Replays `stream` on `inventory` split by `plan`, MPS pipe directories as `mps` names them.
pub fn run_sharing(
    stream: &Stream,
    inventory: &Inventory,
    plan: &SharingPlan,
    policy: Policy,
    mps: &MpsConfig,
) -> Result<SharingReport, DemoError> {
    let mut book = ShareBook::new(plan);
    let mut whole = Allocator::with_devices(inventory, &plan.whole, policy)
        .map_err(|source| DemoError::WholeGpus { source })?;
    let mut plain = Allocator::new(inventory, policy)?;
    let nodes = simulated_nodes(std::path::Path::new("/dev"), inventory);
    let base = default_whitelist();
    // (end, id, units held) of running tasks; units for the peak.
    let mut running: Vec<(u64, String, u32)> = Vec::new();
    let mut plain_running: Vec<(u64, String)> = Vec::new();
    let mut report = SharingReport {
        mode: plan
            .modes()
            .iter()
            .map(|m| m.as_str())
            .collect::<Vec<_>>()
            .join("+"),
        shared: plan.shared.iter().map(|g| (g.index, g.replicas)).collect(),
        whole: plan.whole.clone(),
        units: plan.units(),
        tasks: Vec::new(),
        peak_units: 0,
        refused: 0,
        refused_without_sharing: 0,
    };
    let mut seq = 0u32;
    for (arrival, app) in &stream.arrivals {
        running.retain(|(end, id, _)| {
            let over = *end <= arrival.at;
            if over {
                book.release(id);
                whole.release_all(id);
            }
            !over
        });
        plain_running.retain(|(end, id)| {
            let over = *end <= arrival.at;
            if over {
                plain.release_all(id);
            }
            !over
        });
        for _ in 0..app.instances {
            seq += 1;
            let id = app.task_id(seq)?;
            let end = arrival.at + arrival.runs_for;
            if plain
                .request(app.gpus)
                .and_then(|r| plain.allocate(id.as_str(), r.count()))
                .is_ok()
            {
                plain_running.push((end, id.to_string()));
            } else {
                report.refused_without_sharing += 1;
            }
            let got = serve(
                &mut book,
                &mut whole,
                plan,
                inventory,
                &nodes,
                &base,
                mps,
                &id,
                app.gpus,
                app.container_type(),
            );
            match &got {
                Got::Unit(share) => running.push((end, id.to_string(), share.units)),
                Got::Whole { gpus, .. } => {
                    // A whole GPU is as many units as the GPU would have as a share: one.
                    running.push((end, id.to_string(), u32::try_from(gpus.len()).unwrap_or(0)));
                }
                Got::Refused { .. } => report.refused += 1,
            }
            let held: u32 = running.iter().map(|(_, _, u)| u).sum();
            report.peak_units = report.peak_units.max(held);
            report.tasks.push(whole::Task {
                task: id.to_string(),
                container: Some(app.container_type()),
                arrival: arrival.at,
                requested: app.gpus,
                got,
            });
        }
    }
    Ok(report)
}

/// One request, decided as the lifecycle decides it.
#[allow(clippy::too_many_arguments)]
fn serve(
    book: &mut ShareBook,
    whole: &mut Allocator,
    plan: &SharingPlan,
    inventory: &Inventory,
    nodes: &DeviceNodes,
    base: &[mesos_gpu_enforce::cgroup::DeviceRule],
    mps: &MpsConfig,
    id: &ContainerId,
    gpus: f64,
    kind: ContainerType,
) -> Got {
    let units = match whole::units(gpus, plan.units()) {
        Ok(units) => units,
        Err(error) => return Got::Refused { error },
    };
    if kind == ContainerType::Docker {
        return Got::Refused {
            error: "an agent that offers shares runs --containerizers=mesos only (Mesos's Docker containerizer cannot start with more gpus than GPUs)".to_owned(),
        };
    }
    let mut why_whole = format!(
        "{units} units: more than one shared GPU holds (at most {})",
        plan.largest()
    );
    if plan.takes_as_share(units) {
        match book.place(id.as_str(), units, Placement::Pack, Wanted::Any) {
            Ok(grant) => {
                let gpu: Vec<Gpu> = inventory
                    .by_index(grant.index)
                    .cloned()
                    .into_iter()
                    .collect();
                let pipe = (grant.mode == SharingMode::Mps).then(|| mps.pipe_dir(&grant.uuid));
                let access = ShareAccess::new(grant.clone(), pipe);
                let (device_rules, environment) =
                    match Grant::new(nodes, base, gpu, vec![], Some(access)) {
                        Ok(grant) => (
                            grant
                                .rules()
                                .iter()
                                .filter(|r| !base.contains(r))
                                .map(ToString::to_string)
                                .collect(),
                            grant.env(),
                        ),
                        Err(e) => (vec![format!("(no grant: {e})")], Vec::new()),
                    };
                return Got::Unit(Share {
                    gpu: grant.index,
                    units: grant.units,
                    replicas: grant.replicas,
                    device_rules,
                    environment: environment
                        .into_iter()
                        .map(|(k, v)| format!("{k}={v}"))
                        .collect(),
                });
            }
            Err(e) => why_whole = e.to_string(),
        }
    }
    Got::whole(whole, id.as_str(), units, why_whole)
}

impl SharingReport {
    /// The report as text, `node` the node's name.
    pub fn text(&self, node: &str) -> String {
        text(self, node)
    }
}

fn text(report: &SharingReport, node: &str) -> String {
    let mut out = String::new();
    let shared: Vec<String> = report
        .shared
        .iter()
        .map(|(i, r)| format!("{i}×{r}"))
        .collect();
    out.push_str(&format!(
        "GPU sharing on {node} ({}): shared GPUs {} (index×replicas), whole GPUs {:?}; the agent offers gpus:{}\n\n",
        report.mode,
        shared.join(" "),
        report.whole,
        report.units
    ));
    out.push_str(&format!(
        "{:>6}  {:<28} {:<6} {:>5}  got\n",
        "t(s)", "task", "type", "asks"
    ));
    for t in &report.tasks {
        let got = t.got.text(|share| {
            let Share {
                gpu,
                units,
                replicas,
                environment,
                ..
            } = share;
            let limit = |key: &str| {
                environment
                    .iter()
                    .find_map(|e| e.strip_prefix(key))
                    .map(str::to_owned)
            };
            match (
                limit("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE="),
                limit("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0="),
            ) {
                (Some(threads), Some(memory)) => {
                    format!("share {units}/{replicas} of GPU {gpu}, MPS {threads}% {memory}")
                }
                _ => format!("share {units}/{replicas} of GPU {gpu}"),
            }
        });
        out.push_str(&format!(
            "{:>6}  {:<28} {:<6} {:>5}  {got}\n",
            t.arrival,
            t.task,
            t.container
                .map_or_else(String::new, |c| format!("{c:?}").to_uppercase()),
            t.requested
        ));
    }
    let by_gpu: BTreeMap<u32, u32> = report
        .tasks
        .iter()
        .filter_map(|t| match t.got {
            Got::Unit(Share { gpu, .. }) => Some(gpu),
            _ => None,
        })
        .fold(BTreeMap::new(), |mut m, g| {
            *m.entry(g).or_default() += 1;
            m
        });
    out.push_str(
        "\nEach owner's device cgroup allows its GPU's node only (--json shows the rules and the environment).\n",
    );
    out.push_str(&format!(
        "{} tasks: {} as shares (placed per GPU: {by_gpu:?}), {} on whole GPUs, {} refused; at most {} of {} units held at once.\nThe same stream without sharing: {} refused.\n",
        report.tasks.len(),
        by_gpu.values().sum::<u32>(),
        report
            .tasks
            .iter()
            .filter(|t| matches!(t.got, Got::Whole { .. }))
            .count(),
        report.refused,
        report.peak_units,
        report.units,
        report.refused_without_sharing
    ));
    out
}
