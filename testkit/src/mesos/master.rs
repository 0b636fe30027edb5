//! A `mesos-master`.

use std::io::Read as _;
use std::process::{Child, Command};
use std::time::Duration;

use tempfile::TempDir;

use super::{MesosInstall, MesosResult, free_port, read_lossy, spawn_logged, tail, wait_for};

/// A `mesos-master` on 127.0.0.1 with an in-memory registry; killed on drop.
#[derive(Debug)]
pub struct Master {
    child: Child,
    port: u16,
    dir: TempDir,
}

impl Master {
    /// Starts a master and waits until it answers HTTP.
    pub fn start(install: &MesosInstall) -> MesosResult<Master> {
        let dir = tempfile::Builder::new()
            .prefix("mgpu-mesos-master")
            .tempdir()
            .map_err(|e| format!("tempdir: {e}"))?;
        let port = free_port()?;
        let child = spawn_logged(
            Command::new(install.sbin("mesos-master"))
                .arg("--ip=127.0.0.1")
                .arg(format!("--port={port}"))
                .arg(format!("--work_dir={}", dir.path().join("work").display()))
                .arg("--registry=in_memory")
                .arg("--allocation_interval=200ms"),
            &dir.path().join("master.log"),
        )?;
        let mut master = Master { child, port, dir };
        wait_for(
            Duration::from_secs(20),
            || format!("the master to answer; log:\n{}", tail(&master.log(), 20)),
            || http_get(port, "/health").ok(),
        )?;
        if let Ok(Some(status)) = master.child.try_wait() {
            return Err(format!(
                "mesos-master exited: {status}\n{}",
                tail(&master.log(), 20)
            ));
        }
        Ok(master)
    }

    /// `127.0.0.1:<port>`.
    pub fn address(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// The master's HTTP port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The master's log.
    pub fn log(&self) -> String {
        read_lossy(&self.dir.path().join("master.log"))
    }
}

impl Drop for Master {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A minimal HTTP/1.0 GET on 127.0.0.1; the body on a 2xx answer.
pub fn http_get(port: u16, path: &str) -> MesosResult<String> {
    http(
        port,
        &format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n"),
    )
}

/// A minimal HTTP/1.0 POST of a JSON `body` on 127.0.0.1 (e.g. the master's `/api/v1`); the
/// answer's body on a 2xx answer.
pub fn http_post_json(port: u16, path: &str, body: &str) -> MesosResult<String> {
    http(
        port,
        &format!(
            "POST {path} HTTP/1.0\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\n\r\n{body}",
            body.len()
        ),
    )
}

fn http(port: u16, request: &str) -> MesosResult<String> {
    use std::io::Write as _;
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .map_err(|e| e.to_string())?;
    s.write_all(request.as_bytes()).map_err(|e| e.to_string())?;
    let mut reply = String::new();
    s.read_to_string(&mut reply).map_err(|e| e.to_string())?;
    let (head, body) = reply.split_once("\r\n\r\n").unwrap_or((&reply, ""));
    if head.starts_with("HTTP/1.1 2") || head.starts_with("HTTP/1.0 2") {
        Ok(body.to_owned())
    } else {
        Err(head.lines().next().unwrap_or("").to_owned())
    }
}
