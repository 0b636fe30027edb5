//! The pairwise link matrix, read once from NVML.
//!
//! Facts relied on (`docs/reference/nvml.md` §3; nvidia-smi `topo -m`):
//! - NVLink: for each link `l` of a GPU, `nvmlDeviceGetNvLinkState(l)` says whether it is
//!   active and `nvmlDeviceGetNvLinkRemotePciInfo_v2(l)` gives the PCI bus id at the other end.
//!   A link the GPU lacks gives `NOT_SUPPORTED` (V100 has 6 links, A100 12); a link number past
//!   the driver's `NVML_NVLINK_MAX_LINKS` (18 since R525) gives `INVALID_ARGUMENT`.
//! - Two GPUs are joined by as many links as one has whose remote end is the other's bus id.
//! - On NVSwitch systems (DGX A100, HGX) every link ends at a switch, not a GPU. nvidia-smi shows
//!   such pairs as `NV<n>`, `n` the links each GPU has into the fabric. A remote bus id for which
//!   `nvmlDeviceGetHandleByPciBusId_v2` answers `NOT_FOUND` is a switch (a lost GPU answers
//!   `GPU_IS_LOST` and is not one); two GPUs reaching common switches are joined by the smaller of
//!   their link counts into those switches. (nvml-wrapper's `remote_device_type` always answers
//!   `Unknown`, so the switch is recognised this way instead.)
//! - For every pair, NVLinked or not, `nvmlDeviceGetTopologyCommonAncestor` gives the PCIe level
//!   (`INTERNAL`/`SINGLE`/`MULTIPLE`/`HOSTBRIDGE`/`NODE`/`SYSTEM`). Both are kept: NVIDIA's
//!   go-gpuallocator records a PCIe link for every pair and an NVLink link beside it
//!   (`gpuallocator/device.go`), and scores a pair by the sum (`docs/reference/topology.md` §1).
//!   go-gpuallocator does not see NVLinks through NVSwitches (its `TODO(klueska)`); we count them
//!   as `nvidia-smi` shows them.
//! - Any error here (`NOT_SUPPORTED`, missing symbols, lost GPUs) leaves that part unknown (no
//!   PCIe level, no NVLinks): topology only guides placement.

use std::collections::{BTreeMap, BTreeSet};

use nvml_wrapper::enum_wrappers::device::TopologyLevel;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::{Device, Nvml};

use crate::{inventory::Gpu, inventory::Link, inventory::PcieLevel, inventory::Topology};

/// `NVML_NVLINK_MAX_LINKS` in `nvml.h` (R525 and later; older headers say 12 or 6).
const NVLINK_MAX_LINKS: u32 = 18;

/// A PCI address as numbers, so that `00000000:06:00.0` and `0000:06:00.0` compare equal.
type PciKey = (u32, u32, u32, u32);

/// Parses NVML's `domain:bus:device.function` bus id (hex fields, any case, any widths).
fn pci_key(bus_id: &str) -> Option<PciKey> {
    let mut parts = bus_id.trim().rsplitn(3, ':');
    let (devfn, bus, domain) = (parts.next()?, parts.next()?, parts.next().unwrap_or("0"));
    let (dev, func) = devfn.split_once('.')?;
    let hex = |s: &str| u32::from_str_radix(s, 16).ok();
    Some((hex(domain)?, hex(bus)?, hex(dev)?, hex(func)?))
}

/// The remote ends of a GPU's active NVLinks, as parsed keys and as NVML wrote them.
fn nvlink_remotes(device: &Device<'_>, index: u32) -> Vec<(PciKey, String)> {
    let mut remotes = Vec::new();
    for l in 0..NVLINK_MAX_LINKS {
        let link = device.link_wrapper_for(l);
        match link.is_active() {
            Ok(true) => match link.remote_pci_info() {
                Ok(info) => match pci_key(&info.bus_id) {
                    Some(key) => remotes.push((key, info.bus_id)),
                    None => {
                        tracing::warn!(index, link = l, bus_id = %info.bus_id, "unparsable NVLink remote bus id")
                    }
                },
                Err(err) => {
                    tracing::warn!(index, link = l, %err, "NVLink remote PCI info unavailable")
                }
            },
            // A link this GPU lacks (fewer links, or fused off): look at the next one.
            Ok(false) | Err(NvmlError::NotSupported) => {}
            // Past NVML_NVLINK_MAX_LINKS for this driver.
            Err(NvmlError::InvalidArg) => break,
            Err(err) => {
                tracing::debug!(index, link = l, %err, "no further NVLink state");
                break;
            }
        }
    }
    remotes
}

fn pcie_level(level: TopologyLevel) -> PcieLevel {
    match level {
        TopologyLevel::Internal => PcieLevel::SameBoard,
        TopologyLevel::Single => PcieLevel::SingleSwitch,
        TopologyLevel::Multiple => PcieLevel::MultipleSwitches,
        TopologyLevel::HostBridge => PcieLevel::HostBridge,
        TopologyLevel::Node => PcieLevel::SameNumaNode,
        TopologyLevel::System => PcieLevel::CrossSocket,
    }
}

/// The remote ends that are NVSwitches: no GPU of ours, and no GPU at all for NVML.
fn switches(
    nvml: &Nvml,
    remotes: &[Vec<(PciKey, String)>],
    gpu_keys: &[Option<PciKey>],
) -> BTreeSet<PciKey> {
    let mut seen = BTreeSet::new();
    let mut switches = BTreeSet::new();
    for (key, bus_id) in remotes.iter().flatten() {
        if gpu_keys.contains(&Some(*key)) || !seen.insert(*key) {
            continue;
        }
        match nvml.device_by_pci_bus_id(bus_id.as_str()) {
            Err(NvmlError::NotFound) => {
                switches.insert(*key);
            }
            Ok(_) => tracing::debug!(%bus_id, "NVLink peer is a GPU this inventory lacks"),
            Err(err) => {
                tracing::debug!(%bus_id, %err, "NVLink peer is no usable GPU; not a switch")
            }
        }
    }
    switches
}

/// NVLinks from GPU `a` to GPU `b`: direct links, plus links through switches both reach.
fn nvlinks_between(
    remotes: &[Vec<PciKey>],
    gpu_keys: &[Option<PciKey>],
    switches: &BTreeSet<PciKey>,
    a: usize,
    b: usize,
) -> u32 {
    let Some(b_key) = gpu_keys[b] else { return 0 };
    let direct = remotes[a].iter().filter(|&&r| r == b_key).count();
    let switches = |g: usize| {
        let mut per_switch: BTreeMap<PciKey, usize> = BTreeMap::new();
        for key in remotes[g].iter().filter(|k| switches.contains(k)) {
            *per_switch.entry(*key).or_default() += 1;
        }
        per_switch
    };
    let (sa, sb) = (switches(a), switches(b));
    let into_shared = |own: &BTreeMap<PciKey, usize>, other: &BTreeMap<PciKey, usize>| -> usize {
        own.iter()
            .filter(|(k, _)| other.contains_key(k))
            .map(|(_, n)| n)
            .sum()
    };
    let via_switch = into_shared(&sa, &sb).min(into_shared(&sb, &sa));
    u32::try_from(direct + via_switch).unwrap_or(u32::MAX)
}

/// Reads the link matrix of `gpus`; `devices[i]` is the handle of `gpus[i]` (`None` if lost).
pub(super) fn read(nvml: &Nvml, devices: &[Option<Device<'_>>], gpus: &[Gpu]) -> Topology {
    let n = gpus.len();
    let mut topology = Topology::unknown(n);
    let found: Vec<Vec<(PciKey, String)>> = devices
        .iter()
        .zip(gpus)
        .map(|(d, g)| {
            d.as_ref()
                .map(|d| nvlink_remotes(d, g.index))
                .unwrap_or_default()
        })
        .collect();
    let gpu_keys: Vec<Option<PciKey>> = devices
        .iter()
        .zip(gpus)
        .map(|(d, g)| d.as_ref().and(pci_key(&g.pci_bus_id)))
        .collect();
    let switches = switches(nvml, &found, &gpu_keys);
    let remotes: Vec<Vec<PciKey>> = found
        .iter()
        .map(|r| r.iter().map(|(key, _)| *key).collect())
        .collect();
    for a in 0..n {
        for b in (a + 1)..n {
            let (Some(da), Some(db)) = (&devices[a], &devices[b]) else {
                continue;
            };
            // Links are physical and two-way: when one side could not be read, the other counts.
            let nvlinks = nvlinks_between(&remotes, &gpu_keys, &switches, a, b)
                .max(nvlinks_between(&remotes, &gpu_keys, &switches, b, a));
            let pcie = match nvml.topology_common_ancestor(da, db) {
                Ok(level) => Some(pcie_level(level)),
                Err(err) => {
                    let (ia, ib) = (gpus[a].index, gpus[b].index);
                    if is_quiet(&err) {
                        tracing::debug!(a = ia, b = ib, %err, "PCIe topology unknown");
                    } else {
                        tracing::warn!(a = ia, b = ib, %err, "PCIe topology query failed");
                    }
                    None
                }
            };
            let link = Link { pcie, nvlinks };
            topology.set(a, b, link);
            topology.set(b, a, link);
        }
    }
    topology
}

fn is_quiet(err: &NvmlError) -> bool {
    matches!(
        err,
        NvmlError::NotSupported | NvmlError::FailedToLoadSymbol(_) | NvmlError::FunctionNotFound
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bus_ids_compare_by_value() {
        assert_eq!(pci_key("00000000:06:00.0"), Some((0, 6, 0, 0)));
        assert_eq!(pci_key("0000:06:00.0"), pci_key("00000000:06:00.0"));
        assert_eq!(pci_key("00000001:8A:1f.7"), Some((1, 0x8a, 0x1f, 7)));
        assert_eq!(pci_key("06:00.0"), Some((0, 6, 0, 0)));
        assert_eq!(pci_key("junk"), None);
        assert_eq!(pci_key("0000:zz:00.0"), None);
    }

    fn key(bus: u32) -> PciKey {
        (0, bus, 0, 0)
    }

    #[test]
    fn direct_links_are_counted() {
        let gpu_keys = [Some(key(1)), Some(key(2)), Some(key(3))];
        let remotes = vec![
            vec![key(2), key(2), key(3)],
            vec![key(1), key(1)],
            vec![key(1)],
        ];
        let sw = BTreeSet::new();
        assert_eq!(nvlinks_between(&remotes, &gpu_keys, &sw, 0, 1), 2);
        assert_eq!(nvlinks_between(&remotes, &gpu_keys, &sw, 0, 2), 1);
        assert_eq!(nvlinks_between(&remotes, &gpu_keys, &sw, 1, 2), 0);
    }

    #[test]
    fn switch_fabric_counts_links_into_shared_switches() {
        // GPUs 0..2 at buses 1..3; switches at buses 0xa0 and 0xa1; GPU 2 reaches only 0xa1.
        let gpu_keys = [Some(key(1)), Some(key(2)), Some(key(3))];
        let remotes = vec![
            vec![key(0xa0), key(0xa0), key(0xa1), key(0xa1)],
            vec![key(0xa0), key(0xa0), key(0xa1), key(0xa1)],
            vec![key(0xa1)],
        ];
        let sw = BTreeSet::from([key(0xa0), key(0xa1)]);
        assert_eq!(nvlinks_between(&remotes, &gpu_keys, &sw, 0, 1), 4);
        assert_eq!(nvlinks_between(&remotes, &gpu_keys, &sw, 0, 2), 1);
        assert_eq!(nvlinks_between(&remotes, &gpu_keys, &sw, 2, 0), 1);
        // A remote end that is not a known switch (e.g. a lost GPU) joins nothing.
        assert_eq!(
            nvlinks_between(&remotes, &gpu_keys, &BTreeSet::from([key(0xa1)]), 0, 1),
            2
        );
        assert_eq!(
            nvlinks_between(&remotes, &[Some(key(1)), None, Some(key(3))], &sw, 0, 1),
            0
        );
    }

    #[test]
    fn pcie_levels_map_to_links() {
        assert_eq!(pcie_level(TopologyLevel::Internal).label(), "PSB");
        assert_eq!(pcie_level(TopologyLevel::Single).label(), "PIX");
        assert_eq!(pcie_level(TopologyLevel::Multiple).label(), "PXB");
        assert_eq!(pcie_level(TopologyLevel::HostBridge).label(), "PHB");
        assert_eq!(pcie_level(TopologyLevel::Node).label(), "NODE");
        assert_eq!(pcie_level(TopologyLevel::System).label(), "SYS");
    }
}
