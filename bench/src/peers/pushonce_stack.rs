//! pushonce's side: `pushonce serve` (the binary beside this one, started by
//! the test harness's [`ServeProcess`]) with one `webhook` channel to the
//! bench's receiver over plain HTTP (`allow_plaintext`), its own Redis (AOF
//! `everysec`) and its SQLite delivery ledger in its data directory.

use std::path::Path;

use anyhow::Context;
use pushonce_tests::redis::RedisServer;
use pushonce_tests::stack::{ServeConfig, ServeProcess};
use serde_json::json;

use super::poster::MakeRequest;

/// The `biz_type` of the bench's policy (one channel: `webhook`).
const BIZ_TYPE: &str = "BENCH_WEBHOOK";

/// The webhook signing secret: `whsec_` + base64 of 32 bytes.
const SECRET: &str = "whsec_cHVzaG9uY2UtcGVlcnMtYmVuY2gtc2VjcmV0LTMyYnk=";

/// A running pushonce with its Redis.
pub(super) struct PushonceStack {
    /// The host process.
    pub serve: ServeProcess,
    redis_pid: u32,
    _redis: RedisServer,
}

impl PushonceStack {
    /// Starts Redis and `pushonce serve` with `workers` dispatcher workers
    /// and the webhook channel to `receiver` (`http://127.0.0.1:<port><path>`).
    pub async fn start(
        dir: &Path,
        receiver: &str,
        workers: usize,
    ) -> anyhow::Result<PushonceStack> {
        let redis = RedisServer::start()
            .await
            .context("starting Redis for pushonce")?;
        let redis_pid = super::redis_pid(&redis).await?;
        let policies = dir.join("policies");
        std::fs::create_dir_all(&policies)?;
        std::fs::write(
            policies.join("bench-webhook.toml"),
            format!(
                r#"biz_type = "{BIZ_TYPE}"
channels = ["webhook"]
key_policy = "per-event@^1"
window = "24h"
[retry]
max_attempts = 5
backoff = {{ initial = "1s", factor = 2.0, max = "1m", jitter = true }}
"#
            ),
        )?;
        let authority = receiver
            .strip_prefix("http://")
            .and_then(|r| r.split('/').next())
            .context("the receiver's URL is not http://host:port/…")?;
        let channels = format!(
            r#"[channels.webhook]
plugin = "webhook@^2"
settings = {{ "endpoint.receiver" = "{receiver}" }}
secrets_from_env = {{ secret = "PEERS_WEBHOOK_SECRET" }}
allowed_hosts = ["{authority}"]
allow_plaintext = true
"#
        );
        let config = ServeConfig {
            redis: format!("redis_url = \"{}\"", redis.url()),
            channels,
            env: vec![("PEERS_WEBHOOK_SECRET".into(), SECRET.into())],
            shards: 4,
            workers,
            lease: "5s".into(),
            ledger_url: None,
            extra: String::new(),
        };
        let serve = ServeProcess::start(&config, &dir.join("host"), &policies)
            .await
            .context("starting pushonce serve")?;
        Ok(PushonceStack {
            serve,
            redis_pid,
            _redis: redis,
        })
    }

    /// CPU seconds of its Redis.
    pub fn stores_cpu_s(&self) -> f64 {
        super::cpu::own_s(self.redis_pid)
    }

    /// `POST /v1/events`: one event per message, `biz_id` its `seq`, to the
    /// webhook endpoint `receiver`, the `seq` in its params (the webhook's `data`).
    pub fn poster(&self) -> MakeRequest {
        let url = self.serve.url("/v1/events");
        std::sync::Arc::new(move |client: &reqwest::Client, seq: &str| {
            client.post(&url).json(&json!({
                "biz_type": BIZ_TYPE,
                "biz_id": seq,
                "user_id": format!("u-{seq}"),
                "template": "BENCH_T",
                "recipients": {"webhook": "receiver"},
                "params": {"seq": seq},
            }))
        })
    }
}
