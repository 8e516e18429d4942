//! The Redis the host stands on: a configured URL used as is, a Redis
//! Cluster named by its nodes' URLs, or an embedded `redis-server` child
//! process that the host starts, waits for and stops.
//!
//! Everything else reaches Redis through a [`Store`]: a [`RedisClient`] for
//! new connections plus, when embedded, the child process it owns. Connection
//! helpers here set the response timeouts the rest of the host relies on
//! (a blocking `XREADGROUP` needs a longer one than a script call).
//!
//! [`RedisConn`] is the one connection type of the host: a reconnecting
//! multiplexed connection to one Redis, or a cluster connection that routes
//! each command to the master owning its key's slot. [`Batch`] is the one way
//! to send several commands together: one pipeline on a single Redis, one
//! pipeline per hash slot (sent concurrently) on a cluster, where a pipeline
//! must not cross slots.

mod conn;
mod embedded;

use std::path::{Path, PathBuf};
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;

pub use conn::{Batch, HealingCluster, RedisConn};
use embedded::EmbeddedRedis;
pub use embedded::NOEVICTION;

/// How long opening a connection to one Redis (or one cluster node) may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// Errors of the Redis store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// `redis-server` is not on `PATH`, so no embedded Redis can be started.
    #[error(
        "redis-server not found: install it (Debian/Ubuntu: apt-get install redis-server) or set a Redis URL"
    )]
    RedisServerMissing,
    /// The CA file of `rediss://` could not be read.
    #[error("Redis CA file {file}: {source}")]
    CaFile {
        /// The file (`redis_ca_file`).
        file: PathBuf,
        /// Why it could not be read.
        source: std::io::Error,
    },
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
    /// Another process holds the data directory's lock: a running host (or
    /// worker, or doctor) owns the embedded Redis there, or a `redis-server`
    /// one of them left behind runs and did not stop when asked.
    #[error(
        "embedded Redis data directory {dir} is in use: another process holds its lock {lock} (a running `pushonce serve`, or the redis-server a killed one left behind; `fuser -v {lock}` names it). Stop it before starting another here, or use its Redis: redis_url = \"redis+unix://{dir}/redis.sock\""
    )]
    DataDirInUse {
        /// The data directory (canonical).
        dir: PathBuf,
        /// Its lock file.
        lock: PathBuf,
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
    /// A Redis Cluster was configured without any node URL.
    #[error("a Redis Cluster needs at least one node URL")]
    NoClusterNodes,
    /// A Redis command or connection failed.
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
}

/// Which Redis to use.
#[derive(Debug, Clone)]
pub enum RedisTarget {
    /// A Redis URL used as is: `redis://[user:password@]host:port`,
    /// `rediss://` (TLS, server verified against the system's roots),
    /// `redis+unix:///path/to.sock` or `unix:///path/to.sock`.
    Url(String),
    /// A `rediss://` URL whose server certificate is verified against the
    /// CA certificates (PEM) of `ca_file` instead of the system's roots.
    TlsUrl {
        /// The `rediss://` URL.
        url: String,
        /// PEM file of the CA certificates to trust.
        ca_file: PathBuf,
    },
    /// A Redis Cluster, reached through any of these nodes (`redis://host:port`);
    /// the client discovers the others and follows the slot map.
    Cluster(Vec<String>),
    /// Start a `redis-server` child with AOF on, its data in `data_dir`.
    Embedded {
        /// Directory of the AOF files, the socket and the server's log.
        data_dir: PathBuf,
    },
}

/// A client of one Redis or of a Redis Cluster, for opening connections.
#[derive(Debug, Clone)]
pub enum RedisClient {
    /// One Redis server (boxed: with TLS compiled in its client is large too).
    Single(Box<redis::Client>),
    /// A Redis Cluster (boxed: its client is large, and rarely moved).
    Cluster(Box<ClusterClient>),
}

impl From<redis::Client> for RedisClient {
    fn from(client: redis::Client) -> Self {
        RedisClient::Single(Box::new(client))
    }
}

impl From<ClusterClient> for RedisClient {
    fn from(client: ClusterClient) -> Self {
        RedisClient::Cluster(Box::new(client))
    }
}

impl RedisClient {
    /// True for a Redis Cluster.
    pub fn is_cluster(&self) -> bool {
        matches!(self, RedisClient::Cluster(_))
    }

    /// A new reconnecting connection whose requests time out after
    /// `response_timeout` (on a cluster: per node; retries and redirections
    /// are bounded as [`open_cluster_client`] set them).
    pub async fn connect(&self, response_timeout: Duration) -> Result<RedisConn, StoreError> {
        match self {
            RedisClient::Single(client) => Ok(RedisConn::Single(
                single_server_manager(client, response_timeout).await?,
            )),
            RedisClient::Cluster(client) => Ok(RedisConn::Cluster(
                HealingCluster::connect(client, response_timeout).await?,
            )),
        }
    }
}

/// A reachable Redis: the client, and the embedded server when the host owns one.
#[derive(Debug)]
pub struct Store {
    /// Client for opening new connections (multiplexed or dedicated).
    client: RedisClient,
    /// The URL the client was opened with (for tools such as `redis-benchmark`;
    /// a cluster: its first node).
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
                client: open_client(url)?.into(),
                url: url.clone(),
                embedded: None,
            }),
            RedisTarget::TlsUrl { url, ca_file } => Ok(Store {
                client: open_tls_client(url, ca_file)?.into(),
                url: url.clone(),
                embedded: None,
            }),
            RedisTarget::Cluster(urls) => Ok(Store {
                client: open_cluster_client(urls)?.into(),
                url: urls.first().cloned().unwrap_or_default(),
                embedded: None,
            }),
            RedisTarget::Embedded { data_dir } => {
                let embedded = EmbeddedRedis::start(data_dir).await?;
                let url = embedded.url.clone();
                Ok(Store {
                    client: open_client(&url)?.into(),
                    url,
                    embedded: Some(embedded),
                })
            }
        }
    }

    /// The Redis client, for opening further connections.
    pub fn client(&self) -> &RedisClient {
        &self.client
    }

    /// The URL of the Redis in use (embedded: a `redis+unix://` or loopback
    /// `redis://` URL; a cluster: its first configured node).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// A shared, reconnecting, multiplexed connection for script calls (to
    /// one Redis, or to every master of a cluster).
    pub async fn manager(&self) -> Result<RedisConn, StoreError> {
        self.client.connect(Duration::from_secs(5)).await
    }

    /// Stops the embedded server (if any) with `SHUTDOWN`, which flushes the AOF.
    pub async fn shutdown(mut self) {
        if let Some(embedded) = self.embedded.take() {
            embedded.shutdown().await;
        }
    }
}

/// Opens a Redis client from a URL (`rediss://`: TLS against the system's
/// roots); a password in the URL never appears in the error.
pub(crate) fn open_client(url: &str) -> Result<redis::Client, StoreError> {
    install_crypto_provider();
    redis::Client::open(url).map_err(|source| bad_url(url, source))
}

/// Opens a `rediss://` client that trusts the CA certificates (PEM) of `ca_file`.
pub fn open_tls_client(url: &str, ca_file: &Path) -> Result<redis::Client, StoreError> {
    install_crypto_provider();
    let root_cert = crate::files::read_regular_file(ca_file, crate::files::MAX_TEXT_FILE).map_err(
        |source| StoreError::CaFile {
            file: ca_file.to_path_buf(),
            source,
        },
    )?;
    let certs = redis::TlsCertificates {
        client_tls: None,
        root_cert: Some(root_cert),
    };
    redis::Client::build_with_tls(url, certs).map_err(|source| bad_url(url, source))
}

fn bad_url(url: &str, source: redis::RedisError) -> StoreError {
    StoreError::BadUrl {
        url: redact(url),
        source,
    }
}

/// rustls's process-wide crypto provider (ring), once; `rediss://` needs it.
fn install_crypto_provider() {
    // An error means one is installed already: fine.
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// Opens a Redis Cluster client from its nodes' URLs (`redis://`, or
/// `rediss://` against the system's roots; not over a unix socket). Each
/// request times out after 5 s, retries included; MOVED/ASK and a master
/// that is down for a moment are retried by the client.
pub fn open_cluster_client(urls: &[String]) -> Result<ClusterClient, StoreError> {
    if urls.is_empty() {
        return Err(StoreError::NoClusterNodes);
    }
    install_crypto_provider();
    ClusterClient::builder(urls.iter().map(String::as_str))
        .connection_timeout(CONNECT_TIMEOUT)
        .response_timeout(Duration::from_secs(5))
        .retries(6)
        .min_retry_wait(20)
        .max_retry_wait(500)
        .build()
        .map_err(|source| StoreError::BadUrl {
            url: urls.iter().map(|u| redact(u)).collect::<Vec<_>>().join(","),
            source,
        })
}

/// A reconnecting multiplexed connection to one Redis server whose requests
/// time out after `response_timeout` (a [`Store`] opens its own through
/// [`Store::manager`]).
pub async fn single_server_manager(
    client: &redis::Client,
    response_timeout: Duration,
) -> Result<ConnectionManager, StoreError> {
    let config = ConnectionManagerConfig::new()
        .set_response_timeout(Some(response_timeout))
        .set_connection_timeout(Some(CONNECT_TIMEOUT))
        .set_number_of_retries(3)
        .set_max_delay(Duration::from_millis(500));
    Ok(client.get_connection_manager_with_config(config).await?)
}

/// Removes a password from a URL before it goes into an error message.
pub(crate) fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            format!("{}://***{}", &url[..scheme], &url[at..])
        }
        _ => url.to_string(),
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
    fn rediss_is_accepted_and_a_bad_url_hides_its_password() {
        open_client("rediss://user:secret@example.com:6380").unwrap();
        let err = open_client("redis://user:secret@exa mple.com:x/").unwrap_err();
        assert!(!err.to_string().contains("secret"), "{err}");
        let missing = Path::new("/nonexistent/ca.pem");
        let err = open_tls_client("rediss://u:secret@127.0.0.1:1", missing).unwrap_err();
        assert!(err.to_string().contains("/nonexistent/ca.pem"), "{err}");
    }

    #[test]
    fn cluster_urls_are_checked() {
        assert!(matches!(
            open_cluster_client(&[]),
            Err(StoreError::NoClusterNodes)
        ));
        let err = open_cluster_client(&["redis://u:secret@h:x".into()]).unwrap_err();
        assert!(!err.to_string().contains("secret"), "{err}");
        open_cluster_client(&["rediss://127.0.0.1:7000".into()]).unwrap();
        open_cluster_client(&["redis://127.0.0.1:7000".into()]).unwrap();
    }

    #[test]
    fn unix_urls_are_accepted() {
        open_client("redis+unix:///tmp/x.sock").unwrap();
        open_client("unix:///tmp/x.sock").unwrap();
        open_client("redis://127.0.0.1:6379/0").unwrap();
    }
}
