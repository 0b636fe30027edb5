//! The Mesos renderer of a [`Grant`]: what a container is launched with, as Mesos's
//! `ContainerLaunchInfo` carries it (the ffi turns [`LaunchInfo`] into the protobuf): the bind
//! mounts of its device nodes, of the driver volume and of the grant's other mounts, and its
//! environment. A pure function of the grant.
//!
//! Facts relied on (`docs/reference/mesos-gpu-isolator.md` §1.3, §5.1, §6.4, §6.5; the device nodes,
//! rules and variables themselves are the grant's, see `mesos_gpu_grant`):
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
//! `NVIDIA_VISIBLE_DEVICES` and `CUDA_VISIBLE_DEVICES` name the granted devices by **UUID**
//! ([`Grant::env`]). A container with an image and no GPU gets `none` and empty, overriding an
//! image's `NVIDIA_VISIBLE_DEVICES=all`; one with neither GPU nor image gets no variable.

use std::path::{Path, PathBuf};

use mesos_gpu_enforce::cgroup::{DeviceKind, DeviceRule};
use mesos_gpu_enforce::pinning::PinOutcome;
use mesos_gpu_grant::{Grant, GrantError, MountKind};
use mesos_gpu_node::inventory::{Gpu, NVIDIA_GPU_MAJOR};
use mesos_gpu_os::container_id::ContainerId;
use mesos_gpu_volume::injection::CONTAINER_PATH;

/// What the containerizer tells the isolator about a container being prepared.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PrepareConfig {
    /// The `gpus` scalar of the container's resources (a whole number from 0 to the GPUs offered).
    pub gpus: f64,
    /// The `cpus` scalar of its resources: NUMA pinning never leaves it fewer CPUs (`None`: it
    /// asked for none).
    pub cpus: Option<f64>,
    /// The container's root filesystem on the host; `None` for a host-filesystem container.
    pub rootfs: Option<PathBuf>,
    /// The image's environment, `KEY=VALUE` (from the Docker manifest's `config.Env`).
    pub image_env: Vec<String>,
    /// The image's label keys (from the Docker manifest's `config.Labels`).
    pub image_labels: Vec<String>,
    /// True when the container has task info (command executor): env goes to `task_environment`.
    pub has_task_info: bool,
    /// The parent of a nested container; a nested container shares its parent's GPUs.
    pub parent: Option<mesos_gpu_os::container_id::ContainerId>,
    /// Where Mesos puts a nested container's own cgroup, relative to the cgroups root:
    /// `<parent>/mesos/<child>` (`containerizer::paths::getCgroupPath`, `paths.cpp` 600-611).
    pub nested_cgroup: Option<PathBuf>,
    /// MIG devices asked for by kind (the `mig-<profile>` scalars of the mixed strategy).
    pub mig: std::collections::BTreeMap<mesos_gpu_placement::mig::MigKind, u32>,
    /// The capabilities the task runs with (CAP_SYS_ADMIN is refused with MIG devices).
    pub capabilities: Vec<String>,
    /// On a node sharing GPUs: any share, a share under one mode, or whole GPUs (the task's
    /// `MESOS_GPU_SHARE_MODE`).
    pub sharing: mesos_gpu_placement::sharing::Wanted,
    /// Whose container it is (executor, framework, task), recorded with its pool owner and
    /// checkpoint; `None` when the containerizer did not say.
    pub holder: Option<mesos_gpu_pool::Holder>,
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
#[derive(Debug, Clone, PartialEq)]
pub struct LaunchInfo {
    /// The GPUs the container may use.
    pub gpus: Vec<Gpu>,
    /// The MIG devices it may use, by `MIG-…` UUID.
    pub mig: Vec<String>,
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
    /// What NUMA pinning did to the container's cpuset: narrowed it to the local CPUs and
    /// memory nodes of [`Grant::local_gpus`](mesos_gpu_grant::Grant::local_gpus), left it (and
    /// why), or nothing (pinning off).
    pub pinning: PinOutcome,
}

impl LaunchInfo {
    /// False when Mesos needs no launch info from us: no mount and no environment (a container
    /// without GPU and without an image).
    pub fn needs_launch_info(&self) -> bool {
        !(self.mounts.is_empty() && self.environment.is_empty() && self.task_environment.is_empty())
    }
}

/// The GPUs `rules` allows, by minor: exact `c 195:<minor>` entries, as Mesos counts them on
/// recovery (`docs/reference/mesos-gpu-isolator.md` §1.2); a wildcard entry is not taken as a claim
/// on every GPU.
pub(crate) fn allowed_minors(rules: &[DeviceRule]) -> Vec<u32> {
    rules
        .iter()
        .filter(|r| r.major == Some(NVIDIA_GPU_MAJOR) && r.kind != DeviceKind::Block)
        .filter_map(|r| r.minor)
        .collect()
}

/// Renders `grant` for a container prepared with `config`: the grant's device nodes, the driver
/// volume when the image asks for it and the grant's other mounts, bound into the rootfs (none
/// for a host-filesystem container); the grant's variables (and the volume's `PATH` and
/// `LD_LIBRARY_PATH`) in `task_environment` with task info, else in `environment`.
pub(crate) fn launch_info(
    grant: &Grant,
    config: &PrepareConfig,
    driver_volume: Option<&Path>,
    cgroup: Option<PathBuf>,
) -> Result<LaunchInfo, GrantError> {
    let mut mounts = Vec::new();
    let labels = config.image_labels.iter().map(String::as_str);
    let asks_for_driver =
        config.rootfs.is_some() && mesos_gpu_volume::should_inject(&config.image_env, labels);
    let mut env = if mesos_gpu_grant::env::told(!grant.is_empty(), asks_for_driver) {
        grant.env()
    } else {
        Vec::new()
    };
    if let Some(rootfs) = &config.rootfs {
        grant.check_nodes()?;
        let inside = |path: &Path| rootfs.join(path.strip_prefix("/").unwrap_or(path));
        for device in grant.devices() {
            mounts.push(Mount {
                source: device.host.clone(),
                target: inside(&device.container),
                read_only: false,
                kind: MountKind::Device,
            });
        }
        match driver_volume {
            Some(volume) if asks_for_driver => {
                mounts.push(Mount {
                    source: volume.to_owned(),
                    target: inside(Path::new(CONTAINER_PATH)),
                    read_only: true,
                    kind: MountKind::DriverVolume,
                });
                env.extend(mesos_gpu_volume::container_env(&config.image_env));
                tracing::debug!(volume = %volume.display(), "image asks for the driver volume");
            }
            Some(_) => tracing::debug!("image does not ask for the driver volume"),
            None => tracing::debug!("no driver volume on this node"),
        }
        for mount in grant.mounts() {
            mounts.push(Mount {
                target: inside(&mount.target),
                source: mount.source,
                read_only: mount.read_only,
                kind: mount.kind,
            });
        }
    }
    let (environment, task_environment) = if config.has_task_info {
        (Vec::new(), env)
    } else {
        (env, Vec::new())
    };
    Ok(LaunchInfo {
        gpus: grant.gpus().to_vec(),
        mig: grant.mig().iter().map(|m| m.uuid.clone()).collect(),
        device_rules: grant.rules().to_vec(),
        cgroup,
        mounts,
        environment,
        task_environment,
        pinning: PinOutcome::Off,
    })
}

/// What [`Isolator::prepare`](super::Isolator::prepare) returns for container `id` once granted
/// `gpus`, built by the same grant and renderer but touching nothing: for dry runs such as
/// `mesos-gpu demo`. `base` is the configured base allow list
/// ([`mesos_gpu_enforce::cgroup::default_whitelist`] plus `--allowed_devices`); `cgroup` is where
/// the container's cgroup would be.
pub fn mesos_launch_info(
    id: &ContainerId,
    config: &PrepareConfig,
    grant: &Grant,
    driver_volume: Option<&Path>,
    cgroup: Option<PathBuf>,
) -> Result<LaunchInfo, super::LifecycleError> {
    launch_info(grant, config, driver_volume, cgroup).map_err(|source| {
        super::LifecycleError::Grant {
            container: id.clone(),
            source,
        }
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use mesos_gpu_enforce::cgroup::{default_whitelist, normalize};
    use mesos_gpu_node::devices::{DeviceNode, DeviceNodes, GpuNode};
    use mesos_gpu_node::inventory::DevNum;

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

    fn grant(gpus: Vec<Gpu>) -> Grant {
        Grant::new(&nodes(), &default_whitelist(), gpus, vec![], None).unwrap()
    }

    #[test]
    fn allowed_minors_counts_exact_gpu_entries_only() {
        let rules = grant(vec![gpu(1), gpu(3)]).rules().to_vec();
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
            &grant(vec![gpu(2)]),
            &config,
            Some(Path::new("/v/nvidia_1")),
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
        let info = launch_info(&grant(vec![]), &plain, Some(Path::new("/v")), None).unwrap();
        assert!(
            info.mounts.is_empty() && !info.needs_launch_info(),
            "no GPU, a plain image: no device node, no volume, nothing to tell it: {info:?}"
        );
        let cuda = PrepareConfig {
            rootfs: Some("/r".into()),
            image_env: vec!["NVIDIA_VISIBLE_DEVICES=all".into()],
            ..Default::default()
        };
        let info = launch_info(&grant(vec![]), &cuda, Some(Path::new("/v")), None).unwrap();
        assert_eq!(
            info.environment[0],
            ("NVIDIA_VISIBLE_DEVICES".into(), "none".into()),
            "no GPU, an image asking for the driver: its variable is overridden"
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
            &grant(vec![gpu(0), gpu(1)]),
            &config,
            Some(Path::new("/v")),
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
        let empty = grant(vec![]);
        assert_eq!(
            empty.rules(),
            normalize(&default_whitelist()),
            "no control devices"
        );
        let info = launch_info(&empty, &config, Some(Path::new("/v")), None).unwrap();
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
        let mut far = gpu(7);
        far.minor = 77;
        let err = launch_info(&grant(vec![far]), &config, None, None).unwrap_err();
        assert_eq!(err, GrantError::MissingNode { index: 7 });
    }
}
