//! NUMA pinning, the pure part: which CPUs and memory nodes a container gets when it is narrowed
//! to its GPUs' local ones, or why it is not.
//!
//! Facts (`docs/reference/numa.md`):
//! - NVML reports a GPU's nearest CPUs with `nvmlDeviceGetCpuAffinity` (=
//!   `…WithinScope(NVML_AFFINITY_SCOPE_NODE)`) and its nearest memory nodes with
//!   `nvmlDeviceGetMemoryAffinity(…, NVML_AFFINITY_SCOPE_NODE)`; a multi-GPU container takes the
//!   union of its GPUs' sets.
//! - Mesos's `cpus` is a CFS quota and Mesos has no CPU allocator, so pinning can only *narrow*
//!   a container to the GPU-local set, never reserve cores; a container is therefore never pinned
//!   to fewer CPUs than its `cpus` asks for, which the quota would otherwise silently cut.
//! - The set written must lie within what the parent cgroup allows (v1 `cpuset.effective_cpus`,
//!   v2 `cpuset.cpus.effective`), or the kernel refuses it (v1) or ignores the rest (v2).

use std::fmt;

pub use mesos_gpu_node::numa::{Affinities, Allowed, CpuList};

/// What a container is narrowed to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pinning {
    /// Its CPUs (`cpuset.cpus`, Docker `--cpuset-cpus`).
    pub cpus: CpuList,
    /// Its memory nodes (`cpuset.mems`, Docker `--cpuset-mems`); `None` leaves them as they are.
    pub mems: Option<CpuList>,
}

/// Why a container is not pinned.
#[derive(Debug, Clone, PartialEq)]
pub enum SkipReason {
    /// It has no GPU, so nothing to be local to.
    NoGpus,
    /// NVML reports no CPU affinity for one of its GPUs.
    UnknownAffinity {
        /// The GPU's NVML index.
        index: u32,
    },
    /// None of its GPUs' CPUs is allowed to it.
    NoneAllowed {
        /// The GPUs' local CPUs.
        local: CpuList,
        /// What the parent allows.
        allowed: CpuList,
    },
    /// Pinning would leave it fewer CPUs than it asked for.
    TooFewCpus {
        /// The CPUs it would get.
        cpus: CpuList,
        /// Its `cpus` resource.
        requested: f64,
    },
    /// It is a nested container: it runs in its parent's cpuset, pinned or not.
    Nested,
    /// The cgroup hierarchy offers no cpuset controller (e.g. cgroup2 on a host whose `cpuset`
    /// is bound to a v1 hierarchy).
    NoController {
        /// What is missing, where.
        detail: String,
    },
}

impl fmt::Display for SkipReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SkipReason::NoGpus => f.write_str("it has no GPU"),
            SkipReason::Nested => f.write_str("it is nested and runs in its parent's cpuset"),
            SkipReason::UnknownAffinity { index } => {
                write!(f, "NVML reports no CPU affinity for GPU {index}")
            }
            SkipReason::NoneAllowed { local, allowed } => write!(
                f,
                "its GPUs' CPUs {local} are outside the CPUs {allowed} its parent cgroup allows"
            ),
            SkipReason::TooFewCpus { cpus, requested } => write!(
                f,
                "its GPUs' CPUs {cpus} are {} CPU(s), fewer than the cpus={requested} it asked for",
                cpus.len()
            ),
            SkipReason::NoController { detail } => f.write_str(detail),
        }
    }
}

/// The decision for one container.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Narrow it to this.
    Pin(Pinning),
    /// Leave it alone, for this reason.
    Skip(SkipReason),
}

/// Decides what a container holding `gpus` (NVML indices) that asked for `requested` CPUs
/// (`None`: no `cpus` resource) gets, within `allowed`.
pub fn plan(
    gpus: &[u32],
    affinities: &Affinities,
    allowed: &Allowed,
    requested: Option<f64>,
) -> Decision {
    if gpus.is_empty() {
        return Decision::Skip(SkipReason::NoGpus);
    }
    let local = match affinities.local_to(gpus) {
        Ok(local) => local,
        Err(index) => return Decision::Skip(SkipReason::UnknownAffinity { index }),
    };
    let cpus = local.cpus.intersection(&allowed.cpus);
    if cpus.is_empty() {
        return Decision::Skip(SkipReason::NoneAllowed {
            local: local.cpus,
            allowed: allowed.cpus.clone(),
        });
    }
    if let Some(requested) = requested
        && (cpus.len() as f64) < requested
    {
        return Decision::Skip(SkipReason::TooFewCpus { cpus, requested });
    }
    let mems = local
        .mems
        .map(|m| m.intersection(&allowed.mems))
        .filter(|m| !m.is_empty());
    Decision::Pin(Pinning { cpus, mems })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use mesos_gpu_node::numa::GpuAffinity;

    fn list(s: &str) -> CpuList {
        s.parse().unwrap()
    }

    /// Two sockets of 4 CPUs, GPUs 0-1 on socket 0, GPUs 2-3 on socket 1.
    fn two_sockets() -> Affinities {
        let mut a = Affinities::new();
        for (index, cpus, mems) in [
            (0, "0-3", "0"),
            (1, "0-3", "0"),
            (2, "4-7", "1"),
            (3, "4-7", "1"),
        ] {
            a.insert(
                index,
                GpuAffinity {
                    cpus: list(cpus),
                    mems: Some(list(mems)),
                },
            );
        }
        a
    }

    fn all() -> Allowed {
        Allowed {
            cpus: list("0-7"),
            mems: list("0-1"),
        }
    }

    #[test]
    fn one_gpu_gets_its_socket() {
        let d = plan(&[2], &two_sockets(), &all(), Some(2.0));
        assert_eq!(
            d,
            Decision::Pin(Pinning {
                cpus: list("4-7"),
                mems: Some(list("1"))
            })
        );
    }

    #[test]
    fn gpus_on_both_sockets_get_the_union() {
        let d = plan(&[1, 2], &two_sockets(), &all(), None);
        assert_eq!(
            d,
            Decision::Pin(Pinning {
                cpus: list("0-7"),
                mems: Some(list("0-1"))
            })
        );
    }

    #[test]
    fn the_parent_narrows_the_set() {
        let allowed = Allowed {
            cpus: list("2-5"),
            mems: list("1"),
        };
        let d = plan(&[0], &two_sockets(), &allowed, Some(1.0));
        // Memory node 0 is not allowed: memory is left as it is.
        assert_eq!(
            d,
            Decision::Pin(Pinning {
                cpus: list("2-3"),
                mems: None
            })
        );
    }

    #[test]
    fn never_fewer_cpus_than_asked() {
        let d = plan(&[0], &two_sockets(), &all(), Some(4.5));
        assert_eq!(
            d,
            Decision::Skip(SkipReason::TooFewCpus {
                cpus: list("0-3"),
                requested: 4.5
            })
        );
        assert_eq!(
            match d {
                Decision::Skip(r) => r.to_string(),
                Decision::Pin(_) => String::new(),
            },
            "its GPUs' CPUs 0-3 are 4 CPU(s), fewer than the cpus=4.5 it asked for"
        );
        assert!(matches!(
            plan(&[0], &two_sockets(), &all(), Some(4.0)),
            Decision::Pin(_)
        ));
    }

    #[test]
    fn unknown_or_disallowed_affinity_is_not_pinned() {
        assert_eq!(
            plan(&[], &two_sockets(), &all(), None),
            Decision::Skip(SkipReason::NoGpus)
        );
        assert_eq!(
            plan(&[0, 9], &two_sockets(), &all(), None),
            Decision::Skip(SkipReason::UnknownAffinity { index: 9 })
        );
        let allowed = Allowed {
            cpus: list("4-7"),
            mems: list("0-1"),
        };
        assert!(matches!(
            plan(&[0], &two_sockets(), &allowed, None),
            Decision::Skip(SkipReason::NoneAllowed { .. })
        ));
    }

    #[test]
    fn unknown_memory_affinity_leaves_memory_alone() {
        let mut a = Affinities::new();
        a.insert(
            0,
            GpuAffinity {
                cpus: list("1"),
                mems: None,
            },
        );
        assert_eq!(
            plan(&[0], &a, &all(), Some(0.5)),
            Decision::Pin(Pinning {
                cpus: list("1"),
                mems: None
            })
        );
    }
}
