//! What the Docker side of the CLI shares (`docker-args`, `docker-wrapper`, `run`, `serve`):
//! the node's GPU pool opened for Docker containers ([`open_pool`]), the node's device nodes
//! ([`device_nodes`]), the driver volume offered to images ([`driver_spec`]) and container ids.
//!
//! The Docker containers' own record is checkpointed in `--docker-state-dir` (default
//! [`super::DEFAULT_DOCKER_STATE_DIR`]), locked only for the duration of one call
//! ([`open_pool`]); a concurrent call waits up to [`LOCK_WAIT`] for it.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use mesos_gpu_docker::args::{DEFAULT_PLUGIN_NAME, DriverSpec, VolumeSource};
use mesos_gpu_docker::client::{docker_name, mesos_container_id};
use mesos_gpu_docker::daemons::EngineDaemons;
use mesos_gpu_isolator::agent_flags::MigStrategy;
use mesos_gpu_isolator::lifecycle::{
    CheckpointError, ContainerId, Isolator, IsolatorConfig, LifecycleError, MigConfig, PoolConfig,
    PoolRole, RecoveryReport, SharingConfig,
};
use mesos_gpu_node::devices::DeviceNodes;
use mesos_gpu_node::inventory::Inventory;
use mesos_gpu_volume::VolumeManager;

use crate::ctx::Ctx;

/// The Docker containers' reservations: the isolator of `--docker-state-dir` on the node's pool,
/// on which only the Docker calls are made (reserve through `DockerGuard`, claim, release). A
/// name, not a new type: `DockerBridge` takes the isolator itself.
pub(crate) type DockerRecords = Isolator;

/// The default Docker daemon socket.
pub(crate) const DEFAULT_DOCKER_SOCKET: &str = "/var/run/docker.sock";
/// How long a call waits for another user of the work directory to finish.
pub(crate) const LOCK_WAIT: Duration = Duration::from_secs(10);
/// The kernel's fresh random UUID on each read (random(4)).
const UUID_SOURCE: &str = "/proc/sys/kernel/random/uuid";

/// Opens the Docker containers' reservations in `--docker-state-dir` on the node's pool and
/// recovers them from their checkpoint, waiting up to [`LOCK_WAIT`] while another process holds
/// the directory. Drop it to let others in.
pub(crate) fn open_pool(ctx: &Ctx, args: &super::DockerPoolArgs) -> anyhow::Result<DockerRecords> {
    // `gpus` are whole GPUs here (`run`, `serve`): the mixed strategy never turns them into MIG
    // devices.
    open_pool_sharing(ctx, args, None, whole_gpus())
}

/// `gpus` as whole GPUs: the mixed strategy never turns them into MIG devices.
fn whole_gpus() -> MigConfig {
    MigConfig {
        strategy: MigStrategy::Mixed,
        ..MigConfig::default()
    }
}

/// [`open_pool`] on a node that shares GPUs (`--gpu-replicas`): requests may be served with a
/// share of one GPU.
pub(crate) fn open_pool_sharing(
    ctx: &Ctx,
    args: &super::DockerPoolArgs,
    sharing: Option<SharingConfig>,
    mut mig: MigConfig,
) -> anyhow::Result<DockerRecords> {
    let root = dev_root(ctx)?;
    mig.dev_root = root.0.clone();
    mig.proc_root = ctx.proc_root()?;
    let inventory = ctx.inventory()?.clone();
    let nodes = nodes_under(ctx, root)?;
    let work_dir = args.state_dir(ctx)?;
    let (isolator, report) = open_on(&work_dir, args, sharing, mig, inventory, nodes)?;
    if let Some(unchecked) = &report.unchecked {
        tracing::warn!(records = %unchecked, docker_state_dir = %work_dir.display(), "kept GPU records this process cannot check as they were written; none of their GPUs is granted");
    }
    Ok(isolator)
}

/// Opens the Docker containers' reservations like [`open_pool`], loading no NVML: for what
/// needs no GPU seen (`what`: claiming a reservation for its container, releasing it), by
/// container id. Every record is kept as written; nothing can be granted.
pub(crate) fn open_records(
    ctx: &Ctx,
    args: &super::DockerPoolArgs,
    what: &str,
) -> anyhow::Result<DockerRecords> {
    let inventory = Inventory {
        absent_reason: Some(format!("{what} loads no NVML")),
        ..Inventory::default()
    };
    let work_dir = args.state_dir(ctx)?;
    let (isolator, report) = open_on(
        &work_dir,
        args,
        None,
        whole_gpus(),
        inventory,
        DeviceNodes::default(),
    )?;
    if let Some(unchecked) = &report.unchecked {
        tracing::debug!(records = %unchecked, "records kept as written");
    }
    Ok(isolator)
}

/// The isolator of the Docker containers' reservations over `inventory`, recovered.
fn open_on(
    work_dir: &Path,
    args: &super::DockerPoolArgs,
    sharing: Option<SharingConfig>,
    mig: MigConfig,
    inventory: Inventory,
    nodes: DeviceNodes,
) -> anyhow::Result<(DockerRecords, RecoveryReport)> {
    let deadline = Instant::now() + LOCK_WAIT;
    let mut isolator = loop {
        let mut config = IsolatorConfig::new(work_dir);
        config.pool = Some(PoolConfig {
            dir: args.pool.pool_dir.clone(),
            role: PoolRole::Docker,
        });
        config.sharing.clone_from(&sharing);
        config.mig = mig.clone();
        match Isolator::new(config, inventory.clone(), nodes.clone()) {
            Err(LifecycleError::Checkpoint {
                source: CheckpointError::Locked { .. },
                ..
            }) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            other => {
                break other.with_context(|| {
                    format!("cannot open the GPU pool in {}", work_dir.display())
                })?;
            }
        }
    };
    // Docker owners are checked against the daemon that runs them.
    isolator.set_docker_daemons(Arc::new(EngineDaemons::new()));
    let report = isolator
        .recover(&[], &[])
        .context("cannot recover the GPU pool from its checkpoint")?;
    for issue in &report.issues {
        tracing::debug!(?issue, "pool entry kept reserved");
    }
    Ok((isolator, report))
}

/// A new container id: a random UUID from the kernel.
pub(crate) fn new_container_id() -> anyhow::Result<ContainerId> {
    let text = std::fs::read_to_string(UUID_SOURCE)
        .with_context(|| format!("cannot read a UUID from {UUID_SOURCE}"))?;
    Ok(ContainerId::new(text.trim())?)
}

/// `id` checked as a container id the bridge can recover (a UUID).
pub(crate) fn container_id(id: &str) -> anyhow::Result<ContainerId> {
    let parsed = ContainerId::new(id)?;
    anyhow::ensure!(
        mesos_container_id(&docker_name(&parsed)).is_some(),
        "container id {id:?}: expected a UUID such as 3d8a52b4-1c5e-4f5a-9c1e-2b7d9a0e6f11"
    );
    Ok(parsed)
}

/// The driver volume offered to images that ask for it: the plugin's named volume, or a bind
/// of the built volume directory (which must exist when `needed`, or Docker would bind an empty
/// directory it creates).
pub(crate) fn driver_spec(
    ctx: &Ctx,
    choice: &super::DriverVolumeArgs,
    needed: bool,
) -> anyhow::Result<Option<DriverSpec>> {
    let Some(info) = ctx.inventory()?.driver.as_ref() else {
        return Ok(None);
    };
    let volume = if choice.plugin {
        VolumeSource::Plugin {
            plugin: DEFAULT_PLUGIN_NAME.to_owned(),
        }
    } else {
        let version = info
            .version
            .parse()
            .with_context(|| format!("driver version {:?}", info.version))?;
        let manager = VolumeManager::at(&choice.root.volume_root);
        let path = manager.volume_path(&version);
        if needed && !path.is_dir() {
            super::volume::build_simulated(ctx, &manager)?;
        }
        anyhow::ensure!(
            !needed || path.is_dir(),
            "the driver volume {} is not built; run `mesos-gpu volume create` first (or use --plugin)",
            path.display()
        );
        VolumeSource::Bind { host_path: path }
    };
    Ok(Some(DriverSpec {
        info: info.clone(),
        volume,
    }))
}

/// Where the node's device nodes are, and whether they are there to scan: `--dev-root`; on a
/// simulated node without it, as root, the nodes its driver numbers, made once in its scratch
/// state (as `exec` does), so that Docker can start the container; otherwise `/dev`, named only.
fn dev_root(ctx: &Ctx) -> anyhow::Result<(PathBuf, bool)> {
    Ok(match (ctx.dev_root(), ctx.simulation()?) {
        (Some(root), _) => (root.to_owned(), true),
        (None, Some(sim)) if mesos_gpu_os::fsmode::is_root() => {
            (sim.device_root(ctx.inventory()?, &ctx.proc_root()?)?, true)
        }
        (None, _) => (PathBuf::from("/dev"), false),
    })
}

/// The node's device nodes under [`dev_root`]: scanned, or on a simulated node without them
/// named, unchecked.
pub(crate) fn device_nodes(ctx: &Ctx) -> anyhow::Result<DeviceNodes> {
    nodes_under(ctx, dev_root(ctx)?)
}

/// [`device_nodes`] under a [`dev_root`] already found.
fn nodes_under(ctx: &Ctx, root: (PathBuf, bool)) -> anyhow::Result<DeviceNodes> {
    let inventory = ctx.inventory()?;
    match root {
        (root, true) => DeviceNodes::scan(&root, inventory)
            .with_context(|| format!("reading the NVIDIA device nodes under {}", root.display())),
        (root, false) => {
            tracing::warn!(
                "simulated node without --dev-root, not root: device paths are /dev/nvidia* and unchecked"
            );
            Ok(DeviceNodes::named(&root, inventory))
        }
    }
}
