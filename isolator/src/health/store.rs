//! The health checkpoint and the operator's requests, in the work directory.
//!
//! Layout under `<work_dir>/gpu/`:
//! - `health.json`: the [`HealthSnapshot`], replaced crash-safely (write a temp file, fsync,
//!   rename over, fsync the directory), so a reader sees the old or the new state, never half;
//! - `health.lock`: a running [`super::HealthMonitor`] holds an exclusive `flock(2)` on it (std's
//!   `File::try_lock`), released by the kernel when the process dies, so a crashed agent never
//!   leaves a stale lock;
//! - `health-requests/`: one file per operator request (`mark-healthy` of a GPU), written to a
//!   temp name and renamed in, taken and removed by the running monitor.
//!
//! With no monitor running (lock free), the CLI edits `health.json` directly while holding the
//! lock; the next monitor reads it at start.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write as _};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use super::HealthError;
use super::state::{GpuRef, HealthSnapshot};

const CHECKPOINT: &str = "health.json";
const LOCK: &str = "health.lock";
const REQUESTS: &str = "health-requests";
const MARK_HEALTHY: &str = "mark-healthy-";

/// The health files of one agent work directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthStore {
    dir: PathBuf,
}

/// Proof that this process owns the health state; dropping it releases the lock.
#[derive(Debug)]
pub struct StoreLock {
    _file: File,
}

fn io_err<'p>(
    what: &'static str,
    path: &'p Path,
) -> impl FnOnce(io::Error) -> HealthError + use<'p> {
    move |source| HealthError::Io {
        what,
        path: path.to_owned(),
        source,
    }
}

impl HealthStore {
    /// The store of agent work directory `work_dir` (files under `<work_dir>/gpu/`).
    pub fn at(work_dir: &Path) -> HealthStore {
        HealthStore {
            dir: work_dir.join("gpu"),
        }
    }

    /// `<work_dir>/gpu/health.json`.
    pub fn checkpoint_path(&self) -> PathBuf {
        self.dir.join(CHECKPOINT)
    }

    /// The checkpointed state; `None` when none was written yet.
    pub fn load(&self) -> Result<Option<HealthSnapshot>, HealthError> {
        let path = self.checkpoint_path();
        let text = match fs::read(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io_err("read", &path)(e)),
        };
        serde_json::from_slice(&text)
            .map(Some)
            .map_err(|source| HealthError::CheckpointParse { path, source })
    }

    /// Replaces the checkpoint crash-safely.
    pub fn save(&self, snapshot: &HealthSnapshot) -> Result<(), HealthError> {
        fs::create_dir_all(&self.dir).map_err(io_err("create", &self.dir))?;
        let path = self.checkpoint_path();
        let tmp = self
            .dir
            .join(format!(".{CHECKPOINT}.{}.tmp", std::process::id()));
        let bytes =
            serde_json::to_vec_pretty(snapshot).map_err(|source| HealthError::CheckpointParse {
                path: path.clone(),
                source,
            })?;
        let mut file = File::create(&tmp).map_err(io_err("create", &tmp))?;
        file.write_all(&bytes).map_err(io_err("write", &tmp))?;
        file.sync_all().map_err(io_err("fsync", &tmp))?;
        fs::rename(&tmp, &path).map_err(io_err("rename into place", &path))?;
        File::open(&self.dir)
            .and_then(|d| d.sync_all())
            .map_err(io_err("fsync", &self.dir))
    }

    /// Takes the lock; `None` when another monitor (in this or another process) holds it.
    pub fn try_lock(&self) -> Result<Option<StoreLock>, HealthError> {
        fs::create_dir_all(&self.dir).map_err(io_err("create", &self.dir))?;
        let path = self.dir.join(LOCK);
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(io_err("open", &path))?;
        match file.try_lock() {
            Ok(()) => Ok(Some(StoreLock { _file: file })),
            Err(fs::TryLockError::WouldBlock) => Ok(None),
            Err(fs::TryLockError::Error(e)) => Err(io_err("lock", &path)(e)),
        }
    }

    /// Takes the lock like [`Self::try_lock`], but waits up to `wait` for a holder that is about
    /// to let go: an agent still exiting, or a child being spawned by another thread of this
    /// process, which shares the descriptor (and so the `flock`) until it execs.
    pub fn lock_within(&self, wait: Duration) -> Result<Option<StoreLock>, HealthError> {
        let deadline = Instant::now() + wait;
        loop {
            if let Some(lock) = self.try_lock()? {
                return Ok(Some(lock));
            }
            if Instant::now() >= deadline {
                return Ok(None);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Leaves a request for the running monitor to mark `gpu` healthy; returns the request file,
    /// which disappears once the monitor has taken it.
    pub fn request_mark_healthy(&self, gpu: &GpuRef) -> Result<PathBuf, HealthError> {
        let dir = self.dir.join(REQUESTS);
        fs::create_dir_all(&dir).map_err(io_err("create", &dir))?;
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let name = format!("{MARK_HEALTHY}{nanos}-{}", std::process::id());
        let tmp = dir.join(format!(".{name}.tmp"));
        let path = dir.join(name);
        fs::write(&tmp, gpu.to_string()).map_err(io_err("write", &tmp))?;
        fs::rename(&tmp, &path).map_err(io_err("rename into place", &path))?;
        Ok(path)
    }

    /// Takes every pending request, oldest first, removing its file. Unreadable or malformed
    /// requests are logged and removed.
    pub(crate) fn take_requests(&self) -> Vec<GpuRef> {
        let dir = self.dir.join(REQUESTS);
        let Ok(entries) = fs::read_dir(&dir) else {
            return Vec::new();
        };
        let mut names: Vec<PathBuf> = entries
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with(MARK_HEALTHY))
            })
            .collect();
        names.sort();
        let mut requests = Vec::new();
        for path in names {
            let parsed = fs::read_to_string(&path)
                .map_err(|e| e.to_string())
                .and_then(|text| GpuRef::parse(&text).map_err(|e| e.to_string()));
            match parsed {
                Ok(gpu) => requests.push(gpu),
                Err(error) => {
                    tracing::warn!(path = %path.display(), %error, "dropping a bad health request")
                }
            }
            if let Err(error) = fs::remove_file(&path) {
                tracing::warn!(path = %path.display(), %error, "cannot remove a health request");
            }
        }
        requests
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a failed unwrap fails the test at its line
mod tests {
    use super::*;

    #[test]
    fn save_load_and_requests() {
        let work = tempfile::tempdir().unwrap();
        let store = HealthStore::at(work.path());
        assert!(store.load().unwrap().is_none());
        let snap = HealthSnapshot {
            version: HealthSnapshot::VERSION,
            gpus: vec![],
        };
        store.save(&snap).unwrap();
        assert_eq!(store.load().unwrap(), Some(snap));

        let a = store.request_mark_healthy(&GpuRef::Index(3)).unwrap();
        store
            .request_mark_healthy(&GpuRef::Uuid("GPU-abc".to_owned()))
            .unwrap();
        fs::write(a.with_file_name("mark-healthy-zzz"), "nonsense").unwrap();
        let taken = store.take_requests();
        assert_eq!(
            taken,
            [GpuRef::Index(3), GpuRef::Uuid("GPU-abc".to_owned())]
        );
        assert!(!a.exists() && store.take_requests().is_empty());

        fs::write(store.checkpoint_path(), "{").unwrap();
        let err = store.load().unwrap_err();
        assert!(err.to_string().contains("health.json"), "{err}");
    }

    #[test]
    fn lock_is_exclusive_until_dropped() {
        let work = tempfile::tempdir().unwrap();
        let store = HealthStore::at(work.path());
        let held = store.try_lock().unwrap().unwrap();
        assert!(store.try_lock().unwrap().is_none());
        drop(held);
        assert!(store.try_lock().unwrap().is_some());
    }
}
