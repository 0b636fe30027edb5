//! `mesos-gpu docker-args`: reserve N GPUs from the shared pool and print the `docker run`
//! arguments that give them to a container; `--release ID` gives them back.
//!
//! The GPUs come from the node's one pool (`--pool-dir`, shared with the agent's module,
//! `exec`, `run` and `serve`); the Docker containers' own record is checkpointed in
//! `--docker-state-dir` (default [`super::DEFAULT_DOCKER_STATE_DIR`]), locked only for the duration of one call
//! ([`open_pool`]); a concurrent call waits up to [`LOCK_WAIT`] for it.
//!
//! The arguments start with `--name=mesos-<ID>`: the reservation records that name, the daemon
//! (`--docker-socket`) and the process that starts the container (`--starter-pid`, default the
//! parent); the pool frees it once that process has ended and the daemon has no running
//! container of that name (`mesos-gpu serve` at start also releases containers not running).

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use mesos_gpu_docker::args::{
    DEFAULT_PLUGIN_NAME, DriverSpec, ImageInfo, LaunchPlan, VOLUMES_NEEDED_LABEL, VolumeSource,
};
use mesos_gpu_docker::bridge::DockerBridge;
use mesos_gpu_docker::client::{DockerClient, mesos_container_id};
use mesos_gpu_docker::daemons::EngineDaemons;
use mesos_gpu_isolator::agent_flags::{MIG_RESOURCE_PREFIX, MigOffer, MigStrategy};
use mesos_gpu_isolator::devices::DeviceNodes;
use mesos_gpu_isolator::inventory::{Gpu, Inventory};
use mesos_gpu_isolator::lifecycle::{
    CheckpointError, ContainerId, DockerReservation, DockerStart, Isolator, IsolatorConfig,
    LifecycleError, MigConfig, PoolConfig, PoolRole, PrepareConfig, RecoveryReport,
};
use mesos_gpu_isolator::mig::MigKind;
use mesos_gpu_isolator::pool::Host;
use mesos_gpu_volume::VolumeManager;

use crate::ctx::Ctx;

/// The default Docker daemon socket.
pub(crate) const DEFAULT_DOCKER_SOCKET: &str = "/var/run/docker.sock";
/// How long a call waits for another user of the work directory to finish.
pub(crate) const LOCK_WAIT: Duration = Duration::from_secs(10);
/// The kernel's fresh random UUID on each read (random(4)).
const UUID_SOURCE: &str = "/proc/sys/kernel/random/uuid";

#[derive(clap::Args)]
#[command(
    long_about = "Reserve N GPUs from the node's GPU pool (--pool-dir, the pool the agent's module \
                  and `mesos-gpu run` draw from; the reservation is recorded in \
                  --docker-state-dir) and print the \
                  `docker run` arguments that give them to a container: --name=mesos-<ID>, the \
                  device nodes, and for images that ask for it the driver volume at \
                  /usr/local/nvidia plus NVIDIA_VISIBLE_DEVICES. The GPUs stay reserved until \
                  `--release ID`, or until the process that asked for them (--starter-pid) has \
                  ended and the daemon (--docker-socket) has no running container mesos-<ID>.",
    after_help = "Examples:\n  \
    docker run $(mesos-gpu docker-args --gpus 2 --image nvidia/cuda:12.4.1-base) nvidia/cuda:12.4.1-base nvidia-smi\n  \
    mesos-gpu docker-args --gpus 1 --plugin --container-id 3d8a52b4-1c5e-4f5a-9c1e-2b7d9a0e6f11\n  \
    mesos-gpu docker-args --release 3d8a52b4-1c5e-4f5a-9c1e-2b7d9a0e6f11\n  \
    mesos-gpu --simulate dgx1-v100 docker-args --gpus 4 --json --pool-dir /tmp/pool --docker-state-dir /tmp/docker-state\n  \
    docker run $(mesos-gpu docker-args --gpus 1 --numa-pinning --cpus 2) busybox grep Cpus_allowed /proc/self/status\n  \
    docker run $(mesos-gpu docker-args --gpus 1 --gpu-replicas 4 --gpu-sharing mps --image IMAGE) IMAGE python infer.py"
)]
pub(crate) struct Args {
    /// Number of whole GPUs to reserve (a whole number from 0 to the GPUs of the node); none
    /// with --mig, which reserves MIG devices instead.
    #[arg(
        long,
        value_name = "N",
        required_unless_present_any = ["release", "mig"],
        allow_negative_numbers = true,
        value_parser = super::parse_gpus
    )]
    gpus: Option<u32>,

    /// Give back the GPUs reserved for container ID instead; refused while the daemon says
    /// container mesos-ID still runs (or cannot tell), unless --force.
    #[arg(
        long,
        value_name = "ID",
        conflicts_with_all = ["gpus", "image", "container_id"],
        value_parser = |s: &str| ContainerId::new(s).map_err(|e| e.to_string())
    )]
    release: Option<ContainerId>,

    /// With --release: give the GPUs back even if the container may still run.
    #[arg(long, requires = "release")]
    force: bool,

    /// The container's id: a UUID (Mesos ContainerID); a new one by default.
    #[arg(long, value_name = "ID", value_parser = |s: &str| container_id(s).map_err(|e| format!("{e:#}")))]
    container_id: Option<ContainerId>,

    /// Image to inspect (labels, env, CUDA version) through the Docker daemon. Without it the
    /// image is taken to ask for the driver volume, as nvidia-docker's /docker/cli assumed.
    #[arg(long, value_name = "IMAGE")]
    image: Option<String>,

    #[command(flatten)]
    volume: super::DriverVolumeArgs,

    #[command(flatten)]
    reservations: super::DockerPoolArgs,

    /// With --image: an image the daemon does not have yet is taken to ask for the driver
    /// volume instead of being an error (the agent's hook reserves before the agent pulls the
    /// image; `docker-wrapper` checks the image again at `docker run`).
    #[arg(long, requires = "image")]
    unpulled_image_ok: bool,

    #[command(flatten)]
    daemon: super::DockerSocketArgs,

    /// The process that starts the container: the reservation stays while it runs, even
    /// before the container exists (default: the parent process, e.g. the agent whose hook runs
    /// this command, or the shell of `docker run $(mesos-gpu docker-args …)`).
    #[arg(long, value_name = "PID")]
    starter_pid: Option<u32>,

    #[command(flatten)]
    numa: super::NumaArgs,

    #[command(flatten)]
    sharing: super::SharingArgs,

    /// On a node with GPUs in MIG mode: `single` (`--gpus` counts MIG devices and whole GPUs) or
    /// `mixed` (`--gpus` for whole GPUs, `--mig` for MIG devices), as the agent offers them.
    #[arg(long, value_name = "single|mixed", default_value = "single")]
    mig_strategy: MigStrategy,

    /// With `--mig-strategy mixed`: MIG devices of a GPU instance profile, `PROFILE:N`, the
    /// profile by the id `mesos-gpu info` shows (`19:1` for one 1g.5gb) or by the scalar
    /// `agent-flags` offers (`mig-1g.5gb:1`, what the agent's Docker hook passes); repeatable.
    #[arg(long, value_name = "PROFILE:N", value_parser = parse_mig)]
    mig: Vec<(MigProfile, u32)>,

    /// Print a JSON array of arguments instead of one line.
    #[arg(long)]
    json: bool,
}

/// A GPU instance profile as `--mig` names it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum MigProfile {
    /// By id (`19`).
    Id(u32),
    /// By the scalar resource the agent offers (`mig-1g.5gb`).
    Resource(String),
}

fn parse_mig(s: &str) -> Result<(MigProfile, u32), String> {
    let bad = || {
        format!(
            "--mig {s:?}: expected PROFILE:COUNT, PROFILE a profile id (19:1) or the scalar the agent offers (mig-1g.5gb:1)"
        )
    };
    let (profile, n) = s.rsplit_once(':').ok_or_else(bad)?;
    let n = n.trim().parse().map_err(|_| bad())?;
    let profile = profile.trim();
    let profile = match profile.parse() {
        Ok(id) => MigProfile::Id(id),
        Err(_)
            if profile.len() > MIG_RESOURCE_PREFIX.len()
                && profile.starts_with(MIG_RESOURCE_PREFIX) =>
        {
            MigProfile::Resource(profile.to_owned())
        }
        Err(_) => return Err(bad()),
    };
    Ok((profile, n))
}

/// The `--mig` arguments as counts by kind (a profile id: a MIG device spanning its GPU
/// instance); a scalar name is looked up in what this node offers with the mixed strategy, as
/// the module does.
fn mig_request(
    inventory: &Inventory,
    asked: &[(MigProfile, u32)],
) -> anyhow::Result<BTreeMap<MigKind, u32>> {
    let offer = MigOffer::of(inventory, MigStrategy::Mixed);
    let mut out = BTreeMap::new();
    for (profile, n) in asked {
        let kind = match profile {
            MigProfile::Id(id) => {
                // A profile no MIG device of the node has is not "0 free" but unknown.
                let profiles: BTreeMap<u32, &str> = inventory
                    .mig
                    .devices
                    .iter()
                    .filter_map(|d| Some((d.profile?, d.profile_name.as_str())))
                    .collect();
                if !profiles.contains_key(id) {
                    let known: Vec<String> = profiles
                        .iter()
                        .map(|(p, name)| format!("{p} ({name})"))
                        .collect();
                    anyhow::bail!(
                        "--mig {id}:{n}: this node has no MIG device of GPU instance profile \
                         {id} (its profiles: {})",
                        if known.is_empty() {
                            "none, no GPU is in MIG mode".to_owned()
                        } else {
                            known.join(", ")
                        }
                    );
                }
                MigKind::whole(*id)
            }
            MigProfile::Resource(name) => offer
                .profiles
                .iter()
                .find(|p| &p.resource == name)
                .and_then(|p| p.kind)
                .with_context(|| {
                    let known: Vec<&str> =
                        offer.profiles.iter().map(|p| p.resource.as_str()).collect();
                    format!(
                        "--mig {name}:{n}: this node offers no MIG profile {name} (offered: {})",
                        if known.is_empty() {
                            "none".to_owned()
                        } else {
                            known.join(", ")
                        }
                    )
                })?,
        };
        *out.entry(kind).or_insert(0) += n;
    }
    Ok(out)
}

/// Opens the Docker containers' reservations in `--docker-state-dir` on the node's pool and recovers
/// them from their checkpoint, waiting up to [`LOCK_WAIT`] while another process holds the
/// directory. Drop it to let others in.
pub(crate) fn open_pool(ctx: &Ctx, args: &super::DockerPoolArgs) -> anyhow::Result<Isolator> {
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
    sharing: Option<mesos_gpu_isolator::lifecycle::SharingConfig>,
    mut mig: MigConfig,
) -> anyhow::Result<Isolator> {
    mig.dev_root = ctx
        .dev_root()
        .map_or_else(|| PathBuf::from("/dev"), Path::to_path_buf);
    mig.proc_root = ctx.proc_root()?;
    let inventory = ctx.inventory()?.clone();
    let nodes = match ctx.dev_root() {
        Some(root) => DeviceNodes::scan(root, &inventory).with_context(|| {
            format!(
                "cannot read the NVIDIA device nodes under {}",
                root.display()
            )
        })?,
        None => DeviceNodes::default(),
    };
    let work_dir = args.state_dir()?;
    let (isolator, report) = open_on(&work_dir, args, sharing, mig, inventory, nodes)?;
    if let Some(unchecked) = &report.unchecked {
        tracing::warn!(records = %unchecked, docker_state_dir = %work_dir.display(), "kept GPU records this process cannot check as they were written; none of their GPUs is granted");
    }
    Ok(isolator)
}

/// Opens the Docker containers' reservations like [`open_pool`], loading no NVML: for what
/// needs no GPU seen (`what`: claiming a reservation for its container, releasing it), by
/// container id. Every record is kept as written; nothing can be granted.
pub(crate) fn open_records(args: &super::DockerPoolArgs, what: &str) -> anyhow::Result<Isolator> {
    let inventory = Inventory {
        absent_reason: Some(format!("{what} loads no NVML")),
        ..Inventory::default()
    };
    let work_dir = args.state_dir()?;
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
    sharing: Option<mesos_gpu_isolator::lifecycle::SharingConfig>,
    mig: MigConfig,
    inventory: Inventory,
    nodes: DeviceNodes,
) -> anyhow::Result<(Isolator, RecoveryReport)> {
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

/// The endpoint recorded for the daemon at `socket`, as `docker -H` spells it.
pub(crate) fn daemon_endpoint(socket: &Path) -> String {
    format!("unix://{}", socket.display())
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
        mesos_container_id(&DockerBridge::docker_name(&parsed)).is_some(),
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

pub(crate) fn run(args: &Args, ctx: &Ctx) -> anyhow::Result<ExitCode> {
    if let Some(id) = &args.release {
        // Releasing a container's own reservation needs no GPU seen: no NVML is loaded.
        let pool = open_records(&args.reservations, "docker-args --release")?;
        let kept = if args.force {
            pool.release_docker(id).map(|()| None)
        } else {
            pool.release_docker_if_gone(id)
        };
        if let Some(why) = kept.with_context(|| format!("cannot release the GPUs of {id}"))? {
            anyhow::bail!("the GPUs of {id} stay reserved: {why} (--force releases them anyway)");
        }
        return Ok(ExitCode::SUCCESS);
    }
    // clap requires --gpus unless --mig (or --release) is given.
    let gpus = args.gpus.unwrap_or(0);
    anyhow::ensure!(
        gpus == 0 || args.mig.is_empty(),
        "--gpus {gpus} with --mig: a container gets whole GPUs or MIG devices, not both (CUDA \
         uses only one MIG device per process, and CUDA_VISIBLE_DEVICES would name a GPU beside \
         it); leave --gpus out with --mig, and start whole GPUs in another container"
    );
    super::require_gpus(ctx, gpus)?;
    let id = match &args.container_id {
        Some(id) => id.clone(),
        None => new_container_id()?,
    };
    let assumed = || ImageInfo {
        labels: [(VOLUMES_NEEDED_LABEL.to_owned(), "nvidia_driver".to_owned())].into(),
        env: Vec::new(),
    };
    let image = match &args.image {
        Some(name) => {
            let runtime =
                tokio::runtime::Runtime::new().context("cannot start the async runtime")?;
            let found = runtime.block_on(async {
                let client = DockerClient::connect(&args.daemon.docker_socket).await?;
                client.image_info(name).await
            });
            match found {
                Ok(info) => info,
                Err(e) if args.unpulled_image_ok && e.is_not_found() => {
                    tracing::info!(image = %name, "the image is not pulled yet; docker-wrapper checks it at docker run");
                    assumed()
                }
                Err(e) => return Err(e.into()),
            }
        }
        None => assumed(),
    };
    let driver = driver_spec(ctx, &args.volume, image.wants_driver())?;
    let host = super::serve::host_devices(ctx)?;
    // Everything but the GPUs is checked before anything is reserved.
    LaunchPlan::new(&[], &host, &image, driver.as_ref())?;
    let starter_pid = args
        .starter_pid
        .unwrap_or_else(std::os::unix::process::parent_id);
    let starter = Host::default()
        .stamp(starter_pid)
        .with_context(|| format!("--starter-pid {starter_pid}: no such process"))?;
    let start = DockerStart {
        daemon: Some(daemon_endpoint(&args.daemon.docker_socket)),
        starter: Some(starter),
    };
    let mig = MigConfig {
        strategy: args.mig_strategy,
        ..MigConfig::default()
    };
    let pool = open_pool_sharing(ctx, &args.reservations, args.sharing.config(ctx)?, mig)?;
    let request = PrepareConfig {
        gpus: f64::from(gpus),
        mig: mig_request(ctx.inventory()?, &args.mig)?,
        ..PrepareConfig::default()
    };
    let reservation = DockerReservation::reserve_request(&pool, &id, &request, start)?;
    let mig_args = mesos_gpu_docker::args::mig_args(reservation.mig(), &host, reservation.gpus())?;
    let share = reservation
        .share()
        .map(mesos_gpu_docker::args::share_args)
        .transpose()?;
    let refs: Vec<&Gpu> = reservation.gpus().iter().collect();
    let plan = LaunchPlan::new(&refs, &host, &image, driver.as_ref())?;
    let pinning = if args.numa.numa_pinning {
        let indices: Vec<u32> = reservation.gpus().iter().map(|g| g.index).collect();
        crate::numa::docker_pinning(ctx, &indices, args.numa.cpus)?
    } else {
        None
    };
    reservation.keep();
    drop(pool);
    let mut line = vec![format!("--name={}", DockerBridge::docker_name(&id))];
    line.extend(plan.cli_args_with_mig(mig_args));
    // The driver seen here, for `docker-wrapper`'s CUDA check (it loads no NVML).
    if let Some(driver) = &driver {
        line.extend(super::docker_wrapper::driver_labels(&driver.info));
    }
    if let Some(pinning) = &pinning {
        line.extend(mesos_gpu_docker::args::cpuset_args(pinning));
    }
    line.extend(share.into_iter().flatten());
    let text = if args.json {
        serde_json::to_string(&line)?
    } else {
        line.join(" ")
    };
    let mut out = std::io::stdout().lock();
    writeln!(out, "{text}")?;
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}
