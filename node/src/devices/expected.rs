//! Which NVIDIA device nodes a node's driver should have made, with the numbers they must carry,
//! and how the nodes under a device root compare: what an operator checks before the first task
//! (`mesos-gpu doctor`).
//!
//! Facts relied on (`docs/reference/mesos-gpu-isolator.md` §1.1, §5.1; the kernel's
//! `Documentation/admin-guide/devices.txt`; NVIDIA's `nvidia-modprobe`):
//! - `/dev/nvidia<minor>` is `195:<minor>` with the minor NVML gives (`nvmlDeviceGetMinorNumber`),
//!   `/dev/nvidiactl` is `195:255`;
//! - `nvidia-uvm` registers a **dynamic** major, listed as `<major> nvidia-uvm` under
//!   `Character devices:` in `/proc/devices`; `/dev/nvidia-uvm` is minor 0 and
//!   `/dev/nvidia-uvm-tools` minor 1 of it (`nvidia-modprobe -u` makes both). Without the line the
//!   module is not loaded and CUDA cannot start;
//! - a MIG device is granted by two `/dev/nvidia-caps/nvidia-cap<minor>` nodes of the dynamic
//!   `nvidia-caps` major, as discovery read them ([`crate::inventory::MigCaps`]).

use std::fs;
use std::io;
use std::os::unix::fs::{FileTypeExt as _, MetadataExt as _};
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::{NVIDIA_UVM, NVIDIA_UVM_TOOLS, NVIDIACTL, split_rdev};
use crate::inventory::{DevNum, Inventory, NVIDIA_GPU_MAJOR};

/// `/dev/nvidiactl`'s minor.
const NVIDIACTL_MINOR: u32 = 255;

/// A node the driver should have made.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ExpectedNode {
    /// Path relative to the device root, e.g. `nvidia-uvm`, `nvidia-caps/nvidia-cap21`.
    pub name: PathBuf,
    /// The number it must carry; `None` when the driver registers no major for it (its kernel
    /// module is not loaded).
    pub dev: Option<DevNum>,
    /// Containers cannot use a GPU without it (`nvidia-uvm-tools` is optional).
    pub required: bool,
    /// What it is for, and where its number comes from, for the report.
    pub what: String,
}

/// How one expected node compares with what is under the device root.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum NodeState {
    /// Present with the right number.
    Present,
    /// Nothing at the path.
    Missing,
    /// A character device with another number.
    WrongNumber {
        /// What `stat` reports.
        found: DevNum,
    },
    /// Something other than a character device.
    NotCharDevice,
    /// The driver registers no major for it (`/proc/devices` has no line).
    NotRegistered,
    /// `stat` failed otherwise.
    Unreadable {
        /// The error.
        error: String,
    },
}

/// One node's finding.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NodeFinding {
    /// The node.
    pub node: ExpectedNode,
    /// Its path under the device root.
    pub path: PathBuf,
    /// How it compares.
    #[serde(flatten)]
    pub state: NodeState,
}

impl NodeFinding {
    /// True when the node is as it must be, or optional and absent.
    pub fn is_ok(&self) -> bool {
        match self.state {
            NodeState::Present => true,
            NodeState::Missing | NodeState::NotRegistered => !self.node.required,
            _ => false,
        }
    }
}

/// The major `/proc/devices` gives the character device `name`, from its text.
pub fn char_major(proc_devices: &str, name: &str) -> Option<u32> {
    proc_devices
        .lines()
        .skip_while(|l| l.trim() != "Character devices:")
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .find_map(|l| {
            let (major, dev) = l.trim().split_once(char::is_whitespace)?;
            (dev.trim() == name).then(|| major.parse().ok())?
        })
}

/// The nodes `inventory`'s driver should have made: the control nodes (`nvidia-uvm`'s major
/// from `proc_devices`, the text of `/proc/devices`), every GPU's node (those in MIG mode too,
/// which still have theirs; not a lost GPU's, whose minor NVML cannot read) and every MIG
/// device's two capability nodes.
pub fn expected_nodes(inventory: &Inventory, proc_devices: &str) -> Vec<ExpectedNode> {
    let uvm = char_major(proc_devices, NVIDIA_UVM);
    let mut nodes = vec![
        ExpectedNode {
            name: PathBuf::from(NVIDIACTL),
            dev: Some(DevNum {
                major: NVIDIA_GPU_MAJOR,
                minor: NVIDIACTL_MINOR,
            }),
            required: true,
            what: "the driver's control node".to_owned(),
        },
        ExpectedNode {
            name: PathBuf::from(NVIDIA_UVM),
            dev: uvm.map(|major| DevNum { major, minor: 0 }),
            required: true,
            what: "CUDA's unified memory, major from /proc/devices".to_owned(),
        },
        ExpectedNode {
            name: PathBuf::from(NVIDIA_UVM_TOOLS),
            dev: uvm.map(|major| DevNum { major, minor: 1 }),
            required: false,
            what: "CUDA profiling tools, major from /proc/devices".to_owned(),
        },
    ];
    // A GPU NVML could not read the minor of (lost) has no node that can be named.
    let known = inventory
        .gpus
        .iter()
        .filter(|g| g.minor != crate::discovery::UNKNOWN_MINOR);
    for gpu in known {
        nodes.push(ExpectedNode {
            name: PathBuf::from(format!("nvidia{}", gpu.minor)),
            dev: Some(DevNum {
                major: NVIDIA_GPU_MAJOR,
                minor: gpu.minor,
            }),
            required: true,
            what: format!("GPU {}, minor from NVML", gpu.index),
        });
    }
    for mig in &inventory.mig.devices {
        let Some(caps) = &mig.caps else {
            continue;
        };
        for (dev, kind) in [
            (caps.gpu_instance, "GPU instance"),
            (caps.compute_instance, "compute instance"),
        ] {
            let name = PathBuf::from(format!("nvidia-caps/nvidia-cap{}", dev.minor));
            if nodes.iter().any(|n| n.name == name) {
                continue;
            }
            nodes.push(ExpectedNode {
                name,
                dev: Some(dev),
                required: true,
                what: format!(
                    "{kind} capability of MIG device {} on GPU {}",
                    mig.uuid, mig.parent
                ),
            });
        }
    }
    nodes
}

/// Compares `expected` with the nodes under `dev_root` (`stat(2)`, never opened).
pub fn check_nodes(dev_root: &Path, expected: &[ExpectedNode]) -> Vec<NodeFinding> {
    expected
        .iter()
        .map(|node| {
            let path = dev_root.join(&node.name);
            let state = match node.dev {
                None => NodeState::NotRegistered,
                Some(want) => match fs::metadata(&path) {
                    Err(e) if e.kind() == io::ErrorKind::NotFound => NodeState::Missing,
                    Err(e) => NodeState::Unreadable {
                        error: e.to_string(),
                    },
                    Ok(meta) if !meta.file_type().is_char_device() => NodeState::NotCharDevice,
                    Ok(meta) => {
                        let found = split_rdev(meta.rdev());
                        if found == want {
                            NodeState::Present
                        } else {
                            NodeState::WrongNumber { found }
                        }
                    }
                },
            };
            NodeFinding {
                node: node.clone(),
                path,
                state,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const PROC_DEVICES: &str = "Character devices:
  1 mem
195 nvidia
195 nvidiactl
238 nvidia-uvm
241 nvidia-caps

Block devices:
238 nvidia-uvm-block-impostor
";

    #[test]
    fn majors_come_from_the_character_devices_only() {
        assert_eq!(char_major(PROC_DEVICES, "nvidia-uvm"), Some(238));
        assert_eq!(char_major(PROC_DEVICES, "nvidia-caps"), Some(241));
        assert_eq!(char_major(PROC_DEVICES, "nvidia-uvm-block-impostor"), None);
        assert_eq!(char_major("", "nvidia-uvm"), None);
    }

    fn inventory() -> Inventory {
        let mut inventory = Inventory::default();
        for (index, minor) in [(0, 3), (1, 0)] {
            inventory.gpus.push(crate::inventory::Gpu {
                index,
                minor,
                uuid: format!("GPU-{index}"),
                name: "Tesla V100-SXM2-16GB".to_owned(),
                memory_total: 16 << 30,
                pci_bus_id: format!("00000000:0{index}:00.0"),
                numa_node: None,
                compute_capability: None,
                healthy: true,
            });
        }
        inventory
    }

    #[test]
    fn gpus_by_minor_and_uvm_by_the_registered_major() {
        let nodes = expected_nodes(&inventory(), PROC_DEVICES);
        let named: Vec<(String, Option<DevNum>, bool)> = nodes
            .iter()
            .map(|n| (n.name.display().to_string(), n.dev, n.required))
            .collect();
        let dev = |major, minor| Some(DevNum { major, minor });
        assert_eq!(
            named,
            [
                ("nvidiactl".to_owned(), dev(195, 255), true),
                ("nvidia-uvm".to_owned(), dev(238, 0), true),
                ("nvidia-uvm-tools".to_owned(), dev(238, 1), false),
                ("nvidia3".to_owned(), dev(195, 3), true),
                ("nvidia0".to_owned(), dev(195, 0), true),
            ]
        );
        let unloaded = expected_nodes(&inventory(), "Character devices:\n195 nvidia\n");
        assert_eq!(unloaded[1].dev, None, "no nvidia-uvm line: not registered");
    }

    /// A lost GPU (NVML could not read its minor) has no node to expect: making or checking
    /// `nvidia4294967295` failed `serve --simulate` and `exec` on a node with a lost GPU.
    #[test]
    fn a_lost_gpu_has_no_node_to_expect() {
        let mut inventory = inventory();
        inventory.gpus[1].minor = crate::discovery::UNKNOWN_MINOR;
        inventory.gpus[1].healthy = false;
        let names: Vec<String> = expected_nodes(&inventory, PROC_DEVICES)
            .iter()
            .map(|n| n.name.display().to_string())
            .collect();
        assert_eq!(
            names,
            ["nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia3"]
        );
    }

    #[test]
    fn absent_nodes_and_files_are_reported() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("nvidiactl"), b"").expect("write");
        let nodes = expected_nodes(&inventory(), "Character devices:\n195 nvidia\n");
        let findings = check_nodes(dir.path(), &nodes);
        let states: Vec<&NodeState> = findings.iter().map(|f| &f.state).collect();
        assert_eq!(
            states,
            [
                &NodeState::NotCharDevice,
                &NodeState::NotRegistered,
                &NodeState::NotRegistered,
                &NodeState::Missing,
                &NodeState::Missing,
            ]
        );
        let ok: Vec<bool> = findings.iter().map(NodeFinding::is_ok).collect();
        assert_eq!(ok, [false, false, true, false, false]);
    }
}
