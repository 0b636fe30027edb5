//! NUMA pinning of a container's cgroup (opt-in): narrow its `cpuset.cpus`/`cpuset.mems` to its
//! GPUs' local CPUs and memory nodes ([`mesos_gpu_placement::numa::plan`]), never below its `cpus`.
//!
//! Whose cpuset cgroup (Mesos 1.12, HEAD c1b42f79; `docs/reference/numa.md` §2):
//! - **v1**: Mesos makes `<cpuset hierarchy>/<cgroups_root>/<id>` only when its `cgroups/cpuset`
//!   (or `cgroups/all`) isolator is on, filled from the parent, and moves the task there itself
//!   (`isolators/cgroups/cgroups.cpp` 458-489, 740-806); the isolator then only narrows it
//!   (`mesos_cpuset`). Otherwise the isolator makes that cgroup itself at the same path (filled
//!   from its parent first, as the kernel requires), moves the task in at `isolate` (a nested
//!   container's process too, as for the devices cgroup) and removes it at `cleanup`. Its
//!   subsystem is an empty shell (`subsystems/cpuset.cpp`), so nothing else writes the files.
//! - **v2**: the container's cgroup `<cgroups_root>/<id>` (Mesos's, with the task in `leaf`, or
//!   the isolator's own) is narrowed after `cpuset` is enabled in `cgroup.subtree_control` from
//!   the mount down to `<cgroups_root>` (Mesos does that only with `cgroups/cpuset`,
//!   `cgroups2.cpp` 241-262). The leaf has no cpuset of its own and is ruled by its parent's.
//!   Mesos removes the cgroup; nothing is left to undo.

use std::path::{Path, PathBuf};

use crate::{cgroup::CgroupError, cgroup::CgroupLayout, cgroup::CgroupVersion, cgroup::cpuset};
use mesos_gpu_node::numa::Affinities;
use mesos_gpu_os::container_id::ContainerId;
use mesos_gpu_placement::{numa::Decision, numa::Pinning, numa::SkipReason, numa::plan};

/// How NUMA pinning is set up.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PinningConfig {
    /// Narrow every container with GPUs to their local CPUs and memory nodes (module parameter
    /// `numa_pinning=on`, CLI `--numa-pinning`); off by default.
    pub enabled: bool,
    /// The GPUs' local CPUs and memory nodes, from discovery.
    pub affinities: Affinities,
    /// cgroup v1: Mesos makes the containers' cpuset cgroups (`cgroups/cpuset` or `cgroups/all`
    /// in `--isolation`); otherwise the isolator makes its own.
    pub mesos_cpuset: bool,
}

/// What pinning did to a container.
#[derive(Debug, Clone, PartialEq)]
pub enum PinOutcome {
    /// Pinning is off.
    Off,
    /// Narrowed to this.
    Pinned(Pinning),
    /// Left alone, for this reason (logged).
    Skipped(SkipReason),
}

/// Where the cpuset of a container is.
#[derive(Debug, Clone)]
enum Target {
    V1 {
        /// The v1 cpuset hierarchy, `<v1 root>/cpuset`.
        mount: PathBuf,
        /// `--cgroups_root`, relative.
        parent: PathBuf,
        /// True when the isolator makes the cgroup.
        own: bool,
    },
    V2 {
        mount: PathBuf,
        parent: PathBuf,
    },
}

/// Pins containers as [`PinningConfig`] says.
#[derive(Debug)]
pub struct Pinner {
    config: PinningConfig,
    target: Target,
}

impl Pinner {
    /// The pinner for containers laid out as `layout` (v1: in the cpuset hierarchy under
    /// `v1_root`).
    pub fn new(config: PinningConfig, layout: &CgroupLayout, v1_root: &Path) -> Pinner {
        let parent = layout
            .parent_dir()
            .strip_prefix(layout.mount())
            .map(Path::to_path_buf)
            .unwrap_or_default();
        let target = match layout.version() {
            CgroupVersion::V1 => Target::V1 {
                mount: v1_root.join("cpuset"),
                parent,
                own: !config.mesos_cpuset,
            },
            CgroupVersion::V2 => Target::V2 {
                mount: layout.mount().to_owned(),
                parent,
            },
        };
        Pinner { config, target }
    }

    /// True when pinning is on.
    pub fn enabled(&self) -> bool {
        self.config.enabled
    }

    /// The affinities pinning uses.
    pub fn affinities(&self) -> &Affinities {
        &self.config.affinities
    }

    /// The cpuset cgroup of container `id`.
    pub fn cpuset_dir(&self, id: &ContainerId) -> PathBuf {
        match &self.target {
            Target::V1 { mount, parent, .. } | Target::V2 { mount, parent } => {
                mount.join(parent).join(id.as_str())
            }
        }
    }

    /// Narrows container `id`, holding `gpus` and asking for `requested` CPUs, to its GPUs'
    /// local CPUs and memory nodes; all or nothing.
    pub fn pin(
        &self,
        id: &ContainerId,
        gpus: &[u32],
        requested: Option<f64>,
    ) -> Result<PinOutcome, CgroupError> {
        if !self.config.enabled {
            return Ok(PinOutcome::Off);
        }
        let dir = self.cpuset_dir(id);
        let outcome = match &self.target {
            Target::V1 { mount, parent, own } => {
                let above = dir.parent().unwrap_or(mount);
                if !*own && !dir.is_dir() {
                    PinOutcome::Skipped(SkipReason::NoController {
                        detail: format!(
                            "Mesos made no cpuset cgroup at {} although --isolation has cgroups/cpuset",
                            dir.display()
                        ),
                    })
                } else {
                    let allowed = cpuset::v1_allowed(cpuset::nearest_existing(above))?;
                    match plan(gpus, &self.config.affinities, &allowed, requested) {
                        Decision::Skip(reason) => PinOutcome::Skipped(reason),
                        Decision::Pin(pinning) => {
                            let made = if *own {
                                cpuset::v1_make(mount, &parent.join(id.as_str()))?
                            } else {
                                Vec::new()
                            };
                            if let Err(e) = cpuset::narrow(&dir, &pinning) {
                                cpuset::remove_made(&made);
                                return Err(e);
                            }
                            PinOutcome::Pinned(pinning)
                        }
                    }
                }
            }
            Target::V2 { mount, parent } => match cpuset::v2_enable(mount, parent)? {
                Some(detail) => PinOutcome::Skipped(SkipReason::NoController { detail }),
                None => {
                    let allowed = cpuset::v2_allowed(&mount.join(parent))?;
                    match plan(gpus, &self.config.affinities, &allowed, requested) {
                        Decision::Skip(reason) => PinOutcome::Skipped(reason),
                        Decision::Pin(pinning) => {
                            cpuset::narrow(&dir, &pinning)?;
                            PinOutcome::Pinned(pinning)
                        }
                    }
                }
            },
        };
        match &outcome {
            PinOutcome::Pinned(p) => tracing::info!(
                cpus = %p.cpus, mems = %p.mems.as_ref().map_or_else(|| "unchanged".to_owned(), ToString::to_string),
                cpuset = %dir.display(), "pinned the container to its GPUs' local CPUs"
            ),
            PinOutcome::Skipped(SkipReason::NoGpus | SkipReason::Nested) => {
                tracing::debug!(reason = %skipped(&outcome), "not pinned")
            }
            PinOutcome::Skipped(_) => {
                tracing::warn!(reason = %skipped(&outcome), "not pinning the container to its GPUs' local CPUs")
            }
            PinOutcome::Off => {}
        }
        Ok(outcome)
    }

    /// Moves `pid` into the cpuset cgroup of `id` when the isolator made it (v1, pinned).
    pub fn isolate(&self, id: &ContainerId, pid: u32) -> Result<(), CgroupError> {
        if !self.config.enabled || !self.owns_cpusets() {
            return Ok(());
        }
        let dir = self.cpuset_dir(id);
        if !dir.is_dir() {
            return Ok(());
        }
        cpuset::add_process(&dir, pid)?;
        tracing::debug!(pid, cpuset = %dir.display(), "moved the process into its cpuset");
        Ok(())
    }

    /// Removes the cpuset cgroup of `id` when the isolator made it (v1); success when there is
    /// none. It needs no memory of the pinning, so it also works after an agent restart.
    pub fn release(&self, id: &ContainerId) -> Result<(), CgroupError> {
        if !self.config.enabled || !self.owns_cpusets() {
            return Ok(());
        }
        let dir = self.cpuset_dir(id);
        if dir.is_dir() {
            cpuset::remove(&dir)?;
            tracing::debug!(cpuset = %dir.display(), "removed the container's cpuset cgroup");
        }
        Ok(())
    }

    fn owns_cpusets(&self) -> bool {
        matches!(self.target, Target::V1 { own: true, .. })
    }
}

fn skipped(outcome: &PinOutcome) -> String {
    match outcome {
        PinOutcome::Skipped(reason) => reason.to_string(),
        PinOutcome::Off | PinOutcome::Pinned(_) => String::new(),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::cgroup::Hierarchy;
    use mesos_gpu_node::{numa::CpuList, numa::GpuAffinity};

    fn config() -> PinningConfig {
        let mut affinities = Affinities::new();
        for (index, cpu) in [(0, 0), (1, 1)] {
            affinities.insert(
                index,
                GpuAffinity {
                    cpus: CpuList::from_ids([cpu]),
                    mems: Some(CpuList::from_ids([0])),
                },
            );
        }
        PinningConfig {
            enabled: true,
            affinities,
            mesos_cpuset: false,
        }
    }

    fn put(path: &Path, text: &str) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }

    /// A cgroup2 tree of regular files (real cgroup2 here has no cpuset: see tests/pinning.rs):
    /// the controller is enabled from the mount down and Mesos's container cgroup is narrowed.
    #[test]
    fn v2_enables_the_controller_and_narrows_the_container_cgroup() {
        let tmp = tempfile::tempdir().unwrap();
        let mount = tmp.path();
        let layout = CgroupLayout::new(
            Hierarchy {
                version: CgroupVersion::V2,
                mount: mount.to_owned(),
            },
            "mesos",
        )
        .unwrap();
        for dir in [mount.to_owned(), mount.join("mesos")] {
            put(&dir.join("cgroup.controllers"), "cpuset cpu memory\n");
            put(&dir.join("cgroup.subtree_control"), "memory\n");
        }
        put(&mount.join("mesos/cpuset.cpus.effective"), "0-1\n");
        put(&mount.join("mesos/cpuset.mems.effective"), "0\n");
        let id = ContainerId::new("c1").unwrap();
        std::fs::create_dir_all(mount.join("mesos/c1/leaf")).unwrap();
        let pinner = Pinner::new(config(), &layout, Path::new("/nonexistent"));

        let outcome = pinner.pin(&id, &[1], Some(1.0)).unwrap();
        assert_eq!(
            outcome,
            PinOutcome::Pinned(Pinning {
                cpus: CpuList::from_ids([1]),
                mems: Some(CpuList::from_ids([0])),
            })
        );
        let read = |p: &str| std::fs::read_to_string(mount.join(p)).unwrap();
        assert_eq!(read("cgroup.subtree_control"), "+cpuset");
        assert_eq!(read("mesos/cgroup.subtree_control"), "+cpuset");
        assert_eq!(read("mesos/c1/cpuset.cpus"), "1");
        assert_eq!(read("mesos/c1/cpuset.mems"), "0");
        // v2 cgroups are never the pinner's to move processes into or remove.
        pinner.isolate(&id, 1).unwrap();
        pinner.release(&id).unwrap();
        assert!(mount.join("mesos/c1").is_dir());
    }

    #[test]
    fn off_does_nothing() {
        let tmp = tempfile::tempdir().unwrap();
        let layout = CgroupLayout::new(
            Hierarchy {
                version: CgroupVersion::V1,
                mount: tmp.path().join("devices"),
            },
            "mesos",
        )
        .unwrap();
        let pinner = Pinner::new(PinningConfig::default(), &layout, tmp.path());
        let id = ContainerId::new("c1").unwrap();
        assert_eq!(pinner.pin(&id, &[0], None).unwrap(), PinOutcome::Off);
        assert_eq!(pinner.cpuset_dir(&id), tmp.path().join("cpuset/mesos/c1"));
        assert!(!tmp.path().join("cpuset").exists());
    }
}
