//! [`Counters`]: running totals of allocator calls and refusals, for metrics.

use serde::Serialize;

use super::AllocError;

/// How many calls the allocator refused, by reason.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Refusals {
    /// [`AllocError::NotEnough`].
    pub not_enough: u64,
    /// [`AllocError::BadRequest`], [`AllocError::IndexOutOfRange`], [`AllocError::DuplicateGpu`],
    /// [`AllocError::MigEnabled`] and [`AllocError::UnknownPolicy`].
    pub bad_request: u64,
    /// [`AllocError::NotAllocated`] and [`AllocError::ShrinkBeyondHeld`].
    pub not_allocated: u64,
    /// [`AllocError::AlreadyAllocated`].
    pub already_allocated: u64,
    /// [`AllocError::UnknownGpu`].
    pub unknown_gpu: u64,
    /// [`AllocError::Unhealthy`].
    pub unhealthy: u64,
}

/// Running totals since the allocator was built, for metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Counters {
    /// Calls that grant, take back or validate GPUs (refused ones included).
    pub requests: u64,
    /// GPUs handed out.
    pub granted: u64,
    /// GPUs given back.
    pub released: u64,
    /// Topology picks made by the greedy fallback (more than 16 GPUs free), not proven best.
    pub greedy_picks: u64,
    /// Refused calls by reason.
    pub refused: Refusals,
}

impl Counters {
    /// Counts one call and, when it was refused, its reason.
    pub(crate) fn record(&mut self, refused: Option<&AllocError>) {
        self.requests += 1;
        let Some(err) = refused else { return };
        let by_reason = &mut self.refused;
        *match err {
            AllocError::NotEnough { .. } => &mut by_reason.not_enough,
            AllocError::BadRequest { .. }
            | AllocError::IndexOutOfRange { .. }
            | AllocError::DuplicateGpu { .. }
            | AllocError::MigEnabled { .. }
            | AllocError::UnknownPolicy { .. } => &mut by_reason.bad_request,
            AllocError::NotAllocated { .. } | AllocError::ShrinkBeyondHeld { .. } => {
                &mut by_reason.not_allocated
            }
            AllocError::AlreadyAllocated { .. } => &mut by_reason.already_allocated,
            AllocError::UnknownGpu { .. } => &mut by_reason.unknown_gpu,
            AllocError::Unhealthy { .. } => &mut by_reason.unhealthy,
        } += 1;
    }
}
