//! What the Mesos agent says of a container's holder. Neither the `ContainerConfig` of
//! `prepare` nor the Docker hook's `ExecutorInfo` carries a framework's name, only its id, so the
//! name comes from the agent's `GET /state` (`frameworks[].{id, name}`, and
//! `completed_frameworks[]`; `docs/endpoints/slave/state.md`). A container whose record names no
//! holder (recorded by a mesos-gpu from before holders were recorded, or by a `docker-args` run
//! by hand) gets its executor and framework from the agent's `GET /containers`
//! (`[{container_id, executor_id, framework_id, …}]`, `docs/endpoints/slave/containers.md`), by
//! `serve` only: the agent answers `/containers` by asking every isolator for the containers'
//! usage, so the module asking its own agent would wait on itself. One reader for every entry
//! point: the module (the agent's own address, from the `LIBPROCESS_IP`/`LIBPROCESS_PORT` the
//! agent sets from its `--ip` and `--port` before libprocess starts, `src/slave/main.cpp`),
//! `mesos-gpu serve --agent-url` and `gpu top`.
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
use mesos_gpu_pool::Holder;

/// How long after a failed read the agent is not asked again.
pub const RETRY_AFTER: Duration = Duration::from_secs(30);
/// How long a read of the agent's `/containers` is reused (containers come and go; a scrape
/// asks for each container without a holder).
const CONTAINERS_FRESH: Duration = Duration::from_secs(2);

/// What the agent says of containers' holders.
pub trait AgentHolders: Send + Sync {
    /// The name of framework `id`, when known.
    fn framework_name(&self, id: &str) -> Option<String>;

    /// Whose container `container` is (its executor and framework), for a container whose
    /// record names no holder; `None` when the agent does not say.
    fn holder_of(&self, container: &str) -> Option<Holder>;
}

/// The holder of `container`: the one `recorded` with it, else what the agent says; with its
/// framework's name from the agent when it names a framework and no name. The one place a
/// holder is completed (metrics, the module's `/mesos-gpu/containers`, `gpu top`).
pub fn complete(
    container: &str,
    recorded: Option<Holder>,
    agent: &dyn AgentHolders,
) -> Option<Holder> {
    let mut holder = recorded.or_else(|| agent.holder_of(container))?;
    if holder.framework_name.is_none()
        && let Some(id) = &holder.framework_id
    {
        holder.framework_name = agent.framework_name(id);
    }
    Some(holder)
}

/// One Mesos agent's HTTP API, read when a framework name or a holder is missing, and cached.
#[derive(Debug)]
pub struct MesosAgent {
    addr: SocketAddr,
    /// Whether `/containers` may be asked (not by the module of this very agent).
    ask_containers: bool,
    cache: Mutex<Cache>,
}

#[derive(Debug, Default)]
struct Cache {
    names: HashMap<String, String>,
    failed_at: Option<Instant>,
    holders: HashMap<String, Holder>,
    /// When `/containers` was last asked, and whether it answered.
    containers_read: Option<(Instant, bool)>,
}

impl MesosAgent {
    /// The agent at `addr`, another process's (`serve`, `gpu top`): both endpoints are read.
    pub fn at(addr: SocketAddr) -> MesosAgent {
        MesosAgent {
            addr,
            ask_containers: true,
            cache: Mutex::new(Cache::default()),
        }
    }

    /// The agent at `url` (`http://HOST:PORT`, a trailing `/` allowed; HOST resolved now).
    pub fn from_url(url: &str) -> Result<MesosAgent, GetError> {
        node_http::address(url).map(MesosAgent::at)
    }

    /// The agent this process runs in, from `LIBPROCESS_IP` (any address or none: loopback)
    /// and `LIBPROCESS_PORT`; `None` when the port is not set. Its `/containers` is never
    /// asked (see the module documentation).
    pub fn of_this_agent() -> Option<MesosAgent> {
        let port: u16 = std::env::var("LIBPROCESS_PORT").ok()?.parse().ok()?;
        let ip = std::env::var("LIBPROCESS_IP")
            .ok()
            .and_then(|ip| ip.parse::<std::net::IpAddr>().ok())
            .filter(|ip| !ip.is_unspecified())
            .unwrap_or(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST));
        Some(MesosAgent {
            ask_containers: false,
            ..MesosAgent::at(SocketAddr::new(ip, port))
        })
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

    /// Reads every container's executor and framework from the agent's `/containers` now.
    pub fn read_containers(&self) -> Result<HashMap<String, Holder>, GetError> {
        #[derive(serde::Deserialize)]
        struct Container {
            container_id: String,
            #[serde(default)]
            executor_id: Option<String>,
            #[serde(default)]
            framework_id: Option<String>,
        }
        let containers: Vec<Container> = node_http::get_json(self.addr, "/containers")?;
        Ok(containers
            .into_iter()
            .filter_map(|c| {
                let holder = Holder {
                    executor_id: c.executor_id,
                    framework_id: c.framework_id,
                    ..Holder::default()
                };
                Some((c.container_id, holder.known()?))
            })
            .collect())
    }
}

impl AgentHolders for MesosAgent {
    fn framework_name(&self, id: &str) -> Option<String> {
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

    fn holder_of(&self, container: &str) -> Option<Holder> {
        if !self.ask_containers {
            return None;
        }
        let mut cache = self.cache.lock().unwrap_or_else(PoisonError::into_inner);
        let stale = match cache.containers_read {
            None => true,
            Some((at, true)) => at.elapsed() >= CONTAINERS_FRESH,
            Some((at, false)) => at.elapsed() >= RETRY_AFTER,
        };
        if stale {
            match self.read_containers() {
                Ok(holders) => {
                    cache.holders = holders;
                    cache.containers_read = Some((Instant::now(), true));
                }
                Err(error) => {
                    tracing::debug!(error = %mesos_gpu_os::error_chain(&error), container, "no holder from the agent's /containers");
                    cache.holders.clear();
                    cache.containers_read = Some((Instant::now(), false));
                }
            }
        }
        cache.holders.get(container).cloned()
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
        let names = MesosAgent::from_url(&format!("http://{addr}/")).unwrap();
        assert_eq!(names.framework_name("fw-1").as_deref(), Some("marathon"));
        assert_eq!(names.framework_name("fw-0").as_deref(), Some("old"));
        assert_eq!(served.join().unwrap(), 1, "one read for both");
        // Cached: the agent is gone, the name is still known.
        assert_eq!(names.framework_name("fw-1").as_deref(), Some("marathon"));
        // Unknown, and the agent is not asked again at once.
        assert_eq!(names.framework_name("fw-2"), None);
    }

    #[test]
    fn a_refusing_agent_leaves_names_unknown() {
        let (addr, served) = agent("HTTP/1.1 401 Unauthorized\r\n\r\n", 1);
        let names = MesosAgent::at(addr);
        let err = names.read().unwrap_err();
        assert!(matches!(err, GetError::Status { .. }), "{err}");
        assert!(err.to_string().contains("401"), "{err}");
        served.join().unwrap();
        assert_eq!(names.framework_name("fw-1"), None);
        assert!(MesosAgent::from_url("https://agent:5051").is_err());
        assert!(MesosAgent::from_url("agent:5051").is_err());
    }

    #[test]
    fn a_container_without_a_recorded_holder_gets_the_agents_executor_and_framework() {
        // Mesos's `/containers` (docs/endpoints/slave/containers.md), then its `/state`.
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let served = std::thread::spawn(move || {
            let mut paths = Vec::new();
            for stream in listener.incoming().take(2) {
                let mut stream = stream.unwrap();
                let mut request = [0u8; 1024];
                let n = stream.read(&mut request).unwrap();
                let request = String::from_utf8_lossy(&request[..n]).into_owned();
                let path = request.split_whitespace().nth(1).unwrap_or("").to_owned();
                let body = match path.as_str() {
                    "/containers" => {
                        r#"[{"container_id":"c-old","executor_id":"e1","executor_name":"","framework_id":"fw-1","source":"","statistics":{}}]"#
                    }
                    _ => r#"{"frameworks":[{"id":"fw-1","name":"marathon"}]}"#,
                };
                write!(stream, "HTTP/1.1 200 OK\r\n\r\n{body}").unwrap();
                paths.push(path);
            }
            paths
        });
        let agent = MesosAgent::at(addr);
        let recorded = Holder {
            task_id: Some("t9".into()),
            ..Holder::default()
        };
        // A recorded holder is kept as it is (no framework: nothing asked).
        assert_eq!(
            complete("c-new", Some(recorded.clone()), &agent),
            Some(recorded)
        );
        let found = complete("c-old", None, &agent).unwrap();
        assert_eq!(
            found,
            Holder {
                executor_id: Some("e1".into()),
                framework_id: Some("fw-1".into()),
                framework_name: Some("marathon".into()),
                ..Holder::default()
            }
        );
        assert_eq!(served.join().unwrap(), ["/containers", "/state"]);
        // The agent's own module never asks its `/containers`.
        let own = MesosAgent {
            ask_containers: false,
            ..MesosAgent::at(addr)
        };
        assert_eq!(own.holder_of("c-old"), None);
    }
}
