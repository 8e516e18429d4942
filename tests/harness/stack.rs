//! A whole pushonce stack for end-to-end tests: the provider simulator in
//! this process on a free loopback port, and real `pushonce serve` processes
//! configured to send through it (all four channels) with the real plugins.

use std::path::{Path, PathBuf};
use std::time::Duration;

use provider_sim::{Config, SimState};

use crate::plugins::real_dir;
use crate::process::WorkerProcess;

/// The environment variable the generated configuration names for the
/// WeChat app secret, and its value in tests.
pub const WECHAT_SECRET: (&str, &str) = ("E2E_WECHAT_SECRET", "s3cret");

/// The callback path token of every channel of a stack (variable, value):
/// providers post receipts to `/v1/receipts/<channel>/<token>`.
pub const CALLBACK_TOKEN: (&str, &str) = ("E2E_CALLBACK_TOKEN", "cb-7f3a9e2d41c8");

/// Starts the simulator in this process on a free loopback port.
pub async fn simulator() -> (SimState, u16) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind a loopback port");
    let port = listener.local_addr().expect("bound address").port();
    let state = SimState::new(Config::default());
    tokio::spawn(provider_sim::run(
        listener,
        state.clone(),
        std::future::pending(),
    ));
    (state, port)
}

/// What a generated `pushonce.toml` varies.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// The Redis lines of the configuration, e.g. `redis_url = "redis://…"`.
    pub redis: String,
    /// The simulator's port (every channel's endpoint).
    pub sim_port: u16,
    /// Shards of the key layout.
    pub shards: u16,
    /// Dispatcher workers per process.
    pub workers: usize,
    /// Lease of one attempt (humantime text, e.g. `"5s"`).
    pub lease: String,
    /// Extra TOML appended at the end (e.g. a `[reconcile]` table).
    pub extra: String,
}

impl ServeConfig {
    /// Defaults for `redis_url = url` and the simulator on `sim_port`.
    pub fn new(redis_url: &str, sim_port: u16) -> ServeConfig {
        ServeConfig {
            redis: format!("redis_url = \"{redis_url}\""),
            sim_port,
            shards: 4,
            workers: 4,
            lease: "5s".into(),
            extra: String::new(),
        }
    }

    /// The configuration text for a process listening on `listen`, with its
    /// data under `dir` and its policies in `policies`.
    pub fn text(&self, listen: u16, dir: &Path, policies: &Path) -> String {
        let sim = self.sim_port;
        let endpoint = format!("endpoint = \"http://127.0.0.1:{sim}\"");
        // The simulator speaks plain HTTP: allowed explicitly.
        let allowed = format!("allowed_hosts = [\"127.0.0.1:{sim}\"]\nallow_plaintext = true");
        let secret = WECHAT_SECRET.0;
        let token = format!("callback_token_env = \"{}\"", CALLBACK_TOKEN.0);
        format!(
            r#"
listen = "127.0.0.1:{listen}"
{redis}
data_dir = "{data}"
plugin_dir = "{plugins}"
policy_dir = "{policies}"
shards = {shards}
workers = {workers}
lease = "{lease}"

[plugin_limits]
instances = 64

[channels.inbox]
plugin = "inbox@^2"
{token}
settings = {{ {endpoint} }}
{allowed}

[channels.sms]
plugin = "sms@^2"
{token}
settings = {{ {endpoint}, sign_name = "shop" }}
{allowed}

[channels.wechat]
plugin = "wechat@^2"
{token}
settings = {{ {endpoint}, app_id = "wx-test" }}
secrets_from_env = {{ app_secret = "{secret}" }}
{allowed}

[channels.app-push]
plugin = "app-push@^2"
{token}
settings = {{ {endpoint}, project = "e2e" }}
{allowed}
{extra}
"#,
            redis = self.redis,
            data = dir.join("data").display(),
            plugins = real_dir().display(),
            policies = policies.display(),
            shards = self.shards,
            workers = self.workers,
            lease = self.lease,
            extra = self.extra,
        )
    }
}

/// One `pushonce serve` process of a stack, restartable on the same port.
pub struct ServeProcess {
    /// The running process (`None` while killed).
    process: Option<WorkerProcess>,
    /// Its configuration file.
    config: PathBuf,
    /// `http://127.0.0.1:<port>`.
    base: String,
}

impl ServeProcess {
    /// Writes `<dir>/pushonce.toml` from `config` for a free loopback port,
    /// starts `pushonce serve` on it and waits until `/readyz` answers 200.
    pub async fn start(
        config: &ServeConfig,
        dir: &Path,
        policies: &Path,
    ) -> anyhow::Result<ServeProcess> {
        std::fs::create_dir_all(dir)?;
        let port = pushonce::store::free_loopback_port()?;
        let file = dir.join("pushonce.toml");
        std::fs::write(&file, config.text(port, dir, policies))?;
        let mut serve = ServeProcess {
            process: None,
            config: file,
            base: format!("http://127.0.0.1:{port}"),
        };
        serve.restart().await?;
        Ok(serve)
    }

    /// Starts the process again (after [`ServeProcess::kill9`]) and waits
    /// until it is ready.
    pub async fn restart(&mut self) -> anyhow::Result<()> {
        let process = WorkerProcess::serve(&self.config, &[WECHAT_SECRET, CALLBACK_TOKEN])?;
        process
            .wait_ready(&self.base, Duration::from_secs(60))
            .await?;
        self.process = Some(process);
        Ok(())
    }

    /// Kills the process with SIGKILL (no shutdown, attempts in flight are abandoned).
    pub fn kill9(&mut self) {
        if let Some(mut p) = self.process.take() {
            p.kill9();
        }
    }

    /// Whether the process is running (not killed).
    pub fn is_up(&self) -> bool {
        self.process.is_some()
    }

    /// `http://127.0.0.1:<port>`.
    pub fn base(&self) -> &str {
        &self.base
    }

    /// `base` + `path`.
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// The log of the running process (empty while killed).
    pub fn log(&self) -> String {
        self.process.as_ref().map(|p| p.log()).unwrap_or_default()
    }

    /// Stops the process with SIGTERM (graceful), waiting up to `timeout`.
    pub async fn terminate(&mut self, timeout: Duration) -> anyhow::Result<()> {
        if let Some(mut p) = self.process.take() {
            p.terminate(timeout).await?;
        }
        Ok(())
    }
}

/// Copies every file of `from` into `to` (created if needed).
pub fn copy_dir(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let path = entry?.path();
        if path.is_file()
            && let Some(name) = path.file_name()
        {
            std::fs::copy(&path, to.join(name))?;
        }
    }
    Ok(())
}
