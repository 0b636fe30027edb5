//! A GPU's MIG layout as the node description gives it: mode, profile table, GPU instances and
//! their compute instances, each compute instance being one MIG device.
//!
//! NVML facts this follows (`nvml.h` "Multi Instance GPU Management", 12495-13490):
//! GPU instance ids are unique per GPU and compute instance ids unique per GPU instance; neither
//! is a placement index. A MIG device is a compute instance; its handle works with the calls
//! listed in `nvml-sim/README.md`. MIG device indices (`nvmlDeviceGetMigDeviceHandleByIndex`)
//! run below `nvmlDeviceGetMaxMigDeviceCount` and may have holes (`NVML_ERROR_NOT_FOUND`).
//! MIG UUIDs have the `MIG-<uuid>` form current drivers print (R470 on).

pub(crate) mod profiles;

use profiles::{CiProfile, GiProfile, ProfileTable};

/// MIG mode and instances of one GPU.
#[derive(Debug, Clone)]
pub(crate) struct Mig {
    /// `NVML_DEVICE_MIG_ENABLE` now.
    pub(crate) current: bool,
    /// The mode after the next GPU reset.
    pub(crate) pending: bool,
    /// The GPU model's profiles; `None` only for a GPU whose model has no table here, which
    /// may then only have MIG off.
    pub(crate) table: Option<&'static ProfileTable>,
    pub(crate) gpu_instances: Vec<GpuInstance>,
    /// Every MIG device (compute instance), in MIG device index order.
    pub(crate) devices: Vec<MigDevice>,
}

/// A GPU instance.
#[derive(Debug, Clone)]
pub(crate) struct GpuInstance {
    pub(crate) id: u32,
    pub(crate) profile: &'static GiProfile,
    /// First memory slice.
    pub(crate) start: u32,
    pub(crate) compute_instances: Vec<ComputeInstance>,
}

/// A compute instance: one MIG device.
#[derive(Debug, Clone)]
pub(crate) struct ComputeInstance {
    pub(crate) id: u32,
    pub(crate) profile: CiProfile,
    /// First compute slice within the GPU instance.
    pub(crate) start: u32,
    /// The MIG device index under the parent GPU.
    pub(crate) index: u32,
    /// `MIG-…`.
    pub(crate) uuid: String,
    /// (pid, used bytes) of processes on this MIG device, as described.
    pub(crate) processes: Vec<(u32, u64)>,
}

/// Where a MIG device sits: positions in [`Mig::gpu_instances`] and its `compute_instances`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct MigDevice {
    pub(crate) gi: usize,
    pub(crate) ci: usize,
}

impl Mig {
    /// MIG mode is on now.
    pub(crate) fn enabled(&self) -> bool {
        self.current
    }

    /// The GI and CI of MIG device `dev` (a position in [`Mig::devices`]).
    pub(crate) fn device(&self, dev: usize) -> (&GpuInstance, &ComputeInstance) {
        let d = self.devices[dev];
        let gi = &self.gpu_instances[d.gi];
        (gi, &gi.compute_instances[d.ci])
    }

    /// The MIG device with index `index`, as a position in [`Mig::devices`].
    pub(crate) fn device_at_index(&self, index: u32) -> Option<usize> {
        (0..self.devices.len()).find(|&d| self.device(d).1.index == index)
    }

    /// The MIG device of GI `gi_id`, CI `ci_id`.
    pub(crate) fn device_by_ids(&self, gi_id: u32, ci_id: u32) -> Option<usize> {
        (0..self.devices.len()).find(|&d| {
            let (gi, ci) = self.device(d);
            gi.id == gi_id && ci.id == ci_id
        })
    }

    /// The GPU instance with id `gi_id`, as a position in [`Mig::gpu_instances`].
    pub(crate) fn gpu_instance(&self, gi_id: u32) -> Option<usize> {
        self.gpu_instances.iter().position(|g| g.id == gi_id)
    }
}

/// A MIG UUID derived from the parent's UUID and the instance ids: stable across runs, unique
/// per (GPU, GI, CI), shaped like the name-based (version 5) UUIDs drivers print. Not NVIDIA's
/// derivation, which is not public; a node description may give `uuid` explicitly.
pub(crate) fn derived_uuid(parent_uuid: &str, gi: u32, ci: u32) -> String {
    let key = format!("{}/{gi}/{ci}", parent_uuid.to_ascii_lowercase());
    let hi = fnv1a(0xcbf2_9ce4_8422_2325, key.as_bytes());
    let lo = fnv1a(hi ^ 0x9e37_79b9_7f4a_7c15, key.as_bytes());
    let mut bytes = [0u8; 16];
    bytes[..8].copy_from_slice(&hi.to_be_bytes());
    bytes[8..].copy_from_slice(&lo.to_be_bytes());
    bytes[6] = (bytes[6] & 0x0f) | 0x50;
    bytes[8] = (bytes[8] & 0x3f) | 0x80;
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "MIG-{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    )
}

fn fnv1a(seed: u64, bytes: &[u8]) -> u64 {
    bytes.iter().fold(seed, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// True for `MIG-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx` (hex digits).
pub(crate) fn is_mig_uuid(text: &str) -> bool {
    text.strip_prefix("MIG-")
        .is_some_and(|rest| crate::fields::is_gpu_uuid(&format!("GPU-{rest}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn derived_uuids_are_stable_distinct_and_well_formed() {
        let a = derived_uuid("GPU-2a4af22f-b062-5764-b45c-719582e82505", 7, 0);
        assert_eq!(
            a,
            derived_uuid("GPU-2A4AF22F-B062-5764-B45C-719582E82505", 7, 0)
        );
        assert_ne!(
            a,
            derived_uuid("GPU-2a4af22f-b062-5764-b45c-719582e82505", 8, 0)
        );
        assert_ne!(
            a,
            derived_uuid("GPU-2a4af22f-b062-5764-b45c-719582e82505", 7, 1)
        );
        assert!(is_mig_uuid(&a), "{a}");
        assert_eq!(&a[18..19], "5", "version 5 shape: {a}");
        assert!(!is_mig_uuid(
            "MIG-GPU-2a4af22f-b062-5764-b45c-719582e82505/7/0"
        ));
    }
}
