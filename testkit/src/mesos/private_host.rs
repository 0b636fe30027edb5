//! A private view of the host for an agent that looks where a driver install puts things:
//! `/dev/nvidia*` device nodes, `libnvidia-ml.so.1` in `/etc/ld.so.cache`, and a `/run` of its
//! own. Mesos's `gpu/nvidia` needs all three and cannot be pointed elsewhere
//! (`isolators/gpu/isolator.cpp` stats `/dev/nvidiactl` and `/dev/nvidia-uvm`, `nvml.cpp`
//! `dlopen`s `libnvidia-ml.so.1`, `volume.cpp` copies the NVIDIA libraries `ld.so.cache` names
//! into `/var/run/mesos/isolators/gpu/nvidia_<driver version>`).
//!
//! Nothing is made on the host. The agent runs in a private mount namespace
//! (`unshare --mount --propagation private`) where a script, before it `exec`s the agent:
//! - bind-mounts the host's `/dev` and `/run` under a staging directory and mounts a tmpfs over
//!   each, holding a symbolic link to every host entry (so `/dev/null`, `/dev/pts`,
//!   `/run/docker.sock` stay the host's, live), but none to the host's own NVIDIA nodes or
//!   `/run/mesos`;
//! - `mknod`s the NVIDIA nodes in that `/dev` (and `/dev/nvidia-caps/…`);
//! - bind-mounts an `ld.so.cache`, made by `ldconfig -C` from the host's configuration plus the
//!   simulated driver's directory, over `/etc/ld.so.cache`.
//!
//! Tasks run in copies of that namespace (`filesystem/linux`), so they see the same `/dev`. The
//! namespace and its tmpfs go away with the last process in it: the agent, and the executors
//! that outlive an agent SIGKILL (the [`super::Agent`] guard kills those). Each start of the
//! agent gets a fresh namespace from the same script.

use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use tempfile::TempDir;

use super::{MesosResult, run};

/// One device node to make: a path under `/dev`, its major and minor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DevNode {
    /// The path relative to `/dev`, e.g. `nvidia0` or `nvidia-caps/nvidia-cap21`.
    pub path: String,
    /// Major number.
    pub major: u32,
    /// Minor number.
    pub minor: u32,
}

impl DevNode {
    /// The NVIDIA nodes of GPUs with `minors` and the control nodes: `nvidia<minor>`
    /// (c 195:minor), `nvidiactl` (c 195:255), `nvidia-uvm` (c 240:0), `nvidia-uvm-tools`
    /// (c 240:1), as [`super::DevNodes::nvidia`] makes them.
    pub fn nvidia(minors: &[u32]) -> Vec<DevNode> {
        let node = |path: String, major, minor| DevNode { path, major, minor };
        let mut nodes: Vec<DevNode> = minors
            .iter()
            .map(|&m| node(format!("nvidia{m}"), 195, m))
            .collect();
        nodes.push(node("nvidiactl".into(), 195, 255));
        nodes.push(node("nvidia-uvm".into(), 240, 0));
        nodes.push(node("nvidia-uvm-tools".into(), 240, 1));
        nodes
    }
}

/// The files of a private host view (see the module doc); removed on drop.
#[derive(Debug)]
pub struct PrivateHost {
    dir: TempDir,
}

impl PrivateHost {
    /// A view with `nodes` in `/dev` and `lib_dirs` added to the host's `ld.so.cache`.
    pub fn new(nodes: &[DevNode], lib_dirs: &[&Path]) -> MesosResult<PrivateHost> {
        let dir = tempfile::Builder::new()
            .prefix("mgpu-private-host")
            .tempdir()
            .map_err(|e| format!("tempdir: {e}"))?;
        let d = dir.path();
        let mut conf = String::new();
        for lib in lib_dirs {
            let _ = writeln!(conf, "{}", lib.display());
        }
        conf.push_str("include /etc/ld.so.conf.d/*.conf\n");
        let conf_path = d.join("ld.so.conf");
        write(&conf_path, &conf)?;
        // -X: leave the directories' symbolic links alone.
        run(
            Command::new("ldconfig")
                .arg("-X")
                .arg("-C")
                .arg(d.join("ld.so.cache"))
                .arg("-f")
                .arg(&conf_path),
            "ldconfig (private ld.so.cache)",
        )?;
        fs::create_dir(d.join("stage")).map_err(|e| format!("{}: {e}", d.display()))?;
        // `shadow DIR "NAMES"`: DIR becomes a tmpfs of links to the host's entries, except NAMES
        // (before issue 34 NAMES was ignored, so Mesos's driver volume went to the host's
        // `/run/mesos` whenever the host had one).
        let mut script = String::from(
            "set -e\n\
             shadow() {\n\
             \x20 s=\"$STAGE/$(echo \"$1\" | tr / _)\"\n\
             \x20 mkdir -p \"$s\"\n\
             \x20 mount --rbind \"$1\" \"$s\"\n\
             \x20 mount -t tmpfs -o mode=755 mgpu-private \"$1\"\n\
             \x20 for e in $(ls -A \"$s\"); do\n\
             \x20   case \" $2 \" in *\" $e \"*) ;; *) ln -s \"$s/$e\" \"$1/$e\" ;; esac\n\
             \x20 done\n\
             }\n",
        );
        let _ = writeln!(script, "STAGE={}", d.join("stage").display());
        // The host's own NVIDIA nodes (if any) and `/run/mesos` (Mesos's driver volume goes there)
        // stay out of the view.
        let host_nvidia = "nvidia nvidiactl nvidia-uvm nvidia-uvm-tools nvidia-modeset nvidia-caps";
        let _ = writeln!(
            script,
            "shadow /dev \"{host_nvidia} $(cd /dev && echo nvidia[0-9]*)\""
        );
        script.push_str("shadow /run mesos\n");
        for node in nodes {
            let path = Path::new("/dev").join(&node.path);
            if let Some(parent) = path.parent().filter(|p| *p != Path::new("/dev")) {
                let _ = writeln!(script, "mkdir -p {}", parent.display());
            }
            let _ = writeln!(
                script,
                "mknod -m 666 {} c {} {}",
                path.display(),
                node.major,
                node.minor
            );
        }
        let _ = writeln!(
            script,
            "mount --bind {} /etc/ld.so.cache",
            d.join("ld.so.cache").display()
        );
        write(&d.join("setup.sh"), &script)?;
        Ok(PrivateHost { dir })
    }

    /// The script that sets the view up in a fresh mount namespace (`sh` syntax, `set -e`).
    pub fn setup_script(&self) -> PathBuf {
        self.dir.path().join("setup.sh")
    }

    /// The `ld.so.cache` the view puts at `/etc/ld.so.cache`.
    pub fn ld_cache(&self) -> PathBuf {
        self.dir.path().join("ld.so.cache")
    }
}

fn write(path: &Path, text: &str) -> MesosResult {
    fs::write(path, text).map_err(|e| format!("{}: {e}", path.display()))
}
