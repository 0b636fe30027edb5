//! `mesos-gpu doctor` on a simulated node (nvml-sim, its driver tree, mknod'ed device nodes) with
//! the host's real cgroups: ready on a good host, and each check failing on a host built to fail
//! it — a missing node, a wrong `nvidia-uvm` major, cgroup v2 where the device program cannot be
//! attached (the command run without CAP_SYS_ADMIN and CAP_BPF, through `setpriv`), a driver
//! without its `nvidia-smi` or of another version, a volume root on a `noexec` mount, directories
//! that disagree, `mps` without its control program, two CDI specs declaring one device, module
//! parameters the module refuses and a module library without the module. Needs root, cgroups,
//! `cc` (the module library is a real ELF shared object).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::process::{Command, ExitCode, Output};

use libtest_mimic::{Arguments, Failed, Trial};
use mesos_gpu_testkit::{Host, Need, needs};

type TestResult = Result<(), Failed>;

/// The simulated node: 8 GPUs (minors 0-7), driver 550.54.14, nvidia-uvm major 510.
const NODE: &str = "dgx1-v100";
const VERSION: &str = "550.54.14";
const UVM_MAJOR: u32 = 510;

fn main() -> ExitCode {
    let host = Host::probe();
    let root: &[Need] = &[Need::Root, Need::Cgroup1];
    let with_cc: &[Need] = &[Need::Root, Need::Cgroup1, Need::Cc];
    let mut trials = vec![
        (
            "good_simulated_host_is_ready",
            with_cc,
            good_host_is_ready as fn() -> TestResult,
        ),
        (
            "unbuilt_volume_fix_runs_as_printed_on_a_simulated_node",
            root,
            volume_fix_runs_as_printed,
        ),
        (
            "smoke_without_the_nvidia_smi_stand_in_says_how_to_build_it",
            root,
            smoke_without_smi_stand_in,
        ),
        ("missing_gpu_node_fails_device_nodes", root, missing_node),
        ("wrong_uvm_major_fails_device_nodes", root, wrong_uvm_major),
        (
            "driver_without_nvidia_smi_fails_driver_volume",
            &[Need::Root, Need::Cgroup1, Need::Cc],
            no_nvidia_smi,
        ),
        (
            "driver_of_another_version_fails_driver_volume",
            &[Need::Root, Need::Cgroup1, Need::Cc],
            other_version,
        ),
        (
            "noexec_volume_root_fails_driver_volume",
            root,
            noexec_volume_root,
        ),
        (
            "disagreeing_directories_fail",
            with_cc,
            disagreeing_directories,
        ),
        (
            "serve_on_another_device_root_fails_directories",
            with_cc,
            serve_on_another_dev_root,
        ),
        (
            "serve_with_another_nvml_fails_directories",
            with_cc,
            serve_with_another_nvml,
        ),
        (
            "mps_without_its_control_program_fails_sharing",
            with_cc,
            mps_without_control,
        ),
        (
            "issue_34_refused_configuration_fails",
            with_cc,
            refused_configuration,
        ),
        ("conflicting_cdi_specs_fail", root, conflicting_cdi),
        (
            "mig_node_checks_its_capability_nodes",
            root,
            mig_capability_nodes,
        ),
        (
            "v2_with_bpf_attach_is_ready",
            &[Need::Root, Need::Cgroup2],
            v2_with_bpf,
        ),
        (
            "v2_without_bpf_attach_fails_cgroups",
            &[Need::Root, Need::Cgroup2],
            v2_without_bpf,
        ),
    ]
    .into_iter()
    .map(|(name, need, f)| needs(&host, need, Trial::test(name, f)))
    .collect::<Vec<_>>();
    trials.sort_by(|a, b| a.name().cmp(b.name()));
    libtest_mimic::run(&Arguments::from_args(), trials).exit_code()
}

/// A scratch host: CDI dirs, volume root, no unit or defaults file.
struct Scratch {
    dir: tempfile::TempDir,
}

impl Scratch {
    fn new() -> Scratch {
        let dir = tempfile::Builder::new()
            .prefix("mgpu-doctor")
            .tempdir()
            .unwrap();
        for sub in ["cdi", "volumes"] {
            std::fs::create_dir_all(dir.path().join(sub)).unwrap();
        }
        Scratch { dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// `mesos-gpu --simulate NODE [global…] doctor --json …` with this host's files.
    fn doctor(&self, global: &[&str], args: &[&str]) -> Output {
        self.doctor_with(None, global, args)
    }

    fn doctor_with(&self, wrap: Option<&[&str]>, global: &[&str], args: &[&str]) -> Output {
        let exe = env!("CARGO_BIN_EXE_mesos-gpu");
        let mut cmd = match wrap {
            Some(wrap) => {
                let mut c = Command::new(wrap[0]);
                c.args(&wrap[1..]).arg(exe);
                c
            }
            None => Command::new(exe),
        };
        cmd.args(["--simulate", NODE])
            .args(global)
            .args(["doctor", "--json"])
            .arg("--cdi-spec-dirs")
            .arg(self.path("cdi"))
            .arg("--volume-root")
            .arg(self.path("volumes"));
        // No unit or defaults file unless the test writes them.
        for (flag, file) in [("--defaults", "no-defaults"), ("--unit", "no-unit")] {
            if !args.contains(&flag) {
                cmd.arg(flag).arg(self.path(file));
            }
        }
        cmd.args(args)
            .env_remove("NVML_SIM_CONFIG")
            .env_remove("MESOS_GPU_POOL_DIR");
        cmd.output().unwrap()
    }

    /// A device root with the node's nodes, `skip` left out and `override_` given other numbers.
    fn dev_root(&self, skip: &str, override_: Option<(&str, u32, u32)>) -> PathBuf {
        let dev = self.path("dev");
        std::fs::create_dir_all(&dev).unwrap();
        let mut nodes: Vec<(String, u32, u32)> =
            (0..8).map(|m| (format!("nvidia{m}"), 195, m)).collect();
        nodes.push(("nvidiactl".into(), 195, 255));
        nodes.push(("nvidia-uvm".into(), UVM_MAJOR, 0));
        nodes.push(("nvidia-uvm-tools".into(), UVM_MAJOR, 1));
        for (name, major, minor) in nodes {
            if name == skip {
                continue;
            }
            let (major, minor) = match override_ {
                Some((n, a, b)) if n == name => (a, b),
                _ => (major, minor),
            };
            let ok = Command::new("mknod")
                .arg(dev.join(&name))
                .args(["c", &major.to_string(), &minor.to_string()])
                .status()
                .unwrap()
                .success();
            assert!(ok, "mknod {name}");
        }
        dev
    }
}

/// The report's checks by name, and whether it says ready.
fn report(out: &Output) -> Result<(bool, serde_json::Value), Failed> {
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).map_err(|e| {
        format!(
            "not a JSON report ({e}): {}\nstderr: {}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })?;
    let ready = json["ready"].as_bool().ok_or("no ready")?;
    let code_agrees = out.status.code() == Some(if ready { 0 } else { 1 });
    if !code_agrees {
        return Err(format!("ready={ready} but exit status {}", out.status).into());
    }
    Ok((ready, json))
}

fn find<'a>(json: &'a serde_json::Value, name: &str) -> Result<&'a serde_json::Value, Failed> {
    json["checks"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["name"] == name))
        .ok_or_else(|| format!("no check {name} in {json:#}").into())
}

/// `name` failed (and so the host is not ready), with `needle` in its summary or details.
fn expect_fail(out: &Output, name: &str, needle: &str) -> TestResult {
    let (ready, json) = report(out)?;
    let check = find(&json, name)?;
    if ready || check["status"] != "fail" {
        return Err(format!("{name} did not fail: {json:#}").into());
    }
    if !check.to_string().contains(needle) {
        return Err(format!("{name} does not say {needle:?}: {check:#}").into());
    }
    if check["fix"].as_str().is_none_or(str::is_empty) {
        return Err(format!("{name} says nothing to do: {check:#}").into());
    }
    // Every other check holds on this host.
    for other in json["checks"].as_array().unwrap() {
        if other["name"] != name && other["status"] == "fail" {
            return Err(format!("{} failed too: {json:#}", other["name"]).into());
        }
    }
    Ok(())
}

const MODULES: &str = r#"{"libraries": [{"file": "LIBRARY", "modules": [
  {"name": "org_apache_mesos_gpu_MesosGpuIsolator", "parameters": [
    {"key": "work_dir", "value": "/var/lib/mesos"},
    {"key": "pool_dir", "value": "/var/lib/mesos-gpu"},
    {"key": "volume_root", "value": "VOLUMES"}]},
  {"name": "org_apache_mesos_gpu_MesosGpuDockerHook", "parameters": [
    {"key": "docker_args", "value": "/usr/bin/mesos-gpu docker-args --pool-dir /var/lib/mesos-gpu --docker-state-dir /var/run/mesos-gpu --volume-root VOLUMES"}]}]}]}"#;

const WRAPPER: &str = "#!/bin/sh\nexec /usr/bin/mesos-gpu docker-wrapper --docker /usr/bin/docker \\\n  --pool-dir /var/lib/mesos-gpu --docker-state-dir /var/run/mesos-gpu -- \"$@\"\n";

impl Scratch {
    /// `modules.json` (`LIBRARY` a module library defining both modules, built with `cc`) and
    /// the wrapper script.
    fn config(&self, modules: &str, wrapper: &str) -> Vec<String> {
        let volumes = self.path("volumes").display().to_string();
        let src = self.path("module.c");
        std::fs::write(
            &src,
            "int org_apache_mesos_gpu_MesosGpuIsolator = 1;\n\
             int org_apache_mesos_gpu_MesosGpuDockerHook = 2;\n",
        )
        .unwrap();
        let library = self.path("libmesos_gpu_module.so");
        let ok = Command::new("cc")
            .args(["-shared", "-fPIC", "-o"])
            .arg(&library)
            .arg(&src)
            .status()
            .unwrap()
            .success();
        assert!(ok, "cc {}", library.display());
        std::fs::write(
            self.path("modules.json"),
            modules
                .replace("VOLUMES", &volumes)
                .replace("LIBRARY", &library.display().to_string()),
        )
        .unwrap();
        std::fs::write(self.path("wrapper"), wrapper).unwrap();
        vec![
            "--modules".into(),
            self.path("modules.json").display().to_string(),
            "--wrapper".into(),
            self.path("wrapper").display().to_string(),
        ]
    }
}

fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

fn good_host_is_ready() -> TestResult {
    let s = Scratch::new();
    let config = s.config(MODULES, WRAPPER);
    let mut args = strs(&config);
    args.push("--smoke");
    let out = s.doctor(&[], &args);
    let (ready, json) = report(&out)?;
    if !ready {
        return Err(format!("a good simulated host is not ready: {json:#}").into());
    }
    for name in [
        "driver",
        "device-nodes",
        "cgroups",
        "directories",
        "configuration",
        "sharing",
        "cdi",
        "smoke-one-gpu",
        "smoke-no-gpu",
    ] {
        let check = find(&json, name)?;
        if check["status"] != "ok" {
            return Err(format!("{name} is not ok: {check:#}").into());
        }
    }
    let smoke = find(&json, "smoke-one-gpu")?.to_string();
    if !smoke.contains("GPU 0: Tesla V100-SXM2-16GB (UUID: GPU-") {
        return Err(format!("the one-GPU container does not list its GPU: {smoke}").into());
    }
    // The volume is not built in the scratch root: a warning, not a failure.
    let volume = find(&json, "driver-volume")?;
    if volume["status"] != "warn"
        || !volume
            .to_string()
            .contains("bin/nvidia-smi from /usr/local/nvidia/bin/nvidia-smi")
    {
        return Err(format!("driver-volume: {volume:#}").into());
    }
    Ok(())
}

/// The driver-volume warning of a simulated node says how to build the volume as a command
/// that, copied as printed (its `--simulate` and volume root included), builds it: the next
/// doctor finds it intact. (It said `mesos-gpu volume create`, which looks for the host's driver.)
fn volume_fix_runs_as_printed() -> TestResult {
    let s = Scratch::new();
    let (_, json) = report(&s.doctor(&[], &[]))?;
    let volume = find(&json, "driver-volume")?;
    let fix = volume["fix"].as_str().unwrap_or_default();
    let command = fix
        .split('`')
        .nth(1)
        .filter(|c| c.starts_with(&format!("mesos-gpu --simulate {NODE} volume create")))
        .ok_or_else(|| format!("no runnable fix: {volume:#}"))?;
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_mesos-gpu"))
        .parent()
        .unwrap();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let ran = Command::new("sh")
        .args(["-c", command])
        .env("PATH", path)
        .output()
        .unwrap();
    if !ran.status.success() {
        return Err(format!(
            "`{command}` failed: {}",
            String::from_utf8_lossy(&ran.stderr)
        )
        .into());
    }
    let (_, json) = report(&s.doctor(&[], &[]))?;
    let volume = find(&json, "driver-volume")?;
    if volume["status"] != "ok" || !volume.to_string().contains("is intact") {
        return Err(format!("after `{command}`: {volume:#}").into());
    }
    Ok(())
}

/// A simulated node whose `nvidia-smi` stand-in is not built (the README's `cargo run --release
/// -p mesos-gpu -- demo` builds the simulator's library, not its programs): `--smoke` fails
/// saying so and how to build it, instead of two containers dying of SIGSEGV (exit 139, "check
/// the device-nodes and cgroups checks").
fn smoke_without_smi_stand_in() -> TestResult {
    let s = Scratch::new();
    let lib_dir = s.path("sim-lib");
    std::fs::create_dir_all(&lib_dir).unwrap();
    let lib = lib_dir.join("libnvml_sim.so");
    std::fs::copy(mesos_gpu_testkit::nvml_sim::sim_library(), &lib).unwrap();
    std::fs::create_dir_all(s.path("tmp")).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_mesos-gpu"))
        .args(["--simulate", NODE, "doctor", "--json", "--smoke"])
        .arg("--volume-root")
        .arg(s.path("volumes"))
        .arg("--cdi-spec-dirs")
        .arg(s.path("cdi"))
        .env("MESOS_GPU_NVML_SIM", &lib)
        .env("TMPDIR", s.path("tmp"))
        .env_remove("NVML_SIM_CONFIG")
        .output()
        .unwrap();
    expect_fail(&out, "smoke", "stand-in")?;
    let (_, json) = report(&out)?;
    let smoke = find(&json, "smoke")?;
    if !smoke["fix"]
        .as_str()
        .is_some_and(|f| f.contains("`cargo build -p nvml-sim`"))
    {
        return Err(format!("no way to build it: {smoke:#}").into());
    }
    Ok(())
}

fn missing_node() -> TestResult {
    let s = Scratch::new();
    let dev = s.dev_root("nvidia3", None);
    let out = s.doctor(&["--dev-root", dev.to_str().unwrap()], &[]);
    expect_fail(
        &out,
        "device-nodes",
        &format!("{}/nvidia3 is missing; expected 195:3", dev.display()),
    )
}

fn wrong_uvm_major() -> TestResult {
    let s = Scratch::new();
    let dev = s.dev_root("", Some(("nvidia-uvm", 240, 0)));
    let out = s.doctor(&["--dev-root", dev.to_str().unwrap()], &[]);
    expect_fail(
        &out,
        "device-nodes",
        &format!("nvidia-uvm is 240:0, expected {UVM_MAJOR}:0"),
    )
}

/// A driver tree with real ELF libraries of `version` (cc) under `usr/local/nvidia/lib64`, its
/// ld.so.cache, and only a `#!/bin/sh` nvidia-smi in `usr/bin`.
fn driver_tree(s: &Scratch, version: &str) -> PathBuf {
    let root = s.path("driver");
    let lib = root.join("usr/local/nvidia/lib64");
    std::fs::create_dir_all(&lib).unwrap();
    std::fs::create_dir_all(root.join("usr/bin")).unwrap();
    std::fs::create_dir_all(root.join("etc")).unwrap();
    let src = s.path("lib.c");
    std::fs::write(&src, "int fake(void) { return 1; }\n").unwrap();
    for (prefix, soname) in [
        ("libnvidia-ml.so", "libnvidia-ml.so.1"),
        ("libcuda.so", "libcuda.so.1"),
    ] {
        let file = format!("{prefix}.{version}");
        let ok = Command::new("cc")
            .args(["-shared", "-fPIC", &format!("-Wl,-soname,{soname}"), "-o"])
            .arg(lib.join(&file))
            .arg(&src)
            .status()
            .unwrap()
            .success();
        assert!(ok, "cc {file}");
        std::os::unix::fs::symlink(&file, lib.join(soname)).unwrap();
    }
    std::fs::write(
        root.join("usr/bin/nvidia-smi"),
        "#!/bin/sh\nexec /usr/local/nvidia/bin/nvidia-smi \"$@\"\n",
    )
    .unwrap();
    std::fs::set_permissions(
        root.join("usr/bin/nvidia-smi"),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    std::fs::write(root.join("etc/ld.so.conf"), "/usr/local/nvidia/lib64\n").unwrap();
    let ok = Command::new("ldconfig")
        .args(["-X", "-r"])
        .arg(&root)
        .args(["-C", "/etc/ld.so.cache", "-f", "/etc/ld.so.conf"])
        .status()
        .unwrap()
        .success();
    assert!(ok, "ldconfig");
    root
}

fn no_nvidia_smi() -> TestResult {
    let s = Scratch::new();
    let root = driver_tree(&s, VERSION);
    let out = s.doctor(&[], &["--driver-root", root.to_str().unwrap()]);
    expect_fail(&out, "driver-volume", "would lack bin/nvidia-smi")?;
    expect_fail(&out, "driver-volume", "a #! script")
}

fn other_version() -> TestResult {
    let s = Scratch::new();
    let root = driver_tree(&s, "470.82.01");
    let out = s.doctor(&[], &["--driver-root", root.to_str().unwrap()]);
    expect_fail(
        &out,
        "driver-volume",
        &format!("lib64/libcuda.so.{VERSION}"),
    )?;
    expect_fail(&out, "driver-volume", "belongs to driver 470.82.01")
}

fn noexec_volume_root() -> TestResult {
    let s = Scratch::new();
    let volumes = s.path("volumes");
    let ok = Command::new("mount")
        .args([
            "-t",
            "tmpfs",
            "-o",
            "noexec,nosuid,nodev,mode=755",
            "mgpu-doctor-noexec",
        ])
        .arg(&volumes)
        .status()?
        .success();
    if !ok {
        return Err("cannot mount a noexec tmpfs".into());
    }
    let out = s.doctor(&[], &[]);
    let _ = Command::new("umount").arg(&volumes).status();
    expect_fail(&out, "driver-volume", "is on a noexec mount")
}

fn disagreeing_directories() -> TestResult {
    let s = Scratch::new();
    let wrapper = WRAPPER.replace(
        "--pool-dir /var/lib/mesos-gpu",
        "--pool-dir /tmp/another-pool",
    );
    let config = s.config(MODULES, &wrapper);
    let out = s.doctor(&[], &strs(&config));
    expect_fail(&out, "directories", "the node's GPU pool directory differs")?;
    expect_fail(&out, "directories", "/tmp/another-pool")
}

/// The shipped unit (`examples/systemd/mesos-gpu.service`) with a defaults file whose serve
/// flags agree with [`MODULES`] and [`WRAPPER`] on the directories (the Docker records under
/// `--work-dir`, the old name of `--docker-state-dir`), plus `extra` lines.
fn serve_config(s: &Scratch, opts: &str, extra: &str) -> Vec<String> {
    let mut config = s.config(MODULES, WRAPPER);
    let unit = include_str!("../../examples/systemd/mesos-gpu.service");
    std::fs::write(s.path("mesos-gpu.service"), unit).unwrap();
    let defaults = format!(
        "MESOS_GPU_SERVE_OPTS=\"--volume-root {} --work-dir /var/run/mesos-gpu \
         --agent-work-dir /var/lib/mesos {opts}\"\nMESOS_GPU_POOL_DIR=/var/lib/mesos-gpu\n{extra}",
        s.path("volumes").display()
    );
    std::fs::write(s.path("default"), defaults).unwrap();
    for (flag, file) in [("--unit", "mesos-gpu.service"), ("--defaults", "default")] {
        config.push(flag.into());
        config.push(s.path(file).display().to_string());
    }
    config
}

/// The module and the hook read `/dev`; serve (its defaults file) another root.
fn serve_on_another_dev_root() -> TestResult {
    let s = Scratch::new();
    let agreeing = serve_config(&s, "", "");
    let (_, json) = report(&s.doctor(&[], &strs(&agreeing)))?;
    let check = find(&json, "directories")?;
    if check["status"] != "ok"
        || !check
            .to_string()
            .contains("the device root: /dev everywhere")
    {
        return Err(format!("serve agreeing on /dev: {check:#}").into());
    }
    let config = serve_config(&s, "--dev-root /srv/gpu-dev", "");
    let out = s.doctor(&[], &strs(&config));
    expect_fail(&out, "directories", "the device root differs")?;
    expect_fail(&out, "directories", "/srv/gpu-dev")
}

/// `/etc/default/mesos-gpu` loads another NVML than the module (which names none).
fn serve_with_another_nvml() -> TestResult {
    let s = Scratch::new();
    let config = serve_config(&s, "", "MESOS_GPU_NVML_LIB=/opt/other/libnvidia-ml.so.1\n");
    let out = s.doctor(&[], &strs(&config));
    expect_fail(&out, "directories", "the NVML library differs")?;
    expect_fail(&out, "directories", "/opt/other/libnvidia-ml.so.1")
}

fn mps_without_control() -> TestResult {
    let s = Scratch::new();
    let modules = MODULES.replace(
        r#"{"key": "work_dir", "value": "/var/lib/mesos"},"#,
        r#"{"key": "work_dir", "value": "/var/lib/mesos"}, {"key": "gpu_replicas", "value": "2"}, {"key": "gpu_sharing", "value": "mps"}, {"key": "mps_control", "value": "/nonexistent/nvidia-cuda-mps-control"},"#,
    );
    let config = s.config(&modules, WRAPPER);
    let out = s.doctor(&[], &strs(&config));
    expect_fail(
        &out,
        "sharing",
        "/nonexistent/nvidia-cuda-mps-control is not found",
    )
}

/// Issue 34: `doctor --modules` with parameters the module refuses, or a library that does not
/// exist, and `--defaults` with an option serve refuses, is not ready, each in its program's
/// words (before: READY).
fn refused_configuration() -> TestResult {
    let s = Scratch::new();
    let good = serve_config(&s, "", "");
    let (ready, json) = report(&s.doctor(&[], &strs(&good)))?;
    let check = find(&json, "configuration")?;
    if !ready || check["status"] != "ok" {
        return Err(format!("a good configuration: {json:#}").into());
    }
    let modules = MODULES.replace(
        r#"{"key": "pool_dir", "value": "/var/lib/mesos-gpu"},"#,
        r#"{"key": "pool_dir", "value": "/var/lib/mesos-gpu"}, {"key": "numa_pinning", "value": "maybe"},"#,
    );
    let config = s.config(&modules, WRAPPER);
    let out = s.doctor(&[], &strs(&config));
    expect_fail(
        &out,
        "configuration",
        r#"the module would refuse its parameters: module parameter numa_pinning=\"maybe\": expected one of off, on"#,
    )?;
    let config = s.config(MODULES, WRAPPER);
    std::fs::remove_file(s.path("libmesos_gpu_module.so")).unwrap();
    let out = s.doctor(&[], &strs(&config));
    expect_fail(
        &out,
        "configuration",
        &format!(
            "the module library {} does not exist",
            s.path("libmesos_gpu_module.so").display()
        ),
    )?;
    let config = serve_config(&s, "--driver-poll soon", "");
    let out = s.doctor(&[], &strs(&config));
    expect_fail(
        &out,
        "configuration",
        "serve would refuse its options: invalid value 'soon' for '--driver-poll",
    )
}

fn conflicting_cdi() -> TestResult {
    let s = Scratch::new();
    let spec = |env: &str| {
        format!(
            r#"{{"cdiVersion": "0.5.0", "kind": "nvidia.com/gpu", "devices": [{{"name": "0", "containerEdits": {{"env": ["{env}"]}}}}]}}"#
        )
    };
    std::fs::write(s.path("cdi/nvidia.com-gpu.json"), spec("A=1")).unwrap();
    std::fs::write(s.path("cdi/nvidia.json"), spec("A=2")).unwrap();
    let out = s.doctor(&[], &[]);
    expect_fail(&out, "cdi", "nvidia.com/gpu=0 in")
}

fn v2_with_bpf() -> TestResult {
    let s = Scratch::new();
    let out = s.doctor(&[], &["--cgroup-version", "v2", "--smoke"]);
    let (ready, json) = report(&out)?;
    let cgroups = find(&json, "cgroups")?;
    if !ready
        || cgroups["status"] != "ok"
        || !cgroups.to_string().contains("device programs attach")
    {
        return Err(format!("cgroup v2 with BPF: {json:#}").into());
    }
    Ok(())
}

fn v2_without_bpf() -> TestResult {
    let s = Scratch::new();
    // Without CAP_SYS_ADMIN and CAP_BPF the kernel refuses to load a cgroup device program, as
    // in a container that does not grant them.
    let setpriv = [
        "setpriv",
        "--bounding-set",
        "-sys_admin,-bpf",
        "--inh-caps",
        "-sys_admin,-bpf",
    ];
    let out = s.doctor_with(Some(&setpriv), &[], &["--cgroup-version", "v2"]);
    expect_fail(&out, "cgroups", "BPF_PROG_LOAD")?;
    expect_fail(&out, "cgroups", "Operation not permitted")
}

/// A node with MIG devices: the scratch device root gets their capability nodes (the
/// `nvidia-caps` major from the simulated `/proc/devices`), and `device-nodes` checks each.
fn mig_capability_nodes() -> TestResult {
    let s = Scratch::new();
    let out = Command::new(env!("CARGO_BIN_EXE_mesos-gpu"))
        .args([
            "--simulate",
            "dgx-a100-mig",
            "doctor",
            "--json",
            "--cdi-spec-dirs",
        ])
        .arg(s.path("cdi"))
        .arg("--volume-root")
        .arg(s.path("volumes"))
        .env_remove("NVML_SIM_CONFIG")
        .output()?;
    let (_, json) = report(&out)?;
    let nodes = find(&json, "device-nodes")?;
    let caps = nodes["details"].as_array().map_or(0, |d| {
        d.iter()
            .filter(|l| l.to_string().contains("nvidia-caps/nvidia-cap"))
            .count()
    });
    if nodes["status"] != "ok" || caps == 0 {
        return Err(format!("MIG capability nodes not checked: {nodes:#}").into());
    }
    Ok(())
}
