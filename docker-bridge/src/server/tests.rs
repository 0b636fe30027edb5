//! The server over real sockets: TCP on 127.0.0.1:0 and a unix socket in a tempdir.

use std::os::unix::fs::PermissionsExt as _;

use mesos_gpu_node::{inventory::DriverInfo, inventory::Gpu, inventory::Topology};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpStream, UnixStream};
use tokio::sync::oneshot;

use super::*;
use crate::args::VolumeSource;
use crate::plugin::{BuildError, VolumeBuilder, VolumeState};
use crate::rest::Devices;
use crate::rest::status::NoStatus;
use mesos_gpu_node::devices::DeviceNodes;

struct DirBuilder(PathBuf);

impl VolumeBuilder for DirBuilder {
    fn build(&self, version: &str) -> Result<PathBuf, BuildError> {
        let dir = self.0.join(version);
        std::fs::create_dir_all(&dir)?;
        Ok(dir)
    }

    fn hold(&self, _version: &str, _holder: &str, _held: bool) -> Result<(), BuildError> {
        Ok(())
    }
}

fn inventory() -> Inventory {
    let gpu = |i: u32| Gpu {
        index: i,
        minor: i,
        uuid: format!("GPU-{i}"),
        name: "sim".into(),
        memory_total: 0,
        pci_bus_id: String::new(),
        numa_node: None,
        compute_capability: None,
        healthy: true,
    };
    Inventory {
        driver: Some(DriverInfo {
            version: "1.2".into(),
            cuda_version: Some((12, 0)),
        }),
        gpus: vec![gpu(0), gpu(1)],
        topology: Topology::unknown(2),
        absent_reason: None,
        mig: Default::default(),
    }
}

struct Running {
    addr: SocketAddr,
    socket: PathBuf,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
    _dir: tempfile::TempDir,
}

impl Running {
    async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        tokio::time::timeout(Duration::from_secs(10), &mut self.task)
            .await
            .expect("stops")
            .expect("no panic");
    }
}

fn apis(dir: &Path) -> (Arc<RestApi>, Arc<PluginApi>, Arc<DriverVolumes>) {
    let host = Devices {
        nodes: DeviceNodes::named(std::path::Path::new("/dev"), &inventory()),
        dev_root: "/dev".into(),
        proc_root: "/proc".into(),
    };
    let rest = Arc::new(RestApi::new(
        Arc::new(inventory()),
        host,
        VolumeSource::Plugin {
            plugin: "nvidia-docker".into(),
        },
        Arc::new(NoStatus),
    ));
    let volumes = DriverVolumes::new(Arc::new(DirBuilder(dir.join("volumes"))));
    volumes.set_driver(Some("1.2"));
    let plugin = Arc::new(PluginApi::new(Arc::clone(&volumes), Duration::from_secs(2)));
    (rest, plugin, volumes)
}

async fn start() -> Running {
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("plugins/nvidia-docker.sock");
    let (rest, plugin, _) = apis(dir.path());
    let config = ServerConfig {
        rest_listen: Some("127.0.0.1:0".parse().expect("addr")),
        plugin_socket: Some(socket.clone()),
    };
    let server = Server::bind(&config, rest, plugin).await.expect("bind");
    let addr = server.rest_addr().expect("rest addr");
    let (stop, stopped) = oneshot::channel();
    let task = tokio::spawn(server.run(async move {
        let _ = stopped.await;
    }));
    Running {
        addr,
        socket,
        stop: Some(stop),
        task,
        _dir: dir,
    }
}

async fn exchange<S: AsyncRead + AsyncWrite + Unpin>(mut stream: S, request: &[u8]) -> String {
    stream.write_all(request).await.expect("write");
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut out))
        .await
        .expect("answer in time")
        .expect("read");
    String::from_utf8_lossy(&out).into_owned()
}

async fn get(addr: SocketAddr, target: &str) -> String {
    let req = format!("GET {target} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    exchange(
        TcpStream::connect(addr).await.expect("connect"),
        req.as_bytes(),
    )
    .await
}

async fn post(socket: &Path, path: &str, body: &str) -> String {
    let req = format!(
        "POST {path} HTTP/1.1\r\nHost: plugin\r\nAccept: application/vnd.docker.plugins.v1.2+json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    exchange(
        UnixStream::connect(socket).await.expect("connect"),
        req.as_bytes(),
    )
    .await
}

#[tokio::test]
async fn an_oversized_plugin_body_is_refused_before_it_is_read() {
    let server = start().await;
    let stream = UnixStream::connect(&server.socket).await.expect("connect");
    let (mut read, mut write) = stream.into_split();
    // Announces 300 MB and sends 4 MiB of it: the answer must come without the rest.
    let head =
        "POST /VolumeDriver.Get HTTP/1.1\r\nHost: plugin\r\nContent-Length: 300000000\r\n\r\n";
    write.write_all(head.as_bytes()).await.expect("write");
    let writer = tokio::spawn(async move {
        let chunk = vec![b'x'; 64 * 1024];
        for _ in 0..64 {
            if write.write_all(&chunk).await.is_err() {
                break;
            }
        }
        write
    });
    let mut out = vec![0; 4096];
    let n = tokio::time::timeout(Duration::from_secs(10), read.read(&mut out))
        .await
        .expect("answered before the whole body")
        .expect("read");
    let reply = String::from_utf8_lossy(&out[..n]);
    assert!(reply.starts_with("HTTP/1.1 413"), "{reply}");
    assert!(
        reply.contains(r#"{"Err":"request body larger than 65536 bytes"}"#),
        "{reply}"
    );
    drop(writer.await.expect("writer"));
    // The server still answers normal requests.
    let reply = post(&server.socket, "/Plugin.Activate", "").await;
    assert!(reply.contains("VolumeDriver"), "{reply}");
    server.stop().await;
}

#[tokio::test]
async fn serves_rest_and_plugin_then_removes_the_socket() {
    let server = start().await;
    let reply = get(server.addr, "/v1.0/docker/cli?dev=1").await;
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    assert!(
        reply.contains("--device=/dev/nvidiactl --device=/dev/nvidia-uvm --device=/dev/nvidia1 --env=NVIDIA_VISIBLE_DEVICES=GPU-"),
        "{reply}"
    );
    assert!(get(server.addr, "/nope").await.starts_with("HTTP/1.1 404"));

    let mode = std::fs::metadata(&server.socket)
        .expect("socket")
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o660);
    let reply = post(&server.socket, "/Plugin.Activate", "").await;
    assert!(
        reply.starts_with("HTTP/1.1 200") && reply.contains(r#"{"Implements":["VolumeDriver"]}"#),
        "{reply}"
    );
    let reply = post(
        &server.socket,
        "/VolumeDriver.Mount",
        r#"{"Name":"nvidia_driver_1.2","ID":"abc"}"#,
    )
    .await;
    assert!(
        reply.contains(r#"volumes/1.2"}"#) && reply.contains(r#""Err":"""#),
        "{reply}"
    );
    assert!(
        reply.contains("application/vnd.docker.plugins.v1+json"),
        "{reply}"
    );
    let reply = post(
        &server.socket,
        "/VolumeDriver.Get",
        r#"{"Name":"nvidia_driver_9.9"}"#,
    )
    .await;
    assert!(reply.contains("invalid volume version"), "{reply}");

    let socket = server.socket.clone();
    server.stop().await;
    assert!(!socket.exists(), "socket removed on shutdown");
}

#[tokio::test]
async fn survives_garbage_and_clients_that_hang_up() {
    let server = start().await;
    // Hang up mid-headers, mid-body, and right after connecting, on both listeners.
    for partial in [
        &b"GET /gpu/info HTTP/1.1\r\nHo"[..],
        b"",
        b"GET /gpu/info HTTP/1.1\r\nHost: x\r\nContent-Length: 50\r\n\r\nabc",
    ] {
        let mut s = TcpStream::connect(server.addr).await.expect("connect");
        s.write_all(partial).await.expect("write");
        drop(s);
        let mut u = UnixStream::connect(&server.socket).await.expect("connect");
        u.write_all(partial).await.expect("write");
        drop(u);
    }
    let reply = post(&server.socket, "/VolumeDriver.Create", "").await;
    assert!(reply.contains("invalid request body"), "{reply}");
    // Garbage gets a 400 (or a closed connection), never a crash.
    for garbage in [
        &b"\x16\x03\x01\x02\x00garbage\r\n\r\n"[..],
        b"NOT HTTP AT ALL\r\n\r\n",
        &[0u8; 4096][..],
    ] {
        let reply = exchange(
            TcpStream::connect(server.addr).await.expect("connect"),
            garbage,
        )
        .await;
        assert!(
            reply.is_empty() || reply.starts_with("HTTP/1.1 400"),
            "{reply}"
        );
        let reply = exchange(
            UnixStream::connect(&server.socket).await.expect("connect"),
            garbage,
        )
        .await;
        assert!(
            reply.is_empty() || reply.starts_with("HTTP/1.1 400"),
            "{reply}"
        );
    }
    assert!(
        get(server.addr, "/gpu/info/json")
            .await
            .starts_with("HTTP/1.1 200")
    );
    assert!(
        post(&server.socket, "/Plugin.Activate", "")
            .await
            .starts_with("HTTP/1.1 200")
    );
    server.stop().await;
}

#[tokio::test]
async fn a_live_socket_is_refused_and_a_stale_one_replaced() {
    let server = start().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let (rest, plugin, _) = apis(dir.path());
    let config = ServerConfig {
        rest_listen: None,
        plugin_socket: Some(server.socket.clone()),
    };
    let err = Server::bind(&config, Arc::clone(&rest), Arc::clone(&plugin))
        .await
        .expect_err("in use");
    assert!(matches!(err, ServerError::SocketInUse { .. }), "{err}");
    assert!(
        post(&server.socket, "/Plugin.Activate", "")
            .await
            .starts_with("HTTP/1.1 200"),
        "first server untouched"
    );
    server.stop().await;

    // A socket file nobody listens on is stale.
    let stale = dir.path().join("stale.sock");
    drop(std::os::unix::net::UnixListener::bind(&stale).expect("bind"));
    assert!(stale.exists());
    let config = ServerConfig {
        rest_listen: None,
        plugin_socket: Some(stale.clone()),
    };
    let server = Server::bind(&config, Arc::clone(&rest), Arc::clone(&plugin))
        .await
        .expect("replaces stale");
    drop(server);
    assert!(
        !stale.exists(),
        "an unused server removes its socket on drop"
    );

    // Anything else is never deleted.
    let file = dir.path().join("file.sock");
    std::fs::write(&file, b"keep me").expect("write");
    let config = ServerConfig {
        rest_listen: None,
        plugin_socket: Some(file.clone()),
    };
    let err = Server::bind(&config, rest, plugin)
        .await
        .expect_err("not a socket");
    assert!(matches!(err, ServerError::NotASocket { .. }), "{err}");
    assert_eq!(std::fs::read(&file).expect("kept"), b"keep me");
}

#[tokio::test]
async fn driver_watch_moves_rest_and_volumes_to_a_new_driver() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (rest, _, volumes) = apis(dir.path());
    let version = Arc::new(std::sync::Mutex::new("1.2".to_owned()));
    let v = Arc::clone(&version);
    let probe = move || {
        let mut inv = inventory();
        if let Some(d) = inv.driver.as_mut() {
            d.version = v.lock().expect("lock").clone();
        }
        Ok(inv)
    };
    let watch = spawn_driver_watch(
        probe,
        Duration::from_millis(20),
        Arc::clone(&rest),
        Arc::clone(&volumes),
    );
    *version.lock().expect("lock") = "2.0".to_owned();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        if let VolumeState::Ready { version, .. } = volumes.state()
            && version == "2.0"
        {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "volume rebuilt for 2.0: {:?}",
            volumes.state()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    watch.abort();
    let body = rest.respond(&hyper::Method::GET, "/docker/cli", None);
    let bytes =
        futures_util::FutureExt::now_or_never(http_body_util::BodyExt::collect(body.into_body()))
            .expect("ready")
            .expect("body")
            .to_bytes();
    assert!(
        String::from_utf8_lossy(&bytes).contains("nvidia_driver_2.0:"),
        "{bytes:?}"
    );
    assert!(dir.path().join("volumes/2.0").is_dir());
}

#[tokio::test]
async fn sigterm_completes_the_shutdown_future() {
    let signal = shutdown_signal().expect("handlers");
    let pid = std::process::id().to_string();
    let status = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .expect("kill");
    assert!(status.success());
    let name = tokio::time::timeout(Duration::from_secs(10), signal)
        .await
        .expect("signal seen");
    assert_eq!(name, "SIGTERM");
}
