//! The `cpuset` controller's files, for NUMA pinning: what a cgroup may use, making a v1 cpuset
//! cgroup, enabling the controller on a cgroup2 path, and narrowing a cgroup.
//!
//! Kernel facts (Documentation/admin-guide/cgroup-v1/cpusets.rst, cgroup-v2.rst "Cpuset"):
//! - **v1**: a new cpuset cgroup starts with empty `cpuset.cpus` and `cpuset.mems` (unless its
//!   parent has `cgroup.clone_children`), and no task may join it until both are set; each must
//!   be a subset of the parent's. Mesos fills a new one from its parent the same way
//!   (`src/linux/cgroups.cpp` 239-262). `cpuset.effective_cpus`/`effective_mems` are what the
//!   cgroup really gets. `cpuset.cpu_exclusive` is left alone.
//! - **v2**: the files exist on a cgroup only when `cpuset` is in its parent's
//!   `cgroup.subtree_control`, which needs it in the parent's `cgroup.controllers`: a controller
//!   bound to a v1 hierarchy is not offered to cgroup2. An empty `cpuset.cpus` means "the
//!   parent's"; `cpuset.cpus.effective`/`cpuset.mems.effective` are what it gets. Processes in a
//!   child without the controller (Mesos's `leaf`) are ruled by it. `cpuset.cpus.partition` is
//!   left alone.

use std::io;
use std::path::{Path, PathBuf};

use mesos_gpu_os::IoError;
use mesos_gpu_os::fsmode;

use super::{CgroupError, IoResultExt, remove_cgroup_dir};
use mesos_gpu_node::{numa::Allowed, numa::CpuList};
use mesos_gpu_placement::numa::Pinning;

const CONTROLLER: &str = "cpuset";

/// What `dir` (a v1 cpuset cgroup) may use: its effective CPUs and memory nodes.
pub(crate) fn v1_allowed(dir: &Path) -> Result<Allowed, CgroupError> {
    Ok(Allowed {
        cpus: read_list(dir, "cpuset.effective_cpus", "cpuset.cpus")?,
        mems: read_list(dir, "cpuset.effective_mems", "cpuset.mems")?,
    })
}

/// What `dir` (a cgroup2 cgroup with the cpuset controller) may use.
pub(crate) fn v2_allowed(dir: &Path) -> Result<Allowed, CgroupError> {
    Ok(Allowed {
        cpus: read_list(dir, "cpuset.cpus.effective", "cpuset.cpus.effective")?,
        mems: read_list(dir, "cpuset.mems.effective", "cpuset.mems.effective")?,
    })
}

/// The nearest of `dir` and its ancestors that exists (at worst `/`).
pub(crate) fn nearest_existing(dir: &Path) -> &Path {
    dir.ancestors()
        .find(|d| d.is_dir())
        .unwrap_or(Path::new("/"))
}

/// Makes v1 cpuset cgroup `<mount>/<rel>` and every missing cgroup above it, each filled with
/// its parent's `cpuset.cpus` and `cpuset.mems` before anything can join it. Returns the
/// cgroups made, top-down. On failure the ones made so far are removed again.
pub(crate) fn v1_make(mount: &Path, rel: &Path) -> Result<Vec<PathBuf>, CgroupError> {
    let mut made = Vec::new();
    let mut dir = mount.to_owned();
    for component in rel.components() {
        let parent = dir.clone();
        dir.push(component);
        if dir.is_dir() {
            continue;
        }
        let filled = fsmode::mkdir(&dir, super::CGROUP_DIR_MODE)
            .map_err(|source| CgroupError::Create(IoError::new(super::CREATE, &dir, source)))
            .and_then(|()| {
                made.push(dir.clone());
                for file in ["cpuset.cpus", "cpuset.mems"] {
                    let value = read(&parent.join(file))?;
                    write(&dir.join(file), value.trim_end())?;
                }
                Ok(())
            });
        if let Err(e) = filled {
            remove_made(&made);
            return Err(e);
        }
        tracing::debug!(path = %dir.display(), "made cpuset cgroup");
    }
    Ok(made)
}

/// Removes cgroups `made` (top-down, as [`v1_make`] returns them), deepest first; failures are
/// logged.
pub(crate) fn remove_made(made: &[PathBuf]) {
    for dir in made.iter().rev() {
        if let Err(e) = remove_cgroup_dir(dir) {
            tracing::warn!(error = %e, "cannot remove a cpuset cgroup made for a failed pinning");
        }
    }
}

/// Enables `cpuset` in `cgroup.subtree_control` of `<mount>` and of every cgroup down to
/// `<mount>/<rel>` (the parent of the container cgroups), so that their children get the
/// controller. `Ok(Some(why))` when a cgroup on the way does not offer it.
pub(crate) fn v2_enable(mount: &Path, rel: &Path) -> Result<Option<String>, CgroupError> {
    let mut dir = mount.to_owned();
    let mut dirs = vec![dir.clone()];
    for component in rel.components() {
        dir.push(component);
        dirs.push(dir.clone());
    }
    for dir in dirs {
        let controllers = read(&dir.join("cgroup.controllers"))?;
        if !has_word(&controllers, CONTROLLER) {
            return Ok(Some(format!(
                "cgroup2 offers no cpuset controller at {} (cgroup.controllers: {:?}; on a hybrid host it is bound to the v1 hierarchy)",
                dir.display(),
                controllers.trim_end()
            )));
        }
        let control = dir.join("cgroup.subtree_control");
        if !has_word(&read(&control)?, CONTROLLER) {
            write(&control, "+cpuset")?;
            tracing::info!(path = %control.display(), "enabled the cpuset controller");
        }
    }
    Ok(None)
}

/// Narrows cgroup `dir` to `pinning` (memory first left as is when `pinning.mems` is `None`).
pub(crate) fn narrow(dir: &Path, pinning: &Pinning) -> Result<(), CgroupError> {
    if let Some(mems) = &pinning.mems {
        write(&dir.join("cpuset.mems"), &mems.to_string())?;
    }
    write(&dir.join("cpuset.cpus"), &pinning.cpus.to_string())
}

/// Moves process `pid` into cgroup `dir`.
pub(crate) fn add_process(dir: &Path, pid: u32) -> Result<(), CgroupError> {
    if pid == 0 {
        return Err(CgroupError::InvalidPid { pid });
    }
    write(&dir.join("cgroup.procs"), &pid.to_string())
}

/// Removes a cpuset cgroup the isolator made; success when it is gone already. The launcher
/// killed its processes, but the kernel may still be reaping them: `Busy` is retried briefly.
pub(crate) fn remove(dir: &Path) -> Result<(), CgroupError> {
    let mut tries = 0;
    loop {
        match remove_cgroup_dir(dir) {
            Err(e) if e.is_busy() && tries < 20 => {
                tries += 1;
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            other => return other,
        }
    }
}

fn read_list(dir: &Path, file: &str, fallback: &str) -> Result<CpuList, CgroupError> {
    let path = dir.join(file);
    let path = if path.exists() {
        path
    } else {
        dir.join(fallback)
    };
    let text = read(&path)?;
    text.parse().map_err(|e| {
        CgroupError::Read(IoError::new(
            "read",
            path,
            io::Error::new(io::ErrorKind::InvalidData, e),
        ))
    })
}

fn read(path: &Path) -> Result<String, CgroupError> {
    std::fs::read_to_string(path).wrap_read(path)
}

fn write(path: &Path, value: &str) -> Result<(), CgroupError> {
    tracing::trace!(path = %path.display(), value, "write");
    std::fs::write(path, value).wrap_write(path, value)
}

fn has_word(text: &str, word: &str) -> bool {
    text.split_whitespace().any(|w| w == word)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn put(dir: &Path, file: &str, text: &str) {
        std::fs::create_dir_all(dir).unwrap();
        std::fs::write(dir.join(file), text).unwrap();
    }

    #[test]
    fn v2_enable_walks_down_and_reports_a_missing_controller() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        put(root, "cgroup.controllers", "cpuset cpu io memory pids\n");
        put(root, "cgroup.subtree_control", "cpu\n");
        let mesos = root.join("mesos");
        put(&mesos, "cgroup.controllers", "cpuset cpu\n");
        put(&mesos, "cgroup.subtree_control", "cpuset\n");
        assert_eq!(v2_enable(root, Path::new("mesos")).unwrap(), None);
        // A regular file stands in for cgroupfs here: the write replaced it.
        assert_eq!(
            std::fs::read_to_string(root.join("cgroup.subtree_control")).unwrap(),
            "+cpuset"
        );
        assert_eq!(
            std::fs::read_to_string(mesos.join("cgroup.subtree_control")).unwrap(),
            "cpuset\n",
            "already enabled: left alone"
        );

        put(root, "cgroup.controllers", "hugetlb\n");
        let why = v2_enable(root, Path::new("mesos")).unwrap().unwrap();
        assert!(why.contains("no cpuset controller"), "{why}");
    }

    #[test]
    fn allowed_reads_effective_sets() {
        let tmp = tempfile::tempdir().unwrap();
        put(tmp.path(), "cpuset.effective_cpus", "0-3\n");
        put(tmp.path(), "cpuset.effective_mems", "0\n");
        let a = v1_allowed(tmp.path()).unwrap();
        assert_eq!(
            (a.cpus.to_string(), a.mems.to_string()),
            ("0-3".into(), "0".into())
        );
        put(tmp.path(), "cpuset.cpus.effective", "x\n");
        put(tmp.path(), "cpuset.mems.effective", "0\n");
        let err = v2_allowed(tmp.path()).unwrap_err();
        assert!(err.to_string().contains("cpuset.cpus.effective"), "{err}");
    }

    #[test]
    fn nearest_existing_ancestor() {
        let tmp = tempfile::tempdir().unwrap();
        let deep = tmp.path().join("a/b/c");
        assert_eq!(nearest_existing(&deep), tmp.path());
    }
}
