//! `mesos-gpu gpu top`: the node's GPUs, each with who holds it and how much it is used.
//!
//! Holders come from the node's pool (`pool.json`), which every entry point records in (the
//! module, the Docker hook, `run`, `serve`, `exec`), so a holder is shown whichever path
//! granted it. Usage comes from the first source that answers:
//! - `agent`: the module's endpoint `/mesos-gpu/containers` on the agent: per container and
//!   GPU, utilisation and the memory its own processes use;
//! - `serve`: `serve`'s REST `/gpu/status/json` (nvidia-docker 1.0's page): per GPU,
//!   utilisation and its processes' memory; a holder's memory is the GPU's processes' only
//!   when it holds the GPU alone (a share's is unknown: the page names no container);
//! - `pool`: holders only, no usage (neither answered, or `--source pool`).
//!
//! Health: `unhealthy` (and why) when a registered health checkpoint says so (as `gpu list`
//! reads it), `lost` when NVML says so, else `healthy`.

use std::collections::BTreeMap;
use std::io::{IsTerminal as _, Read as _, Write as _};
use std::net::{TcpStream, ToSocketAddrs as _};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context as _, bail};
use mesos_gpu_pool::{Listing, Pool};
use serde::{Deserialize, Serialize};

use crate::ctx::Ctx;

/// How long one request to the agent or `serve` may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);

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
struct HolderRow {
    /// The owner id, as `gpu list` shows it (the container id for the module and Docker).
    owner: String,
    /// `mesos`, `docker`, `process` (`exec`) or `quarantine`.
    containerizer: &'static str,
    /// `alive`, `dead` or `uncertain`.
    state: &'static str,
    /// `k/R` for a share of a shared GPU.
    #[serde(skip_serializing_if = "Option::is_none")]
    share: Option<String>,
    /// The MIG device held, by UUID.
    #[serde(skip_serializing_if = "Option::is_none")]
    mig: Option<String>,
    /// Bytes its processes use on this GPU, when the source tells.
    memory_used: Option<u64>,
}

pub(super) fn top(args: &TopArgs, ctx: &Ctx) -> anyhow::Result<ExitCode> {
    let refresh = !args.json && !args.once && std::io::stdout().is_terminal();
    loop {
        let top = collect(args, ctx)?;
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

fn collect(args: &TopArgs, ctx: &Ctx) -> anyhow::Result<Top> {
    let dir = &args.pool.pool_dir;
    let default = ctx.state_default("pool", mesos_gpu_pool::DEFAULT_POOL_DIR);
    if !dir.is_dir() && *dir != default {
        bail!(
            "--pool-dir {}: no such directory (name the node's pool: the module's pool_dir \
             parameter, serve's --pool-dir; default {})",
            dir.display(),
            default.display()
        );
    }
    let listing = Pool::at(dir).list(&super::host())?;
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
    let (source, source_url, no_usage) = read_usage(args, &mut gpus);
    Ok(Top {
        pool: listing.path.display().to_string(),
        source,
        source_url,
        no_usage,
        gpus,
    })
}

/// The pool's holders of `gpu`: its reservations, its shares and its MIG devices'.
fn holders_of(
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

/// Fills in usage from the first source that answers; says which, or why none did.
fn read_usage(
    args: &TopArgs,
    gpus: &mut [GpuRow],
) -> (&'static str, Option<String>, Option<String>) {
    let mut why = Vec::new();
    if matches!(args.source, Source::Auto | Source::Agent) {
        let url = format!("{}/mesos-gpu/containers", args.agent.trim_end_matches('/'));
        match get_json::<AgentContainers>(&url) {
            Ok(view) => {
                apply_agent(&view, gpus);
                return ("agent", Some(url), None);
            }
            Err(e) => why.push(format!("agent: {e:#}")),
        }
    }
    if matches!(args.source, Source::Auto | Source::Serve) {
        let url = format!("{}/gpu/status/json", args.serve.trim_end_matches('/'));
        match get_json::<ServeStatus>(&url) {
            Ok(status) => {
                apply_serve(&status, gpus);
                return ("serve", Some(url), None);
            }
            Err(e) => why.push(format!("serve: {e:#}")),
        }
    }
    if why.is_empty() {
        why.push("--source pool".to_owned());
    }
    ("pool", None, Some(why.join("; ")))
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

/// `owner (containerizer, share 1/4 | MIG-…, state) 1.2 GiB`.
fn describe(h: &HolderRow) -> String {
    let mut what = vec![h.containerizer.to_owned()];
    what.extend(h.share.as_ref().map(|s| format!("share {s}")));
    what.extend(h.mig.clone());
    what.push(h.state.to_owned());
    let memory = h
        .memory_used
        .map_or_else(String::new, |m| format!(" {} used", gib(m)));
    format!("{} ({}){memory}", h.owner, what.join(", "))
}

fn gib(bytes: u64) -> String {
    // Display only: the precision lost converting to f64 is far below the digit shown.
    #[allow(clippy::cast_precision_loss)]
    let gib = bytes as f64 / (1u64 << 30) as f64;
    format!("{gib:.1} GiB")
}

/// GETs `url` (`http://HOST:PORT/PATH`) and reads its JSON body.
fn get_json<T: serde::de::DeserializeOwned>(url: &str) -> anyhow::Result<T> {
    let body = http_get(url)?;
    serde_json::from_slice(&body).with_context(|| format!("{url}: not the JSON expected"))
}

/// A plain HTTP/1.1 GET with a timeout: what `gpu top` needs of the agent and `serve`, both on
/// this node, without TLS.
fn http_get(url: &str) -> anyhow::Result<Vec<u8>> {
    let Some(rest) = url.strip_prefix("http://") else {
        bail!("{url}: give an http:// URL (https is not supported here)");
    };
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let path = if path.is_empty() { "/" } else { path };
    let addr = authority
        .to_socket_addrs()
        .with_context(|| format!("{url}: {authority:?} is not HOST:PORT"))?
        .next()
        .with_context(|| format!("{url}: {authority} resolves to no address"))?;
    let mut stream = TcpStream::connect_timeout(&addr, REQUEST_TIMEOUT)
        .with_context(|| format!("{url}: cannot connect"))?;
    stream.set_read_timeout(Some(REQUEST_TIMEOUT))?;
    stream.set_write_timeout(Some(REQUEST_TIMEOUT))?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {authority}\r\nAccept: application/json\r\nConnection: close\r\n\r\n"
    )
    .with_context(|| format!("{url}: cannot send the request"))?;
    let mut response = Vec::new();
    stream
        .read_to_end(&mut response)
        .with_context(|| format!("{url}: no complete answer"))?;
    let split = response
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .with_context(|| format!("{url}: not an HTTP answer"))?;
    let head = String::from_utf8_lossy(&response[..split]).into_owned();
    let body = &response[split + 4..];
    let status = head.lines().next().unwrap_or_default();
    if status.split_whitespace().nth(1) != Some("200") {
        bail!("{url}: answered {status:?}");
    }
    let headers: BTreeMap<String, String> = head
        .lines()
        .skip(1)
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_ascii_lowercase()))
        .collect();
    if headers.get("transfer-encoding").map(String::as_str) == Some("chunked") {
        return dechunk(body).with_context(|| format!("{url}: a broken chunked body"));
    }
    Ok(body.to_vec())
}

/// The body of a `Transfer-Encoding: chunked` answer (libprocess sends JSON so).
fn dechunk(mut body: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let line_end = body.windows(2).position(|w| w == b"\r\n")?;
        let size = std::str::from_utf8(&body[..line_end]).ok()?;
        let size = usize::from_str_radix(size.split(';').next()?.trim(), 16).ok()?;
        body = &body[line_end + 2..];
        if size == 0 {
            return Some(out);
        }
        out.extend_from_slice(body.get(..size)?);
        body = body.get(size + 2..)?;
    }
}

#[cfg(test)]
mod tests {
    use super::dechunk;

    #[test]
    fn chunked_bodies_are_joined_and_broken_ones_refused() {
        assert_eq!(
            dechunk(b"4\r\n{\"a\"\r\n3\r\n:1}\r\n0\r\n\r\n").as_deref(),
            Some(&b"{\"a\":1}"[..])
        );
        assert_eq!(dechunk(b"9\r\nshort\r\n"), None);
        assert_eq!(dechunk(b"zz\r\n"), None);
    }
}
