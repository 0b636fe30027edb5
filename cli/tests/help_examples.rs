//! The `--simulate` examples of `volume`, `docker-args` and `serve --help` run as written (the
//! command line copied from the help, with this build's `mesos-gpu` first on `PATH`): a simulated
//! node brings a simulated driver tree, so the volume is built from it, `docker-args` binds it,
//! and `serve`'s volume plugin mounts it. Each runs with a fresh `TMPDIR`, so the simulated node's
//! scratch state (its volume root included) starts empty and the example passes only by building
//! the volume there, never reading or writing the host's. Needs root (`ldconfig -r`).
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
    let mut paths: Vec<Vec<String>> = Vec::new();
    for command in subcommands(&[]) {
        let nested = subcommands(&[command.as_str()]);
        if nested.is_empty() {
            paths.push(vec![command]);
        } else {
            paths.extend(nested.into_iter().map(|sub| vec![command.clone(), sub]));
        }
    }
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
    check_volume(root)
}

fn serve_example() -> TestResult {
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
