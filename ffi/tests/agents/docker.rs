//! Real agents running Mesos's Docker containerizer beside the module (issue 12), for the
//! real-agent tests (`tests/mesos_agent.rs`) and the upgrade tests (`tests/upgrade.rs`): the hook
//! module `org_apache_mesos_gpu_MesosGpuDockerHook` (which reserves with `mesos-gpu docker-args`)
//! and the agent's `--docker` program (a script running `mesos-gpu docker-wrapper`) added to an
//! agent spec, busybox images built `FROM scratch` (removed, with their containers, on drop), the
//! Docker task's command, and the pool's Docker reservations.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use mesos_gpu_testkit::mesos::{
    AgentSpec, DOCKER_HOOK_MODULE, Master, MesosInstall, Task, add_docker_hook, wait_for,
};

use super::{probe, which};
use crate::support::{TestResult, check};

/// The simulated node's driver version (its driver volume's name).
pub(crate) const DRIVER_VERSION: &str = "550.54.14";

/// The image name the `docker` program of [`Wrapper::Stalling`] stalls on (every command naming
/// it sleeps, writing its pid to `<scratch>/stalled.pid`): the agent's pull never ends.
pub(crate) const STALL: &str = "mgpu-stall";

/// One Docker-containerizer agent at a time in a test process: at start (and restart) Mesos's
/// Docker containerizer lists every `mesos-…` container of the daemon and inspects each one, and
/// an inspect of another trial's container that is removed meanwhile fails the agent's recovery
/// (`Docker ps batch failed … Failed to run '… inspect …'`).
pub(crate) fn one_docker_agent() -> std::sync::MutexGuard<'static, ()> {
    static DOCKER_AGENTS: std::sync::Mutex<()> = std::sync::Mutex::new(());
    DOCKER_AGENTS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The agent's `docker` program.
pub(crate) enum Wrapper {
    /// A script running `mesos-gpu docker-wrapper` with the test's NVML and device root, which
    /// stalls on [`STALL`] images.
    Stalling,
    /// `examples/mesos-agent/mesos-gpu-docker` with the test's paths: no `--nvml-lib`, no
    /// `--dev-root`, as shipped.
    Shipped,
}

/// What the Docker containerizer's pieces are given: the `mesos-gpu` they run and the paths
/// they share with the module.
pub(crate) struct DockerTools<'a> {
    /// The `mesos-gpu` the hook's `docker-args` and the wrapper run.
    pub(crate) exe: &'a Path,
    /// Global options selecting the node (`--nvml-lib …` or `--simulate …`, `--dev-root …`).
    pub(crate) node: String,
    /// The node's pool (the module's `pool_dir`).
    pub(crate) pool: &'a Path,
    /// The Docker containers' record.
    pub(crate) state_dir: &'a Path,
    /// The option naming it: `--docker-state-dir`, or `--work-dir` for a `mesos-gpu` that
    /// predates that name.
    pub(crate) state_flag: &'a str,
    /// More arguments for the hook's `docker-args` command line.
    pub(crate) docker_args: &'a [&'a str],
    /// The Docker daemon's socket (the machine's when `None`).
    pub(crate) socket: Option<&'a Path>,
    pub(crate) wrapper: Wrapper,
}

impl DockerTools<'_> {
    /// Adds the Docker containerizer to `spec` (whose modules.json loads the isolator): the
    /// driver volume directory, the `--docker` program and the hook module (both written in
    /// `scratch`), and the agent flags.
    pub(crate) fn add_to(&self, spec: &mut AgentSpec, scratch: &Path) -> TestResult {
        let volumes = scratch.join("volumes");
        let volume = volumes.join(format!("nvidia_{DRIVER_VERSION}"));
        std::fs::create_dir_all(volume.join("bin"))?;
        std::fs::write(volume.join("bin/driver-volume-marker"), b"")?;
        let global = format!("{} {}", self.exe.display(), self.node);
        let mut docker_args = format!(
            "{global} docker-args --pool-dir {} {} {} --volume-root {}",
            self.pool.display(),
            self.state_flag,
            self.state_dir.display(),
            volumes.display()
        );
        for arg in self.docker_args {
            docker_args.push_str(&format!(" {arg}"));
        }
        if let Some(socket) = self.socket {
            docker_args.push_str(&format!(" --docker-socket {}", socket.display()));
            spec.flags
                .push(format!("--docker_socket={}", socket.display()));
        }
        let wrapper = scratch.join("mesos-gpu-docker");
        let script = match self.wrapper {
            Wrapper::Shipped => {
                shipped_wrapper(self.exe, &which("docker")?, self.pool, self.state_dir)?
            }
            Wrapper::Stalling => format!(
                "#!/bin/sh\ncase \"$*\" in *{STALL}*) echo $$ > {}; exec sleep 600;; esac\nexec {global} docker-wrapper --docker {} --pool-dir {} {} {} -- \"$@\"\n",
                scratch.join("stalled.pid").display(),
                which("docker")?.display(),
                self.pool.display(),
                self.state_flag,
                self.state_dir.display()
            ),
        };
        std::fs::write(&wrapper, script)?;
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755))?;
        // Both modules: the isolator's parameters as the spec has them, and the hook.
        let modules = spec.modules.clone().ok_or("no modules.json")?;
        let mut json: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&modules)?)?;
        add_docker_hook(&mut json, &docker_args).ok_or("modules.json has no modules")?;
        std::fs::write(&modules, json.to_string())?;
        spec.flags.extend([
            "--containerizers=docker,mesos".to_owned(),
            format!("--docker={}", wrapper.display()),
            format!("--hooks={DOCKER_HOOK_MODULE}"),
            "--docker_remove_delay=1secs".to_owned(),
            // Tests run several agents on the machine's one Docker daemon: at each start an agent
            // stops every `mesos-` container it did not launch (`docker.cpp` 1073-1107), which
            // would include the other tests' tasks.
            "--docker_kill_orphans=false".to_owned(),
        ]);
        Ok(())
    }
}

/// `examples/mesos-agent/mesos-gpu-docker` with `exe` as `mesos-gpu`, this host's `docker` and
/// the test's pool and Docker state directories in place of the installed paths.
fn shipped_wrapper(exe: &Path, docker: &Path, pool: &Path, work: &Path) -> TestResult<String> {
    let shipped = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/mesos-agent/mesos-gpu-docker"),
    )?;
    let script = shipped
        .replace("/usr/bin/mesos-gpu ", &format!("{} ", exe.display()))
        .replace("/usr/bin/docker ", &format!("{} ", docker.display()))
        .replace("/var/lib/mesos-gpu ", &format!("{} ", pool.display()))
        .replace("/var/run/mesos-gpu ", &format!("{} ", work.display()));
    // What it runs (its comments aside) names this build's paths, and no NVML or device root.
    let command: String = script
        .lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .collect();
    check(
        command.contains(&exe.display().to_string())
            && command.contains(&work.display().to_string())
            && !command.contains("--nvml-lib")
            && !command.contains("--dev-root"),
        format!("the shipped wrapper is not as this trial expects:\n{script}"),
    )?;
    Ok(script)
}

/// Busybox images built `FROM scratch` holding the device probe at `/probe`, on one daemon;
/// on drop their containers and they are removed.
pub(crate) struct Images {
    /// `-H unix://<socket>` of a private daemon, empty for the machine's.
    host: Vec<String>,
    names: Vec<String>,
}

impl Images {
    /// Images on the daemon at `socket` (the machine's when `None`).
    pub(crate) fn on(socket: Option<&Path>) -> Images {
        Images {
            host: socket
                .map(|p| vec!["-H".to_owned(), format!("unix://{}", p.display())])
                .unwrap_or_default(),
            names: Vec::new(),
        }
    }

    /// `docker` talking to this daemon.
    pub(crate) fn docker(&self) -> Command {
        let mut command = Command::new("docker");
        command.args(&self.host);
        command
    }

    /// Builds an image (its context in a new directory of `scratch`) with these labels
    /// (`KEY=VALUE`); returns its name.
    pub(crate) fn build(&mut self, scratch: &Path, labels: &[&str]) -> TestResult<String> {
        let dir: PathBuf = scratch.join(mesos_gpu_testkit::unique_name("image"));
        std::fs::create_dir(&dir)?;
        std::fs::copy("/bin/busybox", dir.join("busybox"))?;
        std::fs::copy(probe()?, dir.join("probe"))?;
        let name = format!("{}:1", mesos_gpu_testkit::unique_name("mesos-docker"));
        let mut dockerfile = format!(
            "FROM scratch\nCOPY busybox /bin/busybox\nRUN [\"/bin/busybox\", \"--install\", \"-s\", \"/bin\"]\nCOPY probe /probe\nLABEL mgpu.test={name}\n"
        );
        for label in labels {
            dockerfile.push_str(&format!("LABEL {label}\n"));
        }
        std::fs::write(dir.join("Dockerfile"), dockerfile)?;
        self.names.push(name.clone());
        let out = self
            .docker()
            .args(["build", "--no-cache", "-q", "-t", &name])
            .arg(&dir)
            .output()?;
        check(
            out.status.success(),
            format!("docker build: {}", String::from_utf8_lossy(&out.stderr)),
        )?;
        Ok(name)
    }
}

impl Drop for Images {
    fn drop(&mut self) {
        for image in &self.names {
            let listed = self
                .docker()
                .args(["ps", "-aq", "--filter"])
                .arg(format!("ancestor={image}"))
                .output();
            if let Ok(out) = listed {
                for id in String::from_utf8_lossy(&out.stdout).split_whitespace() {
                    let _ = self.docker().args(["rm", "-f", id]).output();
                }
            }
            let _ = self
                .docker()
                .args(["rmi", "-f", "--no-prune", image])
                .output();
        }
    }
}

/// Launches Docker task `name` in `image` asking for `resources`: it probes `/dev` (and
/// `/dev/nvidia-caps` when the container has it), prints the mounts at /usr/local/nvidia and the
/// volume's files, waits for the file `go` in its sandbox when `wait`, and prints `done`.
pub(crate) fn launch_docker_task(
    install: &MesosInstall,
    master: &Master,
    name: &str,
    image: &str,
    resources: &str,
    wait: bool,
) -> TestResult<Task> {
    let mut command = "/probe /dev; if [ -d /dev/nvidia-caps ]; then /probe /dev/nvidia-caps; fi; grep ' /usr/local/nvidia ' /proc/mounts | sed 's/^/mount /'; ls /usr/local/nvidia/bin 2>/dev/null | sed 's/^/volume /'".to_owned();
    if wait {
        command.push_str("; echo waiting; while [ ! -e $MESOS_SANDBOX/go ]; do sleep 0.1; done");
    }
    command.push_str("; echo done");
    let docker_image = format!("--docker_image={image}");
    Ok(Task::launch_with(
        install,
        master,
        name,
        resources,
        &command,
        &[
            "--framework_capabilities=GPU_RESOURCES",
            "--checkpoint",
            "--containerizer=docker",
            &docker_image,
        ],
    )?)
}

/// The Docker containers' reservations in the pool at `pool_dir` (owner ids).
pub(crate) fn docker_reservations(pool_dir: &Path) -> TestResult<Vec<String>> {
    let path = pool_dir.join("gpu/pool.json");
    let json: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path)?)?;
    Ok(json["reservations"]
        .as_object()
        .into_iter()
        .flatten()
        .filter(|(_, r)| r["owner"].to_string().contains("docker"))
        .map(|(k, _)| k.clone())
        .collect())
}

/// A private dockerd (its own data root, exec root, pid file, socket and cgroup parent), so
/// that a test may restart it. It runs in a network namespace of its own: its default bridge
/// `docker0` must not be the machine's (a daemon started with `--bridge=none` in the machine's
/// namespace deletes the machine's `docker0`). Stopped, its containers and files removed, on
/// drop.
pub(crate) struct PrivateDockerd {
    dir: tempfile::TempDir,
    child: Option<std::process::Child>,
    /// Its `--cgroup-parent`, removed on drop.
    cgroup_parent: String,
}

impl PrivateDockerd {
    pub(crate) fn start(live_restore: bool) -> TestResult<PrivateDockerd> {
        let dir = tempfile::Builder::new()
            .prefix("mgpu-dockerd")
            .tempdir_in("/tmp")?;
        let mut d = PrivateDockerd {
            dir,
            child: None,
            cgroup_parent: mesos_gpu_testkit::unique_name("dockerd"),
        };
        d.launch(live_restore)?;
        Ok(d)
    }

    /// Its socket.
    pub(crate) fn socket(&self) -> PathBuf {
        self.dir.path().join("docker.sock")
    }

    fn launch(&mut self, live_restore: bool) -> TestResult {
        let dir = self.dir.path();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("dockerd.log"))?;
        let mut command = std::process::Command::new("unshare");
        command
            .args(["--net", "/bin/sh", "-c"])
            .arg("ip link set lo up && exec dockerd \"$@\"")
            .arg("dockerd")
            .arg("--data-root")
            .arg(dir.join("data"))
            .arg("--exec-root")
            .arg(dir.join("exec"))
            .arg("--pidfile")
            .arg(dir.join("dockerd.pid"))
            .arg("-H")
            .arg(format!("unix://{}", self.socket().display()))
            .arg(format!("--cgroup-parent={}", self.cgroup_parent))
            .args(["--iptables=false", "--shutdown-timeout=1"])
            .stdout(log.try_clone()?)
            .stderr(log);
        if live_restore {
            command.arg("--live-restore");
        }
        self.child = Some(command.spawn()?);
        let socket = self.socket();
        wait_for(
            Duration::from_secs(60),
            || {
                format!(
                    "the private dockerd to answer; its log:\n{}",
                    mesos_gpu_testkit::mesos::tail(
                        &std::fs::read_to_string(dir.join("dockerd.log")).unwrap_or_default(),
                        20
                    )
                )
            },
            || {
                std::process::Command::new("docker")
                    .arg("-H")
                    .arg(format!("unix://{}", socket.display()))
                    .arg("version")
                    .output()
                    .ok()
                    .filter(|o| o.status.success())
                    .map(|_| ())
            },
        )?;
        Ok(())
    }

    /// SIGTERM and wait: without live-restore the daemon stops its containers.
    pub(crate) fn stop(&mut self) -> TestResult {
        if let Some(mut child) = self.child.take() {
            std::process::Command::new("kill")
                .args(["-TERM", &child.id().to_string()])
                .status()?;
            child.wait()?;
        }
        Ok(())
    }

    pub(crate) fn restart(&mut self, live_restore: bool) -> TestResult {
        self.stop()?;
        self.launch(live_restore)
    }

    /// `.State.Status` of container `name`, or what `docker inspect` said.
    pub(crate) fn status(&self, name: &str) -> String {
        std::process::Command::new("docker")
            .arg("-H")
            .arg(format!("unix://{}", self.socket().display()))
            .args(["inspect", "--format", "{{.State.Status}}", name])
            .output()
            .map(|o| {
                format!(
                    "{}{}",
                    String::from_utf8_lossy(&o.stdout).trim(),
                    String::from_utf8_lossy(&o.stderr).trim()
                )
            })
            .unwrap_or_else(|e| e.to_string())
    }
}

impl Drop for PrivateDockerd {
    fn drop(&mut self) {
        let host = format!("unix://{}", self.socket().display());
        if self.child.is_some()
            && let Ok(out) = std::process::Command::new("docker")
                .args(["-H", &host, "ps", "-aq"])
                .output()
        {
            for id in String::from_utf8_lossy(&out.stdout).split_whitespace() {
                let _ = std::process::Command::new("docker")
                    .args(["-H", &host, "rm", "-f", id])
                    .output();
            }
        }
        let _ = self.stop();
        // dockerd leaves its data root bind-mounted on itself and its network namespace file
        // mounted: unmount them (deepest first) so that the directory can be removed.
        let dir = self.dir.path().display().to_string();
        let mut mounts: Vec<String> = std::fs::read_to_string("/proc/mounts")
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.split_whitespace().nth(1))
            .filter(|m| m.starts_with(&dir))
            .map(str::to_owned)
            .collect();
        mounts.sort_by_key(|m| std::cmp::Reverse(m.len()));
        for mount in mounts {
            let _ = std::process::Command::new("umount")
                .args(["-l", &mount])
                .status();
        }
        if let Ok(controllers) = std::fs::read_dir("/sys/fs/cgroup") {
            for controller in controllers.flatten() {
                let _ = std::fs::remove_dir(controller.path().join(&self.cgroup_parent));
            }
        }
    }
}
