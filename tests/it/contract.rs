//! Channel contract 2, host side, end to end through the API: a whole host
//! in process (real redis-server) sending through the `contract-probe`
//! fixture plugin to a small provider on 127.0.0.1 that counts what it got.
//! Retry-after, the query lag, the reference window, callbacks (closed by
//! default, path token, signatures, the provider's reply), receipts for
//! unknown messages, redaction of secrets, and the shared cache (one token
//! for two `pushonce serve` processes; channels cannot see each other's
//! entries).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pushonce::config::{ChannelConfig, HostConfig, OnUnknown};
use pushonce::permit::PermitConfig;
use pushonce::plugin::bindings::CacheError;
use pushonce::plugin::cache_import::SharedCache;
use pushonce_tests::host::{Setup, TestHost};
use pushonce_tests::plugins::{fixture, real_dir};
use pushonce_tests::process::PushonceProcess;
use pushonce_tests::redis::RedisServer;
use pushonce_tests::wait_until;
use reqwest::StatusCode;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

/// Longest wait for a condition.
const DEADLINE: Duration = Duration::from_secs(30);

/// The callback secret the probe verifies signatures with.
const CALLBACK_SECRET: &str = "cb-secret-41";

/// The path token of the probe channels' callback URL.
const PATH_TOKEN: &str = "path-token-8c1f5e2d9a7b3c";

/// What the test provider received.
#[derive(Default)]
struct Provider {
    /// Every `POST /send` body.
    messages: Mutex<Vec<Value>>,
    /// `GET /token` calls.
    token_fetches: Mutex<u32>,
    /// When each `POST /send` arrived, with the message's key.
    arrivals: Mutex<Vec<(String, std::time::Instant)>>,
}

impl Provider {
    /// When the sends of keys containing `key_part` arrived, in order.
    fn arrivals_of(&self, key_part: &str) -> Vec<std::time::Instant> {
        let arrivals = self.arrivals.lock().unwrap();
        arrivals
            .iter()
            .filter(|(key, _)| key.contains(key_part))
            .map(|(_, at)| *at)
            .collect()
    }

    fn sends_of(&self, key_part: &str) -> Vec<Value> {
        let messages = self.messages.lock().unwrap();
        let of = |m: &&Value| m["key"].as_str().unwrap_or("").contains(key_part);
        messages.iter().filter(of).cloned().collect()
    }
}

/// Starts the provider on 127.0.0.1; returns its address and what it got.
async fn provider() -> (String, Arc<Provider>) {
    use axum::extract::State;
    let state = Arc::new(Provider::default());
    let app = axum::Router::new()
        .route(
            "/send",
            axum::routing::post(
                |State(p): State<Arc<Provider>>, axum::Json(body): axum::Json<Value>| async move {
                    let key = body["key"].as_str().unwrap_or("").to_string();
                    p.arrivals
                        .lock()
                        .unwrap()
                        .push((key, std::time::Instant::now()));
                    p.messages.lock().unwrap().push(body);
                    "ok"
                },
            ),
        )
        .route(
            "/token",
            axum::routing::get(|State(p): State<Arc<Provider>>| async move {
                *p.token_fetches.lock().unwrap() += 1;
                // A real token endpoint takes a while; concurrent misses overlap.
                tokio::time::sleep(Duration::from_millis(200)).await;
                "tok-1"
            }),
        )
        .with_state(state.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (addr, state)
}

/// A probe channel against the provider at `addr`, with `settings`.
fn probe(addr: &str, settings: &[(&str, &str)]) -> ChannelConfig {
    let mut c = ChannelConfig::new("contract-probe@^2");
    c.settings
        .insert("endpoint".into(), format!("http://{addr}"));
    c.settings
        .insert("token_url".into(), format!("http://{addr}/token"));
    c.settings
        .insert("callback_secret".into(), CALLBACK_SECRET.into());
    for (k, v) in settings {
        c.settings.insert(k.to_string(), v.to_string());
    }
    c.allowed_hosts = vec![addr.to_string()];
    // The test provider speaks plain HTTP.
    c.allow_plaintext = true;
    c.call_timeout = Duration::from_secs(10);
    c
}

/// A policy sending `PROBE` events on `channels`, retrying after
/// `first_retry` (doubling, capped at 10 s, no jitter).
fn policy(channels: &[&str], first_retry: &str) -> (String, String) {
    let text = format!(
        r#"
biz_type = "PROBE"
key_policy = "per-event@^1"
channels = {channels:?}
window = "1h"

[retry]
max_attempts = 2
backoff = {{ initial = "{first_retry}", factor = 2.0, max = "10s", jitter = false }}
"#
    );
    ("probe.toml".into(), text)
}

/// A host with `channels` (name, config) and the probe policy over them,
/// retrying quickly.
async fn host(
    redis: &RedisServer,
    channels: Vec<(&str, ChannelConfig)>,
    env: &[(&str, &str)],
    configure: impl FnOnce(&mut HostConfig) + Send + 'static,
) -> anyhow::Result<TestHost> {
    host_retrying(redis, channels, env, "100ms", configure).await
}

/// [`host`], its policy retrying first after `first_retry`.
async fn host_retrying(
    redis: &RedisServer,
    channels: Vec<(&str, ChannelConfig)>,
    env: &[(&str, &str)],
    first_retry: &str,
    configure: impl FnOnce(&mut HostConfig) + Send + 'static,
) -> anyhow::Result<TestHost> {
    let names: Vec<&str> = channels.iter().map(|(n, _)| *n).collect();
    let channels: Vec<(String, ChannelConfig)> = channels
        .into_iter()
        .map(|(n, c)| (n.to_string(), c))
        .collect();
    let mut vars: HashMap<String, String> = env
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    vars.insert("PROBE_TOKEN".into(), PATH_TOKEN.into());
    TestHost::start_with(
        redis,
        Setup {
            env: vars,
            policies: Some(vec![policy(&names, first_retry)]),
            plugin_sender: true,
            extra_plugins: vec![fixture("contract_probe")],
            configure: Some(Box::new(move |config: &mut HostConfig| {
                config.channels.clear();
                for (name, c) in channels {
                    config.channels.insert(name, c);
                }
                configure(config);
            })),
            ..Setup::default()
        },
    )
    .await
}

/// Posts one `PROBE` event with `template` on every channel of the policy;
/// returns (channel, task id) pairs.
async fn post(
    host: &TestHost,
    biz_id: &str,
    template: &str,
    channels: &[&str],
) -> Vec<(String, String)> {
    let recipients: serde_json::Map<String, Value> = channels
        .iter()
        .map(|c| (c.to_string(), json!("user-1")))
        .collect();
    let event = json!({
        "biz_type": "PROBE", "biz_id": biz_id, "user_id": "u-1", "occurred_at": "2026-11-30T08:00:00Z",
        "template": template, "recipients": recipients,
    });
    let a = host.post("/v1/events", &event, None).await.unwrap();
    assert_eq!(a.status, StatusCode::ACCEPTED, "{}", a.body);
    a.body["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["channel"].as_str().unwrap().to_string(),
                r["task_id"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

/// `GET /v1/tasks/{id}`.
async fn task(host: &TestHost, id: &str) -> Value {
    host.get(&format!("/v1/tasks/{id}"), None)
        .await
        .unwrap()
        .body
}

/// Waits until task `id` has `status`.
async fn wait_status(host: &TestHost, id: &str, status: &str) -> Value {
    let ok = wait_until(DEADLINE, || async {
        task(host, id).await["status"] == status
    })
    .await;
    let t = task(host, id).await;
    assert!(ok.is_ok(), "task never became {status}: {t}");
    t
}

/// The value of a Prometheus series whose line has every one of `labels`.
fn metric(text: &str, name: &str, labels: &[&str]) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")))
        .filter(|l| labels.iter().all(|want| l.contains(want)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_after_is_waited_for_within_the_schedule() {
    let redis = RedisServer::start().await.unwrap();
    let (addr, provider) = provider().await;
    let c = probe(&addr, &[("retry_after_ms", "3000")]);
    let host = host(&redis, vec![("probe", c)], &[], |_| {}).await.unwrap();
    let (_, id) = post(&host, "ra-1", "retry-after", &["probe"])
        .await
        .remove(0);
    let t = wait_status(&host, &id, "sent").await;
    assert_eq!(t["attempts"], 2, "{t}");
    // The backoff alone says 100 ms; the provider asked for 3 s. (The task
    // was sent for good and left Redis: the provider's clock tells the gap.)
    let at = provider.arrivals_of("ra-1");
    assert_eq!(at.len(), 2, "two sends");
    let gap = (at[1] - at[0]).as_millis();
    assert!(
        gap >= 3000,
        "the second attempt came {gap} ms after the first: {t}"
    );
    assert!(gap < 10_000, "never beyond the backoff's max: {gap} ms");
    assert_eq!(provider.sends_of("ra-1").len(), 2);
    host.shutdown().await.unwrap();
}

/// A reload that would leave a configured channel without its plugin (the
/// file deleted) is refused by name, and the generation in force keeps
/// delivering through the plugin it loaded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_that_loses_a_channels_plugin_is_refused_and_delivery_goes_on() {
    let redis = RedisServer::start().await.unwrap();
    let (addr, provider) = provider().await;
    let host = host(&redis, vec![("probe", probe(&addr, &[]))], &[], |_| {})
        .await
        .unwrap();
    std::fs::remove_file(host.plugin_dir().join("contract_probe.wasm")).unwrap();

    let a = host.post("/admin/reload", &json!({}), None).await.unwrap();
    assert_eq!(a.status.as_u16(), 422, "{}", a.body);
    let errors = a.body["errors"].to_string();
    assert!(
        errors.contains("channels.probe.plugin") && errors.contains("contract-probe@^2"),
        "the refusal names the channel and its requirement: {errors}"
    );
    let policies = host.get("/admin/policies", None).await.unwrap();
    assert_eq!(policies.body["generation"], 1, "{}", policies.body);

    let (_, id) = post(&host, "lost-1", "plain", &["probe"]).await.remove(0);
    wait_status(&host, &id, "sent").await;
    assert_eq!(provider.sends_of("lost-1").len(), 1);
    host.shutdown().await.unwrap();
}

/// A host whose configured channel names a plugin that is not there does
/// not start, and says which channel.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_whose_channel_plugin_does_not_resolve_does_not_start() {
    let redis = RedisServer::start().await.unwrap();
    let (addr, _provider) = provider().await;
    let mut c = probe(&addr, &[]);
    c.plugin = "contract-probe@^3".into();
    let err = match host(&redis, vec![("probe", c)], &[], |_| {}).await {
        Ok(_) => panic!("the host started without its channel's plugin"),
        Err(e) => format!("{e:#}"),
    };
    assert!(
        err.contains("channels.probe.plugin") && err.contains("contract-probe@^3"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_answer_inside_the_query_lag_never_resends() {
    let redis = RedisServer::start().await.unwrap();
    let (addr, provider) = provider().await;
    let querying = [("can_query", "true"), ("query_answer", "unknown")];
    // Same provider, same answer; one lags ten minutes behind a send.
    let mut lagging = probe(
        &addr,
        &[querying[0], querying[1], ("query_lag_secs", "600")],
    );
    let mut prompt = probe(&addr, &querying);
    // Even a channel told to resend on doubt does not resend inside the lag.
    lagging.on_unknown = OnUnknown::Resend;
    prompt.on_unknown = OnUnknown::Resend;
    let host = host(
        &redis,
        vec![("lagging", lagging), ("prompt", prompt)],
        &[],
        |config| {
            config.reconcile.every = Duration::from_millis(100);
            config.reconcile.unknown_age = Duration::from_millis(100);
        },
    )
    .await
    .unwrap();
    let tasks = post(&host, "lag-1", "unknown", &["lagging", "prompt"]).await;
    let id_of = |c: &str| tasks.iter().find(|(ch, _)| ch == c).unwrap().1.clone();
    // Prompt: `unknown` past the lag is believed; the resend is the second message.
    wait_until(DEADLINE, || async {
        provider.sends_of(":prompt:PROBE:lag-1").len() >= 2
    })
    .await
    .expect("the prompt channel resends");
    // Lagging: held as unknown, and the reconciler asked again (and did not
    // believe `unknown` either) — still one message.
    let lagging_id = id_of("lagging");
    wait_status(&host, &lagging_id, "unknown").await;
    let checked = wait_until(DEADLINE, || async {
        let m = host.metrics().await.unwrap();
        metric(
            &m,
            "pushonce_reconcile_checks_total",
            &["channel=\"lagging\"", "cannot_tell"],
        ) >= 1.0
    })
    .await;
    assert!(checked.is_ok(), "the reconciler checked the lagging task");
    let t = task(&host, &lagging_id).await;
    assert_eq!(t["status"], "unknown", "{t}");
    assert_eq!(t["attempts"], 1, "{t}");
    assert_eq!(
        provider.sends_of(":lagging:PROBE:lag-1").len(),
        1,
        "no second message"
    );
    host.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reference_is_resent_only_inside_its_window() {
    let redis = RedisServer::start().await.unwrap();
    let (addr, provider) = provider().await;
    let inside = probe(
        &addr,
        &[
            ("honours_reference", "true"),
            ("reference_window_secs", "3600"),
        ],
    );
    // A window of 0 s: every unknown is past it, settled as without a reference.
    let past = probe(
        &addr,
        &[
            ("honours_reference", "true"),
            ("reference_window_secs", "0"),
        ],
    );
    let host = host(
        &redis,
        vec![("inside", inside), ("past", past)],
        &[],
        |_| {},
    )
    .await
    .unwrap();
    let tasks = post(&host, "win-1", "unknown", &["inside", "past"]).await;
    for (_, id) in &tasks {
        wait_status(&host, id, "unknown").await;
    }
    // Inside the window: resent by reference up to the attempt limit (2).
    assert_eq!(provider.sends_of(":inside:PROBE:win-1").len(), 2);
    // Past it: no reference to lean on, no query, `on_unknown = hold`.
    assert_eq!(provider.sends_of(":past:PROBE:win-1").len(), 1);
    host.shutdown().await.unwrap();
}

/// A resend decided inside the reference window but due after it (the retry
/// delay is longer than what is left of the window) is decided again when
/// its turn comes: past the window it would be a new message, so it is held
/// (`on_unknown = hold`), and the provider has one message. So is one on a
/// channel that also has a status query, when the resend leaned on the
/// reference because the query could not tell yet (its lag).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resend_due_after_the_reference_window_is_held_not_sent() {
    let redis = RedisServer::start().await.unwrap();
    let (addr, provider) = provider().await;
    let reference = [
        ("honours_reference", "true"),
        ("reference_window_secs", "2"),
    ];
    let slow = probe(&addr, &reference);
    let querying = probe(
        &addr,
        &[
            reference[0],
            reference[1],
            ("can_query", "true"),
            ("query_answer", "unknown"),
            ("query_lag_secs", "600"),
        ],
    );
    let host = host_retrying(
        &redis,
        vec![("slow", slow), ("querying", querying)],
        &[],
        "4s",
        |_| {},
    )
    .await
    .unwrap();
    let tasks = post(&host, "late-1", "unknown", &["slow", "querying"]).await;
    for (channel, id) in &tasks {
        // The first answer is ambiguous; the resend is decided at once,
        // inside the window, and is due 4 s later, past it.
        wait_until(DEADLINE, || async {
            task(&host, id).await["last_error"]
                .as_str()
                .is_some_and(|e| e.contains("past the provider's reference window"))
        })
        .await
        .unwrap_or_else(|e| panic!("{channel}: the late resend is held: {e}"));
        let t = task(&host, id).await;
        assert_eq!(t["status"], "unknown", "{channel}: {t}");
        assert_eq!(
            provider.sends_of(&format!(":{channel}:PROBE:late-1")).len(),
            1,
            "{channel}: one message"
        );
    }
    host.shutdown().await.unwrap();
}

/// `signature`, `timestamp`, `nonce` (and `extra`) as a query string signed
/// with `secret` the WeChat way (hex SHA-256 of the sorted parts).
fn signed_query(secret: &str, extra: &str) -> String {
    let (timestamp, nonce) = ("1700000000", "n0nce");
    let mut parts = [secret, timestamp, nonce];
    parts.sort();
    let signature = hex::encode(Sha256::digest(parts.concat().as_bytes()));
    format!("signature={signature}&timestamp={timestamp}&nonce={nonce}{extra}")
}

/// A callback channel with its path token.
fn callback_probe(addr: &str) -> ChannelConfig {
    let mut c = probe(addr, &[("callbacks", "true")]);
    c.callback_token_env = Some("PROBE_TOKEN".into());
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callbacks_verify_settle_and_answer_as_the_provider_expects() {
    let redis = RedisServer::start().await.unwrap();
    let (addr, _provider) = provider().await;
    let host = host(&redis, vec![("probe", callback_probe(&addr))], &[], |_| {})
        .await
        .unwrap();
    let url = |rest: &str| host.url(&format!("/v1/receipts/probe/{PATH_TOKEN}{rest}"));

    // The URL check: the echostr comes back as plain text.
    let q = signed_query(CALLBACK_SECRET, "&echostr=hello-42");
    let a = host
        .send(host.client.get(url(&format!("?{q}"))))
        .await
        .unwrap();
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(a.body, "hello-42");
    assert!(a.content_type().starts_with("text/plain"), "{a:?}");

    // A signed POST settles the message it names, answered `success`.
    let (_, good) = post(&host, "cb-1", "ok", &["probe"]).await.remove(0);
    let (_, other) = post(&host, "cb-2", "ok", &["probe"]).await.remove(0);
    wait_status(&host, &good, "sent").await;
    wait_status(&host, &other, "sent").await;
    let body = json!({"id": format!("p-{good}"), "status": "delivered"}).to_string();
    let q = signed_query(CALLBACK_SECRET, "");
    let a = host
        .send(host.client.post(url(&format!("?{q}"))).body(body))
        .await
        .unwrap();
    assert_eq!(a.status, StatusCode::OK, "{}", a.body);
    assert_eq!(a.body, "success");
    assert_eq!(task(&host, &good).await["status"], "delivered");

    // A forged signature is refused (403) and settles nothing.
    let body = json!({"id": format!("p-{other}"), "status": "delivered"}).to_string();
    let forged = signed_query("not-the-secret", "");
    let a = host
        .send(
            host.client
                .post(url(&format!("?{forged}")))
                .body(body.clone()),
        )
        .await
        .unwrap();
    assert_eq!(a.status, StatusCode::FORBIDDEN, "{}", a.body);
    assert_eq!(a.body["type"], "urn:pushonce:problem:forbidden");
    assert_eq!(task(&host, &other).await["status"], "sent");

    // A wrong path token is a plain 404, as for a channel that does not exist.
    let wrong = host.url(&format!("/v1/receipts/probe/wrong-token?{q}"));
    let a = host.send(host.client.post(wrong).body(body)).await.unwrap();
    assert_eq!(a.status, StatusCode::NOT_FOUND);
    assert_eq!(a.body["detail"], "no such route");
    host.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callback_routes_are_closed_by_default() {
    let redis = RedisServer::start().await.unwrap();
    let (addr, _provider) = provider().await;
    // Callbacks, no token, not opened: the host does not start.
    let closed = probe(&addr, &[("callbacks", "true")]);
    let err = host(&redis, vec![("probe", closed.clone())], &[], |_| {})
        .await
        .err()
        .expect("the host refuses to start");
    let text = format!("{err:#}");
    for part in [
        "channel probe",
        "callback_token_env",
        "open_callbacks = true",
    ] {
        assert!(text.contains(part), "{text}");
    }
    // The operator's explicit opt-in: served without a token.
    let mut open = closed;
    open.open_callbacks = true;
    let host = host(&redis, vec![("probe", open)], &[], |_| {})
        .await
        .unwrap();
    let q = signed_query(CALLBACK_SECRET, "&echostr=open-1");
    let a = host
        .send(
            host.client
                .get(host.url(&format!("/v1/receipts/probe?{q}"))),
        )
        .await
        .unwrap();
    assert_eq!(a.status, StatusCode::OK, "{}", a.body);
    assert_eq!(a.body, "open-1");
    host.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_refuses_unreachable_callbacks_and_names_config_edits_it_cannot_apply() {
    let redis = RedisServer::start().await.unwrap();
    let policy = "biz_type = \"LATE\"\nkey_policy = \"per-event@^1\"\nchannels = [\"late\"]\nwindow = \"1h\"\n";
    // The configuration file the host was started from.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("pushonce.toml");
    let text = "[channels.late]\nplugin = \"late-callbacks@^1\"\n";
    std::fs::write(&file, text).unwrap();
    let source = (file.clone(), text.parse::<toml::Table>().unwrap());
    // 1.0.0 takes no callbacks: the channel needs no callback route, the host starts.
    let host = TestHost::start_with(
        &redis,
        Setup {
            policies: Some(vec![("late.toml".into(), policy.into())]),
            plugin_sender: true,
            extra_plugins: vec![fixture("late_callbacks_1_0_0")],
            configure: Some(Box::new(move |config: &mut HostConfig| {
                config.channels.clear();
                config
                    .channels
                    .insert("late".into(), ChannelConfig::new("late-callbacks@^1"));
                config.source = Some(source);
            })),
            ..Setup::default()
        },
    )
    .await
    .unwrap();
    // An edit of pushonce.toml is not applied by a reload: its answer says
    // which settings wait for a restart.
    std::fs::write(&file, format!("{text}rate_limit = 5.0\n")).unwrap();
    let a = host.post("/admin/reload", &json!({}), None).await.unwrap();
    assert_eq!(a.status, StatusCode::OK, "{}", a.body);
    let notes = a.body["notes"].to_string();
    assert!(
        notes.contains("was edited since start; restart needed: channels.late"),
        "{notes}"
    );
    let overview = host.get("/admin/overview", None).await.unwrap();
    assert!(
        overview.body["reload"]["notes"]
            .to_string()
            .contains("restart needed: channels.late"),
        "{}",
        overview.body
    );

    // 1.1.0 takes callbacks; with no `callback_token_env` (nor
    // `open_callbacks`) the start would be refused, and so is the reload
    // that would swap it in. Copied in whole (temporary name, then renamed).
    let staged = host.plugin_dir().join("late_callbacks_1_1_0.partial");
    std::fs::copy(fixture("late_callbacks_1_1_0"), &staged).unwrap();
    std::fs::rename(&staged, host.plugin_dir().join("late_callbacks_1_1_0.wasm")).unwrap();
    let a = host.post("/admin/reload", &json!({}), None).await.unwrap();
    assert_eq!(a.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", a.body);
    let detail = a.body["detail"].as_str().unwrap_or_default();
    for part in [
        "channels.late.callback_token_env",
        "late-callbacks@1.1.0",
        "open_callbacks = true",
    ] {
        assert!(detail.contains(part), "{detail}");
    }
    let plugins = host.get("/admin/plugins", None).await.unwrap();
    assert!(
        !plugins.body.to_string().contains("late-callbacks@1.1.0"),
        "1.0.0 keeps serving: {}",
        plugins.body
    );
    host.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receipt_for_an_unknown_message_is_answered_503_only_for_the_grace() {
    let redis = RedisServer::start().await.unwrap();
    let (addr, _provider) = provider().await;
    let host = host(
        &redis,
        vec![("probe", callback_probe(&addr))],
        &[],
        |config| {
            config.receipts.unmatched_grace = Duration::from_secs(1);
        },
    )
    .await
    .unwrap();
    let q = signed_query(CALLBACK_SECRET, "");
    let url = host.url(&format!("/v1/receipts/probe/{PATH_TOKEN}?{q}"));
    let body = json!({"id": "never-sent-77", "status": "delivered"}).to_string();
    let send = || host.send(host.client.post(&url).body(body.clone()));
    let first = send().await.unwrap();
    assert_eq!(
        first.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{}",
        first.body
    );
    assert!(first.headers.contains_key("retry-after"));
    let accepted = wait_until(DEADLINE, || async {
        send().await.unwrap().status == StatusCode::OK
    })
    .await;
    assert!(accepted.is_ok(), "accepted after the grace");
    let m = host.metrics().await.unwrap();
    assert!(
        metric(
            &m,
            "pushonce_receipts_unmatched_total",
            &["channel=\"probe\""]
        ) >= 1.0,
        "{m}"
    );
    host.shutdown().await.unwrap();
}

/// The `api_secret` the probe channel of [`host_with_secret`] is given.
const SECRET: &str = "s3cr3t/key+42=";

/// A host with one probe channel against the provider at `addr`, whose
/// `api_secret` is [`SECRET`] (from the environment, as secrets are).
async fn host_with_secret(redis: &RedisServer, addr: &str) -> TestHost {
    let mut c = probe(addr, &[]);
    c.secrets_from_env
        .insert("api_secret".into(), "PROBE_API_SECRET".into());
    host(
        redis,
        vec![("probe", c)],
        &[("PROBE_API_SECRET", SECRET)],
        |_| {},
    )
    .await
    .unwrap()
}

/// What a channel plugin returns is bounded: a 4 MiB error is stored cut
/// to a few KiB with a marker, and cut after its secrets are redacted (one
/// quoted across the cut leaves nothing of itself); a provider id too long
/// to index is a malformed answer, a failed call naming the field.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_plugin_answers_are_cut_or_refused() {
    let redis = RedisServer::start().await.unwrap();
    let (addr, _provider) = provider().await;
    let host = host_with_secret(&redis, &addr).await;

    let (_, id) = post(&host, "huge-1", "huge-error", &["probe"])
        .await
        .remove(0);
    let t = wait_status(&host, &id, "failed").await;
    let text = t.to_string();
    assert!(
        text.len() < 16 << 10,
        "a task record of {} bytes",
        text.len()
    );
    let error = t["last_error"].as_str().unwrap();
    assert!(error.contains("provider says: xxx"), "{error:.200}");
    assert!(
        error.ends_with("more bytes cut]"),
        "{}",
        &error[error.len() - 60..]
    );
    assert!(!text.contains("s3cr3t"), "{}", &error[4000..]);

    let (_, id) = post(&host, "long-id-1", "long-id", &["probe"])
        .await
        .remove(0);
    let t = wait_status(&host, &id, "dead").await;
    let error = t["last_error"].as_str().unwrap();
    assert!(
        error.contains(
            "returned a malformed answer: provider_message_id is 300 bytes (at most 256)"
        ),
        "{t}"
    );
    host.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_a_plugin_echoes_never_reach_the_api() {
    let redis = RedisServer::start().await.unwrap();
    let (addr, _provider) = provider().await;
    let host = host_with_secret(&redis, &addr).await;
    let (_, id) = post(&host, "sec-1", "echo-secret", &["probe"])
        .await
        .remove(0);
    wait_status(&host, &id, "failed").await;
    let text = host
        .get(&format!("/v1/tasks/{id}"), None)
        .await
        .unwrap()
        .body
        .to_string();
    assert!(!text.contains(SECRET), "{text}");
    assert!(!text.contains("s3cr3t%2Fkey%2B42%3D"), "{text}");
    assert!(!text.contains("s3cr3t"), "{text}");
    assert!(
        text.contains("provider refused the key [redacted] (sent as [redacted])"),
        "{text}"
    );
    host.shutdown().await.unwrap();
}

/// Starts one `pushonce serve` process with the probe channel (8 warm
/// instances) against `redis`, sharing `plugins` and `policies`; its base URL.
async fn serve_probe(
    redis: &RedisServer,
    dir: &std::path::Path,
    plugins: &std::path::Path,
    policies: &std::path::Path,
    provider: &str,
) -> (PushonceProcess, String) {
    std::fs::create_dir_all(dir).unwrap();
    let port = pushonce::store::free_loopback_port().unwrap();
    let text = format!(
        r#"
listen = "127.0.0.1:{port}"
redis_url = "{redis}"
data_dir = "{data}"
ledger_url = "sqlite:{ledger}"
plugin_dir = "{plugins}"
policy_dir = "{policies}"
shards = 4
workers = 8
lease = "5s"

[channels.probe]
plugin = "contract-probe@^2"
settings = {{ endpoint = "http://{provider}", token_url = "http://{provider}/token" }}
allowed_hosts = ["{provider}"]
allow_plaintext = true
concurrency = 8
"#,
        redis = redis.url(),
        data = dir.join("data").display(),
        // The processes of one test share one ledger, as instances on one Redis must.
        ledger = dir.parent().unwrap().join("ledger.sqlite3").display(),
        plugins = plugins.display(),
        policies = policies.display(),
    );
    let config = dir.join("pushonce.toml");
    std::fs::write(&config, text).unwrap();
    let process = PushonceProcess::serve(&config, &[]).unwrap();
    let base = format!("http://127.0.0.1:{port}");
    process
        .wait_ready(&base, Duration::from_secs(60))
        .await
        .unwrap();
    (process, base)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_host_processes_and_many_warm_instances_fetch_one_token() {
    let redis = RedisServer::start().await.unwrap();
    let (addr, provider) = provider().await;
    let dir = tempfile::tempdir().unwrap();
    let plugins = dir.path().join("plugins");
    std::fs::create_dir_all(&plugins).unwrap();
    for entry in std::fs::read_dir(real_dir()).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, plugins.join(path.file_name().unwrap())).unwrap();
    }
    std::fs::copy(
        fixture("contract_probe"),
        plugins.join("contract_probe.wasm"),
    )
    .unwrap();
    let policies = dir.path().join("policies");
    std::fs::create_dir_all(&policies).unwrap();
    let (name, text) = policy(&["probe"], "100ms");
    std::fs::write(policies.join(name), text).unwrap();
    let (mut a, base_a) =
        serve_probe(&redis, &dir.path().join("a"), &plugins, &policies, &addr).await;
    let (mut b, base_b) =
        serve_probe(&redis, &dir.path().join("b"), &plugins, &policies, &addr).await;

    // 24 events at once, half to each process.
    let client = reqwest::Client::new();
    let mut posting = tokio::task::JoinSet::new();
    for i in 0..24 {
        let base = if i % 2 == 0 { &base_a } else { &base_b };
        let (client, url) = (client.clone(), format!("{base}/v1/events"));
        let event = json!({
            "biz_type": "PROBE", "biz_id": format!("tok-{i}"), "user_id": "u-1",
            "occurred_at": "2026-11-30T08:00:00Z", "template": "token", "recipients": {"probe": "user-1"},
        });
        posting.spawn(async move { client.post(url).json(&event).send().await });
    }
    while let Some(done) = posting.join_next().await {
        assert_eq!(done.unwrap().unwrap().status(), StatusCode::ACCEPTED);
    }
    let all_sent = wait_until(DEADLINE, || async {
        provider.sends_of(":probe:PROBE:tok-").len() >= 24
    })
    .await;
    assert!(all_sent.is_ok(), "host logs:\n{}\n{}", a.log(), b.log());
    assert_eq!(provider.sends_of(":probe:PROBE:tok-").len(), 24);
    assert_eq!(
        *provider.token_fetches.lock().unwrap(),
        1,
        "one token for every instance of both processes"
    );
    a.terminate(Duration::from_secs(20)).await.unwrap();
    b.terminate(Duration::from_secs(20)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_channel_never_sees_another_channels_cache_and_sizes_are_bounded() {
    let redis = RedisServer::start().await.unwrap();
    let permits = redis.permits(PermitConfig::default()).await.unwrap();
    let a = SharedCache::new(permits.connection(), "po", "a");
    let b = SharedCache::new(permits.connection(), "po", "b");
    a.set("token", "A", 60_000).await.unwrap();
    b.set("token", "B", 60_000).await.unwrap();
    assert_eq!(a.get("token").await.unwrap().as_deref(), Some("A"));
    assert_eq!(b.get("token").await.unwrap().as_deref(), Some("B"));
    assert_eq!(b.get("other").await.unwrap(), None);
    // Compare-and-set / -delete are per channel too.
    assert!(
        !b.compare_and_set("token", Some("A"), "x", 1000)
            .await
            .unwrap()
    );
    assert!(
        a.compare_and_set("token", Some("A"), "A2", 1000)
            .await
            .unwrap()
    );
    assert!(!b.compare_and_delete("token", "A2").await.unwrap());
    assert!(a.compare_and_delete("token", "A2").await.unwrap());
    assert_eq!(b.get("token").await.unwrap().as_deref(), Some("B"));
    // A key naming another channel's entry is just a key of this channel.
    assert_eq!(a.get("{po:cache:b}:e:token").await.unwrap(), None);

    let too_large = |r: Result<(), CacheError>| matches!(r, Err(CacheError::TooLarge(_)));
    assert!(too_large(a.set(&"k".repeat(257), "v", 1000).await));
    assert!(too_large(
        a.set("k", &"v".repeat(16 * 1024 + 1), 1000).await
    ));
    assert!(too_large(a.set("k", "v", 0).await), "a ttl is required");
    for i in 0..1000 {
        a.set(&format!("k{i}"), "v", 60_000).await.unwrap();
    }
    assert!(
        too_large(a.set("one-more", "v", 60_000).await),
        "1000 entries at most"
    );
    a.set("k0", "replaced", 60_000).await.unwrap();
    b.set("b-still-has-room", "v", 60_000).await.unwrap();
}
