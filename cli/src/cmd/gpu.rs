//! `mesos-gpu gpu health`, `mesos-gpu gpu mark-healthy <index|uuid>`, `mesos-gpu gpu probe`
//! (the health monitor's default probe: NVML and CUDA checks of one GPU, read-only), and the
//! node's GPU pool:
//! `mesos-gpu gpu list` (who holds what, since when, whether the owner is still there, why a
//! GPU is quarantined or unhealthy) and `mesos-gpu gpu release <owner>|--dead`.
//!
//! The agent's health monitor checkpoints GPU health to `<agent work dir>/gpu/health.json` and
//! holds an exclusive lock on `<agent work dir>/gpu/health.lock` while it runs
//! (`mesos_gpu_health::HealthStore`). `mark-healthy` therefore:
//! - when no monitor runs (the lock is free): edits the checkpoint itself, under the lock, so
//!   the next agent start reads the GPU back healthy;
//! - when a monitor runs: leaves a request file in `<agent work dir>/gpu/health-requests/`, which the
//!   monitor takes within its wait timeout (250 ms by default), marks the GPU healthy, tells the
//!   allocator, checkpoints and answers; the command waits for the answer and reports it.
//!
//! A GPU the checkpoint does not know, a work directory without a checkpoint or monitor (a wrong
//! `--agent-work-dir`), and a GPU NVML still reports lost are refused (exit 1), naming what was looked
//! at. `gpu health` only reads: it creates no file.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write as _;
use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context as _, bail};
use mesos_gpu_health::gpu_check::{CheckOptions, DEFAULT_CUDA_LIB, check_gpu};
use mesos_gpu_health::{
    Comeback, GpuHealth, GpuRecord, GpuRef, HealthError, HealthSnapshot, HealthStore, ProbeCgroup,
    ProbeConfig, ProbeTarget, RecoveryRecord, probe::run_probe,
};
use mesos_gpu_node::inventory::Gpu;

use mesos_gpu_docker::daemons::EngineDaemons;
use mesos_gpu_pool::{Host, Listing, Pool};

use crate::ctx::Ctx;

mod top;

#[derive(clap::Args)]
#[command(
    after_help = "Examples:\n  mesos-gpu gpu list\n  mesos-gpu gpu health --json\n  \
    mesos-gpu gpu mark-healthy 3 --agent-work-dir /var/lib/mesos\n  mesos-gpu gpu release --dead"
)]
pub(crate) struct Args {
    #[command(subcommand)]
    command: GpuCommand,
}

#[derive(clap::Subcommand)]
enum GpuCommand {
    /// Show each GPU's checkpointed health: state, reason, since when, XIDs seen.
    #[command(
        after_help = "Examples:\n  mesos-gpu gpu health\n  mesos-gpu gpu health --agent-work-dir /var/lib/mesos --json"
    )]
    Health(HealthArgs),
    /// Declare a GPU healthy again (after the operator has checked or reset it).
    #[command(after_help = "Examples:\n  \
        mesos-gpu gpu mark-healthy 3\n  \
        mesos-gpu gpu mark-healthy GPU-8a2d4c6e-1f3b-4a5c-9e7d-2b4f6a8c0e12 \\\n      \
        --agent-work-dir /var/lib/mesos")]
    MarkHealthy(MarkArgs),
    /// List what the node's GPU pool holds: owner, GPUs, since when, whether the owner is still
    /// there (and why), unhealthy GPUs. Reads only.
    #[command(
        after_help = "Examples:\n  mesos-gpu gpu list\n  mesos-gpu gpu list --json\n  \
        mesos-gpu gpu list --pool-dir /var/lib/mesos-gpu"
    )]
    List(ListArgs),
    /// The node's GPUs, each with its holders (container, containerizer, share or MIG device,
    /// whether alive), utilisation, memory its holder's processes use and health; refreshed
    /// like top on a terminal, printed once when piped. Usage from the agent's module
    /// (`/mesos-gpu/containers`), else serve (`/gpu/status/json`), else none (the pool alone).
    #[command(after_help = "Examples:\n  \
        mesos-gpu gpu top\n  \
        mesos-gpu gpu top --once --source pool\n  \
        mesos-gpu gpu top --json --agent http://10.0.0.7:5051\n  \
        mesos-gpu gpu top --source serve --serve http://127.0.0.1:3476 --interval 5")]
    Top(top::TopArgs),
    /// Check GPUs through NVML and the CUDA driver API, step by step: what the health monitor's
    /// default probe runs before a GPU comes back by itself. Reads and allocates only; changes
    /// no GPU setting. Exits 1 when a step fails.
    #[command(after_help = "Examples:\n  \
        mesos-gpu gpu probe --gpu 0\n  \
        mesos-gpu gpu probe                            # every GPU in turn\n  \
        mesos-gpu gpu probe --gpu GPU-8a2d4c6e-1f3b-4a5c-9e7d-2b4f6a8c0e12 \\\n      \
        --cuda-lib /usr/lib64/libcuda.so.1\n  \
        # in a one-GPU cgroup, as the monitor runs it (root)\n  \
        mesos-gpu gpu probe --gpu 0 --isolated\n  \
        mesos-gpu gpu probe --gpu 0 --isolated --command \\\n      \
        '/usr/local/bin/check-gpu {index}'")]
    Probe(ProbeArgs),
    /// Give back the GPUs of an owner that is gone (`gpu list` shows it dead), or of every dead
    /// owner with --dead. An owner still alive, or that cannot be checked, is refused unless
    /// --force.
    #[command(after_help = "Examples:\n  mesos-gpu gpu release --dead\n  \
        mesos-gpu gpu release exec-4242-1f2e3d4c\n  \
        mesos-gpu gpu release 3d8a52b4-1c5e-4f5a-9c1e-2b7d9a0e6f11 --force")]
    Release(ReleaseArgs),
}

#[derive(clap::Args)]
struct ListArgs {
    #[command(flatten)]
    pool: super::PoolArgs,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args)]
struct ReleaseArgs {
    /// The owner id, as `gpu list` shows it.
    #[arg(required_unless_present = "dead", conflicts_with = "dead")]
    owner: Option<String>,
    /// Release every owner that is gone.
    #[arg(long)]
    dead: bool,
    /// Release even an owner that is alive or cannot be checked (its GPUs may be in use).
    #[arg(long)]
    force: bool,
    #[command(flatten)]
    pool: super::PoolArgs,
}

#[derive(clap::Args)]
struct ProbeArgs {
    /// The GPU: NVML index (`3`) or UUID (`GPU-…`); every GPU when not given.
    #[arg(long, value_parser = |s: &str| GpuRef::parse(s).map_err(|e| e.to_string()))]
    gpu: Option<GpuRef>,
    /// The CUDA driver library (its absence skips the CUDA steps).
    #[arg(long, value_name = "PATH", env = "MESOS_GPU_CUDA_LIB", default_value = DEFAULT_CUDA_LIB)]
    cuda_lib: std::ffi::OsString,
    /// MiB the CUDA steps allocate, write and read back.
    #[arg(long, value_name = "MIB", default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=16384))]
    mib: u32,
    /// Give up (exit 2) after this many seconds.
    #[arg(long, value_name = "SECONDS", default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..=3600))]
    timeout: u64,
    /// Run the probe as the health monitor does: in a device cgroup of its own that allows
    /// this GPU alone (needs root; on a simulated node without --dev-root, the device nodes
    /// are made in its scratch state, as for `exec`).
    #[arg(long)]
    isolated: bool,
    /// With --isolated: the probe command (`{uuid}`, `{index}` replaced), as the module
    /// parameter `health_probe`; default: this program's own checks.
    #[arg(long, value_name = "CMD", requires = "isolated")]
    command: Option<String>,
    /// With --isolated: the parent of the probe's cgroup (the agent's `--cgroups_root`).
    #[arg(
        long,
        value_name = "NAME",
        default_value = "mesos",
        requires = "isolated"
    )]
    cgroups_root: String,
}

#[derive(clap::Args)]
struct HealthArgs {
    #[command(flatten)]
    store: super::AgentWorkDirCompatArgs,
    /// Print the checkpoint as JSON instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args)]
struct MarkArgs {
    /// The GPU: NVML index (`3`) or UUID (`GPU-…`).
    #[arg(value_parser = |s: &str| GpuRef::parse(s).map_err(|e| e.to_string()))]
    gpu: GpuRef,
    #[command(flatten)]
    store: super::AgentWorkDirCompatArgs,
    /// Seconds to wait for a running monitor to take the request.
    #[arg(long, value_name = "SECONDS", default_value_t = 10)]
    wait: u64,
}

pub(crate) fn run(args: &Args, ctx: &Ctx) -> anyhow::Result<ExitCode> {
    match &args.command {
        GpuCommand::Health(a) => health(a, ctx),
        GpuCommand::MarkHealthy(a) => mark_healthy(a, ctx),
        GpuCommand::List(a) => list(a, ctx),
        GpuCommand::Top(a) => top::top(a, ctx),
        GpuCommand::Probe(a) => probe(a, ctx),
        GpuCommand::Release(a) => release(a),
    }
}

/// What `gpu list --json` prints: the pool's listing, and the recorded GPUs this command does
/// not see with why.
#[derive(serde::Serialize)]
struct Shown<'a> {
    #[serde(flatten)]
    listing: &'a Listing,
    /// The recorded GPUs this command does not see, by owner id.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    unseen: BTreeMap<String, Vec<String>>,
    /// Why it does not see them.
    #[serde(skip_serializing_if = "Option::is_none")]
    unseen_why: Option<String>,
}

/// The GPU and MIG device UUIDs this process sees, and what to say of a recorded GPU it does
/// not: whether discovery works or not, `gpu list` lists every record.
fn seen_here(ctx: &Ctx) -> (BTreeSet<String>, String) {
    match ctx.inventory() {
        Ok(inventory) if !inventory.gpus.is_empty() => (
            inventory
                .gpus
                .iter()
                .map(|g| g.uuid.clone())
                .chain(inventory.mig.devices.iter().map(|d| d.uuid.clone()))
                .collect(),
            format!(
                "not among the {} GPUs NVML reports here",
                inventory.gpus.len()
            ),
        ),
        Ok(inventory) => (
            BTreeSet::new(),
            format!(
                "this process sees no GPU ({})",
                inventory
                    .absent_reason
                    .as_deref()
                    .unwrap_or("NVML reports none")
            ),
        ),
        Err(e) => (BTreeSet::new(), format!("{e:#}")),
    }
}

fn list(args: &ListArgs, ctx: &Ctx) -> anyhow::Result<ExitCode> {
    named_pool_dir(&args.pool, ctx)?;
    let mut out = std::io::stdout().lock();
    let pool = Pool::at(&args.pool.pool_dir);
    let listing = pool.list(&host())?;
    let (seen, why) = seen_here(ctx);
    let unseen: BTreeMap<String, Vec<String>> = listing
        .reservations
        .iter()
        .filter_map(|r| {
            let gpus: Vec<String> = r
                .reservation
                .gpus
                .iter()
                .filter(|u| !seen.contains(u.as_str()))
                .map(ToString::to_string)
                .collect();
            (!gpus.is_empty()).then(|| (r.id.clone(), gpus))
        })
        .collect();
    if args.json {
        let shown = Shown {
            listing: &listing,
            unseen_why: (!unseen.is_empty()).then_some(why),
            unseen,
        };
        writeln!(out, "{}", serde_json::to_string_pretty(&shown)?)?;
        return Ok(ExitCode::SUCCESS);
    }
    write_reservations(&mut out, args, &listing, &unseen, &why)?;
    write_shares(&mut out, &listing)?;
    for (uuid, reason) in &listing.unhealthy {
        writeln!(
            out,
            "unhealthy {uuid}: {reason} (`mesos-gpu gpu mark-healthy {uuid}` once fixed)"
        )?;
    }
    if let Ok(inventory) = ctx.inventory()
        && !inventory.gpus.is_empty()
    {
        writeln!(out)?;
        writeln!(out, "{:<4} {:<40} HELD BY", "GPU", "UUID")?;
        for (index, uuid, holders) in holders_by_gpu(&listing, inventory) {
            let held = match (holders.is_empty(), listing.unhealthy.get(&uuid)) {
                (true, None) => "free".to_owned(),
                (true, Some(reason)) => format!("none (unhealthy: {reason})"),
                (false, _) => holders.join(", "),
            };
            writeln!(out, "{index:<4} {uuid:<40} {held}")?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `gpu list`'s pool file and reservations table: each owner with its GPUs, state and why,
/// the GPUs of it not seen here (`unseen`, and `why`), those recorded without a UUID, and a
/// quarantine's reason.
fn write_reservations(
    out: &mut impl std::io::Write,
    args: &ListArgs,
    listing: &Listing,
    unseen: &BTreeMap<String, Vec<String>>,
    why: &str,
) -> std::io::Result<()> {
    writeln!(out, "GPU pool {}", listing.path.display())?;
    if !listing.path.exists() {
        writeln!(
            out,
            "no pool file there: nothing has reserved GPUs through {} (check --pool-dir or {}: the module's pool_dir parameter, serve's and docker-args' --pool-dir must all name one directory)",
            args.pool.pool_dir.display(),
            mesos_gpu_pool::POOL_DIR_ENV
        )?;
    } else if listing.reservations.is_empty() && listing.shares.is_empty() {
        writeln!(out, "no reservations")?;
    } else {
        writeln!(
            out,
            "{:<40} {:<10} {:<8} {:<10} {:<9} GPUS / WHY",
            "OWNER", "KIND", "COUNT", "SINCE", "STATE"
        )?;
    }
    for r in &listing.reservations {
        let (state, why_state) = r.liveness.describe();
        writeln!(
            out,
            "{:<40} {:<10} {:<8} {:<10} {:<9} {}",
            r.id,
            r.reservation.owner.kind(),
            r.reservation.gpus.len() + r.reservation.unnamed as usize,
            age(r.reservation.since.saturating_mul(1000)),
            state,
            r.reservation
                .gpus
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(",")
        )?;
        writeln!(out, "{:>80} {why_state}", "")?;
        if let Some(gpus) = unseen.get(&r.id) {
            writeln!(out, "{:>80} not seen here: {} ({why})", "", gpus.join(","))?;
        }
        if r.reservation.unnamed > 0 {
            writeln!(
                out,
                "{:>80} {} GPU(s) recorded without a UUID (by a mesos-gpu from before the double-booking fix): no GPU is granted until a process that sees the GPUs names them from the owner's devices, or the owner ends",
                "", r.reservation.unnamed
            )?;
        }
        if let mesos_gpu_pool::Owner::Quarantine { reason } = &r.reservation.owner {
            writeln!(out, "{:>80} quarantined: {reason}", "")?;
        }
        if let Some(holder) = r.reservation.owner.holder() {
            writeln!(out, "{:>80} held by {}", "", describe_holder(holder))?;
        }
    }
    Ok(())
}

/// Whose container a reservation is for, as `gpu list` says it: `task T (NAME), executor E,
/// framework F`, each part only when recorded.
fn describe_holder(h: &mesos_gpu_pool::Holder) -> String {
    let task = h.task_id.as_ref().map(|id| match &h.task_name {
        Some(name) if name != id => format!("task {id} ({name})"),
        _ => format!("task {id}"),
    });
    let framework = h.framework_id.as_ref().map(|id| match &h.framework_name {
        Some(name) => format!("framework {id} ({name})"),
        None => format!("framework {id}"),
    });
    task.into_iter()
        .chain(h.executor_id.as_ref().map(|e| format!("executor {e}")))
        .chain(framework)
        .collect::<Vec<_>>()
        .join(", ")
}

/// `gpu list`'s shares table: each share's owner, units, state and GPU, and why.
fn write_shares(out: &mut impl std::io::Write, listing: &Listing) -> std::io::Result<()> {
    if !listing.shares.is_empty() {
        writeln!(
            out,
            "{:<40} {:<10} {:<8} {:<10} {:<9} GPU / WHY",
            "SHARE OWNER", "KIND", "UNITS", "SINCE", "STATE"
        )?;
    }
    for s in &listing.shares {
        let (state, why) = s.liveness.describe();
        writeln!(
            out,
            "{:<40} {:<10} {:<8} {:<10} {:<9} {} ({})",
            s.id,
            s.share.owner.kind(),
            format!("{}/{}", s.share.grant.units, s.share.grant.replicas),
            age(s.share.since.saturating_mul(1000)),
            state,
            s.share.grant.uuid,
            s.share.grant.mode
        )?;
        writeln!(out, "{:>80} {why}", "")?;
    }
    Ok(())
}

/// Who holds each GPU this process sees, in NVML index order ([`top::holders_of`]): the owners
/// of its reservations (`id (kind, state)`), of its shares (`id (k/R share, state)`) and of its
/// MIG devices (`id (MIG-…, state)`).
fn holders_by_gpu(
    listing: &Listing,
    inventory: &mesos_gpu_node::inventory::Inventory,
) -> Vec<(u32, String, Vec<String>)> {
    inventory
        .gpus
        .iter()
        .map(|gpu| {
            let holders = top::holders_of(listing, inventory, gpu)
                .iter()
                .map(|h| match (&h.share, &h.mig) {
                    (Some(share), _) => format!("{} ({share} share, {})", h.owner, h.state),
                    (None, Some(mig)) => format!("{} ({mig}, {})", h.owner, h.state),
                    (None, None) => format!("{} ({}, {})", h.owner, h.containerizer, h.state),
                })
                .collect();
            (gpu.index, gpu.uuid.clone(), holders)
        })
        .collect()
}

/// Refuses a `--pool-dir` that does not exist: a typo, not an empty pool. The default directory
/// not made yet is a node where nothing has reserved GPUs, which the command says itself.
fn named_pool_dir(pool: &super::PoolArgs, ctx: &Ctx) -> anyhow::Result<()> {
    let dir = &pool.pool_dir;
    let default = ctx.state_default("pool", mesos_gpu_pool::DEFAULT_POOL_DIR);
    if !dir.is_dir() && *dir != default {
        bail!(
            "--pool-dir {} (or {}): no such directory (name the directory of the node's pool: \
             the module's pool_dir parameter, serve's and docker-args' --pool-dir; default {})",
            dir.display(),
            mesos_gpu_pool::POOL_DIR_ENV,
            default.display()
        );
    }
    Ok(())
}

fn release(args: &ReleaseArgs) -> anyhow::Result<ExitCode> {
    let mut out = std::io::stdout().lock();
    let pool = Pool::at(&args.pool.pool_dir);
    let host = host();
    if args.dead {
        let done = pool.reconcile(&host)?;
        for (id, why) in &done.freed {
            writeln!(out, "released {id}: {why}")?;
        }
        for (id, why) in &done.uncertain {
            writeln!(out, "kept {id}: {why}")?;
        }
        if done.freed.is_empty() {
            writeln!(out, "no dead owner")?;
        }
        return Ok(ExitCode::SUCCESS);
    }
    let owner = args
        .owner
        .as_deref()
        .context("an owner id or --dead is required")?;
    let freed = pool.release(owner, args.force, &host)?;
    let gpus: Vec<String> = freed.gpus.iter().map(ToString::to_string).collect();
    writeln!(out, "released {owner}: {}", gpus.join(", "))?;
    Ok(ExitCode::SUCCESS)
}

/// Where owners' liveness is read: `/proc`, and the Docker daemons Docker owners name.
fn host() -> Host {
    Host::default().with_docker(std::sync::Arc::new(EngineDaemons::new()))
}

fn age(ms: u64) -> String {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    let secs = now.saturating_sub(u128::from(ms)) / 1000;
    match secs {
        s if s < 120 => format!("{s}s ago"),
        s if s < 7200 => format!("{}m ago", s / 60),
        s => format!("{}h ago", s / 3600),
    }
}

/// `gpu health --json`: the checkpoint's object (`version`, `gpus`, `mig`) with `checkpoint`
/// (its path), `checkpoint_state` (`present` or `absent`) and `monitor_running` added; without a
/// checkpoint, `gpus` holds NVML's view of each GPU (`index`, `uuid`, `health`: `{"state":
/// "healthy"}` or `{"state": "lost"}`, `source`: `"nvml"`), empty without a driver.
fn health_json(
    store: &HealthStore,
    snapshot: Option<&HealthSnapshot>,
    ctx: &Ctx,
) -> anyhow::Result<serde_json::Value> {
    let mut value = match snapshot {
        Some(snapshot) => {
            let mut value = serde_json::to_value(snapshot)?;
            // The schema version the checkpoint file carries (the store writes it beside).
            if let Some(object) = value.as_object_mut() {
                let version = <HealthSnapshot as mesos_gpu_os::Document>::VERSION;
                object.insert("version".to_owned(), version.into());
            }
            value
        }
        None => {
            let gpus: Vec<serde_json::Value> = match ctx.driver()? {
                Some(driver) => driver
                    .inventory()
                    .gpus
                    .iter()
                    .map(|g| {
                        let lost = !g.healthy || driver.reports_lost(g.index);
                        let state = if lost { "lost" } else { "healthy" };
                        serde_json::json!({
                            "index": g.index,
                            "uuid": g.uuid,
                            "health": {"state": state},
                            "source": "nvml",
                        })
                    })
                    .collect(),
                None => Vec::new(),
            };
            serde_json::json!({ "gpus": gpus })
        }
    };
    if let Some(object) = value.as_object_mut() {
        object.insert(
            "checkpoint".to_owned(),
            store.checkpoint_path().display().to_string().into(),
        );
        let state = if snapshot.is_some() {
            "present"
        } else {
            "absent"
        };
        object.insert("checkpoint_state".to_owned(), state.into());
        object.insert(
            "monitor_running".to_owned(),
            store.monitor_running()?.into(),
        );
    }
    Ok(value)
}

fn health(args: &HealthArgs, ctx: &Ctx) -> anyhow::Result<ExitCode> {
    let store = HealthStore::at(&args.store.dir(ctx)?);
    let snapshot = store.load()?;
    let mut out = std::io::stdout().lock();
    if args.json {
        let value = health_json(&store, snapshot.as_ref(), ctx)?;
        serde_json::to_writer_pretty(&mut out, &value)?;
        writeln!(out)?;
        return Ok(ExitCode::SUCCESS);
    }
    let running = store.monitor_running()?;
    let Some(snapshot) = snapshot else {
        writeln!(
            out,
            "no GPU health checkpoint at {} (no monitor has run there); GPUs are as discovery finds them",
            store.checkpoint_path().display()
        )?;
        return Ok(ExitCode::SUCCESS);
    };
    writeln!(
        out,
        "{} ({})",
        store.checkpoint_path().display(),
        if running {
            "monitor running"
        } else {
            "no monitor running"
        }
    )?;
    writeln!(
        out,
        "{:<4} {:<42} {:<10} {:<10} {:<10} {:<12} REASON",
        "GPU", "UUID", "HEALTH", "SINCE", "LAST", "XIDS"
    )?;
    for g in &snapshot.gpus {
        let xids = if g.xids.is_empty() {
            "-".to_owned()
        } else {
            g.xids
                .iter()
                .map(|(x, n)| format!("{x}×{n}"))
                .collect::<Vec<_>>()
                .join(",")
        };
        match &g.health {
            GpuHealth::Healthy => writeln!(
                out,
                "{:<4} {:<42} {:<10} {:<10} {:<10} {:<12} -",
                g.index, g.uuid, "healthy", "-", "-", xids
            )?,
            GpuHealth::Unhealthy {
                reason,
                since_ms,
                last_error_ms,
                ..
            } => writeln!(
                out,
                "{:<4} {:<42} {:<10} {:<10} {:<10} {:<12} {reason}",
                g.index,
                g.uuid,
                "UNHEALTHY",
                age(*since_ms),
                age(*last_error_ms),
                xids
            )?,
        }
        print_recovery(&g.recovery, g.index);
    }
    Ok(ExitCode::SUCCESS)
}

/// How a GPU out of the pool comes back, its last check, and its recovery history.
fn print_recovery(r: &RecoveryRecord, index: u32) {
    if let Some(e) = &r.episode {
        match e.comeback {
            Comeback::Evidence { class } => {
                println!("     comes back by itself on evidence ({class} quiet time)");
            }
            Comeback::Reset { remedy } => println!("     {}", remedy.describe(index)),
        }
        if let Some(asks) = &e.driver_asks {
            println!("     the driver asks for {asks}: it stays out until that is done");
        }
        if !e.findings.is_empty() {
            let next = if e.next_try_ms == 0 {
                String::new()
            } else {
                format!(", next in {}", until(e.next_try_ms))
            };
            println!("     last check (failed attempts {}{next}):", e.attempts);
            for f in &e.findings {
                println!("       {f}");
            }
        }
    }
    if r.recoveries > 0 || r.probe_failures > 0 || r.flaps > 0 {
        println!(
            "     history: {} automatic recovery(ies), {} failed probe(s){}",
            r.recoveries,
            r.probe_failures,
            if r.flaps > 0 {
                format!(
                    ", FLAPPING: {} recovery(ies) in a row failed again within the hour (quiet time doubled each time)",
                    r.flaps
                )
            } else {
                String::new()
            }
        );
    }
}

/// `in 42s` for a time in ms since the epoch (`now` when past).
fn until(ms: u64) -> String {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    match ms.saturating_sub(now) / 1000 {
        0 => "now".to_owned(),
        s if s < 120 => format!("{s}s"),
        s => format!("{}m", s / 60),
    }
}

fn probe(args: &ProbeArgs, ctx: &Ctx) -> anyhow::Result<ExitCode> {
    let Some(driver) = ctx.driver()? else {
        bail!(
            "no NVIDIA driver on this node ({}): nothing to probe",
            ctx.inventory()?
                .absent_reason
                .as_deref()
                .unwrap_or("NVML is not available")
        );
    };
    let gpus: Vec<&Gpu> = match &args.gpu {
        None => driver.inventory().gpus.iter().collect(),
        Some(r) => vec![
            driver
                .inventory()
                .gpus
                .iter()
                .find(|g| match r {
                    GpuRef::Index(i) => g.index == *i,
                    GpuRef::Uuid(u) => g.uuid.eq_ignore_ascii_case(u),
                })
                .with_context(|| {
                    format!(
                        "GPU {r} is not on this node (GPUs: {})",
                        driver
                            .inventory()
                            .gpus
                            .iter()
                            .map(|g| format!("{} {}", g.index, g.uuid))
                            .collect::<Vec<_>>()
                            .join(", ")
                    )
                })?,
        ],
    };
    // A hung driver call must not hang the operator's shell.
    let timeout = Duration::from_secs(args.timeout);
    std::thread::spawn(move || {
        std::thread::sleep(timeout);
        eprintln!(
            "mesos-gpu gpu probe: timed out after {}s; a driver call did not return",
            timeout.as_secs()
        );
        std::process::exit(2);
    });
    let mut passed = true;
    for gpu in gpus {
        println!("GPU {} ({}) {}", gpu.index, gpu.uuid, gpu.name);
        let ok = if args.isolated {
            probe_isolated(args, ctx, driver, gpu)?
        } else {
            let options = CheckOptions {
                cuda_lib: args.cuda_lib.clone(),
                bytes: usize::try_from(args.mib).unwrap_or(64) << 20,
            };
            check_gpu(driver, gpu, &options, &mut |step| println!("  {step}"))
        };
        println!(
            "GPU {} ({}) {}",
            gpu.index,
            gpu.uuid,
            if ok { "passed" } else { "FAILED" }
        );
        passed &= ok;
    }
    Ok(if passed {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// The probe as the monitor runs it: a command in a one-GPU cgroup of its own.
fn probe_isolated(
    args: &ProbeArgs,
    ctx: &Ctx,
    driver: &mesos_gpu_node::discovery::GpuDriver,
    gpu: &Gpu,
) -> anyhow::Result<bool> {
    // A simulated node without --dev-root: the nodes its driver numbers, made once in its
    // scratch directory (as `exec` does).
    let dev_root = match (ctx.simulation()?, ctx.dev_root()) {
        (_, Some(given)) => given.to_owned(),
        (Some(sim), None) => sim.device_root(driver.inventory(), &ctx.proc_root()?)?,
        (None, None) => std::path::PathBuf::from("/dev"),
    };
    let dev_root = dev_root.as_path();
    let nodes = mesos_gpu_node::devices::DeviceNodes::scan(dev_root, driver.inventory())
        .with_context(|| format!("cannot read the device nodes under {}", dev_root.display()))?;
    let hierarchy = mesos_gpu_enforce::cgroup::CgroupLayout::detect()
        .context("cannot find a device cgroup hierarchy")?;
    let layout = mesos_gpu_enforce::cgroup::CgroupLayout::new(
        mesos_gpu_enforce::cgroup::Hierarchy {
            version: hierarchy.version(),
            mount: hierarchy.mount().to_owned(),
        },
        &args.cgroups_root,
    )?;
    let argv = match &args.command {
        Some(text) => ProbeConfig::parse_command(text)?,
        None => {
            let me = std::env::current_exe().context("cannot find this program")?;
            vec![
                me.display().to_string(),
                "gpu".into(),
                "probe".into(),
                "--gpu".into(),
                "{uuid}".into(),
                "--mib".into(),
                args.mib.to_string(),
                "--cuda-lib".into(),
                args.cuda_lib.to_string_lossy().into_owned(),
            ]
        }
    };
    let mut config = ProbeConfig::command(argv);
    config.timeout = Duration::from_secs(args.timeout);
    config.env.push((
        "MESOS_GPU_NVML_LIB".to_owned(),
        driver.library().display().to_string(),
    ));
    config.cgroup = Some(ProbeCgroup {
        layout,
        base: mesos_gpu_enforce::cgroup::default_whitelist(),
        nodes,
    });
    println!("  running `{}` in a one-GPU cgroup", config.describe());
    let outcome = run_probe(&config, &ProbeTarget::of(gpu));
    for line in outcome.output.lines() {
        println!("  | {line}");
    }
    println!("  {}", outcome.detail);
    Ok(outcome.passed)
}

fn mark_healthy(args: &MarkArgs, ctx: &Ctx) -> anyhow::Result<ExitCode> {
    let mut out = std::io::stdout().lock();
    let gpu = args.gpu.clone();
    let store = HealthStore::at(&args.store.dir(ctx)?);
    if !store.monitor_running()? {
        return mark_in_checkpoint(&store, &gpu, ctx);
    }
    let request = store.request_mark_healthy(&gpu)?;
    let deadline = Instant::now() + Duration::from_secs(args.wait);
    while request.exists() {
        if Instant::now() > deadline {
            bail!(
                "the running GPU health monitor did not take the request {} within {}s; it stays queued",
                request.display(),
                args.wait
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    if let Some(answer) = store.take_answer(&request)? {
        if !answer.ok {
            bail!("the running monitor refused: {}", answer.message);
        }
        writeln!(out, "{} (by the running monitor)", answer.message)?;
        return Ok(ExitCode::SUCCESS);
    }
    // A monitor that predates answers: the checkpoint, saved before the request was removed.
    let snapshot: Option<HealthSnapshot> = store.load()?;
    match snapshot.as_ref().and_then(|s| s.find(&gpu)) {
        Some(record) if record.health.is_healthy() => {
            writeln!(
                out,
                "GPU {gpu} ({}) is healthy (marked by the running monitor)",
                record.uuid
            )?;
            Ok(ExitCode::SUCCESS)
        }
        Some(record) => bail!(
            "GPU {gpu} is still unhealthy: {:?}; see the agent log",
            record.health
        ),
        None => bail!(
            "the running monitor does not know GPU {gpu} (checkpoint {}); see the agent log",
            store.checkpoint_path().display()
        ),
    }
}

/// With no monitor running: edits the checkpoint under the lock. A work directory without a
/// checkpoint is refused before anything is created in it.
fn mark_in_checkpoint(store: &HealthStore, gpu: &GpuRef, ctx: &Ctx) -> anyhow::Result<ExitCode> {
    let mut out = std::io::stdout().lock();
    let path = store.checkpoint_path();
    if store.load()?.is_none() {
        bail!(
            "no GPU health checkpoint at {} and no health monitor running there; is \
             --agent-work-dir the agent's work directory? (the module's monitor writes the checkpoint when it \
             starts)",
            path.display()
        );
    }
    let Some(_lock) = store.try_lock()? else {
        bail!(
            "a GPU health monitor started on {} meanwhile; run the command again",
            path.display()
        );
    };
    let mut snapshot = store
        .load()?
        .with_context(|| format!("{} disappeared", path.display()))?;
    let record = snapshot
        .find(gpu)
        .cloned()
        .ok_or_else(|| unknown_gpu(gpu, &snapshot, &path))?;
    refuse_if_lost(ctx, gpu, &record)?;
    let missing = record.recovery.missing();
    if snapshot.mark_healthy(gpu)? {
        store.save(&snapshot)?;
        writeln!(
            out,
            "GPU {gpu} ({}) marked healthy in {} (no monitor running)",
            record.uuid,
            path.display()
        )?;
        if !missing.is_empty() {
            writeln!(out, "the evidence that was missing: {}", missing.join("; "))?;
        }
    } else {
        writeln!(out, "GPU {gpu} ({}) is already healthy", record.uuid)?;
    }
    Ok(ExitCode::SUCCESS)
}

fn unknown_gpu(gpu: &GpuRef, snapshot: &HealthSnapshot, path: &std::path::Path) -> anyhow::Error {
    let gpus: Vec<String> = snapshot
        .gpus
        .iter()
        .map(|g| format!("{} {}", g.index, g.uuid))
        .collect();
    let mig: Vec<&str> = snapshot.mig.iter().map(|g| g.uuid.as_str()).collect();
    let mig = if mig.is_empty() {
        String::new()
    } else {
        format!("; MIG devices: {}", mig.join(", "))
    };
    anyhow::anyhow!(
        "GPU {gpu} is not in the health checkpoint {} (GPUs: {}{mig})",
        path.display(),
        gpus.join(", ")
    )
}

/// Refuses when NVML (the host's driver, or `--simulate`) still reports the GPU lost, or the
/// driver asks for a reset or reboot. The GPU is looked up by the checkpoint's UUID (indices can
/// change across reboots), else by its checkpointed index. Without a driver there is nothing to
/// ask, and nothing to hand it to.
fn refuse_if_lost(ctx: &Ctx, gpu: &GpuRef, record: &GpuRecord) -> anyhow::Result<()> {
    let Some(driver) = ctx.driver()? else {
        return Ok(());
    };
    let index = driver
        .inventory()
        .gpus
        .iter()
        .find(|g| !g.uuid.is_empty() && g.uuid.eq_ignore_ascii_case(&record.uuid))
        .map_or(record.index, |g| g.index);
    if driver.reports_lost(index) {
        return Err(HealthError::StillLost {
            gpu: gpu.to_string(),
        }
        .into());
    }
    if let Some(asks) = mesos_gpu_health::driver_evidence(driver, index).asks() {
        return Err(HealthError::DriverAsks {
            gpu: gpu.to_string(),
            asks,
        }
        .into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_holder_is_described_by_what_is_recorded() {
        let full = mesos_gpu_pool::Holder {
            executor_id: Some("e1".into()),
            framework_id: Some("fw-1".into()),
            framework_name: None,
            task_id: Some("t1".into()),
            task_name: Some("train".into()),
        };
        assert_eq!(
            describe_holder(&full),
            "task t1 (train), executor e1, framework fw-1"
        );
        let executor_only = mesos_gpu_pool::Holder {
            executor_id: Some("e1".into()),
            ..mesos_gpu_pool::Holder::default()
        };
        assert_eq!(describe_holder(&executor_only), "executor e1");
    }
}
