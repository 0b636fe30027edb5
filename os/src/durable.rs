//! Crash-safe replacement of a small file.
//!
//! Facts relied on (POSIX `rename(2)`, Linux `fsync(2)`, `open(2)`): `rename` within one
//! directory atomically replaces the target, so a reader sees the old file or the new one; the
//! new data is durable only after `fsync` of the file, and the rename only after `fsync` of the
//! directory; `O_CREAT|O_EXCL` never follows a symlink. So a replace is: a temp file of our own
//! (`.<name>.<pid>.tmp`, created exclusively), `fsync`, `rename`, `fsync` of the directory.
//! Writers that do not hold a common lock each get their own temp name; the last rename wins.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write as _};
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};

use crate::io::IoError;

/// A step of a replace that failed.
#[derive(Debug, thiserror::Error)]
pub enum DurableError {
    /// A file-system call failed.
    #[error(transparent)]
    Io(#[from] IoError),
    /// The path names no file in a directory (`/`, `..`, empty).
    #[error("{path} names no file to replace")]
    NoFileName {
        /// The path given.
        path: PathBuf,
    },
}

impl DurableError {
    /// The file-system error underneath, if any.
    pub fn io(&self) -> Option<&io::Error> {
        match self {
            DurableError::Io(e) => Some(&e.source),
            DurableError::NoFileName { .. } => None,
        }
    }
}

fn io_err(op: &'static str, path: &Path) -> impl FnOnce(io::Error) -> DurableError {
    let path = path.to_owned();
    move |source| DurableError::Io(IoError::new(op, path, source))
}

/// Replaces `path` with `bytes` (permissions `mode`) crash-safely: temp file, `fsync`, `rename`,
/// `fsync` of the directory.
pub fn replace(path: &Path, bytes: &[u8], mode: u32) -> Result<(), DurableError> {
    stage(path, bytes, mode)?.commit()
}

/// Writes `bytes` durably to a temp file beside `path`; [`Staged::commit`] puts it in place.
/// A leftover temp file of an earlier crashed write by this pid is replaced.
pub fn stage(path: &Path, bytes: &[u8], mode: u32) -> Result<Staged, DurableError> {
    let name = path
        .file_name()
        .ok_or_else(|| DurableError::NoFileName {
            path: path.to_owned(),
        })?
        .to_string_lossy();
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_owned(),
        _ => PathBuf::from("."),
    };
    let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    match fs::remove_file(&tmp) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(io_err("remove", &tmp)(e)),
        _ => {}
    }
    // From here on, dropping `staged` removes the temp file.
    let staged = Staged {
        tmp,
        path: path.to_owned(),
        dir,
        committed: false,
    };
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(&staged.tmp)
        .map_err(io_err("create", &staged.tmp))?;
    file.write_all(bytes)
        .map_err(io_err("write", &staged.tmp))?;
    // The umask may have narrowed `mode`.
    file.set_permissions(std::os::unix::fs::PermissionsExt::from_mode(mode))
        .map_err(io_err("chmod", &staged.tmp))?;
    file.sync_all().map_err(io_err("fsync", &staged.tmp))?;
    Ok(staged)
}

/// A durable temp file waiting to replace its target; removed if dropped uncommitted.
#[derive(Debug)]
pub struct Staged {
    tmp: PathBuf,
    path: PathBuf,
    dir: PathBuf,
    committed: bool,
}

impl Staged {
    /// The temp file.
    pub fn temp_path(&self) -> &Path {
        &self.tmp
    }

    /// Renames the temp file over the target and makes the rename durable.
    pub fn commit(mut self) -> Result<(), DurableError> {
        fs::rename(&self.tmp, &self.path).map_err(io_err("rename into place", &self.path))?;
        self.committed = true;
        sync_dir(&self.dir)
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        if !self.committed {
            let _ = fs::remove_file(&self.tmp);
        }
    }
}

/// Fsyncs directory `dir`, so that entries created, renamed or removed in it are durable.
pub fn sync_dir(dir: &Path) -> Result<(), DurableError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io_err("fsync", dir))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt as _;

    fn temps(dir: &Path) -> Vec<String> {
        fs::read_dir(dir)
            .expect("read dir")
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter(|n| n.ends_with(".tmp"))
            .collect()
    }

    #[test]
    fn replaces_and_leaves_no_temp_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("pool.json");
        fs::write(&path, "old").expect("write");
        replace(&path, b"new", 0o640).expect("replace");
        assert_eq!(fs::read_to_string(&path).expect("read"), "new");
        assert_eq!(
            fs::metadata(&path).expect("stat").permissions().mode() & 0o777,
            0o640
        );
        assert!(temps(dir.path()).is_empty());
    }

    #[test]
    fn staged_file_is_invisible_until_committed_and_removed_when_dropped() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("state.json");
        fs::write(&path, "old").expect("write");
        let staged = stage(&path, b"new", 0o644).expect("stage");
        assert_eq!(fs::read_to_string(staged.temp_path()).expect("read"), "new");
        assert_eq!(fs::read_to_string(&path).expect("read"), "old");
        drop(staged);
        assert!(temps(dir.path()).is_empty());
        assert_eq!(fs::read_to_string(&path).expect("read"), "old");
    }

    #[test]
    fn a_symlink_at_the_temp_name_is_replaced_not_followed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let outside = tempfile::NamedTempFile::new().expect("file");
        let path = dir.path().join("spec.json");
        let tmp = dir
            .path()
            .join(format!(".spec.json.{}.tmp", std::process::id()));
        std::os::unix::fs::symlink(outside.path(), &tmp).expect("ln");
        replace(&path, b"x", 0o644).expect("replace");
        assert_eq!(fs::read_to_string(outside.path()).expect("read"), "");
        assert_eq!(fs::read_to_string(&path).expect("read"), "x");
    }

    #[test]
    fn errors_name_the_step_and_the_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("missing-dir/file.json");
        let err = replace(&path, b"x", 0o644).expect_err("no directory");
        let text = err.to_string();
        assert!(text.starts_with("cannot create "), "{text}");
        assert!(text.contains("missing-dir"), "{text}");
        assert_eq!(err.io().map(io::Error::kind), Some(io::ErrorKind::NotFound));
        let err = replace(Path::new("/"), b"x", 0o644).expect_err("no name");
        assert!(matches!(err, DurableError::NoFileName { .. }), "{err}");
    }
}
