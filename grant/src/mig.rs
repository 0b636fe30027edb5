//! [`MigAccess`]: the device rules, device nodes, `/proc` mounts and environment of a container
//! holding MIG devices.

use std::path::{Path, PathBuf};

use mesos_gpu_enforce::{cgroup::Access, cgroup::DeviceRule, cgroup::normalize};
use mesos_gpu_node::devices::DeviceNodes;
use mesos_gpu_node::{inventory::DevNum, inventory::MigDevice, inventory::NVIDIA_GPU_MAJOR};
use mesos_gpu_placement::mig::MigError;

/// Where the capability nodes live, relative to the device root.
const CAPS_DIR: &str = "nvidia-caps";

/// What one MIG device needs inside a container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigAccess {
    /// The device's `MIG-…` UUID.
    pub uuid: String,
    /// The parent GPU's `/dev/nvidia<minor>` number.
    pub parent: DevNum,
    /// The GPU instance's and the compute instance's capability node numbers.
    pub caps: [DevNum; 2],
    /// `/dev/nvidia-caps/nvidia-cap<N>` for the two capabilities, under the device root.
    pub cap_nodes: [PathBuf; 2],
    /// The two `access` files: (host path under the proc root, path in the container).
    pub proc_files: [(PathBuf, PathBuf); 2],
}

impl MigAccess {
    /// What `device` needs, with device nodes under `dev_root` and the driver's files under
    /// `proc_root` (the container sees them at `/proc/…`); refused when the driver does not
    /// number the device's capabilities.
    pub fn of(
        device: &MigDevice,
        dev_root: &Path,
        proc_root: &Path,
    ) -> Result<MigAccess, MigError> {
        let caps = device.caps.as_ref().ok_or_else(|| MigError::NoCaps {
            uuid: device.uuid.clone(),
        })?;
        let node = |dev: DevNum| {
            dev_root
                .join(CAPS_DIR)
                .join(format!("nvidia-cap{}", dev.minor))
        };
        let file = |rel: &str| (proc_root.join(rel), Path::new("/proc").join(rel));
        Ok(MigAccess {
            uuid: device.uuid.clone(),
            parent: DevNum {
                major: NVIDIA_GPU_MAJOR,
                minor: device.parent_minor,
            },
            caps: [caps.gpu_instance, caps.compute_instance],
            cap_nodes: [node(caps.gpu_instance), node(caps.compute_instance)],
            proc_files: [
                file(&caps.gpu_instance_file),
                file(&caps.compute_instance_file),
            ],
        })
    }

    /// The device rules: the parent GPU and both capability nodes, `rw` (as NVIDIA's device
    /// plugin grants them).
    pub fn rules(&self) -> Vec<DeviceRule> {
        [self.parent, self.caps[0], self.caps[1]]
            .into_iter()
            .map(|dev| DeviceRule::char_device(dev, Access::RW))
            .collect()
    }

    /// `docker run --device` values for the parent and both capability nodes (the control
    /// nodes are added as for any GPU container).
    pub fn docker_devices(&self, dev_root: &Path) -> Vec<String> {
        let parent = dev_root.join(format!("nvidia{}", self.parent.minor));
        std::iter::once(&parent)
            .chain(&self.cap_nodes)
            .map(|p| format!("{0}:{0}:rw", p.display()))
            .collect()
    }
}

/// The environment of a task holding `devices`: `NVIDIA_VISIBLE_DEVICES` and
/// `CUDA_VISIBLE_DEVICES`, both the `MIG-…` UUIDs, comma-separated.
pub fn environment(devices: &[MigAccess]) -> Vec<(String, String)> {
    let uuids = devices
        .iter()
        .map(|d| d.uuid.as_str())
        .collect::<Vec<_>>()
        .join(",");
    vec![
        ("NVIDIA_VISIBLE_DEVICES".to_owned(), uuids.clone()),
        ("CUDA_VISIBLE_DEVICES".to_owned(), uuids),
    ]
}

/// The full allow list of a container holding `devices`: `base`, the control nodes `rwm`, and
/// each device's rules; nothing else of any GPU.
pub fn allow_list(
    base: &[DeviceRule],
    nodes: &DeviceNodes,
    devices: &[MigAccess],
) -> Vec<DeviceRule> {
    let mut rules = base.to_vec();
    if !devices.is_empty() {
        rules.extend(
            nodes
                .control
                .iter()
                .map(|n| DeviceRule::char_device(n.dev, Access::RWM)),
        );
    }
    rules.extend(devices.iter().flat_map(MigAccess::rules));
    normalize(&rules)
}

/// Refuses a task holding MIG devices whose capabilities include `CAP_SYS_ADMIN` (names as
/// Mesos's `CapabilityInfo` or `capsh` print them, with or without `CAP_`), unless
/// `allow_sys_admin`.
pub fn check_capabilities(
    owner: &str,
    capabilities: &[String],
    allow_sys_admin: bool,
) -> Result<(), MigError> {
    let sys_admin = capabilities.iter().any(|c| {
        let c = c.trim().to_ascii_uppercase();
        c == "CAP_SYS_ADMIN" || c == "SYS_ADMIN"
    });
    if sys_admin && !allow_sys_admin {
        return Err(MigError::SysAdmin {
            owner: owner.to_owned(),
        });
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a failed unwrap fails the test at its line
mod tests {
    use super::*;
    use mesos_gpu_node::inventory::MigCaps;

    fn device() -> MigDevice {
        MigDevice {
            parent: 4,
            parent_minor: 4,
            index: 2,
            uuid: "MIG-3c81a705-e941-57da-9d7a-7c5eb892c900".into(),
            gpu_instance: 9,
            compute_instance: 0,
            profile: Some(19),
            profile_name: "1g.5gb".into(),
            memory_total: 4864 << 20,
            multiprocessors: 14,
            gpu_instance_slices: 1,
            compute_instance_slices: 1,
            caps: Some(MigCaps {
                gpu_instance: DevNum {
                    major: 235,
                    minor: 624,
                },
                compute_instance: DevNum {
                    major: 235,
                    minor: 625,
                },
                gpu_instance_file: "driver/nvidia/capabilities/gpu4/mig/gi9/access".into(),
                compute_instance_file: "driver/nvidia/capabilities/gpu4/mig/gi9/ci0/access".into(),
            }),
            healthy: true,
        }
    }

    #[test]
    fn a_mig_device_needs_its_parent_and_two_caps() {
        let access = MigAccess::of(&device(), Path::new("/dev"), Path::new("/proc")).unwrap();
        let rules: Vec<String> = access.rules().iter().map(ToString::to_string).collect();
        assert_eq!(rules, ["c 195:4 rw", "c 235:624 rw", "c 235:625 rw"]);
        assert_eq!(
            access.docker_devices(Path::new("/dev")),
            [
                "/dev/nvidia4:/dev/nvidia4:rw",
                "/dev/nvidia-caps/nvidia-cap624:/dev/nvidia-caps/nvidia-cap624:rw",
                "/dev/nvidia-caps/nvidia-cap625:/dev/nvidia-caps/nvidia-cap625:rw",
            ]
        );
        assert_eq!(
            access.proc_files[1],
            (
                PathBuf::from("/proc/driver/nvidia/capabilities/gpu4/mig/gi9/ci0/access"),
                PathBuf::from("/proc/driver/nvidia/capabilities/gpu4/mig/gi9/ci0/access")
            )
        );
        assert_eq!(
            environment(std::slice::from_ref(&access)),
            [
                ("NVIDIA_VISIBLE_DEVICES".to_owned(), access.uuid.clone()),
                ("CUDA_VISIBLE_DEVICES".to_owned(), access.uuid.clone())
            ]
        );
        let mut bare = device();
        bare.caps = None;
        let err = MigAccess::of(&bare, Path::new("/dev"), Path::new("/proc")).unwrap_err();
        assert!(matches!(err, MigError::NoCaps { .. }), "{err}");
    }

    #[test]
    fn cap_sys_admin_is_refused_unless_allowed() {
        let caps = |list: &[&str]| list.iter().map(|c| (*c).to_owned()).collect::<Vec<_>>();
        check_capabilities("t", &caps(&["CAP_CHOWN", "NET_ADMIN"]), false).unwrap();
        for sys_admin in ["CAP_SYS_ADMIN", "SYS_ADMIN", "cap_sys_admin"] {
            let err = check_capabilities("t", &caps(&["CAP_CHOWN", sys_admin]), false).unwrap_err();
            assert_eq!(
                err.to_string(),
                "t would run with CAP_SYS_ADMIN, which grants every MIG capability whatever its \
                 device files; drop the capability, or have the agent's operator allow it"
            );
            check_capabilities("t", &caps(&[sys_admin]), true).unwrap();
        }
    }
}
