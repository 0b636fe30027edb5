//! [`Policy`]: how the allocator picks GPUs, and the two picks it makes (grant and give back).
//!
//! - `first-fit` is Apache Mesos's `NvidiaGpuAllocator`: it grants the first free GPUs in (major,
//!   minor) order and, when a container shrinks, gives back the first ones it holds in that order
//!   (`docs/reference/mesos-gpu-isolator.md` §1.4, §3). All GPUs share major 195, so this is lowest
//!   minor first.
//! - `topology` grants the best-connected set ([`super::search`]): highest score (NVIDIA's
//!   set score: the sum over pairs of PCIe points plus 100 per NVLink) with what the owner already
//!   holds; then, for every request size, single GPUs included, the set whose removal leaves the
//!   free GPUs best connected by the fragmentation measure (the sum of squared pair scores over
//!   the pairs left free); then lowest indices. When a container shrinks it keeps the
//!   best-connected subset of what it holds (then the one whose returned GPUs leave the free pool
//!   best connected) and gives back the rest.
//!
//! Single GPUs therefore no longer go by lowest index as NVIDIA's best-effort policy and Mesos hand
//! them out (`docs/reference/topology.md` §2-3): on a partly used node the GPU granted is the one
//! least strongly joined to the other free GPUs, usually the neighbour of GPUs already taken, so
//! whole NVLinked groups stay free for multi-GPU requests (HAMi's `computeWorstSingleCard` idea,
//! go-gpuallocator PR #18). On a free node, where all GPUs are alike, it is still GPU 0.

use std::fmt;
use std::str::FromStr;

use super::AllocError;
use super::search::{self, Query, Weights};

/// How GPUs are chosen, set by configuration; [`Policy::Topology`] by default.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Policy {
    /// Lowest minor number first, exactly as Mesos does.
    FirstFit,
    /// The best-connected set by NVLink and PCIe pair scores, as NVIDIA's allocator scores them.
    #[default]
    Topology,
}

impl Policy {
    /// The configuration names, in the order error messages list them.
    pub const NAMES: [&'static str; 2] = ["first-fit", "topology"];

    /// The configuration name of this policy.
    pub fn name(self) -> &'static str {
        match self {
            Policy::FirstFit => "first-fit",
            Policy::Topology => "topology",
        }
    }
}

impl FromStr for Policy {
    type Err = AllocError;

    fn from_str(s: &str) -> Result<Policy, AllocError> {
        match s {
            "first-fit" => Ok(Policy::FirstFit),
            "topology" => Ok(Policy::Topology),
            _ => Err(AllocError::UnknownPolicy { got: s.to_owned() }),
        }
    }
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What the picks need to know about the node.
pub(crate) struct Node<'a> {
    /// Pair scores by index.
    pub(crate) weights: &'a Weights,
    /// The managed GPUs' indices by ascending (minor, index).
    pub(crate) by_minor: &'a [u32],
}

/// A pick and whether it is proven best for the policy (first-fit always is).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Pick {
    /// The GPUs picked.
    pub(crate) set: u64,
    /// False only when the topology search fell back to its greedy.
    pub(crate) exact: bool,
}

impl Policy {
    /// `count` GPUs out of `free` for an owner already holding `held`, or `None` when `free` has
    /// fewer than `count`.
    pub(crate) fn grant(self, node: &Node<'_>, free: u64, held: u64, count: u32) -> Option<Pick> {
        if free.count_ones() < count {
            return None;
        }
        match self {
            Policy::FirstFit => Some(Pick {
                set: first_by_minor(node, free, count),
                exact: true,
            }),
            Policy::Topology => {
                let query = Query {
                    candidates: free,
                    pool: free,
                    fixed: held,
                    size: count,
                    spread: true,
                };
                search::best(node.weights, &query).map(|f| Pick {
                    set: f.set,
                    exact: f.exact,
                })
            }
        }
    }

    /// Which `fewer` of `held` to give back, given the `free` GPUs they will join, or `None` when
    /// `held` has fewer than `fewer`.
    pub(crate) fn give_back(
        self,
        node: &Node<'_>,
        free: u64,
        held: u64,
        fewer: u32,
    ) -> Option<Pick> {
        let keep = held.count_ones().checked_sub(fewer)?;
        match self {
            Policy::FirstFit => Some(Pick {
                set: first_by_minor(node, held, fewer),
                exact: true,
            }),
            Policy::Topology => {
                let query = Query {
                    candidates: held,
                    pool: held | free,
                    fixed: 0,
                    size: keep,
                    spread: true,
                };
                search::best(node.weights, &query).map(|f| Pick {
                    set: held & !f.set,
                    exact: f.exact,
                })
            }
        }
    }
}

/// The first `count` members of `from` in (minor, index) order.
fn first_by_minor(node: &Node<'_>, from: u64, count: u32) -> u64 {
    node.by_minor
        .iter()
        .filter(|&&index| from & 1 << index != 0)
        .take(count as usize)
        .fold(0, |set, &index| set | 1 << index)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a failed unwrap fails the test at its line
mod tests {
    use super::*;

    #[test]
    fn parses_and_prints_the_configuration_names() {
        for name in Policy::NAMES {
            assert_eq!(name.parse::<Policy>().unwrap().to_string(), name);
        }
        assert_eq!(Policy::default(), Policy::Topology);
    }

    #[test]
    fn refuses_an_unknown_name_listing_the_accepted_ones() {
        for bad in ["", "First-Fit", "best-effort", "topology "] {
            let err = bad.parse::<Policy>().unwrap_err();
            assert_eq!(
                err,
                AllocError::UnknownPolicy {
                    got: bad.to_owned()
                }
            );
            assert_eq!(
                err.to_string(),
                format!("unknown allocation policy {bad:?}: expected one of first-fit, topology")
            );
        }
    }

    #[test]
    fn first_fit_follows_minor_numbers_not_indices() {
        // Index 0 has minor 3, index 3 has minor 0: Mesos orders by minor.
        let weights = Weights::new(0b1111, |_, _| 0);
        let node = Node {
            weights: &weights,
            by_minor: &[3, 1, 2, 0],
        };
        let pick = Policy::FirstFit.grant(&node, 0b1111, 0, 2).unwrap();
        assert_eq!(
            pick,
            Pick {
                set: 0b1010,
                exact: true
            }
        );
        assert_eq!(
            Policy::FirstFit.give_back(&node, 0, 0b1001, 1).unwrap().set,
            0b1000
        );
        assert_eq!(Policy::FirstFit.grant(&node, 0b0001, 0, 2), None);
        assert_eq!(Policy::FirstFit.give_back(&node, 0, 0b0001, 2), None);
    }
}
