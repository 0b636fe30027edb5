//! Issue 17: GPU shares through the container lifecycle, on real cgroups (v1 and v2), a
//! simulated DGX-1 (nvml-sim) and mknod'ed device nodes.
//!
//! The node shares GPUs 0 and 1 four ways and keeps 2-7 whole (`4,2=1,…,7=1`: 14 `gpus` units).
//! - Shares pack onto a partly used GPU first; every owner's cgroup opens exactly its GPU
//!   (ENXIO) and no other (EPERM); a request no shared GPU has room for takes whole GPUs when
//!   enough are free, and is refused with both reasons when not; the pool records each share
//!   under its owner; `update` keeps a share's size and refuses another; cleanup frees it.
//! - Two isolators on one pool (the agent's module and an `exec`) never over-commit a GPU.
//! - Under `mps` (nvml-sim's `nvidia-cuda-mps-control` stand-in, started for real): one daemon
//!   per GPU for the whole node, adopted by a second process; killed, it is started again by
//!   supervision and every owner (in both processes) is told through `watch`; each owner gets
//!   its k/R limits in its environment, and a container with an image the pipe directory and
//!   `/dev/shm`.
//! - A restarted isolator recovers its shares from its checkpoint.
//! - A dry run (`IsolatorConfig::dry_run`, what `mesos-gpu demo` asks for) decides and records
//!   as a real run does and acts on nothing: no cgroup, no MPS daemon.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod lifecycle_common;
#[allow(dead_code)]
mod support;

use std::path::Path;
use std::process::ExitCode;

use libtest_mimic::{Arguments, Trial};
use lifecycle_common::{Node, Setup, TestResult, check, trial};
use mesos_gpu_enforce::cgroup::CgroupVersion;
use mesos_gpu_enforce::mps::MpsConfig;
use mesos_gpu_grant::MountKind;
use mesos_gpu_isolator::{
    lifecycle::CgroupChoice, lifecycle::ContainerId, lifecycle::Isolator,
    lifecycle::IsolatorConfig, lifecycle::LaunchInfo, lifecycle::LifecycleError,
    lifecycle::PoolConfig, lifecycle::PoolRole, lifecycle::PrepareConfig, lifecycle::SharingConfig,
};
use mesos_gpu_placement::sharing::{ModeSpec, SharingMode, SharingSpec};
use mesos_gpu_pool::Pool;
use mesos_gpu_testkit::mps::MpsControl;
use mesos_gpu_testkit::{Host, Need, needs};
use support::{ALLOWED, DENIED, Mode, Probe};

/// GPUs 0 and 1 shared four ways, the rest whole.
const SPEC: &str = "4,2=1,3=1,4=1,5=1,6=1,7=1";

fn main() -> ExitCode {
    if let Some(code) = support::probe_main() {
        return code;
    }
    let host = Host::probe();
    let mut trials: Vec<Trial> = Vec::new();
    for (version, need, tag) in [
        (CgroupVersion::V1, Need::Cgroup1, "v1"),
        (CgroupVersion::V2, Need::Cgroup2, "v2"),
    ] {
        let mut add = |name: &str, f: fn(CgroupVersion) -> TestResult| {
            let t = trial(format!("{tag}_{name}"), move || f(version));
            trials.push(needs(&host, &[Need::Root, need], t));
        };
        add(
            "shares_pack_isolate_fall_back_and_refuse",
            shares_pack_isolate_fall_back_and_refuse,
        );
        add(
            "mps_daemons_limits_and_mounts_for_every_owner",
            mps_daemons_limits_and_mounts,
        );
        add("shares_survive_a_restart", shares_survive_a_restart);
    }
    trials.push(needs(
        &host,
        &[Need::Root],
        trial(
            "dry_run_decides_and_records_like_a_real_run_and_acts_on_nothing".to_owned(),
            dry_run_decides_and_records_like_a_real_run_and_acts_on_nothing,
        ),
    ));
    libtest_mimic::run(&Arguments::from_args(), trials).exit_code()
}

fn id(s: &str) -> ContainerId {
    ContainerId::new(s).unwrap()
}

fn gpus(n: f64) -> PrepareConfig {
    PrepareConfig {
        gpus: n,
        ..Default::default()
    }
}

/// `setup`'s configuration sharing by `SPEC` in `mode`, on the pool `pool`, checkpointed in
/// `work`.
fn shared(
    setup: &Setup,
    work: &Path,
    pool: &Path,
    role: PoolRole,
    mode: SharingMode,
    mps: MpsConfig,
) -> TestResult<IsolatorConfig> {
    let mut config = setup.config.clone();
    config.work_dir = work.to_owned();
    config.pool = Some(PoolConfig {
        dir: pool.to_owned(),
        role,
    });
    config.sharing = Some(SharingConfig {
        spec: SharingSpec::parse(SPEC, ModeSpec::uniform(mode))?,
        mps,
    });
    Ok(config)
}

fn isolator(config: IsolatorConfig, node: &Node) -> TestResult<Isolator> {
    let isolator = Isolator::new(config, node.inventory.clone(), node.nodes.clone())?;
    isolator.recover(&[], &[])?;
    Ok(isolator)
}

fn env<'a>(info: &'a LaunchInfo, key: &str) -> Option<&'a str> {
    info.environment
        .iter()
        .chain(&info.task_environment)
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
}

/// The indices of the GPUs a container may use.
fn indices(info: &LaunchInfo) -> Vec<u32> {
    info.gpus.iter().map(|g| g.index).collect()
}

/// A probe in `c`'s cgroup opens exactly the GPUs with `minors` (and the control nodes).
fn opens_exactly(iso: &Isolator, c: &ContainerId, node: &Node, minors: &[u32]) -> TestResult {
    let mut probe = Probe::spawn()?;
    iso.isolate(c, probe.pid())?;
    let mut wrong = Vec::new();
    for gpu in &node.inventory.gpus {
        let want = if minors.contains(&gpu.minor) {
            ALLOWED
        } else {
            DENIED
        };
        let got = probe.open(&node.gpu_node(gpu.minor), Mode::Write)?;
        if got != want {
            wrong.push(format!(
                "{c}: nvidia{} got {got}, expected {want}",
                gpu.minor
            ));
        }
    }
    for ctl in ["nvidiactl", "nvidia-uvm"] {
        let got = probe.open(&node.dev.path().join(ctl), Mode::Write)?;
        if got != ALLOWED {
            wrong.push(format!("{c}: {ctl} got {got}, expected {ALLOWED}"));
        }
    }
    drop(probe);
    lifecycle_common::kill_cgroup(&iso.cgroup_path(c));
    check(wrong.is_empty(), wrong.join("; "))
}

/// The pool's shares: owner id → (GPU index, units).
fn pool_shares(pool: &Path) -> TestResult<Vec<(String, u32, u32)>> {
    let state = Pool::at(pool).read()?;
    Ok(state
        .shares
        .iter()
        .map(|(id, s)| (id.clone(), s.grant.index, s.grant.units))
        .collect())
}

fn shares_pack_isolate_fall_back_and_refuse(version: CgroupVersion) -> TestResult {
    let node = Node::new("dgx1-v100")?;
    let setup = Setup::new(version)?;
    let pool = setup.work.path().join("pool");
    let config = shared(
        &setup,
        &setup.work.path().join("agent"),
        &pool,
        PoolRole::Agent,
        SharingMode::TimeSlicing,
        MpsConfig::new(setup.work.path().join("mps")),
    )?;
    let iso = isolator(config, &node)?;
    let uuid0 = node.inventory.by_index(0).unwrap().uuid.clone();

    // 1 + 2 units pack onto GPU 0; 2 more do not fit there (1 left) and go to GPU 1; 1 fills GPU 0.
    let a = iso.prepare(&id("a"), gpus(1.0))?;
    let b = iso.prepare(&id("b"), gpus(2.0))?;
    let c = iso.prepare(&id("c"), gpus(2.0))?;
    let d = iso.prepare(&id("d"), gpus(1.0))?;
    check(
        [indices(&a), indices(&b), indices(&c), indices(&d)]
            == [vec![0], vec![0], vec![1], vec![0]],
        format!(
            "placement: a {:?}, b {:?}, c {:?}, d {:?}",
            indices(&a),
            indices(&b),
            indices(&c),
            indices(&d)
        ),
    )?;
    check(
        env(&a, "MESOS_GPU_SHARE") == Some("1/4")
            && env(&b, "MESOS_GPU_SHARE") == Some("2/4")
            && env(&a, "MESOS_GPU_SHARING") == Some("time-slicing")
            && env(&a, "NVIDIA_VISIBLE_DEVICES") == Some(uuid0.as_str())
            && env(&a, "CUDA_MPS_PIPE_DIRECTORY").is_none(),
        format!("environment of a: {:?}", a.environment),
    )?;
    let minor = |i: u32| node.inventory.by_index(i).unwrap().minor;
    for (c_id, gpu) in [("a", 0), ("b", 0), ("c", 1), ("d", 0)] {
        opens_exactly(&iso, &id(c_id), &node, &[minor(gpu)])?;
    }
    check(
        pool_shares(&pool)?
            == [
                ("a".to_owned(), 0, 1),
                ("b".to_owned(), 0, 2),
                ("c".to_owned(), 1, 2),
                ("d".to_owned(), 0, 1),
            ],
        format!("pool shares: {:?}", pool_shares(&pool)?),
    )?;
    check(
        iso.status(&id("b"))?
            .share
            .is_some_and(|s| s.units == 2 && s.replicas == 4),
        "status shows the share",
    )?;

    // 4 units: GPU 1 has 2 free, GPU 0 none: four whole GPUs serve it (2-7 are whole).
    let e = iso.prepare(&id("e"), gpus(4.0))?;
    check(
        indices(&e).len() == 4 && indices(&e).iter().all(|&i| i >= 2),
        format!("fallback to whole GPUs: {:?}", indices(&e)),
    )?;
    check(
        env(&e, "MESOS_GPU_SHARE").is_none(),
        "whole GPUs are no share",
    )?;
    // 4 more: no shared GPU has room and only 2 whole GPUs are free.
    let refused = iso.prepare(&id("f"), gpus(4.0)).unwrap_err();
    let text = refused.to_string();
    check(
        matches!(refused, LifecycleError::ShareRefused { .. })
            && refused.is_not_enough()
            && text.contains("no shared GPU has 4 free units")
            && text.contains("0/4")
            && text.contains("2/4")
            && text.contains("4 asked; 2 free"),
        format!("refusal: {text}"),
    )?;
    check(
        !iso.cgroup_path(&id("f")).exists(),
        "a refusal makes nothing",
    )?;
    // 9 units: more than a GPU holds, so whole GPUs only; 2 free.
    let nine = iso.prepare(&id("g"), gpus(9.0)).unwrap_err();
    check(
        nine.is_not_enough(),
        format!("9 units: {}", mesos_gpu_os::error_chain(&nine)),
    )?;
    let fifteen = mesos_gpu_os::error_chain(&iso.prepare(&id("h"), gpus(15.0)).unwrap_err());
    check(
        fifteen.contains("gpus=15: expected a whole number from 0 to 14"),
        format!("more units than the node offers is a bad request: {fifteen}"),
    )?;

    // A second owner of the pool (an exec) sees the shares: GPU 1 has room for 2.
    let exec_dir = setup.work.path().join("exec");
    let exec = isolator(
        shared(
            &setup,
            &exec_dir,
            &pool,
            PoolRole::Exec {
                private_dir: exec_dir.clone(),
            },
            SharingMode::TimeSlicing,
            MpsConfig::new(setup.work.path().join("mps")),
        )?,
        &node,
    )?;
    let x = exec.prepare(&id("exec-1-x"), gpus(2.0))?;
    check(indices(&x) == [1], format!("exec share: {:?}", indices(&x)))?;
    // Every shared GPU is full now: one unit takes one of the two whole GPUs left.
    let y = exec.prepare(&id("exec-1-y"), gpus(1.0))?;
    check(
        indices(&y).len() == 1 && indices(&y)[0] >= 2 && env(&y, "MESOS_GPU_SHARE").is_none(),
        format!("shares full, a whole GPU: {:?}", indices(&y)),
    )?;
    exec.cleanup(&id("exec-1-y"))?;
    exec.cleanup(&id("exec-1-x"))?;

    // update keeps a share's size, refuses another.
    iso.update(&id("b"), 2.0)?;
    let resize = iso.update(&id("b"), 3.0).unwrap_err();
    check(
        resize.to_string().contains("a share cannot be resized"),
        format!("resize: {resize}"),
    )?;

    for c_id in ["a", "b", "c", "d", "e"] {
        iso.cleanup(&id(c_id))?;
    }
    check(pool_shares(&pool)?.is_empty(), "cleanup frees every share")?;
    let again = iso.prepare(&id("i"), gpus(4.0))?;
    check(
        indices(&again) == [0],
        "a whole GPU's worth of units on GPU 0",
    )?;
    iso.cleanup(&id("i"))?;
    Ok(())
}

fn mps_daemons_limits_and_mounts(version: CgroupVersion) -> TestResult {
    let node = Node::new("dgx1-v100")?;
    let setup = Setup::new(version)?;
    let pool = setup.work.path().join("pool");
    let control = MpsControl::install("{}");
    let mps_root = setup.work.path().join("mps");
    let mps = || {
        let mut m = MpsConfig::new(&mps_root);
        m.program = control.program();
        m
    };
    let agent = isolator(
        shared(
            &setup,
            &setup.work.path().join("agent"),
            &pool,
            PoolRole::Agent,
            SharingMode::Mps,
            mps(),
        )?,
        &node,
    )?;
    let gpu0 = node.inventory.by_index(0).unwrap();
    let pipe = mps_root.join(&gpu0.uuid).join("pipe");
    let rootfs = tempfile::tempdir()?;
    let one = agent.prepare(
        &id("one"),
        PrepareConfig {
            gpus: 1.0,
            rootfs: Some(rootfs.path().to_owned()),
            has_task_info: true,
            ..Default::default()
        },
    )?;
    // A V100 has 16 GiB: one unit of four is 25 % and 4040 MiB.
    check(
        env(&one, "CUDA_MPS_PIPE_DIRECTORY") == pipe.to_str()
            && env(&one, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE") == Some("25")
            && env(&one, "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT") == Some("0=4040M")
            && env(&one, "MESOS_GPU_SHARING") == Some("mps")
            && one.environment.is_empty(),
        format!("task environment: {:?}", one.task_environment),
    )?;
    let mps_mounts: Vec<(String, String)> = one
        .mounts
        .iter()
        .filter(|m| m.kind == MountKind::Mps)
        .map(|m| {
            (
                m.source.display().to_string(),
                m.target.display().to_string(),
            )
        })
        .collect();
    let want = vec![
        (
            pipe.display().to_string(),
            rootfs
                .path()
                .join(pipe.strip_prefix("/")?)
                .display()
                .to_string(),
        ),
        (
            "/dev/shm".to_owned(),
            rootfs.path().join("dev/shm").display().to_string(),
        ),
    ];
    check(mps_mounts == want, format!("MPS mounts: {mps_mounts:?}"))?;
    opens_exactly(&agent, &id("one"), &node, &[gpu0.minor])?;

    // An exec on the same pool adopts the daemon instead of starting a second one.
    let exec_dir = setup.work.path().join("exec");
    let exec = isolator(
        shared(
            &setup,
            &exec_dir,
            &pool,
            PoolRole::Exec {
                private_dir: exec_dir.clone(),
            },
            SharingMode::Mps,
            mps(),
        )?,
        &node,
    )?;
    let two = exec.prepare(&id("exec-2-two"), gpus(2.0))?;
    check(
        indices(&two) == [0]
            && env(&two, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE") == Some("50")
            && env(&two, "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT") == Some("0=8080M")
            && env(&two, "CUDA_MPS_PIPE_DIRECTORY") == pipe.to_str()
            && two.mounts.is_empty(),
        format!("exec share: {:?} {:?}", indices(&two), two.environment),
    )?;
    opens_exactly(&exec, &id("exec-2-two"), &node, &[gpu0.minor])?;
    let records = control.records();
    let starts: Vec<&serde_json::Value> =
        records.iter().filter(|r| r["event"] == "start").collect();
    check(
        starts.len() == 1 && starts[0]["env"]["CUDA_VISIBLE_DEVICES"] == gpu0.uuid.as_str(),
        format!("one daemon for GPU 0: {records:?}"),
    )?;
    let commands: Vec<&str> = records
        .iter()
        .filter(|r| r["event"] == "command")
        .filter_map(|r| r["command"].as_str())
        .collect();
    check(
        commands
            == [
                "set_default_active_thread_percentage 25".to_owned(),
                format!("set_default_device_pinned_mem_limit {} 4040M", gpu0.uuid),
            ],
        format!("the daemon was told the per-unit defaults: {commands:?}"),
    )?;
    let daemon_pid = starts[0]["daemon_pid"].as_u64().unwrap_or_default();
    let recorded = Pool::at(&pool).read()?;
    check(
        recorded
            .mps
            .get(&gpu0.uuid)
            .is_some_and(|r| u64::from(r.daemon.process.pid) == daemon_pid),
        format!("the pool records the daemon: {:?}", recorded.mps),
    )?;

    // The daemon dies: the next share of its GPU starts another.
    std::process::Command::new("kill")
        .args(["-KILL", &daemon_pid.to_string()])
        .status()?;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while Path::new(&format!("/proc/{daemon_pid}/stat")).exists()
        && !std::fs::read_to_string(format!("/proc/{daemon_pid}/stat"))
            .unwrap_or_default()
            .rsplit(')')
            .next()
            .is_some_and(|s| s.trim_start().starts_with('Z'))
    {
        check(
            std::time::Instant::now() < deadline,
            "the daemon outlived SIGKILL",
        )?;
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    // Supervision starts it again and limits the owners: the agent's `one` here, and the
    // exec's `exec-2-two` when the exec supervises (another process restarted it).
    let restarts = agent.supervise_mps()?;
    check(
        restarts.len() == 1
            && restarts[0].gpu == gpu0.uuid
            && restarts[0].failed.is_none()
            && restarts[0].owners == [id("one")],
        format!("agent's supervision: {restarts:?}"),
    )?;
    let told = agent
        .watch(&id("one"), Some(std::time::Duration::from_secs(5)))?
        .ok_or("the owner was not told")?;
    check(
        told.uuid == gpu0.uuid
            && told.message.contains("MPS control daemon of GPU 0")
            && told.message.contains("died"),
        format!("limitation: {told:?}"),
    )?;
    let exec_restarts = exec.supervise_mps()?;
    check(
        exec_restarts.len() == 1
            && exec_restarts[0].owners == [id("exec-2-two")]
            && exec_restarts[0]
                .why
                .contains("another process started it again"),
        format!("exec's supervision: {exec_restarts:?}"),
    )?;
    check(
        agent.supervise_mps()?.is_empty() && exec.supervise_mps()?.is_empty(),
        "a running daemon is left alone",
    )?;
    let three = agent.prepare(&id("three"), gpus(1.0))?;
    check(indices(&three) == [0], "GPU 0 again")?;
    let starts = control
        .records()
        .into_iter()
        .filter(|r| r["event"] == "start")
        .count();
    check(starts == 2, format!("restarted once: {starts} starts"))?;
    for (iso, c_id) in [(&agent, "one"), (&exec, "exec-2-two"), (&agent, "three")] {
        iso.cleanup(&id(c_id))?;
    }
    check(pool_shares(&pool)?.is_empty(), "every share freed")?;
    // The operator keeps GPU 0 whole from now on: its daemon is stopped with `quit`.
    drop((agent, exec));
    let whole0 = isolator(
        {
            let mut c = shared(
                &setup,
                &setup.work.path().join("agent"),
                &pool,
                PoolRole::Agent,
                SharingMode::Mps,
                mps(),
            )?;
            c.sharing = Some(SharingConfig {
                spec: SharingSpec::parse(
                    "4,0=1,2=1,3=1,4=1,5=1,6=1,7=1",
                    ModeSpec::uniform(SharingMode::Mps),
                )?,
                mps: mps(),
            });
            c
        },
        &node,
    )?;
    check(whole0.supervise_mps()?.is_empty(), "nothing to restart")?;
    let quits = control
        .records()
        .into_iter()
        .filter(|r| r["event"] == "command" && r["command"] == "quit")
        .count();
    check(
        quits == 1 && !Pool::at(&pool).read()?.mps.contains_key(&gpu0.uuid),
        format!(
            "GPU 0 left sharing: {quits} quit, pool {:?}",
            Pool::at(&pool).read()?.mps
        ),
    )?;
    drop(whole0);
    // The stand-in's daemons exit with the test's scratch directory; stop it now all the same.
    for record in Pool::at(&pool).read()?.mps.values() {
        let _ = std::process::Command::new("kill")
            .arg(record.daemon.process.pid.to_string())
            .status();
    }
    Ok(())
}

fn shares_survive_a_restart(version: CgroupVersion) -> TestResult {
    let node = Node::new("dgx1-v100")?;
    let setup = Setup::new(version)?;
    let pool = setup.work.path().join("pool");
    let work = setup.work.path().join("agent");
    let config = || {
        shared(
            &setup,
            &work,
            &pool,
            PoolRole::Agent,
            SharingMode::TimeSlicing,
            MpsConfig::new(setup.work.path().join("mps")),
        )
    };
    let gpu0 = node.inventory.by_index(0).unwrap();
    {
        let iso = isolator(config()?, &node)?;
        iso.prepare(&id("kept"), gpus(3.0))?;
    }
    let iso = Isolator::new(config()?, node.inventory.clone(), node.nodes.clone())?;
    let report = iso.recover(
        &[mesos_gpu_isolator::lifecycle::RecoverState {
            id: id("kept"),
            parent: None,
            nested_cgroup: None,
        }],
        &[],
    )?;
    check(report.is_clean(), format!("recovery: {report:?}"))?;
    let status = iso.status(&id("kept"))?;
    check(
        status.gpus == [0] && status.share.as_ref().is_some_and(|s| s.units == 3),
        format!("recovered: {status:?}"),
    )?;
    opens_exactly(&iso, &id("kept"), &node, &[gpu0.minor])?;
    // GPU 0 has 1 unit left after the restart, GPU 1 all four.
    let next = iso.prepare(&id("next"), gpus(2.0))?;
    check(
        indices(&next) == [1],
        format!("after restart: {:?}", indices(&next)),
    )?;
    iso.cleanup(&id("next"))?;
    iso.cleanup(&id("kept"))?;
    check(pool_shares(&pool)?.is_empty(), "freed")
}

/// `IsolatorConfig::dry_run` under MPS: shares packed onto GPU 0 with their limits and the pipe
/// directory their daemon would have, a request above any share served whole, all recorded in
/// the pool and the checkpoint as a real run records them; and nothing done on the host: no
/// cgroup under the (plain directory standing for the) hierarchy, no MPS daemon (its program
/// does not exist, so starting one would fail), `isolate` refused for want of a cgroup, and
/// cleanup gives everything back.
fn dry_run_decides_and_records_like_a_real_run_and_acts_on_nothing() -> TestResult {
    let node = Node::new("dgx1-v100")?;
    let dir = tempfile::tempdir()?;
    let hierarchy = dir.path().join("cgroup");
    std::fs::create_dir_all(hierarchy.join("devices"))?;
    let pool = dir.path().join("pool");
    let mut mps = MpsConfig::new(dir.path().join("mps"));
    mps.program = dir.path().join("no-such-nvidia-cuda-mps-control");
    let mut config = IsolatorConfig::new(dir.path().join("work"));
    config.cgroup_version = CgroupChoice::V1;
    config.v1_root = hierarchy.clone();
    config.pool = Some(PoolConfig {
        dir: pool.clone(),
        role: PoolRole::Agent,
    });
    config.sharing = Some(SharingConfig {
        spec: SharingSpec::parse(SPEC, ModeSpec::uniform(SharingMode::Mps))?,
        mps: mps.clone(),
    });
    config.dry_run = true;
    let iso = isolator(config, &node)?;
    let gpu0 = node.inventory.by_index(0).unwrap();
    let task = PrepareConfig {
        gpus: 1.0,
        has_task_info: true,
        ..Default::default()
    };
    let one = iso.prepare(&id("one"), task.clone())?;
    let two = iso.prepare(&id("two"), task)?;
    let whole = iso.prepare(&id("whole"), gpus(5.0))?;
    let pipe = mps.pipe_dir(&gpu0.uuid);
    for (name, info) in [("one", &one), ("two", &two)] {
        check(
            indices(info) == [0]
                && env(info, "CUDA_MPS_PIPE_DIRECTORY") == pipe.to_str()
                && env(info, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE") == Some("25"),
            format!(
                "{name}: GPUs {:?}, environment {:?}",
                indices(info),
                info.task_environment
            ),
        )?;
    }
    check(
        indices(&whole).len() == 5 && indices(&whole).iter().all(|&i| i >= 2),
        format!(
            "5 units above a share: whole GPUs 2-7, got {:?}",
            indices(&whole)
        ),
    )?;
    let mut recorded = pool_shares(&pool)?;
    recorded.sort();
    check(
        recorded == [("one".to_owned(), 0, 1), ("two".to_owned(), 0, 1)],
        format!("the pool records {recorded:?}"),
    )?;
    check(
        iso.containers()?.len() == 3,
        format!("the checkpoint holds {:?}", iso.containers()?),
    )?;
    let made: Vec<_> = std::fs::read_dir(hierarchy.join("devices"))?.collect();
    check(
        made.is_empty(),
        format!("a dry run made {made:?} in the hierarchy"),
    )?;
    check(
        !dir.path().join("mps").exists(),
        "a dry run made the MPS daemons' directories",
    )?;
    let refused = iso.isolate(&id("whole"), std::process::id());
    check(
        matches!(refused, Err(LifecycleError::NoCgroup { .. })),
        format!("isolate in a dry run: {refused:?}"),
    )?;
    for c in ["one", "two", "whole"] {
        iso.cleanup(&id(c))?;
    }
    check(
        pool_shares(&pool)?.is_empty() && iso.containers()?.is_empty(),
        "cleanup gives back what a dry run took",
    )?;
    let again = iso.prepare(&id("again"), gpus(6.0))?;
    check(
        indices(&again) == [2, 3, 4, 5, 6, 7],
        format!(
            "after cleanup every whole GPU is free: {:?}",
            indices(&again)
        ),
    )
}
