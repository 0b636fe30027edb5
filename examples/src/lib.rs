//! Example programs using the mesos-gpu crates as libraries (`src/bin/`), and the Marathon app
//! definitions `mesos-gpu demo` replays (`marathon/`).
#![forbid(unsafe_code)]
