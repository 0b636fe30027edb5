//! The agent's Docker hook, decided here: which `docker-args` command line a Docker task runs,
//! read from its resources, so the C++ hook parses nothing and only runs the command.
//!
//! The operator gives the command as the hook's module parameter `docker_args` (e.g.
//! `/usr/bin/mesos-gpu docker-args --pool-dir /var/lib/mesos-gpu`, split on spaces, as Mesos's
//! `strings::tokenize` splits it). For a task asking for `gpus` or `mig-<profile>` scalars (the
//! MIG devices an agent offers with the mixed strategy), the hook runs it with `--gpus=N`, one
//! `--mig=mig-<profile>:N` per MIG scalar (each `N` a whole number by the module's rule,
//! [`mig_counts`]), `--cpus=C` (its `cpus`, when the command pins with `--numa-pinning`: pinning never leaves a task fewer CPUs than it asked
//! for), `--container-id=<id>` (the Mesos id in `mesos-<id>`), `--json` and, with an image,
//! `--image=<image> --unpulled-image-ok`, and what the task's `TaskInfo` and `ExecutorInfo` say
//! of its holder (`--executor-id`, `--framework-id`, `--task-id`, `--task-name`, each when
//! known); `docker-args` then reserves and prints the task's
//! grant as a versioned JSON launch, which the hook passes on unchanged in
//! `MESOS_GPU_DOCKER_ARGS` and `docker-wrapper` renders for the pulled image as every Docker
//! path renders one. A task asking for neither gets no command: the hook runs
//! nothing. Its release runs the same command with `--release=<id>`.

use crate::convert;
use crate::proto::mesos::ContainerId;
use crate::proto::mesos::slave::ContainerConfig;
use crate::status::FfiError;

/// The scalar resources of MIG devices (`mesos-gpu agent-flags --mig-strategy mixed`).
const MIG_PREFIX: &str = mesos_gpu_isolator::agent_flags::MIG_RESOURCE_PREFIX;

/// The MIG devices `resources` of container `id` ask for: each `mig-<profile>` scalar but 0
/// (the MIG devices an agent offers with the mixed strategy) and its count, a whole number by the
/// one rule of every `gpus`-like scalar (`GpuRequest::from_scalar`: Mesos's 0.001 precision
/// first). The module's `prepare` and the Docker hook both read a task's MIG request here.
pub(crate) fn mig_counts(
    id: &str,
    resources: &[crate::proto::mesos::Resource],
) -> Result<Vec<(String, u32)>, FfiError> {
    let mut out = Vec::new();
    for (resource, count) in convert::requested_scalars(resources, MIG_PREFIX) {
        if count == 0.0 {
            continue;
        }
        let whole = mesos_gpu_placement::allocator::GpuRequest::from_scalar(count, u32::MAX)
            .map_err(|_| FfiError::MigCount {
                container: id.to_owned(),
                name: resource.clone(),
                got: count,
            })?;
        out.push((resource, whole.count()));
    }
    Ok(out)
}

/// The operator's command, split on spaces; refused when empty.
fn command(line: &str) -> Result<Vec<String>, FfiError> {
    let argv: Vec<String> = line
        .split(' ')
        .filter(|w| !w.is_empty())
        .map(str::to_owned)
        .collect();
    if argv.is_empty() {
        return Err(FfiError::HookCommand);
    }
    Ok(argv)
}

/// The command the hook runs for the Docker task of container `name` (`mesos-<id>`) with
/// `config` (its resources and container info), or `None` when it asks for no GPU.
pub(crate) fn launch_argv(
    line: &str,
    config: &ContainerConfig,
    name: &str,
) -> Result<Option<Vec<String>>, FfiError> {
    let id = name
        .strip_prefix(mesos_gpu_docker::client::MESOS_NAME_PREFIX)
        .filter(|id| !id.is_empty())
        .ok_or_else(|| FfiError::HookContainerName {
            name: name.to_owned(),
        })?;
    let cid = ContainerId {
        value: id.to_owned(),
        parent: None,
    };
    let gpus = convert::requested_gpus(&cid, &config.resources)?;
    let mig: Vec<String> = mig_counts(id, &config.resources)?
        .into_iter()
        .map(|(resource, count)| format!("--mig={resource}:{count}"))
        .collect();
    if gpus <= 0.0 && mig.is_empty() {
        return Ok(None);
    }
    let mut argv = command(line)?;
    // A whole number by the module's rule (0.9999 and 2.0000000001 left by Mesos's scalar sums
    // are 1 and 2, as `prepare` reads them); any other value goes as given, for docker-args to
    // refuse with its reason.
    match mesos_gpu_placement::allocator::GpuRequest::from_scalar(gpus, u32::MAX) {
        Ok(whole) => argv.push(format!("--gpus={}", whole.count())),
        Err(_) => argv.push(format!("--gpus={gpus}")),
    }
    argv.extend(mig);
    if argv.iter().any(|a| a == "--numa-pinning")
        && let Some(cpus) = convert::requested_cpus(&config.resources)
    {
        argv.push(format!("--cpus={cpus}"));
    }
    argv.push(format!("--container-id={id}"));
    argv.extend(holder_args(config));
    argv.push("--json".to_owned());
    let image = config
        .container_info
        .as_ref()
        .and_then(|c| c.docker.as_ref())
        .map(|d| d.image.as_str())
        .filter(|i| !i.is_empty());
    if let Some(image) = image {
        argv.push(format!("--image={image}"));
        argv.push("--unpulled-image-ok".to_owned());
    }
    Ok(Some(argv))
}

/// `--executor-id`, `--framework-id`, `--task-id` and `--task-name` for what `config` says of
/// the task's holder ([`convert::holder`]), each only when known; `docker-args` records them
/// with the reservation.
fn holder_args(config: &ContainerConfig) -> Vec<String> {
    let Some(holder) = convert::holder(config) else {
        return Vec::new();
    };
    [
        ("executor-id", holder.executor_id),
        ("framework-id", holder.framework_id),
        ("task-id", holder.task_id),
        ("task-name", holder.task_name),
    ]
    .into_iter()
    .filter_map(|(flag, value)| Some(format!("--{flag}={}", value?)))
    .collect()
}

/// The command that gives back the GPUs of Docker container `id`.
pub(crate) fn release_argv(line: &str, id: &str) -> Result<Vec<String>, FfiError> {
    let mut argv = command(line)?;
    argv.push(format!("--release={id}"));
    Ok(argv)
}

/// `argv` as the C side reads it: each argument NUL-terminated, back to back.
pub(crate) fn nul_separated(argv: &[String]) -> Vec<u8> {
    argv.iter().flat_map(|a| a.bytes().chain([0])).collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a failed unwrap fails the test at its line
mod tests {
    use super::*;
    use crate::proto::mesos::container_info::DockerInfo;
    use crate::proto::mesos::{ContainerInfo, Resource, value};

    fn scalar(name: &str, v: f64) -> Resource {
        Resource {
            name: name.into(),
            r#type: value::Type::Scalar as i32,
            scalar: Some(value::Scalar { value: v }),
            ..Resource::default()
        }
    }

    fn config(resources: Vec<Resource>, image: Option<&str>) -> ContainerConfig {
        ContainerConfig {
            resources,
            container_info: image.map(|i| ContainerInfo {
                docker: Some(DockerInfo {
                    image: i.into(),
                    ..DockerInfo::default()
                }),
                ..ContainerInfo::default()
            }),
            ..ContainerConfig::default()
        }
    }

    const LINE: &str = "/usr/bin/mesos-gpu  docker-args --pool-dir /p";

    #[test]
    fn a_task_with_gpus_mig_devices_and_cpus_gets_the_whole_command() {
        let cfg = config(
            vec![
                scalar("gpus", 0.0),
                scalar("mig-1g.5gb", 1.0),
                scalar("cpus", 2.5),
            ],
            Some("nvidia/cuda:12.4.1-base"),
        );
        let line = format!("{LINE} --numa-pinning");
        let argv = launch_argv(&line, &cfg, "mesos-abc").unwrap().unwrap();
        assert_eq!(
            argv,
            [
                "/usr/bin/mesos-gpu",
                "docker-args",
                "--pool-dir",
                "/p",
                "--numa-pinning",
                "--gpus=0",
                "--mig=mig-1g.5gb:1",
                "--cpus=2.5",
                "--container-id=abc",
                "--json",
                "--image=nvidia/cuda:12.4.1-base",
                "--unpulled-image-ok"
            ]
        );
        let plain = launch_argv(
            LINE,
            &config(vec![scalar("gpus", 2.0), scalar("cpus", 1.0)], None),
            "mesos-x",
        )
        .unwrap()
        .unwrap();
        assert_eq!(plain[4..], ["--gpus=2", "--container-id=x", "--json"]);
        let mut held = config(vec![scalar("gpus", 1.0)], None);
        held.executor_info = Some(crate::proto::mesos::ExecutorInfo {
            executor_id: crate::proto::mesos::ExecutorId { value: "e1".into() },
            framework_id: Some(crate::proto::mesos::FrameworkId { value: "f1".into() }),
            ..Default::default()
        });
        held.task_info = Some(crate::proto::mesos::TaskInfo {
            name: "a task".into(),
            task_id: crate::proto::mesos::TaskId { value: "t1".into() },
            ..Default::default()
        });
        let argv = launch_argv(LINE, &held, "mesos-x").unwrap().unwrap();
        assert_eq!(
            argv[4..],
            [
                "--gpus=1",
                "--container-id=x",
                "--executor-id=e1",
                "--framework-id=f1",
                "--task-id=t1",
                "--task-name=a task",
                "--json"
            ]
        );
        assert_eq!(
            nul_separated(&release_argv(LINE, "x").unwrap()),
            b"/usr/bin/mesos-gpu\0docker-args\0--pool-dir\0/p\0--release=x\0"
        );
    }

    #[test]
    fn a_mig_count_is_whole_by_the_rule_the_module_applies() {
        // Mesos keeps scalars to 0.001: 0.9999 is one MIG device, as the module's `prepare`
        // reads it (GpuRequest::from_scalar), not a refusal.
        let cfg = config(vec![scalar("mig-1g.5gb", 0.9999)], None);
        let argv = launch_argv(LINE, &cfg, "mesos-a").unwrap().unwrap();
        assert!(argv.contains(&"--mig=mig-1g.5gb:1".to_owned()), "{argv:?}");
        // The same rule for `gpus`: before, "--gpus=0.9999" reached docker-args, which refused
        // what the module grants as one GPU.
        let cfg = config(vec![scalar("gpus", 0.9999)], None);
        let argv = launch_argv(LINE, &cfg, "mesos-a").unwrap().unwrap();
        assert!(argv.contains(&"--gpus=1".to_owned()), "{argv:?}");
        let cfg = config(vec![scalar("gpus", 1.5)], None);
        let argv = launch_argv(LINE, &cfg, "mesos-a").unwrap().unwrap();
        assert!(argv.contains(&"--gpus=1.5".to_owned()), "{argv:?}");
        let err = launch_argv(
            LINE,
            &config(vec![scalar("mig-1g.5gb", 1e20)], None),
            "mesos-a",
        )
        .unwrap_err();
        assert!(
            err.to_string().contains("mig-1g.5gb:100000000000000000000"),
            "{err}"
        );
    }

    #[test]
    fn a_task_without_gpus_runs_nothing_and_bad_input_is_named() {
        let none = config(vec![scalar("cpus", 1.0), scalar("mig-1g.5gb", 0.0)], None);
        assert_eq!(launch_argv(LINE, &none, "mesos-a").unwrap(), None);
        let half = config(vec![scalar("mig-1g.5gb", 0.5)], None);
        let err = launch_argv(LINE, &half, "mesos-a").unwrap_err();
        assert!(err.to_string().contains("mig-1g.5gb:0.5"), "{err}");
        let err = launch_argv(LINE, &config(vec![scalar("gpus", 1.0)], None), "other").unwrap_err();
        assert!(err.to_string().contains("'other'"), "{err}");
        assert!(release_argv("  ", "a").is_err());
    }
}
