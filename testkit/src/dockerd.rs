//! A Docker daemon of a test on a unix socket, for what `mesos-gpu` asks a daemon without
//! starting containers: `/_ping`, `/version` (API 1.41), an empty container list, images with
//! the labels the test gives, and "no such container" (404) for everything else. No other test's
//! container takes part, and nothing is pulled or built.

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};

/// The daemon, answering on its own threads for as long as the test process lives.
#[derive(Debug)]
pub struct FakeDockerd {
    socket: PathBuf,
}

impl FakeDockerd {
    /// Listens on `socket`; every image has `labels` (`KEY`, `VALUE`) and no environment.
    pub fn start(socket: &Path, labels: &[(&str, &str)]) -> std::io::Result<FakeDockerd> {
        let listener = UnixListener::bind(socket)?;
        let labels: serde_json::Map<String, serde_json::Value> = labels
            .iter()
            .map(|(k, v)| ((*k).to_owned(), serde_json::Value::from(*v)))
            .collect();
        let image =
            serde_json::json!({ "Id": "sha256:0", "Config": { "Labels": labels, "Env": [] } })
                .to_string();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let image = image.clone();
                std::thread::spawn(move || answer(stream, &image));
            }
        });
        Ok(FakeDockerd {
            socket: socket.to_owned(),
        })
    }

    /// Its socket.
    pub fn socket(&self) -> &Path {
        &self.socket
    }
}

/// Answers the HTTP/1.1 requests of one connection until it closes.
fn answer(stream: UnixStream, image: &str) {
    let Ok(read) = stream.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(read);
    let mut writer = stream;
    loop {
        let mut request = String::new();
        if reader.read_line(&mut request).unwrap_or(0) == 0 {
            return;
        }
        let mut length = 0usize;
        loop {
            let mut header = String::new();
            if reader.read_line(&mut header).unwrap_or(0) == 0 {
                return;
            }
            if header == "\r\n" {
                break;
            }
            if let Some(v) = header.to_ascii_lowercase().strip_prefix("content-length:") {
                length = v.trim().parse().unwrap_or(0);
            }
        }
        let mut body = vec![0; length];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        let path = request.split_whitespace().nth(1).unwrap_or("/");
        let path = path.split('?').next().unwrap_or(path);
        let (status, reply) = if path.ends_with("/_ping") {
            ("200 OK", "OK")
        } else if path.ends_with("/version") {
            (
                "200 OK",
                r#"{"ApiVersion":"1.41","MinAPIVersion":"1.12","Version":"20.10.0","Os":"linux","Arch":"amd64"}"#,
            )
        } else if path.ends_with("/containers/json") {
            ("200 OK", "[]")
        } else if path.contains("/images/") && path.ends_with("/json") {
            ("200 OK", image)
        } else {
            (
                "404 Not Found",
                r#"{"message":"No such container: not served by this test's Docker daemon"}"#,
            )
        };
        let head = format!(
            "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nApi-Version: 1.41\r\nContent-Length: {}\r\n\r\n",
            reply.len()
        );
        if writer.write_all(head.as_bytes()).is_err() || writer.write_all(reply.as_bytes()).is_err()
        {
            return;
        }
    }
}
