//! GPU shares in the container lifecycle (issue 17): a node whose operator declared replicas
//! ([`SharingConfig`]) splits its advertised GPUs statically into shared GPUs (R units each)
//! and whole GPUs ([`mesos_gpu_placement::sharing::SharingPlan`]). The allocator manages the whole GPUs only;
//! the shared ones are handed out as shares, recorded in the node's pool (which every process
//! on the node reads, so two processes never over-commit a GPU) and in the container's
//! checkpoint entry.
//!
//! Which kind a request gets: `gpus:k` with k at most the largest R is a k/R share of one shared
//! GPU (packed onto partly used GPUs first); when no shared GPU has k free units it is served
//! with k whole GPUs if there are that many free, else refused with both reasons. A larger k
//! takes whole GPUs only. A share is never spread across GPUs.
//!
//! Under `mps`, the GPU's control daemon is made sure of before the share is handed out (one
//! per GPU, or per MIG device, for the whole node; a MIG device's is stopped once its last
//! share ended: its record lives in the pool, so another process adopts it
//! instead of starting a second), and the container gets the client environment with its k/R
//! limits; a container with an image also gets the pipe directory bind-mounted at the same path
//! and the daemon's shared memory (the host's `/dev/shm`) at `/dev/shm`.

use std::sync::Mutex;

use super::{ContainerId, Isolator, LifecycleError};
use crate::mig_strategy::MigStrategy;
use mesos_gpu_enforce::mps::{MpsConfig, MpsDaemon, MpsDaemons, MpsError, Restart};
use mesos_gpu_grant::ShareAccess;
use mesos_gpu_health::Limitation;
use mesos_gpu_placement::sharing::{
    Among, PlacedShare, Placement, PlacementError, ShareLimits, SharingMode, SharingPlan,
    SharingSpec, Wanted,
};
use mesos_gpu_pool::{Liveness, PoolState};

/// How a node shares GPUs.
#[derive(Debug, Clone)]
pub struct SharingConfig {
    /// Which GPUs are shared, how many ways, and the enforcement mode.
    pub spec: SharingSpec,
    /// The MPS daemons' program and directories (used under `mps`).
    pub mps: MpsConfig,
}

/// The resolved split, and the MPS daemons this process knows.
#[derive(Debug)]
pub(crate) struct Sharing {
    pub(crate) plan: SharingPlan,
    daemons: Option<Mutex<MpsDaemons>>,
    /// A dry run's MPS configuration: pipe directories are named, no daemon is started.
    dry_pipes: Option<MpsConfig>,
}

impl Sharing {
    /// Resolves `config` against the advertised GPUs. Sharing needs the node's pool: shares of
    /// one GPU are handed out by several processes.
    pub(crate) fn new(
        config: &SharingConfig,
        inventory: &mesos_gpu_node::inventory::Inventory,
        advertised: &[u32],
        has_pool: bool,
        dry_run: bool,
    ) -> Result<Sharing, LifecycleError> {
        if !has_pool {
            return Err(LifecycleError::SharingSetup {
                why: "GPU sharing needs the node's GPU pool (a pool directory)".into(),
            });
        }
        let plan = config
            .spec
            .resolve(inventory, advertised)
            .map_err(|e| LifecycleError::SharingSetup { why: e.to_string() })?;
        let mps = plan.has(SharingMode::Mps);
        let daemons = (mps && !dry_run).then(|| Mutex::new(MpsDaemons::new(config.mps.clone())));
        let dry_pipes = (mps && dry_run).then(|| config.mps.clone());
        tracing::info!(
            shared = ?plan.shared.iter().map(|g| (g.index, g.replicas, g.mode.as_str())).collect::<Vec<_>>(),
            whole = ?plan.whole,
            units = plan.units(),
            "GPU sharing"
        );
        Ok(Sharing {
            plan,
            daemons,
            dry_pipes,
        })
    }

    /// How many MPS daemons this process knows (0 under time-slicing).
    pub(crate) fn daemons(&self) -> usize {
        self.daemons
            .as_ref()
            .map_or(0, |d| d.lock().unwrap_or_else(|p| p.into_inner()).count())
    }

    /// True when GPU `index` is shared (the allocator does not manage it).
    pub(crate) fn is_shared(&self, index: u32) -> bool {
        self.plan.shared.iter().any(|g| g.index == index)
    }

    /// True when the GPU with this UUID is shared under MPS now.
    fn is_mps(&self, uuid: &str) -> bool {
        self.plan
            .shared_gpu(uuid)
            .is_some_and(|g| g.mode == SharingMode::Mps)
    }

    /// True when the shared unit with this UUID is a MIG device.
    fn is_mig(&self, uuid: &str) -> bool {
        self.plan
            .shared_gpu(uuid)
            .is_some_and(|g| g.mig_parent.is_some())
    }

    /// Says, once per GPU, which running shares keep a mode the operator has since changed
    /// (they run on as they were until they end; the GPU takes no new share meanwhile).
    pub(crate) fn report_mode_changes(&self, pool: &PoolState) {
        for (owner, share) in &pool.shares {
            let Some(gpu) = self.plan.shared_gpu(&share.grant.uuid) else {
                continue;
            };
            if gpu.mode != share.grant.mode {
                tracing::warn!(
                    gpu = gpu.index, uuid = %gpu.uuid, %owner, running = %share.grant.mode, configured = %gpu.mode,
                    "a running share keeps the mode it began with until it ends; the GPU takes new shares (under its new mode) only then"
                );
            }
        }
    }

    /// Stops the recorded daemons of GPUs that left sharing (the operator's spec changed) and
    /// no share holds; takes over the daemons the pool records for this node's shared GPUs
    /// (after a restart, or those another process started), restarts the dead ones, and records
    /// them back; returns what was restarted. Nothing under time-slicing.
    fn supervise(&self, pool: &mut PoolState) -> Vec<Restart> {
        let Some(daemons) = &self.daemons else {
            return Vec::new();
        };
        let mut daemons = daemons.lock().unwrap_or_else(|p| p.into_inner());
        // A GPU whose MPS shares still run keeps its daemon, whatever its mode now.
        let mps_held = |gpu: &str| {
            pool.shares
                .values()
                .any(|s| s.grant.uuid == gpu && s.grant.mode == SharingMode::Mps)
        };
        // Daemons that no share holds of GPUs this node no longer shares under MPS, and of MIG
        // devices (a MIG device's daemon runs only while a share of it does: a process on the
        // device would keep the operator from changing its GPU's MIG layout): stopped.
        let leaving: Vec<String> = pool
            .mps
            .keys()
            .filter(|gpu| !self.is_mps(gpu) || self.is_mig(gpu))
            .filter(|gpu| !pool.shares.values().any(|s| &s.grant.uuid == *gpu))
            .cloned()
            .collect();
        for gpu in leaving {
            let Some(record) = pool.mps.remove(&gpu) else {
                continue;
            };
            let why = if self.is_mps(&gpu) {
                "the MIG device's last share ended"
            } else {
                "the GPU left sharing"
            };
            match daemons.retire(record.daemon, record.per_replica) {
                Ok(()) => {
                    tracing::info!(gpu = %gpu, "{why}; its MPS daemon is stopped")
                }
                Err(e) => {
                    tracing::error!(gpu = %gpu, error = %e, "{why}, but its MPS daemon could not be stopped")
                }
            }
        }
        let recorded: Vec<(MpsDaemon, ShareLimits)> = pool
            .mps
            .values()
            .filter(|r| self.is_mps(&r.daemon.gpu) || mps_held(&r.daemon.gpu))
            .filter(|r| {
                daemons
                    .get(&r.daemon.gpu)
                    .is_none_or(|known| known.process != r.daemon.process)
            })
            .map(|r| (r.daemon.clone(), r.per_replica))
            .collect();
        // A daemon this process knew died and another process already started the GPU's next
        // one: the owners here lost their server all the same.
        let mut replaced = Vec::new();
        for (daemon, _) in &recorded {
            if let Some(known) = daemons.get(&daemon.gpu)
                && let Liveness::Dead(why) = daemons.liveness(known)
            {
                replaced.push(Restart {
                    gpu: daemon.gpu.clone(),
                    why: format!("{why}; another process started it again"),
                    outcome: Ok(daemon.clone()),
                });
            }
        }
        let mut restarts = daemons.adopt(recorded);
        restarts.extend(replaced);
        for restart in &restarts {
            if let Ok(daemon) = &restart.outcome
                && let Some(record) = pool.mps.get_mut(&restart.gpu)
            {
                record.daemon = daemon.clone();
            }
        }
        restarts
    }

    /// The pipe directory a share of `grant` is given: its GPU's daemon's ([`Sharing::daemon`]),
    /// only named in a dry run; `None` for a time-slicing share.
    fn pipe_dir(
        &self,
        grant: &PlacedShare,
        pool: &mut PoolState,
    ) -> Result<Option<std::path::PathBuf>, MpsError> {
        if let Some(config) = &self.dry_pipes {
            return Ok((grant.mode == SharingMode::Mps).then(|| config.pipe_dir(&grant.uuid)));
        }
        Ok(self.daemon(grant, pool)?.map(|d| d.pipe_dir))
    }

    /// Makes sure the daemon of `grant`'s GPU runs (an MPS share), adopting the pool's record
    /// of it first; records it back in `pool`. `None` for a time-slicing share.
    fn daemon(
        &self,
        grant: &PlacedShare,
        pool: &mut PoolState,
    ) -> Result<Option<MpsDaemon>, MpsError> {
        let Some(daemons) = &self
            .daemons
            .as_ref()
            .filter(|_| grant.mode == SharingMode::Mps)
        else {
            return Ok(None);
        };
        let mut daemons = daemons.lock().unwrap_or_else(|p| p.into_inner());
        if daemons.get(&grant.uuid).is_none()
            && let Some(record) = pool.mps.get(&grant.uuid)
        {
            for restart in daemons.adopt([(record.daemon.clone(), record.per_replica)]) {
                restart.outcome?;
            }
        }
        let gpu = self.plan.shared_gpu(&grant.uuid);
        let per_replica = ShareLimits::of(1, grant.replicas, gpu.map_or(0, |g| g.memory_total));
        let daemon = daemons.ensure(&grant.uuid, per_replica)?.clone();
        pool.mps.insert(
            grant.uuid.clone(),
            mesos_gpu_pool::MpsRecord {
                daemon: daemon.clone(),
                per_replica,
            },
        );
        Ok(Some(daemon))
    }
}

/// Whether a request is served with whole GPUs or a share.
enum Kind {
    /// k whole GPUs from the allocator.
    Whole(u32),
    /// A share of `k` units of one shared GPU.
    Share(u32),
}

impl Isolator {
    /// What a top-level container asking `gpus` gets: whole GPUs without sharing; with it, a
    /// share (of a unit of `among`) for 1 ≤ k ≤ the largest R, whole GPUs above (refused when
    /// the node has fewer). `wanted` whole GPUs are whole GPUs; a share mode no GPU is shared
    /// under is refused.
    fn request_kind(
        &self,
        state: &mut super::state::State,
        id: &ContainerId,
        gpus: f64,
        step: &'static str,
        wanted: Wanted,
        among: Among,
    ) -> Result<Kind, LifecycleError> {
        let alloc = |source| LifecycleError::Allocation {
            container: id.clone(),
            step,
            source,
        };
        let no_mode = |modes: String| LifecycleError::ShareMode {
            container: id.clone(),
            step,
            placement: Box::new(PlacementError::NoSuchMode {
                owner: id.to_string(),
                wanted,
                modes,
            }),
        };
        let Some(sharing) = &self.sharing else {
            if let Wanted::Mode(_) = wanted {
                return Err(no_mode("none".to_owned()));
            }
            return Ok(Kind::Whole(
                state.allocator.request(gpus).map_err(alloc)?.count(),
            ));
        };
        let k = mesos_gpu_placement::allocator::GpuRequest::from_scalar(gpus, sharing.plan.units())
            .map_err(alloc)?
            .count();
        if let Wanted::Mode(mode) = wanted
            && !sharing.plan.has(mode)
        {
            let modes: Vec<String> = sharing
                .plan
                .shared
                .iter()
                .map(|g| format!("{} {}", g.index, g.mode))
                .collect();
            return Err(no_mode(if modes.is_empty() {
                "none".to_owned()
            } else {
                modes.join(", ")
            }));
        }
        if wanted != Wanted::Whole && sharing.plan.takes_as_share_in(k, among) {
            return Ok(Kind::Share(k));
        }
        // Valid in units, but more than one GPU's share and more than the whole GPUs.
        if k > state.allocator.offered() {
            return Err(LifecycleError::ShareRefused {
                container: id.clone(),
                step,
                placement: Box::new(PlacementError::TooLarge {
                    owner: id.to_string(),
                    asked: k,
                    largest: sharing.plan.largest_in(among),
                }),
                whole: self.shortage(state, k),
            });
        }
        Ok(Kind::Whole(k))
    }

    /// What `id` asking `gpus` takes: whole GPUs from the allocator, or a share of one shared
    /// GPU (then the set is empty); a share no shared GPU has room for takes whole GPUs when
    /// that many are free (unless it asked for one mode), and is refused with both reasons when
    /// not.
    pub(crate) fn take_units(
        &self,
        state: &mut super::state::State,
        id: &ContainerId,
        gpus: f64,
        step: &'static str,
        wanted: Wanted,
        among: Among,
    ) -> Result<(mesos_gpu_placement::allocator::GpuSet, Option<PlacedShare>), LifecycleError> {
        match self.request_kind(state, id, gpus, step, wanted, among)? {
            Kind::Whole(count) => Ok((self.allocate_shared(state, id, count, step)?, None)),
            Kind::Share(k) => match self.place_share(state, id, k, wanted, among)? {
                Ok(grant) => Ok((mesos_gpu_placement::allocator::GpuSet::EMPTY, Some(grant))),
                Err(placement) if wanted != Wanted::Any => Err(LifecycleError::ShareRefused {
                    container: id.clone(),
                    step,
                    placement: Box::new(placement),
                    whole: self.shortage(state, k),
                }),
                Err(placement) => match self.allocate_shared(state, id, k, step) {
                    Ok(set) => Ok((set, None)),
                    Err(LifecycleError::Refused { shortage, .. }) => {
                        Err(LifecycleError::ShareRefused {
                            container: id.clone(),
                            step,
                            placement: Box::new(placement),
                            whole: shortage,
                        })
                    }
                    Err(e) => Err(e),
                },
            },
        }
    }

    /// A share of `k` units of a unit of `among` for `id` when the request is served with one
    /// (MIG nodes, [`super::mig`]); `None` when it takes whole units: no sharing, whole units
    /// wanted, k above the largest R among them, or (asking any share) none has room. Asking one
    /// mode, it is refused when none has room.
    pub(crate) fn try_share(
        &self,
        state: &mut super::state::State,
        id: &ContainerId,
        k: u32,
        step: &'static str,
        wanted: Wanted,
        among: Among,
    ) -> Result<Option<PlacedShare>, LifecycleError> {
        let shares = self
            .sharing
            .as_ref()
            .is_some_and(|s| s.plan.takes_as_share_in(k, among));
        if wanted == Wanted::Whole || !shares {
            if let Wanted::Mode(_) = wanted {
                return self
                    .request_kind(state, id, f64::from(k), step, wanted, among)
                    .map(|_| None);
            }
            return Ok(None);
        }
        match self.place_share(state, id, k, wanted, among)? {
            Ok(grant) => Ok(Some(grant)),
            Err(placement) if wanted != Wanted::Any => Err(LifecycleError::ShareRefused {
                container: id.clone(),
                step,
                placement: Box::new(placement),
                whole: self.shortage(state, k),
            }),
            Err(_) => Ok(None),
        }
    }

    /// Places a share of `k` units of a unit of `among` for `id` among the shares the pool
    /// records (and this isolator's own, published at its next save); the placement's refusal
    /// when no shared GPU has room (the caller then tries whole GPUs).
    fn place_share(
        &self,
        state: &mut super::state::State,
        id: &ContainerId,
        k: u32,
        wanted: Wanted,
        among: Among,
    ) -> Result<Result<PlacedShare, PlacementError>, LifecycleError> {
        let Some(sharing) = &self.sharing else {
            return Err(LifecycleError::SharingSetup {
                why: "no GPU is shared on this node".into(),
            });
        };
        let slot = state.tx.borrow();
        let Some(tx) = slot.as_ref() else {
            return Err(LifecycleError::SharingSetup {
                why: "the node's GPU pool is not locked".into(),
            });
        };
        let unnamed: u32 = tx.state.unnamed().values().sum();
        if unnamed > 0 {
            // Any shared GPU may be one a live owner holds without its record naming it.
            return Ok(Err(PlacementError::NoRoom {
                owner: id.to_string(),
                asked: k,
                free: format!(
                    "none while live owners hold {unnamed} GPU(s) their pool records do not name"
                ),
            }));
        }
        let mut book = mesos_gpu_pool::shares::book(&tx.state, &sharing.plan);
        // Shares this isolator holds are published at its next save; count them now.
        let mine = state
            .containers
            .iter()
            .filter_map(|(other, c)| Some((other, c.share.as_ref()?)))
            .chain(state.docker_shares.iter());
        for (other, grant) in mine {
            book.record(other.as_str(), &grant.uuid, grant.units, grant.mode);
        }
        Ok(book.place_in(id.as_str(), k, Placement::Pack, wanted, among))
    }

    /// What a owner of `grant` is launched with: the share's variables, and under `mps` the
    /// daemon of its GPU (made sure of) and the client environment for its limits.
    pub(crate) fn share_access(
        &self,
        state: &super::state::State,
        id: &ContainerId,
        grant: &PlacedShare,
    ) -> Result<ShareAccess, LifecycleError> {
        let mut slot = state.tx.borrow_mut();
        let (Some(sharing), Some(tx)) = (&self.sharing, slot.as_mut()) else {
            return Err(LifecycleError::SharingSetup {
                why: "a share outside a sharing node's pool transaction".into(),
            });
        };
        let pipe_dir =
            sharing
                .pipe_dir(grant, &mut tx.state)
                .map_err(|source| LifecycleError::Mps {
                    container: id.clone(),
                    gpu: grant.uuid.clone(),
                    source: Box::new(source),
                })?;
        Ok(ShareAccess::new(grant.clone(), pipe_dir))
    }
}

impl Isolator {
    /// `update` of a container holding a share: the same number of units changes nothing (Mesos
    /// calls `update` whenever any resource of the container changes); another is refused. A
    /// share of a MIG device under the mixed strategy is held in its `mig-<profile>` scalar, so
    /// its `gpus` stay 0.
    pub(crate) fn update_share(
        &self,
        id: &ContainerId,
        grant: &PlacedShare,
        gpus: f64,
    ) -> Result<(), LifecycleError> {
        let units = self
            .sharing
            .as_ref()
            .map_or(grant.replicas, |s| s.plan.units());
        let in_gpus = if grant.is_mig() && self.mig.strategy == MigStrategy::Mixed {
            0
        } else {
            grant.units
        };
        let asked =
            mesos_gpu_placement::allocator::GpuRequest::from_scalar(gpus, units).map(|r| r.count());
        if asked.as_ref().ok() == Some(&in_gpus) {
            return Ok(());
        }
        Err(LifecycleError::ShareResize {
            container: id.clone(),
            gpu: grant.uuid.clone(),
            units: grant.units,
            replicas: grant.replicas,
            asked: gpus,
        })
    }
}

/// A shared GPU whose MPS daemon was found dead and started again (or could not be).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MpsRestart {
    /// The GPU's UUID.
    pub gpu: String,
    /// Why the old daemon was taken for dead.
    pub why: String,
    /// `None` when the new daemon runs; else why it could not be started.
    pub failed: Option<String>,
    /// The containers holding a share of the GPU, now limited: their clients lost their
    /// server.
    pub owners: Vec<ContainerId>,
}

impl Isolator {
    /// True when shares are enforced with MPS daemons, which [`Isolator::supervise_mps`] keeps
    /// running.
    pub fn supervises_mps(&self) -> bool {
        self.sharing.as_ref().is_some_and(|s| s.daemons.is_some())
    }

    /// Under `mps`: restarts every shared GPU's daemon found dead (those the pool records for
    /// the node included) and limits the owners of its shares (their `watch` resolves naming
    /// the GPU and the cause: a client's CUDA context does not survive its server). Call it
    /// periodically (the module does, every few seconds) and after `recover`.
    pub fn supervise_mps(&self) -> Result<Vec<MpsRestart>, LifecycleError> {
        let Some(sharing) = self.sharing.as_ref().filter(|s| s.daemons.is_some()) else {
            return Ok(Vec::new());
        };
        let state = self.lock()?;
        let restarts = {
            let mut slot = state.tx.borrow_mut();
            let Some(tx) = slot.as_mut() else {
                return Ok(Vec::new());
            };
            let before = tx.state.mps.len();
            let restarts = sharing.supervise(&mut tx.state);
            if !restarts.is_empty() || tx.state.mps.len() != before {
                tx.commit().map_err(|source| LifecycleError::Pool {
                    step: "supervise the MPS daemons",
                    source,
                })?;
            }
            restarts
        };
        let mut out = Vec::new();
        for restart in restarts {
            let owners: Vec<ContainerId> = state
                .containers
                .iter()
                .filter(|(_, c)| c.share.as_ref().is_some_and(|g| g.uuid == restart.gpu))
                .map(|(id, _)| id.clone())
                .collect();
            let failed = restart.outcome.as_ref().err().map(ToString::to_string);
            let index = sharing
                .plan
                .shared_gpu(&restart.gpu)
                .map(|g| g.index)
                .or_else(|| self.inventory.by_uuid(&restart.gpu).map(|g| g.index))
                .unwrap_or(0);
            let message = format!(
                "the MPS control daemon of GPU {index} ({}) died ({}); {}: the task's CUDA clients lost their server",
                restart.gpu,
                restart.why,
                failed.as_deref().map_or_else(
                    || "it was started again".to_owned(),
                    |e| format!("it could not be started again: {e}")
                ),
            );
            for owner in &owners {
                tracing::warn!(container = %owner, gpu = %restart.gpu, why = %restart.why, "container limited: its GPU's MPS daemon died");
                self.limitations.resolve(Limitation {
                    container: owner.to_string(),
                    gpu: index,
                    uuid: restart.gpu.clone(),
                    message: message.clone(),
                });
            }
            out.push(MpsRestart {
                gpu: restart.gpu,
                why: restart.why,
                failed,
                owners,
            });
        }
        Ok(out)
    }
}
