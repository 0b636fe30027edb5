//! `mesos-gpu volume` run as a process over a small driver root: plan, create, reuse, tamper and
//! verify (exit 1), rebuild, acquire/release, list and gc, text and JSON, and bad input.
//!
//! The "driver" is copies of the host's libc named like driver libraries (real ELF shared objects,
//! so no compiler is needed), with a new-layout ld.so.cache written here.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

const VERSION: &str = "550.54.14";

fn mesos_gpu(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_mesos-gpu"))
        .args(args)
        .env("MESOS_GPU_LOG", "warn")
        .output()
        .expect("run mesos-gpu")
}

/// A new-layout cache image: 48-byte header, 24-byte entries, strings relative to the header.
fn cache_image(entries: &[(&str, &str)]) -> Vec<u8> {
    let strings_at = 48 + 24 * entries.len();
    let mut strings = Vec::new();
    let mut fixed = Vec::new();
    for (name, path) in entries {
        let key = u32::try_from(strings_at + strings.len()).unwrap();
        strings.extend_from_slice(name.as_bytes());
        strings.push(0);
        let value = u32::try_from(strings_at + strings.len()).unwrap();
        strings.extend_from_slice(path.as_bytes());
        strings.push(0);
        fixed.extend_from_slice(&0x0303i32.to_ne_bytes());
        fixed.extend_from_slice(&key.to_ne_bytes());
        fixed.extend_from_slice(&value.to_ne_bytes());
        fixed.extend_from_slice(&[0; 12]);
    }
    let mut out = b"glibc-ld.so.cache1.1".to_vec();
    out.extend_from_slice(&u32::try_from(entries.len()).unwrap().to_ne_bytes());
    out.extend_from_slice(&u32::try_from(strings.len()).unwrap().to_ne_bytes());
    out.extend_from_slice(&[0; 20]);
    out.extend_from_slice(&fixed);
    out.extend_from_slice(&strings);
    out
}

struct Setup {
    _dir: tempfile::TempDir,
    driver: PathBuf,
    root: PathBuf,
}

impl Setup {
    fn new() -> Setup {
        let dir = tempfile::tempdir().unwrap();
        let driver = dir.path().join("driver");
        let lib = driver.join("usr/lib/x86_64-linux-gnu");
        std::fs::create_dir_all(&lib).unwrap();
        std::fs::create_dir_all(driver.join("etc")).unwrap();
        let libc = ["/lib/x86_64-linux-gnu/libc.so.6", "/lib64/libc.so.6"]
            .into_iter()
            .find(|p| Path::new(p).exists())
            .expect("host libc");
        for name in ["libnvidia-ml", "libcuda"] {
            std::fs::copy(libc, lib.join(format!("{name}.so.{VERSION}"))).unwrap();
            symlink(
                format!("{name}.so.{VERSION}"),
                lib.join(format!("{name}.so.1")),
            )
            .unwrap();
        }
        let image = cache_image(&[
            (
                "libnvidia-ml.so.1",
                "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1",
            ),
            ("libcuda.so.1", "/usr/lib/x86_64-linux-gnu/libcuda.so.1"),
        ]);
        std::fs::write(driver.join("etc/ld.so.cache"), image).unwrap();
        let root = dir.path().join("volumes");
        Setup {
            _dir: dir,
            driver,
            root,
        }
    }

    fn run(&self, args: &[&str]) -> Output {
        let mut all = args.to_vec();
        all.extend([
            "--driver-root",
            self.driver.to_str().unwrap(),
            "--volume-root",
            self.root.to_str().unwrap(),
        ]);
        mesos_gpu(&all)
    }

    fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    fn json(&self, args: &[&str]) -> Value {
        let mut all = args.to_vec();
        all.push("--json");
        serde_json::from_str(&self.ok(&all)).unwrap()
    }
}

#[test]
fn plan_create_verify_and_collect() {
    if !cfg!(target_arch = "x86_64") {
        return;
    }
    let s = Setup::new();
    let plan = s.json(&["volume", "plan"]);
    assert_eq!(plan["driver_version"], VERSION, "detected from the cache");
    let files: Vec<&str> = plan["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        files,
        [
            format!("libcuda.so.{VERSION}"),
            format!("libnvidia-ml.so.{VERSION}")
        ]
    );
    assert!(
        s.ok(&["volume", "plan"]).contains("no ld.so.cache entry"),
        "skips are explained"
    );

    let created = s.json(&["volume", "create"]);
    assert_eq!(created["outcome"], "created");
    assert_eq!(created["hardlinked"], 2);
    let path = PathBuf::from(created["path"].as_str().unwrap());
    assert!(path.ends_with(format!("nvidia_{VERSION}")));
    assert!(s.ok(&["volume", "create"]).starts_with("reused "));
    assert!(s.ok(&["volume", "verify"]).starts_with("intact: "));

    std::fs::write(path.join("lib64/extra.so"), b"x").unwrap();
    let out = s.run(&["volume", "verify"]);
    assert_eq!(out.status.code(), Some(1), "a damaged volume fails verify");
    assert!(String::from_utf8_lossy(&out.stdout).contains("lib64/extra.so: not in the manifest"));
    assert_eq!(
        s.json(&["volume", "create", "--copy"])["outcome"],
        "rebuilt"
    );
    assert!(
        s.ok(&["volume", "verify", "--metadata-only"])
            .starts_with("intact: ")
    );

    s.ok(&["volume", "acquire", "task-1"]);
    let list = s.json(&["volume", "list"]);
    assert_eq!(list[0]["holders"][0], "task-1");
    let gc = s.json(&["volume", "gc", "--all"]);
    assert_eq!(gc["kept"][0]["reason"], "in_use");
    s.ok(&["volume", "release", "task-1"]);
    let kept = s.json(&["volume", "gc"]);
    assert_eq!(
        kept["kept"][0]["reason"], "requested",
        "the current driver's volume stays"
    );
    let gc = s.json(&["volume", "gc", "--all"]);
    assert!(
        gc["removed"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p.as_str() == path.to_str())
    );
    assert!(!path.exists());
    assert!(s.ok(&["volume", "list"]).starts_with("VERSION"));
}

#[test]
fn bad_input_is_refused_clearly() {
    let s = Setup::new();
    let out = s.run(&["volume", "create", "--driver-version", "../../etc"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("expected dot-separated decimal numbers")
    );
    let out = s.run(&["volume", "create", "--driver-version", "470.82.01"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("has no library of that version"));
    let out = s.run(&["volume", "acquire", "a/b", "--driver-version", VERSION]);
    assert_eq!(
        out.status.code(),
        Some(2),
        "a malformed value is a usage error"
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("holder \"a/b\""));
    let out = mesos_gpu(&["volume", "plan", "--driver-root", "/nonexistent-root"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent-root"));
}

#[test]
fn create_refuses_a_version_with_only_glvnd_files() {
    if !cfg!(target_arch = "x86_64") {
        return;
    }
    let s = Setup::new();
    // libglvnd's loaders are on hosts without NVIDIA's driver too, with versions of their own.
    let lib = s.driver.join("usr/lib/x86_64-linux-gnu");
    std::fs::copy(
        lib.join(format!("libcuda.so.{VERSION}")),
        lib.join("libGLdispatch.so.0.0.0"),
    )
    .unwrap();
    symlink("libGLdispatch.so.0.0.0", lib.join("libGLdispatch.so.0")).unwrap();
    let image = cache_image(&[
        (
            "libnvidia-ml.so.1",
            "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1",
        ),
        ("libcuda.so.1", "/usr/lib/x86_64-linux-gnu/libcuda.so.1"),
        (
            "libGLdispatch.so.0",
            "/usr/lib/x86_64-linux-gnu/libGLdispatch.so.0",
        ),
    ]);
    std::fs::write(s.driver.join("etc/ld.so.cache"), image).unwrap();
    let plan = s.json(&["volume", "plan", "--driver-version", "470.82.01"]);
    let files: Vec<&str> = plan["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["name"].as_str().unwrap())
        .collect();
    assert_eq!(files, ["libGLdispatch.so.0.0.0"], "GLVND is planned");
    let out = s.run(&["volume", "create", "--driver-version", "470.82.01"]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("has no library of that version"),
        "{stderr}"
    );
    assert!(!s.root.join("nvidia_470.82.01").exists());
    let text = s.ok(&["volume", "plan", "--driver-version", "470.82.01"]);
    assert!(text.contains("no library of this driver version"), "{text}");
}
