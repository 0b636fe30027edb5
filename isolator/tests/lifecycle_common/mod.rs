//! Shared by the lifecycle tests (`lifecycle.rs`, `lifecycle_faults.rs`): a simulated node with
//! mknod'ed device nodes, an isolator configuration under a unique cgroups root, and a guard
//! that removes every cgroup under that root.
#![allow(dead_code, clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

use libtest_mimic::{Failed, Trial};
use mesos_gpu_enforce::cgroup::CgroupVersion;
use mesos_gpu_isolator::{lifecycle::CgroupChoice, lifecycle::IsolatorConfig};
use mesos_gpu_node::devices::DeviceNodes;
use mesos_gpu_node::inventory::Inventory;
use mesos_gpu_node::{discovery::Discovery, discovery::GpuDriver};
use mesos_gpu_testkit::nvml_sim::SimNode;

pub(crate) type TestResult<T = ()> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// A trial running `f`, failing with the whole error chain.
pub(crate) fn trial(name: String, f: impl FnOnce() -> TestResult + Send + 'static) -> Trial {
    Trial::test(name, move || {
        f().map_err(|e| Failed::from(mesos_gpu_os::error_chain(e.as_ref())))
    })
}

/// The major given to the fake `nvidia-uvm` node (in the local/experimental range, no driver).
pub(crate) const UVM_MAJOR: u32 = 240;

/// A simulated node: nvml-sim inventory and its device nodes in a temp dir.
pub(crate) struct Node {
    pub(crate) sim: SimNode,
    pub(crate) inventory: Inventory,
    pub(crate) dev: tempfile::TempDir,
    pub(crate) nodes: DeviceNodes,
}

impl Node {
    /// The shipped topology `name` (e.g. `dgx1-v100`).
    pub(crate) fn new(name: &str) -> TestResult<Node> {
        let sim = SimNode::shipped(name);
        let inventory = match GpuDriver::open(Some(&sim.lib_path()))? {
            Discovery::Driver(d) => d.inventory().clone(),
            Discovery::NoDriver(inv) => {
                return Err(format!("no driver: {:?}", inv.absent_reason).into());
            }
        };
        let dev = tempfile::Builder::new().prefix("mgpu-test-dev").tempdir()?;
        make_nodes(dev.path(), &inventory)?;
        let nodes = DeviceNodes::scan(dev.path(), &inventory)?;
        Ok(Node {
            sim,
            inventory,
            dev,
            nodes,
        })
    }

    /// The device node of the GPU with minor `minor`.
    pub(crate) fn gpu_node(&self, minor: u32) -> PathBuf {
        self.dev.path().join(format!("nvidia{minor}"))
    }
}

/// mknod `nvidia<minor>` per GPU, `nvidiactl` (195:255) and `nvidia-uvm` (240:0) under `dir`.
pub(crate) fn make_nodes(dir: &Path, inventory: &Inventory) -> TestResult {
    let mut specs: Vec<(String, u32, u32)> = inventory
        .gpus
        .iter()
        .map(|g| (format!("nvidia{}", g.minor), 195, g.minor))
        .collect();
    specs.push(("nvidiactl".into(), 195, 255));
    specs.push(("nvidia-uvm".into(), UVM_MAJOR, 0));
    for (name, major, minor) in specs {
        let path = dir.join(&name);
        let out = Command::new("mknod")
            .arg(&path)
            .args(["c", &major.to_string(), &minor.to_string()])
            .output()?;
        if !out.status.success() {
            return Err(format!(
                "mknod {}: {}",
                path.display(),
                String::from_utf8_lossy(&out.stderr)
            )
            .into());
        }
    }
    Ok(())
}

/// The cgroup2 mount of this host.
pub(crate) fn v2_mount() -> PathBuf {
    mesos_gpu_testkit::cgroup2_root().unwrap_or_else(|| PathBuf::from("/sys/fs/cgroup/unified"))
}

/// An isolator configuration for `version` under a unique cgroups root, plus its work dir and
/// the guard removing its cgroups.
pub(crate) struct Setup {
    pub(crate) config: IsolatorConfig,
    pub(crate) work: tempfile::TempDir,
    pub(crate) guard: CgroupRoot,
}

impl Setup {
    pub(crate) fn new(version: CgroupVersion) -> TestResult<Setup> {
        let work = tempfile::Builder::new()
            .prefix("mgpu-test-work")
            .tempdir()?;
        let mut config = IsolatorConfig::new(work.path());
        config.cgroups_root = mesos_gpu_testkit::unique_name("life");
        let parent = match version {
            CgroupVersion::V1 => {
                config.cgroup_version = CgroupChoice::V1;
                config.v1_root.join("devices").join(&config.cgroups_root)
            }
            CgroupVersion::V2 => {
                config.cgroup_version = CgroupChoice::V2;
                config.v2_mount = Some(v2_mount());
                v2_mount().join(&config.cgroups_root)
            }
        };
        Ok(Setup {
            config,
            work,
            guard: CgroupRoot { parent },
        })
    }

    /// The checkpoint file.
    pub(crate) fn checkpoint(&self) -> PathBuf {
        self.work.path().join("gpu/allocations.json")
    }
}

/// Removes every cgroup under `parent`, then `parent`, killing processes left in them.
pub(crate) struct CgroupRoot {
    pub(crate) parent: PathBuf,
}

impl CgroupRoot {
    /// The container cgroups left under the parent.
    pub(crate) fn children(&self) -> Vec<PathBuf> {
        mesos_gpu_testkit::subdirs(&self.parent)
    }

    /// Kills every process in the container cgroups (what the agent's launcher does to orphans).
    pub(crate) fn kill_all(&self) {
        for dir in self.children() {
            kill_cgroup(&dir);
        }
    }
}

/// SIGKILLs every process in the cgroup `dir` and waits until it is empty.
pub(crate) fn kill_cgroup(dir: &Path) {
    for _ in 0..100 {
        let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
        if procs.trim().is_empty() {
            return;
        }
        for pid in procs.split_whitespace() {
            let _ = Command::new("kill").args(["-9", pid]).status();
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

impl Drop for CgroupRoot {
    fn drop(&mut self) {
        remove_tree(&self.parent);
    }
}

/// Removes the cgroup `dir` and every cgroup below it, deepest first, killing what is left in
/// them (Mesos's layouts nest: `<id>/leaf`, `<id>/mesos/<child>`).
pub(crate) fn remove_tree(dir: &Path) {
    let children: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                .map(|e| e.path())
                .collect()
        })
        .unwrap_or_default();
    for child in children {
        remove_tree(&child);
    }
    for _ in 0..50 {
        if !dir.exists() || std::fs::remove_dir(dir).is_ok() {
            break;
        }
        kill_cgroup(dir);
    }
}

/// Fails with `what` unless `cond`.
pub(crate) fn check(cond: bool, what: impl std::fmt::Display) -> TestResult {
    if cond {
        Ok(())
    } else {
        Err(what.to_string().into())
    }
}
