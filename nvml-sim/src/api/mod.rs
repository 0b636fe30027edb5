//! The exported NVML C functions, grouped by area, and the checks every one of them shares.
//!
//! Every entry point runs inside `guard`, which turns a panic into `NVML_ERROR_UNKNOWN`
//! instead of letting it unwind into C (since Rust 1.81 that would abort the client process).
//! Checks run in the order NVML's documentation lists the errors: `UNINITIALIZED`, then
//! `INVALID_ARGUMENT` (handle not issued by this instance, NULL out-pointer), then
//! `GPU_IS_LOST`, then an injected failure, then a random one (`random_failures`), then the
//! call itself (`NOT_SUPPORTED` when the node description leaves the value out).

pub mod compute;
pub mod device;
pub mod event;
pub mod mig;
pub mod recovery;
pub mod system;
pub mod telemetry;
pub mod topology;

use std::ffi::{CStr, c_char, c_uint};
use std::panic::{self, AssertUnwindSafe};

use crate::abi::NvmlDevice;
use crate::state::{self, Dev, Sim};
use crate::status::{NvmlError, NvmlReturn, to_return};

/// Runs an entry point's body, mapping its outcome (or a panic) to an `nvmlReturn_t`.
pub(crate) fn guard(body: impl FnOnce() -> Result<(), NvmlError>) -> NvmlReturn {
    // AssertUnwindSafe: the only state shared across calls is behind the registry mutex, whose
    // poisoning `state::lock` deliberately ignores (see there).
    match panic::catch_unwind(AssertUnwindSafe(body)) {
        Ok(result) => to_return(result),
        Err(_) => NvmlError::Unknown.code(),
    }
}

/// Runs `query` on an initialised sim after the system-level checks for `function`.
pub(crate) fn system_call<T>(
    function: &str,
    args_ok: bool,
    query: impl FnOnce(&mut Sim) -> Result<T, NvmlError>,
) -> Result<T, NvmlError> {
    let mut reg = state::lock();
    let sim = reg.sim()?;
    sim.poll_events();
    if !args_ok {
        return Err(NvmlError::InvalidArgument);
    }
    sim.system_usable(function)?;
    reg.random_failure()?;
    query(reg.sim()?)
}

/// Runs `query` for the GPU `device` names, after the shared checks for `function`. A MIG device
/// handle passes the checks of its parent and then answers `NOT_SUPPORTED`: the call is one
/// of those NVML serves for whole GPUs only.
pub(crate) fn device_call<T>(
    function: &str,
    device: NvmlDevice,
    args_ok: bool,
    query: impl FnOnce(&mut Sim, usize) -> Result<T, NvmlError>,
) -> Result<T, NvmlError> {
    any_device_call(function, device, args_ok, |sim, dev| match dev {
        Dev::Gpu(index) => query(sim, index),
        Dev::Mig { .. } => Err(NvmlError::NotSupported),
    })
}

/// Runs `query` for the GPU or MIG device `device` names, after the shared checks for
/// `function` (a MIG device is lost or failing when its parent is).
pub(crate) fn any_device_call<T>(
    function: &str,
    device: NvmlDevice,
    args_ok: bool,
    query: impl FnOnce(&mut Sim, Dev) -> Result<T, NvmlError>,
) -> Result<T, NvmlError> {
    let mut reg = state::lock();
    let sim = reg.sim()?;
    sim.poll_events();
    let dev = sim.resolve_any(device)?;
    if !args_ok {
        return Err(NvmlError::InvalidArgument);
    }
    sim.usable(dev.gpu(), function)?;
    reg.random_failure()?;
    query(reg.sim()?, dev)
}

/// The body of a device query answering two values (current and pending, major and minor):
/// both pointers must be non-NULL, and both are written only on success.
///
/// # Safety
/// `first` and `second` are each NULL or writable for one value of their type.
pub(crate) unsafe fn device_pair<A, B>(
    function: &str,
    device: NvmlDevice,
    first: *mut A,
    second: *mut B,
    query: impl FnOnce(&mut Sim, usize) -> Result<(A, B), NvmlError>,
) -> NvmlReturn {
    guard(|| {
        // SAFETY: this function's contract.
        let (first, second) = unsafe { (Out::new(first), Out::new(second)) };
        let (a, b) = device_call(function, device, first.ok() && second.ok(), query)?;
        first.put(a)?;
        second.put(b)
    })
}

/// A C out-parameter: NULL or writable.
pub(crate) struct Out<T>(*mut T);

impl<T> Out<T> {
    /// Wraps `ptr`.
    ///
    /// # Safety
    /// `ptr` is NULL or valid and aligned for writing one `T` until the exported call returns.
    pub(crate) unsafe fn new(ptr: *mut T) -> Out<T> {
        Out(ptr)
    }

    /// True when a value can be written.
    pub(crate) fn ok(&self) -> bool {
        !self.0.is_null()
    }

    /// Writes the value; `INVALID_ARGUMENT` for NULL.
    pub(crate) fn put(&self, value: T) -> Result<(), NvmlError> {
        if self.0.is_null() {
            return Err(NvmlError::InvalidArgument);
        }
        // SAFETY: non-null, and `Out::new`'s caller promised it is valid and aligned for one T.
        unsafe { self.0.write(value) };
        Ok(())
    }
}

/// A C array out-parameter of `len` elements: NULL or writable.
pub(crate) struct OutArray<T> {
    ptr: *mut T,
    len: usize,
}

impl<T: Copy> OutArray<T> {
    /// Wraps `ptr[..len]`.
    ///
    /// # Safety
    /// `ptr` is NULL or valid and aligned for writing `len` consecutive `T`s until the exported
    /// call returns.
    pub(crate) unsafe fn new(ptr: *mut T, len: c_uint) -> OutArray<T> {
        OutArray {
            ptr,
            len: len as usize,
        }
    }

    /// True when the pointer is non-null.
    pub(crate) fn ok(&self) -> bool {
        !self.ptr.is_null()
    }

    /// Writes `values` from the start (cut to fit), then `pad` into every remaining element;
    /// `INVALID_ARGUMENT` for NULL unless the array is empty.
    pub(crate) fn put_padded(&self, values: &[T], pad: T) -> Result<(), NvmlError> {
        if self.len == 0 {
            return Ok(());
        }
        if self.ptr.is_null() {
            return Err(NvmlError::InvalidArgument);
        }
        let values = &values[..values.len().min(self.len)];
        self.put(values)?;
        for i in values.len()..self.len {
            // SAFETY: `ptr` is non-null (checked above), `i < len`, and `OutArray::new`'s caller
            // promised `len` writable elements.
            unsafe { self.ptr.add(i).write(pad) };
        }
        Ok(())
    }

    /// Writes `values` from the start; `INVALID_ARGUMENT` for NULL (unless nothing is written),
    /// `INSUFFICIENT_SIZE` when they do not fit.
    pub(crate) fn put(&self, values: &[T]) -> Result<(), NvmlError> {
        if values.len() > self.len {
            return Err(NvmlError::InsufficientSize);
        }
        if values.is_empty() {
            return Ok(());
        }
        if self.ptr.is_null() {
            return Err(NvmlError::InvalidArgument);
        }
        // SAFETY: non-null, `values.len() <= self.len`, and `OutArray::new`'s caller promised
        // `len` writable elements; `values` is our own memory, so the two cannot overlap.
        unsafe {
            self.ptr
                .copy_from_nonoverlapping(values.as_ptr(), values.len())
        };
        Ok(())
    }
}

/// A C string buffer (`char *buf, unsigned int length`): NULL or writable.
pub(crate) struct OutStr(OutArray<c_char>);

impl OutStr {
    /// Wraps `buf[..length]`.
    ///
    /// # Safety
    /// `buf` is NULL or valid for writing `length` bytes until the exported call returns.
    pub(crate) unsafe fn new(buf: *mut c_char, length: c_uint) -> OutStr {
        // SAFETY: forwarded from this function's own contract.
        OutStr(unsafe { OutArray::new(buf, length) })
    }

    /// True when the pointer is non-null.
    pub(crate) fn ok(&self) -> bool {
        self.0.ok()
    }

    /// Writes `text` and a NUL; `INSUFFICIENT_SIZE` when `length` cannot hold both.
    pub(crate) fn put(&self, text: &str) -> Result<(), NvmlError> {
        let bytes: Vec<c_char> = text.bytes().chain([0]).map(|b| b as c_char).collect();
        self.0.put(&bytes)
    }
}

/// Reads a C string argument; `None` for NULL or text that is not UTF-8.
///
/// # Safety
/// `ptr` is NULL or points to a NUL-terminated string valid until the exported call returns.
pub(crate) unsafe fn in_str<'a>(ptr: *const c_char) -> Option<&'a str> {
    if ptr.is_null() {
        return None;
    }
    // SAFETY: non-null and NUL-terminated per this function's contract.
    unsafe { CStr::from_ptr(ptr) }.to_str().ok()
}

/// Copies `text` into a fixed C char array, NUL-terminated and cut to fit.
pub(crate) fn fill_chars<const N: usize>(text: &str) -> [c_char; N] {
    let mut out = [0 as c_char; N];
    for (slot, byte) in out.iter_mut().zip(text.bytes().take(N - 1)) {
        *slot = byte as c_char;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::failable::{DEVICE_FUNCTIONS, SYSTEM_FUNCTIONS};

    #[test]
    fn every_listed_function_is_exported() {
        let sources = [
            include_str!("compute.rs"),
            include_str!("mig.rs"),
            include_str!("device.rs"),
            include_str!("event.rs"),
            include_str!("system.rs"),
            include_str!("recovery.rs"),
            include_str!("telemetry.rs"),
            include_str!("topology.rs"),
        ]
        .concat();
        for name in SYSTEM_FUNCTIONS.iter().chain(DEVICE_FUNCTIONS) {
            let decl = format!("pub unsafe extern \"C\" fn {name}(");
            assert!(sources.contains(&decl), "{name} is listed but not exported");
        }
    }

    #[test]
    fn string_buffers() {
        let mut buf = [1 as c_char; 6];
        // SAFETY: `buf` is a live local array of 6 bytes.
        let out = unsafe { OutStr::new(buf.as_mut_ptr(), 6) };
        assert_eq!(out.put("hello!"), Err(NvmlError::InsufficientSize));
        assert_eq!(out.put("hello"), Ok(()));
        assert_eq!(buf.map(|c| c as u8), *b"hello\0");
        // SAFETY: NULL is allowed.
        let null = unsafe { OutStr::new(std::ptr::null_mut(), 80) };
        assert_eq!(null.put("x"), Err(NvmlError::InvalidArgument));
        assert_eq!(fill_chars::<4>("abcdef").map(|c| c as u8), *b"abc\0");
    }

    #[test]
    fn padded_arrays() {
        let mut buf = [7u64; 4];
        // SAFETY: `buf` is a live local array of 4 elements.
        let out = unsafe { OutArray::new(buf.as_mut_ptr(), 4) };
        assert_eq!(out.put_padded(&[1, 2], 0), Ok(()));
        assert_eq!(buf, [1, 2, 0, 0]);
        assert_eq!(out.put_padded(&[9; 6], 0), Ok(()), "cut to fit");
        assert_eq!(buf, [9; 4]);
        // SAFETY: NULL is allowed.
        let null = unsafe { OutArray::<u64>::new(std::ptr::null_mut(), 3) };
        assert_eq!(null.put_padded(&[], 0), Err(NvmlError::InvalidArgument));
    }

    #[test]
    fn guard_turns_panics_into_unknown() {
        assert_eq!(guard(|| panic!("boom")), 999);
        assert_eq!(guard(|| Err(NvmlError::NotFound)), 6);
        assert_eq!(guard(|| Ok(())), 0);
    }
}
