//! A plain HTTP GET of a JSON page from a service on this node or its network: the Mesos
//! agent (`/state`, the module's `/mesos-gpu/containers`) and `serve` (`/gpu/status/json`).
//! HTTP/1.0 over a blocking socket with a timeout, no TLS: the module must not start an async
//! runtime inside the agent, and an HTTP/1.0 answer is never chunked (libprocess and hyper both
//! close the connection after it).

use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs as _};
use std::time::Duration;

use serde::de::DeserializeOwned;

/// How long one request may take, connecting included.
pub const TIMEOUT: Duration = Duration::from_secs(2);
/// The most an answer may be; a larger one is refused (a big agent's `/state` is megabytes).
const MAX_ANSWER: u64 = 64 << 20;

/// Why a page could not be read.
#[derive(Debug, thiserror::Error)]
pub enum GetError {
    /// The base URL is not `http://HOST:PORT`.
    #[error("URL {url:?}: expected http://HOST:PORT (https is not read)")]
    Url {
        /// The URL given.
        url: String,
    },
    /// Connecting, sending or reading failed.
    #[error("cannot read http://{addr}{path}")]
    Io {
        /// The service's address.
        addr: SocketAddr,
        /// The page.
        path: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The service answered with another status than 200 (401: HTTP authentication is on).
    #[error("http://{addr}{path} answered {status_line:?}")]
    Status {
        /// The service's address.
        addr: SocketAddr,
        /// The page.
        path: String,
        /// The answer's status line.
        status_line: String,
    },
    /// The answer is not the JSON expected.
    #[error("http://{addr}{path} is not the JSON expected")]
    Json {
        /// The service's address.
        addr: SocketAddr,
        /// The page.
        path: String,
        /// The cause.
        #[source]
        source: serde_json::Error,
    },
}

/// The address of `url` (`http://HOST:PORT`, a trailing `/` allowed; HOST resolved now).
pub fn address(url: &str) -> Result<SocketAddr, GetError> {
    let bad = || GetError::Url {
        url: url.to_owned(),
    };
    url.strip_prefix("http://")
        .map(|rest| rest.trim_end_matches('/'))
        .filter(|rest| !rest.is_empty() && !rest.contains('/'))
        .and_then(|hostport| hostport.to_socket_addrs().ok()?.next())
        .ok_or_else(bad)
}

/// GETs `path` of the service at `addr` and reads its JSON answer.
pub fn get_json<T: DeserializeOwned>(addr: SocketAddr, path: &str) -> Result<T, GetError> {
    let io = |source| GetError::Io {
        addr,
        path: path.to_owned(),
        source,
    };
    let mut stream = TcpStream::connect_timeout(&addr, TIMEOUT).map_err(io)?;
    stream.set_read_timeout(Some(TIMEOUT)).map_err(io)?;
    stream.set_write_timeout(Some(TIMEOUT)).map_err(io)?;
    // One write: a request in pieces may meet a server that reads one piece and answers.
    let request =
        format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\nAccept: application/json\r\n\r\n");
    stream.write_all(request.as_bytes()).map_err(io)?;
    let mut answer = Vec::new();
    stream
        .take(MAX_ANSWER)
        .read_to_end(&mut answer)
        .map_err(io)?;
    let split = answer
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or(answer.len());
    let head = String::from_utf8_lossy(&answer[..split]);
    let status_line = head.lines().next().unwrap_or("").to_owned();
    if status_line.split_whitespace().nth(1) != Some("200") {
        return Err(GetError::Status {
            addr,
            path: path.to_owned(),
            status_line,
        });
    }
    let body = answer.get(split + 4..).unwrap_or_default();
    serde_json::from_slice(body).map_err(|source| GetError::Json {
        addr,
        path: path.to_owned(),
        source,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a failed unwrap fails the test at its line
mod tests {
    use super::*;

    #[test]
    fn only_plain_http_host_port_urls_are_taken() {
        assert_eq!(
            address("http://127.0.0.1:5051/").unwrap(),
            "127.0.0.1:5051".parse::<SocketAddr>().unwrap()
        );
        assert!(address("http://localhost:3476").is_ok());
        for bad in [
            "https://agent:5051",
            "agent:5051",
            "http://",
            "http://a:1/state",
        ] {
            let err = address(bad).unwrap_err();
            assert!(err.to_string().contains(bad), "{err}");
        }
    }
}
