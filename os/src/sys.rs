//! The one raw system call this crate makes that std does not wrap.
#![allow(unsafe_code)]

/// The process's effective user id (`geteuid(2)`): the owner of what it creates.
pub(crate) fn geteuid() -> u32 {
    // SAFETY: geteuid takes no arguments, reads no memory of ours and cannot fail (geteuid(2):
    // "These functions are always successful").
    unsafe { libc::geteuid() }
}
