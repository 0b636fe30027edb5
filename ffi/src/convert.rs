//! Mesos messages ↔ the isolator's Rust types. The only place they are converted: the C ABI
//! decodes into `crate::proto`, converts here, and encodes what comes back.
//!
//! Facts relied on (`docs/reference/mesos-gpu-isolator.md` §1, §10; `ffi/src/proto.rs`):
//! - the `gpus` request of a container is the sum of the `SCALAR` resources named `gpus` in
//!   `ContainerConfig.resources` (the agent puts the task's and the executor's there);
//! - a nested container has `ContainerID.parent`; the isolator keys it by the dotted form Mesos
//!   prints (`parent.child`), which cannot collide with a top-level id;
//! - `ContainerClass::DEBUG` containers share everything with their parent and Mesos's isolator
//!   answers `None` for them;
//! - Mesos mounts device nodes with `MS_BIND` and the driver volume with
//!   `MS_RDONLY | MS_BIND | MS_REC` (`isolator.cpp`, `_prepare`);
//! - answers are built fresh, with every required field and enum set explicitly (an enum left
//!   at prost's 0 may not be a value of a proto2 enum with no 0).

use std::path::PathBuf;
use std::time::{SystemTime, UNIX_EPOCH};

use mesos_gpu_health::Limitation;
use mesos_gpu_isolator::{
    lifecycle::ContainerId, lifecycle::LaunchInfo, lifecycle::PrepareConfig,
    lifecycle::RecoverState, lifecycle::Usage,
};
use mesos_gpu_placement::sharing::{SHARE_MODE_ENV, Wanted};

use crate::proto::mesos::slave::{
    ContainerClass, ContainerConfig, ContainerLaunchInfo, ContainerLimitation, ContainerMountInfo,
    ContainerState,
};
use crate::proto::mesos::{
    self, ContainerStatus, Environment, Resource, ResourceStatistics, environment, task_status,
    value,
};
use crate::proto::mesos_gpu::GpuStatistics;

/// `mount(2)` `MS_RDONLY`.
pub(crate) const MS_RDONLY: u32 = 1;
/// `mount(2)` `MS_BIND`.
pub(crate) const MS_BIND: u32 = 4096;
/// `mount(2)` `MS_REC`.
pub(crate) const MS_REC: u32 = 16384;

/// The resource name of GPUs in Mesos.
pub(crate) const GPUS: &str = "gpus";

/// A Mesos message that does not fit the isolator's types.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ConvertError {
    /// A container id the isolator cannot use (as a cgroup name).
    #[error("container id {id:?}")]
    ContainerId {
        /// The id as Mesos prints it.
        id: String,
        /// Why.
        #[source]
        source: mesos_gpu_os::container_id::ContainerIdError,
    },
    /// A `gpus` resource that is not a scalar.
    #[error("resource `gpus` of container {container} has type {got}: expected SCALAR")]
    GpusNotScalar {
        /// The container.
        container: String,
        /// The type given.
        got: String,
    },
    /// A `gpus` scalar resource with no value.
    #[error("resource `gpus` of container {container} is SCALAR but has no scalar value")]
    GpusMissingValue {
        /// The container.
        container: String,
    },
    /// A share mode (`MESOS_GPU_SHARE_MODE`) that is not one of the accepted.
    #[error(
        "container {container}: {SHARE_MODE_ENV}={got:?}: expected mps, time-slicing, none (whole GPUs) or any"
    )]
    ShareMode {
        /// The container.
        container: String,
        /// The value given.
        got: String,
    },
}

/// What the task's environment asks of a sharing node (`MESOS_GPU_SHARE_MODE`): from the task's
/// command (a command task), else the container's command.
pub(crate) fn requested_sharing(
    id: &mesos::ContainerId,
    config: &ContainerConfig,
) -> Result<Wanted, ConvertError> {
    let task = config
        .task_info
        .as_ref()
        .and_then(|t| t.command.as_ref())
        .and_then(|c| c.environment.as_ref());
    let own = config.command_info.environment.as_ref();
    let value = task
        .into_iter()
        .chain(own)
        .flat_map(|e| &e.variables)
        .find(|v| v.name == SHARE_MODE_ENV)
        .and_then(|v| v.value.clone());
    match value {
        None => Ok(Wanted::Any),
        Some(text) => Wanted::parse(&text).map_err(|_| ConvertError::ShareMode {
            container: id.to_string(),
            got: text,
        }),
    }
}

/// The isolator's id of a Mesos container: its dotted form, checked as a cgroup name.
pub(crate) fn container_id(id: &mesos::ContainerId) -> Result<ContainerId, ConvertError> {
    let text = id.to_string();
    ContainerId::new(text.clone()).map_err(|source| ConvertError::ContainerId { id: text, source })
}

/// Where Mesos puts a nested container's own cgroup, relative to `--cgroups_root`:
/// `<parent>/mesos/<child>` (`containerizer::paths::getCgroupPath`, `paths.cpp` 600-611, and
/// v2's `cgroups2::container`, 667-680); `None` for a top-level container.
pub(crate) fn nested_cgroup(id: &mesos::ContainerId) -> Result<Option<PathBuf>, ConvertError> {
    fn build(id: &mesos::ContainerId) -> Result<PathBuf, ConvertError> {
        let value =
            ContainerId::new(id.value.clone()).map_err(|source| ConvertError::ContainerId {
                id: id.to_string(),
                source,
            })?;
        Ok(match id.parent.as_deref() {
            None => PathBuf::from(value.as_str()),
            Some(parent) => build(parent)?.join("mesos").join(value.as_str()),
        })
    }
    if id.parent.is_none() {
        return Ok(None);
    }
    build(id).map(Some)
}

/// True for a `DEBUG` class container, to which Mesos's isolators answer `None`.
pub(crate) fn is_debug(config: &ContainerConfig) -> bool {
    config.container_class == Some(ContainerClass::Debug as i32)
}

/// The `gpus` requested in `resources`: the sum of the `gpus` scalars (0 when there is none).
pub(crate) fn requested_gpus(
    container: &mesos::ContainerId,
    resources: &[Resource],
) -> Result<f64, ConvertError> {
    let mut total = 0.0;
    for r in resources.iter().filter(|r| r.name == GPUS) {
        if r.r#type != value::Type::Scalar as i32 {
            let got = value::Type::try_from(r.r#type)
                .map_or_else(|_| r.r#type.to_string(), |t| t.as_str_name().to_owned());
            return Err(ConvertError::GpusNotScalar {
                container: container.to_string(),
                got,
            });
        }
        let scalar = r
            .scalar
            .as_ref()
            .ok_or_else(|| ConvertError::GpusMissingValue {
                container: container.to_string(),
            })?;
        total += scalar.value;
    }
    Ok(total)
}

/// The scalars of `resources` whose name starts with `prefix`, summed by name.
pub(crate) fn requested_scalars(resources: &[Resource], prefix: &str) -> Vec<(String, f64)> {
    let mut out: Vec<(String, f64)> = Vec::new();
    for r in resources
        .iter()
        .filter(|r| r.name.starts_with(prefix) && r.r#type == value::Type::Scalar as i32)
    {
        let v = r.scalar.as_ref().map_or(0.0, |s| s.value);
        match out.iter_mut().find(|(n, _)| *n == r.name) {
            Some((_, total)) => *total += v,
            None => out.push((r.name.clone(), v)),
        }
    }
    out
}

/// The `cpus` asked for in `resources` (the sum of the `cpus` scalars), `None` when there is
/// none; NUMA pinning never leaves a container fewer CPUs than this.
pub(crate) fn requested_cpus(resources: &[Resource]) -> Option<f64> {
    let scalars: Vec<f64> = resources
        .iter()
        .filter(|r| r.name == "cpus" && r.r#type == value::Type::Scalar as i32)
        .filter_map(|r| r.scalar.as_ref().map(|s| s.value))
        .collect();
    (!scalars.is_empty()).then(|| scalars.iter().sum())
}

/// Whose container `config` is for: its executor and framework (`executor_info`) and, for a
/// command task, its task (`task_info`); `None` when it names none of them. The one reading of
/// a holder from a `ContainerConfig`: the module's `prepare` and the Docker hook both use it.
pub(crate) fn holder(config: &ContainerConfig) -> Option<mesos_gpu_pool::Holder> {
    let executor = config.executor_info.as_ref();
    let task = config.task_info.as_ref();
    let nonempty = |s: &str| (!s.is_empty()).then(|| s.to_owned());
    mesos_gpu_pool::Holder {
        executor_id: executor.and_then(|e| nonempty(&e.executor_id.value)),
        framework_id: executor
            .and_then(|e| e.framework_id.as_ref())
            .and_then(|f| nonempty(&f.value)),
        framework_name: None,
        task_id: task.and_then(|t| nonempty(&t.task_id.value)),
        task_name: task.and_then(|t| nonempty(&t.name)),
    }
    .known()
}

/// `ContainerConfig` → `PrepareConfig` for container `id`.
pub(crate) fn prepare_config(
    id: &mesos::ContainerId,
    config: &ContainerConfig,
) -> Result<PrepareConfig, ConvertError> {
    let image = config
        .docker
        .as_ref()
        .and_then(|d| d.manifest.as_ref())
        .and_then(|m| m.config.as_ref());
    Ok(PrepareConfig {
        gpus: requested_gpus(id, &config.resources)?,
        cpus: requested_cpus(&config.resources),
        rootfs: config.rootfs.as_ref().map(Into::into),
        image_env: image.map(|c| c.env.clone()).unwrap_or_default(),
        image_labels: image
            .map(|c| c.labels.keys().cloned().collect())
            .unwrap_or_default(),
        has_task_info: config.task_info.is_some(),
        parent: id.parent.as_deref().map(container_id).transpose()?,
        nested_cgroup: nested_cgroup(id)?,
        capabilities: task_capabilities(config),
        sharing: requested_sharing(id, config)?,
        holder: holder(config),
        ..PrepareConfig::default()
    })
}

/// The capabilities the container's task runs with, as far as its `ContainerConfig` tells: the
/// effective set of its `LinuxInfo` (or the deprecated `capability_info`) when one is given;
/// otherwise every capability when it runs as root (no `user`, or `root`: Mesos then starts it
/// with the agent's own, CAP_SYS_ADMIN included), and none as another user. Only SYS_ADMIN is
/// named; other capabilities are given by number.
pub(crate) fn task_capabilities(config: &ContainerConfig) -> Vec<String> {
    let linux = config
        .container_info
        .as_ref()
        .and_then(|c| c.linux_info.as_ref());
    let given = linux.and_then(|l| {
        l.effective_capabilities
            .as_ref()
            .or(l.capability_info.as_ref())
    });
    let name = |c: i32| match mesos::capability_info::Capability::try_from(c) {
        Ok(mesos::capability_info::Capability::SysAdmin) => "SYS_ADMIN".to_owned(),
        _ => format!("capability {c}"),
    };
    match given {
        Some(info) => info.capabilities.iter().map(|&c| name(c)).collect(),
        None if config.user.as_deref().is_none_or(|u| u == "root") => {
            vec!["SYS_ADMIN".to_owned()]
        }
        None => Vec::new(),
    }
}

/// `LaunchInfo` → `ContainerLaunchInfo`: the mounts and the environment.
pub(crate) fn launch_info(info: &LaunchInfo) -> ContainerLaunchInfo {
    let mounts = info
        .mounts
        .iter()
        .map(|m| ContainerMountInfo {
            target: m.target.display().to_string(),
            source: Some(m.source.display().to_string()),
            r#type: None,
            flags: Some(if m.read_only {
                MS_RDONLY | MS_BIND | MS_REC
            } else {
                MS_BIND
            }),
            options: None,
        })
        .collect();
    ContainerLaunchInfo {
        environment: environment(&info.environment),
        task_environment: environment(&info.task_environment),
        mounts,
        ..ContainerLaunchInfo::default()
    }
}

fn environment(vars: &[(String, String)]) -> Option<Environment> {
    (!vars.is_empty()).then(|| Environment {
        variables: vars
            .iter()
            .map(|(name, value)| environment::Variable {
                name: name.clone(),
                r#type: Some(environment::variable::Type::Value as i32),
                value: Some(value.clone()),
            })
            .collect(),
    })
}

/// `ContainerState` → `RecoverState`.
pub(crate) fn recover_state(state: &ContainerState) -> Result<RecoverState, ConvertError> {
    Ok(RecoverState {
        id: container_id(&state.container_id)?,
        parent: state
            .container_id
            .parent
            .as_deref()
            .map(container_id)
            .transpose()?,
        nested_cgroup: nested_cgroup(&state.container_id)?,
    })
}

/// A usage answer: the time it was taken and NVML's figures for each GPU the container holds,
/// in `gpu_statistics`, our field (Mesos has no GPU field in `ResourceStatistics`; see
/// `proto/mesos_gpu/statistics.proto`). A figure NVML did not give is left unset, never 0.
pub(crate) fn resource_statistics(now: SystemTime, usage: &Usage) -> ResourceStatistics {
    let timestamp = now
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    let gpu_statistics = usage
        .gpus
        .iter()
        .map(|gpu| {
            let nvml = gpu.nvml.as_ref();
            GpuStatistics {
                index: Some(gpu.index),
                uuid: Some(gpu.uuid.clone()),
                utilization_gpu_percent: nvml.and_then(|n| n.utilization_gpu),
                utilization_memory_percent: nvml.and_then(|n| n.utilization_memory),
                memory_used_bytes: nvml.and_then(|n| n.memory_used),
                memory_total_bytes: nvml.and_then(|n| n.memory_total),
                processes: nvml
                    .and_then(|n| n.pids.as_ref())
                    .map(|p| u32::try_from(p.len()).unwrap_or(u32::MAX)),
            }
        })
        .collect();
    ResourceStatistics {
        timestamp,
        processes: None,
        threads: None,
        gpu_statistics,
    }
}

/// A status answer for container `id`.
pub(crate) fn container_status(id: &mesos::ContainerId) -> ContainerStatus {
    ContainerStatus {
        container_id: Some(id.clone()),
        cgroup_info: None,
        executor_pid: None,
    }
}

/// A GPU limitation: `REASON_CONTAINER_LIMITATION` with one `gpus` resource and the message.
pub(crate) fn limitation(limitation: &Limitation) -> ContainerLimitation {
    ContainerLimitation {
        resources: vec![gpus_resource(1.0)],
        message: Some(limitation.message.clone()),
        reason: Some(task_status::Reason::ContainerLimitation as i32),
    }
}

/// A `gpus` scalar resource.
pub(crate) fn gpus_resource(count: f64) -> Resource {
    Resource {
        name: GPUS.to_owned(),
        r#type: value::Type::Scalar as i32,
        scalar: Some(mesos::value::Scalar { value: count }),
        ..Resource::default()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::path::PathBuf;

    #[test]
    fn task_capabilities_as_the_task_runs() {
        use crate::proto::mesos::{CapabilityInfo, ContainerInfo, LinuxInfo, capability_info};
        let with = |caps: Option<Vec<i32>>, user: Option<&str>| ContainerConfig {
            user: user.map(str::to_owned),
            container_info: caps.map(|c| ContainerInfo {
                linux_info: Some(LinuxInfo {
                    effective_capabilities: Some(CapabilityInfo { capabilities: c }),
                    ..LinuxInfo::default()
                }),
                ..ContainerInfo::default()
            }),
            ..ContainerConfig::default()
        };
        let admin = capability_info::Capability::SysAdmin as i32;
        assert_eq!(
            task_capabilities(&with(None, None)),
            ["SYS_ADMIN"],
            "root, the agent's"
        );
        assert_eq!(task_capabilities(&with(None, Some("root"))), ["SYS_ADMIN"]);
        assert!(task_capabilities(&with(None, Some("alice"))).is_empty());
        assert_eq!(
            task_capabilities(&with(Some(vec![1000, admin]), None)),
            ["capability 1000", "SYS_ADMIN"]
        );
        assert_eq!(
            task_capabilities(&with(Some(vec![1000]), None)),
            ["capability 1000"]
        );
    }

    use mesos_gpu_grant::MountKind;
    use mesos_gpu_isolator::lifecycle::Mount;

    use super::*;
    use crate::proto::docker::spec::v1::{ImageManifest, image_manifest};
    use crate::proto::mesos::slave::container_config;

    fn mid(value: &str, parent: Option<mesos::ContainerId>) -> mesos::ContainerId {
        mesos::ContainerId {
            value: value.into(),
            parent: parent.map(Box::new),
        }
    }

    fn config(resources: Vec<Resource>) -> ContainerConfig {
        ContainerConfig {
            resources,
            directory: "/sandbox".into(),
            ..ContainerConfig::default()
        }
    }

    #[test]
    fn gpus_are_summed_over_gpu_resources_only() {
        let cpus = Resource {
            name: "cpus".into(),
            ..gpus_resource(4.0)
        };
        let c = config(vec![gpus_resource(1.0), cpus, gpus_resource(2.0)]);
        let p = prepare_config(&mid("a", None), &c).unwrap();
        assert_eq!(p.gpus, 3.0);
        assert_eq!(
            prepare_config(&mid("a", None), &config(vec![]))
                .unwrap()
                .gpus,
            0.0
        );
    }

    #[test]
    fn non_scalar_gpus_are_refused_with_the_type() {
        let set = Resource {
            r#type: value::Type::Set as i32,
            scalar: None,
            ..gpus_resource(0.0)
        };
        let err = prepare_config(&mid("a", None), &config(vec![set])).unwrap_err();
        assert_eq!(
            err.to_string(),
            "resource `gpus` of container a has type SET: expected SCALAR"
        );
        let empty = Resource {
            scalar: None,
            ..gpus_resource(0.0)
        };
        let err = prepare_config(&mid("a", None), &config(vec![empty])).unwrap_err();
        assert!(err.to_string().contains("no scalar value"), "{err}");
    }

    #[test]
    fn manifest_rootfs_task_and_parent_are_carried() {
        let mut c = config(vec![gpus_resource(1.0)]);
        c.rootfs = Some("/rootfs".into());
        c.task_info = Some(mesos::TaskInfo::default());
        c.docker = Some(container_config::Docker {
            manifest: Some(ImageManifest {
                config: Some(image_manifest::Config {
                    env: vec!["NVIDIA_VISIBLE_DEVICES=all".into()],
                    labels: [(
                        "com.nvidia.volumes.needed".to_owned(),
                        "nvidia_driver".to_owned(),
                    )]
                    .into(),
                    ..Default::default()
                }),
                ..Default::default()
            }),
        });
        let p = prepare_config(&mid("child", Some(mid("parent", None))), &c).unwrap();
        assert_eq!(p.rootfs, Some(PathBuf::from("/rootfs")));
        assert_eq!(p.image_env, ["NVIDIA_VISIBLE_DEVICES=all"]);
        assert_eq!(p.image_labels, ["com.nvidia.volumes.needed"]);
        assert!(p.has_task_info);
        assert_eq!(p.parent.unwrap().as_str(), "parent");
    }

    #[test]
    fn the_holder_is_read_from_executor_and_task_info() {
        let mut c = config(vec![gpus_resource(2.0)]);
        assert_eq!(prepare_config(&mid("a", None), &c).unwrap().holder, None);
        c.executor_info = Some(mesos::ExecutorInfo {
            executor_id: mesos::ExecutorId {
                value: "exec-1".into(),
            },
            framework_id: Some(mesos::FrameworkId {
                value: "fw-1".into(),
            }),
            ..Default::default()
        });
        let executor_only = prepare_config(&mid("a", None), &c).unwrap().holder;
        assert_eq!(
            executor_only,
            Some(mesos_gpu_pool::Holder {
                executor_id: Some("exec-1".into()),
                framework_id: Some("fw-1".into()),
                ..Default::default()
            })
        );
        c.task_info = Some(mesos::TaskInfo {
            name: "train".into(),
            task_id: mesos::TaskId {
                value: "task-1".into(),
            },
            ..Default::default()
        });
        let holder = prepare_config(&mid("a", None), &c).unwrap().holder.unwrap();
        assert_eq!(holder.task_id.as_deref(), Some("task-1"));
        assert_eq!(holder.task_name.as_deref(), Some("train"));
        assert_eq!(holder.executor_id.as_deref(), Some("exec-1"));
        assert_eq!(holder.framework_name, None, "never in a ContainerConfig");
    }

    #[test]
    fn nested_ids_are_dotted_and_bad_ids_named() {
        let id = container_id(&mid("c", Some(mid("b", Some(mid("a", None)))))).unwrap();
        assert_eq!(id.as_str(), "a.b.c");
        let err = container_id(&mid("../x", None)).unwrap_err();
        assert!(
            err.to_string().starts_with("container id \"../x\""),
            "{err}"
        );
    }

    #[test]
    fn nested_cgroups_follow_mesos_paths() {
        assert_eq!(nested_cgroup(&mid("a", None)).unwrap(), None);
        assert_eq!(
            nested_cgroup(&mid("c", Some(mid("b", Some(mid("a", None)))))).unwrap(),
            Some(PathBuf::from("a/mesos/b/mesos/c"))
        );
        // A dotted value is one path component: the dotted key cannot stand in for the path.
        assert_eq!(
            nested_cgroup(&mid("x.y", Some(mid("a", None)))).unwrap(),
            Some(PathBuf::from("a/mesos/x.y"))
        );
        assert!(nested_cgroup(&mid("..", Some(mid("a", None)))).is_err());
    }

    #[test]
    fn launch_info_uses_mesos_mount_flags_and_value_variables() {
        let info = LaunchInfo {
            gpus: vec![],
            mig: vec![],
            device_rules: vec![],
            cgroup: None,
            mounts: vec![
                Mount {
                    source: "/dev/nvidia0".into(),
                    target: "/r/dev/nvidia0".into(),
                    read_only: false,
                    kind: MountKind::Device,
                },
                Mount {
                    source: "/v".into(),
                    target: "/r/usr/local/nvidia".into(),
                    read_only: true,
                    kind: MountKind::DriverVolume,
                },
            ],
            environment: vec![],
            pinning: mesos_gpu_isolator::lifecycle::PinOutcome::Off,
            task_environment: vec![("CUDA_VISIBLE_DEVICES".into(), "GPU-1".into())],
        };
        let out = launch_info(&info);
        assert_eq!(out.mounts[0].flags, Some(MS_BIND));
        assert_eq!(out.mounts[1].flags, Some(MS_RDONLY | MS_BIND | MS_REC));
        assert_eq!(out.mounts[1].source.as_deref(), Some("/v"));
        assert!(out.environment.is_none());
        let var = &out.task_environment.unwrap().variables[0];
        assert_eq!(
            (var.name.as_str(), var.value.as_deref()),
            ("CUDA_VISIBLE_DEVICES", Some("GPU-1"))
        );
        assert_eq!(var.r#type, Some(environment::variable::Type::Value as i32));
    }

    #[test]
    fn limitation_is_a_container_limitation_on_gpus() {
        let l = Limitation {
            container: "a".into(),
            gpu: 3,
            uuid: "GPU-3".into(),
            message: "GPU 3 failed".into(),
        };
        let out = limitation(&l);
        assert_eq!(out.reason(), task_status::Reason::ContainerLimitation);
        assert_eq!(out.resources[0].name, "gpus");
        assert_eq!(out.message.as_deref(), Some("GPU 3 failed"));
    }

    #[test]
    fn debug_class_is_detected() {
        let mut c = config(vec![]);
        assert!(!is_debug(&c));
        c.container_class = Some(ContainerClass::Debug as i32);
        assert!(is_debug(&c));
    }

    #[test]
    fn requested_cpus_are_summed() {
        let cpus = |v: f64| Resource {
            name: "cpus".into(),
            ..gpus_resource(v)
        };
        assert_eq!(
            requested_cpus(&[cpus(0.1), gpus_resource(1.0), cpus(1.0)]),
            Some(1.1)
        );
        assert_eq!(requested_cpus(&[gpus_resource(1.0)]), None);
    }
}
