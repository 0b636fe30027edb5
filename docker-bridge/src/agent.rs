//! Framework names, read from the Mesos agent: neither the `ContainerConfig` of `prepare` nor
//! the Docker hook's `ExecutorInfo` carries a framework's name, only its id, so the name comes
//! from the agent's `GET /state` (`frameworks[].{id, name}`, and `completed_frameworks[]`;
//! `docs/endpoints/slave/state.md`). One reader for every entry point: the module (the agent's
//! own address, from the `LIBPROCESS_IP`/`LIBPROCESS_PORT` the agent sets from its `--ip` and
//! `--port` before libprocess starts, `src/slave/main.cpp`) and `mesos-gpu serve --agent-url`.
//!
//! Names are cached per framework id (a framework's name does not change while it is
//! registered). A failed read (agent down, `--authenticate_http_readonly`, a slow answer past
//! [`node_http::TIMEOUT`]) leaves the name unknown, logs why at debug, and is not retried for
//! [`RETRY_AFTER`], so a scrape never waits on an agent that does not answer more than once a
//! while. The request is [`node_http::get_json`]'s plain HTTP/1.0 over a blocking socket.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::node_http::{self, GetError};

/// How long after a failed read the agent is not asked again.
pub const RETRY_AFTER: Duration = Duration::from_secs(30);

/// Looks up framework names by framework id.
pub trait FrameworkNames: Send + Sync {
    /// The name of framework `id`, when known.
    fn name(&self, id: &str) -> Option<String>;
}

/// `holder` with its framework's name from `names`, when it names a framework and no name: the
/// one place a holder gets its framework name (metrics, the module's `/mesos-gpu/containers`).
pub fn with_framework_name(
    mut holder: mesos_gpu_pool::Holder,
    names: &dyn FrameworkNames,
) -> mesos_gpu_pool::Holder {
    if holder.framework_name.is_none()
        && let Some(id) = &holder.framework_id
    {
        holder.framework_name = names.name(id);
    }
    holder
}

/// The framework names one Mesos agent knows, read from its `/state` when a name is missing.
#[derive(Debug)]
pub struct AgentFrameworks {
    addr: SocketAddr,
    cache: Mutex<Cache>,
}

#[derive(Debug, Default)]
struct Cache {
    names: HashMap<String, String>,
    failed_at: Option<Instant>,
}

impl AgentFrameworks {
    /// The agent at `addr`.
    pub fn at(addr: SocketAddr) -> AgentFrameworks {
        AgentFrameworks {
            addr,
            cache: Mutex::new(Cache::default()),
        }
    }

    /// The agent at `url` (`http://HOST:PORT`, a trailing `/` allowed; HOST resolved now).
    pub fn from_url(url: &str) -> Result<AgentFrameworks, GetError> {
        node_http::address(url).map(AgentFrameworks::at)
    }

    /// The agent this process runs in, from `LIBPROCESS_IP` (any address or none: loopback)
    /// and `LIBPROCESS_PORT`; `None` when the port is not set.
    pub fn of_this_agent() -> Option<AgentFrameworks> {
        let port: u16 = std::env::var("LIBPROCESS_PORT").ok()?.parse().ok()?;
        let ip = std::env::var("LIBPROCESS_IP")
            .ok()
            .and_then(|ip| ip.parse::<std::net::IpAddr>().ok())
            .filter(|ip| !ip.is_unspecified())
            .unwrap_or(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST));
        Some(AgentFrameworks::at(SocketAddr::new(ip, port)))
    }

    /// Reads every framework's id and name from the agent's `/state` now.
    pub fn read(&self) -> Result<HashMap<String, String>, GetError> {
        #[derive(serde::Deserialize)]
        struct State {
            #[serde(default)]
            frameworks: Vec<Framework>,
            #[serde(default)]
            completed_frameworks: Vec<Framework>,
        }
        #[derive(serde::Deserialize)]
        struct Framework {
            id: String,
            #[serde(default)]
            name: String,
        }
        let state: State = node_http::get_json(self.addr, "/state")?;
        Ok(state
            .completed_frameworks
            .into_iter()
            .chain(state.frameworks)
            .map(|f| (f.id, f.name))
            .collect())
    }
}

impl FrameworkNames for AgentFrameworks {
    fn name(&self, id: &str) -> Option<String> {
        let mut cache = self.cache.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(name) = cache.names.get(id) {
            return Some(name.clone());
        }
        if cache.failed_at.is_some_and(|at| at.elapsed() < RETRY_AFTER) {
            return None;
        }
        match self.read() {
            Ok(names) => {
                cache.failed_at = None;
                cache.names.extend(names);
            }
            Err(error) => {
                tracing::debug!(error = %mesos_gpu_os::error_chain(&error), framework = id, "no framework name from the agent");
                cache.failed_at = Some(Instant::now());
            }
        }
        let name = cache.names.get(id).cloned();
        if name.is_none() && cache.failed_at.is_none() {
            // The agent answered without it (a framework it no longer reports): not asked again
            // for a while either.
            tracing::debug!(framework = id, "the agent's /state names no such framework");
            cache.failed_at = Some(Instant::now());
        }
        name
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a failed unwrap fails the test at its line
mod tests {
    use super::*;
    use std::io::{Read as _, Write as _};
    use std::net::TcpListener;

    /// Serves `answer` to each of `times` connections; returns the address.
    fn agent(answer: &'static str, times: usize) -> (SocketAddr, std::thread::JoinHandle<usize>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let served = std::thread::spawn(move || {
            let mut n = 0;
            for stream in listener.incoming().take(times) {
                let mut stream = stream.unwrap();
                let mut request = [0u8; 1024];
                let _ = stream.read(&mut request).unwrap();
                stream.write_all(answer.as_bytes()).unwrap();
                n += 1;
            }
            n
        });
        (addr, served)
    }

    #[test]
    fn names_are_read_once_and_cached() {
        let (addr, served) = agent(
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n\
             {\"frameworks\":[{\"id\":\"fw-1\",\"name\":\"marathon\"}],\
             \"completed_frameworks\":[{\"id\":\"fw-0\",\"name\":\"old\"}]}",
            1,
        );
        let names = AgentFrameworks::from_url(&format!("http://{addr}/")).unwrap();
        assert_eq!(names.name("fw-1").as_deref(), Some("marathon"));
        assert_eq!(names.name("fw-0").as_deref(), Some("old"));
        assert_eq!(served.join().unwrap(), 1, "one read for both");
        // Cached: the agent is gone, the name is still known.
        assert_eq!(names.name("fw-1").as_deref(), Some("marathon"));
        // Unknown, and the agent is not asked again at once.
        assert_eq!(names.name("fw-2"), None);
    }

    #[test]
    fn a_refusing_agent_leaves_names_unknown() {
        let (addr, served) = agent("HTTP/1.1 401 Unauthorized\r\n\r\n", 1);
        let names = AgentFrameworks::at(addr);
        let err = names.read().unwrap_err();
        assert!(matches!(err, GetError::Status { .. }), "{err}");
        assert!(err.to_string().contains("401"), "{err}");
        served.join().unwrap();
        assert_eq!(names.name("fw-1"), None);
        assert!(AgentFrameworks::from_url("https://agent:5051").is_err());
        assert!(AgentFrameworks::from_url("agent:5051").is_err());
    }
}
