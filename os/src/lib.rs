//! The operating-system mechanics that the mesos-gpu crates share, each written once: replacing a
//! file crash-safely ([`durable`]), taking `flock(2)` locks with a bounded wait ([`lock`]),
//! reading the mount table ([`mountinfo`]), and printing an error with its causes ([`chain`]).
//!
//! Every function takes the paths it works on; nothing here knows `/proc`, `/sys` or a work
//! directory. No `unsafe`: std's `File::lock` family is `flock(2)`.
#![forbid(unsafe_code)]

pub mod chain;
pub mod durable;
pub mod lock;
pub mod mountinfo;

pub use chain::{ErrorChain, error_chain};
pub use durable::{DurableError, Staged, replace, stage, sync_dir};
pub use lock::{LockError, LockFile};
pub use mountinfo::{MountEntry, MountTable, MountinfoError};
