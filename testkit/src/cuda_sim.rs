//! A stand-in `libcuda.so.1` for tests, built with `cc`: the CUDA driver calls the GPU probe
//! makes (`cuInit`, `cuDriverGetVersion`, `cuDeviceGetCount`, `cuDeviceGet`,
//! `cuDeviceGetUuid_v2`, `cuDeviceGetPCIBusId`, `cuCtxCreate_v2`, `cuCtxDestroy_v2`,
//! `cuMemAlloc_v2`, `cuMemFree_v2`, `cuMemcpyHtoD_v2`, `cuMemcpyDtoH_v2`, `cuGetErrorName`),
//! with `cuda.h`'s prototypes and result codes. It sees one device: the GPU whose UUID
//! `CUDA_VISIBLE_DEVICES` names (none otherwise), with host memory behind `cuMemAlloc`. While
//! the file [`FakeCuda::fail_path`] exists, `cuMemAlloc_v2` fails with
//! `CUDA_ERROR_ECC_UNCORRECTABLE` (214), as a GPU with bad memory would.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use tempfile::TempDir;

const CUDA_C: &str = r#"
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef void *CUcontext;

static int inited;

static int hexval(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

/* The UUID of the one visible device: CUDA_VISIBLE_DEVICES=GPU-xxxxxxxx-xxxx-... */
static int visible(unsigned char out[16]) {
  const char *v = getenv("CUDA_VISIBLE_DEVICES");
  if (!v || strncmp(v, "GPU-", 4) != 0) return 0;
  int n = 0, hi = -1;
  for (const char *p = v + 4; *p && *p != ',' && n < 16; p++) {
    if (*p == '-') continue;
    int h = hexval(*p);
    if (h < 0) return 0;
    if (hi < 0) { hi = h; } else { out[n++] = (unsigned char)(hi << 4 | h); hi = -1; }
  }
  return n == 16;
}

CUresult cuInit(unsigned int flags) { (void)flags; inited = 1; return 0; }
CUresult cuDriverGetVersion(int *v) { *v = 12040; return 0; }
CUresult cuDeviceGetCount(int *n) {
  unsigned char u[16];
  if (!inited) return 3;
  *n = visible(u);
  return 0;
}
CUresult cuDeviceGet(CUdevice *d, int ordinal) {
  int n;
  if (cuDeviceGetCount(&n)) return 3;
  if (ordinal < 0 || ordinal >= n) return 101;
  *d = ordinal;
  return 0;
}
CUresult cuDeviceGetUuid_v2(unsigned char *u, CUdevice d) { (void)d; return visible(u) ? 0 : 101; }
CUresult cuDeviceGetPCIBusId(char *b, int len, CUdevice d) { (void)d; snprintf(b, len, "0000:00:00.0"); return 0; }
CUresult cuCtxCreate_v2(CUcontext *c, unsigned int f, CUdevice d) { (void)f; (void)d; *c = malloc(1); return 0; }
CUresult cuCtxDestroy_v2(CUcontext c) { free(c); return 0; }
CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n) {
  if (access(FAIL_FILE, F_OK) == 0) return 214;
  void *m = malloc(n);
  if (!m) return 2;
  *p = (CUdeviceptr)(uintptr_t)m;
  return 0;
}
CUresult cuMemFree_v2(CUdeviceptr p) { free((void *)(uintptr_t)p); return 0; }
CUresult cuMemcpyHtoD_v2(CUdeviceptr d, const void *s, size_t n) { memcpy((void *)(uintptr_t)d, s, n); return 0; }
CUresult cuMemcpyDtoH_v2(void *d, CUdeviceptr s, size_t n) { memcpy(d, (void *)(uintptr_t)s, n); return 0; }
CUresult cuGetErrorName(CUresult e, const char **s) {
  switch (e) {
  case 2: *s = "CUDA_ERROR_OUT_OF_MEMORY"; return 0;
  case 3: *s = "CUDA_ERROR_NOT_INITIALIZED"; return 0;
  case 101: *s = "CUDA_ERROR_INVALID_DEVICE"; return 0;
  case 214: *s = "CUDA_ERROR_ECC_UNCORRECTABLE"; return 0;
  default: return 1;
  }
}
"#;

/// A built stand-in, removed on drop.
#[derive(Debug)]
pub struct FakeCuda {
    dir: TempDir,
}

impl FakeCuda {
    /// Builds `libcuda.so.1` into a temp directory with `cc`.
    pub fn build() -> Result<FakeCuda, String> {
        let dir = tempfile::Builder::new()
            .prefix("cuda-sim-")
            .tempdir()
            .map_err(|e| format!("tempdir: {e}"))?;
        let src = dir.path().join("cuda.c");
        fs::write(&src, CUDA_C).map_err(|e| format!("{}: {e}", src.display()))?;
        let fail = dir.path().join("fail");
        let out = Command::new("cc")
            .args(["-std=c11", "-D_DEFAULT_SOURCE", "-O1", "-shared", "-fPIC"])
            .arg(format!("-DFAIL_FILE=\"{}\"", fail.display()))
            .arg("-o")
            .arg(dir.path().join("libcuda.so.1"))
            .arg(&src)
            .output()
            .map_err(|e| format!("cc: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "cc (libcuda.so.1) failed: {}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        Ok(FakeCuda { dir })
    }

    /// The library.
    pub fn lib_path(&self) -> PathBuf {
        self.dir.path().join("libcuda.so.1")
    }

    /// The file whose existence makes `cuMemAlloc_v2` fail.
    pub fn fail_path(&self) -> PathBuf {
        self.dir.path().join("fail")
    }

    /// Makes `cuMemAlloc_v2` fail (`true`) or work.
    pub fn set_failing(&self, failing: bool) -> Result<(), String> {
        let path = self.fail_path();
        if failing {
            fs::write(&path, b"").map_err(|e| format!("{}: {e}", path.display()))
        } else {
            match fs::remove_file(&path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    Err(format!("{}: {e}", path.display()))
                }
                _ => Ok(()),
            }
        }
    }

    /// The directory holding the library.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}
