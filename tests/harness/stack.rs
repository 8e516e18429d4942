//! A whole pushonce stack for end-to-end tests: the provider simulator in
//! this process on free loopback ports (`providers::Sim`), and real
//! `pushonce serve` processes configured to send through it (the six
//! channels over TLS) with the real plugins.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::host::Answer;
use crate::plugins::real_dir;
use crate::process::PushonceProcess;
use crate::providers::Sim;
use crate::wait_until;
use serde_json::Value;

/// What a generated `pushonce.toml` varies.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// The Redis lines of the configuration, e.g. `redis_url = "redis://…"`.
    pub redis: String,
    /// The `[channels.*]` tables (the simulator's [`Sim::toml`]).
    pub channels: String,
    /// The environment the channel tables name (secrets, callback tokens).
    pub env: Vec<(String, String)>,
    /// Shards of the key layout.
    pub shards: u16,
    /// Dispatcher workers per process.
    pub workers: usize,
    /// Lease of one attempt (humantime text, e.g. `"5s"`).
    pub lease: String,
    /// `ledger_url` (absent: each process its SQLite file in its data dir).
    pub ledger_url: Option<String>,
    /// Extra TOML appended at the end (e.g. a `[reconcile]` table).
    pub extra: String,
}

impl ServeConfig {
    /// Defaults for `redis_url = url` and the channels of `sim`.
    pub fn new(redis_url: &str, sim: &Sim) -> ServeConfig {
        ServeConfig {
            redis: format!("redis_url = \"{redis_url}\""),
            channels: sim.toml(),
            env: sim.env(),
            shards: 4,
            workers: 4,
            lease: "5s".into(),
            ledger_url: None,
            extra: String::new(),
        }
    }

    /// The configuration text for a process listening on `listen`, with its
    /// data under `dir` and its policies in `policies`.
    pub fn text(&self, listen: u16, dir: &Path, policies: &Path) -> String {
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
{ledger}
{extra}

{channels}
"#,
            redis = self.redis,
            data = dir.join("data").display(),
            plugins = real_dir().display(),
            policies = policies.display(),
            shards = self.shards,
            workers = self.workers,
            lease = self.lease,
            ledger = self
                .ledger_url
                .as_ref()
                .map(|url| format!("ledger_url = {url:?}"))
                .unwrap_or_default(),
            extra = self.extra,
            channels = self.channels,
        )
    }
}

/// One `pushonce serve` process of a stack, restartable on the same port.
pub struct ServeProcess {
    /// The running process (`None` while killed).
    process: Option<PushonceProcess>,
    /// Its configuration file.
    config: PathBuf,
    /// The environment the configuration names.
    env: Vec<(String, String)>,
    /// `http://127.0.0.1:<port>`.
    base: String,
    /// A client for its API.
    client: reqwest::Client,
    /// The logs of its earlier runs (ended by `kill9`).
    earlier_logs: Vec<PathBuf>,
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
            env: config.env.clone(),
            base: format!("http://127.0.0.1:{port}"),
            client: reqwest::Client::new(),
            earlier_logs: Vec::new(),
        };
        serve.restart().await?;
        Ok(serve)
    }

    /// Starts the process again (after [`ServeProcess::kill9`]) and waits
    /// until it is ready.
    pub async fn restart(&mut self) -> anyhow::Result<()> {
        let env: Vec<(&str, &str)> = self
            .env
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let process = PushonceProcess::serve(&self.config, &env)?;
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
            self.earlier_logs.push(p.log_path().to_path_buf());
        }
    }

    /// What every run of the process wrote to stderr, the earlier (killed)
    /// runs first.
    pub fn all_logs(&self) -> String {
        let mut text: String = self
            .earlier_logs
            .iter()
            .map(|l| std::fs::read_to_string(l).unwrap_or_default())
            .collect();
        text.push_str(&self.log());
        text
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

    /// `user`'s preferences view (`GET /v1/users/{user}/preferences` with
    /// the bearer `token`), asserting 200.
    pub async fn preferences(&self, user: &str, token: &str) -> Value {
        let path = format!("/v1/users/{user}/preferences");
        let answer = Answer::of(self.client.get(self.url(&path)).bearer_auth(token))
            .await
            .unwrap();
        assert_eq!(answer.status.as_u16(), 200, "{}", answer.body);
        answer.body
    }

    /// Replaces `user`'s preferences with `body` (`PUT
    /// /v1/users/{user}/preferences` with the bearer `token`), asserting 200.
    pub async fn set_preferences(&self, user: &str, token: &str, body: &Value) {
        let path = format!("/v1/users/{user}/preferences");
        let req = self
            .client
            .put(self.url(&path))
            .bearer_auth(token)
            .json(body);
        let answer = Answer::of(req).await.unwrap();
        assert_eq!(answer.status.as_u16(), 200, "{}", answer.body);
    }

    /// `POST path` with a JSON body (the stack's API is open: no token).
    pub async fn post(&self, path: &str, body: &serde_json::Value) -> anyhow::Result<Answer> {
        Answer::of(self.client.post(self.url(path)).json(body)).await
    }

    /// `POST /v1/events` with `body`, asserting 202: its first channel's
    /// result.
    pub async fn post_event(&self, body: &serde_json::Value) -> serde_json::Value {
        let a = self.post("/v1/events", body).await.unwrap();
        assert_eq!(a.status, 202, "{}", a.body);
        a.body["results"][0].clone()
    }

    /// `POST /v1/events/{biz_type}/{biz_id}/cancel` with `body`, asserting
    /// 200 and that its first channel is `cancelled`: the answer.
    pub async fn cancel_event(
        &self,
        biz_type: &str,
        biz_id: &str,
        body: &serde_json::Value,
    ) -> serde_json::Value {
        let a = self
            .post(&format!("/v1/events/{biz_type}/{biz_id}/cancel"), body)
            .await
            .unwrap();
        assert_eq!(a.status, 200, "{}", a.body);
        assert_eq!(a.body["channels"][0]["result"], "cancelled", "{}", a.body);
        a.body
    }

    /// `GET path`.
    pub async fn get(&self, path: &str) -> anyhow::Result<Answer> {
        Answer::of(self.client.get(self.url(path))).await
    }

    /// The process id of the running process (`None` while killed).
    pub fn pid(&self) -> Option<u32> {
        self.process.as_ref().map(|p| p.pid())
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

/// Posts `body` to `/v1/events` and returns the answer.
pub async fn post_json(client: &reqwest::Client, base: &str, body: &Value) -> Value {
    let answer = client.post(format!("{base}/v1/events")).json(body).send();
    answer.await.unwrap().json().await.unwrap()
}

/// Posts `body` to `/v1/events` and returns the task ids, asserting each
/// channel accepted it.
pub async fn post_event(client: &reqwest::Client, base: &str, body: &Value) -> Vec<String> {
    let answer = post_json(client, base, body).await;
    let results = answer["results"]
        .as_array()
        .unwrap_or_else(|| panic!("{answer}"));
    results
        .iter()
        .map(|r| {
            assert_eq!(r["result"], "accepted", "{answer}");
            r["task_id"].as_str().unwrap().to_string()
        })
        .collect()
}

/// Waits up to `secs` until every task of `ids` is `done`; false if not.
pub async fn wait_tasks(
    client: &reqwest::Client,
    base: &str,
    ids: &[String],
    secs: u64,
    done: fn(&Value) -> bool,
) -> bool {
    wait_until(Duration::from_secs(secs), || {
        let (client, base, ids) = (client.clone(), base.to_string(), ids.to_vec());
        async move {
            for id in ids {
                match get_json(&client, &format!("{base}/v1/tasks/{id}")).await {
                    Some(t) if done(&t) => {}
                    _ => return false,
                }
            }
            true
        }
    })
    .await
    .is_ok()
}

/// `GET url` as JSON; `None` when it cannot be read.
pub async fn get_json(client: &reqwest::Client, url: &str) -> Option<Value> {
    client.get(url).send().await.ok()?.json().await.ok()
}

/// The changes in a preferences view's history made through `route`
/// (`sms_reply`, `email_bounce`, ...), newest first.
pub fn history_by_route(view: &Value, route: &str) -> Vec<Value> {
    view["history"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["route"] == route)
        .cloned()
        .collect()
}
