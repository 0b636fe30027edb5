//! Per-GPU health: what failed, since when, and when it may count as healthy again.
//!
//! Pure bookkeeping over wall-clock times passed in by the caller (milliseconds since the Unix
//! epoch, so the state can be checkpointed and read back after a restart).
//!
//! Recovery rules (NVIDIA's device plugin has none, `docs/reference/gpu-health.md` §3; HAMi removed
//! an automatic one because a GPU can answer queries right after an XID, same section, so here
//! evidence decides, not time alone: `super::recovery`):
//! - each stay out of the pool is an [`super::recovery::Episode`] recording how it may end
//!   (the XID policy table, [`super::xid`]), the error counters at the event and the findings
//!   of each attempt; a GPU whose failure recovers on evidence comes back by itself once every
//!   check holds ([`HealthState::due`], [`HealthState::recovered`]);
//! - a failure that needs a reset, a lost GPU (fallen off the bus) or one whose events could
//!   not be registered never recovers by itself;
//! - the operator may declare any GPU healthy ([`HealthState::mark_healthy`]).
//!
//! A MIG device has a record of its own beside its parent's: an XID NVML attributes to a MIG
//! instance (`gpuInstanceId`/`computeInstanceId` in the event data) takes out the MIG devices
//! of that instance only ([`HealthState::record_mig`]); anything on the parent takes out all of
//! them, through the parent's record.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::HealthError;
use super::recovery::{Baseline, Finding, RecoveryConfig, RecoveryRecord};
use super::xid::{Comeback, EventClass, Remedy, xid_comeback, xid_meaning};
use mesos_gpu_node::inventory::Inventory;

/// Why a GPU was marked unhealthy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Failure {
    /// A critical XID error (`nvmlEventTypeXidCriticalError`) the policy counts.
    Xid {
        /// The XID.
        xid: u64,
    },
    /// An uncorrectable (double-bit) ECC error (`nvmlEventTypeDoubleBitEccError`).
    DoubleBitEcc,
    /// NVML answers `NVML_ERROR_GPU_IS_LOST`: the GPU has fallen off the bus.
    Lost,
    /// The GPU's events could not be registered, so it cannot be watched.
    Unwatchable {
        /// NVML's error.
        error: String,
    },
}

impl Failure {
    /// The XID behind the failure, when there is one (79 for a lost GPU).
    pub fn xid(&self) -> Option<u64> {
        match self {
            Failure::Xid { xid } => Some(*xid),
            Failure::Lost => Some(79),
            Failure::DoubleBitEcc | Failure::Unwatchable { .. } => None,
        }
    }

    /// True when only the operator can clear it.
    pub(crate) fn is_permanent(&self) -> bool {
        matches!(self, Failure::Lost | Failure::Unwatchable { .. })
    }

    /// How a GPU it took out comes back (the XID policy table; an uncorrectable ECC error
    /// needs a reset, as XID 48 does).
    pub fn comeback(&self) -> Comeback {
        match self {
            Failure::Xid { xid } => xid_comeback(*xid),
            Failure::DoubleBitEcc => Comeback::Reset {
                remedy: Remedy::GpuReset,
            },
            Failure::Lost => Comeback::Reset {
                remedy: Remedy::NodeReboot,
            },
            Failure::Unwatchable { .. } => Comeback::Reset {
                remedy: Remedy::Operator,
            },
        }
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Failure::Xid { xid } => match xid_meaning(*xid) {
                Some(meaning) => write!(f, "XID {xid} ({meaning})"),
                None => write!(f, "XID {xid}"),
            },
            Failure::DoubleBitEcc => {
                f.write_str("double-bit ECC error (uncorrectable memory error)")
            }
            Failure::Lost => {
                f.write_str("GPU is lost (NVML_ERROR_GPU_IS_LOST: fallen off the bus)")
            }
            Failure::Unwatchable { error } => write!(f, "cannot watch for GPU errors: {error}"),
        }
    }
}

/// A GPU's health.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum GpuHealth {
    /// Usable.
    Healthy,
    /// Not to be granted; its owner is told.
    Unhealthy {
        /// The first failure (a later `Lost` replaces it).
        reason: Failure,
        /// When it was marked unhealthy, ms since the Unix epoch.
        since_ms: u64,
        /// When the latest counted error arrived, ms since the Unix epoch.
        last_error_ms: u64,
        /// Counted errors since it was marked unhealthy.
        errors: u64,
    },
}

impl GpuHealth {
    /// True for [`GpuHealth::Healthy`].
    pub fn is_healthy(&self) -> bool {
        matches!(self, GpuHealth::Healthy)
    }

    /// The failure, when unhealthy.
    pub fn failure(&self) -> Option<&Failure> {
        match self {
            GpuHealth::Healthy => None,
            GpuHealth::Unhealthy { reason, .. } => Some(reason),
        }
    }
}

/// A GPU named by NVML index or UUID (`3` or `GPU-…`), as an operator types it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GpuRef {
    /// NVML index.
    Index(u32),
    /// `GPU-…` UUID.
    Uuid(String),
}

impl GpuRef {
    /// Parses `3`, `GPU-8a2d…` or a MIG device's `MIG-1b3c…`.
    pub fn parse(text: &str) -> Result<GpuRef, HealthError> {
        let text = text.trim();
        if let Ok(index) = text.parse::<u32>() {
            return Ok(GpuRef::Index(index));
        }
        if text.len() > 4
            && (text[..4].eq_ignore_ascii_case("GPU-") || text[..4].eq_ignore_ascii_case("MIG-"))
        {
            return Ok(GpuRef::Uuid(text.to_owned()));
        }
        Err(HealthError::BadGpuRef {
            got: text.to_owned(),
        })
    }
}

impl fmt::Display for GpuRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GpuRef::Index(i) => write!(f, "{i}"),
            GpuRef::Uuid(u) => f.write_str(u),
        }
    }
}

/// Where a MIG device is on its parent GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigInstance {
    /// The parent GPU's UUID.
    pub parent_uuid: String,
    /// GPU instance id.
    pub gpu_instance: u32,
    /// Compute instance id.
    pub compute_instance: u32,
}

/// A GPU's (or one MIG device's) health moved between healthy and unhealthy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthChange {
    /// NVML index (of the parent, for a MIG device).
    pub index: u32,
    /// UUID (`MIG-…` for a MIG device).
    pub uuid: String,
    /// The new health.
    pub health: GpuHealth,
    /// True when the change was read back from a checkpoint at start, not observed now.
    pub restored: bool,
    /// Set when the change is about one MIG device of GPU `index`, not the whole GPU.
    pub mig: Option<MigInstance>,
    /// For a GPU turning unhealthy: how it comes back, or what the operator must do.
    pub advice: Option<String>,
}

impl HealthChange {
    /// For a GPU turning unhealthy, the limitation its owner is told, e.g.
    /// `GPU 3 (GPU-…) failed: XID 79 (GPU has fallen off the bus); it needs a node reboot …` or
    /// `MIG device MIG-… (GPU 3, GPU instance 1, compute instance 0) failed: XID 43 (…)`.
    pub fn limitation(&self) -> Option<String> {
        let reason = self.health.failure()?;
        let what = match &self.mig {
            None => format!("GPU {} ({}) failed: {reason}", self.index, self.uuid),
            Some(m) => format!(
                "MIG device {} (GPU {}, GPU instance {}, compute instance {}) failed: {reason}",
                self.uuid, self.index, m.gpu_instance, m.compute_instance
            ),
        };
        Some(match &self.advice {
            Some(advice) => format!("{what}; {advice}"),
            None => what,
        })
    }
}

/// One GPU's (or one MIG device's) record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuRecord {
    /// NVML index (of the parent, for a MIG device).
    pub index: u32,
    /// UUID (`MIG-…` for a MIG device).
    pub uuid: String,
    /// Set for a MIG device's record: where it is on GPU `index`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig: Option<MigInstance>,
    /// Current health.
    pub health: GpuHealth,
    /// Every XID seen on the GPU since start, counted or ignored, by XID.
    pub xids: BTreeMap<u64, u64>,
    /// Single-bit (corrected) ECC events seen.
    pub ecc_single_bit: u64,
    /// Double-bit (uncorrectable) ECC events seen.
    pub ecc_double_bit: u64,
    /// Automatic recoveries, failed probes, flapping and the current stay out of the pool.
    #[serde(default)]
    pub recovery: RecoveryRecord,
}

/// The checkpointed form of `HealthState` (schema [`HealthSnapshot::VERSION`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HealthSnapshot {
    /// Every GPU's record.
    pub gpus: Vec<GpuRecord>,
    /// Every MIG device's record (none on a node without MIG, or in a checkpoint from before).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mig: Vec<GpuRecord>,
}

impl mesos_gpu_os::Document for HealthSnapshot {
    const VERSION: u32 = 1;
    const WHAT: &'static str = "GPU health checkpoint";
}

impl HealthSnapshot {
    /// The record of `gpu`: a GPU by index or UUID, or a MIG device by UUID.
    pub fn find(&self, gpu: &GpuRef) -> Option<&GpuRecord> {
        self.gpus.iter().chain(&self.mig).find(|g| g.is(gpu))
    }

    /// Every GPU's and MIG device's record.
    pub fn records(&self) -> impl Iterator<Item = &GpuRecord> {
        self.gpus.iter().chain(&self.mig)
    }

    /// Marks `gpu` healthy in the checkpoint itself (when no monitor runs); returns whether it
    /// was unhealthy.
    pub fn mark_healthy(&mut self, gpu: &GpuRef) -> Result<bool, HealthError> {
        let record = find_mut(&mut self.gpus, &mut self.mig, gpu)?;
        let was = !record.health.is_healthy();
        record.health = GpuHealth::Healthy;
        record.recovery.episode = None;
        Ok(was)
    }
}

impl GpuRecord {
    /// True when `gpu` names this record: a GPU by index or UUID, a MIG device by UUID only.
    fn is(&self, gpu: &GpuRef) -> bool {
        match gpu {
            GpuRef::Index(i) => self.mig.is_none() && self.index == *i,
            GpuRef::Uuid(u) => self.uuid.eq_ignore_ascii_case(u),
        }
    }
}

/// The record of `gpu` among a node's GPU and MIG device records; `UnknownGpu` naming the
/// known ones when none is.
fn find_mut<'a>(
    gpus: &'a mut [GpuRecord],
    mig: &'a mut [GpuRecord],
    gpu: &GpuRef,
) -> Result<&'a mut GpuRecord, HealthError> {
    let known = known(gpus.iter().chain(mig.iter()));
    gpus.iter_mut()
        .chain(mig)
        .find(|g| g.is(gpu))
        .ok_or_else(|| HealthError::UnknownGpu {
            gpu: gpu.to_string(),
            known,
        })
}

/// `0 GPU-…, 1 GPU-…, MIG-…` for an unknown-GPU error.
fn known<'a>(records: impl Iterator<Item = &'a GpuRecord>) -> String {
    records
        .map(|g| match g.mig {
            None => format!("{} {}", g.index, g.uuid),
            Some(_) => g.uuid.clone(),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// What the driver said about a GPU at its event.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct AtEvent {
    /// Its error counters then.
    pub(crate) baseline: Baseline,
    /// What it asked for, when it asked for a reset or reboot.
    pub(crate) driver_asks: Option<String>,
}

/// Records `failure` on `g`; the change when it was healthy. A further failure of an unhealthy
/// record restarts its quiet time, a reset-needing one makes the stay need a reset, and `Lost`
/// replaces a lesser reason.
fn fail(
    g: &mut GpuRecord,
    failure: Failure,
    now_ms: u64,
    at: &AtEvent,
    flap_window: Duration,
) -> Option<HealthChange> {
    let comeback = failure.comeback();
    let outcome = match &mut g.health {
        GpuHealth::Healthy => {
            g.health = GpuHealth::Unhealthy {
                reason: failure,
                since_ms: now_ms,
                last_error_ms: now_ms,
                errors: 1,
            };
            g.recovery.begin(comeback, now_ms, flap_window);
            if let Some(episode) = &mut g.recovery.episode {
                episode.baseline = at.baseline;
            }
            true
        }
        GpuHealth::Unhealthy {
            reason,
            last_error_ms,
            errors,
            ..
        } => {
            if failure == Failure::Lost {
                *reason = Failure::Lost;
            }
            *last_error_ms = now_ms.max(*last_error_ms);
            *errors += 1;
            if g.recovery.episode.is_none() {
                // A checkpoint from before episodes were recorded.
                g.recovery.begin(comeback, now_ms, flap_window);
            }
            g.recovery.escalate(comeback);
            false
        }
    };
    if let (Some(asks), Some(episode)) = (&at.driver_asks, &mut g.recovery.episode) {
        episode.driver_asks = Some(asks.clone());
    }
    outcome.then(|| change(g, false))
}

/// A GPU whose recovery check is due.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Due {
    /// NVML index.
    pub(crate) index: u32,
    /// UUID.
    pub(crate) uuid: String,
    /// The counters at its event.
    pub(crate) baseline: Baseline,
    /// The quiet-time finding (always holding: only GPUs past their quiet time are due).
    pub(crate) quiet: Finding,
}

/// The health of every GPU and MIG device of a node.
#[derive(Debug, Clone)]
pub(crate) struct HealthState {
    gpus: Vec<GpuRecord>,
    mig: Vec<GpuRecord>,
    flap_window: Duration,
}

impl HealthState {
    /// Every GPU of `inventory` healthy, except those discovery found lost. A GPU failing again
    /// within `flap_window` after coming back by itself is flapping.
    pub(crate) fn new(inventory: &Inventory, flap_window: Duration, now_ms: u64) -> HealthState {
        let gpus = inventory
            .gpus
            .iter()
            .map(|g| GpuRecord {
                index: g.index,
                uuid: g.uuid.clone(),
                mig: None,
                health: if g.healthy {
                    GpuHealth::Healthy
                } else {
                    GpuHealth::Unhealthy {
                        reason: Failure::Lost,
                        since_ms: now_ms,
                        last_error_ms: now_ms,
                        errors: 1,
                    }
                },
                xids: BTreeMap::new(),
                ecc_single_bit: 0,
                ecc_double_bit: 0,
                recovery: {
                    let mut r = RecoveryRecord::default();
                    if !g.healthy {
                        r.begin(Failure::Lost.comeback(), now_ms, flap_window);
                    }
                    r
                },
            })
            .collect();
        let mig = inventory
            .mig
            .devices
            .iter()
            .map(|d| GpuRecord {
                index: d.parent,
                uuid: d.uuid.clone(),
                mig: Some(MigInstance {
                    parent_uuid: inventory
                        .gpus
                        .iter()
                        .find(|g| g.index == d.parent)
                        .map(|g| g.uuid.clone())
                        .unwrap_or_default(),
                    gpu_instance: d.gpu_instance,
                    compute_instance: d.compute_instance,
                }),
                health: GpuHealth::Healthy,
                xids: BTreeMap::new(),
                ecc_single_bit: 0,
                ecc_double_bit: 0,
                recovery: RecoveryRecord::default(),
            })
            .collect();
        HealthState {
            gpus,
            mig,
            flap_window,
        }
    }

    /// Every GPU's record, by NVML index.
    pub(crate) fn gpus(&self) -> &[GpuRecord] {
        &self.gpus
    }

    /// The record of the GPU with NVML index `index`.
    pub(crate) fn get(&self, index: u32) -> Option<&GpuRecord> {
        self.gpus.iter().find(|g| g.index == index)
    }

    /// The NVML index of `gpu`, a GPU of this node.
    pub(crate) fn index_of(&mut self, gpu: &GpuRef) -> Result<u32, HealthError> {
        self.find(gpu).map(|g| g.index)
    }

    fn find(&mut self, gpu: &GpuRef) -> Result<&mut GpuRecord, HealthError> {
        find_mut(&mut self.gpus, &mut self.mig, gpu)
    }

    /// Counts an XID seen on GPU `index`, whether or not the policy counts it.
    pub(crate) fn count_xid(&mut self, index: u32, xid: u64) {
        if let Ok(g) = self.find(&GpuRef::Index(index)) {
            *g.xids.entry(xid).or_default() += 1;
        }
    }

    /// Counts an ECC event seen on GPU `index` (`double_bit`: uncorrectable).
    pub(crate) fn count_ecc(&mut self, index: u32, double_bit: bool) {
        if let Ok(g) = self.find(&GpuRef::Index(index)) {
            if double_bit {
                g.ecc_double_bit += 1;
            } else {
                g.ecc_single_bit += 1;
            }
        }
    }

    /// Records a failure on GPU `index`; returns the change when it was healthy. A further
    /// failure of an unhealthy GPU restarts its quiet period, and `Lost` replaces a lesser
    /// reason. An unknown index changes nothing.
    pub(crate) fn record(
        &mut self,
        index: u32,
        failure: Failure,
        now_ms: u64,
        at: &AtEvent,
    ) -> Option<HealthChange> {
        let window = self.flap_window;
        let g = self.find(&GpuRef::Index(index)).ok()?;
        fail(g, failure, now_ms, at, window)
    }

    /// Records an XID NVML attributed to GPU instance `gpu_instance` (and compute instance
    /// `compute_instance`, when named) of GPU `index` on the MIG devices there; the changes of
    /// those that were healthy. `None` when no MIG device of this node is there: the caller
    /// then counts it against the whole GPU.
    pub(crate) fn record_mig(
        &mut self,
        index: u32,
        gpu_instance: u32,
        compute_instance: Option<u32>,
        xid: u64,
        counted: bool,
        now_ms: u64,
    ) -> Option<Vec<HealthChange>> {
        let mut hit = false;
        let mut changes = Vec::new();
        let window = self.flap_window;
        for g in &mut self.mig {
            let Some(m) = &g.mig else { continue };
            if g.index != index
                || m.gpu_instance != gpu_instance
                || compute_instance.is_some_and(|c| c != m.compute_instance)
            {
                continue;
            }
            hit = true;
            *g.xids.entry(xid).or_default() += 1;
            if counted {
                changes.extend(fail(
                    g,
                    Failure::Xid { xid },
                    now_ms,
                    &AtEvent::default(),
                    window,
                ));
            }
        }
        hit.then_some(changes)
    }

    /// Whole GPUs whose failure recovers on evidence, whose quiet time (lengthened for a
    /// flapping GPU) has passed and whose next attempt is due.
    pub(crate) fn due(&self, now_ms: u64, config: &RecoveryConfig) -> Vec<Due> {
        let mut due = Vec::new();
        for g in &self.gpus {
            let (GpuHealth::Unhealthy { last_error_ms, .. }, Some(episode)) =
                (&g.health, &g.recovery.episode)
            else {
                continue;
            };
            let Comeback::Evidence { class } = episode.comeback else {
                continue;
            };
            let quiet = config.quiet_for(class, g.recovery.flaps);
            let quiet_ms = u64::try_from(quiet.as_millis()).unwrap_or(u64::MAX);
            let calm = now_ms.saturating_sub(*last_error_ms);
            if calm < quiet_ms || now_ms < episode.next_try_ms {
                continue;
            }
            due.push(Due {
                index: g.index,
                uuid: g.uuid.clone(),
                baseline: episode.baseline,
                quiet: Finding {
                    check: super::recovery::Check::QuietTime,
                    ok: true,
                    detail: quiet_words(calm, quiet, class, g.recovery.flaps),
                },
            });
        }
        due
    }

    /// GPU `index` came back by itself after `findings`: healthy again.
    pub(crate) fn recovered(
        &mut self,
        index: u32,
        findings: Vec<Finding>,
        now_ms: u64,
    ) -> Option<HealthChange> {
        let g = self.find(&GpuRef::Index(index)).ok()?;
        if g.health.is_healthy() {
            return None;
        }
        g.health = GpuHealth::Healthy;
        g.recovery.recovered(now_ms);
        if let Some(last) = findings.last() {
            tracing::debug!(gpu = index, last = %last, "recovered");
        }
        Some(change(g, false))
    }

    /// An attempt to bring GPU `index` back failed with `findings` (a failed probe counts as
    /// one); the wait before the next one.
    pub(crate) fn attempt_failed(
        &mut self,
        index: u32,
        findings: Vec<Finding>,
        probe_failed: bool,
        driver_asks: Option<String>,
        now_ms: u64,
        config: &RecoveryConfig,
    ) -> Duration {
        let Ok(g) = self.find(&GpuRef::Index(index)) else {
            return Duration::ZERO;
        };
        if probe_failed {
            g.recovery.probe_failures += 1;
        }
        if let Some(episode) = &mut g.recovery.episode {
            episode.driver_asks = driver_asks;
        }
        g.recovery.failed_attempt(findings, now_ms, config)
    }

    /// When GPU `index` last had a counted error, ms; `None` when it is healthy.
    pub(crate) fn last_error_ms(&self, index: u32) -> Option<u64> {
        match self.get(index)?.health {
            GpuHealth::Unhealthy { last_error_ms, .. } => Some(last_error_ms),
            GpuHealth::Healthy => None,
        }
    }

    /// The operator's word: `gpu` is healthy. `Ok(None)` when it already was.
    pub(crate) fn mark_healthy(
        &mut self,
        gpu: &GpuRef,
    ) -> Result<Option<HealthChange>, HealthError> {
        let g = self.find(gpu)?;
        if g.health.is_healthy() {
            return Ok(None);
        }
        g.health = GpuHealth::Healthy;
        g.recovery.episode = None;
        Ok(Some(change(g, false)))
    }

    /// The state to checkpoint.
    pub(crate) fn snapshot(&self) -> HealthSnapshot {
        HealthSnapshot {
            gpus: self.gpus.clone(),
            mig: self.mig.clone(),
        }
    }

    /// Takes health and counts back from a checkpoint, matching GPUs by UUID (indices may change
    /// across reboots); returns a change per GPU the checkpoint holds unhealthy. GPUs the
    /// checkpoint does not know keep their state; checkpointed GPUs no longer present are
    /// dropped with a warning.
    pub(crate) fn restore(
        &mut self,
        snapshot: &HealthSnapshot,
    ) -> Result<Vec<HealthChange>, HealthError> {
        let mut changes = Vec::new();
        for saved in snapshot.gpus.iter().chain(&snapshot.mig) {
            let Some(g) = self
                .gpus
                .iter_mut()
                .chain(&mut self.mig)
                .find(|g| g.uuid == saved.uuid)
            else {
                tracing::warn!(uuid = %saved.uuid, health = ?saved.health, "checkpointed GPU is gone; dropping its health");
                continue;
            };
            g.xids.clone_from(&saved.xids);
            g.ecc_single_bit = saved.ecc_single_bit;
            g.ecc_double_bit = saved.ecc_double_bit;
            g.recovery.clone_from(&saved.recovery);
            if !saved.health.is_healthy() {
                g.health = saved.health.clone();
                changes.push(change(g, true));
            }
        }
        Ok(changes)
    }
}

/// `quiet 12s ≥ 10s (other; doubled twice: flapping)`.
fn quiet_words(calm_ms: u64, quiet: Duration, class: EventClass, flaps: u32) -> String {
    let flapping = if flaps > 0 {
        format!(", lengthened for {flaps} recovery(ies) that failed again")
    } else {
        String::new()
    };
    format!(
        "{:.1}s without an error, {:.1}s needed ({class} quiet time{flapping})",
        Duration::from_millis(calm_ms).as_secs_f64(),
        quiet.as_secs_f64()
    )
}

/// How a GPU out of the pool comes back, for its owner and the operator.
fn advice(g: &GpuRecord) -> Option<String> {
    let episode = g.recovery.episode.as_ref()?;
    let asks = episode
        .driver_asks
        .as_ref()
        .map(|a| format!("the driver asks for {a}; "))
        .unwrap_or_default();
    Some(match (episode.comeback, &g.mig) {
        (Comeback::Reset { remedy }, _) => format!("{asks}{}", remedy.describe(g.index)),
        (Comeback::Evidence { .. }, Some(_)) => format!(
            "{asks}it stays out until `mesos-gpu gpu mark-healthy {}` (MIG devices do not come back by themselves)",
            g.uuid
        ),
        (Comeback::Evidence { .. }, None) => format!(
            "{asks}it comes back by itself once the driver asks for nothing, no new uncorrectable error shows and its probe passes after a quiet time (`mesos-gpu gpu health`)"
        ),
    })
}

fn change(g: &GpuRecord, restored: bool) -> HealthChange {
    HealthChange {
        index: g.index,
        uuid: g.uuid.clone(),
        health: g.health.clone(),
        restored,
        mig: g.mig.clone(),
        advice: if g.health.is_healthy() {
            None
        } else {
            advice(g)
        },
    }
}

#[cfg(test)]
impl HealthChange {
    /// A change of GPU `index` (UUID `GPU-<index>`) to healthy, or to unhealthy after XID 79.
    pub(crate) fn xid79(index: u32, healthy: bool) -> HealthChange {
        HealthChange {
            index,
            uuid: format!("GPU-{index}"),
            health: if healthy {
                GpuHealth::Healthy
            } else {
                GpuHealth::Unhealthy {
                    reason: Failure::Xid { xid: 79 },
                    since_ms: 0,
                    last_error_ms: 0,
                    errors: 1,
                }
            },
            restored: false,
            mig: None,
            advice: None,
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a failed unwrap fails the test at its line
mod tests {
    use super::*;
    use mesos_gpu_node::inventory::Gpu;

    fn inventory(n: u32) -> Inventory {
        Inventory {
            gpus: (0..n)
                .map(|i| Gpu {
                    index: i,
                    minor: i,
                    uuid: format!("GPU-0000000{i}-0000-0000-0000-000000000000"),
                    name: "Tesla T4".to_owned(),
                    memory_total: 1 << 34,
                    pci_bus_id: format!("00000000:0{i}:00.0"),
                    numa_node: None,
                    compute_capability: None,
                    healthy: i != 3,
                })
                .collect(),
            ..Inventory::default()
        }
    }

    fn config(quiet_ms: u64) -> RecoveryConfig {
        let mut c = RecoveryConfig::new(super::super::probe::ProbeConfig::command(vec![
            "true".into(),
        ]));
        c.quiet = super::super::recovery::QuietTimes::uniform(Duration::from_millis(quiet_ms));
        c.retry_min = Duration::from_millis(1_000);
        c.retry_max = Duration::from_millis(8_000);
        c
    }

    const AT: AtEvent = AtEvent {
        baseline: Baseline {
            volatile_uncorrected: None,
        },
        driver_asks: None,
    };

    #[test]
    fn an_evidence_failure_is_due_after_its_quiet_time_and_a_reset_one_never() {
        let c = config(10_000);
        let mut s = HealthState::new(&inventory(4), c.flap_window, 0);
        assert!(s.get(3).unwrap().health.failure() == Some(&Failure::Lost));
        let ch = s.record(1, Failure::Xid { xid: 94 }, 1_000, &AT).unwrap();
        assert_eq!(ch.index, 1);
        assert!(
            ch.limitation().unwrap().starts_with(
                "GPU 1 (GPU-00000001-0000-0000-0000-000000000000) failed: XID 94 (contained ECC error); it comes back by itself"
            ),
            "{:?}",
            ch.limitation()
        );
        assert_eq!(
            s.record(1, Failure::Xid { xid: 63 }, 5_000, &AT),
            None,
            "already unhealthy"
        );
        assert!(
            s.due(14_999, &c).is_empty(),
            "quiet time restarts at the latest error"
        );
        let due = s.due(15_000, &c);
        assert_eq!(due.iter().map(|d| d.index).collect::<Vec<_>>(), [1]);
        assert!(
            due[0]
                .quiet
                .detail
                .contains("10.0s needed (memory quiet time"),
            "{:?}",
            due[0]
        );
        // A failed attempt waits retry_min, then twice as long.
        assert_eq!(
            s.attempt_failed(1, vec![], true, None, 15_000, &c),
            Duration::from_secs(1)
        );
        assert!(s.due(15_999, &c).is_empty());
        assert_eq!(s.due(16_000, &c).len(), 1);
        assert_eq!(
            s.attempt_failed(1, vec![], true, None, 16_000, &c),
            Duration::from_secs(2)
        );
        assert_eq!(s.get(1).unwrap().recovery.probe_failures, 2);
        let back = s.recovered(1, vec![], 18_000).unwrap();
        assert!(back.health.is_healthy() && back.limitation().is_none());
        assert_eq!(s.get(1).unwrap().recovery.recoveries, 1);
        // XID 48 needs a reset: never due, and its owner is told what to do.
        let ch = s.record(2, Failure::Xid { xid: 48 }, 20_000, &AT).unwrap();
        assert!(
            ch.limitation().unwrap().contains("nvidia-smi -r -i 2"),
            "{:?}",
            ch.limitation()
        );
        assert!(
            s.due(u64::MAX, &c).is_empty(),
            "lost and reset failures never come back by themselves"
        );
        assert_eq!(
            s.get(2).unwrap().recovery.missing(),
            ["the failure needs a GPU reset: it never comes back by itself"]
        );
        assert!(s.get(0).unwrap().health.is_healthy());
    }

    #[test]
    fn a_gpu_that_fails_again_soon_after_coming_back_waits_longer() {
        let c = config(1_000);
        let mut s = HealthState::new(&inventory(2), c.flap_window, 0);
        let mut at = 0;
        let mut quiet = Vec::new();
        for _ in 0..4 {
            s.record(0, Failure::Xid { xid: 32 }, at, &AT);
            let due_at = (at..at + 100_000)
                .step_by(100)
                .find(|&t| !s.due(t, &c).is_empty())
                .unwrap();
            quiet.push(due_at - at);
            s.recovered(0, vec![], due_at);
            at = due_at + 500;
        }
        assert_eq!(
            quiet,
            [1_000, 2_000, 4_000, 8_000],
            "doubled per flap, capped at retry_max"
        );
        assert_eq!(s.get(0).unwrap().recovery.flaps, 3);
    }

    #[test]
    fn lost_replaces_reason_and_is_permanent() {
        let c = config(1);
        let mut s = HealthState::new(&inventory(2), c.flap_window, 0);
        s.record(0, Failure::DoubleBitEcc, 1, &AT);
        s.record(0, Failure::Lost, 2, &AT);
        assert_eq!(s.get(0).unwrap().health.failure(), Some(&Failure::Lost));
        assert!(s.due(1_000_000, &c).is_empty());
        let ch =
            s.mark_healthy(&GpuRef::parse("GPU-00000000-0000-0000-0000-000000000000").unwrap());
        assert!(ch.unwrap().unwrap().health.is_healthy());
        assert_eq!(s.get(0).unwrap().recovery.episode, None);
        assert_eq!(s.mark_healthy(&GpuRef::Index(0)).unwrap(), None);
    }

    #[test]
    fn the_driver_asking_for_a_reset_is_told_to_the_owner() {
        let mut s = HealthState::new(&inventory(2), Duration::from_secs(1), 0);
        let at = AtEvent {
            baseline: Baseline::default(),
            driver_asks: Some("a GPU reset".to_owned()),
        };
        let ch = s.record(1, Failure::Xid { xid: 94 }, 1, &at).unwrap();
        assert!(
            ch.limitation()
                .unwrap()
                .contains("; the driver asks for a GPU reset; "),
            "{:?}",
            ch.limitation()
        );
    }

    #[test]
    fn unknown_gpus_and_bad_refs_are_named() {
        let mut s = HealthState::new(&inventory(2), Duration::ZERO, 0);
        let err = s.mark_healthy(&GpuRef::Index(7)).unwrap_err();
        assert!(
            err.to_string().contains("GPU 7") && err.to_string().contains("0 GPU-0000"),
            "{err}"
        );
        assert!(s.record(9, Failure::Lost, 0, &AT).is_none());
        let err = GpuRef::parse("gpu3").unwrap_err();
        assert!(err.to_string().contains("\"gpu3\""), "{err}");
    }

    #[test]
    fn snapshot_round_trips_through_json_and_restores_by_uuid() {
        let mut s = HealthState::new(&inventory(4), Duration::ZERO, 0);
        s.record(2, Failure::Xid { xid: 79 }, 10, &AT);
        s.count_xid(2, 79);
        s.count_xid(0, 13);
        s.count_ecc(1, false);
        let json = serde_json::to_string(&s.snapshot()).unwrap();
        let snap: HealthSnapshot = serde_json::from_str(&json).unwrap();

        let mut inv = inventory(4);
        inv.gpus.swap(0, 2);
        inv.gpus[0].index = 0;
        inv.gpus[2].index = 2;
        let mut fresh = HealthState::new(&inv, Duration::ZERO, 0);
        assert!(fresh.get(2).unwrap().recovery.episode.is_none());
        let changes = fresh.restore(&snap).unwrap();
        let uuids: Vec<_> = changes
            .iter()
            .map(|c| (c.index, c.uuid.as_str(), c.restored))
            .collect();
        assert!(
            uuids.contains(&(0, "GPU-00000002-0000-0000-0000-000000000000", true)),
            "{uuids:?}"
        );
        assert_eq!(fresh.get(0).unwrap().xids.get(&79), Some(&1));
        assert!(
            fresh.get(0).unwrap().recovery.episode.is_some(),
            "the stay out of the pool is restored with the health"
        );
        assert_eq!(fresh.get(1).unwrap().ecc_single_bit, 1);

        let mut edited = snap.clone();
        assert!(edited.mark_healthy(&GpuRef::Index(2)).unwrap());
        assert!(!edited.mark_healthy(&GpuRef::Index(2)).unwrap());
        assert!(edited.find(&GpuRef::Index(2)).unwrap().health.is_healthy());
        assert!(
            edited
                .mark_healthy(&GpuRef::Index(8))
                .unwrap_err()
                .is_unknown_gpu()
        );
    }

    /// GPU 1 in MIG mode: GPU instance 1 with compute instances 0 and 1, GPU instance 2 with 0.
    fn mig_inventory() -> Inventory {
        let mut inv = inventory(2);
        let device = |index: u32, gi: u32, ci: u32| mesos_gpu_node::inventory::MigDevice {
            parent: 1,
            parent_minor: 1,
            index,
            uuid: format!("MIG-{gi}-{ci}"),
            gpu_instance: gi,
            compute_instance: ci,
            profile: Some(19),
            profile_name: "1g.5gb".to_owned(),
            memory_total: 5 << 30,
            multiprocessors: 14,
            gpu_instance_slices: 1,
            compute_instance_slices: 1,
            caps: None,
            healthy: true,
        };
        inv.mig.enabled = vec![1];
        inv.mig.devices = vec![device(0, 1, 0), device(1, 1, 1), device(2, 2, 0)];
        inv
    }

    #[test]
    fn an_xid_on_a_mig_instance_fails_that_instance_only() {
        let mut s = HealthState::new(&mig_inventory(), Duration::from_secs(10), 0);
        let changes = s.record_mig(1, 1, Some(1), 94, true, 1_000).unwrap();
        assert_eq!(changes.len(), 1);
        assert_eq!(changes[0].uuid, "MIG-1-1");
        assert_eq!(
            changes[0].limitation().unwrap(),
            "MIG device MIG-1-1 (GPU 1, GPU instance 1, compute instance 1) failed: XID 94 (contained ECC error); \
             it stays out until `mesos-gpu gpu mark-healthy MIG-1-1` (MIG devices do not come back by themselves)"
        );
        assert!(s.get(1).unwrap().health.is_healthy(), "the parent stays");
        // A GPU instance without a compute instance: every compute instance in it.
        let gi = s.record_mig(1, 1, None, 94, true, 2_000).unwrap();
        assert_eq!(
            gi.iter().map(|c| c.uuid.as_str()).collect::<Vec<_>>(),
            ["MIG-1-0"]
        );
        // Ignored by the policy: counted, nothing fails.
        assert_eq!(s.record_mig(1, 2, Some(0), 13, false, 2_000), Some(vec![]));
        // No MIG device there: the caller counts it against the GPU.
        assert_eq!(s.record_mig(1, 7, None, 94, true, 2_000), None);
        assert_eq!(s.record_mig(0, 1, Some(0), 94, true, 2_000), None);
        let snap = s.snapshot();
        let unhealthy: Vec<&str> = snap
            .records()
            .filter(|r| !r.health.is_healthy())
            .map(|r| r.uuid.as_str())
            .collect();
        assert_eq!(unhealthy, ["MIG-1-0", "MIG-1-1"]);
        assert_eq!(
            snap.find(&GpuRef::Uuid("MIG-2-0".into())).unwrap().xids[&13],
            1
        );
        // The operator and a restart treat MIG records as GPU records; they never come back by
        // themselves.
        let mig_ref = GpuRef::parse("MIG-1-0").unwrap();
        assert_eq!(s.mark_healthy(&mig_ref).unwrap().unwrap().uuid, "MIG-1-0");
        let mut c = RecoveryConfig::new(super::super::probe::ProbeConfig::command(vec![]));
        c.quiet = super::super::recovery::QuietTimes::uniform(Duration::ZERO);
        assert_eq!(s.due(u64::MAX, &c), []);
        let mut fresh = HealthState::new(&mig_inventory(), Duration::ZERO, 0);
        let restored = fresh.restore(&snap).unwrap();
        assert_eq!(restored.len(), 2);
        assert!(restored.iter().all(|c| c.restored && c.mig.is_some()));
        assert!(GpuRef::Index(1) != mig_ref);
        assert_eq!(fresh.index_of(&mig_ref).unwrap(), 1);
    }
}
