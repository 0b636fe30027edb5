//! Finding the running driver's files and deciding where each goes in the volume.
//!
//! Rules (see `catalog.rs` for the lists and `docs/reference/nvidia-docker.md` §3):
//!
//! - Libraries come from ld.so.cache entries whose name starts with a catalog prefix. Entries in
//!   `glibc-hwcaps/` or legacy hwcap directories are skipped: the plain directory's copy is the one
//!   every CPU can load.
//! - The cache flags pick the slot (x86-64 → 64-bit, i386 → 32-bit); the ELF class and machine of
//!   the file must agree, and the class picks `lib64/` or `lib/` (as Mesos does).
//! - Paths are resolved through symlinks inside the driver root and de-duplicated.
//! - A versioned library is taken only if its resolved file name is exactly
//!   `<prefix>.<driver version>` (libnvidia-container's suffix rule). This drops the CUDA toolkit's
//!   `stubs/libcuda.so` (nvidia-docker#436) and an older driver's leftovers.
//! - Each library gets its SONAME link and a link for every other cache name that resolved to it;
//!   `libcuda.so` and `libGLX_indirect.so.0` are added as nvidia-docker 1.0 did.
//! - Programs are looked up as Mesos looks them up: along `PATH` (Mesos's `NvidiaVolume::create`
//!   runs `which <program>` in the agent's environment, `src/slave/containerizer/mesos/isolators/
//!   gpu/volume.cpp`, and copies what it names, following symlinks), here a `PATH` the caller
//!   passes, read inside the driver root; then in the driver's own `bin` next to its libraries
//!   (`/usr/local/nvidia/bin` when `libnvidia-ml` comes from `/usr/local/nvidia/lib64`). Unlike
//!   `which`, a candidate that is not a native ELF executable (a `#!/bin/sh` wrapper in
//!   `/usr/bin`, as some hosts install in front of the driver's programs) or that names another
//!   driver version is skipped in favour of the next one, and the skip is recorded.
//! - A program's driver version is the version-shaped text it holds (NVIDIA's programs print
//!   their own version, e.g. `nvidia-smi --version`): one equal to the driver's is taken, one
//!   holding only other versions is skipped, one holding none is taken (the version cannot be
//!   told).
//!
//! Every candidate that is not taken is listed with the reason, so an operator can see why.

mod select;

use std::ffi::OsStr;
use std::fmt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use elf::abi;
use mesos_gpu_os::io::{IoContext as _, IoError};

use crate::catalog::Capability;
use crate::elf_info::ElfClass;
use crate::ldcache::{CacheArch, Hwcap, LdCache};
use crate::rooted::resolve_in_root;
use crate::version::DriverVersion;
use select::Selection;

/// The program search path when the caller gives none (Debian's default `PATH` for root),
/// inside the driver root.
pub const DEFAULT_SEARCH_PATH: &[&str] = &[
    "/usr/local/sbin",
    "/usr/local/bin",
    "/usr/sbin",
    "/usr/bin",
    "/sbin",
    "/bin",
];

/// Why no plan could be made.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    /// The driver root is not a readable directory ("cannot read driver root <path>").
    #[error(transparent)]
    DriverRoot(IoError),
    /// No `libnvidia-ml.so.<version>` in the cache tells the driver version.
    #[error(
        "cannot tell the driver version: no ld.so.cache entry under {root} resolves to a \
         libnvidia-ml.so.<version> file; pass the version explicitly"
    )]
    NoDriverVersion {
        /// The driver root.
        root: PathBuf,
    },
}

/// A directory of the volume.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum VolumeDir {
    /// `bin/`: driver binaries.
    Bin,
    /// `lib/`: 32-bit libraries.
    Lib,
    /// `lib64/`: 64-bit libraries.
    Lib64,
}

impl VolumeDir {
    /// All three, in layout order.
    pub const ALL: [VolumeDir; 3] = [VolumeDir::Bin, VolumeDir::Lib, VolumeDir::Lib64];

    /// The directory name.
    pub fn as_str(self) -> &'static str {
        match self {
            VolumeDir::Bin => "bin",
            VolumeDir::Lib => "lib",
            VolumeDir::Lib64 => "lib64",
        }
    }
}

/// One library slot of the host: which cache entries and ELF files belong to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArchSlot {
    /// The architecture byte of matching cache entries.
    pub cache_arch: CacheArch,
    /// `e_machine` of matching files.
    pub machine: u16,
    /// ELF class of matching files.
    pub class: ElfClass,
}

/// The library slots of a host: its native one and, on x86-64, the 32-bit compat one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostArch {
    /// Native 64-bit libraries, into `lib64/`.
    pub lib64: ArchSlot,
    /// 32-bit compat libraries, into `lib/`.
    pub lib32: Option<ArchSlot>,
}

impl HostArch {
    /// x86-64 with i386 compat libraries.
    pub const X86_64: HostArch = HostArch {
        lib64: ArchSlot {
            cache_arch: CacheArch::X86_64,
            machine: abi::EM_X86_64,
            class: ElfClass::Elf64,
        },
        lib32: Some(ArchSlot {
            cache_arch: CacheArch::Default,
            machine: abi::EM_386,
            class: ElfClass::Elf32,
        }),
    };
    /// AArch64 (no 32-bit driver libraries).
    pub const AARCH64: HostArch = HostArch {
        lib64: ArchSlot {
            cache_arch: CacheArch::Aarch64,
            machine: abi::EM_AARCH64,
            class: ElfClass::Elf64,
        },
        lib32: None,
    };
    /// ppc64le (no 32-bit driver libraries).
    pub const PPC64LE: HostArch = HostArch {
        lib64: ArchSlot {
            cache_arch: CacheArch::PowerPc64,
            machine: abi::EM_PPC64,
            class: ElfClass::Elf64,
        },
        lib32: None,
    };

    /// The architecture this program runs on; NVIDIA ships drivers for these three only, so
    /// anything else is treated as x86-64.
    pub fn native() -> HostArch {
        if cfg!(target_arch = "aarch64") {
            HostArch::AARCH64
        } else if cfg!(target_arch = "powerpc64") {
            HostArch::PPC64LE
        } else {
            HostArch::X86_64
        }
    }

    fn slot(&self, arch: CacheArch) -> Option<ArchSlot> {
        [Some(self.lib64), self.lib32]
            .into_iter()
            .flatten()
            .find(|s| s.cache_arch == arch)
    }
}

/// Where to look for the driver.
#[derive(Debug, Clone)]
pub struct DriverSource {
    /// The driver's file system root, `/` on a plain host.
    pub root: PathBuf,
    /// Directories (inside `root`) searched for programs, in order, before the driver's own
    /// `bin` next to its libraries.
    pub search_path: Vec<PathBuf>,
    /// The host's library slots.
    pub arch: HostArch,
}

impl DriverSource {
    /// The driver under `root`, with the default search path and the native architecture.
    pub fn at(root: impl Into<PathBuf>) -> DriverSource {
        DriverSource {
            root: root.into(),
            search_path: DEFAULT_SEARCH_PATH.iter().map(PathBuf::from).collect(),
            arch: HostArch::native(),
        }
    }

    /// The driver under `root`, its programs searched along `path`, a `PATH` value
    /// (colon-separated directories, inside `root`). Relative and empty entries are left out:
    /// they name the caller's working directory, nothing of the driver's.
    pub fn with_path(root: impl Into<PathBuf>, path: &OsStr) -> DriverSource {
        DriverSource {
            search_path: std::env::split_paths(path)
                .filter(|dir| dir.is_absolute())
                .collect(),
            ..DriverSource::at(root)
        }
    }
}

/// Size and modification time of a source file when it was planned or copied.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct FileStamp {
    /// Size in bytes.
    pub size: u64,
    /// Modification time, nanoseconds since the epoch.
    pub mtime_ns: i64,
}

impl FileStamp {
    /// The stamp of a file's metadata.
    pub fn of(meta: &std::fs::Metadata) -> FileStamp {
        FileStamp {
            size: meta.len(),
            mtime_ns: meta
                .mtime()
                .saturating_mul(1_000_000_000)
                .saturating_add(meta.mtime_nsec()),
        }
    }
}

/// A file the volume will hold.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct PlannedFile {
    /// Its directory in the volume.
    pub dir: VolumeDir,
    /// Its file name there: the resolved file's name (the binary's name for `bin/`).
    pub name: String,
    /// The host file, symlinks resolved.
    pub source: PathBuf,
    /// The path it was found as (cache path or search-path hit), inside the driver root.
    pub found_as: PathBuf,
    /// For a program, where the search found it; `None` for a library.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub origin: Option<ProgramOrigin>,
    /// The capability it serves.
    pub capability: Capability,
    /// ELF class.
    pub class: ElfClass,
    /// `DT_SONAME`, for libraries.
    pub soname: Option<String>,
    /// Size and mtime when planned.
    pub stamp: FileStamp,
}

/// Where a program was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ProgramOrigin {
    /// A directory of the search path (`PATH`).
    SearchPath,
    /// The driver's own `bin` next to its libraries.
    DriverBin,
}

impl fmt::Display for ProgramOrigin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ProgramOrigin::SearchPath => "along PATH",
            ProgramOrigin::DriverBin => "in the driver's bin next to its libraries",
        })
    }
}

/// A symlink the volume will hold, relative, inside one directory.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
pub struct PlannedLink {
    /// Its directory.
    pub dir: VolumeDir,
    /// The link name, e.g. `libnvidia-ml.so.1`.
    pub name: String,
    /// What it points to, a name in the same directory.
    pub target: String,
}

/// Why a candidate was not taken.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "reason", rename_all = "snake_case")]
pub enum SkipReason {
    /// No ld.so.cache entry has this library's name.
    NotInCache,
    /// Neither a directory of the search path nor the driver's `bin` holds this program.
    NotFound,
    /// A `glibc-hwcaps/` or legacy hwcap variant; the plain copy is used.
    HwcapVariant,
    /// The cache entry is not an ELF library.
    NotElfEntry,
    /// The cache entry is for an ABI this host does not use (e.g. x32).
    ForeignArch {
        /// The entry's flags as `ldconfig -p` prints them.
        flags: String,
    },
    /// The path cannot be resolved (a stale cache entry, a loop…).
    Unresolvable {
        /// The error.
        error: String,
    },
    /// The resolved path is not a regular file.
    NotRegularFile,
    /// A binary without execute permission.
    NotExecutable,
    /// The resolved file's name is not this library's.
    NameMismatch,
    /// The file name carries no version (e.g. the CUDA toolkit's `stubs/libcuda.so`).
    Unversioned,
    /// The file belongs to another driver version (a library's name, or the version text a
    /// program holds).
    OtherVersion {
        /// The version in its name.
        found: String,
    },
    /// Not an ELF file.
    NotElf {
        /// The parse error.
        error: String,
    },
    /// ELF class, machine or type do not fit the slot.
    WrongElf {
        /// What the file is.
        found: String,
    },
    /// `libnvidia-tls` built for another TLS ABI.
    TlsAbi {
        /// The ABI tag found.
        found: String,
    },
    /// A GL library that is neither NVIDIA's nor GLVND (e.g. Mesa's).
    NotNvidiaGl {
        /// Its `DT_NEEDED` entries.
        needed: Vec<String>,
    },
    /// Another file with the same name is already planned for that directory.
    DuplicateName {
        /// The file kept.
        kept: PathBuf,
    },
}

impl fmt::Display for SkipReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SkipReason::NotInCache => f.write_str("no ld.so.cache entry"),
            SkipReason::NotFound => {
                f.write_str("not along PATH nor in the driver's bin next to its libraries")
            }
            SkipReason::HwcapVariant => f.write_str("hwcap variant; the plain copy is used"),
            SkipReason::NotElfEntry => f.write_str("cache entry is not an ELF library"),
            SkipReason::ForeignArch { flags } => write!(f, "foreign architecture ({flags})"),
            SkipReason::Unresolvable { error } => write!(f, "cannot resolve: {error}"),
            SkipReason::NotRegularFile => f.write_str("not a regular file"),
            SkipReason::NotExecutable => f.write_str("not executable"),
            SkipReason::NameMismatch => f.write_str("resolves to a file of another name"),
            SkipReason::Unversioned => f.write_str("no driver version in the file name (a stub?)"),
            SkipReason::OtherVersion { found } => write!(f, "belongs to driver {found}"),
            SkipReason::NotElf { error } => write!(f, "not ELF: {error}"),
            SkipReason::WrongElf { found } => write!(f, "wrong ELF kind: {found}"),
            SkipReason::TlsAbi { found } => write!(f, "TLS ABI {found}, not 2.3.99"),
            SkipReason::NotNvidiaGl { needed } => {
                write!(f, "not NVIDIA's or GLVND (needs {})", needed.join(", "))
            }
            SkipReason::DuplicateName { kept } => write!(f, "same name as {}", kept.display()),
        }
    }
}

/// A candidate that was not taken.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Skipped {
    /// The cache entry name, binary name, or library prefix.
    pub name: String,
    /// The path it was found as, inside the driver root.
    pub path: Option<PathBuf>,
    /// Why.
    #[serde(flatten)]
    pub reason: SkipReason,
}

/// Everything a volume for one driver version will hold, and what was left out.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct VolumePlan {
    /// The driver version.
    pub driver_version: DriverVersion,
    /// The driver root searched.
    pub driver_root: PathBuf,
    /// Files, sorted by directory and name.
    pub files: Vec<PlannedFile>,
    /// Symlinks, sorted by directory and name.
    pub links: Vec<PlannedLink>,
    /// Candidates not taken, in discovery order.
    pub skipped: Vec<Skipped>,
}

impl VolumePlan {
    /// Number of libraries of the driver version itself (`<name>.so.<version>` outside `bin/`).
    /// GLVND's loaders carry their own versions, and a host without NVIDIA's driver has them too,
    /// so they never make a plan worth building on their own.
    pub fn driver_library_count(&self) -> usize {
        let suffix = format!(".so.{}", self.driver_version);
        self.files
            .iter()
            .filter(|f| f.dir != VolumeDir::Bin && f.name.ends_with(&suffix))
            .count()
    }

    /// Total size of the files.
    pub fn total_bytes(&self) -> u64 {
        self.files.iter().map(|f| f.stamp.size).sum()
    }

    /// The files a GPU container needs that the plan lacks, of [`ESSENTIALS`]: `lib64/<name>.<driver
    /// version>` for the libraries, `bin/<name>` for the program.
    pub fn missing_essentials(&self) -> Vec<String> {
        ESSENTIALS
            .iter()
            .map(|&(dir, name)| match dir {
                VolumeDir::Bin => format!("bin/{name}"),
                _ => format!("{}/{name}.{}", dir.as_str(), self.driver_version),
            })
            .filter(|wanted| {
                !self
                    .files
                    .iter()
                    .any(|f| format!("{}/{}", f.dir.as_str(), f.name) == *wanted)
            })
            .collect()
    }
}

/// What a GPU container cannot do without: CUDA's driver library, NVML, and `nvidia-smi`.
pub const ESSENTIALS: [(VolumeDir, &str); 3] = [
    (VolumeDir::Lib64, "libcuda.so"),
    (VolumeDir::Lib64, "libnvidia-ml.so"),
    (VolumeDir::Bin, "nvidia-smi"),
];

/// Plans the volume for `version` from the driver under `driver_root`, with the default search
/// path and the native architecture.
pub fn plan(
    driver_root: &Path,
    cache: &LdCache,
    version: &DriverVersion,
) -> Result<VolumePlan, PlanError> {
    plan_from(&DriverSource::at(driver_root), cache, version)
}

/// Plans the volume for `version` from `source`.
#[tracing::instrument(skip_all, fields(root = %source.root.display(), version = %version))]
pub fn plan_from(
    source: &DriverSource,
    cache: &LdCache,
    version: &DriverVersion,
) -> Result<VolumePlan, PlanError> {
    std::fs::read_dir(&source.root)
        .at("read driver root", &source.root)
        .map_err(PlanError::DriverRoot)?;
    let Selection {
        files,
        links,
        skipped,
    } = select::select(source, cache, version);
    let plan = VolumePlan {
        driver_version: version.clone(),
        driver_root: source.root.clone(),
        files,
        links,
        skipped,
    };
    tracing::info!(
        files = plan.files.len(),
        links = plan.links.len(),
        skipped = plan.skipped.len(),
        bytes = plan.total_bytes(),
        "planned driver volume"
    );
    Ok(plan)
}

/// The newest driver version named by a `libnvidia-ml.so.<version>` file the cache points to,
/// and that file.
pub fn detect_driver_version(
    driver_root: &Path,
    cache: &LdCache,
) -> Result<(DriverVersion, PathBuf), PlanError> {
    let lib64 = HostArch::native().lib64.cache_arch;
    cache
        .entries()
        .filter(|e| e.flags.arch() == lib64 && e.hwcap == Hwcap::None)
        .filter(|e| {
            e.name
                .to_str()
                .is_some_and(|n| n.starts_with("libnvidia-ml.so"))
        })
        .filter_map(|e| resolve_in_root(driver_root, e.path).ok())
        .filter_map(|p| {
            let name = p.file_name()?.to_str()?;
            let version = DriverVersion::from_library_name(name)?;
            name.starts_with("libnvidia-ml.so.").then_some((version, p))
        })
        .max_by(|a, b| a.0.cmp(&b.0))
        .ok_or_else(|| PlanError::NoDriverVersion {
            root: driver_root.to_owned(),
        })
}

#[cfg(test)]
mod tests {
    use super::select::is_plain_name;
    use super::*;
    use crate::ldcache::fixture::new_image;
    use std::os::unix::fs::symlink;

    fn host_libc() -> PathBuf {
        [
            "/lib/x86_64-linux-gnu/libc.so.6",
            "/lib64/libc.so.6",
            "/usr/lib64/libc.so.6",
        ]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
        .expect("a glibc on this host")
    }

    fn version() -> DriverVersion {
        "550.54.14".parse().expect("version")
    }

    /// A driver root whose "libraries" are copies of the host's libc (a real 64-bit ELF shared
    /// object), named like driver files, and a cache pointing at them.
    fn fake_root(dir: &Path) -> LdCache {
        let lib = dir.join("usr/lib/x86_64-linux-gnu");
        std::fs::create_dir_all(&lib).expect("mkdir");
        std::fs::create_dir_all(dir.join("usr/local/cuda/lib64/stubs")).expect("mkdir");
        std::fs::create_dir_all(dir.join("usr/bin")).expect("mkdir");
        let libc = host_libc();
        for name in [
            "libnvidia-ml.so.550.54.14",
            "libcuda.so.550.54.14",
            "libnvidia-ml.so.470.82.01",
        ] {
            std::fs::copy(&libc, lib.join(name)).expect("copy");
        }
        std::fs::copy(&libc, dir.join("usr/local/cuda/lib64/stubs/libcuda.so")).expect("copy");
        symlink("libnvidia-ml.so.550.54.14", lib.join("libnvidia-ml.so.1")).expect("ln");
        symlink("libcuda.so.550.54.14", lib.join("libcuda.so.1")).expect("ln");
        symlink("/etc/passwd", lib.join("libnvidia-cfg.so.1")).expect("ln");
        std::fs::write(dir.join("usr/bin/nvidia-smi"), b"#!/bin/sh\n").expect("write");
        let x = crate::ldcache::EntryFlags::X86_64_LIBC6.0;
        LdCache::parse(&new_image(
            &[
                (
                    x,
                    "libnvidia-ml.so.1",
                    "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1",
                    0,
                ),
                (
                    x,
                    "libnvidia-ml.so.1",
                    "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.470.82.01",
                    0,
                ),
                (
                    x,
                    "libnvidia-cfg.so.1",
                    "/usr/lib/x86_64-linux-gnu/libnvidia-cfg.so.1",
                    0,
                ),
                (
                    x,
                    "libcuda.so.1",
                    "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
                    0,
                ),
                (x, "libcuda.so", "/usr/local/cuda/lib64/stubs/libcuda.so", 0),
                (0x0803, "libcuda.so.1", "/libx32/libcuda.so.1", 0),
                (x, "libz.so.1", "/usr/lib/x86_64-linux-gnu/libz.so.1", 0),
            ],
            &[],
        ))
        .expect("cache")
    }

    fn reason_for<'a>(plan: &'a VolumePlan, path: &str) -> &'a SkipReason {
        &plan
            .skipped
            .iter()
            .find(|s| s.path.as_deref() == Some(Path::new(path)))
            .unwrap_or_else(|| panic!("{path} not skipped: {:#?}", plan.skipped))
            .reason
    }

    #[test]
    fn takes_the_running_driver_and_says_why_not_the_rest() {
        if !cfg!(target_arch = "x86_64") {
            return;
        }
        let dir = tempfile::tempdir().expect("tempdir");
        let cache = fake_root(dir.path());
        let plan = plan(dir.path(), &cache, &version()).expect("plan");
        let names: Vec<_> = plan
            .files
            .iter()
            .map(|f| (f.dir, f.name.as_str()))
            .collect();
        assert_eq!(
            names,
            [
                (VolumeDir::Lib64, "libcuda.so.550.54.14"),
                (VolumeDir::Lib64, "libnvidia-ml.so.550.54.14")
            ]
        );
        let root = dir.path().join("usr/lib/x86_64-linux-gnu");
        assert_eq!(plan.files[1].source, root.join("libnvidia-ml.so.550.54.14"));
        assert_eq!(plan.files[1].soname.as_deref(), Some("libc.so.6"));
        assert_eq!(
            reason_for(&plan, "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.470.82.01"),
            &SkipReason::OtherVersion {
                found: "470.82.01".into()
            }
        );
        assert_eq!(
            reason_for(&plan, "/usr/local/cuda/lib64/stubs/libcuda.so"),
            &SkipReason::Unversioned
        );
        assert!(matches!(
            reason_for(&plan, "/usr/lib/x86_64-linux-gnu/libnvidia-cfg.so.1"),
            SkipReason::Unresolvable { .. }
        ));
        assert!(matches!(
            reason_for(&plan, "/libx32/libcuda.so.1"),
            SkipReason::ForeignArch { .. }
        ));
        assert!(
            plan.skipped
                .iter()
                .any(|s| s.name == "nvidia-smi" && matches!(s.reason, SkipReason::NotExecutable))
        );
        assert!(
            plan.skipped
                .iter()
                .any(|s| s.name == "libnvoptix.so" && s.reason == SkipReason::NotInCache)
        );
        let links: Vec<_> = plan
            .links
            .iter()
            .map(|l| (l.name.as_str(), l.target.as_str()))
            .collect();
        assert!(
            links.contains(&("libnvidia-ml.so.1", "libnvidia-ml.so.550.54.14")),
            "{links:?}"
        );
        assert!(
            links.contains(&("libcuda.so.1", "libcuda.so.550.54.14")),
            "{links:?}"
        );
        assert!(
            links.contains(&("libc.so.6", "libnvidia-ml.so.550.54.14")),
            "first file wins a link: {links:?}"
        );
    }

    #[test]
    fn a_link_to_a_host_file_is_never_taken_with_root_slash() {
        let dir = tempfile::tempdir().expect("tempdir");
        let link = dir.path().join("libnvidia-ml.so.1");
        symlink("/etc/passwd", &link).expect("ln");
        let x = crate::ldcache::EntryFlags::X86_64_LIBC6.0;
        let path = link.to_str().expect("utf-8");
        let cache =
            LdCache::parse(&new_image(&[(x, "libnvidia-ml.so.1", path, 0)], &[])).expect("cache");
        let plan = plan(Path::new("/"), &cache, &version()).expect("plan");
        assert!(
            plan.files.iter().all(|f| f.dir == VolumeDir::Bin),
            "{:?}",
            plan.files
        );
        let skipped = plan
            .skipped
            .iter()
            .find(|s| s.path.as_deref() == Some(link.as_path()));
        assert!(
            matches!(
                skipped.map(|s| &s.reason),
                Some(SkipReason::NameMismatch | SkipReason::Unresolvable { .. })
            ),
            "{skipped:?}"
        );
    }

    #[test]
    fn a_plan_without_nvidia_smi_misses_an_essential() {
        if !cfg!(target_arch = "x86_64") {
            return;
        }
        let dir = tempfile::tempdir().expect("tempdir");
        let cache = fake_root(dir.path());
        let plan = plan(dir.path(), &cache, &version()).expect("plan");
        assert_eq!(plan.missing_essentials(), ["bin/nvidia-smi"]);
    }

    #[test]
    fn detects_the_newest_nvml() {
        let dir = tempfile::tempdir().expect("tempdir");
        let cache = fake_root(dir.path());
        let (found, path) = detect_driver_version(dir.path(), &cache).expect("detected");
        if cfg!(target_arch = "x86_64") {
            assert_eq!(found, version());
            assert!(path.ends_with("libnvidia-ml.so.550.54.14"));
        }
        let empty = tempfile::tempdir().expect("tempdir");
        assert!(matches!(
            detect_driver_version(empty.path(), &cache),
            Err(PlanError::NoDriverVersion { .. })
        ));
    }

    #[test]
    fn missing_driver_root_is_an_error() {
        let cache = LdCache::parse(&new_image(&[], &[])).expect("cache");
        let err =
            plan(Path::new("/nonexistent-driver-root"), &cache, &version()).expect_err("no root");
        assert!(
            err.to_string().contains("/nonexistent-driver-root"),
            "{err}"
        );
    }

    #[test]
    fn plain_names() {
        for ok in ["libcuda.so", "libnvidia-ml.so.1"] {
            assert!(is_plain_name(ok));
        }
        for bad in ["", ".", "..", "a/b", "/etc/passwd", "a\0b"] {
            assert!(!is_plain_name(bad), "{bad:?}");
        }
    }
}
