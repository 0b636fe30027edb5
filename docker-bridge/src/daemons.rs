//! The pool's Docker liveness check ([`DockerDaemons`]) over the Docker Engine API.
//!
//! The isolator asks synchronously, under the pool's lock (which other processes wait for at
//! most 10 s), so each question is bounded by [`ASK_TIMEOUT`] and runs on a thread of its own
//! with its own runtime (a caller may already be inside a tokio runtime, where blocking on
//! another is not allowed). A daemon that did not answer is not asked again for
//! [`UNREACHABLE_FOR`]: every reservation on it is uncertain meanwhile, at no further wait.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use mesos_gpu_pool::{DaemonAnswer, DockerDaemons};

use crate::client::{DockerClient, DockerError, gpu_minor};

/// How long one question to a daemon may take.
pub const ASK_TIMEOUT: Duration = Duration::from_secs(3);
/// How long a daemon that did not answer is taken as unreachable without asking again.
pub const UNREACHABLE_FOR: Duration = Duration::from_secs(30);

/// Asks the daemons named in owner records (`unix:///PATH` endpoints) about their containers.
#[derive(Debug, Default)]
pub struct EngineDaemons {
    unreachable: Mutex<HashMap<String, (Instant, String)>>,
}

impl EngineDaemons {
    /// A checker that has asked nothing yet.
    pub fn new() -> EngineDaemons {
        EngineDaemons::default()
    }
}

impl EngineDaemons {
    /// Asks the daemon at `endpoint` with `question` (bounded by [`ASK_TIMEOUT`], on a thread of
    /// its own); a daemon that did not answer is remembered for [`UNREACHABLE_FOR`].
    fn ask<T: Send>(
        &self,
        endpoint: &str,
        question: impl AsyncFnOnce(&DockerClient) -> Result<T, DockerError> + Send,
    ) -> Result<T, String> {
        let Some(socket) = endpoint.strip_prefix("unix://") else {
            return Err(format!(
                "{endpoint:?}: only unix:// daemon endpoints are supported"
            ));
        };
        if let Ok(cache) = self.unreachable.lock()
            && let Some((at, why)) = cache.get(endpoint)
            && at.elapsed() < UNREACHABLE_FOR
        {
            return Err(why.clone());
        }
        let answer = std::thread::scope(|s| {
            s.spawn(|| ask(Path::new(socket), question))
                .join()
                .unwrap_or_else(|_| Err("the Docker client panicked".to_owned()))
        });
        if let Err(why) = &answer
            && let Ok(mut cache) = self.unreachable.lock()
        {
            cache.insert(endpoint.to_owned(), (Instant::now(), why.clone()));
        }
        answer
    }
}

impl DockerDaemons for EngineDaemons {
    fn container(&self, endpoint: &str, name: &str) -> DaemonAnswer {
        match self.ask(endpoint, async |client| client.container_status(name).await) {
            Ok(Some(status)) => DaemonAnswer::State(status),
            Ok(None) => DaemonAnswer::NoSuchContainer,
            Err(why) => DaemonAnswer::Unreachable(why),
        }
    }

    fn gpu_minors(&self, endpoint: &str, name: &str) -> Result<Vec<u32>, String> {
        let devices = self.ask(endpoint, async |client| client.devices(name).await)?;
        Ok(devices
            .iter()
            .filter_map(|d| d.path_on_host.as_deref().and_then(gpu_minor))
            .collect())
    }
}

/// One question, on the calling thread (which must not be in a tokio runtime).
fn ask<T>(
    socket: &Path,
    question: impl AsyncFnOnce(&DockerClient) -> Result<T, DockerError>,
) -> Result<T, String> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start a runtime: {e}"))?;
    runtime.block_on(async {
        let asked = tokio::time::timeout(ASK_TIMEOUT, async {
            question(&DockerClient::connect(socket).await?).await
        })
        .await;
        match asked {
            Err(_) => Err(format!("no answer within {ASK_TIMEOUT:?}")),
            Ok(answer) => answer.map_err(|e| error_chain(&e)),
        }
    })
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}
