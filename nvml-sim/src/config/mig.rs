//! Validating a GPU's `mig` object into a [`Mig`] layout: the profile table, GPU instances at
//! placements the table allows without overlapping, compute instances inside them, MIG device
//! indices and UUIDs.
//!
//! Rules (NVIDIA's, `nvml.h` and the MIG user guide): GPU instance ids are unique per GPU and
//! compute instance ids per GPU instance (the driver's capability table has gi0-gi14 and
//! ci0-ci7, `nv-caps.c`); a GPU instance occupies `[start, start + size)` memory slices at one of
//! its profile's placements, and instances may not overlap or exceed the profile's count or the
//! GPU's compute slices; instances exist only while MIG mode is on.

use std::collections::HashSet;

use super::ConfigError;
use super::schema::{ComputeInstanceSpec, GpuInstanceSpec, MigSpec};
use crate::mig::profiles::{GiProfile, ProfileTable};
use crate::mig::{self, ComputeInstance, GpuInstance, Mig, MigDevice};
use crate::node::Gpu;

/// Largest GPU instance id the driver has capabilities for (`gi14`).
const MAX_GI_ID: u32 = 14;
/// Largest compute instance id the driver has capabilities for (`ci7`).
const MAX_CI_ID: u32 = 7;

fn bad(gpu: u32, problem: String) -> ConfigError {
    ConfigError::Mig { gpu, problem }
}

/// The table named by `profiles`, else the one the GPU's name and memory imply.
fn table(
    gpu: u32,
    spec: &MigSpec,
    name: &str,
    total: u64,
) -> Result<Option<&'static ProfileTable>, ConfigError> {
    if let Some(key) = &spec.profiles {
        return ProfileTable::by_key(key)
            .map(Some)
            .ok_or_else(|| ConfigError::Field {
                field: format!("gpu {gpu} mig.profiles"),
                value: key.clone(),
                expected: format!("one of {}", ProfileTable::keys()),
            });
    }
    let key = if name.contains("H100") {
        "h100-80gb"
    } else if name.contains("A100") && total <= 48 << 30 {
        "a100-sxm4-40gb"
    } else if name.contains("A100") {
        "a100-80gb"
    } else {
        return Ok(None);
    };
    Ok(ProfileTable::by_key(key))
}

/// Validates the `mig` object of GPU `gpu` (minor number `minor`).
pub(super) fn layout(
    gpu: u32,
    minor: u32,
    spec: MigSpec,
    name: &str,
    parent_uuid: &str,
    total: u64,
) -> Result<Mig, ConfigError> {
    let table = table(gpu, &spec, name, total)?;
    if spec.current && minor >= crate::driver_files::MAX_GPUS {
        return Err(bad(
            gpu,
            format!(
                "MIG needs a minor number below {} (the driver's capability table covers gpu0-gpu{}), not {minor}",
                crate::driver_files::MAX_GPUS,
                crate::driver_files::MAX_GPUS - 1
            ),
        ));
    }
    if spec.current && table.is_none() {
        return Err(bad(
            gpu,
            format!(
                "MIG is on but no profile table fits {name:?}; set mig.profiles to one of {}",
                ProfileTable::keys()
            ),
        ));
    }
    if !spec.current && !spec.gpu_instances.is_empty() {
        return Err(bad(
            gpu,
            "gpu_instances exist only while MIG mode is on (current: true)".to_owned(),
        ));
    }
    let mut gpu_instances = Vec::with_capacity(spec.gpu_instances.len());
    if let Some(table) = table {
        let mut used_memory = 0u32;
        let mut used_compute = 0u32;
        for g in &spec.gpu_instances {
            let gi = gpu_instance(gpu, table, g, parent_uuid)?;
            let mask = ((1u32 << gi.profile.memory_slices) - 1) << gi.start;
            if used_memory & mask != 0 {
                return Err(bad(
                    gpu,
                    format!(
                        "GPU instance {} (profile {}) at memory slices {}-{} overlaps another instance",
                        gi.id,
                        gi.profile.id,
                        gi.start,
                        gi.start + gi.profile.memory_slices - 1
                    ),
                ));
            }
            used_memory |= mask;
            used_compute += gi.profile.slices;
            if gpu_instances.iter().any(|o: &GpuInstance| o.id == gi.id) {
                return Err(bad(gpu, format!("GPU instance id {} appears twice", gi.id)));
            }
            let same = gpu_instances
                .iter()
                .filter(|o: &&GpuInstance| o.profile.id == gi.profile.id)
                .count();
            if u32::try_from(same).unwrap_or(u32::MAX) >= gi.profile.instances {
                return Err(bad(
                    gpu,
                    format!(
                        "more than {} GPU instances of profile {}",
                        gi.profile.instances, gi.profile.id
                    ),
                ));
            }
            gpu_instances.push(gi);
        }
        if used_compute > table.compute_slices {
            return Err(bad(
                gpu,
                format!(
                    "GPU instances use {used_compute} compute slices, but the GPU has {}",
                    table.compute_slices
                ),
            ));
        }
    }
    let max = table.map_or(0, |t| t.max_mig_devices);
    let devices = assign_indices(gpu, &mut gpu_instances, &spec.gpu_instances, max)?;
    Ok(Mig {
        current: spec.current,
        pending: spec.pending.unwrap_or(spec.current),
        table,
        gpu_instances,
        devices,
    })
}

fn gpu_instance(
    gpu: u32,
    table: &'static ProfileTable,
    spec: &GpuInstanceSpec,
    parent_uuid: &str,
) -> Result<GpuInstance, ConfigError> {
    if spec.id > MAX_GI_ID {
        return Err(bad(
            gpu,
            format!("GPU instance id {} is above {MAX_GI_ID}", spec.id),
        ));
    }
    let profile: &'static GiProfile = table.by_id(spec.profile).ok_or_else(|| {
        let ids: Vec<String> = table.gi.iter().map(|p| p.id.to_string()).collect();
        bad(
            gpu,
            format!(
                "GPU instance {}: profile {} is not a {} profile id (accepted: {})",
                spec.id,
                spec.profile,
                table.key,
                ids.join(", ")
            ),
        )
    })?;
    if !profile.starts.contains(&spec.start) {
        let starts: Vec<String> = profile.starts.iter().map(u32::to_string).collect();
        return Err(bad(
            gpu,
            format!(
                "GPU instance {}: profile {} cannot start at memory slice {} (placements start at {})",
                spec.id,
                profile.id,
                spec.start,
                starts.join(", ")
            ),
        ));
    }
    let cis = match &spec.compute_instances {
        None => vec![ComputeInstance {
            id: 0,
            profile: table.full_ci_profile(profile),
            start: 0,
            index: u32::MAX,
            uuid: mig::derived_uuid(parent_uuid, spec.id, 0),
            processes: Vec::new(),
        }],
        Some(list) => list
            .iter()
            .map(|c| compute_instance(gpu, table, profile, spec.id, c, parent_uuid))
            .collect::<Result<Vec<_>, _>>()?,
    };
    let mut used = 0u32;
    let mut ids = HashSet::new();
    for ci in &cis {
        if !ids.insert(ci.id) {
            return Err(bad(
                gpu,
                format!(
                    "GPU instance {}: compute instance id {} appears twice",
                    spec.id, ci.id
                ),
            ));
        }
        let mask = ((1u32 << ci.profile.slices) - 1) << ci.start;
        if used & mask != 0 {
            return Err(bad(
                gpu,
                format!(
                    "GPU instance {}: compute instance {} overlaps another",
                    spec.id, ci.id
                ),
            ));
        }
        used |= mask;
    }
    Ok(GpuInstance {
        id: spec.id,
        profile,
        start: spec.start,
        compute_instances: cis,
    })
}

fn compute_instance(
    gpu: u32,
    table: &'static ProfileTable,
    gi: &'static GiProfile,
    gi_id: u32,
    spec: &ComputeInstanceSpec,
    parent_uuid: &str,
) -> Result<ComputeInstance, ConfigError> {
    let at = |what: String| {
        bad(
            gpu,
            format!("GPU instance {gi_id} compute instance {}: {what}", spec.id),
        )
    };
    if spec.id > MAX_CI_ID {
        return Err(at(format!("id is above {MAX_CI_ID}")));
    }
    let profile = match spec.profile {
        None => table.full_ci_profile(gi),
        Some(p) => table.ci_profile(gi, p).ok_or_else(|| {
            let ids: Vec<String> = (0..5)
                .filter_map(|id| table.ci_profile(gi, id))
                .map(|c| c.id.to_string())
                .collect();
            at(format!(
                "profile {p} is not offered by GPU instance profile {} (accepted: {})",
                gi.id,
                ids.join(", ")
            ))
        })?,
    };
    let start = spec.start.unwrap_or(0);
    if !start.is_multiple_of(profile.slices) || start + profile.slices > gi.slices {
        return Err(at(format!(
            "start {start} does not fit: a {}-slice compute instance starts at a multiple of {} below {}",
            profile.slices, profile.slices, gi.slices
        )));
    }
    let uuid = match &spec.uuid {
        Some(u) if mig::is_mig_uuid(u) => u.clone(),
        Some(u) => {
            return Err(ConfigError::Field {
                field: format!(
                    "gpu {gpu} mig gpu instance {gi_id} compute instance {} uuid",
                    spec.id
                ),
                value: u.clone(),
                expected: "MIG-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx with hex digits".to_owned(),
            });
        }
        None => mig::derived_uuid(parent_uuid, gi_id, spec.id),
    };
    Ok(ComputeInstance {
        id: spec.id,
        profile,
        start,
        index: spec.index.unwrap_or(u32::MAX),
        uuid,
        processes: spec
            .processes
            .iter()
            .map(|p| (p.pid, p.used_memory))
            .collect(),
    })
}

/// Gives every compute instance its MIG device index: the described one, else the lowest free
/// one in listing order; returns the devices in index order.
fn assign_indices(
    gpu: u32,
    gis: &mut [GpuInstance],
    specs: &[GpuInstanceSpec],
    max: u32,
) -> Result<Vec<MigDevice>, ConfigError> {
    let mut taken = HashSet::new();
    for (g, spec) in gis.iter().zip(specs) {
        for c in spec.compute_instances.iter().flatten() {
            if let Some(i) = c.index {
                if i >= max {
                    return Err(bad(
                        gpu,
                        format!(
                            "MIG device index {i} (GPU instance {} compute instance {}) is not below the GPU's maximum of {max}",
                            g.id, c.id
                        ),
                    ));
                }
                if !taken.insert(i) {
                    return Err(bad(gpu, format!("MIG device index {i} appears twice")));
                }
            }
        }
    }
    let mut devices = Vec::new();
    for (gi_pos, g) in gis.iter_mut().enumerate() {
        for (ci_pos, c) in g.compute_instances.iter_mut().enumerate() {
            if c.index == u32::MAX {
                let free = (0..max).find(|i| !taken.contains(i)).ok_or_else(|| {
                    bad(
                        gpu,
                        format!("more MIG devices than the GPU's maximum of {max}"),
                    )
                })?;
                taken.insert(free);
                c.index = free;
            }
            devices.push((
                c.index,
                MigDevice {
                    gi: gi_pos,
                    ci: ci_pos,
                },
            ));
        }
    }
    devices.sort_by_key(|(i, _)| *i);
    Ok(devices.into_iter().map(|(_, d)| d).collect())
}

/// MIG UUIDs must be unique across the node (NVML looks either kind up by UUID).
pub(super) fn check_unique_uuids(gpus: &[Gpu]) -> Result<(), ConfigError> {
    let mut seen: std::collections::HashMap<String, String> = std::collections::HashMap::new();
    for g in gpus {
        for gi in g.mig.iter().flat_map(|m| &m.gpu_instances) {
            for ci in &gi.compute_instances {
                let holder = format!("GPU {} GI {} CI {}", g.index, gi.id, ci.id);
                if let Some(first) = seen.insert(ci.uuid.to_ascii_lowercase(), holder.clone()) {
                    return Err(ConfigError::Duplicate {
                        what: "MIG UUID",
                        value: ci.uuid.clone(),
                        first,
                        second: holder,
                    });
                }
            }
        }
    }
    Ok(())
}
