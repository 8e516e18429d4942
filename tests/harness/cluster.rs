//! A real Redis Cluster for one test: `masters` (≥ 3) `redis-server`
//! processes with `--cluster-enabled yes` and AOF on, on free loopback ports,
//! joined by `redis-cli --cluster create … --cluster-replicas 0`, ready when
//! every node reports `cluster_state:ok`. A node can be restarted on the same
//! port with the same data directory (`restart_node`, graceful, or
//! `kill_node` + `start_node`); every process is killed when dropped.
//!
//! Nodes write their AOF with `appendfsync always`, so even a `kill -9` of a
//! master loses no acknowledged write: what a test then sees is the host's
//! behaviour, not Redis's one-second fsync window.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context, bail};
use pushonce::permit::{PermitConfig, Permits};
use pushonce::store::{RedisClient, RedisConn};

use crate::wait_until;

/// How long a cluster (or a restarted node) may take to report `cluster_state:ok`.
const READY_DEADLINE: Duration = Duration::from_secs(30);

/// One node: its process, port and data directory.
struct Node {
    /// The running server (None while stopped).
    child: Option<Child>,
    /// Client port; the cluster bus listens on `port + 10000`.
    port: u16,
    /// AOF, `nodes.conf`, log.
    dir: PathBuf,
}

/// A Redis Cluster of masters only, owned by a test.
pub struct RedisCluster {
    /// The nodes, in the order of `urls()`.
    nodes: Vec<Node>,
    /// Parent of the nodes' directories, removed on drop.
    _root: tempfile::TempDir,
}

impl RedisCluster {
    /// Starts `masters` nodes (at least 3, as `redis-cli --cluster create`
    /// requires), joins them, and waits until every node reports
    /// `cluster_state:ok`.
    pub async fn start(masters: usize) -> anyhow::Result<RedisCluster> {
        if masters < 3 {
            bail!("a Redis Cluster needs at least 3 masters, got {masters}");
        }
        let root = tempfile::tempdir()?;
        let mut cluster = RedisCluster {
            nodes: Vec::new(),
            _root: root,
        };
        let mut taken = Vec::new();
        for i in 0..masters {
            let dir = cluster._root.path().join(format!("node{i}"));
            std::fs::create_dir_all(&dir)?;
            let mut started = false;
            for _ in 0..5 {
                let port = free_cluster_port(&taken)?;
                let mut node = Node {
                    child: None,
                    port,
                    dir: dir.clone(),
                };
                match spawn(&mut node).await {
                    Ok(()) => {
                        taken.push(port);
                        cluster.nodes.push(node);
                        started = true;
                        break;
                    }
                    // Most likely the port was taken in between: try another.
                    Err(e) => eprintln!("cluster node on port {port} did not start: {e:#}"),
                }
            }
            if !started {
                bail!("cluster node {i} did not start after 5 tries");
            }
        }
        let addrs: Vec<String> = cluster
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let out = tokio::task::spawn_blocking(move || {
            Command::new("redis-cli")
                .arg("--cluster")
                .arg("create")
                .args(&addrs)
                .args(["--cluster-replicas", "0", "--cluster-yes"])
                .stdin(Stdio::null())
                .output()
        })
        .await?
        .context("running redis-cli --cluster create (apt-get install redis-tools)")?;
        if !out.status.success() {
            bail!(
                "redis-cli --cluster create failed: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        cluster.wait_ok().await?;
        Ok(cluster)
    }

    /// `redis://127.0.0.1:<port>` of every node (what `redis_cluster` and
    /// `PUSHONCE_REDIS_CLUSTER` take).
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(|n| url(n.port)).collect()
    }

    /// The URLs joined by commas, as `PUSHONCE_REDIS_CLUSTER` takes them.
    pub fn urls_env(&self) -> String {
        self.urls().join(",")
    }

    /// Number of nodes.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Always false: a cluster has at least three nodes.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// The SQLite delivery ledger every test host on this cluster shares
    /// by default (beside the nodes' directories).
    pub fn ledger_url(&self) -> String {
        format!(
            "sqlite:{}",
            self._root.path().join("ledger.sqlite3").display()
        )
    }

    /// The data directory of node `i`.
    pub fn dir(&self, i: usize) -> &Path {
        &self.nodes[i].dir
    }

    /// The log of node `i`, for error messages.
    pub fn log(&self, i: usize) -> String {
        std::fs::read_to_string(self.nodes[i].dir.join("redis.log")).unwrap_or_default()
    }

    /// A cluster client, as the host opens it.
    pub fn client(&self) -> RedisClient {
        pushonce::store::open_cluster_client(&self.urls())
            .expect("loopback URLs parse")
            .into()
    }

    /// A new cluster connection.
    pub async fn connection(&self) -> anyhow::Result<RedisConn> {
        Ok(self.client().connect(Duration::from_secs(5)).await?)
    }

    /// A permit layer on a new cluster connection, scripts and groups prepared.
    pub async fn permits(&self, config: PermitConfig) -> anyhow::Result<Permits> {
        let permits = Permits::new(self.connection().await?, config);
        permits.prepare().await?;
        Ok(permits)
    }

    /// Node `i` answers on which port.
    pub fn port(&self, i: usize) -> u16 {
        self.nodes[i].port
    }

    /// Restarts node `i` gracefully: `SHUTDOWN` (AOF written), then start on
    /// the same port and directory, and wait for `cluster_state:ok` everywhere.
    pub async fn restart_node(&mut self, i: usize) -> anyhow::Result<()> {
        let url = url(self.nodes[i].port);
        crate::redis::shutdown(&mut self.nodes[i].child, &url).await;
        self.start_node(i).await
    }

    /// Kills node `i` with SIGKILL (its data directory stays).
    pub fn kill_node(&mut self, i: usize) {
        if let Some(mut child) = self.nodes[i].child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts node `i` again (after `kill_node`) on its port with its data,
    /// and waits until every node reports `cluster_state:ok`.
    pub async fn start_node(&mut self, i: usize) -> anyhow::Result<()> {
        if self.nodes[i].child.is_none() {
            spawn(&mut self.nodes[i])
                .await
                .with_context(|| format!("restarting node {i}; log: {}", self.log(i)))?;
        }
        self.wait_ok().await
    }

    /// Waits until every node answers `CLUSTER INFO` with `cluster_state:ok`
    /// and all 16384 slots served.
    async fn wait_ok(&self) -> anyhow::Result<()> {
        let ports: Vec<u16> = self.nodes.iter().map(|n| n.port).collect();
        wait_until(READY_DEADLINE, || {
            let ports = ports.clone();
            async move {
                for port in ports {
                    if !cluster_ok(port).await {
                        return false;
                    }
                }
                true
            }
        })
        .await
        .with_context(|| {
            format!(
                "cluster not ok within {READY_DEADLINE:?}; log of node 0: {}",
                self.log(0)
            )
        })
    }
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        for i in 0..self.nodes.len() {
            self.kill_node(i);
        }
    }
}

fn url(port: u16) -> String {
    format!("redis://127.0.0.1:{port}")
}

/// True when the node on `port` reports `cluster_state:ok` and every slot ok.
async fn cluster_ok(port: u16) -> bool {
    let Ok(client) = redis::Client::open(url(port)) else {
        return false;
    };
    let Ok(mut con) = client.get_multiplexed_async_connection().await else {
        return false;
    };
    match redis::cmd("CLUSTER")
        .arg("INFO")
        .query_async::<String>(&mut con)
        .await
    {
        Ok(info) => info.contains("cluster_state:ok") && info.contains("cluster_slots_ok:16384"),
        Err(_) => false,
    }
}

/// A loopback port that is free, whose cluster bus port (+10000) is free too,
/// and that is not in `taken`.
fn free_cluster_port(taken: &[u16]) -> anyhow::Result<u16> {
    for _ in 0..100 {
        let port = pushonce::store::free_loopback_port()?;
        if port > 55_535 || taken.contains(&port) || taken.contains(&(port + 10_000)) {
            continue;
        }
        if std::net::TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok() {
            return Ok(port);
        }
    }
    bail!("no free loopback port pair for a cluster node")
}

/// Starts the node's `redis-server` and waits until it answers `PING`.
async fn spawn(node: &mut Node) -> anyhow::Result<()> {
    let child = Command::new("redis-server")
        .args(["--bind", "127.0.0.1", "--port", &node.port.to_string()])
        .args(["--cluster-enabled", "yes", "--cluster-config-file"])
        .arg(node.dir.join("nodes.conf"))
        .args(["--cluster-node-timeout", "5000"])
        .args(["--appendonly", "yes", "--appendfsync", "always"])
        .args(["--save", ""])
        .args(["--daemonize", "no", "--dir"])
        .arg(&node.dir)
        .arg("--logfile")
        .arg(node.dir.join("redis.log"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("starting redis-server (apt-get install redis-server)")?;
    node.child = Some(child);
    let (url, log) = (url(node.port), node.dir.join("redis.log"));
    crate::redis::await_ping(&mut node.child, &url, &log).await
}
