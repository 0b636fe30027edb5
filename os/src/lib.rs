//! The operating-system mechanics that the mesos-gpu crates share, each written once: replacing a
//! file crash-safely ([`durable`]), versioned JSON documents kept that way ([`store`]), taking
//! `flock(2)` locks with a bounded wait ([`lock`]), whether a process still runs ([`liveness`]),
//! reading the mount table ([`mountinfo`]), a failed file-system call ([`io`]), printing an error
//! with its causes ([`chain`]), a container id checked once as one file name ([`container_id`]), and giving what the project creates its mode whatever the umask,
//! refusing a state directory others can write ([`fsmode`]).
//!
//! Every function takes the paths it works on; nothing here knows `/proc`, `/sys` or a work
//! directory. `unsafe` only in `sys.rs` (`geteuid`); std's `File::lock` family is `flock(2)`.
#![deny(unsafe_code)]
#![warn(unreachable_pub, missing_docs)]

pub mod chain;
pub mod container_id;
pub mod durable;
pub mod fsmode;
pub mod io;
pub mod liveness;
pub mod lock;
pub mod mountinfo;
pub mod store;
mod sys;

pub use chain::{ErrorChain, error_chain};
pub use durable::{DurableError, Staged, replace, stage, sync_dir};
pub use fsmode::FsModeError;
pub use io::{IoContext, IoError};
pub use liveness::{Liveness, ProcessStamp, Processes};
pub use lock::{LockError, LockFile};
pub use mountinfo::{MountEntry, MountTable, MountinfoError};
pub use store::{Document, JsonFile, StoreError, Written};
