//! Svix's server (`svix/svix-webhooks`, `server/`), built from a local
//! checkout and run as its own process with its own PostgreSQL (initdb as
//! the test harness does, fsync on) and Redis (AOF `everysec`, as
//! pushonce's): queue and cache in Redis, so that an idempotency key
//! outlives a restart of the server. One application with one endpoint, the
//! bench's receiver.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use pushonce_tests::postgres::PostgresServer;
use pushonce_tests::redis::RedisServer;
use serde_json::json;

use super::poster::MakeRequest;

/// The JWT secret of the bench's Svix (any value: the token is made from it).
const JWT_SECRET: &str = "pushonce-bench-peers";

/// Builds Svix's server from `src` (`cargo build --release -p svix-server`
/// in `src/server`, target dir `target`) and returns the binary.
pub(super) fn build(src: &Path, target: &Path) -> anyhow::Result<PathBuf> {
    let dir = src.join("server");
    eprintln!(
        "building svix-server in {} (target {}; cargo build --release -p svix-server) …",
        dir.display(),
        target.display()
    );
    let status = Command::new("cargo")
        .args(["build", "--release", "-p", "svix-server"])
        .env("CARGO_TARGET_DIR", target)
        .current_dir(&dir)
        .status()
        .context("running cargo for svix-server")?;
    if !status.success() {
        bail!(
            "cargo build --release -p svix-server in {} failed ({status})",
            dir.display()
        );
    }
    let bin = target.join("release").join("svix-server");
    anyhow::ensure!(bin.exists(), "{} is missing after the build", bin.display());
    Ok(bin)
}

/// `git rev-parse HEAD` of `src`, or why not.
pub(super) fn commit(src: &Path) -> String {
    Command::new("git")
        .arg("-C")
        .arg(src)
        .args(["rev-parse", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| format!("(no git commit in {})", src.display()))
}

/// A running Svix with its stores, its application and endpoint.
pub(super) struct SvixStack {
    bin: PathBuf,
    env: Vec<(&'static str, String)>,
    dir: PathBuf,
    child: Option<Child>,
    base: String,
    token: String,
    app: String,
    pg: PostgresServer,
    redis_pid: u32,
    _redis: RedisServer,
}

impl SvixStack {
    /// Starts PostgreSQL, Redis and `svix-server` (migrated first), and
    /// creates the application and its endpoint `receiver`.
    pub async fn start(bin: &Path, dir: &Path, receiver: &str) -> anyhow::Result<SvixStack> {
        std::fs::create_dir_all(dir)?;
        let pg = PostgresServer::start(true)
            .await
            .context("starting PostgreSQL for Svix")?;
        let db = pg.database().await?;
        let redis = RedisServer::start()
            .await
            .context("starting Redis for Svix")?;
        let redis_pid = super::redis_pid(&redis).await?;
        let port = pushonce::store::free_loopback_port()?;
        let env = vec![
            ("SVIX_JWT_SECRET", JWT_SECRET.to_string()),
            ("SVIX_DB_DSN", db),
            ("SVIX_REDIS_DSN", redis.url()),
            ("SVIX_QUEUE_TYPE", "redis".into()),
            ("SVIX_CACHE_TYPE", "redis".into()),
            ("SVIX_LISTEN_ADDRESS", format!("127.0.0.1:{port}")),
            // Svix refuses private and loopback endpoints unless whitelisted
            // (config `whitelist_subnets`, as its own run-tests.sh sets it).
            ("SVIX_WHITELIST_SUBNETS", "[127.0.0.1/32]".into()),
        ];
        let mut stack = SvixStack {
            bin: bin.to_path_buf(),
            env,
            dir: dir.to_path_buf(),
            child: None,
            base: format!("http://127.0.0.1:{port}"),
            token: String::new(),
            app: String::new(),
            pg,
            redis_pid,
            _redis: redis,
        };
        let out = stack
            .command()
            .arg("migrate")
            .output()
            .context("svix-server migrate")?;
        if !out.status.success() {
            bail!(
                "svix-server migrate failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let out = stack.command().args(["jwt", "generate"]).output()?;
        let text = String::from_utf8_lossy(&out.stdout);
        stack.token = text
            .lines()
            .find_map(|l| l.strip_prefix("Token (Bearer): "))
            .with_context(|| {
                format!(
                    "no token from svix-server jwt generate: {text} {}",
                    String::from_utf8_lossy(&out.stderr)
                )
            })?
            .trim()
            .to_string();
        stack.restart().await?;
        let client = reqwest::Client::new();
        let app: serde_json::Value = stack
            .authed(client.post(format!("{}/api/v1/app/", stack.base)))
            .json(&json!({"name": "pushonce-bench", "uid": "bench"}))
            .send()
            .await?
            .error_for_status()
            .context("creating the Svix application")?
            .json()
            .await?;
        stack.app = app["id"].as_str().context("no application id")?.to_string();
        stack
            .authed(client.post(format!("{}/api/v1/app/{}/endpoint/", stack.base, stack.app)))
            .json(&json!({"url": receiver, "uid": "receiver"}))
            .send()
            .await?
            .error_for_status()
            .context("creating the Svix endpoint (is 127.0.0.1 whitelisted?)")?;
        Ok(stack)
    }

    fn command(&self) -> Command {
        let mut cmd = Command::new(&self.bin);
        cmd.envs(self.env.iter().map(|(k, v)| (*k, v)))
            .current_dir(&self.dir)
            .stdin(Stdio::null());
        cmd
    }

    fn authed(&self, req: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        req.bearer_auth(&self.token)
    }

    /// Starts the server (again) and waits until `/api/v1/health/` answers 2xx.
    pub async fn restart(&mut self) -> anyhow::Result<()> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("svix.log"))?;
        let child = self
            .command()
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("starting svix-server")?;
        self.child = Some(child);
        let url = format!("{}/api/v1/health/", self.base);
        let start = Instant::now();
        loop {
            if reqwest::get(&url)
                .await
                .is_ok_and(|r| r.status().is_success())
            {
                return Ok(());
            }
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                bail!("svix-server exited ({status}); log: {}", self.log_tail());
            }
            if start.elapsed() > Duration::from_secs(60) {
                bail!(
                    "svix-server not healthy after 60 s; log: {}",
                    self.log_tail()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.dir.join("svix.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    /// Kills the server with SIGKILL and reaps it.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// The server's process id.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// CPU seconds of Redis and of PostgreSQL (postmaster and backends).
    pub fn stores_cpu_s(&self) -> f64 {
        let postmaster = std::fs::read_to_string(self.pg.dir().join("data/postmaster.pid"))
            .ok()
            .and_then(|t| t.lines().next()?.trim().parse::<u32>().ok());
        super::cpu::own_s(self.redis_pid) + postmaster.map_or(0.0, super::cpu::tree_s)
    }

    /// `POST /api/v1/app/<app>/msg/` with the message as payload and its
    /// `seq` as idempotency key.
    pub fn poster(&self) -> MakeRequest {
        let url = format!("{}/api/v1/app/{}/msg/", self.base, self.app);
        let token = self.token.clone();
        std::sync::Arc::new(move |client: &reqwest::Client, seq: &str| {
            client
                .post(&url)
                .bearer_auth(&token)
                .header("idempotency-key", seq)
                .json(&json!({
                    "eventType": "bench.t",
                    "payload": {"type": "BENCH_T", "data": {"seq": seq}},
                }))
        })
    }
}

impl Drop for SvixStack {
    fn drop(&mut self) {
        self.kill9();
    }
}
