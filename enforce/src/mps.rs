//! One MPS control daemon per shared GPU, started and supervised by mesos-gpu.
//!
//! Facts relied on (`docs/reference/mps.md` §1; NVIDIA's MPS documentation and
//! `nvidia-cuda-mps-control(1)`; NVIDIA's device plugin `cmd/mps-control-daemon/mps/daemon.go`):
//! - `nvidia-cuda-mps-control -d` starts the control daemon in the background and returns once
//!   it accepts commands; `CUDA_VISIBLE_DEVICES` limits it to one GPU, and
//!   `CUDA_MPS_PIPE_DIRECTORY`/`CUDA_MPS_LOG_DIRECTORY` place its socket (plus
//!   `nvidia-cuda-mps-control.pid`) and its `control.log`. A second daemon on the same pipe
//!   directory refuses to start.
//! - Without options the program is a client: each line of its stdin is one command, the
//!   replies go to stdout; with no daemon it exits 1 (`Cannot find MPS control daemon process`).
//! - Defaults set with `set_default_active_thread_percentage <pct>` and
//!   `set_default_device_pinned_mem_limit <dev> <value>` apply to servers started later; NVIDIA's
//!   plugin sets `100/R` and `total/R` MiB per replica, probes health with
//!   `get_default_active_thread_percentage` and stops with `quit`. A daemon that dies leaves its
//!   socket and pid file behind; a new `-d` replaces them.
//!
//! - NVIDIA's plugin sets the GPU to compute mode EXCLUSIVE_PROCESS before it starts the daemon
//!   (only the MPS server then holds a context on it) and back to DEFAULT after `quit`.
//! - On a MIG device (`docs/reference/mig.md` §5) the daemon is started the same way with
//!   `CUDA_VISIBLE_DEVICES=MIG-<uuid>` and pipe and log directories of its own, one per MIG
//!   device; the compute mode is left alone: it belongs to the physical GPU, whose other MIG
//!   devices have daemons or whole owners of their own.
//!
//! Layout, as NVIDIA's plugin: `<root>/<GPU UUID>/pipe` and `<root>/<GPU UUID>/log`, each 0755
//! (NVIDIA's plugin asks for 0755 too, `os.MkdirAll(pipeDir, 0755)`): clients of other users only
//! connect to the daemon's sockets in the pipe directory, which takes search permission on it,
//! and the daemon (root) writes both. Ours get 0755 whatever the umask, and a root or directory
//! that another user can write or owns is refused ([`mesos_gpu_os::fsmode`]). The daemon's
//! pid and start time are read back after `-d` ([`ProcessStamp`]), so a restarted agent can tell
//! its daemons from a reused pid ([`MpsDaemons::adopt`]).

use std::collections::BTreeMap;
use std::io::{self, Write as _};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Arc;

use mesos_gpu_os::fsmode;
use serde::{Deserialize, Serialize};

use mesos_gpu_grant::env::{CUDA_MPS_LOG_DIRECTORY, CUDA_MPS_PIPE_DIRECTORY, CUDA_VISIBLE_DEVICES};
use mesos_gpu_node::{discovery::DiscoveryError, discovery::GpuDriver};
use mesos_gpu_os::{Liveness, ProcessStamp, Processes};
use mesos_gpu_placement::sharing::ShareLimits;

/// The program's name, as NVIDIA ships it.
pub const PROGRAM: &str = "nvidia-cuda-mps-control";
/// Where the daemons' per-GPU `pipe` and `log` directories go by default.
pub const DEFAULT_ROOT: &str = "/var/run/mesos-gpu/mps";
/// The pid file the daemon writes into its pipe directory.
const PID_FILE: &str = "nvidia-cuda-mps-control.pid";
/// How a MIG device's UUID begins (a GPU's begins with `GPU-`).
const MIG_PREFIX: &str = "MIG-";

/// Why an MPS daemon could not be started, told or stopped.
#[derive(Debug, thiserror::Error)]
pub enum MpsError {
    /// A directory of the daemon could not be made.
    #[error("cannot use {path} for the MPS daemon of {gpu}")]
    Dir {
        /// The GPU.
        gpu: String,
        /// The directory.
        path: PathBuf,
        /// The cause.
        #[source]
        source: mesos_gpu_os::FsModeError,
    },
    /// The program could not be run at all.
    #[error("cannot run {program} for {gpu} (set the MPS program path if it is not on PATH)")]
    Spawn {
        /// The GPU.
        gpu: String,
        /// The program.
        program: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// The program ran and refused.
    #[error("{program} {what} for {gpu} failed ({status}): {message}")]
    Failed {
        /// The GPU.
        gpu: String,
        /// The program.
        program: PathBuf,
        /// What was asked (`-d`, a command).
        what: String,
        /// Its exit status.
        status: std::process::ExitStatus,
        /// What it printed on stderr.
        message: String,
    },
    /// The daemon started but its pid could not be read back.
    #[error("the MPS daemon of {gpu} started but {path} names no running process: {why}")]
    NoPid {
        /// The GPU.
        gpu: String,
        /// The pid file.
        path: PathBuf,
        /// Why.
        why: String,
    },
    /// The GPU's compute mode could not be changed.
    #[error("cannot switch {gpu} to compute mode {mode} for MPS")]
    ComputeMode {
        /// The GPU.
        gpu: String,
        /// The mode asked for.
        mode: &'static str,
        /// Why.
        #[source]
        source: Box<DiscoveryError>,
    },
    /// No daemon is known for this GPU.
    #[error("no MPS daemon runs for {gpu}")]
    Unknown {
        /// The GPU.
        gpu: String,
    },
}

/// Who switches a GPU between compute modes EXCLUSIVE_PROCESS and DEFAULT: NVML
/// ([`GpuDriver`]).
pub trait ComputeModes: std::fmt::Debug + Send + Sync {
    /// EXCLUSIVE_PROCESS when `exclusive`, else DEFAULT.
    fn set_exclusive_process(&self, gpu: &str, exclusive: bool) -> Result<(), DiscoveryError>;
}

impl ComputeModes for GpuDriver {
    fn set_exclusive_process(&self, gpu: &str, exclusive: bool) -> Result<(), DiscoveryError> {
        GpuDriver::set_exclusive_process(self, gpu, exclusive)
    }
}

/// Where the daemons' directories are and which program runs them.
#[derive(Debug, Clone)]
pub struct MpsConfig {
    /// `nvidia-cuda-mps-control` (a bare name is looked up on `PATH`).
    pub program: PathBuf,
    /// Root of the per-GPU `pipe` and `log` directories.
    pub root: PathBuf,
    /// Where liveness is read from (`/proc`).
    pub host: Processes,
    /// Who sets the GPUs' compute modes; `None` leaves them as they are.
    pub compute_modes: Option<Arc<dyn ComputeModes>>,
}

impl MpsConfig {
    /// `CUDA_MPS_PIPE_DIRECTORY` of `gpu`'s daemon: `<root>/<uuid>/pipe`.
    pub fn pipe_dir(&self, gpu: &str) -> PathBuf {
        self.root.join(gpu).join("pipe")
    }

    /// `program` on PATH, directories under `root`, liveness from `/proc`.
    pub fn new(root: impl Into<PathBuf>) -> MpsConfig {
        MpsConfig {
            program: PathBuf::from(PROGRAM),
            root: root.into(),
            host: Processes::default(),
            compute_modes: None,
        }
    }
}

/// One GPU's daemon: its directories and process.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MpsDaemon {
    /// The GPU's UUID.
    pub gpu: String,
    /// `CUDA_MPS_PIPE_DIRECTORY`: bind-mounted into every client.
    pub pipe_dir: PathBuf,
    /// `CUDA_MPS_LOG_DIRECTORY`.
    pub log_dir: PathBuf,
    /// The control daemon.
    pub process: ProcessStamp,
}

/// What [`MpsDaemons::supervise`] did about one daemon found dead.
#[derive(Debug)]
pub struct Restart {
    /// The GPU.
    pub gpu: String,
    /// Why the old daemon was taken for dead.
    pub why: String,
    /// The new daemon, or why it could not be started.
    pub outcome: Result<MpsDaemon, MpsError>,
}

/// The node's MPS daemons, one per shared GPU.
#[derive(Debug)]
pub struct MpsDaemons {
    config: MpsConfig,
    daemons: BTreeMap<String, (MpsDaemon, ShareLimits)>,
}

impl MpsDaemons {
    /// No daemon yet.
    pub fn new(config: MpsConfig) -> MpsDaemons {
        MpsDaemons {
            config,
            daemons: BTreeMap::new(),
        }
    }

    /// How many daemons this process knows.
    pub fn count(&self) -> usize {
        self.daemons.len()
    }

    /// The daemon of `gpu`, when one was started.
    pub fn get(&self, gpu: &str) -> Option<&MpsDaemon> {
        self.daemons.get(gpu).map(|(d, _)| d)
    }

    /// Whether `daemon` still runs, as this node's `/proc` tells.
    pub fn liveness(&self, daemon: &MpsDaemon) -> Liveness {
        self.config.host.process(&daemon.process)
    }

    /// Every daemon, by GPU.
    pub fn all(&self) -> impl Iterator<Item = &MpsDaemon> {
        self.daemons.values().map(|(d, _)| d)
    }

    /// Makes sure `gpu` has a running daemon whose default limits are `per_replica` (the
    /// limits of one unit, `100/R` percent and `total/R` MiB): starts one unless a live one is
    /// known. Returns it.
    pub fn ensure(&mut self, gpu: &str, per_replica: ShareLimits) -> Result<&MpsDaemon, MpsError> {
        let alive = match self.daemons.get(gpu) {
            Some((daemon, _)) => matches!(
                self.config.host.process(&daemon.process),
                Liveness::Alive(_)
            ),
            None => false,
        };
        if !alive {
            let daemon = self.start(gpu, per_replica)?;
            self.daemons.insert(gpu.to_owned(), (daemon, per_replica));
        }
        self.daemons
            .get(gpu)
            .map(|(d, _)| d)
            .ok_or_else(|| MpsError::Unknown {
                gpu: gpu.to_owned(),
            })
    }

    /// Takes over daemons recorded before an agent restart: a live one is kept as it is, a
    /// dead one is started again (reported in the returned list).
    pub fn adopt(
        &mut self,
        recorded: impl IntoIterator<Item = (MpsDaemon, ShareLimits)>,
    ) -> Vec<Restart> {
        for (daemon, limits) in recorded {
            self.daemons.insert(daemon.gpu.clone(), (daemon, limits));
        }
        self.supervise()
    }

    /// Restarts every daemon that is no longer running (a crash, a kill) with its limits. Its
    /// owners must be told: their clients lost their server.
    pub fn supervise(&mut self) -> Vec<Restart> {
        let dead: Vec<(String, String, ShareLimits)> = self
            .daemons
            .iter()
            .filter_map(
                |(gpu, (daemon, limits))| match self.config.host.process(&daemon.process) {
                    Liveness::Dead(why) => Some((gpu.clone(), why, *limits)),
                    Liveness::Alive(_) | Liveness::Uncertain(_) => None,
                },
            )
            .collect();
        let mut restarts = Vec::new();
        for (gpu, why, limits) in dead {
            tracing::warn!(gpu = %gpu, %why, "the MPS control daemon died; starting it again");
            let outcome = self.start(&gpu, limits);
            match &outcome {
                Ok(daemon) => {
                    self.daemons.insert(gpu.clone(), (daemon.clone(), limits));
                }
                Err(e) => {
                    tracing::error!(gpu = %gpu, error = %e, "cannot restart the MPS control daemon");
                }
            }
            restarts.push(Restart { gpu, why, outcome });
        }
        restarts
    }

    /// Stops `gpu`'s daemon (`quit`) once it holds no share; nothing when none is known.
    pub fn stop(&mut self, gpu: &str) -> Result<(), MpsError> {
        let Some((daemon, _)) = self.daemons.remove(gpu) else {
            return Ok(());
        };
        if !matches!(
            self.config.host.process(&daemon.process),
            Liveness::Alive(_)
        ) {
            return Ok(());
        }
        self.command(&daemon, "quit").map(|_| ())?;
        tracing::info!(gpu = %gpu, "stopped the MPS control daemon");
        self.set_mode(gpu, false)
    }

    /// Stops a daemon another process recorded, whose GPU left sharing: `quit` when it runs,
    /// and the GPU back to compute mode DEFAULT either way.
    pub fn retire(&mut self, daemon: MpsDaemon, per_replica: ShareLimits) -> Result<(), MpsError> {
        let gpu = daemon.gpu.clone();
        let alive = matches!(self.liveness(&daemon), Liveness::Alive(_));
        self.daemons.insert(gpu.clone(), (daemon, per_replica));
        self.stop(&gpu)?;
        if !alive {
            self.set_mode(&gpu, false)?;
        }
        Ok(())
    }

    /// Sends `command` to `gpu`'s daemon and returns its reply.
    pub fn ask(&self, gpu: &str, command: &str) -> Result<String, MpsError> {
        let (daemon, _) = self.daemons.get(gpu).ok_or_else(|| MpsError::Unknown {
            gpu: gpu.to_owned(),
        })?;
        self.command(daemon, command)
    }

    /// Switches the GPU to EXCLUSIVE_PROCESS, then starts its daemon; a daemon that does not
    /// start leaves the GPU in DEFAULT again.
    fn start(&self, gpu: &str, per_replica: ShareLimits) -> Result<MpsDaemon, MpsError> {
        self.set_mode(gpu, true)?;
        self.launch(gpu, per_replica).inspect_err(|_| {
            if let Err(e) = self.set_mode(gpu, false) {
                tracing::error!(gpu = %gpu, error = %e, "cannot set the compute mode back to DEFAULT");
            }
        })
    }

    fn launch(&self, gpu: &str, per_replica: ShareLimits) -> Result<MpsDaemon, MpsError> {
        let pipe_dir = self.config.pipe_dir(gpu);
        let log_dir = self.config.root.join(gpu).join("log");
        for path in [&pipe_dir, &log_dir] {
            fsmode::state_dir(&self.config.root, path, fsmode::STATE_DIR).map_err(|source| {
                MpsError::Dir {
                    gpu: gpu.to_owned(),
                    path: path.clone(),
                    source,
                }
            })?;
        }
        let output = Command::new(&self.config.program)
            .arg("-d")
            .env(CUDA_VISIBLE_DEVICES, gpu)
            .env(CUDA_MPS_PIPE_DIRECTORY, &pipe_dir)
            .env(CUDA_MPS_LOG_DIRECTORY, &log_dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .output()
            .map_err(|source| self.spawn_error(gpu, source))?;
        if !output.status.success() {
            return Err(MpsError::Failed {
                gpu: gpu.to_owned(),
                program: self.config.program.clone(),
                what: "-d".to_owned(),
                status: output.status,
                message: String::from_utf8_lossy(&output.stderr).trim().to_owned(),
            });
        }
        let pid_file = pipe_dir.join(PID_FILE);
        let no_pid = |why: String| MpsError::NoPid {
            gpu: gpu.to_owned(),
            path: pid_file.clone(),
            why,
        };
        let pid: u32 = std::fs::read_to_string(&pid_file)
            .map_err(|e| no_pid(e.to_string()))?
            .trim()
            .parse()
            .map_err(|e: std::num::ParseIntError| no_pid(e.to_string()))?;
        let process = self
            .config
            .host
            .stamp(pid)
            .map_err(|e| no_pid(format!("pid {pid}: {e}")))?;
        let daemon = MpsDaemon {
            gpu: gpu.to_owned(),
            pipe_dir,
            log_dir,
            process,
        };
        self.command(
            &daemon,
            &format!(
                "set_default_active_thread_percentage {}\nset_default_device_pinned_mem_limit {gpu} {}M",
                per_replica.active_thread_percentage, per_replica.pinned_mem_limit_mib
            ),
        )?;
        tracing::info!(gpu = %gpu, pid, pipe = %daemon.pipe_dir.display(), "started the MPS control daemon");
        Ok(daemon)
    }

    fn set_mode(&self, gpu: &str, exclusive: bool) -> Result<(), MpsError> {
        let Some(modes) = self
            .config
            .compute_modes
            .as_ref()
            .filter(|_| !gpu.starts_with(MIG_PREFIX))
        else {
            return Ok(());
        };
        modes
            .set_exclusive_process(gpu, exclusive)
            .map_err(|source| MpsError::ComputeMode {
                gpu: gpu.to_owned(),
                mode: if exclusive {
                    "EXCLUSIVE_PROCESS"
                } else {
                    "DEFAULT"
                },
                source: Box::new(source),
            })
    }

    fn command(&self, daemon: &MpsDaemon, commands: &str) -> Result<String, MpsError> {
        let gpu = &daemon.gpu;
        let mut child = Command::new(&self.config.program)
            .env(CUDA_MPS_PIPE_DIRECTORY, &daemon.pipe_dir)
            .env(CUDA_MPS_LOG_DIRECTORY, &daemon.log_dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|source| self.spawn_error(gpu, source))?;
        if let Some(mut stdin) = child.stdin.take() {
            stdin
                .write_all(format!("{commands}\n").as_bytes())
                .map_err(|source| self.spawn_error(gpu, source))?;
        }
        let output = child
            .wait_with_output()
            .map_err(|source| self.spawn_error(gpu, source))?;
        if !output.status.success() {
            return Err(MpsError::Failed {
                gpu: gpu.clone(),
                program: self.config.program.clone(),
                what: format!("{commands:?}"),
                status: output.status,
                message: String::from_utf8_lossy(&output.stderr).trim().to_owned(),
            });
        }
        Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned())
    }

    fn spawn_error(&self, gpu: &str, source: io::Error) -> MpsError {
        MpsError::Spawn {
            gpu: gpu.to_owned(),
            program: self.config.program.clone(),
            source,
        }
    }
}
