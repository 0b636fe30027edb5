//! Issue 11: the lifecycle on the container cgroups Mesos makes ([`CgroupMaker::Mesos`]),
//! replaying Mesos's sequence against the real kernel, on cgroup v1 and v2, with nvml-sim and
//! mknod'ed nodes (`ENXIO`: allowed, `EPERM`: denied).
//!
//! What Mesos does before and after our calls (Mesos 1.12, `src/slave/containerizer/mesos/`):
//! - v1 with `cgroups/devices`: the devices cgroup `<root>/<id>` is made before our `prepare`,
//!   `a` is denied and the whitelist (plus `--allowed_devices`) allowed
//!   (`isolators/cgroups/subsystems/devices.cpp`), the process is assigned to it by the cgroups
//!   isolator (`isolators/cgroups/cgroups.cpp` 740-806), the launcher kills it at destroy, and the
//!   cgroup is removed after our `cleanup`; a nested container with `share_cgroups=false` gets
//!   `<root>/<parent>/mesos/<child>` made the same way;
//! - v2: `<root>/<id>` and `<root>/<id>/leaf` are made before our `prepare`, no device program
//!   without `cgroups/devices`, and the launcher puts the process in `leaf` at fork
//!   (`linux_launcher.cpp` 626-640); nested containers get `<root>/<id>/mesos/<child>/leaf`.
#![allow(clippy::unwrap_used)]

mod lifecycle_common;
#[allow(dead_code)]
mod support;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use libtest_mimic::{Arguments, Trial};
use lifecycle_common::{Node, Setup, TestResult, check, kill_cgroup, trial};
use mesos_gpu_enforce::{cgroup::CgroupVersion, cgroup::default_whitelist};
use mesos_gpu_isolator::{
    lifecycle::CgroupMaker, lifecycle::ContainerId, lifecycle::Isolator, lifecycle::LifecycleError,
    lifecycle::PrepareConfig, lifecycle::RecoverState, lifecycle::RecoveryIssue,
};
use mesos_gpu_placement::allocator::Policy;
use mesos_gpu_testkit::{Host, Need, needs};
use support::{ALLOWED, DENIED, Mode, Probe};

fn main() -> ExitCode {
    if let Some(code) = support::probe_main() {
        return code;
    }
    let host = Host::probe();
    let v1 = [Need::Root, Need::Cgroup1];
    let v2 = [Need::Root, Need::Cgroup2];
    let trials: Vec<Trial> = vec![
        needs(
            &host,
            &v1,
            trial(
                "v1_rules_added_to_mesos_cgroup".into(),
                v1_rules_added_to_mesos_cgroup,
            ),
        ),
        needs(
            &host,
            &v1,
            trial(
                "v1_gpus_0_leaves_mesos_cgroup_untouched".into(),
                v1_gpus_0_untouched,
            ),
        ),
        needs(
            &host,
            &v1,
            trial(
                "v1_missing_or_open_mesos_cgroup_refused".into(),
                v1_missing_or_open_refused,
            ),
        ),
        needs(
            &host,
            &v1,
            trial(
                "v1_nested_container_with_own_cgroup".into(),
                v1_nested_own_cgroup,
            ),
        ),
        needs(
            &host,
            &v1,
            trial("v1_recovery_in_mesos_cgroups".into(), || {
                recovery(CgroupVersion::V1)
            }),
        ),
        needs(
            &host,
            &v2,
            trial(
                "v2_program_on_mesos_cgroup_process_stays_in_leaf".into(),
                v2_program_on_mesos_cgroup,
            ),
        ),
        needs(
            &host,
            &v2,
            trial("v2_gpus_0_denied_every_gpu".into(), v2_gpus_0_denied),
        ),
        needs(
            &host,
            &v2,
            trial("v2_recovery_in_mesos_cgroups".into(), || {
                recovery(CgroupVersion::V2)
            }),
        ),
    ];
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

/// A setup whose container cgroups Mesos makes, with first-fit (predictable GPUs).
fn mesos_setup(version: CgroupVersion) -> TestResult<Setup> {
    let mut setup = Setup::new(version)?;
    setup.config.cgroup_maker = CgroupMaker::Mesos;
    setup.config.policy = Policy::FirstFit;
    Ok(setup)
}

fn isolator(setup: &Setup, node: &Node) -> TestResult<Isolator> {
    let iso = Isolator::new(
        setup.config.clone(),
        node.inventory.clone(),
        node.nodes.clone(),
    )?;
    iso.recover(&[], &[])?;
    Ok(iso)
}

/// An entry Mesos's `--allowed_devices` could add (`/dev/kmsg`), which the module must keep.
const AGENT_EXTRA: &str = "c 1:11 rwm";

/// Makes the v1 devices cgroup `<parent>/<relative>` as Mesos's `cgroups/devices` does: deny
/// all, then its default whitelist and an `--allowed_devices` entry.
fn mesos_v1_cgroup(setup: &Setup, relative: &str) -> TestResult<PathBuf> {
    let dir = setup.guard.parent.join(relative);
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join("devices.deny"), "a")?;
    for rule in default_whitelist()
        .iter()
        .map(ToString::to_string)
        .chain([AGENT_EXTRA.to_owned()])
    {
        std::fs::write(dir.join("devices.allow"), &rule)?;
    }
    Ok(dir)
}

/// Makes the v2 cgroup `<parent>/<relative>` and its `leaf`, as Mesos's cgroups isolator does.
fn mesos_v2_cgroup(setup: &Setup, relative: &str) -> TestResult<PathBuf> {
    let dir = setup.guard.parent.join(relative);
    std::fs::create_dir_all(dir.join("leaf"))?;
    Ok(dir)
}

/// A probe placed in `cgroup` as Mesos's launcher or cgroups isolator places the container.
fn probe_in(cgroup: &Path) -> TestResult<Probe> {
    let probe = Probe::spawn()?;
    std::fs::write(cgroup.join("cgroup.procs"), probe.pid().to_string())?;
    Ok(probe)
}

/// The probe's cgroup in the devices hierarchy (v1) or cgroup2 (v2), as `/proc` shows it.
fn cgroup_of(pid: u32, version: CgroupVersion) -> TestResult<String> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup"))?;
    let line = text
        .lines()
        .find(|l| match version {
            CgroupVersion::V1 => l
                .split(':')
                .nth(1)
                .is_some_and(|c| c.split(',').any(|c| c == "devices")),
            CgroupVersion::V2 => l.starts_with("0::"),
        })
        .ok_or("no such line in /proc/<pid>/cgroup")?;
    Ok(line.rsplit(':').next().unwrap_or("").to_owned())
}

/// Checks that `probe` opens exactly the GPUs `minors`, and the control devices when there are
/// any GPUs.
fn expect(probe: &mut Probe, node: &Node, minors: &[u32]) -> TestResult {
    let mut wrong = Vec::new();
    for gpu in &node.inventory.gpus {
        let want = if minors.contains(&gpu.minor) {
            ALLOWED
        } else {
            DENIED
        };
        let got = probe.open(&node.gpu_node(gpu.minor), Mode::Read)?;
        if got != want {
            wrong.push(format!("nvidia{}: {got}, expected {want}", gpu.minor));
        }
    }
    let control = if minors.is_empty() { DENIED } else { ALLOWED };
    for ctl in ["nvidiactl", "nvidia-uvm"] {
        let got = probe.open(&node.dev.path().join(ctl), Mode::Write)?;
        if got != control {
            wrong.push(format!("{ctl}: {got}, expected {control}"));
        }
    }
    check(wrong.is_empty(), wrong.join("; "))
}

fn held(iso: &Isolator, c: &ContainerId) -> TestResult<Vec<u32>> {
    Ok(iso.usage(c)?.gpus.iter().map(|g| g.minor).collect())
}

fn devices_list(dir: &Path) -> TestResult<Vec<String>> {
    let text = std::fs::read_to_string(dir.join("devices.list"))?;
    let mut lines: Vec<String> = text.lines().map(str::to_owned).collect();
    lines.sort();
    Ok(lines)
}

fn all_free(iso: &Isolator, node: &Node) -> TestResult {
    let a = iso.allocations()?;
    check(
        a.free.len() == node.inventory.gpus.len()
            && a.owners.is_empty()
            && a.quarantined.is_empty(),
        format!("not all free: {a:?}"),
    )
}

/// v1: prepare adds the control devices and the GPUs to Mesos's cgroup, isolate moves nothing,
/// update grows and shrinks only our entries, status and usage name Mesos's cgroup, cleanup
/// revokes our entries and leaves the cgroup (and Mesos's entries) to Mesos.
fn v1_rules_added_to_mesos_cgroup() -> TestResult {
    let node = Node::new("dgx1-v100")?;
    let setup = mesos_setup(CgroupVersion::V1)?;
    let iso = isolator(&setup, &node)?;
    let c = id("c1");
    let dir = mesos_v1_cgroup(&setup, "c1")?;
    let before = devices_list(&dir)?;
    let mut probe = probe_in(&dir)?;
    let info = iso.prepare(&c, gpus(2.0))?;
    check(
        info.cgroup.as_deref() == Some(dir.as_path()),
        format!("launch info names Mesos's cgroup: {:?}", info.cgroup),
    )?;
    expect(&mut probe, &node, &[0, 1])?;
    iso.isolate(&c, probe.pid())?;
    check(
        cgroup_of(probe.pid(), CgroupVersion::V1)?
            .ends_with(&format!("{}/c1", setup.config.cgroups_root)),
        "isolate does not move the process",
    )?;
    check(
        devices_list(&dir)?.contains(&AGENT_EXTRA.to_owned()),
        "Mesos's entries stay",
    )?;

    iso.update(&c, 3.0)?;
    expect(&mut probe, &node, &[0, 1, 2])?;
    iso.update(&c, 1.0)?;
    let one = held(&iso, &c)?;
    check(one.len() == 1, format!("usage names the GPU held: {one:?}"))?;
    expect(&mut probe, &node, &one)?;
    let status = iso.status(&c)?;
    check(
        status.cgroup.as_deref() == Some(dir.as_path()),
        format!("status: {status:?}"),
    )?;

    // Mesos's launcher kills the container before the isolators' cleanup.
    drop(probe);
    kill_cgroup(&dir);
    iso.cleanup(&c)?;
    check(dir.is_dir(), "Mesos removes its cgroup, not the module")?;
    check(
        devices_list(&dir)? == before,
        format!(
            "our entries revoked, Mesos's kept: {:?}",
            devices_list(&dir)?
        ),
    )?;
    all_free(&iso, &node)
}

/// v1: a container that asked for no GPU gets nothing beyond isolation: Mesos's cgroup is not
/// written, there is no launch info; growing it later grants the GPUs and the control devices.
fn v1_gpus_0_untouched() -> TestResult {
    let node = Node::new("dgx1-v100")?;
    let setup = mesos_setup(CgroupVersion::V1)?;
    let iso = isolator(&setup, &node)?;
    let c = id("zero");
    let dir = mesos_v1_cgroup(&setup, "zero")?;
    let before = devices_list(&dir)?;
    let mut probe = probe_in(&dir)?;
    let info = iso.prepare(&c, gpus(0.0))?;
    check(
        !info.needs_launch_info(),
        format!("no launch info for gpus:0: {info:?}"),
    )?;
    check(devices_list(&dir)? == before, "Mesos's cgroup untouched")?;
    expect(&mut probe, &node, &[])?;
    iso.update(&c, 2.0)?;
    expect(&mut probe, &node, &[0, 1])?;
    iso.update(&c, 0.0)?;
    check(devices_list(&dir)? == before, "back to Mesos's list")?;
    drop(probe);
    kill_cgroup(&dir);
    iso.cleanup(&c)?;
    all_free(&iso, &node)
}

/// v1: no cgroup from Mesos, or one that allows every device, refuses `prepare` with the remedy
/// and books nothing.
fn v1_missing_or_open_refused() -> TestResult {
    let node = Node::new("dgx1-v100")?;
    let setup = mesos_setup(CgroupVersion::V1)?;
    let iso = isolator(&setup, &node)?;
    let err = iso.prepare(&id("none"), gpus(1.0)).unwrap_err();
    check(
        matches!(err, LifecycleError::NoMesosCgroup { .. }),
        format!("{err}"),
    )?;
    check(
        err.to_string()
            .contains("`cgroups/devices` in the agent's --isolation"),
        format!("{err}"),
    )?;
    std::fs::create_dir_all(setup.guard.parent.join("open"))?;
    let err = iso.prepare(&id("open"), gpus(1.0)).unwrap_err();
    check(
        matches!(err, LifecycleError::MesosCgroupAllowsAll { .. }),
        format!("{err}"),
    )?;
    check(!iso.cgroup_path(&id("none")).exists(), "nothing made")?;
    all_free(&iso, &node)
}

/// v1: a nested container with a devices cgroup of its own (`share_cgroups=false`) gets its
/// parent's GPUs there, follows the parent's updates, and loses them at its cleanup.
fn v1_nested_own_cgroup() -> TestResult {
    let node = Node::new("dgx1-v100")?;
    let setup = mesos_setup(CgroupVersion::V1)?;
    let iso = isolator(&setup, &node)?;
    let (p, n) = (id("p"), id("p.n"));
    let pdir = mesos_v1_cgroup(&setup, "p")?;
    iso.prepare(&p, gpus(2.0))?;
    // Mesos makes the nested container's cgroup (and `p/mesos`) when preparing it, after p's.
    let ndir = mesos_v1_cgroup(&setup, "p/mesos/n")?;
    let nested = PrepareConfig {
        parent: Some(p.clone()),
        nested_cgroup: Some("p/mesos/n".into()),
        ..Default::default()
    };
    let info = iso.prepare(&n, nested)?;
    check(
        info.cgroup.as_deref() == Some(ndir.as_path()),
        format!("{:?}", info.cgroup),
    )?;
    let mut probe = probe_in(&ndir)?;
    expect(&mut probe, &node, &[0, 1])?;
    iso.update(&p, 3.0)?;
    expect(&mut probe, &node, &[0, 1, 2])?;
    iso.update(&p, 1.0)?;
    expect(&mut probe, &node, &held(&iso, &p)?)?;
    check(
        held(&iso, &n)? == held(&iso, &p)?,
        "the nested container reports its parent's GPUs",
    )?;
    drop(probe);
    kill_cgroup(&ndir);
    iso.cleanup(&n)?;
    check(
        !devices_list(&ndir)?.iter().any(|r| r.starts_with("c 195:")),
        "nested revoked",
    )?;
    kill_cgroup(&pdir);
    iso.cleanup(&p)?;
    all_free(&iso, &node)
}

/// After an agent restart: the running container keeps its GPUs (its rules or program still in
/// force), Mesos's containers without GPUs and Mesos's own cgroups are left alone, a cgroup
/// granting GPUs with no checkpoint entry is quarantined, and nothing is double-booked.
fn recovery(version: CgroupVersion) -> TestResult {
    let node = Node::new("dgx1-v100")?;
    let setup = mesos_setup(version)?;
    let make = |relative: &str| match version {
        CgroupVersion::V1 => mesos_v1_cgroup(&setup, relative),
        CgroupVersion::V2 => mesos_v2_cgroup(&setup, relative),
    };
    let leaf = |dir: &Path| match version {
        CgroupVersion::V1 => dir.to_owned(),
        CgroupVersion::V2 => dir.join("leaf"),
    };
    let (run, plain, orphan) = (id("run"), id("plain"), id("orphan"));
    let run_dir = make("run")?;
    let plain_dir = make("plain")?;
    make("orphan")?;
    // Mesos's own cgroups under the root: the agent's (v2 `agent/leaf`, v1 `slave`).
    make("agent")?;
    make("slave")?;
    let mut probe = probe_in(&leaf(&run_dir))?;
    let plain_probe = probe_in(&leaf(&plain_dir))?;
    {
        let iso = isolator(&setup, &node)?;
        iso.prepare(&run, gpus(3.0))?;
        iso.prepare(&plain, gpus(0.0))?;
        iso.prepare(&orphan, gpus(1.0))?;
        expect(&mut probe, &node, &[0, 1, 2])?;
    }
    // The agent restarts: the isolator is made again and recovers.
    let iso = Isolator::new(
        setup.config.clone(),
        node.inventory.clone(),
        node.nodes.clone(),
    )?;
    let states = [&run, &plain].map(|c| RecoverState {
        id: c.clone(),
        parent: None,
        nested_cgroup: None,
    });
    let report = iso.recover(&states, std::slice::from_ref(&orphan))?;
    check(report.is_clean(), format!("clean recovery: {report:?}"))?;
    check(report.orphans == [orphan.clone()], format!("{report:?}"))?;
    check(
        held(&iso, &run)? == [0, 1, 2],
        "the running container keeps its GPUs",
    )?;
    check(
        held(&iso, &orphan)? == [3],
        "the orphan keeps its GPU until its cleanup",
    )?;
    expect(&mut probe, &node, &[0, 1, 2])?;
    check(
        iso.allocations()?.free.len() == 4,
        format!("{:?}", iso.allocations()?),
    )?;
    let other = iso.prepare(&id("other"), gpus(4.0));
    check(
        matches!(other, Err(LifecycleError::NoMesosCgroup { .. })),
        "no cgroup from Mesos for an unknown container",
    )?;
    make("next")?;
    let next = iso.prepare(&id("next"), gpus(4.0))?;
    let minors: Vec<u32> = next.gpus.iter().map(|g| g.minor).collect();
    check(
        minors == [4, 5, 6, 7],
        format!("exactly the free GPUs: {minors:?}"),
    )?;
    // Mesos destroys the orphan: its GPU comes back.
    iso.cleanup(&orphan)?;
    check(
        iso.allocations()?.free == [3],
        format!("{:?}", iso.allocations()?),
    )?;
    drop((probe, plain_probe));
    for dir in [&run_dir, &plain_dir] {
        kill_cgroup(&leaf(dir));
    }
    for c in [&run, &plain, &id("next")] {
        iso.cleanup(c)?;
    }
    all_free(&iso, &node)?;

    if version == CgroupVersion::V1 {
        // A cgroup granting a GPU that no checkpoint explains is quarantined until its cleanup.
        let lost = make("lost")?;
        std::fs::write(lost.join("devices.allow"), "c 195:4 rw")?;
        drop(iso);
        let iso2 = Isolator::new(
            setup.config.clone(),
            node.inventory.clone(),
            node.nodes.clone(),
        )?;
        let report = iso2.recover(&[], &[])?;
        check(
            report.issues.iter().any(|i| matches!(i, RecoveryIssue::NoCheckpoint { container, quarantined } if container.as_str() == "lost" && quarantined == &[4])),
            format!("{report:?}"),
        )?;
        check(
            report.issues.len() == 1,
            format!("only the unexplained GPU cgroup: {report:?}"),
        )?;
        iso2.cleanup(&id("lost"))?;
        all_free(&iso2, &node)?;
    }
    Ok(())
}

/// v2: the program goes on Mesos's `<root>/<id>`, the process stays in Mesos's `leaf`, a nested
/// container below is ruled by it too, updates swap it, cleanup detaches it and leaves the
/// cgroup to Mesos.
fn v2_program_on_mesos_cgroup() -> TestResult {
    let node = Node::new("dgx1-v100")?;
    let setup = mesos_setup(CgroupVersion::V2)?;
    let iso = isolator(&setup, &node)?;
    let c = id("c2");
    let dir = mesos_v2_cgroup(&setup, "c2")?;
    let mut probe = probe_in(&dir.join("leaf"))?;
    let info = iso.prepare(&c, gpus(2.0))?;
    check(
        info.cgroup.as_deref() == Some(dir.as_path()),
        format!("{:?}", info.cgroup),
    )?;
    expect(&mut probe, &node, &[0, 1])?;
    iso.isolate(&c, probe.pid())?;
    let leaf = format!("/{}/c2/leaf", setup.config.cgroups_root);
    check(
        cgroup_of(probe.pid(), CgroupVersion::V2)?.ends_with(&leaf),
        "the process stays in Mesos's leaf",
    )?;

    let nested_dir = mesos_v2_cgroup(&setup, "c2/mesos/n")?;
    let n = id("c2.n");
    iso.prepare(
        &n,
        PrepareConfig {
            parent: Some(c.clone()),
            nested_cgroup: Some("c2/mesos/n".into()),
            ..Default::default()
        },
    )?;
    let mut nested_probe = probe_in(&nested_dir.join("leaf"))?;
    expect(&mut nested_probe, &node, &[0, 1])?;

    iso.update(&c, 3.0)?;
    expect(&mut probe, &node, &[0, 1, 2])?;
    expect(&mut nested_probe, &node, &[0, 1, 2])?;
    iso.update(&c, 1.0)?;
    expect(&mut probe, &node, &held(&iso, &c)?)?;
    check(
        iso.status(&c)?.cgroup.as_deref() == Some(dir.as_path()),
        "status names Mesos's cgroup",
    )?;

    drop((probe, nested_probe));
    kill_cgroup(&nested_dir.join("leaf"));
    kill_cgroup(&dir.join("leaf"));
    iso.cleanup(&n)?;
    iso.cleanup(&c)?;
    check(dir.is_dir(), "the cgroup is Mesos's to remove")?;
    let mut after = probe_in(&dir.join("leaf"))?;
    check(
        after.open(&node.gpu_node(5), Mode::Read)? == ALLOWED,
        "our program is detached",
    )?;
    drop(after);
    kill_cgroup(&dir.join("leaf"));
    all_free(&iso, &node)
}

/// v2 without Mesos's device controller: a `gpus:0` container is denied every GPU and control
/// device by the module's program (Mesos's default whitelist only), with no launch info.
fn v2_gpus_0_denied() -> TestResult {
    let node = Node::new("dgx1-v100")?;
    let setup = mesos_setup(CgroupVersion::V2)?;
    let iso = isolator(&setup, &node)?;
    let c = id("zero");
    let dir = mesos_v2_cgroup(&setup, "zero")?;
    let mut probe = probe_in(&dir.join("leaf"))?;
    check(
        probe.open(&node.gpu_node(3), Mode::Read)? == ALLOWED,
        "no program before prepare",
    )?;
    let info = iso.prepare(&c, gpus(0.0))?;
    check(!info.needs_launch_info(), "no launch info")?;
    expect(&mut probe, &node, &[])?;
    check(
        probe.open(Path::new("/dev/null"), Mode::Write)? == support::Outcome::Ok,
        "Mesos's whitelist (/dev/null) stays allowed",
    )?;
    drop(probe);
    kill_cgroup(&dir.join("leaf"));
    iso.cleanup(&c)?;
    all_free(&iso, &node)
}
