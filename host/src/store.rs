//! The Redis the host stands on: a configured URL used as is, or an embedded
//! `redis-server` child process that the host starts, waits for and stops.
//!
//! Everything else reaches Redis through a [`Store`]: a [`redis::Client`] for
//! new connections plus, when embedded, the child process it owns. Connection
//! helpers here set the response timeouts the rest of the host relies on
//! (a blocking `XREADGROUP` needs a longer one than a script call).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use redis::aio::{ConnectionManager, ConnectionManagerConfig};

/// Longest unix socket path the kernel accepts (`sun_path` is 108 bytes with its NUL).
const MAX_UNIX_SOCKET_PATH: usize = 107;

/// How long the embedded `redis-server` may take to answer `PING` after start.
const READY_DEADLINE: Duration = Duration::from_secs(10);

/// Errors of the Redis store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// `redis-server` is not on `PATH`, so no embedded Redis can be started.
    #[error(
        "redis-server not found: install it (Debian/Ubuntu: apt-get install redis-server) or set a Redis URL"
    )]
    RedisServerMissing,
    /// The URL names TLS (`rediss://`) but this build has no TLS support in its Redis client.
    #[error(
        "{0}: TLS (rediss://) is not compiled into this build of pushonce; use redis:// or redis+unix://, or a TLS-terminating proxy on loopback"
    )]
    TlsNotCompiledIn(String),
    /// The URL could not be parsed or names an unsupported scheme.
    #[error("bad Redis URL {url:?}: {source}")]
    BadUrl {
        /// The URL as given (its password, if any, is not redacted: do not log it).
        url: String,
        /// What the Redis client said about it.
        source: redis::RedisError,
    },
    /// The data directory of the embedded Redis could not be created or used.
    #[error("embedded Redis data directory {dir}: {source}")]
    DataDir {
        /// The directory.
        dir: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// `redis-server` could not be started.
    #[error("could not start redis-server: {0}")]
    Spawn(std::io::Error),
    /// `redis-server` started but did not answer `PING` in time (its log is in the data directory).
    #[error("redis-server did not become ready within {deadline:?} (log: {log}): {last_error}")]
    NotReady {
        /// How long we waited.
        deadline: Duration,
        /// Path of the server's log file.
        log: String,
        /// The last error seen while waiting.
        last_error: String,
    },
    /// A Redis command or connection failed.
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
}

/// Which Redis to use.
#[derive(Debug, Clone)]
pub enum RedisTarget {
    /// A Redis URL used as is: `redis://`, `rediss://` (needs TLS compiled in),
    /// `redis+unix:///path/to.sock` or `unix:///path/to.sock`.
    Url(String),
    /// Start a `redis-server` child with AOF on, its data in `data_dir`.
    Embedded {
        /// Directory of the AOF files, the socket and the server's log.
        data_dir: PathBuf,
    },
}

/// A reachable Redis: the client, and the embedded server when the host owns one.
#[derive(Debug)]
pub struct Store {
    /// Client for opening new connections (multiplexed or dedicated).
    client: redis::Client,
    /// The URL the client was opened with (for tools such as `redis-benchmark`).
    url: String,
    /// The embedded server, when this store started it; stopped on shutdown or drop.
    embedded: Option<EmbeddedRedis>,
}

impl Store {
    /// Opens the target: parses a URL, or starts an embedded `redis-server` and
    /// waits until it answers `PING`.
    pub async fn open(target: &RedisTarget) -> Result<Store, StoreError> {
        match target {
            RedisTarget::Url(url) => Ok(Store {
                client: open_client(url)?,
                url: url.clone(),
                embedded: None,
            }),
            RedisTarget::Embedded { data_dir } => {
                let embedded = EmbeddedRedis::start(data_dir).await?;
                let url = embedded.url.clone();
                Ok(Store {
                    client: open_client(&url)?,
                    url,
                    embedded: Some(embedded),
                })
            }
        }
    }

    /// The Redis client, for opening further connections.
    pub fn client(&self) -> &redis::Client {
        &self.client
    }

    /// The URL of the Redis in use (embedded: a `redis+unix://` or loopback `redis://` URL).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// A shared, reconnecting, multiplexed connection for script calls.
    pub async fn manager(&self) -> Result<ConnectionManager, StoreError> {
        manager(&self.client, Duration::from_secs(5)).await
    }

    /// Stops the embedded server (if any) with `SHUTDOWN`, which flushes the AOF.
    pub async fn shutdown(mut self) {
        if let Some(embedded) = self.embedded.take() {
            embedded.shutdown().await;
        }
    }
}

/// Opens a Redis client from a URL, mapping the TLS-less build's refusal to a clear error.
pub fn open_client(url: &str) -> Result<redis::Client, StoreError> {
    if url.starts_with("rediss://") || url.starts_with("valkeys://") {
        // The client crate is built without a TLS feature (it would pull in a TLS stack).
        return Err(StoreError::TlsNotCompiledIn(redact(url)));
    }
    redis::Client::open(url).map_err(|source| StoreError::BadUrl {
        url: redact(url),
        source,
    })
}

/// A reconnecting multiplexed connection whose requests time out after `response_timeout`.
pub async fn manager(
    client: &redis::Client,
    response_timeout: Duration,
) -> Result<ConnectionManager, StoreError> {
    let config = ConnectionManagerConfig::new()
        .set_response_timeout(Some(response_timeout))
        .set_connection_timeout(Some(Duration::from_secs(2)))
        .set_number_of_retries(3)
        .set_max_delay(Duration::from_millis(500));
    Ok(client.get_connection_manager_with_config(config).await?)
}

/// Removes a password from a URL before it goes into an error message.
fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            format!("{}://***{}", &url[..scheme], &url[at..])
        }
        _ => url.to_string(),
    }
}

/// A `redis-server` child process owned by the host: AOF on (`everysec`), no
/// RDB snapshots, listening on a unix socket in its data directory (or on a
/// free loopback port when the socket path would be too long).
#[derive(Debug)]
pub struct EmbeddedRedis {
    /// The child process; killed on drop if still running.
    child: Option<Child>,
    /// URL clients connect to.
    url: String,
    /// The server's log file.
    log: PathBuf,
}

impl EmbeddedRedis {
    /// Starts `redis-server` with its data in `data_dir` and waits for `PING`.
    pub async fn start(data_dir: &Path) -> Result<EmbeddedRedis, StoreError> {
        std::fs::create_dir_all(data_dir).map_err(|source| StoreError::DataDir {
            dir: data_dir.to_path_buf(),
            source,
        })?;
        let dir = data_dir
            .canonicalize()
            .map_err(|source| StoreError::DataDir {
                dir: data_dir.to_path_buf(),
                source,
            })?;
        let socket = dir.join("redis.sock");
        let log = dir.join("redis.log");
        let mut cmd = Command::new("redis-server");
        let url = if socket.as_os_str().len() <= MAX_UNIX_SOCKET_PATH {
            // A stale socket file from a killed server would make bind fail.
            let _ = std::fs::remove_file(&socket);
            cmd.args(["--port", "0", "--unixsocket"])
                .arg(&socket)
                .args(["--unixsocketperm", "700"]);
            format!("redis+unix://{}", socket.display())
        } else {
            let port = free_loopback_port().map_err(StoreError::Spawn)?;
            cmd.args(["--bind", "127.0.0.1", "--port", &port.to_string()]);
            format!("redis://127.0.0.1:{port}")
        };
        cmd.args([
            "--appendonly",
            "yes",
            "--appendfsync",
            "everysec",
            "--save",
            "",
        ])
        // A task hash holds the event and payload JSON (often > 64 bytes): let it
        // stay a compact listpack anyway (measured: about half the memory per
        // open permit, same throughput).
        .args(["--hash-max-listpack-value", "1024"])
        .args(["--daemonize", "no", "--dir"])
        .arg(&dir)
        .arg("--logfile")
        .arg(&log)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
        let child = cmd.spawn().map_err(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                StoreError::RedisServerMissing
            } else {
                StoreError::Spawn(e)
            }
        })?;
        let mut server = EmbeddedRedis {
            child: Some(child),
            url,
            log,
        };
        server.wait_ready().await?;
        tracing::info!(url = %server.url, "embedded redis-server ready");
        Ok(server)
    }

    /// The URL clients connect to.
    pub fn url(&self) -> &str {
        &self.url
    }

    async fn wait_ready(&mut self) -> Result<(), StoreError> {
        let client = open_client(&self.url)?;
        let start = Instant::now();
        let mut last_error = String::from("no answer yet");
        while start.elapsed() < READY_DEADLINE {
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                last_error = format!("redis-server exited: {status}");
                break;
            }
            match client.get_multiplexed_async_connection().await {
                Ok(mut con) => match redis::cmd("PING").query_async::<String>(&mut con).await {
                    Ok(_) => return Ok(()),
                    Err(e) => last_error = e.to_string(),
                },
                Err(e) => last_error = e.to_string(),
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Err(StoreError::NotReady {
            deadline: READY_DEADLINE,
            log: self.log.display().to_string(),
            last_error,
        })
    }

    /// Sends `SHUTDOWN` (which writes and fsyncs the AOF) and waits for the
    /// child to exit; kills it if it does not within five seconds.
    pub async fn shutdown(mut self) {
        if let Ok(client) = open_client(&self.url)
            && let Ok(mut con) = client.get_multiplexed_async_connection().await
        {
            // The server closes the connection instead of answering.
            let _ = redis::cmd("SHUTDOWN").query_async::<()>(&mut con).await;
        }
        if let Some(mut child) = self.child.take() {
            let start = Instant::now();
            while start.elapsed() < Duration::from_secs(5) {
                if let Ok(Some(_)) = child.try_wait() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for EmbeddedRedis {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A loopback TCP port that was free a moment ago.
pub fn free_loopback_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rediss_is_refused_with_a_clear_error() {
        let err = open_client("rediss://user:secret@example.com:6380").unwrap_err();
        let text = err.to_string();
        assert!(text.contains("TLS"), "{text}");
        assert!(!text.contains("secret"), "{text}");
    }

    #[test]
    fn unix_urls_are_accepted() {
        open_client("redis+unix:///tmp/x.sock").unwrap();
        open_client("unix:///tmp/x.sock").unwrap();
        open_client("redis://127.0.0.1:6379/0").unwrap();
    }
}
