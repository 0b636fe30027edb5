//! What a node with MIG devices offers, by strategy, as NVIDIA's Kubernetes device plugin names
//! them (`docs/reference/mig.md` §3):
//! - `single`: every MIG device is one `gpus` unit, as are the GPUs not in MIG mode (Marathon
//!   and any framework asking for `gpus` work unchanged; Mesos PR #454 does the same);
//! - `mixed`: GPUs not in MIG mode stay `gpus`, and each MIG profile is its own scalar,
//!   `mig-<profile>` (`mig-1g.5gb`), plus an attribute of the same name holding the profile id.
//!
//! MIG devices shared under MPS count R units each, in the same resource
//! ([`MigOffer::of_units`], [`super::advertise_mig_sharing`]).
//!
//! A MIG scalar's name never contains `gpus`: Mesos's built-in code treats any `--resources`
//! entry whose name contains it as a GPU request. MIG devices the driver gives no capability
//! nodes for, or that are unhealthy, are not offered.

use std::collections::BTreeMap;

use super::attributes::{Attribute, safe_text};
use crate::mig_strategy::MigStrategy;
use mesos_gpu_node::inventory::Inventory;

/// The prefix of a MIG profile's scalar resource and attribute.
pub const MIG_RESOURCE_PREFIX: &str = "mig-";

/// The attribute naming the strategy.
pub const ATTR_MIG_STRATEGY: &str = "mig_strategy";

/// The MIG devices a node offers: healthy, with the capability nodes the driver gives them.
pub(crate) fn offered_devices(
    inventory: &Inventory,
) -> impl Iterator<Item = &mesos_gpu_node::inventory::MigDevice> {
    inventory
        .mig
        .devices
        .iter()
        .filter(|d| d.healthy && d.caps.is_some())
}

/// One MIG profile offered as its own scalar (mixed strategy).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProfileOffer {
    /// The scalar's name, `mig-<profile name>`.
    pub resource: String,
    /// The GPU instance profile id, when known.
    pub profile: Option<u32>,
    /// The kind of MIG device the scalar stands for, what a request of it is served from.
    pub kind: Option<mesos_gpu_placement::mig::MigKind>,
    /// How many MIG devices of the profile are offered.
    pub count: u32,
}

/// What a node offers with a MIG strategy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigOffer {
    /// The strategy.
    pub strategy: MigStrategy,
    /// `gpus` units: healthy GPUs not in MIG mode, plus (single) every offered MIG device.
    pub gpus: u32,
    /// (mixed) one scalar per profile, by name.
    pub profiles: Vec<ProfileOffer>,
}

impl MigOffer {
    /// The offer of `inventory` with `strategy`.
    pub fn of(inventory: &Inventory, strategy: MigStrategy) -> MigOffer {
        MigOffer::of_units(inventory, strategy, |_| 1)
    }

    /// The offer of `inventory` with `strategy` when the GPU or MIG device with UUID `u` counts
    /// `units(u)` units (R for one shared R ways, [`super::advertise_mig_sharing`]; 1 for one given
    /// whole).
    pub fn of_units(
        inventory: &Inventory,
        strategy: MigStrategy,
        units: impl Fn(&str) -> u32,
    ) -> MigOffer {
        let whole: u32 = inventory
            .whole_gpus()
            .filter(|g| g.healthy)
            .map(|g| units(&g.uuid))
            .sum();
        let offered: Vec<_> = offered_devices(inventory).collect();
        match strategy {
            MigStrategy::Single => MigOffer {
                strategy,
                gpus: whole + offered.iter().map(|d| units(&d.uuid)).sum::<u32>(),
                profiles: Vec::new(),
            },
            MigStrategy::Mixed => {
                let mut by_name: BTreeMap<String, ProfileOffer> = BTreeMap::new();
                for d in offered {
                    let resource = format!("{MIG_RESOURCE_PREFIX}{}", safe_text(&d.profile_name));
                    by_name
                        .entry(resource.clone())
                        .or_insert(ProfileOffer {
                            resource,
                            profile: d.profile,
                            kind: mesos_gpu_placement::mig::MigKind::of(d),
                            count: 0,
                        })
                        .count += units(&d.uuid);
                }
                MigOffer {
                    strategy,
                    gpus: whole,
                    profiles: by_name.into_values().collect(),
                }
            }
        }
    }

    /// The `--resources` entries: `gpus:N` (when N > 0), then each profile's scalar.
    pub fn resources(&self) -> Vec<String> {
        let mut out = Vec::new();
        if self.gpus > 0 {
            out.push(format!("{}:{}", super::GPUS, self.gpus));
        }
        out.extend(
            self.profiles
                .iter()
                .map(|p| format!("{}:{}", p.resource, p.count)),
        );
        out
    }

    /// The attributes: the strategy, and (mixed) each profile's scalar name with its id.
    pub fn attributes(&self) -> Vec<Attribute> {
        let mut out = vec![Attribute {
            name: ATTR_MIG_STRATEGY.to_owned(),
            value: self.strategy.to_string(),
        }];
        out.extend(self.profiles.iter().filter_map(|p| {
            Some(Attribute {
                name: p.resource.clone(),
                value: p.profile?.to_string(),
            })
        }));
        out
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a failed unwrap fails the test at its line
mod tests {
    use super::*;

    #[test]
    fn a_node_without_mig_offers_its_gpus_in_both_strategies() {
        let inventory = mesos_gpu_node::nodes::dgx1_v100().inventory();
        for strategy in [MigStrategy::Single, MigStrategy::Mixed] {
            let offer = MigOffer::of(&inventory, strategy);
            assert_eq!(offer.resources(), ["gpus:8"]);
        }
    }
}
