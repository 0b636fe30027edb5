//! Prints the volume manager's performance figures:
//!
//! - ld.so.cache parsing on the host's `/etc/ld.so.cache`, in entries per second;
//! - creating the volume of a realistic driver (about 80 libraries, 600 MiB; see
//!   `tests/support/fake_driver.rs`) with hard links on the driver's file system, by phase
//!   (links and publishing: target under 20 ms; hashing for the manifest);
//! - copying it onto tmpfs (`/dev/shm`), in bytes per second, against `cp -a` of the same files
//!   to the same place (target: within 10%);
//! - reusing an intact volume.
//!
//! "Cold" runs drop the page cache first (`echo 3 > /proc/sys/vm/drop_caches`, root only); when
//! that is not allowed the runs are reported as warm.
//!
//! ```sh
//! cargo run --release -p mesos-gpu-volume --example volume_figures [-- <dir for the fake driver>]
//! ```

#[path = "../tests/support/fake_driver.rs"]
mod fake_driver;

use std::error::Error;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use mesos_gpu_volume::plan::VolumeDir;
use mesos_gpu_volume::volume::BuildTimings;
use mesos_gpu_volume::{
    CreateOptions, DriverVersion, LdCache, Materialize, VolumeManager, VolumePlan, plan,
};

type Result<T> = std::result::Result<T, Box<dyn Error>>;

fn main() -> Result<()> {
    cache_parsing()?;
    let parent = std::env::args()
        .nth(1)
        .map_or_else(std::env::temp_dir, PathBuf::from);
    let dir = tempfile::tempdir_in(&parent)?;
    let driver = dir.path().join("driver");
    let started = Instant::now();
    let cache = fake_driver::realistic_driver(&driver)?;
    let cache = LdCache::read(&cache)?;
    let version: DriverVersion = fake_driver::VERSION.parse()?;
    println!(
        "\nfake driver built under {} in {:.1} s",
        driver.display(),
        started.elapsed().as_secs_f64()
    );
    let started = Instant::now();
    let plan = plan(&driver, &cache, &version)?;
    println!(
        "plan: {} files ({} libraries), {} links, {:.0} MiB, in {}",
        plan.files.len(),
        plan.driver_library_count(),
        plan.links.len(),
        mib(plan.total_bytes()),
        ms(started.elapsed())
    );
    let cold = drop_caches();
    println!(
        "page cache: {}",
        if cold {
            "dropped before each cold run"
        } else {
            "cannot be dropped (not root?); all runs warm"
        }
    );

    hard_links(dir.path(), &plan, cold)?;
    copies(&plan, cold)?;
    Ok(())
}

fn cache_parsing() -> Result<()> {
    let bytes = std::fs::read("/etc/ld.so.cache")?;
    let entries = LdCache::parse(&bytes)?.len();
    let rounds = 2000;
    let started = Instant::now();
    let mut total = 0;
    for _ in 0..rounds {
        total += std::hint::black_box(LdCache::parse(std::hint::black_box(&bytes))?).len();
    }
    let elapsed = started.elapsed();
    println!(
        "ld.so.cache parsing: /etc/ld.so.cache ({entries} entries, {} bytes) in {:.1} µs: {:.1} M entries/s",
        bytes.len(),
        elapsed.as_secs_f64() * 1e6 / f64::from(rounds),
        total as f64 / elapsed.as_secs_f64() / 1e6
    );
    Ok(())
}

fn hard_links(parent: &Path, plan: &VolumePlan, cold: bool) -> Result<()> {
    println!("\nhard links (volume root on the driver's file system):");
    for run in ["cold", "warm", "warm"] {
        if run == "cold" && cold {
            drop_caches();
        }
        let root = tempfile::tempdir_in(parent)?;
        let started = Instant::now();
        let volume = VolumeManager::at(root.path()).create(plan)?;
        let total = started.elapsed();
        let t = volume.timings.unwrap_or_default();
        println!(
            "  {:<4}  links + publish {:>8} (links {}, publish {})   hashing {:>9}   total {:>9}   ({} linked, {} copied)",
            if cold { run } else { "warm" },
            ms(t.link + t.publish),
            ms(t.link),
            ms(t.publish),
            ms(t.content),
            ms(total),
            volume.hardlinked,
            volume.copied
        );
        if run == "warm" {
            let started = Instant::now();
            VolumeManager::at(root.path()).create(plan)?;
            println!(
                "        reuse of the intact volume (metadata check): {}",
                ms(started.elapsed())
            );
        }
    }
    Ok(())
}

fn copies(plan: &VolumePlan, cold: bool) -> Result<()> {
    println!("\ncopies onto tmpfs (/dev/shm), against `cp -a` of the same files:");
    let bytes = plan.total_bytes() as f64;
    for run in ["cold", "warm", "warm"] {
        let cold_run = run == "cold" && cold;
        if cold_run {
            drop_caches();
        }
        let root = tempfile::tempdir_in("/dev/shm")?;
        let options = CreateOptions {
            materialize: Materialize::Copy,
            ..CreateOptions::default()
        };
        let (cpu_before, _) = cpu_seconds()?;
        let started = Instant::now();
        let volume = VolumeManager::at(root.path()).create_with(plan, options)?;
        let ours = started.elapsed();
        let our_cpu = cpu_seconds()?.0 - cpu_before;
        drop(root);
        let timings: BuildTimings = volume.timings.unwrap_or_default();

        if cold_run {
            drop_caches();
        }
        let target = tempfile::tempdir_in("/dev/shm")?;
        let (_, children_before) = cpu_seconds()?;
        let cp = cp_a(plan, target.path())?;
        let cp_cpu = cpu_seconds()?.1 - children_before;
        println!(
            "  {:<4}  mesos-gpu {:>9} ({:>5.0} MiB/s, {:.2} s CPU; copy+hash phase {})   cp -a {:>9} ({:>5.0} MiB/s, {:.2} s CPU)   time ratio {:.2}",
            if cold { run } else { "warm" },
            ms(ours),
            bytes / ours.as_secs_f64() / 1_048_576.0,
            our_cpu,
            ms(timings.content),
            ms(cp),
            bytes / cp.as_secs_f64() / 1_048_576.0,
            cp_cpu,
            ours.as_secs_f64() / cp.as_secs_f64()
        );
    }
    Ok(())
}

/// `cp -a` of the plan's files into `target/{bin,lib,lib64}`, one `cp` per directory.
fn cp_a(plan: &VolumePlan, target: &Path) -> Result<Duration> {
    let started = Instant::now();
    for dir in VolumeDir::ALL {
        let dest = target.join(dir.as_str());
        std::fs::create_dir(&dest)?;
        let sources: Vec<&Path> = plan
            .files
            .iter()
            .filter(|f| f.dir == dir)
            .map(|f| f.source.as_path())
            .collect();
        if sources.is_empty() {
            continue;
        }
        let status = Command::new("cp")
            .arg("-a")
            .args(&sources)
            .arg(&dest)
            .status()?;
        if !status.success() {
            return Err(format!("cp -a failed: {status}").into());
        }
    }
    Ok(started.elapsed())
}

/// CPU seconds (user + system) used so far by this process, and by its waited-for children,
/// from `/proc/self/stat` (fields 14–17, in clock ticks of 1/100 s on Linux).
fn cpu_seconds() -> Result<(f64, f64)> {
    let stat = std::fs::read_to_string("/proc/self/stat")?;
    let after_comm = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest)
        .ok_or("bad /proc/self/stat")?;
    // Fields after the command name start at field 3 (state).
    let fields: Vec<f64> = after_comm
        .split_whitespace()
        .skip(11)
        .take(4)
        .map(str::parse)
        .collect::<std::result::Result<_, _>>()?;
    let [utime, stime, cutime, cstime] = fields[..] else {
        return Err("short /proc/self/stat".into());
    };
    Ok(((utime + stime) / 100.0, (cutime + cstime) / 100.0))
}

/// Writes dirty pages back and drops the page cache; false when not allowed.
fn drop_caches() -> bool {
    let synced = Command::new("sync").status().is_ok_and(|s| s.success());
    synced && std::fs::write("/proc/sys/vm/drop_caches", "3\n").is_ok()
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1e3)
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / 1_048_576.0
}
