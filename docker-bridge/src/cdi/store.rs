//! The spec file on disk: written atomically, removed when the node has nothing to declare, and
//! never left beside another spec that declares the same device at the same priority.
//!
//! Facts relied on (CDI `pkg/cdi/spec-dirs.go`, `pkg/cdi/cache.go` `refresh`, `pkg/cdi/spec.go`
//! `GenerateSpecName`; `docs/reference/cdi.md` §3):
//! - runtimes read every `*.json` and `*.yaml` file (not recursively) of their spec directories,
//!   by default `/etc/cdi` then `/var/run/cdi`; a later directory has the higher priority;
//! - one device (`kind=name`) declared by two files of the **same** directory is a conflict:
//!   the runtime drops it from both. Across directories the higher priority wins silently;
//! - a spec for vendor `V`, class `C` is conventionally named `V-C` plus the extension:
//!   `nvidia.com-gpu.json` here. NVIDIA's toolkit writes `/var/run/cdi/nvidia.yaml` (also kind
//!   `nvidia.com/gpu`, YAML), the likeliest conflict on a real node.
//!
//! The file is replaced by writing a temporary file in the same directory (named so that no
//! runtime reads it: a leading dot and no `.json` suffix), `fsync`, `rename`, and `fsync` of the
//! directory, so a runtime sees the old spec or the new one, whole, even across a crash.
//!
//! The spec directory is made 0755 and the spec (and its temporary file) 0644 whatever the umask
//! (every runtime, also a rootless one, reads it; only root writes). A spec directory that
//! another user can write or owns is refused ([`mesos_gpu_os::fsmode`]): whoever can add a spec
//! there can give any container of a CDI runtime any device of the node.

use std::collections::BTreeSet;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use mesos_gpu_os::{FsModeError, JsonFile, StoreError, Written, durable, fsmode};
use serde::{Deserialize, Serialize};

use super::node::KIND;
use super::spec::Spec;

/// The file name of the spec, as CDI's `GenerateSpecName("nvidia.com", "gpu")` plus `.json`.
pub const SPEC_FILE_NAME: &str = "nvidia.com-gpu.json";
/// Where the spec goes by default: CDI's directory for generated specs.
pub const DEFAULT_SPEC_PATH: &str = "/var/run/cdi/nvidia.com-gpu.json";
/// The directories runtimes read by default, lowest priority first.
pub const DEFAULT_SPEC_DIRS: [&str; 2] = ["/etc/cdi", "/var/run/cdi"];
/// Largest other spec file read to see what it declares; NVIDIA's are tens of KiB.
const MAX_OTHER_SPEC_BYTES: u64 = 4 << 20;

/// Why the spec file could not be brought up to date.
#[derive(Debug, thiserror::Error)]
pub enum SpecFileError {
    /// A file-system operation failed.
    #[error(transparent)]
    Io(#[from] mesos_gpu_os::IoError),
    /// The spec file could not be read or replaced.
    #[error(transparent)]
    Write(#[from] StoreError),
    /// The spec directory could not be made, or is refused as others can write it.
    #[error(transparent)]
    Dir(#[from] FsModeError),
    /// Another spec in the same directory declares some of the same devices.
    #[error(
        "{other} also declares {KIND} device(s) {names} at the same priority as {ours}; runtimes \
         would drop both, so {action}. Remove or move {other} to let mesos-gpu keep the spec"
    )]
    Conflict {
        /// Our spec file.
        ours: PathBuf,
        /// The other spec file.
        other: PathBuf,
        /// The names both declare, comma-separated.
        names: String,
        /// What was done about our file.
        action: &'static str,
    },
}

impl SpecFileError {
    /// True when another spec declares the same devices (nothing is wrong with the file system).
    pub fn is_conflict(&self) -> bool {
        matches!(self, SpecFileError::Conflict { .. })
    }
}

/// What became of the spec file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// The file was written (it was missing or different).
    Written,
    /// The file already held exactly this spec.
    Unchanged,
    /// The node has nothing to declare; the file was removed.
    Removed,
    /// The node has nothing to declare and there was no file.
    Absent,
}

/// Another spec file that declares some of our device names in another directory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Overlap {
    /// The other file.
    pub path: PathBuf,
    /// The names both declare.
    pub names: Vec<String>,
    /// True when ours has the higher priority (runtimes use ours for those names).
    pub ours_wins: bool,
}

/// What a sync did and saw.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SyncReport {
    /// The spec file.
    pub path: PathBuf,
    /// What became of it.
    pub outcome: Outcome,
    /// Specs elsewhere that declare the same names (a warning, not a conflict).
    pub overlaps: Vec<Overlap>,
    /// Spec files that could not be read, with why; runtimes skip them too.
    pub unreadable: Vec<(PathBuf, String)>,
}

/// The spec file and the directories runtimes read, to check for conflicts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpecFile {
    path: PathBuf,
    spec_dirs: Vec<PathBuf>,
}

/// The header of any spec: enough to see which devices it declares.
#[derive(Deserialize)]
struct Declared {
    kind: String,
    #[serde(default)]
    devices: Vec<DeclaredDevice>,
}

#[derive(Deserialize)]
struct DeclaredDevice {
    name: String,
}

/// What the other spec files declare, as far as ours is concerned.
struct Others {
    declaring: Vec<Declaring>,
    unreadable: Vec<(PathBuf, String)>,
}

/// Another spec file declaring some of our names.
struct Declaring {
    path: PathBuf,
    names: Vec<String>,
    same_priority: bool,
    ours_wins: bool,
}

impl SpecFile {
    /// The spec at `path`, checked against the specs of `spec_dirs` (lowest priority first). A
    /// file outside those directories is taken as read with the highest priority.
    pub fn new(path: impl Into<PathBuf>, spec_dirs: Vec<PathBuf>) -> SpecFile {
        SpecFile {
            path: path.into(),
            spec_dirs,
        }
    }

    /// The spec file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Makes the file hold `spec`, or removes it when `spec` is `None` (nothing to declare).
    ///
    /// When another spec of the same directory declares one of the same devices, nothing is
    /// written and our file is removed, so that the other one keeps working: the error says so.
    pub fn sync(&self, spec: Option<&Spec>) -> Result<SyncReport, SpecFileError> {
        let Some(spec) = spec else {
            let outcome = match fs::remove_file(&self.path) {
                Ok(()) => {
                    sync_dir(self.dir())?;
                    Outcome::Removed
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => Outcome::Absent,
                Err(source) => return Err(io_err("remove", &self.path, source)),
            };
            return Ok(self.report(outcome, Vec::new(), Vec::new()));
        };
        let names: BTreeSet<&str> = spec.devices().iter().map(|d| d.name.as_str()).collect();
        let others = self.others(&names)?;
        if let Some(conflict) = others.declaring.iter().find(|o| o.same_priority) {
            let action = match fs::remove_file(&self.path) {
                Ok(()) => {
                    sync_dir(self.dir())?;
                    "ours was removed"
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => "ours was not written",
                Err(source) => return Err(io_err("remove", &self.path, source)),
            };
            return Err(SpecFileError::Conflict {
                ours: self.path.clone(),
                other: conflict.path.clone(),
                names: conflict.names.join(","),
                action,
            });
        }
        let overlaps = others
            .declaring
            .into_iter()
            .map(|o| Overlap {
                path: o.path,
                names: o.names,
                ours_wins: o.ours_wins,
            })
            .collect();
        let outcome = match self.write(spec)? {
            Written::Replaced => Outcome::Written,
            Written::Unchanged => Outcome::Unchanged,
        };
        Ok(self.report(outcome, overlaps, others.unreadable))
    }

    fn report(
        &self,
        outcome: Outcome,
        overlaps: Vec<Overlap>,
        unreadable: Vec<(PathBuf, String)>,
    ) -> SyncReport {
        SyncReport {
            path: self.path.clone(),
            outcome,
            overlaps,
            unreadable,
        }
    }

    fn dir(&self) -> &Path {
        match self.path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        }
    }

    /// Makes the file hold `spec` (the same bytes as [`Spec::to_json`]), unless it does
    /// already: temporary file, fsync, rename, fsync of the directory.
    fn write(&self, spec: &Spec) -> Result<Written, SpecFileError> {
        let dir = self.dir();
        fsmode::state_dir(dir, dir, fsmode::STATE_DIR)?;
        let written = JsonFile::at(&self.path, fsmode::STATE_FILE).write(spec)?;
        if written == Written::Replaced {
            tracing::debug!(path = %self.path.display(), "wrote CDI spec");
        }
        Ok(written)
    }

    /// Every other spec file of the spec directories (and ours) that declares one of `names`.
    fn others(&self, names: &BTreeSet<&str>) -> Result<Others, SpecFileError> {
        let ours_dir = canonical(self.dir());
        // Other names for our own file (a symlink to it) are not other specs.
        let ours_file = ours_dir.join(self.path.file_name().unwrap_or_default());
        let mut dirs: Vec<PathBuf> = self.spec_dirs.iter().map(|d| canonical(d)).collect();
        let ours_priority = match dirs.iter().rposition(|d| *d == ours_dir) {
            Some(p) => p,
            None => {
                dirs.push(ours_dir.clone());
                dirs.len() - 1
            }
        };
        let mut found = Others {
            declaring: Vec::new(),
            unreadable: Vec::new(),
        };
        for (priority, dir) in dirs.iter().enumerate() {
            let paths = spec_files(dir)?
                .into_iter()
                .filter(|p| *p != ours_file && canonical(p) != ours_file);
            for path in paths {
                let declared = match read_declared(&path) {
                    Ok(Some(declared)) => declared,
                    Ok(None) => continue,
                    Err(reason) => {
                        found.unreadable.push((path, reason));
                        continue;
                    }
                };
                if declared.kind != KIND {
                    continue;
                }
                let shared: Vec<String> = declared
                    .devices
                    .into_iter()
                    .map(|d| d.name)
                    .filter(|n| names.contains(n.as_str()))
                    .collect();
                if !shared.is_empty() {
                    found.declaring.push(Declaring {
                        path,
                        names: shared,
                        same_priority: priority == ours_priority,
                        ours_wins: ours_priority > priority,
                    });
                }
            }
        }
        Ok(found)
    }
}

/// The `*.json` and `*.yaml` files of `dir`, sorted, as runtimes read them; none when `dir`
/// does not exist.
fn spec_files(dir: &Path) -> Result<Vec<PathBuf>, SpecFileError> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => return Err(io_err("list", dir, source)),
    };
    let mut paths: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| {
            matches!(
                p.extension().and_then(|e| e.to_str()),
                Some("json" | "yaml")
            )
        })
        .collect();
    paths.sort();
    Ok(paths)
}

/// The devices a spec file declares; `Ok(None)` for a file that is not a regular file.
fn read_declared(path: &Path) -> Result<Option<Declared>, String> {
    let meta = fs::metadata(path).map_err(|e| e.to_string())?;
    if !meta.is_file() {
        return Ok(None);
    }
    if meta.len() > MAX_OTHER_SPEC_BYTES {
        return Err(format!(
            "{} bytes, more than the {MAX_OTHER_SPEC_BYTES} read of a spec",
            meta.len()
        ));
    }
    let bytes = fs::read(path).map_err(|e| e.to_string())?;
    let parsed = if path.extension().is_some_and(|e| e == "json") {
        serde_json::from_slice(&bytes).map_err(|e| e.to_string())
    } else {
        serde_norway::from_slice(&bytes).map_err(|e| e.to_string())
    };
    parsed.map(Some)
}

/// `path` with symlinks resolved (`/var/run` is `/run`), or as given when it does not exist.
fn canonical(path: &Path) -> PathBuf {
    fs::canonicalize(path).unwrap_or_else(|_| path.to_owned())
}

fn sync_dir(dir: &Path) -> Result<(), SpecFileError> {
    Ok(durable::sync_dir(dir).map_err(StoreError::from)?)
}

fn io_err(op: &'static str, path: &Path, source: io::Error) -> SpecFileError {
    SpecFileError::Io(mesos_gpu_os::IoError::new(op, path, source))
}

/// Two or more spec files of one directory declaring the same device: runtimes drop it from
/// all of them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DirConflict {
    /// The directory.
    pub dir: PathBuf,
    /// The device, `kind=name` as runtimes name it.
    pub device: String,
    /// The files declaring it.
    pub files: Vec<PathBuf>,
}

/// A device declared in two directories: the later (higher priority) one is used.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DirShadow {
    /// The device, `kind=name`.
    pub device: String,
    /// The file runtimes use.
    pub used: PathBuf,
    /// The file they ignore for it.
    pub ignored: PathBuf,
}

/// What the spec directories declare, device by device: conflicts, shadowed declarations and
/// files runtimes cannot read.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct DirsReport {
    /// Spec files read.
    pub files: Vec<PathBuf>,
    /// Devices declared twice in one directory.
    pub conflicts: Vec<DirConflict>,
    /// Devices declared in two directories.
    pub shadowed: Vec<DirShadow>,
    /// Spec files that could not be read, with why.
    pub unreadable: Vec<(PathBuf, String)>,
}

/// Reads every spec of `spec_dirs` (lowest priority first, as runtimes read them) and reports
/// each device declared by two files of one directory (a conflict) or by files of two
/// directories (the later wins).
pub fn scan_dirs(spec_dirs: &[PathBuf]) -> Result<DirsReport, SpecFileError> {
    let mut report = DirsReport::default();
    // Device → (priority, file) of its first declaration in the highest directory so far.
    let mut seen: std::collections::BTreeMap<String, (usize, PathBuf)> =
        std::collections::BTreeMap::new();
    let mut dirs: Vec<PathBuf> = Vec::new();
    for dir in spec_dirs.iter().map(|d| canonical(d)) {
        if !dirs.contains(&dir) {
            dirs.push(dir);
        }
    }
    for (priority, dir) in dirs.iter().enumerate() {
        for path in spec_files(dir)? {
            let declared = match read_declared(&path) {
                Ok(Some(declared)) => declared,
                Ok(None) => continue,
                Err(reason) => {
                    report.unreadable.push((path, reason));
                    continue;
                }
            };
            report.files.push(path.clone());
            for device in declared.devices {
                let device = format!("{}={}", declared.kind, device.name);
                match seen.get(&device) {
                    Some((p, first)) if *p == priority && *first != path => {
                        match report
                            .conflicts
                            .iter_mut()
                            .find(|c| c.device == device && c.dir == *dir)
                        {
                            Some(conflict) => conflict.files.push(path.clone()),
                            None => report.conflicts.push(DirConflict {
                                dir: dir.clone(),
                                device,
                                files: vec![first.clone(), path.clone()],
                            }),
                        }
                    }
                    Some((p, first)) if *p < priority => {
                        report.shadowed.push(DirShadow {
                            device: device.clone(),
                            used: path.clone(),
                            ignored: first.clone(),
                        });
                        seen.insert(device, (priority, path.clone()));
                    }
                    Some(_) => {}
                    None => {
                        seen.insert(device, (priority, path.clone()));
                    }
                }
            }
        }
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cdi::spec::{ContainerEdits, Device};
    use std::os::unix::fs::PermissionsExt as _;

    fn spec(names: &[&str], env: &str) -> Spec {
        let devices = names
            .iter()
            .map(|n| Device {
                name: (*n).to_owned(),
                container_edits: ContainerEdits {
                    env: vec![env.to_owned()],
                    ..ContainerEdits::default()
                },
            })
            .collect();
        Spec::new(KIND, devices, ContainerEdits::default()).expect("spec")
    }

    struct Dirs {
        _tmp: tempfile::TempDir,
        etc: PathBuf,
        run: PathBuf,
    }

    fn dirs() -> Dirs {
        let tmp = tempfile::tempdir().expect("tempdir");
        let etc = tmp.path().join("etc/cdi");
        let run = tmp.path().join("run/cdi");
        fs::create_dir_all(&etc).expect("mkdir");
        fs::create_dir_all(&run).expect("mkdir");
        Dirs {
            _tmp: tmp,
            etc,
            run,
        }
    }

    impl Dirs {
        fn ours(&self) -> SpecFile {
            SpecFile::new(
                self.run.join(SPEC_FILE_NAME),
                vec![self.etc.clone(), self.run.clone()],
            )
        }
    }

    fn names_in(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(dir)
            .expect("list")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn writes_once_then_only_on_change_and_leaves_no_temp_file() {
        let d = dirs();
        let file = d.ours();
        let first = spec(&["0", "all"], "A=1");
        assert_eq!(
            file.sync(Some(&first)).expect("sync").outcome,
            Outcome::Written
        );
        assert_eq!(fs::read(file.path()).expect("read"), first.to_json());
        let mode = fs::metadata(file.path())
            .expect("stat")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o644);
        assert_eq!(
            file.sync(Some(&first)).expect("sync").outcome,
            Outcome::Unchanged
        );
        let second = spec(&["0", "all"], "A=2");
        assert_eq!(
            file.sync(Some(&second)).expect("sync").outcome,
            Outcome::Written
        );
        assert_eq!(fs::read(file.path()).expect("read"), second.to_json());
        assert_eq!(names_in(&d.run), vec![SPEC_FILE_NAME.to_owned()]);
    }

    #[test]
    fn a_stale_temp_file_or_symlink_is_replaced_not_followed() {
        let d = dirs();
        let file = d.ours();
        let victim = d.etc.join("victim");
        fs::write(&victim, "keep").expect("write");
        let tmp = d
            .run
            .join(format!(".{SPEC_FILE_NAME}.{}.tmp", std::process::id()));
        std::os::unix::fs::symlink(&victim, &tmp).expect("symlink");
        file.sync(Some(&spec(&["0"], "A=1"))).expect("sync");
        assert_eq!(fs::read_to_string(&victim).expect("read"), "keep");
        assert_eq!(names_in(&d.run), vec![SPEC_FILE_NAME.to_owned()]);
    }

    #[test]
    fn nothing_to_declare_removes_the_file() {
        let d = dirs();
        let file = d.ours();
        file.sync(Some(&spec(&["0"], "A=1"))).expect("sync");
        assert_eq!(file.sync(None).expect("sync").outcome, Outcome::Removed);
        assert!(!file.path().exists());
        assert_eq!(file.sync(None).expect("sync").outcome, Outcome::Absent);
    }

    #[test]
    fn same_directory_same_device_is_refused_and_ours_removed() {
        let d = dirs();
        let file = d.ours();
        file.sync(Some(&spec(&["0", "1", "all"], "A=1")))
            .expect("sync");
        // NVIDIA's toolkit writes YAML to the same directory.
        let theirs = d.run.join("nvidia.yaml");
        fs::write(
            &theirs,
            "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n- name: \"1\"\n  containerEdits: {}\n- name: all\n  containerEdits: {}\n",
        )
        .expect("write");
        let err = file
            .sync(Some(&spec(&["0", "1", "all"], "A=1")))
            .expect_err("conflict");
        assert!(err.is_conflict());
        let text = err.to_string();
        assert!(text.contains("nvidia.yaml"), "{text}");
        assert!(text.contains("1,all"), "{text}");
        assert!(text.contains("ours was removed"), "{text}");
        assert!(!file.path().exists());
        assert!(theirs.exists());
        let again = file
            .sync(Some(&spec(&["0", "1", "all"], "A=1")))
            .expect_err("still a conflict");
        assert!(
            again.to_string().contains("ours was not written"),
            "{again}"
        );
    }

    #[test]
    fn other_directories_and_kinds_are_reported_not_refused() {
        let d = dirs();
        let file = d.ours();
        fs::write(
            d.etc.join("static.json"),
            r#"{"cdiVersion":"0.5.0","kind":"nvidia.com/gpu","devices":[{"name":"0","containerEdits":{}}]}"#,
        )
        .expect("write");
        fs::write(
            d.run.join("other-kind.json"),
            r#"{"cdiVersion":"0.5.0","kind":"example.com/gpu","devices":[{"name":"0","containerEdits":{}}]}"#,
        )
        .expect("write");
        fs::write(
            d.run.join("other-names.yaml"),
            "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n- name: \"7\"\n",
        )
        .expect("write");
        fs::write(d.run.join("broken.json"), "{").expect("write");
        fs::write(d.run.join("notes.txt"), "kind: nvidia.com/gpu").expect("write");
        let report = file.sync(Some(&spec(&["0"], "A=1"))).expect("sync");
        assert_eq!(report.outcome, Outcome::Written);
        assert_eq!(
            report.overlaps,
            vec![Overlap {
                path: canonical(&d.etc).join("static.json"),
                names: vec!["0".to_owned()],
                ours_wins: true,
            }]
        );
        assert_eq!(report.unreadable.len(), 1, "{:#?}", report.unreadable);
        assert!(report.unreadable[0].0.ends_with("broken.json"));

        // Ours in the static directory: the dynamic one's spec wins there.
        let low = SpecFile::new(
            d.etc.join(SPEC_FILE_NAME),
            vec![d.etc.clone(), d.run.clone()],
        );
        fs::remove_file(d.etc.join("static.json")).expect("rm");
        file.sync(None)
            .expect("remove ours from the dynamic directory");
        fs::write(
            d.run.join("dynamic.json"),
            r#"{"cdiVersion":"0.5.0","kind":"nvidia.com/gpu","devices":[{"name":"0","containerEdits":{}}]}"#,
        )
        .expect("write");
        let report = low.sync(Some(&spec(&["0"], "A=1"))).expect("sync");
        assert_eq!(report.overlaps.len(), 1);
        assert!(!report.overlaps[0].ours_wins);
    }

    #[test]
    fn a_spec_directory_named_through_a_symlink_is_the_same_directory() {
        let d = dirs();
        let var_run = d.etc.parent().expect("parent").join("var-run");
        std::os::unix::fs::symlink(d.run.parent().expect("parent"), &var_run).expect("symlink");
        fs::write(
            d.run.join("nvidia.json"),
            r#"{"cdiVersion":"0.5.0","kind":"nvidia.com/gpu","devices":[{"name":"0","containerEdits":{}}]}"#,
        )
        .expect("write");
        let file = SpecFile::new(
            d.run.join(SPEC_FILE_NAME),
            vec![d.etc.clone(), var_run.join("cdi")],
        );
        assert!(
            file.sync(Some(&spec(&["0"], "A=1")))
                .expect_err("conflict")
                .is_conflict()
        );
    }

    #[test]
    fn outside_the_spec_directories_the_file_is_checked_against_its_own() {
        let d = dirs();
        let elsewhere = d.etc.parent().expect("parent").join("elsewhere");
        fs::create_dir_all(&elsewhere).expect("mkdir");
        fs::write(
            elsewhere.join("x.json"),
            r#"{"cdiVersion":"0.5.0","kind":"nvidia.com/gpu","devices":[{"name":"0","containerEdits":{}}]}"#,
        )
        .expect("write");
        let file = SpecFile::new(
            elsewhere.join("gpu.json"),
            vec![d.etc.clone(), d.run.clone()],
        );
        assert!(
            file.sync(Some(&spec(&["0"], "A=1")))
                .expect_err("conflict")
                .is_conflict()
        );
    }

    #[test]
    fn a_symlink_to_our_own_file_is_not_a_conflict() {
        let d = dirs();
        let file = d.ours();
        file.sync(Some(&spec(&["0"], "A=1"))).expect("sync");
        std::os::unix::fs::symlink(SPEC_FILE_NAME, d.run.join("nvidia.json")).expect("symlink");
        let report = file.sync(Some(&spec(&["0"], "A=2"))).expect("no conflict");
        assert_eq!(report.outcome, Outcome::Written);
    }

    #[test]
    fn a_missing_directory_is_created() {
        let d = dirs();
        let file = SpecFile::new(d.run.join("sub/dir/gpu.json"), Vec::new());
        assert_eq!(
            file.sync(Some(&spec(&["0"], "A=1"))).expect("sync").outcome,
            Outcome::Written
        );
    }

    #[test]
    fn scanning_the_dirs_finds_conflicts_and_shadowed_devices() {
        let d = dirs();
        let write = |path: PathBuf, spec: &Spec| fs::write(path, spec.to_json()).expect("write");
        write(d.run.join(SPEC_FILE_NAME), &spec(&["0", "1", "all"], "A=1"));
        write(d.run.join("nvidia.json"), &spec(&["1", "2"], "A=2"));
        write(d.etc.join("old.json"), &spec(&["0"], "A=3"));
        fs::write(d.run.join("broken.yaml"), "kind: [").expect("write");
        let report = scan_dirs(&[d.etc.clone(), d.run.clone()]).expect("scan");
        let run = canonical(&d.run);
        assert_eq!(
            report.conflicts,
            [DirConflict {
                dir: run.clone(),
                device: format!("{KIND}=1"),
                files: vec![run.join(SPEC_FILE_NAME), run.join("nvidia.json")],
            }]
        );
        assert_eq!(
            report.shadowed,
            [DirShadow {
                device: format!("{KIND}=0"),
                used: run.join(SPEC_FILE_NAME),
                ignored: canonical(&d.etc).join("old.json"),
            }]
        );
        assert_eq!(report.unreadable.len(), 1, "{:?}", report.unreadable);
        assert_eq!(report.files.len(), 3);
        let clean = scan_dirs(std::slice::from_ref(&d.etc)).expect("scan");
        assert!(clean.conflicts.is_empty() && clean.shadowed.is_empty());
    }
}
