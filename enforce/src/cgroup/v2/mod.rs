//! cgroups v2 device control: an eBPF program per container cgroup.
//!
//! Facts relied on (kernel/bpf/cgroup.c, Documentation/admin-guide/cgroup-v2.rst "Device
//! controller", `docs/reference/mesos-gpu-isolator.md` §5.3):
//! - A `BPF_PROG_TYPE_CGROUP_DEVICE` program attached with `BPF_CGROUP_DEVICE` decides every
//!   open and mknod of a device node by the cgroup's processes. With `BPF_F_ALLOW_MULTI` the
//!   programs of the cgroup and of all its ancestors run and *every* one must allow, so ours can
//!   only take access away, never grant what an ancestor's program denies.
//! - `BPF_F_REPLACE` with `replace_bpf_fd` swaps one attached program for another in a single
//!   step: no access is ever checked against neither or both. Mesos attaches the same way and
//!   treats more than one of its programs on a cgroup as an error.
//! - A program's allow list cannot be read back from the kernel; the lifecycle checkpoints it
//!   and hands it to [`V2DeviceCgroup::recover`]. We recognise our programs by their name
//!   (`PROGRAM_NAME`, via `BPF_OBJ_GET_INFO_BY_FD`) and leave other programs alone.
//! - `rmdir` of the cgroup releases its attached programs; we detach ours explicitly first and
//!   re-attach it should the `rmdir` fail, so a refused destroy changes nothing.
//! - The verifier answers a bad program with `EACCES` or `EINVAL`; its log says why.
//! - On a hybrid host the program is enforced even for processes in the root of the v1
//!   `devices` hierarchy.

pub mod program;

use std::ffi::CStr;
use std::fs::{File, OpenOptions};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use mesos_gpu_os::IoError;

use self::program::DeviceProgram;
use super::{
    CgroupError, CgroupLayout, CgroupVersion, ContainerId, IoResultExt, check_pid,
    create_container_dir, remove_cgroup_dir,
};
use crate::sys;
use crate::timing::{self, Step};
use mesos_gpu_node::rules::{Access, DeviceRule, normalize};

/// The name our device programs are loaded with (`bpftool prog` shows it).
pub(crate) const PROGRAM_NAME: &str = "mgpu_devices";
const PROGRAM_NAME_C: &CStr = c"mgpu_devices";
/// The license string of the program; it calls no GPL-only helper.
const LICENSE: &CStr = c"Apache-2.0";
/// Size of the verifier log buffer for the retry after a rejected load.
const LOG_SIZE: usize = 1 << 16;

/// A container's cgroup in the cgroup2 hierarchy, with our device program attached.
#[derive(Debug)]
pub struct V2DeviceCgroup {
    container: ContainerId,
    path: PathBuf,
    allowed: Vec<DeviceRule>,
}

impl V2DeviceCgroup {
    /// Creates the cgroup and attaches the program allowing exactly `base`. Fails with
    /// [`CgroupError::Exists`] if the cgroup exists; removes it again on any later failure.
    #[tracing::instrument(skip_all, fields(container = %container))]
    pub fn create(
        layout: &CgroupLayout,
        container: &ContainerId,
        base: &[DeviceRule],
    ) -> Result<V2DeviceCgroup, CgroupError> {
        layout.expect_version(CgroupVersion::V2)?;
        let path = create_container_dir(layout, container)?;
        let mut cgroup = V2DeviceCgroup {
            container: container.clone(),
            path,
            allowed: Vec::new(),
        };
        if let Err(e) = cgroup.set_allowed(base) {
            if let Err(cleanup) = remove_cgroup_dir(&cgroup.path) {
                tracing::error!(error = %cleanup, "cannot remove the half-created cgroup");
            }
            return Err(e);
        }
        tracing::info!(path = %cgroup.path.display(), rules = cgroup.allowed.len(), "created v2 device cgroup");
        Ok(cgroup)
    }

    /// Takes over the existing cgroup of `container` after a restart: the program built from
    /// `checkpointed` replaces ours atomically (or is attached, with a warning, if none of ours
    /// was), so the kernel enforces exactly the checkpointed list.
    #[tracing::instrument(skip_all, fields(container = %container))]
    pub fn recover(
        layout: &CgroupLayout,
        container: &ContainerId,
        checkpointed: &[DeviceRule],
    ) -> Result<V2DeviceCgroup, CgroupError> {
        layout.expect_version(CgroupVersion::V2)?;
        let path = layout.container_dir(container);
        if !path.is_dir() {
            return Err(CgroupError::Missing {
                container: container.clone(),
                path,
            });
        }
        let mut cgroup = V2DeviceCgroup {
            container: container.clone(),
            path,
            allowed: Vec::new(),
        };
        match cgroup.attached_program()? {
            Some(id) => tracing::debug!(id, "found our device program"),
            None => tracing::warn!(
                "no device program of ours was attached; attaching the checkpointed list"
            ),
        }
        cgroup.set_allowed(checkpointed)?;
        Ok(cgroup)
    }

    /// Opens the existing cgroup of `container` without touching its programs, so recovery can
    /// check [`Self::attached_program`] first; its [`Self::allowed`] is empty until set.
    pub fn open(
        layout: &CgroupLayout,
        container: &ContainerId,
    ) -> Result<V2DeviceCgroup, CgroupError> {
        V2DeviceCgroup::open_at(layout, layout.container_dir(container), container)
    }

    /// Opens the existing cgroup directory `path` as `container`'s, like [`Self::open`].
    pub(crate) fn open_at(
        layout: &CgroupLayout,
        path: PathBuf,
        container: &ContainerId,
    ) -> Result<V2DeviceCgroup, CgroupError> {
        layout.expect_version(CgroupVersion::V2)?;
        if !path.is_dir() {
            return Err(CgroupError::Missing {
                container: container.clone(),
                path,
            });
        }
        Ok(V2DeviceCgroup {
            container: container.clone(),
            path,
            allowed: Vec::new(),
        })
    }

    /// The container.
    pub fn container(&self) -> &ContainerId {
        &self.container
    }

    /// The cgroup directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// True while the cgroup directory exists.
    pub fn exists(&self) -> bool {
        self.path.is_dir()
    }

    /// The allow list our program enforces, normalized: the last one set, or `a *:* rwm` after
    /// [`V2DeviceCgroup::detach`] (this cgroup then restricts nothing itself).
    pub fn allowed(&self) -> &[DeviceRule] {
        &self.allowed
    }

    /// Makes the allow list exactly `rules`: loads the program built from them and attaches it
    /// in place of ours (`BPF_F_REPLACE`), or alongside others if none of ours is attached. On
    /// failure the previous program stays attached.
    #[tracing::instrument(skip_all, fields(container = %self.container))]
    pub fn set_allowed(&mut self, rules: &[DeviceRule]) -> Result<(), CgroupError> {
        let rules = normalize(rules);
        let (prog, prog_id, insns) = match cached_program(&rules) {
            Some(hit) => hit,
            None => {
                let (program, bytes) = {
                    let _span = timing::span(Step::BpfBuild);
                    let program = DeviceProgram::build(&rules);
                    let bytes = program.to_bytes();
                    (program, bytes)
                };
                let _span = timing::span(Step::BpfLoad);
                let prog = self.load(&program, &bytes)?;
                let id = sys::prog_info(prog.as_fd())
                    .wrap_bpf("BPF_OBJ_GET_INFO_BY_FD", &self.path)?
                    .id;
                cache_program(&rules, &prog, id, program.len());
                (prog, id, program.len())
            }
        };
        let _span = timing::span(Step::BpfAttach);
        let dir = self.open_dir()?;
        let ours = self.our_programs(&dir)?;
        if let [(attached, _)] = ours.as_slice()
            && *attached == prog_id
        {
            // The very program (a cached one) is attached already: the kernel refuses to
            // attach one program twice, and there is nothing to change.
            self.allowed = rules;
            return Ok(());
        }
        let replace = match ours.as_slice() {
            [] => None,
            [(_, fd)] => Some(fd.as_fd()),
            many => {
                let ids = many.iter().map(|(id, _)| *id).collect();
                return Err(CgroupError::TooManyPrograms {
                    path: self.path.clone(),
                    ids,
                });
            }
        };
        sys::prog_attach(dir.as_fd(), prog.as_fd(), replace)
            .wrap_bpf("BPF_PROG_ATTACH", &self.path)?;
        self.allowed = rules;
        let old = ours.first().map(|(id, _)| *id);
        tracing::info!(prog_id, replaced = ?old, rules = self.allowed.len(), insns, "attached device program");
        Ok(())
    }

    /// The id of our program attached to the cgroup, if one is; more than one is an error.
    pub fn attached_program(&self) -> Result<Option<u32>, CgroupError> {
        let ours = self.our_programs(&self.open_dir()?)?;
        match ours.as_slice() {
            [] => Ok(None),
            [(id, _)] => Ok(Some(*id)),
            many => Err(CgroupError::TooManyPrograms {
                path: self.path.clone(),
                ids: many.iter().map(|(id, _)| *id).collect(),
            }),
        }
    }

    /// The ids of the device programs attached to the cgroup that are not ours (Mesos's device
    /// manager attaches one to each container cgroup when `cgroups/devices` is enabled).
    pub fn foreign_programs(&self) -> Result<Vec<u32>, CgroupError> {
        let dir = self.open_dir()?;
        let all = sys::prog_query(dir.as_fd()).wrap_bpf("BPF_PROG_QUERY", &self.path)?;
        let ours: Vec<u32> = self
            .our_programs(&dir)?
            .into_iter()
            .map(|(id, _)| id)
            .collect();
        Ok(all.into_iter().filter(|id| !ours.contains(id)).collect())
    }

    /// Detaches our program(s) from the cgroup, lifting this cgroup's own restriction; returns
    /// the ids detached.
    pub fn detach(&mut self) -> Result<Vec<u32>, CgroupError> {
        let dir = self.open_dir()?;
        let ours = self.our_programs(&dir)?;
        for (id, fd) in &ours {
            sys::prog_detach(dir.as_fd(), fd.as_fd()).wrap_bpf("BPF_PROG_DETACH", &self.path)?;
            tracing::info!(container = %self.container, prog_id = id, "detached device program");
        }
        self.allowed = vec![DeviceRule::all(Access::RWM)];
        Ok(ours.into_iter().map(|(id, _)| id).collect())
    }

    /// Moves process `pid` into the cgroup (`cgroup.procs`).
    pub fn add_process(&self, pid: u32) -> Result<(), CgroupError> {
        check_pid(pid)?;
        let path = self.path.join("cgroup.procs");
        let value = pid.to_string();
        let _span = timing::span(Step::CgroupWrite);
        std::fs::write(&path, &value).wrap_write(&path, &value)?;
        tracing::debug!(container = %self.container, pid, "added process to v2 device cgroup");
        Ok(())
    }

    /// Detaches our program and removes the cgroup. Refuses with [`CgroupError::Busy`] while
    /// processes remain (the program stays attached); success if the cgroup is already gone.
    #[tracing::instrument(skip_all, fields(container = %self.container))]
    pub fn destroy(&self) -> Result<(), CgroupError> {
        if !self.path.exists() {
            return remove_cgroup_dir(&self.path);
        }
        let pids = super::read_procs(&self.path)?;
        if !pids.is_empty() {
            return Err(CgroupError::Busy {
                path: self.path.clone(),
                pids,
            });
        }
        let attach_span = timing::span(Step::BpfAttach);
        let dir = self.open_dir()?;
        let ours = self.our_programs(&dir)?;
        let mut detached = Vec::new();
        let mut result = Ok(());
        for (id, fd) in &ours {
            match sys::prog_detach(dir.as_fd(), fd.as_fd()).wrap_bpf("BPF_PROG_DETACH", &self.path)
            {
                Ok(()) => detached.push((*id, fd)),
                Err(e) => {
                    result = Err(e);
                    break;
                }
            }
        }
        drop(attach_span);
        let result = result.and_then(|()| remove_cgroup_dir(&self.path));
        if result.is_err() {
            // Put back what we took away, so a refused destroy changes nothing.
            for (id, fd) in detached {
                if let Err(e) = sys::prog_attach(dir.as_fd(), fd.as_fd(), None) {
                    tracing::error!(prog_id = id, error = %e, "cannot re-attach the device program after a failed destroy");
                }
            }
        } else {
            tracing::info!(path = %self.path.display(), "removed v2 device cgroup");
        }
        result
    }

    /// Loads `program`, retrying with a verifier log when the kernel rejects it.
    fn load(&self, program: &DeviceProgram, bytes: &[u8]) -> Result<OwnedFd, CgroupError> {
        let rejected = match sys::prog_load_cgroup_device(bytes, LICENSE, PROGRAM_NAME_C, None) {
            Ok(fd) => return Ok(fd),
            Err(e) if matches!(e.raw_os_error(), Some(libc::EACCES | libc::EINVAL)) => e,
            Err(e) => {
                return Err(CgroupError::Bpf {
                    op: "BPF_PROG_LOAD",
                    path: self.path.clone(),
                    source: e,
                });
            }
        };
        let mut log = vec![0u8; LOG_SIZE];
        match sys::prog_load_cgroup_device(bytes, LICENSE, PROGRAM_NAME_C, Some(&mut log)) {
            Ok(fd) => {
                tracing::warn!(error = %rejected, "device program loaded only on the second attempt");
                Ok(fd)
            }
            Err(source) => {
                let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
                let log = String::from_utf8_lossy(&log[..end]).trim_end().to_owned();
                Err(CgroupError::Verifier {
                    path: self.path.clone(),
                    insns: program.len(),
                    log,
                    source,
                })
            }
        }
    }

    /// Closes the descriptors of the programs cached by allow list, for a caller with no
    /// container left, so that an idle process holds no program: the attached ones stay
    /// loaded (their cgroups hold them), the next list loaded runs the verifier again.
    pub fn forget_cached_programs() {
        PROGRAMS
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clear();
    }

    /// Opens the cgroup directory for `bpf(2)`.
    fn open_dir(&self) -> Result<File, CgroupError> {
        OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECTORY)
            .open(&self.path)
            .map_err(|source| {
                if source.kind() == std::io::ErrorKind::NotFound {
                    CgroupError::Missing {
                        container: self.container.clone(),
                        path: self.path.clone(),
                    }
                } else {
                    CgroupError::Read(IoError::new("read", &self.path, source))
                }
            })
    }

    /// Our programs attached directly to the cgroup, with an fd for each.
    fn our_programs(&self, dir: &File) -> Result<Vec<(u32, OwnedFd)>, CgroupError> {
        let mut ours = Vec::new();
        for id in sys::prog_query(dir.as_fd()).wrap_bpf("BPF_PROG_QUERY", &self.path)? {
            let fd = match sys::prog_get_fd_by_id(id) {
                Ok(fd) => fd,
                // Detached and freed since the query.
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => continue,
                Err(e) => {
                    return Err(CgroupError::Bpf {
                        op: "BPF_PROG_GET_FD_BY_ID",
                        path: self.path.clone(),
                        source: e,
                    });
                }
            };
            let info = sys::prog_info(fd.as_fd()).wrap_bpf("BPF_OBJ_GET_INFO_BY_FD", &self.path)?;
            if info.name == PROGRAM_NAME && info.prog_type == sys::BPF_PROG_TYPE_CGROUP_DEVICE {
                ours.push((id, fd));
            } else {
                tracing::debug!(prog_id = id, name = %info.name, "leaving a device program that is not ours");
            }
        }
        Ok(ours)
    }
}

/// How many loaded programs [`PROGRAMS`] keeps; past it, it starts over. A node has few
/// distinct allow lists (the base list with each set of GPUs a container holds).
const CACHED_PROGRAMS: usize = 64;

/// A loaded device program, its id and its length in instructions.
type Loaded = (OwnedFd, u32, usize);

/// Device programs loaded by this process, by the (normalized) allow list they enforce: a
/// cgroup whose list was loaded before gets the same program attached, without building it or
/// running the verifier again (issue 36). One program may be attached to many cgroups; each is
/// still swapped in with `BPF_F_REPLACE`, so a change stays atomic. The kept descriptors hold
/// the programs loaded (a few KiB of kernel memory each), are close-on-exec, and are closed by
/// [`V2DeviceCgroup::forget_cached_programs`] when the isolator has no container left.
static PROGRAMS: std::sync::Mutex<Vec<(Vec<DeviceRule>, Loaded)>> =
    std::sync::Mutex::new(Vec::new());

/// A duplicate of the cached program enforcing `rules` (normalized), if one is cached.
fn cached_program(rules: &[DeviceRule]) -> Option<Loaded> {
    let cache = PROGRAMS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let (_, (fd, id, insns)) = cache.iter().find(|(r, _)| r == rules)?;
    // A failed dup only costs a fresh load.
    let fd = fd.try_clone().ok()?;
    Some((fd, *id, *insns))
}

/// Keeps a duplicate of `prog` (enforcing `rules`) for later cgroups with the same list.
fn cache_program(rules: &[DeviceRule], prog: &OwnedFd, id: u32, insns: usize) {
    let Ok(fd) = prog.try_clone() else {
        return;
    };
    let mut cache = PROGRAMS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if cache.len() >= CACHED_PROGRAMS {
        cache.clear();
    }
    cache.push((rules.to_vec(), (fd, id, insns)));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cgroup::Hierarchy;

    #[test]
    fn program_name_fits_the_kernel() {
        assert_eq!(PROGRAM_NAME_C.to_str(), Ok(PROGRAM_NAME));
        assert!(PROGRAM_NAME.len() < 16);
        assert!(
            PROGRAM_NAME
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_')
        );
    }

    #[test]
    fn refuses_a_v1_layout_and_missing_cgroups() {
        let id = ContainerId::new("c").expect("valid");
        let v1 = CgroupLayout::new(
            Hierarchy {
                version: CgroupVersion::V1,
                mount: "/nonexistent".into(),
            },
            "m",
        )
        .expect("valid");
        assert!(matches!(
            V2DeviceCgroup::create(&v1, &id, &[]),
            Err(CgroupError::WrongVersion { .. })
        ));
        let tmp = tempfile::tempdir().expect("tempdir");
        let v2 = CgroupLayout::v2_mesos(tmp.path());
        let err = V2DeviceCgroup::recover(&v2, &id, &[]).expect_err("missing");
        assert!(err.is_missing(), "{err:?}");
    }
}
