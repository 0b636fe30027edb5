//! A simulated GPU node for tests: a temp directory holding a copy of nvml-sim's
//! `libnvml_sim.so` named `libnvidia-ml.so.1`, its `nvml-sim.json` and an events file.
//!
//! nvml-sim reads the `nvml-sim.json` beside the library file it was loaded from, and each
//! distinct file `dlopen`ed is a separate instance, so every [`SimNode`] is an independent
//! simulated driver even within one test process. A crate using this lists `nvml-sim` as a
//! dev-dependency so that cargo builds the shared library.

use std::fs::{self, OpenOptions};
use std::io::Write as _;
use std::path::{Path, PathBuf};

use tempfile::TempDir;

/// The environment variable naming the built `libnvml_sim.so` to use.
pub const LIB_ENV: &str = "NVML_SIM_LIB";

/// The events file name a [`SimNode`] sets when the description names none.
const EVENTS_FILE: &str = "events";

/// One simulated node in its own temp directory, removed on drop.
#[derive(Debug)]
pub struct SimNode {
    dir: TempDir,
    events: PathBuf,
}

impl SimNode {
    /// A node from a description (the schema in `nvml-sim/README.md`). An `events_file` is
    /// added (`events`, created empty) when the description has none.
    ///
    /// Panics with the reason when the text is not a JSON object or the files cannot be made.
    pub fn from_json(json: &str) -> SimNode {
        let mut value: serde_json::Value = serde_json::from_str(json)
            .unwrap_or_else(|e| panic!("SimNode::from_json: not JSON: {e}"));
        let object = value
            .as_object_mut()
            .unwrap_or_else(|| panic!("SimNode::from_json: not a JSON object"));
        let events_file = object
            .entry("events_file")
            .or_insert_with(|| serde_json::Value::String(EVENTS_FILE.to_owned()))
            .as_str()
            .unwrap_or_else(|| panic!("SimNode::from_json: events_file is not a string"))
            .to_owned();
        let dir = tempfile::Builder::new()
            .prefix("nvml-sim-")
            .tempdir()
            .unwrap_or_else(|e| panic!("SimNode: cannot create a temp dir: {e}"));
        let events = dir.path().join(events_file);
        write(
            &dir.path().join("nvml-sim.json"),
            value.to_string().as_bytes(),
        );
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
        SimNode { dir, events }
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
