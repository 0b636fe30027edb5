//! The driver volume: `<root>/nvidia_<driver version>/{bin,lib,lib64,manifest.json}`, mounted
//! read-only at `/usr/local/nvidia` in containers (Mesos `volume.cpp`, nvidia-docker 1.0).
//!
//! Layout of the volume root:
//!
//! ```text
//! <root>/.lock                       flock'd by every change (see `lock.rs`)
//! <root>/nvidia_<version>/           published volumes, each whole
//! <root>/refs/nvidia_<version>/<id>  holder files: who uses a volume (see `volume/holders.rs`)
//! <root>/.tmp-nvidia_<version>-…     a build in progress; a leftover one is from a crash
//! <root>/.retired-nvidia_<version>-… a replaced volume, kept until its version has no holder
//! ```
//!
//! `create` is idempotent: an intact volume that matches the host is reused. A stale or damaged
//! one is rebuilt into a fresh directory and swapped in with two renames (old → `.retired-…`,
//! new → `nvidia_<version>`); running containers keep their bind mount of the old tree. Entries of
//! the root are inspected with `symlink_metadata` and never followed; a symlink where a volume
//! belongs is removed, not written through. The root must not be writable by group or others,
//! nor owned by another user, nor hang from a directory that is (sticky ones, as `/tmp`,
//! aside: [`mesos_gpu_os::fsmode::check_state_dir`]), so nobody but its owner can race these
//! checks. Whatever the umask, the root, volumes, their directories and `refs/` are made 0755,
//! manifests and holder files 0644; a copied driver file keeps its source's mode without group
//! or world write, and a hard link is the source's own file.

mod assemble;
mod holders;
mod layout;
mod verify;

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

pub use assemble::BuildTimings;
pub use holders::{REFS_DIR, check_holder};
pub use verify::{Check, Problem, VerifyReport};

use layout::{
    RETIRED_PREFIX, TMP_PREFIX, existing_volume, existing_volume_readonly, remove_leftover_builds,
    retired, unique_suffix, volumes,
};

use crate::injection;
use crate::ldcache::LdCache;
use crate::lock::{ReadLock, RootLock};
use crate::manifest::{Manifest, ManifestError, Method};
use crate::plan::{self, PlanError, VolumePlan};
use crate::version::DriverVersion;
use mesos_gpu_os::{LockError, fsmode};

/// Where Mesos keeps driver volumes.
pub const DEFAULT_ROOT: &str = "/var/run/mesos/isolators/gpu";

/// Why a volume operation failed.
#[derive(Debug, thiserror::Error)]
pub enum VolumeError {
    /// A file-system operation failed.
    #[error(transparent)]
    Io(#[from] mesos_gpu_os::IoError),
    /// The volume root, or a directory above it, could be changed by another user (or could
    /// not be checked).
    #[error(transparent)]
    UnsafeRoot(mesos_gpu_os::FsModeError),
    /// Something under the root is not what it must be (e.g. a symlink where a directory
    /// belongs); it was not followed.
    #[error("{path} is {what}; refusing to use it")]
    Hostile {
        /// The entry.
        path: PathBuf,
        /// What it is.
        what: &'static str,
    },
    /// The root's lock could not be taken.
    #[error("cannot lock the volume root")]
    Lock(#[source] LockError),
    /// A directory could not be made durable.
    #[error(transparent)]
    Durable(#[from] mesos_gpu_os::DurableError),
    /// The plan holds no library at all.
    #[error(
        "the plan for driver {version} has no library of that version; is it the running \
         driver's version? (`mesos-gpu volume plan` lists what was skipped and why)"
    )]
    EmptyPlan {
        /// The planned version.
        version: DriverVersion,
    },
    /// A source file changed between planning and building.
    #[error("{file} changed since the volume was planned; plan again")]
    SourceChanged {
        /// The source file.
        file: PathBuf,
    },
    /// A manifest could not be written.
    #[error("cannot write the manifest of {path}")]
    Manifest {
        /// The volume being built.
        path: PathBuf,
        /// The cause.
        #[source]
        source: ManifestError,
    },
    /// No volume exists for that version.
    #[error("no volume for driver {version} at {path}")]
    NoSuchVolume {
        /// The version.
        version: DriverVersion,
        /// Where it would be.
        path: PathBuf,
    },
    /// A holder name that is not a container id.
    #[error(
        "holder {got:?}: expected 1 to 255 characters from A-Z a-z 0-9 . _ : @ -, not starting \
         with '.'"
    )]
    BadHolder {
        /// The rejected name.
        got: String,
    },
}

impl VolumeError {
    /// True when the build saw a source change and planning again may succeed.
    pub fn is_source_changed(&self) -> bool {
        matches!(self, VolumeError::SourceChanged { .. })
    }
}

/// Adds the operation and path to an `io::Error` in one call.
pub(crate) trait IoContext<T> {
    /// Wraps the error as [`VolumeError::Io`].
    fn at(self, op: &'static str, path: &Path) -> Result<T, VolumeError>;
}

impl<T> IoContext<T> for io::Result<T> {
    fn at(self, op: &'static str, path: &Path) -> Result<T, VolumeError> {
        mesos_gpu_os::IoContext::at(self, op, path).map_err(VolumeError::Io)
    }
}

/// How files get into a volume.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Materialize {
    /// Hard links where the source shares the volume root's file system, copies elsewhere.
    #[default]
    LinkOrCopy,
    /// Always copy (so the driver installer never sees extra links to its files).
    Copy,
}

/// Options of [`VolumeManager::create_with`].
#[derive(Debug, Clone, Copy, Default)]
pub struct CreateOptions {
    /// Link or copy.
    pub materialize: Materialize,
    /// How an existing volume is checked before it is reused.
    pub check: Check,
}

/// What `create` did.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum Outcome {
    /// There was no volume; one was built.
    Created,
    /// An intact volume matching the host was already there.
    Reused,
    /// The existing volume was stale or damaged and was replaced.
    Rebuilt {
        /// What was wrong with it.
        problems: Vec<Problem>,
    },
}

/// A published volume.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Volume {
    /// The driver version.
    pub driver_version: DriverVersion,
    /// The host path to bind-mount.
    pub path: PathBuf,
    /// What `create` did.
    #[serde(flatten)]
    pub outcome: Outcome,
    /// Number of files.
    pub files: usize,
    /// Number of symlinks.
    pub links: usize,
    /// Total size of the files.
    pub bytes: u64,
    /// Files that are hard links to their source.
    pub hardlinked: usize,
    /// Files that are copies.
    pub copied: usize,
    /// How long the build's phases took; `None` when an existing volume was reused.
    pub timings: Option<BuildTimings>,
}

impl Volume {
    fn from_manifest(path: PathBuf, manifest: &Manifest, outcome: Outcome) -> Volume {
        let hardlinked = manifest
            .files
            .iter()
            .filter(|f| f.method == Method::Hardlink)
            .count();
        Volume {
            driver_version: manifest.driver_version.clone(),
            path,
            outcome,
            files: manifest.files.len(),
            links: manifest.links.len(),
            bytes: manifest.total_bytes(),
            hardlinked,
            copied: manifest.files.len() - hardlinked,
            timings: None,
        }
    }
}

/// One volume found under the root.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct VolumeInfo {
    /// Its driver version.
    pub driver_version: DriverVersion,
    /// Its path.
    pub path: PathBuf,
    /// Who uses it.
    pub holders: Vec<String>,
    /// Number of files, per its manifest.
    pub files: usize,
    /// Total size, per its manifest.
    pub bytes: u64,
    /// How it differs from its manifest (metadata check, host not consulted).
    pub problems: Vec<Problem>,
}

/// Why `gc` kept a volume.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "reason", rename_all = "snake_case")]
pub enum KeepReason {
    /// The caller asked to keep this version (the running driver's).
    Requested,
    /// Holders still use it.
    InUse {
        /// The holders.
        holders: Vec<String>,
    },
}

/// A directory `gc` kept.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Kept {
    /// The directory.
    pub path: PathBuf,
    /// Why.
    #[serde(flatten)]
    pub reason: KeepReason,
}

/// What `gc` did.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct GcReport {
    /// Directories removed: unused volumes, retired volumes, leftover builds.
    pub removed: Vec<PathBuf>,
    /// Volumes kept.
    pub kept: Vec<Kept>,
}

/// Manages the driver volumes under one root directory.
#[derive(Debug, Clone)]
pub struct VolumeManager {
    root: PathBuf,
}

impl VolumeManager {
    /// A manager for volumes under `root` (created on first use, mode 0755).
    pub fn at(root: impl Into<PathBuf>) -> VolumeManager {
        VolumeManager { root: root.into() }
    }

    /// The volume root as given.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Where the volume for `version` is (or would be).
    pub fn volume_path(&self, version: &DriverVersion) -> PathBuf {
        self.root.join(version.volume_name())
    }

    /// Where volumes are mounted in containers: `/usr/local/nvidia`.
    pub fn container_path() -> &'static Path {
        Path::new(injection::CONTAINER_PATH)
    }

    /// Plans the volume for `version` from the driver `source` (see [`plan::plan_from`]).
    pub fn plan(
        &self,
        source: &plan::DriverSource,
        cache: &LdCache,
        version: &DriverVersion,
    ) -> Result<VolumePlan, PlanError> {
        plan::plan_from(source, cache, version)
    }

    /// Creates the volume for `plan`, or reuses an intact one (metadata check, link-or-copy).
    pub fn create(&self, plan: &VolumePlan) -> Result<Volume, VolumeError> {
        self.create_with(plan, CreateOptions::default())
    }

    /// Creates the volume for `plan`, or reuses an intact one.
    #[tracing::instrument(skip_all, fields(root = %self.root.display(), version = %plan.driver_version))]
    pub fn create_with(
        &self,
        plan: &VolumePlan,
        options: CreateOptions,
    ) -> Result<Volume, VolumeError> {
        let version = &plan.driver_version;
        if plan.driver_library_count() == 0 {
            return Err(VolumeError::EmptyPlan {
                version: version.clone(),
            });
        }
        let root = self.open_root()?;
        let _lock = RootLock::acquire(&root).map_err(VolumeError::Lock)?;
        remove_leftover_builds(&root)?;
        let name = version.volume_name();
        let path = root.join(&name);
        let mut problems = None;
        if let Some(existing) = existing_volume(&path)? {
            let (manifest, found) =
                verify::check_volume(&existing, version, Some(plan), options.check);
            match manifest {
                Some(manifest) if found.is_empty() => {
                    tracing::info!(path = %path.display(), "reusing intact driver volume");
                    return Ok(Volume::from_manifest(path, &manifest, Outcome::Reused));
                }
                _ => {
                    let first = found.first().map(ToString::to_string).unwrap_or_default();
                    tracing::warn!(path = %path.display(), problems = found.len(), first, "driver volume is stale or damaged; rebuilding");
                    problems = Some(found);
                }
            }
        }
        let tmp = root.join(format!("{TMP_PREFIX}{name}-{}", unique_suffix()));
        let mut timings = BuildTimings::default();
        let manifest = match assemble::assemble(plan, &tmp, options.materialize, &mut timings) {
            Ok(m) => m,
            Err(e) => {
                if let Err(cleanup) = fs::remove_dir_all(&tmp) {
                    tracing::warn!(path = %tmp.display(), error = %cleanup, "cannot remove failed build");
                }
                return Err(e);
            }
        };
        let publishing = std::time::Instant::now();
        if problems.is_some() {
            let retired = root.join(format!("{RETIRED_PREFIX}{name}-{}", unique_suffix()));
            fs::rename(&path, &retired).at("retire", &path)?;
        }
        fs::rename(&tmp, &path).at("publish", &path)?;
        assemble::sync_dir(&root)?;
        timings.publish += publishing.elapsed();
        let outcome = match problems {
            None => Outcome::Created,
            Some(problems) => Outcome::Rebuilt { problems },
        };
        let volume = Volume {
            timings: Some(timings),
            ..Volume::from_manifest(path, &manifest, outcome)
        };
        tracing::info!(
            path = %volume.path.display(),
            files = volume.files,
            hardlinked = volume.hardlinked,
            copied = volume.copied,
            bytes = volume.bytes,
            link_ms = timings.link.as_millis(),
            content_ms = timings.content.as_millis(),
            publish_ms = timings.publish.as_millis(),
            "published driver volume"
        );
        Ok(volume)
    }

    /// Checks the volume for `version` against its manifest and, with `host`, against the host's
    /// current driver files.
    pub fn verify(
        &self,
        version: &DriverVersion,
        host: Option<&VolumePlan>,
        check: Check,
    ) -> Result<VerifyReport, VolumeError> {
        let path = self.root.join(version.volume_name());
        let Some(root) = self.existing_root()? else {
            return Err(VolumeError::NoSuchVolume {
                version: version.clone(),
                path,
            });
        };
        let _lock = ReadLock::acquire(&root).map_err(VolumeError::Lock)?;
        let path = root.join(version.volume_name());
        let Some(existing) = existing_volume_readonly(&path)? else {
            return Err(VolumeError::NoSuchVolume {
                version: version.clone(),
                path,
            });
        };
        let (_, problems) = verify::check_volume(&existing, version, host, check);
        Ok(VerifyReport {
            driver_version: version.clone(),
            path,
            check,
            against_host: host.is_some(),
            problems,
        })
    }

    /// The volumes under the root, oldest version first (none when the root does not exist).
    pub fn list(&self) -> Result<Vec<VolumeInfo>, VolumeError> {
        let Some(root) = self.existing_root()? else {
            return Ok(Vec::new());
        };
        let _lock = ReadLock::acquire(&root).map_err(VolumeError::Lock)?;
        let mut out = Vec::new();
        for (version, path) in volumes(&root)? {
            let (manifest, problems) = verify::check_volume(&path, &version, None, Check::Metadata);
            out.push(VolumeInfo {
                holders: holders::list(&root, &version)?,
                files: manifest.as_ref().map_or(0, |m| m.files.len()),
                bytes: manifest.as_ref().map_or(0, Manifest::total_bytes),
                driver_version: version,
                path,
                problems,
            });
        }
        out.sort_by(|a, b| a.driver_version.cmp(&b.driver_version));
        Ok(out)
    }

    /// Removes every volume not in `keep` and without holders, retired volumes of versions
    /// without holders, and leftover builds.
    #[tracing::instrument(skip_all, fields(root = %self.root.display()))]
    pub fn gc(&self, keep: &[DriverVersion]) -> Result<GcReport, VolumeError> {
        let root = self.open_root()?;
        let _lock = RootLock::acquire(&root).map_err(VolumeError::Lock)?;
        let mut report = GcReport {
            removed: remove_leftover_builds(&root)?,
            kept: Vec::new(),
        };
        for (version, path) in volumes(&root)? {
            let holders = holders::list(&root, &version)?;
            let reason = if keep.contains(&version) {
                Some(KeepReason::Requested)
            } else if !holders.is_empty() {
                Some(KeepReason::InUse { holders })
            } else {
                None
            };
            match reason {
                Some(reason) => report.kept.push(Kept { path, reason }),
                None => {
                    fs::remove_dir_all(&path).at("remove", &path)?;
                    tracing::info!(path = %path.display(), "removed unused driver volume");
                    report.removed.push(path);
                }
            }
        }
        for (version, path) in retired(&root)? {
            if holders::list(&root, &version)?.is_empty() {
                fs::remove_dir_all(&path).at("remove", &path)?;
                report.removed.push(path);
            }
        }
        holders::remove_empty(&root)?;
        Ok(report)
    }

    /// Records `holder` (a container id) as using the volume of `version`, which must exist.
    pub fn acquire(&self, version: &DriverVersion, holder: &str) -> Result<(), VolumeError> {
        holders::check_holder(holder)?;
        let root = self.open_root()?;
        let _lock = RootLock::acquire(&root).map_err(VolumeError::Lock)?;
        let path = root.join(version.volume_name());
        if existing_volume_readonly(&path)?.is_none() {
            return Err(VolumeError::NoSuchVolume {
                version: version.clone(),
                path,
            });
        }
        holders::add(&root, version, holder)
    }

    /// Removes `holder` from the volume of `version`; `false` if it was not a holder.
    pub fn release(&self, version: &DriverVersion, holder: &str) -> Result<bool, VolumeError> {
        holders::check_holder(holder)?;
        let root = self.open_root()?;
        let _lock = RootLock::acquire(&root).map_err(VolumeError::Lock)?;
        holders::remove(&root, version, holder)
    }

    /// The holders of the volume of `version`.
    pub fn holders(&self, version: &DriverVersion) -> Result<Vec<String>, VolumeError> {
        let Some(root) = self.existing_root()? else {
            return Ok(Vec::new());
        };
        let _lock = ReadLock::acquire(&root).map_err(VolumeError::Lock)?;
        holders::list(&root, version)
    }

    /// Creates the root if needed and returns its canonical path, after checking it is a
    /// directory nobody but its owner can write.
    fn open_root(&self) -> Result<PathBuf, VolumeError> {
        fsmode::create_dir_all(&self.root, fsmode::STATE_DIR)
            .at("create volume root", &self.root)?;
        self.checked_root()
    }

    /// The root's canonical path, checked as [`Self::open_root`] does, for readers: `None` when
    /// it does not exist, and nothing is created.
    fn existing_root(&self) -> Result<Option<PathBuf>, VolumeError> {
        match fs::symlink_metadata(&self.root) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            _ => self.checked_root().map(Some),
        }
    }

    fn checked_root(&self) -> Result<PathBuf, VolumeError> {
        let root = fs::canonicalize(&self.root).at("resolve volume root", &self.root)?;
        let meta = fs::metadata(&root).at("stat volume root", &root)?;
        if !meta.is_dir() {
            return Err(VolumeError::Hostile {
                path: root,
                what: "not a directory",
            });
        }
        fsmode::check_state_dir(&root, &root, fsmode::STATE_DIR)
            .map_err(VolumeError::UnsafeRoot)?;
        Ok(root)
    }
}
