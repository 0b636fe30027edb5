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

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::HealthError;
use super::xid::xid_meaning;
use crate::inventory::Inventory;

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
    /// Parses `3` or `GPU-8a2d…`.
    pub fn parse(text: &str) -> Result<GpuRef, HealthError> {
        let text = text.trim();
        if let Ok(index) = text.parse::<u32>() {
            return Ok(GpuRef::Index(index));
        }
        if text.len() > 4 && text[..4].eq_ignore_ascii_case("GPU-") {
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

/// A GPU's health moved between healthy and unhealthy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthChange {
    /// NVML index.
    pub index: u32,
    /// UUID.
    pub uuid: String,
    /// The new health.
    pub health: GpuHealth,
    /// True when the change was read back from a checkpoint at start, not observed now.
    pub restored: bool,
}

impl HealthChange {
    /// For a GPU turning unhealthy, the limitation its holder is told, e.g.
    /// `GPU 3 (GPU-…) failed: XID 79 (GPU has fallen off the bus)`.
    pub fn limitation(&self) -> Option<String> {
        self.health
            .failure()
            .map(|reason| format!("GPU {} ({}) failed: {reason}", self.index, self.uuid))
    }
}

/// One GPU's record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuRecord {
    /// NVML index.
    pub index: u32,
    /// UUID.
    pub uuid: String,
    /// Current health.
    pub health: GpuHealth,
    /// Every XID seen on the GPU since start, counted or ignored, by XID.
    pub xids: BTreeMap<u64, u64>,
    /// Single-bit (corrected) ECC events seen.
    pub ecc_single_bit: u64,
    /// Double-bit (uncorrectable) ECC events seen.
    pub ecc_double_bit: u64,
}

/// The checkpointed form of `HealthState`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HealthSnapshot {
    /// Schema version, [`HealthSnapshot::VERSION`].
    pub version: u32,
    /// Every GPU's record.
    pub gpus: Vec<GpuRecord>,
}

impl HealthSnapshot {
    /// The schema version written.
    pub const VERSION: u32 = 1;

    /// The record of `gpu`, by index or UUID.
    pub fn find(&self, gpu: &GpuRef) -> Option<&GpuRecord> {
        self.gpus.iter().find(|g| match gpu {
            GpuRef::Index(i) => g.index == *i,
            GpuRef::Uuid(u) => g.uuid.eq_ignore_ascii_case(u),
        })
    }

    /// Marks `gpu` healthy in the checkpoint itself (when no monitor runs); returns whether it
    /// was unhealthy.
    pub fn mark_healthy(&mut self, gpu: &GpuRef) -> Result<bool, HealthError> {
        let known = self
            .gpus
            .iter()
            .map(|g| format!("{} {}", g.index, g.uuid))
            .collect::<Vec<_>>()
            .join(", ");
        let record = self
            .gpus
            .iter_mut()
            .find(|g| match gpu {
                GpuRef::Index(i) => g.index == *i,
                GpuRef::Uuid(u) => g.uuid.eq_ignore_ascii_case(u),
            })
            .ok_or_else(|| HealthError::UnknownGpu {
                gpu: gpu.to_string(),
                known,
            })?;
        let was = !record.health.is_healthy();
        record.health = GpuHealth::Healthy;
        Ok(was)
    }
}

/// The health of every GPU of a node.
#[derive(Debug, Clone)]
pub(crate) struct HealthState {
    gpus: Vec<GpuRecord>,
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
        HealthState { gpus, quiet_period }
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
        let known = self
            .gpus
            .iter()
            .map(|g| format!("{} {}", g.index, g.uuid))
            .collect::<Vec<_>>()
            .join(", ");
        self.gpus
            .iter_mut()
            .find(|g| match gpu {
                GpuRef::Index(i) => g.index == *i,
                GpuRef::Uuid(u) => g.uuid.eq_ignore_ascii_case(u),
            })
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

    /// GPUs whose quiet period has passed, now healthy again.
    pub(crate) fn expire(&mut self, now_ms: u64) -> Vec<HealthChange> {
        let Some(quiet) = self.quiet_period else {
            return Vec::new();
        };
        let quiet_ms = u64::try_from(quiet.as_millis()).unwrap_or(u64::MAX);
        let mut changes = Vec::new();
        for g in &mut self.gpus {
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
            version: HealthSnapshot::VERSION,
            gpus: self.gpus.clone(),
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
        if snapshot.version != HealthSnapshot::VERSION {
            return Err(HealthError::CheckpointVersion {
                found: snapshot.version,
                expected: HealthSnapshot::VERSION,
            });
        }
        let mut changes = Vec::new();
        for saved in &snapshot.gpus {
            let Some(g) = self.gpus.iter_mut().find(|g| g.uuid == saved.uuid) else {
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
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a failed unwrap fails the test at its line
mod tests {
    use super::*;
    use crate::inventory::Gpu;

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

        let err = fresh
            .restore(&HealthSnapshot {
                version: 9,
                gpus: vec![],
            })
            .unwrap_err();
        assert!(err.to_string().contains("version 9"), "{err}");
    }
}
