//! What the MIG and sharing scenarios do alike: read a `gpus` request as units of what the agent
//! offers, and give whole GPUs (the allocator over the GPUs kept whole) to a request that its
//! MIG device or share cannot serve.

use mesos_gpu_placement::allocator::{Allocator, GpuRequest};
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
    /// `k` whole GPUs for `id` from `whole`, or the refusal: `why` (why not its unit) and what the
    /// whole GPUs lack.
    pub(crate) fn whole(whole: &mut Allocator, id: &str, k: u32, why: String) -> Got<U> {
        match whole.allocate(id, k) {
            Ok(set) => Got::Whole {
                gpus: set.to_vec(),
                why,
            },
            Err(_) => Got::Refused {
                error: format!(
                    "{why}; whole GPUs: {k} asked; {} free of {}",
                    whole.free().len(),
                    whole.offered()
                ),
            },
        }
    }

    /// The text of the outcome, `unit` writing the unit's.
    pub(crate) fn text(&self, unit: impl FnOnce(&U) -> String) -> String {
        match self {
            Got::Whole { gpus, why } => format!("whole GPUs {gpus:?} ({why})"),
            Got::Refused { error } => format!("refused: {error}"),
            Got::Unit(u) => unit(u),
        }
    }
}

/// The units `gpus` asks for out of `offered`, or the allocator's refusal.
pub(crate) fn units(gpus: f64, offered: u32) -> Result<u32, String> {
    GpuRequest::from_scalar(gpus, offered)
        .map(|request| request.count())
        .map_err(|e| e.to_string())
}
