//! Crash-safe replacement of a small file.
//!
//! Facts relied on (POSIX `rename(2)`, Linux `fsync(2)`): `rename` within one directory
//! atomically replaces the target, so a reader sees the old file or the new one; the new data
//! is durable only after `fsync` of the file, and the rename only after `fsync` of the
//! directory. So a replace is: temp file, `fsync`, `rename`, `fsync` of the directory.

use std::fs::{self, File};
use std::io::{self, Write as _};
use std::path::{Path, PathBuf};

/// Replaces `path` with `bytes` crash-safely; the error names the step and the file.
pub(crate) fn replace(path: &Path, bytes: &[u8]) -> Result<(), (&'static str, PathBuf, io::Error)> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let mut name = path.file_name().unwrap_or_default().to_owned();
    name.push(".tmp");
    let tmp = dir.join(name);
    let mut file = File::create(&tmp).map_err(|e| ("create", tmp.clone(), e))?;
    file.write_all(bytes)
        .map_err(|e| ("write", tmp.clone(), e))?;
    file.sync_all().map_err(|e| ("fsync", tmp.clone(), e))?;
    drop(file);
    fs::rename(&tmp, path).map_err(|e| ("rename", tmp.clone(), e))?;
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| ("fsync", dir.to_owned(), e))
}
