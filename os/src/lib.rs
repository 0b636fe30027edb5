//! The operating-system mechanics that the mesos-gpu crates share, each written once: replacing a
//! file crash-safely ([`durable`]), taking `flock(2)` locks with a bounded wait ([`lock`]),
//! reading the mount table ([`mountinfo`]), printing an error with its causes ([`chain`]), and
//! giving what the project creates its mode whatever the umask, refusing a state directory
//! others can write ([`fsmode`]).
//!
//! Every function takes the paths it works on; nothing here knows `/proc`, `/sys` or a work
//! directory. `unsafe` only in `sys.rs` (`geteuid`); std's `File::lock` family is `flock(2)`.
#![deny(unsafe_code)]

pub mod chain;
pub mod durable;
pub mod fsmode;
pub mod lock;
pub mod mountinfo;
mod sys;

pub use chain::{ErrorChain, error_chain};
pub use durable::{DurableError, Staged, replace, stage, sync_dir};
pub use fsmode::FsModeError;
pub use lock::{LockError, LockFile};
pub use mountinfo::{MountEntry, MountTable, MountinfoError};
