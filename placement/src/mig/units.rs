//! [`MigUnits`]: the node's MIG devices, who holds which, and which are unhealthy.

use std::collections::BTreeMap;

use super::{MigError, MigKind};
use mesos_gpu_node::inventory::MigLayout;

/// The state of one MIG device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UnitState {
    /// Free and usable.
    Free,
    /// Held by this owner.
    Held(String),
    /// Out of service (an XID on it or its parent, or its capability nodes are unknown); the
    /// owner, if any, keeps it until it gives it back.
    Unhealthy(Option<String>),
}

#[derive(Debug, Clone)]
struct Unit {
    uuid: String,
    parent: u32,
    kind: Option<MigKind>,
    profile_name: String,
    isolatable: bool,
    healthy: bool,
    /// A health checkpoint of another publisher of the node's pool marks it (or its parent)
    /// unhealthy.
    out_elsewhere: bool,
    owner: Option<String>,
}

/// The MIG devices of a node as allocation units, keyed by UUID, in (parent, MIG index) order.
#[derive(Debug, Clone)]
pub struct MigUnits {
    units: Vec<Unit>,
    allow_multiple: bool,
}

impl MigUnits {
    /// Every MIG device of `layout`; one without capability nodes is never handed out. With
    /// `allow_multiple`, a request may take more than one MIG device.
    pub fn new(layout: &MigLayout, allow_multiple: bool) -> MigUnits {
        let units = layout
            .devices
            .iter()
            .map(|d| Unit {
                uuid: d.uuid.clone(),
                parent: d.parent,
                kind: MigKind::of(d),
                profile_name: d.profile_name.clone(),
                isolatable: d.caps.is_some(),
                healthy: d.healthy,
                out_elsewhere: false,
                owner: None,
            })
            .collect();
        MigUnits {
            units,
            allow_multiple,
        }
    }

    /// How many MIG devices there are.
    pub fn len(&self) -> usize {
        self.units.len()
    }

    /// True when the node has no MIG device.
    pub fn is_empty(&self) -> bool {
        self.units.is_empty()
    }

    fn usable(u: &Unit, kind: Option<MigKind>) -> bool {
        u.owner.is_none()
            && u.healthy
            && !u.out_elsewhere
            && u.isolatable
            && kind.is_none_or(|k| u.kind == Some(k))
    }

    /// Free, healthy, isolatable MIG devices of `kind` (any kind with `None`).
    pub fn free(&self, kind: Option<MigKind>) -> u32 {
        u32::try_from(self.units.iter().filter(|u| Self::usable(u, kind)).count())
            .unwrap_or(u32::MAX)
    }

    /// Free MIG devices by kind, for offers.
    pub fn free_by_kind(&self) -> BTreeMap<Option<MigKind>, u32> {
        let mut out = BTreeMap::new();
        for u in self.units.iter().filter(|u| Self::usable(u, None)) {
            *out.entry(u.kind).or_insert(0) += 1;
        }
        out
    }

    /// Gives `owner` `count` free MIG devices of `kind` (any with `None`), in (parent, MIG
    /// index) order; nothing changes when it is refused.
    pub fn allocate(
        &mut self,
        owner: &str,
        count: u32,
        kind: Option<MigKind>,
    ) -> Result<Vec<String>, MigError> {
        if count > 1 && !self.allow_multiple {
            return Err(MigError::TooMany {
                owner: owner.to_owned(),
                requested: count,
            });
        }
        if let Some(kind) = kind
            && !self.units.iter().any(|u| u.kind == Some(kind))
        {
            return Err(MigError::NoSuchProfile {
                owner: owner.to_owned(),
                profile: kind.to_string(),
                known: self.kinds(),
            });
        }
        let picked: Vec<usize> = (0..self.units.len())
            .filter(|&i| Self::usable(&self.units[i], kind))
            .take(count as usize)
            .collect();
        if picked.len() < count as usize {
            return Err(MigError::NotEnough {
                owner: owner.to_owned(),
                requested: count,
                profile: kind.map(|k| self.kind_label(k)),
                free: self.free(kind),
            });
        }
        Ok(picked
            .into_iter()
            .map(|i| {
                self.units[i].owner = Some(owner.to_owned());
                self.units[i].uuid.clone()
            })
            .collect())
    }

    /// The kinds of MIG device this node has, labelled, for a refusal.
    fn kinds(&self) -> String {
        let mut kinds: Vec<MigKind> = self.units.iter().filter_map(|u| u.kind).collect();
        kinds.sort_unstable();
        kinds.dedup();
        if kinds.is_empty() {
            return "none".to_owned();
        }
        kinds
            .into_iter()
            .map(|k| self.kind_label(k))
            .collect::<Vec<_>>()
            .join(", ")
    }

    fn kind_label(&self, kind: MigKind) -> String {
        self.units
            .iter()
            .find(|u| u.kind == Some(kind) && !u.profile_name.is_empty())
            .map_or_else(
                || kind.to_string(),
                |u| format!("{} ({kind})", u.profile_name),
            )
    }

    /// Records that `owner` holds `uuid` (recovery); false when the node has no such device or
    /// another owner holds it.
    pub fn hold(&mut self, owner: &str, uuid: &str) -> bool {
        match self.units.iter_mut().find(|u| u.uuid == uuid) {
            Some(u) if u.owner.as_deref().is_none_or(|h| h == owner) => {
                u.owner = Some(owner.to_owned());
                true
            }
            _ => false,
        }
    }

    /// Makes `owner` hold exactly the devices of `uuids` nobody else holds (what other owners
    /// of the node's pool reserve).
    pub fn hold_only(&mut self, owner: &str, uuids: &std::collections::BTreeSet<&str>) {
        for u in &mut self.units {
            let wanted = uuids.contains(u.uuid.as_str());
            match u.owner.as_deref() {
                Some(h) if h == owner && !wanted => u.owner = None,
                None if wanted => u.owner = Some(owner.to_owned()),
                _ => {}
            }
        }
    }

    /// Takes out of service exactly the MIG devices whose UUID is in `unhealthy` or whose
    /// parent's NVML index is in `parents` (what the pool's health checkpoints say).
    pub fn mark_out_elsewhere(
        &mut self,
        unhealthy: &std::collections::BTreeSet<&str>,
        parents: &std::collections::BTreeSet<u32>,
    ) {
        for u in &mut self.units {
            u.out_elsewhere = unhealthy.contains(u.uuid.as_str()) || parents.contains(&u.parent);
        }
    }

    /// Takes back everything `owner` holds; returns the UUIDs.
    pub fn release(&mut self, owner: &str) -> Vec<String> {
        self.units
            .iter_mut()
            .filter(|u| u.owner.as_deref() == Some(owner))
            .map(|u| {
                u.owner = None;
                u.uuid.clone()
            })
            .collect()
    }

    /// How many MIG devices some owner holds.
    pub fn held(&self) -> usize {
        self.units.iter().filter(|u| u.owner.is_some()).count()
    }

    /// The UUIDs `owner` holds.
    pub fn held_by(&self, owner: &str) -> Vec<&str> {
        self.units
            .iter()
            .filter(|u| u.owner.as_deref() == Some(owner))
            .map(|u| u.uuid.as_str())
            .collect()
    }

    /// The state of the MIG device `uuid`, `None` when the node has no such device.
    pub fn state(&self, uuid: &str) -> Option<UnitState> {
        let u = self.units.iter().find(|u| u.uuid == uuid)?;
        Some(
            match (&u.owner, u.healthy && !u.out_elsewhere && u.isolatable) {
                (owner, false) => UnitState::Unhealthy(owner.clone()),
                (Some(h), true) => UnitState::Held(h.clone()),
                (None, true) => UnitState::Free,
            },
        )
    }

    /// Takes the MIG device `uuid` out of service (an XID attributed to it); returns its
    /// owner, whose `watch` should name the device.
    pub fn mark_unhealthy(&mut self, uuid: &str) -> Option<(String, Option<String>)> {
        let u = self.units.iter_mut().find(|u| u.uuid == uuid)?;
        u.healthy = false;
        Some((u.uuid.clone(), u.owner.clone()))
    }

    /// Puts the MIG device `uuid` back in service (its quiet period passed, or the operator
    /// marked it healthy).
    pub fn mark_healthy(&mut self, uuid: &str) {
        if let Some(u) = self.units.iter_mut().find(|u| u.uuid == uuid) {
            u.healthy = true;
        }
    }

    /// Puts every MIG device of the GPU with NVML index `parent` back in service (the operator
    /// marked the parent healthy).
    pub fn mark_parent_healthy(&mut self, parent: u32) {
        for u in self.units.iter_mut().filter(|u| u.parent == parent) {
            u.healthy = true;
        }
    }

    /// Takes every MIG device of the GPU with NVML index `parent` out of service (an XID on the
    /// parent); returns each device with its owner.
    pub fn mark_parent_unhealthy(&mut self, parent: u32) -> Vec<(String, Option<String>)> {
        self.units
            .iter_mut()
            .filter(|u| u.parent == parent)
            .map(|u| {
                u.healthy = false;
                (u.uuid.clone(), u.owner.clone())
            })
            .collect()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a failed unwrap fails the test at its line
mod tests {
    use super::*;
    use mesos_gpu_node::{inventory::DevNum, inventory::MigCaps, inventory::MigDevice};

    fn device(parent: u32, index: u32, gi: u32, profile: u32, name: &str) -> MigDevice {
        MigDevice {
            parent,
            parent_minor: parent,
            index,
            uuid: format!("MIG-{parent}-{index}"),
            gpu_instance: gi,
            compute_instance: 0,
            profile: Some(profile),
            profile_name: name.to_owned(),
            memory_total: 5 << 30,
            multiprocessors: 14,
            gpu_instance_slices: 1,
            compute_instance_slices: 1,
            caps: Some(MigCaps {
                gpu_instance: DevNum {
                    major: 235,
                    minor: 3 + 9 * gi,
                },
                compute_instance: DevNum {
                    major: 235,
                    minor: 4 + 9 * gi,
                },
                gpu_instance_file: String::new(),
                compute_instance_file: String::new(),
            }),
            healthy: true,
        }
    }

    /// GPU 4 split 3g+2g+1g+1g, GPU 5 the same: the mixed node's layout.
    fn mixed() -> MigLayout {
        let mut devices = Vec::new();
        for parent in [4, 5] {
            devices.push(device(parent, 0, 2, 9, "3g.20gb"));
            devices.push(device(parent, 1, 3, 14, "2g.10gb"));
            devices.push(device(parent, 2, 9, 19, "1g.5gb"));
            devices.push(device(parent, 3, 10, 19, "1g.5gb"));
        }
        MigLayout {
            enabled: vec![4, 5],
            devices,
            caps_major: Some(235),
        }
    }

    #[test]
    fn one_mig_device_per_request_unless_allowed() {
        let mut units = MigUnits::new(&mixed(), false);
        let err = units.allocate("task-a", 2, None).unwrap_err();
        assert_eq!(
            err.to_string(),
            "task-a asks for 2 MIG devices; CUDA uses only one MIG device per process, so more \
             than one is refused unless the agent's operator allows it"
        );
        assert!(units.held_by("task-a").is_empty(), "nothing half-applied");
        assert_eq!(units.allocate("task-a", 1, None).unwrap(), ["MIG-4-0"]);
        let mut allowed = MigUnits::new(&mixed(), true);
        assert_eq!(
            allowed.allocate("task-b", 2, None).unwrap(),
            ["MIG-4-0", "MIG-4-1"]
        );
    }

    #[test]
    fn profiles_are_allocated_by_id_and_never_twice() {
        let mut units = MigUnits::new(&mixed(), false);
        assert_eq!(
            units.free_by_kind(),
            BTreeMap::from([
                (Some(MigKind::whole(9)), 2),
                (Some(MigKind::whole(14)), 2),
                (Some(MigKind::whole(19)), 4)
            ])
        );
        let mut held = Vec::new();
        for n in 0..4 {
            held.extend(
                units
                    .allocate(&format!("t{n}"), 1, Some(MigKind::whole(19)))
                    .unwrap(),
            );
        }
        assert_eq!(held, ["MIG-4-2", "MIG-4-3", "MIG-5-2", "MIG-5-3"]);
        let err = units
            .allocate("t9", 1, Some(MigKind::whole(19)))
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "cannot allocate 1 MIG devices of profile 1g.5gb (id 19) to t9: 0 free"
        );
        assert_eq!(units.free(None), 4);
        assert_eq!(units.release("t1"), ["MIG-4-3"]);
        assert_eq!(
            units.allocate("t9", 1, Some(MigKind::whole(19))).unwrap(),
            ["MIG-4-3"]
        );
        assert_eq!(units.state("MIG-4-3"), Some(UnitState::Held("t9".into())));
    }

    #[test]
    fn a_profile_the_node_does_not_have_is_named_with_the_ones_it_has() {
        let mut units = MigUnits::new(&mixed(), false);
        let err = units
            .allocate("t1", 1, Some(MigKind::whole(99)))
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "t1 asks for MIG devices of profile id 99: no such profile on this node (profiles on \
             this node: 3g.20gb (id 9), 2g.10gb (id 14), 1g.5gb (id 19))"
        );
        assert!(matches!(err, MigError::NoSuchProfile { .. }));
    }

    /// H100: a 3g.40gb GPU instance (profile 9) split in three 1-slice compute instances gives
    /// `1c.3g.40gb` devices, another kind than a whole 3g.40gb of the same profile.
    #[test]
    fn compute_instance_kinds_are_not_their_gpu_instance_profile() {
        let mut whole = device(0, 0, 1, 9, "3g.40gb");
        whole.gpu_instance_slices = 3;
        whole.compute_instance_slices = 3;
        let mut split: Vec<MigDevice> = (0..3)
            .map(|ci| {
                let mut d = device(0, 1 + ci, 2, 9, "1c.3g.40gb");
                d.compute_instance = ci;
                d.uuid = format!("MIG-0-c{ci}");
                d.gpu_instance_slices = 3;
                d.compute_instance_slices = 1;
                d
            })
            .collect();
        split.insert(0, whole);
        let layout = MigLayout {
            enabled: vec![0],
            devices: split,
            caps_major: Some(235),
        };
        let one_c = MigKind {
            profile: 9,
            compute_slices: Some(1),
        };
        let mut units = MigUnits::new(&layout, false);
        assert_eq!(
            units.free_by_kind(),
            BTreeMap::from([(Some(MigKind::whole(9)), 1), (Some(one_c), 3)])
        );
        assert_eq!(units.allocate("c", 1, Some(one_c)).unwrap(), ["MIG-0-c0"]);
        assert_eq!(
            units.allocate("w", 1, Some(MigKind::whole(9))).unwrap(),
            ["MIG-0-0"]
        );
        let err = units
            .allocate("w2", 1, Some(MigKind::whole(9)))
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "cannot allocate 1 MIG devices of profile 3g.40gb (id 9) to w2: 0 free"
        );
        assert_eq!(
            MigKind::of(&layout.devices[1]),
            Some(one_c),
            "a compute instance smaller than its GPU instance"
        );
    }

    #[test]
    fn an_xid_takes_out_an_instance_or_all_of_a_parent() {
        let mut units = MigUnits::new(&mixed(), false);
        units.allocate("a", 1, Some(MigKind::whole(9))).unwrap();
        units.allocate("b", 1, Some(MigKind::whole(9))).unwrap();
        assert_eq!(
            units.mark_unhealthy("MIG-4-0"),
            Some(("MIG-4-0".into(), Some("a".into())))
        );
        assert_eq!(
            units.state("MIG-4-0"),
            Some(UnitState::Unhealthy(Some("a".into())))
        );
        assert_eq!(units.state("MIG-4-1"), Some(UnitState::Free));
        let hit = units.mark_parent_unhealthy(5);
        assert_eq!(hit.len(), 4);
        assert_eq!(hit[0], ("MIG-5-0".into(), Some("b".into())));
        assert!(hit[1..].iter().all(|(_, owner)| owner.is_none()));
        assert_eq!(units.free(None), 3, "GPU 4's 2g and two 1g remain");
        units.release("a");
        assert_eq!(units.state("MIG-4-0"), Some(UnitState::Unhealthy(None)));
    }

    #[test]
    fn a_device_without_caps_is_never_handed_out() {
        let mut layout = mixed();
        for d in &mut layout.devices {
            d.caps = None;
        }
        layout.devices[0].caps = Some(mixed().devices[0].caps.clone().unwrap());
        let mut units = MigUnits::new(&layout, false);
        assert_eq!(units.allocate("a", 1, None).unwrap(), ["MIG-4-0"]);
        assert!(matches!(
            units.allocate("b", 1, None),
            Err(MigError::NotEnough { free: 0, .. })
        ));
        assert_eq!(units.state("MIG-4-1"), Some(UnitState::Unhealthy(None)));
    }
}
