//! The entries of the volume root besides the lock and holders: published volumes, retired ones
//! and builds in progress, found by name and inspected without following symlinks.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

use super::{IoContext, VolumeError};
use crate::version::DriverVersion;

/// Prefix of a build in progress (or a crashed one's leftover).
pub(crate) const TMP_PREFIX: &str = ".tmp-";
/// Prefix of a replaced volume kept until its version has no holder.
pub(crate) const RETIRED_PREFIX: &str = ".retired-";

/// The published volume at `path`, if any. A symlink or file in its place is removed (never
/// followed), with a warning.
pub(crate) fn existing_volume(path: &Path) -> Result<Option<PathBuf>, VolumeError> {
    match fs::symlink_metadata(path) {
        Ok(meta) if meta.is_dir() => Ok(Some(path.to_owned())),
        Ok(_) => {
            tracing::warn!(path = %path.display(), "not a directory where a driver volume belongs; removing it");
            fs::remove_file(path).at("remove", path)?;
            Ok(None)
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).at("stat", path),
    }
}

/// Like [`existing_volume`], but refuses instead of removing.
pub(crate) fn existing_volume_readonly(path: &Path) -> Result<Option<PathBuf>, VolumeError> {
    match fs::symlink_metadata(path) {
        Ok(meta) if meta.is_dir() => Ok(Some(path.to_owned())),
        Ok(_) => Err(VolumeError::Hostile {
            path: path.to_owned(),
            what: "not a directory",
        }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).at("stat", path),
    }
}

/// Published volumes: real directories named `nvidia_<valid version>`.
pub(crate) fn volumes(root: &Path) -> Result<Vec<(DriverVersion, PathBuf)>, VolumeError> {
    let mut out = Vec::new();
    for entry in fs::read_dir(root).at("list", root)? {
        let entry = entry.at("list", root)?;
        let Some(version) = entry
            .file_name()
            .to_str()
            .and_then(DriverVersion::from_volume_name)
        else {
            continue;
        };
        if entry.file_type().at("stat", &entry.path())?.is_dir() {
            out.push((version, entry.path()));
        }
    }
    Ok(out)
}

/// Retired volumes: `.retired-nvidia_<version>-<suffix>`.
pub(crate) fn retired(root: &Path) -> Result<Vec<(DriverVersion, PathBuf)>, VolumeError> {
    let mut out = Vec::new();
    for entry in fs::read_dir(root).at("list", root)? {
        let entry = entry.at("list", root)?;
        let name = entry.file_name();
        let version = name
            .to_str()
            .and_then(|n| n.strip_prefix(RETIRED_PREFIX))
            .and_then(|n| n.split_once('-'))
            .and_then(|(volume, _)| DriverVersion::from_volume_name(volume));
        if let Some(version) = version {
            out.push((version, entry.path()));
        }
    }
    Ok(out)
}

/// Removes `.tmp-*` builds; only a crash leaves one, as builds run under the root lock.
pub(crate) fn remove_leftover_builds(root: &Path) -> Result<Vec<PathBuf>, VolumeError> {
    let mut removed = Vec::new();
    for entry in fs::read_dir(root).at("list", root)? {
        let entry = entry.at("list", root)?;
        if entry
            .file_name()
            .to_str()
            .is_some_and(|n| n.starts_with(TMP_PREFIX))
        {
            let path = entry.path();
            // remove_dir_all does not follow symlinks; a symlink is removed itself.
            let result = if entry.file_type().at("stat", &path)?.is_dir() {
                fs::remove_dir_all(&path)
            } else {
                fs::remove_file(&path)
            };
            result.at("remove leftover build", &path)?;
            tracing::warn!(path = %path.display(), "removed the leftover of an interrupted build");
            removed.push(path);
        }
    }
    Ok(removed)
}

/// A suffix no other build of this or another process uses: pid, time, counter.
pub(crate) fn unique_suffix() -> String {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!(
        "{}-{nanos}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}
