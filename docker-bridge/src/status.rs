//! [`GpuStatusSource`] over NVML, so the REST `/gpu/status` and `/gpu/info` pages show live
//! figures. The common figures (utilisation, memory used, temperature, power, running compute
//! processes) come from the isolator's reader ([`GpuReadings::read`], also behind the
//! Prometheus metrics), so there is one NVML reader for them; the rest of nvidia-docker's page
//! is read here.
//!
//! Facts relied on (NVML API reference; nvidia-docker 1.0 `src/nvml/nvml.go` for the units):
//! - power is reported in mW (`nvmlDeviceGetPowerUsage`, `…GetPowerManagementLimit`), shown in W;
//!   memory in bytes, shown in MiB; PCIe throughput in KB/s (`nvmlDeviceGetPcieThroughput`), shown
//!   in MB/s; clocks in MHz;
//! - ECC error counts are the volatile uncorrected counts per location
//!   (`nvmlDeviceGetMemoryErrorCounter`), as nvidia-docker showed them;
//! - the process name comes from `nvmlSystemGetProcessName`, else from `<proc>/<pid>/comm`;
//! - a part without a sensor answers `NOT_SUPPORTED`, and an older driver may lack the symbol:
//!   both give `None` (shown as `N/A`/`null`), never a number that was not read.

use std::path::PathBuf;
use std::sync::Arc;

use mesos_gpu_isolator::discovery::GpuDriver;
use mesos_gpu_isolator::inventory::Gpu;
use mesos_gpu_isolator::usage::GpuReadings;
use nvml_wrapper::Device;
use nvml_wrapper::enum_wrappers::device::{
    Clock, EccCounter, MemoryError, MemoryLocation, PcieUtilCounter,
};
use nvml_wrapper::error::NvmlError;

use crate::rest::status::{
    EccErrors, GpuDetails, GpuProcess, GpuStatus, GpuStatusSource, Utilization,
};

/// Longest process name asked of NVML.
const PROCESS_NAME_LEN: usize = 256;
const MIB: u64 = 1 << 20;

/// Live GPU figures read from NVML at each request.
pub struct NvmlStatus {
    driver: Arc<GpuDriver>,
    proc_root: PathBuf,
}

impl std::fmt::Debug for NvmlStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NvmlStatus")
            .field("lib", &self.driver.lib_path())
            .field("proc_root", &self.proc_root)
            .finish()
    }
}

impl NvmlStatus {
    /// Figures from `driver`'s NVML session; process names fall back to `<proc_root>/<pid>/comm`.
    pub fn new(driver: Arc<GpuDriver>, proc_root: impl Into<PathBuf>) -> NvmlStatus {
        NvmlStatus {
            driver,
            proc_root: proc_root.into(),
        }
    }

    fn device(&self, gpu: &Gpu) -> Option<Device<'_>> {
        known(gpu, "handle", self.driver.nvml().device_by_index(gpu.index))
    }

    fn process_name(&self, pid: u32) -> Option<String> {
        match self.driver.nvml().sys_process_name(pid, PROCESS_NAME_LEN) {
            Ok(name) if !name.is_empty() => Some(name),
            _ => std::fs::read_to_string(self.proc_root.join(pid.to_string()).join("comm"))
                .ok()
                .map(|s| s.trim_end().to_owned())
                .filter(|s| !s.is_empty()),
        }
    }
}

fn known<T>(gpu: &Gpu, what: &'static str, result: Result<T, NvmlError>) -> Option<T> {
    match result {
        Ok(value) => Some(value),
        Err(error) => {
            tracing::trace!(gpu = gpu.index, what, %error, "GPU figure unknown");
            None
        }
    }
}

fn watts(milliwatts: u32) -> u32 {
    milliwatts / 1000
}

impl GpuStatusSource for NvmlStatus {
    fn details(&self, gpu: &Gpu) -> GpuDetails {
        let Some(device) = self.device(gpu) else {
            return GpuDetails::default();
        };
        GpuDetails {
            power_limit_w: known(gpu, "power limit", device.power_management_limit()).map(watts),
            bar1_mib: known(gpu, "BAR1", device.bar1_memory_info()).map(|b| b.total / MIB),
            pci_bandwidth_mbs: None,
            max_core_clock_mhz: known(gpu, "max clock", device.max_clock_info(Clock::Graphics)),
            max_memory_clock_mhz: known(gpu, "max mem clock", device.max_clock_info(Clock::Memory)),
            ecc_enabled: known(gpu, "ECC mode", device.is_ecc_enabled())
                .map(|m| m.currently_enabled),
        }
    }

    fn status(&self, gpu: &Gpu) -> GpuStatus {
        let readings = GpuReadings::read(&self.driver, gpu);
        let device = self.device(gpu);
        let read = |f: &dyn Fn(&Device<'_>) -> Result<u32, NvmlError>, what| {
            device.as_ref().and_then(|d| known(gpu, what, f(d)))
        };
        let ecc = |location| {
            device.as_ref().and_then(|d| {
                known(
                    gpu,
                    "ECC errors",
                    d.memory_error_counter(
                        MemoryError::Uncorrected,
                        EccCounter::Volatile,
                        location,
                    ),
                )
            })
        };
        GpuStatus {
            power_w: readings.power_mw.map(watts),
            temperature_c: readings.temperature_c,
            utilization: Utilization {
                gpu: readings.utilization_gpu,
                memory: readings.utilization_memory,
                encoder: read(
                    &|d| d.encoder_utilization().map(|u| u.utilization),
                    "encoder",
                ),
                decoder: read(
                    &|d| d.decoder_utilization().map(|u| u.utilization),
                    "decoder",
                ),
            },
            memory_used_mib: readings.memory_used.map(|b| b / MIB),
            ecc_errors: EccErrors {
                l1_cache: ecc(MemoryLocation::L1Cache),
                l2_cache: ecc(MemoryLocation::L2Cache),
                global: ecc(MemoryLocation::Device),
            },
            core_clock_mhz: read(&|d| d.clock_info(Clock::Graphics), "clock"),
            memory_clock_mhz: read(&|d| d.clock_info(Clock::Memory), "mem clock"),
            bar1_used_mib: device
                .as_ref()
                .and_then(|d| known(gpu, "BAR1", d.bar1_memory_info()))
                .map(|b| b.used / MIB),
            pci_rx_mbs: read(&|d| d.pcie_throughput(PcieUtilCounter::Receive), "PCIe rx")
                .map(|kb| kb / 1000),
            pci_tx_mbs: read(&|d| d.pcie_throughput(PcieUtilCounter::Send), "PCIe tx")
                .map(|kb| kb / 1000),
            processes: readings.processes.map(|list| {
                list.into_iter()
                    .map(|p| GpuProcess {
                        pid: p.pid,
                        name: self.process_name(p.pid),
                        memory_used_mib: p.used_memory.map(|b| b / MIB),
                    })
                    .collect()
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mesos_gpu_isolator::discovery::Discovery;
    use mesos_gpu_testkit::nvml_sim::SimNode;

    const NODE: &str = r#"{
      "driver_version": "550.54.14",
      "cuda_driver_version": "12.4",
      "gpus": [
        {
          "index": 0, "minor": 1, "uuid": "GPU-3f1c2a7e-5b9d-4e21-8c6a-0d4e9b2f7a11",
          "name": "Tesla V100-SXM2-16GB", "brand": "tesla", "pci": { "bus_id": "00000000:06:00.0" },
          "memory": { "total": 16944988160, "reserved": 0, "used": 536870912 },
          "utilization": { "gpu": 35, "memory": 12 }, "temperature_c": 41, "power_mw": 61500,
          "processes": [{ "pid": 1, "used_memory": 104857600 }]
        },
        {
          "index": 1, "minor": 0, "uuid": "GPU-8a2d4c6e-1f3b-4a5c-9e7d-2b4f6a8c0e12",
          "name": "Tesla V100-SXM2-16GB", "brand": "tesla", "pci": { "bus_id": "00000000:07:00.0" },
          "memory": { "total": 16944988160 },
          "fail": { "nvmlDeviceGetPowerUsage": "NVML_ERROR_NOT_SUPPORTED",
                    "nvmlDeviceGetTemperature": "NVML_ERROR_NOT_SUPPORTED" }
        }
      ]
    }"#;

    fn open(node: &SimNode) -> Arc<GpuDriver> {
        match GpuDriver::open(Some(&node.lib_path())).expect("NVML") {
            Discovery::Driver(driver) => Arc::new(*driver),
            Discovery::NoDriver(inv) => panic!("no driver: {:?}", inv.absent_reason),
        }
    }

    #[test]
    fn live_figures_come_from_nvml_in_display_units() {
        let node = SimNode::from_json(NODE);
        let driver = open(&node);
        let proc = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir(proc.path().join("1")).expect("mkdir");
        std::fs::write(proc.path().join("1/comm"), "trainer\n").expect("comm");
        let source = NvmlStatus::new(Arc::clone(&driver), proc.path());
        let gpu = driver.inventory().gpus[0].clone();
        let status = source.status(&gpu);
        assert_eq!(status.power_w, Some(61));
        assert_eq!(status.temperature_c, Some(41));
        assert_eq!(status.utilization.gpu, Some(35));
        assert_eq!(status.utilization.memory, Some(12));
        assert_eq!(status.memory_used_mib, Some(512));
        assert_eq!(
            status.processes,
            Some(vec![GpuProcess {
                pid: 1,
                name: Some("trainer".to_owned()),
                memory_used_mib: Some(100),
            }])
        );
        // nvml-sim has no clocks, BAR1, encoder or PCIe counters: unknown, not zero.
        assert_eq!(status.core_clock_mhz, None);
        assert_eq!(status.bar1_used_mib, None);
        assert_eq!(status.utilization.encoder, None);
        assert_eq!(status.pci_rx_mbs, None);
    }

    #[test]
    fn not_supported_is_unknown() {
        let node = SimNode::from_json(NODE);
        let driver = open(&node);
        let source = NvmlStatus::new(Arc::clone(&driver), "/nonexistent");
        let gpu = driver.inventory().gpus[1].clone();
        let status = source.status(&gpu);
        assert_eq!(status.power_w, None);
        assert_eq!(status.temperature_c, None);
        assert_eq!(status.utilization.gpu, None);
        assert_eq!(source.details(&gpu).power_limit_w, None);
        // A GPU NVML does not have: every figure unknown.
        let mut ghost = gpu.clone();
        ghost.index = 7;
        assert_eq!(source.status(&ghost), GpuStatus::default());
    }
}
