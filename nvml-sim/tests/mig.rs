//! MIG as NVML clients see it: the shipped MIG nodes read back through nvml-wrapper and through
//! NVIDIA's raw prototypes (nvml-wrapper-sys) compared with their node descriptions; every MIG
//! call's error cases; MIG XIDs in event data; the driver's `/proc` files.
#![allow(clippy::unwrap_used)] // a failed unwrap fails the test at its line

mod common;

use std::ffi::{CStr, c_char, c_uint};
use std::ptr;

use common::{gpu_json, node_json, open, raw};
use mesos_gpu_testkit::nvml_sim::SimNode;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper_sys::bindings::{
    self as b, NvmlLib, nvmlComputeInstance_t, nvmlDevice_t, nvmlGpuInstance_t,
};
use serde_json::Value;

const SUCCESS: u32 = b::nvmlReturn_enum_NVML_SUCCESS;
const INVALID_ARGUMENT: u32 = b::nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;
const NOT_SUPPORTED: u32 = b::nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED;
const NOT_FOUND: u32 = b::nvmlReturn_enum_NVML_ERROR_NOT_FOUND;
const GPU_IS_LOST: u32 = b::nvmlReturn_enum_NVML_ERROR_GPU_IS_LOST;

/// `nvmlGpuInstanceProfileInfo_v2` / `_v3` and the CI equivalents, as nvml.h defines them
/// (`NVML_STRUCT_VERSION`), from nvml-wrapper-sys's struct sizes.
#[allow(clippy::cast_possible_truncation)] // the structs are a few hundred bytes
const GI_INFO_V2: u32 =
    (std::mem::size_of::<b::nvmlGpuInstanceProfileInfo_v2_t>() as u32) | (2 << 24);
#[allow(clippy::cast_possible_truncation)] // as above
const GI_INFO_V3: u32 =
    (std::mem::size_of::<b::nvmlGpuInstanceProfileInfo_v3_t>() as u32) | (3 << 24);
#[allow(clippy::cast_possible_truncation)] // as above
const CI_INFO_V2: u32 =
    (std::mem::size_of::<b::nvmlComputeInstanceProfileInfo_v2_t>() as u32) | (2 << 24);

fn shipped(name: &str) -> Value {
    let json = nvml_sim::TOPOLOGIES.iter().find(|t| t.0 == name).unwrap().1;
    serde_json::from_str(json).unwrap()
}

/// Initialises the raw library; the caller shuts it down.
fn init(lib: &NvmlLib) {
    // SAFETY: nvml.h prototype, no arguments.
    assert_eq!(unsafe { lib.nvmlInit_v2() }, SUCCESS);
}

fn gpu(lib: &NvmlLib, index: u32) -> nvmlDevice_t {
    let mut dev = ptr::null_mut();
    // SAFETY: `dev` is a live local the call writes one handle into.
    let rc = unsafe { lib.nvmlDeviceGetHandleByIndex_v2(index, &mut dev) };
    assert_eq!(rc, SUCCESS);
    dev
}

fn mig(lib: &NvmlLib, parent: nvmlDevice_t, index: u32) -> Result<nvmlDevice_t, u32> {
    let mut dev = ptr::null_mut();
    // SAFETY: `dev` is a live local the call writes one handle into.
    match unsafe { lib.nvmlDeviceGetMigDeviceHandleByIndex(parent, index, &mut dev) } {
        SUCCESS => Ok(dev),
        rc => Err(rc),
    }
}

fn uint(f: impl FnOnce(*mut c_uint) -> u32) -> Result<u32, u32> {
    let mut v: c_uint = 0xdead;
    match f(&mut v) {
        SUCCESS => Ok(v),
        rc => Err(rc),
    }
}

fn text(buf: &[c_char]) -> String {
    // SAFETY: the sim NUL-terminates every string it writes, within the buffer.
    unsafe { CStr::from_ptr(buf.as_ptr()) }
        .to_string_lossy()
        .into_owned()
}

/// Every MIG device of every GPU of a shipped node, read through nvml-wrapper, agrees with the
/// description: count, sparse indices, ids, UUIDs, names, memory, attributes, parent.
fn check_layout(name: &str) {
    let node = shipped(name);
    let sim = SimNode::shipped(name);
    let nvml = open(&sim);
    let lib = raw(&sim);
    init(&lib);
    for g in node["gpus"].as_array().unwrap() {
        let index = u32::try_from(g["index"].as_u64().unwrap()).unwrap();
        let ctx = format!("{name} GPU {index}");
        let dev = nvml.device_by_index(index).unwrap();
        let raw_dev = gpu(&lib, index);
        let mig_on = g.get("mig").is_some_and(|m| m["current"] == true);
        assert_eq!(dev.mig_mode().unwrap().current, u32::from(mig_on), "{ctx}");
        assert_eq!(
            dev.mig_device_count().unwrap(),
            if mig_on { 7 } else { 0 },
            "{ctx}"
        );
        assert!(!dev.mig_is_mig_device_handle().unwrap(), "{ctx}");
        if !mig_on {
            assert!(
                matches!(dev.mig_device_by_index(0), Err(NvmlError::NotSupported)),
                "{ctx}"
            );
            continue;
        }
        let mut want = Vec::new();
        for gi in g["mig"]["gpu_instances"].as_array().unwrap() {
            let cis: Vec<(u64, u64)> = match gi.get("compute_instances") {
                None => vec![(0, 99)],
                Some(l) => l
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|c| {
                        (
                            c["id"].as_u64().unwrap(),
                            c.get("profile").map_or(99, |p| p.as_u64().unwrap()),
                        )
                    })
                    .collect(),
            };
            for (ci, ci_profile) in cis {
                want.push((
                    gi["id"].as_u64().unwrap(),
                    ci,
                    gi["profile"].as_u64().unwrap(),
                    ci_profile,
                ));
            }
        }
        let mut seen = Vec::new();
        for i in 0..7 {
            let m = match dev.mig_device_by_index(i) {
                Ok(m) => m,
                Err(NvmlError::NotFound) => continue,
                Err(e) => panic!("{ctx} MIG {i}: {e}"),
            };
            let raw_m = mig(&lib, raw_dev, i).unwrap();
            assert!(m.mig_is_mig_device_handle().unwrap());
            assert_eq!(
                m.index().unwrap(),
                i,
                "{ctx}: GetIndex on a MIG handle is its MIG index"
            );
            assert_eq!(
                m.mig_parent_device().unwrap().index().unwrap(),
                index,
                "{ctx}"
            );
            // SAFETY: nvml.h prototypes; pointers are live locals.
            let gi_id = uint(|p| unsafe { lib.nvmlDeviceGetGpuInstanceId(raw_m, p) }).unwrap();
            // SAFETY: as above.
            let ci_id = uint(|p| unsafe { lib.nvmlDeviceGetComputeInstanceId(raw_m, p) }).unwrap();
            let uuid = m.uuid().unwrap();
            assert!(
                uuid.starts_with("MIG-") && uuid.len() == 40,
                "{ctx}: {uuid}"
            );
            assert_eq!(
                nvml.device_by_uuid(uuid.as_str()).unwrap().index().unwrap(),
                i,
                "{ctx}"
            );
            let attrs = m.attributes().unwrap();
            let mem = m.memory_info().unwrap();
            assert_eq!(
                mem.total,
                attrs.memory_size_mb << 20,
                "{ctx}: a MIG device has its GPU instance's memory"
            );
            let name = m.name().unwrap();
            assert!(
                name.starts_with(&format!("{} MIG ", g["name"].as_str().unwrap())),
                "{ctx}: {name}"
            );
            assert!(
                matches!(m.utilization_rates(), Err(NvmlError::NotSupported)),
                "{ctx}"
            );
            assert!(
                matches!(m.pci_info(), Err(NvmlError::NotSupported)),
                "{ctx}: whole-GPU call"
            );
            let w = want
                .iter()
                .find(|w| w.0 == u64::from(gi_id) && w.1 == u64::from(ci_id));
            let w = w.unwrap_or_else(|| panic!("{ctx}: GI {gi_id} CI {ci_id} is not described"));
            let profile = dev
                .profile_info(profile_index(&lib, raw_dev, u32::try_from(w.2).unwrap()))
                .unwrap();
            assert_eq!(u64::from(profile.id), w.2, "{ctx}");
            assert_eq!(attrs.gpu_instance_slice_count, profile.slice_count, "{ctx}");
            assert_eq!(attrs.memory_size_mb, profile.memory_size_mb, "{ctx}");
            if w.3 == 99 {
                assert_eq!(
                    attrs.compute_instance_slice_count, profile.slice_count,
                    "{ctx}: a full CI"
                );
                assert_eq!(
                    attrs.multiprocessor_count, profile.multiprocessor_count,
                    "{ctx}"
                );
            }
            seen.push((u64::from(gi_id), u64::from(ci_id)));
        }
        let mut want_ids: Vec<(u64, u64)> = want.iter().map(|w| (w.0, w.1)).collect();
        want_ids.sort_unstable();
        seen.sort_unstable();
        assert_eq!(seen, want_ids, "{ctx}: every described MIG device, once");
        assert!(
            matches!(dev.mig_device_by_index(7), Err(NvmlError::InvalidArg)),
            "{ctx}"
        );
        assert!(
            matches!(dev.utilization_rates(), Err(NvmlError::NotSupported)),
            "{ctx}"
        );
    }
    // SAFETY: nvml.h prototype.
    assert_eq!(unsafe { lib.nvmlShutdown() }, SUCCESS);
}

/// The `NVML_GPU_INSTANCE_PROFILE_*` index whose profile has `id`, found the forward-compatible
/// way (loop over indices until `INVALID_ARGUMENT`).
fn profile_index(lib: &NvmlLib, dev: nvmlDevice_t, id: u32) -> u32 {
    for index in 0.. {
        // SAFETY: zeroed is a valid value of this plain C struct.
        let mut info: b::nvmlGpuInstanceProfileInfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: nvml.h prototype; `info` is a live local.
        match unsafe { lib.nvmlDeviceGetGpuInstanceProfileInfo(dev, index, &mut info) } {
            SUCCESS if info.id == id => return index,
            SUCCESS | NOT_SUPPORTED => {}
            INVALID_ARGUMENT => break,
            rc => panic!("profile index {index}: {rc}"),
        }
    }
    panic!("no profile with id {id}")
}

#[test]
fn dgx_a100_mig_layout_agrees_with_its_description() {
    check_layout("dgx-a100-mig");
}

#[test]
fn mixed_node_layout_agrees_with_its_description() {
    check_layout("dgx-a100-mixed");
}

#[test]
fn hgx_h100_layout_agrees_with_its_description() {
    check_layout("hgx-h100");
}

#[test]
fn profile_tables_are_nvidias() {
    // (table node GPU, profile index → (id, slices, instances, SMs, MiB, name)) as nvidia-smi
    // mig -lgip prints them (A100-SXM4-40GB on R470-R535, H100 80GB HBM3).
    /// (profile index, id, slices, instances, SMs, MiB, name).
    type Row = (u32, u32, u32, u32, u32, u64, &'static str);
    let cases: &[(&str, u32, &[Row])] = &[
        (
            "dgx-a100-mig",
            0,
            &[
                (0x0, 19, 1, 7, 14, 4864, "MIG 1g.5gb"),
                (0x7, 20, 1, 1, 14, 4864, "MIG 1g.5gb+me"),
                (0x9, 15, 1, 4, 14, 9856, "MIG 1g.10gb"),
                (0x1, 14, 2, 3, 28, 9856, "MIG 2g.10gb"),
                (0x2, 9, 3, 2, 42, 19968, "MIG 3g.20gb"),
                (0x3, 5, 4, 1, 56, 19968, "MIG 4g.20gb"),
                (0x4, 0, 7, 1, 98, 40192, "MIG 7g.40gb"),
            ],
        ),
        (
            "hgx-h100",
            0,
            &[
                (0x0, 19, 1, 7, 16, 9984, "MIG 1g.10gb"),
                (0x7, 20, 1, 1, 16, 9984, "MIG 1g.10gb+me"),
                (0x9, 15, 1, 4, 26, 20096, "MIG 1g.20gb"),
                (0x1, 14, 2, 3, 32, 20096, "MIG 2g.20gb"),
                (0x2, 9, 3, 2, 60, 40448, "MIG 3g.40gb"),
                (0x3, 5, 4, 1, 64, 40448, "MIG 4g.40gb"),
                (0x4, 0, 7, 1, 132, 81152, "MIG 7g.80gb"),
            ],
        ),
    ];
    for (name, index, rows) in cases {
        let sim = SimNode::shipped(name);
        let lib = raw(&sim);
        init(&lib);
        let dev = gpu(&lib, *index);
        for &(profile, id, slices, instances, sms, mib, want_name) in *rows {
            for version in [GI_INFO_V2, GI_INFO_V3] {
                // SAFETY: zeroed is a valid value of this plain C struct (v3 has v2's size).
                let mut info: b::nvmlGpuInstanceProfileInfo_v2_t = unsafe { std::mem::zeroed() };
                info.version = version;
                // SAFETY: nvml.h prototype; `info` is a live local of the versioned size.
                let rc =
                    unsafe { lib.nvmlDeviceGetGpuInstanceProfileInfoV(dev, profile, &mut info) };
                assert_eq!(rc, SUCCESS);
                if version == GI_INFO_V2 {
                    assert_eq!(
                        (
                            info.id,
                            info.sliceCount,
                            info.instanceCount,
                            info.multiprocessorCount,
                            info.memorySizeMB
                        ),
                        (id, slices, instances, sms, mib),
                        "{name} profile {profile}"
                    );
                    assert_eq!(text(&info.name), want_name, "{name} profile {profile}");
                } else {
                    // SAFETY: the sim wrote a v3 struct, which has the same size.
                    let v3: b::nvmlGpuInstanceProfileInfo_v3_t =
                        unsafe { std::mem::transmute(info) };
                    assert_eq!(
                        (v3.id, v3.sliceCount, v3.memorySizeMB),
                        (id, slices, mib),
                        "{name} v3"
                    );
                    assert_eq!(text(&v3.name), want_name, "{name} v3");
                }
            }
            // By id, as nvidia-smi -cgi takes it.
            // SAFETY: as above.
            let mut info: b::nvmlGpuInstanceProfileInfo_v2_t = unsafe { std::mem::zeroed() };
            info.version = GI_INFO_V2;
            // SAFETY: nvml.h prototype; `info` is a live local.
            let rc = unsafe { lib.nvmlDeviceGetGpuInstanceProfileInfoByIdV(dev, id, &mut info) };
            assert_eq!(rc, SUCCESS);
            assert_eq!(info.sliceCount, slices);
        }
        // Profile indices the GPU lacks, below NVML_GPU_INSTANCE_PROFILE_COUNT (0x12), and past it.
        // SAFETY: zeroed is a valid value of this plain C struct.
        let mut v1: b::nvmlGpuInstanceProfileInfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: nvml.h prototypes; `v1` is a live local.
        unsafe {
            assert_eq!(
                lib.nvmlDeviceGetGpuInstanceProfileInfo(dev, 0x5, &mut v1),
                NOT_SUPPORTED
            );
            assert_eq!(
                lib.nvmlDeviceGetGpuInstanceProfileInfo(dev, 0x11, &mut v1),
                NOT_SUPPORTED
            );
            assert_eq!(
                lib.nvmlDeviceGetGpuInstanceProfileInfo(dev, 0x12, &mut v1),
                INVALID_ARGUMENT
            );
            assert_eq!(
                lib.nvmlDeviceGetGpuInstanceProfileInfo(dev, 0, ptr::null_mut()),
                INVALID_ARGUMENT
            );
        }
        // A wrong struct version.
        // SAFETY: zeroed is a valid value of this plain C struct.
        let mut bad: b::nvmlGpuInstanceProfileInfo_v2_t = unsafe { std::mem::zeroed() };
        bad.version = 1 << 24;
        // SAFETY: nvml.h prototype; `bad` is a live local.
        let rc = unsafe { lib.nvmlDeviceGetGpuInstanceProfileInfoV(dev, 0, &mut bad) };
        assert_eq!(rc, INVALID_ARGUMENT);
        // SAFETY: nvml.h prototype.
        assert_eq!(unsafe { lib.nvmlShutdown() }, SUCCESS);
    }
}

#[test]
fn profile_queries_with_mig_off() {
    let sim = SimNode::shipped("dgx-a100");
    let lib = raw(&sim);
    init(&lib);
    let dev = gpu(&lib, 0);
    // SAFETY: zeroed is a valid value of these plain C structs.
    let (mut v1, mut v2): (
        b::nvmlGpuInstanceProfileInfo_t,
        b::nvmlGpuInstanceProfileInfo_v2_t,
    ) = unsafe { (std::mem::zeroed(), std::mem::zeroed()) };
    v2.version = GI_INFO_V2;
    let mut placements = [b::nvmlGpuInstancePlacement_t {
        start: 99,
        size: 99,
    }; 8];
    // SAFETY: nvml.h prototypes; every pointer is a live local of the right size.
    unsafe {
        assert_eq!(
            lib.nvmlDeviceGetGpuInstanceProfileInfo(dev, 0, &mut v1),
            SUCCESS,
            "v1 answers whatever the mode"
        );
        assert_eq!(v1.id, 19);
        assert_eq!(
            lib.nvmlDeviceGetGpuInstanceProfileInfoV(dev, 0, &mut v2),
            NOT_SUPPORTED,
            "V needs MIG on"
        );
        let mut count = 0;
        assert_eq!(
            lib.nvmlDeviceGetGpuInstancePossiblePlacements_v2(dev, 9, ptr::null_mut(), &mut count),
            SUCCESS
        );
        assert_eq!(count, 2);
        assert_eq!(
            lib.nvmlDeviceGetGpuInstancePossiblePlacements_v2(
                dev,
                19,
                placements.as_mut_ptr(),
                &mut count
            ),
            SUCCESS
        );
        let got: Vec<(u32, u32)> = placements[..count as usize]
            .iter()
            .map(|p| (p.start, p.size))
            .collect();
        assert_eq!(
            got,
            [(0, 1), (1, 1), (2, 1), (3, 1), (4, 1), (5, 1), (6, 1)]
        );
        assert_eq!(
            lib.nvmlDeviceGetGpuInstancePossiblePlacements_v2(
                dev,
                15,
                placements.as_mut_ptr(),
                &mut count
            ),
            SUCCESS
        );
        let got: Vec<(u32, u32)> = placements[..count as usize]
            .iter()
            .map(|p| (p.start, p.size))
            .collect();
        assert_eq!(got, [(0, 2), (2, 2), (4, 2), (6, 2)]);
        assert_eq!(
            lib.nvmlDeviceGetGpuInstancePossiblePlacements_v2(
                dev,
                0,
                placements.as_mut_ptr(),
                &mut count
            ),
            SUCCESS
        );
        assert_eq!((count, placements[0].start, placements[0].size), (1, 0, 8));
        assert_eq!(
            lib.nvmlDeviceGetGpuInstancePossiblePlacements_v2(dev, 42, ptr::null_mut(), &mut count),
            NOT_SUPPORTED
        );
        assert_eq!(
            lib.nvmlDeviceGetGpuInstancePossiblePlacements_v2(
                dev,
                19,
                ptr::null_mut(),
                ptr::null_mut()
            ),
            INVALID_ARGUMENT
        );
        let mut gis: [nvmlGpuInstance_t; 7] = [ptr::null_mut(); 7];
        assert_eq!(
            lib.nvmlDeviceGetGpuInstances(dev, 19, gis.as_mut_ptr(), &mut count),
            NOT_SUPPORTED
        );
        assert_eq!(
            lib.nvmlDeviceGetMigDeviceHandleByIndex(dev, 0, &mut gis[0].cast()),
            NOT_SUPPORTED
        );
        assert_eq!(lib.nvmlShutdown(), SUCCESS);
    }
    // A GPU without MIG: no profiles, MIG count 0.
    let v100 = SimNode::shipped("dgx1-v100");
    let nvml = open(&v100);
    let d = nvml.device_by_index(0).unwrap();
    assert_eq!(d.mig_device_count().unwrap(), 0);
    assert!(matches!(d.profile_info(0), Err(NvmlError::NotSupported)));
    assert!(matches!(d.mig_mode(), Err(NvmlError::NotSupported)));
}

#[test]
fn instance_handles_name_a_mig_devices_profile() {
    // What go-nvlib does to name a MIG device: parent → GI by id → GI info → CI by id → CI info.
    let sim = SimNode::shipped("hgx-h100");
    let lib = raw(&sim);
    init(&lib);
    let dev = gpu(&lib, 2);
    let mut count = 0;
    // SAFETY: nvml.h prototypes throughout; every pointer is a live local of the right size.
    unsafe {
        // GPU 2: a 4g.40gb (GI 1) and a 3g.40gb (GI 2) split into three 1-slice CIs.
        let mut gis: [nvmlGpuInstance_t; 2] = [ptr::null_mut(); 2];
        assert_eq!(
            lib.nvmlDeviceGetGpuInstances(dev, 9, gis.as_mut_ptr(), &mut count),
            SUCCESS
        );
        assert_eq!(count, 1);
        let mut gi: nvmlGpuInstance_t = ptr::null_mut();
        assert_eq!(lib.nvmlDeviceGetGpuInstanceById(dev, 2, &mut gi), SUCCESS);
        assert_eq!(gi, gis[0], "the same GI handle both ways");
        assert_eq!(lib.nvmlDeviceGetGpuInstanceById(dev, 3, &mut gi), NOT_FOUND);
        assert_eq!(lib.nvmlDeviceGetGpuInstanceById(dev, 2, &mut gi), SUCCESS);
        let mut info: b::nvmlGpuInstanceInfo_t = std::mem::zeroed();
        assert_eq!(lib.nvmlGpuInstanceGetInfo(gi, &mut info), SUCCESS);
        assert_eq!(
            (
                info.device,
                info.id,
                info.profileId,
                info.placement.start,
                info.placement.size
            ),
            (dev, 2, 9, 4, 4)
        );
        let mut remaining = 0;
        assert_eq!(
            lib.nvmlDeviceGetGpuInstanceRemainingCapacity(dev, 19, &mut remaining),
            SUCCESS
        );
        assert_eq!(remaining, 0, "a full GPU has room for nothing");
        let other = gpu(&lib, 1);
        assert_eq!(
            lib.nvmlDeviceGetGpuInstanceRemainingCapacity(other, 9, &mut remaining),
            SUCCESS
        );
        assert_eq!(remaining, 0, "two 3g instances is the maximum");

        let mut ci_info: b::nvmlComputeInstanceProfileInfo_t = std::mem::zeroed();
        assert_eq!(
            lib.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, 0, 0, &mut ci_info),
            SUCCESS
        );
        assert_eq!(
            (
                ci_info.id,
                ci_info.sliceCount,
                ci_info.instanceCount,
                ci_info.multiprocessorCount
            ),
            (0, 1, 3, 16)
        );
        assert_eq!(
            lib.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, 3, 0, &mut ci_info),
            NOT_SUPPORTED,
            "no 4-slice CI in a 3g GI"
        );
        assert_eq!(
            lib.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, 9, 0, &mut ci_info),
            INVALID_ARGUMENT
        );
        assert_eq!(
            lib.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, 0, 1, &mut ci_info),
            INVALID_ARGUMENT
        );
        let mut ci_v2: b::nvmlComputeInstanceProfileInfo_v2_t = std::mem::zeroed();
        ci_v2.version = CI_INFO_V2;
        assert_eq!(
            lib.nvmlGpuInstanceGetComputeInstanceProfileInfoV(gi, 0, 0, &mut ci_v2),
            SUCCESS
        );
        assert_eq!(text(&ci_v2.name), "MIG 1c.3g.40gb");
        assert_eq!(
            lib.nvmlGpuInstanceGetComputeInstanceProfileInfoV(gi, 2, 0, &mut ci_v2),
            SUCCESS
        );
        assert_eq!(text(&ci_v2.name), "MIG 3g.40gb");

        let mut cis: [nvmlComputeInstance_t; 3] = [ptr::null_mut(); 3];
        assert_eq!(
            lib.nvmlGpuInstanceGetComputeInstances(gi, 0, cis.as_mut_ptr(), &mut count),
            SUCCESS
        );
        assert_eq!(count, 3);
        let mut ci: nvmlComputeInstance_t = ptr::null_mut();
        assert_eq!(
            lib.nvmlGpuInstanceGetComputeInstanceById(gi, 1, &mut ci),
            SUCCESS
        );
        assert_eq!(
            lib.nvmlGpuInstanceGetComputeInstanceById(gi, 5, &mut ci),
            NOT_FOUND
        );
        assert_eq!(
            lib.nvmlGpuInstanceGetComputeInstanceById(gi, 1, &mut ci),
            SUCCESS
        );
        let mut cinfo: b::nvmlComputeInstanceInfo_t = std::mem::zeroed();
        assert_eq!(lib.nvmlComputeInstanceGetInfo_v2(ci, &mut cinfo), SUCCESS);
        assert_eq!(
            (
                cinfo.device,
                cinfo.gpuInstance,
                cinfo.id,
                cinfo.profileId,
                cinfo.placement.start,
                cinfo.placement.size
            ),
            (dev, gi, 1, 0, 1, 1)
        );
        // The MIG device for (GI 2, CI 1): 1c.3g.40gb, 16 SMs, the GI's 40448 MiB.
        let mut name = [0 as c_char; 96];
        let found = (0..7).filter_map(|i| mig(&lib, dev, i).ok()).find(|&m| {
            uint(|p| lib.nvmlDeviceGetGpuInstanceId(m, p)) == Ok(2)
                && uint(|p| lib.nvmlDeviceGetComputeInstanceId(m, p)) == Ok(1)
        });
        let m = found.unwrap();
        assert_eq!(lib.nvmlDeviceGetName(m, name.as_mut_ptr(), 96), SUCCESS);
        assert_eq!(text(&name), "NVIDIA H100 80GB HBM3 MIG 1c.3g.40gb");
        let mut attrs: b::nvmlDeviceAttributes_t = std::mem::zeroed();
        assert_eq!(lib.nvmlDeviceGetAttributes_v2(m, &mut attrs), SUCCESS);
        assert_eq!(
            (
                attrs.multiprocessorCount,
                attrs.gpuInstanceSliceCount,
                attrs.computeInstanceSliceCount,
                attrs.memorySizeMB
            ),
            (16, 3, 1, 40448)
        );
        assert_eq!(
            lib.nvmlDeviceGetAttributes_v2(dev, &mut attrs),
            NOT_SUPPORTED,
            "GPU handles have no attributes"
        );
        // Handles of the wrong kind.
        let mut parent: nvmlDevice_t = ptr::null_mut();
        assert_eq!(
            lib.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(dev, &mut parent),
            INVALID_ARGUMENT
        );
        assert_eq!(
            lib.nvmlDeviceGetMigDeviceHandleByIndex(m, 0, &mut parent),
            INVALID_ARGUMENT
        );
        assert_eq!(
            uint(|p| lib.nvmlDeviceGetGpuInstanceId(dev, p)),
            Err(NOT_SUPPORTED)
        );
        assert_eq!(
            lib.nvmlGpuInstanceGetInfo(ci.cast(), &mut info),
            INVALID_ARGUMENT
        );
        assert_eq!(lib.nvmlShutdown(), SUCCESS);
    }
}

#[test]
fn mig_uuids_and_processes() {
    let mut node: Value = shipped("dgx-a100-mixed");
    // GPU 4 GI 2 (3g.20gb) gets two compute instances with processes; an explicit UUID.
    node["gpus"][4]["mig"]["gpu_instances"][0]["compute_instances"] = serde_json::json!([
        {"id": 0, "profile": 0, "start": 2, "index": 5, "uuid": "MIG-11111111-2222-4333-8444-555555555555",
         "processes": [{"pid": 100, "used_memory": 1048576}]},
        {"id": 1, "profile": 1, "start": 0, "processes": [{"pid": 101, "used_memory": 2097152}]}
    ]);
    let json = node.to_string();
    nvml_sim::validate(&json).unwrap();
    let sim = SimNode::from_json(&json);
    let nvml = open(&sim);
    let parent = nvml.device_by_index(4).unwrap();
    let m = nvml
        .device_by_uuid("MIG-11111111-2222-4333-8444-555555555555")
        .unwrap();
    assert_eq!(m.index().unwrap(), 5, "the described MIG index");
    let parent_uuid = parent.uuid().unwrap();
    let old_form = format!("MIG-{parent_uuid}/2/0");
    assert_eq!(
        nvml.device_by_uuid(old_form.as_str())
            .unwrap()
            .index()
            .unwrap(),
        5,
        "MIG-GPU-<uuid>/<gi>/<ci>"
    );
    assert!(matches!(
        nvml.device_by_uuid("MIG-11111111-2222-4333-8444-000000000000"),
        Err(NvmlError::NotFound)
    ));
    assert!(matches!(
        nvml.device_by_uuid("MIG-nope"),
        Err(NvmlError::InvalidArg)
    ));
    let procs = m.running_compute_processes().unwrap();
    assert_eq!(
        procs
            .iter()
            .map(|p| (p.pid, p.gpu_instance_id, p.compute_instance_id))
            .collect::<Vec<_>>(),
        [(100, Some(2), Some(0))]
    );
    let all = parent.running_compute_processes().unwrap();
    assert_eq!(
        all.iter()
            .map(|p| (p.pid, p.compute_instance_id))
            .collect::<Vec<_>>(),
        [(101, Some(1)), (100, Some(0))],
        "the parent lists every instance's processes, in MIG device index order"
    );
    let mem = m.memory_info().unwrap();
    assert_eq!(
        (mem.total, mem.used),
        (19968 << 20, 3 << 20),
        "the GI's memory, used by both CIs' processes"
    );
    // Processes set at run time replace the described ones, for every client.
    sim.set_processes(&m.uuid().unwrap(), &[(200, 5 << 20)]);
    assert_eq!(
        m.running_compute_processes()
            .unwrap()
            .iter()
            .map(|p| p.pid)
            .collect::<Vec<_>>(),
        [200]
    );
    assert_eq!(m.memory_info().unwrap().used, 7 << 20);
    // A whole GPU of the same node still reads its description.
    assert_eq!(
        nvml.device_by_index(0)
            .unwrap()
            .running_compute_processes()
            .unwrap()
            .len(),
        0
    );
}

#[test]
fn xid_on_a_mig_instance_names_it_in_event_data() {
    let sim = SimNode::shipped("dgx-a100-mixed");
    let lib = raw(&sim);
    init(&lib);
    let dev = gpu(&lib, 5);
    let mut set: b::nvmlEventSet_t = ptr::null_mut();
    // SAFETY: nvml.h prototypes; pointers are live locals.
    unsafe {
        assert_eq!(lib.nvmlEventSetCreate(&mut set), SUCCESS);
        assert_eq!(
            lib.nvmlDeviceRegisterEvents(dev, u64::from(b::nvmlEventTypeXidCriticalError), set),
            SUCCESS
        );
        let m = mig(&lib, dev, 0).unwrap();
        assert_eq!(
            lib.nvmlDeviceRegisterEvents(m, u64::from(b::nvmlEventTypeXidCriticalError), set),
            NOT_SUPPORTED,
            "events are registered on the parent"
        );
    }
    sim.append_event("xid 5 31 gi 9 ci 0");
    sim.append_event("xid 5 43 gi 2");
    sim.append_event("xid 5 48");
    sim.append_event("xid 5 31 gi 4");
    let mut got = Vec::new();
    for _ in 0..3 {
        // SAFETY: zeroed is a valid value of this plain C struct.
        let mut data: b::nvmlEventData_t = unsafe { std::mem::zeroed() };
        // SAFETY: nvml.h prototype; `data` is a live local.
        let rc = unsafe { lib.nvmlEventSetWait_v2(set, &mut data, 2000) };
        assert_eq!(rc, SUCCESS);
        assert_eq!(data.device, dev);
        got.push((data.eventData, data.gpuInstanceId, data.computeInstanceId));
    }
    assert_eq!(
        got,
        [(31, 9, 0), (43, 2, u32::MAX), (48, u32::MAX, u32::MAX)]
    );
    // The line naming GI 4, which GPU 5 does not have, is reported and skipped.
    // SAFETY: zeroed is a valid value of this plain C struct.
    let mut data: b::nvmlEventData_t = unsafe { std::mem::zeroed() };
    // SAFETY: nvml.h prototypes; `data` is a live local.
    unsafe {
        assert_eq!(
            lib.nvmlEventSetWait_v2(set, &mut data, 50),
            b::nvmlReturn_enum_NVML_ERROR_TIMEOUT
        );
        assert_eq!(lib.nvmlEventSetFree(set), SUCCESS);
        assert_eq!(lib.nvmlShutdown(), SUCCESS);
    }
}

#[test]
fn lost_parent_takes_its_mig_devices() {
    let sim = SimNode::shipped("dgx-a100-mig");
    let lib = raw(&sim);
    init(&lib);
    let m = mig(&lib, gpu(&lib, 3), 2).unwrap();
    sim.append_event("lost 3");
    // SAFETY: nvml.h prototypes; pointers are live locals.
    unsafe {
        assert_eq!(
            uint(|p| lib.nvmlDeviceGetGpuInstanceId(m, p)),
            Err(GPU_IS_LOST)
        );
        let mut uuid = [0 as c_char; 96];
        assert_eq!(lib.nvmlDeviceGetUUID(m, uuid.as_mut_ptr(), 96), GPU_IS_LOST);
        assert_eq!(lib.nvmlShutdown(), SUCCESS);
    }
}

#[test]
fn bad_mig_layouts_are_refused_with_the_reason() {
    let a100 = |mig: &str| {
        node_json(&[gpu_json(0, &format!(
            r#""name": "NVIDIA A100-SXM4-40GB", "memory": {{"total": 42949672960}}, "mig": {mig}"#
        ))
        .replacen(r#""name": "Tesla V100-SXM2-16GB", "#, "", 1)
        .replacen(r#""memory": { "total": 17179869184, "used": 1048576 },"#, "", 1)])
    };
    let cases = [
        (
            r#"{"current": false, "gpu_instances": [{"id": 1, "profile": 19, "start": 0}]}"#,
            "only while MIG mode is on",
        ),
        (
            r#"{"current": true, "gpu_instances": [{"id": 1, "profile": 18, "start": 0}]}"#,
            "profile 18 is not a a100-sxm4-40gb profile id (accepted: 19, 20, 15, 14, 9, 5, 0)",
        ),
        (
            r#"{"current": true, "gpu_instances": [{"id": 1, "profile": 9, "start": 2}]}"#,
            "cannot start at memory slice 2 (placements start at 0, 4)",
        ),
        (
            r#"{"current": true, "gpu_instances": [{"id": 1, "profile": 9, "start": 0}, {"id": 2, "profile": 14, "start": 2}]}"#,
            "overlaps another instance",
        ),
        (
            r#"{"current": true, "gpu_instances": [{"id": 1, "profile": 19, "start": 0}, {"id": 1, "profile": 19, "start": 1}]}"#,
            "GPU instance id 1 appears twice",
        ),
        (
            r#"{"current": true, "gpu_instances": [{"id": 15, "profile": 19, "start": 0}]}"#,
            "GPU instance id 15 is above 14",
        ),
        (
            r#"{"current": true, "gpu_instances": [{"id": 1, "profile": 20, "start": 0}, {"id": 2, "profile": 20, "start": 1}]}"#,
            "more than 1 GPU instances of profile 20",
        ),
        (
            r#"{"current": true, "gpu_instances": [{"id": 1, "profile": 5, "start": 0, "compute_instances": [{"id": 0, "profile": 2}]}]}"#,
            "profile 2 is not offered by GPU instance profile 5 (accepted: 0, 1, 3)",
        ),
        (
            r#"{"current": true, "gpu_instances": [{"id": 1, "profile": 5, "start": 0, "compute_instances": [{"id": 0, "profile": 1, "start": 1}]}]}"#,
            "start 1 does not fit",
        ),
        (
            r#"{"current": true, "gpu_instances": [{"id": 1, "profile": 5, "start": 0, "compute_instances": [{"id": 0, "profile": 1, "start": 0}, {"id": 1, "profile": 0, "start": 1}]}]}"#,
            "compute instance 1 overlaps another",
        ),
        (
            r#"{"current": true, "gpu_instances": [{"id": 1, "profile": 19, "start": 0, "compute_instances": [{"id": 0, "index": 7}]}]}"#,
            "MIG device index 7",
        ),
        (
            r#"{"current": true, "gpu_instances": [{"id": 1, "profile": 19, "start": 0, "compute_instances": [{"id": 0, "uuid": "GPU-11111111-2222-4333-8444-555555555555"}]}]}"#,
            "MIG-xxxxxxxx",
        ),
        (
            r#"{"current": true, "profiles": "b200"}"#,
            "a100-sxm4-40gb, a100-80gb, h100-80gb",
        ),
    ];
    for (mig_json, needle) in cases {
        let err = nvml_sim::validate(&a100(mig_json)).unwrap_err();
        let text = format!("{err}");
        assert!(
            text.contains(needle),
            "{mig_json}: expected {needle:?} in {text:?}"
        );
    }
    let v100 = node_json(&[gpu_json(0, r#""mig": {"current": true}"#)]);
    let err = nvml_sim::validate(&v100).unwrap_err().to_string();
    assert!(
        err.contains("no profile table fits \"Tesla V100-SXM2-16GB\""),
        "{err}"
    );
    let processes = a100(r#"{"current": true}"#).replacen(
        r#""index": 0,"#,
        r#""index": 0, "processes": [{"pid": 1, "used_memory": 1}],"#,
        1,
    );
    let err = nvml_sim::validate(&processes).unwrap_err().to_string();
    assert!(
        err.contains("list them under the compute instance"),
        "{err}"
    );
}

#[test]
fn driver_files_give_the_caps_minors_of_each_instance() {
    let sim = SimNode::shipped("dgx-a100-mixed");
    let proc = sim.proc_root();
    let devices = std::fs::read_to_string(proc.join("devices")).unwrap();
    assert!(devices.starts_with("Character devices:\n"), "{devices}");
    assert!(devices.lines().any(|l| l == "235 nvidia-caps"), "{devices}");
    assert!(
        devices.lines().any(|l| l == "195 nvidia"),
        "driver 550.54.14 names major 195 nvidia: {devices}"
    );
    let minors = std::fs::read_to_string(proc.join("driver/nvidia-caps/mig-minors")).unwrap();
    let lines: Vec<&str> = minors.lines().collect();
    assert_eq!(lines.len(), 2 + 32 * 15 * 9, "every possible capability");
    assert_eq!(
        &lines[..5],
        [
            "config 1",
            "monitor 2",
            "gpu0/gi0/access 3",
            "gpu0/gi0/ci0/access 4",
            "gpu0/gi0/ci1/access 5"
        ]
    );
    assert!(lines.contains(&"gpu0/gi1/access 12") && lines.contains(&"gpu0/gi1/ci0/access 13"));
    assert_eq!(
        lines.last(),
        Some(&"gpu31/gi14/ci7/access 4322"),
        "the MIG user guide's last line"
    );
    let caps = proc.join("driver/nvidia/capabilities");
    assert_eq!(
        std::fs::read_to_string(caps.join("mig/config")).unwrap(),
        "DeviceFileMinor: 1\nDeviceFileMode: 256\nDeviceFileModify: 1\n"
    );
    // GPU 4 (minor 4): GI 2 → 3 + 135·4 + 9·2 = 561, its CI 0 → 562.
    assert_eq!(
        std::fs::read_to_string(caps.join("gpu4/mig/gi2/access")).unwrap(),
        "DeviceFileMinor: 561\nDeviceFileMode: 292\nDeviceFileModify: 1\n"
    );
    assert!(
        std::fs::read_to_string(caps.join("gpu4/mig/gi2/ci0/access"))
            .unwrap()
            .starts_with("DeviceFileMinor: 562\n")
    );
    let mut gis: Vec<String> = std::fs::read_dir(caps.join("gpu7/mig"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    gis.sort();
    assert_eq!(
        gis,
        ["gi10", "gi2", "gi3", "gi9"],
        "exactly the existing instances"
    );
    assert!(
        !caps.join("gpu0").exists(),
        "whole GPUs have no MIG capabilities"
    );
    assert_eq!(
        nvml_sim::driver_files::mig_cap_minor(4, 2, Some(0)),
        Some(562)
    );
}

#[test]
fn a_changed_layout_replaces_the_driver_files() {
    let mut sim = SimNode::shipped("dgx-a100-mixed");
    let caps = sim.proc_root().join("driver/nvidia/capabilities");
    assert!(caps.join("gpu4/mig/gi2/access").exists());
    let mut node = shipped("dgx-a100-mixed");
    node["gpus"][4]["mig"]["gpu_instances"] =
        serde_json::json!([{"id": 1, "profile": 0, "start": 0}]);
    sim.set_description(&node.to_string());
    assert!(
        !caps.join("gpu4/mig/gi2").exists(),
        "the old instance's capabilities are gone"
    );
    assert!(caps.join("gpu4/mig/gi1/ci0/access").exists());
    let nvml = open(&sim);
    let m = nvml
        .device_by_index(4)
        .unwrap()
        .mig_device_by_index(0)
        .unwrap();
    assert_eq!(m.attributes().unwrap().gpu_instance_slice_count, 7);
}
