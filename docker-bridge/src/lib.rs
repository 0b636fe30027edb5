//! The Docker side of mesos-gpu: GPU allocations as `docker run` arguments and bollard
//! `HostConfig`s, a Docker client for launching, inspecting and recovering GPU containers,
//! nvidia-docker 1.0's REST API and its `nvidia_driver_<version>` volume plugin.
//!
//! Upstream Mesos books GPUs for its Docker containerizer but never passes them to Docker
//! (MESOS-5795, `docs/reference/mesos-gpu-isolator.md` §8); this crate supplies the missing half.
#![forbid(unsafe_code)]
#![warn(unreachable_pub, missing_docs)]

pub mod agent;
pub mod args;
pub mod bridge;
pub mod cdi;
pub mod client;
pub mod daemons;
pub mod metrics;
pub mod node_http;
pub mod plugin;
pub mod rest;
pub mod server;
pub mod status;
