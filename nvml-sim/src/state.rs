//! The library's one global instance: init reference count, the loaded node, device handles.
//!
//! NVML keeps a reference count of `nvmlInit*` calls; only the call that takes it from 0 to 1
//! loads anything, and only the `nvmlShutdown` that takes it back to 0 releases it (`nvml.h`,
//! "Initialization and Cleanup"). Globals live in this shared object, so every distinct file
//! the process `dlopen`s is an independent simulated driver.
//!
//! The node description is found, in order, at `$NVML_SIM_CONFIG`, then as `nvml-sim.json`
//! beside the loaded library file (found with `dladdr(3)` on a function of this library).

use std::collections::HashMap;
use std::ffi::{CStr, OsStr, c_void};
use std::io::Write as _;
use std::os::unix::ffi::OsStrExt as _;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, PoisonError};

use mesos_gpu_os::error_chain;

use crate::abi::{
    EVENT_DOUBLE_BIT_ECC, EVENT_SINGLE_BIT_ECC, EVENT_XID, ID_NOT_AVAILABLE, INIT_FLAG_NO_GPUS,
    NvmlComputeInstance, NvmlDevice, NvmlGpuInstance,
};
use crate::config;
use crate::events::{Event, EventKind, EventLog, EventsError, Pending, XID_FALLEN_OFF_BUS};
use crate::node::{EccCounts, Node, RemappedRows};
use crate::status::NvmlError;

/// The environment variable naming the node description file.
pub(crate) const CONFIG_ENV: &str = "NVML_SIM_CONFIG";
/// The file looked for beside the library when [`CONFIG_ENV`] is unset.
pub(crate) const CONFIG_FILE: &str = "nvml-sim.json";
/// The environment variable giving the seed of the random failures (instead of the
/// description's `random_failures.seed`), so that each process of a test draws its own.
pub(crate) const SEED_ENV: &str = "NVML_SIM_SEED";

/// What a device handle points at. Not zero-sized, so every boxed token is its own allocation
/// and its address is a handle no other live GPU (or other loaded sim) can have.
#[derive(Debug)]
struct Token {
    _index: usize,
}

/// Per-GPU state that changes while the library is initialised, and the GPU's handles.
#[derive(Debug)]
pub(crate) struct GpuState {
    token: Box<Token>,
    pub(crate) lost: bool,
    pub(crate) ecc: Option<EccCounts>,
    /// The driver's recovery action now (`None`: the field is not supported).
    pub(crate) recovery_action: Option<u32>,
    /// The row remapper now (`None`: not supported).
    pub(crate) remapped_rows: Option<RemappedRows>,
    /// Pages pending retirement now (`None`: not supported).
    pub(crate) retired_pages_pending: Option<bool>,
    /// MIG device handles, one per [`crate::mig::Mig::devices`] entry. Never resized, so each
    /// (non-zero-sized) element keeps its address, which is the handle.
    mig_tokens: Vec<Token>,
    /// GPU instance handles (`nvmlGpuInstance_t`), one per GPU instance.
    gi_tokens: Vec<Token>,
    /// Compute instance handles (`nvmlComputeInstance_t`), one per MIG device.
    ci_tokens: Vec<Token>,
}

/// What a device handle names: a GPU, or a MIG device (a position in its GPU's
/// [`crate::mig::Mig::devices`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dev {
    Gpu(usize),
    Mig { gpu: usize, dev: usize },
}

impl Dev {
    /// The GPU, or the MIG device's parent.
    pub(crate) fn gpu(self) -> usize {
        match self {
            Dev::Gpu(g) | Dev::Mig { gpu: g, .. } => g,
        }
    }
}

fn tokens(n: usize) -> Vec<Token> {
    (0..n).map(|i| Token { _index: i }).collect()
}

fn address<T>(token: &Token) -> *mut T {
    let token: *const Token = token;
    token.cast_mut().cast()
}

/// An initialised simulated driver.
#[derive(Debug)]
pub(crate) struct Sim {
    pub(crate) node: Node,
    pub(crate) gpus: Vec<GpuState>,
    pub(crate) events: EventLog,
    /// Compute modes set through NVML, by device UUID, when the node has no state file.
    pub(crate) compute_modes: HashMap<String, u32>,
}

impl Sim {
    fn new(node: Node) -> Result<Sim, EventsError> {
        let gpus = node
            .gpus
            .iter()
            .enumerate()
            .map(|(i, g)| {
                let (devices, gis) = g
                    .mig
                    .as_ref()
                    .map_or((0, 0), |m| (m.devices.len(), m.gpu_instances.len()));
                GpuState {
                    token: Box::new(Token { _index: i }),
                    lost: g.lost,
                    ecc: g.ecc,
                    recovery_action: g.recovery_action,
                    remapped_rows: g.remapped_rows,
                    retired_pages_pending: g.retired_pages_pending,
                    mig_tokens: tokens(devices),
                    gi_tokens: tokens(gis),
                    ci_tokens: tokens(devices),
                }
            })
            .collect();
        let events = EventLog::new(node.events_file.clone());
        let mut sim = Sim {
            node,
            gpus,
            events,
            compute_modes: HashMap::new(),
        };
        sim.poll_events_strict()?;
        Ok(sim)
    }

    /// The handle of GPU `index`.
    pub(crate) fn handle(&self, index: usize) -> NvmlDevice {
        address(&self.gpus[index].token)
    }

    /// The handle of MIG device `dev` of GPU `gpu`.
    pub(crate) fn mig_handle(&self, gpu: usize, dev: usize) -> NvmlDevice {
        address(&self.gpus[gpu].mig_tokens[dev])
    }

    /// The handle of a device.
    pub(crate) fn dev_handle(&self, dev: Dev) -> NvmlDevice {
        match dev {
            Dev::Gpu(g) => self.handle(g),
            Dev::Mig { gpu, dev } => self.mig_handle(gpu, dev),
        }
    }

    /// The handle (`nvmlGpuInstance_t`) of GPU instance `gi` (a position) of GPU `gpu`.
    pub(crate) fn gi_handle(&self, gpu: usize, gi: usize) -> NvmlGpuInstance {
        address(&self.gpus[gpu].gi_tokens[gi])
    }

    /// The handle (`nvmlComputeInstance_t`) of MIG device `dev`'s compute instance.
    pub(crate) fn ci_handle(&self, gpu: usize, dev: usize) -> NvmlComputeInstance {
        address(&self.gpus[gpu].ci_tokens[dev])
    }

    /// The GPU a handle names; handles this instance did not issue, and MIG device handles,
    /// are `INVALID_ARGUMENT`.
    pub(crate) fn resolve(&self, device: NvmlDevice) -> Result<usize, NvmlError> {
        (0..self.gpus.len())
            .find(|&i| self.handle(i) == device)
            .ok_or(NvmlError::InvalidArgument)
    }

    /// The GPU or MIG device a handle names; handles this instance did not issue are
    /// `INVALID_ARGUMENT`.
    pub(crate) fn resolve_any(&self, device: NvmlDevice) -> Result<Dev, NvmlError> {
        if let Ok(g) = self.resolve(device) {
            return Ok(Dev::Gpu(g));
        }
        for (gpu, state) in self.gpus.iter().enumerate() {
            if let Some(dev) =
                (0..state.mig_tokens.len()).find(|&d| self.mig_handle(gpu, d) == device)
            {
                return Ok(Dev::Mig { gpu, dev });
            }
        }
        Err(NvmlError::InvalidArgument)
    }

    /// The (GPU, GPU instance position) a GPU instance handle names.
    pub(crate) fn resolve_gi(&self, handle: NvmlGpuInstance) -> Result<(usize, usize), NvmlError> {
        for (gpu, state) in self.gpus.iter().enumerate() {
            if let Some(gi) = (0..state.gi_tokens.len()).find(|&g| self.gi_handle(gpu, g) == handle)
            {
                return Ok((gpu, gi));
            }
        }
        Err(NvmlError::InvalidArgument)
    }

    /// The (GPU, MIG device position) a compute instance handle names.
    pub(crate) fn resolve_ci(
        &self,
        handle: NvmlComputeInstance,
    ) -> Result<(usize, usize), NvmlError> {
        for (gpu, state) in self.gpus.iter().enumerate() {
            if let Some(dev) =
                (0..state.ci_tokens.len()).find(|&d| self.ci_handle(gpu, d) == handle)
            {
                return Ok((gpu, dev));
            }
        }
        Err(NvmlError::InvalidArgument)
    }

    /// Fails with `GPU_IS_LOST` for a lost GPU, or with the error configured for `function`.
    pub(crate) fn usable(&self, index: usize, function: &str) -> Result<(), NvmlError> {
        if self.gpus[index].lost {
            return Err(NvmlError::GpuIsLost);
        }
        match self.node.gpus[index].fail.get(function) {
            Some(&e) => Err(e),
            None => Ok(()),
        }
    }

    /// Fails with the error configured for system-level `function`, if any.
    pub(crate) fn system_usable(&self, function: &str) -> Result<(), NvmlError> {
        match self.node.fail.get(function) {
            Some(&e) => Err(e),
            None => Ok(()),
        }
    }

    /// Applies lines appended to the events file since the last look. A bad line is reported on
    /// stderr and skipped: the caller's NVML call has nothing to do with it.
    pub(crate) fn poll_events(&mut self) {
        if let Err(e) = self.poll_events_strict() {
            report(&format!("{}; line skipped", error_chain(&e)));
        }
    }

    fn poll_events_strict(&mut self) -> Result<(), EventsError> {
        let gpus = &self.node.gpus;
        let lines = self.events.read_new(gpus.len(), |event| {
            let gpu = &gpus[event.gpu];
            match event.kind {
                EventKind::RecoveryAction(_) if gpu.recovery_action.is_none() => {
                    return Err(format!(
                        "GPU {} has no recovery action field (give it `recovery_action` in the node description)",
                        event.gpu
                    ));
                }
                EventKind::RemapPending | EventKind::RemapFailure
                    if gpu.remapped_rows.is_none() =>
                {
                    return Err(format!(
                        "GPU {} has no row remapper (give it `remapped_rows` in the node description)",
                        event.gpu
                    ));
                }
                EventKind::RetirePending if gpu.retired_pages_pending.is_none() => {
                    return Err(format!(
                        "GPU {} has no page retirement (give it `retired_pages_pending` in the node description)",
                        event.gpu
                    ));
                }
                _ => {}
            }
            let Some((gi, ci)) = event.mig else {
                return Ok(());
            };
            let mig = gpus[event.gpu]
                .mig
                .as_ref()
                .filter(|m| m.enabled())
                .ok_or_else(|| format!("GPU {} has MIG off, so no GPU instance {gi}", event.gpu))?;
            let pos = mig
                .gpu_instance(gi)
                .ok_or_else(|| format!("GPU {} has no GPU instance {gi}", event.gpu))?;
            match ci {
                Some(ci)
                    if !mig.gpu_instances[pos]
                        .compute_instances
                        .iter()
                        .any(|c| c.id == ci) =>
                {
                    Err(format!(
                        "GPU {} GPU instance {gi} has no compute instance {ci}",
                        event.gpu
                    ))
                }
                _ => Ok(()),
            }
        });
        let mut first_error = None;
        for line in lines {
            match line {
                Ok(event) => apply(self, event),
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        first_error.map_or(Ok(()), Err)
    }
}

/// A GPU reset: the GPU answers again, the driver asks for nothing, a pending remapping is
/// done (one more row remapped for an uncorrectable error), pending pages are retired, and the
/// volatile ECC counters start again from zero (they count "since the last driver load or
/// reset", `nvml.h` `NVML_VOLATILE_ECC`). A failed remapping stays recorded.
fn reset(state: &mut GpuState) {
    state.lost = false;
    state.recovery_action = state.recovery_action.map(|_| 0);
    if let Some(rows) = &mut state.remapped_rows
        && rows.pending
    {
        rows.pending = false;
        rows.uncorrectable += 1;
    }
    state.retired_pages_pending = state.retired_pages_pending.map(|_| false);
    if let Some(ecc) = &mut state.ecc {
        ecc.volatile_corrected = 0;
        ecc.volatile_uncorrected = 0;
    }
}

/// Applies an event to the node (lost flag, ECC counters, recovery state) and queues the NVML
/// events among them for registered sets.
fn apply(sim: &mut Sim, event: Event) {
    let gpu = event.gpu;
    let state = &mut sim.gpus[gpu];
    let (event_type, data) = match event.kind {
        EventKind::Xid(xid) => (EVENT_XID, xid),
        EventKind::Lost => {
            state.lost = true;
            (EVENT_XID, XID_FALLEN_OFF_BUS)
        }
        EventKind::SingleBitEcc => {
            if let Some(ecc) = &mut state.ecc {
                ecc.volatile_corrected += 1;
                ecc.aggregate_corrected += 1;
            }
            (EVENT_SINGLE_BIT_ECC, 0)
        }
        EventKind::DoubleBitEcc => {
            if let Some(ecc) = &mut state.ecc {
                ecc.volatile_uncorrected += 1;
                ecc.aggregate_uncorrected += 1;
            }
            (EVENT_DOUBLE_BIT_ECC, 0)
        }
        EventKind::RecoveryAction(action) => {
            state.recovery_action = Some(action);
            return;
        }
        EventKind::RemapPending => {
            if let Some(rows) = &mut state.remapped_rows {
                rows.pending = true;
            }
            return;
        }
        EventKind::RemapFailure => {
            if let Some(rows) = &mut state.remapped_rows {
                rows.failure = true;
            }
            return;
        }
        EventKind::RetirePending => {
            state.retired_pages_pending = state.retired_pages_pending.map(|_| true);
            return;
        }
        EventKind::Reset => {
            reset(state);
            return;
        }
    };
    let (gpu_instance, compute_instance) = match event.mig {
        Some((gi, ci)) => (gi, ci.unwrap_or(ID_NOT_AVAILABLE)),
        None => (ID_NOT_AVAILABLE, ID_NOT_AVAILABLE),
    };
    sim.events.deliver(Pending {
        gpu,
        event_type,
        data,
        gpu_instance,
        compute_instance,
    });
}

/// The reference count and, while it is above zero, the simulated driver.
#[derive(Debug)]
pub(crate) struct Registry {
    refcount: u32,
    sim: Option<Sim>,
    /// The random failures' stream (xorshift64*), seeded at its first draw and kept across
    /// shutdowns, so that an init tried again draws anew.
    draws: Option<u64>,
}

impl Registry {
    /// The initialised sim, or `UNINITIALIZED`.
    pub(crate) fn sim(&mut self) -> Result<&mut Sim, NvmlError> {
        self.sim.as_mut().ok_or(NvmlError::Uninitialized)
    }

    /// A failure drawn for a call (`init`: `nvmlInit*`) as `node`'s `random_failures` asks, if
    /// one is drawn.
    fn draw(&mut self, node: &Node, init: bool) -> Result<(), NvmlError> {
        let Some(random) = &node.random else {
            return Ok(());
        };
        let rate = if init { &random.init } else { &random.calls };
        let Some(rate) = rate else {
            return Ok(());
        };
        let state = self.draws.get_or_insert_with(|| {
            let seed = std::env::var(SEED_ENV)
                .ok()
                .and_then(|s| s.trim().parse::<u64>().ok())
                .unwrap_or(random.seed);
            // xorshift needs a non-zero state; the constant spreads small seeds.
            (seed ^ 0x9E37_79B9_7F4A_7C15).max(1)
        });
        let mut next = || {
            *state ^= *state >> 12;
            *state ^= *state << 25;
            *state ^= *state >> 27;
            state.wrapping_mul(0x2545_F491_4F6C_DD1D)
        };
        // 53 random bits as a fraction of 1.
        let fraction = (next() >> 11) as f64 / (1u64 << 53) as f64;
        if fraction >= rate.probability {
            return Ok(());
        }
        let pick = usize::try_from(next() % rate.errors.len() as u64).unwrap_or(0);
        Err(rate.errors[pick])
    }

    /// A random failure of a call other than init on the initialised sim, if one is drawn.
    pub(crate) fn random_failure(&mut self) -> Result<(), NvmlError> {
        let Some(sim) = self.sim.take() else {
            return Err(NvmlError::Uninitialized);
        };
        let drawn = self.draw(&sim.node, false);
        self.sim = Some(sim);
        drawn
    }
}

static REGISTRY: Mutex<Registry> = Mutex::new(Registry {
    refcount: 0,
    sim: None,
    draws: None,
});

/// Locks the global state. A panic while it was held (caught at the C boundary) leaves data
/// that was consistent before each mutation, so a poisoned lock is taken over, not propagated.
pub(crate) fn lock() -> MutexGuard<'static, Registry> {
    REGISTRY.lock().unwrap_or_else(PoisonError::into_inner)
}

/// `nvmlInit_v2` / `nvmlInitWithFlags`: counts a reference, loading the node on the first one.
pub(crate) fn init(function: &str, flags: u32) -> Result<(), NvmlError> {
    let mut reg = lock();
    if let Some(sim) = reg.sim.take() {
        let usable = sim
            .system_usable(function)
            .and_then(|()| reg.draw(&sim.node, true));
        reg.sim = Some(sim);
        usable?;
        reg.refcount = reg.refcount.saturating_add(1);
        return Ok(());
    }
    let path = config_path().map_err(|why| {
        report(&why);
        NvmlError::DriverNotLoaded
    })?;
    let sim = config::load(&path)
        .map_err(|e| error_chain(&e))
        .and_then(|node| Sim::new(node).map_err(|e| error_chain(&e)))
        .map_err(|why| {
            report(&format!("node description {}: {why}", path.display()));
            NvmlError::DriverNotLoaded
        })?;
    sim.system_usable(function)?;
    reg.draw(&sim.node, true)?;
    if sim.gpus.is_empty() && flags & INIT_FLAG_NO_GPUS == 0 {
        return Err(NvmlError::GpuNotFound);
    }
    reg.sim = Some(sim);
    reg.refcount = 1;
    Ok(())
}

/// `nvmlShutdown`: drops a reference, releasing every handle and event set on the last one.
pub(crate) fn shutdown() -> Result<(), NvmlError> {
    let mut reg = lock();
    reg.sim()?.system_usable("nvmlShutdown")?;
    reg.refcount -= 1;
    if reg.refcount == 0 {
        reg.sim = None;
    }
    Ok(())
}

fn config_path() -> Result<PathBuf, String> {
    if let Some(path) = std::env::var_os(CONFIG_ENV).filter(|p| !p.is_empty()) {
        return Ok(PathBuf::from(path));
    }
    let lib = own_path().ok_or_else(|| {
        format!("{CONFIG_ENV} is unset and dladdr cannot tell where this library is")
    })?;
    let path = lib.parent().unwrap_or(Path::new(".")).join(CONFIG_FILE);
    if path.exists() {
        Ok(path)
    } else {
        Err(format!(
            "no simulated node: {CONFIG_ENV} is unset and {} does not exist",
            path.display()
        ))
    }
}

/// The file this code was loaded from.
fn own_path() -> Option<PathBuf> {
    // SAFETY: Dl_info is a plain C struct of pointers and an int; all-zero is a valid value.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    let here: fn() -> Option<PathBuf> = own_path;
    // SAFETY: dladdr only looks the address up (it need not be dereferenceable) and writes
    // `info`, a live local of the right type.
    let found = unsafe { libc::dladdr(here as *const c_void, &mut info) };
    if found == 0 || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: dli_fname is non-null and points to the loader's NUL-terminated copy of the
    // object's path, which stays valid while the object is loaded, and we are running its code.
    let name = unsafe { CStr::from_ptr(info.dli_fname) };
    Some(PathBuf::from(OsStr::from_bytes(name.to_bytes())))
}

/// Writes one line to stderr. This library is a stand-in for a C driver library loaded into
/// other programs, with no logger of ours to report to; NVML's own diagnostics go to stderr too.
pub(crate) fn report(line: &str) {
    let _ = writeln!(std::io::stderr(), "nvml-sim: {line}");
}
