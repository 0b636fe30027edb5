//! `mesos-gpu gpu top`: the node's GPUs, each with who holds it and how much it is used.
//!
//! Holders come from the node's pool (`pool.json`), which every entry point records in (the
//! module, the Docker hook, `run`, `serve`, `exec`), so a holder is shown whichever path
//! granted it, with whose container it is (task, executor, framework) where the module or the
//! Docker hook recorded that; the framework's name is asked of the agent (`/state`) when the
//! agent answers. Usage comes from the first source that answers:
//! - `agent`: the module's endpoint `/mesos-gpu/containers` on the agent: per container and
//!   GPU, utilisation and the memory its own processes use;
//! - `serve`: `serve`'s REST `/gpu/status/json` (nvidia-docker 1.0's page): per GPU,
//!   utilisation and its processes' memory; a holder's memory is the GPU's processes' only
//!   when it holds the GPU alone (a share's is unknown: the page names no container);
//! - `pool`: holders only, no usage (neither answered, or `--source pool`).
//!
//! Health: `unhealthy` (and why) when a registered health checkpoint says so (as `gpu list`
//! reads it), `lost` when NVML says so, else `healthy`.

use std::io::{IsTerminal as _, Write as _};
use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use mesos_gpu_docker::agent::{MesosAgent, complete};
use mesos_gpu_docker::node_http::{self, GetError};
use mesos_gpu_pool::{Holder, Listing, Pool};
use serde::{Deserialize, Serialize};

use crate::ctx::Ctx;

#[derive(clap::Args)]
pub(super) struct TopArgs {
    #[command(flatten)]
    pool: super::super::PoolArgs,
    /// Where usage comes from: `auto` (the agent's module, else serve, else none), `agent`,
    /// `serve`, or `pool` (holders only).
    #[arg(long, value_enum, default_value = "auto")]
    source: Source,
    /// The agent whose module serves `/mesos-gpu/containers` (`http://HOST:PORT`).
    #[arg(
        long,
        value_name = "URL",
        env = "MESOS_GPU_AGENT_URL",
        default_value = "http://127.0.0.1:5051"
    )]
    agent: String,
    /// `serve`'s REST API (`http://HOST:PORT`, its --listen).
    #[arg(long, value_name = "URL", default_value = "http://127.0.0.1:3476")]
    serve: String,
    /// Print JSON once instead of a table.
    #[arg(long)]
    json: bool,
    /// Print once, even on a terminal (piped output is printed once anyway).
    #[arg(long)]
    once: bool,
    /// Seconds between refreshes on a terminal.
    #[arg(long, value_name = "SECONDS", default_value_t = 2.0, value_parser = interval)]
    interval: f64,
}

fn interval(value: &str) -> Result<f64, String> {
    match value.parse::<f64>() {
        Ok(s) if (0.1..=3600.0).contains(&s) => Ok(s),
        _ => Err(format!(
            "{value:?}: give seconds between 0.1 and 3600 (e.g. 2 or 0.5)"
        )),
    }
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Source {
    Auto,
    Agent,
    Serve,
    Pool,
}

/// What `gpu top --json` prints, and what a table shows.
#[derive(Debug, Serialize)]
struct Top {
    /// The pool file read.
    pool: String,
    /// `agent`, `serve` or `pool`.
    source: &'static str,
    /// The page usage was read from.
    #[serde(skip_serializing_if = "Option::is_none")]
    source_url: Option<String>,
    /// Why there is no usage (`source` is `pool`).
    #[serde(skip_serializing_if = "Option::is_none")]
    no_usage: Option<String>,
    gpus: Vec<GpuRow>,
}

/// One GPU.
#[derive(Debug, Serialize)]
struct GpuRow {
    index: u32,
    uuid: String,
    /// `healthy`, `unhealthy` or `lost`.
    health: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    health_reason: Option<String>,
    utilization_gpu: Option<u32>,
    utilization_memory: Option<u32>,
    /// Bytes in use on the GPU, all processes.
    memory_used: Option<u64>,
    /// Bytes in all.
    memory_total: Option<u64>,
    holders: Vec<HolderRow>,
}

/// One holder of (part of) a GPU.
#[derive(Debug, Serialize)]
pub(super) struct HolderRow {
    /// The owner id, as `gpu list` shows it (the container id for the module and Docker).
    pub(super) owner: String,
    /// Whose container it is (task, executor, framework), as the pool records it; the
    /// framework's name from the agent's `/state` when the agent answered.
    #[serde(skip_serializing_if = "Option::is_none")]
    holder: Option<Holder>,
    /// `mesos`, `docker`, `process` (`exec`) or `quarantine`.
    pub(super) containerizer: &'static str,
    /// `alive`, `dead` or `uncertain`.
    pub(super) state: &'static str,
    /// `k/R` for a share of a shared GPU.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) share: Option<String>,
    /// The MIG device held, by UUID.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) mig: Option<String>,
    /// Bytes its processes use on this GPU, when the source tells.
    memory_used: Option<u64>,
}

/// The agent and `serve`, resolved once: the agent's framework names stay cached across
/// refreshes.
struct Sources {
    agent: Result<(SocketAddr, MesosAgent), GetError>,
    serve: Result<SocketAddr, GetError>,
}

pub(super) fn top(args: &TopArgs, ctx: &Ctx) -> anyhow::Result<ExitCode> {
    super::named_pool_dir(&args.pool, ctx)?;
    let sources = Sources {
        agent: node_http::address(&args.agent).map(|addr| (addr, MesosAgent::at(addr))),
        serve: node_http::address(&args.serve),
    };
    let refresh = !args.json && !args.once && std::io::stdout().is_terminal();
    loop {
        let top = collect(args, ctx, &sources)?;
        let mut out = std::io::stdout().lock();
        if args.json {
            serde_json::to_writer_pretty(&mut out, &top)?;
            writeln!(out)?;
            return Ok(ExitCode::SUCCESS);
        }
        if refresh {
            // Home and clear, as top does.
            write!(out, "\x1b[H\x1b[2J")?;
        }
        write_table(&mut out, &top)?;
        out.flush()?;
        if !refresh {
            return Ok(ExitCode::SUCCESS);
        }
        drop(out);
        std::thread::sleep(Duration::from_secs_f64(args.interval));
    }
}

fn collect(args: &TopArgs, ctx: &Ctx, sources: &Sources) -> anyhow::Result<Top> {
    let listing = Pool::at(&args.pool.pool_dir).list(&super::host())?;
    let inventory = ctx
        .inventory()
        .context("gpu top lists the GPUs NVML reports")?;
    let driver = ctx.driver()?;
    let mut gpus: Vec<GpuRow> = inventory
        .gpus
        .iter()
        .map(|g| {
            let (health, health_reason) = match listing.unhealthy.get(&g.uuid) {
                Some(reason) => ("unhealthy", Some(reason.clone())),
                None if !g.healthy || driver.is_some_and(|d| d.reports_lost(g.index)) => {
                    ("lost", None)
                }
                None => ("healthy", None),
            };
            GpuRow {
                index: g.index,
                uuid: g.uuid.clone(),
                health,
                health_reason,
                utilization_gpu: None,
                utilization_memory: None,
                memory_used: None,
                memory_total: Some(g.memory_total),
                holders: holders_of(&listing, inventory, g),
            }
        })
        .collect();
    let (source, source_url, no_usage) = read_usage(args.source, sources, &mut gpus);
    Ok(Top {
        pool: listing.path.display().to_string(),
        source,
        source_url,
        no_usage,
        gpus,
    })
}

/// The pool's holders of `gpu`: its reservations, its shares and its MIG devices' (`gpu list`'s
/// "held by" view too).
pub(super) fn holders_of(
    listing: &Listing,
    inventory: &mesos_gpu_node::inventory::Inventory,
    gpu: &mesos_gpu_node::inventory::Gpu,
) -> Vec<HolderRow> {
    let mig_of_gpu = |uuid: &str| {
        inventory
            .mig
            .devices
            .iter()
            .any(|d| d.parent == gpu.index && d.uuid == uuid)
    };
    let mut holders = Vec::new();
    for r in &listing.reservations {
        for uuid in &r.reservation.gpus {
            let mig = match uuid.as_str() {
                u if u == gpu.uuid => None,
                u if mig_of_gpu(u) => Some(u.to_owned()),
                _ => continue,
            };
            holders.push(HolderRow {
                owner: r.id.clone(),
                holder: r.reservation.owner.holder().cloned(),
                containerizer: r.reservation.owner.kind(),
                state: r.liveness.describe().0,
                share: None,
                mig,
                memory_used: None,
            });
        }
    }
    for s in &listing.shares {
        let uuid = s.share.grant.uuid.as_str();
        if uuid == gpu.uuid || mig_of_gpu(uuid) {
            holders.push(HolderRow {
                owner: s.id.clone(),
                holder: s.share.owner.holder().cloned(),
                containerizer: s.share.owner.kind(),
                state: s.liveness.describe().0,
                share: Some(format!(
                    "{}/{}",
                    s.share.grant.units, s.share.grant.replicas
                )),
                mig: (uuid != gpu.uuid).then(|| uuid.to_owned()),
                memory_used: None,
            });
        }
    }
    holders
}

/// Fills in usage from the first source that answers; says which, or why none did. With the
/// agent's, the holders are completed from it too (framework names; a record's missing holder).
fn read_usage(
    source: Source,
    sources: &Sources,
    gpus: &mut [GpuRow],
) -> (&'static str, Option<String>, Option<String>) {
    let mut why = Vec::new();
    if matches!(source, Source::Auto | Source::Agent) {
        let read = sources
            .agent
            .as_ref()
            .map_err(|e| e.to_string())
            .and_then(|(addr, agent)| {
                node_http::get_json::<AgentContainers>(*addr, "/mesos-gpu/containers")
                    .map(|view| (*addr, agent, view))
                    .map_err(|e| mesos_gpu_os::error_chain(&e))
            });
        match read {
            Ok((addr, agent, view)) => {
                apply_agent(&view, gpus);
                complete_holders(agent, gpus);
                return (
                    "agent",
                    Some(format!("http://{addr}/mesos-gpu/containers")),
                    None,
                );
            }
            Err(e) => why.push(format!("agent: {e}")),
        }
    }
    if matches!(source, Source::Auto | Source::Serve) {
        let read = sources
            .serve
            .as_ref()
            .map_err(|e| e.to_string())
            .and_then(|&addr| {
                node_http::get_json::<ServeStatus>(addr, "/gpu/status/json")
                    .map(|s| (addr, s))
                    .map_err(|e| mesos_gpu_os::error_chain(&e))
            });
        match read {
            Ok((addr, status)) => {
                apply_serve(&status, gpus);
                return (
                    "serve",
                    Some(format!("http://{addr}/gpu/status/json")),
                    None,
                );
            }
            Err(e) => why.push(format!("serve: {e}")),
        }
    }
    if why.is_empty() {
        why.push("--source pool".to_owned());
    }
    ("pool", None, Some(why.join("; ")))
}

/// Each holder completed from the agent: its framework's name, and for a record that names no
/// holder, the executor and framework the agent's `/containers` gives.
fn complete_holders(agent: &MesosAgent, gpus: &mut [GpuRow]) {
    for row in gpus.iter_mut().flat_map(|g| &mut g.holders) {
        row.holder = complete(&row.owner, row.holder.take(), agent);
    }
}

/// The module's `/mesos-gpu/containers`, the fields read here.
#[derive(Deserialize)]
struct AgentContainers {
    containers: Vec<AgentContainer>,
}

#[derive(Deserialize)]
struct AgentContainer {
    container: String,
    gpus: Vec<AgentGpu>,
}

#[derive(Deserialize)]
struct AgentGpu {
    uuid: String,
    utilization_gpu: Option<u32>,
    utilization_memory: Option<u32>,
    memory_used: Option<u64>,
}

fn apply_agent(view: &AgentContainers, gpus: &mut [GpuRow]) {
    for container in &view.containers {
        for used in &container.gpus {
            let Some(gpu) = gpus.iter_mut().find(|g| g.uuid == used.uuid) else {
                continue;
            };
            gpu.utilization_gpu = gpu.utilization_gpu.or(used.utilization_gpu);
            gpu.utilization_memory = gpu.utilization_memory.or(used.utilization_memory);
            if let Some(holder) = gpu
                .holders
                .iter_mut()
                .find(|h| h.owner == container.container)
            {
                holder.memory_used = used.memory_used;
            }
        }
    }
}

/// `serve`'s `/gpu/status/json` (nvidia-docker 1.0's), the fields read here: one device per GPU
/// in NVML index order; memory in MiB.
#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct ServeStatus {
    devices: Vec<ServeDevice>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct ServeDevice {
    utilization: ServeUtilization,
    memory: ServeMemory,
    processes: Option<Vec<ServeProcess>>,
}

#[derive(Deserialize)]
struct ServeUtilization {
    #[serde(rename = "GPU")]
    gpu: Option<u32>,
    #[serde(rename = "Memory")]
    memory: Option<u32>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct ServeMemory {
    global_used: Option<u64>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct ServeProcess {
    memory_used: Option<u64>,
}

const MIB: u64 = 1 << 20;

fn apply_serve(status: &ServeStatus, gpus: &mut [GpuRow]) {
    for (gpu, device) in gpus.iter_mut().zip(&status.devices) {
        gpu.utilization_gpu = device.utilization.gpu;
        gpu.utilization_memory = device.utilization.memory;
        gpu.memory_used = device.memory.global_used.map(|m| m * MIB);
        // One holder of the whole GPU: every process on it is that holder's.
        if let [holder] = gpu.holders.as_mut_slice()
            && holder.share.is_none()
            && holder.mig.is_none()
        {
            holder.memory_used = device.processes.as_ref().and_then(|ps| {
                ps.iter()
                    .map(|p| p.memory_used.map(|m| m * MIB))
                    .sum::<Option<u64>>()
            });
        }
    }
}

fn write_table(out: &mut impl std::io::Write, top: &Top) -> std::io::Result<()> {
    match (&top.source_url, &top.no_usage) {
        (Some(url), _) => writeln!(out, "pool {} · usage from {url}", top.pool)?,
        (None, Some(why)) => writeln!(out, "pool {} · no usage ({why})", top.pool)?,
        (None, None) => writeln!(out, "pool {}", top.pool)?,
    }
    writeln!(
        out,
        "{:<4} {:<40} {:<10} {:>5} {:>17}  HOLDER",
        "GPU", "UUID", "HEALTH", "UTIL", "MEMORY"
    )?;
    for gpu in &top.gpus {
        let util = gpu
            .utilization_gpu
            .map_or_else(|| "-".to_owned(), |u| format!("{u}%"));
        let memory = match (gpu.memory_used, gpu.memory_total) {
            (Some(used), Some(total)) => format!("{}/{}", gib(used), gib(total)),
            (None, Some(total)) => format!("-/{}", gib(total)),
            _ => "-".to_owned(),
        };
        let health = match &gpu.health_reason {
            Some(reason) => format!("{} ({reason})", gpu.health),
            None => gpu.health.to_owned(),
        };
        let mut lines = gpu.holders.iter().map(describe);
        let first = lines.next().unwrap_or_else(|| "free".to_owned());
        writeln!(
            out,
            "{:<4} {:<40} {:<10} {util:>5} {memory:>17}  {first}",
            gpu.index, gpu.uuid, health
        )?;
        for line in lines {
            writeln!(out, "{:>82}{line}", "")?;
        }
    }
    Ok(())
}

/// `task NAME (TASK ID) of FRAMEWORK: owner (containerizer, share 1/4 | MIG-…, state) 1.2 GiB
/// used`; the task part when the pool records whose container it is.
fn describe(h: &HolderRow) -> String {
    let whose = h.holder.as_ref().map_or_else(String::new, |holder| {
        let task = match (&holder.task_name, &holder.task_id) {
            (Some(name), Some(id)) if name != id => format!("task {name} ({id})"),
            (_, Some(id)) => format!("task {id}"),
            (Some(name), None) => format!("task {name}"),
            (None, None) => holder
                .executor_id
                .as_ref()
                .map_or_else(|| "container".to_owned(), |e| format!("executor {e}")),
        };
        match holder
            .framework_name
            .as_ref()
            .or(holder.framework_id.as_ref())
        {
            Some(framework) => format!("{task} of {framework}: "),
            None => format!("{task}: "),
        }
    });
    let mut what = vec![h.containerizer.to_owned()];
    what.extend(h.share.as_ref().map(|s| format!("share {s}")));
    what.extend(h.mig.clone());
    what.push(h.state.to_owned());
    let memory = h
        .memory_used
        .map_or_else(String::new, |m| format!(" {} used", gib(m)));
    format!("{whose}{} ({}){memory}", h.owner, what.join(", "))
}

fn gib(bytes: u64) -> String {
    // Display only: the precision lost converting to f64 is far below the digit shown.
    #[allow(clippy::cast_precision_loss)]
    let gib = bytes as f64 / (1u64 << 30) as f64;
    format!("{gib:.1} GiB")
}
