//! `mesos-gpu doctor`: what an operator runs on an agent host before its first task. Each check
//! prints `ok`, `warn` or `fail` with what it found and what to do; the command exits 0 only when
//! no check failed (the host is ready), 1 otherwise.
//!
//! Checks, in order (`doctor/checks.rs`, `doctor/config.rs`, `doctor/smoke.rs`):
//! - `driver`: NVML loads; which library, the driver and CUDA versions, the GPUs;
//! - `device-nodes`: every `/dev/nvidia*` node with the number the driver gives it
//!   (`nvidia-uvm`'s major from `/proc/devices`, the GPUs' minors from NVML, MIG capability nodes);
//! - `cgroups`: the hierarchy Mesos uses and the `--isolation` that goes with it, proven by a
//!   scratch container cgroup made with the module's device control (v2: its eBPF program
//!   attached) and removed;
//! - `driver-volume`: the volume would hold `libcuda`, `libnvidia-ml` and `nvidia-smi` of this
//!   driver (ELF, version-checked), its root is not `noexec`, a built one is intact;
//! - `directories`: the pool, Docker reservations, volume and agent work directories, the NVML
//!   library and the device root agree across the module's `modules.json`, the Docker hook's
//!   command line, the `--docker` wrapper (`mesos-gpu-docker`; it loads no NVML, so only its
//!   directories count), and `serve`'s unit and `/etc/default/mesos-gpu`;
//! - `configuration`: each file is one its program accepts, checked as it checks it: the
//!   isolator's parameters by the module's own parser, the module library by the symbols Mesos
//!   looks up in it, `serve`'s options by `serve`'s own parser;
//! - `sharing`: `gpu_replicas` with MIG devices is refused; under `mps` the control program exists;
//! - `cdi`: no device declared twice in one CDI directory;
//! - with `--smoke`: `nvidia-smi -L` from the volume in a container cgroup with one GPU and one
//!   with none.
//!
//! Under `--simulate` it runs against nvml-sim, the simulated driver tree and, unless
//! `--dev-root` names one, a scratch device root whose nodes are made with `mknod` as the
//! simulated driver numbers them; cgroups are the host's.

mod accepted;
mod checks;
mod config;
mod report;
mod smoke;

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context as _;
use mesos_gpu_docker::cdi::DEFAULT_SPEC_DIRS;
use mesos_gpu_isolator::lifecycle::CgroupChoice;
use mesos_gpu_node::discovery::DEFAULT_NVML_LIB;
use mesos_gpu_node::inventory::Inventory;
use mesos_gpu_pool::{DEFAULT_POOL_DIR, POOL_DIR_ENV};
use mesos_gpu_volume::VolumePlan;

use crate::ctx::Ctx;
use config::{Defaults, Files, Sources, Wrapper};
use report::{Check, Report};

/// The agent's `--docker` wrapper (`examples/mesos-agent/mesos-gpu-docker`), where the package
/// installs it and where a hand install might.
const INSTALLED_WRAPPERS: [&str; 2] = [
    "/usr/bin/mesos-gpu-docker",
    "/usr/local/bin/mesos-gpu-docker",
];

/// The systemd unit, where an override (`/etc`) or the package (`/lib`, `/usr/lib`) puts it.
const UNITS: [&str; 3] = [
    "/etc/systemd/system/mesos-gpu.service",
    "/lib/systemd/system/mesos-gpu.service",
    "/usr/lib/systemd/system/mesos-gpu.service",
];

#[derive(clap::Args)]
#[command(
    long_about = "Check an agent host before its first task: the NVIDIA driver and NVML, every \
                  device node and its numbers, the cgroup hierarchy and what it means for the \
                  agent's --isolation (a scratch cgroup is made and removed), the driver volume \
                  (libcuda, libnvidia-ml, nvidia-smi of this driver, not on a noexec mount), \
                  that the module, the Docker hook, the --docker wrapper and `serve` agree on \
                  their directories, NVML library and device root, that the module's parameters \
                  (by the module's own parser), its library (the module's symbol in it) and \
                  serve's options (by serve's own parser) would be accepted, GPU sharing and MIG \
                  settings, and CDI specs that conflict. \
                  With --smoke, also run nvidia-smi -L from the volume in a container with one \
                  GPU and one with none. Prints ok/warn/fail per check with what to do; exits 0 \
                  only when the host is ready, 1 otherwise. Needs root. Changes nothing on the \
                  GPUs.",
    after_help = "Examples:\n  \
        mesos-gpu doctor\n  \
        mesos-gpu doctor --smoke --modules /etc/mesos/modules.json --wrapper \\\n      \
        /usr/bin/mesos-gpu-docker\n  \
        mesos-gpu doctor --json | jq '.checks[] | select(.status != \"ok\")'\n  \
        mesos-gpu --simulate dgx1-v100 doctor --smoke"
)]
pub(crate) struct Args {
    /// Print the report as JSON (`{"ready": …, "checks": [{name, status, summary, details,
    /// fix}]}`).
    #[arg(long)]
    json: bool,

    /// Also run `nvidia-smi -L` from the driver volume in a container cgroup holding one GPU
    /// (must list it) and one holding none (must list none), through `mesos-gpu exec`.
    #[arg(long)]
    smoke: bool,

    /// Show the details of every check, also of those that pass.
    #[arg(long, short)]
    verbose: bool,

    /// The agent's modules.json (the module's parameters, checked by the module's own parser, its
    /// library, which must define the modules it loads, and the Docker hook's command line).
    #[arg(long, value_name = "FILE")]
    modules: Option<PathBuf>,

    /// The agent's --resources (text, JSON or file://), checked against what the module's
    /// parameters (--modules) hand out on this node, by the rule the module applies when the
    /// agent starts: exactly the GPU units it serves, no phantom ones.
    #[arg(long, value_name = "RESOURCES", env = "MESOS_RESOURCES")]
    resources: Option<String>,

    /// The agent's `--docker` wrapper script (`mesos-gpu docker-wrapper …`) [default: the first
    /// of /usr/bin/mesos-gpu-docker, /usr/local/bin/mesos-gpu-docker that exists].
    #[arg(long, value_name = "FILE")]
    wrapper: Option<PathBuf>,

    /// `serve`'s options file (MESOS_GPU_SERVE_OPTS, checked by serve's own parser).
    #[arg(long, value_name = "FILE", default_value = "/etc/default/mesos-gpu")]
    defaults: PathBuf,

    /// `serve`'s systemd unit [default: the first of /etc/systemd/system, /lib/systemd/system,
    /// /usr/lib/systemd/system holding mesos-gpu.service].
    #[arg(long, value_name = "FILE")]
    unit: Option<PathBuf>,

    /// Directory of the driver volumes [default: the module's volume_root, else
    /// /var/run/mesos/isolators/gpu; under --simulate, the node's scratch directory].
    #[arg(long, value_name = "DIR")]
    volume_root: Option<PathBuf>,

    /// The driver's file system root; with --simulate and none given, the simulated driver tree
    /// [default: /].
    #[arg(long, value_name = "DIR")]
    driver_root: Option<PathBuf>,

    /// The node's GPU pool `--smoke` takes its GPU from [default: the module's pool_dir, else
    /// /var/lib/mesos-gpu; with --simulate, a scratch one].
    #[arg(long, value_name = "DIR", env = POOL_DIR_ENV)]
    pool_dir: Option<PathBuf>,

    /// Cgroup interface to check and `--smoke` with: auto (as Mesos picks), v1 or v2.
    #[arg(long, value_name = "VERSION", default_value = "auto", value_parser = parse_choice)]
    cgroup_version: CgroupChoice,

    /// The CDI spec directories runtimes read, lowest priority first.
    #[arg(long, value_name = "DIRS", value_delimiter = ',', default_values = DEFAULT_SPEC_DIRS)]
    cdi_spec_dirs: Vec<PathBuf>,
}

fn parse_choice(s: &str) -> Result<CgroupChoice, String> {
    s.parse().map_err(|e| format!("{e}"))
}

pub(crate) fn run(args: &Args, ctx: &Ctx) -> anyhow::Result<ExitCode> {
    let inventory = match ctx.inventory() {
        Ok(inventory) => inventory.clone(),
        Err(e) => Inventory {
            absent_reason: Some(format!("{e:#}")),
            ..Inventory::default()
        },
    };
    let lib = ctx.driver().ok().flatten().map(|d| d.lib_path().to_owned());
    let proc_root = ctx.proc_root()?;
    let sim = ctx.simulation()?;
    // A simulated node without --dev-root gets nodes made as its driver numbers them.
    let scratch_dev = match (sim, ctx.dev_root()) {
        (Some(_), None) => Some(scratch_dev_root(&inventory, &proc_root)?),
        _ => None,
    };
    let dev_root = scratch_dev
        .as_ref()
        .map(|d| d.path().to_owned())
        .or_else(|| ctx.dev_root().map(Path::to_owned));
    let sources = read_sources(args);
    let volume_root = volume_root(args, &sources, ctx);
    let driver = super::volume::driver_source(ctx, args.driver_root.as_deref())?;

    let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
    let loaded = checks::loaded_nvml(&maps);
    let mut all = vec![checks::driver(&inventory, loaded, lib.as_deref())];
    if let Some(dev_root) = &dev_root {
        all.push(checks::device_nodes(&inventory, dev_root, &proc_root));
    }
    all.push(checks::cgroups(args.cgroup_version));
    let me = match sim {
        Some(sim) => format!("mesos-gpu --simulate {}", sim.name()),
        None => "mesos-gpu".to_owned(),
    };
    let (volume, plan) = checks::driver_volume(&inventory, &driver, &volume_root, &me);
    all.push(volume);
    all.push(sources.agreement(&Defaults::of_this_build(loader_nvml(ctx, loaded)?)));
    let resources = args
        .resources
        .as_deref()
        .map(super::agent_flags::flag_value)
        .transpose()?;
    let agent = resources
        .as_deref()
        .map(|resources| accepted::AgentResources {
            resources,
            inventory: &inventory,
        });
    all.push(accepted::configuration(&sources, agent.as_ref()));
    all.push(checks::sharing(&inventory, &sources, &driver));
    all.push(checks::cdi(&args.cdi_spec_dirs));
    if args.smoke {
        all.extend(smoke_checks(
            args,
            ctx,
            dev_root.as_deref(),
            &sources,
            plan.as_ref(),
        )?);
    }
    print_report(args, &Report::new(all))
}

/// The configuration sources `doctor` compares: the module parameters, the Docker wrapper
/// (the one named, else the installed one), the defaults file and the agent's unit.
fn read_sources(args: &Args) -> Sources {
    let unit = args.unit.clone().unwrap_or_else(|| {
        UNITS
            .iter()
            .map(PathBuf::from)
            .find(|p| p.exists())
            .unwrap_or_else(|| PathBuf::from(UNITS[1]))
    });
    Sources::read(&Files {
        modules: args.modules.as_deref(),
        wrapper: args.wrapper.as_deref().map_or_else(
            || {
                let installed = INSTALLED_WRAPPERS
                    .iter()
                    .map(Path::new)
                    .find(|p| p.exists())
                    .unwrap_or(Path::new(INSTALLED_WRAPPERS[0]));
                Wrapper::Installed(installed)
            },
            Wrapper::Named,
        ),
        defaults: &args.defaults,
        unit: &unit,
    })
}

/// `--volume-root`, else the module's `volume_root`, else the default (a simulated node's own,
/// in its scratch state).
fn volume_root(args: &Args, sources: &Sources, ctx: &Ctx) -> PathBuf {
    args.volume_root
        .clone()
        .or_else(|| {
            sources
                .module
                .as_ref()?
                .given
                .get("volume_root")
                .map(PathBuf::from)
        })
        .unwrap_or_else(|| ctx.state_default("volumes", mesos_gpu_volume::volume::DEFAULT_ROOT))
}

/// `--smoke`: runs a task through `mesos-gpu exec` in a child, with this node's options and
/// a pool directory (`--pool-dir`; a scratch one on a simulated node; else the agent's).
fn smoke_checks(
    args: &Args,
    ctx: &Ctx,
    dev_root: Option<&Path>,
    sources: &Sources,
    plan: Option<&VolumePlan>,
) -> anyhow::Result<Vec<Check>> {
    let sim = ctx.simulation()?;
    if let Some(missing) = sim.and_then(|sim| sim.missing_smi()) {
        // The placeholder would die of SIGSEGV in both containers, which reads as a broken host.
        let profile = if missing.parent().is_some_and(|d| d.ends_with("release")) {
            " --release"
        } else {
            ""
        };
        return Ok(vec![Check {
            name: "smoke",
            status: report::Status::Fail,
            summary: format!(
                "the simulated driver has no nvidia-smi to run: its stand-in {} is not built",
                missing.display()
            ),
            details: Vec::new(),
            fix: Some(format!(
                "build the simulator's programs beside this one: `cargo build{profile} -p nvml-sim` (the guide's From source builds them)"
            )),
        }]);
    }
    let scratch_pool;
    let pool_dir = match (&args.pool_dir, sim) {
        (Some(dir), _) => dir.clone(),
        (None, Some(_)) => {
            scratch_pool = tempfile::Builder::new()
                .prefix("mesos-gpu-doctor-pool-")
                .tempdir()
                .context("cannot make a scratch pool directory")?;
            scratch_pool.path().to_owned()
        }
        (None, None) => sources
            .agent_setting("pool_dir")
            .map_or_else(|| PathBuf::from(DEFAULT_POOL_DIR), PathBuf::from),
    };
    let mut global: Vec<OsString> = Vec::new();
    let mut env = Vec::new();
    if let (Some(spec), Some(sim)) = (&ctx.global.simulate, sim) {
        global.extend(["--simulate".into(), spec.into()]);
        env.push((
            "NVML_SIM_CONFIG".to_owned(),
            sim.config_path().display().to_string(),
        ));
        if let Some(dev) = dev_root {
            env.push(("NVML_SIM_DEV_ROOT".to_owned(), dev.display().to_string()));
        }
    }
    if let Some(lib) = &ctx.global.nvml_lib {
        global.extend(["--nvml-lib".into(), lib.into()]);
    }
    if let Some(dev) = dev_root {
        global.extend(["--dev-root".into(), dev.into()]);
    }
    let exec: Vec<OsString> = vec![
        "--pool-dir".into(),
        pool_dir.into(),
        "--cgroup-version".into(),
        choice_word(args.cgroup_version).into(),
    ];
    Ok(smoke::run(&smoke::Smoke { global, exec, env }, plan))
}

/// Prints the report (`--json`, or text) and exits 1 when the host is not ready.
fn print_report(args: &Args, report: &Report) -> anyhow::Result<ExitCode> {
    let mut out = std::io::stdout().lock();
    if args.json {
        serde_json::to_writer_pretty(&mut out, report)?;
        std::io::Write::write_all(&mut out, b"\n")?;
    } else {
        std::io::Write::write_all(&mut out, report.text(args.verbose).as_bytes())?;
    }
    Ok(if report.ready {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// The NVML library a program naming none opens: the file this process's loader found for
/// `libnvidia-ml.so.1` when it looked it up itself (no `--nvml-lib`, no `--simulate`), else
/// that name.
fn loader_nvml(ctx: &Ctx, loaded: Option<&str>) -> anyhow::Result<String> {
    let looked_up = ctx.global.nvml_lib.is_none() && ctx.simulation()?.is_none();
    Ok(loaded
        .filter(|_| looked_up)
        .unwrap_or(DEFAULT_NVML_LIB)
        .to_owned())
}

fn choice_word(choice: CgroupChoice) -> &'static str {
    match choice {
        CgroupChoice::Auto => "auto",
        CgroupChoice::V1 => "v1",
        CgroupChoice::V2 => "v2",
    }
}

/// A device root holding every node the simulated driver numbers, made with `mknod` (root).
fn scratch_dev_root(inventory: &Inventory, proc_root: &Path) -> anyhow::Result<tempfile::TempDir> {
    let dir = tempfile::Builder::new()
        .prefix("mesos-gpu-doctor-dev-")
        .tempdir()
        .context("cannot make a scratch device root")?;
    crate::simulate::make_device_nodes(dir.path(), inventory, proc_root)?;
    Ok(dir)
}
