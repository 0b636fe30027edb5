//! `mesos-gpu serve` answers `GET /metrics` with OpenMetrics text over loopback, on a simulated
//! node; other REST routes still answer.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
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

/// `mesos-gpu serve` on the simulated `node` (a name or a file), listening on `addr`, with every
/// directory under `dir` and the agent's health read in `agent`; logs at `warn`, to nowhere.
fn serve_command(node: &Path, addr: SocketAddr, dir: &Path, agent: &Path) -> Command {
    let mut cmd = mesos_gpu_testkit::serve::command(env!("CARGO_BIN_EXE_mesos-gpu"), node, dir);
    cmd.args(["--driver-poll", "0", "--listen"])
        .arg(addr.to_string())
        .arg("--agent-work-dir")
        .arg(agent)
        .env("MESOS_GPU_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    cmd
}

/// Starts `cmd` (a `serve_command`).
fn serve(mut cmd: Command) -> Serve {
    Serve(cmd.spawn().expect("run mesos-gpu serve"))
}

/// The first answer of `serve` to `GET /metrics`, waiting while it starts.
fn first_metrics(serve: &mut Serve, addr: SocketAddr) -> String {
    let deadline = Instant::now() + PATIENCE;
    loop {
        if let Some(response) = get(addr, "/metrics") {
            return response;
        }
        if let Some(status) = serve.0.try_wait().unwrap() {
            panic!("serve exited early: {status}");
        }
        assert!(Instant::now() < deadline, "serve did not listen on {addr}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn serve_answers_metrics() {
    let dir = tempfile::tempdir().unwrap();
    let addr = free_port();
    let agent = dir.path().join("agent");
    let mut serve = serve(serve_command(
        Path::new("dgx1-v100"),
        addr,
        dir.path(),
        &agent,
    ));
    let response = first_metrics(&mut serve, addr);
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
fn serve_opens_nvml_once() {
    let dir = tempfile::tempdir().unwrap();
    let addr = free_port();
    let log = dir.path().join("serve.log");
    let mut cmd = serve_command(
        Path::new("dgx1-v100"),
        addr,
        dir.path(),
        &dir.path().join("agent"),
    );
    cmd.env("MESOS_GPU_LOG", "mesos_gpu_node::discovery=info")
        .stderr(std::fs::File::create(&log).unwrap());
    let mut serve = serve(cmd);
    first_metrics(&mut serve, addr);
    assert!(get(addr, "/gpu/status/json").is_some());
    let text = std::fs::read_to_string(&log).unwrap();
    assert_eq!(
        text.matches("discovered GPUs").count(),
        1,
        "one NVML session, for discovery, /gpu/status and /metrics:\n{text}"
    );
}

#[test]
fn serve_metrics_report_the_agents_gpu_health() {
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
    let mut serve = serve(serve_command(
        Path::new("dgx1-v100"),
        addr,
        dir.path(),
        &agent,
    ));
    let response = first_metrics(&mut serve, addr);
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

/// `serve` pointed at an agent work directory without a health checkpoint (the agent not started
/// yet, or a wrong `--agent-work-dir`) still reports every GPU's health, from NVML: a lost GPU
/// as lost, so the guide's `GpuUnhealthy` alert fires; and says the checkpoint is absent
/// (before: every health series silently missing).
#[test]
fn serve_metrics_report_nvml_health_without_a_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let mut node: serde_json::Value = mesos_gpu_testkit::nvml_sim::shipped_description("dgx1-v100");
    node["gpus"][2]["lost"] = true.into();
    let file = dir.path().join("node.json");
    std::fs::write(&file, node.to_string()).unwrap();
    let uuid = |i: usize| node["gpus"][i]["uuid"].as_str().unwrap().to_owned();
    let agent = dir.path().join("agent");
    std::fs::create_dir_all(&agent).unwrap();
    let log = dir.path().join("serve.log");
    let addr = free_port();
    let mut cmd = serve_command(&file, addr, dir.path(), &agent);
    cmd.stderr(std::fs::File::create(&log).unwrap());
    let mut serve = serve(cmd);
    let response = first_metrics(&mut serve, addr);
    let body = response.split_once("\r\n\r\n").expect("HTTP").1;
    let checkpoint = agent.join("gpu/health.json");
    // NVML cannot read a lost GPU's UUID: its series carries an empty one.
    assert!(
        body.lines()
            .any(|l| l.starts_with(r#"mesos_gpu_health{gpu="2","#)
                && l.contains(r#"state="lost",reason="lost""#)
                && l.ends_with(" 1")),
        "GPU 2 not reported lost:\n{body}"
    );
    for want in [
        format!(
            r#"mesos_gpu_health{{gpu="0",uuid="{}",state="healthy",reason="",recovery=""}} 1"#,
            uuid(0)
        ),
        format!(
            r#"mesos_gpu_health_checkpoint{{path="{}",state="absent"}} 1"#,
            checkpoint.display()
        ),
    ] {
        assert!(body.contains(&want), "{want} missing:\n{body}");
    }
    assert_eq!(body.matches("mesos_gpu_health{").count(), 8, "{body}");
    // A second scrape, past the cache, reads the checkpoint again.
    std::thread::sleep(Duration::from_millis(1200));
    assert!(get(addr, "/metrics").is_some());
    drop(serve);
    let text = std::fs::read_to_string(&log).unwrap();
    assert_eq!(
        text.matches("no GPU health checkpoint").count(),
        1,
        "said once, not at every scrape:\n{text}"
    );
}

/// A Mesos agent answering `GET /state` with one framework, for as long as the test runs.
fn fake_agent() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut request = [0u8; 1024];
            let _ = stream.read(&mut request);
            let body = r#"{"frameworks":[{"id":"fw-1","name":"marathon"}]}"#;
            let _ = write!(
                stream,
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            );
        }
    });
    addr
}

/// Issue 37: `serve`'s per-container series are the pool's records, labelled with the holder a
/// record names and its framework's name from the agent (`--agent-url`); a released record's
/// series are gone at the next collection.
#[test]
fn serve_labels_the_pools_containers_with_their_holders() {
    let dir = tempfile::tempdir().unwrap();
    let addr = free_port();
    let agent = dir.path().join("agent");
    let pool = mesos_gpu_pool::Pool::at(dir.path().join("serve/pool"));
    let uuid = "GPU-0a8d4f81-a14c-5a4b-828b-7216f53140ae";
    let publish = |entries| {
        let mut tx = pool.begin().unwrap();
        tx.state.publish("docker-args", entries);
        tx.commit().unwrap();
    };
    publish(vec![(
        "c1".to_owned(),
        mesos_gpu_pool::Owner::Docker {
            name: "mesos-c1".to_owned(),
            daemon: None,
            starter: None,
            holder: Some(mesos_gpu_pool::Holder {
                executor_id: Some("e1".to_owned()),
                framework_id: Some("fw-1".to_owned()),
                framework_name: None,
                task_id: Some("t1".to_owned()),
                task_name: Some("train".to_owned()),
            }),
        },
        vec![mesos_gpu_pool::GpuUuid::new(uuid).unwrap()],
    )]);
    let mut cmd = serve_command(Path::new("dgx1-v100"), addr, dir.path(), &agent);
    cmd.arg("--agent-url")
        .arg(format!("http://{}", fake_agent()));
    let mut serve = serve(cmd);
    let body = first_metrics(&mut serve, addr);
    let who = r#"container_id="c1",executor_id="e1",framework_id="fw-1",framework_name="marathon",task_id="t1",task_name="train""#;
    for line in [
        format!("mesos_gpu_container_gpus{{{who}}} 1"),
        format!(r#"mesos_gpu_holder_info{{gpu="0",uuid="{uuid}",{who}}} 1"#),
    ] {
        assert!(body.lines().any(|l| l == line), "{line} missing: {body}");
    }
    assert_eq!(body.matches("mesos_gpu_holder_info{").count(), 1, "{body}");
    publish(Vec::new());
    // A collection is reused for 1 s.
    std::thread::sleep(Duration::from_millis(1100));
    let after = get(addr, "/metrics").expect("metrics");
    assert!(!after.contains(r#"container_id="c1""#), "{after}");
    assert!(!after.contains("mesos_gpu_holder_info{"), "{after}");
}
