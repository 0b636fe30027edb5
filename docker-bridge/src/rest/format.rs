//! The bodies of nvidia-docker 1.0's REST pages (`remote_v1.go` v1.0.1): the text templates
//! aligned by Go's tabwriter, and the JSON documents with Go's field names and order.
//!
//! Values the node cannot know (no CUDA runtime is used, and live NVML data comes from a
//! [`GpuStatusSource`]) are `N/A` in text and `null` in JSON, as nvidia-docker shows NVML's
//! "not supported". Additions over v1: NVLink peers (link codes 7+ for 1, 2, … NVLinks, as
//! NVIDIA's later Go bindings number them) and families newer than Pascal.

use std::fmt::Write as _;
use std::io::Write as _;

use base64::Engine as _;
use mesos_gpu_node::{inventory::Gpu, inventory::Inventory, inventory::Link, inventory::PcieLevel};
use serde::Serialize;

use super::status::{GpuDetails, GpuStatus, GpuStatusSource};

const MIB: u64 = 1 << 20;

/// Everything a page is made from.
pub(crate) struct Node<'a> {
    pub(crate) inventory: &'a Inventory,
    pub(crate) devices: &'a super::Devices,
    pub(crate) status: &'a dyn GpuStatusSource,
}

fn or_na<T: std::fmt::Display>(value: Option<T>, unit: &str) -> String {
    value.map_or_else(|| "N/A".to_owned(), |v| format!("{v}{unit}"))
}

fn pair<T: std::fmt::Display, U: std::fmt::Display>(
    used: Option<T>,
    total: Option<U>,
    unit: &str,
) -> String {
    match (used, total) {
        (Some(u), Some(t)) => format!("{u} / {t}{unit}"),
        // The figure alone is still worth showing when its limit is unknown.
        (Some(u), None) => format!("{u} / N/A{unit}"),
        (None, _) => "N/A".to_owned(),
    }
}

/// NVIDIA's architecture family for a compute capability.
fn family(cc: (u32, u32)) -> Option<&'static str> {
    Some(match cc {
        (1, _) => "Tesla",
        (2, _) => "Fermi",
        (3, _) => "Kepler",
        (5, _) => "Maxwell",
        (6, _) => "Pascal",
        (7, 0 | 2) => "Volta",
        (7, 5) => "Turing",
        (8, 9) => "Ada Lovelace",
        (8, _) => "Ampere",
        (9, _) => "Hopper",
        (10 | 12, _) => "Blackwell",
        _ => return None,
    })
}

/// nvidia-docker's P2P link code and text: the NVLinks when there are some, else the PCIe level.
fn link_code(link: Link) -> (u32, String) {
    match (link.nvlinks, link.pcie) {
        (0, None) => (0, "N/A".to_owned()),
        (0, Some(PcieLevel::CrossSocket)) => (1, "Cross CPU socket".to_owned()),
        (0, Some(PcieLevel::SameNumaNode)) => (2, "Same CPU socket".to_owned()),
        (0, Some(PcieLevel::HostBridge)) => (3, "Host PCI bridge".to_owned()),
        (0, Some(PcieLevel::MultipleSwitches)) => (4, "Multiple PCI switches".to_owned()),
        (0, Some(PcieLevel::SingleSwitch)) => (5, "Single PCI switch".to_owned()),
        (0, Some(PcieLevel::SameBoard)) => (6, "Same board".to_owned()),
        (1, _) => (7, "Single NVLink".to_owned()),
        (n, _) => (6 + n, format!("{n} NVLinks")),
    }
}

/// The peers of the GPU at `position` with a known link, in inventory order.
fn peers(inventory: &Inventory, position: usize) -> Vec<(&Gpu, Link)> {
    inventory
        .gpus
        .iter()
        .enumerate()
        .filter(|(j, _)| *j != position)
        .map(|(j, g)| (g, inventory.topology.get(position, j)))
        .filter(|(_, l)| *l != Link::UNKNOWN)
        .collect()
}

fn cuda_text(inventory: &Inventory) -> Option<String> {
    inventory
        .driver
        .as_ref()?
        .cuda_version
        .map(|(a, b)| format!("{a}.{b}"))
}

/// `/gpu/info`.
pub(crate) fn info_text(node: &Node<'_>) -> String {
    let inv = node.inventory;
    let mut t = String::new();
    let driver = inv.driver.as_ref().map(|d| d.version.clone());
    let _ = write!(t, "\n\tDriver version:  \t{}\n", or_na(driver, ""));
    let _ = write!(
        t,
        "\tSupported CUDA version:  \t{}\n\t",
        or_na(cuda_text(inv), "")
    );
    for (i, gpu) in inv.gpus.iter().enumerate() {
        let d = node.status.details(gpu);
        let cc = gpu.compute_capability;
        let _ = write!(t, "\n\tDevice #{i}\n");
        let _ = writeln!(
            t,
            "\t  Model:  \t{}",
            if gpu.name.is_empty() {
                "N/A"
            } else {
                &gpu.name
            }
        );
        let _ = writeln!(t, "\t  UUID:  \t{}", gpu.uuid);
        let _ = writeln!(t, "\t  Path:  \t{}", node.devices.gpu_path(gpu).display());
        let _ = writeln!(t, "\t  Family: \t{}", or_na(cc.and_then(family), ""));
        let _ = writeln!(
            t,
            "\t  Arch:  \t{}",
            or_na(cc.map(|(a, b)| format!("{a}.{b}")), "")
        );
        let _ = writeln!(t, "\t  Cores:  \tN/A");
        let _ = writeln!(t, "\t  Power:  \t{}", or_na(d.power_limit_w, " W"));
        let _ = writeln!(
            t,
            "\t  CPU Affinity:  \t{}",
            or_na(gpu.numa_node.map(|n| format!("NUMA node{n}")), "")
        );
        let _ = writeln!(t, "\t  PCI");
        let _ = writeln!(t, "\t    Bus ID:  \t{}", gpu.pci_bus_id);
        let _ = writeln!(t, "\t    BAR1:  \t{}", or_na(d.bar1_mib, " MiB"));
        let _ = writeln!(
            t,
            "\t    Bandwidth:  \t{}",
            or_na(d.pci_bandwidth_mbs, " MB/s")
        );
        let _ = writeln!(t, "\t  Memory");
        let _ = writeln!(t, "\t    ECC:  \t{}", or_na(d.ecc_enabled, ""));
        let _ = writeln!(
            t,
            "\t    Global:  \t{}",
            or_na(
                (gpu.memory_total > 0).then_some(gpu.memory_total / MIB),
                " MiB"
            )
        );
        let _ = writeln!(t, "\t    Constant:  \tN/A");
        let _ = writeln!(t, "\t    Shared:  \tN/A");
        let _ = writeln!(t, "\t    L2 Cache:  \tN/A");
        let _ = writeln!(t, "\t    Bandwidth:  \tN/A");
        let _ = writeln!(t, "\t  Clocks");
        let _ = writeln!(t, "\t    Cores:  \t{}", or_na(d.max_core_clock_mhz, " MHz"));
        let _ = writeln!(
            t,
            "\t    Memory:  \t{}",
            or_na(d.max_memory_clock_mhz, " MHz")
        );
        let _ = write!(t, "\t  P2P Available");
        let peers = peers(inv, i);
        if peers.is_empty() {
            let _ = write!(t, ":  \tNone");
        }
        for (peer, link) in peers {
            let _ = write!(t, "\n\t    {} - {}", peer.pci_bus_id, link_code(link).1);
        }
        t.push_str("\n\t");
    }
    t.push_str("\n\t");
    super::tabwriter::align(&t)
}

#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
struct InfoJson {
    version: VersionJson,
    devices: Vec<DeviceJson>,
}

#[derive(Serialize)]
struct VersionJson {
    #[serde(rename = "Driver")]
    driver: Option<String>,
    #[serde(rename = "CUDA")]
    cuda: Option<String>,
}

#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
struct DeviceJson {
    #[serde(rename = "UUID")]
    uuid: String,
    path: String,
    model: Option<String>,
    power: Option<u32>,
    #[serde(rename = "CPUAffinity")]
    cpu_affinity: Option<u32>,
    #[serde(rename = "PCI")]
    pci: PciJson,
    clocks: ClocksJson,
    topology: Option<Vec<P2pJson>>,
    family: Option<&'static str>,
    arch: Option<String>,
    cores: Option<u32>,
    memory: MemoryJson,
}

#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
struct PciJson {
    #[serde(rename = "BusID")]
    bus_id: String,
    #[serde(rename = "BAR1")]
    bar1: Option<u64>,
    bandwidth: Option<u32>,
}

#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
struct ClocksJson {
    cores: Option<u32>,
    memory: Option<u32>,
}

#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
struct P2pJson {
    #[serde(rename = "BusID")]
    bus_id: String,
    link: u32,
}

#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
struct MemoryJson {
    #[serde(rename = "ECC")]
    ecc: Option<bool>,
    global: Option<u64>,
    shared: Option<u64>,
    constant: Option<u64>,
    #[serde(rename = "L2Cache")]
    l2_cache: Option<u64>,
    bandwidth: Option<u64>,
}

fn device_json(node: &Node<'_>, position: usize, gpu: &Gpu, d: GpuDetails) -> DeviceJson {
    let peers = peers(node.inventory, position);
    DeviceJson {
        uuid: gpu.uuid.clone(),
        path: node.devices.gpu_path(gpu).display().to_string(),
        model: (!gpu.name.is_empty()).then(|| gpu.name.clone()),
        power: d.power_limit_w,
        cpu_affinity: gpu.numa_node,
        pci: PciJson {
            bus_id: gpu.pci_bus_id.clone(),
            bar1: d.bar1_mib,
            bandwidth: d.pci_bandwidth_mbs,
        },
        clocks: ClocksJson {
            cores: d.max_core_clock_mhz,
            memory: d.max_memory_clock_mhz,
        },
        topology: (!peers.is_empty()).then(|| {
            peers
                .into_iter()
                .map(|(p, l)| P2pJson {
                    bus_id: p.pci_bus_id.clone(),
                    link: link_code(l).0,
                })
                .collect()
        }),
        family: gpu.compute_capability.and_then(family),
        arch: gpu.compute_capability.map(|(a, b)| format!("{a}.{b}")),
        cores: None,
        memory: MemoryJson {
            ecc: d.ecc_enabled,
            global: (gpu.memory_total > 0).then_some(gpu.memory_total / MIB),
            shared: None,
            constant: None,
            l2_cache: None,
            bandwidth: None,
        },
    }
}

/// `/gpu/info/json`, ending in a newline as Go's `json.Encoder` writes it.
pub(crate) fn info_json(node: &Node<'_>) -> String {
    let inv = node.inventory;
    let doc = InfoJson {
        version: VersionJson {
            driver: inv.driver.as_ref().map(|d| d.version.clone()),
            cuda: cuda_text(inv),
        },
        devices: inv
            .gpus
            .iter()
            .enumerate()
            .map(|(i, g)| device_json(node, i, g, node.status.details(g)))
            .collect(),
    };
    to_json_line(&doc)
}

fn to_json_line<T: Serialize>(doc: &T) -> String {
    // Serializing these plain structs cannot fail: no maps with non-string keys, no foreign types.
    let mut s = serde_json::to_string(doc).unwrap_or_else(|e| format!("{{\"Err\":\"{e}\"}}"));
    s.push('\n');
    s
}

/// `/gpu/status`.
pub(crate) fn status_text(node: &Node<'_>) -> String {
    let mut t = String::new();
    for (i, gpu) in node.inventory.gpus.iter().enumerate() {
        let (d, s) = (node.status.details(gpu), node.status.status(gpu));
        let total = (gpu.memory_total > 0).then_some(gpu.memory_total / MIB);
        let _ = write!(t, "\n\tDevice #{i}\n");
        let _ = writeln!(
            t,
            "\t  Power:  \t{}",
            pair(s.power_w, d.power_limit_w, " W")
        );
        let _ = writeln!(t, "\t  Temperature:  \t{}", or_na(s.temperature_c, " °C"));
        let _ = writeln!(t, "\t  Utilization");
        let _ = writeln!(t, "\t    GPU:  \t{}", or_na(s.utilization.gpu, " %"));
        let _ = writeln!(t, "\t    Memory:  \t{}", or_na(s.utilization.memory, " %"));
        let _ = writeln!(
            t,
            "\t    Encoder:  \t{}",
            or_na(s.utilization.encoder, " %")
        );
        let _ = writeln!(
            t,
            "\t    Decoder:  \t{}",
            or_na(s.utilization.decoder, " %")
        );
        let _ = writeln!(t, "\t  Memory");
        let _ = writeln!(
            t,
            "\t    Global:  \t{}",
            pair(s.memory_used_mib, total, " MiB")
        );
        let _ = writeln!(t, "\t    ECC Errors");
        let _ = writeln!(
            t,
            "\t      L1 Cache:  \t{}",
            or_na(s.ecc_errors.l1_cache, "")
        );
        let _ = writeln!(
            t,
            "\t      L2 Cache:  \t{}",
            or_na(s.ecc_errors.l2_cache, "")
        );
        let _ = writeln!(t, "\t      Global:  \t{}", or_na(s.ecc_errors.global, ""));
        let _ = writeln!(t, "\t  PCI");
        let _ = writeln!(
            t,
            "\t    BAR1:  \t{}",
            pair(s.bar1_used_mib, d.bar1_mib, " MiB")
        );
        let _ = writeln!(t, "\t    Throughput");
        let _ = writeln!(t, "\t      RX:  \t{}", or_na(s.pci_rx_mbs, " MB/s"));
        let _ = writeln!(t, "\t      TX:  \t{}", or_na(s.pci_tx_mbs, " MB/s"));
        let _ = writeln!(t, "\t  Clocks");
        let _ = writeln!(t, "\t    Cores:  \t{}", or_na(s.core_clock_mhz, " MHz"));
        let _ = writeln!(t, "\t    Memory:  \t{}", or_na(s.memory_clock_mhz, " MHz"));
        let _ = write!(t, "\t  Processes");
        match &s.processes {
            None => t.push_str(":  \tN/A"),
            Some(list) if list.is_empty() => t.push_str(":  \tNone"),
            Some(list) => {
                for p in list {
                    let _ = write!(t, "\n\t    - PID:  \t{}", p.pid);
                    let _ = write!(
                        t,
                        "\n\t      Name:  \t{}",
                        p.name.as_deref().unwrap_or("N/A")
                    );
                    let _ = write!(
                        t,
                        "\n\t      Memory:  \t{}",
                        or_na(p.memory_used_mib, " MiB")
                    );
                }
            }
        }
        t.push_str("\n\t");
    }
    t.push_str("\n\t");
    super::tabwriter::align(&t)
}

#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
struct StatusJson {
    devices: Vec<DeviceStatusJson>,
}

#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
struct DeviceStatusJson {
    power: Option<u32>,
    temperature: Option<u32>,
    utilization: UtilizationJson,
    memory: MemoryStatusJson,
    clocks: ClocksJson,
    #[serde(rename = "PCI")]
    pci: PciStatusJson,
    processes: Option<Vec<ProcessJson>>,
}

#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
struct UtilizationJson {
    #[serde(rename = "GPU")]
    gpu: Option<u32>,
    memory: Option<u32>,
    encoder: Option<u32>,
    decoder: Option<u32>,
}

#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
struct MemoryStatusJson {
    global_used: Option<u64>,
    #[serde(rename = "ECCErrors")]
    ecc_errors: EccJson,
}

#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
struct EccJson {
    #[serde(rename = "L1Cache")]
    l1_cache: Option<u64>,
    #[serde(rename = "L2Cache")]
    l2_cache: Option<u64>,
    global: Option<u64>,
}

#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
struct PciStatusJson {
    #[serde(rename = "BAR1Used")]
    bar1_used: Option<u64>,
    throughput: ThroughputJson,
}

#[derive(Serialize)]
struct ThroughputJson {
    #[serde(rename = "RX")]
    rx: Option<u32>,
    #[serde(rename = "TX")]
    tx: Option<u32>,
}

#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
struct ProcessJson {
    #[serde(rename = "PID")]
    pid: u32,
    name: Option<String>,
    memory_used: Option<u64>,
}

fn status_json_of(s: GpuStatus) -> DeviceStatusJson {
    DeviceStatusJson {
        power: s.power_w,
        temperature: s.temperature_c,
        utilization: UtilizationJson {
            gpu: s.utilization.gpu,
            memory: s.utilization.memory,
            encoder: s.utilization.encoder,
            decoder: s.utilization.decoder,
        },
        memory: MemoryStatusJson {
            global_used: s.memory_used_mib,
            ecc_errors: EccJson {
                l1_cache: s.ecc_errors.l1_cache,
                l2_cache: s.ecc_errors.l2_cache,
                global: s.ecc_errors.global,
            },
        },
        clocks: ClocksJson {
            cores: s.core_clock_mhz,
            memory: s.memory_clock_mhz,
        },
        pci: PciStatusJson {
            bar1_used: s.bar1_used_mib,
            throughput: ThroughputJson {
                rx: s.pci_rx_mbs,
                tx: s.pci_tx_mbs,
            },
        },
        processes: s.processes.map(|list| {
            list.into_iter()
                .map(|p| ProcessJson {
                    pid: p.pid,
                    name: p.name,
                    memory_used: p.memory_used_mib,
                })
                .collect()
        }),
    }
}

/// `/gpu/status/json`.
pub(crate) fn status_json(node: &Node<'_>) -> String {
    let devices = node
        .inventory
        .gpus
        .iter()
        .map(|g| status_json_of(node.status.status(g)))
        .collect();
    to_json_line(&StatusJson { devices })
}

/// The arguments `/docker/cli` prints, as its JSON form names them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "PascalCase")]
pub(crate) struct DockerCli {
    /// Volume plugin name; empty when the volume is a plain bind.
    pub(crate) volume_driver: String,
    /// `SOURCE:/usr/local/nvidia:ro` entries.
    pub(crate) volumes: Vec<String>,
    /// `--device` values.
    pub(crate) devices: Vec<String>,
    /// `--env` values, `KEY=VALUE`: the devices' variables (`NVIDIA_VISIBLE_DEVICES`,
    /// `CUDA_VISIBLE_DEVICES`), as `docker-args` sets them.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) env: Vec<String>,
}

impl DockerCli {
    /// nvidia-docker's one-line template, without a trailing newline.
    pub(crate) fn text(&self) -> String {
        let mut parts = Vec::with_capacity(1 + self.volumes.len() + self.devices.len());
        if !self.volume_driver.is_empty() {
            parts.push(format!("--volume-driver={}", self.volume_driver));
        }
        parts.extend(self.volumes.iter().map(|v| format!("--volume={v}")));
        parts.extend(self.devices.iter().map(|d| format!("--device={d}")));
        parts.extend(self.env.iter().map(|e| format!("--env={e}")));
        parts.join(" ")
    }

    /// `/docker/cli/json`.
    pub(crate) fn json(&self) -> String {
        to_json_line(self)
    }
}

/// `/mesos/cli`: `--attributes=gpus:<zlib+base64url of /gpu/info/json> --resources=gpus:{UUIDs}`.
pub(crate) fn mesos_cli(node: &Node<'_>) -> String {
    let info = info_json(node);
    let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
    // Writing into a Vec cannot fail.
    let compressed = z
        .write_all(info.as_bytes())
        .and_then(|()| z.finish())
        .unwrap_or_default();
    let attr = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(compressed);
    let uuids: Vec<&str> = node
        .inventory
        .gpus
        .iter()
        .map(|g| g.uuid.as_str())
        .collect();
    format!(
        "--attributes=gpus:{attr} --resources=gpus:{{{}}}",
        uuids.join(",")
    )
}
