//! `mesos-gpu volume`: plan, create, verify, list and collect `nvidia_<driver version>` driver
//! volumes, and record which containers use them.
//!
//! The driver version is `--driver-version`, else the version of the newest
//! `libnvidia-ml.so.<version>` the cache points to (logged on stderr). `--json` prints the
//! library's types as JSON: `VolumePlan`, `Volume`, `VerifyReport`, a list of `VolumeInfo`, or a
//! `GcReport`. `verify` exits 1 when it finds a problem.
//!
//! Programs are searched along this process's `PATH` inside the driver root, then in the
//! driver's own `bin` next to its libraries (`plan.rs`). Under `--simulate` the driver root is
//! the simulated node's driver tree unless `--driver-root` names one.

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use mesos_gpu_os::{ErrorChain, MountTable};
use mesos_gpu_volume::mountinfo;
use mesos_gpu_volume::plan::{self, DriverSource, VolumePlan};
use mesos_gpu_volume::volume::{
    DEFAULT_ROOT, GcReport, KeepReason, Outcome, VerifyReport, VolumeInfo,
};
use mesos_gpu_volume::{
    Check, CreateOptions, DriverVersion, LdCache, Materialize, Volume, VolumeManager,
};
use serde::Serialize;

use crate::ctx::Ctx;

#[derive(clap::Args)]
#[command(after_help = "Examples:\n  \
    mesos-gpu volume plan\n  \
    mesos-gpu volume create --driver-version 550.54.14\n  \
    mesos-gpu volume verify --json\n  \
    mesos-gpu volume list\n  \
    mesos-gpu volume gc\n  \
    mesos-gpu volume create --volume-root /var/lib/mesos-gpu/volumes\n  \
    mesos-gpu volume create --volume-root /tmp/volumes --driver-root \\\n      \
    /mnt/image --copy\n  \
    mesos-gpu --simulate dgx1-v100 volume create --volume-root /tmp/volumes")]
pub(crate) struct Args {
    #[command(subcommand)]
    command: Command,

    /// Directory holding the `nvidia_<driver version>` volumes (the module's `volume_root`,
    /// `serve`'s and `docker-args`' --volume-root); under --simulate, the node's scratch directory
    /// unless given [default: /var/run/mesos/isolators/gpu].
    #[arg(long, global = true, value_name = "DIR")]
    volume_root: Option<PathBuf>,

    /// The old name of --volume-root (deprecated).
    #[arg(long = "root", global = true, value_name = "DIR", hide = true)]
    legacy_root: Option<PathBuf>,

    /// The driver's file system root; with --simulate and none given, the simulated node's
    /// driver tree [default: /].
    #[arg(long, global = true, value_name = "DIR")]
    driver_root: Option<PathBuf>,

    /// The ld.so.cache to search [default: <driver-root>/etc/ld.so.cache].
    #[arg(long, global = true, value_name = "FILE")]
    cache: Option<PathBuf>,

    /// The driver version [default: from the newest libnvidia-ml.so.<version> in the cache].
    #[arg(long, global = true, value_name = "VER")]
    driver_version: Option<DriverVersion>,

    /// Print JSON instead of text.
    #[arg(long, global = true)]
    json: bool,
}

impl Args {
    /// `--volume-root`, else the deprecated `--root` (with a warning), else the default
    /// ([`Ctx::state_default`]).
    fn root(&self, ctx: &Ctx) -> anyhow::Result<PathBuf> {
        match (&self.volume_root, &self.legacy_root) {
            (Some(_), Some(old)) => anyhow::bail!(
                "--root {} and --volume-root both given: --root is the old name of --volume-root; \
                 keep only --volume-root",
                old.display()
            ),
            (Some(root), None) => Ok(root.clone()),
            (None, Some(old)) => {
                tracing::warn!(
                    "--root is deprecated: write --volume-root {}, as the other commands name it",
                    old.display()
                );
                Ok(old.clone())
            }
            (None, None) => Ok(ctx.state_default("volumes", DEFAULT_ROOT)),
        }
    }
}

#[derive(clap::Subcommand)]
enum Command {
    /// Show which driver files the volume would hold, and every candidate skipped and why.
    #[command(after_help = "Examples:\n  \
            mesos-gpu volume plan\n  \
            mesos-gpu volume plan --json\n  \
            mesos-gpu volume plan --driver-root /mnt/image --cache \\\n      \
            /mnt/image/etc/ld.so.cache")]
    Plan,
    /// Build the volume, or reuse an intact one; rebuild a stale or damaged one.
    #[command(after_help = "Examples:\n  \
        mesos-gpu volume create\n  \
        mesos-gpu volume create --volume-root /var/lib/mesos-gpu/volumes \\\n      \
        --checksums\n  \
        mesos-gpu volume create --volume-root /tmp/volumes --driver-root \\\n      \
        /mnt/image --copy")]
    Create {
        /// Copy every file instead of hard-linking those on the volume root's file system.
        #[arg(long)]
        copy: bool,
        /// Compare SHA-256 sums, not only sizes and mtimes, before reusing an existing volume.
        #[arg(long)]
        checksums: bool,
    },
    /// Check a volume against its manifest and the host's driver files; exit 1 on a problem.
    #[command(after_help = "Examples:\n  mesos-gpu volume verify\n  \
        mesos-gpu volume verify --json --metadata-only\n  \
        mesos-gpu volume verify --volume-only --driver-version 550.54.14")]
    Verify {
        /// Compare sizes, modes and mtimes only, without reading file contents.
        #[arg(long)]
        metadata_only: bool,
        /// Check the volume against its manifest only, not against the host's files.
        #[arg(long)]
        volume_only: bool,
    },
    /// List the volumes under the root with their holders and state.
    #[command(after_help = "Examples:\n  mesos-gpu volume list\n  \
        mesos-gpu volume list --json --volume-root /var/lib/mesos-gpu/volumes")]
    List,
    /// Remove volumes no container uses, except the current driver's (unless --all).
    #[command(after_help = "Examples:\n  mesos-gpu volume gc\n  mesos-gpu volume gc --all --json")]
    Gc {
        /// Do not keep the current driver's volume either.
        #[arg(long)]
        all: bool,
    },
    /// Record HOLDER (a container id) as using the volume.
    #[command(after_help = "Example:\n  \
        mesos-gpu volume acquire 3d8a52b4-1c5e-4f5a-9c1e-2b7d9a0e6f11 \\\n      \
        --driver-version 550.54.14")]
    Acquire {
        /// The container id.
        #[arg(value_parser = parse_holder)]
        holder: String,
    },
    /// Remove HOLDER's use of the volume.
    #[command(after_help = "Example:\n  \
        mesos-gpu volume release 3d8a52b4-1c5e-4f5a-9c1e-2b7d9a0e6f11 \\\n      \
        --driver-version 550.54.14")]
    Release {
        /// The container id.
        #[arg(value_parser = parse_holder)]
        holder: String,
    },
}

pub(crate) fn run(args: &Args, ctx: &Ctx) -> anyhow::Result<ExitCode> {
    let root = args.root(ctx)?;
    let manager = VolumeManager::at(&root);
    let driver = driver_source(ctx, args.driver_root.as_deref())?;
    let args = &Located { args, driver };
    match &args.command {
        Command::Plan => {
            let plan = host_plan(args)?;
            emit(args, &plan, plan_text)
        }
        Command::Create { copy, checksums } => create(args, &manager, &root, *copy, *checksums),
        Command::Verify {
            metadata_only,
            volume_only,
        } => verify(args, &manager, *metadata_only, *volume_only),
        Command::List => emit(args, &manager.list()?, |vs| list_text(vs)),
        Command::Gc { all } => {
            let keep = if *all {
                Vec::new()
            } else {
                let cache =
                    load_cache(args).context("pass --all to collect every unused volume")?;
                vec![
                    version_of(args, &cache)
                        .context("pass --all to collect every unused volume")?,
                ]
            };
            emit(args, &manager.gc(&keep)?, gc_text)
        }
        Command::Acquire { holder } => {
            let version = version_of(args, &load_cache(args)?)?;
            manager.acquire(&version, holder)?;
            emit(
                args,
                &serde_json::json!({"holder": holder, "driver_version": version}),
                |_| format!("{holder} now holds the volume of driver {version}\n"),
            )
        }
        Command::Release { holder } => {
            let version = version_of(args, &load_cache(args)?)?;
            let held = manager.release(&version, holder)?;
            emit(
                args,
                &serde_json::json!({"holder": holder, "driver_version": version, "released": held}),
                |_| {
                    if held {
                        format!("{holder} released the volume of driver {version}\n")
                    } else {
                        format!("{holder} did not hold the volume of driver {version}\n")
                    }
                },
            )
        }
    }
}

/// `volume create`: builds (or reuses) the volume of the host's driver under `root`.
fn create(
    args: &Located<'_>,
    manager: &VolumeManager,
    root: &std::path::Path,
    copy: bool,
    checksums: bool,
) -> anyhow::Result<ExitCode> {
    let plan = host_plan(args)?;
    let options = CreateOptions {
        materialize: if copy {
            Materialize::Copy
        } else {
            Materialize::LinkOrCopy
        },
        check: if checksums {
            Check::Checksums
        } else {
            Check::Metadata
        },
    };
    let volume = manager
        .create_with(&plan, options)
        .with_context(|| format!("cannot create the volume under {}", root.display()))?;
    warn_if_noexec(&volume.path);
    emit(args, &volume, created_text)
}

/// `create`'s text: what was done, the volume's counts, and what a rebuilt volume had wrong.
fn created_text(v: &Volume) -> String {
    let mut s = match &v.outcome {
        Outcome::Created => "created".to_owned(),
        Outcome::Reused => "reused".to_owned(),
        Outcome::Rebuilt { problems } => {
            format!("rebuilt ({} problems)", problems.len())
        }
    };
    let _ = writeln!(
        s,
        " {}: {} files ({} hard links, {} copies), {} links, {}",
        v.path.display(),
        v.files,
        v.hardlinked,
        v.copied,
        v.links,
        size(v.bytes)
    );
    if let Outcome::Rebuilt { problems } = &v.outcome {
        for p in problems {
            let _ = writeln!(s, "  was: {p}");
        }
    }
    s
}

/// `volume verify`: checks the volume against its manifest (and the host's driver unless
/// `volume_only`); exits 1 when it is damaged.
fn verify(
    args: &Located<'_>,
    manager: &VolumeManager,
    metadata_only: bool,
    volume_only: bool,
) -> anyhow::Result<ExitCode> {
    let check = if metadata_only {
        Check::Metadata
    } else {
        Check::Checksums
    };
    let (version, plan) = if volume_only {
        (version_of(args, &load_cache(args)?)?, None)
    } else {
        let plan = host_plan(args)?;
        (plan.driver_version.clone(), Some(plan))
    };
    let report = manager.verify(&version, plan.as_ref(), check)?;
    emit(args, &report, verify_text)?;
    Ok(if report.is_intact() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// `verify`'s text: intact with the depth and scope of the check, or damaged with each problem.
fn verify_text(r: &VerifyReport) -> String {
    let scope = if r.against_host {
        "against its manifest and the host"
    } else {
        "against its manifest"
    };
    if r.is_intact() {
        let depth = match r.check {
            Check::Metadata => "metadata",
            Check::Checksums => "checksum",
        };
        return format!("intact: {} ({depth} check {scope})\n", r.path.display());
    }
    let mut s = format!(
        "damaged: {} ({} problems, {scope})\n",
        r.path.display(),
        r.problems.len()
    );
    for p in &r.problems {
        let _ = writeln!(s, "  {p}");
    }
    s
}

/// `list`'s text: a table of the volumes, their state and holders.
fn list_text(vs: &[VolumeInfo]) -> String {
    let rows: Vec<Vec<String>> = vs
        .iter()
        .map(|v| {
            let state = if v.problems.is_empty() {
                "intact".to_owned()
            } else {
                format!("{} problems", v.problems.len())
            };
            vec![
                v.driver_version.to_string(),
                v.path.display().to_string(),
                v.files.to_string(),
                size(v.bytes),
                state,
                v.holders.join(","),
            ]
        })
        .collect();
    table(
        &["VERSION", "PATH", "FILES", "SIZE", "STATE", "HOLDERS"],
        &rows,
    )
}

/// `gc`'s text: the volumes removed, and those kept with why.
fn gc_text(r: &GcReport) -> String {
    let mut s = String::new();
    for path in &r.removed {
        let _ = writeln!(s, "removed {}", path.display());
    }
    for kept in &r.kept {
        let why = match &kept.reason {
            KeepReason::Requested => "current driver".to_owned(),
            KeepReason::InUse { holders } => {
                format!("in use by {}", holders.join(", "))
            }
        };
        let _ = writeln!(s, "kept {} ({why})", kept.path.display());
    }
    if s.is_empty() {
        s.push_str("no volumes\n");
    }
    s
}

/// A holder (container id) of the right form, checked by clap: a wrong one is a usage error.
fn parse_holder(value: &str) -> Result<String, String> {
    mesos_gpu_volume::volume::check_holder(value)
        .map(|()| value.to_owned())
        .map_err(|e| e.to_string())
}

/// Warns when the volume sits on a `noexec` mount, where containers cannot run its binaries.
fn warn_if_noexec(volume: &std::path::Path) {
    let table = match MountTable::read(std::path::Path::new("/proc/self/mountinfo")) {
        Ok(table) => table,
        Err(e) => {
            tracing::debug!(error = %ErrorChain(&e), "cannot tell whether the volume is on a noexec mount");
            return;
        }
    };
    if mountinfo::exec_blocked(&table, volume) {
        tracing::warn!(
            path = %volume.display(),
            "the volume is on a noexec mount, so containers cannot run its bin/; mount a tmpfs \
             (mode=755,nosuid,nodev) on the volume root first, as Mesos does"
        );
    }
}

/// `--cache` (a host path), else `<driver-root>/etc/ld.so.cache` resolved inside the driver root.
fn load_cache(args: &Located<'_>) -> anyhow::Result<LdCache> {
    Ok(match &args.cache {
        Some(path) => LdCache::read(path)?,
        None => LdCache::load(&args.driver.root)?,
    })
}

/// `--driver-version`, else the newest `libnvidia-ml.so.<version>` in the cache.
fn version_of(args: &Located<'_>, cache: &LdCache) -> anyhow::Result<DriverVersion> {
    if let Some(v) = &args.driver_version {
        return Ok(v.clone());
    }
    let (version, file) = plan::detect_driver_version(&args.driver.root, cache)?;
    tracing::info!(version = %version, file = %file.display(), "driver version from the ld.so.cache (override with --driver-version)");
    Ok(version)
}

fn host_plan(args: &Located<'_>) -> anyhow::Result<VolumePlan> {
    let cache = load_cache(args)?;
    let version = version_of(args, &cache)?;
    Ok(plan::plan_from(&args.driver, &cache, &version)?)
}

/// The arguments with the driver they name.
struct Located<'a> {
    args: &'a Args,
    driver: DriverSource,
}

impl std::ops::Deref for Located<'_> {
    type Target = Args;

    fn deref(&self) -> &Args {
        self.args
    }
}

/// The driver a command reads: under `root` (`--driver-root`), else the simulated node's
/// driver tree, else `/`; its programs searched along this process's `PATH` (inside the root),
/// then beside its libraries.
pub(crate) fn driver_source(
    ctx: &Ctx,
    root: Option<&std::path::Path>,
) -> anyhow::Result<DriverSource> {
    let root = match (root, ctx.simulation()?) {
        (Some(root), _) => root.to_owned(),
        (None, Some(sim)) => sim.driver_root()?.to_owned(),
        (None, None) => PathBuf::from("/"),
    };
    let path = std::env::var_os("PATH").unwrap_or_default();
    Ok(DriverSource::with_path(root, &path))
}

/// On a simulated node, builds its driver volume under `manager`'s root from the simulated
/// driver tree, as the module's `driver_volume=build` does from the host's driver; elsewhere
/// does nothing (a real node's volume is built by `volume create` or the module).
pub(crate) fn build_simulated(ctx: &Ctx, manager: &VolumeManager) -> anyhow::Result<()> {
    if ctx.simulation()?.is_none() {
        return Ok(());
    }
    let source = driver_source(ctx, None)?;
    let cache = LdCache::load(&source.root)?;
    let (version, _) = plan::detect_driver_version(&source.root, &cache)?;
    let plan = manager.plan(&source, &cache, &version)?;
    let volume = manager
        .create(&plan)
        .context("cannot build the simulated node's driver volume")?;
    tracing::info!(volume = %volume.path.display(), "built the simulated node's driver volume");
    Ok(())
}

/// Prints `value` as JSON with `--json`, else `text(value)`.
fn emit<T: Serialize>(
    args: &Located<'_>,
    value: &T,
    text: impl FnOnce(&T) -> String,
) -> anyhow::Result<ExitCode> {
    let mut out = std::io::stdout().lock();
    if args.json {
        serde_json::to_writer_pretty(&mut out, value)?;
        writeln!(out)?;
    } else {
        out.write_all(text(value).as_bytes())?;
    }
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}

fn plan_text(plan: &VolumePlan) -> String {
    let mut s = format!(
        "driver {} under {}: {} files ({}), {} links, {} skipped\n",
        plan.driver_version,
        plan.driver_root.display(),
        plan.files.len(),
        size(plan.total_bytes()),
        plan.links.len(),
        plan.skipped.len()
    );
    if plan.driver_library_count() == 0 {
        s.push_str("warning: no library of this driver version was found; `create` will refuse this plan\n");
    }
    let files: Vec<Vec<String>> = plan
        .files
        .iter()
        .map(|f| {
            vec![
                format!("{}/{}", f.dir.as_str(), f.name),
                format!("{:?}", f.capability).to_lowercase(),
                size(f.stamp.size),
                match f.origin {
                    Some(origin) => format!(
                        "{} (found as {}, {origin})",
                        f.source.display(),
                        f.found_as.display()
                    ),
                    None => f.source.display().to_string(),
                },
            ]
        })
        .collect();
    s.push('\n');
    s.push_str(&table(&["FILE", "CAPABILITY", "SIZE", "SOURCE"], &files));
    let links: Vec<Vec<String>> = plan
        .links
        .iter()
        .map(|l| vec![format!("{}/{}", l.dir.as_str(), l.name), l.target.clone()])
        .collect();
    s.push('\n');
    s.push_str(&table(&["LINK", "TARGET"], &links));
    let skipped: Vec<Vec<String>> = plan
        .skipped
        .iter()
        .map(|k| {
            let path = k
                .path
                .as_deref()
                .map_or_else(|| "-".to_owned(), |p| p.display().to_string());
            vec![k.name.clone(), path, k.reason.to_string()]
        })
        .collect();
    s.push('\n');
    s.push_str(&table(&["SKIPPED", "PATH", "WHY"], &skipped));
    s
}

/// Left-aligned columns separated by two spaces; the last column is not padded.
fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let header: Vec<String> = header.iter().map(|h| (*h).to_owned()).collect();
    for row in std::iter::once(&header).chain(rows) {
        let last = row.len().saturating_sub(1);
        for (i, cell) in row.iter().enumerate() {
            if i == last {
                out.push_str(cell);
            } else {
                let _ = write!(out, "{cell:<width$}  ", width = widths[i]);
            }
        }
        out.push('\n');
    }
    out
}

fn size(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["B", "KiB", "MiB", "GiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}
