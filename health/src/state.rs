//! Per-GPU health: what failed, since when, and when it may count as healthy again.
//!
//! Pure bookkeeping over wall-clock times passed in by the caller (milliseconds since the Unix
//! epoch, so the state can be checkpointed and read back after a restart).
//!
//! Recovery rules (NVIDIA's device plugin has none, `shared/reference/gpu_sched.md` §1.1; HAMi
//! removed an automatic one because a GPU can answer queries right after an XID, §1.1):
//! - an unhealthy GPU becomes healthy again after a configured quiet period with no new error;
//!   with no quiet period configured it never does by itself;
//! - a lost GPU (fallen off the bus), or one whose events could not be registered, never
//!   recovers by itself: nothing could show that it works again;
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
use super::xid::xid_meaning;
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
    /// Not to be granted; its holder is told.
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
}

impl HealthChange {
    /// For a GPU turning unhealthy, the limitation its holder is told, e.g.
    /// `GPU 3 (GPU-…) failed: XID 79 (GPU has fallen off the bus)` or
    /// `MIG device MIG-… (GPU 3, GPU instance 1, compute instance 0) failed: XID 43 (…)`.
    pub fn limitation(&self) -> Option<String> {
        let reason = self.health.failure()?;
        Some(match &self.mig {
            None => format!("GPU {} ({}) failed: {reason}", self.index, self.uuid),
            Some(m) => format!(
                "MIG device {} (GPU {}, GPU instance {}, compute instance {}) failed: {reason}",
                self.uuid, self.index, m.gpu_instance, m.compute_instance
            ),
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
        let known = known(self.gpus.iter().chain(&self.mig));
        let record = self
            .gpus
            .iter_mut()
            .chain(&mut self.mig)
            .find(|g| g.is(gpu))
            .ok_or_else(|| HealthError::UnknownGpu {
                gpu: gpu.to_string(),
                known,
            })?;
        let was = !record.health.is_healthy();
        record.health = GpuHealth::Healthy;
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

/// Records `failure` on `g`; the change when it was healthy. A further failure of an unhealthy
/// record restarts its quiet period, and `Lost` replaces a lesser reason.
fn fail(g: &mut GpuRecord, failure: Failure, now_ms: u64) -> Option<HealthChange> {
    match &mut g.health {
        GpuHealth::Healthy => {
            g.health = GpuHealth::Unhealthy {
                reason: failure,
                since_ms: now_ms,
                last_error_ms: now_ms,
                errors: 1,
            };
            Some(change(g, false))
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
            None
        }
    }
}

/// The health of every GPU and MIG device of a node.
#[derive(Debug, Clone)]
pub(crate) struct HealthState {
    gpus: Vec<GpuRecord>,
    mig: Vec<GpuRecord>,
    quiet_period: Option<Duration>,
}

impl HealthState {
    /// Every GPU of `inventory` healthy, except those discovery found lost. An unhealthy GPU
    /// recovers after `quiet_period` without errors (never, when `None`).
    pub(crate) fn new(
        inventory: &Inventory,
        quiet_period: Option<Duration>,
        now_ms: u64,
    ) -> HealthState {
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
            })
            .collect();
        HealthState {
            gpus,
            mig,
            quiet_period,
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
        let known = known(self.gpus.iter().chain(&self.mig));
        self.gpus
            .iter_mut()
            .chain(&mut self.mig)
            .find(|g| g.is(gpu))
            .ok_or_else(|| HealthError::UnknownGpu {
                gpu: gpu.to_string(),
                known,
            })
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
    ) -> Option<HealthChange> {
        let g = self.find(&GpuRef::Index(index)).ok()?;
        fail(g, failure, now_ms)
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
                changes.extend(fail(g, Failure::Xid { xid }, now_ms));
            }
        }
        hit.then_some(changes)
    }

    /// GPUs whose quiet period has passed, now healthy again.
    pub(crate) fn expire(&mut self, now_ms: u64) -> Vec<HealthChange> {
        let Some(quiet) = self.quiet_period else {
            return Vec::new();
        };
        let quiet_ms = u64::try_from(quiet.as_millis()).unwrap_or(u64::MAX);
        let mut changes = Vec::new();
        for g in self.gpus.iter_mut().chain(&mut self.mig) {
            if let GpuHealth::Unhealthy {
                reason,
                last_error_ms,
                ..
            } = &g.health
                && !reason.is_permanent()
                && now_ms.saturating_sub(*last_error_ms) >= quiet_ms
            {
                g.health = GpuHealth::Healthy;
                changes.push(change(g, false));
            }
        }
        changes
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
            if !saved.health.is_healthy() {
                g.health = saved.health.clone();
                changes.push(change(g, true));
            }
        }
        Ok(changes)
    }
}

fn change(g: &GpuRecord, restored: bool) -> HealthChange {
    HealthChange {
        index: g.index,
        uuid: g.uuid.clone(),
        health: g.health.clone(),
        restored,
        mig: g.mig.clone(),
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

    #[test]
    fn failure_then_quiet_period_recovery() {
        let mut s = HealthState::new(&inventory(4), Some(Duration::from_secs(10)), 0);
        assert!(s.get(3).unwrap().health.failure() == Some(&Failure::Lost));
        let c = s.record(1, Failure::Xid { xid: 48 }, 1_000).unwrap();
        assert_eq!(c.index, 1);
        assert_eq!(
            c.limitation().unwrap(),
            "GPU 1 (GPU-00000001-0000-0000-0000-000000000000) failed: XID 48 (double-bit ECC error)"
        );
        assert_eq!(
            s.record(1, Failure::Xid { xid: 63 }, 5_000),
            None,
            "already unhealthy"
        );
        assert!(
            s.expire(14_999).is_empty(),
            "quiet period restarts at the latest error"
        );
        let back = s.expire(15_000);
        assert_eq!(back.len(), 1, "{back:?}");
        assert!(back[0].health.is_healthy() && back[0].limitation().is_none());
        assert!(
            s.get(3).is_some_and(|g| !g.health.is_healthy()),
            "lost never recovers"
        );
        assert!(s.get(0).unwrap().health.is_healthy() && s.get(2).unwrap().health.is_healthy());
    }

    #[test]
    fn lost_replaces_reason_and_is_permanent() {
        let mut s = HealthState::new(&inventory(2), Some(Duration::from_millis(1)), 0);
        s.record(0, Failure::DoubleBitEcc, 1);
        s.record(0, Failure::Lost, 2);
        assert_eq!(s.get(0).unwrap().health.failure(), Some(&Failure::Lost));
        assert!(s.expire(1_000_000).is_empty());
        let c = s.mark_healthy(&GpuRef::parse("GPU-00000000-0000-0000-0000-000000000000").unwrap());
        assert!(c.unwrap().unwrap().health.is_healthy());
        assert_eq!(s.mark_healthy(&GpuRef::Index(0)).unwrap(), None);
    }

    #[test]
    fn no_quiet_period_means_no_recovery() {
        let mut s = HealthState::new(&inventory(2), None, 0);
        s.record(1, Failure::Xid { xid: 94 }, 1);
        assert!(s.expire(u64::MAX).is_empty());
    }

    #[test]
    fn unknown_gpus_and_bad_refs_are_named() {
        let mut s = HealthState::new(&inventory(2), None, 0);
        let err = s.mark_healthy(&GpuRef::Index(7)).unwrap_err();
        assert!(
            err.to_string().contains("GPU 7") && err.to_string().contains("0 GPU-0000"),
            "{err}"
        );
        assert!(s.record(9, Failure::Lost, 0).is_none());
        let err = GpuRef::parse("gpu3").unwrap_err();
        assert!(err.to_string().contains("\"gpu3\""), "{err}");
    }

    #[test]
    fn snapshot_round_trips_through_json_and_restores_by_uuid() {
        let mut s = HealthState::new(&inventory(4), None, 0);
        s.record(2, Failure::Xid { xid: 79 }, 10);
        s.count_xid(2, 79);
        s.count_xid(0, 13);
        s.count_ecc(1, false);
        let json = serde_json::to_string(&s.snapshot()).unwrap();
        let snap: HealthSnapshot = serde_json::from_str(&json).unwrap();

        let mut inv = inventory(4);
        inv.gpus.swap(0, 2);
        inv.gpus[0].index = 0;
        inv.gpus[2].index = 2;
        let mut fresh = HealthState::new(&inv, None, 0);
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
        let mut s = HealthState::new(&mig_inventory(), Some(Duration::from_secs(10)), 0);
        let changes = s.record_mig(1, 1, Some(1), 94, true, 1_000).unwrap();
        assert_eq!(changes.len(), 1);
        assert_eq!(changes[0].uuid, "MIG-1-1");
        assert_eq!(
            changes[0].limitation().unwrap(),
            "MIG device MIG-1-1 (GPU 1, GPU instance 1, compute instance 1) failed: XID 94 (contained ECC error)"
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
        // The quiet period, the operator and a restart treat MIG records as GPU records.
        let mig_ref = GpuRef::parse("MIG-1-0").unwrap();
        assert_eq!(s.mark_healthy(&mig_ref).unwrap().unwrap().uuid, "MIG-1-0");
        assert_eq!(
            s.expire(11_999),
            [],
            "GI 1's second XID restarted MIG-1-1's quiet period"
        );
        assert_eq!(s.expire(12_000)[0].uuid, "MIG-1-1");
        let mut fresh = HealthState::new(&mig_inventory(), None, 0);
        let restored = fresh.restore(&snap).unwrap();
        assert_eq!(restored.len(), 2);
        assert!(restored.iter().all(|c| c.restored && c.mig.is_some()));
        assert!(GpuRef::Index(1) != mig_ref);
        assert_eq!(fresh.index_of(&mig_ref).unwrap(), 1);
    }
}
