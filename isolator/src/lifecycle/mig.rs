//! MIG devices in the container lifecycle (issue 16): a container may hold MIG devices (by
//! `MIG-…` UUID, from [`mesos_gpu_placement::mig::MigUnits`]) beside whole GPUs (from the allocator, which
//! never manages a GPU in MIG mode).
//!
//! What a request takes, by [`MigStrategy`] (as `agent-flags --mig-strategy` offers them):
//! - `single`: `gpus:k` counts MIG devices and whole GPUs alike; it takes k MIG devices when
//!   that many are free (more than one only when the operator allows it: CUDA uses one MIG
//!   device per process), else k whole GPUs, else it is refused with both reasons;
//! - `mixed`: `gpus` takes whole GPUs, and each `mig-<profile>` scalar that many MIG devices of
//!   that profile ([`super::PrepareConfig::mig`], keyed by profile id).
//!
//! With MIG devices shared under MPS ([`mesos_gpu_placement::sharing::plan`]) each of them is R
//! units of the same resource (single: `gpus`; mixed: its `mig-<profile>` scalar), and a request
//! of k ≤ R units is first a k/R share of one of them (packed), as a `gpus` request is on shared
//! GPUs; shared MIG devices are never handed out whole. A share holder's grant holds its MIG
//! device as a whole holder's does (device cgroup, nodes, `*_VISIBLE_DEVICES`), plus the share
//! and the MPS variables and pipe directory of that device's own daemon.
//!
//! What a container holding MIG devices gets (its parents' nodes and capability nodes, the
//! variables naming the `MIG-…` UUIDs, the `access` files) is its [`mesos_gpu_grant::Grant`]'s.
//! A request for MIG devices and whole GPUs together is refused with the reason (a CUDA process
//! enumerates a single MIG device and no GPU beside it), and so is a task whose capabilities
//! include CAP_SYS_ADMIN unless the operator allows it (it grants every MIG capability whatever
//! its device files).
//!
//! Every step below takes from the state through the caller's [`super::taking::Taking`], which
//! gives everything back when a later step refuses.

use std::path::PathBuf;

use super::launch::PrepareConfig;
use super::state::State;
use super::{ContainerId, Isolator, LifecycleError};
use crate::mig_strategy::MigStrategy;

use mesos_gpu_grant::{mig::MigAccess, mig::check_capabilities};
use mesos_gpu_node::inventory::Inventory;
use mesos_gpu_placement::mig::{MigError, MigUnits};
use mesos_gpu_placement::sharing::{Among, PlacedShare, Wanted};
use mesos_gpu_placement::{allocator::GpuRequest, allocator::GpuSet};

/// How MIG devices are handed out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigConfig {
    /// How `gpus` and `mig-<profile>` requests map to MIG devices.
    pub strategy: MigStrategy,
    /// A task may hold more than one MIG device (CUDA uses only one per process).
    pub allow_multiple: bool,
    /// A task holding MIG devices may run with CAP_SYS_ADMIN.
    pub allow_sys_admin: bool,
    /// Where `nvidia-caps/nvidia-cap<N>` are (the device root).
    pub dev_root: PathBuf,
    /// Where the driver's `driver/nvidia/capabilities/…/access` files are (the proc root).
    pub proc_root: PathBuf,
}

impl Default for MigConfig {
    fn default() -> MigConfig {
        MigConfig {
            strategy: MigStrategy::Single,
            allow_multiple: false,
            allow_sys_admin: false,
            dev_root: PathBuf::from("/dev"),
            proc_root: PathBuf::from(mesos_gpu_node::discovery::DEFAULT_PROC_ROOT),
        }
    }
}

impl Isolator {
    /// What `id` takes for `config`: whole GPUs or MIG devices, or a share (of a shared GPU
    /// or MIG device) as `wanted` allows; what was taken before a refusal is the caller's
    /// [`super::taking::Taking`]'s to give back.
    #[allow(clippy::type_complexity)]
    pub(crate) fn take_with_mig(
        &self,
        state: &mut State,
        id: &ContainerId,
        config: &PrepareConfig,
        step: &'static str,
        wanted: Wanted,
    ) -> Result<(GpuSet, Vec<String>, Option<PlacedShare>), LifecycleError> {
        let mig_err = |source| LifecycleError::Mig {
            container: id.clone(),
            step,
            source: Box::new(source),
        };
        let alloc_err = |source| LifecycleError::Allocation {
            container: id.clone(),
            step,
            source,
        };
        let taken = match self.mig.strategy {
            MigStrategy::Single => {
                if !config.mig.is_empty() {
                    return Err(LifecycleError::MigStrategy {
                        container: id.clone(),
                        why: "mig-<profile> resources are offered by the mixed strategy; this agent's module uses single (ask for gpus)".into(),
                    });
                }
                let devices = u32::try_from(state.mig.len()).unwrap_or(u32::MAX);
                let units = self
                    .sharing
                    .as_ref()
                    .map_or_else(|| state.allocator.offered(), |s| s.plan.units());
                let k = GpuRequest::from_scalar(config.gpus, units.saturating_add(devices))
                    .map_err(alloc_err)?
                    .count();
                if k == 0 {
                    return Ok((GpuSet::EMPTY, Vec::new(), None));
                }
                if let Some(grant) = self.try_share(state, id, k, step, wanted, Among::All)? {
                    (GpuSet::EMPTY, Vec::new(), Some(grant))
                } else {
                    match state.mig.allocate(id.as_str(), k, None) {
                        Ok(uuids) => (GpuSet::EMPTY, uuids, None),
                        Err(mig) => match self.allocate_shared(state, id, k, step) {
                            Ok(set) => (set, Vec::new(), None),
                            Err(LifecycleError::Refused { shortage, .. }) => {
                                return Err(LifecycleError::MigRefused {
                                    container: id.clone(),
                                    step,
                                    mig: Box::new(mig),
                                    whole: shortage,
                                });
                            }
                            Err(LifecycleError::Allocation { .. }) => return Err(mig_err(mig)),
                            Err(e) => return Err(e),
                        },
                    }
                }
            }
            MigStrategy::Mixed => {
                let asked: u32 = config.mig.values().sum();
                if asked == 0 {
                    // Whole GPUs or a share of a shared GPU not in MIG mode.
                    let (set, grant) =
                        self.take_units(state, id, config.gpus, step, wanted, Among::Gpus)?;
                    return Ok((set, Vec::new(), grant));
                }
                if let Some(grant) = self.take_mig_share(state, id, config, step, wanted)? {
                    (GpuSet::EMPTY, Vec::new(), Some(grant))
                } else {
                    let count = state
                        .allocator
                        .request(config.gpus)
                        .map_err(alloc_err)?
                        .count();
                    if count > 0 {
                        return Err(LifecycleError::Grant {
                            container: id.clone(),
                            source: mesos_gpu_grant::GrantError::MigWithGpus {
                                mig: config
                                    .mig
                                    .iter()
                                    .map(|(kind, n)| format!("{n} of profile {kind}"))
                                    .collect::<Vec<_>>()
                                    .join(", "),
                                gpus: format!("{count} GPU(s)"),
                            },
                        });
                    }
                    if asked > 1 && !self.mig.allow_multiple {
                        return Err(mig_err(MigError::TooMany {
                            owner: id.to_string(),
                            requested: asked,
                        }));
                    }
                    let mut uuids = Vec::new();
                    for (&kind, &n) in &config.mig {
                        uuids.extend(
                            state
                                .mig
                                .allocate(id.as_str(), n, Some(kind))
                                .map_err(mig_err)?,
                        );
                    }
                    (GpuSet::EMPTY, uuids, None)
                }
            }
        };
        let holds_mig = !taken.1.is_empty() || taken.2.as_ref().is_some_and(PlacedShare::is_mig);
        if holds_mig {
            check_capabilities(id.as_str(), &config.capabilities, self.mig.allow_sys_admin)
                .map_err(mig_err)?;
        }
        Ok(taken)
    }

    /// Under the mixed strategy, a share of a MIG device for a `mig-<profile>:k` request whose
    /// profile has shared MIG devices: `None` when it has none (or, asking any share, none has
    /// room: then whole MIG devices of the profile serve it if free). A share is the task's only
    /// GPU resource.
    fn take_mig_share(
        &self,
        state: &mut State,
        id: &ContainerId,
        config: &PrepareConfig,
        step: &'static str,
        wanted: Wanted,
    ) -> Result<Option<PlacedShare>, LifecycleError> {
        let Some(plan) = self.sharing.as_ref().map(|s| &s.plan) else {
            return Ok(None);
        };
        let mut asked = config.mig.iter().filter(|&(_, &n)| n > 0);
        let Some((&kind, &k)) = asked.next() else {
            return Ok(None);
        };
        if plan.largest_in(Among::Mig(kind)) == 0 {
            return Ok(None);
        }
        if asked.next().is_some() || config.gpus > 0.0 {
            return Err(LifecycleError::MigStrategy {
                container: id.clone(),
                why: format!(
                    "MIG devices of profile {kind} are shared under MPS on this node, and a share of one is a task's only GPU resource: ask for its mig-<profile> scalar alone (gpus:{} and {} MIG profile(s) asked)",
                    config.gpus,
                    config.mig.values().filter(|&&n| n > 0).count()
                ),
            });
        }
        self.try_share(state, id, k, step, wanted, Among::Mig(kind))
    }

    /// The node's MIG devices as allocation units, none held ([`units_of`]).
    pub(crate) fn mig_units(&self) -> MigUnits {
        units_of(
            &self.inventory,
            self.sharing.as_ref(),
            self.mig.allow_multiple,
        )
    }

    /// `update` of a container holding MIG devices: the same request changes nothing (Mesos
    /// calls `update` whenever any resource changes); another is refused.
    pub(crate) fn update_mig(
        &self,
        id: &ContainerId,
        entry: &super::state::Container,
        gpus: f64,
    ) -> Result<(), LifecycleError> {
        let held = entry.gpus.len()
            + match self.mig.strategy {
                MigStrategy::Single => u32::try_from(entry.mig.len()).unwrap_or(u32::MAX),
                MigStrategy::Mixed => 0,
            };
        let asked = GpuRequest::from_scalar(gpus, u32::MAX).map(|r| r.count());
        if asked.as_ref().ok() == Some(&held) {
            return Ok(());
        }
        Err(LifecycleError::MigResize {
            container: id.clone(),
            devices: entry.mig.join(","),
            asked: gpus,
        })
    }

    /// What the MIG devices `uuids` need in a container.
    pub(crate) fn mig_accesses(
        &self,
        id: &ContainerId,
        uuids: &[String],
    ) -> Result<Vec<MigAccess>, LifecycleError> {
        uuids
            .iter()
            .map(|uuid| {
                let device =
                    self.inventory
                        .mig
                        .by_uuid(uuid)
                        .ok_or_else(|| LifecycleError::Mig {
                            container: id.clone(),
                            step: "isolate",
                            source: Box::new(MigError::NoCaps { uuid: uuid.clone() }),
                        })?;
                MigAccess::of(device, &self.mig.dev_root, &self.mig.proc_root).map_err(|source| {
                    LifecycleError::Mig {
                        container: id.clone(),
                        step: "isolate",
                        source: Box::new(source),
                    }
                })
            })
            .collect()
    }
}

/// The MIG devices of `inventory` handed out whole: those `sharing` offers as shares are not.
pub(crate) fn units_of(
    inventory: &Inventory,
    sharing: Option<&super::shares::Sharing>,
    allow_multiple: bool,
) -> MigUnits {
    let mut layout = inventory.mig.clone();
    if let Some(sharing) = sharing {
        layout
            .devices
            .retain(|d| sharing.plan.shared_gpu(&d.uuid).is_none());
    }
    MigUnits::new(&layout, allow_multiple)
}
