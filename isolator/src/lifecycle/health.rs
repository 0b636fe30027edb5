//! GPU health in the lifecycle: one [`HealthMonitor`] per agent feeds the isolator's allocator,
//! and `watch(container)` resolves when a GPU the container holds fails (`health/` module docs).
//!
//! Facts and decisions:
//! - The monitor's callback runs on the monitor thread (and, for GPUs checkpointed unhealthy,
//!   inside [`HealthMonitor::start`]); it locks the isolator's state, applies the change to the
//!   allocator ([`apply_to_allocator`]) and resolves the owner's [`Limitation`].
//! - **Lock order** is state → limitations → nothing. No lifecycle path holds the state mutex
//!   while calling into the monitor (`start`, `mark_healthy`, drop): those publish to the
//!   callback, which takes the state mutex, so holding it there would deadlock. The monitor
//!   never holds its own lock while it runs callbacks.
//! - `recover` rebuilds the allocator; the GPUs reported unhealthy so far are kept in the state
//!   (`State::failed`) and marked again in the new allocator ([`reapply`]), so attaching
//!   before or after `recover` gives the same pool.
//! - A GPU held by the quarantine owner has no container to tell; one the isolator does not
//!   offer (`--nvidia_gpu_devices`) is not in the allocator and is only logged.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::state::{QUARANTINE_OWNER, State};
use super::status::ContainerStatus;
use super::{ContainerId, Isolator, LifecycleError};
use mesos_gpu_enforce::cgroup::CgroupVersion;
use mesos_gpu_health::{
    ChangeCallback, GpuRef, HealthChange, HealthMonitor, Limitation, Limitations, MonitorConfig,
    ProbeCgroup, apply_to_allocator,
};
use mesos_gpu_node::discovery::GpuDriver;
use mesos_gpu_node::inventory::Gpu;
use mesos_gpu_node::{usage::ContainerCgroup, usage::ContainerUsage, usage::UsageReader};
use mesos_gpu_placement::sharing::PlacedShare;

/// The attached monitor and the NVML session it and `usage` read.
#[derive(Debug)]
pub(crate) struct HealthLink {
    monitor: Arc<HealthMonitor>,
    driver: Arc<GpuDriver>,
}

/// Applies one change to the state; the limitations of the containers holding the GPU: its
/// owner in the allocator, or every owner of a share of it.
fn apply(state: &mut State, change: &HealthChange) -> Vec<Limitation> {
    if change.health.is_healthy() {
        state.failed.remove(&change.uuid);
    } else {
        state.failed.insert(change.uuid.clone(), change.clone());
    }
    if change.mig.is_some() {
        return apply_mig(state, change);
    }
    let mut limited: Vec<Limitation> = match apply_to_allocator(&mut state.allocator, change) {
        Ok(limitation) => limitation
            .filter(|l| l.container != QUARANTINE_OWNER)
            .into_iter()
            .collect(),
        Err(error) => {
            tracing::debug!(gpu = change.index, %error, "health change of a GPU the allocator does not manage");
            Vec::new()
        }
    };
    // A GPU in MIG mode: its MIG devices share its fate, and their owners are told.
    if change.health.is_healthy() {
        state.mig.mark_parent_healthy(change.index);
        for own in state.failed.values().filter(|f| f.mig.is_some()) {
            state.mig.mark_unhealthy(&own.uuid);
        }
    } else if let Some(message) = change.limitation() {
        for (uuid, owner) in state.mig.mark_parent_unhealthy(change.index) {
            if let Some(owner) = owner.filter(|h| !h.starts_with('!')) {
                limited.push(Limitation {
                    container: owner,
                    gpu: change.index,
                    uuid: uuid.clone(),
                    message: format!("{message}; its MIG device {uuid} is lost with it"),
                });
            }
        }
    }
    if let Some(message) = change.limitation() {
        limited.extend(share_holders(state, change, &message, |g| {
            g.index == change.index
        }));
    }
    limited
}

/// The limitations of the owners of the shares `of` picks (Mesos and Docker containers alike).
fn share_holders(
    state: &State,
    change: &HealthChange,
    message: &str,
    of: impl Fn(&PlacedShare) -> bool,
) -> Vec<Limitation> {
    state
        .containers
        .iter()
        .filter_map(|(id, c)| Some((id, c.share.as_ref()?)))
        .chain(state.docker_shares.iter())
        .filter(|(_, g)| of(g))
        .map(|(id, _)| Limitation {
            container: id.to_string(),
            gpu: change.index,
            uuid: change.uuid.clone(),
            message: message.to_owned(),
        })
        .collect()
}

/// Applies a change of one MIG device (an XID NVML attributed to its instance): it leaves or
/// rejoins the pool (not while its parent is out), and its owner, or every owner of a share of
/// it, is told.
fn apply_mig(state: &mut State, change: &HealthChange) -> Vec<Limitation> {
    let Some(message) = change.limitation() else {
        let parent_out = state
            .failed
            .values()
            .any(|f| f.mig.is_none() && f.index == change.index);
        if !parent_out {
            state.mig.mark_healthy(&change.uuid);
        }
        return Vec::new();
    };
    let sharers = share_holders(state, change, &message, |g| g.uuid == change.uuid);
    state
        .mig
        .mark_unhealthy(&change.uuid)
        .and_then(|(uuid, owner)| {
            Some(Limitation {
                container: owner.filter(|h| !h.starts_with('!'))?,
                gpu: change.index,
                uuid,
                message,
            })
        })
        .into_iter()
        .chain(sharers)
        .collect()
}

/// Marks `failed` again in a rebuilt state and resolves the limitations of their owners.
pub(crate) fn reapply(
    state: &mut State,
    failed: std::collections::BTreeMap<String, HealthChange>,
    limitations: &Limitations,
) {
    for change in failed.values() {
        for limitation in apply(state, change) {
            limitations.resolve(limitation);
        }
    }
}

impl Isolator {
    /// Starts the agent's GPU health monitor over `driver` and feeds it into this isolator:
    /// a failed GPU leaves the pool at once and its owner's [`Isolator::watch`] resolves.
    /// `config.work_dir` defaults to the isolator's work directory (health checkpoint and
    /// operator requests under `<work_dir>/gpu/`), and the recovery probe's cgroup to one made
    /// like a container's; GPUs checkpointed unhealthy are out of the pool before this returns. With a driver attached, [`Isolator::usage`] carries NVML
    /// figures. Attach before or after [`Isolator::recover`]; at most once.
    pub fn attach_health(
        &self,
        driver: Arc<GpuDriver>,
        mut config: MonitorConfig,
    ) -> Result<(), LifecycleError> {
        const STEP: &str = "start the GPU health monitor";
        if self.health.get().is_some() {
            return Err(LifecycleError::HealthAttached);
        }
        config.work_dir.get_or_insert_with(|| self.work_dir.clone());
        // The probe runs in a one-GPU cgroup of its own, made like a container's.
        if let Some(recovery) = &mut config.recovery
            && recovery.probe.cgroup.is_none()
        {
            recovery.probe.cgroup = Some(ProbeCgroup {
                layout: self.layout.clone(),
                base: self.base.clone(),
                nodes: self.nodes.clone(),
            });
        }
        let callback: ChangeCallback = {
            let (state, limitations) = (Arc::clone(&self.state), Arc::clone(&self.limitations));
            Arc::new(move |change: &HealthChange| on_change(&state, &limitations, change))
        };
        // Not under the state lock: `start` runs the callback, which takes it.
        let monitor = HealthMonitor::start(Arc::clone(&driver), config, vec![callback])
            .map_err(|source| LifecycleError::Health { step: STEP, source })?;
        let link = HealthLink {
            monitor: Arc::new(monitor),
            driver,
        };
        self.health
            .set(link)
            .map_err(|_| LifecycleError::HealthAttached)?;
        tracing::info!("GPU health attached to the isolator");
        Ok(())
    }

    /// The attached health monitor (for metrics and status pages).
    pub fn health_monitor(&self) -> Option<Arc<HealthMonitor>> {
        self.health.get().map(|h| Arc::clone(&h.monitor))
    }

    /// Mesos's `watch`: blocks until a GPU the container holds (its parent's, for a nested
    /// container) fails (`Some`), the container is cleaned up (`None`) or `timeout` passes
    /// (`None`; a `None` timeout waits for one of the other two).
    pub fn watch(
        &self,
        id: &ContainerId,
        timeout: Option<Duration>,
    ) -> Result<Option<Limitation>, LifecycleError> {
        let root = {
            let state = self.lock_local()?;
            if !state.knows(id) {
                return Err(LifecycleError::UnknownContainer {
                    container: id.clone(),
                    step: "watch",
                });
            }
            let root = state.nested.get(id).unwrap_or(id).clone();
            // Opened under the lock so that a cleanup from now on wakes the waiter.
            self.limitations.watch(root.as_str());
            root
        };
        Ok(self.limitations.wait_watched(root.as_str(), timeout))
    }

    /// The operator's word that `gpu` is healthy again: the monitor records it, and its
    /// callback puts the GPU back in the pool. `Ok(None)` when it already was healthy.
    pub fn mark_healthy(&self, gpu: &GpuRef) -> Result<Option<HealthChange>, LifecycleError> {
        const STEP: &str = "mark a GPU healthy";
        let Some(link) = self.health.get() else {
            return Err(LifecycleError::NoHealthMonitor { step: STEP });
        };
        // Not under the state lock: the monitor runs the callback, which takes it.
        link.monitor
            .mark_healthy(gpu)
            .map_err(|source| LifecycleError::Health { step: STEP, source })
    }

    /// NVML figures of the container's use of `gpus`, when a driver is attached and the
    /// container has a cgroup of its own (not a Docker container's).
    pub(crate) fn nvml_usage(
        &self,
        status: &ContainerStatus,
        gpus: &[Gpu],
    ) -> Option<ContainerUsage> {
        let link = self.health.get()?;
        let cgroup = container_cgroup(
            self.layout.version(),
            self.layout.mount(),
            status.cgroup.as_deref()?,
        )?;
        Some(UsageReader::default().container_usage(&link.driver, gpus, &cgroup))
    }
}

fn on_change(state: &Mutex<State>, limitations: &Limitations, change: &HealthChange) {
    let Ok(mut state) = state.lock() else {
        tracing::error!(
            gpu = change.index,
            "isolator state poisoned; GPU health change not applied"
        );
        return;
    };
    for limitation in apply(&mut state, change) {
        // The monitor logged the failure at WARN; this says which container pays for it.
        tracing::info!(container = %limitation.container, gpu = change.index, "container limited: its GPU failed");
        limitations.resolve(limitation);
    }
}

/// The container cgroup `dir` as `/proc/<pid>/cgroup` shows it: its path below `mount`.
fn container_cgroup(version: CgroupVersion, mount: &Path, dir: &Path) -> Option<ContainerCgroup> {
    let below = dir.strip_prefix(mount).ok()?.to_str()?;
    let path = format!("/{below}");
    Some(match version {
        CgroupVersion::V1 => ContainerCgroup::V1 { devices: path },
        CgroupVersion::V2 => ContainerCgroup::V2 { path },
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a failed unwrap fails the test at its line
mod tests {
    use super::*;
    use mesos_gpu_node::inventory::PcieLevel;
    use mesos_gpu_node::nodes::NodeBuilder;
    use mesos_gpu_placement::{allocator::Allocator, allocator::GpuSet, allocator::Policy};

    fn state() -> State {
        let inventory = NodeBuilder::new(4, PcieLevel::CrossSocket).inventory();
        State::new(
            Allocator::with_devices(&inventory, &[0, 1, 2], Policy::FirstFit).unwrap(),
            mesos_gpu_placement::mig::MigUnits::new(&inventory.mig, false),
        )
    }

    /// A change of GPU `index` (UUID `GPU-<index>`) to healthy, or to unhealthy after XID 79.
    fn change(index: u32, healthy: bool) -> HealthChange {
        HealthChange {
            index,
            uuid: format!("GPU-{index}"),
            health: if healthy {
                mesos_gpu_health::GpuHealth::Healthy
            } else {
                mesos_gpu_health::GpuHealth::Unhealthy {
                    reason: mesos_gpu_health::Failure::Xid { xid: 79 },
                    since_ms: 0,
                    last_error_ms: 0,
                    errors: 1,
                }
            },
            restored: false,
            mig: None,
            advice: None,
        }
    }

    #[test]
    fn changes_follow_the_owner_and_skip_quarantine_and_unoffered_gpus() {
        let mut s = state();
        let one = GpuSet::from_indices([1]).unwrap();
        s.allocator.allocate_specific("c1", one).unwrap();
        s.allocator
            .recover(QUARANTINE_OWNER, GpuSet::from_indices([2]).unwrap())
            .unwrap();
        assert_eq!(apply(&mut s, &change(1, false))[0].container, "c1");
        assert_eq!(apply(&mut s, &change(2, false)), [], "quarantine: nobody");
        assert_eq!(apply(&mut s, &change(3, false)), [], "not offered");
        let failed = |s: &State| s.failed.values().map(|c| c.index).collect::<Vec<_>>();
        assert_eq!(failed(&s), [1, 2, 3]);
        apply(&mut s, &change(2, true));
        assert_eq!(failed(&s), [1, 3]);
        assert_eq!(s.allocator.unhealthy().to_vec(), [1]);
    }

    #[test]
    fn reapply_marks_a_rebuilt_allocator_and_tells_owners() {
        let mut old = state();
        apply(&mut old, &change(0, false));
        let mut rebuilt = state();
        rebuilt
            .allocator
            .allocate_specific("c9", GpuSet::from_indices([0]).unwrap())
            .unwrap();
        let limitations = Limitations::new();
        reapply(&mut rebuilt, std::mem::take(&mut old.failed), &limitations);
        assert_eq!(rebuilt.allocator.unhealthy().to_vec(), [0]);
        assert_eq!(limitations.get("c9").unwrap().gpu, 0);
        assert!(rebuilt.failed.contains_key("GPU-0"));
    }

    #[test]
    fn cgroup_paths_as_proc_shows_them() {
        let v1 = container_cgroup(
            CgroupVersion::V1,
            Path::new("/sys/fs/cgroup/devices"),
            Path::new("/sys/fs/cgroup/devices/mesos/c1"),
        );
        assert_eq!(
            v1,
            Some(ContainerCgroup::V1 {
                devices: "/mesos/c1".to_owned()
            })
        );
        let v2 = container_cgroup(
            CgroupVersion::V2,
            Path::new("/sys/fs/cgroup/unified"),
            Path::new("/sys/fs/cgroup/unified/agents/mesos/c1"),
        );
        assert_eq!(
            v2,
            Some(ContainerCgroup::V2 {
                path: "/agents/mesos/c1".to_owned()
            })
        );
        assert_eq!(
            container_cgroup(CgroupVersion::V2, Path::new("/a"), Path::new("/b/c")),
            None
        );
    }
}
