//! Whole-GPU allocation: which GPUs each container (owner) holds, chosen by a [`Policy`].
//!
//! Pure bookkeeping and search: no NVML, no files, no cgroups. The lifecycle wraps one
//! [`Allocator`] in a mutex; every call is all-or-nothing, so a refused call changes nothing.
//!
//! Facts relied on:
//! - Mesos's `NvidiaGpuAllocator` grants the first free GPUs in (major, minor) order, and refuses
//!   to grant what is taken or to free what is not allocated
//!   (`docs/reference/mesos-gpu-isolator.md` §3); [`Policy::FirstFit`] keeps that behaviour and its
//!   error cases.
//! - NVIDIA's go-gpuallocator scores a set by the sum of its pair scores, and a pair by the sum
//!   over its links: the PCIe level's points plus 100 per NVLink (`docs/reference/topology.md` §1);
//!   [`Policy::Topology`] maximises that score exactly for up to 16 free GPUs, where NVIDIA's
//!   exhaustive search takes seconds (`docs/reference/topology.md` §2), with a greedy above that.
//!   Among equally scored sets it keeps the free GPUs best connected, for every request size. The
//!   order of preference and the search are documented in `allocator/search.rs` and
//!   `docs/allocator.md`; what that means for single GPUs, in `allocator/policy.rs`.
//! - Pair scores come from [`Topology::pair_score`]'s rule (the weaker direction when the data
//!   is asymmetric, 0 for an unknown part); NVLink counts above 18 are taken as 18.
//! - A GPU marked unhealthy is never granted; one that is allocated stays with its owner until
//!   released, and then does not return to the free pool until marked healthy.

mod counters;
mod error;
mod policy;
mod request;
mod search;
mod set;

use std::collections::BTreeMap;

use serde::Serialize;

pub use counters::Counters;

pub use error::AllocError;
pub use policy::Policy;
pub use request::GpuRequest;
pub use set::GpuSet;

use mesos_gpu_node::{inventory::Inventory, inventory::Topology};
use policy::Node;
use search::{MAX_GPUS, Weights};
use set::Bits;

/// How well the free GPUs are connected, for metrics and `info`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Fragmentation {
    /// Number of free, healthy GPUs.
    pub free: u32,
    /// `best_score[k]` is the highest score (sum of pair scores) of any `k` free GPUs, for
    /// `k = 0..=free`; sizes 0 and 1 score 0. A drop against a fresh node shows fragmentation.
    pub best_score: Vec<u64>,
    /// The largest request that free GPUs can still serve with every pair NVLinked (pair score of
    /// 100 or more); 1 when no two free GPUs are NVLinked, 0 when none is free.
    pub nvlink_set: u32,
    /// False when more than 16 GPUs are free and `best_score` comes from the greedy.
    pub exact: bool,
}

/// The GPUs a resize added or gave back (one of the two is empty).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Resize {
    /// GPUs newly granted.
    pub added: GpuSet,
    /// GPUs given back.
    pub released: GpuSet,
}

/// The GPUs of a node, who holds which, and which are unhealthy.
#[derive(Clone)]
pub struct Allocator {
    policy: Policy,
    managed: u64,
    unhealthy: u64,
    allocated: u64,
    owners: BTreeMap<String, u64>,
    /// Managed indices by ascending (minor, index), for first-fit.
    by_minor: Vec<u32>,
    minors: BTreeMap<u32, u32>,
    weights: Weights,
    counters: Counters,
}

impl std::fmt::Debug for Allocator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Allocator")
            .field("policy", &self.policy)
            .field("managed", &GpuSet::from_mask(self.managed))
            .field("unhealthy", &GpuSet::from_mask(self.unhealthy))
            .field("owners", &self.owners())
            .finish_non_exhaustive()
    }
}

impl Allocator {
    /// An allocator over every GPU of `inventory` that can be given whole (not in MIG mode);
    /// GPUs discovery found unhealthy start unhealthy.
    pub fn new(inventory: &Inventory, policy: Policy) -> Result<Allocator, AllocError> {
        let all: Vec<u32> = inventory.whole_gpus().map(|g| g.index).collect();
        Allocator::with_devices(inventory, &all, policy)
    }

    /// An allocator over the GPUs of `inventory` with these NVML indices only (the agent's
    /// `--nvidia_gpu_devices`); an index that is unknown, repeated, above 63 or of a GPU in MIG
    /// mode is refused.
    pub fn with_devices(
        inventory: &Inventory,
        devices: &[u32],
        policy: Policy,
    ) -> Result<Allocator, AllocError> {
        let known = GpuSet::from_indices(
            inventory
                .gpus
                .iter()
                .map(|g| g.index)
                .filter(|&i| i <= GpuSet::MAX_INDEX),
        )?;
        let mut managed = 0u64;
        let mut unhealthy = 0u64;
        let mut positions = [0usize; MAX_GPUS];
        let mut minors = BTreeMap::new();
        for &index in devices {
            let bit = GpuSet::from_indices([index])?.mask();
            let position = inventory.gpus.iter().position(|g| g.index == index).ok_or(
                AllocError::UnknownGpu {
                    index,
                    managed: known,
                },
            )?;
            if managed & bit != 0 {
                return Err(AllocError::DuplicateGpu { index });
            }
            if inventory.mig.is_enabled(index) {
                return Err(AllocError::MigEnabled { index });
            }
            managed |= bit;
            let gpu = &inventory.gpus[position];
            if !gpu.healthy {
                unhealthy |= bit;
            }
            positions[index as usize] = position;
            minors.insert(index, gpu.minor);
        }
        let topology: &Topology = &inventory.topology;
        let weights = Weights::new(managed, |a, b| {
            topology
                .get(positions[a as usize], positions[b as usize])
                .score()
        });
        let mut by_minor: Vec<u32> = minors.keys().copied().collect();
        by_minor.sort_by_key(|index| (minors[index], *index));
        Ok(Allocator {
            policy,
            managed,
            unhealthy,
            allocated: 0,
            owners: BTreeMap::new(),
            by_minor,
            minors,
            weights,
            counters: Counters::default(),
        })
    }

    /// The policy GPUs are chosen by.
    pub fn policy(&self) -> Policy {
        self.policy
    }

    /// How many GPUs this allocator manages (the agent's `gpus` resource).
    pub fn offered(&self) -> u32 {
        self.managed.count_ones()
    }

    /// Every GPU managed.
    pub fn managed(&self) -> GpuSet {
        GpuSet::from_mask(self.managed)
    }

    /// GPUs that are healthy and held by nobody.
    pub fn free(&self) -> GpuSet {
        GpuSet::from_mask(self.free_mask())
    }

    /// GPUs held by some owner.
    pub fn allocated(&self) -> GpuSet {
        GpuSet::from_mask(self.allocated)
    }

    /// GPUs marked unhealthy, held or not.
    pub fn unhealthy(&self) -> GpuSet {
        GpuSet::from_mask(self.unhealthy)
    }

    /// The GPUs `owner` holds (empty for an unknown owner).
    pub fn held_by(&self, owner: &str) -> GpuSet {
        GpuSet::from_mask(self.owners.get(owner).copied().unwrap_or(0))
    }

    /// Who holds the GPU with NVML index `index`.
    pub fn owner_of(&self, index: u32) -> Option<&str> {
        let bit = GpuSet::from_indices([index]).ok()?.mask();
        self.owners
            .iter()
            .find(|&(_, &held)| held & bit != 0)
            .map(|(owner, _)| owner.as_str())
    }

    /// Every owner and what it holds, by owner name.
    pub fn owners(&self) -> Vec<(&str, GpuSet)> {
        self.owners
            .iter()
            .map(|(o, &held)| (o.as_str(), GpuSet::from_mask(held)))
            .collect()
    }

    /// The `/dev/nvidia<minor>` minor number of a managed GPU.
    pub fn minor(&self, index: u32) -> Option<u32> {
        self.minors.get(&index).copied()
    }

    /// The score of a set: the sum of its pair scores.
    pub fn score(&self, set: GpuSet) -> u64 {
        self.weights.score(set.mask() & self.managed)
    }

    /// Totals since the allocator was built.
    pub fn counters(&self) -> Counters {
        self.counters
    }

    /// How well the free GPUs are connected now.
    pub fn fragmentation(&self) -> Fragmentation {
        let free = self.free_mask();
        let mut exact = true;
        let best_score = (0..=free.count_ones())
            .map(|size| {
                let query = search::Query {
                    candidates: free,
                    pool: free,
                    fixed: 0,
                    size,
                    spread: false,
                };
                search::best(&self.weights, &query).map_or(0, |found| {
                    exact &= found.exact;
                    self.weights.score(found.set)
                })
            })
            .collect();
        let nvlink_set = search::largest_clique(&self.weights, free, 100);
        Fragmentation {
            free: free.count_ones(),
            best_score,
            nvlink_set,
            exact,
        }
    }

    /// Validates a `gpus` scalar against [`Self::offered`] (see `GpuRequest::from_scalar`).
    pub fn request(&mut self, value: f64) -> Result<GpuRequest, AllocError> {
        let result = GpuRequest::from_scalar(value, self.offered());
        self.tally(result)
    }

    /// Grants `count` more GPUs to `owner`, chosen by the policy together with what it already
    /// holds; returns the new GPUs. Zero grants nothing.
    pub fn allocate(&mut self, owner: &str, count: u32) -> Result<GpuSet, AllocError> {
        let result = self.try_allocate(owner, count);
        self.tally(result)
    }

    /// Grants exactly `set` to `owner`; refused if any GPU is unknown, held or unhealthy.
    pub fn allocate_specific(&mut self, owner: &str, set: GpuSet) -> Result<(), AllocError> {
        let result = self
            .check_takeable(set)
            .and_then(|()| match set.mask() & self.unhealthy {
                0 => Ok(()),
                sick => Err(AllocError::Unhealthy {
                    gpus: GpuSet::from_mask(sick),
                }),
            });
        let result = result.map(|()| self.take(owner, set.mask()));
        self.tally(result)
    }

    /// Records that `owner` already holds `set` (agent recovery); like
    /// [`Self::allocate_specific`] but accepts unhealthy GPUs, because the container has them.
    pub fn recover(&mut self, owner: &str, set: GpuSet) -> Result<(), AllocError> {
        let result = self.check_takeable(set).map(|()| {
            if set.mask() & self.unhealthy != 0 {
                let sick = GpuSet::from_mask(set.mask() & self.unhealthy);
                tracing::warn!(owner, gpus = %sick, "recovered container holds unhealthy GPUs");
            }
            self.take(owner, set.mask());
        });
        self.tally(result)
    }

    /// Takes `set` back from `owner`; refused unless `owner` holds every GPU of it.
    pub fn release(&mut self, owner: &str, set: GpuSet) -> Result<(), AllocError> {
        let result = self.check_known(set).and_then(|()| {
            let missing = set.mask() & !self.held_by(owner).mask();
            if missing == 0 {
                self.give_back(owner, set.mask());
                Ok(())
            } else {
                Err(AllocError::NotAllocated {
                    owner: owner.to_owned(),
                    gpus: GpuSet::from_mask(missing),
                })
            }
        });
        self.tally(result)
    }

    /// Takes back everything `owner` holds and returns it (empty for an unknown owner).
    pub fn release_all(&mut self, owner: &str) -> GpuSet {
        self.counters.record(None);
        let held = self.held_by(owner);
        self.give_back(owner, held.mask());
        held
    }

    /// Makes `owner` hold exactly those GPUs of `set` that are managed and held by nobody else,
    /// without counting it as an allocation: GPUs the node's pool gives to other processes.
    /// Returns what it holds now.
    pub fn hold_elsewhere(&mut self, owner: &str, set: GpuSet) -> GpuSet {
        let held = self.held_by(owner).mask();
        let counted = (self.counters.granted, self.counters.released);
        self.give_back(owner, held);
        let take = set.mask() & self.managed & !self.allocated;
        self.take(owner, take);
        (self.counters.granted, self.counters.released) = counted;
        GpuSet::from_mask(take)
    }

    /// Takes `fewer` GPUs back from `owner`, chosen by the policy, and returns them.
    pub fn shrink(&mut self, owner: &str, fewer: u32) -> Result<GpuSet, AllocError> {
        let result = self.try_shrink(owner, fewer);
        self.tally(result)
    }

    /// Grows or shrinks what `owner` holds to `total` GPUs (the lifecycle's `update`).
    pub fn resize(&mut self, owner: &str, total: u32) -> Result<Resize, AllocError> {
        if total > self.offered() {
            let refused = Err(AllocError::BadRequest {
                got: f64::from(total),
                max: self.offered(),
            });
            return self.tally(refused);
        }
        let held = self.held_by(owner).len();
        if total >= held {
            self.allocate(owner, total - held).map(|added| Resize {
                added,
                released: GpuSet::EMPTY,
            })
        } else {
            self.shrink(owner, held - total).map(|released| Resize {
                added: GpuSet::EMPTY,
                released,
            })
        }
    }

    /// Marks a GPU unhealthy so it is never granted again; returns who holds it, if anyone.
    pub fn mark_unhealthy(&mut self, index: u32) -> Result<Option<&str>, AllocError> {
        let bit = self.known_bit(index)?;
        self.unhealthy |= bit;
        let owner = self.owner_of(index);
        // The health monitor logs the failure once, at WARN; this is the allocator's detail.
        tracing::debug!(index, owner, "GPU marked unhealthy");
        Ok(owner)
    }

    /// Marks a GPU healthy again, so that once free it can be granted.
    pub fn mark_healthy(&mut self, index: u32) -> Result<(), AllocError> {
        let bit = self.known_bit(index)?;
        self.unhealthy &= !bit;
        tracing::debug!(index, "GPU marked healthy");
        Ok(())
    }

    fn free_mask(&self) -> u64 {
        self.managed & !self.allocated & !self.unhealthy
    }

    fn node(&self) -> Node<'_> {
        Node {
            weights: &self.weights,
            by_minor: &self.by_minor,
        }
    }

    fn known_bit(&self, index: u32) -> Result<u64, AllocError> {
        match GpuSet::from_indices([index]) {
            Ok(set) if set.mask() & self.managed != 0 => Ok(set.mask()),
            _ => Err(AllocError::UnknownGpu {
                index,
                managed: self.managed(),
            }),
        }
    }

    fn check_known(&self, set: GpuSet) -> Result<(), AllocError> {
        match Bits(set.mask() & !self.managed).next() {
            None => Ok(()),
            Some(index) => Err(AllocError::UnknownGpu {
                index,
                managed: self.managed(),
            }),
        }
    }

    /// Refuses a set with unknown GPUs or GPUs held by anyone, naming the first owner found.
    fn check_takeable(&self, set: GpuSet) -> Result<(), AllocError> {
        self.check_known(set)?;
        match self
            .owners
            .iter()
            .find(|&(_, &held)| held & set.mask() != 0)
        {
            None => Ok(()),
            Some((owner, &held)) => Err(AllocError::AlreadyAllocated {
                gpus: GpuSet::from_mask(held & set.mask()),
                owner: owner.clone(),
            }),
        }
    }

    fn try_allocate(&mut self, owner: &str, count: u32) -> Result<GpuSet, AllocError> {
        if count > self.offered() {
            return Err(AllocError::BadRequest {
                got: f64::from(count),
                max: self.offered(),
            });
        }
        if count == 0 {
            return Ok(GpuSet::EMPTY);
        }
        let free = self.free_mask();
        let held = self.held_by(owner).mask();
        let pick = self
            .policy
            .grant(&self.node(), free, held, count)
            .ok_or_else(|| AllocError::NotEnough {
                owner: owner.to_owned(),
                requested: count,
                free: free.count_ones(),
                unhealthy: self.unhealthy.count_ones(),
                total: self.offered(),
            })?;
        if !pick.exact {
            self.counters.greedy_picks += 1;
        }
        self.take(owner, pick.set);
        let granted = GpuSet::from_mask(pick.set);
        tracing::debug!(
            owner,
            requested = count,
            gpus = %granted,
            score = self.weights.score(held | pick.set),
            exact = pick.exact,
            policy = %self.policy,
            "granted GPUs"
        );
        Ok(granted)
    }

    fn try_shrink(&mut self, owner: &str, fewer: u32) -> Result<GpuSet, AllocError> {
        let held = self.held_by(owner).mask();
        let free = self.free_mask();
        let pick = self
            .policy
            .give_back(&self.node(), free, held, fewer)
            .ok_or_else(|| AllocError::ShrinkBeyondHeld {
                owner: owner.to_owned(),
                fewer,
                held: GpuSet::from_mask(held),
            })?;
        if !pick.exact {
            self.counters.greedy_picks += 1;
        }
        self.give_back(owner, pick.set);
        let released = GpuSet::from_mask(pick.set);
        tracing::debug!(owner, fewer, gpus = %released, policy = %self.policy, "took back GPUs");
        Ok(released)
    }

    fn take(&mut self, owner: &str, set: u64) {
        if set == 0 {
            return;
        }
        self.allocated |= set;
        *self.owners.entry(owner.to_owned()).or_default() |= set;
        self.counters.granted += u64::from(set.count_ones());
    }

    fn give_back(&mut self, owner: &str, set: u64) {
        if set == 0 {
            return;
        }
        self.allocated &= !set;
        if let Some(held) = self.owners.get_mut(owner) {
            *held &= !set;
            if *held == 0 {
                self.owners.remove(owner);
            }
        }
        self.counters.released += u64::from(set.count_ones());
    }

    /// Counts a call and, when refused, its reason.
    fn tally<T>(&mut self, result: Result<T, AllocError>) -> Result<T, AllocError> {
        self.counters.record(result.as_ref().err());
        if let Err(err) = &result {
            tracing::debug!(error = %err, "allocator refused a call");
        }
        result
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a failed unwrap fails the test at its line
mod tests {
    use proptest::prelude::*;

    use super::counters::Refusals;
    use super::*;
    use mesos_gpu_node::nodes::{NodeBuilder, dgx1_v100, dual_dgx1_v100};
    use mesos_gpu_node::{inventory::Link, inventory::PcieLevel};

    fn set(indices: &[u32]) -> GpuSet {
        GpuSet::from_indices(indices.iter().copied()).unwrap()
    }

    fn on(builder: NodeBuilder, policy: Policy) -> Allocator {
        Allocator::new(&builder.inventory(), policy).unwrap()
    }

    fn grants(alloc: &mut Allocator, count: u32, times: usize) -> Vec<Vec<u32>> {
        (0..times)
            .map(|n| alloc.allocate(&format!("c{n}"), count).unwrap().to_vec())
            .collect()
    }

    /// The score of each set.
    fn scores(alloc: &Allocator, sets: &[Vec<u32>]) -> Vec<u64> {
        sets.iter().map(|s| alloc.score(set(s))).collect()
    }

    /// Hand-checked pair scores of the DGX-1 V100 (PCIe points + 100 per NVLink): the 250-point
    /// pairs are the double NVLinks under one PCIe switch, {2,3} and {6,7}.
    #[test]
    fn dgx1_pair_scores_are_pcie_plus_nvlinks() {
        let alloc = on(dgx1_v100(), Policy::Topology);
        let cases: [(&[u32], u64); 8] = [
            (&[2, 3], 200 + 50),
            (&[0, 3], 200 + 30),
            (&[0, 4], 200 + 10),
            (&[0, 1], 100 + 50),
            (&[0, 2], 100 + 30),
            (&[2, 6], 100 + 10),
            (&[0, 5], 10),
            (&[0, 1, 2, 3], 150 + 130 + 230 + 130 + 230 + 250),
        ];
        for (gpus, score) in cases {
            assert_eq!(alloc.score(set(gpus)), score, "{gpus:?}");
        }
        assert_eq!(alloc.score(alloc.managed()), 3000);
    }

    /// NVIDIA's published sequence on a free DGX-1 (`docs/reference/topology.md` §3): pairs {0,3},
    /// {1,2}, {4,7}, {5,6} (230 each, 920 in all). By NVIDIA's own score the best pair is {2,3}
    /// (250), so ours differs: {2,3}, {6,7}, then {0,4} and {1,5}, also 920 in all, and on each
    /// free set at least what NVIDIA's policy would pick from that same set ({0,4} from {0,1,4,5}:
    /// NVIDIA's best partition {0,4}+{1,5} beats {0,1}+{4,5}).
    #[test]
    fn dgx1_pairs_score_at_least_nvidias_sequence() {
        let mut alloc = on(dgx1_v100(), Policy::Topology);
        let ours = grants(&mut alloc, 2, 4);
        assert_eq!(ours, vec![vec![2, 3], vec![6, 7], vec![0, 4], vec![1, 5]]);
        assert_eq!(scores(&alloc, &ours), vec![250, 250, 210, 210]);
        let nvidia = [vec![0, 3], vec![1, 2], vec![4, 7], vec![5, 6]];
        assert_eq!(scores(&alloc, &nvidia), vec![230; 4]);
        assert!(matches!(
            alloc.allocate("c4", 2),
            Err(AllocError::NotEnough {
                requested: 2,
                free: 0,
                ..
            })
        ));
    }

    /// Quads and the whole node as NVIDIA hands them out; single GPUs by the fragmentation
    /// measure: on the free node all are alike (0 first, as NVIDIA), then each next one is the
    /// free GPU least strongly joined to the others, which fills one socket's quad first.
    #[test]
    fn dgx1_quads_eights_and_singles() {
        let mut alloc = on(dgx1_v100(), Policy::Topology);
        assert_eq!(
            grants(&mut alloc, 4, 2),
            vec![vec![0, 1, 2, 3], vec![4, 5, 6, 7]]
        );
        assert_eq!(alloc.score(set(&[4, 5, 6, 7])), 1120);
        let mut alloc = on(dgx1_v100(), Policy::Topology);
        assert_eq!(grants(&mut alloc, 8, 1), vec![(0..8).collect::<Vec<_>>()]);
        let mut alloc = on(dgx1_v100(), Policy::Topology);
        // After 0: GPU 3's squared pair scores into the free GPUs are the smallest (130² + 250²
        // + 110² + 3·10² = 91 800, against 92 600 for GPU 4), and so on.
        assert_eq!(
            grants(&mut alloc, 1, 8),
            [0, 3, 2, 1, 4, 5, 6, 7].map(|i| vec![i]).to_vec()
        );
    }

    /// Regression (issue 15): with GPUs 6 and 7 taken, a single GPU went to GPU 0 (lowest index,
    /// as NVIDIA and Mesos do), leaving no free NVLinked quad. GPU 4 is the least strongly joined
    /// to the rest (210² + 150² + 3·10², against 136 500 for GPU 0), and {0,1,2,3} stays whole.
    #[test]
    fn single_gpu_keeps_a_free_quad_whole() {
        let mut alloc = on(dgx1_v100(), Policy::Topology);
        alloc.allocate_specific("a", set(&[6, 7])).unwrap();
        assert_eq!(alloc.allocate("b", 1).unwrap(), set(&[4]));
        assert_eq!(alloc.allocate("c", 4).unwrap(), set(&[0, 1, 2, 3]));
        assert_eq!(alloc.score(set(&[0, 1, 2, 3])), 1120);
    }

    /// Regression (issue 15): DGX-1, two GPUs out of {0,2,4,5,6}: we chose {0,4} (210) where
    /// NVIDIA's policy chooses {5,6} (200 + 30 = 230).
    #[test]
    fn dgx1_pair_from_five_free() {
        let mut alloc = on(dgx1_v100(), Policy::Topology);
        alloc.allocate_specific("x", set(&[1, 3, 7])).unwrap();
        let got = alloc.allocate("a", 2).unwrap();
        assert_eq!((got, alloc.score(got)), (set(&[5, 6]), 230));
    }

    /// Regression (issue 15): DGX-1, three GPUs out of {1,3,4,5,6}: we chose {1,5,6} (450) where
    /// NVIDIA's policy chooses {4,5,6} (150 + 130 + 230 = 510).
    #[test]
    fn dgx1_triple_from_five_free() {
        let mut alloc = on(dgx1_v100(), Policy::Topology);
        alloc.allocate_specific("x", set(&[0, 2, 7])).unwrap();
        let got = alloc.allocate("a", 3).unwrap();
        assert_eq!((got, alloc.score(got)), (set(&[4, 5, 6]), 510));
        assert_eq!(alloc.score(set(&[1, 5, 6])), 450);
    }

    /// Regression (issue 15): the free 16-GPU node (two DGX-1 boards across sockets, nvml-sim's
    /// `hgx16`), ten GPUs: we chose {0–8,11} (3390) where NVIDIA's policy chooses {0–7,10,11}:
    /// one board (2400 NVLink + 600 PCIe points), a 250-point pair of the other, and 16 pairs
    /// across at 10.
    #[test]
    fn sixteen_gpus_ten_requested() {
        let mut alloc = on(dual_dgx1_v100(), Policy::Topology);
        let got = alloc.allocate("a", 10).unwrap();
        assert_eq!(alloc.score(got), 3000 + 250 + 16 * 10);
        assert_eq!(got, set(&[0, 1, 2, 3, 4, 5, 6, 7, 10, 11]));
        assert_eq!(alloc.score(set(&[0, 1, 2, 3, 4, 5, 6, 7, 8, 11])), 3390);
    }

    #[test]
    fn dual_dgx1_keeps_boards_whole() {
        let mut alloc = on(dual_dgx1_v100(), Policy::Topology);
        assert_eq!(
            grants(&mut alloc, 8, 2),
            vec![(0..8).collect::<Vec<_>>(), (8..16).collect()]
        );
        let mut alloc = on(dual_dgx1_v100(), Policy::Topology);
        let quads = grants(&mut alloc, 4, 4);
        assert_eq!(
            quads,
            vec![
                vec![0, 1, 2, 3],
                vec![4, 5, 6, 7],
                vec![8, 9, 10, 11],
                vec![12, 13, 14, 15]
            ]
        );
    }

    #[test]
    fn second_key_keeps_free_gpus_connected() {
        // With {2,3} taken, {6,7} is the only 250-point pair left; then {0,1,4,5} remain, and
        // of the equal {0,4} and {1,5} (210) the lower goes first, leaving the other whole.
        let mut alloc = on(dgx1_v100(), Policy::Topology);
        alloc.allocate_specific("a", set(&[2, 3])).unwrap();
        assert_eq!(alloc.allocate("b", 2).unwrap(), set(&[6, 7]));
        assert_eq!(alloc.fragmentation().best_score[2], 210);
        // Three of {0,1,4,5,6,7} when 2, 3 are taken: {4,6,7} and {5,6,7} both score 610;
        // taking {5,6,7} leaves {0,1,4} joined by 150 + 210 + 10, taking {4,6,7} leaves {0,1,5}
        // joined by 150 + 10 + 210: the squares tie, so the lower set wins.
        let mut alloc = on(dgx1_v100(), Policy::Topology);
        alloc.allocate_specific("a", set(&[2, 3])).unwrap();
        assert_eq!(alloc.allocate("b", 3).unwrap(), set(&[4, 6, 7]));
    }

    #[test]
    fn growing_picks_gpus_best_joined_to_what_is_held() {
        let mut alloc = on(dgx1_v100(), Policy::Topology);
        alloc.allocate_specific("a", set(&[5])).unwrap();
        // 5 is joined to 1 (cross-socket, 210) and 6 (same host bridge, 230) by two NVLinks.
        assert_eq!(alloc.allocate("a", 1).unwrap(), set(&[6]));
        assert_eq!(alloc.held_by("a"), set(&[5, 6]));
        // Growing to four completes the quad {4,5,6,7}.
        let resized = alloc.resize("a", 4).unwrap();
        assert_eq!(
            resized,
            Resize {
                added: set(&[4, 7]),
                released: GpuSet::EMPTY
            }
        );
        assert_eq!(alloc.score(alloc.held_by("a")), 1120);
    }

    #[test]
    fn shrinking_keeps_the_best_connected_subset() {
        let mut alloc = on(dgx1_v100(), Policy::Topology);
        alloc.allocate_specific("a", set(&[0, 1, 3, 5])).unwrap();
        // Keep two: {0,3} and {1,5} both score 200; {0,3}'s return of 1 and 5 leaves the free
        // GPUs better joined (1–2, 5–6 are double links), and it is the lower.
        assert_eq!(alloc.shrink("a", 2).unwrap(), set(&[1, 5]));
        assert_eq!(alloc.held_by("a"), set(&[0, 3]));
        assert_eq!(
            alloc.resize("a", 1).unwrap(),
            Resize {
                added: GpuSet::EMPTY,
                released: set(&[3])
            }
        );
        assert_eq!(alloc.resize("a", 1).unwrap(), Resize::default());
        let err = alloc.shrink("a", 2).unwrap_err();
        assert_eq!(
            err.to_string(),
            "cannot give back 2 GPUs from a: it holds 0"
        );
    }

    #[test]
    fn first_fit_is_mesos_lowest_minor_first() {
        let mut inventory = dgx1_v100().inventory();
        // Minors reversed against indices: first-fit must follow minors.
        for gpu in &mut inventory.gpus {
            gpu.minor = 7 - gpu.index;
        }
        let mut alloc = Allocator::new(&inventory, Policy::FirstFit).unwrap();
        assert_eq!(alloc.minor(0), Some(7));
        assert_eq!(alloc.allocate("a", 3).unwrap(), set(&[5, 6, 7]));
        assert_eq!(alloc.allocate("b", 2).unwrap(), set(&[3, 4]));
        // Shrinking gives back the lowest minors, as Mesos's update does.
        assert_eq!(alloc.shrink("a", 2).unwrap(), set(&[6, 7]));
        assert_eq!(alloc.allocate("c", 1).unwrap(), set(&[7]));
    }

    #[test]
    fn mesos_allocator_test_cases() {
        // apache/mesos NVIDIA_GPU_Allocator, in order
        // (`src/tests/containerizer/nvidia_gpu_isolator_tests.cpp`).
        let mut alloc = on(dgx1_v100(), Policy::FirstFit);
        let all = alloc.allocate("a", 8).unwrap();
        assert!(matches!(
            alloc.allocate("b", 1),
            Err(AllocError::NotEnough { .. })
        ));
        alloc.release("a", all).unwrap();
        alloc.allocate_specific("a", all).unwrap();
        alloc.release("a", set(&[0])).unwrap();
        assert_eq!(alloc.allocate("b", 1).unwrap(), set(&[0]));
        alloc.release("b", set(&[0])).unwrap();
        assert!(matches!(
            alloc.release("b", set(&[0])),
            Err(AllocError::NotAllocated { .. })
        ));
        alloc.allocate_specific("b", set(&[0])).unwrap();
        let bogus = set(&[9, 63]);
        assert!(matches!(
            alloc.release("b", bogus),
            Err(AllocError::UnknownGpu { index: 9, .. })
        ));
        alloc.release_all("a");
        alloc.release_all("b");
        assert!(matches!(
            alloc.allocate_specific("a", bogus),
            Err(AllocError::UnknownGpu { .. })
        ));
        assert_eq!(alloc.free(), alloc.managed());
    }

    #[test]
    fn every_error_names_what_was_wrong() {
        let mut alloc = on(dgx1_v100(), Policy::Topology);
        alloc.allocate_specific("a", set(&[0, 1])).unwrap();
        alloc.mark_unhealthy(7).unwrap();
        let cases: Vec<(Result<(), AllocError>, &str)> = vec![
            (
                alloc.allocate("b", 6).map(drop),
                "cannot allocate 6 GPUs to b: 5 free, 1 unhealthy, 8 in all",
            ),
            (
                alloc.allocate("b", 9).map(drop),
                "gpus=9: expected a whole number from 0 to 8",
            ),
            (
                alloc.request(1.5).map(drop),
                "gpus=1.5: expected a whole number from 0 to 8",
            ),
            (
                alloc.resize("b", 9).map(drop),
                "gpus=9: expected a whole number from 0 to 8",
            ),
            (
                alloc.release("b", set(&[1, 2])),
                "GPUs 1,2 are not allocated to b",
            ),
            (
                alloc.allocate_specific("b", set(&[1, 2])),
                "GPUs 1 are already allocated to a",
            ),
            (
                alloc.allocate_specific("a", set(&[0])),
                "GPUs 0 are already allocated to a",
            ),
            (
                alloc.allocate_specific("b", set(&[6, 7])),
                "GPUs 7 are unhealthy",
            ),
            (
                alloc.release("a", set(&[8])),
                "GPU 8 is not managed by this allocator (managed: 0,1,2,3,4,5,6,7)",
            ),
            (
                alloc.mark_unhealthy(40).map(drop),
                "GPU 40 is not managed by this allocator (managed: 0,1,2,3,4,5,6,7)",
            ),
            (
                alloc.mark_healthy(u32::MAX),
                "GPU 4294967295 is not managed by this allocator (managed: 0,1,2,3,4,5,6,7)",
            ),
            (
                alloc.shrink("a", 3).map(drop),
                "cannot give back 3 GPUs from a: it holds 0,1",
            ),
        ];
        for (result, message) in cases {
            assert_eq!(result.unwrap_err().to_string(), message);
        }
        // Nothing changed.
        assert_eq!(alloc.owners(), vec![("a", set(&[0, 1]))]);
        assert_eq!(alloc.free(), set(&[2, 3, 4, 5, 6]));
        let refused = alloc.counters().refused;
        assert_eq!(
            refused,
            Refusals {
                not_enough: 1,
                bad_request: 3,
                not_allocated: 2,
                already_allocated: 2,
                unknown_gpu: 1,
                unhealthy: 1
            }
        );
    }

    #[test]
    fn construction_refuses_unknown_repeated_and_out_of_range_devices() {
        let inventory = dgx1_v100().inventory();
        let err = Allocator::with_devices(&inventory, &[0, 9], Policy::Topology).unwrap_err();
        assert_eq!(
            err,
            AllocError::UnknownGpu {
                index: 9,
                managed: set(&[0, 1, 2, 3, 4, 5, 6, 7])
            }
        );
        let err = Allocator::with_devices(&inventory, &[2, 2], Policy::Topology).unwrap_err();
        assert_eq!(err.to_string(), "GPU 2 is listed more than once");
        let mut big = inventory.clone();
        big.gpus[7].index = 64;
        let err = Allocator::new(&big, Policy::Topology).unwrap_err();
        assert_eq!(err, AllocError::IndexOutOfRange { index: 64 });
    }

    #[test]
    fn a_gpu_in_mig_mode_leaves_the_whole_gpu_pool() {
        let mut inventory = dgx1_v100().inventory();
        inventory.mig.enabled = vec![1, 6];
        let mut alloc = Allocator::new(&inventory, Policy::Topology).unwrap();
        assert_eq!(alloc.managed(), set(&[0, 2, 3, 4, 5, 7]));
        assert_eq!(alloc.allocate("a", 6).unwrap(), set(&[0, 2, 3, 4, 5, 7]));
        let err = Allocator::with_devices(&inventory, &[0, 6], Policy::Topology).unwrap_err();
        assert_eq!(err, AllocError::MigEnabled { index: 6 });
        assert_eq!(
            err.to_string(),
            "GPU 6 is in MIG mode and cannot be given whole; leave it out of the GPU list (its MIG \
             devices are offered instead) or disable MIG on it (nvidia-smi -i 6 -mig 0, then reset \
             the GPU)"
        );
    }

    #[test]
    fn a_device_subset_offers_only_those_gpus() {
        let inventory = dgx1_v100().inventory();
        let mut alloc = Allocator::with_devices(&inventory, &[7, 4, 2], Policy::Topology).unwrap();
        assert_eq!(alloc.offered(), 3);
        assert_eq!(alloc.managed(), set(&[2, 4, 7]));
        // 4–7 is a double NVLink; the subset keeps the inventory's topology by index.
        assert_eq!(alloc.allocate("a", 2).unwrap(), set(&[4, 7]));
        assert_eq!(
            alloc.request(4.0).unwrap_err(),
            AllocError::BadRequest { got: 4.0, max: 3 }
        );
    }

    #[test]
    fn unhealthy_gpus_are_never_granted_and_stay_with_their_owner() {
        let mut inventory = dgx1_v100().inventory();
        inventory.gpus[0].healthy = false;
        let mut alloc = Allocator::new(&inventory, Policy::Topology).unwrap();
        assert_eq!(alloc.unhealthy(), set(&[0]));
        // GPU 3 is the one least strongly joined to the free GPUs once 0 is out.
        assert_eq!(alloc.allocate("a", 1).unwrap(), set(&[3]));
        assert_eq!(alloc.mark_unhealthy(3).unwrap(), Some("a"));
        assert_eq!(alloc.held_by("a"), set(&[3]));
        alloc.release_all("a");
        assert_eq!(alloc.free(), set(&[1, 2, 4, 5, 6, 7]));
        assert_eq!(alloc.mark_unhealthy(2).unwrap(), None);
        let err = alloc.allocate("b", 6).unwrap_err();
        assert_eq!(
            err,
            AllocError::NotEnough {
                owner: "b".into(),
                requested: 6,
                free: 5,
                unhealthy: 3,
                total: 8
            }
        );
        alloc.mark_healthy(0).unwrap();
        assert_eq!(alloc.allocate("b", 6).unwrap(), set(&[0, 1, 4, 5, 6, 7]));
        // Recovery records a container that already holds an unhealthy GPU.
        alloc.recover("c", set(&[3])).unwrap();
        assert_eq!(alloc.owner_of(3), Some("c"));
        assert!(matches!(
            alloc.recover("d", set(&[3])),
            Err(AllocError::AlreadyAllocated { .. })
        ));
    }

    #[test]
    fn k80_boards_are_granted_whole() {
        // Four K80 boards (two GPUs each, NVML INTERNAL), boards 0–1 and 2–3 behind one switch
        // each, the two switches on one socket each.
        let k80 = NodeBuilder::new(8, PcieLevel::CrossSocket)
            .pcie(PcieLevel::SingleSwitch, &[0, 1, 2, 3])
            .pcie(PcieLevel::SingleSwitch, &[4, 5, 6, 7])
            .pcie(PcieLevel::SameBoard, &[0, 1])
            .pcie(PcieLevel::SameBoard, &[2, 3])
            .pcie(PcieLevel::SameBoard, &[4, 5])
            .pcie(PcieLevel::SameBoard, &[6, 7]);
        let mut alloc = on(k80.clone(), Policy::Topology);
        alloc.allocate_specific("x", set(&[2])).unwrap();
        assert_eq!(alloc.allocate("a", 2).unwrap(), set(&[0, 1]));
        assert_eq!(alloc.allocate("b", 4).unwrap(), set(&[4, 5, 6, 7]));
        let mut alloc = on(k80, Policy::Topology);
        alloc.allocate_specific("x", set(&[1])).unwrap();
        // A single GPU: all score the same, lowest index first.
        assert_eq!(alloc.allocate("a", 1).unwrap(), set(&[0]));
    }

    #[test]
    fn t4_nodes_without_nvlink_group_by_pcie() {
        // Eight T4s: pairs under one switch, two switches per NUMA node, two sockets.
        let t4 = NodeBuilder::new(8, PcieLevel::CrossSocket)
            .pcie(PcieLevel::SameNumaNode, &[0, 1, 2, 3])
            .pcie(PcieLevel::SameNumaNode, &[4, 5, 6, 7])
            .pcie(PcieLevel::SingleSwitch, &[0, 1])
            .pcie(PcieLevel::SingleSwitch, &[2, 3])
            .pcie(PcieLevel::SingleSwitch, &[4, 5])
            .pcie(PcieLevel::SingleSwitch, &[6, 7]);
        let mut alloc = on(t4, Policy::Topology);
        alloc.allocate_specific("x", set(&[0])).unwrap();
        assert_eq!(alloc.allocate("a", 2).unwrap(), set(&[2, 3]));
        assert_eq!(alloc.allocate("b", 3).unwrap(), set(&[4, 5, 6]));
        assert_eq!(alloc.allocate("c", 2).unwrap(), set(&[1, 7]));
    }

    #[test]
    fn unknown_missing_and_asymmetric_topology_never_panics() {
        let mut inventory = dgx1_v100().inventory();
        inventory.topology = Topology::unknown(3);
        let huge = Link::pcie(PcieLevel::SameBoard).with_nvlinks(u32::MAX);
        inventory.topology.set(0, 1, huge);
        inventory.topology.set(1, 0, huge);
        inventory.topology.set(1, 2, Link::UNKNOWN.with_nvlinks(4));
        inventory.topology.set(2, 1, Link::UNKNOWN);
        let mut alloc = Allocator::new(&inventory, Policy::Topology).unwrap();
        assert_eq!(alloc.score(set(&[0, 1])), u64::from(search::MAX_PAIR_SCORE));
        assert_eq!(alloc.score(set(&[1, 2])), 0);
        assert_eq!(alloc.allocate("a", 3).unwrap(), set(&[0, 1, 2]));
        assert_eq!(alloc.allocate("b", 2).unwrap(), set(&[3, 4]));
        let mut alloc = Allocator::new(&Inventory::default(), Policy::Topology).unwrap();
        assert_eq!(alloc.allocate("a", 0).unwrap(), GpuSet::EMPTY);
        assert!(matches!(
            alloc.allocate("a", 1),
            Err(AllocError::BadRequest { max: 0, .. })
        ));
        assert_eq!(
            alloc.fragmentation(),
            Fragmentation {
                free: 0,
                best_score: vec![0],
                nvlink_set: 0,
                exact: true
            }
        );
    }

    #[test]
    fn fragmentation_reports_best_scores_and_nvlink_sets() {
        let mut alloc = on(dgx1_v100(), Policy::Topology);
        let fresh = alloc.fragmentation();
        assert_eq!(fresh.best_score[..5], [0, 0, 250, 610, 1120]);
        assert_eq!(fresh.best_score.len(), 9);
        assert_eq!((fresh.free, fresh.nvlink_set, fresh.exact), (8, 4, true));
        alloc.allocate_specific("a", set(&[0, 3])).unwrap();
        alloc.allocate_specific("b", set(&[1, 2])).unwrap();
        assert_eq!(alloc.fragmentation().nvlink_set, 4);
        alloc.allocate_specific("c", set(&[4, 7])).unwrap();
        let late = alloc.fragmentation();
        assert_eq!(
            (late.free, late.nvlink_set, late.best_score.clone()),
            (2, 2, vec![0, 0, 230])
        );
        let mut apart = on(dgx1_v100(), Policy::FirstFit);
        apart.allocate_specific("a", set(&[0, 2, 5, 7])).unwrap();
        assert_eq!(apart.fragmentation().nvlink_set, 2);
    }

    #[test]
    fn counters_follow_calls() {
        let mut alloc = on(dgx1_v100(), Policy::Topology);
        alloc.allocate("a", 3).unwrap();
        alloc.shrink("a", 1).unwrap();
        alloc.release_all("a");
        alloc.allocate("b", 9).unwrap_err();
        let counters = alloc.counters();
        assert_eq!(
            (counters.requests, counters.granted, counters.released),
            (4, 3, 3)
        );
        assert_eq!(counters.refused.bad_request, 1);
        assert_eq!(counters.greedy_picks, 0);
    }

    /// A whole-state snapshot, to check that a refused call changed nothing.
    fn snapshot(alloc: &Allocator) -> (Vec<(String, GpuSet)>, GpuSet, GpuSet, GpuSet) {
        let owners = alloc
            .owners()
            .into_iter()
            .map(|(o, s)| (o.to_owned(), s))
            .collect();
        (owners, alloc.allocated(), alloc.unhealthy(), alloc.free())
    }

    fn check_invariants(alloc: &Allocator) -> Result<(), TestCaseError> {
        let mut union = GpuSet::EMPTY;
        for (_, held) in alloc.owners() {
            prop_assert!(!held.is_empty());
            prop_assert!(union.intersection(held).is_empty(), "a GPU is owned twice");
            union = union.union(held);
        }
        prop_assert_eq!(union, alloc.allocated());
        prop_assert!(alloc.free().intersection(alloc.allocated()).is_empty());
        prop_assert!(alloc.free().intersection(alloc.unhealthy()).is_empty());
        prop_assert_eq!(
            alloc
                .free()
                .union(alloc.allocated())
                .union(alloc.unhealthy()),
            alloc.managed()
        );
        Ok(())
    }

    #[derive(Debug, Clone)]
    enum Op {
        Allocate(u8, u32),
        Specific(u8, u64),
        Recover(u8, u64),
        Release(u8, u64),
        ReleaseAll(u8),
        Shrink(u8, u32),
        Resize(u8, u32),
        Unhealthy(u32),
        Healthy(u32),
    }

    fn op() -> impl Strategy<Value = Op> {
        let owner = 0u8..4;
        let mask = 0u64..1 << 11;
        prop_oneof![
            4 => (owner.clone(), 0u32..11).prop_map(|(o, n)| Op::Allocate(o, n)),
            1 => (owner.clone(), mask.clone()).prop_map(|(o, m)| Op::Specific(o, m)),
            1 => (owner.clone(), mask.clone()).prop_map(|(o, m)| Op::Recover(o, m)),
            2 => (owner.clone(), mask).prop_map(|(o, m)| Op::Release(o, m)),
            1 => owner.clone().prop_map(Op::ReleaseAll),
            1 => (owner.clone(), 0u32..5).prop_map(|(o, n)| Op::Shrink(o, n)),
            1 => (owner, 0u32..11).prop_map(|(o, n)| Op::Resize(o, n)),
            1 => (0u32..11).prop_map(Op::Unhealthy),
            1 => (0u32..11).prop_map(Op::Healthy),
        ]
    }

    /// A random link matrix (asymmetric and unknown entries included) over `n` GPUs.
    fn random_node() -> impl Strategy<Value = Inventory> {
        let pcie = prop_oneof![
            1 => Just(None),
            6 => prop::sample::select(PcieLevel::ALL.to_vec()).prop_map(Some),
        ];
        let link = (pcie, prop_oneof![2 => Just(0u32), 1 => 1u32..4])
            .prop_map(|(pcie, nvlinks)| Link { pcie, nvlinks });
        (1usize..=12)
            .prop_flat_map(move |n| (Just(n), prop::collection::vec(link.clone(), n * n)))
            .prop_map(|(n, links)| {
                let mut inventory = NodeBuilder::new(n, PcieLevel::CrossSocket).inventory();
                for (i, link) in links.into_iter().enumerate() {
                    inventory.topology.set(i / n, i % n, link);
                }
                inventory
            })
    }

    /// The fragmentation measure of `free`: its pair scores squared, summed.
    fn kept(alloc: &Allocator, free: GpuSet) -> i64 {
        let gpus = free.to_vec();
        let mut sum = 0;
        for (i, &a) in gpus.iter().enumerate() {
            for &b in &gpus[i + 1..] {
                sum += search::keep_weight(u32::try_from(alloc.score(set(&[a, b]))).unwrap());
            }
        }
        sum
    }

    fn name(owner: u8) -> String {
        format!("owner-{owner}")
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

        /// (b), (c), (d): invariants over random operation sequences, both policies.
        #[test]
        fn operations_keep_invariants(
            inventory in random_node(),
            topology in any::<bool>(),
            ops in prop::collection::vec(op(), 1..40),
        ) {
            let policy = if topology { Policy::Topology } else { Policy::FirstFit };
            let mut alloc = Allocator::new(&inventory, policy).unwrap();
            for op in ops {
                let before = snapshot(&alloc);
                let (free, unhealthy) = (alloc.free(), alloc.unhealthy());
                let held = |a: &Allocator, o: u8| a.held_by(&name(o));
                let ok = match op {
                    Op::Allocate(o, n) => alloc.allocate(&name(o), n).map(|got| {
                        // (c) never a partial set; (d) only free (so healthy) GPUs.
                        assert_eq!(got.len(), n);
                        assert!(got.is_subset(free));
                    }).is_ok(),
                    Op::Specific(o, m) => {
                        let gpus = GpuSet::from_mask(m);
                        let ok = alloc.allocate_specific(&name(o), gpus).is_ok();
                        assert!(!ok || gpus.is_subset(free), "(d) unhealthy or held GPU granted");
                        ok
                    }
                    Op::Recover(o, m) => alloc.recover(&name(o), GpuSet::from_mask(m)).is_ok(),
                    Op::Release(o, m) => alloc.release(&name(o), GpuSet::from_mask(m)).is_ok(),
                    Op::ReleaseAll(o) => { alloc.release_all(&name(o)); true }
                    Op::Shrink(o, n) => {
                        let had = held(&alloc, o);
                        alloc.shrink(&name(o), n).map(|back| {
                            assert_eq!(back.len(), n);
                            assert!(back.is_subset(had));
                        }).is_ok()
                    }
                    Op::Resize(o, n) => {
                        let ok = alloc.resize(&name(o), n).is_ok();
                        if ok { assert_eq!(held(&alloc, o).len(), n); }
                        ok
                    }
                    Op::Unhealthy(i) => alloc.mark_unhealthy(i).is_ok(),
                    Op::Healthy(i) => alloc.mark_healthy(i).is_ok(),
                };
                if !ok {
                    prop_assert_eq!(snapshot(&alloc), before, "a refused call changed state");
                }
                check_invariants(&alloc)?;
                prop_assert!(alloc.free().intersection(unhealthy).is_subset(GpuSet::from_mask(0)) ||
                    matches!(op, Op::Healthy(_)));
            }
        }

        /// (a) end to end: the granted set is the brute-force best under the documented order.
        #[test]
        fn topology_grant_is_the_brute_force_best(
            inventory in random_node(),
            taken in any::<u64>(),
            count in 0u32..=12,
        ) {
            let mut alloc = Allocator::new(&inventory, Policy::Topology).unwrap();
            let taken = GpuSet::from_mask(taken & alloc.managed().mask());
            alloc.allocate_specific("other", taken).unwrap();
            let free = alloc.free();
            let result = alloc.allocate("me", count);
            if count > free.len() {
                prop_assert!(result.is_err());
                return Ok(());
            }
            let got = result.unwrap();
            let members = free.to_vec();
            let mut best: Option<((u64, i64), Vec<u32>)> = None;
            for sub in 0u64..1 << members.len() {
                if sub.count_ones() != count { continue; }
                let chosen: Vec<u32> = Bits(sub).map(|p| members[p as usize]).collect();
                let set = GpuSet::from_indices(chosen.iter().copied()).unwrap();
                let key = (alloc.score(set), kept(&alloc, free.difference(set)));
                if best.as_ref().is_none_or(|(k, c)| key > *k || (key == *k && chosen < *c)) {
                    best = Some((key, chosen));
                }
            }
            prop_assert_eq!(got.to_vec(), best.unwrap().1);
        }
    }
}
