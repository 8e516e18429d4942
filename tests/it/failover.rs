//! A Redis failover that loses acknowledged permits, with a real replica:
//! a primary and a replica (`REPLICAOF`) linked through a relay that stops
//! forwarding the primary's stream while acknowledgements still pass. Events
//! are accepted and sent on the primary; the primary is killed, the replica
//! promoted (`REPLICAOF NO ONE`), a new host pointed at it, and the business
//! service re-posts the same events: Redis accepts them again (it lost the
//! permits). With the delivery ledger the re-posted tasks end
//! `duplicate_prevented` and the provider has each message once; without it
//! (`ledger_url = "off"`) the provider has each twice — the proof that this
//! test sees duplicates when they happen.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use pushonce::send::{Faults, LedgerFileSender, Sender};
use pushonce_tests::host::{Setup, TestHost, order_shipped};
use pushonce_tests::postgres::PostgresServer;
use pushonce_tests::process::{read_ledger, sent_by_key};
use pushonce_tests::redis::RedisServer;
use pushonce_tests::relay::ReplicationRelay;
use reqwest::StatusCode;
use rusty_fork::rusty_fork_test;
use serde_json::Value;

const EVENTS: usize = 8;
/// ORDER_SHIPPED goes to sms, wechat and app-push.
const CHANNELS: usize = 3;

/// Posts the events; returns each accepted task id by channel and key.
async fn post_all(host: &TestHost) -> Vec<(String, String)> {
    let mut accepted = Vec::new();
    for i in 0..EVENTS {
        let answer = host
            .post("/v1/events", &order_shipped(&format!("o-{i}")), None)
            .await
            .unwrap();
        assert_eq!(answer.status, StatusCode::ACCEPTED, "{}", answer.body);
        for r in answer.body["results"].as_array().unwrap() {
            assert_eq!(r["result"], "accepted", "{}", answer.body);
            accepted.push((
                r["key"].as_str().unwrap().to_string(),
                r["task_id"].as_str().unwrap().to_string(),
            ));
        }
    }
    accepted
}

/// Waits (30 s deadline each) until every task reached a status in `done`;
/// returns the views.
async fn wait_tasks(host: &TestHost, tasks: &[(String, String)], done: &[&str]) -> Vec<Value> {
    let mut views = Vec::new();
    for (_, id) in tasks {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            let view = host
                .get(&format!("/v1/tasks/{id}"), None)
                .await
                .unwrap()
                .body;
            if done.contains(&view["status"].as_str().unwrap_or("")) {
                views.push(view);
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "task {id} never reached {done:?}: {view}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    views
}

/// A primary and a replica syncing from it through a relay.
struct Replicated {
    primary: RedisServer,
    replica: RedisServer,
    relay: ReplicationRelay,
    /// A connection to the replica.
    conn: redis::aio::ConnectionManager,
}

/// Starts a primary and a replica linked through a relay; returns once the
/// replica has synced.
async fn replicated() -> Replicated {
    let primary = RedisServer::start().await.unwrap();
    let replica = RedisServer::start().await.unwrap();
    let relay = ReplicationRelay::start(primary.port()).await.unwrap();
    let mut conn = replica.manager().await.unwrap();
    redis::cmd("REPLICAOF")
        .arg("127.0.0.1")
        .arg(relay.port())
        .query_async::<()>(&mut conn)
        .await
        .unwrap();
    replica
        .wait_replica_synced(Duration::from_secs(20))
        .await
        .expect("the replica syncs through the relay");
    Replicated {
        primary,
        replica,
        relay,
        conn,
    }
}

/// Makes the replica a primary (`REPLICAOF NO ONE`).
async fn promote(conn: &mut redis::aio::ConnectionManager) {
    redis::cmd("REPLICAOF")
        .arg("NO")
        .arg("ONE")
        .query_async::<()>(conn)
        .await
        .unwrap();
}

/// Runs the whole scenario with `ledger_url`; returns sends per key at the
/// provider and the re-posted tasks' views.
async fn failover(ledger_url: &str) -> (HashMap<String, usize>, Vec<Value>, String) {
    let Replicated {
        primary,
        replica,
        relay,
        mut conn,
    } = replicated().await;

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("provider.jsonl");
    let sender: Arc<dyn Sender> =
        Arc::new(LedgerFileSender::open(&file, Faults::default()).unwrap());
    let setup = || Setup {
        sender: Some(sender.clone()),
        ledger_url: Some(ledger_url.to_string()),
        ..Setup::default()
    };

    let first = TestHost::start_with(&primary, setup()).await.unwrap();
    relay.hold();
    let tasks = post_all(&first).await;
    wait_tasks(&first, &tasks, &["sent"]).await;
    first.shutdown().await.unwrap();

    // The primary dies; the replica, which never got those writes, is promoted.
    drop(primary);
    promote(&mut conn).await;
    drop(relay);

    let second = TestHost::start_with(&replica, setup()).await.unwrap();
    // Accepted again: the permits were lost with the primary.
    let reposted = post_all(&second).await;
    let views = wait_tasks(&second, &reposted, &["sent", "duplicate_prevented"]).await;
    let metrics = second.metrics().await.unwrap();
    second.shutdown().await.unwrap();
    let sent = sent_by_key(&read_ledger(&file));
    let per_key = sent.into_iter().map(|(k, v)| (k, v.len())).collect();
    // The first host's task ids, for the owner check.
    let owners: HashMap<&str, &str> = tasks
        .iter()
        .map(|(k, id)| (k.as_str(), id.as_str()))
        .collect();
    for (view, (key, _)) in views.iter().zip(&reposted) {
        if view["status"] == "duplicate_prevented" {
            assert_eq!(
                view["duplicate_of"],
                owners[key.as_str()],
                "the true owner is named: {view}"
            );
        }
    }
    (per_key, views, metrics)
}

rusty_fork_test! {
    /// In a process of its own (rusty-fork): it counts the prevented
    /// duplicates in the process-wide metrics recorder, which the other
    /// tests of this binary share.
    #[test]
    fn with_the_ledger_a_failover_that_loses_permits_sends_nothing_twice() {
        pushonce_tests::runtime().block_on(the_ledger_stops_the_failovers_duplicates());
    }
}

async fn the_ledger_stops_the_failovers_duplicates() {
    let pg = PostgresServer::shared().await.unwrap();
    let url = pg.database().await.unwrap();
    let (per_key, views, metrics) = failover(&url).await;
    assert_eq!(per_key.len(), EVENTS * CHANNELS);
    assert!(
        per_key.values().all(|n| *n == 1),
        "a duplicate reached the provider: {per_key:?}"
    );
    assert!(
        views.iter().all(|v| v["status"] == "duplicate_prevented"),
        "{views:?}"
    );
    for channel in ["sms", "wechat", "app-push"] {
        let line = format!("pushonce_duplicate_prevented_total{{channel=\"{channel}\"}} {EVENTS}");
        assert!(metrics.contains(&line), "no {line} in\n{metrics}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_ledger_the_same_failover_sends_every_message_twice() {
    let (per_key, views, _) = failover("off").await;
    assert_eq!(per_key.len(), EVENTS * CHANNELS);
    assert!(
        per_key.values().all(|n| *n == 2),
        "expected every message twice: {per_key:?}"
    );
    assert!(views.iter().all(|v| v["status"] == "sent"), "{views:?}");
}

/// The results of one posted event, by channel.
fn results(body: &Value) -> Vec<String> {
    body["results"]
        .as_array()
        .unwrap_or_else(|| panic!("no results in {body}"))
        .iter()
        .map(|r| r["result"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_wait_replicas_an_accept_is_answered_only_once_a_replica_confirmed_it() {
    let Replicated {
        primary,
        replica,
        relay,
        mut conn,
    } = replicated().await;
    // Both hosts claim in one ledger, as instances before and after a
    // failover do (it outlives the primary's directory).
    let ledger_dir = tempfile::tempdir().unwrap();
    let ledger_url = format!(
        "sqlite:{}",
        ledger_dir.path().join("ledger.sqlite3").display()
    );
    let wait_for_one = || Setup {
        configure: Some(Box::new(|config: &mut pushonce::config::HostConfig| {
            config.wait_replicas = 1;
            config.wait_replicas_timeout = Duration::from_millis(300);
        })),
        ledger_url: Some(ledger_url.clone()),
        ..Setup::default()
    };
    let first = TestHost::start_with(&primary, wait_for_one())
        .await
        .unwrap();
    let confirmed = first
        .post("/v1/events", &order_shipped("o-confirmed"), None)
        .await
        .unwrap();
    assert_eq!(confirmed.status, StatusCode::ACCEPTED, "{}", confirmed.body);
    assert_eq!(results(&confirmed.body), ["accepted"; CHANNELS]);

    // The replica stops receiving writes: no accept can be confirmed.
    relay.hold();
    let unconfirmed = first
        .post("/v1/events", &order_shipped("o-unconfirmed"), None)
        .await
        .unwrap();
    assert_eq!(unconfirmed.status, StatusCode::SERVICE_UNAVAILABLE);
    let detail = unconfirmed.body["detail"].as_str().unwrap_or_default();
    assert!(
        detail.contains("only 0 of the 1 replica(s)") && detail.contains("post the event again"),
        "{detail}"
    );
    assert!(unconfirmed.headers.contains_key("retry-after"));
    first.shutdown().await.unwrap();

    // Failover: what the API confirmed is on the promoted replica.
    drop(primary);
    promote(&mut conn).await;
    drop(relay);
    let second = TestHost::start_with(
        &replica,
        Setup {
            ledger_url: Some(ledger_url.clone()),
            ..Setup::default()
        },
    )
    .await
    .unwrap();
    let again = second
        .post("/v1/events", &order_shipped("o-confirmed"), None)
        .await
        .unwrap();
    assert_eq!(
        results(&again.body),
        ["duplicate"; CHANNELS],
        "{}",
        again.body
    );
    // The unconfirmed one was lost with the primary; its client, told 503,
    // posts it again and it is accepted.
    let retried = second
        .post("/v1/events", &order_shipped("o-unconfirmed"), None)
        .await
        .unwrap();
    assert_eq!(
        results(&retried.body),
        ["accepted"; CHANNELS],
        "{}",
        retried.body
    );
    second.shutdown().await.unwrap();
}
