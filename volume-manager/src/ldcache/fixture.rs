//! Test-only writer of new-layout cache images, for unit tests of the reader and the planner.

use super::{ENDIAN_CURRENT, EXTENSION_MAGIC, NEW_MAGIC, TAG_GENERATOR, TAG_GLIBC_HWCAPS};

/// A new-layout image: header at 0, entries, strings (relative to the header), then an
/// extension directory with a generator and, when given, a hwcaps name array.
pub(crate) fn new_image(entries: &[(i32, &str, &str, u64)], hwcaps: &[&str]) -> Vec<u8> {
    let strings_start = 48 + 24 * entries.len();
    let mut strings = Vec::new();
    let mut fixed = Vec::new();
    for &(flags, name, path, hwcap) in entries {
        let key = strings_start + strings.len();
        strings.extend_from_slice(name.as_bytes());
        strings.push(0);
        let value = strings_start + strings.len();
        strings.extend_from_slice(path.as_bytes());
        strings.push(0);
        fixed.extend_from_slice(&flags.to_ne_bytes());
        fixed.extend_from_slice(&u32::try_from(key).expect("small").to_ne_bytes());
        fixed.extend_from_slice(&u32::try_from(value).expect("small").to_ne_bytes());
        fixed.extend_from_slice(&0u32.to_ne_bytes());
        fixed.extend_from_slice(&hwcap.to_ne_bytes());
    }
    let mut hwcap_offsets = Vec::new();
    for name in hwcaps {
        hwcap_offsets.push(u32::try_from(strings_start + strings.len()).expect("small"));
        strings.extend_from_slice(name.as_bytes());
        strings.push(0);
    }
    let ext_at = (strings_start + strings.len()).next_multiple_of(4);
    let mut out = Vec::new();
    out.extend_from_slice(NEW_MAGIC);
    out.extend_from_slice(&u32::try_from(entries.len()).expect("small").to_ne_bytes());
    out.extend_from_slice(&u32::try_from(strings.len()).expect("small").to_ne_bytes());
    out.extend_from_slice(&[ENDIAN_CURRENT, 0, 0, 0]);
    out.extend_from_slice(&u32::try_from(ext_at).expect("small").to_ne_bytes());
    out.extend_from_slice(&[0; 12]);
    out.extend_from_slice(&fixed);
    out.extend_from_slice(&strings);
    out.resize(ext_at, 0);
    let generator = b"ldconfig (unit test) release version 2.36";
    let sections: u32 = if hwcaps.is_empty() { 1 } else { 2 };
    let data_at = ext_at + 8 + 16 * usize::try_from(sections).expect("small");
    out.extend_from_slice(&EXTENSION_MAGIC.to_ne_bytes());
    out.extend_from_slice(&sections.to_ne_bytes());
    let hwcaps_len = 4 * hwcap_offsets.len();
    let mut section = |tag: u32, at: usize, len: usize| {
        for v in [
            tag,
            0,
            u32::try_from(at).expect("small"),
            u32::try_from(len).expect("small"),
        ] {
            out.extend_from_slice(&v.to_ne_bytes());
        }
    };
    section(TAG_GENERATOR, data_at + hwcaps_len, generator.len());
    if !hwcaps.is_empty() {
        section(TAG_GLIBC_HWCAPS, data_at, hwcaps_len);
    }
    for off in hwcap_offsets {
        out.extend_from_slice(&off.to_ne_bytes());
    }
    out.extend_from_slice(generator);
    out
}
