//! The few CUDA driver API calls the GPU probe makes, through `libcuda.so.1` loaded at run time
//! (no CUDA toolkit is needed to build mesos-gpu, and a node without the library skips them).
//!
//! Prototypes from NVIDIA's `cuda.h` (CUDA 12/13; the versioned symbols are those the headers
//! map the plain names to since CUDA 3.2, and drivers keep exporting them):
//! `CUresult cuInit(unsigned int)`, `cuDriverGetVersion(int *)`, `cuDeviceGetCount(int *)`,
//! `cuDeviceGet(CUdevice *, int)`, `cuDeviceGetUuid_v2(CUuuid *, CUdevice)` (else
//! `cuDeviceGetUuid`), `cuDeviceGetPCIBusId(char *, int, CUdevice)`,
//! `cuCtxCreate_v2(CUcontext *, unsigned int, CUdevice)`, `cuCtxDestroy_v2(CUcontext)`,
//! `cuMemAlloc_v2(CUdeviceptr *, size_t)`, `cuMemFree_v2(CUdeviceptr)`,
//! `cuMemcpyHtoD_v2(CUdeviceptr, const void *, size_t)`,
//! `cuMemcpyDtoH_v2(void *, CUdeviceptr, size_t)`, `cuGetErrorName(CUresult, const char **)`.
//! `CUdevice` is an `int`, `CUdeviceptr` an `unsigned long long` on 64-bit hosts, `CUcontext` an
//! opaque pointer, `CUuuid` 16 bytes, and `CUDA_SUCCESS` is 0. A context made with
//! `cuCtxCreate` is current on the calling thread until destroyed.

use std::ffi::{CStr, OsStr, c_char, c_int, c_uint, c_void};
use std::fmt;

use libloading::Library;

type CuResult = c_int;
type CuDevice = c_int;
type CuDevicePtr = u64;
type CuContext = *mut c_void;

/// A CUDA call that did not return `CUDA_SUCCESS`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CudaError {
    /// The function called.
    pub call: &'static str,
    /// The `CUresult`, or -1 when the symbol is missing.
    pub code: c_int,
    /// `cuGetErrorName`'s name for it (`CUDA_ERROR_NO_DEVICE`), or why there is none.
    pub name: String,
}

impl fmt::Display for CudaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} returned {} ({})", self.call, self.name, self.code)
    }
}

/// The CUDA driver library, loaded.
pub struct Cuda {
    lib: Library,
}

impl fmt::Debug for Cuda {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cuda").finish_non_exhaustive()
    }
}

impl Cuda {
    /// Loads `name` (a path, or a file name the loader searches for, `libcuda.so.1`).
    pub fn load(name: &OsStr) -> Result<Cuda, libloading::Error> {
        // SAFETY: loading runs the library's initialisers. libcuda.so.1 is NVIDIA's driver
        // library (or a stand-in a test built), made to be dlopen'ed by any process; nothing of
        // ours is shared with its initialisers.
        let lib = unsafe { Library::new(name) }?;
        Ok(Cuda { lib })
    }

    /// The symbol `name` with C type `T`.
    ///
    /// # Safety
    /// `T` must be the function type `cuda.h` gives `name`.
    unsafe fn sym<T: Copy>(&self, name: &'static str) -> Result<T, CudaError> {
        let cname = format!("{name}\0");
        // SAFETY: the caller promises `T` is the symbol's C type; the copied function pointer
        // is only called while `self.lib` (which it borrows from) is loaded: every caller is a
        // method of `self` and returns before `self` can be dropped.
        unsafe { self.lib.get::<T>(cname.as_bytes()) }
            .map(|s| *s)
            .map_err(|e| CudaError {
                call: name,
                code: -1,
                name: format!("symbol missing: {e}"),
            })
    }

    fn check(&self, call: &'static str, rc: CuResult) -> Result<(), CudaError> {
        if rc == 0 {
            return Ok(());
        }
        Err(CudaError {
            call,
            code: rc,
            name: self.error_name(rc),
        })
    }

    fn error_name(&self, rc: CuResult) -> String {
        // SAFETY: the prototype is cuda.h's `CUresult cuGetErrorName(CUresult, const char **)`.
        let Ok(f) = (unsafe {
            self.sym::<unsafe extern "C" fn(CuResult, *mut *const c_char) -> CuResult>(
                "cuGetErrorName",
            )
        }) else {
            return "unknown".to_owned();
        };
        let mut text: *const c_char = std::ptr::null();
        // SAFETY: `text` is a live local the callee sets to a static string or leaves alone.
        let ok = unsafe { f(rc, &mut text) } == 0 && !text.is_null();
        if !ok {
            return "unknown".to_owned();
        }
        // SAFETY: on success cuGetErrorName points `text` at a static NUL-terminated string.
        unsafe { CStr::from_ptr(text) }
            .to_string_lossy()
            .into_owned()
    }

    /// `cuInit(0)`.
    pub fn init(&self) -> Result<(), CudaError> {
        // SAFETY: cuda.h's prototype.
        let f = unsafe { self.sym::<unsafe extern "C" fn(c_uint) -> CuResult>("cuInit")? };
        // SAFETY: no pointers passed.
        self.check("cuInit", unsafe { f(0) })
    }

    /// `cuDriverGetVersion`: `major * 1000 + minor * 10`.
    pub fn driver_version(&self) -> Result<i32, CudaError> {
        self.int_out("cuDriverGetVersion")
    }

    /// `cuDeviceGetCount`.
    pub fn device_count(&self) -> Result<i32, CudaError> {
        self.int_out("cuDeviceGetCount")
    }

    fn int_out(&self, name: &'static str) -> Result<c_int, CudaError> {
        // SAFETY: both callers name a `CUresult f(int *)` function.
        let f = unsafe { self.sym::<unsafe extern "C" fn(*mut c_int) -> CuResult>(name)? };
        let mut v: c_int = 0;
        // SAFETY: `v` is a live, aligned int the callee writes.
        self.check(name, unsafe { f(&mut v) })?;
        Ok(v)
    }

    /// `cuDeviceGet` of ordinal `ordinal`.
    pub fn device(&self, ordinal: i32) -> Result<i32, CudaError> {
        // SAFETY: cuda.h's prototype.
        let f = unsafe {
            self.sym::<unsafe extern "C" fn(*mut CuDevice, c_int) -> CuResult>("cuDeviceGet")?
        };
        let mut dev: CuDevice = 0;
        // SAFETY: `dev` is a live int the callee writes.
        self.check("cuDeviceGet", unsafe { f(&mut dev, ordinal) })?;
        Ok(dev)
    }

    /// `cuDeviceGetUuid_v2` (else `cuDeviceGetUuid`): the 16 bytes NVML prints as `GPU-…`.
    pub fn uuid(&self, dev: i32) -> Result<[u8; 16], CudaError> {
        type UuidFn = unsafe extern "C" fn(*mut [u8; 16], CuDevice) -> CuResult;
        // SAFETY: both symbols have cuda.h's prototype `CUresult f(CUuuid *, CUdevice)`, and
        // `CUuuid` is `struct { char bytes[16]; }`.
        let (name, f) = match unsafe { self.sym::<UuidFn>("cuDeviceGetUuid_v2") } {
            Ok(f) => ("cuDeviceGetUuid_v2", f),
            // SAFETY: as above.
            Err(_) => ("cuDeviceGetUuid", unsafe {
                self.sym::<UuidFn>("cuDeviceGetUuid")?
            }),
        };
        let mut bytes = [0u8; 16];
        // SAFETY: `bytes` is a live 16-byte buffer the callee fills.
        self.check(name, unsafe { f(&mut bytes, dev) })?;
        Ok(bytes)
    }

    /// `cuDeviceGetPCIBusId`: `0000:06:00.0`.
    pub fn pci_bus_id(&self, dev: i32) -> Result<String, CudaError> {
        // SAFETY: cuda.h's prototype.
        let f = unsafe {
            self.sym::<unsafe extern "C" fn(*mut c_char, c_int, CuDevice) -> CuResult>(
                "cuDeviceGetPCIBusId",
            )?
        };
        let mut buf = [0 as c_char; 32];
        // SAFETY: `buf` holds 32 bytes, the length passed; the callee NUL-terminates within it.
        self.check("cuDeviceGetPCIBusId", unsafe {
            f(buf.as_mut_ptr(), 32, dev)
        })?;
        // SAFETY: on success the buffer holds a NUL-terminated string (it was zeroed, and the
        // callee writes at most 31 bytes plus NUL).
        Ok(unsafe { CStr::from_ptr(buf.as_ptr()) }
            .to_string_lossy()
            .into_owned())
    }

    /// `cuCtxCreate_v2(…, 0, dev)` (else, on a library without it, `cuCtxCreate_v4(…, NULL, 0,
    /// dev)`, which CUDA 13's headers map `cuCtxCreate` to): a context current on this thread
    /// until dropped.
    pub fn context(&self, dev: i32) -> Result<Context<'_>, CudaError> {
        type V2 = unsafe extern "C" fn(*mut CuContext, c_uint, CuDevice) -> CuResult;
        type V4 = unsafe extern "C" fn(*mut CuContext, *mut c_void, c_uint, CuDevice) -> CuResult;
        let mut ctx: CuContext = std::ptr::null_mut();
        // SAFETY: cuda.h's prototypes of the two symbols.
        match unsafe { self.sym::<V2>("cuCtxCreate_v2") } {
            // SAFETY: `ctx` is a live pointer-sized local the callee writes.
            Ok(f) => self.check("cuCtxCreate_v2", unsafe { f(&mut ctx, 0, dev) })?,
            Err(_) => {
                // SAFETY: cuda.h's prototype.
                let f = unsafe { self.sym::<V4>("cuCtxCreate_v4")? };
                // SAFETY: `ctx` is a live local the callee writes; NULL parameters are
                // documented as "no extra parameters".
                self.check("cuCtxCreate_v4", unsafe {
                    f(&mut ctx, std::ptr::null_mut(), 0, dev)
                })?;
            }
        }
        Ok(Context { cuda: self, ctx })
    }
}

/// A CUDA context, destroyed on drop.
pub struct Context<'c> {
    cuda: &'c Cuda,
    ctx: CuContext,
}

impl Context<'_> {
    /// `cuMemAlloc_v2` of `bytes` in this (current) context; freed on drop.
    pub fn alloc(&self, bytes: usize) -> Result<DeviceBuffer<'_>, CudaError> {
        // SAFETY: cuda.h's prototype.
        let f = unsafe {
            self.cuda
                .sym::<unsafe extern "C" fn(*mut CuDevicePtr, usize) -> CuResult>("cuMemAlloc_v2")?
        };
        let mut ptr: CuDevicePtr = 0;
        let rc = {
            // SAFETY: `ptr` is a live u64 the callee writes; the context is current on this
            // thread.
            unsafe { f(&mut ptr, bytes) }
        };
        self.cuda.check("cuMemAlloc_v2", rc)?;
        Ok(DeviceBuffer {
            cuda: self.cuda,
            ptr,
            bytes,
        })
    }

    /// Destroys the context, reporting the outcome (drop ignores it).
    pub fn destroy(self) -> Result<(), CudaError> {
        let rc = self.destroy_raw();
        std::mem::forget(self);
        rc
    }

    fn destroy_raw(&self) -> Result<(), CudaError> {
        // SAFETY: cuda.h's prototype.
        let f = unsafe {
            self.cuda
                .sym::<unsafe extern "C" fn(CuContext) -> CuResult>("cuCtxDestroy_v2")?
        };
        // SAFETY: `self.ctx` was created by cuCtxCreate_v2 and is destroyed once (drop and
        // `destroy` are exclusive).
        self.cuda.check("cuCtxDestroy_v2", unsafe { f(self.ctx) })
    }
}

impl Drop for Context<'_> {
    fn drop(&mut self) {
        let _ = self.destroy_raw();
    }
}

/// Device memory, freed on drop.
pub struct DeviceBuffer<'c> {
    cuda: &'c Cuda,
    ptr: CuDevicePtr,
    bytes: usize,
}

impl DeviceBuffer<'_> {
    /// `cuMemcpyHtoD_v2` of `data` (at most the buffer's size) to the buffer's start.
    pub fn write(&self, data: &[u8]) -> Result<(), CudaError> {
        // SAFETY: cuda.h's prototype.
        let f = unsafe {
            self.cuda
                .sym::<unsafe extern "C" fn(CuDevicePtr, *const c_void, usize) -> CuResult>(
                    "cuMemcpyHtoD_v2",
                )?
        };
        let n = data.len().min(self.bytes);
        // SAFETY: `data` is readable for `n` bytes, and the device buffer holds `bytes >= n`.
        self.cuda.check("cuMemcpyHtoD_v2", unsafe {
            f(self.ptr, data.as_ptr().cast(), n)
        })
    }

    /// `cuMemcpyDtoH_v2` of the buffer's start into `out` (at most the buffer's size).
    pub fn read(&self, out: &mut [u8]) -> Result<(), CudaError> {
        // SAFETY: cuda.h's prototype.
        let f = unsafe {
            self.cuda
                .sym::<unsafe extern "C" fn(*mut c_void, CuDevicePtr, usize) -> CuResult>(
                    "cuMemcpyDtoH_v2",
                )?
        };
        let n = out.len().min(self.bytes);
        // SAFETY: `out` is writable for `n` bytes, and the device buffer holds `bytes >= n`.
        self.cuda.check("cuMemcpyDtoH_v2", unsafe {
            f(out.as_mut_ptr().cast(), self.ptr, n)
        })
    }

    /// Frees the buffer, reporting the outcome (drop ignores it).
    pub fn free(self) -> Result<(), CudaError> {
        let rc = self.free_raw();
        std::mem::forget(self);
        rc
    }

    fn free_raw(&self) -> Result<(), CudaError> {
        // SAFETY: cuda.h's prototype.
        let f = unsafe {
            self.cuda
                .sym::<unsafe extern "C" fn(CuDevicePtr) -> CuResult>("cuMemFree_v2")?
        };
        // SAFETY: `self.ptr` came from cuMemAlloc_v2 and is freed once (drop and `free` are
        // exclusive).
        self.cuda.check("cuMemFree_v2", unsafe { f(self.ptr) })
    }
}

impl Drop for DeviceBuffer<'_> {
    fn drop(&mut self) {
        let _ = self.free_raw();
    }
}
