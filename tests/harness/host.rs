//! A whole pushonce host for API tests, started in-process on
//! `127.0.0.1:0` against a test's `RedisServer`, with the real key-policy
//! plugins, a private copy of the repository's policies, and the channels of
//! the repository's `pushonce.toml`; plus a small JSON HTTP client.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use pushonce::api::ApiLimits;
use pushonce::config::HostConfig;
use pushonce::send::{Faults, LedgerFileSender, Sender};
use pushonce::service::{self, Running, ServiceOptions};
use reqwest::StatusCode;
use reqwest::header::HeaderMap;
use serde_json::Value;

use crate::cluster::RedisCluster;
use crate::redis::RedisServer;
use crate::wait_until;

/// The Redis a test host runs against.
#[derive(Clone, Copy)]
pub enum Backend<'a> {
    /// One `redis-server` (`redis_url`).
    Server(&'a RedisServer),
    /// A Redis Cluster (`redis_cluster`).
    Cluster(&'a RedisCluster),
}

/// The repository's root (the parent of `tests/`).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ is below the root")
        .to_path_buf()
}

/// A change to a test host's configuration, applied last.
pub type Configure = Box<dyn FnOnce(&mut HostConfig) + Send>;

/// How a test host is set up.
pub struct Setup {
    /// Environment seen by the host (token variables).
    pub env: HashMap<String, String>,
    /// `auth.api_token_env` / `auth.admin_token_env`.
    pub auth: (Option<String>, Option<String>),
    /// The sender (default: the development ledger in the host's data dir).
    pub sender: Option<Arc<dyn Sender>>,
    /// Policy files written into the host's policy dir instead of the
    /// repository's (name, TOML text).
    pub policies: Option<Vec<(String, String)>>,
    /// API limits.
    pub limits: ApiLimits,
    /// Lease of the dispatcher.
    pub lease: Duration,
    /// Send through the channel plugins (as `pushonce serve` does) instead
    /// of the development ledger.
    pub plugin_sender: bool,
    /// Test-only plugins (paths of `.wasm` files) loaded beside the real ones.
    pub extra_plugins: Vec<PathBuf>,
    /// Changes the configuration last (channels, `[receipts]`...).
    pub configure: Option<Configure>,
    /// `ledger_url` (default: the SQLite ledger every host on the same
    /// Redis shares, in the Redis server's or cluster's directory).
    pub ledger_url: Option<String>,
}

impl Default for Setup {
    fn default() -> Self {
        Setup {
            env: HashMap::new(),
            auth: (None, None),
            sender: None,
            policies: None,
            limits: ApiLimits::default(),
            lease: Duration::from_secs(2),
            plugin_sender: false,
            extra_plugins: Vec::new(),
            configure: None,
            ledger_url: None,
        }
    }
}

/// A plugin directory under `dir` with the real plugins and `extra`.
fn plugins_with(dir: &Path, extra: &[PathBuf]) -> anyhow::Result<PathBuf> {
    let out = dir.join("plugins");
    std::fs::create_dir_all(&out)?;
    let real = std::fs::read_dir(crate::plugins::real_dir())?
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<Vec<_>, _>>()?;
    for file in real.iter().chain(extra) {
        if let Some(name) = file.file_name() {
            std::fs::copy(file, out.join(name))?;
        }
    }
    Ok(out)
}

/// What a configuration takes from outside its file, filled with test values
/// for a host whose relative paths resolve against `dir`: a fresh CA
/// certificate written at every channel's relative `ca_file` below `dir`,
/// and a value for every environment variable its channels name (secrets and
/// callback path tokens). Nothing reaches a provider with these: API tests
/// send to the development ledger; tests that reach the provider simulator
/// configure its CA and credentials (`providers::Sim`).
pub fn repository_inputs(config: &HostConfig, dir: &Path) -> anyhow::Result<Vec<(String, String)>> {
    let ca = crate::tls::TestCa::new("pushonce test CA");
    let mut env = Vec::new();
    for (name, channel) in &config.channels {
        if let Some(file) = channel.ca_file.as_ref().filter(|f| f.is_relative()) {
            let path = dir.join(file);
            std::fs::create_dir_all(path.parent().context("ca_file has a parent")?)?;
            std::fs::write(&path, &ca.pem)?;
        }
        for var in channel.secrets_from_env.values() {
            env.push((var.clone(), format!("test-{}", var.to_lowercase())));
        }
        if let Some(var) = &channel.callback_token_env {
            env.push((var.clone(), format!("cb-{name}-5c1f08a2e7d94b3f60")));
        }
    }
    Ok(env)
}

/// A host running in this process, and a client for it.
pub struct TestHost {
    /// The running host (taken by `shutdown`).
    running: Option<Running>,
    /// `http://127.0.0.1:<port>`.
    pub base: String,
    /// Data, policies, cache.
    pub dir: tempfile::TempDir,
    /// The delivery ledger it claims in (`off` when off).
    pub ledger_url: String,
    /// The HTTP client.
    pub client: reqwest::Client,
}

/// An HTTP answer: status, headers, body as JSON (`Null` if not JSON).
#[derive(Debug)]
pub struct Answer {
    /// Status.
    pub status: StatusCode,
    /// Headers.
    pub headers: HeaderMap,
    /// Body parsed as JSON, or `Value::String` of the text when it is not JSON.
    pub body: Value,
}

impl Answer {
    /// Sends `req` and reads its answer.
    pub async fn of(req: reqwest::RequestBuilder) -> anyhow::Result<Answer> {
        let res = req.send().await?;
        let status = res.status();
        let headers = res.headers().clone();
        let text = res.text().await?;
        let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
        Ok(Answer {
            status,
            headers,
            body,
        })
    }

    /// The `task_id` of every channel result of an accept answer.
    pub fn task_ids(&self) -> Vec<String> {
        self.body["results"]
            .as_array()
            .unwrap_or_else(|| panic!("no results in {}", self.body))
            .iter()
            .map(|r| r["task_id"].as_str().unwrap_or_default().to_string())
            .collect()
    }

    /// The `content-type` header.
    pub fn content_type(&self) -> &str {
        self.headers
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
    }
}

impl TestHost {
    /// A host with the defaults against `redis`.
    pub async fn start(redis: &RedisServer) -> anyhow::Result<TestHost> {
        Self::start_with(redis, Setup::default()).await
    }

    /// A host set up by `setup` against `redis`.
    pub async fn start_with(redis: &RedisServer, setup: Setup) -> anyhow::Result<TestHost> {
        Self::start_on(Backend::Server(redis), setup).await
    }

    /// A host set up by `setup` against `backend` (one server or a cluster).
    pub async fn start_on(backend: Backend<'_>, setup: Setup) -> anyhow::Result<TestHost> {
        let dir = tempfile::tempdir()?;
        let policy_dir = dir.path().join("policies");
        std::fs::create_dir_all(&policy_dir)?;
        match &setup.policies {
            Some(files) => {
                for (name, text) in files {
                    std::fs::write(policy_dir.join(name), text)?;
                }
            }
            None => {
                for entry in std::fs::read_dir(repo_root().join("policies"))? {
                    let path = entry?.path();
                    if path.extension().is_some_and(|e| e == "toml") {
                        std::fs::copy(&path, policy_dir.join(path.file_name().unwrap()))?;
                    }
                }
            }
        }
        let file = repo_root().join("pushonce.toml");
        let mut config = HostConfig::parse(&file, &std::fs::read_to_string(&file)?)?;
        match &backend {
            Backend::Server(redis) => config.redis_url = Some(redis.url()),
            Backend::Cluster(cluster) => config.redis_cluster = cluster.urls(),
        }
        config.data_dir = dir.path().join("data");
        config.plugin_dir = crate::plugins::real_dir();
        config.policy_dir = policy_dir;
        config.shards = 4;
        config.workers = 2;
        config.lease = setup.lease;
        // Hosts on one Redis share one ledger, as the host requires.
        config.ledger_url = Some(match (&setup.ledger_url, &backend) {
            (Some(url), _) => url.clone(),
            (None, Backend::Server(redis)) => redis.ledger_url(),
            (None, Backend::Cluster(cluster)) => cluster.ledger_url(),
        });
        config.auth.api_token_env = setup.auth.0.clone();
        config.auth.admin_token_env = setup.auth.1.clone();
        let mut env: HashMap<String, String> = repository_inputs(&config, dir.path())?
            .into_iter()
            .collect();
        env.extend(setup.env.clone());
        for (name, channel) in config.channels.iter_mut() {
            // Closed callbacks, as a deployment has them: a path token each.
            let var = format!("CALLBACK_TOKEN_{name}");
            env.entry(var.clone())
                .or_insert_with(|| format!("cb-{name}-9d2e61f0a7c3b5d4e8f1"));
            channel.callback_token_env = Some(var);
            channel.open_callbacks = false;
            // The CA `repository_inputs` wrote where the file names it.
            channel.ca_file = channel.ca_file.as_ref().map(|f| dir.path().join(f));
        }
        if !setup.extra_plugins.is_empty() {
            config.plugin_dir = plugins_with(dir.path(), &setup.extra_plugins)?;
        }
        if let Some(configure) = setup.configure {
            configure(&mut config);
        }
        // API tests look at what was sent in the development ledger; the
        // channel plugins against the provider simulator are `tests/it/channels.rs`
        // and `tests/it/e2e.rs`.
        let sender = match setup.sender.clone() {
            Some(s) => Some(s),
            None if setup.plugin_sender => None,
            None => {
                std::fs::create_dir_all(&config.data_dir)?;
                let ledger = config.data_dir.join("ledger.jsonl");
                Some(
                    Arc::new(LedgerFileSender::open(&ledger, Faults::default())?)
                        as Arc<dyn Sender>,
                )
            }
        };
        let options = ServiceOptions {
            env: Arc::new(move |name| env.get(name).cloned()),
            sender,
            receipts: None,
            limits: setup.limits,
            dispatch_block: Duration::from_millis(200),
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let ledger_url = config.ledger().unwrap_or_else(|| "off".into());
        let running = service::start(config, listener, options)
            .await
            .context("starting the host")?;
        let base = format!("http://{}", running.addr());
        Ok(TestHost {
            ledger_url,
            running: Some(running),
            base,
            dir,
            client: reqwest::Client::builder()
                .timeout(Duration::from_secs(30))
                .build()?,
        })
    }

    /// Waits until `GET /v1/tasks/{id}` answers status `sent` for every one
    /// of `ids`, or fails after `deadline`.
    pub async fn wait_sent(&self, ids: &[String], deadline: Duration) -> anyhow::Result<()> {
        wait_until(deadline, || async move {
            for id in ids {
                let task = self.get(&format!("/v1/tasks/{id}"), None).await;
                if !task.is_ok_and(|t| t.body["status"] == "sent") {
                    return false;
                }
            }
            true
        })
        .await
    }

    /// The host's policy directory.
    pub fn policy_dir(&self) -> PathBuf {
        self.dir.path().join("policies")
    }

    /// The host's plugin directory (its own copy when the setup names
    /// `extra_plugins`; else the shared build output, not to be changed).
    pub fn plugin_dir(&self) -> PathBuf {
        let running = self.running.as_ref().expect("the host runs");
        running.live().config().plugin_dir.clone()
    }

    /// The development ledger of the default sender.
    pub fn ledger(&self) -> PathBuf {
        self.dir.path().join("data").join("ledger.jsonl")
    }

    /// `base + path`.
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// Sends a request and reads the answer.
    pub async fn send(&self, req: reqwest::RequestBuilder) -> anyhow::Result<Answer> {
        Answer::of(req).await
    }

    /// `POST path` with a JSON body and an optional bearer token.
    pub async fn post(
        &self,
        path: &str,
        body: &Value,
        token: Option<&str>,
    ) -> anyhow::Result<Answer> {
        let mut req = self.client.post(self.url(path)).json(body);
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        self.send(req).await
    }

    /// `GET path` with an optional bearer token.
    pub async fn get(&self, path: &str, token: Option<&str>) -> anyhow::Result<Answer> {
        let mut req = self.client.get(self.url(path));
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        self.send(req).await
    }

    /// The Prometheus text of `GET /metrics`.
    pub async fn metrics(&self) -> anyhow::Result<String> {
        Ok(self
            .client
            .get(self.url("/metrics"))
            .send()
            .await?
            .error_for_status()?
            .text()
            .await?)
    }

    /// Stops the host gracefully.
    pub async fn shutdown(mut self) -> anyhow::Result<()> {
        if let Some(running) = self.running.take() {
            tokio::time::timeout(Duration::from_secs(20), running.shutdown())
                .await
                .context("host did not stop within 20 s")??;
        }
        Ok(())
    }
}

/// An `ORDER_SHIPPED` event for order `biz_id` with the recipients its
/// policy needs (sms, wechat, app-push).
pub fn order_shipped(biz_id: &str) -> Value {
    serde_json::json!({
        "biz_type": "ORDER_SHIPPED",
        "biz_id": biz_id,
        "user_id": "u-42",
        "occurred_at": "2026-11-30T15:59:59Z",
        "template": "SHIPPED_V1",
        "params": {"order": biz_id},
        "recipients": {"sms": "+8613800000000", "wechat": "openid-42", "app-push": "token-42"}
    })
}
