//! Which GPUs are shared, with how many replicas each, and how shares are enforced.
//!
//! The operator's spec (module parameter `gpu_replicas`, cli `--gpu-replicas`) is a comma list:
//! a bare number R shares every advertised GPU R ways; `SEL=R` (SEL an NVML index or a GPU UUID)
//! sets one GPU, overriding the bare number. R = 1 keeps a GPU whole. `4,3=1` shares every GPU
//! four ways but GPU 3, which stays whole. R is at most [`MAX_REPLICAS`], the MPS client limit
//! on Volta and later (`nvidia-cuda-mps-control(1)`: 48 clients per GPU on SM 7.0+).

use std::fmt;
use std::str::FromStr;

use mesos_gpu_node::{inventory::Gpu, inventory::Inventory};

/// The most replicas one GPU may have (MPS serves at most 48 clients per GPU on SM 7.0+).
pub const MAX_REPLICAS: u32 = 48;
/// The oldest compute capability MPS is accepted on (Volta: per-client limits).
pub const MPS_MIN_COMPUTE_CAPABILITY: (u32, u32) = (7, 0);

/// How the shares of a GPU are enforced.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SharingMode {
    /// Shares are only accounted: no memory or compute isolation between holders.
    TimeSlicing,
    /// One MPS control daemon per shared GPU; each holder gets its k/R thread and memory limits.
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

/// Why a sharing spec cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SharingError {
    /// The mode is not one we know.
    #[error("GPU sharing mode {value:?} is not one of: time-slicing, mps")]
    Mode {
        /// The value given.
        value: String,
    },
    /// An entry of the replica spec does not parse.
    #[error(
        "GPU replica entry {entry:?}: expected R or SEL=R (SEL an NVML index or GPU UUID, R a whole number 1-{MAX_REPLICAS}), e.g. `4` or `4,3=1`"
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
        "GPU replica spec names GPU {selector:?}, which is not advertised (advertised: {known})"
    )]
    UnknownGpu {
        /// The selector.
        selector: String,
        /// The advertised GPUs, `index (uuid)` comma-separated, or `none`.
        known: String,
    },
    /// MPS on a GPU older than Volta.
    #[error(
        "GPU {index} ({uuid}) has compute capability {capability}; MPS sharing needs 7.0 (Volta) or later: share it with --gpu-sharing time-slicing or keep it whole ({index}=1)"
    )]
    MpsTooOld {
        /// NVML index.
        index: u32,
        /// UUID.
        uuid: String,
        /// `major.minor`, or `unknown`.
        capability: String,
    },
    /// MPS on a MIG device.
    #[error(
        "GPU {uuid} is a MIG device; MPS cannot share a MIG device: keep it whole or use time-slicing"
    )]
    MpsOnMig {
        /// The MIG device's UUID.
        uuid: String,
    },
}

/// A GPU selector of the spec.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Selector {
    Index(u32),
    Uuid(String),
}

impl Selector {
    fn matches(&self, gpu: &Gpu) -> bool {
        match self {
            Selector::Index(i) => gpu.index == *i,
            Selector::Uuid(u) => gpu.uuid.eq_ignore_ascii_case(u),
        }
    }

    fn text(&self) -> String {
        match self {
            Selector::Index(i) => i.to_string(),
            Selector::Uuid(u) => u.clone(),
        }
    }
}

/// The operator's replica spec and mode, parsed but not yet checked against a node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharingSpec {
    mode: SharingMode,
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
    /// Parses a replica spec (`4`, `0=4,1=2`, `4,3=1`, `GPU-…=2`).
    pub fn parse(spec: &str, mode: SharingMode) -> Result<SharingSpec, SharingError> {
        let mut out = SharingSpec {
            mode,
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
                    let selector = if sel.is_empty() {
                        return Err(bad());
                    } else if let Ok(i) = sel.parse::<u32>() {
                        Selector::Index(i)
                    } else if sel.starts_with("GPU-") || sel.starts_with("MIG-") {
                        Selector::Uuid(sel.to_owned())
                    } else {
                        return Err(bad());
                    };
                    let r = replicas(r, entry)?;
                    if out.per_gpu.iter().any(|(s, _)| *s == selector) {
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

    /// The enforcement mode.
    pub fn mode(&self) -> SharingMode {
        self.mode
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
            .collect();
        for (selector, _) in &self.per_gpu {
            if !gpus.iter().any(|g| selector.matches(g)) {
                let known = gpus
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
            mode: self.mode,
            shared: Vec::new(),
            whole: Vec::new(),
        };
        for gpu in gpus {
            let r = self
                .per_gpu
                .iter()
                .find(|(s, _)| s.matches(gpu))
                .map(|(_, r)| *r)
                .or(self.default)
                .unwrap_or(1);
            if r == 1 {
                plan.whole.push(gpu.index);
                continue;
            }
            if self.mode == SharingMode::Mps {
                check_mps(gpu)?;
            }
            plan.shared.push(SharedGpu {
                index: gpu.index,
                uuid: gpu.uuid.clone(),
                replicas: r,
                memory_total: gpu.memory_total,
            });
        }
        Ok(plan)
    }
}

fn check_mps(gpu: &Gpu) -> Result<(), SharingError> {
    if gpu.uuid.starts_with("MIG-") {
        return Err(SharingError::MpsOnMig {
            uuid: gpu.uuid.clone(),
        });
    }
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
}

/// A node's static split into shared and whole GPUs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharingPlan {
    /// How shares are enforced.
    pub mode: SharingMode,
    /// The shared GPUs, in index order.
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
        self.shared.iter().map(|g| g.replicas).max().unwrap_or(0)
    }

    /// True when a request of `units` is served as a share of one shared GPU (1 to the
    /// largest R); larger requests take whole GPUs.
    pub fn takes_as_share(&self, units: u32) -> bool {
        units >= 1 && units <= self.largest()
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

    fn spec(s: &str) -> SharingSpec {
        SharingSpec::parse(s, SharingMode::Mps).unwrap()
    }

    #[test]
    fn issue_17_bare_number_shares_every_gpu_and_entries_override() {
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
    fn issue_17_bad_specs_name_the_value() {
        for bad in ["", "0", "49", "x=2", "2=", "=2", "1.5", "4,-1=2", "a"] {
            let err = SharingSpec::parse(bad, SharingMode::TimeSlicing).unwrap_err();
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
            SharingSpec::parse("2,3", SharingMode::Mps),
            Err(SharingError::Duplicate { .. })
        ));
        assert!(matches!(
            SharingSpec::parse("1=2,1=3", SharingMode::Mps),
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
    fn issue_17_mps_is_refused_before_volta_and_on_mig() {
        let mut inv = dgx1_v100().inventory();
        inv.gpus[1].compute_capability = Some((6, 0));
        let err = spec("2").resolve(&inv, &[0, 1]).unwrap_err();
        assert!(
            matches!(err, SharingError::MpsTooOld { index: 1, .. }),
            "{err}"
        );
        assert!(err.to_string().contains("6.0"), "{err}");
        // Time-slicing and a whole GPU 1 are fine.
        SharingSpec::parse("2", SharingMode::TimeSlicing)
            .unwrap()
            .resolve(&inv, &[0, 1])
            .unwrap();
        spec("2,1=1").resolve(&inv, &[0, 1]).unwrap();
        inv.gpus[0].uuid = "MIG-0d9e1b56-4c3a-5f2e-9a7b-1c2d3e4f5a6b".into();
        let err = spec("0=2").resolve(&inv, &[0]).unwrap_err();
        assert!(matches!(err, SharingError::MpsOnMig { .. }), "{err}");
    }
}
