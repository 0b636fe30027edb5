//! How many GPUs a Mesos agent advertises: Mesos's rules for `--resources` `gpus` and
//! `--nvidia_gpu_devices`, and the agent flags that advertise a node's GPUs.
//!
//! The rules are those of `NvidiaGpuAllocator::resources` / `enumerateGpuResources`
//! (`src/slave/containerizer/mesos/isolators/gpu/allocator.cpp`,
//! `docs/reference/mesos-gpu-isolator.md` §2), checked in the same order:
//! 1. `--nvidia_gpu_devices` needs `gpu/nvidia` in `--isolation`;
//! 2. without `gpu/nvidia`, or without NVML, `gpus` from `--resources` passes through unchecked;
//! 3. an explicit `gpus:0` advertises no GPUs and forbids `--nvidia_gpu_devices`;
//! 4. devices without `gpus`, or `gpus` without devices, is an error;
//! 5. with both: whole number, no duplicate indices, equal counts, no more than the node has;
//! 6. with neither: every GPU NVML reports.
//!
//! mesos-gpu's own module isolator ([`MODULE_ISOLATOR`], [`module`]) discovers and checks the
//! GPUs by the same rules, but its device list is the module's `nvidia_gpu_devices` parameter,
//! never the agent's `--nvidia_gpu_devices`, and it also serves nodes with GPUs in MIG mode.
//!
//! Messages name the device list as the caller spells it ([`AgentGpuFlags::parse`]'s
//! `devices_flag`): Mesos's [`DEVICES_FLAG`] for the agent's flag, or e.g. `mesos-gpu
//! agent-flags --nvidia-gpu-devices` with the module, where the list is that command's option.
//!
//! Departures from upstream, all stricter: explicit `gpus:0` is found by parsing, not by a
//! substring test; every listed index must exist and not be lost (upstream finds out later, in
//! `enumerateGpus`); auto-discovery leaves out GPUs NVML reports as lost. Messages do not copy the
//! upstream `nvidia_gpus_devices` typo.

mod attributes;
mod containerizer;
mod mig;
pub mod module;
mod module_config;
mod offer;
mod resources;
mod sharing;

use std::collections::BTreeSet;

pub use crate::mig_strategy::{MigStrategy, MigStrategyError};
pub use attributes::{Attribute, AttributesError};
pub(crate) use attributes::{gpu_attributes, merge as merge_attributes};
pub use containerizer::{ContainerizerFlags, ContainerizerFlagsError};
pub use mig::{ATTR_MIG_STRATEGY, MIG_RESOURCE_PREFIX, MigOffer, ProfileOffer};
pub use module::{MODULE_ISOLATOR, ModuleParameters};
pub use module_config::{DriverVolume, MODULE_KEYS, ModuleConfig, ModuleParamError};
pub use offer::{ModuleGpus, ModuleOffer, OfferMismatch, check_agent_resources};
pub use resources::{GPUS, GpusGiven, Resource, ResourceValue, Resources, ResourcesError};
pub use sharing::{
    ATTR_REPLICAS, ATTR_SHARED, ATTR_SHARING, ATTR_WHOLE, OfferError,
    advertise as advertise_sharing, advertise_mig as advertise_mig_sharing,
};

use mesos_gpu_node::inventory::Inventory;
use mesos_gpu_placement::sharing::SharingSpec;

/// The `--isolation` token that turns on GPU isolation.
pub const GPU_ISOLATOR: &str = "gpu/nvidia";

/// Mesos's default `--isolation`.
pub const DEFAULT_ISOLATION: &str = "posix/cpu,posix/mem";

/// The agent flag listing the GPUs `gpu/nvidia` advertises, as Mesos spells it.
pub const DEVICES_FLAG: &str = "--nvidia_gpu_devices";

/// The module's device list, as messages about the module's own parameters name it.
const MODULE_DEVICES_PARAM: &str = "the module parameter nvidia_gpu_devices";

/// Why the agent's GPU flags are rejected.
#[derive(Debug, thiserror::Error)]
pub enum AgentFlagsError {
    /// `--resources` is malformed.
    #[error(transparent)]
    Resources(#[from] ResourcesError),
    /// `--attributes` is malformed or overrides a GPU attribute.
    #[error(transparent)]
    Attributes(#[from] AttributesError),
    /// The device list is not a comma-separated list of indices.
    #[error("{flag}={value:?}: expected a comma-separated list of NVML GPU indices, e.g. 0,1,2")]
    BadDevices {
        /// The device list's flag, as the caller spells it.
        flag: &'static str,
        /// The value as given.
        value: String,
    },
    /// Rule 1.
    #[error(
        "{flag} can only be set when --isolation contains '{GPU_ISOLATOR}' (got --isolation={isolation:?})"
    )]
    DevicesWithoutIsolator {
        /// The device list's flag, as the caller spells it.
        flag: &'static str,
        /// The `--isolation` value.
        isolation: String,
    },
    /// Rule 3.
    #[error("{flag} cannot be set when --resources specifies 0 GPUs")]
    DevicesWithZeroGpus {
        /// The device list's flag, as the caller spells it.
        flag: &'static str,
    },
    /// Rule 4, first half.
    #[error("{flag} cannot be set without also setting 'gpus' in --resources")]
    DevicesWithoutGpus {
        /// The device list's flag, as the caller spells it.
        flag: &'static str,
    },
    /// Rule 4, second half.
    #[error(
        "the 'gpus' resource (gpus:{gpus}) cannot be set without also setting {flag} \
         (the NVML indices of those GPUs, e.g. {flag}=0,1)"
    )]
    GpusWithoutDevices {
        /// The device list's flag, as the caller spells it.
        flag: &'static str,
        /// The `gpus` total.
        gpus: f64,
    },
    /// Rule 5 (checked first, before rules 3 and 4): fractional.
    #[error("gpus:{gpus}: the 'gpus' resource must be a non-negative whole number")]
    NotWholeNumber {
        /// The `gpus` total.
        gpus: f64,
    },
    /// Rule 5: duplicates.
    #[error("{flag} contains duplicates: {duplicates:?}")]
    Duplicates {
        /// The device list's flag, as the caller spells it.
        flag: &'static str,
        /// Each index listed more than once.
        duplicates: Vec<u32>,
    },
    /// Rule 5: count mismatch.
    #[error(
        "--resources and {flag} specify different numbers of GPU devices: gpus:{gpus} but {listed} \
         devices listed"
    )]
    Mismatch {
        /// The device list's flag, as the caller spells it.
        flag: &'static str,
        /// The `gpus` total.
        gpus: f64,
        /// Number of indices listed.
        listed: usize,
    },
    /// Rule 5: more than the node has.
    #[error(
        "the number of GPUs requested ({gpus}) is greater than the number of GPUs on this node ({available})"
    )]
    MoreThanAvailable {
        /// The `gpus` total.
        gpus: f64,
        /// GPUs NVML reports.
        available: usize,
    },
    /// A listed index is not a GPU of this node.
    #[error("{flag} lists GPU {index}, which this node does not have (indices: {known:?})")]
    UnknownDevice {
        /// The device list's flag, as the caller spells it.
        flag: &'static str,
        /// The index listed.
        index: u32,
        /// The indices NVML reports.
        known: Vec<u32>,
    },
    /// Mesos's `gpu/nvidia` and the module in one `--isolation`.
    #[error(
        "--isolation={isolation:?} has Mesos's `{GPU_ISOLATOR}` next to the mesos-gpu module \
         ({MODULE_ISOLATOR}): two GPU isolators would hand out the same GPUs; remove `{GPU_ISOLATOR}`"
    )]
    TwoGpuIsolators {
        /// The `--isolation` value.
        isolation: String,
    },
    /// GPUs in MIG mode with Mesos's built-in `gpu/nvidia`, which would give them whole.
    #[error(
        "GPUs {gpus:?} are in MIG mode: Mesos's built-in {GPU_ISOLATOR} would give them to tasks \
         whole, where CUDA sees only their MIG devices; use mesos-gpu's module isolator \
         (org_apache_mesos_gpu_MesosGpuIsolator) without {GPU_ISOLATOR}, or disable MIG"
    )]
    MigWithBuiltin {
        /// NVML indices of the GPUs in MIG mode.
        gpus: Vec<u32>,
    },
    /// A listed GPU is lost.
    #[error("{flag} lists GPU {index}, which NVML reports as lost or unusable")]
    LostDevice {
        /// The device list's flag, as the caller spells it.
        flag: &'static str,
        /// The index listed.
        index: u32,
    },
    /// The shares asked for do not fit the advertised GPUs.
    #[error(transparent)]
    Sharing(#[from] OfferError),
}

/// Which GPU isolator an `--isolation` names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GpuIsolator {
    /// Neither: the agent neither discovers nor isolates GPUs.
    None,
    /// Mesos's built-in `gpu/nvidia`.
    Builtin,
    /// mesos-gpu's module ([`MODULE_ISOLATOR`]).
    Module,
}

/// The agent flags that decide which GPUs an agent advertises, parsed.
#[derive(Debug, Clone)]
pub struct AgentGpuFlags {
    isolation: String,
    isolator: GpuIsolator,
    resources: Resources,
    devices: Option<Vec<u32>>,
    devices_flag: &'static str,
    attributes: Option<String>,
    driver_attributes: bool,
}

/// Where the advertised GPU count came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GpuSource {
    /// `gpus` from `--resources` taken as given, unchecked (rule 2): no `gpu/nvidia` or no NVML.
    Passthrough,
    /// Explicit `gpus:0` (rule 3).
    ExplicitZero,
    /// `gpus` and `--nvidia_gpu_devices` both given and valid (rule 5).
    Explicit,
    /// Every usable GPU NVML reports (rule 6).
    Discovered,
    /// A node with GPUs in MIG mode, offered by a MIG strategy (mesos-gpu's module only).
    Mig,
}

/// The validated agent flags that advertise a node's GPUs.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentGpus {
    /// Which rule produced the result.
    pub source: GpuSource,
    /// The GPU isolator the flags are for.
    pub isolator: GpuIsolator,
    /// The `gpus` amount advertised (0 when none).
    pub gpus: f64,
    /// The full `--resources` value, other resources kept as given; empty when there is nothing.
    pub resources: String,
    /// The indices of the GPUs advertised whole, when GPUs are isolated: the agent's
    /// `--nvidia_gpu_devices` with `gpu/nvidia`, the module's `nvidia_gpu_devices` with the
    /// module ([`AgentGpus::module_devices`]).
    pub devices: Option<Vec<u32>>,
    /// The full `--attributes` value (the user's, then the GPU attributes); empty when none.
    pub attributes: String,
}

impl AgentGpus {
    /// The agent flags, one `--name=value` per item, for flags that have a value
    /// (`--nvidia_gpu_devices` only for `gpu/nvidia`).
    pub fn flags(&self) -> Vec<String> {
        let mut out = Vec::new();
        if !self.resources.is_empty() {
            out.push(format!("--resources={}", self.resources));
        }
        if !self.attributes.is_empty() {
            out.push(format!("--attributes={}", self.attributes));
        }
        if let (GpuIsolator::Builtin, Some(devices)) = (self.isolator, &self.devices) {
            out.push(format!("--nvidia_gpu_devices={}", join_indices(devices)));
        }
        out
    }

    /// The module's `nvidia_gpu_devices` parameter: the advertised GPUs when they are not every
    /// GPU the module would offer by default (every GPU not in MIG mode), e.g. a list given or
    /// a lost GPU left out; `None` otherwise.
    pub fn module_devices(&self, inventory: &Inventory) -> Option<String> {
        let devices = self.devices.as_ref()?;
        let every: Vec<u32> = inventory.whole_gpus().map(|g| g.index).collect();
        (*devices != every).then(|| join_indices(devices))
    }
}

fn join_indices(indices: &[u32]) -> String {
    indices
        .iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

impl AgentGpuFlags {
    /// Parses the agent's `--isolation`, `--resources`, `--nvidia_gpu_devices` and
    /// `--attributes` values (`None` = flag not given). Errors about the device list name it
    /// `devices_flag`: [`DEVICES_FLAG`] for the agent's, or the option it came from.
    pub fn parse(
        isolation: &str,
        resources: Option<&str>,
        nvidia_gpu_devices: Option<&str>,
        attributes: Option<&str>,
        devices_flag: &'static str,
    ) -> Result<Self, AgentFlagsError> {
        let names = |token: &str| isolation.split(',').any(|t| t.trim() == token);
        let isolator = match (names(GPU_ISOLATOR), names(MODULE_ISOLATOR)) {
            (true, true) => {
                return Err(AgentFlagsError::TwoGpuIsolators {
                    isolation: isolation.to_owned(),
                });
            }
            (true, false) => GpuIsolator::Builtin,
            (false, true) => GpuIsolator::Module,
            (false, false) => GpuIsolator::None,
        };
        let resources = Resources::parse(resources.unwrap_or(""))?;
        let devices = nvidia_gpu_devices
            .map(|value| parse_devices(value, devices_flag))
            .transpose()?;
        Ok(AgentGpuFlags {
            isolation: isolation.to_owned(),
            isolator,
            resources,
            devices,
            devices_flag,
            attributes: attributes.map(str::to_owned),
            driver_attributes: false,
        })
    }

    /// With `on`, the attributes also name the driver (`nvidia_driver`, `cuda_version`). Off by
    /// default: both change with every driver upgrade, and Mesos then refuses to recover the
    /// agent (`Incompatible agent info detected` under `--reconfiguration_policy=equal`, a
    /// changed text attribute under `additive`), so the agent would lose its ID and abandon its
    /// executors.
    pub fn with_driver_attributes(mut self, on: bool) -> AgentGpuFlags {
        self.driver_attributes = on;
        self
    }

    /// The flags as the module sees them: its `nvidia_gpu_devices` (`devices`) stands for
    /// `--nvidia_gpu_devices` with as many `gpus`, and without a list it offers every usable
    /// GPU (rule 6), as `agent-flags` leaves the parameter out then.
    pub fn for_module(devices: Option<&[u32]>) -> AgentGpuFlags {
        let resources =
            Resources::only_gpus(devices.map(|d| u32::try_from(d.len()).unwrap_or(u32::MAX)));
        AgentGpuFlags {
            isolation: MODULE_ISOLATOR.to_owned(),
            isolator: GpuIsolator::Module,
            resources,
            devices: devices.map(<[u32]>::to_vec),
            devices_flag: MODULE_DEVICES_PARAM,
            attributes: None,
            driver_attributes: false,
        }
    }

    /// Everything the agent advertises: the GPUs by Mesos's rules ([`Self::resolve`]), or on a
    /// node with GPUs in MIG mode its MIG devices by `strategy` ([`Self::resolve_mig`]), then,
    /// with `sharing`, every shared GPU or MIG device counted R times.
    pub fn advertise(
        &self,
        inventory: &Inventory,
        strategy: MigStrategy,
        sharing: Option<&SharingSpec>,
    ) -> Result<AgentGpus, AgentFlagsError> {
        let mig = !inventory.mig.is_empty();
        let resolved = if mig {
            self.resolve_mig(inventory, strategy)?
        } else {
            self.resolve(inventory)?
        };
        let Some(spec) = sharing else {
            return Ok(resolved);
        };
        Ok(if mig {
            advertise_mig_sharing(&resolved, inventory, spec, strategy)?.0
        } else {
            advertise_sharing(&resolved, inventory, spec)?.0
        })
    }

    /// True when `--isolation` contains `gpu/nvidia`.
    pub fn gpu_isolator(&self) -> bool {
        self.isolator == GpuIsolator::Builtin
    }

    /// The GPU isolator `--isolation` names.
    pub fn isolator(&self) -> GpuIsolator {
        self.isolator
    }

    /// True when a GPU isolator (`gpu/nvidia` or the module) discovers and isolates GPUs.
    fn isolates(&self) -> bool {
        self.isolator != GpuIsolator::None
    }

    /// Applies Mesos's rules against `inventory` (an inventory without a driver means NVML is not
    /// available) and builds the flags that advertise the GPUs. The module follows the same
    /// rules, its device list standing for `--nvidia_gpu_devices`.
    pub fn resolve(&self, inventory: &Inventory) -> Result<AgentGpus, AgentFlagsError> {
        let given = self.resources.gpus();
        // Rule 1.
        if self.devices.is_some() && !self.isolates() {
            return Err(AgentFlagsError::DevicesWithoutIsolator {
                flag: self.devices_flag,
                isolation: self.isolation.clone(),
            });
        }
        // Rule 2.
        if !self.isolates() || inventory.driver.is_none() {
            return self.passthrough(inventory, given.map_or(0.0, |g| g.total));
        }
        // Rule 5's whole-number check comes first: a fractional count is wrong whatever else is
        // (Mesos would first ask for --nvidia_gpu_devices, then refuse the count).
        if let Some(g) = given
            && g.total.fract() != 0.0
        {
            return Err(AgentFlagsError::NotWholeNumber { gpus: g.total });
        }
        match (given, &self.devices) {
            // Rule 3.
            (Some(g), devices) if g.total == 0.0 => {
                if devices.is_some() {
                    return Err(AgentFlagsError::DevicesWithZeroGpus {
                        flag: self.devices_flag,
                    });
                }
                self.build(
                    inventory,
                    GpuSource::ExplicitZero,
                    0.0,
                    self.resources.render(),
                    None,
                    &[],
                )
            }
            // Rule 4.
            (None, Some(_)) => Err(AgentFlagsError::DevicesWithoutGpus {
                flag: self.devices_flag,
            }),
            (Some(g), None) => Err(AgentFlagsError::GpusWithoutDevices {
                flag: self.devices_flag,
                gpus: g.total,
            }),
            // Rule 5.
            (Some(g), Some(devices)) => {
                self.check_devices(inventory, g.total, devices)?;
                self.build(
                    inventory,
                    GpuSource::Explicit,
                    g.total,
                    self.resources.render(),
                    Some(devices.clone()),
                    devices,
                )
            }
            // Rule 6.
            (None, None) => self.discovered(inventory),
        }
    }

    /// Rule 2: without a GPU isolator, or without NVML, `gpus` from `--resources` pass through
    /// unchecked (the healthy GPUs advertised when there are any).
    fn passthrough(&self, inventory: &Inventory, gpus: f64) -> Result<AgentGpus, AgentFlagsError> {
        if self.isolates() {
            tracing::warn!(
                reason = inventory.absent_reason.as_deref().unwrap_or("unknown"),
                "a GPU isolator is in --isolation but NVML is not available; gpus from \
                 --resources pass through unchecked"
            );
        }
        let advertised: Vec<u32> = if gpus > 0.0 {
            healthy_indices(inventory)
        } else {
            Vec::new()
        };
        self.build(
            inventory,
            GpuSource::Passthrough,
            gpus,
            self.resources.render(),
            None,
            &advertised,
        )
    }

    /// Rule 5: the device list names `gpus` GPUs, each once, each one the node has and NVML
    /// does not report lost.
    fn check_devices(
        &self,
        inventory: &Inventory,
        gpus: f64,
        devices: &[u32],
    ) -> Result<(), AgentFlagsError> {
        let duplicates = duplicates(devices);
        if !duplicates.is_empty() {
            return Err(AgentFlagsError::Duplicates {
                flag: self.devices_flag,
                duplicates,
            });
        }
        if gpus != devices.len() as f64 {
            return Err(AgentFlagsError::Mismatch {
                flag: self.devices_flag,
                gpus,
                listed: devices.len(),
            });
        }
        if gpus > inventory.gpus.len() as f64 {
            return Err(AgentFlagsError::MoreThanAvailable {
                gpus,
                available: inventory.gpus.len(),
            });
        }
        for &index in devices {
            match inventory.by_index(index) {
                None => {
                    let known = inventory.gpus.iter().map(|g| g.index).collect();
                    return Err(AgentFlagsError::UnknownDevice {
                        flag: self.devices_flag,
                        index,
                        known,
                    });
                }
                Some(gpu) if !gpu.healthy => {
                    return Err(AgentFlagsError::LostDevice {
                        flag: self.devices_flag,
                        index,
                    });
                }
                Some(_) => {}
            }
        }
        Ok(())
    }

    /// Rule 6: neither `gpus` nor a device list given, every GPU NVML does not report lost is
    /// advertised.
    fn discovered(&self, inventory: &Inventory) -> Result<AgentGpus, AgentFlagsError> {
        let indices = healthy_indices(inventory);
        let lost = inventory.gpus.len() - indices.len();
        if lost > 0 {
            tracing::warn!(lost, "leaving out GPUs that NVML reports as lost");
        }
        let n = u32::try_from(indices.len()).unwrap_or(u32::MAX);
        let (resources, devices) = if n == 0 {
            (self.resources.render(), None)
        } else {
            (
                self.resources.render_with_gpus(Some(n)),
                Some(indices.clone()),
            )
        };
        self.build(
            inventory,
            GpuSource::Discovered,
            f64::from(n),
            resources,
            devices,
            &indices,
        )
    }

    /// The flags of a node with GPUs in MIG mode: `gpus` and (mixed) one scalar per MIG profile
    /// from [`MigOffer`], replacing any the user gave, and the attributes of the GPUs offered
    /// whole plus the MIG attributes. Refused with `gpu/nvidia` (rule 1 and
    /// [`AgentFlagsError::MigWithBuiltin`]).
    pub fn resolve_mig(
        &self,
        inventory: &Inventory,
        strategy: MigStrategy,
    ) -> Result<AgentGpus, AgentFlagsError> {
        if self.devices.is_some() && !self.isolates() {
            return Err(AgentFlagsError::DevicesWithoutIsolator {
                flag: self.devices_flag,
                isolation: self.isolation.clone(),
            });
        }
        if self.isolator == GpuIsolator::Builtin {
            return Err(AgentFlagsError::MigWithBuiltin {
                gpus: inventory.mig.enabled.clone(),
            });
        }
        let offer = MigOffer::of(inventory, strategy);
        let mut scalars = Vec::new();
        if offer.gpus > 0 {
            scalars.push((GPUS.to_owned(), offer.gpus));
        }
        scalars.extend(offer.profiles.iter().map(|p| (p.resource.clone(), p.count)));
        let whole: Vec<u32> = inventory
            .whole_gpus()
            .filter(|g| g.healthy)
            .map(|g| g.index)
            .collect();
        let mut ours = gpu_attributes(inventory, &whole, self.driver_attributes);
        ours.extend(offer.attributes());
        let attributes = attributes::merge(self.attributes.as_deref(), &ours)?;
        Ok(AgentGpus {
            source: GpuSource::Mig,
            isolator: self.isolator,
            gpus: f64::from(offer.gpus),
            resources: self.resources.render_with_scalars(&scalars),
            devices: None,
            attributes,
        })
    }

    fn build(
        &self,
        inventory: &Inventory,
        source: GpuSource,
        gpus: f64,
        resources: String,
        devices: Option<Vec<u32>>,
        advertised: &[u32],
    ) -> Result<AgentGpus, AgentFlagsError> {
        let ours = if gpus > 0.0 {
            gpu_attributes(inventory, advertised, self.driver_attributes)
        } else {
            Vec::new()
        };
        let attributes = attributes::merge(self.attributes.as_deref(), &ours)?;
        tracing::debug!(?source, gpus, ?devices, "resolved the agent's GPU flags");
        Ok(AgentGpus {
            source,
            isolator: self.isolator,
            gpus,
            resources,
            devices,
            attributes,
        })
    }
}

fn healthy_indices(inventory: &Inventory) -> Vec<u32> {
    inventory
        .gpus
        .iter()
        .filter(|g| g.healthy)
        .map(|g| g.index)
        .collect()
}

fn parse_devices(value: &str, flag: &'static str) -> Result<Vec<u32>, AgentFlagsError> {
    let bad = || AgentFlagsError::BadDevices {
        flag,
        value: value.to_owned(),
    };
    if value.trim().is_empty() {
        return Err(bad());
    }
    value
        .split(',')
        .map(|item| item.trim().parse::<u32>().map_err(|_| bad()))
        .collect()
}

fn duplicates(devices: &[u32]) -> Vec<u32> {
    let mut seen = BTreeSet::new();
    let dups: BTreeSet<u32> = devices
        .iter()
        .copied()
        .filter(|d| !seen.insert(*d))
        .collect();
    dups.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use mesos_gpu_node::{inventory::DriverInfo, inventory::Gpu, inventory::Topology};

    const ISO: &str = "filesystem/linux,cgroups/devices,gpu/nvidia";

    fn node(count: u32) -> Inventory {
        let gpus: Vec<Gpu> = (0..count)
            .map(|index| Gpu {
                index,
                minor: index,
                uuid: format!("GPU-{index}"),
                name: "Tesla T4".into(),
                memory_total: 16 << 30,
                pci_bus_id: format!("00000000:{:02x}:00.0", index + 1),
                numa_node: Some(0),
                compute_capability: Some((7, 5)),
                healthy: true,
            })
            .collect();
        Inventory {
            driver: Some(DriverInfo {
                version: "550.54.14".into(),
                cuda_version: Some((12, 4)),
            }),
            topology: Topology::unknown(gpus.len()),
            gpus,
            absent_reason: None,
            mig: Default::default(),
        }
    }

    fn no_driver() -> Inventory {
        Inventory {
            absent_reason: Some("NVIDIA driver not found: test".into()),
            ..Inventory::default()
        }
    }

    fn resolve(
        isolation: &str,
        resources: Option<&str>,
        devices: Option<&str>,
        inv: &Inventory,
    ) -> Result<AgentGpus, AgentFlagsError> {
        AgentGpuFlags::parse(isolation, resources, devices, None, DEVICES_FLAG)?.resolve(inv)
    }

    fn ok(
        isolation: &str,
        resources: Option<&str>,
        devices: Option<&str>,
        inv: &Inventory,
    ) -> AgentGpus {
        resolve(isolation, resources, devices, inv)
            .unwrap_or_else(|e| panic!("{resources:?} {devices:?}: {e}"))
    }

    fn list(n: u32) -> String {
        join_indices(&(0..n).collect::<Vec<_>>())
    }

    /// Issue 34: the device list is named as the caller spells it (`mesos-gpu agent-flags
    /// --nvidia-gpu-devices` with the module), Mesos's `--nvidia_gpu_devices` for the agent's.
    #[test]
    fn the_device_list_is_named_as_the_caller_spells_it() {
        let module = format!("filesystem/linux,cgroups/devices,{MODULE_ISOLATOR}");
        let err = |devices_flag, resources, devices| {
            AgentGpuFlags::parse(&module, Some(resources), devices, None, devices_flag)
                .and_then(|f| f.resolve(&node(4)))
                .expect_err("refused")
                .to_string()
        };
        assert_eq!(
            err("--nvidia-gpu-devices", "gpus:2", None),
            "the 'gpus' resource (gpus:2) cannot be set without also setting --nvidia-gpu-devices \
             (the NVML indices of those GPUs, e.g. --nvidia-gpu-devices=0,1)"
        );
        assert_eq!(
            err(DEVICES_FLAG, "gpus:2", None),
            "the 'gpus' resource (gpus:2) cannot be set without also setting --nvidia_gpu_devices \
             (the NVML indices of those GPUs, e.g. --nvidia_gpu_devices=0,1)"
        );
        for (resources, devices, says) in [
            (
                "gpus:1",
                "0,a",
                "--nvidia-gpu-devices=\"0,a\": expected a comma-separated list",
            ),
            (
                "gpus:1",
                "9",
                "--nvidia-gpu-devices lists GPU 9, which this node does not have",
            ),
            (
                "gpus:2",
                "0,0",
                "--nvidia-gpu-devices contains duplicates: [0]",
            ),
            (
                "gpus:2",
                "0",
                "--resources and --nvidia-gpu-devices specify different numbers",
            ),
            (
                "gpus:0",
                "0",
                "--nvidia-gpu-devices cannot be set when --resources specifies 0",
            ),
            (
                "cpus:1",
                "0",
                "--nvidia-gpu-devices cannot be set without also setting 'gpus'",
            ),
        ] {
            let got = err("--nvidia-gpu-devices", resources, Some(devices));
            assert!(got.starts_with(says), "{got}");
        }
    }

    // Mesos NvidiaGpuTest.ROOT_CGROUPS_NVIDIA_GPU_FlagValidation, case by case.

    #[test]
    fn a_default_flags_advertise_no_gpus() {
        let got = ok(DEFAULT_ISOLATION, None, None, &node(4));
        assert_eq!(
            (got.source, got.gpus, got.devices.clone()),
            (GpuSource::Passthrough, 0.0, None)
        );
        assert!(got.flags().is_empty(), "{:?}", got.flags());
    }

    #[test]
    fn fractional_gpus_alone_get_the_whole_number_message() {
        for devices in [None, Some("0")] {
            let err =
                resolve("gpu/nvidia", Some("gpus:1.5"), devices, &node(4)).expect_err("fractional");
            assert_eq!(
                err.to_string(),
                "gpus:1.5: the 'gpus' resource must be a non-negative whole number",
                "{devices:?}"
            );
        }
    }

    #[test]
    fn b_devices_without_the_isolator_fail() {
        let err =
            resolve(DEFAULT_ISOLATION, Some("gpus:1"), Some("0"), &node(4)).expect_err("rule 1");
        assert!(
            matches!(err, AgentFlagsError::DevicesWithoutIsolator { .. }),
            "{err}"
        );
        assert!(err.to_string().contains(
            "--nvidia_gpu_devices can only be set when --isolation contains 'gpu/nvidia'"
        ));
        assert!(!err.to_string().contains("nvidia_gpus_devices"));
    }

    #[test]
    fn c_gpus_pass_through_without_the_isolator() {
        let got = ok(DEFAULT_ISOLATION, Some("cpus:2;gpus:100"), None, &node(4));
        assert_eq!((got.source, got.gpus), (GpuSource::Passthrough, 100.0));
        assert_eq!(got.resources, "cpus:2;gpus:100");
        assert_eq!(got.devices, None);
    }

    #[test]
    fn d_no_gpus_with_the_isolator_discovers_all() {
        let got = ok(ISO, Some("cpus:1"), None, &node(4));
        assert_eq!((got.source, got.gpus), (GpuSource::Discovered, 4.0));
        assert_eq!(got.resources, "cpus:1;gpus:4");
        assert_eq!(got.devices, Some(vec![0, 1, 2, 3]));
    }

    #[test]
    fn e_explicit_zero_advertises_none() {
        let got = ok(ISO, Some("cpus:1;gpus:0"), None, &node(4));
        assert_eq!(
            (got.source, got.gpus, got.devices.clone()),
            (GpuSource::ExplicitZero, 0.0, None)
        );
        assert_eq!(
            got.resources, "cpus:1;gpus:0",
            "gpus:0 is kept so the agent does not auto-discover"
        );
        assert!(got.attributes.is_empty());
    }

    #[test]
    fn f_devices_and_matching_gpus() {
        let got = ok(ISO, Some("gpus:1"), Some("0"), &node(4));
        assert_eq!(
            (got.source, got.gpus, got.devices.clone()),
            (GpuSource::Explicit, 1.0, Some(vec![0]))
        );
        assert_eq!(got.flags()[0], "--resources=gpus:1");
        assert_eq!(got.flags()[2], "--nvidia_gpu_devices=0");
    }

    #[test]
    fn g_devices_without_gpus_fail() {
        let err = resolve(ISO, Some("cpus:1"), Some("0"), &node(4)).expect_err("rule 4");
        assert!(
            matches!(err, AgentFlagsError::DevicesWithoutGpus { .. }),
            "{err}"
        );
    }

    #[test]
    fn h_gpus_without_devices_fail() {
        let err = resolve(ISO, Some("gpus:4"), None, &node(4)).expect_err("rule 4");
        assert!(
            matches!(err, AgentFlagsError::GpusWithoutDevices { gpus, .. } if gpus == 4.0),
            "{err}"
        );
    }

    #[test]
    fn i_count_mismatch_fails() {
        let err = resolve(ISO, Some("gpus:2"), Some("0"), &node(4)).expect_err("mismatch");
        assert!(
            matches!(err, AgentFlagsError::Mismatch { listed: 1, .. }),
            "{err}"
        );
    }

    #[test]
    fn j_devices_with_zero_gpus_fail() {
        let err = resolve(ISO, Some("gpus:0"), Some("0"), &node(4)).expect_err("rule 3");
        assert!(
            matches!(err, AgentFlagsError::DevicesWithZeroGpus { .. }),
            "{err}"
        );
    }

    #[test]
    fn k_more_than_available_fails() {
        let err = resolve(ISO, Some("gpus:8"), Some(&list(8)), &node(4)).expect_err("too many");
        assert!(
            matches!(err, AgentFlagsError::MoreThanAvailable { available: 4, .. }),
            "{err}"
        );
    }

    #[test]
    fn l_duplicates_fail() {
        let err =
            resolve(ISO, Some("cpus:1;gpus:1"), Some("0,0"), &node(4)).expect_err("duplicates");
        assert!(
            matches!(&err, AgentFlagsError::Duplicates { duplicates, .. } if duplicates == &[0]),
            "{err}"
        );
    }

    // Beyond the upstream matrix.

    #[test]
    fn fractional_gpus_fail_with_devices() {
        let err = resolve(ISO, Some("gpus:1.5"), Some("0"), &node(4)).expect_err("fractional");
        assert!(
            err.to_string()
                .contains("gpus:1.5: the 'gpus' resource must be a non-negative whole number")
        );
        // The fraction is reported first, before the missing device list (issue 14).
        let err = resolve(ISO, Some("gpus:0.5"), None, &node(4)).expect_err("no devices");
        assert!(
            matches!(err, AgentFlagsError::NotWholeNumber { .. }),
            "{err}"
        );
    }

    #[test]
    fn negative_and_nan_gpus_fail_to_parse() {
        for bad in ["gpus:-1", "gpus:nan", "gpus:NaN", "gpus:inf"] {
            for iso in [ISO, DEFAULT_ISOLATION] {
                let err = resolve(iso, Some(bad), None, &node(2)).expect_err(bad);
                assert!(
                    matches!(
                        err,
                        AgentFlagsError::Resources(ResourcesError::BadScalar { .. })
                    ),
                    "{bad}: {err}"
                );
            }
        }
    }

    #[test]
    fn zero_lookalikes_are_not_explicit_zero() {
        let got = ok(ISO, Some("cpus:1;mygpus:0;gpus_reserved:0"), None, &node(2));
        assert_eq!((got.source, got.gpus), (GpuSource::Discovered, 2.0));
        assert_eq!(got.resources, "cpus:1;mygpus:0;gpus_reserved:0;gpus:2");
    }

    #[test]
    fn explicit_zero_in_any_form() {
        for zero in [
            "gpus:0.0",
            "gpus(ml):0",
            " gpus : 0 ",
            r#"[{"name":"gpus","type":"SCALAR","scalar":{"value":0}}]"#,
        ] {
            let got = ok(ISO, Some(zero), None, &node(2));
            assert_eq!(got.source, GpuSource::ExplicitZero, "{zero}");
        }
    }

    #[test]
    fn bad_devices_lists() {
        for bad in ["", " ", "0,,1", "a", "-1", "0;1", "1.0"] {
            let err = resolve(ISO, Some("gpus:1"), Some(bad), &node(2)).expect_err(bad);
            assert!(
                matches!(err, AgentFlagsError::BadDevices { .. }),
                "{bad:?}: {err}"
            );
        }
        assert_eq!(
            ok(ISO, Some("gpus:2"), Some(" 1 , 0 "), &node(2)).devices,
            Some(vec![1, 0])
        );
    }

    #[test]
    fn unknown_and_lost_devices_fail() {
        let mut inv = node(4);
        inv.gpus.remove(2);
        let err = resolve(ISO, Some("gpus:1"), Some("2"), &inv).expect_err("unknown index");
        assert!(
            matches!(err, AgentFlagsError::UnknownDevice { index: 2, .. }),
            "{err}"
        );
        inv.gpus[1].healthy = false;
        let err = resolve(ISO, Some("gpus:1"), Some("1"), &inv).expect_err("lost");
        assert!(
            matches!(err, AgentFlagsError::LostDevice { index: 1, .. }),
            "{err}"
        );
        let got = ok(ISO, None, None, &inv);
        assert_eq!(
            (got.gpus, got.devices),
            (2.0, Some(vec![0, 3])),
            "lost GPU 1 left out"
        );
    }

    #[test]
    fn no_nvml_passes_through_even_with_the_isolator() {
        let got = ok(ISO, Some("gpus:3"), None, &no_driver());
        assert_eq!(
            (got.source, got.gpus, got.devices.clone()),
            (GpuSource::Passthrough, 3.0, None)
        );
        assert!(
            got.attributes.is_empty(),
            "nothing known about the GPUs: {}",
            got.attributes
        );
        let err =
            resolve(DEFAULT_ISOLATION, None, Some("0"), &no_driver()).expect_err("rule 1 first");
        assert!(matches!(
            err,
            AgentFlagsError::DevicesWithoutIsolator { .. }
        ));
    }

    #[test]
    fn driver_without_gpus_discovers_none() {
        let got = ok(ISO, Some("cpus:1"), None, &node(0));
        assert_eq!(
            (got.gpus, got.resources.as_str(), got.devices),
            (0.0, "cpus:1", None)
        );
    }

    #[test]
    fn isolation_tokens_are_matched_whole() {
        let got = ok("posix/cpu,gpu/nvidia-extra", Some("cpus:1"), None, &node(2));
        assert_eq!(got.source, GpuSource::Passthrough);
        assert!(
            ok(" posix/cpu , gpu/nvidia ", None, None, &node(2))
                .devices
                .is_some()
        );
    }

    #[test]
    fn attributes_and_flags_lines() {
        let flags = AgentGpuFlags::parse(
            ISO,
            Some("cpus:8;mem:4096"),
            None,
            Some("rack:a1"),
            DEVICES_FLAG,
        )
        .expect("parse")
        .with_driver_attributes(true);
        let got = flags.resolve(&node(2)).expect("resolve");
        assert_eq!(
            got.flags(),
            [
                "--resources=cpus:8;mem:4096;gpus:2",
                "--attributes=rack:a1;gpu_model:Tesla-T4;gpu_memory_mib:16384;gpu_compute_capability:7.5;\
                 nvidia_driver:550.54.14;cuda_version:12.4",
                "--nvidia_gpu_devices=0,1",
            ]
        );
        let flags = AgentGpuFlags::parse(ISO, None, None, Some("gpu_model:x"), DEVICES_FLAG)
            .expect("parse");
        assert!(matches!(
            flags.resolve(&node(1)),
            Err(AgentFlagsError::Attributes(_))
        ));
    }

    #[test]
    fn driver_attributes_are_left_out_unless_asked_for() {
        let flags = AgentGpuFlags::parse(
            ISO,
            Some("cpus:8"),
            None,
            Some("nvidia_driver:pinned"),
            DEVICES_FLAG,
        )
        .expect("parse");
        let got = flags.resolve(&node(2)).expect("resolve");
        assert_eq!(
            got.attributes,
            "nvidia_driver:pinned;gpu_model:Tesla-T4;gpu_memory_mib:16384;gpu_compute_capability:7.5",
            "a driver upgrade must not change the agent's attributes (Mesos refuses to recover then)"
        );
        let asked = flags.with_driver_attributes(true);
        assert!(matches!(
            asked.resolve(&node(2)),
            Err(AgentFlagsError::Attributes(_))
        ));
    }

    proptest::proptest! {
        /// Whatever the flags, an accepted result advertises distinct, healthy GPUs of the node,
        /// as many as `gpus`, and the rendered `--resources` parses back to that amount.
        #[test]
        fn accepted_results_are_consistent(
            isolator in proptest::bool::ANY,
            count in 0u32..6,
            gpus in proptest::option::of(0u32..8),
            devices in proptest::option::of(proptest::collection::vec(0u32..8, 0..8)),
            lost in proptest::option::of(0u32..6),
        ) {
            let mut inv = node(count);
            if let Some(g) = lost.and_then(|l| inv.gpus.get_mut(l as usize)) {
                g.healthy = false;
            }
            let iso = if isolator { ISO } else { DEFAULT_ISOLATION };
            let resources = gpus.map(|g| format!("cpus:1;gpus:{g}"));
            let devices = devices.map(|d| join_indices(&d)).filter(|d| !d.is_empty());
            if let Ok(got) = resolve(iso, resources.as_deref(), devices.as_deref(), &inv) {
                let again = Resources::parse(&got.resources).expect("rendered resources parse");
                proptest::prop_assert_eq!(again.gpus().map_or(0.0, |g| g.total), got.gpus);
                if let Some(list) = &got.devices {
                    proptest::prop_assert!(isolator);
                    proptest::prop_assert_eq!(list.len() as f64, got.gpus);
                    proptest::prop_assert!(duplicates(list).is_empty());
                    proptest::prop_assert!(list.iter().all(|&i| inv.by_index(i).is_some_and(|g| g.healthy)));
                }
            }
        }
    }

    #[test]
    fn the_module_discovers_gpus_and_keeps_the_device_list_to_itself() {
        const MODULE: &str =
            "filesystem/linux,cgroups/devices,org_apache_mesos_gpu_MesosGpuIsolator";
        let got = ok(MODULE, Some("cpus:8"), None, &node(4));
        assert_eq!(
            (got.source, got.isolator, got.gpus),
            (GpuSource::Discovered, GpuIsolator::Module, 4.0)
        );
        assert_eq!(got.flags()[0], "--resources=cpus:8;gpus:4");
        assert!(
            !got.flags()
                .iter()
                .any(|f| f.starts_with("--nvidia_gpu_devices")),
            "{:?}",
            got.flags()
        );
        assert_eq!(got.module_devices(&node(4)), None, "every GPU: the default");
        let got = ok(MODULE, Some("gpus:2"), Some("3,1"), &node(4));
        assert_eq!(got.module_devices(&node(4)).as_deref(), Some("3,1"));
        let mut lost = node(4);
        lost.gpus[2].healthy = false;
        let got = ok(MODULE, None, None, &lost);
        assert_eq!(got.module_devices(&lost).as_deref(), Some("0,1,3"));
        let err = resolve(MODULE, Some("gpus:2"), None, &node(4)).expect_err("rule 4");
        assert!(
            matches!(err, AgentFlagsError::GpusWithoutDevices { .. }),
            "{err}"
        );
        let err = AgentGpuFlags::parse(
            &format!("gpu/nvidia,{MODULE}"),
            None,
            None,
            None,
            DEVICES_FLAG,
        )
        .expect_err("two isolators");
        assert!(
            matches!(err, AgentFlagsError::TwoGpuIsolators { .. }),
            "{err}"
        );
        assert!(err.to_string().contains("remove `gpu/nvidia`"), "{err}");
    }

    #[test]
    fn json_resources_are_rewritten_as_json() {
        let text = r#"[{"name":"cpus","type":"SCALAR","scalar":{"value":4}}]"#;
        let got = ok(ISO, Some(text), None, &node(2));
        let v: serde_json::Value = serde_json::from_str(&got.resources).expect("json");
        assert_eq!(v[1]["name"], "gpus");
        assert_eq!(v[1]["scalar"]["value"], 2);
    }
}
