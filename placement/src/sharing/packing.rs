//! Where a share goes. A request of k units is a k/R share of ONE shared GPU (k ≤ R); it is
//! refused with the reason when no single GPU has k free units.
//!
//! [`Placement::Pack`] (the default) puts a share on a partly used GPU first (the one it fills
//! most tightly), so untouched GPUs stay free for large shares; [`Placement::Spread`] puts it on
//! the least used GPU (what naive round-robin gives), kept for comparison: the
//! `share_packing` example prints both refusal rates on a simulated request stream.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use super::plan::{SharingMode, SharingPlan};

const MIB: u64 = 1 << 20;

/// How a share is placed among the shared GPUs that can hold it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Placement {
    /// Partly used GPUs first, tightest fit first.
    #[default]
    Pack,
    /// Least used GPU first.
    Spread,
}

impl fmt::Display for Placement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Placement::Pack => "pack",
            Placement::Spread => "spread",
        })
    }
}

/// Why a share cannot be placed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlacementError {
    /// Zero units asked.
    #[error("a GPU share needs at least 1 unit; {owner} asked for 0")]
    Zero {
        /// Who asked.
        owner: String,
    },
    /// More units than any shared GPU has replicas: it can never fit one GPU.
    #[error(
        "{owner} asks {asked} GPU units, more than one shared GPU holds (at most {largest} replicas); a share is never spread across GPUs: ask at most {largest}"
    )]
    TooLarge {
        /// Who asked.
        owner: String,
        /// Units asked.
        asked: u32,
        /// The largest replica count (0 when no GPU is shared).
        largest: u32,
    },
    /// No shared GPU has enough free units now.
    #[error("no shared GPU has {asked} free units for {owner} (free units: {free})")]
    NoRoom {
        /// Who asked.
        owner: String,
        /// Units asked.
        asked: u32,
        /// Free units per GPU, `uuid: free/R` comma-separated, with unusable GPUs' reasons.
        free: String,
    },
    /// The owner already holds a share.
    #[error("{owner} already holds a share of GPU {uuid}")]
    AlreadyHolds {
        /// Who asked.
        owner: String,
        /// The GPU it holds.
        uuid: String,
    },
}

/// The limits a share of k units out of R gets under MPS.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ShareLimits {
    /// `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`: ⌊100·k/R⌋, at least 1.
    pub active_thread_percentage: u32,
    /// `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`, MiB: ⌊framebuffer·k/R⌋ (NVIDIA's plugin gives
    /// total/replicas per replica).
    pub pinned_mem_limit_mib: u64,
}

/// One placed share.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ShareGrant {
    /// The GPU's UUID.
    pub uuid: String,
    /// The GPU's NVML index.
    pub index: u32,
    /// Units held (k).
    pub units: u32,
    /// The GPU's replica count (R).
    pub replicas: u32,
    /// How the share is enforced.
    pub mode: SharingMode,
    /// The k/R limits (enforced under MPS, informative under time-slicing).
    pub limits: ShareLimits,
}

impl ShareGrant {
    /// What every holder is told: `MESOS_GPU_SHARE=k/R` and `MESOS_GPU_SHARING=<mode>`.
    pub fn env(&self) -> Vec<(String, String)> {
        vec![
            (
                "MESOS_GPU_SHARE".to_owned(),
                format!("{}/{}", self.units, self.replicas),
            ),
            ("MESOS_GPU_SHARING".to_owned(), self.mode.to_string()),
        ]
    }
}

impl ShareLimits {
    /// The limits of k units out of R on a GPU of `memory_total` bytes.
    pub fn of(units: u32, replicas: u32, memory_total: u64) -> ShareLimits {
        let r = u64::from(replicas.max(1));
        let k = u64::from(units);
        ShareLimits {
            active_thread_percentage: u32::try_from(100 * k / r).unwrap_or(100).max(1),
            pinned_mem_limit_mib: memory_total / MIB * k / r,
        }
    }
}

#[derive(Debug, Clone)]
struct Slot {
    index: u32,
    uuid: String,
    replicas: u32,
    memory_total: u64,
    holders: BTreeMap<String, u32>,
    unusable: Option<String>,
}

impl Slot {
    fn used(&self) -> u32 {
        self.holders.values().sum()
    }

    fn free(&self) -> u32 {
        self.replicas.saturating_sub(self.used())
    }
}

/// The shares of a node's shared GPUs: who holds how many units of which GPU.
#[derive(Debug, Clone)]
pub struct ShareBook {
    mode: SharingMode,
    slots: Vec<Slot>,
}

impl ShareBook {
    /// An empty book over the plan's shared GPUs.
    pub fn new(plan: &SharingPlan) -> ShareBook {
        ShareBook {
            mode: plan.mode,
            slots: plan
                .shared
                .iter()
                .map(|g| Slot {
                    index: g.index,
                    uuid: g.uuid.clone(),
                    replicas: g.replicas,
                    memory_total: g.memory_total,
                    holders: BTreeMap::new(),
                    unusable: None,
                })
                .collect(),
        }
    }

    /// Marks a GPU unusable for new shares (unhealthy, held whole); its holders keep their
    /// shares. Returns false when the GPU is not shared.
    pub fn mark_unusable(&mut self, uuid: &str, why: &str) -> bool {
        match self.slots.iter_mut().find(|s| s.uuid == uuid) {
            Some(slot) => {
                slot.unusable = Some(why.to_owned());
                true
            }
            None => false,
        }
    }

    /// Records a share that already exists (recovery, the pool's records), even past R (an
    /// over-full GPU then takes nothing more). Returns false when the GPU is not shared.
    pub fn record(&mut self, owner: &str, uuid: &str, units: u32) -> bool {
        match self.slots.iter_mut().find(|s| s.uuid == uuid) {
            Some(slot) => {
                slot.holders.insert(owner.to_owned(), units);
                true
            }
            None => false,
        }
    }

    /// Places a share of `units` for `owner`.
    pub fn place(
        &mut self,
        owner: &str,
        units: u32,
        policy: Placement,
    ) -> Result<ShareGrant, PlacementError> {
        if units == 0 {
            return Err(PlacementError::Zero {
                owner: owner.to_owned(),
            });
        }
        if let Some(slot) = self.slots.iter().find(|s| s.holders.contains_key(owner)) {
            return Err(PlacementError::AlreadyHolds {
                owner: owner.to_owned(),
                uuid: slot.uuid.clone(),
            });
        }
        let largest = self.largest();
        if units > largest {
            return Err(PlacementError::TooLarge {
                owner: owner.to_owned(),
                asked: units,
                largest,
            });
        }
        let candidates = self
            .slots
            .iter()
            .enumerate()
            .filter(|(_, s)| s.unusable.is_none() && s.free() >= units);
        let chosen = match policy {
            // Partly used first, then the tightest fit, then the lowest index.
            Placement::Pack => {
                candidates.min_by_key(|(_, s)| (s.used() == 0, s.free() - units, s.index))
            }
            // Least used fraction first (used/R compared as used·R' < used'·R), then index.
            Placement::Spread => candidates.min_by(|(_, a), (_, b)| {
                (u64::from(a.used()) * u64::from(b.replicas), a.index)
                    .cmp(&(u64::from(b.used()) * u64::from(a.replicas), b.index))
            }),
        };
        let Some((at, _)) = chosen else {
            return Err(PlacementError::NoRoom {
                owner: owner.to_owned(),
                asked: units,
                free: self.describe_free(),
            });
        };
        let slot = &mut self.slots[at];
        slot.holders.insert(owner.to_owned(), units);
        Ok(ShareGrant {
            uuid: slot.uuid.clone(),
            index: slot.index,
            units,
            replicas: slot.replicas,
            mode: self.mode,
            limits: ShareLimits::of(units, slot.replicas, slot.memory_total),
        })
    }

    /// The largest replica count (0 when no GPU is shared).
    pub fn largest(&self) -> u32 {
        self.slots.iter().map(|s| s.replicas).max().unwrap_or(0)
    }

    /// Frees `owner`'s share; returns the GPU's UUID and the units it held.
    pub fn release(&mut self, owner: &str) -> Option<(String, u32)> {
        self.slots
            .iter_mut()
            .find_map(|s| s.holders.remove(owner).map(|units| (s.uuid.clone(), units)))
    }

    /// Units free on each usable shared GPU, by UUID.
    pub fn free(&self) -> BTreeMap<&str, u32> {
        self.slots
            .iter()
            .filter(|s| s.unusable.is_none())
            .map(|s| (s.uuid.as_str(), s.free()))
            .collect()
    }

    /// Shared GPUs with no holder.
    pub fn idle(&self) -> BTreeSet<&str> {
        self.slots
            .iter()
            .filter(|s| s.holders.is_empty())
            .map(|s| s.uuid.as_str())
            .collect()
    }

    /// The holders of a GPU and their units.
    pub fn holders(&self, uuid: &str) -> Vec<(&str, u32)> {
        self.slots
            .iter()
            .filter(|s| s.uuid == uuid)
            .flat_map(|s| s.holders.iter().map(|(o, k)| (o.as_str(), *k)))
            .collect()
    }

    fn describe_free(&self) -> String {
        if self.slots.is_empty() {
            return "no GPU is shared".into();
        }
        self.slots
            .iter()
            .map(|s| match &s.unusable {
                Some(why) => format!("{}: unusable ({why})", s.uuid),
                None => format!("{}: {}/{}", s.uuid, s.free(), s.replicas),
            })
            .collect::<Vec<_>>()
            .join(", ")
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::sharing::plan::SharingSpec;
    use mesos_gpu_node::nodes::dgx1_v100;

    fn book(spec: &str, gpus: &[u32]) -> ShareBook {
        let inv = dgx1_v100().inventory();
        ShareBook::new(
            &SharingSpec::parse(spec, SharingMode::Mps)
                .unwrap()
                .resolve(&inv, gpus)
                .unwrap(),
        )
    }

    #[test]
    fn issue_17_a_share_is_k_over_r_of_one_gpu_with_its_limits() {
        let mut b = book("4", &[0, 1]);
        let g = b.place("t1", 3, Placement::Pack).unwrap();
        assert_eq!((g.units, g.replicas, g.index), (3, 4, 0));
        assert_eq!(g.limits.active_thread_percentage, 75);
        assert_eq!(g.limits.pinned_mem_limit_mib, 16 * 1024 * 3 / 4);
        // 2 more units fit no single GPU 0 (1 free) but GPU 1: never spread across both.
        let g = b.place("t2", 2, Placement::Pack).unwrap();
        assert_eq!(g.index, 1);
        let err = b.place("t3", 3, Placement::Pack).unwrap_err();
        assert!(
            matches!(err, PlacementError::NoRoom { asked: 3, .. }),
            "{err}"
        );
        assert!(
            err.to_string().contains("1/4") && err.to_string().contains("2/4"),
            "{err}"
        );
        let err = b.place("t4", 5, Placement::Pack).unwrap_err();
        assert!(err.to_string().contains("at most 4"), "{err}");
        assert!(matches!(
            b.place("t5", 0, Placement::Pack),
            Err(PlacementError::Zero { .. })
        ));
        assert!(matches!(
            b.place("t1", 1, Placement::Pack),
            Err(PlacementError::AlreadyHolds { .. })
        ));
        assert_eq!(b.release("t1").unwrap().1, 3);
        assert_eq!(b.place("t3", 3, Placement::Pack).unwrap().index, 0);
    }

    #[test]
    fn issue_17_pack_fills_partly_used_gpus_first_spread_does_not() {
        let mut pack = book("4", &[0, 1, 2]);
        let mut spread = pack.clone();
        for i in 0..4 {
            pack.place(&format!("p{i}"), 1, Placement::Pack).unwrap();
            spread
                .place(&format!("s{i}"), 1, Placement::Spread)
                .unwrap();
        }
        assert_eq!(pack.idle().len(), 2, "four 1/4 shares fill one GPU");
        assert_eq!(spread.idle().len(), 0);
        // A 4-unit share then fits the packed node only.
        pack.place("big", 4, Placement::Pack).unwrap();
        assert!(spread.place("big", 4, Placement::Spread).is_err());
    }

    #[test]
    fn issue_17_unusable_gpus_take_no_new_share_and_say_why() {
        let mut b = book("2", &[0]);
        let uuid = dgx1_v100().inventory().gpus[0].uuid.clone();
        assert!(b.record("old", &uuid, 1));
        assert!(b.mark_unusable(&uuid, "XID 79"));
        let err = b.place("new", 1, Placement::Pack).unwrap_err();
        assert!(err.to_string().contains("unusable (XID 79)"), "{err}");
        assert_eq!(b.holders(&uuid), vec![("old", 1)]);
    }
}
