//! A real `redis-server` for one test: a free loopback port, a temporary data
//! directory, AOF on; `restart()` keeps both; killed when dropped.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context, bail};
use pushonce::permit::{PermitConfig, Permits};
use redis::aio::ConnectionManager;

use crate::wait_until;

/// A `redis-server` child process owned by a test.
pub struct RedisServer {
    /// The running server (None between stop and start).
    child: Option<Child>,
    /// Its loopback port, kept across restarts.
    port: u16,
    /// Its data directory (AOF files, log), removed on drop.
    dir: tempfile::TempDir,
    /// Further `redis-server` arguments (e.g. `--maxmemory-policy`), kept across restarts.
    args: Vec<String>,
}

impl RedisServer {
    /// Starts a server with AOF on (`appendfsync everysec`) and waits until it answers `PING`.
    pub async fn start() -> anyhow::Result<RedisServer> {
        Self::start_with_args(&[]).await
    }

    /// [`RedisServer::start`] with further `redis-server` arguments, e.g.
    /// `["--maxmemory", "64mb", "--maxmemory-policy", "volatile-lru"]`.
    pub async fn start_with_args(args: &[&str]) -> anyhow::Result<RedisServer> {
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        let mut dir = tempfile::tempdir()?;
        for _ in 0..5 {
            let port = pushonce::store::free_loopback_port()?;
            let mut server = RedisServer {
                child: None,
                port,
                dir,
                args: args.clone(),
            };
            match server.spawn().await {
                Ok(()) => return Ok(server),
                Err(e) => {
                    // Most likely the port was taken in between: try another.
                    eprintln!("redis-server on port {port} did not start: {e:#}");
                    dir = std::mem::replace(&mut server.dir, tempfile::tempdir()?);
                }
            }
        }
        bail!(
            "redis-server did not start after 5 tries (is it installed? apt-get install redis-server)"
        )
    }

    async fn spawn(&mut self) -> anyhow::Result<()> {
        let child = Command::new("redis-server")
            .args(["--bind", "127.0.0.1", "--port", &self.port.to_string()])
            .args([
                "--appendonly",
                "yes",
                "--appendfsync",
                "everysec",
                "--save",
                "",
            ])
            .args(["--daemonize", "no", "--dir"])
            .arg(self.dir.path())
            .arg("--logfile")
            .arg(self.dir.path().join("redis.log"))
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting redis-server (apt-get install redis-server)")?;
        self.child = Some(child);
        let (url, log) = (self.url(), self.dir.path().join("redis.log"));
        await_ping(&mut self.child, &url, &log).await
    }

    /// The server's log, for error messages.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("redis.log")).unwrap_or_default()
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Its loopback port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The data directory.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The SQLite delivery ledger every test host on this server shares by
    /// default (in its data directory): instances sharing a Redis must
    /// share their ledger, or the host refuses to start.
    pub fn ledger_url(&self) -> String {
        format!(
            "sqlite:{}",
            self.dir.path().join("ledger.sqlite3").display()
        )
    }

    /// A client for this server.
    pub fn client(&self) -> redis::Client {
        redis::Client::open(self.url()).expect("a loopback URL parses")
    }

    /// The keys of this server matching `pattern` (`SCAN`, every one), sorted.
    pub async fn keys_matching(&self, pattern: &str) -> anyhow::Result<Vec<String>> {
        let mut conn = self.manager().await?;
        let mut cursor = 0u64;
        let mut keys = Vec::new();
        loop {
            let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(pattern)
                .arg("COUNT")
                .arg(1000)
                .query_async(&mut conn)
                .await?;
            keys.extend(batch);
            if next == 0 {
                keys.sort();
                return Ok(keys);
            }
            cursor = next;
        }
    }

    /// A new reconnecting multiplexed connection.
    pub async fn manager(&self) -> anyhow::Result<ConnectionManager> {
        Ok(pushonce::store::single_server_manager(&self.client(), Duration::from_secs(5)).await?)
    }

    /// A permit layer on a new connection.
    pub async fn permits(&self, config: PermitConfig) -> anyhow::Result<Permits> {
        let permits = Permits::new(self.manager().await?, config);
        permits.prepare().await?;
        Ok(permits)
    }

    /// Waits until this server, a replica, reports its link to the primary
    /// up (`master_link_status:up`: the first sync is done), or fails after
    /// `deadline`.
    pub async fn wait_replica_synced(&self, deadline: Duration) -> anyhow::Result<()> {
        let conn = self.manager().await?;
        wait_until(deadline, || {
            let mut conn = conn.clone();
            async move {
                let info: String = redis::cmd("INFO")
                    .arg("replication")
                    .query_async(&mut conn)
                    .await
                    .unwrap_or_default();
                info.contains("master_link_status:up")
            }
        })
        .await
        .context("the replica did not finish its first sync")
    }

    /// `SHUTDOWN` (the server writes and fsyncs its AOF), wait for the exit,
    /// then start again on the same port with the same data directory.
    pub async fn restart(&mut self) -> anyhow::Result<()> {
        self.stop().await?;
        self.spawn().await
    }

    /// `SHUTDOWN` and wait for the process to exit.
    pub async fn stop(&mut self) -> anyhow::Result<()> {
        let url = self.url();
        shutdown(&mut self.child, &url).await;
        Ok(())
    }
}

/// How long a starting server may take to answer `PING`: a restart loads
/// its AOF first (a 20,000-event chaos run's takes over 10 s on a loaded
/// machine), answering `LOADING` until done.
const READY_WITHIN: Duration = Duration::from_secs(120);

/// Waits until the server `child` at `url` answers `PING` ([`READY_WITHIN`]);
/// fails with its log (at `log`) if it exits or does not answer (the child is
/// then `None` when it exited).
pub(crate) async fn await_ping(
    child_slot: &mut Option<Child>,
    url: &str,
    log: &Path,
) -> anyhow::Result<()> {
    let client = redis::Client::open(url)?;
    let child = child_slot.as_mut().context("no server process")?;
    let mut exited = None;
    let ready = wait_until(READY_WITHIN, || {
        let client = client.clone();
        if let Ok(Some(status)) = child.try_wait() {
            exited = Some(status);
        }
        let gone = exited.is_some();
        async move {
            if gone {
                return true;
            }
            match client.get_multiplexed_async_connection().await {
                Ok(mut con) => redis::cmd("PING")
                    .query_async::<String>(&mut con)
                    .await
                    .is_ok(),
                Err(_) => false,
            }
        }
    })
    .await;
    let log = || std::fs::read_to_string(log).unwrap_or_default();
    if let Some(status) = exited {
        *child_slot = None;
        bail!("redis-server exited: {status}; log: {}", log());
    }
    ready.with_context(|| format!("redis-server not ready; log: {}", log()))
}

/// `SHUTDOWN` to the server at `url` (it writes and fsyncs its AOF), then
/// waits up to 10 s for `child` to exit (killed after that).
pub(crate) async fn shutdown(child_slot: &mut Option<Child>, url: &str) {
    if let Ok(client) = redis::Client::open(url)
        && let Ok(mut con) = client.get_multiplexed_async_connection().await
    {
        let _ = redis::cmd("SHUTDOWN").query_async::<()>(&mut con).await;
    }
    if let Some(mut child) = child_slot.take() {
        let mut done = false;
        let _ = wait_until(Duration::from_secs(10), || {
            done = done || matches!(child.try_wait(), Ok(Some(_)));
            let d = done;
            async move { d }
        })
        .await;
        if !done {
            let _ = child.kill();
        }
        let _ = child.wait();
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// `field` of `INFO server` (e.g. `run_id`, `process_id`) of the Redis at
/// `url`, on a new connection; `None` when none answers.
pub async fn server_info(url: &str, field: &str) -> Option<String> {
    let client = redis::Client::open(url).ok()?;
    let mut conn = client.get_multiplexed_async_connection().await.ok()?;
    let info: String = redis::cmd("INFO")
        .arg("server")
        .query_async(&mut conn)
        .await
        .ok()?;
    info.lines()
        .find_map(|l| l.trim().strip_prefix(field)?.strip_prefix(':'))
        .map(String::from)
}

/// `CONFIG SET name value` on `conn`.
pub async fn config_set(conn: &mut impl redis::aio::ConnectionLike, name: &str, value: &str) {
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg(name)
        .arg(value)
        .query_async(conn)
        .await
        .unwrap();
}
