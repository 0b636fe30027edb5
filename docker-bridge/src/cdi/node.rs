//! From the node's GPUs to the CDI spec of kind `nvidia.com/gpu`: the rendering of one
//! [`Grant`] per device.
//!
//! The spec decides no device node of its own. Each of its devices is the grant of that device
//! alone, as `Grant::new` makes it for a container holding only that device, rendered by
//! [`grant_edits`] (of which [`container_edits`], the renderer of any grant, is made too): the
//! grant's control nodes go to the common edits (every grant of the node has the same; the spec
//! is refused if two differ), the rest to the device.
//!
//! What the spec holds, and why (`docs/reference/cdi.md` §5,
//! `mesos-gpu-isolator.md` §1.1):
//! - one device per GPU under two names, its NVML index (`"0"`) and its UUID (`GPU-…`), as
//!   `nvidia-ctk cdi generate` names them by default, plus `all` (every device's nodes). Each
//!   has the GPU's node `/dev/nvidia<minor>` (the minor comes from NVML, it is not the index)
//!   and nothing else, as NVIDIA's devices: the grant's `NVIDIA_VISIBLE_DEVICES` and
//!   `CUDA_VISIBLE_DEVICES` are left out, so several devices requested together never
//!   overwrite each other's;
//! - the common edits, applied when any device is requested: the control nodes `nvidiactl`,
//!   `nvidia-uvm` and, when the host has it, `nvidia-uvm-tools`; the driver volume
//!   `<volume root>/nvidia_<driver version>` bind-mounted read-only at `/usr/local/nvidia`;
//!   `PATH`/`LD_LIBRARY_PATH` as the Docker path computes them for an image that sets neither
//!   ([`mesos_gpu_volume::container_env`]; CDI has no "append": these values replace the
//!   image's own); and `NVIDIA_VISIBLE_DEVICES=void`, as NVIDIA's generator writes it
//!   (`pkg/nvcdi/wrapper.go` `GetCommonEdits`): the container's GPUs are CDI's alone, and
//!   NVIDIA's legacy runtime hook, where it is still configured, injects none (`void`) instead
//!   of the GPUs an image's `NVIDIA_VISIBLE_DEVICES` would name. The driver volume and the
//!   variables are the node's, not a grant's. `cli/tests/cdi_nvidia_ctk.rs` compares the whole
//!   spec with what `nvidia-ctk` writes for the same node, and the operator guide lists each
//!   difference (NVIDIA mounts each driver file and runs `nvidia-cdi-hook`s; we mount the
//!   driver volume);
//! - device numbers come from `stat(2)` of the real nodes under the device root
//!   ([`DeviceNumbers::Scanned`], [`DeviceNodes::scan`]), or, on a simulated node without device
//!   nodes, are computed ([`DeviceNumbers::Computed`], [`DeviceNodes::named`] at `/dev`):
//!   `195:<minor>` for GPUs and `195:255` for `nvidiactl`, fixed by the NVIDIA driver.
//!   `nvidia-uvm`'s major is assigned when its module loads, so a computed spec gives it no
//!   number and the runtime `stat`s `/dev/nvidia-uvm` when a container starts; the optional
//!   `nvidia-uvm-tools` is left out of a computed spec ([`DeviceNumbers::left_out`]);
//! - GPUs the inventory marks unhealthy are left out, as from the allocator's pool;
//! - a GPU in MIG mode is never a device whole: CUDA would see only its MIG devices. Each of its
//!   MIG devices is one, named as `nvidia-ctk cdi generate` names them (`pkg/nvcdi/namer.go`):
//!   `<gpu index>:<MIG device index>` ([`DeviceId::Mig`], the sparse NVML MIG index) and its
//!   `MIG-<uuid>`, with its parent's `/dev/nvidia<minor>` and its two
//!   `/dev/nvidia-caps/nvidia-cap<N>` access nodes (GPU instance, compute instance; their
//!   numbers from the driver's `/proc` files, as the inventory holds them), and no environment
//!   either. A MIG device without capability nodes, or unhealthy, is left out, as from the
//!   allocator's pool.

use std::fmt;
use std::path::{Path, PathBuf};

use mesos_gpu_grant::env::{CUDA_VISIBLE_DEVICES, NVIDIA_VISIBLE_DEVICES};
use mesos_gpu_grant::{Grant, GrantError, MigAccess, MountKind, NodeKind};
use mesos_gpu_node::devices::{DeviceNodes, DevicesError, NVIDIA_UVM_TOOLS};
use mesos_gpu_node::discovery::UNKNOWN_MINOR;
use mesos_gpu_node::inventory::Inventory;
use mesos_gpu_volume::version::VersionError;
use mesos_gpu_volume::{DriverVersion, VolumeManager};
use serde::Serialize;

use super::spec::{ContainerEdits, Device, DeviceNode, Mount, Spec, SpecError};
use crate::args::{DRIVER_VOLUME_TARGET, DeviceMapping, VISIBLE_DEVICES_ENV};

/// The spec's kind: vendor `nvidia.com`, class `gpu`, as NVIDIA's own specs.
pub const KIND: &str = "nvidia.com/gpu";
/// The device holding every GPU.
pub const ALL: &str = "all";
/// The value of `NVIDIA_VISIBLE_DEVICES` in the common edits, as NVIDIA's generator writes it:
/// NVIDIA's runtime hook then injects no GPU of its own into a container that got its devices
/// through CDI.
pub const VISIBLE_DEVICES_VOID: &str = "void";
/// Options of the driver volume's mount: read-only, no set-uid, no device files.
const VOLUME_MOUNT_OPTIONS: [&str; 4] = ["ro", "nosuid", "nodev", "bind"];
/// The device root of a computed spec.
const DEV: &str = "/dev";
/// The `/proc` of a MIG device's `access` files (which no CDI edit mounts, see
/// [`container_edits`]).
const PROC: &str = "/proc";

/// A grant rendered as CDI container edits, in the parts a spec places apart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GrantEdits {
    /// The control nodes (`nvidiactl`, `nvidia-uvm`, `nvidia-uvm-tools`): the same in every
    /// grant of a node, so a spec's common edits.
    pub control: Vec<DeviceNode>,
    /// `NVIDIA_VISIBLE_DEVICES` and `CUDA_VISIBLE_DEVICES` naming the grant's devices, which a
    /// spec's device does not carry (several devices requested together would overwrite each
    /// other's).
    pub visible: Vec<String>,
    /// The rest: the grant's GPU and MIG capability nodes, its other variables (a share's) and
    /// its mounts.
    pub device: ContainerEdits,
}

/// The CDI rendering of a [`Grant`], split as a spec places it ([`GrantEdits`]): its device
/// nodes, variables and mounts, the same as the Mesos and Docker renderers' (an MPS share's pipe
/// directory and `/dev/shm` as bind mounts). A MIG device's `/proc` `access` files are not
/// mounted (runc refuses mounts inside `/proc`; see [`MountKind::MigAccessFile`]), and a grant
/// with a cpuset is refused: CDI edits cannot set one. A device number of major 0
/// (`nvidia-uvm` named but not read, on a simulated node) is left for the runtime to `stat`.
pub fn grant_edits(grant: &Grant) -> Result<GrantEdits, CdiError> {
    if let Some(pinning) = grant.cpuset() {
        return Err(CdiError::Cpuset {
            cpus: pinning.cpus.to_string(),
        });
    }
    grant.check_nodes().map_err(|source| CdiError::Grant {
        device: grant.uuids().join(","),
        source,
    })?;
    let mut control = Vec::new();
    let mut device = ContainerEdits::default();
    for granted in grant.devices() {
        // Major 0: a number the grant could not read, left for the runtime to `stat`.
        let known = granted.dev.major != 0;
        let node = DeviceNode {
            host_path: (granted.host != granted.container)
                .then(|| utf8(&granted.host).map(str::to_owned))
                .transpose()?,
            path: utf8(&granted.container)?.to_owned(),
            node_type: known.then(|| "c".to_owned()),
            major: known.then(|| i64::from(granted.dev.major)),
            minor: known.then(|| i64::from(granted.dev.minor)),
            permissions: Some(DeviceMapping::PERMISSIONS.to_owned()),
        };
        match granted.kind {
            NodeKind::Control => control.push(node),
            NodeKind::Gpu | NodeKind::MigCapability => device.device_nodes.push(node),
        }
    }
    let mut visible = Vec::new();
    for (key, value) in grant.env() {
        let var = format!("{key}={value}");
        if key == NVIDIA_VISIBLE_DEVICES || key == CUDA_VISIBLE_DEVICES {
            visible.push(var);
        } else {
            device.env.push(var);
        }
    }
    for mount in grant.mounts() {
        if mount.kind == MountKind::MigAccessFile {
            continue;
        }
        let access = if mount.read_only { "ro" } else { "rw" };
        device.mounts.push(Mount {
            host_path: utf8(&mount.source)?.to_owned(),
            container_path: utf8(&mount.target)?.to_owned(),
            options: [access, "nosuid", "nodev", "bind"]
                .map(str::to_owned)
                .to_vec(),
            mount_type: None,
        });
    }
    Ok(GrantEdits {
        control,
        visible,
        device,
    })
}

/// The CDI renderer of a [`Grant`]: the container edits a runtime applies to give a container
/// what the grant holds, [`grant_edits`] whole (control nodes first, the variables naming the
/// devices first).
pub fn container_edits(grant: &Grant) -> Result<ContainerEdits, CdiError> {
    let GrantEdits {
        mut control,
        mut visible,
        device,
    } = grant_edits(grant)?;
    control.extend(device.device_nodes);
    visible.extend(device.env);
    Ok(ContainerEdits {
        env: visible,
        device_nodes: control,
        mounts: device.mounts,
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
    /// The grant of one device alone cannot be made.
    #[error("cannot grant device {device} alone")]
    Grant {
        /// The device's UUID.
        device: String,
        /// Why.
        #[source]
        source: GrantError,
    },
    /// Two devices' grants have different control nodes, which the spec's common edits hold
    /// once.
    #[error(
        "device {device} is granted other control nodes than device {first}; the spec's common \
         edits hold one set"
    )]
    ControlNodes {
        /// The first device's UUID.
        first: String,
        /// The device whose grant differs.
        device: String,
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

impl DeviceNumbers {
    /// The device root the spec's host paths are under.
    pub fn dev_root(&self) -> &Path {
        match self {
            DeviceNumbers::Scanned { dev_root } => dev_root,
            DeviceNumbers::Computed => Path::new(DEV),
        }
    }

    /// The nodes a host may have that a spec with these numbers leaves out: `nvidia-uvm-tools`
    /// when computed (optional, and with no number to compute); none when scanned.
    pub fn left_out(&self) -> Vec<PathBuf> {
        match self {
            DeviceNumbers::Scanned { .. } => Vec::new(),
            DeviceNumbers::Computed => vec![Path::new(DEV).join(NVIDIA_UVM_TOOLS)],
        }
    }

    /// The device nodes of `inventory`'s healthy GPUs and the control nodes, read or computed.
    fn nodes(&self, inventory: &Inventory) -> Result<DeviceNodes, CdiError> {
        match self {
            DeviceNumbers::Scanned { dev_root } => {
                DeviceNodes::scan(dev_root, inventory).map_err(|source| CdiError::DeviceNodes {
                    dev_root: dev_root.clone(),
                    source,
                })
            }
            DeviceNumbers::Computed => Ok(DeviceNodes::named(Path::new(DEV), inventory)),
        }
    }
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

/// One device of the spec before naming: what it is and the grant of it alone.
#[derive(Debug, Clone, PartialEq)]
pub struct CdiDevice {
    /// Its index name.
    pub id: DeviceId,
    /// Its UUID (`GPU-…`, `MIG-…`), also a name.
    pub uuid: String,
    /// What a container holding only this device gets; the spec renders it.
    pub grant: Grant,
}

/// Everything the node contributes to its spec.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeDevices {
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
#[derive(Debug, Clone, PartialEq)]
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
    /// driver volume's place under `volumes`, and grants each device alone.
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
        let nodes = numbers.nodes(inventory)?;
        let mut devices = Vec::new();
        for gpu in healthy {
            if gpu.minor == UNKNOWN_MINOR {
                return Err(CdiError::UnknownMinor { index: gpu.index });
            }
            let alone = |gpus, mig, uuid: &str| {
                Grant::new(&nodes, &[], gpus, mig, None).map_err(|source| CdiError::Grant {
                    device: uuid.to_owned(),
                    source,
                })
            };
            if !inventory.mig.is_enabled(gpu.index) {
                devices.push(CdiDevice {
                    id: DeviceId::Gpu { index: gpu.index },
                    uuid: gpu.uuid.clone(),
                    grant: alone(vec![gpu.clone()], Vec::new(), &gpu.uuid)?,
                });
                continue;
            }
            for mig in inventory.mig.of_parent(gpu.index).filter(|d| d.healthy) {
                // `of` refuses only a MIG device without capability nodes, left out as from the
                // allocator's pool.
                let Ok(access) = MigAccess::of(mig, numbers.dev_root(), Path::new(PROC)) else {
                    continue;
                };
                let grant = alone(Vec::new(), vec![access], &mig.uuid)?;
                // The parent's node is found by number among the scanned or named GPU nodes.
                if !grant.devices().iter().any(|d| d.kind == NodeKind::Gpu) {
                    return Err(CdiError::Grant {
                        device: mig.uuid.clone(),
                        source: GrantError::MissingNode { index: gpu.index },
                    });
                }
                devices.push(CdiDevice {
                    id: DeviceId::Mig {
                        gpu: gpu.index,
                        mig: mig.index,
                    },
                    uuid: mig.uuid.clone(),
                    grant,
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
            devices,
            driver_volume: volumes.volume_path(&version),
            numbers: numbers.clone(),
            left_out,
        }))
    }

    /// The spec: each device by index and by UUID, then `all`, and the common edits; each
    /// device's edits and the common control nodes are its grant's ([`grant_edits`]).
    pub fn spec(&self) -> Result<Spec, CdiError> {
        let mut devices = Vec::with_capacity(self.devices.len() * 2 + 1);
        let mut control: Option<(&str, Vec<DeviceNode>)> = None;
        let mut every = ContainerEdits::default();
        for device in &self.devices {
            let edits = grant_edits(&device.grant)?;
            match &control {
                None => control = Some((&device.uuid, edits.control)),
                Some((_, first)) if *first == edits.control => {}
                Some((first, _)) => {
                    return Err(CdiError::ControlNodes {
                        first: (*first).to_owned(),
                        device: device.uuid.clone(),
                    });
                }
            }
            for node in &edits.device.device_nodes {
                if !every.device_nodes.iter().any(|n| n.path == node.path) {
                    every.device_nodes.push(node.clone());
                }
            }
            for var in &edits.device.env {
                if !every.env.contains(var) {
                    every.env.push(var.clone());
                }
            }
            for name in [device.id.to_string(), device.uuid.clone()] {
                devices.push(Device {
                    name,
                    container_edits: edits.device.clone(),
                });
            }
        }
        devices.push(Device {
            name: ALL.to_owned(),
            container_edits: every,
        });
        let no_image_env: [&str; 0] = [];
        let mut env: Vec<String> = mesos_gpu_volume::container_env(&no_image_env)
            .into_iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        env.push(format!("{VISIBLE_DEVICES_ENV}={VISIBLE_DEVICES_VOID}"));
        let common = ContainerEdits {
            env,
            device_nodes: control.map(|(_, nodes)| nodes).unwrap_or_default(),
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

fn utf8(path: &Path) -> Result<&str, CdiError> {
    path.to_str().ok_or_else(|| CdiError::NonUtf8Path {
        path: path.to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use mesos_gpu_node::{inventory::DriverInfo, inventory::Gpu};

    fn devices(gpus: u32) -> NodeDevices {
        let inventory = Inventory {
            driver: Some(DriverInfo {
                version: "550.54.14".to_owned(),
                cuda_version: Some((12, 4)),
            }),
            gpus: (0..gpus)
                .map(|index| Gpu {
                    index,
                    minor: index + 4,
                    uuid: format!("GPU-{index}"),
                    name: "Tesla T4".to_owned(),
                    memory_total: 16 << 30,
                    pci_bus_id: String::new(),
                    numa_node: None,
                    compute_capability: Some((7, 5)),
                    healthy: true,
                })
                .collect(),
            ..Inventory::default()
        };
        let gathered = NodeDevices::gather(
            &inventory,
            &DeviceNumbers::Computed,
            &VolumeManager::at("/volumes"),
        );
        match gathered {
            Ok(Gathered::Devices(devices)) => devices,
            other => panic!("{other:?}"),
        }
    }

    /// The spec's common nodes are its grants' control nodes; `nvidia-uvm`, computed with no
    /// number, is left for the runtime to `stat`.
    #[test]
    fn common_nodes_are_the_grants_control_nodes() {
        let devices = devices(2);
        let spec = devices.spec().expect("spec");
        let paths: Vec<&str> = spec
            .common_edits()
            .device_nodes
            .iter()
            .map(|n| n.path.as_str())
            .collect();
        assert_eq!(paths, ["/dev/nvidiactl", "/dev/nvidia-uvm"]);
        let uvm = &spec.common_edits().device_nodes[1];
        assert_eq!((uvm.node_type.as_deref(), uvm.major), (None, None));
        let gpu1 = &spec.devices()[2];
        assert_eq!(gpu1.name, "1");
        assert_eq!(gpu1.container_edits.device_nodes[0].path, "/dev/nvidia5");
        assert_eq!(gpu1.container_edits.device_nodes[0].minor, Some(5));
        assert!(gpu1.container_edits.env.is_empty());
    }

    /// A spec whose grants disagree on the control nodes is refused, not written with one
    /// device's.
    #[test]
    fn grants_with_other_control_nodes_are_refused() {
        use mesos_gpu_node::devices::{DeviceNode as Node, GpuNode};
        let mut devices = devices(2);
        let grant = &devices.devices[1].grant;
        let node = |d: &mesos_gpu_grant::GrantedDevice| Node {
            path: d.host.clone(),
            dev: d.dev,
        };
        // GPU 1's grant made where the node has no nvidia-uvm.
        let nodes = DeviceNodes {
            control: grant
                .devices()
                .iter()
                .filter(|d| d.kind == NodeKind::Control)
                .filter(|d| !d.container.ends_with(mesos_gpu_node::devices::NVIDIA_UVM))
                .map(node)
                .collect(),
            gpus: grant
                .devices()
                .iter()
                .filter(|d| d.kind == NodeKind::Gpu)
                .map(|d| GpuNode {
                    index: 1,
                    node: node(d),
                })
                .collect(),
        };
        devices.devices[1].grant =
            Grant::new(&nodes, &[], grant.gpus().to_vec(), vec![], None).expect("grant");
        let err = devices.spec().expect_err("differing control nodes");
        assert!(
            matches!(&err, CdiError::ControlNodes { first, device } if first == "GPU-0" && device == "GPU-1"),
            "{err:?}"
        );
    }

    /// The whole rendering is the split one put back together: control nodes, then the
    /// device's; the variables naming the devices, then the rest.
    #[test]
    fn container_edits_is_grant_edits_whole() {
        let devices = devices(1);
        let grant = &devices.devices[0].grant;
        let split = grant_edits(grant).expect("split");
        let whole = container_edits(grant).expect("whole");
        assert_eq!(whole.device_nodes.len(), 3);
        assert_eq!(whole.device_nodes[..2], split.control[..]);
        assert_eq!(whole.device_nodes[2..], split.device.device_nodes[..]);
        assert_eq!(
            whole.env,
            [
                "NVIDIA_VISIBLE_DEVICES=GPU-0".to_owned(),
                "CUDA_VISIBLE_DEVICES=GPU-0".to_owned()
            ]
        );
        assert_eq!(split.visible, whole.env);
        assert!(split.device.env.is_empty());
    }
}
