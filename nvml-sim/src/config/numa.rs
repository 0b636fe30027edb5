//! Validating a GPU's CPU and memory affinity: `cpu_affinity` and `memory_affinity` (NUMA node
//! scope), `socket_affinity` (socket scope).
//!
//! `nvmlDeviceGetCpuAffinityWithinScope` / `nvmlDeviceGetMemoryAffinity` (`nvml.h` 4926-4990)
//! fall back to the nearest non-I/O ancestor when a scope does not apply, so the socket scope
//! defaults to the node scope, and it must contain it (a socket holds its NUMA nodes). Without
//! `memory_affinity`, a GPU with `numa_node` reports that node.

use super::ConfigError;
use super::schema::SocketAffinitySpec;
use crate::fields;
use crate::node::Affinity;

/// The largest NUMA node a node list may name (Linux's `MAX_NUMNODES` with `NODES_SHIFT` 10).
pub(crate) const MAX_NUMA_NODE: u32 = 1023;

fn list(field: String, text: &str, max: u32, what: &str) -> Result<Vec<u32>, ConfigError> {
    fields::parse_cpulist(text)
        .filter(|l| l.iter().all(|&n| n <= max) && !l.is_empty())
        .ok_or(ConfigError::Field {
            field,
            value: text.to_owned(),
            expected: format!("a {what} list such as \"0-1,4\" with numbers up to {max}"),
        })
}

/// Validates the affinity fields of GPU `gpu`; `cpus` is its parsed `cpu_affinity`.
pub(super) fn affinity(
    gpu: u32,
    cpus: Option<&[u32]>,
    numa_node: Option<u32>,
    memory_affinity: Option<&str>,
    socket: Option<&SocketAffinitySpec>,
) -> Result<Affinity, ConfigError> {
    let at = |f: &str| format!("gpu {gpu} {f}");
    let memory_nodes = match memory_affinity {
        Some(text) => Some(list(
            at("memory_affinity"),
            text,
            MAX_NUMA_NODE,
            "NUMA node",
        )?),
        None => numa_node.filter(|&n| n <= MAX_NUMA_NODE).map(|n| vec![n]),
    };
    let (socket_cpus, socket_memory_nodes) = match socket {
        None => (None, None),
        Some(s) => {
            let c = list(at("socket_affinity.cpus"), &s.cpus, fields::MAX_CPU, "CPU")?;
            let m = list(
                at("socket_affinity.memory"),
                &s.memory,
                MAX_NUMA_NODE,
                "NUMA node",
            )?;
            let contains = |outer: &[u32], inner: Option<&[u32]>| {
                inner.is_none_or(|i| i.iter().all(|x| outer.contains(x)))
            };
            if !contains(&c, cpus) {
                return Err(ConfigError::Field {
                    field: at("socket_affinity.cpus"),
                    value: s.cpus.clone(),
                    expected: "a superset of cpu_affinity (a socket holds its NUMA nodes' CPUs)"
                        .to_owned(),
                });
            }
            if !contains(&m, memory_nodes.as_deref()) {
                return Err(ConfigError::Field {
                    field: at("socket_affinity.memory"),
                    value: s.memory.clone(),
                    expected: "a superset of memory_affinity".to_owned(),
                });
            }
            (Some(c), Some(m))
        }
    };
    Ok(Affinity {
        memory_nodes,
        socket_cpus,
        socket_memory_nodes,
    })
}
