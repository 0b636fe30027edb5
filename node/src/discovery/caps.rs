//! The driver's `/proc` files that number the MIG capability device nodes, parsed.
//!
//! Facts relied on (`docs/reference/mig.md` §3; NVIDIA container toolkit
//! `internal/nvcaps/nvcaps.go`, libnvidia-container `src/nvc.c`, the MIG user guide "Device Nodes
//! and Capabilities"):
//! - `/proc/devices` has a `<major> nvidia-caps` line under `Character devices:`; the major is
//!   dynamic (235 and 238 are common).
//! - `/proc/driver/nvidia-caps/mig-minors` lists **every possible** capability, one per line:
//!   `config 1`, `monitor 2`, `gpu<G>/gi<g>/access <m>`, `gpu<G>/gi<g>/ci<c>/access <m>`, where
//!   `<G>` is the GPU's minor number, not its NVML index.
//! - An instance exists exactly when `/proc/driver/nvidia/capabilities/gpu<G>/mig/gi<g>/access`
//!   (and `…/gi<g>/ci<c>/access`) exists; each holds `DeviceFileMinor: <m>` and
//!   `DeviceFileMode: <mode>` lines.
//! - The node is `/dev/nvidia-caps/nvidia-cap<m>`, a character device (caps major, `m`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::{inventory::DevNum, inventory::MigCaps};

use mesos_gpu_os::IoError;

/// `/proc/devices`, relative to the proc root.
const PROC_DEVICES: &str = "devices";
/// The capability table, relative to the proc root.
const MIG_MINORS: &str = "driver/nvidia-caps/mig-minors";
/// The per-instance capability files, relative to the proc root.
const CAPABILITIES: &str = "driver/nvidia/capabilities";

/// Why the MIG capability files cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum CapsError {
    /// A file the driver provides could not be read.
    #[error(transparent)]
    Read(IoError),
    /// The driver's two sources disagree about a capability's minor.
    #[error(
        "{file} says DeviceFileMinor {in_file} but {table} lists {capability} as {in_table}; \
         the driver contradicts itself, so no device rule is guessed"
    )]
    Mismatch {
        /// The instance's `access` file.
        file: PathBuf,
        /// The minor it states.
        in_file: u32,
        /// The mig-minors file.
        table: PathBuf,
        /// The capability's name in the table (`gpu0/gi1/access`).
        capability: String,
        /// The minor the table gives.
        in_table: u32,
    },
}

/// What the driver's `/proc` files say about MIG capabilities.
#[derive(Debug, Default)]
pub(crate) struct CapsTable {
    proc_root: PathBuf,
    major: Option<u32>,
    minors: BTreeMap<String, u32>,
}

impl CapsTable {
    /// Reads `devices` and `driver/nvidia-caps/mig-minors` under `proc_root`. A missing file
    /// leaves that part empty (a driver without MIG support has neither); an unreadable one is
    /// an error.
    pub(crate) fn read(proc_root: &Path) -> Result<CapsTable, CapsError> {
        let read = |name: &str| {
            let path = proc_root.join(name);
            match std::fs::read_to_string(&path) {
                Ok(text) => Ok(Some(text)),
                Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(None),
                Err(source) => Err(CapsError::Read(IoError::new("read", path, source))),
            }
        };
        Ok(CapsTable {
            proc_root: proc_root.to_owned(),
            major: read(PROC_DEVICES)?.as_deref().and_then(caps_major),
            minors: read(MIG_MINORS)?
                .as_deref()
                .map(mig_minors)
                .unwrap_or_default(),
        })
    }

    /// The `nvidia-caps` major, when `/proc/devices` lists it.
    pub(crate) fn major(&self) -> Option<u32> {
        self.major
    }

    /// The capabilities of compute instance `ci` of GPU instance `gi` on the GPU with minor
    /// `gpu_minor`: `None` when the instance's `access` files do not exist or the driver's
    /// tables do not number them.
    pub(crate) fn instance(
        &self,
        gpu_minor: u32,
        gi: u32,
        ci: u32,
    ) -> Result<Option<MigCaps>, CapsError> {
        let Some(major) = self.major else {
            return Ok(None);
        };
        let gi_name = format!("gpu{gpu_minor}/gi{gi}/access");
        let ci_name = format!("gpu{gpu_minor}/gi{gi}/ci{ci}/access");
        let gi_file = format!("{CAPABILITIES}/gpu{gpu_minor}/mig/gi{gi}/access");
        let ci_file = format!("{CAPABILITIES}/gpu{gpu_minor}/mig/gi{gi}/ci{ci}/access");
        let (Some(gi_minor), Some(ci_minor)) = (
            self.minor(&gi_name, &gi_file)?,
            self.minor(&ci_name, &ci_file)?,
        ) else {
            return Ok(None);
        };
        Ok(Some(MigCaps {
            gpu_instance: DevNum {
                major,
                minor: gi_minor,
            },
            compute_instance: DevNum {
                major,
                minor: ci_minor,
            },
            gpu_instance_file: gi_file,
            compute_instance_file: ci_file,
        }))
    }

    /// The minor of capability `name` whose instance file is `file`: the table's number, checked
    /// against the file's `DeviceFileMinor`; `None` when the file does not exist (no such
    /// instance) or neither source numbers it.
    fn minor(&self, name: &str, file: &str) -> Result<Option<u32>, CapsError> {
        let path = self.proc_root.join(file);
        let in_file = match std::fs::read_to_string(&path) {
            Ok(text) => device_file_minor(&text),
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => return Err(CapsError::Read(IoError::new("read", path, source))),
        };
        let in_table = self.minors.get(name).copied();
        match (in_table, in_file) {
            (Some(t), Some(f)) if t != f => Err(CapsError::Mismatch {
                file: path,
                in_file: f,
                table: self.proc_root.join(MIG_MINORS),
                capability: name.to_owned(),
                in_table: t,
            }),
            (t, f) => Ok(t.or(f)),
        }
    }
}

/// The `nvidia-caps` major in a `/proc/devices` text.
fn caps_major(text: &str) -> Option<u32> {
    text.lines()
        .take_while(|line| !line.starts_with("Block devices"))
        .find_map(|line| {
            let (major, name) = line.trim().split_once(' ')?;
            (name.trim() == "nvidia-caps").then(|| major.parse().ok())?
        })
}

/// `name minor` lines of `mig-minors`; lines that are not are skipped.
fn mig_minors(text: &str) -> BTreeMap<String, u32> {
    text.lines()
        .filter_map(|line| {
            let (name, minor) = line.trim().rsplit_once(' ')?;
            Some((name.trim().to_owned(), minor.parse().ok()?))
        })
        .collect()
}

/// The `DeviceFileMinor:` of an instance's `access` file.
fn device_file_minor(text: &str) -> Option<u32> {
    text.lines().find_map(|line| {
        line.strip_prefix("DeviceFileMinor:")
            .and_then(|v| v.trim().parse().ok())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_drivers_formats() {
        let devices = "Character devices:\n  1 mem\n195 nvidia\n235 nvidia-caps\n510 nvidia-uvm\n\nBlock devices:\n238 nvidia-caps\n";
        assert_eq!(caps_major(devices), Some(235));
        assert_eq!(caps_major("Character devices:\n195 nvidia\n"), None);
        let minors =
            mig_minors("config 1\nmonitor 2\ngpu0/gi1/access 12\ngpu0/gi1/ci0/access 13\nbroken\n");
        assert_eq!(minors.get("gpu0/gi1/access"), Some(&12));
        assert_eq!(minors.get("gpu0/gi1/ci0/access"), Some(&13));
        assert_eq!(minors.len(), 4);
        assert_eq!(
            device_file_minor("DeviceFileMinor: 13\nDeviceFileMode: 292\nDeviceFileModify: 1\n"),
            Some(13)
        );
    }

    fn write(root: &Path, name: &str, text: &str) {
        let path = root.join(name);
        std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        std::fs::write(path, text).expect("write");
    }

    #[test]
    fn an_instance_needs_its_files_and_agreeing_minors() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path();
        write(
            root,
            "devices",
            "Character devices:\n195 nvidia\n238 nvidia-caps\n",
        );
        write(
            root,
            MIG_MINORS,
            "gpu2/gi1/access 291\ngpu2/gi1/ci0/access 292\n",
        );
        let gi = "driver/nvidia/capabilities/gpu2/mig/gi1/access";
        let ci = "driver/nvidia/capabilities/gpu2/mig/gi1/ci0/access";
        let table = CapsTable::read(root).expect("read");
        assert_eq!(
            table.instance(2, 1, 0).expect("ok"),
            None,
            "no instance files"
        );
        write(root, gi, "DeviceFileMinor: 291\nDeviceFileMode: 292\n");
        write(root, ci, "DeviceFileMinor: 292\nDeviceFileMode: 292\n");
        let caps = table.instance(2, 1, 0).expect("ok").expect("caps");
        assert_eq!(
            caps.gpu_instance,
            DevNum {
                major: 238,
                minor: 291
            }
        );
        assert_eq!(
            caps.compute_instance,
            DevNum {
                major: 238,
                minor: 292
            }
        );
        assert_eq!(caps.compute_instance_file, ci);
        write(root, ci, "DeviceFileMinor: 300\n");
        let err = table.instance(2, 1, 0).expect_err("mismatch");
        assert_eq!(
            err.to_string(),
            format!(
                "{} says DeviceFileMinor 300 but {} lists gpu2/gi1/ci0/access as 292; the driver \
                 contradicts itself, so no device rule is guessed",
                root.join(ci).display(),
                root.join(MIG_MINORS).display()
            )
        );
    }
}
