//! NUMA pinning against the real kernel (issue 18): on the shipped node `numa-2cpu`, whose two
//! GPUs are local to CPU 0 and CPU 1 of this two-CPU machine, a process placed in the container's
//! cgroup reads its `Cpus_allowed_list` from `/proc/self/status` and sees exactly its GPU's CPU;
//! a container asking for more CPUs than its GPUs have is left alone. Needs root and the cgroup
//! version (v1: the `cpuset` hierarchy; v2: the `cpuset` controller on cgroup2).
#![allow(clippy::unwrap_used)]

mod lifecycle_common;

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, ExitCode, Stdio};

use libtest_mimic::Arguments;
use lifecycle_common::{CgroupRoot, Node, Setup, TestResult, check, trial};
use mesos_gpu_enforce::cgroup::CgroupVersion;
use mesos_gpu_isolator::{
    lifecycle::ContainerId, lifecycle::Isolator, lifecycle::PinOutcome, lifecycle::PrepareConfig,
};
use mesos_gpu_node::{discovery::Discovery, discovery::GpuDriver};
use mesos_gpu_node::{numa::Affinities, numa::CpuList};
use mesos_gpu_placement::allocator::Policy;
use mesos_gpu_placement::numa::SkipReason;
use mesos_gpu_testkit::{Host, Need, needs};

fn main() -> ExitCode {
    let host = Host::probe();
    let mut trials = vec![trial(
        "numa_2cpu_affinities_come_from_nvml".to_owned(),
        affinities_come_from_nvml,
    )];
    for (version, need, tag) in [
        (CgroupVersion::V1, Need::Cpuset1, "v1"),
        (CgroupVersion::V2, Need::Cpuset2, "v2"),
    ] {
        let base = match version {
            CgroupVersion::V1 => Need::Cgroup1,
            CgroupVersion::V2 => Need::Cgroup2,
        };
        let mut add = |name: &str, f: fn(CgroupVersion) -> TestResult| {
            let t = trial(format!("{tag}_{name}"), move || f(version));
            trials.push(needs(&host, &[Need::Root, base, need], t));
        };
        add("a_task_gets_exactly_its_gpus_cpu", task_gets_its_gpus_cpu);
        add("two_gpus_get_both_cpus", two_gpus_get_both_cpus);
        add("never_fewer_cpus_than_asked", never_fewer_cpus_than_asked);
    }
    trials.push(needs(
        &host,
        &[Need::Root, Need::Cgroup2],
        trial(
            "v2_without_the_cpuset_controller_the_task_runs_unpinned".to_owned(),
            v2_without_the_controller,
        ),
    ));
    libtest_mimic::run(&Arguments::from_args(), trials).exit_code()
}

fn list(s: &str) -> CpuList {
    s.parse().unwrap()
}

/// The online CPUs of this machine (what an unpinned task is allowed).
fn online_cpus() -> String {
    std::fs::read_to_string("/sys/devices/system/cpu/online")
        .unwrap()
        .trim()
        .to_owned()
}

fn affinities(node: &Node) -> TestResult<Affinities> {
    match GpuDriver::open(Some(&node.sim.lib_path()))? {
        Discovery::Driver(d) => Ok(d.affinities()),
        Discovery::NoDriver(inv) => Err(format!("no driver: {:?}", inv.absent_reason).into()),
    }
}

fn affinities_come_from_nvml() -> TestResult {
    let node = Node::new("numa-2cpu")?;
    let a = affinities(&node)?;
    for (index, cpus) in [(0, "0"), (1, "1")] {
        let gpu = a.get(index).ok_or(format!("no affinity for GPU {index}"))?;
        check(
            gpu.cpus == list(cpus) && gpu.mems == Some(list("0")),
            format!("GPU {index}: {gpu:?}"),
        )?;
    }
    Ok(())
}

/// A pinning isolator on `version` for node `numa-2cpu` (first-fit: the first container gets
/// GPU 0), and the guards removing its cgroups.
struct Pinned {
    node: Node,
    setup: Setup,
    _cpuset: Option<CgroupRoot>,
}

impl Pinned {
    fn new(version: CgroupVersion) -> TestResult<Pinned> {
        let node = Node::new("numa-2cpu")?;
        let mut setup = Setup::new(version)?;
        setup.config.policy = Policy::FirstFit;
        setup.config.pinning.enabled = true;
        setup.config.pinning.affinities = affinities(&node)?;
        let cpuset = (version == CgroupVersion::V1).then(|| CgroupRoot {
            parent: setup
                .config
                .v1_root
                .join("cpuset")
                .join(&setup.config.cgroups_root),
        });
        Ok(Pinned {
            node,
            setup,
            _cpuset: cpuset,
        })
    }

    fn isolator(&self) -> TestResult<Isolator> {
        let isolator = Isolator::new(
            self.setup.config.clone(),
            self.node.inventory.clone(),
            self.node.nodes.clone(),
        )?;
        isolator.recover(&[], &[])?;
        Ok(isolator)
    }
}

/// `n` GPUs and `cpus` CPUs.
fn asking(n: f64, cpus: f64) -> PrepareConfig {
    PrepareConfig {
        gpus: n,
        cpus: Some(cpus),
        ..PrepareConfig::default()
    }
}

/// Starts a process, places it in container `id`'s cgroups, then lets it print its
/// `Cpus_allowed_list` and `Mems_allowed_list` lines, and returns them as (cpus, mems).
fn allowed_in(isolator: &Isolator, id: &ContainerId) -> TestResult<(String, String)> {
    let mut child = Command::new("sh")
        .args([
            "-c",
            "read go; exec grep -E '^(Cpus|Mems)_allowed_list' /proc/self/status",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()?;
    let placed = isolator.isolate(id, child.id());
    let mut stdin = child.stdin.take().ok_or("no stdin")?;
    writeln!(stdin, "go")?;
    drop(stdin);
    let out = child.wait_with_output()?;
    placed?;
    let text = String::from_utf8(out.stdout)?;
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .map(|v| v.trim().to_owned())
            .ok_or(format!("no {name} in {text:?}"))
    };
    Ok((field("Cpus_allowed_list:")?, field("Mems_allowed_list:")?))
}

fn task_gets_its_gpus_cpu(version: CgroupVersion) -> TestResult {
    let pinned = Pinned::new(version)?;
    let isolator = pinned.isolator()?;
    for (n, cpu) in [(0, "0"), (1, "1")] {
        let id = ContainerId::new(format!("pin-{n}"))?;
        let outcome = isolator.prepare(&id, asking(1.0, 1.0))?.pinning;
        let PinOutcome::Pinned(pinning) = &outcome else {
            return Err(format!("container {n}: {outcome:?}").into());
        };
        check(pinning.cpus == list(cpu), format!("pinned to {pinning:?}"))?;
        let (cpus, mems) = allowed_in(&isolator, &id)?;
        println!("container {n} (GPU {n}): Cpus_allowed_list: {cpus}, Mems_allowed_list: {mems}");
        check(
            cpus == cpu,
            format!("Cpus_allowed_list {cpus:?}, expected {cpu:?}"),
        )?;
        check(mems == "0", format!("Mems_allowed_list {mems:?}"))?;
    }
    for n in 0..2 {
        let id = ContainerId::new(format!("pin-{n}"))?;
        let cpuset = isolator.cpuset_path(&id);
        isolator.cleanup(&id)?;
        if version == CgroupVersion::V1 {
            check(
                !cpuset.exists(),
                format!("{} left after cleanup", cpuset.display()),
            )?;
        }
    }
    Ok(())
}

fn two_gpus_get_both_cpus(version: CgroupVersion) -> TestResult {
    let pinned = Pinned::new(version)?;
    let isolator = pinned.isolator()?;
    let id = ContainerId::new("pin-both")?;
    let outcome = isolator.prepare(&id, asking(2.0, 2.0))?.pinning;
    check(
        matches!(&outcome, PinOutcome::Pinned(p) if p.cpus == list("0-1")),
        format!("{outcome:?}"),
    )?;
    let (cpus, _) = allowed_in(&isolator, &id)?;
    check(cpus == "0-1", format!("Cpus_allowed_list {cpus:?}"))?;
    isolator.cleanup(&id)?;
    Ok(())
}

fn never_fewer_cpus_than_asked(version: CgroupVersion) -> TestResult {
    let pinned = Pinned::new(version)?;
    let isolator = pinned.isolator()?;
    let id = ContainerId::new("pin-greedy")?;
    let outcome = isolator.prepare(&id, asking(1.0, 1.5))?.pinning;
    check(
        outcome
            == PinOutcome::Skipped(SkipReason::TooFewCpus {
                cpus: list("0"),
                requested: 1.5,
            }),
        format!("{outcome:?}"),
    )?;
    let cpuset: PathBuf = isolator.cpuset_path(&id);
    if version == CgroupVersion::V1 {
        check(
            !cpuset.exists(),
            format!("{} made for an unpinned container", cpuset.display()),
        )?;
    }
    let (cpus, _) = allowed_in(&isolator, &id)?;
    println!("cpus=1.5 with GPU 0: Cpus_allowed_list: {cpus}");
    check(
        cpus == online_cpus(),
        format!("Cpus_allowed_list {cpus:?}, expected every CPU"),
    )?;
    isolator.cleanup(&id)?;
    Ok(())
}

/// On a host whose cgroup2 has no cpuset controller (this hybrid CI host), pinning says why
/// and the task runs on every CPU.
fn v2_without_the_controller() -> TestResult {
    let pinned = Pinned::new(CgroupVersion::V2)?;
    let controllers =
        std::fs::read_to_string(lifecycle_common::v2_mount().join("cgroup.controllers"))?;
    if controllers.split_whitespace().any(|c| c == "cpuset") {
        // The controller is there: the v2 trials above pin for real; nothing to show here.
        return Ok(());
    }
    let isolator = pinned.isolator()?;
    let id = ContainerId::new("pin-nocontroller")?;
    let outcome = isolator.prepare(&id, asking(1.0, 1.0))?.pinning;
    check(
        matches!(&outcome, PinOutcome::Skipped(SkipReason::NoController { detail }) if detail.contains("no cpuset controller")),
        format!("{outcome:?}"),
    )?;
    let (cpus, _) = allowed_in(&isolator, &id)?;
    check(cpus == online_cpus(), format!("Cpus_allowed_list {cpus:?}"))?;
    isolator.cleanup(&id)?;
    Ok(())
}
