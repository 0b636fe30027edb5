//! Where the demo's containers go: both ask the lifecycle [`Isolator`] what each container
//! gets. [`DryAgent`]'s isolator acts on nothing (a dry run); [`LiveAgent`]'s (`--live`, root)
//! makes real cgroups over a temp dev root of `mknod`ed nodes and, when a daemon answers, starts
//! real Docker containers.

use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use mesos_gpu_docker::args::{DriverSpec, ImageInfo, LaunchPlan};
use mesos_gpu_enforce::{cgroup::CgroupLayout, cgroup::CgroupVersion};
use mesos_gpu_isolator::{
    lifecycle::CgroupChoice, lifecycle::ContainerId, lifecycle::DockerGuard,
    lifecycle::DockerStart, lifecycle::Isolator, lifecycle::IsolatorConfig, lifecycle::LaunchInfo,
    lifecycle::PrepareConfig,
};
use mesos_gpu_node::{
    devices::DeviceNode, devices::DeviceNodes, devices::GpuNode, devices::NVIDIA_UVM,
    devices::NVIDIACTL,
};
use mesos_gpu_node::{
    inventory::DevNum, inventory::Gpu, inventory::Inventory, inventory::NVIDIA_GPU_MAJOR,
};
use mesos_gpu_os::fsmode;
use mesos_gpu_os::io::{IoContext as _, IoError};
use mesos_gpu_placement::allocator::Policy;

use crate::engine::Agent;
use crate::error::DemoError;
use crate::live_docker::{LiveContainer, LiveDocker};
use crate::stream::ContainerType;

/// `nvidiactl`'s device number on every NVIDIA driver.
const NVIDIACTL_DEV: DevNum = DevNum {
    major: NVIDIA_GPU_MAJOR,
    minor: 255,
};

/// `nvidia-uvm`'s major in the dry run. It is dynamic on a real host (read from `st_rdev`
/// there); 510 is a common value.
const UVM_MAJOR: u32 = 510;

/// The control nodes and GPU nodes a real agent would have, under `dev`.
pub(crate) fn simulated_nodes(dev: &Path, inventory: &Inventory) -> DeviceNodes {
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

/// The dry run: the isolator deciding and recording as the module does, acting on nothing
/// ([`IsolatorConfig::dry_run`]), over the device nodes a real agent would have under `/dev`.
pub(crate) struct DryAgent {
    isolator: Isolator,
    driver: Option<DriverSpec>,
    /// Where container cgroups would be, when the host has a hierarchy.
    pub(crate) layout: Option<CgroupLayout>,
}

impl DryAgent {
    /// A dry isolator checkpointing under `work` (a directory of its own).
    pub(crate) fn new(
        work: &Path,
        inventory: &Inventory,
        policy: Policy,
        volume: Option<PathBuf>,
        driver: Option<DriverSpec>,
        layout: Option<CgroupLayout>,
    ) -> Result<DryAgent, DemoError> {
        let mut config = IsolatorConfig::new(work);
        config.policy = policy;
        config.driver_volume = volume;
        match &layout {
            Some(l) if l.version() == CgroupVersion::V2 => {
                config.cgroup_version = CgroupChoice::V2;
                config.v2_mount = Some(l.mount().to_owned());
            }
            Some(l) => {
                config.cgroup_version = CgroupChoice::V1;
                if let Some(root) = l.mount().parent() {
                    config.v1_root = root.to_owned();
                }
            }
            // Only named: the layout is not shown without a hierarchy.
            None => config.cgroup_version = CgroupChoice::V1,
        }
        Ok(DryAgent {
            isolator: dry_isolator(config, inventory)?,
            driver,
            layout,
        })
    }
}

impl Agent for DryAgent {
    fn launch_mesos(
        &mut self,
        id: &ContainerId,
        config: PrepareConfig,
        gpus: &[Gpu],
    ) -> Result<LaunchInfo, DemoError> {
        let mut info = self.isolator.prepare(id, config)?;
        check_same(id, &info.gpus, gpus)?;
        if self.layout.is_none() {
            info.cgroup = None;
        }
        Ok(info)
    }

    fn launch_docker(
        &mut self,
        id: &ContainerId,
        requested: f64,
        gpus: &[Gpu],
        image: &ImageInfo,
    ) -> Result<LaunchPlan, DemoError> {
        reserve_docker(
            &self.isolator,
            id,
            requested,
            gpus,
            image,
            self.driver.as_ref(),
        )
    }

    fn finish(&mut self, id: &ContainerId, kind: ContainerType) -> Result<(), DemoError> {
        match kind {
            ContainerType::Mesos => self.isolator.cleanup(id)?,
            ContainerType::Docker => self.isolator.release_docker(id)?,
        }
        Ok(())
    }
}

/// An isolator set up by `config` that acts on nothing ([`IsolatorConfig::dry_run`]), over the
/// device nodes a real agent with `inventory` would have under `/dev`, recovered empty.
pub(crate) fn dry_isolator(
    mut config: IsolatorConfig,
    inventory: &Inventory,
) -> Result<Isolator, DemoError> {
    config.dry_run = true;
    let nodes = simulated_nodes(Path::new("/dev"), inventory);
    let isolator = Isolator::new(config, inventory.clone(), nodes)
        .map_err(|source| DemoError::Setup { source })?;
    isolator
        .recover(&[], &[])
        .map_err(|source| DemoError::Recover { source })?;
    Ok(isolator)
}

/// A Docker container's GPUs reserved through the isolator (as `docker-args` and the hook do)
/// and its `docker run` plan for `image`.
fn reserve_docker(
    isolator: &Isolator,
    id: &ContainerId,
    requested: f64,
    gpus: &[Gpu],
    image: &ImageInfo,
    driver: Option<&DriverSpec>,
) -> Result<LaunchPlan, DemoError> {
    let reservation = DockerGuard::reserve(isolator, id, requested, DockerStart::default())?;
    check_same(id, reservation.gpus(), gpus)?;
    let plan = LaunchPlan::new(reservation.grant(), image, driver)?;
    reservation.keep();
    Ok(plan)
}

/// `--live`: the lifecycle isolator over real cgroups and a temp dev root.
pub(crate) struct LiveAgent {
    isolator: Arc<Isolator>,
    docker: Option<LiveDocker>,
    driver: Option<DriverSpec>,
    /// The directory holding the containers' cgroups (removed at the end).
    pub(crate) cgroups_parent: PathBuf,
    live: Vec<(ContainerId, ContainerType)>,
}

impl LiveAgent {
    pub(crate) fn new(
        scratch: &Path,
        inventory: &Inventory,
        policy: Policy,
        volume: Option<PathBuf>,
        driver: Option<DriverSpec>,
    ) -> Result<LiveAgent, DemoError> {
        let dev = scratch.join("dev");
        fsmode::create_dir_all(&dev, fsmode::STATE_DIR)
            .at("create", &dev)
            .map_err(DemoError::Create)?;
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
                .map_err(|source| DemoError::Run {
                    program: "mknod",
                    source,
                })?;
            if !status.success() {
                return Err(DemoError::Mknod {
                    path: node.path.clone(),
                    dev: node.dev,
                    status,
                });
            }
        }
        let nodes = DeviceNodes::scan(&dev, inventory).map_err(|source| DemoError::Scan {
            dev: dev.clone(),
            source,
        })?;
        let mut config = IsolatorConfig::new(scratch.join("work"));
        config.policy = policy;
        config.cgroup_version = CgroupChoice::Auto;
        config.cgroups_root = format!("mesos-gpu-demo-{}", std::process::id());
        config.driver_volume = volume;
        let isolator = Isolator::new(config, inventory.clone(), nodes)
            .map_err(|source| DemoError::Setup { source })?;
        isolator
            .recover(&[], &[])
            .map_err(|source| DemoError::Recover { source })?;
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

    /// Starts real containers for DOCKER apps when a daemon answers at `socket`; returns the
    /// note saying what happens to them.
    pub(crate) fn connect_docker(
        &mut self,
        inventory: &Inventory,
        image: &str,
        socket: &Path,
    ) -> Result<String, DemoError> {
        let docker = LiveDocker::connect(
            Arc::clone(&self.isolator),
            self.driver.clone(),
            inventory.gpus.clone(),
            image,
            socket,
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
    pub(crate) fn shutdown(mut self) -> (Vec<LiveContainer>, Result<(), DemoError>) {
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
            Err(source) => {
                first_err.get_or_insert(DemoError::Remove(IoError::new(
                    "remove",
                    &self.cgroups_parent,
                    source,
                )));
            }
        }
        (started, first_err.map_or(Ok(()), Err))
    }

    fn finish_one(&mut self, id: &ContainerId, kind: ContainerType) -> Result<(), DemoError> {
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
    ) -> Result<LaunchInfo, DemoError> {
        let info = self.isolator.prepare(id, config)?;
        self.live.push((id.clone(), ContainerType::Mesos));
        check_same(id, &info.gpus, gpus)?;
        let cgroup = info.cgroup.as_deref().ok_or(DemoError::NoCgroup)?;
        let made = std::fs::metadata(cgroup).map_err(|source| DemoError::CgroupMissing {
            path: cgroup.to_owned(),
            source,
        })?;
        tracing::info!(container = %id, cgroup = %cgroup.display(), inode = made.ino(), "device cgroup created");
        Ok(info)
    }

    fn launch_docker(
        &mut self,
        id: &ContainerId,
        requested: f64,
        gpus: &[Gpu],
        image: &ImageInfo,
    ) -> Result<LaunchPlan, DemoError> {
        if let Some(docker) = &mut self.docker {
            let container = docker.launch(id, requested)?;
            let plan = container.plan.clone();
            let reserved = container.gpus.clone();
            self.live.push((id.clone(), ContainerType::Docker));
            check_same(id, &reserved, gpus)?;
            return Ok(plan);
        }
        let plan = reserve_docker(
            &self.isolator,
            id,
            requested,
            gpus,
            image,
            self.driver.as_ref(),
        )?;
        self.live.push((id.clone(), ContainerType::Docker));
        Ok(plan)
    }

    fn finish(&mut self, id: &ContainerId, kind: ContainerType) -> Result<(), DemoError> {
        self.finish_one(id, kind)?;
        self.live.retain(|(live, _)| live != id);
        Ok(())
    }
}

/// The isolator's own allocator must agree with the demo's.
fn check_same(id: &ContainerId, got: &[Gpu], expected: &[Gpu]) -> Result<(), DemoError> {
    let indices = |gpus: &[Gpu]| gpus.iter().map(|g| g.index).collect::<Vec<_>>();
    if indices(got) != indices(expected) {
        return Err(DemoError::Mismatch {
            container: id.clone(),
            granted: indices(got),
            chosen: indices(expected),
        });
    }
    Ok(())
}
