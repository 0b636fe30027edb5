//! Turning a parsed description into a [`Node`], rejecting anything a real node could not be.
//!
//! Limits come from `nvml.h`: names fit `NVML_DEVICE_NAME_V2_BUFFER_SIZE` (96), serials
//! `NVML_DEVICE_SERIAL_BUFFER_SIZE` (30), versions `NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE`
//! (80), and a GPU has at most `NVML_NVLINK_MAX_LINKS` (18) NVLinks.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use super::ConfigError;
use super::schema::{
    CudaVersionSpec, FailureRateSpec, GpuSpec, NodeSpec, NvLinkSpec, PcieSpec, ProcDevicesSpec,
    RandomFailuresSpec,
};
use crate::abi::NVLINK_MAX_LINKS;
use crate::failable::{DEVICE_FUNCTIONS, SYSTEM_FUNCTIONS};
use crate::fields::{self, BUS_ID_FORMS, PciAddr};
use crate::node::{
    EccCounts, FailureRate, Gpu, Memory, Node, NvLink, NvSwitch, Pcie, ProcDevices, RandomFailures,
    Remote,
};
use crate::status::NvmlError;

/// Validates `spec`; `base` is the directory a relative `events_file` is relative to.
pub(super) fn node(spec: NodeSpec, base: &Path) -> Result<Node, ConfigError> {
    text_field("driver_version", &spec.driver_version, 80)?;
    let cuda_version = cuda_version(&spec.cuda_driver_version)?;
    let fail = fail_map("node", &spec.fail, SYSTEM_FUNCTIONS)?;
    let nvswitches = spec
        .nvswitches
        .iter()
        .enumerate()
        .map(|(i, s)| {
            Ok(NvSwitch {
                pci: bus_id(&format!("nvswitch {i} pci_bus_id"), &s.pci_bus_id)?,
                device_id: hex_id(
                    &format!("nvswitch {i} pci_device_id"),
                    s.pci_device_id.as_deref(),
                )?,
            })
        })
        .collect::<Result<Vec<_>, ConfigError>>()?;

    let mut specs = spec.gpus;
    check_indices(&specs)?;
    specs.sort_by_key(|g| g.index);
    let links = wire_nvlinks(&specs, nvswitches.len())?;
    let gpus = specs
        .into_iter()
        .zip(links)
        .map(|(g, nvlinks)| gpu(g, nvlinks))
        .collect::<Result<Vec<_>, ConfigError>>()?;
    check_unique(&gpus, &nvswitches)?;
    super::mig::check_unique_uuids(&gpus)?;
    check_pcie_tree(&gpus)?;
    let proc_devices = proc_devices(spec.proc_devices.as_ref());
    let random = spec
        .random_failures
        .as_ref()
        .map(random_failures)
        .transpose()?;

    Ok(Node {
        driver_version: spec.driver_version,
        cuda_version,
        events_file: spec.events_file.map(|p| base.join(p)),
        state_file: spec.state_file.map(|p| base.join(p)),
        proc_devices,
        nvswitches,
        fail,
        random,
        gpus,
    })
}

/// The driver's majors: the description's, each defaulting to what real hosts show.
fn proc_devices(spec: Option<&ProcDevicesSpec>) -> ProcDevices {
    let d = ProcDevices::DEFAULT;
    match spec {
        None => d,
        Some(s) => ProcDevices {
            nvidia_caps: s.nvidia_caps.unwrap_or(d.nvidia_caps),
            nvidia_uvm: s.nvidia_uvm.unwrap_or(d.nvidia_uvm),
        },
    }
}

fn random_failures(spec: &RandomFailuresSpec) -> Result<RandomFailures, ConfigError> {
    let rate = |what: &str, spec: &Option<FailureRateSpec>| {
        let Some(spec) = spec else {
            return Ok(None);
        };
        let field = format!("random_failures.{what}");
        if !(0.0..=1.0).contains(&spec.probability) {
            return Err(bad(
                format!("{field}.probability"),
                &spec.probability.to_string(),
                "a probability from 0 to 1",
            ));
        }
        let names: Vec<&str> = NvmlError::names().collect();
        let errors = spec
            .errors
            .iter()
            .map(|e| {
                NvmlError::from_name(e).ok_or_else(|| {
                    bad(
                        format!("{field}.errors"),
                        e,
                        &format!("an NVML error name: {}", names.join(", ")),
                    )
                })
            })
            .collect::<Result<Vec<_>, ConfigError>>()?;
        if errors.is_empty() {
            return Err(bad(
                format!("{field}.errors"),
                "[]",
                "at least one NVML error name, e.g. [\"NVML_ERROR_UNKNOWN\"]",
            ));
        }
        Ok(Some(FailureRate {
            probability: spec.probability,
            errors,
        }))
    };
    Ok(RandomFailures {
        seed: spec.seed,
        init: rate("init", &spec.init)?,
        calls: rate("calls", &spec.calls)?,
    })
}

fn gpu(spec: GpuSpec, nvlinks: Vec<NvLink>) -> Result<Gpu, ConfigError> {
    let at = |field: &str| format!("gpu {} {field}", spec.index);
    check_identity(&spec)?;
    let pci = bus_id(&at("pci.bus_id"), &spec.pci.bus_id)?;
    let memory = memory(&spec)?;
    let compute_capability = match &spec.compute_capability {
        Some(cc) => Some(
            fields::parse_major_minor(cc)
                .ok_or_else(|| bad(at("compute_capability"), cc, "major.minor such as \"7.0\""))?,
        ),
        None => None,
    };
    let cpus = cpu_affinity(&spec)?;
    check_utilization(&spec)?;
    let pcie = pcie(spec.index, spec.pcie)?;
    let affinity = super::numa::affinity(
        spec.index,
        cpus.as_deref(),
        spec.numa_node,
        spec.memory_affinity.as_deref(),
        spec.socket_affinity.as_ref(),
    )?;
    let mig = match spec.mig {
        Some(m) => Some(super::mig::layout(
            spec.index,
            spec.minor,
            m,
            &spec.name,
            &spec.uuid,
            memory.total,
        )?),
        None => None,
    };
    if mig.as_ref().is_some_and(|m| m.enabled())
        && spec.processes.as_ref().is_some_and(|p| !p.is_empty())
    {
        return Err(ConfigError::Mig {
            gpu: spec.index,
            problem: "with MIG on, processes run in compute instances: list them under the compute instance".to_owned(),
        });
    }
    let ecc = spec.ecc.map(|e| EccCounts {
        volatile_corrected: e.volatile.corrected,
        volatile_uncorrected: e.volatile.uncorrected,
        aggregate_corrected: e.aggregate.corrected,
        aggregate_uncorrected: e.aggregate.uncorrected,
    });
    Ok(Gpu {
        index: spec.index,
        minor: spec.minor,
        brand: spec.brand.code(),
        pci,
        pci_device_id: hex_id(&at("pci.device_id"), spec.pci.device_id.as_deref())?,
        pci_subsystem_id: hex_id(&at("pci.subsystem_id"), spec.pci.subsystem_id.as_deref())?,
        memory,
        compute_capability,
        numa_node: spec.numa_node,
        cpus,
        board: spec.board,
        pcie,
        nvlinks,
        mig,
        affinity,
        compute_mode: spec.compute_mode.map_or(0, |m| m.code()),
        utilization: spec.utilization.map(|u| (u.gpu, u.memory)),
        temperature_c: spec.temperature_c,
        power_mw: spec.power_mw,
        processes: spec
            .processes
            .map(|ps| ps.iter().map(|p| (p.pid, p.used_memory)).collect()),
        ecc,
        lost: spec.lost,
        recovery_action: spec
            .recovery_action
            .as_deref()
            .map(|name| recovery_action(&at("recovery_action"), name))
            .transpose()?,
        remapped_rows: spec.remapped_rows.map(|r| crate::node::RemappedRows {
            correctable: r.correctable,
            uncorrectable: r.uncorrectable,
            pending: r.pending,
            failure: r.failure,
        }),
        retired_pages_pending: spec.retired_pages_pending,
        fail: fail_map(&format!("GPU {}", spec.index), &spec.fail, DEVICE_FUNCTIONS)?,
        uuid: spec.uuid,
        name: spec.name,
        serial: spec.serial,
    })
}

/// Checks a GPU's UUID, name and serial.
fn check_identity(spec: &GpuSpec) -> Result<(), ConfigError> {
    let at = |field: &str| format!("gpu {} {field}", spec.index);
    if !fields::is_gpu_uuid(&spec.uuid) {
        return Err(bad(
            at("uuid"),
            &spec.uuid,
            "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx with hex digits",
        ));
    }
    text_field(&at("name"), &spec.name, 96)?;
    if let Some(serial) = &spec.serial {
        text_field(&at("serial"), serial, 30)?;
    }
    Ok(())
}

/// A GPU's memory: a non-zero total holding what is reserved and used.
fn memory(spec: &GpuSpec) -> Result<Memory, ConfigError> {
    let memory = Memory {
        total: spec.memory.total,
        reserved: spec.memory.reserved,
        used: spec.memory.used,
    };
    if memory.total == 0
        || memory
            .reserved
            .checked_add(memory.used)
            .is_none_or(|sum| sum > memory.total)
    {
        let value = format!(
            "total {} reserved {} used {}",
            memory.total, memory.reserved, memory.used
        );
        return Err(bad(
            format!("gpu {} memory", spec.index),
            &value,
            "a non-zero total with reserved + used <= total",
        ));
    }
    Ok(memory)
}

/// A GPU's CPU list, when given.
fn cpu_affinity(spec: &GpuSpec) -> Result<Option<Vec<u32>>, ConfigError> {
    let Some(list) = &spec.cpu_affinity else {
        return Ok(None);
    };
    fields::parse_cpulist(list).map(Some).ok_or_else(|| {
        bad(
            format!("gpu {} cpu_affinity", spec.index),
            list,
            &format!(
                "a CPU list such as \"0-19,40-59\" with CPUs up to {}",
                fields::MAX_CPU
            ),
        )
    })
}

/// Checks a GPU's utilization percentages, when given.
fn check_utilization(spec: &GpuSpec) -> Result<(), ConfigError> {
    match &spec.utilization {
        Some(u) if u.gpu > 100 || u.memory > 100 => Err(bad(
            format!("gpu {} utilization", spec.index),
            &format!("gpu {} memory {}", u.gpu, u.memory),
            "percentages from 0 to 100",
        )),
        _ => Ok(()),
    }
}

/// GPU `index`'s PCIe placement, when given: its host bridge and switch ids must not be empty.
fn pcie(index: u32, spec: Option<PcieSpec>) -> Result<Option<Pcie>, ConfigError> {
    let Some(p) = spec else {
        return Ok(None);
    };
    if p.host_bridge.is_empty() || p.switches.iter().any(String::is_empty) {
        return Err(bad(
            format!("gpu {index} pcie"),
            &format!("{p:?}"),
            "non-empty host_bridge and switch ids",
        ));
    }
    Ok(Some(Pcie {
        socket: p.socket,
        host_bridge: p.host_bridge,
        switches: p.switches,
    }))
}

/// The recovery action `name` names, for `field`.
fn recovery_action(field: &str, name: &str) -> Result<u32, ConfigError> {
    crate::node::recovery_action(name).map_err(|_| ConfigError::Field {
        field: field.to_owned(),
        value: name.to_owned(),
        expected: format!(
            "one of {}",
            crate::node::RECOVERY_ACTIONS
                .iter()
                .map(|(n, _)| *n)
                .collect::<Vec<_>>()
                .join(", ")
        ),
    })
}

fn bad(field: String, value: &str, expected: &str) -> ConfigError {
    ConfigError::Field {
        field,
        value: value.to_owned(),
        expected: expected.to_owned(),
    }
}

fn text_field(field: &str, value: &str, buffer: usize) -> Result<(), ConfigError> {
    if value.is_empty() || value.len() >= buffer || value.contains('\0') {
        return Err(bad(
            field.to_owned(),
            value,
            &format!("1 to {} bytes without NUL", buffer - 1),
        ));
    }
    Ok(())
}

fn cuda_version(spec: &CudaVersionSpec) -> Result<i32, ConfigError> {
    let expected = "a CUDA version such as 12040 or \"12.4\"";
    let value = match spec {
        CudaVersionSpec::Number(n) => i32::try_from(*n)
            .ok()
            .filter(|n| (1000..100_000).contains(n)),
        CudaVersionSpec::Text(t) => fields::parse_major_minor(t)
            .filter(|&(major, minor)| (1..100).contains(&major) && minor < 100)
            .and_then(|(major, minor)| i32::try_from(major * 1000 + minor * 10).ok()),
    };
    value.ok_or_else(|| {
        let shown = match spec {
            CudaVersionSpec::Number(n) => n.to_string(),
            CudaVersionSpec::Text(t) => t.clone(),
        };
        bad("cuda_driver_version".to_owned(), &shown, expected)
    })
}

fn bus_id(field: &str, text: &str) -> Result<PciAddr, ConfigError> {
    match fields::parse_bus_id(text) {
        Some(addr) if addr.function == 0 => Ok(addr),
        _ => Err(bad(
            field.to_owned(),
            text,
            &format!("{BUS_ID_FORMS}, function 0"),
        )),
    }
}

fn hex_id(field: &str, text: Option<&str>) -> Result<u32, ConfigError> {
    match text {
        None => Ok(0),
        Some(t) => fields::parse_hex_id(t).ok_or_else(|| {
            bad(
                field.to_owned(),
                t,
                "a 32-bit hex id such as \"0x1DB110DE\"",
            )
        }),
    }
}

fn fail_map(
    scope: &str,
    map: &BTreeMap<String, String>,
    functions: &[&'static str],
) -> Result<HashMap<&'static str, NvmlError>, ConfigError> {
    let mut out = HashMap::new();
    for (function, error) in map {
        let Some(name) = functions.iter().find(|f| **f == function) else {
            return Err(ConfigError::UnknownFunction {
                scope: scope.to_owned(),
                function: function.clone(),
                accepted: functions.join(", "),
            });
        };
        let code = NvmlError::from_name(error).ok_or_else(|| {
            let names: Vec<_> = NvmlError::names().collect();
            bad(
                format!("{scope} fail.{function}"),
                error,
                &format!("an NVML error name: {}", names.join(", ")),
            )
        })?;
        out.insert(*name, code);
    }
    Ok(out)
}

fn check_indices(gpus: &[GpuSpec]) -> Result<(), ConfigError> {
    let mut seen = vec![false; gpus.len()];
    for g in gpus {
        match seen.get_mut(g.index as usize) {
            Some(true) => return Err(ConfigError::DuplicateIndex { index: g.index }),
            Some(slot) => *slot = true,
            None if gpus.iter().filter(|o| o.index == g.index).count() > 1 => {
                return Err(ConfigError::DuplicateIndex { index: g.index });
            }
            None => {}
        }
    }
    match seen.iter().position(|s| !s) {
        Some(missing) => {
            let last = u32::try_from(gpus.len() - 1).unwrap_or(u32::MAX);
            Err(ConfigError::IndexGap {
                last,
                missing: u32::try_from(missing).unwrap_or(u32::MAX),
            })
        }
        None => Ok(()),
    }
}

fn check_unique(gpus: &[Gpu], nvswitches: &[NvSwitch]) -> Result<(), ConfigError> {
    fn once<K: Eq + std::hash::Hash>(
        what: &'static str,
        items: impl Iterator<Item = (K, String, String)>,
    ) -> Result<(), ConfigError> {
        let mut seen: HashMap<K, String> = HashMap::new();
        for (key, shown, holder) in items {
            if let Some(first) = seen.get(&key) {
                return Err(ConfigError::Duplicate {
                    what,
                    value: shown,
                    first: first.clone(),
                    second: holder,
                });
            }
            seen.insert(key, holder);
        }
        Ok(())
    }
    let name = |g: &Gpu| format!("GPU {}", g.index);
    once(
        "minor number",
        gpus.iter().map(|g| (g.minor, g.minor.to_string(), name(g))),
    )?;
    once(
        "UUID",
        gpus.iter()
            .map(|g| (g.uuid.to_ascii_lowercase(), g.uuid.clone(), name(g))),
    )?;
    let gpu_pci = gpus.iter().map(|g| (g.pci, g.pci.bus_id(), name(g)));
    let switch_pci = nvswitches
        .iter()
        .enumerate()
        .map(|(i, s)| (s.pci, s.pci.bus_id(), format!("NVSwitch {i}")));
    once("PCI bus id", gpu_pci.chain(switch_pci))
}

/// Numbers each GPU's NVLinks in listing order and checks that peers agree.
fn wire_nvlinks(gpus: &[GpuSpec], nvswitches: usize) -> Result<Vec<Vec<NvLink>>, ConfigError> {
    let mut peer_lists: HashMap<(u32, u32), &NvLinkSpec> = HashMap::new();
    let mut wired = Vec::with_capacity(gpus.len());
    for g in gpus {
        let problem = |problem: String| ConfigError::NvLink {
            gpu: g.index,
            problem,
        };
        let mut links = Vec::new();
        for entry in &g.nvlinks {
            let remote = match (entry.peer, entry.nvswitch) {
                (Some(peer), None) => {
                    if peer == g.index {
                        return Err(problem("a GPU cannot have an NVLink to itself".to_owned()));
                    }
                    if peer as usize >= gpus.len() {
                        return Err(problem(format!(
                            "peer {peer} does not exist (the node has {} GPUs)",
                            gpus.len()
                        )));
                    }
                    if peer_lists.insert((g.index, peer), entry).is_some() {
                        return Err(problem(format!("peer {peer} is listed twice")));
                    }
                    Remote::Gpu(peer as usize)
                }
                (None, Some(switch)) if switch < nvswitches => Remote::Switch(switch),
                (None, Some(switch)) => {
                    return Err(problem(format!(
                        "nvswitch {switch} does not exist (the node has {nvswitches})"
                    )));
                }
                _ => {
                    return Err(problem(
                        "each entry names exactly one of peer or nvswitch".to_owned(),
                    ));
                }
            };
            if entry.links == 0 {
                return Err(problem("an entry needs at least 1 link".to_owned()));
            }
            links.extend((0..entry.links).map(|_| NvLink {
                remote,
                active: entry.active,
            }));
        }
        if links.len() > NVLINK_MAX_LINKS as usize {
            return Err(problem(format!(
                "{} links, but NVML_NVLINK_MAX_LINKS is {NVLINK_MAX_LINKS}",
                links.len()
            )));
        }
        wired.push(links);
    }
    let describe = |e: Option<&&NvLinkSpec>| match e {
        None => "no links".to_owned(),
        Some(e) => format!(
            "{} {} link(s)",
            e.links,
            if e.active { "active" } else { "inactive" }
        ),
    };
    for (&(a, b), entry) in &peer_lists {
        let back = peer_lists.get(&(b, a));
        if back.is_none_or(|back| back.links != entry.links || back.active != entry.active) {
            return Err(ConfigError::Asymmetric {
                a,
                b,
                a_to_b: describe(Some(entry)),
                b_to_a: describe(back),
            });
        }
    }
    Ok(wired)
}

/// Checks that every switch has one parent chain and every host bridge one socket.
fn check_pcie_tree(gpus: &[Gpu]) -> Result<(), ConfigError> {
    let mut bridges: HashMap<&str, (u32, u32)> = HashMap::new();
    let mut switches: HashMap<&str, (u32, String)> = HashMap::new();
    for g in gpus {
        let Some(p) = &g.pcie else { continue };
        match bridges.get(p.host_bridge.as_str()) {
            Some(&(first, socket)) if socket != p.socket => {
                return Err(ConfigError::PcieTree {
                    what: "host bridge",
                    id: p.host_bridge.clone(),
                    first,
                    first_path: format!("socket {socket}"),
                    second: g.index,
                    second_path: format!("socket {}", p.socket),
                });
            }
            Some(_) => {}
            None => {
                bridges.insert(&p.host_bridge, (g.index, p.socket));
            }
        }
        for (depth, switch) in p.switches.iter().enumerate() {
            let parents = std::iter::once(p.host_bridge.as_str())
                .chain(p.switches[..depth].iter().map(String::as_str))
                .collect::<Vec<_>>()
                .join(" > ");
            match switches.get(switch.as_str()) {
                Some((first, first_path)) if *first_path != parents => {
                    return Err(ConfigError::PcieTree {
                        what: "switch",
                        id: switch.clone(),
                        first: *first,
                        first_path: first_path.clone(),
                        second: g.index,
                        second_path: parents,
                    });
                }
                Some(_) => {}
                None => {
                    switches.insert(switch, (g.index, parents));
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a failed unwrap fails the test at its line
mod tests {
    use std::path::Path;

    use super::super::{ConfigError, parse};

    fn gpu(index: u32, extra: &str) -> String {
        format!(
            r#"{{"index": {index}, "minor": {index}, "uuid": "GPU-00000000-0000-4000-8000-{index:012x}",
                "name": "Tesla T4", "brand": "tesla", "pci": {{"bus_id": "0000:{bus:02x}:00.0"}},
                "memory": {{"total": 1000}}{sep}{extra}}}"#,
            bus = index + 1,
            sep = if extra.is_empty() { "" } else { "," }
        )
    }

    fn node(gpus: &[String]) -> String {
        format!(
            r#"{{"driver_version": "550.54.14", "cuda_driver_version": "12.4", "gpus": [{}]}}"#,
            gpus.join(",")
        )
    }

    fn error(json: &str) -> String {
        match parse(json, Path::new("/cfg")) {
            Ok(_) => panic!("accepted: {json}"),
            Err(e) => {
                let mut text = e.to_string();
                if let ConfigError::Json { source } = &e {
                    text = format!("{text}: {source}");
                }
                text
            }
        }
    }

    fn assert_error(json: &str, needle: &str) {
        let text = error(json);
        assert!(text.contains(needle), "expected {needle:?} in {text:?}");
    }

    #[test]
    fn a_minimal_node_is_valid_and_resolved() {
        let json = r#"{"driver_version": "550.54.14", "cuda_driver_version": 12040, "events_file": "ev", "gpus": []}"#;
        let n = parse(json, Path::new("/cfg")).unwrap();
        assert_eq!(n.cuda_version, 12040);
        assert_eq!(n.events_file.as_deref(), Some(Path::new("/cfg/ev")));
        let n = parse(&node(&[gpu(1, ""), gpu(0, "")]), Path::new("/")).unwrap();
        assert_eq!(
            n.gpus.iter().map(|g| g.index).collect::<Vec<_>>(),
            [0, 1],
            "sorted by index"
        );
        assert_eq!(n.gpus[0].memory.free(), 1000);
    }

    #[test]
    fn indices_and_unique_fields() {
        assert_error(
            &node(&[gpu(0, ""), gpu(0, "")]),
            "GPU index 0 appears twice",
        );
        assert_error(
            &node(&[gpu(0, ""), gpu(2, "")]),
            "indices must run from 0 to 1 without gaps, but 1 is missing",
        );
        assert_error(
            &node(&[
                gpu(0, ""),
                gpu(1, r#""minor": 0"#).replace(r#""minor": 1,"#, ""),
            ]),
            "minor number 0 is used twice (GPU 0 and GPU 1)",
        );
        let same_uuid = gpu(1, "").replace("000000000001", "000000000000");
        assert_error(
            &node(&[gpu(0, ""), same_uuid]),
            "UUID GPU-00000000-0000-4000-8000-000000000000 is used twice",
        );
        let clash = r#"{"driver_version": "1", "cuda_driver_version": "12.4", "nvswitches": [{"pci_bus_id": "0000:01:00.0"}], "gpus": [GPU]}"#
            .replace("GPU", &gpu(0, ""));
        assert_error(
            &clash,
            "PCI bus id 00000000:01:00.0 is used twice (GPU 0 and NVSwitch 0)",
        );
    }

    #[test]
    fn field_values() {
        assert_error(&node(&[gpu(0, "").replace("GPU-0", "GPU-x")]), "gpu 0 uuid");
        assert_error(
            &node(&[gpu(0, "").replace(":00.0", ":00.1")]),
            "gpu 0 pci.bus_id = \"0000:01:00.1\"",
        );
        assert_error(
            &node(&[gpu(0, r#""cpu_affinity": "3-1""#)]),
            "gpu 0 cpu_affinity = \"3-1\": expected a CPU list",
        );
        assert_error(
            &node(&[gpu(0, r#""utilization": {"gpu": 101, "memory": 0}"#)]),
            "percentages from 0 to 100",
        );
        let over = gpu(0, "").replace(
            r#""total": 1000"#,
            r#""total": 1000, "used": 900, "reserved": 200"#,
        );
        assert_error(&node(&[over]), "reserved + used <= total");
        assert_error(
            &node(&[gpu(0, r#""compute_capability": "7""#)]),
            "major.minor",
        );
        assert_error(
            &node(&[gpu(0, &format!(r#""serial": "{}""#, "9".repeat(30)))]),
            "gpu 0 serial",
        );
        assert_error(
            &node(&[gpu(0, r#""brand": "acme""#).replacen(r#""brand": "tesla","#, "", 1)]),
            "unknown variant `acme`",
        );
        assert_error(
            &node(&[gpu(
                0,
                r#""pci": {"bus_id": "0000:01:00.0", "device_id": "0xZZ"}"#,
            )
            .replacen(r#""pci": {"bus_id": "0000:01:00.0"},"#, "", 1)]),
            "pci.device_id",
        );
        assert_error(
            &node(&[]).replace("\"12.4\"", "\"twelve\""),
            "cuda_driver_version = \"twelve\"",
        );
        assert_error(
            &node(&[]).replace("\"12.4\"", "99"),
            "cuda_driver_version = \"99\"",
        );
        assert_error(
            &node(&[]).replace("\"gpus\"", "\"gpu\""),
            "unknown field `gpu`",
        );
    }

    #[test]
    fn nvlinks() {
        let link = |to: &str| format!(r#""nvlinks": [{to}]"#);
        assert_error(
            &node(&[gpu(0, &link(r#"{"peer": 0, "links": 1}"#))]),
            "GPU 0 nvlinks: a GPU cannot have an NVLink to itself",
        );
        assert_error(
            &node(&[gpu(0, &link(r#"{"peer": 3, "links": 1}"#))]),
            "peer 3 does not exist",
        );
        assert_error(
            &node(&[gpu(0, &link(r#"{"nvswitch": 0, "links": 1}"#))]),
            "nvswitch 0 does not exist",
        );
        assert_error(
            &node(&[gpu(0, &link(r#"{"links": 1}"#))]),
            "exactly one of peer or nvswitch",
        );
        assert_error(
            &node(&[gpu(0, &link(r#"{"peer": 1, "links": 0}"#)), gpu(1, "")]),
            "at least 1 link",
        );
        assert_error(
            &node(&[
                gpu(0, &link(r#"{"peer": 1, "links": 19}"#)),
                gpu(1, &link(r#"{"peer": 0, "links": 19}"#)),
            ]),
            "19 links, but NVML_NVLINK_MAX_LINKS is 18",
        );
        assert_error(
            &node(&[
                gpu(0, &link(r#"{"peer": 1, "links": 2}"#)),
                gpu(1, &link(r#"{"peer": 0, "links": 1}"#)),
            ]),
            "asymmetric",
        );
        assert_error(
            &node(&[
                gpu(0, &link(r#"{"peer": 1, "links": 1}"#)),
                gpu(1, &link(r#"{"peer": 0, "links": 1, "active": false}"#)),
            ]),
            "inactive",
        );
        assert_error(
            &node(&[
                gpu(
                    0,
                    &link(r#"{"peer": 1, "links": 1}, {"peer": 1, "links": 1}"#),
                ),
                gpu(1, &link(r#"{"peer": 0, "links": 2}"#)),
            ]),
            "peer 1 is listed twice",
        );
        let ok = node(&[
            gpu(0, &link(r#"{"peer": 1, "links": 2}"#)),
            gpu(1, &link(r#"{"peer": 0, "links": 2}"#)),
        ]);
        let n = parse(&ok, Path::new("/")).unwrap();
        assert_eq!(n.gpus[1].nvlinks.len(), 2);
    }

    #[test]
    fn pcie_tree() {
        let place = |socket: u32, hb: &str, switches: &str| {
            format!(
                r#""pcie": {{"socket": {socket}, "host_bridge": "{hb}", "switches": [{switches}]}}"#
            )
        };
        assert_error(
            &node(&[
                gpu(0, &place(0, "hb0", r#""a", "b""#)),
                gpu(1, &place(0, "hb0", r#""c", "b""#)),
            ]),
            "PCIe switch \"b\" is placed inconsistently: GPU 0 has hb0 > a, GPU 1 has hb0 > c",
        );
        assert_error(
            &node(&[gpu(0, &place(0, "hb0", "")), gpu(1, &place(1, "hb0", ""))]),
            "PCIe host bridge \"hb0\" is placed inconsistently: GPU 0 has socket 0, GPU 1 has socket 1",
        );
        assert_error(&node(&[gpu(0, &place(0, "", ""))]), "non-empty host_bridge");
    }

    #[test]
    fn failures() {
        assert_error(
            &node(&[gpu(0, r#""fail": {"nvmlInit_v2": "NVML_ERROR_UNKNOWN"}"#)]),
            "GPU 0 fail: unknown function \"nvmlInit_v2\"",
        );
        assert_error(
            &node(&[gpu(0, r#""fail": {"nvmlDeviceGetUUID": "BROKEN"}"#)]),
            "GPU 0 fail.nvmlDeviceGetUUID = \"BROKEN\": expected an NVML error name",
        );
        let ok = node(&[gpu(
            0,
            r#""fail": {"nvmlDeviceGetUUID": "NVML_ERROR_GPU_IS_LOST"}"#,
        )]);
        assert!(parse(&ok, Path::new("/")).is_ok());
        assert_error(
            r#"{"driver_version": "1", "cuda_driver_version": "12.4", "fail": {"nvmlDeviceGetUUID": "NVML_ERROR_UNKNOWN"}, "gpus": []}"#,
            "node fail: unknown function \"nvmlDeviceGetUUID\"",
        );
    }

    #[test]
    fn random_failures() {
        let with = |random: &str| {
            format!(
                r#"{{"driver_version": "1", "cuda_driver_version": "12.4", "random_failures": {random}, "gpus": []}}"#
            )
        };
        assert_error(
            &with(r#"{"init": {"probability": 1.5, "errors": ["NVML_ERROR_UNKNOWN"]}}"#),
            "random_failures.init.probability = \"1.5\": expected a probability from 0 to 1",
        );
        assert_error(
            &with(r#"{"calls": {"probability": 0.1, "errors": ["BROKEN"]}}"#),
            "random_failures.calls.errors = \"BROKEN\": expected an NVML error name",
        );
        assert_error(
            &with(r#"{"calls": {"probability": 0.1, "errors": []}}"#),
            "random_failures.calls.errors = \"[]\": expected at least one NVML error name",
        );
        assert_error(&with(r#"{"sead": 1}"#), "unknown field `sead`");
        let n = parse(
            &with(
                r#"{"seed": 3, "init": {"probability": 0.5, "errors": ["NVML_ERROR_DRIVER_NOT_LOADED", "NVML_ERROR_UNKNOWN"]}}"#,
            ),
            Path::new("/"),
        )
        .unwrap();
        let random = n.random.unwrap();
        assert_eq!(random.seed, 3);
        assert_eq!(
            random.init.unwrap().errors,
            [
                crate::status::NvmlError::DriverNotLoaded,
                crate::status::NvmlError::Unknown
            ]
        );
        assert!(random.calls.is_none());
    }
}
