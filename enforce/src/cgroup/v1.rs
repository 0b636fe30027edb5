//! cgroups v1 `devices` controller, through cgroups-rs 0.5's `DevicesController`.
//!
//! Facts relied on (Documentation/admin-guide/cgroup-v1/devices.rst, security/device_cgroup.c):
//! - A new cgroup copies its parent's behaviour and list. Writing `a` to `devices.deny` makes it
//!   deny-by-default and clears its list (only allowed while it has no children); writing `a` to
//!   `devices.allow` makes it allow-everything, shown in `devices.list` as the single line
//!   `a *:* rwm`.
//! - In deny-by-default mode `devices.allow` adds an entry, ORing the access into an existing
//!   entry of the same (type, major, minor); `devices.deny` clears access bits of the entry with
//!   exactly that (type, major, minor) and drops it when none remain. A deny never touches a
//!   different entry, even one it would match as a pattern (`c 195:*` does not remove `c 195:3`).
//! - A cgroup can only be granted what its parent allows (else `EPERM`).
//! - There is no atomic swap of the whole list: an update is a sequence of writes. We write the
//!   denies first, so that while it runs the container is never allowed more than both the old and
//!   the new list allow, and entries in both lists are never touched.
//!
//! cgroups-rs: `DevicesController::new(path, root)` points at any directory, so the configurable
//! layout works with it. We use it for `devices.allow`, `devices.deny`, `devices.list` and
//! `cgroup.procs`; the directory itself is made with `mkdir` (its `create` is `create_dir_all`,
//! which cannot tell us the cgroup already existed) and removed with one `rmdir` (its `delete`
//! retries for 150 ms and recursively removes child cgroups, where we want to refuse).

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};

use cgroups_rs::CgroupPid;
use cgroups_rs::fs::Controller;
use cgroups_rs::fs::devices::{DevicePermissions, DeviceType, DevicesController};
use mesos_gpu_os::IoError;

use super::{
    CgroupError, CgroupLayout, CgroupVersion, ContainerId, check_pid, create_container_dir,
    remove_cgroup_dir,
};
use mesos_gpu_node::rules::{Access, DeviceKind, DeviceRule, normalize};

/// One write to the controller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Write {
    Allow(DeviceRule),
    Deny(DeviceRule),
}

/// A container's cgroup in the v1 `devices` hierarchy.
#[derive(Debug)]
pub struct V1DeviceCgroup {
    container: ContainerId,
    path: PathBuf,
    controller: DevicesController,
}

impl V1DeviceCgroup {
    /// Creates the cgroup deny-by-default (`deny a *:* rwm`), then allows `base`. Fails with
    /// [`CgroupError::Exists`] if the cgroup exists; removes it again on any later failure.
    #[tracing::instrument(skip_all, fields(container = %container))]
    pub fn create(
        layout: &CgroupLayout,
        container: &ContainerId,
        base: &[DeviceRule],
    ) -> Result<V1DeviceCgroup, CgroupError> {
        layout.expect_version(CgroupVersion::V1)?;
        let base = canonical(base)?;
        let path = create_container_dir(layout, container)?;
        let cgroup = V1DeviceCgroup {
            container: container.clone(),
            controller: DevicesController::new(path.clone(), layout.mount().to_owned()),
            path,
        };
        let filled = cgroup
            .write(Write::Deny(DeviceRule::all(Access::RWM)))
            .and_then(|()| cgroup.set_allowed(&base));
        if let Err(e) = filled {
            if let Err(cleanup) = remove_cgroup_dir(&cgroup.path) {
                tracing::error!(error = %cleanup, "cannot remove the half-created cgroup");
            }
            return Err(e);
        }
        tracing::info!(path = %cgroup.path.display(), rules = base.len(), "created v1 device cgroup");
        Ok(cgroup)
    }

    /// Opens the existing cgroup of `container` (for recovery).
    pub fn open(
        layout: &CgroupLayout,
        container: &ContainerId,
    ) -> Result<V1DeviceCgroup, CgroupError> {
        V1DeviceCgroup::open_at(layout, layout.container_dir(container), container)
    }

    /// Opens the existing cgroup directory `path` in `layout`'s hierarchy as `container`'s,
    /// wherever it lies there (Mesos puts a nested container's at `<parent>/mesos/<child>`).
    pub(crate) fn open_at(
        layout: &CgroupLayout,
        path: PathBuf,
        container: &ContainerId,
    ) -> Result<V1DeviceCgroup, CgroupError> {
        layout.expect_version(CgroupVersion::V1)?;
        if !path.is_dir() {
            return Err(CgroupError::Missing {
                container: container.clone(),
                path,
            });
        }
        let controller = DevicesController::new(path.clone(), layout.mount().to_owned());
        Ok(V1DeviceCgroup {
            container: container.clone(),
            path,
            controller,
        })
    }

    /// True when the cgroup allows every device (`a *:* rwm`, a new cgroup's state when its
    /// parent allows everything): nobody made it deny-by-default.
    pub fn allows_all(&self) -> Result<bool, CgroupError> {
        Ok(self.allowed()?.iter().any(DeviceRule::is_allow_all))
    }

    /// The container.
    pub fn container(&self) -> &ContainerId {
        &self.container
    }

    /// The cgroup directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// True while the cgroup directory exists.
    pub fn exists(&self) -> bool {
        self.controller.exists()
    }

    /// The kernel's allow list (`devices.list`), normalized.
    pub fn allowed(&self) -> Result<Vec<DeviceRule>, CgroupError> {
        let path = self.path.join("devices.list");
        let _span = crate::timing::span(crate::timing::Step::CgroupRead);
        let resources = self
            .controller
            .allowed_devices()
            .map_err(|e| CgroupError::Read(IoError::new("read", &path, io_cause(e))))?;
        let rules = resources
            .iter()
            .map(|r| {
                from_resource(r.devtype, r.major, r.minor, &r.access).ok_or_else(|| {
                    let source = io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!("unexpected entry {r:?}"),
                    );
                    CgroupError::Read(IoError::new("read", &path, source))
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(normalize(&rules))
    }

    /// Adds `rules` to the allow list. All or nothing.
    pub fn allow(&self, rules: &[DeviceRule]) -> Result<(), CgroupError> {
        let rules = check_v1(rules)?;
        self.apply(&rules.into_iter().map(Write::Allow).collect::<Vec<_>>())
    }

    /// Removes `rules` from the allow list (each clears its access bits from the entry with
    /// the same type and numbers). All or nothing.
    pub fn deny(&self, rules: &[DeviceRule]) -> Result<(), CgroupError> {
        let rules = check_v1(rules)?;
        self.apply(&rules.into_iter().map(Write::Deny).collect::<Vec<_>>())
    }

    /// Makes the allow list exactly `rules`: writes the difference from the current list, then
    /// checks `devices.list`. On failure the previous list is restored.
    #[tracing::instrument(skip_all, fields(container = %self.container))]
    pub fn set_allowed(&self, rules: &[DeviceRule]) -> Result<(), CgroupError> {
        let desired = canonical(rules)?;
        let current = self.allowed()?;
        let writes = diff(&current, &desired);
        tracing::debug!(writes = writes.len(), "updating v1 device list");
        self.apply(&writes)?;
        let found = self.allowed()?;
        if found != desired {
            self.restore(&current);
            let show = |rules: &[DeviceRule]| rules.iter().map(ToString::to_string).collect();
            return Err(CgroupError::Mismatch {
                path: self.path.join("devices.list"),
                expected: show(&desired),
                found: show(&found),
            });
        }
        Ok(())
    }

    /// Moves process `pid` into the cgroup (`cgroup.procs`).
    pub fn add_process(&self, pid: u32) -> Result<(), CgroupError> {
        check_pid(pid)?;
        let _span = crate::timing::span(crate::timing::Step::CgroupWrite);
        self.controller
            .add_task_by_tgid(&CgroupPid::from(u64::from(pid)))
            .map_err(|e| CgroupError::Write {
                path: self.path.join("cgroup.procs"),
                value: pid.to_string(),
                source: io_cause(e),
            })?;
        tracing::debug!(container = %self.container, pid, "added process to v1 device cgroup");
        Ok(())
    }

    /// Removes the cgroup; [`CgroupError::Busy`] while processes remain; success if gone.
    pub fn destroy(&self) -> Result<(), CgroupError> {
        remove_cgroup_dir(&self.path)?;
        tracing::info!(container = %self.container, path = %self.path.display(), "removed v1 device cgroup");
        Ok(())
    }

    /// Performs `writes` in order; on failure, restores the list read before and returns the
    /// failure.
    fn apply(&self, writes: &[Write]) -> Result<(), CgroupError> {
        if writes.is_empty() {
            return Ok(());
        }
        let before = self.allowed()?;
        for &w in writes {
            if let Err(e) = self.write(w) {
                self.restore(&before);
                return Err(e);
            }
        }
        Ok(())
    }

    /// Best-effort return to `list` after a failed update; failures are logged.
    fn restore(&self, list: &[DeviceRule]) {
        let restored = self.allowed().and_then(|now| {
            diff(&now, list)
                .into_iter()
                .try_for_each(|w| self.write(w))?;
            self.allowed()
        });
        match restored {
            Ok(now) if now == list => {
                tracing::debug!(container = %self.container, "restored the previous device list")
            }
            Ok(now) => {
                tracing::error!(container = %self.container, ?now, want = ?list, "device list not restored")
            }
            Err(e) => {
                tracing::error!(container = %self.container, error = %e, "cannot restore the device list")
            }
        }
    }

    fn write(&self, w: Write) -> Result<(), CgroupError> {
        let _span = crate::timing::span(crate::timing::Step::CgroupWrite);
        let (file, rule, result) = match w {
            Write::Allow(r) => {
                let (ty, major, minor, perms) = to_resource(&r);
                (
                    "devices.allow",
                    r,
                    self.controller.allow_device(ty, major, minor, &perms),
                )
            }
            Write::Deny(r) => {
                let (ty, major, minor, perms) = to_resource(&r);
                (
                    "devices.deny",
                    r,
                    self.controller.deny_device(ty, major, minor, &perms),
                )
            }
        };
        tracing::trace!(container = %self.container, file, %rule, "write");
        result.map_err(|e| CgroupError::Write {
            path: self.path.join(file),
            value: rule.to_string(),
            source: io_cause(e),
        })
    }
}

/// Refuses rules v1 cannot express: `a` means "everything" there, whatever access follows.
fn check_v1(rules: &[DeviceRule]) -> Result<Vec<DeviceRule>, CgroupError> {
    match rules
        .iter()
        .find(|r| r.kind == DeviceKind::All && !r.is_allow_all())
    {
        Some(&rule) => Err(CgroupError::Unsupported { rule }),
        None => Ok(rules.to_vec()),
    }
}

/// The list as `devices.list` will show it: normalized, and just `a *:* rwm` when that is in it.
fn canonical(rules: &[DeviceRule]) -> Result<Vec<DeviceRule>, CgroupError> {
    let rules = normalize(&check_v1(rules)?);
    if rules.iter().any(DeviceRule::is_allow_all) {
        Ok(vec![DeviceRule::all(Access::RWM)])
    } else {
        Ok(rules)
    }
}

/// The writes that turn the canonical list `current` into the canonical list `desired`:
/// denies first, then allows (see the module docs).
fn diff(current: &[DeviceRule], desired: &[DeviceRule]) -> Vec<Write> {
    let allow_all = |list: &[DeviceRule]| list.iter().any(DeviceRule::is_allow_all);
    match (allow_all(current), allow_all(desired)) {
        (true, true) => return Vec::new(),
        (false, true) => return vec![Write::Allow(DeviceRule::all(Access::RWM))],
        _ => {}
    }
    let mut writes = Vec::new();
    let mut have = BTreeMap::new();
    if allow_all(current) {
        writes.push(Write::Deny(DeviceRule::all(Access::RWM)));
    } else {
        have.extend(
            current
                .iter()
                .map(|r| ((r.kind, r.major, r.minor), r.access)),
        );
    }
    let want: BTreeMap<_, _> = desired
        .iter()
        .map(|r| ((r.kind, r.major, r.minor), r.access))
        .collect();
    let entry = |(kind, major, minor), access| DeviceRule {
        kind,
        major,
        minor,
        access,
    };
    for (&key, &access) in &have {
        let revoke = access.difference(want.get(&key).copied().unwrap_or_default());
        if !revoke.is_empty() {
            writes.push(Write::Deny(entry(key, revoke)));
        }
    }
    for (&key, &access) in &want {
        let grant = access.difference(have.get(&key).copied().unwrap_or_default());
        if !grant.is_empty() {
            writes.push(Write::Allow(entry(key, grant)));
        }
    }
    writes
}

/// A rule as cgroups-rs's `allow_device`/`deny_device` arguments (`-1` is `*`).
fn to_resource(rule: &DeviceRule) -> (DeviceType, i64, i64, Vec<DevicePermissions>) {
    let ty = match rule.kind {
        DeviceKind::All => DeviceType::All,
        DeviceKind::Char => DeviceType::Char,
        DeviceKind::Block => DeviceType::Block,
    };
    let num = |n: Option<u32>| n.map_or(-1, i64::from);
    let perms = [
        (Access::READ, DevicePermissions::Read),
        (Access::WRITE, DevicePermissions::Write),
    ]
    .into_iter()
    .chain([(Access::MKNOD, DevicePermissions::MkNod)])
    .filter(|(bit, _)| rule.access.contains(*bit))
    .map(|(_, p)| p)
    .collect();
    (ty, num(rule.major), num(rule.minor), perms)
}

/// A `devices.list` entry from cgroups-rs as a rule; `None` for numbers out of range.
fn from_resource(
    ty: DeviceType,
    major: i64,
    minor: i64,
    perms: &[DevicePermissions],
) -> Option<DeviceRule> {
    let kind = match ty {
        DeviceType::All => DeviceKind::All,
        DeviceType::Char => DeviceKind::Char,
        DeviceType::Block => DeviceKind::Block,
    };
    let num = |n: i64| {
        if n == -1 {
            Some(None)
        } else {
            u32::try_from(n).ok().map(Some)
        }
    };
    let access = perms.iter().fold(Access::NONE, |acc, p| {
        acc.union(match p {
            DevicePermissions::Read => Access::READ,
            DevicePermissions::Write => Access::WRITE,
            DevicePermissions::MkNod => Access::MKNOD,
        })
    });
    Some(DeviceRule {
        kind,
        major: num(major)?,
        minor: num(minor)?,
        access,
    })
}

/// The io error inside a cgroups-rs error, which carries it as its source; the whole error when
/// it has none (a parse failure).
fn io_cause(err: cgroups_rs::fs::error::Error) -> io::Error {
    let inner = std::error::Error::source(&err).and_then(|s| s.downcast_ref::<io::Error>());
    match inner {
        Some(io) => io.raw_os_error().map_or_else(
            || io::Error::new(io.kind(), io.to_string()),
            io::Error::from_raw_os_error,
        ),
        None => io::Error::other(err),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{cgroup::CgroupVersion, cgroup::Hierarchy};
    use mesos_gpu_node::inventory::DevNum;
    use mesos_gpu_node::rules::arb::arb_rule;
    use mesos_gpu_node::rules::{default_whitelist, is_allowed, parse_list};
    use proptest::prelude::*;

    fn rules(text: &str) -> Vec<DeviceRule> {
        parse_list(text).expect("valid rules")
    }

    fn show(writes: &[Write]) -> Vec<String> {
        writes
            .iter()
            .map(|w| match w {
                Write::Allow(r) => format!("allow {r}"),
                Write::Deny(r) => format!("deny {r}"),
            })
            .collect()
    }

    /// Applies writes the way the kernel does (module docs) to a canonical list.
    fn simulate(current: &[DeviceRule], writes: &[Write]) -> Vec<DeviceRule> {
        let mut list = current.to_vec();
        for w in writes {
            match *w {
                Write::Allow(r) if r.kind == DeviceKind::All => {
                    list = vec![DeviceRule::all(Access::RWM)]
                }
                Write::Deny(r) if r.kind == DeviceKind::All => list.clear(),
                Write::Allow(r) => list.push(r),
                Write::Deny(r) => {
                    for e in list
                        .iter_mut()
                        .filter(|e| (e.kind, e.major, e.minor) == (r.kind, r.major, r.minor))
                    {
                        e.access = e.access.difference(r.access);
                    }
                }
            }
            list = normalize(&list);
        }
        list
    }

    #[test]
    fn diff_grows_and_shrinks_gpus() {
        let mut old = default_whitelist();
        old.extend(rules("c 195:255 rwm\nc 195:1 rwm\nc 195:3 rwm"));
        let mut new = default_whitelist();
        new.extend(rules("c 195:255 rwm\nc 195:0 rwm\nc 195:3 r"));
        let writes = diff(&canonical(&old).expect("v1"), &canonical(&new).expect("v1"));
        assert_eq!(
            show(&writes),
            ["deny c 195:1 rwm", "deny c 195:3 wm", "allow c 195:0 rwm"]
        );
    }

    #[test]
    fn diff_handles_allow_all() {
        let all = vec![DeviceRule::all(Access::RWM)];
        let some = rules("c 1:3 rwm");
        assert_eq!(
            show(&diff(&all, &some)),
            ["deny a *:* rwm", "allow c 1:3 rwm"]
        );
        assert_eq!(show(&diff(&some, &all)), ["allow a *:* rwm"]);
        assert!(diff(&all, &all).is_empty());
        assert_eq!(canonical(&rules("c 1:3 rwm\na *:* rwm")).expect("v1"), all);
    }

    #[test]
    fn partial_all_is_unsupported() {
        let err = canonical(&rules("c 1:3 rwm\na *:* r")).expect_err("v1 cannot");
        assert!(matches!(err, CgroupError::Unsupported { .. }), "{err:?}");
        assert!(err.to_string().contains("a *:* r"), "{err}");
    }

    #[test]
    fn resources_convert_both_ways() {
        for rule in rules("c 195:3 rwm\nb 8:* r\nc *:* m\na *:* rwm\nc 1:3 wm") {
            let (ty, major, minor, perms) = to_resource(&rule);
            assert_eq!(from_resource(ty, major, minor, &perms), Some(rule));
        }
        assert_eq!(from_resource(DeviceType::Char, 1 << 40, 0, &[]), None);
    }

    #[test]
    fn layout_of_the_wrong_version_is_refused() {
        let layout = CgroupLayout::new(
            Hierarchy {
                version: CgroupVersion::V2,
                mount: "/nonexistent".into(),
            },
            "m",
        )
        .expect("valid");
        let id = ContainerId::new("c").expect("valid");
        let err = V1DeviceCgroup::create(&layout, &id, &[]).expect_err("v2 layout");
        assert!(matches!(err, CgroupError::WrongVersion { .. }), "{err:?}");
    }

    #[test]
    fn open_of_a_missing_cgroup_is_missing() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let layout = CgroupLayout::v1_mesos(tmp.path());
        let err = V1DeviceCgroup::open(&layout, &ContainerId::new("gone").expect("valid"))
            .expect_err("missing");
        assert!(err.is_missing(), "{err:?}");
    }

    proptest! {
        #[test]
        fn diff_reaches_the_desired_list(
            old in proptest::collection::vec(arb_rule(), 0..8),
            new in proptest::collection::vec(arb_rule(), 0..8),
            major in 0u32..8,
            minor in 0u32..8,
        ) {
            let (Ok(old), Ok(new)) = (canonical(&old), canonical(&new)) else { return Ok(()) };
            let writes = diff(&old, &new);
            prop_assert_eq!(&simulate(&old, &writes), &new);
            // Denies come first, so no intermediate state allows what neither list allows.
            let mut state = old.clone();
            for w in &writes {
                state = simulate(&state, std::slice::from_ref(w));
                let dev = DevNum { major, minor };
                for access in (1u8..=7).map(Access::from_bits_truncate) {
                    if is_allowed(&state, DeviceKind::Char, dev, access) {
                        prop_assert!(is_allowed(&old, DeviceKind::Char, dev, access) || is_allowed(&new, DeviceKind::Char, dev, access));
                    }
                }
            }
        }
    }
}
