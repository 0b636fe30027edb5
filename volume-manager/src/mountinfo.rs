//! Whether binaries in a volume could run: a bind mount keeps the source mount's `noexec`, so a
//! volume root on a `noexec` file system (often `/run`) gives containers a `bin/` they cannot
//! execute. Mesos then mounts a tmpfs (`mode=755`, nosuid, nodev) over the volume directory
//! before filling it (MESOS-5923, `shared/reference/mesos_gpu.md` §4.2); the caller that may mount
//! (the isolator) does the same when [`exec_blocked`] says so.
//!
//! `/proc/self/mountinfo` lines (proc(5)): `id parent major:minor root mount-point options
//! [optional…] - fstype source super-options`, with space, tab, newline and backslash in paths
//! written as octal escapes (`\040`). The mount holding a path is, as Mesos decides it, the last
//! listed whose mount point is a whole-component prefix of it: mounts are listed in the order they
//! were made, and a later mount hides what it covers.

use std::path::{Path, PathBuf};

/// One mount, as far as this module needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    /// Where it is mounted.
    pub mount_point: PathBuf,
    /// Per-mount options, e.g. `rw,nosuid,nodev,noexec,relatime`.
    pub options: Vec<String>,
    /// File-system type, e.g. `tmpfs`.
    pub fstype: String,
}

/// The mount holding `path` (absolute, symlinks already resolved), from mountinfo text.
pub fn mount_of(mountinfo: &str, path: &Path) -> Option<Mount> {
    mountinfo
        .lines()
        .rev()
        .filter_map(parse_line)
        .find(|m| path.starts_with(&m.mount_point))
}

/// True when `path` lies on a mount with the `noexec` option.
pub fn exec_blocked(mountinfo: &str, path: &Path) -> bool {
    mount_of(mountinfo, path).is_some_and(|m| m.options.iter().any(|o| o == "noexec"))
}

fn parse_line(line: &str) -> Option<Mount> {
    let mut fields = line.split(' ');
    let mount_point = unescape(fields.nth(4)?);
    let options = fields.next()?.split(',').map(str::to_owned).collect();
    let fstype = fields.skip_while(|f| *f != "-").nth(1)?.to_owned();
    Some(Mount {
        mount_point: PathBuf::from(mount_point),
        options,
        fstype,
    })
}

/// Undoes the kernel's `\ooo` octal escapes.
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes
            .get(i + 1..i + 4)
            .filter(|d| d.iter().all(|b| (b'0'..=b'7').contains(b)));
        match (bytes[i], octal) {
            (b'\\', Some(d)) => {
                let value = d.iter().fold(0u32, |acc, b| acc * 8 + u32::from(b - b'0'));
                out.push(u8::try_from(value).unwrap_or(b'?'));
                i += 4;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTINFO: &str = "\
22 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw
25 22 0:21 / /run rw,nosuid,nodev,noexec,relatime shared:5 - tmpfs tmpfs rw,mode=755
30 25 0:40 / /run/mesos/isolators/gpu rw,nosuid,nodev,relatime - tmpfs tmpfs rw,mode=755
31 22 0:41 / /mnt/with\\040space rw,noexec - tmpfs tmpfs rw
32 22 0:42 / /run2 rw - tmpfs tmpfs rw
33 22 0:43 / /run2 rw,noexec - tmpfs tmpfs rw
";

    #[test]
    fn finds_the_last_covering_mount() {
        let m = mount_of(
            MOUNTINFO,
            Path::new("/run/mesos/isolators/gpu/nvidia_550.54.14"),
        )
        .expect("mount");
        assert_eq!(m.mount_point, Path::new("/run/mesos/isolators/gpu"));
        assert_eq!(m.fstype, "tmpfs");
        assert!(!exec_blocked(
            MOUNTINFO,
            Path::new("/run/mesos/isolators/gpu")
        ));
        assert!(exec_blocked(MOUNTINFO, Path::new("/run/mesos")));
        assert!(exec_blocked(MOUNTINFO, Path::new("/run")));
        assert!(
            !exec_blocked(MOUNTINFO, Path::new("/runner")),
            "whole components only"
        );
        assert!(!exec_blocked(MOUNTINFO, Path::new("/var/lib")));
    }

    #[test]
    fn later_mounts_shadow_earlier_ones() {
        assert!(exec_blocked(MOUNTINFO, Path::new("/run2/x")));
    }

    #[test]
    fn unescapes_mount_points() {
        assert!(exec_blocked(MOUNTINFO, Path::new("/mnt/with space/v")));
        assert_eq!(unescape("a\\134b\\011"), "a\\b\t");
        assert_eq!(unescape("trailing\\12"), "trailing\\12");
    }

    #[test]
    fn garbage_is_ignored() {
        assert_eq!(mount_of("nonsense\n\n1 2 3\n", Path::new("/")), None);
    }
}
