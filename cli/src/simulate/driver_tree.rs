//! A simulated node's driver files: a driver tree laid out as an NVIDIA driver installed under
//! `/usr/local/nvidia` (as on GPU cloud hosts that mount the driver there, with `lib -> lib64`),
//! for the commands that read the driver's files (`volume`, `docker-args`, `serve`, `doctor`).
//!
//! - `usr/local/nvidia/lib64/libnvidia-ml.so.<version>` and `libcuda.so.<version>`: stand-in ELF
//!   shared objects (the demo's generator) with their SONAME links, `<version>` the node's driver
//!   version;
//! - `usr/local/nvidia/bin/nvidia-smi`: nvml-sim's `nvidia-smi` stand-in (an ELF program that
//!   lists the node's GPUs it may open, `nvml-sim/src/bin/nvidia-smi`), and
//!   `nvidia-cuda-mps-control`, nvml-sim's MPS stand-in, when built;
//! - `usr/bin/nvidia-smi`: a `#!/bin/sh` wrapper in front of it, as such hosts have, which the
//!   volume planner passes over for the real program;
//! - `etc/ld.so.cache`, written by glibc's `ldconfig -r` for `usr/local/nvidia/lib64`.
//!
//! The stand-ins are looked for beside the simulator library (`libnvml_sim.so`): cargo builds
//! them with `cargo build -p nvml-sim`, the package installs them in `/usr/lib/mesos-gpu/`.
//! Without the `nvidia-smi` stand-in the tree gets a non-runnable ELF in its place, and a
//! warning says how to build it.

use std::os::unix::fs::{PermissionsExt as _, symlink};
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use mesos_gpu_os::{LockFile, fsmode};
use mesos_gpu_volume::DriverVersion;

use mesos_gpu_demo::driver::{elf_object, native_machine, write_cache};

/// The driver's directory inside the tree, as on the host it imitates.
pub(crate) const DRIVER_DIR: &str = "usr/local/nvidia";
/// The nvidia-smi stand-in's file name, beside the simulator library.
pub(crate) const SMI: &str = "nvidia-smi";
/// The MPS control stand-in's file name.
const MPS_CONTROL: &str = "nvidia-cuda-mps-control";

/// The mode of the tree's programs (its directories and libraries get the state modes, whatever
/// the umask).
const PROGRAM: u32 = 0o755;

/// Libraries of the tree as `(prefix, SONAME suffix)`.
const LIBRARIES: &[(&str, &str)] = &[("libnvidia-ml.so", "1"), ("libcuda.so", "1")];

/// The file in a tree saying what it was made from: a tree whose stamp differs (another
/// version, rebuilt stand-ins) is made again.
const STAMP: &str = ".mesos-gpu-sim-stamp";

/// Makes sure `root` holds the driver tree of `version` from the stand-ins in `programs_dir`,
/// kept across commands (a simulated node's driver stays where it is, as a real one does, so a
/// volume built from it verifies in the next command). A missing or stale tree is written beside
/// `root` and renamed into place, so that concurrent commands of the node see a whole tree; the
/// commands that find it so take turns on a lock beside it (`.driver.lock`), and the ones after
/// the first find it made.
pub(crate) fn ensure(
    root: &Path,
    version: &DriverVersion,
    programs_dir: &Path,
) -> anyhow::Result<()> {
    let stamp = stamp_of(version, programs_dir);
    let current = |root: &Path| std::fs::read_to_string(root.join(STAMP)).ok();
    if current(root).as_deref() == Some(stamp.as_str()) {
        return Ok(());
    }
    let parent = root.parent().unwrap_or(Path::new("/"));
    fsmode::create_dir_all(parent, fsmode::STATE_DIR)
        .with_context(|| format!("cannot create {}", parent.display()))?;
    let lock = LockFile::create(&parent.join(".driver.lock"), fsmode::STATE_FILE)?;
    lock.lock()?;
    if current(root).as_deref() == Some(stamp.as_str()) {
        return Ok(());
    }
    let staging = tempfile::Builder::new()
        .prefix(".driver-new-")
        .tempdir_in(parent)
        .with_context(|| format!("cannot make a directory in {}", parent.display()))?;
    write(staging.path(), version, programs_dir)?;
    fsmode::write_file(
        &staging.path().join(STAMP),
        stamp.as_bytes(),
        fsmode::STATE_FILE,
    )
    .context("cannot stamp the simulated driver tree")?;
    std::fs::set_permissions(
        staging.path(),
        std::fs::Permissions::from_mode(fsmode::STATE_DIR),
    )?;
    if root.exists() {
        // Stale: moved aside, then removed.
        let old = tempfile::Builder::new()
            .prefix(".driver-old-")
            .tempdir_in(parent)?
            .keep();
        std::fs::rename(root, old.join("tree"))
            .with_context(|| format!("cannot move the stale tree {} aside", root.display()))?;
        if let Err(e) = std::fs::remove_dir_all(&old) {
            tracing::debug!(dir = %old.display(), error = %e, "cannot remove a stale simulated driver tree");
        }
    }
    let staged = staging.keep();
    std::fs::rename(&staged, root).map_err(|e| {
        let _ = std::fs::remove_dir_all(&staged);
        anyhow::Error::new(e).context(format!(
            "cannot put the simulated driver tree at {}",
            root.display()
        ))
    })
}

/// What a tree is made from: the version, and each stand-in program's size and modification
/// time.
fn stamp_of(version: &DriverVersion, programs_dir: &Path) -> String {
    let mut stamp = format!("version {version}\n");
    for program in [SMI, MPS_CONTROL] {
        let path = programs_dir.join(program);
        let seen = std::fs::metadata(&path).ok().map(|m| {
            let modified = m
                .modified()
                .ok()
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map_or(0, |d| d.as_nanos());
            (m.len(), modified)
        });
        stamp.push_str(&format!("{} {seen:?}\n", path.display()));
    }
    stamp
}

/// Writes the driver tree of `version` under `root`, taking the program stand-ins from
/// `programs_dir`.
fn write(root: &Path, version: &DriverVersion, programs_dir: &Path) -> anyhow::Result<()> {
    let machine = native_machine()?;
    let lib64 = root.join(DRIVER_DIR).join("lib64");
    let bin = root.join(DRIVER_DIR).join("bin");
    for dir in [&lib64, &bin, &root.join("usr/bin")] {
        fsmode::create_dir_all(dir, fsmode::STATE_DIR)
            .with_context(|| format!("cannot create {}", dir.display()))?;
    }
    symlink("lib64", root.join(DRIVER_DIR).join("lib")).context("cannot link lib -> lib64")?;
    for (prefix, suffix) in LIBRARIES {
        let file = format!("{prefix}.{version}");
        let soname = format!("{prefix}.{suffix}");
        let path = lib64.join(&file);
        fsmode::write_file(
            &path,
            &elf_object(machine, Some(&soname)),
            fsmode::STATE_FILE,
        )
        .with_context(|| format!("cannot write {}", path.display()))?;
        symlink(&file, lib64.join(&soname))
            .with_context(|| format!("cannot link {soname} in {}", lib64.display()))?;
    }
    let smi = programs_dir.join(SMI);
    if smi.is_file() {
        copy_program(&smi, &bin.join(SMI))?;
    } else {
        tracing::warn!(
            looked = %smi.display(),
            "the simulated driver's nvidia-smi cannot run: its stand-in is not built (cargo build -p nvml-sim)"
        );
        let path = bin.join(SMI);
        fsmode::write_file(&path, &elf_object(machine, None), PROGRAM)
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    let mps = programs_dir.join(MPS_CONTROL);
    if mps.is_file() {
        copy_program(&mps, &bin.join(MPS_CONTROL))?;
    }
    let wrapper = root.join("usr/bin").join(SMI);
    fsmode::write_file(
        &wrapper,
        format!("#!/bin/sh\n# The driver's programs are in /{DRIVER_DIR}/bin.\nexec /{DRIVER_DIR}/bin/{SMI} \"$@\"\n").as_bytes(),
        PROGRAM,
    )
    .with_context(|| format!("cannot write {}", wrapper.display()))?;
    let note = write_cache(root, &[&format!("{DRIVER_DIR}/lib64")])
        .context("cannot write the simulated driver's ld.so.cache")?;
    tracing::debug!(root = %root.display(), %version, cache = %note, "simulated driver tree ready");
    Ok(())
}

/// The directory the stand-in programs are looked for in: beside the simulator library, or
/// beside this executable when the library came from cargo's `deps/`.
pub(crate) fn programs_dir(sim_lib: &Path) -> PathBuf {
    let dir = sim_lib.parent().unwrap_or(Path::new("/"));
    if dir.file_name().is_some_and(|n| n == "deps") {
        dir.parent().unwrap_or(dir).to_owned()
    } else {
        dir.to_owned()
    }
}

fn copy_program(from: &Path, to: &Path) -> anyhow::Result<()> {
    std::fs::copy(from, to)
        .with_context(|| format!("cannot copy {} to {}", from.display(), to.display()))?;
    std::fs::set_permissions(to, std::fs::Permissions::from_mode(PROGRAM))
        .with_context(|| format!("cannot chmod {}", to.display()))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a failed unwrap fails the test at its line
mod tests {
    use super::*;

    /// Commands of one node starting together after its stand-ins were rebuilt (every tree
    /// stale at once, as when the tests run after `cargo build -p nvml-sim`) all get the tree:
    /// one writes it, the others find it made. Without the lock, one could move aside the stale
    /// tree another had just moved, and fail.
    #[test]
    fn concurrent_commands_all_get_a_rebuilt_tree() {
        let dir = tempfile::tempdir().unwrap();
        let programs = dir.path().join("programs");
        std::fs::create_dir_all(&programs).unwrap();
        std::fs::write(programs.join(SMI), b"old").unwrap();
        let root = dir.path().join("node/driver-550.54.14");
        let version: DriverVersion = "550.54.14".parse().unwrap();
        ensure(&root, &version, &programs).unwrap();
        std::fs::write(programs.join(SMI), b"rebuilt").unwrap();
        let results: Vec<anyhow::Result<()>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..8)
                .map(|_| s.spawn(|| ensure(&root, &version, &programs)))
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for r in &results {
            assert!(r.is_ok(), "{:#}", r.as_ref().unwrap_err());
        }
        let stamp = std::fs::read_to_string(root.join(STAMP)).unwrap();
        assert_eq!(stamp, stamp_of(&version, &programs));
        assert_eq!(
            std::fs::read(root.join(DRIVER_DIR).join("bin").join(SMI)).unwrap(),
            b"rebuilt"
        );
        let left: Vec<_> = std::fs::read_dir(dir.path().join("node"))
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with(".driver-new-") || n.starts_with(".driver-old-"))
            .collect();
        assert!(left.is_empty(), "staging left: {left:?}");
    }
}
