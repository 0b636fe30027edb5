//! The module parameters (`mesos.Parameters` from `modules.json`) and what they set up.
//!
//! Every key is optional but `work_dir`; an unknown key is an error naming it and listing the
//! accepted ones (a typo must not silently fall back to a default on a production agent).
//! Defaults are Mesos's where Mesos has one. The keys are documented in `ffi/README.md`.
//!
//! Inside a `mesos-agent` process the module also reads the agent's own flags
//! ([`running_agent`], [`ModuleParams::apply_agent`]): `cgroups_root` and `cgroups_hierarchy`
//! default to the agent's and may not differ from them, and who makes the container cgroups
//! (`container_cgroups`) follows from `--isolation` and the cgroup version, so an unsupported
//! configuration is refused when the agent starts rather than when a task fails.

use std::path::{Path, PathBuf};

use mesos_gpu_enforce::cgroup::{CgroupError, CgroupVersion};
use mesos_gpu_enforce::mps::{DEFAULT_ROOT as DEFAULT_MPS_ROOT, MpsConfig, PROGRAM as MPS_CONTROL};
use mesos_gpu_health::{
    HealthPolicy, PolicyError, ProbeConfig, ProbeError, QuietTimes, RecoveryConfig, RecoveryError,
    parse_duration, probe::DEFAULT_PROBE, probe::DEFAULT_PROBE_TIMEOUT,
};
use mesos_gpu_isolator::agent_flags::{
    ContainerizerFlags, ContainerizerFlagsError, ModuleGpus, OfferMismatch, Resources,
    check_agent_resources,
};
use mesos_gpu_isolator::lifecycle::{
    CgroupChoice, CgroupMaker, IsolatorConfig, LifecycleError, PoolConfig, PoolRole, SharingConfig,
};
use mesos_gpu_node::devices::DevicesError;
use mesos_gpu_node::discovery::{DEFAULT_NVML_LIB, DiscoveryError};
use mesos_gpu_placement::allocator::{AllocError, Policy};
use mesos_gpu_placement::sharing::{ModeSpec, SharingError, SharingSpec};
use mesos_gpu_pool::DEFAULT_POOL_DIR;
use mesos_gpu_volume::plan::DriverSource;
use mesos_gpu_volume::{DriverVersion, LdCache, VolumeManager};

use crate::proto::mesos::Parameters;

/// The keys accepted, in the order error messages list them.
pub const KEYS: &[&str] = &[
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
    /// The running agent's flags could not be read, or the module does not support them.
    #[error("the agent's configuration does not work with the GPU module")]
    Agent {
        /// Why.
        #[source]
        source: ContainerizerFlagsError,
    },
    /// The agent's `--resources` advertise GPU units the module does not hand out (or the
    /// reverse), which Mesos's `gpu/nvidia` refuses at start too.
    #[error("the agent's --resources do not match the GPUs this module hands out")]
    Resources {
        /// Why.
        #[source]
        source: OfferMismatch,
    },
    /// A module parameter that contradicts the running agent's flags.
    #[error("module parameter {key}={got:?} contradicts the agent's {agent}: {why}")]
    ContradictsAgent {
        /// The parameter.
        key: &'static str,
        /// Its value.
        got: String,
        /// The agent's flag and value, e.g. `--cgroups_root="mesos"`.
        agent: String,
        /// What to do.
        why: &'static str,
    },
    /// The cgroup hierarchy could not be determined.
    #[error("cannot find the cgroup hierarchy Mesos uses")]
    Hierarchy {
        /// Why.
        #[source]
        source: CgroupError,
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
                | ParamError::HealthQuiet { .. }
                | ParamError::HealthProbe { .. }
                | ParamError::Sharing { .. }
                | ParamError::Agent { .. }
                | ParamError::Resources { .. }
                | ParamError::ContradictsAgent { .. }
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
        // The node's one pool, shared with `serve`, `run`, `docker-args` and `exec`.
        isolator.pool = Some(PoolConfig {
            dir: path("pool_dir", DEFAULT_POOL_DIR),
            role: PoolRole::Agent,
        });
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
        let container_cgroups = match get("container_cgroups").unwrap_or("auto") {
            "auto" => None,
            other => Some(
                other
                    .parse::<CgroupMaker>()
                    .map_err(|_| ParamError::BadValue {
                        key: "container_cgroups",
                        got: other.to_owned(),
                        expected: "one of auto, mesos, own",
                    })?,
            ),
        };
        if let Some(cgroup_maker) = container_cgroups {
            isolator.cgroup_maker = cgroup_maker;
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
        isolator.pinning.enabled = match get("numa_pinning").unwrap_or("off") {
            "off" => false,
            "on" => true,
            other => {
                return Err(ParamError::BadValue {
                    key: "numa_pinning",
                    got: other.to_owned(),
                    expected: "one of off, on",
                });
            }
        };
        if let Some(spec) = get("gpu_replicas") {
            let mode = get("gpu_sharing")
                .unwrap_or("time-slicing")
                .parse::<ModeSpec>()
                .map_err(|source| ParamError::Sharing { source })?;
            let spec =
                SharingSpec::parse(spec, mode).map_err(|source| ParamError::Sharing { source })?;
            let mut mps = MpsConfig::new(path("mps_root", DEFAULT_MPS_ROOT));
            mps.program = path("mps_control", MPS_CONTROL);
            isolator.sharing = Some(SharingConfig { spec, mps });
        } else if let Some(key) = ["gpu_sharing", "mps_root", "mps_control"]
            .into_iter()
            .find(|k| get(k).is_some())
        {
            return Err(ParamError::BadValue {
                key,
                got: get(key).unwrap_or_default().to_owned(),
                expected: "to be given only with gpu_replicas",
            });
        }
        if let Some(strategy) = get("mig_strategy") {
            isolator.mig.strategy = strategy.parse().map_err(|_| ParamError::BadValue {
                key: "mig_strategy",
                got: strategy.to_owned(),
                expected: "one of single, mixed",
            })?;
        }
        for (key, slot) in [
            ("mig_allow_multiple", &mut isolator.mig.allow_multiple),
            ("mig_allow_sys_admin", &mut isolator.mig.allow_sys_admin),
        ] {
            *slot = match get(key).unwrap_or("off") {
                "off" => false,
                "on" => true,
                other => {
                    return Err(ParamError::BadValue {
                        key,
                        got: other.to_owned(),
                        expected: "one of off, on",
                    });
                }
            };
        }
        let health_checks = get("health_checks")
            .map(HealthPolicy::parse)
            .transpose()
            .map_err(|source| ParamError::HealthChecks { source })?
            .unwrap_or_default();
        let health_recovery = recovery(&get)?;
        Ok(ModuleParams {
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
            #[cfg(feature = "testing")]
            debug_panic_on: get("debug_panic_on").map(str::to_owned),
        })
    }

    /// Fits the parameters to the running agent's flags: `cgroups_root` and `cgroups_hierarchy`
    /// default to the agent's (and must equal them when given), and who makes the container
    /// cgroups follows from the agent's `--isolation` on the cgroup version `version` resolves
    /// (see `ContainerizerFlags::cgroup_maker`); an explicit `container_cgroups` must agree.
    pub fn apply_agent(
        &mut self,
        agent: &ContainerizerFlags,
        version: impl FnOnce(&IsolatorConfig) -> Result<CgroupVersion, ParamError>,
    ) -> Result<(), ParamError> {
        if self.cgroups_root_given && self.isolator.cgroups_root != agent.cgroups_root {
            return Err(ParamError::ContradictsAgent {
                key: "cgroups_root",
                got: self.isolator.cgroups_root.clone(),
                agent: format!("--cgroups_root={:?}", agent.cgroups_root),
                why: "the module works on the container cgroups under the agent's --cgroups_root \
                      (or, on cgroup v1 without cgroups/devices, makes its own devices cgroups there, \
                      where Mesos makes none); remove the parameter",
            });
        }
        if self.cgroups_hierarchy_given && self.isolator.v1_root != agent.cgroups_hierarchy {
            return Err(ParamError::ContradictsAgent {
                key: "cgroups_hierarchy",
                got: self.isolator.v1_root.display().to_string(),
                agent: format!("--cgroups_hierarchy={:?}", agent.cgroups_hierarchy),
                why: "the module must use the hierarchy Mesos uses; remove the parameter",
            });
        }
        self.isolator.cgroups_root.clone_from(&agent.cgroups_root);
        self.isolator.v1_root.clone_from(&agent.cgroups_hierarchy);
        let version = version(&self.isolator)?;
        let cgroup_maker = agent
            .cgroup_maker(version)
            .map_err(|source| ParamError::Agent { source })?;
        if let Some(given) = self.container_cgroups
            && given != cgroup_maker
        {
            return Err(ParamError::ContradictsAgent {
                key: "container_cgroups",
                got: given.to_string(),
                agent: format!(
                    "--isolation={:?} on cgroup {version}",
                    agent.isolation.join(",")
                ),
                why: "with these flags Mesos makes a devices cgroup for every container exactly when \
                      `container_cgroups` is `mesos`; remove the parameter",
            });
        }
        self.isolator.cgroup_maker = cgroup_maker;
        self.isolator.pinning.mesos_cpuset =
            agent.isolates("cgroups/cpuset") || agent.isolates("cgroups/all");
        tracing::info!(
            cgroups = %version, cgroup_maker = %cgroup_maker, cgroups_root = %agent.cgroups_root,
            isolation = %agent.isolation.join(","), "fitted the module to the agent's flags"
        );
        Ok(())
    }

    /// Checks that the agent's `--resources` advertise exactly the GPU units these parameters
    /// hand out on `inventory` (`check_agent_resources`: Mesos's `gpu/nvidia` rules, with the
    /// `nvidia_gpu_devices` parameter for `--nvidia_gpu_devices`, replicas and MIG devices
    /// counted), as Mesos's own GPU isolator refuses an agent advertising GPUs it cannot back.
    pub fn check_agent_resources(
        &self,
        agent: &ContainerizerFlags,
        inventory: &mesos_gpu_node::inventory::Inventory,
    ) -> Result<(), ParamError> {
        let module = ModuleGpus {
            devices: self.isolator.devices.as_deref(),
            strategy: self.isolator.mig.strategy,
            sharing: self.isolator.sharing.as_ref().map(|s| &s.spec),
        };
        let offer = check_agent_resources(agent.resources.as_deref(), inventory, &module)
            .map_err(|source| ParamError::Resources { source })?;
        let advertised: Vec<String> = offer
            .scalars
            .iter()
            .map(|(name, n)| format!("{name}:{n}"))
            .collect();
        let gpus = agent
            .resources
            .as_deref()
            .and_then(|r| Resources::parse(r).ok())
            .and_then(|r| r.gpus());
        if gpus.is_none() {
            tracing::warn!(
                offered = %advertised.join(";"),
                "the agent's --resources advertise no gpus: no task can be given this node's GPUs \
                 (`mesos-gpu agent-flags` prints the agent's flags)"
            );
        } else {
            tracing::info!(advertised = %advertised.join(";"), what = %offer.what, "the agent's --resources match the GPUs the module hands out");
        }
        Ok(())
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
        // Programs along the agent's PATH, as Mesos's `which`, then next to the libraries.
        let path = std::env::var_os("PATH").unwrap_or_default();
        let source = DriverSource::with_path(&self.driver_root, &path);
        let plan = manager
            .plan(&source, &cache, &parsed)
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

/// The agent program names (`mesos-slave` is the old name; `lt-` is libtool's uninstalled
/// wrapper).
const AGENT_PROGRAMS: &[&str] = &[
    "mesos-agent",
    "mesos-slave",
    "lt-mesos-agent",
    "lt-mesos-slave",
];

/// The flags of the `mesos-agent` this library is loaded in, from its command line and
/// environment; `None` when this process is not a Mesos agent (tests, other programs using the
/// C ABI).
pub fn running_agent() -> Result<Option<ContainerizerFlags>, ParamError> {
    let args: Vec<String> = std::env::args_os()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let program = args
        .first()
        .and_then(|a| Path::new(a).file_name())
        .and_then(|n| n.to_str())
        .unwrap_or("");
    if !AGENT_PROGRAMS.contains(&program) {
        return Ok(None);
    }
    let env: Vec<(String, String)> = std::env::vars_os()
        .map(|(k, v)| {
            (
                k.to_string_lossy().into_owned(),
                v.to_string_lossy().into_owned(),
            )
        })
        .collect();
    ContainerizerFlags::parse(
        args.iter().skip(1).map(String::as_str),
        env.iter().map(|(k, v)| (k.as_str(), v.as_str())),
        |path| std::fs::read_to_string(path),
    )
    .map(Some)
    .map_err(|source| ParamError::Agent { source })
}

/// The cgroup version `config` resolves to on this host.
pub fn host_cgroup_version(config: &IsolatorConfig) -> Result<CgroupVersion, ParamError> {
    config
        .hierarchy()
        .map(|h| h.version)
        .map_err(|source| ParamError::Hierarchy { source })
}

/// The recovery parameters; `None` with `health_recovery=off`.
fn recovery<'a>(
    get: &impl Fn(&str) -> Option<&'a str>,
) -> Result<Option<RecoveryConfig>, ParamError> {
    let on = match get("health_recovery").unwrap_or("on") {
        "on" => true,
        "off" => false,
        other => {
            return Err(ParamError::BadValue {
                key: "health_recovery",
                got: other.to_owned(),
                expected: "one of on, off",
            });
        }
    };
    let argv = ProbeConfig::parse_command(get("health_probe").unwrap_or(DEFAULT_PROBE))
        .map_err(|source| ParamError::HealthProbe { source })?;
    let mut config = RecoveryConfig::new(ProbeConfig::command(argv));
    if let Some(spec) = get("health_quiet") {
        config.quiet =
            QuietTimes::parse(spec).map_err(|source| ParamError::HealthQuiet { source })?;
    }
    if let Some(text) = get("health_retry") {
        let bad = || ParamError::BadValue {
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
            .ok_or_else(|| ParamError::BadValue {
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
            return Err(ParamError::BadValue {
                key,
                got: get(key).unwrap_or_default().to_owned(),
                expected: "to be given only with health_recovery=on",
            });
        }
        return Ok(None);
    }
    Ok(Some(config))
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
    use mesos_gpu_isolator::agent_flags::MigStrategy;

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
            ("container_cgroups", "mesos"),
        ]))
        .unwrap();
        assert_eq!(p.isolator.cgroup_maker, CgroupMaker::Mesos);
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
                "unknown module parameter \"polcy\": expected one of work_dir, pool_dir, nvml_lib"
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

    fn agent(isolation: &str, root: &str) -> ContainerizerFlags {
        ContainerizerFlags {
            resources: None,
            isolation: isolation.split(',').map(str::to_owned).collect(),
            cgroups_root: root.into(),
            cgroups_hierarchy: "/sys/fs/cgroup".into(),
            launcher: None,
        }
    }

    #[test]
    fn agent_flags_decide_the_cgroups() {
        let v1 = |_: &IsolatorConfig| Ok(CgroupVersion::V1);
        let v2 = |_: &IsolatorConfig| Ok(CgroupVersion::V2);
        let mut p = ModuleParams::parse(&params(&[("work_dir", "/w")])).unwrap();
        assert_eq!(
            p.isolator.cgroup_maker,
            CgroupMaker::Own,
            "outside an agent"
        );
        p.apply_agent(&agent("filesystem/linux,cgroups/devices,m", "agents"), v1)
            .unwrap();
        assert_eq!(p.isolator.cgroups_root, "agents");
        assert_eq!(p.isolator.cgroup_maker, CgroupMaker::Mesos);

        let mut p = ModuleParams::parse(&params(&[("work_dir", "/w")])).unwrap();
        p.apply_agent(&agent("filesystem/linux,m", "mesos"), v1)
            .unwrap();
        assert_eq!(p.isolator.cgroup_maker, CgroupMaker::Own);

        let mut p = ModuleParams::parse(&params(&[("work_dir", "/w")])).unwrap();
        p.apply_agent(&agent("filesystem/linux,m", "mesos"), v2)
            .unwrap();
        assert_eq!(p.isolator.cgroup_maker, CgroupMaker::Mesos);

        let mut p = ModuleParams::parse(&params(&[
            ("work_dir", "/w"),
            ("cgroups_root", "mesos_gpu"),
        ]))
        .unwrap();
        let err = p
            .apply_agent(&agent("cgroups/devices,m", "mesos"), v1)
            .unwrap_err();
        assert!(
            err.to_string().starts_with(
                "module parameter cgroups_root=\"mesos_gpu\" contradicts the agent's --cgroups_root=\"mesos\""
            ),
            "{err}"
        );
        assert!(err.is_bad_value());

        let mut p =
            ModuleParams::parse(&params(&[("work_dir", "/w"), ("container_cgroups", "own")]))
                .unwrap();
        let err = p
            .apply_agent(&agent("cgroups/devices,m", "mesos"), v1)
            .unwrap_err();
        assert!(
            matches!(
                err,
                ParamError::ContradictsAgent {
                    key: "container_cgroups",
                    ..
                }
            ),
            "{err}"
        );

        let mut p = ModuleParams::parse(&params(&[("work_dir", "/w")])).unwrap();
        let err = p
            .apply_agent(&agent("cgroups/devices,m", "mesos"), v2)
            .unwrap_err();
        let chain = format!("{err}: {}", std::error::Error::source(&err).unwrap());
        assert!(
            chain.contains("drop `cgroups/devices` from --isolation"),
            "{chain}"
        );

        let err = ModuleParams::parse(&params(&[("work_dir", "/w"), ("container_cgroups", "x")]))
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "module parameter container_cgroups=\"x\": expected one of auto, mesos, own"
        );
    }

    #[test]
    fn example_modules_json_is_accepted() {
        let text = include_str!("../../examples/mesos-agent/modules.json");
        let json: serde_json::Value = serde_json::from_str(text).unwrap();
        let module = &json["libraries"][0]["modules"][0];
        assert_eq!(module["name"], "org_apache_mesos_gpu_MesosGpuIsolator");
        let pairs: Vec<(&str, &str)> = module["parameters"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| (p["key"].as_str().unwrap(), p["value"].as_str().unwrap()))
            .collect();
        let p = ModuleParams::parse(&params(&pairs)).unwrap();
        assert!(
            !p.cgroups_root_given && p.container_cgroups.is_none(),
            "the example leaves the cgroups to the agent's flags"
        );
    }

    #[test]
    fn tests_do_not_run_in_an_agent() {
        assert_eq!(running_agent().unwrap(), None);
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

    #[test]
    fn mig_parameters_default_parse_and_refuse_bad_values() {
        let p = ModuleParams::parse(&params(&[("work_dir", "/w")])).unwrap();
        assert_eq!(p.isolator.mig.strategy, MigStrategy::Single);
        assert!(!p.isolator.mig.allow_multiple && !p.isolator.mig.allow_sys_admin);
        assert_eq!(p.proc_root, Path::new("/proc"));
        let p = ModuleParams::parse(&params(&[
            ("work_dir", "/w"),
            ("mig_strategy", "mixed"),
            ("mig_allow_multiple", "on"),
            ("proc_root", "/sim/proc"),
        ]))
        .unwrap();
        assert_eq!(p.isolator.mig.strategy, MigStrategy::Mixed);
        assert!(p.isolator.mig.allow_multiple);
        assert_eq!(p.proc_root, Path::new("/sim/proc"));
        for (key, value, expected) in [
            ("mig_strategy", "split", "one of single, mixed"),
            ("mig_allow_sys_admin", "yes", "one of off, on"),
        ] {
            let err =
                ModuleParams::parse(&params(&[("work_dir", "/w"), (key, value)])).unwrap_err();
            assert_eq!(
                err.to_string(),
                format!("module parameter {key}=\"{value}\": expected {expected}")
            );
        }
    }

    #[test]
    fn sharing_parameters_default_to_whole_gpus_parse_and_refuse_bad_values() {
        let p = ModuleParams::parse(&params(&[("work_dir", "/w")])).unwrap();
        assert!(p.isolator.sharing.is_none(), "whole GPUs by default");
        let p = ModuleParams::parse(&params(&[
            ("work_dir", "/w"),
            ("gpu_replicas", "4,3=1"),
            ("gpu_sharing", "mps"),
            ("mps_root", "/run/mps"),
        ]))
        .unwrap();
        let sharing = p.isolator.sharing.unwrap();
        assert_eq!(
            sharing.spec.modes(),
            &ModeSpec::uniform(mesos_gpu_placement::sharing::SharingMode::Mps)
        );
        assert_eq!(sharing.mps.root, Path::new("/run/mps"));
        assert_eq!(sharing.mps.program, Path::new("nvidia-cuda-mps-control"));
        let p = ModuleParams::parse(&params(&[("work_dir", "/w"), ("gpu_replicas", "2")])).unwrap();
        assert_eq!(
            p.isolator.sharing.unwrap().spec.modes(),
            &ModeSpec::default()
        );
        let err = ModuleParams::parse(&params(&[("work_dir", "/w"), ("gpu_sharing", "mps")]))
            .unwrap_err();
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
            let err = ModuleParams::parse(&params(&given)).unwrap_err();
            assert!(err.is_bad_value());
            let chain = mesos_gpu_os::error_chain(&err);
            assert!(chain.contains(says), "{chain}");
        }
    }

    #[test]
    fn recovery_parameters() {
        let p = ModuleParams::parse(&params(&[("work_dir", "/w")])).unwrap();
        let r = p.health_recovery.unwrap();
        assert_eq!(
            r.probe.argv,
            ["mesos-gpu", "gpu", "probe", "--gpu", "{uuid}"]
        );
        assert_eq!(r.quiet, QuietTimes::default());
        let p = ModuleParams::parse(&params(&[
            ("work_dir", "/w"),
            ("health_quiet", "memory=1m,other=5s"),
            ("health_retry", "1s,10s"),
            ("health_probe", "/usr/local/bin/check-gpu {index}"),
            ("health_probe_timeout", "5s"),
        ]))
        .unwrap();
        let r = p.health_recovery.unwrap();
        assert_eq!(r.quiet.memory.as_secs(), 60);
        assert_eq!(r.quiet.other.as_secs(), 5);
        assert_eq!((r.retry_min.as_secs(), r.retry_max.as_secs()), (1, 10));
        assert_eq!(r.probe.argv, ["/usr/local/bin/check-gpu", "{index}"]);
        assert_eq!(r.probe.timeout.as_secs(), 5);
        let off = ModuleParams::parse(&params(&[("work_dir", "/w"), ("health_recovery", "off")]))
            .unwrap();
        assert!(off.health_recovery.is_none());
        for (key, value, says) in [
            ("health_recovery", "maybe", "expected one of on, off"),
            ("health_quiet", "memory=soon", "bad entry \"memory=soon\""),
            ("health_retry", "10s,1s", "MIN <= MAX"),
            ("health_probe", " ", "is empty"),
            ("health_probe_timeout", "0s", "above zero"),
        ] {
            let err =
                ModuleParams::parse(&params(&[("work_dir", "/w"), (key, value)])).unwrap_err();
            assert!(err.is_bad_value(), "{key}");
            let chain = mesos_gpu_os::error_chain(&err);
            assert!(chain.contains(says), "{key}: {chain}");
        }
        let err = ModuleParams::parse(&params(&[
            ("work_dir", "/w"),
            ("health_recovery", "off"),
            ("health_quiet", "5s"),
        ]))
        .unwrap_err();
        assert!(
            err.to_string().contains("only with health_recovery=on"),
            "{err}"
        );
    }

    #[test]
    fn numa_pinning_parameter_is_off_by_default_and_finds_mesos_cpuset() {
        let v1 = |_: &IsolatorConfig| Ok(CgroupVersion::V1);
        let p = ModuleParams::parse(&params(&[("work_dir", "/w")])).unwrap();
        assert!(!p.isolator.pinning.enabled, "off by default");
        let mut p =
            ModuleParams::parse(&params(&[("work_dir", "/w"), ("numa_pinning", "on")])).unwrap();
        assert!(p.isolator.pinning.enabled);
        p.apply_agent(&agent("cgroups/devices,m", "mesos"), v1)
            .unwrap();
        assert!(!p.isolator.pinning.mesos_cpuset, "no cgroups/cpuset");
        p.apply_agent(&agent("cgroups/devices,cgroups/cpuset", "mesos"), v1)
            .unwrap();
        assert!(p.isolator.pinning.mesos_cpuset);
        let err = ModuleParams::parse(&params(&[("work_dir", "/w"), ("numa_pinning", "yes")]))
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "module parameter numa_pinning=\"yes\": expected one of off, on"
        );
    }
}
