//! Digests through real `pushonce serve` processes, real Redis, the real
//! plugins and the provider simulator: the events of one key are gathered
//! into one message that carries each of them once (`digest_count`,
//! `digest_items`), a re-post is a duplicate, an event after the digest
//! began opens the next one, an append racing the begin lands in exactly
//! one digest, a host killed while events are appended loses none, and a
//! cancelled event leaves its digest. Conditions with deadlines, no sleeps.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

use pushonce_tests::providers::{self, Sim};
use pushonce_tests::redis::RedisServer;
use pushonce_tests::stack::{ServeConfig, ServeProcess};
use pushonce_tests::wait_until;
use serde_json::{Value, json};

/// Events per user per day gathered into one inbox message `window` after
/// the first, carrying at most `max_items` of them.
fn policy(window: &str, max_items: u32) -> String {
    format!(
        r#"
biz_type = "RESUME_VIEWED"
key_policy = "per-user-per-day@^1"
params = {{ tz = "+08:00" }}
channels = ["inbox"]
window = "24h"

[digest]
window = "{window}"
max_items = {max_items}
template = "RESUME_VIEWED_DIGEST"
"#
    )
}

/// A host on `redis` sending through `sim` with `policy` as its one policy file.
async fn serve(redis: &RedisServer, sim: &Sim, dir: &Path, policy: &str) -> ServeProcess {
    let policies = dir.join("policies");
    std::fs::create_dir_all(&policies).unwrap();
    std::fs::write(policies.join("resume-viewed.toml"), policy).unwrap();
    let mut config = ServeConfig::new(&redis.url(), sim);
    // Every host on one Redis claims in one ledger.
    config.ledger_url = Some(redis.ledger_url());
    ServeProcess::start(&config, dir, &policies).await.unwrap()
}

/// A resume view `biz_id` for user `u-7`.
fn view(biz_id: &str) -> Value {
    json!({
        "biz_type": "RESUME_VIEWED", "biz_id": biz_id, "user_id": "u-7",
        "occurred_at": "2026-12-04T10:00:00Z",
        "params": {"viewer": format!("recruiter of {biz_id}")},
    })
}

/// A message's parameter `name`, `null` when it has none.
fn param_of(message: &provider_sim::Accepted, name: &str) -> Value {
    match &message.params {
        Value::Object(m) => m.get(name).cloned().unwrap_or(Value::Null),
        Value::Array(pairs) => pairs
            .iter()
            .find(|p| p[0] == name)
            .map(|p| p[1].clone())
            .unwrap_or(Value::Null),
        _ => Value::Null,
    }
}

/// A message's digest: its count and the business ids of its items, in order.
fn digest_of(message: &provider_sim::Accepted) -> (u64, Vec<String>) {
    let param = |name: &str| param_of(message, name);
    let text = |v: Value| v.as_str().map(str::to_string).unwrap_or_default();
    let count = text(param("digest_count")).parse().unwrap_or_else(|_| {
        panic!("no digest_count in {:?}", message.params);
    });
    let items: Value = serde_json::from_str(&text(param("digest_items")))
        .unwrap_or_else(|e| panic!("digest_items of {:?}: {e}", message.params));
    let ids = items
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["biz_id"].as_str().unwrap().to_string())
        .collect();
    (count, ids)
}

/// Waits until the inbox provider holds messages carrying `events` items in all.
async fn wait_for_items(sim: &Sim, host: &ServeProcess, events: u64) {
    wait_until(Duration::from_secs(30), || async {
        sim.ledger("inbox")
            .iter()
            .map(|m| digest_of(m).0)
            .sum::<u64>()
            >= events
    })
    .await
    .unwrap_or_else(|e| {
        panic!(
            "{e}: the provider holds {:?}; host log:\n{}",
            sim.ledger("inbox"),
            host.log()
        )
    });
}

/// Five views of one user's resume in a day are one message, sent once,
/// when the digest's window ends: the first opens the digest (`accepted`,
/// `scheduled_for`), the others are `digested` into it, a re-post is a
/// duplicate, and the message carries the count and the first `max_items`
/// views in order. A view after the digest began opens the next digest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn views_of_a_day_are_one_message_carrying_each_once() {
    let redis = RedisServer::start().await.unwrap();
    let sim = providers::sim().await;
    let dir = tempfile::tempdir().unwrap();
    let host = serve(&redis, &sim, dir.path(), &policy("3s", 4)).await;

    let first = host.post_event(&view("v-1")).await;
    assert_eq!(first["result"], "accepted", "{first}");
    let digest = first["task_id"].as_str().unwrap().to_string();
    assert!(first["scheduled_for"].is_u64(), "{first}");
    for i in 2..=5 {
        let r = host.post_event(&view(&format!("v-{i}"))).await;
        assert_eq!(r["result"], "digested", "{r}");
        assert_eq!(r["task_id"], digest.as_str(), "{r}");
        assert_eq!(r["scheduled_for"], first["scheduled_for"], "{r}");
    }
    let again = host.post_event(&view("v-3")).await;
    assert_eq!(again["result"], "duplicate", "{again}");
    assert_eq!(again["task_id"], digest.as_str(), "{again}");
    let task = host.get(&format!("/v1/tasks/{digest}")).await.unwrap();
    assert_eq!(task.body["status"], "queued", "{}", task.body);

    wait_for_items(&sim, &host, 5).await;
    let sent = sim.ledger("inbox");
    assert_eq!(sent.len(), 1, "one message: {sent:?}");
    assert_eq!(sent[0].template, "RESUME_VIEWED_DIGEST");
    assert_eq!(sent[0].recipient, "u-7");
    assert_eq!(
        digest_of(&sent[0]),
        (
            5,
            vec!["v-1".into(), "v-2".into(), "v-3".into(), "v-4".into()]
        ),
        "the count of all five, the first four (max_items) in order"
    );

    wait_until(Duration::from_secs(10), || async {
        let v = host.get(&format!("/v1/tasks/{digest}")).await.unwrap();
        v.body["status"] == "sent" || v.body["status"] == "delivered"
    })
    .await
    .expect("the digest is recorded sent");
    let later = host.post_event(&view("v-6")).await;
    assert_eq!(later["result"], "accepted", "the next digest: {later}");
    assert_ne!(later["task_id"], digest.as_str());
    let repost = host.post_event(&view("v-2")).await;
    assert_eq!(repost["result"], "duplicate", "{repost}");
    wait_for_items(&sim, &host, 6).await;
    let sent = sim.ledger("inbox");
    assert_eq!(sent.len(), 2, "{sent:?}");
    assert_eq!(digest_of(&sent[1]), (1, vec!["v-6".into()]));
}

/// Views posted while digests come due (a 1 s window, two posters): each
/// view answered `accepted` or `digested` is in exactly one message, and
/// every message's count is its items.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_view_racing_the_digests_begin_lands_in_exactly_one_digest() {
    let redis = RedisServer::start().await.unwrap();
    let sim = providers::sim().await;
    let dir = tempfile::tempdir().unwrap();
    let host = serve(&redis, &sim, dir.path(), &policy("1s", 100)).await;

    let mut posters = Vec::new();
    for p in 0..2 {
        let client = reqwest::Client::new();
        let url = host.url("/v1/events");
        posters.push(tokio::spawn(async move {
            let mut taken = Vec::new();
            let end = tokio::time::Instant::now() + Duration::from_millis(3500);
            let mut i = 0;
            while tokio::time::Instant::now() < end {
                let id = format!("v-{p}-{i}");
                let a: Value = client
                    .post(&url)
                    .json(&view(&id))
                    .send()
                    .await
                    .unwrap()
                    .json()
                    .await
                    .unwrap();
                let r = &a["results"][0];
                assert!(
                    r["result"] == "accepted" || r["result"] == "digested",
                    "{a}"
                );
                taken.push(id);
                i += 1;
                tokio::time::sleep(Duration::from_millis(25)).await;
            }
            taken
        }));
    }
    let mut posted = BTreeSet::new();
    for p in posters {
        posted.extend(p.await.unwrap());
    }
    wait_for_items(&sim, &host, posted.len() as u64).await;

    let sent = sim.ledger("inbox");
    assert!(
        sent.len() >= 3,
        "the 1 s window gave several digests: {sent:?}"
    );
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    for m in &sent {
        let (count, ids) = digest_of(m);
        assert_eq!(count as usize, ids.len(), "{m:?}");
        for id in ids {
            *seen.entry(id).or_default() += 1;
        }
    }
    let twice: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "views in two digests: {twice:?}");
    let got: BTreeSet<String> = seen.into_keys().collect();
    assert_eq!(got, posted, "every view in one digest, none lost");
}

/// Three hosts take views of one digest concurrently; one is killed -9
/// while they post. A post that got no answer is posted again to another
/// host, as a business would. The digest is one message holding every
/// view once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn views_appended_from_three_hosts_while_one_is_killed_are_each_sent_once() {
    let redis = RedisServer::start().await.unwrap();
    let sim = providers::sim().await;
    let policy = policy("6s", 100);
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let mut hosts = Vec::new();
    for d in &dirs {
        hosts.push(serve(&redis, &sim, d.path(), &policy).await);
    }
    let urls: Vec<String> = hosts.iter().map(|h| h.url("/v1/events")).collect();
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let first = hosts[0].post_event(&view("k-0")).await;
    assert_eq!(first["result"], "accepted", "{first}");
    let digest = first["task_id"].as_str().unwrap().to_string();

    let mut posted = vec!["k-0".to_string()];
    for i in 1..=45 {
        if i == 15 {
            hosts[1].kill9();
        }
        let id = format!("k-{i}");
        let mut answer = None;
        for attempt in 0..3 {
            let url = &urls[(i + attempt) % 3];
            if let Ok(r) = client.post(url).json(&view(&id)).send().await
                && r.status() == 202
            {
                answer = Some(r.json::<Value>().await.unwrap());
                break;
            }
        }
        let a = answer.unwrap_or_else(|| panic!("no host took {id}"));
        let r = &a["results"][0];
        assert!(
            r["result"] == "digested" || r["result"] == "duplicate",
            "{a}"
        );
        assert_eq!(r["task_id"], digest.as_str(), "{a}");
        posted.push(id);
    }
    assert!(!hosts[1].is_up(), "host 1 was killed");

    wait_for_items(&sim, &hosts[0], posted.len() as u64).await;
    let sent = sim.ledger("inbox");
    assert_eq!(sent.len(), 1, "one message: {sent:?}");
    let (count, ids) = digest_of(&sent[0]);
    assert_eq!(count as usize, posted.len());
    assert_eq!(ids, posted, "every view once, in the order posted");
}

/// A view cancelled before the digest is sent leaves it: the message holds
/// the others, a retried cancel changes nothing; cancelling the only view
/// of a digest cancels the digest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_view_leaves_its_digest() {
    let redis = RedisServer::start().await.unwrap();
    let sim = providers::sim().await;
    let dir = tempfile::tempdir().unwrap();
    let host = serve(&redis, &sim, dir.path(), &policy("3s", 10)).await;
    for i in 1..=4 {
        host.post_event(&view(&format!("c-{i}"))).await;
    }
    // Each cancel sent twice, as a business retries one whose answer was
    // lost: the second changes nothing (c-2 keeps its permit, c-4 releases
    // it), and neither takes the digest's other views with it.
    for (id, body) in [("c-2", json!({})), ("c-4", json!({"release_permit": true}))] {
        for _ in 0..2 {
            host.cancel_event("RESUME_VIEWED", id, &body).await;
        }
    }
    wait_for_items(&sim, &host, 2).await;
    let sent = sim.ledger("inbox");
    assert_eq!(sent.len(), 1, "{sent:?}");
    assert_eq!(digest_of(&sent[0]), (2, vec!["c-1".into(), "c-3".into()]));

    // Another user's digest of one view, cancelled whole: never sent.
    let mut alone = view("c-9");
    alone["user_id"] = json!("u-8");
    let opened = host.post_event(&alone).await;
    assert_eq!(opened["result"], "accepted", "{opened}");
    host.cancel_event("RESUME_VIEWED", "c-9", &json!({})).await;
    let id = opened["task_id"].as_str().unwrap();
    let v = host.get(&format!("/v1/tasks/{id}")).await.unwrap();
    assert_eq!(v.body["status"], "cancelled", "{}", v.body);
}

/// A digest whose opening view was cancelled out of it carries the next
/// view's parameters as its own, not the cancelled one's: the message's
/// `viewer` is that of the first view it still holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_digest_whose_opening_view_was_cancelled_carries_the_next_views_parameters() {
    let redis = RedisServer::start().await.unwrap();
    let sim = providers::sim().await;
    let dir = tempfile::tempdir().unwrap();
    let host = serve(&redis, &sim, dir.path(), &policy("3s", 10)).await;
    for i in 1..=3 {
        host.post_event(&view(&format!("o-{i}"))).await;
    }
    host.cancel_event("RESUME_VIEWED", "o-1", &json!({})).await;
    wait_for_items(&sim, &host, 2).await;
    let sent = sim.ledger("inbox");
    assert_eq!(sent.len(), 1, "{sent:?}");
    assert_eq!(digest_of(&sent[0]), (2, vec!["o-2".into(), "o-3".into()]));
    assert_eq!(param_of(&sent[0], "viewer"), "recruiter of o-2", "{sent:?}");
}

/// A host whose policy has `after_begin = "duplicate"` and a 2 s window,
/// where view d-1 opened a digest that was then cancelled with `body`:
/// the host, the answer to d-1 and the cancel's answer.
async fn cancelled_digest(
    redis: &RedisServer,
    sim: &Sim,
    dir: &Path,
    body: Value,
) -> (ServeProcess, Value, Value) {
    let policy = format!("{}after_begin = \"duplicate\"\n", policy("2s", 10));
    let host = serve(redis, sim, dir, &policy).await;
    let opened = host.post_event(&view("d-1")).await;
    assert_eq!(opened["result"], "accepted", "{opened}");
    let cancelled = host.cancel_event("RESUME_VIEWED", "d-1", &body).await;
    (host, opened, cancelled)
}

/// With `after_begin = "duplicate"`, events after a digest began are
/// duplicates of it; a digest cancelled before it began is not such a
/// digest: the cancelled view posted again (its permit released) and a new
/// view open and join the next digest, which is sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_digest_does_not_swallow_the_views_after_it() {
    let redis = RedisServer::start().await.unwrap();
    let sim = providers::sim().await;
    let dir = tempfile::tempdir().unwrap();
    let (host, _, _) =
        cancelled_digest(&redis, &sim, dir.path(), json!({"release_permit": true})).await;

    let again = host.post_event(&view("d-1")).await;
    assert_eq!(again["result"], "accepted", "a new digest: {again}");
    let joined = host.post_event(&view("d-2")).await;
    assert_eq!(joined["result"], "digested", "{joined}");
    assert_eq!(joined["task_id"], again["task_id"], "{joined}");
    wait_for_items(&sim, &host, 2).await;
    let sent = sim.ledger("inbox");
    assert_eq!(sent.len(), 1, "{sent:?}");
    assert_eq!(digest_of(&sent[0]), (2, vec!["d-1".into(), "d-2".into()]));
}

/// The same digest cancelled whole the default way (no body: its permit
/// kept, the ledger holds the cancel and the task leaves Redis): the
/// cancelled view posted again stays a duplicate, the next views open and
/// join the next digest, which is sent; once that one began, a later view
/// is a duplicate of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_digest_cancelled_keeping_its_permit_does_not_swallow_the_views_after_it() {
    let redis = RedisServer::start().await.unwrap();
    let sim = providers::sim().await;
    let dir = tempfile::tempdir().unwrap();
    let (host, opened, cancelled) = cancelled_digest(&redis, &sim, dir.path(), json!({})).await;
    assert_eq!(cancelled["channels"][0]["permit"], "kept", "{cancelled}");

    let again = host.post_event(&view("d-1")).await;
    assert_eq!(again["result"], "duplicate", "its permit kept: {again}");
    let next = host.post_event(&view("d-2")).await;
    assert_eq!(next["result"], "accepted", "a new digest: {next}");
    assert_ne!(next["task_id"], opened["task_id"], "{next}");
    let joined = host.post_event(&view("d-3")).await;
    assert_eq!(joined["result"], "digested", "{joined}");
    assert_eq!(joined["task_id"], next["task_id"], "{joined}");
    wait_for_items(&sim, &host, 2).await;
    let sent = sim.ledger("inbox");
    assert_eq!(sent.len(), 1, "{sent:?}");
    assert_eq!(digest_of(&sent[0]), (2, vec!["d-2".into(), "d-3".into()]));

    let after = host.post_event(&view("d-4")).await;
    assert_eq!(after["result"], "duplicate", "the digest began: {after}");
    assert_eq!(after["task_id"], next["task_id"], "{after}");
}

/// The console shows a digest task's events and cancels it before it is
/// sent: an operator signs in, opens the digest from the look-up of one of
/// its later events, sees the three views in the order they joined, and
/// cancels it; the task is `cancelled` and never reaches the provider.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_sees_a_digests_events_and_cancels_it_in_the_console() {
    let redis = RedisServer::start().await.unwrap();
    let sim = providers::sim().await;
    let dir = tempfile::tempdir().unwrap();
    let policies = dir.path().join("policies");
    std::fs::create_dir_all(&policies).unwrap();
    std::fs::write(policies.join("resume-viewed.toml"), policy("1h", 10)).unwrap();
    let mut config = ServeConfig::new(&redis.url(), &sim);
    config.extra = "[auth]\nadmin_token_env = \"DIGEST_ADMIN_TOKEN\"\n".into();
    config
        .env
        .push(("DIGEST_ADMIN_TOKEN".into(), "digest-admin-token".into()));
    let host = ServeProcess::start(&config, dir.path(), &policies)
        .await
        .unwrap();
    let first = host.post_event(&view("d-1")).await;
    let digest = first["task_id"].as_str().unwrap().to_string();
    for id in ["d-2", "d-3"] {
        assert_eq!(host.post_event(&view(id)).await["result"], "digested");
    }
    let looked_up = host.get("/v1/events/RESUME_VIEWED/d-3").await.unwrap();
    assert_eq!(
        looked_up.body["tasks"][0]["id"],
        digest.as_str(),
        "a later event's look-up names the digest: {}",
        looked_up.body
    );
    assert_eq!(
        looked_up.body["tasks"][0]["digest"]["count"], 3,
        "{}",
        looked_up.body
    );

    let browser = pushonce_tests::browser::Browser::start().await.unwrap();
    browser
        .sign_in(host.base(), "ana", "digest-admin-token")
        .await
        .unwrap();
    browser
        .goto(&host.url(&format!("/console/tasks/{digest}")))
        .await
        .unwrap();
    let items = browser.text_at("table.digest-items").await.unwrap();
    let at = |id: &str| {
        items
            .find(id)
            .unwrap_or_else(|| panic!("{id} listed: {items}"))
    };
    assert!(at("d-1") < at("d-2") && at("d-2") < at("d-3"), "{items}");
    assert!(items.contains("recruiter of d-2"), "{items}");
    browser.click("button.cancel").await.unwrap();
    assert!(browser.url().await.unwrap().contains("done=cancelled"));
    let status = browser.text_at("dd.status").await.unwrap();
    assert_eq!(status, "cancelled");
    browser.stop().await;
    let v = host.get(&format!("/v1/tasks/{digest}")).await.unwrap();
    assert_eq!(v.body["status"], "cancelled", "{}", v.body);
    assert!(sim.ledger("inbox").is_empty(), "nothing sent");
}
