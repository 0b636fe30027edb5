//! `mesos-gpu cdi generate`: the node's GPUs as a CDI spec (kind `nvidia.com/gpu`) for Podman,
//! containerd, CRI-O and Docker ≥ 25, written atomically to `/var/run/cdi/nvidia.com-gpu.json`
//! (`--output`), or printed (`--output -`, the default on a simulated node). What the spec holds is in
//! [`mesos_gpu_docker::cdi::node`]; `serve` keeps the same file current.
//!
//! Device numbers are read from the nodes under the device root (`--dev-root`, default `/dev`),
//! or computed on a simulated node without `--dev-root`; the output says which. With no GPU the
//! file is removed (exit 0, the reason printed); `--output -` then fails, as there is nothing to
//! print. Another spec in the same directory declaring the same devices is refused (exit 1): a
//! runtime would drop the devices from both.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context as _;
use mesos_gpu_docker::cdi::{
    DEFAULT_SPEC_DIRS, DEFAULT_SPEC_PATH, DeviceNumbers, Gathered, KIND, NodeDevices, NodeSync,
    Outcome, SpecFile, sync_node,
};
use mesos_gpu_volume::VolumeManager;

use crate::ctx::Ctx;

#[derive(clap::Args)]
#[command(after_help = "Examples:\n  \
    mesos-gpu cdi generate\n  \
    mesos-gpu cdi generate --simulate dgx1-v100")]
pub(crate) struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(clap::Subcommand)]
enum Command {
    /// Write the node's CDI spec: every GPU (each MIG device of a GPU in MIG mode) by index and
    /// UUID, and `all`.
    Generate(GenerateArgs),
}

#[derive(clap::Args)]
#[command(after_help = "Examples:\n  \
    mesos-gpu cdi generate\n  \
    mesos-gpu cdi generate --output - | jq '.devices[].name'\n  \
    mesos-gpu cdi generate --simulate dgx1-v100 --output \\\n      \
    /tmp/cdi/nvidia.com-gpu.json --json\n  \
    podman run --device nvidia.com/gpu=0 IMAGE nvidia-smi\n  \
    # Docker >= 25 with features.cdi\n  \
    docker run --device nvidia.com/gpu=all IMAGE")]
pub(crate) struct GenerateArgs {
    /// Where to write the spec (atomically); `-` prints it on stdout instead
    /// [default: /var/run/cdi/nvidia.com-gpu.json; with --simulate, `-`: a simulated node's spec
    /// goes into a CDI directory only when named].
    #[arg(long, value_name = "FILE")]
    output: Option<PathBuf>,

    /// The CDI directories runtimes read, lowest priority first: a spec there declaring the
    /// same devices at the output's priority is refused, one elsewhere is reported.
    #[arg(long, value_name = "DIRS", value_delimiter = ',', default_values = DEFAULT_SPEC_DIRS)]
    spec_dirs: Vec<PathBuf>,

    #[command(flatten)]
    volume: super::VolumeRootArgs,

    /// Print what was done as JSON instead of text.
    #[arg(long)]
    json: bool,
}

pub(crate) fn run(args: &Args, ctx: &Ctx) -> anyhow::Result<ExitCode> {
    match &args.command {
        Command::Generate(args) => generate(args, ctx),
    }
}

/// How the spec's device numbers are found: the nodes under the device root, or computed on a
/// simulated node that has none.
pub(crate) fn device_numbers(ctx: &Ctx) -> DeviceNumbers {
    match ctx.dev_root() {
        Some(root) => DeviceNumbers::Scanned {
            dev_root: root.to_owned(),
        },
        None => DeviceNumbers::Computed,
    }
}

/// The spec file: `given`, else the default on a real node; `None` on a simulated node, whose
/// spec is never written into the host's CDI directory unless named.
pub(crate) fn spec_path<'a>(given: Option<&'a Path>, ctx: &Ctx) -> Option<&'a Path> {
    match given {
        Some(path) => Some(path),
        None if ctx.global.simulate.is_some() => None,
        None => Some(Path::new(DEFAULT_SPEC_PATH)),
    }
}

fn generate(args: &GenerateArgs, ctx: &Ctx) -> anyhow::Result<ExitCode> {
    let inventory = ctx.inventory()?;
    let numbers = device_numbers(ctx);
    let volumes = VolumeManager::at(&args.volume.volume_root);
    let mut out = std::io::stdout().lock();
    let output = spec_path(args.output.as_deref(), ctx).unwrap_or(Path::new("-"));
    if output == Path::new("-") {
        let devices = match NodeDevices::gather(inventory, &numbers, &volumes)? {
            Gathered::Devices(devices) => devices,
            Gathered::NoGpus { reason } => {
                anyhow::bail!("no CDI spec for this node: it has no GPU to declare ({reason})")
            }
        };
        warn_missing_volume(&devices.driver_volume);
        if numbers == DeviceNumbers::Computed {
            eprintln!(
                "mesos-gpu cdi: device numbers {numbers}: --dev-root DIR reads them from nodes"
            );
        }
        let spec = devices.spec()?;
        note_left_out(&numbers);
        out.write_all(&spec.to_json())?;
        return Ok(ExitCode::SUCCESS);
    }
    let file = SpecFile::new(output, args.spec_dirs.clone());
    let sync = sync_node(inventory, &numbers, &volumes, &file)
        .with_context(|| format!("cannot keep {} current", output.display()))?;
    if let Some(spec) = &sync.spec {
        warn_missing_volume(&spec.driver_volume);
        note_left_out(&numbers);
    }
    if args.json {
        serde_json::to_writer_pretty(&mut out, &sync)?;
        writeln!(out)?;
    } else {
        write_text(&mut out, &sync)?;
    }
    Ok(ExitCode::SUCCESS)
}

/// One line on stderr per node the host may have that the spec leaves out (`nvidia-uvm-tools`
/// from computed numbers), naming the option that includes it (issue 37: it was dropped
/// silently).
fn note_left_out(numbers: &DeviceNumbers) {
    for node in numbers.left_out() {
        eprintln!(
            "mesos-gpu: note: {} is left out of the spec (its number is not computed); \
             --dev-root /dev reads the nodes and includes it where the host has it",
            node.display()
        );
    }
}

fn warn_missing_volume(volume: &Path) {
    if !volume.is_dir() {
        tracing::warn!(
            volume = %volume.display(),
            "the driver volume does not exist yet: containers given these devices fail to start \
             until `mesos-gpu volume create` (or `mesos-gpu serve`) builds it"
        );
    }
}

fn write_text(out: &mut impl std::io::Write, sync: &NodeSync) -> std::io::Result<()> {
    let path = sync.report.path.display();
    let what = match sync.report.outcome {
        Outcome::Written => "written",
        Outcome::Unchanged => "unchanged",
        Outcome::Removed => "removed",
        Outcome::Absent => "not written",
    };
    writeln!(out, "{path}: {what}")?;
    if let Some(reason) = &sync.no_gpus {
        writeln!(out, "no GPUs:        {reason}")?;
    }
    if let Some(spec) = &sync.spec {
        writeln!(out, "cdiVersion:     {}", spec.cdi_version)?;
        let (by_index, by_name): (Vec<&str>, Vec<&str>) = spec
            .devices
            .iter()
            .map(String::as_str)
            .partition(|n| n.starts_with(|c: char| c.is_ascii_digit()));
        let uuids = by_name.iter().filter(|n| n.contains('-')).count();
        writeln!(
            out,
            "devices:        {} as {KIND}=<name>: {} by index, {uuids} by UUID, all",
            spec.devices.len(),
            by_index.join(","),
        )?;
        writeln!(out, "device numbers: {}", spec.device_numbers)?;
        writeln!(
            out,
            "driver volume:  {} -> /usr/local/nvidia (read-only)",
            spec.driver_volume.display()
        )?;
        if !spec.left_out.is_empty() {
            writeln!(out, "left out:       unhealthy GPUs {:?}", spec.left_out)?;
        }
    }
    for o in &sync.report.overlaps {
        let winner = if o.ours_wins { "ours" } else { "theirs" };
        writeln!(
            out,
            "also declared:  {} by {} (different directory; {winner} has the higher priority)",
            o.names.join(","),
            o.path.display()
        )?;
    }
    for (p, why) in &sync.report.unreadable {
        writeln!(out, "unreadable:     {} ({why})", p.display())?;
    }
    Ok(())
}
