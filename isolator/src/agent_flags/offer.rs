//! The rule the module applies to the agent's `--resources` when the agent starts: the agent
//! advertises exactly the GPU units the module hands out, no phantom ones.
//!
//! Mesos's `gpu/nvidia` refuses to start an agent whose `--resources` name GPUs it cannot back
//! (`enumerateGpuResources`, `src/slave/containerizer/mesos/isolators/gpu/allocator.cpp`
//! 141-245: a fractional `gpus`, `gpus` without `--nvidia_gpu_devices` or the reverse, a count
//! different from the list, more than the machine has, `--nvidia_gpu_devices` with `gpus:0`).
//! Mesos never asks a module isolator, so an agent with the module would register with whatever
//! `--resources` says (`gpus:16` on an 8-GPU node), and tasks given the phantom units would wait
//! in `prepare` and fail. [`check_agent_resources`] refuses the same mistakes, adapted to what
//! the module offers ([`AgentGpuFlags::advertise`], the function `agent-flags` prints from): the
//! module's `nvidia_gpu_devices` parameter stands for `--nvidia_gpu_devices` (every usable GPU
//! when it is not set, as `agent-flags` leaves it out then), a GPU shared R ways counts R units,
//! MIG devices are `gpus` units under the single strategy and `mig-<profile>` scalars under
//! mixed.

use std::collections::BTreeMap;

use mesos_gpu_node::inventory::Inventory;
use mesos_gpu_placement::sharing::SharingSpec;

use super::{
    AgentFlagsError, AgentGpuFlags, AgentGpus, GPUS, MIG_RESOURCE_PREFIX, MigStrategy,
    ResourceValue, Resources,
};

/// What the module hands out, as the agent's `--resources` must advertise it.
#[derive(Debug, Clone, PartialEq)]
pub struct ModuleOffer {
    /// The `gpus` units and each `mig-<profile>` scalar the module serves, by name (`gpus`
    /// always present).
    pub scalars: BTreeMap<String, f64>,
    /// How the units come about, for messages: `8 GPUs`, `GPUs 0,1 (nvidia_gpu_devices)`, ….
    pub what: String,
}

/// What the agent advertises that the module does not hand out, or the reverse.
#[derive(Debug, thiserror::Error)]
pub enum OfferMismatch {
    /// A GPU scalar whose amount is not what the module serves.
    #[error(
        "the agent's --resources advertise {resource}:{given}, but the GPU module hands out \
         {resource}:{offered} on this node ({what}): tasks given units the module cannot back \
         would wait and fail. Advertise {resource}:{offered} (`mesos-gpu agent-flags` prints the \
         agent's flags for the module's parameters), or change the module's parameters \
         (nvidia_gpu_devices, gpu_replicas, mig_strategy)"
    )]
    Count {
        /// `gpus` or `mig-<profile>`.
        resource: String,
        /// The amount in `--resources`.
        given: f64,
        /// The units the module serves.
        offered: f64,
        /// How those units come about.
        what: String,
    },
    /// A `mig-<profile>` scalar under the single strategy, where MIG devices are `gpus`.
    #[error(
        "the agent's --resources advertise {resource}:{given}, but the GPU module's mig_strategy \
         is single: MIG devices are offered as gpus units and no task is ever given a \
         {resource}; remove it from --resources, or set the module parameter mig_strategy=mixed"
    )]
    MigScalarUnderSingle {
        /// The `mig-<profile>` scalar.
        resource: String,
        /// Its amount.
        given: f64,
    },
    /// The module's device list without `gpus` in `--resources` (Mesos's rule 4).
    #[error(
        "the GPU module's nvidia_gpu_devices parameter lists GPUs {devices}, but the agent's \
         --resources have no 'gpus': add gpus:{offered} to --resources, or remove the parameter"
    )]
    DevicesWithoutGpus {
        /// The list, as given.
        devices: String,
        /// The units those GPUs make.
        offered: f64,
    },
    /// The module's device list with `gpus:0` (Mesos's rule 3).
    #[error(
        "the GPU module's nvidia_gpu_devices parameter lists GPUs {devices}, but the agent's \
         --resources specify gpus:0: remove the parameter, or advertise gpus:{offered}"
    )]
    DevicesWithZeroGpus {
        /// The list, as given.
        devices: String,
        /// The units those GPUs make.
        offered: f64,
    },
    /// The module's parameters do not fit the node (a listed GPU it does not have, …).
    #[error("the GPU module's parameters do not fit this node")]
    Module {
        /// Why.
        #[source]
        source: AgentFlagsError,
    },
    /// `--resources` does not parse, or `gpus` is fractional.
    #[error(transparent)]
    Resources(AgentFlagsError),
}

/// The module's parameters that decide what it hands out.
#[derive(Debug, Clone, Copy)]
pub struct ModuleGpus<'a> {
    /// `nvidia_gpu_devices`, when given.
    pub devices: Option<&'a [u32]>,
    /// `mig_strategy`.
    pub strategy: MigStrategy,
    /// `gpu_replicas` with `gpu_sharing`, when given.
    pub sharing: Option<&'a SharingSpec>,
}

impl ModuleGpus<'_> {
    /// What the module hands out on `inventory`: the same flags `agent-flags` prints.
    pub fn offer(&self, inventory: &Inventory) -> Result<ModuleOffer, AgentFlagsError> {
        let advertised = AgentGpuFlags::for_module(self.devices).advertise(
            inventory,
            self.strategy,
            self.sharing,
        )?;
        Ok(ModuleOffer {
            scalars: gpu_scalars(&Resources::parse(&advertised.resources)?),
            what: self.describe(inventory, &advertised),
        })
    }

    fn describe(&self, inventory: &Inventory, advertised: &AgentGpus) -> String {
        let mut parts = Vec::new();
        let whole = match (&advertised.devices, self.devices) {
            (Some(devices), Some(_)) => {
                format!("GPUs {} (nvidia_gpu_devices)", super::join_indices(devices))
            }
            (Some(devices), None) => format!("{} usable GPUs", devices.len()),
            (None, _) => format!(
                "{} usable GPUs not in MIG mode",
                inventory.whole_gpus().filter(|g| g.healthy).count()
            ),
        };
        parts.push(whole);
        if !inventory.mig.is_empty() {
            let mig = super::mig::offered_devices(inventory).count();
            parts.push(format!("{mig} MIG devices, mig_strategy {}", self.strategy));
        }
        if self.sharing.is_some() {
            parts.push("shared GPUs counted once per replica (gpu_replicas)".to_owned());
        }
        parts.join("; ")
    }
}

/// Checks the agent's `--resources` (`None`: not given) against what the module hands out on
/// `inventory` with `module`'s parameters, in Mesos's order: `--resources` must parse and its
/// `gpus` be a whole number; a device list needs `gpus`, and not `gpus:0`; an explicit `gpus:0`
/// advertises none; any other `gpus`, and every `mig-<profile>` scalar, must equal the module's
/// units. Returns the offer, for the log; `gpus` left out of `--resources` is not an error (the
/// agent then offers no GPU, as with `gpus:0`).
pub fn check_agent_resources(
    resources: Option<&str>,
    inventory: &Inventory,
    module: &ModuleGpus<'_>,
) -> Result<ModuleOffer, OfferMismatch> {
    let given = Resources::parse(resources.unwrap_or(""))
        .map_err(|e| OfferMismatch::Resources(e.into()))?;
    let gpus = given.gpus().map(|g| g.total);
    if let Some(gpus) = gpus
        && gpus.fract() != 0.0
    {
        return Err(OfferMismatch::Resources(AgentFlagsError::NotWholeNumber {
            gpus,
        }));
    }
    let offer = module
        .offer(inventory)
        .map_err(|source| OfferMismatch::Module { source })?;
    let offered = |name: &str| offer.scalars.get(name).copied().unwrap_or(0.0);
    let listed = module.devices.map(super::join_indices);
    match (gpus, listed) {
        (None, Some(devices)) => {
            return Err(OfferMismatch::DevicesWithoutGpus {
                devices,
                offered: offered(GPUS),
            });
        }
        (Some(0.0), Some(devices)) => {
            return Err(OfferMismatch::DevicesWithZeroGpus {
                devices,
                offered: offered(GPUS),
            });
        }
        (None | Some(0.0), None) => {}
        (Some(given), _) => compare(GPUS, given, offered(GPUS), &offer)?,
    }
    let mig = gpu_scalars(&given)
        .into_iter()
        .filter(|(name, _)| name != GPUS);
    for (name, amount) in mig {
        if module.strategy == MigStrategy::Single {
            return Err(OfferMismatch::MigScalarUnderSingle {
                resource: name,
                given: amount,
            });
        }
        compare(&name, amount, offered(&name), &offer)?;
    }
    Ok(offer)
}

fn compare(
    resource: &str,
    given: f64,
    offered: f64,
    offer: &ModuleOffer,
) -> Result<(), OfferMismatch> {
    if given == offered {
        return Ok(());
    }
    Err(OfferMismatch::Count {
        resource: resource.to_owned(),
        given,
        offered,
        what: offer.what.clone(),
    })
}

/// The `gpus` total (always present) and each `mig-<profile>` scalar of a `--resources`,
/// summed over roles.
fn gpu_scalars(resources: &Resources) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::from([(GPUS.to_owned(), 0.0)]);
    for r in resources.entries() {
        if let ResourceValue::Scalar(v) = r.value
            && (r.name == GPUS || r.name.starts_with(MIG_RESOURCE_PREFIX))
        {
            *out.entry(r.name.clone()).or_default() += v;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use mesos_gpu_node::inventory::DriverInfo;
    use mesos_gpu_placement::sharing::plan::{ModeSpec, SharingMode};

    fn dgx1() -> Inventory {
        let mut inv = mesos_gpu_node::nodes::dgx1_v100().inventory();
        inv.driver = Some(DriverInfo {
            version: "550.54.14".into(),
            cuda_version: Some((12, 4)),
        });
        inv
    }

    fn mig_node() -> Inventory {
        let mut inv = mesos_gpu_node::nodes::dgx1_with_mig_gpus();
        inv.driver = dgx1().driver;
        inv
    }

    const WHOLE: ModuleGpus<'static> = ModuleGpus {
        devices: None,
        strategy: MigStrategy::Single,
        sharing: None,
    };

    fn check(
        resources: &str,
        inv: &Inventory,
        module: &ModuleGpus<'_>,
    ) -> Result<ModuleOffer, OfferMismatch> {
        check_agent_resources(Some(resources), inv, module)
    }

    #[test]
    fn the_agent_advertising_what_agent_flags_prints_starts() {
        let offer = check("cpus:4;mem:4096;gpus:8", &dgx1(), &WHOLE).unwrap();
        assert_eq!(offer.scalars[GPUS], 8.0);
        check("cpus:4;gpus(ml):2;gpus:6", &dgx1(), &WHOLE).unwrap();
        check("cpus:4;gpus:0", &dgx1(), &WHOLE).unwrap();
        check_agent_resources(None, &dgx1(), &WHOLE).unwrap();
    }

    #[test]
    fn phantom_gpus_are_refused_naming_both_counts() {
        let err = check("cpus:1;gpus:16", &dgx1(), &WHOLE).unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("advertise gpus:16") && text.contains("hands out gpus:8"),
            "{text}"
        );
        let err = check("cpus:1;gpus:4", &dgx1(), &WHOLE).unwrap_err();
        assert!(
            matches!(err, OfferMismatch::Count { offered: 8.0, .. }),
            "{err}"
        );
    }

    #[test]
    fn the_device_list_stands_for_nvidia_gpu_devices() {
        let zero = [0u32];
        let listed = ModuleGpus {
            devices: Some(&zero),
            ..WHOLE
        };
        let err = check("gpus:2", &dgx1(), &listed).unwrap_err();
        assert!(
            err.to_string().contains("GPUs 0 (nvidia_gpu_devices)"),
            "{err}"
        );
        check("gpus:1", &dgx1(), &listed).unwrap();
        let err = check("cpus:1", &dgx1(), &listed).unwrap_err();
        assert!(
            matches!(err, OfferMismatch::DevicesWithoutGpus { .. }),
            "{err}"
        );
        let err = check("gpus:0", &dgx1(), &listed).unwrap_err();
        assert!(
            matches!(err, OfferMismatch::DevicesWithZeroGpus { .. }),
            "{err}"
        );
        let nine = [9u32];
        let err = check(
            "gpus:1",
            &dgx1(),
            &ModuleGpus {
                devices: Some(&nine),
                ..WHOLE
            },
        )
        .unwrap_err();
        assert!(
            matches!(
                err,
                OfferMismatch::Module {
                    source: AgentFlagsError::UnknownDevice { index: 9, .. }
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn fractional_gpus_are_refused_as_mesos_refuses_them() {
        let err = check("gpus:1.5", &dgx1(), &WHOLE).unwrap_err();
        assert!(
            err.to_string()
                .contains("must be a non-negative whole number"),
            "{err}"
        );
    }

    #[test]
    fn a_shared_gpu_counts_its_replicas() {
        let spec =
            SharingSpec::parse("4,6=1,7=1", ModeSpec::uniform(SharingMode::TimeSlicing)).unwrap();
        let shared = ModuleGpus {
            sharing: Some(&spec),
            ..WHOLE
        };
        check("gpus:26", &dgx1(), &shared).unwrap();
        let err = check("gpus:8", &dgx1(), &shared).unwrap_err();
        assert!(
            matches!(err, OfferMismatch::Count { offered: 26.0, .. }),
            "{err}"
        );
    }

    #[test]
    fn mig_devices_count_in_the_strategys_resource() {
        let inv = mig_node();
        let single = check("gpus:1", &inv, &WHOLE).unwrap_err();
        let units = match single {
            OfferMismatch::Count { offered, .. } => offered,
            other => panic!("{other}"),
        };
        check(&format!("gpus:{units}"), &inv, &WHOLE).unwrap();
        let err = check(&format!("gpus:{units};mig-1g.5gb:1"), &inv, &WHOLE).unwrap_err();
        assert!(
            matches!(err, OfferMismatch::MigScalarUnderSingle { .. }),
            "{err}"
        );
        let mixed = ModuleGpus {
            strategy: MigStrategy::Mixed,
            ..WHOLE
        };
        let offer = mixed.offer(&inv).unwrap();
        let resources: Vec<String> = offer
            .scalars
            .iter()
            .map(|(name, n)| format!("{name}:{n}"))
            .collect();
        check(&resources.join(";"), &inv, &mixed).unwrap();
        let err = check(
            &format!("gpus:{};mig-1g.5gb:99", offer.scalars[GPUS]),
            &inv,
            &mixed,
        )
        .unwrap_err();
        assert!(err.to_string().contains("advertise mig-1g.5gb:99"), "{err}");
        let err = check(
            &format!("gpus:{};mig-7g.80gb:1", offer.scalars[GPUS]),
            &inv,
            &mixed,
        )
        .unwrap_err();
        assert!(
            matches!(err, OfferMismatch::Count { offered: 0.0, .. }),
            "a profile the node lacks: {err}"
        );
    }
}
