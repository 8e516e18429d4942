//! Opt-out by SMS reply (issue 35 item 2) through a real `pushonce serve`
//! process, real Redis, the real `aliyun-sms` plugin and the provider
//! simulator pushing Aliyun's SmsUp: a user who answers an SMS with "TD"
//! has the SMS channel switched off (durably, in the ledger, with the
//! change in their history), the next event to them on SMS is answered
//! `opted_out` and nothing reaches the provider; their other channels and
//! other users are untouched; a re-push changes nothing more; a reply that
//! is not an unsubscribe word changes nothing; a malformed SmsUp is refused
//! 400 naming the field. Conditions with deadlines, no sleeps.

use std::path::Path;
use std::time::Duration;

use pushonce_tests::providers::{self, Sim};
use pushonce_tests::redis::RedisServer;
use pushonce_tests::stack::{ServeConfig, ServeProcess};
use pushonce_tests::wait_until;
use serde_json::{Value, json};

const API_TOKEN: &str = "smsup-test-api-token";
const ADMIN_TOKEN: &str = "smsup-test-admin-token";
/// How long a condition may take.
const DEADLINE: Duration = Duration::from_secs(20);

const POLICY: &str = r#"
biz_type = "ORDER_SHIPPED"
key_policy = "per-event@^1"
channels = ["sms", "wechat"]
window = "1h"
category = "transactional"
"#;

/// How long an instance uses the preferences it read (`[preferences] cache_ttl`).
const CACHE_TTL: Duration = Duration::from_millis(500);

/// A host on `redis` (its ledger beside it) sending through `sim`, whose
/// receipts come back to it.
async fn serve(redis: &RedisServer, sim: &Sim, dir: &Path) -> ServeProcess {
    serve_on(redis, sim, dir, &redis.ledger_url()).await
}

/// A host on `redis` and the ledger at `ledger_url`, sending through `sim`,
/// whose receipts come back to it.
async fn serve_on(redis: &RedisServer, sim: &Sim, dir: &Path, ledger_url: &str) -> ServeProcess {
    let policies = dir.join("policies");
    std::fs::create_dir_all(&policies).unwrap();
    std::fs::write(policies.join("order-shipped.toml"), POLICY).unwrap();
    let mut config = ServeConfig::new(&redis.url(), sim);
    config.ledger_url = Some(ledger_url.to_string());
    config.extra = format!(
        r#"
[auth]
api_token_env = "SMSUP_API_TOKEN"
admin_token_env = "SMSUP_ADMIN_TOKEN"

[preferences]
cache_ttl = "{}ms"
"#,
        CACHE_TTL.as_millis()
    );
    config
        .env
        .push(("SMSUP_API_TOKEN".into(), API_TOKEN.into()));
    config
        .env
        .push(("SMSUP_ADMIN_TOKEN".into(), ADMIN_TOKEN.into()));
    let host = ServeProcess::start(&config, dir, &policies).await.unwrap();
    sim.send_receipts_to(host.base(), 0, &[]);
    host
}

/// An answer: status and JSON body (a string when not JSON).
async fn send(req: reqwest::RequestBuilder) -> (u16, Value) {
    let answer = pushonce_tests::host::Answer::of(req).await.unwrap();
    (answer.status.as_u16(), answer.body)
}

/// An order update `biz_id` for `user` by SMS to `phone` and by WeChat.
fn order(biz_id: &str, user: &str, phone: &str) -> Value {
    json!({
        "biz_type": "ORDER_SHIPPED", "biz_id": biz_id, "user_id": user,
        "occurred_at": "2026-12-04T10:00:00Z",
        "params": {"order": biz_id},
        "recipients": {"sms": phone, "wechat": format!("openid-{biz_id}")},
    })
}

/// Posts an event; each channel's result kind by channel, in order.
async fn post(host: &ServeProcess, event: &Value) -> Vec<(String, String)> {
    let req = reqwest::Client::new()
        .post(host.url("/v1/events"))
        .bearer_auth(API_TOKEN)
        .json(event);
    let (status, answer) = send(req).await;
    assert_eq!(status, 202, "{answer}");
    answer["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["channel"].as_str().unwrap().to_string(),
                r["result"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

/// `user`'s preferences view (`GET`, admin token).
async fn preferences(host: &ServeProcess, user: &str) -> Value {
    host.preferences(user, ADMIN_TOKEN).await
}

/// The simulator's count of `stat` (e.g. `aliyun-sms.sms_up_posted`).
fn stat(sim: &Sim, stat: &str) -> u64 {
    sim.state.stats().get(stat).copied().unwrap_or(0)
}

/// `pushonce_callback_opt_outs_total{channel="sms",result="<result>"}` of `host`.
async fn opt_outs_counted(host: &ServeProcess, result: &str) -> u64 {
    let (_, text) = send(reqwest::Client::new().get(host.url("/metrics"))).await;
    let text = text.as_str().unwrap_or_default().to_string();
    let series =
        format!("pushonce_callback_opt_outs_total{{channel=\"sms\",result=\"{result}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&series))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map_or(0, |v| v as u64)
}

/// The changes in `view`'s history made by an SMS reply.
fn sms_replies(view: &Value) -> Vec<Value> {
    pushonce_tests::stack::history_by_route(view, "sms_reply")
}

/// The issue's done-when: an SmsUp "TD" from the simulator opts the number
/// out — the next event to that user on SMS is answered `opted_out` and
/// nothing is sent — with everything around it a user would check.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_smsup_td_opts_the_number_out_and_the_next_sms_is_answered_opted_out() {
    let redis = RedisServer::start().await.unwrap();
    let sim = providers::sim().await;
    let dir = tempfile::tempdir().unwrap();
    let host = serve(&redis, &sim, dir.path()).await;
    let smsup_url = sim.callback_url(host.base(), "sms");
    // The event gives the number with +86; Aliyun's SmsUp names it by its
    // 11 digits.
    let (phone, other_phone) = ("+8613800000042", "13800000043");
    let both = |sms: &str| {
        vec![
            ("sms".to_string(), sms.to_string()),
            ("wechat".to_string(), "accepted".to_string()),
        ]
    };

    // u-1 and u-2 each get an SMS.
    assert_eq!(
        post(&host, &order("o-1", "u-1", phone)).await,
        both("accepted")
    );
    assert_eq!(
        post(&host, &order("o-2", "u-2", other_phone)).await,
        both("accepted")
    );
    wait_until(DEADLINE, || async {
        sim.sent_to("sms", phone) == 1 && sim.sent_to("sms", other_phone) == 1
    })
    .await
    .unwrap_or_else(|e| {
        let seen: Vec<String> = sim
            .ledger("sms")
            .iter()
            .map(|m| m.recipient.clone())
            .collect();
        panic!(
            "both SMS reach the provider: {e}; seen {seen:?}; log:\n{}",
            host.log()
        )
    });

    // u-1 answers " td " (trimmed, any case); Aliyun pushes SmsUp and is
    // answered {"code":0} only once the opt-out is stored.
    sim.state.push_sms_up(&smsup_url, "13800000042", " td ");
    wait_until(DEADLINE, || async {
        stat(&sim, "aliyun-sms.sms_up_posted") == 1
    })
    .await
    .unwrap_or_else(|e| panic!("SmsUp not acknowledged: {e}; {:?}", sim.state.stats()));
    assert_eq!(stat(&sim, "aliyun-sms.sms_up_retried"), 0);

    // The preferences say so, with the change in the history.
    let view = preferences(&host, "u-1").await;
    assert_eq!(view["channels_off"], json!(["sms"]), "{view}");
    let replies = sms_replies(&view);
    assert_eq!(replies.len(), 1, "{view}");
    assert_eq!(replies[0]["action"], "switch_off", "{view}");
    assert_eq!(replies[0]["what"], "channels off +sms", "{view}");
    let by = replies[0]["by"].as_str().unwrap();
    assert!(by.starts_with("channel sms: SmsUp reply \"td\""), "{by}");
    assert_eq!(opt_outs_counted(&host, "applied").await, 1);

    // The next event to u-1: SMS opted_out, WeChat still sent; nothing more
    // reaches the SMS provider for that number.
    assert_eq!(
        post(&host, &order("o-3", "u-1", phone)).await,
        both("opted_out")
    );
    wait_until(DEADLINE, || async {
        sim.sent_to("wechat", "openid-o-3") == 1
    })
    .await
    .expect("the WeChat message of o-3 is sent");
    assert_eq!(sim.sent_to("sms", phone), 1);

    // Another user's SMS still goes.
    assert_eq!(
        post(&host, &order("o-4", "u-2", other_phone)).await,
        both("accepted")
    );
    wait_until(DEADLINE, || async { sim.sent_to("sms", other_phone) == 2 })
        .await
        .expect("u-2's SMS still reaches the provider");

    // Aliyun pushing the same reply again (its re-push) changes nothing
    // more: one change in the history, counted `unchanged`.
    sim.state.push_sms_up(&smsup_url, "13800000042", "TD");
    // A reply that is no unsubscribe word, and a TD from a number never
    // sent to, are acknowledged and change nothing.
    sim.state
        .push_sms_up(&smsup_url, "13800000043", "thanks, received");
    sim.state.push_sms_up(&smsup_url, "13900000099", "退订");
    wait_until(DEADLINE, || async {
        stat(&sim, "aliyun-sms.sms_up_posted") == 4
    })
    .await
    .unwrap_or_else(|e| panic!("SmsUp not acknowledged: {e}; {:?}", sim.state.stats()));
    assert_eq!(sms_replies(&preferences(&host, "u-1").await).len(), 1);
    assert_eq!(opt_outs_counted(&host, "unchanged").await, 1);
    assert_eq!(opt_outs_counted(&host, "unmatched").await, 1);
    let u2 = preferences(&host, "u-2").await;
    assert_eq!(u2["channels_off"], json!([]), "{u2}");
    assert!(sms_replies(&u2).is_empty(), "{u2}");

    // The opt-out is durable: a host killed and started again still
    // answers opted_out.
    let mut host = host;
    host.kill9();
    host.restart().await.unwrap();
    assert_eq!(
        post(&host, &order("o-5", "u-1", phone)).await,
        both("opted_out")
    );
}

/// While the ledger's database does not answer, an SmsUp "TD" is answered
/// 503 so Aliyun pushes it again, and nothing is stored; Aliyun's next push
/// after the database is back is stored, and a second host sharing the
/// ledger, which had read the user's preferences before, answers the
/// number's next SMS `opted_out` within `cache_ttl`.
mod ledger_down {
    use super::*;
    use pushonce_tests::postgres::PostgresServer;
    use std::time::Instant;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_smsup_is_refused_503_while_the_ledger_is_down_then_stored_and_seen_by_another_host()
    {
        let mut pg = PostgresServer::start(false).await.expect("postgres starts");
        let url = pg.database().await.expect("a database");
        let redis = RedisServer::start().await.unwrap();
        let sim = providers::sim().await;
        let dir = tempfile::tempdir().unwrap();
        let a = serve_on(&redis, &sim, &dir.path().join("a"), &url).await;
        let b = serve_on(&redis, &sim, &dir.path().join("b"), &url).await;
        let smsup_url = sim.callback_url(a.base(), "sms");
        let phone = "13800000042";
        let accepted = vec![
            ("sms".to_string(), "accepted".to_string()),
            ("wechat".to_string(), "accepted".to_string()),
        ];
        // u-1 gets an SMS through A; B reads (and holds) u-1's preferences.
        assert_eq!(post(&a, &order("o-1", "u-1", phone)).await, accepted);
        assert_eq!(post(&b, &order("o-2", "u-1", phone)).await, accepted);
        wait_until(DEADLINE, || async { sim.sent_to("sms", phone) == 2 })
            .await
            .unwrap_or_else(|e| panic!("both SMS are sent: {e}; log:\n{}", a.log()));

        // The database goes away: Aliyun's push and its three re-pushes are
        // refused, and nothing is switched off.
        pg.stop().unwrap();
        sim.state.push_sms_up(&smsup_url, phone, "TD");
        wait_until(DEADLINE, || async {
            stat(&sim, "aliyun-sms.sms_up_failed") == 1
        })
        .await
        .unwrap_or_else(|e| panic!("SmsUp not given up: {e}; {:?}", sim.state.stats()));
        assert_eq!(stat(&sim, "aliyun-sms.sms_up_posted"), 0);
        assert_eq!(stat(&sim, "aliyun-sms.sms_up_retried"), 3);

        // Back: the next push is stored.
        pg.start_again().await.unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        while stat(&sim, "aliyun-sms.sms_up_posted") == 0 {
            assert!(Instant::now() < deadline, "{:?}", sim.state.stats());
            let failed = stat(&sim, "aliyun-sms.sms_up_failed");
            sim.state.push_sms_up(&smsup_url, phone, "TD");
            wait_until(DEADLINE, || async {
                stat(&sim, "aliyun-sms.sms_up_posted") == 1
                    || stat(&sim, "aliyun-sms.sms_up_failed") > failed
            })
            .await
            .expect("the push is answered");
        }
        let stored = Instant::now();
        let view = preferences(&a, "u-1").await;
        assert_eq!(view["channels_off"], json!(["sms"]), "{view}");
        assert_eq!(sms_replies(&view).len(), 1, "{view}");

        // B, which held u-1's preferences from before, sees the opt-out
        // within cache_ttl (and some slack for the posts themselves).
        let bound = stored + CACHE_TTL + Duration::from_secs(3);
        let mut n = 0;
        loop {
            n += 1;
            let answer = post(&b, &order(&format!("o-b-{n}"), "u-1", phone)).await;
            if answer[0].1 == "opted_out" {
                break;
            }
            assert!(
                Instant::now() < bound,
                "host B still answers {answer:?} {:?} after the opt-out was stored",
                stored.elapsed()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// A malformed SmsUp push is refused 400 naming the entry and the field,
/// and changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_smsup_is_refused_naming_the_field() {
    let redis = RedisServer::start().await.unwrap();
    let sim = providers::sim().await;
    let dir = tempfile::tempdir().unwrap();
    let host = serve(&redis, &sim, dir.path()).await;
    let url = sim.callback_url(host.base(), "sms");
    let body = json!([{
        "phone_number": "13800000042", "content": "TD",
        "send_time": "2026-12-04 10:00:00", "dest_code": "1234",
    }]);
    let (status, problem) = send(reqwest::Client::new().post(&url).json(&body)).await;
    assert_eq!(status, 400, "{problem}");
    let detail = problem["detail"].as_str().unwrap_or_default();
    assert!(
        detail.contains("SmsUp entry [0]: `sequence_id` is missing"),
        "{problem}"
    );
    assert_eq!(opt_outs_counted(&host, "applied").await, 0);
}

/// A channel plugin built against contract 2.0.0 (the fixture
/// `channel-2-0-0`, before 2.1's optional `callbacks` interface) loads in a
/// 2.1 host unchanged: it sends, and its callbacks are served through
/// `channel.handle-callback` (its reply, its settlement applied).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_contract_2_0_0_channel_plugin_still_sends_and_takes_callbacks() {
    use pushonce::config::{ChannelConfig, HostConfig};
    use pushonce_tests::host::{Setup, TestHost};
    use pushonce_tests::plugins::fixture;
    use reqwest::StatusCode;

    let redis = RedisServer::start().await.unwrap();
    let policy = r#"
biz_type = "OLD"
key_policy = "per-event@^1"
channels = ["old"]
window = "1h"
"#;
    let host = TestHost::start_with(
        &redis,
        Setup {
            env: [(
                "OLD_TOKEN".to_string(),
                "old-path-token-5d1c9e7a3b2f8c41".to_string(),
            )]
            .into(),
            policies: Some(vec![("old.toml".into(), policy.into())]),
            plugin_sender: true,
            extra_plugins: vec![fixture("channel_2_0_0")],
            configure: Some(Box::new(|config: &mut HostConfig| {
                config.channels.clear();
                let mut c = ChannelConfig::new("channel-2-0-0@^1");
                c.callback_token_env = Some("OLD_TOKEN".into());
                config.channels.insert("old".into(), c);
            })),
            ..Setup::default()
        },
    )
    .await
    .unwrap();
    let event = json!({
        "biz_type": "OLD", "biz_id": "old-1", "user_id": "u-1",
        "occurred_at": "2026-12-04T10:00:00Z", "template": "t",
        "recipients": {"old": "someone"},
    });
    let a = host.post("/v1/events", &event, None).await.unwrap();
    assert_eq!(a.status, StatusCode::ACCEPTED, "{}", a.body);
    let task_id = a.body["results"][0]["task_id"]
        .as_str()
        .unwrap()
        .to_string();
    let key = a.body["results"][0]["key"].as_str().unwrap().to_string();
    let path = format!("/v1/tasks/{task_id}");
    let status = || async { host.get(&path, None).await.unwrap().body["status"].clone() };
    wait_until(DEADLINE, || async { status().await == "sent" })
        .await
        .expect("the 2.0.0 plugin sends");

    let url = host.url("/v1/receipts/old/old-path-token-5d1c9e7a3b2f8c41");
    let a = host
        .send(host.client.post(&url).body(format!("delivered:{key}")))
        .await
        .unwrap();
    assert_eq!(a.status, StatusCode::OK, "{}", a.body);
    assert_eq!(a.body, "two-oh-ok");
    wait_until(DEADLINE, || async { status().await == "delivered" })
        .await
        .expect("the 2.0.0 plugin's settlement is applied");
    host.shutdown().await.unwrap();
}
