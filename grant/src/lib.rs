//! What a container gets, decided once: [`Grant`] holds its device nodes, device rules,
//! variables, mounts and cpuset, built from what placement and the node's pool gave it, and every
//! path that starts a container renders this one value (see [`Grant`] for the
//! renderers and the facts they rely on). [`mig`]: what one MIG device needs in a container.
#![forbid(unsafe_code)]
#![warn(unreachable_pub, missing_docs)]

mod grant;
pub mod mig;

pub use grant::{
    CUDA_VISIBLE_DEVICES, DeviceKind, Grant, GrantError, GrantedDevice, GrantedMount, MountKind,
    NVIDIA_VISIBLE_DEVICES, SHM, ShareAccess, device_rules, visible_env,
};
pub use mig::MigAccess;
