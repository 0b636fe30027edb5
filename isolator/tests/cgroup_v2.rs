//! cgroups v2 device isolation (eBPF) against the real kernel: a child process in the container's
//! cgroup2 directory (and only there: it stays in the permissive v1 root) reaches exactly the
//! devices allowed; replacing the program is atomic and visible to running processes; detach
//! restores access; destroy refuses while processes remain. Needs root and a cgroup2 mount.

mod support;

use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use libtest_mimic::Arguments;
use mesos_gpu_enforce::{
    cgroup::Access, cgroup::CgroupError, cgroup::CgroupLayout, cgroup::CgroupVersion,
    cgroup::DeviceCgroup, cgroup::DeviceRule, cgroup::Hierarchy, cgroup::V2DeviceCgroup,
    cgroup::default_whitelist, cgroup::normalize, cgroup::parse_list,
};
use mesos_gpu_node::{inventory::DevNum, inventory::NVIDIA_GPU_MAJOR};
use mesos_gpu_os::container_id::ContainerId;
use mesos_gpu_testkit::{Host, Need, cgroup2_root, needs, unique_name};
use support::{ALLOWED, Cleanup, DENIED, Mode, Nodes, Outcome, Probe, TestResult, check};

fn main() -> ExitCode {
    if let Some(code) = support::probe_main() {
        return code;
    }
    let host = Host::probe();
    let trial = |name, f| needs(&host, &[Need::Root, Need::Cgroup2], support::trial(name, f));
    let trials = vec![
        trial(
            "v2_child_reaches_exactly_its_gpus",
            child_reaches_exactly_its_gpus,
        ),
        trial(
            "v2_replace_is_atomic_and_visible",
            replace_is_atomic_and_visible,
        ),
        trial("v2_detach_restores_access", detach_restores_access),
        trial(
            "v2_destroy_refuses_while_processes_remain",
            destroy_refuses_while_processes_remain,
        ),
        trial(
            "v2_recover_applies_the_checkpoint",
            recover_applies_the_checkpoint,
        ),
    ];
    libtest_mimic::run(&Arguments::from_args(), trials).exit_code()
}

/// A layout under a unique parent in the cgroup2 mount, and a guard that removes it.
fn setup(container: &str) -> TestResult<(CgroupLayout, ContainerId, Cleanup)> {
    let mount = cgroup2_root().ok_or("no cgroup2 mount")?;
    let layout = CgroupLayout::new(
        Hierarchy {
            version: CgroupVersion::V2,
            mount,
        },
        unique_name("v2"),
    )?;
    let id = ContainerId::new(container)?;
    let cleanup = Cleanup::new(vec![layout.parent_dir(), layout.container_dir(&id)]);
    Ok((layout, id, cleanup))
}

fn gpu(minor: u32, access: Access) -> DeviceRule {
    DeviceRule::char_device(
        DevNum {
            major: NVIDIA_GPU_MAJOR,
            minor,
        },
        access,
    )
}

/// Mesos's base list plus `nvidiactl`, and the GPUs in `more`.
fn list(more: &[DeviceRule]) -> Vec<DeviceRule> {
    let mut rules = default_whitelist();
    rules.push(gpu(255, Access::RWM));
    rules.extend_from_slice(more);
    rules
}

fn v2(cgroup: &mut DeviceCgroup) -> TestResult<&mut V2DeviceCgroup> {
    match cgroup {
        DeviceCgroup::V2(v2) => Ok(v2),
        DeviceCgroup::V1(_) => Err("expected a v2 cgroup".into()),
    }
}

fn child_reaches_exactly_its_gpus() -> TestResult {
    let (layout, id, _cleanup) = setup("exact")?;
    let nodes = Nodes::nvidia()?;
    let direct = std::fs::File::open(nodes.path("nvidia0")).map_err(|e| e.raw_os_error());
    check(
        matches!(direct, Err(Some(libc::ENXIO))),
        format!("nvidia0 from the test process: {direct:?}"),
    )?;

    let mut cgroup = DeviceCgroup::create(&layout, &id, &list(&[]))?;
    check(cgroup.version() == CgroupVersion::V2, "v2")?;
    let full = list(&[gpu(1, Access::RW), gpu(3, Access::RW)]);
    cgroup.set_allowed(&full)?;
    check(
        cgroup.allowed()? == normalize(&full),
        "allowed() is the list set",
    )?;
    check(
        v2(&mut cgroup)?.attached_program()?.is_some(),
        "a program is attached",
    )?;

    let mut probe = Probe::spawn()?;
    cgroup.add_process(probe.pid())?;
    check(
        cgroup.processes()? == [probe.pid()],
        "the probe is in the cgroup",
    )?;
    probe.expect(
        &nodes,
        &[
            ("nvidia1", Mode::Read, ALLOWED),
            ("nvidia1", Mode::Write, ALLOWED),
            ("nvidia3", Mode::Read, ALLOWED),
            ("nvidiactl", Mode::Write, ALLOWED),
            ("nvidia0", Mode::Read, DENIED),
            ("nvidia0", Mode::Write, DENIED),
            ("nvidia2", Mode::Read, DENIED),
            ("loop0", Mode::Read, DENIED),
            ("null", Mode::Write, Outcome::Ok),
        ],
    )?;
    drop(probe);
    cgroup.destroy()?;
    check(!layout.container_dir(&id).exists(), "cgroup removed")
}

fn replace_is_atomic_and_visible() -> TestResult {
    let (layout, id, _cleanup) = setup("replace")?;
    let nodes = Arc::new(Nodes::nvidia()?);
    // Both lists allow GPU 1 and deny GPU 2; they differ in GPU 0 versus GPU 3.
    let a = list(&[gpu(1, Access::RW), gpu(0, Access::RW)]);
    let b = list(&[gpu(1, Access::RW), gpu(3, Access::RW)]);
    let mut cgroup = DeviceCgroup::create(&layout, &id, &a)?;
    let mut probe = Probe::spawn()?;
    cgroup.add_process(probe.pid())?;
    probe.expect(
        &nodes,
        &[
            ("nvidia0", Mode::Read, ALLOWED),
            ("nvidia3", Mode::Read, DENIED),
        ],
    )?;

    // While a thread keeps opening GPU 1 and GPU 2, swap the program many times: a moment with
    // no program (GPU 2 opens) or with both (GPU 1 or 3 fails) would show up as a wrong answer.
    let stop = Arc::new(AtomicBool::new(false));
    let watched = Arc::new(AtomicUsize::new(0));
    let watcher = {
        let (stop, nodes, watched) = (Arc::clone(&stop), Arc::clone(&nodes), Arc::clone(&watched));
        std::thread::spawn(move || -> Result<(Probe, usize), String> {
            let mut rounds = 0;
            while !stop.load(Ordering::Relaxed) {
                probe
                    .expect(
                        &nodes,
                        &[
                            ("nvidia1", Mode::Read, ALLOWED),
                            ("nvidia2", Mode::Read, DENIED),
                        ],
                    )
                    .map_err(|f| format!("during replacement, round {rounds}: {f}"))?;
                rounds += 1;
                watched.store(rounds, Ordering::Relaxed);
            }
            Ok((probe, rounds))
        })
    };
    let mut ids = vec![
        v2(&mut cgroup)?
            .attached_program()?
            .ok_or("no program attached")?,
    ];
    // At least 40 swaps, and on until the watcher has checked a few times (a cached program
    // swaps in faster than the watcher's first round), in pairs: the last list set is `a`.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let mut swaps = 0;
    while swaps < 40
        || (watched.load(Ordering::Relaxed) < 3 && std::time::Instant::now() < deadline)
    {
        for list in [&b, &a] {
            cgroup.set_allowed(list)?;
            // `attached_program` fails when more than one of ours is attached.
            ids.push(
                v2(&mut cgroup)?
                    .attached_program()?
                    .ok_or("no program attached")?,
            );
        }
        swaps += 2;
    }
    stop.store(true, Ordering::Relaxed);
    let (mut probe, rounds) = watcher.join().map_err(|_| "watcher panicked")??;
    check(rounds > 0, "the watcher ran")?;
    check(
        ids.windows(2).all(|w| w[0] != w[1]),
        format!("every replace attaches another program: {ids:?}"),
    )?;

    // The last list set was `a`; switch to `b` and see it in the running process.
    check(
        cgroup.allowed()? == normalize(&a),
        "allowed() is the last list",
    )?;
    cgroup.set_allowed(&b)?;
    probe.expect(
        &nodes,
        &[
            ("nvidia0", Mode::Read, DENIED),
            ("nvidia3", Mode::Read, ALLOWED),
        ],
    )?;
    // Shrink to nothing but the base list.
    cgroup.set_allowed(&list(&[]))?;
    probe.expect(
        &nodes,
        &[
            ("nvidia1", Mode::Read, DENIED),
            ("nvidia3", Mode::Write, DENIED),
        ],
    )?;
    drop(probe);
    cgroup.destroy()?;
    Ok(())
}

fn detach_restores_access() -> TestResult {
    let (layout, id, _cleanup) = setup("detach")?;
    let nodes = Nodes::nvidia()?;
    // Without `c *:* m`, mknod is governed by the GPU entries too.
    let base = parse_list("c 1:3 rwm\nc 195:255 rwm\n")?;
    let mut cgroup = DeviceCgroup::create(&layout, &id, &base)?;
    let mut probe = Probe::spawn()?;
    cgroup.add_process(probe.pid())?;
    probe.expect(
        &nodes,
        &[
            ("nvidia0", Mode::Read, DENIED),
            ("nvidiactl", Mode::Read, ALLOWED),
        ],
    )?;
    check(
        probe.mknod(&nodes.path("made0"), 'c', 195, 0)? == DENIED,
        "mknod denied",
    )?;

    let old = v2(&mut cgroup)?.attached_program()?;
    let detached = v2(&mut cgroup)?.detach()?;
    check(
        detached.len() == 1 && Some(detached[0]) == old,
        format!("detached {detached:?}, attached was {old:?}"),
    )?;
    check(
        v2(&mut cgroup)?.attached_program()?.is_none(),
        "nothing attached",
    )?;
    check(
        cgroup.allowed()? == [DeviceRule::all(Access::RWM)],
        "allowed() after detach",
    )?;
    probe.expect(
        &nodes,
        &[
            ("nvidia0", Mode::Read, ALLOWED),
            ("nvidia2", Mode::Write, ALLOWED),
        ],
    )?;
    check(
        probe.mknod(&nodes.path("made1"), 'c', 195, 1)? == Outcome::Ok,
        "mknod after detach",
    )?;

    // Setting a list again attaches a fresh program.
    cgroup.set_allowed(&base)?;
    probe.expect(&nodes, &[("nvidia0", Mode::Read, DENIED)])?;
    drop(probe);
    cgroup.destroy()?;
    Ok(())
}

fn destroy_refuses_while_processes_remain() -> TestResult {
    let (layout, id, _cleanup) = setup("busy")?;
    let nodes = Nodes::nvidia()?;
    let mut cgroup = DeviceCgroup::create(&layout, &id, &list(&[]))?;
    let mut probe = Probe::spawn()?;
    cgroup.add_process(probe.pid())?;
    let before = v2(&mut cgroup)?.attached_program()?;
    let err = cgroup.destroy().expect_err("a process remains");
    check(
        matches!(&err, CgroupError::Busy { pids, .. } if pids == &[probe.pid()]),
        format!("busy error: {err:?}"),
    )?;
    check(DeviceCgroup::exists(&layout, &id), "cgroup still there")?;
    check(
        v2(&mut cgroup)?.attached_program()? == before,
        "program still attached",
    )?;
    probe.expect(&nodes, &[("nvidia0", Mode::Read, DENIED)])?;
    drop(probe);
    cgroup.destroy()?;
    check(!DeviceCgroup::exists(&layout, &id), "cgroup removed")?;
    cgroup.destroy()?; // already gone: fine
    Ok(())
}

fn recover_applies_the_checkpoint() -> TestResult {
    let (layout, id, _cleanup) = setup("recover")?;
    let nodes = Nodes::nvidia()?;
    let first = list(&[gpu(0, Access::RW)]);
    let mut cgroup = DeviceCgroup::create(&layout, &id, &first)?;
    let old = v2(&mut cgroup)?.attached_program()?.ok_or("no program")?;
    let mut probe = Probe::spawn()?;
    cgroup.add_process(probe.pid())?;

    let err = DeviceCgroup::recover(&layout, &id, None).expect_err("v2 needs the checkpoint");
    check(
        matches!(err, CgroupError::MissingCheckpoint { .. }),
        format!("{err:?}"),
    )?;

    // The agent "restarts" with a checkpoint saying GPU 2: the kernel must enforce exactly that.
    let checkpoint = list(&[gpu(2, Access::RW)]);
    let mut recovered = DeviceCgroup::recover(&layout, &id, Some(&checkpoint))?;
    let new = v2(&mut recovered)?
        .attached_program()?
        .ok_or("no program after recovery")?;
    check(new != old, "recovery replaced the program")?;
    check(
        recovered.allowed()? == normalize(&checkpoint),
        "allowed() is the checkpoint",
    )?;
    probe.expect(
        &nodes,
        &[
            ("nvidia0", Mode::Read, DENIED),
            ("nvidia2", Mode::Read, ALLOWED),
        ],
    )?;
    drop(probe);
    recovered.destroy()?;
    Ok(())
}
