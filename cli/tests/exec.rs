//! `mesos-gpu exec` as a process, on a simulated 8-GPU node with mknod'ed device nodes: the
//! command (this test binary in "opener" mode) gets `ENXIO` (allowed, no driver) from exactly its
//! GPUs' nodes and `EPERM` from the others, on cgroups v1 and v2; exit statuses pass through;
//! SIGINT is forwarded and everything is cleaned up; bad input is refused with nothing left.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Output, Stdio};
use std::time::{Duration, Instant};

use libtest_mimic::{Arguments, Failed, Trial};
use mesos_gpu_testkit::{Host, Need, needs, unique_name};

const OPENER_ENV: &str = "MGPU_EXEC_TEST_OPEN";

type TestResult = Result<(), Failed>;

fn main() -> ExitCode {
    if let Some(dir) = std::env::var_os(OPENER_ENV) {
        return opener(Path::new(&dir));
    }
    let host = Host::probe();
    let mut trials = Vec::new();
    for (version, need) in [("v1", Need::Cgroup1), ("v2", Need::Cgroup2)] {
        let add = |name: &str, f: fn(&'static str) -> TestResult| {
            needs(
                &host,
                &[Need::Root, need],
                Trial::test(format!("{version}_{name}"), move || f(version)),
            )
        };
        trials.push(add(
            "command_reaches_only_its_gpus",
            command_reaches_only_its_gpus,
        ));
        trials.push(add(
            "exit_status_passes_through",
            exit_status_passes_through,
        ));
        trials.push(add(
            "sigint_is_forwarded_and_cleaned_up",
            sigint_is_forwarded_and_cleaned_up,
        ));
        trials.push(add("bad_gpus_change_nothing", bad_gpus_change_nothing));
    }
    trials.push(Trial::test(
        "simulation_without_dev_root_is_refused",
        simulation_without_dev_root_is_refused,
    ));
    libtest_mimic::run(&Arguments::from_args(), trials).exit_code()
}

/// Opener mode: open every `nvidia*` node under `dir` and print `<name> <errno|0>`.
fn opener(dir: &Path) -> ExitCode {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    for name in names {
        let errno = match std::fs::OpenOptions::new().read(true).open(dir.join(&name)) {
            Ok(_) => 0,
            Err(e) => e.raw_os_error().unwrap_or(-1),
        };
        println!("{name} {errno}");
    }
    println!(
        "visible {}",
        std::env::var("NVIDIA_VISIBLE_DEVICES").unwrap_or_default()
    );
    ExitCode::SUCCESS
}

/// A simulated node's device nodes, a work dir and a unique cgroups root, removed on drop.
struct Env {
    version: &'static str,
    dev: tempfile::TempDir,
    work: tempfile::TempDir,
    root: String,
}

impl Env {
    fn new(version: &'static str) -> Env {
        let dev = tempfile::Builder::new()
            .prefix("mgpu-test-exec-dev")
            .tempdir()
            .unwrap();
        let mut nodes: Vec<(String, u32, u32)> =
            (0..8).map(|m| (format!("nvidia{m}"), 195, m)).collect();
        nodes.push(("nvidiactl".into(), 195, 255));
        nodes.push(("nvidia-uvm".into(), 240, 0));
        for (name, major, minor) in nodes {
            let st = Command::new("mknod")
                .arg(dev.path().join(name))
                .args(["c", &major.to_string(), &minor.to_string()])
                .status()
                .unwrap();
            assert!(st.success(), "mknod");
        }
        let work = tempfile::Builder::new()
            .prefix("mgpu-test-exec-work")
            .tempdir()
            .unwrap();
        Env {
            version,
            dev,
            work,
            root: unique_name("exec"),
        }
    }

    fn parent(&self) -> PathBuf {
        match self.version {
            "v1" => Path::new("/sys/fs/cgroup/devices").join(&self.root),
            _ => mesos_gpu_testkit::cgroup2_root().unwrap().join(&self.root),
        }
    }

    fn command(&self, gpus: &str, cmd: &[&str]) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_mesos-gpu"));
        c.args(["--simulate", "dgx1-v100", "--dev-root"])
            .arg(self.dev.path())
            .args([
                "exec",
                "--gpus",
                gpus,
                "--cgroup-version",
                self.version,
                "--cgroups-root",
                &self.root,
                "--pool-dir",
            ])
            .arg(self.work.path())
            .arg("--")
            .args(cmd)
            .env("MESOS_GPU_LOG", "warn");
        c
    }

    fn run(&self, gpus: &str, cmd: &[&str]) -> Output {
        self.command(gpus, cmd).output().unwrap()
    }

    /// Fails unless no container cgroup is left and the checkpoint holds no container.
    fn check_clean(&self) -> TestResult {
        let left: Vec<_> = std::fs::read_dir(self.parent())
            .map(|d| {
                d.flatten()
                    .filter(|e| e.path().is_dir())
                    .map(|e| e.path())
                    .collect()
            })
            .unwrap_or_default();
        check(left.is_empty(), format!("cgroups left: {left:?}"))?;
        let pool = self.work.path().join("gpu/pool.json");
        if pool.exists() {
            let text = std::fs::read_to_string(&pool).unwrap();
            check(
                text.contains("\"reservations\": {}"),
                format!("pool not empty: {text}"),
            )?;
        }
        let private: Vec<_> = std::fs::read_dir(self.work.path().join("exec"))
            .map(|d| d.flatten().map(|e| e.path()).collect())
            .unwrap_or_default();
        check(
            private.is_empty(),
            format!("exec records left: {private:?}"),
        )
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        let parent = self.parent();
        if let Ok(dir) = std::fs::read_dir(&parent) {
            for e in dir.flatten().filter(|e| e.path().is_dir()) {
                let procs =
                    std::fs::read_to_string(e.path().join("cgroup.procs")).unwrap_or_default();
                for pid in procs.split_whitespace() {
                    let _ = Command::new("kill").args(["-9", pid]).status();
                }
                std::thread::sleep(Duration::from_millis(50));
                let _ = std::fs::remove_dir(e.path());
            }
        }
        let _ = std::fs::remove_dir(parent);
    }
}

fn check(cond: bool, what: impl Into<String>) -> TestResult {
    if cond {
        Ok(())
    } else {
        Err(Failed::from(what.into()))
    }
}

fn text(out: &Output) -> String {
    format!(
        "status {}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn command_reaches_only_its_gpus(version: &'static str) -> TestResult {
    let env = Env::new(version);
    let me = std::env::current_exe().unwrap();
    let out = env
        .command("3", &[me.to_str().unwrap()])
        .env(OPENER_ENV, env.dev.path())
        .output()
        .unwrap();
    check(out.status.success(), text(&out))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    // The minors exec said it allocated: "/dev/nvidia<m>)" in the GPUs line.
    let listed: BTreeSet<String> = stderr
        .lines()
        .find(|l| l.trim_start().starts_with("GPUs:"))
        .unwrap_or("")
        .split("/dev/")
        .skip(1)
        .filter_map(|s| s.split(')').next())
        .map(str::to_owned)
        .collect();
    check(
        listed.len() == 3,
        format!("three GPUs listed: {}", text(&out)),
    )?;
    let mut allowed = BTreeSet::new();
    for line in stdout.lines() {
        let Some((name, errno)) = line.split_once(' ') else {
            continue;
        };
        match (name, errno.parse::<i32>()) {
            ("visible", _) => check(
                errno.split(',').count() == 3 && errno.starts_with("GPU-"),
                format!("NVIDIA_VISIBLE_DEVICES={errno}"),
            )?,
            ("nvidiactl" | "nvidia-uvm", Ok(e)) => {
                check(e == libc_enxio(), format!("{name}: errno {e}"))?
            }
            (_, Ok(e)) if e == libc_enxio() => {
                allowed.insert(name.to_owned());
            }
            (_, Ok(e)) => check(
                e == libc_eperm(),
                format!("{name}: errno {e}, expected EPERM"),
            )?,
            _ => return Err(format!("bad line {line:?}").into()),
        }
    }
    check(
        allowed == listed,
        format!("allowed {allowed:?}, allocated {listed:?}"),
    )?;
    env.check_clean()
}

const fn libc_enxio() -> i32 {
    6
}

const fn libc_eperm() -> i32 {
    1
}

fn exit_status_passes_through(version: &'static str) -> TestResult {
    let env = Env::new(version);
    let out = env.run("1", &["busybox", "sh", "-c", "exit 7"]);
    check(out.status.code() == Some(7), text(&out))?;
    env.check_clean()?;
    let out = env.run("0", &["busybox", "sh", "-c", "kill -9 $$"]);
    check(out.status.code() == Some(137), text(&out))?;
    env.check_clean()?;
    let out = env.run("1", &["/nonexistent/command"]);
    check(out.status.code() == Some(127), text(&out))?;
    env.check_clean()
}

fn sigint_is_forwarded_and_cleaned_up(version: &'static str) -> TestResult {
    let env = Env::new(version);
    let mut child = env
        .command("2", &["busybox", "sleep", "1000"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    // Wait until the sleep runs in the container's cgroup.
    loop {
        let running = std::fs::read_dir(env.parent())
            .map(|d| {
                d.flatten().any(|e| {
                    std::fs::read_to_string(e.path().join("cgroup.procs"))
                        .is_ok_and(|p| !p.trim().is_empty())
                })
            })
            .unwrap_or(false);
        if running {
            break;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err("the command never started in its cgroup".into());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let st = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    let out = child.wait_with_output().unwrap();
    check(st.success(), "kill -INT")?;
    check(out.status.code() == Some(130), text(&out))?;
    env.check_clean()
}

fn bad_gpus_change_nothing(version: &'static str) -> TestResult {
    let env = Env::new(version);
    // Not a whole number: a usage error, refused by clap (exit 2).
    for bad in ["1.5", "-1", "NaN"] {
        let out = env.run(bad, &["busybox", "true"]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        check(out.status.code() == Some(2), text(&out))?;
        check(
            stderr.contains(&format!("\"{bad}\" is not a number of GPUs")),
            text(&out),
        )?;
        env.check_clean()?;
    }
    // More than the node has: the command fails (exit 1).
    let out = env.run("9", &["busybox", "true"]);
    check(out.status.code() == Some(1), text(&out))?;
    check(
        String::from_utf8_lossy(&out.stderr)
            .contains("gpus=9: expected a whole number from 0 to 8"),
        text(&out),
    )?;
    env.check_clean()
}

fn simulation_without_dev_root_is_refused() -> TestResult {
    let out = Command::new(env!("CARGO_BIN_EXE_mesos-gpu"))
        .args([
            "--simulate",
            "dgx1-v100",
            "exec",
            "--gpus",
            "1",
            "--",
            "true",
        ])
        .output()
        .unwrap();
    check(out.status.code() == Some(1), text(&out))?;
    check(
        String::from_utf8_lossy(&out.stderr).contains("pass --dev-root"),
        text(&out),
    )
}
