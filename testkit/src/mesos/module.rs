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
    discard_foreign_cache(source, build)?;
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

/// Removes `build` when its `CMakeCache.txt` was made for another source directory (a target
/// directory copied from another checkout): cmake refuses to configure such a build directory.
fn discard_foreign_cache(source: &Path, build: &Path) -> MesosResult {
    let cache = build.join("CMakeCache.txt");
    let Ok(text) = std::fs::read_to_string(&cache) else {
        return Ok(());
    };
    let source = source
        .canonicalize()
        .unwrap_or_else(|_| source.to_path_buf());
    let made_for = text
        .lines()
        .find_map(|l| l.strip_prefix("CMAKE_HOME_DIRECTORY:INTERNAL="))
        .map(PathBuf::from);
    if made_for.as_deref() == Some(source.as_path()) {
        return Ok(());
    }
    std::fs::remove_dir_all(build).map_err(|e| format!("{}: {e}", build.display()))
}

/// The isolator module's name in `modules.json` and `--isolation`.
pub const ISOLATOR_MODULE: &str = "org_apache_mesos_gpu_MesosGpuIsolator";

/// The Docker hook module's name in `modules.json` and `--hooks`.
pub const DOCKER_HOOK_MODULE: &str = "org_apache_mesos_gpu_MesosGpuDockerHook";

/// `modules.json` loading the isolator module at `module` with `params`.
pub fn modules_json(module: &Path, params: &[(String, String)]) -> serde_json::Value {
    let parameters: Vec<serde_json::Value> = params
        .iter()
        .map(|(k, v)| serde_json::json!({ "key": k, "value": v }))
        .collect();
    serde_json::json!({
        "libraries": [{
            "file": module.display().to_string(),
            "modules": [{ "name": ISOLATOR_MODULE, "parameters": parameters }],
        }]
    })
}

/// Adds the Docker hook module, with its `docker_args` command line, to the library of a
/// `modules.json` made by [`modules_json`]; `None` when it holds no module list.
pub fn add_docker_hook(json: &mut serde_json::Value, docker_args: &str) -> Option<()> {
    json["libraries"][0]["modules"]
        .as_array_mut()?
        .push(serde_json::json!({
            "name": DOCKER_HOOK_MODULE,
            "parameters": [{ "key": "docker_args", "value": docker_args }],
        }));
    Some(())
}
