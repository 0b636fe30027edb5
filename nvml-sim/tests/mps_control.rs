//! The `nvidia-cuda-mps-control` stand-in, run as a node runs NVIDIA's program: `-d` with
//! `CUDA_MPS_PIPE_DIRECTORY`/`CUDA_MPS_LOG_DIRECTORY`, commands piped into client mode, `quit`;
//! its files, replies and record; one daemon per pipe directory; configured failures and what a
//! supervisor sees of them (a crash, a kill, a refusal to start) and a restart after each.
#![allow(clippy::unwrap_used)] // a failed unwrap fails the test at its line

use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::{Duration, Instant};

use mesos_gpu_testkit::mps::MpsControl;
use serde_json::Value;
use tempfile::TempDir;

/// A per-GPU layout like the isolator's: `<root>/{pipe,log}`.
struct Dirs {
    _root: TempDir,
    pipe: PathBuf,
    log: PathBuf,
}

fn dirs() -> Dirs {
    let root = tempfile::tempdir().unwrap();
    Dirs {
        pipe: root.path().join("pipe"),
        log: root.path().join("log"),
        _root: root,
    }
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn start(mps: &MpsControl, d: &Dirs) -> Output {
    mps.run(&["-d"], &d.pipe, &d.log, "")
}

fn send(mps: &MpsControl, d: &Dirs, commands: &str) -> Output {
    mps.run(&[], &d.pipe, &d.log, commands)
}

fn daemon_pid(d: &Dirs) -> i32 {
    std::fs::read_to_string(d.pipe.join("nvidia-cuda-mps-control.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

fn alive(pid: i32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
        && !std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .unwrap_or_default()
            .contains(") Z ")
}

fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn events<'a>(records: &'a [Value], event: &str) -> Vec<&'a Value> {
    records.iter().filter(|r| r["event"] == event).collect()
}

#[test]
fn daemon_serves_the_control_protocol_and_records_it() {
    let mps = MpsControl::install("{}");
    let d = dirs();
    let out = start(&mps, &d);
    assert!(out.status.success(), "-d: {}", stderr(&out));
    assert!(
        d.pipe.join("control").exists(),
        "the control socket CUDA clients look for"
    );
    assert!(d.pipe.join("control_lock").exists());
    let pid = daemon_pid(&d);
    assert!(alive(pid), "-d returned, the daemon runs on");

    // What NVIDIA's device plugin sends (no trailing newline), then what a supervisor reads.
    let out = send(&mps, &d, "set_default_device_pinned_mem_limit 0 10240M");
    assert!(out.status.success(), "{}", stderr(&out));
    let out = send(
        &mps,
        &d,
        "set_default_active_thread_percentage 25\nget_default_active_thread_percentage\n\
         get_default_device_pinned_mem_limit 0\nget_server_list\n",
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out), "25.0\n25.0\n10240M\n");

    let out = send(&mps, &d, "start_server -uid 0\n");
    let server: i32 = stdout(&out).trim().parse().unwrap();
    assert!(alive(server));
    let out = send(
        &mps,
        &d,
        &format!(
            "get_server_list\nget_active_thread_percentage {server}\nget_device_pinned_mem_limit {server} 0\n"
        ),
    );
    assert_eq!(
        stdout(&out),
        format!("{server}\n25.0\n10240M\n"),
        "a server takes the defaults of its start"
    );

    let out = send(&mps, &d, "set_default_active_thread_percentage 250\n");
    assert_eq!(
        out.status.code(),
        Some(1),
        "a rejected command fails the client"
    );
    assert!(stderr(&out).contains("at most 100"), "{}", stderr(&out));

    let out = send(&mps, &d, "quit\n");
    assert!(out.status.success(), "{}", stderr(&out));
    wait_until("the daemon exits", || !alive(pid));
    assert!(!alive(server), "quit stops the servers");
    assert!(!d.pipe.join("control").exists(), "quit removes the socket");
    let out = send(&mps, &d, "get_server_list\n");
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        stderr(&out).trim(),
        "Cannot find MPS control daemon process"
    );

    let records = mps.records();
    let starts = events(&records, "start");
    assert_eq!(starts.len(), 1);
    assert_eq!(starts[0]["daemon_pid"], pid);
    assert_eq!(starts[0]["pipe_dir"], d.pipe.display().to_string());
    assert_eq!(
        starts[0]["env"]["CUDA_MPS_LOG_DIRECTORY"],
        d.log.display().to_string()
    );
    let commands: Vec<(&str, bool)> = events(&records, "command")
        .iter()
        .map(|r| (r["command"].as_str().unwrap(), r["ok"].as_bool().unwrap()))
        .collect();
    assert_eq!(
        commands,
        [
            ("set_default_device_pinned_mem_limit 0 10240M", true),
            ("set_default_active_thread_percentage 25", true),
            ("get_default_active_thread_percentage", true),
            ("get_default_device_pinned_mem_limit 0", true),
            ("get_server_list", true),
            ("start_server -uid 0", true),
            ("get_server_list", true),
            (
                format!("get_active_thread_percentage {server}").as_str(),
                true
            ),
            (
                format!("get_device_pinned_mem_limit {server} 0").as_str(),
                true
            ),
            ("set_default_active_thread_percentage 250", false),
            ("quit", true),
        ]
    );
    let server_start = events(&records, "server_start");
    assert_eq!(server_start[0]["active_thread_percentage"], 25.0);
    assert_eq!(server_start[0]["pinned_mem_limits"]["0"], "10240M");
    assert_eq!(events(&records, "exit")[0]["reason"], "quit");
    let log = std::fs::read_to_string(d.log.join("control.log")).unwrap();
    assert!(
        log.contains(&format!(
            "Control {pid}] Cmd:set_default_active_thread_percentage 25"
        )),
        "{log}"
    );
}

#[test]
fn one_daemon_per_pipe_directory() {
    let mps = MpsControl::install("{}");
    let (a, b) = (dirs(), dirs());
    assert!(start(&mps, &a).status.success());
    let again = start(&mps, &a);
    assert_eq!(again.status.code(), Some(1));
    assert!(
        stderr(&again).contains("already running"),
        "{}",
        stderr(&again)
    );
    assert!(
        start(&mps, &b).status.success(),
        "another GPU's directory gets its own daemon"
    );
    send(&mps, &a, "set_default_active_thread_percentage 50\n");
    assert_eq!(
        stdout(&send(&mps, &b, "get_default_active_thread_percentage\n")),
        "100.0\n"
    );
    for d in [&a, &b] {
        let pid = daemon_pid(d);
        assert!(send(&mps, d, "quit\n").status.success());
        wait_until("the daemon exits", || !alive(pid));
    }
}

#[test]
fn a_daemon_refusing_to_start_fails_with_its_reason() {
    let mps = MpsControl::install(r#"{"refuse_start": "Failed to start: invalid argument"}"#);
    let d = dirs();
    let out = start(&mps, &d);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("Failed to start: invalid argument"),
        "{}",
        stderr(&out)
    );
    assert!(!d.pipe.join("control").exists());
    assert_eq!(events(&mps.records(), "refused_start").len(), 1);
    // Bad settings are refused with the reason and what is accepted.
    mps.set_settings(r#"{"die_after": 3}"#);
    let out = start(&mps, &d);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("unknown field `die_after`"),
        "{}",
        stderr(&out)
    );
    assert!(
        stderr(&out).contains("die_after_seconds"),
        "{}",
        stderr(&out)
    );
    // Fixed settings: it starts.
    mps.set_settings("{}");
    assert!(start(&mps, &d).status.success());
    let pid = daemon_pid(&d);
    send(&mps, &d, "quit\n");
    wait_until("the daemon exits", || !alive(pid));
}

#[test]
fn a_crashed_daemon_is_seen_and_restarted() {
    let mps = MpsControl::install(r#"{"die_after_seconds": 0.3}"#);
    let d = dirs();
    assert!(start(&mps, &d).status.success());
    let pid = daemon_pid(&d);
    wait_until("the daemon dies", || !alive(pid));
    assert!(
        d.pipe.join("control").exists(),
        "a crash leaves the socket behind"
    );
    let out = send(&mps, &d, "get_default_active_thread_percentage\n");
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        stderr(&out).trim(),
        "Cannot find MPS control daemon process"
    );
    assert_eq!(
        events(&mps.records(), "exit")[0]["reason"],
        "die_after_seconds"
    );

    // The supervisor restarts it; the stale socket does not stop the new daemon.
    mps.set_settings(r#"{"die_after_commands": 2}"#);
    assert!(start(&mps, &d).status.success());
    let pid = daemon_pid(&d);
    assert_eq!(
        stdout(&send(&mps, &d, "get_default_active_thread_percentage\n")),
        "100.0\n"
    );
    send(&mps, &d, "get_server_list\n");
    wait_until("the daemon dies after two commands", || !alive(pid));

    // Killed by a signal: nothing recorded, clients find no daemon, a restart works.
    mps.set_settings("{}");
    assert!(start(&mps, &d).status.success());
    let pid = daemon_pid(&d);
    assert!(
        std::process::Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .status()
            .unwrap()
            .success()
    );
    wait_until("the daemon is killed", || !alive(pid));
    assert_eq!(send(&mps, &d, "get_server_list\n").status.code(), Some(1));
    assert!(start(&mps, &d).status.success());
    let pid = daemon_pid(&d);
    assert!(send(&mps, &d, "quit\n").status.success());
    wait_until("the daemon exits", || !alive(pid));
    let starts = events(&mps.records(), "start").len();
    assert_eq!(starts, 4);
}

#[test]
fn usage_and_bad_arguments() {
    let mps = MpsControl::install("{}");
    let d = dirs();
    let help = mps.run(&["-h"], &d.pipe, &d.log, "");
    assert!(help.status.success());
    assert!(stdout(&help).contains("CUDA_MPS_PIPE_DIRECTORY"));
    let bad = mps.run(&["--daemon"], &d.pipe, &d.log, "");
    assert_eq!(bad.status.code(), Some(2));
    assert!(
        stderr(&bad).contains("unknown arguments \"--daemon\""),
        "{}",
        stderr(&bad)
    );
}
