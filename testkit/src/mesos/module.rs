//! Building the C++ module with its CMakeLists.txt against a Mesos install.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::{MesosInstall, MesosResult, run};

/// Builds the C++ module from `source` (the directory with its `CMakeLists.txt`) in `build`
/// against `install` and the `libmesos_gpu.so` in `gpu_lib_dir`, warnings as errors; returns
/// the module's path. `extra` are more `-D` arguments for cmake.
pub fn build_module(
    install: &MesosInstall,
    source: &Path,
    gpu_lib_dir: &Path,
    build: &Path,
    extra: &[&str],
) -> MesosResult<PathBuf> {
    let mut configure = Command::new("cmake");
    configure
        .arg("-S")
        .arg(source)
        .arg("-B")
        .arg(build)
        .arg(format!("-DMESOS_PREFIX={}", install.prefix().display()))
        .arg(format!("-DMESOS_GPU_LIB_DIR={}", gpu_lib_dir.display()))
        .arg("-DMESOS_GPU_WERROR=ON")
        .args(extra);
    run(&mut configure, "cmake (configure)")?;
    let mut compile = Command::new("cmake");
    compile.arg("--build").arg(build).args(["--", "-j2"]);
    run(&mut compile, "cmake --build")?;
    let module = build.join("libmesos_gpu_module.so");
    if module.is_file() {
        Ok(module)
    } else {
        Err(format!("cmake built no {}", module.display()))
    }
}
