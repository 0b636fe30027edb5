//! `/metrics` scraped over HTTP on loopback from a simulated node, checked against the node's
//! JSON description; an XID injected while serving shows up in the next scrape.

use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use mesos_gpu_docker::metrics::{FigureSource, Metrics, NvmlFigures};
use mesos_gpu_health::{HealthMonitor, MonitorConfig};
use mesos_gpu_node::usage::UsageReader;
use mesos_gpu_node::{discovery::Discovery, discovery::GpuDriver};
use mesos_gpu_placement::{allocator::Allocator, allocator::Policy};
use mesos_gpu_testkit::nvml_sim::SimNode;
use serde_json::{Value, json};

fn scrape(addr: std::net::SocketAddr, path: &str) -> (String, String) {
    let mut stream = TcpStream::connect(addr).expect("connect");
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    )
    .expect("send");
    let mut reply = String::new();
    stream.read_to_string(&mut reply).expect("read");
    let (head, body) = reply.split_once("\r\n\r\n").expect("HTTP reply");
    (head.to_owned(), body.to_owned())
}

fn value(body: &str, series: &str) -> Option<f64> {
    body.lines()
        .find_map(|l| {
            l.strip_prefix(series)
                .and_then(|rest| rest.strip_prefix(' '))
        })
        .and_then(|v| v.trim().parse().ok())
}

#[test]
fn metrics_over_http_match_the_simulated_node() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../nvml-sim/topologies/pcie-t4x4.json"
    );
    let mut desc: Value =
        serde_json::from_str(&std::fs::read_to_string(path).expect("read")).expect("json");
    desc["gpus"][0]["memory"]["used"] = json!(123_456_789u64);
    desc["gpus"][1]["fail"] = json!({"nvmlDeviceGetTemperature": "NVML_ERROR_NOT_SUPPORTED"});
    let sim = SimNode::from_json(&desc.to_string());
    let Discovery::Driver(driver) = GpuDriver::open(Some(&sim.lib_path())).expect("open") else {
        panic!("no driver");
    };
    let driver = Arc::new(*driver);
    let config = MonitorConfig {
        wait_timeout: Duration::from_millis(20),
        ..MonitorConfig::default()
    };
    let monitor =
        Arc::new(HealthMonitor::start(Arc::clone(&driver), config, vec![]).expect("monitor"));
    let mut alloc = Allocator::new(driver.inventory(), Policy::FirstFit).expect("allocator");
    alloc.allocate("task-1", 2).expect("allocate");
    assert!(alloc.allocate("task-2", 9).is_err());
    let alloc = Arc::new(Mutex::new(alloc));
    let source: Arc<dyn FigureSource> = Arc::new(
        NvmlFigures::new(Arc::clone(&driver))
            .with_health(monitor.clone())
            .with_allocator(alloc.clone(), None, UsageReader::default()),
    );
    let metrics = Arc::new(Metrics::new(source, Duration::from_millis(10)));

    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let listener = runtime
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let served = Arc::clone(&metrics);
    runtime.spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let m = Arc::clone(&served);
            tokio::spawn(http1::Builder::new().serve_connection(
                TokioIo::new(stream),
                service_fn(move |req| Arc::clone(&m).handle(req)),
            ));
        }
    });

    let (head, body) = scrape(addr, "/metrics");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(head.contains("application/openmetrics-text"), "{head}");
    assert!(body.ends_with("# EOF\n"), "{body}");
    for (i, gpu) in desc["gpus"].as_array().expect("gpus").iter().enumerate() {
        let uuid = gpu["uuid"].as_str().expect("uuid");
        let labels = format!(r#"{{gpu="{i}",uuid="{uuid}"}}"#);
        let get = |name: &str| value(&body, &format!("{name}{labels}"));
        assert_eq!(get("mesos_gpu_healthy"), Some(1.0), "{labels}");
        assert_eq!(
            get("mesos_gpu_memory_total_bytes"),
            gpu["memory"]["total"].as_f64(),
            "{labels}"
        );
        assert_eq!(
            get("mesos_gpu_memory_used_bytes"),
            Some(gpu["memory"]["used"].as_f64().unwrap_or(0.0)),
            "{labels}"
        );
        assert_eq!(
            get("mesos_gpu_utilization_percent"),
            gpu["utilization"]["gpu"].as_f64(),
            "{labels}"
        );
        assert_eq!(
            get("mesos_gpu_power_watts"),
            gpu["power_mw"].as_f64().map(|mw| mw / 1000.0),
            "{labels}"
        );
        let temperature = if i == 1 {
            None
        } else {
            gpu["temperature_c"].as_f64()
        };
        assert_eq!(
            get("mesos_gpu_temperature_celsius"),
            temperature,
            "{labels}: unknown is left out"
        );
    }
    assert_eq!(
        value(
            &body,
            r#"mesos_gpu_container_gpus{container_id="task-1",executor_id="",framework_id="",framework_name="",task_id="",task_name=""}"#
        ),
        Some(2.0),
        "{body}"
    );
    assert_eq!(
        value(&body, "mesos_gpu_allocator_requests_total"),
        Some(2.0),
        "{body}"
    );
    assert_eq!(
        value(
            &body,
            r#"mesos_gpu_allocator_refusals_total{reason="bad_request"}"#
        ),
        Some(1.0),
        "{body}"
    );
    assert_eq!(
        value(&body, "mesos_gpu_allocator_free_gpus"),
        Some(2.0),
        "{body}"
    );

    while monitor.stats().registrations == 0 {
        std::thread::sleep(Duration::from_millis(2));
    }
    sim.append_event("xid 3 79");
    let uuid3 = desc["gpus"][3]["uuid"].as_str().expect("uuid");
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let (_, body) = scrape(addr, "/metrics");
        let healthy = value(
            &body,
            &format!(r#"mesos_gpu_healthy{{gpu="3",uuid="{uuid3}"}}"#),
        );
        if healthy == Some(0.0) {
            let xid = format!(r#"mesos_gpu_xid_errors_total{{gpu="3",uuid="{uuid3}",xid="79"}}"#);
            assert_eq!(value(&body, &xid), Some(1.0), "{body}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "GPU 3 never reported unhealthy: {body}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let (head, _) = scrape(addr, "/nope");
    assert!(head.starts_with("HTTP/1.1 404"), "{head}");
}
