//! `mesos-gpu demo`: a simulated GPU agent, end to end, in one command.
//!
//! A stream of Marathon apps (`examples/marathon/stream.json`, built in) goes through the real
//! code of every part: the allocator with the configured policy, the isolator's device-rule and
//! launch-info builder ([`mesos_gpu_isolator::lifecycle::plan_launch`]), the Docker bridge's
//! `docker run` argument builder, and the volume planner on a generated driver tree. Nothing on
//! the host changes: scratch files live in one temp directory, removed at exit. `--live` (root)
//! also drives the lifecycle [`Isolator`]: it creates and removes the device cgroups under a
//! uniquely named cgroups root, over a temp dev root of `mknod`ed nodes.

pub(crate) mod driver;
mod engine;
mod live_docker;
mod mig;
mod render;
mod sharing;
mod stream;

use std::io::{IsTerminal as _, Write as _};
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::sync::Arc;

use anyhow::{Context as _, bail, ensure};
use mesos_gpu_docker::args::{DriverSpec, ImageInfo, LaunchPlan, VolumeSource};
use mesos_gpu_enforce::{cgroup::CgroupLayout, cgroup::DeviceRule, cgroup::default_whitelist};
use mesos_gpu_grant::Grant;
use mesos_gpu_isolator::{
    lifecycle::CgroupChoice, lifecycle::ContainerId, lifecycle::DockerReservation,
    lifecycle::DockerStart, lifecycle::Isolator, lifecycle::IsolatorConfig, lifecycle::LaunchInfo,
    lifecycle::PrepareConfig, lifecycle::plan_launch,
};
use mesos_gpu_node::{
    devices::DeviceNode, devices::DeviceNodes, devices::GpuNode, devices::NVIDIA_UVM,
    devices::NVIDIACTL,
};
use mesos_gpu_node::{
    inventory::DevNum, inventory::Gpu, inventory::Inventory, inventory::NVIDIA_GPU_MAJOR,
};
use mesos_gpu_os::fsmode;
use mesos_gpu_placement::allocator::Policy;
use mesos_gpu_volume::{DriverVersion, VolumeManager};
use serde::Serialize;

use self::engine::{Agent, RunReport};
use self::stream::{ContainerType, Stream};
use crate::ctx::{Ctx, GlobalArgs};

/// The node used when neither `--simulate` nor `--nvml-lib` is given.
const DEFAULT_NODE: &str = "dgx1-v100";

/// `nvidiactl`'s device number on every NVIDIA driver.
const NVIDIACTL_DEV: DevNum = DevNum {
    major: NVIDIA_GPU_MAJOR,
    minor: 255,
};

/// `nvidia-uvm`'s major in the dry run. It is dynamic on a real host (read from `st_rdev`
/// there); 510 is a common value.
const UVM_MAJOR: u32 = 510;

/// Where a MESOS container's image root filesystem is taken to be (only named, never created).
const ROOTFS_BASE: &str = "/var/lib/mesos/provisioner/rootfs";

#[derive(clap::Args)]
#[command(
    long_about = "Run a simulated GPU agent end to end: a stream of Marathon apps (MESOS and DOCKER \
                  containers, 1 to 8 GPUs, one bad request) goes through the real allocator, device \
                  rules, mounts, Docker arguments and driver-volume planner, and the result is shown \
                  with a per-GPU timeline and a comparison with first-fit.\n\n\
                  The node is the simulated DGX-1 (dgx1-v100) unless --simulate names another (see \
                  `mesos-gpu info --simulate list`). Nothing on the host changes: scratch files live \
                  in a temp directory removed at exit. --live (root only) also creates and removes \
                  the containers' device cgroups through the isolator.",
    after_help = "Examples:\n  \
    cargo run --release -p mesos-gpu -- demo\n  \
    mesos-gpu demo --policy first-fit\n  \
    mesos-gpu --simulate hgx16 demo --json | jq '.run.tasks[] | {task, outcome, gpus: .chosen.gpus}'\n  \
    mesos-gpu demo --stream my-apps/stream.json --pace 600\n  \
    mesos-gpu demo --gpu-replicas 4,4=1,5=1,6=1,7=1 --gpu-sharing mps\n  \
    mesos-gpu --simulate dgx-a100-mig demo\n  \
    sudo mesos-gpu demo --live"
)]
pub(crate) struct Args {
    /// Stream file (`{"arrivals": [{"at", "app", "runs_for"}]}`, app files relative to it)
    /// [default: the built-in examples/marathon/stream.json].
    #[arg(long, value_name = "FILE")]
    stream: Option<PathBuf>,

    /// How GPUs are chosen; the other policy is run on the same stream for comparison.
    #[arg(long, value_name = "POLICY", default_value = "topology", value_parser = parse_policy)]
    policy: Policy,

    /// Print one JSON report on stdout instead of text.
    #[arg(long)]
    json: bool,

    /// Replay in real time, N times faster (e.g. 600 plays ten simulated minutes a second).
    #[arg(long, value_name = "N")]
    pace: Option<f64>,

    /// Needs root: also create and remove each MESOS container's device cgroup through the
    /// isolator, over a temp dev root of mknod'ed nodes, and reserve DOCKER containers' GPUs
    /// through it; DOCKER apps become real containers when a Docker daemon answers.
    #[arg(long)]
    live: bool,

    /// Replay the stream on a node that shares GPUs (the module's `gpu_replicas`): which tasks
    /// get shares, where they are packed, their limits, and what the same node refuses without
    /// sharing. A dry run only.
    #[command(flatten)]
    sharing: super::SharingArgs,

    /// Local image the live DOCKER containers run (built FROM scratch with /bin/busybox when
    /// missing, and then removed at exit).
    #[arg(long, value_name = "IMAGE", env = "MESOS_GPU_DEMO_IMAGE", default_value = live_docker::DEFAULT_IMAGE)]
    live_image: String,
}

/// Prints a scenario's report: JSON, or its text.
fn print_scenario(
    json: bool,
    report: &impl Serialize,
    text: impl FnOnce() -> String,
) -> anyhow::Result<ExitCode> {
    let mut out = std::io::stdout().lock();
    if json {
        writeln!(out, "{}", serde_json::to_string_pretty(report)?)?;
    } else {
        write!(out, "{}", text())?;
    }
    Ok(ExitCode::SUCCESS)
}

fn parse_policy(value: &str) -> Result<Policy, String> {
    value.parse().map_err(|e| format!("{e}"))
}

/// True when the effective user is root (from `/proc/self/status`, no syscall wrapper needed).
pub(crate) fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status").is_ok_and(|status| {
        status
            .lines()
            .find_map(|l| l.strip_prefix("Uid:"))
            .and_then(|ids| ids.split_whitespace().nth(1))
            == Some("0")
    })
}

/// The whole report (`--json`).
#[derive(Serialize)]
pub(crate) struct Report {
    /// Simulated node name.
    pub(crate) node: String,
    /// Driver version.
    pub(crate) driver: Option<String>,
    /// The node's GPUs.
    pub(crate) gpus: Vec<GpuSummary>,
    /// `dry-run` or `live`.
    pub(crate) mode: &'static str,
    /// Where the stream came from.
    pub(crate) stream: String,
    /// Scratch directory (removed at exit).
    pub(crate) scratch: String,
    /// The driver volume.
    pub(crate) volume: VolumeReport,
    /// The run with the chosen policy.
    pub(crate) run: RunReport,
    /// The same stream with the other policy.
    pub(crate) other_policy: RunReport,
    /// Notes about what was assumed or skipped.
    pub(crate) notes: Vec<String>,
    /// `--live`: the Docker containers started for DOCKER apps (all removed at exit).
    pub(crate) docker_containers: Vec<live_docker::LiveContainer>,
}

/// One GPU of the node.
#[derive(Serialize)]
pub(crate) struct GpuSummary {
    /// NVML index.
    pub(crate) index: u32,
    /// Device minor.
    pub(crate) minor: u32,
    /// Product name.
    pub(crate) name: String,
}

/// The driver volume part of the report.
#[derive(Serialize)]
pub(crate) struct VolumeReport {
    /// Generated driver root.
    pub(crate) driver_root: String,
    /// Files generated.
    pub(crate) generated: Vec<String>,
    /// How the ld.so.cache was written.
    pub(crate) cache: String,
    /// The plan, when there is one.
    pub(crate) plan: Option<mesos_gpu_volume::VolumePlan>,
    /// Why there is no plan.
    pub(crate) unavailable: Option<String>,
    /// Host path of the built volume.
    pub(crate) path: Option<String>,
}

pub(crate) fn run(args: &Args, ctx: &Ctx) -> anyhow::Result<ExitCode> {
    if let Some(pace) = args.pace {
        ensure!(
            pace.is_finite() && pace > 0.0,
            "--pace {pace}: expected a speed-up factor above 0, e.g. 600"
        );
    }
    if args.live && !is_root() {
        bail!(
            "--live creates device cgroups and device nodes and needs root; run it with sudo, or drop --live for the dry run (which changes nothing)"
        );
    }

    // The demo runs on a simulated DGX-1 unless told otherwise.
    let default_ctx;
    let ctx = if ctx.global.simulate.is_none() && ctx.global.nvml_lib.is_none() {
        default_ctx = Ctx::new(
            GlobalArgs {
                simulate: Some(DEFAULT_NODE.to_owned()),
                ..ctx.global.clone()
            },
            false,
        );
        &default_ctx
    } else {
        ctx
    };
    let node = ctx
        .global
        .simulate
        .clone()
        .unwrap_or_else(|| "this node".to_owned());
    let inventory = ctx.inventory()?.clone();
    // Nodes that share GPUs or split them with MIG get the stream of small work.
    let small_work = args.sharing.gpu_replicas.is_some() || !inventory.mig.devices.is_empty();
    let stream = match &args.stream {
        Some(path) => Stream::load(path)?,
        None if small_work => Stream::shipped_sharing()?,
        None => Stream::shipped()?,
    };
    if !inventory.mig.devices.is_empty() && args.sharing.gpu_replicas.is_none() {
        ensure!(
            !args.live,
            "--live on a node with MIG devices: the MIG scenario is a dry run; run MIG tasks for real with the module or `mesos-gpu docker-args --mig-strategy`"
        );
        let report = mig::run(&stream, &inventory, args.policy, &ctx.proc_root()?)?;
        return print_scenario(args.json, &report, || mig::text(&report, &node));
    }
    if let Some(config) = args.sharing.config(ctx)? {
        ensure!(
            !args.live,
            "--live with --gpu-replicas: the sharing scenario is a dry run; run shares for real with `mesos-gpu exec --gpu-replicas`"
        );
        let indices: Vec<u32> = inventory.whole_gpus().map(|g| g.index).collect();
        let plan = config
            .spec
            .resolve(&inventory, &indices)
            .context("cannot share this node's GPUs")?;
        let report = sharing::run(&stream, &inventory, &plan, args.policy, &config.mps)?;
        return print_scenario(args.json, &report, || sharing::text(&report, &node));
    }
    let scratch =
        fsmode::private_tempdir("mesos-gpu-demo-").context("cannot create a temp directory")?;
    let mut notes = vec![engine::ASSUMED_IMAGES.to_owned()];
    if inventory.gpus.is_empty() {
        notes.push(format!(
            "{node} has no GPUs ({}): every GPU task is refused; try --simulate {DEFAULT_NODE}",
            inventory
                .absent_reason
                .as_deref()
                .unwrap_or("no reason given")
        ));
    }

    let indices: Vec<u32> = inventory.gpus.iter().map(|g| g.index).collect();
    notes.extend(crate::numa::summary(
        &crate::numa::affinities(ctx)?,
        &indices,
    ));

    let volume = driver_volume(scratch.path(), &inventory)?;
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

    let progress_tty = std::io::stderr().is_terminal() && !args.json;
    let total = stream.arrivals.len();
    let mut last_at = 0u64;
    let mut progress = |done: usize, at: u64| {
        if let Some(pace) = args.pace {
            let wait = at.saturating_sub(last_at) as f64 / pace;
            std::thread::sleep(std::time::Duration::from_secs_f64(wait.min(3600.0)));
            tracing::info!(
                arrival = done,
                of = total,
                simulated_second = at,
                "demo progress"
            );
        }
        last_at = at;
        if progress_tty {
            eprint!("\rdemo: {done}/{total} arrivals, t={at}s ");
            if done == total {
                eprint!("\r\x1b[K");
            }
        }
    };

    let mut docker_containers = Vec::new();
    let (mode, run) = if args.live {
        let mut agent = LiveAgent::new(
            scratch.path(),
            &inventory,
            args.policy,
            volume_path.clone(),
            driver_spec.clone(),
        )?;
        let docker_note = agent.connect_docker(&inventory, &args.live_image)?;
        notes.push(format!(
            "live: device cgroups created under {} and removed; {docker_note}",
            agent.cgroups_parent.display()
        ));
        let run = engine::run(&stream, &inventory, args.policy, &mut agent, &mut progress);
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
        (("live"), cleaned.and(run)?)
    } else {
        let mut agent = DryAgent::new(&inventory, volume_path.clone(), driver_spec.clone());
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
            engine::run(&stream, &inventory, args.policy, &mut agent, &mut progress)?,
        )
    };
    let other = match args.policy {
        Policy::Topology => Policy::FirstFit,
        Policy::FirstFit => Policy::Topology,
    };
    let mut dry = DryAgent::new(&inventory, volume_path, driver_spec);
    let other_policy = engine::run(&stream, &inventory, other, &mut dry, &mut |_, _| {})?;

    let report = Report {
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
        scratch: scratch.path().display().to_string(),
        volume,
        run,
        other_policy,
        notes,
        docker_containers,
    };
    let mut out = std::io::stdout().lock();
    if args.json {
        serde_json::to_writer_pretty(&mut out, &report)?;
        writeln!(out)?;
    } else {
        let color = std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none();
        render::text(&mut out, &report, &stream, color)?;
    }
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}

/// Generates the driver tree, plans and builds its volume under `scratch`.
fn driver_volume(scratch: &Path, inventory: &Inventory) -> anyhow::Result<VolumeReport> {
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
    let version: DriverVersion = info
        .version
        .parse()
        .with_context(|| format!("driver version {:?}", info.version))?;
    let generated = driver::generate(&root, &version)?;
    let (plan, unavailable, path) = match generated.plan {
        Ok(plan) => {
            let manager = VolumeManager::at(scratch.join("volumes"));
            let volume = manager
                .create(&plan)
                .context("cannot build the driver volume in the scratch directory")?;
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

/// The control nodes and GPU nodes a real agent would have, under `dev`.
fn simulated_nodes(dev: &Path, inventory: &Inventory) -> DeviceNodes {
    let node = |name: &str, dev_num| DeviceNode {
        path: dev.join(name),
        dev: dev_num,
    };
    DeviceNodes {
        control: vec![
            node(NVIDIACTL, NVIDIACTL_DEV),
            node(
                NVIDIA_UVM,
                DevNum {
                    major: UVM_MAJOR,
                    minor: 0,
                },
            ),
        ],
        gpus: inventory
            .gpus
            .iter()
            .map(|g| GpuNode {
                index: g.index,
                node: node(
                    &format!("nvidia{}", g.minor),
                    DevNum {
                        major: NVIDIA_GPU_MAJOR,
                        minor: g.minor,
                    },
                ),
            })
            .collect(),
    }
}

/// The dry run: the real builders, nothing applied.
struct DryAgent {
    base: Vec<DeviceRule>,
    nodes: DeviceNodes,
    volume: Option<PathBuf>,
    driver: Option<DriverSpec>,
    layout: Option<CgroupLayout>,
}

impl DryAgent {
    fn new(inventory: &Inventory, volume: Option<PathBuf>, driver: Option<DriverSpec>) -> DryAgent {
        let dev = Path::new("/dev");
        let nodes = simulated_nodes(dev, inventory);
        DryAgent {
            base: default_whitelist(),
            nodes,
            volume,
            driver,
            layout: CgroupLayout::detect().ok(),
        }
    }
}

impl Agent for DryAgent {
    fn launch_mesos(
        &mut self,
        id: &ContainerId,
        config: PrepareConfig,
        gpus: &[Gpu],
    ) -> anyhow::Result<LaunchInfo> {
        let cgroup = self.layout.as_ref().map(|l| l.container_dir(id));
        let grant = Grant::new(&self.nodes, &self.base, gpus.to_vec(), vec![], None)?;
        Ok(plan_launch(
            id,
            &config,
            &grant,
            self.volume.as_deref(),
            cgroup,
        )?)
    }

    fn launch_docker(
        &mut self,
        _id: &ContainerId,
        _requested: f64,
        gpus: &[Gpu],
        image: &ImageInfo,
    ) -> anyhow::Result<LaunchPlan> {
        let refs: Vec<&Gpu> = gpus.iter().collect();
        Ok(LaunchPlan::for_gpus(
            &refs,
            &self.nodes,
            image,
            self.driver.as_ref(),
        )?)
    }

    fn finish(&mut self, _id: &ContainerId, _kind: ContainerType) -> anyhow::Result<()> {
        Ok(())
    }
}

/// `--live`: the lifecycle isolator over real cgroups and a temp dev root.
struct LiveAgent {
    isolator: Arc<Isolator>,
    docker: Option<live_docker::LiveDocker>,
    driver: Option<DriverSpec>,
    cgroups_parent: PathBuf,
    live: Vec<(ContainerId, ContainerType)>,
}

impl LiveAgent {
    fn new(
        scratch: &Path,
        inventory: &Inventory,
        policy: Policy,
        volume: Option<PathBuf>,
        driver: Option<DriverSpec>,
    ) -> anyhow::Result<LiveAgent> {
        let dev = scratch.join("dev");
        fsmode::create_dir_all(&dev, fsmode::STATE_DIR)
            .with_context(|| format!("cannot create {}", dev.display()))?;
        for node in simulated_nodes(&dev, inventory).control.iter().chain(
            simulated_nodes(&dev, inventory)
                .gpus
                .iter()
                .map(|g| &g.node),
        ) {
            let status = Command::new("mknod")
                .args(["-m", "0666"])
                .arg(&node.path)
                .args([
                    "c",
                    &node.dev.major.to_string(),
                    &node.dev.minor.to_string(),
                ])
                .status()
                .context("cannot run mknod")?;
            ensure!(
                status.success(),
                "mknod {} c {} failed ({status})",
                node.path.display(),
                node.dev
            );
        }
        let nodes = DeviceNodes::scan(&dev, inventory)
            .with_context(|| format!("scanning the device nodes made under {}", dev.display()))?;
        let mut config = IsolatorConfig::new(scratch.join("work"));
        config.policy = policy;
        config.cgroup_version = CgroupChoice::Auto;
        config.cgroups_root = format!("mesos-gpu-demo-{}", std::process::id());
        config.driver_volume = volume;
        let isolator = Isolator::new(config, inventory.clone(), nodes)
            .context("cannot set up the isolator")?;
        isolator
            .recover(&[], &[])
            .context("isolator recovery on a fresh work directory failed")?;
        let probe = ContainerId::new("probe")?;
        let cgroups_parent = isolator
            .cgroup_path(&probe)
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_default();
        Ok(LiveAgent {
            isolator: Arc::new(isolator),
            docker: None,
            driver,
            cgroups_parent,
            live: Vec::new(),
        })
    }

    /// Starts real containers for DOCKER apps when a daemon answers; returns the note saying
    /// what happens to them.
    fn connect_docker(&mut self, inventory: &Inventory, image: &str) -> anyhow::Result<String> {
        let docker = live_docker::LiveDocker::connect(
            Arc::clone(&self.isolator),
            self.driver.clone(),
            inventory.gpus.clone(),
            image,
        )?;
        Ok(match docker {
            Ok(docker) => {
                let (image, built) = docker.image();
                let note = format!(
                    "DOCKER apps run as real containers (mesos-<uuid>, image {image}{}), stopped and removed when they finish",
                    if built {
                        ", built for the demo and removed at exit"
                    } else {
                        ""
                    }
                );
                self.docker = Some(docker);
                note
            }
            Err(why) => format!(
                "no Docker daemon answered ({why}): Docker containers are not started (their GPUs are reserved through the isolator)"
            ),
        })
    }

    /// Cleans up whatever is left and removes the cgroups parent; returns the Docker
    /// containers started.
    fn shutdown(mut self) -> (Vec<live_docker::LiveContainer>, anyhow::Result<()>) {
        let mut first_err = None;
        for (id, kind) in std::mem::take(&mut self.live) {
            if let Err(e) = self.finish_one(&id, kind) {
                first_err.get_or_insert(e);
            }
        }
        let mut started = Vec::new();
        if let Some(docker) = self.docker.take() {
            started = docker.started.clone();
            if let Err(e) = docker.shutdown() {
                first_err.get_or_insert(e);
            }
        }
        match std::fs::remove_dir(&self.cgroups_parent) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                first_err.get_or_insert(
                    anyhow::Error::new(e)
                        .context(format!("cannot remove {}", self.cgroups_parent.display())),
                );
            }
        }
        (started, first_err.map_or(Ok(()), Err))
    }

    fn finish_one(&mut self, id: &ContainerId, kind: ContainerType) -> anyhow::Result<()> {
        match (kind, &mut self.docker) {
            (ContainerType::Mesos, _) => self.isolator.cleanup(id)?,
            (ContainerType::Docker, Some(docker)) => docker.finish(id)?,
            (ContainerType::Docker, None) => self.isolator.release_docker(id)?,
        }
        Ok(())
    }
}

impl Agent for LiveAgent {
    fn launch_mesos(
        &mut self,
        id: &ContainerId,
        config: PrepareConfig,
        gpus: &[Gpu],
    ) -> anyhow::Result<LaunchInfo> {
        let info = self.isolator.prepare(id, config)?;
        self.live.push((id.clone(), ContainerType::Mesos));
        check_same(id, &info.gpus, gpus)?;
        let cgroup = info
            .cgroup
            .as_deref()
            .context("the isolator made no cgroup")?;
        let made = std::fs::metadata(cgroup)
            .with_context(|| format!("the cgroup {} is not there", cgroup.display()))?;
        tracing::info!(container = %id, cgroup = %cgroup.display(), inode = made.ino(), "device cgroup created");
        Ok(info)
    }

    fn launch_docker(
        &mut self,
        id: &ContainerId,
        requested: f64,
        gpus: &[Gpu],
        image: &ImageInfo,
    ) -> anyhow::Result<LaunchPlan> {
        if let Some(docker) = &mut self.docker {
            let container = docker.launch(id, requested)?;
            let plan = container.plan.clone();
            let reserved = container.gpus.clone();
            self.live.push((id.clone(), ContainerType::Docker));
            check_same(id, &reserved, gpus)?;
            return Ok(plan);
        }
        let reservation =
            DockerReservation::reserve(&*self.isolator, id, requested, DockerStart::default())?;
        check_same(id, reservation.gpus(), gpus)?;
        let plan = LaunchPlan::new(reservation.grant(), image, self.driver.as_ref())?;
        reservation.keep();
        self.live.push((id.clone(), ContainerType::Docker));
        Ok(plan)
    }

    fn finish(&mut self, id: &ContainerId, kind: ContainerType) -> anyhow::Result<()> {
        self.finish_one(id, kind)?;
        self.live.retain(|(live, _)| live != id);
        Ok(())
    }
}

/// The isolator's own allocator must agree with the demo's.
fn check_same(id: &ContainerId, got: &[Gpu], expected: &[Gpu]) -> anyhow::Result<()> {
    let indices = |gpus: &[Gpu]| gpus.iter().map(|g| g.index).collect::<Vec<_>>();
    ensure!(
        indices(got) == indices(expected),
        "container {id}: the isolator granted GPUs {:?} where the demo's allocator chose {:?}",
        indices(got),
        indices(expected)
    );
    Ok(())
}
