//! The `gpu/nvidia` isolator of the Mesos unified containerizer: GPU discovery, allocation,
//! device cgroups (v1 and v2) and the container lifecycle.
//!
//! `unsafe` is denied everywhere but in [`sys`], which wraps the raw `bpf(2)` system call
//! and the NVML calls nvml-wrapper has no safe form for.
#![deny(unsafe_code)]

pub mod agent_flags;
pub mod allocator;
pub mod cgroup;
pub mod container_id;
pub mod devices;
pub mod discovery;
pub mod health;
pub mod inventory;
pub mod lifecycle;
pub mod mig;
pub mod numa;
pub mod pool;
pub mod sharing;
mod sys;
pub mod usage;
