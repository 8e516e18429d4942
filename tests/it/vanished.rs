//! A worker that vanished mid-attempt, through real `pushonce serve`
//! processes, the real FCM plugin (which can neither query nor deduplicate:
//! such a task is held) and the provider simulator. The delivery ledger
//! decides: a send never happens without its claim, so a task whose vanished
//! worker never claimed its key was never sent and is sent now; one whose
//! worker claimed it (and so may have sent) stays held as
//! `worker_vanished`.

use std::path::Path;
use std::time::Duration;

use pushonce::ledger::{Claim, ClaimAnswer, Ledger, recipient_digest};
use pushonce::permit::{Begin, PermitConfig};
use pushonce_tests::providers;
use pushonce_tests::redis::RedisServer;
use pushonce_tests::stack::{ServeConfig, ServeProcess, copy_dir};
use pushonce_tests::wait_until;
use serde_json::{Value, json};

/// Posts an ORDER_SHIPPED event for `user` and returns its app-push task id.
async fn post_push(client: &reqwest::Client, base: &str, user: &str) -> String {
    let event = json!({
        "biz_type": "ORDER_SHIPPED", "biz_id": format!("o-{user}"), "user_id": user,
        "occurred_at": "2026-11-30T08:00:00Z", "template": "order_shipped",
        "params": {"order": "o-1"},
        "recipients": {"sms": format!("1380000{user}"), "wechat": format!("openid-{user}"), "app-push": format!("device-{user}")}
    });
    let answer: Value = client
        .post(format!("{base}/v1/events"))
        .json(&event)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let push = answer["results"]
        .as_array()
        .unwrap_or_else(|| panic!("{answer}"))
        .iter()
        .find(|r| r["channel"] == "app-push")
        .unwrap_or_else(|| panic!("no app-push result: {answer}"));
    assert_eq!(push["result"], "accepted", "{answer}");
    push["task_id"].as_str().unwrap().to_string()
}

async fn task(client: &reqwest::Client, base: &str, id: &str) -> Value {
    let url = format!("{base}/v1/tasks/{id}");
    client.get(url).send().await.unwrap().json().await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vanished_worker_that_never_claimed_the_key_is_resent_one_that_did_is_held() {
    let redis = RedisServer::start().await.unwrap();
    let sim = providers::sim().await;
    let dir = tempfile::tempdir().unwrap();
    let policies = dir.path().join("policies");
    copy_dir(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("../policies"),
        &policies,
    )
    .unwrap();
    let ledger_url = format!("sqlite:{}", dir.path().join("ledger.sqlite3").display());
    let mut config = ServeConfig::new(&redis.url(), &sim);
    config.ledger_url = Some(ledger_url.clone());
    config.extra = "dispatch = false\n".into();
    let api = ServeProcess::start(&config, &dir.path().join("api"), &policies)
        .await
        .unwrap();
    let (client, base) = (reqwest::Client::new(), api.base().to_string());
    let never_claimed = post_push(&client, &base, "1").await;
    let claimed = post_push(&client, &base, "2").await;

    // A worker begins both attempts and vanishes: before its claim for the
    // first, after its claim (before its send) for the second.
    let permits = redis
        .permits(PermitConfig {
            shards: config.shards,
            ..PermitConfig::default()
        })
        .await
        .unwrap();
    let ledger = Ledger::open(&ledger_url).await.unwrap();
    for (id, claims) in [(&never_claimed, false), (&claimed, true)] {
        let key = permits.task(id).await.unwrap().unwrap().key;
        let Begin::Begun(attempt) = permits
            .begin_attempt(id, Duration::from_secs(1))
            .await
            .unwrap()
        else {
            panic!("{id} did not begin");
        };
        if claims {
            let claim = Claim {
                key: key.clone(),
                task_id: id.clone(),
                channel: "app-push".into(),
                policy: "per-event@1".into(),
                recipient_digest: recipient_digest("2"),
                biz_type: "ORDER_SHIPPED".into(),
                biz_id: "o-2".into(),
                attempt: attempt.number,
                now_ms: pushonce::ledger::now_ms(),
                window_ends_ms: pushonce::ledger::now_ms() + 3_600_000,
                accepted_ms: pushonce::ledger::now_ms(),
            };
            assert_eq!(
                ledger.claim(&claim).await.unwrap(),
                ClaimAnswer::Ours { first: true }
            );
        }
    }

    // A dispatching instance re-claims both after the vanished lease.
    config.extra = "dispatch = true\n".into();
    let worker = ServeProcess::start(&config, &dir.path().join("worker"), &policies)
        .await
        .unwrap();
    let settled = wait_until(Duration::from_secs(60), || {
        let (client, base) = (client.clone(), base.clone());
        let (a, b) = (never_claimed.clone(), claimed.clone());
        async move {
            task(&client, &base, &a).await["status"] == "sent"
                && task(&client, &base, &b).await["status"] == "unknown"
        }
    })
    .await;
    assert!(
        settled.is_ok(),
        "{}\n{}\nworker log:\n{}",
        task(&client, &base, &never_claimed).await,
        task(&client, &base, &claimed).await,
        worker.log()
    );
    let pushes: Vec<String> = sim
        .ledger("app-push")
        .into_iter()
        .map(|m| m.recipient)
        .collect();
    assert_eq!(
        pushes,
        vec!["device-1".to_string()],
        "FCM got the never-claimed task's message once, and nothing of the claimed one"
    );
    let held = task(&client, &base, &claimed).await;
    assert_eq!(held["held_cause"]["kind"], "worker_vanished", "{held}");
    assert_eq!(held["held_cause"]["request_started"], false, "{held}");
}
