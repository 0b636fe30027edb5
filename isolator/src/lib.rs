//! The Mesos side of mesos-gpu: the `gpu/nvidia` isolator's container lifecycle
//! ([`lifecycle`]: recover, prepare, isolate, update, watch, usage, status, cleanup), composed of
//! the node ([`mesos_gpu_node`]), placement ([`mesos_gpu_placement`]), the node's pool
//! ([`mesos_gpu_pool`]), enforcement ([`mesos_gpu_enforce`]) and health ([`mesos_gpu_health`]);
//! and Mesos's agent-flag rules for what a node offers ([`agent_flags`]).
#![forbid(unsafe_code)]
#![warn(unreachable_pub, missing_docs)]

pub mod agent_flags;
pub mod lifecycle;
mod mig_strategy;
