//! NUMA facts of the node: which CPUs and memory nodes each GPU is near (as NVML reports them,
//! [`Affinities`]), which the machine has online ([`online`]), and CPU lists in the kernel's
//! syntax ([`CpuList`]). What a container is pinned to is decided in `mesos_gpu_placement::numa`.
//!
//! Facts (`docs/reference/numa.md`): NVML reports a GPU's nearest CPUs with
//! `nvmlDeviceGetCpuAffinity` (= `…WithinScope(NVML_AFFINITY_SCOPE_NODE)`) and its nearest
//! memory nodes with `nvmlDeviceGetMemoryAffinity(…, NVML_AFFINITY_SCOPE_NODE)`.

mod cpulist;
mod online;

use std::collections::BTreeMap;

pub use cpulist::{CpuList, CpuListError};
pub use online::{OnlineError, online};

/// Where one GPU's nearest CPUs and memory nodes are (NVML scope `NODE`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GpuAffinity {
    /// Its local CPUs.
    pub cpus: CpuList,
    /// Its local memory nodes; `None` when NVML does not say.
    pub mems: Option<CpuList>,
}

/// Every GPU's affinity, by NVML index; a GPU NVML says nothing about is absent.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Affinities(BTreeMap<u32, GpuAffinity>);

impl Affinities {
    /// No affinities.
    pub fn new() -> Affinities {
        Affinities::default()
    }

    /// Records GPU `index`'s affinity.
    pub fn insert(&mut self, index: u32, affinity: GpuAffinity) {
        self.0.insert(index, affinity);
    }

    /// GPU `index`'s affinity, when known.
    pub fn get(&self, index: u32) -> Option<&GpuAffinity> {
        self.0.get(&index)
    }

    /// True when no GPU's affinity is known.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The union of `gpus`' local CPUs and memory nodes (memory `None` when a GPU's is unknown);
    /// `Err(index)` names the first GPU whose CPUs are unknown or empty.
    pub fn local_to(&self, gpus: &[u32]) -> Result<GpuAffinity, u32> {
        let mut cpus = CpuList::default();
        let mut mems = Some(CpuList::default());
        for &index in gpus {
            let Some(a) = self.get(index).filter(|a| !a.cpus.is_empty()) else {
                return Err(index);
            };
            cpus = cpus.union(&a.cpus);
            mems = match (mems, &a.mems) {
                (Some(all), Some(m)) => Some(all.union(m)),
                _ => None,
            };
        }
        Ok(GpuAffinity { cpus, mems })
    }
}

/// The CPUs and memory nodes the container's cgroup may use now.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Allowed {
    /// The parent's effective CPUs.
    pub cpus: CpuList,
    /// The parent's effective memory nodes.
    pub mems: CpuList,
}
