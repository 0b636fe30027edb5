//! Pool records as earlier releases wrote them, for the tests that read them back.

use std::path::PathBuf;

use mesos_gpu_pool::{Owner, ProcessStamp, Reservation};

/// A reservation of `process` (in `cgroup`, when given) holding `unnamed` GPUs written as empty
/// UUIDs (`"gpus": [""]`), as a mesos-gpu from before the double-booking fix wrote them when the
/// process publishing the record could not see the GPUs (the `--docker` wrapper without NVML).
pub fn without_uuids(process: ProcessStamp, cgroup: Option<PathBuf>, unnamed: u32) -> Reservation {
    Reservation {
        publisher: "/var/run/mesos-gpu/gpu/allocations.json".into(),
        owner: Owner::Process {
            process,
            cgroup,
            private_dir: None,
        },
        gpus: Vec::new(),
        unnamed,
        since: 1,
    }
}
