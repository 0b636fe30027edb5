//! `mesos-gpu exec`: run a command the way the agent runs a container's process — allocate GPUs,
//! create the container's device cgroup, run the command inside it from its first instruction,
//! wait, then clean up and release whatever way the command ends.
//!
//! The command starts in the cgroup before it runs a single instruction of its own: we spawn
//! ourselves as a small launcher (`exec --launcher-socket PATH -- CMD…`, hidden), which connects
//! to a unix socket we listen on and blocks reading it; we write its pid to `cgroup.procs`, then
//! send `go`, and only then does it `exec` CMD (`CommandExt::exec`). A launcher whose parent
//! dies reads end-of-file and exits without running CMD. SIGINT, SIGTERM and SIGHUP (the
//! terminal went away) are forwarded to the command; once it ends, processes it left in the
//! cgroup are killed and the container cleaned up. The exit status is the command's, or 128 +
//! the signal that killed it.
//!
//! The GPUs come from the node's pool (`--pool-dir`), in a short transaction: nothing is held
//! while the command runs, so execs run side by side. The container id is
//! `exec-<pid>-<random>` (a reused pid cannot collide with a leftover), its record lives in a
//! private directory `<pool dir>/exec/<id>`, and its reservation's owner is this process
//! (pid, start time, boot id) with the command's cgroup: if `exec` is killed, the GPUs stay
//! reserved while the command runs and come back once its cgroup is empty (the next request
//! that needs them, or `mesos-gpu gpu list`, reconciles the pool).

use std::ffi::OsString;
use std::io::{Read as _, Write as _};
use std::os::unix::net::{UnixListener, UnixStream};
use std::os::unix::process::{CommandExt as _, ExitStatusExt as _};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, ExitStatus};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use mesos_gpu_enforce::timing;
use mesos_gpu_isolator::{
    lifecycle::CgroupChoice, lifecycle::ContainerId, lifecycle::Isolator,
    lifecycle::IsolatorConfig, lifecycle::LaunchInfo, lifecycle::PoolConfig, lifecycle::PoolRole,
    lifecycle::PrepareConfig,
};
use mesos_gpu_node::devices::DeviceNodes;
use mesos_gpu_os::fsmode;
use mesos_gpu_placement::allocator::Policy;
use mesos_gpu_placement::sharing::Wanted;
use rustix::process::{Pid, Signal, kill_process};
use tokio::signal::unix::{SignalKind, signal};

use crate::ctx::Ctx;

/// What the launcher waits for before it runs the command.
const GO: &[u8] = b"go";

#[derive(clap::Args)]
#[command(
    long_about = "Run a command in a new container device cgroup with N GPUs, as the Mesos agent \
                  runs a task: allocate from the node's GPU pool (--pool-dir, shared with the \
                  agent's module, serve, run, docker-args and other execs), create the cgroup with \
                  the device rules, run the command inside it from its first instruction, wait, \
                  then remove the cgroup and release the GPUs. SIGINT/SIGTERM/SIGHUP are forwarded \
                  to the command. Exits with the command's status, or 128+N when it is killed by \
                  signal N. Needs root.",
    after_help = "Examples:\n  \
        mesos-gpu exec --gpus 2 -- nvidia-smi\n  \
        mesos-gpu exec --gpus 1 --policy first-fit --cgroup-version v2 -- python \\\n      \
        train.py\n  \
        mesos-gpu --simulate dgx1-v100 exec --gpus 4 -- sh -c \\\n      \
        'ls -l $NVML_SIM_DEV_ROOT'\n  \
        mesos-gpu exec --gpus 1 --numa-pinning --cpus 4 -- grep \\\n      \
        Cpus_allowed_list /proc/self/status\n  \
        # a 1/4 share under MPS\n  \
        mesos-gpu exec --gpus 1 --gpu-replicas 4 --gpu-sharing mps -- python \\\n      \
        infer.py\n  \
        mesos-gpu exec --gpus 1 --gpu-replicas 4 --gpu-sharing \\\n      \
        mps,4-7=time-slicing --share-mode time-slicing -- ./job"
)]
pub(crate) struct Args {
    /// Number of GPUs (a whole number from 0 to the GPUs of the node).
    #[arg(
        long,
        value_name = "N",
        required_unless_present = "launcher_socket",
        allow_negative_numbers = true,
        value_parser = super::parse_gpus
    )]
    gpus: Option<u32>,

    /// How GPUs are chosen: first-fit or topology.
    #[arg(long, value_name = "POLICY", default_value = "topology")]
    policy: Policy,

    /// Cgroup interface: auto, v1 or v2.
    #[arg(long, value_name = "VERSION", default_value = "auto", value_parser = parse_choice)]
    cgroup_version: CgroupChoice,

    #[command(flatten)]
    pool: super::PoolArgs,

    #[command(flatten)]
    sharing: super::SharingArgs,

    /// On a node sharing GPUs: what this command takes: `any` share (or whole GPUs when larger
    /// than a share), a share of an `mps` or `time-slicing` GPU, or `none` (whole GPUs), as a
    /// task asks with MESOS_GPU_SHARE_MODE.
    #[arg(long, value_name = "MODE", default_value = "any", value_parser = |s: &str| Wanted::parse(s).map_err(|e| e.to_string()))]
    share_mode: Wanted,

    /// Parent of the container cgroups (Mesos `--cgroups_root`).
    #[arg(long, value_name = "NAME", default_value = "mesos")]
    cgroups_root: String,

    /// NUMA pinning: the cpuset cgroup `<cpuset>/<cgroups root>/<id>` on v1, the container
    /// cgroup on v2.
    #[command(flatten)]
    numa: super::NumaArgs,

    /// Internal: run as the launcher that waits on this socket, then execs the command.
    #[arg(long, hide = true, value_name = "PATH")]
    launcher_socket: Option<PathBuf>,

    /// The command and its arguments.
    #[arg(last = true, required = true, value_name = "CMD")]
    command: Vec<OsString>,
}

fn parse_choice(s: &str) -> Result<CgroupChoice, String> {
    s.parse().map_err(|e| format!("{e}"))
}

/// Runs `exec` (or, with `--launcher-socket`, the launcher).
pub(crate) fn run(args: &Args, ctx: &Ctx) -> anyhow::Result<ExitCode> {
    if let Some(socket) = &args.launcher_socket {
        return launch(socket, &args.command);
    }
    let gpus = args.gpus.context("--gpus is required")?;
    let mut phases = Phases::new();
    // Each phase in turn, so that its time is its own: the lazy context would otherwise set up
    // the simulation and open NVML inside `device_root`.
    ctx.simulation()?;
    phases.mark("simulation");
    super::require_gpus(ctx, gpus)?;
    let inventory = ctx.inventory()?.clone();
    phases.mark("nvml");
    let (dev_root, simulated_env) = device_root(ctx)?;
    let dev_root = dev_root.as_path();
    let nodes = DeviceNodes::scan(dev_root, &inventory).with_context(|| {
        format!(
            "cannot read the NVIDIA device nodes under {}",
            dev_root.display()
        )
    })?;
    phases.mark("device_nodes");
    let id = ContainerId::new(format!(
        "exec-{}-{}",
        std::process::id(),
        super::docker_pool::new_container_id()?
            .as_str()
            .split('-')
            .next()
            .unwrap_or_default()
    ))?;
    let private = args.pool.pool_dir.join("exec").join(id.as_str());
    let config = isolator_config(args, ctx, &private)?;
    // Handlers first: from here on SIGINT/SIGTERM no longer kill us before we clean up.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let signals = {
        let _enter = runtime.enter();
        Caught {
            int: signal(SignalKind::interrupt())?,
            term: signal(SignalKind::terminate())?,
            hup: signal(SignalKind::hangup())?,
        }
    };
    let _private = PrivateDir(private);
    phases.mark("setup");
    let isolator = Isolator::new(config, inventory, nodes).context("cannot set up the isolator")?;
    isolator
        .recover(&[], &[])
        .context("cannot start the container's record")?;
    phases.mark("recover");
    let info = isolator
        .prepare(
            &id,
            PrepareConfig {
                gpus: f64::from(gpus),
                cpus: args.numa.cpus,
                sharing: args.share_mode,
                ..PrepareConfig::default()
            },
        )
        .context("cannot prepare the container")?;
    phases.mark("prepare");
    print_allocation(&id, &info);
    if args.numa.numa_pinning {
        let _ = writeln!(
            std::io::stderr(),
            "  NUMA pinning: {}",
            crate::numa::describe(&info.pinning)
        );
    }
    let outcome = start(&isolator, &id, &info, &simulated_env, &args.command).and_then(|child| {
        phases.mark("start");
        wait_forwarding(&runtime, signals, child)
    });
    phases.mark("command");
    let cleaned = clean_up(&isolator, &id);
    phases.mark("cleanup");
    phases.log();
    let status = outcome?;
    cleaned?;
    Ok(exit_code(status))
}

/// Where one exec's time went (issue 36), logged at debug when the command has been cleaned
/// up: each phase from the end of the one before, and the lifecycle steps of its isolator calls
/// ([`timing`]). The process's start before `run`, and its exit, are not in it.
struct Phases {
    start: Instant,
    last: Instant,
    done: Vec<(&'static str, Duration)>,
}

impl Phases {
    fn new() -> Phases {
        let _ = timing::take();
        let now = Instant::now();
        Phases {
            start: now,
            last: now,
            done: Vec::new(),
        }
    }

    /// Ends phase `name` now.
    fn mark(&mut self, name: &'static str) {
        let now = Instant::now();
        self.done.push((name, now - self.last));
        self.last = now;
    }

    fn log(&self) {
        let phases: Vec<String> = self
            .done
            .iter()
            .map(|(name, took)| format!("{name}={}", took.as_micros()))
            .collect();
        tracing::debug!(
            us = self.last.duration_since(self.start).as_micros(),
            phases = %phases.join(" "),
            steps = %timing::take(),
            "exec timings"
        );
    }
}

/// The device root and the environment the task's programs get. A simulated node without
/// --dev-root: the nodes its driver numbers, made once in its scratch directory; its programs
/// (the volume's nvidia-smi) are told the node, and the simulated driver's programs come first
/// on `PATH`, as an installed driver's are on a GPU host (`exec -- nvidia-smi` runs its).
fn device_root(ctx: &Ctx) -> anyhow::Result<(PathBuf, Vec<(String, String)>)> {
    Ok(match (ctx.simulation()?, ctx.dev_root()) {
        (Some(sim), given) => {
            let dev = match given {
                Some(dev) => dev.to_owned(),
                None => sim.device_root(ctx.inventory()?, &ctx.proc_root()?)?,
            };
            let env = vec![
                (
                    "NVML_SIM_CONFIG".to_owned(),
                    sim.config_path().display().to_string(),
                ),
                ("NVML_SIM_DEV_ROOT".to_owned(), dev.display().to_string()),
                ("PATH".to_owned(), with_first_on_path(&sim.driver_bin()?)?),
            ];
            (dev, env)
        }
        (None, given) => (
            given.map_or_else(|| PathBuf::from("/dev"), Path::to_owned),
            Vec::new(),
        ),
    })
}

/// This process's `PATH` with `dir` first.
fn with_first_on_path(dir: &Path) -> anyhow::Result<String> {
    let rest = std::env::var_os("PATH").unwrap_or_default();
    let joined =
        std::env::join_paths(std::iter::once(dir.to_owned()).chain(std::env::split_paths(&rest)))
            .with_context(|| format!("cannot put {} on PATH", dir.display()))?;
    joined
        .into_string()
        .map_err(|p| anyhow::anyhow!("PATH is not UTF-8: {}", p.to_string_lossy()))
}

/// The isolator's configuration: records under `private`, the node's pool as an exec, and
/// the policy, sharing, cgroup and pinning options.
fn isolator_config(args: &Args, ctx: &Ctx, private: &Path) -> anyhow::Result<IsolatorConfig> {
    let mut config = IsolatorConfig::new(private);
    config.pool = Some(PoolConfig {
        dir: args.pool.pool_dir.clone(),
        role: PoolRole::Exec {
            private_dir: private.to_owned(),
        },
    });
    config.policy = args.policy;
    config.sharing = args.sharing.config(ctx)?;
    config.cgroup_version = args.cgroup_version;
    config.cgroups_root.clone_from(&args.cgroups_root);
    if args.numa.numa_pinning {
        config.pinning.enabled = true;
        config.pinning.affinities = crate::numa::affinities(ctx)?;
    }
    Ok(config)
}

/// SIGINT, SIGTERM and SIGHUP, caught from when they are made: forwarded to the task.
struct Caught {
    int: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
}

/// Waits for `child`, forwarding the signals caught to it.
fn wait_forwarding(
    runtime: &tokio::runtime::Runtime,
    mut signals: Caught,
    mut child: Child,
) -> anyhow::Result<ExitStatus> {
    let pid = Pid::from_raw(i32::try_from(child.id())?).context("child pid")?;
    let waited = runtime.block_on(async {
        let wait = tokio::task::spawn_blocking(move || child.wait());
        tokio::pin!(wait);
        loop {
            tokio::select! {
                status = &mut wait => break status,
                _ = signals.int.recv() => forward(pid, Signal::INT),
                _ = signals.term.recv() => forward(pid, Signal::TERM),
                _ = signals.hup.recv() => forward(pid, Signal::HUP),
            }
        }
    });
    Ok(waited??)
}

/// The exec's private record directory, removed when the exec ends.
struct PrivateDir(PathBuf);

impl Drop for PrivateDir {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir_all(&self.0)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(dir = %self.0.display(), error = %e, "cannot remove the exec's record directory");
        }
    }
}

/// Spawns the launcher, moves it into the container's cgroup and lets it exec the command.
fn start(
    isolator: &Isolator,
    id: &ContainerId,
    info: &LaunchInfo,
    simulated_env: &[(String, String)],
    command: &[OsString],
) -> anyhow::Result<Child> {
    let dir = fsmode::private_tempdir("mesos-gpu-exec")?;
    let socket = dir.path().join("launch.sock");
    let listener = fsmode::bind_socket(&socket, fsmode::PRIVATE_FILE, UnixListener::bind)
        .with_context(|| format!("cannot listen on {}", socket.display()))?;
    listener.set_nonblocking(true)?;
    let mut child =
        Command::new(std::env::current_exe().context("cannot find our own executable")?)
            .arg("exec")
            .arg("--launcher-socket")
            .arg(&socket)
            .arg("--")
            .args(command)
            .envs(
                info.environment
                    .iter()
                    .chain(simulated_env)
                    .map(|(k, v)| (k, v)),
            )
            .spawn()
            .context("cannot start the launcher")?;
    let released = isolator
        .isolate(id, child.id())
        .context("cannot move the command into its cgroup")
        .and_then(|()| release(&listener, &mut child));
    if let Err(e) = released {
        let _ = child.kill();
        let _ = child.wait();
        return Err(e);
    }
    Ok(child)
}

/// Waits for the launcher to connect and tells it to go.
fn release(listener: &UnixListener, child: &mut Child) -> anyhow::Result<()> {
    loop {
        match listener.accept() {
            Ok((mut stream, _)) => {
                stream.set_nonblocking(false)?;
                stream
                    .write_all(GO)
                    .context("cannot release the launcher")?;
                return Ok(());
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if let Some(status) = child.try_wait()? {
                    bail!("the launcher ended before running the command ({status})");
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            Err(e) => return Err(e).context("cannot accept the launcher's connection"),
        }
    }
}

/// The launcher: wait for `go` on `socket`, then become the command.
fn launch(socket: &Path, command: &[OsString]) -> anyhow::Result<ExitCode> {
    let mut stream = UnixStream::connect(socket)
        .with_context(|| format!("cannot connect to {}", socket.display()))?;
    let mut word = Vec::new();
    stream
        .read_to_end(&mut word)
        .context("cannot read the go signal")?;
    if word != GO {
        bail!("mesos-gpu exec went away before the command could start");
    }
    drop(stream);
    let (program, rest) = command.split_first().context("no command given")?;
    let err = Command::new(program).args(rest).exec();
    eprintln!(
        "mesos-gpu exec: cannot run {}: {err}",
        program.to_string_lossy()
    );
    Ok(ExitCode::from(
        if err.kind() == std::io::ErrorKind::NotFound {
            127
        } else {
            126
        },
    ))
}

fn forward(pid: Pid, sig: Signal) {
    tracing::info!(pid = pid.as_raw_nonzero().get(), signal = ?sig, "forwarding signal to the command");
    if let Err(e) = kill_process(pid, sig) {
        tracing::debug!(error = %e, "the command is already gone");
    }
}

/// Kills what the command left in the cgroup, then removes the cgroup and releases the GPUs.
fn clean_up(isolator: &Isolator, id: &ContainerId) -> anyhow::Result<()> {
    let procs = isolator.cgroup_path(id).join("cgroup.procs");
    for _ in 0..100 {
        match isolator.cleanup(id) {
            Err(e) if e.is_busy() => {
                let pids = std::fs::read_to_string(&procs).unwrap_or_default();
                for pid in pids
                    .split_whitespace()
                    .filter_map(|p| p.parse().ok())
                    .filter_map(Pid::from_raw)
                {
                    let _ = kill_process(pid, Signal::KILL);
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            other => return other.context("cannot clean up the container"),
        }
    }
    bail!(
        "processes in {} survive SIGKILL; the container's GPUs stay allocated",
        procs.display()
    )
}

fn print_allocation(id: &ContainerId, info: &LaunchInfo) {
    let gpus: Vec<String> = info
        .gpus
        .iter()
        .map(|g| format!("{} ({}, /dev/nvidia{})", g.index, g.uuid, g.minor))
        .collect();
    let rules: Vec<String> = info.device_rules.iter().map(ToString::to_string).collect();
    let mut err = std::io::stderr().lock();
    let _ = writeln!(err, "mesos-gpu exec: container {id}");
    let _ = writeln!(
        err,
        "  GPUs: {}",
        match (gpus.is_empty(), info.mig.is_empty()) {
            (true, true) => "none".to_owned(),
            (true, false) => "none whole (MIG devices below)".to_owned(),
            (false, _) => gpus.join(", "),
        }
    );
    if !info.mig.is_empty() {
        let _ = writeln!(err, "  MIG devices: {}", info.mig.join(", "));
    }
    let env = |key: &str| {
        info.environment
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v)
    };
    if let (Some(share), Some(mode)) = (
        env(mesos_gpu_grant::env::MESOS_GPU_SHARE),
        env(mesos_gpu_grant::env::MESOS_GPU_SHARING),
    ) {
        let _ = writeln!(err, "  share: {share} of the GPU ({mode})");
    }
    if let Some(cgroup) = &info.cgroup {
        let _ = writeln!(err, "  cgroup: {}", cgroup.display());
    }
    let _ = writeln!(err, "  device rules: {}", rules.join(", "));
    for (k, v) in &info.environment {
        let _ = writeln!(err, "  env: {k}={v}");
    }
}

/// The command's exit code, or 128 + the signal that killed it.
fn exit_code(status: ExitStatus) -> ExitCode {
    let code = status
        .code()
        .or_else(|| status.signal().map(|s| 128 + s))
        .unwrap_or(1);
    ExitCode::from(u8::try_from(code).unwrap_or(1))
}
