//! `mesos-gpu run`: nvidia-docker's `run` over the shared GPU pool — reserve N GPUs, create and
//! start a container with them, stream its output, and when it ends (or on SIGINT/SIGTERM, after
//! stopping it) give the GPUs back and exit with the container's status.
//!
//! The pool (`--work-dir`, shared with `docker-args` and the isolator) is locked only while
//! GPUs are reserved and the container created, and again while they are released, so many
//! `run`s can go on at once. An image whose `com.nvidia.cuda.version` is newer than the
//! driver's CUDA is refused before anything is reserved. If `run` itself is killed, the
//! container keeps its GPUs until it ends and a recovery (`mesos-gpu serve` at start) or
//! `docker-args --release ID` gives them back.

use std::io::Write as _;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context as _;
use mesos_gpu_docker::bridge::DockerBridge;
use mesos_gpu_docker::client::DockerClient;
use mesos_gpu_isolator::lifecycle::ContainerId;
use tokio::signal::unix::{SignalKind, signal};

use super::docker_pool::{driver_spec, new_container_id, open_pool, open_records};
use crate::ctx::Ctx;

#[derive(clap::Args)]
#[command(
    long_about = "Run IMAGE with N GPUs from the node's GPU pool (--pool-dir; the reservation is \
                  recorded in --docker-state-dir): \
                  reserve, create the container mesos-<ID> with the GPUs' device nodes (and, for \
                  images that ask for it, the driver volume and NVIDIA_VISIBLE_DEVICES), start \
                  it and stream its output. When it ends the GPUs are released and the \
                  container removed (unless --keep). SIGINT/SIGTERM stop the container (docker \
                  stop). Exits with the container's status. Images built for a newer CUDA than \
                  the driver's are refused.",
    after_help = "Examples:\n  \
        mesos-gpu run --gpus 2 nvidia/cuda:12.4.1-base nvidia-smi\n  \
        mesos-gpu run --gpus 1 --plugin nvidia/cuda:12.4.1-base sh -c \\\n      \
        'ls /dev/nvidia*'\n  \
        mesos-gpu --simulate dgx1-v100 --dev-root /tmp/nodes run --gpus 4 \\\n      \
        --pool-dir /tmp/pool --docker-state-dir /tmp/docker-state busybox ls \\\n      \
        /dev\n  \
        mesos-gpu run --gpus 1 --numa-pinning busybox grep Cpus_allowed_list \\\n      \
        /proc/self/status"
)]
pub(crate) struct Args {
    /// Number of GPUs (a whole number from 0 to the GPUs of the node).
    #[arg(
        long,
        value_name = "N",
        allow_negative_numbers = true,
        value_parser = super::parse_gpus
    )]
    gpus: u32,

    #[command(flatten)]
    numa: super::NumaArgs,

    #[command(flatten)]
    volume: super::DriverVolumeArgs,

    #[command(flatten)]
    reservations: super::DockerPoolArgs,

    #[command(flatten)]
    daemon: super::DockerSocketArgs,

    /// Seconds `docker stop` waits after SIGTERM before SIGKILL, on SIGINT/SIGTERM.
    #[arg(long, value_name = "SECONDS", default_value_t = 10)]
    stop_timeout: u16,

    /// Keep the stopped container instead of removing it.
    #[arg(long)]
    keep: bool,

    /// The image, which must be present locally.
    #[arg(value_name = "IMAGE")]
    image: String,

    /// Command and arguments; the image's own command when none is given.
    #[arg(
        value_name = "CMD",
        trailing_var_arg = true,
        allow_hyphen_values = true
    )]
    command: Vec<String>,
}

pub(crate) fn run(args: &Args, ctx: &Ctx) -> anyhow::Result<ExitCode> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    // Handlers first: from here on SIGINT/SIGTERM stop the container instead of killing us.
    let (sigint, sigterm) = {
        let _enter = runtime.enter();
        (
            signal(SignalKind::interrupt())?,
            signal(SignalKind::terminate())?,
        )
    };
    super::require_gpus(ctx, args.gpus)?;
    let id = new_container_id()?;
    let gpus = ctx.inventory()?.gpus.clone();
    runtime.block_on(async {
        let client = DockerClient::connect(&args.daemon.docker_socket).await?;
        let image = client.image_info(&args.image).await.with_context(|| {
            format!("image {} (it must be present locally: docker pull it first)", args.image)
        })?;
        let driver = driver_spec(ctx, &args.volume, image.wants_driver())?;
        // Reserve and create with the pool open; it is closed again while the container runs.
        let container = {
            let records = Arc::new(open_pool(ctx, &args.reservations)?);
            let mut bridge = DockerBridge::new(records, client.clone(), driver, gpus);
            if args.numa.numa_pinning {
                bridge = bridge.pinned(
                    args.numa.cpus,
                    crate::numa::affinities(ctx)?,
                    crate::numa::online()?,
                );
            }
            bridge
                .create(&id, f64::from(args.gpus), &args.image, &args.command)
                .await?
        };
        tracing::info!(
            container = %container.name,
            gpus = ?container.gpus.iter().map(|g| g.index).collect::<Vec<_>>(),
            "created"
        );
        let stops = futures_util::stream::select(
            futures_util::stream::unfold(sigint, |mut s| async { s.recv().await.map(|()| ((), s)) }),
            futures_util::stream::unfold(sigterm, |mut s| async { s.recv().await.map(|()| ((), s)) }),
        );
        let outcome = async {
            let code = client
                .run_foreground(
                    &container.docker_id,
                    i32::from(args.stop_timeout),
                    stops,
                    |stderr, bytes| {
                        // A closed stdout or stderr must not stop the container.
                        let _ = if stderr {
                            std::io::stderr().write_all(bytes)
                        } else {
                            std::io::stdout().write_all(bytes)
                        };
                    },
                )
                .await?;
            anyhow::Ok(code)
        }
        .await;
        let _ = std::io::stdout().flush();
        // The GPUs go back only once the container is known to have ended or is removed.
        let ended = match (&outcome, args.keep) {
            (Ok(_), true) => true,
            (Ok(_), false) => {
                if let Err(e) = client.remove(&container.docker_id, true).await {
                    tracing::warn!(error = %e, "cannot remove the container");
                }
                true
            }
            (Err(_), _) => match client.remove(&container.docker_id, true).await {
                Ok(()) => true,
                Err(e) => {
                    tracing::error!(error = %e, "cannot remove the container; its GPUs stay reserved");
                    false
                }
            },
        };
        if ended {
            release(ctx, args, &id)?;
        }
        let code = outcome?;
        tracing::info!(container = %container.name, code, "container ended; GPUs released");
        Ok(exit_code(code))
    })
}

/// Gives the container's GPUs back, by its id: no NVML is needed for that.
fn release(ctx: &Ctx, args: &Args, id: &ContainerId) -> anyhow::Result<()> {
    let records = open_records(ctx, &args.reservations, "mesos-gpu run's release")?;
    records.release_docker(id).with_context(|| {
        format!("cannot release the GPUs of {id}; `mesos-gpu docker-args --release {id}` retries")
    })
}

/// The container's status as ours: 0 to 255 as is, anything else (never seen from Docker) 255.
fn exit_code(code: i64) -> ExitCode {
    ExitCode::from(u8::try_from(code).unwrap_or(u8::MAX))
}
