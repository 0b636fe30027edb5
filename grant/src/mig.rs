//! [`MigAccess`]: the device rules, device nodes and `/proc` mounts of a container holding MIG
//! devices (its variables and the rest of its grant: [`crate::Grant`]).

use std::path::{Path, PathBuf};

use mesos_gpu_node::rules::{Access, DeviceRule};
use mesos_gpu_node::{inventory::DevNum, inventory::MigDevice, inventory::NVIDIA_GPU_MAJOR};
use mesos_gpu_placement::mig::MigError;

/// Where the capability nodes live, relative to the device root.
const CAPS_DIR: &str = "nvidia-caps";

/// What one MIG device needs inside a container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigAccess {
    /// The device's `MIG-…` UUID.
    pub uuid: String,
    /// The parent GPU's NVML index (whose NUMA affinity the device has).
    pub parent_index: u32,
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
            parent_index: device.parent,
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
        assert_eq!(access.parent_index, 4);
        assert_eq!(
            access.cap_nodes[0],
            PathBuf::from("/dev/nvidia-caps/nvidia-cap624")
        );
        assert_eq!(
            access.proc_files[1],
            (
                PathBuf::from("/proc/driver/nvidia/capabilities/gpu4/mig/gi9/ci0/access"),
                PathBuf::from("/proc/driver/nvidia/capabilities/gpu4/mig/gi9/ci0/access")
            )
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
