//! A simulated GPU node for tests: a temp directory holding a copy of nvml-sim's
//! `libnvml_sim.so` named `libnvidia-ml.so.1`, its `nvml-sim.json`, an events file, a runtime
//! state file and, under `proc/`, the `/proc` files NVIDIA's driver would provide for the node
//! (`/proc/devices`, `driver/nvidia-caps/mig-minors`, `driver/nvidia/capabilities/…`).
//!
//! nvml-sim reads the `nvml-sim.json` beside the library file it was loaded from, and each
//! distinct file `dlopen`ed is a separate instance, so every [`SimNode`] is an independent
//! simulated driver even within one test process. A crate using this lists `nvml-sim` as a
//! dev-dependency so that cargo builds the shared library.

use std::fs::{self, OpenOptions};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use mesos_gpu_node::inventory::Inventory;
use mesos_gpu_node::{discovery::Discovery, discovery::GpuDriver};
use tempfile::TempDir;

/// The environment variable naming the built `libnvml_sim.so` to use.
pub const LIB_ENV: &str = "NVML_SIM_LIB";

/// The events file name a [`SimNode`] sets when the description names none.
const EVENTS_FILE: &str = "events";

/// The runtime state file name a [`SimNode`] sets when the description names none.
const STATE_FILE: &str = "state.json";

/// The directory under a [`SimNode`]'s directory that stands for `/proc`.
const PROC_DIR: &str = "proc";

/// One simulated node in its own temp directory, removed on drop.
#[derive(Debug)]
pub struct SimNode {
    dir: TempDir,
    events: PathBuf,
    state: PathBuf,
}

impl SimNode {
    /// A node from a description (the schema in `nvml-sim/README.md`). An `events_file`
    /// (`events`, created empty) and a `state_file` (`state.json`) are added when the
    /// description names none, and the driver's `/proc` files are written under
    /// [`SimNode::proc_root`].
    ///
    /// Panics with the reason when the text is not a JSON object or the files cannot be made.
    pub fn from_json(json: &str) -> SimNode {
        let dir = tempfile::Builder::new()
            .prefix("nvml-sim-")
            .tempdir()
            .unwrap_or_else(|e| panic!("SimNode: cannot create a temp dir: {e}"));
        let (events, state) = write_description(dir.path(), json);
        if !events.exists() {
            write(&events, b"");
        }
        let lib = sim_library();
        let copy = dir.path().join("libnvidia-ml.so.1");
        fs::copy(&lib, &copy).unwrap_or_else(|e| {
            panic!(
                "SimNode: cannot copy {} to {}: {e}",
                lib.display(),
                copy.display()
            )
        });
        SimNode { dir, events, state }
    }

    /// Replaces the node description (and the driver's `/proc` files) as a driver reload with a
    /// new configuration would; clients see it at their next first `nvmlInit`. The events and
    /// state files keep their names unless the new description names others.
    pub fn set_description(&mut self, json: &str) {
        let (events, state) = write_description(self.dir.path(), json);
        self.events = events;
        self.state = state;
    }

    /// The directory standing for `/proc`: `devices`, `driver/nvidia-caps/mig-minors` and
    /// `driver/nvidia/capabilities/…` as NVIDIA's driver provides them for this node.
    pub fn proc_root(&self) -> PathBuf {
        self.dir.path().join(PROC_DIR)
    }

    /// The runtime state file (compute modes set through NVML, processes set by tests).
    pub fn state_path(&self) -> PathBuf {
        self.state.clone()
    }

    /// Sets the compute processes `(pid, used bytes)` NVML reports for the GPU or MIG device
    /// with this UUID, replacing the description's list (seen by every client at its next call).
    pub fn set_processes(&self, uuid: &str, processes: &[(u32, u64)]) {
        let list: Vec<nvml_sim::runtime::RuntimeProcess> = processes
            .iter()
            .map(|&(pid, used_memory)| nvml_sim::runtime::RuntimeProcess { pid, used_memory })
            .collect();
        nvml_sim::runtime::set_processes(&self.state, uuid, &list)
            .unwrap_or_else(|e| panic!("SimNode: cannot set processes of {uuid}: {e:?}"));
    }

    /// A node from `nvml-sim/topologies/<name>.json` in this workspace.
    pub fn shipped(name: &str) -> SimNode {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../nvml-sim/topologies")
            .join(format!("{name}.json"));
        let json = fs::read_to_string(&path).unwrap_or_else(|e| {
            panic!(
                "SimNode::shipped({name:?}): cannot read {}: {e}",
                path.display()
            )
        });
        SimNode::from_json(&json)
    }

    /// The library to load as NVML: `<dir>/libnvidia-ml.so.1`.
    pub fn lib_path(&self) -> PathBuf {
        self.dir.path().join("libnvidia-ml.so.1")
    }

    /// The node description: `<dir>/nvml-sim.json`.
    pub fn config_path(&self) -> PathBuf {
        self.dir.path().join("nvml-sim.json")
    }

    /// The events file the simulated driver reads.
    pub fn events_path(&self) -> PathBuf {
        self.events.clone()
    }

    /// The node's temp directory.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Appends one line (e.g. `xid 3 79`) to the events file, in a single write.
    pub fn append_event(&self, line: &str) {
        let mut file = OpenOptions::new()
            .append(true)
            .create(true)
            .open(&self.events)
            .unwrap_or_else(|e| panic!("SimNode: cannot open {}: {e}", self.events.display()));
        let text = format!("{}\n", line.trim_end_matches('\n'));
        file.write_all(text.as_bytes())
            .unwrap_or_else(|e| panic!("SimNode: cannot append to {}: {e}", self.events.display()));
    }

    /// What the node reports, discovered as the module does: through its library and its
    /// driver `/proc` files (so MIG devices come with their capability nodes).
    pub fn inventory(&self) -> Result<Inventory, String> {
        match GpuDriver::open_at(Some(&self.lib_path()), &self.proc_root()) {
            Ok(Discovery::Driver(driver)) => Ok(driver.inventory().clone()),
            Ok(Discovery::NoDriver(_)) => Err(format!(
                "nvml-sim did not load from {}",
                self.lib_path().display()
            )),
            Err(e) => Err(format!("discovery on {}: {e}", self.dir().display())),
        }
    }
}

/// A GPU health checkpoint (`<work_dir>/gpu/health.json`, version 1) of the shipped node
/// The description of the shipped node `name` (`nvml-sim/topologies/<name>.json`), to change
/// before writing it as a node of a test's own.
///
/// Panics with the reason when it cannot be read.
pub fn shipped_description(name: &str) -> serde_json::Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../nvml-sim/topologies")
        .join(format!("{name}.json"));
    fs::read_to_string(&path)
        .map_err(|e| e.to_string())
        .and_then(|text| serde_json::from_str(&text).map_err(|e| e.to_string()))
        .unwrap_or_else(|e| panic!("shipped_description({name:?}): {}: {e}", path.display()))
}

/// `name` (`nvml-sim/topologies/<name>.json`) in which GPU `failed` (an NVML index) is unhealthy
/// after XID 79 and every other GPU healthy.
///
/// Panics with the reason when the node cannot be read.
pub fn health_checkpoint(name: &str, failed: u32) -> serde_json::Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../nvml-sim/topologies")
        .join(format!("{name}.json"));
    let text = fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("health_checkpoint({name:?}): {}: {e}", path.display()));
    let node: serde_json::Value = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("health_checkpoint({name:?}): {}: {e}", path.display()));
    let gpus: Vec<serde_json::Value> = node["gpus"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|g| {
            let health = if g["index"] == failed {
                serde_json::json!({"state": "unhealthy", "reason": {"kind": "xid", "xid": 79},
                       "since_ms": 1, "last_error_ms": 1, "errors": 1})
            } else {
                serde_json::json!({"state": "healthy"})
            };
            serde_json::json!({"index": g["index"], "uuid": g["uuid"], "xids": {},
                   "ecc_single_bit": 0, "ecc_double_bit": 0, "health": health})
        })
        .collect();
    serde_json::json!({"version": 1, "gpus": gpus})
}

/// Makes both capability nodes of every MIG device of `inventory` under `<dev>/nvidia-caps`
/// (`mknod <node> c <nvidia-caps major> <minor>`, root only); returns each node's path once.
pub fn mknod_mig_caps(dev: &Path, inventory: &Inventory) -> Result<Vec<PathBuf>, String> {
    let mut made = Vec::new();
    if inventory.mig.devices.is_empty() {
        return Ok(made);
    }
    let dir = dev.join("nvidia-caps");
    fs::create_dir_all(&dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
    for d in &inventory.mig.devices {
        let caps = d
            .caps
            .as_ref()
            .ok_or_else(|| format!("MIG device {} has no capability nodes", d.uuid))?;
        for cap in [caps.gpu_instance, caps.compute_instance] {
            let path = dir.join(format!("nvidia-cap{}", cap.minor));
            if made.contains(&path) {
                continue;
            }
            let out = Command::new("mknod")
                .arg(&path)
                .args(["c", &cap.major.to_string(), &cap.minor.to_string()])
                .output()
                .map_err(|e| format!("run mknod: {e}"))?;
            if !out.status.success() {
                return Err(format!(
                    "mknod {}: {}",
                    path.display(),
                    String::from_utf8_lossy(&out.stderr).trim()
                ));
            }
            made.push(path);
        }
    }
    Ok(made)
}

/// Writes `nvml-sim.json` (with events and state files added when absent) and the driver
/// files into `dir`; returns the events and state paths.
fn write_description(dir: &Path, json: &str) -> (PathBuf, PathBuf) {
    let mut value: serde_json::Value = serde_json::from_str(json)
        .unwrap_or_else(|e| panic!("SimNode: description is not JSON: {e}"));
    let object = value
        .as_object_mut()
        .unwrap_or_else(|| panic!("SimNode: description is not a JSON object"));
    let mut file = |key: &str, default: &str| -> PathBuf {
        let name = object
            .entry(key)
            .or_insert_with(|| serde_json::Value::String(default.to_owned()))
            .as_str()
            .unwrap_or_else(|| panic!("SimNode: {key} is not a string"))
            .to_owned();
        dir.join(name)
    };
    let events = file("events_file", EVENTS_FILE);
    let state = file("state_file", STATE_FILE);
    let text = value.to_string();
    write(&dir.join("nvml-sim.json"), text.as_bytes());
    // A description nvml-sim rejects still gets written (tests of broken descriptions need
    // it); it just has no driver files.
    if nvml_sim::validate(&text).is_ok() {
        nvml_sim::driver_files::write(&text, &dir.join(PROC_DIR))
            .unwrap_or_else(|e| panic!("SimNode: cannot write the driver files: {e:?}"));
    }
    (events, state)
}

fn write(path: &Path, bytes: &[u8]) {
    fs::write(path, bytes)
        .unwrap_or_else(|e| panic!("SimNode: cannot write {}: {e}", path.display()));
}

/// The built `libnvml_sim.so`: `$NVML_SIM_LIB`, else beside the current executable, in its
/// `deps/` subdirectory or in its parent directory (test binaries run from `target/<profile>/deps`).
///
/// Panics, saying how to build it, when none exists.
pub fn sim_library() -> PathBuf {
    if let Some(path) = std::env::var_os(LIB_ENV) {
        let path = PathBuf::from(path);
        assert!(
            path.is_file(),
            "{LIB_ENV}={} does not name a file",
            path.display()
        );
        return path;
    }
    let exe =
        std::env::current_exe().unwrap_or_else(|e| panic!("cannot find the test executable: {e}"));
    let dir = exe.parent().unwrap_or(Path::new("."));
    let candidates = [
        dir.join("libnvml_sim.so"),
        dir.join("deps/libnvml_sim.so"),
        dir.join("../libnvml_sim.so"),
        // Example binaries live in `target/<profile>/examples/`.
        dir.join("../deps/libnvml_sim.so"),
    ];
    candidates.iter().find(|p| p.is_file()).cloned().unwrap_or_else(|| {
        panic!(
            "libnvml_sim.so not found (looked at {}); build it with `cargo build -p nvml-sim`, list nvml-sim \
             as a dev-dependency of the crate under test, or set {LIB_ENV}",
            candidates.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
        )
    })
}
