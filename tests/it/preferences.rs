//! Recipient preferences (issue 35 item 1) through real `pushonce serve`
//! processes, real Redis, the real plugins and the provider simulator: an
//! opt-out made on one host stops the next event on that channel on another
//! host within the documented bound (`[preferences] cache_ttl`), the other
//! channels still send and nothing reaches the provider on the opted-out one;
//! a mandatory category still sends; a fallback chain skips a switched-off
//! channel; a Redis restart (and a host restart)
//! loses no preference; the history lists each change with its route and
//! token kind; bad input is refused naming the field; the console shows a
//! user's preferences, their history and an event's opted-out channel; a
//! one-click unsubscribe link (RFC 8058) opts its user out of its category
//! without a login, and a forged, altered or expired one changes nothing.
//! Conditions with deadlines, no sleeps.

use std::path::Path;
use std::time::{Duration, Instant};

use pushonce_tests::providers::{self, Sim};
use pushonce_tests::redis::RedisServer;
use pushonce_tests::stack::{ServeConfig, ServeProcess};
use pushonce_tests::wait_until;
use serde_json::{Value, json};

const API_TOKEN: &str = "prefs-test-api-token";
const ADMIN_TOKEN: &str = "prefs-test-admin-token";

/// The bound every host of these tests runs with.
const CACHE_TTL: Duration = Duration::from_secs(1);

/// The secret that signs the hosts' one-click unsubscribe links.
const UNSUBSCRIBE_SECRET: &str = "prefs-test-unsubscribe-secret-of-40-bytes";
/// The URL the hosts' unsubscribe links are written under.
const LINK_BASE: &str = "https://push.example.com";

/// Order updates on SMS and WeChat (transactional), promotions on the app
/// (marketing), sign-in codes by SMS (security: mandatory), and a WeChat
/// notice whose fallback takes an opted-out WeChat's place.
const POLICIES: &[(&str, &str)] = &[
    (
        "order-shipped.toml",
        r#"
biz_type = "ORDER_SHIPPED"
key_policy = "per-event@^1"
channels = ["sms", "wechat"]
window = "1h"
category = "transactional"
"#,
    ),
    (
        "promo.toml",
        r#"
biz_type = "PROMO"
key_policy = "per-event@^1"
channels = ["app-push"]
window = "1h"
category = "marketing"
"#,
    ),
    (
        "login-code.toml",
        r#"
biz_type = "LOGIN_CODE"
key_policy = "per-event@^1"
channels = ["sms"]
window = "1h"
category = "security"
"#,
    ),
    (
        "alert.toml",
        r#"
biz_type = "ALERT"
key_policy = "per-event@^1"
channels = ["sms", "app-push"]
window = "1h"
category = "transactional"

[fallback]
sms = "app-push"
"app-push" = "inbox"
"#,
    ),
    (
        "tip.toml",
        r#"
biz_type = "TIP"
key_policy = "per-event@^1"
channels = ["inbox"]
window = "1h"
category = "transactional"

[caps.daily]
max = 1
per_day = true
"#,
    ),
    (
        "notice.toml",
        r#"
biz_type = "NOTICE"
key_policy = "per-event@^1"
channels = ["wechat"]
window = "1h"
category = "transactional"
fallback_when_opted_out = true

[fallback]
wechat = "inbox"
"#,
    ),
];

/// The configuration's tokens and preferences.
fn extra() -> String {
    format!(
        r#"
[auth]
api_token_env = "PREFS_API_TOKEN"
admin_token_env = "PREFS_ADMIN_TOKEN"

[preferences]
mandatory = ["security"]
cache_ttl = "{}ms"

[unsubscribe]
secret_env = "PREFS_UNSUBSCRIBE_SECRET"
base_url = "{LINK_BASE}"
"#,
        CACHE_TTL.as_millis()
    )
}

/// A host on `redis` (sharing its ledger) sending through `sim`.
async fn serve(redis: &RedisServer, sim: &Sim, dir: &Path) -> ServeProcess {
    serve_on(redis, sim, dir, &redis.ledger_url()).await
}

/// A host on `redis` and the ledger at `ledger_url`, sending through `sim`.
async fn serve_on(redis: &RedisServer, sim: &Sim, dir: &Path, ledger_url: &str) -> ServeProcess {
    let policies = dir.join("policies");
    std::fs::create_dir_all(&policies).unwrap();
    for (file, text) in POLICIES {
        std::fs::write(policies.join(file), text).unwrap();
    }
    let mut config = ServeConfig::new(&redis.url(), sim);
    config.ledger_url = Some(ledger_url.to_string());
    config.extra = extra();
    config
        .env
        .push(("PREFS_API_TOKEN".into(), API_TOKEN.into()));
    config
        .env
        .push(("PREFS_ADMIN_TOKEN".into(), ADMIN_TOKEN.into()));
    config
        .env
        .push(("PREFS_UNSUBSCRIBE_SECRET".into(), UNSUBSCRIBE_SECRET.into()));
    ServeProcess::start(&config, dir, &policies).await.unwrap()
}

/// An answer: status and JSON body.
async fn send(req: reqwest::RequestBuilder) -> (u16, Value) {
    let answer = pushonce_tests::host::Answer::of(req).await.unwrap();
    (answer.status.as_u16(), answer.body)
}

/// `method path` on `host` with `token` (and a JSON body).
async fn call(
    host: &ServeProcess,
    method: reqwest::Method,
    path: &str,
    token: Option<&str>,
    body: Option<&Value>,
) -> (u16, Value) {
    let mut req = reqwest::Client::new().request(method, host.url(path));
    if let Some(token) = token {
        req = req.bearer_auth(token);
    }
    if let Some(body) = body {
        req = req.json(body);
    }
    send(req).await
}

/// `PUT` of `user`'s preferences with the admin token; the stored view.
async fn put(host: &ServeProcess, user: &str, body: Value) -> Value {
    let path = format!("/v1/users/{user}/preferences");
    let (status, view) = call(
        host,
        reqwest::Method::PUT,
        &path,
        Some(ADMIN_TOKEN),
        Some(&body),
    )
    .await;
    assert_eq!(status, 200, "{view}");
    view
}

/// Posts an event with the API token: the status and the answer.
async fn post_answer(host: &ServeProcess, event: &Value) -> (u16, Value) {
    call(
        host,
        reqwest::Method::POST,
        "/v1/events",
        Some(API_TOKEN),
        Some(event),
    )
    .await
}

/// Posts an event; each channel's result by channel, in order.
async fn post(host: &ServeProcess, event: &Value) -> Vec<(String, Value)> {
    let (status, answer) = post_answer(host, event).await;
    assert_eq!(status, 202, "{answer}");
    answer["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["channel"].as_str().unwrap().to_string(), r.clone()))
        .collect()
}

/// The results' kinds in order: `[("sms", "accepted"), …]`.
fn kinds(results: &[(String, Value)]) -> Vec<(String, String)> {
    results
        .iter()
        .map(|(c, r)| (c.clone(), r["result"].as_str().unwrap().to_string()))
        .collect()
}

/// An order update `biz_id` for `user` on SMS (phone by `biz_id`) and WeChat.
fn order(biz_id: &str, user: &str) -> Value {
    json!({
        "biz_type": "ORDER_SHIPPED", "biz_id": biz_id, "user_id": user,
        "occurred_at": "2026-12-04T10:00:00Z",
        "params": {"order": biz_id},
        "recipients": {"sms": phone(biz_id), "wechat": format!("openid-{biz_id}")},
    })
}

/// The phone number an event `biz_id` is sent to by SMS (one per event, so
/// the provider's ledger tells the events apart).
fn phone(biz_id: &str) -> String {
    let n: u64 = biz_id
        .bytes()
        .fold(0u64, |h, b| h.wrapping_mul(31).wrapping_add(u64::from(b)));
    format!("1380{:07}", n % 10_000_000)
}

/// `pushonce_opted_out_total{channel="<channel>"}` of `host`.
async fn opted_out_count(host: &ServeProcess, channel: &str) -> u64 {
    counter(host, "pushonce_opted_out_total", channel).await
}

/// The counter `name{channel="<channel>"}` of `host` (0 when absent).
async fn counter(host: &ServeProcess, name: &str, channel: &str) -> u64 {
    let (_, text) = call(host, reqwest::Method::GET, "/metrics", None, None).await;
    let series = format!("{name}{{channel=\"{channel}\"}} ");
    text.as_str()
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(&series))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map_or(0, |v| v as u64)
}

/// An opt-out by API on host A stops the next event on that channel on host
/// B within `cache_ttl` (and on A at once); the other channel still sends,
/// nothing reaches the SMS provider for the opted-out events, the answer is
/// counted, and the event's look-up shows the opted-out channel beside its
/// WeChat task. A policy with `fallback_when_opted_out` sends its fallback
/// in the opted-out channel's place.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_opt_out_on_one_host_stops_the_next_event_on_another_within_the_bound() {
    let redis = RedisServer::start().await.unwrap();
    let sim = providers::sim().await;
    let dir = tempfile::tempdir().unwrap();
    let a = serve(&redis, &sim, &dir.path().join("a")).await;
    let b = serve(&redis, &sim, &dir.path().join("b")).await;
    let user = "u-1";
    let both = [
        ("sms".to_string(), "accepted".to_string()),
        ("wechat".to_string(), "accepted".to_string()),
    ];
    // B reads (and holds) the user's preferences: nothing switched off.
    assert_eq!(kinds(&post(&b, &order("o-before", user)).await), both);

    put(&a, user, json!({"channels_off": ["sms"]})).await;
    let changed = Instant::now();
    let opted = [
        ("sms".to_string(), "opted_out".to_string()),
        ("wechat".to_string(), "accepted".to_string()),
    ];
    // The instance that took the change sees it at once.
    let on_a = post(&a, &order("o-a", user)).await;
    assert_eq!(kinds(&on_a), opted, "{on_a:?}");
    assert_eq!(on_a[0].1["task_id"], "", "{on_a:?}");
    assert!(
        on_a[0].1["key"].as_str().unwrap().contains(":sms:"),
        "{on_a:?}"
    );

    // The other within the bound: post every 50 ms until SMS answers
    // opted_out, failing past the bound and some.
    let deadline = changed + CACHE_TTL + Duration::from_secs(3);
    let mut n = 0;
    let last_on_b = loop {
        n += 1;
        let answer = post(&b, &order(&format!("o-b-{n}"), user)).await;
        if answer[0].1["result"] == "opted_out" {
            break answer;
        }
        assert!(
            Instant::now() < deadline,
            "host B still answers {answer:?} {:?} after the change",
            changed.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let took = changed.elapsed();
    assert_eq!(kinds(&last_on_b), opted);
    // Each post is a round trip: the bound plus one post's time.
    assert!(
        took < CACHE_TTL + Duration::from_secs(1),
        "host B saw the opt-out after {took:?}, bound {CACHE_TTL:?}"
    );
    let stopped_on_b = format!("o-b-{n}");

    // WeChat sent both opted-out events; SMS neither (the one before it, yes).
    let (sim_ref, stopped) = (&sim, stopped_on_b.as_str());
    wait_until(Duration::from_secs(30), || async move {
        sim_ref.sent_to("wechat", "openid-o-a") == 1
            && sim_ref.sent_to("wechat", &format!("openid-{stopped}")) == 1
            && sim_ref.sent_to("sms", &phone("o-before")) == 1
    })
    .await
    .unwrap_or_else(|e| panic!("{e}: wechat {:?}", sim.ledger("wechat")));
    for biz_id in ["o-a", stopped_on_b.as_str()] {
        assert_eq!(sim.sent_to("sms", &phone(biz_id)), 0, "{biz_id}");
    }
    assert_eq!(opted_out_count(&a, "sms").await, 1);
    assert!(opted_out_count(&b, "sms").await >= 1);
    assert_eq!(opted_out_count(&b, "wechat").await, 0);

    // The look-up: the WeChat task and the SMS channel answered opted_out.
    let path = format!("/v1/events/ORDER_SHIPPED/o-a?user_id={user}");
    // The answer is recorded in the background: wait for it (20 ms polls).
    let deadline = Instant::now() + Duration::from_secs(10);
    let found = loop {
        let (_, found) = call(&a, reqwest::Method::GET, &path, Some(API_TOKEN), None).await;
        if found["opted_out"].as_array().is_some_and(|o| !o.is_empty()) {
            break found;
        }
        assert!(Instant::now() < deadline, "never recorded: {found}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(found["opted_out"][0]["channel"], "sms", "{found}");
    assert_eq!(found["opted_out"][0]["key"], on_a[0].1["key"], "{found}");
    let tasks: Vec<&str> = found["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["channel"].as_str().unwrap())
        .collect();
    assert_eq!(tasks, ["wechat"], "{found}");

    // An opted-out WeChat hands a NOTICE to its fallback, the inbox.
    put(&a, "u-notice", json!({"channels_off": ["wechat"]})).await;
    let notice = json!({
        "biz_type": "NOTICE", "biz_id": "n-1", "user_id": "u-notice",
        "occurred_at": "2026-12-04T10:00:00Z",
    });
    let answer = post(&a, &notice).await;
    assert_eq!(
        kinds(&answer),
        [
            ("wechat".to_string(), "opted_out".to_string()),
            ("inbox".to_string(), "accepted".to_string()),
        ],
        "{answer:?}"
    );
    wait_until(Duration::from_secs(30), || async move {
        sim_ref.sent_to("inbox", "u-notice") == 1
    })
    .await
    .unwrap();
}

/// `ms` from now as RFC 3339 text (an event's `send_at`).
fn in_ms(ms: u64) -> String {
    humantime::format_rfc3339_millis(std::time::SystemTime::now() + Duration::from_millis(ms))
        .to_string()
}

/// The task view of `id` with the API token.
async fn task(host: &ServeProcess, id: &str) -> Value {
    let path = format!("/v1/tasks/{id}");
    let (status, view) = call(host, reqwest::Method::GET, &path, Some(API_TOKEN), None).await;
    assert_eq!(status, 200, "{view}");
    view
}

/// `pushonce_opted_out_at_send_total{channel="<channel>"}` of `host`.
async fn opted_out_at_send(host: &ServeProcess, channel: &str) -> u64 {
    counter(host, "pushonce_opted_out_at_send_total", channel).await
}

/// A message accepted before its recipient switched its channel (or its
/// category) off, and sent later (`send_at`), is not sent: its task ends
/// `cancelled` saying what the recipient switched off, nothing reaches the
/// provider, the other channel still sends, and the stop is counted; a
/// policy with `fallback_when_opted_out` sends its fallback instead. Its
/// permit is released: once the recipient switches the channel back on, a
/// re-post of the event is accepted and sent once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_accepted_before_an_opt_out_is_not_sent_after_it() {
    let redis = RedisServer::start().await.unwrap();
    let sim = providers::sim().await;
    let dir = tempfile::tempdir().unwrap();
    let host = serve(&redis, &sim, dir.path()).await;
    let user = "u-later";
    // Both sent a few seconds from now: later than the bound past the accept.
    let send_at = in_ms(4_000);
    let mut later = order("o-later", user);
    later["send_at"] = json!(send_at);
    let accepted = post(&host, &later).await;
    let both = [
        ("sms".to_string(), "accepted".to_string()),
        ("wechat".to_string(), "accepted".to_string()),
    ];
    assert_eq!(kinds(&accepted), both, "{accepted:?}");
    let promo = json!({
        "biz_type": "PROMO", "biz_id": "p-later", "user_id": user,
        "occurred_at": "2026-12-04T10:00:00Z", "send_at": send_at,
        "recipients": {"app-push": "device-p-later"},
    });
    let promo_accepted = post(&host, &promo).await;
    assert_eq!(
        promo_accepted[0].1["result"], "accepted",
        "{promo_accepted:?}"
    );
    // A NOTICE hands an opted-out WeChat's place to the inbox
    // (`fallback_when_opted_out`), at its send as at an accept.
    let notice = json!({
        "biz_type": "NOTICE", "biz_id": "n-later", "user_id": "u-notice-later",
        "occurred_at": "2026-12-04T10:00:00Z", "send_at": send_at,
        "recipients": {"wechat": "openid-n-later"},
    });
    let notice_accepted = post(&host, &notice).await;
    assert_eq!(
        notice_accepted[0].1["result"], "accepted",
        "{notice_accepted:?}"
    );

    put(
        &host,
        user,
        json!({"channels_off": ["sms"], "categories_off": ["marketing"]}),
    )
    .await;
    put(&host, "u-notice-later", json!({"channels_off": ["wechat"]})).await;

    let sms_id = accepted[0].1["task_id"].as_str().unwrap().to_string();
    let push_id = promo_accepted[0].1["task_id"].as_str().unwrap().to_string();
    let (host_ref, sim_ref) = (&host, &sim);
    let (sms_ref, push_ref) = (sms_id.as_str(), push_id.as_str());
    wait_until(Duration::from_secs(30), || async move {
        task(host_ref, sms_ref).await["status"] == "cancelled"
            && task(host_ref, push_ref).await["status"] == "cancelled"
            && sim_ref.sent_to("wechat", "openid-o-later") == 1
    })
    .await
    .unwrap_or_else(|e| {
        panic!(
            "{e}: sms {:?}, wechat {:?}",
            sim.ledger("sms"),
            sim.ledger("wechat")
        )
    });
    let sms = task(&host, &sms_id).await;
    assert!(
        sms["last_error"]
            .as_str()
            .unwrap_or_default()
            .contains("the recipient switched sms off after the accept"),
        "{sms}"
    );
    let push = task(&host, &push_id).await;
    assert!(
        push["last_error"]
            .as_str()
            .unwrap_or_default()
            .contains("the recipient switched category marketing off after the accept"),
        "{push}"
    );
    assert_eq!(sim.sent_to("sms", &phone("o-later")), 0);
    assert_eq!(sim.sent_to("app-push", "device-p-later"), 0);
    let notice_id = notice_accepted[0].1["task_id"]
        .as_str()
        .unwrap()
        .to_string();
    let notice_ref = notice_id.as_str();
    wait_until(Duration::from_secs(30), || async move {
        task(host_ref, notice_ref).await["status"] == "cancelled"
            && sim_ref.sent_to("inbox", "u-notice-later") == 1
    })
    .await
    .unwrap_or_else(|e| panic!("{e}: inbox {:?}", sim.ledger("inbox")));
    let wechat = task(&host, &notice_id).await;
    assert!(
        wechat["last_error"]
            .as_str()
            .unwrap_or_default()
            .ends_with("the recipient switched wechat off after the accept; fallback to inbox"),
        "{wechat}"
    );
    assert_eq!(sim.sent_to("wechat", "openid-n-later"), 0);
    assert_eq!(opted_out_at_send(&host, "sms").await, 1);
    assert_eq!(opted_out_at_send(&host, "app-push").await, 1);
    assert_eq!(opted_out_at_send(&host, "wechat").await, 1);

    // Switched back on, a re-post is accepted on SMS (its permit was
    // released) and sent once; WeChat's stays a duplicate.
    put(&host, user, json!({})).await;
    let again = post(&host, &order("o-later", user)).await;
    assert_eq!(
        kinds(&again),
        [
            ("sms".to_string(), "accepted".to_string()),
            ("wechat".to_string(), "duplicate".to_string()),
        ],
        "{again:?}"
    );
    wait_until(Duration::from_secs(30), || async move {
        sim_ref.sent_to("sms", &phone("o-later")) == 1
    })
    .await
    .unwrap_or_else(|e| panic!("{e}: sms {:?}", sim.ledger("sms")));
    assert_eq!(sim.sent_to("wechat", "openid-o-later"), 1);
}

/// A message whose first attempt may have reached the provider (WeChat took
/// it and the answer was cut off: a resend under the same `client_msg_id`
/// is due) is not resent once its recipient switched WeChat off: the task
/// ends `cancelled`, keeps its permit (a re-post stays a duplicate), and
/// its ledger row, which the look-up answers from once it left Redis, says
/// why and that the permit was kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_opt_out_stops_the_resend_of_a_message_the_provider_may_have() {
    let redis = RedisServer::start().await.unwrap();
    let sim = providers::sim().await;
    let dir = tempfile::tempdir().unwrap();
    let host = serve(&redis, &sim, dir.path()).await;
    sim.set_faults(
        "wechat",
        provider_sim::Faults {
            drop_next: 1,
            ..provider_sim::Faults::default()
        },
    );
    let user = "u-resent";
    let accepted = post(&host, &order("o-resent", user)).await;
    let wechat_id = accepted[1].1["task_id"].as_str().unwrap().to_string();
    put(&host, user, json!({"channels_off": ["wechat"]})).await;

    let (host_ref, id) = (&host, wechat_id.as_str());
    wait_until(Duration::from_secs(30), || async move {
        let view = task(host_ref, id).await;
        view["status"] == "cancelled" && view["from_ledger"] == true
    })
    .await
    .unwrap_or_else(|e| panic!("{e}: {}", host.log()));
    let view = task(&host, &wechat_id).await;
    let why = view["last_error"].as_str().unwrap_or_default();
    assert!(
        why.contains("the recipient switched wechat off after the accept")
            && why.contains("its permit kept for the window"),
        "{view}"
    );
    // The first attempt's message is there; no second one went.
    assert_eq!(sim.sent_to("wechat", "openid-o-resent"), 1);
    assert_eq!(opted_out_at_send(&host, "wechat").await, 1);

    put(&host, user, json!({})).await;
    let again = post(&host, &order("o-resent", user)).await;
    assert_eq!(again[1].1["result"], "duplicate", "{again:?}");
}

/// A message an opt-out stopped with nothing sent gives back its room in
/// the caps that counted it at the accept, as a cancelled one does: once
/// the user switches the channel back on, the day's one tip is sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_stopped_by_an_opt_out_gives_its_room_in_a_cap_back() {
    let redis = RedisServer::start().await.unwrap();
    let sim = providers::sim().await;
    let dir = tempfile::tempdir().unwrap();
    let host = serve(&redis, &sim, dir.path()).await;
    let user = "u-tip";
    let tip = |biz_id: &str| {
        json!({
            "biz_type": "TIP", "biz_id": biz_id, "user_id": user,
            "occurred_at": "2026-12-04T10:00:00Z", "send_at": in_ms(3_000),
        })
    };
    let first = post(&host, &tip("t-1")).await;
    assert_eq!(first[0].1["result"], "accepted", "{first:?}");
    put(&host, user, json!({"channels_off": ["inbox"]})).await;
    let id = first[0].1["task_id"].as_str().unwrap().to_string();
    let (host_ref, id_ref) = (&host, id.as_str());
    wait_until(Duration::from_secs(30), || async move {
        task(host_ref, id_ref).await["status"] == "cancelled"
    })
    .await
    .unwrap();

    put(&host, user, json!({})).await;
    let second = post(&host, &tip("t-2")).await;
    assert_eq!(second[0].1["result"], "accepted", "{second:?}");
    let sim_ref = &sim;
    wait_until(Duration::from_secs(30), || async move {
        sim_ref.sent_to("inbox", user) == 1
    })
    .await
    .unwrap();
}

/// A mandatory category (`security`) is sent although the user switched it
/// and its channel off; a category that is not mandatory is not. The
/// preferences live in the ledger's database: after a Redis restart, and a
/// restart of the host (its cache gone), they are as they were.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mandatory_category_still_sends_and_a_redis_restart_loses_no_preference() {
    let mut redis = RedisServer::start().await.unwrap();
    let sim = providers::sim().await;
    let dir = tempfile::tempdir().unwrap();
    let mut host = serve(&redis, &sim, dir.path()).await;
    let user = "u-2";
    let view = put(
        &host,
        user,
        json!({"channels_off": ["sms", "app-push"], "categories_off": ["security", "marketing"]}),
    )
    .await;
    assert_eq!(view["mandatory"], json!(["security"]), "{view}");

    let code = json!({
        "biz_type": "LOGIN_CODE", "biz_id": "c-1", "user_id": user,
        "occurred_at": "2026-12-04T10:00:00Z", "params": {"code": "123456"},
        "recipients": {"sms": "13900000001"},
    });
    let promo = |biz_id: &str| {
        json!({
            "biz_type": "PROMO", "biz_id": biz_id, "user_id": user,
            "occurred_at": "2026-12-04T10:00:00Z",
            "recipients": {"app-push": format!("device-{biz_id}")},
        })
    };
    assert_eq!(
        kinds(&post(&host, &code).await),
        [("sms".to_string(), "accepted".to_string())]
    );
    assert_eq!(
        kinds(&post(&host, &promo("p-1")).await),
        [("app-push".to_string(), "opted_out".to_string())]
    );
    let sim_ref = &sim;
    // A batch answers each event alike.
    let mut code_2 = code.clone();
    code_2["biz_id"] = "c-2".into();
    let batch = json!({"events": [promo("p-b"), code_2]});
    let (status, answer) = call(
        &host,
        reqwest::Method::POST,
        "/v1/events:batch",
        Some(API_TOKEN),
        Some(&batch),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    let result = |i: usize| answer["results"][i]["accepted"]["results"][0]["result"].clone();
    assert_eq!(
        (result(0), result(1)),
        (json!("opted_out"), json!("accepted")),
        "{answer}"
    );
    wait_until(Duration::from_secs(30), || async move {
        sim_ref.sent_to("sms", "13900000001") == 2
    })
    .await
    .unwrap_or_else(|e| panic!("{e}: sms {:?}", sim.ledger("sms")));

    // An SMS that fails for good falls back past the switched-off app push
    // to the inbox.
    let refused = "13911110000";
    sim.set_faults(
        "sms",
        provider_sim::Faults {
            permanent: [(refused.to_string(), "isv.AMOUNT_NOT_ENOUGH".to_string())].into(),
            ..provider_sim::Faults::default()
        },
    );
    put(&host, "u-chain", json!({"channels_off": ["app-push"]})).await;
    let alert = json!({
        "biz_type": "ALERT", "biz_id": "a-1", "user_id": "u-chain",
        "occurred_at": "2026-12-04T10:00:00Z",
        "recipients": {"sms": refused, "app-push": "device-chain"},
    });
    assert_eq!(
        kinds(&post(&host, &alert).await),
        [
            ("sms".to_string(), "accepted".to_string()),
            ("app-push".to_string(), "opted_out".to_string()),
        ]
    );
    wait_until(Duration::from_secs(30), || async move {
        sim_ref.sent_to("inbox", "u-chain") == 1
    })
    .await
    .unwrap_or_else(|e| panic!("{e}: inbox {:?}", sim.ledger("inbox")));
    assert_eq!(sim.sent_to("app-push", "device-chain"), 0);
    assert_eq!(sim.sent_to("sms", refused), 0);

    // Redis restarts; then the host too, so nothing it held survives.
    redis.restart().await.unwrap();
    let host_ref = &host;
    wait_until(Duration::from_secs(60), || async move {
        call(host_ref, reqwest::Method::GET, "/readyz", None, None)
            .await
            .0
            == 200
    })
    .await
    .unwrap();
    let answer = post(&host, &promo("p-2")).await;
    assert_eq!(
        kinds(&answer),
        [("app-push".to_string(), "opted_out".to_string())]
    );
    host.kill9();
    host.restart().await.unwrap();
    let answer = post(&host, &promo("p-3")).await;
    assert_eq!(
        kinds(&answer),
        [("app-push".to_string(), "opted_out".to_string())]
    );
    let (status, view) = call(
        &host,
        reqwest::Method::GET,
        &format!("/v1/users/{user}/preferences"),
        Some(API_TOKEN),
        None,
    )
    .await;
    assert_eq!(status, 200, "{view}");
    assert_eq!(view["channels_off"], json!(["app-push", "sms"]), "{view}");
    assert_eq!(
        view["categories_off"],
        json!(["marketing", "security"]),
        "{view}"
    );
    assert_eq!(sim.sent_to("app-push", "device-p-1"), 0);
}

/// Every change is in the history, newest first, with its route, the token
/// kind that made it and what changed; a `DELETE` goes back to the defaults
/// and is recorded too. The API token reads but may not write (403 naming
/// the setting); no token is 401.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_history_lists_every_change_and_bad_input_is_refused_by_name() {
    let redis = RedisServer::start().await.unwrap();
    let sim = providers::sim().await;
    let dir = tempfile::tempdir().unwrap();
    let host = serve(&redis, &sim, dir.path()).await;
    let user = "u-3";
    let path = format!("/v1/users/{user}/preferences");
    let (status, fresh) = call(&host, reqwest::Method::GET, &path, Some(API_TOKEN), None).await;
    assert_eq!(status, 200, "{fresh}");
    assert_eq!(fresh["channels_off"], json!([]), "{fresh}");
    assert!(fresh.get("updated_at").is_none(), "{fresh}");

    put(
        &host,
        user,
        json!({"channels_off": ["sms"], "categories_off": ["marketing"]}),
    )
    .await;
    put(&host, user, json!({"channels_off": ["sms", "wechat"]})).await;
    let (status, cleared) = call(
        &host,
        reqwest::Method::DELETE,
        &path,
        Some(ADMIN_TOKEN),
        None,
    )
    .await;
    assert_eq!(status, 200, "{cleared}");
    assert_eq!(cleared["channels_off"], json!([]), "{cleared}");
    assert!(cleared["updated_at"].is_i64(), "{cleared}");
    let history: Vec<(String, String, String, String)> = cleared["history"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            let s = |k: &str| c[k].as_str().unwrap().to_string();
            (s("route"), s("by"), s("action"), s("what"))
        })
        .collect();
    let row = |action: &str, what: &str| {
        (
            "api".to_string(),
            "admin token".to_string(),
            action.to_string(),
            what.to_string(),
        )
    };
    assert_eq!(
        history,
        [
            row("clear", "channels off -sms -wechat"),
            row("replace", "channels off +wechat; categories off -marketing"),
            row("replace", "channels off +sms; categories off +marketing"),
        ]
    );

    // Who may.
    let put_body = json!({"channels_off": ["sms"]});
    let (status, problem) = call(
        &host,
        reqwest::Method::PUT,
        &path,
        Some(API_TOKEN),
        Some(&put_body),
    )
    .await;
    assert_eq!(status, 403, "{problem}");
    assert!(
        problem["detail"]
            .as_str()
            .unwrap()
            .contains("api_token_writes"),
        "{problem}"
    );
    let (status, _) = call(&host, reqwest::Method::GET, &path, None, None).await;
    assert_eq!(status, 401);
    let (status, _) = call(&host, reqwest::Method::GET, &path, Some("wrong"), None).await;
    assert_eq!(status, 401);

    // Bad input, each refused naming its field.
    let long = "u".repeat(129);
    for (path, body, status, field, words) in [
        (
            path.clone(),
            json!({"channels_off": ["fax"]}),
            422,
            "channels_off[0]",
            "`fax` is not a channel of this host",
        ),
        (
            path.clone(),
            json!({"categories_off": ["newsletters"]}),
            422,
            "categories_off[0]",
            "no policy in force has category `newsletters`",
        ),
        (
            path.clone(),
            json!({"categories_off": ["Marketing!"]}),
            422,
            "categories_off[0]",
            "is not a category name",
        ),
        (
            path.clone(),
            json!({"channels_off": ["sms", "sms"]}),
            422,
            "channels_off[1]",
            "listed twice",
        ),
        (
            path.clone(),
            json!({"channels": ["sms"]}),
            422,
            "channels",
            "unknown field",
        ),
        (
            path.clone(),
            json!({"channels_off": "sms"}),
            422,
            "channels_off",
            "",
        ),
        (
            format!("/v1/users/{long}/preferences"),
            json!({}),
            422,
            "user_id",
            "1 to 128 characters",
        ),
    ] {
        let (got, problem) = call(
            &host,
            reqwest::Method::PUT,
            &path,
            Some(ADMIN_TOKEN),
            Some(&body),
        )
        .await;
        assert_eq!(got, status, "{body}: {problem}");
        assert_eq!(problem["field"], field, "{body}: {problem}");
        assert!(
            problem["detail"].as_str().unwrap().contains(words),
            "{body}: {problem}"
        );
    }
    let (status, problem) = send(
        reqwest::Client::new()
            .put(host.url(&path))
            .bearer_auth(ADMIN_TOKEN)
            .header("content-type", "application/json")
            .body("{\"channels_off\": [\"sms\""),
    )
    .await;
    assert_eq!(status, 400, "{problem}");
    // Nothing of that was stored.
    let (_, after) = call(&host, reqwest::Method::GET, &path, Some(API_TOKEN), None).await;
    assert_eq!(after["history"].as_array().unwrap().len(), 3, "{after}");
    assert_eq!(after["channels_off"], json!([]), "{after}");
}

/// In a real Chromium: the console's preferences page shows what a user
/// switched off and the history of changes (when, route, by whom, what),
/// and the look-up of an event shows its opted-out channel and links to
/// the user's preferences.
mod console {
    use super::*;
    use pushonce_tests::browser::Browser;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_console_shows_a_users_preferences_their_history_and_an_opted_out_channel() {
        let redis = RedisServer::start().await.unwrap();
        let sim = providers::sim().await;
        let dir = tempfile::tempdir().unwrap();
        let host = serve(&redis, &sim, dir.path()).await;
        let user = "u-4";
        put(
            &host,
            user,
            json!({"channels_off": ["wechat"], "categories_off": ["marketing"]}),
        )
        .await;
        put(&host, user, json!({"channels_off": ["sms"]})).await;
        let answer = post(&host, &order("o-console", user)).await;
        assert_eq!(answer[0].1["result"], "opted_out", "{answer:?}");

        let browser = Browser::start().await.unwrap();
        browser
            .sign_in(host.base(), "ana", ADMIN_TOKEN)
            .await
            .unwrap();
        assert!(browser.url().await.unwrap().ends_with("/console/overview"));

        browser
            .click("a[href='/console/preferences']")
            .await
            .unwrap();
        browser.fill("#user_id", user).await.unwrap();
        browser.click("#show").await.unwrap();
        assert_eq!(browser.text_at("#channels-off").await.unwrap(), "sms");
        assert_eq!(browser.text_at("#categories-off").await.unwrap(), "none");
        let text = browser.text_at("#history").await.unwrap();
        let rows: Vec<&str> = text.lines().filter(|l| l.contains("admin token")).collect();
        assert_eq!(rows.len(), 2, "{text}");
        assert!(
            rows[0].contains("api")
                && rows[0].contains("channels off +sms -wechat; categories off -marketing"),
            "newest first: {text}"
        );
        assert!(
            rows[1].contains("channels off +wechat; categories off +marketing"),
            "{text}"
        );

        // The event's look-up: the WeChat task, and SMS answered opted_out.
        let url = format!("/console/lookup?biz_type=ORDER_SHIPPED&biz_id=o-console&user_id={user}");
        let (b, page) = (&browser, host.url(&url));
        let page = page.as_str();
        let shown = wait_until(Duration::from_secs(10), || async move {
            b.goto(page).await.unwrap();
            b.text().await.unwrap().contains("sms: opted out at")
        })
        .await;
        let text = browser.text().await.unwrap();
        shown.unwrap_or_else(|e| panic!("{e}: {text}"));
        assert!(text.contains("1 tasks"), "{text}");
        browser.click("#user-preferences").await.unwrap();
        assert!(
            browser
                .url()
                .await
                .unwrap()
                .ends_with(&format!("/console/preferences?user_id={user}"))
        );
        browser.stop().await;
    }
}

/// Two hosts sharing a PostgreSQL ledger: a change made on one is read by
/// the other, the history and the look-up's opted-out channel come from it.
mod ledger {
    use super::*;
    use pushonce_tests::postgres::PostgresServer;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn preferences_are_shared_through_a_postgresql_ledger() {
        let pg = PostgresServer::shared().await.expect("postgres starts");
        let url = pg.database().await.expect("a database");
        let redis = RedisServer::start().await.unwrap();
        let sim = providers::sim().await;
        let dir = tempfile::tempdir().unwrap();
        let a = serve_on(&redis, &sim, &dir.path().join("a"), &url).await;
        let b = serve_on(&redis, &sim, &dir.path().join("b"), &url).await;
        let user = "u-pg";
        put(
            &a,
            user,
            json!({"channels_off": ["wechat"], "categories_off": ["marketing"]}),
        )
        .await;
        put(&a, user, json!({"channels_off": ["sms"]})).await;
        // B never read this user: its first read is of the change.
        let answer = post(&b, &order("o-pg", user)).await;
        assert_eq!(
            kinds(&answer),
            [
                ("sms".to_string(), "opted_out".to_string()),
                ("wechat".to_string(), "accepted".to_string()),
            ]
        );
        let path = format!("/v1/users/{user}/preferences");
        let (status, view) = call(&b, reqwest::Method::GET, &path, Some(API_TOKEN), None).await;
        assert_eq!(status, 200, "{view}");
        let whats: Vec<&str> = view["history"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["what"].as_str().unwrap())
            .collect();
        assert_eq!(
            whats,
            [
                "channels off +sms -wechat; categories off -marketing",
                "channels off +wechat; categories off +marketing",
            ]
        );
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let (_, found) = call(
                &a,
                reqwest::Method::GET,
                "/v1/events/ORDER_SHIPPED/o-pg",
                Some(API_TOKEN),
                None,
            )
            .await;
            if found["opted_out"][0]["channel"] == "sms" {
                break;
            }
            assert!(Instant::now() < deadline, "never recorded: {found}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// Two instances storing the same opt-out at once (both took the provider's
/// push) record it once: the second waits for the first and finds nothing
/// to change.
mod race {
    use pushonce::Ledger;
    use pushonce::ledger::preferences::{ChangeRoute, Edit, Preferences};
    use pushonce_tests::postgres::PostgresServer;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_same_opt_out_stored_twice_at_once_is_one_history_row() {
        let pg = PostgresServer::shared().await.expect("postgres starts");
        let url = pg.database().await.expect("a database");
        let ledger = Ledger::open(&url).await.expect("the ledger opens");
        let off = Edit::SwitchOff(Preferences::off(&["sms"], &[]));
        for round in 0..20 {
            let user = format!("u-race-{round}");
            let store =
                || ledger.change_preferences(&user, &off, "channel sms: TD", ChangeRoute::SmsReply);
            let (a, b) = tokio::join!(store(), store());
            let changed = [a.unwrap().changed, b.unwrap().changed];
            let history = ledger.preference_history(&user, 10).await.unwrap();
            assert_eq!(history.len(), 1, "round {round}: {history:?}");
            assert_eq!(changed.iter().filter(|c| **c).count(), 1, "round {round}");
        }
    }
}

/// While the ledger's database does not answer, an event for a user whose
/// preferences were not read within `cache_ttl` is refused 503 (an unread
/// opt-out must never send), naming the preferences; an event whose
/// business type has no policy is still refused 422 for that (it reads no
/// preferences); the same event is accepted once the database is back.
mod unreadable {
    use super::*;
    use pushonce_tests::postgres::PostgresServer;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_unread_user_is_refused_503_and_an_unknown_business_type_still_422() {
        let mut pg = PostgresServer::start(false).await.expect("postgres starts");
        let url = pg.database().await.expect("a database");
        let redis = RedisServer::start().await.unwrap();
        let sim = providers::sim().await;
        let dir = tempfile::tempdir().unwrap();
        let host = serve_on(&redis, &sim, dir.path(), &url).await;
        pg.stop().unwrap();
        let event = order("o-down", "u-down");
        let (status, problem) = post_answer(&host, &event).await;
        assert_eq!(status, 503, "{problem}");
        assert!(
            problem["detail"]
                .as_str()
                .is_some_and(|d| d.contains("preferences") && d.contains("retry")),
            "{problem}"
        );
        let mut unknown = event.clone();
        unknown["biz_type"] = json!("NO_SUCH_TYPE");
        let (status, problem) = post_answer(&host, &unknown).await;
        assert_eq!(status, 422, "{problem}");
        assert!(
            problem["detail"]
                .as_str()
                .is_some_and(|d| d.contains("NO_SUCH_TYPE")),
            "{problem}"
        );
        pg.start_again().await.unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let (status, answer) = post_answer(&host, &event).await;
            if status == 202 {
                assert_eq!(
                    kinds(&post(&host, &event).await),
                    [
                        ("sms".to_string(), "duplicate".to_string()),
                        ("wechat".to_string(), "duplicate".to_string()),
                    ],
                    "accepted once, a re-post is a duplicate"
                );
                break;
            }
            assert_eq!(status, 503, "{answer}");
            assert!(Instant::now() < deadline, "still refused: {answer}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

mod one_click {
    use super::*;
    use pushonce::unsubscribe::{Target, UnsubscribeLinks};
    use std::time::SystemTime;

    const DAY: Duration = Duration::from_secs(86_400);

    /// The token of a link for `user` switching `target` off, signed with
    /// `secret` at `written`.
    fn token(secret: &str, user: &str, target: Target, written: SystemTime) -> String {
        let links = UnsubscribeLinks::new(secret.as_bytes(), LINK_BASE, 60 * DAY);
        let link = links.link(user, &target, written);
        let prefix = format!("{LINK_BASE}/v1/unsubscribe/");
        link.strip_prefix(&prefix)
            .expect("under the base URL")
            .to_string()
    }

    /// A mail system's one-click POST of `token` (no token, no cookie).
    async fn one_click(host: &ServeProcess, token: &str, body: &str) -> (u16, Value) {
        send(
            reqwest::Client::new()
                .post(host.url(&format!("/v1/unsubscribe/{token}")))
                .header("content-type", "application/x-www-form-urlencoded")
                .body(body.to_string()),
        )
        .await
    }

    async fn preferences(host: &ServeProcess, user: &str) -> Value {
        host.preferences(user, ADMIN_TOKEN).await
    }

    fn promo(biz_id: &str, user: &str) -> Value {
        json!({
            "biz_type": "PROMO", "biz_id": biz_id, "user_id": user,
            "occurred_at": "2026-12-04T10:00:00Z",
            "recipients": {"app-push": format!("device-{biz_id}")},
        })
    }

    /// A signed link opts its user out of its category at once, without a
    /// login: the next marketing event is answered `opted_out`, a
    /// transactional one still sends, and the history names the route. A
    /// `GET` of the link changes nothing; forged, altered, expired and
    /// malformed links, and a POST without RFC 8058's body, are refused by
    /// name and change nothing.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_signed_link_opts_out_its_category_and_a_forged_or_expired_one_is_refused() {
        let redis = RedisServer::start().await.unwrap();
        let sim = providers::sim().await;
        let dir = tempfile::tempdir().unwrap();
        let host = serve(&redis, &sim, dir.path()).await;
        let now = SystemTime::now();
        let marketing = || Target::Category("marketing".into());
        let good = token(UNSUBSCRIBE_SECRET, "u-click", marketing(), now);

        // Opening the link shows a button and changes nothing.
        let page = reqwest::get(host.url(&format!("/v1/unsubscribe/{good}")))
            .await
            .unwrap();
        assert_eq!(page.status().as_u16(), 200);
        let html = page.text().await.unwrap();
        assert!(
            html.contains("name=\"List-Unsubscribe\"") && html.contains("value=\"One-Click\""),
            "{html}"
        );
        assert_eq!(
            preferences(&host, "u-click").await["categories_off"],
            json!([])
        );

        // Refused links and bodies, each by name; nothing changes.
        let forged = token(
            "another-secret-of-at-least-32-bytes!!",
            "u-click",
            marketing(),
            now,
        );
        let (payload, mac) = good.rsplit_once('.').unwrap();
        let altered = format!("{}.{mac}", payload.replacen('c', "h", 1));
        let expired = token(UNSUBSCRIBE_SECRET, "u-click", marketing(), now - 61 * DAY);
        for (token, body, status, words) in [
            (
                forged.as_str(),
                "List-Unsubscribe=One-Click",
                403,
                "signature",
            ),
            (
                altered.as_str(),
                "List-Unsubscribe=One-Click",
                403,
                "signature",
            ),
            (
                expired.as_str(),
                "List-Unsubscribe=One-Click",
                410,
                "expired",
            ),
            ("not-a-link", "List-Unsubscribe=One-Click", 400, "malformed"),
            (good.as_str(), "", 400, "List-Unsubscribe=One-Click"),
        ] {
            let (got, problem) = one_click(&host, token, body).await;
            assert_eq!(got, status, "{token}: {problem}");
            assert!(
                problem["detail"]
                    .as_str()
                    .is_some_and(|d| d.contains(words)),
                "{token}: {problem}"
            );
        }
        let untouched = preferences(&host, "u-click").await;
        assert_eq!(untouched["categories_off"], json!([]), "{untouched}");
        assert_eq!(untouched["history"], json!([]), "{untouched}");
        assert_eq!(
            kinds(&post(&host, &promo("p-before", "u-click")).await)[0].1,
            "accepted"
        );

        // The one-click POST: switched off at once, recorded with its route.
        let (status, answer) = one_click(&host, &good, "List-Unsubscribe=One-Click").await;
        assert_eq!(status, 200, "{answer}");
        assert_eq!(
            answer,
            json!({"user_id": "u-click", "kind": "category", "name": "marketing"})
        );
        assert_eq!(
            kinds(&post(&host, &promo("p-after", "u-click")).await),
            [("app-push".to_string(), "opted_out".to_string())]
        );
        assert_eq!(
            kinds(&post(&host, &order("o-click", "u-click")).await),
            [
                ("sms".to_string(), "accepted".to_string()),
                ("wechat".to_string(), "accepted".to_string()),
            ],
            "a transactional event still sends"
        );
        let view = preferences(&host, "u-click").await;
        assert_eq!(view["categories_off"], json!(["marketing"]), "{view}");
        let change = &view["history"][0];
        assert_eq!(
            (&change["route"], &change["by"], &change["action"]),
            (
                &json!("unsubscribe_link"),
                &json!("unsubscribe link"),
                &json!("switch_off")
            ),
            "{view}"
        );

        // Again: the same answer, nothing else switched off.
        let (status, _) = one_click(&host, &good, "List-Unsubscribe=One-Click").await;
        assert_eq!(status, 200);
        let again = preferences(&host, "u-click").await;
        assert_eq!(again["categories_off"], json!(["marketing"]), "{again}");
        assert_eq!(again["channels_off"], json!([]), "{again}");
    }
}
