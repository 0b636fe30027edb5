//! The node's one GPU pool: every reservation on the node (module, `serve`, `run`,
//! `docker-args`, `exec`), with an owner that can be checked, in one directory that every
//! process agrees on.
//!
//! - **Where:** `<pool dir>/gpu/pool.json`, default [`DEFAULT_POOL_DIR`] (persistent: owner
//!   stamps carry the boot id, so nothing of an earlier boot is taken for alive), overridden by
//!   the module parameter `pool_dir`, the cli's `--pool-dir` or [`POOL_DIR_ENV`].
//! - **Transactions, no lifetime lock:** [`Pool::begin`] takes `flock` on `gpu/pool.lock`
//!   (waiting at most [`LOCK_WAIT`]; the error names the holder, whose pid is written in the
//!   lock file), reads the state; `Transaction::commit` writes it back crash-safely (temp,
//!   `fsync`, `rename`, `fsync` of the directory); dropping the transaction unlocks. Readers
//!   ([`Pool::read`]: `gpu list`, metrics) read the renamed file without the lock.
//! - **Modes:** `<pool dir>` and `gpu/` are made 0755 and `pool.json`/`pool.lock` 0644 whatever
//!   the umask; a transaction refuses a pool directory that another user can write or owns
//!   ([`mesos_gpu_os::fsmode`]), since whoever can rename `pool.json` frees every reservation.
//! - **Reservations** are keyed by the owner's id (a container id, unique on the node) and
//!   name GPUs by UUID (NVML indices can change across reboots and driver reloads; a unit may
//!   later be a MIG device). Each carries the checkpoint that recorded it (its *publisher*): a
//!   publisher rewrites only its own reservations ([`PoolState::publish`]).
//! - **Reconciliation** ([`reconcile`]) frees exactly the reservations whose owner is dead
//!   ([`owner::Host::liveness`]), removing the empty cgroup and private directory a dead
//!   `exec` left; alive and uncertain owners keep their GPUs, with the reason visible.
//! - **Health:** publishers that run a health monitor register its work directory
//!   ([`PoolState::health_dirs`]); every allocation reads those checkpoints, so every path
//!   honours the same health state.
#![forbid(unsafe_code)]
#![warn(unreachable_pub, missing_docs)]

mod holder;
pub mod owner;
pub mod shares;
mod uuid;

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io::{self, Read as _, Seek as _, Write as _};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use mesos_gpu_enforce::timing::{self, Step};
use mesos_gpu_os::{IoError, JsonFile, LockFile, fsmode};

use crate::shares::ShareReservation;
pub use holder::Holder;
use mesos_gpu_health::HealthStore;
pub use owner::{DaemonAnswer, DockerDaemons, Host, Liveness, Owner, ProcessStamp};
pub use uuid::{EmptyUuid, GpuUuid};

/// Where the pool lives unless told otherwise.
pub const DEFAULT_POOL_DIR: &str = "/var/lib/mesos-gpu";
/// The environment variable the cli reads for the pool directory.
pub const POOL_DIR_ENV: &str = "MESOS_GPU_POOL_DIR";
/// The schema version this code reads and writes.
pub(crate) const SCHEMA_VERSION: u32 = 1;
/// How long a transaction waits for the lock.
pub const LOCK_WAIT: Duration = Duration::from_secs(10);
const STATE_FILE: &str = "pool.json";
const LOCK_FILE: &str = "pool.lock";

/// Why the pool could not be used.
#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    /// A file operation failed.
    #[error(transparent)]
    Io(#[from] mesos_gpu_os::IoError),
    /// The state file could not be read or replaced (not a pool of ours, another schema
    /// version, a failed write).
    #[error(transparent)]
    Store(#[from] mesos_gpu_os::StoreError),
    /// No reservation has that owner id.
    #[error("no reservation of the GPU pool {path} is owned by {id:?} (owners: {known})")]
    UnknownOwner {
        /// The pool file.
        path: PathBuf,
        /// The id asked for.
        id: String,
        /// The ids there are, comma-separated (or `none`).
        known: String,
    },
    /// The owner is not known to be gone.
    #[error("{id} is {state} ({why}); its GPUs may be in use: pass --force to release them anyway")]
    NotDead {
        /// The owner id.
        id: String,
        /// `alive` or `uncertain`.
        state: &'static str,
        /// Why.
        why: String,
    },
    /// The lock stayed busy for [`LOCK_WAIT`].
    #[error("the GPU pool lock {path} is still held after {waited:?} by {holder}")]
    Busy {
        /// The lock file.
        path: PathBuf,
        /// How long we waited.
        waited: Duration,
        /// Who holds it, as it wrote itself into the lock file.
        holder: String,
    },
    /// The lock file could not be opened or locked.
    #[error(transparent)]
    Lock(#[from] mesos_gpu_os::LockError),
    /// The pool directory could not be made, or is refused as others can write it.
    #[error(transparent)]
    Dir(#[from] mesos_gpu_os::FsModeError),
}

/// One reservation: an owner's GPUs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "ReservationRecord", into = "ReservationRecord")]
pub struct Reservation {
    /// The checkpoint (a file path) that records the reservation; only it rewrites it (see
    /// [`EVIDENCE_PUBLISHER`] for records no checkpoint holds).
    pub publisher: String,
    /// Who holds the GPUs.
    pub owner: Owner,
    /// The GPUs, by UUID, as the process that granted them wrote them.
    pub gpus: Vec<GpuUuid>,
    /// GPUs the record holds without naming them: each an empty string in the file, written by
    /// a mesos-gpu from before the fix for processes that cannot see the GPUs. Which GPUs they
    /// are is unknown until [`repair_unnamed`] reads them off the owner's devices.
    pub unnamed: u32,
    /// When it was made, seconds since the Unix epoch.
    pub since: u64,
}

/// A [`Reservation`] as the file spells it: its GPUs one list of strings, an unnamed GPU an
/// empty one (so the file reads the same to every release, before and after a repair).
#[derive(Serialize, Deserialize)]
struct ReservationRecord {
    holder: String,
    owner: Owner,
    gpus: Vec<String>,
    since: u64,
}

impl From<ReservationRecord> for Reservation {
    fn from(r: ReservationRecord) -> Reservation {
        let mut unnamed = 0u32;
        let gpus = r
            .gpus
            .into_iter()
            .filter_map(|uuid| match GpuUuid::new(uuid) {
                Ok(uuid) => Some(uuid),
                Err(EmptyUuid) => {
                    unnamed = unnamed.saturating_add(1);
                    None
                }
            })
            .collect();
        Reservation {
            publisher: r.holder,
            owner: r.owner,
            gpus,
            unnamed,
            since: r.since,
        }
    }
}

impl From<Reservation> for ReservationRecord {
    fn from(r: Reservation) -> ReservationRecord {
        let unnamed = (0..r.unnamed).map(|_| String::new());
        ReservationRecord {
            holder: r.publisher,
            owner: r.owner,
            gpus: r
                .gpus
                .into_iter()
                .map(String::from)
                .chain(unnamed)
                .collect(),
            since: r.since,
        }
    }
}

/// The publisher of a record that no checkpoint holds any more: one with GPUs recorded without
/// a UUID, kept (and once named, held) on evidence about its owner by [`repair_unnamed`]. No
/// checkpoint path spells it, so no publisher rewrites such a record; it leaves with its owner
/// ([`reconcile`], `mesos-gpu gpu release`).
pub const EVIDENCE_PUBLISHER: &str = "evidence";

/// The pool's durable state (schema [`SCHEMA_VERSION`], kept by [`mesos_gpu_os::store`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolState {
    /// Reservations by owner id.
    pub reservations: BTreeMap<String, Reservation>,
    /// Work directories whose `gpu/health.json` (a health monitor's checkpoint) every
    /// allocation honours.
    #[serde(default)]
    pub health_dirs: BTreeSet<PathBuf>,
    /// Shares of shared GPUs by owner id ([`crate::shares`]).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub shares: BTreeMap<String, ShareReservation>,
    /// The MPS control daemon of each shared GPU, by UUID: one per GPU for the whole node, so
    /// a process that finds one here adopts it instead of starting another.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub mps: BTreeMap<String, MpsRecord>,
}

/// A shared GPU's MPS control daemon as the pool records it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MpsRecord {
    /// The daemon: its directories and process.
    pub daemon: mesos_gpu_enforce::mps::MpsDaemon,
    /// The default limits it was told (those of one unit).
    pub per_replica: mesos_gpu_placement::sharing::ShareLimits,
}

impl mesos_gpu_os::Document for PoolState {
    const VERSION: u32 = SCHEMA_VERSION;
    const WHAT: &'static str = "GPU pool file";
}

impl PoolState {
    /// UUIDs held by reservations of publishers other than `publisher`, and GPUs with a share.
    pub fn held_by_others(&self, publisher: &str) -> BTreeSet<&str> {
        self.reservations
            .values()
            .filter(|r| r.publisher != publisher)
            .flat_map(|r| r.gpus.iter().map(GpuUuid::as_str))
            .chain(self.shares.values().map(|s| s.grant.uuid.as_str()))
            .collect()
    }

    /// UUIDs held by quarantine reservations, of any publisher.
    pub fn quarantined(&self) -> BTreeSet<&str> {
        self.reservations
            .values()
            .filter(|r| matches!(r.owner, Owner::Quarantine { .. }))
            .flat_map(|r| r.gpus.iter().map(GpuUuid::as_str))
            .collect()
    }

    /// True when a record holds GPUs without naming them (checked at every pool lock: no
    /// allocation).
    pub fn holds_unnamed(&self) -> bool {
        self.reservations.values().any(|r| r.unnamed > 0)
    }

    /// The records holding GPUs without naming them ([`Reservation::unnamed`]), by owner id.
    pub fn unnamed(&self) -> BTreeMap<&str, u32> {
        self.reservations
            .iter()
            .filter(|(_, r)| r.unnamed > 0)
            .map(|(id, r)| (id.as_str(), r.unnamed))
            .collect()
    }

    /// Replaces every reservation of `publisher` with `entries` (id, owner, UUIDs); an entry that
    /// was there already keeps its `since`. A record holding GPUs it does not name is kept: the
    /// publisher's checkpoint lost them, so it is no evidence about them ([`repair_unnamed`]).
    pub fn publish(&mut self, publisher: &str, entries: Vec<(String, Owner, Vec<GpuUuid>)>) {
        let mut old: BTreeMap<String, Reservation> = BTreeMap::new();
        self.reservations.retain(|id, r| {
            if r.publisher == publisher && r.unnamed == 0 {
                old.insert(id.clone(), r.clone());
                false
            } else {
                true
            }
        });
        for (id, owner, gpus) in entries {
            if gpus.is_empty() {
                continue;
            }
            let since = old.get(&id).map_or_else(now, |r| r.since);
            if let Some(other) = self.reservations.get(&id) {
                tracing::error!(id, publisher, other = %other.publisher, "two publishers record one owner id; keeping both GPUs reserved under a new id");
            }
            let key = if self.reservations.contains_key(&id) {
                format!("{id}@{publisher}")
            } else {
                id
            };
            self.reservations.insert(
                key,
                Reservation {
                    publisher: publisher.to_owned(),
                    owner,
                    gpus,
                    unnamed: 0,
                    since,
                },
            );
        }
    }

    /// Replaces every share of `publisher` with `entries` (id, share); an entry that was there
    /// already keeps its `since`.
    pub fn publish_shares(&mut self, publisher: &str, entries: Vec<(String, ShareReservation)>) {
        let mut old: BTreeMap<String, u64> = BTreeMap::new();
        self.shares.retain(|id, s| {
            if s.publisher == publisher {
                old.insert(id.clone(), s.since);
                false
            } else {
                true
            }
        });
        for (id, mut share) in entries {
            if let Some(&since) = old.get(&id) {
                share.since = since;
            }
            self.shares.insert(id, share);
        }
    }

    /// UUIDs of GPUs and MIG devices that a registered health checkpoint marks unhealthy,
    /// with the reason.
    pub fn unhealthy(&self) -> BTreeMap<String, String> {
        let mut out = BTreeMap::new();
        for dir in &self.health_dirs {
            match HealthStore::at(dir).load() {
                Ok(Some(snapshot)) => {
                    for gpu in snapshot.records() {
                        if let mesos_gpu_health::GpuHealth::Unhealthy { reason, .. } = &gpu.health {
                            out.insert(gpu.uuid.clone(), reason.to_string());
                        }
                    }
                }
                Ok(None) => {}
                Err(e) => {
                    tracing::warn!(dir = %dir.display(), error = %e, "cannot read a GPU health checkpoint; its GPUs are taken as healthy")
                }
            }
        }
        out
    }
}

/// Why a request cannot be served: what the node's GPUs are doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shortage {
    /// GPUs asked for.
    pub asked: u32,
    /// Free and healthy.
    pub free: u32,
    /// Unhealthy and not held.
    pub unhealthy: u32,
    /// Quarantined.
    pub quarantined: u32,
    /// Held by live or uncertain owners.
    pub held: u32,
    /// GPUs live (or uncertain) owners' records hold without naming them
    /// ([`Reservation::unnamed`]): while there are any, every GPU not otherwise held counts as
    /// held, since any may be one of them.
    pub unnamed: u32,
}

impl std::fmt::Display for Shortage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} asked; {} free, {} unhealthy, {} quarantined, {} held",
            self.asked, self.free, self.unhealthy, self.quarantined, self.held
        )?;
        if self.unnamed > 0 {
            write!(
                f,
                "; {} GPU(s) are held by live owners whose records do not say which (written by a mesos-gpu from before the double-booking fix), so no GPU is granted until a process that sees the GPUs names them from their owners' devices or the owners end",
                self.unnamed
            )?;
        }
        f.write_str(" (run `mesos-gpu gpu list`)")
    }
}

/// What [`reconcile`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Reconciled {
    /// Reservations freed, with why their owner is dead.
    pub freed: Vec<(String, String)>,
    /// Reservations kept although not alive, with why.
    pub uncertain: Vec<(String, String)>,
}

/// One reservation as `gpu list` shows it.
#[derive(Debug, Clone, Serialize)]
pub struct Listed {
    /// The owner id.
    pub id: String,
    /// The reservation.
    #[serde(flatten)]
    pub reservation: Reservation,
    /// Whether its owner is still there.
    pub liveness: Liveness,
}

/// One share of a shared GPU as `gpu list` shows it.
#[derive(Debug, Clone, Serialize)]
pub struct ListedShare {
    /// The owner id.
    pub id: String,
    /// The share.
    #[serde(flatten)]
    pub share: ShareReservation,
    /// Whether its owner is still there.
    pub liveness: Liveness,
}

/// What the pool holds, as `gpu list` shows it.
#[derive(Debug, Clone, Serialize)]
pub struct Listing {
    /// The pool file.
    pub path: PathBuf,
    /// Every reservation, with its owner's liveness.
    pub reservations: Vec<Listed>,
    /// Every share of a shared GPU, with its owner's liveness.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub shares: Vec<ListedShare>,
    /// GPUs the registered health checkpoints mark unhealthy (UUID: reason).
    pub unhealthy: BTreeMap<String, String>,
}

/// Removes what a dead `exec` left (its empty cgroup, its private directory) and the
/// reservation; a cgroup that cannot be removed keeps the reservation (the error says why).
fn free_reservation(state: &mut PoolState, id: &str) -> io::Result<()> {
    if let Some(r) = state.reservations.get(id) {
        remove_leftovers(&r.owner)?;
    }
    state.reservations.remove(id);
    Ok(())
}

/// Removes what a dead `exec` leaves: its empty cgroup (an error when that fails) and its
/// private directory.
fn remove_leftovers(owner: &Owner) -> io::Result<()> {
    if let Owner::Process {
        cgroup,
        private_dir,
        ..
    } = owner
    {
        if let Some(cgroup) = cgroup {
            remove_dir_if_present(cgroup).map_err(|e| {
                io::Error::new(e.kind(), format!("cannot remove {}: {e}", cgroup.display()))
            })?;
        }
        if let Some(dir) = private_dir
            && let Err(e) = fs::remove_dir_all(dir)
            && e.kind() != io::ErrorKind::NotFound
        {
            tracing::warn!(dir = %dir.display(), error = %e, "cannot remove a dead exec's directory");
        }
    }
    Ok(())
}

/// Frees every reservation and GPU share (of a publisher other than `keep`) whose owner is dead;
/// before freeing a dead `exec`'s its empty cgroup and private directory are removed (a cgroup
/// that cannot be removed keeps the reservation).
pub fn reconcile(state: &mut PoolState, host: &Host, keep: Option<&str>) -> Reconciled {
    let mut done = Reconciled::default();
    let ids: Vec<String> = state
        .reservations
        .iter()
        .filter(|(_, r)| Some(r.publisher.as_str()) != keep)
        .map(|(id, _)| id.clone())
        .collect();
    for id in ids {
        let Some(r) = state.reservations.get(&id) else {
            continue;
        };
        match host.liveness(&r.owner) {
            Liveness::Dead(why) => {
                let gpus = r.gpus.clone();
                match free_reservation(state, &id) {
                    Ok(()) => {
                        tracing::info!(owner = %id, ?gpus, why, "freed the GPUs of a dead owner");
                        done.freed.push((id, why));
                    }
                    Err(e) => done.uncertain.push((id, format!("{why}; {e}"))),
                }
            }
            Liveness::Uncertain(why) => done.uncertain.push((id, why)),
            Liveness::Alive(_) => {}
        }
    }
    let shares: Vec<String> = state
        .shares
        .iter()
        .filter(|(_, s)| Some(s.publisher.as_str()) != keep)
        .map(|(id, _)| id.clone())
        .collect();
    for id in shares {
        let Some(share) = state.shares.get(&id) else {
            continue;
        };
        match host.liveness(&share.owner) {
            Liveness::Dead(why) => match remove_leftovers(&share.owner) {
                Ok(()) => {
                    tracing::info!(owner = %id, gpu = %share.grant.uuid, units = share.grant.units, why, "freed the GPU share of a dead owner");
                    state.shares.remove(&id);
                    done.freed.push((id, why));
                }
                Err(e) => done.uncertain.push((id, format!("{why}; {e}"))),
            },
            Liveness::Uncertain(why) => done.uncertain.push((id, why)),
            Liveness::Alive(_) => {}
        }
    }
    done
}

/// What [`repair_unnamed`] did with the records holding GPUs they do not name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Repaired {
    /// Records dropped, with why their owner is gone.
    pub freed: Vec<(String, String)>,
    /// Records whose GPUs are now named, with the GPUs read off their owner's devices.
    pub named: Vec<(String, Vec<GpuUuid>)>,
    /// Records still holding GPUs without naming them: how many, and why they cannot be named.
    pub unnamed: Vec<(String, u32, String)>,
}

/// Repairs the records holding GPUs without naming them (an empty UUID, written by a mesos-gpu
/// from before the fix for processes that cannot see the GPUs), on evidence about their owner
/// only: a record whose owner is gone is dropped (with what a dead `exec` left); a live (or
/// uncertain) owner's GPUs are named from `devices`, the GPUs its devices let it open (its
/// devices cgroup, its Docker container's devices) as the calling process (which must see the
/// node's GPUs) names them. A named record holds exactly the GPUs it named before and those its
/// owner can open. Either way a record leaves its publisher, whose checkpoint lost those GPUs,
/// for [`EVIDENCE_PUBLISHER`], and leaves the pool with its owner. A record whose owner's
/// devices cannot be read keeps holding GPUs it does not name; while one does, no process may
/// grant a GPU (the callers' rule: any GPU may be one of them).
pub fn repair_unnamed(
    state: &mut PoolState,
    host: &Host,
    devices: &dyn Fn(&Owner) -> Result<Vec<GpuUuid>, String>,
) -> Repaired {
    let mut done = Repaired::default();
    let ids: Vec<String> = state.unnamed().keys().map(|&id| id.to_owned()).collect();
    for id in ids {
        let Some(r) = state.reservations.get(&id) else {
            continue;
        };
        let count = r.unnamed;
        if let Liveness::Dead(why) = host.liveness(&r.owner) {
            match free_reservation(state, &id) {
                Ok(()) => {
                    tracing::info!(owner = %id, why, "dropped a pool record holding GPUs without naming them: its owner is gone");
                    done.freed.push((id, why));
                }
                Err(e) => done.unnamed.push((id, count, format!("{why}; {e}"))),
            }
            continue;
        }
        let seen = devices(&r.owner);
        let Some(r) = state.reservations.get_mut(&id) else {
            continue;
        };
        r.publisher = EVIDENCE_PUBLISHER.to_owned();
        match seen {
            Ok(uuids) => {
                r.unnamed = 0;
                let added: Vec<GpuUuid> =
                    uuids.into_iter().filter(|u| !r.gpus.contains(u)).collect();
                r.gpus.extend(added.iter().cloned());
                tracing::warn!(owner = %id, recorded_without_uuid = count, named = ?added, held = ?r.gpus, "named the GPUs of a pool record that held them without a UUID, from its owner's devices");
                if r.gpus.is_empty() {
                    state.reservations.remove(&id);
                }
                done.named.push((id, added));
            }
            Err(why) => {
                done.unnamed.push((id, r.unnamed, why));
            }
        }
    }
    done
}

fn remove_dir_if_present(dir: &Path) -> io::Result<()> {
    match fs::remove_dir(dir) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

/// Seconds since the Unix epoch.
pub fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The pool directory of one node.
#[derive(Debug, Clone)]
pub struct Pool {
    dir: PathBuf,
    /// The state file as this handle last read or wrote it, shared by its clones.
    seen: Arc<Mutex<Option<Seen>>>,
}

/// `pool.json` as a transaction last read or wrote it: a transaction that finds the file as it
/// was reuses the state instead of parsing it again (issue 36: parsing grows with the records).
/// Every writer replaces the file by `rename`, so an unchanged file keeps its inode, size and
/// change time; a replaced one gets another inode, or a later change time where an inode is
/// reused.
#[derive(Debug)]
struct Seen {
    stamp: FileStamp,
    state: Arc<PoolState>,
}

/// What tells one version of the state file from another.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FileStamp {
    dev: u64,
    ino: u64,
    size: u64,
    ctime: (i64, i64),
    mtime: (i64, i64),
}

impl FileStamp {
    /// The stamp of `path`, or `None` when it cannot be read (then the file is parsed).
    fn of(path: &Path) -> Option<FileStamp> {
        use std::os::unix::fs::MetadataExt as _;
        let m = fs::metadata(path).ok()?;
        Some(FileStamp {
            dev: m.dev(),
            ino: m.ino(),
            size: m.size(),
            ctime: (m.ctime(), m.ctime_nsec()),
            mtime: (m.mtime(), m.mtime_nsec()),
        })
    }
}

impl Pool {
    /// The pool in `dir` (its files go to `<dir>/gpu/`); nothing is created until a
    /// transaction.
    pub fn at(dir: impl Into<PathBuf>) -> Pool {
        Pool {
            dir: dir.into().join("gpu"),
            seen: Arc::default(),
        }
    }

    /// The state file.
    pub fn state_path(&self) -> PathBuf {
        self.dir.join(STATE_FILE)
    }

    /// The state as last committed, read without the lock (empty when there is none).
    pub fn read(&self) -> Result<PoolState, PoolError> {
        Ok(self.file().load()?.unwrap_or_default())
    }

    /// The state under the lock: the one last seen when the file is as it was then, else
    /// parsed (and remembered).
    fn read_locked(&self) -> Result<Arc<PoolState>, PoolError> {
        let stamp = FileStamp::of(&self.state_path());
        if let Some(stamp) = stamp
            && let Some(seen) = self.seen().as_ref().filter(|s| s.stamp == stamp)
        {
            return Ok(Arc::clone(&seen.state));
        }
        let state = Arc::new(self.read()?);
        // Stamped before the read: a file replaced in between is parsed again next time.
        self.remember(stamp, &state);
        Ok(state)
    }

    /// Remembers `state` as the file's content at `stamp` (forgets when there is no stamp).
    fn remember(&self, stamp: Option<FileStamp>, state: &Arc<PoolState>) {
        *self.seen() = stamp.map(|stamp| Seen {
            stamp,
            state: Arc::clone(state),
        });
    }

    fn seen(&self) -> std::sync::MutexGuard<'_, Option<Seen>> {
        self.seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn file(&self) -> JsonFile {
        JsonFile::at(self.state_path(), fsmode::STATE_FILE)
    }

    /// Every reservation with its owner's liveness, read without the lock (nothing is written).
    pub fn list(&self, host: &Host) -> Result<Listing, PoolError> {
        let state = self.read()?;
        Ok(Listing {
            path: self.state_path(),
            unhealthy: state.unhealthy(),
            reservations: state
                .reservations
                .into_iter()
                .map(|(id, reservation)| Listed {
                    liveness: host.liveness(&reservation.owner),
                    id,
                    reservation,
                })
                .collect(),
            shares: state
                .shares
                .into_iter()
                .map(|(id, share)| ListedShare {
                    liveness: host.liveness(&share.owner),
                    id,
                    share,
                })
                .collect(),
        })
    }

    /// Releases the reservation (or GPU share) of owner `id`, refused unless its owner is dead
    /// or `force`; returns the freed reservation (a share as a reservation of its one GPU). The
    /// publisher of a live owner records it again at its next change, so `force` is for owners the
    /// operator knows are gone.
    pub fn release(&self, id: &str, force: bool, host: &Host) -> Result<Reservation, PoolError> {
        let mut tx = self.begin()?;
        let freed = match (tx.state.reservations.get(id), tx.state.shares.get(id)) {
            (Some(r), _) => r.clone(),
            (None, Some(share)) => Reservation {
                publisher: share.publisher.clone(),
                owner: share.owner.clone(),
                gpus: GpuUuid::new(share.grant.uuid.clone()).into_iter().collect(),
                unnamed: 0,
                since: share.since,
            },
            (None, None) => {
                let known: Vec<&str> = tx
                    .state
                    .reservations
                    .keys()
                    .chain(tx.state.shares.keys())
                    .map(String::as_str)
                    .collect();
                return Err(PoolError::UnknownOwner {
                    path: self.state_path(),
                    id: id.to_owned(),
                    known: if known.is_empty() {
                        "none".to_owned()
                    } else {
                        known.join(", ")
                    },
                });
            }
        };
        match host.liveness(&freed.owner) {
            Liveness::Dead(_) => {}
            Liveness::Alive(why) if !force => {
                return Err(PoolError::NotDead {
                    id: id.to_owned(),
                    state: "alive",
                    why,
                });
            }
            Liveness::Uncertain(why) if !force => {
                return Err(PoolError::NotDead {
                    id: id.to_owned(),
                    state: "uncertain",
                    why,
                });
            }
            Liveness::Alive(_) | Liveness::Uncertain(_) => {}
        }
        if let Err(e) = remove_leftovers(&freed.owner)
            && !force
        {
            return Err(PoolError::Io(IoError::new(
                "free the reservation of",
                id,
                e,
            )));
        }
        tx.state.reservations.remove(id);
        tx.state.shares.remove(id);
        tx.commit()?;
        tracing::info!(owner = id, gpus = ?freed.gpus, force, "released a reservation of the GPU pool");
        Ok(freed)
    }

    /// Frees every dead owner's reservation (one reconciliation).
    pub fn reconcile(&self, host: &Host) -> Result<Reconciled, PoolError> {
        let mut tx = self.begin()?;
        let done = reconcile(&mut tx.state, host, None);
        tx.commit()?;
        Ok(done)
    }

    /// Locks the pool (waiting at most [`LOCK_WAIT`]) and reads its state.
    pub fn begin(&self) -> Result<Transaction, PoolError> {
        self.begin_within(LOCK_WAIT)
    }

    /// [`Pool::begin`] with another bound on the wait.
    pub(crate) fn begin_within(&self, wait: Duration) -> Result<Transaction, PoolError> {
        let lock_span = timing::span(Step::PoolLock);
        let root = self.dir.parent().unwrap_or(&self.dir);
        fsmode::state_dir(root, &self.dir, fsmode::STATE_DIR)?;
        let lock = LockFile::create(&self.dir.join(LOCK_FILE), fsmode::LOCK_FILE)?;
        let start = Instant::now();
        if !lock.lock_within(wait)? {
            let mut holder = String::new();
            let _ = lock.file().read_to_string(&mut holder);
            return Err(PoolError::Busy {
                path: lock.path().to_owned(),
                waited: start.elapsed(),
                holder: holder.trim().to_owned(),
            });
        }
        // Name ourselves for whoever waits (best effort: the lock is what counts). A file that
        // names this process already is left as it is: rewriting it truncates it, which waits
        // for the journal while any process fsyncs on the filesystem (issue 36).
        let mut file = lock.file();
        let ours = format!("pid {} (", std::process::id());
        let mut named = String::new();
        if file.read_to_string(&mut named).is_err() || !named.starts_with(&ours) {
            let me = format!("{ours}{})", process_name());
            let _ = file
                .set_len(0)
                .and_then(|()| file.rewind())
                .and_then(|()| file.write_all(me.as_bytes()));
        }
        drop(lock_span);
        let before = {
            let _span = timing::span(Step::PoolRead);
            self.read_locked()?
        };
        Ok(Transaction {
            pool: self.clone(),
            state: PoolState::clone(&before),
            before,
            _lock: lock,
        })
    }
}

fn process_name() -> String {
    fs::read_to_string("/proc/self/comm").map_or_else(|_| "?".to_owned(), |s| s.trim().to_owned())
}

/// A locked pool: read, decide, `Transaction::commit`. Dropping it unlocks.
#[derive(Debug)]
pub struct Transaction {
    pool: Pool,
    before: Arc<PoolState>,
    /// The state, to change.
    pub state: PoolState,
    _lock: LockFile,
}

impl Transaction {
    /// Writes the state back crash-safely if it changed; the lock stays held until the
    /// transaction is dropped.
    pub fn commit(&mut self) -> Result<(), PoolError> {
        if self.state == *self.before {
            return Ok(());
        }
        let _span = timing::span(Step::PoolWrite);
        self.pool.file().save(&self.state)?;
        self.before = Arc::new(self.state.clone());
        self.pool
            .remember(FileStamp::of(&self.pool.state_path()), &self.before);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn uuids(names: &[&str]) -> Vec<GpuUuid> {
        names.iter().map(|n| GpuUuid::new(*n).unwrap()).collect()
    }

    fn process(pid: u32) -> Owner {
        Owner::Process {
            process: ProcessStamp {
                pid,
                start_time: 1,
                boot_id: "no-such-boot".into(),
            },
            cgroup: None,
            private_dir: None,
        }
    }

    #[test]
    fn records_with_empty_uuids_are_read_as_unnamed_gpus_and_written_back_as_read() {
        let text = r#"{"reservations":{"c1":{"holder":"/ckpt","owner":{"kind":"quarantine","reason":"r"},"gpus":["GPU-a","",""],"since":7}},"health_dirs":[]}"#;
        let state: PoolState = serde_json::from_str(text).unwrap();
        let r = &state.reservations["c1"];
        assert_eq!((r.gpus.clone(), r.unnamed), (uuids(&["GPU-a"]), 2));
        assert_eq!(state.unnamed(), BTreeMap::from([("c1", 2)]));
        let again = serde_json::to_value(&state).unwrap();
        assert_eq!(
            again["reservations"]["c1"]["gpus"],
            serde_json::json!(["GPU-a", "", ""])
        );
    }

    #[test]
    fn a_publisher_never_drops_gpus_its_record_holds_without_naming_them() {
        let mut state = PoolState::default();
        state.reservations.insert(
            "old".into(),
            Reservation {
                publisher: "p".into(),
                owner: process(1),
                gpus: Vec::new(),
                unnamed: 1,
                since: 0,
            },
        );
        state.publish("p", vec![("new".into(), process(2), uuids(&["GPU-b"]))]);
        assert_eq!(state.reservations["old"].unnamed, 1);
        assert_eq!(state.reservations["new"].gpus, uuids(&["GPU-b"]));
        state.publish("p", Vec::new());
        assert_eq!(state.reservations.keys().collect::<Vec<_>>(), ["old"]);
    }

    fn share(publisher: &str, owner: Owner, uuid: &str) -> ShareReservation {
        ShareReservation {
            publisher: publisher.into(),
            owner,
            grant: mesos_gpu_placement::sharing::PlacedShare {
                uuid: uuid.into(),
                index: 0,
                units: 1,
                replicas: 4,
                mode: mesos_gpu_placement::sharing::SharingMode::TimeSlicing,
                limits: mesos_gpu_placement::sharing::ShareLimits::of(1, 4, 1 << 30),
            },
            since: 7,
        }
    }

    #[test]
    fn shares_are_published_per_publisher_and_dead_ones_freed() {
        let host = Host::default();
        let alive = Owner::Process {
            process: host.this_process().unwrap(),
            cgroup: None,
            private_dir: None,
        };
        let mut state = PoolState::default();
        state.publish_shares(
            "h1",
            vec![
                ("a".into(), share("h1", alive.clone(), "GPU-0")),
                ("dead".into(), share("h1", process(1), "GPU-0")),
            ],
        );
        state.publish_shares("h2", vec![("b".into(), share("h2", process(2), "GPU-1"))]);
        // A publisher's publish replaces its own shares only, keeping `since` of those it keeps.
        let mut again = share("h1", alive, "GPU-0");
        again.since = 99;
        state.publish_shares("h1", vec![("a".into(), again)]);
        assert_eq!(state.shares.keys().collect::<Vec<_>>(), ["a", "b"]);
        assert_eq!(state.shares["a"].since, 7);
        assert!(state.held_by_others("h9").contains("GPU-1"));
        // Dead owners' shares are freed, except the keeping publisher's own.
        let done = reconcile(&mut state.clone(), &host, Some("h2"));
        assert!(done.freed.is_empty(), "{done:?}");
        let done = reconcile(&mut state, &host, None);
        assert_eq!(done.freed.len(), 1, "{done:?}");
        assert_eq!(done.freed[0].0, "b");
        assert_eq!(state.shares.keys().collect::<Vec<_>>(), ["a"]);
    }

    #[test]
    fn a_transaction_reuses_the_state_it_saw_only_while_the_file_is_unchanged() {
        let dir = tempfile::tempdir().unwrap();
        let (mine, other) = (Pool::at(dir.path()), Pool::at(dir.path()));
        let mut tx = mine.begin().unwrap();
        tx.state
            .publish("a", vec![("c1".into(), process(1), uuids(&["GPU-1"]))]);
        tx.commit().unwrap();
        drop(tx);
        // Unchanged: the state this handle wrote is reused, not parsed.
        let tx = mine.begin().unwrap();
        assert!(Arc::ptr_eq(
            &tx.before,
            &mine.seen().as_ref().unwrap().state
        ));
        assert_eq!(tx.state.reservations.keys().collect::<Vec<_>>(), ["c1"]);
        drop(tx);
        // Replaced by another handle (another process): parsed again.
        for n in 0..3 {
            let mut tx = other.begin().unwrap();
            tx.state
                .publish("b", vec![(format!("d{n}"), process(2), uuids(&["GPU-2"]))]);
            tx.commit().unwrap();
        }
        let tx = mine.begin().unwrap();
        assert_eq!(
            tx.state.reservations.keys().collect::<Vec<_>>(),
            ["c1", "d2"]
        );
    }

    #[test]
    fn transactions_round_trip_and_publish_only_their_publisher() {
        let dir = tempfile::tempdir().unwrap();
        let pool = Pool::at(dir.path());
        assert_eq!(pool.read().unwrap(), PoolState::default());
        let mut tx = pool.begin().unwrap();
        tx.state
            .publish("a", vec![("c1".into(), process(1), uuids(&["GPU-1"]))]);
        tx.state
            .publish("b", vec![("c2".into(), process(2), uuids(&["GPU-2"]))]);
        tx.commit().unwrap();
        drop(tx);
        let mut tx = pool.begin().unwrap();
        assert_eq!(tx.state.held_by_others("a"), BTreeSet::from(["GPU-2"]));
        tx.state.publish("a", vec![]);
        tx.commit().unwrap();
        drop(tx);
        let state = pool.read().unwrap();
        assert_eq!(state.reservations.keys().collect::<Vec<_>>(), ["c2"]);
        let temps = fs::read_dir(dir.path().join("gpu"))
            .unwrap()
            .filter(|e| e.as_ref().unwrap().path().extension() == Some("tmp".as_ref()))
            .count();
        assert_eq!(temps, 0, "a temp file was left behind");
    }

    #[test]
    fn a_busy_lock_names_its_holder() {
        let dir = tempfile::tempdir().unwrap();
        let pool = Pool::at(dir.path());
        let _held = pool.begin().unwrap();
        // flock locks belong to the open file description: a second open conflicts even in
        // this process.
        let err = pool.begin_within(Duration::from_millis(30)).unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains(&format!("pid {}", std::process::id())),
            "{text}"
        );
    }

    #[test]
    fn pool_files_keep_the_holder_key_for_the_publisher() {
        // pool.json as every mesos-gpu so far writes it: the publisher under "holder". Older
        // processes on the node (a docker-wrapper outliving an upgrade) read the same file.
        let dir = tempfile::tempdir().unwrap();
        let pool = Pool::at(dir.path());
        fs::create_dir_all(dir.path().join("gpu")).unwrap();
        let written = br#"{"version": 1, "reservations": {"task-1": {
            "holder": "/var/lib/mesos/gpu/allocations.json",
            "owner": {"kind": "process", "process": {"pid": 7, "start_time": 1,
                "boot_id": "b"}, "cgroup": null, "private_dir": null},
            "gpus": ["GPU-1"], "since": 5}}, "health_dirs": []}"#;
        fs::write(pool.state_path(), written).unwrap();
        let mut tx = pool.begin().unwrap();
        let r = &tx.state.reservations["task-1"];
        assert_eq!(r.publisher, "/var/lib/mesos/gpu/allocations.json");
        assert_eq!(r.gpus, uuids(&["GPU-1"]));
        tx.state
            .shares
            .insert("task-2".into(), share("/p", process(8), "GPU-2"));
        tx.commit().unwrap();
        drop(tx);

        let doc: serde_json::Value =
            serde_json::from_slice(&fs::read(pool.state_path()).unwrap()).unwrap();
        for record in [&doc["reservations"]["task-1"], &doc["shares"]["task-2"]] {
            assert!(record.get("holder").is_some(), "{record}");
            assert!(record.get("publisher").is_none(), "{record}");
        }
        let back = pool.read().unwrap();
        assert_eq!(back.shares["task-2"].publisher, "/p");
    }

    #[test]
    fn other_versions_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let pool = Pool::at(dir.path());
        fs::create_dir_all(dir.path().join("gpu")).unwrap();
        fs::write(pool.state_path(), br#"{"version": 9}"#).unwrap();
        assert!(matches!(
            pool.read().unwrap_err(),
            PoolError::Store(mesos_gpu_os::StoreError::Version { found: 9, .. })
        ));
    }

    #[test]
    fn reconcile_frees_exactly_the_dead() {
        let mut state = PoolState::default();
        let host = Host::default();
        let me = host.this_process().unwrap();
        let alive = Owner::Process {
            process: me,
            cgroup: None,
            private_dir: None,
        };
        let private = tempfile::tempdir().unwrap();
        let dead_dir = private.path().join("exec-1");
        fs::create_dir_all(&dead_dir).unwrap();
        let dead = Owner::Process {
            process: ProcessStamp {
                pid: 1,
                start_time: 1,
                boot_id: "an-earlier-boot".into(),
            },
            cgroup: None,
            private_dir: Some(dead_dir.clone()),
        };
        state.publish(
            "h1",
            vec![
                ("alive".into(), alive, uuids(&["GPU-1"])),
                ("dead".into(), dead, uuids(&["GPU-2"])),
                (
                    "docker".into(),
                    Owner::Docker {
                        name: "d".into(),
                        daemon: None,
                        starter: None,
                        holder: None,
                    },
                    uuids(&["GPU-3"]),
                ),
                (
                    "q".into(),
                    Owner::Quarantine {
                        reason: "a cgroup without a record".into(),
                    },
                    uuids(&["GPU-4"]),
                ),
            ],
        );
        let done = reconcile(&mut state, &host, None);
        assert_eq!(done.freed.len(), 1, "{done:?}");
        assert_eq!(done.freed[0].0, "dead");
        assert_eq!(done.uncertain.len(), 2, "{done:?}");
        assert!(!dead_dir.exists(), "the private directory goes with it");
        assert_eq!(
            state.reservations.keys().collect::<Vec<_>>(),
            ["alive", "docker", "q"]
        );
        // A publisher's own reservations are left to it.
        let mut state2 = state.clone();
        state2.publish("h2", vec![("dead2".into(), process(5), uuids(&["GPU-5"]))]);
        assert!(reconcile(&mut state2, &host, Some("h2")).freed.is_empty());
    }
}
