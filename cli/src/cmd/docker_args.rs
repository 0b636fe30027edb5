//! `mesos-gpu docker-args`: reserve N GPUs from the shared pool and print the `docker run`
//! arguments that give them to a container; `--release ID` gives them back.
//!
//! The GPUs come from the node's one pool (`--pool-dir`, shared with the agent's module,
//! `exec`, `run` and `serve`); the Docker containers' own record is checkpointed in
//! `--docker-state-dir` (default [`super::DEFAULT_DOCKER_STATE_DIR`], see [`super::docker_pool`]).
//! What the container gets is its grant as a [`DockerLaunch`], rendered for the image as every
//! Docker path renders one ([`DockerLaunch::render`]): device nodes, the devices' variables, a
//! share's and, with `--numa-pinning`, a cpuset; the driver volume (and `PATH` and
//! `LD_LIBRARY_PATH` from the image's own) for images that ask for it. Without `--image` the
//! image is not known: the driver volume and the variables are given, as nvidia-docker 1.0's
//! `/docker/cli` did, and no `PATH`, which would replace the image's. `--json` prints the
//! launch itself, for `docker-wrapper` to render once the image is pulled.
//!
//! The arguments start with `--name=mesos-<ID>`: the reservation records that name, the daemon
//! (`--docker-socket`) and the process that starts the container (`--starter-pid`, default the
//! parent); the pool frees it once that process has ended and the daemon has no running
//! container of that name (`mesos-gpu serve` at start also releases containers not running).

use std::collections::BTreeMap;
use std::io::Write as _;
use std::process::ExitCode;

use anyhow::Context as _;
use mesos_gpu_docker::args::{DockerLaunch, LaunchPlan};
use mesos_gpu_docker::client::{DockerClient, docker_name};
use mesos_gpu_isolator::agent_flags::{MIG_RESOURCE_PREFIX, MigOffer, MigStrategy};
use mesos_gpu_isolator::lifecycle::{
    ContainerId, DockerGuard, DockerStart, MigConfig, PrepareConfig,
};
use mesos_gpu_node::inventory::Inventory;
use mesos_gpu_placement::mig::MigKind;
use mesos_gpu_pool::{Holder, Host};

use super::docker_pool::{
    container_id, driver_spec, new_container_id, open_pool_sharing, open_records,
};
use crate::ctx::Ctx;

#[derive(clap::Args)]
#[command(
    long_about = "Reserve N GPUs from the node's GPU pool (--pool-dir, the pool the agent's module \
                  and `mesos-gpu run` draw from; the reservation is recorded in \
                  --docker-state-dir) and print the \
                  `docker run` arguments that give them to a container: --name=mesos-<ID>, the \
                  device nodes and NVIDIA_VISIBLE_DEVICES, and for images that ask for it the \
                  driver volume at /usr/local/nvidia (without --image: the volume, and no \
                  PATH, so the image's own is kept). With --json, the reservation as a \
                  versioned JSON object (what docker-wrapper reads from MESOS_GPU_DOCKER_ARGS \
                  and renders for the pulled image). The GPUs stay reserved until \
                  `--release ID`, or until the process that asked for them (--starter-pid) has \
                  ended and the daemon (--docker-socket) has no running container mesos-<ID>.",
    after_help = "Examples:\n  \
        docker run $(mesos-gpu docker-args --gpus 2 --image \\\n      \
        nvidia/cuda:12.4.1-base) nvidia/cuda:12.4.1-base nvidia-smi\n  \
        mesos-gpu docker-args --gpus 1 --plugin --container-id \\\n      \
        3d8a52b4-1c5e-4f5a-9c1e-2b7d9a0e6f11\n  \
        mesos-gpu docker-args --release 3d8a52b4-1c5e-4f5a-9c1e-2b7d9a0e6f11\n  \
        mesos-gpu --simulate dgx1-v100 docker-args --gpus 4 --json --pool-dir \\\n      \
        /tmp/pool --docker-state-dir /tmp/docker-state --task-id train-7 \\\n      \
        --framework-id 5f0f-0000 --executor-id train-7\n  \
        docker run $(mesos-gpu docker-args --gpus 1 --numa-pinning --cpus 2) \\\n      \
        busybox grep Cpus_allowed /proc/self/status\n  \
        docker run $(mesos-gpu docker-args --gpus 1 --gpu-replicas 4 \\\n      \
        --gpu-sharing mps --image IMAGE) IMAGE python infer.py"
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
    /// container mesos-ID still runs (or cannot tell), unless --force. A container that holds
    /// no GPUs is said so on stderr, with exit 0 (the agent's hook releases every Docker
    /// container at its end, GPUs or not).
    #[arg(
        long,
        value_name = "ID",
        conflicts_with_all = ["gpus", "mig", "image", "container_id"],
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
    /// driver volume is given, as nvidia-docker's /docker/cli gave it to any image, and no
    /// PATH or LD_LIBRARY_PATH (the image's own are kept).
    #[arg(long, value_name = "IMAGE")]
    image: Option<String>,

    #[command(flatten)]
    volume: super::DriverVolumeArgs,

    #[command(flatten)]
    reservations: super::DockerPoolArgs,

    /// With --image: an image the daemon does not have yet is taken as not known (as without
    /// --image) instead of being an error (the agent's hook reserves before the agent pulls the
    /// image; `docker-wrapper` renders the --json launch for it at `docker run`).
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

    /// Print the reservation as a JSON object instead of one line of arguments: {"version":1,
    /// "name":"mesos-<ID>", "devices", "env", "binds", "cpuset", "driver"}, the launch
    /// `docker-wrapper` renders for the image (the agent's hook passes it in
    /// MESOS_GPU_DOCKER_ARGS).
    #[arg(long)]
    json: bool,

    /// Whose container it is, recorded with the reservation (the pool's owner `holder`, shown
    /// by `gpu list` and the metrics' labels): the Mesos task id (the agent's hook passes
    /// each of these it knows).
    #[arg(long, value_name = "ID", conflicts_with = "release")]
    task_id: Option<String>,

    /// The Mesos task's name, recorded with the reservation.
    #[arg(long, value_name = "NAME", conflicts_with = "release")]
    task_name: Option<String>,

    /// The Mesos executor id, recorded with the reservation.
    #[arg(long, value_name = "ID", conflicts_with = "release")]
    executor_id: Option<String>,

    /// The Mesos framework id, recorded with the reservation.
    #[arg(long, value_name = "ID", conflicts_with = "release")]
    framework_id: Option<String>,
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

pub(crate) fn run(args: &Args, ctx: &Ctx) -> anyhow::Result<ExitCode> {
    if let Some(id) = &args.release {
        // Releasing a container's own reservation needs no GPU seen: no NVML is loaded.
        let records = open_records(ctx, &args.reservations, "docker-args --release")?;
        if !records.holds_docker(id)? {
            // Not an error: the hook releases every Docker container at its end, GPUs or not.
            eprintln!(
                "docker-args: container {id} holds no GPUs in the Docker record in {} (nothing released)",
                args.reservations.state_dir(ctx)?.display()
            );
            return Ok(ExitCode::SUCCESS);
        }
        let kept = if args.force {
            records.release_docker(id).map(|()| None)
        } else {
            records.release_docker_if_gone(id)
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
    // `None`: the image is not known (not named, or not pulled yet).
    let image = match &args.image {
        Some(name) => {
            let runtime =
                tokio::runtime::Runtime::new().context("cannot start the async runtime")?;
            let found = runtime.block_on(async {
                let client = DockerClient::connect(&args.daemon.docker_socket).await?;
                client.image_info(name).await
            });
            match found {
                Ok(info) => Some(info),
                Err(e) if args.unpulled_image_ok && e.is_not_found() => {
                    tracing::info!(image = %name, "the image is not pulled yet; docker-wrapper renders for it at docker run");
                    None
                }
                Err(e) => return Err(e.into()),
            }
        }
        None => None,
    };
    let wants_driver = image.as_ref().is_none_or(|i| i.wants_driver());
    let driver = driver_spec(ctx, &args.volume, wants_driver)?;
    // Everything but the devices is checked before anything is reserved.
    LaunchPlan::check_image(image.as_ref(), driver.as_ref())?;
    let starter_pid = args
        .starter_pid
        .unwrap_or_else(std::os::unix::process::parent_id);
    let starter = Host::default()
        .stamp(starter_pid)
        .with_context(|| format!("--starter-pid {starter_pid}: no such process"))?;
    let start = DockerStart {
        daemon: Some(mesos_gpu_docker::client::endpoint(
            &args.daemon.docker_socket,
        )),
        starter: Some(starter),
    };
    let mig = MigConfig {
        strategy: args.mig_strategy,
        ..MigConfig::default()
    };
    let records = open_pool_sharing(ctx, &args.reservations, args.sharing.config(ctx)?, mig)?;
    let request = PrepareConfig {
        gpus: f64::from(gpus),
        mig: mig_request(ctx.inventory()?, &args.mig)?,
        holder: Holder {
            executor_id: args.executor_id.clone(),
            framework_id: args.framework_id.clone(),
            framework_name: None,
            task_id: args.task_id.clone(),
            task_name: args.task_name.clone(),
        }
        .known(),
        ..PrepareConfig::default()
    };
    let mut reservation = DockerGuard::reserve_request(&records, &id, &request, start)?;
    if args.numa.numa_pinning {
        let affinities = crate::numa::affinities(ctx)?;
        reservation.pin(args.numa.cpus, &affinities, &crate::numa::online()?);
    }
    let name = docker_name(&id);
    let launch = DockerLaunch::new(reservation.grant(), driver.as_ref())?.named(name.clone());
    // Rendered here too, so that what the image refuses is refused before the GPUs are kept.
    let plan = launch.render(image.as_ref())?;
    reservation.keep();
    drop(records);
    let text = if args.json {
        serde_json::to_string(&launch)?
    } else {
        let mut line = vec![format!("--name={name}")];
        line.extend(plan.cli_args());
        line.join(" ")
    };
    let mut out = std::io::stdout().lock();
    writeln!(out, "{text}")?;
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}
