//! The NVIDIA device nodes a container needs, with their device numbers read by `stat(2)`.
//!
//! Facts relied on (`docs/reference/mesos-gpu-isolator.md` §1.1 and §5.1):
//! - each GPU is the character device `/dev/nvidia<minor>`, major 195
//!   ([`NVIDIA_GPU_MAJOR`]), minor from `nvmlDeviceGetMinorNumber` (not always the index);
//! - `/dev/nvidiactl` (usually `195:255`) and `/dev/nvidia-uvm` are required for any GPU to be
//!   usable; `/dev/nvidia-uvm-tools` is optional. nvidia-uvm has a **dynamic** major, so every
//!   number is read from `st_rdev`, none is hard-coded;
//! - a missing `/dev/nvidia-uvm` is usually fixed by `nvidia-modprobe -u -c 0` (Mesos runs it;
//!   here the error says so and nothing is run).
//!
//! `st_rdev` is split with glibc's `major()`/`minor()` (`libc::major`, `libc::minor`).

use std::fs;
use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use crate::{inventory::DevNum, inventory::Inventory, inventory::NVIDIA_GPU_MAJOR};

use mesos_gpu_os::IoError;

mod expected;

pub use expected::{ExpectedNode, NodeFinding, NodeState, char_major, check_nodes, expected_nodes};

/// `nvidiactl`, relative to the device root.
pub const NVIDIACTL: &str = "nvidiactl";
/// `nvidia-uvm`, relative to the device root.
pub const NVIDIA_UVM: &str = "nvidia-uvm";
/// `nvidia-uvm-tools`, relative to the device root.
pub const NVIDIA_UVM_TOOLS: &str = "nvidia-uvm-tools";

/// Why the device nodes are not usable.
#[derive(Debug, thiserror::Error)]
pub enum DevicesError {
    /// A required node does not exist.
    #[error("{path} is missing; {hint}")]
    Missing {
        /// The node's path.
        path: PathBuf,
        /// What usually fixes it.
        hint: &'static str,
    },
    /// `stat` failed for another reason.
    #[error(transparent)]
    Stat(IoError),
    /// The path is not a character device.
    #[error("{path} is not a character device")]
    NotCharDevice {
        /// The path.
        path: PathBuf,
    },
    /// A GPU node's number does not match the GPU.
    #[error("{path} is device {found}, expected {expected} for GPU {index}")]
    WrongNumber {
        /// The node's path.
        path: PathBuf,
        /// NVML index of the GPU.
        index: u32,
        /// What `stat` reported.
        found: DevNum,
        /// `195:<minor>`.
        expected: DevNum,
    },
}

/// One character device node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceNode {
    /// Path under the device root, e.g. `/dev/nvidia0`.
    pub path: PathBuf,
    /// Major and minor from `st_rdev`.
    pub dev: DevNum,
}

/// The device node of one GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuNode {
    /// NVML index of the GPU.
    pub index: u32,
    /// Its `/dev/nvidia<minor>` node.
    pub node: DeviceNode,
}

/// The NVIDIA device nodes of a node, read once.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DeviceNodes {
    /// Control nodes every GPU container gets: `nvidiactl`, `nvidia-uvm`, then
    /// `nvidia-uvm-tools` when present.
    pub control: Vec<DeviceNode>,
    /// One node per healthy GPU of the inventory, in inventory order.
    pub gpus: Vec<GpuNode>,
}

impl DeviceNodes {
    /// Stats the NVIDIA nodes under `dev_root` for the GPUs of `inventory`. With no healthy GPU,
    /// missing control nodes are not an error; GPUs listed as unhealthy are skipped.
    pub fn scan(dev_root: &Path, inventory: &Inventory) -> Result<Self, DevicesError> {
        let need_control = inventory.gpus.iter().any(|g| g.healthy);
        let mut control = Vec::new();
        for (name, hint) in [
            (NVIDIACTL, Some("is the nvidia kernel module loaded?")),
            (
                NVIDIA_UVM,
                Some("load the nvidia-uvm module, e.g. with `nvidia-modprobe -u -c 0`"),
            ),
            (NVIDIA_UVM_TOOLS, None),
        ] {
            let path = dev_root.join(name);
            match (stat_char(&path)?, hint) {
                (Some(dev), _) => control.push(DeviceNode { path, dev }),
                (None, Some(hint)) if need_control => {
                    return Err(DevicesError::Missing { path, hint });
                }
                (None, _) => tracing::debug!(path = %path.display(), "optional device node absent"),
            }
        }
        let mut gpus = Vec::new();
        for gpu in inventory.gpus.iter().filter(|g| g.healthy) {
            let path = dev_root.join(format!("nvidia{}", gpu.minor));
            let expected = DevNum {
                major: NVIDIA_GPU_MAJOR,
                minor: gpu.minor,
            };
            let Some(found) = stat_char(&path)? else {
                return Err(DevicesError::Missing {
                    path,
                    hint: "the NVIDIA driver creates it (nvidia-modprobe -c <minor>)",
                });
            };
            if found != expected {
                return Err(DevicesError::WrongNumber {
                    path,
                    index: gpu.index,
                    found,
                    expected,
                });
            }
            gpus.push(GpuNode {
                index: gpu.index,
                node: DeviceNode { path, dev: found },
            });
        }
        tracing::debug!(control = control.len(), gpus = gpus.len(), root = %dev_root.display(), "scanned device nodes");
        Ok(DeviceNodes { control, gpus })
    }

    /// The nodes as the driver names them under `dev_root`, without reading them: `nvidiactl`
    /// (195:255), `nvidia-uvm` and `nvidia<minor>` (195:<minor>) for each healthy GPU of
    /// `inventory` with a known minor. For a simulated node without device nodes, whose nodes
    /// are only passed on to Docker (which reads the numbers itself), never to a device cgroup:
    /// `nvidia-uvm`'s major is dynamic, and given here as 0.
    pub fn named(dev_root: &Path, inventory: &Inventory) -> DeviceNodes {
        let node = |name: String, major, minor| DeviceNode {
            path: dev_root.join(name),
            dev: DevNum { major, minor },
        };
        DeviceNodes {
            control: vec![
                node(NVIDIACTL.to_owned(), NVIDIA_GPU_MAJOR, 255),
                node(NVIDIA_UVM.to_owned(), 0, 0),
            ],
            gpus: inventory
                .gpus
                .iter()
                .filter(|g| g.healthy && g.minor != crate::discovery::UNKNOWN_MINOR)
                .map(|g| GpuNode {
                    index: g.index,
                    node: node(format!("nvidia{}", g.minor), NVIDIA_GPU_MAJOR, g.minor),
                })
                .collect(),
        }
    }

    /// The node of the GPU with NVML index `index`.
    pub fn gpu(&self, index: u32) -> Option<&DeviceNode> {
        self.gpus.iter().find(|g| g.index == index).map(|g| &g.node)
    }
}

/// The device number of the character device at `path`, `None` when nothing is there.
fn stat_char(path: &Path) -> Result<Option<DevNum>, DevicesError> {
    let meta = match fs::metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(DevicesError::Stat(IoError::new("stat", path, source)));
        }
    };
    if !meta.file_type().is_char_device() {
        return Err(DevicesError::NotCharDevice {
            path: path.to_path_buf(),
        });
    }
    Ok(Some(split_rdev(meta.rdev())))
}

/// Splits an `st_rdev` into major and minor as glibc's `major()`/`minor()` do.
pub(crate) fn split_rdev(rdev: u64) -> DevNum {
    DevNum {
        major: libc::major(rdev),
        minor: libc::minor(rdev),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{inventory::DriverInfo, inventory::Gpu, inventory::Topology};

    fn inventory(minors: &[u32]) -> Inventory {
        let gpus: Vec<Gpu> = (0u32..)
            .zip(minors)
            .map(|(index, &minor)| Gpu {
                index,
                minor,
                uuid: format!("GPU-{index}"),
                name: "Tesla K80".into(),
                memory_total: 12 << 30,
                pci_bus_id: String::new(),
                numa_node: None,
                compute_capability: Some((3, 7)),
                healthy: true,
            })
            .collect();
        Inventory {
            driver: Some(DriverInfo {
                version: "470.57.02".into(),
                cuda_version: Some((11, 4)),
            }),
            topology: Topology::unknown(gpus.len()),
            gpus,
            absent_reason: None,
            mig: Default::default(),
        }
    }

    #[test]
    fn glibc_layout() {
        // makedev(195, 255) and makedev(511, 1) in glibc's encoding.
        assert_eq!(
            split_rdev(0xc3ff),
            DevNum {
                major: 195,
                minor: 255
            }
        );
        assert_eq!(
            split_rdev((511 << 8) | 1),
            DevNum {
                major: 511,
                minor: 1
            }
        );
        // Large numbers use the high bits: major 0x1234, minor 0x56789.
        let rdev = ((0x1234u64 & 0xfff) << 8)
            | ((0x1234u64 & !0xfff) << 32)
            | (0x56789u64 & 0xff)
            | ((0x56789u64 & !0xff) << 12);
        assert_eq!(
            split_rdev(rdev),
            DevNum {
                major: 0x1234,
                minor: 0x56789
            }
        );
    }

    #[test]
    fn no_gpus_and_no_nodes_is_fine() {
        let dir = tempfile::tempdir().expect("tempdir");
        let nodes = DeviceNodes::scan(dir.path(), &Inventory::default())
            .expect("no GPUs, nothing required");
        assert_eq!(nodes, DeviceNodes::default());
    }

    #[test]
    fn missing_control_node_is_named() {
        let dir = tempfile::tempdir().expect("tempdir");
        let err = DeviceNodes::scan(dir.path(), &inventory(&[0])).expect_err("nvidiactl missing");
        let want = dir.path().join(NVIDIACTL);
        assert!(
            matches!(&err, DevicesError::Missing { path, .. } if *path == want),
            "{err}"
        );
        assert!(err.to_string().contains(&want.display().to_string()));
    }

    #[test]
    fn plain_file_is_not_a_device() {
        let dir = tempfile::tempdir().expect("tempdir");
        fs::write(dir.path().join(NVIDIACTL), b"").expect("write");
        let err = DeviceNodes::scan(dir.path(), &inventory(&[0])).expect_err("plain file");
        assert!(matches!(err, DevicesError::NotCharDevice { .. }), "{err}");
        assert!(
            err.to_string()
                .ends_with("nvidiactl is not a character device"),
            "{err}"
        );
        // Even with no GPUs a plain file where a node should be is reported.
        assert!(DeviceNodes::scan(dir.path(), &Inventory::default()).is_err());
    }

    #[test]
    fn unhealthy_gpus_are_skipped() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut inv = inventory(&[0]);
        inv.gpus[0].healthy = false;
        assert_eq!(
            DeviceNodes::scan(dir.path(), &inv).expect("skipped"),
            DeviceNodes::default()
        );
    }
}
