//! Finding the device-control hierarchies in a mount table.
//!
//! Facts relied on (proc(5) `/proc/<pid>/mountinfo`, parsed by [`mesos_gpu_os::mountinfo`]):
//! - A cgroup v1 hierarchy has fstype `cgroup` and its controllers among the super options
//!   (`rw,devices`, or several co-mounted: `rw,cpu,cpuacct`); the unified hierarchy has fstype
//!   `cgroup2`.
//!
//! Which one Mesos uses, and so which one the isolator must use to work on Mesos's container
//! cgroups ([`CgroupMounts::hierarchy`]):
//! - Mesos HEAD (1.12) runs cgroup v2 exactly when a cgroup2 file system is mounted at
//!   `/sys/fs/cgroup` (`cgroups2::MOUNT_POINT`, whatever `--cgroups_hierarchy` says): the
//!   containerizer, the linux launcher and the agent's start all ask `cgroups2::mounted()`
//!   (`src/linux/cgroups2.cpp` 276-294, `containerizer.cpp` 375-389, `linux_launcher.cpp`
//!   136-146, `slave/main.cpp` 561-570);
//! - upstream `cgroups2::mounted()` fails when cgroup2 is mounted anywhere else, so an upstream
//!   agent does not start at all on a systemd "hybrid" host (v1 controllers, cgroup2 at
//!   `/sys/fs/cgroup/unified`); the build in `../shared/mesos` carries a patch
//!   (`04-cgroups2-hybrid-unified`) that ignores that mount, so such a host runs cgroup v1;
//! - otherwise Mesos uses cgroup v1 and the `devices` hierarchy from the mount table.
//!
//! So: cgroup2 at `/sys/fs/cgroup` → v2 there; else the v1 `devices` hierarchy (hybrid hosts,
//! as the patched Mesos); else (no Mesos would run here) the first cgroup2 mount, for the
//! `mesos-gpu` commands that need no agent.

use std::path::{Path, PathBuf};

use mesos_gpu_os::MountTable;

use super::{CgroupError, CgroupVersion};

/// The cgroup hierarchies that can control device access, as found in a mount table.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CgroupMounts {
    /// Where the cgroup v1 `devices` controller is mounted (first such mount).
    pub v1_devices: Option<PathBuf>,
    /// Where the cgroup2 unified hierarchy is mounted (first such mount).
    pub v2: Option<PathBuf>,
    /// Every cgroup2 mount, in mount table order.
    pub cgroup2: Vec<PathBuf>,
}

/// A chosen hierarchy: its version and mount point.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hierarchy {
    /// v1 (`devices` controller files) or v2 (eBPF programs).
    pub version: CgroupVersion,
    /// The mount point: the v1 `devices` hierarchy or the cgroup2 mount.
    pub mount: PathBuf,
}

impl CgroupMounts {
    /// Reads `/proc/self/mountinfo`.
    pub fn read() -> Result<CgroupMounts, CgroupError> {
        CgroupMounts::read_from(Path::new("/proc/self/mountinfo"))
    }

    /// Reads a mountinfo file at `path`.
    pub(crate) fn read_from(path: &Path) -> Result<CgroupMounts, CgroupError> {
        MountTable::read(path)
            .map(|table| CgroupMounts::of(&table))
            .map_err(|source| CgroupError::Mountinfo { source })
    }

    #[cfg(test)]
    /// Parses the text of a mountinfo file.
    pub(crate) fn parse(mountinfo: &str) -> Result<CgroupMounts, CgroupError> {
        MountTable::parse(mountinfo)
            .map(|table| CgroupMounts::of(&table))
            .map_err(|source| CgroupError::Mountinfo { source })
    }

    /// The cgroup hierarchies of a mount table.
    pub(crate) fn of(table: &MountTable) -> CgroupMounts {
        let mut mounts = CgroupMounts::default();
        for entry in table.entries() {
            match entry.fstype.as_str() {
                "cgroup2" => {
                    let mount = entry.mount_point.clone();
                    mounts.v2.get_or_insert_with(|| mount.clone());
                    mounts.cgroup2.push(mount);
                }
                "cgroup" if mounts.v1_devices.is_none() && entry.has_super_option("devices") => {
                    mounts.v1_devices = Some(entry.mount_point.clone());
                }
                _ => {}
            }
        }
        mounts
    }

    /// The hierarchy Mesos uses (see the module docs): cgroup2 when it is mounted at
    /// `mesos_cgroup2` (Mesos's `/sys/fs/cgroup`, [`super::MESOS_CGROUP2_MOUNT`]), else v1
    /// `devices`, else the first cgroup2 mount.
    pub fn hierarchy(&self, mesos_cgroup2: &Path) -> Result<Hierarchy, CgroupError> {
        if self.cgroup2.iter().any(|m| m == mesos_cgroup2) {
            return Ok(Hierarchy {
                version: CgroupVersion::V2,
                mount: mesos_cgroup2.to_owned(),
            });
        }
        match (&self.v1_devices, &self.v2) {
            (Some(mount), _) => Ok(Hierarchy {
                version: CgroupVersion::V1,
                mount: mount.clone(),
            }),
            (None, Some(mount)) => Ok(Hierarchy {
                version: CgroupVersion::V2,
                mount: mount.clone(),
            }),
            (None, None) => Err(CgroupError::NoHierarchy),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MESOS: &str = super::super::MESOS_CGROUP2_MOUNT;

    /// This project's CI host: hybrid, v1 controllers plus cgroup2 at `unified`.
    const HYBRID: &str = "\
22 27 0:21 / /proc rw,relatime - proc proc rw
27 1 254:0 / / rw,relatime - ext4 /dev/vda rw,discard
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
36 31 0:33 / /sys/fs/cgroup/devices rw,relatime - cgroup cgroup rw,devices
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";

    /// A pure cgroup v2 host (systemd's default), with optional fields before the dash.
    const UNIFIED: &str = "\
24 31 0:22 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw
28 24 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot
";

    #[test]
    fn hybrid_host_prefers_v1_devices() {
        let mounts = CgroupMounts::parse(HYBRID).expect("valid");
        assert_eq!(
            mounts.v1_devices.as_deref(),
            Some(Path::new("/sys/fs/cgroup/devices"))
        );
        assert_eq!(
            mounts.v2.as_deref(),
            Some(Path::new("/sys/fs/cgroup/unified"))
        );
        let h = mounts.hierarchy(Path::new(MESOS)).expect("found");
        assert_eq!(
            h,
            Hierarchy {
                version: CgroupVersion::V1,
                mount: "/sys/fs/cgroup/devices".into()
            }
        );
    }

    /// A private mount namespace of a hybrid host where cgroup2 is mounted over `/sys/fs/cgroup`
    /// (how the end-to-end tests run a cgroup v2 agent here): the v1 mounts are listed but Mesos
    /// finds cgroup2 at `/sys/fs/cgroup`, so v2 it is.
    #[test]
    fn cgroup2_at_sys_fs_cgroup_wins_as_in_mesos() {
        let text =
            format!("{HYBRID}60 31 0:38 / /sys/fs/cgroup rw,relatime - cgroup2 cgroup2 rw\n");
        let mounts = CgroupMounts::parse(&text).expect("valid");
        assert_eq!(
            mounts.cgroup2,
            [
                PathBuf::from("/sys/fs/cgroup/unified"),
                PathBuf::from(MESOS)
            ]
        );
        let h = mounts.hierarchy(Path::new(MESOS)).expect("found");
        assert_eq!(
            h,
            Hierarchy {
                version: CgroupVersion::V2,
                mount: MESOS.into()
            }
        );
    }

    #[test]
    fn unified_host_uses_v2() {
        let h = CgroupMounts::parse(UNIFIED)
            .expect("valid")
            .hierarchy(Path::new(MESOS))
            .expect("found");
        assert_eq!(
            h,
            Hierarchy {
                version: CgroupVersion::V2,
                mount: "/sys/fs/cgroup".into()
            }
        );
    }

    #[test]
    fn co_mounted_devices_and_escaped_paths() {
        let text = "50 31 0:40 / /cg/dev\\040ices rw - cgroup cgroup rw,freezer,devices\n";
        let mounts = CgroupMounts::parse(text).expect("valid");
        assert_eq!(
            mounts.v1_devices.as_deref(),
            Some(Path::new("/cg/dev ices"))
        );
        assert_eq!(mounts.v2, None);
        // `name=devices` is a named hierarchy, not the controller.
        let named = "51 31 0:41 / /cg/named rw - cgroup cgroup rw,name=devices\n";
        assert_eq!(CgroupMounts::parse(named).expect("valid").v1_devices, None);
    }

    #[test]
    fn no_hierarchy_is_an_error() {
        let err = CgroupMounts::parse("22 27 0:21 / /proc rw - proc proc rw\n")
            .expect("valid")
            .hierarchy(Path::new(MESOS))
            .expect_err("none");
        assert!(matches!(err, CgroupError::NoHierarchy), "{err:?}");
        assert!(err.to_string().contains("devices"), "{err}");
    }

    #[test]
    fn malformed_line_is_named() {
        let err = CgroupMounts::parse("22 27 0:21 / /proc rw - proc proc rw\ngarbage line\n")
            .expect_err("bad");
        assert!(
            matches!(
                &err,
                CgroupError::Mountinfo {
                    source: mesos_gpu_os::MountinfoError::Malformed { line: 2, text }
                } if text == "garbage line"
            ),
            "{err:?}"
        );
    }

    #[test]
    fn reads_this_process_mountinfo() {
        // Whatever the host has, the real file parses.
        CgroupMounts::read().expect("/proc/self/mountinfo parses");
    }
}
