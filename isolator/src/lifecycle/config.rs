//! How the isolator is configured, and the cgroup layout that follows from it.
//!
//! Defaults are Mesos's (`docs/reference/mesos-gpu-isolator.md` §1.1): the v1 root
//! `/sys/fs/cgroup`, the hierarchy Mesos would use ([`CgroupMounts::hierarchy`]: cgroup2 when it is
//! mounted at `/sys/fs/cgroup`, else v1 `devices`), the cgroups root `mesos`, and the default
//! device whitelist of its `cgroups/devices` isolator (§5.1).

use std::path::{Path, PathBuf};
use std::str::FromStr;

use super::LifecycleError;
use mesos_gpu_enforce::{
    cgroup::CgroupError, cgroup::CgroupLayout, cgroup::CgroupMounts, cgroup::CgroupVersion,
    cgroup::DeviceRule, cgroup::Hierarchy, cgroup::MESOS_CGROUP2_MOUNT, cgroup::default_whitelist,
};
use mesos_gpu_placement::allocator::Policy;

/// Who makes each container's device cgroup.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CgroupMaker {
    /// The isolator makes `<cgroups root>/<id>` at `prepare`, moves the container's process
    /// into it at `isolate` and removes it at `cleanup` (`mesos-gpu exec`, and a cgroup v1 agent
    /// without `cgroups/devices`, where Mesos makes no devices cgroup).
    #[default]
    Own,
    /// Mesos's containerizer makes the container's cgroup before `prepare` (on v1 its
    /// `cgroups/devices` isolator, on v2 its cgroups isolator with the linux launcher, which
    /// also places the process there); the isolator adds its device rules to that cgroup (v1) or
    /// attaches its device program to it (v2), and never moves a process or removes the cgroup.
    Mesos,
}

impl CgroupMaker {
    /// The word used for it in module parameters.
    pub fn word(self) -> &'static str {
        match self {
            CgroupMaker::Own => "own",
            CgroupMaker::Mesos => "mesos",
        }
    }
}

impl std::fmt::Display for CgroupMaker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.word())
    }
}

/// Which cgroup interface to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CgroupChoice {
    /// v1 `devices` when mounted, else cgroup2 (`CgroupMounts::hierarchy`).
    #[default]
    Auto,
    /// cgroups v1 `devices` under [`IsolatorConfig::v1_root`].
    V1,
    /// cgroup2 at [`IsolatorConfig::v2_mount`] (or the mounted one).
    V2,
}

impl FromStr for CgroupChoice {
    type Err = LifecycleError;

    fn from_str(s: &str) -> Result<CgroupChoice, LifecycleError> {
        match s {
            "auto" => Ok(CgroupChoice::Auto),
            "v1" => Ok(CgroupChoice::V1),
            "v2" => Ok(CgroupChoice::V2),
            _ => Err(LifecycleError::UnknownCgroupChoice { got: s.to_owned() }),
        }
    }
}

impl FromStr for CgroupMaker {
    type Err = LifecycleError;

    fn from_str(s: &str) -> Result<CgroupMaker, LifecycleError> {
        match s {
            "own" => Ok(CgroupMaker::Own),
            "mesos" => Ok(CgroupMaker::Mesos),
            _ => Err(LifecycleError::UnknownCgroupMaker { got: s.to_owned() }),
        }
    }
}

/// How the isolator is set up.
#[derive(Debug, Clone)]
pub struct IsolatorConfig {
    /// How GPUs are chosen.
    pub policy: Policy,
    /// Only these NVML indices are offered (`--nvidia_gpu_devices`); `None` offers all.
    pub devices: Option<Vec<u32>>,
    /// Which cgroup interface to use.
    pub cgroup_version: CgroupChoice,
    /// The cgroups v1 root (the `devices` hierarchy is `<root>/devices`).
    pub v1_root: PathBuf,
    /// The cgroup2 mount; `None` finds it in the mount table.
    pub v2_mount: Option<PathBuf>,
    /// The parent of container cgroups (Mesos `--cgroups_root`).
    pub cgroups_root: String,
    /// Who makes the container cgroups.
    pub cgroup_maker: CgroupMaker,
    /// Where the checkpoint lives (`<work_dir>/gpu/allocations.json`).
    pub work_dir: PathBuf,
    /// Host path of the `nvidia_<version>` driver volume, when one exists.
    pub driver_volume: Option<PathBuf>,
    /// The base allow list of every container (Mesos's default whitelist plus `--allowed_devices`).
    pub allowed_devices: Vec<DeviceRule>,
    /// NUMA pinning (off by default).
    pub pinning: super::PinningConfig,
    /// The node's GPU pool to draw from; `None` keeps every reservation in this isolator's
    /// own checkpoint (a pool of its own).
    pub pool: Option<super::PoolConfig>,
    /// GPU sharing (replicas); `None` hands out whole GPUs only. Needs `pool`.
    pub sharing: Option<super::SharingConfig>,
    /// How MIG devices are handed out (on a node with GPUs in MIG mode).
    pub mig: super::MigConfig,
    /// Decide and record, act on nothing: no cgroup is made or joined, no MPS daemon started
    /// (an MPS share is told the pipe directory its daemon would have), no cpuset written.
    /// [`Isolator::prepare`](super::Isolator::prepare) and the Docker reservations return what
    /// a container would get, [`Isolator::cleanup`](super::Isolator::cleanup) gives it back,
    /// `isolate` and `update` refuse (the container has no cgroup): `mesos-gpu demo`'s dry run
    /// asks this isolator for its plan.
    pub dry_run: bool,
}

impl IsolatorConfig {
    /// Mesos's defaults (topology policy, auto cgroups, `/sys/fs/cgroup`, `mesos`) with the
    /// checkpoint under `work_dir`.
    pub fn new(work_dir: impl Into<PathBuf>) -> IsolatorConfig {
        IsolatorConfig {
            policy: Policy::default(),
            devices: None,
            cgroup_version: CgroupChoice::Auto,
            v1_root: PathBuf::from("/sys/fs/cgroup"),
            v2_mount: None,
            cgroups_root: mesos_gpu_enforce::cgroup::DEFAULT_PARENT.to_owned(),
            cgroup_maker: CgroupMaker::Own,
            work_dir: work_dir.into(),
            driver_volume: None,
            allowed_devices: default_whitelist(),
            pinning: super::PinningConfig::default(),
            pool: None,
            sharing: None,
            mig: super::MigConfig::default(),
            dry_run: false,
        }
    }
}

impl IsolatorConfig {
    /// The hierarchy this configuration uses, `auto` resolved from this process's mount table.
    pub fn hierarchy(&self) -> Result<Hierarchy, CgroupError> {
        hierarchy(self)
    }
}

/// The container cgroup layout the configuration asks for.
pub(crate) fn layout(config: &IsolatorConfig) -> Result<CgroupLayout, CgroupError> {
    CgroupLayout::new(hierarchy(config)?, &config.cgroups_root)
}

fn hierarchy(config: &IsolatorConfig) -> Result<Hierarchy, CgroupError> {
    Ok(match config.cgroup_version {
        CgroupChoice::Auto => CgroupMounts::read()?.hierarchy(Path::new(MESOS_CGROUP2_MOUNT))?,
        CgroupChoice::V1 => Hierarchy {
            version: CgroupVersion::V1,
            mount: config.v1_root.join("devices"),
        },
        CgroupChoice::V2 => {
            let mount = match &config.v2_mount {
                Some(mount) => mount.clone(),
                None => CgroupMounts::read()?.v2.ok_or(CgroupError::NoHierarchy)?,
            };
            Hierarchy {
                version: CgroupVersion::V2,
                mount,
            }
        }
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use mesos_gpu_node::devices::DeviceNodes;
    use mesos_gpu_node::inventory::Inventory;

    #[test]
    fn cgroup_choice_names() {
        assert_eq!("v1".parse::<CgroupChoice>().unwrap(), CgroupChoice::V1);
        assert_eq!("auto".parse::<CgroupChoice>().unwrap(), CgroupChoice::Auto);
        let err = "v3".parse::<CgroupChoice>().unwrap_err();
        assert_eq!(
            err.to_string(),
            "cgroup version \"v3\": expected one of auto, v1, v2"
        );
    }

    #[test]
    fn cgroup_maker_names() {
        assert_eq!("own".parse::<CgroupMaker>().unwrap(), CgroupMaker::Own);
        assert_eq!("mesos".parse::<CgroupMaker>().unwrap(), CgroupMaker::Mesos);
        let err = "agent".parse::<CgroupMaker>().unwrap_err();
        assert_eq!(
            err.to_string(),
            "container cgroups \"agent\": expected one of mesos, own"
        );
        assert_eq!(CgroupMaker::default(), CgroupMaker::Own);
    }

    #[test]
    fn bad_cgroups_root_is_refused_before_anything_is_made() {
        let dir = tempfile::tempdir().unwrap();
        let mut config = IsolatorConfig::new(dir.path());
        config.cgroup_version = CgroupChoice::V1;
        config.cgroups_root = "../escape".into();
        let err = super::super::Isolator::new(config, Inventory::default(), DeviceNodes::default())
            .unwrap_err();
        assert!(
            matches!(
                err,
                LifecycleError::Setup {
                    source: CgroupError::InvalidParent { .. }
                }
            ),
            "{err}"
        );
        assert!(!dir.path().join("gpu").exists());
    }
}
