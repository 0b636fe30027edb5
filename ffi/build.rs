//! Compiles the Mesos protobuf subset in `proto/` into Rust with protox (a pure-Rust
//! protobuf compiler, so no `protoc` is needed) and prost-build, and gives `libmesos_gpu.so` its
//! SONAME, so a program or module linked against it by path records `libmesos_gpu.so` and finds
//! it through its RUNPATH wherever both are installed.

use std::error::Error;

/// The `.proto` files to compile, relative to `proto/`; imports resolve from there too.
const PROTOS: &[&str] = &[
    "mesos/mesos.proto",
    "mesos/slave/containerizer.proto",
    "mesos/docker/v1.proto",
];

fn main() -> Result<(), Box<dyn Error>> {
    println!("cargo:rerun-if-changed=proto");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libmesos_gpu.so");
    let fds = protox::compile(PROTOS, ["proto"])?;
    prost_build::Config::new()
        // BTreeMap keeps map fields (container limits, image labels) in key order, so
        // encoding is deterministic.
        .btree_map(["."])
        // The isolator keys its per-container state by ContainerID.
        .type_attribute(".mesos.ContainerID", "#[derive(Eq, Hash)]")
        .include_file("_includes.rs")
        .compile_fds(fds)?;
    Ok(())
}
