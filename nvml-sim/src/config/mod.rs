//! Reading and validating a node description (the JSON schema in `nvml-sim/README.md`).

mod mig;
mod numa;
mod schema;
mod validate;

use std::path::Path;

use mesos_gpu_os::io::{IoContext as _, IoError};

use crate::node::Node;

/// Why a node description cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error(transparent)]
    Read(IoError),
    /// Not JSON, or JSON that does not fit the schema (unknown or missing field, wrong type).
    #[error("not a node description")]
    Json {
        /// serde's error, with line and column.
        #[source]
        source: serde_json::Error,
    },
    /// A field has a value outside what is accepted.
    #[error("{field} = {value:?}: expected {expected}")]
    Field {
        /// Where the field is, e.g. `gpu 3 pci.bus_id`.
        field: String,
        /// The value found.
        value: String,
        /// What is accepted.
        expected: String,
    },
    /// Two GPUs claim the same index.
    #[error("GPU index {index} appears twice")]
    DuplicateIndex {
        /// The index.
        index: u32,
    },
    /// NVML indices run from 0 to count - 1; one is missing.
    #[error("GPU indices must run from 0 to {last} without gaps, but {missing} is missing")]
    IndexGap {
        /// The largest index a node of this size has.
        last: u32,
        /// The first absent index.
        missing: u32,
    },
    /// Two GPUs (or a GPU and an NVSwitch) share a value that must be unique.
    #[error("{what} {value} is used twice ({first} and {second})")]
    Duplicate {
        /// What is duplicated (`minor number`, `UUID`, `PCI bus id`).
        what: &'static str,
        /// The shared value.
        value: String,
        /// The first holder.
        first: String,
        /// The second holder.
        second: String,
    },
    /// An NVLink entry that cannot be wired.
    #[error("GPU {gpu} nvlinks: {problem}")]
    NvLink {
        /// The GPU listing the link.
        gpu: u32,
        /// What is wrong.
        problem: String,
    },
    /// Two GPUs disagree about the NVLinks between them.
    #[error(
        "NVLinks are asymmetric: GPU {a} lists {a_to_b} to GPU {b}, but GPU {b} lists {b_to_a} to GPU {a}"
    )]
    Asymmetric {
        /// One GPU.
        a: u32,
        /// The other GPU.
        b: u32,
        /// What `a` says.
        a_to_b: String,
        /// What `b` says.
        b_to_a: String,
    },
    /// The PCIe placements do not form a tree.
    #[error(
        "PCIe {what} {id:?} is placed inconsistently: GPU {first} has {first_path}, GPU {second} has {second_path}"
    )]
    PcieTree {
        /// `switch` or `host bridge`.
        what: &'static str,
        /// Its id.
        id: String,
        /// A GPU placing it one way.
        first: u32,
        /// That GPU's view of its parents (or socket).
        first_path: String,
        /// A GPU placing it another way.
        second: u32,
        /// That GPU's view.
        second_path: String,
    },
    /// A MIG layout the GPU could not have.
    #[error("GPU {gpu} mig: {problem}")]
    Mig {
        /// The GPU.
        gpu: u32,
        /// What is wrong.
        problem: String,
    },
    /// A `fail` entry names a function the sim does not export at that level.
    #[error("{scope} fail: unknown function {function:?}; accepted: {accepted}")]
    UnknownFunction {
        /// `node` or `GPU n`.
        scope: String,
        /// The name given.
        function: String,
        /// The names accepted there.
        accepted: String,
    },
}

/// Checks a node description without loading it; relative paths in it are not resolved.
pub fn validate(json: &str) -> Result<(), ConfigError> {
    parse(json, Path::new(".")).map(|_| ())
}

/// Reads and validates the node description at `path`; relative paths in it are relative to
/// the file's directory.
pub(crate) fn load(path: &Path) -> Result<Node, ConfigError> {
    let text = std::fs::read_to_string(path)
        .at("read", path)
        .map_err(ConfigError::Read)?;
    parse(&text, path.parent().unwrap_or(Path::new(".")))
}

/// Parses and validates a node description; `base` resolves a relative `events_file`.
pub(crate) fn parse(json: &str, base: &Path) -> Result<Node, ConfigError> {
    let spec: schema::NodeSpec =
        serde_json::from_str(json).map_err(|source| ConfigError::Json { source })?;
    validate::node(spec, base)
}
