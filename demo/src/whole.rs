//! What the MIG and sharing scenarios do alike: read a `gpus` request as units of what the agent
//! offers, and give whole GPUs (the allocator over the GPUs kept whole) to a request that its
//! MIG device or share cannot serve.

use mesos_gpu_placement::allocator::{Allocator, GpuRequest};

/// The units `gpus` asks for out of `offered`, or the allocator's refusal.
pub(crate) fn units(gpus: f64, offered: u32) -> Result<u32, String> {
    GpuRequest::from_scalar(gpus, offered)
        .map(|request| request.count())
        .map_err(|e| e.to_string())
}

/// `k` whole GPUs for `id` from `whole`, or the refusal: `why` (why not a smaller unit) and what
/// the whole GPUs lack.
pub(crate) fn take(whole: &mut Allocator, id: &str, k: u32, why: &str) -> Result<Vec<u32>, String> {
    whole.allocate(id, k).map(|set| set.to_vec()).map_err(|_| {
        format!(
            "{why}; whole GPUs: {k} asked; {} free of {}",
            whole.free().len(),
            whole.offered()
        )
    })
}
