//! `mesos-gpu agent-flags`: the mesos-agent `--resources`, `--attributes` and
//! `--nvidia_gpu_devices` that advertise this node's GPUs, checked by Mesos's rules
//! (`mesos_gpu_isolator::agent_flags`). One flag per line, shell-quoted, ready to paste.
//!
//! NVML is read only when `--isolation` contains `gpu/nvidia` or GPUs are advertised (for the
//! attributes); without the isolator a broken driver is only a warning, as Mesos never loads
//! NVML then, but a `--nvml-lib` that cannot be loaded is always an error. When there is no flag
//! to print, stderr says why (and the exit status is 0).

use std::io::Write as _;
use std::process::ExitCode;

use anyhow::Context as _;
use mesos_gpu_isolator::agent_flags::{AgentGpuFlags, DEFAULT_ISOLATION, MigStrategy};
use mesos_gpu_isolator::inventory::Inventory;
use mesos_gpu_isolator::sharing::{self, SharingSpec};

use crate::ctx::Ctx;
use crate::simulate;

#[derive(clap::Args)]
#[command(after_help = "Examples:\n  \
    mesos-gpu agent-flags --isolation cgroups/devices,gpu/nvidia --resources 'cpus:32'\n  \
    mesos-gpu agent-flags --isolation gpu/nvidia --resources gpus:2 --nvidia-gpu-devices 0,1\n  \
    mesos-gpu agent-flags --simulate dgx1-v100 --isolation gpu/nvidia\n  \
    mesos-gpu agent-flags --simulate dgx-a100-mixed --mig-strategy mixed \\\n      \
      --isolation filesystem/linux,cgroups/devices,org_apache_mesos_gpu_MesosGpuIsolator\n  \
    mesos-gpu agent-flags --simulate dgx1-v100 --isolation gpu/nvidia --gpu-replicas 4,6=1,7=1 --gpu-sharing mps\n  \
    mesos-gpu agent-flags --simulate dgx1-v100 --isolation gpu/nvidia --gpu-replicas 4 --gpu-sharing mps,4-5=time-slicing,6-7=none\n\n\
    With --gpu-replicas, each shared GPU is advertised as R `gpus` units (a task's gpus:k is a k/R share of one GPU)\n\
    and the split is written in the attributes gpu_sharing, gpu_shared, gpu_whole and gpu_replicas.\n\n\
    Values may also be given as file:///path, as mesos-agent accepts them.")]
pub(crate) struct Args {
    /// The agent's --isolation (comma-separated); GPUs are discovered only with gpu/nvidia.
    #[arg(long, value_name = "LIST", default_value = DEFAULT_ISOLATION)]
    isolation: String,

    /// The agent's --resources, text (`cpus:8;gpus(ml):2`) or JSON array form.
    #[arg(long, value_name = "RESOURCES")]
    resources: Option<String>,

    /// The agent's --nvidia_gpu_devices: NVML indices, comma-separated (e.g. 0,1,2).
    #[arg(long, value_name = "LIST")]
    nvidia_gpu_devices: Option<String>,

    /// On a node with GPUs in MIG mode: `single` offers every MIG device as one `gpus` unit,
    /// `mixed` keeps `gpus` for whole GPUs and offers each MIG profile as its own scalar
    /// (`mig-1g.5gb`). Ignored on a node without MIG. Give the module the same strategy
    /// (parameter `mig_strategy`).
    #[arg(long, value_name = "single|mixed", default_value = "single")]
    mig_strategy: MigStrategy,

    /// The agent's own --attributes, kept ahead of the GPU attributes (`rack:r1;zone:a`).
    #[arg(long, value_name = "ATTRIBUTES")]
    attributes: Option<String>,

    /// Share GPUs: `R` shares every advertised GPU R ways (1-48); `SEL=R` (SEL an NVML index or
    /// UUID) sets one GPU; R=1 keeps a GPU whole. E.g. `4`, `4,3=1`, `0=2,1=2`. Give the module
    /// the same spec (parameter `gpu_replicas`); only with `--containerizers=mesos`: Mesos's
    /// Docker containerizer cannot start with more `gpus` than the node has GPUs.
    #[arg(long, value_name = "SPEC")]
    gpu_replicas: Option<String>,

    /// How each GPU's shares are enforced: a MODE for every GPU and SEL=MODE entries (SEL an
    /// index, a range such as 4-5, or a UUID); MODE is time-slicing (accounting only, no
    /// isolation), mps, or none (kept whole). E.g. `mps,4-5=time-slicing,6-7=none`. Give the
    /// module the same spec (parameter `gpu_sharing`).
    #[arg(
        long,
        value_name = "SPEC",
        default_value = "time-slicing",
        requires = "gpu_replicas",
        value_parser = super::parse_modes
    )]
    gpu_sharing: String,
}

pub(crate) fn run(args: &Args, ctx: &Ctx) -> anyhow::Result<ExitCode> {
    let mut out = std::io::stdout().lock();
    if ctx.wants_simulate_list() {
        for name in simulate::shipped_names() {
            writeln!(out, "{name}")?;
        }
        return Ok(ExitCode::SUCCESS);
    }
    let resources = args.resources.as_deref().map(flag_value).transpose()?;
    let devices = args
        .nvidia_gpu_devices
        .as_deref()
        .map(flag_value)
        .transpose()?;
    let attributes = args.attributes.as_deref().map(flag_value).transpose()?;
    let flags = AgentGpuFlags::parse(
        args.isolation.trim(),
        resources.as_deref(),
        devices.as_deref().map(str::trim),
        attributes.as_deref(),
    )?;
    ctx.simulation()?;
    let empty = Inventory::default();
    let inventory = match ctx.inventory() {
        Ok(inventory) => inventory,
        Err(err) if !flags.gpu_isolator() && ctx.global.nvml_lib.is_none() => {
            tracing::warn!("{err:#}; GPUs are not described (gpu/nvidia is not in --isolation)");
            &empty
        }
        Err(err) => return Err(err),
    };
    let resolved = if inventory.mig.is_empty() {
        flags.resolve(inventory)?
    } else {
        let resolved = flags.resolve_mig(inventory, args.mig_strategy)?;
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
        eprintln!(
            "mesos-gpu: note: this node has MIG devices; give the module the same strategy \
             (mig_strategy={}); {docker}",
            args.mig_strategy
        );
        resolved
    };
    let resolved = match &args.gpu_replicas {
        Some(spec) if !inventory.mig.is_empty() => anyhow::bail!(
            "--gpu-replicas {spec}: sharing GPUs of a node with MIG devices is not supported; \
             give MIG devices whole or turn MIG mode off"
        ),
        Some(spec) => {
            let spec = SharingSpec::parse(spec, args.gpu_sharing.parse()?)?;
            let shared = sharing::offer::advertise(&resolved, inventory, &spec)?.0;
            eprintln!(
                "mesos-gpu: note: give the module the same parameters (gpu_replicas={}, \
                 gpu_sharing={}), and start the agent with --containerizers=mesos: Mesos's Docker \
                 containerizer cannot start with more gpus than the node has GPUs",
                args.gpu_replicas.as_deref().unwrap_or_default(),
                args.gpu_sharing
            );
            shared
        }
        None => resolved,
    };
    let lines = resolved.flags();
    if lines.is_empty() {
        // Not a log line: the answer to the command, for whoever reads an empty stdout.
        eprintln!(
            "mesos-gpu: no flags to add: {}",
            why_none(args, &flags, inventory)
        );
    } else if resolved.gpus == 0.0 && !flags.gpu_isolator() {
        tracing::info!(
            "no GPUs advertised: Mesos discovers GPUs only when --isolation contains gpu/nvidia"
        );
    }
    for flag in lines {
        writeln!(out, "{}", shell_quote_flag(&flag))?;
    }
    Ok(ExitCode::SUCCESS)
}

/// Why no flag is printed: no GPU isolator, or no GPU to advertise.
fn why_none(args: &Args, flags: &AgentGpuFlags, inventory: &Inventory) -> String {
    if !flags.gpu_isolator() {
        return format!(
            "--isolation={} does not contain gpu/nvidia, so mesos-agent neither discovers nor \
             isolates GPUs; give the agent's own --isolation, e.g. --isolation \
             filesystem/linux,cgroups/devices,gpu/nvidia",
            args.isolation.trim()
        );
    }
    match &inventory.absent_reason {
        Some(reason) => format!("no GPUs: {reason}"),
        None => "NVML reports no usable GPU".to_owned(),
    }
}

/// The flag's value, read from the file for `file://` values as mesos-agent does.
fn flag_value(value: &str) -> anyhow::Result<String> {
    match value.strip_prefix("file://") {
        Some(path) => std::fs::read_to_string(path)
            .map(|s| s.trim().to_owned())
            .with_context(|| format!("cannot read flag value from {path}")),
        None => Ok(value.to_owned()),
    }
}

/// `--name=value` with the value single-quoted when a shell would otherwise split or expand it.
fn shell_quote_flag(flag: &str) -> String {
    let Some((name, value)) = flag.split_once('=') else {
        return flag.to_owned();
    };
    let plain = !value.is_empty()
        && value.chars().all(|c| {
            c.is_ascii_alphanumeric()
                || matches!(c, '_' | '-' | '.' | '/' | ':' | ',' | '+' | '@' | '%')
        });
    if plain {
        format!("{name}={value}")
    } else {
        format!("{name}='{}'", value.replace('\'', r"'\''"))
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
