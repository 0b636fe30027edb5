//! `MESOS_GPU_DOCKER_ARGS` as mesos-gpu 0.1's `docker-args --json` wrote it: a JSON array of
//! `docker run` arguments (`--name=`, `--device=`, `--volume-driver=`, `--volume=`, `--env=`,
//! `--cpuset-cpus=`, `--cpuset-mems=`, and `--label=mesos-gpu.driver=` /
//! `--label=mesos-gpu.driver-cuda=` naming the driver it saw). Read for one version: on a node
//! being upgraded, the agent's hook (and the `docker-args` it runs) may be older than this
//! wrapper while tasks start. The arguments are read back into a [`DockerLaunch`] and rendered
//! like any other launch, so an image is given what a launch of today gives it. Remove this
//! module in the release after the one that writes [`DockerLaunch`].

use std::path::{Path, PathBuf};

use anyhow::Context as _;
use mesos_gpu_docker::args::{
    BindMount, CudaVersion, DRIVER_VOLUME_TARGET, DeviceMapping, DockerLaunch, LAUNCH_VERSION,
    LaunchDriver, VolumeMount,
};
use mesos_gpu_placement::numa::{CpuList, Pinning};

use super::ARGS_VARIABLE;

/// The label 0.1's `docker-args` gave the driver's version (`550.54.14`).
const DRIVER_LABEL: &str = "mesos-gpu.driver";
/// The label 0.1's `docker-args` gave the newest CUDA the driver supports (`12.4`).
const DRIVER_CUDA_LABEL: &str = "mesos-gpu.driver-cuda";
/// The variables 0.1's `docker-args` computed for an image it did not know; the launch renders
/// them from the pulled image's own.
const IMAGE_VARIABLES: [&str; 2] = ["PATH", "LD_LIBRARY_PATH"];

/// The launch that the 0.1 argument array `json` describes.
pub(super) fn launch(json: &str) -> anyhow::Result<DockerLaunch> {
    let args: Vec<String> = serde_json::from_str(json).with_context(|| {
        format!("{ARGS_VARIABLE}={json:?}: expected a JSON object, or an array of strings")
    })?;
    let mut launch = DockerLaunch {
        version: LAUNCH_VERSION,
        name: None,
        devices: Vec::new(),
        env: Vec::new(),
        binds: Vec::new(),
        cpuset: None,
        driver: None,
    };
    let (mut plugin, mut volume, mut version, mut cuda) = (None, None, None, None);
    let (mut cpus, mut mems) = (None, None);
    for arg in &args {
        let bad = || format!("{ARGS_VARIABLE}: argument {arg:?}");
        let (option, value) = arg
            .split_once('=')
            .with_context(|| format!("{}: expected --OPTION=VALUE", bad()))?;
        match option {
            "--name" => launch.name = Some(value.to_owned()),
            "--device" => {
                let (host, container) = value.split_once(':').unwrap_or((value, value));
                launch.devices.push(DeviceMapping {
                    host: PathBuf::from(host),
                    container: PathBuf::from(container),
                });
            }
            "--volume-driver" => plugin = Some(value.to_owned()),
            "--volume" => {
                let (spec, read_only) = match value.strip_suffix(":ro") {
                    Some(spec) => (spec, true),
                    None => (value, false),
                };
                let (source, target) = spec
                    .split_once(':')
                    .with_context(|| format!("{}: expected SOURCE:TARGET[:ro]", bad()))?;
                if Path::new(target) == Path::new(DRIVER_VOLUME_TARGET) {
                    volume = Some(source.to_owned());
                } else {
                    launch.binds.push(BindMount {
                        source: PathBuf::from(source),
                        target: PathBuf::from(target),
                        read_only,
                    });
                }
            }
            "--env" => {
                let (name, val) = value
                    .split_once('=')
                    .with_context(|| format!("{}: expected --env=NAME=VALUE", bad()))?;
                if !IMAGE_VARIABLES.contains(&name) {
                    launch.env.push((name.to_owned(), val.to_owned()));
                }
            }
            "--cpuset-cpus" => cpus = Some(cpu_list(value).with_context(bad)?),
            "--cpuset-mems" => mems = Some(cpu_list(value).with_context(bad)?),
            "--label" => match value.split_once('=') {
                Some((DRIVER_LABEL, v)) => version = Some(v.to_owned()),
                Some((DRIVER_CUDA_LABEL, v)) => {
                    cuda = Some(CudaVersion::parse(v).with_context(bad)?);
                }
                _ => anyhow::bail!("{}: not a label mesos-gpu writes", bad()),
            },
            _ => anyhow::bail!(
                "{}: not an argument `mesos-gpu docker-args` writes (--name, --device, \
                 --volume-driver, --volume, --env, --cpuset-cpus, --cpuset-mems, --label)",
                bad()
            ),
        }
    }
    launch.cpuset = cpus.map(|cpus| Pinning { cpus, mems });
    if let Some(source) = volume {
        let volume = match plugin {
            Some(plugin) => VolumeMount::Named {
                plugin,
                name: source,
            },
            None => VolumeMount::Bind {
                host_path: PathBuf::from(source),
            },
        };
        launch.driver = Some(LaunchDriver {
            // Written by every 0.1 `docker-args` that mounted the volume; without it the
            // version is not known and an image naming a CUDA version is refused.
            version: version.unwrap_or_else(|| "(not named)".to_owned()),
            cuda,
            volume,
        });
    }
    Ok(launch)
}

fn cpu_list(text: &str) -> anyhow::Result<CpuList> {
    text.parse()
        .with_context(|| format!("{text:?}: expected a Linux CPU list such as 0-3,8"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use mesos_gpu_docker::args::ImageInfo;

    const ID: &str = "3d8a52b4-1c5e-4f5a-9c1e-2b7d9a0e6f11";

    /// What 0.1's `docker-args --json --gpus 1 --numa-pinning` wrote without `--image`.
    fn old_args() -> String {
        serde_json::to_string(&[
            format!("--name=mesos-{ID}"),
            "--device=/dev/nvidiactl".into(),
            "--device=/tmp/devs/nvidia0:/dev/nvidia0".into(),
            "--volume=/var/lib/mesos-gpu/volumes/nvidia_550.54.14:/usr/local/nvidia:ro".into(),
            "--env=NVIDIA_VISIBLE_DEVICES=GPU-1".into(),
            "--env=CUDA_VISIBLE_DEVICES=GPU-1".into(),
            "--env=PATH=/usr/local/nvidia/bin:/usr/bin:/bin".into(),
            "--env=LD_LIBRARY_PATH=/usr/local/nvidia/lib:/usr/local/nvidia/lib64".into(),
            "--cpuset-cpus=0-1".into(),
            "--cpuset-mems=0".into(),
            "--label=mesos-gpu.driver=550.54.14".into(),
            "--label=mesos-gpu.driver-cuda=12.4".into(),
        ])
        .expect("json")
    }

    #[test]
    fn old_arguments_render_as_a_launch_of_today() {
        let launch = launch(&old_args()).expect("read");
        assert_eq!(launch.name.as_deref(), Some(&*format!("mesos-{ID}")));
        let driver = launch.driver.clone().expect("a driver");
        assert_eq!(driver.version, "550.54.14");
        assert_eq!(
            driver.cuda,
            Some(CudaVersion {
                major: 12,
                minor: 4
            })
        );
        let plain = launch.render(Some(&ImageInfo::default())).expect("plain");
        assert_eq!(
            plain.cli_args(),
            [
                "--device=/dev/nvidiactl",
                "--device=/tmp/devs/nvidia0:/dev/nvidia0",
                "--env=NVIDIA_VISIBLE_DEVICES=GPU-1",
                "--env=CUDA_VISIBLE_DEVICES=GPU-1",
                "--cpuset-cpus=0-1",
                "--cpuset-mems=0",
            ]
        );
        let cuda = ImageInfo {
            env: vec!["NVIDIA_VISIBLE_DEVICES=all".into(), "PATH=/opt/bin".into()],
            ..ImageInfo::default()
        };
        let args = launch.render(Some(&cuda)).expect("cuda").cli_args();
        assert!(
            args.contains(
                &"--volume=/var/lib/mesos-gpu/volumes/nvidia_550.54.14:/usr/local/nvidia:ro"
                    .to_owned()
            ),
            "{args:?}"
        );
        assert!(
            args.contains(&"--env=PATH=/opt/bin:/usr/local/nvidia/bin".to_owned()),
            "the image's PATH is extended, not 0.1's fixed one: {args:?}"
        );
    }

    #[test]
    fn a_plugin_volume_and_no_driver_labels_are_read() {
        let json = serde_json::to_string(&[
            "--volume-driver=nvidia-docker",
            "--volume=nvidia_driver_550.54.14:/usr/local/nvidia:ro",
        ])
        .expect("json");
        let driver = launch(&json).expect("read").driver.expect("a driver");
        assert_eq!(
            driver.volume,
            VolumeMount::Named {
                plugin: "nvidia-docker".into(),
                name: "nvidia_driver_550.54.14".into()
            }
        );
        assert_eq!(driver.cuda, None);
    }

    #[test]
    fn what_docker_args_never_wrote_is_refused_by_name() {
        for arg in ["--privileged", "--label=other=1", "--cpuset-cpus=x"] {
            let json = serde_json::to_string(&[arg]).expect("json");
            let err = format!("{:#}", launch(&json).expect_err(arg));
            assert!(err.contains(arg), "{err}");
        }
    }
}
