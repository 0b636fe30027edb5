//! The volume root's lock: every change under the root (build, swap, gc, holder files) happens
//! while holding an exclusive `flock` on `<root>/.lock`, so two agents, or an agent and the CLI,
//! never interleave. Readers (`verify`, `list`) take a shared lock on the same file when it
//! exists, opened read-only, so they work on a read-only root and never create it. The flock
//! facts (per open file description, dropped when the holder dies, no symlinks followed) are
//! [`mesos_gpu_os::lock`]'s.

use std::path::Path;

use mesos_gpu_os::{LockError, LockFile, fsmode};

/// The lock file's name in the volume root.
pub const LOCK_NAME: &str = ".lock";

/// An exclusive lock on a volume root, released on drop.
#[derive(Debug)]
pub(crate) struct RootLock {
    _file: LockFile,
}

impl RootLock {
    /// Blocks until the root's lock is held.
    pub(crate) fn acquire(root: &Path) -> Result<RootLock, LockError> {
        let file = LockFile::create(&root.join(LOCK_NAME), fsmode::LOCK_FILE)?;
        file.lock()?;
        tracing::trace!(path = %file.path().display(), "locked volume root");
        Ok(RootLock { _file: file })
    }
}

/// A shared lock on a volume root, for readers; released on drop.
#[derive(Debug)]
pub(crate) struct ReadLock {
    _file: Option<LockFile>,
}

impl ReadLock {
    /// Blocks until no change is under way. A root without a lock file has never been changed by
    /// a writer that is still running: nothing is taken, and nothing is created.
    pub(crate) fn acquire(root: &Path) -> Result<ReadLock, LockError> {
        let file = LockFile::open_existing(&root.join(LOCK_NAME))?;
        if let Some(file) = &file {
            file.lock_shared()?;
        }
        Ok(ReadLock { _file: file })
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
    fn readers_create_nothing_and_wait_for_the_writer() {
        let dir = tempfile::tempdir().expect("tempdir");
        drop(ReadLock::acquire(dir.path()).expect("no lock file"));
        assert!(
            !dir.path().join(LOCK_NAME).exists(),
            "a reader created the lock"
        );
        let writer = RootLock::acquire(dir.path()).expect("lock");
        let entered = AtomicBool::new(false);
        std::thread::scope(|s| {
            s.spawn(|| {
                let _reader = ReadLock::acquire(dir.path()).expect("shared");
                entered.store(true, Ordering::SeqCst);
            });
            std::thread::sleep(Duration::from_millis(100));
            assert!(
                !entered.load(Ordering::SeqCst),
                "a reader got in during a change"
            );
            drop(writer);
        });
        assert!(entered.load(Ordering::SeqCst));
    }
}
