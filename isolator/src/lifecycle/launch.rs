//! What a container is launched with: its device allow list, the bind mounts of its device nodes
//! and of the driver volume, and its environment. Pure functions of the allocation.
//!
//! Facts relied on (`docs/reference/mesos-gpu-isolator.md` §1.3, §5.1, §6.4, §6.5):
//! - every GPU container may use the control devices (`nvidiactl`, `nvidia-uvm`, and
//!   `nvidia-uvm-tools` when present) with `rwm`, plus `c 195:<minor>` per GPU (`rw`; mknod of
//!   any character device is already in the default whitelist's `c *:* m`);
//! - a container that asked for no GPU gets nothing beyond what isolation requires: no control
//!   devices (Mesos's `gpu/nvidia` grants them to every container, `isolators/gpu/isolator.cpp`
//!   428-439), no device mounts, and, without an image, no environment: Mesos's `gpu/nvidia`
//!   returns no launch info for a container without a rootfs (`isolator.cpp` 481-483);
//! - Mesos bind-mounts **every** `/dev/nvidia*` node into a container with a rootfs. We mount the
//!   control nodes and the allocated GPUs' nodes only, so an unallocated GPU is not even visible;
//! - the driver volume is mounted read-only at `/usr/local/nvidia` when the image asks for it
//!   (`mesos_gpu_volume::should_inject`), with `PATH` and `LD_LIBRARY_PATH` from
//!   `mesos_gpu_volume::container_env`, set in `task_environment` when the container has task
//!   info (command executor) and in `environment` otherwise, as Mesos does;
//! - a host-filesystem container (no rootfs) gets no mounts: it sees the host's `/dev`, and the
//!   device cgroup alone restricts it.
//!
//! `NVIDIA_VISIBLE_DEVICES` and `CUDA_VISIBLE_DEVICES` name the allocated GPUs by **UUID**. Inside
//! the container the device nodes keep their host minors and CUDA renumbers the GPUs it can
//! open from 0, so a host index would name the wrong GPU; a UUID means the same GPU everywhere,
//! and both nvidia-container-runtime and CUDA accept `GPU-…` UUIDs. A container with an image
//! and no GPU gets `none` and empty, overriding an image's `NVIDIA_VISIBLE_DEVICES=all`.

use std::path::{Path, PathBuf};

use mesos_gpu_volume::injection::{CONTAINER_PATH, VISIBLE_DEVICES_ENV};

use crate::cgroup::{Access, DeviceRule, normalize};
use crate::devices::DeviceNodes;
use crate::inventory::{DevNum, Gpu, NVIDIA_GPU_MAJOR};

/// The variable CUDA reads to choose its devices.
pub(crate) const CUDA_VISIBLE_DEVICES_ENV: &str = "CUDA_VISIBLE_DEVICES";

/// What the containerizer tells the isolator about a container being prepared.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PrepareConfig {
    /// The `gpus` scalar of the container's resources (a whole number from 0 to the GPUs offered).
    pub gpus: f64,
    /// The container's root filesystem on the host; `None` for a host-filesystem container.
    pub rootfs: Option<PathBuf>,
    /// The image's environment, `KEY=VALUE` (from the Docker manifest's `config.Env`).
    pub image_env: Vec<String>,
    /// The image's label keys (from the Docker manifest's `config.Labels`).
    pub image_labels: Vec<String>,
    /// True when the container has task info (command executor): env goes to `task_environment`.
    pub has_task_info: bool,
    /// The parent of a nested container; a nested container shares its parent's GPUs.
    pub parent: Option<crate::container_id::ContainerId>,
    /// Where Mesos puts a nested container's own cgroup, relative to the cgroups root:
    /// `<parent>/mesos/<child>` (`containerizer::paths::getCgroupPath`, `paths.cpp` 600-611).
    pub nested_cgroup: Option<PathBuf>,
    /// MIG devices asked for by kind (the `mig-<profile>` scalars of the mixed strategy).
    pub mig: std::collections::BTreeMap<crate::mig::MigKind, u32>,
    /// The capabilities the task runs with (CAP_SYS_ADMIN is refused with MIG devices).
    pub capabilities: Vec<String>,
    /// On a node sharing GPUs: any share, a share under one mode, or whole GPUs (the task's
    /// `MESOS_GPU_SHARE_MODE`).
    pub sharing: crate::sharing::Wanted,
}

/// Why a bind mount is there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MountKind {
    /// A device node (`/dev/nvidia*`).
    Device,
    /// The driver volume at `/usr/local/nvidia`.
    DriverVolume,
    /// An MPS daemon's pipe directory, or its shared memory at `/dev/shm` (a GPU share).
    Mps,
    /// A MIG device's `access` capability file under `/proc/driver/nvidia/capabilities`.
    MigAccessFile,
}

/// One bind mount into the container's rootfs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    /// Host path.
    pub source: PathBuf,
    /// Host path of the target inside the rootfs (`<rootfs>/dev/nvidia0`).
    pub target: PathBuf,
    /// Mounted read-only (`MS_RDONLY | MS_BIND | MS_REC` for the volume).
    pub read_only: bool,
    /// What is mounted.
    pub kind: MountKind,
}

/// What the container must be launched with (Mesos's `ContainerLaunchInfo`, plus the rules).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchInfo {
    /// The GPUs the container may use.
    pub gpus: Vec<Gpu>,
    /// Its full device allow list, base whitelist included, normalized.
    pub device_rules: Vec<DeviceRule>,
    /// Its cgroup directory: its own, or for a nested container without one its ancestor's.
    pub cgroup: Option<PathBuf>,
    /// Bind mounts into the rootfs (none for a host-filesystem container).
    pub mounts: Vec<Mount>,
    /// Environment for the executor (no task info).
    pub environment: Vec<(String, String)>,
    /// Environment for the task (task info present).
    pub task_environment: Vec<(String, String)>,
}

impl LaunchInfo {
    /// False when Mesos needs no launch info from us: no mount and no environment (a container
    /// without GPU and without an image).
    pub fn needs_launch_info(&self) -> bool {
        !(self.mounts.is_empty() && self.environment.is_empty() && self.task_environment.is_empty())
    }
}

/// The full allow list: `base`, and for a container holding GPUs the control nodes `rwm` and
/// `c 195:<minor> rw` per GPU.
pub(crate) fn allow_list(
    base: &[DeviceRule],
    nodes: &DeviceNodes,
    minors: impl IntoIterator<Item = u32>,
) -> Vec<DeviceRule> {
    let mut rules = base.to_vec();
    let mut minors = minors.into_iter().peekable();
    if minors.peek().is_some() {
        rules.extend(
            nodes
                .control
                .iter()
                .map(|n| DeviceRule::char_device(n.dev, Access::RWM)),
        );
    }
    rules.extend(minors.map(|minor| {
        DeviceRule::char_device(
            DevNum {
                major: NVIDIA_GPU_MAJOR,
                minor,
            },
            Access::RW,
        )
    }));
    normalize(&rules)
}

/// The GPUs `rules` allows, by minor: exact `c 195:<minor>` entries, as Mesos counts them on
/// recovery (`docs/reference/mesos-gpu-isolator.md` §1.2); a wildcard entry is not taken as a claim
/// on every GPU.
pub(crate) fn allowed_minors(rules: &[DeviceRule]) -> Vec<u32> {
    rules
        .iter()
        .filter(|r| r.major == Some(NVIDIA_GPU_MAJOR) && r.kind != crate::cgroup::DeviceKind::Block)
        .filter_map(|r| r.minor)
        .collect()
}

/// A GPU has no device node in the scanned set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct MissingNode {
    pub(crate) index: u32,
}

/// Builds the launch info of a container holding `gpus` with allow list `rules`.
pub(crate) fn launch_info(
    config: &PrepareConfig,
    gpus: &[Gpu],
    nodes: &DeviceNodes,
    driver_volume: Option<&Path>,
    rules: Vec<DeviceRule>,
    cgroup: Option<PathBuf>,
) -> Result<LaunchInfo, MissingNode> {
    let mut mounts = Vec::new();
    let mut env = if gpus.is_empty() && config.rootfs.is_none() {
        Vec::new()
    } else {
        visible_devices(gpus)
    };
    if let Some(rootfs) = &config.rootfs {
        let mut sources: Vec<&Path> = Vec::new();
        if !gpus.is_empty() {
            sources.extend(nodes.control.iter().map(|n| n.path.as_path()));
        }
        for gpu in gpus {
            let node = nodes
                .gpu(gpu.index)
                .ok_or(MissingNode { index: gpu.index })?;
            sources.push(&node.path);
        }
        for source in sources {
            let name = source.file_name().unwrap_or(source.as_os_str());
            mounts.push(Mount {
                source: source.to_owned(),
                target: rootfs.join("dev").join(name),
                read_only: false,
                kind: MountKind::Device,
            });
        }
        let labels = config.image_labels.iter().map(String::as_str);
        match driver_volume {
            Some(volume) if mesos_gpu_volume::should_inject(&config.image_env, labels) => {
                mounts.push(Mount {
                    source: volume.to_owned(),
                    target: rootfs.join(CONTAINER_PATH.trim_start_matches('/')),
                    read_only: true,
                    kind: MountKind::DriverVolume,
                });
                env.extend(mesos_gpu_volume::container_env(&config.image_env));
                tracing::debug!(volume = %volume.display(), "image asks for the driver volume");
            }
            Some(_) => tracing::debug!("image does not ask for the driver volume"),
            None => tracing::debug!("no driver volume on this node"),
        }
    }
    let (environment, task_environment) = if config.has_task_info {
        (Vec::new(), env)
    } else {
        (env, Vec::new())
    };
    Ok(LaunchInfo {
        gpus: gpus.to_vec(),
        device_rules: rules,
        cgroup,
        mounts,
        environment,
        task_environment,
    })
}

/// What [`Isolator::prepare`](super::Isolator::prepare) returns for container `id` once granted
/// `gpus`, built by the same allow-list and launch-info code but touching nothing: for dry runs
/// such as `mesos-gpu demo`. `base` is the configured base allow list ([`crate::cgroup::default_whitelist`]
/// plus `--allowed_devices`); `cgroup` is where the container's cgroup would be.
pub fn plan_launch(
    id: &crate::container_id::ContainerId,
    config: &PrepareConfig,
    base: &[DeviceRule],
    nodes: &DeviceNodes,
    gpus: &[Gpu],
    driver_volume: Option<&Path>,
    cgroup: Option<PathBuf>,
) -> Result<LaunchInfo, super::LifecycleError> {
    let rules = allow_list(base, nodes, gpus.iter().map(|g| g.minor));
    launch_info(config, gpus, nodes, driver_volume, rules, cgroup).map_err(|m| {
        super::LifecycleError::MissingNode {
            container: id.clone(),
            index: m.index,
        }
    })
}

/// `NVIDIA_VISIBLE_DEVICES` and `CUDA_VISIBLE_DEVICES` naming `gpus` by UUID.
fn visible_devices(gpus: &[Gpu]) -> Vec<(String, String)> {
    let uuids: Vec<&str> = gpus.iter().map(|g| g.uuid.as_str()).collect();
    let nvidia = if uuids.is_empty() {
        "none".to_owned()
    } else {
        uuids.join(",")
    };
    vec![
        (VISIBLE_DEVICES_ENV.to_owned(), nvidia),
        (CUDA_VISIBLE_DEVICES_ENV.to_owned(), uuids.join(",")),
    ]
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::cgroup::default_whitelist;
    use crate::devices::{DeviceNode, GpuNode};

    fn gpu(index: u32) -> Gpu {
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

    fn nodes() -> DeviceNodes {
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

    #[test]
    fn allow_list_has_base_control_and_gpus_only() {
        let rules = allow_list(&default_whitelist(), &nodes(), [11, 13]);
        let text: Vec<String> = rules.iter().map(ToString::to_string).collect();
        for want in [
            "c 195:255 rwm",
            "c 510:0 rwm",
            "c 195:11 rw",
            "c 195:13 rw",
            "c 1:3 rwm",
        ] {
            assert!(
                text.iter().any(|t| t == want),
                "{want} missing from {text:?}"
            );
        }
        assert!(
            !text
                .iter()
                .any(|t| t == "c 195:10 rw" || t == "c 195:12 rw")
        );
        let mut minors = allowed_minors(&rules);
        minors.sort_unstable();
        assert_eq!(minors, [11, 13, 255]);
    }

    #[test]
    fn rootfs_gets_only_allocated_nodes_and_volume_when_asked() {
        let config = PrepareConfig {
            gpus: 1.0,
            rootfs: Some("/r".into()),
            image_env: vec!["NVIDIA_VISIBLE_DEVICES=all".into(), "PATH=/bin".into()],
            has_task_info: true,
            ..Default::default()
        };
        let info = launch_info(
            &config,
            &[gpu(2)],
            &nodes(),
            Some(Path::new("/v/nvidia_1")),
            vec![],
            None,
        )
        .unwrap();
        let targets: Vec<_> = info
            .mounts
            .iter()
            .map(|m| m.target.display().to_string())
            .collect();
        assert_eq!(
            targets,
            [
                "/r/dev/nvidiactl",
                "/r/dev/nvidia-uvm",
                "/r/dev/nvidia12",
                "/r/usr/local/nvidia"
            ]
        );
        assert!(info.mounts[3].read_only && info.mounts[3].kind == MountKind::DriverVolume);
        assert!(info.environment.is_empty());
        let env = |k: &str| {
            info.task_environment
                .iter()
                .find(|(key, _)| key == k)
                .map(|(_, v)| v.clone())
        };
        assert_eq!(env("NVIDIA_VISIBLE_DEVICES").as_deref(), Some("GPU-2"));
        assert_eq!(env("CUDA_VISIBLE_DEVICES").as_deref(), Some("GPU-2"));
        assert_eq!(env("PATH").as_deref(), Some("/bin:/usr/local/nvidia/bin"));

        let plain = PrepareConfig {
            rootfs: Some("/r".into()),
            ..Default::default()
        };
        let info = launch_info(&plain, &[], &nodes(), Some(Path::new("/v")), vec![], None).unwrap();
        assert!(
            info.mounts.is_empty(),
            "no GPU: no device node, no volume: {:?}",
            info.mounts
        );
        assert!(
            info.needs_launch_info(),
            "the image's variable is overridden"
        );
        assert_eq!(
            info.environment[0],
            ("NVIDIA_VISIBLE_DEVICES".into(), "none".into())
        );
        assert!(info.task_environment.is_empty());
    }

    #[test]
    fn host_filesystem_gets_no_mounts() {
        let config = PrepareConfig {
            image_labels: vec!["com.nvidia.volumes.needed".into()],
            ..Default::default()
        };
        let info = launch_info(
            &config,
            &[gpu(0), gpu(1)],
            &nodes(),
            Some(Path::new("/v")),
            vec![],
            None,
        )
        .unwrap();
        assert!(info.mounts.is_empty());
        assert_eq!(
            info.environment[1],
            ("CUDA_VISIBLE_DEVICES".into(), "GPU-0,GPU-1".into())
        );
    }

    #[test]
    fn no_gpu_no_image_gets_nothing() {
        let config = PrepareConfig {
            has_task_info: true,
            ..Default::default()
        };
        let rules = allow_list(&default_whitelist(), &nodes(), []);
        assert_eq!(rules, normalize(&default_whitelist()), "no control devices");
        let info = launch_info(&config, &[], &nodes(), Some(Path::new("/v")), rules, None).unwrap();
        assert!(info.mounts.is_empty());
        assert!(info.environment.is_empty() && info.task_environment.is_empty());
        assert!(!info.needs_launch_info());
    }

    #[test]
    fn gpu_without_node_is_refused() {
        let config = PrepareConfig {
            rootfs: Some("/r".into()),
            ..Default::default()
        };
        let err = launch_info(&config, &[gpu(7)], &nodes(), None, vec![], None).unwrap_err();
        assert_eq!(err, MissingNode { index: 7 });
    }
}
