//! Device cgroups: which device nodes a container's processes may open or create.
//!
//! Two kernel interfaces do this, and [`DeviceCgroup`] hides which one is in use:
//! - cgroups v1, the `devices` controller ([`v1`]): an allow list written line by line to
//!   `devices.allow` / `devices.deny` and read back from `devices.list`.
//! - cgroups v2 ([`v2`]): a `BPF_PROG_TYPE_CGROUP_DEVICE` program attached to the container's
//!   cgroup, generated from the whole allow list and swapped atomically when the list changes.
//!   The kernel cannot give the list back, so the lifecycle checkpoints it for recovery.
//!
//! Layout (Mesos, `docs/reference/mesos-gpu-isolator.md` §1.1, §5): a container's cgroup is
//! `<hierarchy>/<parent>/<container id>` with parent `mesos`, e.g.
//! `/sys/fs/cgroup/devices/mesos/<id>` on v1 and `/sys/fs/cgroup/unified/mesos/<id>` on a hybrid
//! host's cgroup2 mount. Every path here comes from a [`CgroupLayout`]; nothing is hard-coded.
//!
//! Kernel facts shared by both versions (Documentation/admin-guide/cgroup-v1/cgroups.rst,
//! cgroup-v2.rst): writing a pid to `cgroup.procs` moves that whole process, and pid 0 means
//! "the writer", which is never what a caller of [`DeviceCgroup::add_process`] wants; `rmdir` of
//! a cgroup fails with `EBUSY` while a process or a child cgroup remains.

pub(crate) mod cpuset;
mod mount;
pub mod v1;
pub mod v2;

use std::fmt;
use std::io;
use std::path::{Component, Path, PathBuf};

use mesos_gpu_os::fsmode;
use mesos_gpu_os::io::{IoContext as _, IoError};

pub use mesos_gpu_node::rules::{
    Access, DeviceKind, DeviceRule, RuleError, default_whitelist, normalize, parse_list,
};
use mesos_gpu_os::container_id::ContainerId;
pub use mount::CgroupMounts;
pub use mount::Hierarchy;
pub use v1::V1DeviceCgroup;
pub use v2::V2DeviceCgroup;
pub use v2::program::DeviceProgram;

/// The mode of the cgroups the module makes: 0755 whatever the umask, as Mesos asks for its own
/// (stout `os::mkdir`, `::mkdir(path, 0755)`), so that only root may make cgroups inside one
/// (which would keep its `rmdir` failing with `EBUSY`).
pub(crate) const CGROUP_DIR_MODE: u32 = fsmode::STATE_DIR;

/// Mesos's default parent of container cgroups (`--cgroups_root`).
pub const DEFAULT_PARENT: &str = "mesos";

/// Where Mesos wants cgroup2 for running cgroup v2 (`cgroups2::MOUNT_POINT`,
/// `src/linux/cgroups2.cpp` 71): see [`CgroupMounts::hierarchy`].
pub const MESOS_CGROUP2_MOUNT: &str = "/sys/fs/cgroup";

/// Which cgroup interface controls device access.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CgroupVersion {
    /// cgroups v1 `devices` controller.
    V1,
    /// cgroups v2 eBPF device programs.
    V2,
}

impl fmt::Display for CgroupVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CgroupVersion::V1 => "v1",
            CgroupVersion::V2 => "v2",
        })
    }
}

/// Errors of device cgroup management.
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    /// A parent path that would leave the hierarchy.
    #[error("cgroup parent {parent:?}: expected a relative path without `..`")]
    InvalidParent {
        /// The parent as given.
        parent: PathBuf,
    },
    /// Pid 0 (which would move the caller itself).
    #[error("pid {pid}: expected a process id greater than 0")]
    InvalidPid {
        /// The pid as given.
        pid: u32,
    },
    /// The mount table could not be read or parsed.
    #[error("cannot read the mount table to find the cgroup hierarchies")]
    Mountinfo {
        /// The cause.
        #[source]
        source: mesos_gpu_os::MountinfoError,
    },
    /// Neither hierarchy is mounted.
    #[error("found neither a cgroup2 mount nor a cgroup v1 `devices` hierarchy in the mount table")]
    NoHierarchy,
    /// A layout of one version given to the other version's code.
    #[error("the cgroup layout is for cgroups {layout}, not {wanted}")]
    WrongVersion {
        /// The layout's version.
        layout: CgroupVersion,
        /// The version the code drives.
        wanted: CgroupVersion,
    },
    /// `create` found the cgroup already there.
    #[error("container {container} already has a cgroup at {path}")]
    Exists {
        /// The container.
        container: ContainerId,
        /// Its cgroup directory.
        path: PathBuf,
    },
    /// The container's cgroup does not exist.
    #[error("container {container} has no cgroup at {path}")]
    Missing {
        /// The container.
        container: ContainerId,
        /// Where its cgroup should be.
        path: PathBuf,
    },
    /// A cgroup directory could not be created.
    #[error(transparent)]
    Create(IoError),
    /// A cgroup control file could not be written.
    #[error("cannot write {value:?} to {path}")]
    Write {
        /// The control file.
        path: PathBuf,
        /// What was written.
        value: String,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// A file could not be read.
    #[error(transparent)]
    Read(IoError),
    /// `devices.list` (v1) holds a line that is not a device rule.
    #[error("{path} holds an invalid device rule")]
    List {
        /// The file.
        path: PathBuf,
        /// The parse error.
        #[source]
        source: RuleError,
    },
    /// The cgroup still has processes, so it was left in place.
    #[error("cannot remove cgroup {path}: processes {pids:?} are still in it")]
    Busy {
        /// The cgroup directory.
        path: PathBuf,
        /// The processes found in it.
        pids: Vec<u32>,
    },
    /// A cgroup directory could not be removed.
    #[error(transparent)]
    Remove(IoError),
    /// A rule cgroups v1 cannot express.
    #[error("cgroups v1 cannot apply {rule}: type a (all devices) can only be `a *:* rwm` there")]
    Unsupported {
        /// The rule.
        rule: DeviceRule,
    },
    /// After an update, `devices.list` (v1) does not hold what was written.
    #[error("{path} lists {found:?} after the update, expected {expected:?}")]
    Mismatch {
        /// The `devices.list` file.
        path: PathBuf,
        /// The normalized list we wanted.
        expected: Vec<String>,
        /// What the kernel listed.
        found: Vec<String>,
    },
    /// A `bpf(2)` command failed.
    #[error("{op} for cgroup {path} failed")]
    Bpf {
        /// The command, e.g. `BPF_PROG_ATTACH`.
        op: &'static str,
        /// The cgroup directory.
        path: PathBuf,
        /// The errno.
        #[source]
        source: io::Error,
    },
    /// The verifier rejected the generated device program.
    #[error(
        "the kernel rejected the device program for {path} ({insns} instructions); verifier log: {log}"
    )]
    Verifier {
        /// The cgroup directory.
        path: PathBuf,
        /// Program length.
        insns: usize,
        /// The verifier's log.
        log: String,
        /// The errno.
        #[source]
        source: io::Error,
    },
    /// More than one of our device programs is attached to a cgroup (v2).
    #[error("cgroup {path} has {} of our device programs attached (ids {ids:?}); expected at most one", ids.len())]
    TooManyPrograms {
        /// The cgroup directory.
        path: PathBuf,
        /// Their program ids.
        ids: Vec<u32>,
    },
    /// v2 recovery without the checkpointed allow list.
    #[error(
        "container {container} uses cgroups v2, whose allow list must come from a checkpoint to be recovered"
    )]
    MissingCheckpoint {
        /// The container.
        container: ContainerId,
    },
}

impl CgroupError {
    /// True when a cgroup could not be removed because processes remain in it.
    pub fn is_busy(&self) -> bool {
        matches!(self, CgroupError::Busy { .. })
    }

    /// True when the container has no cgroup.
    pub fn is_missing(&self) -> bool {
        matches!(self, CgroupError::Missing { .. })
    }

    /// True when `create` found an existing cgroup.
    pub fn is_exists(&self) -> bool {
        matches!(self, CgroupError::Exists { .. })
    }
}

/// The step named when a cgroup directory cannot be made ("cannot create cgroup <path>").
const CREATE: &str = "create cgroup";

/// Context for io errors in one call.
pub(crate) trait IoResultExt<T> {
    /// Maps the error to [`CgroupError::Read`] of `path`.
    fn wrap_read(self, path: &Path) -> Result<T, CgroupError>;
    /// Maps the error to [`CgroupError::Write`] of `value` to `path`.
    fn wrap_write(self, path: &Path, value: &str) -> Result<T, CgroupError>;
    /// Maps the error to [`CgroupError::Bpf`] of command `op` on the cgroup `path`.
    fn wrap_bpf(self, op: &'static str, path: &Path) -> Result<T, CgroupError>;
}

impl<T> IoResultExt<T> for io::Result<T> {
    fn wrap_read(self, path: &Path) -> Result<T, CgroupError> {
        self.map_err(|source| CgroupError::Read(IoError::new("read", path, source)))
    }

    fn wrap_write(self, path: &Path, value: &str) -> Result<T, CgroupError> {
        self.map_err(|source| CgroupError::Write {
            path: path.to_owned(),
            value: value.to_owned(),
            source,
        })
    }

    fn wrap_bpf(self, op: &'static str, path: &Path) -> Result<T, CgroupError> {
        self.map_err(|source| CgroupError::Bpf {
            op,
            path: path.to_owned(),
            source,
        })
    }
}

/// Where container cgroups live: a hierarchy and a parent path inside it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupLayout {
    hierarchy: Hierarchy,
    parent: PathBuf,
}

impl CgroupLayout {
    /// Container cgroups at `<hierarchy mount>/<parent>/<id>`; `parent` must be relative and
    /// free of `..` (it may be empty).
    pub fn new(
        hierarchy: Hierarchy,
        parent: impl Into<PathBuf>,
    ) -> Result<CgroupLayout, CgroupError> {
        let parent = parent.into();
        if !parent
            .components()
            .all(|c| matches!(c, Component::Normal(_) | Component::CurDir))
        {
            return Err(CgroupError::InvalidParent { parent });
        }
        Ok(CgroupLayout { hierarchy, parent })
    }

    #[cfg(test)]
    /// Mesos's v1 layout under the v1 root `root` (normally `/sys/fs/cgroup`):
    /// `<root>/devices/mesos/<id>`.
    pub(crate) fn v1_mesos(root: &Path) -> CgroupLayout {
        let hierarchy = Hierarchy {
            version: CgroupVersion::V1,
            mount: root.join("devices"),
        };
        CgroupLayout {
            hierarchy,
            parent: PathBuf::from(DEFAULT_PARENT),
        }
    }

    #[cfg(test)]
    /// Mesos's v2 layout under the cgroup2 mount `mount`: `<mount>/mesos/<id>`.
    pub(crate) fn v2_mesos(mount: &Path) -> CgroupLayout {
        let hierarchy = Hierarchy {
            version: CgroupVersion::V2,
            mount: mount.to_owned(),
        };
        CgroupLayout {
            hierarchy,
            parent: PathBuf::from(DEFAULT_PARENT),
        }
    }

    /// Mesos's layout in the hierarchy this process's mount table offers
    /// (`CgroupMounts::hierarchy`).
    pub fn detect() -> Result<CgroupLayout, CgroupError> {
        let mounts = CgroupMounts::read()?;
        CgroupLayout::new(
            mounts.hierarchy(Path::new(MESOS_CGROUP2_MOUNT))?,
            DEFAULT_PARENT,
        )
    }

    /// The cgroup version.
    pub fn version(&self) -> CgroupVersion {
        self.hierarchy.version
    }

    /// The hierarchy's mount point.
    pub fn mount(&self) -> &Path {
        &self.hierarchy.mount
    }

    /// The directory holding the container cgroups.
    pub fn parent_dir(&self) -> PathBuf {
        self.hierarchy.mount.join(&self.parent)
    }

    /// The cgroup directory of `container`.
    pub fn container_dir(&self, container: &ContainerId) -> PathBuf {
        self.parent_dir().join(container.as_str())
    }

    /// Fails unless this layout is for `wanted`.
    fn expect_version(&self, wanted: CgroupVersion) -> Result<(), CgroupError> {
        if self.version() == wanted {
            Ok(())
        } else {
            Err(CgroupError::WrongVersion {
                layout: self.version(),
                wanted,
            })
        }
    }
}

/// A container's device cgroup, on whichever version the layout names. This is what the
/// lifecycle drives.
#[derive(Debug)]
pub enum DeviceCgroup {
    /// cgroups v1 `devices` controller.
    V1(V1DeviceCgroup),
    /// cgroups v2 device program.
    V2(V2DeviceCgroup),
}

impl DeviceCgroup {
    /// Creates the container's cgroup allowing exactly `base` (normally [`default_whitelist`]
    /// plus the NVIDIA control devices). Fails with [`CgroupError::Exists`] if it exists; on any
    /// failure nothing is left behind.
    pub fn create(
        layout: &CgroupLayout,
        container: &ContainerId,
        base: &[DeviceRule],
    ) -> Result<DeviceCgroup, CgroupError> {
        Ok(match layout.version() {
            CgroupVersion::V1 => DeviceCgroup::V1(V1DeviceCgroup::create(layout, container, base)?),
            CgroupVersion::V2 => DeviceCgroup::V2(V2DeviceCgroup::create(layout, container, base)?),
        })
    }

    /// Takes over an existing container cgroup after an agent restart. On v1 the kernel's list
    /// is the truth and `checkpointed` is not used; on v2 `checkpointed` (the list the lifecycle
    /// saved) is required, and the program built from it replaces whatever of ours is attached
    /// (see [`V2DeviceCgroup::recover`]).
    pub fn recover(
        layout: &CgroupLayout,
        container: &ContainerId,
        checkpointed: Option<&[DeviceRule]>,
    ) -> Result<DeviceCgroup, CgroupError> {
        Ok(match (layout.version(), checkpointed) {
            (CgroupVersion::V1, _) => DeviceCgroup::V1(V1DeviceCgroup::open(layout, container)?),
            (CgroupVersion::V2, Some(rules)) => {
                DeviceCgroup::V2(V2DeviceCgroup::recover(layout, container, rules)?)
            }
            (CgroupVersion::V2, None) => {
                return Err(CgroupError::MissingCheckpoint {
                    container: container.clone(),
                });
            }
        })
    }

    /// Opens the existing cgroup directory `path` of `layout`'s hierarchy as `container`'s,
    /// touching nothing in it (the cgroup someone else made, e.g. Mesos).
    pub fn open_at(
        layout: &CgroupLayout,
        path: PathBuf,
        container: &ContainerId,
    ) -> Result<DeviceCgroup, CgroupError> {
        Ok(match layout.version() {
            CgroupVersion::V1 => {
                DeviceCgroup::V1(V1DeviceCgroup::open_at(layout, path, container)?)
            }
            CgroupVersion::V2 => {
                DeviceCgroup::V2(V2DeviceCgroup::open_at(layout, path, container)?)
            }
        })
    }

    /// True when `container` has a cgroup directory in `layout`.
    pub fn exists(layout: &CgroupLayout, container: &ContainerId) -> bool {
        layout.container_dir(container).is_dir()
    }

    /// The cgroup version in use.
    pub fn version(&self) -> CgroupVersion {
        match self {
            DeviceCgroup::V1(_) => CgroupVersion::V1,
            DeviceCgroup::V2(_) => CgroupVersion::V2,
        }
    }

    /// The container.
    pub fn container(&self) -> &ContainerId {
        match self {
            DeviceCgroup::V1(cg) => cg.container(),
            DeviceCgroup::V2(cg) => cg.container(),
        }
    }

    /// The cgroup directory.
    pub fn path(&self) -> &Path {
        match self {
            DeviceCgroup::V1(cg) => cg.path(),
            DeviceCgroup::V2(cg) => cg.path(),
        }
    }

    /// Makes the container's allow list exactly `rules` (the full list, base included). v1
    /// writes the difference; v2 swaps in a new program atomically. On failure the previous
    /// list stays in force.
    pub fn set_allowed(&mut self, rules: &[DeviceRule]) -> Result<(), CgroupError> {
        match self {
            DeviceCgroup::V1(cg) => cg.set_allowed(rules),
            DeviceCgroup::V2(cg) => cg.set_allowed(rules),
        }
    }

    /// The allow list in force, normalized: read from the kernel on v1, the last list set on v2.
    pub fn allowed(&self) -> Result<Vec<DeviceRule>, CgroupError> {
        match self {
            DeviceCgroup::V1(cg) => cg.allowed(),
            DeviceCgroup::V2(cg) => Ok(cg.allowed().to_vec()),
        }
    }

    /// Moves process `pid` into the cgroup.
    pub fn add_process(&self, pid: u32) -> Result<(), CgroupError> {
        match self {
            DeviceCgroup::V1(cg) => cg.add_process(pid),
            DeviceCgroup::V2(cg) => cg.add_process(pid),
        }
    }

    /// The processes in the cgroup.
    pub fn processes(&self) -> Result<Vec<u32>, CgroupError> {
        read_procs(self.path())
    }

    /// Removes the cgroup. Refuses with [`CgroupError::Busy`] while processes remain, leaving
    /// everything in force; succeeds when the cgroup is already gone.
    pub fn destroy(&self) -> Result<(), CgroupError> {
        match self {
            DeviceCgroup::V1(cg) => cg.destroy(),
            DeviceCgroup::V2(cg) => cg.destroy(),
        }
    }
}

/// Fails for pid 0, which the kernel reads as "the writing process".
pub(crate) fn check_pid(pid: u32) -> Result<(), CgroupError> {
    if pid == 0 {
        Err(CgroupError::InvalidPid { pid })
    } else {
        Ok(())
    }
}

/// The pids listed in `<dir>/cgroup.procs`.
pub fn read_procs(dir: &Path) -> Result<Vec<u32>, CgroupError> {
    let path = dir.join("cgroup.procs");
    let text = {
        let _span = crate::timing::span(crate::timing::Step::CgroupRead);
        std::fs::read_to_string(&path).wrap_read(&path)?
    };
    text.split_whitespace()
        .map(|pid| {
            pid.parse().map_err(|_| {
                let source =
                    io::Error::new(io::ErrorKind::InvalidData, format!("{pid:?} is not a pid"));
                CgroupError::Read(IoError::new("read", &path, source))
            })
        })
        .collect()
}

/// Creates the container's cgroup directory (and its parents); the directory itself must not
/// exist yet, so two creators cannot both think they own it.
pub(crate) fn create_container_dir(
    layout: &CgroupLayout,
    container: &ContainerId,
) -> Result<PathBuf, CgroupError> {
    let _span = crate::timing::span(crate::timing::Step::CgroupMkdir);
    let parent = layout.parent_dir();
    fsmode::create_dir_all(&parent, CGROUP_DIR_MODE)
        .at(CREATE, &parent)
        .map_err(CgroupError::Create)?;
    let path = layout.container_dir(container);
    match fsmode::mkdir(&path, CGROUP_DIR_MODE) {
        Ok(()) => Ok(path),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Err(CgroupError::Exists {
            container: container.clone(),
            path,
        }),
        Err(source) => Err(CgroupError::Create(IoError::new(CREATE, path, source))),
    }
}

/// `rmdir` of a cgroup: [`CgroupError::Busy`] with the remaining pids on `EBUSY`; success when
/// it is already gone.
pub fn remove_cgroup_dir(path: &Path) -> Result<(), CgroupError> {
    let removed = {
        let _span = crate::timing::span(crate::timing::Step::CgroupRmdir);
        std::fs::remove_dir(path)
    };
    match removed {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            tracing::debug!(path = %path.display(), "cgroup already removed");
            Ok(())
        }
        Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
            let pids = read_procs(path).unwrap_or_default();
            Err(CgroupError::Busy {
                path: path.to_owned(),
                pids,
            })
        }
        Err(source) => Err(CgroupError::Remove(IoError::new(
            "remove cgroup",
            path,
            source,
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts() {
        let id = ContainerId::new("c1").expect("valid");
        let v1 = CgroupLayout::v1_mesos(Path::new("/r"));
        assert_eq!(v1.container_dir(&id), Path::new("/r/devices/mesos/c1"));
        assert_eq!(v1.version(), CgroupVersion::V1);
        let v2 = CgroupLayout::v2_mesos(Path::new("/u"));
        assert_eq!(v2.container_dir(&id), Path::new("/u/mesos/c1"));
        let h = Hierarchy {
            version: CgroupVersion::V2,
            mount: "/u".into(),
        };
        let flat = CgroupLayout::new(h.clone(), "").expect("empty parent");
        assert_eq!(flat.container_dir(&id), Path::new("/u/c1"));
        for bad in ["/abs", "a/../b", ".."] {
            let err = CgroupLayout::new(h.clone(), bad).expect_err(bad);
            assert!(matches!(err, CgroupError::InvalidParent { .. }), "{err:?}");
        }
        let err = v2.expect_version(CgroupVersion::V1).expect_err("wrong");
        assert_eq!(
            err.to_string(),
            "the cgroup layout is for cgroups v2, not v1"
        );
    }

    #[test]
    fn pid_zero_is_refused() {
        assert!(matches!(
            check_pid(0),
            Err(CgroupError::InvalidPid { pid: 0 })
        ));
        assert!(check_pid(1).is_ok());
    }

    #[test]
    fn procs_and_dirs_in_a_tempdir() {
        let tmp = tempfile::tempdir().expect("tempdir");
        std::fs::write(tmp.path().join("cgroup.procs"), "12\n345\n").expect("write");
        assert_eq!(read_procs(tmp.path()).expect("parse"), [12, 345]);
        std::fs::write(tmp.path().join("cgroup.procs"), "12\nx\n").expect("write");
        assert!(matches!(read_procs(tmp.path()), Err(CgroupError::Read(_))));

        let layout = CgroupLayout::new(
            Hierarchy {
                version: CgroupVersion::V2,
                mount: tmp.path().into(),
            },
            "p/q",
        )
        .expect("valid");
        let id = ContainerId::new("c").expect("valid");
        let dir = create_container_dir(&layout, &id).expect("created");
        assert_eq!(dir, tmp.path().join("p/q/c"));
        assert!(
            create_container_dir(&layout, &id)
                .expect_err("twice")
                .is_exists()
        );
        remove_cgroup_dir(&dir).expect("removed");
        remove_cgroup_dir(&dir).expect("already gone is fine");
    }
}
