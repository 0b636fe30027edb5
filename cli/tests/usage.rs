//! One exit-code rule for every command (`cli/src/main.rs`, the operator guide's "Exit codes"):
//! 2 when the command line is refused before anything is done (clap's `error: …` and `--help`
//! hint, including values of the wrong form), 1 when a well-formed command fails.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::{Command, Output};

fn mesos_gpu(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_mesos-gpu"))
        .args(args)
        .env_remove("NVML_SIM_CONFIG")
        .env_remove("MESOS_GPU_NVML_LIB")
        .env("MESOS_GPU_LOG", "warn")
        .output()
        .expect("run mesos-gpu")
}

#[test]
fn malformed_values_are_usage_errors_in_every_command() {
    let work = tempfile::tempdir().unwrap();
    let dir = work.path().to_str().unwrap();
    for (args, value) in [
        (vec!["docker-args", "--gpus", "1.5"], "1.5"),
        (vec!["docker-args", "--gpus", "-1"], "-1"),
        (vec!["exec", "--gpus", "1.5", "--", "true"], "1.5"),
        (vec!["exec", "--gpus", "two", "--", "true"], "two"),
        (vec!["run", "--gpus", "0.5", "busybox"], "0.5"),
        (
            vec!["docker-args", "--gpus", "1", "--container-id", "x/y"],
            "x/y",
        ),
        (vec!["docker-args", "--release", "../etc"], "../etc"),
        (
            vec!["gpu", "mark-healthy", "abc", "--agent-work-dir", dir],
            "abc",
        ),
        (
            vec!["volume", "acquire", "a/b", "--volume-root", dir],
            "a/b",
        ),
        (
            vec!["volume", "plan", "--driver-version", "../../etc"],
            "../../etc",
        ),
        (vec!["info", "--no-such-flag"], "--no-such-flag"),
    ] {
        let out = mesos_gpu(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(
            stderr.starts_with("error: ") && stderr.contains(value),
            "{args:?}: {stderr}"
        );
    }
    assert!(
        std::fs::read_dir(work.path()).unwrap().next().is_none(),
        "a usage error changes nothing"
    );
}

#[test]
fn well_formed_commands_that_fail_exit_1() {
    let work = tempfile::tempdir().unwrap();
    let dir = work.path().to_str().unwrap();
    let out = mesos_gpu(&[
        "docker-args",
        "--simulate",
        "dgx1-v100",
        "--gpus",
        "9",
        "--plugin",
        "--docker-state-dir",
        dir,
        "--pool-dir",
        dir,
    ]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("mesos-gpu: error: ")
            && stderr.contains("gpus=9: expected a whole number from 0 to 8"),
        "{stderr}"
    );
}

#[test]
fn asking_for_gpus_on_a_node_without_any_says_why() {
    // nvml-sim without a node description: a driver library whose kernel module is not loaded.
    let work = tempfile::tempdir().unwrap();
    let lib = work.path().join("libnvidia-ml.so.1");
    std::fs::copy(mesos_gpu_testkit::nvml_sim::sim_library(), &lib).unwrap();
    let lib = lib.to_str().unwrap();
    let pool = work.path().join("pool");
    let pool = pool.to_str().unwrap();
    for args in [
        vec!["exec", "--gpus", "1", "--pool-dir", pool, "--", "true"],
        vec![
            "docker-args",
            "--gpus",
            "1",
            "--plugin",
            "--docker-state-dir",
            pool,
        ],
        vec![
            "run",
            "--gpus",
            "1",
            "--docker-state-dir",
            pool,
            "busybox",
            "true",
        ],
    ] {
        let mut all = vec!["--nvml-lib", lib];
        all.extend(&args);
        let out = mesos_gpu(&all);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(
            stderr.contains("gpus=1: this process sees no GPU (NVIDIA driver not loaded: ")
                && stderr.contains("): granting no GPU"),
            "{args:?}: {stderr}"
        );
        assert!(!stderr.contains("from 0 to 0"), "{stderr}");
    }
}
