//! [`Grant`]: what one container gets, built once from what placement and the pool decided.
//!
//! Every path that starts a container renders this one value: the Mesos module's
//! `ContainerLaunchInfo` (`mesos_gpu_isolator::lifecycle::launch_info`, then the ffi's protobuf),
//! `docker run` arguments and bollard's `HostConfig` (`mesos_gpu_docker::args::LaunchPlan`, used by
//! `docker-args`, the agent's Docker hook, `docker-wrapper`, `run`, `serve`'s REST `/docker/cli`
//! and the demo) and CDI container edits (`mesos_gpu_docker::cdi::container_edits`). A renderer
//! that cannot carry a part refuses the grant with the reason; none drops a part silently.
//!
//! Facts relied on (`docs/reference/mesos-gpu-isolator.md` §1.3, §5.1, §6.4; `mig.md` §2, §3;
//! `mps.md` §1):
//! - a container holding any device gets the control nodes (`nvidiactl`, `nvidia-uvm`, and
//!   `nvidia-uvm-tools` when the host has it) `rwm`, and `c 195:<minor> rw` per GPU;
//! - a MIG device needs its parent's `/dev/nvidia<minor>` and the `access` capability nodes of
//!   its GPU instance and compute instance (`/dev/nvidia-caps/nvidia-cap<N>`), `rw`; NVIDIA's
//!   container toolkit also bind-mounts the two `/proc/driver/nvidia/capabilities/…/access`
//!   files read-only;
//! - `NVIDIA_VISIBLE_DEVICES` and `CUDA_VISIBLE_DEVICES` name the devices by UUID (`GPU-…`,
//!   `MIG-…`): device nodes keep their host minors in the container, so a host index would name
//!   the wrong GPU. With no device they are `none` and empty, overriding an image's `all`;
//! - a CUDA process enumerates a single MIG device (NVIDIA's MIG user guide, "CUDA Device
//!   Enumeration"; `docs/reference/mig.md`). A grant never holds MIG devices and GPUs not in MIG
//!   mode together: a process could not use both, so such a request is refused with the reason
//!   ([`GrantError::MigWithGpus`]) instead of rendering devices CUDA would not enumerate;
//! - a share of a GPU under MPS needs the daemon's pipe directory (same path) and its shared
//!   memory, the host's `/dev/shm`, besides its variables;
//! - a share of a MIG device (under MPS, one daemon per MIG device: `docs/reference/mig.md` §5)
//!   holds the device as a whole owner does (parent and capability nodes, its `MIG-…` UUID in
//!   the variables) and adds the share's variables and its daemon's pipe directory.

use std::path::{Path, PathBuf};

use mesos_gpu_node::devices::DeviceNodes;
use mesos_gpu_node::discovery::UNKNOWN_MINOR;
use mesos_gpu_node::inventory::{DevNum, Gpu, NVIDIA_GPU_MAJOR};
use mesos_gpu_node::rules::{Access, DeviceRule, normalize};
use mesos_gpu_placement::numa::Pinning;
use mesos_gpu_placement::sharing::PlacedShare;

use crate::env;
use crate::mig::MigAccess;

/// Where MPS clients find the daemon's shared memory.
pub const SHM: &str = "/dev/shm";

/// Why no grant can be made of what was allocated.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GrantError {
    /// NVML could not say which `/dev/nvidia<minor>` node the GPU is.
    #[error(
        "GPU {index} has no known device minor (NVML could not read it); it cannot be given to a container"
    )]
    UnknownMinor {
        /// NVML index of the GPU.
        index: u32,
    },
    /// A GPU of the grant has no device node on this host, for a renderer that passes or mounts
    /// nodes ([`Grant::check_nodes`]).
    #[error(
        "GPU {index} has no device node under the device root (was it healthy at start?); it cannot be given to a container"
    )]
    MissingNode {
        /// NVML index of the GPU.
        index: u32,
    },
    /// Two GPUs of the grant have the same minor number.
    #[error("GPU minor {minor} appears twice in the allocation")]
    DuplicateMinor {
        /// The repeated minor.
        minor: u32,
    },
    /// MIG devices and whole GPUs together: CUDA cannot use both in one process.
    #[error(
        "a container cannot hold MIG devices ({mig}) and whole GPUs ({gpus}) together: a CUDA \
         process enumerates a single MIG device and no GPU beside it (NVIDIA's MIG user guide, \
         \"CUDA Device Enumeration\"); ask for MIG devices or for GPUs, never both"
    )]
    MigWithGpus {
        /// The MIG devices, comma-separated.
        mig: String,
        /// The GPUs, comma-separated.
        gpus: String,
    },
}

/// What a granted device node is for, for renderers that treat them differently (not the
/// kernel's device type, which is `mesos_gpu_node::rules::DeviceKind`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeKind {
    /// `nvidiactl`, `nvidia-uvm`, `nvidia-uvm-tools`.
    Control,
    /// A GPU's `/dev/nvidia<minor>` (a whole GPU, a share's GPU, or a MIG device's parent).
    Gpu,
    /// A MIG capability node, `/dev/nvidia-caps/nvidia-cap<N>`.
    MigCapability,
}

/// One device node the container gets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GrantedDevice {
    /// The node on the host.
    pub host: PathBuf,
    /// Where it appears in the container (`/dev/nvidia0`, `/dev/nvidia-caps/nvidia-cap12`).
    pub container: PathBuf,
    /// Its device number.
    pub dev: DevNum,
    /// What it is.
    pub kind: NodeKind,
}

/// Why a bind mount is there: one vocabulary for the grant's own mounts ([`Grant::mounts`]:
/// `Mps`, `MigAccessFile`) and for the renderers that also mount device nodes and the driver
/// volume (the Mesos launch info).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MountKind {
    /// A device node (`/dev/nvidia*`, `/dev/nvidia-caps/*`), bound into a container's rootfs.
    Device,
    /// The driver volume at `/usr/local/nvidia`.
    DriverVolume,
    /// An MPS daemon's pipe directory, or its shared memory at `/dev/shm` (a GPU share).
    Mps,
    /// A MIG device's `access` capability file under `/proc/driver/nvidia/capabilities`.
    /// runc refuses any bind mount inside `/proc` ("cannot be mounted because it is inside
    /// /proc"), so Docker and CDI runtimes go without it; the capability nodes are what the
    /// driver checks (NVIDIA's runtime hook mounts these files from outside runc).
    MigAccessFile,
}

/// One bind mount the container gets, besides device nodes and the driver volume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GrantedMount {
    /// Host path.
    pub source: PathBuf,
    /// Absolute path in the container.
    pub target: PathBuf,
    /// Mounted read-only.
    pub read_only: bool,
    /// What is mounted.
    pub kind: MountKind,
}

/// A share of one GPU, with what its owner is launched with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShareAccess {
    /// The share as placed: GPU, k of R units, mode, limits.
    pub placed: PlacedShare,
    /// `MESOS_GPU_SHARE`, `MESOS_GPU_SHARING` and, under MPS, the client variables.
    pub env: Vec<(String, String)>,
    /// Under MPS: the daemon's pipe directory, bound at the same path.
    pub mps_pipe: Option<PathBuf>,
}

impl ShareAccess {
    /// The owner of `placed`: the share's variables and, with `mps_pipe` (the pipe directory of
    /// the GPU's MPS daemon, for an MPS share), the MPS client's ([`env::mps_client`]).
    pub fn new(placed: PlacedShare, mps_pipe: Option<PathBuf>) -> ShareAccess {
        let mut env = env::share(&placed);
        if let Some(pipe) = &mps_pipe {
            env.extend(env::mps_client(pipe, &placed.limits));
        }
        ShareAccess {
            placed,
            env,
            mps_pipe,
        }
    }
}

/// What one container gets: devices, device rules, variables, mounts and cpuset. Made only by
/// [`Grant::new`] (and [`Grant::pinned`]); every renderer reads it through its methods.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Grant {
    /// Whole GPUs and the GPU of a share, by NVML index.
    gpus: Vec<Gpu>,
    /// MIG devices, with what each needs.
    mig: Vec<MigAccess>,
    /// The share of one GPU (its GPU is in `gpus`) or of one MIG device (the device is in
    /// `mig`), when the request was served with one.
    share: Option<ShareAccess>,
    /// The CPUs and memory nodes it is pinned to (NUMA pinning), when it is.
    cpuset: Option<Pinning>,
    /// Its device nodes: control nodes, GPU nodes by minor, MIG capability nodes.
    devices: Vec<GrantedDevice>,
    /// GPUs of `gpus` (NVML indices) with no device node on this host: a renderer that mounts
    /// or passes nodes refuses the grant ([`Grant::check_nodes`]).
    missing: Vec<u32>,
    /// Its full device allow list (the base list included), normalized.
    rules: Vec<DeviceRule>,
}

impl Grant {
    /// The grant of `gpus` (whole, or a share's one GPU with `share`), and MIG devices `mig` (or
    /// a share's one MIG device),
    /// with the device nodes of `nodes` and the base allow list `base` (Mesos's default
    /// whitelist plus `--allowed_devices`).
    pub fn new(
        nodes: &DeviceNodes,
        base: &[DeviceRule],
        mut gpus: Vec<Gpu>,
        mig: Vec<MigAccess>,
        share: Option<ShareAccess>,
    ) -> Result<Grant, GrantError> {
        gpus.sort_by_key(|g| g.index);
        if let Some(g) = gpus.iter().find(|g| g.minor == UNKNOWN_MINOR) {
            return Err(GrantError::UnknownMinor { index: g.index });
        }
        let mut minors: Vec<u32> = gpus.iter().map(|g| g.minor).collect();
        minors.sort_unstable();
        if let Some(w) = minors.windows(2).find(|w| w[0] == w[1]) {
            return Err(GrantError::DuplicateMinor { minor: w[0] });
        }
        if !gpus.is_empty() && !mig.is_empty() {
            let join = |v: Vec<&str>| v.join(",");
            return Err(GrantError::MigWithGpus {
                mig: join(mig.iter().map(|m| m.uuid.as_str()).collect()),
                gpus: join(gpus.iter().map(|g| g.uuid.as_str()).collect()),
            });
        }
        let mut devices = Vec::new();
        let mut missing = Vec::new();
        if !gpus.is_empty() || !mig.is_empty() {
            for node in &nodes.control {
                devices.push(granted(&node.path, "dev", node.dev, NodeKind::Control));
            }
        }
        let mut by_minor: Vec<&Gpu> = gpus.iter().collect();
        by_minor.sort_by_key(|g| g.minor);
        for gpu in &by_minor {
            match nodes.gpu(gpu.index) {
                Some(node) => devices.push(granted(&node.path, "dev", node.dev, NodeKind::Gpu)),
                None => missing.push(gpu.index),
            }
        }
        for access in &mig {
            if let Some(parent) = nodes.gpus.iter().find(|g| g.node.dev == access.parent) {
                let node = granted(&parent.node.path, "dev", parent.node.dev, NodeKind::Gpu);
                if !devices.contains(&node) {
                    devices.push(node);
                }
            }
            for (path, dev) in access.cap_nodes.iter().zip(access.caps) {
                let node = granted(path, "dev/nvidia-caps", dev, NodeKind::MigCapability);
                if !devices.contains(&node) {
                    devices.push(node);
                }
            }
        }
        let rules = device_rules(nodes, base, &minors, &mig);
        Ok(Grant {
            gpus,
            mig,
            share,
            cpuset: None,
            devices,
            missing,
            rules,
        })
    }

    /// The same grant pinned to `cpuset` (NUMA pinning).
    pub fn pinned(mut self, cpuset: Option<Pinning>) -> Grant {
        self.cpuset = cpuset;
        self
    }

    /// Whole GPUs and the GPU of a share, by NVML index.
    pub fn gpus(&self) -> &[Gpu] {
        &self.gpus
    }

    /// MIG devices (held whole, or the one a share is of), with what each needs.
    pub fn mig(&self) -> &[MigAccess] {
        &self.mig
    }

    /// The share, when the request was served with one.
    pub fn share(&self) -> Option<&ShareAccess> {
        self.share.as_ref()
    }

    /// The CPUs and memory nodes it is pinned to, when it is.
    pub fn cpuset(&self) -> Option<&Pinning> {
        self.cpuset.as_ref()
    }

    /// Its device nodes: control nodes, GPU nodes by minor, MIG capability nodes.
    pub fn devices(&self) -> &[GrantedDevice] {
        &self.devices
    }

    /// Its full device allow list (the base list included), normalized.
    pub fn rules(&self) -> &[DeviceRule] {
        &self.rules
    }

    /// The GPUs whose NUMA affinity decides its pinning (NVML indices, ascending): its GPUs, a
    /// share's GPU and each MIG device's parent.
    pub fn local_gpus(&self) -> Vec<u32> {
        let mut gpus: Vec<u32> = self
            .gpus
            .iter()
            .map(|g| g.index)
            .chain(self.mig.iter().map(|m| m.parent_index))
            .collect();
        gpus.sort_unstable();
        gpus.dedup();
        gpus
    }

    /// True when the grant holds no device (the container asked for no GPU).
    pub fn is_empty(&self) -> bool {
        self.gpus.is_empty() && self.mig.is_empty()
    }

    /// The devices by UUID, as `NVIDIA_VISIBLE_DEVICES` and `CUDA_VISIBLE_DEVICES` name them:
    /// the GPUs by NVML index, then the MIG devices.
    pub fn uuids(&self) -> Vec<&str> {
        self.gpus
            .iter()
            .map(|g| g.uuid.as_str())
            .chain(self.mig.iter().map(|m| m.uuid.as_str()))
            .collect()
    }

    /// The container's variables: `NVIDIA_VISIBLE_DEVICES` (`none` with no device),
    /// `CUDA_VISIBLE_DEVICES`, then a share's.
    pub fn env(&self) -> Vec<(String, String)> {
        let mut env = env::visible(&self.uuids());
        if let Some(share) = &self.share {
            env.extend(share.env.iter().cloned());
        }
        env
    }

    /// The bind mounts besides device nodes: an MPS share's pipe directory and `/dev/shm`, and
    /// each MIG device's two `access` files (read-only).
    pub fn mounts(&self) -> Vec<GrantedMount> {
        let mut mounts = Vec::new();
        if let Some(pipe) = self.share.as_ref().and_then(|s| s.mps_pipe.as_ref()) {
            mounts.push(GrantedMount {
                source: pipe.clone(),
                target: pipe.clone(),
                read_only: false,
                kind: MountKind::Mps,
            });
            mounts.push(GrantedMount {
                source: PathBuf::from(SHM),
                target: PathBuf::from(SHM),
                read_only: false,
                kind: MountKind::Mps,
            });
        }
        for access in &self.mig {
            for (host, container) in &access.proc_files {
                mounts.push(GrantedMount {
                    source: host.clone(),
                    target: container.clone(),
                    read_only: true,
                    kind: MountKind::MigAccessFile,
                });
            }
        }
        mounts
    }

    /// Refuses a grant with a GPU without a device node ([`GrantError::MissingNode`]), for the
    /// renderers that pass or mount nodes: every one of them refuses with this one error.
    pub fn check_nodes(&self) -> Result<(), GrantError> {
        match self.missing.first() {
            Some(&index) => Err(GrantError::MissingNode { index }),
            None => Ok(()),
        }
    }

    /// The minors of the GPU nodes the grant allows (its GPUs and MIG parents).
    pub fn minors(&self) -> Vec<u32> {
        let mut minors: Vec<u32> = self
            .gpus
            .iter()
            .map(|g| g.minor)
            .chain(self.mig.iter().map(|m| m.parent.minor))
            .collect();
        minors.sort_unstable();
        minors.dedup();
        minors
    }
}

/// The full allow list of a container holding the GPUs with `minors` and the MIG devices `mig`:
/// `base`, and when it holds any device the control nodes `rwm`, `c 195:<minor> rw` per GPU and
/// each MIG device's parent and capability nodes `rw`; normalized.
pub fn device_rules(
    nodes: &DeviceNodes,
    base: &[DeviceRule],
    minors: &[u32],
    mig: &[MigAccess],
) -> Vec<DeviceRule> {
    let mut rules = base.to_vec();
    if !minors.is_empty() || !mig.is_empty() {
        rules.extend(
            nodes
                .control
                .iter()
                .map(|n| DeviceRule::char_device(n.dev, Access::RWM)),
        );
    }
    rules.extend(minors.iter().map(|&minor| {
        DeviceRule::char_device(
            DevNum {
                major: NVIDIA_GPU_MAJOR,
                minor,
            },
            Access::RW,
        )
    }));
    rules.extend(mig.iter().flat_map(MigAccess::rules));
    normalize(&rules)
}

/// A node at `host`, in the container at `/<dir>/<its name>`.
fn granted(host: &Path, dir: &str, dev: DevNum, kind: NodeKind) -> GrantedDevice {
    let name = host.file_name().unwrap_or(host.as_os_str());
    GrantedDevice {
        host: host.to_owned(),
        container: Path::new("/").join(dir).join(name),
        dev,
        kind,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a failed unwrap fails the test at its line
mod tests {
    use super::*;
    use mesos_gpu_node::devices::{DeviceNode, GpuNode};
    use mesos_gpu_node::rules::default_whitelist;

    pub(crate) fn gpu(index: u32) -> Gpu {
        Gpu {
            index,
            minor: index + 10,
            uuid: format!("GPU-{index}"),
            name: "T4".into(),
            memory_total: 1 << 30,
            pci_bus_id: String::new(),
            numa_node: None,
            compute_capability: None,
            healthy: true,
        }
    }

    pub(crate) fn nodes() -> DeviceNodes {
        let node = |name: &str, major, minor| DeviceNode {
            path: PathBuf::from("/d").join(name),
            dev: DevNum { major, minor },
        };
        DeviceNodes {
            control: vec![node("nvidiactl", 195, 255), node("nvidia-uvm", 510, 0)],
            gpus: (0..4)
                .map(|i| GpuNode {
                    index: i,
                    node: node(&format!("nvidia{}", i + 10), 195, i + 10),
                })
                .collect(),
        }
    }

    fn mig(uuid: &str, parent: u32, caps: [u32; 2]) -> MigAccess {
        MigAccess {
            uuid: uuid.into(),
            parent_index: parent - 10,
            parent: DevNum {
                major: 195,
                minor: parent,
            },
            caps: caps.map(|minor| DevNum { major: 237, minor }),
            cap_nodes: caps.map(|m| PathBuf::from(format!("/d/nvidia-caps/nvidia-cap{m}"))),
            proc_files: caps.map(|m| {
                (
                    PathBuf::from(format!("/p/driver/nvidia/capabilities/c{m}/access")),
                    PathBuf::from(format!("/proc/driver/nvidia/capabilities/c{m}/access")),
                )
            }),
        }
    }

    fn text(rules: &[DeviceRule]) -> Vec<String> {
        rules.iter().map(ToString::to_string).collect()
    }

    #[test]
    fn gpus_get_control_nodes_their_own_nodes_and_rules_only() {
        let grant = Grant::new(
            &nodes(),
            &default_whitelist(),
            vec![gpu(3), gpu(1)],
            vec![],
            None,
        )
        .unwrap();
        let paths: Vec<_> = grant.devices.iter().map(|d| d.container.clone()).collect();
        assert_eq!(
            paths,
            [
                "/dev/nvidiactl",
                "/dev/nvidia-uvm",
                "/dev/nvidia11",
                "/dev/nvidia13"
            ]
            .map(PathBuf::from)
        );
        let rules = text(&grant.rules);
        for want in ["c 195:255 rwm", "c 510:0 rwm", "c 195:11 rw", "c 195:13 rw"] {
            assert!(rules.iter().any(|r| r == want), "{want} missing: {rules:?}");
        }
        assert!(
            !rules
                .iter()
                .any(|r| r == "c 195:10 rw" || r == "c 195:12 rw")
        );
        assert_eq!(
            grant.env(),
            [
                ("NVIDIA_VISIBLE_DEVICES".into(), "GPU-1,GPU-3".into()),
                ("CUDA_VISIBLE_DEVICES".into(), "GPU-1,GPU-3".into())
            ]
        );
        assert_eq!(grant.minors(), [11, 13]);
        assert_eq!(grant.local_gpus(), [1, 3]);
    }

    #[test]
    fn no_device_gets_the_base_list_and_none() {
        let grant = Grant::new(&nodes(), &default_whitelist(), vec![], vec![], None).unwrap();
        assert!(grant.is_empty() && grant.devices.is_empty());
        assert_eq!(grant.rules, normalize(&default_whitelist()));
        assert_eq!(
            grant.env()[0],
            ("NVIDIA_VISIBLE_DEVICES".into(), "none".into())
        );
        assert_eq!(
            grant.env()[1],
            ("CUDA_VISIBLE_DEVICES".into(), String::new())
        );
    }

    #[test]
    fn mig_devices_get_their_parent_and_capability_nodes_and_access_files() {
        let a = mig("MIG-a", 11, [21, 22]);
        let b = mig("MIG-b", 11, [21, 23]);
        let grant = Grant::new(&nodes(), &[], vec![], vec![a, b], None).unwrap();
        let paths: Vec<String> = grant
            .devices
            .iter()
            .map(|d| d.container.display().to_string())
            .collect();
        assert_eq!(
            paths,
            [
                "/dev/nvidiactl",
                "/dev/nvidia-uvm",
                "/dev/nvidia11",
                "/dev/nvidia-caps/nvidia-cap21",
                "/dev/nvidia-caps/nvidia-cap22",
                "/dev/nvidia-caps/nvidia-cap23"
            ]
        );
        assert_eq!(grant.uuids(), ["MIG-a", "MIG-b"]);
        // Pinned by its parent's affinity: a MIG device has none of its own.
        assert_eq!(grant.local_gpus(), [1]);
        let files = grant
            .mounts()
            .into_iter()
            .filter(|m| m.kind == MountKind::MigAccessFile && m.read_only)
            .count();
        assert_eq!(files, 4);
        assert!(text(&grant.rules).iter().any(|r| r == "c 237:23 rw"));
    }

    #[test]
    fn mig_devices_and_whole_gpus_together_are_refused_with_the_reason() {
        let err = Grant::new(
            &nodes(),
            &[],
            vec![gpu(0)],
            vec![mig("MIG-a", 11, [21, 22])],
            None,
        )
        .unwrap_err();
        assert!(matches!(err, GrantError::MigWithGpus { .. }));
        let text = err.to_string();
        assert!(text.contains("MIG-a") && text.contains("GPU-0"), "{text}");
        assert!(text.contains("never both"), "{text}");
    }

    #[test]
    fn an_mps_share_gets_its_variables_pipe_directory_and_shared_memory() {
        let share = ShareAccess {
            placed: PlacedShare {
                uuid: "GPU-2".into(),
                index: 2,
                units: 1,
                replicas: 4,
                mode: mesos_gpu_placement::sharing::SharingMode::Mps,
                limits: mesos_gpu_placement::sharing::ShareLimits::of(1, 4, 1 << 30),
            },
            env: vec![("MESOS_GPU_SHARE".into(), "1/4".into())],
            mps_pipe: Some(PathBuf::from("/run/mps/GPU-2/pipe")),
        };
        let grant = Grant::new(&nodes(), &[], vec![gpu(2)], vec![], Some(share)).unwrap();
        assert_eq!(grant.env()[2], ("MESOS_GPU_SHARE".into(), "1/4".into()));
        let mounts: Vec<(String, String)> = grant
            .mounts()
            .iter()
            .map(|m| {
                (
                    m.source.display().to_string(),
                    m.target.display().to_string(),
                )
            })
            .collect();
        assert_eq!(
            mounts,
            [
                ("/run/mps/GPU-2/pipe".into(), "/run/mps/GPU-2/pipe".into()),
                ("/dev/shm".into(), "/dev/shm".into())
            ]
        );
    }

    #[test]
    fn a_gpu_without_a_node_is_recorded_and_an_unknown_minor_refused() {
        let mut far = gpu(7);
        far.minor = 77;
        let grant = Grant::new(&nodes(), &[], vec![far], vec![], None).unwrap();
        assert_eq!(
            grant.check_nodes(),
            Err(GrantError::MissingNode { index: 7 })
        );
        let mut unknown = gpu(1);
        unknown.minor = UNKNOWN_MINOR;
        assert_eq!(
            Grant::new(&nodes(), &[], vec![unknown], vec![], None).unwrap_err(),
            GrantError::UnknownMinor { index: 1 }
        );
    }
}
