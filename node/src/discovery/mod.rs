//! GPU discovery: load NVML at run time, read the node's GPUs, driver and topology once, and
//! keep the NVML session for later users (health events, usage).
//!
//! Facts relied on (`docs/reference/nvml.md` §1-2, `mesos-gpu-isolator.md` §2 and §7):
//! - NVML is `libnvidia-ml.so.1`, opened with `dlopen` through nvml-wrapper
//!   (`Nvml::builder().lib_path(..)`); there is no link-time dependency, so a node without the
//!   driver still runs. It is initialised with `NVML_INIT_FLAG_NO_GPUS`, without which
//!   `nvmlInit` fails (`NVML_ERROR_GPU_NOT_FOUND`) on a driver that has no GPU. When the default
//!   library is missing (`NvmlError::LibloadingError`, whose text is the `dlerror()` string) or
//!   present without its kernel module (`NVML_ERROR_DRIVER_NOT_LOADED`), there are no GPUs here,
//!   which is not an error. A library the caller *named* that cannot be loaded (missing, not a
//!   shared object) is an error: the operator asked for that file. Any other failure of
//!   `nvmlInit_v2` means a broken driver and is an error.
//! - Per GPU: `nvmlDeviceGetHandleByIndex_v2`, `…GetMinorNumber` (the `/dev/nvidia<minor>` node;
//!   not always the index), `…GetUUID`, `…GetName`, `…GetMemoryInfo_v2`, `…GetPciInfo_v3`,
//!   `…GetNumaNodeId`, `…GetCudaComputeCapability`, `…GetCpuAffinity`. A GPU that answers
//!   `NVML_ERROR_GPU_IS_LOST` (or reset-required, insufficient power, IRQ issue) is listed with
//!   `healthy: false` and whatever was read before; a GPU whose handle cannot be obtained at
//!   all has only its index, and its minor is [`UNKNOWN_MINOR`].
//! - `NOT_SUPPORTED` and symbols missing from older drivers leave optional fields unknown;
//!   memory size then reads 0 (with a warning).
//! - Topology: see `topology`. MIG: see `mig` (NVML) and `caps` (the driver's `/proc`
//!   files numbering the capability device nodes).
//!
//! Upstream Mesos makes a missing driver fatal when `gpu/nvidia` is on
//! (`docs/reference/mesos-gpu-isolator.md` §7); here discovery
//! reports an empty inventory with the reason and lets the caller decide.

mod caps;
mod mig;
mod topology;

pub use crate::sys::{EventInstance, RemappedRows, remapped_rows, wait_event};
pub use caps::CapsError;

use std::os::raw::c_ulong;
use std::path::{Path, PathBuf};

use nvml_wrapper::Nvml;
use nvml_wrapper::bitmasks::InitFlags;
use nvml_wrapper::enum_wrappers::device::ComputeMode;
use nvml_wrapper::error::NvmlError;

use crate::{
    inventory::DriverInfo, inventory::Gpu, inventory::Inventory, inventory::MigLayout,
    inventory::Topology,
};

/// Where the driver's `/proc` files are read from by default.
pub const DEFAULT_PROC_ROOT: &str = "/proc";

/// The library NVML is loaded from by default (the ld.so search applies).
pub const DEFAULT_NVML_LIB: &str = "libnvidia-ml.so.1";

/// The minor recorded for a GPU whose handle NVML would not give (lost at discovery). It is
/// above every Linux minor (20 bits), so it never matches a device node.
pub const UNKNOWN_MINOR: u32 = u32::MAX;

/// The most GPUs a node may have: 64, what the allocator's GPU sets (one 64-bit mask) hold. A
/// node reporting more is refused
/// before any GPU is read, so no command's cost grows with a count it cannot use.
pub const MAX_GPUS: u32 = 64;

/// The minor of `/dev/nvidia-modeset` (`c 195:254`); `/dev/nvidiactl` is 255. GPU minors are
/// below both (NVIDIA's kernel module numbers GPUs from 0 up).
pub(crate) const FIRST_CONTROL_MINOR: u32 = 254;

/// `NVML_ERROR_GPU_NOT_FOUND`, which nvml-wrapper 0.13 does not name.
const NVML_ERROR_GPU_NOT_FOUND: u32 = 28;

/// How many CPUs [`GpuDriver::cpu_affinity`] can describe.
const MAX_CPUS: usize = 4096;

/// How many memory nodes [`GpuDriver::memory_affinity`] can describe (the kernel's largest
/// `MAX_NUMNODES`).
const MAX_NODES: usize = 1024;

/// `NVML_AFFINITY_SCOPE_NODE`: the GPU's nearest NUMA node (`nvml.h`).
const AFFINITY_SCOPE_NODE: u32 = 0;

/// Why discovery failed on a host that has an NVIDIA driver.
#[derive(Debug, thiserror::Error)]
pub enum DiscoveryError {
    /// `nvmlInit_v2` failed for a reason other than a missing library or driver.
    #[error("cannot initialise NVML from {lib}")]
    Init {
        /// The library path given to dlopen.
        lib: PathBuf,
        /// NVML's error.
        #[source]
        source: NvmlFailure,
    },
    /// The NVML library the caller named cannot be loaded.
    #[error("cannot load the NVML library {lib}")]
    Load {
        /// The library path given to dlopen.
        lib: PathBuf,
        /// The loader's error.
        #[source]
        source: NvmlFailure,
    },
    /// A node-wide NVML query failed.
    #[error("NVML cannot report the {what}")]
    System {
        /// What was asked (`GPU count`, `driver version`).
        what: &'static str,
        /// NVML's error.
        #[source]
        source: NvmlFailure,
    },
    /// NVML reports more GPUs than a node may have.
    #[error("NVML reports {count} GPUs; mesos-gpu manages at most {max} GPUs per node")]
    TooManyGpus {
        /// The count NVML reports.
        count: u32,
        /// [`MAX_GPUS`].
        max: u32,
    },
    /// A GPU reports the minor number of an NVIDIA control device, or one above them.
    #[error("GPU {index} reports minor number {minor}, {why}; GPU minors are 0 to {last}")]
    ControlMinor {
        /// NVML index of the GPU.
        index: u32,
        /// The minor it reports.
        minor: u32,
        /// Whose minor it is.
        why: &'static str,
        /// The highest GPU minor.
        last: u32,
    },
    /// A MIG-enabled GPU's MIG layout cannot be read.
    #[error("cannot read the {what} of {} on GPU {index}", mig_index.map_or("its MIG devices".to_owned(), |i| format!("MIG device {i}")))]
    Mig {
        /// NVML index of the parent GPU.
        index: u32,
        /// The MIG device index, when one device failed.
        mig_index: Option<u32>,
        /// The attribute being read.
        what: &'static str,
        /// NVML's error.
        #[source]
        source: NvmlFailure,
    },
    /// The driver's MIG capability files cannot be used for a MIG device.
    #[error("cannot find the capability device nodes of MIG device {uuid}")]
    MigCaps {
        /// The MIG device's UUID.
        uuid: String,
        /// What was wrong with the files.
        #[source]
        source: CapsError,
    },
    /// The driver's MIG capability files cannot be read.
    #[error("cannot read the driver's MIG capability files")]
    Caps {
        /// What was wrong.
        #[source]
        source: CapsError,
    },
    /// A GPU's setting cannot be read or changed.
    #[error("cannot {action} the {what} of GPU {uuid}")]
    Setting {
        /// The GPU's UUID.
        uuid: String,
        /// `read` or `set`.
        action: &'static str,
        /// The setting.
        what: &'static str,
        /// NVML's error.
        #[source]
        source: NvmlFailure,
    },
    /// A GPU cannot be enumerated.
    #[error("cannot read the {what} of GPU {index}")]
    Gpu {
        /// NVML index of the GPU.
        index: u32,
        /// The attribute being read.
        what: &'static str,
        /// NVML's error.
        #[source]
        source: NvmlFailure,
    },
}

/// An NVML call's failure, as the library reported it; its text is NVML's (or the loader's).
/// The NVML binding's own type stays out of this crate's API.
#[derive(Debug)]
pub struct NvmlFailure(pub(crate) NvmlError);

impl std::fmt::Display for NvmlFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for NvmlFailure {
    /// The binding's cause, unless its message already holds it (`a libloading error occurred:
    /// <the loader's message>`): an error chain then gives the reason once.
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        let own = self.0.to_string();
        std::error::Error::source(&self.0).filter(|cause| !own.contains(&cause.to_string()))
    }
}

/// What opening NVML found.
#[derive(Debug)]
pub enum Discovery {
    /// NVML is loaded and initialised; the driver owns the session and the inventory.
    Driver(Box<GpuDriver>),
    /// No NVIDIA driver on this host: an empty inventory whose `absent_reason` says why.
    NoDriver(Inventory),
}

impl Discovery {
    /// The node's inventory, empty (with `absent_reason`) when there is no driver.
    pub fn inventory(&self) -> &Inventory {
        match self {
            Discovery::Driver(driver) => driver.inventory(),
            Discovery::NoDriver(inventory) => inventory,
        }
    }

    /// The NVML session, when there is a driver.
    pub fn driver(&self) -> Option<&GpuDriver> {
        match self {
            Discovery::Driver(driver) => Some(driver),
            Discovery::NoDriver(_) => None,
        }
    }
}

/// A live NVML session and what discovery read from it at start.
pub struct GpuDriver {
    nvml: Nvml,
    lib: PathBuf,
    inventory: Inventory,
    cpu_affinity: Vec<Option<Vec<u32>>>,
    memory_affinity: Vec<Option<Vec<u32>>>,
}

impl std::fmt::Debug for GpuDriver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuDriver")
            .field("lib", &self.lib)
            .field("inventory", &self.inventory)
            .finish_non_exhaustive()
    }
}

impl GpuDriver {
    /// Loads NVML from `lib` (default [`DEFAULT_NVML_LIB`]), initialises it and reads the
    /// inventory. A host without the default library, or without the kernel driver, gives
    /// [`Discovery::NoDriver`], not an error; a named `lib` that cannot be loaded is
    /// [`DiscoveryError::Load`].
    /// MIG capability files are read under [`DEFAULT_PROC_ROOT`].
    pub fn open(lib: Option<&Path>) -> Result<Discovery, DiscoveryError> {
        GpuDriver::open_at(lib, Path::new(DEFAULT_PROC_ROOT))
    }

    /// [`GpuDriver::open`] reading the driver's `/proc` files (MIG capabilities) under
    /// `proc_root`.
    #[tracing::instrument(skip_all, fields(lib = %lib.map_or(Path::new(DEFAULT_NVML_LIB), |p| p).display()))]
    pub fn open_at(lib: Option<&Path>, proc_root: &Path) -> Result<Discovery, DiscoveryError> {
        let named = lib.is_some();
        let lib = lib.map_or_else(|| PathBuf::from(DEFAULT_NVML_LIB), Path::to_path_buf);
        let nvml = match init(&lib) {
            Ok(nvml) => nvml,
            Err(err @ NvmlError::LibloadingError(_)) if named => {
                return Err(DiscoveryError::Load {
                    lib,
                    source: NvmlFailure(err),
                });
            }
            Err(err) => {
                let Some(reason) = absent_reason(&lib, &err) else {
                    return Err(DiscoveryError::Init {
                        lib,
                        source: NvmlFailure(err),
                    });
                };
                tracing::info!(%reason, "no NVIDIA driver");
                return Ok(Discovery::NoDriver(Inventory {
                    absent_reason: Some(reason),
                    ..Inventory::default()
                }));
            }
        };
        let (inventory, (cpu_affinity, memory_affinity)) = read_inventory(&nvml, proc_root)?;
        tracing::info!(
            gpus = inventory.gpus.len(),
            driver = inventory.driver.as_ref().map_or("", |d| d.version.as_str()),
            unhealthy = inventory.gpus.iter().filter(|g| !g.healthy).count(),
            mig_gpus = inventory.mig.enabled.len(),
            mig_devices = inventory.mig.devices.len(),
            "discovered GPUs"
        );
        Ok(Discovery::Driver(Box::new(GpuDriver {
            nvml,
            lib,
            inventory,
            cpu_affinity,
            memory_affinity,
        })))
    }

    /// The inventory read at [`GpuDriver::open`].
    pub fn inventory(&self) -> &Inventory {
        &self.inventory
    }

    /// The NVML library this session loaded (a path, or the name the loader searched for).
    pub fn library(&self) -> &Path {
        &self.lib
    }

    /// The NVML session (health events, usage and status figures).
    pub fn nvml(&self) -> &Nvml {
        &self.nvml
    }

    /// The name of process `pid` as NVML reports it (`nvmlSystemGetProcessName`, at most
    /// `max_len` bytes); `None` when NVML cannot say or says nothing.
    pub fn process_name(&self, pid: u32, max_len: usize) -> Option<String> {
        self.nvml
            .sys_process_name(pid, max_len)
            .ok()
            .filter(|name| !name.is_empty())
    }

    /// Sets GPU `uuid`'s compute mode to EXCLUSIVE_PROCESS (`exclusive`: one process, the MPS
    /// server, may hold a context on it) or back to DEFAULT, as `nvidia-smi -i <uuid> -c …` does.
    pub fn set_exclusive_process(&self, uuid: &str, exclusive: bool) -> Result<(), DiscoveryError> {
        let setting = |action, source| DiscoveryError::Setting {
            uuid: uuid.to_owned(),
            action,
            what: "compute mode",
            source: NvmlFailure(source),
        };
        let mode = if exclusive {
            ComputeMode::ExclusiveProcess
        } else {
            ComputeMode::Default
        };
        let mut device = self
            .nvml
            .device_by_uuid(uuid)
            .map_err(|e| setting("set", e))?;
        device.set_compute_mode(mode).map_err(|e| setting("set", e))
    }

    /// True when GPU `uuid` is in compute mode EXCLUSIVE_PROCESS.
    pub fn is_exclusive_process(&self, uuid: &str) -> Result<bool, DiscoveryError> {
        let read = |source| DiscoveryError::Setting {
            uuid: uuid.to_owned(),
            action: "read",
            what: "compute mode",
            source: NvmlFailure(source),
        };
        let mode = self
            .nvml
            .device_by_uuid(uuid)
            .and_then(|d| d.compute_mode())
            .map_err(read)?;
        Ok(matches!(mode, ComputeMode::ExclusiveProcess))
    }

    /// The library path NVML was loaded from.
    pub fn lib_path(&self) -> &Path {
        &self.lib
    }

    /// True when NVML answers `NVML_ERROR_GPU_IS_LOST` for the GPU with NVML index `index` now.
    pub fn reports_lost(&self, index: u32) -> bool {
        matches!(
            self.nvml.device_by_index(index).and_then(|d| d.uuid()),
            Err(NvmlError::GpuLost)
        )
    }

    /// The CPUs closest to the GPU at `position` in [`Inventory::gpus`], when NVML knows them.
    pub fn cpu_affinity(&self, position: usize) -> Option<&[u32]> {
        self.cpu_affinity.get(position).and_then(|c| c.as_deref())
    }

    /// The memory nodes closest to the GPU at `position` in [`Inventory::gpus`], when NVML
    /// knows them (`nvmlDeviceGetMemoryAffinity`, scope `NODE`).
    pub fn memory_affinity(&self, position: usize) -> Option<&[u32]> {
        self.memory_affinity
            .get(position)
            .and_then(|c| c.as_deref())
    }

    /// Every GPU's local CPUs and memory nodes, by NVML index, for NUMA pinning; a GPU whose
    /// CPUs NVML does not report is left out.
    pub fn affinities(&self) -> crate::numa::Affinities {
        let mut all = crate::numa::Affinities::new();
        for (position, gpu) in self.inventory.gpus.iter().enumerate() {
            if let Some(cpus) = self.cpu_affinity(position) {
                all.insert(
                    gpu.index,
                    crate::numa::GpuAffinity {
                        cpus: crate::numa::CpuList::from_ids(cpus.iter().copied()),
                        mems: self
                            .memory_affinity(position)
                            .map(|m| crate::numa::CpuList::from_ids(m.iter().copied())),
                    },
                );
            }
        }
        all
    }
}

/// `nvmlInitWithFlags(NVML_INIT_FLAG_NO_GPUS)`, so that a driver without GPUs still reports its
/// version; `nvmlInit_v2` for drivers that predate `nvmlInitWithFlags`.
fn init(lib: &Path) -> Result<Nvml, NvmlError> {
    match Nvml::builder()
        .lib_path(lib.as_os_str())
        .flags(InitFlags::NO_GPUS)
        .init()
    {
        Err(NvmlError::FailedToLoadSymbol(missing)) => {
            tracing::debug!(%missing, "no nvmlInitWithFlags; using nvmlInit_v2");
            Nvml::builder().lib_path(lib.as_os_str()).init()
        }
        other => other,
    }
}

/// "No GPUs here" reasons: the library is missing, the kernel driver is not loaded, or (for
/// `nvmlInit_v2`) the driver finds no GPU.
fn absent_reason(lib: &Path, err: &NvmlError) -> Option<String> {
    match err {
        NvmlError::UnexpectedVariant(NVML_ERROR_GPU_NOT_FOUND) => {
            Some("the NVIDIA driver found no GPUs (NVML_ERROR_GPU_NOT_FOUND)".to_owned())
        }
        NvmlError::LibloadingError(e) => Some(format!("NVIDIA driver not found: {e}")),
        NvmlError::DriverNotLoaded => Some(format!(
            "NVIDIA driver not loaded: {} is present but NVML reports NVML_ERROR_DRIVER_NOT_LOADED",
            lib.display()
        )),
        _ => None,
    }
}

/// Per GPU position: its CPU affinity and its memory-node affinity.
type Affinities = (Vec<Option<Vec<u32>>>, Vec<Option<Vec<u32>>>);

fn read_inventory(
    nvml: &Nvml,
    proc_root: &Path,
) -> Result<(Inventory, Affinities), DiscoveryError> {
    let version = nvml
        .sys_driver_version()
        .map_err(|source| DiscoveryError::System {
            what: "driver version",
            source: NvmlFailure(source),
        })?;
    let cuda_version = match nvml.sys_cuda_driver_version() {
        Ok(v) => u32::try_from(v).ok().map(|v| (v / 1000, (v % 1000) / 10)),
        Err(err) => {
            tracing::debug!(%err, "CUDA driver version unknown");
            None
        }
    };
    let count = nvml
        .device_count()
        .map_err(|source| DiscoveryError::System {
            what: "GPU count",
            source: NvmlFailure(source),
        })?;
    if count > MAX_GPUS {
        return Err(DiscoveryError::TooManyGpus {
            count,
            max: MAX_GPUS,
        });
    }
    let mut gpus = Vec::new();
    let mut affinities = Vec::new();
    let mut memory = Vec::new();
    let mut devices = Vec::new();
    for index in 0..count {
        let (gpu, affinity, mems, device) = read_gpu(nvml, index)?;
        gpus.push(gpu);
        affinities.push(affinity);
        memory.push(mems);
        devices.push(device);
    }
    let mig = read_mig(nvml, &gpus, &devices, proc_root)?;
    let topology = if gpus.is_empty() {
        Topology::unknown(0)
    } else {
        topology::read(nvml, &devices, &gpus)
    };
    let absent_reason = gpus
        .is_empty()
        .then(|| format!("NVIDIA driver {version} reports no GPUs"));
    let driver = Some(DriverInfo {
        version,
        cuda_version,
    });
    Ok((
        Inventory {
            driver,
            gpus,
            topology,
            absent_reason,
            mig,
        },
        (affinities, memory),
    ))
}

/// The MIG layout of the usable GPUs.
fn read_mig(
    nvml: &Nvml,
    gpus: &[Gpu],
    devices: &[Option<nvml_wrapper::Device<'_>>],
    proc_root: &Path,
) -> Result<MigLayout, DiscoveryError> {
    let mut layout = MigLayout::default();
    if gpus.is_empty() {
        return Ok(layout);
    }
    let caps =
        caps::CapsTable::read(proc_root).map_err(|source| DiscoveryError::Caps { source })?;
    for (gpu, device) in gpus.iter().zip(devices) {
        let Some(device) = device else { continue };
        let found = mig::read_gpu(nvml, gpu, device, &caps)?;
        if found.enabled {
            layout.enabled.push(gpu.index);
            layout.devices.extend(found.devices);
        }
    }
    if !layout.enabled.is_empty() {
        layout.caps_major = caps.major();
        if layout.caps_major.is_none() {
            tracing::warn!(proc_root = %proc_root.display(), "GPUs are in MIG mode but /proc/devices lists no nvidia-caps major: their MIG devices cannot be isolated");
        }
    }
    Ok(layout)
}

/// Errors that mean the GPU is there but unusable: listed with `healthy: false`.
fn is_unusable(err: &NvmlError) -> bool {
    matches!(
        err,
        NvmlError::GpuLost
            | NvmlError::ResetRequired
            | NvmlError::InsufficientPower
            | NvmlError::IrqIssue
    )
}

/// Errors that mean "this driver or GPU cannot say": the field stays unknown.
fn is_unsupported(err: &NvmlError) -> bool {
    matches!(
        err,
        NvmlError::NotSupported | NvmlError::FailedToLoadSymbol(_) | NvmlError::FunctionNotFound
    )
}

/// Reads GPU fields, downgrading the GPU to unhealthy on the first "lost" answer.
struct GpuReader {
    index: u32,
    healthy: bool,
}

impl GpuReader {
    /// A field the GPU must have: unsupported or failing is an enumeration error.
    fn required<T>(
        &mut self,
        what: &'static str,
        r: Result<T, NvmlError>,
    ) -> Result<Option<T>, DiscoveryError> {
        match r {
            Ok(v) => Ok(Some(v)),
            Err(err) if is_unusable(&err) => {
                self.unusable(what, &err);
                Ok(None)
            }
            Err(source) => Err(DiscoveryError::Gpu {
                index: self.index,
                what,
                source: NvmlFailure(source),
            }),
        }
    }

    /// A field that may be unknown.
    fn optional<T>(&mut self, what: &'static str, r: Result<T, NvmlError>) -> Option<T> {
        match r {
            Ok(v) => Some(v),
            Err(err) if is_unusable(&err) => {
                self.unusable(what, &err);
                None
            }
            Err(err) if is_unsupported(&err) => {
                tracing::debug!(index = self.index, what, %err, "not reported by this driver");
                None
            }
            Err(err) => {
                tracing::warn!(index = self.index, what, %err, "NVML query failed; leaving it unknown");
                None
            }
        }
    }

    fn unusable(&mut self, what: &'static str, err: &NvmlError) {
        if self.healthy {
            tracing::warn!(index = self.index, what, %err, "GPU is unusable; listing it as unhealthy");
        }
        self.healthy = false;
    }
}

/// What [`read_gpu`] learns: the GPU, its CPU and memory-node affinities, and its handle when it
/// is usable.
type GpuRead<'nvml> = (
    Gpu,
    Option<Vec<u32>>,
    Option<Vec<u32>>,
    Option<nvml_wrapper::Device<'nvml>>,
);

fn read_gpu(nvml: &Nvml, index: u32) -> Result<GpuRead<'_>, DiscoveryError> {
    let mut r = GpuReader {
        index,
        healthy: true,
    };
    let Some(device) = r.required("handle", nvml.device_by_index(index))? else {
        let gpu = Gpu {
            index,
            minor: UNKNOWN_MINOR,
            uuid: String::new(),
            name: String::new(),
            memory_total: 0,
            pci_bus_id: String::new(),
            numa_node: None,
            compute_capability: None,
            healthy: false,
        };
        return Ok((gpu, None, None, None));
    };
    let minor = r.required("minor number", device.minor_number())?;
    if let Some(minor) = minor.filter(|&m| m >= FIRST_CONTROL_MINOR) {
        return Err(DiscoveryError::ControlMinor {
            index,
            minor,
            why: match minor {
                FIRST_CONTROL_MINOR => "which belongs to /dev/nvidia-modeset",
                255 => "which belongs to /dev/nvidiactl",
                _ => "which NVIDIA's driver never gives a GPU",
            },
            last: FIRST_CONTROL_MINOR - 1,
        });
    }
    let uuid = r.required("UUID", device.uuid())?;
    let name = r.required("name", device.name())?;
    let pci_bus_id = r.required("PCI info", device.pci_info())?.map(|p| p.bus_id);
    let memory_total = match r.optional("memory info", device.memory_info()) {
        Some(m) => m.total,
        None => {
            tracing::warn!(index, "memory size unknown; recording 0");
            0
        }
    };
    let numa_node = r.optional("NUMA node", device.numa_node_id());
    let compute_capability = r
        .optional("compute capability", device.cuda_compute_capability())
        .and_then(|cc| Some((u32::try_from(cc.major).ok()?, u32::try_from(cc.minor).ok()?)));
    let affinity = r.optional(
        "CPU affinity",
        device.cpu_affinity(MAX_CPUS.div_ceil(c_ulong::BITS as usize)),
    );
    let memory_affinity = r.optional(
        "memory affinity",
        device.memory_affinity(
            MAX_NODES.div_ceil(c_ulong::BITS as usize),
            AFFINITY_SCOPE_NODE,
        ),
    );
    let gpu = Gpu {
        index,
        minor: minor.unwrap_or(UNKNOWN_MINOR),
        uuid: uuid.unwrap_or_default(),
        name: name.unwrap_or_default(),
        memory_total,
        pci_bus_id: pci_bus_id.unwrap_or_default(),
        numa_node,
        compute_capability,
        healthy: r.healthy,
    };
    tracing::debug!(?gpu, "read GPU");
    let device = r.healthy.then_some(device);
    Ok((
        gpu,
        affinity.map(|mask| cpus_of_mask(&mask)),
        memory_affinity.map(|mask| cpus_of_mask(&mask)),
        device,
    ))
}

/// The CPU numbers set in an NVML affinity bitmask (word `w`, bit `b` is CPU `w*BITS + b`).
fn cpus_of_mask(mask: &[c_ulong]) -> Vec<u32> {
    let mut cpus = Vec::new();
    for (word, bits) in (0u32..).zip(mask) {
        for bit in 0..c_ulong::BITS {
            if bits & (1 << bit) != 0 {
                cpus.push(word * c_ulong::BITS + bit);
            }
        }
    }
    cpus
}

#[cfg(test)]
mod tests {
    use super::*;
    use mesos_gpu_testkit::nvml_sim::SimNode;

    #[test]
    fn a_named_library_that_cannot_be_loaded_is_an_error() {
        let dir = tempfile::tempdir().expect("tempdir");
        let garbage = dir.path().join("libnvidia-ml.so.1");
        std::fs::write(&garbage, b"not an ELF file").expect("write");
        for lib in [
            Path::new("/nonexistent/libnvidia-ml.so.1"),
            Path::new("/etc/passwd"),
            garbage.as_path(),
        ] {
            match GpuDriver::open(Some(lib)) {
                Err(err @ DiscoveryError::Load { .. }) => {
                    assert_eq!(
                        err.to_string(),
                        format!("cannot load the NVML library {}", lib.display())
                    );
                    // The loader's reason, once (the binding's message holds it already).
                    let chain = mesos_gpu_os::error_chain(&err);
                    let reason = chain.rsplit(": ").next().unwrap_or_default();
                    assert_eq!(chain.matches(reason).count(), 1, "{chain}");
                }
                other => panic!("{}: {other:?}", lib.display()),
            }
        }
    }

    /// A shipped node with `edit` applied to its description, served by nvml-sim.
    fn sim_node(name: &str, edit: impl FnOnce(&mut serde_json::Value)) -> SimNode {
        let (_, text) = nvml_sim::TOPOLOGIES
            .iter()
            .find(|(n, _)| *n == name)
            .expect("shipped topology");
        let mut spec: serde_json::Value = serde_json::from_str(text).expect("shipped JSON");
        edit(&mut spec);
        SimNode::from_json(&spec.to_string())
    }

    #[test]
    fn a_gpu_with_a_control_minor_is_refused() {
        for (minor, why) in [
            (255, "which belongs to /dev/nvidiactl"),
            (254, "which belongs to /dev/nvidia-modeset"),
            (4096, "which NVIDIA's driver never gives a GPU"),
        ] {
            let node = sim_node("pcie-t4x4", |spec| spec["gpus"][2]["minor"] = minor.into());
            let err = GpuDriver::open(Some(&node.lib_path())).expect_err("refused");
            assert_eq!(
                err.to_string(),
                format!("GPU 2 reports minor number {minor}, {why}; GPU minors are 0 to 253")
            );
        }
        let node = sim_node("pcie-t4x4", |spec| spec["gpus"][2]["minor"] = 253.into());
        assert!(
            GpuDriver::open(Some(&node.lib_path())).is_ok(),
            "253 is a GPU's"
        );
    }

    #[test]
    fn a_node_with_more_gpus_than_the_allocator_holds_is_refused() {
        let node_of = |count: u32| {
            sim_node("pcie-t4x4", |spec| {
                let template = spec["gpus"][0].clone();
                let gpus: Vec<serde_json::Value> = (0..count)
                    .map(|i| {
                        let mut gpu = template.clone();
                        gpu["index"] = i.into();
                        gpu["minor"] = i.into();
                        gpu["uuid"] = format!("GPU-{i:08x}-0000-4000-8000-000000000000").into();
                        gpu["pci"]["bus_id"] = format!("00000000:{:02X}:00.0", i + 1).into();
                        gpu["serial"] = format!("{}", 1_000_000 + i).into();
                        gpu
                    })
                    .collect();
                spec["gpus"] = gpus.into();
            })
        };
        let node = node_of(MAX_GPUS + 1);
        let err = GpuDriver::open(Some(&node.lib_path())).expect_err("refused");
        assert!(
            matches!(err, DiscoveryError::TooManyGpus { count: 65, max: 64 }),
            "{err:?}"
        );
        assert_eq!(
            err.to_string(),
            "NVML reports 65 GPUs; mesos-gpu manages at most 64 GPUs per node"
        );
        let node = node_of(MAX_GPUS);
        let found = GpuDriver::open(Some(&node.lib_path())).expect("64 GPUs are a node");
        assert_eq!(found.inventory().gpus.len(), 64);
    }

    #[test]
    fn missing_default_library_is_no_driver_with_the_dlerror_text() {
        // The loader's error for a library that is not there, as for the default one.
        let lib = Path::new("/nonexistent/libnvidia-ml.so.1");
        let Err(err) = init(lib) else {
            panic!("{} loaded", lib.display());
        };
        let reason = absent_reason(lib, &err).expect("absent");
        assert_eq!(
            reason,
            "NVIDIA driver not found: /nonexistent/libnvidia-ml.so.1: cannot open shared object \
             file: No such file or directory"
        );
    }

    #[test]
    fn driver_not_loaded_is_absent_and_other_init_errors_are_not() {
        let lib = Path::new("libnvidia-ml.so.1");
        let reason = absent_reason(lib, &NvmlError::DriverNotLoaded).expect("absent");
        assert!(reason.contains("NVML_ERROR_DRIVER_NOT_LOADED"), "{reason}");
        assert_eq!(absent_reason(lib, &NvmlError::NoPermission), None);
        assert_eq!(absent_reason(lib, &NvmlError::LibRmVersionMismatch), None);
    }

    #[test]
    fn affinity_masks() {
        assert_eq!(cpus_of_mask(&[0b1011, 0, 1]), [0, 1, 3, 2 * c_ulong::BITS]);
        assert!(cpus_of_mask(&[0, 0]).is_empty());
    }

    #[test]
    fn reader_classifies_errors() {
        let mut r = GpuReader {
            index: 3,
            healthy: true,
        };
        assert_eq!(
            r.optional("numa", Err::<u32, _>(NvmlError::NotSupported)),
            None
        );
        assert!(r.healthy);
        assert!(matches!(
            r.required("uuid", Err::<u32, _>(NvmlError::Unknown)),
            Err(DiscoveryError::Gpu {
                index: 3,
                what: "uuid",
                ..
            })
        ));
        assert_eq!(
            r.required("minor", Err::<u32, _>(NvmlError::GpuLost))
                .expect("lost is not an error"),
            None
        );
        assert!(!r.healthy);
    }
}
