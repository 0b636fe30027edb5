//! `mesos-gpu docker-wrapper`: the `docker` program of a mesos-agent (`--docker`) whose Docker
//! containerizer tasks get GPUs from the node's pool.
//!
//! The agent and `mesos-docker-executor` run `<docker> -H <socket> <command> …`. Every command
//! is passed to the real `docker` unchanged, except a `docker run` whose environment holds
//! `MESOS_GPU_DOCKER_ARGS` (the launch `mesos-gpu docker-args --json` printed, a
//! [`DockerLaunch`], put there by the agent's hook module
//! `org_apache_mesos_gpu_MesosGpuDockerHook` after `docker-args` reserved the task's GPUs for the
//! container `mesos-<id>`): the variable is removed, the launch is rendered for the image, now
//! pulled ([`DockerLaunch::render`]: devices, variables, cpuset, and the driver volume for an
//! image that asks for it), the arguments are added after `run`, and when `docker run` ends
//! (the task finished, was killed, or its container died) the container's GPUs go back to the
//! pool, once the daemon says the container is not running (a `docker run` that lost a live
//! container, or a daemon that cannot answer, leaves them reserved for `mesos-<id>`).
//!
//! It loads no NVML: what it does needs no GPU seen. It claims and releases the reservation by
//! container id, keeping every record as written ([`super::docker_pool::open_records`]); the
//! launch names the driver `docker-args` saw, for the image's CUDA check. An image the launch
//! refuses (a CUDA version newer than the driver's) is not started and its reservation is given
//! back: the container never ran.
//!
//! The variable may also hold the format of mesos-gpu 0.1 (see [`legacy`]): a hook older than
//! this wrapper on a node being upgraded.

use std::ffi::OsString;
use std::os::unix::process::{CommandExt as _, ExitStatusExt as _};
use std::path::PathBuf;
use std::process::{Command, ExitCode};

use anyhow::Context as _;
use mesos_gpu_docker::args::DockerLaunch;
use mesos_gpu_docker::client::{DockerClient, docker_name, mesos_container_id};
use mesos_gpu_isolator::lifecycle::{ContainerId, DockerStart, LifecycleError};
use mesos_gpu_pool::Host;

use crate::ctx::Ctx;

mod legacy;

/// The task environment variable that carries the reserved GPUs' launch.
pub(crate) const ARGS_VARIABLE: &str = "MESOS_GPU_DOCKER_ARGS";

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
                  `mesos-gpu docker-args`): the variable holds the launch `docker-args --json` \
                  printed, rendered here for the image (now pulled) into the GPUs' docker run \
                  arguments (devices, variables, cpuset, and the driver volume for an image that \
                  asks for it; an image needing a newer CUDA than the driver is refused and its \
                  GPUs given back), and the GPUs go back to the pool when docker run ends. The \
                  JSON array of arguments of mesos-gpu 0.1's docker-args is still read.",
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
    /// The GPUs' launch (from the variable).
    launch: DockerLaunch,
    /// The docker command line without the variable.
    args: Vec<String>,
    /// Where the GPUs' arguments go in `args` (right after `run`).
    at: usize,
}

impl GpuRun {
    /// The command line to run: `gpu_args` (the launch rendered for the image) after `run`.
    fn command_line(&self, gpu_args: &[String]) -> Vec<String> {
        let mut out = self.args[..self.at].to_vec();
        out.extend_from_slice(gpu_args);
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
    let launch = if json.trim_start().starts_with('[') {
        legacy::launch(&json)?
    } else {
        DockerLaunch::parse(&json).with_context(|| format!("{ARGS_VARIABLE}={json:?}"))?
    };
    match &launch.name {
        Some(reserved) if *reserved == name => {}
        Some(reserved) => anyhow::bail!(
            "{ARGS_VARIABLE} holds GPUs reserved for {reserved}, not for the container {name}"
        ),
        None => anyhow::bail!(
            "{ARGS_VARIABLE} names no container (expected \"name\":\"{name}\", as `mesos-gpu docker-args --container-id` writes it)"
        ),
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
        launch,
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
    let gpu_args = match render(&socket, &found) {
        Ok(gpu_args) => gpu_args,
        Err(e) => {
            // The container never runs: its GPUs go back now.
            give_back(ctx, args, &id);
            return Err(e);
        }
    };
    claim(ctx, args, &id, &socket)?;
    let line = found.command_line(&gpu_args);
    tracing::info!(container = %id, args = ?line, "docker run with reserved GPUs");
    let status = Command::new(&args.docker)
        .args(&line)
        .status()
        .with_context(|| format!("cannot run {}", args.docker.display()));
    let status = status?;
    match container_state(&args.docker, &found, &id) {
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
        .and_then(|records| Ok(records.release_docker(id)?))
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
    let records = super::docker_pool::open_records(ctx, &args.reservations, "docker-wrapper")?;
    match records.claim_docker(id, start) {
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
fn container_state(docker: &std::path::Path, run: &GpuRun, id: &ContainerId) -> ContainerState {
    let name = docker_name(id);
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

/// The `docker run` arguments of `run`'s launch rendered for its image (pulled by now: the hook
/// reserves before the agent pulls it), read from the daemon at `socket`; refused when the image
/// cannot run with it (a CUDA version newer than the driver's, or the driver asked for on a node
/// without one), as `docker-args --image` refuses it.
fn render(socket: &std::path::Path, run: &GpuRun) -> anyhow::Result<Vec<String>> {
    let info = match &run.image {
        Some(image) => {
            let runtime =
                tokio::runtime::Runtime::new().context("cannot start the async runtime")?;
            let info = runtime.block_on(async {
                let client = DockerClient::connect(socket).await?;
                client.image_info(image).await
            })?;
            Some(info)
        }
        None => None,
    };
    let plan = run.launch.render(info.as_ref()).with_context(|| {
        format!(
            "image {}: not starting container mesos-{}",
            run.image.as_deref().unwrap_or("(none named)"),
            run.id
        )
    })?;
    Ok(plan.cli_args())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(args: &[&str]) -> Vec<String> {
        args.iter().map(|s| (*s).to_owned()).collect()
    }

    const ID: &str = "3d8a52b4-1c5e-4f5a-9c1e-2b7d9a0e6f11";

    /// A launch of one GPU for container `mesos-<ID>`, as `docker-args --json` writes it.
    fn launch_json() -> String {
        serde_json::json!({
            "version": 1,
            "name": format!("mesos-{ID}"),
            "devices": [{"host": "/dev/nvidia0", "container": "/dev/nvidia0"}],
            "env": [["NVIDIA_VISIBLE_DEVICES", "GPU-1"]],
            "binds": [],
            "cpuset": {"cpus": "0-1", "mems": "0"},
            "driver": null
        })
        .to_string()
    }

    #[test]
    fn mesos_run_gets_the_rendered_launch_after_run() {
        let value = format!("{ARGS_VARIABLE}={}", launch_json());
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
        // A plain image: no driver needed, and everything the grant holds is given.
        let gpus = found
            .launch
            .render(Some(&mesos_gpu_docker::args::ImageInfo::default()))
            .expect("rendered")
            .cli_args();
        assert_eq!(
            gpus,
            strings(&[
                "--device=/dev/nvidia0",
                "--env=NVIDIA_VISIBLE_DEVICES=GPU-1",
                "--cpuset-cpus=0-1",
                "--cpuset-mems=0"
            ])
        );
        let gpus: Vec<&str> = gpus.iter().map(String::as_str).collect();
        assert_eq!(
            found.command_line(&strings(&gpus)),
            strings(&[&head[..], &gpus[..], &tail[..]].concat())
        );
    }

    #[test]
    fn the_old_array_format_is_still_read() {
        let value = format!(
            "{ARGS_VARIABLE}=[\"--name=mesos-{ID}\",\"--device=/dev/nvidia0\",\"--env=NVIDIA_VISIBLE_DEVICES=GPU-1\",\"--label=mesos-gpu.driver=550.54.14\"]"
        );
        let name = format!("mesos-{ID}");
        let args = strings(&["run", "-e", &value, "--name", &name, "img"]);
        let found = gpu_run(&args).expect("well-formed").expect("GPUs");
        assert_eq!(found.launch.name.as_deref(), Some(name.as_str()));
        assert_eq!(found.launch.devices.len(), 1);
    }

    #[test]
    fn a_launch_of_another_version_is_refused_naming_it() {
        let value = format!(
            "{ARGS_VARIABLE}={}",
            launch_json().replace("\"version\":1", "\"version\":2")
        );
        let name = format!("mesos-{ID}");
        let args = strings(&["run", "-e", &value, "--name", &name, "img"]);
        let err = format!("{:#}", gpu_run(&args).expect_err("refused"));
        assert!(err.contains("version 2"), "{err}");
    }

    #[test]
    fn arguments_reserved_for_another_container_are_refused() {
        let value = format!("{ARGS_VARIABLE}={}", launch_json());
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
