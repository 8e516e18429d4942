//! The host's one connection type, [`RedisConn`] (one Redis, or a cluster
//! that replaces its connection when it stops answering: [`HealingCluster`]),
//! and [`Batch`], the one way to send several commands together.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use redis::aio::{ConnectionLike, ConnectionManager};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::Slot;
use redis::{Cmd, Pipeline, RedisFuture, RedisResult, Value};

use super::{CONNECT_TIMEOUT, StoreError};

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

#[cfg(test)]
mod tests {
    use super::*;

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
}
