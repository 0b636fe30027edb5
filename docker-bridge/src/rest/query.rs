//! The `dev=` and `vol=` query parameters of `/docker/cli`, as nvidia-docker 1.0 defined them
//! (`docs/reference/nvidia-docker.md` §1; nvidia-docker v1.0.1
//! `src/nvidia-docker-plugin/remote_v1.go`, `src/nvidia/devices.go`):
//!
//! - values are form-decoded (`+` and `%20` are spaces) and the first occurrence counts;
//! - `dev=` lists GPUs separated by spaces: missing, empty or `*` means all; `GPU-…` is a UUID
//!   prefix; anything else is an NVML **index** (not a minor); `dev=0,1` is invalid;
//! - `vol=` lists volume base names (`nvidia_driver`) the same way.
//!
//! Deliberate differences: an ambiguous UUID prefix is refused (nvidia-docker took the first
//! match), repeated spaces are tolerated, `MIG-…` names a MIG device by UUID prefix, a GPU in MIG
//! mode is refused (its MIG devices are named instead) and all (`*`) means the GPUs not in MIG
//! mode; a parameter asking for what this API cannot give (a share, pinning) is refused.

use mesos_gpu_node::inventory::{Gpu, Inventory, MigDevice};

use crate::args::DRIVER_VOLUME_BASE;

/// A `dev=` or `vol=` value the API cannot honour; the text is the HTTP 400 reason.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QueryError {
    /// Not an NVML index or UUID prefix of this node's GPUs.
    #[error(
        "invalid device: {id} (expected NVML indices, GPU- or MIG- UUID prefixes separated by '+', or '*')"
    )]
    InvalidDevice {
        /// The identifier as given.
        id: String,
    },
    /// An NVML index this node has no GPU at.
    #[error("no GPU {index} on this node (its GPUs: {known})")]
    NoSuchGpu {
        /// The index asked for.
        index: u32,
        /// The node's indices (`0-7`, or `none`).
        known: String,
    },
    /// A UUID prefix matching several GPUs.
    #[error("ambiguous device: {id} matches {matches}")]
    AmbiguousDevice {
        /// The identifier as given.
        id: String,
        /// The UUIDs it matches, comma-separated.
        matches: String,
    },
    /// A GPU in MIG mode: its MIG devices are what a container can be given.
    #[error(
        "GPU {index} is in MIG mode: name one of its MIG devices instead (dev=MIG-…: {devices})"
    )]
    MigParent {
        /// The GPU's NVML index.
        index: u32,
        /// Its MIG devices' UUIDs, comma-separated (or `none`).
        devices: String,
    },
    /// A parameter asking for what `/docker/cli` cannot give.
    #[error(
        "{name}=: /docker/cli reserves nothing, so it gives no share of a GPU and pins nothing; \
         use `mesos-gpu docker-args` (--gpu-replicas, --numa-pinning --cpus)"
    )]
    Unsupported {
        /// The parameter.
        name: String,
    },
    /// Not a volume this node serves.
    #[error("invalid volume: {name} (expected {DRIVER_VOLUME_BASE} or '*')")]
    InvalidVolume {
        /// The name as given.
        name: String,
    },
}

/// The `dev` and `vol` values of a query string (first occurrence of each).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct CliQuery {
    pub(crate) dev: Option<String>,
    pub(crate) vol: Option<String>,
    /// The first parameter asking for a share or pinning, which this API cannot give.
    pub(crate) unsupported: Option<String>,
}

/// Parameters of `docker-args` a `/docker/cli` query may carry by mistake.
const UNSUPPORTED: [&str; 4] = ["gpu_replicas", "gpu_sharing", "numa_pinning", "cpus"];

impl CliQuery {
    pub(crate) fn parse(query: Option<&str>) -> CliQuery {
        let mut parsed = CliQuery::default();
        for (key, value) in form_urlencoded::parse(query.unwrap_or("").as_bytes()) {
            let slot = match key.as_ref() {
                "dev" => &mut parsed.dev,
                "vol" => &mut parsed.vol,
                other if UNSUPPORTED.contains(&other) => {
                    parsed.unsupported.get_or_insert_with(|| other.to_owned());
                    continue;
                }
                _ => continue,
            };
            if slot.is_none() {
                *slot = Some(value.into_owned());
            }
        }
        parsed
    }

    /// Refuses a query asking for what `/docker/cli` cannot give.
    pub(crate) fn check_supported(&self) -> Result<(), QueryError> {
        match &self.unsupported {
            Some(name) => Err(QueryError::Unsupported { name: name.clone() }),
            None => Ok(()),
        }
    }
}

/// What `dev=` selects: GPUs not in MIG mode, and MIG devices.
#[derive(Debug, Default)]
pub(crate) struct Selection<'a> {
    pub(crate) gpus: Vec<&'a Gpu>,
    pub(crate) mig: Vec<&'a MigDevice>,
}

/// The GPUs and MIG devices `dev` selects: each once, in inventory order; all (`*`) is every GPU
/// not in MIG mode; a GPU in MIG mode is refused, naming its MIG devices.
pub(crate) fn select<'a>(
    inventory: &'a Inventory,
    dev: Option<&str>,
) -> Result<Selection<'a>, QueryError> {
    let mig_ids: Vec<&str> = tokens(dev)
        .unwrap_or_default()
        .into_iter()
        .filter(|t| t.starts_with("MIG-"))
        .collect();
    let gpu_ids: Vec<&str> = tokens(dev)
        .unwrap_or_default()
        .into_iter()
        .filter(|t| !t.starts_with("MIG-"))
        .collect();
    let gpus = if mig_ids.is_empty() || !gpu_ids.is_empty() {
        let named = (!gpu_ids.is_empty()).then(|| gpu_ids.join(" "));
        let mut gpus = select_gpus(inventory, named.as_deref())?;
        if named.is_none() {
            gpus.retain(|g| !inventory.mig.is_enabled(g.index));
        }
        if let Some(parent) = gpus.iter().find(|g| inventory.mig.is_enabled(g.index)) {
            let devices: Vec<&str> = inventory
                .mig
                .devices
                .iter()
                .filter(|d| d.parent == parent.index)
                .map(|d| d.uuid.as_str())
                .collect();
            return Err(QueryError::MigParent {
                index: parent.index,
                devices: if devices.is_empty() {
                    "none".to_owned()
                } else {
                    devices.join(",")
                },
            });
        }
        gpus
    } else {
        Vec::new()
    };
    let mut mig: Vec<&MigDevice> = Vec::new();
    for id in mig_ids {
        let matches: Vec<&MigDevice> = inventory
            .mig
            .devices
            .iter()
            .filter(|d| d.uuid.starts_with(id))
            .collect();
        match matches.as_slice() {
            [one] => {
                if !mig.iter().any(|m| m.uuid == one.uuid) {
                    mig.push(one);
                }
            }
            [] => return Err(QueryError::InvalidDevice { id: id.to_owned() }),
            many => {
                return Err(QueryError::AmbiguousDevice {
                    id: id.to_owned(),
                    matches: many
                        .iter()
                        .map(|d| d.uuid.as_str())
                        .collect::<Vec<_>>()
                        .join(","),
                });
            }
        }
    }
    Ok(Selection { gpus, mig })
}

fn tokens(value: Option<&str>) -> Option<Vec<&str>> {
    let list: Vec<&str> = value
        .unwrap_or("")
        .split(' ')
        .filter(|t| !t.is_empty())
        .collect();
    if list.is_empty() || list == ["*"] {
        None
    } else {
        Some(list)
    }
}

/// The GPUs `dev` selects, each once, in inventory order.
pub(crate) fn select_gpus<'a>(
    inventory: &'a Inventory,
    dev: Option<&str>,
) -> Result<Vec<&'a Gpu>, QueryError> {
    let Some(ids) = tokens(dev) else {
        return Ok(inventory.gpus.iter().collect());
    };
    let mut chosen = vec![false; inventory.gpus.len()];
    for id in ids {
        let invalid = || QueryError::InvalidDevice { id: id.to_owned() };
        let position = if id.starts_with("GPU-") {
            let matches: Vec<usize> = inventory
                .gpus
                .iter()
                .enumerate()
                .filter(|(_, g)| g.uuid.starts_with(id))
                .map(|(i, _)| i)
                .collect();
            match matches.as_slice() {
                [one] => *one,
                [] => return Err(invalid()),
                many => {
                    let uuids: Vec<&str> = many
                        .iter()
                        .map(|&i| inventory.gpus[i].uuid.as_str())
                        .collect();
                    return Err(QueryError::AmbiguousDevice {
                        id: id.to_owned(),
                        matches: uuids.join(","),
                    });
                }
            }
        } else {
            if !id.bytes().all(|b| b.is_ascii_digit()) {
                return Err(invalid());
            }
            let index: u32 = id.parse().map_err(|_| invalid())?;
            inventory
                .gpus
                .iter()
                .position(|g| g.index == index)
                .ok_or_else(|| QueryError::NoSuchGpu {
                    index,
                    known: index_ranges(inventory.gpus.iter().map(|g| g.index)),
                })?
        };
        chosen[position] = true;
    }
    Ok(inventory
        .gpus
        .iter()
        .zip(chosen)
        .filter_map(|(g, c)| c.then_some(g))
        .collect())
}

/// Indices as ranges, `0-3,5`; `none` for no index.
fn index_ranges(indices: impl Iterator<Item = u32>) -> String {
    let mut ranges: Vec<(u32, u32)> = Vec::new();
    for i in indices {
        match ranges.last_mut() {
            Some((_, end)) if end.checked_add(1) == Some(i) => *end = i,
            _ => ranges.push((i, i)),
        }
    }
    if ranges.is_empty() {
        return "none".to_owned();
    }
    ranges
        .iter()
        .map(|&(a, b)| {
            if a == b {
                a.to_string()
            } else {
                format!("{a}-{b}")
            }
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// Checks `vol`; the only volume is the driver volume, so a valid selection always holds it.
pub(crate) fn check_volumes(vol: Option<&str>) -> Result<(), QueryError> {
    for name in tokens(vol).unwrap_or_default() {
        if name != DRIVER_VOLUME_BASE {
            return Err(QueryError::InvalidVolume {
                name: name.to_owned(),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn inventory() -> Inventory {
        let gpu = |index: u32, minor: u32, uuid: &str| Gpu {
            index,
            minor,
            uuid: uuid.to_owned(),
            name: "sim".to_owned(),
            memory_total: 0,
            pci_bus_id: String::new(),
            numa_node: None,
            compute_capability: None,
            healthy: true,
        };
        Inventory {
            gpus: vec![
                gpu(0, 2, "GPU-aaaa-1111"),
                gpu(1, 0, "GPU-aaab-2222"),
                gpu(2, 1, "GPU-bbbb-3333"),
            ],
            ..Default::default()
        }
    }

    fn pick(dev: Option<&str>) -> Result<Vec<u32>, QueryError> {
        let inv = inventory();
        select_gpus(&inv, dev).map(|g| g.iter().map(|g| g.index).collect())
    }

    #[test]
    fn query_values_are_form_decoded_and_first_wins() {
        let q = CliQuery::parse(Some("dev=0+1&vol=nvidia_driver&dev=2"));
        assert_eq!(q.dev.as_deref(), Some("0 1"));
        assert_eq!(q.vol.as_deref(), Some("nvidia_driver"));
        assert_eq!(
            CliQuery::parse(Some("dev=0%201")).dev.as_deref(),
            Some("0 1")
        );
        assert_eq!(CliQuery::parse(None), CliQuery::default());
        assert_eq!(CliQuery::parse(Some("other=1")), CliQuery::default());
    }

    #[test]
    fn missing_empty_or_star_selects_all() {
        for dev in [None, Some(""), Some("*"), Some("  ")] {
            assert_eq!(pick(dev).expect("all"), [0, 1, 2], "{dev:?}");
        }
    }

    #[test]
    fn indices_are_nvml_indices_not_minors() {
        assert_eq!(pick(Some("0")).expect("ok"), [0]);
        assert_eq!(pick(Some("2 0")).expect("ok"), [0, 2]);
        assert_eq!(pick(Some("1 1")).expect("ok"), [1]);
    }

    #[test]
    fn uuid_prefixes_match_once() {
        assert_eq!(pick(Some("GPU-bbbb")).expect("ok"), [2]);
        assert_eq!(pick(Some("GPU-aaab-2222 0")).expect("ok"), [0, 1]);
        let err = pick(Some("GPU-aaa")).expect_err("ambiguous");
        assert_eq!(
            err.to_string(),
            "ambiguous device: GPU-aaa matches GPU-aaaa-1111,GPU-aaab-2222"
        );
    }

    #[test]
    fn bad_devices_are_named() {
        let err = pick(Some("3")).expect_err("no GPU 3");
        assert_eq!(err.to_string(), "no GPU 3 on this node (its GPUs: 0-2)");
        assert_eq!(index_ranges([0, 1, 2, 5, 7, 8].into_iter()), "0-2,5,7-8");
        assert_eq!(index_ranges(std::iter::empty()), "none");
        for bad in ["0,1", "-1", "GPU-zzzz", "x", "* 0", "+1", "99999999999"] {
            let err = pick(Some(bad)).expect_err(bad);
            assert!(
                matches!(err, QueryError::InvalidDevice { .. }),
                "{bad}: {err}"
            );
            let first = bad.split(' ').next().unwrap_or(bad);
            assert!(
                err.to_string()
                    .starts_with(&format!("invalid device: {first}")),
                "{err}"
            );
        }
    }

    #[test]
    fn volumes_accept_only_the_driver_volume() {
        for ok in [
            None,
            Some(""),
            Some("*"),
            Some("nvidia_driver"),
            Some("nvidia_driver nvidia_driver"),
        ] {
            check_volumes(ok).expect("valid");
        }
        let err = check_volumes(Some("nvidia_driver other")).expect_err("invalid");
        assert!(
            err.to_string().starts_with("invalid volume: other"),
            "{err}"
        );
    }

    proptest! {
        #[test]
        fn selection_never_panics_and_is_sorted(q in ".*") {
            let parsed = CliQuery::parse(Some(&q));
            let inv = inventory();
            if let Ok(gpus) = select_gpus(&inv, parsed.dev.as_deref()) {
                let idx: Vec<u32> = gpus.iter().map(|g| g.index).collect();
                let mut sorted = idx.clone();
                sorted.sort_unstable();
                sorted.dedup();
                prop_assert_eq!(idx, sorted);
            }
            let _ = check_volumes(parsed.vol.as_deref());
        }
    }
}
