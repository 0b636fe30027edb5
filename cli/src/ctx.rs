//! Global options shared by every subcommand, logging set-up, and the context commands run in.
//!
//! [`Ctx`] opens NVML once, on first use, from `--nvml-lib`, from the `--simulate` node (through
//! the same dynamic loading, see [`crate::simulate`]) or from the system's `libnvidia-ml.so.1`.

use std::cell::OnceCell;
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use mesos_gpu_isolator::discovery::{Discovery, GpuDriver};
use mesos_gpu_isolator::inventory::Inventory;
use tracing_subscriber::EnvFilter;

use crate::simulate::Simulation;

/// The device root used when `--dev-root` is not given (and the node is not simulated).
const DEFAULT_DEV_ROOT: &str = "/dev";

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

    /// Run on a simulated node: a topology shipped with nvml-sim (see `mesos-gpu info --simulate
    /// list`) or a node description file. NVML is still loaded dynamically, from nvml-sim.
    #[arg(long, global = true, value_name = "NAME|FILE")]
    pub(crate) simulate: Option<String>,

    /// Log format on stderr. The filter comes from MESOS_GPU_LOG (then RUST_LOG), default `info`.
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
    discovery: OnceCell<Discovery>,
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

    /// True when `--simulate list` asks for the shipped node names instead of a node.
    pub(crate) fn wants_simulate_list(&self) -> bool {
        self.global.simulate.as_deref() == Some(crate::simulate::LIST)
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
    pub(crate) fn discovery(&self) -> anyhow::Result<&Discovery> {
        if let Some(found) = self.discovery.get() {
            return Ok(found);
        }
        let lib = match self.simulation()? {
            Some(sim) => Some(sim.lib_path().to_path_buf()),
            None => self.global.nvml_lib.clone(),
        };
        let found = GpuDriver::open(lib.as_deref()).context("GPU discovery failed")?;
        Ok(self.discovery.get_or_init(|| found))
    }

    /// The node's inventory (empty, with the reason, when there is no driver).
    pub(crate) fn inventory(&self) -> anyhow::Result<&Inventory> {
        Ok(self.discovery()?.inventory())
    }

    /// The live NVML session, `None` when there is no driver.
    pub(crate) fn driver(&self) -> anyhow::Result<Option<&GpuDriver>> {
        Ok(self.discovery()?.driver())
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

/// Installs the stderr subscriber once.
pub(crate) fn init_logging(args: &GlobalArgs) -> anyhow::Result<()> {
    let filter = std::env::var("MESOS_GPU_LOG")
        .or_else(|_| std::env::var("RUST_LOG"))
        .unwrap_or_else(|_| "info".to_owned());
    let filter = EnvFilter::try_new(&filter)
        .with_context(|| format!("invalid log filter {filter:?} in MESOS_GPU_LOG/RUST_LOG"))?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let result = match args.log_format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
    result.map_err(|e| anyhow::anyhow!("cannot install the log subscriber: {e}"))
}

/// True when the error chain ends in a broken pipe (e.g. `mesos-gpu info | head`).
pub(crate) fn is_broken_pipe(err: &anyhow::Error) -> bool {
    err.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe)
    })
}
