//! The crash-safe checkpoint of the isolator's allocations: `<work_dir>/gpu/allocations.json`.
//!
//! Writes are crash-safe replaces (temp file, `fsync`, `rename`, `fsync` of the directory:
//! [`mesos_gpu_os::durable`]), so a reader sees the old checkpoint or the new one, never a mix.
//!
//! `<work_dir>` and `gpu/` are made 0755, the checkpoint and its lock 0644, whatever the umask;
//! a work directory that another user can write or owns is refused
//! ([`mesos_gpu_os::fsmode`]): whoever can rename the checkpoint can stop every GPU task.
//!
//! The schema is versioned ([`SCHEMA_VERSION`]); a file with another version is refused, never
//! guessed at. GPUs are recorded by index, minor and UUID, so recovery can tell when the node's
//! GPUs changed under a checkpoint (or when it cannot see them: then the records are written
//! back as they are, see [`super::state`]); a UUID is never empty.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use mesos_gpu_os::{Document, FsModeError, JsonFile, LockError, LockFile, StoreError, fsmode};
use serde::{Deserialize, Serialize};

use super::fault;
use mesos_gpu_enforce::timing::{self, Step};

/// The schema version this code reads and writes.
pub(crate) const SCHEMA_VERSION: u32 = 1;
/// The checkpoint's file name inside `<work_dir>/gpu`.
pub(crate) const FILE_NAME: &str = "allocations.json";
/// The lock file that keeps two isolators off one work directory.
pub(crate) const LOCK_NAME: &str = "allocations.lock";
/// How long [`Store::open`] waits for a lock another holder is about to release.
const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// Why the checkpoint could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// A file operation failed.
    #[error(transparent)]
    Io(#[from] mesos_gpu_os::IoError),
    /// The file could not be read or replaced (not a checkpoint of ours, another schema
    /// version, a failed write).
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Another isolator holds the work directory.
    #[error("{path} is locked by another mesos-gpu isolator using the same work directory")]
    Locked {
        /// The lock file.
        path: PathBuf,
    },
    /// The lock file could not be opened or locked.
    #[error(transparent)]
    Lock(#[from] LockError),
    /// The work directory could not be made, or is refused as others can write it.
    #[error(transparent)]
    Dir(#[from] FsModeError),
}

/// One GPU as recorded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct GpuRecord {
    pub(crate) index: u32,
    pub(crate) minor: u32,
    pub(crate) uuid: mesos_gpu_pool::GpuUuid,
}

/// A Mesos container's allocation: its GPUs and its full device allow list.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ContainerRecord {
    pub(crate) gpus: Vec<GpuRecord>,
    /// Rules in `devices.list` syntax, normalized.
    pub(crate) rules: Vec<String>,
    /// Its share of a shared GPU (absent for whole GPUs and in older checkpoints).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) share: Option<mesos_gpu_placement::sharing::PlacedShare>,
    /// Its MIG devices by `MIG-…` UUID (absent without and in older checkpoints).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) mig: Vec<String>,
    /// MIG devices held out of service for it after a layout change (absent when none).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) mig_quarantine: Vec<String>,
}

/// Everything the isolator must remember across a restart (schema [`SCHEMA_VERSION`]).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub(crate) struct Checkpoint {
    /// Mesos containerizer containers by id.
    pub(crate) containers: BTreeMap<String, ContainerRecord>,
    /// Docker containerizer containers by id.
    pub(crate) docker: BTreeMap<String, Vec<GpuRecord>>,
    /// The shares of Docker containers holding one, by id (their `docker` entry is empty).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub(crate) docker_shares: BTreeMap<String, mesos_gpu_placement::sharing::PlacedShare>,
    /// The MIG devices of Docker containers holding some, by id.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub(crate) docker_mig: BTreeMap<String, Vec<String>>,
    /// The daemon and starter of Docker containers by id (absent in older checkpoints).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub(crate) docker_starts: BTreeMap<String, super::docker_owner::DockerStart>,
    /// Whose each container is (Mesos or Docker), by id, when the containerizer said (absent
    /// when none and in older checkpoints).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub(crate) holders: BTreeMap<String, mesos_gpu_pool::Holder>,
    /// GPUs whose owner is uncertain, by index, with the containers whose cleanup frees them.
    pub(crate) quarantine: BTreeMap<u32, Vec<String>>,
}

impl Document for Checkpoint {
    const VERSION: u32 = SCHEMA_VERSION;
    const WHAT: &'static str = "checkpoint";
}

/// The checkpoint file of one work directory, locked for this process.
#[derive(Debug)]
pub(crate) struct Store {
    file: JsonFile,
    /// Held open for its `flock`; released when the store is dropped.
    _lock: LockFile,
}

impl Store {
    /// Opens (creating) `<work_dir>/gpu` and takes its lock, waiting at most [`LOCK_WAIT`].
    pub(crate) fn open(work_dir: &Path) -> Result<Store, CheckpointError> {
        let dir = work_dir.join("gpu");
        fsmode::state_dir(work_dir, &dir, fsmode::STATE_DIR)?;
        let lock = LockFile::create(&dir.join(LOCK_NAME), fsmode::LOCK_FILE)?;
        // A lock that is busy for a moment is waited for, up to LOCK_WAIT: an agent that is
        // still exiting, or a child being spawned by another thread of this process, holds a
        // copy of the descriptor (and so the flock) until it exits or execs.
        if !lock.lock_within(LOCK_WAIT)? {
            return Err(CheckpointError::Locked {
                path: lock.path().to_owned(),
            });
        }
        Ok(Store {
            file: JsonFile::at(dir.join(FILE_NAME), fsmode::STATE_FILE),
            _lock: lock,
        })
    }

    /// The checkpoint file.
    pub(crate) fn path(&self) -> &Path {
        self.file.path()
    }

    /// The checkpoint, or an empty one when there is no file yet.
    pub(crate) fn load(&self) -> Result<Checkpoint, CheckpointError> {
        Ok(self.file.load()?.unwrap_or_default())
    }

    /// Replaces the checkpoint with `ckpt`: temp file, fsync, rename, fsync of the directory.
    pub(crate) fn save(&self, ckpt: &Checkpoint) -> Result<(), CheckpointError> {
        let _span = timing::span(Step::CheckpointWrite);
        let staged = self.file.stage(ckpt)?;
        fault::point("checkpoint.temp_written");
        staged.commit().map_err(StoreError::from)?;
        tracing::trace!(path = %self.path().display(), "wrote checkpoint");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::fs;

    fn sample() -> Checkpoint {
        let gpu = GpuRecord {
            index: 1,
            minor: 1,
            uuid: mesos_gpu_pool::GpuUuid::new("GPU-1").unwrap(),
        };
        Checkpoint {
            containers: BTreeMap::from([(
                "c1".into(),
                ContainerRecord {
                    gpus: vec![gpu.clone()],
                    rules: vec!["c 195:1 rw".into()],
                    share: None,
                    mig: Vec::new(),
                    mig_quarantine: Vec::new(),
                },
            )]),
            docker: BTreeMap::from([("d1".into(), vec![gpu])]),
            docker_shares: BTreeMap::new(),
            docker_mig: BTreeMap::new(),
            docker_starts: BTreeMap::from([(
                "d1".into(),
                super::super::docker_owner::DockerStart {
                    daemon: Some("unix:///var/run/docker.sock".into()),
                    starter: None,
                },
            )]),
            holders: BTreeMap::from([(
                "c1".into(),
                mesos_gpu_pool::Holder {
                    task_id: Some("t1".into()),
                    ..mesos_gpu_pool::Holder::default()
                },
            )]),
            quarantine: BTreeMap::from([(3, vec!["c2".into()])]),
        }
    }

    #[test]
    fn round_trip_and_empty() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        assert_eq!(store.load().unwrap(), Checkpoint::default());
        store.save(&sample()).unwrap();
        assert_eq!(store.load().unwrap(), sample());
        let temps = fs::read_dir(dir.path().join("gpu"))
            .unwrap()
            .filter(|e| e.as_ref().unwrap().path().extension() == Some("tmp".as_ref()))
            .count();
        assert_eq!(temps, 0, "a temp file was left behind");
    }

    #[test]
    fn second_store_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let _first = Store::open(dir.path()).unwrap();
        let err = Store::open(dir.path()).unwrap_err();
        assert!(matches!(err, CheckpointError::Locked { .. }), "{err}");
    }

    #[test]
    fn other_versions_and_garbage_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        fs::write(store.path(), br#"{"version": 7, "future": true}"#).unwrap();
        let err = store.load().unwrap_err();
        assert!(
            matches!(
                err,
                CheckpointError::Store(StoreError::Version { found: 7, .. })
            ),
            "{err}"
        );
        assert!(err.to_string().contains("schema version 7"), "{err}");
        fs::write(store.path(), b"{not json").unwrap();
        assert!(matches!(
            store.load().unwrap_err(),
            CheckpointError::Store(StoreError::Parse { .. })
        ));
    }
}
