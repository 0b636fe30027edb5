//! Running a command under `umask 000` and listing the modes of what it created: the check that
//! every directory and file mesos-gpu makes gets its own mode whatever the umask
//! (`mesos_gpu_os::fsmode`), none of them writable by group or others unless documented.

use std::collections::BTreeSet;
use std::fmt;
use std::fs;
use std::os::unix::fs::{FileTypeExt as _, MetadataExt as _};
use std::path::{Path, PathBuf};
use std::process::Command;

/// `cmd` run by `sh -c 'umask 000; exec "$@"'`: the same program, arguments and environment, in
/// a real child process whose umask is 000 (as under a supervisor's `UMask=0000`).
pub fn under_umask_000(cmd: &Command) -> Command {
    let mut wrapped = Command::new("sh");
    wrapped
        .args(["-c", "umask 000; exec \"$@\"", "sh"])
        .arg(cmd.get_program())
        .args(cmd.get_args());
    for (key, value) in cmd.get_envs() {
        match value {
            Some(v) => wrapped.env(key, v),
            None => wrapped.env_remove(key),
        };
    }
    if let Some(dir) = cmd.get_current_dir() {
        wrapped.current_dir(dir);
    }
    wrapped
}

/// One entry found under a root: its path, what it is, and its mode bits.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Entry {
    /// The path.
    pub path: PathBuf,
    /// `d` directory, `f` file, `l` symlink, `s` socket, `c` character device, `p` FIFO, `?`.
    pub kind: char,
    /// `st_mode & 0o7777`.
    pub mode: u32,
}

impl fmt::Display for Entry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {:04o} {}", self.kind, self.mode, self.path.display())
    }
}

/// Every path under `root` (not `root` itself), symlinks not followed.
pub fn paths(root: &Path) -> BTreeSet<PathBuf> {
    listing(root).into_iter().map(|e| e.path).collect()
}

/// Every entry under `root` (not `root` itself), sorted; symlinks are listed, not followed.
pub fn listing(root: &Path) -> Vec<Entry> {
    let mut out = Vec::new();
    walk(root, &mut out);
    out.sort();
    out
}

fn walk(dir: &Path, out: &mut Vec<Entry>) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let Ok(meta) = fs::symlink_metadata(&path) else {
            continue;
        };
        let t = meta.file_type();
        let kind = if t.is_dir() {
            'd'
        } else if t.is_file() {
            'f'
        } else if t.is_symlink() {
            'l'
        } else if t.is_socket() {
            's'
        } else if t.is_char_device() {
            'c'
        } else if t.is_fifo() {
            'p'
        } else {
            '?'
        };
        out.push(Entry {
            path: path.clone(),
            kind,
            mode: meta.mode() & 0o7777,
        });
        if t.is_dir() {
            walk(&path, out);
        }
    }
}

/// The entries of `now` not in `before`: what a command created.
pub fn created(now: Vec<Entry>, before: &BTreeSet<PathBuf>) -> Vec<Entry> {
    now.into_iter()
        .filter(|e| !before.contains(&e.path))
        .collect()
}

/// Fails, listing them, when an entry (not a symlink, whose mode means nothing) is writable by
/// group or others, unless its file name is in `allowed` with exactly that mode. Prints the
/// listing under `title` either way.
pub fn check_created(
    title: &str,
    entries: &[Entry],
    allowed: &[(&str, u32)],
) -> Result<(), String> {
    eprintln!("{title}: created under umask 000:");
    for e in entries {
        eprintln!("  {e}");
    }
    let bad: Vec<String> = entries
        .iter()
        .filter(|e| e.kind != 'l' && e.mode & 0o022 != 0)
        .filter(|e| {
            let name = e.path.file_name().and_then(|n| n.to_str()).unwrap_or("");
            !allowed.iter().any(|&(n, m)| n == name && m == e.mode)
        })
        .map(ToString::to_string)
        .collect();
    if entries.is_empty() {
        return Err(format!("{title}: nothing was created"));
    }
    if bad.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "{title}: writable by group or others under umask 000:\n  {}",
            bad.join("\n  ")
        ))
    }
}

/// Parses lines `<kind> <octal mode> <path>` (as `find -printf '%y %m %p\n'` writes them) into
/// entries, for listings taken inside a command while it runs.
pub fn parse_find(text: &str) -> Vec<Entry> {
    text.lines()
        .filter_map(|l| {
            let mut parts = l.splitn(3, ' ');
            let kind = parts.next()?.chars().next()?;
            let mode = u32::from_str_radix(parts.next()?, 8).ok()?;
            let path = PathBuf::from(parts.next()?);
            Some(Entry { path, kind, mode })
        })
        .collect()
}
