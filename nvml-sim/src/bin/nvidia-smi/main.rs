//! `nvidia-smi` stand-in for a simulated node: `nvidia-smi -L` lists the node's GPUs as the real
//! program does (`GPU <index>: <name> (UUID: <uuid>)`), but only those whose device node this
//! process may open, so a device cgroup shows in its answer as it does in the real one's.
//!
//! The node is the description named by `NVML_SIM_CONFIG`, else `nvml-sim.json` beside this
//! program (nvml-sim's own rule for the library). A GPU is visible when opening
//! `<dev root>/nvidia<minor>` (dev root `NVML_SIM_DEV_ROOT`, default `/dev`) succeeds or fails
//! with anything but `EPERM`, `EACCES` or `ENOENT`: a `mknod`ed node without a driver behind it
//! answers `ENXIO` where the cgroup allows it and `EPERM` where it denies it. With no GPU visible
//! it prints `No devices were found` and exits 6, as the real program does. MIG devices are not
//! listed. `--version` prints the node's driver version in the real program's words. Nothing else
//! of nvidia-smi is simulated.
#![forbid(unsafe_code)]

use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// nvml-sim's variable naming the node description.
const CONFIG_ENV: &str = "NVML_SIM_CONFIG";
/// The description beside the program when the variable is unset.
const CONFIG_FILE: &str = "nvml-sim.json";
/// Where the device nodes are looked for.
const DEV_ROOT_ENV: &str = "NVML_SIM_DEV_ROOT";
/// nvidia-smi's exit status when a query found nothing.
const NOT_FOUND: u8 = 6;

const USAGE: &str = "\
usage: nvidia-smi -L | --list-gpus
       nvidia-smi --version

A stand-in for NVIDIA's nvidia-smi on a simulated node (nvml-sim): lists the GPUs of the node
description whose device nodes this process may open.

Environment:
  NVML_SIM_CONFIG    the node description [default: nvml-sim.json beside this program]
  NVML_SIM_DEV_ROOT  directory of the nvidia<minor> device nodes [default: /dev]

Example:
  NVML_SIM_CONFIG=/tmp/sim/nvml-sim.json NVML_SIM_DEV_ROOT=/tmp/nodes nvidia-smi -L
";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let listing = match args.iter().map(String::as_str).collect::<Vec<_>>()[..] {
        ["-L" | "--list-gpus"] => true,
        ["--version"] => false,
        ["-h" | "--help"] => {
            print!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        _ => {
            eprint!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    let node = match read_node() {
        Ok(node) => node,
        Err(why) => {
            // The real program's words when NVML cannot start.
            println!("Failed to initialize NVML: {why}");
            return ExitCode::from(9);
        }
    };
    if !listing {
        let version = node["driver_version"].as_str().unwrap_or("unknown");
        println!("NVIDIA-SMI version  : {version}\nDRIVER version      : {version}");
        return ExitCode::SUCCESS;
    }
    let dev_root =
        std::env::var_os(DEV_ROOT_ENV).map_or_else(|| PathBuf::from("/dev"), PathBuf::from);
    let mut listed = 0;
    for gpu in node["gpus"].as_array().into_iter().flatten() {
        let (Some(index), Some(minor)) = (gpu["index"].as_u64(), gpu["minor"].as_u64()) else {
            continue;
        };
        if !may_open(&dev_root.join(format!("nvidia{minor}"))) {
            continue;
        }
        let name = gpu["name"].as_str().unwrap_or("NVIDIA GPU");
        let uuid = gpu["uuid"].as_str().unwrap_or("unknown");
        println!("GPU {index}: {name} (UUID: {uuid})");
        listed += 1;
    }
    if listed == 0 {
        println!("No devices were found");
        return ExitCode::from(NOT_FOUND);
    }
    ExitCode::SUCCESS
}

/// The node description, as JSON.
fn read_node() -> Result<serde_json::Value, String> {
    let path = match std::env::var_os(CONFIG_ENV) {
        Some(path) => PathBuf::from(path),
        None => std::env::current_exe()
            .map_err(|e| format!("cannot tell where this program is: {e}"))?
            .with_file_name(CONFIG_FILE),
    };
    let text = std::fs::read_to_string(&path)
        .map_err(|e| format!("cannot read the node description {}: {e}", path.display()))?;
    serde_json::from_str(&text)
        .map_err(|e| format!("{} is not a node description: {e}", path.display()))
}

/// True unless opening `node` is refused (a device cgroup's `EPERM`, permissions) or it is absent.
fn may_open(node: &Path) -> bool {
    match std::fs::File::open(node) {
        Ok(_) => true,
        Err(e) => !matches!(
            e.raw_os_error(),
            Some(libc::EPERM | libc::EACCES | libc::ENOENT)
        ),
    }
}
