//! The host against a real Redis Cluster (three masters from `redis-server`,
//! joined with `redis-cli --cluster create`): the permit scripts, batches
//! that span every shard, the dispatcher (which reads shard by shard on a
//! cluster), the HTTP API, and a master restarted mid-run.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::time::Duration;

use pushonce::permit::{AcceptRequest, Acceptance, PermitConfig, Permits, RetryPolicy, TaskStatus};
use pushonce::send::Faults;
use pushonce_tests::cluster::RedisCluster;
use pushonce_tests::dispatcher::RunningDispatcher;
use pushonce_tests::fixtures::{accept_request, permit_config};
use pushonce_tests::host::{Backend, Setup, TestHost, order_shipped};
use pushonce_tests::plugins::fixture;
use pushonce_tests::process::{PushonceProcess, read_ledger, sent_by_key};
use pushonce_tests::wait_until;
use reqwest::StatusCode;

fn request(key: &str, biz_id: &str) -> AcceptRequest {
    AcceptRequest {
        biz_type: "ORDER".into(),
        biz_id: biz_id.into(),
        retry: RetryPolicy {
            max_attempts: 5,
            initial: Duration::from_millis(100),
            factor: 2.0,
            max_delay: Duration::from_secs(2),
            jitter: true,
        },
        ..accept_request(key)
    }
}

/// At least `n` keys named `<prefix>-<i>`, as many more as it takes for them
/// to fall in every shard.
fn keys_over_every_shard(permits: &Permits, prefix: &str, n: usize) -> Vec<String> {
    let mut keys = Vec::new();
    let mut shards = HashSet::new();
    while keys.len() < n || shards.len() < usize::from(permits.layout().shards()) {
        let key = format!("{prefix}-{}", keys.len());
        shards.insert(permits.layout().shard_of(&key));
        keys.push(key);
    }
    keys
}

/// A dispatcher on the cluster with 8 workers, sending to the ledger `ledger`.
async fn dispatcher(cluster: &RedisCluster, ledger: &Path, lease: Duration) -> RunningDispatcher {
    let permits = cluster.permits(permit_config()).await.unwrap();
    RunningDispatcher::start(
        cluster.client(),
        permits,
        ledger,
        Faults::default(),
        8,
        lease,
    )
}

/// Waits until every key of `keys` was sent (ledger), then checks that each
/// was sent exactly once and that nothing else was.
async fn assert_each_sent_once(ledger: &Path, keys: &[String], within: Duration) {
    let want: HashSet<&String> = keys.iter().collect();
    let done = wait_until(within, || {
        let sent = sent_by_key(&read_ledger(ledger));
        let all = want.iter().all(|k| sent.contains_key(*k));
        async move { all }
    })
    .await;
    let sent = sent_by_key(&read_ledger(ledger));
    let missing: Vec<&&String> = want.iter().filter(|k| !sent.contains_key(**k)).collect();
    assert!(
        done.is_ok(),
        "{} of {} keys never sent, e.g. {:?}",
        missing.len(),
        keys.len(),
        missing.iter().take(3).collect::<Vec<_>>()
    );
    let twice: Vec<(&String, usize)> = sent
        .iter()
        .filter(|(_, lines)| lines.len() > 1)
        .map(|(k, lines)| (k, lines.len()))
        .collect();
    assert!(twice.is_empty(), "sent more than once: {twice:?}");
    assert_eq!(sent.len(), keys.len(), "only the accepted keys were sent");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_over_every_shard_and_cross_shard_reads_work() {
    let cluster = RedisCluster::start(3).await.unwrap();
    let permits = cluster.permits(permit_config()).await.unwrap();
    // One event's channels spread over every shard (and so every master).
    let keys = keys_over_every_shard(&permits, "batch", 64);
    let reqs: Vec<AcceptRequest> = keys.iter().map(|k| request(k, "o-batch")).collect();
    let corpus = pushonce::corpus::corpus_commands("po", "{\"biz_type\":\"ORDER\"}");
    let first = permits.accept_batch_with(&reqs, &corpus).await.unwrap();
    assert_eq!(first.len(), keys.len());
    assert!(
        first
            .iter()
            .all(|a| matches!(a, Acceptance::Accepted { .. })),
        "{first:?}"
    );
    // Answers keep the order of the requests: each names a task of its key's shard.
    for (key, a) in keys.iter().zip(&first) {
        assert_eq!(
            pushonce::permit::shard_of_task(a.task_id()),
            Some(permits.layout().shard_of(key))
        );
    }
    let again = permits.accept_batch(&reqs).await.unwrap();
    for (a, b) in again.iter().zip(&first) {
        match a {
            Acceptance::Duplicate { task_id, status } => {
                assert_eq!(task_id, b.task_id());
                assert_eq!(*status, Some(TaskStatus::Queued));
            }
            other => panic!("expected a duplicate, got {other:?}"),
        }
    }
    // Reads that visit every shard.
    let mut of_event = permits.tasks_of_event("ORDER", "o-batch").await.unwrap();
    of_event.sort();
    let mut ids: Vec<String> = first.iter().map(|a| a.task_id().to_string()).collect();
    ids.sort();
    assert_eq!(of_event, ids);
    assert_eq!(permits.retry_queue_depth().await.unwrap(), 0);
    assert_eq!(permits.dead_count().await.unwrap(), 0);
    assert!(permits.dead_tasks(10).await.unwrap().is_empty());
    let mut conn = permits.connection();
    let corpus: usize = redis::cmd("LLEN")
        .arg(pushonce::corpus::corpus_key("po"))
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(corpus, 1, "the corpus sample went with the batch");

    // Bloom mode: each shard's filters share the shard's hash tag with its
    // tasks, so the bits and the enqueue run in one script on a cluster too.
    let bloom: Vec<AcceptRequest> = keys_over_every_shard(&permits, "bloom", 64)
        .iter()
        .map(|k| AcceptRequest {
            gate: pushonce::permit::Gate {
                bloom: Some(pushonce::permit::BloomCheck {
                    filter: "ORDER:sms".into(),
                    items: 10_000,
                    false_positive: 0.001,
                }),
                ..Default::default()
            },
            ..request(k, "o-bloom")
        })
        .collect();
    let first = permits.accept_batch(&bloom).await.unwrap();
    assert!(
        first
            .iter()
            .all(|a| matches!(a, Acceptance::Accepted { .. })),
        "{first:?}"
    );
    let again = permits.accept_batch(&bloom).await.unwrap();
    assert!(
        again
            .iter()
            .all(|a| matches!(a, Acceptance::Duplicate { .. })),
        "{again:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dispatcher_sends_every_shards_tasks_exactly_once() {
    let cluster = RedisCluster::start(3).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let ledger = dir.path().join("ledger.jsonl");
    let permits = cluster.permits(permit_config()).await.unwrap();
    let keys = keys_over_every_shard(&permits, "dispatch", 200);
    // Half before the dispatcher starts, half while it runs.
    let (before, during) = keys.split_at(100);
    let reqs: Vec<AcceptRequest> = before.iter().map(|k| request(k, "o-d")).collect();
    permits.accept_batch(&reqs).await.unwrap();
    let run = dispatcher(&cluster, &ledger, Duration::from_secs(5)).await;
    for chunk in during.chunks(10) {
        let reqs: Vec<AcceptRequest> = chunk.iter().map(|k| request(k, "o-d")).collect();
        permits.accept_batch(&reqs).await.unwrap();
    }
    assert_each_sent_once(&ledger, &keys, Duration::from_secs(60)).await;
    run.stop().await;
    let ids = permits.tasks_of_event("ORDER", "o-d").await.unwrap();
    assert_eq!(ids.len(), keys.len());
    for id in ids {
        let task = permits.task(&id).await.unwrap().unwrap();
        assert_eq!(task.status, TaskStatus::Sent, "{id}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn masters_restarted_or_killed_mid_run_lose_nothing() {
    let mut cluster = RedisCluster::start(3).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let ledger = dir.path().join("ledger.jsonl");
    let permits = cluster.permits(permit_config()).await.unwrap();
    let keys = keys_over_every_shard(&permits, "restart", 300);
    // A lease longer than the restart: an attempt in flight records after it.
    let run = dispatcher(&cluster, &ledger, Duration::from_secs(10)).await;
    let accepting = {
        let permits = permits.clone();
        let keys = keys.clone();
        tokio::spawn(async move {
            let (mut ids, mut refused) = (HashMap::new(), 0);
            for chunk in keys.chunks(5) {
                let reqs: Vec<AcceptRequest> = chunk.iter().map(|k| request(k, "o-r")).collect();
                // A batch refused while a master restarts is sent again (same
                // answer for what was already taken: safe to retry).
                let answers = loop {
                    match permits.accept_batch(&reqs).await {
                        Ok(a) => break a,
                        Err(_) => {
                            refused += 1;
                            tokio::time::sleep(Duration::from_millis(50)).await
                        }
                    }
                };
                for (k, a) in chunk.iter().zip(answers) {
                    ids.entry(k.clone()).or_insert(a.task_id().to_string());
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            (ids, refused)
        })
    };
    // Restart a master once part of the tasks was sent.
    wait_until(Duration::from_secs(30), || {
        let n = read_ledger(&ledger).len();
        async move { n >= 50 }
    })
    .await
    .unwrap();
    let restarting = std::time::Instant::now();
    cluster.restart_node(1).await.unwrap();
    eprintln!("master 1 restarted in {:?}", restarting.elapsed());
    // Then another master is killed (SIGKILL) and started again: with
    // `appendfsync always` nothing it acknowledged is lost either.
    let killing = std::time::Instant::now();
    cluster.kill_node(2);
    cluster.start_node(2).await.unwrap();
    eprintln!("master 2 killed and back in {:?}", killing.elapsed());
    let accepting_done = accepting.is_finished();
    let (ids, refused) = accepting.await.unwrap();
    eprintln!(
        "accept batches refused during the restarts and sent again: {refused}; \
         accepting was still running after them: {}",
        !accepting_done
    );
    assert_eq!(ids.len(), keys.len());
    assert_each_sent_once(&ledger, &keys, Duration::from_secs(90)).await;
    run.stop().await;
    // Every permit survived the restart: the same keys again are duplicates
    // of the very tasks that were sent.
    let reqs: Vec<AcceptRequest> = keys.iter().map(|k| request(k, "o-r")).collect();
    let again = permits.accept_batch(&reqs).await.unwrap();
    for (k, a) in keys.iter().zip(again) {
        match a {
            Acceptance::Duplicate { task_id, status } => {
                assert_eq!(&task_id, &ids[k], "{k}");
                assert_eq!(status, Some(TaskStatus::Sent), "{k}");
            }
            other => panic!("{k}: expected a duplicate after the restart, got {other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_http_api_on_a_cluster_accepts_and_delivers() {
    let cluster = RedisCluster::start(3).await.unwrap();
    let host = TestHost::start_on(Backend::Cluster(&cluster), Setup::default())
        .await
        .unwrap();
    let mut ids = Vec::new();
    for i in 0..10 {
        let a = host
            .post("/v1/events", &order_shipped(&format!("o-{i}")), None)
            .await
            .unwrap();
        assert_eq!(a.status, StatusCode::ACCEPTED, "{}", a.body);
        for r in a.body["results"].as_array().unwrap() {
            assert_eq!(r["result"], "accepted", "{}", a.body);
            ids.push(r["task_id"].as_str().unwrap().to_string());
        }
    }
    assert_eq!(ids.len(), 30, "three channels per event");
    // Layout 2: the per-event keys name user u-42, so every channel of every
    // event lands in the recipient's shard (one hash slot, one master).
    // (`TestHost` runs 4 shards.)
    let layout = pushonce::permit::Layout::new("po", 4);
    let shard = layout.recipient_shard("u-42");
    for id in &ids {
        assert_eq!(pushonce::permit::shard_of_task(id), Some(shard), "{id}");
    }
    let again = host
        .post("/v1/events", &order_shipped("o-3"), None)
        .await
        .unwrap();
    assert!(
        again.body["results"]
            .as_array()
            .unwrap()
            .iter()
            .all(|r| r["result"] == "duplicate"),
        "{}",
        again.body
    );
    let event = host
        .get("/v1/events/ORDER_SHIPPED/o-3?user_id=u-42", None)
        .await
        .unwrap();
    assert_eq!(event.status, StatusCode::OK, "{}", event.body);
    assert_eq!(event.body["tasks"].as_array().unwrap().len(), 3);
    // Every task is sent once through the development ledger.
    let ledger = host.ledger();
    wait_until(Duration::from_secs(60), || {
        let sent = read_ledger(&ledger)
            .into_iter()
            .filter(|l| l.outcome == "sent")
            .count();
        async move { sent >= 30 }
    })
    .await
    .unwrap();
    let lines = read_ledger(&ledger);
    let sent: HashSet<&str> = lines
        .iter()
        .filter(|l| l.outcome == "sent")
        .map(|l| l.task_id.as_str())
        .collect();
    assert_eq!(sent.len(), 30);
    assert!(ids.iter().all(|id| sent.contains(id.as_str())));
    let ready = host.get("/readyz", None).await.unwrap();
    assert_eq!(ready.status, StatusCode::OK, "{}", ready.body);
    host.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_serve_process_runs_on_the_cluster_named_by_its_environment() {
    let cluster = RedisCluster::start(3).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let port = pushonce::store::free_loopback_port().unwrap();
    let listen = format!("127.0.0.1:{port}");
    let urls = cluster.urls_env();
    // The repository's configuration (a copy in the temporary directory, so
    // the process's log lands there), every location and the cluster given
    // by the environment, as a deployment (or a chaos harness) would.
    let mut host = PushonceProcess::serve_repository_config(
        dir.path(),
        &listen,
        "",
        &[("PUSHONCE_REDIS_CLUSTER", urls.as_str())],
    )
    .unwrap();
    let base = format!("http://{listen}");
    host.wait_ready(&base, Duration::from_secs(30))
        .await
        .unwrap();
    let client = reqwest::Client::new();
    let post = || {
        client
            .post(format!("{base}/v1/events"))
            .json(&order_shipped("o-serve"))
            .send()
    };
    let first: serde_json::Value = post().await.unwrap().json().await.unwrap();
    let again: serde_json::Value = post().await.unwrap().json().await.unwrap();
    let results = |v: &serde_json::Value| -> Vec<String> {
        v["results"]
            .as_array()
            .unwrap_or_else(|| panic!("{v}"))
            .iter()
            .map(|r| r["result"].as_str().unwrap_or_default().to_string())
            .collect()
    };
    assert_eq!(results(&first), ["accepted"; 3], "{first}");
    assert_eq!(results(&again), ["duplicate"; 3], "{again}");
    // The tasks are in the cluster, one index part per shard.
    let permits = cluster
        .permits(PermitConfig {
            shards: 16,
            ..permit_config()
        })
        .await
        .unwrap();
    let ids = permits
        .tasks_of_event("ORDER_SHIPPED", "o-serve")
        .await
        .unwrap();
    assert_eq!(ids.len(), 3, "{ids:?}");
    let status = host.terminate(Duration::from_secs(30)).await.unwrap();
    assert!(status.success(), "{status}; log:\n{}", host.log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_worker_processes_share_the_cluster_and_send_each_task_once() {
    let cluster = RedisCluster::start(3).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let ledger = dir.path().join("ledger.jsonl");
    let permits = cluster.permits(permit_config()).await.unwrap();
    let keys = keys_over_every_shard(&permits, "procs", 120);
    let urls = cluster.urls_env();
    let args = ["--workers", "4", "--lease", "5s", "--block", "200ms"];
    let mut workers = [
        PushonceProcess::spawn_cluster(&urls, &ledger, &args).unwrap(),
        PushonceProcess::spawn_cluster(&urls, &ledger, &args).unwrap(),
    ];
    for chunk in keys.chunks(12) {
        let reqs: Vec<AcceptRequest> = chunk.iter().map(|k| request(k, "o-p")).collect();
        permits.accept_batch(&reqs).await.unwrap();
    }
    assert_each_sent_once(&ledger, &keys, Duration::from_secs(60)).await;
    let pids: HashSet<u32> = read_ledger(&ledger).iter().map(|l| l.pid).collect();
    eprintln!("sending processes: {pids:?}");
    for w in &mut workers {
        let status = w.terminate(Duration::from_secs(20)).await.unwrap();
        assert!(status.success(), "{status}; log:\n{}", w.log());
    }
}

/// A capped policy (2 per user and hour) on the cluster's layout 2 key
/// names. `per-event` keys name their recipient; the `stable` test policy
/// writes the user id unencoded, so for a user whose id `key_util::part`
/// escapes its key names nobody.
fn cluster_policies(quiet_from: &str, quiet_to: &str) -> Vec<(String, String)> {
    vec![
        (
            "promo.toml".into(),
            r#"
biz_type = "PROMO"
key_policy = "per-event@^1"
channels = ["inbox"]
window = "1h"

[caps.hourly]
max = 2
window = "1h"
scope = "user"
"#
            .into(),
        ),
        (
            "digest.toml".into(),
            format!(
                r#"
biz_type = "DIGEST"
key_policy = "per-event@^1"
channels = ["inbox"]
window = "1h"
tz = "+00:00"
quiet = {{ from = "{quiet_from}", to = "{quiet_to}" }}
"#
            ),
        ),
        (
            "broadcast.toml".into(),
            r#"
biz_type = "BROADCAST"
key_policy = "per-event@^1"
channels = ["inbox"]
window = "1h"
dedup = "bloom"
bloom = { items = 100_000, false_positive = 0.001 }
"#
            .into(),
        ),
        (
            "unnamed.toml".into(),
            r#"
biz_type = "UNNAMED"
key_policy = "stable@^1"
channels = ["inbox"]
window = "1h"

[caps.hourly]
max = 2
window = "1h"
scope = "user"
"#
            .into(),
        ),
    ]
}

fn event(biz_type: &str, biz_id: &str, user: &str) -> serde_json::Value {
    serde_json::json!({
        "biz_type": biz_type,
        "biz_id": biz_id,
        "user_id": user,
        "occurred_at": "2026-12-01T10:00:00Z",
        "attributes": {},
    })
}

/// Frequency caps, quiet hours and Bloom mode over the HTTP API on three
/// masters: two messages of a user pass the cap and the third is answered
/// `capped`, a re-post stays `duplicate`; an event inside quiet hours is
/// accepted with `scheduled_for`; a Bloom key is accepted, then answered
/// `duplicate`; a capped policy whose key does not name the recipient is
/// refused with 422 naming the policy, while the same policy with a key
/// that names the user is capped as usual.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn caps_quiet_hours_and_bloom_run_on_a_cluster() {
    let cluster = RedisCluster::start(3).await.unwrap();
    // Quiet from an hour ago to an hour from now (UTC): every DIGEST is held.
    let hhmm = |ms: u64| {
        let minutes = (ms / 60_000) % (24 * 60);
        format!("{:02}:{:02}", minutes / 60, minutes % 60)
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let setup = Setup {
        policies: Some(cluster_policies(
            &hhmm(now - 3_600_000),
            &hhmm(now + 3_600_000),
        )),
        extra_plugins: vec![fixture("stable_1_0_0")],
        ..Setup::default()
    };
    let host = TestHost::start_on(Backend::Cluster(&cluster), setup)
        .await
        .unwrap();
    let result = |a: &pushonce_tests::host::Answer| a.body["results"][0]["result"].clone();

    // Caps: 2 per user per hour, counted in the user's shard with the permits.
    let mut first_task = String::new();
    for i in 0..2 {
        let a = host
            .post(
                "/v1/events",
                &event("PROMO", &format!("p-{i}"), "u-7"),
                None,
            )
            .await
            .unwrap();
        assert_eq!(a.status, StatusCode::ACCEPTED, "{}", a.body);
        assert_eq!(result(&a), "accepted", "{}", a.body);
        if i == 0 {
            first_task = a.body["results"][0]["task_id"].as_str().unwrap().into();
        }
    }
    let third = host
        .post("/v1/events", &event("PROMO", "p-2", "u-7"), None)
        .await
        .unwrap();
    assert_eq!(result(&third), "capped", "{}", third.body);
    assert_eq!(third.body["results"][0]["cap"], "PROMO/hourly");
    let again = host
        .post("/v1/events", &event("PROMO", "p-0", "u-7"), None)
        .await
        .unwrap();
    assert_eq!(result(&again), "duplicate", "{}", again.body);
    assert_eq!(again.body["results"][0]["task_id"], first_task.as_str());
    // Another user has a count of their own.
    let other = host
        .post("/v1/events", &event("PROMO", "p-2", "u-8"), None)
        .await
        .unwrap();
    assert_eq!(result(&other), "accepted", "{}", other.body);

    // Quiet hours: accepted, first attempt at their end.
    let quiet = host
        .post("/v1/events", &event("DIGEST", "d-1", "u-7"), None)
        .await
        .unwrap();
    assert_eq!(result(&quiet), "accepted", "{}", quiet.body);
    let at = quiet.body["results"][0]["scheduled_for"].as_u64();
    assert!(at.is_some_and(|at| at > now), "{}", quiet.body);

    // Bloom mode.
    let bloom = host
        .post("/v1/events", &event("BROADCAST", "b-1", "u-7"), None)
        .await
        .unwrap();
    assert_eq!(result(&bloom), "accepted", "{}", bloom.body);
    let bloom = host
        .post("/v1/events", &event("BROADCAST", "b-1", "u-7"), None)
        .await
        .unwrap();
    assert_eq!(result(&bloom), "duplicate", "{}", bloom.body);

    // A key that does not name its recipient cannot be capped on a
    // cluster: refused, naming the policy and its key policy.
    let refused = host
        .post("/v1/events", &event("UNNAMED", "n-1", "t+1"), None)
        .await
        .unwrap();
    assert_eq!(
        refused.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "{}",
        refused.body
    );
    assert_eq!(refused.body["field"], "biz_type", "{}", refused.body);
    let detail = refused.body["detail"].as_str().unwrap();
    assert!(
        detail.contains("unnamed.toml") && detail.contains("key policy stable"),
        "{detail}"
    );
    // The same policy for a user its key does name: capped as usual.
    for i in 0..2 {
        let a = host
            .post(
                "/v1/events",
                &event("UNNAMED", &format!("n-{i}"), "u-9"),
                None,
            )
            .await
            .unwrap();
        assert_eq!(result(&a), "accepted", "{}", a.body);
    }
    let capped = host
        .post("/v1/events", &event("UNNAMED", "n-2", "u-9"), None)
        .await
        .unwrap();
    assert_eq!(result(&capped), "capped", "{}", capped.body);
    host.shutdown().await.unwrap();
}
