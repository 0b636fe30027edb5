//! Runs the REST API on TCP and the volume plugin on its unix socket, until told to stop.
//!
//! - One tokio task per connection, HTTP/1.1 (hyper 1), a 5 s header-read timeout as
//!   nvidia-docker's server had; a client that disconnects mid-request or sends garbage only
//!   ends its own connection.
//! - The plugin socket: its directory is created (0755) if missing and refused if another user
//!   can write it ([`mesos_gpu_os::fsmode::state_dir`]); an existing path that a live
//!   server answers on is refused ([`ServerError::SocketInUse`]); a stale socket file (connect
//!   refused) is replaced; anything that is not a socket is never deleted. The socket is made
//!   mode 0660 before it appears at its path, whatever the umask
//!   ([`mesos_gpu_os::fsmode::bind_socket`]), and removed on shutdown, unless another server has
//!   replaced it meanwhile.
//! - On shutdown the listeners close at once and open connections get a grace period.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::os::unix::fs::{FileTypeExt as _, MetadataExt as _};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use mesos_gpu_node::inventory::Inventory;
use mesos_gpu_os::fsmode;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, UnixListener};

use crate::plugin::{DriverVolumes, PluginApi};
use crate::rest::RestApi;

/// Time a client has to send its request headers.
const HEADER_TIMEOUT: Duration = Duration::from_secs(5);
/// Time open connections get to finish after shutdown starts.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);
/// Mode of the plugin socket: dockerd (root) and the socket's group.
const SOCKET_MODE: u32 = 0o660;

/// Why the server could not start or run.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// The REST address could not be bound.
    #[error("cannot listen on {addr}")]
    Listen {
        /// The address.
        addr: SocketAddr,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// A live server already answers on the plugin socket.
    #[error("{path} is in use by a running server; stop it first")]
    SocketInUse {
        /// The socket path.
        path: PathBuf,
    },
    /// The plugin socket path is taken by something that is not a socket.
    #[error("{path} exists and is not a unix socket; refusing to replace it")]
    NotASocket {
        /// The path.
        path: PathBuf,
    },
    /// The plugin socket's directory could not be made, or is refused as others can write it.
    #[error("cannot set up the plugin socket {path}")]
    SocketDir {
        /// The socket path.
        path: PathBuf,
        /// The cause.
        #[source]
        source: mesos_gpu_os::FsModeError,
    },
    /// The plugin socket could not be set up.
    #[error("cannot set up the plugin socket {path}")]
    Socket {
        /// The socket path.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// Waiting for signals failed.
    #[error("cannot install the SIGTERM/SIGINT handlers")]
    Signals {
        /// The cause.
        #[source]
        source: io::Error,
    },
}

/// Where to listen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerConfig {
    /// TCP address of the REST API; `None` disables it.
    pub rest_listen: Option<SocketAddr>,
    /// Unix socket of the volume plugin; `None` disables it.
    pub plugin_socket: Option<PathBuf>,
}

/// The plugin socket file, removed on drop if it is still the one this server bound.
#[derive(Debug)]
struct SocketFile {
    path: PathBuf,
    identity: (u64, u64),
}

impl Drop for SocketFile {
    fn drop(&mut self) {
        match std::fs::symlink_metadata(&self.path) {
            Ok(meta) if (meta.dev(), meta.ino()) == self.identity => {
                if let Err(e) = std::fs::remove_file(&self.path) {
                    tracing::warn!(path = %self.path.display(), error = %e, "cannot remove the plugin socket");
                } else {
                    tracing::debug!(path = %self.path.display(), "removed the plugin socket");
                }
            }
            _ => {
                tracing::debug!(path = %self.path.display(), "plugin socket replaced or gone; leaving it")
            }
        }
    }
}

fn bind_socket(path: &Path) -> Result<(UnixListener, SocketFile), ServerError> {
    let fail = |source| ServerError::Socket {
        path: path.to_owned(),
        source,
    };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        fsmode::state_dir(dir, dir, fsmode::STATE_DIR).map_err(|source| {
            ServerError::SocketDir {
                path: path.to_owned(),
                source,
            }
        })?;
    }
    match std::fs::symlink_metadata(path) {
        Ok(meta) if !meta.file_type().is_socket() => {
            return Err(ServerError::NotASocket {
                path: path.to_owned(),
            });
        }
        Ok(_) => match std::os::unix::net::UnixStream::connect(path) {
            Ok(_) => {
                return Err(ServerError::SocketInUse {
                    path: path.to_owned(),
                });
            }
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
                tracing::info!(path = %path.display(), "replacing a stale plugin socket");
                std::fs::remove_file(path).map_err(fail)?;
            }
            Err(e) => return Err(fail(e)),
        },
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(fail(e)),
    }
    let listener = fsmode::bind_socket(path, SOCKET_MODE, UnixListener::bind).map_err(fail)?;
    let meta = std::fs::symlink_metadata(path).map_err(fail)?;
    let file = SocketFile {
        path: path.to_owned(),
        identity: (meta.dev(), meta.ino()),
    };
    Ok((listener, file))
}

/// Bound listeners, ready to serve.
#[derive(Debug)]
pub struct Server {
    rest: Option<(TcpListener, Arc<RestApi>)>,
    plugin: Option<(UnixListener, SocketFile, Arc<PluginApi>)>,
}

impl Server {
    /// Binds what `config` asks for. Nothing is left bound when an error is returned.
    pub async fn bind(
        config: &ServerConfig,
        rest: Arc<RestApi>,
        plugin: Arc<PluginApi>,
    ) -> Result<Server, ServerError> {
        let rest = match config.rest_listen {
            Some(addr) => {
                let listener = TcpListener::bind(addr)
                    .await
                    .map_err(|source| ServerError::Listen { addr, source })?;
                Some((listener, rest))
            }
            None => None,
        };
        let plugin = match &config.plugin_socket {
            Some(path) => {
                let (listener, file) = bind_socket(path)?;
                Some((listener, file, plugin))
            }
            None => None,
        };
        Ok(Server { rest, plugin })
    }

    /// The bound REST address (useful with port 0).
    pub fn rest_addr(&self) -> Option<SocketAddr> {
        self.rest.as_ref().and_then(|(l, _)| l.local_addr().ok())
    }

    /// Serves until `shutdown` completes, then closes the listeners, gives open connections a
    /// grace period and removes the plugin socket.
    pub async fn run(self, shutdown: impl Future<Output = ()>) {
        let graceful = GracefulShutdown::new();
        let Server { rest, plugin } = self;
        tracing::info!(
            rest = ?rest.as_ref().and_then(|(l, _)| l.local_addr().ok()),
            plugin = ?plugin.as_ref().map(|(_, f, _)| f.path.display().to_string()),
            "serving"
        );
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                () = &mut shutdown => break,
                accepted = accept_tcp(rest.as_ref().map(|(l, _)| l)) => match accepted {
                    Ok(stream) => {
                        let api = rest.as_ref().map(|(_, a)| Arc::clone(a));
                        if let Some(api) = api {
                            serve(&graceful, stream, service_fn(move |req| Arc::clone(&api).handle(req)));
                        }
                    }
                    Err(e) => backoff("REST", e).await,
                },
                accepted = accept_unix(plugin.as_ref().map(|(l, _, _)| l)) => match accepted {
                    Ok(stream) => {
                        let api = plugin.as_ref().map(|(_, _, a)| Arc::clone(a));
                        if let Some(api) = api {
                            serve(&graceful, stream, service_fn(move |req| Arc::clone(&api).handle(req)));
                        }
                    }
                    Err(e) => backoff("plugin", e).await,
                },
            }
        }
        tracing::info!("shutting down");
        drop(rest);
        drop(plugin);
        if tokio::time::timeout(SHUTDOWN_GRACE, graceful.shutdown())
            .await
            .is_err()
        {
            tracing::warn!(
                grace_s = SHUTDOWN_GRACE.as_secs(),
                "connections still open after the grace period; closing them"
            );
        }
    }
}

async fn accept_tcp(listener: Option<&TcpListener>) -> io::Result<tokio::net::TcpStream> {
    match listener {
        Some(l) => l.accept().await.map(|(s, _)| s),
        None => std::future::pending().await,
    }
}

async fn accept_unix(listener: Option<&UnixListener>) -> io::Result<tokio::net::UnixStream> {
    match listener {
        Some(l) => l.accept().await.map(|(s, _)| s),
        None => std::future::pending().await,
    }
}

/// An accept error (e.g. EMFILE) must not spin the loop or end the server.
async fn backoff(what: &str, err: io::Error) {
    tracing::warn!(listener = what, error = %err, "accept failed");
    tokio::time::sleep(Duration::from_millis(100)).await;
}

fn serve<S, IO>(graceful: &GracefulShutdown, stream: IO, service: S)
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    S: hyper::service::HttpService<hyper::body::Incoming> + Send + 'static,
    S::Future: Send + 'static,
    S::ResBody: Send + 'static,
    <S::ResBody as hyper::body::Body>::Data: Send,
    <S::ResBody as hyper::body::Body>::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let conn = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT)
        .serve_connection(TokioIo::new(stream), service);
    let conn = graceful.watch(conn);
    tokio::spawn(async move {
        if let Err(e) = conn.await {
            tracing::debug!(error = %e, "connection ended with an error");
        }
    });
}

/// Completes on the first SIGTERM or SIGINT, naming it.
pub fn shutdown_signal() -> Result<impl Future<Output = &'static str>, ServerError> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term =
        signal(SignalKind::terminate()).map_err(|source| ServerError::Signals { source })?;
    let mut int =
        signal(SignalKind::interrupt()).map_err(|source| ServerError::Signals { source })?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
        }
    })
}

/// Re-reads the node every `interval` with `probe` (a blocking call, e.g. NVML discovery) and,
/// when the driver changed, hands the new inventory to the REST API and rebuilds the volume.
/// Runs until the returned task is aborted.
pub fn spawn_driver_watch<P>(
    probe: P,
    interval: Duration,
    rest: Arc<RestApi>,
    volumes: Arc<DriverVolumes>,
) -> tokio::task::JoinHandle<()>
where
    P: Fn() -> Result<Inventory, String> + Send + Sync + 'static,
{
    let probe = Arc::new(probe);
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let p = Arc::clone(&probe);
            match tokio::task::spawn_blocking(move || p()).await {
                Ok(Ok(inventory)) => {
                    let version = inventory.driver.as_ref().map(|d| d.version.clone());
                    let previous = rest.inventory().driver.as_ref().map(|d| d.version.clone());
                    if version != previous {
                        tracing::info!(?previous, ?version, "NVIDIA driver changed");
                        rest.set_inventory(Arc::new(inventory));
                    }
                    volumes.set_driver(version.as_deref());
                }
                Ok(Err(reason)) => {
                    tracing::warn!(%reason, "cannot re-read the node; keeping the last inventory")
                }
                Err(e) => tracing::error!(error = %e, "node probe panicked"),
            }
        }
    })
}

#[cfg(test)]
mod tests;
