//! `mesos-gpu demo` run as a process: the DGX-1 stream's allocations and refusals in `--json`,
//! every shipped node, the text output's width and colours, and bad flags.
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
    assert!(
        out.status.success(),
        "{args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8")
}

fn json(args: &[&str]) -> Value {
    serde_json::from_str(&ok(args)).expect("valid JSON")
}

fn task<'a>(report: &'a Value, name: &str) -> &'a Value {
    report["run"]["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["task"] == name)
        .unwrap_or_else(|| panic!("no task {name}"))
}

fn gpus(task: &Value, key: &str) -> Vec<u64> {
    task[key]["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g.as_u64().unwrap())
        .collect()
}

#[test]
fn dgx1_stream_gets_the_expected_gpus_and_refusals() {
    let report = json(&["demo", "--json"]);
    assert_eq!(report["node"], "dgx1-v100", "the default node");
    assert_eq!(report["mode"], "dry-run");
    assert_eq!(report["run"]["policy"], "topology");

    // Two GPUs on a free DGX-1: the NV2 pair under one PCIe switch {2,3} (200 + 50), where
    // first-fit takes the NV1 pair {0,1} (100 + 50).
    let resnet = task(&report, "ml_resnet50-train.1");
    assert_eq!(resnet["outcome"], "granted");
    assert_eq!(gpus(resnet, "chosen"), [2, 3]);
    assert_eq!(resnet["chosen"]["score"], 250);
    assert_eq!(gpus(resnet, "first_fit"), [0, 1]);
    assert_eq!(resnet["first_fit"]["score"], 150);
    let launch = &resnet["launch"];
    assert_eq!(launch["containerizer"], "mesos");
    let rules: Vec<&str> = launch["device_rules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r.as_str().unwrap())
        .collect();
    for want in ["c 195:2 rw", "c 195:3 rw", "c 195:255 rwm"] {
        assert!(rules.contains(&want), "{want} missing from {rules:?}");
    }
    assert!(!rules.contains(&"c 195:1 rw"), "{rules:?}");
    let mounts = launch["mounts"].as_array().unwrap();
    assert!(
        mounts.iter().any(|m| m["source"] == "/dev/nvidia3"),
        "{mounts:?}"
    );

    // Four GPUs next to it: the fully NVLinked quad {4,5,6,7}, through the Docker bridge.
    let bert = task(&report, "ml_bert-finetune.2");
    assert_eq!(gpus(bert, "chosen"), [4, 5, 6, 7]);
    let args: Vec<&str> = bert["launch"]["docker_args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    for want in [
        "--device=/dev/nvidiactl",
        "--device=/dev/nvidia4",
        "--device=/dev/nvidia7",
    ] {
        assert!(args.contains(&want), "{want} missing from {args:?}");
    }
    assert!(
        args.iter()
            .any(|a| a.starts_with("--env=NVIDIA_VISIBLE_DEVICES=GPU-")),
        "{args:?}"
    );

    // A host-filesystem MESOS task gets no mounts, only its device rule.
    let render = task(&report, "viz_render-preview.3");
    assert_eq!(gpus(render, "chosen"), [0]);
    assert!(render["launch"]["mounts"].as_array().unwrap().is_empty());

    let bad = task(&report, "research_half-gpu.4");
    assert_eq!(bad["outcome"], "refused");
    assert_eq!(bad["reason"], "bad_request");
    assert_eq!(
        bad["error"],
        "gpus=1.5: expected a whole number from 0 to 8"
    );
    let full = task(&report, "ml_llm-pretrain.6");
    assert_eq!(full["reason"], "not_enough");
    let later = task(&report, "ml_llm-pretrain.11");
    assert_eq!(gpus(later, "chosen"), [0, 1, 2, 3, 4, 5, 6, 7]);

    let counters = &report["run"]["counters"]["refused"];
    assert_eq!(counters["bad_request"], 1);
    assert_eq!(counters["not_enough"], 1);
    let cmp = &report["run"]["comparison"];
    assert!(
        cmp["chosen_score"].as_u64().unwrap() > cmp["first_fit_score"].as_u64().unwrap(),
        "{cmp}"
    );
    assert_eq!(cmp["worse"], 0);
    assert_eq!(report["other_policy"]["policy"], "first-fit");

    // The volume is planned from the generated driver, or the reason is given; never made up.
    let volume = &report["volume"];
    match volume["plan"].as_object() {
        Some(plan) => {
            let names: Vec<&str> = plan["files"]
                .as_array()
                .unwrap()
                .iter()
                .map(|f| f["name"].as_str().unwrap())
                .collect();
            assert!(names.contains(&"libnvidia-ml.so.550.54.14"), "{names:?}");
            assert!(names.contains(&"nvidia-smi"), "{names:?}");
        }
        None => assert!(
            volume["unavailable"].as_str().unwrap().contains("ldconfig"),
            "{volume}"
        ),
    }
}

#[test]
fn first_fit_policy_takes_the_lowest_gpus() {
    let report = json(&["demo", "--json", "--policy", "first-fit"]);
    let resnet = task(&report, "ml_resnet50-train.1");
    assert_eq!(gpus(resnet, "chosen"), [0, 1]);
    assert_eq!(report["other_policy"]["policy"], "topology");
}

#[test]
fn runs_on_every_shipped_node() {
    for node in [
        "dgx1-v100",
        "dgx-a100",
        "hgx16",
        "k80",
        "pcie-t4x4",
        "driver-no-gpus",
    ] {
        let report = json(&["--simulate", node, "demo", "--json"]);
        let tasks = report["run"]["tasks"].as_array().unwrap();
        assert_eq!(tasks.len(), 11, "{node}");
        let refused_bad = tasks
            .iter()
            .filter(|t| t["reason"] == "bad_request")
            .count();
        assert!(refused_bad >= 1, "{node}: the gpus=1.5 app is refused");
        let granted = tasks.iter().filter(|t| t["outcome"] == "granted").count();
        if node == "driver-no-gpus" {
            assert_eq!(granted, 0, "{node}");
        } else {
            assert!(granted >= 3, "{node}: {granted} granted");
        }
        let text = ok(&["--simulate", node, "demo"]);
        assert!(text.contains("Summary"), "{node}");
    }
}

/// The `docker run` commands of the text, each with its continuation lines joined.
fn docker_runs(text: &str) -> Vec<String> {
    let mut commands = Vec::new();
    let mut current: Option<String> = None;
    for line in text.lines() {
        let body = line.trim();
        match &mut current {
            Some(command) => command.push_str(body),
            None if body.starts_with("docker run ") => current = Some(body.to_owned()),
            None => continue,
        }
        let command = current.as_mut().expect("started");
        match command.strip_suffix('\\') {
            Some(open) => {
                *command = open.to_owned();
            }
            None => commands.push(current.take().expect("started")),
        }
    }
    commands
}

#[test]
fn text_fits_80_columns_without_colour_when_piped() {
    let text = ok(&["demo"]);
    for line in text.lines() {
        // Only an argument too long for any line may go past: it is never cut.
        let words = line
            .trim()
            .trim_start_matches("docker run ")
            .trim_end_matches(" \\")
            .split_whitespace()
            .count();
        assert!(
            line.chars().count() <= 80 || words == 1,
            "{} columns: {line}",
            line.chars().count()
        );
    }
    assert!(!text.contains('\x1b'), "colour codes in piped output");
    for want in [
        "-> GPUs 2,3",
        "REFUSED (bad request)",
        "GPU timeline",
        "c 195:3 rw",
        "docker run",
        "Summary",
    ] {
        assert!(text.contains(want), "{want} missing");
    }
}

#[test]
fn bad_flags_are_refused_with_the_value() {
    let out = mesos_gpu(&["demo", "--policy", "best"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("first-fit, topology"));
    let out = mesos_gpu(&["demo", "--pace", "-1"]);
    assert!(!out.status.success());
    let out = mesos_gpu(&["demo", "--stream", "/nonexistent/stream.json"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/stream.json"));
}

#[test]
fn a_custom_stream_reads_apps_next_to_it() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("two.json"),
        r#"{"id": "/t/two", "cmd": "true", "cpus": 1, "mem": 64, "gpus": 2, "instances": 2}"#,
    )
    .unwrap();
    let stream = dir.path().join("stream.json");
    std::fs::write(
        &stream,
        r#"{"arrivals": [{"at": 5, "app": "two.json", "runs_for": 10}]}"#,
    )
    .unwrap();
    let report = json(&["demo", "--json", "--stream", stream.to_str().unwrap()]);
    let tasks = report["run"]["tasks"].as_array().unwrap();
    assert_eq!(tasks.len(), 2);
    assert_eq!(gpus(&tasks[0], "chosen"), [2, 3]);
    assert_eq!(
        gpus(&tasks[1], "chosen"),
        [6, 7],
        "the other NV2 pair under one switch"
    );
}

#[test]
fn docker_run_lines_wrap_between_arguments() {
    let text = ok(&["demo"]);
    let report = json(&["demo", "--json"]);
    let commands = docker_runs(&text);
    assert!(!commands.is_empty(), "{text}");
    let planned: Vec<Vec<String>> = report["run"]["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["launch"]["docker_args"].as_array())
        .map(|args| {
            args.iter()
                .map(|a| a.as_str().unwrap().to_owned())
                .collect()
        })
        .collect();
    assert_eq!(commands.len(), planned.len());
    for (command, args) in commands.iter().zip(&planned) {
        let words: Vec<&str> = command.split_whitespace().skip(2).collect();
        assert_eq!(words.len(), args.len() + 1, "args and the image: {command}");
        for (word, arg) in words.iter().zip(args) {
            let scratch = report["scratch"].as_str().unwrap();
            assert_eq!(*word, arg.replace(scratch, "$DEMO"), "{command}");
        }
    }
}

/// Issue 17: `demo --gpu-replicas` replays the shipped sharing stream: 1-unit tasks pack onto
/// GPU 0 first, a 2-unit task shares GPU 1, each share allows its GPU only and carries its MPS
/// limits, DOCKER apps take whole GPUs, and the node without sharing refuses far more.
#[test]
fn sharing_scenario_packs_limits_and_compares() {
    let spec = "4,4=1,5=1,6=1,7=1";
    let report = json(&[
        "demo",
        "--gpu-replicas",
        spec,
        "--gpu-sharing",
        "mps",
        "--json",
    ]);
    assert_eq!(report["units"], 20, "{report}");
    let tasks = report["tasks"].as_array().unwrap();
    let find = |name: &str| {
        tasks
            .iter()
            .find(|t| t["task"] == name)
            .unwrap_or_else(|| panic!("no task {name}"))
    };
    for i in 1..=4 {
        let t = find(&format!("serving_inference-small.{i}"));
        assert_eq!(
            (&t["outcome"], &t["gpu"], &t["units"]),
            (&Value::from("share"), &Value::from(0), &Value::from(1)),
            "{t}"
        );
    }
    let one = find("serving_inference-small.1");
    assert_eq!(one["device_rules"][0], "c 195:0 rw", "{one}");
    let env: Vec<&str> = one["environment"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    for want in [
        "MESOS_GPU_SHARE=1/4",
        "MESOS_GPU_SHARING=mps",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=4040M",
    ] {
        assert!(env.contains(&want), "{want} not in {env:?}");
    }
    let resnet = find("ml_resnet50-train.7");
    assert_eq!(
        (&resnet["gpu"], &resnet["units"]),
        (&Value::from(1), &Value::from(2))
    );
    // The shared GPUs are full (16 units) when the second batch of notebooks arrives: each takes
    // one of the whole GPUs 4-7.
    let mut fallback: Vec<u64> = (16..=19)
        .map(|i| {
            let t = find(&format!("research_notebook-small.{i}"));
            assert_eq!(t["outcome"], "whole", "{t}");
            t["gpus"][0].as_u64().unwrap()
        })
        .collect();
    fallback.sort_unstable();
    assert_eq!(fallback, [4, 5, 6, 7]);
    let docker = find("serving_triton-inference.20");
    assert_eq!(docker["outcome"], "refused", "{docker}");
    assert_eq!(report["refused"], 1, "{report}");
    assert_eq!(report["refused_without_sharing"], 13, "{report}");
    let text = ok(&["demo", "--gpu-replicas", spec]);
    assert!(
        text.contains("share 1/4 of GPU 0")
            && text.contains("The same stream without sharing: 13 refused."),
        "{text}"
    );
    let live = mesos_gpu(&["demo", "--gpu-replicas", spec, "--live"]);
    assert!(!live.status.success());
    let err = String::from_utf8_lossy(&live.stderr);
    assert!(
        err.contains("--gpu-replicas") || err.contains("needs root"),
        "{err}"
    );
}

/// Issue 16: on a node whose GPUs are all split (`dgx-a100-mig`, 56 MIG devices), the demo
/// replays the small-work stream with the single strategy: every 1-GPU task gets one MIG
/// device (its parent and two capability nodes `rw`, `MIG-…` in its environment), a 2-GPU
/// task is refused because CUDA uses one MIG device per process, and the same GPUs without MIG
/// refuse far more.
#[test]
fn mig_scenario_single_strategy() {
    let report = json(&["--simulate", "dgx-a100-mig", "demo", "--json"]);
    let tasks = report["tasks"].as_array().unwrap();
    let first = tasks
        .iter()
        .find(|t| t["task"] == "serving_inference-small.1")
        .unwrap();
    assert_eq!(first["outcome"], "mig", "{first}");
    let rw: Vec<&str> = first["device_rules"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .filter(|r| r.ends_with(" rw"))
        .collect();
    assert_eq!(rw.len(), 3, "parent and two capability nodes: {first}");
    assert!(
        first["environment"][0]
            .as_str()
            .unwrap()
            .starts_with("NVIDIA_VISIBLE_DEVICES=MIG-"),
        "{first}"
    );
    let resnet = tasks
        .iter()
        .find(|t| t["task"] == "ml_resnet50-train.7")
        .unwrap();
    assert_eq!(resnet["outcome"], "refused", "{resnet}");
    assert!(
        resnet["error"]
            .as_str()
            .unwrap()
            .contains("CUDA uses only one MIG device per process"),
        "{resnet}"
    );
    assert_eq!(report["refused"], 2, "{report}");
    assert_eq!(report["refused_without_mig"], 13, "{report}");
    let text = ok(&["--simulate", "dgx-a100-mig", "demo"]);
    assert!(
        text.contains("MIG 1g.5gb on GPU 0")
            && text.contains("The same GPUs without MIG: 13 refused."),
        "{text}"
    );
}

/// A single GPU is labelled with what the allocator did (`docs/allocator.md`): topology takes
/// the free GPU least joined to the others, which is not always the lowest free index first-fit
/// takes (on a DGX-1 with GPU 0 taken, GPU 3, not 1) (before: "lowest free index, as Mesos and
/// NVIDIA do" whatever it took); first-fit's label says it takes the lowest index.
#[test]
fn single_gpu_picks_are_labelled_with_what_the_allocator_did() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("one.json"),
        r#"{"id": "/t/one", "cmd": "sleep 1", "cpus": 1, "mem": 128, "gpus": 1, "instances": 1,
            "container": {"type": "MESOS"}}"#,
    )
    .unwrap();
    let stream = dir.path().join("stream.json");
    std::fs::write(
        &stream,
        r#"{"arrivals": [{"at": 0, "app": "one.json", "runs_for": 1000},
                         {"at": 1, "app": "one.json", "runs_for": 1000}]}"#,
    )
    .unwrap();
    let stream = stream.to_str().unwrap();
    let report = json(&["demo", "--json", "--stream", stream]);
    let second = task(&report, "t_one.2");
    assert_eq!(
        (gpus(second, "chosen"), gpus(second, "first_fit")),
        (vec![3], vec![1])
    );
    let text = ok(&["demo", "--stream", stream])
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    assert!(!text.contains("as Mesos and NVIDIA do"), "{text}");
    for want in [
        "single GPU: the free GPU least joined to the other free ones (breaks the fewest strong \
         pairs); here also the lowest free index",
        "single GPU: the free GPU least joined to the other free ones (breaks the fewest strong \
         pairs), not the lowest free index 1 that first-fit takes",
    ] {
        assert!(text.contains(want), "{want}: {text}");
    }
    let text = ok(&["demo", "--stream", stream, "--policy", "first-fit"]);
    assert!(
        text.contains("single GPU: lowest free index (first-fit, Mesos's rule)"),
        "{text}"
    );
}
