//! What a node has: its GPUs, its driver and how the GPUs are connected.
//!
//! These are plain data, filled in by [`crate::discovery`] from NVML and read by the allocator,
//! the cgroup code, the Docker bridge and the CLI. Topology is read once at start; nothing here is
//! refreshed per allocation.
//!
//! The PCIe levels follow NVML's `nvmlGpuTopologyLevel_t` (`NVML_TOPOLOGY_INTERNAL` = 0 …
//! `NVML_TOPOLOGY_SYSTEM` = 50) and the pair scores follow NVIDIA's go-gpuallocator
//! (`docs/reference/topology.md` §1).

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

/// The PCIe path two GPUs share, as NVML's `nvmlGpuTopologyLevel_t` names it, nearest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PcieLevel {
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
}

impl PcieLevel {
    /// Every level, nearest first.
    pub const ALL: [PcieLevel; 6] = [
        PcieLevel::SameBoard,
        PcieLevel::SingleSwitch,
        PcieLevel::MultipleSwitches,
        PcieLevel::HostBridge,
        PcieLevel::SameNumaNode,
        PcieLevel::CrossSocket,
    ];

    /// go-gpuallocator's points for this level: 60, 50, 40, 30, 20, 10 (`P2PLinkSameBoard` …
    /// `P2PLinkCrossCPU`).
    pub fn score(self) -> u32 {
        match self {
            PcieLevel::SameBoard => 60,
            PcieLevel::SingleSwitch => 50,
            PcieLevel::MultipleSwitches => 40,
            PcieLevel::HostBridge => 30,
            PcieLevel::SameNumaNode => 20,
            PcieLevel::CrossSocket => 10,
        }
    }

    /// The label `nvidia-smi topo -m` prints for this level (`PSB`, `PIX`, … `SYS`).
    pub fn label(self) -> &'static str {
        match self {
            PcieLevel::SameBoard => "PSB",
            PcieLevel::SingleSwitch => "PIX",
            PcieLevel::MultipleSwitches => "PXB",
            PcieLevel::HostBridge => "PHB",
            PcieLevel::SameNumaNode => "NODE",
            PcieLevel::CrossSocket => "SYS",
        }
    }
}

/// How two GPUs are connected: the PCIe path they share, which every pair of a real node has,
/// and the NVLinks between them, which some pairs have as well.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub struct Link {
    /// The PCIe path, `None` when NVML could not say.
    pub pcie: Option<PcieLevel>,
    /// NVLinks joining the two, directly or through NVSwitches both reach (0 for none).
    pub nvlinks: u32,
}

impl Link {
    /// Nothing known about the pair.
    pub const UNKNOWN: Link = Link {
        pcie: None,
        nvlinks: 0,
    };

    /// Most NVLinks one pair is scored for: go-gpuallocator's `EighteenNVLINKLinks` (NVML's
    /// `NVML_NVLINK_MAX_LINKS`); more count as this many.
    pub const MAX_SCORED_NVLINKS: u32 = 18;

    /// A pair joined over PCIe at `level` only.
    pub const fn pcie(level: PcieLevel) -> Link {
        Link {
            pcie: Some(level),
            nvlinks: 0,
        }
    }

    /// This link with `nvlinks` NVLinks as well.
    #[must_use]
    pub const fn with_nvlinks(self, nvlinks: u32) -> Link {
        Link {
            pcie: self.pcie,
            nvlinks,
        }
    }

    /// Pair score as NVIDIA's go-gpuallocator computes it (`calculateGPUPairScore`): the sum
    /// over the links between the two, so the PCIe level's points (60 same board … 10 across
    /// sockets, 0 unknown) plus 100 per NVLink, up to `Self::MAX_SCORED_NVLINKS`.
    pub fn score(self) -> u32 {
        self.pcie.map_or(0, PcieLevel::score) + 100 * self.nvlinks.min(Self::MAX_SCORED_NVLINKS)
    }

    /// The label `nvidia-smi topo -m` prints for this pair: `NV<n>` when NVLinked, else the
    /// PCIe level (`PIX`, `SYS`, …), `?` when unknown.
    pub fn label(self) -> String {
        match (self.nvlinks, self.pcie) {
            (0, Some(level)) => level.label().to_owned(),
            (0, None) => "?".to_owned(),
            (n, _) => format!("NV{n}"),
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
    /// A topology of `size` GPUs with every pair [`Link::UNKNOWN`].
    pub fn unknown(size: usize) -> Self {
        Topology {
            size,
            links: vec![Link::UNKNOWN; size * size],
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

    /// The link from `a` to `b` as recorded, [`Link::UNKNOWN`] when out of range.
    pub fn get(&self, a: usize, b: usize) -> Link {
        if a < self.size && b < self.size {
            self.links[a * self.size + b]
        } else {
            Link::UNKNOWN
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
    /// The GPUs in MIG mode and their MIG devices (empty on a node without MIG).
    #[serde(default, skip_serializing_if = "MigLayout::is_empty")]
    pub mig: MigLayout,
}

/// MIG on a node: which GPUs run in MIG mode and the MIG devices they hold.
///
/// A GPU whose *current* MIG mode is on cannot be given to a task whole: CUDA sees only its MIG
/// devices. It stays in [`Inventory::gpus`] (its index, minor and topology do not change) and is
/// listed in [`MigLayout::enabled`]; its MIG devices are the units to allocate instead.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct MigLayout {
    /// NVML indices of the GPUs whose current MIG mode is on, ascending.
    pub enabled: Vec<u32>,
    /// Every MIG device, by parent index, then MIG device index.
    pub devices: Vec<MigDevice>,
    /// The `nvidia-caps` major from `/proc/devices` (dynamic; 235 and 238 are common), when
    /// some GPU is in MIG mode and the driver lists it.
    pub caps_major: Option<u32>,
}

impl MigLayout {
    /// True on a node with no GPU in MIG mode.
    pub fn is_empty(&self) -> bool {
        self.enabled.is_empty() && self.devices.is_empty()
    }

    /// True when the GPU with NVML index `index` is in MIG mode.
    pub fn is_enabled(&self, index: u32) -> bool {
        self.enabled.contains(&index)
    }

    /// The MIG device with this `MIG-…` UUID.
    pub fn by_uuid(&self, uuid: &str) -> Option<&MigDevice> {
        self.devices.iter().find(|d| d.uuid == uuid)
    }

    /// The MIG devices of the GPU with NVML index `parent`.
    pub fn of_parent(&self, parent: u32) -> impl Iterator<Item = &MigDevice> {
        self.devices.iter().filter(move |d| d.parent == parent)
    }
}

/// One MIG device: a compute instance inside a GPU instance of a MIG-enabled GPU, which CUDA
/// sees as one GPU (`CUDA_VISIBLE_DEVICES=MIG-<uuid>`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigDevice {
    /// NVML index of the parent GPU.
    pub parent: u32,
    /// Minor number of the parent's `/dev/nvidia<minor>`; the capability paths use it too.
    pub parent_minor: u32,
    /// The index `nvmlDeviceGetMigDeviceHandleByIndex` takes on the parent (sparse).
    pub index: u32,
    /// `MIG-<uuid>`, the canonical form since driver R470.
    pub uuid: String,
    /// GPU instance id, unique per parent (not a placement: three 2g instances may be 3, 5, 6).
    pub gpu_instance: u32,
    /// Compute instance id, unique per GPU instance.
    pub compute_instance: u32,
    /// The GPU instance profile id `nvidia-smi mig -lgip` prints (19 for 1g, 9 for 3g, 0 for
    /// 7g…), when NVML's profile table names one; the key for offers, since names drift with
    /// the driver.
    pub profile: Option<u32>,
    /// The profile's name as the driver prints it (`1g.5gb`, `1c.3g.20gb`): for display.
    pub profile_name: String,
    /// Memory of the GPU instance, in bytes.
    pub memory_total: u64,
    /// Streaming multiprocessors of the compute instance.
    pub multiprocessors: u32,
    /// Compute slices of the GPU instance (the `g` of `3g.20gb`).
    pub gpu_instance_slices: u32,
    /// Compute slices of the compute instance (equal to the GPU instance's unless split).
    pub compute_instance_slices: u32,
    /// The capability device nodes a container needs, when the driver's `/proc` files list them.
    pub caps: Option<MigCaps>,
    /// False when the parent is lost or NVML could not read the device.
    pub healthy: bool,
}

/// The two `/dev/nvidia-caps/nvidia-cap<minor>` nodes that grant one MIG device, and the
/// `/proc` files that name them (relative to the proc root, e.g.
/// `driver/nvidia/capabilities/gpu0/mig/gi1/access`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigCaps {
    /// The GPU instance's access capability.
    pub gpu_instance: DevNum,
    /// The compute instance's access capability.
    pub compute_instance: DevNum,
    /// The GPU instance's `access` file under the proc root.
    pub gpu_instance_file: String,
    /// The compute instance's `access` file under the proc root.
    pub compute_instance_file: String,
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

    /// The GPUs a task may be given whole: every GPU not in MIG mode.
    pub fn whole_gpus(&self) -> impl Iterator<Item = &Gpu> {
        self.gpus.iter().filter(|g| !self.mig.is_enabled(g.index))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// go-gpuallocator's `calculateGPUPairScore`: the PCIe link's points plus 100 per NVLink
    /// (`SingleNVLINKLink` … `EighteenNVLINKLinks`), whatever the PCIe level.
    #[test]
    fn pair_score_is_the_sum_over_links_as_nvidia_scores_it() {
        let points = [60, 50, 40, 30, 20, 10];
        for (level, points) in PcieLevel::ALL.into_iter().zip(points) {
            for nvlinks in [0, 1, 2, 12, 18] {
                let link = Link::pcie(level).with_nvlinks(nvlinks);
                assert_eq!(link.score(), points + 100 * nvlinks, "{link:?}");
            }
            // NVIDIA has no link type past eighteen NVLinks.
            assert_eq!(Link::pcie(level).with_nvlinks(40).score(), points + 1800);
        }
        assert_eq!(Link::UNKNOWN.score(), 0);
        assert_eq!(Link::UNKNOWN.with_nvlinks(2).score(), 200);
    }

    #[test]
    fn labels_follow_nvidia_smi() {
        let link = Link::pcie(PcieLevel::SingleSwitch);
        assert_eq!(link.label(), "PIX");
        assert_eq!(link.with_nvlinks(2).label(), "NV2");
        assert_eq!(Link::UNKNOWN.label(), "?");
        assert_eq!(Link::UNKNOWN.with_nvlinks(12).label(), "NV12");
    }
}
