//! The Docker renderer of a [`Grant`]: what `docker run` needs for one container. A grant
//! becomes a [`DockerLaunch`] (devices, variables, binds, cpuset and the node's driver, as data;
//! versioned JSON that `docker-args --json` prints and `docker-wrapper` reads), and
//! [`DockerLaunch::render`] decides, for one image, what of it the container gets: a
//! [`LaunchPlan`], which the CLI arguments ([`LaunchPlan::cli_args`]) and bollard's `HostConfig`
//! (`crate::client`) only format. Every Docker path renders its grant there: `docker-args`,
//! `docker-wrapper` (for the pulled image), the bridge behind `run` and `serve`, the REST
//! `/docker/cli` (for an image not known) and the demo.
//!
//! Facts relied on (`docs/reference/nvidia-docker.md` §1, §4; `mesos-gpu-isolator.md` §6.4, §8;
//! `mig.md`; `mps.md`):
//! - The grant's device nodes (control nodes, `/dev/nvidia<minor>` per GPU, a MIG device's
//!   parent and capability nodes) become `--device=HOST[:CONTAINER]`, which grants `rwm` in the
//!   device cgroup and creates the node in the container; an MPS share's pipe directory and
//!   `/dev/shm` become `--volume`; a cpuset becomes `--cpuset-cpus`/`--cpuset-mems`. A MIG
//!   device's `/proc` `access` files are not mounted: runc refuses any bind mount inside `/proc`
//!   ("cannot be mounted because it is inside /proc"; NVIDIA's runtime hook mounts them from
//!   outside runc), and the capability nodes are what the driver checks.
//! - The driver volume is mounted read-only at `/usr/local/nvidia` only for images that ask for
//!   it: `NVIDIA_VISIBLE_DEVICES` in the image environment with a value other than `""` and
//!   `void`, or, when the variable is not set, the label `com.nvidia.volumes.needed` (key
//!   present; the value is `nvidia_driver`). Mesos's `shouldInject` reads them in that order.
//!   Either as a bind of the volume's host directory (no Docker volume plugin lookup), or as
//!   nvidia-docker 1.0's named volume `nvidia_driver_<driver version>` served by the plugin.
//! - `com.nvidia.cuda.version` (`MAJOR.MINOR`, optionally `.PATCH`) is the CUDA version an image
//!   was built for; nvidia-docker refused to run it when it is newer than the driver's CUDA
//!   version ("unsupported CUDA version: driver X < image Y").
//! - The grant's variables (`NVIDIA_VISIBLE_DEVICES` and `CUDA_VISIBLE_DEVICES` naming its
//!   devices by **UUID**, a share's) are set for every container holding a device and for images
//!   that ask for the driver (`none` with no device). UUIDs name the same GPU inside and outside
//!   the container, whatever the index order; the image's own value (CUDA images ship `all`) is
//!   overridden, so a host whose default runtime is nvidia-container-runtime exposes exactly
//!   these devices too. Then come the volume manager's `PATH` and `LD_LIBRARY_PATH`
//!   (`mesos_gpu_volume::container_env`, Mesos's `NvidiaVolume::ENV`), computed from the image's
//!   own values; the injection rule itself is `mesos_gpu_volume::should_inject`.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use mesos_gpu_grant::{Grant, GrantError, GrantedDevice, MountKind};
use mesos_gpu_node::inventory::DriverInfo;
use mesos_gpu_placement::numa::Pinning;

pub use mesos_gpu_volume::injection::{
    CONTAINER_PATH as DRIVER_VOLUME_TARGET, VISIBLE_DEVICES_ENV, VOLUMES_NEEDED_LABEL,
};

/// Image label naming the CUDA version the image needs.
pub const CUDA_VERSION_LABEL: &str = "com.nvidia.cuda.version";
/// nvidia-docker 1.0's volume base name; Docker sees `nvidia_driver_<driver version>`.
pub const DRIVER_VOLUME_BASE: &str = "nvidia_driver";
/// nvidia-docker 1.0's volume plugin name.
pub const DEFAULT_PLUGIN_NAME: &str = "nvidia-docker";

/// Why no plan could be made.
#[derive(Debug, thiserror::Error)]
pub enum ArgsError {
    /// The image needs a newer CUDA than the driver supports.
    #[error(
        "image needs CUDA {image} ({CUDA_VERSION_LABEL}={label:?}) but NVIDIA driver {driver_version} \
         supports CUDA up to {driver_cuda}"
    )]
    CudaTooNew {
        /// The version the image asks for.
        image: CudaVersion,
        /// The label value as written.
        label: String,
        /// The driver version.
        driver_version: String,
        /// The newest CUDA the driver supports.
        driver_cuda: CudaVersion,
    },
    /// The image names a CUDA version but the driver's is unknown.
    #[error(
        "image needs CUDA {image} ({CUDA_VERSION_LABEL}={label:?}) but the CUDA version of NVIDIA \
         driver {driver_version} is unknown"
    )]
    CudaUnknown {
        /// The version the image asks for.
        image: CudaVersion,
        /// The label value as written.
        label: String,
        /// The driver version.
        driver_version: String,
    },
    /// The CUDA label is not a version.
    #[error("{CUDA_VERSION_LABEL}={value:?}: expected MAJOR.MINOR or MAJOR.MINOR.PATCH, e.g. 12.4")]
    BadCudaLabel {
        /// The label value as written.
        value: String,
    },
    /// The image asks for the driver volume but the node has no NVIDIA driver.
    #[error("the image asks for the NVIDIA driver volume but this node has no NVIDIA driver")]
    NoDriver,
    /// Docker's `--device` and `--volume` syntax cannot carry a path with a colon.
    #[error("{path}: a path given to Docker must be absolute and must not contain ':'")]
    UnusablePath {
        /// The offending path.
        path: PathBuf,
    },
    /// What was allocated cannot be granted to one container.
    #[error(transparent)]
    Grant(#[from] GrantError),
    /// A launch's JSON is not one ([`DockerLaunch::parse`]).
    #[error(
        "the Docker launch is not valid JSON of a launch (expected an object with version, name, \
         devices, env, binds, cpuset and driver, as `mesos-gpu docker-args --json` prints)"
    )]
    LaunchJson {
        /// What serde_json found.
        #[source]
        source: serde_json::Error,
    },
    /// A launch of another format version.
    #[error(
        "Docker launch version {got}: this mesos-gpu reads version {LAUNCH_VERSION} only (were \
         `docker-args` and `docker-wrapper` upgraded together?)"
    )]
    LaunchVersion {
        /// The version the launch names.
        got: u64,
    },
    /// A launch names a variable Docker cannot set.
    #[error("variable name {name:?} in a Docker launch: expected a non-empty name without '='")]
    BadVariable {
        /// The name as written.
        name: String,
    },
}

/// A CUDA version as (major, minor); patch levels do not matter for driver compatibility. In a
/// [`DockerLaunch`] it is the text `MAJOR.MINOR`.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(into = "String", try_from = "String")]
pub struct CudaVersion {
    /// Major version.
    pub major: u32,
    /// Minor version.
    pub minor: u32,
}

impl CudaVersion {
    /// Parses `MAJOR.MINOR` or `MAJOR.MINOR.PATCH` (decimal digits only).
    pub fn parse(value: &str) -> Result<CudaVersion, ArgsError> {
        let bad = || ArgsError::BadCudaLabel {
            value: value.to_owned(),
        };
        let parts: Vec<&str> = value.trim().split('.').collect();
        if !(2..=3).contains(&parts.len()) {
            return Err(bad());
        }
        let mut nums = [0u32; 3];
        for (slot, part) in nums.iter_mut().zip(&parts) {
            if part.is_empty() || !part.bytes().all(|b| b.is_ascii_digit()) {
                return Err(bad());
            }
            *slot = part.parse().map_err(|_| bad())?;
        }
        Ok(CudaVersion {
            major: nums[0],
            minor: nums[1],
        })
    }
}

impl From<(u32, u32)> for CudaVersion {
    fn from((major, minor): (u32, u32)) -> Self {
        CudaVersion { major, minor }
    }
}

impl From<CudaVersion> for String {
    fn from(version: CudaVersion) -> String {
        version.to_string()
    }
}

impl TryFrom<String> for CudaVersion {
    type Error = ArgsError;

    fn try_from(text: String) -> Result<CudaVersion, ArgsError> {
        CudaVersion::parse(&text)
    }
}

impl fmt::Display for CudaVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

/// One `--device`: a host node and where it appears in the container, with `rwm` access.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DeviceMapping {
    /// Node on the host.
    pub host: PathBuf,
    /// Node in the container (`/dev/<name>`).
    pub container: PathBuf,
}

impl DeviceMapping {
    /// Device-cgroup permissions granted for every mapping.
    pub const PERMISSIONS: &'static str = "rwm";

    fn of(device: &GrantedDevice) -> Result<DeviceMapping, ArgsError> {
        check_path(&device.host)?;
        Ok(DeviceMapping {
            host: device.host.clone(),
            container: device.container.clone(),
        })
    }

    /// The value of `--device=`: the path alone when it is the same on both sides, else
    /// `HOST:CONTAINER`.
    pub fn cli_value(&self) -> String {
        if self.host == self.container {
            self.host.display().to_string()
        } else {
            format!("{}:{}", self.host.display(), self.container.display())
        }
    }
}

/// Where the driver volume comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VolumeSource {
    /// Bind the volume manager's directory for this driver (no Docker volume plugin involved).
    Bind {
        /// The volume's directory on the host.
        host_path: PathBuf,
    },
    /// nvidia-docker 1.0's named volume `nvidia_driver_<version>`, served by a volume plugin.
    Plugin {
        /// The plugin's name as Docker knows it (`nvidia-docker` by default).
        plugin: String,
    },
}

/// The driver volume as mounted in a container; in a [`DockerLaunch`],
/// `{"kind":"bind","host_path":…}` or `{"kind":"named","plugin":…,"name":…}`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum VolumeMount {
    /// `--volume=HOST:/usr/local/nvidia:ro`.
    Bind {
        /// Host directory.
        host_path: PathBuf,
    },
    /// `--volume-driver=PLUGIN --volume=NAME:/usr/local/nvidia:ro`.
    Named {
        /// Volume plugin name.
        plugin: String,
        /// Volume name, `nvidia_driver_<version>`.
        name: String,
    },
}

impl VolumeMount {
    /// The mount of `source` for driver `version`.
    pub fn new(source: &VolumeSource, version: &str) -> Result<VolumeMount, ArgsError> {
        Ok(match source {
            VolumeSource::Bind { host_path } => {
                check_path(host_path)?;
                VolumeMount::Bind {
                    host_path: host_path.clone(),
                }
            }
            VolumeSource::Plugin { plugin } => VolumeMount::Named {
                plugin: plugin.clone(),
                name: volume_name(version),
            },
        })
    }

    /// The `--volume` / `HostConfig.Binds` entry: `SOURCE:/usr/local/nvidia:ro`.
    pub fn bind_spec(&self) -> String {
        match self {
            VolumeMount::Bind { host_path } => {
                format!("{}:{DRIVER_VOLUME_TARGET}:ro", host_path.display())
            }
            VolumeMount::Named { name, .. } => format!("{name}:{DRIVER_VOLUME_TARGET}:ro"),
        }
    }

    /// The volume driver to name, for a plugin-served volume.
    pub fn volume_driver(&self) -> Option<&str> {
        match self {
            VolumeMount::Bind { .. } => None,
            VolumeMount::Named { plugin, .. } => Some(plugin),
        }
    }
}

/// The Docker volume name nvidia-docker 1.0 used for driver `version`.
pub fn volume_name(version: &str) -> String {
    format!("{DRIVER_VOLUME_BASE}_{version}")
}

/// What the node offers an image that asks for the driver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DriverSpec {
    /// The installed driver.
    pub info: DriverInfo,
    /// Where its volume comes from.
    pub volume: VolumeSource,
}

/// What an image says about its GPU needs: its labels and its `KEY=VALUE` environment.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ImageInfo {
    /// `Config.Labels`.
    pub labels: BTreeMap<String, String>,
    /// `Config.Env`, as `KEY=VALUE`.
    pub env: Vec<String>,
}

impl ImageInfo {
    /// True when the image asks for the driver volume, decided as Mesos does: when the image
    /// environment sets `NVIDIA_VISIBLE_DEVICES`, its value decides (anything but `""` and
    /// `void`); otherwise the `com.nvidia.volumes.needed` label does.
    pub fn wants_driver(&self) -> bool {
        mesos_gpu_volume::should_inject(&self.env, self.labels.keys())
    }

    /// The CUDA version the image needs, when it has the label.
    pub fn cuda_requirement(&self) -> Result<Option<(CudaVersion, &str)>, ArgsError> {
        match self.labels.get(CUDA_VERSION_LABEL) {
            None => Ok(None),
            Some(label) => Ok(Some((CudaVersion::parse(label)?, label.as_str()))),
        }
    }
}

/// The version of [`DockerLaunch`] this build writes; [`DockerLaunch::parse`] reads only it.
pub const LAUNCH_VERSION: u32 = 1;

/// A container's grant for `docker run`, as data, before any image is known: what
/// `docker-args --json` prints, the agent's Docker hook puts in the task's
/// `MESOS_GPU_DOCKER_ARGS` and `docker-wrapper` renders for the pulled image. Every Docker path
/// turns it into arguments with [`DockerLaunch::render`], the one place that decides, for an
/// image, whether the variables and the driver volume are given and whether the image's CUDA
/// version is refused.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DockerLaunch {
    /// The format's version, [`LAUNCH_VERSION`].
    pub version: u32,
    /// The container's Docker name (`mesos-<id>`) the grant was reserved for, when it was.
    pub name: Option<String>,
    /// The grant's device nodes: control nodes, GPU nodes by minor, MIG capability nodes.
    pub devices: Vec<DeviceMapping>,
    /// The grant's variables, in order (`NVIDIA_VISIBLE_DEVICES`, `CUDA_VISIBLE_DEVICES`, a
    /// share's).
    pub env: Vec<(String, String)>,
    /// The grant's bind mounts besides the driver volume (an MPS share's pipe directory and
    /// `/dev/shm`).
    pub binds: Vec<BindMount>,
    /// The CPUs and memory nodes the container is pinned to (NUMA pinning).
    #[serde(with = "cpuset_text")]
    pub cpuset: Option<Pinning>,
    /// The node's driver, for images that ask for it; `None` on a node without one.
    pub driver: Option<LaunchDriver>,
}

/// A bind mount of the grant: `SOURCE:TARGET[:ro]`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct BindMount {
    /// Host path.
    pub source: PathBuf,
    /// Path in the container.
    pub target: PathBuf,
    /// Mounted read-only.
    pub read_only: bool,
}

impl BindMount {
    /// The `--volume` / `HostConfig.Binds` entry.
    fn spec(&self) -> Result<String, ArgsError> {
        check_path(&self.source)?;
        check_path(&self.target)?;
        let ro = if self.read_only { ":ro" } else { "" };
        Ok(format!(
            "{}:{}{ro}",
            self.source.display(),
            self.target.display()
        ))
    }
}

/// The node's driver as a [`DockerLaunch`] carries it: enough for the CUDA check and the
/// volume, with no NVML loaded where it is rendered.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LaunchDriver {
    /// The driver version (`550.54.14`).
    pub version: String,
    /// The newest CUDA version the driver supports, when known.
    pub cuda: Option<CudaVersion>,
    /// The driver volume to mount for images that ask for it.
    pub volume: VolumeMount,
}

impl LaunchDriver {
    /// The driver `spec` offers, its volume checked.
    fn of(spec: &DriverSpec) -> Result<LaunchDriver, ArgsError> {
        Ok(LaunchDriver {
            version: spec.info.version.clone(),
            cuda: spec.info.cuda_version.map(CudaVersion::from),
            volume: VolumeMount::new(&spec.volume, &spec.info.version)?,
        })
    }

    /// Refuses an image whose `com.nvidia.cuda.version` is newer than this driver's CUDA
    /// version (nvidia-docker's check), or names one when this driver's is unknown.
    fn check_cuda(&self, image: &ImageInfo) -> Result<(), ArgsError> {
        let Some((needed, label)) = image.cuda_requirement()? else {
            return Ok(());
        };
        match self.cuda {
            Some(have) if needed <= have => Ok(()),
            Some(have) => Err(ArgsError::CudaTooNew {
                image: needed,
                label: label.to_owned(),
                driver_version: self.version.clone(),
                driver_cuda: have,
            }),
            None => Err(ArgsError::CudaUnknown {
                image: needed,
                label: label.to_owned(),
                driver_version: self.version.clone(),
            }),
        }
    }
}

impl DockerLaunch {
    /// The launch of `grant`, with the node's driver `driver` for images that ask for it; its
    /// device and mount paths are checked here, the image is not known yet.
    pub fn new(grant: &Grant, driver: Option<&DriverSpec>) -> Result<DockerLaunch, ArgsError> {
        grant.check_nodes()?;
        let devices = grant
            .devices()
            .iter()
            .map(DeviceMapping::of)
            .collect::<Result<Vec<_>, _>>()?;
        let binds = grant
            .mounts()
            .into_iter()
            .filter(|m| m.kind != MountKind::MigAccessFile)
            .map(|m| BindMount {
                source: m.source,
                target: m.target,
                read_only: m.read_only,
            })
            .collect::<Vec<_>>();
        for bind in &binds {
            bind.spec()?;
        }
        Ok(DockerLaunch {
            version: LAUNCH_VERSION,
            name: None,
            devices,
            env: grant.env(),
            binds,
            cpuset: grant.cpuset().cloned(),
            driver: driver.map(LaunchDriver::of).transpose()?,
        })
    }

    /// This launch, reserved for the container Docker names `name` (`mesos-<id>`).
    pub fn named(self, name: String) -> DockerLaunch {
        DockerLaunch {
            name: Some(name),
            ..self
        }
    }

    /// Reads a launch from its JSON; refused when its `version` is not [`LAUNCH_VERSION`].
    pub fn parse(json: &str) -> Result<DockerLaunch, ArgsError> {
        #[derive(serde::Deserialize)]
        struct Versioned {
            version: u64,
        }
        let Versioned { version } =
            serde_json::from_str(json).map_err(|source| ArgsError::LaunchJson { source })?;
        if version != u64::from(LAUNCH_VERSION) {
            return Err(ArgsError::LaunchVersion { got: version });
        }
        serde_json::from_str(json).map_err(|source| ArgsError::LaunchJson { source })
    }

    /// What `docker run` is given for a container of `image` (`None`: an image not known), the
    /// one decision every Docker renderer uses:
    /// - the grant's devices, binds and cpuset, always;
    /// - the grant's variables when it holds a device or the image asks for the driver;
    /// - for an image that asks for the driver: the driver volume (none on the node is an
    ///   error), the image's CUDA version checked against the driver's, and `PATH` and
    ///   `LD_LIBRARY_PATH` extended from the image's own values;
    /// - for an image not known: the driver volume and the variables, as nvidia-docker 1.0's
    ///   `/docker/cli` gave any image, and no `PATH` or `LD_LIBRARY_PATH`, so that the image's
    ///   own (CUDA images set `/usr/local/nvidia` in their `ENV`) are kept.
    pub fn render(&self, image: Option<&ImageInfo>) -> Result<LaunchPlan, ArgsError> {
        if self.version != LAUNCH_VERSION {
            return Err(ArgsError::LaunchVersion {
                got: u64::from(self.version),
            });
        }
        for device in &self.devices {
            check_path(&device.host)?;
            check_path(&device.container)?;
        }
        let binds = self
            .binds
            .iter()
            .map(BindMount::spec)
            .collect::<Result<Vec<_>, _>>()?;
        for (name, _) in &self.env {
            if name.is_empty() || name.contains('=') {
                return Err(ArgsError::BadVariable { name: name.clone() });
            }
        }
        let wants = image.is_none_or(ImageInfo::wants_driver);
        let mut env = if mesos_gpu_grant::env::told(!self.devices.is_empty(), wants) {
            self.env.clone()
        } else {
            Vec::new()
        };
        let volume = if wants {
            let driver = self.driver.as_ref().ok_or(ArgsError::NoDriver)?;
            if let Some(image) = image {
                driver.check_cuda(image)?;
                env.extend(mesos_gpu_volume::container_env(&image.env));
            }
            if let VolumeMount::Bind { host_path } = &driver.volume {
                check_path(host_path)?;
            }
            Some(driver.volume.clone())
        } else {
            None
        };
        Ok(LaunchPlan {
            devices: self.devices.clone(),
            volume,
            binds,
            env,
            cpuset: self.cpuset.clone(),
        })
    }
}

/// A [`DockerLaunch`]'s cpuset as text: `{"cpus":"0-3,8","mems":"0"}` (`mems` may be `null`).
mod cpuset_text {
    use mesos_gpu_placement::numa::{CpuList, Pinning};
    use serde::{Deserialize as _, Deserializer, Serialize as _, Serializer};

    #[derive(serde::Serialize, serde::Deserialize)]
    struct Text {
        cpus: String,
        mems: Option<String>,
    }

    pub(super) fn serialize<S: Serializer>(
        pinning: &Option<Pinning>,
        out: S,
    ) -> Result<S::Ok, S::Error> {
        pinning
            .as_ref()
            .map(|p| Text {
                cpus: p.cpus.to_string(),
                mems: p.mems.as_ref().map(ToString::to_string),
            })
            .serialize(out)
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        input: D,
    ) -> Result<Option<Pinning>, D::Error> {
        let parse = |text: &str| {
            text.parse::<CpuList>().map_err(|e| {
                serde::de::Error::custom(format!(
                    "cpuset {text:?}: {e} (expected a Linux CPU list such as 0-3,8)"
                ))
            })
        };
        let Some(text) = Option::<Text>::deserialize(input)? else {
            return Ok(None);
        };
        Ok(Some(Pinning {
            cpus: parse(&text.cpus)?,
            mems: text.mems.as_deref().map(parse).transpose()?,
        }))
    }
}

/// What `docker run` is given for one container, as [`DockerLaunch::render`] decided it for
/// its image: one source for the CLI arguments ([`LaunchPlan::cli_args`]) and for bollard's
/// `HostConfig` (`crate::client::host_config`), which only format it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LaunchPlan {
    /// The grant's device nodes: control nodes, GPU nodes by minor, MIG capability nodes.
    pub devices: Vec<DeviceMapping>,
    /// The driver volume, for images that ask for it.
    pub volume: Option<VolumeMount>,
    /// The grant's other bind mounts, `SOURCE:TARGET[:ro]` (an MPS share's pipe directory and
    /// `/dev/shm`).
    pub binds: Vec<String>,
    /// Environment to set, in order.
    pub env: Vec<(String, String)>,
    /// The CPUs and memory nodes the container is pinned to (NUMA pinning).
    pub cpuset: Option<Pinning>,
}

impl LaunchPlan {
    /// Checks what does not depend on the devices (the driver and the image's CUDA version),
    /// before anything is reserved: [`LaunchPlan::new`] refuses a grant exactly when this does,
    /// or for its devices.
    pub fn check_image(
        image: Option<&ImageInfo>,
        driver: Option<&DriverSpec>,
    ) -> Result<(), ArgsError> {
        DockerLaunch::new(&Grant::default(), driver)?
            .render(image)
            .map(drop)
    }

    /// The plan for a container of `image` given `grant`: [`DockerLaunch::new`] rendered for
    /// `image` ([`DockerLaunch::render`]).
    pub fn new(
        grant: &Grant,
        image: &ImageInfo,
        driver: Option<&DriverSpec>,
    ) -> Result<LaunchPlan, ArgsError> {
        DockerLaunch::new(grant, driver)?.render(Some(image))
    }

    /// `docker run` arguments, in a stable order: `--device` (the grant's order), then
    /// `--volume-driver`/`--volume` (the driver volume, then other binds), then `--env`, then
    /// `--cpuset-cpus`/`--cpuset-mems`.
    pub fn cli_args(&self) -> Vec<String> {
        let mut args: Vec<String> = self
            .devices
            .iter()
            .map(|d| format!("--device={}", d.cli_value()))
            .collect();
        if let Some(volume) = &self.volume {
            if let Some(driver) = volume.volume_driver() {
                args.push(format!("--volume-driver={driver}"));
            }
            args.push(format!("--volume={}", volume.bind_spec()));
        }
        args.extend(self.binds.iter().map(|b| format!("--volume={b}")));
        args.extend(self.env.iter().map(|(k, v)| format!("--env={k}={v}")));
        if let Some(pinning) = &self.cpuset {
            args.push(format!("--cpuset-cpus={}", pinning.cpus));
            if let Some(mems) = &pinning.mems {
                args.push(format!("--cpuset-mems={mems}"));
            }
        }
        args
    }

    /// The environment as Docker's `KEY=VALUE` strings.
    pub fn env_strings(&self) -> Vec<String> {
        self.env.iter().map(|(k, v)| format!("{k}={v}")).collect()
    }
}

fn check_path(path: &Path) -> Result<(), ArgsError> {
    let text = path.to_string_lossy();
    if !path.is_absolute() || text.contains(':') {
        return Err(ArgsError::UnusablePath {
            path: path.to_owned(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use mesos_gpu_node::devices::{DeviceNode, DeviceNodes, GpuNode};
    use mesos_gpu_node::discovery::UNKNOWN_MINOR;
    use mesos_gpu_node::inventory::{DevNum, Gpu};
    use proptest::prelude::*;

    pub(crate) fn gpu(index: u32, minor: u32) -> Gpu {
        Gpu {
            index,
            minor,
            uuid: format!("GPU-{index:08x}-0000-0000-0000-{minor:012x}"),
            name: "Tesla V100-SXM2-16GB".to_owned(),
            memory_total: 16 << 30,
            pci_bus_id: format!("00000000:{:02x}:00.0", 6 + index),
            numa_node: Some(0),
            compute_capability: Some((7, 0)),
            healthy: true,
        }
    }

    /// The node's device nodes under `root`: the control nodes (`nvidia-uvm-tools` too with
    /// `uvm_tools`) and one node per GPU of `gpus`.
    fn nodes_at(root: &str, gpus: &[&Gpu], uvm_tools: bool) -> DeviceNodes {
        let node = |name: String, major, minor| DeviceNode {
            path: PathBuf::from(root).join(name),
            dev: DevNum { major, minor },
        };
        let mut control = vec![
            node("nvidiactl".into(), 195, 255),
            node("nvidia-uvm".into(), 510, 0),
        ];
        if uvm_tools {
            control.push(node("nvidia-uvm-tools".into(), 510, 1));
        }
        DeviceNodes {
            control,
            gpus: gpus
                .iter()
                .filter(|g| g.minor != UNKNOWN_MINOR)
                .map(|g| GpuNode {
                    index: g.index,
                    node: node(format!("nvidia{}", g.minor), 195, g.minor),
                })
                .collect(),
        }
    }

    fn grant(gpus: &[&Gpu], uvm_tools: bool) -> Grant {
        let owned: Vec<Gpu> = gpus.iter().map(|g| (*g).clone()).collect();
        Grant::new(&nodes_at("/dev", gpus, uvm_tools), &[], owned, vec![], None).expect("grant")
    }

    fn plan(
        gpus: &[&Gpu],
        image: &ImageInfo,
        driver: Option<&DriverSpec>,
    ) -> Result<LaunchPlan, ArgsError> {
        LaunchPlan::new(&grant(gpus, false), image, driver)
    }

    #[test]
    fn a_cpuset_becomes_cpuset_cpus_and_mems() {
        let a = gpu(0, 0);
        let pinning = Pinning {
            cpus: "0-3,8".parse().expect("list"),
            mems: Some("0".parse().expect("list")),
        };
        let args = LaunchPlan::new(
            &grant(&[&a], false).pinned(Some(pinning.clone())),
            &ImageInfo::default(),
            None,
        )
        .expect("plan")
        .cli_args();
        assert_eq!(
            args[args.len() - 2..],
            ["--cpuset-cpus=0-3,8", "--cpuset-mems=0"]
        );
        let cpus_only = Pinning {
            mems: None,
            ..pinning
        };
        let args = LaunchPlan::new(
            &grant(&[&a], false).pinned(Some(cpus_only)),
            &ImageInfo::default(),
            None,
        )
        .expect("plan")
        .cli_args();
        assert_eq!(args.last().map(String::as_str), Some("--cpuset-cpus=0-3,8"));
    }

    fn driver(cuda: Option<(u32, u32)>, volume: VolumeSource) -> DriverSpec {
        DriverSpec {
            info: DriverInfo {
                version: "550.54.14".to_owned(),
                cuda_version: cuda,
            },
            volume,
        }
    }

    fn bind() -> VolumeSource {
        VolumeSource::Bind {
            host_path: PathBuf::from("/var/run/mesos/isolators/gpu/nvidia_550.54.14"),
        }
    }

    fn labelled(labels: &[(&str, &str)]) -> ImageInfo {
        ImageInfo {
            labels: labels
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            env: Vec::new(),
        }
    }

    #[test]
    fn a_plain_image_gets_its_devices_in_minor_order_and_the_variables_only() {
        let (a, b) = (gpu(0, 3), gpu(1, 1));
        let plan = plan(
            &[&a, &b],
            &ImageInfo::default(),
            Some(&driver(None, bind())),
        )
        .expect("plan");
        assert_eq!(
            plan.cli_args(),
            [
                "--device=/dev/nvidiactl",
                "--device=/dev/nvidia-uvm",
                "--device=/dev/nvidia1",
                "--device=/dev/nvidia3",
                &format!("--env=NVIDIA_VISIBLE_DEVICES={},{}", a.uuid, b.uuid),
                &format!("--env=CUDA_VISIBLE_DEVICES={},{}", a.uuid, b.uuid),
            ]
        );
        assert!(plan.volume.is_none());
    }

    #[test]
    fn uvm_tools_comes_after_uvm_when_present() {
        let a = gpu(0, 0);
        let plan = LaunchPlan::new(&grant(&[&a], true), &ImageInfo::default(), None).expect("plan");
        assert_eq!(
            plan.cli_args()[..4],
            [
                "--device=/dev/nvidiactl",
                "--device=/dev/nvidia-uvm",
                "--device=/dev/nvidia-uvm-tools",
                "--device=/dev/nvidia0"
            ]
        );
    }

    #[test]
    fn labelled_image_gets_bind_volume_and_uuids() {
        let (a, b) = (gpu(1, 1), gpu(0, 0));
        let image = labelled(&[(VOLUMES_NEEDED_LABEL, "nvidia_driver")]);
        let plan = plan(&[&a, &b], &image, Some(&driver(Some((12, 4)), bind()))).expect("plan");
        assert_eq!(
            plan.cli_args(),
            [
                "--device=/dev/nvidiactl",
                "--device=/dev/nvidia-uvm",
                "--device=/dev/nvidia0",
                "--device=/dev/nvidia1",
                "--volume=/var/run/mesos/isolators/gpu/nvidia_550.54.14:/usr/local/nvidia:ro",
                &format!("--env=NVIDIA_VISIBLE_DEVICES={},{}", b.uuid, a.uuid),
                &format!("--env=CUDA_VISIBLE_DEVICES={},{}", b.uuid, a.uuid),
            ]
            .into_iter()
            .map(str::to_owned)
            .chain(
                mesos_gpu_volume::container_env::<&str>(&[])
                    .into_iter()
                    .map(|(k, v)| format!("--env={k}={v}"))
            )
            .collect::<Vec<_>>()
        );
    }

    #[test]
    fn plugin_mode_names_the_versioned_volume() {
        let a = gpu(0, 0);
        let image = labelled(&[(VOLUMES_NEEDED_LABEL, "nvidia_driver")]);
        let spec = driver(
            Some((12, 4)),
            VolumeSource::Plugin {
                plugin: DEFAULT_PLUGIN_NAME.to_owned(),
            },
        );
        let args = plan(&[&a], &image, Some(&spec)).expect("plan").cli_args();
        assert_eq!(
            &args[3..5],
            [
                "--volume-driver=nvidia-docker",
                "--volume=nvidia_driver_550.54.14:/usr/local/nvidia:ro"
            ]
        );
    }

    #[test]
    fn visible_devices_env_asks_for_the_driver_unless_empty_or_void() {
        for (value, wanted) in [
            ("all", true),
            ("0,1", true),
            ("none", true),
            ("", false),
            ("void", false),
        ] {
            let image = ImageInfo {
                env: vec![format!("NVIDIA_VISIBLE_DEVICES={value}")],
                ..Default::default()
            };
            assert_eq!(
                image.wants_driver(),
                wanted,
                "NVIDIA_VISIBLE_DEVICES={value:?}"
            );
        }
        let unset = ImageInfo {
            env: vec!["NVIDIA_VISIBLE_DEVICESX=all".to_owned()],
            ..Default::default()
        };
        assert!(!unset.wants_driver());
        // An explicit `void` wins over the label: Mesos reads the variable first.
        let both = ImageInfo {
            env: vec!["NVIDIA_VISIBLE_DEVICES=void".to_owned()],
            labels: [(VOLUMES_NEEDED_LABEL.to_owned(), "nvidia_driver".to_owned())].into(),
        };
        assert!(!both.wants_driver());
        assert!(labelled(&[(VOLUMES_NEEDED_LABEL, "nvidia_driver")]).wants_driver());
        assert!(!labelled(&[("com.ati.volumes.needed", "ati_driver")]).wants_driver());
    }

    #[test]
    fn image_value_of_visible_devices_is_overridden() {
        let a = gpu(0, 0);
        let image = ImageInfo {
            env: vec!["NVIDIA_VISIBLE_DEVICES=all".to_owned()],
            ..Default::default()
        };
        let plan = plan(&[&a], &image, Some(&driver(Some((12, 0)), bind()))).expect("plan");
        assert_eq!(
            plan.env[0],
            (VISIBLE_DEVICES_ENV.to_owned(), a.uuid.clone())
        );
    }

    #[test]
    fn no_device_gets_no_node_and_none() {
        let image = labelled(&[(VOLUMES_NEEDED_LABEL, "nvidia_driver")]);
        let plan = plan(&[], &image, Some(&driver(Some((12, 0)), bind()))).expect("plan");
        assert!(plan.devices.is_empty(), "{:?}", plan.devices);
        assert_eq!(plan.env[0].1, "none");
        assert_eq!(
            plan.env[1],
            ("CUDA_VISIBLE_DEVICES".to_owned(), String::new())
        );
    }

    #[test]
    fn newer_cuda_than_driver_is_refused_naming_both() {
        let image = labelled(&[
            (VOLUMES_NEEDED_LABEL, "nvidia_driver"),
            (CUDA_VERSION_LABEL, "12.4.1"),
        ]);
        let err = plan(&[], &image, Some(&driver(Some((12, 2)), bind()))).expect_err("refused");
        assert!(matches!(err, ArgsError::CudaTooNew { .. }));
        let msg = err.to_string();
        assert!(
            msg.contains("CUDA 12.4") && msg.contains("up to 12.2") && msg.contains("550.54.14"),
            "{msg}"
        );
    }

    #[test]
    fn equal_or_older_cuda_is_accepted() {
        for label in ["12.4", "12.4.1", "11.8", "9.0"] {
            let image = labelled(&[
                (VOLUMES_NEEDED_LABEL, "nvidia_driver"),
                (CUDA_VERSION_LABEL, label),
            ]);
            plan(&[], &image, Some(&driver(Some((12, 4)), bind())))
                .unwrap_or_else(|e| panic!("{label}: {e}"));
        }
    }

    #[test]
    fn cuda_label_on_image_not_asking_for_the_driver_is_ignored() {
        let image = labelled(&[(CUDA_VERSION_LABEL, "99.0")]);
        plan(&[], &image, None).expect("no driver needed");
    }

    #[test]
    fn unknown_driver_cuda_is_refused() {
        let image = labelled(&[
            (VOLUMES_NEEDED_LABEL, "nvidia_driver"),
            (CUDA_VERSION_LABEL, "10.0"),
        ]);
        let err = plan(&[], &image, Some(&driver(None, bind()))).expect_err("refused");
        assert!(matches!(err, ArgsError::CudaUnknown { .. }), "{err}");
    }

    #[test]
    fn bad_cuda_label_names_the_value() {
        for bad in [
            "",
            "12",
            "12.",
            ".4",
            "12.4.1.0",
            "v12.4",
            "12.x",
            "-1.0",
            "12.4 beta",
        ] {
            let err = CudaVersion::parse(bad).expect_err(bad);
            assert!(err.to_string().contains(&format!("{bad:?}")), "{err}");
        }
        assert_eq!(
            CudaVersion::parse("12.10").expect("ok"),
            CudaVersion {
                major: 12,
                minor: 10
            }
        );
        assert!(CudaVersion::parse("12.10").expect("ok") > CudaVersion::parse("12.9").expect("ok"));
    }

    #[test]
    fn no_driver_for_an_image_that_asks_is_an_error() {
        let image = labelled(&[(VOLUMES_NEEDED_LABEL, "nvidia_driver")]);
        let err = plan(&[], &image, None).expect_err("refused");
        assert!(matches!(err, ArgsError::NoDriver));
    }

    #[test]
    fn other_dev_root_maps_host_to_container_paths() {
        let a = gpu(0, 2);
        let nodes = nodes_at("/tmp/devs", &[&a], false);
        let grant = Grant::new(&nodes, &[], vec![a.clone()], vec![], None).expect("grant");
        let plan = LaunchPlan::new(&grant, &ImageInfo::default(), None).expect("plan");
        assert_eq!(
            plan.cli_args()[..3],
            [
                "--device=/tmp/devs/nvidiactl:/dev/nvidiactl",
                "--device=/tmp/devs/nvidia-uvm:/dev/nvidia-uvm",
                "--device=/tmp/devs/nvidia2:/dev/nvidia2"
            ]
        );
    }

    #[test]
    fn paths_docker_cannot_carry_are_refused() {
        let a = gpu(0, 0);
        let nodes = nodes_at("/tmp/a:b", &[&a], false);
        let grant = Grant::new(&nodes, &[], vec![a.clone()], vec![], None).expect("grant");
        let err = LaunchPlan::new(&grant, &ImageInfo::default(), None).expect_err("colon");
        assert!(matches!(err, ArgsError::UnusablePath { .. }));
        let rel = VolumeSource::Bind {
            host_path: PathBuf::from("relative/dir"),
        };
        assert!(VolumeMount::new(&rel, "1.0").is_err());
    }

    #[test]
    fn a_gpu_without_a_device_node_is_refused() {
        let a = gpu(4, 9);
        let grant =
            Grant::new(&nodes_at("/dev", &[], false), &[], vec![a], vec![], None).expect("grant");
        let err = LaunchPlan::new(&grant, &ImageInfo::default(), None).expect_err("no node");
        assert!(
            matches!(err, ArgsError::Grant(GrantError::MissingNode { index: 4 })),
            "{err}"
        );
    }

    #[test]
    fn image_path_is_extended_not_replaced() {
        let image = ImageInfo {
            env: vec![
                "PATH=/opt/bin:/bin".to_owned(),
                "NVIDIA_VISIBLE_DEVICES=all".to_owned(),
            ],
            ..Default::default()
        };
        let plan = plan(&[], &image, Some(&driver(Some((12, 0)), bind()))).expect("plan");
        let path = plan
            .env
            .iter()
            .find(|(k, _)| k == "PATH")
            .map(|(_, v)| v.as_str());
        assert_eq!(path, Some("/opt/bin:/bin:/usr/local/nvidia/bin"));
    }

    #[test]
    fn a_launch_is_versioned_json_and_reads_back() {
        let a = gpu(0, 0);
        let pinning = Pinning {
            cpus: "0-3,8".parse().expect("list"),
            mems: Some("0".parse().expect("list")),
        };
        let launch = DockerLaunch::new(
            &grant(&[&a], false).pinned(Some(pinning)),
            Some(&driver(Some((12, 4)), bind())),
        )
        .expect("launch")
        .named("mesos-x".to_owned());
        let json = serde_json::to_value(&launch).expect("json");
        assert_eq!(json["version"], 1);
        assert_eq!(json["name"], "mesos-x");
        assert_eq!(json["devices"][2]["host"], "/dev/nvidia0");
        assert_eq!(json["env"][0][0], VISIBLE_DEVICES_ENV);
        assert_eq!(
            json["cpuset"],
            serde_json::json!({"cpus": "0-3,8", "mems": "0"})
        );
        assert_eq!(
            json["driver"],
            serde_json::json!({
                "version": "550.54.14",
                "cuda": "12.4",
                "volume": {
                    "kind": "bind",
                    "host_path": "/var/run/mesos/isolators/gpu/nvidia_550.54.14"
                }
            })
        );
        let back = DockerLaunch::parse(&json.to_string()).expect("parse");
        assert_eq!(back, launch);
    }

    #[test]
    fn a_launch_of_another_version_or_shape_is_refused() {
        let err = DockerLaunch::parse(r#"{"version":2,"anything":[]}"#).expect_err("v2");
        assert!(matches!(err, ArgsError::LaunchVersion { got: 2 }), "{err}");
        assert!(err.to_string().contains("version 1"), "{err}");
        let err = DockerLaunch::parse(r#"["--device=/dev/nvidia0"]"#).expect_err("array");
        assert!(matches!(err, ArgsError::LaunchJson { .. }), "{err}");
        let bad_cpuset = r#"{"version":1,"name":null,"devices":[],"env":[],"binds":[],
            "cpuset":{"cpus":"x","mems":null},"driver":null}"#;
        let err = DockerLaunch::parse(bad_cpuset).expect_err("cpuset");
        assert!(
            mesos_gpu_os::error_chain(&err).contains("\"x\""),
            "{}",
            mesos_gpu_os::error_chain(&err)
        );
    }

    #[test]
    fn an_image_not_known_gets_the_volume_and_variables_but_no_path() {
        let a = gpu(0, 0);
        let launch =
            DockerLaunch::new(&grant(&[&a], false), Some(&driver(None, bind()))).expect("launch");
        let plan = launch.render(None).expect("plan");
        assert!(plan.volume.is_some());
        let names: Vec<&str> = plan.env.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(names, [VISIBLE_DEVICES_ENV, "CUDA_VISIBLE_DEVICES"]);
        // Not known, so no CUDA label to refuse; a node without a driver has no volume to give.
        let bare = DockerLaunch::new(&grant(&[&a], false), None).expect("launch");
        assert!(matches!(bare.render(None), Err(ArgsError::NoDriver)));
    }

    #[test]
    fn a_plain_image_keeps_the_cpuset_and_variables_and_gets_no_volume() {
        let a = gpu(0, 0);
        let pinning = Pinning {
            cpus: "0-1".parse().expect("list"),
            mems: Some("0".parse().expect("list")),
        };
        let launch = DockerLaunch::new(
            &grant(&[&a], false).pinned(Some(pinning)),
            Some(&driver(Some((12, 4)), bind())),
        )
        .expect("launch");
        let args = launch
            .render(Some(&ImageInfo::default()))
            .expect("plan")
            .cli_args();
        assert_eq!(
            args[3..],
            [
                format!("--env=NVIDIA_VISIBLE_DEVICES={}", a.uuid),
                format!("--env=CUDA_VISIBLE_DEVICES={}", a.uuid),
                "--cpuset-cpus=0-1".to_owned(),
                "--cpuset-mems=0".to_owned(),
            ]
        );
    }

    proptest! {
        #[test]
        fn args_are_stable_and_sorted(minors in proptest::collection::btree_set(0u32..64, 0..8)) {
            let gpus: Vec<Gpu> = minors.iter().rev().enumerate().map(|(i, m)| gpu(u32::try_from(i).expect("small"), *m)).collect();
            let refs: Vec<&Gpu> = gpus.iter().collect();
            let args = LaunchPlan::new(&grant(&refs, true), &ImageInfo::default(), None).expect("plan").cli_args();
            let devices: Vec<&String> = args.iter().filter(|a| a.starts_with("--device=")).collect();
            prop_assert_eq!(devices.len(), if minors.is_empty() { 0 } else { 3 + minors.len() });
            let got: Vec<u32> = devices.iter().skip(3)
                .map(|a| a.trim_start_matches("--device=/dev/nvidia").parse().expect("minor"))
                .collect();
            prop_assert_eq!(got, minors.iter().copied().collect::<Vec<_>>());
        }

        #[test]
        fn cuda_parse_round_trips(major in 0u32..1000, minor in 0u32..1000, patch in proptest::option::of(0u32..1000)) {
            let text = match patch { Some(p) => format!("{major}.{minor}.{p}"), None => format!("{major}.{minor}") };
            let v = CudaVersion::parse(&text).expect("valid");
            prop_assert_eq!(v, CudaVersion { major, minor });
            prop_assert_eq!(v.to_string(), format!("{major}.{minor}"));
        }

        #[test]
        fn cuda_parse_never_panics(s in ".*") {
            let _ = CudaVersion::parse(&s);
        }
    }
}
