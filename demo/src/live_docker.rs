//! `demo --live` with a Docker daemon: DOCKER apps become real containers through the
//! [`DockerBridge`], drawing their GPUs from the same lifecycle isolator as the MESOS apps.
//!
//! Facts relied on:
//! - The bridge names containers `mesos-<ContainerID>` and accepts only UUID ids (Mesos's own
//!   `parse()`), so each app gets a UUID-form id derived from its app id, its sequence number in
//!   the run and the process id; the mapping is in the report.
//! - Nothing is pulled (no network): the image is a local one; when it is missing it is built
//!   `FROM scratch` with Debian's static `/bin/busybox` (`busybox-static`), and removed at the
//!   end only because the demo built it.
//! - A busybox `sleep` as PID 1 ignores SIGTERM, so a finished app's container is stopped with
//!   no grace (SIGKILL), waited for, its GPUs released, then removed.

use std::collections::BTreeMap;
use std::hash::{DefaultHasher, Hash as _, Hasher as _};
use std::path::Path;
use std::process::Command;
use std::sync::Arc;

use mesos_gpu_docker::args::DriverSpec;
use mesos_gpu_docker::bridge::{BridgedContainer, DockerBridge};
use mesos_gpu_docker::client::DockerClient;
use mesos_gpu_isolator::{lifecycle::ContainerId, lifecycle::Isolator};
use mesos_gpu_node::inventory::Gpu;
use mesos_gpu_os::fsmode;
use serde::Serialize;

use mesos_gpu_os::chain::error_chain;

use crate::error::DemoError;

/// The image the live DOCKER containers run unless told otherwise (built `FROM scratch` with
/// `/bin/busybox` when missing, and removed at exit).
pub const DEFAULT_IMAGE: &str = "mesos-gpu-demo-busybox:latest";

/// What each container runs (long enough to outlive the replay; killed when its app finishes).
const CMD: [&str; 2] = ["sleep", "600"];

/// One Docker container the demo started.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct LiveContainer {
    /// The app's container id in the stream.
    pub(crate) app: String,
    /// The UUID-form ContainerID given to the bridge.
    pub(crate) container_id: String,
    /// Docker's name, `mesos-<container_id>`.
    pub(crate) name: String,
    /// Docker's container id.
    pub(crate) docker_id: String,
    /// GPU minors given to it.
    pub(crate) gpu_minors: Vec<u32>,
    /// Exit code once stopped (137: killed), `None` while running.
    pub(crate) exit: Option<i64>,
    /// True once the container was removed.
    pub(crate) removed: bool,
}

/// Real Docker containers for the DOCKER apps of a live run.
pub(crate) struct LiveDocker {
    runtime: tokio::runtime::Runtime,
    bridge: DockerBridge,
    image: String,
    built: bool,
    seq: u64,
    running: BTreeMap<ContainerId, BridgedContainer>,
    /// Every container started, in order.
    pub(crate) started: Vec<LiveContainer>,
}

impl LiveDocker {
    /// Connects to the daemon at `socket`; `Ok(Err(reason))` when none answers.
    pub(crate) fn connect(
        isolator: Arc<Isolator>,
        driver: Option<DriverSpec>,
        gpus: Vec<Gpu>,
        image: &str,
        socket: &Path,
    ) -> Result<Result<LiveDocker, String>, DemoError> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|source| DemoError::Runtime { source })?;
        let client = match runtime.block_on(DockerClient::connect(socket)) {
            Ok(client) => client,
            Err(e) => return Ok(Err(error_chain(&e))),
        };
        let built = match runtime.block_on(client.image_info(image)) {
            Ok(_) => false,
            Err(e) if e.is_not_found() => {
                build_image(image)?;
                true
            }
            Err(source) => {
                return Err(DemoError::Inspect {
                    image: image.to_owned(),
                    source,
                });
            }
        };
        Ok(Ok(LiveDocker {
            runtime,
            bridge: DockerBridge::new(isolator, client, driver, gpus),
            image: image.to_owned(),
            built,
            seq: 0,
            running: BTreeMap::new(),
            started: Vec::new(),
        }))
    }

    /// The image the containers run, and whether the demo built it.
    pub(crate) fn image(&self) -> (&str, bool) {
        (&self.image, self.built)
    }

    /// Starts app `app`'s container with `requested` GPUs.
    pub(crate) fn launch(
        &mut self,
        app: &ContainerId,
        requested: f64,
    ) -> Result<&BridgedContainer, DemoError> {
        self.seq += 1;
        let id = ContainerId::new(uuid_for(app.as_str(), self.seq))?;
        let cmd: Vec<String> = CMD.iter().map(|s| (*s).to_owned()).collect();
        let container = self
            .runtime
            .block_on(self.bridge.launch(&id, requested, &self.image, &cmd))
            .map_err(|source| DemoError::Start {
                app: app.clone(),
                source: Box::new(source),
            })?;
        tracing::info!(app = %app, container = %id, docker = %container.docker_id, "demo Docker container started");
        self.started.push(LiveContainer {
            app: app.to_string(),
            container_id: id.to_string(),
            name: container.name.clone(),
            docker_id: container.docker_id.clone(),
            gpu_minors: container.gpus.iter().map(|g| g.minor).collect(),
            exit: None,
            removed: false,
        });
        Ok(self.running.entry(app.clone()).or_insert(container))
    }

    /// App `app` finished: stops its container, releases its GPUs, removes it.
    pub(crate) fn finish(&mut self, app: &ContainerId) -> Result<(), DemoError> {
        let Some(container) = self.running.remove(app) else {
            return Err(DemoError::NotRunning { app: app.clone() });
        };
        let code = self.runtime.block_on(async {
            self.bridge.stop(&container, 0).await?;
            self.bridge.wait_and_release(&container).await
        });
        let code = code.map_err(|source| DemoError::Stop {
            app: app.clone(),
            name: container.name.clone(),
            source: Box::new(source),
        })?;
        self.runtime
            .block_on(self.bridge.client().remove(&container.docker_id, true))
            .map_err(|source| DemoError::RemoveContainer {
                name: container.name.clone(),
                source,
            })?;
        if let Some(record) = self
            .started
            .iter_mut()
            .find(|c| c.docker_id == container.docker_id)
        {
            record.exit = Some(code);
            record.removed = true;
        }
        Ok(())
    }

    /// Stops and removes whatever still runs, and the image when the demo built it.
    pub(crate) fn shutdown(mut self) -> Result<(), DemoError> {
        let mut first_err = None;
        let apps: Vec<ContainerId> = self.running.keys().cloned().collect();
        for app in apps {
            if let Err(e) = self.finish(&app) {
                first_err.get_or_insert(e);
            }
        }
        if self.built
            && let Err(e) = docker(&["image", "rm", "-f", "--no-prune", &self.image])
        {
            first_err.get_or_insert(e);
        }
        first_err.map_or(Ok(()), Err)
    }
}

/// A UUID-form id for the `seq`th container of app `app` in this process.
fn uuid_for(app: &str, seq: u64) -> String {
    let half = |salt: u64| {
        let mut h = DefaultHasher::new();
        (salt, app, seq, std::process::id()).hash(&mut h);
        h.finish()
    };
    let (hi, lo) = (half(0), half(1));
    // Version 8 (custom) and the RFC 4122 variant bits.
    let hi = (hi & !0xF000) | 0x8000;
    let lo = (lo & !(0xC << 60)) | (0x8 << 60);
    format!(
        "{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
        hi >> 32,
        (hi >> 16) & 0xFFFF,
        hi & 0xFFFF,
        lo >> 48,
        lo & 0xFFFF_FFFF_FFFF
    )
}

/// Builds `image` `FROM scratch` with `/bin/busybox` (nothing pulled).
fn build_image(image: &str) -> Result<(), DemoError> {
    let context = |what| move |source| DemoError::ImageContext { what, source };
    let ctx = fsmode::private_tempdir("mesos-gpu-demo-image-")
        .map_err(context("cannot create a temp directory"))?;
    std::fs::copy("/bin/busybox", ctx.path().join("busybox")).map_err(context(
        "image is missing and cannot be built: no static /bin/busybox (apt install busybox-static)",
    ))?;
    fsmode::write_file(
        &ctx.path().join("Dockerfile"),
        b"FROM scratch\nCOPY busybox /bin/busybox\nRUN [\"/bin/busybox\", \"--install\", \"-s\", \"/bin\"]\n",
        fsmode::PRIVATE_FILE,
    )
    .map_err(context("cannot write the Dockerfile"))?;
    let dir = ctx.path().to_string_lossy().into_owned();
    docker(&["build", "-q", "-t", image, &dir]).map_err(|e| DemoError::BuildImage {
        image: image.to_owned(),
        source: Box::new(e),
    })
}

fn docker(args: &[&str]) -> Result<(), DemoError> {
    let out = Command::new("docker")
        .args(args)
        .output()
        .map_err(|source| DemoError::Run {
            program: "docker",
            source,
        })?;
    if !out.status.success() {
        return Err(DemoError::DockerCommand {
            args: args.join(" "),
            status: out.status,
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use mesos_gpu_docker::client::mesos_container_id;

    #[test]
    fn derived_ids_are_uuids_and_distinct() {
        let a = uuid_for("web-1", 1);
        let b = uuid_for("web-1", 2);
        let c = uuid_for("web-2", 1);
        assert_ne!(a, b);
        assert_ne!(a, c);
        for id in [&a, &b, &c] {
            let name = format!("mesos-{id}");
            assert_eq!(mesos_container_id(&name), Some(id.as_str()), "{id}");
            assert_eq!(&id[14..15], "8");
        }
        assert_eq!(a, uuid_for("web-1", 1));
    }
}
