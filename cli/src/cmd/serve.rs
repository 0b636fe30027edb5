//! `mesos-gpu serve`: nvidia-docker 1.0's REST API on TCP and its `nvidia-docker` volume plugin
//! on a unix socket, until SIGTERM or SIGINT.
//!
//! The driver volume is built in the background at start (and again when the driver version
//! changes) by the volume manager; plugin requests never build it. The node is re-read every
//! `--driver-poll` seconds to notice a driver change. `/gpu/status` and `/gpu/info` show live
//! NVML figures ([`NvmlStatus`]); `/metrics` serves them to Prometheus ([`Metrics`]) with each
//! GPU's health as the agent's monitor checkpointed it in `--agent-work-dir` (health, reason,
//! XIDs by code, ECC counts). `serve` holds no allocator: the allocator's figures (allocated,
//! free, quarantined GPUs, allocations and refusals by reason) are the module's, served by the
//! agent itself at `/mesos-gpu/metrics`. Its per-container series are the node pool's records
//! (`--pool-dir`: the module's containers, `docker-args`' Docker tasks), each labelled with the
//! holder its record names; framework names are read from the agent at `--agent-url`, and are
//! empty without it.
//!
//! The node's CDI spec (`--cdi-spec`, as `mesos-gpu cdi generate` writes it) is brought up to
//! date at start and at each driver poll: rewritten when the driver or the GPUs change, removed
//! when the GPUs go away, and removed rather than left beside another spec of the same
//! directory that declares the same devices ([`SpecKeeper`]). `--no-cdi` leaves it alone, and
//! a simulated node keeps one only when `--cdi-spec` names it.
//!
//! Allocations: `serve` holds none. `/docker/cli` names the GPUs the client asks for, as
//! nvidia-docker's did, and reserves nothing. What `serve` does own is the **start-up
//! reconciliation** of the Docker containers' reservations (`--docker-state-dir`, the record
//! `docker-args` and `run` keep, on the pool in `--pool-dir`) with the Docker daemon: after a reboot or crash it re-books the GPUs of running
//! `mesos-<id>` containers and releases reservations whose container is gone, logging each.
//! It is skipped, with a log line saying why, when no daemon answers on `--docker-socket` or
//! another process holds the pool (the agent's isolator, which recovers its own containers).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use mesos_gpu_docker::agent::MesosAgent;
use mesos_gpu_docker::args::VolumeSource;
use mesos_gpu_docker::bridge::DockerBridge;
use mesos_gpu_docker::cdi::{DEFAULT_SPEC_DIRS, SpecFile, SpecKeeper};
use mesos_gpu_docker::client::DockerClient;
use mesos_gpu_docker::metrics::{self, Metrics, NvmlFigures, PoolHoldings};
use mesos_gpu_docker::plugin::{
    DEFAULT_BUILD_WAIT, DEFAULT_SOCKET, DriverVolumes, ManagerBuilder, PluginApi,
};
use mesos_gpu_docker::rest::status::{GpuStatusSource, NoStatus};
use mesos_gpu_docker::rest::{DEFAULT_LISTEN, Devices, RestApi};
use mesos_gpu_docker::server::{Server, ServerConfig, shutdown_signal, spawn_driver_watch};
use mesos_gpu_docker::status::NvmlStatus;
use mesos_gpu_health::HealthStore;
use mesos_gpu_isolator::lifecycle::CheckpointError;
use mesos_gpu_node::discovery::GpuDriver;
use mesos_gpu_volume::VolumeManager;

use super::docker_pool::{device_nodes, open_pool};
use crate::ctx::Ctx;

/// Where `/gpu/status` reads process names NVML does not give.
const PROC_ROOT: &str = "/proc";

/// `--listen`: `HOST:PORT`, the host an address or a name resolved as `getaddrinfo` does (the
/// first address it gives).
fn listen_address(value: &str) -> Result<SocketAddr, String> {
    if let Ok(addr) = value.parse() {
        return Ok(addr);
    }
    let expected = "expected HOST:PORT, such as 127.0.0.1:3476 or localhost:3476";
    let mut addrs = std::net::ToSocketAddrs::to_socket_addrs(value)
        .map_err(|e| format!("{value:?}: {e} ({expected})"))?;
    addrs
        .next()
        .ok_or_else(|| format!("{value:?} resolves to no address ({expected})"))
}

#[derive(clap::Args)]
#[command(after_help = "Examples:\n  \
    mesos-gpu serve\n  \
    mesos-gpu serve --simulate dgx1-v100 --listen 127.0.0.1:3476 \\\n      \
    --plugin-socket /tmp/mesos-gpu-demo/nvidia-docker.sock\n  \
    mesos-gpu serve --agent-url http://127.0.0.1:5051\n  \
    docker run $(curl -s localhost:3476/v1.0/docker/cli?dev=0+1) IMAGE")]
pub(crate) struct Args {
    /// TCP address of the REST API (nvidia-docker's remote API): HOST:PORT, the host an IP
    /// address or a name (`localhost:3476`: its first address).
    #[arg(long, value_name = "ADDR", default_value = DEFAULT_LISTEN, value_parser = listen_address)]
    listen: SocketAddr,

    /// Unix socket of the Docker volume plugin; Docker names the plugin after the file
    /// (`nvidia-docker.sock` → `nvidia-docker`).
    #[arg(long, value_name = "PATH", default_value = DEFAULT_SOCKET)]
    plugin_socket: PathBuf,

    #[command(flatten)]
    volume: super::VolumeRootArgs,

    /// Root of the file system holding the driver (its `etc/ld.so.cache` and libraries); with
    /// --simulate and none given, the simulated node's driver tree [default: /].
    #[arg(long, value_name = "DIR")]
    driver_root: Option<PathBuf>,

    /// What `/docker/cli` names: the plugin's named volume (nvidia-docker compatible), or a
    /// bind of the volume's host directory (no plugin lookup by Docker).
    #[arg(long, value_enum, default_value_t = VolumeMode::Plugin)]
    volume_mode: VolumeMode,

    /// Seconds between re-reads of the node to notice a driver change; 0 disables.
    #[arg(long, value_name = "SECONDS", default_value_t = 30)]
    driver_poll: u64,

    /// The Docker containers' reservations, reconciled with the Docker daemon at start.
    #[command(flatten)]
    reservations: super::DockerPoolArgs,

    #[command(flatten)]
    daemon: super::DockerSocketArgs,

    /// The CDI spec kept current at start and at each driver poll (see `mesos-gpu cdi generate`)
    /// [default: /var/run/cdi/nvidia.com-gpu.json; with --simulate, none unless named].
    #[arg(long, value_name = "FILE")]
    cdi_spec: Option<PathBuf>,

    /// The CDI directories runtimes read, lowest priority first, checked for other specs that
    /// declare the same devices.
    #[arg(long, value_name = "DIRS", value_delimiter = ',', default_values = DEFAULT_SPEC_DIRS)]
    cdi_spec_dirs: Vec<PathBuf>,

    /// Do not write, update or remove the CDI spec.
    #[arg(long, conflicts_with_all = ["cdi_spec", "cdi_spec_dirs"])]
    no_cdi: bool,
    /// The agent whose GPU health checkpoint (`gpu/health.json`, kept by the module's health
    /// monitor) `/metrics` reports.
    #[command(flatten)]
    agent: super::AgentWorkDirArgs,

    /// The mesos-agent's HTTP address, `http://HOST:PORT`, whose `/state` names the frameworks
    /// of the containers in `/metrics` (`framework_name` label), and whose `/containers` gives
    /// the executor and framework of a pool record that names no holder (one recorded by an
    /// older mesos-gpu); without it those labels are empty. Read with a 2 s timeout, at most
    /// every 30 s after a failure; an agent that requires HTTP authentication leaves them empty
    /// (logged at debug).
    #[arg(long, value_name = "URL")]
    agent_url: Option<String>,
}

/// How `/docker/cli` mounts the driver volume.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum VolumeMode {
    /// `--volume-driver=<plugin> --volume=nvidia_driver_<version>:/usr/local/nvidia:ro`.
    Plugin,
    /// `--volume=<volume root>/nvidia_<version>:/usr/local/nvidia:ro`.
    Bind,
}

pub(crate) fn run(args: &Args, ctx: &Ctx) -> anyhow::Result<ExitCode> {
    let inventory = Arc::new(ctx.inventory()?.clone());
    let host = Devices {
        nodes: device_nodes(ctx)?,
        dev_root: ctx
            .dev_root()
            .map_or_else(|| PathBuf::from("/dev"), Path::to_path_buf),
        proc_root: ctx.proc_root()?,
    };
    let driver_source = super::volume::driver_source(ctx, args.driver_root.as_deref())?;
    let manager = VolumeManager::at(&args.volume.volume_root);
    let plugin_name = args
        .plugin_socket
        .file_stem()
        .and_then(|s| s.to_str())
        .filter(|s| !s.is_empty())
        .with_context(|| {
            format!(
                "--plugin-socket {}: expected a file name such as nvidia-docker.sock",
                args.plugin_socket.display()
            )
        })?
        .to_owned();
    let volume = match (args.volume_mode, inventory.driver.as_ref()) {
        (VolumeMode::Plugin, _) => VolumeSource::Plugin {
            plugin: plugin_name,
        },
        (VolumeMode::Bind, Some(driver)) => {
            let version = driver
                .version
                .parse()
                .with_context(|| format!("driver version {:?}", driver.version))?;
            VolumeSource::Bind {
                host_path: manager.volume_path(&version),
            }
        }
        (VolumeMode::Bind, None) => VolumeSource::Bind {
            host_path: args.volume.volume_root.join("no-driver"),
        },
    };
    let lib = ctx.driver()?.map(|d| d.lib_path().to_owned());
    let cdi_spec = super::cdi::spec_path(args.cdi_spec.as_deref(), ctx).filter(|_| !args.no_cdi);
    if cdi_spec.is_none() && !args.no_cdi {
        tracing::info!("simulated node: no CDI spec is kept (name one with --cdi-spec)");
    }
    let cdi = cdi_spec.map(|path| {
        Arc::new(SpecKeeper::new(
            SpecFile::new(path, args.cdi_spec_dirs.clone()),
            super::cdi::device_numbers(ctx),
            VolumeManager::at(&args.volume.volume_root),
        ))
    });
    if let Some(cdi) = &cdi {
        cdi.refresh(&inventory);
    }
    let config = ServerConfig {
        rest_listen: Some(args.listen),
        plugin_socket: Some(args.plugin_socket.clone()),
    };

    let runtime = tokio::runtime::Runtime::new().context("cannot start the async runtime")?;
    // One NVML session for discovery, `/gpu/status` and `/metrics`; the driver watch opens its
    // own on each poll, to see a driver that changed underneath.
    let driver = ctx.shared_driver()?.cloned();
    let status: Arc<dyn GpuStatusSource> = match &driver {
        Some(driver) => Arc::new(NvmlStatus::new(Arc::clone(driver), PROC_ROOT)),
        None => Arc::new(NoStatus),
    };
    let health = Arc::new(HealthStore::at(&args.agent.agent_work_dir));
    let agent = args
        .agent_url
        .as_deref()
        .map(MesosAgent::from_url)
        .transpose()
        .context("--agent-url")?;
    let holdings = Arc::new(PoolHoldings::at(&args.reservations.pool.pool_dir));
    let metrics = driver.map(|driver| {
        let mut figures = NvmlFigures::new(driver)
            .with_health(health)
            .with_holdings(holdings);
        if let Some(agent) = agent {
            figures = figures.with_agent(Arc::new(agent));
        }
        Arc::new(Metrics::new(Arc::new(figures), metrics::DEFAULT_CACHE))
    });
    runtime.block_on(async {
        recover_docker_records(ctx, args).await;
        let volumes = DriverVolumes::new(Arc::new(ManagerBuilder::new(manager, driver_source)));
        volumes.set_driver(inventory.driver.as_ref().map(|d| d.version.as_str()));
        let mut rest = RestApi::new(inventory, host, volume, status);
        if let Some(metrics) = metrics {
            rest = rest.with_metrics(metrics);
        }
        let rest = Arc::new(rest);
        let plugin = Arc::new(PluginApi::new(Arc::clone(&volumes), DEFAULT_BUILD_WAIT));
        // The handlers first: a SIGTERM as soon as the socket shows must stop serve cleanly,
        // never kill it with the default action.
        let signal = shutdown_signal()?;
        let server = Server::bind(&config, Arc::clone(&rest), plugin).await?;
        let watch = (args.driver_poll > 0).then(|| {
            let probe = move || {
                let found = GpuDriver::open(lib.as_deref())
                    .map(|d| d.inventory().clone())
                    .map_err(|e| format!("{e:#}"));
                if let (Ok(inventory), Some(cdi)) = (&found, &cdi) {
                    cdi.refresh(inventory);
                }
                found
            };
            spawn_driver_watch(probe, Duration::from_secs(args.driver_poll), rest, volumes)
        });
        server
            .run(async {
                let name = signal.await;
                tracing::info!(signal = name, "stopping");
            })
            .await;
        if let Some(watch) = watch {
            watch.abort();
        }
        anyhow::Ok(())
    })?;
    Ok(ExitCode::SUCCESS)
}

/// Reconciles the shared pool with the Docker daemon once (see the module docs); every outcome
/// is logged, none stops the service.
async fn recover_docker_records(ctx: &Ctx, args: &Args) {
    let socket = &args.daemon.docker_socket;
    let client = match DockerClient::connect(socket).await {
        Ok(client) => client,
        Err(e) => {
            tracing::info!(socket = %socket.display(), reason = %format!("{e:#}"), "no Docker daemon; Docker GPU records not recovered");
            return;
        }
    };
    let records = match open_pool(ctx, &args.reservations) {
        Ok(records) => records,
        Err(e) if is_locked(&e) => {
            tracing::warn!(pool_dir = %args.reservations.pool.pool_dir.display(), "the GPU pool is held by another process (the agent's isolator recovers its own Docker containers); not recovered here");
            return;
        }
        Err(e) => {
            tracing::error!(error = %format!("{e:#}"), "cannot open the GPU pool; Docker GPU records not recovered");
            return;
        }
    };
    let gpus = match ctx.inventory() {
        Ok(inventory) => inventory.gpus.clone(),
        Err(e) => {
            tracing::error!(error = %format!("{e:#}"), "no inventory; Docker GPU records not recovered");
            return;
        }
    };
    let bridge = DockerBridge::new(Arc::new(records), client, None, gpus);
    match bridge.recover().await {
        Ok(found) => {
            for c in &found.running {
                tracing::info!(container = %c.docker_name, gpus = ?c.gpu_minors, "Docker container holds GPUs (by minor)");
            }
            for id in &found.adopted {
                tracing::warn!(container = %id, "running GPU container had no reservation; its GPUs are now reserved");
            }
            for id in &found.released {
                tracing::info!(container = %id, "reserved container is not running; its GPUs were released");
            }
            for c in &found.unknown_gpus {
                tracing::error!(container = %c.docker_name, minors = ?c.unknown_minors, "container holds GPU nodes this node's inventory does not know");
            }
            for issue in &found.report.issues {
                tracing::warn!(?issue, "GPU pool recovery issue");
            }
        }
        Err(e) => tracing::error!(error = %format!("{e:#}"), "cannot recover Docker GPU records"),
    }
}

fn is_locked(err: &anyhow::Error) -> bool {
    err.chain().any(|c| {
        matches!(
            c.downcast_ref::<CheckpointError>(),
            Some(CheckpointError::Locked { .. })
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listen_takes_host_names_as_well_as_addresses() {
        let named = listen_address("localhost:13476").expect("localhost resolves");
        assert!(named.ip().is_loopback() && named.port() == 13476, "{named}");
        assert_eq!(
            listen_address("0.0.0.0:3476"),
            Ok(SocketAddr::from(([0, 0, 0, 0], 3476)))
        );
        for bad in ["localhost", "localhost:port", ":3476"] {
            let err = listen_address(bad).expect_err(bad);
            assert!(err.contains("expected HOST:PORT"), "{bad}: {err}");
        }
    }
}
