//! The systemd unit (`examples/systemd/mesos-gpu.service`) and its options file
//! (`examples/default/mesos-gpu`, installed as `/etc/default/mesos-gpu`) against the binary, so
//! that the shipped service never goes stale: the command line systemd builds from `ExecStart`
//! and `MESOS_GPU_SERVE_OPTS` must be accepted by `mesos-gpu serve` (clap checks every flag and
//! value given before `--help`), and every variable the options file sets must be one the code
//! reads.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn example(rel: &str) -> (PathBuf, String) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../examples")
        .join(rel);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    (path, text)
}

/// `KEY=value` lines of the options file (systemd's EnvironmentFile syntax, quotes removed).
fn environment() -> Vec<(String, String)> {
    let (_, text) = example("default/mesos-gpu");
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| {
            let (k, v) = l
                .split_once('=')
                .unwrap_or_else(|| panic!("not KEY=value: {l:?}"));
            let v = v
                .strip_prefix('"')
                .and_then(|v| v.strip_suffix('"'))
                .unwrap_or(v);
            (k.to_owned(), v.to_owned())
        })
        .collect()
}

/// The unit's `key=value` settings, in order.
fn unit() -> Vec<(String, String)> {
    let (_, text) = example("systemd/mesos-gpu.service");
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#') && !l.starts_with('['))
        .map(|l| {
            let (k, v) = l
                .split_once('=')
                .unwrap_or_else(|| panic!("not key=value: {l:?}"));
            (k.to_owned(), v.to_owned())
        })
        .collect()
}

fn setting<'a>(unit: &'a [(String, String)], key: &str) -> Vec<&'a str> {
    unit.iter()
        .filter(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
        .collect()
}

/// The argv systemd runs: `$VAR` words of ExecStart replaced by the variable's value split on
/// whitespace (systemd's unbraced expansion), program name dropped.
fn exec_start_args() -> Vec<String> {
    let unit = unit();
    let exec = setting(&unit, "ExecStart");
    assert_eq!(exec.len(), 1, "exactly one ExecStart: {exec:?}");
    let env = environment();
    let mut words = exec[0].split_whitespace();
    assert_eq!(words.next(), Some("/usr/bin/mesos-gpu"));
    words
        .flat_map(|w| match w.strip_prefix('$') {
            Some(var) => {
                let (_, value) = env.iter().find(|(k, _)| k == var).unwrap_or_else(|| {
                    panic!("ExecStart uses ${var}, which the options file does not set")
                });
                value.split_whitespace().map(str::to_owned).collect()
            }
            None => vec![w.to_owned()],
        })
        .collect()
}

fn mesos_gpu(args: &[String]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_mesos-gpu"))
        .args(args)
        .env("MESOS_GPU_LOG", "error")
        .output()
        .expect("run mesos-gpu")
}

#[test]
fn exec_start_is_accepted_by_serve() {
    let mut args = exec_start_args();
    assert_eq!(args.first().map(String::as_str), Some("serve"));
    assert!(args.len() > 2, "the options file passes no flag: {args:?}");
    args.push("--help".to_owned());
    let out = mesos_gpu(&args);
    assert!(
        out.status.success(),
        "mesos-gpu {args:?} was refused: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    // The same check fails on a flag serve does not have, and on a bad value.
    for bad in [["--no-such-flag"].as_slice(), &["--volume-mode", "mirror"]] {
        let mut args = exec_start_args();
        args.extend(bad.iter().map(|s| (*s).to_owned()));
        args.push("--help".to_owned());
        assert!(!mesos_gpu(&args).status.success(), "{args:?} accepted");
    }
}

/// Appends every `.rs` file under `dir` to `out`.
fn read_sources(dir: &Path, out: &mut String) {
    for entry in std::fs::read_dir(dir).expect("read_dir") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            read_sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push_str(&std::fs::read_to_string(&path).expect("read"));
        }
    }
}

#[test]
fn options_file_sets_only_variables_the_code_reads() {
    let mut source = String::new();
    read_sources(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
        &mut source,
    );
    assert!(source.contains("MESOS_GPU_LOG"), "cli/src not read");
    let (_, text) = example("default/mesos-gpu");
    // Active and commented-out (`#VAR=…`) settings alike.
    let names: Vec<&str> = text
        .lines()
        .map(|l| l.trim().trim_start_matches('#'))
        .filter_map(|l| l.split_once('=').map(|(k, _)| k))
        .filter(|k| !k.is_empty() && k.chars().all(|c| c.is_ascii_uppercase() || c == '_'))
        .collect();
    assert!(names.contains(&"MESOS_GPU_SERVE_OPTS"), "{names:?}");
    for name in names {
        if name == "MESOS_GPU_SERVE_OPTS" {
            continue; // read by the unit's ExecStart, checked above
        }
        assert!(
            source.contains(&format!("\"{name}\"")),
            "the options file sets {name}, which cli/src never reads"
        );
    }
}

#[test]
fn unit_has_what_the_package_relies_on() {
    let unit = unit();
    let one = |key: &str| -> String {
        let v = setting(&unit, key);
        assert_eq!(v.len(), 1, "{key}: {v:?}");
        v[0].to_owned()
    };
    assert_eq!(one("EnvironmentFile"), "-/etc/default/mesos-gpu");
    assert_eq!(one("Restart"), "on-failure");
    assert_eq!(one("WantedBy"), "multi-user.target");
    assert!(
        one("Before")
            .split_whitespace()
            .any(|u| u == "docker.service")
    );
    // serve needs /dev/nvidia* (NVML) and a writable /run and volume root.
    for key in [
        "PrivateDevices",
        "DevicePolicy",
        "ReadOnlyPaths",
        "InaccessiblePaths",
    ] {
        assert!(setting(&unit, key).is_empty(), "{key} would break serve");
    }
    assert!(
        setting(&unit, "ProtectSystem")
            .iter()
            .all(|v| *v != "strict"),
        "ProtectSystem=strict makes /run and the volume root read-only"
    );
    assert!(setting(&unit, "User").is_empty(), "serve runs as root");
}

/// The GPU pool is in one place in every shipped piece (before: the unit and the options file
/// put it under /var/run, wiped at reboot, while the guide said /var/lib/mesos-gpu): the
/// `--pool-dir` systemd passes to `serve` is the code's default, the `pool_dir` of both example
/// `modules.json` files and the `--pool-dir` of the hook's `docker_args` and of the Docker
/// wrapper; it is persistent (not under `/run`), and the Docker record (`--docker-state-dir`) is
/// another directory.
#[test]
fn the_pool_dir_is_one_persistent_place() {
    let args = exec_start_args();
    let value = |flag: &str| args.windows(2).find(|w| w[0] == flag).map(|w| w[1].clone());
    let pool = value("--pool-dir").expect("systemd passes serve --pool-dir");
    assert_eq!(pool, mesos_gpu_pool::DEFAULT_POOL_DIR);
    assert!(
        !pool.starts_with("/run/") && !pool.starts_with("/var/run/"),
        "the pool must survive a reboot: {pool}"
    );
    assert_ne!(value("--docker-state-dir").as_deref(), Some(pool.as_str()));
    let flag = format!("--pool-dir {pool} ");
    for rel in [
        "mesos-agent/modules.json",
        "mesos-agent/modules-docker.json",
    ] {
        let (_, text) = example(rel);
        let json: serde_json::Value = serde_json::from_str(&text).expect(rel);
        let params: Vec<&serde_json::Value> = json["libraries"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|l| l["modules"].as_array().into_iter().flatten())
            .flat_map(|m| m["parameters"].as_array().into_iter().flatten())
            .collect();
        let param = |key: &str| {
            params
                .iter()
                .find(|p| p["key"] == key)
                .and_then(|p| p["value"].as_str())
        };
        assert_eq!(param("pool_dir"), Some(pool.as_str()), "{rel}");
        if let Some(hook) = param("docker_args") {
            assert!(hook.contains(&flag), "{rel}: docker_args {hook:?}");
        }
    }
    let (_, wrapper) = example("mesos-agent/mesos-gpu-docker");
    assert!(wrapper.contains(&flag), "mesos-gpu-docker: {wrapper}");
}
