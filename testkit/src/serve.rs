//! `mesos-gpu serve` as the cli's tests start it: on a simulated node, with every path it
//! writes in one temporary directory, and no Docker daemon behind it.

use std::ffi::OsStr;
use std::path::Path;
use std::process::Command;

/// `<bin> serve --simulate <node>` with every path under `dir`: the volume plugin's socket
/// `nvidia-docker.sock`, the volumes in `volumes/`, the Docker state in `serve/` (its pool in
/// `serve/pool`) and a Docker socket `no-docker.sock` nothing listens on. The caller adds
/// `--listen`, `--driver-poll` and what else its test needs.
pub fn command(bin: impl AsRef<OsStr>, node: impl AsRef<OsStr>, dir: &Path) -> Command {
    let state = dir.join("serve");
    let mut cmd = Command::new(bin);
    cmd.args(["serve", "--simulate"])
        .arg(node)
        .arg("--plugin-socket")
        .arg(dir.join("nvidia-docker.sock"))
        .arg("--volume-root")
        .arg(dir.join("volumes"))
        .arg("--docker-state-dir")
        .arg(&state)
        .arg("--pool-dir")
        .arg(state.join("pool"))
        .arg("--docker-socket")
        .arg(dir.join("no-docker.sock"));
    cmd
}
