//! `mesos-gpu exec` as a process, on a simulated 8-GPU node with mknod'ed device nodes: the
//! command (this test binary in "opener" mode) gets `ENXIO` (allowed, no driver) from exactly its
//! GPUs' nodes and `EPERM` from the others, on cgroups v1 and v2; exit statuses pass through;
//! SIGINT is forwarded and everything is cleaned up; bad input is refused with nothing left.
//!
//! Issue 13 (the node's one pool): two execs run side by side on disjoint GPUs; SIGHUP cleans
//! up as SIGINT does; a SIGKILLed exec's GPUs come back once its command is gone (cgroup and
//! record removed); `docker-args` and `exec` on one pool directory never book a GPU twice, and
//! the refusal says what the GPUs are doing; exec honours the health checkpoint of the pool.
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
        trials.push(add(
            "sighup_is_forwarded_and_cleaned_up",
            sighup_is_forwarded_and_cleaned_up,
        ));
        trials.push(add(
            "two_execs_run_side_by_side_on_disjoint_gpus",
            two_execs_run_side_by_side,
        ));
        trials.push(add(
            "killed_exec_gpus_come_back_when_its_command_ends",
            killed_exec_gpus_come_back,
        ));
        trials.push(add(
            "docker_args_and_exec_share_one_pool",
            docker_args_and_exec_share_one_pool,
        ));
        trials.push(add(
            "gpu_list_and_release_a_killed_exec",
            gpu_list_and_release,
        ));
        trials.push(add(
            "exec_refuses_an_unhealthy_gpu",
            exec_refuses_an_unhealthy_gpu,
        ));
        trials.push(add(
            "execs_share_a_gpu_and_refuse_what_fits_none",
            execs_share_a_gpu,
        ));
        trials.push(add(
            "gpu_top_shows_who_holds_each_gpu_and_what_it_uses",
            gpu_top_shows_who_holds_each_gpu,
        ));
        trials.push(add(
            "exec_names_the_mig_device_it_grants",
            exec_names_the_mig_device_it_grants,
        ));
    }
    trials.push(needs(
        &host,
        &[Need::Root, Need::Cgroup1, Need::Cpuset1],
        Trial::test("v1_exec_pins_the_command_to_its_gpus_cpu", numa_pinning),
    ));
    trials.push(needs(
        &host,
        &[Need::Root, Need::Cgroup1],
        Trial::test(
            "simulated_exec_runs_the_drivers_nvidia_smi_by_name",
            simulated_exec_runs_the_drivers_nvidia_smi_by_name,
        ),
    ));
    trials.push(needs(
        &host,
        &[Need::Root, Need::Cgroup1],
        Trial::test(
            "simulation_without_dev_root_runs_on_the_nodes_of_its_driver",
            simulation_without_dev_root_runs_on_the_nodes_of_its_driver,
        ),
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
        self.command_on("dgx1-v100", gpus, cmd)
    }

    /// [`Self::command`] on the shipped simulated node `node`.
    fn command_on(&self, node: &str, gpus: &str, cmd: &[&str]) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_mesos-gpu"));
        c.args(["--simulate", node, "--dev-root"])
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
    signal_is_forwarded_and_cleaned_up(version, "INT", 130)
}

fn sighup_is_forwarded_and_cleaned_up(version: &'static str) -> TestResult {
    signal_is_forwarded_and_cleaned_up(version, "HUP", 129)
}

/// Waits until `n` containers under the cgroups root run a process.
fn wait_running(env: &Env, n: usize, child: &mut std::process::Child) -> TestResult {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let running = std::fs::read_dir(env.parent())
            .map(|d| {
                d.flatten()
                    .filter(|e| {
                        std::fs::read_to_string(e.path().join("cgroup.procs"))
                            .is_ok_and(|p| !p.trim().is_empty())
                    })
                    .count()
            })
            .unwrap_or(0);
        if running >= n {
            return Ok(());
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err("the command never started in its cgroup".into());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn wait_for_file(path: &Path, child: &mut std::process::Child) -> TestResult {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !path.exists() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("the command never wrote {}", path.display()).into());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

fn signal_is_forwarded_and_cleaned_up(version: &'static str, sig: &str, code: i32) -> TestResult {
    let env = Env::new(version);
    let mut child = env
        .command("2", &["busybox", "sleep", "1000"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_running(&env, 1, &mut child)?;
    let st = Command::new("kill")
        .args([&format!("-{sig}"), &child.id().to_string()])
        .status()
        .unwrap();
    let out = child.wait_with_output().unwrap();
    check(st.success(), format!("kill -{sig}"))?;
    check(out.status.code() == Some(code), text(&out))?;
    env.check_clean()
}

/// The GPU indices an exec printed (`  GPUs: 0 (GPU-…, /dev/nvidia0), …`).
fn granted(stderr: &str) -> BTreeSet<u32> {
    stderr
        .lines()
        .filter_map(|l| l.trim().strip_prefix("GPUs: "))
        .flat_map(|l| l.split("), "))
        .filter_map(|g| g.split_whitespace().next()?.parse().ok())
        .collect()
}

fn two_execs_run_side_by_side(version: &'static str) -> TestResult {
    let env = Env::new(version);
    let mut first = env
        .command("4", &["busybox", "sleep", "1000"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_running(&env, 1, &mut first)?;
    let started = Instant::now();
    let second = env.run("4", &["busybox", "true"]);
    let waited = started.elapsed();
    let _ = Command::new("kill")
        .args(["-TERM", &first.id().to_string()])
        .status();
    let first = first.wait_with_output().unwrap();
    check(second.status.success(), text(&second))?;
    check(
        waited < Duration::from_secs(2),
        format!("the second exec waited {waited:?} for the first"),
    )?;
    let (a, b) = (
        granted(&String::from_utf8_lossy(&first.stderr)),
        granted(&String::from_utf8_lossy(&second.stderr)),
    );
    check(
        a.len() == 4 && b.len() == 4 && a.is_disjoint(&b),
        format!("GPUs {a:?} and {b:?}"),
    )?;
    env.check_clean()
}

/// Starts an exec of `gpus` GPUs whose command runs until the returned marker file exists, and
/// SIGKILLs the exec (not its command) once the command runs.
fn kill_exec_while_its_command_runs(env: &Env, gpus: &str) -> Result<PathBuf, Failed> {
    let marker = env.work.path().join("go-on");
    let started = env.work.path().join("started");
    let script = format!(
        "busybox touch {}; while [ ! -e {} ]; do busybox sleep 0.05; done",
        started.display(),
        marker.display()
    );
    let mut exec = env
        .command(gpus, &["busybox", "sh", "-c", &script])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_running(env, 1, &mut exec)?;
    // In its cgroup is not yet running: the launcher waits there for exec's go, and a killed
    // exec never sends it. Kill exec once the command itself runs.
    wait_for_file(&started, &mut exec)?;
    exec.kill().unwrap();
    exec.wait().unwrap();
    Ok(marker)
}

fn killed_exec_gpus_come_back(version: &'static str) -> TestResult {
    let env = Env::new(version);
    let marker = kill_exec_while_its_command_runs(&env, "8")?;
    // Its command still runs: its GPUs stay reserved.
    let refused = env.run("1", &["busybox", "true"]);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    check(
        refused.status.code() == Some(1)
            && stderr.contains("1 asked; 0 free, 0 unhealthy, 0 quarantined, 8 held"),
        text(&refused),
    )?;
    // The command ends: the next request frees them, removing the cgroup and the record.
    std::fs::write(&marker, b"").unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let out = loop {
        let out = env.run("8", &["busybox", "true"]);
        if out.status.success() || Instant::now() > deadline {
            break out;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    check(out.status.success(), text(&out))?;
    env.check_clean()
}

fn gpu(env: &Env, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_mesos-gpu"))
        .arg("gpu")
        .args(args)
        .arg("--pool-dir")
        .arg(env.work.path())
        .env("MESOS_GPU_LOG", "warn")
        .output()
        .unwrap()
}

fn gpu_list_and_release(version: &'static str) -> TestResult {
    let env = Env::new(version);
    let marker = kill_exec_while_its_command_runs(&env, "3")?;
    let listed: serde_json::Value =
        serde_json::from_slice(&gpu(&env, &["list", "--json"]).stdout).unwrap();
    let entry = &listed["reservations"][0];
    let id = entry["id"].as_str().unwrap_or_default().to_owned();
    check(
        id.starts_with("exec-")
            && entry["owner"]["kind"] == "process"
            && entry["gpus"].as_array().map(Vec::len) == Some(3)
            && entry["liveness"]["state"] == "alive"
            && entry["liveness"]["why"]
                .as_str()
                .is_some_and(|w| w.contains("has exited") && w.contains("still runs")),
        format!("{listed:#}"),
    )?;
    let refused = gpu(&env, &["release", &id]);
    check(
        refused.status.code() == Some(1)
            && String::from_utf8_lossy(&refused.stderr).contains("pass --force"),
        text(&refused),
    )?;
    std::fs::write(&marker, b"").unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let table = String::from_utf8_lossy(&gpu(&env, &["list"]).stdout).into_owned();
        if table.contains(" dead ") {
            break;
        }
        if Instant::now() > deadline {
            return Err(format!("never dead:\n{table}").into());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let released = gpu(&env, &["release", "--dead"]);
    check(
        released.status.success()
            && String::from_utf8_lossy(&released.stdout).contains(&format!("released {id}")),
        text(&released),
    )?;
    let table = String::from_utf8_lossy(&gpu(&env, &["list"]).stdout).into_owned();
    check(table.contains("no reservations"), table)?;
    env.check_clean()
}

/// `gpu top` on a node where an exec holds 2 GPUs: each GPU with its holder (the exec, `process`,
/// alive) or `free`; with usage from a running `serve` (utilisation, and the holder's processes'
/// memory, from the simulated node's figures), from the pool alone when asked, and saying why
/// there is no usage when the agent named does not answer.
fn gpu_top_shows_who_holds_each_gpu(version: &'static str) -> TestResult {
    let env = Env::new(version);
    // The DGX-1, each GPU busy at its own figures: GPU i at 10·i+5 %, one process of i+1 GiB,
    // and half a GiB more in use on the GPU than its processes use.
    let mut node: serde_json::Value = mesos_gpu_testkit::nvml_sim::shipped_description("dgx1-v100");
    for (i, gpu) in node["gpus"].as_array_mut().unwrap().iter_mut().enumerate() {
        let i = i as u64;
        gpu["utilization"] = serde_json::json!({"gpu": 10 * i + 5, "memory": i});
        gpu["processes"] = serde_json::json!([{"pid": 4000 + i, "used_memory": (i + 1) << 30}]);
        gpu["memory"]["used"] = serde_json::json!(((i + 1) << 30) + (512 << 20));
    }
    let config = env.work.path().join("busy-dgx1.json");
    std::fs::write(&config, node.to_string()).unwrap();
    let config_arg = config.to_str().unwrap();
    let marker = env.work.path().join("go-on");
    let script = format!(
        "while [ ! -e {} ]; do busybox sleep 0.05; done",
        marker.display()
    );
    let mut exec = env
        .command_on(config_arg, "2", &["busybox", "sh", "-c", &script])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_running(&env, 1, &mut exec)?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .unwrap()
        .port();
    let mut serve = Command::new(env!("CARGO_BIN_EXE_mesos-gpu"))
        .args(["--simulate", config_arg, "serve", "--listen"])
        .arg(format!("127.0.0.1:{port}"))
        .arg("--plugin-socket")
        .arg(env.work.path().join("plugin.sock"))
        .env("MESOS_GPU_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let top = |args: &[&str]| -> Output {
        Command::new(env!("CARGO_BIN_EXE_mesos-gpu"))
            .args(["--simulate", config_arg, "gpu", "top", "--pool-dir"])
            .arg(env.work.path())
            .args(args)
            .env("MESOS_GPU_LOG", "warn")
            .output()
            .unwrap()
    };
    let serve_url = format!("http://localhost:{port}");
    let mut docker_id = None;
    let result = (|| -> TestResult {
        let deadline = Instant::now() + Duration::from_secs(20);
        let shown = loop {
            let out = top(&["--json", "--source", "serve", "--serve", &serve_url]);
            let shown: serde_json::Value =
                serde_json::from_slice(&out.stdout).map_err(|e| format!("{e}: {}", text(&out)))?;
            if shown["source"] == "serve" || Instant::now() > deadline {
                break shown;
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        check(shown["source"] == "serve", format!("{shown:#}"))?;
        let gpus = shown["gpus"].as_array().cloned().unwrap_or_default();
        let held: Vec<&serde_json::Value> = gpus
            .iter()
            .filter(|g| g["holders"] != serde_json::json!([]))
            .collect();
        check(gpus.len() == 8 && held.len() == 2, format!("{shown:#}"))?;
        for gpu in &gpus {
            let i = gpu["index"].as_u64().unwrap_or(99);
            check(
                gpu["utilization_gpu"] == 10 * i + 5
                    && gpu["memory_used"] == ((i + 1) << 30) + (512 << 20),
                format!("GPU {i}'s usage is not the node's: {gpu:#}"),
            )?;
        }
        for gpu in held {
            let holder = &gpu["holders"][0];
            let i = gpu["index"].as_u64().unwrap_or(99);
            check(
                holder["owner"]
                    .as_str()
                    .is_some_and(|o| o.starts_with("exec-"))
                    && holder["containerizer"] == "process"
                    && holder["state"] == "alive"
                    && holder["memory_used"] == (i + 1) << 30,
                format!("{gpu:#}"),
            )?;
        }
        let table = top(&["--source", "pool"]);
        let table = String::from_utf8_lossy(&table.stdout).into_owned();
        check(
            table.contains("no usage (--source pool)")
                && table.matches("(process, alive)").count() == 2
                && table.matches(" free").count() == 6,
            format!("the pool-only table:\n{table}"),
        )?;
        // A Docker task's reservation, its holder named as the agent's hook names it.
        let docker = Command::new(env!("CARGO_BIN_EXE_mesos-gpu"))
            .args(["--simulate", config_arg, "docker-args", "--gpus", "1"])
            .args(["--task-id", "train.7f3a", "--task-name", "train"])
            .args(["--executor-id", "train.7f3a", "--framework-id", "fw-0001"])
            .arg("--pool-dir")
            .arg(env.work.path())
            .arg("--docker-state-dir")
            .arg(env.work.path().join("docker"))
            .env("MESOS_GPU_LOG", "warn")
            .output()
            .unwrap();
        check(docker.status.success(), text(&docker))?;
        docker_id = String::from_utf8_lossy(&docker.stdout)
            .split_whitespace()
            .find_map(|a| a.strip_prefix("--name=mesos-"))
            .map(str::to_owned);
        let table = top(&["--source", "pool"]);
        let table = String::from_utf8_lossy(&table.stdout).into_owned();
        check(
            table.contains("task train (train.7f3a) of fw-0001: ")
                && table.matches("(docker, alive)").count() == 1,
            format!("the Docker task's holder in:\n{table}"),
        )?;
        let shown: serde_json::Value =
            serde_json::from_slice(&top(&["--json", "--source", "pool"]).stdout).unwrap();
        let docker_holders: Vec<&serde_json::Value> = shown["gpus"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|g| g["holders"].as_array().into_iter().flatten())
            .filter(|h| h["containerizer"] == "docker")
            .collect();
        check(
            docker_holders.len() == 1
                && docker_holders[0]["holder"]
                    == serde_json::json!({"executor_id": "train.7f3a", "framework_id": "fw-0001",
                        "task_id": "train.7f3a", "task_name": "train"}),
            format!("{shown:#}"),
        )?;
        let nobody = top(&[
            "--json",
            "--source",
            "agent",
            "--agent",
            "http://127.0.0.1:1",
        ]);
        let nobody: serde_json::Value = serde_json::from_slice(&nobody.stdout).unwrap();
        check(
            nobody["source"] == "pool"
                && nobody["no_usage"].as_str().is_some_and(|w| {
                    w.contains("agent: cannot read http://127.0.0.1:1/mesos-gpu/containers")
                }),
            format!("{nobody:#}"),
        )
    })();
    let _ = serve.kill();
    let _ = serve.wait();
    if let Some(id) = docker_id {
        let released = Command::new(env!("CARGO_BIN_EXE_mesos-gpu"))
            .args(["--simulate", config_arg, "docker-args", "--release", &id])
            .arg("--pool-dir")
            .arg(env.work.path())
            .arg("--docker-state-dir")
            .arg(env.work.path().join("docker"))
            .output()
            .unwrap();
        check(released.status.success(), text(&released))?;
    }
    std::fs::write(&marker, b"").unwrap();
    let ended = exec.wait().unwrap();
    result?;
    check(ended.success(), format!("exec ended {ended}"))?;
    env.check_clean()
}

fn docker_args_and_exec_share_one_pool(version: &'static str) -> TestResult {
    let env = Env::new(version);
    let docker_work = env.work.path().join("docker");
    let out = Command::new(env!("CARGO_BIN_EXE_mesos-gpu"))
        .args(["--simulate", "dgx1-v100", "docker-args", "--gpus", "8"])
        .args(["--plugin", "--docker-state-dir"])
        .arg(&docker_work)
        .env("MESOS_GPU_POOL_DIR", env.work.path())
        .env("MESOS_GPU_LOG", "warn")
        .output()
        .unwrap();
    check(out.status.success(), text(&out))?;
    let name = String::from_utf8_lossy(&out.stdout);
    let id = name
        .split_whitespace()
        .find_map(|a| a.strip_prefix("--name=mesos-"))
        .unwrap_or_default()
        .to_owned();
    let refused = env.run("8", &["busybox", "true"]);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    check(
        refused.status.code() == Some(1)
            && stderr.contains(
                "8 asked; 0 free, 0 unhealthy, 0 quarantined, 8 held (run `mesos-gpu gpu list`)",
            ),
        text(&refused),
    )?;
    let released = Command::new(env!("CARGO_BIN_EXE_mesos-gpu"))
        .args(["--simulate", "dgx1-v100", "docker-args", "--release", &id])
        .arg("--docker-state-dir")
        .arg(&docker_work)
        .env("MESOS_GPU_POOL_DIR", env.work.path())
        .output()
        .unwrap();
    check(released.status.success(), text(&released))?;
    let out = env.run("8", &["busybox", "true"]);
    check(out.status.success(), text(&out))?;
    env.check_clean()
}

fn exec_refuses_an_unhealthy_gpu(version: &'static str) -> TestResult {
    let env = Env::new(version);
    // An agent's health checkpoint, registered in the pool (as the module does), fails GPU 3.
    let agent = env.work.path().join("agent");
    std::fs::create_dir_all(agent.join("gpu")).unwrap();
    std::fs::write(
        agent.join("gpu/health.json"),
        mesos_gpu_testkit::nvml_sim::health_checkpoint("dgx1-v100", 3).to_string(),
    )
    .unwrap();
    std::fs::create_dir_all(env.work.path().join("gpu")).unwrap();
    std::fs::write(
        env.work.path().join("gpu/pool.json"),
        serde_json::json!({"version": 1, "reservations": {}, "health_dirs": [agent]}).to_string(),
    )
    .unwrap();
    let refused = env.run("8", &["busybox", "true"]);
    check(
        refused.status.code() == Some(1)
            && String::from_utf8_lossy(&refused.stderr)
                .contains("8 asked; 7 free, 1 unhealthy, 0 quarantined, 0 held"),
        text(&refused),
    )?;
    let out = env.run("7", &["busybox", "true"]);
    check(out.status.success(), text(&out))?;
    let gpus = granted(&String::from_utf8_lossy(&out.stderr));
    check(!gpus.contains(&3), format!("granted {gpus:?}"))?;
    env.check_clean()
}

/// Issue 37: on a node whose GPUs are in MIG mode, `exec --gpus 1` is granted a MIG device and
/// says so (it printed `GPUs: none`), naming the device its variables name.
fn exec_names_the_mig_device_it_grants(version: &'static str) -> TestResult {
    let env = Env::new(version);
    let out = env
        .command_on("dgx-a100-mig", "1", &["busybox", "true"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let device = stderr
        .lines()
        .find_map(|l| l.trim().strip_prefix("env: NVIDIA_VISIBLE_DEVICES="))
        .unwrap_or_default();
    check(
        out.status.success()
            && device.starts_with("MIG-")
            && stderr.contains(&format!("  MIG devices: {device}\n"))
            && !stderr.contains("GPUs: none\n"),
        text(&out),
    )?;
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

/// Issue 37: `exec --simulate` without `--dev-root` runs (it refused), on the nodes the
/// simulated driver numbers, made in the node's scratch directory; the command is told the node
/// (`NVML_SIM_CONFIG`, `NVML_SIM_DEV_ROOT`), so the volume's `nvidia-smi` needs nothing by hand.
fn simulation_without_dev_root_runs_on_the_nodes_of_its_driver() -> TestResult {
    let env = Env::new("v1");
    let tmp = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_mesos-gpu"))
        .args(["--simulate", "dgx1-v100", "exec", "--gpus", "1"])
        .args(["--cgroup-version", "v1", "--cgroups-root", &env.root])
        .arg("--pool-dir")
        .arg(env.work.path())
        .args([
            "--",
            "sh",
            "-c",
            "echo config=$NVML_SIM_CONFIG; echo dev=$NVML_SIM_DEV_ROOT; ls $NVML_SIM_DEV_ROOT",
        ])
        .env("TMPDIR", tmp.path())
        .env("MESOS_GPU_LOG", "warn")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let dev = tmp.path().join("mesos-gpu-sim/dgx1-v100/dev");
    check(
        out.status.success()
            && stdout.contains(&format!("dev={}\n", dev.display()))
            && stdout.contains("config=/")
            && stdout.lines().any(|l| l == "nvidia7")
            && stdout.lines().any(|l| l == "nvidiactl"),
        text(&out),
    )?;
    env.check_clean()
}

/// `exec --gpus 2 -- nvidia-smi -L` on a simulated node runs the simulated driver's nvidia-smi
/// found on PATH, as on a GPU host (it was "nvidia-smi: not found"), and it lists exactly the
/// two GPUs exec granted.
fn simulated_exec_runs_the_drivers_nvidia_smi_by_name() -> TestResult {
    let env = Env::new("v1");
    let tmp = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_mesos-gpu"))
        .args(["--simulate", "dgx1-v100", "exec", "--gpus", "2"])
        .args(["--cgroup-version", "v1", "--cgroups-root", &env.root])
        .arg("--pool-dir")
        .arg(env.work.path())
        .args(["--", "nvidia-smi", "-L"])
        .env("TMPDIR", tmp.path())
        .env("MESOS_GPU_LOG", "warn")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let listed: BTreeSet<u32> = stdout
        .lines()
        .filter_map(|l| l.strip_prefix("GPU ")?.split(':').next()?.parse().ok())
        .collect();
    check(
        out.status.success()
            && listed.len() == 2
            && listed == granted(&String::from_utf8_lossy(&out.stderr)),
        text(&out),
    )?;
    env.check_clean()
}

/// Issue 18: on `numa-2cpu` (GPU 0 local to CPU 0), `--numa-pinning` runs the command on CPU 0
/// only, in a cpuset cgroup removed afterwards; with `--cpus 1.5` it is left on every CPU and
/// says why; `--cpus` without `--numa-pinning` is refused.
fn numa_pinning() -> TestResult {
    let env = Env::new("v1");
    let cpuset = Path::new("/sys/fs/cgroup/cpuset").join(&env.root);
    let run = |extra: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_mesos-gpu"))
            .args(["--simulate", "numa-2cpu", "--dev-root"])
            .arg(env.dev.path())
            .args([
                "exec",
                "--gpus",
                "1",
                "--cgroup-version",
                "v1",
                "--cgroups-root",
                &env.root,
                "--pool-dir",
            ])
            .arg(env.work.path())
            .args(extra)
            .args([
                "--",
                "grep",
                "-E",
                "^(Cpus|Mems)_allowed_list",
                "/proc/self/status",
            ])
            .env("MESOS_GPU_LOG", "warn")
            .output()
            .unwrap();
        (out.status.success(), text(&out))
    };
    let result = (|| {
        let (ok, out) = run(&["--numa-pinning", "--cpus", "1"]);
        println!("{out}");
        check(
            ok && out.contains("Cpus_allowed_list:\t0\n")
                && out.contains("Mems_allowed_list:\t0\n")
                && out.contains("NUMA pinning: CPUs 0, memory nodes 0"),
            out,
        )?;
        let (ok, out) = run(&["--numa-pinning", "--cpus", "1.5"]);
        let online = std::fs::read_to_string("/sys/devices/system/cpu/online").unwrap();
        check(
            ok && out.contains(&format!("Cpus_allowed_list:\t{}\n", online.trim()))
                && out.contains("fewer than the cpus=1.5 it asked for"),
            out,
        )?;
        let (ok, out) = run(&["--cpus", "1"]);
        check(!ok && out.contains("--numa-pinning"), out)?;
        let left: Vec<_> = std::fs::read_dir(&cpuset)
            .map(|d| {
                d.flatten()
                    .filter(|e| e.path().is_dir())
                    .map(|e| e.path())
                    .collect()
            })
            .unwrap_or_default();
        check(left.is_empty(), format!("cpuset cgroups left: {left:?}"))?;
        env.check_clean()
    })();
    let _ = std::fs::remove_dir(&cpuset);
    result
}

/// Issue 17: with every GPU shared four ways (`MESOS_GPU_REPLICAS=4`), a running 1-unit exec
/// and a 2-unit exec share GPU 0 (packed), each command opens that GPU only; 5 units fit no
/// GPU and the node has no whole GPU, so it is refused saying both.
fn execs_share_a_gpu(version: &'static str) -> TestResult {
    let env = Env::new(version);
    let shared = |gpus: &str, cmd: &[&str]| {
        let mut c = env.command(gpus, cmd);
        c.env("MESOS_GPU_REPLICAS", "4");
        c
    };
    let mut first = shared("1", &["busybox", "sleep", "1000"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_running(&env, 1, &mut first)?;
    // The operator sees the share, and cannot release it while its owner runs.
    let listed: serde_json::Value = serde_json::from_slice(&gpu(&env, &["list", "--json"]).stdout)
        .map_err(|e| e.to_string())?;
    let share = &listed["shares"][0];
    check(
        share["grant"]["units"] == 1
            && share["grant"]["replicas"] == 4
            && share["liveness"]["state"] == "alive",
        format!("gpu list: {listed}"),
    )?;
    let id = share["id"].as_str().unwrap_or_default().to_owned();
    let table = String::from_utf8_lossy(&gpu(&env, &["list"]).stdout).into_owned();
    check(table.contains(&id) && table.contains("1/4"), table)?;
    let refused = gpu(&env, &["release", &id]);
    check(
        refused.status.code() == Some(1)
            && String::from_utf8_lossy(&refused.stderr).contains("alive"),
        text(&refused),
    )?;
    let me = std::env::current_exe().unwrap();
    let second = shared("2", &[me.to_str().unwrap()])
        .env(OPENER_ENV, env.dev.path())
        .output()
        .unwrap();
    let too_big = shared("5", &["busybox", "true"]).output().unwrap();
    let _ = Command::new("kill")
        .args(["-TERM", &first.id().to_string()])
        .status();
    let first = first.wait_with_output().unwrap();
    check(second.status.success(), text(&second))?;
    let (a, b) = (
        String::from_utf8_lossy(&first.stderr).into_owned(),
        String::from_utf8_lossy(&second.stderr).into_owned(),
    );
    check(
        granted(&a) == BTreeSet::from([0])
            && granted(&b) == BTreeSet::from([0])
            && a.contains("share: 1/4 of the GPU (time-slicing)")
            && b.contains("share: 2/4 of the GPU (time-slicing)"),
        format!("first:\n{a}\nsecond:\n{b}"),
    )?;
    let stdout = String::from_utf8_lossy(&second.stdout);
    let allowed: Vec<&str> = stdout
        .lines()
        .filter(|l| l.starts_with("nvidia") && l.ends_with(&format!(" {}", libc_enxio())))
        .collect();
    check(
        allowed == ["nvidia-uvm 6", "nvidia0 6", "nvidiactl 6"],
        format!("the share owner opens: {allowed:?}\n{stdout}"),
    )?;
    let refused = String::from_utf8_lossy(&too_big.stderr);
    check(
        too_big.status.code() == Some(1)
            && refused
                .contains("asks 5 GPU units, more than one shared GPU holds (at most 4 replicas)")
            && refused.contains("whole GPUs: 5 asked; 0 free"),
        text(&too_big),
    )?;
    env.check_clean()
}
