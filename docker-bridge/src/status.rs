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

use mesos_gpu_node::discovery::GpuDriver;
use mesos_gpu_node::inventory::Gpu;
use mesos_gpu_node::{usage::GpuDetailReadings, usage::GpuReadings};

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

    fn process_name(&self, pid: u32) -> Option<String> {
        self.driver.process_name(pid, PROCESS_NAME_LEN).or_else(|| {
            std::fs::read_to_string(self.proc_root.join(pid.to_string()).join("comm"))
                .ok()
                .map(|s| s.trim_end().to_owned())
                .filter(|s| !s.is_empty())
        })
    }
}

fn watts(milliwatts: u32) -> u32 {
    milliwatts / 1000
}

impl GpuStatusSource for NvmlStatus {
    fn details(&self, gpu: &Gpu) -> GpuDetails {
        let d = GpuDetailReadings::read(&self.driver, gpu);
        GpuDetails {
            power_limit_w: d.power_limit_mw.map(watts),
            bar1_mib: d.bar1_total.map(|b| b / MIB),
            pci_bandwidth_mbs: None,
            max_core_clock_mhz: d.max_graphics_clock_mhz,
            max_memory_clock_mhz: d.max_memory_clock_mhz,
            ecc_enabled: d.ecc_enabled,
        }
    }

    fn status(&self, gpu: &Gpu) -> GpuStatus {
        let readings = GpuReadings::read(&self.driver, gpu);
        let d = GpuDetailReadings::read(&self.driver, gpu);
        GpuStatus {
            power_w: readings.power_mw.map(watts),
            temperature_c: readings.temperature_c,
            utilization: Utilization {
                gpu: readings.utilization_gpu,
                memory: readings.utilization_memory,
                encoder: d.encoder_percent,
                decoder: d.decoder_percent,
            },
            memory_used_mib: readings.memory_used.map(|b| b / MIB),
            ecc_errors: EccErrors {
                l1_cache: d.ecc_uncorrected_l1,
                l2_cache: d.ecc_uncorrected_l2,
                global: d.ecc_uncorrected_device,
            },
            core_clock_mhz: d.graphics_clock_mhz,
            memory_clock_mhz: d.memory_clock_mhz,
            bar1_used_mib: d.bar1_used.map(|b| b / MIB),
            pci_rx_mbs: d.pcie_rx_kbs.map(|kb| kb / 1000),
            pci_tx_mbs: d.pcie_tx_kbs.map(|kb| kb / 1000),
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
    use mesos_gpu_node::discovery::Discovery;
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
