//! Checking a volume against its manifest, and the manifest against the host.
//!
//! The volume side walks `bin/`, `lib/` and `lib64/` without following symlinks: every entry must
//! be in the manifest with the same type, size, mode, mtime and link target (and SHA-256 with
//! [`Check::Checksums`]), and nothing else may be there. The host side compares the manifest with
//! a fresh [`VolumePlan`]: the same files from the same sources with the same size and mtime, the
//! same links. A hard-linked file shares its inode with the source, so it is hashed once.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use mesos_gpu_os::error_chain;

use crate::manifest::{DigestKind, FileDigest, MANIFEST_NAME, Manifest, ManifestFile};
use crate::plan::{FileStamp, VolumeDir, VolumePlan};
use crate::version::DriverVersion;

/// How deep a check goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Check {
    /// Types, sizes, modes, mtimes and link targets: no file contents are read.
    #[default]
    Metadata,
    /// Also the SHA-256 of every file, in the volume and on the host.
    Checksums,
}

/// One way a volume differs from its manifest or from the host.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "problem", rename_all = "snake_case")]
pub enum Problem {
    /// The manifest is missing or unreadable.
    Manifest {
        /// The error chain.
        error: String,
    },
    /// The manifest is for another driver version.
    VersionMismatch {
        /// The manifest's version.
        found: DriverVersion,
    },
    /// An entry of the manifest is not in the volume.
    Missing {
        /// Path inside the volume.
        path: String,
    },
    /// The volume holds an entry the manifest does not list.
    Extra {
        /// Path inside the volume.
        path: String,
    },
    /// An entry has the wrong type (e.g. a symlink where a directory belongs).
    WrongType {
        /// Path inside the volume.
        path: String,
        /// What it should be.
        expected: &'static str,
    },
    /// A file's size differs from the manifest.
    Size {
        /// Path inside the volume.
        path: String,
        /// Manifest size.
        expected: u64,
        /// Actual size.
        found: u64,
    },
    /// A file's permission bits differ from the manifest.
    Mode {
        /// Path inside the volume.
        path: String,
        /// Manifest mode.
        expected: u32,
        /// Actual mode.
        found: u32,
    },
    /// A file was modified after the volume was built (its mtime changed).
    Modified {
        /// Path inside the volume.
        path: String,
    },
    /// A file's contents differ from the manifest's SHA-256.
    Checksum {
        /// Path inside the volume.
        path: String,
    },
    /// A symlink points elsewhere than the manifest says.
    LinkTarget {
        /// Path inside the volume.
        path: String,
        /// Manifest target.
        expected: String,
        /// Actual target.
        found: String,
    },
    /// The volume holds an entry the host's driver no longer provides.
    NotPlanned {
        /// Path inside the volume.
        path: String,
    },
    /// The host's driver provides an entry the volume lacks.
    Unbuilt {
        /// Path inside the volume.
        path: String,
    },
    /// The host's file now comes from another source path.
    SourceMoved {
        /// Path inside the volume.
        path: String,
        /// Manifest source.
        expected: PathBuf,
        /// Planned source.
        found: PathBuf,
    },
    /// The host's source file changed size or mtime since the volume was built.
    SourceChanged {
        /// Path inside the volume.
        path: String,
        /// The source.
        source: PathBuf,
    },
    /// The host's source file's contents differ from the manifest's SHA-256.
    SourceChecksum {
        /// Path inside the volume.
        path: String,
        /// The source.
        source: PathBuf,
    },
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Problem::Manifest { error } => write!(f, "manifest: {error}"),
            Problem::VersionMismatch { found } => write!(f, "manifest is for driver {found}"),
            Problem::Missing { path } => write!(f, "{path}: missing"),
            Problem::Extra { path } => write!(f, "{path}: not in the manifest"),
            Problem::WrongType { path, expected } => write!(f, "{path}: not a {expected}"),
            Problem::Size {
                path,
                expected,
                found,
            } => {
                write!(f, "{path}: {found} bytes, manifest says {expected}")
            }
            Problem::Mode {
                path,
                expected,
                found,
            } => {
                write!(f, "{path}: mode {found:o}, manifest says {expected:o}")
            }
            Problem::Modified { path } => write!(f, "{path}: modified after the volume was built"),
            Problem::Checksum { path } => write!(f, "{path}: contents differ from the manifest"),
            Problem::LinkTarget {
                path,
                expected,
                found,
            } => {
                write!(f, "{path}: points to {found}, manifest says {expected}")
            }
            Problem::NotPlanned { path } => write!(f, "{path}: the host's driver no longer has it"),
            Problem::Unbuilt { path } => {
                write!(f, "{path}: the host's driver has it, the volume does not")
            }
            Problem::SourceMoved {
                path,
                expected,
                found,
            } => write!(
                f,
                "{path}: now comes from {}, the volume has {}",
                found.display(),
                expected.display()
            ),
            Problem::SourceChanged { path, source } => {
                write!(
                    f,
                    "{path}: {} changed since the volume was built",
                    source.display()
                )
            }
            Problem::SourceChecksum { path, source } => {
                write!(f, "{path}: {} differs from the manifest", source.display())
            }
        }
    }
}

/// The result of checking one volume.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct VerifyReport {
    /// The driver version checked.
    pub driver_version: DriverVersion,
    /// The volume's path.
    pub path: PathBuf,
    /// How deep the check went.
    pub check: Check,
    /// Whether the host's driver files were compared too.
    pub against_host: bool,
    /// Everything found wrong; empty means intact.
    pub problems: Vec<Problem>,
}

impl VerifyReport {
    /// True when nothing is wrong.
    pub fn is_intact(&self) -> bool {
        self.problems.is_empty()
    }
}

enum Expected<'a> {
    File(&'a ManifestFile),
    Link(&'a str),
}

/// Checks the volume at `path`; returns its manifest (when readable) and the problems found.
pub(crate) fn check_volume(
    path: &Path,
    version: &DriverVersion,
    host: Option<&VolumePlan>,
    check: Check,
) -> (Option<Manifest>, Vec<Problem>) {
    let manifest = match Manifest::read(path) {
        Ok(m) => m,
        Err(e) => {
            let error = error_chain(&e);
            return (None, vec![Problem::Manifest { error }]);
        }
    };
    let mut hashes = Hashes::default();
    let mut problems = Vec::new();
    if manifest.driver_version != *version {
        problems.push(Problem::VersionMismatch {
            found: manifest.driver_version.clone(),
        });
    }
    check_top_level(path, &mut problems);
    for dir in VolumeDir::ALL {
        let mut expected: BTreeMap<&str, Expected<'_>> = BTreeMap::new();
        for f in manifest.files.iter().filter(|f| f.dir == dir) {
            expected.insert(&f.name, Expected::File(f));
        }
        for l in manifest.links.iter().filter(|l| l.dir == dir) {
            expected.insert(&l.name, Expected::Link(&l.target));
        }
        check_dir(
            &path.join(dir.as_str()),
            dir,
            &expected,
            check,
            &mut hashes,
            &mut problems,
        );
    }
    if let Some(plan) = host {
        check_host(&manifest, plan, check, &mut hashes, &mut problems);
    }
    (Some(manifest), problems)
}

fn check_top_level(path: &Path, problems: &mut Vec<Problem>) {
    let Ok(entries) = std::fs::read_dir(path) else {
        problems.push(Problem::WrongType {
            path: ".".into(),
            expected: "readable directory",
        });
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let known = name == MANIFEST_NAME || VolumeDir::ALL.iter().any(|d| d.as_str() == name);
        if !known {
            problems.push(Problem::Extra { path: name });
        }
    }
}

fn check_dir(
    dir_path: &Path,
    dir: VolumeDir,
    expected: &BTreeMap<&str, Expected<'_>>,
    check: Check,
    hashes: &mut Hashes,
    problems: &mut Vec<Problem>,
) {
    let rel = |name: &str| format!("{}/{name}", dir.as_str());
    match std::fs::symlink_metadata(dir_path) {
        Ok(meta) if meta.is_dir() => {}
        Ok(_) => {
            return problems.push(Problem::WrongType {
                path: dir.as_str().into(),
                expected: "directory",
            });
        }
        Err(_) => {
            return problems.push(Problem::Missing {
                path: dir.as_str().into(),
            });
        }
    }
    if let Ok(entries) = std::fs::read_dir(dir_path) {
        for entry in entries.flatten() {
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if !expected.contains_key(name.as_ref()) {
                problems.push(Problem::Extra { path: rel(&name) });
            }
        }
    }
    for (name, want) in expected {
        let path = dir_path.join(name);
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            problems.push(Problem::Missing { path: rel(name) });
            continue;
        };
        match want {
            Expected::Link(target) => match std::fs::read_link(&path) {
                Ok(found) if found.as_os_str() == *target => {}
                Ok(found) => problems.push(Problem::LinkTarget {
                    path: rel(name),
                    expected: (*target).to_owned(),
                    found: found.to_string_lossy().into_owned(),
                }),
                Err(_) => problems.push(Problem::WrongType {
                    path: rel(name),
                    expected: "symlink",
                }),
            },
            Expected::File(file) => {
                if !meta.is_file() {
                    problems.push(Problem::WrongType {
                        path: rel(name),
                        expected: "regular file",
                    });
                    continue;
                }
                let stamp = FileStamp::of(&meta);
                let mode = meta.permissions().mode() & 0o7777;
                if stamp.size != file.stamp.size {
                    problems.push(Problem::Size {
                        path: rel(name),
                        expected: file.stamp.size,
                        found: stamp.size,
                    });
                } else if stamp.mtime_ns != file.stamp.mtime_ns {
                    problems.push(Problem::Modified { path: rel(name) });
                }
                if mode != file.mode {
                    problems.push(Problem::Mode {
                        path: rel(name),
                        expected: file.mode,
                        found: mode,
                    });
                }
                if check == Check::Checksums
                    && hashes.of(&path, &meta, &file.digest) != Some(&file.digest)
                {
                    problems.push(Problem::Checksum { path: rel(name) });
                }
            }
        }
    }
}

fn check_host(
    manifest: &Manifest,
    plan: &VolumePlan,
    check: Check,
    hashes: &mut Hashes,
    problems: &mut Vec<Problem>,
) {
    let rel = |dir: VolumeDir, name: &str| format!("{}/{name}", dir.as_str());
    let built: HashMap<(VolumeDir, &str), &ManifestFile> = manifest
        .files
        .iter()
        .map(|f| ((f.dir, f.name.as_str()), f))
        .collect();
    for planned in &plan.files {
        let Some(file) = built.get(&(planned.dir, planned.name.as_str())) else {
            problems.push(Problem::Unbuilt {
                path: rel(planned.dir, &planned.name),
            });
            continue;
        };
        let path = rel(planned.dir, &planned.name);
        if planned.source != file.source {
            problems.push(Problem::SourceMoved {
                path,
                expected: file.source.clone(),
                found: planned.source.clone(),
            });
        } else if planned.stamp != file.stamp {
            problems.push(Problem::SourceChanged {
                path,
                source: planned.source.clone(),
            });
        } else if check == Check::Checksums {
            let meta = std::fs::symlink_metadata(&planned.source).ok();
            let sum = meta.and_then(|m| hashes.of(&planned.source, &m, &file.digest).cloned());
            if sum.as_ref() != Some(&file.digest) {
                problems.push(Problem::SourceChecksum {
                    path,
                    source: planned.source.clone(),
                });
            }
        }
    }
    let planned: HashMap<(VolumeDir, &str), ()> = plan
        .files
        .iter()
        .map(|f| ((f.dir, f.name.as_str()), ()))
        .collect();
    for file in &manifest.files {
        if !planned.contains_key(&(file.dir, file.name.as_str())) {
            problems.push(Problem::NotPlanned {
                path: rel(file.dir, &file.name),
            });
        }
    }
    let built_links: HashMap<(VolumeDir, &str), &str> = manifest
        .links
        .iter()
        .map(|l| ((l.dir, l.name.as_str()), l.target.as_str()))
        .collect();
    for link in &plan.links {
        if built_links.get(&(link.dir, link.name.as_str())) != Some(&link.target.as_str()) {
            problems.push(Problem::Unbuilt {
                path: rel(link.dir, &link.name),
            });
        }
    }
    let planned_links: HashMap<(VolumeDir, &str), &str> = plan
        .links
        .iter()
        .map(|l| ((l.dir, l.name.as_str()), l.target.as_str()))
        .collect();
    for link in &manifest.links {
        if !planned_links.contains_key(&(link.dir, link.name.as_str())) {
            problems.push(Problem::NotPlanned {
                path: rel(link.dir, &link.name),
            });
        }
    }
}

/// Digests computed during one check, by inode and algorithm, so a hard link and its source are
/// read once.
#[derive(Default)]
struct Hashes(HashMap<(u64, u64, DigestKind), Option<FileDigest>>);

impl Hashes {
    /// The digest of `path`, of the same algorithm as `like`.
    fn of(
        &mut self,
        path: &Path,
        meta: &std::fs::Metadata,
        like: &FileDigest,
    ) -> Option<&FileDigest> {
        self.0
            .entry((meta.dev(), meta.ino(), like.kind()))
            .or_insert_with(|| like.same_kind_of_file(path).ok())
            .as_ref()
    }
}
