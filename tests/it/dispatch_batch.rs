//! Batched dispatch: the reader hands a shard's ready entries to one batch
//! (one begin, one ledger transaction of claims, one record), and a batch is
//! never a unit of failure. One shard, so every task queued before the
//! dispatcher starts lands in the same batches.

use std::collections::HashMap;
use std::time::Duration;

use pushonce::ledger::Ledger;
use pushonce::permit::{AcceptRequest, Acceptance, PermitConfig, Permits, RetryPolicy, TaskStatus};
use pushonce::send::Faults;
use pushonce_tests::dispatcher::RunningDispatcher;
use pushonce_tests::fixtures::{accept_request, one_shard_config};
use pushonce_tests::process::{PushonceProcess, read_ledger, sent_by_key};
use pushonce_tests::redis::RedisServer;
use pushonce_tests::wait_until;

fn request(key: &str) -> AcceptRequest {
    AcceptRequest {
        biz_type: String::new(),
        biz_id: String::new(),
        retry: RetryPolicy {
            max_attempts: 2,
            initial: Duration::from_millis(100),
            factor: 1.0,
            max_delay: Duration::from_millis(200),
            jitter: false,
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

async fn statuses(permits: &Permits, ids: &HashMap<String, String>) -> HashMap<String, TaskStatus> {
    let mut out = HashMap::new();
    for (key, id) in ids {
        if let Some(t) = permits.task(id).await.unwrap() {
            out.insert(key.clone(), t.status);
        }
    }
    out
}

/// One batch of 16 tasks of one shard, the delivery ledger on: the task the
/// provider refuses for good fails, the one it never answers is held
/// `unknown` after its attempts, and each of the others is sent exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_tasks_refusal_or_lost_answer_in_a_batch_touches_only_that_task() {
    let server = RedisServer::start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("ledger.jsonl");
    let permits = server.permits(one_shard_config()).await.unwrap();
    let claims = Ledger::open(&format!(
        "sqlite:{}",
        dir.path().join("ledger.sqlite3").display()
    ))
    .await
    .unwrap();
    let mut keys: Vec<String> = (0..14).map(|i| format!("batch:ok:{i}")).collect();
    keys.insert(5, "batch:refuse:1".into());
    keys.insert(11, "batch:lost:1".into());
    let ids = accept_all(&permits, &keys).await;

    let dispatcher = RunningDispatcher::start_claiming(
        server.client(),
        permits.clone(),
        &file,
        Faults {
            permanent_match: Some("refuse".into()),
            unknown_match: Some("lost".into()),
            ..Faults::default()
        },
        16,
        Duration::from_secs(5),
        Some(claims),
    );
    let settled = |s: &TaskStatus| {
        matches!(
            s,
            TaskStatus::Sent | TaskStatus::Failed | TaskStatus::Unknown
        )
    };
    let waited = wait_until(Duration::from_secs(20), || {
        let (permits, ids) = (permits.clone(), ids.clone());
        async move {
            let now = statuses(&permits, &ids).await;
            now.len() == ids.len() && now.values().all(settled)
        }
    })
    .await;
    if let Err(e) = waited {
        panic!("{e}: {:?}", statuses(&permits, &ids).await);
    }
    dispatcher.stop().await;

    let now = statuses(&permits, &ids).await;
    assert_eq!(now["batch:refuse:1"], TaskStatus::Failed, "{now:?}");
    assert_eq!(now["batch:lost:1"], TaskStatus::Unknown, "{now:?}");
    let lines = read_ledger(&file);
    let calls = |key: &str| -> Vec<_> { lines.iter().filter(|l| l.key == key).cloned().collect() };
    assert_eq!(
        calls("batch:refuse:1").len(),
        1,
        "refused once, not retried"
    );
    assert_eq!(
        calls("batch:lost:1").len(),
        2,
        "the lost answer is resent with its key until its attempts are spent"
    );
    let sent = sent_by_key(&lines);
    for key in keys.iter().filter(|k| k.starts_with("batch:ok:")) {
        assert_eq!(now[key], TaskStatus::Sent, "{key}: {now:?}");
        let all = calls(key);
        assert_eq!(all.len(), 1, "{key} sent exactly once: {all:?}");
        assert_eq!(sent[key][0].attempt, 1, "{key}: {all:?}");
    }
}

const WORKER_ARGS: [&str; 10] = [
    "--lease",
    "1s",
    "--block",
    "200ms",
    "--promote-every",
    "50ms",
    "--grace",
    "60s",
    "--shards",
    "1",
];

/// `kill -9` of a `pushonce worker` while a batch of 8 is in flight (the
/// provider took all 8, none recorded): another instance completes every
/// task. Each key reaches the provider from one task only; the 8 of the
/// killed batch once more with the same key (the reclaimed resend the
/// provider dedupes, as one by one), every other task exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_killed_mid_batch_leaves_each_task_sent_once_or_reclaimed_once() {
    let server = RedisServer::start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("ledger.jsonl");
    let claims = format!("sqlite:{}", dir.path().join("claims.sqlite3").display());
    let permits = server
        .permits(PermitConfig {
            shards: 1,
            ..PermitConfig::default()
        })
        .await
        .unwrap();
    let keys: Vec<String> = (0..20).map(|i| format!("push:batchkill:{i}")).collect();
    let ids = accept_all(&permits, &keys).await;

    let mut a = PushonceProcess::spawn(
        &server.url(),
        &file,
        &[
            &WORKER_ARGS[..],
            &[
                "--ledger-url",
                &claims,
                "--workers",
                "8",
                "--batch",
                "8",
                "--hold-after-send",
                "30s",
            ],
        ]
        .concat(),
    )
    .unwrap();
    let a_pid = a.pid();
    wait_until(Duration::from_secs(15), || {
        let file = file.clone();
        async move { read_ledger(&file).iter().filter(|l| l.pid == a_pid).count() >= 8 }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}; worker A log:\n{}", a.log()));
    a.kill9();
    let by_a: Vec<String> = read_ledger(&file).into_iter().map(|l| l.key).collect();
    assert_eq!(
        by_a.len(),
        8,
        "A's one batch reached the provider: {by_a:?}"
    );

    let b = PushonceProcess::spawn(
        &server.url(),
        &file,
        &[
            &WORKER_ARGS[..],
            &["--ledger-url", &claims, "--workers", "4"],
        ]
        .concat(),
    )
    .unwrap();
    wait_until(Duration::from_secs(30), || {
        let (permits, ids) = (permits.clone(), ids.clone());
        async move {
            let now = statuses(&permits, &ids).await;
            now.len() == ids.len() && now.values().all(|s| *s == TaskStatus::Sent)
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}; worker B log:\n{}", b.log()));

    let sent = sent_by_key(&read_ledger(&file));
    assert_eq!(sent.len(), keys.len(), "every task reached the provider");
    for key in &keys {
        let calls = &sent[key];
        assert!(
            calls.iter().all(|c| c.task_id == ids[key]),
            "{key}: one task only: {calls:?}"
        );
        if by_a.contains(key) {
            assert_eq!(calls.len(), 2, "{key}: A's send and one resend: {calls:?}");
            assert_eq!(calls[0].pid, a_pid);
            assert_ne!(calls[1].pid, a_pid);
            assert_eq!(calls[1].attempt, calls[0].attempt + 1, "{calls:?}");
            let task = permits.task(&ids[key]).await.unwrap().unwrap();
            assert!(task.maybe_sent, "{key}: marked as possibly sent");
        } else {
            assert_eq!(calls.len(), 1, "{key} sent exactly once: {calls:?}");
            assert_ne!(calls[0].pid, a_pid);
        }
    }
}
