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

/// Checks that `args` prints no flag, exits 0 and says each of `says` on stderr.
fn no_flags(args: &[&str], says: &[&str]) {
    let out = mesos_gpu(args);
    assert_eq!(out.status.code(), Some(0), "{args:?}");
    assert!(
        out.stdout.is_empty(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    for said in says {
        assert!(stderr.contains(said), "{args:?}: {stderr} lacks {said:?}");
    }
}

#[test]
fn discovers_every_gpu_with_the_isolator() {
    let got = lines(&[
        "--simulate",
        "dgx1-v100",
        "--cgroups",
        "v1",
        "--isolation",
        ISO,
        "--resources",
        "cpus:32;mem:245760",
    ]);
    assert_eq!(
        got,
        [
            "--resources='cpus:32;mem:245760;gpus:8'",
            "--attributes='gpu_model:Tesla-V100-SXM2-16GB;gpu_memory_mib:16160;gpu_compute_capability:7.0'",
            "--nvidia_gpu_devices=0,1,2,3,4,5,6,7",
        ]
    );
}

#[test]
fn the_driver_is_in_the_attributes_only_when_asked_for() {
    let got = lines(&[
        "--simulate",
        "dgx1-v100",
        "--isolation",
        ISO,
        "--resources",
        "cpus:32",
        "--driver-attributes",
    ]);
    assert_eq!(
        got[1],
        "--attributes='gpu_model:Tesla-V100-SXM2-16GB;gpu_memory_mib:16160;gpu_compute_capability:7.0;\
         nvidia_driver:550.54.14;cuda_version:12.4'"
    );
}

/// Issue 34: Mesos's `gpu/nvidia` needs `cgroups/devices`, whose cgroups v2 isolator aborts the
/// agent at its first task unless `--agent_subsystems` made `<cgroups_root>`
/// (`isolators/cgroups2/cgroups2.cpp` 192): on v2 its flags end with `--agent_subsystems=`, as
/// the module's do (before: none, and the agent died at the first task); on v1 there is none.
#[test]
fn issue_34_gpu_nvidia_on_cgroup_v2_gets_agent_subsystems() {
    let args = |cgroups| {
        [
            "--simulate",
            "dgx1-v100",
            "--cgroups",
            cgroups,
            "--isolation",
            ISO,
        ]
    };
    let v2 = lines(&args("v2"));
    assert_eq!(
        v2.last().map(String::as_str),
        Some("--agent_subsystems=''"),
        "{v2:?}"
    );
    assert_eq!(v2[2], "--nvidia_gpu_devices=0,1,2,3,4,5,6,7", "{v2:?}");
    let v1 = lines(&args("v1"));
    assert!(
        !v1.iter().any(|l| l.starts_with("--agent_subsystems")),
        "{v1:?}"
    );
    let mine = lines(&[
        "--simulate",
        "dgx1-v100",
        "--cgroups",
        "v2",
        "--isolation",
        ISO,
        "--",
        "--agent_subsystems=memory",
    ]);
    assert_eq!(
        mine.iter()
            .filter(|l| l.starts_with("--agent_subsystems"))
            .collect::<Vec<_>>(),
        ["--agent_subsystems=memory"],
        "the operator's own --agent_subsystems is kept, once: {mine:?}"
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
            &[
                "--isolation",
                "posix/cpu,posix/mem",
                "--nvidia-gpu-devices",
                "0",
                "--resources",
                "gpus:1",
            ],
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

/// Issue 34: with the module the device list is this command's `--nvidia-gpu-devices` (the
/// module's parameter), and the rules' messages say so; with `gpu/nvidia` they keep the agent's
/// `--nvidia_gpu_devices`, which the operator then passes to the agent (before: Mesos's spelling
/// either way).
#[test]
fn issue_34_rule_violations_name_the_flag_to_fix() {
    let module = ["--simulate", "pcie-t4x4", "--cgroups", "v1"];
    let builtin = ["--simulate", "pcie-t4x4", "--isolation", ISO];
    for (base, spelled, not) in [
        (module, "--nvidia-gpu-devices", "--nvidia_gpu_devices"),
        (builtin, "--nvidia_gpu_devices", "--nvidia-gpu-devices"),
    ] {
        for (args, says) in [
            (
                &["--resources", "gpus:2"][..],
                format!(
                    "the 'gpus' resource (gpus:2) cannot be set without also setting {spelled} \
                     (the NVML indices of those GPUs, e.g. {spelled}=0,1)"
                ),
            ),
            (
                &["--resources", "gpus:1", "--nvidia-gpu-devices", "9"][..],
                format!("{spelled} lists GPU 9, which this node does not have"),
            ),
            (
                &["--resources", "gpus:2", "--nvidia-gpu-devices", "0,0"][..],
                format!("{spelled} contains duplicates: [0]"),
            ),
        ] {
            let all = [&base[..], args].concat();
            fails(&all, &says);
            let stderr = String::from_utf8_lossy(&mesos_gpu(&all).stderr).into_owned();
            assert!(!stderr.contains(not), "{all:?}: {stderr}");
        }
    }
}

/// Issue 34: Mesos's `gpu/nvidia` shares no GPU, and its agent refuses more `gpus` than
/// `--nvidia_gpu_devices` lists: `--gpu-replicas` with it is refused, naming the module (before:
/// `--resources=gpus:26` beside 8 devices, which Mesos refuses at start).
#[test]
fn issue_34_gpu_nvidia_cannot_share() {
    fails(
        &[
            "--simulate",
            "dgx1-v100",
            "--isolation",
            "filesystem/linux,cgroups/devices,gpu/nvidia",
            "--gpu-replicas",
            "4",
        ],
        "Mesos's gpu/nvidia cannot share a GPU between tasks: its agent refuses more `gpus` than \
         --nvidia_gpu_devices lists GPUs; use mesos-gpu's module \
         (org_apache_mesos_gpu_MesosGpuIsolator) in place of gpu/nvidia to share GPUs",
    );
}

#[test]
fn explicit_zero_keeps_gpus_zero() {
    let got = lines(&[
        "--simulate",
        "dgx-a100",
        "--cgroups",
        "v1",
        "--isolation",
        ISO,
        "--resources",
        "cpus:8;gpus:0",
    ]);
    assert_eq!(got, ["--resources='cpus:8;gpus:0'"]);
}

#[test]
fn without_the_isolator_gpus_pass_through() {
    let got = lines(&[
        "--simulate",
        "k80",
        "--isolation",
        "posix/cpu,posix/mem",
        "--resources",
        "gpus:100",
    ]);
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
fn a_named_nvml_lib_that_is_not_a_library_is_an_error() {
    for isolation in [ISO, "posix/cpu,posix/mem"] {
        fails(
            &["--nvml-lib", "/bin/true", "--isolation", isolation],
            "cannot load the NVML library /bin/true: ",
        );
    }
}

#[test]
fn an_isolation_without_gpu_isolator_says_why_there_are_no_flags() {
    no_flags(
        &["--simulate", "k80", "--isolation", "posix/cpu,posix/mem"],
        &[
            "no flags to add: --isolation=posix/cpu,posix/mem contains neither \
           org_apache_mesos_gpu_MesosGpuIsolator nor gpu/nvidia",
        ],
    );
    let (_dir, lib) = driver_not_loaded();
    no_flags(
        &["--nvml-lib", &lib, "--isolation", ISO],
        &["no flags to add: no GPUs: NVIDIA driver not loaded"],
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
fn replicas_advertise_shared_times_r_plus_whole() {
    let got = lines(&[
        "--simulate",
        "dgx1-v100",
        "--cgroups",
        "v1",
        "--resources",
        "cpus:32",
        "--gpu-replicas",
        "4,6=1,7=1",
        "--gpu-sharing",
        "mps",
    ]);
    assert_eq!(
        got[1..3],
        [
            "--resources='cpus:32;gpus:26'",
            "--attributes='gpu_model:Tesla-V100-SXM2-16GB;gpu_memory_mib:16160;gpu_compute_capability:7.0;\
             gpu_sharing:mps;gpu_shared:6;gpu_whole:2;gpu_replicas:4'",
        ]
    );
    let params = module_parameters(&got.join("\n"));
    assert_eq!(params["gpu_replicas"], "4,6=1,7=1");
    assert_eq!(params["gpu_sharing"], "mps");
    assert!(!params.contains_key("nvidia_gpu_devices"), "{params:?}");
    let sim = ["--simulate", "dgx1-v100", "--cgroups", "v1"];
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
            "--cgroups",
            "v1",
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
        "GPU 4 (GPU-b2c409eb-51ae-5a52-8b2c-13f9428e8a74) is in MIG mode: its MIG devices are \
         shared only with MPS",
    );
    let out = mesos_gpu(&[&sim[..], &["--gpu-replicas", "2", "--gpu-sharing", "hami"]].concat());
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("\"hami\": expected MODE or SEL=MODE (MODE one of time-slicing, mps, none"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn shared_mig_devices_are_offered_r_times_in_their_strategys_resource() {
    let module = "filesystem/linux,cgroups/devices,org_apache_mesos_gpu_MesosGpuIsolator";
    // dgx-a100-mixed: GPUs 0-3 whole, 4-7 split 3g+2g+1g+1g; the MIG devices shared 2 ways.
    let flags = |strategy: &str| {
        lines(&[
            "--simulate",
            "dgx-a100-mixed",
            "--isolation",
            module,
            "--mig-strategy",
            strategy,
            "--gpu-replicas",
            "2",
            "--gpu-sharing",
            "mps,0-3=none",
        ])
    };
    let single = flags("single");
    assert_eq!(
        single[1], "--resources=gpus:36",
        "4 + 16 MIG devices x 2: {single:?}"
    );
    let mixed = flags("mixed");
    assert_eq!(
        mixed[1], "--resources='gpus:4;mig-1g.5gb:16;mig-2g.10gb:8;mig-3g.20gb:8'",
        "{mixed:?}"
    );
    for out in [&single, &mixed] {
        assert!(
            out[2].ends_with(";gpu_sharing:mps;gpu_shared:16;gpu_whole:4;gpu_replicas:2'"),
            "{out:?}"
        );
        let params = module_parameters(&out.join("\n"));
        assert_eq!(params["gpu_replicas"], "2");
        assert_eq!(params["gpu_sharing"], "mps,0-3=none");
    }
    // More replicas than a 1g device serves MPS clients (48 lowered to 1 of 7 slices).
    fails(
        &[
            "--simulate",
            "dgx-a100-mixed",
            "--isolation",
            module,
            "--gpu-replicas",
            "7",
            "--gpu-sharing",
            "mps,0-3=none",
        ],
        "(1g.5gb, 1 of 7 compute slices) of GPU 4 serves at most 6 MPS clients, fewer than 7 \
         replicas",
    );
}

#[test]
fn offers_say_what_the_module_needs() {
    let module = "filesystem/linux,cgroups/devices,org_apache_mesos_gpu_MesosGpuIsolator";
    let mig = mesos_gpu(&["--simulate", "dgx-a100-mixed", "--isolation", module]);
    assert!(mig.status.success());
    let err = String::from_utf8_lossy(&mig.stderr);
    assert!(
        err.contains("this node has MIG devices; with single, gpus counts MIG devices"),
        "{err}"
    );
    let out = String::from_utf8_lossy(&mig.stdout);
    let params = module_parameters(&out);
    assert_eq!(
        params.get("mig_strategy").map(String::as_str),
        Some("single"),
        "{out}"
    );
    let shared = mesos_gpu(&[
        "--simulate",
        "dgx1-v100",
        "--isolation",
        module,
        "--gpu-replicas",
        "4",
    ]);
    assert!(shared.status.success());
    let err = String::from_utf8_lossy(&shared.stderr);
    assert!(
        err.contains("start the agent with --containerizers=mesos"),
        "{err}"
    );
    let whole = mesos_gpu(&["--simulate", "dgx1-v100", "--isolation", ISO]);
    assert!(
        whole.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&whole.stderr)
    );
}

/// The module's flags as `agent-flags` prints them, each line unquoted.
struct ModuleFlags {
    lines: Vec<String>,
}

impl ModuleFlags {
    fn get(&self, name: &str) -> Option<String> {
        let prefix = format!("--{name}=");
        self.lines.iter().find_map(|l| {
            l.strip_prefix(&prefix)
                .map(|v| v.trim_matches('\'').to_owned())
        })
    }
}

/// The `key → value` parameters of the module in the `--modules` line of `out`.
fn module_parameters(out: &str) -> std::collections::BTreeMap<String, String> {
    let flags = ModuleFlags {
        lines: out.lines().map(str::to_owned).collect(),
    };
    let json: serde_json::Value =
        serde_json::from_str(&flags.get("modules").expect("a --modules line")).unwrap();
    let module = &json["libraries"][0]["modules"][0];
    assert_eq!(module["name"], "org_apache_mesos_gpu_MesosGpuIsolator");
    module["parameters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["key"].as_str().unwrap().to_owned(),
                p["value"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

/// Without `--isolation`, every shipped node gets the module's whole configuration for the
/// cgroup version asked: `--isolation` (Mesos's `cgroups/devices` on v1 only), `--resources`
/// with the node's GPUs or MIG devices, `--attributes`, `--agent_subsystems=` on v2 and
/// `--modules` with the parameters that match, never `--nvidia_gpu_devices`; MIG and non-MIG
/// nodes alike (before: nothing on dgx1-v100, `--resources=gpus:56` alone on dgx-a100-mig).
#[test]
fn without_isolation_every_node_gets_the_module_flags() {
    let nodes: Vec<String> = lines(&["--simulate", "list"])
        .iter()
        .map(|l| l.split_whitespace().next().unwrap_or_default().to_owned())
        .collect();
    for node in &nodes {
        for (cgroups, isolation) in [
            (
                "v1",
                "filesystem/linux,cgroups/devices,org_apache_mesos_gpu_MesosGpuIsolator",
            ),
            (
                "v2",
                "filesystem/linux,org_apache_mesos_gpu_MesosGpuIsolator",
            ),
        ] {
            let out = lines(&["--simulate", node, "--cgroups", cgroups]);
            if node == "driver-no-gpus" {
                // The same agent without the module (without_gpus_the_agent_starts_…).
                let rest = isolation.replace(",org_apache_mesos_gpu_MesosGpuIsolator", "");
                let mut want = vec![format!("--isolation={rest}")];
                if cgroups == "v2" {
                    want.push("--agent_subsystems=''".to_owned());
                }
                assert_eq!(out, want, "{node} {cgroups}");
                continue;
            }
            let flags = ModuleFlags { lines: out.clone() };
            assert_eq!(
                flags.get("isolation").as_deref(),
                Some(isolation),
                "{node}: {out:?}"
            );
            let resources = flags.get("resources").unwrap_or_default();
            assert!(
                resources
                    .split(';')
                    .any(|r| r.starts_with("gpus:") || r.starts_with("mig-")),
                "{node} {cgroups}: {out:?}"
            );
            assert!(flags.get("attributes").is_some(), "{node}: {out:?}");
            assert_eq!(
                flags.get("agent_subsystems").is_some(),
                cgroups == "v2",
                "{node} {cgroups}: {out:?}"
            );
            assert!(
                !out.iter().any(|l| l.starts_with("--nvidia_gpu_devices")),
                "{node}: {out:?}"
            );
            let params = module_parameters(&out.join("\n"));
            assert_eq!(params["work_dir"], "/var/lib/mesos", "{node}");
            assert_eq!(params["pool_dir"], "/var/lib/mesos-gpu", "{node}");
            assert_eq!(
                params["volume_root"], "/var/run/mesos/isolators/gpu",
                "{node}"
            );
            let mig = !mesos_gpu_testkit::nvml_sim::SimNode::shipped(node)
                .inventory()
                .unwrap()
                .mig
                .is_empty();
            assert_eq!(
                params.contains_key("mig_strategy"),
                mig,
                "{node}: {params:?}"
            );
        }
    }
    let out = lines(&["--simulate", "dgx-a100-mig", "--cgroups", "v1"]);
    assert_eq!(out[1], "--resources=gpus:56", "{out:?}");
    let out = lines(&["--simulate", "dgx1-v100", "--cgroups", "v1"]);
    assert_eq!(out[1], "--resources=gpus:8", "{out:?}");
}

/// The issue's command: the module named in `--isolation` on a node without MIG gets its flags
/// (before: "no flags to add: … does not contain gpu/nvidia"), the given `--isolation` kept.
#[test]
fn the_module_named_in_isolation_gets_its_flags() {
    let isolation =
        "filesystem/linux,cgroups/cpu,cgroups/devices,org_apache_mesos_gpu_MesosGpuIsolator";
    let out = lines(&[
        "--simulate",
        "dgx1-v100",
        "--cgroups",
        "v1",
        "--isolation",
        isolation,
    ]);
    assert_eq!(out[0], format!("--isolation={isolation}"));
    assert_eq!(out[1], "--resources=gpus:8", "{out:?}");
    let out = lines(&[
        "--simulate",
        "dgx1-v100",
        "--cgroups",
        "v1",
        "--isolation",
        isolation,
        "--resources",
        "cpus:32;gpus:2",
        "--nvidia-gpu-devices",
        "2,3",
        "--agent-work-dir",
        "/srv/mesos",
    ]);
    assert_eq!(out[1], "--resources='cpus:32;gpus:2'", "{out:?}");
    let params = module_parameters(&out.join("\n"));
    assert_eq!(params["nvidia_gpu_devices"], "2,3");
    assert_eq!(params["work_dir"], "/srv/mesos");
}

/// `gpu/nvidia` next to the module, and `cgroups/devices` with the module on cgroup v2, are
/// refused with the reason, as the module refuses them when the agent starts.
#[test]
fn configurations_the_module_refuses_are_refused() {
    fails(
        &[
            "--simulate",
            "dgx1-v100",
            "--isolation",
            "filesystem/linux,gpu/nvidia,org_apache_mesos_gpu_MesosGpuIsolator",
        ],
        "two GPU isolators would hand out the same GPUs; remove `gpu/nvidia`",
    );
    fails(
        &[
            "--simulate",
            "dgx-a100-mig",
            "--cgroups",
            "v2",
            "--isolation",
            "filesystem/linux,cgroups/devices,org_apache_mesos_gpu_MesosGpuIsolator",
        ],
        "drop `cgroups/devices` from --isolation",
    );
}

/// `--module-param` adds parameters, refusing those set by this command's own options;
/// `--modules-file` writes the document and prints `--modules=file://…`; the global
/// `--nvml-lib`, `--dev-root` and `--proc-root` become the module's, so that it reads what this
/// command read.
#[test]
fn module_parameters_and_modules_file() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("modules.json");
    let node = mesos_gpu_testkit::nvml_sim::SimNode::shipped("dgx-a100-mig");
    let lib = node.lib_path();
    let proc_root = node.proc_root();
    let base = [
        "--nvml-lib",
        lib.to_str().unwrap(),
        "--proc-root",
        proc_root.to_str().unwrap(),
        "--cgroups",
        "v2",
        "--module-param",
        "driver_volume=build",
        "--module-library",
        "/opt/m/libmesos_gpu_module.so",
    ];
    let out = lines(&[&base[..], &["--modules-file", file.to_str().unwrap()]].concat());
    assert_eq!(
        out.last().unwrap(),
        &format!("--modules=file://{}", file.display())
    );
    assert_eq!(
        out[1], "--resources=gpus:56",
        "MIG devices found through --proc-root: {out:?}"
    );
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    assert_eq!(
        json["libraries"][0]["file"],
        "/opt/m/libmesos_gpu_module.so"
    );
    let inline = lines(&base);
    let params = module_parameters(&inline.join("\n"));
    assert_eq!(params["driver_volume"], "build");
    assert_eq!(params["nvml_lib"], lib.to_str().unwrap());
    assert_eq!(params["proc_root"], proc_root.to_str().unwrap());
    let in_file: serde_json::Value =
        serde_json::from_str(&ModuleFlags { lines: inline }.get("modules").unwrap()).unwrap();
    assert_eq!(in_file, json, "the file holds what --modules gives inline");
    let out = mesos_gpu(&["--simulate", "k80", "--module-param", "pool_dir=/x"]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("pool_dir is set from --pool-dir"),
        "{stderr}"
    );
}

/// Issue 34: the whole parameter set goes through the module's own parser before anything is
/// printed or written; a parameter it would refuse fails the command with the parser's words,
/// naming the key and value, and for an unknown key the accepted ones (before: written into
/// `--modules` with exit 0, for the agent to die on).
#[test]
fn issue_34_module_params_the_module_would_refuse_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("modules.json");
    for (param, says) in [
        (
            "bogus_key=1",
            "the module would refuse its parameters: unknown module parameter \"bogus_key\": \
             expected one of work_dir, pool_dir, nvml_lib, dev_root, policy",
        ),
        (
            "numa_pinning=maybe",
            "module parameter numa_pinning=\"maybe\": expected one of off, on",
        ),
        (
            "driver_volume=sometimes",
            "module parameter driver_volume=\"sometimes\": expected one of existing, build, off",
        ),
        (
            "health_quiet=memory=soon",
            "module parameter health_quiet: ",
        ),
        (
            "mps_root=/run/mps",
            "module parameter mps_root=\"/run/mps\": expected to be given only with gpu_replicas",
        ),
    ] {
        fails(
            &[
                "--simulate",
                "pcie-t4x4",
                "--cgroups",
                "v1",
                "--modules-file",
                file.to_str().unwrap(),
                "--module-param",
                param,
            ],
            says,
        );
        assert!(!file.exists(), "{param}: the modules file was written");
    }
    let ok = lines(&[
        "--simulate",
        "pcie-t4x4",
        "--cgroups",
        "v1",
        "--module-param",
        "numa_pinning=on",
    ]);
    assert_eq!(module_parameters(&ok.join("\n"))["numa_pinning"], "on");
}

/// Without a driver, or without GPUs, the module cannot start: the flags are the same agent's
/// without it, and stderr says why. `--isolation` keeps a `cgroups/*` isolator on v1, where
/// Mesos 1.12 aborts at start without one (before: only `--resources` was printed, the agent got
/// Mesos's default `posix/cpu,posix/mem` and died on `Check failed: !subsystemSet.empty()`).
#[test]
fn without_gpus_the_agent_starts_without_the_module() {
    let (_dir, lib) = driver_not_loaded();
    let out = mesos_gpu(&["--nvml-lib", &lib, "--cgroups", "v1"]);
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "--isolation=filesystem/linux,cgroups/devices\n"
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    for said in [
        "no GPU flags to add: no GPUs: NVIDIA driver not loaded",
        "(the module refuses to start without an NVIDIA driver: start this agent without it, \
         with the flags printed)",
    ] {
        assert!(stderr.contains(said), "{stderr} lacks {said:?}");
    }
    let out = lines(&[
        "--simulate",
        "driver-no-gpus",
        "--cgroups",
        "v2",
        "--resources",
        "cpus:4;mem:4096",
        "--isolation",
        "cgroups/cpu,org_apache_mesos_gpu_MesosGpuIsolator",
    ]);
    assert_eq!(
        out,
        [
            "--isolation=cgroups/cpu",
            "--resources='cpus:4;mem:4096'",
            "--agent_subsystems=''"
        ]
    );
}

/// `examples/mesos-agent/agent.sh` on a MIG node (before: it asked for `gpu/nvidia`, which a MIG
/// node refuses, and died): `mesos-agent` gets the module's flags as `agent-flags` printed them,
/// unquoted, then the script's own and the caller's.
#[test]
fn agent_sh_runs_the_agent_with_the_module_flags() {
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path();
    let argv = bin.join("argv");
    let script = |name: &str, text: &str| {
        let path = bin.join(name);
        std::fs::write(&path, text).unwrap();
        let mut mode = std::fs::metadata(&path).unwrap().permissions();
        std::os::unix::fs::PermissionsExt::set_mode(&mut mode, 0o755);
        std::fs::set_permissions(&path, mode).unwrap();
    };
    script(
        "mesos-gpu",
        &format!(
            "#!/bin/sh\nexec '{}' --simulate dgx-a100-mig \"$@\"\n",
            env!("CARGO_BIN_EXE_mesos-gpu")
        ),
    );
    let environ = bin.join("environ");
    script(
        "mesos-agent",
        &format!(
            "#!/bin/sh\nprintf '%s\\0' \"$@\" > '{}'\nenv > '{}'\n",
            argv.display(),
            environ.display()
        ),
    );
    let agent_sh =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/mesos-agent/agent.sh");
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap());
    let out = Command::new("sh")
        .arg(&agent_sh)
        .arg("--port=5061")
        .arg("--attributes=rack:r7")
        .arg("--hostname=gpu 07")
        .env("PATH", path)
        .env("MASTER", "zk://zk1:2181/mesos")
        .env("RESOURCES", "cpus:8;mem:1024")
        .env("AGENT_FLAGS_OPTS", "--module-param driver_volume=build")
        .env("MESOS_GPU_LOG", "warn")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let args: Vec<String> = std::fs::read_to_string(&argv)
        .unwrap()
        .split('\0')
        .filter(|a| !a.is_empty())
        .map(str::to_owned)
        .collect();
    let value = |name: &str| {
        let prefix = format!("--{name}=");
        args.iter()
            .find_map(|a| a.strip_prefix(&prefix))
            .unwrap_or_else(|| panic!("no {prefix} in {args:?}"))
            .to_owned()
    };
    let isolation = value("isolation");
    assert!(
        isolation.ends_with(",org_apache_mesos_gpu_MesosGpuIsolator")
            && !isolation.contains("gpu/nvidia"),
        "{args:?}"
    );
    assert_eq!(value("resources"), "cpus:8;mem:1024;gpus:56");
    assert_eq!(value("attributes"), "rack:r7;mig_strategy:single");
    let environ = std::fs::read_to_string(&environ).unwrap();
    for want in [
        "MESOS_MASTER=zk://zk1:2181/mesos",
        "MESOS_CONTAINERIZERS=mesos",
        "MESOS_WORK_DIR=/var/lib/mesos",
    ] {
        assert!(
            environ.lines().any(|l| l == want),
            "{want} not in the agent's environment"
        );
    }
    assert_eq!(
        args[args.len() - 2..],
        ["--port=5061", "--hostname=gpu 07"],
        "the operator's other flags come last, unchanged: {args:?}"
    );
    for name in ["attributes", "resources", "isolation", "modules"] {
        let prefix = format!("--{name}=");
        assert_eq!(
            args.iter().filter(|a| a.starts_with(&prefix)).count(),
            1,
            "--{name} reaches the agent once: {args:?}"
        );
    }
    let modules: serde_json::Value = serde_json::from_str(&value("modules")).unwrap();
    let params = &modules["libraries"][0]["modules"][0]["parameters"];
    // The module's volume root is serve's in the shipped /etc/default/mesos-gpu.
    let defaults = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/default/mesos-gpu"),
    )
    .unwrap();
    let serve_volume_root = defaults
        .lines()
        .find_map(|l| l.strip_prefix("MESOS_GPU_SERVE_OPTS="))
        .and_then(|opts| opts.split(" --volume-root ").nth(1))
        .and_then(|rest| rest.split_whitespace().next())
        .expect("--volume-root in MESOS_GPU_SERVE_OPTS");
    for want in [
        serde_json::json!({"key": "work_dir", "value": "/var/lib/mesos"}),
        serde_json::json!({"key": "mig_strategy", "value": "single"}),
        serde_json::json!({"key": "driver_volume", "value": "build"}),
        serde_json::json!({"key": "volume_root", "value": serve_volume_root}),
    ] {
        assert!(
            params.as_array().unwrap().contains(&want),
            "{want} not in {params}"
        );
    }
}
