//! The JSON node description as written (serde), before validation.
//!
//! Every object denies unknown fields so a misspelt key is an error, not a silently ignored
//! setting. `nvml-sim/README.md` documents each field with a full example.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::Deserialize;

/// The whole node.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct NodeSpec {
    pub(crate) driver_version: String,
    pub(crate) cuda_driver_version: CudaVersionSpec,
    #[serde(default)]
    pub(crate) events_file: Option<PathBuf>,
    #[serde(default)]
    pub(crate) nvswitches: Vec<NvSwitchSpec>,
    /// System-level function name → NVML error name.
    #[serde(default)]
    pub(crate) fail: BTreeMap<String, String>,
    /// The runtime state file (compute modes set through NVML, processes written by tests).
    #[serde(default)]
    pub(crate) state_file: Option<PathBuf>,
    /// Character device majors the driver files report in `/proc/devices`.
    #[serde(default)]
    pub(crate) proc_devices: Option<ProcDevicesSpec>,
    /// Failures drawn at random, as a flaky driver gives them.
    #[serde(default)]
    pub(crate) random_failures: Option<RandomFailuresSpec>,
    pub(crate) gpus: Vec<GpuSpec>,
}

/// Seeded random failures of initialisation and of the other calls.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RandomFailuresSpec {
    /// The stream's seed (`NVML_SIM_SEED` overrides it).
    #[serde(default)]
    pub(crate) seed: u64,
    /// Failures of `nvmlInit_v2` / `nvmlInitWithFlags`.
    #[serde(default)]
    pub(crate) init: Option<FailureRateSpec>,
    /// Failures of every other call but `nvmlShutdown` and `nvmlErrorString`.
    #[serde(default)]
    pub(crate) calls: Option<FailureRateSpec>,
}

/// How often a call fails, and with which NVML errors (drawn evenly).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct FailureRateSpec {
    pub(crate) probability: f64,
    pub(crate) errors: Vec<String>,
}

/// Dynamic character device majors of the driver's modules.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ProcDevicesSpec {
    #[serde(default)]
    pub(crate) nvidia_caps: Option<u32>,
    #[serde(default)]
    pub(crate) nvidia_uvm: Option<u32>,
}

/// `12040` or `"12.4"`.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(crate) enum CudaVersionSpec {
    Number(i64),
    Text(String),
}

/// An NVSwitch that GPUs' NVLinks may end at.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct NvSwitchSpec {
    pub(crate) pci_bus_id: String,
    #[serde(default)]
    pub(crate) pci_device_id: Option<String>,
}

/// One GPU.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct GpuSpec {
    pub(crate) index: u32,
    pub(crate) minor: u32,
    pub(crate) uuid: String,
    pub(crate) name: String,
    pub(crate) brand: BrandSpec,
    #[serde(default)]
    pub(crate) serial: Option<String>,
    pub(crate) pci: PciSpec,
    pub(crate) memory: MemorySpec,
    #[serde(default)]
    pub(crate) compute_capability: Option<String>,
    #[serde(default)]
    pub(crate) numa_node: Option<u32>,
    #[serde(default)]
    pub(crate) cpu_affinity: Option<String>,
    /// NUMA nodes near the GPU (node scope), a node list such as `"0"`.
    #[serde(default)]
    pub(crate) memory_affinity: Option<String>,
    /// CPUs and NUMA nodes of the GPU's socket (socket scope).
    #[serde(default)]
    pub(crate) socket_affinity: Option<SocketAffinitySpec>,
    #[serde(default)]
    pub(crate) compute_mode: Option<ComputeModeSpec>,
    #[serde(default)]
    pub(crate) board: Option<String>,
    #[serde(default)]
    pub(crate) pcie: Option<PcieSpec>,
    #[serde(default)]
    pub(crate) nvlinks: Vec<NvLinkSpec>,
    #[serde(default)]
    pub(crate) mig: Option<MigSpec>,
    #[serde(default)]
    pub(crate) utilization: Option<UtilizationSpec>,
    #[serde(default)]
    pub(crate) temperature_c: Option<u32>,
    #[serde(default)]
    pub(crate) power_mw: Option<u32>,
    #[serde(default)]
    pub(crate) processes: Option<Vec<ProcessSpec>>,
    #[serde(default)]
    pub(crate) ecc: Option<EccSpec>,
    #[serde(default)]
    pub(crate) lost: bool,
    /// `NVML_FI_DEV_GET_GPU_RECOVERY_ACTION` at load: `none`, `gpu_reset`, `node_reboot`,
    /// `drain_p2p`, `drain_and_reset` or `recover_imex_domain`; absent: not supported.
    #[serde(default)]
    pub(crate) recovery_action: Option<String>,
    /// `nvmlDeviceGetRemappedRows` at load; absent: not supported.
    #[serde(default)]
    pub(crate) remapped_rows: Option<RemappedRowsSpec>,
    /// `nvmlDeviceGetRetiredPagesPendingStatus` at load; absent: not supported.
    #[serde(default)]
    pub(crate) retired_pages_pending: Option<bool>,
    /// Device function name → NVML error name.
    #[serde(default)]
    pub(crate) fail: BTreeMap<String, String>,
}

/// `nvmlBrandType_t`, by its `NVML_BRAND_*` name in lower case.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum BrandSpec {
    Unknown,
    Quadro,
    Tesla,
    Nvs,
    Grid,
    Geforce,
    Titan,
    NvidiaVapps,
    NvidiaVpc,
    NvidiaVcs,
    NvidiaVws,
    NvidiaCloudGaming,
    QuadroRtx,
    NvidiaRtx,
    Nvidia,
    GeforceRtx,
    TitanRtx,
}

impl BrandSpec {
    /// The `nvmlBrandType_t` value.
    pub(crate) fn code(self) -> u32 {
        match self {
            BrandSpec::Unknown => 0,
            BrandSpec::Quadro => 1,
            BrandSpec::Tesla => 2,
            BrandSpec::Nvs => 3,
            BrandSpec::Grid => 4,
            BrandSpec::Geforce => 5,
            BrandSpec::Titan => 6,
            BrandSpec::NvidiaVapps => 7,
            BrandSpec::NvidiaVpc => 8,
            BrandSpec::NvidiaVcs => 9,
            BrandSpec::NvidiaVws => 10,
            BrandSpec::NvidiaCloudGaming => 11,
            BrandSpec::QuadroRtx => 12,
            BrandSpec::NvidiaRtx => 13,
            BrandSpec::Nvidia => 14,
            BrandSpec::GeforceRtx => 15,
            BrandSpec::TitanRtx => 16,
        }
    }
}

/// PCI identity.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct PciSpec {
    pub(crate) bus_id: String,
    #[serde(default)]
    pub(crate) device_id: Option<String>,
    #[serde(default)]
    pub(crate) subsystem_id: Option<String>,
}

/// Framebuffer memory in bytes; `free` is what is left of `total`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct MemorySpec {
    pub(crate) total: u64,
    #[serde(default)]
    pub(crate) reserved: u64,
    #[serde(default)]
    pub(crate) used: u64,
}

/// Where the GPU sits in the PCIe tree.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct PcieSpec {
    pub(crate) socket: u32,
    pub(crate) host_bridge: String,
    #[serde(default)]
    pub(crate) switches: Vec<String>,
}

/// One group of NVLinks to a peer GPU or to an NVSwitch.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct NvLinkSpec {
    #[serde(default)]
    pub(crate) peer: Option<u32>,
    #[serde(default)]
    pub(crate) nvswitch: Option<usize>,
    pub(crate) links: u32,
    #[serde(default = "yes")]
    pub(crate) active: bool,
}

fn yes() -> bool {
    true
}

/// MIG mode now and after the next reset, and the instances.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct MigSpec {
    pub(crate) current: bool,
    #[serde(default)]
    pub(crate) pending: Option<bool>,
    /// The profile table (`a100-sxm4-40gb`, `a100-80gb`, `h100-80gb`); inferred from the name.
    #[serde(default)]
    pub(crate) profiles: Option<String>,
    #[serde(default)]
    pub(crate) gpu_instances: Vec<GpuInstanceSpec>,
}

/// A GPU instance: id, profile id and placement start (memory slices).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct GpuInstanceSpec {
    pub(crate) id: u32,
    pub(crate) profile: u32,
    pub(crate) start: u32,
    /// Absent: one compute instance (id 0) spanning the GPU instance.
    #[serde(default)]
    pub(crate) compute_instances: Option<Vec<ComputeInstanceSpec>>,
}

/// A compute instance (a MIG device).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ComputeInstanceSpec {
    pub(crate) id: u32,
    /// CI profile id; absent: the one spanning the GPU instance.
    #[serde(default)]
    pub(crate) profile: Option<u32>,
    /// First compute slice within the GPU instance; absent: 0.
    #[serde(default)]
    pub(crate) start: Option<u32>,
    /// MIG device index; absent: the lowest free one, in listing order.
    #[serde(default)]
    pub(crate) index: Option<u32>,
    /// `MIG-…`; absent: derived from the parent UUID and the ids.
    #[serde(default)]
    pub(crate) uuid: Option<String>,
    #[serde(default)]
    pub(crate) processes: Vec<ProcessSpec>,
}

/// `nvmlComputeMode_t`, by its `NVML_COMPUTEMODE_*` name in lower case.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum ComputeModeSpec {
    Default,
    Prohibited,
    ExclusiveProcess,
}

impl ComputeModeSpec {
    /// The `nvmlComputeMode_t` value.
    pub(crate) fn code(self) -> u32 {
        match self {
            ComputeModeSpec::Default => 0,
            ComputeModeSpec::Prohibited => 2,
            ComputeModeSpec::ExclusiveProcess => 3,
        }
    }
}

/// What `NVML_AFFINITY_SCOPE_SOCKET` reports.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct SocketAffinitySpec {
    pub(crate) cpus: String,
    pub(crate) memory: String,
}

/// Percent busy.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct UtilizationSpec {
    pub(crate) gpu: u32,
    pub(crate) memory: u32,
}

/// A process with a compute context on the GPU.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ProcessSpec {
    pub(crate) pid: u32,
    pub(crate) used_memory: u64,
}

/// ECC is enabled; the starting error counts.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct EccSpec {
    #[serde(default)]
    pub(crate) volatile: EccCountsSpec,
    #[serde(default)]
    pub(crate) aggregate: EccCountsSpec,
}

/// Corrected (single-bit) and uncorrected (double-bit) error counts.
#[derive(Debug, Default, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct EccCountsSpec {
    #[serde(default)]
    pub(crate) corrected: u64,
    #[serde(default)]
    pub(crate) uncorrected: u64,
}

/// Row remapper counts and flags.
#[derive(Debug, Default, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RemappedRowsSpec {
    #[serde(default)]
    pub(crate) correctable: u32,
    #[serde(default)]
    pub(crate) uncorrectable: u32,
    #[serde(default)]
    pub(crate) pending: bool,
    #[serde(default)]
    pub(crate) failure: bool,
}
