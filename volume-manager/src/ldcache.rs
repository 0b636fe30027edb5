//! A reader for glibc's `ld.so.cache`, in all three layouts ldconfig writes.
//!
//! Facts relied on (glibc `sysdeps/generic/dl-cache.h`, `elf/cache.c`, `elf/dl-cache.c`; see
//! `docs/reference/ld-so-cache.md`). All integers are in host byte order.
//!
//! - **Old** (`ldconfig -c old`, libc5 / glibc 2.0–2.1): a 16-byte header (`"ld.so-1.7.0"`, NUL,
//!   `u32 nlibs`), then `nlibs` 12-byte entries `{i32 flags, u32 key, u32 value}`. Strings are
//!   relative to the end of the entry array.
//! - **New** (`glibc-ld.so.cache1.1`, the default since glibc 2.32): a 48-byte header (magic,
//!   `u32 nlibs`, `u32 len_strings`, `u8 flags` (endianness, glibc ≥ 2.33), 3 pad bytes,
//!   `u32 extension_offset`, 12 unused bytes), then `nlibs` 24-byte entries `{i32 flags, u32 key,
//!   u32 value, u32 osversion, u64 hwcap}`. Strings are relative to the start of this header.
//! - **Compat** (`ldconfig -c compat`): an old cache whose string table hides a new one, at the
//!   old entry array's end rounded up to 8. ldconfig and ld.so use only the new part.
//! - The extension directory (glibc ≥ 2.33) at a *file* offset: `u32 magic 0xEAA42174, u32 count`,
//!   then `count` sections `{tag, flags, offset, size}` (offsets from the start of the file). Tag 0
//!   is the generator string, tag 1 an array of `u32` string offsets naming the `glibc-hwcaps`
//!   subdirectories.
//! - An entry is in a `glibc-hwcaps/<name>/` subdirectory when `hwcap` has bit 62 set and no other
//!   bit in its upper half besides the 10 ISA-level bits; the low 32 bits index the hwcaps array.
//!   Both of glibc's readers (ld.so's `glibc_hwcaps_compare`, ldconfig's `glibc_hwcaps_string`)
//!   resolve those names from the start of the *file*; ldconfig writes them relative to the new
//!   header, so in a compat cache the names come out wrong for glibc too. We follow the readers.
//!
//! Parsing checks every offset against the input, so any input, truncated or hostile, gives an
//! error or a cache, never a panic or an out-of-bounds read.

#[cfg(test)]
pub(crate) mod fixture;
mod flags;
mod listing;

use std::ffi::OsStr;
use std::ops::Range;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use mesos_gpu_os::io::{IoContext as _, IoError};

use crate::rooted::resolve_in_root;

/// The step named when the cache cannot be read ("cannot read ld.so.cache <path>").
const READ: &str = "read ld.so.cache";

pub use flags::{CacheArch, EntryFlags, LibKind};

/// Where the cache lives, relative to a root directory.
pub const DEFAULT_CACHE: &str = "etc/ld.so.cache";

const OLD_MAGIC: &[u8] = b"ld.so-1.7.0";
const NEW_MAGIC: &[u8] = b"glibc-ld.so.cache1.1";
const OLD_HEADER: u64 = 16;
const OLD_ENTRY: u64 = 12;
const NEW_HEADER: u64 = 48;
const NEW_ENTRY: u64 = 24;
const EXTENSION_MAGIC: u32 = 0xEAA4_2174;
const EXTENSION_HEADER: u64 = 8;
const EXTENSION_SECTION: u64 = 16;
const TAG_GENERATOR: u32 = 0;
const TAG_GLIBC_HWCAPS: u32 = 1;
/// `DL_CACHE_HWCAP_EXTENSION`.
const HWCAP_EXTENSION: u64 = 1 << 62;
/// `DL_CACHE_HWCAP_ISA_LEVEL_MASK` (10 bits, in the upper half of `hwcap`).
const HWCAP_ISA_LEVEL_MASK: u64 = (1 << 10) - 1;
/// `cache_file_new_flags_endian_*` for this host; 0 means "not recorded".
const ENDIAN_CURRENT: u8 = if cfg!(target_endian = "little") { 2 } else { 3 };

/// The largest cache read, in bytes. glibc's caches take about 100 bytes per library (a few
/// hundred KiB on a full distribution); anything near this size is not a cache, and reading it
/// all (e.g. `/dev/zero`) would exhaust memory.
pub const MAX_CACHE_BYTES: u64 = 64 << 20;

/// Why a cache could not be read.
#[derive(Debug, thiserror::Error)]
pub enum LdCacheError {
    /// The file could not be read.
    #[error(transparent)]
    Read(IoError),
    /// The path names a device, FIFO, directory or socket, not a file.
    #[error("{path} is a {kind}, not a regular file; an ld.so.cache is a regular file")]
    NotRegular {
        /// The file (symlinks followed).
        path: PathBuf,
        /// What it is instead.
        kind: &'static str,
    },
    /// The file is larger than [`MAX_CACHE_BYTES`].
    #[error("{path} is larger than {max} bytes, the most an ld.so.cache is read to")]
    TooLarge {
        /// The file.
        path: PathBuf,
        /// The limit.
        max: u64,
    },
    /// The file at `path` is not a valid cache.
    #[error("invalid ld.so.cache {path}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        #[source]
        source: Box<LdCacheError>,
    },
    /// The input has no bytes at all.
    #[error("the cache is empty (0 bytes); run ldconfig to rebuild it")]
    Empty,
    /// The input starts with neither magic string. Its bytes are not shown: a path given as a
    /// cache may name any file, whose contents are not ours to print.
    #[error(
        "not an ld.so.cache: {len} bytes that start with neither \"ld.so-1.7.0\" nor \
         \"glibc-ld.so.cache1.1\""
    )]
    BadMagic {
        /// Input length.
        len: usize,
    },
    /// A structure runs past the end of the input.
    #[error("truncated cache: {what} needs bytes {start}..{end} but the cache has {len}")]
    Truncated {
        /// The structure.
        what: &'static str,
        /// Its first byte.
        start: u64,
        /// One past its last byte.
        end: u64,
        /// Input length.
        len: usize,
    },
    /// The new header records a byte order other than this host's.
    #[error(
        "the cache's endianness flags are {flags:#x}; this host reads {current:#x} (2 little, \
         3 big) or 0 (unrecorded)"
    )]
    Endianness {
        /// The header's flags byte.
        flags: u8,
        /// The value this host expects.
        current: u8,
    },
    /// An entry's name or path lies outside the input or has no terminating NUL.
    #[error("entry {index}: the {field} string at offset {offset} {why}")]
    BadString {
        /// Entry index.
        index: usize,
        /// `name` or `path`.
        field: &'static str,
        /// File offset of the string.
        offset: u64,
        /// What is wrong with it.
        why: &'static str,
    },
    /// The extension directory is malformed (glibc's ldconfig refuses such a cache too).
    #[error("malformed extension directory at offset {offset}: {why}")]
    Extension {
        /// File offset of the directory.
        offset: u64,
        /// What is wrong.
        why: &'static str,
    },
}

/// Reads the regular file at `path`, refusing anything else and anything larger than
/// [`MAX_CACHE_BYTES`]. `O_NONBLOCK` keeps `open` from waiting on a FIFO, which is then refused.
fn read_bounded(path: &Path) -> Result<Vec<u8>, LdCacheError> {
    use std::io::Read as _;
    use std::os::unix::fs::{FileTypeExt as _, OpenOptionsExt as _};

    let read_err = |source| LdCacheError::Read(IoError::new(READ, path, source));
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
        .map_err(read_err)?;
    let kind = file.metadata().map_err(read_err)?.file_type();
    if !kind.is_file() {
        let kind = if kind.is_dir() {
            "directory"
        } else if kind.is_char_device() {
            "character device"
        } else if kind.is_block_device() {
            "block device"
        } else if kind.is_fifo() {
            "FIFO"
        } else {
            "socket"
        };
        return Err(LdCacheError::NotRegular {
            path: path.to_owned(),
            kind,
        });
    }
    let mut bytes = Vec::new();
    // One byte more than the limit tells a file at the limit from a larger one (or one growing).
    file.take(MAX_CACHE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(read_err)?;
    if u64::try_from(bytes.len()).unwrap_or(u64::MAX) > MAX_CACHE_BYTES {
        return Err(LdCacheError::TooLarge {
            path: path.to_owned(),
            max: MAX_CACHE_BYTES,
        });
    }
    Ok(bytes)
}

/// Which of the three layouts a cache uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Layout {
    /// `ld.so-1.7.0` only.
    Old,
    /// `glibc-ld.so.cache1.1` only.
    New,
    /// Old header and entries, with a new cache hidden in the string table.
    Compat,
}

/// The hardware-capability qualifier of an entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hwcap<'a> {
    /// A library in a plain directory: usable everywhere.
    None,
    /// A legacy hwcap mask (`tls/`, `x86_64/` … subdirectories of glibc < 2.37); bit 63 is TLS.
    Legacy(u64),
    /// A library in a `glibc-hwcaps/<name>/` subdirectory (glibc ≥ 2.33).
    Subdirectory {
        /// Index into the cache's hwcaps name array.
        index: u32,
        /// The x86 ISA level the library needs.
        isa_level: u32,
        /// The subdirectory name, when the cache's extension data names it.
        name: Option<&'a OsStr>,
    },
}

impl Hwcap<'_> {
    /// The `hwcap` word as stored in the cache.
    pub fn raw(&self) -> u64 {
        match *self {
            Hwcap::None => 0,
            Hwcap::Legacy(mask) => mask,
            Hwcap::Subdirectory {
                index, isa_level, ..
            } => HWCAP_EXTENSION | (u64::from(isa_level) << 32) | u64::from(index),
        }
    }
}

/// One entry: a library name (SONAME or link name) and where the loader finds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheEntry<'a> {
    /// The name programs ask for, e.g. `libnvidia-ml.so.1`.
    pub name: &'a OsStr,
    /// The path the loader opens, e.g. `/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1`.
    pub path: &'a Path,
    /// Library kind and architecture.
    pub flags: EntryFlags,
    /// Minimum kernel version (old caches only; glibc ≥ 2.33 writes 0 and ignores it).
    pub osversion: u32,
    /// Hardware-capability qualifier.
    pub hwcap: Hwcap<'a>,
}

#[derive(Debug, Clone)]
struct RawEntry {
    flags: i32,
    name: Range<usize>,
    path: Range<usize>,
    osversion: u32,
    hwcap: u64,
    hwcap_name: Option<Range<usize>>,
}

/// A parsed cache. It owns one copy of the bytes; entries borrow from it.
#[derive(Debug, Clone)]
pub struct LdCache {
    data: Box<[u8]>,
    layout: Layout,
    entries: Vec<RawEntry>,
    generator: Option<Range<usize>>,
}

impl LdCache {
    /// Parses a cache image.
    pub fn parse(bytes: &[u8]) -> Result<LdCache, LdCacheError> {
        let data: Box<[u8]> = bytes.into();
        let (layout, entries, generator) = parse_image(&data)?;
        Ok(LdCache {
            data,
            layout,
            entries,
            generator,
        })
    }

    /// Reads and parses the cache file at `path` (a host path; symlinks are followed). Only a
    /// regular file of at most [`MAX_CACHE_BYTES`] is read.
    pub fn read(path: &Path) -> Result<LdCache, LdCacheError> {
        let bytes = read_bounded(path)?;
        LdCache::parse(&bytes).map_err(|e| LdCacheError::Invalid {
            path: path.to_owned(),
            source: Box::new(e),
        })
    }

    /// Reads `<root>/etc/ld.so.cache`, with symlinks resolved inside `root` as the driver's own
    /// file system sees them: a link to `/dev/zero` names `<root>/dev/zero`, not the host's.
    pub fn load(root: &Path) -> Result<LdCache, LdCacheError> {
        let named = root.join(DEFAULT_CACHE);
        let resolved = resolve_in_root(root, Path::new(DEFAULT_CACHE))
            .at(READ, &named)
            .map_err(LdCacheError::Read)?;
        let bytes = read_bounded(&resolved)?;
        LdCache::parse(&bytes).map_err(|e| LdCacheError::Invalid {
            path: named,
            source: Box::new(e),
        })
    }

    /// The layout the file uses.
    pub fn layout(&self) -> Layout {
        self.layout
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when the cache has no entries.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The entries, in file order (name descending, then flags descending; the order ld.so
    /// searches).
    pub fn entries(&self) -> impl ExactSizeIterator<Item = CacheEntry<'_>> + '_ {
        self.entries.iter().map(|raw| self.view(raw))
    }

    /// The ldconfig that wrote the cache (glibc ≥ 2.33), e.g. `ldconfig (Debian GLIBC 2.36-9)
    /// stable release version 2.36`.
    pub fn generator(&self) -> Option<&[u8]> {
        self.generator.clone().map(|r| &self.data[r])
    }

    fn view(&self, raw: &RawEntry) -> CacheEntry<'_> {
        let hwcap = if is_hwcap_extension(raw.hwcap) {
            Hwcap::Subdirectory {
                index: low32(raw.hwcap),
                isa_level: low32((raw.hwcap >> 32) & HWCAP_ISA_LEVEL_MASK),
                name: raw
                    .hwcap_name
                    .clone()
                    .map(|r| OsStr::from_bytes(&self.data[r])),
            }
        } else if raw.hwcap != 0 {
            Hwcap::Legacy(raw.hwcap)
        } else {
            Hwcap::None
        };
        CacheEntry {
            name: OsStr::from_bytes(&self.data[raw.name.clone()]),
            path: Path::new(OsStr::from_bytes(&self.data[raw.path.clone()])),
            flags: EntryFlags(raw.flags),
            osversion: raw.osversion,
            hwcap,
        }
    }
}

type Parsed = (Layout, Vec<RawEntry>, Option<Range<usize>>);

fn parse_image(data: &[u8]) -> Result<Parsed, LdCacheError> {
    if data.is_empty() {
        return Err(LdCacheError::Empty);
    }
    if data.starts_with(OLD_MAGIC) {
        return parse_old_or_compat(data);
    }
    if data.starts_with(NEW_MAGIC) {
        let (entries, generator) = parse_new(data, 0)?;
        return Ok((Layout::New, entries, generator));
    }
    Err(LdCacheError::BadMagic { len: data.len() })
}

fn parse_old_or_compat(data: &[u8]) -> Result<Parsed, LdCacheError> {
    let nlibs = read_u32(data, 12, "old header")?;
    let entries_end = OLD_HEADER + u64::from(nlibs) * OLD_ENTRY;
    check_range(data, OLD_HEADER, entries_end, "old entry array")?;
    // Where ldconfig puts the new cache: the old part rounded up to `alignof(cache_file_new)`.
    let new_start = entries_end.next_multiple_of(8);
    // ldconfig -p looks for it only when the file extends past a whole new header.
    if u64::try_from(data.len()).unwrap_or(u64::MAX) > new_start + NEW_HEADER
        && slice(data, new_start, new_start + 20).is_some_and(|m| m == NEW_MAGIC)
    {
        let (entries, generator) = parse_new(data, new_start)?;
        return Ok((Layout::Compat, entries, generator));
    }
    let mut entries = Vec::with_capacity(usize::try_from(nlibs).unwrap_or(0));
    for index in 0..u64::from(nlibs) {
        let at = OLD_HEADER + index * OLD_ENTRY;
        entries.push(raw_entry(data, at, entries_end, index, "old entry")?);
    }
    Ok((Layout::Old, entries, None))
}

/// Reads what old and new entries start with: `flags`, then the offsets of the name and the
/// path from `strings` (the end of the old entry array; the start of the new header). The
/// new-format fields are left empty.
fn raw_entry(
    data: &[u8],
    at: u64,
    strings: u64,
    index: u64,
    what: &'static str,
) -> Result<RawEntry, LdCacheError> {
    let flags = read_i32(data, at, what)?;
    let key = read_u32(data, at + 4, what)?;
    let value = read_u32(data, at + 8, what)?;
    let index = usize::try_from(index).unwrap_or(usize::MAX);
    Ok(RawEntry {
        flags,
        name: c_string(data, strings + u64::from(key), index, "name")?,
        path: c_string(data, strings + u64::from(value), index, "path")?,
        osversion: 0,
        hwcap: 0,
        hwcap_name: None,
    })
}

fn parse_new(
    data: &[u8],
    base: u64,
) -> Result<(Vec<RawEntry>, Option<Range<usize>>), LdCacheError> {
    check_range(data, base, base + NEW_HEADER, "new header")?;
    let nlibs = read_u32(data, base + 20, "new header")?;
    let endian = slice(data, base + 28, base + 29).map_or(0, |b| b[0]);
    if endian != 0 && (endian & 3) != ENDIAN_CURRENT {
        return Err(LdCacheError::Endianness {
            flags: endian,
            current: ENDIAN_CURRENT,
        });
    }
    let extension_offset = read_u32(data, base + 32, "new header")?;
    let entries_start = base + NEW_HEADER;
    check_range(
        data,
        entries_start,
        entries_start + u64::from(nlibs) * NEW_ENTRY,
        "new entry array",
    )?;
    let extensions = Extensions::load(data, extension_offset)?;
    let mut entries = Vec::with_capacity(usize::try_from(nlibs).unwrap_or(0));
    for index in 0..u64::from(nlibs) {
        let at = entries_start + index * NEW_ENTRY;
        let entry = raw_entry(data, at, base, index, "new entry")?;
        let hwcap = read_u64(data, at + 16, "new entry")?;
        entries.push(RawEntry {
            osversion: read_u32(data, at + 12, "new entry")?,
            hwcap,
            hwcap_name: extensions.hwcap_name(data, hwcap),
            ..entry
        });
    }
    Ok((entries, extensions.generator))
}

/// The extension sections glibc knows, located and checked as `cache_extension_load` does.
#[derive(Default)]
struct Extensions {
    generator: Option<Range<usize>>,
    hwcaps: Option<Range<usize>>,
}

impl Extensions {
    fn load(data: &[u8], offset: u32) -> Result<Extensions, LdCacheError> {
        let mut found = Extensions::default();
        if offset == 0 {
            return Ok(found);
        }
        let at = u64::from(offset);
        let bad = |why| LdCacheError::Extension { offset: at, why };
        if !offset.is_multiple_of(4) {
            return Err(bad("the offset is not a multiple of 4"));
        }
        if slice(data, at, at + EXTENSION_HEADER).is_none() {
            return Err(bad("the directory extends beyond the end of the file"));
        }
        if read_u32(data, at, "extension directory")? != EXTENSION_MAGIC {
            return Err(bad("wrong magic number"));
        }
        let count = read_u32(data, at + 4, "extension directory")?;
        let sections_end = at + EXTENSION_HEADER + u64::from(count) * EXTENSION_SECTION;
        if slice(data, at + EXTENSION_HEADER, sections_end).is_none() {
            return Err(bad("the section array extends beyond the end of the file"));
        }
        for i in 0..u64::from(count) {
            let s = at + EXTENSION_HEADER + i * EXTENSION_SECTION;
            let tag = read_u32(data, s, "extension section")?;
            let start = u64::from(read_u32(data, s + 8, "extension section")?);
            let size = u64::from(read_u32(data, s + 12, "extension section")?);
            let Some(range) = byte_range(data, start, start + size) else {
                return Err(bad("a section's data extends beyond the end of the file"));
            };
            match tag {
                TAG_GENERATOR => found.generator = Some(range),
                TAG_GLIBC_HWCAPS => found.hwcaps = Some(range),
                _ => {}
            }
        }
        // `cache_extension_verify`: the hwcaps array must be non-empty, 4-aligned, whole u32s.
        if let Some(r) = &found.hwcaps
            && (r.is_empty() || r.start % 4 != 0 || r.len() % 4 != 0)
        {
            found.hwcaps = None;
        }
        Ok(found)
    }

    /// The subdirectory name of a `glibc-hwcaps` entry, resolved as glibc's readers do.
    fn hwcap_name(&self, data: &[u8], hwcap: u64) -> Option<Range<usize>> {
        if !is_hwcap_extension(hwcap) {
            return None;
        }
        let array = self.hwcaps.as_ref()?;
        let slot = u64::try_from(array.start).ok()? + u64::from(low32(hwcap)) * 4;
        if slot + 4 > u64::try_from(array.end).ok()? {
            return None;
        }
        let string_at = read_u32(data, slot, "hwcaps array").ok()?;
        c_string_range(data, u64::from(string_at))
    }
}

fn is_hwcap_extension(hwcap: u64) -> bool {
    ((hwcap >> 32) & !HWCAP_ISA_LEVEL_MASK) == (HWCAP_EXTENSION >> 32)
}

fn low32(v: u64) -> u32 {
    u32::try_from(v & u64::from(u32::MAX)).unwrap_or(u32::MAX)
}

/// The NUL-terminated string starting at file offset `at`, without its NUL.
fn c_string(
    data: &[u8],
    at: u64,
    index: usize,
    field: &'static str,
) -> Result<Range<usize>, LdCacheError> {
    let bad = |why| LdCacheError::BadString {
        index,
        field,
        offset: at,
        why,
    };
    if byte_range(data, at, at + 1).is_none() {
        return Err(bad("is outside the cache"));
    }
    c_string_range(data, at).ok_or_else(|| bad("has no terminating NUL"))
}

fn c_string_range(data: &[u8], at: u64) -> Option<Range<usize>> {
    let start = usize::try_from(at).ok()?;
    let len = data.get(start..)?.iter().position(|&b| b == 0)?;
    Some(start..start + len)
}

fn byte_range(data: &[u8], start: u64, end: u64) -> Option<Range<usize>> {
    let start = usize::try_from(start).ok()?;
    let end = usize::try_from(end).ok()?;
    (start <= end && end <= data.len()).then_some(start..end)
}

fn slice(data: &[u8], start: u64, end: u64) -> Option<&[u8]> {
    byte_range(data, start, end).map(|r| &data[r])
}

fn check_range(data: &[u8], start: u64, end: u64, what: &'static str) -> Result<(), LdCacheError> {
    match byte_range(data, start, end) {
        Some(_) => Ok(()),
        None => Err(LdCacheError::Truncated {
            what,
            start,
            end,
            len: data.len(),
        }),
    }
}

fn read_array<const N: usize>(
    data: &[u8],
    at: u64,
    what: &'static str,
) -> Result<[u8; N], LdCacheError> {
    let end = at + u64::try_from(N).unwrap_or(u64::MAX);
    let Some(bytes) = slice(data, at, end) else {
        return Err(LdCacheError::Truncated {
            what,
            start: at,
            end,
            len: data.len(),
        });
    };
    let mut out = [0u8; N];
    out.copy_from_slice(bytes);
    Ok(out)
}

fn read_u32(data: &[u8], at: u64, what: &'static str) -> Result<u32, LdCacheError> {
    read_array(data, at, what).map(u32::from_ne_bytes)
}

fn read_i32(data: &[u8], at: u64, what: &'static str) -> Result<i32, LdCacheError> {
    read_array(data, at, what).map(i32::from_ne_bytes)
}

fn read_u64(data: &[u8], at: u64, what: &'static str) -> Result<u64, LdCacheError> {
    read_array(data, at, what).map(u64::from_ne_bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ldcache::fixture::new_image;
    use proptest::prelude::*;

    #[test]
    fn the_cache_link_is_resolved_inside_the_driver_root() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path();
        std::fs::create_dir_all(root.join("etc")).expect("mkdir");
        std::os::unix::fs::symlink("/dev/zero", root.join("etc/ld.so.cache")).expect("ln");
        // `<root>/dev/zero` does not exist: the host's /dev/zero is never opened.
        let err = LdCache::load(root).expect_err("dangling inside the root");
        assert!(
            matches!(&err, LdCacheError::Read(e) if e.kind() == std::io::ErrorKind::NotFound),
            "{err:?}"
        );
        std::fs::create_dir_all(root.join("dev")).expect("mkdir");
        std::fs::write(root.join("dev/zero"), sample()).expect("write");
        assert_eq!(LdCache::load(root).expect("the root's own file").len(), 4);
    }

    #[test]
    fn devices_fifos_and_directories_are_refused_without_reading() {
        let dir = tempfile::tempdir().expect("tempdir");
        let fifo = dir.path().join("fifo");
        let status = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .expect("mkfifo");
        assert!(status.success());
        for (path, kind) in [
            (Path::new("/dev/zero"), "character device"),
            (fifo.as_path(), "FIFO"),
            (dir.path(), "directory"),
        ] {
            match LdCache::read(path) {
                Err(LdCacheError::NotRegular { kind: got, .. }) => assert_eq!(got, kind),
                other => panic!("{}: {other:?}", path.display()),
            }
        }
    }

    #[test]
    fn a_file_past_the_limit_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("ld.so.cache");
        let file = std::fs::File::create(&path).expect("create");
        let mut image = sample();
        image.resize(usize::try_from(MAX_CACHE_BYTES).expect("fits"), 0);
        std::fs::write(&path, &image).expect("write");
        assert!(LdCache::read(&path).is_ok(), "a file at the limit is read");
        file.set_len(MAX_CACHE_BYTES + 1).expect("grow");
        let err = LdCache::read(&path).expect_err("too large");
        assert!(matches!(err, LdCacheError::TooLarge { .. }), "{err:?}");
        assert!(
            err.to_string().contains("larger than 67108864 bytes"),
            "{err}"
        );
    }

    fn sample() -> Vec<u8> {
        new_image(
            &[
                (
                    0x0303,
                    "libz.so.1",
                    "/lib/x86_64-linux-gnu/glibc-hwcaps/x86-64-v3/libz.so.1",
                    HWCAP_EXTENSION | (3 << 32),
                ),
                (0x0303, "libz.so.1", "/lib/x86_64-linux-gnu/libz.so.1", 0),
                (0x0003, "libz.so.1", "/lib32/libz.so.1", 0),
                (
                    0x0303,
                    "libnvidia-tls.so.1",
                    "/usr/lib/tls/libnvidia-tls.so.1",
                    1 << 63,
                ),
            ],
            &["x86-64-v3"],
        )
    }

    #[test]
    fn new_layout_entries_flags_and_hwcaps() {
        let cache = LdCache::parse(&sample()).expect("parses");
        assert_eq!(cache.layout(), Layout::New);
        assert_eq!(cache.len(), 4);
        let e: Vec<_> = cache.entries().collect();
        assert_eq!(e[0].name, "libz.so.1");
        assert_eq!(
            e[0].hwcap,
            Hwcap::Subdirectory {
                index: 0,
                isa_level: 3,
                name: Some(OsStr::new("x86-64-v3"))
            }
        );
        assert_eq!(e[0].hwcap.raw(), HWCAP_EXTENSION | (3 << 32));
        assert_eq!(e[1].hwcap, Hwcap::None);
        assert_eq!(e[1].flags.arch(), CacheArch::X86_64);
        assert_eq!(e[2].path, Path::new("/lib32/libz.so.1"));
        assert_eq!(e[2].flags.arch(), CacheArch::Default);
        assert_eq!(e[3].hwcap, Hwcap::Legacy(1 << 63));
        assert_eq!(
            cache.generator(),
            Some(&b"ldconfig (unit test) release version 2.36"[..])
        );
    }

    #[test]
    fn wrong_endianness_is_refused() {
        let mut image = sample();
        image[28] = if ENDIAN_CURRENT == 2 { 3 } else { 2 };
        assert!(matches!(
            LdCache::parse(&image),
            Err(LdCacheError::Endianness { .. })
        ));
        image[28] = 0;
        assert!(LdCache::parse(&image).is_ok(), "0 means unrecorded");
    }

    #[test]
    fn bad_inputs_name_the_problem() {
        assert!(matches!(LdCache::parse(b""), Err(LdCacheError::Empty)));
        let err = LdCache::parse(b"hello world").expect_err("no magic");
        assert!(
            err.to_string()
                .starts_with("not an ld.so.cache: 11 bytes that start with neither"),
            "{err}"
        );
        assert!(
            !err.to_string().contains("hello"),
            "the bytes are not shown: {err}"
        );
        let image = sample();
        assert!(matches!(
            LdCache::parse(&image[..60]),
            Err(LdCacheError::Truncated {
                what: "new entry array",
                ..
            })
        ));
        let mut unterminated = image.clone();
        let last_nul = unterminated.iter().rposition(|&b| b == 0).expect("has NUL");
        unterminated.truncate(last_nul);
        // Dropping the tail breaks the extension directory first.
        assert!(LdCache::parse(&unterminated).is_err());
    }

    #[test]
    fn string_out_of_bounds_is_an_error() {
        let mut image = sample();
        // Entry 1's key offset.
        image[48 + 24 + 4..48 + 24 + 8].copy_from_slice(&0x00ff_ffffu32.to_ne_bytes());
        let err = LdCache::parse(&image).expect_err("bad offset");
        assert!(
            matches!(
                err,
                LdCacheError::BadString {
                    index: 1,
                    field: "name",
                    ..
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn misaligned_hwcaps_section_is_dropped_like_glibc() {
        let image = sample();
        let cache = LdCache::parse(&image).expect("parses");
        let ext_at = usize::try_from(u32::from_ne_bytes(image[32..36].try_into().expect("4")))
            .expect("fits");
        let mut moved = image.clone();
        // Second section (hwcaps) offset field: make it odd.
        let field = ext_at + 8 + 16 + 8;
        let off = u32::from_ne_bytes(moved[field..field + 4].try_into().expect("4"));
        moved[field..field + 4].copy_from_slice(&(off + 1).to_ne_bytes());
        let moved = LdCache::parse(&moved).expect("still parses");
        let first = moved.entries().next().expect("entry");
        assert!(matches!(
            first.hwcap,
            Hwcap::Subdirectory { name: None, .. }
        ));
        assert_eq!(
            cache.entries().next().expect("entry").hwcap.raw(),
            first.hwcap.raw()
        );
    }

    proptest! {
        #[test]
        fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = LdCache::parse(&bytes);
        }

        #[test]
        fn random_bytes_after_a_magic_never_panic(
            old in any::<bool>(),
            tail in proptest::collection::vec(any::<u8>(), 0..512),
        ) {
            let mut bytes = if old { b"ld.so-1.7.0\0".to_vec() } else { NEW_MAGIC.to_vec() };
            bytes.extend_from_slice(&tail);
            if let Ok(cache) = LdCache::parse(&bytes) {
                for e in cache.entries() {
                    prop_assert!(!e.name.as_bytes().contains(&0));
                }
            }
        }

        #[test]
        fn mutated_caches_never_panic(
            edits in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..8),
            cut in any::<usize>(),
        ) {
            let mut image = sample();
            for (at, byte) in edits {
                let at = at % image.len();
                image[at] = byte;
            }
            image.truncate(cut % (image.len() + 1));
            let _ = LdCache::parse(&image).map(|c| c.entries().count());
        }
    }
}
