//! The node's GPUs as a CDI (Container Device Interface) spec, for runtimes that take GPUs as
//! CDI devices (`--device nvidia.com/gpu=0`): Podman ≥ 4.1, containerd, CRI-O, Docker ≥ 25
//! with `features.cdi` (`docs/reference/cdi.md` §4). Mesos has no CDI code; the
//! spec serves the other runtimes of a GPU node with the same devices and driver volume.
//!
//! - [`spec`]: the document as plain serde structs and its minimum `cdiVersion`;
//! - [`node`]: what the node contributes (devices, nodes, driver volume) and the spec built
//!   from it;
//! - [`store`]: the file, written atomically, removed when the GPUs go away, refused beside a
//!   spec that declares the same devices;
//! - [`sync_node`] ties them together for `mesos-gpu cdi generate`, and [`SpecKeeper`] for
//!   `mesos-gpu serve`, which re-runs it at each driver poll.

pub mod node;
pub mod spec;
pub mod store;

use std::sync::Mutex;

use mesos_gpu_node::inventory::Inventory;
use mesos_gpu_volume::VolumeManager;
use serde::Serialize;

pub use node::{
    CdiError, DeviceNumbers, Gathered, GrantEdits, KIND, NodeDevices, SpecSummary, container_edits,
    grant_edits,
};
pub use spec::{CdiVersion, ContainerEdits, Spec};
pub use store::{
    DEFAULT_SPEC_DIRS, DEFAULT_SPEC_PATH, Outcome, SPEC_FILE_NAME, SpecFile, SpecFileError,
    SyncReport,
};

/// Why the spec file could not be brought up to date with the node.
#[derive(Debug, thiserror::Error)]
pub enum CdiSyncError {
    /// The node's devices could not be read or described.
    #[error("cannot describe the node's GPUs as CDI devices")]
    Node(#[from] CdiError),
    /// The file could not be written or removed, or another spec declares the same devices.
    #[error(transparent)]
    File(#[from] SpecFileError),
}

/// The result of one sync: what the file now is, and the spec or why there is none.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NodeSync {
    /// What became of the file.
    #[serde(flatten)]
    pub report: SyncReport,
    /// The spec written (or already there), when the node has GPUs.
    pub spec: Option<SpecSummary>,
    /// Why the node has nothing to declare, when it has not.
    pub no_gpus: Option<String>,
}

/// Makes `file` describe the GPUs of `inventory`: written when they are there, removed when
/// they are gone.
pub fn sync_node(
    inventory: &Inventory,
    numbers: &DeviceNumbers,
    volumes: &VolumeManager,
    file: &SpecFile,
) -> Result<NodeSync, CdiSyncError> {
    match NodeDevices::gather(inventory, numbers, volumes)? {
        Gathered::Devices(devices) => {
            let spec = devices.spec()?;
            let report = file.sync(Some(&spec))?;
            Ok(NodeSync {
                report,
                spec: Some(devices.summary(&spec)),
                no_gpus: None,
            })
        }
        Gathered::NoGpus { reason } => Ok(NodeSync {
            report: file.sync(None)?,
            spec: None,
            no_gpus: Some(reason),
        }),
    }
}

/// Keeps the spec file current for `mesos-gpu serve`; logs a line when what it did or saw
/// changes, not at every poll.
#[derive(Debug)]
pub struct SpecKeeper {
    file: SpecFile,
    numbers: DeviceNumbers,
    volumes: VolumeManager,
    last: Mutex<Option<String>>,
}

impl SpecKeeper {
    /// A keeper of `file` for GPUs whose nodes are read per `numbers`, with driver volumes
    /// under `volumes`.
    pub fn new(file: SpecFile, numbers: DeviceNumbers, volumes: VolumeManager) -> SpecKeeper {
        SpecKeeper {
            file,
            numbers,
            volumes,
            last: Mutex::new(None),
        }
    }

    /// Brings the file up to date with `inventory`, logging the result when it differs from the
    /// previous call's. Errors are logged, never returned: the service goes on.
    pub fn refresh(&self, inventory: &Inventory) {
        let result = sync_node(inventory, &self.numbers, &self.volumes, &self.file);
        let state = match &result {
            Ok(sync) => format!(
                "{:?}|{:?}|{:?}",
                sync.spec, sync.no_gpus, sync.report.overlaps
            ),
            Err(e) => format!("{e:#}"),
        };
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        let changed = last.as_deref() != Some(state.as_str());
        *last = Some(state);
        drop(last);
        let path = self.file.path().display();
        match result {
            Ok(sync) => {
                match (sync.report.outcome, &sync.spec, &sync.no_gpus) {
                    (Outcome::Written, Some(spec), _) => tracing::info!(
                        %path, cdi_version = %spec.cdi_version, devices = spec.devices.len(),
                        numbers = %spec.device_numbers, "wrote the CDI spec"
                    ),
                    (Outcome::Removed, _, Some(reason)) => {
                        tracing::warn!(%path, %reason, "no GPUs: removed the CDI spec")
                    }
                    (Outcome::Absent, _, Some(reason)) if changed => {
                        tracing::info!(%path, %reason, "no GPUs: no CDI spec")
                    }
                    _ => tracing::debug!(%path, outcome = ?sync.report.outcome, "CDI spec checked"),
                }
                if changed {
                    for o in &sync.report.overlaps {
                        let note = if o.ours_wins {
                            "ours has the higher priority and is used for these names"
                        } else {
                            "it has the higher priority: runtimes use it, not ours, for these names"
                        };
                        tracing::warn!(other = %o.path.display(), names = %o.names.join(","), %path, "another CDI spec declares the same devices in another directory; {note}");
                    }
                    for (p, why) in &sync.report.unreadable {
                        tracing::warn!(file = %p.display(), %why, "unreadable CDI spec file; runtimes skip it too");
                    }
                }
            }
            Err(e) if changed && matches!(&e, CdiSyncError::File(f) if f.is_conflict()) => {
                tracing::warn!("{e:#}")
            }
            Err(e) if changed => tracing::error!(%path, "cannot keep the CDI spec current: {e:#}"),
            Err(e) => tracing::debug!(%path, "CDI spec still not current: {e:#}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mesos_gpu_node::{inventory::DriverInfo, inventory::Gpu};

    fn inventory(driver: &str, gpus: u32) -> Inventory {
        Inventory {
            driver: Some(DriverInfo {
                version: driver.to_owned(),
                cuda_version: Some((12, 4)),
            }),
            gpus: (0..gpus)
                .map(|index| Gpu {
                    index,
                    minor: index,
                    uuid: format!("GPU-{index:08x}-0000-0000-0000-000000000000"),
                    name: "Tesla T4".to_owned(),
                    memory_total: 16 << 30,
                    pci_bus_id: format!("00000000:{:02x}:00.0", 0x10 + index),
                    numa_node: None,
                    compute_capability: Some((7, 5)),
                    healthy: true,
                })
                .collect(),
            ..Inventory::default()
        }
    }

    fn written(path: &std::path::Path) -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(path).expect("read spec")).expect("json")
    }

    #[test]
    fn keeper_follows_driver_and_gpus() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("cdi").join(SPEC_FILE_NAME);
        let keeper = SpecKeeper::new(
            SpecFile::new(&path, vec![dir.path().join("cdi")]),
            DeviceNumbers::Computed,
            VolumeManager::at("/volumes"),
        );
        keeper.refresh(&inventory("550.54.14", 2));
        let first = written(&path);
        assert_eq!(
            first["containerEdits"]["mounts"][0]["hostPath"],
            "/volumes/nvidia_550.54.14"
        );
        assert_eq!(first["devices"].as_array().map(Vec::len), Some(5));

        keeper.refresh(&inventory("555.42.02", 2));
        assert_eq!(
            written(&path)["containerEdits"]["mounts"][0]["hostPath"],
            "/volumes/nvidia_555.42.02"
        );
        keeper.refresh(&inventory("555.42.02", 3));
        assert_eq!(written(&path)["devices"].as_array().map(Vec::len), Some(7));

        let gone = Inventory {
            absent_reason: Some("NVIDIA driver not loaded".to_owned()),
            ..Inventory::default()
        };
        keeper.refresh(&gone);
        assert!(!path.exists());
        keeper.refresh(&inventory("555.42.02", 1));
        assert!(path.exists());
    }

    #[test]
    fn sync_reports_why_there_is_no_spec() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = SpecFile::new(dir.path().join(SPEC_FILE_NAME), Vec::new());
        let sync = sync_node(
            &Inventory::default(),
            &DeviceNumbers::Computed,
            &VolumeManager::at("/volumes"),
            &file,
        )
        .expect("sync");
        assert_eq!(sync.report.outcome, Outcome::Absent);
        assert_eq!(sync.no_gpus.as_deref(), Some("NVML lists no GPU"));
        assert!(sync.spec.is_none());
    }
}
