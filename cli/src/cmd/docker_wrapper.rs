//! `mesos-gpu docker-wrapper`: the `docker` program of a mesos-agent (`--docker`) whose Docker
//! containerizer tasks get GPUs from the node's pool.
//!
//! The agent and `mesos-docker-executor` run `<docker> -H <socket> <command> …`. Every command
//! is passed to the real `docker` unchanged, except a `docker run` whose environment holds
//! `MESOS_GPU_DOCKER_ARGS` (a JSON array of arguments, put there by the agent's hook module
//! `org_apache_mesos_gpu_MesosGpuDockerHook` after `mesos-gpu docker-args` reserved the task's
//! GPUs for the container `mesos-<id>`): the variable is removed, its arguments (devices,
//! driver volume, `NVIDIA_VISIBLE_DEVICES`) are added after `run`, and when `docker run` ends
//! (the task finished, was killed, or its container died) the container's GPUs go back to the
//! pool, once the daemon says the container is not running (a `docker run` that lost a live
//! container, or a daemon that cannot answer, leaves them reserved for `mesos-<id>`).
//!
//! It loads no NVML: what it does needs no GPU seen. It claims and releases the reservation by
//! container id, keeping every record as written ([`super::docker_pool::open_records`]), and
//! checks an image's CUDA version against the driver `docker-args` saw, which it named in the
//! container's labels ([`DRIVER_LABEL`], [`DRIVER_CUDA_LABEL`]); an image that needs a CUDA
//! version when the arguments name no driver is refused (its reservation given back: the
//! container never ran).

use std::ffi::OsString;
use std::os::unix::process::{CommandExt as _, ExitStatusExt as _};
use std::path::PathBuf;
use std::process::{Command, ExitCode};

use anyhow::Context as _;
use mesos_gpu_docker::args::{CudaVersion, check_cuda};
use mesos_gpu_docker::client::{DockerClient, mesos_container_id};
use mesos_gpu_isolator::lifecycle::{ContainerId, DockerStart, LifecycleError};
use mesos_gpu_node::inventory::DriverInfo;
use mesos_gpu_pool::Host;

use crate::ctx::Ctx;

/// The task environment variable that carries the reserved GPUs' `docker run` arguments.
pub(crate) const ARGS_VARIABLE: &str = "MESOS_GPU_DOCKER_ARGS";

/// The container label `docker-args` gives the NVIDIA driver's version (`550.54.14`).
pub(crate) const DRIVER_LABEL: &str = "mesos-gpu.driver";
/// The container label `docker-args` gives the newest CUDA the driver supports (`12.4`).
pub(crate) const DRIVER_CUDA_LABEL: &str = "mesos-gpu.driver-cuda";

/// Global `docker` options that take a value in the next argument.
const GLOBAL_VALUE_OPTIONS: [&str; 7] = [
    "-H",
    "--host",
    "--config",
    "-c",
    "--context",
    "-l",
    "--log-level",
];

/// `docker run` options that take a value in the next argument (those Mesos writes, and the
/// common others).
const RUN_VALUE_OPTIONS: [&str; 32] = [
    "-e",
    "--env",
    "--env-file",
    "-v",
    "--volume",
    "--volume-driver",
    "--name",
    "--cpu-shares",
    "-c",
    "--cpu-quota",
    "--cpus",
    "--memory-reservation",
    "--memory",
    "-m",
    "--oom-score-adj",
    "--net",
    "--network",
    "--dns",
    "--dns-search",
    "--dns-opt",
    "--hostname",
    "-h",
    "-p",
    "--publish",
    "--entrypoint",
    "--add-host",
    "--device",
    "--label",
    "-l",
    "--user",
    "-u",
    "--workdir",
];

#[derive(clap::Args)]
#[command(
    long_about = "The `docker` program of a mesos-agent (its --docker flag names a script that \
                  runs this) whose Docker containerizer tasks get GPUs from the node's pool. \
                  Every docker command passes through to --docker unchanged, except `docker run` \
                  with MESOS_GPU_DOCKER_ARGS in its environment (set by the agent's hook module \
                  org_apache_mesos_gpu_MesosGpuDockerHook, which reserved the GPUs with \
                  `mesos-gpu docker-args`): the variable becomes the GPUs' docker run arguments, \
                  and the GPUs go back to the pool when docker run ends.",
    after_help = "Example: /usr/bin/mesos-gpu-docker (shipped by the package), for\n\
    `mesos-agent --docker=/usr/bin/mesos-gpu-docker`:\n  \
    #!/bin/sh\n  \
    exec /usr/bin/mesos-gpu docker-wrapper --docker /usr/bin/docker \\\n    \
    --pool-dir /var/lib/mesos-gpu --docker-state-dir /var/run/mesos-gpu -- \"$@\"\n\n\
    --pool-dir and --docker-state-dir are those of the hook's `docker-args` command line. It loads \
    no NVML (--nvml-lib and --dev-root are not needed): the GPUs are those docker-args reserved."
)]
pub(crate) struct Args {
    /// The real docker program.
    #[arg(long, value_name = "PATH", default_value = "/usr/bin/docker")]
    docker: PathBuf,

    /// The reservations `docker-args` made (its --docker-state-dir and --pool-dir).
    #[command(flatten)]
    reservations: super::DockerPoolArgs,

    /// The docker command line, as the agent gives it.
    #[arg(last = true, value_name = "DOCKER ARGS", allow_hyphen_values = true)]
    args: Vec<OsString>,
}

/// A `docker run` that carries reserved GPUs.
#[derive(Debug, PartialEq, Eq)]
struct GpuRun {
    /// The container's Mesos id (its name is `mesos-<id>`).
    id: String,
    /// The daemon socket (`-H unix://PATH`), when given.
    socket: Option<PathBuf>,
    /// The image to run.
    image: Option<String>,
    /// The GPUs' arguments (from the variable, without `--name`).
    gpu_args: Vec<String>,
    /// The docker command line without the variable.
    args: Vec<String>,
    /// Where the GPUs' arguments go in `args` (right after `run`).
    at: usize,
}

impl GpuRun {
    /// The command line to run: the GPUs' arguments after `run`, all of them when the image
    /// asks for the driver (`wants_driver`), else only the devices.
    fn command_line(&self, wants_driver: bool) -> Vec<String> {
        let mut out = self.args[..self.at].to_vec();
        out.extend(
            self.gpu_args
                .iter()
                .filter(|a| wants_driver || a.starts_with("--device="))
                .cloned(),
        );
        out.extend_from_slice(&self.args[self.at..]);
        out
    }
}

/// Finds the `docker run` of a container with reserved GPUs in `args`; `None` for every other
/// command (passed through as it is).
fn gpu_run(args: &[String]) -> anyhow::Result<Option<GpuRun>> {
    let mut i = 0;
    let mut socket = None;
    while i < args.len() && args[i].starts_with('-') {
        let host = match args[i].as_str() {
            "-H" | "--host" => args.get(i + 1).map(String::as_str),
            other => other.strip_prefix("--host="),
        };
        if let Some(path) = host.and_then(|h| h.strip_prefix("unix://")) {
            socket = Some(PathBuf::from(path));
        }
        i += if GLOBAL_VALUE_OPTIONS.contains(&args[i].as_str()) {
            2
        } else {
            1
        };
    }
    if args.get(i).map(String::as_str) != Some("run") {
        return Ok(None);
    }
    let run_at = i;
    i += 1;
    let mut name = None;
    let mut variable = None;
    while i < args.len() && args[i].starts_with('-') && args[i] != "--" {
        let arg = args[i].as_str();
        let (option, value, width) = match arg.split_once('=') {
            Some((option, value)) if option.starts_with("--") => (option, Some(value), 1),
            _ if RUN_VALUE_OPTIONS.contains(&arg) => (arg, args.get(i + 1).map(String::as_str), 2),
            _ => (arg, None, 1),
        };
        match (option, value) {
            ("--name", Some(value)) => name = Some(value.to_owned()),
            ("-e" | "--env", Some(value)) => {
                if let Some(json) = value.strip_prefix(&format!("{ARGS_VARIABLE}=")) {
                    variable = Some((i, width, json.to_owned()));
                }
            }
            _ => {}
        }
        i += width;
    }
    let Some((at, width, json)) = variable else {
        return Ok(None);
    };
    let name = name.with_context(|| {
        format!("docker run with {ARGS_VARIABLE} but no --name: expected --name mesos-<id>")
    })?;
    let id = mesos_container_id(&name)
        .with_context(|| format!("docker run --name {name:?}: expected mesos-<container id>"))?
        .to_owned();
    let gpu_args: Vec<String> = serde_json::from_str(&json)
        .with_context(|| format!("{ARGS_VARIABLE}={json:?}: expected a JSON array of strings"))?;
    let mut injected = Vec::with_capacity(gpu_args.len());
    for arg in gpu_args {
        match arg.strip_prefix("--name=") {
            Some(reserved) if reserved != name => anyhow::bail!(
                "{ARGS_VARIABLE} holds GPUs reserved for {reserved}, not for the container {name}"
            ),
            Some(_) => {}
            None => injected.push(arg),
        }
    }
    let image = args
        .get(i)
        .filter(|a| a.as_str() != "--")
        .or_else(|| args.get(i + 1))
        .cloned();
    let mut out = Vec::with_capacity(args.len());
    out.extend_from_slice(&args[..at]);
    out.extend_from_slice(&args[at + width..]);
    Ok(Some(GpuRun {
        id,
        socket,
        image,
        gpu_args: injected,
        args: out,
        at: run_at + 1,
    }))
}

pub(crate) fn run(args: &Args, ctx: &Ctx) -> anyhow::Result<ExitCode> {
    let text: Option<Vec<String>> = args
        .args
        .iter()
        .map(|a| a.to_str().map(str::to_owned))
        .collect();
    let found = match &text {
        Some(text) => gpu_run(text)?,
        None => None,
    };
    let Some(found) = found else {
        let err = Command::new(&args.docker).args(&args.args).exec();
        return Err(err).with_context(|| format!("cannot run {}", args.docker.display()));
    };
    let id = ContainerId::new(&found.id)?;
    let socket = found
        .socket
        .clone()
        .unwrap_or_else(|| PathBuf::from(super::docker_pool::DEFAULT_DOCKER_SOCKET));
    let checked = match &found.image {
        Some(image) => image_wants_driver(&socket, image, &found.gpu_args),
        None => Ok(true),
    };
    let wants_driver = match checked {
        Ok(wants) => wants,
        Err(e) => {
            // The container never runs: its GPUs go back now.
            give_back(ctx, args, &id);
            return Err(e);
        }
    };
    claim(ctx, args, &id, &socket)?;
    let line = found.command_line(wants_driver);
    tracing::info!(container = %id, args = ?line, "docker run with reserved GPUs");
    let status = Command::new(&args.docker)
        .args(&line)
        .status()
        .with_context(|| format!("cannot run {}", args.docker.display()));
    let status = status?;
    match container_state(&args.docker, &found) {
        ContainerState::Gone => give_back(ctx, args, &id),
        ContainerState::Running(why) => {
            // `docker run` lost its container (the daemon restarted with live-restore): its
            // GPUs stay reserved for mesos-<id> until it is gone (`gpu release`, `serve`).
            eprintln!(
                "mesos-gpu: docker run ended but container mesos-{id} {why}: its GPUs stay reserved"
            );
        }
    }
    let code = status
        .code()
        .or_else(|| status.signal().map(|s| 128 + s))
        .unwrap_or(1);
    Ok(ExitCode::from(u8::try_from(code).unwrap_or(1)))
}

/// Gives container `id`'s GPUs back to the pool, saying so on stderr when that fails.
fn give_back(ctx: &Ctx, args: &Args, id: &ContainerId) {
    let released = super::docker_pool::open_records(ctx, &args.reservations, "docker-wrapper")
        .and_then(|pool| Ok(pool.release_docker(id)?))
        .with_context(|| format!("cannot give back the GPUs of {id}"));
    if let Err(e) = released {
        eprintln!("mesos-gpu: error: {e:#}");
    }
}

/// Records this process as the starter of container `id` on the daemon at `socket`, so that
/// its reservation stays while `docker run` runs whoever reserved it; refused when the
/// reservation is gone (its reserver died before the container existed and the pool freed it).
fn claim(ctx: &Ctx, args: &Args, id: &ContainerId, socket: &std::path::Path) -> anyhow::Result<()> {
    let me = Host::default()
        .this_process()
        .context("cannot read this process's stamp")?;
    let start = DockerStart {
        daemon: Some(mesos_gpu_docker::client::endpoint(socket)),
        starter: Some(me),
    };
    let pool = super::docker_pool::open_records(ctx, &args.reservations, "docker-wrapper")?;
    match pool.claim_docker(id, start) {
        Ok(_) => Ok(()),
        Err(LifecycleError::UnknownContainer { .. }) => anyhow::bail!(
            "the GPUs reserved for container mesos-{id} are no longer reserved (the process that reserved them ended before the container started, and the pool gave them back); not starting it"
        ),
        Err(e) => Err(e).with_context(|| format!("cannot record the start of mesos-{id}")),
    }
}

/// Whether a container may still use its GPUs.
enum ContainerState {
    /// It has exited or does not exist.
    Gone,
    /// It runs, or the daemon cannot tell (why).
    Running(String),
}

/// The state of the container of `run`, asked of the daemon with the same global options.
fn container_state(docker: &std::path::Path, run: &GpuRun) -> ContainerState {
    let name = format!("mesos-{}", run.id);
    let out = Command::new(docker)
        .args(&run.args[..run.at - 1])
        .args([
            "inspect",
            "--type",
            "container",
            "--format",
            "{{.State.Running}}",
            &name,
        ])
        .output();
    match out {
        Ok(out) if out.status.success() => match String::from_utf8_lossy(&out.stdout).trim() {
            "false" => ContainerState::Gone,
            _ => ContainerState::Running("is still running".to_owned()),
        },
        Ok(out) => {
            let err = String::from_utf8_lossy(&out.stderr);
            if err.contains("No such") {
                ContainerState::Gone
            } else {
                ContainerState::Running(format!("cannot be inspected ({})", err.trim()))
            }
        }
        Err(e) => ContainerState::Running(format!("cannot be inspected ({e})")),
    }
}

/// Whether `image` (pulled by now) asks for the driver volume: its labels and environment, read
/// from the daemon at `socket`. The hook reserves before the agent pulls the image, so this is
/// decided here; an image that asks for the driver and needs a newer CUDA than the driver's
/// (named in `gpu_args` by `docker-args`) is refused, as `docker-args --image` refuses it, and so
/// is one that needs a CUDA version when `gpu_args` name no driver.
fn image_wants_driver(
    socket: &std::path::Path,
    image: &str,
    gpu_args: &[String],
) -> anyhow::Result<bool> {
    let runtime = tokio::runtime::Runtime::new().context("cannot start the async runtime")?;
    let info = runtime.block_on(async {
        let client = DockerClient::connect(socket).await?;
        client.image_info(image).await
    })?;
    let wants = info.wants_driver();
    if !wants {
        return Ok(false);
    }
    match driver_of(gpu_args) {
        Some(driver) => check_cuda(&info, &driver).with_context(|| format!("image {image}"))?,
        None => {
            if let Some((needed, _)) = info.cuda_requirement()? {
                anyhow::bail!(
                    "image {image} needs CUDA {needed}, and {ARGS_VARIABLE} names no NVIDIA driver to check it against (label {DRIVER_CUDA_LABEL}; made by an older `mesos-gpu docker-args`?): not starting it"
                );
            }
        }
    }
    Ok(true)
}

/// The driver `docker-args` saw, from the labels it gave the container (`--label=KEY=VALUE` in
/// `gpu_args`); `None` when they name none.
fn driver_of(gpu_args: &[String]) -> Option<DriverInfo> {
    let label = |key: &str| {
        gpu_args.iter().find_map(|a| {
            a.strip_prefix("--label=")?
                .strip_prefix(key)?
                .strip_prefix('=')
        })
    };
    let version = label(DRIVER_LABEL)?;
    let cuda_version = label(DRIVER_CUDA_LABEL).and_then(|v| CudaVersion::parse(v).ok());
    Some(DriverInfo {
        version: version.to_owned(),
        cuda_version: cuda_version.map(|v| (v.major, v.minor)),
    })
}

/// The labels naming `driver` for the wrapper's CUDA check ([`DRIVER_LABEL`],
/// [`DRIVER_CUDA_LABEL`]), as `docker run` arguments.
pub(crate) fn driver_labels(driver: &DriverInfo) -> Vec<String> {
    let mut labels = vec![format!("--label={DRIVER_LABEL}={}", driver.version)];
    if let Some((major, minor)) = driver.cuda_version {
        labels.push(format!("--label={DRIVER_CUDA_LABEL}={major}.{minor}"));
    }
    labels
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(args: &[&str]) -> Vec<String> {
        args.iter().map(|s| (*s).to_owned()).collect()
    }

    const ID: &str = "3d8a52b4-1c5e-4f5a-9c1e-2b7d9a0e6f11";

    #[test]
    fn mesos_run_gets_the_gpu_arguments_after_run() {
        let value = format!(
            "{ARGS_VARIABLE}=[\"--name=mesos-{ID}\",\"--device=/dev/nvidia0\",\"--env=NVIDIA_VISIBLE_DEVICES=GPU-1\"]"
        );
        let name = format!("mesos-{ID}");
        let args = strings(&[
            "-H",
            "unix:///var/run/docker.sock",
            "run",
            "--cpu-shares",
            "102",
            "-e",
            &value,
            "-e",
            "MESOS_SANDBOX=/mnt/mesos/sandbox",
            "--name",
            &name,
            "img",
            "-e",
            "x",
        ]);
        let found = gpu_run(&args)
            .expect("a well-formed run")
            .expect("a run with GPUs");
        assert_eq!(found.id, ID);
        assert_eq!(found.image.as_deref(), Some("img"));
        assert_eq!(found.socket, Some(PathBuf::from("/var/run/docker.sock")));
        let head = ["-H", "unix:///var/run/docker.sock", "run"];
        let tail = [
            "--cpu-shares",
            "102",
            "-e",
            "MESOS_SANDBOX=/mnt/mesos/sandbox",
            "--name",
            &name,
            "img",
            "-e",
            "x",
        ];
        let gpus = [
            "--device=/dev/nvidia0",
            "--env=NVIDIA_VISIBLE_DEVICES=GPU-1",
        ];
        assert_eq!(
            found.command_line(true),
            strings(&[&head[..], &gpus[..], &tail[..]].concat())
        );
        assert_eq!(
            found.command_line(false),
            strings(&[&head[..], &gpus[..1], &tail[..]].concat())
        );
    }

    #[test]
    fn other_commands_and_runs_without_gpus_pass_through() {
        for args in [
            strings(&["-H", "unix:///s", "inspect", "mesos-x"]),
            strings(&["--version"]),
            strings(&[
                "run",
                "--name",
                "mesos-x",
                "img",
                "-e",
                "MESOS_GPU_DOCKER_ARGS=[]",
            ]),
        ] {
            assert_eq!(gpu_run(&args).expect("well-formed"), None, "{args:?}");
        }
    }

    #[test]
    fn the_driver_docker_args_saw_comes_back_from_its_labels() {
        let driver = DriverInfo {
            version: "550.54.14".into(),
            cuda_version: Some((12, 4)),
        };
        let mut args = strings(&["--device=/dev/nvidia0", "--env=A=B"]);
        args.extend(driver_labels(&driver));
        assert_eq!(
            args[2..],
            strings(&[
                "--label=mesos-gpu.driver=550.54.14",
                "--label=mesos-gpu.driver-cuda=12.4"
            ])
        );
        assert_eq!(driver_of(&args), Some(driver));
        assert_eq!(
            driver_of(&args[..2]),
            None,
            "older docker-args name no driver"
        );
        let unknown = DriverInfo {
            version: "550.54.14".into(),
            cuda_version: None,
        };
        assert_eq!(driver_of(&driver_labels(&unknown)), Some(unknown));
    }

    #[test]
    fn arguments_reserved_for_another_container_are_refused() {
        let value = format!("{ARGS_VARIABLE}=[\"--name=mesos-{ID}\"]");
        let args = strings(&[
            "run",
            "-e",
            &value,
            "--name",
            "mesos-0d8a52b4-1c5e-4f5a-9c1e-2b7d9a0e6f11",
            "img",
        ]);
        let err = gpu_run(&args).expect_err("refused").to_string();
        assert!(err.contains("not for the container"), "{err}");
    }
}
