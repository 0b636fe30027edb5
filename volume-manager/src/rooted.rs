//! Path resolution inside a driver root, as `realpath` would see it after `chroot(root)`.
//!
//! ld.so.cache paths and symlink targets are absolute paths of the driver's own file system
//! (`ldconfig -r <root>` writes them that way), so an absolute link target restarts at the root
//! and `..` never climbs above it. A hostile link (`libnvidia-ml.so.1 -> /etc/passwd`) therefore
//! resolves to `<root>/etc/passwd`, never to the host's file, unless the root is `/`.

use std::collections::VecDeque;
use std::ffi::OsString;
use std::io;
use std::path::{Component, Path, PathBuf};

/// Most symlinks followed in one resolution, as Linux's `MAXSYMLINKS`.
const MAX_LINKS: u32 = 40;

/// Resolves `path` inside `root`, following every symlink, and returns the host path of the
/// final object (which exists, as with `canonicalize`).
pub(crate) fn resolve_in_root(root: &Path, path: &Path) -> io::Result<PathBuf> {
    let mut resolved: Vec<OsString> = Vec::new();
    let mut pending: VecDeque<OsString> = VecDeque::new();
    push_front(&mut pending, &mut resolved, path);
    let mut links = 0;
    while let Some(name) = pending.pop_front() {
        match name.to_str() {
            Some("..") => {
                resolved.pop();
                continue;
            }
            Some("." | "") => continue,
            _ => {}
        }
        let candidate = join(root, &resolved).join(&name);
        let meta = std::fs::symlink_metadata(&candidate)?;
        if meta.file_type().is_symlink() {
            links += 1;
            if links > MAX_LINKS {
                return Err(io::Error::from_raw_os_error(libc::ELOOP));
            }
            let target = std::fs::read_link(&candidate)?;
            push_front(&mut pending, &mut resolved, &target);
        } else {
            if !pending.is_empty() && !meta.is_dir() {
                return Err(io::Error::from_raw_os_error(libc::ENOTDIR));
            }
            resolved.push(name);
        }
    }
    Ok(join(root, &resolved))
}

/// Queues `path`'s components before what is pending; an absolute path restarts at the root.
fn push_front(pending: &mut VecDeque<OsString>, resolved: &mut Vec<OsString>, path: &Path) {
    let mut parts = Vec::new();
    for component in path.components() {
        match component {
            Component::RootDir | Component::Prefix(_) => resolved.clear(),
            Component::CurDir => {}
            Component::ParentDir => parts.push(OsString::from("..")),
            Component::Normal(n) => parts.push(n.to_owned()),
        }
    }
    for part in parts.into_iter().rev() {
        pending.push_front(part);
    }
}

fn join(root: &Path, parts: &[OsString]) -> PathBuf {
    let mut out = root.to_owned();
    out.extend(parts);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    #[test]
    fn follows_relative_and_absolute_links_inside_the_root() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path();
        std::fs::create_dir_all(root.join("usr/lib/x86_64-linux-gnu")).expect("mkdir");
        std::fs::create_dir_all(root.join("lib")).expect("mkdir");
        std::fs::write(root.join("usr/lib/x86_64-linux-gnu/libfoo.so.1.2"), b"x").expect("write");
        symlink(
            "libfoo.so.1.2",
            root.join("usr/lib/x86_64-linux-gnu/libfoo.so.1"),
        )
        .expect("ln");
        symlink(
            "/usr/lib/x86_64-linux-gnu/libfoo.so.1",
            root.join("lib/libfoo.so"),
        )
        .expect("ln");
        let expect = root.join("usr/lib/x86_64-linux-gnu/libfoo.so.1.2");
        assert_eq!(
            resolve_in_root(root, Path::new("/lib/libfoo.so")).expect("resolves"),
            expect
        );
        assert_eq!(
            resolve_in_root(
                root,
                Path::new("/usr/lib/x86_64-linux-gnu/../x86_64-linux-gnu/libfoo.so.1")
            )
            .expect("resolves"),
            expect
        );
    }

    #[test]
    fn hostile_links_stay_inside_the_root() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path();
        std::fs::create_dir_all(root.join("lib")).expect("mkdir");
        symlink("/etc/passwd", root.join("lib/libnvidia-ml.so.1")).expect("ln");
        symlink(
            "../../../../../../etc/passwd",
            root.join("lib/libcuda.so.1"),
        )
        .expect("ln");
        for name in ["/lib/libnvidia-ml.so.1", "/lib/libcuda.so.1"] {
            let err = resolve_in_root(root, Path::new(name)).expect_err("no passwd in the root");
            assert_eq!(err.kind(), io::ErrorKind::NotFound, "{name}");
        }
        std::fs::create_dir_all(root.join("etc")).expect("mkdir");
        std::fs::write(root.join("etc/passwd"), b"fake").expect("write");
        assert_eq!(
            resolve_in_root(root, Path::new("/lib/libcuda.so.1")).expect("resolves"),
            root.join("etc/passwd")
        );
    }

    #[test]
    fn loops_and_files_used_as_directories_fail() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path();
        symlink("b", root.join("a")).expect("ln");
        symlink("a", root.join("b")).expect("ln");
        let err = resolve_in_root(root, Path::new("/a")).expect_err("loop");
        assert_eq!(err.raw_os_error(), Some(libc::ELOOP));
        std::fs::write(root.join("f"), b"x").expect("write");
        let err = resolve_in_root(root, Path::new("/f/g")).expect_err("not a dir");
        assert_eq!(err.raw_os_error(), Some(libc::ENOTDIR));
    }
}
