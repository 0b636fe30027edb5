//! The module parameters (`mesos.Parameters` from `modules.json`) and what they set up.
//!
//! Every key is optional but `work_dir`; an unknown key is an error naming it and listing the
//! accepted ones (a typo must not silently fall back to a default on a production agent).
//! Defaults are Mesos's where Mesos has one. The keys are documented in `ffi/README.md`.

use std::path::{Path, PathBuf};

use mesos_gpu_isolator::allocator::{AllocError, Policy};
use mesos_gpu_isolator::devices::DevicesError;
use mesos_gpu_isolator::discovery::{DEFAULT_NVML_LIB, DiscoveryError};
use mesos_gpu_isolator::health::{HealthPolicy, PolicyError};
use mesos_gpu_isolator::lifecycle::{CgroupChoice, IsolatorConfig, LifecycleError};
use mesos_gpu_volume::{DriverVersion, LdCache, VolumeManager};

use crate::proto::mesos::Parameters;

/// The keys accepted, in the order error messages list them.
pub const KEYS: &[&str] = &[
    "work_dir",
    "nvml_lib",
    "dev_root",
    "policy",
    "nvidia_gpu_devices",
    "cgroup_version",
    "cgroups_hierarchy",
    "cgroup2_mount",
    "cgroups_root",
    "volume_root",
    "driver_root",
    "driver_volume",
    "health_checks",
    #[cfg(feature = "testing")]
    "debug_panic_on",
];

/// Why the module could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum ParamError {
    /// A key that is not a module parameter.
    #[error("unknown module parameter {key:?}: expected one of {}", KEYS.join(", "))]
    UnknownKey {
        /// The key given.
        key: String,
    },
    /// A key given twice.
    #[error("module parameter {key:?} is given twice")]
    Duplicate {
        /// The key.
        key: String,
    },
    /// A required key is missing.
    #[error("module parameter {key:?} is required")]
    Missing {
        /// The key.
        key: &'static str,
    },
    /// A value that is not accepted.
    #[error("module parameter {key}={got:?}: expected {expected}")]
    BadValue {
        /// The key.
        key: &'static str,
        /// The value given.
        got: String,
        /// What is accepted.
        expected: &'static str,
    },
    /// The allocation policy is unknown.
    #[error("module parameter policy")]
    Policy {
        /// Why.
        #[source]
        source: AllocError,
    },
    /// The health-check specification is refused.
    #[error("module parameter health_checks")]
    HealthChecks {
        /// Why (names the value and the accepted forms).
        #[source]
        source: PolicyError,
    },
    /// NVML could not be opened.
    #[error("cannot discover GPUs")]
    Discovery {
        /// Why.
        #[source]
        source: DiscoveryError,
    },
    /// NVML is not there: a GPU isolator on a node without an NVIDIA driver is refused, as in
    /// Mesos (`NVML is not available`).
    #[error("cannot create the GPU isolator: NVML is not available ({reason})")]
    NoDriver {
        /// Why discovery found no driver.
        reason: String,
    },
    /// The device nodes are not usable.
    #[error("cannot use the NVIDIA device nodes under {dev_root}")]
    Devices {
        /// The device root.
        dev_root: PathBuf,
        /// Why.
        #[source]
        source: DevicesError,
    },
    /// The driver volume could not be built.
    #[error("cannot build the driver volume under {volume_root} from {driver_root}")]
    Volume {
        /// The volume root.
        volume_root: PathBuf,
        /// The driver root.
        driver_root: PathBuf,
        /// Why.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The isolator refused its configuration.
    #[error("cannot create the GPU isolator")]
    Isolator {
        /// Why.
        #[source]
        source: LifecycleError,
    },
}

impl ParamError {
    /// True when the parameters themselves are wrong (as opposed to the host).
    pub fn is_bad_value(&self) -> bool {
        matches!(
            self,
            ParamError::UnknownKey { .. }
                | ParamError::Duplicate { .. }
                | ParamError::Missing { .. }
                | ParamError::BadValue { .. }
                | ParamError::Policy { .. }
                | ParamError::HealthChecks { .. }
        )
    }
}

/// What to do about the `nvidia_<version>` driver volume.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DriverVolume {
    /// Use `<volume_root>/nvidia_<version>` when it exists; warn and mount none otherwise.
    Existing,
    /// Build it from `driver_root` at start when missing (as Mesos does); failure is fatal.
    Build,
    /// Never mount the driver volume.
    Off,
}

/// The module parameters, checked.
#[derive(Debug, Clone)]
pub struct ModuleParams {
    /// The isolator's configuration.
    pub isolator: IsolatorConfig,
    /// The NVML library to load.
    pub nvml_lib: PathBuf,
    /// Where the NVIDIA device nodes are.
    pub dev_root: PathBuf,
    /// Where driver volumes live.
    pub volume_root: PathBuf,
    /// The root of the driver's files, for building the volume.
    pub driver_root: PathBuf,
    /// What to do about the driver volume.
    pub driver_volume: DriverVolume,
    /// Which GPU events count as a failure (`health_checks`; default: [`HealthPolicy::new`]).
    pub health_checks: HealthPolicy,
    /// The call that panics on purpose (`testing` builds only).
    #[cfg(feature = "testing")]
    pub debug_panic_on: Option<String>,
}

impl ModuleParams {
    /// Checks `params`.
    pub fn parse(params: &Parameters) -> Result<ModuleParams, ParamError> {
        let mut seen: Vec<&str> = Vec::new();
        for p in &params.parameter {
            if !KEYS.contains(&p.key.as_str()) {
                return Err(ParamError::UnknownKey { key: p.key.clone() });
            }
            if seen.contains(&p.key.as_str()) {
                return Err(ParamError::Duplicate { key: p.key.clone() });
            }
            seen.push(&p.key);
        }
        let get = |key: &str| {
            params
                .parameter
                .iter()
                .find(|p| p.key == key)
                .map(|p| p.value.as_str())
        };
        let path = |key: &str, default: &str| PathBuf::from(get(key).unwrap_or(default));
        let work_dir = get("work_dir").ok_or(ParamError::Missing { key: "work_dir" })?;
        let mut isolator = IsolatorConfig::new(work_dir);
        if let Some(policy) = get("policy") {
            isolator.policy = policy
                .parse::<Policy>()
                .map_err(|source| ParamError::Policy { source })?;
        }
        if let Some(version) = get("cgroup_version") {
            isolator.cgroup_version =
                version
                    .parse::<CgroupChoice>()
                    .map_err(|_| ParamError::BadValue {
                        key: "cgroup_version",
                        got: version.to_owned(),
                        expected: "one of auto, v1, v2",
                    })?;
        }
        if let Some(devices) = get("nvidia_gpu_devices") {
            isolator.devices = Some(parse_indices(devices)?);
        }
        if let Some(root) = get("cgroups_hierarchy") {
            isolator.v1_root = root.into();
        }
        isolator.v2_mount = get("cgroup2_mount").map(PathBuf::from);
        if let Some(name) = get("cgroups_root") {
            isolator.cgroups_root = name.to_owned();
        }
        let driver_volume = match get("driver_volume").unwrap_or("existing") {
            "existing" => DriverVolume::Existing,
            "build" => DriverVolume::Build,
            "off" => DriverVolume::Off,
            other => {
                return Err(ParamError::BadValue {
                    key: "driver_volume",
                    got: other.to_owned(),
                    expected: "one of existing, build, off",
                });
            }
        };
        let health_checks = get("health_checks")
            .map(HealthPolicy::parse)
            .transpose()
            .map_err(|source| ParamError::HealthChecks { source })?
            .unwrap_or_default();
        Ok(ModuleParams {
            isolator,
            nvml_lib: path("nvml_lib", DEFAULT_NVML_LIB),
            dev_root: path("dev_root", "/dev"),
            volume_root: path("volume_root", mesos_gpu_volume::volume::DEFAULT_ROOT),
            driver_root: path("driver_root", "/"),
            driver_volume,
            health_checks,
            #[cfg(feature = "testing")]
            debug_panic_on: get("debug_panic_on").map(str::to_owned),
        })
    }

    /// The host path of the driver volume to mount, per [`DriverVolume`], for driver `version`.
    pub fn resolve_volume(&self, version: &str) -> Result<Option<PathBuf>, ParamError> {
        if self.driver_volume == DriverVolume::Off {
            return Ok(None);
        }
        let volume_err = |source: Box<dyn std::error::Error + Send + Sync>| ParamError::Volume {
            volume_root: self.volume_root.clone(),
            driver_root: self.driver_root.clone(),
            source,
        };
        let parsed: DriverVersion = version.parse().map_err(|e| volume_err(Box::new(e)))?;
        let manager = VolumeManager::at(&self.volume_root);
        let path = manager.volume_path(&parsed);
        if path.is_dir() {
            return Ok(Some(path));
        }
        if self.driver_volume == DriverVolume::Existing {
            tracing::warn!(
                volume = %path.display(),
                "no driver volume: images asking for /usr/local/nvidia get none (build it with `mesos-gpu volume create`)"
            );
            return Ok(None);
        }
        let cache = LdCache::load(&self.driver_root).map_err(|e| volume_err(Box::new(e)))?;
        let plan = manager
            .plan(&self.driver_root, &cache, &parsed)
            .map_err(|e| volume_err(Box::new(e)))?;
        let volume = manager.create(&plan).map_err(|e| volume_err(Box::new(e)))?;
        tracing::info!(volume = %volume.path.display(), "built the driver volume");
        Ok(Some(volume.path))
    }

    /// The device root.
    pub fn dev_root(&self) -> &Path {
        &self.dev_root
    }
}

fn parse_indices(text: &str) -> Result<Vec<u32>, ParamError> {
    text.split(',')
        .map(|s| s.trim().parse::<u32>())
        .collect::<Result<Vec<u32>, _>>()
        .map_err(|_| ParamError::BadValue {
            key: "nvidia_gpu_devices",
            got: text.to_owned(),
            expected: "NVML indices separated by commas, e.g. 0,1,3",
        })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::proto::mesos::Parameter;

    fn params(pairs: &[(&str, &str)]) -> Parameters {
        Parameters {
            parameter: pairs
                .iter()
                .map(|(k, v)| Parameter {
                    key: (*k).into(),
                    value: (*v).into(),
                })
                .collect(),
        }
    }

    #[test]
    fn defaults_are_mesos_defaults() {
        let p = ModuleParams::parse(&params(&[("work_dir", "/w")])).unwrap();
        assert_eq!(p.isolator.work_dir, PathBuf::from("/w"));
        assert_eq!(p.isolator.cgroups_root, "mesos");
        assert_eq!(p.isolator.policy, Policy::Topology);
        assert_eq!(p.dev_root, PathBuf::from("/dev"));
        assert_eq!(p.nvml_lib, PathBuf::from(DEFAULT_NVML_LIB));
        assert_eq!(p.driver_volume, DriverVolume::Existing);
        assert_eq!(p.health_checks, HealthPolicy::new());
    }

    #[test]
    fn every_key_is_read() {
        let p = ModuleParams::parse(&params(&[
            ("work_dir", "/w"),
            ("policy", "first-fit"),
            ("cgroup_version", "v2"),
            ("cgroup2_mount", "/cg2"),
            ("cgroups_hierarchy", "/cg1"),
            ("cgroups_root", "m2"),
            ("nvidia_gpu_devices", "0, 2"),
            ("driver_volume", "off"),
            ("dev_root", "/d"),
            ("nvml_lib", "/lib/nvml.so"),
            ("health_checks", "all,+79"),
        ]))
        .unwrap();
        assert_eq!(p.isolator.policy, Policy::FirstFit);
        assert_eq!(p.isolator.cgroup_version, CgroupChoice::V2);
        assert_eq!(p.isolator.v2_mount, Some(PathBuf::from("/cg2")));
        assert_eq!(p.isolator.v1_root, PathBuf::from("/cg1"));
        assert_eq!(p.isolator.cgroups_root, "m2");
        assert_eq!(p.isolator.devices, Some(vec![0, 2]));
        assert_eq!(p.driver_volume, DriverVolume::Off);
        assert_eq!(p.health_checks, HealthPolicy::parse("all,+79").unwrap());
        assert_eq!(p.resolve_volume("550.54.14").unwrap(), None);
    }

    #[test]
    fn unknown_key_is_named_with_the_accepted_ones() {
        let err = ModuleParams::parse(&params(&[("work_dir", "/w"), ("polcy", "x")])).unwrap_err();
        let text = err.to_string();
        assert!(
            text.starts_with(
                "unknown module parameter \"polcy\": expected one of work_dir, nvml_lib"
            ),
            "{text}"
        );
        assert!(err.is_bad_value());
    }

    #[test]
    fn bad_values_are_refused() {
        let err = ModuleParams::parse(&params(&[])).unwrap_err();
        assert_eq!(err.to_string(), "module parameter \"work_dir\" is required");
        let err = ModuleParams::parse(&params(&[("work_dir", "/w"), ("cgroup_version", "v3")]))
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "module parameter cgroup_version=\"v3\": expected one of auto, v1, v2"
        );
        let err = ModuleParams::parse(&params(&[
            ("work_dir", "/w"),
            ("nvidia_gpu_devices", "0,x"),
        ]))
        .unwrap_err();
        assert!(err.to_string().contains("NVML indices"), "{err}");
        let err =
            ModuleParams::parse(&params(&[("work_dir", "/w"), ("work_dir", "/v")])).unwrap_err();
        assert_eq!(
            err.to_string(),
            "module parameter \"work_dir\" is given twice"
        );
        let err =
            ModuleParams::parse(&params(&[("work_dir", "/w"), ("policy", "best")])).unwrap_err();
        assert!(err.is_bad_value());
        let err = ModuleParams::parse(&params(&[
            ("work_dir", "/w"),
            ("health_checks", "79,bogus"),
        ]))
        .unwrap_err();
        assert!(err.is_bad_value());
        let chain = format!("{err}: {}", std::error::Error::source(&err).unwrap());
        assert!(
            chain.starts_with(
                "module parameter health_checks: health checks \"79,bogus\": bad token \"bogus\""
            ),
            "{chain}"
        );
    }

    #[test]
    fn existing_volume_is_used_only_when_present() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().to_str().unwrap();
        let p = ModuleParams::parse(&params(&[("work_dir", "/w"), ("volume_root", root)])).unwrap();
        assert_eq!(p.resolve_volume("550.54.14").unwrap(), None);
        std::fs::create_dir(dir.path().join("nvidia_550.54.14")).unwrap();
        assert_eq!(
            p.resolve_volume("550.54.14").unwrap(),
            Some(dir.path().join("nvidia_550.54.14"))
        );
    }
}
