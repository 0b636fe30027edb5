//! Where a GPU request goes, decided without I/O: the whole-GPU allocator and its policies
//! ([`allocator`]), which GPUs are shared and where a share is packed ([`sharing`]), MIG devices
//! as allocation units ([`mig`]) and which CPUs a container is pinned to ([`numa`]).
#![forbid(unsafe_code)]
#![warn(unreachable_pub, missing_docs)]

pub mod allocator;
pub mod mig;
pub mod numa;
pub mod sharing;
