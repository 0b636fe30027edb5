//! What each container does with its GPUs, as JSON, for the agent endpoint
//! `/mesos-gpu/containers` (served by the module's shim beside `/mesos-gpu/metrics`).
//!
//! Why an endpoint of its own: Mesos renders `/monitor/statistics` (and the other JSON views of
//! `ResourceStatistics`) with stout's `JSON::protobuf`, which walks the message's descriptor
//! (`3rdparty/stout/include/stout/protobuf.hpp`, `protobuf(const Message&)`: fields
//! `descriptor->field(i)` only), so the unknown field 1000 that carries our GPU figures
//! (`mgpu_usage`) is never written there (`src/slave/http.cpp`, `Http::_statistics`).
//!
//! For each container: its kind (`mesos`, `nested` with its parent, `docker`), its GPUs (NVML
//! index, minor, UUID, health from the module's monitor, and NVML's figures: utilisation, memory
//! used by the container's own processes, memory in all, those processes), its MIG devices and
//! its share of a shared GPU, and whose container it is (`holder`: `executor_id`,
//! `framework_id`, `framework_name` (read from the agent's `/state`), `task_id`, `task_name`,
//! each left out when unknown; `null` when none is known). A figure NVML does not give is left
//! out (`null`), never 0.

use std::time::{SystemTime, UNIX_EPOCH};

use mesos_gpu_health::GpuHealth;
use mesos_gpu_isolator::lifecycle::{ContainerKind, Isolator, LifecycleError};
use mesos_gpu_placement::sharing::PlacedShare;
use serde::Serialize;

use mesos_gpu_docker::agent::{AgentHolders, complete};
use mesos_gpu_pool::Holder;

/// The endpoint's answer.
#[derive(Debug, Serialize)]
pub(crate) struct ContainersView {
    /// When it was read, seconds since the Unix epoch.
    timestamp: f64,
    /// Every container the module knows, by id.
    containers: Vec<ContainerView>,
}

/// One container.
#[derive(Debug, Serialize)]
struct ContainerView {
    container: String,
    kind: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    parent: Option<String>,
    gpus: Vec<GpuView>,
    mig: Vec<String>,
    share: Option<PlacedShare>,
    holder: Option<Holder>,
}

/// One GPU of a container.
#[derive(Debug, Serialize)]
struct GpuView {
    index: u32,
    minor: u32,
    uuid: String,
    /// `None` when no health monitor runs.
    health: Option<GpuHealth>,
    utilization_gpu: Option<u32>,
    utilization_memory: Option<u32>,
    memory_used: Option<u64>,
    memory_total: Option<u64>,
    processes: Option<Vec<u32>>,
}

/// Reads every container's GPUs now. A container cleaned up between the listing and its read is
/// left out.
/// Holders are completed from `agent` (framework names), when given.
pub(crate) fn view(
    isolator: &Isolator,
    agent: Option<&dyn AgentHolders>,
) -> Result<ContainersView, LifecycleError> {
    let monitor = isolator.health_monitor();
    let mut containers = Vec::new();
    for id in isolator.containers()? {
        let (status, usage) = match (isolator.status(&id), isolator.usage(&id)) {
            (Ok(status), Ok(usage)) => (status, usage),
            (Err(e), _) | (_, Err(e)) if e.is_unknown_container() => continue,
            (Err(e), _) | (_, Err(e)) => return Err(e),
        };
        let (kind, parent) = match &status.kind {
            ContainerKind::Mesos => ("mesos", None),
            ContainerKind::Nested { parent } => ("nested", Some(parent.to_string())),
            ContainerKind::Docker => ("docker", None),
        };
        let gpus = usage
            .gpus
            .into_iter()
            .map(|g| {
                let nvml = g.nvml.as_ref();
                GpuView {
                    index: g.index,
                    minor: g.minor,
                    health: monitor.as_ref().and_then(|m| m.health(g.index)),
                    utilization_gpu: nvml.and_then(|n| n.utilization_gpu),
                    utilization_memory: nvml.and_then(|n| n.utilization_memory),
                    memory_used: nvml.and_then(|n| n.memory_used),
                    memory_total: nvml.and_then(|n| n.memory_total),
                    processes: nvml.and_then(|n| n.pids.clone()),
                    uuid: g.uuid,
                }
            })
            .collect();
        containers.push(ContainerView {
            container: id.to_string(),
            kind,
            parent,
            gpus,
            mig: status.mig,
            share: status.share,
            holder: match agent {
                Some(agent) => complete(&id.to_string(), status.holder, agent),
                None => status.holder,
            },
        });
    }
    let timestamp = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    Ok(ContainersView {
        timestamp,
        containers,
    })
}
