//! Nodes built in code from an NVLink table and PCIe groups, and the reference nodes of
//! `docs/reference/topology.md` §3, for tests, benchmarks and examples
//! (`mesos_gpu_testkit::nodes`).
//!
//! Every pair gets a PCIe level and, when joined by NVLink, its NVLink count as well, as NVML
//! reports both. GPU `i` gets NVML index `i` and minor `i`.

use crate::{
    inventory::Gpu, inventory::Inventory, inventory::Link, inventory::PcieLevel,
    inventory::Topology,
};

/// Builds a [`Topology`] (and a matching [`Inventory`]) pair by pair.
#[derive(Debug, Clone)]
pub struct NodeBuilder {
    gpus: usize,
    pcie: Vec<PcieLevel>,
    nvlinks: Vec<u32>,
    product: String,
    memory_total: u64,
    compute_capability: Option<(u32, u32)>,
}

impl NodeBuilder {
    /// `gpus` GPUs whose pairs all start at the PCIe level `base` (e.g.
    /// [`PcieLevel::CrossSocket`]).
    pub fn new(gpus: usize, base: PcieLevel) -> NodeBuilder {
        NodeBuilder {
            gpus,
            pcie: vec![base; gpus * gpus],
            nvlinks: vec![0; gpus * gpus],
            product: "NVIDIA Simulated GPU".to_owned(),
            memory_total: 16 << 30,
            compute_capability: None,
        }
    }

    /// Sets every pair inside `group` to PCIe level `level`; later calls override earlier ones,
    /// so give the widest groups first. Positions out of range are ignored.
    #[must_use]
    pub fn pcie(mut self, level: PcieLevel, group: &[usize]) -> NodeBuilder {
        for &a in group {
            for &b in group {
                if a != b && a < self.gpus && b < self.gpus {
                    self.pcie[a * self.gpus + b] = level;
                }
            }
        }
        self
    }

    /// Joins each `(a, b, links)` of `table` by `links` NVLinks, both directions.
    #[must_use]
    pub fn nvlinks(mut self, table: &[(usize, usize, u32)]) -> NodeBuilder {
        for &(a, b, links) in table {
            if a != b && a < self.gpus && b < self.gpus {
                self.nvlinks[a * self.gpus + b] = links;
                self.nvlinks[b * self.gpus + a] = links;
            }
        }
        self
    }

    /// Names the product and its memory and compute capability in the built inventory.
    #[must_use]
    pub(crate) fn product(
        mut self,
        name: &str,
        memory_total: u64,
        compute_capability: (u32, u32),
    ) -> NodeBuilder {
        name.clone_into(&mut self.product);
        self.memory_total = memory_total;
        self.compute_capability = Some(compute_capability);
        self
    }

    /// The link matrix: every pair's PCIe level, with its NVLinks.
    pub fn topology(&self) -> Topology {
        let mut topology = Topology::unknown(self.gpus);
        for a in 0..self.gpus {
            for b in (0..self.gpus).filter(|&b| b != a) {
                let at = a * self.gpus + b;
                topology.set(
                    a,
                    b,
                    Link::pcie(self.pcie[at]).with_nvlinks(self.nvlinks[at]),
                );
            }
        }
        topology
    }

    /// An inventory of healthy GPUs with index = minor = position, and [`Self::topology`].
    pub fn inventory(&self) -> Inventory {
        let gpus = (0..self.gpus)
            .map(|i| {
                let index = u32::try_from(i).unwrap_or(u32::MAX);
                Gpu {
                    index,
                    minor: index,
                    uuid: format!("GPU-{index:08x}-0000-4000-8000-000000000000"),
                    name: self.product.clone(),
                    memory_total: self.memory_total,
                    pci_bus_id: format!("00000000:{:02X}:00.0", i + 4),
                    numa_node: None,
                    compute_capability: self.compute_capability,
                    healthy: true,
                }
            })
            .collect();
        Inventory {
            driver: None,
            gpus,
            topology: self.topology(),
            absent_reason: None,
            mig: Default::default(),
        }
    }
}

/// The NVLink table of a DGX-1 with V100 (hybrid cube-mesh), from `docs/reference/topology.md` §3:
/// (GPU, GPU with a higher index, NVLinks between them).
pub const DGX1_V100_NVLINKS: [(usize, usize, u32); 16] = [
    (0, 1, 1),
    (0, 2, 1),
    (0, 3, 2),
    (0, 4, 2),
    (1, 2, 2),
    (1, 3, 1),
    (1, 5, 2),
    (2, 3, 2),
    (2, 6, 1),
    (3, 7, 1),
    (4, 5, 1),
    (4, 6, 1),
    (4, 7, 2),
    (5, 6, 2),
    (5, 7, 1),
    (6, 7, 2),
];

/// A DGX-1 V100 board placed at GPU `first`: its NVLinks and PCIe levels (switch pairs 0–1, 2–3,
/// 4–5, 6–7; host bridge within each half; the halves on different sockets).
fn dgx1_board(builder: NodeBuilder, first: usize) -> NodeBuilder {
    let at = |gpus: &[usize]| gpus.iter().map(|g| g + first).collect::<Vec<_>>();
    let links: Vec<_> = DGX1_V100_NVLINKS
        .iter()
        .map(|&(a, b, l)| (a + first, b + first, l))
        .collect();
    builder
        .pcie(PcieLevel::HostBridge, &at(&[0, 1, 2, 3]))
        .pcie(PcieLevel::HostBridge, &at(&[4, 5, 6, 7]))
        .pcie(PcieLevel::SingleSwitch, &at(&[0, 1]))
        .pcie(PcieLevel::SingleSwitch, &at(&[2, 3]))
        .pcie(PcieLevel::SingleSwitch, &at(&[4, 5]))
        .pcie(PcieLevel::SingleSwitch, &at(&[6, 7]))
        .nvlinks(&links)
}

/// The 8-GPU DGX-1 V100 of `docs/reference/topology.md` §3.
pub fn dgx1_v100() -> NodeBuilder {
    dgx1_board(NodeBuilder::new(8, PcieLevel::CrossSocket), 0).product(
        "Tesla V100-SXM2-16GB",
        16 << 30,
        (7, 0),
    )
}

/// A 16-GPU node: two DGX-1 V100 boards (GPUs 0–7 and 8–15) joined across sockets, the node
/// `docs/reference/topology.md` §2 times NVIDIA's exhaustive search on (nvml-sim's `hgx16`).
pub fn dual_dgx1_v100() -> NodeBuilder {
    let builder = NodeBuilder::new(16, PcieLevel::CrossSocket);
    dgx1_board(dgx1_board(builder, 0), 8).product("Tesla V100-SXM2-16GB", 16 << 30, (7, 0))
}

/// A DGX-1 with Ampere compute capability whose GPUs 4 and 5 are in MIG mode, each split
/// 3g.20gb + 1g.5gb + 1g.5gb (`MIG-<parent>-<i>`): the fixture of the MIG sharing tests.
pub fn dgx1_with_mig_gpus() -> Inventory {
    use crate::inventory::{DevNum, MigCaps, MigDevice};
    let mut inv = dgx1_v100().inventory();
    for gpu in &mut inv.gpus {
        gpu.compute_capability = Some((8, 0));
    }
    inv.mig.enabled = vec![4, 5];
    inv.mig.caps_major = Some(235);
    for parent in [4_u32, 5] {
        let layout = [
            (3_u32, 9_u32, "3g.20gb"),
            (1, 19, "1g.5gb"),
            (1, 19, "1g.5gb"),
        ];
        for (i, (slices, profile, name)) in (0_u32..).zip(layout) {
            let gi = 10 * parent + i;
            inv.mig.devices.push(MigDevice {
                parent,
                parent_minor: parent,
                index: i,
                uuid: format!("MIG-{parent}-{i}"),
                gpu_instance: gi,
                compute_instance: 0,
                profile: Some(profile),
                profile_name: name.to_owned(),
                memory_total: u64::from(slices) * (5 << 30),
                multiprocessors: 14 * slices,
                gpu_instance_slices: slices,
                compute_instance_slices: slices,
                caps: Some(MigCaps {
                    gpu_instance: DevNum {
                        major: 235,
                        minor: 2 * gi,
                    },
                    compute_instance: DevNum {
                        major: 235,
                        minor: 2 * gi + 1,
                    },
                    gpu_instance_file: String::new(),
                    compute_instance_file: String::new(),
                }),
                healthy: true,
            });
        }
    }
    inv
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a failed unwrap fails the test at its line
mod tests {
    use super::*;

    fn link(pcie: PcieLevel, nvlinks: u32) -> Link {
        Link::pcie(pcie).with_nvlinks(nvlinks)
    }

    #[test]
    fn dgx1_has_the_reference_links() {
        use PcieLevel::{CrossSocket, HostBridge, SingleSwitch};
        let topology = dgx1_v100().topology();
        assert_eq!(topology.size(), 8);
        assert_eq!(topology.get(0, 3), link(HostBridge, 2));
        assert_eq!(topology.get(3, 0), link(HostBridge, 2));
        assert_eq!(topology.get(2, 6), link(CrossSocket, 1));
        // 0–5 has no NVLink and crosses sockets; 0–1 is NVLinked and shares a switch.
        assert_eq!(topology.get(0, 5), link(CrossSocket, 0));
        assert_eq!(topology.get(0, 1), link(SingleSwitch, 1));
        assert_eq!(topology.get(0, 0), Link::UNKNOWN);
        let nvlinked = (0..8)
            .flat_map(|a| (0..8).map(move |b| (a, b)))
            .filter(|&(a, b)| topology.get(a, b).nvlinks > 0);
        assert_eq!(nvlinked.count(), 32);
    }

    #[test]
    fn dual_board_joins_boards_across_sockets() {
        let builder = dual_dgx1_v100();
        let topology = builder.topology();
        assert_eq!(topology.size(), 16);
        assert_eq!(topology.get(8, 11), link(PcieLevel::HostBridge, 2));
        assert_eq!(topology.get(3, 11), link(PcieLevel::CrossSocket, 0));
        assert_eq!(topology.get(7, 8), link(PcieLevel::CrossSocket, 0));
        let inventory = builder.inventory();
        assert_eq!(inventory.gpus.len(), 16);
        assert_eq!(inventory.by_index(12).map(|g| g.minor), Some(12));
        assert!(inventory.gpus.iter().all(|g| g.healthy));
    }

    #[test]
    fn pcie_groups_override_in_order_and_ignore_out_of_range() {
        let topology = NodeBuilder::new(4, PcieLevel::CrossSocket)
            .pcie(PcieLevel::SameNumaNode, &[0, 1, 2, 9])
            .pcie(PcieLevel::SameBoard, &[0, 1])
            .nvlinks(&[(2, 3, 4), (3, 17, 1)])
            .topology();
        assert_eq!(topology.get(0, 1), link(PcieLevel::SameBoard, 0));
        assert_eq!(topology.get(1, 2), link(PcieLevel::SameNumaNode, 0));
        assert_eq!(topology.get(0, 3), link(PcieLevel::CrossSocket, 0));
        assert_eq!(topology.get(3, 2), link(PcieLevel::CrossSocket, 4));
    }
}
