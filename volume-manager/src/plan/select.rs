//! Choosing the files: walks the cache entries and the binary search path, applies the rules of
//! `plan.rs`, and returns what was taken, the links, and what was skipped with the reason.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use super::{
    ArchSlot, DriverSource, FileStamp, PlannedFile, PlannedLink, SkipReason, Skipped, VolumeDir,
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

    fn binaries(&mut self) {
        for &(name, capability) in catalog::BINARIES {
            let found = self.source.search_path.iter().find_map(|dir| {
                let found_as = dir.join(name);
                let resolved = resolve_in_root(&self.source.root, &found_as).ok()?;
                Some((found_as, resolved))
            });
            let verdict = match &found {
                None => Err(SkipReason::NotFound),
                Some((found_as, resolved)) => self.binary(name, capability, found_as, resolved),
            };
            match verdict {
                Ok(file) => self.files.push(file),
                Err(reason) => {
                    tracing::debug!(name, %reason, "skipped binary");
                    self.skipped.push(Skipped {
                        name: name.to_owned(),
                        path: found.map(|(found_as, _)| found_as),
                        reason,
                    });
                }
            }
        }
    }

    fn binary(
        &self,
        name: &str,
        capability: Capability,
        found_as: &Path,
        resolved: &Path,
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
        Ok(PlannedFile {
            dir: VolumeDir::Bin,
            name: name.to_owned(),
            source: resolved.to_owned(),
            found_as: found_as.to_owned(),
            capability,
            class: elf.class,
            soname: None,
            stamp: FileStamp::of(&meta),
        })
    }
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
    ElfInfo::read(path).map_err(|e| SkipReason::NotElf {
        error: std::error::Error::source(&e).map_or_else(|| e.to_string(), ToString::to_string),
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
