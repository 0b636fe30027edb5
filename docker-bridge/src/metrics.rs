//! Prometheus metrics of the node's GPUs, containers and allocator, in OpenMetrics text
//! (`prometheus-client`).
//!
//! Figures are read when scraped (NVML through [`GpuReadings`], health from a [`HealthSource`]:
//! the running [`HealthMonitor`] or the checkpoint a monitor keeps ([`HealthStore`]), owners
//! and counters from an [`AllocatorSource`]: the [`Isolator`] of this process) and cached for a
//! short time so that several scrapers do not each hit NVML. A figure NVML does not have is left
//! out, never reported as 0. A fresh registry is encoded per collection, so a GPU or container
//! that is gone has no stale series.
//!
//! Names: `mesos_gpu_*` per GPU (`gpu`, `uuid` labels), `mesos_gpu_container_*` per container
//! and GPU, `mesos_gpu_allocator_*`, and `mesos_gpu_module_*`: the module's
//! own heap and table sizes ([`ModuleSource`]), to tell a leak of the module from the agent's.
//!
//! Holders (issue 37): every `mesos_gpu_container_*` series carries the container's Mesos
//! identity: `container_id`, `executor_id`, `framework_id`, `framework_name`, `task_id` and
//! `task_name` (empty when unknown: a container prepared without task info has no task, and a
//! framework name is read from the agent, [`crate::agent`], so it is empty when the agent does
//! not answer). Per-GPU series carry no holder: a GPU shared by several containers has several,
//! and a label that changes with the holder would start a new series at each task. Instead
//! `mesos_gpu_holder_info{gpu, uuid, container_id, executor_id, framework_id, framework_name,
//! task_id, task_name}` is 1 for each (GPU, container holding it), the info-series pattern of
//! kube-state-metrics and dcgm-exporter: join it on `uuid` with it on the many side
//! (`mesos_gpu_holder_info * on(uuid) group_left mesos_gpu_utilization_percent`, one series per
//! holder, so that a shared GPU's holders do not make a many-to-many match). A free GPU has none. Cardinality stays bounded:
//! a container's series are those of the containers holding GPUs now, and as the registry is
//! built afresh per collection, they vanish with the container. Containers come from this
//! process's allocator (with the holder its isolator recorded) and, with a pool
//! ([`PoolHoldings`]), from every record of the node's pool: Docker tasks reserved by
//! `docker-args`, other publishers' containers; `serve`, which has no allocator, reports the
//! pool's.
//! prometheus-client appends `_total` to counters. `mesos_gpu_health{state, reason, recovery}` is 1 for each GPU's current health:
//! `state` is `healthy`, `unhealthy` or `lost`, `reason` the failure (`xid_79`,
//! `double_bit_ecc`, `lost`, `unwatchable`; empty when healthy), `recovery` how it comes back
//! (`evidence`: by itself once the checks hold; `backoff`: a check failed, waiting to try
//! again; `gpu_reset`, `node_reboot`, `operator`: the operator must act; empty when healthy).
//! `mesos_gpu_health_recoveries_total` and `mesos_gpu_health_probe_failures_total` count
//! automatic recoveries and failed probes per GPU. A GPU the health source has no record of (no
//! monitor, or `serve` reading an agent work directory without a checkpoint) gets NVML's view:
//! lost when NVML says so, else healthy; `mesos_gpu_health_checkpoint{path, state}` then says
//! whether the checkpoint read is `present`, `absent` or `unreadable`, so that an alert on health
//! never goes silent for want of a checkpoint.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{CONTENT_TYPE, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use mesos_gpu_health::{
    Comeback, Failure, GpuRecord, HealthMonitor, HealthStore, LoopStats, Remedy,
};
use mesos_gpu_isolator::lifecycle::{ContainerId, ELSEWHERE_OWNER, Isolator, QUARANTINE_OWNER};
use mesos_gpu_node::discovery::GpuDriver;
use mesos_gpu_node::inventory::Inventory;
use mesos_gpu_node::{
    usage::ContainerCgroup, usage::GpuReadings, usage::GpuUsage, usage::UsageReader,
};
use mesos_gpu_placement::{allocator::Allocator, allocator::Counters, allocator::Fragmentation};
use prometheus_client::encoding::EncodeLabelSet;

use crate::agent::AgentHolders;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// The content type of OpenMetrics text.
pub const CONTENT_TYPE_OPENMETRICS: &str =
    "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// How long a collection is reused by default.
pub const DEFAULT_CACHE: Duration = Duration::from_secs(1);

/// One GPU's figures.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GpuFigures {
    /// Live NVML figures (index and UUID included).
    pub readings: GpuReadings,
    /// Health, when a monitor runs or has checkpointed it.
    pub healthy: Option<bool>,
    /// Why it is unhealthy (`xid_79`, `double_bit_ecc`, `lost`, `unwatchable`), when it is.
    pub failure: Option<String>,
    /// How it comes back, when unhealthy (`evidence`, `backoff`, `gpu_reset`, `node_reboot`,
    /// `operator`).
    pub recovery: Option<String>,
    /// Times it came back by itself.
    pub recoveries: u64,
    /// Probes that failed.
    pub probe_failures: u64,
    /// XIDs seen, by XID.
    pub xids: BTreeMap<u64, u64>,
    /// Corrected ECC events seen.
    pub ecc_single_bit: u64,
    /// Uncorrectable ECC events seen.
    pub ecc_double_bit: u64,
}

/// A container holding GPUs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerFigures {
    /// The container (allocator owner).
    pub container: String,
    /// Whose container it is (every field `None` when not known).
    pub holder: Holder,
    /// Its GPUs and their use (use unknown when its cgroup is not known).
    pub gpus: Vec<GpuUsage>,
}

/// The allocator's figures.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllocatorFigures {
    /// Running totals.
    pub counters: Counters,
    /// Free-GPU connectivity.
    pub fragmentation: Fragmentation,
    /// GPUs managed, held, unhealthy.
    pub managed: u32,
    /// GPUs held by some container.
    pub allocated: u32,
    /// GPUs marked unhealthy.
    pub unhealthy: u32,
    /// GPUs held back until the containers a recovery could not explain are cleaned up.
    pub quarantined: u32,
}

/// What reading a health checkpoint of another process found (`serve` reads the agent's).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointStatus {
    /// The checkpoint file.
    pub path: String,
    /// `present`; `absent` (no monitor has run in that work directory: the agent has not
    /// started there, or it is not the agent's `--work_dir`); or `unreadable`.
    pub state: &'static str,
}

/// What a health source knows at one scrape.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HealthRead {
    /// Every GPU's record (health, XID and ECC counts); empty when none is known.
    pub records: Vec<GpuRecord>,
    /// For a checkpoint read from another process: what was found.
    pub checkpoint: Option<CheckpointStatus>,
}

/// Everything one scrape reports.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeFigures {
    /// Per GPU.
    pub gpus: Vec<GpuFigures>,
    /// Per container.
    pub containers: Vec<ContainerFigures>,
    /// The allocator, when one is known.
    pub allocator: Option<AllocatorFigures>,
    /// The health event loop, when a monitor runs.
    pub health_loop: Option<LoopStats>,
    /// The health checkpoint read, when health comes from another process's.
    pub health_checkpoint: Option<CheckpointStatus>,
    /// The module's own memory, when the module collects.
    pub module: Option<ModuleFigures>,
}

/// The module's own memory in the agent's process.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ModuleFigures {
    /// Bytes the module's code holds on the heap.
    pub heap_bytes: u64,
    /// In how many blocks.
    pub heap_blocks: u64,
    /// Entries of each of its tables that grow with containers, by table name.
    pub entries: Vec<(String, u64)>,
}

/// Where the module's own figures come from.
pub trait ModuleSource: Send + Sync {
    /// The figures as of now.
    fn module_figures(&self) -> ModuleFigures;
}

/// Where figures come from.
pub trait FigureSource: Send + Sync {
    /// The figures as of now.
    fn collect(&self) -> NodeFigures;
}

/// Maps a container (allocator owner) to its cgroup, for per-container memory use.
pub type CgroupOf = Arc<dyn Fn(&str) -> Option<ContainerCgroup> + Send + Sync>;

/// Where each GPU's health comes from.
pub trait HealthSource: Send + Sync {
    /// Every GPU's record, and what a checkpoint read found.
    fn read(&self) -> HealthRead;
    /// The event loop's figures, when this process runs the monitor.
    fn loop_stats(&self) -> Option<LoopStats>;
}

impl HealthSource for HealthMonitor {
    fn read(&self) -> HealthRead {
        HealthRead {
            records: HealthMonitor::records(self),
            checkpoint: None,
        }
    }

    fn loop_stats(&self) -> Option<LoopStats> {
        Some(self.stats())
    }
}

/// The checkpoint of the monitor of another process (the agent's), read at each scrape.
impl HealthSource for HealthStore {
    fn read(&self) -> HealthRead {
        let path = self.checkpoint_path().display().to_string();
        let (records, state) = match self.load() {
            Ok(Some(snapshot)) => (snapshot.gpus, "present"),
            Ok(None) => (Vec::new(), "absent"),
            Err(error) => {
                tracing::debug!(error = %error, "no GPU health checkpoint for metrics");
                (Vec::new(), "unreadable")
            }
        };
        HealthRead {
            records,
            checkpoint: Some(CheckpointStatus { path, state }),
        }
    }

    fn loop_stats(&self) -> Option<LoopStats> {
        None
    }
}

pub use mesos_gpu_pool::Holder;

/// A container, whose it is, and the GPUs it holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holding {
    /// The container (allocator owner, or the pool record's id).
    pub container: String,
    /// Whose container it is, when recorded.
    pub holder: Option<Holder>,
    /// Its GPUs, by NVML index.
    pub gpus: Vec<u32>,
}

/// Where allocator figures and owners come from.
pub trait AllocatorSource: Send + Sync {
    /// The allocator's figures and the containers holding GPUs; `None` when unavailable.
    fn allocator_figures(&self) -> Option<(AllocatorFigures, Vec<Holding>)>;
}

/// Where containers holding GPUs come from besides this process's allocator.
pub trait HoldingSource: Send + Sync {
    /// The containers holding GPUs of `inventory` now.
    fn holdings(&self, inventory: &Inventory) -> Vec<Holding>;
}

/// Every record of the node's pool ([`mesos_gpu_pool`]), read without its lock at each
/// collection: whole GPUs and shares, by the UUIDs of `inventory` (a MIG device's record
/// counts for its parent GPU); quarantine records are left out.
#[derive(Debug)]
pub struct PoolHoldings {
    pool: mesos_gpu_pool::Pool,
}

impl PoolHoldings {
    /// The pool in `dir` (its `gpu/pool.json`).
    pub fn at(dir: impl Into<std::path::PathBuf>) -> PoolHoldings {
        PoolHoldings {
            pool: mesos_gpu_pool::Pool::at(dir),
        }
    }
}

impl HoldingSource for PoolHoldings {
    fn holdings(&self, inventory: &Inventory) -> Vec<Holding> {
        let state = match self.pool.read() {
            Ok(state) => state,
            Err(error) => {
                tracing::debug!(error = %mesos_gpu_os::error_chain(&error), "no pool records for metrics");
                return Vec::new();
            }
        };
        let index_of = |uuid: &str| {
            inventory.by_uuid(uuid).map(|g| g.index).or_else(|| {
                let minor = inventory.mig.by_uuid(uuid)?.parent_minor;
                inventory
                    .gpus
                    .iter()
                    .find(|g| g.minor == minor)
                    .map(|g| g.index)
            })
        };
        let mut out: BTreeMap<String, Holding> = BTreeMap::new();
        let records = state
            .reservations
            .iter()
            .map(|(id, r)| (id, &r.owner, r.gpus.iter().map(|u| u.as_str()).collect()))
            .chain(
                state
                    .shares
                    .iter()
                    .map(|(id, s)| (id, &s.owner, vec![s.grant.uuid.as_str()])),
            );
        for (id, owner, uuids) in records {
            if matches!(owner, mesos_gpu_pool::Owner::Quarantine { .. }) {
                continue;
            }
            let entry = out.entry(id.clone()).or_insert_with(|| Holding {
                container: id.clone(),
                holder: owner.holder().cloned(),
                gpus: Vec::new(),
            });
            let uuids: Vec<&str> = uuids;
            entry.gpus.extend(uuids.into_iter().filter_map(index_of));
        }
        out.into_values()
            .map(|mut h| {
                h.gpus.sort_unstable();
                h.gpus.dedup();
                h
            })
            .collect()
    }
}

fn figures_of(alloc: &Allocator, quarantined: u32) -> AllocatorFigures {
    AllocatorFigures {
        counters: alloc.counters(),
        fragmentation: alloc.fragmentation(),
        managed: alloc.managed().len(),
        allocated: alloc.allocated().len(),
        unhealthy: alloc.unhealthy().len(),
        quarantined,
    }
}

fn owners_of(alloc: &Allocator) -> Vec<Holding> {
    alloc
        .owners()
        .into_iter()
        .filter(|(owner, _)| *owner != QUARANTINE_OWNER)
        .map(|(o, set)| Holding {
            container: o.to_owned(),
            holder: None,
            gpus: set.to_vec(),
        })
        .collect()
}

/// A bare allocator (tools and tests).
impl AllocatorSource for Mutex<Allocator> {
    fn allocator_figures(&self) -> Option<(AllocatorFigures, Vec<Holding>)> {
        let alloc = self.lock().unwrap_or_else(PoisonError::into_inner);
        let quarantined = alloc
            .owners()
            .into_iter()
            .find(|(owner, _)| *owner == QUARANTINE_OWNER)
            .map_or(0, |(_, set)| set.len());
        Some((figures_of(&alloc, quarantined), owners_of(&alloc)))
    }
}

/// The isolator of this process (the module in mesos-agent): its own containers, with the
/// holder each was prepared with; GPUs it holds for the pool's other records
/// ([`ELSEWHERE_OWNER`]) are left to a [`PoolHoldings`].
impl AllocatorSource for Isolator {
    fn allocator_figures(&self) -> Option<(AllocatorFigures, Vec<Holding>)> {
        let quarantined = self
            .allocations()
            .map(|a| u32::try_from(a.quarantined.len()).unwrap_or(u32::MAX));
        let result = quarantined.and_then(|quarantined| {
            self.inspect_allocator(|alloc| (figures_of(alloc, quarantined), owners_of(alloc)))
        });
        match result {
            Ok((figures, owners)) => {
                let owners = owners
                    .into_iter()
                    .filter(|h| h.container != ELSEWHERE_OWNER)
                    .map(|mut h| {
                        // Read after the allocator's lock is given back: `status` takes it.
                        h.holder = ContainerId::new(h.container.as_str())
                            .ok()
                            .and_then(|id| self.status(&id).ok())
                            .and_then(|s| s.holder);
                        h
                    })
                    .collect();
                Some((figures, owners))
            }
            Err(error) => {
                tracing::warn!(error = %error, "no allocator figures for metrics");
                None
            }
        }
    }
}

/// Figures from NVML, GPU health and the allocator of this process.
pub struct NvmlFigures {
    driver: Arc<GpuDriver>,
    health: Option<Arc<dyn HealthSource>>,
    /// The checkpoint state last logged, so that a scrape logs only a change.
    checkpoint_seen: Mutex<Option<&'static str>>,
    allocator: Option<Arc<dyn AllocatorSource>>,
    cgroup_of: Option<CgroupOf>,
    usage: UsageReader,
    module: Option<Arc<dyn ModuleSource>>,
    holdings: Option<Arc<dyn HoldingSource>>,
    agent: Option<Arc<dyn AgentHolders>>,
}

impl std::fmt::Debug for NvmlFigures {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NvmlFigures")
            .field("health", &self.health.is_some())
            .field("allocator", &self.allocator.is_some())
            .field("module", &self.module.is_some())
            .finish_non_exhaustive()
    }
}

impl NvmlFigures {
    /// GPU figures from `driver` only.
    pub fn new(driver: Arc<GpuDriver>) -> NvmlFigures {
        NvmlFigures {
            driver,
            health: None,
            checkpoint_seen: Mutex::new(None),
            allocator: None,
            cgroup_of: None,
            usage: UsageReader::default(),
            module: None,
            holdings: None,
            agent: None,
        }
    }

    /// Adds the containers of `holdings` (the node's pool) to those of the allocator: a
    /// container both name is reported once, as the allocator has it.
    pub fn with_holdings(mut self, holdings: Arc<dyn HoldingSource>) -> NvmlFigures {
        self.holdings = Some(holdings);
        self
    }

    /// Completes each container's holder from the agent: its framework's name (`/state`) and,
    /// for a record that names no holder, its executor and framework (`/containers`).
    pub fn with_agent(mut self, agent: Arc<dyn AgentHolders>) -> NvmlFigures {
        self.agent = Some(agent);
        self
    }

    /// Adds the module's own heap and table sizes.
    pub fn with_module(mut self, module: Arc<dyn ModuleSource>) -> NvmlFigures {
        self.module = Some(module);
        self
    }

    /// Adds health, XID and ECC figures.
    pub fn with_health(mut self, health: Arc<dyn HealthSource>) -> NvmlFigures {
        self.health = Some(health);
        self
    }

    /// Adds allocator and per-container figures; `cgroup_of` gives per-container memory use,
    /// read from `/proc` under `usage`.
    pub fn with_allocator(
        mut self,
        allocator: Arc<dyn AllocatorSource>,
        cgroup_of: Option<CgroupOf>,
        usage: UsageReader,
    ) -> NvmlFigures {
        self.allocator = Some(allocator);
        self.cgroup_of = cgroup_of;
        self.usage = usage;
        self
    }
}

impl NvmlFigures {
    /// The holder of `container`, completed from the agent when there is one.
    fn holder_of(&self, container: &str, recorded: Option<Holder>) -> Holder {
        match &self.agent {
            Some(agent) => crate::agent::complete(container, recorded, agent.as_ref()),
            None => recorded,
        }
        .unwrap_or_default()
    }

    /// Logs what the checkpoint read found when it differs from the last scrape's.
    fn note_checkpoint(&self, status: Option<&CheckpointStatus>) {
        let Some(status) = status else {
            return;
        };
        let mut seen = self
            .checkpoint_seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if *seen == Some(status.state) {
            return;
        }
        *seen = Some(status.state);
        drop(seen);
        let path = &status.path;
        match status.state {
            "present" => {
                tracing::info!(%path, "GPU health for metrics from the agent's checkpoint")
            }
            "absent" => tracing::warn!(
                %path,
                "no GPU health checkpoint: GPU health in /metrics is NVML's (lost or not) until \
                 the agent's monitor writes one; is --agent-work-dir the agent's --work_dir?"
            ),
            _ => tracing::warn!(
                %path,
                "unreadable GPU health checkpoint: GPU health in /metrics is NVML's (lost or not)"
            ),
        }
    }
}

impl FigureSource for NvmlFigures {
    fn collect(&self) -> NodeFigures {
        let read = self.health.as_ref().map(|h| h.read()).unwrap_or_default();
        self.note_checkpoint(read.checkpoint.as_ref());
        let records = read.records;
        let gpus: Vec<GpuFigures> = self
            .driver
            .inventory()
            .gpus
            .iter()
            .map(|gpu| {
                let record = records.iter().find(|r| r.uuid == gpu.uuid);
                let readings = GpuReadings::read(&self.driver, gpu);
                // Without a record, NVML's view: a GPU discovery or this read found lost.
                let lost = readings.lost || !gpu.healthy;
                GpuFigures {
                    healthy: Some(record.map_or(!lost, |r| r.health.is_healthy())),
                    failure: match record {
                        Some(r) => r.health.failure().map(failure_label),
                        None => lost.then(|| "lost".to_owned()),
                    },
                    readings,
                    recovery: record.and_then(recovery_label),
                    recoveries: record.map_or(0, |r| r.recovery.recoveries),
                    probe_failures: record.map_or(0, |r| r.recovery.probe_failures),
                    xids: record.map(|r| r.xids.clone()).unwrap_or_default(),
                    ecc_single_bit: record.map_or(0, |r| r.ecc_single_bit),
                    ecc_double_bit: record.map_or(0, |r| r.ecc_double_bit),
                }
            })
            .collect();
        let (allocator, mut owners) =
            match self.allocator.as_ref().and_then(|a| a.allocator_figures()) {
                Some((figures, owners)) => (Some(figures), owners),
                None => (None, Vec::new()),
            };
        if let Some(holdings) = &self.holdings {
            for h in holdings.holdings(self.driver.inventory()) {
                if !owners.iter().any(|o| o.container == h.container) {
                    owners.push(h);
                }
            }
        }
        let containers = owners
            .into_iter()
            .map(
                |Holding {
                     container,
                     holder,
                     gpus: held,
                 }| {
                    let holder = self.holder_of(&container, holder);
                    let cgroup = self.cgroup_of.as_ref().and_then(|f| f(&container));
                    let gpus = held
                        .iter()
                        .filter_map(|&i| gpus.iter().find(|g| g.readings.index == i))
                        .map(|g| match &cgroup {
                            Some(cgroup) => self.usage.attribute(&g.readings, cgroup),
                            None => GpuUsage {
                                index: g.readings.index,
                                uuid: g.readings.uuid.clone(),
                                utilization_gpu: g.readings.utilization_gpu,
                                utilization_memory: g.readings.utilization_memory,
                                memory_used: None,
                                memory_total: g.readings.memory_total,
                                pids: None,
                            },
                        })
                        .collect();
                    ContainerFigures {
                        container,
                        holder,
                        gpus,
                    }
                },
            )
            .collect();
        NodeFigures {
            gpus,
            containers,
            allocator,
            health_loop: self.health.as_ref().and_then(|h| h.loop_stats()),
            health_checkpoint: read.checkpoint,
            module: self.module.as_ref().map(|m| m.module_figures()),
        }
    }
}

/// How an unhealthy GPU comes back: the operator's remedy, or on evidence (`backoff` once an
/// attempt failed); a driver asking for a reset or reboot counts as that remedy.
fn recovery_label(record: &GpuRecord) -> Option<String> {
    let failure = record.health.failure()?;
    // A checkpoint from before episodes were recorded: the failure's own comeback.
    let Some(episode) = record.recovery.episode.as_ref() else {
        return Some(match failure.comeback() {
            Comeback::Reset { remedy } => remedy.label().to_owned(),
            Comeback::Evidence { .. } => "evidence".to_owned(),
        });
    };
    let asks_reboot = episode.driver_asks.as_deref() == Some("a node reboot");
    Some(
        match (episode.comeback, &episode.driver_asks) {
            (Comeback::Reset { remedy }, _) => remedy.label(),
            (Comeback::Evidence { .. }, Some(_)) if asks_reboot => Remedy::NodeReboot.label(),
            (Comeback::Evidence { .. }, Some(_)) => Remedy::GpuReset.label(),
            (Comeback::Evidence { .. }, None) if episode.attempts > 0 => "backoff",
            (Comeback::Evidence { .. }, None) => "evidence",
        }
        .to_owned(),
    )
}

/// The `reason` label of a failure.
fn failure_label(failure: &Failure) -> String {
    match failure {
        Failure::Xid { xid } => format!("xid_{xid}"),
        Failure::DoubleBitEcc => "double_bit_ecc".to_owned(),
        Failure::Lost => "lost".to_owned(),
        Failure::Unwatchable { .. } => "unwatchable".to_owned(),
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HealthLabels {
    gpu: String,
    uuid: String,
    state: &'static str,
    reason: String,
    recovery: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabels {
    state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CheckpointLabels {
    path: String,
    state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct GpuLabels {
    gpu: String,
    uuid: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct XidLabels {
    gpu: String,
    uuid: String,
    xid: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EccLabels {
    gpu: String,
    uuid: String,
    kind: &'static str,
}

/// A container's labels: its id and whose it is (empty when unknown).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ContainerLabels {
    container_id: String,
    executor_id: String,
    framework_id: String,
    framework_name: String,
    task_id: String,
    task_name: String,
}

impl ContainerLabels {
    fn of(c: &ContainerFigures) -> ContainerLabels {
        let h = &c.holder;
        let text = |v: &Option<String>| v.clone().unwrap_or_default();
        ContainerLabels {
            container_id: c.container.clone(),
            executor_id: text(&h.executor_id),
            framework_id: text(&h.framework_id),
            framework_name: text(&h.framework_name),
            task_id: text(&h.task_id),
            task_name: text(&h.task_name),
        }
    }
}

/// A GPU of a container: the GPU, then the container's labels.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ContainerGpuLabels {
    gpu: String,
    uuid: String,
    #[prometheus(flatten)]
    container: ContainerLabels,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TableLabels {
    table: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SizeLabels {
    size: String,
}

type GaugeF = Gauge<f64, AtomicU64>;

fn gauge<L>(registry: &mut Registry, name: &str, help: &str) -> Family<L, Gauge>
where
    L: Clone + std::hash::Hash + Eq + EncodeLabelSet + std::fmt::Debug + Send + Sync + 'static,
{
    let family = Family::<L, Gauge>::default();
    registry.register(name, help, family.clone());
    family
}

fn counter<L>(registry: &mut Registry, name: &str, help: &str) -> Family<L, Counter>
where
    L: Clone + std::hash::Hash + Eq + EncodeLabelSet + std::fmt::Debug + Send + Sync + 'static,
{
    let family = Family::<L, Counter>::default();
    registry.register(name, help, family.clone());
    family
}

fn int(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// Encodes figures as OpenMetrics text.
///
/// Families are registered, and so printed, in this order: per GPU, per container, the
/// allocator, the health checkpoint and loop, then the module's own memory.
pub fn encode(figures: &NodeFigures) -> Result<String, std::fmt::Error> {
    let mut r = Registry::default();
    let gpus = GpuFamilies::register(&mut r);
    for g in &figures.gpus {
        gpus.record(g);
    }
    register_containers(&mut r, &figures.containers);
    if let Some(a) = &figures.allocator {
        register_allocator_counters(&mut r, &a.counters);
        register_allocator_gpus(&mut r, a);
    }
    if let Some(c) = &figures.health_checkpoint {
        register_health_checkpoint(&mut r, c);
    }
    if let Some(s) = &figures.health_loop {
        register_health_loop(&mut r, s);
    }
    if let Some(m) = &figures.module {
        register_module(&mut r, m);
    }
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, &r)?;
    Ok(sorted_samples(&out))
}

/// The per-GPU families (`mesos_gpu_*` with `gpu` and `uuid` labels), registered once and
/// filled GPU by GPU.
struct GpuFamilies {
    healthy: Family<GpuLabels, Gauge>,
    util: Family<GpuLabels, Gauge>,
    mem_util: Family<GpuLabels, Gauge>,
    used: Family<GpuLabels, Gauge>,
    total: Family<GpuLabels, Gauge>,
    temp: Family<GpuLabels, Gauge>,
    power: Family<GpuLabels, GaugeF>,
    lost: Family<GpuLabels, Gauge>,
    health: Family<HealthLabels, Gauge>,
    recoveries: Family<GpuLabels, Counter>,
    probe_failures: Family<GpuLabels, Counter>,
    xids: Family<XidLabels, Counter>,
    ecc: Family<EccLabels, Counter>,
}

impl GpuFamilies {
    /// Registers the per-GPU families in `r`, empty.
    fn register(r: &mut Registry) -> GpuFamilies {
        let healthy = gauge(
            r,
            "mesos_gpu_healthy",
            "1 when the GPU is healthy, 0 when marked unhealthy",
        );
        let util = gauge(
            r,
            "mesos_gpu_utilization_percent",
            "Percent of time a kernel ran (NVML)",
        );
        let mem_util = gauge(
            r,
            "mesos_gpu_memory_utilization_percent",
            "Percent of time memory was read or written (NVML)",
        );
        let used = gauge(
            r,
            "mesos_gpu_memory_used_bytes",
            "Framebuffer memory in use (NVML)",
        );
        let total = gauge(
            r,
            "mesos_gpu_memory_total_bytes",
            "Framebuffer memory in all (NVML)",
        );
        let temp = gauge(r, "mesos_gpu_temperature_celsius", "GPU temperature (NVML)");
        let power = Family::<GpuLabels, GaugeF>::default();
        r.register("mesos_gpu_power_watts", "Power draw (NVML)", power.clone());
        let lost = gauge(r, "mesos_gpu_lost", "1 when NVML answers GPU_IS_LOST");
        let health = gauge(
            r,
            "mesos_gpu_health",
            "1 for the GPU's health: state healthy, unhealthy or lost, the failure's reason, and how it comes back (recovery)",
        );
        let recoveries = counter(
            r,
            "mesos_gpu_health_recoveries",
            "Times the GPU came back in the pool by itself, on evidence",
        );
        let probe_failures = counter(
            r,
            "mesos_gpu_health_probe_failures",
            "Recovery probes of the GPU that failed",
        );
        let xids = counter(
            r,
            "mesos_gpu_xid_errors",
            "XID errors seen since start, counted or ignored",
        );
        let ecc = counter(
            r,
            "mesos_gpu_ecc_errors",
            "ECC error events seen since start",
        );
        GpuFamilies {
            healthy,
            util,
            mem_util,
            used,
            total,
            temp,
            power,
            lost,
            health,
            recoveries,
            probe_failures,
            xids,
            ecc,
        }
    }

    /// Adds one GPU's series: its health (when known), NVML readings and error counts.
    fn record(&self, g: &GpuFigures) {
        let labels = GpuLabels {
            gpu: g.readings.index.to_string(),
            uuid: g.readings.uuid.clone(),
        };
        if let Some(h) = g.healthy {
            self.record_health(&labels, g, h);
        }
        self.record_readings(&labels, &g.readings);
        self.record_errors(&labels, g);
    }

    /// The GPU's health series: healthy or not, state with reason and recovery, and the
    /// recovery and probe-failure counts.
    fn record_health(&self, labels: &GpuLabels, g: &GpuFigures, healthy: bool) {
        self.healthy.get_or_create(labels).set(i64::from(healthy));
        let reason = g.failure.clone().unwrap_or_default();
        let state = match (healthy, reason.as_str()) {
            (true, _) => "healthy",
            (false, "lost") => "lost",
            (false, _) => "unhealthy",
        };
        self.health
            .get_or_create(&HealthLabels {
                gpu: labels.gpu.clone(),
                uuid: labels.uuid.clone(),
                state,
                reason,
                recovery: g.recovery.clone().unwrap_or_default(),
            })
            .set(1);
        self.recoveries.get_or_create(labels).inc_by(g.recoveries);
        self.probe_failures
            .get_or_create(labels)
            .inc_by(g.probe_failures);
    }

    /// The GPU's NVML readings; a reading NVML does not have is left out.
    fn record_readings(&self, labels: &GpuLabels, rd: &GpuReadings) {
        self.lost.get_or_create(labels).set(i64::from(rd.lost));
        let set = |family: &Family<GpuLabels, Gauge>, v: Option<i64>| {
            if let Some(v) = v {
                family.get_or_create(labels).set(v);
            }
        };
        set(&self.util, rd.utilization_gpu.map(i64::from));
        set(&self.mem_util, rd.utilization_memory.map(i64::from));
        set(&self.used, rd.memory_used.map(int));
        set(&self.total, rd.memory_total.map(int));
        set(&self.temp, rd.temperature_c.map(i64::from));
        if let Some(mw) = rd.power_mw {
            self.power.get_or_create(labels).set(f64::from(mw) / 1000.0);
        }
    }

    /// The GPU's XID counts by XID, and its ECC counts by kind (a kind never seen is left out).
    fn record_errors(&self, labels: &GpuLabels, g: &GpuFigures) {
        for (xid, n) in &g.xids {
            let l = XidLabels {
                gpu: labels.gpu.clone(),
                uuid: labels.uuid.clone(),
                xid: xid.to_string(),
            };
            self.xids.get_or_create(&l).inc_by(*n);
        }
        for (kind, n) in [
            ("single_bit", g.ecc_single_bit),
            ("double_bit", g.ecc_double_bit),
        ] {
            if n > 0 {
                let l = EccLabels {
                    gpu: labels.gpu.clone(),
                    uuid: labels.uuid.clone(),
                    kind,
                };
                self.ecc.get_or_create(&l).inc_by(n);
            }
        }
    }
}

/// Registers the per-container families (`mesos_gpu_container_*`): GPUs held, and each held
/// GPU's utilization and the container's memory on it.
fn register_containers(r: &mut Registry, containers: &[ContainerFigures]) {
    let held = gauge::<ContainerLabels>(
        r,
        "mesos_gpu_container_gpus",
        "GPUs allocated to the container",
    );
    let info = gauge::<ContainerGpuLabels>(
        r,
        "mesos_gpu_holder_info",
        "1 for each GPU and container holding it, with whose container it is (join on gpu or \
         uuid); none for a free GPU",
    );
    let c_util = gauge::<ContainerGpuLabels>(
        r,
        "mesos_gpu_container_utilization_percent",
        "Utilization of a GPU the container holds",
    );
    let c_mem = gauge::<ContainerGpuLabels>(
        r,
        "mesos_gpu_container_memory_used_bytes",
        "Framebuffer memory used by the container's own processes on the GPU",
    );
    for c in containers {
        let count = i64::try_from(c.gpus.len()).unwrap_or(i64::MAX);
        let labels = ContainerLabels::of(c);
        held.get_or_create(&labels).set(count);
        for g in &c.gpus {
            let l = ContainerGpuLabels {
                gpu: g.index.to_string(),
                uuid: g.uuid.clone(),
                container: labels.clone(),
            };
            info.get_or_create(&l).set(1);
            if let Some(u) = g.utilization_gpu {
                c_util.get_or_create(&l).set(i64::from(u));
            }
            if let Some(m) = g.memory_used {
                c_mem.get_or_create(&l).set(int(m));
            }
        }
    }
}

/// Registers the allocator's running totals: requests, GPUs granted and released, greedy
/// picks, and refusals by reason.
fn register_allocator_counters(r: &mut Registry, c: &Counters) {
    let one = |r: &mut Registry, name: &str, help: &str, v: u64| {
        let c = Counter::<u64>::default();
        c.inc_by(v);
        r.register(name, help, c);
    };
    one(
        r,
        "mesos_gpu_allocator_requests",
        "Allocator calls, refused ones included",
        c.requests,
    );
    one(
        r,
        "mesos_gpu_allocator_granted_gpus",
        "GPUs handed out",
        c.granted,
    );
    one(
        r,
        "mesos_gpu_allocator_released_gpus",
        "GPUs given back",
        c.released,
    );
    one(
        r,
        "mesos_gpu_allocator_greedy_picks",
        "Topology picks made by the greedy fallback",
        c.greedy_picks,
    );
    let refused = counter::<ReasonLabels>(
        r,
        "mesos_gpu_allocator_refusals",
        "Refused allocator calls by reason",
    );
    let f = &c.refused;
    for (reason, n) in [
        ("not_enough", f.not_enough),
        ("bad_request", f.bad_request),
        ("not_allocated", f.not_allocated),
        ("already_allocated", f.already_allocated),
        ("unknown_gpu", f.unknown_gpu),
        ("unhealthy", f.unhealthy),
    ] {
        refused.get_or_create(&ReasonLabels { reason }).inc_by(n);
    }
}

/// Registers the allocator's GPU counts (managed, allocated, unhealthy, free, by state) and
/// the free GPUs' fragmentation (largest NVLinked set, best score by size).
fn register_allocator_gpus(r: &mut Registry, a: &AllocatorFigures) {
    let g = |r: &mut Registry, name: &str, help: &str, v: u32| {
        let gauge = Gauge::<i64, std::sync::atomic::AtomicI64>::default();
        gauge.set(i64::from(v));
        r.register(name, help, gauge);
    };
    g(
        r,
        "mesos_gpu_allocator_managed_gpus",
        "GPUs the allocator manages",
        a.managed,
    );
    g(
        r,
        "mesos_gpu_allocator_allocated_gpus",
        "GPUs held by containers",
        a.allocated,
    );
    g(
        r,
        "mesos_gpu_allocator_unhealthy_gpus",
        "GPUs marked unhealthy",
        a.unhealthy,
    );
    g(
        r,
        "mesos_gpu_allocator_free_gpus",
        "Healthy GPUs held by nobody",
        a.fragmentation.free,
    );
    let by_state = gauge::<StateLabels>(
        r,
        "mesos_gpu_allocator_gpus",
        "GPUs by state: allocated (held by containers), free (healthy, held by nobody), \
         quarantined (held until unexplained containers are cleaned up), unhealthy (held or not)",
    );
    for (state, n) in [
        ("allocated", a.allocated.saturating_sub(a.quarantined)),
        ("free", a.fragmentation.free),
        ("quarantined", a.quarantined),
        ("unhealthy", a.unhealthy),
    ] {
        by_state
            .get_or_create(&StateLabels { state })
            .set(i64::from(n));
    }
    g(
        r,
        "mesos_gpu_allocator_nvlink_set_gpus",
        "Largest request the free GPUs can serve with every pair NVLinked",
        a.fragmentation.nvlink_set,
    );
    let best = gauge::<SizeLabels>(
        r,
        "mesos_gpu_allocator_best_free_score",
        "Highest topology score of any set of this many free GPUs (a drop shows fragmentation)",
    );
    for (size, score) in a.fragmentation.best_score.iter().enumerate().skip(2) {
        best.get_or_create(&SizeLabels {
            size: size.to_string(),
        })
        .set(int(*score));
    }
}

/// Registers the state of the health checkpoint read from another process.
fn register_health_checkpoint(r: &mut Registry, c: &CheckpointStatus) {
    gauge::<CheckpointLabels>(
        r,
        "mesos_gpu_health_checkpoint",
        "1 for the state of the GPU health checkpoint read (present, absent or unreadable); \
         GPUs it has no record of get NVML's health",
    )
    .get_or_create(&CheckpointLabels {
        path: c.path.clone(),
        state: c.state,
    })
    .set(1);
}

/// Registers the health event loop's failure and event counts.
fn register_health_loop(r: &mut Registry, s: &LoopStats) {
    let c = Counter::<u64>::default();
    c.inc_by(s.loop_failures);
    r.register(
        "mesos_gpu_health_loop_failures",
        "Failures of the NVML health event loop (each retried)",
        c,
    );
    let e = Counter::<u64>::default();
    e.inc_by(s.events);
    r.register("mesos_gpu_health_events", "NVML health events received", e);
}

/// Registers the module's own heap use and the sizes of its tables.
fn register_module(r: &mut Registry, m: &ModuleFigures) {
    for (name, help, v) in [
        (
            "mesos_gpu_module_heap_bytes",
            "Bytes the module's own code holds on the agent's heap",
            m.heap_bytes,
        ),
        (
            "mesos_gpu_module_heap_blocks",
            "Heap blocks the module's own code holds",
            m.heap_blocks,
        ),
    ] {
        let gauge = Gauge::<i64, std::sync::atomic::AtomicI64>::default();
        gauge.set(int(v));
        r.register(name, help, gauge);
    }
    let entries = gauge::<TableLabels>(
        r,
        "mesos_gpu_module_entries",
        "Entries of the module's tables that grow with containers (0 when idle but \
         mps_daemons)",
    );
    for (table, n) in &m.entries {
        entries
            .get_or_create(&TableLabels {
                table: table.clone(),
            })
            .set(int(*n));
    }
}

/// `text` with the samples of each metric family in a stable order, by their label values read
/// as numbers where they are (`gpu="2"` before `gpu="10"`): the registry keeps a family's series
/// in a hash map, so they came in a different order at each scrape.
fn sorted_samples(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut samples: Vec<&str> = Vec::new();
    let flush = |samples: &mut Vec<&str>, out: &mut String| {
        samples.sort_by_cached_key(|line| natural_key(line));
        for line in samples.drain(..) {
            out.push_str(line);
            out.push('\n');
        }
    };
    for line in text.lines() {
        if line.starts_with('#') {
            flush(&mut samples, &mut out);
            out.push_str(line);
            out.push('\n');
        } else {
            samples.push(line);
        }
    }
    flush(&mut samples, &mut out);
    out
}

/// A sort key reading runs of digits as numbers.
fn natural_key(line: &str) -> Vec<(String, u64)> {
    let mut key = Vec::new();
    let mut text = String::new();
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        if c.is_ascii_digit() {
            let mut number = u64::from(c.to_digit(10).unwrap_or(0));
            while let Some(d) = chars.peek().and_then(|d| d.to_digit(10)) {
                number = number.saturating_mul(10).saturating_add(u64::from(d));
                chars.next();
            }
            key.push((std::mem::take(&mut text), number));
        } else {
            text.push(c);
        }
    }
    key.push((text, 0));
    key
}

/// The `/metrics` endpoint: collects (at most once per cache period) and encodes.
pub struct Metrics {
    source: Arc<dyn FigureSource>,
    cache_for: Duration,
    cached: Mutex<Option<(Instant, Arc<String>)>>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics")
            .field("cache_for", &self.cache_for)
            .finish_non_exhaustive()
    }
}

impl Metrics {
    /// Metrics from `source`, each collection reused for `cache_for`.
    pub fn new(source: Arc<dyn FigureSource>, cache_for: Duration) -> Metrics {
        Metrics {
            source,
            cache_for,
            cached: Mutex::new(None),
        }
    }

    /// The OpenMetrics text, from the cache when fresh. Blocking (NVML calls).
    pub fn render(&self) -> Result<Arc<String>, std::fmt::Error> {
        let mut cached = self.cached.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((at, text)) = cached.as_ref()
            && at.elapsed() < self.cache_for
        {
            return Ok(Arc::clone(text));
        }
        let text = Arc::new(encode(&self.source.collect())?);
        *cached = Some((Instant::now(), Arc::clone(&text)));
        Ok(text)
    }

    /// Serves one HTTP request on its own (for hyper's `service_fn` on a dedicated listener):
    /// `GET`/`HEAD /metrics` is answered, any other path is 404 and another method 405.
    pub async fn handle(
        self: Arc<Self>,
        req: Request<Incoming>,
    ) -> Result<Response<Full<Bytes>>, Infallible> {
        let text = |status, body: &'static str| {
            let mut resp = Response::new(Full::new(Bytes::from_static(body.as_bytes())));
            *resp.status_mut() = status;
            resp
        };
        if req.uri().path() != "/metrics" {
            return Ok(text(StatusCode::NOT_FOUND, "404 page not found\n"));
        }
        if req.method() != Method::GET && req.method() != Method::HEAD {
            return Ok(text(StatusCode::METHOD_NOT_ALLOWED, "GET only\n"));
        }
        drop(req);
        Ok(tokio::task::spawn_blocking(move || self.respond())
            .await
            .unwrap_or_else(|e| {
                tracing::error!(error = %e, "metrics collection panicked");
                text(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "internal error, check logs for details\n",
                )
            }))
    }

    /// The HTTP response for `GET /metrics`. Blocking (NVML calls).
    pub fn respond(&self) -> Response<Full<Bytes>> {
        let (status, content_type, body) = match self.render() {
            Ok(text) => (
                StatusCode::OK,
                CONTENT_TYPE_OPENMETRICS,
                text.as_bytes().to_vec(),
            ),
            Err(e) => {
                tracing::error!(error = %e, "cannot encode metrics");
                (
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "text/plain; charset=utf-8",
                    b"cannot encode metrics\n".to_vec(),
                )
            }
        };
        let mut resp = Response::new(Full::new(Bytes::from(body)));
        *resp.status_mut() = status;
        resp.headers_mut()
            .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
        resp
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a failed unwrap fails the test at its line
mod tests {
    use super::*;

    #[test]
    fn unknown_figures_are_left_out() {
        let figures = NodeFigures {
            gpus: vec![GpuFigures {
                readings: GpuReadings {
                    index: 0,
                    uuid: "GPU-a".to_owned(),
                    utilization_gpu: Some(30),
                    power_mw: Some(61_500),
                    ..GpuReadings::default()
                },
                healthy: Some(false),
                failure: Some("xid_79".to_owned()),
                recovery: Some("node_reboot".to_owned()),
                recoveries: 2,
                probe_failures: 3,
                xids: BTreeMap::from([(79, 2)]),
                ecc_double_bit: 1,
                ..GpuFigures::default()
            }],
            ..NodeFigures::default()
        };
        let text = encode(&figures).unwrap();
        assert!(
            text.contains(r#"mesos_gpu_healthy{gpu="0",uuid="GPU-a"} 0"#),
            "{text}"
        );
        assert!(
            text.contains(
                r#"mesos_gpu_health{gpu="0",uuid="GPU-a",state="unhealthy",reason="xid_79",recovery="node_reboot"} 1"#
            ),
            "{text}"
        );
        assert!(
            text.contains(r#"mesos_gpu_utilization_percent{gpu="0",uuid="GPU-a"} 30"#),
            "{text}"
        );
        assert!(
            text.contains(r#"mesos_gpu_health_recoveries_total{gpu="0",uuid="GPU-a"} 2"#)
                && text
                    .contains(r#"mesos_gpu_health_probe_failures_total{gpu="0",uuid="GPU-a"} 3"#),
            "{text}"
        );
        assert!(
            text.contains(r#"mesos_gpu_power_watts{gpu="0",uuid="GPU-a"} 61.5"#),
            "{text}"
        );
        assert!(
            text.contains(r#"mesos_gpu_xid_errors_total{gpu="0",uuid="GPU-a",xid="79"} 2"#),
            "{text}"
        );
        assert!(
            text.contains(
                r#"mesos_gpu_ecc_errors_total{gpu="0",uuid="GPU-a",kind="double_bit"} 1"#
            ),
            "{text}"
        );
        assert!(
            !text.contains("mesos_gpu_temperature_celsius{"),
            "unknown temperature left out: {text}"
        );
        assert!(!text.contains("mesos_gpu_memory_used_bytes{"), "{text}");
        assert!(
            !text.contains("_module_"),
            "no module, no module figures: {text}"
        );
        assert!(text.ends_with("# EOF\n"));
    }

    #[test]
    fn series_come_in_gpu_order_at_every_scrape() {
        let gpu = |index: u32| GpuFigures {
            readings: GpuReadings {
                index,
                uuid: format!("GPU-{index}"),
                utilization_gpu: Some(10),
                ..GpuReadings::default()
            },
            ..GpuFigures::default()
        };
        let figures = NodeFigures {
            gpus: (0..16).rev().map(gpu).collect(),
            ..NodeFigures::default()
        };
        let order = |text: &str| -> Vec<String> {
            text.lines()
                .filter(|l| l.starts_with("mesos_gpu_utilization_percent{"))
                .map(str::to_owned)
                .collect()
        };
        let want: Vec<String> = (0..16)
            .map(|i| format!(r#"mesos_gpu_utilization_percent{{gpu="{i}",uuid="GPU-{i}"}} 10"#))
            .collect();
        for _ in 0..5 {
            assert_eq!(order(&encode(&figures).unwrap()), want);
        }
    }

    #[test]
    fn the_checkpoint_read_is_reported() {
        let figures = NodeFigures {
            health_checkpoint: Some(CheckpointStatus {
                path: "/w/gpu/health.json".to_owned(),
                state: "absent",
            }),
            ..NodeFigures::default()
        };
        let text = encode(&figures).unwrap();
        assert!(
            text.contains(
                r#"mesos_gpu_health_checkpoint{path="/w/gpu/health.json",state="absent"} 1"#
            ),
            "{text}"
        );
    }

    #[test]
    fn module_figures_are_reported() {
        let figures = NodeFigures {
            module: Some(ModuleFigures {
                heap_bytes: 123_456,
                heap_blocks: 789,
                entries: vec![("containers".to_owned(), 3), ("limitations".to_owned(), 0)],
            }),
            ..NodeFigures::default()
        };
        let text = encode(&figures).unwrap();
        for line in [
            "mesos_gpu_module_heap_bytes 123456",
            "mesos_gpu_module_heap_blocks 789",
            r#"mesos_gpu_module_entries{table="containers"} 3"#,
            r#"mesos_gpu_module_entries{table="limitations"} 0"#,
        ] {
            assert!(text.lines().any(|l| l == line), "{line} missing: {text}");
        }
    }

    fn holder(task: &str) -> Holder {
        Holder {
            executor_id: Some(format!("{task}-executor")),
            framework_id: Some("fw-1".to_owned()),
            framework_name: Some("marathon".to_owned()),
            task_id: Some(task.to_owned()),
            task_name: None,
        }
    }

    fn held(index: u32, uuid: &str) -> GpuUsage {
        GpuUsage {
            index,
            uuid: uuid.to_owned(),
            utilization_gpu: Some(40),
            utilization_memory: None,
            memory_used: None,
            memory_total: None,
            pids: None,
        }
    }

    #[test]
    fn container_series_carry_their_holder_and_vanish_with_it() {
        let two = ContainerFigures {
            container: "c-two".to_owned(),
            holder: holder("train"),
            gpus: vec![held(0, "GPU-a"), held(1, "GPU-b")],
        };
        let bare = ContainerFigures {
            container: "c-bare".to_owned(),
            holder: Holder::default(),
            gpus: vec![held(2, "GPU-c")],
        };
        let figures = NodeFigures {
            containers: vec![two.clone(), bare],
            ..NodeFigures::default()
        };
        let text = encode(&figures).unwrap();
        let who = r#"container_id="c-two",executor_id="train-executor",framework_id="fw-1",framework_name="marathon",task_id="train",task_name="""#;
        for line in [
            format!("mesos_gpu_container_gpus{{{who}}} 2"),
            format!(r#"mesos_gpu_holder_info{{gpu="0",uuid="GPU-a",{who}}} 1"#),
            format!(r#"mesos_gpu_holder_info{{gpu="1",uuid="GPU-b",{who}}} 1"#),
            format!(r#"mesos_gpu_container_utilization_percent{{gpu="1",uuid="GPU-b",{who}}} 40"#),
            r#"mesos_gpu_container_gpus{container_id="c-bare",executor_id="",framework_id="",framework_name="",task_id="",task_name=""} 1"#.to_owned(),
        ] {
            assert!(text.lines().any(|l| l == line), "{line} missing: {text}");
        }
        // The bare container ends: no series of it remains, the other's stay.
        let after = encode(&NodeFigures {
            containers: vec![two],
            ..NodeFigures::default()
        })
        .unwrap();
        assert!(!after.contains("c-bare"), "{after}");
        assert!(
            !after.contains(r#"gpu="2""#),
            "a free GPU has no holder: {after}"
        );
        assert!(after.contains(r#"task_id="train""#), "{after}");
        // None left: the families are empty.
        let none = encode(&NodeFigures::default()).unwrap();
        assert!(!none.contains("container_id="), "{none}");
    }

    #[test]
    fn a_shared_gpu_has_one_holder_info_series_per_holder() {
        let share = |container: &str, task: &str| ContainerFigures {
            container: container.to_owned(),
            holder: holder(task),
            gpus: vec![held(0, "GPU-a")],
        };
        let text = encode(&NodeFigures {
            containers: vec![share("c-1", "infer-1"), share("c-2", "infer-2")],
            ..NodeFigures::default()
        })
        .unwrap();
        let infos: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with(r#"mesos_gpu_holder_info{gpu="0",uuid="GPU-a","#))
            .collect();
        assert_eq!(infos.len(), 2, "{text}");
        assert!(infos[0].contains(r#"task_id="infer-1""#), "{infos:?}");
        assert!(infos[1].contains(r#"task_id="infer-2""#), "{infos:?}");
    }

    #[test]
    fn the_pool_gives_each_records_gpus_and_holder() {
        let dir = tempfile::tempdir().unwrap();
        let sim = mesos_gpu_testkit::nvml_sim::SimNode::shipped("pcie-t4x4");
        let mesos_gpu_node::discovery::Discovery::Driver(driver) =
            GpuDriver::open(Some(&sim.lib_path())).unwrap()
        else {
            panic!("no driver");
        };
        let inventory = driver.inventory().clone();
        let uuid =
            |i: usize| mesos_gpu_pool::GpuUuid::new(inventory.gpus[i].uuid.as_str()).unwrap();
        let pool = mesos_gpu_pool::Pool::at(dir.path());
        let mut tx = pool.begin().unwrap();
        tx.state.publish(
            "docker-args",
            vec![
                (
                    "d1".to_owned(),
                    mesos_gpu_pool::Owner::Docker {
                        name: "mesos-d1".to_owned(),
                        daemon: None,
                        starter: None,
                        holder: Some(holder("web")),
                    },
                    vec![uuid(2), uuid(3)],
                ),
                (
                    "q".to_owned(),
                    mesos_gpu_pool::Owner::Quarantine {
                        reason: "test".to_owned(),
                    },
                    vec![uuid(0)],
                ),
            ],
        );
        tx.commit().unwrap();
        drop(tx);
        let found = PoolHoldings::at(dir.path()).holdings(&inventory);
        assert_eq!(
            found,
            [Holding {
                container: "d1".to_owned(),
                holder: Some(holder("web")),
                gpus: vec![inventory.gpus[2].index, inventory.gpus[3].index],
            }]
        );
        assert!(
            PoolHoldings::at(dir.path().join("none"))
                .holdings(&inventory)
                .is_empty()
        );
    }
}
