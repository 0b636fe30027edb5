//! `mesos-gpu gpu probe`: the health monitor's default probe, run by hand on nvml-sim with a
//! stand-in `libcuda.so.1` built by the test (`mesos_gpu_testkit::cuda_sim`): each step is
//! printed, a GPU whose memory fails or whose driver asks for a reset fails the probe, and
//! `--isolated` runs it in a one-GPU cgroup as the monitor does (root).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::{Command, ExitCode, Output};

use libtest_mimic::{Arguments, Failed, Trial};
use mesos_gpu_testkit::cuda_sim::FakeCuda;
use mesos_gpu_testkit::mesos::DevNodes;
use mesos_gpu_testkit::nvml_sim::SimNode;
use mesos_gpu_testkit::{Host, Need, needs};

type TestResult = Result<(), Failed>;

fn check(ok: bool, what: impl Into<String>) -> TestResult {
    if ok { Ok(()) } else { Err(what.into().into()) }
}

/// `pcie-t4x4` whose GPUs report the recovery action field, as drivers from R565 on do.
fn node() -> SimNode {
    let mut value: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../nvml-sim/topologies/pcie-t4x4.json"
        ))
        .unwrap(),
    )
    .unwrap();
    for gpu in value["gpus"].as_array_mut().unwrap() {
        gpu["recovery_action"] = serde_json::json!("none");
        gpu["remapped_rows"] = serde_json::json!({});
        gpu["ecc"] = serde_json::json!({});
    }
    SimNode::from_json(&value.to_string())
}

fn uuid(sim: &SimNode, index: usize) -> String {
    let text = std::fs::read_to_string(sim.config_path()).unwrap();
    let value: serde_json::Value = serde_json::from_str(&text).unwrap();
    value["gpus"][index]["uuid"].as_str().unwrap().to_owned()
}

fn probe(sim: &SimNode, cuda: &FakeCuda, extra: &[&str], visible: &str) -> Output {
    Command::new(env!("CARGO_BIN_EXE_mesos-gpu"))
        .arg("--nvml-lib")
        .arg(sim.lib_path())
        .args(["gpu", "probe", "--cuda-lib"])
        .arg(cuda.lib_path())
        .args(extra)
        .env("CUDA_VISIBLE_DEVICES", visible)
        .env("MESOS_GPU_LOG", "warn")
        .env_remove("NVML_SIM_CONFIG")
        .output()
        .expect("run mesos-gpu gpu probe")
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn each_step_is_printed_and_a_working_gpu_passes() -> TestResult {
    let sim = node();
    let cuda = FakeCuda::build()?;
    let gpu1 = uuid(&sim, 1);
    let out = probe(&sim, &cuda, &["--gpu", "1", "--mib", "4"], &gpu1);
    let t = text(&out);
    println!("{t}");
    check(out.status.success(), format!("exit {}: {t}", out.status))?;
    for (step, says) in [
        ("NVML: find the GPU by UUID", "Tesla T4, index 1"),
        ("NVML: recovery action (field 230)", "NONE"),
        ("NVML: row remapper", "pending false, failure false"),
        ("CUDA: load the driver library and cuInit", "CUDA 12.4"),
        ("CUDA: the device with the GPU's UUID", "ordinal 0 of 1"),
        ("CUDA: create a context", "cuCtxCreate"),
        (
            "CUDA: write a pattern, read it back, compare",
            "4 MiB identical",
        ),
    ] {
        check(
            t.lines()
                .any(|l| l.trim_start().starts_with(&format!("ok   {step}")) && l.contains(says)),
            format!("no `ok {step} … {says}` line in:\n{t}"),
        )?;
    }
    check(t.contains(&format!("GPU 1 ({gpu1}) passed")), t.clone())?;
    Ok(())
}

fn bad_memory_or_a_driver_asking_for_a_reset_fails_the_probe() -> TestResult {
    let sim = node();
    let cuda = FakeCuda::build()?;
    let gpu2 = uuid(&sim, 2);
    cuda.set_failing(true)?;
    let out = probe(&sim, &cuda, &["--gpu", &gpu2], &gpu2);
    let t = text(&out);
    check(
        out.status.code() == Some(1)
            && t.contains("FAIL CUDA: allocate device memory")
            && t.contains("cuMemAlloc_v2 returned CUDA_ERROR_ECC_UNCORRECTABLE (214)")
            && t.contains(&format!("GPU 2 ({gpu2}) FAILED")),
        t.clone(),
    )?;
    cuda.set_failing(false)?;
    sim.append_event("remap-pending 2");
    sim.append_event("recovery-action 2 gpu_reset");
    let out = probe(&sim, &cuda, &["--gpu", "2"], &gpu2);
    let t = text(&out);
    check(
        out.status.code() == Some(1)
            && t.contains("FAIL NVML: recovery action (field 230)")
            && t.contains("the driver asks for a GPU reset (1)")
            && t.contains("FAIL NVML: row remapper"),
        t.clone(),
    )?;
    // CUDA sees no such device: the probe says which it saw.
    let out = probe(&sim, &cuda, &["--gpu", "0"], &gpu2);
    check(
        text(&out).contains("none of the 1 CUDA devices is"),
        text(&out),
    )?;
    // Unknown GPU: named, with the node's GPUs.
    let out = probe(&sim, &cuda, &["--gpu", "9"], &gpu2);
    check(
        out.status.code() == Some(1)
            && text(&out).contains("GPU 9 is not on this node (GPUs: 0 GPU-"),
        text(&out),
    )
}

fn no_cuda_library_skips_the_cuda_steps() -> TestResult {
    let sim = node();
    let cuda = FakeCuda::build()?;
    let out = Command::new(env!("CARGO_BIN_EXE_mesos-gpu"))
        .arg("--nvml-lib")
        .arg(sim.lib_path())
        .args(["gpu", "probe", "--gpu", "3", "--cuda-lib"])
        .arg(cuda.dir().join("missing.so"))
        .env("MESOS_GPU_LOG", "warn")
        .output()
        .expect("run");
    let t = text(&out);
    check(
        out.status.success()
            && t.contains("skip CUDA: load the driver library")
            && t.contains("CUDA checks skipped"),
        t,
    )
}

fn isolated_runs_the_probe_in_a_one_gpu_cgroup() -> TestResult {
    let sim = node();
    let cuda = FakeCuda::build()?;
    let dev = DevNodes::nvidia(&[0, 1, 2, 3])?;
    let gpu1 = uuid(&sim, 1);
    let root = mesos_gpu_testkit::unique_name("probe");
    let out = Command::new(env!("CARGO_BIN_EXE_mesos-gpu"))
        .arg("--nvml-lib")
        .arg(sim.lib_path())
        .arg("--dev-root")
        .arg(dev.path())
        .args([
            "gpu",
            "probe",
            "--gpu",
            "1",
            "--isolated",
            "--cgroups-root",
            &root,
            "--mib",
            "1",
            "--cuda-lib",
        ])
        .arg(cuda.lib_path())
        .env("MESOS_GPU_LOG", "warn")
        .output()
        .expect("run");
    for mount in [
        "/sys/fs/cgroup/devices",
        "/sys/fs/cgroup/unified",
        "/sys/fs/cgroup",
    ] {
        let _ = std::fs::remove_dir(std::path::Path::new(mount).join(&root));
    }
    let t = text(&out);
    println!("{t}");
    check(
        out.status.success()
            && t.contains("in a one-GPU cgroup")
            && t.contains(&format!("| GPU 1 ({gpu1}) passed"))
            && t.contains(&format!("/{root}/gpu-probe-1-")),
        t,
    )
}

fn main() -> ExitCode {
    let host = Host::probe();
    let trials = vec![
        needs(
            &host,
            &[Need::Cc],
            Trial::test(
                "each_step_is_printed_and_a_working_gpu_passes",
                each_step_is_printed_and_a_working_gpu_passes,
            ),
        ),
        needs(
            &host,
            &[Need::Cc],
            Trial::test(
                "bad_memory_or_a_driver_asking_for_a_reset_fails_the_probe",
                bad_memory_or_a_driver_asking_for_a_reset_fails_the_probe,
            ),
        ),
        needs(
            &host,
            &[Need::Cc],
            Trial::test(
                "no_cuda_library_skips_the_cuda_steps",
                no_cuda_library_skips_the_cuda_steps,
            ),
        ),
        needs(
            &host,
            &[Need::Root, Need::Cc],
            Trial::test(
                "isolated_runs_the_probe_in_a_one_gpu_cgroup",
                isolated_runs_the_probe_in_a_one_gpu_cgroup,
            ),
        ),
    ];
    libtest_mimic::run(&Arguments::from_args(), trials).exit_code()
}
