//! "In use": a volume is in use while `<root>/refs/nvidia_<version>/` holds at least one holder
//! file. The isolator creates one per container (named by the container id) before it mounts the
//! volume and removes it at cleanup; recovery lists the holders and releases those of containers
//! that no longer exist. Files, not locks, so that use survives an agent restart (containers keep
//! running while the agent is down). Callers hold the root lock.

use std::fs::{self, OpenOptions};
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use mesos_gpu_os::fsmode;

use super::{IoContext, VolumeError};
use crate::version::DriverVersion;

/// The directory of holder files in the volume root.
pub const REFS_DIR: &str = "refs";

/// The holder directory of one version.
pub(crate) fn refs_dir(root: &Path, version: &DriverVersion) -> PathBuf {
    root.join(REFS_DIR).join(version.volume_name())
}

/// Checks a holder name: a container id, 1–255 of `A-Z a-z 0-9 . _ : @ -`, not starting with `.`.
pub fn check_holder(holder: &str) -> Result<(), VolumeError> {
    let ok = !holder.is_empty()
        && holder.len() <= 255
        && !holder.starts_with('.')
        && holder
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._:@-".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(VolumeError::BadHolder {
            got: holder.to_owned(),
        })
    }
}

/// Creates `path` as a real directory (mode 0755 whatever the umask), refusing a symlink or a
/// file in its place.
pub(crate) fn ensure_dir(path: &Path) -> Result<(), VolumeError> {
    if existing_dir(path)? {
        return Ok(());
    }
    fsmode::mkdir(path, fsmode::STATE_DIR).at("create directory", path)
}

/// True when `path` is a real directory, false when it does not exist; a symlink or a file in
/// its place is refused.
fn existing_dir(path: &Path) -> Result<bool, VolumeError> {
    match fs::symlink_metadata(path) {
        Ok(meta) if meta.is_dir() => Ok(true),
        Ok(_) => Err(VolumeError::Hostile {
            path: path.to_owned(),
            what: "not a directory",
        }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e).at("stat", path),
    }
}

/// Records `holder` as using `version`'s volume (idempotent).
pub(crate) fn add(root: &Path, version: &DriverVersion, holder: &str) -> Result<(), VolumeError> {
    check_holder(holder)?;
    ensure_dir(&root.join(REFS_DIR))?;
    let dir = refs_dir(root, version);
    ensure_dir(&dir)?;
    let path = dir.join(holder);
    fsmode::open(
        OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .custom_flags(libc::O_NOFOLLOW),
        &path,
        fsmode::STATE_FILE,
    )
    .at("create holder file", &path)?;
    Ok(())
}

/// Removes `holder`; `false` when it did not hold the volume.
pub(crate) fn remove(
    root: &Path,
    version: &DriverVersion,
    holder: &str,
) -> Result<bool, VolumeError> {
    check_holder(holder)?;
    let dir = refs_dir(root, version);
    let path = dir.join(holder);
    if !existing_dir(&root.join(REFS_DIR))? || !existing_dir(&dir)? {
        return Ok(false);
    }
    match fs::remove_file(&path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e).at("remove holder file", &path),
    }
}

/// The holders of `version`, sorted.
pub(crate) fn list(root: &Path, version: &DriverVersion) -> Result<Vec<String>, VolumeError> {
    let dir = refs_dir(root, version);
    if !existing_dir(&root.join(REFS_DIR))? || !existing_dir(&dir)? {
        return Ok(Vec::new());
    }
    let mut holders = Vec::new();
    for entry in fs::read_dir(&dir).at("list", &dir)? {
        let entry = entry.at("list", &dir)?;
        holders.push(entry.file_name().to_string_lossy().into_owned());
    }
    holders.sort();
    Ok(holders)
}

/// Removes the holder directories that hold no holder.
pub(crate) fn remove_empty(root: &Path) -> Result<(), VolumeError> {
    let refs = root.join(REFS_DIR);
    if !existing_dir(&refs)? {
        return Ok(());
    }
    for entry in fs::read_dir(&refs).at("list", &refs)? {
        let path = entry.at("list", &refs)?.path();
        // rmdir fails on a non-empty directory and on anything but a directory: both are kept.
        match fs::remove_dir(&path) {
            Ok(()) => {}
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::ENOTEMPTY | libc::EEXIST | libc::ENOTDIR)
                ) => {}
            Err(e) => return Err(e).at("remove", &path),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holder_names() {
        for ok in ["a", "mesos-1f3e.child", "ctr:1@x_y"] {
            check_holder(ok).expect(ok);
        }
        for bad in ["", ".", "..", ".hidden", "a/b", "a b", &"x".repeat(256)] {
            assert!(check_holder(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn add_list_remove() {
        let dir = tempfile::tempdir().expect("tempdir");
        let v: DriverVersion = "550.54.14".parse().expect("version");
        assert!(list(dir.path(), &v).expect("list").is_empty());
        add(dir.path(), &v, "b").expect("add");
        add(dir.path(), &v, "a").expect("add");
        add(dir.path(), &v, "a").expect("idempotent");
        assert_eq!(list(dir.path(), &v).expect("list"), ["a", "b"]);
        assert!(remove(dir.path(), &v, "a").expect("remove"));
        assert!(!remove(dir.path(), &v, "a").expect("remove again"));
        assert_eq!(list(dir.path(), &v).expect("list"), ["b"]);
        remove_empty(dir.path()).expect("prune");
        assert_eq!(list(dir.path(), &v).expect("list"), ["b"]);
        assert!(remove(dir.path(), &v, "b").expect("remove"));
        remove_empty(dir.path()).expect("prune");
        assert!(!refs_dir(dir.path(), &v).exists());
    }

    #[test]
    fn symlinked_refs_dir_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let outside = tempfile::tempdir().expect("tempdir");
        std::os::unix::fs::symlink(outside.path(), dir.path().join(REFS_DIR)).expect("ln");
        let v: DriverVersion = "550.54.14".parse().expect("version");
        assert!(matches!(
            add(dir.path(), &v, "a"),
            Err(VolumeError::Hostile { .. })
        ));
        assert!(fs::read_dir(outside.path()).expect("read").next().is_none());
    }
}
