//! Applying what a container gets on the host: device cgroups, v1 entries or a v2 eBPF program
//! ([`cgroup`]), cpuset pinning ([`pinning`]) and the MPS control daemons of shared GPUs
//! ([`mps`]); container ids checked once as cgroup directory names ([`container_id`]).
//!
//! `unsafe` is denied everywhere but in `sys`, which wraps the raw `bpf(2)` system call and the
//! spawn of a process into a cgroup ([`spawn_in_cgroup`], used by health's GPU probe).
#![deny(unsafe_code)]
#![warn(unreachable_pub, missing_docs)]

pub mod cgroup;
pub mod container_id;
pub mod mps;
pub mod pinning;
mod sys;

pub use sys::{kill, spawn_in_cgroup};
