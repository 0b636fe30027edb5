//! The simulated agent: arrivals and finishes in simulated time, each decided by the real
//! allocator, launched through an [`Agent`] (the real launch-info and Docker argument builders,
//! or the live isolator), and compared with what first-fit would have chosen from the same free
//! GPUs.
//!
//! Ordering rules: events are processed by simulated second; at the same second finishes come
//! before arrivals (a GPU freed at t can be granted at t), and arrivals keep stream order. A
//! refused task is not retried: on a real cluster Marathon would wait for a larger offer.

use std::collections::BTreeMap;

use mesos_gpu_docker::args::{ImageInfo, LaunchPlan};
use mesos_gpu_grant::MountKind;
use mesos_gpu_isolator::{lifecycle::ContainerId, lifecycle::LaunchInfo, lifecycle::PrepareConfig};
use mesos_gpu_node::{inventory::Gpu, inventory::Inventory, inventory::Link};
use mesos_gpu_placement::{
    allocator::AllocError, allocator::Allocator, allocator::Counters, allocator::GpuSet,
    allocator::Policy,
};
use serde::Serialize;

use crate::error::DemoError;
use crate::stream::{ContainerType, MarathonApp, Stream};

/// Where a MESOS container's image root filesystem is taken to be (only named, never created).
const ROOTFS_BASE: &str = "/var/lib/mesos/provisioner/rootfs";

/// What the image of an app is taken to declare. Images are not pulled in a dry run; the
/// `nvidia/cuda` images set these variables (and so ask for the driver volume), others none.
pub(crate) fn image_info(image: Option<&str>) -> ImageInfo {
    match image {
        Some(name) if name.starts_with("nvidia/cuda") => ImageInfo {
            labels: BTreeMap::new(),
            env: vec![
                "PATH=/usr/local/nvidia/bin:/usr/local/cuda/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".to_owned(),
                "LD_LIBRARY_PATH=/usr/local/nvidia/lib:/usr/local/nvidia/lib64".to_owned(),
                "NVIDIA_VISIBLE_DEVICES=all".to_owned(),
                "NVIDIA_DRIVER_CAPABILITIES=compute,utility".to_owned(),
            ],
        },
        _ => ImageInfo::default(),
    }
}

/// Where the containers go: a plan of what would be done, or the live isolator.
pub(crate) trait Agent {
    /// Launch details of a MESOS container granted `gpus`.
    fn launch_mesos(
        &mut self,
        id: &ContainerId,
        config: PrepareConfig,
        gpus: &[Gpu],
    ) -> Result<LaunchInfo, DemoError>;
    /// `docker run` plan of a DOCKER container granted `gpus`.
    fn launch_docker(
        &mut self,
        id: &ContainerId,
        requested: f64,
        gpus: &[Gpu],
        image: &ImageInfo,
    ) -> Result<LaunchPlan, DemoError>;
    /// The container has finished.
    fn finish(&mut self, id: &ContainerId, kind: ContainerType) -> Result<(), DemoError>;
}

/// A set of GPUs with its score.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub(crate) struct Choice {
    /// NVML indices.
    pub(crate) gpus: Vec<u32>,
    /// Sum of pair scores.
    pub(crate) score: u64,
    /// Pair links, e.g. `["2xNV2", "4xNV1"]`.
    pub(crate) links: Vec<String>,
}

/// A bind mount, as reported.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct MountReport {
    /// Host path.
    pub(crate) source: String,
    /// Target path on the host (inside the rootfs).
    pub(crate) target: String,
    /// Read-only.
    pub(crate) read_only: bool,
    /// `device` or `driver_volume`.
    pub(crate) kind: &'static str,
}

/// How a granted container is launched.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "containerizer", rename_all = "snake_case")]
pub(crate) enum Launch {
    /// Unified containerizer: our isolator's device cgroup and mounts.
    Mesos {
        /// Cgroup directory.
        cgroup: Option<String>,
        /// The full allow list.
        device_rules: Vec<String>,
        /// How many of them are the base whitelist (not GPU-related).
        base_rules: usize,
        /// Bind mounts into the rootfs.
        mounts: Vec<MountReport>,
        /// Environment set for the task.
        environment: Vec<String>,
    },
    /// Docker containerizer: `docker run` arguments from the Docker bridge.
    Docker {
        /// The arguments, in order.
        docker_args: Vec<String>,
    },
}

/// What happened to one task.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub(crate) enum Outcome {
    /// Granted and launched.
    Granted {
        /// Timeline label.
        label: char,
        /// The chosen set.
        chosen: Choice,
        /// What first-fit would have picked from the same free GPUs.
        first_fit: Choice,
        /// Device minors of the chosen GPUs.
        minors: Vec<u32>,
        /// Simulated second it finishes.
        ends: u64,
        /// Free GPUs right after.
        free_after: u32,
        /// Largest all-NVLink set among them.
        nvlink_set_after: u32,
        /// Launch details.
        launch: Box<Launch>,
    },
    /// Refused by the allocator.
    Refused {
        /// `bad_request`, `not_enough`, …
        reason: &'static str,
        /// The allocator's message.
        error: String,
    },
}

/// One task (one instance of an app).
#[derive(Debug, Clone, Serialize)]
pub(crate) struct TaskReport {
    /// Container id used for the task.
    pub(crate) task: String,
    /// Marathon app id.
    pub(crate) app: String,
    /// `MESOS` or `DOCKER`.
    pub(crate) container: ContainerType,
    /// Image, when any.
    pub(crate) image: Option<String>,
    /// Arrival, simulated seconds.
    pub(crate) arrival: u64,
    /// Run time, simulated seconds.
    pub(crate) runs_for: u64,
    /// The `gpus` value asked for.
    pub(crate) requested: f64,
    /// What happened.
    #[serde(flatten)]
    pub(crate) outcome: Outcome,
}

/// The node's state after an event.
#[derive(Debug, Clone, Copy, Serialize)]
pub(crate) struct Sample {
    /// Simulated second.
    pub(crate) at: u64,
    /// Free GPUs.
    pub(crate) free: u32,
    /// Largest all-NVLink set among the free GPUs.
    pub(crate) nvlink_set: u32,
}

/// Topology against first-fit, over every grant.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub(crate) struct Comparison {
    /// Grants of two or more GPUs (where a score means something).
    pub(crate) multi_gpu_grants: u32,
    /// Sum of the chosen sets' scores.
    pub(crate) chosen_score: u64,
    /// Sum of first-fit's scores for the same requests.
    pub(crate) first_fit_score: u64,
    /// Grants where the chosen set scores higher.
    pub(crate) better: u32,
    /// Grants where both score the same.
    pub(crate) same: u32,
    /// Grants where first-fit would have scored higher.
    pub(crate) worse: u32,
}

/// Everything one run produced.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct RunReport {
    /// Policy used.
    pub(crate) policy: String,
    /// Tasks in arrival order.
    pub(crate) tasks: Vec<TaskReport>,
    /// State after each event.
    pub(crate) samples: Vec<Sample>,
    /// Last simulated second.
    pub(crate) end: u64,
    /// Busy GPU-seconds.
    pub(crate) busy_gpu_seconds: u64,
    /// The allocator's counters at the end.
    pub(crate) counters: Counters,
    /// Per-grant comparison with first-fit.
    pub(crate) comparison: Comparison,
}

struct Running {
    ends: u64,
    id: ContainerId,
    kind: ContainerType,
}

/// The allocators of a run and the tasks running on them.
struct Node {
    /// The allocator with the run's policy.
    alloc: Allocator,
    /// First-fit, holding the same sets, for the comparison.
    shadow: Allocator,
    running: Vec<Running>,
}

/// Runs `stream` on `inventory` with `policy`, launching through `agent`; `progress` is told
/// each arrival handled.
pub(crate) fn run(
    stream: &Stream,
    inventory: &Inventory,
    policy: Policy,
    agent: &mut dyn Agent,
    progress: &mut dyn FnMut(usize, u64),
) -> Result<RunReport, DemoError> {
    let mut node = Node {
        alloc: Allocator::new(inventory, policy)?,
        shadow: Allocator::new(inventory, Policy::FirstFit)?,
        running: Vec::new(),
    };
    let mut report = RunReport {
        policy: policy.to_string(),
        tasks: Vec::new(),
        samples: vec![sample(&node.alloc, 0)],
        end: 0,
        busy_gpu_seconds: 0,
        counters: Counters::default(),
        comparison: Comparison::default(),
    };
    let mut seq = 0u32;
    let mut labels = ('A'..='Z').chain('a'..='z').chain('0'..='9').cycle();
    for (done, (arrival, app)) in stream.arrivals.iter().enumerate() {
        finish_until(arrival.at, &mut node, agent, &mut report)?;
        for _ in 0..app.instances {
            seq += 1;
            let id = app.task_id(seq)?;
            let outcome = match grant(&mut node.alloc, &node.shadow, inventory, &id, app.gpus) {
                Err(err) => Outcome::Refused {
                    reason: refusal_kind(&err),
                    error: err.to_string(),
                },
                Ok((set, first_fit)) => {
                    node.shadow.allocate_specific(id.as_str(), set)?;
                    let gpus: Vec<Gpu> = set
                        .iter()
                        .filter_map(|i| inventory.by_index(i))
                        .cloned()
                        .collect();
                    let launch = launch(agent, &id, app, &gpus)?;
                    let ends = arrival.at + arrival.runs_for;
                    node.running.push(Running {
                        ends,
                        id: id.clone(),
                        kind: app.container_type(),
                    });
                    report.busy_gpu_seconds += u64::from(set.len()) * arrival.runs_for;
                    let chosen = choice(&node.alloc, inventory, set);
                    let first_fit = choice(&node.alloc, inventory, first_fit);
                    tally(&mut report.comparison, &chosen, &first_fit);
                    let after = sample(&node.alloc, arrival.at);
                    report.samples.push(after);
                    Outcome::Granted {
                        label: labels.next().unwrap_or('?'),
                        minors: gpus.iter().map(|g| g.minor).collect(),
                        chosen,
                        first_fit,
                        ends,
                        free_after: after.free,
                        nvlink_set_after: after.nvlink_set,
                        launch: Box::new(launch),
                    }
                }
            };
            report.tasks.push(TaskReport {
                task: id.to_string(),
                app: app.id.clone(),
                container: app.container_type(),
                image: app.image().map(str::to_owned),
                arrival: arrival.at,
                runs_for: arrival.runs_for,
                requested: app.gpus,
                outcome,
            });
        }
        progress(done + 1, arrival.at);
    }
    finish_until(u64::MAX, &mut node, agent, &mut report)?;
    report.end = report.samples.iter().map(|s| s.at).max().unwrap_or(0);
    report.counters = node.alloc.counters();
    Ok(report)
}

/// Validates and grants `gpus` to `id`; returns the set and what first-fit would have chosen.
fn grant(
    alloc: &mut Allocator,
    shadow: &Allocator,
    inventory: &Inventory,
    id: &ContainerId,
    gpus: f64,
) -> Result<(GpuSet, GpuSet), AllocError> {
    let count = alloc.request(gpus)?.count();
    let set = alloc.allocate(id.as_str(), count)?;
    let first_fit = shadow
        .clone()
        .allocate(id.as_str(), count)
        .unwrap_or(GpuSet::EMPTY);
    tracing::debug!(container = %id, gpus = %set, first_fit = %first_fit, nodes = inventory.gpus.len(), "granted");
    Ok((set, first_fit))
}

fn launch(
    agent: &mut dyn Agent,
    id: &ContainerId,
    app: &MarathonApp,
    gpus: &[Gpu],
) -> Result<Launch, DemoError> {
    let image = image_info(app.image());
    Ok(match app.container_type() {
        ContainerType::Docker => {
            let plan = agent.launch_docker(id, app.gpus, gpus, &image)?;
            Launch::Docker {
                docker_args: plan.cli_args(),
            }
        }
        ContainerType::Mesos => {
            let config = PrepareConfig {
                gpus: app.gpus,
                rootfs: app
                    .image()
                    .map(|_| std::path::Path::new(ROOTFS_BASE).join(id.as_str())),
                image_env: image.env.clone(),
                image_labels: image.labels.keys().cloned().collect(),
                has_task_info: true,
                ..PrepareConfig::default()
            };
            let info = agent.launch_mesos(id, config, gpus)?;
            let base = mesos_gpu_enforce::cgroup::default_whitelist().len();
            let mut environment = info.environment.clone();
            environment.extend(info.task_environment.iter().cloned());
            Launch::Mesos {
                cgroup: info.cgroup.as_ref().map(|p| p.display().to_string()),
                device_rules: info.device_rules.iter().map(ToString::to_string).collect(),
                base_rules: base,
                mounts: info
                    .mounts
                    .iter()
                    .map(|m| MountReport {
                        source: m.source.display().to_string(),
                        target: m.target.display().to_string(),
                        read_only: m.read_only,
                        kind: match m.kind {
                            MountKind::Device => "device",
                            MountKind::DriverVolume => "driver_volume",
                            MountKind::Mps => "mps",
                            MountKind::MigAccessFile => "mig_access_file",
                        },
                    })
                    .collect(),
                environment: environment
                    .into_iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect(),
            }
        }
    })
}

/// Finishes the tasks of `node` that end by `until`.
fn finish_until(
    until: u64,
    node: &mut Node,
    agent: &mut dyn Agent,
    report: &mut RunReport,
) -> Result<(), DemoError> {
    // Stable sort: equal end times finish in launch order.
    node.running.sort_by_key(|r| r.ends);
    let due = node.running.partition_point(|r| r.ends <= until);
    for task in node.running.drain(..due) {
        node.alloc.release_all(task.id.as_str());
        node.shadow.release_all(task.id.as_str());
        agent.finish(&task.id, task.kind)?;
        report.samples.push(sample(&node.alloc, task.ends));
    }
    Ok(())
}

fn sample(alloc: &Allocator, at: u64) -> Sample {
    let frag = alloc.fragmentation();
    Sample {
        at,
        free: frag.free,
        nvlink_set: frag.nvlink_set,
    }
}

fn choice(alloc: &Allocator, inventory: &Inventory, set: GpuSet) -> Choice {
    let position = |index: u32| inventory.gpus.iter().position(|g| g.index == index);
    let mut links: BTreeMap<(u32, String), u32> = BTreeMap::new();
    let indices = set.to_vec();
    for (n, &a) in indices.iter().enumerate() {
        for &b in &indices[n + 1..] {
            if let (Some(pa), Some(pb)) = (position(a), position(b)) {
                let link = inventory.topology.get(pa, pb);
                // Grouped by label (NVLinks first, then PCIe levels), whatever the PCIe level
                // under an NVLinked pair.
                let rank = if link.nvlinks > 0 {
                    Link { pcie: None, ..link }.score()
                } else {
                    link.score()
                };
                *links.entry((u32::MAX - rank, link.label())).or_default() += 1;
            }
        }
    }
    Choice {
        gpus: indices,
        score: alloc.score(set),
        links: links
            .into_iter()
            .map(|((_, label), n)| format!("{n}x{label}"))
            .collect(),
    }
}

fn tally(c: &mut Comparison, chosen: &Choice, first_fit: &Choice) {
    if chosen.gpus.len() < 2 {
        return;
    }
    c.multi_gpu_grants += 1;
    c.chosen_score += chosen.score;
    c.first_fit_score += first_fit.score;
    match chosen.score.cmp(&first_fit.score) {
        std::cmp::Ordering::Greater => c.better += 1,
        std::cmp::Ordering::Equal => c.same += 1,
        std::cmp::Ordering::Less => c.worse += 1,
    }
}

/// The JSON name of a refusal reason.
fn refusal_kind(err: &AllocError) -> &'static str {
    match err {
        AllocError::NotEnough { .. } => "not_enough",
        AllocError::BadRequest { .. } => "bad_request",
        AllocError::Unhealthy { .. } => "unhealthy",
        _ => "refused",
    }
}

/// What the demo assumes about images, for the report's notes.
pub(crate) const ASSUMED_IMAGES: &str = "images are not pulled: an nvidia/cuda image is taken to set NVIDIA_VISIBLE_DEVICES=all (so it gets the driver volume), any other image nothing";
