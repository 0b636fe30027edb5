//! The module in a real `mesos-agent` (Apache Mesos 1.12, `testkit::mesos_prefix`): the C++ shim
//! is built with its CMakeLists.txt against the installed Mesos and this build's
//! `libmesos_gpu.so`, and the agent loads it with `--modules` and `--isolation`.
//!
//! - Alone (no master: the isolator is created when the agent starts), the agent's own HTTP port
//!   serves the library's metrics at `/mesos-gpu/metrics`.
//! - With a real `mesos-master` and `mesos-execute`, what the operator guide says about sharing
//!   GPU agents: a framework without the `GPU_RESOURCES` capability is offered nothing from a
//!   GPU agent (the master's `--filter_gpu_resources`, on by default); one with it runs a GPU
//!   task, which sees its GPU by UUID; a role whose quota limits `gpus` to 0 is offered the
//!   agent's other resources but never a GPU.

mod support;

use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use libtest_mimic::Arguments;
use mesos_gpu_testkit::{Host, Need, mesos_prefix, needs};
use support::{Cg, Fixture, TestResult, cdylib, check, trial};

/// How long the agent may take to start on a loaded 2-core machine; not a performance bound.
const PATIENCE: Duration = Duration::from_secs(90);

fn main() -> ExitCode {
    let host = Host::probe();
    let need = [Need::Root, Need::Cgroup1, Need::Cc, Need::Mesos];
    let trials = vec![
        needs(
            &host,
            &need,
            trial(
                "issue_14_the_agent_serves_the_module_metrics",
                the_agent_serves_the_module_metrics,
            ),
        ),
        needs(
            &host,
            &need,
            trial(
                "issue_14_gpu_agents_are_shared_as_the_guide_says",
                gpu_agents_are_shared_as_the_guide_says,
            ),
        ),
    ];
    libtest_mimic::run(&Arguments::from_args(), trials).exit_code()
}

/// A Mesos daemon, killed on drop.
struct Agent(Child);

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The module, built once per test binary.
fn module() -> TestResult<&'static Path> {
    static MODULE: OnceLock<Result<(tempfile::TempDir, PathBuf), String>> = OnceLock::new();
    MODULE
        .get_or_init(|| {
            let mesos = mesos_prefix().ok_or("no Mesos install")?;
            let dir = tempfile::Builder::new()
                .prefix("mgpu-module")
                .tempdir()
                .map_err(|e| e.to_string())?;
            let module =
                build_module(&mesos, &dir.path().join("build")).map_err(|e| e.to_string())?;
            Ok((dir, module))
        })
        .as_ref()
        .map(|(_, module)| module.as_path())
        .map_err(|e| e.clone().into())
}

/// Builds `libmesos_gpu_module.so` in `build` with the shim's own CMakeLists.txt.
fn build_module(mesos: &Path, build: &Path) -> TestResult<PathBuf> {
    let lib = cdylib()?;
    let lib_dir = lib.parent().ok_or("library has no directory")?;
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("mesos-module");
    let configure = Command::new("cmake")
        .arg("-S")
        .arg(&source)
        .arg("-B")
        .arg(build)
        .arg(format!(
            "-DMESOS_INCLUDE_DIR={}",
            mesos.join("include").display()
        ))
        .arg(format!("-DMESOS_LIB_DIR={}", mesos.join("lib").display()))
        .arg(format!(
            "-DBOOST_INCLUDE_DIR={}",
            mesos.join("lib/mesos/3rdparty/include").display()
        ))
        .arg(format!("-DMESOS_GPU_LIB_DIR={}", lib_dir.display()))
        .output()?;
    check(
        configure.status.success(),
        format!("cmake: {}", String::from_utf8_lossy(&configure.stderr)),
    )?;
    let make = Command::new("cmake").arg("--build").arg(build).output()?;
    check(
        make.status.success(),
        format!(
            "cmake --build: {}{}",
            String::from_utf8_lossy(&make.stdout),
            String::from_utf8_lossy(&make.stderr)
        ),
    )?;
    Ok(build.join("libmesos_gpu_module.so"))
}

/// `GET path`, the whole answer; `None` while nothing listens.
fn get(addr: SocketAddr, path: &str) -> Option<String> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(1)).ok()?;
    stream.set_read_timeout(Some(PATIENCE)).ok()?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut text = String::new();
    stream.read_to_string(&mut text).ok()?;
    Some(text)
}

/// A free loopback address.
fn free_addr() -> TestResult<SocketAddr> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?)
}

/// Starts `mesos-agent` with the module on `fixture`'s node, under `scratch`.
fn start_agent(
    mesos: &Path,
    fixture: &Fixture,
    scratch: &Path,
    master: &str,
    addr: SocketAddr,
) -> TestResult<Agent> {
    let parameters: Vec<serde_json::Value> = fixture
        .params(&[])
        .parameter
        .into_iter()
        .map(|p| serde_json::json!({"key": p.key, "value": p.value}))
        .collect();
    let modules = serde_json::json!({"libraries": [{
        "file": module()?,
        "modules": [{"name": "org_apache_mesos_gpu_MesosGpuIsolator", "parameters": parameters}],
    }]});
    let modules_file = scratch.join("modules.json");
    std::fs::write(&modules_file, modules.to_string())?;
    Ok(Agent(
        Command::new(mesos.join("sbin/mesos-agent"))
            .arg(format!("--master={master}"))
            .arg("--ip=127.0.0.1")
            .arg(format!("--port={}", addr.port()))
            .arg(format!("--work_dir={}", scratch.join("agent").display()))
            .arg(format!("--runtime_dir={}", scratch.join("run").display()))
            .arg(format!(
                "--launcher_dir={}",
                mesos.join("libexec/mesos").display()
            ))
            .arg("--launcher=posix")
            .arg("--isolation=org_apache_mesos_gpu_MesosGpuIsolator")
            .arg(format!("--modules=file://{}", modules_file.display()))
            .arg("--resources=cpus:2;mem:512;gpus:4")
            .arg("--no-systemd_enable_support")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(scratch.join("agent.log"))?)
            .spawn()?,
    ))
}

/// Polls `GET path` until it answers 200 or `PATIENCE` runs out; the body.
fn wait_for(addr: SocketAddr, path: &str, log: &Path) -> TestResult<String> {
    let deadline = Instant::now() + PATIENCE;
    loop {
        if let Some(answer) = get(addr, path)
            && answer.starts_with("HTTP/1.1 200")
        {
            return Ok(answer);
        }
        if Instant::now() > deadline {
            let text = std::fs::read_to_string(log).unwrap_or_default();
            return Err(format!("no answer to {path} from {addr}:\n{text}").into());
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn the_agent_serves_the_module_metrics() -> TestResult {
    let mesos = mesos_prefix().ok_or("no Mesos install")?;
    let fixture = Fixture::new(Cg::V1)?;
    let scratch = tempfile::Builder::new().prefix("mgpu-agent").tempdir()?;
    let addr = free_addr()?;
    // Nothing listens at the master's address: the agent keeps looking and serves HTTP.
    let _agent = start_agent(&mesos, &fixture, scratch.path(), "127.0.0.1:1", addr)?;
    let answer = wait_for(
        addr,
        "/mesos-gpu/metrics",
        &scratch.path().join("agent.log"),
    )?;
    let (head, body) = answer.split_once("\r\n\r\n").ok_or("not HTTP")?;
    check(
        head.contains("Content-Type: application/openmetrics-text; version=1.0.0"),
        head,
    )?;
    for want in [
        r#"mesos_gpu_allocator_gpus{state="free"} 4"#,
        r#"mesos_gpu_allocator_gpus{state="quarantined"} 0"#,
        r#"mesos_gpu_allocator_refusals_total{reason="not_enough"} 0"#,
        r#"mesos_gpu_health{gpu="0",uuid="GPU-dac63099-8ac4-59bd-80b1-ec9112a7e4d6",state="healthy",reason=""} 1"#,
        "mesos_gpu_health_events_total",
    ] {
        check(body.contains(want), format!("{want} missing from:\n{body}"))?;
    }
    check(body.ends_with("# EOF\n"), "not OpenMetrics")
}

/// How a `mesos-execute` run ended: its output, or `None` when it was still waiting for an
/// offer after `wait`.
fn execute(
    mesos: &Path,
    master: &str,
    args: &[&str],
    wait: Duration,
) -> TestResult<Option<String>> {
    let mut child = Command::new(mesos.join("bin/mesos-execute"))
        .arg(format!("--master={master}"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()?;
    let deadline = Instant::now() + wait;
    while child.try_wait()?.is_none() {
        if Instant::now() > deadline {
            child.kill()?;
            child.wait()?;
            return Ok(None);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let mut out = String::new();
    child
        .stdout
        .take()
        .ok_or("no stdout")?
        .read_to_string(&mut out)?;
    Ok(Some(out))
}

/// The stdout of the task named `name` in the agent's sandboxes under `work`.
fn task_stdout(work: &Path, name: &str) -> TestResult<String> {
    let mut stack = vec![work.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir)?.flatten() {
            let path = entry.path();
            if entry.file_type()?.is_dir() {
                stack.push(path);
            } else if path.file_name().is_some_and(|n| n == "stdout")
                && path
                    .to_string_lossy()
                    .contains(&format!("/executors/{name}/"))
            {
                return Ok(std::fs::read_to_string(&path)?);
            }
        }
    }
    Err(format!("no sandbox stdout for task {name}").into())
}

fn gpu_agents_are_shared_as_the_guide_says() -> TestResult {
    let mesos = mesos_prefix().ok_or("no Mesos install")?;
    let fixture = Fixture::new(Cg::V1)?;
    let scratch = tempfile::Builder::new().prefix("mgpu-cluster").tempdir()?;
    let master_addr = free_addr()?;
    let master = master_addr.to_string();
    let _master = Agent(
        Command::new(mesos.join("sbin/mesos-master"))
            .arg("--ip=127.0.0.1")
            .arg(format!("--port={}", master_addr.port()))
            .arg(format!(
                "--work_dir={}",
                scratch.path().join("master").display()
            ))
            .arg("--registry=in_memory")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(scratch.path().join("master.log"))?)
            .spawn()?,
    );
    let addr = free_addr()?;
    let _agent = start_agent(&mesos, &fixture, scratch.path(), &master, addr)?;
    // Registered: the master lists the agent with its 4 GPUs.
    let deadline = Instant::now() + PATIENCE;
    while !get(master_addr, "/master/slaves").is_some_and(|a| a.contains("\"gpus\":4.0")) {
        check(
            Instant::now() < deadline,
            std::fs::read_to_string(scratch.path().join("agent.log")).unwrap_or_default(),
        )?;
        std::thread::sleep(Duration::from_millis(200));
    }
    let short = Duration::from_secs(10);
    // No GPU_RESOURCES: not even a CPU-only task is offered this agent.
    let blind = execute(
        &mesos,
        &master,
        &[
            "--name=blind",
            "--command=true",
            "--resources=cpus:0.1;mem:32",
        ],
        short,
    )?;
    check(
        blind.is_none(),
        format!("a framework without GPU_RESOURCES ran: {blind:?}"),
    )?;
    // GPU_RESOURCES: a GPU task runs and sees its GPU by UUID.
    let gpu = execute(
        &mesos,
        &master,
        &[
            "--name=gpu",
            "--command=echo visible=$CUDA_VISIBLE_DEVICES",
            "--resources=cpus:0.1;mem:32;gpus:1",
            "--framework_capabilities=GPU_RESOURCES",
        ],
        PATIENCE,
    )?
    .ok_or("the GPU task was not offered")?;
    check(gpu.contains("TASK_FINISHED"), &gpu)?;
    let agent_work = scratch.path().join("agent");
    let seen = task_stdout(&agent_work, "gpu")?;
    check(seen.contains("visible=GPU-"), &seen)?;
    // Quota: role `batch` may hold no GPU, so its GPU task is never offered one, while its
    // CPU task runs without any.
    let quota = r#"{"type":"UPDATE_QUOTA","update_quota":{"force":false,"quota_configs":[{"role":"batch","limits":{"gpus":{"value":0}}}]}}"#;
    let mut stream = TcpStream::connect(master_addr)?;
    write!(
        stream,
        "POST /api/v1 HTTP/1.1\r\nHost: {master}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{quota}",
        quota.len()
    )?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer)?;
    check(answer.starts_with("HTTP/1.1 200"), &answer)?;
    let starved = execute(
        &mesos,
        &master,
        &[
            "--name=starved",
            "--role=batch",
            "--command=true",
            "--resources=cpus:0.1;mem:32;gpus:1",
            "--framework_capabilities=GPU_RESOURCES",
        ],
        short,
    )?;
    check(
        starved.is_none(),
        format!("a GPU task ran past a gpus:0 quota: {starved:?}"),
    )?;
    let cpu = execute(
        &mesos,
        &master,
        &[
            "--name=cpu",
            "--role=batch",
            "--command=echo visible=$CUDA_VISIBLE_DEVICES",
            "--resources=cpus:0.1;mem:32",
            "--framework_capabilities=GPU_RESOURCES",
        ],
        PATIENCE,
    )?
    .ok_or("the CPU task of batch was not offered")?;
    check(cpu.contains("TASK_FINISHED"), &cpu)?;
    let seen = task_stdout(&agent_work, "cpu")?;
    check(seen.contains("visible=\n"), format!("{seen:?}"))
}
