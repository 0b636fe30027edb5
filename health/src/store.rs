//! The health checkpoint and the operator's requests, in the work directory.
//!
//! Layout under `<work_dir>/gpu/`:
//! - `health.json`: the [`HealthSnapshot`], replaced crash-safely ([`mesos_gpu_os::durable`]:
//!   temp file, fsync, rename over, fsync the directory), so a reader sees the old or the new
//!   state, never half;
//! - `health.lock`: a running [`super::HealthMonitor`] holds an exclusive `flock(2)` on it
//!   ([`mesos_gpu_os::LockFile`]), released by the kernel when the process dies, so a crashed
//!   agent never leaves a stale lock;
//! - `health-requests/`: one file per operator request (`mark-healthy-<id>`, naming a GPU),
//!   replaced in the same way. The running monitor acts on it, checkpoints, leaves
//!   its answer in `done-<id>` and only then removes the request: whoever sees the request gone
//!   finds the checkpoint already saved and the answer waiting. Answers nobody collected are
//!   removed after [`ANSWER_TTL`].
//!
//! Directories are made 0755 and files 0644 whatever the umask, in a work directory checked as
//! the checkpoint's ([`mesos_gpu_os::fsmode::state_dir`]).
//!
//! With no monitor running (lock free), the CLI edits `health.json` directly while holding the
//! lock; the next monitor reads it at start. Reading (`load`, `monitor_running`) never creates or
//! changes a file.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use mesos_gpu_os::{JsonFile, LockFile, StoreError, durable, fsmode};

use super::HealthError;
use super::state::{GpuRef, HealthSnapshot};

const CHECKPOINT: &str = "health.json";
const LOCK: &str = "health.lock";
const REQUESTS: &str = "health-requests";
const MARK_HEALTHY: &str = "mark-healthy-";
const ANSWER: &str = "done-";

/// How long an answer waits for the command that asked; then the monitor removes it.
pub(crate) const ANSWER_TTL: Duration = Duration::from_secs(600);

/// The health files of one agent work directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthStore {
    dir: PathBuf,
}

/// An operator request taken by the running monitor, answered with [`HealthStore::answer`].
#[derive(Debug)]
pub(crate) struct Request {
    /// The GPU to mark healthy.
    pub(crate) gpu: GpuRef,
    path: PathBuf,
}

/// The running monitor's answer to a `mark-healthy` request.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RequestAnswer {
    /// True when the GPU is healthy now (marked, or already healthy).
    pub ok: bool,
    /// What was done, or why not.
    pub message: String,
}

/// Proof that this process owns the health state; dropping it releases the lock.
#[derive(Debug)]
pub struct StoreLock {
    _file: LockFile,
}

fn io_err<'p>(
    what: &'static str,
    path: &'p Path,
) -> impl FnOnce(io::Error) -> HealthError + use<'p> {
    move |source| HealthError::Io(mesos_gpu_os::IoError::new(what, path, source))
}

impl HealthStore {
    /// The store of agent work directory `work_dir` (files under `<work_dir>/gpu/`).
    pub fn at(work_dir: &Path) -> HealthStore {
        HealthStore {
            dir: work_dir.join("gpu"),
        }
    }

    /// Makes `dir` (the store's directory or one in it) 0755 where missing, and checks it and
    /// the work directory above it.
    fn make_dir(&self, dir: &Path) -> Result<(), HealthError> {
        let work_dir = self.dir.parent().unwrap_or(&self.dir);
        Ok(fsmode::state_dir(work_dir, dir, fsmode::STATE_DIR)?)
    }

    /// `<work_dir>/gpu/health.json`.
    pub fn checkpoint_path(&self) -> PathBuf {
        self.dir.join(CHECKPOINT)
    }

    /// The checkpointed state; `None` when none was written yet.
    pub fn load(&self) -> Result<Option<HealthSnapshot>, HealthError> {
        self.file().load().map_err(|e| match e {
            StoreError::Parse { path, source, .. } => HealthError::CheckpointParse { path, source },
            other => HealthError::Checkpoint(other),
        })
    }

    fn file(&self) -> JsonFile {
        JsonFile::at(self.checkpoint_path(), fsmode::STATE_FILE)
    }

    /// Replaces the checkpoint crash-safely.
    pub fn save(&self, snapshot: &HealthSnapshot) -> Result<(), HealthError> {
        self.make_dir(&self.dir)?;
        Ok(self.file().save(snapshot)?)
    }

    /// True when a monitor holds the lock. Creates nothing: a missing lock file means no monitor
    /// has ever run here.
    pub fn monitor_running(&self) -> Result<bool, HealthError> {
        let path = self.dir.join(LOCK);
        let Some(file) = LockFile::open_existing(&path)? else {
            return Ok(false);
        };
        // A shared lock is refused only while a monitor holds its exclusive one.
        Ok(!file.try_lock_shared()?)
    }

    /// Takes the lock; `None` when another monitor (in this or another process) holds it.
    pub fn try_lock(&self) -> Result<Option<StoreLock>, HealthError> {
        self.lock_within(Duration::ZERO)
    }

    /// Takes the lock like [`Self::try_lock`], but waits up to `wait` for a holder that is about
    /// to let go: an agent still exiting, or a child being spawned by another thread of this
    /// process, which shares the descriptor (and so the `flock`) until it execs.
    pub(crate) fn lock_within(&self, wait: Duration) -> Result<Option<StoreLock>, HealthError> {
        self.make_dir(&self.dir)?;
        let file = LockFile::create(&self.dir.join(LOCK), fsmode::LOCK_FILE)?;
        Ok(file.lock_within(wait)?.then_some(StoreLock { _file: file }))
    }

    /// Leaves a request for the running monitor to mark `gpu` healthy; returns the request file,
    /// which disappears once the monitor has taken it.
    pub fn request_mark_healthy(&self, gpu: &GpuRef) -> Result<PathBuf, HealthError> {
        let dir = self.dir.join(REQUESTS);
        self.make_dir(&dir)?;
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let name = format!("{MARK_HEALTHY}{nanos}-{}", std::process::id());
        let path = dir.join(name);
        durable::replace(&path, gpu.to_string().as_bytes(), fsmode::STATE_FILE)?;
        Ok(path)
    }

    /// Every pending request, oldest first. Their files stay until [`Self::answer`]; unreadable
    /// or malformed ones are logged and removed, and so are answers older than [`ANSWER_TTL`].
    pub(crate) fn take_requests(&self) -> Vec<Request> {
        let dir = self.dir.join(REQUESTS);
        let Ok(entries) = fs::read_dir(&dir) else {
            return Vec::new();
        };
        let mut names = Vec::new();
        for entry in entries.filter_map(Result::ok) {
            let path = entry.path();
            let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
                continue;
            };
            if name.starts_with(MARK_HEALTHY) {
                names.push(path);
            } else if name.starts_with(ANSWER)
                && entry
                    .metadata()
                    .and_then(|m| m.modified())
                    .is_ok_and(|t| t.elapsed().is_ok_and(|age| age > ANSWER_TTL))
            {
                let _ = fs::remove_file(&path);
            }
        }
        names.sort();
        let mut requests = Vec::new();
        for path in names {
            let parsed = fs::read_to_string(&path)
                .map_err(|e| e.to_string())
                .and_then(|text| GpuRef::parse(&text).map_err(|e| e.to_string()));
            match parsed {
                Ok(gpu) => requests.push(Request { gpu, path }),
                Err(error) => {
                    tracing::warn!(path = %path.display(), %error, "dropping a bad health request");
                    remove_request(&path);
                }
            }
        }
        requests
    }

    /// Leaves `answer` for the command that made `request`, then removes the request. Call it
    /// after the checkpoint holds the request's effect.
    pub(crate) fn answer(&self, request: Request, answer: &RequestAnswer) {
        let answer_path = answer_path(&request.path);
        let written = serde_json::to_vec(answer)
            .map_err(|e| e.to_string())
            .and_then(|bytes| {
                durable::replace(&answer_path, &bytes, fsmode::STATE_FILE)
                    .map_err(|e| mesos_gpu_os::error_chain(&e))
            });
        if let Err(error) = written {
            tracing::warn!(path = %answer_path.display(), %error, "cannot answer a health request");
        }
        remove_request(&request.path);
    }

    /// The running monitor's answer to `request` (a path from [`Self::request_mark_healthy`]),
    /// once the request is gone; `None` while it is pending, or when a monitor older than answer
    /// files took it. The answer file is removed.
    pub fn take_answer(&self, request: &Path) -> Result<Option<RequestAnswer>, HealthError> {
        if request.exists() {
            return Ok(None);
        }
        let path = answer_path(request);
        let bytes = match fs::read(&path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io_err("read", &path)(e)),
        };
        let _ = fs::remove_file(&path);
        serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|source| HealthError::CheckpointParse { path, source })
    }
}

/// `…/health-requests/done-<id>` for `…/health-requests/mark-healthy-<id>`.
fn answer_path(request: &Path) -> PathBuf {
    let name = request
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.strip_prefix(MARK_HEALTHY))
        .unwrap_or_default();
    request.with_file_name(format!("{ANSWER}{name}"))
}

fn remove_request(path: &Path) {
    if let Err(error) = fs::remove_file(path) {
        tracing::warn!(path = %path.display(), %error, "cannot remove a health request");
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
            gpus: vec![],
            mig: vec![],
        };
        store.save(&snap).unwrap();
        assert_eq!(store.load().unwrap(), Some(snap.clone()));
        let text = fs::read_to_string(store.checkpoint_path()).unwrap();
        fs::write(
            store.checkpoint_path(),
            text.replace("\"version\": 1", "\"version\": 9"),
        )
        .unwrap();
        let err = store.load().unwrap_err();
        assert!(err.to_string().contains("version 9"), "{err}");
        store.save(&snap).unwrap();

        let a = store.request_mark_healthy(&GpuRef::Index(3)).unwrap();
        store
            .request_mark_healthy(&GpuRef::Uuid("GPU-abc".to_owned()))
            .unwrap();
        fs::write(a.with_file_name("mark-healthy-zzz"), "nonsense").unwrap();
        let taken = store.take_requests();
        let gpus: Vec<&GpuRef> = taken.iter().map(|r| &r.gpu).collect();
        assert_eq!(
            gpus,
            [&GpuRef::Index(3), &GpuRef::Uuid("GPU-abc".to_owned())]
        );
        assert!(a.exists(), "a request stays until it is answered");
        assert!(store.take_answer(&a).unwrap().is_none(), "still pending");
        let answer = RequestAnswer {
            ok: true,
            message: "GPU 3 marked healthy".into(),
        };
        for request in taken {
            store.answer(request, &answer);
        }
        assert!(!a.exists() && store.take_requests().is_empty());
        assert_eq!(store.take_answer(&a).unwrap(), Some(answer));
        assert!(store.take_answer(&a).unwrap().is_none(), "taken once");

        fs::write(store.checkpoint_path(), "{").unwrap();
        let err = store.load().unwrap_err();
        assert!(err.to_string().contains("health.json"), "{err}");
    }

    #[test]
    fn reading_creates_nothing() {
        let work = tempfile::tempdir().unwrap();
        let store = HealthStore::at(work.path());
        assert!(!store.monitor_running().unwrap());
        assert!(store.load().unwrap().is_none());
        assert!(!work.path().join("gpu").exists(), "nothing created");
        let held = store.try_lock().unwrap().unwrap();
        assert!(store.monitor_running().unwrap());
        drop(held);
        assert!(!store.monitor_running().unwrap());
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
