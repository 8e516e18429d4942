//! Real `pushonce worker` processes on one redis-server: a worker killed with
//! `kill -9` between send and record is completed by another instance with at
//! most one extra attempt carrying the same key; several instances together
//! send each task exactly once; SIGTERM stops a worker cleanly.
//!
//! Needs `target/debug/pushonce`: `cargo build --bins` first (`cargo xtask test` does it).

use std::collections::HashMap;
use std::time::Duration;

use pushonce::permit::{AcceptRequest, Acceptance, PermitConfig, Permits, RetryPolicy, TaskStatus};
use pushonce_tests::fixtures::accept_request;
use pushonce_tests::process::{PushonceProcess, pushonce_bin, read_ledger, sent_by_key};
use pushonce_tests::redis::RedisServer;
use pushonce_tests::wait_until;

fn request(key: &str) -> AcceptRequest {
    AcceptRequest {
        biz_type: String::new(),
        biz_id: String::new(),
        payload: "{}".into(),
        retry: RetryPolicy {
            initial: Duration::from_millis(100),
            ..RetryPolicy::default()
        },
        ..accept_request(key)
    }
}

async fn accept_all(permits: &Permits, keys: &[String]) -> HashMap<String, String> {
    let mut ids = HashMap::new();
    for key in keys {
        match permits.accept(&request(key)).await.unwrap() {
            Acceptance::Accepted { task_id } => {
                ids.insert(key.clone(), task_id);
            }
            other => panic!("expected accepted, got {other:?}"),
        }
    }
    ids
}

async fn all_sent(permits: &Permits, ids: &HashMap<String, String>) -> bool {
    for id in ids.values() {
        match permits.task(id).await.unwrap() {
            Some(t) if t.status == TaskStatus::Sent => {}
            _ => return false,
        }
    }
    true
}

const WORKER_ARGS: [&str; 8] = [
    "--lease",
    "1s",
    "--block",
    "200ms",
    "--promote-every",
    "50ms",
    "--grace",
    "60s",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_killed_mid_send_is_completed_by_another_instance() {
    let server = RedisServer::start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let ledger = dir.path().join("ledger.jsonl");
    let permits = server.permits(PermitConfig::default()).await.unwrap();
    let keys: Vec<String> = (0..20).map(|i| format!("push:kill:{i}")).collect();
    let ids = accept_all(&permits, &keys).await;

    // Instance A: the provider takes the message, then A hangs before recording it.
    let mut a = PushonceProcess::spawn(
        &server.url(),
        &ledger,
        &[
            &WORKER_ARGS[..],
            &["--workers", "1", "--hold-after-send", "30s"],
        ]
        .concat(),
    )
    .unwrap();
    let a_pid = a.pid();
    wait_until(Duration::from_secs(10), || {
        let ledger = ledger.clone();
        async move { read_ledger(&ledger).iter().any(|l| l.pid == a_pid) }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}; worker A log:\n{}", a.log()));
    a.kill9();
    let killed: Vec<_> = read_ledger(&ledger);
    assert_eq!(killed.len(), 1, "A sent exactly one message before it died");
    let killed = killed[0].clone();

    // Instance B completes everything, including what A held.
    let b = PushonceProcess::spawn(
        &server.url(),
        &ledger,
        &[&WORKER_ARGS[..], &["--workers", "4"]].concat(),
    )
    .unwrap();
    wait_until(Duration::from_secs(20), || all_sent(&permits, &ids))
        .await
        .unwrap_or_else(|e| panic!("{e}; worker B log:\n{}", b.log()));

    let lines = read_ledger(&ledger);
    let sent = sent_by_key(&lines);
    assert_eq!(sent.len(), keys.len(), "every task reached the provider");
    for key in &keys {
        let calls = &sent[key];
        if *key == killed.key {
            // The one extra attempt: same task, same idempotency key, next attempt number.
            assert_eq!(calls.len(), 2, "{calls:?}");
            assert_eq!(calls[0].pid, a_pid);
            assert_ne!(calls[1].pid, a_pid);
            assert_eq!(calls[0].task_id, calls[1].task_id);
            assert_eq!(calls[1].attempt, calls[0].attempt + 1);
        } else {
            assert_eq!(calls.len(), 1, "{key}: {calls:?}");
            assert_ne!(calls[0].pid, a_pid);
        }
    }
    let task = permits.task(&ids[&killed.key]).await.unwrap().unwrap();
    assert!(
        task.maybe_sent,
        "the re-claimed task is marked as possibly sent"
    );
    assert_eq!(task.attempts, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_instances_send_each_task_exactly_once() {
    let server = RedisServer::start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let ledger = dir.path().join("ledger.jsonl");
    let permits = server.permits(PermitConfig::default()).await.unwrap();
    let workers: Vec<PushonceProcess> = (0..3)
        .map(|_| {
            PushonceProcess::spawn(
                &server.url(),
                &ledger,
                &[&WORKER_ARGS[..], &["--workers", "4", "--fail-first", "1"]].concat(),
            )
            .unwrap()
        })
        .collect();
    // Accepted while the instances run, each task failing once (so retries cross instances too).
    let keys: Vec<String> = (0..150).map(|i| format!("push:multi:{i}")).collect();
    let ids = accept_all(&permits, &keys).await;
    wait_until(Duration::from_secs(30), || all_sent(&permits, &ids))
        .await
        .unwrap_or_else(|e| {
            panic!(
                "{e}; logs:\n{}",
                workers.iter().map(|w| w.log()).collect::<String>()
            )
        });
    let lines = read_ledger(&ledger);
    let sent = sent_by_key(&lines);
    assert_eq!(sent.len(), keys.len());
    for (key, calls) in &sent {
        assert_eq!(calls.len(), 1, "{key}: {calls:?}");
        assert_eq!(calls[0].attempt, 2);
    }
    let pids: std::collections::HashSet<u32> = lines.iter().map(|l| l.pid).collect();
    assert!(
        pids.len() >= 2,
        "work was shared between instances: {pids:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_stops_a_worker_after_its_send_in_flight() {
    let server = RedisServer::start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let ledger = dir.path().join("ledger.jsonl");
    let permits = server.permits(PermitConfig::default()).await.unwrap();
    let mut w = PushonceProcess::spawn(
        &server.url(),
        &ledger,
        &[
            &WORKER_ARGS[..],
            &["--workers", "1", "--send-delay", "500ms"],
        ]
        .concat(),
    )
    .unwrap();
    let ids = accept_all(&permits, &["push:term:1".to_string()]).await;
    let id = ids.values().next().unwrap().clone();
    wait_until(Duration::from_secs(10), || {
        let permits = permits.clone();
        let id = id.clone();
        async move { permits.task(&id).await.unwrap().map(|t| t.status) == Some(TaskStatus::Sending) }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}; log:\n{}", w.log()));
    let status = w.terminate(Duration::from_secs(10)).await.unwrap();
    assert!(status.success(), "clean exit: {status}; log:\n{}", w.log());
    assert_eq!(
        permits.task(&id).await.unwrap().unwrap().status,
        TaskStatus::Sent
    );
}

/// `pushonce worker` sends nothing (its sender only records each message in
/// a file and marks it sent), so an operator who sourced the production
/// environment and ran it to add capacity must not take real tasks: without
/// `--dev-sender` it exits non-zero saying what it is and what to run
/// instead, and the queued task stays queued, recorded nowhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_without_dev_sender_refuses_and_leaves_the_task_queued() {
    let server = RedisServer::start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let permits = server.permits(PermitConfig::default()).await.unwrap();
    let ids = accept_all(&permits, &["push:production:1".to_string()]).await;
    let id = ids.values().next().unwrap().clone();

    let log = dir.path().join("worker.log");
    let mut child = std::process::Command::new(pushonce_bin().unwrap())
        .arg("worker")
        .current_dir(dir.path())
        .env("PUSHONCE_REDIS_URL", server.url())
        .env("PUSHONCE_LEDGER_URL", server.ledger_url())
        .env("RUST_LOG", "info")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let mut status = None;
    let exited = wait_until(Duration::from_secs(10), || {
        status = child.try_wait().unwrap();
        std::future::ready(status.is_some())
    })
    .await;
    if exited.is_err() {
        let _ = child.kill();
        let _ = child.wait();
    }
    let task = permits.task(&id).await.unwrap().unwrap();
    let stderr = std::fs::read_to_string(&log).unwrap();
    assert!(
        status.is_some_and(|s| !s.success()),
        "expected a refusal, got {status:?} (task {:?}); log:\n{stderr}",
        task.status
    );
    assert!(
        stderr.contains("pushonce worker sends nothing")
            && stderr.contains("pass --dev-sender")
            && stderr.contains("pushonce serve"),
        "{stderr}"
    );
    assert_eq!(task.status, TaskStatus::Queued);
    assert!(
        !dir.path().join("data/ledger.jsonl").exists(),
        "nothing recorded"
    );
}
