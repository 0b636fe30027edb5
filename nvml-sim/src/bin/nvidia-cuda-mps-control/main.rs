//! `nvidia-cuda-mps-control` stand-in: NVIDIA's MPS control daemon and its client, for hosts
//! without a GPU (`nvml-sim/README.md`, "MPS control stand-in").
//!
//! Like the real program (`nvidia-cuda-mps-control(1)`, NVIDIA's MPS documentation): `-d` starts
//! the control daemon in the background, `-f` in the foreground; without options it is a client
//! that reads commands from standard input, one per line, sends each to the daemon and prints the
//! replies (`echo get_server_list | nvidia-cuda-mps-control`). Daemon and clients meet in
//! `CUDA_MPS_PIPE_DIRECTORY` (default `/tmp/nvidia-mps`), which holds the `control` socket, the
//! `control_lock` lock file and `nvidia-cuda-mps-control.pid`; the daemon writes `control.log`
//! into `CUDA_MPS_LOG_DIRECTORY` (default `/var/log/nvidia-mps`). A client that finds no daemon
//! prints `Cannot find MPS control daemon process` and exits 1.
//!
//! What is simulated: no CUDA client ever connects, so servers exist only when started with
//! `start_server -uid <UID>` (each a real child process, so its PID is real). Everything the
//! daemon is told is appended to a JSON-lines record, and failures are configured in
//! `mps-sim.json` beside the executable (or `$NVML_SIM_MPS_CONFIG`).
#![forbid(unsafe_code)]

mod commands;
mod daemon;
mod record;

use std::io::{self, BufRead as _, Read as _, Write as _};
use std::net::Shutdown;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::ExitCode;

/// `CUDA_MPS_PIPE_DIRECTORY`'s default.
const DEFAULT_PIPE_DIR: &str = "/tmp/nvidia-mps";
/// `CUDA_MPS_LOG_DIRECTORY`'s default.
const DEFAULT_LOG_DIR: &str = "/var/log/nvidia-mps";
/// The control socket's name in the pipe directory.
pub(crate) const CONTROL: &str = "control";
/// What a client prints when no daemon answers (the real program's words).
const NO_DAEMON: &str = "Cannot find MPS control daemon process";

const USAGE: &str = "\
usage: nvidia-cuda-mps-control [-d | -f]
       echo <command> | nvidia-cuda-mps-control

A stand-in for NVIDIA's MPS control daemon (nvml-sim): no GPU work is done, everything the
daemon is told is recorded.

  -d    start the control daemon in the background (returns once it accepts commands)
  -f    run the control daemon in the foreground
  -h    print this help

Without options, read commands from standard input, one per line, and print the replies.

Environment:
  CUDA_MPS_PIPE_DIRECTORY  control socket, lock and pid file [default: /tmp/nvidia-mps]
  CUDA_MPS_LOG_DIRECTORY   control.log [default: /var/log/nvidia-mps]
  NVML_SIM_MPS_CONFIG      stand-in settings [default: mps-sim.json beside this program]

Examples:
  CUDA_MPS_PIPE_DIRECTORY=/run/mps/0/pipe CUDA_MPS_LOG_DIRECTORY=/run/mps/0/log \\
      nvidia-cuda-mps-control -d
  echo set_default_active_thread_percentage 25 | CUDA_MPS_PIPE_DIRECTORY=/run/mps/0/pipe \\
      nvidia-cuda-mps-control
  echo quit | CUDA_MPS_PIPE_DIRECTORY=/run/mps/0/pipe nvidia-cuda-mps-control
";

/// The directory an environment variable names, else its default.
pub(crate) fn dir_from_env(var: &str, default: &str) -> PathBuf {
    std::env::var_os(var)
        .filter(|v| !v.is_empty())
        .map_or_else(|| PathBuf::from(default), PathBuf::from)
}

/// The pipe directory in use.
pub(crate) fn pipe_dir() -> PathBuf {
    dir_from_env("CUDA_MPS_PIPE_DIRECTORY", DEFAULT_PIPE_DIR)
}

/// The log directory in use.
pub(crate) fn log_dir() -> PathBuf {
    dir_from_env("CUDA_MPS_LOG_DIRECTORY", DEFAULT_LOG_DIR)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .as_slice()
    {
        [] => client(),
        ["-d"] => daemon::start_background(),
        ["-f"] => daemon::run_foreground(),
        ["-h" | "--help"] => {
            print!("{USAGE}");
            ExitCode::SUCCESS
        }
        [daemon::SERVER_ARG, uid] => daemon::run_server(uid),
        other => {
            eprintln!(
                "nvidia-cuda-mps-control: unknown arguments {:?}; accepted: -d, -f, -h, or none\n\n{USAGE}",
                other.join(" ")
            );
            ExitCode::from(2)
        }
    }
}

/// Sends one command; `Ok((ok, text))` with the daemon's verdict and reply.
pub(crate) fn send(command: &str) -> io::Result<(bool, String)> {
    let mut stream = UnixStream::connect(pipe_dir().join(CONTROL))?;
    stream.write_all(format!("{command}\n").as_bytes())?;
    stream.shutdown(Shutdown::Write)?;
    let mut reply = String::new();
    stream.read_to_string(&mut reply)?;
    let (status, text) = reply.split_once('\n').unwrap_or((reply.as_str(), ""));
    Ok((status == "ok", text.to_owned()))
}

/// Client mode: every line of standard input is a command. Exits 1 when no daemon answers or
/// when the daemon rejected a command (its reason goes to standard error).
fn client() -> ExitCode {
    let mut failed = false;
    for line in io::stdin().lock().lines() {
        let line = match line {
            Ok(l) => l,
            Err(e) => {
                eprintln!("nvidia-cuda-mps-control: cannot read standard input: {e}");
                return ExitCode::FAILURE;
            }
        };
        let command = line.trim();
        if command.is_empty() {
            continue;
        }
        match send(command) {
            Ok((true, text)) => {
                if !text.is_empty() {
                    println!("{text}");
                }
            }
            Ok((false, text)) => {
                eprintln!("{text}");
                failed = true;
            }
            Err(_) => {
                eprintln!("{NO_DAEMON}");
                return ExitCode::FAILURE;
            }
        }
    }
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
