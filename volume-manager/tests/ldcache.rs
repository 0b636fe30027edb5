//! The cache reader against glibc's own `ldconfig`: the host's `/etc/ld.so.cache`, caches that
//! `ldconfig -C` writes in all three layouts, and hand-built old and compat images, each listed by
//! `ldconfig -p` and by [`LdCache::write_listing`] and compared byte for byte. Then mutated copies
//! of real caches, which must parse or fail, never panic.
//!
//! Needs glibc's `ldconfig` (always there on a glibc host) but no compiler: the libraries are
//! copies of the host's own.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use libtest_mimic::{Arguments, Failed, Trial};
use mesos_gpu_volume::LdCache;
use mesos_gpu_volume::ldcache::{Hwcap, Layout};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

fn main() -> ExitCode {
    let trials = vec![
        Trial::test(
            "host_cache_lists_like_ldconfig",
            host_cache_lists_like_ldconfig,
        ),
        Trial::test(
            "ldconfig_written_caches_list_alike",
            ldconfig_written_caches_list_alike,
        ),
        Trial::test("hand_built_old_layout", hand_built_old_layout),
        Trial::test("hand_built_compat_layout", hand_built_compat_layout),
        Trial::test(
            "every_flag_value_prints_like_ldconfig",
            every_flag_value_prints_like_ldconfig,
        ),
        Trial::test(
            "mutated_real_caches_never_panic",
            mutated_real_caches_never_panic,
        ),
    ];
    libtest_mimic::run(&Arguments::from_args(), trials).exit_code()
}

/// What `LC_ALL=C ldconfig -p -C <cache>` prints.
fn ldconfig_p(cache: &Path) -> Result<Vec<u8>, Failed> {
    let out = Command::new("ldconfig")
        .env("LC_ALL", "C")
        .arg("-p")
        .arg("-C")
        .arg(cache)
        .output()
        .map_err(|e| format!("cannot run ldconfig: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "ldconfig -p failed: {}",
            String::from_utf8_lossy(&out.stderr)
        )
        .into());
    }
    Ok(out.stdout)
}

fn our_listing(cache: &Path) -> Result<Vec<u8>, Failed> {
    let parsed = LdCache::read(cache).map_err(|e| format!("{cache:?}: {e}"))?;
    let mut out = Vec::new();
    parsed.write_listing(&mut out, cache)?;
    Ok(out)
}

fn compare_listings(cache: &Path) -> Result<usize, Failed> {
    let theirs = ldconfig_p(cache)?;
    let ours = our_listing(cache)?;
    let (theirs, ours) = (lines(&theirs), lines(&ours));
    for (i, (t, o)) in theirs.iter().zip(&ours).enumerate() {
        if t != o {
            return Err(format!(
                "{}: line {} differs:\n ldconfig: {}\n ours:     {}",
                cache.display(),
                i + 1,
                String::from_utf8_lossy(t),
                String::from_utf8_lossy(o)
            )
            .into());
        }
    }
    if theirs.len() != ours.len() {
        return Err(format!(
            "{}: ldconfig printed {} lines, we printed {}",
            cache.display(),
            theirs.len(),
            ours.len()
        )
        .into());
    }
    Ok(theirs.len())
}

fn lines(bytes: &[u8]) -> Vec<&[u8]> {
    bytes.split(|&b| b == b'\n').collect()
}

fn host_cache_lists_like_ldconfig() -> Result<(), Failed> {
    let n = compare_listings(Path::new("/etc/ld.so.cache"))?;
    if n < 3 {
        return Err(format!("the host cache listed only {n} lines").into());
    }
    Ok(())
}

/// Host libraries to build trees from: (source, 64-bit?).
fn host_libraries() -> Vec<(PathBuf, bool)> {
    let mut found = Vec::new();
    for dir in [
        "/lib/x86_64-linux-gnu",
        "/usr/lib/x86_64-linux-gnu",
        "/lib64",
    ] {
        for name in ["libz.so.1", "libc.so.6", "libm.so.6"] {
            let p = Path::new(dir).join(name);
            if p.exists()
                && !found
                    .iter()
                    .any(|(q, _): &(PathBuf, bool)| q.file_name() == p.file_name())
            {
                found.push((p, true));
            }
        }
    }
    for p in ["/usr/lib32/libc.so.6", "/lib32/libc.so.6"] {
        if Path::new(p).exists() {
            found.push((p.into(), false));
            break;
        }
    }
    found
}

/// A root with a few real libraries, a `glibc-hwcaps/x86-64-v3` copy and a 32-bit one, and an
/// ld.so.conf naming its directories.
fn library_tree(root: &Path) -> Result<(), Failed> {
    let lib64 = root.join("lib64");
    let lib32 = root.join("lib32");
    let hwcaps = lib64.join("glibc-hwcaps/x86-64-v3");
    for d in [&lib64, &lib32, &hwcaps, &root.join("etc")] {
        std::fs::create_dir_all(d)?;
    }
    let libs = host_libraries();
    if libs.is_empty() {
        return Err("no host libraries to copy".into());
    }
    for (src, is64) in &libs {
        let name = src.file_name().ok_or("no name")?;
        std::fs::copy(src, if *is64 { &lib64 } else { &lib32 }.join(name))?;
    }
    std::fs::copy(
        &libs[0].0,
        hwcaps.join(libs[0].0.file_name().ok_or("no name")?),
    )?;
    std::fs::write(root.join("etc/ld.so.conf"), "/lib64\n/lib32\n")?;
    Ok(())
}

fn ldconfig_write(root: &Path, cache_in_root: &str, format: &str) -> Result<PathBuf, Failed> {
    let status = Command::new("ldconfig")
        .env("LC_ALL", "C")
        .args(["-X", "-r"])
        .arg(root)
        .args(["-C", cache_in_root, "-f", "/etc/ld.so.conf", "-c", format])
        .status()
        .map_err(|e| format!("cannot run ldconfig: {e}"))?;
    if !status.success() {
        return Err(format!("ldconfig -c {format} failed: {status}").into());
    }
    Ok(root.join(cache_in_root.trim_start_matches('/')))
}

fn ldconfig_written_caches_list_alike() -> Result<(), Failed> {
    let dir = tempfile::tempdir()?;
    library_tree(dir.path())?;
    for (format, layout) in [
        ("new", Layout::New),
        ("compat", Layout::Compat),
        ("old", Layout::Old),
    ] {
        let cache = ldconfig_write(dir.path(), &format!("/etc/ld.so.cache.{format}"), format)?;
        compare_listings(&cache)?;
        let parsed = LdCache::read(&cache)?;
        if parsed.layout() != layout {
            return Err(format!("{format}: read as {:?}", parsed.layout()).into());
        }
        if parsed.len() < 3 {
            return Err(format!("{format}: only {} entries", parsed.len()).into());
        }
        let hwcap_entries = parsed
            .entries()
            .filter(|e| matches!(e.hwcap, Hwcap::Subdirectory { .. }))
            .count();
        // The old layout cannot say which entries are glibc-hwcaps ones.
        let expected = if layout == Layout::Old { 0 } else { 1 };
        if hwcap_entries != expected {
            return Err(format!(
                "{format}: {hwcap_entries} glibc-hwcaps entries, expected {expected}"
            )
            .into());
        }
        if layout == Layout::New {
            let named = parsed.entries().any(|e| {
                matches!(e.hwcap, Hwcap::Subdirectory { name: Some(n), .. } if n == "x86-64-v3")
            });
            if !named {
                return Err("the glibc-hwcaps entry lost its subdirectory name".into());
            }
        }
    }
    Ok(())
}

/// Old layout, as glibc 2.0–2.1 (and `ldconfig -c old`) write it:
///
/// ```text
/// 0   "ld.so-1.7.0"           11 bytes of magic, then 1 NUL byte of padding
/// 12  u32 nlibs
/// 16  nlibs × { i32 flags; u32 key; u32 value }      12 bytes each
/// 16+12·nlibs  strings; key and value are offsets from here
/// ```
fn old_image(entries: &[(i32, &str, &str)]) -> Vec<u8> {
    let mut strings = Vec::new();
    let mut fixed = Vec::new();
    for &(flags, name, path) in entries {
        let key = u32::try_from(strings.len()).unwrap_or(u32::MAX);
        strings.extend_from_slice(name.as_bytes());
        strings.push(0);
        let value = u32::try_from(strings.len()).unwrap_or(u32::MAX);
        strings.extend_from_slice(path.as_bytes());
        strings.push(0);
        fixed.extend_from_slice(&flags.to_ne_bytes());
        fixed.extend_from_slice(&key.to_ne_bytes());
        fixed.extend_from_slice(&value.to_ne_bytes());
    }
    let mut out = b"ld.so-1.7.0\0".to_vec();
    out.extend_from_slice(
        &u32::try_from(entries.len())
            .unwrap_or(u32::MAX)
            .to_ne_bytes(),
    );
    out.extend_from_slice(&fixed);
    out.extend_from_slice(&strings);
    out
}

/// Compat layout, as `ldconfig -c compat` writes it: an old cache whose string table starts with
/// a whole new cache.
///
/// ```text
/// 0    old header: "ld.so-1.7.0\0", u32 nlibs_old (an even count: ldconfig repeats the last)
/// 16   nlibs_old × 12-byte old entries
/// O =  16+12·nlibs_old; zero padding up to N = O rounded up to 8 (0 bytes when nlibs_old is even)
/// N    new header, 48 bytes:
///      "glibc-ld.so.cache1.1"  20 bytes, no NUL
///      N+20 u32 nlibs   N+24 u32 len_strings   N+28 u8 flags (2 = little-endian), 3 pad bytes
///      N+32 u32 extension_offset (0: none)      N+36 12 unused bytes
/// N+48 nlibs × { i32 flags; u32 key; u32 value; u32 osversion; u64 hwcap }   24 bytes each
///      strings; new keys/values are offsets from N, old ones from O
/// ```
fn compat_image(entries: &[(i32, &str, &str, u64)]) -> Vec<u8> {
    let nlibs = entries.len();
    let old_n = (nlibs + 1) & !1;
    let old_end = 16 + 12 * old_n;
    let new_at = old_end.next_multiple_of(8);
    let strings_at = 48 + 24 * nlibs; // relative to the new header
    let mut strings = Vec::new();
    let mut old = Vec::new();
    let mut new = Vec::new();
    let u32_of = |v: usize| u32::try_from(v).unwrap_or(u32::MAX);
    for &(flags, name, path, hwcap) in entries {
        let key = strings_at + strings.len();
        strings.extend_from_slice(name.as_bytes());
        strings.push(0);
        let value = strings_at + strings.len();
        strings.extend_from_slice(path.as_bytes());
        strings.push(0);
        let shift = new_at - old_end;
        for v in [
            flags.to_ne_bytes(),
            u32_of(shift + key).to_ne_bytes(),
            u32_of(shift + value).to_ne_bytes(),
        ] {
            old.extend_from_slice(&v);
        }
        new.extend_from_slice(&flags.to_ne_bytes());
        new.extend_from_slice(&u32_of(key).to_ne_bytes());
        new.extend_from_slice(&u32_of(value).to_ne_bytes());
        new.extend_from_slice(&0u32.to_ne_bytes());
        new.extend_from_slice(&hwcap.to_ne_bytes());
    }
    if old_n > nlibs {
        let last = old[old.len() - 12..].to_vec();
        old.extend_from_slice(&last);
    }
    let mut out = b"ld.so-1.7.0\0".to_vec();
    out.extend_from_slice(&u32_of(old_n).to_ne_bytes());
    out.extend_from_slice(&old);
    out.resize(new_at, 0);
    out.extend_from_slice(b"glibc-ld.so.cache1.1");
    out.extend_from_slice(&u32_of(nlibs).to_ne_bytes());
    out.extend_from_slice(&u32_of(strings.len()).to_ne_bytes());
    out.extend_from_slice(&[2, 0, 0, 0]);
    out.extend_from_slice(&0u32.to_ne_bytes());
    out.extend_from_slice(&[0; 12]);
    out.extend_from_slice(&new);
    out.extend_from_slice(&strings);
    out
}

fn write_fixture(dir: &Path, name: &str, bytes: &[u8]) -> Result<PathBuf, Failed> {
    let path = dir.join(name);
    std::fs::write(&path, bytes)?;
    Ok(path)
}

fn hand_built_old_layout() -> Result<(), Failed> {
    let dir = tempfile::tempdir()?;
    let entries = [
        (0x0303, "libnvidia-ml.so.1", "/usr/lib64/libnvidia-ml.so.1"),
        (0x0003, "libnvidia-ml.so.1", "/usr/lib/libnvidia-ml.so.1"),
        (0x0002, "libold.so.5", "/lib/libold.so.5"),
    ];
    let cache = write_fixture(dir.path(), "old.cache", &old_image(&entries))?;
    compare_listings(&cache)?;
    let parsed = LdCache::read(&cache)?;
    let got: Vec<_> = parsed
        .entries()
        .map(|e| (e.flags.0, e.name.to_owned(), e.path.to_owned()))
        .collect();
    let want: Vec<_> = entries
        .iter()
        .map(|&(f, n, p)| (f, n.into(), PathBuf::from(p)))
        .collect();
    if parsed.layout() != Layout::Old || got != want {
        return Err(format!("read {:?} {got:?}", parsed.layout()).into());
    }
    Ok(())
}

fn hand_built_compat_layout() -> Result<(), Failed> {
    let dir = tempfile::tempdir()?;
    let entries = [
        (
            0x0303,
            "libnvidia-tls.so.550.54.14",
            "/usr/lib64/tls/libnvidia-tls.so.550.54.14",
            1u64 << 63,
        ),
        (
            0x0303,
            "libnvidia-ml.so.1",
            "/usr/lib64/libnvidia-ml.so.1",
            0,
        ),
        (0x0003, "libnvidia-ml.so.1", "/usr/lib/libnvidia-ml.so.1", 0),
    ];
    let cache = write_fixture(dir.path(), "compat.cache", &compat_image(&entries))?;
    compare_listings(&cache)?;
    let parsed = LdCache::read(&cache)?;
    if parsed.layout() != Layout::Compat || parsed.len() != 3 {
        return Err(format!("read {:?} with {} entries", parsed.layout(), parsed.len()).into());
    }
    let first = parsed.entries().next().ok_or("no entry")?;
    if first.hwcap != Hwcap::Legacy(1 << 63) || first.name != "libnvidia-tls.so.550.54.14" {
        return Err(format!("first entry {first:?}").into());
    }
    Ok(())
}

/// Every library kind (0–4) × architecture byte (0x00–0x13), plus hwcap and osversion values,
/// listed by ldconfig and by us.
fn every_flag_value_prints_like_ldconfig() -> Result<(), Failed> {
    let dir = tempfile::tempdir()?;
    let mut names = Vec::new();
    for kind in 0..5 {
        for arch in 0..0x14 {
            names.push((kind | (arch << 8), format!("lib{kind}-{arch}.so"), 0u64));
        }
    }
    names.push((-1, "libminus.so".into(), 0));
    names.push((0x0303, "libtls.so".into(), 1 << 63));
    names.push((0x0303, "libone.so".into(), 1));
    names.push((0x0303, "libext.so".into(), (1 << 62) | (3 << 32) | 5));
    let entries: Vec<(i32, &str, String, u64)> = names
        .iter()
        .map(|(f, n, h)| (*f, n.as_str(), format!("/p/{n}"), *h))
        .collect();
    let borrowed: Vec<(i32, &str, &str, u64)> = entries
        .iter()
        .map(|(f, n, p, h)| (*f, *n, p.as_str(), *h))
        .collect();
    let cache = write_fixture(dir.path(), "flags.cache", &compat_image(&borrowed))?;
    compare_listings(&cache)?;
    Ok(())
}

fn mutated_real_caches_never_panic() -> Result<(), Failed> {
    let dir = tempfile::tempdir()?;
    library_tree(dir.path())?;
    let mut seeds = vec![std::fs::read("/etc/ld.so.cache")?];
    for format in ["new", "compat", "old"] {
        let cache = ldconfig_write(dir.path(), &format!("/etc/c.{format}"), format)?;
        seeds.push(std::fs::read(cache)?);
    }
    let strategy = (
        0..seeds.len(),
        proptest::collection::vec((any::<usize>(), any::<u8>()), 1..16),
        any::<usize>(),
    );
    let mut runner = TestRunner::new(Config {
        cases: 2000,
        failure_persistence: None,
        ..Config::default()
    });
    runner
        .run(&strategy, |(seed, edits, cut)| {
            let mut image = seeds[seed].clone();
            for (at, byte) in edits {
                // Half the edits land in the first 128 bytes, where the headers are.
                let at = if at % 2 == 0 {
                    at % image.len().min(128)
                } else {
                    at % image.len()
                };
                image[at] = byte;
            }
            image.truncate(cut % (image.len() + 1));
            if let Ok(cache) = LdCache::parse(&image) {
                let mut sink = Vec::new();
                cache
                    .write_listing(&mut sink, Path::new("x"))
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                let header = format!("{} libs", cache.len());
                prop_assert!(
                    sink.starts_with(header.as_bytes()),
                    "listing starts {:?}",
                    &sink[..sink.len().min(20)]
                );
            }
            Ok(())
        })
        .map_err(|e| Failed::from(e.to_string()))
}
