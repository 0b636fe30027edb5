//! The engine of `mesos-gpu demo`: a simulated GPU agent, end to end.
//!
//! A [`Stream`] of Marathon apps (`examples/marathon/stream.json`, built in) goes through the
//! real code of every part: the allocator with the configured policy, the isolator that decides
//! what each container gets (acting on nothing: `IsolatorConfig::dry_run`), the Docker bridge's
//! `docker run` argument builder, and the volume planner on a generated driver tree
//! ([`driver`]). [`run`] replays it and returns the [`Report`]; [`run_mig`] and [`run_sharing`]
//! replay a stream on a node with MIG devices or shared GPUs. Nothing on the host changes:
//! scratch files live in the directory the caller gives. With [`Setup::live`] (root) the run
//! also drives the lifecycle [`Isolator`](mesos_gpu_isolator::lifecycle::Isolator): it creates
//! and removes the device cgroups under a uniquely named cgroups root, over a temp dev root of
//! `mknod`ed nodes, and starts DOCKER apps as real containers when a Docker daemon answers.
#![forbid(unsafe_code)]
#![warn(unreachable_pub, missing_docs)]

mod agent;
pub mod driver;
mod engine;
mod error;
mod live_docker;
mod mig;
mod render;
mod sharing;
mod stream;
mod whole;

use std::io::{self, Write};
use std::path::{Path, PathBuf};

use mesos_gpu_docker::args::{DriverSpec, VolumeSource};
use mesos_gpu_enforce::cgroup::CgroupLayout;
use mesos_gpu_node::inventory::Inventory;
use mesos_gpu_placement::allocator::Policy;
use mesos_gpu_volume::{DriverVersion, VolumeManager};
use serde::Serialize;

use crate::agent::{DryAgent, LiveAgent};
use crate::engine::RunReport;
use crate::live_docker::LiveContainer;

pub use crate::error::DemoError;
pub use crate::live_docker::DEFAULT_IMAGE;
pub use crate::mig::{MigReport, run_mig};
pub use crate::sharing::{SharingReport, run_sharing};
pub use crate::stream::{AppError, Stream, StreamError};

/// What a [`run`] replays, where, and how.
pub struct Setup<'a> {
    /// The node's name, for the report.
    pub node: String,
    /// The node.
    pub inventory: &'a Inventory,
    /// The apps and when they arrive.
    pub stream: &'a Stream,
    /// How GPUs are chosen; the other policy is run on the same stream for comparison.
    pub policy: Policy,
    /// A private directory for the generated driver, its volume and (live) the dev root and
    /// work directory; the caller removes it.
    pub scratch: &'a Path,
    /// The caller's notes for the report (after the demo's note on images).
    pub notes: Vec<String>,
    /// Where container cgroups would be, to show in the dry run (none: not shown).
    pub cgroups: Option<CgroupLayout>,
    /// Also run the containers for real (root).
    pub live: Option<Live>,
}

/// How a live run starts DOCKER apps.
pub struct Live {
    /// The local image they run (built `FROM scratch` with `/bin/busybox` when missing).
    pub image: String,
    /// The Docker daemon's socket; without a daemon there, their GPUs are only reserved.
    pub docker_socket: PathBuf,
}

/// The whole report of a [`run`]: `--json` prints it, [`Report::write_text`] writes its text.
#[derive(Serialize)]
pub struct Report {
    /// Simulated node name.
    node: String,
    /// Driver version.
    driver: Option<String>,
    /// The node's GPUs.
    gpus: Vec<GpuSummary>,
    /// `dry-run` or `live`.
    mode: &'static str,
    /// Where the stream came from.
    stream: String,
    /// Scratch directory (removed at exit).
    scratch: String,
    /// The driver volume.
    volume: VolumeReport,
    /// The run with the chosen policy.
    run: RunReport,
    /// The same stream with the other policy.
    other_policy: RunReport,
    /// Notes about what was assumed or skipped.
    notes: Vec<String>,
    /// `--live`: the Docker containers started for DOCKER apps (all removed at exit).
    docker_containers: Vec<LiveContainer>,
}

impl Report {
    /// Writes the report as text of at most 80 columns for `stream` (the one it ran), with
    /// colours when `color`.
    pub fn write_text(&self, out: &mut impl Write, stream: &Stream, color: bool) -> io::Result<()> {
        render::text(out, self, stream, color)
    }
}

/// One GPU of the node.
#[derive(Serialize)]
struct GpuSummary {
    /// NVML index.
    index: u32,
    /// Device minor.
    minor: u32,
    /// Product name.
    name: String,
}

/// The driver volume part of the report.
#[derive(Serialize)]
struct VolumeReport {
    /// Generated driver root.
    driver_root: String,
    /// Files generated.
    generated: Vec<String>,
    /// How the ld.so.cache was written.
    cache: String,
    /// The plan, when there is one.
    plan: Option<mesos_gpu_volume::VolumePlan>,
    /// Why there is no plan.
    unavailable: Option<String>,
    /// Host path of the built volume.
    path: Option<String>,
}

/// Replays `setup.stream` on `setup.inventory` with `setup.policy` and then the other policy;
/// `progress` is told each arrival handled (its number and simulated second).
pub fn run(setup: Setup<'_>, progress: &mut dyn FnMut(usize, u64)) -> Result<Report, DemoError> {
    let Setup {
        node,
        inventory,
        stream,
        policy,
        scratch,
        notes: caller_notes,
        cgroups,
        live,
    } = setup;
    let mut notes = vec![engine::ASSUMED_IMAGES.to_owned()];
    notes.extend(caller_notes);

    let volume = driver_volume(scratch, inventory)?;
    let volume_path = volume.path.as_ref().map(PathBuf::from);
    let driver_spec = match (&inventory.driver, &volume_path) {
        (Some(info), Some(path)) => Some(DriverSpec {
            info: info.clone(),
            volume: VolumeSource::Bind {
                host_path: path.clone(),
            },
        }),
        _ => None,
    };

    let mut docker_containers = Vec::new();
    let (mode, run) = if let Some(live) = &live {
        let mut agent = LiveAgent::new(
            scratch,
            inventory,
            policy,
            volume_path.clone(),
            driver_spec.clone(),
        )?;
        let docker_note = agent.connect_docker(inventory, &live.image, &live.docker_socket)?;
        notes.push(format!(
            "live: device cgroups created under {} and removed; {docker_note}",
            agent.cgroups_parent.display()
        ));
        let run = engine::run(stream, inventory, policy, &mut agent, progress);
        let (started, cleaned) = agent.shutdown();
        notes.extend(started.iter().map(|c| {
            let exit = c
                .exit
                .map_or("not stopped".to_owned(), |code| format!("exit {code}"));
            let removed = if c.removed { "removed" } else { "NOT removed" };
            format!(
                "docker: app {} ran as {} ({exit}, {removed})",
                c.app, c.name
            )
        }));
        docker_containers = started;
        ("live", cleaned.and(run)?)
    } else {
        let mut agent = DryAgent::new(
            &scratch.join("dry-run"),
            inventory,
            policy,
            volume_path.clone(),
            driver_spec.clone(),
            cgroups.clone(),
        )?;
        match &agent.layout {
            Some(layout) => notes.push(format!(
                "cgroups: {} (read from the mount table; nothing created)",
                layout.version()
            )),
            None => notes.push(
                "cgroups: no cgroup hierarchy found here; cgroup paths are not shown".to_owned(),
            ),
        }
        (
            "dry-run",
            engine::run(stream, inventory, policy, &mut agent, progress)?,
        )
    };
    let other = match policy {
        Policy::Topology => Policy::FirstFit,
        Policy::FirstFit => Policy::Topology,
    };
    let mut dry = DryAgent::new(
        &scratch.join("other-policy"),
        inventory,
        other,
        volume_path,
        driver_spec,
        cgroups,
    )?;
    let other_policy = engine::run(stream, inventory, other, &mut dry, &mut |_, _| {})?;

    Ok(Report {
        node,
        driver: inventory.driver.as_ref().map(|d| d.version.clone()),
        gpus: inventory
            .gpus
            .iter()
            .map(|g| GpuSummary {
                index: g.index,
                minor: g.minor,
                name: g.name.clone(),
            })
            .collect(),
        mode,
        stream: stream.source.clone(),
        scratch: scratch.display().to_string(),
        volume,
        run,
        other_policy,
        notes,
        docker_containers,
    })
}

/// Generates the driver tree, plans and builds its volume under `scratch`.
fn driver_volume(scratch: &Path, inventory: &Inventory) -> Result<VolumeReport, DemoError> {
    let root = scratch.join("driver");
    let Some(info) = &inventory.driver else {
        return Ok(VolumeReport {
            driver_root: root.display().to_string(),
            generated: Vec::new(),
            cache: String::new(),
            plan: None,
            unavailable: Some("the node reports no driver".to_owned()),
            path: None,
        });
    };
    let version: DriverVersion =
        info.version
            .parse()
            .map_err(|source| DemoError::DriverVersion {
                version: info.version.clone(),
                source,
            })?;
    let generated = driver::generate(&root, &version)?;
    let (plan, unavailable, path) = match generated.plan {
        Ok(plan) => {
            let manager = VolumeManager::at(scratch.join("volumes"));
            let volume = manager
                .create(&plan)
                .map_err(|source| DemoError::Volume { source })?;
            (Some(plan), None, Some(volume.path.display().to_string()))
        }
        Err(why) => (None, Some(why), None),
    };
    Ok(VolumeReport {
        driver_root: generated.root.display().to_string(),
        generated: generated.files,
        cache: generated.cache_note,
        plan,
        unavailable,
        path,
    })
}
