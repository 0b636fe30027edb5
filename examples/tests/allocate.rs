//! The `allocate` example against nvml-sim's DGX-1: the topology choices and first-fit's.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;

use mesos_gpu_testkit::nvml_sim::SimNode;

fn allocate(node: &SimNode, counts: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_allocate"))
        .arg("--nvml-lib")
        .arg(node.lib_path())
        .args(counts)
        .env("MESOS_GPU_LOG", "warn")
        .output()
        .expect("run allocate");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8")
}

#[test]
fn dgx1_choices_follow_nvlink() {
    let node = SimNode::shipped("dgx1-v100");
    let out = allocate(&node, &["2", "4", "1.5", "8"]);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "8 GPUs, driver 550.54.14");
    assert!(
        lines[1].starts_with("task-0: 2 GPU(s) -> {2,3} (score 250); first-fit: {0,1} (score 150)"),
        "{out}"
    );
    assert!(
        lines[2].starts_with("task-1: 4 GPU(s) -> {4,5,6,7} (score 1120)"),
        "{out}"
    );
    assert_eq!(
        lines[3],
        "task-2: refused: gpus=1.5: expected a whole number from 0 to 8"
    );
    assert!(
        lines[4].starts_with("task-3: refused: cannot allocate 8 GPUs"),
        "{out}"
    );
    assert_eq!(lines[5], "free: 2 GPU(s), largest all-NVLink set 2");
}

#[test]
fn bad_arguments_are_refused() {
    let out = Command::new(env!("CARGO_BIN_EXE_allocate"))
        .arg("two")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("\"two\": expected a GPU count"));
}
