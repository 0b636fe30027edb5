//! Issue 13: the node's one GPU pool, on real cgroups (v1 and v2) and a simulated DGX-1.
//!
//! - a stray container cgroup (with a process, granting every GPU) that this pool did not
//!   record never quarantines GPUs of a `docker-args`-like isolator, nor of an agent when
//!   another publisher of the pool records it;
//! - the agent's module and an `exec` on one pool get disjoint GPUs, a shortage is refused with
//!   the pool's counts, and what one releases the other can take.
//!
//! Issue 12: a Docker reservation is alive while the process that starts its container runs,
//! then as long as its daemon runs the container; a reservation whose starter died before the
//! container existed comes back to the pool and is not resurrected by its publisher.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod lifecycle_common;

use std::path::Path;
use std::process::{Child, Command, ExitCode};

use libtest_mimic::{Arguments, Trial};
use lifecycle_common::{Node, Setup, TestResult, check, trial};
use mesos_gpu_enforce::cgroup::CgroupVersion;
use mesos_gpu_isolator::{
    lifecycle::ContainerId, lifecycle::Isolator, lifecycle::IsolatorConfig, lifecycle::PoolConfig,
    lifecycle::PoolRole, lifecycle::PrepareConfig,
};
use mesos_gpu_isolator::{lifecycle::DockerStart, lifecycle::LifecycleError};
use mesos_gpu_pool as pool;
use mesos_gpu_pool::{DaemonAnswer, DockerDaemons, Liveness, Pool};
use mesos_gpu_testkit::{Host, Need, needs};

fn main() -> ExitCode {
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
            "a_stray_cgroup_never_quarantines_another_pools_gpus",
            stray_cgroup,
        );
        add(
            "module_and_exec_get_disjoint_gpus_from_one_pool",
            module_and_exec,
        );
    }
    trials.push(needs(
        &host,
        &[Need::Root, Need::Cgroup1],
        trial(
            "docker_reservations_follow_their_starter_then_their_daemon".to_owned(),
            docker_starter_then_daemon,
        ),
    ));
    trials.push(needs(
        &host,
        &[Need::Root, Need::Cgroup1],
        trial(
            "records_a_publisher_cannot_map_are_kept_as_written_and_their_gpus_never_granted"
                .to_owned(),
            records_kept_by_a_publisher_that_cannot_map_them,
        ),
    ));
    trials.push(needs(
        &host,
        &[Need::Root, Need::Cgroup1],
        trial(
            "records_written_without_a_uuid_are_repaired_on_evidence_about_their_owner".to_owned(),
            records_without_a_uuid_repaired_on_evidence,
        ),
    ));
    trials.push(needs(
        &host,
        &[Need::Root, Need::Cgroup1],
        trial(
            "issue_37_holders_are_recorded_in_the_pool_and_survive_recovery".to_owned(),
            holders_recorded_and_recovered,
        ),
    ));
    libtest_mimic::run(&Arguments::from_args(), trials).exit_code()
}

fn with_pool(config: &IsolatorConfig, work: &Path, pool: &Path, role: PoolRole) -> IsolatorConfig {
    let mut config = config.clone();
    config.work_dir = work.to_owned();
    config.pool = Some(PoolConfig {
        dir: pool.to_owned(),
        role,
    });
    config
}

fn isolator(config: IsolatorConfig, node: &Node) -> TestResult<Isolator> {
    let isolator = Isolator::new(config, node.inventory.clone(), node.nodes.clone())?;
    isolator.recover(&[], &[])?;
    Ok(isolator)
}

/// A cgroup `name` under the setup's root with a sleeping process in it.
fn stray(setup: &Setup, name: &str) -> TestResult<Child> {
    let dir = setup.guard.parent.join(name);
    std::fs::create_dir_all(&dir)?;
    let child = Command::new("sleep").arg("100").spawn()?;
    std::fs::write(dir.join("cgroup.procs"), child.id().to_string())?;
    Ok(child)
}

fn stray_cgroup(version: CgroupVersion) -> TestResult {
    let node = Node::new("dgx1-v100")?;
    let setup = Setup::new(version)?;
    let pool = setup.work.path().join("pool");
    let mut sleeper = stray(&setup, "exec-99999")?;
    let docker = isolator(
        with_pool(
            &setup.config,
            &setup.work.path().join("docker"),
            &pool,
            PoolRole::Docker,
        ),
        &node,
    );
    let result = docker.and_then(|docker| {
        let gpus = reserve(&docker, &ContainerId::new("d1")?, 8.0)?;
        check(gpus.len() == 8, format!("got {} GPUs", gpus.len()))?;
        docker.release_docker(&ContainerId::new("d1")?)?;
        // The agent adopts an unrecorded cgroup, but not one another publisher records.
        let exec = isolator(
            with_pool(
                &setup.config,
                &setup.work.path().join("exec"),
                &pool,
                PoolRole::Exec {
                    private_dir: setup.work.path().join("exec"),
                },
            ),
            &node,
        )?;
        let id = ContainerId::new("exec-1-abc")?;
        exec.prepare(
            &id,
            PrepareConfig {
                gpus: 2.0,
                ..PrepareConfig::default()
            },
        )?;
        let agent = isolator(
            with_pool(
                &setup.config,
                &setup.work.path().join("agent"),
                &pool,
                PoolRole::Agent,
            ),
            &node,
        )?;
        let held = agent.allocations()?;
        let quarantined: Vec<u32> = held.quarantined.iter().map(|(i, _)| *i).collect();
        // exec-99999 (unrecorded) is adopted by the agent; exec-1-abc (recorded by exec) is not.
        let claimants: Vec<String> = held
            .quarantined
            .iter()
            .flat_map(|(_, ids)| ids)
            .map(ToString::to_string)
            .collect();
        check(
            !claimants.iter().any(|c| c == "exec-1-abc"),
            format!("the agent quarantined for another publisher's cgroup: {claimants:?}"),
        )?;
        check(
            claimants.iter().all(|c| c == "exec-99999"),
            format!("quarantine {quarantined:?} by {claimants:?}"),
        )?;
        exec.cleanup(&id)?;
        Ok(())
    });
    let _ = sleeper.kill();
    let _ = sleeper.wait();
    result
}

fn module_and_exec(version: CgroupVersion) -> TestResult {
    let node = Node::new("dgx1-v100")?;
    let setup = Setup::new(version)?;
    let pool = setup.work.path().join("pool");
    let agent = isolator(
        with_pool(
            &setup.config,
            &setup.work.path().join("agent"),
            &pool,
            PoolRole::Agent,
        ),
        &node,
    )?;
    let exec = isolator(
        with_pool(
            &setup.config,
            &setup.work.path().join("exec"),
            &pool,
            PoolRole::Exec {
                private_dir: setup.work.path().join("exec"),
            },
        ),
        &node,
    )?;
    let prep = |gpus: f64| PrepareConfig {
        gpus,
        ..PrepareConfig::default()
    };
    let task = ContainerId::new("task-1")?;
    let cmd = ContainerId::new("exec-2-def")?;
    let a = agent.prepare(&task, prep(6.0))?;
    let err = exec.prepare(&cmd, prep(4.0)).unwrap_err();
    check(
        err.is_not_enough()
            && err.to_string().ends_with(
                "4 asked; 2 free, 0 unhealthy, 0 quarantined, 6 held (run `mesos-gpu gpu list`)",
            ),
        format!("{err}"),
    )?;
    let b = exec.prepare(&cmd, prep(2.0))?;
    let uuids = |info: &mesos_gpu_isolator::lifecycle::LaunchInfo| -> Vec<String> {
        info.gpus.iter().map(|g| g.uuid.clone()).collect()
    };
    let (ua, ub) = (uuids(&a), uuids(&b));
    check(
        ua.iter().all(|u| !ub.contains(u)),
        format!("{ua:?} and {ub:?} overlap"),
    )?;
    let state = Pool::at(&pool).read()?;
    check(
        state.reservations.len() == 2,
        format!("{:?}", state.reservations.keys()),
    )?;
    agent.cleanup(&task)?;
    exec.update(&cmd, 8.0)?;
    exec.cleanup(&cmd)?;
    check(
        Pool::at(&pool).read()?.reservations.is_empty(),
        "the pool is empty after both cleanups",
    )
}

/// A Docker daemon as a table: container name → answer (anything else: no such container).
#[derive(Debug, Default)]
struct FakeDaemons(std::sync::Mutex<std::collections::BTreeMap<String, DaemonAnswer>>);

impl FakeDaemons {
    fn set(&self, name: &str, answer: DaemonAnswer) {
        self.0.lock().unwrap().insert(name.to_owned(), answer);
    }
}

impl DockerDaemons for FakeDaemons {
    fn container(&self, endpoint: &str, name: &str) -> DaemonAnswer {
        assert_eq!(endpoint, FAKE_DAEMON);
        self.0
            .lock()
            .unwrap()
            .get(name)
            .cloned()
            .unwrap_or(DaemonAnswer::NoSuchContainer)
    }

    fn gpu_minors(&self, _endpoint: &str, name: &str) -> Result<Vec<u32>, String> {
        Err(format!("the table does not record {name}'s devices"))
    }
}

const FAKE_DAEMON: &str = "unix:///run/mgpu-test-fake-docker.sock";

fn docker_starter_then_daemon() -> TestResult {
    let node = Node::new("dgx1-v100")?;
    let setup = Setup::new(CgroupVersion::V1)?;
    let pool_dir = setup.work.path().join("pool");
    let daemons = std::sync::Arc::new(FakeDaemons::default());
    let host = pool::Host::default().with_docker(daemons.clone());
    let docker_config = with_pool(
        &setup.config,
        &setup.work.path().join("docker"),
        &pool_dir,
        PoolRole::Docker,
    );
    let open = || -> TestResult<Isolator> {
        let mut i = Isolator::new(
            docker_config.clone(),
            node.inventory.clone(),
            node.nodes.clone(),
        )?;
        i.set_docker_daemons(daemons.clone());
        i.recover(&[], &[])?;
        Ok(i)
    };
    let state_of = |id: &str| -> TestResult<Option<Liveness>> {
        Ok(Pool::at(&pool_dir)
            .list(&host)?
            .reservations
            .into_iter()
            .find(|r| r.id == id)
            .map(|r| r.liveness))
    };
    // The agent that reserved (here a sleeping child) is still pulling the image: no container.
    let mut agent = Command::new("sleep").arg("100").spawn()?;
    let started = ContainerId::new("3d8a52b4-1c5e-4f5a-9c1e-2b7d9a0e6f11")?;
    let docker = open()?;
    reserve_started(
        &docker,
        &started,
        8.0,
        DockerStart {
            daemon: Some(FAKE_DAEMON.to_owned()),
            starter: Some(host.stamp(agent.id())?),
        },
    )?;
    drop(docker);
    let done = Pool::at(&pool_dir).reconcile(&host)?;
    check(
        done.freed.is_empty(),
        format!("freed while starting: {done:?}"),
    )?;
    check(
        matches!(state_of(started.as_str())?, Some(Liveness::Alive(ref why)) if why.contains("starts")),
        format!("{:?}", state_of(started.as_str())),
    )?;
    // The agent dies before `docker run`: no starter, no container, the GPUs come back.
    agent.kill()?;
    agent.wait()?;
    let done = Pool::at(&pool_dir).reconcile(&host)?;
    check(
        done.freed.len() == 1
            && done.freed[0]
                .1
                .contains("has no Docker container mesos-3d8a52b4"),
        format!("{done:?}"),
    )?;
    // The publisher does not record it again, and a wrapper that comes too late is refused.
    let docker = open()?;
    let err = docker
        .claim_docker(&started, DockerStart::default())
        .unwrap_err();
    check(
        matches!(err, LifecycleError::UnknownContainer { .. }),
        format!("{err}"),
    )?;
    check(state_of(started.as_str())?.is_none(), "resurrected")?;
    // The wrapper claims a new reservation; once it is gone the daemon decides.
    let running = ContainerId::new("0d8a52b4-1c5e-4f5a-9c1e-2b7d9a0e6f12")?;
    reserve_started(&docker, &running, 8.0, DockerStart::default())?;
    let mut wrapper = Command::new("sleep").arg("100").spawn()?;
    let claimed = docker.claim_docker(
        &running,
        DockerStart {
            daemon: Some(FAKE_DAEMON.to_owned()),
            starter: Some(host.stamp(wrapper.id())?),
        },
    )?;
    check(claimed.len() == 8, format!("{claimed:?}"))?;
    drop(docker);
    wrapper.kill()?;
    wrapper.wait()?;
    let name = format!("mesos-{running}");
    for (answer, want) in [
        (DaemonAnswer::State("running".into()), "alive"),
        (
            DaemonAnswer::Unreachable("connection refused".into()),
            "uncertain",
        ),
        (DaemonAnswer::State("exited".into()), "dead"),
    ] {
        daemons.set(&name, answer.clone());
        let got = state_of(running.as_str())?.ok_or("no reservation")?;
        check(got.describe().0 == want, format!("{answer:?}: {got:?}"))?;
    }
    // `docker-args --release` (the hook's, at executor removal) keeps a running container's
    // GPUs, and gives back an exited one's.
    daemons.set(&name, DaemonAnswer::State("running".into()));
    let docker = open()?;
    let kept = docker.release_docker_if_gone(&running)?;
    check(
        kept.as_deref().is_some_and(|w| w.contains("is running")),
        format!("{kept:?}"),
    )?;
    daemons.set(&name, DaemonAnswer::State("exited".into()));
    check(
        docker.release_docker_if_gone(&running)?.is_none(),
        "an exited container's GPUs were kept",
    )?;
    drop(docker);
    check(state_of(running.as_str())?.is_none(), "still reserved")?;
    // All 8 GPUs are free again for the publisher.
    let docker = open()?;
    let again = ContainerId::new("1d8a52b4-1c5e-4f5a-9c1e-2b7d9a0e6f13")?;
    check(reserve(&docker, &again, 8.0)?.len() == 8, "8 GPUs not free")?;
    docker.release_docker(&again)?;
    Ok(())
}

/// A publisher that cannot map its records onto the GPUs it sees (it sees none, fewer, or another
/// GPU at an index) keeps them byte for byte in its checkpoint and the pool, reports them, grants
/// none of their GPUs (nothing at all when it sees none, saying why), and still acts on its own
/// records by id: it claims one for its starter and releases another. A publisher with the full
/// view maps them again, and an older checkpoint (index, minor, UUID) loads as ever.
fn records_kept_by_a_publisher_that_cannot_map_them() -> TestResult {
    let node = Node::new("dgx1-v100")?;
    let setup = Setup::new(CgroupVersion::V1)?;
    let pool_dir = setup.work.path().join("pool");
    let work = setup.work.path().join("docker");
    let config = with_pool(&setup.config, &work, &pool_dir, PoolRole::Docker);
    let open = |inventory: &mesos_gpu_node::inventory::Inventory| -> TestResult<(Isolator, mesos_gpu_isolator::lifecycle::RecoveryReport)> {
        let nodes = if inventory.gpus.is_empty() {
            mesos_gpu_node::devices::DeviceNodes::default()
        } else {
            node.nodes.clone()
        };
        let isolator = Isolator::new(config.clone(), inventory.clone(), nodes)?;
        let report = isolator.recover(&[], &[])?;
        Ok((isolator, report))
    };
    let files = || -> TestResult<(String, String)> {
        Ok((
            std::fs::read_to_string(pool_dir.join("gpu/pool.json"))?,
            std::fs::read_to_string(work.join("gpu/allocations.json"))?,
        ))
    };
    let (d1, d2, d3) = (
        ContainerId::new("d1")?,
        ContainerId::new("d2")?,
        ContainerId::new("d3")?,
    );
    let (full, _) = open(&node.inventory)?;
    let mut held = std::collections::BTreeMap::new();
    for (id, n) in [(&d1, 2.0), (&d2, 3.0), (&d3, 2.0)] {
        let gpus = reserve(&full, id, n)?;
        held.insert(id.clone(), gpus.iter().map(|g| g.index).collect::<Vec<_>>());
    }
    drop(full);
    let written = files()?;

    // No GPU seen: every record kept byte for byte, reported, nothing granted.
    let blind = mesos_gpu_node::inventory::Inventory {
        absent_reason: Some("NVIDIA driver not found: libnvidia-ml.so.1: cannot open".into()),
        ..Default::default()
    };
    let (iso, report) = open(&blind)?;
    let unchecked = report.unchecked.ok_or("nothing reported unchecked")?;
    check(
        unchecked.records.len() == 3
            && unchecked.to_string().ends_with(
                "this process sees no GPU (NVIDIA driver not found: libnvidia-ml.so.1: cannot open)"
            ),
        format!("{unchecked}"),
    )?;
    check(
        files()? == written,
        "a publisher that sees no GPU rewrote its records",
    )?;
    let err = reserve(&iso, &ContainerId::new("d4")?, 1.0).unwrap_err();
    check(
        err.to_string()
            == "cannot reserve GPUs for container d4: this process sees no GPU (NVIDIA driver not found: libnvidia-ml.so.1: cannot open): granting no GPU",
        format!("{err}"),
    )?;
    // It claims its own record for a starter, and releases another, by id.
    let host = pool::Host::default();
    iso.claim_docker(
        &d1,
        DockerStart {
            daemon: None,
            starter: Some(host.this_process()?),
        },
    )?;
    iso.release_docker(&d2)?;
    drop(iso);
    let before: serde_json::Value = serde_json::from_str(&written.0)?;
    let after: serde_json::Value = serde_json::from_str(&files()?.0)?;
    let ckpt: serde_json::Value = serde_json::from_str(&files()?.1)?;
    let ckpt_before: serde_json::Value = serde_json::from_str(&written.1)?;
    check(
        after["reservations"]["d1"]["gpus"] == before["reservations"]["d1"]["gpus"]
            && after["reservations"]["d1"]["owner"]["starter"]["pid"] == std::process::id()
            && after["reservations"]["d2"].is_null()
            && after["reservations"]["d3"] == before["reservations"]["d3"]
            && ckpt["docker"]["d1"] == ckpt_before["docker"]["d1"]
            && ckpt["docker"]["d2"].is_null()
            && ckpt["docker"]["d3"] == ckpt_before["docker"]["d3"],
        format!("before: {before}\nafter: {after}\ncheckpoint: {ckpt}"),
    )?;
    let written = files()?;

    // GPUs 0-3 only: records on 4-7 kept, a free GPU it sees granted, no held one.
    let mut fewer = node.inventory.clone();
    fewer.gpus.truncate(4);
    fewer.topology = mesos_gpu_node::inventory::Topology::unknown(4);
    let (iso, report) = open(&fewer)?;
    let unseen: std::collections::BTreeSet<&ContainerId> = report
        .unchecked
        .iter()
        .flat_map(|u| u.records.iter().map(|(id, _)| id))
        .collect();
    let want: std::collections::BTreeSet<&ContainerId> = [&d1, &d3]
        .into_iter()
        .filter(|id| held[*id].iter().any(|&i| i >= 4))
        .collect();
    check(
        unseen == want,
        format!("unchecked {unseen:?}, expected {want:?}"),
    )?;
    check(
        files()? == written,
        "a publisher that sees fewer GPUs rewrote its records",
    )?;
    let taken: std::collections::BTreeSet<u32> = held
        .iter()
        .filter(|(id, _)| **id != d2)
        .flat_map(|(_, g)| g.iter().copied())
        .collect();
    let free_seen = (0..4).filter(|i| !taken.contains(i)).count();
    let d5 = ContainerId::new("d5")?;
    let got = reserve(&iso, &d5, free_seen as f64)?;
    check(
        got.iter().all(|g| g.index < 4 && !taken.contains(&g.index)),
        format!("granted {got:?}; held {taken:?}"),
    )?;
    let err = reserve(&iso, &ContainerId::new("d6")?, 1.0).unwrap_err();
    check(err.is_not_enough(), format!("{err}"))?;
    iso.release_docker(&d5)?;
    drop(iso);
    check(files()? == written, "records changed")?;

    // Another GPU at index 0 (GPU 1's UUID there, and the other way round): records on GPU 0 or
    // 1 are kept, and both GPUs held out while this view lasts.
    let mut swapped = node.inventory.clone();
    let (u0, u1) = (swapped.gpus[0].uuid.clone(), swapped.gpus[1].uuid.clone());
    swapped.gpus[0].uuid = u1;
    swapped.gpus[1].uuid = u0;
    let (iso, report) = open(&swapped)?;
    let on_01 = [&d1, &d3]
        .into_iter()
        .any(|id| held[id].iter().any(|&i| i < 2));
    check(
        report.unchecked.is_some() == on_01,
        format!("{:?}", report.unchecked),
    )?;
    let got = reserve(&iso, &ContainerId::new("d7")?, 1.0);
    if let Ok(got) = &got {
        check(
            got.iter().all(|g| g.index > 1 || !on_01),
            format!("granted {got:?} while a record may name GPU 0 or 1"),
        )?;
        iso.release_docker(&ContainerId::new("d7")?)?;
    }
    drop(iso);
    let after: serde_json::Value = serde_json::from_str(&files()?.0)?;
    let before: serde_json::Value = serde_json::from_str(&written.0)?;
    for id in ["d1", "d3"] {
        check(
            after["reservations"][id] == before["reservations"][id],
            format!("{id} changed: {}", after["reservations"][id]),
        )?;
    }
    check(
        files()?.1 == written.1,
        "a view that differs changed the checkpoint",
    )?;

    // The full view maps every record again; an older checkpoint loads as ever.
    let (iso, report) = open(&node.inventory)?;
    check(
        report.unchecked.is_none(),
        format!("{:?}", report.unchecked),
    )?;
    iso.release_docker(&d1)?;
    iso.release_docker(&d3)?;
    drop(iso);
    let g3 = &node.inventory.gpus[3];
    std::fs::write(
        work.join("gpu/allocations.json"),
        format!(
            r#"{{"version":1,"containers":{{}},"docker":{{"d9":[{{"index":3,"minor":{},"uuid":"{}"}}]}},"quarantine":{{}}}}"#,
            g3.minor, g3.uuid
        ),
    )?;
    let (iso, report) = open(&node.inventory)?;
    check(report.docker.len() == 1, format!("{report:?}"))?;
    let after: serde_json::Value = serde_json::from_str(&files()?.0)?;
    check(
        after["reservations"]["d9"]["gpus"] == serde_json::json!([g3.uuid]),
        format!("{after}"),
    )?;
    iso.release_docker(&ContainerId::new("d9")?)?;
    Ok(())
}

/// Issue 34 item 7: records an earlier mesos-gpu wrote with empty UUIDs (`"gpus": [""]`, the
/// double-booking bug's) are repaired on evidence by the next process that sees the GPUs, instead
/// of every command refusing the pool: a record whose owner is gone is dropped; a live owner's
/// GPUs are named from its devices cgroup (a real v1 cgroup allowing `c 195:5` and `c 195:6`)
/// and never granted while it lives; while a live owner's devices cannot be read, no GPU is
/// granted (saying why) until it ends. Records leave their publisher (whose checkpoint lost the
/// GPUs) and go with their owner.
fn records_without_a_uuid_repaired_on_evidence() -> TestResult {
    let node = Node::new("dgx1-v100")?;
    let setup = Setup::new(CgroupVersion::V1)?;
    let pool_dir = setup.work.path().join("pool");
    let host = pool::Host::default();
    let uuid_of_minor = |minor: u32| -> TestResult<pool::GpuUuid> {
        let gpu = node.inventory.gpus.iter().find(|g| g.minor == minor);
        Ok(pool::GpuUuid::new(
            gpu.ok_or("no such minor")?.uuid.clone(),
        )?)
    };
    // A live owner in a devices cgroup that allows GPUs 5 and 6 (minors 5, 6), one whose process
    // is gone, and a live one whose devices cannot be read (no cgroup recorded).
    std::fs::create_dir_all(&setup.guard.parent)?;
    let cgroup = setup.guard.parent.join("exec-old");
    std::fs::create_dir_all(&cgroup)?;
    std::fs::write(cgroup.join("devices.deny"), "a")?;
    for rule in ["c 195:5 rwm", "c 195:6 rwm", "c 1:3 rwm"] {
        std::fs::write(cgroup.join("devices.allow"), rule)?;
    }
    let mut in_cgroup = Command::new("sleep").arg("100").spawn()?;
    std::fs::write(cgroup.join("cgroup.procs"), in_cgroup.id().to_string())?;
    let mut gone = Command::new("sleep").arg("100").spawn()?;
    let gone_stamp = host.stamp(gone.id())?;
    gone.kill()?;
    gone.wait()?;
    let mut unreadable = Command::new("sleep").arg("100").spawn()?;
    let record = mesos_gpu_testkit::pool::without_uuids;
    {
        let mut tx = Pool::at(&pool_dir).begin()?;
        let r = &mut tx.state.reservations;
        r.insert(
            "mapped".into(),
            record(host.stamp(in_cgroup.id())?, Some(cgroup.clone()), 2),
        );
        r.insert("gone".into(), record(gone_stamp, None, 1));
        r.insert(
            "unreadable".into(),
            record(host.stamp(unreadable.id())?, None, 1),
        );
        tx.commit()?;
    }
    let file = || -> TestResult<serde_json::Value> {
        Ok(serde_json::from_str(&std::fs::read_to_string(
            pool_dir.join("gpu/pool.json"),
        )?)?)
    };
    check(
        file()?["reservations"]["mapped"]["gpus"] == serde_json::json!(["", ""]),
        format!("the records are written as the bug wrote them: {}", file()?),
    )?;

    let docker = isolator(
        with_pool(
            &setup.config,
            &setup.work.path().join("docker"),
            &pool_dir,
            PoolRole::Docker,
        ),
        &node,
    )?;
    let d1 = ContainerId::new("d1")?;
    let err = reserve(&docker, &d1, 1.0).unwrap_err();
    check(
        err.is_not_enough()
            && err
                .to_string()
                .contains("1 GPU(s) are held by live owners whose records do not say which"),
        format!("refused while a live owner's GPUs are unnamed: {err}"),
    )?;
    let now = file()?;
    let named = serde_json::json!([uuid_of_minor(5)?.as_str(), uuid_of_minor(6)?.as_str()]);
    check(
        now["reservations"]["gone"].is_null()
            && now["reservations"]["mapped"]["gpus"] == named
            && now["reservations"]["mapped"]["holder"] == pool::EVIDENCE_PUBLISHER
            && now["reservations"]["unreadable"]["gpus"] == serde_json::json!([""])
            && now["reservations"]["unreadable"]["holder"] == pool::EVIDENCE_PUBLISHER,
        format!("dropped, named from the cgroup, kept: {now}"),
    )?;

    // The unreadable owner ends: every GPU but the named ones is granted, those never.
    unreadable.kill()?;
    unreadable.wait()?;
    let got: Vec<u32> = reserve(&docker, &d1, 6.0)?
        .iter()
        .map(|g| g.minor)
        .collect();
    check(
        got == [0, 1, 2, 3, 4, 7],
        format!("granted minors {got:?}, expected all but 5 and 6"),
    )?;
    check(
        file()?["reservations"]["unreadable"].is_null(),
        format!("a gone owner's record stays: {}", file()?),
    )?;
    let err = reserve(&docker, &ContainerId::new("d2")?, 1.0).unwrap_err();
    check(err.is_not_enough(), format!("{err}"))?;
    docker.release_docker(&d1)?;

    // The named owner ends (its process gone, its cgroup empty): its GPUs come back.
    in_cgroup.kill()?;
    in_cgroup.wait()?;
    let d3 = ContainerId::new("d3")?;
    check(
        reserve(&docker, &d3, 8.0)?.len() == 8,
        "the named GPUs did not come back with their owner",
    )?;
    docker.release_docker(&d3)?;
    check(
        file()?["reservations"]
            .as_object()
            .is_none_or(serde_json::Map::is_empty),
        format!("records left: {}", file()?),
    )?;
    Ok(())
}

/// Reserves `gpus` GPUs for Docker container `id` through [`DockerGuard`], as every entry point
/// does, and keeps them.
fn reserve(
    iso: &mesos_gpu_isolator::lifecycle::Isolator,
    id: &mesos_gpu_isolator::lifecycle::ContainerId,
    gpus: f64,
) -> std::result::Result<
    Vec<mesos_gpu_node::inventory::Gpu>,
    mesos_gpu_isolator::lifecycle::LifecycleError,
> {
    reserve_started(
        iso,
        id,
        gpus,
        mesos_gpu_isolator::lifecycle::DockerStart::default(),
    )
}

/// [`reserve`], recording `start` (the daemon and the starting process) in the owner.
fn reserve_started(
    iso: &mesos_gpu_isolator::lifecycle::Isolator,
    id: &mesos_gpu_isolator::lifecycle::ContainerId,
    gpus: f64,
    start: mesos_gpu_isolator::lifecycle::DockerStart,
) -> std::result::Result<
    Vec<mesos_gpu_node::inventory::Gpu>,
    mesos_gpu_isolator::lifecycle::LifecycleError,
> {
    mesos_gpu_isolator::lifecycle::DockerGuard::reserve(iso, id, gpus, start)
        .map(mesos_gpu_isolator::lifecycle::DockerGuard::keep)
}

/// Issue 37: the holder a Mesos container is prepared with and the one a Docker reservation is
/// made with are in `status`, in their pool owners and, after a restart, recovered from the
/// checkpoint and published again; a container without one records none.
fn holders_recorded_and_recovered() -> TestResult {
    let node = Node::new("dgx1-v100")?;
    let setup = Setup::new(CgroupVersion::V1)?;
    let pool_dir = setup.work.path().join("pool");
    let config = with_pool(
        &setup.config,
        &setup.work.path().join("agent"),
        &pool_dir,
        PoolRole::Agent,
    );
    let holder = |task: &str| pool::Holder {
        executor_id: Some(format!("{task}-executor")),
        framework_id: Some("fw-1".into()),
        framework_name: None,
        task_id: Some(task.into()),
        task_name: Some(format!("{task} name")),
    };
    let mesos = ContainerId::new("a1b2c3d4-0000-4000-8000-000000000037")?;
    let docker = ContainerId::new("a1b2c3d4-0000-4000-8000-000000000038")?;
    let bare = ContainerId::new("a1b2c3d4-0000-4000-8000-000000000039")?;
    let iso = isolator(config.clone(), &node)?;
    iso.prepare(
        &mesos,
        PrepareConfig {
            gpus: 2.0,
            holder: Some(holder("mesos-task")),
            ..PrepareConfig::default()
        },
    )?;
    iso.prepare(
        &bare,
        PrepareConfig {
            gpus: 1.0,
            ..PrepareConfig::default()
        },
    )?;
    let request = PrepareConfig {
        gpus: 1.0,
        holder: Some(holder("docker-task")),
        ..PrepareConfig::default()
    };
    mesos_gpu_isolator::lifecycle::DockerGuard::reserve_request(
        &iso,
        &docker,
        &request,
        DockerStart::default(),
    )?
    .keep();
    let recorded = || -> TestResult<Vec<(String, Option<pool::Holder>)>> {
        Ok(Pool::at(&pool_dir)
            .read()?
            .reservations
            .into_iter()
            .map(|(id, r)| (id, r.owner.holder().cloned()))
            .collect())
    };
    let want = vec![
        (mesos.to_string(), Some(holder("mesos-task"))),
        (docker.to_string(), Some(holder("docker-task"))),
        (bare.to_string(), None),
    ];
    let sorted = |mut v: Vec<(String, Option<pool::Holder>)>| {
        v.sort();
        v
    };
    check(
        sorted(recorded()?) == sorted(want.clone()),
        format!("pool records {:?}", recorded()?),
    )?;
    let statuses = |iso: &Isolator| -> TestResult<Vec<(String, Option<pool::Holder>)>> {
        [&mesos, &docker, &bare]
            .into_iter()
            .map(|id| Ok((id.to_string(), iso.status(id)?.holder)))
            .collect()
    };
    check(
        sorted(statuses(&iso)?) == sorted(want.clone()),
        format!("statuses {:?}", statuses(&iso)?),
    )?;
    drop(iso);
    // A restart: the holders come back from the checkpoint, and are published again.
    let iso = Isolator::new(config, node.inventory.clone(), node.nodes.clone())?;
    let states: Vec<_> = [&mesos, &bare]
        .into_iter()
        .map(|id| mesos_gpu_isolator::lifecycle::RecoverState {
            id: id.clone(),
            parent: None,
            nested_cgroup: None,
        })
        .collect();
    iso.recover(&states, &[])?;
    check(
        sorted(statuses(&iso)?) == sorted(want.clone()),
        format!("statuses after recovery {:?}", statuses(&iso)?),
    )?;
    check(
        sorted(recorded()?) == sorted(want),
        format!("pool records after recovery {:?}", recorded()?),
    )?;
    iso.cleanup(&mesos)?;
    iso.cleanup(&bare)?;
    iso.release_docker(&docker)?;
    check(
        recorded()?.is_empty(),
        format!("records left: {:?}", recorded()?),
    )
}
