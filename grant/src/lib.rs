//! What a container gets, decided once: [`Grant`] holds its device nodes, device rules,
//! variables, mounts and cpuset, built from what placement and the node's pool gave it, and every
//! path that starts a container renders this one value (see [`Grant`] for the
//! renderers and the facts they rely on). [`mig`]: what one MIG device needs in a container;
//! [`env`]: the names and values of every variable a container is given.
#![forbid(unsafe_code)]
#![warn(unreachable_pub, missing_docs)]

pub mod env;
mod grant;
pub mod mig;

pub use grant::{
    Grant, GrantError, GrantedDevice, GrantedMount, MountKind, NodeKind, SHM, ShareAccess,
    device_rules,
};
pub use mig::MigAccess;
