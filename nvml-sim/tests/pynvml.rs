//! NVIDIA's own Python binding (nvidia-ml-py, module `pynvml`) loads nvml-sim as
//! `libnvidia-ml.so.1` and must read from it what the node description says: the MIG layout
//! (parents, MIG indices, GI/CI ids and profiles, UUIDs, memory), compute modes (also set from
//! Python and read back from Rust), processes and CPU/memory affinity.
//!
//! Needs `python3` with `pynvml` (`scripts/test.sh` installs nvidia-ml-py): the trials are
//! ignored without it and fail when `MESOS_GPU_REQUIRE` lists `pynvml`.
#![allow(clippy::unwrap_used)] // a failed unwrap fails the test at its line

mod common;

use std::collections::BTreeMap;
use std::process::Command;

use libtest_mimic::{Arguments, Failed, Trial};
use mesos_gpu_testkit::nvml_sim::SimNode;
use mesos_gpu_testkit::{Host, Need, needs};
use nvml_wrapper::enum_wrappers::device::ComputeMode;
use serde_json::{Value, json};

/// Reads the node through pynvml and prints one JSON document.
const READ_NODE: &str = r#"
import json, sys
import pynvml as n

def words_to_list(words):
    return [w * 64 + b for w, word in enumerate(words) for b in range(64) if word >> b & 1]

n.nvmlInit()
out = {"driver": n.nvmlSystemGetDriverVersion(), "gpus": []}
for i in range(n.nvmlDeviceGetCount()):
    h = n.nvmlDeviceGetHandleByIndex(i)
    g = {"index": i, "uuid": n.nvmlDeviceGetUUID(h), "minor": n.nvmlDeviceGetMinorNumber(h)}
    try:
        cur, pend = n.nvmlDeviceGetMigMode(h)
        g["mig"] = {"current": cur, "pending": pend, "max": n.nvmlDeviceGetMaxMigDeviceCount(h), "devices": []}
    except n.NVMLError_NotSupported:
        g["mig"] = None
    if g["mig"] and g["mig"]["current"]:
        for mi in range(g["mig"]["max"]):
            try:
                m = n.nvmlDeviceGetMigDeviceHandleByIndex(h, mi)
            except n.NVMLError_NotFound:
                continue
            gi_id = n.nvmlDeviceGetGpuInstanceId(m)
            gi = n.nvmlDeviceGetGpuInstanceById(h, gi_id)
            info = n.nvmlGpuInstanceGetInfo(gi)
            attrs = n.nvmlDeviceGetAttributes(m)
            parent = n.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(m)
            g["mig"]["devices"].append({
                "index": n.nvmlDeviceGetIndex(m),
                # nvidia-ml-py 13 returns this one as a ctypes c_uint.
                "is_mig": int(getattr(n.nvmlDeviceIsMigDeviceHandle(m), "value", n.nvmlDeviceIsMigDeviceHandle(m))),
                "parent": n.nvmlDeviceGetIndex(parent),
                "uuid": n.nvmlDeviceGetUUID(m),
                "name": n.nvmlDeviceGetName(m),
                "gi": gi_id,
                "ci": n.nvmlDeviceGetComputeInstanceId(m),
                "profile": info.profileId,
                "start": info.placement.start,
                "memory_mib": attrs.memorySizeMB,
                "gi_slices": attrs.gpuInstanceSliceCount,
                "ci_slices": attrs.computeInstanceSliceCount,
                "memory_total": n.nvmlDeviceGetMemoryInfo(m).total,
                "compute_mode": n.nvmlDeviceGetComputeMode(m),
            })
        try:
            n.nvmlDeviceGetUtilizationRates(h)
            g["utilization"] = "supported"
        except n.NVMLError_NotSupported:
            g["utilization"] = "not supported"
    else:
        g["compute_mode"] = n.nvmlDeviceGetComputeMode(h)
    try:
        g["processes"] = [[p.pid, p.usedGpuMemory] for p in n.nvmlDeviceGetComputeRunningProcesses(h)]
    except n.NVMLError_NotSupported:
        g["processes"] = None
    try:
        g["cpus_node"] = words_to_list(n.nvmlDeviceGetCpuAffinityWithinScope(h, 4, n.NVML_AFFINITY_SCOPE_NODE))
        g["cpus_socket"] = words_to_list(n.nvmlDeviceGetCpuAffinityWithinScope(h, 4, n.NVML_AFFINITY_SCOPE_SOCKET))
        g["mems_node"] = words_to_list(n.nvmlDeviceGetMemoryAffinity(h, 1, n.NVML_AFFINITY_SCOPE_NODE))
        g["mems_socket"] = words_to_list(n.nvmlDeviceGetMemoryAffinity(h, 1, n.NVML_AFFINITY_SCOPE_SOCKET))
    except n.NVMLError_NotSupported:
        pass
    out["gpus"].append(g)
if len(sys.argv) > 1:
    # Set the compute mode of GPU argv[1] to argv[2] (3 = EXCLUSIVE_PROCESS).
    n.nvmlDeviceSetComputeMode(n.nvmlDeviceGetHandleByIndex(int(sys.argv[1])), int(sys.argv[2]))
n.nvmlShutdown()
print(json.dumps(out))
"#;

/// Runs a Python program against the node's library; its stdout as JSON.
fn python(node: &SimNode, program: &str, args: &[&str]) -> Result<Value, Failed> {
    let out = Command::new("python3")
        .arg("-c")
        .arg(program)
        .args(args)
        .env("LD_LIBRARY_PATH", node.dir())
        .env_remove("NVML_SIM_CONFIG")
        .output()
        .map_err(|e| format!("run python3: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "python3 exited {}:\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        )
        .into());
    }
    serde_json::from_slice(&out.stdout).map_err(|e| format!("python3 output: {e}").into())
}

fn cpulist(text: &str) -> Vec<u64> {
    text.split(',')
        .flat_map(|part| match part.split_once('-') {
            Some((lo, hi)) => lo.parse::<u64>().unwrap()..=hi.parse().unwrap(),
            None => part.parse::<u64>().unwrap()..=part.parse().unwrap(),
        })
        .collect()
}

fn check(ok: bool, what: impl FnOnce() -> String) -> Result<(), Failed> {
    if ok { Ok(()) } else { Err(what().into()) }
}

/// What the description says about one GPU's MIG devices: (gi, ci) → (profile, start).
fn described_mig(g: &Value) -> BTreeMap<(u64, u64), (u64, u64)> {
    let mut out = BTreeMap::new();
    for gi in g["mig"]["gpu_instances"].as_array().into_iter().flatten() {
        let key = |ci: u64| (gi["id"].as_u64().unwrap(), ci);
        let val = (
            gi["profile"].as_u64().unwrap(),
            gi["start"].as_u64().unwrap(),
        );
        match gi.get("compute_instances").and_then(Value::as_array) {
            None => {
                out.insert(key(0), val);
            }
            Some(cis) => {
                for ci in cis {
                    out.insert(key(ci["id"].as_u64().unwrap()), val);
                }
            }
        }
    }
    out
}

fn pynvml_reads_the_node_file(name: &str) -> Result<(), Failed> {
    let json = nvml_sim::TOPOLOGIES.iter().find(|t| t.0 == name).unwrap().1;
    let node: Value = serde_json::from_str(json).unwrap();
    let sim = SimNode::shipped(name);
    let seen = python(&sim, READ_NODE, &[])?;
    check(seen["driver"] == node["driver_version"], || {
        format!("{name}: driver {}", seen["driver"])
    })?;
    let nvml = common::open(&sim);
    for (g, p) in node["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .zip(seen["gpus"].as_array().unwrap())
    {
        let ctx = format!("{name} GPU {}", g["index"]);
        check(p["uuid"] == g["uuid"] && p["minor"] == g["minor"], || {
            format!("{ctx}: {p}")
        })?;
        let mig_on = g.get("mig").is_some_and(|m| m["current"] == true);
        if let Some(m) = g.get("mig") {
            check(
                p["mig"]["current"] == json!(u64::from(m["current"] == true)),
                || format!("{ctx}: mig {}", p["mig"]),
            )?;
        } else {
            check(p["mig"].is_null(), || format!("{ctx}: mig {}", p["mig"]))?;
        }
        if mig_on {
            check(p["utilization"] == "not supported", || {
                format!("{ctx}: utilisation {}", p["utilization"])
            })?;
            let want = described_mig(g);
            let devices = p["mig"]["devices"].as_array().unwrap();
            let got: BTreeMap<(u64, u64), (u64, u64)> = devices
                .iter()
                .map(|d| {
                    (
                        (d["gi"].as_u64().unwrap(), d["ci"].as_u64().unwrap()),
                        (d["profile"].as_u64().unwrap(), d["start"].as_u64().unwrap()),
                    )
                })
                .collect();
            check(got == want, || {
                format!("{ctx}: pynvml sees {got:?}, the description says {want:?}")
            })?;
            // And pynvml agrees with nvml-wrapper (what mesos-gpu uses) on every MIG device.
            let parent = nvml
                .device_by_index(u32::try_from(g["index"].as_u64().unwrap()).unwrap())
                .unwrap();
            for d in devices {
                let m = parent
                    .mig_device_by_index(u32::try_from(d["index"].as_u64().unwrap()).unwrap())
                    .unwrap();
                check(
                    d["uuid"] == json!(m.uuid().unwrap()) && d["name"] == json!(m.name().unwrap()),
                    || format!("{ctx}: {d}"),
                )?;
                check(d["is_mig"] == json!(1) && d["parent"] == g["index"], || {
                    format!("{ctx}: {d}")
                })?;
                check(
                    d["memory_total"] == json!(d["memory_mib"].as_u64().unwrap() << 20),
                    || format!("{ctx}: {d}"),
                )?;
                check(d["compute_mode"] == json!(0), || format!("{ctx}: {d}"))?;
            }
        } else {
            check(p["compute_mode"] == json!(0), || {
                format!("{ctx}: compute mode {}", p["compute_mode"])
            })?;
            let want: Vec<Value> = g["processes"]
                .as_array()
                .map(|l| {
                    l.iter()
                        .map(|x| json!([x["pid"], x["used_memory"]]))
                        .collect()
                })
                .unwrap_or_default();
            check(p["processes"] == json!(want), || {
                format!("{ctx}: processes {}", p["processes"])
            })?;
        }
        if let Some(cpus) = g.get("cpu_affinity").and_then(Value::as_str) {
            let node_cpus: Vec<u64> = cpulist(cpus).into_iter().filter(|&c| c < 256).collect();
            check(p["cpus_node"] == json!(node_cpus), || {
                format!("{ctx}: node CPUs {}", p["cpus_node"])
            })?;
            let socket = g["socket_affinity"]["cpus"].as_str().unwrap_or(cpus);
            let socket_cpus: Vec<u64> = cpulist(socket).into_iter().filter(|&c| c < 256).collect();
            check(p["cpus_socket"] == json!(socket_cpus), || {
                format!("{ctx}: socket CPUs {}", p["cpus_socket"])
            })?;
            let mems = match (
                g.get("memory_affinity").and_then(Value::as_str),
                g.get("numa_node"),
            ) {
                (Some(list), _) => json!(cpulist(list)),
                (None, Some(n)) => json!([n]),
                (None, None) => Value::Null,
            };
            check(p["mems_node"] == mems, || {
                format!("{ctx}: memory nodes {}", p["mems_node"])
            })?;
        }
    }
    Ok(())
}

fn compute_mode_set_from_python_is_seen_from_rust() -> Result<(), Failed> {
    let sim = SimNode::shipped("numa-2cpu");
    python(&sim, READ_NODE, &["1", "3"])?;
    let nvml = common::open(&sim);
    let mode = nvml.device_by_index(1).unwrap().compute_mode().unwrap();
    check(mode == ComputeMode::ExclusiveProcess, || {
        format!("GPU 1 is {mode:?}")
    })?;
    // And processes set by a test are what pynvml reports.
    sim.set_processes(
        &nvml.device_by_index(0).unwrap().uuid().unwrap(),
        &[(4242, 1 << 30)],
    );
    let seen = python(&sim, READ_NODE, &[])?;
    check(
        seen["gpus"][0]["processes"] == json!([[4242, 1u64 << 30]]),
        || format!("{}", seen["gpus"][0]),
    )?;
    check(seen["gpus"][1]["compute_mode"] == json!(3), || {
        format!("{}", seen["gpus"][1])
    })
}

/// Reads GPU 0's recovery state with the calls the H200 facts were read with.
const READ_RECOVERY: &str = r#"
import json
import pynvml as n
n.nvmlInit()
h = n.nvmlDeviceGetHandleByIndex(0)
fv = n.nvmlDeviceGetFieldValues(h, [n.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION])[0]
out = {"ret": fv.nvmlReturn, "type": fv.valueType, "action": fv.value.uiVal,
       "rows": list(n.nvmlDeviceGetRemappedRows(h)),
       "ecc": n.nvmlDeviceGetTotalEccErrors(h, n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, n.NVML_VOLATILE_ECC)}
try:
    n.nvmlDeviceGetRetiredPagesPendingStatus(h)
    out["retired"] = "supported"
except n.NVMLError_NotSupported:
    out["retired"] = "not supported"
n.nvmlShutdown()
print(json.dumps(out))
"#;

/// What an H200 with driver 580.159.04 answered (`docs/reference/real-gpu-host.md`):
/// field 230 `NVML_SUCCESS`, unsigned int, 0; remapped rows (0, 0, 0, 0); retired pages pending
/// `NOT_SUPPORTED`; volatile uncorrected ECC 0. Then a pending remapping and a reset request.
fn pynvml_reads_the_recovery_state_as_on_an_h200() -> Result<(), Failed> {
    let gpu = |extra: &str| {
        format!(
            r#"{{ "index": 0, "minor": 0, "uuid": "GPU-2db2aa07-65b0-1102-43ca-3caec9778a8c",
                "name": "NVIDIA H200", "brand": "nvidia", "pci": {{ "bus_id": "00000000:00:06.0" }},
                "memory": {{ "total": 150754820096 }}, "compute_capability": "9.0",
                "ecc": {{}}, "recovery_action": "none", "remapped_rows": {{}}{extra} }}"#
        )
    };
    let sim = SimNode::from_json(&format!(
        r#"{{ "driver_version": "580.159.04", "cuda_driver_version": "13.0", "gpus": [{}] }}"#,
        gpu("")
    ));
    let seen = python(&sim, READ_RECOVERY, &[])?;
    let want = json!({"ret": 0, "type": 1, "action": 0, "rows": [0, 0, 0, 0], "ecc": 0,
                      "retired": "not supported"});
    check(seen == want, || format!("{seen} != {want}"))?;
    sim.append_event("ecc-dbe 0");
    sim.append_event("remap-pending 0");
    sim.append_event("recovery-action 0 gpu_reset");
    let seen = python(&sim, READ_RECOVERY, &[])?;
    let want = json!({"ret": 0, "type": 1, "action": 1, "rows": [0, 0, 1, 0], "ecc": 1,
                      "retired": "not supported"});
    check(seen == want, || format!("{seen} != {want}"))
}

fn main() -> std::process::ExitCode {
    let host = Host::probe();
    let mut trials: Vec<Trial> = [
        "dgx-a100-mig",
        "dgx-a100-mixed",
        "hgx-h100",
        "numa-2cpu",
        "dgx-a100",
        "k80",
    ]
    .into_iter()
    .map(|name| {
        needs(
            &host,
            &[Need::Pynvml],
            Trial::test(format!("pynvml_reads_{name}"), move || {
                pynvml_reads_the_node_file(name)
            }),
        )
    })
    .collect();
    trials.push(needs(
        &host,
        &[Need::Pynvml],
        Trial::test(
            "compute_mode_set_from_python_is_seen_from_rust",
            compute_mode_set_from_python_is_seen_from_rust,
        ),
    ));
    trials.push(needs(
        &host,
        &[Need::Pynvml],
        Trial::test(
            "pynvml_reads_the_recovery_state_as_on_an_h200",
            pynvml_reads_the_recovery_state_as_on_an_h200,
        ),
    ));
    libtest_mimic::run(&Arguments::from_args(), trials).exit_code()
}
