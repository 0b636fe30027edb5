//! Issue 16: `mesos-gpu info` on the MIG nodes, and NVIDIA's own Python binding (nvidia-ml-py,
//! module `pynvml`) reading the same MIG layout from the same simulated driver.
//!
//! The pynvml trials need `python3` with `pynvml` (`scripts/test.sh` installs nvidia-ml-py): they
//! are ignored without it and fail when `MESOS_GPU_REQUIRE` lists `pynvml`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
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

fn agent_flags(
    node: &str,
    strategy: &str,
    isolation: &str,
) -> Result<(bool, String, String), Failed> {
    let out = mesos_gpu(&[
        "agent-flags",
        "--simulate",
        node,
        "--mig-strategy",
        strategy,
        "--cgroups",
        "v1",
        "--isolation",
        isolation,
        "--resources",
        "cpus:32;mem:245760",
    ])?;
    Ok((
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    ))
}

/// `agent-flags` on the MIG nodes: single counts every MIG device as a `gpus` unit, mixed keeps
/// `gpus` for whole GPUs and offers one `mig-<profile>` scalar per profile (never a name with
/// `gpus` in it) with attributes naming the profile ids, and the module gets the strategy in its
/// parameters; Mesos's own `gpu/nvidia` is refused.
fn agent_flags_offer_both_strategies() -> Result<(), Failed> {
    const MODULE: &str = "filesystem/linux,cgroups/devices,org_apache_mesos_gpu_MesosGpuIsolator";
    const A100: &str =
        "gpu_model:NVIDIA-A100-SXM4-40GB;gpu_memory_mib:40960;gpu_compute_capability:8.0";
    let cases = [
        (
            "dgx-a100-mig",
            "single",
            "--resources='cpus:32;mem:245760;gpus:56'\n--attributes=mig_strategy:single\n"
                .to_owned(),
        ),
        (
            "dgx-a100-mixed",
            "single",
            format!(
                "--resources='cpus:32;mem:245760;gpus:20'\n--attributes='{A100};mig_strategy:single'\n"
            ),
        ),
        (
            "dgx-a100-mixed",
            "mixed",
            format!(
                "--resources='cpus:32;mem:245760;gpus:4;mig-1g.5gb:8;mig-2g.10gb:4;mig-3g.20gb:4'\n\
                 --attributes='{A100};mig_strategy:mixed;mig-1g.5gb:19;mig-2g.10gb:14;mig-3g.20gb:9'\n"
            ),
        ),
    ];
    for (node, strategy, want) in cases {
        let (ok, all, err) = agent_flags(node, strategy, MODULE)?;
        let out: String = all
            .lines()
            .skip(1)
            .take(2)
            .map(|l| format!("{l}\n"))
            .collect();
        let modules = all.lines().last().unwrap_or_default();
        let param = format!(r#"{{"key":"mig_strategy","value":"{strategy}"}}"#);
        if !ok
            || out != want
            || !all.starts_with(&format!("--isolation={MODULE}\n"))
            || !modules.starts_with("--modules=")
            || !modules.contains(&param)
        {
            return Err(format!("{node} {strategy}: got\n{all}{err}expected\n{want}").into());
        }
        let resources = out.lines().next().unwrap_or_default();
        if resources.matches("gpus").count() > 1 {
            return Err(format!("a MIG scalar contains `gpus`: {resources}").into());
        }
    }
    let (ok, out, err) = agent_flags(
        "dgx-a100-mixed",
        "mixed",
        "filesystem/linux,cgroups/devices,gpu/nvidia",
    )?;
    let want = "mesos-gpu: error: GPUs [4, 5, 6, 7] are in MIG mode: Mesos's built-in gpu/nvidia would give them to tasks whole, where CUDA sees only their MIG devices; use mesos-gpu's module isolator (org_apache_mesos_gpu_MesosGpuIsolator) without gpu/nvidia, or disable MIG\n";
    if ok || !out.is_empty() || err != want {
        return Err(format!("gpu/nvidia on a MIG node: ok={ok} out={out:?} err={err:?}").into());
    }
    Ok(())
}

/// A health checkpoint holding one MIG device unhealthy (as the module's monitor writes it after
/// an XID on its instance): `info` says so, naming the device and how to clear it.
fn info_notes_an_unhealthy_mig_device() -> Result<(), Failed> {
    let work = tempfile::tempdir().map_err(|e| e.to_string())?;
    let info = info_json("dgx-a100-mixed")?;
    let device = &info["mig"]["devices"][2];
    let uuid = device["uuid"].as_str().ok_or("no MIG device")?;
    let parent = info["gpus"]
        .as_array()
        .ok_or("no gpus")?
        .iter()
        .find(|g| g["index"] == device["parent"])
        .ok_or("no parent")?;
    let checkpoint = serde_json::json!({
        "version": 1,
        "gpus": [],
        "mig": [{
            "index": device["parent"], "uuid": uuid,
            "mig": {
                "parent_uuid": parent["uuid"],
                "gpu_instance": device["gpu_instance"],
                "compute_instance": device["compute_instance"],
            },
            "health": {"state": "unhealthy", "reason": {"kind": "xid", "xid": 94},
                       "since_ms": 1, "last_error_ms": 1, "errors": 1},
            "xids": {"94": 1}, "ecc_single_bit": 0, "ecc_double_bit": 0,
        }],
    });
    std::fs::create_dir(work.path().join("gpu")).map_err(|e| e.to_string())?;
    std::fs::write(work.path().join("gpu/health.json"), checkpoint.to_string())
        .map_err(|e| e.to_string())?;
    let out = mesos_gpu(&[
        "info",
        "--simulate",
        "dgx-a100-mixed",
        "--agent-work-dir",
        work.path().to_str().ok_or("path")?,
    ])?;
    let text = String::from_utf8_lossy(&out.stdout);
    let want = format!(
        "MIG device {uuid} (GPU 4, GPU instance 9, compute instance 0) is checkpointed unhealthy in {}/gpu/health.json: XID 94 (contained ECC error); `mesos-gpu gpu mark-healthy {uuid}` clears it",
        work.path().display()
    );
    if !out.status.success() || !text.contains(&want) {
        return Err(format!("info does not say {want:?}: {text}").into());
    }
    Ok(())
}

/// `mesos-gpu --simulate dgx-a100-mixed docker-args --mig-strategy mixed --plugin` (one line of
/// arguments) with its Docker state and pool under `dir`, and `extra`.
fn docker_args_mixed(dir: &Path, extra: &[&str]) -> Result<std::process::Output, Failed> {
    let state = dir.join("state");
    let pool = dir.join("pool");
    let mut args = vec![
        "--simulate",
        "dgx-a100-mixed",
        "docker-args",
        "--mig-strategy",
        "mixed",
        "--plugin",
        "--docker-state-dir",
        state.to_str().unwrap_or_default(),
        "--pool-dir",
        pool.to_str().unwrap_or_default(),
    ];
    args.extend_from_slice(extra);
    mesos_gpu(&args)
}

/// The arguments of `docker-args`' one line.
fn words(stdout: &[u8]) -> Vec<String> {
    String::from_utf8_lossy(stdout)
        .split_whitespace()
        .map(str::to_owned)
        .collect()
}

/// `docker-args` asked for MIG devices on `dgx-a100-mixed` (GPUs 4-7 in MIG mode), with the
/// driver volume from the plugin so that no volume need be built: `--mig 19:1` alone reserves
/// one 1g.5gb device (before: `--gpus` was required, `--gpus 0` with it) and names it once in
/// `NVIDIA_VISIBLE_DEVICES` (before: twice, the plan's `none` then the MIG UUID); `--gpus 1`
/// beside `--mig` is refused saying why (before: a GPU and a MIG UUID in
/// `CUDA_VISIBLE_DEVICES`); a profile id no MIG device has is "no such profile", naming those
/// the node has (before: "0 free").
fn docker_args_mig_requests_are_checked() -> Result<(), Failed> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let docker_args = |extra: &[&str]| docker_args_mixed(dir.path(), extra);
    let out = docker_args(&["--mig", "19:1"])?;
    let said = |out: &std::process::Output| String::from_utf8_lossy(&out.stderr).into_owned();
    if !out.status.success() {
        return Err(format!("--mig 19:1 alone: {}", said(&out)).into());
    }
    let args = words(&out.stdout);
    let env = |key: &str| -> Vec<&str> {
        args.iter()
            .filter_map(|a| a.strip_prefix(&format!("--env={key}=")))
            .collect()
    };
    let visible = env("NVIDIA_VISIBLE_DEVICES");
    let node = SimNode::shipped("dgx-a100-mixed").inventory()?;
    let device = match visible.as_slice() {
        [uuid] => node.mig.by_uuid(uuid),
        _ => None,
    };
    if device.and_then(|d| d.profile) != Some(19) || env("CUDA_VISIBLE_DEVICES") != visible {
        return Err(format!("--mig 19:1: one 1g.5gb MIG device named once: {args:?}").into());
    }
    let both = docker_args(&["--gpus", "1", "--mig", "19:1"])?;
    if both.status.code() != Some(1)
        || !said(&both)
            .contains("--gpus 1 with --mig: a container gets whole GPUs or MIG devices, not both")
    {
        return Err(format!("--gpus 1 --mig 19:1: {}", said(&both)).into());
    }
    let unknown = docker_args(&["--mig", "99:1"])?;
    let refused = said(&unknown);
    if unknown.status.code() != Some(1)
        || !refused.contains(
            "--mig 99:1: this node has no MIG device of GPU instance profile 99 (its profiles: \
             9 (3g.20gb), 14 (2g.10gb), 19 (1g.5gb))",
        )
    {
        return Err(format!("--mig 99:1: {refused}").into());
    }
    Ok(())
}

/// `docker-args` on `dgx-a100-mixed` with its MIG devices shared 2 ways under MPS (issue 28):
/// two containers asking `--mig 19:1` share one 1g.5gb device, and each gets what a Mesos task
/// holding the share gets: the parent GPU's and the two capability nodes as `--device`, the MIG
/// UUID in `NVIDIA_VISIBLE_DEVICES` and `CUDA_VISIBLE_DEVICES` (once each), `1/2` of it, the
/// pipe directory of the device's own MPS daemon (bound, with `/dev/shm`); one daemon is started,
/// with `CUDA_VISIBLE_DEVICES` the MIG UUID; `gpu list` shows both shares.
fn docker_args_give_a_mig_share_its_device_and_mps_daemon() -> Result<(), Failed> {
    use mesos_gpu_testkit::mps::MpsControl;
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let control = MpsControl::install("{}");
    let mps_root = dir.path().join("mps");
    let program = control.program();
    let docker_args = |extra: &[&str]| {
        let mut args = vec![
            "--gpu-replicas",
            "2",
            "--gpu-sharing",
            "mps,0-3=none",
            "--mps-root",
            mps_root.to_str().unwrap_or_default(),
            "--mps-control",
            program.to_str().unwrap_or_default(),
        ];
        args.extend_from_slice(extra);
        docker_args_mixed(dir.path(), &args)
    };
    let node = SimNode::shipped("dgx-a100-mixed").inventory()?;
    let mut seen = Vec::new();
    let result = (|| -> Result<(), Failed> {
        for _ in 0..2 {
            let out = docker_args(&["--mig", "19:1"])?;
            if !out.status.success() {
                return Err(format!(
                    "--mig 19:1 on a shared node: {}",
                    String::from_utf8_lossy(&out.stderr)
                )
                .into());
            }
            let args = words(&out.stdout);
            let env = |key: &str| -> Vec<&str> {
                args.iter()
                    .filter_map(|a| a.strip_prefix(&format!("--env={key}=")))
                    .collect()
            };
            let visible = env("NVIDIA_VISIBLE_DEVICES");
            let [uuid] = visible.as_slice() else {
                return Err(format!("one MIG device named once: {args:?}").into());
            };
            let device = node
                .mig
                .by_uuid(uuid)
                .ok_or(format!("not a MIG device: {uuid}"))?;
            let caps = device.caps.as_ref().ok_or("no caps")?;
            let devices: Vec<&str> = args
                .iter()
                .filter_map(|a| a.strip_prefix("--device="))
                .collect();
            // By their path in the container (`HOST:CONTAINER`, or one path for both).
            let inside: Vec<&str> = devices
                .iter()
                .filter_map(|d| d.rsplit(':').next())
                .collect();
            let named = |path: &str| inside.contains(&path);
            let pipe = mps_root.join(uuid).join("pipe").display().to_string();
            let ok = device.profile == Some(19)
                && env("CUDA_VISIBLE_DEVICES") == visible
                && env("MESOS_GPU_SHARE") == ["1/2"]
                && env("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE") == ["50"]
                && env("CUDA_MPS_PIPE_DIRECTORY") == [pipe.as_str()]
                && args.contains(&format!("--volume={pipe}:{pipe}"))
                && args.contains(&"--volume=/dev/shm:/dev/shm".to_owned())
                && named(&format!("/dev/nvidia{}", device.parent_minor))
                && named(&format!(
                    "/dev/nvidia-caps/nvidia-cap{}",
                    caps.gpu_instance.minor
                ))
                && named(&format!(
                    "/dev/nvidia-caps/nvidia-cap{}",
                    caps.compute_instance.minor
                ))
                && named("/dev/nvidiactl")
                && named("/dev/nvidia-uvm")
                // Those five, and `nvidia-uvm-tools` where the node has it: nothing else.
                && devices.len() - usize::from(named("/dev/nvidia-uvm-tools")) == 2 + 3;
            if !ok {
                return Err(format!("the share's docker arguments: {args:?}").into());
            }
            seen.push((*uuid).to_owned());
        }
        let starts: Vec<String> = control
            .records()
            .iter()
            .filter(|r| r["event"] == "start")
            .filter_map(|r| Some(r["env"]["CUDA_VISIBLE_DEVICES"].as_str()?.to_owned()))
            .collect();
        if seen[0] != seen[1] || starts != seen[..1] {
            return Err(format!("one device {seen:?}, one daemon for it {starts:?}").into());
        }
        // `gpu list` shows both shares of the MIG device, as it shows shares of a GPU.
        let pool = dir.path().join("pool");
        let list = mesos_gpu(&[
            "--simulate",
            "dgx-a100-mixed",
            "gpu",
            "list",
            "--pool-dir",
            pool.to_str().unwrap_or_default(),
        ])?;
        let text = String::from_utf8_lossy(&list.stdout);
        let shares = text
            .lines()
            .filter(|l| l.contains(&format!("{} (mps)", seen[0])) && l.contains(" 1/2 "))
            .count();
        if !list.status.success() || shares != 2 {
            return Err(format!("gpu list: {text}").into());
        }
        Ok(())
    })();
    control.kill_daemons();
    result
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
                    format!("pynvml_reads_the_mig_layout_info_shows_on_{node}"),
                    move || pynvml_agrees_with_info(node),
                ),
            )
        })
        .collect();
    trials.push(Trial::test(
        "info_lists_mig_devices_like_nvidia_smi_with_caps",
        info_lists_mig_devices_like_nvidia_smi,
    ));
    trials.push(Trial::test(
        "agent_flags_offer_mig_devices_by_strategy",
        agent_flags_offer_both_strategies,
    ));
    trials.push(Trial::test(
        "info_notes_a_mig_device_checkpointed_unhealthy",
        info_notes_an_unhealthy_mig_device,
    ));
    trials.push(Trial::test(
        "docker_args_mig_requests_are_checked",
        docker_args_mig_requests_are_checked,
    ));
    trials.push(Trial::test(
        "docker_args_give_a_mig_share_its_device_and_mps_daemon",
        docker_args_give_a_mig_share_its_device_and_mps_daemon,
    ));
    libtest_mimic::run(&Arguments::from_args(), trials).exit_code()
}
