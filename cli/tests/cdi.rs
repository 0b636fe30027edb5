//! `mesos-gpu cdi generate` and the CDI spec `serve` keeps, on simulated nodes with computed
//! device numbers (no root; `cdi_podman.rs` runs a real consumer on real device nodes). Every
//! spec goes to a temporary directory: the host's `/var/run/cdi` is never written.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// How long `serve` may take to start and poll on a loaded 2-core machine; not a bound.
const PATIENCE: Duration = Duration::from_secs(30);

fn mesos_gpu(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_mesos-gpu"))
        .args(args)
        .env("MESOS_GPU_LOG", "warn")
        .output()
        .expect("run mesos-gpu")
}

struct Dirs {
    tmp: tempfile::TempDir,
}

impl Dirs {
    fn new() -> Dirs {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(tmp.path().join("etc")).unwrap();
        std::fs::create_dir_all(tmp.path().join("run")).unwrap();
        Dirs { tmp }
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.tmp.path().join(rel)
    }

    /// `mesos-gpu serve` on the simulated k80 with its paths in this tree.
    fn serve(&self) -> Command {
        mesos_gpu_testkit::serve::command(env!("CARGO_BIN_EXE_mesos-gpu"), "k80", self.tmp.path())
    }

    fn spec(&self) -> PathBuf {
        self.path("run/nvidia.com-gpu.json")
    }

    fn spec_dirs(&self) -> String {
        format!(
            "{},{}",
            self.path("etc").display(),
            self.path("run").display()
        )
    }

    fn generate(&self, node: &str, extra: &[&str]) -> Output {
        let spec = self.spec();
        let dirs = self.spec_dirs();
        let volumes = self.path("volumes");
        let mut args = vec![
            "cdi",
            "generate",
            "--simulate",
            node,
            "--output",
            spec.to_str().unwrap(),
            "--spec-dirs",
            &dirs,
            "--volume-root",
            volumes.to_str().unwrap(),
        ];
        args.extend(extra);
        mesos_gpu(&args)
    }
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn read_json(path: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

const NVIDIA_YAML: &str = "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n- name: \"1\"\n  containerEdits:\n    deviceNodes:\n    - path: /dev/nvidia1\n";

/// Issue 37: a computed spec leaves out `nvidia-uvm-tools`, which the host may have; stderr says
/// so in one line with the option that includes it, whether the spec is printed or written.
fn assert_left_out_is_said(out: &Output) {
    let err = stderr(out);
    let lines: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("/dev/nvidia-uvm-tools is left out of the spec"))
        .collect();
    assert_eq!(lines.len(), 1, "{err}");
    assert!(lines[0].contains("--dev-root /dev"), "{err}");
}

#[test]
fn generate_writes_once_and_reports_it() {
    let d = Dirs::new();
    let out = d.generate("k80", &["--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let report: Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(report["outcome"], "written");
    assert_eq!(report["spec"]["cdi_version"], "0.5.0");
    assert_eq!(report["spec"]["devices"].as_array().unwrap().len(), 9);
    assert!(
        report["spec"]["device_numbers"]
            .as_str()
            .unwrap()
            .starts_with("computed"),
        "{report}"
    );
    assert!(
        stderr(&out).contains("the driver volume does not exist yet"),
        "{}",
        stderr(&out)
    );
    assert_left_out_is_said(&out);
    let spec = read_json(&d.spec());
    assert_eq!(spec["kind"], "nvidia.com/gpu");
    assert_eq!(
        spec["devices"][0]["containerEdits"]["deviceNodes"][0]["path"],
        "/dev/nvidia2"
    );

    let again = d.generate("k80", &[]);
    assert!(again.status.success(), "{}", stderr(&again));
    let text = stdout(&again);
    assert!(text.contains(": unchanged"), "{text}");
    assert!(text.contains("cdiVersion:     0.5.0"), "{text}");
    assert!(
        text.contains("9 as nvidia.com/gpu=<name>: 0,1,2,3 by index, 4 by UUID, all"),
        "{text}"
    );
}

#[test]
fn generate_on_a_simulated_node_prints_unless_told_where() {
    let out = mesos_gpu(&["cdi", "generate", "--simulate", "pcie-t4x4"]);
    assert!(out.status.success(), "{}", stderr(&out));
    // The guide's promise: the output says the numbers are computed, and what is left out.
    assert!(
        stderr(&out).contains("device numbers computed (195:<minor> for GPUs")
            && stderr(&out).contains("the optional nvidia-uvm-tools left out"),
        "{}",
        stderr(&out)
    );
    assert_left_out_is_said(&out);
    let spec: Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(spec["cdiVersion"], "0.5.0");
    assert_eq!(spec["devices"].as_array().unwrap().len(), 9);
    let dash = mesos_gpu(&[
        "cdi",
        "generate",
        "--simulate",
        "pcie-t4x4",
        "--output",
        "-",
    ]);
    assert_eq!(dash.stdout, out.stdout);
}

#[test]
fn generate_refuses_a_spec_declaring_the_same_devices_beside_it() {
    let d = Dirs::new();
    assert!(d.generate("k80", &[]).status.success());
    let theirs = d.path("run/nvidia.yaml");
    std::fs::write(&theirs, NVIDIA_YAML).unwrap();
    let out = d.generate("k80", &[]);
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    let err = stderr(&out);
    assert!(
        err.contains("nvidia.yaml also declares nvidia.com/gpu device(s) 1"),
        "{err}"
    );
    assert!(err.contains("ours was removed"), "{err}");
    assert!(!d.spec().exists());
    assert!(theirs.exists());

    // In the static directory it is only shadowed: ours is written and the overlap reported.
    std::fs::rename(&theirs, d.path("etc/nvidia.yaml")).unwrap();
    let out = d.generate("k80", &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("also declared:  1 by "),
        "{}",
        stdout(&out)
    );
    assert!(
        stdout(&out).contains("ours has the higher priority"),
        "{}",
        stdout(&out)
    );
}

#[test]
fn no_gpus_removes_the_spec() {
    let d = Dirs::new();
    assert!(d.generate("k80", &[]).status.success());
    assert!(d.spec().exists());
    let out = d.generate("driver-no-gpus", &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(!d.spec().exists());
    let text = stdout(&out);
    assert!(text.contains(": removed"), "{text}");
    assert!(text.contains("no GPUs:"), "{text}");
    let print = mesos_gpu(&[
        "cdi",
        "generate",
        "--simulate",
        "driver-no-gpus",
        "--output",
        "-",
    ]);
    assert_eq!(print.status.code(), Some(1));
    assert!(
        stderr(&print).contains("no GPU to declare"),
        "{}",
        stderr(&print)
    );
}

#[test]
fn bad_flags_are_refused() {
    let out = mesos_gpu(&["cdi", "generate", "--simulate", "k80", "--no-such-flag"]);
    assert_eq!(out.status.code(), Some(2));
    let out = mesos_gpu(&["cdi"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("generate"), "{}", stderr(&out));
    let out = mesos_gpu(&["serve", "--no-cdi", "--cdi-spec", "/tmp/x.json"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
}

/// `mesos-gpu serve`, killed on drop.
struct Serve(Child);

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn wait_for(what: &str, serve: &mut Serve, ok: impl Fn() -> bool) {
    let deadline = Instant::now() + PATIENCE;
    while !ok() {
        if let Some(status) = serve.0.try_wait().unwrap() {
            panic!("serve exited early ({status}) while waiting until {what}");
        }
        assert!(Instant::now() < deadline, "serve did not make {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn serve_keeps_the_spec_current() {
    let d = Dirs::new();
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .unwrap();
    let mut serve = Serve(
        d.serve()
            .args(["--driver-poll", "1", "--listen"])
            .arg(port.to_string())
            .arg("--cdi-spec")
            .arg(d.spec())
            .arg("--cdi-spec-dirs")
            .arg(d.spec_dirs())
            .env("MESOS_GPU_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("run mesos-gpu serve"),
    );
    let spec = d.spec();
    wait_for("the spec", &mut serve, || spec.exists());
    let written = std::fs::read(&spec).unwrap();
    assert_eq!(
        serde_json::from_slice::<Value>(&written).unwrap()["devices"]
            .as_array()
            .unwrap()
            .len(),
        9
    );

    // A spec altered or deleted by hand is put back at the next poll.
    std::fs::write(&spec, b"{}").unwrap();
    wait_for("the spec whole again", &mut serve, || {
        std::fs::read(&spec).is_ok_and(|b| b == written)
    });
    std::fs::remove_file(&spec).unwrap();
    wait_for("the spec again", &mut serve, || spec.exists());

    // NVIDIA's spec appears beside it: ours goes, so runtimes keep theirs; and comes back after.
    let theirs = d.path("run/nvidia.yaml");
    std::fs::write(&theirs, NVIDIA_YAML).unwrap();
    wait_for("way for the other spec", &mut serve, || !spec.exists());
    std::fs::remove_file(&theirs).unwrap();
    wait_for("the spec once the other is gone", &mut serve, || {
        std::fs::read(&spec).is_ok_and(|b| b == written)
    });
}

#[test]
fn serve_on_a_simulated_node_keeps_no_spec_unless_named() {
    let d = Dirs::new();
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .unwrap();
    let mut child = d
        .serve()
        .args(["--driver-poll", "0", "--listen"])
        .arg(port.to_string())
        .env("MESOS_GPU_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run mesos-gpu serve");
    let stderr = child.stderr.take().unwrap();
    let mut serve = Serve(child);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead as _;
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let deadline = Instant::now() + PATIENCE;
    let mut seen = Vec::new();
    loop {
        match rx.recv_timeout(Duration::from_millis(200)) {
            Ok(line) if line.contains("simulated node: no CDI spec is kept") => break,
            Ok(line) => seen.push(line),
            Err(_) => {
                if let Some(status) = serve.0.try_wait().unwrap() {
                    panic!("serve exited ({status}):\n{}", seen.join("\n"));
                }
                assert!(
                    Instant::now() < deadline,
                    "no such log line:\n{}",
                    seen.join("\n")
                );
            }
        }
    }
    assert!(
        !seen.iter().any(|l| l.contains("wrote the CDI spec")),
        "{seen:?}"
    );
}

/// On MIG nodes each MIG device is a CDI device, named as `nvidia-ctk cdi generate` names it
/// (`<gpu>:<mig>` and `MIG-<uuid>`), with its parent's node and its two capability nodes (the
/// numbers `info` reads from the driver's files) and no variable (the common edits' `void`
/// leaves the selection to CDI); a GPU in MIG mode is never offered whole (before: every
/// MIG-mode GPU whole, no MIG device).
#[test]
fn mig_devices_are_offered_and_mig_mode_gpus_are_not() {
    for node in ["dgx-a100-mig", "dgx-a100-mixed"] {
        let out = mesos_gpu(&["cdi", "generate", "--simulate", node, "--output", "-"]);
        assert!(out.status.success(), "{node}: {}", stderr(&out));
        let spec: Value = serde_json::from_str(&stdout(&out)).unwrap();
        let info = mesos_gpu(&["info", "--simulate", node, "--json"]);
        let info: Value = serde_json::from_str(&stdout(&info)).unwrap();
        let names: Vec<&str> = spec["devices"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d["name"].as_str().unwrap())
            .collect();
        let enabled: Vec<u64> = info["mig"]["enabled"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap())
            .collect();
        for gpu in info["gpus"].as_array().unwrap() {
            let index = gpu["index"].as_u64().unwrap();
            let whole = names.contains(&index.to_string().as_str())
                || names.contains(&gpu["uuid"].as_str().unwrap());
            assert_eq!(
                whole,
                !enabled.contains(&index),
                "{node}: GPU {index}: {names:?}"
            );
        }
        let device = |name: &str| {
            spec["devices"]
                .as_array()
                .unwrap()
                .iter()
                .find(|d| d["name"] == name)
                .unwrap_or_else(|| panic!("{node}: no device {name} in {names:?}"))
                .clone()
        };
        let migs = info["mig"]["devices"].as_array().unwrap();
        assert!(!migs.is_empty(), "{node}");
        for mig in migs {
            let name = format!("{}:{}", mig["parent"], mig["index"]);
            let uuid = mig["uuid"].as_str().unwrap();
            let by_index = device(&name);
            assert_eq!(by_index["containerEdits"], device(uuid)["containerEdits"]);
            let edits = &by_index["containerEdits"];
            // The selection is CDI's alone: no NVIDIA_VISIBLE_DEVICES per device (the common
            // edits set it to `void`, as nvidia-ctk writes).
            assert!(
                edits["env"].as_array().is_none_or(Vec::is_empty),
                "{node} {name}: {edits}"
            );
            let nodes: Vec<(String, u64, u64)> = edits["deviceNodes"]
                .as_array()
                .unwrap()
                .iter()
                .map(|n| {
                    (
                        n["path"].as_str().unwrap().to_owned(),
                        n["major"].as_u64().unwrap(),
                        n["minor"].as_u64().unwrap(),
                    )
                })
                .collect();
            let caps = &mig["caps"];
            let cap = |which: &str| {
                let minor = caps[which]["minor"].as_u64().unwrap();
                (
                    format!("/dev/nvidia-caps/nvidia-cap{minor}"),
                    caps[which]["major"].as_u64().unwrap(),
                    minor,
                )
            };
            let parent = mig["parent_minor"].as_u64().unwrap();
            assert_eq!(
                nodes,
                [
                    (format!("/dev/nvidia{parent}"), 195, parent),
                    cap("gpu_instance"),
                    cap("compute_instance"),
                ],
                "{node} {name}"
            );
        }
        assert_eq!(
            names.len(),
            2 * (migs.len() + info["gpus"].as_array().unwrap().len() - enabled.len()) + 1,
            "{node}: {names:?}"
        );
    }
}
