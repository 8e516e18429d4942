//! The embedded `redis-server`: a child process the host starts with its
//! data in `data_dir`, durable and never evicting, and stops.
//!
//! One server per data directory: the process that starts it takes an
//! exclusive lock (`flock`) on `<data_dir>/redis.lock` first, and the
//! `redis-server` child inherits it, so the lock is held for as long as
//! either runs (a server left behind by a killed host still holds it). A
//! second start on a held directory is refused before it touches the
//! socket: two servers appending to one AOF would corrupt it. The lock file
//! names its owner's process id: a start that finds the owner gone stops
//! the server it left behind (`SHUTDOWN`, its AOF written) and then starts.

use std::fs::{File, OpenOptions, TryLockError};
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
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

/// The lock file in the data directory (see the module's documentation).
const LOCK_FILE: &str = "redis.lock";

/// How long a start waits for a lock that is being let go: a server just
/// stopped, or a child another thread has forked but not yet exec'd, which
/// holds a copy of the descriptor for that moment.
const LOCK_WAIT: Duration = Duration::from_secs(3);

/// How long a start waits for a server left behind by a killed owner to
/// stop once asked (`SHUTDOWN` writes its AOF first).
const LEFT_BEHIND_WAIT: Duration = Duration::from_secs(10);

/// Takes the exclusive lock on `dir`'s [`LOCK_FILE`] (waiting up to
/// [`LOCK_WAIT`]) and writes this process's id in it, or says who may
/// hold it. A lock whose owner (the id written in it) is no longer
/// running is held by the `redis-server` that owner left behind (a host
/// killed with `kill -9`): that server is stopped through its socket
/// (`SHUTDOWN`: its AOF written) and the lock taken once it has let go.
async fn lock_data_dir(dir: &Path) -> Result<File, StoreError> {
    let path = dir.join(LOCK_FILE);
    let failed = |source| StoreError::DataDir {
        dir: dir.to_path_buf(),
        source,
    };
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(&path)
        .map_err(failed)?;
    let mut deadline = Instant::now() + LOCK_WAIT;
    let mut asked_to_stop = false;
    loop {
        match file.try_lock() {
            Ok(()) => {
                write_owner(&file).map_err(failed)?;
                return Ok(file);
            }
            Err(TryLockError::WouldBlock) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(TryLockError::WouldBlock) if !asked_to_stop && owner_gone(&file) => {
                stop_left_behind(dir, &file).await;
                asked_to_stop = true;
                deadline = Instant::now() + LEFT_BEHIND_WAIT;
            }
            Err(TryLockError::WouldBlock) => {
                return Err(StoreError::DataDirInUse {
                    dir: dir.to_path_buf(),
                    lock: path,
                });
            }
            Err(TryLockError::Error(source)) => return Err(failed(source)),
        }
    }
}

/// Writes this process's id into the lock file it holds: who owns the
/// data directory's server.
fn write_owner(mut file: &File) -> std::io::Result<()> {
    use std::io::{Seek, Write};
    file.set_len(0)?;
    file.rewind()?;
    writeln!(file, "{}", std::process::id())
}

/// Whether the process whose id the lock file holds has ended (a zombie
/// has too): then whatever still holds the lock inherited it from that
/// owner. An empty or unreadable file, or one naming a live process (or
/// this one), is not.
fn owner_gone(mut file: &File) -> bool {
    use std::io::{Read, Seek};
    let mut text = String::new();
    if file.rewind().is_err() || file.read_to_string(&mut text).is_err() {
        return false;
    }
    let Ok(pid) = text.trim().parse::<u32>() else {
        return false;
    };
    if pid == std::process::id() {
        return false;
    }
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state is the field after the command's closing parenthesis.
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state == "Z" || state == "X"),
        Err(e) => e.kind() == std::io::ErrorKind::NotFound,
    }
}

/// Asks the `redis-server` listening on `dir`'s socket, left behind by a
/// killed owner, to stop (`SHUTDOWN`: it writes its AOF and exits). The
/// owner is read again once connected: a start racing this one may have
/// taken the lock meanwhile (writing its own id before it starts a server
/// on the socket), and its server must not be stopped.
async fn stop_left_behind(dir: &Path, lock: &File) {
    let url = format!("redis+unix://{}", dir.join("redis.sock").display());
    tracing::warn!(%url, "a redis-server left behind by a killed process holds the data directory; stopping it (SHUTDOWN writes its AOF) before starting");
    send_shutdown(&url, || owner_gone(lock)).await;
}

/// Sends `SHUTDOWN` to the server at `url`, if one answers and `still`
/// says so once connected.
async fn send_shutdown(url: &str, still: impl Fn() -> bool) {
    if let Ok(client) = open_client(url)
        && let Ok(mut con) = client.get_multiplexed_async_connection().await
        && still()
    {
        // The server closes the connection instead of answering.
        let _ = redis::cmd("SHUTDOWN").query_async::<()>(&mut con).await;
    }
}

/// Lets the child started by `cmd` inherit `lock` (cleared close-on-exec
/// in the child only), so the lock outlives this process while it runs.
fn inherit_lock(cmd: &mut Command, lock: &File) {
    let fd = lock.as_raw_fd();
    // SAFETY: between fork and exec the closure only calls fcntl, which is
    // async-signal-safe, on a descriptor the parent keeps open until the
    // child has been spawned.
    unsafe {
        cmd.pre_exec(move || {
            if libc::fcntl(fd, libc::F_SETFD, 0) == -1 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
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
    /// The data directory's lock, held until the server has stopped (the
    /// child holds it too); declared last, so dropped after the child is killed.
    _lock: File,
}

impl EmbeddedRedis {
    /// Starts `redis-server` with its data in `data_dir` and waits for `PING`.
    pub(super) async fn start(data_dir: &Path) -> Result<EmbeddedRedis, StoreError> {
        let dir = data_dir_made(data_dir)?;
        // Before anything in the directory is touched (the socket).
        let lock = lock_data_dir(&dir).await?;
        let log = dir.join("redis.log");
        let mut cmd = Command::new("redis-server");
        inherit_lock(&mut cmd, &lock);
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
            _lock: lock,
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
        send_shutdown(&self.url, || true).await;
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
