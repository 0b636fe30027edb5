//! One module per subcommand, each exposing `Args` and `run(args, &Ctx)`.
//!
//! The directories every command names the same way, with one meaning each:
//! - `--agent-work-dir` ([`AgentWorkDirArgs`]): the mesos-agent's `--work_dir`, which is the
//!   module's `work_dir` (its checkpoint, and the GPU health its monitor keeps);
//! - `--pool-dir` ([`PoolArgs`]): the node's one GPU pool, shared by the module and every
//!   command that reserves GPUs;
//! - `--docker-state-dir` ([`DockerPoolArgs`]): the record of the Docker containers'
//!   reservations that `docker-args`, `docker-wrapper`, `run` and `serve` keep;
//! - `--volume-root` ([`VolumeRootArgs`]): where the `nvidia_<driver version>` volumes are.
//!
//! `--work-dir` used to name the first of these for `info` and `gpu`, and the third for the
//! Docker commands; it is still accepted there, with a warning naming the new flag.

use std::path::PathBuf;
use std::process::ExitCode;

use mesos_gpu_enforce::mps::{self, ComputeModes, MpsConfig};
use mesos_gpu_isolator::lifecycle::SharingConfig;
use mesos_gpu_placement::sharing::{ModeSpec, SharingSpec};
use mesos_gpu_pool::{DEFAULT_POOL_DIR, POOL_DIR_ENV};

use crate::ctx::Ctx;

mod agent_flags;
mod cdi;
pub(crate) mod demo;
mod docker_args;
mod docker_pool;
mod docker_wrapper;
mod doctor;
mod exec;
mod gpu;
mod info;
mod ldcache;
mod module;
mod run;
mod serve;
mod volume;

/// The subcommands.
#[derive(clap::Subcommand)]
pub(crate) enum Command {
    /// Show the node's GPUs, driver and interconnect topology.
    Info(info::Args),
    /// Print the mesos-agent flags that give this node's GPUs to tasks: with the module,
    /// `--isolation`, `--resources`, `--attributes` and `--modules` (its parameters).
    AgentFlags(agent_flags::Args),
    /// Print the entries of an ld.so.cache, in the format of `ldconfig -p`.
    Ldcache(ldcache::Args),
    /// Plan, create, verify, list and collect `nvidia_<driver version>` driver volumes.
    Volume(volume::Args),
    /// Serve nvidia-docker's REST API and `nvidia-docker` volume plugin until SIGTERM/SIGINT.
    Serve(serve::Args),
    /// Reserve N GPUs from the shared pool and print the `docker run` arguments that give them.
    DockerArgs(docker_args::Args),
    /// The mesos-agent's `docker` (`--docker`): gives Docker tasks the GPUs the hook reserved.
    DockerWrapper(docker_wrapper::Args),
    /// Run a Docker image with N GPUs from the shared pool, like nvidia-docker's `run`.
    Run(run::Args),
    /// The node's GPUs: who holds them (`list`, `top`), their health (`health`, `probe`,
    /// `mark-healthy`), and giving back a dead owner's GPUs (`release`).
    Gpu(gpu::Args),
    /// Run a simulated GPU agent end to end on a stream of Marathon apps (no GPU, no root).
    Demo(demo::Args),
    /// Run a command in a fresh container cgroup with N GPUs, as the agent runs a task.
    Exec(exec::Args),
    /// Write the node's CDI spec (`nvidia.com/gpu`) for Podman, containerd, CRI-O, Docker >= 25.
    Cdi(cdi::Args),
    /// Check an agent host before its first task: driver, device nodes, cgroups, driver volume,
    /// configuration; exit 0 only when it is ready.
    Doctor(doctor::Args),
    /// Build the mesos-agent module libmesos_gpu_module.so against this node's Mesos install.
    Module(module::Args),
}

impl Command {
    /// True for the long-running service (`serve`), which logs at `info` by default.
    pub(crate) fn is_daemon(&self) -> bool {
        matches!(self, Command::Serve(_))
    }

    /// True for the commands that stop cleanly on SIGINT/SIGTERM by themselves.
    pub(crate) fn handles_signals(&self) -> bool {
        matches!(self, Command::Serve(_) | Command::Run(_) | Command::Exec(_))
    }
}

/// GPU sharing: the node's replica spec and how shares are enforced. Every process handing out
/// shares on a node (the agent's module, `exec`) must be given the same values.
#[derive(clap::Args, Clone, Debug)]
pub(crate) struct SharingArgs {
    /// Share GPUs: `R` shares every GPU R ways (1-48); `SEL=R` (SEL an NVML index or UUID) sets
    /// one GPU; R=1 keeps a GPU whole. E.g. `4`, `4,3=1`. A request of k ≤ R units is a k/R
    /// share of one shared GPU. A GPU in MIG mode under mps shares each of its MIG devices R
    /// ways (R at most 48 × the device's compute slices / 7, e.g. 6 for a 1g device).
    #[arg(long, value_name = "SPEC", env = "MESOS_GPU_REPLICAS")]
    pub(crate) gpu_replicas: Option<String>,

    /// How each GPU's shares are enforced: a MODE for every GPU and SEL=MODE entries (SEL an
    /// index, a range such as 4-5, or a UUID); MODE is time-slicing (accounting only, no
    /// isolation), mps, or none (kept whole). E.g. `mps,4-5=time-slicing,6-7=none`. GPUs in MIG
    /// mode take mps (one daemon per MIG device) or none, never time-slicing.
    #[arg(
        long,
        value_name = "SPEC",
        env = "MESOS_GPU_SHARING",
        default_value = "time-slicing",
        value_parser = parse_modes
    )]
    pub(crate) gpu_sharing: String,

    /// Under mps: where each shared GPU's daemon gets its `<uuid>/pipe` and `<uuid>/log`.
    #[arg(long, value_name = "DIR", default_value = mps::DEFAULT_ROOT)]
    pub(crate) mps_root: PathBuf,

    /// Under mps: the MPS control program (a bare name is looked up on PATH).
    #[arg(long, value_name = "PROGRAM", default_value = mps::PROGRAM)]
    pub(crate) mps_control: PathBuf,
}

impl SharingArgs {
    /// The isolator's sharing configuration; `None` without `--gpu-replicas`. Under mps the
    /// GPUs' compute modes are set through NVML when a driver is loaded.
    pub(crate) fn config(&self, ctx: &Ctx) -> anyhow::Result<Option<SharingConfig>> {
        let Some(spec) = &self.gpu_replicas else {
            return Ok(None);
        };
        let spec = SharingSpec::parse(spec, self.gpu_sharing.parse()?)?;
        let mut mps = MpsConfig::new(&self.mps_root);
        mps.program.clone_from(&self.mps_control);
        mps.compute_modes = ctx
            .shared_driver()?
            .map(|d| std::sync::Arc::clone(d) as std::sync::Arc<dyn ComputeModes>);
        Ok(Some(SharingConfig { spec, mps }))
    }
}

/// Checks a `--gpu-sharing` spec, keeping its text.
pub(crate) fn parse_modes(text: &str) -> Result<String, String> {
    text.parse::<ModeSpec>()
        .map(|_| text.to_owned())
        .map_err(|e| e.to_string())
}

/// The node's one GPU pool, shared by the agent's module and every command that reserves GPUs.
#[derive(clap::Args, Clone, Debug)]
pub(crate) struct PoolArgs {
    /// The node's GPU pool directory (`<DIR>/gpu/pool.json`): the agent's module (parameter
    /// `pool_dir`), `serve`, `run`, `docker-args` and `exec` must agree on it.
    #[arg(long, value_name = "DIR", env = POOL_DIR_ENV, default_value = DEFAULT_POOL_DIR)]
    pub(crate) pool_dir: PathBuf,
}

/// The mesos-agent's `--work_dir` used when none is given.
pub(crate) const DEFAULT_AGENT_WORK_DIR: &str = "/var/lib/mesos";

/// The environment variable that gives `--agent-work-dir`.
const AGENT_WORK_DIR_ENV: &str = "MESOS_GPU_AGENT_WORK_DIR";

/// The old environment variable of `--work-dir`, still read by the commands that took it.
const LEGACY_WORK_DIR_ENV: &str = "MESOS_GPU_WORK_DIR";

/// The mesos-agent's work directory, where the module checkpoints and its health monitor keeps
/// each GPU's health (`<DIR>/gpu/health.json`).
#[derive(clap::Args, Clone, Debug)]
pub(crate) struct AgentWorkDirArgs {
    /// The mesos-agent's --work_dir, which is the module's `work_dir`: its GPU checkpoint and
    /// GPU health (`<DIR>/gpu/`).
    #[arg(long, value_name = "DIR", env = AGENT_WORK_DIR_ENV, default_value = DEFAULT_AGENT_WORK_DIR)]
    pub(crate) agent_work_dir: PathBuf,
}

/// `--agent-work-dir` for the commands that called it `--work-dir` (`info`, `gpu`), which still
/// accept that name and `MESOS_GPU_WORK_DIR`.
#[derive(clap::Args, Clone, Debug)]
pub(crate) struct AgentWorkDirCompatArgs {
    /// The mesos-agent's --work_dir, which is the module's `work_dir`: its GPU checkpoint and
    /// GPU health (`<DIR>/gpu/`); under --simulate, the node's scratch directory unless given
    /// [default: /var/lib/mesos].
    #[arg(long, value_name = "DIR", env = AGENT_WORK_DIR_ENV)]
    agent_work_dir: Option<PathBuf>,

    /// The old name of --agent-work-dir (deprecated).
    #[arg(long = "work-dir", value_name = "DIR", hide = true)]
    legacy_work_dir: Option<PathBuf>,
}

impl AgentWorkDirCompatArgs {
    /// `--agent-work-dir`, else the deprecated `--work-dir` or `MESOS_GPU_WORK_DIR` (with a
    /// warning), else the default ([`Ctx::state_default`]).
    pub(crate) fn dir(&self, ctx: &Ctx) -> anyhow::Result<PathBuf> {
        match (&self.agent_work_dir, &self.legacy_work_dir) {
            (Some(_), Some(old)) => anyhow::bail!(
                "--work-dir {} and --agent-work-dir (or {AGENT_WORK_DIR_ENV}) both given: \
                 --work-dir is the old name of --agent-work-dir; keep only --agent-work-dir",
                old.display()
            ),
            (Some(dir), None) => Ok(dir.clone()),
            (None, Some(old)) => {
                deprecated(format_args!(
                    "--work-dir is deprecated here: it names the mesos-agent's work directory; \
                     write --agent-work-dir {}",
                    old.display()
                ));
                Ok(old.clone())
            }
            (None, None) => match std::env::var_os(LEGACY_WORK_DIR_ENV) {
                Some(old) => {
                    deprecated(format_args!(
                        "{LEGACY_WORK_DIR_ENV} is deprecated: write {AGENT_WORK_DIR_ENV}={}",
                        PathBuf::from(&old).display()
                    ));
                    Ok(PathBuf::from(old))
                }
                None => Ok(ctx.state_default("agent", DEFAULT_AGENT_WORK_DIR)),
            },
        }
    }
}

/// Logs a deprecated flag's warning, once per process (a command may read its flags twice).
fn deprecated(message: std::fmt::Arguments<'_>) {
    static WARNED: std::sync::Once = std::sync::Once::new();
    WARNED.call_once(|| tracing::warn!("{message}"));
}

/// The Docker containers' record of reservations (`docker-args`, `docker-wrapper`, `run` and
/// `serve` keep it) used when none is given. Docker tasks do not outlive a reboot, nor does it.
pub(crate) const DEFAULT_DOCKER_STATE_DIR: &str = "/var/run/mesos-gpu";

/// The Docker containers' reservations (their checkpoint) and the pool they draw from:
/// `docker-args`, `docker-wrapper`, `run` and `serve` must agree on both.
#[derive(clap::Args, Clone, Debug)]
pub(crate) struct DockerPoolArgs {
    /// Where the Docker containers' reservations are recorded (`<DIR>/gpu/allocations.json`;
    /// the GPUs themselves come from --pool-dir); under --simulate, the node's scratch directory
    /// unless given [default: /var/run/mesos-gpu].
    #[arg(long, value_name = "DIR")]
    docker_state_dir: Option<PathBuf>,

    /// The old name of --docker-state-dir (deprecated).
    #[arg(long = "work-dir", value_name = "DIR", hide = true)]
    legacy_work_dir: Option<PathBuf>,

    #[command(flatten)]
    pub(crate) pool: PoolArgs,
}

impl DockerPoolArgs {
    /// `--docker-state-dir`, else the deprecated `--work-dir` (with a warning), else the
    /// default ([`Ctx::state_default`]).
    pub(crate) fn state_dir(&self, ctx: &Ctx) -> anyhow::Result<PathBuf> {
        match (&self.docker_state_dir, &self.legacy_work_dir) {
            (Some(_), Some(old)) => anyhow::bail!(
                "--work-dir {} and --docker-state-dir both given: --work-dir is the old name of \
                 --docker-state-dir; keep only --docker-state-dir",
                old.display()
            ),
            (Some(dir), None) => Ok(dir.clone()),
            (None, Some(old)) => {
                deprecated(format_args!(
                    "--work-dir is deprecated here: it names the Docker containers' record of \
                     reservations; write --docker-state-dir {}",
                    old.display()
                ));
                Ok(old.clone())
            }
            (None, None) => Ok(ctx.state_default("docker", DEFAULT_DOCKER_STATE_DIR)),
        }
    }
}

/// The Docker daemon the command talks to.
#[derive(clap::Args, Clone, Debug)]
pub(crate) struct DockerSocketArgs {
    /// Docker daemon socket: images are read there, and it is recorded as the containers'
    /// daemon, which the pool asks whether a container still runs.
    #[arg(long, value_name = "PATH", default_value = docker_pool::DEFAULT_DOCKER_SOCKET)]
    pub(crate) docker_socket: PathBuf,
}

/// Where the driver volumes are.
#[derive(clap::Args, Clone, Debug)]
pub(crate) struct VolumeRootArgs {
    /// Directory holding the `nvidia_<driver version>` volumes (mounted at /usr/local/nvidia);
    /// the module's `volume_root`.
    #[arg(long, value_name = "DIR", default_value = mesos_gpu_volume::volume::DEFAULT_ROOT)]
    pub(crate) volume_root: PathBuf,
}

/// How a Docker container that asks for the driver gets its volume.
#[derive(clap::Args, Clone, Debug)]
pub(crate) struct DriverVolumeArgs {
    /// Name the plugin-served volume `nvidia_driver_<version>` instead of binding the volume
    /// directory.
    #[arg(long)]
    pub(crate) plugin: bool,

    #[command(flatten)]
    pub(crate) root: VolumeRootArgs,
}

/// NUMA pinning of what the command starts.
#[derive(clap::Args, Clone, Debug)]
pub(crate) struct NumaArgs {
    /// Narrow the container to its GPUs' local CPUs and memory nodes (NUMA pinning, within the
    /// machine's online CPUs; the cpuset cgroup for `exec`, `--cpuset-cpus/--cpuset-mems` for
    /// Docker), unless that leaves fewer CPUs than --cpus.
    #[arg(long)]
    pub(crate) numa_pinning: bool,

    /// The CPUs the container needs (as a task's `cpus` or `docker run --cpus`): NUMA pinning
    /// never leaves it fewer.
    #[arg(long, value_name = "N", requires = "numa_pinning", value_parser = crate::numa::parse_cpus)]
    pub(crate) cpus: Option<f64>,
}

/// Parses `--gpus`: a whole number of GPUs. Anything else is a usage error (exit 2), reported
/// by clap before anything is done; a count above what the node has is found later (exit 1).
pub(crate) fn parse_gpus(value: &str) -> Result<u32, String> {
    value.trim().parse::<u32>().map_err(|_| {
        format!("{value:?} is not a number of GPUs: expected a whole number such as 0, 1 or 2")
    })
}

/// Refuses a request for GPUs when this process sees none, with discovery's reason: what it
/// cannot see it could neither place among the node's records nor record.
pub(crate) fn require_gpus(ctx: &Ctx, gpus: u32) -> anyhow::Result<()> {
    let inventory = ctx.inventory()?;
    if gpus > 0 && inventory.gpus.is_empty() {
        anyhow::bail!(
            "gpus={gpus}: this process sees no GPU ({}): granting no GPU",
            inventory
                .absent_reason
                .as_deref()
                .unwrap_or("NVML reports none")
        );
    }
    Ok(())
}

/// Runs the chosen subcommand.
pub(crate) fn run(command: Command, ctx: &Ctx) -> anyhow::Result<ExitCode> {
    match command {
        Command::Info(args) => info::run(&args, ctx),
        Command::AgentFlags(args) => agent_flags::run(&args, ctx),
        Command::Ldcache(args) => ldcache::run(&args, ctx),
        Command::Volume(args) => volume::run(&args, ctx),
        Command::Serve(args) => serve::run(&args, ctx),
        Command::DockerArgs(args) => docker_args::run(&args, ctx),
        Command::DockerWrapper(args) => docker_wrapper::run(&args, ctx),
        Command::Run(args) => run::run(&args, ctx),
        Command::Gpu(args) => gpu::run(&args, ctx),
        Command::Demo(args) => demo::run(&args, ctx),
        Command::Exec(args) => exec::run(&args, ctx),
        Command::Cdi(args) => cdi::run(&args, ctx),
        Command::Doctor(args) => doctor::run(&args, ctx),
        Command::Module(args) => module::run(&args, ctx),
    }
}
