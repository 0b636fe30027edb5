//! Share reservations in the node's GPU pool ([`crate`]): each share is recorded under
//! its owner's id in [`PoolState::shares`] inside the pool's transaction, so concurrent
//! processes (module, `run`, `exec`, `docker-args`) never over-commit a GPU: a GPU with a share
//! is held for whole-GPU reservations ([`PoolState::held_by_others`]), and a GPU reserved whole,
//! quarantined or marked unhealthy takes no new share.

use serde::{Deserialize, Serialize};

use crate::{Host, Owner, PoolState, Transaction};
use mesos_gpu_placement::sharing::SharingPlan;
use mesos_gpu_placement::sharing::{PlacedShare, Placement, PlacementError, ShareBook, Wanted};

/// A share as the pool records it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShareReservation {
    /// The checkpoint (a file path) that records the share; only it rewrites it.
    #[serde(rename = "holder")]
    pub publisher: String,
    /// Who holds the share.
    pub owner: Owner,
    /// The share: GPU, k of R units, limits.
    pub grant: PlacedShare,
    /// When it was made, seconds since the Unix epoch.
    pub since: u64,
}

/// The book of `plan`'s shared GPUs as `state` records them: recorded shares, and GPUs that
/// take no new share (held whole, quarantined, unhealthy) with the reason.
pub fn book(state: &PoolState, plan: &SharingPlan) -> ShareBook {
    let mut book = ShareBook::new(plan);
    for (id, share) in &state.shares {
        if !book.record(id, &share.grant.uuid, share.grant.units, share.grant.mode) {
            tracing::warn!(owner = %id, gpu = %share.grant.uuid, "a recorded share is on a GPU that is no longer shared; it stays recorded until its owner ends");
        }
    }
    for (id, r) in &state.reservations {
        for uuid in &r.gpus {
            let why = match r.owner {
                Owner::Quarantine { .. } => format!("quarantined by {id}"),
                _ => format!("reserved whole by {id}"),
            };
            book.mark_unusable(uuid.as_str(), &why);
        }
    }
    for (uuid, why) in state.unhealthy() {
        book.mark_unusable(&uuid, &format!("unhealthy: {why}"));
    }
    book
}

/// Places and records a share of `units` for owner `id` in the transaction (commit it to keep
/// it). Shares of dead owners are freed first.
pub fn reserve(
    tx: &mut Transaction,
    plan: &SharingPlan,
    host: &Host,
    publisher: &str,
    id: &str,
    owner: Owner,
    units: u32,
) -> Result<PlacedShare, PlacementError> {
    crate::reconcile(&mut tx.state, host, None);
    let mut book = book(&tx.state, plan);
    let grant = book.place(id, units, Placement::Pack, Wanted::Any)?;
    tx.state.shares.insert(
        id.to_owned(),
        ShareReservation {
            publisher: publisher.to_owned(),
            owner,
            grant: grant.clone(),
            since: crate::now(),
        },
    );
    tracing::info!(owner = id, gpu = %grant.uuid, units, replicas = grant.replicas, mode = %grant.mode, "reserved a GPU share");
    Ok(grant)
}

/// Removes owner `id`'s share from the transaction; returns it.
pub fn release(tx: &mut Transaction, id: &str) -> Option<ShareReservation> {
    let share = tx.state.shares.remove(id)?;
    tracing::info!(owner = id, gpu = %share.grant.uuid, units = share.grant.units, "released a GPU share");
    Some(share)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::{Pool, Reservation};
    use mesos_gpu_node::nodes::dgx1_v100;
    use mesos_gpu_placement::sharing::plan::{ModeSpec, SharingMode, SharingSpec};

    fn plan() -> SharingPlan {
        SharingSpec::parse("2", ModeSpec::uniform(SharingMode::TimeSlicing))
            .unwrap()
            .resolve(&dgx1_v100().inventory(), &[0, 1])
            .unwrap()
    }

    fn me(host: &Host) -> Owner {
        Owner::Process {
            process: host.this_process().unwrap(),
            cgroup: None,
            private_dir: None,
        }
    }

    fn dead() -> Owner {
        Owner::Process {
            process: crate::ProcessStamp {
                pid: u32::MAX,
                start_time: 1,
                boot_id: "no-such-boot".into(),
            },
            cgroup: None,
            private_dir: None,
        }
    }

    #[test]
    fn shares_are_pool_transactions_never_over_committed() {
        let dir = tempfile::tempdir().unwrap();
        let pool = Pool::at(dir.path());
        let host = Host::at("/proc");
        let plan = plan();
        let uuids: Vec<String> = plan.shared.iter().map(|g| g.uuid.clone()).collect();
        // GPU 1 is reserved whole by another path: shares go to GPU 0 only.
        let mut tx = pool.begin().unwrap();
        tx.state.reservations.insert(
            "whole".into(),
            Reservation {
                publisher: "h".into(),
                owner: me(&host),
                gpus: vec![crate::GpuUuid::new(uuids[1].clone()).unwrap()],
                unnamed: 0,
                since: 0,
            },
        );
        tx.commit().unwrap();
        drop(tx);
        for id in ["a", "b"] {
            let mut tx = pool.begin().unwrap();
            let g = reserve(&mut tx, &plan, &host, "h", id, me(&host), 1).unwrap();
            assert_eq!(g.uuid, uuids[0]);
            tx.commit().unwrap();
        }
        // A third unit is refused in a later transaction (another process's view).
        let mut tx = pool.begin().unwrap();
        let err = reserve(&mut tx, &plan, &host, "h", "c", me(&host), 1).unwrap_err();
        assert!(err.to_string().contains("reserved whole by whole"), "{err}");
        assert!(
            err.to_string()
                .contains(&format!("{} (time-slicing): 0/2", uuids[0])),
            "{err}"
        );
        // A shared GPU with share owners is held for whole-GPU reservations.
        assert!(tx.state.held_by_others("x").contains(uuids[0].as_str()));
        // A dead owner's share is freed by the next reservation.
        tx.state.shares.get_mut("a").unwrap().owner = dead();
        let g = reserve(&mut tx, &plan, &host, "h", "c", me(&host), 1).unwrap();
        assert_eq!(g.uuid, uuids[0]);
        assert!(!tx.state.shares.contains_key("a"));
        tx.commit().unwrap();
        drop(tx);
        let state = pool.read().unwrap();
        assert_eq!(state.shares.keys().collect::<Vec<_>>(), ["b", "c"]);
        let mut tx = pool.begin().unwrap();
        assert_eq!(release(&mut tx, "b").unwrap().grant.units, 1);
        assert!(release(&mut tx, "b").is_none());
    }
}
