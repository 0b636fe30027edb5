//! Issue 18, NUMA pinning in the commands that need no root: `docker-args --numa-pinning` adds
//! `--cpuset-cpus`/`--cpuset-mems` for the reserved GPU (none when that leaves fewer CPUs than
//! `--cpus`), and `info` reports each GPU's local CPUs and memory nodes and what pinning gives a
//! task. Node `numa-2cpu`: GPU 0 is local to CPU 0, GPU 1 to CPU 1, both to memory node 0.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::{Command, Output};

fn mesos_gpu(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_mesos-gpu"))
        .args(["--simulate", "numa-2cpu"])
        .args(args)
        .env("MESOS_GPU_LOG", "warn")
        .output()
        .expect("run mesos-gpu")
}

fn text(out: &Output) -> String {
    format!(
        "status {}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Whether this machine has CPU `cpu` online (the tests run on the two-CPU CI machine).
fn online(cpu: u32) -> bool {
    let list = std::fs::read_to_string("/sys/devices/system/cpu/online").unwrap();
    list.trim()
        .split(',')
        .any(|part| match part.split_once('-') {
            Some((a, b)) => (a.parse::<u32>().unwrap()..=b.parse().unwrap()).contains(&cpu),
            None => part.parse::<u32>().unwrap() == cpu,
        })
}

#[test]
fn docker_args_pin_to_the_reserved_gpus_cpus() {
    let pool = tempfile::tempdir().unwrap();
    let dir = pool.path().to_str().unwrap();
    let args = |extra: &[&str]| {
        let mut a = vec![
            "docker-args",
            "--gpus",
            "1",
            "--plugin",
            "--docker-state-dir",
            dir,
            "--pool-dir",
            dir,
        ];
        a.extend_from_slice(extra);
        let out = mesos_gpu(&a);
        assert!(out.status.success(), "{}", text(&out));
        let line: Vec<String> = String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .map(str::to_owned)
            .collect();
        (line, String::from_utf8_lossy(&out.stderr).into_owned())
    };
    // First fit on an empty pool: GPU 0, local to CPU 0; then GPU 1, local to CPU 1.
    let (first, _) = args(&["--numa-pinning", "--cpus", "1"]);
    // GPU 0 at /dev/nvidia0 in the container (on the host, the simulated node's own node).
    assert!(
        first
            .iter()
            .any(|a| a.starts_with("--device=") && a.ends_with("/dev/nvidia0")),
        "{first:?}"
    );
    assert!(first.iter().any(|a| a == "--cpuset-cpus=0"), "{first:?}");
    assert!(first.iter().any(|a| a == "--cpuset-mems=0"), "{first:?}");
    let (second, _) = args(&["--numa-pinning"]);
    if online(1) {
        assert!(second.iter().any(|a| a == "--cpuset-cpus=1"), "{second:?}");
    }
    // Both GPUs are taken; give them back.
    for line in [&first, &second] {
        let name = line[0].strip_prefix("--name=mesos-").unwrap();
        let out = mesos_gpu(&[
            "docker-args",
            "--release",
            name,
            "--docker-state-dir",
            dir,
            "--pool-dir",
            dir,
        ]);
        assert!(out.status.success(), "{}", text(&out));
    }
    let (greedy, log) = args(&["--numa-pinning", "--cpus", "2"]);
    assert!(
        !greedy.iter().any(|a| a.starts_with("--cpuset")),
        "{greedy:?}"
    );
    assert!(log.contains("fewer than the cpus=2 it asked for"), "{log}");
    let (plain, _) = args(&[]);
    assert!(
        !plain.iter().any(|a| a.starts_with("--cpuset")),
        "{plain:?}"
    );
}

#[test]
fn info_reports_affinities_and_pinning() {
    let out = mesos_gpu(&["info", "--json"]);
    assert!(out.status.success(), "{}", text(&out));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    for (index, cpu) in [(0u32, "0"), (1, "1")] {
        let gpu = &json["gpus"][index as usize];
        assert_eq!(gpu["cpu_affinity"], cpu, "{gpu}");
        assert_eq!(gpu["memory_affinity"], "0", "{gpu}");
        if online(index) {
            assert_eq!(gpu["pinned_cpus"], cpu, "{gpu}");
            assert_eq!(gpu["pinned_mems"], "0", "{gpu}");
        }
    }
    let out = mesos_gpu(&["info"]);
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        table.contains("NUMA pinning (module parameter numa_pinning=on, --numa-pinning)")
            && table.contains("  GPU0: CPUs 0, memory nodes 0\n"),
        "{table}"
    );
}

#[test]
fn demo_reports_what_pinning_gives() {
    let out = mesos_gpu(&["demo", "--json"]);
    assert!(out.status.success(), "{}", text(&out));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let notes = json["notes"].as_array().unwrap();
    assert!(
        notes.iter().any(|n| n.as_str().is_some_and(
            |n| n.ends_with("GPU 0 → CPUs 0, memory nodes 0; GPU 1 → CPUs 1, memory nodes 0")
        )),
        "{notes:?}"
    );
}
