//! `mesos-gpu ldcache` run as a process against `ldconfig -p`: the host's own cache and caches
//! that `ldconfig -C` writes in the new, compat and old layouts must list byte for byte alike.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn mesos_gpu(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_mesos-gpu"))
        .args(args)
        .env("MESOS_GPU_LOG", "warn")
        .output()
        .expect("run mesos-gpu")
}

fn ldconfig(args: &[&str]) -> Output {
    Command::new("ldconfig")
        .env("LC_ALL", "C")
        .args(args)
        .output()
        .expect("run ldconfig")
}

fn assert_same_lines(ours: &[u8], theirs: &[u8]) {
    let ours: Vec<_> = ours.split(|&b| b == b'\n').collect();
    let theirs: Vec<_> = theirs.split(|&b| b == b'\n').collect();
    for (i, (o, t)) in ours.iter().zip(&theirs).enumerate() {
        assert_eq!(
            String::from_utf8_lossy(o),
            String::from_utf8_lossy(t),
            "line {} differs",
            i + 1
        );
    }
    assert_eq!(ours.len(), theirs.len(), "line counts differ");
}

#[test]
fn host_cache_lists_exactly_like_ldconfig_p() {
    let ours = mesos_gpu(&["ldcache"]);
    assert!(
        ours.status.success(),
        "{}",
        String::from_utf8_lossy(&ours.stderr)
    );
    let theirs = ldconfig(&["-p"]);
    assert!(theirs.status.success());
    assert_same_lines(&ours.stdout, &theirs.stdout);
}

/// A root holding copies of a few host libraries (64-bit, 32-bit when present) and an ld.so.conf.
fn library_root(root: &Path) {
    let lib64 = root.join("lib64");
    let lib32 = root.join("lib32");
    std::fs::create_dir_all(&lib64).unwrap();
    std::fs::create_dir_all(&lib32).unwrap();
    std::fs::create_dir_all(root.join("etc")).unwrap();
    let mut copied = 0;
    for (dir, name) in [
        ("/lib/x86_64-linux-gnu", "libz.so.1"),
        ("/lib/x86_64-linux-gnu", "libm.so.6"),
        ("/lib64", "libz.so.1"),
    ] {
        let src = Path::new(dir).join(name);
        if src.exists() && !lib64.join(name).exists() {
            std::fs::copy(&src, lib64.join(name)).unwrap();
            copied += 1;
        }
    }
    for src in ["/usr/lib32/libc.so.6", "/lib32/libc.so.6"] {
        if Path::new(src).exists() {
            std::fs::copy(src, lib32.join("libc.so.6")).unwrap();
            break;
        }
    }
    assert!(copied > 0, "no host library to copy");
    std::fs::write(root.join("etc/ld.so.conf"), "/lib64\n/lib32\n").unwrap();
}

#[test]
fn ldconfig_written_caches_list_exactly_like_ldconfig_p() {
    let dir = tempfile::tempdir().unwrap();
    library_root(dir.path());
    for format in ["new", "compat", "old"] {
        let in_root = format!("/etc/test.{format}.cache");
        let root = dir.path().to_str().unwrap();
        let made = ldconfig(&[
            "-X",
            "-r",
            root,
            "-C",
            &in_root,
            "-f",
            "/etc/ld.so.conf",
            "-c",
            format,
        ]);
        assert!(
            made.status.success(),
            "{}",
            String::from_utf8_lossy(&made.stderr)
        );
        let cache: PathBuf = dir.path().join(in_root.trim_start_matches('/'));
        let cache = cache.to_str().unwrap();
        let ours = mesos_gpu(&["ldcache", "--cache", cache]);
        assert!(
            ours.status.success(),
            "{}",
            String::from_utf8_lossy(&ours.stderr)
        );
        let theirs = ldconfig(&["-p", "-C", cache]);
        assert!(theirs.status.success());
        assert_same_lines(&ours.stdout, &theirs.stdout);
        let json: serde_json::Value =
            serde_json::from_slice(&mesos_gpu(&["ldcache", "--cache", cache, "--json"]).stdout)
                .unwrap();
        assert_eq!(json["layout"], format);
        let listed = theirs.stdout.iter().filter(|&&b| b == b'\t').count();
        assert_eq!(json["entries"].as_array().unwrap().len(), listed);
    }
}

#[test]
fn a_bad_cache_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.cache");
    std::fs::write(&bad, b"not a cache at all").unwrap();
    let out = mesos_gpu(&["ldcache", "--cache", bad.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("not an ld.so.cache"), "{stderr}");
    let out = mesos_gpu(&["ldcache", "--cache", "/nonexistent/ld.so.cache"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/ld.so.cache"));
}

#[test]
fn ldcache_refuses_a_device_instead_of_reading_it() {
    let out = mesos_gpu(&["ldcache", "--cache", "/dev/zero"]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("/dev/zero is a character device, not a regular file"),
        "{stderr}"
    );
}

#[test]
fn volume_plan_resolves_the_cache_inside_the_driver_root() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    std::fs::create_dir_all(root.join("etc")).unwrap();
    std::os::unix::fs::symlink("/dev/zero", root.join("etc/ld.so.cache")).unwrap();
    let out = mesos_gpu(&["volume", "plan", "--driver-root", root.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("cannot read ld.so.cache") && stderr.contains("No such file"),
        "{stderr}"
    );
}
