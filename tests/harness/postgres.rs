//! A real PostgreSQL for tests: `initdb` in a temporary directory and
//! `postgres` on a free loopback port (trust authentication, its unix socket
//! in that directory), run as the `postgres` user when the tests run as root
//! (initdb refuses root). One shared server per test binary
//! ([`PostgresServer::shared`]) with a database per test
//! ([`PostgresServer::database`]), like the Redis harness; a test that stops
//! and starts its server owns one ([`PostgresServer::start`]). A watchdog
//! shell stops the server and removes its directory when the test process
//! exits, so a shared server never outlives its binary.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use anyhow::{Context, bail};
use sqlx::Connection;
use std::os::unix::process::CommandExt;
use tokio::sync::OnceCell;

use crate::wait_until;

/// A `postgres` process owned by a test (or shared by a test binary).
pub struct PostgresServer {
    child: Option<Child>,
    port: u16,
    dir: PathBuf,
    bin: PathBuf,
    /// The uid/gid the server runs as (the `postgres` user when we are root).
    user: Option<(u32, u32)>,
    /// fsync on (benchmarks) or off (tests: faster, nothing to lose).
    durable: bool,
}

/// The directory of PostgreSQL's binaries: Debian keeps them in
/// `/usr/lib/postgresql/<major>/bin`, off `PATH` (the newest major wins).
pub fn bin_dir() -> anyhow::Result<PathBuf> {
    let mut majors: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .context("PostgreSQL is not installed: run cargo xtask setup (apt-get install postgresql)")?
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let major = e.file_name().to_str()?.parse().ok()?;
            Some((major, e.path().join("bin")))
        })
        .filter(|(_, bin)| bin.join("initdb").exists())
        .collect();
    majors.sort();
    majors
        .pop()
        .map(|(_, bin)| bin)
        .context("no /usr/lib/postgresql/<major>/bin/initdb: run cargo xtask setup")
}

/// The uid and gid of the `postgres` user, when running as root.
fn postgres_user() -> anyhow::Result<Option<(u32, u32)>> {
    let me = Command::new("id").arg("-u").output()?;
    if String::from_utf8_lossy(&me.stdout).trim() != "0" {
        return Ok(None);
    }
    let id = |flag: &str| -> anyhow::Result<u32> {
        let out = Command::new("id").args([flag, "postgres"]).output()?;
        String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse()
            .context("no postgres user (apt-get install postgresql creates it)")
    };
    Ok(Some((id("-u")?, id("-g")?)))
}

static SHARED: OnceCell<PostgresServer> = OnceCell::const_new();
static DATABASES: AtomicU32 = AtomicU32::new(0);

impl PostgresServer {
    /// The server shared by every test of this binary (started on first use).
    pub async fn shared() -> anyhow::Result<&'static PostgresServer> {
        SHARED
            .get_or_try_init(|| PostgresServer::start(false))
            .await
    }

    /// A server of its own: `initdb`, then `postgres`, ready when it answers.
    pub async fn start(durable: bool) -> anyhow::Result<PostgresServer> {
        let bin = bin_dir()?;
        let user = postgres_user()?;
        let dir = tempfile::Builder::new()
            .prefix("pushonce-pg-")
            .tempdir()?
            .keep();
        if let Some((uid, gid)) = user {
            std::os::unix::fs::chown(&dir, Some(uid), Some(gid))?;
        }
        let mut initdb = Command::new(bin.join("initdb"));
        initdb
            .args([
                "--auth=trust",
                "--username=postgres",
                "--encoding=UTF8",
                "-D",
            ])
            .arg(dir.join("data"))
            .stdout(Stdio::null());
        run_as(&mut initdb, user);
        let out = initdb.output().context("running initdb")?;
        if !out.status.success() {
            bail!("initdb failed: {}", String::from_utf8_lossy(&out.stderr));
        }
        let mut server = PostgresServer {
            child: None,
            port: pushonce::store::free_loopback_port()?,
            dir,
            bin,
            user,
            durable,
        };
        server.spawn().await?;
        server.watchdog()?;
        Ok(server)
    }

    async fn spawn(&mut self) -> anyhow::Result<()> {
        let mut cmd = Command::new(self.bin.join("postgres"));
        cmd.arg("-D")
            .arg(self.dir.join("data"))
            .args(["-p", &self.port.to_string(), "-h", "127.0.0.1", "-k"])
            .arg(&self.dir)
            .args(["-c", "max_connections=200"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(self.dir.join("postgres.log"))?);
        if !self.durable {
            cmd.args(["-c", "fsync=off", "-c", "full_page_writes=off"]);
        }
        run_as(&mut cmd, self.user);
        self.child = Some(cmd.spawn().context("starting postgres")?);
        let url = self.url("postgres");
        let ready = wait_until(Duration::from_secs(20), || {
            let url = url.clone();
            async move { sqlx::PgConnection::connect(&url).await.is_ok() }
        })
        .await;
        ready.with_context(|| format!("postgres not ready; log: {}", self.log()))
    }

    /// Stops the server and removes its directory when this process exits
    /// (a shared server is never dropped).
    fn watchdog(&self) -> anyhow::Result<()> {
        let script = format!(
            "while [ -d /proc/{me} ]; do sleep 0.5; done; \
             {bin}/pg_ctl -D {dir}/data -m immediate stop >/dev/null 2>&1; rm -rf {dir}",
            me = std::process::id(),
            bin = self.bin.display(),
            dir = self.dir.display(),
        );
        let mut cmd = Command::new("sh");
        cmd.args(["-c", &script])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        run_as(&mut cmd, self.user);
        cmd.process_group(0)
            .spawn()
            .context("starting the watchdog")?;
        Ok(())
    }

    /// `postgres://postgres@127.0.0.1:<port>/<db>`.
    pub fn url(&self, db: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{db}", self.port)
    }

    /// Creates a new empty database and returns its URL.
    pub async fn database(&self) -> anyhow::Result<String> {
        let name = format!(
            "t{}_{}",
            std::process::id(),
            DATABASES.fetch_add(1, Ordering::Relaxed)
        );
        let mut conn = sqlx::PgConnection::connect(&self.url("postgres")).await?;
        sqlx::query(&format!("CREATE DATABASE {name}"))
            .execute(&mut conn)
            .await?;
        Ok(self.url(&name))
    }

    /// The server's log.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("postgres.log")).unwrap_or_default()
    }

    /// The directory of the cluster (data in `data/`).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Stops the server (fast shutdown: open connections are cut) and waits.
    pub fn stop(&mut self) -> anyhow::Result<()> {
        if let Some(mut child) = self.child.take() {
            // SIGINT: PostgreSQL's fast shutdown.
            Command::new("kill")
                .args(["-INT", &child.id().to_string()])
                .status()?;
            child.wait()?;
        }
        Ok(())
    }

    /// Starts it again on the same port and data.
    pub async fn start_again(&mut self) -> anyhow::Result<()> {
        self.spawn().await
    }
}

/// Runs `cmd` as `user` (uid, gid) when given.
fn run_as(cmd: &mut Command, user: Option<(u32, u32)>) {
    if let Some((uid, gid)) = user {
        cmd.uid(uid).gid(gid);
        cmd.env("HOME", "/tmp");
    }
}

impl Drop for PostgresServer {
    fn drop(&mut self) {
        let _ = self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
