//! What a container gets, decided once and rendered by every path that starts a container.
#![forbid(unsafe_code)]
#![warn(unreachable_pub, missing_docs)]

pub mod mig;
