//! Live GPU facts the inventory does not hold (power, temperature, utilisation, memory in use,
//! processes, …), taken through [`GpuStatusSource`] so the REST pages can show them once an
//! NVML-backed source exists. Every field is optional: unknown is shown as `N/A` or JSON `null`,
//! never as a made-up number.
//!
//! Units follow nvidia-docker 1.0 (`src/nvml/nvml.go`): W, °C, %, MiB, MB/s, MHz.

use mesos_gpu_node::inventory::Gpu;

/// Where live GPU facts come from (NVML in production).
pub trait GpuStatusSource: Send + Sync {
    /// Static facts NVML has but the inventory does not. Default: all unknown.
    fn details(&self, gpu: &Gpu) -> GpuDetails {
        let _ = gpu;
        GpuDetails::default()
    }

    /// The GPU's current status. Default: all unknown.
    fn status(&self, gpu: &Gpu) -> GpuStatus {
        let _ = gpu;
        GpuStatus::default()
    }
}

/// A source that knows nothing beyond the inventory: every live field is unknown.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoStatus;

impl GpuStatusSource for NoStatus {}

/// Static per-GPU facts beyond the inventory.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GpuDetails {
    /// Power management limit, W.
    pub power_limit_w: Option<u32>,
    /// BAR1 size, MiB.
    pub bar1_mib: Option<u64>,
    /// Maximum PCIe bandwidth, MB/s.
    pub pci_bandwidth_mbs: Option<u32>,
    /// Maximum graphics clock, MHz.
    pub max_core_clock_mhz: Option<u32>,
    /// Maximum memory clock, MHz.
    pub max_memory_clock_mhz: Option<u32>,
    /// Whether ECC is enabled.
    pub ecc_enabled: Option<bool>,
}

/// Current utilisation, percent.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Utilization {
    /// SM utilisation.
    pub gpu: Option<u32>,
    /// Memory controller utilisation.
    pub memory: Option<u32>,
    /// Encoder utilisation.
    pub encoder: Option<u32>,
    /// Decoder utilisation.
    pub decoder: Option<u32>,
}

/// ECC error counts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EccErrors {
    /// L1 cache errors.
    pub l1_cache: Option<u64>,
    /// L2 cache errors.
    pub l2_cache: Option<u64>,
    /// Device memory errors.
    pub global: Option<u64>,
}

/// A process using the GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuProcess {
    /// Host pid.
    pub pid: u32,
    /// Process name, when NVML or `/proc` could tell.
    pub name: Option<String>,
    /// Framebuffer memory used, MiB, when NVML could tell.
    pub memory_used_mib: Option<u64>,
}

/// A GPU's live status.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GpuStatus {
    /// Power draw, W.
    pub power_w: Option<u32>,
    /// Temperature, °C.
    pub temperature_c: Option<u32>,
    /// Utilisation rates.
    pub utilization: Utilization,
    /// Framebuffer memory used, MiB.
    pub memory_used_mib: Option<u64>,
    /// ECC error counts.
    pub ecc_errors: EccErrors,
    /// Current graphics clock, MHz.
    pub core_clock_mhz: Option<u32>,
    /// Current memory clock, MHz.
    pub memory_clock_mhz: Option<u32>,
    /// BAR1 used, MiB.
    pub bar1_used_mib: Option<u64>,
    /// PCIe receive throughput, MB/s.
    pub pci_rx_mbs: Option<u32>,
    /// PCIe transmit throughput, MB/s.
    pub pci_tx_mbs: Option<u32>,
    /// Compute processes; `None` when unknown, empty when there are none.
    pub processes: Option<Vec<GpuProcess>>,
}
