//! What `mesos-gpu` writes on stderr: colour only on a terminal that wants it, warnings only from
//! interactive commands unless asked, `info` from the `serve` daemon.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const ESC: char = '\u{1b}';

fn mesos_gpu(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_mesos-gpu"));
    cmd.args(args)
        .env_remove("MESOS_GPU_LOG")
        .env_remove("RUST_LOG")
        .env_remove("NO_COLOR")
        .env_remove("NVML_SIM_CONFIG");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("run mesos-gpu")
}

/// `mesos-gpu args` with stdout and stderr on a pseudo-terminal (util-linux `script`); what
/// the terminal showed.
fn on_terminal(args: &str, env: &[(&str, &str)]) -> String {
    let line = format!("{} {args}", env!("CARGO_BIN_EXE_mesos-gpu"));
    let mut cmd = Command::new("script");
    cmd.args(["-qec", &line, "/dev/null"])
        .env_remove("MESOS_GPU_LOG")
        .env_remove("NO_COLOR")
        .env("TERM", "xterm-256color");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("run script");
    assert!(out.status.success(), "{out:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn no_colour_in_files_pipes_or_for_dumb_terminals() {
    let out = mesos_gpu(
        &["--simulate", "dgx1-v100", "info"],
        &[("MESOS_GPU_LOG", "info"), ("TERM", "xterm-256color")],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains(" INFO "), "{stderr}");
    assert!(!stderr.contains(ESC), "colour in a pipe: {stderr:?}");
    let shown = on_terminal("--simulate k80 info --json", &[("MESOS_GPU_LOG", "info")]);
    assert!(shown.contains(ESC), "a terminal gets colour: {shown:?}");
    for env in [
        [("MESOS_GPU_LOG", "info"), ("TERM", "dumb")],
        [("MESOS_GPU_LOG", "info"), ("NO_COLOR", "1")],
    ] {
        let shown = on_terminal("--simulate k80 info --json", &env);
        assert!(shown.contains("INFO"), "{env:?}: {shown:?}");
        assert!(!shown.contains(ESC), "{env:?}: {shown:?}");
    }
}

#[test]
fn interactive_commands_log_warnings_only_by_default() {
    let out = mesos_gpu(&["--simulate", "dgx1-v100", "info"], &[]);
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "",
        "nothing but warnings"
    );
    let out = mesos_gpu(
        &[
            "--simulate",
            "dgx1-v100",
            "agent-flags",
            "--isolation",
            "gpu/nvidia",
        ],
        &[],
    );
    assert!(out.status.success());
    assert_eq!(String::from_utf8_lossy(&out.stderr), "");
    // Asked for: info lines.
    let out = mesos_gpu(
        &["--simulate", "dgx1-v100", "info"],
        &[("MESOS_GPU_LOG", "info")],
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains(" INFO "));
}

#[test]
fn serve_logs_info_by_default() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("serve.log");
    let socket = dir.path().join("nvidia-docker.sock");
    let mut serve =
        mesos_gpu_testkit::serve::command(env!("CARGO_BIN_EXE_mesos-gpu"), "dgx1-v100", dir.path())
            .args(["--driver-poll", "0", "--listen", "127.0.0.1:0"])
            .env_remove("MESOS_GPU_LOG")
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !socket.exists() {
        assert!(serve.try_wait().unwrap().is_none(), "serve exited");
        assert!(Instant::now() < deadline, "serve did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    serve.kill().unwrap();
    serve.wait().unwrap();
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains(" INFO "), "{text}");
    assert!(!text.contains(ESC), "{text:?}");
}
