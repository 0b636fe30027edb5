//! A Docker Engine client (bollard, over the daemon's unix socket) for what the bridge needs:
//! read an image's GPU needs, run a container with a [`LaunchPlan`], read back which GPUs a
//! container holds, and find the GPUs held by Mesos's running Docker containers after an agent
//! restart.
//!
//! Facts relied on:
//! - Docker 20.10 speaks API 1.41; bollard 0.21 is generated for 1.53 and negotiates down
//!   (`docs/reference/docker.md`). Fields newer than 1.41 come back `None`.
//! - `docker inspect` reports `HostConfig.Devices[].{PathOnHost,PathInContainer,CgroupPermissions}`
//!   as given at create time, so the GPU nodes a container was given can be read back.
//! - Mesos's Docker containerizer names containers `mesos-<ContainerID>` (Mesos ≤ 0.22 and
//!   ≥ 1.4) or `mesos-<SlaveID>.<ContainerID>[.executor]` (0.23 to 1.3); Docker reports names
//!   with a leading `/`. Mesos's `parse()` accepts only ContainerIDs that are UUIDs
//!   (`src/slave/containerizer/docker.cpp`). Upstream never recovers GPUs of Docker containers
//!   (`docs/reference/mesos-gpu-isolator.md` §8); [`DockerClient::recover`] does.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::pin::Pin;

use bollard::container::LogOutput;
use bollard::models::{ContainerCreateBody, DeviceMapping as BollardDevice, HostConfig};
use bollard::query_parameters::{
    AttachContainerOptionsBuilder, CreateContainerOptionsBuilder, InspectContainerOptions,
    ListContainersOptionsBuilder, RemoveContainerOptionsBuilder, StopContainerOptionsBuilder,
    WaitContainerOptions,
};
use bollard::{ClientVersion, Docker};
use futures_util::{Stream, StreamExt};
use mesos_gpu_node::inventory::Gpu;

use crate::args::{DeviceMapping, ImageInfo, LaunchPlan};

pub use mesos_gpu_isolator::lifecycle::{MESOS_NAME_PREFIX, docker_name};
/// The oldest Docker API this client asks for (Docker 20.10).
const MIN_API: ClientVersion = ClientVersion {
    major_version: 1,
    minor_version: 41,
};
/// Seconds before a Docker API call is abandoned.
const TIMEOUT_SECS: u64 = 120;
/// How long a container's output may lag behind its end.
pub const OUTPUT_DRAIN: std::time::Duration = std::time::Duration::from_secs(5);

/// A failed Docker operation, with what was being done to what.
#[derive(Debug, thiserror::Error)]
pub enum DockerError {
    /// The daemon socket could not be used.
    #[error("cannot connect to the Docker daemon at {socket}")]
    Connect {
        /// The socket path.
        socket: PathBuf,
        /// bollard's error.
        #[source]
        source: bollard::errors::Error,
    },
    /// An API call failed.
    #[error("docker {action} {target}")]
    Call {
        /// What was being done (`inspect image`, `create container`, …).
        action: &'static str,
        /// The image or container concerned.
        target: String,
        /// bollard's error.
        #[source]
        source: bollard::errors::Error,
    },
    /// The daemon's answer lacks a field the bridge needs.
    #[error("docker {action} {target}: the answer has no {field}")]
    Incomplete {
        /// What was being done.
        action: &'static str,
        /// The image or container concerned.
        target: String,
        /// The missing field.
        field: &'static str,
    },
}

impl DockerError {
    /// True when the daemon answered 404 (no such image or container).
    pub fn is_not_found(&self) -> bool {
        matches!(
            self,
            DockerError::Call {
                source: bollard::errors::Error::DockerResponseServerError {
                    status_code: 404,
                    ..
                },
                ..
            }
        )
    }
}

fn call(action: &'static str, target: &str) -> impl FnOnce(bollard::errors::Error) -> DockerError {
    let target = target.to_owned();
    move |source| DockerError::Call {
        action,
        target,
        source,
    }
}

/// What a container is, apart from its GPUs.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ContainerSpec {
    /// Container name (Mesos uses `mesos-<ContainerID>`).
    pub name: String,
    /// Image reference.
    pub image: String,
    /// Command and arguments; empty keeps the image's.
    pub cmd: Vec<String>,
    /// The task's own `KEY=VALUE` environment; the plan's variables override equal keys.
    pub env: Vec<String>,
}

/// A GPU container found running after a restart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecoveredContainer {
    /// Docker's container id.
    pub docker_id: String,
    /// Docker's container name, without the leading `/`.
    pub docker_name: String,
    /// The Mesos ContainerID parsed from the name.
    pub mesos_container_id: String,
    /// Minors of the inventory GPUs the container was given, ascending.
    pub gpu_minors: Vec<u32>,
    /// Minors of `/dev/nvidia<minor>` nodes it was given that the inventory does not know.
    pub unknown_minors: Vec<u32>,
}

/// `HostConfig.Devices` for a plan, each with `rwm`.
pub fn host_devices(plan: &LaunchPlan) -> Vec<BollardDevice> {
    plan.devices
        .iter()
        .map(|d| BollardDevice {
            path_on_host: Some(d.host.display().to_string()),
            path_in_container: Some(d.container.display().to_string()),
            cgroup_permissions: Some(DeviceMapping::PERMISSIONS.to_owned()),
        })
        .collect()
}

/// The `HostConfig` carrying a plan's devices, driver volume, other binds and cpuset, as
/// [`LaunchPlan::cli_args`] gives them to `docker run`.
pub fn host_config(plan: &LaunchPlan) -> HostConfig {
    let mut binds: Vec<String> = plan.volume.iter().map(|v| v.bind_spec()).collect();
    binds.extend(plan.binds.iter().cloned());
    HostConfig {
        devices: Some(host_devices(plan)),
        binds: (!binds.is_empty()).then_some(binds),
        volume_driver: plan
            .volume
            .as_ref()
            .and_then(|v| v.volume_driver())
            .map(str::to_owned),
        cpuset_cpus: plan.cpuset.as_ref().map(|p| p.cpus.to_string()),
        cpuset_mems: plan
            .cpuset
            .as_ref()
            .and_then(|p| p.mems.as_ref())
            .map(ToString::to_string),
        ..Default::default()
    }
}

/// The create body for `spec` with `plan`: the task's env, then the plan's (which wins).
pub fn create_body(spec: &ContainerSpec, plan: &LaunchPlan) -> ContainerCreateBody {
    let planned: Vec<&str> = plan.env.iter().map(|(k, _)| k.as_str()).collect();
    let mut env: Vec<String> = spec
        .env
        .iter()
        .filter(|kv| !planned.contains(&kv.split_once('=').map_or(kv.as_str(), |(k, _)| k)))
        .cloned()
        .collect();
    env.extend(plan.env_strings());
    ContainerCreateBody {
        image: Some(spec.image.clone()),
        cmd: (!spec.cmd.is_empty()).then(|| spec.cmd.clone()),
        env: Some(env),
        host_config: Some(host_config(plan)),
        ..Default::default()
    }
}

/// The Mesos ContainerID in a Docker container name, as Mesos's `parse()` finds it.
pub fn mesos_container_id(docker_name: &str) -> Option<&str> {
    let name = docker_name.strip_prefix('/').unwrap_or(docker_name);
    let rest = name.strip_prefix(MESOS_NAME_PREFIX)?;
    let id = if rest.contains('.') {
        let parts: Vec<&str> = rest.split('.').collect();
        if !(2..=3).contains(&parts.len()) {
            return None;
        }
        parts[1]
    } else {
        rest
    };
    is_uuid(id).then_some(id)
}

fn is_uuid(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 36
        && b.iter().enumerate().all(|(i, c)| match i {
            8 | 13 | 18 | 23 => *c == b'-',
            _ => c.is_ascii_hexdigit(),
        })
}

/// The minor of a host node path `…/nvidia<minor>`, if it names a GPU node.
pub fn gpu_minor(path_on_host: &str) -> Option<u32> {
    let name = Path::new(path_on_host).file_name()?.to_str()?;
    let digits = name.strip_prefix("nvidia")?;
    if digits.is_empty()
        || !digits.bytes().all(|b| b.is_ascii_digit())
        || (digits.len() > 1 && digits.starts_with('0'))
    {
        return None;
    }
    digits.parse().ok()
}

/// Splits a container's devices into inventory GPU minors and unknown GPU-node minors.
pub fn held_minors(devices: &[BollardDevice], gpus: &[Gpu]) -> (Vec<u32>, Vec<u32>) {
    let mut known = Vec::new();
    let mut unknown = Vec::new();
    for minor in devices
        .iter()
        .filter_map(|d| d.path_on_host.as_deref().and_then(gpu_minor))
    {
        if gpus.iter().any(|g| g.minor == minor) {
            known.push(minor)
        } else {
            unknown.push(minor)
        }
    }
    for v in [&mut known, &mut unknown] {
        v.sort_unstable();
        v.dedup();
    }
    (known, unknown)
}

/// A connection to the Docker daemon.
#[derive(Debug, Clone)]
pub struct DockerClient {
    docker: Docker,
    /// The daemon's endpoint (`unix:///PATH`), as owner records name it.
    endpoint: String,
}

/// The endpoint of the daemon at unix socket `socket` (`unix:///var/run/docker.sock`), as the
/// pool's owner records name a container's daemon.
pub fn endpoint(socket: &Path) -> String {
    format!("unix://{}", socket.display())
}

impl DockerClient {
    /// Connects to the daemon at `socket` and negotiates the API version (Docker 20.10+).
    pub async fn connect(socket: &Path) -> Result<DockerClient, DockerError> {
        let err = |source| DockerError::Connect {
            socket: socket.to_owned(),
            source,
        };
        let docker = Docker::connect_with_unix(&socket.to_string_lossy(), TIMEOUT_SECS, &MIN_API)
            .map_err(err)?;
        let docker = docker.negotiate_version().await.map_err(err)?;
        tracing::debug!(socket = %socket.display(), api = %docker.client_version(), "connected to dockerd");
        Ok(DockerClient {
            docker,
            endpoint: endpoint(socket),
        })
    }

    /// The daemon's endpoint (`unix:///PATH`).
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The bollard handle, for calls this type does not wrap.
    pub fn raw(&self) -> &Docker {
        &self.docker
    }

    /// The labels and environment of `image`.
    pub async fn image_info(&self, image: &str) -> Result<ImageInfo, DockerError> {
        let inspect = self
            .docker
            .inspect_image(image)
            .await
            .map_err(call("inspect image", image))?;
        let config = inspect.config.unwrap_or_default();
        Ok(ImageInfo {
            labels: config.labels.unwrap_or_default().into_iter().collect(),
            env: config.env.unwrap_or_default(),
        })
    }

    /// Creates (does not start) a container for `spec` with `plan`; returns its id.
    #[tracing::instrument(skip_all, fields(name = %spec.name, image = %spec.image))]
    pub async fn create(
        &self,
        spec: &ContainerSpec,
        plan: &LaunchPlan,
    ) -> Result<String, DockerError> {
        let options = CreateContainerOptionsBuilder::default()
            .name(&spec.name)
            .build();
        let created = self
            .docker
            .create_container(Some(options), create_body(spec, plan))
            .await
            .map_err(call("create container", &spec.name))?;
        for warning in &created.warnings {
            tracing::warn!(%warning, "docker create warning");
        }
        tracing::info!(id = %created.id, devices = plan.devices.len(), volume = plan.volume.is_some(), "created container");
        Ok(created.id)
    }

    /// Starts a created container.
    pub async fn start(&self, container: &str) -> Result<(), DockerError> {
        self.docker
            .start_container(container, None)
            .await
            .map_err(call("start container", container))
    }

    /// Waits for a container to stop and returns its exit code.
    pub async fn wait(&self, container: &str) -> Result<i64, DockerError> {
        let mut stream = self
            .docker
            .wait_container(container, None::<WaitContainerOptions>);
        match stream.next().await {
            Some(Ok(resp)) => Ok(resp.status_code),
            Some(Err(bollard::errors::Error::DockerContainerWaitError { code, .. })) => Ok(code),
            Some(Err(source)) => Err(call("wait for container", container)(source)),
            None => Err(DockerError::Incomplete {
                action: "wait for container",
                target: container.to_owned(),
                field: "StatusCode",
            }),
        }
    }

    /// Stops a container: SIGTERM, then SIGKILL after `grace_secs` (`docker stop -t`).
    pub async fn stop(&self, container: &str, grace_secs: i32) -> Result<(), DockerError> {
        let options = StopContainerOptionsBuilder::default().t(grace_secs).build();
        match self.docker.stop_container(container, Some(options)).await {
            // 304: already stopped.
            Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 304, ..
            }) => Ok(()),
            other => other.map_err(call("stop container", container)),
        }
    }

    /// Runs a created container in the foreground, as `docker run` does: attaches to its output
    /// before starting it (so nothing a short-lived container
    /// prints is lost), starts it, passes its output to `out` (`true` for stderr), stops it
    /// (`docker stop -t grace_secs`) each time `stops` yields, and returns its exit code once it
    /// has ended and its output is drained (at most [`OUTPUT_DRAIN`] after its end).
    pub async fn run_foreground(
        &self,
        container: &str,
        grace_secs: i32,
        stops: impl Stream<Item = ()>,
        out: impl FnMut(bool, &[u8]),
    ) -> Result<i64, DockerError> {
        let attached = self.attach_output(container).await?;
        self.start(container).await?;
        let output = attached.forward(out);
        tokio::pin!(output);
        let wait = self.wait(container);
        tokio::pin!(wait);
        tokio::pin!(stops);
        let mut output_done = false;
        let mut stops_done = false;
        let code = loop {
            tokio::select! {
                code = &mut wait => break code?,
                result = &mut output, if !output_done => {
                    output_done = true;
                    if let Err(e) = result {
                        tracing::warn!(container, error = %e, "lost the container's output");
                    }
                }
                stop = stops.next(), if !stops_done => match stop {
                    Some(()) => {
                        tracing::info!(container, grace_secs, "stopping the container");
                        if let Err(e) = self.stop(container, grace_secs).await {
                            tracing::error!(container, error = %e, "cannot stop the container");
                        }
                    }
                    None => stops_done = true,
                },
            }
        };
        if !output_done && tokio::time::timeout(OUTPUT_DRAIN, output).await.is_err() {
            tracing::warn!(container, "the container's output did not end with it");
        }
        Ok(code)
    }

    /// Attaches to a created container's stdout and stderr *before* it is started, as
    /// `docker run` does, so that nothing a short-lived container prints is lost (following
    /// its logs after the start races with its exit). [`ContainerOutput::forward`] copies it.
    pub async fn attach_output(&self, container: &str) -> Result<ContainerOutput, DockerError> {
        let options = AttachContainerOptionsBuilder::default()
            .stdout(true)
            .stderr(true)
            .stream(true)
            .logs(true)
            .build();
        let attached = self
            .docker
            .attach_container(container, Some(options))
            .await
            .map_err(call("attach to container", container))?;
        Ok(ContainerOutput {
            container: container.to_owned(),
            stream: attached.output,
        })
    }

    /// Removes a container, killing it first when `force`.
    pub async fn remove(&self, container: &str, force: bool) -> Result<(), DockerError> {
        let options = RemoveContainerOptionsBuilder::default()
            .force(force)
            .build();
        self.docker
            .remove_container(container, Some(options))
            .await
            .map_err(call("remove container", container))
    }

    /// A container's `.State.Status` (`running`, `exited`, …); `None` when there is no such
    /// container.
    pub async fn container_status(&self, container: &str) -> Result<Option<String>, DockerError> {
        match self
            .docker
            .inspect_container(container, None::<InspectContainerOptions>)
            .await
        {
            Ok(inspect) => {
                Ok(Some(inspect.state.and_then(|s| s.status).map_or_else(
                    || "in an unknown state".to_owned(),
                    |s| s.to_string(),
                )))
            }
            Err(source) => {
                let e = call("inspect container", container)(source);
                if e.is_not_found() { Ok(None) } else { Err(e) }
            }
        }
    }

    /// `HostConfig.Devices` of a container, as Docker recorded them.
    pub async fn devices(&self, container: &str) -> Result<Vec<BollardDevice>, DockerError> {
        let inspect = self
            .docker
            .inspect_container(container, None::<InspectContainerOptions>)
            .await
            .map_err(call("inspect container", container))?;
        Ok(inspect
            .host_config
            .and_then(|h| h.devices)
            .unwrap_or_default())
    }

    /// Minors of the inventory `gpus` a container was given, ascending.
    pub async fn gpu_minors(&self, container: &str, gpus: &[Gpu]) -> Result<Vec<u32>, DockerError> {
        Ok(held_minors(&self.devices(container).await?, gpus).0)
    }

    /// The GPUs held by Mesos's running (or paused, or restarting) Docker containers, so an
    /// agent restart re-books them instead of handing them out again.
    #[tracing::instrument(skip_all)]
    pub async fn recover(&self, gpus: &[Gpu]) -> Result<Vec<RecoveredContainer>, DockerError> {
        let filters: HashMap<&str, Vec<&str>> = [
            ("status", vec!["running", "paused", "restarting"]),
            ("name", vec![MESOS_NAME_PREFIX]),
        ]
        .into();
        let options = ListContainersOptionsBuilder::default()
            .all(true)
            .filters(&filters)
            .build();
        let listed = self
            .docker
            .list_containers(Some(options))
            .await
            .map_err(call("list containers", "mesos-*"))?;
        let mut found = Vec::new();
        for summary in listed {
            let Some(id) = summary.id else { continue };
            let names = summary.names.unwrap_or_default();
            let Some((name, mesos_id)) = names
                .iter()
                .find_map(|n| mesos_container_id(n).map(|m| (n.trim_start_matches('/'), m)))
            else {
                continue;
            };
            let devices = match self.devices(&id).await {
                Ok(d) => d,
                // Removed between list and inspect: it holds nothing any more.
                Err(e) if e.is_not_found() => continue,
                Err(e) => return Err(e),
            };
            let (gpu_minors, unknown_minors) = held_minors(&devices, gpus);
            if !unknown_minors.is_empty() {
                tracing::warn!(
                    container = name,
                    ?unknown_minors,
                    "container holds GPU nodes the inventory does not know"
                );
            }
            if gpu_minors.is_empty() && unknown_minors.is_empty() {
                continue;
            }
            tracing::info!(
                container = name,
                mesos = mesos_id,
                ?gpu_minors,
                "recovered GPUs of a running container"
            );
            found.push(RecoveredContainer {
                docker_id: id.clone(),
                docker_name: name.to_owned(),
                mesos_container_id: mesos_id.to_owned(),
                gpu_minors,
                unknown_minors,
            });
        }
        found.sort_by(|a, b| a.docker_name.cmp(&b.docker_name));
        Ok(found)
    }
}

/// A container's stdout and stderr, attached before its start
/// ([`DockerClient::attach_output`]).
pub struct ContainerOutput {
    container: String,
    stream: Pin<Box<dyn Stream<Item = Result<LogOutput, bollard::errors::Error>> + Send>>,
}

impl std::fmt::Debug for ContainerOutput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ContainerOutput")
            .field("container", &self.container)
            .finish_non_exhaustive()
    }
}

impl ContainerOutput {
    /// Copies the output until the container ends, calling `out` with each chunk (`true` for
    /// stderr).
    pub async fn forward(mut self, mut out: impl FnMut(bool, &[u8])) -> Result<(), DockerError> {
        while let Some(chunk) = self.stream.next().await {
            match chunk.map_err(call("read the output of container", &self.container))? {
                LogOutput::StdErr { message } => out(true, &message),
                LogOutput::StdOut { message } | LogOutput::Console { message } => {
                    out(false, &message)
                }
                LogOutput::StdIn { .. } => {}
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::args::VolumeMount;
    use mesos_gpu_grant::Grant;
    use mesos_gpu_node::devices::{DeviceNode, DeviceNodes, GpuNode};
    use mesos_gpu_node::inventory::DevNum;
    use mesos_gpu_placement::numa::Pinning;
    use proptest::prelude::*;
    use std::path::PathBuf;

    const ID: &str = "3d8a52b4-1c5e-4f5a-9c1e-2b7d9a0e6f11";

    fn gpu(minor: u32) -> Gpu {
        Gpu {
            index: minor,
            minor,
            uuid: format!("GPU-{minor}"),
            name: "sim".to_owned(),
            memory_total: 0,
            pci_bus_id: String::new(),
            numa_node: None,
            compute_capability: None,
            healthy: true,
        }
    }

    fn dev(host: &str) -> BollardDevice {
        BollardDevice {
            path_on_host: Some(host.to_owned()),
            path_in_container: Some(host.to_owned()),
            cgroup_permissions: Some("rwm".to_owned()),
        }
    }

    #[test]
    fn mesos_names_parse_like_mesos() {
        assert_eq!(mesos_container_id(&format!("/mesos-{ID}")), Some(ID));
        assert_eq!(mesos_container_id(&format!("mesos-{ID}")), Some(ID));
        assert_eq!(
            mesos_container_id(&format!("/mesos-0fa1b2c3-S0.{ID}")),
            Some(ID)
        );
        assert_eq!(
            mesos_container_id(&format!("/mesos-0fa1b2c3-S0.{ID}.executor")),
            Some(ID)
        );
        assert_eq!(mesos_container_id("/mesos-not-a-uuid"), None);
        assert_eq!(mesos_container_id(&format!("/other-{ID}")), None);
        assert_eq!(mesos_container_id(&format!("/mesos-a.b.{ID}.d")), None);
        assert_eq!(mesos_container_id(&format!("/xmesos-{ID}")), None);
    }

    #[test]
    fn gpu_nodes_are_recognised_by_name() {
        assert_eq!(gpu_minor("/dev/nvidia0"), Some(0));
        assert_eq!(gpu_minor("/tmp/root/nvidia17"), Some(17));
        for other in [
            "/dev/nvidiactl",
            "/dev/nvidia-uvm",
            "/dev/nvidia-uvm-tools",
            "/dev/nvidia",
            "/dev/nvidia01",
            "/dev/null",
            "/dev/nvidia-caps/nvidia-cap1",
        ] {
            assert_eq!(gpu_minor(other), None, "{other}");
        }
    }

    #[test]
    fn held_minors_split_known_and_unknown() {
        let devices = [
            dev("/dev/nvidiactl"),
            dev("/dev/nvidia3"),
            dev("/dev/nvidia1"),
            dev("/dev/nvidia9"),
            dev("/dev/nvidia1"),
        ];
        assert_eq!(
            held_minors(&devices, &[gpu(0), gpu(1), gpu(3)]),
            (vec![1, 3], vec![9])
        );
    }

    #[test]
    fn host_config_matches_cli_args() {
        let g = gpu(2);
        let node = |name: &str, major, minor| DeviceNode {
            path: PathBuf::from("/dev").join(name),
            dev: DevNum { major, minor },
        };
        let nodes = DeviceNodes {
            control: vec![node("nvidiactl", 195, 255), node("nvidia-uvm", 510, 0)],
            gpus: vec![GpuNode {
                index: g.index,
                node: node(&format!("nvidia{}", g.minor), 195, g.minor),
            }],
        };
        let grant = Grant::new(&nodes, &[], vec![g], vec![], None)
            .expect("grant")
            .pinned(Some(Pinning {
                cpus: "0-3".parse().expect("list"),
                mems: Some("0".parse().expect("list")),
            }));
        let mut plan = LaunchPlan::new(&grant, &ImageInfo::default(), None).expect("plan");
        plan.volume = Some(VolumeMount::Named {
            plugin: "nvidia-docker".into(),
            name: "nvidia_driver_1.0".into(),
        });
        plan.binds = vec!["/run/mps/pipe:/run/mps/pipe".into()];
        plan.env = vec![("NVIDIA_VISIBLE_DEVICES".into(), "GPU-2".into())];
        let hc = host_config(&plan);
        let devices = hc.devices.expect("devices");
        let from_hc: Vec<String> = devices
            .iter()
            .map(|d| format!("--device={}", d.path_on_host.clone().expect("host")))
            .collect();
        assert_eq!(from_hc, plan.cli_args()[..3]);
        assert!(
            devices
                .iter()
                .all(|d| d.cgroup_permissions.as_deref() == Some("rwm"))
        );
        assert_eq!(
            hc.binds,
            Some(vec![
                "nvidia_driver_1.0:/usr/local/nvidia:ro".to_owned(),
                "/run/mps/pipe:/run/mps/pipe".to_owned()
            ])
        );
        assert_eq!(hc.volume_driver.as_deref(), Some("nvidia-docker"));
        assert_eq!(
            (hc.cpuset_cpus.as_deref(), hc.cpuset_mems.as_deref()),
            (Some("0-3"), Some("0"))
        );
        assert!(plan.cli_args().contains(&"--cpuset-cpus=0-3".to_owned()));

        let spec = ContainerSpec {
            name: "x".into(),
            image: "img".into(),
            cmd: vec![],
            env: vec![
                "A=1".into(),
                "NVIDIA_VISIBLE_DEVICES=all".into(),
                "B".into(),
            ],
        };
        let body = create_body(&spec, &plan);
        assert_eq!(
            body.env,
            Some(vec![
                "A=1".to_owned(),
                "B".to_owned(),
                "NVIDIA_VISIBLE_DEVICES=GPU-2".to_owned()
            ])
        );
        assert_eq!(body.cmd, None);
    }

    proptest! {
        #[test]
        fn name_parsing_never_panics(s in ".*") {
            let _ = mesos_container_id(&s);
            let _ = gpu_minor(&s);
        }
    }
}
