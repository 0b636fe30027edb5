//! The agent flags that decide where Mesos puts container cgroups, read from the running
//! agent's command line and environment, and the configurations the GPU module supports.
//!
//! How Mesos loads its flags (stout `flags/flags.hpp` 565-615, 518-541, `flags/fetch.hpp`
//! 37-55): `--name=value` on the command line, else `MESOS_NAME` (or `MESOS_name`) in the
//! environment; the command line wins; `--no-name` and `--name` are booleans; parsing stops at
//! `--`; a value `file://<path>` is replaced by the file's contents. Defaults
//! (`src/slave/flags.cpp`): `--isolation=posix/cpu,posix/mem`, `--cgroups_root=mesos`,
//! `--cgroups_hierarchy=/sys/fs/cgroup`, `--launcher=linux` when the linux launcher is available
//! (root and cgroups), else `posix`.
//!
//! What each supported configuration means ([`ContainerizerFlags::cgroup_maker`]):
//! - **cgroup v1** with `cgroups/devices` (or `cgroups/all`) in `--isolation`: Mesos makes each
//!   container's devices cgroup, deny-by-default with its whitelist, and the module adds the
//!   control nodes and GPUs there ([`CgroupMaker::Mesos`]);
//! - **cgroup v1** without it: Mesos makes no devices cgroup, so the module makes its own, under
//!   the same `--cgroups_root`, where nothing of Mesos can collide ([`CgroupMaker::Own`]);
//! - **cgroup v2**: Mesos's cgroups isolator makes every container cgroup (the linux launcher
//!   is required); `cgroups/devices` and `cgroups/all` are refused, since Mesos's device manager
//!   then attaches a program of its own that denies the GPUs (`src/linux/ebpf.cpp` 143-149,
//!   `isolators/cgroups2/controllers/devices.cpp`);
//! - `gpu/nvidia` next to the module is refused everywhere: two GPU isolators would hand out
//!   the same GPUs.

use std::io;
use std::path::{Path, PathBuf};

use crate::lifecycle::CgroupMaker;
use mesos_gpu_enforce::{cgroup::CgroupVersion, cgroup::DEFAULT_PARENT};

/// The environment prefix of Mesos agent flags.
const ENV_PREFIX: &str = "MESOS_";

/// Why the agent's containerizer flags cannot be read or are not supported with the module.
#[derive(Debug, thiserror::Error)]
pub enum ContainerizerFlagsError {
    /// A `file://` value could not be read.
    #[error("cannot read the value of --{flag} from {path}")]
    FileValue {
        /// The flag.
        flag: &'static str,
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// `gpu/nvidia` and the module together.
    #[error(
        "--isolation={isolation:?} has Mesos's `gpu/nvidia` next to the mesos-gpu module: two GPU isolators would hand out the same GPUs; remove `gpu/nvidia`"
    )]
    TwoGpuIsolators {
        /// The `--isolation` value.
        isolation: String,
    },
    /// `cgroups/devices` (or `cgroups/all`) on cgroup v2.
    #[error(
        "--isolation={isolation:?} has `{token}` on a cgroup v2 host: Mesos's device manager then attaches its own device program to every container cgroup, which denies the GPUs and leaves no room for the module's; drop `{token}` from --isolation (the module applies Mesos's default device whitelist itself)"
    )]
    DevicesOnV2 {
        /// The `--isolation` value.
        isolation: String,
        /// `cgroups/devices` or `cgroups/all`.
        token: &'static str,
    },
    /// The posix launcher on cgroup v2.
    #[error(
        "--launcher={launcher} on a cgroup v2 host: the module attaches its device program to the container cgroup Mesos's linux launcher makes, and never moves a task; use --launcher=linux"
    )]
    LauncherOnV2 {
        /// The `--launcher` value.
        launcher: String,
    },
}

/// The agent flags that decide where container cgroups live.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerizerFlags {
    /// `--isolation`, split at commas.
    pub isolation: Vec<String>,
    /// `--cgroups_root`.
    pub cgroups_root: String,
    /// `--cgroups_hierarchy`.
    pub cgroups_hierarchy: PathBuf,
    /// `--launcher`; `None` when not given (Mesos picks `linux` where it can run it).
    pub launcher: Option<String>,
    /// `--resources`, when given (`file://` values read): what the agent advertises, which the
    /// module checks against what it hands out ([`super::check_agent_resources`]).
    pub resources: Option<String>,
}

impl ContainerizerFlags {
    /// Reads the flags from an agent's command line `args` (without the program name) and its
    /// environment `env`, with stout's rules; `read` reads a `file://` value's file.
    pub fn parse<'a>(
        args: impl IntoIterator<Item = &'a str>,
        env: impl IntoIterator<Item = (&'a str, &'a str)>,
        read: impl Fn(&Path) -> io::Result<String>,
    ) -> Result<ContainerizerFlags, ContainerizerFlagsError> {
        let mut flags: Vec<(String, String)> = Vec::new();
        for (key, value) in env {
            if let Some(name) = key.strip_prefix(ENV_PREFIX) {
                flags.push((name.to_ascii_lowercase(), value.to_owned()));
            }
        }
        // Later entries win: the command line comes after the environment.
        for arg in args {
            let arg = arg.trim();
            if arg == "--" {
                break;
            }
            if let Some((name, value)) = arg.strip_prefix("--").and_then(|a| a.split_once('=')) {
                flags.push((name.to_ascii_lowercase(), value.to_owned()));
            }
        }
        let get = |flag: &'static str| -> Result<Option<String>, ContainerizerFlagsError> {
            match flags.iter().rev().find(|(name, _)| name == flag) {
                Some((_, value)) => fetch(flag, value, &read).map(Some),
                None => Ok(None),
            }
        };
        let isolation = get("isolation")?;
        let cgroups_root = get("cgroups_root")?;
        let cgroups_hierarchy = get("cgroups_hierarchy")?;
        let launcher = get("launcher")?;
        let resources = get("resources")?;
        Ok(ContainerizerFlags {
            isolation: isolation
                .as_deref()
                .unwrap_or(super::DEFAULT_ISOLATION)
                .split(',')
                .map(str::trim)
                .filter(|t| !t.is_empty())
                .map(str::to_owned)
                .collect(),
            cgroups_root: cgroups_root.unwrap_or_else(|| DEFAULT_PARENT.to_owned()),
            cgroups_hierarchy: cgroups_hierarchy
                .map_or_else(|| PathBuf::from("/sys/fs/cgroup"), PathBuf::from),
            launcher,
            resources,
        })
    }

    /// True when `--isolation` names `token`.
    pub fn isolates(&self, token: &str) -> bool {
        self.isolation.iter().any(|t| t == token)
    }

    /// Who makes the container cgroups on this agent, which runs cgroup `version`, or why the
    /// module does not support its configuration (see the module docs).
    pub fn cgroup_maker(
        &self,
        version: CgroupVersion,
    ) -> Result<CgroupMaker, ContainerizerFlagsError> {
        let isolation = || self.isolation.join(",");
        if self.isolates(super::GPU_ISOLATOR) {
            return Err(ContainerizerFlagsError::TwoGpuIsolators {
                isolation: isolation(),
            });
        }
        let devices = ["cgroups/devices", "cgroups/all"]
            .into_iter()
            .find(|t| self.isolates(t));
        match version {
            CgroupVersion::V2 => {
                if let Some(token) = devices {
                    return Err(ContainerizerFlagsError::DevicesOnV2 {
                        isolation: isolation(),
                        token,
                    });
                }
                if let Some(launcher) = self.launcher.as_deref().filter(|l| *l != "linux") {
                    return Err(ContainerizerFlagsError::LauncherOnV2 {
                        launcher: launcher.to_owned(),
                    });
                }
                Ok(CgroupMaker::Mesos)
            }
            CgroupVersion::V1 if devices.is_some() => Ok(CgroupMaker::Mesos),
            CgroupVersion::V1 => Ok(CgroupMaker::Own),
        }
    }
}

/// A flag value, with `file://<path>` replaced by the file's contents (trimmed, as a value
/// written with a final newline means the same to Mesos's list flags).
fn fetch(
    flag: &'static str,
    value: &str,
    read: &impl Fn(&Path) -> io::Result<String>,
) -> Result<String, ContainerizerFlagsError> {
    match value.strip_prefix("file://") {
        Some(path) => {
            let path = PathBuf::from(path);
            read(&path)
                .map(|text| text.trim().to_owned())
                .map_err(|source| ContainerizerFlagsError::FileValue { flag, path, source })
        }
        None => Ok(value.to_owned()),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn parse(args: &[&str], env: &[(&str, &str)]) -> ContainerizerFlags {
        ContainerizerFlags::parse(args.iter().copied(), env.iter().copied(), |p| {
            Err(io::Error::new(
                io::ErrorKind::NotFound,
                p.display().to_string(),
            ))
        })
        .unwrap()
    }

    #[test]
    fn defaults_are_mesos_defaults() {
        let f = parse(&[], &[]);
        assert_eq!(f.isolation, ["posix/cpu", "posix/mem"]);
        assert_eq!(f.cgroups_root, "mesos");
        assert_eq!(f.cgroups_hierarchy, PathBuf::from("/sys/fs/cgroup"));
        assert_eq!(f.launcher, None);
    }

    #[test]
    fn command_line_wins_over_the_environment() {
        let f = parse(
            &[
                "--master=zk://z/mesos",
                "--cgroups_root=agents",
                "--isolation=filesystem/linux,cgroups/devices,org_apache_mesos_gpu_MesosGpuIsolator",
                "--no-systemd_enable_support",
                "--",
                "--cgroups_root=ignored",
            ],
            &[
                ("MESOS_CGROUPS_ROOT", "from_env"),
                ("MESOS_launcher", "posix"),
                ("MESOS_CGROUPS_HIERARCHY", "/cg"),
                ("OTHER_ISOLATION", "x"),
                ("MESOS_RESOURCES", "cpus:1;gpus:16"),
            ],
        );
        assert_eq!(f.resources.as_deref(), Some("cpus:1;gpus:16"));
        assert_eq!(f.cgroups_root, "agents");
        assert_eq!(f.launcher.as_deref(), Some("posix"));
        assert_eq!(f.cgroups_hierarchy, PathBuf::from("/cg"));
        assert!(f.isolates("cgroups/devices"));
        assert!(!f.isolates("cgroups"));
    }

    #[test]
    fn file_values_are_read() {
        let f =
            ContainerizerFlags::parse(["--isolation=file:///etc/mesos-slave/isolation"], [], |p| {
                assert_eq!(p, Path::new("/etc/mesos-slave/isolation"));
                Ok("filesystem/linux,cgroups/devices\n".to_owned())
            })
            .unwrap();
        assert_eq!(f.isolation, ["filesystem/linux", "cgroups/devices"]);
        let err = ContainerizerFlags::parse(["--cgroups_root=file:///nope"], [], |_| {
            Err(io::Error::from(io::ErrorKind::NotFound))
        })
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "cannot read the value of --cgroups_root from /nope"
        );
    }

    #[test]
    fn supported_configurations() {
        let with = |isolation: &str, launcher: Option<&str>| ContainerizerFlags {
            resources: None,
            isolation: isolation.split(',').map(str::to_owned).collect(),
            cgroups_root: "mesos".into(),
            cgroups_hierarchy: "/sys/fs/cgroup".into(),
            launcher: launcher.map(str::to_owned),
        };
        let m = "org_apache_mesos_gpu_MesosGpuIsolator";
        let cgroup_maker = |iso: &str, v| with(iso, None).cgroup_maker(v);
        assert_eq!(
            cgroup_maker(
                &format!("filesystem/linux,cgroups/devices,{m}"),
                CgroupVersion::V1
            )
            .unwrap(),
            CgroupMaker::Mesos
        );
        assert_eq!(
            cgroup_maker(&format!("cgroups/all,{m}"), CgroupVersion::V1).unwrap(),
            CgroupMaker::Mesos
        );
        assert_eq!(
            cgroup_maker(&format!("filesystem/linux,{m}"), CgroupVersion::V1).unwrap(),
            CgroupMaker::Own
        );
        assert_eq!(
            cgroup_maker(
                &format!("filesystem/linux,cgroups/cpu,{m}"),
                CgroupVersion::V2
            )
            .unwrap(),
            CgroupMaker::Mesos
        );
        let err = cgroup_maker(
            &format!("filesystem/linux,cgroups/devices,{m}"),
            CgroupVersion::V2,
        )
        .unwrap_err();
        assert!(
            err.to_string()
                .contains("drop `cgroups/devices` from --isolation"),
            "{err}"
        );
        let err = cgroup_maker(&format!("cgroups/all,{m}"), CgroupVersion::V2).unwrap_err();
        assert!(matches!(
            err,
            ContainerizerFlagsError::DevicesOnV2 {
                token: "cgroups/all",
                ..
            }
        ));
        let err = cgroup_maker(
            &format!("cgroups/devices,gpu/nvidia,{m}"),
            CgroupVersion::V1,
        )
        .unwrap_err();
        assert!(matches!(
            err,
            ContainerizerFlagsError::TwoGpuIsolators { .. }
        ));
        let err = with(m, Some("posix"))
            .cgroup_maker(CgroupVersion::V2)
            .unwrap_err();
        assert!(err.to_string().contains("use --launcher=linux"), "{err}");
        assert_eq!(
            with(m, Some("posix"))
                .cgroup_maker(CgroupVersion::V1)
                .unwrap(),
            CgroupMaker::Own
        );
    }
}
