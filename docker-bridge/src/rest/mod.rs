//! nvidia-docker 1.0's REST API (`nvidia-docker-plugin`, default `localhost:3476`), so that
//! `docker run $(curl -s localhost:3476/v1.0/docker/cli?dev=0+1) IMAGE` and nvidia-docker's own
//! wrapper work against mesos-gpu.
//!
//! Routes (`docs/reference/nvidia-docker.md` §1), each with and without the `/v1.0` prefix,
//! GET (and HEAD) only: `/gpu/info`, `/gpu/info/json`, `/gpu/status`, `/gpu/status/json`,
//! `/docker/cli`, `/docker/cli/json`, `/mesos/cli`. `dev=` and `vol=` apply to the two
//! `/docker/cli` routes ([`query`]). A bad parameter is HTTP 400 with the reason, an unknown
//! path 404 (Go's "404 page not found"), another method 405 (nvidia-docker answered 404).
//! With [`RestApi::with_metrics`], `/metrics` answers the Prometheus metrics as well.
//!
//! `/docker/cli` renders what it selects as every Docker path of mesos-gpu does
//! ([`crate::args::DockerLaunch::render`] of a [`Grant`], for an image not known): the devices'
//! nodes, the driver volume and the devices' variables (no `PATH`: the image's is kept), which
//! also name MIG devices (`dev=MIG-…`, a UUID prefix). It reserves nothing, so it gives no share
//! of a GPU and pins nothing: a query asking for either (`gpu_replicas=`, `numa_pinning=`,
//! `cpus=`) is refused with the reason, as is a GPU in MIG mode (its MIG devices are named
//! instead) and MIG devices asked for with GPUs.
//!
//! Differences from nvidia-docker, on purpose: `--device` flags come in a stable order (control
//! nodes, then GPUs by minor; nvidia-docker's order was random), `--env` flags name the devices
//! by UUID (`NVIDIA_VISIBLE_DEVICES`, `CUDA_VISIBLE_DEVICES`; nvidia-docker set none), `dev=*`
//! selects the GPUs not in MIG mode, and in bind mode the volume is the driver volume's host
//! directory with no `--volume-driver`.

mod format;
pub mod query;
pub mod status;
mod tabwriter;

use std::convert::Infallible;
use std::sync::{Arc, RwLock};

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{ALLOW, CONTENT_TYPE, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use mesos_gpu_node::inventory::Inventory;

use self::format::{DockerCli, Node};
use self::status::GpuStatusSource;
use mesos_gpu_grant::{Grant, MigAccess};
use mesos_gpu_node::devices::DeviceNodes;
use mesos_gpu_node::inventory::Gpu;

use crate::args::{DockerLaunch, DriverSpec, VolumeMount, VolumeSource};
use crate::metrics::Metrics;

/// The default REST listen address of nvidia-docker-plugin.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:3476";

/// A REST response body.
pub type Body = Full<Bytes>;

/// Where the node's device nodes and driver files are, for what `/docker/cli` passes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Devices {
    /// The NVIDIA device nodes, as scanned (or named, on a simulated node).
    pub nodes: DeviceNodes,
    /// The device root (`/dev`): GPU and MIG capability nodes live under it.
    pub dev_root: std::path::PathBuf,
    /// The proc root (`/proc`): the driver's files numbering the MIG capability nodes.
    pub proc_root: std::path::PathBuf,
}

impl Devices {
    /// The node of `gpu`: the scanned one, else `<dev root>/nvidia<minor>`.
    pub(crate) fn gpu_path(&self, gpu: &Gpu) -> std::path::PathBuf {
        self.nodes.gpu(gpu.index).map_or_else(
            || self.dev_root.join(format!("nvidia{}", gpu.minor)),
            |n| n.path.clone(),
        )
    }
}

/// The REST API over one node's inventory.
pub struct RestApi {
    inventory: RwLock<Arc<Inventory>>,
    devices: Devices,
    volume: VolumeSource,
    status: Arc<dyn GpuStatusSource>,
    metrics: Option<Arc<Metrics>>,
}

impl std::fmt::Debug for RestApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RestApi")
            .field("gpus", &self.inventory().gpus.len())
            .field("volume", &self.volume)
            .finish()
    }
}

enum Page<'a> {
    Metrics(&'a Metrics),
    InfoText,
    InfoJson,
    StatusText,
    StatusJson,
    DockerCliText,
    DockerCliJson,
    MesosCli,
}

fn route(path: &str) -> Option<Page<'static>> {
    let path = path
        .strip_prefix("/v1.0")
        .filter(|p| p.starts_with('/'))
        .unwrap_or(path);
    Some(match path {
        "/gpu/info" => Page::InfoText,
        "/gpu/info/json" => Page::InfoJson,
        "/gpu/status" => Page::StatusText,
        "/gpu/status/json" => Page::StatusJson,
        "/docker/cli" => Page::DockerCliText,
        "/docker/cli/json" => Page::DockerCliJson,
        "/mesos/cli" => Page::MesosCli,
        _ => return None,
    })
}

fn reply(status: StatusCode, content_type: &'static str, body: String) -> Response<Body> {
    let mut resp = Response::new(Full::new(Bytes::from(body)));
    *resp.status_mut() = status;
    resp.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    resp
}

const TEXT: &str = "text/plain; charset=utf-8";
const JSON: &str = "application/json";

/// Go's `http.Error`: the message and a newline, as plain text.
fn error(status: StatusCode, message: impl std::fmt::Display) -> Response<Body> {
    reply(status, TEXT, format!("{message}\n"))
}

impl RestApi {
    /// The API for `inventory`, whose device nodes are `devices`, with the driver volume
    /// served as `volume` (a plugin volume like nvidia-docker, or a bind of the host directory).
    pub fn new(
        inventory: Arc<Inventory>,
        devices: Devices,
        volume: VolumeSource,
        status: Arc<dyn GpuStatusSource>,
    ) -> RestApi {
        RestApi {
            inventory: RwLock::new(inventory),
            devices,
            volume,
            status,
            metrics: None,
        }
    }

    /// Also serves `GET /metrics` from `metrics`.
    pub fn with_metrics(mut self, metrics: Arc<Metrics>) -> RestApi {
        self.metrics = Some(metrics);
        self
    }

    /// The inventory the pages are made from.
    pub fn inventory(&self) -> Arc<Inventory> {
        Arc::clone(
            &self
                .inventory
                .read()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        )
    }

    /// Replaces the inventory (after a driver change).
    pub fn set_inventory(&self, inventory: Arc<Inventory>) {
        *self
            .inventory
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = inventory;
    }

    fn node<'a>(&'a self, inventory: &'a Inventory) -> Node<'a> {
        Node {
            inventory,
            devices: &self.devices,
            status: self.status.as_ref(),
        }
    }

    /// The response to `method path?query`. Synchronous: status pages call the
    /// [`GpuStatusSource`], so async callers should run this on a blocking thread.
    pub fn respond(&self, method: &Method, path: &str, query: Option<&str>) -> Response<Body> {
        let page = match &self.metrics {
            Some(metrics) if path == "/metrics" => Some(Page::Metrics(metrics)),
            _ => route(path),
        };
        let Some(page) = page else {
            return error(StatusCode::NOT_FOUND, "404 page not found");
        };
        if method != Method::GET && method != Method::HEAD {
            let mut resp = error(
                StatusCode::METHOD_NOT_ALLOWED,
                format!("method {method} not allowed: GET only"),
            );
            resp.headers_mut()
                .insert(ALLOW, HeaderValue::from_static("GET, HEAD"));
            return resp;
        }
        let inventory = self.inventory();
        let node = self.node(&inventory);
        match page {
            Page::InfoText => reply(StatusCode::OK, TEXT, format::info_text(&node)),
            Page::InfoJson => reply(StatusCode::OK, JSON, format::info_json(&node)),
            Page::StatusText => reply(StatusCode::OK, TEXT, format::status_text(&node)),
            Page::StatusJson => reply(StatusCode::OK, JSON, format::status_json(&node)),
            Page::MesosCli => reply(StatusCode::OK, TEXT, format::mesos_cli(&node)),
            Page::Metrics(metrics) => metrics.respond(),
            Page::DockerCliText => match self.docker_cli(&inventory, query) {
                Ok(cli) => reply(StatusCode::OK, TEXT, cli.text()),
                Err((status, reason)) => error(status, reason),
            },
            Page::DockerCliJson => match self.docker_cli(&inventory, query) {
                Ok(cli) => reply(StatusCode::OK, JSON, cli.json()),
                Err((status, reason)) => error(status, reason),
            },
        }
    }

    /// The `/docker/cli` arguments, or the status and reason of the refusal.
    fn docker_cli(
        &self,
        inventory: &Inventory,
        query: Option<&str>,
    ) -> Result<DockerCli, (StatusCode, String)> {
        let bad = |e: query::QueryError| (StatusCode::BAD_REQUEST, e.to_string());
        let internal =
            |e: crate::args::ArgsError| (StatusCode::INTERNAL_SERVER_ERROR, e.to_string());
        let q = query::CliQuery::parse(query);
        q.check_supported().map_err(bad)?;
        let selected = query::select(inventory, q.dev.as_deref()).map_err(bad)?;
        query::check_volumes(q.vol.as_deref()).map_err(bad)?;
        let driver = inventory.driver.as_ref().ok_or_else(|| {
            (
                StatusCode::SERVICE_UNAVAILABLE,
                "no NVIDIA driver on this node".to_owned(),
            )
        })?;
        let mig = selected
            .mig
            .iter()
            .map(|d| MigAccess::of(d, &self.devices.dev_root, &self.devices.proc_root))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| (StatusCode::CONFLICT, e.to_string()))?;
        let gpus = selected.gpus.into_iter().cloned().collect();
        let grant = Grant::new(&self.devices.nodes, &[], gpus, mig, None)
            .map_err(|e| (StatusCode::BAD_REQUEST, e.to_string()))?;
        let spec = DriverSpec {
            info: driver.clone(),
            volume: self.volume.clone(),
        };
        // The image is not known: the driver volume and the variables, no PATH.
        let plan = DockerLaunch::new(&grant, Some(&spec))
            .and_then(|launch| launch.render(None))
            .map_err(internal)?;
        let volume = plan
            .volume
            .as_ref()
            .ok_or_else(|| internal(crate::args::ArgsError::NoDriver))?;
        if let VolumeMount::Bind { host_path } = volume
            && !host_path.is_dir()
        {
            return Err((
                StatusCode::SERVICE_UNAVAILABLE,
                format!("the driver volume {} is not built yet", host_path.display()),
            ));
        }
        Ok(DockerCli {
            volume_driver: volume.volume_driver().unwrap_or_default().to_owned(),
            volumes: vec![volume.bind_spec()],
            devices: plan.devices.iter().map(|d| d.cli_value()).collect(),
            env: plan.env_strings(),
        })
    }

    /// Serves one HTTP request (for hyper's `service_fn`).
    pub async fn handle(
        self: Arc<Self>,
        req: Request<Incoming>,
    ) -> Result<Response<Body>, Infallible> {
        let method = req.method().clone();
        let path = req.uri().path().to_owned();
        let query = req.uri().query().map(str::to_owned);
        drop(req);
        let api = Arc::clone(&self);
        let (m, p) = (method.clone(), path.clone());
        let resp = tokio::task::spawn_blocking(move || api.respond(&m, &p, query.as_deref()))
            .await
            .unwrap_or_else(|e| {
                tracing::error!(error = %e, "REST handler panicked");
                error(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "internal error, check logs for details",
                )
            });
        tracing::debug!(%method, %path, status = resp.status().as_u16(), "REST request");
        Ok(resp)
    }
}

#[cfg(test)]
mod tests;
