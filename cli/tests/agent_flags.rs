//! `mesos-gpu agent-flags` run as a process against simulated nodes and a host without a driver.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::{Command, Output};

const ISO: &str = "filesystem/linux,cgroups/devices,gpu/nvidia";

fn mesos_gpu(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_mesos-gpu"))
        .arg("agent-flags")
        .args(args)
        .env_remove("NVML_SIM_CONFIG")
        .env_remove("MESOS_GPU_NVML_LIB")
        .env("MESOS_GPU_LOG", "warn")
        .output()
        .expect("run mesos-gpu")
}

fn lines(args: &[&str]) -> Vec<String> {
    let out = mesos_gpu(args);
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect()
}

fn fails(args: &[&str], message: &str) {
    let out = mesos_gpu(args);
    assert_eq!(out.status.code(), Some(1), "{args:?}");
    assert!(out.stdout.is_empty(), "{args:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(message),
        "{args:?}: {stderr:?} lacks {message:?}"
    );
}

#[test]
fn discovers_every_gpu_with_the_isolator() {
    let got = lines(&[
        "--simulate",
        "dgx1-v100",
        "--isolation",
        ISO,
        "--resources",
        "cpus:32;mem:245760",
    ]);
    assert_eq!(
        got,
        [
            "--resources='cpus:32;mem:245760;gpus:8'",
            "--attributes='gpu_model:Tesla-V100-SXM2-16GB;gpu_memory_mib:16160;gpu_compute_capability:7.0;\
             nvidia_driver:550.54.14;cuda_version:12.4'",
            "--nvidia_gpu_devices=0,1,2,3,4,5,6,7",
        ]
    );
}

#[test]
fn explicit_devices() {
    let got = lines(&[
        "--simulate",
        "pcie-t4x4",
        "--isolation",
        ISO,
        "--resources",
        "gpus(ml):2;cpus:4",
        "--nvidia-gpu-devices",
        "2,3",
        "--attributes",
        "rack:r7",
    ]);
    assert_eq!(got[0], "--resources='gpus(ml):2;cpus:4'");
    assert!(
        got[1].starts_with("--attributes='rack:r7;gpu_model:Tesla-T4;"),
        "{got:?}"
    );
    assert_eq!(got[2], "--nvidia_gpu_devices=2,3");
}

#[test]
fn rule_violations_exit_1_with_the_rule() {
    let t4 = ["--simulate", "pcie-t4x4"];
    let cases: [(&[&str], &str); 8] = [
        (
            &["--nvidia-gpu-devices", "0", "--resources", "gpus:1"],
            "can only be set when --isolation contains 'gpu/nvidia'",
        ),
        (
            &[
                "--isolation",
                ISO,
                "--resources",
                "gpus:1",
                "--nvidia-gpu-devices",
                "0,0",
            ],
            "contains duplicates: [0]",
        ),
        (
            &[
                "--isolation",
                ISO,
                "--resources",
                "gpus:2",
                "--nvidia-gpu-devices",
                "0",
            ],
            "specify different numbers",
        ),
        (
            &["--isolation", ISO, "--resources", "gpus:2"],
            "cannot be set without also setting --nvidia_gpu_devices",
        ),
        (
            &[
                "--isolation",
                ISO,
                "--resources",
                "cpus:1",
                "--nvidia-gpu-devices",
                "0",
            ],
            "without also setting 'gpus'",
        ),
        (
            &[
                "--isolation",
                ISO,
                "--resources",
                "gpus:0",
                "--nvidia-gpu-devices",
                "0",
            ],
            "specifies 0 GPUs",
        ),
        (
            &[
                "--isolation",
                ISO,
                "--resources",
                "gpus:8",
                "--nvidia-gpu-devices",
                "0,1,2,3,4,5,6,7",
            ],
            "greater than",
        ),
        (
            &[
                "--isolation",
                ISO,
                "--resources",
                "gpus:1.5",
                "--nvidia-gpu-devices",
                "0",
            ],
            "non-negative whole number",
        ),
    ];
    for (args, message) in cases {
        let all: Vec<&str> = t4.iter().chain(args).copied().collect();
        fails(&all, message);
    }
    fails(
        &["--isolation", ISO, "--resources", "gpus:-1"],
        "gpus=-1: a scalar resource must be",
    );
    fails(&["--isolation", ISO, "--resources", "gpus:nan"], "gpus=nan");
    fails(
        &[
            "--simulate",
            "k80",
            "--isolation",
            ISO,
            "--resources",
            "gpus:1",
            "--nvidia-gpu-devices",
            "9",
        ],
        "GPU 9",
    );
}

#[test]
fn explicit_zero_keeps_gpus_zero() {
    let got = lines(&[
        "--simulate",
        "dgx-a100",
        "--isolation",
        ISO,
        "--resources",
        "cpus:8;gpus:0",
    ]);
    assert_eq!(got, ["--resources='cpus:8;gpus:0'"]);
}

#[test]
fn without_the_isolator_gpus_pass_through() {
    let got = lines(&["--simulate", "k80", "--resources", "gpus:100"]);
    assert_eq!(got[0], "--resources=gpus:100");
    assert!(
        !got.iter().any(|l| l.starts_with("--nvidia_gpu_devices")),
        "{got:?}"
    );
}

/// A library that loads but whose driver is not there: nvml-sim without a node description
/// answers `NVML_ERROR_DRIVER_NOT_LOADED`, as NVML does without its kernel module.
fn driver_not_loaded() -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    let lib = dir.path().join("libnvidia-ml.so.1");
    std::fs::copy(mesos_gpu_testkit::nvml_sim::sim_library(), &lib).unwrap();
    let lib = lib.to_str().unwrap().to_owned();
    (dir, lib)
}

#[test]
fn without_a_driver_gpus_pass_through() {
    let (_dir, lib) = driver_not_loaded();
    let got = lines(&[
        "--nvml-lib",
        &lib,
        "--isolation",
        ISO,
        "--resources",
        "gpus:2",
    ]);
    assert_eq!(got, ["--resources=gpus:2"]);
    let got = lines(&[
        "--nvml-lib",
        &lib,
        "--isolation",
        ISO,
        "--resources",
        "cpus:2",
    ]);
    assert_eq!(got, ["--resources=cpus:2"]);
}

#[test]
fn issue_14_a_named_nvml_lib_that_is_not_a_library_is_an_error() {
    for isolation in [ISO, "posix/cpu,posix/mem"] {
        fails(
            &["--nvml-lib", "/bin/true", "--isolation", isolation],
            "cannot load the NVML library /bin/true: ",
        );
    }
}

#[test]
fn issue_14_default_isolation_says_why_there_are_no_flags() {
    let out = mesos_gpu(&["--simulate", "k80"]);
    assert_eq!(out.status.code(), Some(0));
    assert!(out.stdout.is_empty());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(
            "no flags to add: --isolation=posix/cpu,posix/mem does not contain gpu/nvidia"
        ),
        "{stderr}"
    );
    let (_dir, lib) = driver_not_loaded();
    let out = mesos_gpu(&["--nvml-lib", &lib, "--isolation", ISO]);
    assert_eq!(out.status.code(), Some(0));
    assert!(out.stdout.is_empty());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("no flags to add: no GPUs: NVIDIA driver not loaded"),
        "{stderr}"
    );
}

#[test]
fn json_resources_and_file_values() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("resources.json");
    std::fs::write(
        &file,
        r#"[{"name":"cpus","type":"SCALAR","scalar":{"value":4}}]"#,
    )
    .unwrap();
    let arg = format!("file://{}", file.display());
    let got = lines(&[
        "--simulate",
        "pcie-t4x4",
        "--isolation",
        ISO,
        "--resources",
        &arg,
    ]);
    let value = got[0]
        .strip_prefix("--resources='")
        .unwrap()
        .strip_suffix('\'')
        .unwrap();
    let v: serde_json::Value = serde_json::from_str(value).unwrap();
    assert_eq!(v[1]["name"], "gpus");
    assert_eq!(v[1]["scalar"]["value"], 4);
}

#[test]
fn simulate_list_and_unknown_names() {
    let got = lines(&["--simulate", "list"]);
    assert_eq!(got.len(), 10);
    fails(
        &["--simulate", "nope", "--isolation", ISO],
        "expected one of dgx-a100, dgx1-v100",
    );
    fails(&["--simulate", "nope"], "unknown simulated node");
}

#[test]
fn issue_17_replicas_advertise_shared_times_r_plus_whole() {
    let got = lines(&[
        "--simulate",
        "dgx1-v100",
        "--isolation",
        ISO,
        "--resources",
        "cpus:32",
        "--gpu-replicas",
        "4,6=1,7=1",
        "--gpu-sharing",
        "mps",
    ]);
    assert_eq!(
        got,
        [
            "--resources='cpus:32;gpus:26'",
            "--attributes='gpu_model:Tesla-V100-SXM2-16GB;gpu_memory_mib:16160;gpu_compute_capability:7.0;\
             nvidia_driver:550.54.14;cuda_version:12.4;gpu_sharing:mps;gpu_shared:6;gpu_whole:2;gpu_replicas:4'",
            "--nvidia_gpu_devices=0,1,2,3,4,5,6,7",
        ]
    );
    let sim = ["--simulate", "dgx1-v100", "--isolation", ISO];
    fails(
        &[&sim[..], &["--gpu-replicas", "4,9=2"]].concat(),
        "names GPU \"9\", which is not advertised",
    );
    fails(
        &[&sim[..], &["--gpu-replicas", "0"]].concat(),
        "GPU replica entry \"0\"",
    );
    fails(
        &[
            "--simulate",
            "k80",
            "--isolation",
            ISO,
            "--gpu-replicas",
            "2",
            "--gpu-sharing",
            "mps",
        ],
        "MPS sharing needs 7.0 (Volta) or later",
    );
    fails(
        &[
            "--simulate",
            "dgx-a100-mixed",
            "--isolation",
            "filesystem/linux,cgroups/devices,org_apache_mesos_gpu_MesosGpuIsolator",
            "--gpu-replicas",
            "2",
        ],
        "--gpu-replicas 2: sharing GPUs of a node with MIG devices is not supported",
    );
    let out = mesos_gpu(&[&sim[..], &["--gpu-replicas", "2", "--gpu-sharing", "hami"]].concat());
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("not one of: time-slicing, mps"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn issue_16_17_offers_say_what_the_module_needs() {
    let module = "filesystem/linux,cgroups/devices,org_apache_mesos_gpu_MesosGpuIsolator";
    let mig = mesos_gpu(&["--simulate", "dgx-a100-mixed", "--isolation", module]);
    assert!(mig.status.success());
    let err = String::from_utf8_lossy(&mig.stderr);
    assert!(
        err.contains("give the module the same strategy (mig_strategy=single)"),
        "{err}"
    );
    let shared = mesos_gpu(&[
        "--simulate",
        "dgx1-v100",
        "--isolation",
        ISO,
        "--gpu-replicas",
        "4",
    ]);
    assert!(shared.status.success());
    let err = String::from_utf8_lossy(&shared.stderr);
    assert!(
        err.contains(
            "give the module the same parameters (gpu_replicas=4, gpu_sharing=time-slicing)"
        ) && err.contains("start the agent with --containerizers=mesos"),
        "{err}"
    );
    let whole = mesos_gpu(&["--simulate", "dgx1-v100", "--isolation", ISO]);
    assert!(
        whole.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&whole.stderr)
    );
}
