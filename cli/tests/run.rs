//! `mesos-gpu run` as a process against the real Docker daemon, on a simulated 8-GPU node
//! (`--simulate dgx1-v100`) whose device nodes are mknod'ed in a temp `--dev-root`: the container
//! sees exactly its GPUs' nodes, exit statuses pass through, a second `run` sharing the pool
//! gets only what is left, SIGINT stops the container, images needing a newer CUDA are refused,
//! and every path gives the GPUs back and removes the container.
//!
//! Needs root (mknod) and dockerd. The image is built `FROM scratch` with Debian's static
//! busybox; containers and images are removed on drop.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::process::{Child, Command, ExitCode, Output, Stdio};
use std::time::{Duration, Instant};

use libtest_mimic::{Arguments, Failed, Trial};
use mesos_gpu_testkit::{Host, Need, needs, unique_name};

type TestResult<T = ()> = Result<T, Failed>;

/// The simulated node's GPU minors (dgx1-v100: minor = index).
const MINORS: std::ops::Range<u32> = 0..8;

/// Device root, work dir and images of one trial; removed on drop.
struct Env {
    dev: tempfile::TempDir,
    work: tempfile::TempDir,
    images: Vec<String>,
}

impl Env {
    fn new() -> Result<Env, Failed> {
        let dev = tempfile::Builder::new()
            .prefix("mgpu-run-dev")
            .tempdir()
            .map_err(|e| e.to_string())?;
        let mut nodes: Vec<(String, u32, u32)> =
            MINORS.map(|m| (format!("nvidia{m}"), 195, m)).collect();
        nodes.push(("nvidiactl".into(), 195, 255));
        nodes.push(("nvidia-uvm".into(), 240, 0));
        for (name, major, minor) in nodes {
            check(Command::new("mknod").arg(dev.path().join(name)).args([
                "c",
                &major.to_string(),
                &minor.to_string(),
            ]))?;
        }
        let work = tempfile::Builder::new()
            .prefix("mgpu-run-work")
            .tempdir()
            .map_err(|e| e.to_string())?;
        Ok(Env {
            dev,
            work,
            images: Vec::new(),
        })
    }

    /// Builds a busybox image with extra Dockerfile lines.
    fn image(&mut self, extra: &[&str]) -> Result<String, Failed> {
        let ctx = self.work.path().join(unique_name("image"));
        std::fs::create_dir(&ctx).map_err(|e| e.to_string())?;
        std::fs::copy("/bin/busybox", ctx.join("busybox"))
            .map_err(|e| format!("/bin/busybox: {e}"))?;
        let name = format!("{}:1", unique_name("run"));
        // A label of its own, so that no other trial's image has the same id (`ancestor=`
        // filters by id).
        let mut dockerfile = format!(
            "FROM scratch\nCOPY busybox /bin/busybox\nRUN [\"/bin/busybox\", \"--install\", \"-s\", \"/bin\"]\nLABEL mgpu.test={name}\n"
        );
        for line in extra {
            dockerfile.push_str(line);
            dockerfile.push('\n');
        }
        std::fs::write(ctx.join("Dockerfile"), dockerfile).map_err(|e| e.to_string())?;
        self.images.push(name.clone());
        check(
            Command::new("docker")
                .args(["build", "--no-cache", "-q", "-t", &name])
                .arg(&ctx),
        )?;
        Ok(name)
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_mesos-gpu"));
        cmd.arg("--simulate")
            .arg("dgx1-v100")
            .arg("--dev-root")
            .arg(self.dev.path())
            .arg("run")
            .arg("--docker-state-dir")
            .arg(self.work.path())
            .arg("--pool-dir")
            .arg(self.work.path().join("pool"))
            .args(args)
            .env("MESOS_GPU_LOG", "warn");
        cmd
    }

    fn run(&self, args: &[&str]) -> Result<Output, Failed> {
        self.command(args)
            .output()
            .map_err(|e| e.to_string().into())
    }

    /// The Docker containers holding GPUs in the pool's checkpoint.
    fn reserved(&self) -> Result<serde_json::Map<String, serde_json::Value>, Failed> {
        let path = self.work.path().join("gpu/allocations.json");
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Default::default()),
            Err(e) => return Err(format!("{}: {e}", path.display()).into()),
        };
        let json: serde_json::Value = serde_json::from_str(&text).map_err(|e| e.to_string())?;
        Ok(json["docker"].as_object().cloned().unwrap_or_default())
    }

    /// Fails unless nothing is reserved and no container of `image` is left.
    fn all_clean(&self, image: &str) -> TestResult {
        let reserved = self.reserved()?;
        if !reserved.is_empty() {
            return Err(format!("GPUs still reserved: {reserved:?}").into());
        }
        let left = check(Command::new("docker").args([
            "ps",
            "-aq",
            "--filter",
            &format!("ancestor={image}"),
        ]))?;
        if !left.is_empty() {
            return Err(format!("containers left: {left}").into());
        }
        Ok(())
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        for image in &self.images {
            if let Ok(out) = Command::new("docker")
                .args(["ps", "-aq", "--filter", &format!("ancestor={image}")])
                .output()
            {
                for id in String::from_utf8_lossy(&out.stdout).split_whitespace() {
                    let _ = Command::new("docker").args(["rm", "-f", id]).output();
                }
            }
            let _ = Command::new("docker")
                .args(["rmi", "-f", "--no-prune", image])
                .output();
        }
    }
}

fn check(cmd: &mut Command) -> Result<String, Failed> {
    Ok(mesos_gpu_testkit::run_checked(cmd)?)
}

/// `nvidia<minor>` GPU nodes named in `ls /dev` output.
fn gpu_nodes(out: &str) -> BTreeSet<u32> {
    out.split_whitespace()
        .filter_map(|w| w.strip_prefix("nvidia")?.parse().ok())
        .collect()
}

fn text(out: &Output) -> String {
    format!(
        "{}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn container_sees_its_nodes_and_status_passes_through() -> TestResult {
    let mut env = Env::new()?;
    let image = env.image(&[])?;
    let out = env.run(&["--gpus", "3", &image, "sh", "-c", "ls /dev; exit 7"])?;
    if out.status.code() != Some(7) {
        return Err(format!("expected exit 7: {}", text(&out)).into());
    }
    let listing = String::from_utf8_lossy(&out.stdout);
    let seen = gpu_nodes(&listing);
    if seen.len() != 3 || !listing.contains("nvidiactl") || !listing.contains("nvidia-uvm") {
        return Err(format!("container saw GPU nodes {seen:?}: {}", text(&out)).into());
    }
    env.all_clean(&image)?;
    let ok = env.run(&["--gpus", "0", &image, "true"])?;
    if ok.status.code() != Some(0) {
        return Err(format!("expected exit 0: {}", text(&ok)).into());
    }
    env.all_clean(&image)
}

/// A new user's first `run` on a simulated node (no `--dev-root`, the node's state in its
/// scratch directory under `TMPDIR`): the container starts with the node's GPU and control nodes,
/// made in that state as `exec` makes them (Docker refused `/dev/nvidiactl`, which a host without
/// a GPU does not have: "error gathering device information").
fn a_simulated_node_without_dev_root_runs_on_its_own_nodes() -> TestResult {
    let mut env = Env::new()?;
    let image = env.image(&[])?;
    let out = Command::new(env!("CARGO_BIN_EXE_mesos-gpu"))
        .args(["--simulate", "dgx1-v100", "run", "--gpus", "1", &image])
        .args(["sh", "-c", "ls /dev"])
        .env("TMPDIR", env.work.path())
        .env("MESOS_GPU_LOG", "warn")
        .output()?;
    let listing = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() || gpu_nodes(&listing).len() != 1 || !listing.contains("nvidiactl") {
        return Err(format!("expected one GPU node and nvidiactl: {}", text(&out)).into());
    }
    let made = env
        .work
        .path()
        .join("mesos-gpu-sim/dgx1-v100/dev/nvidiactl");
    if !made.exists() {
        return Err(format!("no {} in the node's scratch state", made.display()).into());
    }
    Ok(())
}

fn concurrent_runs_share_one_pool() -> TestResult {
    let mut env = Env::new()?;
    let image = env.image(&[])?;
    let mut first = env
        .command(&["--gpus", "6", &image, "sh", "-c", "sleep 3; ls /dev"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| e.to_string())?;
    wait_for_reservation(&env, &mut first)?;
    let refused = env.run(&["--gpus", "3", &image, "true"])?;
    let stderr = String::from_utf8_lossy(&refused.stderr);
    if refused.status.code() != Some(1)
        || !stderr.contains("3 asked; 2 free, 0 unhealthy, 0 quarantined, 6 held")
    {
        return Err(format!(
            "a run beyond the free GPUs was not refused clearly: {}",
            text(&refused)
        )
        .into());
    }
    let second = env.run(&["--gpus", "2", &image, "ls", "/dev"])?;
    let first = first.wait_with_output().map_err(|e| e.to_string())?;
    if !first.status.success() || !second.status.success() {
        return Err(format!("first: {}\nsecond: {}", text(&first), text(&second)).into());
    }
    let (a, b) = (
        gpu_nodes(&String::from_utf8_lossy(&first.stdout)),
        gpu_nodes(&String::from_utf8_lossy(&second.stdout)),
    );
    if a.len() != 6 || b.len() != 2 || !a.is_disjoint(&b) {
        return Err(format!("first saw {a:?}, second saw {b:?}").into());
    }
    env.all_clean(&image)
}

/// Waits until `child` has reserved its GPUs (or fails if it ended first).
fn wait_for_reservation(env: &Env, child: &mut Child) -> TestResult {
    let deadline = Instant::now() + Duration::from_secs(30);
    while env.reserved()?.is_empty() {
        if let Some(status) = child.try_wait().map_err(|e| e.to_string())? {
            return Err(format!("run ended before reserving: {status}").into());
        }
        if Instant::now() > deadline {
            return Err("run did not reserve GPUs within 30 s".into());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    // Reserved and created; give `docker start` a moment.
    std::thread::sleep(Duration::from_millis(500));
    Ok(())
}

fn sigint_stops_the_container_and_releases() -> TestResult {
    let mut env = Env::new()?;
    let image = env.image(&[])?;
    let mut child = env
        .command(&["--gpus", "2", "--stop-timeout", "1", &image, "sleep", "60"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| e.to_string())?;
    wait_for_reservation(&env, &mut child)?;
    // While `run` runs its container, the pool knows its owner is alive (issue 37: a `run`
    // reservation named no daemon and no starter, so it was "uncertain" for ever).
    let listed = check(
        Command::new(env!("CARGO_BIN_EXE_mesos-gpu"))
            .args(["gpu", "list", "--pool-dir"])
            .arg(env.work.path().join("pool")),
    )?;
    let row = listed
        .lines()
        .find(|l| l.contains(" docker "))
        .ok_or_else(|| format!("no Docker reservation listed: {listed}"))?;
    if !row.split_whitespace().any(|w| w == "alive") {
        return Err(format!("run's reservation is not alive: {listed}").into());
    }
    let started = Instant::now();
    check(Command::new("kill").args(["-INT", &child.id().to_string()]))?;
    let out = child.wait_with_output().map_err(|e| e.to_string())?;
    // busybox sleep as PID 1 ignores SIGTERM, so docker stop kills it after 1 s: 128 + 9.
    if out.status.code() != Some(137) || started.elapsed() > Duration::from_secs(30) {
        return Err(format!("after SIGINT ({:?}): {}", started.elapsed(), text(&out)).into());
    }
    env.all_clean(&image)
}

fn too_new_cuda_is_refused_with_nothing_reserved() -> TestResult {
    let mut env = Env::new()?;
    let image = env.image(&[
        "LABEL com.nvidia.volumes.needed=nvidia_driver",
        "LABEL com.nvidia.cuda.version=99.0",
    ])?;
    let out = env.run(&["--gpus", "1", "--plugin", &image, "true"])?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    if out.status.code() != Some(1)
        || !stderr.contains("image needs CUDA 99.0")
        || !stderr.contains("supports CUDA up to")
    {
        return Err(format!("not refused clearly: {}", text(&out)).into());
    }
    env.all_clean(&image)?;
    let missing = env.run(&["--gpus", "1", &unique_name("no-such-image"), "true"])?;
    if missing.status.code() != Some(1)
        || !String::from_utf8_lossy(&missing.stderr).contains("present locally")
    {
        return Err(format!("missing image: {}", text(&missing)).into());
    }
    Ok(())
}

fn main() -> ExitCode {
    let host = Host::probe();
    type Case = (&'static str, fn() -> TestResult);
    let trials: [Case; 5] = [
        (
            "container_sees_its_nodes_and_status_passes_through",
            container_sees_its_nodes_and_status_passes_through,
        ),
        (
            "concurrent_runs_share_one_pool",
            concurrent_runs_share_one_pool,
        ),
        (
            "sigint_stops_the_container_and_releases",
            sigint_stops_the_container_and_releases,
        ),
        (
            "too_new_cuda_is_refused_with_nothing_reserved",
            too_new_cuda_is_refused_with_nothing_reserved,
        ),
        (
            "a_simulated_node_without_dev_root_runs_on_its_own_nodes",
            a_simulated_node_without_dev_root_runs_on_its_own_nodes,
        ),
    ];
    let mut trials: Vec<Trial> = trials
        .into_iter()
        .map(|(name, f)| needs(&host, &[Need::Root, Need::Dockerd], Trial::test(name, f)))
        .collect();
    trials.push(needs(
        &host,
        &[Need::Root, Need::Dockerd],
        Trial::test("run_pins_the_container_to_its_gpus_cpu", numa_pinning),
    ));
    trials.push(needs(
        &host,
        &[Need::Root, Need::Dockerd],
        Trial::test("docker_args_shares_run_in_real_containers", docker_shares),
    ));
    trials.push(needs(
        &host,
        &[Need::Root, Need::Dockerd],
        Trial::test("docker_args_mig_device_in_a_real_container", docker_mig),
    ));
    trials.push(needs(
        &host,
        &[Need::Root, Need::Dockerd],
        Trial::test(
            "docker_args_mig_share_in_a_real_container",
            docker_mig_share,
        ),
    ));
    let wrapper: [Case; 3] = [
        (
            "issue_35_wrapper_keeps_the_pinning_and_variables_of_a_plain_image",
            issue_35_wrapper_keeps_the_pinning_and_variables_of_a_plain_image,
        ),
        (
            "issue_35_wrapper_reads_the_old_array_format",
            issue_35_wrapper_reads_the_old_array_format,
        ),
        (
            "issue_35_wrapper_refuses_too_new_cuda_and_gives_back",
            issue_35_wrapper_refuses_too_new_cuda_and_gives_back,
        ),
    ];
    trials.extend(
        wrapper
            .into_iter()
            .map(|(name, f)| needs(&host, &[Need::Root, Need::Dockerd], Trial::test(name, f))),
    );
    libtest_mimic::run(&Arguments::from_args(), trials).exit_code()
}

/// `mesos-gpu --simulate dgx1-v100 docker-args --json` (the agent's hook's command) with the
/// env's device root, Docker state and pool, and `extra`: the launch, as JSON text.
fn docker_args_launch(env: &Env, extra: &[&str]) -> TestResult<String> {
    let out = Command::new(env!("CARGO_BIN_EXE_mesos-gpu"))
        .args(["--simulate", "dgx1-v100", "--dev-root"])
        .arg(env.dev.path())
        .args(["docker-args", "--json"])
        .args(extra)
        .arg("--docker-state-dir")
        .arg(env.work.path())
        .arg("--pool-dir")
        .arg(env.work.path().join("pool"))
        .env("MESOS_GPU_LOG", "warn")
        .output()
        .map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(format!("docker-args: {}", text(&out)).into());
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// A `docker` program for `docker-wrapper` that writes the arguments of its `run`, one a line,
/// to `<work>/<tag>.argv` (returned) and answers `inspect` (does the container still run?)
/// with `false`.
fn recording_docker(env: &Env, tag: &str) -> TestResult<(std::path::PathBuf, std::path::PathBuf)> {
    use std::os::unix::fs::PermissionsExt as _;
    let script = env.work.path().join(format!("{tag}-docker"));
    let argv = env.work.path().join(format!("{tag}.argv"));
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh
case \" $* \" in *\" inspect \"*) echo false; exit 0;; esac
             for a in \"$@\"; do printf '%s\\n' \"$a\"; done > {}
exit 0
",
            argv.display()
        ),
    )
    .map_err(|e| e.to_string())?;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755))
        .map_err(|e| e.to_string())?;
    Ok((script, argv))
}

/// `mesos-gpu docker-wrapper --docker <docker>` as the agent runs it for a Docker task: `docker
/// -H <the host's daemon> run -e MESOS_GPU_DOCKER_ARGS=<carried> --name <name> <image> true`.
fn docker_wrapper(
    env: &Env,
    docker: &std::path::Path,
    carried: &str,
    name: &str,
    image: &str,
) -> TestResult<Output> {
    Command::new(env!("CARGO_BIN_EXE_mesos-gpu"))
        .args(["docker-wrapper", "--docker"])
        .arg(docker)
        .arg("--docker-state-dir")
        .arg(env.work.path())
        .arg("--pool-dir")
        .arg(env.work.path().join("pool"))
        .args(["--", "-H", "unix:///var/run/docker.sock", "run", "-e"])
        .arg(format!("MESOS_GPU_DOCKER_ARGS={carried}"))
        .args(["--name", name, image, "true"])
        .env("MESOS_GPU_LOG", "warn")
        .output()
        .map_err(|e| e.to_string().into())
}

/// The container name a launch was reserved for (`"name"`; in 0.1's array, its `--name=`, so
/// that these tests run against 0.1 too).
fn launch_name(launch: &str) -> TestResult<String> {
    let json: serde_json::Value =
        serde_json::from_str(launch).map_err(|e| format!("{e}: {launch}"))?;
    let old = || {
        json.as_array()?
            .iter()
            .find_map(|a| a.as_str()?.strip_prefix("--name="))
    };
    json["name"]
        .as_str()
        .or_else(old)
        .map(str::to_owned)
        .ok_or_else(|| format!("no name in {launch}").into())
}

/// Fails unless `argv` (what `docker` was given) holds the pinning and the GPU's variables of a
/// container of one pinned GPU of a plain image, and no driver volume or `PATH`.
fn check_plain_pinned(argv: &[String]) -> TestResult {
    let has = |prefix: &str| argv.iter().any(|a| a.starts_with(prefix));
    for wanted in [
        "--device=",
        "--cpuset-cpus=0",
        "--cpuset-mems=0",
        "--env=NVIDIA_VISIBLE_DEVICES=GPU-",
        "--env=CUDA_VISIBLE_DEVICES=GPU-",
    ] {
        if !has(wanted) {
            return Err(format!("docker was not given {wanted}…: {argv:?}").into());
        }
    }
    for unwanted in [
        "--volume",
        "--env=PATH=",
        "--env=LD_LIBRARY_PATH=",
        "--label",
    ] {
        if has(unwanted) {
            return Err(format!("docker was given {unwanted}… for a plain image: {argv:?}").into());
        }
    }
    Ok(())
}

/// The arguments the recording `docker` was given.
fn recorded(argv: &std::path::Path) -> TestResult<Vec<String>> {
    let text = std::fs::read_to_string(argv).map_err(|e| format!("{}: {e}", argv.display()))?;
    Ok(text.lines().map(str::to_owned).collect())
}

/// Issue 35 (reproduced on a simulated DGX-1): for an image that does not ask for the driver,
/// `docker-args --numa-pinning` renders a cpuset and the GPU's variables, but `docker-wrapper`
/// passed `docker` only the `--device=` arguments, so the task lost both. Now the wrapper renders
/// the launch for the pulled image and gives them all.
fn issue_35_wrapper_keeps_the_pinning_and_variables_of_a_plain_image() -> TestResult {
    let mut env = Env::new()?;
    let image = env.image(&[])?;
    let launch = docker_args_launch(
        &env,
        &[
            "--gpus",
            "1",
            "--numa-pinning",
            "--cpus",
            "1",
            "--image",
            &image,
        ],
    )?;
    let name = launch_name(&launch)?;
    wrapped_plain_pinned(&env, &launch, &name, &image, "plain")
}

/// Runs `docker-wrapper` with `launch` in `MESOS_GPU_DOCKER_ARGS` for a `docker run` of the
/// plain `image` as container `name`, and checks that `docker` got the pinned launch and that,
/// `docker run` ended and the container gone, the GPUs went back.
fn wrapped_plain_pinned(env: &Env, launch: &str, name: &str, image: &str, tag: &str) -> TestResult {
    let (docker, argv) = recording_docker(env, tag)?;
    let out = docker_wrapper(env, &docker, launch, name, image)?;
    if !out.status.success() {
        return Err(format!("docker-wrapper: {}", text(&out)).into());
    }
    check_plain_pinned(&recorded(&argv)?)?;
    let left = env.reserved()?;
    if !left.is_empty() {
        return Err(format!("still reserved: {left:?}").into());
    }
    Ok(())
}

/// A wrapper newer than the agent's hook on a node being upgraded: `MESOS_GPU_DOCKER_ARGS` in
/// the format of mesos-gpu 0.1 (a JSON array of arguments, the driver named in labels) is still
/// read, and rendered for the image as a launch of today is (before: only the `--device=`
/// arguments reached `docker` for a plain image).
fn issue_35_wrapper_reads_the_old_array_format() -> TestResult {
    let mut env = Env::new()?;
    let image = env.image(&[])?;
    // The reservation, and its name and devices from `docker-args`' one line (the same in 0.1).
    let line = Command::new(env!("CARGO_BIN_EXE_mesos-gpu"))
        .args(["--simulate", "dgx1-v100", "--dev-root"])
        .arg(env.dev.path())
        .args([
            "docker-args",
            "--gpus",
            "1",
            "--plugin",
            "--docker-state-dir",
        ])
        .arg(env.work.path())
        .arg("--pool-dir")
        .arg(env.work.path().join("pool"))
        .env("MESOS_GPU_LOG", "warn")
        .output()
        .map_err(|e| e.to_string())?;
    if !line.status.success() {
        return Err(format!("docker-args: {}", text(&line)).into());
    }
    let line = words(&line.stdout);
    let name = line
        .iter()
        .find_map(|a| a.strip_prefix("--name="))
        .ok_or(format!("no --name in {line:?}"))?
        .to_owned();
    let visible = line
        .iter()
        .find_map(|a| a.strip_prefix("--env=NVIDIA_VISIBLE_DEVICES="))
        .ok_or(format!("no NVIDIA_VISIBLE_DEVICES in {line:?}"))?
        .to_owned();
    // What 0.1's `docker-args --json --plugin --numa-pinning` printed without `--image`.
    let mut old = vec![format!("--name={name}")];
    old.extend(line.iter().filter(|a| a.starts_with("--device=")).cloned());
    old.extend([
        "--volume-driver=nvidia-docker".to_owned(),
        "--volume=nvidia_driver_550.54.14:/usr/local/nvidia:ro".to_owned(),
        format!("--env=NVIDIA_VISIBLE_DEVICES={visible}"),
        format!("--env=CUDA_VISIBLE_DEVICES={visible}"),
        "--env=PATH=/usr/local/nvidia/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".to_owned(),
        "--env=LD_LIBRARY_PATH=/usr/local/nvidia/lib:/usr/local/nvidia/lib64".to_owned(),
        "--cpuset-cpus=0".to_owned(),
        "--cpuset-mems=0".to_owned(),
        "--label=mesos-gpu.driver=550.54.14".to_owned(),
        "--label=mesos-gpu.driver-cuda=12.4".to_owned(),
    ]);
    let old = serde_json::to_string(&old).map_err(|e| e.to_string())?;
    wrapped_plain_pinned(&env, &old, &name, &image, "old")
}

/// The hook reserves before the image is pulled; an image that asks for the driver and needs a
/// CUDA version newer than the launch's driver supports is refused by the wrapper at `docker
/// run`, which never runs `docker run`, and its GPUs are given back.
fn issue_35_wrapper_refuses_too_new_cuda_and_gives_back() -> TestResult {
    let mut env = Env::new()?;
    let image = env.image(&[
        "ENV NVIDIA_VISIBLE_DEVICES=all",
        "LABEL com.nvidia.cuda.version=99.0",
    ])?;
    let launch = docker_args_launch(&env, &["--gpus", "2", "--plugin"])?;
    let name = launch_name(&launch)?;
    if env.reserved()?.is_empty() {
        return Err("docker-args reserved nothing".into());
    }
    let (docker, argv) = recording_docker(&env, "cuda")?;
    let out = docker_wrapper(&env, &docker, &launch, &name, &image)?;
    let said = String::from_utf8_lossy(&out.stderr);
    if out.status.success() || !said.contains("CUDA 99.0") {
        return Err(format!("expected a refusal naming CUDA 99.0: {}", text(&out)).into());
    }
    if argv.exists() {
        return Err(format!("docker run was run: {:?}", recorded(&argv)?).into());
    }
    let left = env.reserved()?;
    if !left.is_empty() {
        return Err(format!("still reserved after the refusal: {left:?}").into());
    }
    Ok(())
}

/// The arguments of `docker-args`' one line.
fn words(stdout: &[u8]) -> Vec<String> {
    String::from_utf8_lossy(stdout)
        .split_whitespace()
        .map(str::to_owned)
        .collect()
}

/// `mesos-gpu --simulate dgx-a100-mixed docker-args --mig-strategy mixed` for `image`,
/// with the env's device root, Docker state and pool, and `extra`.
fn docker_args_mixed(env: &Env, image: &str, extra: &[&str]) -> TestResult<Output> {
    Ok(Command::new(env!("CARGO_BIN_EXE_mesos-gpu"))
        .args(["--simulate", "dgx-a100-mixed", "--dev-root"])
        .arg(env.dev.path())
        .args(["docker-args", "--mig-strategy", "mixed", "--image", image])
        .args(extra)
        .arg("--docker-state-dir")
        .arg(env.work.path())
        .arg("--pool-dir")
        .arg(env.work.path().join("pool"))
        .env("MESOS_GPU_LOG", "warn")
        .output()
        .map_err(|e| e.to_string())?)
}

/// The `docker run` arguments `docker-args` printed (`out`, one line) and the MIG device
/// they name in `NVIDIA_VISIBLE_DEVICES`.
fn mig_device_args(
    out: &Output,
    inventory: &mesos_gpu_node::inventory::Inventory,
) -> TestResult<(Vec<String>, mesos_gpu_node::inventory::MigDevice)> {
    if !out.status.success() {
        return Err(format!("docker-args: {}", text(out)).into());
    }
    let args = words(&out.stdout);
    let visible = args
        .iter()
        .find_map(|a| a.strip_prefix("--env=NVIDIA_VISIBLE_DEVICES="))
        .ok_or(format!("no NVIDIA_VISIBLE_DEVICES in {args:?}"))?;
    let device = inventory
        .mig
        .by_uuid(visible)
        .ok_or(format!("not a MIG device: {visible}"))?
        .clone();
    Ok((args, device))
}

/// Runs `image` with the `docker run` arguments `args` (less `--name`): a script printing each
/// `/dev/nvidia*` and `/dev/nvidia-caps/*` node with what opening it says, then `extra`, then the
/// environment. Returns the run and its stdout.
fn run_mig_container(image: &str, args: &[String], extra: &str) -> TestResult<(Output, String)> {
    let script = format!(
        "for f in /dev/nvidia* /dev/nvidia-caps/*; do [ -c $f ] && echo \"$f $(cat $f 2>&1 >/dev/null)\"; done; {extra}env"
    );
    let run = Command::new("docker")
        .arg("run")
        .arg("--rm")
        .args(args.iter().filter(|a| !a.starts_with("--name=")))
        .arg(image)
        .args(["sh", "-c", &script])
        .output()
        .map_err(|e| e.to_string())?;
    let stdout = String::from_utf8_lossy(&run.stdout).into_owned();
    Ok((run, stdout))
}

/// The nodes [`run_mig_container`] printed, when every one of them opened with ENXIO (the
/// device cgroup allows it); `None` when one did not.
fn nodes_opened(stdout: &str) -> Option<BTreeSet<String>> {
    let lines: Vec<&str> = stdout
        .lines()
        .filter(|l| l.starts_with("/dev/nvidia"))
        .collect();
    lines
        .iter()
        .all(|l| l.contains("No such device or address"))
        .then(|| {
            lines
                .iter()
                .map(|l| l.split_whitespace().next().unwrap_or_default().to_owned())
                .collect()
        })
}

/// The nodes a container holding MIG device `device` (whole or a share) has: its parent GPU's,
/// its two capability nodes, and the control nodes.
fn mig_container_nodes(
    device: &mesos_gpu_node::inventory::MigDevice,
) -> TestResult<BTreeSet<String>> {
    let caps = device.caps.as_ref().ok_or("no caps")?;
    Ok([
        format!("/dev/nvidia{}", device.parent_minor),
        format!("/dev/nvidia-caps/nvidia-cap{}", caps.gpu_instance.minor),
        format!("/dev/nvidia-caps/nvidia-cap{}", caps.compute_instance.minor),
        "/dev/nvidiactl".to_owned(),
        "/dev/nvidia-uvm".to_owned(),
    ]
    .into())
}

/// Issue 28: `docker-args` on `dgx-a100-mixed` with the MIG devices shared 2 ways under MPS
/// (`--gpu-replicas 2 --gpu-sharing mps,0-3=none`): a real container started with the printed
/// arguments for `--mig 19:1` can open exactly its MIG device's parent and capability nodes and
/// the control nodes (ENXIO), has its MIG UUID in `CUDA_VISIBLE_DEVICES`, `1/2` of it, and finds
/// the device's MPS pipe directory at `CUDA_MPS_PIPE_DIRECTORY`.
fn docker_mig_share() -> TestResult {
    let mut env = Env::new()?;
    let image = env.image(&[])?;
    let inventory = mesos_gpu_testkit::nvml_sim::SimNode::shipped("dgx-a100-mixed").inventory()?;
    mesos_gpu_testkit::nvml_sim::mknod_mig_caps(env.dev.path(), &inventory)?;
    let control = mesos_gpu_testkit::mps::MpsControl::install("{}");
    let result = (|| -> TestResult {
        let mps_root = env.work.path().join("mps");
        let (mps_root_arg, program) = (
            mps_root.display().to_string(),
            control.program().display().to_string(),
        );
        let out = docker_args_mixed(
            &env,
            &image,
            &[
                "--mig",
                "19:1",
                "--gpu-replicas",
                "2",
                "--gpu-sharing",
                "mps,0-3=none",
                "--mps-root",
                &mps_root_arg,
                "--mps-control",
                &program,
            ],
        )?;
        let (args, device) = mig_device_args(&out, &inventory)?;
        let visible = device.uuid.clone();
        let (run, stdout) = run_mig_container(
            &image,
            &args,
            "[ -d \"$CUDA_MPS_PIPE_DIRECTORY\" ] && echo pipe-dir-mounted; ",
        )?;
        println!("the container printed:\n{stdout}");
        let (nodes, want) = (nodes_opened(&stdout), mig_container_nodes(&device)?);
        let pipe = env
            .work
            .path()
            .join("mps")
            .join(&visible)
            .join("pipe")
            .display()
            .to_string();
        if !run.status.success()
            || nodes != Some(want.clone())
            || !stdout.contains(&format!("CUDA_VISIBLE_DEVICES={visible}"))
            || !stdout.contains("MESOS_GPU_SHARE=1/2")
            || !stdout.contains(&format!("CUDA_MPS_PIPE_DIRECTORY={pipe}"))
            || !stdout.contains("pipe-dir-mounted")
        {
            return Err(format!(
                "container: nodes {nodes:?}, expected {want:?}: {}",
                text(&run)
            )
            .into());
        }
        Ok(())
    })();
    control.kill_daemons();
    result
}

/// Issue 18: on `numa-2cpu` (GPU 0 local to CPU 0, GPU 1 to CPU 1), `run --numa-pinning` starts
/// a real container whose `Cpus_allowed_list` is exactly its GPU's CPU.
fn numa_pinning() -> TestResult {
    let mut env = Env::new()?;
    let image = env.image(&[])?;
    let out = Command::new(env!("CARGO_BIN_EXE_mesos-gpu"))
        .args(["--simulate", "numa-2cpu", "--dev-root"])
        .arg(env.dev.path())
        .args(["run", "--docker-state-dir"])
        .arg(env.work.path())
        .arg("--pool-dir")
        .arg(env.work.path().join("pool"))
        .args(["--gpus", "1", "--numa-pinning", &image, "sh", "-c"])
        .arg("ls /dev; grep -E '^(Cpus|Mems)_allowed_list' /proc/self/status")
        .env("MESOS_GPU_LOG", "warn")
        .output()
        .map_err(|e| e.to_string())?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}");
    let gpus = gpu_nodes(&stdout);
    let cpu = match gpus.iter().collect::<Vec<_>>().as_slice() {
        [0] => "0",
        [1] => "1",
        _ => return Err(format!("expected one GPU node: {}", text(&out)).into()),
    };
    if !out.status.success()
        || !stdout.contains(&format!("Cpus_allowed_list:\t{cpu}\n"))
        || !stdout.contains("Mems_allowed_list:\t0\n")
    {
        return Err(format!("expected CPU {cpu} only: {}", text(&out)).into());
    }
    env.all_clean(&image)
}

/// Issue 17: on a node sharing every GPU four ways under MPS (nvml-sim's
/// `nvidia-cuda-mps-control` stand-in), two `docker-args --gpus 1` reservations share GPU 0;
/// each real container sees only `/dev/nvidia0`, its share and limits in its environment, the
/// daemon's pipe directory and the host's `/dev/shm`; `--release` frees the shares, and one
/// daemon served both.
fn docker_shares() -> TestResult {
    let mut env = Env::new()?;
    let image = env.image(&[])?;
    let control = mesos_gpu_testkit::mps::MpsControl::install("{}");
    let mps_root = env.work.path().join("mps");
    let marker = format!("/dev/shm/{}", unique_name("mgpu-shm"));
    std::fs::write(&marker, b"host").map_err(|e| e.to_string())?;
    let reserve = |env: &Env| -> Result<Vec<String>, Failed> {
        let out = Command::new(env!("CARGO_BIN_EXE_mesos-gpu"))
            .args(["--simulate", "dgx1-v100", "--dev-root"])
            .arg(env.dev.path())
            .args(["docker-args", "--gpus", "1", "--gpu-replicas", "4"])
            .args(["--gpu-sharing", "mps", "--mps-control"])
            .arg(control.program())
            .arg("--mps-root")
            .arg(&mps_root)
            .arg("--docker-state-dir")
            .arg(env.work.path())
            .arg("--pool-dir")
            .arg(env.work.path().join("pool"))
            .env("MESOS_GPU_LOG", "warn")
            .output()
            .map_err(|e| e.to_string())?;
        if !out.status.success() {
            return Err(format!("docker-args: {}", text(&out)).into());
        }
        Ok(words(&out.stdout))
    };
    let result = (|| -> TestResult {
        let mut names = Vec::new();
        for _ in 0..2 {
            let args = reserve(&env)?;
            let name = args
                .iter()
                .find_map(|a| a.strip_prefix("--name="))
                .ok_or(format!("no --name in {args:?}"))?
                .to_owned();
            let out = Command::new("docker")
                .arg("run")
                .arg("--rm")
                .args(args.iter().filter(|a| !a.starts_with("--name=")))
                .arg(&image)
                .args([
                    "sh",
                    "-c",
                    &format!("ls /dev; env; cat /proc/mounts; cat {marker}"),
                ])
                .output()
                .map_err(|e| e.to_string())?;
            let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
            println!("{name} printed:\n{stdout}");
            let pipe_line = stdout
                .lines()
                .find_map(|l| l.strip_prefix("CUDA_MPS_PIPE_DIRECTORY="))
                .unwrap_or_default()
                .to_owned();
            let ok = out.status.success()
                && gpu_nodes(&stdout) == BTreeSet::from([0])
                && stdout.contains("MESOS_GPU_SHARE=1/4")
                && stdout.contains("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25")
                && stdout.contains("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=4040M")
                && pipe_line.starts_with(mps_root.to_str().unwrap_or("?"))
                && stdout
                    .lines()
                    .any(|l| l.split_whitespace().nth(1) == Some(pipe_line.as_str()))
                && stdout.lines().last() == Some("host");
            if !ok {
                return Err(format!("container {name}: {}", text(&out)).into());
            }
            names.push(name);
        }
        let starts = control
            .records()
            .iter()
            .filter(|r| r["event"] == "start")
            .count();
        if starts != 1 {
            return Err(format!("{starts} MPS daemons started, expected one for GPU 0").into());
        }
        for name in &names {
            let id = name.trim_start_matches("mesos-");
            let out = Command::new(env!("CARGO_BIN_EXE_mesos-gpu"))
                .args(["--simulate", "dgx1-v100", "docker-args", "--release", id])
                .arg("--docker-state-dir")
                .arg(env.work.path())
                .arg("--pool-dir")
                .arg(env.work.path().join("pool"))
                .output()
                .map_err(|e| e.to_string())?;
            if !out.status.success() {
                return Err(format!("release {id}: {}", text(&out)).into());
            }
        }
        let pool = std::fs::read_to_string(env.work.path().join("pool/gpu/pool.json"))
            .map_err(|e| e.to_string())?;
        if pool.contains("\"shares\"") {
            return Err(format!("shares left: {pool}").into());
        }
        env.all_clean(&image)
    })();
    let _ = std::fs::remove_file(&marker);
    if let Ok(pool) = std::fs::read_to_string(env.work.path().join("pool/gpu/pool.json"))
        && let Ok(json) = serde_json::from_str::<serde_json::Value>(&pool)
    {
        for d in json["mps"].as_object().into_iter().flat_map(|m| m.values()) {
            if let Some(pid) = d["daemon"]["process"]["pid"].as_u64() {
                let _ = Command::new("kill").arg(pid.to_string()).status();
            }
        }
    }
    result
}

/// Issue 16: on nvml-sim's `dgx-a100-mixed` (GPUs 4-7 in MIG mode), `docker-args
/// --mig-strategy mixed --mig 19:1` reserves one 1g.5gb MIG device; a real container started
/// with its arguments has exactly its parent's node and its two capability nodes (and the
/// control nodes), each opening with ENXIO, and names the device in `NVIDIA_VISIBLE_DEVICES`;
/// two MIG devices are refused saying why; `--release` gives it back. `--mig mig-2g.10gb:1`
/// (the scalar the agent offers) reserves a 2g.10gb device; a profile the node does not offer
/// is refused naming those it does.
fn docker_mig() -> TestResult {
    let mut env = Env::new()?;
    let image = env.image(&[])?;
    let inventory = mesos_gpu_testkit::nvml_sim::SimNode::shipped("dgx-a100-mixed").inventory()?;
    mesos_gpu_testkit::nvml_sim::mknod_mig_caps(env.dev.path(), &inventory)?;
    let docker_args =
        |env: &Env, extra: &[&str]| -> Output { docker_args_mixed(env, &image, extra).unwrap() };
    let release = |env: &Env, id: &str| -> TestResult {
        let released = Command::new(env!("CARGO_BIN_EXE_mesos-gpu"))
            .args([
                "--simulate",
                "dgx-a100-mixed",
                "docker-args",
                "--release",
                id,
            ])
            .arg("--docker-state-dir")
            .arg(env.work.path())
            .arg("--pool-dir")
            .arg(env.work.path().join("pool"))
            .output()
            .map_err(|e| e.to_string())?;
        if !released.status.success() {
            return Err(format!("release {id}: {}", text(&released)).into());
        }
        Ok(())
    };
    let out = docker_args(&env, &["--gpus", "0", "--mig", "19:1"]);
    let (args, device) = mig_device_args(&out, &inventory)?;
    let visible = device.uuid.clone();
    let name = args
        .iter()
        .find_map(|a| a.strip_prefix("--name="))
        .ok_or("no --name")?
        .to_owned();
    let (run, stdout) = run_mig_container(&image, &args, "")?;
    println!("{name} printed:\n{stdout}");
    let (nodes, want) = (nodes_opened(&stdout), mig_container_nodes(&device)?);
    if !run.status.success()
        || nodes != Some(want.clone())
        || !stdout.contains(&format!("CUDA_VISIBLE_DEVICES={visible}"))
    {
        return Err(format!(
            "container {name}: nodes {nodes:?}, expected {want:?}: {}",
            text(&run)
        )
        .into());
    }
    let two = docker_args(&env, &["--gpus", "0", "--mig", "19:2"]);
    let refused = String::from_utf8_lossy(&two.stderr);
    if two.status.code() != Some(1)
        || !refused.contains("CUDA uses only one MIG device per process")
    {
        return Err(format!("two MIG devices: {}", text(&two)).into());
    }
    release(&env, name.trim_start_matches("mesos-"))?;
    let pool = std::fs::read_to_string(env.work.path().join("pool/gpu/pool.json"))
        .map_err(|e| e.to_string())?;
    if pool.contains("MIG-") {
        return Err(format!("the MIG device is still reserved: {pool}").into());
    }
    // The scalar the agent offers (what the Docker hook passes) names the profile too.
    let by_name = docker_args(&env, &["--gpus", "0", "--mig", "mig-2g.10gb:1"]);
    if !by_name.status.success() {
        return Err(format!("--mig mig-2g.10gb:1: {}", text(&by_name)).into());
    }
    let args = words(&by_name.stdout);
    let got = args
        .iter()
        .find_map(|a| a.strip_prefix("--env=NVIDIA_VISIBLE_DEVICES="))
        .and_then(|uuid| inventory.mig.by_uuid(uuid))
        .map(|d| d.profile);
    if got != Some(Some(14)) {
        return Err(format!("--mig mig-2g.10gb:1 gave {args:?}").into());
    }
    let name = args
        .iter()
        .find_map(|a| a.strip_prefix("--name=mesos-"))
        .ok_or("no --name")?
        .to_owned();
    let unknown = docker_args(&env, &["--gpus", "0", "--mig", "mig-9g.99gb:1"]);
    if unknown.status.code() != Some(1)
        || !String::from_utf8_lossy(&unknown.stderr).contains(
            "--mig mig-9g.99gb:1: this node offers no MIG profile mig-9g.99gb (offered: mig-1g.5gb, mig-2g.10gb, mig-3g.20gb)",
        )
    {
        return Err(format!("an unknown profile: {}", text(&unknown)).into());
    }
    release(&env, &name)?;
    env.all_clean(&image)
}
