//! What the MIG and sharing scenarios report alike: each task, and whether the isolator gave it
//! its unit (a MIG device, a share), whole GPUs or a refusal.

use mesos_gpu_enforce::cgroup::DeviceRule;
use mesos_gpu_isolator::lifecycle::LaunchInfo;
use serde::Serialize;

use crate::stream::ContainerType;

/// One task of the stream and what it got.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Task<U> {
    /// Container id.
    pub(crate) task: String,
    /// `MESOS` or `DOCKER`, where the scenario tells them apart.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) container: Option<ContainerType>,
    /// Arrival, simulated seconds.
    pub(crate) arrival: u64,
    /// The `gpus` value asked for.
    pub(crate) requested: f64,
    /// What it got.
    #[serde(flatten)]
    pub(crate) got: Got<U>,
}

/// What one task got: its unit `U` (a MIG device, a share), whole GPUs, or a refusal.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub(crate) enum Got<U> {
    /// Whole GPUs.
    Whole {
        /// NVML indices.
        gpus: Vec<u32>,
        /// Why whole: why not its unit.
        why: String,
    },
    /// Refused, with the reason.
    Refused {
        /// Why.
        error: String,
    },
    /// Its unit, serialized with its own `outcome`.
    #[serde(untagged)]
    Unit(U),
}

impl<U> Got<U> {
    /// The text of the outcome, `unit` writing the unit's.
    pub(crate) fn text(&self, unit: impl FnOnce(&U) -> String) -> String {
        match self {
            Got::Whole { gpus, why } => format!("whole GPUs {gpus:?} ({why})"),
            Got::Refused { error } => format!("refused: {error}"),
            Got::Unit(u) => unit(u),
        }
    }
}

/// What the isolator launches a container with, as the scenarios report it: its device rules
/// beyond the `base` whitelist, and its variables (`KEY=VALUE`).
pub(crate) fn launched(info: &LaunchInfo, base: &[DeviceRule]) -> (Vec<String>, Vec<String>) {
    let rules = info
        .device_rules
        .iter()
        .filter(|r| !base.contains(r))
        .map(ToString::to_string)
        .collect();
    let environment = info
        .environment
        .iter()
        .chain(&info.task_environment)
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    (rules, environment)
}
