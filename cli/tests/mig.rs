//! Issue 16: `mesos-gpu info` on the MIG nodes, and NVIDIA's own Python binding (nvidia-ml-py,
//! module `pynvml`) reading the same MIG layout from the same simulated driver.
//!
//! The pynvml trials need `python3` with `pynvml` (`scripts/test.sh` installs nvidia-ml-py): they
//! are ignored without it and fail when `MESOS_GPU_REQUIRE` lists `pynvml`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;

use libtest_mimic::{Arguments, Failed, Trial};
use mesos_gpu_testkit::nvml_sim::SimNode;
use mesos_gpu_testkit::{Host, Need, needs};
use serde_json::{Value, json};

/// The MIG devices as pynvml sees them, one JSON list, sorted by (parent, MIG index).
const READ_MIG: &str = r#"
import json
import pynvml as n

n.nvmlInit()
out = []
for i in range(n.nvmlDeviceGetCount()):
    h = n.nvmlDeviceGetHandleByIndex(i)
    try:
        cur, _ = n.nvmlDeviceGetMigMode(h)
    except n.NVMLError_NotSupported:
        continue
    if not cur:
        continue
    for mi in range(n.nvmlDeviceGetMaxMigDeviceCount(h)):
        try:
            m = n.nvmlDeviceGetMigDeviceHandleByIndex(h, mi)
        except n.NVMLError_NotFound:
            continue
        gi_id = n.nvmlDeviceGetGpuInstanceId(m)
        info = n.nvmlGpuInstanceGetInfo(n.nvmlDeviceGetGpuInstanceById(h, gi_id))
        attrs = n.nvmlDeviceGetAttributes(m)
        out.append({
            "parent": i,
            "index": mi,
            "uuid": n.nvmlDeviceGetUUID(m),
            "gpu_instance": gi_id,
            "compute_instance": n.nvmlDeviceGetComputeInstanceId(m),
            "profile": info.profileId,
            "profile_name": n.nvmlDeviceGetName(m).split(" MIG ")[1],
            "memory_total": n.nvmlDeviceGetMemoryInfo(m).total,
            "multiprocessors": attrs.multiprocessorCount,
        })
print(json.dumps(out))
n.nvmlShutdown()
"#;

fn mesos_gpu(args: &[&str]) -> Result<std::process::Output, Failed> {
    Command::new(env!("CARGO_BIN_EXE_mesos-gpu"))
        .args(args)
        .env_remove("NVML_SIM_CONFIG")
        .env_remove("MESOS_GPU_NVML_LIB")
        .env("MESOS_GPU_LOG", "warn")
        .output()
        .map_err(|e| format!("run mesos-gpu: {e}").into())
}

fn info_json(node: &str) -> Result<Value, Failed> {
    let out = mesos_gpu(&["info", "--json", "--simulate", node])?;
    if !out.status.success() {
        return Err(format!("info failed: {}", String::from_utf8_lossy(&out.stderr)).into());
    }
    serde_json::from_slice(&out.stdout).map_err(|e| format!("info JSON: {e}").into())
}

fn pynvml_agrees_with_info(node: &str) -> Result<(), Failed> {
    let sim = SimNode::shipped(node);
    let out = Command::new("python3")
        .arg("-c")
        .arg(READ_MIG)
        .env("LD_LIBRARY_PATH", sim.dir())
        .env_remove("NVML_SIM_CONFIG")
        .output()
        .map_err(|e| format!("run python3: {e}"))?;
    if !out.status.success() {
        return Err(format!("python3: {}", String::from_utf8_lossy(&out.stderr)).into());
    }
    let seen: Value =
        serde_json::from_slice(&out.stdout).map_err(|e| format!("python3 output: {e}"))?;
    let info = info_json(node)?;
    let fields = [
        "parent",
        "index",
        "uuid",
        "gpu_instance",
        "compute_instance",
        "profile",
        "profile_name",
        "memory_total",
        "multiprocessors",
    ];
    let ours: Vec<Value> = info["mig"]["devices"]
        .as_array()
        .ok_or("info has no mig.devices")?
        .iter()
        .map(|d| {
            Value::Object(
                fields
                    .iter()
                    .map(|&f| (f.to_owned(), d[f].clone()))
                    .collect(),
            )
        })
        .collect();
    let theirs = seen.as_array().ok_or("pynvml printed no list")?;
    if theirs.is_empty() {
        return Err(format!("{node}: pynvml sees no MIG device").into());
    }
    if ours != *theirs {
        return Err(format!("{node}: mesos-gpu info {}\npynvml {}", json!(ours), seen).into());
    }
    Ok(())
}

/// The text `info` prints: one `nvidia-smi -L` line per MIG device under its parent, with its
/// instance ids and the two capability nodes.
fn info_lists_mig_devices_like_nvidia_smi() -> Result<(), Failed> {
    let out = mesos_gpu(&["info", "--simulate", "dgx-a100-mixed"])?;
    let text = String::from_utf8(out.stdout).map_err(|e| e.to_string())?;
    let info = info_json("dgx-a100-mixed")?;
    let want_header = "MIG: GPU 4, 5, 6, 7 in MIG mode (never given whole; their MIG devices are the units), nvidia-caps major 235";
    if !text.contains(want_header) {
        return Err(format!("no MIG header in:\n{text}").into());
    }
    for d in info["mig"]["devices"].as_array().unwrap() {
        let line = format!(
            "  MIG {:<12}Device {:>2}: (UUID: {})\n      GI {} CI {}, profile {}, {} SMs, {} MiB, caps /dev/nvidia-caps/nvidia-cap{gi} (235:{gi}), /dev/nvidia-caps/nvidia-cap{ci} (235:{ci})\n",
            d["profile_name"].as_str().unwrap(),
            d["index"].as_u64().unwrap(),
            d["uuid"].as_str().unwrap(),
            d["gpu_instance"],
            d["compute_instance"],
            d["profile"],
            d["multiprocessors"],
            d["memory_total"].as_u64().unwrap() >> 20,
            gi = d["caps"]["gpu_instance"]["minor"],
            ci = d["caps"]["compute_instance"]["minor"],
        );
        if !text.contains(&line) {
            return Err(format!("missing\n{line}in\n{text}").into());
        }
    }
    let plain = info_json("dgx-a100")?;
    if plain.get("mig").is_some() {
        return Err(format!("a node without MIG shows mig: {}", plain["mig"]).into());
    }
    Ok(())
}

fn main() -> std::process::ExitCode {
    let host = Host::probe();
    let mut trials: Vec<Trial> = ["dgx-a100-mig", "dgx-a100-mixed", "hgx-h100"]
        .into_iter()
        .map(|node| {
            needs(
                &host,
                &[Need::Pynvml],
                Trial::test(
                    format!("issue_16_pynvml_reads_the_mig_layout_info_shows_on_{node}"),
                    move || pynvml_agrees_with_info(node),
                ),
            )
        })
        .collect();
    trials.push(Trial::test(
        "issue_16_info_lists_mig_devices_like_nvidia_smi_with_caps",
        info_lists_mig_devices_like_nvidia_smi,
    ));
    libtest_mimic::run(&Arguments::from_args(), trials).exit_code()
}
