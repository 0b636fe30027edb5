//! The isolator behind an `MgpuIsolator *`: one per agent, shared by the Mesos containerizer
//! (the isolator calls) and `docker_release` for the Docker containerizer, so both draw GPUs
//! from one allocator. (The Docker containerizer's tasks reserve through the hook's `mesos-gpu
//! docker-args` command, on the node's pool.)
//!
//! Calls take decoded Mesos messages and answer Mesos messages; bytes, pointers and status codes
//! are `crate::abi`'s business. Every method takes `&self` and may run on many threads at once:
//! the isolator serializes its own state, the reply cache has its own lock.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use mesos_gpu_docker::agent::{AgentHolders, MesosAgent};
use mesos_gpu_docker::daemons::EngineDaemons;
use mesos_gpu_docker::metrics::{
    self, Metrics, ModuleFigures, ModuleSource, NvmlFigures, PoolHoldings,
};
use mesos_gpu_enforce::mps::ComputeModes;
use mesos_gpu_enforce::timing;
use mesos_gpu_health::{GpuRef, MonitorConfig};
use mesos_gpu_isolator::{
    agent_flags::AgentGpuFlags, agent_flags::DEVICES_FLAG, agent_flags::GPU_ISOLATOR,
    agent_flags::MigOffer, agent_flags::MigStrategy,
};
use mesos_gpu_isolator::{lifecycle::ContainerId, lifecycle::Isolator};
use mesos_gpu_node::devices::DeviceNodes;
use mesos_gpu_node::inventory::Inventory;
use mesos_gpu_node::usage::UsageReader;
use mesos_gpu_node::{discovery::DEFAULT_NVML_LIB, discovery::Discovery, discovery::GpuDriver};
use prost::Message;

use crate::convert;
use crate::params::{ModuleParams, ParamError};
use crate::proto::mesos::slave::{ContainerConfig, ContainerRecoverInfo};
use crate::proto::mesos::{self, Parameter, Parameters};
use crate::status::FfiError;

/// The calls whose answer is cached for a retry after `MGPU_BUFFER_TOO_SMALL`: they have side
/// effects, so running them again is not an option.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Replayable {
    Prepare,
}

impl Replayable {
    fn name(self) -> &'static str {
        match self {
            Replayable::Prepare => "prepare",
        }
    }
}

/// An answer that did not fit the caller's buffer, kept with the request that produced it.
#[derive(Debug)]
pub(crate) struct Pending {
    request: Vec<u8>,
    reply: Vec<u8>,
}

/// Answers kept for a retry, by call and container.
type PendingReplies = Mutex<HashMap<(Replayable, String), Pending>>;

/// The module's own memory, for the metrics: its heap, and the entries of the isolator's tables
/// and of the reply cache.
struct ModuleMemory {
    isolator: Arc<Isolator>,
    pending: Arc<PendingReplies>,
}

impl ModuleSource for ModuleMemory {
    fn module_figures(&self) -> ModuleFigures {
        let (bytes, blocks) = crate::heap::live();
        let mut entries: Vec<(String, u64)> = match self.isolator.tracked_entries() {
            Ok(tables) => tables
                .into_iter()
                .map(|(name, n)| (name.to_owned(), n as u64))
                .collect(),
            Err(error) => {
                tracing::warn!(error = %error, "no isolator table sizes for metrics");
                Vec::new()
            }
        };
        let pending = self
            .pending
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len();
        entries.push(("pending_replies".to_owned(), pending as u64));
        ModuleFigures {
            heap_bytes: bytes as u64,
            heap_blocks: blocks as u64,
            entries,
        }
    }
}

/// The isolator of one agent, as C sees it through an opaque pointer.
#[derive(Debug)]
pub struct MgpuIsolator {
    isolator: Arc<Isolator>,
    metrics: Metrics,
    /// The agent this module runs in, for the framework names (its `/state`) of the holders
    /// the module reports; `None` outside an agent.
    agent: Option<Arc<MesosAgent>>,
    inventory: Inventory,
    /// The `mig-<profile>` resources the node offers (mixed strategy), by name: the kind of
    /// MIG device each stands for.
    mig_profiles: std::collections::BTreeMap<String, Option<mesos_gpu_placement::mig::MigKind>>,
    /// Shared with the metrics, which count its entries.
    pending: Arc<PendingReplies>,
    poisoned: AtomicBool,
    /// Starts the MPS daemons' supervisor once (at the first `recover`).
    mps_supervisor: std::sync::Once,
    #[cfg(feature = "testing")]
    debug_panic_on: Option<String>,
}

impl MgpuIsolator {
    /// Discovers the GPUs, scans the device nodes, finds (or builds) the driver volume and
    /// creates the isolator, from the module parameters.
    pub(crate) fn new(params: &Parameters) -> Result<MgpuIsolator, FfiError> {
        let mut params = ModuleParams::parse(params)?;
        let agent = crate::params::running_agent()?;
        if let Some(agent) = &agent {
            params.apply_agent(agent, crate::params::host_cgroup_version)?;
        }
        // The default library goes through the loader's search, and its absence means "no
        // driver"; a library named in `nvml_lib` that cannot be loaded is an error of its own.
        let named = (params.config.nvml_lib != Path::new(DEFAULT_NVML_LIB))
            .then_some(&params.config.nvml_lib);
        let driver = match GpuDriver::open_at(named.map(PathBuf::as_path), &params.config.proc_root)
            .map_err(|source| ParamError::Discovery { source })?
        {
            Discovery::Driver(driver) => driver,
            Discovery::NoDriver(inventory) => {
                let reason = inventory
                    .absent_reason
                    .unwrap_or_else(|| "no reason given".to_owned());
                return Err(ParamError::NoDriver { reason }.into());
            }
        };
        let driver: Arc<GpuDriver> = Arc::from(driver);
        let inventory = driver.inventory().clone();
        if let Some(agent) = &agent {
            params.check_agent_resources(agent, &inventory)?;
        }
        let nodes = DeviceNodes::scan(&params.config.dev_root, &inventory).map_err(|source| {
            ParamError::Devices {
                dev_root: params.config.dev_root.clone(),
                source,
            }
        })?;
        let driver_volume = match &inventory.driver {
            Some(info) => params.resolve_volume(&info.version)?,
            None => None,
        };
        let mut config = params.config.isolator.clone();
        let pool_dir = config.pool.as_ref().map(|p| p.dir.clone());
        config.driver_volume = driver_volume;
        if config.pinning.enabled {
            config.pinning.affinities = driver.affinities();
        }
        // MIG capability nodes live under the same device root as the GPU nodes.
        config.mig.dev_root.clone_from(&params.config.dev_root);
        config.mig.proc_root.clone_from(&params.config.proc_root);
        if let Some(sharing) = &mut config.sharing {
            // Shared GPUs go to EXCLUSIVE_PROCESS while their MPS daemon runs.
            sharing.mps.compute_modes = Some(Arc::clone(&driver) as Arc<dyn ComputeModes>);
        }
        let mut isolator = Isolator::new(config, inventory.clone(), nodes)
            .map_err(|source| ParamError::Isolator { source })?;
        // The pool's reconciliation (at recovery, and when a task finds too few GPUs) asks the
        // daemon a Docker reservation names whether its container still runs.
        isolator.set_docker_daemons(Arc::new(EngineDaemons::new()));
        // The isolator keeps the NVML session open for the agent's lifetime (health, usage).
        let mut recovery = params.config.health_recovery.clone();
        if let Some(r) = &mut recovery {
            // The default probe is `mesos-gpu gpu probe`: it must open the same driver library.
            r.probe.env.push((
                "MESOS_GPU_NVML_LIB".to_owned(),
                driver.library().display().to_string(),
            ));
        }
        let health = MonitorConfig {
            policy: params.config.health_checks.clone(),
            recovery,
            ..MonitorConfig::default()
        };
        isolator
            .attach_health(Arc::clone(&driver), health)
            .map_err(|source| ParamError::Isolator { source })?;
        let isolator = Arc::new(isolator);
        let mut figures =
            NvmlFigures::new(driver).with_allocator(isolator.clone(), None, UsageReader::default());
        // The pool's other records (Docker tasks of `docker-args`) are containers too.
        if let Some(dir) = pool_dir {
            figures = figures.with_holdings(Arc::new(PoolHoldings::at(dir)));
        }
        let agent = MesosAgent::of_this_agent().map(Arc::new);
        if let Some(agent) = &agent {
            figures = figures.with_agent(Arc::clone(agent) as Arc<dyn AgentHolders>);
        }
        if let Some(monitor) = isolator.health_monitor() {
            figures = figures.with_health(monitor);
        }
        let pending = Arc::new(Mutex::new(HashMap::new()));
        figures = figures.with_module(Arc::new(ModuleMemory {
            isolator: Arc::clone(&isolator),
            pending: Arc::clone(&pending),
        }));
        Ok(MgpuIsolator {
            metrics: Metrics::new(Arc::new(figures), metrics::DEFAULT_CACHE),
            agent,
            isolator,
            mig_profiles: MigOffer::of(&inventory, MigStrategy::Mixed)
                .profiles
                .into_iter()
                .map(|p| (p.resource, p.kind))
                .collect(),
            inventory,
            pending,
            poisoned: AtomicBool::new(false),
            mps_supervisor: std::sync::Once::new(),
            #[cfg(feature = "testing")]
            debug_panic_on: params.debug_panic_on.clone(),
        })
    }

    /// True once a call on this handle panicked.
    pub(crate) fn is_poisoned(&self) -> bool {
        self.poisoned.load(Ordering::Acquire)
    }

    /// Refuses every later call.
    pub(crate) fn poison(&self) {
        self.poisoned.store(true, Ordering::Release);
    }

    /// Panics in `call` when the `debug_panic_on` module parameter names it (`testing` builds).
    fn panic_point(&self, call: &str) {
        #[cfg(feature = "testing")]
        if self.debug_panic_on.as_deref() == Some(call) {
            panic!("forced panic in {call} (module parameter debug_panic_on)");
        }
        let _ = call;
    }

    /// Rebuilds the state after an agent restart.
    pub(crate) fn recover(&self, info: &ContainerRecoverInfo) -> Result<(), FfiError> {
        self.panic_point("recover");
        let states = info
            .checkpointed_container_states
            .iter()
            .map(convert::recover_state)
            .collect::<Result<Vec<_>, _>>()?;
        let orphans = info
            .orphan_container_ids
            .iter()
            .map(convert::container_id)
            .collect::<Result<Vec<_>, _>>()?;
        let report = self.isolator.recover(&states, &orphans)?;
        for issue in &report.issues {
            tracing::warn!(?issue, "recovery found an inconsistency");
        }
        if let Some(unchecked) = &report.unchecked {
            tracing::warn!(records = %unchecked, "kept GPU records this process cannot check as they were written; none of their GPUs is granted");
        }
        if self.isolator.supervises_mps() {
            self.mps_supervisor
                .call_once(|| supervise_mps(Arc::downgrade(&self.isolator)));
        }
        tracing::info!(
            recovered = report.recovered.len(),
            orphans = report.orphans.len(),
            issues = report.issues.len(),
            "recovered GPU containers"
        );
        Ok(())
    }

    /// Prepares a container and answers its `ContainerLaunchInfo`; no bytes (Mesos's `None`) for
    /// a `DEBUG` container, which shares everything with its parent but is still registered so
    /// that `isolate` and `cleanup` know it, and for a container that needs no mount and no
    /// environment (no GPU, no image), as Mesos's `gpu/nvidia` answers.
    pub(crate) fn prepare(
        &self,
        id: &mesos::ContainerId,
        config: &ContainerConfig,
    ) -> Result<Vec<u8>, FfiError> {
        timed("prepare", id, || {
            self.panic_point("prepare");
            let cid = convert::container_id(id)?;
            let mut prepare = convert::prepare_config(id, config)?;
            prepare.mig = self.mig_request(id, &config.resources)?;
            let info = self.isolator.prepare(&cid, prepare)?;
            if convert::is_debug(config) || !info.needs_launch_info() {
                return Ok(Vec::new());
            }
            Ok(convert::launch_info(&info).encode_to_vec())
        })
    }

    /// The MIG devices `resources` ask for by kind: each `mig-<profile>` scalar the agent
    /// offers with the mixed strategy (`agent-flags --mig-strategy mixed`), a whole number.
    fn mig_request(
        &self,
        id: &mesos::ContainerId,
        resources: &[crate::proto::mesos::Resource],
    ) -> Result<std::collections::BTreeMap<mesos_gpu_placement::mig::MigKind, u32>, FfiError> {
        let mut out = std::collections::BTreeMap::new();
        for (name, count) in crate::hook::mig_counts(&id.to_string(), resources)? {
            let Some(&Some(kind)) = self.mig_profiles.get(&name) else {
                let known: Vec<&str> = self.mig_profiles.keys().map(String::as_str).collect();
                return Err(FfiError::MigResource {
                    container: id.to_string(),
                    name,
                    known: if known.is_empty() {
                        "none".to_owned()
                    } else {
                        known.join(", ")
                    },
                });
            };
            *out.entry(kind).or_insert(0) += count;
        }
        Ok(out)
    }

    /// Moves `pid` into the container's cgroup.
    pub(crate) fn isolate(&self, id: &mesos::ContainerId, pid: i32) -> Result<(), FfiError> {
        timed("isolate", id, || {
            self.panic_point("isolate");
            let cid = convert::container_id(id)?;
            let pid = u32::try_from(pid)
                .ok()
                .filter(|&p| p > 0)
                .ok_or(FfiError::BadPid { got: pid })?;
            Ok(self.isolator.isolate(&cid, pid)?)
        })
    }

    /// Waits up to `timeout` (`None`: until cleanup) for a limitation of the container.
    pub(crate) fn watch(
        &self,
        id: &mesos::ContainerId,
        timeout: Option<Duration>,
    ) -> Result<Vec<u8>, FfiError> {
        self.panic_point("watch");
        let cid = convert::container_id(id)?;
        match self.isolator.watch(&cid, timeout)? {
            Some(limitation) => Ok(convert::limitation(&limitation).encode_to_vec()),
            None => {
                // Woken by cleanup (the container is gone) or timed out.
                self.isolator.status(&cid)?;
                let timeout_ms = timeout.map_or(u64::MAX, |t| {
                    u64::try_from(t.as_millis()).unwrap_or(u64::MAX)
                });
                Err(FfiError::TimedOut {
                    container: cid.to_string(),
                    timeout_ms,
                })
            }
        }
    }

    /// The operator's word that `gpu` (an NVML index or a `GPU-…` UUID) is healthy again: it
    /// returns to the pool.
    pub(crate) fn mark_healthy(&self, gpu: &str) -> Result<(), FfiError> {
        self.panic_point("mark_healthy");
        let gpu = GpuRef::parse(gpu).map_err(|source| FfiError::GpuRef { source })?;
        match self.isolator.mark_healthy(&gpu)? {
            Some(change) => {
                tracing::info!(gpu = change.index, uuid = %change.uuid, "GPU marked healthy")
            }
            None => tracing::info!(%gpu, "GPU marked healthy was healthy already"),
        }
        Ok(())
    }

    /// Grows or shrinks the container's GPUs to the `gpus` of `requests.resources`.
    pub(crate) fn update(
        &self,
        id: &mesos::ContainerId,
        requests: &ContainerConfig,
    ) -> Result<(), FfiError> {
        timed("update", id, || {
            self.panic_point("update");
            let cid = convert::container_id(id)?;
            let gpus = convert::requested_gpus(id, &requests.resources)?;
            Ok(self.isolator.update(&cid, gpus)?)
        })
    }

    /// The container's `ResourceStatistics`.
    pub(crate) fn usage(&self, id: &mesos::ContainerId) -> Result<Vec<u8>, FfiError> {
        self.panic_point("usage");
        let cid = convert::container_id(id)?;
        let usage = self.isolator.usage(&cid)?;
        tracing::trace!(gpus = usage.gpus.len(), "usage");
        Ok(convert::resource_statistics(SystemTime::now(), &usage).encode_to_vec())
    }

    /// This node's GPU metrics as OpenMetrics text: NVML figures, health, and the allocator's
    /// owners, states and counters (`mesos_gpu_docker::metrics`).
    pub(crate) fn metrics(&self) -> Result<Vec<u8>, FfiError> {
        self.panic_point("metrics");
        let text = self.metrics.render().map_err(|_| FfiError::Metrics)?;
        Ok(text.as_bytes().to_vec())
    }

    /// Every container's GPUs, health and NVML figures as JSON (`containers.rs`), for the
    /// agent endpoint `/mesos-gpu/containers`.
    pub(crate) fn containers(&self) -> Result<Vec<u8>, FfiError> {
        self.panic_point("containers");
        let agent = self.agent.as_deref().map(|a| a as &dyn AgentHolders);
        let view = crate::containers::view(&self.isolator, agent)?;
        serde_json::to_vec(&view).map_err(|source| FfiError::Containers { source })
    }

    /// The container's `ContainerStatus`.
    pub(crate) fn status(&self, id: &mesos::ContainerId) -> Result<Vec<u8>, FfiError> {
        self.panic_point("status");
        let cid = convert::container_id(id)?;
        self.isolator.status(&cid)?;
        Ok(convert::container_status(id).encode_to_vec())
    }

    /// Cleans the container up; an unknown container is not an error.
    pub(crate) fn cleanup(&self, id: &mesos::ContainerId) -> Result<(), FfiError> {
        timed("cleanup", id, || {
            self.panic_point("cleanup");
            let cid = convert::container_id(id)?;
            self.isolator.cleanup(&cid)?;
            self.forget(&cid, Replayable::Prepare);
            Ok(())
        })
    }

    /// Releases a Docker container's GPUs; an unknown container is not an error.
    pub(crate) fn docker_release(&self, id: &mesos::ContainerId) -> Result<(), FfiError> {
        timed("docker_release", id, || {
            self.panic_point("docker_release");
            let cid = convert::container_id(id)?;
            self.isolator.release_docker(&cid)?;
            Ok(())
        })
    }

    /// The agent's `resources`, `attributes` and `nvidia_gpu_devices` flags for this node's
    /// GPUs, from the agent's own `resources`, `nvidia_gpu_devices` and `attributes`.
    pub(crate) fn agent_resources(&self, flags: &Parameters) -> Result<Vec<u8>, FfiError> {
        self.panic_point("agent_resources");
        const KEYS: [&str; 3] = ["resources", "nvidia_gpu_devices", "attributes"];
        for p in &flags.parameter {
            if !KEYS.contains(&p.key.as_str()) {
                return Err(FfiError::UnknownFlag { key: p.key.clone() });
            }
        }
        let get = |key: &str| {
            flags
                .parameter
                .iter()
                .find(|p| p.key == key)
                .map(|p| p.value.as_str())
        };
        let agent_err = |source| FfiError::AgentFlags { source };
        let parsed = AgentGpuFlags::parse(
            GPU_ISOLATOR,
            get("resources"),
            get("nvidia_gpu_devices"),
            get("attributes"),
            DEVICES_FLAG,
        )
        .map_err(agent_err)?;
        let resolved = parsed.resolve(&self.inventory).map_err(agent_err)?;
        let mut out = Vec::new();
        let mut put = |key: &str, value: String| {
            if !value.is_empty() {
                out.push(Parameter {
                    key: key.to_owned(),
                    value,
                });
            }
        };
        put("resources", resolved.resources);
        put("attributes", resolved.attributes);
        let devices = resolved
            .devices
            .map(|d| d.iter().map(u32::to_string).collect::<Vec<_>>().join(","));
        put("nvidia_gpu_devices", devices.unwrap_or_default());
        Ok(Parameters { parameter: out }.encode_to_vec())
    }

    /// Runs `compute` and hands its answer to `deliver`; when `deliver` refuses it (buffer too
    /// small), keeps it so that a retry with the same `request` gets the same bytes without
    /// running `compute` again.
    pub(crate) fn replay<T>(
        &self,
        call: Replayable,
        container: &str,
        request: &[u8],
        compute: impl FnOnce() -> Result<Vec<u8>, FfiError>,
        deliver: impl FnOnce(&[u8]) -> Result<T, FfiError>,
    ) -> Result<T, FfiError> {
        let mut pending = self.pending();
        let key = (call, container.to_owned());
        if let Some(kept) = pending.get(&key) {
            if kept.request != request {
                return Err(FfiError::RetryMismatch {
                    call: call.name(),
                    container: container.to_owned(),
                });
            }
            let delivered = deliver(&kept.reply)?;
            pending.remove(&key);
            return Ok(delivered);
        }
        let reply = compute()?;
        match deliver(&reply) {
            Err(e @ FfiError::BufferTooSmall { .. }) => {
                pending.insert(
                    key,
                    Pending {
                        request: request.to_owned(),
                        reply,
                    },
                );
                Err(e)
            }
            other => other,
        }
    }

    fn forget(&self, id: &ContainerId, call: Replayable) {
        self.pending().remove(&(call, id.to_string()));
    }

    fn pending(&self) -> MutexGuard<'_, HashMap<(Replayable, String), Pending>> {
        // The map is only inserted into or removed from; a panic cannot leave an entry half made.
        self.pending.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// How often the MPS daemons of shared GPUs are checked.
const MPS_SUPERVISION: std::time::Duration = std::time::Duration::from_secs(5);

/// Serves one call through `f`, then logs its time in µs and where it went
/// ([`mesos_gpu_enforce::timing`]): one line per call, so a bench can attribute an agent's
/// launch (issue 36). The log line is written after the call, outside every lock.
pub(crate) fn timed<T>(
    call: &'static str,
    container: &dyn std::fmt::Display,
    f: impl FnOnce() -> Result<T, FfiError>,
) -> Result<T, FfiError> {
    let _ = timing::take();
    let start = Instant::now();
    let result = f();
    let us = start.elapsed().as_micros();
    let steps = timing::take();
    tracing::info!(call, container = %container, us, ok = result.is_ok(), %steps, "served call");
    result
}

/// Checks the MPS daemons now (restoring those recorded before an agent restart) and every
/// [`MPS_SUPERVISION`] on a thread of its own, until the isolator is gone.
fn supervise_mps(isolator: std::sync::Weak<Isolator>) {
    let spawned = std::thread::Builder::new()
        .name("mesos-gpu-mps".into())
        .spawn(move || {
            while let Some(isolator) = isolator.upgrade() {
                match isolator.supervise_mps() {
                    Ok(restarts) => {
                        for r in restarts {
                            tracing::warn!(gpu = %r.gpu, why = %r.why, failed = ?r.failed, owners = ?r.owners, "MPS control daemon found dead");
                        }
                    }
                    Err(e) => tracing::error!(error = %mesos_gpu_os::error_chain(&e), "cannot supervise the MPS daemons"),
                }
                drop(isolator);
                std::thread::sleep(MPS_SUPERVISION);
            }
        });
    if let Err(e) = spawned {
        tracing::error!(error = %e, "cannot start the MPS daemons' supervisor; dead daemons are started again at the next share of their GPU");
    }
}
