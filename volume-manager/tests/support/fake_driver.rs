//! A fake NVIDIA driver installation under a temporary root: real ELF shared objects compiled with
//! `cc` (64-bit, and 32-bit with `-m32`), SONAME links, and an ld.so.cache written by glibc's own
//! `ldconfig -r <root>`. Shared by the volume tests, the benchmark and the figures example.
#![allow(dead_code)]

use std::io::{self, Write};
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The running driver's version in every fake tree.
pub(crate) const VERSION: &str = "550.54.14";
/// An older driver's version, left behind in `usr/lib64`.
pub(crate) const OLD_VERSION: &str = "470.82.01";
/// 64-bit library directory, inside the root.
pub(crate) const LIB64: &str = "usr/lib/x86_64-linux-gnu";
/// 32-bit library directory, inside the root.
pub(crate) const LIB32: &str = "usr/lib/i386-linux-gnu";

/// One shared library to compile.
pub(crate) struct Lib {
    /// Directory inside the root.
    pub(crate) dir: String,
    /// File name.
    pub(crate) file: String,
    /// `DT_SONAME`.
    pub(crate) soname: String,
    /// Build with `-m32`.
    pub(crate) m32: bool,
    /// File names (in `dir`) to link against, giving `DT_NEEDED` entries.
    pub(crate) needs: Vec<String>,
    /// Pad the file with pseudo-random bytes up to this size.
    pub(crate) size: u64,
}

impl Lib {
    /// A library `file` with SONAME `soname` in `dir` (and a SONAME link to it).
    pub(crate) fn new(dir: &str, file: &str, soname: &str) -> Lib {
        Lib {
            dir: dir.into(),
            file: file.into(),
            soname: soname.into(),
            m32: false,
            needs: Vec::new(),
            size: 0,
        }
    }

    /// Built 32-bit.
    pub(crate) fn m32(mut self) -> Lib {
        self.m32 = true;
        self
    }

    /// Linked against `file` (in the same directory).
    pub(crate) fn needs(mut self, file: &str) -> Lib {
        self.needs.push(file.into());
        self
    }

    /// Padded to `size` bytes.
    pub(crate) fn size(mut self, size: u64) -> Lib {
        self.size = size;
        self
    }
}

fn run(cmd: &mut Command) -> io::Result<()> {
    let out = cmd.output()?;
    if out.status.success() {
        Ok(())
    } else {
        Err(io::Error::other(format!(
            "{cmd:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        )))
    }
}

/// Compiles `lib` under `root`.
pub(crate) fn compile(root: &Path, lib: &Lib) -> io::Result<PathBuf> {
    let dir = root.join(&lib.dir);
    std::fs::create_dir_all(&dir)?;
    let src = dir.join(format!(".{}.c", lib.file));
    let symbol: String = lib
        .file
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    std::fs::write(&src, format!("int fake_{symbol}(void) {{ return 42; }}\n"))?;
    let out = dir.join(&lib.file);
    let mut cmd = Command::new("cc");
    cmd.args(["-shared", "-fPIC"]);
    if lib.m32 {
        cmd.arg("-m32");
    }
    cmd.arg(format!("-Wl,-soname,{}", lib.soname))
        .arg("-o")
        .arg(&out)
        .arg(&src);
    if !lib.needs.is_empty() {
        cmd.arg(format!("-L{}", dir.display()))
            .arg("-Wl,--no-as-needed");
        for n in &lib.needs {
            cmd.arg(format!("-l:{n}"));
        }
    }
    run(&mut cmd)?;
    std::fs::remove_file(&src)?;
    pad(&out, lib.size)?;
    if lib.soname != lib.file {
        let link = dir.join(&lib.soname);
        let _ = std::fs::remove_file(&link);
        symlink(&lib.file, &link)?;
    }
    Ok(out)
}

/// Appends pseudo-random bytes to `path` until it is `size` bytes long.
pub(crate) fn pad(path: &Path, size: u64) -> io::Result<()> {
    let len = std::fs::metadata(path)?.len();
    if size <= len {
        return Ok(());
    }
    let mut file = std::fs::OpenOptions::new().append(true).open(path)?;
    let mut state = len.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut buf = vec![0u8; 1 << 20];
    let mut left = size - len;
    while left > 0 {
        for chunk in buf.chunks_exact_mut(8) {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            chunk.copy_from_slice(&state.to_ne_bytes());
        }
        let n = usize::try_from(left.min(buf.len() as u64)).unwrap_or(buf.len());
        file.write_all(&buf[..n])?;
        left -= n as u64;
    }
    file.sync_all()
}

/// Writes `<root>/etc/ld.so.conf` listing `dirs` and runs `ldconfig -X -r <root>`, which writes
/// `<root>/etc/ld.so.cache` (new layout) without touching any link.
pub(crate) fn ldconfig(root: &Path, dirs: &[&str]) -> io::Result<PathBuf> {
    std::fs::create_dir_all(root.join("etc"))?;
    let conf: String = dirs.iter().map(|d| format!("/{d}\n")).collect();
    std::fs::write(root.join("etc/ld.so.conf"), conf)?;
    run(Command::new("ldconfig")
        .env("LC_ALL", "C")
        .args(["-X", "-r"])
        .arg(root)
        .args(["-C", "/etc/ld.so.cache", "-f", "/etc/ld.so.conf"]))?;
    Ok(root.join("etc/ld.so.cache"))
}

/// Compiles a small executable at `<root>/<path>`.
pub(crate) fn executable(root: &Path, path: &str) -> io::Result<()> {
    let out = root.join(path);
    std::fs::create_dir_all(out.parent().unwrap_or(root))?;
    let src = root.join(".main.c");
    std::fs::write(&src, "int main(void) { return 0; }\n")?;
    run(Command::new("cc").arg("-o").arg(&out).arg(&src))?;
    std::fs::remove_file(src)
}

/// Compiles an executable at `<root>/<path>` that prints `text` (so that `text` is in the file).
pub(crate) fn program_saying(root: &Path, path: &str, text: &str) -> io::Result<()> {
    let out = root.join(path);
    std::fs::create_dir_all(out.parent().unwrap_or(root))?;
    let src = root.join(".say.c");
    std::fs::write(
        &src,
        format!("#include <stdio.h>\nint main(void) {{ puts({text:?}); return 0; }}\n"),
    )?;
    run(Command::new("cc").arg("-o").arg(&out).arg(&src))?;
    std::fs::remove_file(src)
}

/// The small driver the tests use:
///
/// - 64-bit `libnvidia-ml`, `libcuda`, `libnvidia-ptxjitcompiler`, `libnvidia-glcore`,
///   `libGLX_nvidia` (needs glcore) and `libnvidia-cfg` in `usr/lib/x86_64-linux-gnu`;
/// - 32-bit `libnvidia-ml` and `libcuda` in `usr/lib/i386-linux-gnu`;
/// - GLVND: `libGLdispatch.so.0` and an NVIDIA-installed `libGL.so.1.7.0` needing it;
/// - Mesa-like `libGL.so.1.2.0` (needs `libglapi.so.0`) in `usr/lib/mesa`;
/// - the CUDA toolkit's `stubs/libcuda.so` (no version) in `usr/local/cuda/lib64/stubs`;
/// - the 470 driver's `libnvidia-ml.so.470.82.01` left in `usr/lib64`;
/// - `nvidia-smi` and `nvidia-debugdump` in `usr/bin`;
/// - after the cache is written, `libnvidia-cfg.so.1` is re-pointed at `/etc/passwd`.
pub(crate) fn small_driver(root: &Path) -> io::Result<PathBuf> {
    let v = VERSION;
    let libs = [
        Lib::new(LIB64, &format!("libnvidia-ml.so.{v}"), "libnvidia-ml.so.1"),
        Lib::new(LIB64, &format!("libcuda.so.{v}"), "libcuda.so.1"),
        Lib::new(
            LIB64,
            &format!("libnvidia-ptxjitcompiler.so.{v}"),
            "libnvidia-ptxjitcompiler.so.1",
        ),
        Lib::new(
            LIB64,
            &format!("libnvidia-glcore.so.{v}"),
            &format!("libnvidia-glcore.so.{v}"),
        ),
        Lib::new(
            LIB64,
            &format!("libGLX_nvidia.so.{v}"),
            "libGLX_nvidia.so.0",
        )
        .needs(&format!("libnvidia-glcore.so.{v}")),
        Lib::new(
            LIB64,
            &format!("libnvidia-cfg.so.{v}"),
            "libnvidia-cfg.so.1",
        ),
        Lib::new(LIB64, "libGLdispatch.so.0", "libGLdispatch.so.0"),
        Lib::new(LIB64, "libGL.so.1.7.0", "libGL.so.1").needs("libGLdispatch.so.0"),
        Lib::new(LIB32, &format!("libnvidia-ml.so.{v}"), "libnvidia-ml.so.1").m32(),
        Lib::new(LIB32, &format!("libcuda.so.{v}"), "libcuda.so.1").m32(),
        Lib::new("usr/lib/mesa", "libglapi.so.0", "libglapi.so.0"),
        Lib::new("usr/lib/mesa", "libGL.so.1.2.0", "libGL.so.1").needs("libglapi.so.0"),
        Lib::new("usr/local/cuda/lib64/stubs", "libcuda.so", "libcuda.so.1"),
        Lib::new(
            "usr/lib64",
            &format!("libnvidia-ml.so.{OLD_VERSION}"),
            "libnvidia-ml.so.1",
        ),
    ];
    for lib in &libs {
        compile(root, lib)?;
    }
    executable(root, "usr/bin/nvidia-smi")?;
    executable(root, "usr/bin/nvidia-debugdump")?;
    let cache = ldconfig(
        root,
        &[
            LIB64,
            LIB32,
            "usr/lib/mesa",
            "usr/local/cuda/lib64/stubs",
            "usr/lib64",
        ],
    )?;
    let cfg = root.join(LIB64).join("libnvidia-cfg.so.1");
    std::fs::remove_file(&cfg)?;
    symlink("/etc/passwd", &cfg)?;
    Ok(cache)
}

/// Library families and sizes (MiB) of a realistic 550-series driver which, with the GLVND
/// libraries and binaries below, make about 80 files and 600 MiB.
const REALISTIC: &[(&str, &str, u64, u64)] = &[
    // (prefix, soname suffix, 64-bit MiB, 32-bit MiB; 0 = none)
    ("libnvidia-ml.so", "1", 2, 2),
    ("libnvidia-cfg.so", "1", 1, 0),
    ("libnvidia-nscq.so", "2", 1, 0),
    ("libcuda.so", "1", 33, 26),
    ("libcudadebugger.so", "1", 10, 0),
    ("libnvidia-opencl.so", "1", 50, 0),
    ("libnvidia-gpucomp.so", "", 50, 40),
    ("libnvidia-ptxjitcompiler.so", "1", 25, 20),
    ("libnvidia-allocator.so", "1", 1, 1),
    ("libnvidia-pkcs11.so", "", 1, 0),
    ("libnvidia-pkcs11-openssl3.so", "", 1, 0),
    ("libnvidia-nvvm.so", "4", 30, 0),
    ("libvdpau_nvidia.so", "1", 1, 1),
    ("libnvidia-encode.so", "1", 1, 1),
    ("libnvidia-opticalflow.so", "1", 1, 1),
    ("libnvcuvid.so", "1", 10, 9),
    ("libnvidia-eglcore.so", "", 30, 28),
    ("libnvidia-glcore.so", "", 30, 28),
    ("libnvidia-tls.so", "", 1, 1),
    ("libnvidia-glsi.so", "", 1, 1),
    ("libnvidia-fbc.so", "1", 1, 1),
    ("libnvidia-rtcore.so", "", 40, 0),
    ("libnvoptix.so", "1", 30, 0),
    ("libGLX_nvidia.so", "0", 1, 1),
    ("libEGL_nvidia.so", "0", 1, 1),
    ("libGLESv2_nvidia.so", "2", 1, 1),
    ("libGLESv1_CM_nvidia.so", "1", 1, 1),
    ("libnvidia-glvkspirv.so", "", 15, 14),
    ("libnvidia-cbl.so", "", 1, 0),
    ("libnvidia-ngx.so", "1", 4, 0),
    ("libnvidia-ifr.so", "1", 1, 1),
    ("libnvidia-compiler.so", "", 35, 30),
    ("libnvidia-fatbinaryloader.so", "", 1, 1),
];

/// GLVND libraries the driver installs beside its own: (file, SONAME, needs `libGLdispatch`).
const GLVND: &[(&str, &str, bool)] = &[
    ("libGLdispatch.so.0", "libGLdispatch.so.0", false),
    ("libGLX.so.0", "libGLX.so.0", true),
    ("libOpenGL.so.0", "libOpenGL.so.0", true),
    ("libGL.so.1.7.0", "libGL.so.1", true),
    ("libEGL.so.1.1.0", "libEGL.so.1", true),
    ("libGLESv2.so.2.1.0", "libGLESv2.so.2", true),
    ("libGLESv1_CM.so.1.2.0", "libGLESv1_CM.so.1", true),
];

/// A realistic driver (see [`REALISTIC`]) under `root`, with its cache; returns the cache path.
pub(crate) fn realistic_driver(root: &Path) -> io::Result<PathBuf> {
    const MIB: u64 = 1 << 20;
    for &(prefix, soname, mib64, mib32) in REALISTIC {
        let file = format!("{prefix}.{VERSION}");
        let soname = if soname.is_empty() {
            file.clone()
        } else {
            format!("{prefix}.{soname}")
        };
        compile(root, &Lib::new(LIB64, &file, &soname).size(mib64 * MIB))?;
        if mib32 > 0 {
            compile(
                root,
                &Lib::new(LIB32, &file, &soname).m32().size(mib32 * MIB),
            )?;
        }
    }
    for &(file, soname, dispatch) in GLVND {
        for (dir, m32) in [(LIB64, false), (LIB32, true)] {
            let mut lib = Lib::new(dir, file, soname).size(MIB / 2);
            if m32 {
                lib = lib.m32();
            }
            if dispatch {
                lib = lib.needs("libGLdispatch.so.0");
            }
            compile(root, &lib)?;
        }
    }
    for bin in [
        "nvidia-smi",
        "nvidia-debugdump",
        "nvidia-persistenced",
        "nvidia-cuda-mps-control",
        "nvidia-cuda-mps-server",
    ] {
        executable(root, &format!("usr/bin/{bin}"))?;
        pad(&root.join("usr/bin").join(bin), MIB)?;
    }
    ldconfig(root, &[LIB64, LIB32])
}
