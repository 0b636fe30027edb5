//! Whether binaries in a volume could run: a bind mount keeps the source mount's `noexec`, so a
//! volume root on a `noexec` file system (often `/run`) gives containers a `bin/` they cannot
//! execute. Mesos then mounts a tmpfs (`mode=755`, nosuid, nodev) over the volume directory before
//! filling it (MESOS-5923, `docs/reference/mesos-gpu-isolator.md` §6.2); the caller that may mount
//! (the isolator) does the same when [`exec_blocked`] says so.
//!
//! The mount table is [`mesos_gpu_os::MountTable`]; the mount holding a path is, as Mesos decides
//! it, the last listed whose mount point is a whole-component prefix of it.

use std::path::Path;

use mesos_gpu_os::MountTable;

/// True when `path` (absolute, symlinks already resolved) lies on a mount with the `noexec`
/// option.
pub fn exec_blocked(table: &MountTable, path: &Path) -> bool {
    table.mount_of(path).is_some_and(|m| m.has_option("noexec"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A host whose `/run` is `noexec` (as systemd mounts it), with Mesos's tmpfs over the
    /// volume directory, as MESOS-5923 does it.
    const MOUNTINFO: &str = "\
1 0 8:1 / / rw,relatime - xfs /dev/sda1 rw
2 1 0:5 / /run rw,nosuid,nodev,noexec - tmpfs tmpfs rw
3 2 0:6 / /run/mesos/isolators/gpu rw,nosuid,nodev - tmpfs tmpfs rw,mode=755
";

    #[test]
    fn noexec_of_the_mount_holding_the_path() {
        let table = MountTable::parse(MOUNTINFO).expect("valid");
        assert!(exec_blocked(&table, Path::new("/run/nvidia_550.54.14")));
        assert!(!exec_blocked(
            &table,
            Path::new("/run/mesos/isolators/gpu/nvidia_550.54.14")
        ));
        assert!(!exec_blocked(&table, Path::new("/var/lib/mesos")));
        assert!(!exec_blocked(&MountTable::default(), Path::new("/run")));
    }
}
