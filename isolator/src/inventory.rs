//! What a node has: its GPUs, its driver and how the GPUs are connected.
//!
//! These are plain data, filled in by [`crate::discovery`] from NVML and read by the allocator,
//! the cgroup code, the Docker bridge and the CLI. Topology is read once at start; nothing here is
//! refreshed per allocation.
//!
//! The PCIe levels follow NVML's `nvmlGpuTopologyLevel_t` (`NVML_TOPOLOGY_INTERNAL` = 0 …
//! `NVML_TOPOLOGY_SYSTEM` = 50) and the pair scores follow NVIDIA's go-gpuallocator
//! (`shared/reference/gpu_sched.md` §2, `topologies.md`).

use serde::{Deserialize, Serialize};

/// The NVIDIA character-device major number of every `/dev/nvidia<minor>` GPU node.
pub const NVIDIA_GPU_MAJOR: u32 = 195;

/// A Linux device number split into major and minor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct DevNum {
    /// Major number (driver).
    pub major: u32,
    /// Minor number (instance).
    pub minor: u32,
}

impl std::fmt::Display for DevNum {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.major, self.minor)
    }
}

/// One physical GPU as NVML reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Gpu {
    /// NVML index (what `nvidia-smi` and `--nvidia_gpu_devices` call the GPU).
    pub index: u32,
    /// Minor number of `/dev/nvidia<minor>`; not always equal to the index.
    pub minor: u32,
    /// `GPU-xxxxxxxx-…` UUID.
    pub uuid: String,
    /// Product name, e.g. `Tesla V100-SXM2-16GB`.
    pub name: String,
    /// Total framebuffer memory in bytes.
    pub memory_total: u64,
    /// PCI bus id in NVML's form `00000000:06:00.0`.
    pub pci_bus_id: String,
    /// NUMA node the GPU is attached to, when known.
    pub numa_node: Option<u32>,
    /// CUDA compute capability (major, minor), when known.
    pub compute_capability: Option<(u32, u32)>,
    /// False when NVML reports the GPU as lost or unusable at discovery.
    pub healthy: bool,
}

/// How two GPUs are connected, strongest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind", content = "links")]
pub enum Link {
    /// Joined by this many NVLinks (at least one).
    NvLink(u32),
    /// On the same board (NVML `INTERNAL`, e.g. the two GPUs of a K80).
    SameBoard,
    /// Behind one PCIe switch (NVML `SINGLE`).
    SingleSwitch,
    /// Behind several PCIe switches, no host bridge (NVML `MULTIPLE`).
    MultipleSwitches,
    /// Meeting at a PCIe host bridge (NVML `HOSTBRIDGE`).
    HostBridge,
    /// On the same NUMA node / CPU socket (NVML `NODE`).
    SameNumaNode,
    /// Across CPU sockets (NVML `SYSTEM`).
    CrossSocket,
    /// NVML could not say.
    Unknown,
}

impl Link {
    /// Pair score as NVIDIA's allocator computes it: 100 per NVLink, then 60/50/40/30/20/10.
    pub fn score(self) -> u32 {
        match self {
            Link::NvLink(n) => 100 * n,
            Link::SameBoard => 60,
            Link::SingleSwitch => 50,
            Link::MultipleSwitches => 40,
            Link::HostBridge => 30,
            Link::SameNumaNode => 20,
            Link::CrossSocket => 10,
            Link::Unknown => 0,
        }
    }

    /// The short label `nvidia-smi topo -m` prints for this link (`NV2`, `PIX`, `SYS`, …).
    pub fn label(self) -> String {
        match self {
            Link::NvLink(n) => format!("NV{n}"),
            Link::SameBoard => "PSB".to_owned(),
            Link::SingleSwitch => "PIX".to_owned(),
            Link::MultipleSwitches => "PXB".to_owned(),
            Link::HostBridge => "PHB".to_owned(),
            Link::SameNumaNode => "NODE".to_owned(),
            Link::CrossSocket => "SYS".to_owned(),
            Link::Unknown => "?".to_owned(),
        }
    }
}

/// The pairwise link matrix of a node's GPUs, indexed by position in [`Inventory::gpus`].
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Topology {
    size: usize,
    links: Vec<Link>,
}

impl Topology {
    /// A topology of `size` GPUs with every pair [`Link::Unknown`].
    pub fn unknown(size: usize) -> Self {
        Topology {
            size,
            links: vec![Link::Unknown; size * size],
        }
    }

    /// Number of GPUs the matrix covers.
    pub fn size(&self) -> usize {
        self.size
    }

    /// Records the link from `a` to `b` (one direction; call twice for a symmetric link).
    /// Out-of-range positions are ignored so that partial NVML data never panics.
    pub fn set(&mut self, a: usize, b: usize, link: Link) {
        if a < self.size && b < self.size {
            self.links[a * self.size + b] = link;
        }
    }

    /// The link from `a` to `b` as recorded, [`Link::Unknown`] when out of range.
    pub fn get(&self, a: usize, b: usize) -> Link {
        if a < self.size && b < self.size {
            self.links[a * self.size + b]
        } else {
            Link::Unknown
        }
    }

    /// The pair score of `a` and `b`, taking the weaker direction when the data is asymmetric.
    pub fn pair_score(&self, a: usize, b: usize) -> u32 {
        self.get(a, b).score().min(self.get(b, a).score())
    }
}

/// The installed NVIDIA driver.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DriverInfo {
    /// Driver version as NVML prints it, e.g. `550.54.14`.
    pub version: String,
    /// Highest CUDA version the driver supports, as (major, minor).
    pub cuda_version: Option<(u32, u32)>,
}

/// Everything discovery learned about the node.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Inventory {
    /// The driver, or `None` on a node without one.
    pub driver: Option<DriverInfo>,
    /// The GPUs, in NVML index order.
    pub gpus: Vec<Gpu>,
    /// Pairwise links between `gpus`, by position.
    pub topology: Topology,
    /// Why there are no GPUs, when there are none (e.g. the driver library is missing).
    pub absent_reason: Option<String>,
}

impl Inventory {
    /// The GPU with NVML index `index`.
    pub fn by_index(&self, index: u32) -> Option<&Gpu> {
        self.gpus.iter().find(|g| g.index == index)
    }

    /// The GPU with this UUID.
    pub fn by_uuid(&self, uuid: &str) -> Option<&Gpu> {
        self.gpus.iter().find(|g| g.uuid == uuid)
    }
}
