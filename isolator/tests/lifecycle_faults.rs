//! Kill at every step: a child process runs prepare → isolate → update (grow, shrink) →
//! prepare → cleanup with the fault hook installed and is SIGKILLed at fault point *n*, for every
//! *n*; a fresh isolator then recovers, and we check against the kernel (a probe process moved
//! into every cgroup left) that no GPU a live cgroup allows is free or granted to another
//! container, and, after the agent kills and cleans up everything, that no GPU is lost. On v1
//! and v2. Needs root and the cgroup version.
#![allow(clippy::unwrap_used)]

mod lifecycle_common;
#[allow(dead_code)]
mod support;

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, ExitCode, Stdio};

use libtest_mimic::{Arguments, Trial};
use lifecycle_common::{Node, Setup, TestResult, check, trial};
use mesos_gpu_enforce::cgroup::CgroupVersion;
use mesos_gpu_isolator::{
    lifecycle::CgroupChoice, lifecycle::ContainerId, lifecycle::Isolator,
    lifecycle::IsolatorConfig, lifecycle::PrepareConfig, lifecycle::RecoveryIssue,
    lifecycle::fault,
};
use mesos_gpu_node::devices::DeviceNodes;
use mesos_gpu_node::{discovery::Discovery, discovery::GpuDriver};
use mesos_gpu_testkit::{Host, Need, needs};
use support::{ALLOWED, Mode, Probe};

const CHILD_ENV: &str = "MGPU_FAULT_CHILD";

fn main() -> ExitCode {
    if let Some(code) = support::probe_main() {
        return code;
    }
    if std::env::var_os(CHILD_ENV).is_some() {
        return match child_main() {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("fault child: {e}");
                ExitCode::FAILURE
            }
        };
    }
    let host = Host::probe();
    let trials: Vec<Trial> = [
        (CgroupVersion::V1, Need::Cgroup1, "v1"),
        (CgroupVersion::V2, Need::Cgroup2, "v2"),
    ]
    .into_iter()
    .map(|(version, need, tag)| {
        needs(
            &host,
            &[Need::Root, need],
            trial(format!("{tag}_kill_at_every_step"), move || {
                kill_at_every_step(version)
            }),
        )
    })
    .collect();
    libtest_mimic::run(&Arguments::from_args(), trials).exit_code()
}

fn id(s: &str) -> ContainerId {
    ContainerId::new(s).unwrap()
}

/// The containers the child script uses.
const IDS: [&str; 2] = ["fault-a", "fault-b"];

/// Child mode: the lifecycle script, reporting each fault point on stdout and blocking forever
/// at number `MGPU_FAULT_KILL_AT` until the parent SIGKILLs it.
fn child_main() -> TestResult {
    let var = |k: &str| std::env::var(k).map_err(|e| format!("{k}: {e}"));
    let kill_at: u32 = var("MGPU_FAULT_KILL_AT")?.parse()?;
    let inventory = match GpuDriver::open(Some(var("MGPU_FAULT_SIM_LIB")?.as_ref()))? {
        Discovery::Driver(d) => d.inventory().clone(),
        Discovery::NoDriver(_) => return Err("no driver".into()),
    };
    let nodes = DeviceNodes::scan(var("MGPU_FAULT_DEV")?.as_ref(), &inventory)?;
    let mut config = IsolatorConfig::new(var("MGPU_FAULT_WORK")?);
    config.cgroups_root = var("MGPU_FAULT_ROOT")?;
    config.cgroup_version = var("MGPU_FAULT_VERSION")?.parse::<CgroupChoice>()?;
    config.v2_mount = Some(lifecycle_common::v2_mount());
    let hits = std::sync::atomic::AtomicU32::new(0);
    fault::set_hook(move |step| {
        let n = hits.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "HIT {n} {step}");
        if n == kill_at {
            let _ = writeln!(out, "KILLME");
            let _ = out.flush();
            loop {
                std::thread::park();
            }
        }
        let _ = out.flush();
    });
    let iso = Isolator::new(config, inventory, nodes)?;
    iso.recover(&[], &[])?;
    let (a, b) = (id(IDS[0]), id(IDS[1]));
    iso.prepare(
        &a,
        PrepareConfig {
            gpus: 2.0,
            ..Default::default()
        },
    )?;
    let mut sleeper = Command::new("sleep")
        .arg("1000")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    println!("SLEEPER {}", sleeper.id());
    iso.isolate(&a, sleeper.id())?;
    iso.update(&a, 4.0)?;
    iso.update(&a, 1.0)?;
    iso.prepare(
        &b,
        PrepareConfig {
            gpus: 3.0,
            ..Default::default()
        },
    )?;
    sleeper.kill()?;
    sleeper.wait()?;
    iso.cleanup(&a)?;
    iso.cleanup(&b)?;
    println!("DONE");
    Ok(())
}

/// Processes the child started, SIGKILLed on drop (a sleeper the child spawned but had not yet
/// isolated when it was killed is in no cgroup, so the cgroup guard cannot reach it).
#[derive(Default)]
struct Sleepers(Vec<String>);

impl Drop for Sleepers {
    fn drop(&mut self) {
        for pid in &self.0 {
            let _ = Command::new("kill")
                .args(["-9", pid])
                .stderr(Stdio::null())
                .status();
        }
    }
}

/// Runs the child killed at point `kill_at` (0: never); returns the steps it reported.
fn run_child(
    setup: &Setup,
    node: &Node,
    version: CgroupVersion,
    kill_at: u32,
    sleepers: &mut Sleepers,
) -> TestResult<Vec<String>> {
    let mut child = Command::new(std::env::current_exe()?)
        .env(CHILD_ENV, "1")
        .env("MGPU_FAULT_KILL_AT", kill_at.to_string())
        .env("MGPU_FAULT_SIM_LIB", node.sim.lib_path())
        .env("MGPU_FAULT_DEV", node.dev.path())
        .env("MGPU_FAULT_WORK", setup.work.path())
        .env("MGPU_FAULT_ROOT", &setup.config.cgroups_root)
        .env(
            "MGPU_FAULT_VERSION",
            if version == CgroupVersion::V1 {
                "v1"
            } else {
                "v2"
            },
        )
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()?;
    let stdout = BufReader::new(child.stdout.take().ok_or("stdout")?);
    let mut steps = Vec::new();
    let mut ended = false;
    for line in stdout.lines() {
        let line = line?;
        if let Some(rest) = line.strip_prefix("HIT ") {
            steps.push(rest.split_once(' ').map_or(rest, |(_, s)| s).to_owned());
        } else if let Some(pid) = line.strip_prefix("SLEEPER ") {
            sleepers.0.push(pid.to_owned());
        } else if line == "KILLME" {
            child.kill()?; // SIGKILL
            child.wait()?;
            return Ok(steps);
        } else if line == "DONE" {
            ended = true;
        }
    }
    let status = child.wait()?;
    check(
        status.success() && ended && kill_at == 0,
        format!("child ended early ({status}) before point {kill_at}"),
    )?;
    Ok(steps)
}

/// The GPU minors a probe in cgroup `dir` can open (`ENXIO`, i.e. allowed).
fn live_allowed(dir: &std::path::Path, node: &Node) -> TestResult<BTreeSet<u32>> {
    let mut probe = Probe::spawn()?;
    std::fs::write(dir.join("cgroup.procs"), probe.pid().to_string())?;
    let mut allowed = BTreeSet::new();
    for gpu in &node.inventory.gpus {
        if probe.open(&node.gpu_node(gpu.minor), Mode::Read)? == ALLOWED {
            allowed.insert(gpu.minor);
        }
    }
    Ok(allowed)
}

fn kill_at_every_step(version: CgroupVersion) -> TestResult {
    let node = Node::new("dgx1-v100")?;
    let total = {
        let setup = Setup::new(version)?;
        run_child(&setup, &node, version, 0, &mut Sleepers::default())?
    };
    let names: BTreeSet<&str> = total.iter().map(String::as_str).collect();
    for want in [
        "prepare.allocated",
        "prepare.checkpointed",
        "prepare.cgroup_created",
        "isolate.before_move",
        "isolate.moved",
        "update.allocated",
        "update.checkpointed",
        "update.applied",
        "cleanup.cgroup_removed",
        "cleanup.released",
        "cleanup.checkpointed",
        "checkpoint.temp_written",
    ] {
        check(
            names.contains(want),
            format!("step {want} never reached: {names:?}"),
        )?;
    }
    let n = u32::try_from(total.len())?;
    check(n >= 20, format!("only {n} fault points: {total:?}"))?;
    for kill_at in 1..=n {
        let step = &total[kill_at as usize - 1];
        let ctx = |e: Box<dyn std::error::Error + Send + Sync>| {
            format!("killed at point {kill_at} ({step}): {e}")
        };
        let setup = Setup::new(version)?;
        let mut sleepers = Sleepers::default();
        run_child(&setup, &node, version, kill_at, &mut sleepers).map_err(ctx)?;
        after_crash(&setup, &node).map_err(ctx)?;
    }
    Ok(())
}

/// Recovers after the crash and checks both invariants.
fn after_crash(setup: &Setup, node: &Node) -> TestResult {
    let iso = Isolator::new(
        setup.config.clone(),
        node.inventory.clone(),
        node.nodes.clone(),
    )?;
    let orphans: Vec<ContainerId> = IDS.iter().map(|s| id(s)).collect();
    let report = iso.recover(&[], &orphans)?;
    let minor_of = |index: u32| node.inventory.by_index(index).map(|g| g.minor).unwrap();
    // 1. Every GPU a live cgroup allows is held, by that container or by the quarantine.
    let allocations = iso.allocations()?;
    let free: BTreeSet<u32> = allocations.free.iter().map(|&i| minor_of(i)).collect();
    let mut live_claims = BTreeSet::new();
    for dir in setup.guard.children() {
        let allowed = live_allowed(&dir, node)?;
        check(
            allowed.is_disjoint(&free),
            format!(
                "{} allows {allowed:?} but {free:?} are free ({report:?})",
                dir.display()
            ),
        )?;
        live_claims.extend(allowed);
    }
    // No GPU is granted to a new container while a live cgroup allows it.
    let fresh = id("fresh");
    let info = iso.prepare(
        &fresh,
        PrepareConfig {
            gpus: f64::from(u32::try_from(free.len())?),
            ..Default::default()
        },
    )?;
    let granted: BTreeSet<u32> = info.gpus.iter().map(|g| g.minor).collect();
    check(
        granted.is_disjoint(&live_claims),
        format!("granted {granted:?} still allowed elsewhere {live_claims:?}"),
    )?;
    iso.cleanup(&fresh)?;
    // 2. After the agent kills the orphans and cleans them (and anything reported) up, all is free.
    setup.guard.kill_all();
    let mut to_clean: BTreeSet<ContainerId> = orphans.into_iter().collect();
    for issue in &report.issues {
        if let RecoveryIssue::NoCheckpoint { container, .. }
        | RecoveryIssue::Unclaimed { container } = issue
        {
            to_clean.insert(container.clone());
        }
    }
    for c in &to_clean {
        iso.cleanup(c)?;
    }
    let a = iso.allocations()?;
    check(
        a.free.len() == node.inventory.gpus.len() && a.owners.is_empty(),
        format!("GPUs lost: {a:?} ({report:?})"),
    )?;
    check(
        setup.guard.children().is_empty(),
        format!("cgroups left: {:?}", setup.guard.children()),
    )
}
