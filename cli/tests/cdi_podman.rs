//! A real CDI consumer: Debian's podman reads the spec `mesos-gpu cdi generate` writes and starts
//! busybox containers with `--device nvidia.com/gpu=<name>`.
//!
//! The node is nvml-sim's K80 board (GPU index 0 is `/dev/nvidia2`: minors are not indices). Its
//! device nodes are `mknod`ed in a private device root, so the spec's numbers are read from real
//! nodes (`nvidia-uvm` gets a major the kernel has not assigned, as its dynamic major would be).
//! In the container, an allowed node opens with ENXIO (no driver behind it) and a node of another
//! GPU is absent, and cannot be made (`mknod`: EPERM from the device cgroup) nor opened.
//! The environment names no GPU: `NVIDIA_VISIBLE_DEVICES=void`, as NVIDIA's own specs set it, so
//! CDI alone selects the devices (NVIDIA's legacy runtime hook, where configured, adds none).
//!
//! Podman 4.3 reads CDI specs only from `/etc/cdi` and `/var/run/cdi`: each podman command runs
//! in a private mount namespace where a tmpfs covers `/run` and the test's spec directory is
//! bound on `/run/cdi` (and a tmpfs hides `/etc/cdi` if the host has one), so the host's CDI
//! directories are neither read nor written. Storage (`--root`, `--runroot`, vfs), the
//! configuration (`CONTAINERS_CONF`) and the cgroup parent are the test's own and removed at the
//! end; the image is imported from a tarball (no registry).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Output};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use libtest_mimic::{Arguments, Failed, Trial};
use mesos_gpu_testkit::{Host, Need, needs, run_checked, unique_name};
use serde_json::Value;

const NODE: &str = "k80";
const NEEDS: &[Need] = &[Need::Root, Need::Podman];
/// How long podman's after-exit cleanup processes may take on a loaded machine.
const CLEANUP_PATIENCE: Duration = Duration::from_secs(30);

/// What every trial shares: the spec, the device root, podman's private state, the image.
struct Fixture {
    dir: PathBuf,
    cdi_dir: PathBuf,
    dev_root: PathBuf,
    spec: Value,
    image: String,
    cgroup_parent: String,
    uvm_major: u32,
}

static FIXTURE: OnceLock<Result<Fixture, String>> = OnceLock::new();

fn fixture() -> Result<&'static Fixture, Failed> {
    FIXTURE
        .get_or_init(Fixture::new)
        .as_ref()
        .map_err(|e| Failed::from(format!("fixture: {e}")))
}

/// A character-device major nothing on the host uses, standing for nvidia-uvm's dynamic one.
fn unused_major() -> Result<u32, String> {
    let devices = fs::read_to_string("/proc/devices").map_err(|e| e.to_string())?;
    let used: Vec<u32> = devices
        .lines()
        .take_while(|l| !l.starts_with("Block"))
        .filter_map(|l| l.split_whitespace().next()?.parse().ok())
        .collect();
    (234..=254)
        .rev()
        .find(|m| !used.contains(m))
        .ok_or_else(|| "no unused character major in 234..=254".to_owned())
}

fn mknod(path: &Path, major: u32, minor: u32) -> Result<(), String> {
    run_checked(
        Command::new("mknod")
            .arg(path)
            .arg("c")
            .arg(major.to_string())
            .arg(minor.to_string()),
    )
    .map(drop)
}

impl Fixture {
    fn new() -> Result<Fixture, String> {
        let name = unique_name("podman");
        let dir = std::env::temp_dir().join(&name);
        fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let fixture = Fixture {
            cdi_dir: dir.join("cdi"),
            dev_root: dir.join("dev"),
            spec: Value::Null,
            image: format!("localhost/{name}:1"),
            cgroup_parent: format!("/{name}"),
            uvm_major: unused_major()?,
            dir: dir.clone(),
        };
        fixture.setup().inspect_err(|_| {
            let _ = fs::remove_dir_all(&dir);
        })
    }

    fn setup(mut self) -> Result<Fixture, String> {
        for d in [&self.cdi_dir, &self.dev_root] {
            fs::create_dir_all(d).map_err(|e| format!("{}: {e}", d.display()))?;
        }
        // The K80's minors are 2, 3, 0, 1 for indices 0..3.
        for minor in 0..4 {
            mknod(&self.dev_root.join(format!("nvidia{minor}")), 195, minor)?;
        }
        mknod(&self.dev_root.join("nvidiactl"), 195, 255)?;
        mknod(&self.dev_root.join("nvidia-uvm"), self.uvm_major, 0)?;
        mknod(&self.dev_root.join("nvidia-uvm-tools"), self.uvm_major, 1)?;

        let spec_path = self.cdi_dir.join("nvidia.com-gpu.json");
        let out = mesos_gpu(&[
            "cdi",
            "generate",
            "--simulate",
            NODE,
            "--dev-root",
            self.dev_root.to_str().unwrap(),
            "--volume-root",
            self.dir.join("volumes").to_str().unwrap(),
            "--output",
            spec_path.to_str().unwrap(),
            "--spec-dirs",
            self.cdi_dir.to_str().unwrap(),
        ]);
        if !out.status.success() {
            return Err(format!(
                "cdi generate: {}\n{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        self.spec = serde_json::from_slice(&fs::read(&spec_path).map_err(|e| e.to_string())?)
            .map_err(|e| e.to_string())?;
        let volume = self.spec["containerEdits"]["mounts"][0]["hostPath"]
            .as_str()
            .ok_or("the spec mounts no driver volume")?;
        fs::create_dir_all(Path::new(volume).join("bin")).map_err(|e| e.to_string())?;
        fs::write(Path::new(volume).join("bin/marker"), "driver volume\n")
            .map_err(|e| e.to_string())?;

        fs::write(
            self.dir.join("containers.conf"),
            // This sandbox lacks CAP_SYS_RESOURCE: podman's default rlimits (raised to the
            // maximum) cannot be set, so ask for ones under the current limits.
            "[containers]\ndefault_ulimits = [\"nofile=1024:1024\", \"nproc=1024:1024\"]\n\
             netns = \"none\"\n[engine]\ncgroup_manager = \"cgroupfs\"\nevents_logger = \"none\"\n",
        )
        .map_err(|e| e.to_string())?;
        let rootfs = self.dir.join("rootfs");
        fs::create_dir_all(rootfs.join("bin")).map_err(|e| e.to_string())?;
        fs::copy("/bin/busybox", rootfs.join("bin/busybox"))
            .map_err(|e| format!("/bin/busybox (busybox-static): {e}"))?;
        std::os::unix::fs::symlink("busybox", rootfs.join("bin/sh")).map_err(|e| e.to_string())?;
        let tarball = self.dir.join("busybox.tar");
        run_checked(
            Command::new("tar")
                .arg("-C")
                .arg(&rootfs)
                .arg("-cf")
                .arg(&tarball)
                .arg("."),
        )?;
        self.podman(&["import", tarball.to_str().unwrap(), &self.image])?;
        Ok(self)
    }

    /// `podman ARGS` in a private mount namespace whose `/run/cdi` is the test's spec directory.
    fn podman_output(&self, args: &[&str]) -> Result<Output, String> {
        self.podman_in(&self.cdi_dir, args)
    }

    fn podman_in(&self, cdi_dir: &Path, args: &[&str]) -> Result<Output, String> {
        let script = "set -e\n\
            mount -t tmpfs mgpu-test-run /run\n\
            mkdir /run/cdi\n\
            mount --bind \"$MGPU_CDI_DIR\" /run/cdi\n\
            if [ -d /etc/cdi ]; then mount -t tmpfs mgpu-test-etc-cdi /etc/cdi; fi\n\
            exec podman --root \"$MGPU_DIR/storage\" --runroot \"$MGPU_DIR/runroot\" \
                --tmpdir \"$MGPU_DIR/tmp\" --storage-driver vfs \"$@\"\n";
        Command::new("unshare")
            .args([
                "--mount",
                "--propagation",
                "private",
                "sh",
                "-c",
                script,
                "sh",
            ])
            .args(args)
            .env("MGPU_CDI_DIR", cdi_dir)
            .env("MGPU_DIR", &self.dir)
            .env("CONTAINERS_CONF", self.dir.join("containers.conf"))
            .output()
            .map_err(|e| format!("unshare podman: {e}"))
    }

    fn podman(&self, args: &[&str]) -> Result<String, String> {
        self.podman_ok(&self.cdi_dir, args)
    }

    /// `podman ARGS` with the specs of `cdi_dir`; its stdout, or why it failed.
    fn podman_ok(&self, cdi_dir: &Path, args: &[&str]) -> Result<String, String> {
        let out = self.podman_in(cdi_dir, args)?;
        if !out.status.success() {
            return Err(format!(
                "podman {args:?}: {}\n{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Runs `script` in a busybox container given `devices`; its output, one `key: value` per
    /// line.
    fn run(&self, devices: &[&str], script: &str) -> Result<String, String> {
        self.run_in(&self.cdi_dir, devices, script)
    }

    /// [`Fixture::run`] with the specs of `cdi_dir`.
    fn run_in(&self, cdi_dir: &Path, devices: &[&str], script: &str) -> Result<String, String> {
        let mut args = vec![
            "run",
            "--rm",
            "--cap-add",
            "MKNOD",
            "--cgroup-parent",
            &self.cgroup_parent,
        ];
        for d in devices {
            args.extend(["--device", d]);
        }
        args.extend([self.image.as_str(), "/bin/busybox", "sh", "-c", script]);
        self.podman_ok(cdi_dir, &args)
    }

    /// The UUID name of the GPU with NVML index `index`: the device declared right after its
    /// index name, with the same edits.
    fn gpu_uuid(&self, index: u32) -> String {
        let devices = self.spec["devices"].as_array().unwrap();
        let at = devices
            .iter()
            .position(|d| d["name"].as_str() == Some(index.to_string().as_str()))
            .unwrap();
        let by_uuid = &devices[at + 1];
        assert_eq!(by_uuid["containerEdits"], devices[at]["containerEdits"]);
        by_uuid["name"].as_str().unwrap().to_owned()
    }

    /// Removes the image, the cgroups and the directory, once the `podman container cleanup`
    /// processes conmon starts after each container (in `<parent>/conmon`) have exited.
    fn cleanup(&self) {
        let _ = self.podman_output(&["rmi", "--force", &self.image]);
        let parents: Vec<PathBuf> = fs::read_dir("/sys/fs/cgroup")
            .into_iter()
            .flatten()
            .flatten()
            .map(|h| h.path().join(self.cgroup_parent.trim_start_matches('/')))
            .collect();
        let deadline = Instant::now() + CLEANUP_PATIENCE;
        while parents.iter().any(|p| has_processes(p)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
        }
        for parent in &parents {
            remove_cgroup(parent);
            if parent.exists() {
                eprintln!("cleanup: cannot remove cgroup {}", parent.display());
            }
        }
        if let Err(e) = fs::remove_dir_all(&self.dir) {
            eprintln!("cleanup: cannot remove {}: {e}", self.dir.display());
        }
    }
}

/// True when a process is in the cgroup `dir` or below it.
fn has_processes(dir: &Path) -> bool {
    fs::read_to_string(dir.join("cgroup.procs")).is_ok_and(|p| !p.trim().is_empty())
        || fs::read_dir(dir)
            .into_iter()
            .flatten()
            .flatten()
            .any(|c| c.file_type().is_ok_and(|t| t.is_dir()) && has_processes(&c.path()))
}

/// Removes a cgroup and the ones podman made under it (`conmon`, emptied containers), deepest
/// first; cgroup directories go with `rmdir`, their files cannot be unlinked.
fn remove_cgroup(dir: &Path) {
    for child in fs::read_dir(dir).into_iter().flatten().flatten() {
        if child.file_type().is_ok_and(|t| t.is_dir()) {
            remove_cgroup(&child.path());
        }
    }
    let _ = fs::remove_dir(dir);
}

fn mesos_gpu(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_mesos-gpu"))
        .args(args)
        .env("MESOS_GPU_LOG", "warn")
        .output()
        .expect("run mesos-gpu")
}

/// For each GPU minor of the node: what opening `/dev/nvidia<minor>` gives, and what making and
/// opening that node gives; then the control nodes, the environment and the driver volume.
const PROBE: &str = r#"
for m in 0 1 2 3; do
  if [ -e /dev/nvidia$m ]; then
    echo "open nvidia$m: $(head -c1 /dev/nvidia$m 2>&1 | sed 's/.*: //')"
  else
    echo "open nvidia$m: absent"
    if r=$(mknod /dev/nvidia$m c 195 $m 2>&1); then
      echo "mknod nvidia$m: made; open: $(head -c1 /dev/nvidia$m 2>&1 | sed 's/.*: //')"
    else
      echo "mknod nvidia$m: ${r##*: }"
    fi
  fi
done
for n in nvidiactl nvidia-uvm nvidia-uvm-tools; do
  echo "open $n: $(head -c1 /dev/$n 2>&1 | sed 's/.*: //')"
done
echo "NVIDIA_VISIBLE_DEVICES: $NVIDIA_VISIBLE_DEVICES"
echo "PATH: $PATH"
echo "LD_LIBRARY_PATH: $LD_LIBRARY_PATH"
echo "volume: $(cat /usr/local/nvidia/bin/marker)"
echo "volume write: $(touch /usr/local/nvidia/x 2>&1 | sed 's/.*: //')"
"#;

const ENXIO: &str = "No such device or address";
const EPERM: &str = "Operation not permitted";

fn line<'a>(out: &'a str, key: &str) -> Result<&'a str, Failed> {
    out.lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(": "))
        .ok_or_else(|| Failed::from(format!("no {key:?} in:\n{out}")))
}

fn expect(out: &str, key: &str, want: &str) -> Result<(), Failed> {
    let got = line(out, key)?;
    if got == want {
        Ok(())
    } else {
        Err(format!("{key}: got {got:?}, want {want:?}\n{out}").into())
    }
}

/// Only `minors` may be opened; every other GPU node is absent and refused by the cgroup.
fn expect_gpus(out: &str, minors: &[u32]) -> Result<(), Failed> {
    for m in 0..4 {
        if minors.contains(&m) {
            expect(out, &format!("open nvidia{m}"), ENXIO)?;
        } else {
            expect(out, &format!("open nvidia{m}"), "absent")?;
            expect(
                out,
                &format!("mknod nvidia{m}"),
                &format!("made; open: {EPERM}"),
            )?;
        }
    }
    Ok(())
}

fn expect_common(out: &str) -> Result<(), Failed> {
    for n in ["nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"] {
        expect(out, &format!("open {n}"), ENXIO)?;
    }
    expect(out, "volume", "driver volume")?;
    expect(out, "volume write", "Read-only file system")?;
    let path = line(out, "PATH")?;
    if !path.split(':').any(|p| p == "/usr/local/nvidia/bin") {
        return Err(format!("PATH without the driver volume: {path}").into());
    }
    let ld = line(out, "LD_LIBRARY_PATH")?;
    if !ld.split(':').any(|p| p == "/usr/local/nvidia/lib64") {
        return Err(format!("LD_LIBRARY_PATH without the driver volume: {ld}").into());
    }
    Ok(())
}

fn spec_reads_the_real_device_numbers() -> Result<(), Failed> {
    let f = fixture()?;
    let common = &f.spec["containerEdits"]["deviceNodes"];
    let uvm = common
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["path"] == "/dev/nvidia-uvm")
        .ok_or("no nvidia-uvm node")?;
    assert_eq!(uvm["major"], f.uvm_major, "{uvm}");
    assert_eq!(
        uvm["hostPath"],
        f.dev_root.join("nvidia-uvm").to_str().unwrap()
    );
    let tools = common
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["path"] == "/dev/nvidia-uvm-tools")
        .ok_or("no nvidia-uvm-tools node although the host has one")?;
    assert_eq!(tools["minor"], 1);
    let gpu0 = &f.spec["devices"][0];
    assert_eq!(gpu0["name"], "0");
    assert_eq!(
        gpu0["containerEdits"]["deviceNodes"][0]["path"],
        "/dev/nvidia2"
    );
    assert_eq!(f.spec["cdiVersion"], "0.5.0");
    Ok(())
}

/// CDI alone selects the GPUs: `NVIDIA_VISIBLE_DEVICES=void`, as nvidia-ctk's specs set it, so
/// NVIDIA's legacy runtime hook would inject nothing more.
const VOID: &str = "void";

fn container_gets_exactly_its_gpu_by_index() -> Result<(), Failed> {
    let f = fixture()?;
    let out = f.run(&["nvidia.com/gpu=0"], PROBE)?;
    expect_gpus(&out, &[2])?;
    expect_common(&out)?;
    expect(&out, "NVIDIA_VISIBLE_DEVICES", VOID)?;
    eprintln!("container given nvidia.com/gpu=0:\n{out}");
    Ok(())
}

fn container_gets_its_gpu_by_uuid_and_all_by_all() -> Result<(), Failed> {
    let f = fixture()?;
    let uuid = f.gpu_uuid(3);
    let out = f.run(&[&format!("nvidia.com/gpu={uuid}")], PROBE)?;
    expect_gpus(&out, &[1])?;
    expect(&out, "NVIDIA_VISIBLE_DEVICES", VOID)?;
    let out = f.run(&["nvidia.com/gpu=all"], PROBE)?;
    expect_gpus(&out, &[0, 1, 2, 3])?;
    expect_common(&out)?;
    expect(&out, "NVIDIA_VISIBLE_DEVICES", VOID)?;
    Ok(())
}

/// Several devices give every one's nodes, and still no GPU list in the environment.
fn two_devices_give_both_nodes_and_no_gpu_list() -> Result<(), Failed> {
    let f = fixture()?;
    let out = f.run(&["nvidia.com/gpu=0", "nvidia.com/gpu=1"], PROBE)?;
    expect_gpus(&out, &[2, 3])?;
    expect(&out, "NVIDIA_VISIBLE_DEVICES", VOID)?;
    Ok(())
}

/// Why `cdi generate` refuses a second spec declaring the same devices in its directory:
/// podman then has none of them.
fn podman_drops_devices_two_specs_declare() -> Result<(), Failed> {
    let f = fixture()?;
    let twice = f.dir.join("cdi-twice");
    fs::create_dir_all(&twice)?;
    let spec = fs::read(f.cdi_dir.join("nvidia.com-gpu.json"))?;
    fs::write(twice.join("nvidia.com-gpu.json"), &spec)?;
    fs::write(twice.join("nvidia.json"), &spec)?;
    let out = f.podman_in(
        &twice,
        &[
            "run",
            "--rm",
            "--device",
            "nvidia.com/gpu=0",
            &f.image,
            "/bin/busybox",
            "true",
        ],
    )?;
    if out.status.success() {
        return Err("podman ran a container with a device two specs declare".into());
    }
    let err = String::from_utf8_lossy(&out.stderr);
    if !err.contains("nvidia.com/gpu=0") {
        return Err(format!("unexpected podman error: {err}").into());
    }
    eprintln!(
        "podman with two specs declaring nvidia.com/gpu=0: {}",
        err.trim()
    );
    Ok(())
}

/// Why the minimum version matters: the same spec declaring 0.6.0 is not loaded by this podman
/// (4.3, which knows versions up to 0.5.0), while the 0.5.0 one `cdi generate` writes is.
fn podman_refuses_a_version_it_does_not_know() -> Result<(), Failed> {
    let f = fixture()?;
    let newer = f.dir.join("cdi-newer");
    fs::create_dir_all(&newer)?;
    let mut spec = f.spec.clone();
    spec["cdiVersion"] = "0.6.0".into();
    fs::write(newer.join("nvidia.com-gpu.json"), spec.to_string())?;
    let run = |dir: &Path| {
        f.podman_in(
            dir,
            &[
                "run",
                "--rm",
                "--device",
                "nvidia.com/gpu=0",
                &f.image,
                "/bin/busybox",
                "true",
            ],
        )
    };
    let out = run(&newer)?;
    if out.status.success() {
        return Err("podman loaded a spec declaring cdiVersion 0.6.0".into());
    }
    let ours = run(&f.cdi_dir)?;
    if !ours.status.success() {
        return Err(format!(
            "podman refused our spec: {}",
            String::from_utf8_lossy(&ours.stderr)
        )
        .into());
    }
    Ok(())
}

/// A container given one MIG device of the simulated DGX A100 in MIG mode (`nvidia.com/gpu=
/// <gpu>:<mig>`, as `nvidia-ctk` names it) sees exactly its parent's node and its two capability
/// nodes beside the control nodes: no other GPU, no other capability, and
/// `NVIDIA_VISIBLE_DEVICES=void` (CDI alone selects). The node's GPUs are in MIG mode: none is a device whole.
fn container_gets_exactly_its_mig_device() -> Result<(), Failed> {
    const MIG_NODE: &str = "dgx-a100-mig";
    let f = fixture()?;
    let dev = f.dir.join("dev-mig");
    let cdi = f.dir.join("cdi-mig");
    fs::create_dir_all(dev.join("nvidia-caps"))?;
    fs::create_dir_all(&cdi)?;
    let info = mesos_gpu(&["info", "--simulate", MIG_NODE, "--json"]);
    let info: Value = serde_json::from_slice(&info.stdout)?;
    for gpu in info["gpus"].as_array().ok_or("no gpus")? {
        let minor = u32::try_from(gpu["minor"].as_u64().ok_or("no minor")?)?;
        mknod(&dev.join(format!("nvidia{minor}")), 195, minor)?;
    }
    mknod(&dev.join("nvidiactl"), 195, 255)?;
    mknod(&dev.join("nvidia-uvm"), f.uvm_major, 0)?;
    mknod(&dev.join("nvidia-uvm-tools"), f.uvm_major, 1)?;
    let migs = info["mig"]["devices"].as_array().ok_or("no MIG devices")?;
    let cap_of = |mig: &Value, which: &str| -> Result<(u32, u32), Failed> {
        let n = |k: &str| {
            mig["caps"][which][k]
                .as_u64()
                .and_then(|v| u32::try_from(v).ok())
                .ok_or_else(|| Failed::from(format!("no caps.{which}.{k} in {mig}")))
        };
        Ok((n("major")?, n("minor")?))
    };
    for mig in migs {
        for which in ["gpu_instance", "compute_instance"] {
            let (major, minor) = cap_of(mig, which)?;
            let path = dev.join("nvidia-caps").join(format!("nvidia-cap{minor}"));
            if !path.exists() {
                mknod(&path, major, minor)?;
            }
        }
    }
    let spec_path = cdi.join("nvidia.com-gpu.json");
    let out = mesos_gpu(&[
        "cdi",
        "generate",
        "--simulate",
        MIG_NODE,
        "--dev-root",
        dev.to_str().ok_or("dev")?,
        "--volume-root",
        f.dir.join("volumes").to_str().ok_or("volumes")?,
        "--output",
        spec_path.to_str().ok_or("spec")?,
        "--spec-dirs",
        cdi.to_str().ok_or("cdi")?,
    ]);
    if !out.status.success() {
        return Err(format!("cdi generate: {}", String::from_utf8_lossy(&out.stderr)).into());
    }
    let spec: Value = serde_json::from_slice(&fs::read(&spec_path)?)?;
    let volume = spec["containerEdits"]["mounts"][0]["hostPath"]
        .as_str()
        .ok_or("no driver volume")?;
    fs::create_dir_all(volume)?;
    // A device of the second GPU, so that GPU 0's index and minor are not what is seen.
    let mig = migs
        .iter()
        .find(|m| m["parent"] == 1)
        .ok_or("no MIG device on GPU 1")?;
    let name = format!("nvidia.com/gpu={}:{}", mig["parent"], mig["index"]);
    let script = r#"ls /dev | grep nvidia | sed 's/^/dev: /'
ls /dev/nvidia-caps | sed 's/^/cap: /'
for n in /dev/nvidia[0-9]*; do echo "open $n: $(head -c1 $n 2>&1 | sed 's/.*: //')"; done
echo "NVIDIA_VISIBLE_DEVICES: $NVIDIA_VISIBLE_DEVICES""#;
    let out = f.run_in(&cdi, &[&name], script)?;
    eprintln!("container given {name}:\n{out}");
    let listed = |prefix: &str| -> Vec<String> {
        let mut v: Vec<String> = out
            .lines()
            .filter_map(|l| l.strip_prefix(prefix))
            .map(str::to_owned)
            .collect();
        v.sort();
        v
    };
    let parent = mig["parent_minor"].as_u64().ok_or("no parent minor")?;
    let mut want_dev = vec![
        format!("nvidia{parent}"),
        "nvidia-caps".to_owned(),
        "nvidia-uvm".to_owned(),
        "nvidia-uvm-tools".to_owned(),
        "nvidiactl".to_owned(),
    ];
    want_dev.sort();
    let mut want_caps = vec![
        format!("nvidia-cap{}", cap_of(mig, "gpu_instance")?.1),
        format!("nvidia-cap{}", cap_of(mig, "compute_instance")?.1),
    ];
    want_caps.sort();
    if listed("dev: ") != want_dev || listed("cap: ") != want_caps {
        return Err(
            format!("want {want_dev:?} and {want_caps:?}, the container has:\n{out}").into(),
        );
    }
    expect(&out, &format!("open /dev/nvidia{parent}"), ENXIO)?;
    expect(&out, "NVIDIA_VISIBLE_DEVICES", VOID)?;
    Ok(())
}

fn main() -> ExitCode {
    let args = Arguments::from_args();
    let host = Host::probe();
    let trial =
        |name: &str, f: fn() -> Result<(), Failed>| needs(&host, NEEDS, Trial::test(name, f));
    let trials = vec![
        trial(
            "spec_reads_the_real_device_numbers",
            spec_reads_the_real_device_numbers,
        ),
        trial(
            "container_gets_exactly_its_gpu_by_index",
            container_gets_exactly_its_gpu_by_index,
        ),
        trial(
            "container_gets_its_gpu_by_uuid_and_all_by_all",
            container_gets_its_gpu_by_uuid_and_all_by_all,
        ),
        trial(
            "two_devices_give_both_nodes_and_no_gpu_list",
            two_devices_give_both_nodes_and_no_gpu_list,
        ),
        trial(
            "podman_drops_devices_two_specs_declare",
            podman_drops_devices_two_specs_declare,
        ),
        trial(
            "podman_refuses_a_version_it_does_not_know",
            podman_refuses_a_version_it_does_not_know,
        ),
        needs(
            &host,
            NEEDS,
            Trial::test(
                "container_gets_exactly_its_mig_device",
                container_gets_exactly_its_mig_device,
            ),
        ),
    ];
    let conclusion = libtest_mimic::run(&args, trials);
    if let Some(Ok(fixture)) = FIXTURE.get() {
        fixture.cleanup();
    } else if let Some(Err(e)) = FIXTURE.get() {
        eprintln!("podman fixture failed: {e}");
    }
    conclusion.exit_code()
}
