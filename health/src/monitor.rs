//! The health event loop: one per agent, on a dedicated thread, blocked in
//! `nvmlEventSetWait_v2` until NVML reports an XID, an ECC error or a lost GPU.
//!
//! Facts relied on (`docs/reference/gpu-health.md` §1, `nvml.md` §2 and §4, `nvml.h`):
//! - NVML delivers only events registered (`nvmlDeviceRegisterEvents`) before they happen;
//!   the mask is `XidCriticalError | DoubleBitEccError | SingleBitEccError` ANDed with
//!   `nvmlDeviceGetSupportedEventTypes`. A GPU that supports none of them, or whose
//!   registration is `NOT_SUPPORTED`, is logged and stays healthy, unwatched (device plugin
//!   PR #1562). Any other registration error marks that GPU unhealthy ("unwatchable").
//! - nvml-wrapper's `register_events` frees the set when registration fails, so the loop then
//!   builds a new set and registers the other GPUs again.
//! - `nvmlEventSetWait_v2` returns `NVML_ERROR_TIMEOUT` when nothing happened, and
//!   `NVML_ERROR_GPU_IS_LOST` when a GPU fell off the bus. Calls on a lost GPU's handle answer
//!   `GPU_IS_LOST`, so the event's device cannot always name itself: the loop then asks every
//!   GPU and marks those answering `GPU_IS_LOST` lost.
//! - Any other wait error is a failure of the loop, not of the GPUs (the device plugin marks every
//!   GPU unhealthy here, `gpu-health.md` §1): it is logged, counted, and the loop starts again with
//!   a new event set after an exponential backoff. Events during the gap are not seen.
//! - Single-bit (corrected) ECC errors are counted, never acted on.
//! - At a counted event the driver's evidence is read (`super::evidence`): the error counters
//!   then, and whether it asks for a reset, which the owner's limitation says.
//! - Recovery (`super::recovery`): every wait timeout the loop looks for GPUs whose recovery
//!   check is due, reads the evidence, and when it holds starts the probe on a thread of its
//!   own (`gpu-probe`), so events keep being seen while it runs; its outcome is applied at a
//!   later turn, unless a counted error arrived meanwhile.

use std::collections::HashMap;
use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, mpsc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use mesos_gpu_os::ErrorChain;
use nvml_wrapper::Nvml;
use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enums::event::XidError;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::event::EventSet;
use nvml_wrapper::struct_wrappers::event::EventData;
use serde::Serialize;

use super::HealthError;
use super::evidence;
use super::policy::HealthPolicy;
use super::probe::{ProbeOutcome, ProbeTarget, run_probe};
use super::recovery::{Check, Finding, RecoveryConfig};
use super::state::{
    AtEvent, Due, Failure, GpuHealth, GpuRecord, GpuRef, HealthChange, HealthSnapshot, HealthState,
};
use super::store::{HealthStore, RequestAnswer, StoreLock};
use mesos_gpu_node::discovery::EventInstance;
use mesos_gpu_node::discovery::GpuDriver;
use mesos_gpu_node::inventory::Gpu;

/// How long a starting monitor waits for the health lock to be let go.
const LOCK_WAIT: Duration = Duration::from_secs(2);

/// Called on the monitor thread for every health change, before channel subscribers hear of it.
pub type ChangeCallback = Arc<dyn Fn(&HealthChange) + Send + Sync>;

/// How the monitor runs.
#[derive(Debug, Clone)]
pub struct MonitorConfig {
    /// Which events count.
    pub policy: HealthPolicy,
    /// How GPUs come back by themselves on evidence; `None`: only `mark_healthy` brings them
    /// back.
    pub recovery: Option<RecoveryConfig>,
    /// The `nvmlEventSetWait_v2` timeout: how often the loop looks at the quiet periods,
    /// operator requests and its stop flag. Events are seen at once whatever its value.
    pub wait_timeout: Duration,
    /// First wait after the event loop fails; doubled on each failure in a row.
    pub retry_min: Duration,
    /// Longest wait between restarts of a failing event loop.
    pub retry_max: Duration,
    /// The agent work directory for the checkpoint and requests ([`HealthStore`]); `None`
    /// keeps health in memory only.
    pub work_dir: Option<std::path::PathBuf>,
}

impl Default for MonitorConfig {
    fn default() -> MonitorConfig {
        MonitorConfig {
            policy: HealthPolicy::default(),
            recovery: None,
            wait_timeout: Duration::from_millis(250),
            retry_min: Duration::from_millis(100),
            retry_max: Duration::from_secs(10),
            work_dir: None,
        }
    }
}

/// What the event loop has done, for metrics and tests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct LoopStats {
    /// `nvmlEventSetWait_v2` calls that returned an event or a timeout.
    pub waits: u64,
    /// Events received.
    pub events: u64,
    /// Event sets created and registered (1, plus one per restart that got that far).
    pub registrations: u64,
    /// Times the event loop failed (set creation or wait errors) and was restarted.
    pub loop_failures: u64,
}

/// A probe running on its thread.
struct Probing {
    outcome: mpsc::Receiver<ProbeOutcome>,
    started_ms: u64,
    uuid: String,
    findings: Vec<Finding>,
}

struct Shared {
    driver: Arc<GpuDriver>,
    recovery: Option<RecoveryConfig>,
    probes: Mutex<HashMap<u32, Probing>>,
    state: Mutex<HealthState>,
    /// Held from a change of `state` until its publication, by every path that changes and
    /// publishes: subscribers (the allocator) then see changes in the order `state` took them.
    /// Without it an operator's "healthy" and an event's "failed" for the same GPU could reach
    /// the allocator in the other order than the state took them, leaving the two disagreeing.
    order: Mutex<()>,
    policy: HealthPolicy,
    callbacks: Mutex<Vec<ChangeCallback>>,
    channels: Mutex<Vec<mpsc::Sender<HealthChange>>>,
    store: Option<HealthStore>,
    stop: AtomicBool,
    waits: AtomicU64,
    events: AtomicU64,
    registrations: AtomicU64,
    loop_failures: AtomicU64,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panicking subscriber is caught before it can poison anything; recover regardless.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// The node's GPU health monitor: owns the event-loop thread, stopped and joined on drop.
pub struct HealthMonitor {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
    _lock: Option<StoreLock>,
}

impl std::fmt::Debug for HealthMonitor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HealthMonitor")
            .field("policy", &self.shared.policy.to_string())
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

impl HealthMonitor {
    /// Starts the monitor over `driver`'s GPUs. With a work directory it takes the store's
    /// lock (refusing when another monitor holds it) and reads the checkpoint back; each
    /// `callbacks` entry then hears a `restored` change for every GPU checkpointed unhealthy,
    /// before this returns, so the caller can take those GPUs out of its pool.
    pub fn start(
        driver: Arc<GpuDriver>,
        config: MonitorConfig,
        callbacks: Vec<ChangeCallback>,
    ) -> Result<HealthMonitor, HealthError> {
        let store = config.work_dir.as_deref().map(HealthStore::at);
        let lock = match &store {
            Some(store) => {
                Some(
                    store
                        .lock_within(LOCK_WAIT)?
                        .ok_or_else(|| HealthError::InUse {
                            path: store.checkpoint_path(),
                        })?,
                )
            }
            None => None,
        };
        let flap_window = config
            .recovery
            .as_ref()
            .map_or(Duration::from_secs(3600), |r| r.flap_window);
        let mut state = HealthState::new(driver.inventory(), flap_window, now_ms());
        let restored = match store.as_ref().map(HealthStore::load).transpose()?.flatten() {
            Some(snapshot) => state.restore(&snapshot)?,
            None => Vec::new(),
        };
        let shared = Arc::new(Shared {
            driver: Arc::clone(&driver),
            recovery: config.recovery.clone(),
            probes: Mutex::new(HashMap::new()),
            state: Mutex::new(state),
            order: Mutex::new(()),
            policy: config.policy.clone(),
            callbacks: Mutex::new(callbacks),
            channels: Mutex::new(Vec::new()),
            store,
            stop: AtomicBool::new(false),
            waits: AtomicU64::new(0),
            events: AtomicU64::new(0),
            registrations: AtomicU64::new(0),
            loop_failures: AtomicU64::new(0),
        });
        publish(&shared, restored);
        // Written at every start, so a work directory with a monitor always has a checkpoint and
        // one without (a wrong `--agent-work-dir`) can be told apart.
        save(&shared);
        let recovery = config.recovery.as_ref().map_or_else(
            || "off (only `gpu mark-healthy` brings GPUs back)".to_owned(),
            |r| {
                format!(
                    "on evidence: quiet {}, retries {}s to {}s, probe `{}`{}",
                    r.quiet,
                    r.retry_min.as_secs(),
                    r.retry_max.as_secs(),
                    r.probe.describe(),
                    if r.probe.cgroup.is_some() {
                        " in a one-GPU cgroup"
                    } else {
                        ""
                    }
                )
            },
        );
        let thread_shared = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("gpu-health".to_owned())
            .spawn(move || run(&driver, &thread_shared, &config))
            .map_err(|source| HealthError::Thread { source })?;
        tracing::info!(policy = %shared.policy.describe(), %recovery, "GPU health monitor started");
        Ok(HealthMonitor {
            shared,
            thread: Some(thread),
            _lock: lock,
        })
    }

    /// A channel that receives every later health change.
    pub fn subscribe(&self) -> mpsc::Receiver<HealthChange> {
        let (tx, rx) = mpsc::channel();
        lock(&self.shared.channels).push(tx);
        rx
    }

    /// The health of GPU `index`, `None` for an unknown index.
    pub fn health(&self, index: u32) -> Option<GpuHealth> {
        lock(&self.shared.state)
            .get(index)
            .map(|g| g.health.clone())
    }

    /// Every GPU's record (health, XID and ECC counts).
    pub fn records(&self) -> Vec<GpuRecord> {
        lock(&self.shared.state).gpus().to_vec()
    }

    /// The state as checkpointed.
    pub fn snapshot(&self) -> HealthSnapshot {
        lock(&self.shared.state).snapshot()
    }

    /// The operator's word: `gpu` is healthy again. Subscribers hear of it and the checkpoint
    /// is updated. `Ok(None)` when it already was healthy; refused while NVML still reports the
    /// GPU lost or the driver asks for a reset or reboot.
    pub fn mark_healthy(&self, gpu: &GpuRef) -> Result<Option<HealthChange>, HealthError> {
        let _order = lock(&self.shared.order);
        let change = mark(&self.shared, gpu)?;
        if let Some(change) = &change {
            publish(&self.shared, vec![change.clone()]);
        }
        Ok(change)
    }

    /// What the event loop has done so far.
    pub fn stats(&self) -> LoopStats {
        LoopStats {
            waits: self.shared.waits.load(Ordering::Relaxed),
            events: self.shared.events.load(Ordering::Relaxed),
            registrations: self.shared.registrations.load(Ordering::Relaxed),
            loop_failures: self.shared.loop_failures.load(Ordering::Relaxed),
        }
    }

    /// The policy in force.
    pub fn policy(&self) -> &HealthPolicy {
        &self.shared.policy
    }

    /// What keeps `gpu` out of the pool (the evidence missing), one line each; empty when it
    /// is healthy.
    pub fn missing_evidence(&self, gpu: &GpuRef) -> Result<Vec<String>, HealthError> {
        let snapshot = self.snapshot();
        let record = snapshot.find(gpu).ok_or_else(|| HealthError::UnknownGpu {
            gpu: gpu.to_string(),
            known: snapshot
                .gpus
                .iter()
                .map(|g| format!("{} {}", g.index, g.uuid))
                .collect::<Vec<_>>()
                .join(", "),
        })?;
        let mut missing = record.recovery.missing();
        if self.shared.recovery.is_none() && !record.health.is_healthy() {
            missing.push("automatic recovery is off".to_owned());
        }
        Ok(missing)
    }
}

impl Drop for HealthMonitor {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take()
            && thread.join().is_err()
        {
            tracing::error!("the GPU health thread panicked");
        }
    }
}

/// Logs, tells callbacks then channels, and checkpoints.
fn publish(shared: &Shared, changes: Vec<HealthChange>) {
    if changes.is_empty() {
        return;
    }
    let callbacks = lock(&shared.callbacks).clone();
    for change in &changes {
        match change.limitation() {
            Some(limitation) => {
                tracing::warn!(gpu = change.index, uuid = %change.uuid, restored = change.restored, "{limitation}")
            }
            None => tracing::info!(gpu = change.index, uuid = %change.uuid, "GPU healthy again"),
        }
        for callback in &callbacks {
            if panic::catch_unwind(AssertUnwindSafe(|| callback(change))).is_err() {
                tracing::error!(gpu = change.index, "a GPU health subscriber panicked");
            }
        }
        lock(&shared.channels).retain(|tx| tx.send(change.clone()).is_ok());
    }
    save(shared);
}

fn save(shared: &Shared) {
    if let Some(store) = &shared.store {
        let snapshot = lock(&shared.state).snapshot();
        if let Err(error) = store.save(&snapshot) {
            tracing::error!(error = %ErrorChain(&error), "cannot checkpoint GPU health");
        }
    }
}

/// The thread: watch until stopped, restarting a failed loop with backoff.
fn run(driver: &GpuDriver, shared: &Shared, config: &MonitorConfig) {
    let mut backoff = config.retry_min;
    while !shared.stop.load(Ordering::Relaxed) {
        let result = if shared.policy.is_off() {
            idle(shared, config)
        } else {
            watch(driver, shared, config, &mut backoff)
        };
        let Err(error) = result else {
            break;
        };
        shared.loop_failures.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(
            error = %ErrorChain(&error),
            retry_in_ms = u64::try_from(backoff.as_millis()).unwrap_or(u64::MAX),
            "GPU health event loop failed; GPUs keep their health, retrying"
        );
        let until = Instant::now() + backoff;
        while !shared.stop.load(Ordering::Relaxed) && Instant::now() < until {
            std::thread::sleep(
                config
                    .wait_timeout
                    .min(until.saturating_duration_since(Instant::now())),
            );
            housekeeping(shared);
        }
        backoff = (backoff * 2).min(config.retry_max);
    }
    tracing::debug!("GPU health monitor stopped");
}

/// Checks off: only quiet periods and operator requests.
fn idle(shared: &Shared, config: &MonitorConfig) -> Result<(), NvmlError> {
    tracing::info!("GPU health checks are off");
    while !shared.stop.load(Ordering::Relaxed) {
        std::thread::sleep(config.wait_timeout);
        housekeeping(shared);
    }
    Ok(())
}

/// One life of the event loop: register, then wait until stopped (`Ok`) or a wait fails.
fn watch(
    driver: &GpuDriver,
    shared: &Shared,
    config: &MonitorConfig,
    backoff: &mut Duration,
) -> Result<(), NvmlError> {
    let nvml = driver.nvml();
    let gpus = &driver.inventory().gpus;
    let set = register(nvml, gpus, shared)?;
    let timeout = u32::try_from(config.wait_timeout.as_millis()).unwrap_or(u32::MAX);
    shared.registrations.fetch_add(1, Ordering::Relaxed);
    probe_lost(nvml, gpus, shared, None);
    while !shared.stop.load(Ordering::Relaxed) {
        match mesos_gpu_node::discovery::wait_event(nvml, &set, timeout) {
            Ok((event, instance)) => {
                *backoff = config.retry_min;
                shared.waits.fetch_add(1, Ordering::Relaxed);
                shared.events.fetch_add(1, Ordering::Relaxed);
                handle(nvml, gpus, shared, event, instance);
            }
            Err(NvmlError::Timeout) => {
                *backoff = config.retry_min;
                shared.waits.fetch_add(1, Ordering::Relaxed);
            }
            Err(NvmlError::GpuLost) => probe_lost(nvml, gpus, shared, Some(79)),
            Err(error) => return Err(error),
        }
        housekeeping(shared);
    }
    Ok(())
}

/// An event set with every watchable GPU registered.
fn register<'n>(nvml: &'n Nvml, gpus: &[Gpu], shared: &Shared) -> Result<EventSet<'n>, NvmlError> {
    let wanted = EventTypes::CRITICAL_XID_ERROR
        | EventTypes::DOUBLE_BIT_ECC_ERROR
        | EventTypes::SINGLE_BIT_ECC_ERROR;
    let critical = EventTypes::CRITICAL_XID_ERROR | EventTypes::DOUBLE_BIT_ECC_ERROR;
    let mut skip: Vec<u32> = lock(&shared.state)
        .gpus()
        .iter()
        .filter(|g| g.health.failure().is_some_and(Failure::is_permanent))
        .map(|g| g.index)
        .collect();
    'fresh: loop {
        let mut set = nvml.create_event_set()?;
        for gpu in gpus {
            if skip.contains(&gpu.index) {
                continue;
            }
            let outcome = nvml.device_by_index(gpu.index).and_then(|device| {
                let mask = device.supported_event_types()? & wanted;
                Ok((device, mask))
            });
            let (device, mask) = match outcome {
                Ok(found) => found,
                Err(error) => {
                    registration_failed(shared, gpu, &error);
                    skip.push(gpu.index);
                    continue;
                }
            };
            if !mask.intersects(critical) {
                tracing::warn!(
                    gpu = gpu.index,
                    "GPU supports no XID or ECC events: too old for health checks; it stays healthy, unwatched"
                );
                skip.push(gpu.index);
                continue;
            }
            match device.register_events(mask, set) {
                Ok(registered) => set = registered,
                Err(error) => {
                    registration_failed(shared, gpu, &error.error);
                    skip.push(gpu.index);
                    continue 'fresh;
                }
            }
            tracing::debug!(gpu = gpu.index, mask = mask.bits(), "watching GPU events");
        }
        return Ok(set);
    }
}

fn registration_failed(shared: &Shared, gpu: &Gpu, error: &NvmlError) {
    let failure = match error {
        NvmlError::NotSupported => {
            tracing::warn!(
                gpu = gpu.index,
                "GPU cannot register events (NOT_SUPPORTED): too old for health checks; it stays healthy, unwatched"
            );
            return;
        }
        NvmlError::GpuLost if !shared.policy.counts_lost() => {
            tracing::warn!(
                gpu = gpu.index,
                "GPU is lost; lost GPUs are not counted by the health policy"
            );
            return;
        }
        NvmlError::GpuLost => Failure::Lost,
        other => Failure::Unwatchable {
            error: other.to_string(),
        },
    };
    let _order = lock(&shared.order);
    let change = lock(&shared.state).record(gpu.index, failure, now_ms(), &AtEvent::default());
    publish(shared, change.into_iter().collect());
}

/// What the driver says about GPU `index` at a counted event.
fn at_event(shared: &Shared, index: u32) -> AtEvent {
    let evidence = evidence::read(&shared.driver, index);
    AtEvent {
        baseline: evidence.baseline(),
        driver_asks: evidence.asks(),
    }
}

/// Acts on one event; an XID NVML attributes to a MIG `instance` of a GPU with MIG devices
/// there counts against those devices only.
fn handle(
    nvml: &Nvml,
    gpus: &[Gpu],
    shared: &Shared,
    event: EventData<'_>,
    instance: Option<EventInstance>,
) {
    let xid = match event.event_data {
        Some(XidError::Value(xid)) => Some(xid),
        Some(XidError::Unknown) | None => None,
    };
    let index = match event.device.index() {
        Ok(index) => index,
        Err(error) => {
            tracing::debug!(%error, "the event's GPU cannot name itself; looking for lost GPUs");
            probe_lost(nvml, gpus, shared, xid);
            return;
        }
    };
    let counted_xid = event.event_type.contains(EventTypes::CRITICAL_XID_ERROR)
        && xid.is_some_and(|x| shared.policy.counts_xid(x));
    let counted_ecc =
        event.event_type.contains(EventTypes::DOUBLE_BIT_ECC_ERROR) && shared.policy.counts_ecc();
    // Read before the state is locked: NVML calls take time.
    let at = if counted_xid || counted_ecc {
        at_event(shared, index)
    } else {
        AtEvent::default()
    };
    let _order = lock(&shared.order);
    let now = now_ms();
    let mut changes = Vec::new();
    let mut state = lock(&shared.state);
    if event.event_type.contains(EventTypes::CRITICAL_XID_ERROR) {
        match xid {
            Some(xid) => {
                state.count_xid(index, xid);
                let counted = shared.policy.counts_xid(xid);
                let on_mig = instance.and_then(|i| {
                    state.record_mig(index, i.gpu_instance, i.compute_instance, xid, counted, now)
                });
                if !counted {
                    tracing::info!(
                        gpu = index,
                        xid,
                        ?instance,
                        "XID ignored by the health policy"
                    );
                } else if let Some(mig_changes) = on_mig {
                    tracing::warn!(
                        gpu = index,
                        xid,
                        ?instance,
                        "XID on a MIG instance: its MIG devices leave the pool, the rest of the GPU stays"
                    );
                    changes.extend(mig_changes);
                } else {
                    changes.extend(state.record(index, Failure::Xid { xid }, now, &at));
                }
            }
            None => tracing::warn!(gpu = index, "XID event without an XID number"),
        }
    }
    if event.event_type.contains(EventTypes::DOUBLE_BIT_ECC_ERROR) {
        state.count_ecc(index, true);
        if shared.policy.counts_ecc() {
            changes.extend(state.record(index, Failure::DoubleBitEcc, now, &at));
        }
    }
    if event.event_type.contains(EventTypes::SINGLE_BIT_ECC_ERROR) {
        state.count_ecc(index, false);
        tracing::debug!(gpu = index, "single-bit ECC error (corrected)");
    }
    drop(state);
    if changes.is_empty() {
        save(shared);
    } else {
        publish(shared, changes);
    }
}

/// Asks every GPU not yet known lost whether it answers; marks those that say `GPU_IS_LOST`.
fn probe_lost(nvml: &Nvml, gpus: &[Gpu], shared: &Shared, xid: Option<u64>) {
    let _order = lock(&shared.order);
    let known_lost = |index: u32| {
        lock(&shared.state)
            .get(index)
            .is_some_and(|g| g.health.failure() == Some(&Failure::Lost))
    };
    let mut changes = Vec::new();
    let mut found = false;
    for gpu in gpus.iter().filter(|g| !known_lost(g.index)) {
        let answer = nvml.device_by_index(gpu.index).and_then(|d| d.uuid());
        if !matches!(answer, Err(NvmlError::GpuLost)) {
            continue;
        }
        found = true;
        let mut state = lock(&shared.state);
        if let Some(xid) = xid {
            state.count_xid(gpu.index, xid);
        }
        if shared.policy.counts_lost() {
            changes.extend(state.record(gpu.index, Failure::Lost, now_ms(), &AtEvent::default()));
        } else {
            tracing::warn!(
                gpu = gpu.index,
                "GPU is lost; lost GPUs are not counted by the health policy"
            );
        }
    }
    if !changes.is_empty() {
        publish(shared, changes);
    } else if found {
        save(shared);
    }
}

/// Marks `gpu` healthy in the state, unless NVML still answers `GPU_IS_LOST` for it or the
/// driver asks for a reset or reboot (it would be handed out and fail at once).
fn mark(shared: &Shared, gpu: &GpuRef) -> Result<Option<HealthChange>, HealthError> {
    let index = lock(&shared.state).index_of(gpu)?;
    if shared.driver.reports_lost(index) {
        return Err(HealthError::StillLost {
            gpu: gpu.to_string(),
        });
    }
    if let Some(asks) = evidence::read(&shared.driver, index).asks() {
        return Err(HealthError::DriverAsks {
            gpu: gpu.to_string(),
            asks,
        });
    }
    lock(&shared.state).mark_healthy(gpu)
}

/// Recovery's turn: applies the outcomes of probes that ended, then checks the GPUs due.
fn recover(shared: &Shared) {
    let Some(config) = &shared.recovery else {
        return;
    };
    let ended: Vec<(u32, Probing, ProbeOutcome)> = {
        let mut probes = lock(&shared.probes);
        let done: Vec<(u32, ProbeOutcome)> = probes
            .iter()
            .filter_map(|(&i, p)| match p.outcome.try_recv() {
                Ok(outcome) => Some((i, outcome)),
                Err(mpsc::TryRecvError::Empty) => None,
                Err(mpsc::TryRecvError::Disconnected) => Some((
                    i,
                    ProbeOutcome {
                        passed: false,
                        detail: "the probe thread ended without an outcome".to_owned(),
                        output: String::new(),
                    },
                )),
            })
            .collect();
        done.into_iter()
            .filter_map(|(i, outcome)| probes.remove(&i).map(|p| (i, p, outcome)))
            .collect()
    };
    for (index, probing, outcome) in ended {
        probed(shared, config, index, probing, outcome);
    }
    let now = now_ms();
    let due = lock(&shared.state).due(now, config);
    for d in due {
        if lock(&shared.probes).contains_key(&d.index) {
            continue;
        }
        attempt(shared, config, d, now);
    }
}

/// Checks the driver's evidence on a GPU that is due; starts its probe when it holds.
fn attempt(shared: &Shared, config: &RecoveryConfig, due: Due, now: u64) {
    let evidence = evidence::read(&shared.driver, due.index);
    let mut findings = vec![due.quiet.clone()];
    findings.extend(evidence.judge(&due.baseline));
    if !findings.iter().all(|f| f.ok) {
        let text = describe(&findings);
        let _order = lock(&shared.order);
        let wait = lock(&shared.state).attempt_failed(
            due.index,
            findings,
            false,
            evidence.asks(),
            now,
            config,
        );
        tracing::warn!(gpu = due.index, uuid = %due.uuid, next_check_in_s = wait.as_secs(), "GPU stays out of the pool: evidence missing: {text}");
        save(shared);
        return;
    }
    let minor = shared
        .driver
        .inventory()
        .by_index(due.index)
        .map_or(due.index, |g| g.minor);
    let target = ProbeTarget {
        index: due.index,
        uuid: due.uuid.clone(),
        minor,
    };
    let (tx, rx) = mpsc::channel();
    let probe = config.probe.clone();
    let spawned = std::thread::Builder::new()
        .name("gpu-probe".to_owned())
        .spawn(move || {
            let _ = tx.send(run_probe(&probe, &target));
        });
    if let Err(e) = spawned {
        tracing::error!(gpu = due.index, error = %e, "cannot start the GPU probe thread");
        return;
    }
    tracing::info!(gpu = due.index, uuid = %due.uuid, probe = %config.probe.describe(), "GPU recovery: evidence holds ({}); probing", describe(&findings));
    lock(&shared.probes).insert(
        due.index,
        Probing {
            outcome: rx,
            started_ms: now,
            uuid: due.uuid,
            findings,
        },
    );
}

/// Applies a probe's outcome: the GPU is back in the pool when it passed and no counted error
/// arrived while it ran.
fn probed(
    shared: &Shared,
    config: &RecoveryConfig,
    index: u32,
    probing: Probing,
    outcome: ProbeOutcome,
) {
    let _order = lock(&shared.order);
    let mut state = lock(&shared.state);
    let Some(last_error_ms) = state.last_error_ms(index) else {
        tracing::info!(
            gpu = index,
            "GPU probe ended after the GPU was marked healthy; outcome ignored"
        );
        return;
    };
    let mut findings = probing.findings;
    let now = now_ms();
    let interrupted = last_error_ms > probing.started_ms;
    findings.push(Finding {
        check: Check::Probe,
        ok: outcome.passed && !interrupted,
        detail: if interrupted {
            format!("a counted error arrived while it ran; {}", outcome.detail)
        } else {
            outcome.detail.clone()
        },
    });
    let text = describe(&findings);
    if outcome.passed && !interrupted {
        let change = state.recovered(index, findings, now);
        drop(state);
        tracing::info!(gpu = index, uuid = %probing.uuid, "GPU is back in the pool by itself: {text}");
        publish(shared, change.into_iter().collect());
        return;
    }
    let wait = state.attempt_failed(index, findings, !outcome.passed, None, now, config);
    drop(state);
    tracing::warn!(gpu = index, uuid = %probing.uuid, next_check_in_s = wait.as_secs(), output = ?outcome.output, "GPU stays out of the pool: the probe failed: {text}");
    save(shared);
}

/// `quiet time: ok (…); recovery action: MISSING (…); probe: FAILED (…)`.
fn describe(findings: &[Finding]) -> String {
    findings
        .iter()
        .map(Finding::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

/// Recovery and operator requests. A request is answered only after the checkpoint holds its
/// effect, so the requester never reads the state from before it.
fn housekeeping(shared: &Shared) {
    recover(shared);
    let _order = lock(&shared.order);
    let mut changes = Vec::new();
    let mut answers = Vec::new();
    if let Some(store) = &shared.store {
        for request in store.take_requests() {
            let gpu = &request.gpu;
            let missing = lock(&shared.state)
                .snapshot()
                .find(gpu)
                .map(|r| r.recovery.missing())
                .unwrap_or_default();
            let answer = match mark(shared, gpu) {
                Ok(change) => {
                    tracing::info!(%gpu, missing = ?missing, "operator marked GPU healthy");
                    let message = match &change {
                        Some(c) if missing.is_empty() => {
                            format!("GPU {} ({}) marked healthy", c.index, c.uuid)
                        }
                        Some(c) => format!(
                            "GPU {} ({}) marked healthy; the evidence that was missing: {}",
                            c.index,
                            c.uuid,
                            missing.join("; ")
                        ),
                        None => format!("GPU {gpu} is already healthy"),
                    };
                    changes.extend(change);
                    RequestAnswer { ok: true, message }
                }
                Err(error) => {
                    tracing::warn!(%gpu, %error, "cannot mark GPU healthy");
                    RequestAnswer {
                        ok: false,
                        message: error.to_string(),
                    }
                }
            };
            answers.push((request, answer));
        }
    }
    publish(shared, changes);
    if let Some(store) = &shared.store {
        for (request, answer) in answers {
            store.answer(request, &answer);
        }
    }
}
