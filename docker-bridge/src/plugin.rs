//! A Docker volume plugin serving nvidia-docker 1.0's `nvidia_driver_<version>` volume from the
//! volume manager, so `--volume-driver=nvidia-docker --volume=nvidia_driver_<v>:/usr/local/nvidia:ro`
//! keeps working.
//!
//! Facts relied on (`docs/reference/nvidia-docker.md` §2):
//! - Docker POSTs JSON to `/Plugin.Activate` (with an **empty** body), then
//!   `/VolumeDriver.{Create,Remove,Mount,Unmount,Path,Get,List,Capabilities}`; errors are the
//!   `Err` string of an HTTP 200 answer. A driver that answers `Get` for a name it does not
//!   serve makes Docker believe the volume exists, so unknown names must get an `Err`.
//! - Docker gives a plugin a short deadline (nvidia-docker's own server: 5 s); building the
//!   volume inside `Create` took 7–9 s on some hosts and failed runs with `EOF`. So volumes are
//!   built in the background ([`DriverVolumes`]) at start and when the driver changes, and a
//!   request for a volume still being built waits at most a short time, then gets a clear `Err`.
//! - Names follow `^([a-zA-Z0-9_.-]+)_([0-9.]+)$`; the base must be `nvidia_driver` and the
//!   version this node's driver version.
//! - `Remove` does not delete the directory: the volume manager owns it, and Mesos containers
//!   may bind it directly (nvidia-docker `rm -rf`'d it).

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full, LengthLimitError, Limited};
use hyper::body::Incoming;
use hyper::header::{CONTENT_TYPE, HeaderValue};
use hyper::{Request, Response, StatusCode};
use serde_json::{Value, json};
use tokio::sync::watch;

use mesos_gpu_os::error_chain;
use mesos_gpu_volume::plan::DriverSource;
use mesos_gpu_volume::{DriverVersion, LdCache, VolumeManager};

use crate::args::{DRIVER_VOLUME_BASE, volume_name};

/// The default plugin socket, where Docker discovers `nvidia-docker`.
pub const DEFAULT_SOCKET: &str = "/run/docker/plugins/nvidia-docker.sock";
/// How long a request waits for a volume being built before answering with an `Err`.
pub const DEFAULT_BUILD_WAIT: Duration = Duration::from_secs(2);
const PLUGIN_CONTENT_TYPE: &str = "application/vnd.docker.plugins.v1+json";
/// The largest request body read. Docker's requests are `{"Name": …, "Opts": {…}}`, well under
/// a KiB; a larger body is answered 413 as soon as it passes this size, never held in memory.
pub const MAX_BODY_BYTES: usize = 64 * 1024;

/// Why a driver volume could not be built.
pub type BuildError = Box<dyn std::error::Error + Send + Sync>;

/// Builds the driver volume for a driver version (the volume manager, in production).
pub trait VolumeBuilder: Send + Sync + 'static {
    /// Creates or verifies the volume for `version` and returns its host directory. Blocking:
    /// it runs on a blocking thread, never inside a request.
    fn build(&self, version: &str) -> Result<PathBuf, BuildError>;

    /// Records `holder` (a Docker mount) as using the volume of `version` (`held`), or no longer
    /// (`!held`), so that `mesos-gpu volume list` shows it and `volume gc` keeps the volume.
    /// Blocking, and quick (a file in the volume root).
    fn hold(&self, version: &str, holder: &str, held: bool) -> Result<(), BuildError>;
}

/// Builds volumes with the volume manager from the driver files under a root (`/` normally).
#[derive(Debug, Clone)]
pub struct ManagerBuilder {
    manager: VolumeManager,
    source: DriverSource,
}

impl ManagerBuilder {
    /// Volumes under `manager`, from the driver `source` (its root, `/` normally, and the
    /// program search path).
    pub fn new(manager: VolumeManager, source: DriverSource) -> ManagerBuilder {
        ManagerBuilder { manager, source }
    }
}

impl VolumeBuilder for ManagerBuilder {
    fn build(&self, version: &str) -> Result<PathBuf, BuildError> {
        let version: DriverVersion = version.parse()?;
        let cache = LdCache::load(&self.source.root)?;
        let plan = self.manager.plan(&self.source, &cache, &version)?;
        Ok(self.manager.create(&plan)?.path)
    }

    fn hold(&self, version: &str, holder: &str, held: bool) -> Result<(), BuildError> {
        let version: DriverVersion = version.parse()?;
        if held {
            self.manager.acquire(&version, holder)?;
        } else {
            self.manager.release(&version, holder)?;
        }
        Ok(())
    }
}

/// Where the volume of the current driver stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VolumeState {
    /// No NVIDIA driver on the node.
    NoDriver,
    /// Being built for this version.
    Building {
        /// Driver version.
        version: String,
    },
    /// Built.
    Ready {
        /// Driver version.
        version: String,
        /// Host directory.
        path: PathBuf,
    },
    /// The build failed.
    Failed {
        /// Driver version.
        version: String,
        /// The error chain, flattened.
        reason: String,
    },
}

impl VolumeState {
    fn version(&self) -> Option<&str> {
        match self {
            VolumeState::NoDriver => None,
            VolumeState::Building { version }
            | VolumeState::Ready { version, .. }
            | VolumeState::Failed { version, .. } => Some(version),
        }
    }
}

/// The current driver's volume, built in the background.
pub struct DriverVolumes {
    builder: Arc<dyn VolumeBuilder>,
    state: watch::Sender<VolumeState>,
    // Serializes `set_driver` so two changes cannot interleave their state writes.
    changing: Mutex<()>,
}

impl std::fmt::Debug for DriverVolumes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DriverVolumes")
            .field("state", &*self.state.borrow())
            .finish()
    }
}

impl DriverVolumes {
    /// No driver yet; call [`DriverVolumes::set_driver`].
    pub fn new(builder: Arc<dyn VolumeBuilder>) -> Arc<DriverVolumes> {
        Arc::new(DriverVolumes {
            builder,
            state: watch::channel(VolumeState::NoDriver).0,
            changing: Mutex::new(()),
        })
    }

    /// The current state.
    pub fn state(&self) -> VolumeState {
        self.state.borrow().clone()
    }

    /// Records the node's driver version and, when it changed (or the last build failed),
    /// starts building its volume on a blocking thread. Must run inside a tokio runtime.
    pub fn set_driver(self: &Arc<Self>, version: Option<&str>) {
        let _guard = self
            .changing
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let current = self.state();
        let Some(version) = version else {
            if current != VolumeState::NoDriver {
                tracing::warn!("NVIDIA driver gone; the driver volume is no longer served");
                self.state.send_replace(VolumeState::NoDriver);
            }
            return;
        };
        let retry = matches!(&current, VolumeState::Failed { .. });
        if current.version() == Some(version) && !retry {
            return;
        }
        tracing::info!(version, previous = ?current.version(), "building the driver volume in the background");
        self.state.send_replace(VolumeState::Building {
            version: version.to_owned(),
        });
        let this = Arc::clone(self);
        let version = version.to_owned();
        tokio::task::spawn_blocking(move || {
            let started = std::time::Instant::now();
            let result = this.builder.build(&version);
            let _guard = this
                .changing
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if this.state().version() != Some(version.as_str()) {
                return; // The driver changed again while building; that build owns the state now.
            }
            let next = match result {
                Ok(path) => {
                    tracing::info!(version, path = %path.display(), elapsed_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX), "driver volume ready");
                    VolumeState::Ready { version, path }
                }
                Err(err) => {
                    let reason = error_chain(err.as_ref());
                    tracing::error!(version, %reason, "cannot build the driver volume");
                    VolumeState::Failed { version, reason }
                }
            };
            this.state.send_replace(next);
        });
    }

    /// Records Docker's mount `id` of the current volume as its holder (`held`), or no longer:
    /// the holder is `docker-<id>`. A failure is logged: the mount itself is not refused.
    async fn hold(&self, id: &str, held: bool) {
        let Some(version) = self.state().version().map(str::to_owned) else {
            return;
        };
        let holder = format!("docker-{id}");
        let builder = Arc::clone(&self.builder);
        let done = tokio::task::spawn_blocking(move || {
            builder
                .hold(&version, &holder, held)
                .map_err(|e| (holder, error_chain(e.as_ref())))
        })
        .await;
        match done {
            Ok(Ok(())) => {}
            Ok(Err((holder, reason))) => {
                tracing::warn!(holder, held, %reason, "cannot record a Docker mount of the driver volume")
            }
            Err(e) => {
                tracing::warn!(error = %e, "recording a Docker mount of the driver volume failed")
            }
        }
    }

    /// The state once it is no longer `Building`, or after `wait`, whichever is first.
    pub async fn settled(&self, wait: Duration) -> VolumeState {
        let mut rx = self.state.subscribe();
        let done = rx.wait_for(|s| !matches!(s, VolumeState::Building { .. }));
        match tokio::time::timeout(wait, done).await {
            Ok(Ok(state)) => state.clone(),
            _ => self.state(),
        }
    }
}

/// The plugin's HTTP handlers.
#[derive(Debug, Clone)]
pub struct PluginApi {
    volumes: Arc<DriverVolumes>,
    wait: Duration,
}

/// Why a named request is refused: the text of the reply's `Err`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PluginError {
    /// The body is not `{"Name": "…"}`.
    #[error("invalid request body: expected a JSON object with a string \"Name\"")]
    BadBody,
    /// The name is not `<base>_<version>`.
    #[error("bad volume format: {name} (expected {DRIVER_VOLUME_BASE}_<driver version>)")]
    BadFormat {
        /// The name as given.
        name: String,
    },
    /// The base is not `nvidia_driver`.
    #[error(
        "unsupported volume: {name} (this plugin serves {DRIVER_VOLUME_BASE}_<driver version> only)"
    )]
    Unsupported {
        /// The name as given.
        name: String,
    },
    /// The version is not this node's driver version.
    #[error(
        "invalid volume version: {name} (this node's NVIDIA driver is {current}; use {expected})"
    )]
    WrongVersion {
        /// The name as given.
        name: String,
        /// The node's driver version.
        current: String,
        /// The name to use.
        expected: String,
    },
    /// There is no driver, so no volume.
    #[error("no such volume: {name} (no NVIDIA driver on this node)")]
    NoDriver {
        /// The name as given.
        name: String,
    },
    /// The volume is still being built.
    #[error("volume {name} is still being built; retry in a few seconds")]
    Building {
        /// The name as given.
        name: String,
    },
    /// The build failed.
    #[error("volume {name} could not be built: {reason}")]
    BuildFailed {
        /// The name as given.
        name: String,
        /// Why.
        reason: String,
    },
}

fn split_name(name: &str) -> Option<(&str, &str)> {
    let (base, version) = name.rsplit_once('_')?;
    let base_ok = !base.is_empty()
        && base
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b));
    let version_ok =
        !version.is_empty() && version.bytes().all(|b| b.is_ascii_digit() || b == b'.');
    (base_ok && version_ok).then_some((base, version))
}

/// The `ID` Docker gives a mount (in `Mount` and `Unmount`), when there is one.
fn mount_id(body: &[u8]) -> Option<String> {
    let value: Value = serde_json::from_slice(body).ok()?;
    value.get("ID").and_then(Value::as_str).map(str::to_owned)
}

fn name_of(body: &[u8]) -> Result<String, PluginError> {
    let value: Value = serde_json::from_slice(body).map_err(|_| PluginError::BadBody)?;
    value
        .get("Name")
        .and_then(Value::as_str)
        .map(str::to_owned)
        .ok_or(PluginError::BadBody)
}

fn ok(mut reply: Value) -> Value {
    reply["Err"] = json!("");
    reply
}

impl PluginApi {
    /// Handlers over `volumes`, waiting at most `wait` for a volume being built.
    pub fn new(volumes: Arc<DriverVolumes>, wait: Duration) -> PluginApi {
        PluginApi { volumes, wait }
    }

    /// Checks `name` against the driver version of `state`.
    fn check(name: &str, state: &VolumeState) -> Result<(), PluginError> {
        let (base, version) = split_name(name).ok_or_else(|| PluginError::BadFormat {
            name: name.to_owned(),
        })?;
        if base != DRIVER_VOLUME_BASE {
            return Err(PluginError::Unsupported {
                name: name.to_owned(),
            });
        }
        let Some(current) = state.version() else {
            return Err(PluginError::NoDriver {
                name: name.to_owned(),
            });
        };
        if current != version {
            return Err(PluginError::WrongVersion {
                name: name.to_owned(),
                current: current.to_owned(),
                expected: volume_name(current),
            });
        }
        Ok(())
    }

    /// The directory of volume `name`, waiting a bounded time if it is being built.
    async fn mountpoint(&self, name: &str) -> Result<PathBuf, PluginError> {
        if split_name(name).is_none() {
            return Err(PluginError::BadFormat {
                name: name.to_owned(),
            });
        }
        let state = self.volumes.settled(self.wait).await;
        Self::check(name, &state)?;
        match state {
            VolumeState::Ready { path, .. } => Ok(path),
            VolumeState::Failed { reason, .. } => Err(PluginError::BuildFailed {
                name: name.to_owned(),
                reason,
            }),
            VolumeState::Building { .. } | VolumeState::NoDriver => Err(PluginError::Building {
                name: name.to_owned(),
            }),
        }
    }

    /// The reply to a POST of `body` to `path`, or `None` for an unknown path.
    pub async fn respond(&self, path: &str, body: &[u8]) -> Option<Value> {
        let reply = match path {
            "/Plugin.Activate" => json!({"Implements": ["VolumeDriver"]}),
            "/VolumeDriver.Capabilities" => json!({"Capabilities": {"Scope": "local"}}),
            "/VolumeDriver.List" => {
                let volumes = match self.volumes.state() {
                    VolumeState::Ready { version, path } => {
                        vec![json!({"Name": volume_name(&version), "Mountpoint": path})]
                    }
                    _ => vec![],
                };
                ok(json!({"Volumes": volumes}))
            }
            "/VolumeDriver.Create"
            | "/VolumeDriver.Mount"
            | "/VolumeDriver.Path"
            | "/VolumeDriver.Get" => match name_of(body) {
                Err(e) => json!({"Err": e.to_string()}),
                Ok(name) => match self.mountpoint(&name).await {
                    Err(e) => json!({"Err": e.to_string()}),
                    Ok(mountpoint) => match path {
                        "/VolumeDriver.Create" => ok(json!({})),
                        "/VolumeDriver.Mount" => {
                            if let Some(id) = mount_id(body) {
                                self.volumes.hold(&id, true).await;
                            }
                            ok(json!({"Mountpoint": mountpoint}))
                        }
                        "/VolumeDriver.Get" => ok(
                            json!({"Volume": {"Name": name, "Mountpoint": mountpoint, "Status": {}}}),
                        ),
                        _ => ok(json!({"Mountpoint": mountpoint})),
                    },
                },
            },
            "/VolumeDriver.Remove" | "/VolumeDriver.Unmount" => {
                match name_of(body)
                    .and_then(|name| Self::check(&name, &self.volumes.state()).map(|()| name))
                {
                    Ok(name) => {
                        if path == "/VolumeDriver.Remove" {
                            tracing::info!(volume = %name, "Docker forgot the driver volume; its directory stays with the volume manager");
                        } else if let Some(id) = mount_id(body) {
                            self.volumes.hold(&id, false).await;
                        }
                        ok(json!({}))
                    }
                    Err(e) => json!({"Err": e.to_string()}),
                }
            }
            _ => return None,
        };
        if let Some(err) = reply
            .get("Err")
            .and_then(Value::as_str)
            .filter(|e| !e.is_empty())
        {
            tracing::warn!(path, err, "volume plugin request refused");
        }
        Some(reply)
    }

    /// Serves one HTTP request (for hyper's `service_fn`).
    pub async fn handle(
        self: Arc<Self>,
        req: Request<Incoming>,
    ) -> Result<Response<Full<Bytes>>, hyper::Error> {
        let path = req.uri().path().to_owned();
        let method = req.method().clone();
        let body = match Limited::new(req.into_body(), MAX_BODY_BYTES)
            .collect()
            .await
        {
            Ok(body) => body.to_bytes(),
            Err(err) => match err.downcast::<hyper::Error>() {
                Ok(err) => return Err(*err),
                Err(err) => {
                    debug_assert!(err.is::<LengthLimitError>());
                    tracing::warn!(
                        path,
                        limit = MAX_BODY_BYTES,
                        "volume plugin request body too large"
                    );
                    let reply = json!({
                        "Err": format!("request body larger than {MAX_BODY_BYTES} bytes")
                    });
                    return Ok(plugin_reply(StatusCode::PAYLOAD_TOO_LARGE, &reply));
                }
            },
        };
        tracing::trace!(%method, path, body = %String::from_utf8_lossy(&body), "plugin request");
        let (status, reply) = match self.respond(&path, &body).await {
            Some(reply) if method == hyper::Method::POST => (StatusCode::OK, reply),
            Some(_) => (
                StatusCode::METHOD_NOT_ALLOWED,
                json!({"Err": format!("method {method} not allowed: POST only")}),
            ),
            None => (
                StatusCode::NOT_FOUND,
                json!({"Err": format!("unknown plugin endpoint {path}")}),
            ),
        };
        Ok(plugin_reply(status, &reply))
    }
}

/// A plugin answer: `reply` as JSON, with Docker's plugin content type.
fn plugin_reply(status: StatusCode, reply: &Value) -> Response<Full<Bytes>> {
    let mut resp = Response::new(Full::new(Bytes::from(format!("{reply}\n"))));
    *resp.status_mut() = status;
    resp.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(PLUGIN_CONTENT_TYPE));
    resp
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// Builds instantly into a fixed directory, or fails, or blocks until released.
    struct FakeBuilder {
        dir: PathBuf,
        fail: bool,
        gate: Mutex<Option<std::sync::mpsc::Receiver<()>>>,
        calls: AtomicUsize,
        /// Every `hold` call: (version, holder, held).
        holds: Mutex<Vec<(String, String, bool)>>,
    }

    impl VolumeBuilder for FakeBuilder {
        fn hold(&self, version: &str, holder: &str, held: bool) -> Result<(), BuildError> {
            self.holds
                .lock()
                .expect("lock")
                .push((version.to_owned(), holder.to_owned(), held));
            Ok(())
        }

        fn build(&self, version: &str) -> Result<PathBuf, BuildError> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            if let Some(gate) = self.gate.lock().expect("lock").take() {
                let _ = gate.recv();
            }
            if self.fail {
                return Err(std::io::Error::other("ld.so.cache has no libnvidia-ml").into());
            }
            Ok(self.dir.join(version))
        }
    }

    fn builder(fail: bool, gate: Option<std::sync::mpsc::Receiver<()>>) -> Arc<FakeBuilder> {
        Arc::new(FakeBuilder {
            dir: PathBuf::from("/vols"),
            fail,
            gate: Mutex::new(gate),
            calls: AtomicUsize::new(0),
            holds: Mutex::new(Vec::new()),
        })
    }

    async fn ready_api(version: &str) -> PluginApi {
        let volumes = DriverVolumes::new(builder(false, None));
        volumes.set_driver(Some(version));
        assert!(matches!(
            volumes.settled(Duration::from_secs(5)).await,
            VolumeState::Ready { .. }
        ));
        PluginApi::new(volumes, Duration::from_millis(50))
    }

    async fn call(api: &PluginApi, path: &str, body: &str) -> Value {
        api.respond(path, body.as_bytes())
            .await
            .expect("known path")
    }

    #[tokio::test]
    async fn activate_and_capabilities_accept_any_body() {
        let api = ready_api("550.54.14").await;
        for body in ["", "not json", "{}"] {
            assert_eq!(
                call(&api, "/Plugin.Activate", body).await,
                json!({"Implements": ["VolumeDriver"]})
            );
            assert_eq!(
                call(&api, "/VolumeDriver.Capabilities", body).await,
                json!({"Capabilities": {"Scope": "local"}})
            );
        }
        assert!(api.respond("/VolumeDriver.Nope", b"").await.is_none());
    }

    #[tokio::test]
    async fn the_current_volume_is_served() {
        let api = ready_api("550.54.14").await;
        let body = r#"{"Name":"nvidia_driver_550.54.14","Opts":{}}"#;
        assert_eq!(
            call(&api, "/VolumeDriver.Create", body).await,
            json!({"Err": ""})
        );
        let mount = json!({"Mountpoint": "/vols/550.54.14", "Err": ""});
        assert_eq!(
            call(
                &api,
                "/VolumeDriver.Mount",
                r#"{"Name":"nvidia_driver_550.54.14","ID":"x"}"#
            )
            .await,
            mount
        );
        assert_eq!(call(&api, "/VolumeDriver.Path", body).await, mount);
        assert_eq!(
            call(&api, "/VolumeDriver.Get", body).await,
            json!({"Volume": {"Name": "nvidia_driver_550.54.14", "Mountpoint": "/vols/550.54.14", "Status": {}}, "Err": ""})
        );
        assert_eq!(
            call(&api, "/VolumeDriver.List", "").await,
            json!({"Volumes": [{"Name": "nvidia_driver_550.54.14", "Mountpoint": "/vols/550.54.14"}], "Err": ""})
        );
        assert_eq!(
            call(&api, "/VolumeDriver.Unmount", body).await,
            json!({"Err": ""})
        );
        assert_eq!(
            call(&api, "/VolumeDriver.Remove", body).await,
            json!({"Err": ""})
        );
    }

    #[tokio::test]
    async fn docker_mounts_hold_the_volume_until_unmounted() {
        let fake = builder(false, None);
        let volumes = DriverVolumes::new(fake.clone());
        volumes.set_driver(Some("550.54.14"));
        let _ = volumes.settled(Duration::from_secs(5)).await;
        let api = PluginApi::new(volumes, Duration::from_secs(1));
        let body = r#"{"Name": "nvidia_driver_550.54.14", "ID": "abc123"}"#;
        assert_eq!(call(&api, "/VolumeDriver.Mount", body).await["Err"], "");
        assert_eq!(call(&api, "/VolumeDriver.Unmount", body).await["Err"], "");
        assert_eq!(
            *fake.holds.lock().expect("lock"),
            [
                ("550.54.14".to_owned(), "docker-abc123".to_owned(), true),
                ("550.54.14".to_owned(), "docker-abc123".to_owned(), false)
            ]
        );
    }

    #[tokio::test]
    async fn other_names_are_refused_with_err() {
        let api = ready_api("550.54.14").await;
        for (name, start) in [
            (
                "nvidia_driver_550.54.13",
                "invalid volume version: nvidia_driver_550.54.13 (this node's NVIDIA driver is 550.54.14; use nvidia_driver_550.54.14)",
            ),
            ("nvidia_driver", "bad volume format: nvidia_driver"),
            ("nvidia_driver_", "bad volume format"),
            ("nvidia_driver_abc", "bad volume format"),
            ("my volume_1.0", "bad volume format"),
            ("other_550.54.14", "unsupported volume: other_550.54.14"),
        ] {
            for path in [
                "/VolumeDriver.Create",
                "/VolumeDriver.Get",
                "/VolumeDriver.Mount",
                "/VolumeDriver.Remove",
            ] {
                let reply = call(&api, path, &json!({"Name": name}).to_string()).await;
                let err = reply["Err"].as_str().expect("Err");
                assert!(err.starts_with(start), "{path} {name}: {err}");
            }
        }
        for body in ["", "garbage", "{}", r#"{"Name":3}"#, "[]"] {
            let reply = call(&api, "/VolumeDriver.Get", body).await;
            assert!(
                reply["Err"]
                    .as_str()
                    .expect("Err")
                    .starts_with("invalid request body"),
                "{body}"
            );
        }
    }

    #[tokio::test]
    async fn a_volume_being_built_gets_a_clear_err_then_is_served() {
        let (release, gate) = std::sync::mpsc::channel();
        let b = builder(false, Some(gate));
        let volumes = DriverVolumes::new(b.clone());
        volumes.set_driver(Some("1.2.3"));
        let api = PluginApi::new(Arc::clone(&volumes), Duration::from_millis(100));
        let started = std::time::Instant::now();
        let reply = call(
            &api,
            "/VolumeDriver.Mount",
            r#"{"Name":"nvidia_driver_1.2.3"}"#,
        )
        .await;
        assert!(started.elapsed() < Duration::from_secs(2), "bounded wait");
        assert_eq!(
            reply["Err"],
            "volume nvidia_driver_1.2.3 is still being built; retry in a few seconds"
        );
        assert_eq!(
            call(&api, "/VolumeDriver.List", "").await["Volumes"],
            json!([])
        );
        release.send(()).expect("release");
        assert!(matches!(
            volumes.settled(Duration::from_secs(5)).await,
            VolumeState::Ready { .. }
        ));
        assert_eq!(
            call(
                &api,
                "/VolumeDriver.Mount",
                r#"{"Name":"nvidia_driver_1.2.3"}"#
            )
            .await["Mountpoint"],
            "/vols/1.2.3"
        );
        // Same version again: no rebuild.
        volumes.set_driver(Some("1.2.3"));
        assert_eq!(b.calls.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_driver_change_rebuilds_and_moves_the_served_version() {
        let b = builder(false, None);
        let volumes = DriverVolumes::new(b.clone());
        volumes.set_driver(Some("1.0"));
        volumes.settled(Duration::from_secs(5)).await;
        volumes.set_driver(Some("2.0"));
        let api = PluginApi::new(Arc::clone(&volumes), Duration::from_secs(5));
        assert_eq!(
            call(
                &api,
                "/VolumeDriver.Path",
                r#"{"Name":"nvidia_driver_2.0"}"#
            )
            .await["Mountpoint"],
            "/vols/2.0"
        );
        let old = call(
            &api,
            "/VolumeDriver.Path",
            r#"{"Name":"nvidia_driver_1.0"}"#,
        )
        .await;
        assert!(
            old["Err"]
                .as_str()
                .expect("Err")
                .starts_with("invalid volume version"),
            "{old}"
        );
        assert_eq!(b.calls.load(Ordering::SeqCst), 2);
        volumes.set_driver(None);
        let gone = call(
            &api,
            "/VolumeDriver.Path",
            r#"{"Name":"nvidia_driver_2.0"}"#,
        )
        .await;
        assert!(
            gone["Err"]
                .as_str()
                .expect("Err")
                .contains("no NVIDIA driver"),
            "{gone}"
        );
    }

    #[tokio::test]
    async fn a_failed_build_is_reported_and_retried_on_the_next_set() {
        let b = builder(true, None);
        let volumes = DriverVolumes::new(b.clone());
        volumes.set_driver(Some("1.0"));
        let api = PluginApi::new(Arc::clone(&volumes), Duration::from_secs(5));
        let reply = call(
            &api,
            "/VolumeDriver.Create",
            r#"{"Name":"nvidia_driver_1.0"}"#,
        )
        .await;
        assert_eq!(
            reply["Err"],
            "volume nvidia_driver_1.0 could not be built: ld.so.cache has no libnvidia-ml"
        );
        volumes.set_driver(Some("1.0"));
        volumes.settled(Duration::from_secs(5)).await;
        assert_eq!(b.calls.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn manager_builder_reports_why_it_cannot_build() {
        let dir = tempfile::tempdir().expect("tempdir");
        let b = ManagerBuilder::new(
            VolumeManager::at(dir.path().join("vols")),
            DriverSource::at(dir.path().join("root")),
        );
        let err = b.build("not-a-version").expect_err("bad version");
        assert!(error_chain(err.as_ref()).contains("not-a-version"), "{err}");
        let err = b.build("550.54.14").expect_err("no ld.so.cache");
        assert!(
            error_chain(err.as_ref()).contains("ld.so.cache"),
            "{}",
            error_chain(err.as_ref())
        );
    }

    #[test]
    fn names_split_like_the_nvidia_docker_regex() {
        assert_eq!(
            split_name("nvidia_driver_550.54.14"),
            Some(("nvidia_driver", "550.54.14"))
        );
        assert_eq!(split_name("a-b.c_1"), Some(("a-b.c", "1")));
        for bad in ["", "_1", "x_", "x_1a", "x y_1", "nvidia_driver", "x_1_"] {
            assert_eq!(split_name(bad), None, "{bad}");
        }
    }
}
