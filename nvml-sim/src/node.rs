//! The validated node: what the exported functions answer from.
//!
//! `nvmlDeviceGetTopologyCommonAncestor` levels follow `nvmlGpuTopologyLevel_t`: `INTERNAL` (0,
//! same board), `SINGLE` (10, one PCIe switch), `MULTIPLE` (20, several switches, no host
//! bridge), `HOSTBRIDGE` (30, same host bridge), `NODE` (40, same NUMA node / CPU socket through
//! different host bridges) and `SYSTEM` (50, across sockets).

use std::collections::HashMap;
use std::path::PathBuf;

use crate::abi;
use crate::fields::PciAddr;
use crate::mig::Mig;
use crate::status::NvmlError;

/// A whole simulated node, GPUs in NVML index order.
#[derive(Debug, Clone)]
pub(crate) struct Node {
    pub(crate) driver_version: String,
    /// `major * 1000 + minor * 10`, as `nvmlSystemGetCudaDriverVersion` returns it.
    pub(crate) cuda_version: i32,
    /// Absolute path of the events file, when the node has one.
    pub(crate) events_file: Option<PathBuf>,
    /// Absolute path of the runtime state file, when the node has one.
    pub(crate) state_file: Option<PathBuf>,
    /// Majors `/proc/devices` lists for the driver's dynamic character devices.
    pub(crate) proc_devices: ProcDevices,
    pub(crate) nvswitches: Vec<NvSwitch>,
    /// Injected failures of system-level functions.
    pub(crate) fail: HashMap<&'static str, NvmlError>,
    /// Failures drawn at random.
    pub(crate) random: Option<RandomFailures>,
    pub(crate) gpus: Vec<Gpu>,
}

/// Seeded random failures: of initialisation, and of every other call.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct RandomFailures {
    /// The stream's seed, unless `NVML_SIM_SEED` gives another.
    pub(crate) seed: u64,
    /// `nvmlInit_v2` / `nvmlInitWithFlags`.
    pub(crate) init: Option<FailureRate>,
    /// Every other call but `nvmlShutdown` and `nvmlErrorString`.
    pub(crate) calls: Option<FailureRate>,
}

/// A probability of failing, and the errors a failure answers (drawn evenly).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct FailureRate {
    pub(crate) probability: f64,
    pub(crate) errors: Vec<NvmlError>,
}

/// Dynamic majors of the driver's character devices.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ProcDevices {
    /// `nvidia-caps` (MIG capability nodes `/dev/nvidia-caps/nvidia-cap<N>`).
    pub(crate) nvidia_caps: u32,
    /// `nvidia-uvm`.
    pub(crate) nvidia_uvm: u32,
}

impl ProcDevices {
    /// Majors seen on real hosts: `nvidia-caps` 235 (toolkit test data), `nvidia-uvm` 510.
    pub(crate) const DEFAULT: ProcDevices = ProcDevices {
        nvidia_caps: 235,
        nvidia_uvm: 510,
    };
}

/// An NVSwitch NVLinks can end at.
#[derive(Debug, Clone)]
pub(crate) struct NvSwitch {
    pub(crate) pci: PciAddr,
    pub(crate) device_id: u32,
}

/// A GPU's affinities; each list sorted and distinct.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Affinity {
    /// NUMA nodes near the GPU (node scope).
    pub(crate) memory_nodes: Option<Vec<u32>>,
    /// CPUs of the GPU's socket.
    pub(crate) socket_cpus: Option<Vec<u32>>,
    /// NUMA nodes of the GPU's socket.
    pub(crate) socket_memory_nodes: Option<Vec<u32>>,
}

/// One GPU as configured.
#[derive(Debug, Clone)]
pub(crate) struct Gpu {
    pub(crate) index: u32,
    pub(crate) minor: u32,
    pub(crate) uuid: String,
    pub(crate) name: String,
    pub(crate) brand: u32,
    pub(crate) serial: Option<String>,
    pub(crate) pci: PciAddr,
    pub(crate) pci_device_id: u32,
    pub(crate) pci_subsystem_id: u32,
    pub(crate) memory: Memory,
    pub(crate) compute_capability: Option<(u32, u32)>,
    pub(crate) numa_node: Option<u32>,
    pub(crate) cpus: Option<Vec<u32>>,
    pub(crate) board: Option<String>,
    pub(crate) pcie: Option<Pcie>,
    /// One entry per NVLink, by link number.
    pub(crate) nvlinks: Vec<NvLink>,
    /// MIG mode and layout; `None` for GPUs without MIG.
    pub(crate) mig: Option<Mig>,
    /// Memory and socket-scope affinities.
    pub(crate) affinity: Affinity,
    /// `nvmlComputeMode_t` at driver load.
    pub(crate) compute_mode: u32,
    /// (gpu, memory) percent.
    pub(crate) utilization: Option<(u32, u32)>,
    pub(crate) temperature_c: Option<u32>,
    pub(crate) power_mw: Option<u32>,
    /// (pid, used bytes).
    pub(crate) processes: Option<Vec<(u32, u64)>>,
    /// Starting ECC counts; `None` when ECC is off.
    pub(crate) ecc: Option<EccCounts>,
    pub(crate) lost: bool,
    /// `nvmlDeviceGpuRecoveryAction_t` at driver load; `None` for a driver without the
    /// recovery action field (`NVML_FI_DEV_GET_GPU_RECOVERY_ACTION` is `NOT_SUPPORTED`).
    pub(crate) recovery_action: Option<u32>,
    /// Row remapper state at driver load; `None` for GPUs without row remapping (before
    /// Ampere), where `nvmlDeviceGetRemappedRows` is `NOT_SUPPORTED`.
    pub(crate) remapped_rows: Option<RemappedRows>,
    /// Pages pending retirement at driver load; `None` where page retirement is not supported
    /// (Hopper retires rows instead).
    pub(crate) retired_pages_pending: Option<bool>,
    /// Injected failures of device functions.
    pub(crate) fail: HashMap<&'static str, NvmlError>,
}

/// What `nvmlDeviceGetRemappedRows` answers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct RemappedRows {
    /// Rows remapped for correctable errors.
    pub(crate) correctable: u32,
    /// Rows remapped for uncorrectable errors.
    pub(crate) uncorrectable: u32,
    /// A remapping waits for the next GPU reset.
    pub(crate) pending: bool,
    /// A remapping ever failed.
    pub(crate) failure: bool,
}

/// `nvmlDeviceGpuRecoveryAction_t` by the name node descriptions and the events file use
/// (`nvml.h`: `NVML_GPU_RECOVERY_ACTION_NONE` 0 … `_RECOVER_IMEX_DOMAIN` 5).
pub(crate) const RECOVERY_ACTIONS: &[(&str, u32)] = &[
    ("none", 0),
    ("gpu_reset", 1),
    ("node_reboot", 2),
    ("drain_p2p", 3),
    ("drain_and_reset", 4),
    ("recover_imex_domain", 5),
];

/// The value of recovery action `name`, or the names accepted.
pub(crate) fn recovery_action(name: &str) -> Result<u32, String> {
    RECOVERY_ACTIONS
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, v)| *v)
        .ok_or_else(|| {
            let names: Vec<&str> = RECOVERY_ACTIONS.iter().map(|(n, _)| *n).collect();
            format!(
                "recovery action {name:?} is not one of {}",
                names.join(", ")
            )
        })
}

/// Framebuffer memory in bytes.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Memory {
    pub(crate) total: u64,
    pub(crate) reserved: u64,
    pub(crate) used: u64,
}

impl Memory {
    pub(crate) fn free(self) -> u64 {
        self.total - self.reserved - self.used
    }
}

/// A GPU's place in the PCIe tree: socket, host bridge, then switches from the host bridge down.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Pcie {
    pub(crate) socket: u32,
    pub(crate) host_bridge: String,
    pub(crate) switches: Vec<String>,
}

/// One NVLink of a GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct NvLink {
    pub(crate) remote: Remote,
    pub(crate) active: bool,
}

/// What the far end of an NVLink is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Remote {
    /// A GPU, by index.
    Gpu(usize),
    /// An NVSwitch, by position in [`Node::nvswitches`].
    Switch(usize),
}

/// ECC error counts: corrected (single-bit) and uncorrected (double-bit), volatile (since the
/// driver loaded) and aggregate (lifetime).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct EccCounts {
    pub(crate) volatile_corrected: u64,
    pub(crate) volatile_uncorrected: u64,
    pub(crate) aggregate_corrected: u64,
    pub(crate) aggregate_uncorrected: u64,
}

/// `nvmlGpuTopologyLevel_t`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum TopologyLevel {
    Internal = 0,
    Single = 10,
    Multiple = 20,
    HostBridge = 30,
    Node = 40,
    System = 50,
}

impl Gpu {
    /// The event types `nvmlDeviceGetSupportedEventTypes` reports: XID, P-state and clock
    /// changes always, ECC errors when ECC is on.
    pub(crate) fn supported_events(&self) -> u64 {
        let ecc = if self.ecc.is_some() {
            abi::EVENT_SINGLE_BIT_ECC | abi::EVENT_DOUBLE_BIT_ECC
        } else {
            0
        };
        abi::EVENT_XID | abi::EVENT_PSTATE | abi::EVENT_CLOCK | ecc
    }
}

/// The closest PCIe ancestor of two different GPUs; `None` when either lacks a PCIe placement.
pub(crate) fn common_ancestor(a: &Gpu, b: &Gpu) -> Option<TopologyLevel> {
    if a.board.is_some() && a.board == b.board {
        return Some(TopologyLevel::Internal);
    }
    let (pa, pb) = (a.pcie.as_ref()?, b.pcie.as_ref()?);
    if pa.socket != pb.socket {
        return Some(TopologyLevel::System);
    }
    if pa.host_bridge != pb.host_bridge {
        return Some(TopologyLevel::Node);
    }
    let shared = pa
        .switches
        .iter()
        .zip(&pb.switches)
        .take_while(|(x, y)| x == y)
        .count();
    if shared == 0 {
        return Some(TopologyLevel::HostBridge);
    }
    // Both GPUs directly below the same switch: the path crosses that one switch only.
    if shared == pa.switches.len() && shared == pb.switches.len() {
        Some(TopologyLevel::Single)
    } else {
        Some(TopologyLevel::Multiple)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(board: Option<&str>, socket: u32, hb: &str, switches: &[&str]) -> Gpu {
        Gpu {
            index: 0,
            minor: 0,
            uuid: String::new(),
            name: String::new(),
            brand: 2,
            serial: None,
            pci: PciAddr {
                domain: 0,
                bus: 1,
                device: 0,
                function: 0,
            },
            pci_device_id: 0,
            pci_subsystem_id: 0,
            memory: Memory {
                total: 1,
                reserved: 0,
                used: 0,
            },
            compute_capability: None,
            numa_node: None,
            cpus: None,
            board: board.map(str::to_owned),
            pcie: Some(Pcie {
                socket,
                host_bridge: hb.to_owned(),
                switches: switches.iter().map(|s| (*s).to_owned()).collect(),
            }),
            nvlinks: Vec::new(),
            mig: None,
            affinity: Affinity::default(),
            compute_mode: 0,
            utilization: None,
            temperature_c: None,
            power_mw: None,
            processes: None,
            ecc: None,
            lost: false,
            recovery_action: None,
            remapped_rows: None,
            retired_pages_pending: None,
            fail: HashMap::new(),
        }
    }

    #[test]
    fn levels() {
        use TopologyLevel::*;
        let k80a = gpu(Some("k80"), 0, "hb0", &["plx"]);
        let k80b = gpu(Some("k80"), 0, "hb0", &["plx"]);
        assert_eq!(common_ancestor(&k80a, &k80b), Some(Internal));
        let s0 = gpu(None, 0, "hb0", &["sw0"]);
        let s1 = gpu(None, 0, "hb0", &["sw0"]);
        assert_eq!(common_ancestor(&s0, &s1), Some(Single));
        let m0 = gpu(None, 0, "hb0", &["sw0", "sw0a"]);
        let m1 = gpu(None, 0, "hb0", &["sw0", "sw0b"]);
        assert_eq!(common_ancestor(&m0, &m1), Some(Multiple));
        assert_eq!(common_ancestor(&m0, &s0), Some(Multiple));
        let h = gpu(None, 0, "hb0", &["sw1"]);
        assert_eq!(common_ancestor(&s0, &h), Some(HostBridge));
        let n = gpu(None, 0, "hb1", &["sw2"]);
        assert_eq!(common_ancestor(&s0, &n), Some(Node));
        let sys = gpu(None, 1, "hb2", &["sw3"]);
        assert_eq!(common_ancestor(&s0, &sys), Some(System));
        let mut bare = gpu(None, 0, "hb0", &[]);
        bare.pcie = None;
        assert_eq!(common_ancestor(&s0, &bare), None);
    }

    #[test]
    fn ecc_events_only_with_ecc() {
        let mut g = gpu(None, 0, "hb0", &[]);
        assert_eq!(g.supported_events() & abi::EVENT_DOUBLE_BIT_ECC, 0);
        g.ecc = Some(EccCounts::default());
        assert_ne!(g.supported_events() & abi::EVENT_DOUBLE_BIT_ECC, 0);
    }
}
