//! `flock(2)` lock files, and waiting for them a bounded time.
//!
//! Facts relied on (flock(2)): a lock belongs to the open file description, so two opens of one
//! file conflict even within one process (two threads exclude each other as two processes do),
//! and a forked child shares its parent's description, so it holds the parent's lock until it
//! execs or exits; the kernel drops the lock when the last descriptor closes, so a crash never
//! leaves a file locked. A lock file is opened with `O_NOFOLLOW` (a symlink planted at its name
//! fails with `ELOOP`) and `O_NONBLOCK` (a FIFO there cannot hang the open), and must be a
//! regular file.

use std::fs::{File, OpenOptions, TryLockError};
use std::io;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::io::{IoContext as _, IoError};

/// The first pause between attempts of [`LockFile::lock_within`]; it doubles up to
/// [`MAX_POLL`], so a lock held for a short transaction is taken within a millisecond or two
/// and a long wait costs few wake-ups.
const FIRST_POLL: Duration = Duration::from_millis(1);
/// The longest pause between attempts of [`LockFile::lock_within`].
const MAX_POLL: Duration = Duration::from_millis(20);

/// The step named when a lock file cannot be opened.
const OPEN: &str = "open lock file";

/// Why a lock file could not be opened or locked.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// Opening failed ("cannot open lock file <path>"). `ELOOP` here means the lock file is a
    /// symlink, which is refused.
    #[error(transparent)]
    Open(IoError),
    /// The lock file exists but is not a regular file.
    #[error("{path} is not a regular file; refusing to use it as a lock file")]
    NotAFile {
        /// The lock file.
        path: PathBuf,
    },
    /// `flock` itself failed (not "held by another": that is an answer, not an error).
    #[error(transparent)]
    Lock(IoError),
}

/// An open lock file. A lock taken through it is held until it is dropped.
#[derive(Debug)]
pub struct LockFile {
    file: File,
    path: PathBuf,
}

impl LockFile {
    /// Opens `path` for reading and writing, creating it; it gets exactly permissions `mode`
    /// whatever the umask (see [`crate::fsmode`]).
    pub fn create(path: &Path, mode: u32) -> Result<LockFile, LockError> {
        let opened = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(mode)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(path);
        let lock = LockFile::checked(path, opened)?;
        crate::fsmode::set_mode(&lock.file, mode)
            .at(OPEN, path)
            .map_err(LockError::Open)?;
        Ok(lock)
    }

    /// Opens an existing lock file read-only, for shared locks on a root that may be read-only;
    /// `None` when there is no such file. Creates nothing.
    pub fn open_existing(path: &Path) -> Result<Option<LockFile>, LockError> {
        let opened = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(path);
        match opened {
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            opened => LockFile::checked(path, opened).map(Some),
        }
    }

    fn checked(path: &Path, opened: io::Result<File>) -> Result<LockFile, LockError> {
        let open_err = |source| LockError::Open(IoError::new(OPEN, path, source));
        let file = opened.map_err(open_err)?;
        if !file.metadata().map_err(open_err)?.is_file() {
            return Err(LockError::NotAFile {
                path: path.to_owned(),
            });
        }
        Ok(LockFile {
            file,
            path: path.to_owned(),
        })
    }

    /// The lock file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The open file, e.g. to read or write a note naming the holder.
    pub fn file(&self) -> &File {
        &self.file
    }

    fn lock_err(&self, source: io::Error) -> LockError {
        LockError::Lock(IoError::new("lock", &self.path, source))
    }

    /// Takes the exclusive lock, waiting as long as it takes.
    pub fn lock(&self) -> Result<(), LockError> {
        self.file.lock().map_err(|e| self.lock_err(e))
    }

    /// Takes a shared lock, waiting as long as an exclusive holder keeps it.
    pub fn lock_shared(&self) -> Result<(), LockError> {
        self.file.lock_shared().map_err(|e| self.lock_err(e))
    }

    /// Takes the exclusive lock if it is free now; `false` when another description holds it.
    pub fn try_lock(&self) -> Result<bool, LockError> {
        self.answer(self.file.try_lock())
    }

    /// Takes a shared lock unless an exclusive one is held now; `false` when one is.
    pub fn try_lock_shared(&self) -> Result<bool, LockError> {
        self.answer(self.file.try_lock_shared())
    }

    fn answer(&self, tried: Result<(), TryLockError>) -> Result<bool, LockError> {
        match tried {
            Ok(()) => Ok(true),
            Err(TryLockError::WouldBlock) => Ok(false),
            Err(TryLockError::Error(e)) => Err(self.lock_err(e)),
        }
    }

    /// Takes the exclusive lock, waiting at most `wait` for the holder to let go; `false` when it
    /// still holds it then. For holders that keep a lock briefly: a transaction, an agent still
    /// exiting, a child between `fork` and `exec` that shares the descriptor.
    pub fn lock_within(&self, wait: Duration) -> Result<bool, LockError> {
        let deadline = Instant::now() + wait;
        let mut pause = FIRST_POLL;
        loop {
            if self.try_lock()? {
                return Ok(true);
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(false);
            }
            std::thread::sleep(pause.min(deadline - now));
            pause = (pause * 2).min(MAX_POLL);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};

    #[test]
    fn two_opens_in_one_process_exclude_each_other() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("pool.lock");
        let first = LockFile::create(&path, 0o600).expect("open");
        assert!(first.lock_within(Duration::ZERO).expect("lock"));
        let second = LockFile::create(&path, 0o600).expect("open");
        assert!(!second.try_lock().expect("try"));
        assert!(!second.try_lock_shared().expect("try shared"));
        let started = Instant::now();
        assert!(!second.lock_within(Duration::from_millis(50)).expect("wait"));
        assert!(started.elapsed() >= Duration::from_millis(50));
        drop(first);
        assert!(second.try_lock().expect("free again"));
    }

    #[test]
    fn lock_within_takes_a_lock_released_during_the_wait() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("pool.lock");
        let held = LockFile::create(&path, 0o600).expect("open");
        held.lock().expect("lock");
        let released = AtomicBool::new(false);
        std::thread::scope(|s| {
            s.spawn(|| {
                std::thread::sleep(Duration::from_millis(30));
                released.store(true, Ordering::SeqCst);
                drop(held);
            });
            let waiter = LockFile::create(&path, 0o600).expect("open");
            assert!(waiter.lock_within(Duration::from_secs(5)).expect("wait"));
            assert!(released.load(Ordering::SeqCst));
        });
    }

    #[test]
    fn shared_locks_coexist_and_keep_writers_out() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join(".lock");
        assert!(LockFile::open_existing(&path).expect("absent").is_none());
        assert!(!path.exists(), "open_existing created the file");
        let writer = LockFile::create(&path, 0o600).expect("create");
        let a = LockFile::open_existing(&path)
            .expect("open")
            .expect("exists");
        let b = LockFile::open_existing(&path)
            .expect("open")
            .expect("exists");
        a.lock_shared().expect("shared");
        assert!(b.try_lock_shared().expect("shared too"));
        assert!(!writer.try_lock().expect("writer waits"));
    }

    #[test]
    fn refuses_symlinks_and_non_files() {
        let dir = tempfile::tempdir().expect("tempdir");
        let outside = tempfile::NamedTempFile::new().expect("file");
        let link = dir.path().join("link.lock");
        std::os::unix::fs::symlink(outside.path(), &link).expect("ln");
        let err = LockFile::create(&link, 0o600).expect_err("symlink");
        assert!(
            matches!(&err, LockError::Open(e) if e.source.raw_os_error() == Some(libc::ELOOP)),
            "{err}"
        );
        let err = LockFile::open_existing(dir.path()).expect_err("a directory");
        assert!(matches!(err, LockError::NotAFile { .. }), "{err}");
        assert!(err.to_string().contains("not a regular file"), "{err}");
    }
}
