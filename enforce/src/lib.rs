//! Applying what a container gets on the host: device cgroups, v1 entries or a v2 eBPF program
//! ([`cgroup`]), cpuset pinning ([`pinning`]) and the MPS control daemons of shared GPUs
//! ([`mps`]). The device-rule vocabulary is `mesos_gpu_node::rules` (re-exported by [`cgroup`]),
//! container ids `mesos_gpu_os::container_id`: a grant is written in them without acting on the host.
//!
//! `unsafe` is denied everywhere but in `sys`, which wraps the raw `bpf(2)` system call and the
//! spawn of a process into a cgroup ([`spawn_in_cgroup`], used by health's GPU probe).
#![deny(unsafe_code)]
#![warn(unreachable_pub, missing_docs)]

pub mod cgroup;
pub mod mps;
pub mod pinning;
mod sys;
pub mod timing;

pub use sys::{kill, spawn_in_cgroup};
