//! Building a volume from a plan into a fresh, unpublished directory.
//!
//! - Files are hard-linked when the source is on the volume root's file system, and copied
//!   otherwise or when the link fails with `EXDEV` (a bind mount of the same file system),
//!   `EPERM` (`fs.protected_hardlinks`) or `EMLINK`. Copies keep the source's permission bits
//!   (without set-id bits, and without group or world write whatever the source has) and mtime. Every file is hashed; a copy is hashed as it is written.
//! - Nothing is ever written through a symlink: the directory is new (`mkdir` fails if anything
//!   has the name), files are created with `O_EXCL`, sources are opened with `O_NOFOLLOW`.
//! - A source whose size or mtime differs from the plan aborts the build: the volume must hold
//!   what was planned.
//! - Files, directories and the manifest are fsynced before the caller renames the directory
//!   into place, so after a crash the published name holds a whole volume or nothing.
//! - Links are made first, in one pass that reads no file contents; then a few worker threads,
//!   largest files first, hash the links and copy (hashing) the rest.

use std::fs::{self, File, FileTimes, OpenOptions, Permissions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use mesos_gpu_os::fsmode;

use super::{IoContext, Materialize, VolumeError};
use crate::manifest::{
    CHUNK, DigestKind, FileDigest, MANIFEST_FORMAT, Manifest, ManifestFile, ManifestLink, Method,
    blake3_file, open_nofollow,
};
use crate::plan::{FileStamp, PlannedFile, VolumeDir, VolumePlan};

/// Most worker threads used to link, copy and hash.
const MAX_WORKERS: usize = 4;

/// Builds the volume described by `plan` in `dir`, which must not exist yet.
pub(crate) fn assemble(
    plan: &VolumePlan,
    dir: &Path,
    materialize: Materialize,
    timings: &mut BuildTimings,
) -> Result<Manifest, VolumeError> {
    let started = Instant::now();
    make_dir(dir)?;
    for sub in VolumeDir::ALL {
        make_dir(&dir.join(sub.as_str()))?;
    }
    let volume_dev = fs::symlink_metadata(dir).at("stat", dir)?.dev();
    let setup = started.elapsed();
    let files = materialize_all(plan, dir, volume_dev, materialize, timings)?;
    timings.link += setup;
    let started = Instant::now();
    let mut links = Vec::with_capacity(plan.links.len());
    for link in &plan.links {
        let at = dir.join(link.dir.as_str()).join(&link.name);
        std::os::unix::fs::symlink(&link.target, &at).at("create symlink", &at)?;
        links.push(ManifestLink {
            dir: link.dir,
            name: link.name.clone(),
            target: link.target.clone(),
        });
    }
    let manifest = Manifest {
        format: MANIFEST_FORMAT,
        driver_version: plan.driver_version.clone(),
        driver_root: plan.driver_root.clone(),
        created_by: concat!("mesos-gpu-volume ", env!("CARGO_PKG_VERSION")).to_owned(),
        created_at: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        files,
        links,
    };
    manifest
        .write_new(dir)
        .map_err(|source| VolumeError::Manifest {
            path: dir.to_owned(),
            source,
        })?;
    for sub in VolumeDir::ALL {
        sync_dir(&dir.join(sub.as_str()))?;
    }
    sync_dir(dir)?;
    timings.publish = started.elapsed();
    Ok(manifest)
}

/// Makes a directory of a volume, 0755 whatever the umask: containers read and traverse it.
fn make_dir(path: &Path) -> Result<(), VolumeError> {
    fsmode::mkdir(path, fsmode::STATE_DIR).at("create directory", path)
}

/// Fsyncs a directory so that the entries created in it are durable.
pub(crate) fn sync_dir(path: &Path) -> Result<(), VolumeError> {
    Ok(mesos_gpu_os::sync_dir(path)?)
}

/// How long each phase of a build took.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct BuildTimings {
    /// Creating the directories and hard links (no file contents read).
    #[serde(serialize_with = "as_millis")]
    pub link: Duration,
    /// Hashing the linked files and copying (and hashing) the others.
    #[serde(serialize_with = "as_millis")]
    pub content: Duration,
    /// Symlinks, the manifest, fsyncs and the rename into place.
    #[serde(serialize_with = "as_millis")]
    pub publish: Duration,
}

fn as_millis<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64() * 1e3)
}

/// A file after the link pass: linked already, or still to copy.
enum Pending<'a> {
    Linked(&'a PlannedFile, PathBuf),
    Copy(&'a PlannedFile, PathBuf),
}

/// Links what can be linked (one pass, no contents read), then hashes the links and copies the
/// rest with a few workers, largest files first.
fn materialize_all(
    plan: &VolumePlan,
    dir: &Path,
    volume_dev: u64,
    materialize: Materialize,
    timings: &mut BuildTimings,
) -> Result<Vec<ManifestFile>, VolumeError> {
    let started = Instant::now();
    let mut pending = Vec::with_capacity(plan.files.len());
    for file in &plan.files {
        let dest = dir.join(file.dir.as_str()).join(&file.name);
        pending.push(if link_file(file, &dest, volume_dev, materialize)? {
            Pending::Linked(file, dest)
        } else {
            Pending::Copy(file, dest)
        });
    }
    timings.link = started.elapsed();

    let started = Instant::now();
    pending.sort_by_key(|p| match p {
        Pending::Linked(f, _) | Pending::Copy(f, _) => std::cmp::Reverse(f.stamp.size),
    });
    let next = AtomicUsize::new(0);
    let failed = AtomicBool::new(false);
    let done = Mutex::new(Vec::with_capacity(pending.len()));
    let workers = std::thread::available_parallelism()
        .map_or(1, usize::from)
        .clamp(1, MAX_WORKERS)
        .min(pending.len().max(1));
    let worker = || {
        while !failed.load(Ordering::Relaxed) {
            let Some(item) = pending.get(next.fetch_add(1, Ordering::Relaxed)) else {
                break;
            };
            let result = match item {
                Pending::Linked(file, dest) => hashed_link(file, dest),
                Pending::Copy(file, dest) => copy_file(file, dest),
            };
            failed.fetch_or(result.is_err(), Ordering::Relaxed);
            if let Ok(mut done) = done.lock() {
                done.push(result);
            }
        }
    };
    std::thread::scope(|s| {
        for _ in 1..workers {
            s.spawn(worker);
        }
        worker();
    });
    let results = done
        .into_inner()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut files = results.into_iter().collect::<Result<Vec<_>, _>>()?;
    files.sort_by(|a, b| (a.dir, &a.name).cmp(&(b.dir, &b.name)));
    timings.content = started.elapsed();
    Ok(files)
}

/// Hard-links `file` to `dest` when allowed and possible; `false` means copy it instead.
fn link_file(
    file: &PlannedFile,
    dest: &Path,
    volume_dev: u64,
    materialize: Materialize,
) -> Result<bool, VolumeError> {
    let meta = fs::symlink_metadata(&file.source).at("stat", &file.source)?;
    if !meta.is_file() || FileStamp::of(&meta) != file.stamp {
        return Err(VolumeError::SourceChanged {
            file: file.source.clone(),
        });
    }
    if materialize == Materialize::Copy || meta.dev() != volume_dev {
        return Ok(false);
    }
    match fs::hard_link(&file.source, dest) {
        Ok(()) => Ok(true),
        Err(e)
            if matches!(
                e.raw_os_error(),
                Some(libc::EXDEV | libc::EPERM | libc::EMLINK)
            ) =>
        {
            tracing::debug!(source = %file.source.display(), error = %e, "hard link refused; copying");
            Ok(false)
        }
        Err(e) => Err(e).at("hard-link into the volume", dest),
    }
}

/// Hashes a freshly made hard link and checks the inode did not change meanwhile.
fn hashed_link(file: &PlannedFile, dest: &Path) -> Result<ManifestFile, VolumeError> {
    let digest = blake3_file(dest).at("read", dest)?;
    let meta = fs::symlink_metadata(dest).at("stat", dest)?;
    if FileStamp::of(&meta) != file.stamp {
        return Err(VolumeError::SourceChanged {
            file: file.source.clone(),
        });
    }
    Ok(manifest_file(
        file,
        meta.permissions().mode() & 0o7777,
        digest,
        Method::Hardlink,
    ))
}

/// Copies `file.source` to `dest` (created with `O_EXCL`), hashing as it goes.
fn copy_file(file: &PlannedFile, dest: &Path) -> Result<ManifestFile, VolumeError> {
    let mut src = open_nofollow(&file.source).at("open", &file.source)?;
    let before = src.metadata().at("stat", &file.source)?;
    // The source's mode, but never writable by group or others: the copy is what every GPU
    // container loads.
    let mode = before.permissions().mode() & 0o777 & !fsmode::GROUP_OTHER_WRITE;
    let mut out = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(fsmode::PRIVATE_FILE)
        .open(dest)
        .at("create", dest)?;
    let digest = copy_hashing(&mut src, &mut out).at("copy into", dest)?;
    let after = src.metadata().at("stat", &file.source)?;
    if FileStamp::of(&before) != file.stamp || FileStamp::of(&after) != file.stamp {
        return Err(VolumeError::SourceChanged {
            file: file.source.clone(),
        });
    }
    let times = FileTimes::new()
        .set_accessed(before.accessed().at("stat", &file.source)?)
        .set_modified(before.modified().at("stat", &file.source)?);
    out.set_times(times).at("set times of", dest)?;
    out.set_permissions(Permissions::from_mode(mode))
        .at("chmod", dest)?;
    out.sync_all().at("sync", dest)?;
    Ok(manifest_file(file, mode, digest, Method::Copy))
}

fn copy_hashing(src: &mut File, out: &mut File) -> io::Result<FileDigest> {
    let mut hasher = DigestKind::Blake3.hasher();
    let mut buf = vec![0u8; CHUNK];
    loop {
        let n = match src.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        hasher.update(&buf[..n]);
        out.write_all(&buf[..n])?;
    }
    Ok(hasher.finish())
}

fn manifest_file(
    file: &PlannedFile,
    mode: u32,
    digest: FileDigest,
    method: Method,
) -> ManifestFile {
    ManifestFile {
        dir: file.dir,
        name: file.name.clone(),
        source: file.source.clone(),
        stamp: file.stamp,
        mode,
        digest,
        method,
    }
}
