//! The module parameters (`mesos.Parameters` from `modules.json`) and what they set up.
//!
//! The parameters are checked by the isolator crate's one parser
//! ([`ModuleConfig::parse`]: unknown keys, keys given twice, `work_dir`, every value), the same
//! that `mesos-gpu agent-flags` and `mesos-gpu doctor` use; what needs the host (NVML, the
//! device nodes, the driver volume, the agent's flags) is done here. The keys are documented in
//! `ffi/README.md`.
//!
//! Inside a `mesos-agent` process the module also reads the agent's own flags
//! ([`running_agent`], [`ModuleParams::apply_agent`]): `cgroups_root` and `cgroups_hierarchy`
//! default to the agent's and may not differ from them, and who makes the container cgroups
//! (`container_cgroups`) follows from `--isolation` and the cgroup version, so an unsupported
//! configuration is refused when the agent starts rather than when a task fails.

use std::path::{Path, PathBuf};

use mesos_gpu_enforce::cgroup::{CgroupError, CgroupVersion};
use mesos_gpu_isolator::agent_flags::{
    ContainerizerFlags, ContainerizerFlagsError, DriverVolume, ModuleConfig, ModuleParamError,
    ModuleParameters, OfferMismatch, Resources, check_agent_resources,
};
use mesos_gpu_isolator::lifecycle::{IsolatorConfig, LifecycleError};
use mesos_gpu_node::devices::DevicesError;
use mesos_gpu_node::discovery::DiscoveryError;
use mesos_gpu_volume::plan::DriverSource;
use mesos_gpu_volume::{DriverVersion, LdCache, VolumeManager};

use crate::proto::mesos::Parameters;

/// The test-only parameter naming the call that panics on purpose (`testing` builds only).
#[cfg(feature = "testing")]
const DEBUG_PANIC_ON: &str = "debug_panic_on";

/// Why the module could not be set up.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ParamError {
    /// A parameter is refused (unknown, given twice, missing, or a value not accepted).
    #[error(transparent)]
    Refused(#[from] ModuleParamError),
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
    /// True when the parameters themselves are wrong (as opposed to the host), also when the
    /// isolator refuses their values against the node while it is created.
    pub(crate) fn is_bad_value(&self) -> bool {
        match self {
            ParamError::Refused(_)
            | ParamError::Agent { .. }
            | ParamError::Resources { .. }
            | ParamError::ContradictsAgent { .. } => true,
            ParamError::Isolator { source } => source.is_refused_setup(),
            _ => false,
        }
    }
}

/// The module parameters, checked.
#[derive(Debug, Clone)]
pub(crate) struct ModuleParams {
    /// What the parameters say, checked by the isolator crate's parser (the one `mesos-gpu
    /// agent-flags` and `mesos-gpu doctor` check them with).
    pub(crate) config: ModuleConfig,
    /// The call that panics on purpose (`testing` builds only).
    #[cfg(feature = "testing")]
    pub(crate) debug_panic_on: Option<String>,
}

impl ModuleParams {
    /// Checks `params` with [`ModuleConfig::parse`]; `testing` builds also take
    /// `debug_panic_on`.
    pub(crate) fn parse(params: &Parameters) -> Result<ModuleParams, ParamError> {
        let pairs = params
            .parameter
            .iter()
            .map(|p| (p.key.clone(), p.value.clone()));
        #[cfg(feature = "testing")]
        let (debug, pairs): (Vec<_>, Vec<_>) = pairs.partition(|(key, _)| key == DEBUG_PANIC_ON);
        let config = ModuleConfig::parse(&pairs.into_iter().collect::<ModuleParameters>())?;
        Ok(ModuleParams {
            config,
            #[cfg(feature = "testing")]
            debug_panic_on: match debug.as_slice() {
                [] => None,
                [(_, value)] => Some(value.clone()),
                [..] => {
                    return Err(ModuleParamError::Duplicate {
                        key: DEBUG_PANIC_ON.to_owned(),
                    }
                    .into());
                }
            },
        })
    }

    /// Fits the parameters to the running agent's flags: `cgroups_root` and `cgroups_hierarchy`
    /// default to the agent's (and must equal them when given), and who makes the container
    /// cgroups follows from the agent's `--isolation` on the cgroup version `version` resolves
    /// (see `ContainerizerFlags::cgroup_maker`); an explicit `container_cgroups` must agree.
    pub(crate) fn apply_agent(
        &mut self,
        agent: &ContainerizerFlags,
        version: impl FnOnce(&IsolatorConfig) -> Result<CgroupVersion, ParamError>,
    ) -> Result<(), ParamError> {
        if self.config.cgroups_root_given && self.config.isolator.cgroups_root != agent.cgroups_root
        {
            return Err(ParamError::ContradictsAgent {
                key: "cgroups_root",
                got: self.config.isolator.cgroups_root.clone(),
                agent: format!("--cgroups_root={:?}", agent.cgroups_root),
                why: "the module works on the container cgroups under the agent's --cgroups_root \
                      (or, on cgroup v1 without cgroups/devices, makes its own devices cgroups there, \
                      where Mesos makes none); remove the parameter",
            });
        }
        if self.config.cgroups_hierarchy_given
            && self.config.isolator.v1_root != agent.cgroups_hierarchy
        {
            return Err(ParamError::ContradictsAgent {
                key: "cgroups_hierarchy",
                got: self.config.isolator.v1_root.display().to_string(),
                agent: format!("--cgroups_hierarchy={:?}", agent.cgroups_hierarchy),
                why: "the module must use the hierarchy Mesos uses; remove the parameter",
            });
        }
        self.config
            .isolator
            .cgroups_root
            .clone_from(&agent.cgroups_root);
        self.config
            .isolator
            .v1_root
            .clone_from(&agent.cgroups_hierarchy);
        let version = version(&self.config.isolator)?;
        let cgroup_maker = agent
            .cgroup_maker(version)
            .map_err(|source| ParamError::Agent { source })?;
        if let Some(given) = self.config.container_cgroups
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
        self.config.isolator.cgroup_maker = cgroup_maker;
        self.config.isolator.pinning.mesos_cpuset =
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
    pub(crate) fn check_agent_resources(
        &self,
        agent: &ContainerizerFlags,
        inventory: &mesos_gpu_node::inventory::Inventory,
    ) -> Result<(), ParamError> {
        let offer =
            check_agent_resources(agent.resources.as_deref(), inventory, &self.config.gpus())
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
    pub(crate) fn resolve_volume(&self, version: &str) -> Result<Option<PathBuf>, ParamError> {
        if self.config.driver_volume == DriverVolume::Off {
            return Ok(None);
        }
        let volume_err = |source: Box<dyn std::error::Error + Send + Sync>| ParamError::Volume {
            volume_root: self.config.volume_root.clone(),
            driver_root: self.config.driver_root.clone(),
            source,
        };
        let parsed: DriverVersion = version.parse().map_err(|e| volume_err(Box::new(e)))?;
        let manager = VolumeManager::at(&self.config.volume_root);
        let path = manager.volume_path(&parsed);
        if path.is_dir() {
            return Ok(Some(path));
        }
        if self.config.driver_volume == DriverVolume::Existing {
            tracing::warn!(
                volume = %path.display(),
                "no driver volume: images asking for /usr/local/nvidia get none (build it with `mesos-gpu volume create`)"
            );
            return Ok(None);
        }
        let cache = LdCache::load(&self.config.driver_root).map_err(|e| volume_err(Box::new(e)))?;
        // Programs along the agent's PATH, as Mesos's `which`, then next to the libraries.
        let path = std::env::var_os("PATH").unwrap_or_default();
        let source = DriverSource::with_path(&self.config.driver_root, &path);
        let plan = manager
            .plan(&source, &cache, &parsed)
            .map_err(|e| volume_err(Box::new(e)))?;
        let volume = manager.create(&plan).map_err(|e| volume_err(Box::new(e)))?;
        tracing::info!(volume = %volume.path.display(), "built the driver volume");
        Ok(Some(volume.path))
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
pub(crate) fn running_agent() -> Result<Option<ContainerizerFlags>, ParamError> {
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
pub(crate) fn host_cgroup_version(config: &IsolatorConfig) -> Result<CgroupVersion, ParamError> {
    config
        .hierarchy()
        .map(|h| h.version)
        .map_err(|source| ParamError::Hierarchy { source })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::proto::mesos::Parameter;
    use mesos_gpu_isolator::lifecycle::CgroupMaker;

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

    /// The proto goes to the isolator crate's parser whole: a key given twice in `modules.json`
    /// is refused, not collapsed, and a refusal is a bad value (`MGPU_BAD_ARGUMENT`).
    #[test]
    fn the_proto_is_checked_by_the_isolator_crates_parser_whole() {
        let p =
            ModuleParams::parse(&params(&[("work_dir", "/w"), ("policy", "first-fit")])).unwrap();
        assert_eq!(p.config.isolator.work_dir, PathBuf::from("/w"));
        for (pairs, says) in [
            (
                &[("work_dir", "/w"), ("work_dir", "/v")][..],
                "module parameter \"work_dir\" is given twice",
            ),
            (
                &[("work_dir", "/w"), ("polcy", "x")][..],
                "unknown module parameter \"polcy\": expected one of work_dir, pool_dir, nvml_lib",
            ),
            (
                &[("work_dir", "/w"), ("numa_pinning", "maybe")][..],
                "module parameter numa_pinning=\"maybe\": expected one of off, on",
            ),
        ] {
            let err = ModuleParams::parse(&params(pairs)).unwrap_err();
            assert!(err.to_string().starts_with(says), "{err}");
            assert!(err.is_bad_value(), "{err}");
        }
    }

    /// `debug_panic_on`, the panic tests' hook, is taken out before the parser sees the rest.
    #[cfg(feature = "testing")]
    #[test]
    fn testing_builds_take_debug_panic_on() {
        let p = ModuleParams::parse(&params(&[
            ("work_dir", "/w"),
            ("debug_panic_on", "prepare"),
        ]))
        .unwrap();
        assert_eq!(p.debug_panic_on.as_deref(), Some("prepare"));
        let err = ModuleParams::parse(&params(&[
            ("work_dir", "/w"),
            ("debug_panic_on", "prepare"),
            ("debug_panic_on", "update"),
        ]))
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "module parameter \"debug_panic_on\" is given twice"
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
            p.config.isolator.cgroup_maker,
            CgroupMaker::Own,
            "outside an agent"
        );
        p.apply_agent(&agent("filesystem/linux,cgroups/devices,m", "agents"), v1)
            .unwrap();
        assert_eq!(p.config.isolator.cgroups_root, "agents");
        assert_eq!(p.config.isolator.cgroup_maker, CgroupMaker::Mesos);

        let mut p = ModuleParams::parse(&params(&[("work_dir", "/w")])).unwrap();
        p.apply_agent(&agent("filesystem/linux,m", "mesos"), v1)
            .unwrap();
        assert_eq!(p.config.isolator.cgroup_maker, CgroupMaker::Own);

        let mut p = ModuleParams::parse(&params(&[("work_dir", "/w")])).unwrap();
        p.apply_agent(&agent("filesystem/linux,m", "mesos"), v2)
            .unwrap();
        assert_eq!(p.config.isolator.cgroup_maker, CgroupMaker::Mesos);

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
            !p.config.cgroups_root_given && p.config.container_cgroups.is_none(),
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
        let off = ModuleParams::parse(&params(&[
            ("work_dir", "/w"),
            ("volume_root", root),
            ("driver_volume", "off"),
        ]))
        .unwrap();
        assert_eq!(off.resolve_volume("550.54.14").unwrap(), None);
    }

    #[test]
    fn numa_pinning_finds_mesos_cpuset_in_the_agents_flags() {
        let v1 = |_: &IsolatorConfig| Ok(CgroupVersion::V1);
        let mut p =
            ModuleParams::parse(&params(&[("work_dir", "/w"), ("numa_pinning", "on")])).unwrap();
        assert!(p.config.isolator.pinning.enabled);
        p.apply_agent(&agent("cgroups/devices,m", "mesos"), v1)
            .unwrap();
        assert!(!p.config.isolator.pinning.mesos_cpuset, "no cgroups/cpuset");
        p.apply_agent(&agent("cgroups/devices,cgroups/cpuset", "mesos"), v1)
            .unwrap();
        assert!(p.config.isolator.pinning.mesos_cpuset);
    }
}
