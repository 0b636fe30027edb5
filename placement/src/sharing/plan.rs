//! Which GPUs are shared, with how many replicas each, and how each GPU's shares are enforced.
//!
//! The operator's replica spec (module parameter `gpu_replicas`, cli `--gpu-replicas`) is a
//! comma list: a bare number R shares every advertised GPU R ways; `SEL=R` (SEL an NVML index,
//! a range of indices such as `4-5`, or a GPU UUID) sets those GPUs, overriding the bare number.
//! R = 1 keeps a GPU whole. `4,3=1` shares every GPU four ways but GPU 3, which stays whole. R
//! is at most [`MAX_REPLICAS`], the MPS client limit on Volta and later
//! (`nvidia-cuda-mps-control(1)`: 48 clients per GPU on SM 7.0+).
//!
//! The mode spec (`gpu_sharing`, `--gpu-sharing`, [`ModeSpec`]) has the same form with a mode
//! instead of R: `mps,4-5=time-slicing,6-7=none` enforces shares with MPS on every GPU but 4-5
//! (time-slicing) and keeps 6-7 whole (`none`, exclusive), so exclusive, time-sliced and MPS
//! GPUs serve side by side on one node (NVIDIA's device plugin allows one mode per node).
//!
//! A GPU in MIG mode is selected by its index or GPU UUID like any other; its entries apply to
//! each of its MIG devices. Under `mps` with R > 1 every MIG device of the GPU is offered as R
//! units, with one MPS control daemon per MIG device (NVIDIA runs MPS on top of MIG, one
//! daemon per MIG device; `docs/reference/mig.md` §5). R is at most the device's client limit,
//! 48 lowered in proportion to its compute instance's size ([`mig_max_clients`]).
//! `time-slicing` on a GPU in MIG mode is refused ([`SharingError::MigTimeSlicing`]).

use std::fmt;
use std::str::FromStr;

use mesos_gpu_node::inventory::{Gpu, Inventory, MigDevice};

use crate::mig::MigKind;

/// The most replicas one GPU may have (MPS serves at most 48 clients per GPU on SM 7.0+).
pub const MAX_REPLICAS: u32 = 48;
/// The oldest compute capability MPS is accepted on (Volta: per-client limits).
pub const MPS_MIN_COMPUTE_CAPABILITY: (u32, u32) = (7, 0);
/// The compute slices of a whole GPU in MIG mode that [`mig_max_clients`] divides by: 7 on the
/// A100, H100, H200 and B200 (MIG user guide, "Supported GPUs"); GPUs with fewer (A30: 4) get a
/// lower limit than NVIDIA's, never a higher one.
pub const MIG_GPU_COMPUTE_SLICES: u32 = 7;

/// The most MPS clients (so the largest R) a MIG device serves: [`MAX_REPLICAS`] lowered in
/// proportion to its compute instance's size (MIG user guide, "CUDA Concurrency Mechanisms":
/// "the maximum number of clients (48) is lowered proportionally to the Compute Instance
/// size"), i.e. ⌊48·c/7⌋ for a compute instance of c slices: 6 for 1g, 13 for 2g, 20 for 3g,
/// 27 for 4g, 48 for 7g.
pub fn mig_max_clients(device: &MigDevice) -> u32 {
    (MAX_REPLICAS * device.compute_instance_slices.min(MIG_GPU_COMPUTE_SLICES)
        / MIG_GPU_COMPUTE_SLICES)
        .max(1)
}

/// Which shared units a request may take its share of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Among {
    /// Any shared GPU or MIG device (`gpus` on a node without MIG, or under the single MIG
    /// strategy, where every MIG device counts as `gpus`).
    All,
    /// Shared GPUs not in MIG mode (`gpus` under the mixed MIG strategy).
    Gpus,
    /// Shared MIG devices of this kind (a `mig-<profile>` request under the mixed strategy).
    Mig(MigKind),
}

/// How the shares of a GPU are enforced.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "kebab-case")]
pub enum SharingMode {
    /// Shares are only accounted: no memory or compute isolation between owners.
    TimeSlicing,
    /// One MPS control daemon per shared GPU; each owner gets its k/R thread and memory limits.
    Mps,
}

impl SharingMode {
    /// The name used in flags, attributes and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            SharingMode::TimeSlicing => "time-slicing",
            SharingMode::Mps => "mps",
        }
    }
}

impl fmt::Display for SharingMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for SharingMode {
    type Err = SharingError;

    fn from_str(s: &str) -> Result<Self, SharingError> {
        match s.trim() {
            "time-slicing" => Ok(SharingMode::TimeSlicing),
            "mps" => Ok(SharingMode::Mps),
            other => Err(SharingError::Mode {
                value: other.to_owned(),
            }),
        }
    }
}

/// What a GPU's mode entry says: shared in a mode, or kept whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModeChoice {
    /// Shared (when its replica count is above 1), enforced this way.
    Shared(SharingMode),
    /// Kept whole (`none`): exclusive to one task whatever its replica count.
    Exclusive,
}

impl FromStr for ModeChoice {
    type Err = SharingError;

    fn from_str(s: &str) -> Result<Self, SharingError> {
        match s.trim() {
            "none" | "exclusive" => Ok(ModeChoice::Exclusive),
            other => other.parse().map(ModeChoice::Shared),
        }
    }
}

/// The operator's mode per GPU (`gpu_sharing`): a default and `SEL=MODE` entries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModeSpec {
    default: ModeChoice,
    per_gpu: Vec<(Selector, ModeChoice)>,
}

impl Default for ModeSpec {
    /// `time-slicing` for every GPU.
    fn default() -> ModeSpec {
        ModeSpec::uniform(SharingMode::TimeSlicing)
    }
}

impl ModeSpec {
    /// One mode for every GPU.
    pub fn uniform(mode: SharingMode) -> ModeSpec {
        ModeSpec {
            default: ModeChoice::Shared(mode),
            per_gpu: Vec::new(),
        }
    }

    /// The choice for `gpu`: its entry's, else the default.
    fn choice(&self, gpu: &Gpu) -> ModeChoice {
        self.per_gpu
            .iter()
            .find(|(s, _)| s.matches(gpu))
            .map_or(self.default, |(_, c)| *c)
    }
}

impl FromStr for ModeSpec {
    type Err = SharingError;

    /// `MODE` sets the default (`time-slicing` when none is given); `SEL=MODE` sets GPUs.
    fn from_str(spec: &str) -> Result<ModeSpec, SharingError> {
        let mut default = None;
        let mut per_gpu: Vec<(Selector, ModeChoice)> = Vec::new();
        for entry in spec.split(',').map(str::trim) {
            let bad = || SharingError::ModeEntry {
                entry: entry.to_owned(),
            };
            match entry.split_once('=') {
                None => {
                    let choice: ModeChoice = entry.parse().map_err(|_| bad())?;
                    if default.replace(choice).is_some() {
                        return Err(SharingError::Duplicate {
                            what: "the default mode".into(),
                        });
                    }
                }
                Some((sel, mode)) => {
                    let selector = Selector::parse(sel).ok_or_else(bad)?;
                    let choice: ModeChoice = mode.parse().map_err(|_| bad())?;
                    if per_gpu.iter().any(|(s, _)| s.overlaps(&selector)) {
                        return Err(SharingError::Duplicate {
                            what: format!("the mode of GPU {}", sel.trim()),
                        });
                    }
                    per_gpu.push((selector, choice));
                }
            }
        }
        Ok(ModeSpec {
            default: default.unwrap_or(ModeChoice::Shared(SharingMode::TimeSlicing)),
            per_gpu,
        })
    }
}

/// Why a sharing spec cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SharingError {
    /// The mode is not one we know.
    #[error("GPU sharing mode {value:?} is not one of: time-slicing, mps")]
    Mode {
        /// The value given.
        value: String,
    },
    /// An entry of the mode spec does not parse.
    #[error(
        "GPU sharing entry {entry:?}: expected MODE or SEL=MODE (MODE one of time-slicing, mps, none; SEL an NVML index, a range of indices such as 4-5, or a GPU UUID), e.g. `mps` or `mps,4-5=time-slicing,6-7=none`"
    )]
    ModeEntry {
        /// The entry.
        entry: String,
    },
    /// An entry of the replica spec does not parse.
    #[error(
        "GPU replica entry {entry:?}: expected R or SEL=R (SEL an NVML index, a range of indices such as 4-5, or a GPU UUID; R a whole number 1-{MAX_REPLICAS}), e.g. `4` or `4,3=1`"
    )]
    Entry {
        /// The entry.
        entry: String,
    },
    /// Two entries set one GPU, or two bare numbers are given.
    #[error("GPU replica spec sets {what} twice")]
    Duplicate {
        /// The GPU selector, or `the default`.
        what: String,
    },
    /// A selector names no advertised GPU.
    #[error(
        "GPU sharing spec names GPU {selector:?}, which is not advertised (advertised: {known})"
    )]
    UnknownGpu {
        /// The selector.
        selector: String,
        /// The advertised GPUs, `index (uuid)` comma-separated, or `none`.
        known: String,
    },
    /// MPS on a GPU older than Volta.
    #[error(
        "GPU {index} ({uuid}) has compute capability {capability}; MPS sharing needs 7.0 (Volta) or later: share it with time-slicing ({index}=time-slicing in --gpu-sharing) or keep it whole ({index}=none)"
    )]
    MpsTooOld {
        /// NVML index.
        index: u32,
        /// UUID.
        uuid: String,
        /// `major.minor`, or `unknown`.
        capability: String,
    },
    /// Time-slicing on a GPU in MIG mode: its MIG devices are shared only under MPS.
    #[error(
        "GPU {index} ({uuid}) is in MIG mode: its MIG devices are shared only with MPS, which limits each owner's threads and memory within the device; time-slicing would only count owners (set {index}=mps or {index}=none in --gpu-sharing)"
    )]
    MigTimeSlicing {
        /// NVML index of the GPU in MIG mode.
        index: u32,
        /// Its UUID.
        uuid: String,
    },
    /// More replicas than a MIG device's MPS client limit.
    #[error(
        "MIG device {uuid} ({profile}, {slices} of {MIG_GPU_COMPUTE_SLICES} compute slices) of GPU {index} serves at most {max} MPS clients, fewer than {replicas} replicas: give GPU {index} at most {max} replicas ({index}={max} in --gpu-replicas)"
    )]
    MigClients {
        /// The MIG device's UUID.
        uuid: String,
        /// Its profile name.
        profile: String,
        /// Its compute instance's slices.
        slices: u32,
        /// NVML index of its parent.
        index: u32,
        /// The replicas asked for.
        replicas: u32,
        /// Its client limit ([`mig_max_clients`]).
        max: u32,
    },
}

/// A GPU selector of a spec.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Selector {
    Index(u32),
    /// Indices `first` to `last`, both included.
    Range(u32, u32),
    Uuid(String),
}

impl Selector {
    /// `3`, `4-5` or `GPU-…`/`MIG-…`; `None` for anything else.
    fn parse(text: &str) -> Option<Selector> {
        let text = text.trim();
        if let Ok(i) = text.parse::<u32>() {
            return Some(Selector::Index(i));
        }
        if let Some((a, b)) = text.split_once('-')
            && let (Ok(a), Ok(b)) = (a.parse::<u32>(), b.parse::<u32>())
        {
            return (a <= b).then_some(Selector::Range(a, b));
        }
        (text.starts_with("GPU-") || text.starts_with("MIG-"))
            .then(|| Selector::Uuid(text.to_owned()))
    }

    fn matches(&self, gpu: &Gpu) -> bool {
        match self {
            Selector::Index(i) => gpu.index == *i,
            Selector::Range(a, b) => (*a..=*b).contains(&gpu.index),
            Selector::Uuid(u) => gpu.uuid.eq_ignore_ascii_case(u),
        }
    }

    /// True when both may name one GPU (indices overlap, or the same UUID).
    fn overlaps(&self, other: &Selector) -> bool {
        let span = |s: &Selector| match s {
            Selector::Index(i) => Some((*i, *i)),
            Selector::Range(a, b) => Some((*a, *b)),
            Selector::Uuid(_) => None,
        };
        match (span(self), span(other)) {
            (Some((a, b)), Some((c, d))) => a <= d && c <= b,
            _ => self == other,
        }
    }

    fn text(&self) -> String {
        match self {
            Selector::Index(i) => i.to_string(),
            Selector::Range(a, b) => format!("{a}-{b}"),
            Selector::Uuid(u) => u.clone(),
        }
    }
}

/// The operator's replica spec and modes, parsed but not yet checked against a node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharingSpec {
    modes: ModeSpec,
    default: Option<u32>,
    per_gpu: Vec<(Selector, u32)>,
}

fn replicas(text: &str, entry: &str) -> Result<u32, SharingError> {
    match text.trim().parse::<u32>() {
        Ok(r) if (1..=MAX_REPLICAS).contains(&r) => Ok(r),
        _ => Err(SharingError::Entry {
            entry: entry.to_owned(),
        }),
    }
}

impl SharingSpec {
    /// Parses a replica spec (`4`, `0=4,1=2`, `4,3=1`, `4-7=2`, `GPU-…=2`) with the GPUs'
    /// modes.
    pub fn parse(spec: &str, modes: ModeSpec) -> Result<SharingSpec, SharingError> {
        let mut out = SharingSpec {
            modes,
            default: None,
            per_gpu: Vec::new(),
        };
        for entry in spec.split(',').map(str::trim) {
            let bad = || SharingError::Entry {
                entry: entry.to_owned(),
            };
            match entry.split_once('=') {
                None => {
                    let r = replicas(entry, entry)?;
                    if out.default.replace(r).is_some() {
                        return Err(SharingError::Duplicate {
                            what: "the default".into(),
                        });
                    }
                }
                Some((sel, r)) => {
                    let sel = sel.trim();
                    let selector = Selector::parse(sel).ok_or_else(bad)?;
                    let r = replicas(r, entry)?;
                    if out.per_gpu.iter().any(|(s, _)| s.overlaps(&selector)) {
                        return Err(SharingError::Duplicate {
                            what: format!("GPU {sel}"),
                        });
                    }
                    out.per_gpu.push((selector, r));
                }
            }
        }
        Ok(out)
    }

    /// The modes per GPU.
    pub fn modes(&self) -> &ModeSpec {
        &self.modes
    }

    /// Checks the spec against the advertised GPUs (`advertised`: NVML indices) of `inventory`
    /// and splits them into shared and whole GPUs.
    pub fn resolve(
        &self,
        inventory: &Inventory,
        advertised: &[u32],
    ) -> Result<SharingPlan, SharingError> {
        let gpus: Vec<&Gpu> = advertised
            .iter()
            .filter_map(|i| inventory.by_index(*i))
            .filter(|g| !inventory.mig.is_enabled(g.index))
            .collect();
        let mig_parents: Vec<&Gpu> = inventory
            .gpus
            .iter()
            .filter(|g| inventory.mig.is_enabled(g.index))
            .collect();
        let known: Vec<&Gpu> = gpus.iter().chain(&mig_parents).copied().collect();
        let selectors = self
            .per_gpu
            .iter()
            .map(|(s, _)| s)
            .chain(self.modes.per_gpu.iter().map(|(s, _)| s));
        for selector in selectors {
            if !known.iter().any(|g| selector.matches(g)) {
                let known = known
                    .iter()
                    .map(|g| format!("{} ({})", g.index, g.uuid))
                    .collect::<Vec<_>>()
                    .join(", ");
                return Err(SharingError::UnknownGpu {
                    selector: selector.text(),
                    known: if known.is_empty() {
                        "none".into()
                    } else {
                        known
                    },
                });
            }
        }
        let mut plan = SharingPlan {
            shared: Vec::new(),
            whole: Vec::new(),
        };
        for gpu in gpus {
            let r = self.replicas_of(gpu);
            let mode = match self.modes.choice(gpu) {
                ModeChoice::Shared(mode) if r > 1 => mode,
                _ => {
                    plan.whole.push(gpu.index);
                    continue;
                }
            };
            if mode == SharingMode::Mps {
                check_mps(gpu)?;
            }
            plan.shared.push(SharedGpu {
                index: gpu.index,
                uuid: gpu.uuid.clone(),
                replicas: r,
                memory_total: gpu.memory_total,
                mode,
                mig_parent: None,
                mig_kind: None,
            });
        }
        for parent in mig_parents {
            self.share_mig_devices(inventory, parent, &mut plan)?;
        }
        Ok(plan)
    }

    /// The replica count of `gpu`: its entry's, else the bare number, else 1.
    fn replicas_of(&self, gpu: &Gpu) -> u32 {
        self.per_gpu
            .iter()
            .find(|(s, _)| s.matches(gpu))
            .map(|(_, r)| *r)
            .or(self.default)
            .unwrap_or(1)
    }

    /// Adds the MIG devices of `parent` (a GPU in MIG mode) to `plan` when its mode is `mps`
    /// and R > 1: R units each, within its client limit. Devices the driver gives no capability
    /// nodes for cannot be isolated and stay out, as they do whole.
    fn share_mig_devices(
        &self,
        inventory: &Inventory,
        parent: &Gpu,
        plan: &mut SharingPlan,
    ) -> Result<(), SharingError> {
        let r = self.replicas_of(parent);
        match self.modes.choice(parent) {
            ModeChoice::Shared(_) if r <= 1 => return Ok(()),
            ModeChoice::Exclusive => return Ok(()),
            ModeChoice::Shared(SharingMode::TimeSlicing) => {
                return Err(SharingError::MigTimeSlicing {
                    index: parent.index,
                    uuid: parent.uuid.clone(),
                });
            }
            ModeChoice::Shared(SharingMode::Mps) => check_mps(parent)?,
        }
        for device in inventory
            .mig
            .of_parent(parent.index)
            .filter(|d| d.caps.is_some())
        {
            let max = mig_max_clients(device);
            if r > max {
                return Err(SharingError::MigClients {
                    uuid: device.uuid.clone(),
                    profile: device.profile_name.clone(),
                    slices: device.compute_instance_slices,
                    index: parent.index,
                    replicas: r,
                    max,
                });
            }
            plan.shared.push(SharedGpu {
                index: parent.index,
                uuid: device.uuid.clone(),
                replicas: r,
                memory_total: device.memory_total,
                mode: SharingMode::Mps,
                mig_parent: Some(parent.uuid.clone()),
                mig_kind: MigKind::of(device),
            });
        }
        Ok(())
    }
}

fn check_mps(gpu: &Gpu) -> Result<(), SharingError> {
    match gpu.compute_capability {
        Some(cc) if cc >= MPS_MIN_COMPUTE_CAPABILITY => Ok(()),
        other => Err(SharingError::MpsTooOld {
            index: gpu.index,
            uuid: gpu.uuid.clone(),
            capability: other.map_or_else(|| "unknown".into(), |(a, b)| format!("{a}.{b}")),
        }),
    }
}

/// One shared GPU of a node.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SharedGpu {
    /// NVML index.
    pub index: u32,
    /// UUID (what reservations name).
    pub uuid: String,
    /// Its replica count R: it is offered as R `gpus` units.
    pub replicas: u32,
    /// Framebuffer size in bytes (a k/R share gets k/R of it under MPS).
    pub memory_total: u64,
    /// How its shares are enforced.
    pub mode: SharingMode,
    /// For a MIG device: its parent GPU's UUID (then `uuid` is the MIG device's, `index` the
    /// parent's NVML index and `memory_total` the GPU instance's memory).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig_parent: Option<String>,
    /// For a MIG device: its kind, what a `mig-<profile>` request names (`None` when NVML did
    /// not say its profile).
    #[serde(skip)]
    pub mig_kind: Option<MigKind>,
}

impl SharedGpu {
    /// True when a request limited to `among` may take a share of it.
    pub fn is_in(&self, among: Among) -> bool {
        among.admits(self.mig_parent.as_deref(), self.mig_kind)
    }
}

impl Among {
    /// True for a shared unit whose MIG parent (a MIG device's) and kind are these.
    pub(crate) fn admits(self, mig_parent: Option<&str>, kind: Option<MigKind>) -> bool {
        match self {
            Among::All => true,
            Among::Gpus => mig_parent.is_none(),
            Among::Mig(k) => mig_parent.is_some() && kind == Some(k),
        }
    }
}

/// A node's static split into shared and whole GPUs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharingPlan {
    /// The shared GPUs, in index order, then the shared MIG devices by parent.
    pub shared: Vec<SharedGpu>,
    /// NVML indices of the GPUs that stay whole.
    pub whole: Vec<u32>,
}

impl SharingPlan {
    /// The `gpus` units the node advertises: Σ R over shared GPUs + the whole GPUs.
    pub fn units(&self) -> u32 {
        self.shared.iter().map(|g| g.replicas).sum::<u32>()
            + u32::try_from(self.whole.len()).unwrap_or(u32::MAX)
    }

    /// The largest replica count (0 when no GPU is shared).
    pub fn largest(&self) -> u32 {
        self.largest_in(Among::All)
    }

    /// The largest replica count among the shared units of `among` (0 when none).
    pub fn largest_in(&self, among: Among) -> u32 {
        self.shared
            .iter()
            .filter(|g| g.is_in(among))
            .map(|g| g.replicas)
            .max()
            .unwrap_or(0)
    }

    /// True when some MIG device is shared.
    pub fn shares_mig(&self) -> bool {
        self.shared.iter().any(|g| g.mig_parent.is_some())
    }

    /// The modes of the shared GPUs, each once, in order.
    pub fn modes(&self) -> Vec<SharingMode> {
        let modes: std::collections::BTreeSet<SharingMode> =
            self.shared.iter().map(|g| g.mode).collect();
        modes.into_iter().collect()
    }

    /// True when some GPU is shared under `mode`.
    pub fn has(&self, mode: SharingMode) -> bool {
        self.shared.iter().any(|g| g.mode == mode)
    }

    /// True when a request of `units` is served as a share of one shared GPU (1 to the
    /// largest R); larger requests take whole GPUs.
    pub fn takes_as_share(&self, units: u32) -> bool {
        self.takes_as_share_in(units, Among::All)
    }

    /// [`SharingPlan::takes_as_share`] among the shared units of `among`.
    pub fn takes_as_share_in(&self, units: u32, among: Among) -> bool {
        units >= 1 && units <= self.largest_in(among)
    }

    /// The shared GPU with this UUID.
    pub fn shared_gpu(&self, uuid: &str) -> Option<&SharedGpu> {
        self.shared.iter().find(|g| g.uuid == uuid)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use mesos_gpu_node::nodes::dgx1_v100;

    #[test]
    fn mig_devices_of_an_mps_gpu_are_shared_r_ways_within_their_client_limit() {
        let inv = mesos_gpu_node::nodes::dgx1_with_mig_gpus();
        let whole: Vec<u32> = (0..4).collect();
        let modes: ModeSpec = "mps,0-3=none".parse().unwrap();
        let plan = SharingSpec::parse("4,5=2", modes)
            .unwrap()
            .resolve(&inv, &whole)
            .unwrap();
        assert_eq!(plan.whole, [0, 1, 2, 3]);
        let shared: Vec<(&str, u32, u32, Option<&str>)> = plan
            .shared
            .iter()
            .map(|g| {
                (
                    g.uuid.as_str(),
                    g.index,
                    g.replicas,
                    g.mig_parent.as_deref(),
                )
            })
            .collect();
        let (p4, p5) = (inv.gpus[4].uuid.as_str(), inv.gpus[5].uuid.as_str());
        assert_eq!(
            shared,
            [
                ("MIG-4-0", 4, 4, Some(p4)),
                ("MIG-4-1", 4, 4, Some(p4)),
                ("MIG-4-2", 4, 4, Some(p4)),
                ("MIG-5-0", 5, 2, Some(p5)),
                ("MIG-5-1", 5, 2, Some(p5)),
                ("MIG-5-2", 5, 2, Some(p5)),
            ]
        );
        assert!(plan.shared.iter().all(|g| g.mode == SharingMode::Mps));
        assert_eq!(
            plan.shared[0].memory_total,
            15 << 30,
            "the GPU instance's memory"
        );
        assert_eq!(plan.units(), 3 * 4 + 3 * 2 + 4);
        let one_g = Among::Mig(MigKind::whole(19));
        assert_eq!(plan.largest_in(one_g), 4);
        assert_eq!(
            plan.largest_in(Among::Gpus),
            0,
            "no GPU outside MIG is shared"
        );
        assert!(plan.takes_as_share_in(4, one_g) && !plan.takes_as_share_in(5, one_g));
        assert!(!plan.takes_as_share_in(1, Among::Gpus));
        // A 1g device serves at most 6 clients (48 lowered to its 1 of 7 compute slices).
        let limits: Vec<u32> = [1, 2, 3, 4, 7]
            .map(|c| {
                let mut d = inv.mig.devices[1].clone();
                d.compute_instance_slices = c;
                mig_max_clients(&d)
            })
            .to_vec();
        assert_eq!(limits, [6, 13, 20, 27, 48]);
        let err = SharingSpec::parse("7", "mps,0-3=none".parse().unwrap())
            .unwrap()
            .resolve(&inv, &whole)
            .unwrap_err();
        assert_eq!(
            err,
            SharingError::MigClients {
                uuid: "MIG-4-1".into(),
                profile: "1g.5gb".into(),
                slices: 1,
                index: 4,
                replicas: 7,
                max: 6
            }
        );
        assert!(err.to_string().contains("4=6 in --gpu-replicas"), "{err}");
        // `none` (or R = 1) keeps a MIG GPU's devices whole.
        let plan = SharingSpec::parse("4,4=1", "mps,5=none".parse().unwrap())
            .unwrap()
            .resolve(&inv, &whole)
            .unwrap();
        assert!(!plan.shares_mig(), "{:?}", plan.shared);
        assert_eq!(
            plan.shared.len(),
            4,
            "GPUs 0-3 shared, their MIG devices whole"
        );
    }

    #[test]
    fn time_slicing_a_gpu_in_mig_mode_is_refused_saying_what_to_set() {
        let inv = mesos_gpu_node::nodes::dgx1_with_mig_gpus();
        let whole: Vec<u32> = (0..4).collect();
        let err = SharingSpec::parse("2", ModeSpec::default())
            .unwrap()
            .resolve(&inv, &whole)
            .unwrap_err();
        assert!(
            matches!(err, SharingError::MigTimeSlicing { index: 4, .. }),
            "{err}"
        );
        assert!(
            err.to_string().contains("4=mps or 4=none in --gpu-sharing"),
            "{err}"
        );
        // Time-slicing on the whole GPUs, MPS on the MIG devices, by index or GPU UUID.
        let by_uuid = format!("time-slicing,4=mps,{}=mps", inv.gpus[5].uuid);
        let plan = SharingSpec::parse("2", by_uuid.parse().unwrap())
            .unwrap()
            .resolve(&inv, &whole)
            .unwrap();
        assert_eq!(plan.modes(), [SharingMode::TimeSlicing, SharingMode::Mps]);
        assert_eq!(plan.shared.len(), 4 + 6);
        // A selector may name a GPU in MIG mode, but not one the node lacks.
        let err = SharingSpec::parse("2", "mps,9=none".parse().unwrap())
            .unwrap()
            .resolve(&inv, &whole)
            .unwrap_err();
        assert!(
            matches!(err, SharingError::UnknownGpu { .. }) && err.to_string().contains("5 ("),
            "{err}"
        );
    }

    #[test]
    fn a_mode_per_gpu_puts_exclusive_time_sliced_and_mps_gpus_side_by_side() {
        let inv = dgx1_v100().inventory();
        let all: Vec<u32> = (0..8).collect();
        let modes: ModeSpec = "mps,4-5=time-slicing,6-7=none".parse().unwrap();
        let plan = SharingSpec::parse("4,2-3=2", modes)
            .unwrap()
            .resolve(&inv, &all)
            .unwrap();
        let shared: Vec<(u32, u32, SharingMode)> = plan
            .shared
            .iter()
            .map(|g| (g.index, g.replicas, g.mode))
            .collect();
        use SharingMode::{Mps, TimeSlicing};
        assert_eq!(
            shared,
            [
                (0, 4, Mps),
                (1, 4, Mps),
                (2, 2, Mps),
                (3, 2, Mps),
                (4, 4, TimeSlicing),
                (5, 4, TimeSlicing)
            ]
        );
        assert_eq!(plan.whole, [6, 7], "`none` keeps a GPU whole whatever R");
        assert_eq!(plan.units(), 4 + 4 + 2 + 2 + 4 + 4 + 2);
        assert!(plan.has(Mps) && plan.has(TimeSlicing));
        // A bare mode is every GPU's; the default default is time-slicing.
        assert_eq!("mps".parse::<ModeSpec>().unwrap(), ModeSpec::uniform(Mps));
        assert_eq!(ModeSpec::default(), ModeSpec::uniform(TimeSlicing));
        let only: ModeSpec = "3=mps".parse().unwrap();
        let plan = SharingSpec::parse("2", only)
            .unwrap()
            .resolve(&inv, &all)
            .unwrap();
        assert_eq!(plan.modes(), [TimeSlicing, Mps]);
    }

    #[test]
    fn bad_mode_specs_name_the_entry_and_what_is_accepted() {
        for bad in ["slices", "mps,4=fast", "mps,x=none", "mps,5-4=none", "=mps"] {
            let err = bad.parse::<ModeSpec>().unwrap_err();
            let last = bad.rsplit(',').next().unwrap();
            assert_eq!(
                err,
                SharingError::ModeEntry {
                    entry: last.to_owned()
                },
                "{bad}"
            );
            assert!(
                err.to_string().contains("time-slicing, mps, none")
                    && err.to_string().contains(last),
                "{err}"
            );
        }
        assert!(matches!(
            "mps,none".parse::<ModeSpec>(),
            Err(SharingError::Duplicate { .. })
        ));
        assert!(matches!(
            "4-5=mps,5=none".parse::<ModeSpec>(),
            Err(SharingError::Duplicate { .. })
        ));
        let inv = dgx1_v100().inventory();
        let err = SharingSpec::parse("2", "9=mps".parse().unwrap())
            .unwrap()
            .resolve(&inv, &[0, 1])
            .unwrap_err();
        assert!(err.to_string().contains("\"9\""), "{err}");
    }

    fn spec(s: &str) -> SharingSpec {
        SharingSpec::parse(s, ModeSpec::uniform(SharingMode::Mps)).unwrap()
    }

    fn ts() -> ModeSpec {
        ModeSpec::uniform(SharingMode::TimeSlicing)
    }

    #[test]
    fn bare_number_shares_every_gpu_and_entries_override() {
        let inv = dgx1_v100().inventory();
        let all: Vec<u32> = (0..8).collect();
        let plan = spec("4,3=1,7=2").resolve(&inv, &all).unwrap();
        assert_eq!(plan.whole, vec![3]);
        assert_eq!(plan.shared.len(), 7);
        assert_eq!(plan.shared_gpu(&inv.gpus[7].uuid).unwrap().replicas, 2);
        assert_eq!(plan.units(), 6 * 4 + 2 + 1);
        let by_uuid = format!("{}=4", inv.gpus[5].uuid);
        let plan = spec(&by_uuid).resolve(&inv, &all).unwrap();
        assert_eq!(plan.units(), 4 + 7);
    }

    #[test]
    fn bad_specs_name_the_value() {
        for bad in ["", "0", "49", "x=2", "2=", "=2", "1.5", "4,-1=2", "a"] {
            let err = SharingSpec::parse(bad, ts()).unwrap_err();
            let last = bad.rsplit(',').next().unwrap();
            assert_eq!(
                err,
                SharingError::Entry {
                    entry: last.to_owned()
                },
                "{bad}"
            );
        }
        assert!(matches!(
            SharingSpec::parse("2,3", ts()),
            Err(SharingError::Duplicate { .. })
        ));
        assert!(matches!(
            SharingSpec::parse("1=2,1=3", ts()),
            Err(SharingError::Duplicate { .. })
        ));
        assert!(matches!(
            SharingSpec::parse("0-3=2,3=4", ts()),
            Err(SharingError::Duplicate { .. })
        ));
        assert_eq!(
            "hami".parse::<SharingMode>().unwrap_err().to_string(),
            "GPU sharing mode \"hami\" is not one of: time-slicing, mps"
        );
        let inv = dgx1_v100().inventory();
        let err = spec("9=2").resolve(&inv, &[0, 1]).unwrap_err();
        assert!(err.to_string().contains("\"9\""), "{err}");
        assert!(err.to_string().contains("0 (GPU-"), "{err}");
    }

    #[test]
    fn mps_is_refused_before_volta() {
        let mut inv = dgx1_v100().inventory();
        inv.gpus[1].compute_capability = Some((6, 0));
        let err = spec("2").resolve(&inv, &[0, 1]).unwrap_err();
        assert!(
            matches!(err, SharingError::MpsTooOld { index: 1, .. }),
            "{err}"
        );
        assert!(err.to_string().contains("6.0"), "{err}");
        // Time-slicing and a whole GPU 1 are fine.
        SharingSpec::parse("2", ts())
            .unwrap()
            .resolve(&inv, &[0, 1])
            .unwrap();
        // Per GPU: MPS where the GPU has it, time-slicing on the old one.
        let modes: ModeSpec = "mps,1=time-slicing".parse().unwrap();
        let plan = SharingSpec::parse("2", modes)
            .unwrap()
            .resolve(&inv, &[0, 1])
            .unwrap();
        assert_eq!(plan.modes(), [SharingMode::TimeSlicing, SharingMode::Mps]);
        spec("2,1=1").resolve(&inv, &[0, 1]).unwrap();
    }
}
