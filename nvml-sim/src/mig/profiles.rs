//! The MIG profile tables of the GPUs the sim knows: A100-SXM4-40GB, A100 80GB and H100 80GB.
//!
//! A GPU instance (GI) profile has two numbers, both from NVIDIA: its *index*, the
//! `NVML_GPU_INSTANCE_PROFILE_*` constant a client passes to `nvmlDeviceGetGpuInstanceProfileInfo`
//! (`nvml.h` 12517-12550: 1 slice 0x0, 2 slices 0x1, 3 slices 0x2, 4 slices 0x3, 7 slices 0x4,
//! 1 slice with media extensions `_REV1` 0x7, 1 slice with double memory `_REV2` 0x9), and its
//! *id*, which that call returns in `info.id` and `nvidia-smi mig -lgip` prints (19, 20, 15, 14, 9,
//! 5, 0). Everything else in the sim keys on the id; names are derived, never matched.
//!
//! Sources of the numbers (`docs/reference/mig.md` §4):
//! - A100-SXM4-40GB: SMs, MiB and placements from go-nvml's `mock/gpus/a100.go` (which agrees
//!   with `nvidia-smi mig -lgip` on R470-R535 drivers: 4.75, 9.62, 19.50, 39.25 GiB), engine
//!   counts from the MIG user guide's A100 table (1g: 0 NVDEC; +me: 1 NVDEC/1 JPEG/1 OFA; 1g.10gb
//!   and 2g: 1 NVDEC; 3g and 4g: 2 NVDECs; 7g: 5 NVDECs/1 JPEG/1 OFA; copy engines = slices).
//! - A100 80GB: go-nvml's `a100_80gb` profiles (9856/19968/40192/80384 MiB), the same engines.
//! - H100 80GB: `nvidia-smi mig -lgip` on an H100 80GB HBM3 (SM, DEC, ENC, CE, JPEG, OFA, GiB:
//!   1g.10gb 16/1/0/1/1/0/9.75, +me 16/1/0/1/1/1/9.75, 1g.20gb 26/1/0/1/1/0/19.62, 2g.20gb
//!   32/2/0/2/2/0/19.62, 3g.40gb 60/3/0/3/3/0/39.50, 4g.40gb 64/4/0/4/4/0/39.50, 7g.80gb
//!   132/7/0/8/7/1/79.25); MiB = GiB × 1024 (19.62 read as 20096, the multiple of 128 that prints so).
//!
//! All three have 7 compute slices and 8 memory slices; placements are `{start, size}` in memory
//! slices and are the same on all three (`nvmlDeviceGetGpuInstancePossiblePlacements_v2`).
//! Compute instance (CI) profiles follow go-nvml's mock: a GI of G slices offers CIs of
//! 1, 2, 3, 4 or 7 slices (`NVML_COMPUTE_INSTANCE_PROFILE_*` 0x0-0x4, which is also the CI
//! profile id) where the mock lists them: G=1 {1}, 2 {1,2}, 3 {1,2,3}, 4 {1,2,4}, 7 {1,2,3,4,7}.

/// One GPU instance profile of one GPU model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct GiProfile {
    /// `NVML_GPU_INSTANCE_PROFILE_*`: what `nvmlDeviceGetGpuInstanceProfileInfo` takes.
    pub(crate) index: u32,
    /// The profile id `info.id` returns (19 for 1g, 0 for 7g, …).
    pub(crate) id: u32,
    /// Compute slices (the `g` of `1g.5gb`).
    pub(crate) slices: u32,
    /// Memory slices one instance occupies (the placement `size`).
    pub(crate) memory_slices: u32,
    /// How many instances of this profile fit the GPU.
    pub(crate) instances: u32,
    pub(crate) sms: u32,
    pub(crate) copy_engines: u32,
    pub(crate) decoders: u32,
    pub(crate) encoders: u32,
    pub(crate) jpegs: u32,
    pub(crate) ofas: u32,
    pub(crate) memory_mib: u64,
    /// Placement starts, in memory slices.
    pub(crate) starts: &'static [u32],
    /// `+me` for the media-extension profile, else empty.
    pub(crate) suffix: &'static str,
}

/// The MIG profiles of one GPU model.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct ProfileTable {
    /// The name a node description uses for this table (`a100-sxm4-40gb`).
    pub(crate) key: &'static str,
    /// Compute slices of the whole GPU.
    pub(crate) compute_slices: u32,
    /// Memory slices of the whole GPU.
    pub(crate) memory_slices: u32,
    /// `nvmlDeviceGetMaxMigDeviceCount` with MIG on: one MIG device per compute slice.
    pub(crate) max_mig_devices: u32,
    /// Compute-slice SMs by CI size (1, 2, 3, 4 slices); a CI spanning its GI has the GI's SMs.
    pub(crate) ci_sms: [u32; 4],
    pub(crate) gi: &'static [GiProfile],
}

const ONE_SLICE_STARTS: &[u32] = &[0, 1, 2, 3, 4, 5, 6];
const TWO_SLICE_STARTS: &[u32] = &[0, 2, 4];
const DOUBLE_ONE_SLICE_STARTS: &[u32] = &[0, 2, 4, 6];
const THREE_SLICE_STARTS: &[u32] = &[0, 4];
const FOUR_SLICE_STARTS: &[u32] = &[0];
const SEVEN_SLICE_STARTS: &[u32] = &[0];

/// Builds the A100 rows, which differ between 40 and 80 GB only in memory.
const fn a100(memory_mib: [u64; 4]) -> [GiProfile; 7] {
    let [one, two, four, all] = memory_mib;
    [
        gi(
            0x0,
            19,
            1,
            1,
            7,
            14,
            [1, 0, 0, 0, 0],
            one,
            ONE_SLICE_STARTS,
            "",
        ),
        gi(
            0x7,
            20,
            1,
            1,
            1,
            14,
            [1, 1, 0, 1, 1],
            one,
            ONE_SLICE_STARTS,
            "+me",
        ),
        gi(
            0x9,
            15,
            1,
            2,
            4,
            14,
            [1, 1, 0, 0, 0],
            two,
            DOUBLE_ONE_SLICE_STARTS,
            "",
        ),
        gi(
            0x1,
            14,
            2,
            2,
            3,
            28,
            [2, 1, 0, 0, 0],
            two,
            TWO_SLICE_STARTS,
            "",
        ),
        gi(
            0x2,
            9,
            3,
            4,
            2,
            42,
            [3, 2, 0, 0, 0],
            four,
            THREE_SLICE_STARTS,
            "",
        ),
        gi(
            0x3,
            5,
            4,
            4,
            1,
            56,
            [4, 2, 0, 0, 0],
            four,
            FOUR_SLICE_STARTS,
            "",
        ),
        gi(
            0x4,
            0,
            7,
            8,
            1,
            98,
            [7, 5, 0, 1, 1],
            all,
            SEVEN_SLICE_STARTS,
            "",
        ),
    ]
}

/// One row: engines are `[copy, decoders, encoders, jpeg, ofa]`.
#[allow(clippy::too_many_arguments)] // a table row, read against its source column by column
const fn gi(
    index: u32,
    id: u32,
    slices: u32,
    memory_slices: u32,
    instances: u32,
    sms: u32,
    engines: [u32; 5],
    memory_mib: u64,
    starts: &'static [u32],
    suffix: &'static str,
) -> GiProfile {
    GiProfile {
        index,
        id,
        slices,
        memory_slices,
        instances,
        sms,
        copy_engines: engines[0],
        decoders: engines[1],
        encoders: engines[2],
        jpegs: engines[3],
        ofas: engines[4],
        memory_mib,
        starts,
        suffix,
    }
}

const A100_40GB_GI: [GiProfile; 7] = a100([4864, 9856, 19968, 40192]);
const A100_80GB_GI: [GiProfile; 7] = a100([9856, 19968, 40192, 80384]);
const H100_80GB_GI: [GiProfile; 7] = [
    gi(
        0x0,
        19,
        1,
        1,
        7,
        16,
        [1, 1, 0, 1, 0],
        9984,
        ONE_SLICE_STARTS,
        "",
    ),
    gi(
        0x7,
        20,
        1,
        1,
        1,
        16,
        [1, 1, 0, 1, 1],
        9984,
        ONE_SLICE_STARTS,
        "+me",
    ),
    gi(
        0x9,
        15,
        1,
        2,
        4,
        26,
        [1, 1, 0, 1, 0],
        20096,
        DOUBLE_ONE_SLICE_STARTS,
        "",
    ),
    gi(
        0x1,
        14,
        2,
        2,
        3,
        32,
        [2, 2, 0, 2, 0],
        20096,
        TWO_SLICE_STARTS,
        "",
    ),
    gi(
        0x2,
        9,
        3,
        4,
        2,
        60,
        [3, 3, 0, 3, 0],
        40448,
        THREE_SLICE_STARTS,
        "",
    ),
    gi(
        0x3,
        5,
        4,
        4,
        1,
        64,
        [4, 4, 0, 4, 0],
        40448,
        FOUR_SLICE_STARTS,
        "",
    ),
    gi(
        0x4,
        0,
        7,
        8,
        1,
        132,
        [8, 7, 0, 7, 1],
        81152,
        SEVEN_SLICE_STARTS,
        "",
    ),
];

/// Every table, by the key a node description names it with.
pub(crate) const TABLES: &[ProfileTable] = &[
    ProfileTable {
        key: "a100-sxm4-40gb",
        compute_slices: 7,
        memory_slices: 8,
        max_mig_devices: 7,
        ci_sms: [14, 28, 42, 56],
        gi: &A100_40GB_GI,
    },
    ProfileTable {
        key: "a100-80gb",
        compute_slices: 7,
        memory_slices: 8,
        max_mig_devices: 7,
        ci_sms: [14, 28, 42, 56],
        gi: &A100_80GB_GI,
    },
    ProfileTable {
        key: "h100-80gb",
        compute_slices: 7,
        memory_slices: 8,
        max_mig_devices: 7,
        ci_sms: [16, 32, 60, 64],
        gi: &H100_80GB_GI,
    },
];

/// `NVML_GPU_INSTANCE_PROFILE_COUNT` in current `nvml.h` (0x12): profile indices below it that a
/// table lacks are `NOT_SUPPORTED`, indices from it on are `INVALID_ARGUMENT`.
pub(crate) const GI_PROFILE_COUNT: u32 = 0x12;

/// `NVML_COMPUTE_INSTANCE_PROFILE_COUNT` (0x9).
pub(crate) const CI_PROFILE_COUNT: u32 = 0x9;

/// `NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED`, the only engine profile.
pub(crate) const CI_ENGINE_PROFILE_SHARED: u32 = 0;

/// A compute instance profile of a GI profile.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CiProfile {
    /// `NVML_COMPUTE_INSTANCE_PROFILE_*`, which is also the CI profile id.
    pub(crate) id: u32,
    pub(crate) slices: u32,
    /// How many such CIs fit the GI.
    pub(crate) instances: u32,
    pub(crate) sms: u32,
}

impl ProfileTable {
    /// The table a node description names.
    pub(crate) fn by_key(key: &str) -> Option<&'static ProfileTable> {
        TABLES.iter().find(|t| t.key == key)
    }

    /// The table keys, for error messages.
    pub(crate) fn keys() -> String {
        TABLES.iter().map(|t| t.key).collect::<Vec<_>>().join(", ")
    }

    /// The GI profile with this id (19, 9, …).
    pub(crate) fn by_id(&self, id: u32) -> Option<&'static GiProfile> {
        self.gi.iter().find(|p| p.id == id)
    }

    /// The GI profile with this `NVML_GPU_INSTANCE_PROFILE_*` index.
    pub(crate) fn by_index(&self, index: u32) -> Option<&'static GiProfile> {
        self.gi.iter().find(|p| p.index == index)
    }

    /// The CI profile `ci_id` of a GI profile, if that GI offers it.
    pub(crate) fn ci_profile(&self, gi: &GiProfile, ci_id: u32) -> Option<CiProfile> {
        let slices = match ci_id {
            0 => 1,
            1 => 2,
            2 => 3,
            3 => 4,
            4 => 7,
            _ => return None,
        };
        let offered: &[u32] = match gi.slices {
            1 => &[1],
            2 => &[1, 2],
            3 => &[1, 2, 3],
            4 => &[1, 2, 4],
            7 => &[1, 2, 3, 4, 7],
            _ => &[],
        };
        if !offered.contains(&slices) {
            return None;
        }
        let sms = if slices == gi.slices {
            gi.sms
        } else {
            self.ci_sms[slices as usize - 1]
        };
        Some(CiProfile {
            id: ci_id,
            slices,
            instances: gi.slices / slices,
            sms,
        })
    }

    /// The CI profile spanning the whole GI (what `nvidia-smi mig -cgi … -C` creates).
    pub(crate) fn full_ci_profile(&self, gi: &GiProfile) -> CiProfile {
        (0..5)
            .filter_map(|id| self.ci_profile(gi, id))
            .find(|ci| ci.slices == gi.slices)
            .unwrap_or(CiProfile {
                id: 0,
                slices: gi.slices,
                instances: 1,
                sms: gi.sms,
            })
    }
}

/// The `GB` of a profile name, as NVIDIA derives it from the instance's and the GPU's memory:
/// the instance's fraction of the GPU rounded up to eighths, times the GPU's memory in whole GiB
/// (rounded up), rounded (go-nvlib `pkg/nvlib/device/mig_profile.go`, `getMigMemorySizeGB`).
/// Names therefore drift with the memory a driver reports (mig-parted #31: `3g.39gb`).
pub(crate) fn memory_gb(instance_mib: u64, gpu_total_bytes: u64) -> u64 {
    const GIB: u64 = 1 << 30;
    let eighths = (instance_mib << 20)
        .saturating_mul(8)
        .div_ceil(gpu_total_bytes.max(1));
    let gpu_gib = gpu_total_bytes.div_ceil(GIB);
    // round(eighths / 8 × gpu_gib), half away from zero
    (eighths * gpu_gib * 2 + 8) / 16
}

/// The GI profile's name as NVML reports it: `MIG 1g.5gb`, `MIG 1g.5gb+me`.
pub(crate) fn gi_profile_name(gi: &GiProfile, gpu_total_bytes: u64) -> String {
    format!("MIG {}", gi_short_name(gi, gpu_total_bytes))
}

/// `1g.5gb`, `1g.5gb+me`: the profile as `nvidia-smi -L` and device names print it.
pub(crate) fn gi_short_name(gi: &GiProfile, gpu_total_bytes: u64) -> String {
    let gb = memory_gb(gi.memory_mib, gpu_total_bytes);
    format!("{}g.{gb}gb{}", gi.slices, gi.suffix)
}

/// `1c.7g.40gb` for a CI smaller than its GI, else the GI's short name.
pub(crate) fn mig_device_profile_name(
    gi: &GiProfile,
    ci: &CiProfile,
    gpu_total_bytes: u64,
) -> String {
    if ci.slices == gi.slices {
        gi_short_name(gi, gpu_total_bytes)
    } else {
        format!("{}c.{}", ci.slices, gi_short_name(gi, gpu_total_bytes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A100_40GB: u64 = 40960 << 20;
    const A100_80GB: u64 = 81920 << 20;
    /// What an H100 80GB HBM3 reports: 81559 MiB.
    const H100_80GB: u64 = 81559 << 20;

    fn names(key: &str, total: u64) -> Vec<(u32, String)> {
        let t = ProfileTable::by_key(key).expect("table");
        t.gi.iter()
            .map(|p| (p.id, gi_short_name(p, total)))
            .collect()
    }

    #[test]
    fn names_are_nvidias() {
        let want = |v: &[(u32, &str)]| {
            v.iter()
                .map(|(i, n)| (*i, (*n).to_owned()))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            names("a100-sxm4-40gb", A100_40GB),
            want(&[
                (19, "1g.5gb"),
                (20, "1g.5gb+me"),
                (15, "1g.10gb"),
                (14, "2g.10gb"),
                (9, "3g.20gb"),
                (5, "4g.20gb"),
                (0, "7g.40gb")
            ])
        );
        assert_eq!(
            names("a100-80gb", A100_80GB),
            want(&[
                (19, "1g.10gb"),
                (20, "1g.10gb+me"),
                (15, "1g.20gb"),
                (14, "2g.20gb"),
                (9, "3g.40gb"),
                (5, "4g.40gb"),
                (0, "7g.80gb")
            ])
        );
        assert_eq!(
            names("h100-80gb", H100_80GB),
            want(&[
                (19, "1g.10gb"),
                (20, "1g.10gb+me"),
                (15, "1g.20gb"),
                (14, "2g.20gb"),
                (9, "3g.40gb"),
                (5, "4g.40gb"),
                (0, "7g.80gb")
            ])
        );
    }

    #[test]
    fn names_drift_with_reported_memory() {
        // The same 3g instance on a GPU reporting more memory: 40192 MiB of 92000 MiB rounds
        // up to 4/8, times 90 whole GiB, so the name says 45gb.
        let p = ProfileTable::by_key("a100-80gb")
            .and_then(|t| t.by_id(9))
            .expect("3g");
        assert_eq!(memory_gb(p.memory_mib, 81920 << 20), 40);
        assert_eq!(memory_gb(p.memory_mib, 92_000 << 20), 45);
    }

    #[test]
    fn tables_fit_their_gpu() {
        for t in TABLES {
            for p in t.gi {
                for &start in p.starts {
                    assert!(
                        start + p.memory_slices <= t.memory_slices,
                        "{} {}",
                        t.key,
                        p.id
                    );
                }
                assert!(p.instances as usize <= p.starts.len(), "{} {}", t.key, p.id);
                assert_eq!(t.full_ci_profile(p).slices, p.slices);
            }
        }
        let t = ProfileTable::by_key("a100-sxm4-40gb").expect("table");
        let seven = t.by_id(0).expect("7g");
        let one_c = t.ci_profile(seven, 0).expect("1c");
        assert_eq!((one_c.sms, one_c.instances), (14, 7));
        assert_eq!(
            mig_device_profile_name(seven, &one_c, A100_40GB),
            "1c.7g.40gb"
        );
        assert_eq!(
            t.ci_profile(t.by_id(5).expect("4g"), 2),
            None,
            "no 3-slice CI in a 4g GI"
        );
        assert_eq!(t.by_index(0x9).map(|p| p.id), Some(15));
    }
}
