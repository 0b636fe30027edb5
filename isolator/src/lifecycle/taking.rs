//! [`Taking`]: what one call takes for a container that held nothing before it, given back by
//! itself when the call fails.
//!
//! `prepare` and a Docker reservation take GPUs, MIG devices and a share in several steps, then
//! record the container, checkpoint and make its cgroup; any step may fail. Every one of them
//! works through a `Taking`: dropped without [`Taking::keep`], it forgets everything recorded
//! under the container's id ([`State::forget`]), so a failed call leaves the state as it found
//! it whichever step failed, and no step carries a rollback of its own. `update` works through
//! a [`Resizing`] the same way: dropped unkept, it undoes the allocator's change and gives the
//! container's entry its GPUs and rules back.

use std::ops::{Deref, DerefMut};

use mesos_gpu_enforce::cgroup::DeviceRule;
use mesos_gpu_grant::Grant;
use mesos_gpu_placement::allocator::{GpuSet, Resize};
use mesos_gpu_placement::sharing::{Among, Wanted};

use super::launch::PrepareConfig;
use super::state::{Container, State};
use super::{ContainerId, Isolator, LifecycleError};

/// The state, while a call takes things for a new container; rolled back when dropped unkept.
#[must_use = "a Taking dropped without `keep` gives back everything the call took"]
pub(crate) struct Taking<'s> {
    state: &'s mut State,
    id: ContainerId,
    kept: bool,
}

impl<'s> Taking<'s> {
    /// Starts taking for `id`, which must hold nothing yet (the caller checked
    /// [`State::knows`]).
    pub(crate) fn new(state: &'s mut State, id: &ContainerId) -> Taking<'s> {
        Taking {
            state,
            id: id.clone(),
            kept: false,
        }
    }

    /// The call succeeded: the container keeps what it took.
    pub(crate) fn keep(mut self) {
        self.kept = true;
    }
}

impl Deref for Taking<'_> {
    type Target = State;
    fn deref(&self) -> &State {
        self.state
    }
}

impl DerefMut for Taking<'_> {
    fn deref_mut(&mut self) -> &mut State {
        self.state
    }
}

impl Drop for Taking<'_> {
    fn drop(&mut self) {
        if !self.kept {
            let (gpus, mig) = self.state.forget(&self.id);
            tracing::debug!(container = %self.id, gpus = %gpus, mig = ?mig, "gave back what a failed call took");
        }
    }
}

impl Isolator {
    /// What `id` asking `request` gets, taken from `state` and the node's pool: whole GPUs, a
    /// share of one GPU or MIG device (its MPS daemon made sure of) or MIG devices, as one
    /// [`Grant`]. On a node sharing GPUs, `wanted` says whether a share (of which mode) or whole
    /// GPUs.
    pub(crate) fn take(
        &self,
        state: &mut Taking<'_>,
        id: &ContainerId,
        request: &PrepareConfig,
        step: &'static str,
        wanted: Wanted,
    ) -> Result<Grant, LifecycleError> {
        let (set, share, mig) = if self.inventory.mig.devices.is_empty() {
            let (set, share) =
                self.take_units(state, id, request.gpus, step, wanted, Among::All)?;
            (set, share, Vec::new())
        } else {
            let (set, mig, share) = self.take_with_mig(state, id, request, step, wanted)?;
            (set, share, mig)
        };
        // A share of a MIG device needs what the device held whole does.
        let shared_mig = share
            .as_ref()
            .filter(|g| g.is_mig())
            .map(|g| g.uuid.clone());
        let uuids: Vec<String> = mig.into_iter().chain(shared_mig).collect();
        let accesses = self.mig_accesses(id, &uuids)?;
        let share = match &share {
            Some(grant) => Some(self.share_access(state, id, grant)?),
            None => None,
        };
        let visible = match &share {
            Some(s) if !s.placed.is_mig() => {
                GpuSet::from_indices([s.placed.index]).unwrap_or_default()
            }
            _ => set,
        };
        Grant::new(
            &self.nodes,
            &self.base,
            self.gpus_of(visible),
            accesses,
            share,
        )
        .map_err(|source| LifecycleError::Grant {
            container: id.clone(),
            source,
        })
    }
}

/// The checkpointed entry of a container holding `grant`: the allocator's GPUs (none for a
/// share, which the pool records), the rules, the share and the MIG devices held whole (not a
/// shared one, which the share names).
pub(crate) fn container_of(grant: &Grant) -> Container {
    let gpus = match grant.share() {
        Some(_) => GpuSet::EMPTY,
        None => GpuSet::from_indices(grant.gpus().iter().map(|g| g.index)).unwrap_or_default(),
    };
    let shared = grant.share().filter(|s| s.placed.is_mig());
    let whole_mig = grant
        .mig()
        .iter()
        .filter(|m| shared.is_none_or(|s| s.placed.uuid != m.uuid))
        .map(|m| m.uuid.clone())
        .collect();
    Container {
        gpus,
        rules: grant.rules().to_vec(),
        cgroup: None,
        share: grant.share().map(|s| s.placed.clone()),
        mig: whole_mig,
        mig_quarantine: Vec::new(),
    }
}

/// The state while `update` resizes a container: dropped without [`Resizing::keep`], the
/// allocator's change is undone and the container's entry gets its GPUs and rules back.
#[must_use = "a Resizing dropped without `keep` undoes the update"]
pub(crate) struct Resizing<'s> {
    state: &'s mut State,
    id: ContainerId,
    resize: Resize,
    old_gpus: GpuSet,
    old_rules: Vec<DeviceRule>,
    kept: bool,
}

impl<'s> Resizing<'s> {
    /// Starts the update of `id`, whose allocation `resize` just changed (undone when `id` has
    /// no entry).
    pub(crate) fn new(
        state: &'s mut State,
        id: &ContainerId,
        resize: Resize,
        step: &'static str,
    ) -> Result<Resizing<'s>, LifecycleError> {
        let Some(entry) = state.containers.get(id) else {
            undo(state, id, resize);
            return Err(LifecycleError::UnknownContainer {
                container: id.clone(),
                step,
            });
        };
        let (old_gpus, old_rules) = (entry.gpus, entry.rules.clone());
        Ok(Resizing {
            state,
            id: id.clone(),
            resize,
            old_gpus,
            old_rules,
            kept: false,
        })
    }

    /// The container's rules before the update.
    pub(crate) fn old_rules(&self) -> &[DeviceRule] {
        &self.old_rules
    }

    /// The container's GPUs after the update.
    pub(crate) fn new_gpus(&self) -> GpuSet {
        self.old_gpus
            .union(self.resize.added)
            .difference(self.resize.released)
    }

    /// Records `gpus` and `rules` in the container's entry.
    pub(crate) fn set(&mut self, gpus: GpuSet, rules: &[DeviceRule]) {
        if let Some(entry) = self.state.containers.get_mut(&self.id) {
            entry.gpus = gpus;
            entry.rules = rules.to_vec();
        }
    }

    /// The update succeeded.
    pub(crate) fn keep(mut self) {
        self.kept = true;
    }
}

impl Deref for Resizing<'_> {
    type Target = State;
    fn deref(&self) -> &State {
        self.state
    }
}

impl DerefMut for Resizing<'_> {
    fn deref_mut(&mut self) -> &mut State {
        self.state
    }
}

impl Drop for Resizing<'_> {
    fn drop(&mut self) {
        if self.kept {
            return;
        }
        let (gpus, rules) = (self.old_gpus, std::mem::take(&mut self.old_rules));
        if let Some(entry) = self.state.containers.get_mut(&self.id) {
            entry.gpus = gpus;
            entry.rules = rules;
        }
        undo(self.state, &self.id, self.resize);
    }
}

/// Undoes `resize` of `id` in the allocator.
fn undo(state: &mut State, id: &ContainerId, resize: Resize) {
    let undone = if resize.added.is_empty() {
        state.allocator.recover(id.as_str(), resize.released)
    } else {
        state.allocator.release(id.as_str(), resize.added)
    };
    if let Err(e) = undone {
        tracing::error!(container = %id, error = %e, "cannot undo the allocation of a failed update");
    }
}
