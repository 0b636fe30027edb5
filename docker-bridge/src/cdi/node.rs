//! From the node's GPUs to the CDI spec of kind `nvidia.com/gpu`.
//!
//! What the spec holds, and why (`docs/reference/cdi.md` §5,
//! `mesos-gpu-isolator.md` §1.1):
//! - one device per GPU under two names, its NVML index (`"0"`) and its UUID (`GPU-…`), as
//!   `nvidia-ctk cdi generate` names them by default, plus `all`. Each has the GPU's node
//!   `/dev/nvidia<minor>` (the minor comes from NVML, it is not the index) and nothing else, as
//!   NVIDIA's devices: no environment, so several devices requested together never overwrite
//!   each other's;
//! - the common edits, applied when any device is requested: the control nodes `nvidiactl`,
//!   `nvidia-uvm` and, when the host has it, `nvidia-uvm-tools`; the driver volume
//!   `<volume root>/nvidia_<driver version>` bind-mounted read-only at `/usr/local/nvidia`;
//!   `PATH`/`LD_LIBRARY_PATH` as the Docker path computes them for an image that sets neither
//!   ([`mesos_gpu_volume::container_env`]; CDI has no "append": these values replace the
//!   image's own); and `NVIDIA_VISIBLE_DEVICES=void`, as NVIDIA's generator writes it
//!   (`pkg/nvcdi/wrapper.go` `GetCommonEdits`): the container's GPUs are CDI's alone, and
//!   NVIDIA's legacy runtime hook, where it is still configured, injects none (`void`) instead
//!   of the GPUs an image's `NVIDIA_VISIBLE_DEVICES` would name. `cli/tests/cdi_nvidia_ctk.rs`
//!   compares the whole spec with what `nvidia-ctk` writes for the same node, and the operator
//!   guide lists each difference (NVIDIA mounts each driver file and runs `nvidia-cdi-hook`s; we
//!   mount the driver volume);
//! - device numbers come from `stat(2)` of the real nodes under the device root
//!   ([`DeviceNumbers::Scanned`]), or, on a simulated node without device nodes, are computed
//!   ([`DeviceNumbers::Computed`]): `195:<minor>` for GPUs and `195:255` for `nvidiactl`, fixed
//!   by the NVIDIA driver. `nvidia-uvm`'s major is assigned when its module loads, so a computed
//!   spec gives it no number and the runtime `stat`s `/dev/nvidia-uvm` when a container starts;
//!   the optional `nvidia-uvm-tools` is left out of a computed spec;
//! - GPUs the inventory marks unhealthy are left out, as from the allocator's pool.
//!
//! - a GPU in MIG mode is never a device whole: CUDA would see only its MIG devices. Each of its
//!   MIG devices is one, named as `nvidia-ctk cdi generate` names them (`pkg/nvcdi/namer.go`):
//!   `<gpu index>:<MIG device index>` ([`DeviceId::Mig`], the sparse NVML MIG index) and its
//!   `MIG-<uuid>`, with its parent's `/dev/nvidia<minor>` and its two
//!   `/dev/nvidia-caps/nvidia-cap<N>` access nodes (GPU instance, compute instance; their
//!   numbers from the driver's `/proc` files, as the inventory holds them) and
//!   `NVIDIA_VISIBLE_DEVICES=MIG-<uuid>`. A MIG device without capability nodes, or unhealthy, is
//!   left out, as from the allocator's pool.

use std::fmt;
use std::path::{Path, PathBuf};

use mesos_gpu_node::discovery::UNKNOWN_MINOR;
use mesos_gpu_node::{
    devices::DeviceNodes, devices::DevicesError, devices::NVIDIA_UVM, devices::NVIDIACTL,
};
use mesos_gpu_node::{inventory::DevNum, inventory::Inventory, inventory::NVIDIA_GPU_MAJOR};
use mesos_gpu_volume::version::VersionError;
use mesos_gpu_volume::{DriverVersion, VolumeManager};
use serde::Serialize;

use super::spec::{ContainerEdits, Device, DeviceNode, Mount, Spec, SpecError};
use crate::args::{DRIVER_VOLUME_TARGET, DeviceMapping, VISIBLE_DEVICES_ENV};
use mesos_gpu_grant::{Grant, MountKind};

/// The spec's kind: vendor `nvidia.com`, class `gpu`, as NVIDIA's own specs.
pub const KIND: &str = "nvidia.com/gpu";
/// The device holding every GPU.
pub const ALL: &str = "all";
/// The value of `NVIDIA_VISIBLE_DEVICES` in the common edits, as NVIDIA's generator writes it:
/// NVIDIA's runtime hook then injects no GPU of its own into a container that got its devices
/// through CDI.
pub const VISIBLE_DEVICES_VOID: &str = "void";
/// `/dev/nvidiactl`'s minor under major 195.
const NVIDIACTL_MINOR: u32 = 255;
/// Options of the driver volume's mount: read-only, no set-uid, no device files.
const VOLUME_MOUNT_OPTIONS: [&str; 4] = ["ro", "nosuid", "nodev", "bind"];

/// The CDI renderer of a [`Grant`]: the container edits a runtime applies to give a container
/// what the grant holds, the same device nodes and variables as the Mesos and Docker renderers
/// (an MPS share's pipe directory and `/dev/shm` as bind mounts). A MIG device's `/proc`
/// `access` files are not mounted (runc refuses mounts inside `/proc`; see
/// [`mesos_gpu_grant::MountKind::MigAccessFile`]), and a grant with a cpuset is refused: CDI
/// edits cannot set one. A device number of major 0 (`nvidia-uvm` named but not read, on a
/// simulated node) is left for the runtime to `stat`.
pub fn container_edits(grant: &Grant) -> Result<ContainerEdits, CdiError> {
    if let Some(pinning) = grant.cpuset() {
        return Err(CdiError::Cpuset {
            cpus: pinning.cpus.to_string(),
        });
    }
    grant
        .check_nodes()
        .map_err(|index| CdiError::NoDeviceNode { index })?;
    let device_nodes = grant
        .devices()
        .iter()
        .map(|d| {
            NodeEntry {
                path: d.container.clone(),
                host_path: d.host.clone(),
                dev: (d.dev.major != 0).then_some(d.dev),
            }
            .to_spec()
        })
        .collect::<Result<Vec<_>, _>>()?;
    let mut mounts = Vec::new();
    for mount in grant.mounts() {
        if mount.kind == MountKind::MigAccessFile {
            continue;
        }
        let access = if mount.read_only { "ro" } else { "rw" };
        mounts.push(Mount {
            host_path: utf8(&mount.source)?.to_owned(),
            container_path: utf8(&mount.target)?.to_owned(),
            options: [access, "nosuid", "nodev", "bind"]
                .map(str::to_owned)
                .to_vec(),
            mount_type: None,
        });
    }
    Ok(ContainerEdits {
        env: grant
            .env()
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect(),
        device_nodes,
        mounts,
    })
}

/// Why no spec could be made for the node.
#[derive(Debug, thiserror::Error)]
pub enum CdiError {
    /// The device nodes under the device root are missing or wrong.
    #[error("reading the NVIDIA device nodes under {dev_root}")]
    DeviceNodes {
        /// The device root.
        dev_root: PathBuf,
        /// What was wrong.
        #[source]
        source: DevicesError,
    },
    /// NVML could not say which `/dev/nvidia<minor>` node a GPU is.
    #[error("GPU {index} has no known device minor (NVML could not read it)")]
    UnknownMinor {
        /// NVML index of the GPU.
        index: u32,
    },
    /// The node has GPUs but NVML gave no driver version.
    #[error("the node has GPUs but no NVIDIA driver version; the driver volume cannot be named")]
    NoDriver,
    /// The driver version cannot name a volume.
    #[error("driver version {version:?} cannot name a driver volume")]
    DriverVersion {
        /// The version NVML reported.
        version: String,
        /// Why it is refused.
        #[source]
        source: VersionError,
    },
    /// A path the spec must carry is not UTF-8 (JSON strings are).
    #[error("{path}: a path in a CDI spec must be UTF-8")]
    NonUtf8Path {
        /// The path.
        path: PathBuf,
    },
    /// A grant with a cpuset (NUMA pinning): CDI container edits cannot set one.
    #[error(
        "CDI container edits cannot pin a container to CPUs {cpus}; pin it with the runtime's \
         own option (e.g. --cpuset-cpus) or use the Docker path"
    )]
    Cpuset {
        /// The CPUs it is pinned to.
        cpus: String,
    },
    /// A GPU of a grant has no device node on this host.
    #[error("GPU {index} has no device node under the device root")]
    NoDeviceNode {
        /// NVML index of the GPU.
        index: u32,
    },
    /// The devices break a rule of the spec.
    #[error("cannot build the CDI spec")]
    Spec(#[from] SpecError),
}

/// Where the spec's device numbers come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceNumbers {
    /// `stat(2)` of the nodes under this directory (`/dev`, or a private device root).
    Scanned {
        /// Directory holding the `nvidia*` nodes.
        dev_root: PathBuf,
    },
    /// Computed for a node without device nodes (see the module docs); host paths are `/dev/…`.
    Computed,
}

impl fmt::Display for DeviceNumbers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceNumbers::Scanned { dev_root } => {
                write!(f, "read from the nodes under {}", dev_root.display())
            }
            DeviceNumbers::Computed => f.write_str(
                "computed (195:<minor> for GPUs, 195:255 for nvidiactl; nvidia-uvm left for the \
                 runtime to stat; the optional nvidia-uvm-tools left out)",
            ),
        }
    }
}

/// A device node as the spec names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeEntry {
    /// Path in the container: `/dev/<name>`.
    pub path: PathBuf,
    /// Path on the host.
    pub host_path: PathBuf,
    /// The device number; `None` leaves the runtime to `stat` `host_path` at container start.
    pub dev: Option<DevNum>,
}

impl NodeEntry {
    /// The node `name` under `dev_root` on the host, at `/dev/<name>` in the container.
    fn under(dev_root: &Path, name: &str, dev: Option<DevNum>) -> NodeEntry {
        NodeEntry {
            path: Path::new("/dev").join(name),
            host_path: dev_root.join(name),
            dev,
        }
    }

    fn to_spec(&self) -> Result<DeviceNode, CdiError> {
        let path = utf8(&self.path)?;
        let host = utf8(&self.host_path)?;
        Ok(DeviceNode {
            host_path: (host != path).then(|| host.to_owned()),
            path: path.to_owned(),
            node_type: self.dev.map(|_| "c".to_owned()),
            major: self.dev.map(|d| i64::from(d.major)),
            minor: self.dev.map(|d| i64::from(d.minor)),
            permissions: Some(DeviceMapping::PERMISSIONS.to_owned()),
        })
    }
}

/// What a device is called by its index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceId {
    /// A whole GPU, named by its NVML index.
    Gpu {
        /// NVML index.
        index: u32,
    },
    /// A MIG device, named `<gpu>:<mig>`.
    Mig {
        /// NVML index of the parent GPU.
        gpu: u32,
        /// The parent's (sparse) NVML MIG device index.
        mig: u32,
    },
}

impl fmt::Display for DeviceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceId::Gpu { index } => write!(f, "{index}"),
            DeviceId::Mig { gpu, mig } => write!(f, "{gpu}:{mig}"),
        }
    }
}

/// One device of the spec before naming: what it is and the nodes it needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CdiDevice {
    /// Its index name.
    pub id: DeviceId,
    /// Its UUID (`GPU-…`, `MIG-…`), also a name.
    pub uuid: String,
    /// Its nodes, in order.
    pub nodes: Vec<NodeEntry>,
}

/// Everything the node contributes to its spec.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeDevices {
    /// Nodes every GPU container gets.
    pub control: Vec<NodeEntry>,
    /// The devices, in NVML index order (a MIG-mode GPU's MIG devices in its place).
    pub devices: Vec<CdiDevice>,
    /// Host directory of the driver volume.
    pub driver_volume: PathBuf,
    /// Where the device numbers came from.
    pub numbers: DeviceNumbers,
    /// NVML indices of GPUs left out as unhealthy.
    pub left_out: Vec<u32>,
}

/// The node's answer: its devices, or why it has none to declare.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Gathered {
    /// At least one healthy GPU.
    Devices(NodeDevices),
    /// Nothing to declare.
    NoGpus {
        /// Why, for the log and the operator.
        reason: String,
    },
}

/// A short account of a spec, for logs and `--json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SpecSummary {
    /// The declared version.
    pub cdi_version: String,
    /// Device names, in spec order.
    pub devices: Vec<String>,
    /// Where the device numbers came from.
    pub device_numbers: String,
    /// The driver volume mounted at `/usr/local/nvidia`.
    pub driver_volume: PathBuf,
    /// NVML indices of GPUs left out as unhealthy.
    pub left_out: Vec<u32>,
}

impl NodeDevices {
    /// Reads what the spec needs from `inventory`, the device nodes (per `numbers`) and the
    /// driver volume's place under `volumes`.
    pub fn gather(
        inventory: &Inventory,
        numbers: &DeviceNumbers,
        volumes: &VolumeManager,
    ) -> Result<Gathered, CdiError> {
        if inventory.gpus.is_empty() {
            let reason = inventory
                .absent_reason
                .clone()
                .unwrap_or_else(|| "NVML lists no GPU".to_owned());
            return Ok(Gathered::NoGpus { reason });
        }
        let left_out: Vec<u32> = inventory
            .gpus
            .iter()
            .filter(|g| !g.healthy)
            .map(|g| g.index)
            .collect();
        let healthy: Vec<_> = inventory.gpus.iter().filter(|g| g.healthy).collect();
        if healthy.is_empty() {
            return Ok(Gathered::NoGpus {
                reason: format!("every GPU is unhealthy (NVML indices {left_out:?})"),
            });
        }
        let driver = inventory.driver.as_ref().ok_or(CdiError::NoDriver)?;
        let version: DriverVersion =
            driver
                .version
                .parse()
                .map_err(|source| CdiError::DriverVersion {
                    version: driver.version.clone(),
                    source,
                })?;
        let (control, gpu_nodes) = match numbers {
            DeviceNumbers::Scanned { dev_root } => scanned(dev_root, inventory)?,
            DeviceNumbers::Computed => computed(&healthy)?,
        };
        let caps_dir = match numbers {
            DeviceNumbers::Scanned { dev_root } => dev_root.join(MIG_CAPS_DIR),
            DeviceNumbers::Computed => Path::new("/dev").join(MIG_CAPS_DIR),
        };
        let mut devices = Vec::new();
        for (index, node) in gpu_nodes {
            let Some(gpu) = inventory.by_index(index) else {
                continue;
            };
            if inventory.mig.is_enabled(index) {
                devices.extend(mig_devices(inventory, index, &node, &caps_dir));
            } else {
                devices.push(CdiDevice {
                    id: DeviceId::Gpu { index },
                    uuid: gpu.uuid.clone(),
                    nodes: vec![node],
                });
            }
        }
        if devices.is_empty() {
            return Ok(Gathered::NoGpus {
                reason: format!(
                    "every healthy GPU is in MIG mode (NVML indices {:?}) and none has a MIG \
                     device with capability nodes",
                    inventory.mig.enabled
                ),
            });
        }
        Ok(Gathered::Devices(NodeDevices {
            control,
            devices,
            driver_volume: volumes.volume_path(&version),
            numbers: numbers.clone(),
            left_out,
        }))
    }

    /// The spec: each device by index and by UUID, then `all`, and the common edits.
    pub fn spec(&self) -> Result<Spec, CdiError> {
        let mut devices = Vec::with_capacity(self.devices.len() * 2 + 1);
        for device in &self.devices {
            let edits = ContainerEdits {
                env: Vec::new(),
                device_nodes: nodes(&device.nodes)?,
                mounts: Vec::new(),
            };
            for name in [device.id.to_string(), device.uuid.clone()] {
                devices.push(Device {
                    name,
                    container_edits: edits.clone(),
                });
            }
        }
        let mut every: Vec<NodeEntry> = Vec::new();
        for node in self.devices.iter().flat_map(|d| &d.nodes) {
            if !every.iter().any(|n| n.path == node.path) {
                every.push(node.clone());
            }
        }
        devices.push(Device {
            name: ALL.to_owned(),
            container_edits: ContainerEdits {
                env: Vec::new(),
                device_nodes: nodes(&every)?,
                mounts: Vec::new(),
            },
        });
        let no_image_env: [&str; 0] = [];
        let mut env: Vec<String> = mesos_gpu_volume::container_env(&no_image_env)
            .into_iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        env.push(format!("{VISIBLE_DEVICES_ENV}={VISIBLE_DEVICES_VOID}"));
        let common = ContainerEdits {
            env,
            device_nodes: nodes(&self.control)?,
            mounts: vec![Mount {
                host_path: utf8(&self.driver_volume)?.to_owned(),
                container_path: DRIVER_VOLUME_TARGET.to_owned(),
                options: VOLUME_MOUNT_OPTIONS.iter().map(|&o| o.to_owned()).collect(),
                mount_type: None,
            }],
        };
        Ok(Spec::new(KIND, devices, common)?)
    }

    /// The account of `spec`, built from these devices.
    pub fn summary(&self, spec: &Spec) -> SpecSummary {
        SpecSummary {
            cdi_version: spec.version().to_string(),
            devices: spec.devices().iter().map(|d| d.name.clone()).collect(),
            device_numbers: self.numbers.to_string(),
            driver_volume: self.driver_volume.clone(),
            left_out: self.left_out.clone(),
        }
    }
}

/// The MIG capability nodes' directory under the device root.
const MIG_CAPS_DIR: &str = "nvidia-caps";

/// The devices of the MIG-mode GPU `parent` (whose node is `parent_node`): each healthy MIG
/// device with capability nodes, with the parent's node and its two capability nodes under
/// `caps_dir`.
fn mig_devices(
    inventory: &Inventory,
    parent: u32,
    parent_node: &NodeEntry,
    caps_dir: &Path,
) -> Vec<CdiDevice> {
    let cap = |dev: DevNum| {
        let name = format!("nvidia-cap{}", dev.minor);
        NodeEntry {
            path: Path::new("/dev").join(MIG_CAPS_DIR).join(&name),
            host_path: caps_dir.join(&name),
            dev: Some(dev),
        }
    };
    inventory
        .mig
        .of_parent(parent)
        .filter(|d| d.healthy)
        .filter_map(|d| {
            let caps = d.caps.as_ref()?;
            Some(CdiDevice {
                id: DeviceId::Mig {
                    gpu: parent,
                    mig: d.index,
                },
                uuid: d.uuid.clone(),
                nodes: vec![
                    parent_node.clone(),
                    cap(caps.gpu_instance),
                    cap(caps.compute_instance),
                ],
            })
        })
        .collect()
}

type ControlAndGpus = (Vec<NodeEntry>, Vec<(u32, NodeEntry)>);

/// Nodes and numbers from `stat(2)` under `dev_root`.
fn scanned(dev_root: &Path, inventory: &Inventory) -> Result<ControlAndGpus, CdiError> {
    let found = DeviceNodes::scan(dev_root, inventory).map_err(|source| CdiError::DeviceNodes {
        dev_root: dev_root.to_owned(),
        source,
    })?;
    let entry = |node: &mesos_gpu_node::devices::DeviceNode| {
        let name = node
            .path
            .strip_prefix(dev_root)
            .unwrap_or(&node.path)
            .to_owned();
        NodeEntry {
            path: Path::new("/dev").join(name),
            host_path: node.path.clone(),
            dev: Some(node.dev),
        }
    };
    let control = found.control.iter().map(entry).collect();
    let gpus = found
        .gpus
        .iter()
        .map(|g| (g.index, entry(&g.node)))
        .collect();
    Ok((control, gpus))
}

/// Nodes at `/dev` with the numbers the NVIDIA driver gives them (see the module docs).
fn computed(healthy: &[&mesos_gpu_node::inventory::Gpu]) -> Result<ControlAndGpus, CdiError> {
    let dev = Path::new("/dev");
    let control = vec![
        NodeEntry::under(
            dev,
            NVIDIACTL,
            Some(DevNum {
                major: NVIDIA_GPU_MAJOR,
                minor: NVIDIACTL_MINOR,
            }),
        ),
        NodeEntry::under(dev, NVIDIA_UVM, None),
    ];
    let mut gpus = Vec::with_capacity(healthy.len());
    for gpu in healthy {
        if gpu.minor == UNKNOWN_MINOR {
            return Err(CdiError::UnknownMinor { index: gpu.index });
        }
        let number = DevNum {
            major: NVIDIA_GPU_MAJOR,
            minor: gpu.minor,
        };
        gpus.push((
            gpu.index,
            NodeEntry::under(dev, &format!("nvidia{}", gpu.minor), Some(number)),
        ));
    }
    Ok((control, gpus))
}

fn nodes(entries: &[NodeEntry]) -> Result<Vec<DeviceNode>, CdiError> {
    entries.iter().map(NodeEntry::to_spec).collect()
}

fn utf8(path: &Path) -> Result<&str, CdiError> {
    path.to_str().ok_or_else(|| CdiError::NonUtf8Path {
        path: path.to_owned(),
    })
}
