//! `--simulate NAME|FILE`: run any command on a simulated GPU node.
//!
//! The node is served by nvml-sim's `libnvml_sim.so` through the **same dynamic loading** as a
//! real driver: the library is copied as `libnvidia-ml.so.1` into a private temporary directory,
//! next to the node description as `nvml-sim.json` (where nvml-sim looks when `NVML_SIM_CONFIG`
//! is unset), and NVML is loaded from there. The directory is removed when the command ends.
//!
//! `libnvml_sim.so` is looked for, in order, at `$MESOS_GPU_NVML_SIM`, next to the executable,
//! in `<exe dir>/deps/` (cargo builds; preferred when newer than the one next to the executable),
//! `<exe dir>/../lib/mesos-gpu/` and `/usr/lib/mesos-gpu/`.
//!
//! The directory is `$TMPDIR/mesos-gpu-sim-<pid>-<random>`. It goes when the command ends, also
//! on SIGINT, SIGTERM or SIGHUP (which would otherwise kill the process without running any
//! destructor): commands that handle those signals themselves end normally, and for the others
//! a watcher thread removes the directory and exits with 128+N. Directories of processes that
//! no longer exist (killed with SIGKILL) are removed by the next simulation.
//!
//! Commands that read the driver's files get a simulated driver tree in the same directory, on
//! first use ([`Simulation::driver_root`], `driver_tree`).

mod driver_tree;

use std::cell::OnceCell;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};

use anyhow::{Context as _, bail};
use mesos_gpu_node::discovery::MAX_GPUS;
use mesos_gpu_os::fsmode;

/// The `--simulate` value that lists the shipped nodes.
pub(crate) const LIST: &str = "list";

/// The file name of the built simulator.
const SIM_LIB: &str = "libnvml_sim.so";

/// The directory inside a simulation directory that stands for `/proc`.
const PROC_DIR: &str = "proc";

/// The start of a simulation directory's name, followed by the process id.
const DIR_PREFIX: &str = "mesos-gpu-sim-";

/// The environment variable naming the simulator library explicitly.
const SIM_LIB_ENV: &str = "MESOS_GPU_NVML_SIM";

/// The largest node description read. A GPU with every field takes under 1 KiB, so this leaves
/// room for descriptions of far more GPUs than a node may have, which are then refused by count.
const MAX_DESCRIPTION_BYTES: u64 = 16 << 20;

/// The environment variable nvml-sim reads before looking beside itself.
const SIM_CONFIG_ENV: &str = "NVML_SIM_CONFIG";

/// A simulated node, ready to be loaded as NVML.
pub(crate) struct Simulation {
    name: String,
    lib: PathBuf,
    sim_lib: PathBuf,
    config: PathBuf,
    driver_version: Option<String>,
    proc_root: PathBuf,
    driver_root: OnceCell<PathBuf>,
    /// The process's private directory (the NVML copy, the description, `/proc`), removed with
    /// the simulation.
    _private: tempfile::TempDir,
}

impl Simulation {
    /// Sets up the node named `spec` (a shipped name or a description file). Unless
    /// `command_handles_signals`, SIGINT, SIGTERM and SIGHUP remove the directory and exit.
    pub(crate) fn prepare(spec: &str, command_handles_signals: bool) -> anyhow::Result<Self> {
        if spec == LIST {
            bail!(
                "`--simulate {LIST}` is not a node; `mesos-gpu info --simulate {LIST}` prints the shipped names"
            );
        }
        if let Ok(value) = std::env::var(SIM_CONFIG_ENV) {
            bail!("{SIM_CONFIG_ENV}={value} is set and would override --simulate {spec}; unset it");
        }
        let (name, json) = node_description(spec)?;
        let sim_lib = find_sim_library()?;
        remove_dead_simulations();
        let dir = fsmode::private_tempdir(&format!("{DIR_PREFIX}{}-", std::process::id()))
            .context("cannot create a temporary directory")?;
        // A signal during the set-up waits for it: otherwise the clean-up could remove the
        // directory while it is being filled, and a `create_dir_all` below would make it again.
        let _setup = SETUP.lock().unwrap_or_else(PoisonError::into_inner);
        if !command_handles_signals {
            remove_on_signal(dir.path().to_owned())
                .context("cannot watch for signals to clean up the simulated node")?;
        }
        let lib = dir.path().join("libnvidia-ml.so.1");
        std::fs::copy(&sim_lib, &lib)
            .with_context(|| format!("cannot copy {} to {}", sim_lib.display(), lib.display()))?;
        let config = dir.path().join("nvml-sim.json");
        fsmode::write_file(&config, json.as_bytes(), fsmode::PRIVATE_FILE)
            .with_context(|| format!("cannot write {}", config.display()))?;
        let proc_root = dir.path().join(PROC_DIR);
        nvml_sim::driver_files::write(&json, &proc_root).with_context(|| {
            format!(
                "cannot write the driver's /proc files under {}",
                proc_root.display()
            )
        })?;
        tracing::debug!(node = %name, sim = %sim_lib.display(), dir = %dir.path().display(), "simulated node ready");
        let driver_version = serde_json::from_str::<serde_json::Value>(&json)
            .ok()
            .and_then(|v| v["driver_version"].as_str().map(str::to_owned));
        Ok(Simulation {
            name,
            lib,
            sim_lib,
            config,
            driver_version,
            proc_root,
            driver_root: OnceCell::new(),
            _private: dir,
        })
    }

    /// The node description the simulator reads (`nvml-sim.json`), for programs that need it
    /// named (`NVML_SIM_CONFIG`), such as the driver tree's `nvidia-smi` stand-in.
    pub(crate) fn config_path(&self) -> &Path {
        &self.config
    }

    /// The simulated driver's file system root, in the node's scratch directory (written on
    /// first use, then kept, as a real driver stays where it is): the node's driver libraries and
    /// programs under `usr/local/nvidia`, and an `etc/ld.so.cache` for them (`driver_tree`).
    pub(crate) fn driver_root(&self) -> anyhow::Result<&Path> {
        if let Some(root) = self.driver_root.get() {
            return Ok(root);
        }
        let version: mesos_gpu_volume::DriverVersion = self
            .driver_version
            .as_deref()
            .with_context(|| format!("simulated node {} has no driver version", self.name))?
            .parse()?;
        let root = scratch_state(&self.name).join(format!("driver-{version}"));
        {
            let _setup = SETUP.lock().unwrap_or_else(PoisonError::into_inner);
            driver_tree::ensure(&root, &version, &driver_tree::programs_dir(&self.sim_lib))
                .with_context(|| {
                    format!("cannot write the simulated driver under {}", root.display())
                })?;
        }
        Ok(self.driver_root.get_or_init(|| root))
    }

    /// The simulated driver's program directory (`<driver root>/usr/local/nvidia/bin`), where a
    /// real host's `PATH` would find `nvidia-smi`.
    pub(crate) fn driver_bin(&self) -> anyhow::Result<PathBuf> {
        Ok(self
            .driver_root()?
            .join(driver_tree::DRIVER_DIR)
            .join("bin"))
    }

    /// The `nvidia-smi` stand-in the simulated driver's programs are copied from, when it is not
    /// built (the driver tree then holds a placeholder ELF file that cannot run).
    pub(crate) fn missing_smi(&self) -> Option<PathBuf> {
        let path = driver_tree::programs_dir(&self.sim_lib).join(driver_tree::SMI);
        (!path.is_file()).then_some(path)
    }

    /// The node's device nodes, as its driver numbers them, in its scratch directory
    /// ([`scratch_state`]`/dev`), made with `mknod` (root) on first use.
    pub(crate) fn device_root(
        &self,
        inventory: &mesos_gpu_node::inventory::Inventory,
        proc_root: &Path,
    ) -> anyhow::Result<PathBuf> {
        let dir = scratch_state(&self.name).join("dev");
        make_device_nodes(&dir, inventory, proc_root)?;
        Ok(dir)
    }

    /// The node's name (a shipped name, or the description file's path).
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// The private `libnvidia-ml.so.1` to load.
    pub(crate) fn lib_path(&self) -> &Path {
        &self.lib
    }

    /// The directory standing for `/proc`: the driver files (`devices`, the MIG capability
    /// table and instance files) the node's driver would provide.
    pub(crate) fn proc_root(&self) -> &Path {
        &self.proc_root
    }
}

/// Held while a simulated node's directory is being filled, and by the clean-up before it
/// removes the directory.
static SETUP: Mutex<()> = Mutex::new(());

/// Set by the clean-up thread when a signal arrived: the process is about to exit with 128+N.
static SIGNALLED: AtomicBool = AtomicBool::new(false);

/// Called by `main` before it returns: when a signal is being handled, the clean-up thread
/// exits the process with 128+N, so the command's own outcome (often an error, since the
/// directory it was using was just removed) must not win the race to exit first.
pub(crate) fn yield_to_signal_exit() {
    if SIGNALLED.load(Ordering::SeqCst) {
        loop {
            std::thread::park();
        }
    }
}

/// Removes `dir` and exits with 128+N when SIGINT (2), SIGTERM (15) or SIGHUP (1) arrives.
/// The handlers are in place when this returns; a thread waits for them.
fn remove_on_signal(dir: PathBuf) -> anyhow::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let (mut int, mut term, mut hup) = {
        let _enter = runtime.enter();
        (
            signal(SignalKind::interrupt())?,
            signal(SignalKind::terminate())?,
            signal(SignalKind::hangup())?,
        )
    };
    std::thread::Builder::new()
        .name("sim-cleanup".to_owned())
        .spawn(move || {
            let number: u8 = runtime.block_on(async {
                tokio::select! {
                    _ = int.recv() => 2,
                    _ = term.recv() => 15,
                    _ = hup.recv() => 1,
                }
            });
            SIGNALLED.store(true, Ordering::SeqCst);
            let _setup = SETUP.lock().unwrap_or_else(PoisonError::into_inner);
            let _ = std::fs::remove_dir_all(&dir);
            std::process::exit(128 + i32::from(number));
        })?;
    Ok(())
}

/// Removes the simulation directories of processes that are gone (SIGKILL runs no cleanup).
fn remove_dead_simulations() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for entry in entries.filter_map(Result::ok) {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix(DIR_PREFIX))
            .and_then(|rest| rest.split_once('-'))
            .and_then(|(pid, _)| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if !Path::new("/proc").join(pid.to_string()).exists() {
            let path = entry.path();
            match std::fs::remove_dir_all(&path) {
                Ok(()) => {
                    tracing::debug!(path = %path.display(), "removed a dead simulation's directory")
                }
                Err(error) => {
                    tracing::debug!(path = %path.display(), %error, "cannot remove a dead simulation's directory")
                }
            }
        }
    }
}

/// The names of the nodes shipped with nvml-sim.
pub(crate) fn shipped_names() -> Vec<&'static str> {
    nvml_sim::TOPOLOGIES.iter().map(|(name, _)| *name).collect()
}

/// One line on each shipped node: how many GPUs of which model, how many in MIG mode, and the
/// driver (`8 × Tesla V100-SXM2-16GB, driver 550.54.14`).
pub(crate) fn shipped_summaries() -> Vec<(&'static str, String)> {
    nvml_sim::TOPOLOGIES
        .iter()
        .map(|(name, json)| (*name, summary(json)))
        .collect()
}

fn summary(json: &str) -> String {
    let node: serde_json::Value = serde_json::from_str(json).unwrap_or_default();
    let gpus = node["gpus"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default();
    let mut models: Vec<&str> = gpus.iter().filter_map(|g| g["name"].as_str()).collect();
    models.dedup();
    let mig = gpus.iter().filter(|g| g["mig"]["current"] == true).count();
    let mut text = if gpus.is_empty() {
        "no GPUs".to_owned()
    } else {
        format!("{} × {}", gpus.len(), models.join(" + "))
    };
    if mig > 0 {
        text.push_str(&format!(" ({mig} in MIG mode)"));
    }
    if let Some(driver) = node["driver_version"].as_str() {
        text.push_str(&format!(", driver {driver}"));
    }
    text
}

/// The state a command keeps by default (flag id, path in the node's scratch directory), which
/// on a simulated node goes to [`scratch_state`] unless a path is given: the node's GPU pool,
/// the agent's work directory, the driver volumes, the MPS daemons' directories and `serve`'s
/// plugin socket (the Docker record and `info`/`gpu`'s agent work directory have no clap default:
/// see [`crate::ctx::Ctx::state_default`]).
const STATE_ARGS: [(&str, &str); 5] = [
    ("pool_dir", "pool"),
    ("agent_work_dir", "agent"),
    ("volume_root", "volumes"),
    ("mps_root", "mps"),
    ("plugin_socket", "plugin/nvidia-docker.sock"),
];

/// Where a simulated node's state lives unless a path is given: one scratch directory per node,
/// `<tmp>/mesos-gpu-sim/<node>/`, kept across commands (as a real node's state is), so that
/// `docker-args`, `gpu list` and `serve` of one simulated node share its pool and records and
/// never touch the host's.
pub(crate) fn scratch_state(spec: &str) -> PathBuf {
    let key = if nvml_sim::TOPOLOGIES.iter().any(|(name, _)| *name == spec) {
        spec.to_owned()
    } else {
        // A description file: its name and a digest of its path, so two files never share.
        let path = std::fs::canonicalize(spec).unwrap_or_else(|_| PathBuf::from(spec));
        let stem = path
            .file_stem()
            .map_or_else(|| "node".to_owned(), |s| s.to_string_lossy().into_owned());
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        std::hash::Hash::hash(&path, &mut hasher);
        format!("file-{stem}-{:016x}", std::hash::Hasher::finish(&hasher))
    };
    std::env::temp_dir().join("mesos-gpu-sim").join(key)
}

/// The `--simulate` value on a command line (`--simulate X` or `--simulate=X`, before any `--`),
/// unless it is `list`.
pub(crate) fn spec_in_args(args: impl IntoIterator<Item = std::ffi::OsString>) -> Option<String> {
    let mut args = args.into_iter();
    let mut spec = None;
    while let Some(arg) = args.next() {
        let arg = arg.to_string_lossy().into_owned();
        if arg == "--" {
            break;
        }
        if arg == "--simulate" {
            spec = args.next().map(|v| v.to_string_lossy().into_owned());
        } else if let Some(value) = arg.strip_prefix("--simulate=") {
            spec = Some(value.to_owned());
        }
    }
    spec.filter(|s| s != LIST)
}

/// Subcommands whose path flags are not state they keep but values they print or check for a
/// real agent (`agent-flags` writes them into the agent's flags; `doctor` checks the host's
/// configuration, its `--smoke` run having scratch state of its own).
const NOT_STATE: [&str; 2] = ["agent-flags", "doctor"];

/// `command` with the defaults of its state flags ([`STATE_ARGS`]), in it and every
/// subcommand but [`NOT_STATE`], moved into the simulated node's scratch directory `root` (shown
/// so by `--help`).
pub(crate) fn with_scratch_defaults(mut command: clap::Command, root: &Path) -> clap::Command {
    for (id, rel) in STATE_ARGS {
        let has_default = command
            .get_arguments()
            .any(|a| a.get_id() == id && !a.get_default_values().is_empty());
        if has_default {
            let value = root.join(rel).into_os_string();
            command = command.mut_arg(id, |a| a.default_value(value));
        }
    }
    let names: Vec<String> = command
        .get_subcommands()
        .map(|s| s.get_name().to_owned())
        .filter(|name| !NOT_STATE.contains(&name.as_str()))
        .collect();
    for name in names {
        command = command.mut_subcommand(name, |s| with_scratch_defaults(s, root));
    }
    command
}

/// Makes under `dir` every device node the simulated driver of `inventory` numbers (its
/// `devices` table in `proc_root`), with `mknod` (root); a node already there is kept.
pub(crate) fn make_device_nodes(
    dir: &Path,
    inventory: &mesos_gpu_node::inventory::Inventory,
    proc_root: &Path,
) -> anyhow::Result<()> {
    let proc_devices = std::fs::read_to_string(proc_root.join("devices")).unwrap_or_default();
    for node in mesos_gpu_node::devices::expected_nodes(inventory, &proc_devices) {
        let Some(dev) = node.dev else {
            continue;
        };
        let path = dir.join(&node.name);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("cannot create {}", parent.display()))?;
        }
        if path.symlink_metadata().is_ok() {
            continue;
        }
        let out = std::process::Command::new("mknod")
            .arg(&path)
            .args(["c", &dev.major.to_string(), &dev.minor.to_string()])
            .output()
            .context("cannot run mknod")?;
        anyhow::ensure!(
            out.status.success(),
            "mknod {} c {} {} failed (the simulated node's device nodes need root): {}",
            path.display(),
            dev.major,
            dev.minor,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// The node's display name and its description, with a relative `events_file` made absolute.
fn node_description(spec: &str) -> anyhow::Result<(String, String)> {
    if let Some((name, json)) = nvml_sim::TOPOLOGIES.iter().find(|(name, _)| *name == spec) {
        return Ok(((*name).to_owned(), (*json).to_owned()));
    }
    let path = Path::new(spec);
    let looks_like_path = spec.contains('/') || spec.ends_with(".json");
    if !looks_like_path && !path.is_file() {
        bail!(
            "unknown simulated node {spec:?}: expected one of {} (or the path of a node description file)",
            shipped_names().join(", ")
        );
    }
    let text =
        read_description(path).with_context(|| format!("cannot read node description {spec}"))?;
    let mut value: serde_json::Value = serde_json::from_str(&text)
        .with_context(|| format!("{spec} is not a JSON node description"))?;
    // Refused before anything costs more than parsing: no command can use such a node.
    if let Some(count) = value
        .get("gpus")
        .and_then(serde_json::Value::as_array)
        .map(Vec::len)
        && count > MAX_GPUS as usize
    {
        bail!("{spec} describes {count} GPUs; mesos-gpu manages at most {MAX_GPUS} GPUs per node");
    }
    // nvml-sim would answer an invalid description with DRIVER_NOT_LOADED, i.e. "no GPUs".
    nvml_sim::validate(&text).with_context(|| format!("{spec} is not a valid node description"))?;
    let base = std::path::absolute(path)
        .with_context(|| format!("cannot resolve {spec}"))?
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default();
    if let Some(events) = value.get_mut("events_file")
        && let Some(rel) = events.as_str().filter(|p| Path::new(p).is_relative())
    {
        *events = serde_json::Value::String(base.join(rel).to_string_lossy().into_owned());
    }
    Ok((spec.to_owned(), value.to_string()))
}

/// The description file's text: a regular file of at most [`MAX_DESCRIPTION_BYTES`].
fn read_description(path: &Path) -> anyhow::Result<String> {
    use std::io::Read as _;
    let file = std::fs::File::open(path)?;
    if !file.metadata()?.is_file() {
        bail!("not a regular file");
    }
    let mut text = String::new();
    file.take(MAX_DESCRIPTION_BYTES + 1)
        .read_to_string(&mut text)?;
    if text.len() as u64 > MAX_DESCRIPTION_BYTES {
        bail!("larger than {MAX_DESCRIPTION_BYTES} bytes");
    }
    Ok(text)
}

/// Where `libnvml_sim.so` is, trying each documented place in order.
fn find_sim_library() -> anyhow::Result<PathBuf> {
    if let Some(path) = std::env::var_os(SIM_LIB_ENV) {
        let path = PathBuf::from(path);
        if path.is_file() {
            return Ok(path);
        }
        bail!("{SIM_LIB_ENV}={} does not name a file", path.display());
    }
    let exe = std::env::current_exe().context("cannot find this executable's path")?;
    let exe_dir = exe.parent().unwrap_or(Path::new("/"));
    let candidates = [
        exe_dir.join(SIM_LIB),
        exe_dir.join("deps").join(SIM_LIB),
        exe_dir.join("../lib/mesos-gpu").join(SIM_LIB),
        PathBuf::from("/usr/lib/mesos-gpu").join(SIM_LIB),
    ];
    // In a cargo target dir the copy beside the executable is only refreshed when nvml-sim is
    // built on its own, while `deps/` follows every build: of those two, take the newer.
    let newer = |p: &PathBuf| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    let (beside, deps) = (&candidates[0], &candidates[1]);
    if beside.is_file() && deps.is_file() && newer(deps) > newer(beside) {
        return Ok(deps.clone());
    }
    if let Some(found) = candidates.iter().find(|p| p.is_file()) {
        return Ok(found.clone());
    }
    let tried: Vec<String> = candidates.iter().map(|p| p.display().to_string()).collect();
    bail!(
        "cannot find {SIM_LIB} (build nvml-sim, or set {SIM_LIB_ENV}); looked in {}",
        tried.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_names_list_the_shipped_ones() {
        let err = node_description("no-such-node")
            .expect_err("unknown")
            .to_string();
        assert!(
            err.contains("unknown simulated node \"no-such-node\""),
            "{err}"
        );
        for name in shipped_names() {
            assert!(err.contains(name), "{err} lacks {name}");
        }
    }

    #[test]
    fn shipped_names_resolve() {
        for name in shipped_names() {
            let (got, json) = node_description(name).expect("shipped");
            assert_eq!(got, name);
            assert!(
                serde_json::from_str::<serde_json::Value>(&json).is_ok(),
                "{name}"
            );
        }
    }

    #[test]
    fn relative_events_file_is_made_absolute() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("node.json");
        let node = r#"{"driver_version": "1", "cuda_driver_version": "12.4", "events_file": "events.txt", "gpus": []}"#;
        std::fs::write(&file, node).expect("write");
        let (_, json) = node_description(file.to_str().expect("utf-8")).expect("file");
        let v: serde_json::Value = serde_json::from_str(&json).expect("json");
        assert_eq!(
            v["events_file"],
            dir.path().join("events.txt").to_str().expect("utf-8")
        );
        std::fs::write(&file, r#"{"gpus": 1}"#).expect("write");
        let err = format!(
            "{:#}",
            node_description(file.to_str().expect("utf-8")).expect_err("invalid")
        );
        assert!(
            err.contains("is not a valid node description: not a node description"),
            "{err}"
        );
        let err = node_description("/nonexistent/node.json")
            .expect_err("missing")
            .to_string();
        assert!(
            err.contains("cannot read node description /nonexistent/node.json"),
            "{err}"
        );
    }
}
