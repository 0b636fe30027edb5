//! Global options shared by every subcommand, logging set-up, and the context commands run in.
//!
//! [`Ctx`] opens NVML once, on first use, from `--nvml-lib`, from the `--simulate` node (through
//! the same dynamic loading, see [`crate::simulate`]) or from the system's `libnvidia-ml.so.1`.

use std::cell::OnceCell;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context as _;
use mesos_gpu_node::inventory::Inventory;
use mesos_gpu_node::{discovery::DEFAULT_PROC_ROOT, discovery::Discovery, discovery::GpuDriver};
use tracing_subscriber::EnvFilter;

use crate::simulate::Simulation;

/// The device root used when `--dev-root` is not given (and the node is not simulated).
pub(crate) const DEFAULT_DEV_ROOT: &str = "/dev";

/// Options valid for every command.
#[derive(clap::Args, Debug, Clone)]
pub(crate) struct GlobalArgs {
    /// Load NVML from this file instead of the system's `libnvidia-ml.so.1`.
    #[arg(
        long,
        global = true,
        value_name = "PATH",
        env = "MESOS_GPU_NVML_LIB",
        conflicts_with = "simulate"
    )]
    pub(crate) nvml_lib: Option<PathBuf>,

    /// Directory holding the `nvidia*` device nodes [default: /dev; with --simulate, none is read].
    #[arg(long, global = true, value_name = "DIR")]
    pub(crate) dev_root: Option<PathBuf>,

    /// Directory standing for `/proc`, where the driver's files are (`devices`,
    /// `driver/nvidia-caps/`, MIG capabilities) [default: /proc].
    #[arg(long, global = true, value_name = "DIR", conflicts_with = "simulate")]
    pub(crate) proc_root: Option<PathBuf>,

    /// Run on a simulated node: a topology shipped with nvml-sim (see `mesos-gpu info --simulate
    /// list`) or a node description file. NVML is still loaded dynamically, from nvml-sim. The
    /// node's state (GPU pool, Docker record, driver volumes, agent work directory, MPS
    /// directories, plugin socket) then lives in a scratch directory per node,
    /// `<tmp>/mesos-gpu-sim/<node>/`, unless a path is given: the host's is never touched.
    #[arg(long, global = true, value_name = "NAME|FILE")]
    pub(crate) simulate: Option<String>,

    /// Log format on stderr. The filter comes from MESOS_GPU_LOG (then RUST_LOG), default `warn`
    /// (`info` for `serve`). Colour only on a terminal, never with NO_COLOR or TERM=dumb.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    pub(crate) log_format: LogFormat,
}

/// How log lines are written.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// What every command runs with.
pub(crate) struct Ctx {
    pub(crate) global: GlobalArgs,
    /// The command stops cleanly on SIGINT/SIGTERM by itself (`serve`, `run`, `exec`).
    handles_signals: bool,
    // Declared before `simulation` so that the NVML session ends before its directory goes.
    discovery: OnceCell<Found>,
    simulation: OnceCell<Simulation>,
}

impl Ctx {
    pub(crate) fn new(global: GlobalArgs, handles_signals: bool) -> Self {
        Ctx {
            global,
            handles_signals,
            discovery: OnceCell::new(),
            simulation: OnceCell::new(),
        }
    }

    /// When `--simulate list` asks for the shipped node names instead of a node: writes them to
    /// `out`, one a line with what the node is, and returns true (the command has nothing more
    /// to do).
    pub(crate) fn list_simulations(&self, out: &mut impl Write) -> std::io::Result<bool> {
        if self.global.simulate.as_deref() != Some(crate::simulate::LIST) {
            return Ok(false);
        }
        for (name, summary) in crate::simulate::shipped_summaries() {
            writeln!(out, "{name:<16} {summary}")?;
        }
        Ok(true)
    }

    /// Where state `rel` (a path in the simulated node's scratch directory) lives when no path is
    /// given: under `--simulate`, in the node's scratch directory
    /// ([`crate::simulate::scratch_state`]); else `default`.
    pub(crate) fn state_default(&self, rel: &str, default: &str) -> PathBuf {
        match self.global.simulate.as_deref() {
            Some(spec) if spec != crate::simulate::LIST => {
                crate::simulate::scratch_state(spec).join(rel)
            }
            _ => PathBuf::from(default),
        }
    }

    /// The simulated node, set up on first use, when `--simulate` is given.
    pub(crate) fn simulation(&self) -> anyhow::Result<Option<&Simulation>> {
        let Some(spec) = self.global.simulate.as_deref() else {
            return Ok(None);
        };
        if let Some(sim) = self.simulation.get() {
            return Ok(Some(sim));
        }
        let sim = Simulation::prepare(spec, self.handles_signals)?;
        Ok(Some(self.simulation.get_or_init(|| sim)))
    }

    /// NVML opened once: the node's inventory, and the live session when there is a driver.
    fn discovery(&self) -> anyhow::Result<&Found> {
        if let Some(found) = self.discovery.get() {
            return Ok(found);
        }
        let (lib, proc_root) = match self.simulation()? {
            Some(sim) => (
                Some(sim.lib_path().to_path_buf()),
                sim.proc_root().to_path_buf(),
            ),
            None => (self.global.nvml_lib.clone(), self.host_proc_root()),
        };
        let found =
            match GpuDriver::open_at(lib.as_deref(), &proc_root).context("GPU discovery failed")? {
                Discovery::Driver(driver) => Found::Driver(Arc::from(driver)),
                Discovery::NoDriver(inventory) => Found::NoDriver(inventory),
            };
        Ok(self.discovery.get_or_init(|| found))
    }

    /// Where the driver's `/proc` files are: the simulation's, else `--proc-root`, else `/proc`.
    pub(crate) fn proc_root(&self) -> anyhow::Result<PathBuf> {
        Ok(match self.simulation()? {
            Some(sim) => sim.proc_root().to_path_buf(),
            None => self.host_proc_root(),
        })
    }

    /// `--proc-root`, else `/proc`.
    fn host_proc_root(&self) -> PathBuf {
        self.global
            .proc_root
            .clone()
            .unwrap_or_else(|| PathBuf::from(DEFAULT_PROC_ROOT))
    }

    /// The node's inventory (empty, with the reason, when there is no driver).
    pub(crate) fn inventory(&self) -> anyhow::Result<&Inventory> {
        Ok(match self.discovery()? {
            Found::Driver(driver) => driver.inventory(),
            Found::NoDriver(inventory) => inventory,
        })
    }

    /// The live NVML session, `None` when there is no driver.
    pub(crate) fn driver(&self) -> anyhow::Result<Option<&GpuDriver>> {
        Ok(self.shared_driver()?.map(Arc::as_ref))
    }

    /// The same NVML session, for holders that outlive a borrow (`serve`'s status and metrics).
    pub(crate) fn shared_driver(&self) -> anyhow::Result<Option<&Arc<GpuDriver>>> {
        Ok(match self.discovery()? {
            Found::Driver(driver) => Some(driver),
            Found::NoDriver(_) => None,
        })
    }

    /// Where to read `nvidia*` device nodes: `--dev-root`, else `/dev`, except on a simulated
    /// node, which has no device nodes unless `--dev-root` names a directory holding some.
    pub(crate) fn dev_root(&self) -> Option<&Path> {
        match (&self.global.dev_root, &self.global.simulate) {
            (Some(root), _) => Some(root),
            (None, Some(_)) => None,
            (None, None) => Some(Path::new(DEFAULT_DEV_ROOT)),
        }
    }
}

/// What opening NVML found, the session shareable.
enum Found {
    Driver(Arc<GpuDriver>),
    NoDriver(Inventory),
}

/// The log filter when neither `MESOS_GPU_LOG` nor `RUST_LOG` is set: `info` for a daemon
/// (`serve`), whose log is its record; `warn` for interactive commands, whose stderr is read by a
/// person (and, for `run` and `exec`, shared with the container's or command's output).
pub(crate) fn default_filter(daemon: bool) -> &'static str {
    if daemon { "info" } else { "warn" }
}

/// Whether log lines may carry ANSI colour: only on a terminal, and not when `NO_COLOR` is set
/// to anything (<https://no-color.org>) or `TERM` is `dumb`.
fn use_colour(stderr_is_terminal: bool, no_color: Option<&str>, term: Option<&str>) -> bool {
    stderr_is_terminal && no_color.is_none_or(str::is_empty) && term != Some("dumb")
}

/// Installs the stderr subscriber once.
pub(crate) fn init_logging(args: &GlobalArgs, daemon: bool) -> anyhow::Result<()> {
    use std::io::IsTerminal as _;
    let filter = std::env::var("MESOS_GPU_LOG")
        .or_else(|_| std::env::var("RUST_LOG"))
        .unwrap_or_else(|_| default_filter(daemon).to_owned());
    let filter = EnvFilter::try_new(&filter)
        .with_context(|| format!("invalid log filter {filter:?} in MESOS_GPU_LOG/RUST_LOG"))?;
    let colour = use_colour(
        std::io::stderr().is_terminal(),
        std::env::var("NO_COLOR").ok().as_deref(),
        std::env::var("TERM").ok().as_deref(),
    );
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(colour)
        .with_writer(std::io::stderr);
    let result = match args.log_format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
    result.map_err(|e| anyhow::anyhow!("cannot install the log subscriber: {e}"))
}

/// True when the error chain ends in a broken pipe (e.g. `mesos-gpu info | head`), also when
/// `serde_json` hit it writing (its error hides the `io::Error` from the chain).
pub(crate) fn is_broken_pipe(err: &anyhow::Error) -> bool {
    let pipe = Some(std::io::ErrorKind::BrokenPipe);
    err.chain().any(|c| {
        c.downcast_ref::<std::io::Error>().map(std::io::Error::kind) == pipe
            || c.downcast_ref::<serde_json::Error>()
                .and_then(serde_json::Error::io_error_kind)
                == pipe
    })
}

/// Prints the command's error once on stderr: `mesos-gpu: error: …`, or with
/// `--log-format json` one JSON object laid out as the log lines are (`timestamp`, `level`
/// `ERROR`, `fields.message` the whole chain, `fields.chain` each cause, `target`).
pub(crate) fn print_error(err: &anyhow::Error, format: LogFormat) {
    match format {
        LogFormat::Text => eprintln!("mesos-gpu: error: {err:#}"),
        LogFormat::Json => {
            use tracing_subscriber::fmt::time::FormatTime as _;
            let mut timestamp = String::new();
            let _ = tracing_subscriber::fmt::time::SystemTime.format_time(
                &mut tracing_subscriber::fmt::format::Writer::new(&mut timestamp),
            );
            let chain: Vec<String> = err.chain().map(ToString::to_string).collect();
            let line = serde_json::json!({
                "timestamp": timestamp,
                "level": "ERROR",
                "fields": { "message": format!("{err:#}"), "chain": chain },
                "target": "mesos_gpu",
            });
            eprintln!("{line}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn colour_only_on_a_terminal_that_wants_it() {
        assert!(use_colour(true, None, Some("xterm-256color")));
        assert!(
            use_colour(true, Some(""), None),
            "an empty NO_COLOR is unset"
        );
        assert!(!use_colour(false, None, Some("xterm")), "a file or a pipe");
        assert!(!use_colour(true, Some("1"), Some("xterm")));
        assert!(!use_colour(true, None, Some("dumb")));
    }
}
