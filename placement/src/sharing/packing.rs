//! Where a share goes. A request of k units is a k/R share of ONE shared GPU (k ≤ R); it is
//! refused with the reason when no single GPU has k free units.
//!
//! [`Placement::Pack`] (the default) puts a share on a partly used GPU first (the one it fills
//! most tightly), so untouched GPUs stay free for large shares; [`Placement::Spread`] puts it on
//! the least used GPU (what naive round-robin gives), kept for comparison: the
//! `share_packing` example prints both refusal rates on a simulated request stream.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use super::plan::{Among, SharingMode, SharingPlan};
use crate::mig::MigKind;

const MIB: u64 = 1 << 20;

/// What a request asks of the node's GPUs: any share, a share under one mode, or whole GPUs.
/// A task says so in its environment: `MESOS_GPU_SHARE_MODE=mps|time-slicing|none`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Wanted {
    /// A share of any shared GPU (or whole GPUs when the request is larger).
    #[default]
    Any,
    /// A share of a GPU shared under this mode.
    Mode(SharingMode),
    /// Whole (exclusive) GPUs only.
    Whole,
}

/// The task environment variable a request names its mode with.
pub const SHARE_MODE_ENV: &str = "MESOS_GPU_SHARE_MODE";

impl Wanted {
    /// Parses the value of [`SHARE_MODE_ENV`]: `mps`, `time-slicing`, `none` (whole GPUs) or
    /// empty/`any`.
    pub fn parse(text: &str) -> Result<Wanted, super::plan::SharingError> {
        match text.trim() {
            "" | "any" => Ok(Wanted::Any),
            "none" | "exclusive" | "whole" => Ok(Wanted::Whole),
            other => {
                other
                    .parse()
                    .map(Wanted::Mode)
                    .map_err(|_| super::plan::SharingError::ModeEntry {
                        entry: format!("{SHARE_MODE_ENV}={other}"),
                    })
            }
        }
    }

    fn admits(self, mode: SharingMode) -> bool {
        match self {
            Wanted::Any => true,
            Wanted::Mode(m) => m == mode,
            Wanted::Whole => false,
        }
    }
}

impl fmt::Display for Wanted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Wanted::Any => f.write_str("any share"),
            Wanted::Mode(m) => write!(f, "a {m} share"),
            Wanted::Whole => f.write_str("whole GPUs"),
        }
    }
}

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
    /// No GPU of the node is shared under the mode asked for.
    #[error(
        "{owner} asks {wanted} ({SHARE_MODE_ENV}), but no GPU of this node is shared so (shared GPUs: {modes})"
    )]
    NoSuchMode {
        /// Who asked.
        owner: String,
        /// What was asked for.
        wanted: Wanted,
        /// The node's shared GPUs and their modes, or `none`.
        modes: String,
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
pub struct PlacedShare {
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

impl PlacedShare {
    /// True when the share is of a MIG device (its UUID is the device's `MIG-…`, its index the
    /// parent GPU's).
    pub fn is_mig(&self) -> bool {
        self.uuid.starts_with("MIG-")
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
    owners: BTreeMap<String, u32>,
    unusable: Option<String>,
    mode: SharingMode,
    /// A MIG device's parent GPU UUID, and its kind.
    mig_parent: Option<String>,
    mig_kind: Option<MigKind>,
}

impl Slot {
    fn admits(&self, wanted: Wanted, among: Among) -> bool {
        wanted.admits(self.mode) && among.admits(self.mig_parent.as_deref(), self.mig_kind)
    }

    fn used(&self) -> u32 {
        self.owners.values().sum()
    }

    fn free(&self) -> u32 {
        self.replicas.saturating_sub(self.used())
    }
}

/// The shares of a node's shared GPUs: who holds how many units of which GPU.
#[derive(Debug, Clone)]
pub struct ShareBook {
    slots: Vec<Slot>,
}

impl ShareBook {
    /// An empty book over the plan's shared GPUs.
    pub fn new(plan: &SharingPlan) -> ShareBook {
        ShareBook {
            slots: plan
                .shared
                .iter()
                .map(|g| Slot {
                    index: g.index,
                    uuid: g.uuid.clone(),
                    replicas: g.replicas,
                    memory_total: g.memory_total,
                    owners: BTreeMap::new(),
                    unusable: None,
                    mode: g.mode,
                    mig_parent: g.mig_parent.clone(),
                    mig_kind: g.mig_kind,
                })
                .collect(),
        }
    }

    /// Marks a GPU unusable for new shares (unhealthy, held whole), with its MIG devices when
    /// it is in MIG mode; their owners keep their shares. Returns false when neither the GPU
    /// nor a MIG device of it is shared.
    pub fn mark_unusable(&mut self, uuid: &str, why: &str) -> bool {
        let mut found = false;
        for slot in self
            .slots
            .iter_mut()
            .filter(|s| s.uuid == uuid || s.mig_parent.as_deref() == Some(uuid))
        {
            slot.unusable = Some(why.to_owned());
            found = true;
        }
        found
    }

    /// Records a share that already exists (recovery, the pool's records), even past R (an
    /// over-full GPU then takes nothing more). A share begun under another mode than the GPU's
    /// now (the operator changed it) keeps its mode: the GPU takes no new share until such
    /// shares end, since MPS and plain clients cannot share a GPU. Returns false when the GPU is
    /// not shared.
    pub fn record(&mut self, owner: &str, uuid: &str, units: u32, mode: SharingMode) -> bool {
        match self.slots.iter_mut().find(|s| s.uuid == uuid) {
            Some(slot) => {
                slot.owners.insert(owner.to_owned(), units);
                if mode != slot.mode {
                    slot.unusable = Some(format!(
                        "holds {mode} shares begun before it became {}; it takes new shares once they end",
                        slot.mode
                    ));
                }
                true
            }
            None => false,
        }
    }

    /// Places a share of `units` for `owner` on a GPU `wanted` admits.
    pub fn place(
        &mut self,
        owner: &str,
        units: u32,
        policy: Placement,
        wanted: Wanted,
    ) -> Result<PlacedShare, PlacementError> {
        self.place_in(owner, units, policy, wanted, Among::All)
    }

    /// [`ShareBook::place`] among the shared units of `among` only (shared GPUs, or shared MIG
    /// devices of one kind).
    pub fn place_in(
        &mut self,
        owner: &str,
        units: u32,
        policy: Placement,
        wanted: Wanted,
        among: Among,
    ) -> Result<PlacedShare, PlacementError> {
        if units == 0 {
            return Err(PlacementError::Zero {
                owner: owner.to_owned(),
            });
        }
        if let Some(slot) = self.slots.iter().find(|s| s.owners.contains_key(owner)) {
            return Err(PlacementError::AlreadyHolds {
                owner: owner.to_owned(),
                uuid: slot.uuid.clone(),
            });
        }
        if !self.slots.iter().any(|s| s.admits(wanted, among)) {
            return Err(PlacementError::NoSuchMode {
                owner: owner.to_owned(),
                wanted,
                modes: self.describe_modes(),
            });
        }
        let largest = self
            .slots
            .iter()
            .filter(|s| s.admits(wanted, among))
            .map(|s| s.replicas)
            .max()
            .unwrap_or(0);
        if units > largest {
            return Err(PlacementError::TooLarge {
                owner: owner.to_owned(),
                asked: units,
                largest,
            });
        }
        let candidates =
            self.slots.iter().enumerate().filter(|(_, s)| {
                s.unusable.is_none() && s.free() >= units && s.admits(wanted, among)
            });
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
        slot.owners.insert(owner.to_owned(), units);
        Ok(PlacedShare {
            uuid: slot.uuid.clone(),
            index: slot.index,
            units,
            replicas: slot.replicas,
            mode: slot.mode,
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
            .find_map(|s| s.owners.remove(owner).map(|units| (s.uuid.clone(), units)))
    }

    /// Units free on each usable shared GPU, by UUID.
    pub fn free(&self) -> BTreeMap<&str, u32> {
        self.slots
            .iter()
            .filter(|s| s.unusable.is_none())
            .map(|s| (s.uuid.as_str(), s.free()))
            .collect()
    }

    /// Shared GPUs with no owner.
    pub fn idle(&self) -> BTreeSet<&str> {
        self.slots
            .iter()
            .filter(|s| s.owners.is_empty())
            .map(|s| s.uuid.as_str())
            .collect()
    }

    /// The owners of a GPU and their units.
    pub fn owners(&self, uuid: &str) -> Vec<(&str, u32)> {
        self.slots
            .iter()
            .filter(|s| s.uuid == uuid)
            .flat_map(|s| s.owners.iter().map(|(o, k)| (o.as_str(), *k)))
            .collect()
    }

    fn describe_free(&self) -> String {
        if self.slots.is_empty() {
            return "no GPU is shared".into();
        }
        self.slots
            .iter()
            .map(|s| match &s.unusable {
                Some(why) => format!("{} ({}): unusable ({why})", s.uuid, s.mode),
                None => format!("{} ({}): {}/{}", s.uuid, s.mode, s.free(), s.replicas),
            })
            .collect::<Vec<_>>()
            .join(", ")
    }

    fn describe_modes(&self) -> String {
        if self.slots.is_empty() {
            return "none".into();
        }
        self.slots
            .iter()
            .map(|s| format!("{} {}", s.index, s.mode))
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
            &SharingSpec::parse(spec, crate::sharing::ModeSpec::uniform(SharingMode::Mps))
                .unwrap()
                .resolve(&inv, gpus)
                .unwrap(),
        )
    }

    #[test]
    fn shares_of_mig_devices_pack_within_their_kind_and_leave_with_their_parent() {
        use crate::sharing::plan::ModeSpec;
        let inv = mesos_gpu_node::nodes::dgx1_with_mig_gpus();
        let plan = SharingSpec::parse("4", "mps,0-3=none".parse::<ModeSpec>().unwrap())
            .unwrap()
            .resolve(&inv, &[0, 1, 2, 3])
            .unwrap();
        let mut b = ShareBook::new(&plan);
        let one_g = Among::Mig(MigKind::whole(19));
        let any = Wanted::Any;
        let a = b.place_in("a", 2, Placement::Pack, any, one_g).unwrap();
        let c = b.place_in("c", 2, Placement::Pack, any, one_g).unwrap();
        assert_eq!((a.uuid.as_str(), a.index), ("MIG-4-1", 4));
        assert_eq!(c.uuid, a.uuid, "packed onto the partly used 1g device");
        assert!(a.is_mig() && a.mode == SharingMode::Mps);
        assert_eq!(a.limits.active_thread_percentage, 50);
        assert_eq!(
            a.limits.pinned_mem_limit_mib,
            5 * 1024 / 2,
            "half the 1g's 5 GiB"
        );
        let three_g = b
            .place_in("t", 1, Placement::Pack, any, Among::Mig(MigKind::whole(9)))
            .unwrap();
        assert_eq!(three_g.uuid, "MIG-4-0");
        assert!(matches!(
            b.place_in("g", 1, Placement::Pack, any, Among::Gpus),
            Err(PlacementError::NoSuchMode { .. })
        ));
        let err = b
            .place_in("big", 5, Placement::Pack, any, one_g)
            .unwrap_err();
        assert!(
            matches!(err, PlacementError::TooLarge { largest: 4, .. }),
            "{err}"
        );
        // The parent GPU out of service: none of its MIG devices takes a new share.
        assert!(b.mark_unusable(&inv.gpus[4].uuid, "unhealthy: XID 79"));
        let next = b.place_in("d", 1, Placement::Pack, any, one_g).unwrap();
        assert_eq!(next.index, 5, "{next:?}");
    }

    #[test]
    fn a_share_is_k_over_r_of_one_gpu_with_its_limits() {
        let mut b = book("4", &[0, 1]);
        let g = b.place("t1", 3, Placement::Pack, Wanted::Any).unwrap();
        assert_eq!((g.units, g.replicas, g.index), (3, 4, 0));
        assert_eq!(g.limits.active_thread_percentage, 75);
        assert_eq!(g.limits.pinned_mem_limit_mib, 16 * 1024 * 3 / 4);
        // 2 more units fit no single GPU 0 (1 free) but GPU 1: never spread across both.
        let g = b.place("t2", 2, Placement::Pack, Wanted::Any).unwrap();
        assert_eq!(g.index, 1);
        let err = b.place("t3", 3, Placement::Pack, Wanted::Any).unwrap_err();
        assert!(
            matches!(err, PlacementError::NoRoom { asked: 3, .. }),
            "{err}"
        );
        assert!(
            err.to_string().contains("(mps): 1/4") && err.to_string().contains("2/4"),
            "{err}"
        );
        let err = b.place("t4", 5, Placement::Pack, Wanted::Any).unwrap_err();
        assert!(err.to_string().contains("at most 4"), "{err}");
        assert!(matches!(
            b.place("t5", 0, Placement::Pack, Wanted::Any),
            Err(PlacementError::Zero { .. })
        ));
        assert!(matches!(
            b.place("t1", 1, Placement::Pack, Wanted::Any),
            Err(PlacementError::AlreadyHolds { .. })
        ));
        assert_eq!(b.release("t1").unwrap().1, 3);
        assert_eq!(
            b.place("t3", 3, Placement::Pack, Wanted::Any)
                .unwrap()
                .index,
            0
        );
    }

    #[test]
    fn pack_fills_partly_used_gpus_first_spread_does_not() {
        let mut pack = book("4", &[0, 1, 2]);
        let mut spread = pack.clone();
        for i in 0..4 {
            pack.place(&format!("p{i}"), 1, Placement::Pack, Wanted::Any)
                .unwrap();
            spread
                .place(&format!("s{i}"), 1, Placement::Spread, Wanted::Any)
                .unwrap();
        }
        assert_eq!(pack.idle().len(), 2, "four 1/4 shares fill one GPU");
        assert_eq!(spread.idle().len(), 0);
        // A 4-unit share then fits the packed node only.
        pack.place("big", 4, Placement::Pack, Wanted::Any).unwrap();
        assert!(
            spread
                .place("big", 4, Placement::Spread, Wanted::Any)
                .is_err()
        );
    }

    #[test]
    fn unusable_gpus_take_no_new_share_and_say_why() {
        let mut b = book("2", &[0]);
        let uuid = dgx1_v100().inventory().gpus[0].uuid.clone();
        assert!(b.record("old", &uuid, 1, SharingMode::Mps));
        assert!(b.mark_unusable(&uuid, "XID 79"));
        let err = b.place("new", 1, Placement::Pack, Wanted::Any).unwrap_err();
        assert!(err.to_string().contains("unusable (XID 79)"), "{err}");
        assert_eq!(b.owners(&uuid), vec![("old", 1)]);
    }
}

#[cfg(test)]
mod mode_tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::sharing::plan::{ModeSpec, SharingSpec};
    use mesos_gpu_node::nodes::dgx1_v100;

    #[test]
    fn a_request_names_its_mode_and_gets_a_gpu_of_that_mode() {
        let inv = dgx1_v100().inventory();
        let modes: ModeSpec = "mps,1=time-slicing".parse().unwrap();
        let plan = SharingSpec::parse("2", modes)
            .unwrap()
            .resolve(&inv, &[0, 1])
            .unwrap();
        let mut b = ShareBook::new(&plan);
        let ts = Wanted::parse("time-slicing").unwrap();
        let g = b.place("a", 1, Placement::Pack, ts).unwrap();
        assert_eq!((g.index, g.mode), (1, SharingMode::TimeSlicing));
        let g = b
            .place("b", 1, Placement::Pack, Wanted::Mode(SharingMode::Mps))
            .unwrap();
        assert_eq!((g.index, g.mode), (0, SharingMode::Mps));
        assert_eq!(b.place("c", 1, Placement::Pack, ts).unwrap().index, 1);
        let err = b.place("d", 1, Placement::Pack, ts).unwrap_err();
        assert!(matches!(err, PlacementError::NoRoom { .. }), "{err}");
        // Any share goes where there is room, whatever its mode.
        assert_eq!(
            b.place("e", 1, Placement::Pack, Wanted::Any).unwrap().index,
            0
        );
        assert_eq!(Wanted::parse("none").unwrap(), Wanted::Whole);
        assert_eq!(Wanted::parse(" ").unwrap(), Wanted::Any);
        let err = Wanted::parse("fast").unwrap_err();
        assert!(
            err.to_string().contains("MESOS_GPU_SHARE_MODE=fast"),
            "{err}"
        );
        let plan = SharingSpec::parse("2", ModeSpec::default())
            .unwrap()
            .resolve(&inv, &[0])
            .unwrap();
        let err = ShareBook::new(&plan)
            .place("f", 1, Placement::Pack, Wanted::Mode(SharingMode::Mps))
            .unwrap_err();
        assert!(
            err.to_string()
                .contains("no GPU of this node is shared so (shared GPUs: 0 time-slicing)"),
            "{err}"
        );
    }

    #[test]
    fn a_share_keeps_its_mode_when_the_gpu_changes_mode_under_it() {
        let inv = dgx1_v100().inventory();
        let plan = SharingSpec::parse("2", ModeSpec::uniform(SharingMode::TimeSlicing))
            .unwrap()
            .resolve(&inv, &[0])
            .unwrap();
        let uuid = inv.gpus[0].uuid.clone();
        let mut b = ShareBook::new(&plan);
        // Begun under mps before a restart with time-slicing.
        assert!(b.record("old", &uuid, 1, SharingMode::Mps));
        let err = b.place("new", 1, Placement::Pack, Wanted::Any).unwrap_err();
        assert!(
            err.to_string()
                .contains("holds mps shares begun before it became time-slicing"),
            "{err}"
        );
        b.release("old");
        let mut b = ShareBook::new(&plan);
        assert_eq!(
            b.place("new", 1, Placement::Pack, Wanted::Any)
                .unwrap()
                .mode,
            SharingMode::TimeSlicing
        );
    }
}
