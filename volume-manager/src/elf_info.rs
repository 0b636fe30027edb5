//! The few facts the volume needs from a driver file's ELF headers, read with the `elf` crate's
//! streaming parser so that only the headers, the dynamic section, its string table and the ABI
//! note are read, never a 100 MB library whole.
//!
//! - Class (`EI_CLASS`) decides `lib/` (32-bit) or `lib64/`, as in Mesos's `volume.cpp`.
//! - `e_machine` must match the cache entry's architecture (x86-64 = 62, i386 = 3).
//! - `DT_SONAME` names the link loaders look for; `DT_NEEDED` tells NVIDIA's GL libraries from
//!   Mesa's (nvidia-docker 1.0 `blacklisted()`, libnvidia-container `select_libraries()`).
//! - The `.note.ABI-tag` of `libnvidia-tls` must say Linux 2.3.99 (the TLS ABI the driver needs).
//!
//! [`missing_dynamic_symbols`] reads the dynamic symbol table, which `dlsym` searches: `mesos-gpu
//! doctor` checks with it that a Mesos module library defines its modules, without loading it.

use std::fs::File;
use std::path::{Path, PathBuf};

use elf::ElfStream;
use elf::abi;
use elf::endian::AnyEndian;
use elf::file::Class;
use elf::note::Note;
use mesos_gpu_os::io::{IoContext as _, IoError};

/// Why an ELF file could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ElfError {
    /// The file could not be opened.
    #[error(transparent)]
    Open(IoError),
    /// The file is not a well-formed ELF object.
    #[error("{path} is not a readable ELF file")]
    Parse {
        /// The file.
        path: PathBuf,
        /// What the parser found.
        #[source]
        source: elf::ParseError,
    },
}

/// 32- or 64-bit ELF.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ElfClass {
    /// `ELFCLASS32`: goes to `lib/`.
    Elf32,
    /// `ELFCLASS64`: goes to `lib64/`.
    Elf64,
}

/// What was read from one ELF file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ElfInfo {
    pub(crate) class: ElfClass,
    pub(crate) machine: u16,
    pub(crate) is_shared_object: bool,
    pub(crate) soname: Option<String>,
    pub(crate) needed: Vec<String>,
    /// `(os, major, minor, subminor)` from the GNU ABI tag note.
    pub(crate) abi_tag: Option<(u32, u32, u32, u32)>,
}

impl ElfInfo {
    /// Reads the headers of the file at `path`.
    pub(crate) fn read(path: &Path) -> Result<ElfInfo, ElfError> {
        let file = File::open(path).at("open", path).map_err(ElfError::Open)?;
        read_stream(file).map_err(|source| ElfError::Parse {
            path: path.to_owned(),
            source,
        })
    }

    /// True when some `DT_NEEDED` entry starts with one of `prefixes`.
    pub(crate) fn needs_any(&self, prefixes: &[&str]) -> bool {
        self.needed
            .iter()
            .any(|n| prefixes.iter().any(|p| n.starts_with(p)))
    }
}

/// The names among `names` that the ELF file at `path` does not define as dynamic symbols, in
/// the order given: a `.dynsym` entry with a section (an undefined entry is a reference to
/// another object), which is what `dlsym` finds.
pub fn missing_dynamic_symbols<'a>(
    path: &Path,
    names: &[&'a str],
) -> Result<Vec<&'a str>, ElfError> {
    let file = File::open(path).at("open", path).map_err(ElfError::Open)?;
    missing_among(file, names).map_err(|source| ElfError::Parse {
        path: path.to_owned(),
        source,
    })
}

fn missing_among<'a>(file: File, names: &[&'a str]) -> Result<Vec<&'a str>, elf::ParseError> {
    let mut elf = ElfStream::<AnyEndian, _>::open_stream(file)?;
    let mut missing = names.to_vec();
    if let Some((symbols, strings)) = elf.dynamic_symbol_table()? {
        for symbol in symbols.iter().filter(|s| !s.is_undefined()) {
            let Ok(offset) = usize::try_from(symbol.st_name) else {
                continue;
            };
            let name = strings.get_raw(offset)?;
            missing.retain(|m| m.as_bytes() != name);
        }
    }
    Ok(missing)
}

fn read_stream(file: File) -> Result<ElfInfo, elf::ParseError> {
    let mut elf = ElfStream::<AnyEndian, _>::open_stream(file)?;
    let class = match elf.ehdr.class {
        Class::ELF32 => ElfClass::Elf32,
        Class::ELF64 => ElfClass::Elf64,
    };
    let machine = elf.ehdr.e_machine;
    let is_shared_object = elf.ehdr.e_type == abi::ET_DYN;

    let dynamic: Vec<(i64, u64)> = match elf.dynamic()? {
        Some(table) => table
            .iter()
            .take_while(|d| d.d_tag != abi::DT_NULL)
            .map(|d| (d.d_tag, d.d_val()))
            .collect(),
        None => Vec::new(),
    };
    let strtab_header = elf
        .section_headers()
        .iter()
        .find(|s| s.sh_type == abi::SHT_DYNAMIC)
        .and_then(|dynamic| {
            elf.section_headers()
                .get(usize::try_from(dynamic.sh_link).ok()?)
        })
        .copied();
    let (mut soname, mut needed) = (None, Vec::new());
    if let Some(header) = strtab_header {
        let strtab = elf.section_data_as_strtab(&header)?;
        for (tag, value) in &dynamic {
            let Ok(offset) = usize::try_from(*value) else {
                continue;
            };
            let name = || {
                strtab
                    .get_raw(offset)
                    .map(|raw| String::from_utf8_lossy(raw).into_owned())
            };
            match *tag {
                abi::DT_SONAME => soname = Some(name()?),
                abi::DT_NEEDED => needed.push(name()?),
                _ => {}
            }
        }
    }

    let abi_tag = match elf.section_header_by_name(".note.ABI-tag")?.copied() {
        Some(header) if header.sh_type == abi::SHT_NOTE => elf
            .section_data_as_notes(&header)?
            .find_map(|note| match note {
                Note::GnuAbiTag(t) => Some((t.os, t.major, t.minor, t.subminor)),
                _ => None,
            }),
        _ => None,
    };

    Ok(ElfInfo {
        class,
        machine,
        is_shared_object,
        soname,
        needed,
        abi_tag,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn libc_path() -> PathBuf {
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

    #[test]
    fn reads_the_hosts_libc() {
        let info = ElfInfo::read(&libc_path()).expect("libc parses");
        assert_eq!(info.soname.as_deref(), Some("libc.so.6"));
        assert!(info.is_shared_object);
        assert!(
            info.needed.iter().any(|n| n.starts_with("ld-linux")),
            "{info:?}"
        );
        if cfg!(target_arch = "x86_64") {
            assert_eq!(info.class, ElfClass::Elf64);
            assert_eq!(info.machine, abi::EM_X86_64);
        }
    }

    #[test]
    fn non_elf_files_are_errors() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("passwd");
        std::fs::write(&path, "root:x:0:0:root:/root:/bin/bash\n").expect("write");
        let err = ElfInfo::read(&path).expect_err("not ELF");
        assert!(matches!(err, ElfError::Parse { .. }), "{err}");
        assert!(matches!(
            ElfInfo::read(&dir.path().join("missing")),
            Err(ElfError::Open(_))
        ));
    }

    #[test]
    fn truncated_elf_is_an_error_not_a_panic() {
        let bytes = std::fs::read(libc_path()).expect("read libc");
        let dir = tempfile::tempdir().expect("tempdir");
        for len in [0, 4, 16, 52, 64, 200, 4096, bytes.len() / 2] {
            let path = dir.path().join(format!("cut{len}"));
            std::fs::write(&path, &bytes[..len.min(bytes.len())]).expect("write");
            let _ = ElfInfo::read(&path);
        }
    }

    #[test]
    fn dynamic_symbols_defined_are_told_from_those_missing() {
        let libc = libc_path();
        assert_eq!(
            missing_dynamic_symbols(&libc, &["malloc", "mgpu_no_such_symbol", "free"])
                .expect("libc parses"),
            ["mgpu_no_such_symbol"]
        );
        let dir = tempfile::tempdir().expect("tempdir");
        let text = dir.path().join("text");
        std::fs::write(&text, "not ELF").expect("write");
        assert!(matches!(
            missing_dynamic_symbols(&text, &["malloc"]),
            Err(ElfError::Parse { .. })
        ));
        assert!(matches!(
            missing_dynamic_symbols(&dir.path().join("missing"), &["malloc"]),
            Err(ElfError::Open(_))
        ));
    }

    #[test]
    fn needs_any_matches_prefixes() {
        let info = ElfInfo {
            class: ElfClass::Elf64,
            machine: abi::EM_X86_64,
            is_shared_object: true,
            soname: Some("libGL.so.1".into()),
            needed: vec!["libGLdispatch.so.0".into(), "libc.so.6".into()],
            abi_tag: None,
        };
        assert!(info.needs_any(&["libGLdispatch.so"]));
        assert!(!info.needs_any(&["libnvidia-glcore.so"]));
    }
}
