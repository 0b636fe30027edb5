//! `mesos-gpu info` run as a process: every shipped simulated node, `--json`, a missing driver,
//! `--simulate list`, unknown names and node description files.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::{Command, Output};

use serde_json::Value;

fn mesos_gpu(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_mesos-gpu"))
        .args(args)
        .env_remove("NVML_SIM_CONFIG")
        .env_remove("MESOS_GPU_NVML_LIB")
        .env("MESOS_GPU_LOG", "warn")
        .output()
        .expect("run mesos-gpu")
}

fn ok(args: &[&str]) -> String {
    let out = mesos_gpu(args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{args:?} failed: {stderr}");
    String::from_utf8(out.stdout).expect("utf-8")
}

fn json(args: &[&str]) -> Value {
    let mut args = args.to_vec();
    args.push("--json");
    serde_json::from_str(&ok(&args)).expect("valid JSON")
}

/// The rows of the `Topology:` table, without the affinity columns: `[["GPU0", "X", "NV1", …]]`.
fn topology(text: &str, gpus: usize) -> Vec<Vec<String>> {
    let section = text
        .split("Topology:\n")
        .nth(1)
        .expect("a Topology section");
    section
        .lines()
        .skip(1)
        .take_while(|l| l.starts_with("GPU"))
        .map(|l| {
            l.split_whitespace()
                .take(gpus + 1)
                .map(str::to_owned)
                .collect()
        })
        .collect()
}

/// The GPU table's rows, split into columns.
fn gpu_rows(text: &str) -> Vec<Vec<String>> {
    let table = text.split("IDX").nth(1).expect("a GPU table");
    table
        .lines()
        .skip(1)
        .take_while(|l| !l.is_empty())
        .map(|l| l.split_whitespace().map(str::to_owned).collect())
        .collect()
}

fn rows(rows: &[&str]) -> Vec<Vec<String>> {
    rows.iter()
        .map(|r| r.split_whitespace().map(str::to_owned).collect())
        .collect()
}

#[test]
fn dgx1_v100_table_and_matrix() {
    let text = ok(&["info", "--simulate", "dgx1-v100"]);
    assert!(
        text.starts_with("Simulated node: dgx1-v100\nNVIDIA driver 550.54.14, CUDA 12.4\n8 GPUs\n"),
        "{text}"
    );
    let gpus = gpu_rows(&text);
    assert_eq!(gpus.len(), 8);
    assert_eq!(
        gpus[0][..6],
        ["0", "0", "Tesla", "V100-SXM2-16GB", "16160", "MiB"]
    );
    assert_eq!(gpus[4][7], "00000000:85:00.0");
    assert!(
        gpus.iter().all(|g| g[9] == "ok" && g[10] == "-"),
        "healthy, no device node: {gpus:?}"
    );
    assert_eq!(
        topology(&text, 8),
        rows(&[
            "GPU0 X   NV1 NV1 NV2 NV2 SYS SYS SYS",
            "GPU1 NV1 X   NV2 NV1 SYS NV2 SYS SYS",
            "GPU2 NV1 NV2 X   NV2 SYS SYS NV1 SYS",
            "GPU3 NV2 NV1 NV2 X   SYS SYS SYS NV1",
            "GPU4 NV2 SYS SYS SYS X   NV1 NV1 NV2",
            "GPU5 SYS NV2 SYS SYS NV1 X   NV2 NV1",
            "GPU6 SYS SYS NV1 SYS NV1 NV2 X   NV2",
            "GPU7 SYS SYS SYS NV1 NV2 NV1 NV2 X",
        ])
    );
    let gpu4 = text.lines().find(|l| l.starts_with("GPU4 ")).unwrap();
    assert!(
        gpu4.ends_with("20-39,60-79   1"),
        "CPU and NUMA affinity: {gpu4:?}"
    );
    assert!(
        text.contains("Note: simulated node: device nodes are not read"),
        "{text}"
    );
}

#[test]
fn pcie_t4x4_switches_and_sockets() {
    let text = ok(&["info", "--simulate", "pcie-t4x4"]);
    assert_eq!(
        topology(&text, 4),
        rows(&[
            "GPU0 X PIX SYS SYS",
            "GPU1 PIX X SYS SYS",
            "GPU2 SYS SYS X PIX",
            "GPU3 SYS SYS PIX X"
        ])
    );
    assert!(gpu_rows(&text).iter().all(|g| g[2..4] == ["Tesla", "T4"]));
}

#[test]
fn k80_minors_and_boards() {
    let text = ok(&["info", "--simulate", "k80"]);
    let minors: Vec<String> = gpu_rows(&text).iter().map(|g| g[1].clone()).collect();
    assert_eq!(minors, ["2", "3", "0", "1"]);
    assert_eq!(
        topology(&text, 4),
        rows(&[
            "GPU0 X PSB PHB PHB",
            "GPU1 PSB X PHB PHB",
            "GPU2 PHB PHB X PSB",
            "GPU3 PHB PHB PSB X"
        ])
    );
    assert!(
        text.contains("NVIDIA driver 470.256.02, CUDA 11.4"),
        "{text}"
    );
}

#[test]
fn dgx_a100_and_hgx16() {
    let text = ok(&["info", "--simulate", "dgx-a100"]);
    let matrix = topology(&text, 8);
    assert_eq!(matrix.len(), 8);
    for (a, row) in matrix.iter().enumerate() {
        for (b, cell) in row[1..].iter().enumerate() {
            assert_eq!(cell, if a == b { "X" } else { "NV12" }, "{a}-{b}");
        }
    }
    assert!(gpu_rows(&text)[0][2..4] == ["NVIDIA", "A100-SXM4-40GB"]);

    let text = ok(&["info", "--simulate", "hgx16"]);
    let matrix = topology(&text, 16);
    assert_eq!(matrix.len(), 16);
    assert_eq!(matrix[0][1 + 8], "SYS");
    assert_eq!(matrix[8][1 + 11], "NV2");
    assert_eq!(matrix[15][1 + 14], "NV2");
}

#[test]
fn driver_without_gpus() {
    let text = ok(&["info", "--simulate", "driver-no-gpus"]);
    assert!(
        text.ends_with("no GPUs: NVIDIA driver 550.54.14 reports no GPUs\n"),
        "{text}"
    );
}

#[test]
fn json_for_every_shipped_node() {
    let list = ok(&["info", "--simulate", "list"]);
    let names: Vec<&str> = list
        .lines()
        .map(|l| l.split_whitespace().next().unwrap_or_default())
        .collect();
    // Each name with what the node is.
    assert!(
        list.lines().any(|l| l.starts_with("dgx-a100-mig ")
            && l.ends_with("8 × NVIDIA A100-SXM4-40GB (8 in MIG mode), driver 550.54.14"))
            && list.contains("driver-no-gpus   no GPUs, driver"),
        "{list}"
    );
    assert_eq!(
        names,
        [
            "dgx-a100",
            "dgx1-v100",
            "pcie-t4x4",
            "k80",
            "hgx16",
            "driver-no-gpus",
            "dgx-a100-mig",
            "dgx-a100-mixed",
            "hgx-h100",
            "numa-2cpu"
        ]
    );
    for name in names {
        let v = json(&["info", "--simulate", name]);
        assert_eq!(v["simulated"], name);
        let gpus = v["gpus"].as_array().unwrap();
        let topo = v["topology"].as_array().unwrap();
        assert_eq!(topo.len(), gpus.len(), "{name}");
        for (i, (gpu, row)) in gpus.iter().zip(topo).enumerate() {
            assert_eq!(gpu["index"], i, "{name}");
            assert_eq!(row[i], "X", "{name}");
            assert_eq!(gpu["healthy"], true, "{name}");
            assert!(gpu["uuid"].as_str().unwrap().starts_with("GPU-"), "{name}");
            assert!(
                gpu["device"].is_null(),
                "{name}: no device nodes in simulation"
            );
        }
        assert!(v["driver"]["version"].is_string(), "{name}");
    }
    let v = json(&["info", "--simulate", "k80"]);
    assert_eq!(v["gpus"][2]["minor"], 0);
    assert_eq!(v["gpus"][0]["compute_capability"], "3.7");
    assert_eq!(v["gpus"][0]["memory_total_bytes"], 11_996_758_016u64);
    assert_eq!(v["gpus"][0]["cpu_affinity"], "0-11,24-35");
    assert!(v["gpus"][0]["numa_node"].is_null());
    assert_eq!(v["topology"][0][1], "PSB");
    assert_eq!(v["driver"]["cuda_version"], "11.4");
}

/// This machine has no NVIDIA driver: the default `libnvidia-ml.so.1` is not in its ld.so.cache.
fn assert_host_without_driver() {
    let cache = Command::new("ldconfig")
        .arg("-p")
        .output()
        .expect("ldconfig -p");
    assert!(
        !String::from_utf8_lossy(&cache.stdout).contains("libnvidia-ml.so.1 "),
        "this test needs a host without NVIDIA's driver"
    );
}

#[test]
fn missing_driver_means_no_gpus_and_success() {
    assert_host_without_driver();
    let text = ok(&["info"]);
    assert_eq!(
        text,
        "no GPUs: NVIDIA driver not found: libnvidia-ml.so.1: cannot open shared object file: \
         No such file or directory\n"
    );
    let v = json(&["info"]);
    assert!(v["driver"].is_null());
    assert_eq!(v["gpus"], Value::Array(vec![]));
    assert!(
        v["absent_reason"]
            .as_str()
            .unwrap()
            .starts_with("NVIDIA driver not found: ")
    );
}

#[test]
fn a_named_nvml_lib_that_cannot_be_loaded_is_an_error() {
    for (lib, reason) in [
        (
            "/nonexistent/libnvidia-ml.so.1",
            "cannot open shared object file",
        ),
        ("/bin/true", "cannot dynamically load"),
        ("/etc/passwd", "invalid ELF header"),
    ] {
        let out = mesos_gpu(&["info", "--nvml-lib", lib]);
        assert_eq!(out.status.code(), Some(1), "{lib}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains(&format!("cannot load the NVML library {lib}: ")),
            "{stderr}"
        );
        // Issue 37: the loader's reason is given once (it was printed twice).
        assert_eq!(stderr.matches(reason).count(), 1, "{lib}: {stderr}");
        // The same with the environment variable.
        let out = Command::new(env!("CARGO_BIN_EXE_mesos-gpu"))
            .args(["info"])
            .env("MESOS_GPU_NVML_LIB", lib)
            .output()
            .expect("run mesos-gpu");
        assert_eq!(out.status.code(), Some(1), "MESOS_GPU_NVML_LIB={lib}");
    }
}

#[test]
fn unknown_simulated_node_lists_the_names() {
    let out = mesos_gpu(&["info", "--simulate", "dgx-9000"]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("unknown simulated node \"dgx-9000\""),
        "{stderr}"
    );
    for name in [
        "dgx-a100",
        "dgx1-v100",
        "pcie-t4x4",
        "k80",
        "hgx16",
        "driver-no-gpus",
    ] {
        assert!(stderr.contains(name), "{stderr} lacks {name}");
    }
    assert!(out.stdout.is_empty());
}

#[test]
fn node_description_file_with_a_lost_gpu() {
    let (_, text) = nvml_sim::TOPOLOGIES
        .iter()
        .find(|(n, _)| *n == "pcie-t4x4")
        .unwrap();
    let mut spec: Value = serde_json::from_str(text).unwrap();
    spec["gpus"][1]["lost"] = Value::Bool(true);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("node.json");
    std::fs::write(&file, spec.to_string()).unwrap();
    let text = ok(&["info", "--simulate", file.to_str().unwrap()]);
    let gpus = gpu_rows(&text);
    assert_eq!(
        gpus[1],
        ["1", "?", "?", "?", "?", "?", "N/A", "LOST", "-", "?"]
    );
    assert_eq!(topology(&text, 4)[0], ["GPU0", "X", "?", "SYS", "SYS"]);
    let v = json(&["info", "--simulate", file.to_str().unwrap()]);
    assert_eq!(v["gpus"][1]["healthy"], false);
    assert!(v["gpus"][1]["minor"].is_null());
}

#[test]
fn dev_root_with_simulation_reports_missing_nodes() {
    let dir = tempfile::tempdir().unwrap();
    let text = ok(&[
        "info",
        "--simulate",
        "pcie-t4x4",
        "--dev-root",
        dir.path().to_str().unwrap(),
    ]);
    let want = format!(
        "Note: device nodes not usable: {}/nvidiactl is missing",
        dir.path().display()
    );
    assert!(text.contains(&want), "{text}");
}

#[test]
fn simulate_conflicts_with_nvml_lib_and_sim_config() {
    let out = mesos_gpu(&[
        "info",
        "--simulate",
        "k80",
        "--nvml-lib",
        "/x/libnvidia-ml.so.1",
    ]);
    assert_eq!(out.status.code(), Some(2), "clap usage error");
    let out = Command::new(env!("CARGO_BIN_EXE_mesos-gpu"))
        .args(["info", "--simulate", "k80"])
        .env("NVML_SIM_CONFIG", "/elsewhere.json")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("NVML_SIM_CONFIG=/elsewhere.json is set")
    );
}

#[test]
fn help_shows_examples() {
    for cmd in ["info", "agent-flags"] {
        let text = ok(&[cmd, "--help"]);
        assert!(text.contains("Examples:\n  mesos-gpu "), "{cmd}: {text}");
    }
}

/// The UUIDs of `dgx1-v100` as discovery reports them.
fn dgx1_uuids() -> Vec<String> {
    json(&["info", "--simulate", "dgx1-v100"])["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["uuid"].as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn work_dir_health_checkpoint_is_shown_by_uuid() {
    let uuids = dgx1_uuids();
    let work = tempfile::tempdir().unwrap();
    std::fs::create_dir(work.path().join("gpu")).unwrap();
    // Recorded by UUID: the index in the checkpoint (9) is not what matches.
    let snapshot = serde_json::json!({"version": 1, "gpus": [
        {"index": 9, "uuid": uuids[3], "xids": {"79": 1}, "ecc_single_bit": 0, "ecc_double_bit": 0,
         "health": {"state": "unhealthy", "reason": {"kind": "xid", "xid": 79},
                    "since_ms": 1, "last_error_ms": 1, "errors": 1}},
        {"index": 1, "uuid": uuids[1], "xids": {}, "ecc_single_bit": 0, "ecc_double_bit": 0,
         "health": {"state": "healthy"}},
    ]});
    std::fs::write(work.path().join("gpu/health.json"), snapshot.to_string()).unwrap();
    let dir = work.path().to_str().unwrap();
    let text = ok(&["info", "--simulate", "dgx1-v100", "--agent-work-dir", dir]);
    let health: Vec<String> = gpu_rows(&text).iter().map(|r| r[9].clone()).collect();
    assert_eq!(
        health,
        ["ok", "ok", "ok", "UNHEALTHY:xid-79", "ok", "ok", "ok", "ok"],
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "GPU 3 ({}) is checkpointed unhealthy in {dir}/gpu/health.json: XID 79 (GPU has fallen off the bus)",
            uuids[3]
        )),
        "{text}"
    );
    let v = json(&["info", "--simulate", "dgx1-v100", "--agent-work-dir", dir]);
    assert_eq!(v["gpus"][3]["health"]["state"], "unhealthy");
    assert_eq!(v["gpus"][3]["health"]["reason"]["xid"], 79);
    assert_eq!(
        v["gpus"][3]["healthy"], true,
        "discovery's flag is unchanged"
    );
    assert_eq!(v["gpus"][1]["health"]["state"], "healthy");
    assert!(v["gpus"][0]["health"].is_null(), "not checkpointed: null");

    // No checkpoint: null everywhere, no note; a damaged one is a note, not a failure.
    let empty = tempfile::tempdir().unwrap();
    let v = json(&[
        "info",
        "--simulate",
        "dgx1-v100",
        "--agent-work-dir",
        empty.path().to_str().unwrap(),
    ]);
    assert!(
        v["gpus"]
            .as_array()
            .unwrap()
            .iter()
            .all(|g| g["health"].is_null())
    );
    assert!(!v["notes"].to_string().contains("health"), "{}", v["notes"]);
    std::fs::write(work.path().join("gpu/health.json"), "{not json").unwrap();
    let v = json(&["info", "--simulate", "dgx1-v100", "--agent-work-dir", dir]);
    assert!(
        v["notes"].to_string().contains("is damaged"),
        "{}",
        v["notes"]
    );
    assert!(v["gpus"][3]["health"].is_null());
    // A damaged checkpoint says nothing of any GPU: unknown, never `ok`.
    assert!(
        v["gpus"]
            .as_array()
            .unwrap()
            .iter()
            .all(|g| g["health_unknown"] == true),
        "{}",
        v["gpus"]
    );
    let text = ok(&["info", "--simulate", "dgx1-v100", "--agent-work-dir", dir]);
    let health: Vec<String> = gpu_rows(&text).iter().map(|r| r[9].clone()).collect();
    assert_eq!(health, ["unknown"; 8], "{text}");
}

#[test]
fn files_named_in_input_are_never_echoed() {
    let dir = tempfile::tempdir().unwrap();
    let secret = dir.path().join("secret");
    std::fs::write(&secret, "root:$6$s3cr3t:20228:0:99999:7:::\n").unwrap();
    let mut node: Value = serde_json::from_str(
        &std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../nvml-sim/topologies/pcie-t4x4.json"
        ))
        .unwrap(),
    )
    .unwrap();
    node["events_file"] = Value::String(secret.to_str().unwrap().to_owned());
    let file = dir.path().join("node.json");
    std::fs::write(&file, node.to_string()).unwrap();
    let out = mesos_gpu(&["info", "--simulate", file.to_str().unwrap()]);
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(all.contains("line 1: unknown event"), "{all}");
    assert!(!all.contains("s3cr3t"), "{all}");
    let out = mesos_gpu(&["ldcache", "--cache", secret.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("not an ld.so.cache: 34 bytes"), "{stderr}");
    assert!(
        !stderr.contains("s3cr3t") && !stderr.contains("root:"),
        "{stderr}"
    );
}

/// The pcie-t4x4 node with `count` copies of its first GPU.
fn node_with_gpus(count: u32) -> Value {
    let mut node: Value = serde_json::from_str(
        &std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../nvml-sim/topologies/pcie-t4x4.json"
        ))
        .unwrap(),
    )
    .unwrap();
    let template = node["gpus"][0].clone();
    node["gpus"] = (0..count)
        .map(|i| {
            let mut gpu = template.clone();
            gpu["index"] = i.into();
            gpu["minor"] = i.into();
            gpu["uuid"] = format!("GPU-{i:08x}-0000-4000-8000-000000000000").into();
            gpu["pci"]["bus_id"] = format!("0000{:04x}:{:02X}:00.0", i / 256, i % 256).into();
            gpu["serial"] = format!("{}", 1_000_000 + i).into();
            gpu
        })
        .collect();
    node
}

/// Runs `mesos-gpu args`, killed after `limit` (a hang guard, not a timing assertion).
fn run_bounded(args: &[&str], limit: std::time::Duration) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_mesos-gpu"))
        .args(args)
        .env_remove("NVML_SIM_CONFIG")
        .env("MESOS_GPU_LOG", "warn")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let start = std::time::Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > limit {
            child.kill().unwrap();
            panic!("{args:?} still running after {limit:?}");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    child.wait_with_output().unwrap()
}

#[test]
fn oversize_nodes_are_refused_up_front() {
    let dir = tempfile::tempdir().unwrap();
    for count in [65, 10_000] {
        let file = dir.path().join(format!("node{count}.json"));
        std::fs::write(&file, node_with_gpus(count).to_string()).unwrap();
        for command in ["info", "agent-flags"] {
            let args = [command, "--simulate", file.to_str().unwrap()];
            let out = run_bounded(&args, std::time::Duration::from_secs(60));
            assert_eq!(out.status.code(), Some(1), "{args:?}");
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(
                stderr.contains(&format!(
                    "describes {count} GPUs; mesos-gpu manages at most 64 GPUs per node"
                )),
                "{args:?}: {stderr}"
            );
        }
    }
    let file = dir.path().join("node64.json");
    std::fs::write(&file, node_with_gpus(64).to_string()).unwrap();
    let v = json(&["info", "--simulate", file.to_str().unwrap()]);
    assert_eq!(v["gpus"].as_array().unwrap().len(), 64);
    let out = run_bounded(
        &["info", "--simulate", "/dev/zero"],
        std::time::Duration::from_secs(60),
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/dev/zero: not a regular file"));
}

/// The subcommands a `--help` text lists under `Commands:`, without `help`.
fn subcommands(help: &str) -> Vec<String> {
    help.lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter(|l| !l.starts_with("   "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| *c != "help")
        .map(str::to_owned)
        .collect()
}

/// Every command and subcommand's `--help` ends with an example of its use (before: `gpu`,
/// `volume plan`, `volume create`, … had none).
#[test]
fn every_subcommand_help_has_an_example() {
    let mut todo: Vec<Vec<String>> = subcommands(&ok(&["--help"]))
        .into_iter()
        .map(|c| vec![c])
        .collect();
    assert!(todo.len() >= 12, "{todo:?}");
    let mut missing = Vec::new();
    let mut seen = 0;
    while let Some(path) = todo.pop() {
        let mut args: Vec<&str> = path.iter().map(String::as_str).collect();
        args.push("--help");
        let text = ok(&args);
        seen += 1;
        if !text.contains("Example") {
            missing.push(path.join(" "));
        }
        for sub in subcommands(&text) {
            let mut next = path.clone();
            next.push(sub);
            todo.push(next);
        }
    }
    assert!(seen > 20, "{seen} commands");
    assert!(
        missing.is_empty(),
        "no example in the --help of: {missing:?}"
    );
}

/// A simulated node reports simulated facts only: NUMA pinning within the CPUs its GPUs are
/// local to, not this host's (before: the simulated affinities cut down to this host's online
/// CPUs, e.g. `0-1` for every DGX-1 GPU), and a note saying host CPUs are not shown.
#[test]
fn simulated_numa_pinning_uses_only_simulated_cpus() {
    let v = json(&["info", "--simulate", "dgx1-v100"]);
    for gpu in v["gpus"].as_array().unwrap() {
        assert!(gpu["cpu_affinity"].is_string(), "{gpu}");
        assert_eq!(gpu["pinned_cpus"], gpu["cpu_affinity"], "{gpu}");
    }
    assert!(
        v["notes"]
            .to_string()
            .contains("host CPUs are not shown under --simulate"),
        "{}",
        v["notes"]
    );
    let text = ok(&["info", "--simulate", "dgx1-v100"]);
    let affinity = v["gpus"][0]["cpu_affinity"].as_str().unwrap();
    assert!(
        text.contains(&format!("  GPU0: CPUs {affinity}, memory nodes")),
        "{text}"
    );
}
