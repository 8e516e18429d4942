//! Cancelling an event through real `pushonce serve` processes, the real
//! plugins and the provider simulator: `POST /v1/events/{biz_type}/{biz_id}/cancel`
//! cancels the tasks whose first attempt has not begun (queued in the ready
//! stream of an API-only host, or held back by quiet hours) so no provider
//! ever gets them; the task view and the ledger say `cancelled`; the permit
//! stays (a re-post is `duplicate`) unless the call releases it; a task
//! already sent is `too_late`; and a cancel racing the workers has exactly
//! one winner per task (what the simulator received decides, not the answers).

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use provider_sim::Faults;
use pushonce::permit::{Layout, shard_of_task};
use pushonce_tests::providers::{self, Sim};
use pushonce_tests::redis::RedisServer;
use pushonce_tests::stack::{
    ServeConfig, ServeProcess, get_json, post_event, post_json, wait_tasks,
};
use pushonce_tests::wait_until;
use redis::AsyncCommands;
use serde_json::{Value, json};

/// SMS and inbox, one message per event and channel.
const POLICY: &str = r#"
biz_type = "CANCEL_TEST"
key_policy = "per-event@^1"
channels = ["sms", "inbox"]
window = "1h"
"#;

/// The inbox alone, for the race.
const RACE_POLICY: &str = r#"
biz_type = "CANCEL_RACE"
key_policy = "per-event@^1"
channels = ["inbox"]
window = "1h"
"#;

/// Writes the test policies into `dir/policies`, plus one whose quiet hours
/// (UTC) run from an hour before now to two hours after, so an event
/// posted now waits in the delayed set.
fn write_policies(dir: &Path) {
    let policies = dir.join("policies");
    std::fs::create_dir_all(&policies).unwrap();
    std::fs::write(policies.join("cancel-test.toml"), POLICY).unwrap();
    std::fs::write(policies.join("cancel-race.toml"), RACE_POLICY).unwrap();
    let minute = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        / 60
        % (24 * 60);
    let hhmm = |m: u64| format!("{:02}:{:02}", m / 60 % 24, m % 60);
    let quiet = format!(
        "biz_type = \"CANCEL_QUIET\"\nkey_policy = \"per-event@^1\"\nchannels = [\"inbox\"]\n\
         window = \"1h\"\ntz = \"+00:00\"\nquiet = {{ from = \"{}\", to = \"{}\" }}\n",
        hhmm(minute + 24 * 60 - 60),
        hhmm(minute + 120)
    );
    std::fs::write(policies.join("cancel-quiet.toml"), quiet).unwrap();
}

/// One host, `workers` workers, in `dir` (its data under `host/`), with
/// this file's policies written under `policies/`.
async fn serve_one(redis: &RedisServer, sim: &Sim, dir: &Path, workers: usize) -> ServeProcess {
    write_policies(dir);
    serve(
        redis,
        sim,
        &dir.join("host"),
        &dir.join("policies"),
        workers,
        "",
    )
    .await
}

/// Starts `pushonce serve` in `dir` (policies in `policies`) on `redis`,
/// sharing the server's ledger, with `workers` workers and `extra` config.
async fn serve(
    redis: &RedisServer,
    sim: &Sim,
    dir: &Path,
    policies: &Path,
    workers: usize,
    extra: &str,
) -> ServeProcess {
    let mut config = ServeConfig::new(&redis.url(), sim);
    config.ledger_url = Some(redis.ledger_url());
    config.workers = workers;
    config.extra = extra.to_string();
    ServeProcess::start(&config, dir, policies).await.unwrap()
}

/// An event of `biz_type` for user `n` (`u-<n>`, phone `1380000<n>`).
fn event(biz_type: &str, biz_id: &str, n: u32) -> Value {
    json!({
        "biz_type": biz_type, "biz_id": biz_id, "user_id": format!("u-{n}"),
        "template": "cancel_test", "params": {"n": n.to_string()},
        "recipients": {"sms": format!("1380000{n:04}")}
    })
}

/// `POST /v1/events/{biz_type}/{biz_id}/cancel` with `body` (none: no body);
/// the status and the answer.
async fn cancel(
    client: &reqwest::Client,
    base: &str,
    biz_type: &str,
    biz_id: &str,
    body: Option<Value>,
) -> (u16, Value, String) {
    let mut req = client.post(format!("{base}/v1/events/{biz_type}/{biz_id}/cancel"));
    if let Some(body) = body {
        req = req.json(&body);
    }
    let res = req.send().await.unwrap();
    let status = res.status().as_u16();
    let media = res
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    (status, res.json().await.unwrap(), media)
}

/// The `(channel, result, status, permit)` of each item of a cancel answer, sorted.
fn items(answer: &Value) -> Vec<(String, String, String, String)> {
    let mut items: Vec<_> = answer["channels"]
        .as_array()
        .unwrap_or_else(|| panic!("{answer}"))
        .iter()
        .map(|c| {
            let s = |k: &str| c[k].as_str().unwrap_or("").to_string();
            (s("channel"), s("result"), s("status"), s("permit"))
        })
        .collect();
    items.sort();
    items
}

fn item(
    channel: &str,
    result: &str,
    status: &str,
    permit: &str,
) -> (String, String, String, String) {
    (channel.into(), result.into(), status.into(), permit.into())
}

/// Messages each recipient got from `channel`'s provider.
fn received(sim: &Sim, channel: &str) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for m in sim.ledger(channel) {
        *counts.entry(m.recipient).or_default() += 1;
    }
    counts
}

/// Tasks queued on an API-only host are cancelled before any worker sees
/// them: a dispatching host started afterwards sends the other events and
/// never these; the task view (from the ledger, the task having left
/// Redis) says `cancelled`, a re-post is `duplicate`; with `release_permit`
/// the re-post is accepted and sent; an event already sent is `too_late`
/// with its status; an unknown event is a 404 `unknown_event` problem.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_tasks_cancelled_before_any_worker_never_reach_the_providers() {
    let redis = RedisServer::start().await.unwrap();
    let sim = providers::sim().await;
    let dir = tempfile::tempdir().unwrap();
    write_policies(dir.path());
    let policies = dir.path().join("policies");
    let api = serve(
        &redis,
        &sim,
        &dir.path().join("api"),
        &policies,
        4,
        "dispatch = false",
    )
    .await;
    let (base, client) = (api.base().to_string(), reqwest::Client::new());

    let cancelled_ids = post_event(&client, &base, &event("CANCEL_TEST", "c-1", 1)).await;
    let kept_ids = post_event(&client, &base, &event("CANCEL_TEST", "c-2", 2)).await;
    let released_ids = post_event(&client, &base, &event("CANCEL_TEST", "c-3", 3)).await;
    assert_eq!(
        (cancelled_ids.len(), kept_ids.len(), released_ids.len()),
        (2, 2, 2)
    );

    // Cancelled with no body: every channel, the permits kept.
    let (status, answer, _) = cancel(&client, &base, "CANCEL_TEST", "c-1", None).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(
        items(&answer),
        [
            item("inbox", "cancelled", "cancelled", "kept"),
            item("sms", "cancelled", "cancelled", "kept")
        ],
        "{answer}"
    );
    for id in &cancelled_ids {
        let view = get_json(&client, &format!("{base}/v1/tasks/{id}"))
            .await
            .unwrap();
        assert_eq!(view["status"], "cancelled", "{view}");
        assert_eq!(
            view["from_ledger"], true,
            "the ledger holds it and it left Redis: {view}"
        );
    }
    let again = post_json(&client, &base, &event("CANCEL_TEST", "c-1", 1)).await;
    assert!(
        again["results"]
            .as_array()
            .unwrap()
            .iter()
            .all(|r| r["result"] == "duplicate"),
        "the permits stay for the window: {again}"
    );
    // Cancelling again answers the same.
    let (status, answer, _) = cancel(&client, &base, "CANCEL_TEST", "c-1", None).await;
    assert_eq!(status, 200, "{answer}");
    assert!(
        items(&answer).iter().all(|i| i.1 == "cancelled"),
        "{answer}"
    );

    // One channel, the permit released: the re-post of that channel is accepted.
    let body = json!({"channel": "sms", "release_permit": true});
    let (status, answer, _) = cancel(&client, &base, "CANCEL_TEST", "c-3", Some(body)).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(
        items(&answer),
        [item("sms", "cancelled", "cancelled", "released")],
        "{answer}"
    );
    let sms_of_c3 = &answer["channels"][0]["task_id"];
    let view = get_json(
        &client,
        &format!("{base}/v1/tasks/{}", sms_of_c3.as_str().unwrap()),
    )
    .await
    .unwrap();
    assert_eq!(view["status"], "cancelled", "{view}");
    let repost = post_json(&client, &base, &event("CANCEL_TEST", "c-3", 3)).await;
    let results: BTreeMap<String, String> = repost["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["channel"].as_str().unwrap().into(),
                r["result"].as_str().unwrap().into(),
            )
        })
        .collect();
    assert_eq!(results["sms"], "accepted", "{repost}");
    assert_eq!(results["inbox"], "duplicate", "{repost}");

    // Unknown: no such event, or no task of it on that channel.
    for (biz_id, body) in [("nope", None), ("c-2", Some(json!({"channel": "wechat"})))] {
        let (status, problem, media) = cancel(&client, &base, "CANCEL_TEST", biz_id, body).await;
        assert_eq!(status, 404, "{problem}");
        assert!(media.starts_with("application/problem+json"), "{media}");
        let detail = problem["detail"].as_str().unwrap();
        assert!(detail.starts_with("unknown_event: "), "{detail}");
    }
    // A bad body names the field.
    let (status, problem, _) = cancel(
        &client,
        &base,
        "CANCEL_TEST",
        "c-2",
        Some(json!({"release": true})),
    )
    .await;
    assert_eq!(status, 422, "{problem}");
    assert!(
        problem["detail"].as_str().unwrap().contains("release"),
        "{problem}"
    );

    let metrics = client
        .get(format!("{base}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for line in [
        "pushonce_tasks_cancelled_total{channel=\"sms\"} 2",
        "pushonce_tasks_cancelled_total{channel=\"inbox\"} 1",
    ] {
        assert!(
            metrics.lines().any(|l| l == line),
            "{line} missing:\n{metrics}"
        );
    }

    // Ids within the accepted 128 characters but longer in bytes (three
    // each here) are looked up and cancelled like any other.
    let (biz_id, user) = ("订".repeat(100), "用".repeat(120));
    let mut wide = event("CANCEL_TEST", &biz_id, 9);
    wide["user_id"] = json!(user);
    let wide_ids = post_event(&client, &base, &wide).await;
    assert_eq!(wide_ids.len(), 2);
    let found = get_json(&client, &format!("{base}/v1/events/CANCEL_TEST/{biz_id}"))
        .await
        .unwrap();
    assert_eq!(found["tasks"].as_array().map(Vec::len), Some(2), "{found}");
    let body = json!({"user_id": user});
    let (status, answer, _) = cancel(&client, &base, "CANCEL_TEST", &biz_id, Some(body)).await;
    assert_eq!(status, 200, "{answer}");
    assert!(
        items(&answer).iter().all(|i| i.1 == "cancelled"),
        "{answer}"
    );

    // A dispatching host drains the ready streams: c-2 and c-3's re-posted
    // SMS and its inbox are sent, c-1 and c-3's first SMS never.
    let worker = serve(&redis, &sim, &dir.path().join("worker"), &policies, 4, "").await;
    let phone = |n: u32| format!("1380000{n:04}");
    let arrived = wait_until(Duration::from_secs(60), || {
        let sim = &sim;
        let phone = &phone;
        async move {
            let (sms, inbox) = (received(sim, "sms"), received(sim, "inbox"));
            sms.contains_key(&phone(2))
                && sms.contains_key(&phone(3))
                && inbox.contains_key("u-2")
                && inbox.contains_key("u-3")
        }
    })
    .await;
    assert!(
        arrived.is_ok(),
        "{:?}\n{}",
        sim.state.ledger(),
        worker.log()
    );
    assert!(
        wait_tasks(&client, &base, &kept_ids, 30, |t| t["status"] == "sent"
            || t["status"] == "delivered")
        .await,
        "c-2 not recorded sent"
    );
    let (sms, inbox) = (received(&sim, "sms"), received(&sim, "inbox"));
    assert_eq!(sms.get(&phone(1)), None, "cancelled SMS sent: {sms:?}");
    assert_eq!(
        inbox.get("u-1"),
        None,
        "cancelled inbox message sent: {inbox:?}"
    );
    assert_eq!(
        (sms[&phone(2)], sms[&phone(3)], inbox["u-2"], inbox["u-3"]),
        (1, 1, 1, 1)
    );
    for id in &cancelled_ids {
        let view = get_json(&client, &format!("{base}/v1/tasks/{id}"))
            .await
            .unwrap();
        assert_eq!(view["status"], "cancelled", "{view}");
    }

    // After the send: too late, with the status.
    let (status, answer, _) = cancel(&client, &base, "CANCEL_TEST", "c-2", None).await;
    assert_eq!(status, 200, "{answer}");
    for (channel, result, status, _) in items(&answer) {
        assert_eq!(result, "too_late", "{channel}: {answer}");
        assert!(
            status == "sent" || status == "delivered",
            "{channel}: {answer}"
        );
    }
}

/// A task that quiet hours hold back in the delayed set is cancelled there:
/// it leaves the set (the scheduler will not promote it), the task view and
/// the ledger say `cancelled`, a re-post is `duplicate`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_waiting_for_quiet_hours_to_end_is_cancelled_in_the_delayed_set() {
    let redis = RedisServer::start().await.unwrap();
    let sim = providers::sim().await;
    let dir = tempfile::tempdir().unwrap();
    let host = serve_one(&redis, &sim, dir.path(), 4).await;
    let (base, client) = (host.base().to_string(), reqwest::Client::new());

    let posted = post_json(&client, &base, &event("CANCEL_QUIET", "q-1", 7)).await;
    let first = &posted["results"][0];
    assert_eq!(first["result"], "accepted", "{posted}");
    assert!(
        first["scheduled_for"].as_u64().is_some(),
        "held back by quiet hours: {posted}"
    );
    let id = first["task_id"].as_str().unwrap().to_string();
    let delayed = Layout::new("po", 4).delayed(shard_of_task(&id).unwrap());
    let mut conn = redis.manager().await.unwrap();
    let due: Option<f64> = conn.zscore(&delayed, &id).await.unwrap();
    assert!(due.is_some(), "waiting in {delayed}");

    let (status, answer, _) = cancel(&client, &base, "CANCEL_QUIET", "q-1", None).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(
        items(&answer),
        [item("inbox", "cancelled", "cancelled", "kept")],
        "{answer}"
    );
    let due: Option<f64> = conn.zscore(&delayed, &id).await.unwrap();
    assert_eq!(due, None, "left {delayed}");
    let view = get_json(&client, &format!("{base}/v1/tasks/{id}"))
        .await
        .unwrap();
    assert_eq!(
        (&view["status"], &view["from_ledger"]),
        (&json!("cancelled"), &json!(true)),
        "{view}"
    );
    let again = post_json(&client, &base, &event("CANCEL_QUIET", "q-1", 7)).await;
    assert_eq!(again["results"][0]["result"], "duplicate", "{again}");
    assert!(received(&sim, "inbox").is_empty());
}

/// Cancels posted while one worker sends a backlog through a slow provider:
/// some tasks are begun, some still queued. For every event exactly one side
/// wins: `cancelled` and the provider got nothing, or `too_late` and it got
/// exactly one message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_racing_the_workers_has_exactly_one_winner_per_task() {
    const EVENTS: u32 = 40;
    let redis = RedisServer::start().await.unwrap();
    let sim = providers::sim().await;
    sim.set_faults(
        "inbox",
        Faults {
            slow_ms: 40,
            ..Faults::default()
        },
    );
    let dir = tempfile::tempdir().unwrap();
    let host = serve_one(&redis, &sim, dir.path(), 1).await;
    let (base, client) = (host.base().to_string(), reqwest::Client::new());

    for n in 0..EVENTS {
        post_event(&client, &base, &event("CANCEL_RACE", &format!("r-{n}"), n)).await;
    }
    let mut results = BTreeMap::new();
    for n in 0..EVENTS {
        let (status, answer, _) =
            cancel(&client, &base, "CANCEL_RACE", &format!("r-{n}"), None).await;
        assert_eq!(status, 200, "{answer}");
        let items = items(&answer);
        assert_eq!(items.len(), 1, "{answer}");
        let (_, result, status, _) = items[0].clone();
        match result.as_str() {
            "cancelled" => assert_eq!(status, "cancelled", "{answer}"),
            "too_late" => assert!(
                ["sending", "retry_wait", "sent", "delivered"].contains(&status.as_str()),
                "{answer}"
            ),
            other => panic!("{other}: {answer}"),
        }
        results.insert(n, result);
    }
    let late = results.values().filter(|r| *r == "too_late").count();
    // Every too-late message arrives, and a control event after them all.
    post_event(&client, &base, &event("CANCEL_RACE", "control", 9999)).await;
    let drained = wait_until(Duration::from_secs(60), || {
        let sim = &sim;
        async move {
            let inbox = received(sim, "inbox");
            inbox.contains_key("u-9999") && inbox.len() > late
        }
    })
    .await;
    assert!(
        drained.is_ok(),
        "{results:?}\n{:?}\n{}",
        received(&sim, "inbox"),
        host.log()
    );
    let inbox = received(&sim, "inbox");
    for (n, result) in &results {
        let got = inbox.get(&format!("u-{n}")).copied().unwrap_or(0);
        let want = if result == "cancelled" { 0 } else { 1 };
        assert_eq!(got, want, "event r-{n} answered {result}: {inbox:?}");
    }
    assert!(
        late > 0 && late < EVENTS as usize,
        "the cancels raced the worker on neither side ({late} of {EVENTS} too late)"
    );
}
