//! The CPUs and memory nodes the machine has online, from sysfs
//! (`/sys/devices/system/cpu/online`, `/sys/devices/system/node/online`;
//! Documentation/ABI/stable/sysfs-devices-system-cpu and sysfs-devices-node). A kernel without
//! NUMA support has no `node` directory: everything is memory node 0.

use std::path::{Path, PathBuf};

use super::{Allowed, CpuList, CpuListError};

use mesos_gpu_os::io::{IoContext as _, IoError};

/// Why the online sets could not be read.
#[derive(Debug, thiserror::Error)]
pub enum OnlineError {
    /// A sysfs file could not be read.
    #[error(transparent)]
    Read(IoError),
    /// A sysfs file does not hold a list.
    #[error("{path} does not hold a CPU list")]
    Parse {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: CpuListError,
    },
}

/// The online CPUs and memory nodes under the sysfs root `sys` (normally `/sys`): what a
/// container outside any cpuset may use, e.g. a Docker container.
pub fn online(sys: &Path) -> Result<Allowed, OnlineError> {
    let cpus = read(&sys.join("devices/system/cpu/online"))?;
    let nodes = sys.join("devices/system/node/online");
    let mems = if nodes.exists() {
        read(&nodes)?
    } else {
        CpuList::from_ids([0])
    };
    Ok(Allowed { cpus, mems })
}

fn read(path: &Path) -> Result<CpuList, OnlineError> {
    let text = std::fs::read_to_string(path)
        .at("read", path)
        .map_err(OnlineError::Read)?;
    text.parse().map_err(|source| OnlineError::Parse {
        path: path.to_owned(),
        source,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn reads_sysfs_and_defaults_to_node_0() {
        let tmp = tempfile::tempdir().unwrap();
        let cpu = tmp.path().join("devices/system/cpu");
        std::fs::create_dir_all(&cpu).unwrap();
        std::fs::write(cpu.join("online"), "0-7\n").unwrap();
        let a = online(tmp.path()).unwrap();
        assert_eq!(
            (a.cpus.to_string(), a.mems.to_string()),
            ("0-7".into(), "0".into())
        );
        let node = tmp.path().join("devices/system/node");
        std::fs::create_dir_all(&node).unwrap();
        std::fs::write(node.join("online"), "0-1\n").unwrap();
        assert_eq!(online(tmp.path()).unwrap().mems.to_string(), "0-1");
        std::fs::write(node.join("online"), "zero\n").unwrap();
        let err = online(tmp.path()).unwrap_err();
        assert!(err.to_string().contains("node/online"), "{err}");
    }
}
