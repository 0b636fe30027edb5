//! Limitations waiting for Mesos's `Isolator::watch(container)`: a GPU of the container failed.
//!
//! Mesos calls `watch` once per container and keeps the future; when it resolves with a
//! `ContainerLimitation`, the agent kills the container and reports the message
//! (`docs/reference/mesos-gpu-isolator.md` §1.5). A limitation that arrives before anyone watches
//! is kept until taken or the container is cleaned up ([`Limitations::forget`]).

use std::collections::HashMap;
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use mesos_gpu_placement::{allocator::AllocError, allocator::Allocator};

use super::state::HealthChange;

/// Why a container must stop.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limitation {
    /// The container (allocator owner).
    pub container: String,
    /// The failed GPU's NVML index.
    pub gpu: u32,
    /// Its UUID.
    pub uuid: String,
    /// `GPU 3 (GPU-…) failed: XID 79 (GPU has fallen off the bus)`.
    pub message: String,
}

/// Applies a health change to the pool: an unhealthy GPU leaves the free pool at once (and
/// stays with its owner until released), a healthy one may be granted again once free.
/// Returns the limitation for the container holding a GPU that just failed. A change of one
/// MIG device ([`HealthChange::mig`]) is not the allocator's: it changes nothing here.
pub fn apply_to_allocator(
    allocator: &mut Allocator,
    change: &HealthChange,
) -> Result<Option<Limitation>, AllocError> {
    if change.mig.is_some() {
        return Ok(None);
    }
    let Some(message) = change.limitation() else {
        allocator.mark_healthy(change.index)?;
        return Ok(None);
    };
    Ok(allocator
        .mark_unhealthy(change.index)?
        .map(|owner| Limitation {
            container: owner.to_owned(),
            gpu: change.index,
            uuid: change.uuid.clone(),
            message,
        }))
}

/// Per-container slots: watched (empty) or resolved.
#[derive(Debug, Default)]
pub struct Limitations {
    slots: Mutex<HashMap<String, Option<Limitation>>>,
    changed: Condvar,
}

impl Limitations {
    /// An empty registry.
    pub fn new() -> Limitations {
        Limitations::default()
    }

    fn slots(&self) -> MutexGuard<'_, HashMap<String, Option<Limitation>>> {
        self.slots.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records a limitation; the first one per container wins.
    pub fn resolve(&self, limitation: Limitation) {
        let mut slots = self.slots();
        let slot = slots.entry(limitation.container.clone()).or_default();
        if slot.is_none() {
            *slot = Some(limitation);
            self.changed.notify_all();
        }
    }

    /// The container's limitation, if one arrived.
    pub fn get(&self, container: &str) -> Option<Limitation> {
        self.slots().get(container).cloned().flatten()
    }

    /// Blocks until the container has a limitation (`Some`), it is forgotten (`None`) or
    /// `timeout` passes (`None`; `None` timeout waits forever).
    pub fn wait(&self, container: &str, timeout: Option<Duration>) -> Option<Limitation> {
        let mut slots = self.slots();
        slots.entry(container.to_owned()).or_default();
        self.wait_slot(slots, container, timeout)
    }

    /// Opens the container's slot (if it has none), so that a later `Limitations::wait_watched`
    /// sees a resolution or a [`Limitations::forget`] that happens in between.
    pub fn watch(&self, container: &str) {
        self.slots().entry(container.to_owned()).or_default();
    }

    /// Like [`Limitations::wait`], but `None` at once when the container has no slot (never
    /// watched, or forgotten since): a waiter can then not outlive its container's cleanup.
    pub fn wait_watched(&self, container: &str, timeout: Option<Duration>) -> Option<Limitation> {
        self.wait_slot(self.slots(), container, timeout)
    }

    fn wait_slot(
        &self,
        mut slots: MutexGuard<'_, HashMap<String, Option<Limitation>>>,
        container: &str,
        timeout: Option<Duration>,
    ) -> Option<Limitation> {
        let deadline = timeout.map(|t| Instant::now() + t);
        loop {
            match slots.get(container) {
                Some(Some(limitation)) => return Some(limitation.clone()),
                Some(None) => {}
                None => return None,
            }
            slots = match deadline {
                None => self
                    .changed
                    .wait(slots)
                    .unwrap_or_else(PoisonError::into_inner),
                Some(deadline) => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return None;
                    }
                    self.changed
                        .wait_timeout(slots, left)
                        .unwrap_or_else(PoisonError::into_inner)
                        .0
                }
            };
        }
    }

    /// How many containers have a slot (watched, or resolved and not yet forgotten).
    pub fn tracked(&self) -> usize {
        self.slots().len()
    }

    /// Drops the container's slot (at cleanup), waking its waiters with `None`.
    pub fn forget(&self, container: &str) {
        if self.slots().remove(container).is_some() {
            self.changed.notify_all();
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a failed unwrap fails the test at its line
mod tests {
    use std::sync::Arc;

    use super::*;
    use mesos_gpu_node::inventory::PcieLevel;
    use mesos_gpu_node::nodes::NodeBuilder;
    use mesos_gpu_placement::allocator::Policy;

    fn allocator() -> Allocator {
        let inventory = NodeBuilder::new(4, PcieLevel::CrossSocket).inventory();
        Allocator::new(&inventory, Policy::FirstFit).unwrap()
    }

    fn change(index: u32, healthy: bool) -> HealthChange {
        HealthChange::xid79(index, healthy)
    }

    #[test]
    fn failed_gpu_leaves_the_pool_and_names_its_owner() {
        let mut a = allocator();
        let held = a.allocate("c1", 2).unwrap();
        let first = held.iter().next().unwrap();
        let lim = apply_to_allocator(&mut a, &change(first, false))
            .unwrap()
            .unwrap();
        assert_eq!(lim.container, "c1");
        assert_eq!(
            lim.message,
            format!("GPU {first} (GPU-{first}) failed: XID 79 (GPU has fallen off the bus)")
        );
        assert!(a.unhealthy().contains(first));

        assert_eq!(
            apply_to_allocator(&mut a, &change(3, false)).unwrap(),
            None,
            "free GPU: nobody to tell"
        );
        assert!(!a.free().contains(3));
        apply_to_allocator(&mut a, &change(3, true)).unwrap();
        assert!(a.free().contains(3));
        assert!(apply_to_allocator(&mut a, &change(9, false)).is_err());
    }

    #[test]
    fn wait_resolve_forget() {
        let l = Arc::new(Limitations::new());
        assert_eq!(l.wait("c", Some(Duration::from_millis(10))), None);
        let waiter = {
            let l = Arc::clone(&l);
            std::thread::spawn(move || l.wait("c", None))
        };
        let lim = Limitation {
            container: "c".to_owned(),
            gpu: 1,
            uuid: "GPU-1".to_owned(),
            message: "m".to_owned(),
        };
        l.resolve(lim.clone());
        l.resolve(Limitation {
            message: "later".to_owned(),
            ..lim.clone()
        });
        assert_eq!(waiter.join().unwrap(), Some(lim.clone()));
        assert_eq!(l.get("c"), Some(lim.clone()));

        let waiter = {
            let l = Arc::clone(&l);
            std::thread::spawn(move || l.wait("d", None))
        };
        while l.slots().get("d").is_none() {
            std::thread::yield_now();
        }
        l.forget("d");
        assert_eq!(waiter.join().unwrap(), None);

        assert_eq!(l.wait_watched("e", None), None, "no slot: no wait");
        l.watch("e");
        l.forget("e");
        assert_eq!(l.wait_watched("e", None), None, "forgotten: no wait");
        l.watch("e");
        assert_eq!(l.wait_watched("e", Some(Duration::from_millis(5))), None);
        l.resolve(Limitation {
            container: "e".to_owned(),
            ..lim.clone()
        });
        assert_eq!(
            l.wait_watched("e", None).map(|l| l.container),
            Some("e".to_owned())
        );
    }
}
