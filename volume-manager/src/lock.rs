//! The volume root's lock: every change under the root (build, swap, gc, holder files) happens
//! while holding an exclusive `flock` on `<root>/.lock`, so two agents, or an agent and the CLI,
//! never interleave. Readers (`verify`, `list`) take a shared lock on the same file when it
//! exists, opened read-only, so they work on a read-only root and never create it. `flock` locks belong to the open file description, so two threads of one
//! process exclude each other as well as two processes do; the kernel drops the lock when the
//! holder dies, so a crash never leaves the root locked.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// The lock file's name in the volume root.
pub const LOCK_NAME: &str = ".lock";

/// Why the root could not be locked.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// Opening or locking failed. `ELOOP` here means the lock file is a symlink, which is refused.
    #[error("cannot lock {path}")]
    Io {
        /// The lock file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// The lock file exists but is not a regular file.
    #[error("{path} is not a regular file; refusing to use it as the volume root's lock")]
    NotAFile {
        /// The lock file.
        path: PathBuf,
    },
}

/// An exclusive lock on a volume root, released on drop.
#[derive(Debug)]
pub(crate) struct RootLock {
    _file: File,
}

impl RootLock {
    /// Blocks until the root's lock is held.
    pub(crate) fn acquire(root: &Path) -> Result<RootLock, LockError> {
        let path = root.join(LOCK_NAME);
        let io_err = |source| LockError::Io {
            path: path.clone(),
            source,
        };
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&path)
            .map_err(io_err)?;
        if !file.metadata().map_err(io_err)?.is_file() {
            return Err(LockError::NotAFile { path });
        }
        file.lock().map_err(io_err)?;
        tracing::trace!(path = %path.display(), "locked volume root");
        Ok(RootLock { _file: file })
    }
}

/// A shared lock on a volume root, for readers; released on drop.
#[derive(Debug)]
pub(crate) struct ReadLock {
    _file: Option<File>,
}

impl ReadLock {
    /// Blocks until no change is under way. A root without a lock file has never been changed by
    /// a writer that is still running: nothing is taken, and nothing is created.
    pub(crate) fn acquire(root: &Path) -> Result<ReadLock, LockError> {
        let path = root.join(LOCK_NAME);
        let io_err = |source| LockError::Io {
            path: path.clone(),
            source,
        };
        let file = match OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(&path)
        {
            Ok(file) => file,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(ReadLock { _file: None }),
            Err(e) => return Err(io_err(e)),
        };
        if !file.metadata().map_err(io_err)?.is_file() {
            return Err(LockError::NotAFile { path });
        }
        file.lock_shared().map_err(io_err)?;
        Ok(ReadLock { _file: Some(file) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    #[test]
    fn excludes_other_holders_in_the_same_process() {
        let dir = tempfile::tempdir().expect("tempdir");
        let first = RootLock::acquire(dir.path()).expect("lock");
        let entered = AtomicBool::new(false);
        std::thread::scope(|s| {
            s.spawn(|| {
                let _second = RootLock::acquire(dir.path()).expect("lock");
                entered.store(true, Ordering::SeqCst);
            });
            std::thread::sleep(Duration::from_millis(100));
            assert!(!entered.load(Ordering::SeqCst), "second holder got in");
            drop(first);
        });
        assert!(entered.load(Ordering::SeqCst));
    }

    #[test]
    fn refuses_a_symlinked_lock_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let outside = tempfile::NamedTempFile::new().expect("file");
        std::os::unix::fs::symlink(outside.path(), dir.path().join(LOCK_NAME)).expect("ln");
        let err = RootLock::acquire(dir.path()).expect_err("symlink refused");
        assert!(
            matches!(&err, LockError::Io { source, .. } if source.raw_os_error() == Some(libc::ELOOP)),
            "{err}"
        );
    }
}
