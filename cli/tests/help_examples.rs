//! The `--simulate` examples of `volume`, `docker-args` and `serve --help` run as written (the
//! command line copied from the help, with this build's `mesos-gpu` first on `PATH`): a simulated
//! node brings a simulated driver tree, so the volume is built from it, `docker-args` binds it,
//! and `serve`'s volume plugin mounts it. Each runs with a fresh `TMPDIR`, so the simulated node's
//! scratch state (its volume root included) starts empty and the example passes only by building
//! the volume there, never reading or writing the host's. Needs root (`ldconfig -r`).
//!
//! Beyond those, every example of every command's `--help` runs on a simulated node with scratch
//! state (`every_example_of_every_command_runs_on_a_simulated_node`; root, cgroup v1 for `exec`
//! and dockerd for the Docker examples): it succeeds, or fails only for a reason the test names
//! (an image not pulled, a driver image not mounted, a user's file).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Read as _;
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use libtest_mimic::{Arguments, Failed, Trial};
use mesos_gpu_testkit::{Host, Need, needs};

type TestResult = Result<(), Failed>;

/// How long a command may take on a loaded machine; not a bound.
const PATIENCE: Duration = Duration::from_secs(60);

fn main() -> ExitCode {
    let host = Host::probe();
    let trials = vec![
        Trial::test(
            "examples_are_never_wrapped_mid_command",
            examples_are_never_wrapped_mid_command,
        ),
        needs(
            &host,
            &[Need::Root],
            Trial::test("volume_create_simulate_example_works", volume_example),
        ),
        needs(
            &host,
            &[Need::Root],
            Trial::test("docker_args_simulate_example_works", docker_args_example),
        ),
        needs(
            &host,
            &[Need::Root],
            Trial::test("serve_simulate_example_works", serve_example),
        ),
        needs(
            &host,
            &[Need::Root, Need::Cgroup1, Need::Dockerd],
            Trial::test(
                "every_example_of_every_command_runs_on_a_simulated_node",
                every_example_runs,
            ),
        ),
    ];
    libtest_mimic::run(&Arguments::from_args(), trials).exit_code()
}

/// The `--simulate` example lines of `mesos-gpu <command> --help`.
fn simulate_examples(command: &str) -> Vec<String> {
    let out = Command::new(env!("CARGO_BIN_EXE_mesos-gpu"))
        .args([command, "--help"])
        // Unwrapped, one example a line.
        .env("COLUMNS", "1000")
        .output()
        .unwrap();
    let help = String::from_utf8(out.stdout).unwrap();
    let examples = help
        .split_once("Examples:")
        .map(|(_, rest)| rest)
        .unwrap_or_else(|| panic!("`{command} --help` has no examples:\n{help}"));
    joined_examples(examples)
        .into_iter()
        .filter(|l| l.starts_with("mesos-gpu ") && l.contains("--simulate"))
        .collect()
}

/// The example commands of a help's `Examples:` section, each on one line (a line ending in
/// ` \` goes on with the next, as in a shell).
fn joined_examples(section: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut continued = false;
    for line in section.lines().map(str::trim) {
        if continued {
            if let Some(last) = out.last_mut() {
                last.push(' ');
                last.push_str(line.trim_end_matches(" \\"));
            }
        } else {
            out.push(line.trim_end_matches(" \\").to_owned());
        }
        continued = line.ends_with(" \\");
    }
    out
}

/// The names of `mesos-gpu <path…>`'s subcommands, from its help's `Commands:` section.
fn subcommands(path: &[&str]) -> Vec<String> {
    let out = Command::new(env!("CARGO_BIN_EXE_mesos-gpu"))
        .args(path)
        .arg("--help")
        .output()
        .unwrap();
    let help = String::from_utf8(out.stdout).unwrap();
    help.split_once("Commands:\n")
        .map(|(_, rest)| rest)
        .unwrap_or("")
        .lines()
        .take_while(|l| !l.trim().is_empty())
        .filter_map(|l| l.split_whitespace().next())
        .filter(|name| *name != "help")
        .map(str::to_owned)
        .collect()
}

/// The `Examples:` section of `mesos-gpu <path…> --help` at a terminal `columns` wide.
fn examples_at(path: &[String], columns: u32) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_mesos-gpu"))
        .args(path)
        .arg("--help")
        .env("COLUMNS", columns.to_string())
        .output()
        .unwrap();
    let help = String::from_utf8(out.stdout).unwrap();
    help.split_once("Example")
        .map(|(_, rest)| rest.split("\n\n").next().unwrap_or(rest).to_owned())
        .unwrap_or_default()
}

/// Issue 37: on an 80-column terminal no example of any command's `--help` is broken mid-command
/// (clap wrapped long example lines, and a wrapped line pasted into a shell runs half a
/// command): long examples go on on the next line after ` \`, as in a shell.
fn examples_are_never_wrapped_mid_command() -> TestResult {
    let paths = command_paths();
    if paths.len() < 20 {
        return Err(format!("too few commands found: {paths:?}").into());
    }
    let mut wrapped = Vec::new();
    for path in &paths {
        let wide = examples_at(path, 1000);
        if examples_at(path, 80) != wide {
            wrapped.push(path.join(" "));
        }
        if joined_examples(&wide).iter().any(|e| e.len() > 1000) {
            return Err(format!("`{}`: an example never ends", path.join(" ")).into());
        }
    }
    if wrapped.is_empty() {
        Ok(())
    } else {
        Err(format!("examples wrapped at 80 columns: {wrapped:?}").into())
    }
}

/// Held by whatever runs a `serve` example: they listen on one TCP port (127.0.0.1:3476).
static SERVE_PORT: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Every command path: each command, or each subcommand of a command that has some.
fn command_paths() -> Vec<Vec<String>> {
    let mut paths: Vec<Vec<String>> = Vec::new();
    for command in subcommands(&[]) {
        let nested = subcommands(&[command.as_str()]);
        if nested.is_empty() {
            paths.push(vec![command]);
        } else {
            paths.extend(nested.into_iter().map(|sub| vec![command.clone(), sub]));
        }
    }
    paths
}

/// Examples that cannot succeed on a simulated node in a test, each with what its failure may
/// say (any of the texts; success is fine too), so that it still runs and fails only for that
/// reason: (the example's start, the texts).
const CANNOT_SUCCEED_HERE: &[(&str, &[&str])] = &[
    // The real NVIDIA library, or a driver image mounted at /mnt: not on a test host.
    (
        "mesos-gpu info --json --nvml-lib",
        &["cannot load the NVML library /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"],
    ),
    (
        "mesos-gpu ldcache --cache /mnt/driver",
        &["cannot read ld.so.cache"],
    ),
    (
        "mesos-gpu volume plan --driver-root /mnt/image",
        &["cannot read ld.so.cache"],
    ),
    (
        "mesos-gpu volume create --volume-root /tmp/volumes --driver-root /mnt/image",
        &["cannot read ld.so.cache"],
    ),
    // Images that are not pulled (or a placeholder), GPUs and IDs of another node, a user's files.
    (
        "docker run $(mesos-gpu docker-args --gpus 2 --image nvidia/cuda",
        &["o such image: nvidia/cuda:12.4.1-base"],
    ),
    (
        "docker run $(mesos-gpu docker-args --gpus 1 --gpu-replicas 4 --gpu-sharing mps --image IMAGE)",
        &["docker inspect image IMAGE"],
    ),
    (
        "mesos-gpu run --gpus 2 nvidia/cuda",
        &["docker pull it first"],
    ),
    (
        "mesos-gpu run --gpus 1 --plugin nvidia/cuda",
        &["docker pull it first"],
    ),
    (
        "mesos-gpu --simulate dgx1-v100 --dev-root /tmp/nodes run",
        &["docker pull it first", "no device node"],
    ),
    (
        "mesos-gpu run --gpus 1 --numa-pinning busybox",
        &["docker pull it first"],
    ),
    ("mesos-gpu gpu mark-healthy", &["no GPU health checkpoint"]),
    // A Mesos install with its module headers: not on a test host (cli/tests/module.rs builds
    // against the real one in shared/mesos).
    (
        "mesos-gpu module build --mesos-prefix /usr",
        &["no /usr/include/mesos/mesos.pb.h"],
    ),
    (
        "mesos-gpu module build --mesos-prefix /opt/mesos",
        &["--mesos-prefix /opt/mesos: no such directory"],
    ),
    (
        "mesos-gpu gpu probe --gpu GPU-8a2d4c6e",
        &["is not on this node"],
    ),
    (
        "mesos-gpu gpu probe --gpu 0 --isolated --command '/usr/local/bin/check-gpu",
        &["FAILED", "failed"],
    ),
    (
        "mesos-gpu gpu release exec-4242",
        &["no reservation of the GPU pool"],
    ),
    (
        "mesos-gpu gpu release 3d8a52b4",
        &["no reservation of the GPU pool"],
    ),
    (
        "mesos-gpu demo --stream my-apps/stream.json",
        &["cannot read the stream my-apps/stream.json"],
    ),
    ("mesos-gpu exec --gpus 1 --policy first-fit", &["train.py"]),
    (
        "mesos-gpu exec --gpus 1 --gpu-replicas 4 --gpu-sharing mps,4-7",
        &["cannot run ./job"],
    ),
    // nvml-sim's nvidia-smi stand-in answers `-L` only.
    (
        "mesos-gpu exec --gpus 2 -- nvidia-smi",
        &["usage: nvidia-smi -L"],
    ),
    // `volume gc --all`, an example before it, removed the node's volume.
    (
        "mesos-gpu volume acquire",
        &["no volume for driver 550.54.14"],
    ),
    // A user's script.
    (
        "mesos-gpu exec --gpus 1 --gpu-replicas 4 --gpu-sharing mps -- python",
        &["infer.py"],
    ),
    // A host without the agent's module installed is not ready.
    ("mesos-gpu doctor --smoke --modules", &["NOT READY"]),
];

/// The `mesos-gpu` command line an example runs, if it runs one: the line itself (its pipe's
/// consumer and a trailing comment left out), or the `$(mesos-gpu …)` inside a `docker run`
/// line; `sudo` dropped (the test runs as root).
fn mesos_gpu_command(example: &str) -> Option<String> {
    let example = example.strip_prefix("sudo ").unwrap_or(example);
    if let Some(rest) = example.strip_prefix("mesos-gpu ") {
        let rest = rest.split(" | ").next().unwrap_or(rest);
        let rest = rest.split(" # ").next().unwrap_or(rest);
        return Some(format!("mesos-gpu {}", rest.trim()));
    }
    let inner = example.split_once("$(mesos-gpu ")?.1;
    let inner = inner.split_once(')')?.0;
    Some(format!("mesos-gpu {inner}"))
}

/// The host paths examples name that are moved under the test's root.
const MOVED: [&str; 4] = ["/var/", "/etc/", "/tmp/", "/mnt/"];

/// `command` on the simulated node `dgx1-v100` unless it names a node or an NVML library, with
/// the host paths it names ([`MOVED`]) moved under `root`, so that it never touches the host's
/// state. Each moved path's parent is made, and so is the path itself when a `--…-dir` or
/// `--…-root` flag names it (as on a host set up by the package).
fn simulated(command: &str, root: &Path) -> Result<String, Failed> {
    let mut words: Vec<String> = Vec::new();
    for word in command.split(' ') {
        let quote = if word.starts_with(['\'', '"']) {
            &word[..1]
        } else {
            ""
        };
        let bare = &word[quote.len()..];
        if !MOVED.iter().any(|p| bare.starts_with(p)) {
            words.push(word.to_owned());
            continue;
        }
        let moved = root.join(bare.trim_start_matches('/'));
        let is_dir = words
            .last()
            .is_some_and(|flag| flag.ends_with("-dir") || flag.ends_with("-root"));
        if is_dir {
            std::fs::create_dir_all(&moved)?;
        } else if let Some(parent) = moved.parent() {
            std::fs::create_dir_all(parent)?;
        }
        words.push(format!("{quote}{}", moved.display()));
    }
    let line = words.join(" ");
    Ok(
        if line.contains("--simulate") || line.contains("--nvml-lib") {
            line
        } else {
            line.replacen("mesos-gpu ", "mesos-gpu --simulate dgx1-v100 ", 1)
        },
    )
}

/// Issue 37: every example of every command's `--help` runs (not a chosen few), in help order,
/// on a simulated node with scratch state (one fresh `TMPDIR`, as one operator's node; the host
/// paths an example names moved under it): each `mesos-gpu` command line, as written but for
/// the node, exits 0, or fails only as [`CANNOT_SUCCEED_HERE`] says; a `serve` example is still
/// serving after a few seconds and ends cleanly on SIGTERM. Lines that run other programs
/// (`docker run`) run the `mesos-gpu` command inside them; those without one (`podman`, `curl`)
/// are left out.
fn every_example_runs() -> TestResult {
    // As short as `/tmp/tmp.XXXXXXXXXX`: the MPS daemons' sockets under it must fit in a socket
    // address (107 bytes).
    let tmp = tempfile::Builder::new()
        .prefix("tmp.")
        .rand_bytes(10)
        .tempdir_in("/tmp")?;
    let root = tmp.path().join("root");
    let mut failures = Vec::new();
    let mut ran = 0;
    let mut excused = std::collections::BTreeSet::new();
    for path in command_paths() {
        for example in joined_examples(&examples_at(&path, 1000)) {
            let Some(command) = mesos_gpu_command(&example) else {
                continue;
            };
            ran += 1;
            excused.extend(
                CANNOT_SUCCEED_HERE
                    .iter()
                    .map(|(start, _)| *start)
                    .filter(|start| example.starts_with(start)),
            );
            let line = simulated(&command, &root)?;
            if let Err(why) = run_any_example(&line, tmp.path()) {
                let allowed = CANNOT_SUCCEED_HERE
                    .iter()
                    .find(|(start, _)| example.starts_with(start))
                    .is_some_and(|(_, says)| says.iter().any(|s| why.contains(s)));
                if !allowed {
                    failures.push(format!("`{}`: `{line}`: {why}", path.join(" ")));
                }
            }
        }
    }
    quit_mps_daemons(&tmp.path().join("mesos-gpu-sim"));
    // An excuse for an example that is gone would excuse the next one written like it.
    failures.extend(
        CANNOT_SUCCEED_HERE
            .iter()
            .filter(|(start, _)| !excused.contains(start))
            .map(|(start, _)| format!("CANNOT_SUCCEED_HERE names no example: {start}")),
    );
    if ran < 40 {
        return Err(format!("only {ran} examples found").into());
    }
    if failures.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "{} of {ran} examples failed:\n{}",
            failures.len(),
            failures.join("\n")
        )
        .into())
    }
}

/// Stops the MPS daemons the examples started under the simulated nodes' scratch state
/// `sim` (`<node>/mps/<GPU>/pipe`): they outlive the commands that started them, as on a node.
fn quit_mps_daemons(sim: &Path) {
    let Ok(program) = mesos_gpu_testkit::mps::find_program() else {
        return;
    };
    let pipes = std::fs::read_dir(sim)
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .flat_map(|node| {
            std::fs::read_dir(node.path().join("mps"))
                .into_iter()
                .flatten()
        })
        .filter_map(Result::ok)
        .map(|gpu| gpu.path().join("pipe"))
        .filter(|pipe| pipe.join("control").exists());
    for pipe in pipes {
        let child = Command::new(&program)
            .env("CUDA_MPS_PIPE_DIRECTORY", &pipe)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn();
        if let Ok(mut child) = child {
            if let Some(mut input) = child.stdin.take() {
                let _ = std::io::Write::write_all(&mut input, b"quit\n");
            }
            let _ = child.wait();
        }
    }
}

/// The command an example line runs (`serve` in `mesos-gpu --simulate x serve --listen …`; not
/// in `mesos-gpu gpu top --source serve`): the first word after `mesos-gpu` and its global
/// options.
fn subcommand(line: &str) -> Option<&str> {
    const GLOBAL_WITH_VALUE: [&str; 5] = [
        "--nvml-lib",
        "--dev-root",
        "--proc-root",
        "--simulate",
        "--log-format",
    ];
    let mut words = line
        .split_whitespace()
        .skip_while(|w| !w.ends_with("mesos-gpu"))
        .skip(1);
    while let Some(word) = words.next() {
        if GLOBAL_WITH_VALUE.contains(&word) {
            words.next();
        } else if !word.starts_with('-') {
            return Some(word);
        }
    }
    None
}

/// Runs one example line with `tmp` as `TMPDIR`: `Err` says how it failed (its status and
/// output).
fn run_any_example(line: &str, tmp: &Path) -> Result<(), String> {
    let serve = subcommand(line) == Some("serve");
    let _port = serve.then(|| SERVE_PORT.lock().unwrap_or_else(|e| e.into_inner()));
    let mut child = shell(&format!("exec {line}"), tmp)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| e.to_string())?;
    // Read as it comes, so that a full pipe never stops the command.
    let stdout = child.stdout.take().map(|mut out| {
        std::thread::spawn(move || {
            let mut text = String::new();
            let _ = out.read_to_string(&mut text);
            text
        })
    });
    let limit = if serve {
        Duration::from_secs(3)
    } else {
        PATIENCE
    };
    let deadline = Instant::now() + limit;
    let running = loop {
        if child.try_wait().map_err(|e| e.to_string())?.is_some() {
            break false;
        }
        if Instant::now() > deadline {
            break true;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    if running {
        let _ = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status();
    }
    let out = child.wait_with_output().map_err(|e| e.to_string())?;
    let stdout = stdout.and_then(|t| t.join().ok()).unwrap_or_default();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stderr),
        stdout.lines().rev().take(5).collect::<Vec<_>>().join(" / ")
    );
    match (running, serve, out.status.success()) {
        (false, false, true) | (true, true, true) => Ok(()),
        (true, false, _) => Err(format!("still running after {limit:?}: {said}")),
        (false, true, _) => Err(format!("serve ended by itself ({}): {said}", out.status)),
        (_, _, false) => Err(format!("{}: {said}", out.status)),
    }
}

/// A shell running `line` with this build's `mesos-gpu` first on `PATH` and `tmp` as `TMPDIR`.
fn shell(line: &str, tmp: &Path) -> Command {
    let bin = Path::new(env!("CARGO_BIN_EXE_mesos-gpu")).parent().unwrap();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut cmd = Command::new("sh");
    cmd.args(["-c", line])
        .env("PATH", path)
        .env("TMPDIR", tmp)
        .env_remove("NVML_SIM_CONFIG");
    cmd
}

fn run_example(line: &str, tmp: &Path) -> Result<String, Failed> {
    let out = shell(line, tmp).output()?;
    if !out.status.success() {
        return Err(format!(
            "`{line}` failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        )
        .into());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The one `--simulate` example of `command`.
fn the_example(command: &str) -> Result<String, Failed> {
    match &simulate_examples(command)[..] {
        [one] => Ok(one.clone()),
        other => Err(
            format!("`{command} --help`: expected one --simulate example, got {other:?}").into(),
        ),
    }
}

/// The argument after `flag` in `line`.
fn flag_value(line: &str, flag: &str) -> Result<PathBuf, Failed> {
    let mut words = line.split_whitespace();
    words
        .by_ref()
        .find(|w| *w == flag)
        .and_then(|_| words.next())
        .map(PathBuf::from)
        .ok_or_else(|| format!("`{line}` has no {flag}").into())
}

/// The volume under `root` holds the simulated driver's libraries and its `nvidia-smi`.
fn check_volume(root: &Path) -> TestResult {
    let volume = std::fs::read_dir(root)?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("nvidia_550.54.14"))
        })
        .ok_or_else(|| format!("no nvidia_550.54.14 volume under {}", root.display()))?;
    for file in [
        "bin/nvidia-smi",
        "lib64/libnvidia-ml.so.1",
        "lib64/libcuda.so.1",
    ] {
        if !volume.join(file).exists() {
            return Err(format!("{} lacks {file}", volume.display()).into());
        }
    }
    Ok(())
}

fn volume_example() -> TestResult {
    let line = the_example("volume")?;
    let root = flag_value(&line, "--volume-root")?;
    let tmp = tempfile::tempdir()?;
    let out = run_example(&line, tmp.path())?;
    if !out.contains("nvidia_550.54.14") {
        return Err(format!("`{line}` printed: {out}").into());
    }
    check_volume(&root)
}

/// The simulated node's volume root in its scratch state under `tmp`.
fn scratch_volumes(tmp: &Path) -> PathBuf {
    tmp.join("mesos-gpu-sim/dgx1-v100/volumes")
}

fn docker_args_example() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let line = the_example("docker-args")?;
    let out = run_example(&line, tmp.path())?;
    // The launch (`--json`): the driver volume is the driver's bind.
    let launch: serde_json::Value = serde_json::from_str(&out)?;
    let volume = launch["driver"]["volume"]["host_path"]
        .as_str()
        .ok_or_else(|| format!("no driver volume host_path in {launch}"))?;
    let root = Path::new(volume).parent().unwrap();
    if root != scratch_volumes(tmp.path()) {
        return Err(
            format!("the volume {volume} is not in the simulated node's scratch state").into(),
        );
    }
    // The holder the example names is recorded with its reservation's owner (issue 37).
    let pool = flag_value(&line, "--pool-dir")?.join("gpu/pool.json");
    let pool: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&pool)?)?;
    let owner = pool["reservations"]
        .as_object()
        .and_then(|all| all.values().find(|r| r["owner"]["name"] == launch["name"]))
        .map(|r| &r["owner"])
        .ok_or_else(|| format!("no reservation of {} in {pool:#}", launch["name"]))?;
    let want = serde_json::json!({
        "task_id": flag_value(&line, "--task-id")?,
        "framework_id": flag_value(&line, "--framework-id")?,
        "executor_id": flag_value(&line, "--executor-id")?,
    });
    if owner["holder"] != want {
        return Err(format!("holder {} recorded, expected {want}", owner["holder"]).into());
    }
    check_volume(root)
}

fn serve_example() -> TestResult {
    let _port = SERVE_PORT.lock().unwrap_or_else(|e| e.into_inner());
    let tmp = tempfile::tempdir()?;
    let line = the_example("serve")?;
    let listen = flag_value(&line, "--listen")?;
    let socket = flag_value(&line, "--plugin-socket")?;
    let mut child = shell(&format!("exec {line}"), tmp.path())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()?;
    let result = (|| -> TestResult {
        let deadline = Instant::now() + PATIENCE;
        let cli = loop {
            if let Ok(answer) = http(
                TcpStream::connect(listen.to_str().unwrap()),
                "GET",
                "/v1.0/docker/cli",
                "",
            ) {
                break answer;
            }
            if Instant::now() > deadline {
                return Err(format!("`{line}` never answered on {}", listen.display()).into());
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        if !cli.contains("--volume=nvidia_driver_550.54.14:/usr/local/nvidia:ro") {
            return Err(format!("/v1.0/docker/cli answered {cli}").into());
        }
        // Docker's mount of the plugin's volume: it waits for the build from the driver tree.
        let body = r#"{"Name":"nvidia_driver_550.54.14","ID":"help-example"}"#;
        let mount = loop {
            let answer = http(
                UnixStream::connect(&socket),
                "POST",
                "/VolumeDriver.Mount",
                body,
            )?;
            let answer: serde_json::Value =
                serde_json::from_str(answer.rsplit("\r\n\r\n").next().unwrap_or(""))?;
            let building = answer["Err"]
                .as_str()
                .is_some_and(|e| e.contains("still being built"));
            if !building || Instant::now() > deadline {
                break answer;
            }
            std::thread::sleep(Duration::from_millis(200));
        };
        // Docker's mount is the volume's holder while it lasts (issue 37: HOLDERS was empty).
        let listed = run_example(
            "mesos-gpu --simulate dgx1-v100 volume list --json",
            tmp.path(),
        )?;
        if !listed.contains("docker-help-example") {
            return Err(format!("`volume list` shows no holder for the mount: {listed}").into());
        }
        let point = mount["Mountpoint"].as_str().unwrap_or_default();
        if mount["Err"].as_str() != Some("")
            || !point.starts_with(&*scratch_volumes(tmp.path()).to_string_lossy())
        {
            return Err(format!(
                "VolumeDriver.Mount answered {mount}, not a volume of the node's scratch state"
            )
            .into());
        }
        check_volume(Path::new(point).parent().unwrap())
    })();
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let status = child.wait()?;
    let mut log = String::new();
    child.stderr.take().unwrap().read_to_string(&mut log)?;
    result.map_err(|e| format!("{}\nserve's log:\n{log}", e.message().unwrap_or("")))?;
    if !status.success() {
        return Err(format!("serve ended with {status} after SIGTERM:\n{log}").into());
    }
    Ok(())
}

/// One HTTP/1.0 request on a fresh connection; the whole answer.
fn http<S: std::io::Read + std::io::Write>(
    stream: std::io::Result<S>,
    method: &str,
    path: &str,
    body: &str,
) -> Result<String, Failed> {
    let mut stream = stream?;
    write!(
        stream,
        "{method} {path} HTTP/1.0\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer)?;
    if !answer.starts_with("HTTP/1.") || !answer.contains(" 200 ") {
        return Err(format!("{method} {path}: {answer}").into());
    }
    Ok(answer)
}
