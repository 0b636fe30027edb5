//! Issue 13: the node's one GPU pool, on real cgroups (v1 and v2) and a simulated DGX-1.
//!
//! - a stray container cgroup (with a process, granting every GPU) that this pool did not
//!   record never quarantines GPUs of a `docker-args`-like isolator, nor of an agent when
//!   another holder of the pool records it;
//! - the agent's module and an `exec` on one pool get disjoint GPUs, a shortage is refused with
//!   the pool's counts, and what one releases the other can take.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod lifecycle_common;

use std::path::Path;
use std::process::{Child, Command, ExitCode};

use libtest_mimic::{Arguments, Trial};
use lifecycle_common::{Node, Setup, TestResult, check, trial};
use mesos_gpu_isolator::cgroup::CgroupVersion;
use mesos_gpu_isolator::lifecycle::{
    ContainerId, Isolator, IsolatorConfig, PoolConfig, PoolRole, PrepareConfig,
};
use mesos_gpu_isolator::pool::Pool;
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
            "issue_13_a_stray_cgroup_never_quarantines_another_pools_gpus",
            stray_cgroup,
        );
        add(
            "issue_13_module_and_exec_get_disjoint_gpus_from_one_pool",
            module_and_exec,
        );
    }
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
        let gpus = docker.reserve_docker(&ContainerId::new("d1")?, 8.0)?;
        check(gpus.len() == 8, format!("got {} GPUs", gpus.len()))?;
        docker.release_docker(&ContainerId::new("d1")?)?;
        // The agent adopts an unrecorded cgroup, but not one another holder records.
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
            format!("the agent quarantined for another holder's cgroup: {claimants:?}"),
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
