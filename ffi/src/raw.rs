//! Raw pointers in, Rust values out: one checked conversion per pointer kind, the error text
//! writer, and the `guard` every exported function runs in.
//!
//! Rules (written for callers once, in `ffi/README.md`):
//! - input bytes `(ptr, len)`: `ptr` may be NULL only when `len` is 0;
//! - output buffers `(buf, cap, *len)`: `len` must not be NULL; `buf` may be NULL only when `cap`
//!   is 0 (a size query, answered `MGPU_BUFFER_TOO_SMALL` with `*len` = size needed unless the
//!   answer is empty);
//! - error text `(err, err_cap)`: `err` may be NULL (no text); at most `err_cap - 1` bytes of the
//!   flattened error chain, cut at a UTF-8 character boundary, then a NUL.

use std::any::Any;
use std::ffi::{CStr, c_char};
use std::panic::{self, AssertUnwindSafe};

use mesos_gpu_os::error_chain;
use prost::Message;

use crate::handle::MgpuIsolator;
use crate::required;
use crate::status::{FfiError, MgpuStatus};

/// Runs `f` and turns its result into a status, writing the error text on failure. A panic
/// becomes `MGPU_PANIC` instead of crossing into C (which would abort mesos-agent).
pub(crate) fn guard(
    err: *mut c_char,
    err_cap: usize,
    f: impl FnOnce() -> Result<(), FfiError>,
) -> MgpuStatus {
    // AssertUnwindSafe: a panic inside a handle call poisons the handle (`guard_handle`), so no
    // state a panic interrupted is used again; other calls hold no state across the unwind.
    match panic::catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => MgpuStatus::MgpuOk,
        Ok(Err(e)) => {
            // SAFETY: the exported function's contract makes `err` NULL or valid for `err_cap`
            // bytes of writes.
            unsafe { write_err(err, err_cap, &error_chain(&e)) };
            e.status()
        }
        Err(payload) => {
            let text = format!(
                "panic in the GPU isolator: {}",
                panic_text(payload.as_ref())
            );
            tracing::error!("{text}");
            // SAFETY: as above.
            unsafe { write_err(err, err_cap, &text) };
            MgpuStatus::MgpuPanic
        }
    }
}

/// [`guard`] for a call on a handle: NULL and poisoned handles are refused, and a panic poisons
/// the handle.
pub(crate) fn guard_handle(
    handle: *const MgpuIsolator,
    err: *mut c_char,
    err_cap: usize,
    f: impl FnOnce(&MgpuIsolator) -> Result<(), FfiError>,
) -> MgpuStatus {
    // SAFETY: the exported function's contract makes `handle` NULL or a live handle from
    // `mgpu_isolator_new`, not freed before this call returns.
    let Some(h) = (unsafe { handle.as_ref() }) else {
        return guard(err, err_cap, || Err(FfiError::Null { what: "handle" }));
    };
    if h.is_poisoned() {
        return guard(err, err_cap, || Err(FfiError::Poisoned));
    }
    let status = guard(err, err_cap, || f(h));
    if status == MgpuStatus::MgpuPanic {
        h.poison();
    }
    status
}

fn panic_text(payload: &(dyn Any + Send)) -> &str {
    payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("(no message)")
}

/// Writes `text` into `(err, err_cap)`, NUL-terminated, cut at a UTF-8 boundary.
///
/// # Safety
/// `err` is NULL or valid for writes of `err_cap` bytes.
pub(crate) unsafe fn write_err(err: *mut c_char, err_cap: usize, text: &str) {
    if err.is_null() || err_cap == 0 {
        return;
    }
    let mut n = text.len().min(err_cap - 1);
    while !text.is_char_boundary(n) {
        n -= 1;
    }
    // SAFETY: `err` is valid for `err_cap` bytes (contract) and `n + 1 <= err_cap`; `text` is a
    // separate Rust allocation, so the ranges do not overlap.
    unsafe {
        std::ptr::copy_nonoverlapping(text.as_ptr(), err.cast::<u8>(), n);
        *err.add(n) = 0;
    }
}

/// The input bytes `(ptr, len)`.
///
/// # Safety
/// `ptr` is NULL or valid for reads of `len` bytes, unchanged during the call.
pub(crate) unsafe fn in_bytes<'a>(
    ptr: *const u8,
    len: usize,
    what: &'static str,
) -> Result<&'a [u8], FfiError> {
    if len == 0 {
        return Ok(&[]);
    }
    if ptr.is_null() {
        return Err(FfiError::Null { what });
    }
    // SAFETY: non-NULL, and valid for `len` bytes of reads by the contract; `len > 0`.
    Ok(unsafe { std::slice::from_raw_parts(ptr, len) })
}

/// The NUL-terminated input string `ptr`, which must be UTF-8.
///
/// # Safety
/// `ptr` is NULL or points to a NUL-terminated string, unchanged during the call.
pub(crate) unsafe fn in_str<'a>(
    ptr: *const c_char,
    what: &'static str,
) -> Result<&'a str, FfiError> {
    if ptr.is_null() {
        return Err(FfiError::Null { what });
    }
    // SAFETY: non-NULL and NUL-terminated by the contract, not changed during the call.
    let text = unsafe { CStr::from_ptr(ptr) };
    text.to_str().map_err(|_| FfiError::NotUtf8 {
        what,
        got: text.to_string_lossy().into_owned(),
    })
}

/// Decodes the input bytes `(ptr, len)` as `M`.
///
/// # Safety
/// As [`in_bytes`].
pub(crate) unsafe fn decode<M: Message + Default>(
    ptr: *const u8,
    len: usize,
    what: &'static str,
) -> Result<M, FfiError> {
    // SAFETY: forwarded contract.
    let bytes = unsafe { in_bytes(ptr, len, what) }?;
    decode_checked(bytes, len, what, required::missing_required)
}

/// Decodes the input bytes `(ptr, len)` as `M`, a carrier whose own required fields are unset
/// on purpose (`SerializePartialToString`); the messages inside it must be complete.
///
/// # Safety
/// As [`in_bytes`].
pub(crate) unsafe fn decode_carrier<M: Message + Default>(
    ptr: *const u8,
    len: usize,
    what: &'static str,
) -> Result<M, FfiError> {
    // SAFETY: forwarded contract.
    let bytes = unsafe { in_bytes(ptr, len, what) }?;
    decode_checked(bytes, len, what, required::missing_required_inside)
}

fn decode_checked<M: Message + Default>(
    bytes: &[u8],
    len: usize,
    what: &'static str,
    check: fn(&str, &[u8]) -> Vec<String>,
) -> Result<M, FfiError> {
    let message = type_name::<M>();
    let decoded = M::decode(bytes).map_err(|source| FfiError::Decode {
        what,
        message,
        len,
        source,
    })?;
    let missing = check(message, bytes);
    if !missing.is_empty() {
        return Err(FfiError::MissingRequired {
            what,
            message,
            len,
            missing: missing.join(", "),
        });
    }
    Ok(decoded)
}

fn type_name<M>() -> &'static str {
    let full = std::any::type_name::<M>();
    let name = full.rsplit("::").next().unwrap_or(full);
    match name {
        "ContainerId" => "mesos.ContainerID",
        "ContainerConfig" => "mesos.slave.ContainerConfig",
        "ContainerRecoverInfo" => "mesos.slave.ContainerRecoverInfo",
        "Parameters" => "mesos.Parameters",
        "ImageManifest" => "docker.spec.v1.ImageManifest",
        other => other,
    }
}

/// A caller-owned output buffer `(buf, cap, *len)`, checked.
pub(crate) struct OutBuf {
    buf: *mut u8,
    cap: usize,
    len: *mut usize,
}

impl OutBuf {
    /// Checks the pointers; call before anything with side effects.
    ///
    /// # Safety
    /// `buf` is NULL or valid for writes of `cap` bytes; `len` is NULL or valid for one write;
    /// both stay valid until [`OutBuf::write`] returns.
    pub(crate) unsafe fn new(
        buf: *mut u8,
        cap: usize,
        len: *mut usize,
    ) -> Result<OutBuf, FfiError> {
        if len.is_null() {
            return Err(FfiError::Null { what: "len" });
        }
        if buf.is_null() && cap > 0 {
            return Err(FfiError::Null { what: "buf" });
        }
        Ok(OutBuf { buf, cap, len })
    }

    /// Copies `bytes` in and sets `*len`; when they do not fit, sets `*len` to their size and
    /// writes nothing else.
    pub(crate) fn write(&self, bytes: &[u8]) -> Result<(), FfiError> {
        // SAFETY: `len` is non-NULL and valid for a write (checked in `new`, contract).
        unsafe { *self.len = bytes.len() };
        if bytes.len() > self.cap {
            return Err(FfiError::BufferTooSmall {
                needed: bytes.len(),
                cap: self.cap,
            });
        }
        if !bytes.is_empty() {
            // SAFETY: `bytes.len() <= cap` and `cap > 0`, so `buf` is non-NULL and valid for
            // that many bytes (contract); `bytes` is a Rust allocation distinct from `buf`.
            unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.buf, bytes.len()) };
        }
        Ok(())
    }
}

/// The handle out-parameter, checked.
pub(crate) struct OutHandle(*mut *mut MgpuIsolator);

impl OutHandle {
    /// # Safety
    /// `ptr` is NULL or valid for one pointer write.
    pub(crate) unsafe fn new(ptr: *mut *mut MgpuIsolator) -> Result<OutHandle, FfiError> {
        if ptr.is_null() {
            return Err(FfiError::Null { what: "out_handle" });
        }
        Ok(OutHandle(ptr))
    }

    /// Stores `handle`, giving its ownership to the caller.
    pub(crate) fn set(self, handle: Box<MgpuIsolator>) {
        // SAFETY: non-NULL and valid for a write (checked in `new`, contract).
        unsafe { *self.0 = Box::into_raw(handle) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err_text(cap: usize, text: &str) -> Vec<u8> {
        let mut buf = vec![0x55u8; cap + 1];
        // SAFETY: `buf` holds `cap + 1` bytes.
        unsafe { write_err(buf.as_mut_ptr().cast(), cap, text) };
        buf
    }

    #[test]
    fn error_text_is_cut_at_a_char_boundary_and_terminated() {
        assert_eq!(err_text(0, "abc"), [0x55]);
        assert_eq!(err_text(1, "abc"), [0, 0x55]);
        assert_eq!(err_text(3, "abc"), [b'a', b'b', 0, 0x55]);
        // "é" is two bytes: with room for 2 bytes of text, only "a" fits whole.
        assert_eq!(err_text(3, "aé"), [b'a', 0, 0x55, 0x55]);
        assert_eq!(
            err_text(10, "aé"),
            [
                b'a', 0xc3, 0xa9, 0, 0x55, 0x55, 0x55, 0x55, 0x55, 0x55, 0x55
            ]
        );
    }

    #[test]
    fn output_buffer_reports_the_size_needed() {
        let mut buf = [0u8; 2];
        let mut len = 99usize;
        // SAFETY: both point at live locals.
        let out = unsafe { OutBuf::new(buf.as_mut_ptr(), buf.len(), &mut len) }
            .unwrap_or_else(|e| panic!("{e}"));
        let err = out.write(b"abc").err().map(|e| e.status());
        assert_eq!(
            (err, len, buf),
            (Some(MgpuStatus::MgpuBufferTooSmall), 3, [0, 0])
        );
        assert!(out.write(b"ab").is_ok());
        assert_eq!((len, buf), (2, *b"ab"));
    }

    #[test]
    fn null_pointers_are_named() {
        // SAFETY: NULL is allowed by the contracts and refused before use.
        let e = unsafe { OutBuf::new(std::ptr::null_mut(), 4, &mut 0) }
            .err()
            .map(|e| e.to_string());
        assert_eq!(e.as_deref(), Some("argument `buf` is NULL"));
        // SAFETY: as above.
        let e = unsafe { in_bytes(std::ptr::null(), 1, "config") }
            .err()
            .map(|e| e.to_string());
        assert_eq!(e.as_deref(), Some("argument `config` is NULL"));
        // SAFETY: len 0 never reads.
        assert!(unsafe { in_bytes(std::ptr::null(), 0, "config") }.is_ok_and(<[u8]>::is_empty));
        // SAFETY: NULL is refused before use.
        let e = unsafe { in_str(std::ptr::null(), "gpu") }
            .err()
            .map(|e| e.to_string());
        assert_eq!(e.as_deref(), Some("argument `gpu` is NULL"));
    }

    #[test]
    fn strings_must_be_utf8() {
        // SAFETY: C-string literals are NUL-terminated and static.
        let ok = unsafe { in_str(c"GPU-1".as_ptr(), "gpu") }.ok();
        assert_eq!(ok, Some("GPU-1"));
        // SAFETY: as above.
        let e = unsafe { in_str(c"a\xffb".as_ptr(), "gpu") }
            .err()
            .map(|e| e.to_string());
        assert_eq!(
            e.as_deref(),
            Some("argument `gpu` is not UTF-8: \"a\u{fffd}b\"")
        );
    }

    #[test]
    fn panics_become_a_status() {
        let mut err = [0u8; 64];
        let status = guard(err.as_mut_ptr().cast(), err.len(), || panic!("boom"));
        assert_eq!(status, MgpuStatus::MgpuPanic);
        assert!(err.starts_with(b"panic in the GPU isolator: boom\0"));
    }
}
