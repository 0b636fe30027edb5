//! The module's parameters (`modules.json`), checked: the one parser of them, used by the
//! module when the agent loads it (`ffi`'s `ModuleParams::parse`), by `mesos-gpu agent-flags`
//! before it prints `--modules`, and by `mesos-gpu doctor --modules`, so that a parameter the
//! module would refuse is refused before the agent starts, with the module's own words.
//!
//! Every key is optional but `work_dir`; an unknown key is an error naming it and listing the
//! accepted ones (a typo must not silently fall back to a default on a production agent), and
//! so is a key given twice. Defaults are Mesos's where Mesos has one. The keys are documented in
//! `ffi/README.md`. Only the values are checked here; what needs the host (NVML, the device
//! nodes, the driver volume, the running agent's flags) is the module's, at start.

use std::path::PathBuf;

use mesos_gpu_enforce::mps::{DEFAULT_ROOT as DEFAULT_MPS_ROOT, MpsConfig, PROGRAM as MPS_CONTROL};
use mesos_gpu_health::{
    HealthPolicy, PolicyError, ProbeConfig, ProbeError, QuietTimes, RecoveryConfig, RecoveryError,
    parse_duration, probe::DEFAULT_PROBE, probe::DEFAULT_PROBE_TIMEOUT,
};
use mesos_gpu_node::discovery::DEFAULT_NVML_LIB;
use mesos_gpu_placement::allocator::{AllocError, Policy};
use mesos_gpu_placement::sharing::{ModeSpec, SharingError, SharingSpec};
use mesos_gpu_pool::DEFAULT_POOL_DIR;

use super::ModuleParameters;
use crate::lifecycle::{
    CgroupChoice, CgroupMaker, IsolatorConfig, PoolConfig, PoolRole, SharingConfig,
};

/// The keys the module accepts, in the order error messages list them.
pub const MODULE_KEYS: &[&str] = &[
    "work_dir",
    "pool_dir",
    "nvml_lib",
    "dev_root",
    "policy",
    "nvidia_gpu_devices",
    "cgroup_version",
    "cgroups_hierarchy",
    "cgroup2_mount",
    "cgroups_root",
    "container_cgroups",
    "volume_root",
    "driver_root",
    "driver_volume",
    "health_checks",
    "health_recovery",
    "health_quiet",
    "health_retry",
    "health_probe",
    "health_probe_timeout",
    "numa_pinning",
    "gpu_replicas",
    "gpu_sharing",
    "mps_root",
    "mps_control",
    "mig_strategy",
    "mig_allow_multiple",
    "mig_allow_sys_admin",
    "proc_root",
];

/// Why the module's parameters are refused.
#[derive(Debug, thiserror::Error)]
pub enum ModuleParamError {
    /// A key that is not a module parameter.
    #[error("unknown module parameter {key:?}: expected one of {}", MODULE_KEYS.join(", "))]
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
    /// The GPU sharing parameters are refused.
    #[error("module parameters gpu_replicas/gpu_sharing")]
    Sharing {
        /// Why (names the value and the accepted forms).
        #[source]
        source: SharingError,
    },
    /// The health-check specification is refused.
    #[error("module parameter health_checks")]
    HealthChecks {
        /// Why (names the value and the accepted forms).
        #[source]
        source: PolicyError,
    },
    /// The quiet times are refused.
    #[error("module parameter health_quiet")]
    HealthQuiet {
        /// Why (names the value and the accepted forms).
        #[source]
        source: RecoveryError,
    },
    /// The probe command is refused.
    #[error("module parameter health_probe")]
    HealthProbe {
        /// Why.
        #[source]
        source: ProbeError,
    },
}

/// What to do about the `nvidia_<version>` driver volume (`driver_volume`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DriverVolume {
    /// Use `<volume_root>/nvidia_<version>` when it exists; warn and mount none otherwise.
    Existing,
    /// Build it from `driver_root` at start when missing (as Mesos does); failure is fatal.
    Build,
    /// Never mount the driver volume.
    Off,
}

/// The module's parameters, checked ([`ModuleConfig::parse`]).
#[derive(Debug, Clone)]
pub struct ModuleConfig {
    /// The isolator's configuration.
    pub isolator: IsolatorConfig,
    /// The NVML library to load.
    pub nvml_lib: PathBuf,
    /// Where the NVIDIA device nodes are.
    pub dev_root: PathBuf,
    /// Where the driver's `/proc` files are (`devices`, `driver/nvidia-caps`, capabilities).
    pub proc_root: PathBuf,
    /// Where driver volumes live.
    pub volume_root: PathBuf,
    /// The root of the driver's files, for building the volume.
    pub driver_root: PathBuf,
    /// What to do about the driver volume.
    pub driver_volume: DriverVolume,
    /// `container_cgroups`: `None` for `auto` (the agent's flags decide; outside an agent, own).
    pub container_cgroups: Option<CgroupMaker>,
    /// True when `cgroups_root` was given.
    pub cgroups_root_given: bool,
    /// True when `cgroups_hierarchy` was given.
    pub cgroups_hierarchy_given: bool,
    /// Which GPU events count as a failure (`health_checks`; default: [`HealthPolicy::new`]).
    pub health_checks: HealthPolicy,
    /// How GPUs come back by themselves (`health_recovery`, `health_quiet`, `health_retry`,
    /// `health_probe`, `health_probe_timeout`); `None` with `health_recovery=off`. The probe
    /// gets its cgroup when the isolator attaches the monitor.
    pub health_recovery: Option<RecoveryConfig>,
}

impl ModuleConfig {
    /// The parameters that decide what the module hands out (its offer), for
    /// [`super::check_agent_resources`].
    pub fn gpus(&self) -> super::ModuleGpus<'_> {
        super::ModuleGpus {
            devices: self.isolator.devices.as_deref(),
            strategy: self.isolator.mig.strategy,
            sharing: self.isolator.sharing.as_ref().map(|s| &s.spec),
        }
    }

    /// Checks `params`: every key known and given once, `work_dir` given, every value one the
    /// module accepts.
    pub fn parse(params: &ModuleParameters) -> Result<ModuleConfig, ModuleParamError> {
        check_keys(params)?;
        let get = |key: &str| params.get(key);
        let path = |key: &str, default: &str| PathBuf::from(get(key).unwrap_or(default));
        let work_dir = get("work_dir").ok_or(ModuleParamError::Missing { key: "work_dir" })?;
        let mut isolator = IsolatorConfig::new(work_dir);
        // The node's one pool, shared with `serve`, `run`, `docker-args` and `exec`.
        isolator.pool = Some(PoolConfig {
            dir: path("pool_dir", DEFAULT_POOL_DIR),
            role: PoolRole::Agent,
        });
        let container_cgroups = gpus_and_cgroups(&get, &mut isolator)?;
        let driver_volume = driver_volume(get("driver_volume").unwrap_or("existing"))?;
        isolator.pinning.enabled = on_off("numa_pinning", get("numa_pinning"))?;
        isolator.sharing = sharing(&get)?;
        mig_config(&get, &mut isolator)?;
        let health_checks = get("health_checks")
            .map(HealthPolicy::parse)
            .transpose()
            .map_err(|source| ModuleParamError::HealthChecks { source })?
            .unwrap_or_default();
        let health_recovery = recovery(&get)?;
        Ok(ModuleConfig {
            isolator,
            nvml_lib: path("nvml_lib", DEFAULT_NVML_LIB),
            dev_root: path("dev_root", "/dev"),
            proc_root: path("proc_root", mesos_gpu_node::discovery::DEFAULT_PROC_ROOT),
            volume_root: path("volume_root", mesos_gpu_volume::volume::DEFAULT_ROOT),
            driver_root: path("driver_root", "/"),
            driver_volume,
            container_cgroups,
            cgroups_root_given: get("cgroups_root").is_some(),
            cgroups_hierarchy_given: get("cgroups_hierarchy").is_some(),
            health_checks,
            health_recovery,
        })
    }
}

/// Refuses a key that is no module parameter, or one given twice.
fn check_keys(params: &ModuleParameters) -> Result<(), ModuleParamError> {
    let mut seen: Vec<&str> = Vec::new();
    for (key, _) in params.entries() {
        if !MODULE_KEYS.contains(&key.as_str()) {
            return Err(ModuleParamError::UnknownKey { key: key.clone() });
        }
        if seen.contains(&key.as_str()) {
            return Err(ModuleParamError::Duplicate { key: key.clone() });
        }
        seen.push(key);
    }
    Ok(())
}

/// Sets the allocation policy, the GPUs offered (`nvidia_gpu_devices`) and the cgroup
/// parameters in `isolator`; returns `container_cgroups` (`None` for `auto`).
fn gpus_and_cgroups<'a>(
    get: &impl Fn(&str) -> Option<&'a str>,
    isolator: &mut IsolatorConfig,
) -> Result<Option<CgroupMaker>, ModuleParamError> {
    if let Some(policy) = get("policy") {
        isolator.policy = policy
            .parse::<Policy>()
            .map_err(|source| ModuleParamError::Policy { source })?;
    }
    if let Some(version) = get("cgroup_version") {
        isolator.cgroup_version =
            version
                .parse::<CgroupChoice>()
                .map_err(|_| ModuleParamError::BadValue {
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
    let container_cgroups = match get("container_cgroups").unwrap_or("auto") {
        "auto" => None,
        other => Some(
            other
                .parse::<CgroupMaker>()
                .map_err(|_| ModuleParamError::BadValue {
                    key: "container_cgroups",
                    got: other.to_owned(),
                    expected: "one of auto, mesos, own",
                })?,
        ),
    };
    if let Some(cgroup_maker) = container_cgroups {
        isolator.cgroup_maker = cgroup_maker;
    }
    Ok(container_cgroups)
}

/// `driver_volume`'s value.
fn driver_volume(value: &str) -> Result<DriverVolume, ModuleParamError> {
    match value {
        "existing" => Ok(DriverVolume::Existing),
        "build" => Ok(DriverVolume::Build),
        "off" => Ok(DriverVolume::Off),
        other => Err(ModuleParamError::BadValue {
            key: "driver_volume",
            got: other.to_owned(),
            expected: "one of existing, build, off",
        }),
    }
}

/// A switch `key` that is `off` unless given as `on`.
fn on_off(key: &'static str, value: Option<&str>) -> Result<bool, ModuleParamError> {
    match value.unwrap_or("off") {
        "off" => Ok(false),
        "on" => Ok(true),
        other => Err(ModuleParamError::BadValue {
            key,
            got: other.to_owned(),
            expected: "one of off, on",
        }),
    }
}

/// The GPU sharing configuration (`gpu_replicas`, `gpu_sharing`, `mps_root`, `mps_control`);
/// `None` without `gpu_replicas`, when none of the others may be given.
fn sharing<'a>(
    get: &impl Fn(&str) -> Option<&'a str>,
) -> Result<Option<SharingConfig>, ModuleParamError> {
    let path = |key: &str, default: &str| PathBuf::from(get(key).unwrap_or(default));
    if let Some(spec) = get("gpu_replicas") {
        let mode = get("gpu_sharing")
            .unwrap_or("time-slicing")
            .parse::<ModeSpec>()
            .map_err(|source| ModuleParamError::Sharing { source })?;
        let spec = SharingSpec::parse(spec, mode)
            .map_err(|source| ModuleParamError::Sharing { source })?;
        let mut mps = MpsConfig::new(path("mps_root", DEFAULT_MPS_ROOT));
        mps.program = path("mps_control", MPS_CONTROL);
        return Ok(Some(SharingConfig { spec, mps }));
    }
    match ["gpu_sharing", "mps_root", "mps_control"]
        .into_iter()
        .find(|k| get(k).is_some())
    {
        Some(key) => Err(ModuleParamError::BadValue {
            key,
            got: get(key).unwrap_or_default().to_owned(),
            expected: "to be given only with gpu_replicas",
        }),
        None => Ok(None),
    }
}

/// Sets the MIG parameters in `isolator` (`mig_strategy`, `mig_allow_multiple`,
/// `mig_allow_sys_admin`).
fn mig_config<'a>(
    get: &impl Fn(&str) -> Option<&'a str>,
    isolator: &mut IsolatorConfig,
) -> Result<(), ModuleParamError> {
    if let Some(strategy) = get("mig_strategy") {
        isolator.mig.strategy = strategy.parse().map_err(|_| ModuleParamError::BadValue {
            key: "mig_strategy",
            got: strategy.to_owned(),
            expected: "one of single, mixed",
        })?;
    }
    isolator.mig.allow_multiple = on_off("mig_allow_multiple", get("mig_allow_multiple"))?;
    isolator.mig.allow_sys_admin = on_off("mig_allow_sys_admin", get("mig_allow_sys_admin"))?;
    Ok(())
}

/// The recovery parameters; `None` with `health_recovery=off`.
fn recovery<'a>(
    get: &impl Fn(&str) -> Option<&'a str>,
) -> Result<Option<RecoveryConfig>, ModuleParamError> {
    let on = match get("health_recovery").unwrap_or("on") {
        "on" => true,
        "off" => false,
        other => {
            return Err(ModuleParamError::BadValue {
                key: "health_recovery",
                got: other.to_owned(),
                expected: "one of on, off",
            });
        }
    };
    let argv = ProbeConfig::parse_command(get("health_probe").unwrap_or(DEFAULT_PROBE))
        .map_err(|source| ModuleParamError::HealthProbe { source })?;
    let mut config = RecoveryConfig::new(ProbeConfig::command(argv));
    if let Some(spec) = get("health_quiet") {
        config.quiet =
            QuietTimes::parse(spec).map_err(|source| ModuleParamError::HealthQuiet { source })?;
    }
    if let Some(text) = get("health_retry") {
        let bad = || ModuleParamError::BadValue {
            key: "health_retry",
            got: text.to_owned(),
            expected: "MIN,MAX durations with MIN <= MAX, e.g. 30s,1h",
        };
        let (min, max) = text.split_once(',').ok_or_else(bad)?;
        let (min, max) = (
            parse_duration(min).ok_or_else(bad)?,
            parse_duration(max).ok_or_else(bad)?,
        );
        if min.is_zero() || min > max {
            return Err(bad());
        }
        config.retry_min = min;
        config.retry_max = max;
    }
    config.probe.timeout = match get("health_probe_timeout") {
        Some(text) => parse_duration(text)
            .filter(|d| !d.is_zero())
            .ok_or_else(|| ModuleParamError::BadValue {
                key: "health_probe_timeout",
                got: text.to_owned(),
                expected: "a duration above zero, e.g. 60s or 2m",
            })?,
        None => DEFAULT_PROBE_TIMEOUT,
    };
    if !on {
        if let Some(key) = [
            "health_quiet",
            "health_retry",
            "health_probe",
            "health_probe_timeout",
        ]
        .into_iter()
        .find(|k| get(k).is_some())
        {
            return Err(ModuleParamError::BadValue {
                key,
                got: get(key).unwrap_or_default().to_owned(),
                expected: "to be given only with health_recovery=on",
            });
        }
        return Ok(None);
    }
    Ok(Some(config))
}

fn parse_indices(text: &str) -> Result<Vec<u32>, ModuleParamError> {
    text.split(',')
        .map(|s| s.trim().parse::<u32>())
        .collect::<Result<Vec<u32>, _>>()
        .map_err(|_| ModuleParamError::BadValue {
            key: "nvidia_gpu_devices",
            got: text.to_owned(),
            expected: "NVML indices separated by commas, e.g. 0,1,3",
        })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::path::Path;

    use super::*;
    use crate::agent_flags::MigStrategy;

    fn params(pairs: &[(&str, &str)]) -> ModuleParameters {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn parse(pairs: &[(&str, &str)]) -> Result<ModuleConfig, ModuleParamError> {
        ModuleConfig::parse(&params(pairs))
    }

    #[test]
    fn defaults_are_mesos_defaults() {
        let p = parse(&[("work_dir", "/w")]).unwrap();
        assert_eq!(p.isolator.work_dir, PathBuf::from("/w"));
        assert_eq!(p.isolator.cgroups_root, "mesos");
        assert_eq!(p.isolator.policy, Policy::Topology);
        assert_eq!(p.dev_root, PathBuf::from("/dev"));
        assert_eq!(p.nvml_lib, PathBuf::from(DEFAULT_NVML_LIB));
        assert_eq!(p.driver_volume, DriverVolume::Existing);
        assert_eq!(p.health_checks, HealthPolicy::new());
        assert_eq!(
            p.isolator.pool.map(|pool| pool.dir),
            Some(PathBuf::from(DEFAULT_POOL_DIR))
        );
    }

    #[test]
    fn every_key_is_read() {
        let p = parse(&[
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
            ("container_cgroups", "mesos"),
        ])
        .unwrap();
        assert_eq!(p.isolator.cgroup_maker, CgroupMaker::Mesos);
        assert_eq!(p.container_cgroups, Some(CgroupMaker::Mesos));
        assert_eq!(p.isolator.policy, Policy::FirstFit);
        assert_eq!(p.isolator.cgroup_version, CgroupChoice::V2);
        assert_eq!(p.isolator.v2_mount, Some(PathBuf::from("/cg2")));
        assert_eq!(p.isolator.v1_root, PathBuf::from("/cg1"));
        assert_eq!(p.isolator.cgroups_root, "m2");
        assert!(p.cgroups_root_given && p.cgroups_hierarchy_given);
        assert_eq!(p.isolator.devices, Some(vec![0, 2]));
        assert_eq!(p.driver_volume, DriverVolume::Off);
        assert_eq!(p.dev_root, PathBuf::from("/d"));
        assert_eq!(p.nvml_lib, PathBuf::from("/lib/nvml.so"));
        assert_eq!(p.health_checks, HealthPolicy::parse("all,+79").unwrap());
    }

    #[test]
    fn unknown_key_is_named_with_the_accepted_ones() {
        let err = parse(&[("work_dir", "/w"), ("polcy", "x")]).unwrap_err();
        let text = err.to_string();
        assert!(
            text.starts_with(
                "unknown module parameter \"polcy\": expected one of work_dir, pool_dir, nvml_lib"
            ),
            "{text}"
        );
        assert!(text.ends_with(", proc_root"), "{text}");
    }

    #[test]
    fn a_key_given_twice_is_refused_though_set_replaces_it() {
        let err = parse(&[("work_dir", "/w"), ("work_dir", "/v")]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "module parameter \"work_dir\" is given twice"
        );
        let mut set = params(&[("work_dir", "/w")]);
        set.set("work_dir", "/v");
        assert_eq!(
            ModuleConfig::parse(&set).unwrap().isolator.work_dir,
            Path::new("/v")
        );
    }

    #[test]
    fn bad_values_are_refused_naming_the_key_value_and_what_is_accepted() {
        let err = parse(&[]).unwrap_err();
        assert_eq!(err.to_string(), "module parameter \"work_dir\" is required");
        for (key, value, expected) in [
            ("cgroup_version", "v3", "one of auto, v1, v2"),
            ("container_cgroups", "x", "one of auto, mesos, own"),
            ("driver_volume", "sometimes", "one of existing, build, off"),
            ("numa_pinning", "maybe", "one of off, on"),
            (
                "nvidia_gpu_devices",
                "0,x",
                "NVML indices separated by commas, e.g. 0,1,3",
            ),
            ("mig_strategy", "split", "one of single, mixed"),
            ("mig_allow_multiple", "yes", "one of off, on"),
            ("mig_allow_sys_admin", "yes", "one of off, on"),
        ] {
            let err = parse(&[("work_dir", "/w"), (key, value)]).unwrap_err();
            assert_eq!(
                err.to_string(),
                format!("module parameter {key}=\"{value}\": expected {expected}")
            );
        }
        let err = parse(&[("work_dir", "/w"), ("policy", "best")]).unwrap_err();
        assert!(matches!(err, ModuleParamError::Policy { .. }), "{err}");
        let err = parse(&[("work_dir", "/w"), ("health_checks", "79,bogus")]).unwrap_err();
        let chain = mesos_gpu_os::error_chain(&err);
        assert!(
            chain.starts_with(
                "module parameter health_checks: health checks \"79,bogus\": bad token \"bogus\""
            ),
            "{chain}"
        );
    }

    #[test]
    fn mig_parameters_default_and_parse() {
        let p = parse(&[("work_dir", "/w")]).unwrap();
        assert_eq!(p.isolator.mig.strategy, MigStrategy::Single);
        assert!(!p.isolator.mig.allow_multiple && !p.isolator.mig.allow_sys_admin);
        assert_eq!(p.proc_root, Path::new("/proc"));
        let p = parse(&[
            ("work_dir", "/w"),
            ("mig_strategy", "mixed"),
            ("mig_allow_multiple", "on"),
            ("proc_root", "/sim/proc"),
        ])
        .unwrap();
        assert_eq!(p.isolator.mig.strategy, MigStrategy::Mixed);
        assert!(p.isolator.mig.allow_multiple);
        assert_eq!(p.proc_root, Path::new("/sim/proc"));
    }

    #[test]
    fn sharing_parameters_default_to_whole_gpus_parse_and_refuse_bad_values() {
        let p = parse(&[("work_dir", "/w")]).unwrap();
        assert!(p.isolator.sharing.is_none(), "whole GPUs by default");
        let p = parse(&[
            ("work_dir", "/w"),
            ("gpu_replicas", "4,3=1"),
            ("gpu_sharing", "mps"),
            ("mps_root", "/run/mps"),
        ])
        .unwrap();
        let sharing = p.isolator.sharing.unwrap();
        assert_eq!(
            sharing.spec.modes(),
            &ModeSpec::uniform(mesos_gpu_placement::sharing::SharingMode::Mps)
        );
        assert_eq!(sharing.mps.root, Path::new("/run/mps"));
        assert_eq!(sharing.mps.program, Path::new("nvidia-cuda-mps-control"));
        let p = parse(&[("work_dir", "/w"), ("gpu_replicas", "2")]).unwrap();
        assert_eq!(
            p.isolator.sharing.unwrap().spec.modes(),
            &ModeSpec::default()
        );
        let err = parse(&[("work_dir", "/w"), ("gpu_sharing", "mps")]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "module parameter gpu_sharing=\"mps\": expected to be given only with gpu_replicas"
        );
        for (key, value, says) in [
            ("gpu_sharing", "slices", "GPU sharing entry \"slices\""),
            (
                "gpu_sharing",
                "mps,4-5=fast",
                "expected MODE or SEL=MODE (MODE one of time-slicing, mps, none",
            ),
            ("gpu_replicas", "4,x", "GPU replica entry \"x\""),
        ] {
            let mut given = vec![("work_dir", "/w"), ("gpu_replicas", "4")];
            given.retain(|(k, _)| *k != key);
            given.push((key, value));
            let err = parse(&given).unwrap_err();
            assert!(matches!(err, ModuleParamError::Sharing { .. }), "{err}");
            let chain = mesos_gpu_os::error_chain(&err);
            assert!(chain.contains(says), "{chain}");
        }
    }

    #[test]
    fn recovery_parameters() {
        let p = parse(&[("work_dir", "/w")]).unwrap();
        let r = p.health_recovery.unwrap();
        assert_eq!(
            r.probe.argv,
            ["mesos-gpu", "gpu", "probe", "--gpu", "{uuid}"]
        );
        assert_eq!(r.quiet, QuietTimes::default());
        let p = parse(&[
            ("work_dir", "/w"),
            ("health_quiet", "memory=1m,other=5s"),
            ("health_retry", "1s,10s"),
            ("health_probe", "/usr/local/bin/check-gpu {index}"),
            ("health_probe_timeout", "5s"),
        ])
        .unwrap();
        let r = p.health_recovery.unwrap();
        assert_eq!(r.quiet.memory.as_secs(), 60);
        assert_eq!(r.quiet.other.as_secs(), 5);
        assert_eq!((r.retry_min.as_secs(), r.retry_max.as_secs()), (1, 10));
        assert_eq!(r.probe.argv, ["/usr/local/bin/check-gpu", "{index}"]);
        assert_eq!(r.probe.timeout.as_secs(), 5);
        let off = parse(&[("work_dir", "/w"), ("health_recovery", "off")]).unwrap();
        assert!(off.health_recovery.is_none());
        for (key, value, says) in [
            ("health_recovery", "maybe", "expected one of on, off"),
            ("health_quiet", "memory=soon", "bad entry \"memory=soon\""),
            ("health_retry", "10s,1s", "MIN <= MAX"),
            ("health_probe", " ", "is empty"),
            ("health_probe_timeout", "0s", "above zero"),
        ] {
            let err = parse(&[("work_dir", "/w"), (key, value)]).unwrap_err();
            let chain = mesos_gpu_os::error_chain(&err);
            assert!(chain.contains(says), "{key}: {chain}");
        }
        let err = parse(&[
            ("work_dir", "/w"),
            ("health_recovery", "off"),
            ("health_quiet", "5s"),
        ])
        .unwrap_err();
        assert!(
            err.to_string().contains("only with health_recovery=on"),
            "{err}"
        );
    }

    #[test]
    fn numa_pinning_is_off_by_default() {
        let p = parse(&[("work_dir", "/w")]).unwrap();
        assert!(!p.isolator.pinning.enabled, "off by default");
        let p = parse(&[("work_dir", "/w"), ("numa_pinning", "on")]).unwrap();
        assert!(p.isolator.pinning.enabled);
    }
}
