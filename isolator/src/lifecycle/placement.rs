//! A container's device cgroup as the lifecycle drives it, made by the isolator or by Mesos
//! ([`CgroupMaker`]).
//!
//! **Own**: the isolator made `<cgroups root>/<id>` deny-by-default with the container's whole
//! allow list; `isolate` moves the process in; `cleanup` removes it (refused while processes
//! remain).
//!
//! **Mesos**: Mesos made the cgroup before our `prepare`, places the process and removes the
//! cgroup. Facts from Mesos 1.12 (HEAD c1b42f79, `src/slave/containerizer/mesos/`):
//! - built-in isolators are created and prepared before every module isolator, serially in
//!   their table order, and with `--launcher=linux` the cgroups isolator is always created, even
//!   without any `cgroups/*` in `--isolation` (`containerizer.cpp` 391-396, 568-604, 1621-1643);
//!   so when our `prepare` runs, Mesos's cgroup of the container exists if Mesos makes one;
//! - the launcher kills every process of the container before the isolators' `cleanup`, which
//!   runs in reverse prepare order, so ours runs before Mesos's cgroups isolator removes the
//!   cgroup (`containerizer.cpp` 2887-2906, 3400-3435);
//! - **v1**, with `cgroups/devices`: the devices cgroup `<devices hierarchy>/<cgroups_root>/<id>`
//!   is made deny-by-default with Mesos's default whitelist and `--allowed_devices`
//!   (`isolators/cgroups/cgroups.cpp` 458-489, `subsystems/devices.cpp` 54-69). We add and remove
//!   only our own entries (the control nodes and the GPUs), as Mesos's `gpu/nvidia` does
//!   (`isolators/gpu/isolator.cpp` 428-464), so Mesos's entries are never touched. The cgroups
//!   isolator assigns the process (`cgroups.cpp` 740-806). A nested container with
//!   `share_cgroups=false` gets its own devices cgroup at `<parent>/mesos/<child>`
//!   (`paths.cpp` 600-611) with the default whitelist only: it gets its parent's entries too.
//!   A `deny` on a parent removes the same entry from its children, an `allow` does not add it
//!   (security/device_cgroup.c, `devcgroup_update_access`), so they are granted again after
//!   every change of the parent;
//! - **v2**: the cgroups isolator makes `<cgroups_root>/<id>` and `<id>/leaf`
//!   (`isolators/cgroups2/cgroups2.cpp` 183-215, nested: `<parent>/mesos/<child>`, `paths.cpp`
//!   657-680) and the launcher puts the process in the leaf at fork (`linux_launcher.cpp`
//!   626-640). Without `cgroups/devices` no device program is attached there. Ours, built from
//!   the whole list (Mesos's default whitelist, the control nodes, the GPUs), is attached to
//!   `<cgroups_root>/<id>` with `BPF_F_ALLOW_MULTI`, so it also rules the leaf and every nested
//!   container below, and is replaced atomically on update. With `cgroups/devices` Mesos's device
//!   manager attaches its own program, keeps exactly one per cgroup (`src/linux/ebpf.cpp`
//!   143-149) and denies the GPUs, which no program of ours can undo: a foreign program refuses
//!   `prepare`. The launcher destroys `<cgroups_root>/<id>` before our `cleanup`
//!   (`linux_launcher.cpp` 781-790), and the kernel releases the program with it.

use std::path::{Path, PathBuf};

use super::{CgroupMaker, LifecycleError};
use mesos_gpu_enforce::{
    cgroup::CgroupError, cgroup::CgroupLayout, cgroup::DeviceCgroup, cgroup::DeviceRule,
    cgroup::normalize,
};
use mesos_gpu_os::container_id::ContainerId;

/// A container's device cgroup and who made it.
#[derive(Debug)]
pub(crate) struct PlacedCgroup {
    cgroup_maker: CgroupMaker,
    cgroup: DeviceCgroup,
}

impl PlacedCgroup {
    /// Makes the container's own cgroup allowing exactly `rules`.
    pub(crate) fn create(
        layout: &CgroupLayout,
        id: &ContainerId,
        rules: &[DeviceRule],
    ) -> Result<PlacedCgroup, CgroupError> {
        Ok(PlacedCgroup {
            cgroup_maker: CgroupMaker::Own,
            cgroup: DeviceCgroup::create(layout, id, rules)?,
        })
    }

    /// Takes the cgroup Mesos made at `dir` for container `id` and grants it `rules` (the whole
    /// list; on v1 only the entries not in `base` are written). Refuses a v1 cgroup that allows
    /// every device and a v2 cgroup with a device program that is not ours.
    pub(crate) fn join(
        layout: &CgroupLayout,
        id: &ContainerId,
        dir: PathBuf,
        rules: &[DeviceRule],
        base: &[DeviceRule],
    ) -> Result<PlacedCgroup, LifecycleError> {
        let cgroup_err = |source| LifecycleError::Cgroup {
            container: id.clone(),
            step: "prepare",
            source,
        };
        if !dir.is_dir() {
            return Err(LifecycleError::NoMesosCgroup {
                container: id.clone(),
                path: dir,
            });
        }
        let cgroup = DeviceCgroup::open_at(layout, dir, id).map_err(cgroup_err)?;
        match &cgroup {
            DeviceCgroup::V1(cg) => {
                if cg.allows_all().map_err(cgroup_err)? {
                    return Err(LifecycleError::MesosCgroupAllowsAll {
                        container: id.clone(),
                        path: cg.path().to_owned(),
                    });
                }
            }
            DeviceCgroup::V2(cg) => {
                let ids = cg.foreign_programs().map_err(cgroup_err)?;
                if !ids.is_empty() {
                    return Err(LifecycleError::ForeignDeviceProgram {
                        container: id.clone(),
                        path: cg.path().to_owned(),
                        ids,
                    });
                }
            }
        }
        let mut placed = PlacedCgroup {
            cgroup_maker: CgroupMaker::Mesos,
            cgroup,
        };
        placed.grant(rules, base).map_err(cgroup_err)?;
        tracing::info!(path = %placed.path().display(), "joined Mesos's container cgroup");
        Ok(placed)
    }

    /// Takes over an existing cgroup after an agent restart, changing nothing.
    pub(crate) fn open(
        cgroup_maker: CgroupMaker,
        layout: &CgroupLayout,
        id: &ContainerId,
        dir: PathBuf,
    ) -> Result<PlacedCgroup, CgroupError> {
        Ok(PlacedCgroup {
            cgroup_maker,
            cgroup: DeviceCgroup::open_at(layout, dir, id)?,
        })
    }

    /// Wraps a cgroup recovery already took over.
    pub(crate) fn from_parts(cgroup_maker: CgroupMaker, cgroup: DeviceCgroup) -> PlacedCgroup {
        PlacedCgroup {
            cgroup_maker,
            cgroup,
        }
    }

    /// The cgroup directory.
    pub(crate) fn path(&self) -> &Path {
        self.cgroup.path()
    }

    /// The device cgroup.
    pub(crate) fn cgroup(&self) -> &DeviceCgroup {
        &self.cgroup
    }

    /// Makes sure `rules` are allowed: own cgroups and v2 programs get exactly `rules`; a v1
    /// cgroup of Mesos gets the entries of `rules` not in `base` added, nothing removed.
    pub(crate) fn grant(
        &mut self,
        rules: &[DeviceRule],
        base: &[DeviceRule],
    ) -> Result<(), CgroupError> {
        match (self.cgroup_maker, &mut self.cgroup) {
            (CgroupMaker::Mesos, DeviceCgroup::V1(cg)) => {
                let ours = ours(rules, base);
                if ours.is_empty() {
                    return Ok(());
                }
                cg.allow(&ours)
            }
            (_, cgroup) => cgroup.set_allowed(rules),
        }
    }

    /// Changes the allow list from `old` to `new` (whole lists). Own cgroups and v2 programs are
    /// set to `new` at once; on a v1 cgroup of Mesos our entries gone from `new` are denied, then
    /// the new ones allowed. On failure the previous list stays in force.
    pub(crate) fn apply(
        &mut self,
        old: &[DeviceRule],
        new: &[DeviceRule],
        base: &[DeviceRule],
    ) -> Result<(), CgroupError> {
        if normalize(old) == normalize(new) {
            return Ok(());
        }
        match (self.cgroup_maker, &mut self.cgroup) {
            (CgroupMaker::Mesos, DeviceCgroup::V1(cg)) => {
                let (old, new) = (ours(old, base), ours(new, base));
                let gone: Vec<DeviceRule> =
                    old.iter().filter(|r| !new.contains(r)).copied().collect();
                let added: Vec<DeviceRule> =
                    new.iter().filter(|r| !old.contains(r)).copied().collect();
                if !gone.is_empty() {
                    cg.deny(&gone)?;
                }
                if !added.is_empty()
                    && let Err(e) = cg.allow(&added)
                {
                    if !gone.is_empty()
                        && let Err(undo) = cg.allow(&gone)
                    {
                        tracing::error!(error = %undo, "cannot restore the device entries of a failed update");
                    }
                    return Err(e);
                }
                Ok(())
            }
            (_, cgroup) => cgroup.set_allowed(new),
        }
    }

    /// Moves `pid` into an own cgroup; Mesos placed it in its cgroup already.
    pub(crate) fn add_process(&self, pid: u32) -> Result<(), CgroupError> {
        match self.cgroup_maker {
            CgroupMaker::Own => self.cgroup.add_process(pid),
            CgroupMaker::Mesos => {
                tracing::debug!(pid, path = %self.path().display(), "Mesos places the process in its cgroup");
                Ok(())
            }
        }
    }

    /// At cleanup: removes an own cgroup ([`CgroupError::Busy`] while processes remain);
    /// takes our entries (v1) or program (v2) off a cgroup of Mesos that still exists, which
    /// Mesos removes after us. That never fails the cleanup: the launcher killed every process
    /// of the container before the isolators' cleanup, so failures are logged.
    pub(crate) fn release(
        &mut self,
        rules: &[DeviceRule],
        base: &[DeviceRule],
    ) -> Result<(), CgroupError> {
        if self.cgroup_maker == CgroupMaker::Own {
            return self.cgroup.destroy();
        }
        if !self.path().is_dir() {
            tracing::debug!(path = %self.path().display(), "Mesos already removed the cgroup");
            return Ok(());
        }
        let revoked = match &mut self.cgroup {
            DeviceCgroup::V1(cg) => {
                let ours = ours(rules, base);
                if ours.is_empty() {
                    Ok(())
                } else {
                    cg.deny(&ours)
                }
            }
            DeviceCgroup::V2(cg) => cg.detach().map(drop),
        };
        match revoked {
            Ok(()) => tracing::debug!(path = %self.path().display(), "revoked our device access"),
            Err(e) if !self.path().is_dir() => {
                tracing::debug!(error = %e, "Mesos removed the cgroup meanwhile")
            }
            Err(e) => {
                tracing::warn!(error = %e, path = %self.path().display(), "cannot revoke our device access from Mesos's cgroup; Mesos removes it next")
            }
        }
        Ok(())
    }
}

/// v1: allows our entries of `rules` on the cgroups strictly between `top` (a container's
/// cgroup) and `dir` (a nested container's own cgroup below it), top-down. A cgroup can only be
/// granted what its parent allows, and Mesos makes `<parent>/mesos` when the first nested
/// container is prepared, with whatever the parent allowed then.
pub(crate) fn grant_between(
    layout: &CgroupLayout,
    id: &ContainerId,
    top: &Path,
    dir: &Path,
    rules: &[DeviceRule],
    base: &[DeviceRule],
) -> Result<(), CgroupError> {
    let ours = ours(rules, base);
    let Ok(below) = dir.strip_prefix(top) else {
        return Ok(());
    };
    if ours.is_empty() || layout.version() != mesos_gpu_enforce::cgroup::CgroupVersion::V1 {
        return Ok(());
    }
    let mut path = top.to_owned();
    let mut components: Vec<_> = below.components().collect();
    components.pop();
    for component in components {
        path.push(component);
        if let DeviceCgroup::V1(cg) = DeviceCgroup::open_at(layout, path.clone(), id)? {
            cg.allow(&ours)?;
        }
    }
    Ok(())
}

/// The entries of `rules` that are ours: those not in `base`.
pub(crate) fn ours(rules: &[DeviceRule], base: &[DeviceRule]) -> Vec<DeviceRule> {
    let base = normalize(base);
    normalize(rules)
        .into_iter()
        .filter(|r| !base.contains(r))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use mesos_gpu_enforce::cgroup::default_whitelist;

    #[test]
    fn ours_are_the_entries_beyond_the_base() {
        let base = default_whitelist();
        let gpu: DeviceRule = "c 195:3 rw".parse().expect("rule");
        let ctl: DeviceRule = "c 195:255 rwm".parse().expect("rule");
        let mut rules = base.clone();
        rules.extend([gpu, ctl]);
        assert_eq!(ours(&rules, &base), normalize(&[gpu, ctl]));
        assert!(ours(&base, &base).is_empty());
    }
}
