//! Volume creation for a realistic driver (about 80 libraries, 600 MiB, see
//! `tests/support/fake_driver.rs`): hard links on the driver's file system and copies onto tmpfs
//! (`/dev/shm`), plus planning and reusing an intact volume. Needs `cc`. The cold-cache figures
//! and the comparison with `cp -a` are printed by `examples/volume_figures.rs`.

#[path = "../tests/support/fake_driver.rs"]
mod fake_driver;

use std::hint::black_box;
use std::time::Duration;

use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use mesos_gpu_volume::{CreateOptions, DriverVersion, LdCache, Materialize, VolumeManager, plan};

fn volume(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("tempdir");
    let driver = dir.path().join("driver");
    let cache = fake_driver::realistic_driver(&driver).expect("build the fake driver (needs cc)");
    let cache = LdCache::read(&cache).expect("cache");
    let version: DriverVersion = fake_driver::VERSION.parse().expect("version");
    let volume_plan = plan(&driver, &cache, &version).expect("plan");
    let bytes = volume_plan.total_bytes();

    let mut group = c.benchmark_group("volume");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(20));
    group.bench_function("plan", |b| {
        b.iter(|| plan(black_box(&driver), &cache, &version).map(|p| p.files.len()))
    });

    group.throughput(Throughput::Bytes(bytes));
    for (name, parent, materialize) in [
        (
            "create_hardlinks",
            dir.path().to_owned(),
            Materialize::LinkOrCopy,
        ),
        (
            "create_copies_to_dev_shm",
            "/dev/shm".into(),
            Materialize::Copy,
        ),
    ] {
        group.bench_function(name, |b| {
            b.iter_batched(
                || tempfile::tempdir_in(&parent).expect("volume root"),
                |root| {
                    let options = CreateOptions {
                        materialize,
                        ..CreateOptions::default()
                    };
                    let volume = VolumeManager::at(root.path())
                        .create_with(&volume_plan, options)
                        .expect("create");
                    (volume.files, root)
                },
                BatchSize::PerIteration,
            )
        });
    }

    let root = tempfile::tempdir_in(dir.path()).expect("volume root");
    let manager = VolumeManager::at(root.path());
    manager.create(&volume_plan).expect("create");
    group.throughput(Throughput::Elements(1));
    group.bench_function("reuse_intact_volume", |b| {
        b.iter(|| manager.create(black_box(&volume_plan)).map(|v| v.files))
    });
    group.finish();
}

criterion_group!(benches, volume);
criterion_main!(benches);
