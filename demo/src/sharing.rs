//! `mesos-gpu demo --gpu-replicas SPEC`: the stream replayed on a node that shares GPUs.
//!
//! Every decision is the isolator's: each task is prepared by an isolator that acts on nothing
//! (`IsolatorConfig::dry_run`) with the node's pool and sharing configuration, as the module
//! would prepare it — which requests are shares, where a share goes (packed), whole GPUs for the
//! rest and for shares no shared GPU has room for, each owner's limits — and the report shows
//! its launch info (device rules and variables; under `mps` the pipe directory its daemon would
//! have). DOCKER apps are refused: Mesos's Docker containerizer cannot run on an agent that
//! offers shares (see the operator guide). The same stream on the same node without sharing is
//! counted for comparison. Nothing is started: no cgroup, no MPS daemon.

use std::collections::BTreeMap;
use std::path::Path;

use mesos_gpu_enforce::cgroup::default_whitelist;
use mesos_gpu_grant::env;
use mesos_gpu_isolator::lifecycle::{
    ContainerId, Isolator, IsolatorConfig, PoolConfig, PoolRole, PrepareConfig, SharingConfig,
};
use mesos_gpu_node::inventory::Inventory;
use mesos_gpu_os::chain::error_chain;
use mesos_gpu_placement::sharing::SharingPlan;
use mesos_gpu_placement::{allocator::Allocator, allocator::Policy};
use serde::Serialize;

use crate::agent::dry_isolator;
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

/// Replays `stream` on `inventory` shared as `sharing` says (`plan` its resolved split), each
/// task asking a dry isolator (checkpointing, with its pool, under `work`) as the module would.
pub fn run_sharing(
    stream: &Stream,
    inventory: &Inventory,
    sharing: &SharingConfig,
    plan: &SharingPlan,
    policy: Policy,
    work: &Path,
) -> Result<SharingReport, DemoError> {
    let mut config = IsolatorConfig::new(work.join("work"));
    config.policy = policy;
    config.pool = Some(PoolConfig {
        dir: work.join("pool"),
        role: PoolRole::Agent,
    });
    config.sharing = Some(sharing.clone());
    let isolator = dry_isolator(config, inventory)?;
    let mut plain = Allocator::new(inventory, policy)?;
    let base = default_whitelist();
    // (end, id, units held) of running tasks; units for the peak.
    let mut running: Vec<(u64, ContainerId, u32)> = Vec::new();
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
        let (over, on): (Vec<_>, Vec<_>) = running
            .drain(..)
            .partition(|(end, _, _)| *end <= arrival.at);
        running = on;
        for (_, id, _) in over {
            isolator.cleanup(&id)?;
        }
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
            let got = serve(&isolator, plan, &base, &id, app.gpus, app.container_type())?;
            match &got {
                Got::Unit(share) => running.push((end, id.clone(), share.units)),
                Got::Whole { gpus, .. } => {
                    // A whole GPU is as many units as the GPU would have as a share: one.
                    running.push((end, id.clone(), u32::try_from(gpus.len()).unwrap_or(0)));
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

/// One request, prepared by the dry `isolator` as the module would prepare it.
fn serve(
    isolator: &Isolator,
    plan: &SharingPlan,
    base: &[mesos_gpu_enforce::cgroup::DeviceRule],
    id: &ContainerId,
    gpus: f64,
    kind: ContainerType,
) -> Result<Got, DemoError> {
    if kind == ContainerType::Docker {
        return Ok(Got::Refused {
            error: "an agent that offers shares runs --containerizers=mesos only (Mesos's Docker containerizer cannot start with more gpus than GPUs)".to_owned(),
        });
    }
    let asked = PrepareConfig {
        gpus,
        ..PrepareConfig::default()
    };
    let info = match isolator.prepare(id, asked) {
        Ok(info) => info,
        Err(e) => {
            return Ok(Got::Refused {
                error: error_chain(&e),
            });
        }
    };
    let Some(share) = isolator.status(id)?.share else {
        let why = if gpus > f64::from(plan.largest()) {
            format!(
                "{gpus} units: more than one shared GPU holds (at most {})",
                plan.largest()
            )
        } else {
            let s = if gpus == 1.0 { "" } else { "s" };
            format!("no shared GPU has room for {gpus} unit{s}")
        };
        return Ok(Got::Whole {
            gpus: info.gpus.iter().map(|g| g.index).collect(),
            why,
        });
    };
    let (device_rules, environment) = whole::launched(&info, base);
    Ok(Got::Unit(Share {
        gpu: share.index,
        units: share.units,
        replicas: share.replicas,
        device_rules,
        environment,
    }))
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
            let limit = |key: String| {
                environment
                    .iter()
                    .find_map(|e| e.strip_prefix(&key))
                    .map(str::to_owned)
            };
            match (
                limit(format!("{}=", env::CUDA_MPS_ACTIVE_THREAD_PERCENTAGE)),
                limit(format!("{}=0=", env::CUDA_MPS_PINNED_DEVICE_MEM_LIMIT)),
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
