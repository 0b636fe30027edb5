//! The volume built from a real fake driver: shared objects compiled with `cc` (64- and 32-bit),
//! an ld.so.cache written by glibc's `ldconfig`, a CUDA stub, an older driver's leftovers, Mesa's
//! and NVIDIA's GL, and a hostile symlink (see `support/fake_driver.rs`). Checks the plan, hard
//! links on one file system and copies onto tmpfs (`/dev/shm`), crash safety (a leftover build,
//! a build killed with SIGKILL), concurrent creators (threads and processes), tampering, stale
//! host files, hostile entries in the volume root, and gc.
//!
//! Needs `cc` (with `-m32` support); the bind-mount fallback test also needs root.

#[path = "support/fake_driver.rs"]
mod fake_driver;

use std::collections::BTreeSet;
use std::io::Write;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::sync::{Barrier, OnceLock};
use std::time::{Duration, Instant};

use libtest_mimic::{Arguments, Failed, Trial};
use mesos_gpu_os::error_chain;
use mesos_gpu_testkit::{Host, Need, needs};
use mesos_gpu_volume::plan::{DriverSource, ProgramOrigin, SkipReason, VolumeDir};
use mesos_gpu_volume::volume::{KeepReason, Outcome, Problem};
use mesos_gpu_volume::{
    Check, CreateOptions, DriverVersion, LdCache, Materialize, VolumeError, VolumeManager,
    VolumePlan, plan,
};

/// Set in a child process: `<volume root>|<driver root>|link|copy`; the child creates the volume.
const CHILD_ENV: &str = "MGPU_VOLUME_TEST_CHILD";

fn main() -> ExitCode {
    if let Ok(spec) = std::env::var(CHILD_ENV) {
        return child(&spec);
    }
    let host = Host::probe();
    let cc =
        |name: &str, f: fn() -> Result<(), Failed>| needs(&host, &[Need::Cc], Trial::test(name, f));
    let trials = vec![
        cc(
            "plan_selects_the_running_driver",
            plan_selects_the_running_driver,
        ),
        cc(
            "hard_links_on_one_file_system",
            hard_links_on_one_file_system,
        ),
        cc(
            "copies_onto_another_file_system",
            copies_onto_another_file_system,
        ),
        cc(
            "create_reuses_an_intact_volume",
            create_reuses_an_intact_volume,
        ),
        cc(
            "leftover_build_is_ignored_and_removed",
            leftover_build_is_ignored_and_removed,
        ),
        cc(
            "killed_build_leaves_no_half_volume",
            killed_build_leaves_no_half_volume,
        ),
        cc(
            "concurrent_threads_build_one_volume",
            concurrent_threads_build_one_volume,
        ),
        cc(
            "concurrent_processes_build_one_volume",
            concurrent_processes_build_one_volume,
        ),
        cc(
            "tampering_is_detected_and_repaired",
            tampering_is_detected_and_repaired,
        ),
        cc(
            "stale_host_files_trigger_a_rebuild",
            stale_host_files_trigger_a_rebuild,
        ),
        cc(
            "hostile_volume_root_entries_are_not_followed",
            hostile_volume_root_entries_are_not_followed,
        ),
        cc("gc_keeps_what_is_in_use", gc_keeps_what_is_in_use),
        cc(
            "programs_are_found_along_path_past_wrappers_and_other_drivers",
            programs_are_found_along_path_past_wrappers_and_other_drivers,
        ),
        cc(
            "a_format_1_volume_is_reused_and_verified",
            a_format_1_volume_is_reused_and_verified,
        ),
        needs(
            &host,
            &[Need::Cc, Need::Root],
            Trial::test(
                "bind_mount_falls_back_to_copies",
                bind_mount_falls_back_to_copies,
            ),
        ),
        cc(
            "reading_a_volume_root_creates_nothing",
            reading_a_volume_root_creates_nothing,
        ),
        needs(
            &host,
            &[Need::Cc, Need::Root],
            Trial::test(
                "verify_and_list_work_on_a_read_only_root",
                verify_and_list_work_on_a_read_only_root,
            ),
        ),
    ];
    libtest_mimic::run(&Arguments::from_args(), trials).exit_code()
}

struct Driver {
    _dir: tempfile::TempDir,
    root: PathBuf,
    cache: LdCache,
}

impl Driver {
    fn new() -> Result<Driver, Failed> {
        let dir = tempfile::tempdir()?;
        let root = dir.path().join("driver");
        let cache = fake_driver::small_driver(&root)?;
        Ok(Driver {
            cache: LdCache::read(&cache)?,
            root,
            _dir: dir,
        })
    }

    fn plan(&self) -> Result<VolumePlan, Failed> {
        Ok(plan(&self.root, &self.cache, &version())?)
    }
}

/// One driver tree shared by the tests that do not change it.
fn shared() -> Result<&'static Driver, Failed> {
    static DRIVER: OnceLock<Result<Driver, String>> = OnceLock::new();
    DRIVER
        .get_or_init(|| Driver::new().map_err(|e| format!("cannot build the fake driver: {e:?}")))
        .as_ref()
        .map_err(|e| Failed::from(e.clone()))
}

fn version() -> DriverVersion {
    fake_driver::VERSION
        .parse()
        .unwrap_or_else(|e| panic!("{e}"))
}

fn ensure(cond: bool, what: impl FnOnce() -> String) -> Result<(), Failed> {
    if cond { Ok(()) } else { Err(what().into()) }
}

/// A volume root on tmpfs, to force copies.
fn shm_root() -> Result<tempfile::TempDir, Failed> {
    let dir = tempfile::tempdir_in("/dev/shm")?;
    let tmp = tempfile::tempdir()?;
    ensure(
        dir.path().metadata()?.dev() != tmp.path().metadata()?.dev(),
        || "/dev/shm and the temp dir share a file system; cannot test copies".into(),
    )?;
    Ok(dir)
}

fn plan_selects_the_running_driver() -> Result<(), Failed> {
    let d = shared()?;
    let plan = d.plan()?;
    let v = fake_driver::VERSION;
    let files: BTreeSet<(VolumeDir, String)> =
        plan.files.iter().map(|f| (f.dir, f.name.clone())).collect();
    let want: BTreeSet<(VolumeDir, String)> = [
        (VolumeDir::Bin, "nvidia-debugdump".to_owned()),
        (VolumeDir::Bin, "nvidia-smi".to_owned()),
        (VolumeDir::Lib, format!("libcuda.so.{v}")),
        (VolumeDir::Lib, format!("libnvidia-ml.so.{v}")),
        (VolumeDir::Lib64, "libGL.so.1.7.0".to_owned()),
        (VolumeDir::Lib64, format!("libGLX_nvidia.so.{v}")),
        (VolumeDir::Lib64, "libGLdispatch.so.0".to_owned()),
        (VolumeDir::Lib64, format!("libcuda.so.{v}")),
        (VolumeDir::Lib64, format!("libnvidia-glcore.so.{v}")),
        (VolumeDir::Lib64, format!("libnvidia-ml.so.{v}")),
        (VolumeDir::Lib64, format!("libnvidia-ptxjitcompiler.so.{v}")),
    ]
    .into_iter()
    .collect();
    ensure(files == want, || {
        format!("files {files:#?}\nskipped {:#?}", plan.skipped)
    })?;
    for f in &plan.files {
        ensure(f.source.starts_with(&d.root), || {
            format!("{} is outside the driver root", f.source.display())
        })?;
    }
    let reason = |path: &str| {
        plan.skipped
            .iter()
            .find(|s| s.path.as_deref() == Some(Path::new(path)))
            .map(|s| s.reason.clone())
    };
    let stub = reason("/usr/local/cuda/lib64/stubs/libcuda.so.1")
        .or_else(|| reason("/usr/local/cuda/lib64/stubs/libcuda.so"));
    ensure(stub == Some(SkipReason::Unversioned), || {
        format!("stub: {stub:?}\n{:#?}", plan.skipped)
    })?;
    let old = reason("/usr/lib64/libnvidia-ml.so.1");
    ensure(
        old == Some(SkipReason::OtherVersion {
            found: fake_driver::OLD_VERSION.into(),
        }),
        || format!("old driver: {old:?}"),
    )?;
    let mesa = reason("/usr/lib/mesa/libGL.so.1");
    ensure(matches!(mesa, Some(SkipReason::NotNvidiaGl { .. })), || {
        format!("mesa: {mesa:?}")
    })?;
    let cfg = reason("/usr/lib/x86_64-linux-gnu/libnvidia-cfg.so.1");
    ensure(matches!(cfg, Some(SkipReason::Unresolvable { .. })), || {
        format!("hostile link: {cfg:?}")
    })?;
    let persistenced = plan
        .skipped
        .iter()
        .find(|s| s.name == "nvidia-persistenced")
        .map(|s| &s.reason);
    ensure(persistenced == Some(&SkipReason::NotFound), || {
        format!("persistenced: {persistenced:?}")
    })?;

    let links: BTreeSet<(VolumeDir, &str, &str)> = plan
        .links
        .iter()
        .map(|l| (l.dir, l.name.as_str(), l.target.as_str()))
        .collect();
    let ml = format!("libnvidia-ml.so.{v}");
    let cuda = format!("libcuda.so.{v}");
    for want in [
        (VolumeDir::Lib64, "libnvidia-ml.so.1", ml.as_str()),
        (VolumeDir::Lib64, "libcuda.so.1", cuda.as_str()),
        (VolumeDir::Lib64, "libcuda.so", "libcuda.so.1"),
        (
            VolumeDir::Lib64,
            "libGLX_indirect.so.0",
            "libGLX_nvidia.so.0",
        ),
        (VolumeDir::Lib64, "libGL.so.1", "libGL.so.1.7.0"),
        (VolumeDir::Lib, "libnvidia-ml.so.1", ml.as_str()),
        (VolumeDir::Lib, "libcuda.so", "libcuda.so.1"),
    ] {
        ensure(links.contains(&want), || {
            format!("missing link {want:?} in {links:#?}")
        })?;
    }
    Ok(())
}

fn check_volume_matches_sources(volume: &Path, plan: &VolumePlan) -> Result<(), Failed> {
    for f in &plan.files {
        let built = volume.join(f.dir.as_str()).join(&f.name);
        let (a, b) = (std::fs::read(&built)?, std::fs::read(&f.source)?);
        ensure(a == b, || {
            format!("{} differs from {}", built.display(), f.source.display())
        })?;
        let (bm, sm) = (
            std::fs::symlink_metadata(&built)?,
            std::fs::metadata(&f.source)?,
        );
        ensure(
            bm.permissions().mode() & 0o777 == sm.permissions().mode() & 0o777,
            || format!("{} mode", built.display()),
        )?;
        ensure(bm.mtime() == sm.mtime(), || {
            format!("{} mtime", built.display())
        })?;
    }
    for l in &plan.links {
        let at = volume.join(l.dir.as_str()).join(&l.name);
        ensure(std::fs::read_link(&at)? == Path::new(&l.target), || {
            format!("{} target", at.display())
        })?;
        ensure(std::fs::metadata(&at).is_ok(), || {
            format!("{} dangles", at.display())
        })?;
    }
    Ok(())
}

fn hard_links_on_one_file_system() -> Result<(), Failed> {
    let d = shared()?;
    let plan = d.plan()?;
    let root = tempfile::tempdir()?;
    let manager = VolumeManager::at(root.path());
    let volume = manager.create(&plan)?;
    ensure(volume.outcome == Outcome::Created, || {
        format!("{:?}", volume.outcome)
    })?;
    ensure(
        volume.hardlinked == plan.files.len() && volume.copied == 0,
        || format!("{volume:?}"),
    )?;
    ensure(
        volume.path == root.path().canonicalize()?.join("nvidia_550.54.14"),
        || format!("{:?}", volume.path),
    )?;
    for f in &plan.files {
        let built = volume.path.join(f.dir.as_str()).join(&f.name);
        ensure(
            built.metadata()?.ino() == f.source.metadata()?.ino(),
            || format!("{} is not a hard link", built.display()),
        )?;
    }
    check_volume_matches_sources(&volume.path, &plan)?;
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(volume.path.join("manifest.json"))?)?;
    ensure(
        manifest["files"].as_array().map(Vec::len) == Some(plan.files.len()),
        || format!("{manifest}"),
    )?;
    ensure(
        manifest["files"][0]["blake3"]
            .as_str()
            .is_some_and(|s| s.len() == 64),
        || format!("{manifest}"),
    )?;
    let report = manager.verify(&version(), Some(&plan), Check::Checksums)?;
    ensure(report.is_intact(), || format!("{:?}", report.problems))
}

fn copies_onto_another_file_system() -> Result<(), Failed> {
    let d = shared()?;
    let plan = d.plan()?;
    let root = shm_root()?;
    let manager = VolumeManager::at(root.path());
    let volume = manager.create(&plan)?;
    ensure(
        volume.copied == plan.files.len() && volume.hardlinked == 0,
        || format!("{volume:?}"),
    )?;
    check_volume_matches_sources(&volume.path, &plan)?;
    let report = manager.verify(&version(), Some(&plan), Check::Checksums)?;
    ensure(report.is_intact(), || format!("{:?}", report.problems))?;
    // Copying can also be asked for on one file system.
    let same_fs = tempfile::tempdir()?;
    let copy = CreateOptions {
        materialize: Materialize::Copy,
        ..CreateOptions::default()
    };
    let volume = VolumeManager::at(same_fs.path()).create_with(&plan, copy)?;
    ensure(volume.copied == plan.files.len(), || format!("{volume:?}"))
}

fn create_reuses_an_intact_volume() -> Result<(), Failed> {
    let d = shared()?;
    let plan = d.plan()?;
    let root = tempfile::tempdir()?;
    let manager = VolumeManager::at(root.path());
    let first = manager.create(&plan)?;
    let ino = first.path.metadata()?.ino();
    let again = manager.create(&d.plan()?)?;
    ensure(again.outcome == Outcome::Reused, || {
        format!("{:?}", again.outcome)
    })?;
    ensure(again.path.metadata()?.ino() == ino, || {
        "the volume was replaced".into()
    })?;
    let empty = VolumePlan {
        files: Vec::new(),
        ..plan
    };
    ensure(
        matches!(manager.create(&empty), Err(VolumeError::EmptyPlan { .. })),
        || "empty plan accepted".into(),
    )
}

fn leftover_build_is_ignored_and_removed() -> Result<(), Failed> {
    let d = shared()?;
    let plan = d.plan()?;
    let root = tempfile::tempdir()?;
    // What a build killed after writing one file leaves, and a crash between retiring the old
    // volume and publishing the new one.
    let leftover = root.path().join(".tmp-nvidia_550.54.14-1-2-3");
    std::fs::create_dir_all(leftover.join("lib64"))?;
    std::fs::write(leftover.join("lib64/libcuda.so.550.54.14"), b"half")?;
    let retired = root.path().join(".retired-nvidia_550.54.14-1-2-3");
    std::fs::create_dir_all(retired.join("lib64"))?;
    let manager = VolumeManager::at(root.path());
    ensure(manager.list()?.is_empty(), || {
        "a leftover was listed as a volume".into()
    })?;
    let volume = manager.create(&plan)?;
    ensure(volume.outcome == Outcome::Created, || {
        format!("{:?}", volume.outcome)
    })?;
    ensure(!leftover.exists(), || "leftover build not removed".into())?;
    let report = manager.gc(&[version()])?;
    ensure(!retired.exists() && report.removed.len() == 1, || {
        format!("retired volume not collected: {report:?}")
    })?;
    ensure(
        manager
            .verify(&version(), Some(&plan), Check::Checksums)?
            .is_intact(),
        || "volume damaged".into(),
    )
}

fn killed_build_leaves_no_half_volume() -> Result<(), Failed> {
    let dir = tempfile::tempdir()?;
    let driver = dir.path().join("driver");
    fake_driver::small_driver(&driver)?;
    // A big libcuda makes the copy take long enough to be killed in the middle.
    fake_driver::pad(
        &driver.join(fake_driver::LIB64).join("libcuda.so.550.54.14"),
        48 << 20,
    )?;
    let root = shm_root()?;
    let mut killed_mid_build = false;
    for _ in 0..3 {
        let mut child = spawn_child(root.path(), &driver, "copy")?;
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            let building = std::fs::read_dir(root.path())?
                .flatten()
                .any(|e| e.file_name().to_string_lossy().starts_with(".tmp-"));
            if building {
                killed_mid_build = true;
                break;
            }
            if child.try_wait()?.is_some() {
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        child.kill()?;
        child.wait()?;
        let published = root.path().join("nvidia_550.54.14");
        if published.exists() {
            // The child finished first: what is published must be whole.
            let cache = LdCache::read(&driver.join("etc/ld.so.cache"))?;
            let plan = plan(&driver, &cache, &version())?;
            let report =
                VolumeManager::at(root.path()).verify(&version(), Some(&plan), Check::Checksums)?;
            ensure(report.is_intact(), || {
                format!("published volume is damaged: {:?}", report.problems)
            })?;
            std::fs::remove_dir_all(published)?;
        } else if killed_mid_build {
            break;
        }
    }
    ensure(killed_mid_build, || {
        "never caught the build in progress".into()
    })?;
    ensure(!root.path().join("nvidia_550.54.14").exists(), || {
        "a half volume is published".into()
    })?;
    let cache = LdCache::read(&driver.join("etc/ld.so.cache"))?;
    let plan = plan(&driver, &cache, &version())?;
    let manager = VolumeManager::at(root.path());
    let volume = manager.create(&plan)?;
    ensure(volume.outcome == Outcome::Created, || {
        format!("{:?}", volume.outcome)
    })?;
    let leftovers: Vec<_> = std::fs::read_dir(root.path())?
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".tmp-"))
        .collect();
    ensure(leftovers.is_empty(), || format!("leftovers {leftovers:?}"))?;
    ensure(
        manager
            .verify(&version(), Some(&plan), Check::Metadata)?
            .is_intact(),
        || "damaged".into(),
    )
}

fn concurrent_threads_build_one_volume() -> Result<(), Failed> {
    let d = shared()?;
    let plan = d.plan()?;
    let root = tempfile::tempdir()?;
    let barrier = Barrier::new(4);
    let outcomes = std::thread::scope(|s| {
        let handles: Vec<_> = (0..4)
            .map(|_| {
                s.spawn(|| {
                    barrier.wait();
                    VolumeManager::at(root.path())
                        .create(&plan)
                        .map(|v| v.outcome)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().map_err(|_| "thread panicked"))
            .collect::<Vec<_>>()
    });
    let mut created = 0;
    for outcome in outcomes {
        match outcome?? {
            Outcome::Created => created += 1,
            Outcome::Reused => {}
            other => return Err(format!("unexpected {other:?}").into()),
        }
    }
    ensure(created == 1, || {
        format!("{created} creators built the volume")
    })?;
    one_intact_volume(root.path(), &plan)
}

fn one_intact_volume(root: &Path, plan: &VolumePlan) -> Result<(), Failed> {
    let names: Vec<String> = std::fs::read_dir(root)?
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n != ".lock")
        .collect();
    ensure(names == ["nvidia_550.54.14"], || {
        format!("root holds {names:?}")
    })?;
    let report = VolumeManager::at(root).verify(&version(), Some(plan), Check::Checksums)?;
    ensure(report.is_intact(), || format!("{:?}", report.problems))
}

fn spawn_child(root: &Path, driver: &Path, mode: &str) -> Result<std::process::Child, Failed> {
    Ok(Command::new(std::env::current_exe()?)
        .env(
            CHILD_ENV,
            format!("{}|{}|{mode}", root.display(), driver.display()),
        )
        .spawn()?)
}

fn child(spec: &str) -> ExitCode {
    let run = || -> Result<(), Box<dyn std::error::Error>> {
        let parts: Vec<&str> = spec.split('|').collect();
        let [root, driver, mode] = parts[..] else {
            return Err(format!("bad {CHILD_ENV}: {spec}").into());
        };
        let cache = LdCache::read(&Path::new(driver).join("etc/ld.so.cache"))?;
        let plan = plan(Path::new(driver), &cache, &version())?;
        let materialize = if mode == "copy" {
            Materialize::Copy
        } else {
            Materialize::LinkOrCopy
        };
        VolumeManager::at(root).create_with(
            &plan,
            CreateOptions {
                materialize,
                ..CreateOptions::default()
            },
        )?;
        Ok(())
    };
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("child: {e}");
            ExitCode::FAILURE
        }
    }
}

fn concurrent_processes_build_one_volume() -> Result<(), Failed> {
    let d = shared()?;
    let plan = d.plan()?;
    let root = shm_root()?;
    let children: Vec<_> = (0..2)
        .map(|_| spawn_child(root.path(), &d.root, "copy"))
        .collect::<Result<_, _>>()?;
    for mut child in children {
        let status = child.wait()?;
        ensure(status.success(), || format!("a creator failed: {status}"))?;
    }
    one_intact_volume(root.path(), &plan)
}

/// A volume built by an earlier release (manifest format 1, SHA-256 digests) is reused as it is
/// after an upgrade, its checksums are still checked, and a format this release does not know is
/// refused with a message naming the formats it reads.
fn a_format_1_volume_is_reused_and_verified() -> Result<(), Failed> {
    use sha2::Digest as _;
    let d = shared()?;
    let plan = d.plan()?;
    let root = shm_root()?;
    let manager = VolumeManager::at(root.path());
    let volume = manager.create(&plan)?;
    let manifest_path = volume.path.join("manifest.json");
    let mut manifest: serde_json::Value = serde_json::from_slice(&std::fs::read(&manifest_path)?)?;
    manifest["format"] = 1.into();
    for file in manifest["files"].as_array_mut().ok_or("no files")? {
        let path = volume
            .path
            .join(file["dir"].as_str().ok_or("no dir")?)
            .join(file["name"].as_str().ok_or("no name")?);
        let sum = sha2::Sha256::digest(std::fs::read(&path)?);
        let hex: String = sum.iter().map(|b| format!("{b:02x}")).collect();
        let entry = file.as_object_mut().ok_or("file is not an object")?;
        entry.remove("blake3").ok_or("no blake3 digest")?;
        entry.insert("sha256".into(), hex.into());
    }
    std::fs::write(&manifest_path, serde_json::to_vec(&manifest)?)?;

    let reused = manager.create(&plan)?;
    ensure(reused.outcome == Outcome::Reused, || {
        format!("{:?}", reused.outcome)
    })?;
    let report = manager.verify(&version(), Some(&plan), Check::Checksums)?;
    ensure(report.is_intact(), || format!("{:?}", report.problems))?;

    // Same size and mtime, one byte changed: only the SHA-256 check sees it.
    let victim = volume.path.join("lib64/libcuda.so.550.54.14");
    let mtime = std::fs::metadata(&victim)?.modified()?;
    let mut bytes = std::fs::read(&victim)?;
    bytes[0] ^= 0xff;
    std::fs::write(&victim, &bytes)?;
    std::fs::File::options()
        .write(true)
        .open(&victim)?
        .set_modified(mtime)?;
    let report = manager.verify(&version(), Some(&plan), Check::Checksums)?;
    ensure(
        report
            .problems
            .iter()
            .any(|p| matches!(p, Problem::Checksum { .. })),
        || format!("{:?}", report.problems),
    )?;

    manifest["format"] = 3.into();
    std::fs::write(&manifest_path, serde_json::to_vec(&manifest)?)?;
    let err = match manager.verify(&version(), Some(&plan), Check::Metadata) {
        Ok(report) => format!("{:?}", report.problems),
        Err(e) => error_chain(&e),
    };
    ensure(
        err.contains("has format 3; this program reads formats 1 to 2"),
        || err,
    )
}

fn tampering_is_detected_and_repaired() -> Result<(), Failed> {
    let d = shared()?;
    let plan = d.plan()?;
    let root = shm_root()?;
    let manager = VolumeManager::at(root.path());
    let volume = manager.create(&plan)?;
    let victim = volume.path.join("lib64/libcuda.so.550.54.14");
    let original = std::fs::read(&victim)?;

    // Appending changes size and mtime: the metadata check sees it.
    std::fs::OpenOptions::new()
        .append(true)
        .open(&victim)?
        .write_all(b"evil")?;
    let report = manager.verify(&version(), Some(&plan), Check::Metadata)?;
    ensure(
        report
            .problems
            .iter()
            .any(|p| matches!(p, Problem::Size { .. })),
        || format!("{:?}", report.problems),
    )?;
    let rebuilt = manager.create(&plan)?;
    ensure(matches!(rebuilt.outcome, Outcome::Rebuilt { .. }), || {
        format!("{:?}", rebuilt.outcome)
    })?;
    ensure(std::fs::read(&victim)? == original, || {
        "not repaired".into()
    })?;

    // Same size, mtime put back: only the checksums see it.
    let mtime = std::fs::metadata(&victim)?.modified()?;
    let mut bytes = original.clone();
    bytes[0] ^= 0xff;
    std::fs::write(&victim, &bytes)?;
    std::fs::File::options()
        .write(true)
        .open(&victim)?
        .set_modified(mtime)?;
    ensure(
        manager
            .verify(&version(), Some(&plan), Check::Metadata)?
            .is_intact(),
        || "metadata check should miss it".into(),
    )?;
    let report = manager.verify(&version(), Some(&plan), Check::Checksums)?;
    ensure(
        report.problems
            == [Problem::Checksum {
                path: "lib64/libcuda.so.550.54.14".into(),
            }],
        || format!("{:?}", report.problems),
    )?;
    let options = CreateOptions {
        check: Check::Checksums,
        ..CreateOptions::default()
    };
    let rebuilt = manager.create_with(&plan, options)?;
    ensure(matches!(rebuilt.outcome, Outcome::Rebuilt { .. }), || {
        format!("{:?}", rebuilt.outcome)
    })?;
    ensure(std::fs::read(&victim)? == original, || {
        "not repaired".into()
    })?;

    // An extra file is damage too.
    std::fs::write(volume.path.join("lib64/libinjected.so"), b"x")?;
    let report = manager.verify(&version(), None, Check::Metadata)?;
    ensure(
        report.problems
            == [Problem::Extra {
                path: "lib64/libinjected.so".into(),
            }],
        || format!("{:?}", report.problems),
    )
}

fn stale_host_files_trigger_a_rebuild() -> Result<(), Failed> {
    let d = Driver::new()?;
    let plan = d.plan()?;
    let root = tempfile::tempdir()?;
    let manager = VolumeManager::at(root.path());
    manager.create(&plan)?;
    let ml = d
        .root
        .join(fake_driver::LIB64)
        .join("libnvidia-ml.so.550.54.14");

    // Changed between planning and building: the build refuses.
    fake_driver::pad(&ml, ml.metadata()?.len() + 4096)?;
    let other_root = tempfile::tempdir()?;
    match VolumeManager::at(other_root.path()).create(&plan) {
        Err(e) if e.is_source_changed() => {}
        other => return Err(format!("expected SourceChanged, got {other:?}").into()),
    }

    // The host's driver file was replaced: a fresh plan sees the volume is stale.
    std::fs::remove_file(&ml)?;
    fake_driver::compile(
        &d.root,
        &fake_driver::Lib::new(
            fake_driver::LIB64,
            "libnvidia-ml.so.550.54.14",
            "libnvidia-ml.so.1",
        )
        .size(64 << 10),
    )?;
    let fresh = d.plan()?;
    let rebuilt = manager.create(&fresh)?;
    let Outcome::Rebuilt { problems } = &rebuilt.outcome else {
        return Err(format!("{:?}", rebuilt.outcome).into());
    };
    ensure(
        problems
            .iter()
            .any(|p| matches!(p, Problem::SourceChanged { .. })),
        || format!("{problems:?}"),
    )?;
    let built = rebuilt.path.join("lib64/libnvidia-ml.so.550.54.14");
    ensure(built.metadata()?.ino() == ml.metadata()?.ino(), || {
        "the rebuilt volume links the old file".into()
    })?;
    // The replaced volume is kept aside until gc.
    let retired = std::fs::read_dir(root.path())?
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(".retired-"))
        .count();
    ensure(retired == 1, || format!("{retired} retired volumes"))?;
    manager.gc(&[version()])?;
    one_intact_volume(root.path(), &fresh)
}

fn hostile_volume_root_entries_are_not_followed() -> Result<(), Failed> {
    let d = shared()?;
    let plan = d.plan()?;
    let outside = tempfile::tempdir()?;
    std::fs::write(outside.path().join("precious"), b"keep me")?;
    let listing = |p: &Path| -> Result<Vec<String>, Failed> {
        let mut v: Vec<String> = std::fs::read_dir(p)?
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        Ok(v)
    };

    // A symlink where the volume belongs, and one posing as a leftover build.
    let root = tempfile::tempdir()?;
    std::os::unix::fs::symlink(outside.path(), root.path().join("nvidia_550.54.14"))?;
    std::os::unix::fs::symlink(
        outside.path(),
        root.path().join(".tmp-nvidia_550.54.14-6-6-6"),
    )?;
    let manager = VolumeManager::at(root.path());
    let volume = manager.create(&plan)?;
    ensure(std::fs::symlink_metadata(&volume.path)?.is_dir(), || {
        "volume is not a real directory".into()
    })?;
    ensure(listing(outside.path())? == ["precious"], || {
        "wrote outside the volume root".into()
    })?;
    ensure(
        std::fs::read(outside.path().join("precious"))? == b"keep me",
        || "clobbered".into(),
    )?;

    // A symlinked lock file is refused, and so is a symlinked refs directory.
    let root = tempfile::tempdir()?;
    std::os::unix::fs::symlink(outside.path().join("precious"), root.path().join(".lock"))?;
    let err = VolumeManager::at(root.path()).create(&plan).err();
    ensure(matches!(err, Some(VolumeError::Lock(_))), || {
        format!("{err:?}")
    })?;
    let root = tempfile::tempdir()?;
    let manager = VolumeManager::at(root.path());
    manager.create(&plan)?;
    std::os::unix::fs::symlink(outside.path(), root.path().join("refs"))?;
    let err = manager.acquire(&version(), "task-1").err();
    ensure(matches!(err, Some(VolumeError::Hostile { .. })), || {
        format!("{err:?}")
    })?;
    ensure(listing(outside.path())? == ["precious"], || {
        "wrote outside the volume root".into()
    })?;

    // A root others can write to is refused; so are path-like holders.
    let root = tempfile::tempdir()?;
    std::fs::set_permissions(root.path(), std::fs::Permissions::from_mode(0o777))?;
    let err = VolumeManager::at(root.path()).create(&plan).err();
    ensure(matches!(err, Some(VolumeError::UnsafeRoot { .. })), || {
        format!("{err:?}")
    })?;
    let err = manager.acquire(&version(), "../../etc/passwd").err();
    ensure(matches!(err, Some(VolumeError::BadHolder { .. })), || {
        format!("{err:?}")
    })?;
    ensure(
        std::fs::read(outside.path().join("precious"))? == b"keep me",
        || "clobbered".into(),
    )
}

fn gc_keeps_what_is_in_use() -> Result<(), Failed> {
    let d = shared()?;
    let root = tempfile::tempdir()?;
    let manager = VolumeManager::at(root.path());
    let current = manager.create(&d.plan()?)?;
    let old_version: DriverVersion = fake_driver::OLD_VERSION.parse()?;
    let old = manager.create(&plan(&d.root, &d.cache, &old_version)?)?;
    let versions: Vec<_> = manager
        .list()?
        .into_iter()
        .map(|v| v.driver_version.to_string())
        .collect();
    ensure(
        versions == [fake_driver::OLD_VERSION, fake_driver::VERSION],
        || format!("{versions:?}"),
    )?;

    manager.acquire(&version(), "task-1")?;
    manager.acquire(&version(), "task-1")?;
    ensure(manager.holders(&version())? == ["task-1"], || {
        "holders".into()
    })?;
    let report = manager.gc(&[])?;
    ensure(report.removed == [old.path.clone()], || {
        format!("{report:?}")
    })?;
    ensure(
        report.kept.len() == 1
            && report.kept[0].reason
                == KeepReason::InUse {
                    holders: vec!["task-1".into()],
                },
        || format!("{report:?}"),
    )?;
    ensure(current.path.exists(), || "in-use volume collected".into())?;

    ensure(manager.release(&version(), "task-1")?, || "release".into())?;
    ensure(!manager.release(&version(), "task-1")?, || {
        "double release".into()
    })?;
    let report = manager.gc(&[version()])?;
    ensure(
        report.removed.is_empty() && report.kept[0].reason == KeepReason::Requested,
        || format!("{report:?}"),
    )?;
    let report = manager.gc(&[])?;
    ensure(report.removed == [current.path.clone()], || {
        format!("{report:?}")
    })?;
    ensure(manager.list()?.is_empty(), || "volumes left".into())?;
    let err = manager.acquire(&version(), "task-2").err();
    ensure(
        matches!(err, Some(VolumeError::NoSuchVolume { .. })),
        || format!("{err:?}"),
    )
}

/// A bind mount of the driver root: same `st_dev`, but link(2) across mount points fails with
/// EXDEV, so every file must fall back to a copy.
fn bind_mount_falls_back_to_copies() -> Result<(), Failed> {
    let d = shared()?;
    let dir = tempfile::tempdir()?;
    let bound = dir.path().join("bound");
    std::fs::create_dir(&bound)?;
    let status = Command::new("mount")
        .arg("--bind")
        .arg(&d.root)
        .arg(&bound)
        .status()?;
    ensure(status.success(), || {
        format!("mount --bind failed: {status}")
    })?;
    struct Unmount(PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg(&self.0).status();
        }
    }
    let _unmount = Unmount(bound.clone());
    let plan = plan(&bound, &d.cache, &version())?;
    let root = dir.path().join("volumes");
    let volume = VolumeManager::at(&root).create(&plan)?;
    ensure(volume.copied == plan.files.len(), || format!("{volume:?}"))?;
    check_volume_matches_sources(&volume.path, &plan)
}

fn reading_a_volume_root_creates_nothing() -> Result<(), Failed> {
    let d = shared()?;
    let dir = tempfile::tempdir()?;
    let root = dir.path().join("volumes");
    let manager = VolumeManager::at(&root);
    ensure(manager.list()?.is_empty(), || {
        "volumes in a missing root".into()
    })?;
    ensure(
        matches!(
            manager.verify(&version(), None, Check::Metadata),
            Err(VolumeError::NoSuchVolume { .. })
        ),
        || "verify of a missing root".into(),
    )?;
    ensure(!root.exists(), || "the root was created".into())?;
    manager.create(&d.plan()?)?;
    std::fs::remove_file(root.join(".lock"))?;
    ensure(manager.list()?.len() == 1, || "one volume".into())?;
    let report = manager.verify(&version(), Some(&d.plan()?), Check::Metadata)?;
    ensure(report.is_intact(), || format!("{report:?}"))?;
    ensure(!root.join(".lock").exists(), || {
        "a reader created the lock file".into()
    })
}

fn verify_and_list_work_on_a_read_only_root() -> Result<(), Failed> {
    let d = shared()?;
    let dir = tempfile::tempdir()?;
    let root = dir.path().join("volumes");
    let manager = VolumeManager::at(&root);
    manager.create(&d.plan()?)?;
    struct Unmount(PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg(&self.0).status();
        }
    }
    let status = Command::new("mount")
        .arg("--bind")
        .arg(&root)
        .arg(&root)
        .status()?;
    ensure(status.success(), || format!("mount --bind: {status}"))?;
    let _unmount = Unmount(root.clone());
    let status = Command::new("mount")
        .args(["-o", "remount,bind,ro"])
        .arg(&root)
        .status()?;
    ensure(status.success(), || format!("remount read-only: {status}"))?;
    ensure(std::fs::write(root.join("probe"), b"").is_err(), || {
        "the root is still writable".into()
    })?;
    let report = manager.verify(&version(), Some(&d.plan()?), Check::Checksums)?;
    ensure(report.is_intact(), || format!("{report:?}"))?;
    let listed = manager.list()?;
    ensure(listed.len() == 1 && listed[0].problems.is_empty(), || {
        format!("{listed:?}")
    })?;
    ensure(manager.holders(&version())?.is_empty(), || "holders".into())
}

/// A host laid out as GPU cloud hosts are (the driver under `/usr/local/nvidia`, `lib -> lib64`):
/// `/usr/bin/nvidia-smi` is a `#!/bin/sh` wrapper, an older driver's real `nvidia-smi` is along
/// `PATH` too, and the running driver's is in `/usr/local/nvidia/bin`, which is not on `PATH`.
/// The planner passes over the wrapper and the other driver's program, says why, and takes the
/// driver's own; a program of this driver along `PATH` is taken first.
fn programs_are_found_along_path_past_wrappers_and_other_drivers() -> Result<(), Failed> {
    let dir = tempfile::tempdir()?;
    let root = dir.path();
    let v = fake_driver::VERSION;
    let old = fake_driver::OLD_VERSION;
    for lib in [
        fake_driver::Lib::new(
            "usr/local/nvidia/lib64",
            &format!("libnvidia-ml.so.{v}"),
            "libnvidia-ml.so.1",
        ),
        fake_driver::Lib::new(
            "usr/local/nvidia/lib64",
            &format!("libcuda.so.{v}"),
            "libcuda.so.1",
        ),
    ] {
        fake_driver::compile(root, &lib)?;
    }
    std::os::unix::fs::symlink("lib64", root.join("usr/local/nvidia/lib"))?;
    let cache = LdCache::read(&fake_driver::ldconfig(root, &["usr/local/nvidia/lib64"])?)?;
    let wrapper = root.join("usr/bin/nvidia-smi");
    std::fs::create_dir_all(root.join("usr/bin"))?;
    std::fs::write(
        &wrapper,
        "#!/bin/sh\nexec /usr/local/nvidia/bin/nvidia-smi \"$@\"\n",
    )?;
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755))?;
    fake_driver::program_saying(
        root,
        "opt/nvidia-470/bin/nvidia-smi",
        &format!("NVIDIA-SMI version  : {old}"),
    )?;
    fake_driver::program_saying(
        root,
        "usr/local/nvidia/bin/nvidia-smi",
        &format!("NVIDIA-SMI version  : {v}"),
    )?;
    let plan_along = |path: &str| {
        mesos_gpu_volume::plan::plan_from(
            &DriverSource::with_path(root, std::ffi::OsStr::new(path)),
            &cache,
            &version(),
        )
    };

    let plan = plan_along("/usr/local/sbin:/usr/bin:/opt/nvidia-470/bin:relative/bin")?;
    let smi = plan
        .files
        .iter()
        .find(|f| f.name == "nvidia-smi")
        .ok_or_else(|| format!("no nvidia-smi planned; skipped: {:#?}", plan.skipped))?;
    ensure(
        smi.found_as == Path::new("/usr/local/nvidia/bin/nvidia-smi")
            && smi.origin == Some(ProgramOrigin::DriverBin),
        || format!("nvidia-smi from the wrong place: {smi:#?}"),
    )?;
    let skipped: Vec<(String, &SkipReason)> = plan
        .skipped
        .iter()
        .filter(|s| s.name == "nvidia-smi")
        .map(|s| {
            let path = s.path.as_deref().map(|p| p.display().to_string());
            (path.unwrap_or_default(), &s.reason)
        })
        .collect();
    ensure(
        matches!(
            &skipped[..],
            [
                (wrapper, SkipReason::NotElf { .. }),
                (older, SkipReason::OtherVersion { found }),
            ] if wrapper == "/usr/bin/nvidia-smi"
                && older == "/opt/nvidia-470/bin/nvidia-smi"
                && found == old
        ),
        || format!("candidates passed over, in order: {skipped:#?}"),
    )?;

    fake_driver::program_saying(
        root,
        "opt/nvidia/bin/nvidia-smi",
        &format!("nvidia-smi {v}"),
    )?;
    let plan = plan_along("/opt/nvidia/bin:/usr/bin")?;
    let smi = plan.files.iter().find(|f| f.name == "nvidia-smi");
    ensure(
        smi.is_some_and(|f| {
            f.found_as == Path::new("/opt/nvidia/bin/nvidia-smi")
                && f.origin == Some(ProgramOrigin::SearchPath)
        }),
        || format!("the program along PATH is not the one taken: {smi:#?}"),
    )?;

    let volume_root = tempfile::tempdir()?;
    let volume = VolumeManager::at(volume_root.path()).create(&plan)?;
    let copied = std::fs::read(volume.path.join("bin/nvidia-smi"))?;
    ensure(copied.starts_with(b"\x7fELF"), || {
        "the volume's nvidia-smi is not the ELF program".into()
    })
}
