//! What every command does with its output channels: a reader that has gone away (`mesos-gpu
//! info --json | head -c 10`) ends the command quietly with exit 0; under `--log-format json`
//! an error is one JSON object on stderr; old flag spellings still work, with a warning.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::{Command, Output, Stdio};

fn mesos_gpu() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_mesos-gpu"));
    cmd.env_remove("NVML_SIM_CONFIG")
        .env_remove("MESOS_GPU_NVML_LIB")
        .env_remove("MESOS_GPU_WORK_DIR")
        .env_remove("MESOS_GPU_AGENT_WORK_DIR")
        .env("MESOS_GPU_LOG", "warn");
    cmd
}

/// Runs `args` with stdout a real pipe whose read end is already closed: every write fails with
/// EPIPE, as when `head` has exited.
fn into_closed_pipe(args: &[&str]) -> Output {
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    mesos_gpu()
        .args(args)
        .stdin(Stdio::null())
        .stdout(writer)
        .stderr(Stdio::piped())
        .output()
        .unwrap()
}

/// Before: "mesos-gpu: error: Broken pipe (os error 32)", exit 1, for `--json` output (and a
/// panic for `gpu`'s). Now every printing command ends quietly with exit 0.
#[test]
fn a_closed_pipe_ends_every_command_quietly() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    let cases: &[&[&str]] = &[
        &["info", "--simulate", "dgx1-v100", "--json"],
        &["info", "--simulate", "dgx1-v100"],
        &["info", "--simulate", "list"],
        &["agent-flags", "--simulate", "dgx-a100-mig"],
        &[
            "cdi",
            "generate",
            "--simulate",
            "dgx1-v100",
            "--output",
            "-",
        ],
        &["demo", "--json"],
        &["demo"],
        &["gpu", "list", "--pool-dir", d],
        &["gpu", "list", "--pool-dir", d, "--json"],
        &["gpu", "health", "--agent-work-dir", d],
        &[
            "gpu",
            "health",
            "--agent-work-dir",
            d,
            "--json",
            "--simulate",
            "dgx1-v100",
        ],
        &["volume", "list", "--volume-root", d],
        &["volume", "list", "--volume-root", d, "--json"],
    ];
    for args in cases {
        let out = into_closed_pipe(args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{args:?}: {stderr}");
        for bad in ["rror", "Broken pipe", "panicked"] {
            assert!(!stderr.contains(bad), "{args:?}: {stderr}");
        }
    }
}

/// Before: errors stayed text under `--log-format json`. Now one JSON object, laid out as the
/// log lines are, holding the whole chain; exit 1 as before.
#[test]
fn errors_are_json_under_log_format_json() {
    let out = mesos_gpu()
        .args(["--log-format", "json", "info", "--simulate", "no-such-node"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8(out.stderr).unwrap();
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "{stderr}");
    let v: serde_json::Value = serde_json::from_str(lines[0]).expect("one JSON object");
    assert_eq!(v["level"], "ERROR");
    assert_eq!(v["target"], "mesos_gpu");
    assert!(
        v["timestamp"].as_str().is_some_and(|t| !t.is_empty()),
        "{v}"
    );
    let message = v["fields"]["message"].as_str().unwrap();
    assert!(
        message.contains("unknown simulated node \"no-such-node\""),
        "{v}"
    );
    assert!(!v["fields"]["chain"].as_array().unwrap().is_empty(), "{v}");
    let text = mesos_gpu()
        .args(["info", "--simulate", "no-such-node"])
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&text.stderr).starts_with("mesos-gpu: error: "),
        "text stays text"
    );
}

/// A command line, its environment, and the warning it must print.
type Deprecated<'a> = (&'a [&'a str], &'a [(&'a str, &'a str)], &'a str);

/// `--work-dir` meant the agent's work directory for `info` and `gpu` and the Docker record for
/// the Docker commands, and `volume` took `--root`: each still works, with a warning naming the
/// new flag (`--agent-work-dir`, `--docker-state-dir`, `--volume-root`); old and new together
/// are refused.
#[test]
fn old_flag_spellings_work_with_a_warning() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    let pool = dir.path().join("pool");
    let cases: [Deprecated<'_>; 4] = [
        (
            &["gpu", "health", "--work-dir", d],
            &[],
            "--work-dir is deprecated here: it names the mesos-agent's work directory; write --agent-work-dir",
        ),
        (
            &["info", "--simulate", "k80"],
            &[("MESOS_GPU_WORK_DIR", d)],
            "MESOS_GPU_WORK_DIR is deprecated: write MESOS_GPU_AGENT_WORK_DIR=",
        ),
        (
            &[
                "--simulate",
                "dgx1-v100",
                "docker-args",
                "--release",
                "3d8a52b4-1c5e-4f5a-9c1e-2b7d9a0e6f11",
                "--pool-dir",
                pool.to_str().unwrap(),
                "--work-dir",
                d,
            ],
            &[],
            "--work-dir is deprecated here: it names the Docker containers' record of reservations; write --docker-state-dir",
        ),
        (
            &["volume", "list", "--root", d],
            &[],
            "--root is deprecated: write --volume-root",
        ),
    ];
    for (args, env, warning) in cases {
        let out = mesos_gpu()
            .args(args)
            .envs(env.iter().copied())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(warning), "{args:?}: {stderr}");
        if args[0] != "--simulate" {
            assert_eq!(out.status.code(), Some(0), "{args:?}: {stderr}");
        }
    }
    let out = mesos_gpu()
        .args(["gpu", "health", "--work-dir", d, "--agent-work-dir", d])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("keep only --agent-work-dir"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
