//! End to end through a real `pushonce serve` process: real Redis, the real
//! plugins, and the provider simulator as the providers. What a user checks
//! is what the providers received: the simulator's ledger; the providers'
//! receipts come back through the API and settle the tasks. Also: an edited
//! policy file is picked up by the running process and the next event uses it.

use provider_sim::{Faults, ReceiptConfig};
use pushonce_tests::redis::RedisServer;
use pushonce_tests::stack::{CALLBACK_TOKEN, ServeConfig, ServeProcess, copy_dir, simulator};
use pushonce_tests::wait_until;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

/// Starts `pushonce serve` with its data and `policies/` under `dir` (the
/// policies already written) and waits until it is ready. Returns the
/// process, its base URL and a client.
async fn serve(
    redis: &RedisServer,
    dir: &Path,
    sim_port: u16,
) -> (ServeProcess, String, reqwest::Client) {
    let config = ServeConfig::new(&redis.url(), sim_port);
    let host = ServeProcess::start(&config, dir, &dir.join("policies"))
        .await
        .unwrap();
    let base = host.base().to_string();
    (host, base, reqwest::Client::new())
}

async fn get_json(client: &reqwest::Client, url: &str) -> Option<Value> {
    client.get(url).send().await.ok()?.json().await.ok()
}

#[tokio::test]
async fn one_event_reaches_each_provider_once_and_an_edited_policy_is_used() {
    let redis = RedisServer::start().await.unwrap();
    let (sim, sim_port) = simulator().await;
    let dir = tempfile::tempdir().unwrap();
    let repo_policies = Path::new(env!("CARGO_MANIFEST_DIR")).join("../policies");
    copy_dir(&repo_policies, &dir.path().join("policies")).unwrap();
    let (host, base, client) = serve(&redis, dir.path(), sim_port).await;

    // The providers post delivery receipts to the host's receipts route at
    // once: a receipt may overtake the dispatcher's record of the send, and
    // is then answered 503 and posted again by the simulator.
    for (provider, channel) in [
        ("sms", "sms"),
        ("wechat", "wechat"),
        ("app-push", "app-push"),
    ] {
        let receipts = ReceiptConfig {
            url: format!("{base}/v1/receipts/{channel}/{}", CALLBACK_TOKEN.1),
            delay_ms: 0,
            secret: None,
            fail_after_accept: Default::default(),
        };
        assert!(sim.set_receipts(provider, Some(receipts)));
    }

    let event = json!({
        "biz_type": "ORDER_SHIPPED", "biz_id": "o-1001", "user_id": "u-42",
        "occurred_at": "2026-11-30T08:00:00Z", "template": "order_shipped",
        "params": {"order": "o-1001"},
        "recipients": {"sms": "13800000042", "wechat": "openid-42", "app-push": "device-42"}
    });
    let post = |body: Value| client.post(format!("{base}/v1/events")).json(&body).send();
    let first: Value = post(event.clone()).await.unwrap().json().await.unwrap();
    let results = first["results"]
        .as_array()
        .unwrap_or_else(|| panic!("{first}"));
    assert_eq!(results.len(), 3, "{first}");
    assert!(results.iter().all(|r| r["result"] == "accepted"), "{first}");
    let again: Value = post(event.clone()).await.unwrap().json().await.unwrap();
    assert!(
        again["results"]
            .as_array()
            .unwrap()
            .iter()
            .all(|r| r["result"] == "duplicate"),
        "{again}"
    );

    // Every task reaches `delivered` (sent, then confirmed by the provider's
    // receipt through the API), and each provider holds exactly one message.
    let task_urls: Vec<String> = results
        .iter()
        .map(|r| format!("{base}/v1/tasks/{}", r["task_id"].as_str().unwrap()))
        .collect();
    let sent = wait_until(Duration::from_secs(30), || {
        let (client, urls) = (client.clone(), task_urls.clone());
        async move {
            for url in urls {
                match get_json(&client, &url).await {
                    Some(t) if t["status"] == "delivered" => {}
                    _ => return false,
                }
            }
            true
        }
    })
    .await;
    assert!(
        sent.is_ok(),
        "tasks not delivered; simulator stats {:?}; host log:\n{}",
        sim.stats(),
        host.log()
    );
    // Each task is pinned to the channel plugin version it started with.
    let sms_task = get_json(&client, &task_urls[0]).await.unwrap();
    assert_eq!(sms_task["channel"], "sms", "{sms_task}");
    assert_eq!(sms_task["payload"]["plugin"], "sms@2.0.0", "{sms_task}");
    let ledger = sim.ledger();
    let one = |provider: &str| {
        let list = &ledger[provider];
        assert_eq!(list.len(), 1, "{provider}: {list:?}");
        list[0].clone()
    };
    let (sms, wechat, push) = (one("sms"), one("wechat"), one("app-push"));
    assert_eq!(
        (sms.recipient.as_str(), sms.template.as_str()),
        ("13800000042", "order_shipped")
    );
    assert_eq!(
        (wechat.recipient.as_str(), wechat.template.as_str()),
        ("openid-42", "order_shipped")
    );
    assert_eq!(
        (push.recipient.as_str(), push.template.as_str()),
        ("device-42", "order_shipped")
    );
    assert!(
        ledger["inbox"].is_empty(),
        "ORDER_SHIPPED has no inbox channel"
    );
    assert!(
        sms.reference.is_some(),
        "the SMS carries the idempotency reference (OutId)"
    );

    // An operator adds the inbox channel: the running host picks the file up
    // by itself, and the next event is sent on the new channel too.
    let file = dir.path().join("policies/order-shipped.toml");
    let text = std::fs::read_to_string(&file).unwrap().replace(
        r#"channels = ["sms", "wechat", "app-push"]"#,
        r#"channels = ["inbox", "sms", "wechat", "app-push"]"#,
    );
    let tmp = file.with_extension("tmp~");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, &file).unwrap();
    let reloaded = wait_until(Duration::from_secs(10), || {
        let (client, url) = (client.clone(), format!("{base}/admin/policies"));
        async move {
            get_json(&client, &url)
                .await
                .is_some_and(|p| p["generation"] == 2)
        }
    })
    .await;
    assert!(
        reloaded.is_ok(),
        "the edit was not picked up; host log:\n{}",
        host.log()
    );
    let mut next = event.clone();
    next["biz_id"] = json!("o-1002");
    let answer: Value = post(next).await.unwrap().json().await.unwrap();
    let channels: Vec<&str> = answer["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["channel"].as_str().unwrap())
        .collect();
    assert_eq!(channels, ["inbox", "sms", "wechat", "app-push"], "{answer}");
    let delivered = wait_until(Duration::from_secs(30), || {
        let sim = sim.clone();
        async move { sim.ledger()["inbox"].len() == 1 && sim.ledger()["sms"].len() == 2 }
    })
    .await;
    assert!(
        delivered.is_ok(),
        "{:?}; host log:\n{}",
        sim.ledger(),
        host.log()
    );
    assert_eq!(
        sim.ledger()["inbox"][0].recipient,
        "u-42",
        "inbox defaults to the user id"
    );
}

/// A policy for the faults test: short backoff so retries finish quickly,
/// SMS falling back to app push.
const FAULTY_POLICY: &str = r#"
biz_type = "ORDER_SHIPPED"
key_policy = "per-event@^1"
channels = ["sms", "wechat", "app-push"]
window = "1h"

[retry]
max_attempts = 12
backoff = { initial = "50ms", factor = 2.0, max = "400ms", jitter = true }

[fallback]
sms = "app-push"
"#;

#[tokio::test]
async fn under_provider_faults_every_message_arrives_once_through_a_real_host_process() {
    let redis = RedisServer::start().await.unwrap();
    let (sim, sim_port) = simulator().await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("policies")).unwrap();
    std::fs::write(
        dir.path().join("policies/order-shipped.toml"),
        FAULTY_POLICY,
    )
    .unwrap();
    let (host, base, client) = serve(&redis, dir.path(), sim_port).await;

    // 20% of sends fail retryably on every provider; 10% of SMS and app
    // pushes are accepted and then the answer is cut off; one phone is in
    // arrears (permanent: no SMS, an app push instead).
    let arrears = "13800009999";
    let faulty = |drop: f64, permanent: &[(&str, &str)]| Faults {
        fail_5xx: 0.1,
        fail_429: 0.1,
        drop_after_accept: drop,
        permanent: permanent
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        ..Faults::default()
    };
    sim.set_faults("sms", faulty(0.1, &[(arrears, "isv.AMOUNT_NOT_ENOUGH")]));
    sim.set_faults("app-push", faulty(0.1, &[]));
    sim.set_faults("wechat", faulty(0.0, &[]));

    let events = 20;
    let mut task_ids = Vec::new();
    for i in 0..events {
        if i == events / 2 {
            // The WeChat token expires mid-run: the plugin fetches a new one.
            sim.expire_tokens();
        }
        let phone = if i == 7 {
            arrears.to_string()
        } else {
            format!("1380000{i:04}")
        };
        let body = json!({
            "biz_type": "ORDER_SHIPPED", "biz_id": format!("o-{i}"), "user_id": format!("u-{i}"),
            "occurred_at": "2026-11-30T08:00:00Z", "template": "order_shipped",
            "recipients": {"sms": phone, "wechat": format!("openid-{i}"), "app-push": format!("device-{i}")}
        });
        let answer: Value = client
            .post(format!("{base}/v1/events"))
            .json(&body)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        for r in answer["results"]
            .as_array()
            .unwrap_or_else(|| panic!("{answer}"))
        {
            assert_eq!(r["result"], "accepted", "{answer}");
            task_ids.push(r["task_id"].as_str().unwrap().to_string());
        }
    }

    // Wait until every task has ended its sending: sent, or failed for good
    // (the arrears SMS) — none left queued, retrying or sending.
    let settled = wait_until(Duration::from_secs(60), || {
        let (client, base, ids) = (client.clone(), base.clone(), task_ids.clone());
        async move {
            for id in ids {
                match get_json(&client, &format!("{base}/v1/tasks/{id}")).await {
                    Some(t)
                        if ["sent", "delivered", "failed"]
                            .contains(&t["status"].as_str().unwrap_or("")) => {}
                    _ => return false,
                }
            }
            true
        }
    })
    .await;
    assert!(
        settled.is_ok(),
        "tasks not settled; stats {:?}; host log:\n{}",
        sim.stats(),
        host.log()
    );

    // At the receiving end: exactly one message per (provider, recipient).
    let ledger = sim.ledger();
    let per_recipient = |provider: &str| {
        let mut counts: BTreeMap<String, usize> = BTreeMap::new();
        for m in &ledger[provider] {
            *counts.entry(m.recipient.clone()).or_default() += 1;
        }
        counts
    };
    let (sms, wechat, push) = (
        per_recipient("sms"),
        per_recipient("wechat"),
        per_recipient("app-push"),
    );
    assert!(
        sms.values()
            .chain(wechat.values())
            .chain(push.values())
            .all(|&n| n == 1),
        "a duplicate: sms {sms:?} wechat {wechat:?} push {push:?}"
    );
    assert_eq!(
        sms.len(),
        events - 1,
        "every SMS but the arrears one: {sms:?}"
    );
    assert!(!sms.contains_key(arrears));
    assert_eq!(wechat.len(), events, "{wechat:?}");
    // One app push per event. The arrears event's fallback push derives the
    // same key as that event's own app push (the key is per event and
    // channel), so the fallback is a duplicate of it, not a second message.
    assert_eq!(push.len(), events, "{push:?}");
    let stats = sim.stats();
    let faults: u64 = [
        "sms.5xx",
        "sms.429",
        "wechat.5xx",
        "wechat.429",
        "app-push.5xx",
        "app-push.429",
    ]
    .iter()
    .map(|k| stats.get(*k).copied().unwrap_or(0))
    .sum();
    assert!(faults > 0, "faults were injected and retried: {stats:?}");
    assert!(
        stats.get("wechat.token").copied().unwrap_or(0) >= 2,
        "the token was refreshed: {stats:?}"
    );
}
