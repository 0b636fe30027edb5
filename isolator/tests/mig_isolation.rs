//! Issue 16: a MIG device isolated for real, on cgroups v1 and v2. The simulated mixed node's
//! layout is discovered (nvml-sim and its driver `/proc` files), its GPU, control and capability
//! nodes are `mknod`ed, and a process in the container's cgroup, allowed what one 1g.5gb MIG
//! device needs, opens its parent GPU, the control node and its two capability nodes (`ENXIO`:
//! allowed, no driver) and gets `EPERM` on every other GPU and capability node. Needs root and
//! writable v1 `devices` / cgroup2 hierarchies.

// Each test binary uses its own part of the shared support module.
#[allow(dead_code)]
mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use libtest_mimic::Arguments;
use mesos_gpu_enforce::{
    cgroup::CgroupLayout, cgroup::CgroupVersion, cgroup::DeviceCgroup, cgroup::Hierarchy,
    cgroup::default_whitelist,
};
use mesos_gpu_grant::{Grant, mig::MigAccess};
use mesos_gpu_node::{devices::DeviceNode, devices::DeviceNodes};
use mesos_gpu_node::{discovery::Discovery, discovery::GpuDriver};
use mesos_gpu_node::{inventory::DevNum, inventory::Inventory};
use mesos_gpu_os::container_id::ContainerId;
use mesos_gpu_placement::{mig::MigKind, mig::MigUnits};
use mesos_gpu_testkit::nvml_sim::SimNode;
use mesos_gpu_testkit::{Host, Need, cgroup2_root, needs, unique_name};
use support::{ALLOWED, Cleanup, DENIED, Mode, Outcome, Probe, TestResult, check};

fn main() -> ExitCode {
    if let Some(code) = support::probe_main() {
        return code;
    }
    let host = Host::probe();
    let trials = vec![
        needs(
            &host,
            &[Need::Root, Need::Cgroup1],
            support::trial("v1_a_mig_task_reaches_its_parent_and_two_caps_only", v1),
        ),
        needs(
            &host,
            &[Need::Root, Need::Cgroup2],
            support::trial("v2_a_mig_task_reaches_its_parent_and_two_caps_only", v2),
        ),
    ];
    libtest_mimic::run(&Arguments::from_args(), trials).exit_code()
}

fn v1() -> TestResult {
    isolate(Hierarchy {
        version: CgroupVersion::V1,
        mount: Path::new("/sys/fs/cgroup/devices").to_owned(),
    })
}

fn v2() -> TestResult {
    isolate(Hierarchy {
        version: CgroupVersion::V2,
        mount: cgroup2_root().ok_or("no cgroup2 mount")?,
    })
}

/// `mknod path c major minor`.
fn mknod(path: &Path, dev: DevNum) -> TestResult {
    let out = Command::new("mknod")
        .arg(path)
        .args(["c", &dev.major.to_string(), &dev.minor.to_string()])
        .output()?;
    check(
        out.status.success(),
        format!(
            "mknod {}: {}",
            path.display(),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// Every node of the node: `nvidia<minor>` per GPU, `nvidiactl`, and under `nvidia-caps` the
/// `config`/`monitor` capabilities and both capabilities of every MIG device.
fn make_nodes(dir: &Path, inv: &Inventory) -> TestResult<Vec<PathBuf>> {
    let major = inv.mig.caps_major.ok_or("no nvidia-caps major")?;
    std::fs::create_dir(dir.join("nvidia-caps"))?;
    let mut all = Vec::new();
    let mut add = |path: PathBuf, dev: DevNum| -> TestResult {
        mknod(&path, dev)?;
        all.push(path);
        Ok(())
    };
    for g in &inv.gpus {
        add(
            dir.join(format!("nvidia{}", g.minor)),
            DevNum {
                major: 195,
                minor: g.minor,
            },
        )?;
    }
    add(
        dir.join("nvidiactl"),
        DevNum {
            major: 195,
            minor: 255,
        },
    )?;
    for minor in [1, 2] {
        add(
            dir.join(format!("nvidia-caps/nvidia-cap{minor}")),
            DevNum { major, minor },
        )?;
    }
    for d in &inv.mig.devices {
        let caps = d.caps.as_ref().ok_or("a MIG device without caps")?;
        for dev in [caps.gpu_instance, caps.compute_instance] {
            add(
                dir.join(format!("nvidia-caps/nvidia-cap{}", dev.minor)),
                dev,
            )?;
        }
    }
    Ok(all)
}

fn isolate(hierarchy: Hierarchy) -> TestResult {
    let sim = SimNode::shipped("dgx-a100-mixed");
    let inv = match GpuDriver::open_at(Some(&sim.lib_path()), &sim.proc_root())? {
        Discovery::Driver(driver) => driver.inventory().clone(),
        Discovery::NoDriver(_) => return Err("no driver".into()),
    };
    // One 1g.5gb (profile 19) from the unit allocator: on GPU 4, the second of its kind there.
    let mut units = MigUnits::new(&inv.mig, false);
    units.allocate("other", 1, Some(MigKind::whole(19)))?;
    let uuid = units
        .allocate("task", 1, Some(MigKind::whole(19)))?
        .remove(0);
    let device = inv.mig.by_uuid(&uuid).ok_or("allocated UUID unknown")?;
    check(
        device.parent == 4 && device.gpu_instance == 10,
        format!("picked {device:?}"),
    )?;

    let dir = tempfile::Builder::new()
        .prefix("mgpu-test-nodes")
        .tempdir()?;
    let all = make_nodes(dir.path(), &inv)?;
    let access = MigAccess::of(device, dir.path(), &sim.proc_root())?;
    let control = DeviceNodes {
        control: vec![DeviceNode {
            path: dir.path().join("nvidiactl"),
            dev: DevNum {
                major: 195,
                minor: 255,
            },
        }],
        gpus: Vec::new(),
    };
    let grant = Grant::new(
        &control,
        &default_whitelist(),
        vec![],
        vec![access.clone()],
        None,
    )?;
    let rules = grant.rules();

    let layout = CgroupLayout::new(hierarchy, unique_name("mig"))?;
    let id = ContainerId::new("mig-task")?;
    let _cleanup = Cleanup::new(vec![layout.parent_dir(), layout.container_dir(&id)]);
    let cgroup = DeviceCgroup::create(&layout, &id, rules)?;
    let mut probe = Probe::spawn()?;
    cgroup.add_process(probe.pid())?;

    let mut allowed = vec![dir.path().join("nvidia4"), dir.path().join("nvidiactl")];
    allowed.extend(access.cap_nodes.iter().cloned());
    check(
        allowed.iter().all(|p| all.contains(p)),
        format!("{allowed:?} are not all among the nodes made"),
    )?;
    let mut wrong = Vec::new();
    let mut denied = 0;
    for path in &all {
        let want = if allowed.contains(path) {
            ALLOWED
        } else {
            denied += 1;
            DENIED
        };
        for mode in [Mode::Read, Mode::Write] {
            let got: Outcome = probe.open(path, mode)?;
            if got != want {
                wrong.push(format!(
                    "{} {mode:?}: got {got}, expected {want}",
                    path.display()
                ));
            }
        }
    }
    // 7 other GPUs, config and monitor, and the 30 capabilities of the other 15 MIG devices.
    check(denied == 7 + 2 + 30, format!("{denied} nodes denied"))?;
    check(wrong.is_empty(), wrong.join("\n"))?;
    drop(probe);
    cgroup.destroy()?;
    Ok(())
}
