//! eBPF device-program generation: the cost of rebuilding a container's program on every
//! allow-list change (cgroups v2), for Mesos's base list plus 8 GPUs and for a 512-rule list.

use criterion::{Criterion, criterion_group, criterion_main};
use mesos_gpu_enforce::{
    cgroup::Access, cgroup::DeviceProgram, cgroup::DeviceRule, cgroup::default_whitelist,
};
use mesos_gpu_node::{inventory::DevNum, inventory::NVIDIA_GPU_MAJOR};

fn gpu_list(gpus: u32) -> Vec<DeviceRule> {
    let mut rules = default_whitelist();
    rules.extend((0..gpus).chain([255]).map(|minor| {
        DeviceRule::char_device(
            DevNum {
                major: NVIDIA_GPU_MAJOR,
                minor,
            },
            Access::RW,
        )
    }));
    rules
}

fn codegen(c: &mut Criterion) {
    for (name, rules) in [("base+8gpus", gpu_list(8)), ("512 rules", gpu_list(497))] {
        let len = DeviceProgram::build(&rules).len();
        c.bench_function(
            &format!("build {name} ({} rules, {len} insns)", rules.len()),
            |b| b.iter(|| DeviceProgram::build(std::hint::black_box(&rules)).to_bytes()),
        );
    }
}

criterion_group!(benches, codegen);
criterion_main!(benches);
