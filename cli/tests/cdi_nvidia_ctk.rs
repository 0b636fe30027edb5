//! Our CDI spec against NVIDIA's: what `nvidia-ctk cdi generate` (NVIDIA Container Toolkit,
//! built from its public source) wrote for nvml-sim's `k80` node, kept in `nvidia-ctk/k80.json`
//! (how it was made: `nvidia-ctk/README.md`), and what `mesos-gpu cdi generate` writes for the
//! same node over device nodes with the same numbers.
//!
//! Compared field by field: the kind, the version, the device names, each device's nodes, and
//! the common edits. Ours keeps a container's GPU selection to CDI as NVIDIA's does: no device
//! sets an environment variable, and the common edits set `NVIDIA_VISIBLE_DEVICES=void`, so that
//! NVIDIA's legacy runtime hook, where it is still configured, injects nothing more. The
//! differences accepted are listed here ([`NVIDIA_ONLY_ENV`], [`OURS_ONLY_ENV`],
//! [`NVIDIA_HOOKS`], the mounts) and explained in the operator guide; anything else NVIDIA's
//! spec holds fails the test until it is looked at.
//!
//! With `MESOS_GPU_NVIDIA_CTK=<nvidia-ctk binary>` the golden file is regenerated live (a fake
//! driver root with nvml-sim as its `libnvidia-ml.so.1`, as the README says) and must be
//! unchanged; without it that trial is ignored.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use libtest_mimic::{Arguments, Failed, Trial};
use mesos_gpu_testkit::{Host, Need, needs, run_checked};
use serde_json::Value;

/// The golden spec, as `nvidia-ctk` wrote it.
const GOLDEN: &str = include_str!("nvidia-ctk/k80.json");
/// The scratch directory the golden spec was made in (its host paths start with it).
const GOLDEN_SCRATCH: &str = "/tmp/mgpu-nvidia-ctk";
/// The simulated node.
const NODE: &str = "k80";
/// The environment variable naming an `nvidia-ctk` binary to regenerate the golden spec with.
const CTK_ENV: &str = "MESOS_GPU_NVIDIA_CTK";
/// The driver version of the node, which names the fake driver's files.
const DRIVER_VERSION: &str = "470.256.02";

/// Common environment NVIDIA's spec sets and ours does not: where its hooks find `libcuda` in
/// the container. Ours runs no hook; `LD_LIBRARY_PATH` names the driver volume.
const NVIDIA_ONLY_ENV: &[&str] = &["NVIDIA_CTK_LIBCUDA_DIR"];
/// Common environment ours sets and NVIDIA's does not: the driver volume's `bin` and `lib`
/// directories, as the Docker path sets them (NVIDIA's mounts the files at their host paths and
/// updates the container's ld.so.cache with a hook instead).
const OURS_ONLY_ENV: &[&str] = &["PATH", "LD_LIBRARY_PATH"];
/// The `nvidia-cdi-hook` commands NVIDIA's common edits run at `createContainer`; ours run none
/// (see the operator guide for what each does and what stands for it in ours).
const NVIDIA_HOOKS: &[&str] = &[
    "create-symlinks",
    "enable-cuda-compat",
    "update-ldcache",
    "disable-device-node-modification",
    "update-application-profile",
];
/// The one environment entry both specs must set in their common edits.
const VISIBLE_VOID: &str = "NVIDIA_VISIBLE_DEVICES=void";

fn main() -> ExitCode {
    let host = Host::probe();
    let no_ctk = std::env::var_os(CTK_ENV).is_none();
    if no_ctk {
        eprintln!(
            "{CTK_ENV} is not set: the golden spec is not regenerated (see tests/nvidia-ctk/README.md)"
        );
    }
    let trials = vec![
        needs(
            &host,
            &[Need::Root],
            Trial::test(
                "our_spec_matches_nvidia_ctk_field_by_field",
                our_spec_matches_nvidia_ctk,
            ),
        ),
        Trial::test(
            "the_golden_spec_keeps_gpu_selection_to_cdi",
            the_golden_spec_keeps_gpu_selection_to_cdi,
        ),
        needs(
            &host,
            &[Need::Root, Need::Cc],
            Trial::test("nvidia_ctk_still_writes_the_golden_spec", nvidia_ctk_live),
        )
        .with_ignored_flag(no_ctk),
    ];
    libtest_mimic::run(&Arguments::from_args(), trials).exit_code()
}

fn golden() -> Value {
    serde_json::from_str(GOLDEN).expect("nvidia-ctk/k80.json is JSON")
}

fn check(cond: bool, what: impl FnOnce() -> String) -> Result<(), Failed> {
    if cond { Ok(()) } else { Err(what().into()) }
}

/// One device node as both specs can be compared: container path, major, minor (JSON's
/// `omitempty` drops a zero minor from NVIDIA's), and the cgroup permissions.
type Node = (String, u64, u64, String);

fn nodes(edits: &Value) -> BTreeSet<Node> {
    edits["deviceNodes"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|n| {
            (
                n["path"].as_str().unwrap_or_default().to_owned(),
                n["major"].as_u64().unwrap_or(0),
                n["minor"].as_u64().unwrap_or(0),
                n["permissions"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect()
}

fn env(edits: &Value) -> BTreeMap<String, String> {
    edits["env"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| e.as_str()?.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

fn keys(value: &Value) -> BTreeSet<String> {
    value
        .as_object()
        .map(|o| o.keys().cloned().collect())
        .unwrap_or_default()
}

fn devices(spec: &Value) -> BTreeMap<String, Value> {
    spec["devices"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|d| {
            (
                d["name"].as_str().unwrap_or_default().to_owned(),
                d["containerEdits"].clone(),
            )
        })
        .collect()
}

/// What makes NVIDIA's spec the one the comparison expects: selection left to CDI, and no common
/// field or hook beyond those whose absence from ours is documented.
fn the_golden_spec_keeps_gpu_selection_to_cdi() -> Result<(), Failed> {
    check_nvidia_shape(&golden())
}

fn check_nvidia_shape(nvidia: &Value) -> Result<(), Failed> {
    let common = &nvidia["containerEdits"];
    check(
        keys(common)
            == ["deviceNodes", "env", "hooks", "mounts"]
                .map(String::from)
                .into(),
        || {
            format!(
                "NVIDIA's common edits hold other fields: {:?}",
                keys(common)
            )
        },
    )?;
    let env = env(common);
    check(
        env.get("NVIDIA_VISIBLE_DEVICES").map(String::as_str) == Some("void"),
        || format!("NVIDIA's common edits do not set {VISIBLE_VOID}: {env:?}"),
    )?;
    let extra: Vec<&String> = env
        .keys()
        .filter(|k| *k != "NVIDIA_VISIBLE_DEVICES" && !NVIDIA_ONLY_ENV.contains(&k.as_str()))
        .collect();
    check(extra.is_empty(), || {
        format!("NVIDIA's common env has undocumented entries: {extra:?}")
    })?;
    let hooks: BTreeSet<&str> = common["hooks"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|h| h["args"].get(1)?.as_str())
        .collect();
    check(hooks == NVIDIA_HOOKS.iter().copied().collect(), || {
        format!("NVIDIA's hooks are {hooks:?}, documented {NVIDIA_HOOKS:?}")
    })?;
    for (name, edits) in devices(nvidia) {
        check(keys(&edits) == ["deviceNodes".to_owned()].into(), || {
            format!("NVIDIA's device {name} edits more than its nodes: {edits}")
        })?;
    }
    Ok(())
}

/// Makes `<dev>/<name>` for every device node `spec` names, with its numbers.
fn mknod_like(spec: &Value, dev: &Path) -> Result<(), Failed> {
    let mut all = nodes(&spec["containerEdits"]);
    for (_, edits) in devices(spec) {
        all.extend(nodes(&edits));
    }
    for (path, major, minor, _) in all {
        let name = path.strip_prefix("/dev/").unwrap();
        run_checked(
            Command::new("mknod")
                .args(["-m", "0666"])
                .arg(dev.join(name))
                .args(["c", &major.to_string(), &minor.to_string()]),
        )?;
    }
    Ok(())
}

fn ours(dev: &Path, scratch: &Path) -> Result<Value, Failed> {
    let out_path = scratch.join("cdi/nvidia.com-gpu.json");
    let out = Command::new(env!("CARGO_BIN_EXE_mesos-gpu"))
        .args(["cdi", "generate", "--simulate", NODE, "--dev-root"])
        .arg(dev)
        .arg("--volume-root")
        .arg(scratch.join("volumes"))
        .arg("--output")
        .arg(&out_path)
        .arg("--spec-dirs")
        .arg(scratch.join("cdi"))
        .env("MESOS_GPU_LOG", "error")
        .output()?;
    check(out.status.success(), || {
        format!(
            "cdi generate: {}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        )
    })?;
    Ok(serde_json::from_slice(&fs::read(&out_path)?)?)
}

fn compare(nvidia: &Value, ours: &Value) -> Result<(), Failed> {
    check_nvidia_shape(nvidia)?;
    for field in ["cdiVersion", "kind"] {
        check(nvidia[field] == ours[field], || {
            format!("{field}: NVIDIA {} ours {}", nvidia[field], ours[field])
        })?;
    }
    let (theirs, mine) = (devices(nvidia), devices(ours));
    check(
        theirs.keys().collect::<Vec<_>>() == mine.keys().collect::<Vec<_>>(),
        || {
            format!(
                "device names: NVIDIA {:?}, ours {:?}",
                theirs.keys(),
                mine.keys()
            )
        },
    )?;
    for (name, edits) in &mine {
        check(keys(edits) == ["deviceNodes".to_owned()].into(), || {
            format!("our device {name} edits more than its nodes (NVIDIA's do not): {edits}")
        })?;
        check(nodes(edits) == nodes(&theirs[name]), || {
            format!(
                "device {name}: NVIDIA's nodes {:?}, ours {:?}",
                nodes(&theirs[name]),
                nodes(edits)
            )
        })?;
    }
    let (common, my_common) = (&nvidia["containerEdits"], &ours["containerEdits"]);
    check(nodes(common) == nodes(my_common), || {
        format!(
            "common nodes: NVIDIA's {:?}, ours {:?}",
            nodes(common),
            nodes(my_common)
        )
    })?;
    check(
        keys(my_common) == ["deviceNodes", "env", "mounts"].map(String::from).into(),
        || format!("our common edits hold {:?}", keys(my_common)),
    )?;
    let (their_env, my_env) = (env(common), env(my_common));
    for (key, value) in &my_env {
        let documented = OURS_ONLY_ENV.contains(&key.as_str());
        check(their_env.get(key) == Some(value) || documented, || {
            format!("our common env {key}={value}; NVIDIA's has {their_env:?}")
        })?;
    }
    for key in their_env.keys() {
        check(
            my_env.contains_key(key) || NVIDIA_ONLY_ENV.contains(&key.as_str()),
            || format!("NVIDIA's common env sets {key}, ours does not"),
        )?;
    }
    check(ours.to_string().matches(VISIBLE_VOID).count() == 1, || {
        format!("ours must set {VISIBLE_VOID} once, in the common edits: {ours}")
    })?;
    // NVIDIA mounts each driver file at its host path; ours mounts the driver volume, which
    // holds them, read-only at /usr/local/nvidia.
    let mounts = my_common["mounts"].as_array().cloned().unwrap_or_default();
    check(
        mounts.len() == 1 && mounts[0]["containerPath"] == "/usr/local/nvidia",
        || format!("our mounts: {mounts:?}"),
    )?;
    let their_files: Vec<&str> = common["mounts"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|m| m["containerPath"].as_str())
        .collect();
    check(
        their_files.iter().any(|f| f.contains("libcuda.so."))
            && their_files.iter().any(|f| f.ends_with("/nvidia-smi")),
        || format!("NVIDIA's mounts lack the driver's files: {their_files:?}"),
    )?;
    Ok(())
}

fn our_spec_matches_nvidia_ctk() -> Result<(), Failed> {
    let nvidia = golden();
    let scratch = tempfile::tempdir()?;
    let dev = scratch.path().join("dev");
    fs::create_dir(&dev)?;
    mknod_like(&nvidia, &dev)?;
    let ours = ours(&dev, scratch.path())?;
    compare(&nvidia, &ours)
}

/// Builds the README's fake driver root under `scratch`, runs `ctk` as the README does, and
/// returns its spec with the scratch paths written as the golden file's.
fn run_nvidia_ctk(ctk: &Path, scratch: &Path) -> Result<String, Failed> {
    let dev = scratch.join("dev/dev");
    fs::create_dir_all(&dev)?;
    mknod_like(&golden(), &dev)?;
    let driver = scratch.join("driver");
    let lib = driver.join("usr/lib/x86_64-linux-gnu");
    fs::create_dir_all(&lib)?;
    fs::create_dir_all(driver.join("usr/bin"))?;
    fs::create_dir_all(driver.join("etc"))?;
    let stub = scratch.join("stub.c");
    fs::write(&stub, "int mgpu_stub;\n")?;
    run_checked(
        Command::new("cc")
            .args(["-shared", "-Wl,-soname,libcuda.so.1", "-o"])
            .arg(lib.join(format!("libcuda.so.{DRIVER_VERSION}")))
            .arg(&stub),
    )?;
    fs::copy(
        mesos_gpu_testkit::nvml_sim::sim_library(),
        lib.join(format!("libnvidia-ml.so.{DRIVER_VERSION}")),
    )?;
    for name in ["libcuda", "libnvidia-ml"] {
        std::os::unix::fs::symlink(
            format!("{name}.so.{DRIVER_VERSION}"),
            lib.join(format!("{name}.so.1")),
        )?;
    }
    let smi = driver.join("usr/bin/nvidia-smi");
    fs::write(&smi, "#!/bin/sh\n")?;
    run_checked(Command::new("chmod").arg("0755").arg(&smi))?;
    fs::write(driver.join("etc/ld.so.conf"), "/usr/lib/x86_64-linux-gnu\n")?;
    run_checked(Command::new("ldconfig").arg("-r").arg(&driver))?;
    let spec = scratch.join("spec.json");
    let topology = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../nvml-sim/topologies")
        .join(format!("{NODE}.json"));
    run_checked(
        Command::new(ctk)
            .args(["cdi", "generate", "--format", "json", "--dev-root"])
            .arg(scratch.join("dev"))
            .arg("--driver-root")
            .arg(&driver)
            .arg("--output")
            .arg(&spec)
            .current_dir(scratch)
            .env("NVML_SIM_CONFIG", topology),
    )?;
    let text = fs::read_to_string(&spec)?;
    Ok(text.replace(scratch.to_str().unwrap(), GOLDEN_SCRATCH))
}

fn nvidia_ctk_live() -> Result<(), Failed> {
    let ctk = PathBuf::from(std::env::var_os(CTK_ENV).unwrap());
    let scratch = tempfile::tempdir()?;
    let live = run_nvidia_ctk(&ctk, scratch.path())?;
    let parsed: Value = serde_json::from_str(&live)?;
    check(parsed == golden(), || {
        format!(
            "{} now writes another spec than tests/nvidia-ctk/k80.json; review it and replace \
             the file:\n{live}",
            ctk.display()
        )
    })?;
    let dev = scratch.path().join("dev/dev");
    compare(&parsed, &ours(&dev, scratch.path())?)
}
