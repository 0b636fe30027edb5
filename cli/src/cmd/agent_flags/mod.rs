//! `mesos-gpu agent-flags`: the mesos-agent flags that give this node's GPUs to tasks, checked
//! by Mesos's rules (`mesos_gpu_isolator::agent_flags`). One flag per line, shell-quoted, ready
//! to paste or to `eval` (`examples/mesos-agent/agent.sh`).
//!
//! Without `--isolation`, or with one naming mesos-gpu's module, the flags are those of the
//! module: `--isolation` for the cgroup version (`--cgroups`), `--resources` and `--attributes`
//! advertising the GPUs (MIG devices by `--mig-strategy`, shares by `--gpu-replicas`),
//! `--agent_subsystems=` on cgroup v2, and `--modules` with the module's parameters
//! (`work_dir`, `pool_dir`, `volume_root`, and `nvidia_gpu_devices`, `mig_strategy`,
//! `gpu_replicas`, `gpu_sharing`, `nvml_lib`, `dev_root`, `proc_root` when they apply), inline
//! or in `--modules-file`, checked first by the module's own parser ([`ModuleConfig::parse`]). With `gpu/nvidia` they are Mesos's own isolator's: `--resources`,
//! `--attributes` and `--nvidia_gpu_devices`, and `--agent_subsystems=` on cgroup v2 (its
//! `cgroups/devices` aborts the agent at the first container without it).
//!
//! NVML is read only when a GPU isolator is in `--isolation` or GPUs are advertised (for the
//! attributes); without one a broken driver is only a warning, as Mesos never loads NVML then,
//! but a `--nvml-lib` that cannot be loaded is always an error. When there is no flag to print,
//! stderr says why (and the exit status is 0). On a node the module cannot serve (no GPU, no
//! driver) the flags are the same agent's without the module: `--isolation` without it (never
//! empty, see [`isolation_without_module`]), `--resources` and the cgroup version's flags, and
//! stderr says why.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context as _;
use mesos_gpu_enforce::cgroup::{CgroupLayout, CgroupVersion};
use mesos_gpu_isolator::agent_flags::module::{
    DEFAULT_MODULE_LIBRARY, cgroup_agent_flags, check_module_isolation, isolation_without_module,
    module_isolation,
};
use mesos_gpu_isolator::agent_flags::{
    AgentGpuFlags, AgentGpus, DEVICES_FLAG, GpuIsolator, MODULE_ISOLATOR, MigStrategy,
    ModuleConfig, ModuleGpus, ModuleParameters, check_agent_resources,
};
use mesos_gpu_isolator::lifecycle::CgroupChoice;
use mesos_gpu_node::inventory::Inventory;
use mesos_gpu_placement::sharing::SharingSpec;

use crate::ctx::Ctx;

mod command_line;

use command_line::{AgentCommandLine, Source, one_value};

#[derive(clap::Args)]
#[command(after_help = "Examples:\n  \
    mesos-gpu agent-flags\n  \
    mesos-gpu agent-flags --resources 'cpus:32;mem:245760' --cgroups v2 \\\n      \
    --modules-file /etc/mesos/gpu-modules.json\n  \
    mesos-gpu agent-flags --simulate dgx-a100-mig --mig-strategy mixed\n  \
    mesos-gpu agent-flags --module-param driver_volume=build --module-param \\\n      \
    health_checks=all\n  \
    mesos-gpu agent-flags --simulate dgx1-v100 --gpu-replicas 4,6=1,7=1 \\\n      \
    --gpu-sharing mps\n  \
    mesos-gpu agent-flags --simulate dgx1-v100 --gpu-replicas 4 \\\n      \
    --gpu-sharing mps,4-5=time-slicing,6-7=none\n  \
    mesos-gpu agent-flags --isolation cgroups/devices,gpu/nvidia --resources \\\n      \
    gpus:2 --nvidia-gpu-devices 0,1\n\
    \n\
    Without --isolation the flags load mesos-gpu's module (org_apache_mesos_gpu_MesosGpuIsolator) and end with\n\
    --modules, the module's parameters matching the advertised GPUs; `eval` them into the agent's command line\n\
    (examples/mesos-agent/agent.sh). With --gpu-replicas, each shared GPU is advertised as R `gpus` units (a task's\n\
    gpus:k is a k/R share of one GPU) and the split is written in the attributes gpu_sharing, gpu_shared, gpu_whole\n\
    and gpu_replicas. Values may also be given as file:///path, as mesos-agent accepts them.")]
pub(crate) struct Args {
    /// The agent's --isolation (comma-separated). Without it: mesos-gpu's module for the cgroup
    /// version (`--cgroups`), `filesystem/linux,cgroups/devices,<module>` on v1 and
    /// `filesystem/linux,<module>` on v2. With `gpu/nvidia`: Mesos's own GPU isolator.
    #[arg(long, value_name = "LIST")]
    isolation: Option<String>,

    /// The agent's cgroup version, for the module and gpu/nvidia (both need
    /// --agent_subsystems= on v2): v1, v2, or auto (v2 exactly when cgroup2 is mounted at
    /// /sys/fs/cgroup, as Mesos decides).
    #[arg(long, value_name = "auto|v1|v2", default_value = "auto")]
    cgroups: CgroupChoice,

    /// The agent's --resources, text (`cpus:8;gpus(ml):2`) or JSON array form.
    #[arg(long, value_name = "RESOURCES")]
    resources: Option<String>,

    /// The GPUs to advertise, as NVML indices, comma-separated (e.g. 0,1,2), with `gpus` in
    /// --resources: the module's `nvidia_gpu_devices` parameter, or `gpu/nvidia`'s
    /// --nvidia_gpu_devices.
    #[arg(long, value_name = "LIST")]
    nvidia_gpu_devices: Option<String>,

    /// On a node with GPUs in MIG mode: `single` offers every MIG device as one `gpus` unit,
    /// `mixed` keeps `gpus` for whole GPUs and offers each MIG profile as its own scalar
    /// (`mig-1g.5gb`). Ignored on a node without MIG. The module's `mig_strategy`.
    #[arg(long, value_name = "single|mixed", default_value = "single")]
    mig_strategy: MigStrategy,

    /// The agent's own --attributes, kept ahead of the GPU attributes (`rack:r1;zone:a`).
    #[arg(long, value_name = "ATTRIBUTES")]
    attributes: Option<String>,

    /// Share GPUs: `R` shares every advertised GPU R ways (1-48); `SEL=R` (SEL an NVML index or
    /// UUID) sets one GPU; R=1 keeps a GPU whole. E.g. `4`, `4,3=1`, `0=2,1=2`. The module's
    /// `gpu_replicas`, so not with gpu/nvidia in --isolation (Mesos's isolator shares no GPU);
    /// only with `--containerizers=mesos`: Mesos's Docker containerizer cannot start with more
    /// `gpus` than the node has GPUs.
    #[arg(long, value_name = "SPEC")]
    gpu_replicas: Option<String>,

    /// How each GPU's shares are enforced: a MODE for every GPU and SEL=MODE entries (SEL an
    /// index, a range such as 4-5, or a UUID); MODE is time-slicing (accounting only, no
    /// isolation), mps, or none (kept whole). E.g. `mps,4-5=time-slicing,6-7=none`. The
    /// module's `gpu_sharing`.
    #[arg(
        long,
        value_name = "SPEC",
        default_value = "time-slicing",
        requires = "gpu_replicas",
        value_parser = super::parse_modes
    )]
    gpu_sharing: String,

    /// The module's `work_dir`.
    #[command(flatten)]
    agent: super::AgentWorkDirArgs,

    /// The module's `pool_dir`.
    #[command(flatten)]
    pool: super::PoolArgs,

    /// The module's `volume_root`.
    #[command(flatten)]
    volume: super::VolumeRootArgs,

    /// The module library `--modules` loads.
    #[arg(long, value_name = "PATH", default_value = DEFAULT_MODULE_LIBRARY)]
    module_library: PathBuf,

    /// Write the module's modules.json to FILE and print `--modules=file://FILE`, instead of the
    /// JSON inline in `--modules`.
    #[arg(long, value_name = "FILE")]
    modules_file: Option<PathBuf>,

    /// One more module parameter, KEY=VALUE (repeatable), e.g. driver_volume=build,
    /// health_checks=all, numa_pinning=on (every key: ffi/README.md). The keys this command sets
    /// from its own options are refused, naming the option; the whole set is checked by the
    /// module's own parser, so a key or value the module would refuse fails the command.
    #[arg(long = "module-param", value_name = "KEY=VALUE", value_parser = parse_module_param)]
    module_params: Vec<(String, String)>,

    /// Also name the driver in --attributes (nvidia_driver, cuda_version). Off by default: both
    /// change with every driver upgrade, and Mesos refuses to recover an agent whose attributes
    /// changed, so the upgraded agent needs a new agent ID and abandons its executors (operator
    /// guide, "Driver upgrades").
    #[arg(long)]
    driver_attributes: bool,

    /// The rest of the agent's command line, after `--`: read as mesos-agent reads it (then its
    /// MESOS_* environment), and printed back after this command's flags, each flag once. Its
    /// --resources, --attributes, --isolation, --nvidia_gpu_devices and --work_dir stand for
    /// this command's options; its --modules keeps its libraries and gains the module; its
    /// --agent_subsystems is kept. A flag given twice is refused, as mesos-agent refuses it.
    #[arg(last = true, value_name = "AGENT_FLAG")]
    agent_flags: Vec<String>,
}

/// The module parameters this command sets, with the option that sets each.
const OWN_PARAMETERS: &[(&str, &str)] = &[
    ("work_dir", "--agent-work-dir"),
    ("pool_dir", "--pool-dir"),
    ("volume_root", "--volume-root"),
    ("nvidia_gpu_devices", "--nvidia-gpu-devices"),
    ("mig_strategy", "--mig-strategy"),
    ("gpu_replicas", "--gpu-replicas"),
    ("gpu_sharing", "--gpu-sharing"),
    ("nvml_lib", "--nvml-lib"),
    ("dev_root", "--dev-root"),
    ("proc_root", "--proc-root"),
];

/// Parses `--module-param KEY=VALUE`.
fn parse_module_param(text: &str) -> Result<(String, String), String> {
    let (key, value) = text
        .split_once('=')
        .filter(|(k, _)| !k.is_empty() && k.chars().all(|c| c.is_ascii_lowercase() || c == '_'))
        .ok_or_else(|| {
            format!("{text:?}: expected KEY=VALUE with a module parameter name, e.g. driver_volume=build")
        })?;
    if let Some((_, option)) = OWN_PARAMETERS.iter().find(|(k, _)| *k == key) {
        return Err(format!(
            "{key} is set from {option}; give that option instead of --module-param"
        ));
    }
    Ok((key.to_owned(), value.to_owned()))
}

pub(crate) fn run(args: &Args, ctx: &Ctx) -> anyhow::Result<ExitCode> {
    let mut out = std::io::stdout().lock();
    if ctx.list_simulations(&mut out)? {
        return Ok(ExitCode::SUCCESS);
    }
    let mut agent = AgentCommandLine::parse(&args.agent_flags, std::env::vars().collect())?;
    let values = AgentValues::read(args, &mut agent)?;
    let (isolation, module_version) = isolation(args, values.isolation.as_deref())?;
    // With the module the device list is this command's option (the module's parameter, never
    // an agent flag); with gpu/nvidia it is the agent's own --nvidia_gpu_devices.
    let devices_flag = match module_version {
        Some(_) => "--nvidia-gpu-devices",
        None => DEVICES_FLAG,
    };
    let flags = AgentGpuFlags::parse(
        &isolation,
        values.resources.as_deref(),
        values.devices.as_deref().map(str::trim),
        values.attributes.as_deref(),
        devices_flag,
    )?
    .with_driver_attributes(args.driver_attributes);
    check_module_flags(&flags, &isolation, module_version, &values)?;
    ctx.simulation()?;
    let empty = Inventory::default();
    let inventory = match ctx.inventory() {
        Ok(inventory) => inventory,
        Err(err) if flags.isolator() == GpuIsolator::None && ctx.global.nvml_lib.is_none() => {
            tracing::warn!("{err:#}; GPUs are not described (no GPU isolator in --isolation)");
            &empty
        }
        Err(err) => return Err(err),
    };
    let sharing = args
        .gpu_replicas
        .as_deref()
        .map(|spec| SharingSpec::parse(spec, args.gpu_sharing.parse()?))
        .transpose()?;
    let resolved = advertise(args, &flags, inventory, sharing.as_ref())?;
    let module = module_version.filter(|_| flags.isolator() == GpuIsolator::Module);
    let offer = Offer {
        resolved: &resolved,
        inventory,
        sharing: sharing.as_ref(),
    };
    let mut lines = flag_lines(args, ctx, &isolation, module, &flags, &offer, &values)?;
    values.give_back(&mut lines, &mut agent);
    let rest = agent.rest(&lines)?;
    if lines.is_empty() || (module.is_some() && inventory.gpus.is_empty()) {
        // Not a log line: the answer to the command, for whoever reads an empty stdout.
        eprintln!(
            "mesos-gpu: no {}flags to add: {}",
            if lines.is_empty() { "" } else { "GPU " },
            why_none(&isolation, &flags, inventory)
        );
    } else if resolved.gpus == 0.0 && flags.isolator() == GpuIsolator::None {
        tracing::info!(
            "no GPUs advertised: Mesos discovers GPUs only when --isolation contains gpu/nvidia"
        );
    }
    for flag in lines.iter().chain(&rest) {
        writeln!(out, "{}", shell_quote_flag(flag))?;
    }
    Ok(ExitCode::SUCCESS)
}

/// The agent's `--isolation` (the module's when none is given) and, when the module is (or will
/// be) in it, the cgroup version: it matters only then.
fn isolation(args: &Args, given: Option<&str>) -> anyhow::Result<(String, Option<CgroupVersion>)> {
    Ok(match given {
        None => {
            let version = cgroup_version(args.cgroups)?;
            (module_isolation(version), Some(version))
        }
        Some(iso) if iso.split(',').any(|t| t.trim() == MODULE_ISOLATOR) => {
            (iso.trim().to_owned(), Some(cgroup_version(args.cgroups)?))
        }
        Some(iso) => (iso.trim().to_owned(), None),
    })
}

/// With the module: refuses an `--isolation` it cannot work with, and the agent's own
/// `--nvidia_gpu_devices` on its command line (gpu/nvidia's flag).
fn check_module_flags(
    flags: &AgentGpuFlags,
    isolation: &str,
    module_version: Option<CgroupVersion>,
    values: &AgentValues,
) -> anyhow::Result<()> {
    if let (GpuIsolator::Module, Some(version)) = (flags.isolator(), module_version) {
        check_module_isolation(isolation, version)?;
    }
    if let (GpuIsolator::Module, Some((value, Source::CommandLine))) =
        (flags.isolator(), &values.caller_devices)
    {
        anyhow::bail!(
            "the agent's --nvidia_gpu_devices={value} belongs to Mesos's gpu/nvidia, which the \
             agent refuses without gpu/nvidia in --isolation: give the module's device list as \
             agent-flags --nvidia-gpu-devices {value} (AGENT_FLAGS_OPTS with agent.sh)"
        );
    }
    Ok(())
}

/// The agent flags to print: the module's (`module`: its cgroup version) with its parameters,
/// else the advertised GPUs' with what gpu/nvidia needs.
fn flag_lines(
    args: &Args,
    ctx: &Ctx,
    isolation: &str,
    module: Option<CgroupVersion>,
    flags: &AgentGpuFlags,
    offer: &Offer<'_>,
    values: &AgentValues,
) -> anyhow::Result<Vec<String>> {
    Ok(match module {
        Some(version) if !offer.inventory.gpus.is_empty() => module_lines(
            args,
            ctx,
            isolation,
            version,
            offer,
            &values.work_dir,
            values.caller_modules.as_ref(),
        )?,
        // The module would refuse to start: the same agent without it.
        Some(version) => {
            let mut lines = vec![format!(
                "--isolation={}",
                isolation_without_module(isolation, version)
            )];
            lines.extend(offer.resolved.flags());
            lines.extend(cgroup_agent_flags(version));
            lines
        }
        // Mesos's gpu/nvidia needs `cgroups/devices`, so on cgroup v2 the same
        // `--agent_subsystems=` as the module (before: the agent aborted at its first task).
        // Without GPUs gpu/nvidia does not start at all, and stderr says why.
        None if flags.isolator() == GpuIsolator::Builtin && !offer.inventory.gpus.is_empty() => {
            let mut lines = offer.resolved.flags();
            lines.extend(cgroup_agent_flags(cgroup_version(args.cgroups)?));
            lines
        }
        None => offer.resolved.flags(),
    })
}

/// The agent's values this command reads, each from this command's option or the agent's own
/// flag (its command line after `--`, then `MESOS_*`), and the agent's flags it merges.
struct AgentValues {
    resources: Option<String>,
    attributes: Option<String>,
    /// `--isolation`, when given either way.
    isolation: Option<String>,
    /// The device list, when given either way.
    devices: Option<String>,
    /// The module's `work_dir`.
    work_dir: PathBuf,
    caller_isolation: Option<(String, Source)>,
    caller_devices: Option<(String, Source)>,
    caller_modules: Option<(String, Source)>,
    caller_subsystems: Option<(String, Source)>,
}

impl AgentValues {
    /// Reads them, taking the merged flags out of `agent`; `file://` values are read.
    fn read(args: &Args, agent: &mut AgentCommandLine) -> anyhow::Result<AgentValues> {
        let mut merged = |option: &str, given: &Option<String>, flag: &str| {
            let caller = agent.take(flag);
            let value = one_value(option, given.as_deref(), flag, caller.clone())?
                .as_deref()
                .map(flag_value)
                .transpose()?;
            anyhow::Ok((value, caller))
        };
        let (resources, _) = merged("--resources", &args.resources, "resources")?;
        let (attributes, _) = merged("--attributes", &args.attributes, "attributes")?;
        let (isolation, caller_isolation) = merged("--isolation", &args.isolation, "isolation")?;
        let (devices, caller_devices) = merged(
            "--nvidia-gpu-devices",
            &args.nvidia_gpu_devices,
            "nvidia_gpu_devices",
        )?;
        Ok(AgentValues {
            resources,
            attributes,
            isolation,
            devices,
            work_dir: agent_work_dir(args, agent.peek("work_dir"))?,
            caller_isolation,
            caller_devices,
            caller_modules: agent.take("modules"),
            caller_subsystems: agent.take("agent_subsystems"),
        })
    }

    /// Puts back on `agent`'s command line what `lines` (this command's flags) print nothing
    /// for: the operator's `--agent_subsystems` (which also makes the agent's cgroups root) in
    /// place of ours, and an `--isolation` or `--modules` read but not printed.
    fn give_back(&self, lines: &mut Vec<String>, agent: &mut AgentCommandLine) {
        if let Some((value, source)) = &self.caller_subsystems {
            lines.retain(|l| !l.starts_with("--agent_subsystems="));
            if *source == Source::CommandLine {
                agent.put_back("agent_subsystems", value);
            }
        }
        for (flag, given) in [
            ("modules", &self.caller_modules),
            ("isolation", &self.caller_isolation),
        ] {
            if let Some((value, Source::CommandLine)) = given
                && !lines.iter().any(|l| l.starts_with(&format!("--{flag}=")))
            {
                agent.put_back(flag, value);
            }
        }
    }
}

/// The module's `work_dir`: the agent's `--work_dir` (its command line, then `MESOS_WORK_DIR`)
/// when there is one, which `--agent-work-dir` must then equal unless left at its default.
fn agent_work_dir(args: &Args, agent: Option<(String, Source)>) -> anyhow::Result<PathBuf> {
    let option = &args.agent.agent_work_dir;
    match agent {
        None => Ok(option.clone()),
        Some((dir, _))
            if option == Path::new(super::DEFAULT_AGENT_WORK_DIR) || *option == Path::new(&dir) =>
        {
            Ok(PathBuf::from(dir))
        }
        Some((dir, _)) => anyhow::bail!(
            "--agent-work-dir {} and the agent's --work_dir={dir} disagree: the module's work_dir \
             is the agent's --work_dir; give it once",
            option.display()
        ),
    }
}

/// The cgroup version `choice` stands for on this host (`auto`: as Mesos decides).
fn cgroup_version(choice: CgroupChoice) -> anyhow::Result<CgroupVersion> {
    Ok(match choice {
        CgroupChoice::V1 => CgroupVersion::V1,
        CgroupChoice::V2 => CgroupVersion::V2,
        CgroupChoice::Auto => CgroupLayout::detect()
            .context("cannot tell this host's cgroup version; give --cgroups v1 or v2")?
            .version(),
    })
}

/// The GPUs the agent advertises by Mesos's rules, MIG devices by strategy and shares by
/// replicas, with notes on stderr for what the agent must also be told.
fn advertise(
    args: &Args,
    flags: &AgentGpuFlags,
    inventory: &Inventory,
    sharing: Option<&SharingSpec>,
) -> anyhow::Result<AgentGpus> {
    let module = flags.isolator() == GpuIsolator::Module;
    let advertised = flags.advertise(inventory, args.mig_strategy, sharing)?;
    if !inventory.mig.is_empty() {
        let docker = match args.mig_strategy {
            MigStrategy::Mixed => {
                "Docker-containerizer tasks get MIG devices through the Docker hook when its \
                 docker_args line has --mig-strategy mixed"
            }
            MigStrategy::Single => {
                "with single, gpus counts MIG devices, more than Mesos's Docker containerizer \
                 can enumerate: run the agent with --containerizers=mesos, or use mixed"
            }
        };
        let module_note = if module {
            String::new()
        } else {
            format!(
                "give the module the same strategy (mig_strategy={}); ",
                args.mig_strategy
            )
        };
        eprintln!("mesos-gpu: note: this node has MIG devices; {module_note}{docker}");
    }
    if args.gpu_replicas.is_some() {
        // Only the module shares GPUs (advertising refuses gpu/nvidia): the module's
        // parameters already carry the spec.
        eprintln!(
            "mesos-gpu: note: start the agent with --containerizers=mesos: Mesos's Docker \
             containerizer cannot start with more gpus than the node has GPUs"
        );
    }
    Ok(advertised)
}

/// The module's flags: `--isolation`, the advertised `--resources` and `--attributes`, the
/// cgroup version's own flags, and `--modules` with the parameters that match them. The
/// advertised `--resources` pass the rule the module applies when the agent starts
/// ([`check_agent_resources`]).
fn module_lines(
    args: &Args,
    ctx: &Ctx,
    isolation: &str,
    version: CgroupVersion,
    offer: &Offer<'_>,
    work_dir: &Path,
    caller_modules: Option<&(String, Source)>,
) -> anyhow::Result<Vec<String>> {
    let Offer {
        resolved,
        inventory,
        sharing,
    } = *offer;
    let mut params = ModuleParameters::default();
    params.set("work_dir", path_text(work_dir)?);
    params.set("pool_dir", path_text(&args.pool.pool_dir)?);
    params.set("volume_root", path_text(&args.volume.volume_root)?);
    let devices = resolved.module_devices(inventory);
    let listed = devices.as_ref().and(resolved.devices.as_deref());
    check_agent_resources(
        Some(&resolved.resources),
        inventory,
        &ModuleGpus {
            devices: listed,
            strategy: args.mig_strategy,
            sharing,
        },
    )?;
    if let Some(devices) = devices {
        params.set("nvidia_gpu_devices", devices);
    }
    if !inventory.mig.is_empty() {
        params.set("mig_strategy", args.mig_strategy.to_string());
    }
    if let Some(spec) = &args.gpu_replicas {
        params.set("gpu_replicas", spec.trim());
        params.set("gpu_sharing", args.gpu_sharing.to_string());
    }
    // The module must read the same driver, device nodes and driver files as this command.
    let global = &ctx.global;
    for (key, given) in [
        ("nvml_lib", &global.nvml_lib),
        ("dev_root", &global.dev_root),
        ("proc_root", &global.proc_root),
    ] {
        if let Some(path) = given {
            params.set(key, path_text(path)?);
        }
    }
    for (key, value) in &args.module_params {
        params.set(key, value.as_str());
    }
    // The module's own parser, before anything is printed or written: a parameter it would
    // refuse must not reach the agent.
    ModuleConfig::parse(&params).context("the module would refuse its parameters")?;
    if let Some(sim) = ctx.simulation()? {
        eprintln!(
            "mesos-gpu: note: these flags describe the simulated node {}; the module on this \
             host reads this host's driver",
            sim.name()
        );
    }
    let mut json = params.modules_json(&path_text(&args.module_library)?);
    if let Some((value, _)) = caller_modules {
        json = merge_modules(value, json)?;
    }
    let modules = match &args.modules_file {
        Some(file) => {
            let file = std::path::absolute(file)
                .with_context(|| format!("--modules-file {}", file.display()))?;
            let mut text = serde_json::to_string_pretty(&json)?;
            text.push('\n');
            std::fs::write(&file, text)
                .with_context(|| format!("cannot write the modules file {}", file.display()))?;
            format!("file://{}", path_text(&file)?)
        }
        None => json.to_string(),
    };
    let mut lines = vec![format!("--isolation={isolation}")];
    lines.extend(resolved.flags());
    lines.extend(cgroup_agent_flags(version));
    lines.push(format!("--modules={modules}"));
    Ok(lines)
}

/// What the agent advertises, with the node and shares it comes from.
#[derive(Clone, Copy)]
struct Offer<'a> {
    resolved: &'a AgentGpus,
    inventory: &'a Inventory,
    sharing: Option<&'a SharingSpec>,
}

/// The agent's own `--modules` (inline JSON or `file://`) with the module's library added;
/// refused when it already loads the module (its parameters would be given twice).
fn merge_modules(caller: &str, ours: serde_json::Value) -> anyhow::Result<serde_json::Value> {
    let text = flag_value(caller)?;
    let mut doc: serde_json::Value = serde_json::from_str(&text).with_context(|| {
        format!("the agent's --modules={caller} is not a modules JSON document")
    })?;
    let libraries = doc
        .get_mut("libraries")
        .and_then(serde_json::Value::as_array_mut)
        .with_context(|| format!("the agent's --modules={caller} has no \"libraries\" array"))?;
    let loads_ours = libraries.iter().any(|library| {
        library["modules"]
            .as_array()
            .is_some_and(|m| m.iter().any(|m| m["name"] == MODULE_ISOLATOR))
    });
    if loads_ours {
        anyhow::bail!(
            "the agent's --modules={caller} already loads {MODULE_ISOLATOR}: agent-flags writes \
             the module and its parameters itself; remove it from that document (module \
             parameters go to agent-flags as --module-param KEY=VALUE)"
        );
    }
    if let Some(ours) = ours["libraries"].as_array() {
        libraries.extend(ours.iter().cloned());
    }
    Ok(doc)
}

/// A path as the text a flag or JSON carries.
fn path_text(path: &Path) -> anyhow::Result<String> {
    path.to_str().map(str::to_owned).with_context(|| {
        format!(
            "{}: a path given to the agent must be UTF-8",
            path.display()
        )
    })
}

/// Why no flag is printed: no GPU isolator, or no GPU to advertise.
fn why_none(isolation: &str, flags: &AgentGpuFlags, inventory: &Inventory) -> String {
    if flags.isolator() == GpuIsolator::None {
        return format!(
            "--isolation={isolation} contains neither {MODULE_ISOLATOR} nor gpu/nvidia, so \
             mesos-agent neither discovers nor isolates GPUs; leave --isolation out for the \
             module's flags"
        );
    }
    let module = match (flags.isolator(), &inventory.driver) {
        (GpuIsolator::Module, None) => {
            " (the module refuses to start without an NVIDIA driver: start this agent without \
             it, with the flags printed)"
        }
        (GpuIsolator::Module, Some(_)) => {
            " (start this agent without the module, with the flags printed)"
        }
        _ => "",
    };
    match &inventory.absent_reason {
        Some(reason) => format!("no GPUs: {reason}{module}"),
        None => format!("NVML reports no usable GPU{module}"),
    }
}

/// The flag's value, read from the file for `file://` values as mesos-agent does.
pub(crate) fn flag_value(value: &str) -> anyhow::Result<String> {
    match value.strip_prefix("file://") {
        Some(path) => std::fs::read_to_string(path)
            .map(|s| s.trim().to_owned())
            .with_context(|| format!("cannot read flag value from {path}")),
        None => Ok(value.to_owned()),
    }
}

/// `--name=value` with the value single-quoted when a shell would otherwise split or expand it
/// (any other word quoted whole).
fn shell_quote_flag(flag: &str) -> String {
    let plain = |text: &str| {
        !text.is_empty()
            && text.chars().all(|c| {
                c.is_ascii_alphanumeric()
                    || matches!(c, '_' | '-' | '.' | '/' | ':' | ',' | '+' | '@' | '%')
            })
    };
    let quoted = |text: &str| format!("'{}'", text.replace('\'', r"'\''"));
    match flag.split_once('=') {
        Some((name, value)) if plain(name) => {
            if plain(value) {
                format!("{name}={value}")
            } else {
                format!("{name}={}", quoted(value))
            }
        }
        _ if plain(flag) => flag.to_owned(),
        _ => quoted(flag),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting() {
        assert_eq!(
            shell_quote_flag("--nvidia_gpu_devices=0,1"),
            "--nvidia_gpu_devices=0,1"
        );
        assert_eq!(
            shell_quote_flag("--resources=cpus:1;gpus:2"),
            "--resources='cpus:1;gpus:2'"
        );
        assert_eq!(
            shell_quote_flag("--attributes=a:it's"),
            r"--attributes='a:it'\''s'"
        );
        assert_eq!(
            shell_quote_flag("--resources=gpus(ml):1"),
            "--resources='gpus(ml):1'"
        );
    }

    #[test]
    fn file_values() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("resources");
        std::fs::write(&file, "cpus:4;gpus:0\n").expect("write");
        assert_eq!(
            flag_value(&format!("file://{}", file.display())).expect("read"),
            "cpus:4;gpus:0"
        );
        assert!(flag_value("file:///nonexistent/x").is_err());
        assert_eq!(flag_value("gpus:1").expect("plain"), "gpus:1");
    }
}
