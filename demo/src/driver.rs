//! A generated NVIDIA driver installation in a temp directory, and the real volume plan for it.
//!
//! The files are stand-in ELF objects written here (a few hundred bytes each: ELF header,
//! `PT_LOAD`, `PT_DYNAMIC` with `DT_SONAME`, and section headers so that both glibc's `ldconfig`
//! and the volume manager's ELF reader find the SONAME), under the names a real driver installs:
//! `libnvidia-ml.so.<version>` with its SONAME link `libnvidia-ml.so.1`, and so on. Next to them
//! are an older driver's leftover and the CUDA toolkit's unversioned `stubs/libcuda.so`, which
//! the planner must leave out.
//!
//! The ld.so.cache is written by glibc's own `ldconfig -X -i -r <root>` (no links touched, no
//! aux cache written). `-r` chroots, so it needs root; otherwise it is run in a user namespace
//! (`unshare --user --map-root-user`). When neither works the plan is reported as unavailable
//! with the reason: a cache written without `-r` would also list the host's own libraries.
//!
//! [`elf_object`], [`native_machine`] and [`write_cache`] also build the driver tree of
//! `mesos-gpu --simulate`.

use std::io;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};

use mesos_gpu_os::fsmode;
use mesos_gpu_os::io::{IoContext as _, IoError};
use mesos_gpu_volume::ldcache::LdCacheError;
use mesos_gpu_volume::plan::{DriverSource, PlanError, VolumePlan};
use mesos_gpu_volume::{DriverVersion, LdCache};

/// Why the stand-in driver or its ld.so.cache cannot be written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DriverError {
    /// A directory cannot be created.
    #[error(transparent)]
    Create(IoError),
    /// A file cannot be written.
    #[error(transparent)]
    Write(IoError),
    /// A SONAME link cannot be made.
    #[error(transparent)]
    Link(IoError),
    /// `etc/ld.so.conf` cannot be written.
    #[error(transparent)]
    WriteConf(IoError),
    /// glibc's `ldconfig` is not installed.
    #[error("glibc's ldconfig is not installed (looked in /sbin and /usr/sbin)")]
    NoLdconfig,
    /// `ldconfig` (or `unshare` in front of it) cannot be started.
    #[error("cannot run {command}")]
    Run {
        /// The command, as Rust's `Command` debug-prints it.
        command: String,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// `ldconfig -r` failed.
    #[error("{how} failed ({status}): {stderr}")]
    Ldconfig {
        /// How it was run.
        how: &'static str,
        /// Its exit status.
        status: ExitStatus,
        /// What it wrote on stderr.
        stderr: String,
    },
    /// The cache `ldconfig` wrote cannot be read.
    #[error("cannot read the generated ld.so.cache")]
    ReadCache {
        /// Why.
        #[source]
        source: LdCacheError,
    },
    /// The volume planner refused the generated driver.
    #[error("the volume planner failed on the generated driver")]
    Plan {
        /// Why.
        #[source]
        source: PlanError,
    },
    /// This host's libraries are not 64-bit ELF.
    #[error("the demo's driver generator writes 64-bit ELF only")]
    NotElf64,
}

/// Creates `dir` with the state directories' mode.
fn create_dir(dir: &Path) -> Result<(), DriverError> {
    fsmode::create_dir_all(dir, fsmode::STATE_DIR)
        .at("create", dir)
        .map_err(DriverError::Create)
}

/// Writes `bytes` to `path` with `mode`.
fn write_file(path: &Path, bytes: &[u8], mode: u32) -> Result<(), DriverError> {
    fsmode::write_file(path, bytes, mode)
        .at("write", path)
        .map_err(DriverError::Write)
}

/// 64-bit library directory inside the generated root (Debian/Ubuntu layout).
const LIB_DIR: &str = "usr/lib/x86_64-linux-gnu";
/// Where binaries go.
const BIN_DIR: &str = "usr/bin";
/// The mode of the generated programs, as a driver installs its binaries; libraries and
/// directories get [`fsmode::STATE_FILE`] and [`fsmode::STATE_DIR`], whatever the umask.
const BIN_MODE: u32 = 0o755;
/// An older driver's version, left behind in `usr/lib64`.
const OLD_VERSION: &str = "470.82.01";

/// Driver libraries as `(prefix, SONAME suffix)`: the file is `<prefix>.<version>`, its SONAME
/// `<prefix>.<suffix>`.
const LIBRARIES: &[(&str, &str)] = &[
    ("libnvidia-ml.so", "1"),
    ("libnvidia-cfg.so", "1"),
    ("libcuda.so", "1"),
    ("libnvidia-ptxjitcompiler.so", "1"),
    ("libnvidia-nvvm.so", "4"),
    ("libnvidia-opencl.so", "1"),
    ("libnvidia-encode.so", "1"),
    ("libnvcuvid.so", "1"),
];

/// Driver binaries.
const BINARIES: &[&str] = &[
    "nvidia-smi",
    "nvidia-debugdump",
    "nvidia-persistenced",
    "nvidia-cuda-mps-control",
    "nvidia-cuda-mps-server",
];

/// The generated tree and, when `ldconfig` could run, its plan.
#[derive(Debug)]
pub(crate) struct GeneratedDriver {
    /// The driver root.
    pub(crate) root: PathBuf,
    /// Files written, relative to the root, for the report.
    pub(crate) files: Vec<String>,
    /// How the cache was written.
    pub(crate) cache_note: String,
    /// The real plan, or why there is none.
    pub(crate) plan: Result<VolumePlan, String>,
}

/// Writes the driver of `version` under `root` and plans its volume.
pub(crate) fn generate(
    root: &Path,
    version: &DriverVersion,
) -> Result<GeneratedDriver, DriverError> {
    let machine = native_machine()?;
    let v = version.as_str();
    let mut files = Vec::new();
    let mut lib = |dir: &str, file: &str, soname: Option<&str>| -> Result<(), DriverError> {
        let dir_path = root.join(dir);
        create_dir(&dir_path)?;
        write_file(
            &dir_path.join(file),
            &elf_object(machine, soname),
            fsmode::STATE_FILE,
        )?;
        files.push(format!("{dir}/{file}"));
        if let Some(soname) = soname.filter(|s| *s != file) {
            let link = dir_path.join(soname);
            symlink(file, &link)
                .at("link", &link)
                .map_err(DriverError::Link)?;
            files.push(format!("{dir}/{soname} -> {file}"));
        }
        Ok(())
    };
    for (prefix, suffix) in LIBRARIES {
        lib(
            LIB_DIR,
            &format!("{prefix}.{v}"),
            Some(&format!("{prefix}.{suffix}")),
        )?;
    }
    lib(
        "usr/lib64",
        &format!("libnvidia-ml.so.{OLD_VERSION}"),
        Some("libnvidia-ml.so.1"),
    )?;
    lib(
        "usr/local/cuda/lib64/stubs",
        "libcuda.so",
        Some("libcuda.so.1"),
    )?;
    let bin = root.join(BIN_DIR);
    create_dir(&bin)?;
    for name in BINARIES {
        write_file(&bin.join(name), &elf_object(machine, None), BIN_MODE)?;
        files.push(format!("{BIN_DIR}/{name}"));
    }
    let (cache_note, plan) =
        match write_cache(root, &[LIB_DIR, "usr/lib64", "usr/local/cuda/lib64/stubs"]) {
            Ok(note) => {
                let cache =
                    LdCache::load(root).map_err(|source| DriverError::ReadCache { source })?;
                let mut source = DriverSource::at(root);
                source.search_path = vec![PathBuf::from("/").join(BIN_DIR)];
                let plan = mesos_gpu_volume::plan::plan_from(&source, &cache, version)
                    .map_err(|source| DriverError::Plan { source })?;
                (note, Ok(plan))
            }
            Err(why) => {
                let why = mesos_gpu_os::chain::error_chain(&why);
                (format!("no ld.so.cache: {why}"), Err(why))
            }
        };
    Ok(GeneratedDriver {
        root: root.to_owned(),
        files,
        cache_note,
        plan,
    })
}

/// Runs `ldconfig -r` for `dirs` (relative to `root`), as root or in a user namespace; returns
/// how the cache was written.
pub fn write_cache(root: &Path, dirs: &[&str]) -> Result<String, DriverError> {
    let etc = root.join("etc");
    create_dir(&etc)?;
    let conf: String = dirs.iter().map(|d| format!("/{d}\n")).collect();
    let conf_path = etc.join("ld.so.conf");
    fsmode::write_file(&conf_path, conf.as_bytes(), fsmode::STATE_FILE)
        .at("write", &conf_path)
        .map_err(DriverError::WriteConf)?;
    let ldconfig = ["/sbin/ldconfig", "/usr/sbin/ldconfig"]
        .into_iter()
        .map(Path::new)
        .find(|p| p.exists())
        .ok_or(DriverError::NoLdconfig)?;
    let args = |cmd: &mut Command| {
        cmd.env("LC_ALL", "C")
            .arg(ldconfig)
            .args(["-X", "-i", "-r"])
            .arg(root)
            .args(["-C", "/etc/ld.so.cache", "-f", "/etc/ld.so.conf"]);
    };
    let as_root = rustix::process::geteuid().is_root();
    let mut cmd = if as_root {
        Command::new("env")
    } else {
        let mut c = Command::new("unshare");
        c.args(["--user", "--map-root-user", "env"]);
        c
    };
    args(&mut cmd);
    let out = cmd.output().map_err(|source| DriverError::Run {
        command: format!("{cmd:?}"),
        source,
    })?;
    if !out.status.success() {
        let how = if as_root {
            "ldconfig -r"
        } else {
            "ldconfig -r in a user namespace (unshare -r)"
        };
        return Err(DriverError::Ldconfig {
            how,
            status: out.status,
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        });
    }
    let how = if as_root {
        "as root"
    } else {
        "in a user namespace"
    };
    Ok(format!("written by `ldconfig -X -i -r <root>` {how}"))
}

/// `e_machine` of this host's 64-bit libraries, as the planner expects it.
pub fn native_machine() -> Result<u16, DriverError> {
    let arch = mesos_gpu_volume::plan::HostArch::native();
    if arch.lib64.class != mesos_gpu_volume::elf_info::ElfClass::Elf64 {
        return Err(DriverError::NotElf64);
    }
    Ok(arch.lib64.machine)
}

/// One ELF64 section header, the fields that vary.
struct Section {
    name: u32,
    kind: u32,
    flags: u64,
    off: usize,
    size: usize,
    link: u32,
    align: u64,
    entsize: u64,
}

/// A minimal little-endian ELF64 shared object for `machine` with an optional `DT_SONAME`.
pub fn elf_object(machine: u16, soname: Option<&str>) -> Vec<u8> {
    const EHDR: usize = 64;
    const PHDR: usize = 56;
    const SHDR: usize = 64;
    let mut dynstr = vec![0u8];
    let soname_at = soname.map(|s| {
        let at = dynstr.len();
        dynstr.extend_from_slice(s.as_bytes());
        dynstr.push(0);
        at
    });
    let dynstr_off = EHDR + 2 * PHDR;
    let dyn_off = (dynstr_off + dynstr.len()).next_multiple_of(8);
    let mut dynamic: Vec<(u64, u64)> = Vec::new();
    if let Some(at) = soname_at {
        dynamic.push((14, at as u64)); // DT_SONAME
    }
    dynamic.extend([(5, dynstr_off as u64), (10, dynstr.len() as u64), (0, 0)]); // STRTAB, STRSZ, NULL
    let dyn_len = dynamic.len() * 16;
    let shstrtab = b"\0.dynstr\0.dynamic\0.shstrtab\0";
    let shstr_off = dyn_off + dyn_len;
    let sh_off = (shstr_off + shstrtab.len()).next_multiple_of(8);
    let total = sh_off + 4 * SHDR;

    let mut out = Vec::with_capacity(total);
    let u16le = |out: &mut Vec<u8>, v: u16| out.extend_from_slice(&v.to_le_bytes());
    let u32le = |out: &mut Vec<u8>, v: u32| out.extend_from_slice(&v.to_le_bytes());
    let u64le = |out: &mut Vec<u8>, v: u64| out.extend_from_slice(&v.to_le_bytes());
    // ELF header: ELFCLASS64, ELFDATA2LSB, EV_CURRENT, ET_DYN.
    out.extend_from_slice(&[0x7f, b'E', b'L', b'F', 2, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
    u16le(&mut out, 3);
    u16le(&mut out, machine);
    u32le(&mut out, 1);
    u64le(&mut out, 0); // e_entry
    u64le(&mut out, EHDR as u64); // e_phoff
    u64le(&mut out, sh_off as u64); // e_shoff
    u32le(&mut out, 0); // e_flags
    // ehsize, phentsize, phnum, shentsize, shnum, shstrndx: all fixed and small.
    for v in [64u16, 56, 2, 64, 4, 3] {
        u16le(&mut out, v);
    }
    // PT_LOAD of the whole file at address 0, then PT_DYNAMIC.
    for (p_type, flags, off, len, align) in [
        (1u32, 4u32, 0, total, 0x1000u64),
        (2, 6, dyn_off, dyn_len, 8),
    ] {
        u32le(&mut out, p_type);
        u32le(&mut out, flags);
        for v in [
            off as u64, off as u64, off as u64, len as u64, len as u64, align,
        ] {
            u64le(&mut out, v);
        }
    }
    out.extend_from_slice(&dynstr);
    out.resize(dyn_off, 0);
    for (tag, val) in &dynamic {
        u64le(&mut out, *tag);
        u64le(&mut out, *val);
    }
    out.extend_from_slice(shstrtab);
    out.resize(sh_off, 0);
    // Section headers: NULL, .dynstr (STRTAB), .dynamic (DYNAMIC, linked to .dynstr), .shstrtab.
    let sections = [
        Section {
            name: 0,
            kind: 0,
            flags: 0,
            off: 0,
            size: 0,
            link: 0,
            align: 0,
            entsize: 0,
        },
        Section {
            name: 1,
            kind: 3,
            flags: 2,
            off: dynstr_off,
            size: dynstr.len(),
            link: 0,
            align: 1,
            entsize: 0,
        },
        Section {
            name: 9,
            kind: 6,
            flags: 3,
            off: dyn_off,
            size: dyn_len,
            link: 1,
            align: 8,
            entsize: 16,
        },
        Section {
            name: 18,
            kind: 3,
            flags: 0,
            off: shstr_off,
            size: shstrtab.len(),
            link: 0,
            align: 1,
            entsize: 0,
        },
    ];
    for s in sections {
        u32le(&mut out, s.name);
        u32le(&mut out, s.kind);
        u64le(&mut out, s.flags);
        u64le(&mut out, if s.flags & 2 != 0 { s.off as u64 } else { 0 }); // sh_addr when SHF_ALLOC
        u64le(&mut out, s.off as u64);
        u64le(&mut out, s.size as u64);
        u32le(&mut out, s.link);
        u32le(&mut out, 0);
        u64le(&mut out, s.align);
        u64le(&mut out, s.entsize);
    }
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a failed unwrap fails the test at its line
mod tests {
    use mesos_gpu_volume::plan::{SkipReason, VolumeDir};

    use super::*;

    #[test]
    fn the_planner_takes_the_generated_driver_and_skips_the_leftovers() {
        let dir = tempfile::tempdir().unwrap();
        let version: DriverVersion = "550.54.14".parse().unwrap();
        let driver = generate(dir.path(), &version).unwrap();
        let plan = match driver.plan {
            Ok(plan) => plan,
            // Without root and without user namespaces there is no cache; the reason is given.
            Err(why) => {
                assert!(why.contains("ldconfig"), "{why}");
                return;
            }
        };
        let libs: Vec<&str> = plan
            .files
            .iter()
            .filter(|f| f.dir == VolumeDir::Lib64)
            .map(|f| f.name.as_str())
            .collect();
        assert_eq!(libs.len(), LIBRARIES.len(), "{libs:?}");
        assert!(libs.contains(&"libnvidia-ml.so.550.54.14"), "{libs:?}");
        let links: Vec<String> = plan
            .links
            .iter()
            .map(|l| format!("{} -> {}", l.name, l.target))
            .collect();
        assert!(
            links.contains(&"libcuda.so.1 -> libcuda.so.550.54.14".to_owned()),
            "{links:?}"
        );
        let bins = plan
            .files
            .iter()
            .filter(|f| f.dir == VolumeDir::Bin)
            .count();
        assert_eq!(bins, BINARIES.len());
        let reasons: Vec<&SkipReason> = plan.skipped.iter().map(|s| &s.reason).collect();
        assert!(reasons.contains(&&SkipReason::Unversioned), "{reasons:?}");
        assert!(
            reasons
                .iter()
                .any(|r| matches!(r, SkipReason::OtherVersion { found } if found == OLD_VERSION)),
            "{reasons:?}"
        );
    }
}
