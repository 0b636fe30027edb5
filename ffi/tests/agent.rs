//! The module in a real `mesos-agent` (Apache Mesos 1.12, `testkit::mesos_prefix`): the C++ shim
//! is built with its CMakeLists.txt against the installed Mesos and this build's
//! `libmesos_gpu.so`, the agent loads it with `--modules` and `--isolation`, and the agent's own
//! HTTP port serves the library's metrics at `/mesos-gpu/metrics`. No master is needed: the
//! isolator is created when the agent starts.

mod support;

use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use libtest_mimic::Arguments;
use mesos_gpu_testkit::{Host, Need, mesos_prefix, needs};
use support::{Cg, Fixture, TestResult, cdylib, check, trial};

/// How long the agent may take to start on a loaded 2-core machine; not a performance bound.
const PATIENCE: Duration = Duration::from_secs(90);

fn main() -> ExitCode {
    let host = Host::probe();
    let trials = vec![needs(
        &host,
        &[Need::Root, Need::Cgroup1, Need::Cc, Need::Mesos],
        trial(
            "issue_14_the_agent_serves_the_module_metrics",
            the_agent_serves_the_module_metrics,
        ),
    )];
    libtest_mimic::run(&Arguments::from_args(), trials).exit_code()
}

/// `mesos-agent`, killed on drop.
struct Agent(Child);

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
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

fn the_agent_serves_the_module_metrics() -> TestResult {
    let mesos = mesos_prefix().ok_or("no Mesos install")?;
    let fixture = Fixture::new(Cg::V1)?;
    let scratch = tempfile::Builder::new().prefix("mgpu-agent").tempdir()?;
    let module = build_module(&mesos, &scratch.path().join("build"))?;
    let parameters: Vec<serde_json::Value> = fixture
        .params(&[])
        .parameter
        .into_iter()
        .map(|p| serde_json::json!({"key": p.key, "value": p.value}))
        .collect();
    let modules = serde_json::json!({"libraries": [{
        "file": module,
        "modules": [{"name": "org_apache_mesos_gpu_MesosGpuIsolator", "parameters": parameters}],
    }]});
    let modules_file = scratch.path().join("modules.json");
    std::fs::write(&modules_file, modules.to_string())?;
    let addr: SocketAddr = TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    let log = scratch.path().join("agent.log");
    let _agent = Agent(
        Command::new(mesos.join("sbin/mesos-agent"))
            // Nothing listens there: the agent keeps looking for a master and serves HTTP.
            .arg("--master=127.0.0.1:1")
            .arg("--ip=127.0.0.1")
            .arg(format!("--port={}", addr.port()))
            .arg(format!(
                "--work_dir={}",
                scratch.path().join("agent").display()
            ))
            .arg(format!(
                "--runtime_dir={}",
                scratch.path().join("run").display()
            ))
            .arg(format!(
                "--launcher_dir={}",
                mesos.join("libexec/mesos").display()
            ))
            .arg("--launcher=posix")
            .arg("--isolation=org_apache_mesos_gpu_MesosGpuIsolator")
            .arg(format!("--modules=file://{}", modules_file.display()))
            .arg("--resources=cpus:1;mem:128;gpus:4")
            .arg("--no-systemd_enable_support")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log)?)
            .spawn()?,
    );
    let deadline = Instant::now() + PATIENCE;
    let answer = loop {
        if let Some(answer) = get(addr, "/mesos-gpu/metrics") {
            break answer;
        }
        if Instant::now() > deadline {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            return Err(format!("the agent did not serve /mesos-gpu/metrics:\n{text}").into());
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let (head, body) = answer.split_once("\r\n\r\n").ok_or("not HTTP")?;
    check(head.starts_with("HTTP/1.1 200"), head)?;
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
