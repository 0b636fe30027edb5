//! ld.so.cache parsing speed on the host's own `/etc/ld.so.cache`, in entries per second, and
//! the `ldconfig -p` listing of it.

use std::hint::black_box;
use std::path::Path;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use mesos_gpu_volume::LdCache;

fn parse(c: &mut Criterion) {
    let bytes = std::fs::read("/etc/ld.so.cache").expect("read /etc/ld.so.cache");
    let entries = LdCache::parse(&bytes).expect("the host cache parses").len();
    let mut group = c.benchmark_group("ldcache");
    group.throughput(Throughput::Elements(
        u64::try_from(entries).unwrap_or(u64::MAX),
    ));
    group.bench_function("parse_etc_ld_so_cache", |b| {
        b.iter(|| LdCache::parse(black_box(&bytes)).map(|c| c.len()))
    });
    let cache = LdCache::parse(&bytes).expect("parses");
    group.bench_function("list_like_ldconfig_p", |b| {
        let mut out = Vec::with_capacity(64 << 10);
        b.iter(|| {
            out.clear();
            cache
                .write_listing(&mut out, Path::new("/etc/ld.so.cache"))
                .map(|()| out.len())
        })
    });
    group.finish();
}

criterion_group!(benches, parse);
criterion_main!(benches);
