//! The GPU node as discovered, read-only: NVML loaded at run time ([`discovery`]), what the
//! node has ([`inventory`]: GPUs, driver, topology, MIG layout), the `/dev/nvidia*` nodes
//! ([`devices`]), the device-rule vocabulary of the devices cgroup ([`rules`]), NUMA affinities and online CPUs ([`numa`]) and live per-GPU figures
//! ([`usage`]). Nothing here decides or changes anything.
//!
//! `unsafe` is denied everywhere but in `sys`, which wraps the NVML calls nvml-wrapper has no
//! safe form for and the CUDA driver calls of the GPU probe ([`cuda`]).
#![deny(unsafe_code)]
#![warn(unreachable_pub, missing_docs)]

pub mod devices;
pub mod discovery;
pub mod inventory;
#[cfg(any(test, feature = "fixtures"))]
pub mod nodes;
pub mod numa;
pub mod rules;
mod sys;
pub mod usage;

pub use sys::cuda;
