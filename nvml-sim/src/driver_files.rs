//! The `/proc` files NVIDIA's kernel driver provides for a node, rendered from its description
//! and written under a chosen root (tests and `--simulate` use a temp directory, never `/proc`).
//!
//! Formats are the driver's (`kernel-open/nvidia/nv-caps.c` in NVIDIA's open kernel modules;
//! the MIG user guide, "Device Nodes and Capabilities"):
//! - `devices`: the kernel's `/proc/devices` (`Character devices:` then `%3d %s` lines), with
//!   major 195 named `nvidia-frontend` (`nvidia` from driver 550.40 on, per the container
//!   toolkit's `devices.go`), and the dynamic `nvidia-uvm` and `nvidia-caps` majors.
//! - `driver/nvidia-caps/mig-minors`: `config 1`, `monitor 2`, then for GPUs 0-31 (by minor
//!   number), GPU instances 0-14 and compute instances 0-7, `gpu<G>/gi<g>/access <m>` and
//!   `gpu<G>/gi<g>/ci<c>/access <m>` for **every possible** instance: the driver numbers its
//!   capability table once at load (`nv_cap_tables_init`: nvlink `fabric-mgmt` 0, then the MIG
//!   table), so `gpu<G>/gi<g>/access` is `3 + 135·G + 9·g` and its `ci<c>` is that `+ 1 + c`
//!   (the guide's last line, `gpu31/gi14/ci7/access 4322`).
//! - `driver/nvidia/capabilities/mig/{config,monitor}` and, for each existing instance,
//!   `driver/nvidia/capabilities/gpu<G>/mig/gi<g>/access` and `…/gi<g>/ci<c>/access`, each
//!   `DeviceFileMinor: <m>\nDeviceFileMode: <mode>\nDeviceFileModify: 1\n` (`nv_cap_procfs_read`;
//!   mode 256 = 0400 for `config`, 292 = 0444 for the rest, as the guide's `ls -l` shows). An
//!   instance exists exactly when its directory does (libnvidia-container's `mig_nvcaps_mknodes`).

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use mesos_gpu_os::{IoError, fsmode};

use crate::config::{self, ConfigError};
use crate::node::Node;

/// GPUs the driver's capability table covers (`gpu0` … `gpu31`).
pub const MAX_GPUS: u32 = 32;
/// GPU instances per GPU in the table (`gi0` … `gi14`).
pub const GPU_INSTANCES: u32 = 15;
/// Compute instances per GPU instance in the table (`ci0` … `ci7`).
pub const COMPUTE_INSTANCES: u32 = 8;
/// Minor of the `mig/config` capability.
pub const CONFIG_MINOR: u32 = 1;
/// Minor of the `mig/monitor` capability.
pub const MONITOR_MINOR: u32 = 2;
/// The major of `/dev/nvidia<N>` and `/dev/nvidiactl`.
pub const NVIDIA_MAJOR: u32 = 195;

/// `DeviceFileMode` of `mig/config` (0400).
const CONFIG_MODE: u32 = 0o400;
/// `DeviceFileMode` of every other MIG capability (0444).
const READ_MODE: u32 = 0o444;

/// The minor of `/dev/nvidia-caps/nvidia-cap<minor>` guarding GPU instance `gi` (and, with
/// `ci`, its compute instance) of the GPU with minor number `gpu_minor`; `None` outside the
/// driver's table.
pub fn mig_cap_minor(gpu_minor: u32, gi: u32, ci: Option<u32>) -> Option<u32> {
    if gpu_minor >= MAX_GPUS || gi >= GPU_INSTANCES || ci.is_some_and(|c| c >= COMPUTE_INSTANCES) {
        return None;
    }
    let per_gi = 1 + COMPUTE_INSTANCES;
    let gi_minor = MONITOR_MINOR + 1 + gpu_minor * GPU_INSTANCES * per_gi + gi * per_gi;
    Some(ci.map_or(gi_minor, |c| gi_minor + 1 + c))
}

/// One file: its path relative to the proc root, and its contents.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DriverFile {
    /// E.g. `driver/nvidia-caps/mig-minors`.
    pub path: PathBuf,
    /// The whole text.
    pub contents: String,
}

/// Why the driver files could not be written.
#[derive(Debug, thiserror::Error)]
pub enum DriverFilesError {
    /// The node description is not valid.
    #[error("invalid node description")]
    Config {
        /// What is wrong with it.
        #[source]
        source: ConfigError,
    },
    /// Creating, removing or writing under the root failed.
    #[error(transparent)]
    Write(IoError),
}

/// The driver files of the node a description describes.
pub fn render(json: &str) -> Result<Vec<DriverFile>, ConfigError> {
    Ok(render_node(&config::parse(json, Path::new("."))?))
}

fn capability(minor: u32, mode: u32) -> String {
    format!("DeviceFileMinor: {minor}\nDeviceFileMode: {mode}\nDeviceFileModify: 1\n")
}

/// `nvidia` from driver 550.40 on, else `nvidia-frontend`.
fn frontend_name(driver_version: &str) -> &'static str {
    let mut parts = driver_version
        .split('.')
        .map(|p| p.parse::<u32>().unwrap_or(0));
    let (major, minor) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    if (major, minor) >= (550, 40) {
        "nvidia"
    } else {
        "nvidia-frontend"
    }
}

pub(crate) fn render_node(node: &Node) -> Vec<DriverFile> {
    let file = |path: &str, contents: String| DriverFile {
        path: PathBuf::from(path),
        contents,
    };
    let mut chars: Vec<(u32, &str)> = vec![
        (1, "mem"),
        (4, "tty"),
        (5, "/dev/tty"),
        (10, "misc"),
        (136, "pts"),
        (NVIDIA_MAJOR, frontend_name(&node.driver_version)),
        (node.proc_devices.nvidia_caps, "nvidia-caps"),
        (node.proc_devices.nvidia_uvm, "nvidia-uvm"),
    ];
    chars.sort();
    let mut devices = String::from("Character devices:\n");
    for (major, name) in chars {
        devices.push_str(&format!("{major:3} {name}\n"));
    }
    devices.push_str("\nBlock devices:\n  7 loop\n  8 sd\n");

    let mut minors = format!("config {CONFIG_MINOR}\nmonitor {MONITOR_MINOR}\n");
    for gpu in 0..MAX_GPUS {
        for gi in 0..GPU_INSTANCES {
            let m = mig_cap_minor(gpu, gi, None).unwrap_or_default();
            minors.push_str(&format!("gpu{gpu}/gi{gi}/access {m}\n"));
            for ci in 0..COMPUTE_INSTANCES {
                let m = mig_cap_minor(gpu, gi, Some(ci)).unwrap_or_default();
                minors.push_str(&format!("gpu{gpu}/gi{gi}/ci{ci}/access {m}\n"));
            }
        }
    }
    let caps = "driver/nvidia/capabilities";
    let mut files = vec![
        file("devices", devices),
        file("driver/nvidia-caps/mig-minors", minors),
        file(
            &format!("{caps}/mig/config"),
            capability(CONFIG_MINOR, CONFIG_MODE),
        ),
        file(
            &format!("{caps}/mig/monitor"),
            capability(MONITOR_MINOR, READ_MODE),
        ),
    ];
    for g in &node.gpus {
        let Some(mig) = g.mig.as_ref().filter(|m| m.enabled()) else {
            continue;
        };
        for gi in &mig.gpu_instances {
            if let Some(m) = mig_cap_minor(g.minor, gi.id, None) {
                let dir = format!("{caps}/gpu{}/mig/gi{}", g.minor, gi.id);
                files.push(file(&format!("{dir}/access"), capability(m, READ_MODE)));
                for ci in &gi.compute_instances {
                    if let Some(m) = mig_cap_minor(g.minor, gi.id, Some(ci.id)) {
                        files.push(file(
                            &format!("{dir}/ci{}/access", ci.id),
                            capability(m, READ_MODE),
                        ));
                    }
                }
            }
        }
    }
    files
}

/// Writes the node's driver files under `proc_root` (which stands for `/proc`), first
/// removing `driver/nvidia/capabilities` there so instances that no longer exist disappear;
/// returns the paths written.
pub fn write(json: &str, proc_root: &Path) -> Result<Vec<PathBuf>, DriverFilesError> {
    let files = render(json).map_err(|source| DriverFilesError::Config { source })?;
    let wrap = |path: &Path| {
        let path = path.to_owned();
        move |source| DriverFilesError::Write(IoError::new("write", path, source))
    };
    let caps = proc_root.join("driver/nvidia/capabilities");
    match fs::remove_dir_all(&caps) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(wrap(&caps)(e)),
    }
    let mut written = Vec::with_capacity(files.len());
    for f in files {
        let path = proc_root.join(&f.path);
        if let Some(dir) = path.parent() {
            fsmode::create_dir_all(dir, fsmode::STATE_DIR).map_err(wrap(dir))?;
        }
        fsmode::write_file(&path, f.contents.as_bytes(), fsmode::STATE_FILE)
            .map_err(wrap(&path))?;
        written.push(path);
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minors_follow_the_driver_table() {
        assert_eq!(mig_cap_minor(0, 0, None), Some(3));
        assert_eq!(mig_cap_minor(0, 0, Some(0)), Some(4));
        assert_eq!(mig_cap_minor(0, 1, None), Some(12));
        assert_eq!(mig_cap_minor(0, 1, Some(0)), Some(13));
        assert_eq!(mig_cap_minor(1, 0, None), Some(138));
        assert_eq!(mig_cap_minor(31, 14, Some(7)), Some(4322));
        assert_eq!(mig_cap_minor(32, 0, None), None);
        assert_eq!(mig_cap_minor(0, 15, None), None);
        assert_eq!(mig_cap_minor(0, 0, Some(8)), None);
    }

    #[test]
    fn frontend_name_changed_in_550_40() {
        assert_eq!(frontend_name("535.161.08"), "nvidia-frontend");
        assert_eq!(frontend_name("550.40.07"), "nvidia");
        assert_eq!(frontend_name("550.54.14"), "nvidia");
        assert_eq!(frontend_name("470.256.02"), "nvidia-frontend");
    }
}
