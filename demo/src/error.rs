//! The demo's errors: what stopped a run, naming the object and what to do.

use std::io;
use std::path::PathBuf;
use std::process::ExitStatus;

use mesos_gpu_docker::args::ArgsError;
use mesos_gpu_docker::bridge::BridgeError;
use mesos_gpu_docker::client::DockerError;
use mesos_gpu_grant::GrantError;
use mesos_gpu_isolator::lifecycle::LifecycleError;
use mesos_gpu_node::devices::DevicesError;
use mesos_gpu_node::inventory::DevNum;
use mesos_gpu_os::IoError;
use mesos_gpu_os::container_id::{ContainerId, ContainerIdError};
use mesos_gpu_placement::allocator::AllocError;
use mesos_gpu_volume::VolumeError;
use mesos_gpu_volume::version::VersionError;

use crate::driver::DriverError;
use crate::stream::StreamError;

/// Why a demo run stopped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DemoError {
    /// The stream or an app file is refused.
    #[error(transparent)]
    Stream(#[from] StreamError),
    /// The stand-in driver cannot be written.
    #[error(transparent)]
    Driver(#[from] DriverError),
    /// An app's task id is not a valid container id.
    #[error(transparent)]
    ContainerId(#[from] ContainerIdError),
    /// The allocator refused its setup or a grant it was told to record.
    #[error(transparent)]
    Alloc(#[from] AllocError),
    /// The grant of a container cannot be built.
    #[error(transparent)]
    Grant(#[from] GrantError),
    /// The isolator refused a lifecycle step.
    #[error(transparent)]
    Lifecycle(#[from] LifecycleError),
    /// The `docker run` arguments cannot be built.
    #[error(transparent)]
    Args(#[from] ArgsError),
    /// The allocator of the whole GPUs of a shared node cannot be built.
    #[error("cannot build the allocator of the whole GPUs")]
    WholeGpus {
        /// Why.
        #[source]
        source: AllocError,
    },
    /// The node's driver version is not one the volume planner reads.
    #[error("driver version {version:?}")]
    DriverVersion {
        /// The version the node reports.
        version: String,
        /// Why.
        #[source]
        source: VersionError,
    },
    /// The driver volume cannot be built.
    #[error("cannot build the driver volume in the scratch directory")]
    Volume {
        /// Why.
        #[source]
        source: VolumeError,
    },
    /// A directory cannot be created.
    #[error(transparent)]
    Create(IoError),
    /// A directory cannot be removed.
    #[error(transparent)]
    Remove(IoError),
    /// A program cannot be started.
    #[error("cannot run {program}")]
    Run {
        /// The program.
        program: &'static str,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// `mknod` failed.
    #[error("mknod {} c {dev} failed ({status})", path.display())]
    Mknod {
        /// The node.
        path: PathBuf,
        /// Its device number.
        dev: DevNum,
        /// `mknod`'s exit status.
        status: ExitStatus,
    },
    /// The device nodes made for `--live` cannot be scanned.
    #[error("scanning the device nodes made under {}", dev.display())]
    Scan {
        /// The dev root.
        dev: PathBuf,
        /// Why.
        #[source]
        source: DevicesError,
    },
    /// The isolator cannot be set up.
    #[error("cannot set up the isolator")]
    Setup {
        /// Why.
        #[source]
        source: LifecycleError,
    },
    /// The isolator's recovery on its fresh work directory failed.
    #[error("isolator recovery on a fresh work directory failed")]
    Recover {
        /// Why.
        #[source]
        source: LifecycleError,
    },
    /// The isolator prepared a container without a cgroup.
    #[error("the isolator made no cgroup")]
    NoCgroup,
    /// The cgroup the isolator reported is not there.
    #[error("the cgroup {} is not there", path.display())]
    CgroupMissing {
        /// The cgroup.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The isolator's allocator chose other GPUs than the demo's.
    #[error(
        "container {container}: the isolator granted GPUs {granted:?} where the demo's allocator chose {chosen:?}"
    )]
    Mismatch {
        /// The container.
        container: ContainerId,
        /// What the isolator granted.
        granted: Vec<u32>,
        /// What the demo's allocator chose.
        chosen: Vec<u32>,
    },
    /// The async runtime for the Docker client cannot start.
    #[error("cannot start the async runtime")]
    Runtime {
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The live image cannot be inspected.
    #[error("cannot inspect image {image}")]
    Inspect {
        /// The image.
        image: String,
        /// Why.
        #[source]
        source: DockerError,
    },
    /// The live image is missing and cannot be built.
    #[error("image {image} is missing and building it failed")]
    BuildImage {
        /// The image.
        image: String,
        /// Why.
        #[source]
        source: Box<DemoError>,
    },
    /// The live image's build context cannot be prepared.
    #[error("{what}")]
    ImageContext {
        /// What failed.
        what: &'static str,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// A `docker` command failed.
    #[error("docker {args} failed ({status}): {stderr}")]
    DockerCommand {
        /// Its arguments.
        args: String,
        /// Its exit status.
        status: ExitStatus,
        /// What it wrote on stderr.
        stderr: String,
    },
    /// An app's Docker container cannot start.
    #[error("app {app}: cannot start its Docker container")]
    Start {
        /// The app's task.
        app: ContainerId,
        /// Why.
        #[source]
        source: Box<BridgeError>,
    },
    /// An app's Docker container cannot be stopped.
    #[error("app {app}: cannot stop {name}")]
    Stop {
        /// The app's task.
        app: ContainerId,
        /// The container's name.
        name: String,
        /// Why.
        #[source]
        source: Box<BridgeError>,
    },
    /// An app's Docker container cannot be removed.
    #[error("cannot remove {name}")]
    RemoveContainer {
        /// The container's name.
        name: String,
        /// Why.
        #[source]
        source: DockerError,
    },
    /// An app finished that has no Docker container running.
    #[error("app {app} has no Docker container running")]
    NotRunning {
        /// The app's task.
        app: ContainerId,
    },
}
