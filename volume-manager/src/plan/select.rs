//! Choosing the files: walks the cache entries and the binary search path, applies the rules of
//! `plan.rs`, and returns what was taken, the links, and what was skipped with the reason.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use super::{
    ArchSlot, DriverSource, FileStamp, PlannedFile, PlannedLink, ProgramOrigin, SkipReason,
    Skipped, VolumeDir,
};
use crate::catalog::{self, Capability, LibrarySpec, Rule};
use crate::elf_info::{ElfClass, ElfInfo};
use crate::ldcache::{Hwcap, LdCache};
use crate::rooted::resolve_in_root;
use crate::version::DriverVersion;

/// What [`select`] found.
pub(super) struct Selection {
    /// Files, sorted by directory and name.
    pub(super) files: Vec<PlannedFile>,
    /// Links, sorted by directory and name; none shadows a file.
    pub(super) links: Vec<PlannedLink>,
    /// Candidates not taken, in discovery order.
    pub(super) skipped: Vec<Skipped>,
}

/// Selects the files of `version` from `source`, using `cache` for libraries.
pub(super) fn select(source: &DriverSource, cache: &LdCache, version: &DriverVersion) -> Selection {
    let mut planner = Planner {
        source,
        version,
        files: Vec::new(),
        links: BTreeMap::new(),
        skipped: Vec::new(),
        seen: HashMap::new(),
    };
    planner.libraries(cache);
    planner.binaries();
    let Planner {
        mut files,
        links,
        skipped,
        ..
    } = planner;
    files.sort_by(|a, b| (a.dir, &a.name).cmp(&(b.dir, &b.name)));
    let taken: HashSet<(VolumeDir, &str)> =
        files.iter().map(|f| (f.dir, f.name.as_str())).collect();
    let links = links
        .into_iter()
        .filter(|((dir, name), _)| !taken.contains(&(*dir, name.as_str())))
        .map(|((dir, name), target)| PlannedLink { dir, name, target })
        .collect();
    Selection {
        files,
        links,
        skipped,
    }
}

struct Planner<'a> {
    source: &'a DriverSource,
    version: &'a DriverVersion,
    files: Vec<PlannedFile>,
    links: BTreeMap<(VolumeDir, String), String>,
    skipped: Vec<Skipped>,
    /// Resolved path → index in `files` (`None` when it was skipped).
    seen: HashMap<PathBuf, Option<usize>>,
}

/// Outcome of examining one candidate.
type Verdict = Result<PlannedFile, SkipReason>;

impl Planner<'_> {
    fn libraries(&mut self, cache: &LdCache) {
        let mut families: HashSet<&'static str> = HashSet::new();
        for entry in cache.entries() {
            let Some(name) = entry.name.to_str() else {
                continue;
            };
            let Some(spec) = catalog::library_spec(name) else {
                continue;
            };
            families.insert(spec.prefix);
            let skip = |reason| Skipped {
                name: name.to_owned(),
                path: Some(entry.path.to_owned()),
                reason,
            };
            if entry.hwcap != Hwcap::None {
                self.skipped.push(skip(SkipReason::HwcapVariant));
                continue;
            }
            if !entry.flags.is_elf() {
                self.skipped.push(skip(SkipReason::NotElfEntry));
                continue;
            }
            let Some(slot) = self.source.arch.slot(entry.flags.arch()) else {
                self.skipped.push(skip(SkipReason::ForeignArch {
                    flags: entry.flags.to_string(),
                }));
                continue;
            };
            let resolved = match resolve_in_root(&self.source.root, entry.path) {
                Ok(p) => p,
                Err(e) => {
                    self.skipped.push(skip(SkipReason::Unresolvable {
                        error: e.to_string(),
                    }));
                    continue;
                }
            };
            if let Some(&known) = self.seen.get(&resolved) {
                if let Some(index) = known {
                    let (dir, target) = (self.files[index].dir, self.files[index].name.clone());
                    self.add_link(dir, name, &target);
                }
                continue;
            }
            match self.library(spec, slot, entry.path, &resolved) {
                Ok(file) => self.take(file, name, spec),
                Err(reason) => {
                    tracing::debug!(name, path = %entry.path.display(), %reason, "skipped library");
                    self.seen.insert(resolved, None);
                    self.skipped.push(skip(reason));
                }
            }
        }
        for spec in catalog::LIBRARIES
            .iter()
            .filter(|s| !families.contains(s.prefix))
        {
            self.skipped.push(Skipped {
                name: spec.prefix.to_owned(),
                path: None,
                reason: SkipReason::NotInCache,
            });
        }
    }

    fn library(
        &self,
        spec: &LibrarySpec,
        slot: ArchSlot,
        found_as: &Path,
        resolved: &Path,
    ) -> Verdict {
        let meta = regular_file(resolved)?;
        let file_name = resolved
            .file_name()
            .and_then(|n| n.to_str())
            .filter(|n| n.starts_with(spec.prefix))
            .ok_or(SkipReason::NameMismatch)?;
        if matches!(spec.rule, Rule::Versioned | Rule::Tls) {
            self.check_version(spec, file_name)?;
        }
        let elf = read_elf(resolved)?;
        if elf.class != slot.class || elf.machine != slot.machine || !elf.is_shared_object {
            return Err(SkipReason::WrongElf {
                found: describe_elf(&elf),
            });
        }
        match spec.rule {
            Rule::Tls => match elf.abi_tag {
                Some(tag) if tag != catalog::TLS_ABI => {
                    let (os, a, b, c) = tag;
                    return Err(SkipReason::TlsAbi {
                        found: format!("{os}:{a}.{b}.{c}"),
                    });
                }
                _ => {}
            },
            Rule::CompatGl if elf.needs_any(catalog::GLVND_NEEDED) => {}
            Rule::CompatGl if elf.needs_any(catalog::NVIDIA_GL_NEEDED) => {
                self.check_version(spec, file_name)?;
            }
            Rule::CompatGl => {
                return Err(SkipReason::NotNvidiaGl {
                    needed: elf.needed.clone(),
                });
            }
            Rule::Versioned | Rule::Glvnd => {}
        }
        Ok(PlannedFile {
            dir: match elf.class {
                ElfClass::Elf64 => VolumeDir::Lib64,
                ElfClass::Elf32 => VolumeDir::Lib,
            },
            name: file_name.to_owned(),
            source: resolved.to_owned(),
            found_as: found_as.to_owned(),
            origin: None,
            capability: spec.capability,
            class: elf.class,
            soname: elf.soname.filter(|s| is_plain_name(s)),
            stamp: FileStamp::of(&meta),
        })
    }

    /// The file name must be exactly `<prefix>.<driver version>`.
    fn check_version(&self, spec: &LibrarySpec, file_name: &str) -> Result<(), SkipReason> {
        let suffix = file_name[spec.prefix.len()..].strip_prefix('.');
        match suffix {
            Some(v) if v == self.version.as_str() => Ok(()),
            Some(v) => match DriverVersion::from_library_name(file_name) {
                Some(found) if v == found.as_str() => Err(SkipReason::OtherVersion {
                    found: found.to_string(),
                }),
                _ => Err(SkipReason::Unversioned),
            },
            None if file_name == spec.prefix => Err(SkipReason::Unversioned),
            None => Err(SkipReason::NameMismatch),
        }
    }

    fn take(&mut self, file: PlannedFile, entry_name: &str, spec: &LibrarySpec) {
        if let Some(kept) = self
            .files
            .iter()
            .find(|f| f.dir == file.dir && f.name == file.name)
        {
            let reason = SkipReason::DuplicateName {
                kept: kept.source.clone(),
            };
            self.skipped.push(Skipped {
                name: entry_name.to_owned(),
                path: Some(file.found_as.clone()),
                reason,
            });
            self.seen.insert(file.source, None);
            return;
        }
        let (dir, name) = (file.dir, file.name.clone());
        let soname = file.soname.clone();
        self.seen
            .insert(file.source.clone(), Some(self.files.len()));
        self.files.push(file);
        let link_target = soname.clone().unwrap_or_else(|| name.clone());
        if let Some(soname) = &soname {
            self.add_link(dir, soname, &name);
        }
        self.add_link(dir, entry_name, &name);
        // Many programs dlopen("libcuda.so") although only the SONAME is meant to exist.
        if soname
            .as_deref()
            .is_some_and(|s| s.starts_with("libcuda.so."))
        {
            self.add_link(dir, "libcuda.so", &link_target);
        }
        // GLVND's indirect-rendering vendor library.
        if spec.prefix == "libGLX_nvidia.so" {
            self.add_link(dir, "libGLX_indirect.so.0", &link_target);
        }
    }

    fn add_link(&mut self, dir: VolumeDir, name: &str, target: &str) {
        if name == target || !is_plain_name(name) {
            return;
        }
        let existing = self
            .links
            .entry((dir, name.to_owned()))
            .or_insert_with(|| target.to_owned());
        if existing != target {
            tracing::debug!(name, target, kept = %existing, "link name already taken");
        }
    }

    /// Each program: the first candidate along the search path, then in the driver's `bin`
    /// dirs, that is a native executable of this driver; every candidate passed over is recorded.
    fn binaries(&mut self) {
        let dirs = self.program_dirs();
        for &(name, capability) in catalog::BINARIES {
            let mut taken = None;
            let mut passed_over = false;
            for (dir, origin) in &dirs {
                let found_as = dir.join(name);
                let Ok(resolved) = resolve_in_root(&self.source.root, &found_as) else {
                    continue;
                };
                match self.binary(name, capability, &found_as, &resolved, *origin) {
                    Ok(file) => {
                        taken = Some(file);
                        break;
                    }
                    Err(reason) => {
                        tracing::debug!(name, path = %found_as.display(), %reason, "skipped program candidate");
                        passed_over = true;
                        self.skipped.push(Skipped {
                            name: name.to_owned(),
                            path: Some(found_as),
                            reason,
                        });
                    }
                }
            }
            match taken {
                Some(file) => self.files.push(file),
                None if !passed_over => self.skipped.push(Skipped {
                    name: name.to_owned(),
                    path: None,
                    reason: SkipReason::NotFound,
                }),
                None => {}
            }
        }
    }

    /// The directories searched for programs, inside the root, in order: the search path, then
    /// the `bin` next to the directories `libnvidia-ml` and `libcuda` were taken from (the
    /// cache path's and the resolved file's), each directory once.
    fn program_dirs(&self) -> Vec<(PathBuf, ProgramOrigin)> {
        let mut dirs: Vec<(PathBuf, ProgramOrigin)> = Vec::new();
        let mut push = |dir: PathBuf, origin| {
            if !dirs.iter().any(|(d, _)| *d == dir) {
                dirs.push((dir, origin));
            }
        };
        for dir in &self.source.search_path {
            push(dir.clone(), ProgramOrigin::SearchPath);
        }
        let driver_libs = self.files.iter().filter(|f| {
            f.dir == VolumeDir::Lib64
                && (f.name.starts_with("libnvidia-ml.so.") || f.name.starts_with("libcuda.so."))
        });
        for file in driver_libs {
            let inside = Path::new("/").join(
                file.source
                    .strip_prefix(&self.source.root)
                    .unwrap_or(&file.source),
            );
            for lib in [&file.found_as, &inside] {
                if let Some(bin) = lib.parent().and_then(bin_beside) {
                    push(bin, ProgramOrigin::DriverBin);
                }
            }
        }
        dirs
    }

    fn binary(
        &self,
        name: &str,
        capability: Capability,
        found_as: &Path,
        resolved: &Path,
        origin: ProgramOrigin,
    ) -> Verdict {
        let meta = regular_file(resolved)?;
        if meta.permissions().mode() & 0o111 == 0 {
            return Err(SkipReason::NotExecutable);
        }
        let elf = read_elf(resolved)?;
        let native = self.source.arch.lib64;
        if elf.machine != native.machine || elf.class != native.class {
            return Err(SkipReason::WrongElf {
                found: describe_elf(&elf),
            });
        }
        match program_version(resolved, self.version) {
            Ok(ProgramVersion::Other(found)) => return Err(SkipReason::OtherVersion { found }),
            Ok(ProgramVersion::Ours | ProgramVersion::Unknown) => {}
            Err(e) => {
                return Err(SkipReason::Unresolvable {
                    error: e.to_string(),
                });
            }
        }
        Ok(PlannedFile {
            dir: VolumeDir::Bin,
            name: name.to_owned(),
            source: resolved.to_owned(),
            found_as: found_as.to_owned(),
            origin: Some(origin),
            capability,
            class: elf.class,
            soname: None,
            stamp: FileStamp::of(&meta),
        })
    }
}

/// The `bin` directory beside a library directory: `<prefix>/bin` for `<prefix>/lib64`,
/// `<prefix>/lib` and `<prefix>/lib/<multiarch triplet>`.
fn bin_beside(lib_dir: &Path) -> Option<PathBuf> {
    let name = lib_dir.file_name()?.to_str()?;
    let prefix = if name.contains("-linux-") {
        lib_dir.parent()?.parent()?
    } else if name.starts_with("lib") {
        lib_dir.parent()?
    } else {
        return None;
    };
    Some(prefix.join("bin"))
}

/// What driver version a program's text names.
#[derive(Debug, PartialEq, Eq)]
enum ProgramVersion {
    /// It holds the driver's version.
    Ours,
    /// It holds another driver's version (the first found) and not ours.
    Other(String),
    /// It holds no version-shaped text.
    Unknown,
}

/// The largest program read for its version; NVIDIA's are a few MiB.
const MAX_PROGRAM_BYTES: u64 = 256 << 20;

/// Reads the program at `path` and looks for driver versions in it.
fn program_version(path: &Path, ours: &DriverVersion) -> std::io::Result<ProgramVersion> {
    use std::io::Read as _;
    let mut bytes = Vec::new();
    std::fs::File::open(path)?
        .take(MAX_PROGRAM_BYTES)
        .read_to_end(&mut bytes)?;
    Ok(versions_in(&bytes, ours))
}

/// Classifies the driver-version-shaped tokens of `bytes` (`NNN.NN` or `NNN.NN.NN`: three digits,
/// then one or two groups of two or three digits, not part of a longer run of digits and dots).
fn versions_in(bytes: &[u8], ours: &DriverVersion) -> ProgramVersion {
    let mut other = None;
    let mut at = 0;
    while at < bytes.len() {
        let run = bytes[at..]
            .iter()
            .take_while(|b| b.is_ascii_digit() || **b == b'.')
            .count();
        if run == 0 {
            at += 1;
            continue;
        }
        let token = &bytes[at..at + run];
        at += run;
        // A sentence may end right after the version ("version 550.54.14.").
        let Ok(text) = std::str::from_utf8(token).map(|t| t.trim_matches('.')) else {
            continue;
        };
        let parts: Vec<&str> = text.split('.').collect();
        let shaped = (2..=3).contains(&parts.len())
            && parts[0].len() == 3
            && parts[1..].iter().all(|p| (2..=3).contains(&p.len()))
            && parts.iter().all(|p| p.bytes().all(|b| b.is_ascii_digit()));
        if !shaped {
            continue;
        }
        if text == ours.as_str() {
            return ProgramVersion::Ours;
        }
        other.get_or_insert_with(|| text.to_owned());
    }
    other.map_or(ProgramVersion::Unknown, ProgramVersion::Other)
}

fn regular_file(path: &Path) -> Result<std::fs::Metadata, SkipReason> {
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.is_file() => Ok(meta),
        Ok(_) => Err(SkipReason::NotRegularFile),
        Err(e) => Err(SkipReason::Unresolvable {
            error: e.to_string(),
        }),
    }
}

fn read_elf(path: &Path) -> Result<ElfInfo, SkipReason> {
    ElfInfo::read(path).map_err(|e| {
        let script = std::fs::File::open(path).ok().and_then(|f| {
            use std::io::Read as _;
            let mut start = [0u8; 2];
            f.take(2)
                .read_exact(&mut start)
                .ok()
                .map(|()| start == *b"#!")
        });
        SkipReason::NotElf {
            error: if script == Some(true) {
                "a #! script (a wrapper?)".to_owned()
            } else {
                std::error::Error::source(&e).map_or_else(|| e.to_string(), ToString::to_string)
            },
        }
    })
}

fn describe_elf(elf: &ElfInfo) -> String {
    let class = match elf.class {
        ElfClass::Elf32 => "ELF32",
        ElfClass::Elf64 => "ELF64",
    };
    let kind = if elf.is_shared_object {
        "shared object"
    } else {
        "not a shared object"
    };
    format!("{class}, machine {}, {kind}", elf.machine)
}

/// A single path component: no `/`, not `.` or `..`, not empty, at most 255 bytes.
pub(crate) fn is_plain_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 255
        && name != "."
        && name != ".."
        && !name.contains(['/', '\0'])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ours() -> DriverVersion {
        "580.159.04".parse().expect("version")
    }

    #[test]
    fn a_program_naming_its_driver_version_is_ours() {
        let text = b"\0NVIDIA-SMI version  : 580.159.04\0libnvidia-ml.so.1\0";
        assert_eq!(versions_in(text, &ours()), ProgramVersion::Ours);
        let also_older = b"from 470.82.01 on\0built as 580.159.04.\0";
        assert_eq!(versions_in(also_older, &ours()), ProgramVersion::Ours);
    }

    #[test]
    fn a_program_naming_only_other_versions_is_another_drivers() {
        let text = b"nvidia-persistenced: version 470.82.01.\0also 535.104\0";
        assert_eq!(
            versions_in(text, &ours()),
            ProgramVersion::Other("470.82.01".to_owned())
        );
    }

    #[test]
    fn numbers_that_are_not_driver_versions_say_nothing() {
        for text in [
            &b"OID 1.2.840.113549.1.1.11 and 10.0.0.1"[..],
            b"glibc 2.39, 3.14159, 1000.00.00, 58.159.04",
            b"",
            b"#!/bin/sh\nexec /usr/local/nvidia/bin/nvidia-smi \"$@\"\n",
        ] {
            assert_eq!(
                versions_in(text, &ours()),
                ProgramVersion::Unknown,
                "{}",
                String::from_utf8_lossy(text)
            );
        }
    }

    #[test]
    fn the_bin_beside_a_library_directory() {
        for (lib, bin) in [
            ("/usr/local/nvidia/lib64", Some("/usr/local/nvidia/bin")),
            ("/usr/local/nvidia/lib", Some("/usr/local/nvidia/bin")),
            ("/usr/lib/x86_64-linux-gnu", Some("/usr/bin")),
            ("/opt/driver/current", None),
        ] {
            assert_eq!(bin_beside(Path::new(lib)), bin.map(PathBuf::from), "{lib}");
        }
    }
}
