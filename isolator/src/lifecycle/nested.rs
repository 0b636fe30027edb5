//! Nested containers: they share their top-level ancestor's GPUs. Mesos gives one a cgroup of
//! its own when its `share_cgroups` is false: on cgroup v1 a devices cgroup at
//! `<parent>/mesos/<child>` (`containerizer::paths::getCgroupPath`, `paths.cpp` 600-611) made
//! with Mesos's whitelist only, which gets its ancestor's entries here (see [`super::placement`]);
//! on v2 every nested container's cgroup lies below its ancestor's, where our program rules it.

use std::path::{Path, PathBuf};

use super::placement::{self, PlacedCgroup};
use super::state::State;
use super::{CgroupMaker, ContainerId, Isolator, LaunchInfo, LifecycleError, PrepareConfig};
use super::{RecoverState, launch_info};
use mesos_gpu_enforce::{cgroup::CgroupLayout, cgroup::CgroupVersion, cgroup::DeviceRule};
use mesos_gpu_grant::Grant;

impl Isolator {
    /// Prepares a nested container: its launch info from its ancestor's GPUs, and, when Mesos
    /// made it a v1 devices cgroup of its own, the ancestor's entries there (and on the
    /// `<parent>/mesos` cgroups between).
    pub(super) fn prepare_nested(
        &self,
        state: &mut State,
        id: &ContainerId,
        parent: &ContainerId,
        config: &PrepareConfig,
    ) -> Result<LaunchInfo, LifecycleError> {
        let root = state.nested.get(parent).unwrap_or(parent).clone();
        let Some(entry) = state.containers.get(&root) else {
            return Err(LifecycleError::UnknownParent {
                container: id.clone(),
                parent: parent.clone(),
            });
        };
        let own_dir = self.nested_cgroup_dir(config.nested_cgroup.as_deref());
        let cgroup = own_dir
            .clone()
            .or_else(|| entry.cgroup.as_ref().map(|c| c.path().to_owned()));
        let accesses = self.mig_accesses(id, &entry.mig_devices())?;
        let grant = Grant::new(
            &self.nodes,
            &self.base,
            self.gpus_of(entry.visible()),
            accesses,
            None,
        )
        .map_err(|source| LifecycleError::Grant {
            container: id.clone(),
            source,
        })?;
        let mut info = launch_info(&grant, config, self.driver_volume.as_deref(), cgroup).map_err(
            |source| LifecycleError::Grant {
                container: id.clone(),
                source,
            },
        )?;
        if let Some(dir) = own_dir.filter(|_| !self.dry_run) {
            let rules = entry.rules.clone();
            if let Some(top) = entry.cgroup.as_ref().map(|c| c.path().to_owned()) {
                placement::grant_between(&self.layout, id, &top, &dir, &rules, &self.base)
                    .map_err(|source| LifecycleError::Cgroup {
                        container: id.clone(),
                        step: "prepare",
                        source,
                    })?;
            }
            let placed = PlacedCgroup::join(&self.layout, id, dir, &rules, &self.base)?;
            tracing::info!(cgroup = %placed.path().display(), "granted the parent's GPUs in the nested container's own devices cgroup");
            state.nested_cgroups.insert(id.clone(), placed);
        }
        state.nested.insert(id.clone(), root.clone());
        if self.pinning.enabled() {
            info.pinning =
                super::PinOutcome::Skipped(mesos_gpu_placement::numa::SkipReason::Nested);
        }
        tracing::info!(parent = %root, gpus = info.gpus.len(), "prepared nested container sharing its parent's GPUs");
        Ok(info)
    }

    /// The directory of a nested container's own devices cgroup, when Mesos made one: only
    /// with [`CgroupMaker::Mesos`] on v1 (on v2 every nested cgroup lies below its parent's,
    /// where our program rules it already).
    pub(super) fn nested_cgroup_dir(&self, relative: Option<&Path>) -> Option<PathBuf> {
        let relative = relative?;
        if self.cgroup_maker != CgroupMaker::Mesos || self.layout.version() != CgroupVersion::V1 {
            return None;
        }
        let dir = self.layout.parent_dir().join(relative);
        dir.is_dir().then_some(dir)
    }

    /// Registers the recovered nested containers under their top-level ancestors, and takes
    /// over the devices cgroups Mesos made for those with cgroups of their own.
    pub(super) fn recover_nested(&self, state: &mut State, states: &[RecoverState]) {
        for s in states {
            let Some(root) = s.parent.as_ref().map(|p| top_level(states, p)) else {
                continue;
            };
            if !state.containers.contains_key(&root) {
                continue;
            }
            state.nested.insert(s.id.clone(), root);
            if let Some(dir) = self.nested_cgroup_dir(s.nested_cgroup.as_deref()) {
                match PlacedCgroup::open(CgroupMaker::Mesos, &self.layout, &s.id, dir) {
                    Ok(cgroup) => {
                        state.nested_cgroups.insert(s.id.clone(), cgroup);
                    }
                    Err(e) => {
                        tracing::warn!(container = %s.id, error = %e, "cannot take over the nested container's devices cgroup")
                    }
                }
            }
        }
    }
}

/// Grants the nested containers of `root` that have their own devices cgroup the change of
/// their parent's list from `old` to `new` (a deny on the parent already took the entry from
/// them, an allow did not add it). Failures are logged: the parent's change stands.
pub(super) fn regrant_nested(
    layout: &CgroupLayout,
    state: &mut State,
    root: &ContainerId,
    old: &[DeviceRule],
    new: &[DeviceRule],
    base: &[DeviceRule],
) {
    let children: Vec<ContainerId> = state
        .nested
        .iter()
        .filter(|(child, parent)| *parent == root && state.nested_cgroups.contains_key(*child))
        .map(|(child, _)| child.clone())
        .collect();
    let top = state
        .containers
        .get(root)
        .and_then(|e| e.cgroup.as_ref())
        .map(|c| c.path().to_owned());
    for child in children {
        let Some(cgroup) = state.nested_cgroups.get_mut(&child) else {
            continue;
        };
        let between = match &top {
            Some(top) => placement::grant_between(layout, &child, top, cgroup.path(), new, base),
            None => Ok(()),
        };
        if let Err(e) = between.and_then(|()| cgroup.apply(old, new, base)) {
            tracing::error!(container = %child, error = %e, "cannot pass the parent's device change to the nested container's cgroup");
        }
    }
}

/// The top-level ancestor of `parent` among the recovered `states` (itself when it has none).
fn top_level(states: &[RecoverState], parent: &ContainerId) -> ContainerId {
    let mut current = parent;
    for _ in 0..states.len() {
        match states
            .iter()
            .find(|s| &s.id == current)
            .and_then(|s| s.parent.as_ref())
        {
            Some(up) => current = up,
            None => break,
        }
    }
    current.clone()
}
