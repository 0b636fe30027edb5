//! The health event loop: one per agent, on a dedicated thread, blocked in
//! `nvmlEventSetWait_v2` until NVML reports an XID, an ECC error or a lost GPU.
//!
//! Facts relied on (`shared/reference/gpu_sched.md` §1.1, `crates.md` §1, `nvml.h`):
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
//! - Any other wait error is a failure of the loop, not of the GPUs (the device plugin marks
//!   every GPU unhealthy here, §1.1): it is logged, counted, and the loop starts again with a
//!   new event set after an exponential backoff. Events during the gap are not seen.
//! - Single-bit (corrected) ECC errors are counted, never acted on.

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
use super::policy::HealthPolicy;
use super::state::{
    Failure, GpuHealth, GpuRecord, GpuRef, HealthChange, HealthSnapshot, HealthState,
};
use super::store::{HealthStore, RequestAnswer, StoreLock};
use crate::discovery::GpuDriver;
use crate::inventory::Gpu;
use crate::sys::nvml::EventInstance;

/// How long a starting monitor waits for the health lock to be let go.
const LOCK_WAIT: Duration = Duration::from_secs(2);

/// Called on the monitor thread for every health change, before channel subscribers hear of it.
pub type ChangeCallback = Arc<dyn Fn(&HealthChange) + Send + Sync>;

/// How the monitor runs.
#[derive(Debug, Clone)]
pub struct MonitorConfig {
    /// Which events count.
    pub policy: HealthPolicy,
    /// Error-free time after which an unhealthy GPU is healthy again; `None`: never by itself.
    pub quiet_period: Option<Duration>,
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
            quiet_period: None,
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

struct Shared {
    driver: Arc<GpuDriver>,
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
        let mut state = HealthState::new(driver.inventory(), config.quiet_period, now_ms());
        let restored = match store.as_ref().map(HealthStore::load).transpose()?.flatten() {
            Some(snapshot) => state.restore(&snapshot)?,
            None => Vec::new(),
        };
        let shared = Arc::new(Shared {
            driver: Arc::clone(&driver),
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
        let quiet_period = config.quiet_period;
        let thread_shared = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("gpu-health".to_owned())
            .spawn(move || run(&driver, &thread_shared, &config))
            .map_err(|source| HealthError::Thread { source })?;
        tracing::info!(policy = %shared.policy.describe(), quiet_period = ?quiet_period, "GPU health monitor started");
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
    /// GPU lost.
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
        match crate::sys::nvml::wait_event(nvml, &set, timeout) {
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
    let change = lock(&shared.state).record(gpu.index, failure, now_ms());
    publish(shared, change.into_iter().collect());
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
                    changes.extend(state.record(index, Failure::Xid { xid }, now));
                }
            }
            None => tracing::warn!(gpu = index, "XID event without an XID number"),
        }
    }
    if event.event_type.contains(EventTypes::DOUBLE_BIT_ECC_ERROR) {
        state.count_ecc(index, true);
        if shared.policy.counts_ecc() {
            changes.extend(state.record(index, Failure::DoubleBitEcc, now));
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
            changes.extend(state.record(gpu.index, Failure::Lost, now_ms()));
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

/// Marks `gpu` healthy in the state, unless NVML still answers `GPU_IS_LOST` for it (it would
/// be handed out and fail at once).
fn mark(shared: &Shared, gpu: &GpuRef) -> Result<Option<HealthChange>, HealthError> {
    let index = lock(&shared.state).index_of(gpu)?;
    if shared.driver.reports_lost(index) {
        return Err(HealthError::StillLost {
            gpu: gpu.to_string(),
        });
    }
    lock(&shared.state).mark_healthy(gpu)
}

/// Quiet periods and operator requests. A request is answered only after the checkpoint holds
/// its effect, so the requester never reads the state from before it.
fn housekeeping(shared: &Shared) {
    let _order = lock(&shared.order);
    let mut changes = lock(&shared.state).expire(now_ms());
    let mut answers = Vec::new();
    if let Some(store) = &shared.store {
        for request in store.take_requests() {
            let gpu = &request.gpu;
            let answer = match mark(shared, gpu) {
                Ok(change) => {
                    tracing::info!(%gpu, "operator marked GPU healthy");
                    let message = match &change {
                        Some(c) => format!("GPU {} ({}) marked healthy", c.index, c.uuid),
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
