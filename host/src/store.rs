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

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::Slot;
use redis::{Cmd, Pipeline, RedisFuture, RedisResult, Value};

/// Longest unix socket path the kernel accepts (`sun_path` is 108 bytes with its NUL).
const MAX_UNIX_SOCKET_PATH: usize = 107;

/// How long opening a connection to one Redis (or one cluster node) may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

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

/// Least time between two replacements of a cluster connection.
const HEAL_EVERY: Duration = Duration::from_secs(1);

/// A cluster connection that replaces itself when it stops answering.
///
/// The redis crate's cluster connection repairs lost node connections in
/// the background, but after a master restarts it can stay broken — every
/// command timing out — for good (seen in the chaos run: one host of three
/// never recovered). Like [`ConnectionManager`] for one Redis, this opens a
/// new cluster connection (fresh topology, fresh node connections) when a
/// command fails with a timeout or a connection error, at most once per
/// [`HEAL_EVERY`]; the failed command's error is returned as it was (callers
/// retry), and later commands use the new connection.
#[derive(Clone)]
pub struct HealingCluster {
    /// Opens replacements.
    client: Arc<ClusterClient>,
    /// Connect and response timeouts of every connection opened.
    config: redis::cluster::ClusterConfig,
    /// The connection in use (cloning one shares its node connections).
    current: Arc<ArcSwap<ClusterConnection>>,
    /// When a replacement was last opened; held while one is being opened.
    healing: Arc<tokio::sync::Mutex<Option<Instant>>>,
}

impl HealingCluster {
    /// Opens a cluster connection whose requests time out after `response_timeout`.
    pub async fn connect(
        client: &ClusterClient,
        response_timeout: Duration,
    ) -> Result<HealingCluster, StoreError> {
        let config = redis::cluster::ClusterConfig::new()
            .set_connection_timeout(CONNECT_TIMEOUT)
            .set_response_timeout(response_timeout);
        let conn = client
            .get_async_connection_with_config(config.clone())
            .await?;
        Ok(HealingCluster {
            client: Arc::new(client.clone()),
            config,
            current: Arc::new(ArcSwap::from_pointee(conn)),
            healing: Arc::new(tokio::sync::Mutex::new(None)),
        })
    }

    /// The connection in use.
    pub(crate) fn conn(&self) -> ClusterConnection {
        (**self.current.load()).clone()
    }

    /// After `error`: opens a replacement in the background if the error says
    /// the connection may be broken, no replacement is under way and the last
    /// one is older than [`HEAL_EVERY`].
    fn heal_after(&self, error: &redis::RedisError) {
        let broken = error.is_timeout()
            || error.is_io_error()
            || error.is_connection_dropped()
            || error.is_connection_refusal();
        if !broken {
            return;
        }
        // Under a storm of failures only the first takes the lock; the rest
        // return here without spawning anything.
        let Ok(mut last) = self.healing.clone().try_lock_owned() else {
            return;
        };
        if last.is_some_and(|at| at.elapsed() < HEAL_EVERY) {
            return;
        }
        *last = Some(Instant::now());
        let this = self.clone();
        tokio::spawn(async move {
            let _held = last;
            let opening = this
                .client
                .get_async_connection_with_config(this.config.clone());
            match tokio::time::timeout(CONNECT_TIMEOUT * 3, opening).await {
                Ok(Ok(conn)) => {
                    this.current.store(Arc::new(conn));
                    tracing::warn!("the cluster connection stopped answering; replaced it");
                }
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, "could not replace the cluster connection")
                }
                Err(_) => tracing::warn!("replacing the cluster connection timed out"),
            }
        });
    }
}

impl ConnectionLike for HealingCluster {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            let result = self.conn().req_packed_command(cmd).await;
            if let Err(e) = &result {
                self.heal_after(e);
            }
            result
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            let result = self
                .conn()
                .req_packed_commands(pipeline, offset, count)
                .await;
            if let Err(e) = &result {
                self.heal_after(e);
            }
            result
        })
    }

    fn get_db(&self) -> i64 {
        0
    }
}

/// The host's connection to Redis: one server or a cluster. Cheap to clone
/// (clones share the multiplexed connections).
#[derive(Clone)]
pub enum RedisConn {
    /// A reconnecting multiplexed connection to one Redis.
    Single(ConnectionManager),
    /// A cluster connection: each command goes to the master of its key's
    /// slot; replaced when it stops answering.
    Cluster(HealingCluster),
}

impl std::fmt::Debug for RedisConn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            RedisConn::Single(_) => "RedisConn::Single",
            RedisConn::Cluster(_) => "RedisConn::Cluster",
        })
    }
}

impl From<ConnectionManager> for RedisConn {
    fn from(conn: ConnectionManager) -> Self {
        RedisConn::Single(conn)
    }
}

impl From<HealingCluster> for RedisConn {
    fn from(conn: HealingCluster) -> Self {
        RedisConn::Cluster(conn)
    }
}

impl RedisConn {
    /// True for a Redis Cluster.
    pub fn is_cluster(&self) -> bool {
        matches!(self, RedisConn::Cluster(_))
    }
}

impl ConnectionLike for RedisConn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            RedisConn::Single(c) => c.req_packed_command(cmd),
            RedisConn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            RedisConn::Single(c) => c.req_packed_commands(pipeline, offset, count),
            RedisConn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            RedisConn::Single(c) => c.get_db(),
            RedisConn::Cluster(c) => c.get_db(),
        }
    }
}

/// Commands sent together, each naming a key of the slot it touches: on a
/// single Redis one pipeline (one round trip, in order); on a cluster one
/// pipeline per hash slot, the pipelines sent concurrently (a pipeline that
/// crosses slots is refused there). Answers come back in the order added.
/// Not a transaction: each command stands alone, as in any pipeline.
#[derive(Debug, Default)]
pub struct Batch {
    /// The commands with the slot of their keys.
    cmds: Vec<(Slot, Cmd)>,
}

impl Batch {
    /// An empty batch.
    pub fn new() -> Batch {
        Batch::default()
    }

    /// Adds `cmd`; every key it touches must share `key`'s hash slot (in
    /// pushonce: the same `{ns:shard}` hash tag).
    pub fn add(&mut self, key: &str, cmd: Cmd) -> &mut Batch {
        self.cmds.push((Slot::for_key(key), cmd));
        self
    }

    /// Adds `cmd` whose first argument is its key (`LPUSH`, `LTRIM`,
    /// `SMEMBERS`, `ZCARD`…; not `EVALSHA`: use [`Batch::add`]).
    pub(crate) fn add_keyed(&mut self, cmd: Cmd) -> &mut Batch {
        let key = match cmd.args_iter().nth(1) {
            Some(redis::Arg::Simple(key)) => key.to_vec(),
            _ => Vec::new(),
        };
        self.cmds.push((Slot::for_key(key), cmd));
        self
    }

    /// Number of commands.
    pub fn len(&self) -> usize {
        self.cmds.len()
    }

    /// True when no command was added.
    pub fn is_empty(&self) -> bool {
        self.cmds.is_empty()
    }

    /// Sends the batch and answers one value per command, in order; any
    /// command's error fails the whole answer (the commands of other slots may
    /// have run). On `NOSCRIPT`, `reload` (when given) is loaded — on every
    /// master of a cluster — and the failed pipeline sent once more.
    pub async fn query(
        self,
        conn: &mut RedisConn,
        reload: Option<&redis::Script>,
    ) -> RedisResult<Vec<Value>> {
        let n = self.cmds.len();
        if n == 0 {
            return Ok(Vec::new());
        }
        if !conn.is_cluster() {
            let cmds = self.cmds.into_iter().map(|(_, c)| c).collect();
            return pipeline(cmds, conn.clone(), reload).await;
        }
        // Group by slot, keeping each command's position.
        let mut groups: HashMap<Slot, (Vec<usize>, Vec<Cmd>)> = HashMap::new();
        for (i, (slot, cmd)) in self.cmds.into_iter().enumerate() {
            let group = groups.entry(slot).or_default();
            group.0.push(i);
            group.1.push(cmd);
        }
        let mut runs = tokio::task::JoinSet::new();
        for (idx, cmds) in groups.into_values() {
            let (conn, reload) = (conn.clone(), reload.cloned());
            runs.spawn(async move { (idx, pipeline(cmds, conn, reload.as_ref()).await) });
        }
        let mut answers: Vec<Value> = vec![Value::Nil; n];
        while let Some(joined) = runs.join_next().await {
            let (idx, result) = joined.map_err(|e| {
                redis::RedisError::from((
                    redis::ErrorKind::Client,
                    "batch task failed",
                    e.to_string(),
                ))
            })?;
            for (i, value) in idx.into_iter().zip(result?) {
                answers[i] = value;
            }
        }
        Ok(answers)
    }
}

/// Sends `cmds` as one pipeline; on `NOSCRIPT` loads `reload` (on every
/// master of a cluster) and sends it once more.
async fn pipeline(
    cmds: Vec<Cmd>,
    mut conn: RedisConn,
    reload: Option<&redis::Script>,
) -> RedisResult<Vec<Value>> {
    let mut pipe = redis::pipe();
    for cmd in cmds {
        pipe.add_command(cmd);
    }
    match (pipe.query_async(&mut conn).await, reload) {
        (Err(e), Some(script)) if e.code() == Some("NOSCRIPT") => {
            script.load_async(&mut conn).await?;
            pipe.query_async(&mut conn).await
        }
        (result, _) => result,
    }
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

/// Creates `data_dir` if needed; its canonical path.
fn data_dir_made(data_dir: &Path) -> Result<PathBuf, StoreError> {
    let failed = |source| StoreError::DataDir {
        dir: data_dir.to_path_buf(),
        source,
    };
    std::fs::create_dir_all(data_dir).map_err(failed)?;
    data_dir.canonicalize().map_err(failed)
}

/// Makes `cmd` listen on a unix socket in `dir`, or on a free loopback port
/// when the socket path would be too long; the URL to connect to.
fn listen_on(cmd: &mut Command, dir: &Path) -> Result<String, StoreError> {
    let socket = dir.join("redis.sock");
    if socket.as_os_str().len() <= MAX_UNIX_SOCKET_PATH {
        // A stale socket file from a killed server would make bind fail.
        let _ = std::fs::remove_file(&socket);
        cmd.args(["--port", "0", "--unixsocket"])
            .arg(&socket)
            .args(["--unixsocketperm", "700"]);
        return Ok(format!("redis+unix://{}", socket.display()));
    }
    let port = free_loopback_port().map_err(StoreError::Spawn)?;
    cmd.args(["--bind", "127.0.0.1", "--port", &port.to_string()]);
    Ok(format!("redis://127.0.0.1:{port}"))
}

/// The one policy under which Redis never drops a key to make room (kept
/// here, below `eviction`, which checks a Redis against it).
pub const NOEVICTION: &str = "noeviction";

/// AOF on (`everysec`), no RDB snapshots, never evicting, task hashes kept
/// as listpacks.
fn durable_and_compact(cmd: &mut Command) -> &mut Command {
    // Said explicitly, whatever the build's default: an evicted permit
    // re-opens its key (see `eviction`).
    cmd.args(["--maxmemory-policy", NOEVICTION]);
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
}

/// A `redis-server` child process owned by the host: AOF on (`everysec`), no
/// RDB snapshots, listening on a unix socket in its data directory (or on a
/// free loopback port when the socket path would be too long).
#[derive(Debug)]
pub(crate) struct EmbeddedRedis {
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
        let dir = data_dir_made(data_dir)?;
        let log = dir.join("redis.log");
        let mut cmd = Command::new("redis-server");
        let url = listen_on(&mut cmd, &dir)?;
        durable_and_compact(&mut cmd)
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
    fn rediss_is_accepted_and_a_bad_url_hides_its_password() {
        open_client("rediss://user:secret@example.com:6380").unwrap();
        let err = open_client("redis://user:secret@exa mple.com:x/").unwrap_err();
        assert!(!err.to_string().contains("secret"), "{err}");
        let missing = Path::new("/nonexistent/ca.pem");
        let err = open_tls_client("rediss://u:secret@127.0.0.1:1", missing).unwrap_err();
        assert!(err.to_string().contains("/nonexistent/ca.pem"), "{err}");
    }

    #[test]
    fn a_keyed_command_is_routed_by_its_first_argument() {
        let mut batch = Batch::new();
        let mut push = redis::cmd("LPUSH");
        push.arg("{po:corpus}:events").arg("x");
        let mut eval = redis::cmd("EVALSHA");
        eval.arg("0123").arg(1).arg("{po:3}:permit:k");
        batch.add_keyed(push).add("{po:3}:permit:k", eval);
        assert_eq!(batch.len(), 2);
        assert_eq!(batch.cmds[0].0, Slot::for_key("{po:corpus}"));
        assert_eq!(batch.cmds[1].0, Slot::for_key("{po:3}:ready"));
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
