//! The runtime state file: driver state that changes while clients run and that every process
//! loading the same node must see, as on a real host where it lives in the kernel driver.
//!
//! The file is JSON (`nvml-sim/README.md`, "Runtime state file"):
//! `{"version": 1, "compute_modes": {"<UUID>": "exclusive_process"}, "processes": {"<UUID>":
//! [{"pid": 1, "used_memory": 1048576}]}}`, keyed by GPU or MIG UUID; a file without `version`
//! (written before it had one, or by hand) is read as version 1. `nvmlDeviceSetComputeMode` writes
//! `compute_modes`; tests write `processes` (a list replaces the description's for that device).
//! Writers hold an exclusive `flock` on `<file>.lock` while they read, change and atomically
//! replace the file ([`mesos_gpu_os::durable`]); readers read the file without locking.
//! A missing file is an empty state.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use mesos_gpu_os::{Document, JsonFile, LockError, LockFile, StoreError, fsmode};
use serde::{Deserialize, Serialize};

/// What the runtime state file holds.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuntimeState {
    /// Compute mode by device UUID: `default`, `prohibited` or `exclusive_process`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub compute_modes: BTreeMap<String, String>,
    /// Compute processes by device UUID; replaces the node description's list for that device.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub processes: BTreeMap<String, Vec<RuntimeProcess>>,
}

/// A process with a compute context on a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuntimeProcess {
    /// Process id.
    pub pid: u32,
    /// Bytes of device memory it uses.
    pub used_memory: u64,
}

impl Document for RuntimeState {
    const VERSION: u32 = 1;
    const WHAT: &'static str = "runtime state file";

    /// Files from before the version member hold the same document.
    fn migrate(version: u32, doc: serde_json::Value) -> Option<serde_json::Value> {
        (version == 0).then_some(doc)
    }
}

/// Why the runtime state file cannot be read or written.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeStateError {
    /// Reading, parsing or replacing the file failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The lock file could not be opened or locked.
    #[error(transparent)]
    Lock(#[from] LockError),
}

/// The compute mode names the file uses, by `nvmlComputeMode_t` value.
const MODE_NAMES: &[(u32, &str)] = &[(0, "default"), (2, "prohibited"), (3, "exclusive_process")];

/// The file's name for a compute mode value.
pub(crate) fn mode_name(mode: u32) -> Option<&'static str> {
    MODE_NAMES.iter().find(|(m, _)| *m == mode).map(|(_, n)| *n)
}

/// The compute mode value of a name the file uses.
pub(crate) fn mode_value(name: &str) -> Option<u32> {
    MODE_NAMES.iter().find(|(_, n)| *n == name).map(|(m, _)| *m)
}

fn file(path: &Path) -> JsonFile {
    JsonFile::at(path, fsmode::STATE_FILE)
}

/// Reads the state file; a missing or empty file is an empty state.
pub fn read(path: &Path) -> Result<RuntimeState, RuntimeStateError> {
    let file = file(path);
    match file.bytes()? {
        Some(bytes) if !bytes.trim_ascii().is_empty() => Ok(file.parse(&bytes)?),
        _ => Ok(RuntimeState::default()),
    }
}

/// Changes the state file under its lock: reads it, applies `change`, replaces it atomically.
pub fn update(
    path: &Path,
    change: impl FnOnce(&mut RuntimeState),
) -> Result<(), RuntimeStateError> {
    let lock = LockFile::create(&sibling(path, "lock"), fsmode::LOCK_FILE)?;
    lock.lock()?;
    let mut state = read(path)?;
    change(&mut state);
    file(path).save(&state)?;
    drop(lock);
    Ok(())
}

/// Sets the processes of one device (GPU or MIG UUID) in the state file at `path`.
pub fn set_processes(
    path: &Path,
    uuid: &str,
    processes: &[RuntimeProcess],
) -> Result<(), RuntimeStateError> {
    update(path, |s| {
        s.processes.insert(uuid.to_owned(), processes.to_vec());
    })
}

fn sibling(path: &Path, ext: &str) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".");
    name.push(ext);
    path.with_file_name(name)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a failed unwrap fails the test at its line
mod tests {
    use super::*;

    #[test]
    fn update_round_trips_and_missing_is_empty() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.json");
        assert_eq!(read(&path).unwrap(), RuntimeState::default());
        update(&path, |s| {
            s.compute_modes
                .insert("GPU-x".to_owned(), "exclusive_process".to_owned());
        })
        .unwrap();
        set_processes(
            &path,
            "MIG-y",
            &[RuntimeProcess {
                pid: 7,
                used_memory: 9,
            }],
        )
        .unwrap();
        let s = read(&path).unwrap();
        assert_eq!(s.compute_modes["GPU-x"], "exclusive_process");
        assert_eq!(s.processes["MIG-y"][0].pid, 7);
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.starts_with("{\n  \"version\": 1,"), "{text}");
        // A file written before the version member, or by hand, reads the same.
        std::fs::write(&path, "{\"compute_modes\": {\"GPU-z\": \"prohibited\"}}").unwrap();
        assert_eq!(read(&path).unwrap().compute_modes["GPU-z"], "prohibited");
        std::fs::write(&path, "{\"compute_mode\": {}}").unwrap();
        let err = read(&path).unwrap_err();
        assert!(
            matches!(err, RuntimeStateError::Store(StoreError::Parse { .. })),
            "{err}"
        );
        assert_eq!(mode_value(mode_name(3).unwrap()), Some(3));
        assert_eq!(mode_name(1), None);
    }
}
