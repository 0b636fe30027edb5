//! `mesos-gpu demo`: a simulated GPU agent, end to end, in one command.
//!
//! The command picks the node (the simulated DGX-1 unless told otherwise), the stream and the
//! scenario, paces the replay and prints the report; the replay itself is
//! [`mesos_gpu_demo`]'s. Nothing on the host changes: scratch files live in one temp directory,
//! removed at exit; `--live` (root) also creates and removes the containers' device cgroups
//! through the isolator.

use std::io::{IsTerminal as _, Write as _};
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context as _, bail, ensure};
use mesos_gpu_demo::{Live, Setup, Stream};
use mesos_gpu_enforce::cgroup::CgroupLayout;
use mesos_gpu_node::inventory::Inventory;
use mesos_gpu_os::fsmode;
use mesos_gpu_placement::allocator::Policy;
use serde::Serialize;

use crate::ctx::{Ctx, GlobalArgs};

/// The node used when neither `--simulate` nor `--nvml-lib` is given.
const DEFAULT_NODE: &str = "dgx1-v100";

#[derive(clap::Args)]
#[command(
    long_about = "Run a simulated GPU agent end to end: a stream of Marathon apps (MESOS and DOCKER \
                  containers, 1 to 8 GPUs, one bad request) goes through the real allocator, device \
                  rules, mounts, Docker arguments and driver-volume planner, and the result is shown \
                  with a per-GPU timeline and a comparison with first-fit.\n\n\
                  The node is the simulated DGX-1 (dgx1-v100) unless --simulate names another (see \
                  `mesos-gpu info --simulate list`). Nothing on the host changes: scratch files live \
                  in a temp directory removed at exit. --live (root only) also creates and removes \
                  the containers' device cgroups through the isolator.",
    after_help = "Examples:\n  \
        cargo run --release -p mesos-gpu -- demo\n  \
        mesos-gpu demo --policy first-fit\n  \
        mesos-gpu --simulate hgx16 demo --json | jq \\\n      \
        '.run.tasks[] | {task, outcome, gpus: .chosen.gpus}'\n  \
        mesos-gpu demo --stream my-apps/stream.json --pace 600\n  \
        mesos-gpu demo --gpu-replicas 4,4=1,5=1,6=1,7=1 --gpu-sharing mps\n  \
        mesos-gpu --simulate dgx-a100-mig demo\n  \
        sudo mesos-gpu demo --live"
)]
pub(crate) struct Args {
    /// Stream file (`{"arrivals": [{"at", "app", "runs_for"}]}`, app files relative to it)
    /// [default: the built-in examples/marathon/stream.json].
    #[arg(long, value_name = "FILE")]
    stream: Option<PathBuf>,

    /// How GPUs are chosen; the other policy is run on the same stream for comparison.
    #[arg(long, value_name = "POLICY", default_value = "topology", value_parser = parse_policy)]
    policy: Policy,

    /// Print one JSON report on stdout instead of text.
    #[arg(long)]
    json: bool,

    /// Replay in real time, N times faster (e.g. 600 plays ten simulated minutes a second).
    #[arg(long, value_name = "N")]
    pace: Option<f64>,

    /// Needs root: also create and remove each MESOS container's device cgroup through the
    /// isolator, over a temp dev root of mknod'ed nodes, and reserve DOCKER containers' GPUs
    /// through it; DOCKER apps become real containers when a Docker daemon answers.
    #[arg(long)]
    live: bool,

    /// Replay the stream on a node that shares GPUs (the module's `gpu_replicas`): which tasks
    /// get shares, where they are packed, their limits, and what the same node refuses without
    /// sharing. A dry run only.
    #[command(flatten)]
    sharing: super::SharingArgs,

    /// Local image the live DOCKER containers run (built FROM scratch with /bin/busybox when
    /// missing, and then removed at exit).
    #[arg(long, value_name = "IMAGE", env = "MESOS_GPU_DEMO_IMAGE", default_value = mesos_gpu_demo::DEFAULT_IMAGE)]
    live_image: String,
}

/// Prints a scenario's report: JSON, or its text.
fn print_scenario(
    json: bool,
    report: &impl Serialize,
    text: impl FnOnce() -> String,
) -> anyhow::Result<ExitCode> {
    let mut out = std::io::stdout().lock();
    if json {
        writeln!(out, "{}", serde_json::to_string_pretty(report)?)?;
    } else {
        write!(out, "{}", text())?;
    }
    Ok(ExitCode::SUCCESS)
}

fn parse_policy(value: &str) -> Result<Policy, String> {
    value.parse().map_err(|e| format!("{e}"))
}

pub(crate) fn run(args: &Args, ctx: &Ctx) -> anyhow::Result<ExitCode> {
    check_options(args)?;
    // The demo runs on a simulated DGX-1 unless told otherwise.
    let default_ctx;
    let ctx = if ctx.global.simulate.is_none() && ctx.global.nvml_lib.is_none() {
        default_ctx = Ctx::new(
            GlobalArgs {
                simulate: Some(DEFAULT_NODE.to_owned()),
                ..ctx.global.clone()
            },
            false,
        );
        &default_ctx
    } else {
        ctx
    };
    let node = ctx
        .global
        .simulate
        .clone()
        .unwrap_or_else(|| "this node".to_owned());
    let inventory = ctx.inventory()?.clone();
    // Nodes that share GPUs or split them with MIG get the stream of small work.
    let small_work = args.sharing.gpu_replicas.is_some() || !inventory.mig.devices.is_empty();
    let stream = match &args.stream {
        Some(path) => Stream::load(path)?,
        None if small_work => Stream::shipped_sharing()?,
        None => Stream::shipped()?,
    };
    if !inventory.mig.devices.is_empty() && args.sharing.gpu_replicas.is_none() {
        ensure!(
            !args.live,
            "--live on a node with MIG devices: the MIG scenario is a dry run; run MIG tasks for real with the module or `mesos-gpu docker-args --mig-strategy`"
        );
        let scratch = scratch()?;
        let report = mesos_gpu_demo::run_mig(
            &stream,
            &inventory,
            args.policy,
            &ctx.proc_root()?,
            scratch.path(),
        )?;
        return print_scenario(args.json, &report, || report.text(&node));
    }
    if let Some(config) = args.sharing.config(ctx)? {
        ensure!(
            !args.live,
            "--live with --gpu-replicas: the sharing scenario is a dry run; run shares for real with `mesos-gpu exec --gpu-replicas`"
        );
        let indices: Vec<u32> = inventory.whole_gpus().map(|g| g.index).collect();
        let plan = config
            .spec
            .resolve(&inventory, &indices)
            .context("cannot share this node's GPUs")?;
        let scratch = scratch()?;
        let report = mesos_gpu_demo::run_sharing(
            &stream,
            &inventory,
            &config,
            &plan,
            args.policy,
            scratch.path(),
        )?;
        return print_scenario(args.json, &report, || report.text(&node));
    }
    run_whole_gpus(args, ctx, node, &inventory, &stream)
}

/// The run's private scratch directory (the dry isolator's checkpoint and pool, the generated
/// driver), removed when dropped.
fn scratch() -> anyhow::Result<tempfile::TempDir> {
    fsmode::private_tempdir("mesos-gpu-demo-").context("cannot create a temp directory")
}

/// Refuses a `--pace` that is no speed-up factor, and `--live` without root.
fn check_options(args: &Args) -> anyhow::Result<()> {
    if let Some(pace) = args.pace {
        ensure!(
            pace.is_finite() && pace > 0.0,
            "--pace {pace}: expected a speed-up factor above 0, e.g. 600"
        );
    }
    if args.live && !fsmode::is_root() {
        bail!(
            "--live creates device cgroups and device nodes and needs root; run it with sudo, or drop --live for the dry run (which changes nothing)"
        );
    }
    Ok(())
}

/// The whole-GPU scenario: the stream through the allocator (and with `--live` the isolator),
/// paced by `--pace`, with progress on a terminal, then the report.
fn run_whole_gpus(
    args: &Args,
    ctx: &Ctx,
    node: String,
    inventory: &Inventory,
    stream: &Stream,
) -> anyhow::Result<ExitCode> {
    let scratch = scratch()?;
    let notes = node_notes(ctx, &node, inventory)?;
    let progress_tty = std::io::stderr().is_terminal() && !args.json;
    let total = stream.arrival_count();
    let mut last_at = 0u64;
    let mut progress = |done: usize, at: u64| {
        if let Some(pace) = args.pace {
            let wait = at.saturating_sub(last_at) as f64 / pace;
            std::thread::sleep(std::time::Duration::from_secs_f64(wait.min(3600.0)));
            tracing::info!(
                arrival = done,
                of = total,
                simulated_second = at,
                "demo progress"
            );
        }
        last_at = at;
        if progress_tty {
            eprint!("\rdemo: {done}/{total} arrivals, t={at}s ");
            if done == total {
                eprint!("\r\x1b[K");
            }
        }
    };
    let setup = Setup {
        node,
        inventory,
        stream,
        policy: args.policy,
        scratch: scratch.path(),
        notes,
        cgroups: CgroupLayout::detect().ok(),
        live: args.live.then(|| Live {
            image: args.live_image.clone(),
            docker_socket: PathBuf::from(super::docker_pool::DEFAULT_DOCKER_SOCKET),
        }),
    };
    let report = mesos_gpu_demo::run(setup, &mut progress)?;
    let mut out = std::io::stdout().lock();
    if args.json {
        serde_json::to_writer_pretty(&mut out, &report)?;
        writeln!(out)?;
    } else {
        let color = std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none();
        report.write_text(&mut out, stream, color)?;
    }
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}

/// The report's notes on the node: no GPUs (and why), and its NUMA layout.
fn node_notes(ctx: &Ctx, node: &str, inventory: &Inventory) -> anyhow::Result<Vec<String>> {
    let mut notes = Vec::new();
    if inventory.gpus.is_empty() {
        notes.push(format!(
            "{node} has no GPUs ({}): every GPU task is refused; try --simulate {DEFAULT_NODE}",
            inventory
                .absent_reason
                .as_deref()
                .unwrap_or("no reason given")
        ));
    }
    let indices: Vec<u32> = inventory.gpus.iter().map(|g| g.index).collect();
    notes.extend(crate::numa::summary(
        &crate::numa::affinities(ctx)?,
        &indices,
    ));
    Ok(notes)
}
