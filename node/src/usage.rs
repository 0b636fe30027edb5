//! What a container's GPUs are doing: NVML's live figures per GPU, and the memory used by the
//! container's own processes.
//!
//! Facts relied on:
//! - NVML: `nvmlDeviceGetUtilizationRates` (percent busy over the last sample period, whole
//!   GPU), `nvmlDeviceGetMemoryInfo_v2`, `nvmlDeviceGetTemperature`, `nvmlDeviceGetPowerUsage`
//!   (mW) and `nvmlDeviceGetComputeRunningProcesses_v3` (host pids with the framebuffer memory
//!   each uses; `NVML_VALUE_NOT_AVAILABLE` when the driver cannot say). Each answers
//!   `NOT_SUPPORTED` on parts without the sensor; such figures are `None`, never guessed.
//! - `/proc/<pid>/cgroup` (proc(5), cgroups(7)) lists `hierarchy-ID:controllers:path`; cgroup v1
//!   has a line whose controllers include `devices`, cgroup v2 the line `0::path`. A process
//!   belongs to a container when that path is the container's cgroup or below it (nested
//!   containers and sub-cgroups). Paths are as seen from the reader's cgroup namespace, the
//!   host's for the agent.
//! - GPUs are granted whole, so a GPU's utilisation is the container's; memory is summed over
//!   the container's processes only, so a stray process of another cgroup is not counted.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use nvml_wrapper::enum_wrappers::device::{
    Clock, EccCounter, MemoryError, MemoryLocation, PcieUtilCounter, TemperatureSensor,
};
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::error::NvmlError;
use serde::Serialize;

use crate::discovery::GpuDriver;
use crate::inventory::Gpu;

use mesos_gpu_os::IoError;

/// Why a container's processes could not be told apart.
#[derive(Debug, thiserror::Error)]
pub(crate) enum UsageError {
    /// `/proc/<pid>/cgroup` exists but cannot be read.
    #[error(transparent)]
    ProcCgroup(IoError),
}

/// Where a container's processes live.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ContainerCgroup {
    /// cgroup v1: the container's path in the `devices` hierarchy, e.g. `/mesos/<id>`.
    V1 {
        /// Path below the hierarchy root.
        devices: String,
    },
    /// cgroup v2: the container's path below the cgroup2 mount, e.g. `/mesos/<id>`.
    V2 {
        /// Path below the mount.
        path: String,
    },
}

/// A process NVML sees on a GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct GpuProcess {
    /// Host pid.
    pub pid: u32,
    /// Framebuffer bytes it uses; `None` when NVML cannot say.
    pub used_memory: Option<u64>,
}

/// One GPU's live figures, read from NVML; each `None` when NVML does not have it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct GpuReadings {
    /// NVML index.
    pub index: u32,
    /// UUID.
    pub uuid: String,
    /// True when NVML answered `GPU_IS_LOST`.
    pub lost: bool,
    /// Percent of time a kernel ran.
    pub utilization_gpu: Option<u32>,
    /// Percent of time memory was read or written.
    pub utilization_memory: Option<u32>,
    /// Framebuffer bytes in use.
    pub memory_used: Option<u64>,
    /// Framebuffer bytes in all.
    pub memory_total: Option<u64>,
    /// Degrees Celsius.
    pub temperature_c: Option<u32>,
    /// Milliwatts.
    pub power_mw: Option<u32>,
    /// Compute processes.
    pub processes: Option<Vec<GpuProcess>>,
}

fn known<T>(
    gpu: u32,
    what: &'static str,
    result: Result<T, NvmlError>,
    lost: &mut bool,
) -> Option<T> {
    match result {
        Ok(value) => Some(value),
        Err(error) => {
            *lost |= matches!(error, NvmlError::GpuLost);
            tracing::debug!(gpu, what, %error, "GPU figure unknown");
            None
        }
    }
}

impl GpuReadings {
    /// Reads `gpu`'s figures now, through `driver`'s NVML session.
    pub fn read(driver: &GpuDriver, gpu: &Gpu) -> GpuReadings {
        let nvml = driver.nvml();
        let mut lost = false;
        let mut readings = GpuReadings {
            index: gpu.index,
            uuid: gpu.uuid.clone(),
            ..GpuReadings::default()
        };
        let Some(device) = known(
            gpu.index,
            "handle",
            nvml.device_by_index(gpu.index),
            &mut lost,
        ) else {
            readings.lost = lost;
            return readings;
        };
        let i = gpu.index;
        if let Some(u) = known(i, "utilization", device.utilization_rates(), &mut lost) {
            readings.utilization_gpu = Some(u.gpu);
            readings.utilization_memory = Some(u.memory);
        }
        if let Some(m) = known(i, "memory", device.memory_info(), &mut lost) {
            readings.memory_used = Some(m.used);
            readings.memory_total = Some(m.total);
        }
        readings.temperature_c = known(
            i,
            "temperature",
            device.temperature(TemperatureSensor::Gpu),
            &mut lost,
        );
        readings.power_mw = known(i, "power", device.power_usage(), &mut lost);
        readings.processes = known(
            i,
            "processes",
            device.running_compute_processes(),
            &mut lost,
        )
        .map(|list| {
            list.iter()
                .map(|p| GpuProcess {
                    pid: p.pid,
                    used_memory: match p.used_gpu_memory {
                        UsedGpuMemory::Used(bytes) => Some(bytes),
                        UsedGpuMemory::Unavailable => None,
                    },
                })
                .collect()
        });
        readings.lost = lost;
        readings
    }
}

/// The rest of a GPU's figures, those nvidia-docker's `/gpu/info` and `/gpu/status` pages show
/// (NVML API reference for the units); each `None` when NVML does not have it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct GpuDetailReadings {
    /// Power management limit, mW.
    pub power_limit_mw: Option<u32>,
    /// BAR1 bytes in all.
    pub bar1_total: Option<u64>,
    /// BAR1 bytes in use.
    pub bar1_used: Option<u64>,
    /// Graphics clock now, MHz.
    pub graphics_clock_mhz: Option<u32>,
    /// Memory clock now, MHz.
    pub memory_clock_mhz: Option<u32>,
    /// Highest graphics clock, MHz.
    pub max_graphics_clock_mhz: Option<u32>,
    /// Highest memory clock, MHz.
    pub max_memory_clock_mhz: Option<u32>,
    /// ECC mode now.
    pub ecc_enabled: Option<bool>,
    /// Volatile uncorrected ECC errors in the L1 caches.
    pub ecc_uncorrected_l1: Option<u64>,
    /// Volatile uncorrected ECC errors in the L2 cache.
    pub ecc_uncorrected_l2: Option<u64>,
    /// Volatile uncorrected ECC errors in device memory.
    pub ecc_uncorrected_device: Option<u64>,
    /// Encoder utilisation, percent.
    pub encoder_percent: Option<u32>,
    /// Decoder utilisation, percent.
    pub decoder_percent: Option<u32>,
    /// PCIe receive throughput, KB/s.
    pub pcie_rx_kbs: Option<u32>,
    /// PCIe send throughput, KB/s.
    pub pcie_tx_kbs: Option<u32>,
}

impl GpuDetailReadings {
    /// Reads `gpu`'s detail figures now, through `driver`'s NVML session.
    pub fn read(driver: &GpuDriver, gpu: &Gpu) -> GpuDetailReadings {
        let i = gpu.index;
        let Some(d) = detail(i, "handle", driver.nvml().device_by_index(i)) else {
            return GpuDetailReadings::default();
        };
        let bar1 = detail(i, "BAR1", d.bar1_memory_info());
        let ecc = |at| {
            let counter = MemoryError::Uncorrected;
            detail(
                i,
                "ECC errors",
                d.memory_error_counter(counter, EccCounter::Volatile, at),
            )
        };
        GpuDetailReadings {
            power_limit_mw: detail(i, "power limit", d.power_management_limit()),
            bar1_total: bar1.as_ref().map(|b| b.total),
            bar1_used: bar1.as_ref().map(|b| b.used),
            graphics_clock_mhz: detail(i, "clock", d.clock_info(Clock::Graphics)),
            memory_clock_mhz: detail(i, "mem clock", d.clock_info(Clock::Memory)),
            max_graphics_clock_mhz: detail(i, "max clock", d.max_clock_info(Clock::Graphics)),
            max_memory_clock_mhz: detail(i, "max mem clock", d.max_clock_info(Clock::Memory)),
            ecc_enabled: detail(i, "ECC mode", d.is_ecc_enabled()).map(|m| m.currently_enabled),
            ecc_uncorrected_l1: ecc(MemoryLocation::L1Cache),
            ecc_uncorrected_l2: ecc(MemoryLocation::L2Cache),
            ecc_uncorrected_device: ecc(MemoryLocation::Device),
            encoder_percent: detail(i, "encoder", d.encoder_utilization()).map(|u| u.utilization),
            decoder_percent: detail(i, "decoder", d.decoder_utilization()).map(|u| u.utilization),
            pcie_rx_kbs: detail(i, "PCIe rx", d.pcie_throughput(PcieUtilCounter::Receive)),
            pcie_tx_kbs: detail(i, "PCIe tx", d.pcie_throughput(PcieUtilCounter::Send)),
        }
    }
}

/// A detail figure, `None` (logged) when NVML does not have it.
fn detail<T>(gpu: u32, what: &'static str, result: Result<T, NvmlError>) -> Option<T> {
    known(gpu, what, result, &mut false)
}

/// One GPU of a container and what the container does with it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GpuUsage {
    /// NVML index.
    pub index: u32,
    /// UUID.
    pub uuid: String,
    /// Whole-GPU kernel utilisation, percent (the container holds the GPU alone).
    pub utilization_gpu: Option<u32>,
    /// Whole-GPU memory-controller utilisation, percent.
    pub utilization_memory: Option<u32>,
    /// Framebuffer bytes used by the container's processes; `None` when any is unknown.
    pub memory_used: Option<u64>,
    /// Framebuffer bytes in all.
    pub memory_total: Option<u64>,
    /// The container's processes on this GPU; `None` when NVML cannot list processes.
    pub pids: Option<Vec<u32>>,
}

/// A container's GPUs and their use.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ContainerUsage {
    /// One entry per GPU held, by index.
    pub gpus: Vec<GpuUsage>,
}

/// Tells a container's processes from others through `/proc`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageReader {
    proc_root: PathBuf,
}

impl Default for UsageReader {
    fn default() -> UsageReader {
        UsageReader::at(Path::new("/proc"))
    }
}

impl UsageReader {
    /// A reader over the proc file system mounted at `proc_root` (`/proc` on a host).
    pub fn at(proc_root: &Path) -> UsageReader {
        UsageReader {
            proc_root: proc_root.to_owned(),
        }
    }

    /// Whether process `pid` is in `cgroup` or below it; `Ok(false)` when it has exited.
    pub(crate) fn in_cgroup(&self, pid: u32, cgroup: &ContainerCgroup) -> Result<bool, UsageError> {
        let path = self.proc_root.join(pid.to_string()).join("cgroup");
        match fs::read_to_string(&path) {
            Ok(text) => Ok(cgroup_matches(&text, cgroup)),
            Err(e)
                if matches!(e.kind(), io::ErrorKind::NotFound)
                    || e.raw_os_error() == Some(libc::ESRCH) =>
            {
                Ok(false)
            }
            Err(source) => Err(UsageError::ProcCgroup(IoError::new("read", path, source))),
        }
    }

    /// The use the container in `cgroup` makes of `gpus` (the GPUs it holds), read now.
    pub fn container_usage(
        &self,
        driver: &GpuDriver,
        gpus: &[Gpu],
        cgroup: &ContainerCgroup,
    ) -> ContainerUsage {
        ContainerUsage {
            gpus: gpus
                .iter()
                .map(|gpu| self.attribute(&GpuReadings::read(driver, gpu), cgroup))
                .collect(),
        }
    }

    /// The container's share of one GPU's readings.
    pub fn attribute(&self, readings: &GpuReadings, cgroup: &ContainerCgroup) -> GpuUsage {
        let mut pids = Vec::new();
        let mut memory: Option<u64> = Some(0);
        let processes = readings.processes.as_ref();
        for p in processes.into_iter().flatten() {
            match self.in_cgroup(p.pid, cgroup) {
                Ok(false) => {}
                Ok(true) => {
                    pids.push(p.pid);
                    memory = memory.zip(p.used_memory).map(|(a, b)| a.saturating_add(b));
                }
                Err(error) => {
                    tracing::debug!(pid = p.pid, error = %error, "cannot tell whose process this is");
                    memory = None;
                }
            }
        }
        GpuUsage {
            index: readings.index,
            uuid: readings.uuid.clone(),
            utilization_gpu: readings.utilization_gpu,
            utilization_memory: readings.utilization_memory,
            memory_used: processes.and(memory),
            memory_total: readings.memory_total,
            pids: processes.map(|_| pids),
        }
    }
}

fn normalise(path: &str) -> &str {
    let trimmed = path.trim_end_matches('/');
    if trimmed.is_empty() { "/" } else { trimmed }
}

fn is_within(path: &str, root: &str) -> bool {
    let (path, root) = (normalise(path), normalise(root));
    root == "/"
        || path == root
        || path
            .strip_prefix(root)
            .is_some_and(|rest| rest.starts_with('/'))
}

/// Whether the `/proc/<pid>/cgroup` text puts the process in `cgroup` or below it.
pub(crate) fn cgroup_matches(proc_cgroup: &str, cgroup: &ContainerCgroup) -> bool {
    proc_cgroup.lines().any(|line| {
        let mut fields = line.splitn(3, ':');
        let (Some(id), Some(controllers), Some(path)) =
            (fields.next(), fields.next(), fields.next())
        else {
            return false;
        };
        match cgroup {
            ContainerCgroup::V1 { devices } => {
                controllers.split(',').any(|c| c == "devices") && is_within(path, devices)
            }
            ContainerCgroup::V2 { path: root } => {
                id == "0" && controllers.is_empty() && is_within(path, root)
            }
        }
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a failed unwrap fails the test at its line
mod tests {
    use proptest::prelude::*;

    use super::*;

    const HYBRID: &str =
        "12:devices:/mesos/c1\n11:cpu,cpuacct:/mesos/c1\n1:name=systemd:/\n0::/mesos/c9\n";

    fn v1(p: &str) -> ContainerCgroup {
        ContainerCgroup::V1 {
            devices: p.to_owned(),
        }
    }
    fn v2(p: &str) -> ContainerCgroup {
        ContainerCgroup::V2 { path: p.to_owned() }
    }

    #[test]
    fn matches_v1_devices_and_v2_lines() {
        assert!(cgroup_matches(HYBRID, &v1("/mesos/c1")));
        assert!(cgroup_matches(HYBRID, &v1("/mesos/c1/")));
        assert!(
            !cgroup_matches(HYBRID, &v1("/mesos/c")),
            "prefix of a name is not a parent"
        );
        assert!(
            !cgroup_matches(HYBRID, &v1("/mesos/c9")),
            "the v2 line does not count for v1"
        );
        assert!(cgroup_matches(HYBRID, &v2("/mesos/c9")));
        assert!(
            !cgroup_matches(HYBRID, &v2("/mesos/c1")),
            "v1 lines do not count for v2"
        );
        assert!(
            cgroup_matches("0::/mesos/c1/mesos/nested\n", &v2("/mesos/c1")),
            "nested"
        );
        assert!(!cgroup_matches("garbage\n\n", &v2("/")));
    }

    fn proc_tree(entries: &[(u32, &str)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for (pid, text) in entries {
            let d = dir.path().join(pid.to_string());
            fs::create_dir_all(&d).unwrap();
            fs::write(d.join("cgroup"), text).unwrap();
        }
        dir
    }

    fn readings(processes: Option<Vec<GpuProcess>>) -> GpuReadings {
        GpuReadings {
            index: 2,
            uuid: "GPU-2".to_owned(),
            utilization_gpu: Some(40),
            memory_total: Some(100),
            processes,
            ..GpuReadings::default()
        }
    }

    #[test]
    fn attributes_only_the_containers_processes() {
        let proc = proc_tree(&[
            (10, "0::/mesos/a\n"),
            (11, "0::/mesos/b\n"),
            (12, "0::/mesos/a/sub\n"),
        ]);
        let reader = UsageReader::at(proc.path());
        let p = |pid, used| GpuProcess {
            pid,
            used_memory: used,
        };
        let r = readings(Some(vec![
            p(10, Some(5)),
            p(11, Some(7)),
            p(12, Some(1)),
            p(99, Some(1000)),
        ]));
        let u = reader.attribute(&r, &v2("/mesos/a"));
        assert_eq!(u.pids, Some(vec![10, 12]));
        assert_eq!(
            u.memory_used,
            Some(6),
            "pid 99 has exited, 11 is another container's"
        );
        assert_eq!((u.utilization_gpu, u.memory_total), (Some(40), Some(100)));

        let unknown = reader.attribute(&readings(Some(vec![p(10, None)])), &v2("/mesos/a"));
        assert_eq!(unknown.memory_used, None, "unknown is never taken as 0");
        let none = reader.attribute(&readings(None), &v2("/mesos/a"));
        assert_eq!((none.memory_used, none.pids), (None, None));
        let idle = reader.attribute(&readings(Some(vec![])), &v2("/mesos/a"));
        assert_eq!((idle.memory_used, idle.pids), (Some(0), Some(vec![])));
    }

    proptest! {
        #[test]
        fn any_text_never_panics(text in "[0-9a-z:,/\n]{0,64}", root in "/[a-z/]{0,8}") {
            let _ = cgroup_matches(&text, &v1(&root));
            let _ = cgroup_matches(&text, &v2(&root));
        }

        #[test]
        fn a_cgroup_contains_its_children(a in "[a-z]{1,5}", b in "[a-z]{1,5}") {
            let line = format!("0::/{a}/{b}\n");
            let (parent, itself, other) = (format!("/{a}"), format!("/{a}/{b}"), format!("/{a}/{b}x"));
            prop_assert!(cgroup_matches(&line, &v2(&parent)));
            prop_assert!(cgroup_matches(&line, &v2(&itself)));
            prop_assert!(!cgroup_matches(&line, &v2(&other)));
        }
    }
}
