//! An evicting Redis is refused, and a full one loses no accept, against
//! real `redis-server`s: one with `maxmemory-policy volatile-lru` (the
//! managed services' default) stops `pushonce serve` and an in-process host
//! with the policy and the fix named, unless `allow_evicting_redis` opts in
//! (one such master of a cluster is named by its address; without `CONFIG`
//! the policy comes from `INFO memory`);
//! `/readyz` names a policy changed after start; a `noeviction` Redis filled
//! to its `maxmemory` answers 503 with `Retry-After`, and after memory is
//! freed every event answered 202 is delivered once and every one answered
//! 503 is accepted on retry and delivered once.

use std::collections::HashMap;
use std::time::Duration;

use pushonce::send::{Faults, LedgerFileSender, Sender};
use pushonce_tests::cluster::RedisCluster;
use pushonce_tests::host::{Answer, Backend, Setup, TestHost, order_shipped};
use pushonce_tests::process::{PushonceProcess, read_ledger, sent_by_key};
use pushonce_tests::redis::{RedisServer, config_set};
use pushonce_tests::wait_until;
use redis::aio::ConnectionManager;
use reqwest::StatusCode;

/// What the refusal of an evicting Redis must tell an operator.
const REFUSAL_NAMES: [&str; 3] = [
    "maxmemory-policy volatile-lru",
    "a permit evicted re-opens its key",
    "CONFIG SET maxmemory-policy noeviction",
];

fn assert_names_refusal(text: &str) {
    for part in REFUSAL_NAMES {
        assert!(text.contains(part), "{part:?} missing from:\n{text}");
    }
}

/// A host against `redis` that opts in to an evicting Redis (`ledger_url`
/// as given, `None`: the SQLite ledger).
fn opted_in(ledger_url: Option<&str>) -> Setup {
    Setup {
        ledger_url: ledger_url.map(String::from),
        configure: Some(Box::new(|c| c.allow_evicting_redis = true)),
        ..Setup::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_evicting_redis_is_refused_by_name_unless_opted_in() {
    let redis = RedisServer::start_with_args(&[
        "--maxmemory",
        "64mb",
        "--maxmemory-policy",
        "volatile-lru",
    ])
    .await
    .unwrap();

    // `pushonce serve` exits with the policy, the reason and the fix.
    let dir = tempfile::tempdir().unwrap();
    let listen = format!(
        "127.0.0.1:{}",
        pushonce::store::free_loopback_port().unwrap()
    );
    let url = redis.url();
    let mut serve = PushonceProcess::serve_repository_config(
        dir.path(),
        &listen,
        "",
        &[("PUSHONCE_REDIS_URL", &url)],
    )
    .unwrap();
    let status = serve.wait_exit(Duration::from_secs(60)).await.unwrap();
    assert!(
        !status.success(),
        "serve ran on volatile-lru:\n{}",
        serve.log()
    );
    assert_names_refusal(&serve.log());

    // So does a host started in-process, before writing anything to Redis.
    let refused = TestHost::start(&redis).await.err().expect("refused");
    assert_names_refusal(&format!("{refused:#}"));
    let mut conn = redis.manager().await.unwrap();
    let written: u64 = redis::cmd("DBSIZE").query_async(&mut conn).await.unwrap();
    assert_eq!(written, 0, "the refused host wrote keys");

    // The opt-in needs the ledger: with `ledger_url = "off"` it is refused too.
    let refused = TestHost::start_with(&redis, opted_in(Some("off")))
        .await
        .err()
        .expect("refused without a ledger");
    let text = format!("{refused:#}");
    assert!(
        text.contains("allow_evicting_redis = true needs the delivery ledger"),
        "{text}"
    );

    // With the ledger, the opt-in starts, is ready and delivers.
    let host = TestHost::start_with(&redis, opted_in(None)).await.unwrap();
    let ready = host.get("/readyz", None).await.unwrap();
    assert_eq!(ready.status, StatusCode::OK, "{}", ready.body);
    let accepted = host
        .post("/v1/events", &order_shipped("ev-1"), None)
        .await
        .unwrap();
    assert_eq!(accepted.status, StatusCode::ACCEPTED, "{}", accepted.body);
    wait_delivered_once(&host, 3).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_config_the_policy_is_read_from_info_memory() {
    // As on managed Redis, where CONFIG is renamed or forbidden.
    let redis = RedisServer::start_with_args(&[
        "--rename-command",
        "CONFIG",
        "",
        "--maxmemory-policy",
        "allkeys-lru",
    ])
    .await
    .unwrap();
    let refused = TestHost::start(&redis).await.err().expect("refused");
    let text = format!("{refused:#}");
    assert!(text.contains("maxmemory-policy allkeys-lru"), "{text}");
    assert!(
        text.contains("CONFIG SET maxmemory-policy noeviction"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_evicting_master_of_a_cluster_is_refused_by_its_address() {
    let cluster = RedisCluster::start(3).await.unwrap();
    let url = &cluster.urls()[1];
    let mut master = redis::Client::open(url.as_str())
        .unwrap()
        .get_connection_manager()
        .await
        .unwrap();
    config_set(&mut master, "maxmemory-policy", "volatile-lru").await;
    let refused = TestHost::start_on(Backend::Cluster(&cluster), Setup::default())
        .await
        .err()
        .expect("refused");
    let text = format!("{refused:#}");
    assert_names_refusal(&text);
    let address = url.trim_start_matches("redis://");
    assert!(text.contains(&format!(" at {address} ")), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_names_a_policy_changed_after_start() {
    let redis = RedisServer::start().await.unwrap();
    let host = TestHost::start(&redis).await.unwrap();
    assert_eq!(
        host.get("/readyz", None).await.unwrap().status,
        StatusCode::OK
    );

    let mut conn = redis.manager().await.unwrap();
    config_set(&mut conn, "maxmemory-policy", "allkeys-lru").await;
    let ready = host.get("/readyz", None).await.unwrap();
    assert_eq!(
        ready.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{}",
        ready.body
    );
    let detail = ready.body["detail"].as_str().unwrap_or_default();
    assert!(detail.contains("maxmemory-policy allkeys-lru"), "{detail}");
    assert!(
        detail.contains("CONFIG SET maxmemory-policy noeviction"),
        "{detail}"
    );

    config_set(&mut conn, "maxmemory-policy", "noeviction").await;
    assert_eq!(
        host.get("/readyz", None).await.unwrap().status,
        StatusCode::OK
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_redis_answers_503_and_every_accept_is_delivered_once_after() {
    let redis =
        RedisServer::start_with_args(&["--maxmemory", "32mb", "--maxmemory-policy", "noeviction"])
            .await
            .unwrap();
    // Each send is held a moment after the provider took it, so memory fills
    // while the dispatcher has attempts to record and tasks to begin.
    let dir = tempfile::tempdir().unwrap();
    let ledger = dir.path().join("ledger.jsonl");
    let faults = Faults {
        hold_after_send: Duration::from_millis(1500),
        ..Faults::default()
    };
    let sender = LedgerFileSender::open(&ledger, faults).unwrap();
    let host = TestHost::start_with(
        &redis,
        Setup {
            sender: Some(std::sync::Arc::new(sender) as std::sync::Arc<dyn Sender>),
            ..Setup::default()
        },
    )
    .await
    .unwrap();

    // Accepted before memory is full; the first sends are under way.
    let mut task_ids = Vec::new();
    for id in ["full-a", "full-b"] {
        let a = post_event(&host, id).await;
        assert_eq!(a.status, StatusCode::ACCEPTED, "{}", a.body);
        task_ids.extend(a.task_ids());
    }
    wait_until(Duration::from_secs(20), || {
        let ledger = ledger.clone();
        async move { !read_ledger(&ledger).is_empty() }
    })
    .await
    .unwrap();

    let mut conn = redis.manager().await.unwrap();
    let junk = fill_until_oom(&mut conn).await;

    // New events: 503 with Retry-After and a problem naming the cause.
    let refused_ids = ["full-c", "full-d", "full-e"];
    for id in refused_ids {
        let a = post_event(&host, id).await;
        assert_eq!(a.status, StatusCode::SERVICE_UNAVAILABLE, "{}", a.body);
        assert!(a.headers.contains_key("retry-after"), "{:?}", a.headers);
        assert_eq!(a.content_type(), "application/problem+json");
        let detail = a.body["detail"].as_str().unwrap_or_default();
        assert!(detail.contains("Redis is out of memory"), "{detail}");
        assert!(detail.contains("maxmemory"), "{detail}");
    }

    // Memory freed: the refused events are accepted on retry — every
    // channel `accepted`, nothing half-written before — and all is sent once.
    let _: () = redis::cmd("DEL")
        .arg(&junk)
        .query_async(&mut conn)
        .await
        .unwrap();
    config_set(&mut conn, "maxmemory", "32mb").await;
    for id in refused_ids {
        let a = post_event(&host, id).await;
        assert_eq!(a.status, StatusCode::ACCEPTED, "{}", a.body);
        let results = a.body["results"].as_array().unwrap();
        assert!(
            results.iter().all(|r| r["result"] == "accepted"),
            "{}",
            a.body
        );
        task_ids.extend(a.task_ids());
    }
    host.wait_sent(&task_ids, Duration::from_secs(90))
        .await
        .unwrap_or_else(|e| panic!("{e}; ledger: {:?}", read_ledger(&ledger)));
    let lines = read_ledger(&ledger);
    let sent = sent_by_key(&lines);
    assert_eq!(sent.len(), 15, "5 events x 3 channels: {lines:?}");
    assert_eq!(lines.len(), 15, "one provider call per message: {lines:?}");
    assert!(sent.values().all(|l| l.len() == 1), "{sent:?}");
}

/// Waits until the host's development ledger holds `n` keys, each sent once.
async fn wait_delivered_once(host: &TestHost, n: usize) {
    let ledger = host.ledger();
    wait_until(Duration::from_secs(30), || {
        let ledger = ledger.clone();
        async move { sent_by_key(&read_ledger(&ledger)).len() >= n }
    })
    .await
    .unwrap();
    let sent = sent_by_key(&read_ledger(&ledger));
    assert_eq!(sent.len(), n, "{sent:?}");
    assert!(sent.values().all(|l| l.len() == 1), "{sent:?}");
}

/// `POST /v1/events` of `order_shipped(id)`.
async fn post_event(host: &TestHost, id: &str) -> Answer {
    host.post("/v1/events", &order_shipped(id), None)
        .await
        .unwrap()
}

/// Writes 256 KiB junk values until Redis refuses one with OOM, then lowers
/// `maxmemory` 8 MB below what Redis uses, so no fluctuation (client
/// buffers let go, tasks the dispatcher ends leaving Redis) lets a write
/// through; the junk keys. (With 2 MB, one CI run saw an accept pass.)
async fn fill_until_oom(conn: &mut ConnectionManager) -> Vec<String> {
    let value = vec![b'x'; 256 * 1024];
    let mut keys = Vec::new();
    loop {
        let key = format!("junk:{}", keys.len());
        let set: redis::RedisResult<()> = redis::cmd("SET")
            .arg(&key)
            .arg(&value)
            .query_async(conn)
            .await;
        match set {
            Ok(()) => keys.push(key),
            Err(e) if e.code() == Some("OOM") => break,
            Err(e) => panic!("filling Redis: {e}"),
        }
        assert!(keys.len() < 1_000, "32 MB never filled");
    }
    let info: String = redis::cmd("INFO")
        .arg("memory")
        .query_async(conn)
        .await
        .unwrap();
    let used: HashMap<&str, &str> = info
        .lines()
        .filter_map(|l| l.trim().split_once(':'))
        .collect();
    let used: u64 = used["used_memory"].parse().unwrap();
    config_set(conn, "maxmemory", &(used - 8_000_000).to_string()).await;
    keys
}
