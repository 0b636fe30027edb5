//! Issue 16: MIG devices through the container lifecycle, on real cgroups (v1 and v2), nvml-sim's
//! MIG nodes (their driver `/proc` files) and `mknod`ed GPU, control and capability nodes.
//!
//! - `mixed` strategy (`dgx-a100-mixed`): a `mig-<profile>` request gets one MIG device; its
//!   process opens the parent GPU, the control nodes and the device's two capability nodes
//!   (ENXIO) and gets EPERM on every other GPU and capability node; `gpus` still takes whole
//!   GPUs; two MIG devices and CAP_SYS_ADMIN are refused with the reason and nothing held; a
//!   container with an image gets the nodes and the `access` files (read-only) mounted; the
//!   checkpoint records the device and a restarted isolator keeps it held; update keeps it.
//! - `single` strategy (`dgx-a100-mig`, every GPU split): `gpus:1` is one MIG device, `gpus:2`
//!   is refused (CUDA uses one MIG device per process).
//! - An XID 79 on a GPU in MIG mode limits the owner of its MIG device (`watch` names it), and
//!   its other MIG devices are no longer handed out.
//! - An XID NVML attributes to one MIG instance (`gi`/`ci` in the event data) limits that
//!   device's owner only; the GPU's other MIG devices are still handed out, by this isolator and
//!   by another publisher of the node's pool, the failed one by neither until the operator marks it
//!   healthy.
//! - `hgx-h100`: `mig-1c.3g.40gb` and `mig-3g.40gb` are both GPU instance profile 9, yet each
//!   scalar is served from its own kind of device only.
//! - A MIG layout changed under a running task (the agent restarts after a reconfiguration
//!   reused its GPU instance id): recovery reports the task's device gone and holds the new
//!   device its cgroup can open out of service, across a further restart, until its cleanup.
#![allow(clippy::unwrap_used)]

mod lifecycle_common;
#[allow(dead_code)]
mod support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::Duration;

use libtest_mimic::{Arguments, Trial};
use lifecycle_common::{Setup, TestResult, check, trial};
use mesos_gpu_enforce::cgroup::CgroupVersion;
use mesos_gpu_grant::MountKind;
use mesos_gpu_health::GpuRef;
use mesos_gpu_isolator::agent_flags::MigStrategy;
use mesos_gpu_isolator::{
    lifecycle::ContainerId, lifecycle::Isolator, lifecycle::IsolatorConfig, lifecycle::LaunchInfo,
    lifecycle::MigConfig, lifecycle::PoolConfig, lifecycle::PoolRole, lifecycle::PrepareConfig,
    lifecycle::RecoverState,
};
use mesos_gpu_node::devices::DeviceNodes;
use mesos_gpu_node::{discovery::Discovery, discovery::GpuDriver};
use mesos_gpu_node::{inventory::DevNum, inventory::Inventory};
use mesos_gpu_placement::mig::MigKind;
use mesos_gpu_testkit::nvml_sim::{SimNode, mknod_mig_caps};
use mesos_gpu_testkit::{Host, Need, needs};
use support::{ALLOWED, DENIED, Mode, Probe};

/// The 1g.5gb GPU instance profile (A100 40GB).
const P_1G: u32 = 19;
/// The 3g.20gb GPU instance profile (A100 40GB).
const P_3G: u32 = 9;

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
            "mixed_mig_tasks_isolated_refused_mounted_and_recovered",
            mixed,
        );
        add("single_gpus_are_mig_devices", single);
        add("an_xid_on_the_parent_limits_its_mig_owners", parent_xid);
        add(
            "an_xid_on_a_mig_instance_takes_out_that_device_only",
            instance_xid,
        );
        add(
            "a_layout_changed_under_a_task_is_reported_and_quarantined",
            layout_changed,
        );
        add(
            "h100_compute_instance_devices_are_their_own_kind",
            h100_kinds,
        );
        add(
            "two_tasks_share_one_mig_device_under_its_own_mps_daemon",
            mig_mps_shares,
        );
        add(
            "single_strategy_gpus_units_are_shares_of_mig_devices",
            single_mig_shares,
        );
    }
    libtest_mimic::run(&Arguments::from_args(), trials).exit_code()
}

/// A MIG node: nvml-sim, its inventory with capability nodes, and every node mknod'ed.
struct MigNode {
    sim: SimNode,
    inventory: Inventory,
    dev: tempfile::TempDir,
    nodes: DeviceNodes,
    /// Every GPU and capability node made (not the control nodes).
    all: Vec<PathBuf>,
}

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

fn mig_node(name: &str) -> TestResult<MigNode> {
    let sim = SimNode::shipped(name);
    let inventory = sim.inventory()?;
    let dev = tempfile::Builder::new().prefix("mgpu-test-mig").tempdir()?;
    check(inventory.mig.caps_major.is_some(), "no nvidia-caps major")?;
    let mut all = Vec::new();
    for g in &inventory.gpus {
        let path = dev.path().join(format!("nvidia{}", g.minor));
        mknod(
            &path,
            DevNum {
                major: 195,
                minor: g.minor,
            },
        )?;
        all.push(path);
    }
    mknod(
        &dev.path().join("nvidiactl"),
        DevNum {
            major: 195,
            minor: 255,
        },
    )?;
    mknod(
        &dev.path().join("nvidia-uvm"),
        DevNum {
            major: lifecycle_common::UVM_MAJOR,
            minor: 0,
        },
    )?;
    all.extend(mknod_mig_caps(dev.path(), &inventory)?);
    let nodes = DeviceNodes::scan(dev.path(), &inventory)?;
    Ok(MigNode {
        sim,
        inventory,
        dev,
        nodes,
        all,
    })
}

fn config(setup: &Setup, node: &MigNode, strategy: MigStrategy) -> IsolatorConfig {
    let mut config = setup.config.clone();
    config.mig = MigConfig {
        strategy,
        dev_root: node.dev.path().to_owned(),
        proc_root: node.sim.proc_root(),
        ..MigConfig::default()
    };
    config
}

fn isolator(config: IsolatorConfig, node: &MigNode) -> TestResult<Isolator> {
    let iso = Isolator::new(config, node.inventory.clone(), node.nodes.clone())?;
    iso.recover(&[], &[])?;
    Ok(iso)
}

fn id(s: &str) -> ContainerId {
    ContainerId::new(s).unwrap()
}

/// What Mesos tells a restarted isolator of these top-level containers.
fn top_level(names: &[&str]) -> Vec<RecoverState> {
    names
        .iter()
        .map(|c| RecoverState {
            id: id(c),
            parent: None,
            nested_cgroup: None,
        })
        .collect()
}

fn mig(profile: u32, n: u32) -> PrepareConfig {
    PrepareConfig {
        mig: BTreeMap::from([(MigKind::whole(profile), n)]),
        ..PrepareConfig::default()
    }
}

fn env<'a>(info: &'a LaunchInfo, key: &str) -> Option<&'a str> {
    info.environment
        .iter()
        .chain(&info.task_environment)
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
}

/// The nodes a owner of MIG device `uuid` may open: its parent and its two capability nodes.
fn nodes_of(node: &MigNode, uuid: &str) -> TestResult<Vec<PathBuf>> {
    let d = node
        .inventory
        .mig
        .by_uuid(uuid)
        .ok_or("unknown MIG device")?;
    let caps = d.caps.as_ref().ok_or("no caps")?;
    Ok(vec![
        node.dev.path().join(format!("nvidia{}", d.parent_minor)),
        node.dev
            .path()
            .join(format!("nvidia-caps/nvidia-cap{}", caps.gpu_instance.minor)),
        node.dev.path().join(format!(
            "nvidia-caps/nvidia-cap{}",
            caps.compute_instance.minor
        )),
    ])
}

/// A probe in `c`'s cgroup opens exactly `allowed` of the node's GPU and capability nodes, and
/// the control nodes.
fn opens_exactly(
    iso: &Isolator,
    c: &ContainerId,
    node: &MigNode,
    allowed: &[PathBuf],
) -> TestResult {
    let mut probe = Probe::spawn()?;
    iso.isolate(c, probe.pid())?;
    let mut wrong = Vec::new();
    for path in &node.all {
        let want = if allowed.contains(path) {
            ALLOWED
        } else {
            DENIED
        };
        let got = probe.open(path, Mode::Write)?;
        if got != want {
            wrong.push(format!("{}: got {got}, expected {want}", path.display()));
        }
    }
    let got = probe.open(&node.dev.path().join("nvidiactl"), Mode::Write)?;
    if got != ALLOWED {
        wrong.push(format!("nvidiactl: got {got}"));
    }
    drop(probe);
    lifecycle_common::kill_cgroup(&iso.cgroup_path(c));
    check(wrong.is_empty(), format!("{c}: {}", wrong.join("; ")))
}

fn mixed(version: CgroupVersion) -> TestResult {
    let node = mig_node("dgx-a100-mixed")?;
    let setup = Setup::new(version)?;
    let iso = isolator(config(&setup, &node, MigStrategy::Mixed), &node)?;

    let a = iso.prepare(&id("mig-a"), mig(P_1G, 1))?;
    let status = iso.status(&id("mig-a"))?;
    check(
        status.mig.len() == 1 && a.gpus.is_empty(),
        format!("one MIG device and no whole GPU: {status:?}"),
    )?;
    let uuid = status.mig[0].clone();
    check(
        env(&a, "NVIDIA_VISIBLE_DEVICES") == Some(uuid.as_str())
            && env(&a, "CUDA_VISIBLE_DEVICES") == Some(uuid.as_str())
            && uuid.starts_with("MIG-"),
        format!("environment: {:?}", a.environment),
    )?;
    opens_exactly(&iso, &id("mig-a"), &node, &nodes_of(&node, &uuid)?)?;
    let ckpt: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(setup.checkpoint())?)?;
    check(
        ckpt["containers"]["mig-a"]["mig"][0] == uuid.as_str(),
        format!("checkpoint: {ckpt}"),
    )?;

    // `gpus` still takes whole GPUs (those not in MIG mode).
    let b = iso.prepare(
        &id("whole-b"),
        PrepareConfig {
            gpus: 2.0,
            ..PrepareConfig::default()
        },
    )?;
    check(
        b.gpus.len() == 2
            && b.gpus
                .iter()
                .all(|g| !node.inventory.mig.is_enabled(g.index)),
        format!("whole GPUs: {:?}", b.gpus),
    )?;

    // Two MIG devices, and CAP_SYS_ADMIN, are refused with the reason; nothing is held.
    let two = iso.prepare(&id("mig-two"), mig(P_1G, 2)).unwrap_err();
    check(
        mesos_gpu_os::error_chain(&two).contains("CUDA uses only one MIG device per process"),
        format!("two: {}", mesos_gpu_os::error_chain(&two)),
    )?;
    let admin = iso
        .prepare(
            &id("mig-admin"),
            PrepareConfig {
                capabilities: vec!["CAP_SYS_ADMIN".into()],
                ..mig(P_1G, 1)
            },
        )
        .unwrap_err();
    check(
        mesos_gpu_os::error_chain(&admin).contains("CAP_SYS_ADMIN"),
        format!("sys admin: {}", mesos_gpu_os::error_chain(&admin)),
    )?;
    check(
        iso.status(&id("mig-admin")).is_err() && !iso.cgroup_path(&id("mig-admin")).exists(),
        "a refused MIG task holds nothing",
    )?;

    // With an image: the nodes and the access files (read-only) are mounted.
    let rootfs = tempfile::tempdir()?;
    let e = iso.prepare(
        &id("mig-image"),
        PrepareConfig {
            rootfs: Some(rootfs.path().to_owned()),
            has_task_info: true,
            ..mig(P_1G, 1)
        },
    )?;
    let e_uuid = iso.status(&id("mig-image"))?.mig[0].clone();
    check(e_uuid != uuid, "another device")?;
    let access: Vec<&Path> = e
        .mounts
        .iter()
        .filter(|m| m.kind == MountKind::MigAccessFile && m.read_only)
        .map(|m| m.target.as_path())
        .collect();
    let devices: Vec<PathBuf> = e
        .mounts
        .iter()
        .filter(|m| m.kind == MountKind::Device)
        .map(|m| m.source.clone())
        .collect();
    check(
        access.len() == 2
            && access
                .iter()
                .all(|t| t.starts_with(rootfs.path().join("proc/driver/nvidia/capabilities")))
            && nodes_of(&node, &e_uuid)?
                .iter()
                .all(|n| devices.contains(n))
            && devices.contains(&node.dev.path().join("nvidiactl")),
        format!("mounts: {:?}", e.mounts),
    )?;
    iso.cleanup(&id("mig-image"))?;

    // update with the same resources keeps the device; another size is refused.
    iso.update(&id("mig-a"), 0.0)?;
    check(
        iso.update(&id("mig-a"), 1.0).is_err(),
        "resizing a MIG task",
    )?;

    // A restarted isolator keeps the device held.
    drop(iso);
    let iso = Isolator::new(
        config(&setup, &node, MigStrategy::Mixed),
        node.inventory.clone(),
        node.nodes.clone(),
    )?;
    let report = iso.recover(&top_level(&["mig-a", "whole-b"]), &[])?;
    check(report.is_clean(), format!("recovery: {report:?}"))?;
    check(iso.status(&id("mig-a"))?.mig == [uuid.clone()], "recovered")?;
    let f = iso.prepare(&id("mig-f"), mig(P_1G, 1))?;
    let f_uuid = iso.status(&id("mig-f"))?.mig[0].clone();
    check(
        f_uuid != uuid,
        format!("a held device was given again: {f_uuid}"),
    )?;
    check(
        env(&f, "NVIDIA_VISIBLE_DEVICES") == Some(f_uuid.as_str()),
        "f env",
    )?;
    for c in ["mig-a", "whole-b", "mig-f"] {
        iso.cleanup(&id(c))?;
    }
    Ok(())
}

/// MIG devices shared under MPS (issue 28): on `dgx-a100-mixed` with `gpu_sharing=mps,0-3=none`
/// and `gpu_replicas=2` (mixed strategy), two `mig-1g.5gb:1` tasks share one 1g device: each
/// opens only its parent and capability nodes, sees its MIG UUID, and gets half its threads and
/// memory from the device's own MPS daemon (started once, `CUDA_VISIBLE_DEVICES=MIG-…`, pipe
/// directory of its own); a third task takes the next 1g device and a second daemon. A
/// restarted isolator recovers the shares and adopts the daemons; an XID on the shared device's
/// instance limits both its owners only; each daemon is stopped once its last share ended.
fn mig_mps_shares(version: CgroupVersion) -> TestResult {
    use mesos_gpu_enforce::mps::MpsConfig;
    use mesos_gpu_isolator::lifecycle::SharingConfig;
    use mesos_gpu_placement::sharing::SharingSpec;
    use mesos_gpu_testkit::mps::MpsControl;
    let node = mig_node("dgx-a100-mixed")?;
    let setup = Setup::new(version)?;
    let control = MpsControl::install("{}");
    let mps_root = setup.work.path().join("mps");
    let shared = || -> TestResult<IsolatorConfig> {
        let mut c = config(&setup, &node, MigStrategy::Mixed);
        c.pool = Some(PoolConfig {
            dir: setup.work.path().join("pool"),
            role: PoolRole::Agent,
        });
        let mut mps = MpsConfig::new(&mps_root);
        mps.program = control.program();
        c.sharing = Some(SharingConfig {
            spec: SharingSpec::parse("2", "mps,0-3=none".parse()?)?,
            mps,
        });
        Ok(c)
    };
    let iso = isolator(shared()?, &node)?;
    let (a, b) = (
        iso.prepare(&id("share-a"), mig(P_1G, 1))?,
        iso.prepare(&id("share-b"), mig(P_1G, 1))?,
    );
    let uuid = env(&a, "CUDA_VISIBLE_DEVICES")
        .unwrap_or_default()
        .to_owned();
    let device = node
        .inventory
        .mig
        .by_uuid(&uuid)
        .ok_or(format!("not a MIG device: {uuid:?}"))?;
    let pipe = mps_root.join(&uuid).join("pipe");
    let half_mib = device.memory_total / (1 << 20) / 2;
    for (name, info) in [("share-a", &a), ("share-b", &b)] {
        let status = iso.status(&id(name))?;
        check(
            device.profile == Some(P_1G)
                && info.gpus.is_empty()
                && status.mig.is_empty()
                && status.share.as_ref().is_some_and(|g| g.uuid == uuid)
                && env(info, "NVIDIA_VISIBLE_DEVICES") == Some(uuid.as_str())
                && env(info, "CUDA_VISIBLE_DEVICES") == Some(uuid.as_str())
                && env(info, "MESOS_GPU_SHARE") == Some("1/2")
                && env(info, "MESOS_GPU_SHARING") == Some("mps")
                && env(info, "CUDA_MPS_PIPE_DIRECTORY") == pipe.to_str()
                && env(info, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE") == Some("50")
                && env(info, "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT")
                    == Some(format!("0={half_mib}M").as_str()),
            format!("{name}: {status:?} {:?}", info.environment),
        )?;
        opens_exactly(&iso, &id(name), &node, &nodes_of(&node, &uuid)?)?;
    }
    // Mesos updates a container whenever a resource changes: its `gpus` stay 0 (the share is
    // in its mig-1g.5gb scalar); another size is refused.
    iso.update(&id("share-a"), 0.0)?;
    check(
        iso.update(&id("share-a"), 1.0).is_err(),
        "resizing a share of a MIG device",
    )?;
    // The device is full: the next 1g share goes to the next 1g device, with its own daemon.
    let c = iso.prepare(&id("share-c"), mig(P_1G, 1))?;
    let c_uuid = env(&c, "CUDA_VISIBLE_DEVICES")
        .unwrap_or_default()
        .to_owned();
    check(
        c_uuid != uuid && c_uuid.starts_with("MIG-"),
        format!("share-c on {c_uuid}"),
    )?;
    let starts = || -> Vec<(String, String)> {
        control
            .records()
            .iter()
            .filter(|r| r["event"] == "start")
            .map(|r| {
                (
                    r["env"]["CUDA_VISIBLE_DEVICES"]
                        .as_str()
                        .unwrap_or_default()
                        .to_owned(),
                    r["pipe_dir"].as_str().unwrap_or_default().to_owned(),
                )
            })
            .collect()
    };
    let pipe_of = |u: &str| mps_root.join(u).join("pipe").display().to_string();
    check(
        starts()
            == [
                (uuid.clone(), pipe_of(&uuid)),
                (c_uuid.clone(), pipe_of(&c_uuid)),
            ],
        format!("one daemon per MIG device: {:?}", control.records()),
    )?;
    let commands: Vec<String> = control
        .records()
        .iter()
        .filter(|r| r["event"] == "command")
        .filter_map(|r| Some(r["command"].as_str()?.to_owned()))
        .take(2)
        .collect();
    check(
        commands
            == [
                "set_default_active_thread_percentage 50".to_owned(),
                format!("set_default_device_pinned_mem_limit {uuid} {half_mib}M"),
            ],
        format!("the daemon's defaults: {commands:?}"),
    )?;
    let ckpt: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(setup.checkpoint())?)?;
    check(
        ckpt["containers"]["share-a"]["share"]["uuid"] == uuid.as_str(),
        format!("checkpoint: {ckpt}"),
    )?;

    // A restarted isolator recovers the shares and adopts both daemons (no new start).
    drop(iso);
    let iso = Isolator::new(shared()?, node.inventory.clone(), node.nodes.clone())?;
    attach_health(&iso, &node)?;
    let report = iso.recover(&top_level(&["share-a", "share-b", "share-c"]), &[])?;
    check(report.is_clean(), format!("recovery: {report:?}"))?;
    iso.supervise_mps()?;
    check(starts().len() == 2, format!("adopted: {:?}", starts()))?;
    check(
        iso.status(&id("share-a"))?
            .share
            .is_some_and(|g| g.uuid == uuid),
        "share-a recovered",
    )?;
    opens_exactly(&iso, &id("share-b"), &node, &nodes_of(&node, &uuid)?)?;

    // An XID on the shared device's instance: both owners are told, the other device's not.
    node.sim.append_event(&format!(
        "xid {} 94 gi {} ci {}",
        device.parent, device.gpu_instance, device.compute_instance
    ));
    for owner in ["share-a", "share-b"] {
        let told = iso
            .watch(&id(owner), Some(Duration::from_secs(10)))?
            .ok_or(format!("{owner} was not told its MIG device failed"))?;
        check(
            told.uuid == uuid && told.message.contains("XID 94"),
            format!("{owner}: {told:?}"),
        )?;
    }
    check(
        iso.watch(&id("share-c"), Some(Duration::from_millis(300)))?
            .is_none(),
        "share-c was told, though its device did not fail",
    )?;

    // Each daemon stops once its last share ended.
    let quits = || -> Vec<u64> {
        control
            .records()
            .iter()
            .filter(|r| r["event"] == "exit" && r["reason"] == "quit")
            .filter_map(|r| r["daemon_pid"].as_u64())
            .collect()
    };
    iso.cleanup(&id("share-a"))?;
    iso.supervise_mps()?;
    check(quits().is_empty(), "share-b still holds the device")?;
    iso.cleanup(&id("share-b"))?;
    iso.supervise_mps()?;
    wait(|| quits().len() == 1, "the first device's daemon to quit")?;
    iso.cleanup(&id("share-c"))?;
    iso.supervise_mps()?;
    wait(|| quits().len() == 2, "the second device's daemon to quit")?;
    let pool = std::fs::read_to_string(setup.work.path().join("pool/gpu/pool.json"))?;
    check(
        !pool.contains("MIG-"),
        format!("shares or daemons left: {pool}"),
    )
}

/// The single strategy with MIG devices shared under MPS (`dgx-a100-mig`, every GPU split,
/// `gpu_replicas=2`, `gpu_sharing=mps`): `gpus:1` is a 1/2 share of a MIG device, a second
/// `gpus:1` packs onto the same device, `gpus:2` takes a whole share (2/2) of another, and a
/// request above R is refused saying why, holding nothing.
fn single_mig_shares(version: CgroupVersion) -> TestResult {
    use mesos_gpu_enforce::mps::MpsConfig;
    use mesos_gpu_isolator::lifecycle::SharingConfig;
    use mesos_gpu_placement::sharing::SharingSpec;
    use mesos_gpu_testkit::mps::MpsControl;
    let node = mig_node("dgx-a100-mig")?;
    let setup = Setup::new(version)?;
    let control = MpsControl::install("{}");
    let mut c = config(&setup, &node, MigStrategy::Single);
    c.pool = Some(PoolConfig {
        dir: setup.work.path().join("pool"),
        role: PoolRole::Agent,
    });
    let mut mps = MpsConfig::new(setup.work.path().join("mps"));
    mps.program = control.program();
    c.sharing = Some(SharingConfig {
        spec: SharingSpec::parse("2", "mps".parse()?)?,
        mps,
    });
    let iso = isolator(c, &node)?;
    let result = (|| -> TestResult {
        let gpus = |n: f64| PrepareConfig {
            gpus: n,
            ..PrepareConfig::default()
        };
        let share = |name: &str| -> TestResult<(String, u32)> {
            let g = iso
                .status(&id(name))?
                .share
                .ok_or(format!("{name}: no share"))?;
            Ok((g.uuid, g.units))
        };
        let one = iso.prepare(&id("one"), gpus(1.0))?;
        iso.prepare(&id("two"), gpus(1.0))?;
        iso.prepare(&id("both"), gpus(2.0))?;
        let (a, b, c) = (share("one")?, share("two")?, share("both")?);
        check(
            a.0.starts_with("MIG-") && a == b && a.1 == 1 && c.1 == 2 && c.0 != a.0,
            format!("shares: {a:?} {b:?} {c:?}"),
        )?;
        check(
            env(&one, "CUDA_VISIBLE_DEVICES") == Some(a.0.as_str())
                && env(&one, "MESOS_GPU_SHARE") == Some("1/2")
                && one.gpus.is_empty(),
            format!("one: {:?}", one.environment),
        )?;
        opens_exactly(&iso, &id("one"), &node, &nodes_of(&node, &a.0)?)?;
        iso.update(&id("one"), 1.0)?;
        let three = iso.prepare(&id("three"), gpus(3.0)).unwrap_err();
        let why = mesos_gpu_os::error_chain(&three);
        check(
            iso.status(&id("three")).is_err()
                && why.contains("CUDA uses only one MIG device per process"),
            format!("gpus:3, above R, takes whole MIG devices, one per process: {why}"),
        )?;
        for name in ["one", "two", "both"] {
            iso.cleanup(&id(name))?;
        }
        Ok(())
    })();
    control.kill_daemons();
    result
}

/// Waits up to 10 s for `done`.
fn wait(done: impl Fn() -> bool, what: &str) -> TestResult {
    let end = std::time::Instant::now() + Duration::from_secs(10);
    while !done() {
        if std::time::Instant::now() > end {
            return Err(format!("timed out waiting for {what}").into());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

fn single(version: CgroupVersion) -> TestResult {
    let node = mig_node("dgx-a100-mig")?;
    let setup = Setup::new(version)?;
    let iso = isolator(config(&setup, &node, MigStrategy::Single), &node)?;
    let one = iso.prepare(
        &id("single-one"),
        PrepareConfig {
            gpus: 1.0,
            ..PrepareConfig::default()
        },
    )?;
    let uuid = iso
        .status(&id("single-one"))?
        .mig
        .first()
        .cloned()
        .ok_or("no MIG device")?;
    check(
        one.gpus.is_empty() && env(&one, "CUDA_VISIBLE_DEVICES") == Some(uuid.as_str()),
        format!("{one:?}"),
    )?;
    opens_exactly(&iso, &id("single-one"), &node, &nodes_of(&node, &uuid)?)?;
    let two = iso
        .prepare(
            &id("single-two"),
            PrepareConfig {
                gpus: 2.0,
                ..PrepareConfig::default()
            },
        )
        .unwrap_err();
    check(
        mesos_gpu_os::error_chain(&two).contains("CUDA uses only one MIG device per process"),
        format!("two: {}", mesos_gpu_os::error_chain(&two)),
    )?;
    iso.cleanup(&id("single-one"))?;
    Ok(())
}

/// An XID 79 on a GPU in MIG mode takes its MIG devices out of service and resolves the `watch`
/// of the task holding one of them, naming the device; the next MIG request gets a device of
/// another GPU.
fn parent_xid(version: CgroupVersion) -> TestResult {
    let node = mig_node("dgx-a100-mixed")?;
    let setup = Setup::new(version)?;
    let iso = Isolator::new(
        config(&setup, &node, MigStrategy::Mixed),
        node.inventory.clone(),
        node.nodes.clone(),
    )?;
    attach_health(&iso, &node)?;
    iso.recover(&[], &[])?;
    iso.prepare(&id("mig-held"), mig(P_1G, 1))?;
    let uuid = iso.status(&id("mig-held"))?.mig[0].clone();
    let parent = node.inventory.mig.by_uuid(&uuid).ok_or("unknown")?.parent;
    node.sim.append_event(&format!("xid {parent} 79"));
    let told = iso
        .watch(&id("mig-held"), Some(Duration::from_secs(10)))?
        .ok_or("the MIG owner was not told")?;
    check(
        told.uuid == uuid && told.gpu == parent && told.message.contains("XID 79"),
        format!("limitation: {told:?}"),
    )?;
    iso.prepare(&id("mig-next"), mig(P_1G, 1))?;
    let next = iso.status(&id("mig-next"))?.mig[0].clone();
    let next_parent = node.inventory.mig.by_uuid(&next).ok_or("unknown")?.parent;
    check(
        next_parent != parent,
        format!("a MIG device of the failed GPU {parent} was handed out: {next}"),
    )?;
    for c in ["mig-held", "mig-next"] {
        iso.cleanup(&id(c))?;
    }
    Ok(())
}

/// An XID 94 (contained ECC error) NVML attributes to the GPU and compute instance of one 1g device: its owner is
/// told, naming the device; the owner of the 3g device of the same GPU is not. Once the
/// owner is gone, another publisher of the node's pool (an `exec`) gets the GPU's other 1g device,
/// not the failed one (which comes first); this isolator does not hand it out either, until the
/// operator marks it healthy.
fn instance_xid(version: CgroupVersion) -> TestResult {
    let node = mig_node("dgx-a100-mixed")?;
    let setup = Setup::new(version)?;
    let pool = setup.work.path().join("pool");
    let mut agent_config = config(&setup, &node, MigStrategy::Mixed);
    agent_config.pool = Some(PoolConfig {
        dir: pool.clone(),
        role: PoolRole::Agent,
    });
    let iso = Isolator::new(
        agent_config.clone(),
        node.inventory.clone(),
        node.nodes.clone(),
    )?;
    attach_health(&iso, &node)?;
    iso.recover(&[], &[])?;
    let (a, b) = (id("mig-small"), id("mig-big"));
    iso.prepare(&a, mig(P_1G, 1))?;
    iso.prepare(&b, mig(P_3G, 1))?;
    let ua = iso.status(&a)?.mig[0].clone();
    let ub = iso.status(&b)?.mig[0].clone();
    let da = node.inventory.mig.by_uuid(&ua).ok_or("unknown")?;
    let db = node.inventory.mig.by_uuid(&ub).ok_or("unknown")?;
    check(
        da.parent == db.parent,
        format!(
            "both on one GPU: {ua} on {}, {ub} on {}",
            da.parent, db.parent
        ),
    )?;
    node.sim.append_event(&format!(
        "xid {} 94 gi {} ci {}",
        da.parent, da.gpu_instance, da.compute_instance
    ));
    let told = iso
        .watch(&a, Some(Duration::from_secs(10)))?
        .ok_or("the owner of the failed MIG device was not told")?;
    check(
        told.uuid == ua
            && told.gpu == da.parent
            && told.message.contains(&format!("MIG device {ua}"))
            && told.message.contains("XID 94"),
        format!("limitation: {told:?}"),
    )?;
    check(
        iso.watch(&b, Some(Duration::from_millis(300)))?.is_none(),
        "the 3g owner was told, though only the 1g instance failed",
    )?;
    let exec_dir = tempfile::tempdir()?;
    let mut exec_config = agent_config.clone();
    exec_config.work_dir = exec_dir.path().to_owned();
    exec_config.pool = Some(PoolConfig {
        dir: pool,
        role: PoolRole::Exec {
            private_dir: exec_dir.path().to_owned(),
        },
    });
    iso.cleanup(&a)?;
    let exec = isolator(exec_config, &node)?;
    let e = id("exec-1g");
    exec.prepare(&e, mig(P_1G, 1))?;
    let ue = exec.status(&e)?.mig[0].clone();
    let de = node.inventory.mig.by_uuid(&ue).ok_or("unknown")?;
    check(
        ue != ua && de.parent == da.parent,
        format!(
            "the exec got {ue} on GPU {}: the other 1g of GPU {} was expected",
            de.parent, da.parent
        ),
    )?;
    let c = id("mig-after");
    iso.prepare(&c, mig(P_1G, 1))?;
    let uc = iso.status(&c)?.mig[0].clone();
    check(
        uc != ua,
        format!("the failed MIG device {ua} was handed out again"),
    )?;
    iso.mark_healthy(&GpuRef::parse(&ua)?)?;
    iso.cleanup(&c)?;
    let d = id("mig-healed");
    iso.prepare(&d, mig(P_1G, 1))?;
    let ud = iso.status(&d)?.mig[0].clone();
    check(
        ud == ua,
        format!("after mark-healthy, {ua} was expected; got {ud}"),
    )?;
    for c in [&b, &d] {
        iso.cleanup(c)?;
    }
    exec.cleanup(&e)?;
    Ok(())
}

/// The 2g.10gb GPU instance profile (A100 40GB).
const P_2G: u32 = 14;
/// The UUID the reconfigured layout gives its new 2g device.
const NEW_2G: &str = "MIG-0b1e5c2a-7d3f-5a4e-9c8b-1f2e3d4c5b6a";

/// Task `a` holds a 1g device (GPU instance 9 or 10 of GPU 4); while it runs, GPU 4's two 1g
/// instances are destroyed and a 2g made in their place that reuses `a`'s GPU instance id (so
/// its capability node's minor). A restarted isolator reports `a`'s device gone and holds the 2g
/// out of service (`a`'s cgroup can open it); a further restart still does; `a`'s cleanup frees it.
fn layout_changed(version: CgroupVersion) -> TestResult {
    let mut node = mig_node("dgx-a100-mixed")?;
    let setup = Setup::new(version)?;
    let iso = isolator(config(&setup, &node, MigStrategy::Mixed), &node)?;
    let a = id("mig-old-layout");
    iso.prepare(&a, mig(P_1G, 1))?;
    let ua = iso.status(&a)?.mig[0].clone();
    let da = node.inventory.mig.by_uuid(&ua).ok_or("unknown")?.clone();
    drop(iso);

    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../nvml-sim/topologies/dgx-a100-mixed.json");
    let mut json: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path)?)?;
    let gpu = &mut json["gpus"][da.parent as usize]["mig"]["gpu_instances"];
    let kept: Vec<serde_json::Value> = gpu
        .as_array()
        .ok_or("no gpu_instances")?
        .iter()
        .filter(|gi| gi["profile"] != P_1G)
        .cloned()
        .chain([serde_json::json!({
            "id": da.gpu_instance, "profile": P_2G, "start": 2,
            "compute_instances": [{"id": 0, "uuid": NEW_2G}],
        })])
        .collect();
    *gpu = serde_json::Value::Array(kept);
    node.sim.set_description(&json.to_string());
    let inventory = node.sim.inventory()?;
    let new = inventory
        .mig
        .by_uuid(NEW_2G)
        .ok_or("the new layout has no 2g device")?;
    check(
        new.parent == da.parent
            && new.gpu_instance == da.gpu_instance
            && inventory.mig.by_uuid(&ua).is_none(),
        format!("new layout: {new:?}"),
    )?;
    node.nodes = DeviceNodes::scan(node.dev.path(), &inventory)?;
    node.inventory = inventory;
    let restart = |states: &[&ContainerId]| -> TestResult<(Isolator, String)> {
        let iso = Isolator::new(
            config(&setup, &node, MigStrategy::Mixed),
            node.inventory.clone(),
            node.nodes.clone(),
        )?;
        let states: Vec<RecoverState> = states
            .iter()
            .map(|c| RecoverState {
                id: (*c).clone(),
                parent: None,
                nested_cgroup: None,
            })
            .collect();
        let report = iso.recover(&states, &[])?;
        Ok((iso, format!("{report:?}")))
    };
    let (iso, report) = restart(&[&a])?;
    check(
        report.contains(&format!("MigChanged {{ container: ContainerId(\"{a}\"), uuid: \"{ua}\", quarantined: [\"{NEW_2G}\"] }}")),
        format!("recovery report: {report}"),
    )?;
    let ckpt: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(setup.checkpoint())?)?;
    check(
        ckpt["containers"][a.as_str()]["mig_quarantine"][0] == NEW_2G,
        format!("checkpoint: {ckpt}"),
    )?;
    // GPU 4's other 2g first, then the next GPU's: never the quarantined one.
    let (b, c) = (id("mig-2g-b"), id("mig-2g-c"));
    for x in [&b, &c] {
        iso.prepare(x, mig(P_2G, 1))?;
        let got = iso.status(x)?.mig[0].clone();
        check(got != NEW_2G, format!("{x} got the quarantined {got}"))?;
    }
    drop(iso);
    let (iso, report) = restart(&[&a, &b, &c])?;
    check(
        !report.contains("MigChanged"),
        format!("second recovery: {report}"),
    )?;
    let e = id("mig-2g-e");
    iso.prepare(&e, mig(P_2G, 1))?;
    let ue = iso.status(&e)?.mig[0].clone();
    check(
        ue != NEW_2G,
        format!("after a second restart {e} got the quarantined {ue}"),
    )?;
    iso.cleanup(&e)?;
    iso.cleanup(&a)?;
    let d = id("mig-2g-d");
    iso.prepare(&d, mig(P_2G, 1))?;
    let ud = iso.status(&d)?.mig[0].clone();
    check(
        ud == NEW_2G,
        format!("after the cleanup of {a}, {NEW_2G} was expected; got {ud}"),
    )?;
    for x in [&b, &c, &d] {
        iso.cleanup(x)?;
    }
    Ok(())
}

/// On `hgx-h100` one 3g.40gb GPU instance is split in three 1-slice compute instances: the
/// mixed offer names `mig-1c.3g.40gb` apart from `mig-3g.40gb` though both are profile 9; three
/// `mig-1c.3g.40gb` requests get the three 1c devices and a fourth is refused while 3g.40gb
/// devices are free; a `mig-3g.40gb` request gets a device spanning its GPU instance.
fn h100_kinds(version: CgroupVersion) -> TestResult {
    use mesos_gpu_isolator::agent_flags::MigOffer;
    let node = mig_node("hgx-h100")?;
    let setup = Setup::new(version)?;
    let iso = isolator(config(&setup, &node, MigStrategy::Mixed), &node)?;
    let offer = MigOffer::of(&node.inventory, MigStrategy::Mixed);
    let kind = |name: &str| -> TestResult<MigKind> {
        Ok(offer
            .profiles
            .iter()
            .find(|p| p.resource == name)
            .and_then(|p| p.kind)
            .ok_or(format!("no {name} in {offer:?}"))?)
    };
    let (one_c, three_g) = (kind("mig-1c.3g.40gb")?, kind("mig-3g.40gb")?);
    check(
        one_c.profile == 9 && three_g.profile == 9 && one_c != three_g,
        format!("{one_c:?} {three_g:?}"),
    )?;
    let ask = |k: MigKind| PrepareConfig {
        mig: BTreeMap::from([(k, 1)]),
        ..PrepareConfig::default()
    };
    let slices_of = |task: &ContainerId| -> TestResult<(u32, u32)> {
        let uuid = iso.status(task)?.mig[0].clone();
        let d = node.inventory.mig.by_uuid(&uuid).ok_or("unknown")?;
        Ok((d.compute_instance_slices, d.gpu_instance_slices))
    };
    let tasks: Vec<ContainerId> = (0..3).map(|n| id(&format!("h100-1c-{n}"))).collect();
    for task in &tasks {
        iso.prepare(task, ask(one_c))?;
        check(
            slices_of(task)? == (1, 3),
            format!("{task} is not a 1c.3g device"),
        )?;
    }
    let fourth = iso.prepare(&id("h100-1c-3"), ask(one_c)).unwrap_err();
    check(
        mesos_gpu_os::error_chain(&fourth).contains("of profile 1c.3g.40gb"),
        format!("fourth: {}", mesos_gpu_os::error_chain(&fourth)),
    )?;
    let whole = id("h100-3g");
    iso.prepare(&whole, ask(three_g))?;
    check(
        slices_of(&whole)? == (3, 3),
        "the 3g.40gb request got a compute instance",
    )?;
    for task in tasks.iter().chain([&whole]) {
        iso.cleanup(task)?;
    }
    Ok(())
}

/// Starts the isolator's health monitor on the node's nvml-sim and waits for its events to be
/// registered.
fn attach_health(iso: &Isolator, node: &MigNode) -> TestResult {
    use mesos_gpu_health::{HealthPolicy, MonitorConfig};
    use std::sync::Arc;
    let driver = match GpuDriver::open_at(Some(&node.sim.lib_path()), &node.sim.proc_root())? {
        Discovery::Driver(d) => Arc::new(*d),
        Discovery::NoDriver(_) => return Err("no driver".into()),
    };
    iso.attach_health(
        driver,
        MonitorConfig {
            policy: HealthPolicy::default(),
            wait_timeout: Duration::from_millis(20),
            retry_min: Duration::from_millis(10),
            retry_max: Duration::from_millis(40),
            ..MonitorConfig::default()
        },
    )?;
    let monitor = iso.health_monitor().ok_or("no monitor")?;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while monitor.stats().registrations < 1 {
        check(
            std::time::Instant::now() < deadline,
            "events never registered",
        )?;
        std::thread::sleep(Duration::from_millis(5));
    }
    Ok(())
}
