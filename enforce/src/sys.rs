//! Thin wrappers for the `bpf(2)` commands the cgroup v2 device isolation needs, and a spawn whose
//! child joins a cgroup before it execs ([`spawn_in_cgroup`]). This module is the only one of the
//! crate with `unsafe`.
//!
//! Facts relied on (include/uapi/linux/bpf.h, kernel/bpf/syscall.c, kernel/bpf/cgroup.c as of
//! Linux 6.18):
//! - `bpf(cmd, &attr, size)` copies `size` bytes of `union bpf_attr` and zero-fills the rest, so
//!   each command gets its own `#[repr(C)]` struct holding the union member's leading fields.
//! - Some commands *write back* into the caller's attr. `BPF_PROG_QUERY` on a cgroup writes
//!   `query.attach_flags`, `query.prog_cnt` and, since Linux 6.15, `query.revision` at offset 56,
//!   whatever `size` says; [`QueryAttr`] therefore spans all 64 bytes up to and including
//!   `revision`. `BPF_PROG_LOAD` writes `log_true_size` only when `size` covers it (ours does not).
//!   `BPF_OBJ_GET_INFO_BY_FD` writes at most `info_len` bytes of `struct bpf_prog_info`.
//! - New fds come back with `O_CLOEXEC` set; errors are `-1` with `errno`.
//! - The verifier gives up with `EAGAIN` when a signal is pending for the loading thread; the
//!   load is then simply repeated (libbpf's `sys_bpf_prog_load` tries 5 times).
//! - Since Linux 5.11 BPF memory is charged to the memory cgroup, not `RLIMIT_MEMLOCK`, so no
//!   rlimit is raised here.
#![allow(unsafe_code)]

use std::ffi::CStr;
use std::io;
use std::mem::size_of;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt as _;
use std::process::{Child, Command};

// enum bpf_cmd
const BPF_PROG_LOAD: libc::c_int = 5;
const BPF_PROG_ATTACH: libc::c_int = 8;
const BPF_PROG_DETACH: libc::c_int = 9;
const BPF_PROG_GET_FD_BY_ID: libc::c_int = 13;
const BPF_OBJ_GET_INFO_BY_FD: libc::c_int = 15;
const BPF_PROG_QUERY: libc::c_int = 16;

/// `BPF_PROG_TYPE_CGROUP_DEVICE` (enum bpf_prog_type).
pub(crate) const BPF_PROG_TYPE_CGROUP_DEVICE: u32 = 15;
/// `BPF_CGROUP_DEVICE` (enum bpf_attach_type).
const BPF_CGROUP_DEVICE: u32 = 6;
/// Several programs may be attached to one cgroup; all of them must allow an access.
const BPF_F_ALLOW_MULTI: u32 = 1 << 1;
/// Atomically swap `replace_bpf_fd` for the new program (needs `BPF_F_ALLOW_MULTI`).
const BPF_F_REPLACE: u32 = 1 << 2;
/// How often `BPF_PROG_LOAD` is tried while it fails with `EAGAIN`, as libbpf does.
const PROG_LOAD_ATTEMPTS: u32 = 5;
/// Maximum length of `prog_name`, including the terminating NUL (`BPF_OBJ_NAME_LEN`).
const BPF_OBJ_NAME_LEN: usize = 16;

/// `union bpf_attr` for `BPF_PROG_LOAD`, up to `expected_attach_type`.
#[repr(C)]
#[derive(Default)]
struct ProgLoadAttr {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    kern_version: u32,
    prog_flags: u32,
    prog_name: [u8; BPF_OBJ_NAME_LEN],
    prog_ifindex: u32,
    expected_attach_type: u32,
}

/// `union bpf_attr` for `BPF_PROG_ATTACH` and `BPF_PROG_DETACH`, up to `expected_revision`.
#[repr(C)]
#[derive(Default)]
struct AttachAttr {
    target_fd: u32,
    attach_bpf_fd: u32,
    attach_type: u32,
    attach_flags: u32,
    replace_bpf_fd: u32,
    relative_fd: u32,
    expected_revision: u64,
}

/// `union bpf_attr` for `BPF_PROG_QUERY`, up to `revision` (see the module docs).
#[repr(C)]
#[derive(Default)]
struct QueryAttr {
    target_fd: u32,
    attach_type: u32,
    query_flags: u32,
    attach_flags: u32,
    prog_ids: u64,
    prog_cnt: u32,
    _pad: u32,
    prog_attach_flags: u64,
    link_ids: u64,
    link_attach_flags: u64,
    revision: u64,
}

/// `union bpf_attr` for `BPF_PROG_GET_FD_BY_ID`.
#[repr(C)]
#[derive(Default)]
struct GetFdByIdAttr {
    prog_id: u32,
    next_id: u32,
    open_flags: u32,
}

/// `union bpf_attr` for `BPF_OBJ_GET_INFO_BY_FD`.
#[repr(C)]
#[derive(Default)]
struct InfoAttr {
    bpf_fd: u32,
    info_len: u32,
    info: u64,
}

/// `struct bpf_prog_info` up to `name`.
#[repr(C)]
#[derive(Default)]
struct ProgInfoRaw {
    prog_type: u32,
    id: u32,
    tag: [u8; 8],
    jited_prog_len: u32,
    xlated_prog_len: u32,
    jited_prog_insns: u64,
    xlated_prog_insns: u64,
    load_time: u64,
    created_by_uid: u32,
    nr_map_ids: u32,
    map_ids: u64,
    name: [u8; BPF_OBJ_NAME_LEN],
}

/// What the kernel says about a loaded program.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ProgInfo {
    /// The program's id, unique while it is loaded.
    pub(crate) id: u32,
    /// `enum bpf_prog_type`.
    pub(crate) prog_type: u32,
    /// The name given at load time.
    pub(crate) name: String,
}

/// Calls `bpf(cmd, attr, size_of::<T>())`.
///
/// # Safety
/// `T` must be one of this module's `#[repr(C)]` attr structs, laid out as the leading fields
/// of `union bpf_attr` for `cmd` and covering every field the kernel writes back for `cmd`;
/// every pointer stored in `attr` must be null or valid, for the access the kernel makes, for
/// the length stored next to it, until this call returns.
unsafe fn bpf<T>(cmd: libc::c_int, attr: &mut T) -> io::Result<libc::c_long> {
    let size = libc::c_uint::try_from(size_of::<T>()).map_err(io::Error::other)?;
    // SAFETY: `attr` is a live, exclusive borrow of `size` bytes, so the kernel may read and
    // write all of them; the caller guarantees the layout and the embedded pointers. The
    // syscall touches no other memory of ours.
    let rc = unsafe { libc::syscall(libc::SYS_bpf, cmd, std::ptr::from_mut(attr), size) };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

/// Takes ownership of the fd a successful `bpf` call returned.
///
/// # Safety
/// `rc` must be the return value of a `bpf` command that returns a new file descriptor.
unsafe fn owned_fd(rc: libc::c_long) -> io::Result<OwnedFd> {
    let fd = RawFd::try_from(rc).map_err(io::Error::other)?;
    // SAFETY: the kernel just installed `fd` for us and nothing else refers to it, so the
    // `OwnedFd` is its only owner and closes it exactly once.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The u32 form of a borrowed fd, as `bpf_attr` carries it.
fn fd_u32(fd: BorrowedFd<'_>) -> u32 {
    fd.as_raw_fd().cast_unsigned()
}

/// Loads a `BPF_PROG_TYPE_CGROUP_DEVICE` program from `insns` (8-byte `struct bpf_insn`s in host
/// order). With `log`, the verifier writes its log there (level 1), NUL-terminated.
pub(crate) fn prog_load_cgroup_device(
    insns: &[u8],
    license: &CStr,
    name: &CStr,
    log: Option<&mut [u8]>,
) -> io::Result<OwnedFd> {
    if !insns.len().is_multiple_of(8) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "program length is not a multiple of 8",
        ));
    }
    let name = name.to_bytes_with_nul();
    let mut prog_name = [0u8; BPF_OBJ_NAME_LEN];
    prog_name
        .get_mut(..name.len())
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                "program name longer than 15 bytes",
            )
        })?
        .copy_from_slice(name);
    let (log_level, log_size, log_buf) = match log {
        Some(buf) => (
            1,
            u32::try_from(buf.len()).unwrap_or(u32::MAX),
            buf.as_mut_ptr() as u64,
        ),
        None => (0, 0, 0),
    };
    let mut attr = ProgLoadAttr {
        prog_type: BPF_PROG_TYPE_CGROUP_DEVICE,
        insn_cnt: u32::try_from(insns.len() / 8).map_err(io::Error::other)?,
        insns: insns.as_ptr() as u64,
        license: license.as_ptr() as u64,
        log_level,
        log_size,
        log_buf,
        prog_name,
        expected_attach_type: BPF_CGROUP_DEVICE,
        ..ProgLoadAttr::default()
    };
    let mut attempts = PROG_LOAD_ATTEMPTS;
    loop {
        // SAFETY: `ProgLoadAttr` is the prog-load member of `union bpf_attr`. `insns` points to
        // `insn_cnt * 8` readable bytes, `license` to a NUL-terminated string, and `log_buf`
        // (when set) to `log_size` writable bytes; all are borrowed for the whole call.
        match unsafe { bpf(BPF_PROG_LOAD, &mut attr) } {
            // SAFETY: BPF_PROG_LOAD returns a new program fd.
            Ok(rc) => return unsafe { owned_fd(rc) },
            Err(e) if e.raw_os_error() == Some(libc::EAGAIN) && attempts > 1 => attempts -= 1,
            Err(e) => return Err(e),
        }
    }
}

/// Attaches `prog` to the cgroup `cgroup` as a device program with `BPF_F_ALLOW_MULTI`; with
/// `replace`, atomically in place of that attached program (`BPF_F_REPLACE`).
pub(crate) fn prog_attach(
    cgroup: BorrowedFd<'_>,
    prog: BorrowedFd<'_>,
    replace: Option<BorrowedFd<'_>>,
) -> io::Result<()> {
    let mut attr = AttachAttr {
        target_fd: fd_u32(cgroup),
        attach_bpf_fd: fd_u32(prog),
        attach_type: BPF_CGROUP_DEVICE,
        attach_flags: BPF_F_ALLOW_MULTI | replace.map_or(0, |_| BPF_F_REPLACE),
        replace_bpf_fd: replace.map_or(0, fd_u32),
        ..AttachAttr::default()
    };
    // SAFETY: `AttachAttr` is the attach member of `union bpf_attr` and holds no pointers; the
    // fds are borrowed, so they stay open for the call.
    unsafe { bpf(BPF_PROG_ATTACH, &mut attr) }.map(drop)
}

/// Detaches the device program `prog` from the cgroup `cgroup`.
pub(crate) fn prog_detach(cgroup: BorrowedFd<'_>, prog: BorrowedFd<'_>) -> io::Result<()> {
    let mut attr = AttachAttr {
        target_fd: fd_u32(cgroup),
        attach_bpf_fd: fd_u32(prog),
        attach_type: BPF_CGROUP_DEVICE,
        ..AttachAttr::default()
    };
    // SAFETY: `AttachAttr` is also the detach member of `union bpf_attr` and holds no pointers;
    // the fds are borrowed, so they stay open for the call.
    unsafe { bpf(BPF_PROG_DETACH, &mut attr) }.map(drop)
}

/// The ids of the device programs attached directly to the cgroup `cgroup` (not inherited).
pub(crate) fn prog_query(cgroup: BorrowedFd<'_>) -> io::Result<Vec<u32>> {
    let mut ids = vec![0u32; 8];
    loop {
        let mut attr = QueryAttr {
            target_fd: fd_u32(cgroup),
            attach_type: BPF_CGROUP_DEVICE,
            prog_ids: ids.as_mut_ptr() as u64,
            prog_cnt: u32::try_from(ids.len()).map_err(io::Error::other)?,
            ..QueryAttr::default()
        };
        // SAFETY: `QueryAttr` is the query member of `union bpf_attr` up to `revision`, so it
        // covers every field the kernel writes back; `prog_ids` points to `prog_cnt` writable
        // u32s borrowed for the call; the other pointers are null.
        match unsafe { bpf(BPF_PROG_QUERY, &mut attr) } {
            Ok(_) => {
                ids.truncate(usize::try_from(attr.prog_cnt).map_err(io::Error::other)?);
                return Ok(ids);
            }
            // More programs than room: the kernel reported how many there are.
            Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => {
                let needed = usize::try_from(attr.prog_cnt).map_err(io::Error::other)?;
                ids = vec![0; needed.max(ids.len() * 2)];
            }
            Err(e) => return Err(e),
        }
    }
}

/// Opens a new fd for the loaded program with id `id`.
pub(crate) fn prog_get_fd_by_id(id: u32) -> io::Result<OwnedFd> {
    let mut attr = GetFdByIdAttr {
        prog_id: id,
        ..GetFdByIdAttr::default()
    };
    // SAFETY: `GetFdByIdAttr` is the get-fd-by-id member of `union bpf_attr` and holds no
    // pointers.
    let rc = unsafe { bpf(BPF_PROG_GET_FD_BY_ID, &mut attr)? };
    // SAFETY: BPF_PROG_GET_FD_BY_ID returns a new program fd.
    unsafe { owned_fd(rc) }
}

/// The id, type and name of the loaded program `prog`.
pub(crate) fn prog_info(prog: BorrowedFd<'_>) -> io::Result<ProgInfo> {
    let mut info = ProgInfoRaw::default();
    let mut attr = InfoAttr {
        bpf_fd: fd_u32(prog),
        info_len: u32::try_from(size_of::<ProgInfoRaw>()).map_err(io::Error::other)?,
        info: std::ptr::from_mut(&mut info) as u64,
    };
    // SAFETY: `InfoAttr` is the info member of `union bpf_attr`; `info` points to `info_len`
    // writable bytes of a zeroed `struct bpf_prog_info` prefix, borrowed for the call, whose
    // zero lengths and null pointers ask the kernel for no instruction or map arrays.
    unsafe { bpf(BPF_OBJ_GET_INFO_BY_FD, &mut attr)? };
    let name_len = info
        .name
        .iter()
        .position(|&b| b == 0)
        .unwrap_or(BPF_OBJ_NAME_LEN);
    Ok(ProgInfo {
        id: info.id,
        prog_type: info.prog_type,
        name: String::from_utf8_lossy(&info.name[..name_len]).into_owned(),
    })
}

/// Spawns `command` so that the child is in the cgroup whose `cgroup.procs` is open (for
/// writing) as `procs` before it runs one instruction of its program: between fork and exec the
/// child writes `0` there, which the kernel reads as "the writing process"
/// (kernel/cgroup/cgroup.c `cgroup_procs_write_start`, on v1 and v2 alike). A write that fails
/// fails the spawn with its error. `procs` should be `O_CLOEXEC` (the child's copy closes at exec).
pub fn spawn_in_cgroup(command: &mut Command, procs: &OwnedFd) -> io::Result<Child> {
    let fd = procs.as_raw_fd();
    // SAFETY: the hook runs in the forked child before exec, where only async-signal-safe calls
    // are allowed: it makes one write(2) of a static byte to `fd` and reads errno. `fd` is open
    // in the child, a copy of the parent's, which `procs` keeps open until `spawn` returns.
    unsafe {
        command.pre_exec(move || {
            if libc::write(fd, b"0".as_ptr().cast(), 1) == 1 {
                Ok(())
            } else {
                Err(io::Error::last_os_error())
            }
        });
    }
    command.spawn()
}

/// Sends SIGKILL to process `pid`.
pub fn kill(pid: u32) -> io::Result<()> {
    let pid = libc::pid_t::try_from(pid)
        .ok()
        .filter(|&p| p > 0)
        .ok_or_else(|| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: kill(2) takes two integers and touches no memory of ours; `pid` is positive, so
    // it names one process, never a group or every process.
    if unsafe { libc::kill(pid, libc::SIGKILL) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::offset_of;

    #[test]
    fn attr_layouts_match_the_uapi() {
        assert_eq!(offset_of!(ProgLoadAttr, log_buf), 32);
        assert_eq!(offset_of!(ProgLoadAttr, prog_name), 48);
        assert_eq!(offset_of!(ProgLoadAttr, expected_attach_type), 68);
        assert_eq!(offset_of!(AttachAttr, replace_bpf_fd), 16);
        assert_eq!(offset_of!(AttachAttr, expected_revision), 24);
        assert_eq!(offset_of!(QueryAttr, prog_ids), 16);
        assert_eq!(offset_of!(QueryAttr, prog_cnt), 24);
        assert_eq!(offset_of!(QueryAttr, revision), 56);
        assert_eq!(size_of::<QueryAttr>(), 64);
        assert_eq!(offset_of!(ProgInfoRaw, created_by_uid), 48);
        assert_eq!(offset_of!(ProgInfoRaw, name), 64);
    }

    #[test]
    fn load_rejects_bad_arguments_before_the_syscall() {
        let err = prog_load_cgroup_device(&[0; 7], c"GPL", c"x", None).expect_err("odd length");
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
        let err = prog_load_cgroup_device(&[0; 8], c"GPL", c"sixteen_bytes___", None)
            .expect_err("long name");
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
    }
}
