//! The mount table, from `/proc/<pid>/mountinfo` text.
//!
//! Facts relied on (proc(5) `/proc/<pid>/mountinfo`, Documentation/filesystems/proc.rst):
//! - Each line is `id parent major:minor root mount-point mount-options [optional…] - fstype
//!   source super-options`; the optional fields (zero or more) end at a lone `-`.
//! - Space, tab, newline and backslash in paths are written as octal escapes (`\040`, `\011`,
//!   `\012`, `\134`).
//! - Mounts are listed in the order they were made; a later mount hides what it covers, so the
//!   mount holding a path is the last one whose mount point is a whole-component prefix of it
//!   (as Mesos's `fs::MountInfoTable` users decide it).

use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt as _;
use std::path::{Path, PathBuf};

use crate::io::{IoContext as _, IoError};

/// Why a mount table could not be read.
#[derive(Debug, thiserror::Error)]
pub enum MountinfoError {
    /// The file could not be read.
    #[error(transparent)]
    Read(IoError),
    /// A line is not in mountinfo format.
    #[error("line {line} of mountinfo is malformed: {text:?}")]
    Malformed {
        /// 1-based line number.
        line: usize,
        /// The line as read.
        text: String,
    },
}

/// One line of the mount table, as far as mesos-gpu needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountEntry {
    /// Where it is mounted (escapes undone).
    pub mount_point: PathBuf,
    /// Per-mount options, e.g. `rw,nosuid,nodev,noexec,relatime`.
    pub options: Vec<String>,
    /// File-system type, e.g. `tmpfs`, `cgroup2`.
    pub fstype: String,
    /// Per-super-block options, e.g. `rw,devices` for a cgroup v1 `devices` hierarchy.
    pub super_options: Vec<String>,
}

impl MountEntry {
    /// True when the per-mount options include `option` (e.g. `noexec`).
    pub fn has_option(&self, option: &str) -> bool {
        self.options.iter().any(|o| o == option)
    }

    /// True when the super-block options include `option` (e.g. `devices`).
    pub fn has_super_option(&self, option: &str) -> bool {
        self.super_options.iter().any(|o| o == option)
    }
}

/// The mounts of one mount namespace, in the order the kernel lists them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MountTable {
    entries: Vec<MountEntry>,
}

impl MountTable {
    /// Reads and parses the mountinfo file at `path` (e.g. `/proc/self/mountinfo`).
    pub fn read(path: &Path) -> Result<MountTable, MountinfoError> {
        let text = std::fs::read_to_string(path)
            .at("read", path)
            .map_err(MountinfoError::Read)?;
        MountTable::parse(&text)
    }

    /// Parses mountinfo text; blank lines are skipped, any other line must be well formed.
    pub fn parse(text: &str) -> Result<MountTable, MountinfoError> {
        let entries = text
            .lines()
            .enumerate()
            .filter(|(_, line)| !line.trim().is_empty())
            .map(|(i, line)| {
                parse_line(line).ok_or_else(|| MountinfoError::Malformed {
                    line: i + 1,
                    text: line.to_owned(),
                })
            })
            .collect::<Result<_, _>>()?;
        Ok(MountTable { entries })
    }

    /// Every mount, in mount order.
    pub fn entries(&self) -> &[MountEntry] {
        &self.entries
    }

    /// The mount holding `path` (absolute, symlinks already resolved): the last listed whose
    /// mount point is a whole-component prefix of it.
    pub fn mount_of(&self, path: &Path) -> Option<&MountEntry> {
        self.entries
            .iter()
            .rev()
            .find(|m| path.starts_with(&m.mount_point))
    }
}

fn parse_line(line: &str) -> Option<MountEntry> {
    let fields: Vec<&str> = line.split(' ').collect();
    let mount_point = fields.get(4)?;
    let options = fields.get(5)?;
    let dash = 6 + fields.get(6..)?.iter().position(|f| *f == "-")?;
    let fstype = fields.get(dash + 1)?;
    let super_options = fields.get(dash + 3)?;
    let list = |s: &str| s.split(',').map(str::to_owned).collect();
    Some(MountEntry {
        mount_point: unescape(mount_point),
        options: list(options),
        fstype: (*fstype).to_owned(),
        super_options: list(super_options),
    })
}

/// Undoes mountinfo's octal escapes (`\040` → space), byte for byte; anything else is kept as
/// written.
fn unescape(field: &str) -> PathBuf {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if let [
            b'\\',
            d0 @ b'0'..=b'3',
            d1 @ b'0'..=b'7',
            d2 @ b'0'..=b'7',
            ..,
        ] = bytes[i..]
        {
            out.push((d0 - b'0') * 64 + (d1 - b'0') * 8 + (d2 - b'0'));
            i += 4;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    PathBuf::from(OsString::from_vec(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    const TABLE: &str = "\
22 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw
25 22 0:21 / /run rw,nosuid,nodev,noexec,relatime shared:5 - tmpfs tmpfs rw,mode=755
30 25 0:40 / /run/mesos/isolators/gpu rw,nosuid,nodev,relatime - tmpfs tmpfs rw,mode=755
31 22 0:41 / /mnt/with\\040space rw,noexec - tmpfs tmpfs rw

32 22 0:42 / /run2 rw - tmpfs tmpfs rw
33 22 0:43 / /run2 rw,noexec - tmpfs tmpfs rw
36 31 0:33 / /sys/fs/cgroup/devices rw,relatime - cgroup cgroup rw,devices
";

    #[test]
    fn parses_fields_with_and_without_optional_ones() {
        let table = MountTable::parse(TABLE).expect("valid");
        assert_eq!(table.entries().len(), 7);
        let run = &table.entries()[1];
        assert_eq!(run.mount_point, Path::new("/run"));
        assert!(run.has_option("noexec"));
        assert_eq!(run.fstype, "tmpfs");
        assert_eq!(run.super_options, ["rw", "mode=755"]);
        let devices = &table.entries()[6];
        assert_eq!(devices.fstype, "cgroup");
        assert!(devices.has_super_option("devices"));
    }

    #[test]
    fn the_last_covering_mount_holds_a_path() {
        let table = MountTable::parse(TABLE).expect("valid");
        let holder = |p: &str| table.mount_of(Path::new(p)).map(|m| m.mount_point.clone());
        assert_eq!(
            holder("/run/mesos/isolators/gpu/nvidia_550.54.14"),
            Some("/run/mesos/isolators/gpu".into())
        );
        assert_eq!(holder("/run/mesos"), Some("/run".into()));
        assert_eq!(holder("/runner"), Some("/".into()), "whole components only");
        let run2 = table.mount_of(Path::new("/run2/x")).expect("mount");
        assert!(
            run2.has_option("noexec"),
            "a later mount shadows an earlier one"
        );
        assert_eq!(holder("/mnt/with space/v"), Some("/mnt/with space".into()));
    }

    #[test]
    fn malformed_lines_are_named() {
        let err = MountTable::parse("22 1 254:0 / / rw - ext4 /dev/vda rw\ngarbage line\n")
            .expect_err("bad");
        assert!(
            matches!(&err, MountinfoError::Malformed { line: 2, text } if text == "garbage line"),
            "{err:?}"
        );
        // A dash among the first six fields is not the separator.
        assert!(MountTable::parse("1 2 3 - 5 6 7\n").is_err());
    }

    #[test]
    fn unescape_is_byte_exact_and_keeps_odd_backslashes() {
        assert_eq!(unescape("a\\134b\\011"), PathBuf::from("a\\b\t"));
        assert_eq!(unescape("a\\x\\01\\400"), PathBuf::from("a\\x\\01\\400"));
        assert_eq!(
            unescape("\\377").into_os_string().into_vec(),
            vec![0xff],
            "not valid UTF-8, kept as the byte"
        );
    }

    #[test]
    fn reads_this_process_mountinfo() {
        let table = MountTable::read(Path::new("/proc/self/mountinfo")).expect("parses");
        assert!(
            table.mount_of(Path::new("/")).is_some(),
            "something is mounted at /"
        );
        let err = MountTable::read(Path::new("/proc/self/no-such-file")).expect_err("missing");
        assert!(err.to_string().contains("no-such-file"), "{err}");
    }
}
