//! cgroups v1 `devices` isolation against the real kernel: a child process in the container's
//! cgroup reaches exactly the devices allowed, updates reach running processes, destroy refuses
//! while processes remain. Needs root and a writable v1 `devices` hierarchy.

mod support;

use std::path::Path;
use std::process::ExitCode;

use libtest_mimic::Arguments;
use mesos_gpu_enforce::{
    cgroup::Access, cgroup::CgroupError, cgroup::CgroupLayout, cgroup::CgroupVersion,
    cgroup::DeviceCgroup, cgroup::DeviceRule, cgroup::Hierarchy, cgroup::default_whitelist,
    cgroup::normalize, cgroup::parse_list,
};
use mesos_gpu_node::{inventory::DevNum, inventory::NVIDIA_GPU_MAJOR};
use mesos_gpu_os::container_id::ContainerId;
use mesos_gpu_testkit::{Host, Need, needs, unique_name};
use support::{ALLOWED, Cleanup, DENIED, Mode, Nodes, Outcome, Probe, TestResult, check};

const V1_ROOT: &str = "/sys/fs/cgroup";

fn main() -> ExitCode {
    if let Some(code) = support::probe_main() {
        return code;
    }
    let host = Host::probe();
    let trial = |name, f| needs(&host, &[Need::Root, Need::Cgroup1], support::trial(name, f));
    let trials = vec![
        trial(
            "v1_child_reaches_exactly_its_gpus",
            child_reaches_exactly_its_gpus,
        ),
        trial(
            "v1_running_process_sees_updates",
            running_process_sees_updates,
        ),
        trial(
            "v1_destroy_refuses_while_processes_remain",
            destroy_refuses_while_processes_remain,
        ),
        trial(
            "v1_recover_reads_back_the_kernel_list",
            recover_reads_back_the_kernel_list,
        ),
        trial(
            "v1_failed_update_changes_nothing",
            failed_update_changes_nothing,
        ),
    ];
    libtest_mimic::run(&Arguments::from_args(), trials).exit_code()
}

/// A layout under a unique parent, and a guard that removes both directories.
fn setup(container: &str) -> TestResult<(CgroupLayout, ContainerId, Cleanup)> {
    let hierarchy = Hierarchy {
        version: CgroupVersion::V1,
        mount: Path::new(V1_ROOT).join("devices"),
    };
    let layout = CgroupLayout::new(hierarchy, unique_name("v1"))?;
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

/// Mesos's base list plus `nvidiactl`.
fn base() -> Vec<DeviceRule> {
    let mut rules = default_whitelist();
    rules.push(gpu(255, Access::RWM));
    rules
}

fn with(mut rules: Vec<DeviceRule>, more: &[DeviceRule]) -> Vec<DeviceRule> {
    rules.extend_from_slice(more);
    rules
}

fn child_reaches_exactly_its_gpus() -> TestResult {
    let (layout, id, _cleanup) = setup("exact")?;
    let nodes = Nodes::nvidia()?;
    // Outside any restricting cgroup the nodes exist but have no driver.
    let direct = std::fs::File::open(nodes.path("nvidia0")).map_err(|e| e.raw_os_error());
    check(
        matches!(direct, Err(Some(libc::ENXIO))),
        format!("nvidia0 from the test process: {direct:?}"),
    )?;

    let mut cgroup = DeviceCgroup::create(&layout, &id, &base())?;
    check(cgroup.path() == layout.container_dir(&id), "path")?;
    let full = with(base(), &[gpu(1, Access::RWM), gpu(3, Access::RWM)]);
    cgroup.set_allowed(&full)?;
    check(
        cgroup.allowed()? == normalize(&full),
        format!("devices.list: {:?}", cgroup.allowed()?),
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
            ("nvidia3", Mode::Write, ALLOWED),
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

fn running_process_sees_updates() -> TestResult {
    let (layout, id, _cleanup) = setup("update")?;
    let nodes = Nodes::nvidia()?;
    // No `c *:* m` here, so mknod is governed by the GPU entries.
    let base = parse_list("c 1:3 rwm\nc 195:255 rwm\n")?;
    let mut cgroup =
        DeviceCgroup::create(&layout, &id, &with(base.clone(), &[gpu(0, Access::RWM)]))?;
    let mut probe = Probe::spawn()?;
    cgroup.add_process(probe.pid())?;
    probe.expect(
        &nodes,
        &[
            ("nvidia0", Mode::Read, ALLOWED),
            ("nvidia1", Mode::Read, DENIED),
        ],
    )?;
    let made = nodes.path("made1");
    check(
        probe.mknod(&made, 'c', 195, 1)? == DENIED,
        "mknod 195:1 before the update",
    )?;

    // Grow to GPU 1 (read and mknod only), shrink away GPU 0.
    let next = with(base.clone(), &[gpu(1, Access::READ.union(Access::MKNOD))]);
    cgroup.set_allowed(&next)?;
    check(
        cgroup.allowed()? == normalize(&next),
        format!("devices.list: {:?}", cgroup.allowed()?),
    )?;
    probe.expect(
        &nodes,
        &[
            ("nvidia0", Mode::Read, DENIED),
            ("nvidia1", Mode::Read, ALLOWED),
            ("nvidia1", Mode::Write, DENIED),
            ("nvidiactl", Mode::Read, ALLOWED),
        ],
    )?;
    check(
        probe.mknod(&made, 'c', 195, 1)? == Outcome::Ok,
        "mknod 195:1 after the update",
    )?;

    // Allow and deny single rules.
    let DeviceCgroup::V1(v1) = &cgroup else {
        return Err("expected a v1 cgroup".into());
    };
    v1.allow(&[gpu(2, Access::RW)])?;
    v1.deny(&[gpu(2, Access::WRITE)])?;
    probe.expect(
        &nodes,
        &[
            ("nvidia2", Mode::Read, ALLOWED),
            ("nvidia2", Mode::Write, DENIED),
        ],
    )?;
    check(
        cgroup.allowed()?.contains(&gpu(2, Access::READ)),
        "c 195:2 r listed",
    )?;
    drop(probe);
    cgroup.destroy()?;
    Ok(())
}

fn destroy_refuses_while_processes_remain() -> TestResult {
    let (layout, id, _cleanup) = setup("busy")?;
    let nodes = Nodes::nvidia()?;
    let cgroup = DeviceCgroup::create(&layout, &id, &base())?;
    let mut probe = Probe::spawn()?;
    cgroup.add_process(probe.pid())?;
    let err = cgroup.destroy().expect_err("a process remains");
    check(err.is_busy(), format!("busy error: {err:?}"))?;
    check(
        err.to_string().contains(&probe.pid().to_string()),
        format!("error names the pid: {err}"),
    )?;
    check(DeviceCgroup::exists(&layout, &id), "cgroup still there")?;
    probe.expect(
        &nodes,
        &[
            ("nvidia0", Mode::Read, DENIED),
            ("nvidiactl", Mode::Read, ALLOWED),
        ],
    )?;
    drop(probe);
    cgroup.destroy()?;
    check(!DeviceCgroup::exists(&layout, &id), "cgroup removed")?;
    cgroup.destroy()?; // already gone: fine
    let err = DeviceCgroup::recover(&layout, &id, None).expect_err("gone");
    check(err.is_missing(), format!("missing error: {err:?}"))
}

fn recover_reads_back_the_kernel_list() -> TestResult {
    let (layout, id, _cleanup) = setup("recover")?;
    let full = with(base(), &[gpu(2, Access::RWM)]);
    let cgroup = DeviceCgroup::create(&layout, &id, &full)?;
    let err = DeviceCgroup::create(&layout, &id, &full).expect_err("exists");
    check(err.is_exists(), format!("exists error: {err:?}"))?;
    let recovered = DeviceCgroup::recover(&layout, &id, None)?;
    check(
        recovered.allowed()? == normalize(&full),
        format!("recovered {:?}", recovered.allowed()?),
    )?;
    cgroup.destroy()?;
    Ok(())
}

fn failed_update_changes_nothing() -> TestResult {
    let (layout, id, _cleanup) = setup("rollback")?;
    // Make the parent deny-by-default with only /dev/null, so the child cannot be granted more.
    let parent = layout.parent_dir();
    std::fs::create_dir_all(&parent)?;
    std::fs::write(parent.join("devices.deny"), "a")?;
    std::fs::write(parent.join("devices.allow"), "c 1:3 rwm")?;
    let base = parse_list("c 1:3 rwm\n")?;
    let mut cgroup = DeviceCgroup::create(&layout, &id, &base)?;
    let err = cgroup
        .set_allowed(&with(base.clone(), &[gpu(0, Access::RWM)]))
        .expect_err("parent forbids");
    let eperm = matches!(&err, CgroupError::Write { source, .. } if source.raw_os_error() == Some(libc::EPERM));
    check(eperm, format!("EPERM writing devices.allow: {err:?}"))?;
    check(
        cgroup.allowed()? == normalize(&base),
        format!("list unchanged: {:?}", cgroup.allowed()?),
    )?;
    // Create fails the same way and leaves no cgroup behind.
    let other = ContainerId::new("rollback2")?;
    let _cleanup2 = Cleanup::new(vec![layout.container_dir(&other)]);
    let err = DeviceCgroup::create(&layout, &other, &with(base, &[gpu(1, Access::RWM)]))
        .expect_err("forbidden");
    check(
        !DeviceCgroup::exists(&layout, &other),
        format!("no half-created cgroup after {err}"),
    )?;
    cgroup.destroy()?;
    Ok(())
}
