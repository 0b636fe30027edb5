//! The whole lifecycle driven by a **C program** (`tests/c/lifecycle.c`) compiled with `cc`
//! against the generated `include/mesos_gpu.h` and linked to the built `libmesos_gpu.so`, on a
//! simulated 4-GPU node (nvml-sim) with mknod'ed device nodes and real cgroups (v1 and v2).
//!
//! The Rust side writes the protobuf inputs (`gpus:2`, then an update to `gpus:1`), the C
//! program runs recover → prepare (size query, then retry) → isolate of a forked child → update
//! → usage → status → watch → cleanup, and the child opens every GPU node after isolate and
//! after update: `ENXIO` (allowed; no driver behind the node) for the allocated GPUs, `EPERM`
//! (denied by the device cgroup) for the others. The Rust side then decodes the answers.
//!
//! Run once more under `umask 000` (as an agent under a supervisor's `UMask=0000`), the same
//! lifecycle leaves its work directory (checkpoint, pool, health) and cgroups with modes nobody
//! else can write: each is listed.

mod support;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, ExitCode};

use libtest_mimic::Arguments;
use mesos_gpu::proto::mesos::slave::{ContainerConfig, ContainerLaunchInfo, ContainerRecoverInfo};
use mesos_gpu::proto::mesos::{ContainerStatus, ResourceStatistics};
use mesos_gpu_testkit::{Host, Need, modes, needs};
use prost::Message;
use support::{
    Cg, Fixture, MINORS, TestResult, cdylib, check, cid, config, env_var, include_dir, trial,
};

const ENXIO: i32 = 6;
const EPERM: i32 = 1;

fn main() -> ExitCode {
    let host = Host::probe();
    let trials = vec![
        needs(
            &host,
            &[Need::Root, Need::Cgroup1, Need::Cc],
            trial("c_lifecycle_cgroup_v1", || c_lifecycle(Cg::V1)),
        ),
        needs(
            &host,
            &[Need::Root, Need::Cgroup2, Need::Cc],
            trial("c_lifecycle_cgroup_v2", || c_lifecycle(Cg::V2)),
        ),
        needs(
            &host,
            &[Need::Root, Need::Cgroup2, Need::Cc],
            trial(
                "c_lifecycle_under_umask_000_creates_nothing_others_can_write",
                || c_lifecycle_under(Cg::V2, Umask::Zero),
            ),
        ),
        needs(
            &host,
            &[Need::Cc],
            trial("cpp_header_test", cpp_header_test),
        ),
    ];
    libtest_mimic::run(&Arguments::from_args(), trials).exit_code()
}

/// Compiles `tests/c/lifecycle.c` into `out` against the header and the built library.
fn compile(out: &Path) -> TestResult<std::path::PathBuf> {
    let lib = cdylib()?;
    let lib_dir = lib.parent().ok_or("library has no directory")?;
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/lifecycle.c");
    let exe = out.join("lifecycle");
    let output = Command::new("cc")
        .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-o"])
        .arg(&exe)
        .arg(&src)
        .arg("-I")
        .arg(include_dir())
        .arg(format!("-L{}", lib_dir.display()))
        .arg(format!("-Wl,-rpath,{}", lib_dir.display()))
        .arg("-lmesos_gpu")
        .output()?;
    check(
        output.status.success(),
        format!("cc failed:\n{}", String::from_utf8_lossy(&output.stderr)),
    )?;
    Ok(exe)
}

/// The umask the C program runs under.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Umask {
    /// The test's own.
    Inherited,
    /// 000: nothing it creates may depend on the umask for its mode.
    Zero,
}

fn c_lifecycle(version: Cg) -> TestResult {
    c_lifecycle_under(version, Umask::Inherited)
}

fn c_lifecycle_under(version: Cg, umask: Umask) -> TestResult {
    let fixture = Fixture::new(version)?;
    let io = tempfile::Builder::new().prefix("mgpu-ffi-c").tempdir()?;
    let exe = compile(io.path())?;
    let id = cid("c-lifecycle");
    let write = |name: &str, bytes: Vec<u8>| std::fs::write(io.path().join(name), bytes);
    write("params.bin", fixture.params(&[]).encode_to_vec())?;
    write("id.bin", id.encode_to_vec())?;
    write("config.bin", config(2.0))?;
    let update = ContainerConfig {
        resources: vec![mesos_gpu::testing::gpus_resource(1.0)],
        ..ContainerConfig::default()
    };
    write("update.bin", update.encode_to_vec())?;
    write(
        "recover.bin",
        ContainerRecoverInfo::default().encode_to_vec(),
    )?;

    let nodes: Vec<String> = MINORS
        .iter()
        .map(|m| fixture.gpu_node(*m).display().to_string())
        .collect();
    let ctl = fixture.dev.path().join("nvidiactl").display().to_string();
    let mut program = Command::new(&exe);
    program.arg(io.path()).args(&nodes).arg(&ctl);
    let before = modes::paths(fixture.work.path());
    let output = match umask {
        Umask::Inherited => program.output()?,
        Umask::Zero => modes::under_umask_000(&program).output()?,
    };
    if umask == Umask::Zero {
        let made = modes::created(modes::listing(fixture.work.path()), &before);
        modes::check_created("the module (C ABI)", &made, &[])?;
        for want in ["gpu/allocations.json", "pool/gpu/pool.json"] {
            let path = fixture.work.path().join(want);
            check(
                made.iter().any(|e| e.path == path),
                format!("{} was not created", path.display()),
            )?;
        }
        let parent = fs_mode(&fixture.parent);
        check(
            parent == Some(0o755),
            format!("cgroups root {}: {parent:?}", fixture.parent.display()),
        )?;
    }
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    check(
        output.status.success(),
        format!("C program failed ({}):\n{stderr}\n{stdout}", output.status),
    )?;
    check(
        stderr.contains("lifecycle done"),
        format!("C program did not finish:\n{stderr}"),
    )?;
    check(
        stderr.lines().any(|l| {
            l.starts_with("LOG 2 mesos_gpu_isolator")
                && l.contains("prepared container")
                && l.ends_with("[agent-log]")
        }),
        format!("no forwarded log line for prepare:\n{stderr}"),
    )?;

    // The launch info names 2 GPUs by UUID; map them to minors through nvml-sim's description.
    let info =
        ContainerLaunchInfo::decode(std::fs::read(io.path().join("launch.bin"))?.as_slice())?;
    let uuids: Vec<String> = env_var(&info, "CUDA_VISIBLE_DEVICES")
        .unwrap_or_default()
        .split(',')
        .map(str::to_owned)
        .collect();
    check(
        uuids.len() == 2,
        format!("CUDA_VISIBLE_DEVICES names {uuids:?}"),
    )?;
    check(
        env_var(&info, "NVIDIA_VISIBLE_DEVICES") == Some(uuids.join(",")),
        "NVIDIA_VISIBLE_DEVICES differs",
    )?;
    check(
        info.mounts.is_empty(),
        format!("host-filesystem container got mounts: {:?}", info.mounts),
    )?;
    let allocated: Vec<u32> = uuids
        .iter()
        .map(|u| minor_of(&fixture.sim.config_path(), u))
        .collect::<TestResult<_>>()?;

    // Phase 1: exactly the 2 allocated GPUs (and nvidiactl) are allowed.
    let opens = parse_opens(&stdout)?;
    for (m, path) in MINORS.iter().zip(&nodes) {
        let want = if allocated.contains(m) { ENXIO } else { EPERM };
        check(
            opens.get(&(1, path.clone())) == Some(&want),
            format!(
                "phase 1 {path}: {:?}, want {want}",
                opens.get(&(1, path.clone()))
            ),
        )?;
    }
    check(
        opens.get(&(1, ctl.clone())) == Some(&ENXIO),
        "nvidiactl denied",
    )?;
    // Phase 2, after update to 1 GPU: one of the two remains, nothing else.
    let kept: Vec<u32> = MINORS
        .iter()
        .zip(&nodes)
        .filter(|(_, p)| opens.get(&(2, (*p).clone())) == Some(&ENXIO))
        .map(|(m, _)| *m)
        .collect();
    check(
        kept.len() == 1 && allocated.contains(&kept[0]),
        format!("after update: {kept:?} allowed, had {allocated:?}"),
    )?;
    check(
        nodes
            .iter()
            .all(|p| matches!(opens.get(&(2, p.clone())), Some(&ENXIO) | Some(&EPERM))),
        format!("phase 2 incomplete: {opens:?}"),
    )?;

    let usage = ResourceStatistics::decode(std::fs::read(io.path().join("usage.bin"))?.as_slice())?;
    check(
        usage.timestamp > 1.6e9,
        format!("usage timestamp {}", usage.timestamp),
    )?;
    let status = ContainerStatus::decode(std::fs::read(io.path().join("status.bin"))?.as_slice())?;
    check(
        status.container_id.as_ref() == Some(&id),
        format!("{status:?}"),
    )?;
    let left = fixture.leftover_cgroups();
    check(left.is_empty(), format!("cgroups left behind: {left:?}"))
}

/// Compiles `tests/cpp/header_test.cpp` with `g++ -std=c++17` against the header, links it to
/// the built library and runs it.
fn cpp_header_test() -> TestResult {
    let lib = cdylib()?;
    let lib_dir = lib.parent().ok_or("library has no directory")?;
    let out = tempfile::Builder::new().prefix("mgpu-ffi-cpp").tempdir()?;
    let exe = out.path().join("header_test");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/cpp/header_test.cpp");
    let output = Command::new("g++")
        .args(["-std=c++17", "-Wall", "-Wextra", "-Werror", "-o"])
        .arg(&exe)
        .arg(&src)
        .arg("-I")
        .arg(include_dir())
        .arg(format!("-L{}", lib_dir.display()))
        .arg(format!("-Wl,-rpath,{}", lib_dir.display()))
        .arg("-lmesos_gpu")
        .output()?;
    check(
        output.status.success(),
        format!("g++ failed:\n{}", String::from_utf8_lossy(&output.stderr)),
    )?;
    let run = Command::new(&exe).output()?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&run.stdout),
        String::from_utf8_lossy(&run.stderr)
    );
    check(
        run.status.success() && text.contains("header_test: 0 failure(s)"),
        text,
    )
}

/// `phase path errno` lines → {(phase, path): errno}.
fn parse_opens(stdout: &str) -> TestResult<BTreeMap<(u32, String), i32>> {
    let mut out = BTreeMap::new();
    for line in stdout.lines() {
        let parts: Vec<&str> = line.split_whitespace().collect();
        let [phase, path, errno] = parts.as_slice() else {
            return Err(format!("bad line {line:?}").into());
        };
        out.insert((phase.parse()?, (*path).to_owned()), errno.parse()?);
    }
    Ok(out)
}

/// The minor of the GPU with `uuid` in the nvml-sim description at `path`.
fn minor_of(path: &Path, uuid: &str) -> TestResult<u32> {
    let node: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path)?)?;
    let gpus = node["gpus"]
        .as_array()
        .ok_or("no gpus in the description")?;
    let gpu = gpus
        .iter()
        .find(|g| g["uuid"] == uuid)
        .ok_or_else(|| format!("unknown UUID {uuid}"))?;
    Ok(u32::try_from(gpu["minor"].as_u64().ok_or("no minor")?)?)
}

/// The mode bits of `path`, if it exists.
fn fs_mode(path: &Path) -> Option<u32> {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::metadata(path)
        .ok()
        .map(|m| m.permissions().mode() & 0o7777)
}
