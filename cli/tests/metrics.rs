//! `mesos-gpu serve` answers `GET /metrics` with OpenMetrics text over loopback, on a simulated
//! node; other REST routes still answer.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long `serve` may take to listen on a loaded 2-core machine; not a performance bound.
const PATIENCE: Duration = Duration::from_secs(30);

/// `mesos-gpu serve`, killed on drop.
struct Serve(Child);

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A loopback port nothing listens on now.
fn free_port() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
}

/// `GET path` with a bounded wait; `None` while nothing listens.
fn get(addr: SocketAddr, path: &str) -> Option<String> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(1)).ok()?;
    stream.set_read_timeout(Some(PATIENCE)).unwrap();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut text = String::new();
    stream.read_to_string(&mut text).ok()?;
    Some(text)
}

#[test]
fn serve_answers_metrics() {
    let dir = tempfile::tempdir().unwrap();
    let addr = free_port();
    let mut serve = Serve(
        Command::new(env!("CARGO_BIN_EXE_mesos-gpu"))
            .args(["serve", "--simulate", "dgx1-v100", "--driver-poll", "0"])
            .arg("--listen")
            .arg(addr.to_string())
            .arg("--plugin-socket")
            .arg(dir.path().join("nvidia-docker.sock"))
            .arg("--volume-root")
            .arg(dir.path().join("volumes"))
            .arg("--work-dir")
            .arg(dir.path().join("work"))
            .arg("--pool-dir")
            .arg(dir.path().join("work").join("pool"))
            .arg("--docker-socket")
            .arg(dir.path().join("no-docker.sock"))
            .env("MESOS_GPU_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("run mesos-gpu serve"),
    );
    let deadline = Instant::now() + PATIENCE;
    let response = loop {
        if let Some(response) = get(addr, "/metrics") {
            break response;
        }
        if let Some(status) = serve.0.try_wait().unwrap() {
            panic!("serve exited early: {status}");
        }
        assert!(Instant::now() < deadline, "serve did not listen on {addr}");
        std::thread::sleep(Duration::from_millis(50));
    };
    let (head, body) = response.split_once("\r\n\r\n").expect("an HTTP response");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(
        head.to_ascii_lowercase()
            .contains("content-type: application/openmetrics-text; version=1.0.0"),
        "{head}"
    );
    assert!(
        body.contains(
            r#"mesos_gpu_memory_total_bytes{gpu="0",uuid="GPU-0a8d4f81-a14c-5a4b-828b-7216f53140ae"} 16944988160"#
        ),
        "{body}"
    );
    assert_eq!(
        body.matches("mesos_gpu_memory_total_bytes{").count(),
        8,
        "{body}"
    );
    assert!(body.ends_with("# EOF\n"), "{body}");
    let info = get(addr, "/gpu/info/json").expect("info");
    assert!(info.starts_with("HTTP/1.1 200"), "{info}");
    let missing = get(addr, "/v1.0/metrics").expect("404");
    assert!(missing.starts_with("HTTP/1.1 404"), "{missing}");
}

#[test]
fn issue_14_serve_opens_nvml_once() {
    let dir = tempfile::tempdir().unwrap();
    let addr = free_port();
    let log = dir.path().join("serve.log");
    let mut serve = Serve(
        Command::new(env!("CARGO_BIN_EXE_mesos-gpu"))
            .args(["serve", "--simulate", "dgx1-v100", "--driver-poll", "0"])
            .arg("--listen")
            .arg(addr.to_string())
            .arg("--plugin-socket")
            .arg(dir.path().join("nvidia-docker.sock"))
            .arg("--volume-root")
            .arg(dir.path().join("volumes"))
            .arg("--work-dir")
            .arg(dir.path().join("work"))
            .arg("--pool-dir")
            .arg(dir.path().join("work").join("pool"))
            .arg("--docker-socket")
            .arg(dir.path().join("no-docker.sock"))
            .env("MESOS_GPU_LOG", "mesos_gpu_isolator::discovery=info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("run mesos-gpu serve"),
    );
    let deadline = Instant::now() + PATIENCE;
    while get(addr, "/metrics").is_none() {
        if let Some(status) = serve.0.try_wait().unwrap() {
            panic!("serve exited early: {status}");
        }
        assert!(Instant::now() < deadline, "serve did not listen on {addr}");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(get(addr, "/gpu/status/json").is_some());
    let text = std::fs::read_to_string(&log).unwrap();
    assert_eq!(
        text.matches("discovered GPUs").count(),
        1,
        "one NVML session, for discovery, /gpu/status and /metrics:\n{text}"
    );
}

#[test]
fn issue_14_serve_metrics_report_the_agents_gpu_health() {
    let dir = tempfile::tempdir().unwrap();
    let agent = dir.path().join("agent");
    std::fs::create_dir_all(agent.join("gpu")).unwrap();
    let node: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../nvml-sim/topologies/dgx1-v100.json"
        ))
        .unwrap(),
    )
    .unwrap();
    let uuid = |i: usize| node["gpus"][i]["uuid"].as_str().unwrap().to_owned();
    // What the module's monitor checkpoints: GPU 3 failed by XID 79 (twice), GPU 5 lost.
    let gpus: Vec<serde_json::Value> = (0..8)
        .map(|i| {
            let health = match i {
                3 => serde_json::json!({"state": "unhealthy", "reason": {"kind": "xid", "xid": 79},
                                        "since_ms": 1, "last_error_ms": 2, "errors": 2}),
                5 => serde_json::json!({"state": "unhealthy", "reason": {"kind": "lost"},
                                        "since_ms": 1, "last_error_ms": 1, "errors": 1}),
                _ => serde_json::json!({"state": "healthy"}),
            };
            let xids = if i == 3 {
                serde_json::json!({"79": 2, "13": 1})
            } else {
                serde_json::json!({})
            };
            serde_json::json!({"index": i, "uuid": uuid(i), "xids": xids, "ecc_single_bit": 0,
                               "ecc_double_bit": 0, "health": health})
        })
        .collect();
    std::fs::write(
        agent.join("gpu/health.json"),
        serde_json::json!({"version": 1, "gpus": gpus}).to_string(),
    )
    .unwrap();
    let addr = free_port();
    let mut serve = Serve(
        Command::new(env!("CARGO_BIN_EXE_mesos-gpu"))
            .args(["serve", "--simulate", "dgx1-v100", "--driver-poll", "0"])
            .arg("--listen")
            .arg(addr.to_string())
            .arg("--plugin-socket")
            .arg(dir.path().join("nvidia-docker.sock"))
            .arg("--volume-root")
            .arg(dir.path().join("volumes"))
            .arg("--work-dir")
            .arg(dir.path().join("work"))
            .arg("--pool-dir")
            .arg(dir.path().join("work").join("pool"))
            .arg("--docker-socket")
            .arg(dir.path().join("no-docker.sock"))
            .arg("--agent-work-dir")
            .arg(&agent)
            .env("MESOS_GPU_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("run mesos-gpu serve"),
    );
    let deadline = Instant::now() + PATIENCE;
    let response = loop {
        if let Some(response) = get(addr, "/metrics") {
            break response;
        }
        if let Some(status) = serve.0.try_wait().unwrap() {
            panic!("serve exited early: {status}");
        }
        assert!(Instant::now() < deadline, "serve did not listen on {addr}");
        std::thread::sleep(Duration::from_millis(50));
    };
    let body = response.split_once("\r\n\r\n").expect("HTTP").1;
    for want in [
        format!(
            r#"mesos_gpu_health{{gpu="3",uuid="{}",state="unhealthy",reason="xid_79",recovery="node_reboot"}} 1"#,
            uuid(3)
        ),
        format!(
            r#"mesos_gpu_health{{gpu="5",uuid="{}",state="lost",reason="lost",recovery="node_reboot"}} 1"#,
            uuid(5)
        ),
        format!(
            r#"mesos_gpu_health{{gpu="0",uuid="{}",state="healthy",reason="",recovery=""}} 1"#,
            uuid(0)
        ),
        format!(
            r#"mesos_gpu_xid_errors_total{{gpu="3",uuid="{}",xid="79"}} 2"#,
            uuid(3)
        ),
        format!(
            r#"mesos_gpu_xid_errors_total{{gpu="3",uuid="{}",xid="13"}} 1"#,
            uuid(3)
        ),
        format!(r#"mesos_gpu_healthy{{gpu="3",uuid="{}"}} 0"#, uuid(3)),
    ] {
        assert!(body.contains(&want), "{want} missing:\n{body}");
    }
}
