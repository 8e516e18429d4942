//! The embedded `redis-server`: a child process the host starts with its
//! data in `data_dir`, durable and never evicting, and stops.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::{StoreError, free_loopback_port, open_client};

/// How long the embedded `redis-server` may take to answer `PING` after start.
const READY_DEADLINE: Duration = Duration::from_secs(10);

/// Longest unix socket path the kernel accepts (`sun_path` is 108 bytes with its NUL).
const MAX_UNIX_SOCKET_PATH: usize = 107;

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
    pub(super) url: String,
    /// The server's log file.
    log: PathBuf,
}

impl EmbeddedRedis {
    /// Starts `redis-server` with its data in `data_dir` and waits for `PING`.
    pub(super) async fn start(data_dir: &Path) -> Result<EmbeddedRedis, StoreError> {
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
    pub(super) async fn shutdown(mut self) {
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
