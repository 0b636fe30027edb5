//! The agent configuration of mesos-gpu's isolator module: its `--isolation` by cgroup version,
//! the agent flags that version needs, and the module's parameters (`modules.json`) that must
//! match what the agent advertises.
//!
//! Facts relied on (Mesos 1.12 source, `src/`):
//! - with the linux launcher (the default as root) the containerizer always creates its cgroups
//!   isolator, even when no `cgroups/*` is in `--isolation`
//!   (`slave/containerizer/mesos/containerizer.cpp` 566-585), so the module finds a container
//!   cgroup on either version;
//! - cgroup v1: `cgroups/devices` makes each container's devices cgroup, deny-by-default with
//!   Mesos's whitelist, and the module adds the GPUs to it ([`super::ContainerizerFlags`]);
//! - cgroup v2: `cgroups/devices` (or `cgroups/all`) would attach Mesos's own device program,
//!   which denies the GPUs, so it stays out; the cgroups v2 isolator needs `<cgroups_root>` to
//!   exist before the first container, which only an agent started with `--agent_subsystems`
//!   makes (`slave/main.cpp` 205-290, `initializeCgroups2`): `--agent_subsystems=` (no
//!   controller) does just that;
//! - `--modules` takes the JSON inline or `file://<path>` (`slave/flags.cpp`, `--modules`);
//! - the module reads `work_dir` (required), `pool_dir`, `volume_root`, `nvidia_gpu_devices`,
//!   `mig_strategy`, `gpu_replicas`, `gpu_sharing`, `nvml_lib`, `dev_root`, `proc_root` and more
//!   (checked by [`super::ModuleConfig::parse`]); `--nvidia_gpu_devices` is never an agent flag
//!   with the module (it belongs to Mesos's `gpu/nvidia`, which is refused beside the module).

use mesos_gpu_enforce::cgroup::CgroupVersion;

use super::{ContainerizerFlags, ContainerizerFlagsError};

/// The module's name, in `modules.json` and `--isolation`.
pub const MODULE_ISOLATOR: &str = "org_apache_mesos_gpu_MesosGpuIsolator";

/// Where the module library is installed (`cmake --install` with prefix `/usr`).
pub const DEFAULT_MODULE_LIBRARY: &str = "/usr/lib/mesos/modules/libmesos_gpu_module.so";

/// The `--isolation` that loads the module on a cgroup `version` host, with nothing else that
/// touches devices: `filesystem/linux,cgroups/devices,<module>` on v1,
/// `filesystem/linux,<module>` on v2.
pub fn module_isolation(version: CgroupVersion) -> String {
    match version {
        CgroupVersion::V1 => format!("filesystem/linux,cgroups/devices,{MODULE_ISOLATOR}"),
        CgroupVersion::V2 => format!("filesystem/linux,{MODULE_ISOLATOR}"),
    }
}

/// The `--isolation` of an agent on a node the module cannot serve (no GPU, no driver):
/// `isolation` without the module, or, when the module was all it held, [`module_isolation`]
/// without it. Never empty: with the linux launcher on cgroup v1, Mesos 1.12 aborts at start
/// when `--isolation` holds no `cgroups/*` (`CgroupsIsolatorProcess::create`,
/// `CHECK(!subsystemSet.empty())`), which Mesos's default `posix/cpu,posix/mem` does not.
pub fn isolation_without_module(isolation: &str, version: CgroupVersion) -> String {
    let without = |isolation: &str| {
        isolation
            .split(',')
            .map(str::trim)
            .filter(|t| !t.is_empty() && *t != MODULE_ISOLATOR)
            .collect::<Vec<_>>()
            .join(",")
    };
    match without(isolation) {
        rest if rest.is_empty() => without(&module_isolation(version)),
        rest => rest,
    }
}

/// The agent flags, besides `--isolation`, that an agent with a GPU isolator (the module or
/// Mesos's `gpu/nvidia`) needs on a cgroup `version` host: `--agent_subsystems=` on v2, none on
/// v1. On v2 Mesos's cgroups v2 isolator (`gpu/nvidia`'s `cgroups/devices`, or the one the linux
/// launcher creates anyway) aborts the agent at its first container without `<cgroups_root>`
/// (`isolators/cgroups2/cgroups2.cpp` 192, `CHECK(cgroups2::exists(flags.cgroups_root))`), see
/// the module docs.
pub fn cgroup_agent_flags(version: CgroupVersion) -> Vec<String> {
    match version {
        CgroupVersion::V1 => Vec::new(),
        CgroupVersion::V2 => vec!["--agent_subsystems=".to_owned()],
    }
}

/// Checks an `--isolation` that names the module as the module checks it when the agent
/// starts: no `gpu/nvidia` beside it, no `cgroups/devices` or `cgroups/all` on cgroup v2.
pub fn check_module_isolation(
    isolation: &str,
    version: CgroupVersion,
) -> Result<(), ContainerizerFlagsError> {
    let flags = ContainerizerFlags {
        isolation: isolation
            .split(',')
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .map(str::to_owned)
            .collect(),
        cgroups_root: mesos_gpu_enforce::cgroup::DEFAULT_PARENT.to_owned(),
        cgroups_hierarchy: "/sys/fs/cgroup".into(),
        launcher: None,
        resources: None,
    };
    flags.cgroup_maker(version).map(|_| ())
}

/// The module's parameters, in the order given: [`ModuleParameters::set`] replaces a key's
/// value, while one collected from `(key, value)` pairs (a `modules.json`, the module's
/// `mesos.Parameters`) keeps a key given twice, which [`super::ModuleConfig::parse`] refuses.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ModuleParameters {
    entries: Vec<(String, String)>,
}

impl FromIterator<(String, String)> for ModuleParameters {
    fn from_iter<I: IntoIterator<Item = (String, String)>>(pairs: I) -> ModuleParameters {
        ModuleParameters {
            entries: pairs.into_iter().collect(),
        }
    }
}

impl ModuleParameters {
    /// Sets `key` to `value`, in place when it is already set.
    pub fn set(&mut self, key: &str, value: impl Into<String>) {
        let value = value.into();
        match self.entries.iter_mut().find(|(k, _)| k == key) {
            Some(entry) => entry.1 = value,
            None => self.entries.push((key.to_owned(), value)),
        }
    }

    /// The value of `key`, when set (the first, when given twice).
    pub fn get(&self, key: &str) -> Option<&str> {
        self.entries
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// Every `(key, value)`, in order.
    pub fn entries(&self) -> &[(String, String)] {
        &self.entries
    }

    /// The `modules.json` document that loads the module from `library` with these
    /// parameters.
    pub fn modules_json(&self, library: &str) -> serde_json::Value {
        let parameters: Vec<serde_json::Value> = self
            .entries
            .iter()
            .map(|(k, v)| serde_json::json!({ "key": k, "value": v }))
            .collect();
        serde_json::json!({
            "libraries": [{
                "file": library,
                "modules": [{ "name": MODULE_ISOLATOR, "parameters": parameters }],
            }]
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn isolation_by_cgroup_version_is_what_the_module_accepts() {
        for version in [CgroupVersion::V1, CgroupVersion::V2] {
            let isolation = module_isolation(version);
            check_module_isolation(&isolation, version).unwrap();
        }
        assert!(module_isolation(CgroupVersion::V1).contains("cgroups/devices"));
        assert!(!module_isolation(CgroupVersion::V2).contains("cgroups/"));
        assert_eq!(
            cgroup_agent_flags(CgroupVersion::V2),
            ["--agent_subsystems="]
        );
        assert!(cgroup_agent_flags(CgroupVersion::V1).is_empty());
        let v1 = module_isolation(CgroupVersion::V1);
        let err = check_module_isolation(&v1, CgroupVersion::V2).unwrap_err();
        assert!(matches!(err, ContainerizerFlagsError::DevicesOnV2 { .. }));
        let err =
            check_module_isolation(&format!("gpu/nvidia,{v1}"), CgroupVersion::V1).unwrap_err();
        assert!(matches!(
            err,
            ContainerizerFlagsError::TwoGpuIsolators { .. }
        ));
    }

    #[test]
    fn isolation_without_the_module_keeps_the_rest() {
        assert_eq!(
            isolation_without_module(&module_isolation(CgroupVersion::V1), CgroupVersion::V1),
            "filesystem/linux,cgroups/devices"
        );
        assert_eq!(
            isolation_without_module(&module_isolation(CgroupVersion::V2), CgroupVersion::V2),
            "filesystem/linux"
        );
        assert_eq!(
            isolation_without_module(
                &format!("cgroups/cpu, {MODULE_ISOLATOR},cgroups/mem"),
                CgroupVersion::V1
            ),
            "cgroups/cpu,cgroups/mem"
        );
        assert_eq!(
            isolation_without_module(MODULE_ISOLATOR, CgroupVersion::V1),
            "filesystem/linux,cgroups/devices"
        );
    }

    #[test]
    fn parameters_keep_their_order_and_last_value() {
        let mut p = ModuleParameters::default();
        p.set("work_dir", "/var/lib/mesos");
        p.set("pool_dir", "/var/lib/mesos-gpu");
        p.set("work_dir", "/w");
        assert_eq!(p.get("work_dir"), Some("/w"));
        assert_eq!(p.entries()[0].0, "work_dir");
        let json = p.modules_json("/lib/m.so");
        assert_eq!(json["libraries"][0]["file"], "/lib/m.so");
        let module = &json["libraries"][0]["modules"][0];
        assert_eq!(module["name"], MODULE_ISOLATOR);
        assert_eq!(
            module["parameters"],
            serde_json::json!([
                {"key": "work_dir", "value": "/w"},
                {"key": "pool_dir", "value": "/var/lib/mesos-gpu"}
            ])
        );
    }
}
