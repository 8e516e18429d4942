//! The dispatcher in-process against a real redis-server, sending through the
//! ledger sender: retries follow the backoff, permanent failures release the
//! permit, exhausted tasks die, a Redis restart loses nothing, shutdown
//! finishes the send in flight.

use std::path::{Path, PathBuf};
use std::time::Duration;

use pushonce::dispatch::backoff::min_delay_after;
use pushonce::permit::{AcceptRequest, Acceptance, Permits, RetryPolicy, TaskStatus};
use pushonce::send::Faults;
use pushonce_tests::dispatcher::RunningDispatcher;
use pushonce_tests::fixtures::{accept_request, permit_config};
use pushonce_tests::process::{read_ledger, sent_by_key};
use pushonce_tests::redis::RedisServer;
use pushonce_tests::wait_until;

fn fast_retry() -> RetryPolicy {
    RetryPolicy {
        max_attempts: 5,
        initial: Duration::from_millis(200),
        factor: 2.0,
        max_delay: Duration::from_secs(5),
        jitter: true,
    }
}

fn request(key: &str, window: Duration, retry: RetryPolicy) -> AcceptRequest {
    AcceptRequest {
        window,
        biz_type: String::new(),
        biz_id: String::new(),
        retry,
        ..accept_request(key)
    }
}

/// A dispatcher on `server` sending through the development ledger at
/// `ledger` with `faults`, and a permit layer of its own to accept with.
async fn start(
    server: &RedisServer,
    ledger: &Path,
    faults: Faults,
) -> (RunningDispatcher, Permits) {
    let permits = server.permits(permit_config()).await.unwrap();
    let run = RunningDispatcher::start(
        server.client(),
        permits.clone(),
        ledger,
        faults,
        4,
        Duration::from_secs(1),
    );
    (run, permits)
}

/// Faults that fail the first `n` sends, retryably.
fn failing_first(n: u32) -> Faults {
    Faults {
        fail_first: n,
        ..Faults::default()
    }
}

async fn wait_status(permits: &Permits, id: &str, status: TaskStatus, within: Duration) {
    let res = wait_until(within, || {
        let permits = permits.clone();
        let id = id.to_string();
        async move { permits.task(&id).await.unwrap().map(|t| t.status) == Some(status) }
    })
    .await;
    if res.is_err() {
        panic!(
            "task {id} never reached {status}: {:?}",
            permits.task(id).await.unwrap()
        );
    }
}

fn ledger_path(dir: &tempfile::TempDir) -> PathBuf {
    dir.path().join("ledger.jsonl")
}

fn accepted(a: Acceptance) -> String {
    match a {
        Acceptance::Accepted { task_id } => task_id,
        other => panic!("expected accepted, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_retryable_failures_then_one_send_with_backoff_between() {
    let server = RedisServer::start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let ledger = ledger_path(&dir);
    let (run, permits) = start(&server, &ledger, failing_first(2)).await;
    let retry = fast_retry();
    let id = accepted(
        permits
            .accept(&request("retry-key", Duration::from_secs(60), retry))
            .await
            .unwrap(),
    );
    wait_status(&permits, &id, TaskStatus::Sent, Duration::from_secs(10)).await;
    run.stop().await;

    let task = permits.task(&id).await.unwrap().unwrap();
    assert_eq!(task.attempts, 3);
    let lines = read_ledger(&ledger);
    let outcomes: Vec<(u32, &str)> = lines
        .iter()
        .map(|l| (l.attempt, l.outcome.as_str()))
        .collect();
    assert_eq!(
        outcomes,
        vec![(1, "retryable"), (2, "retryable"), (3, "sent")]
    );
    assert!(lines.iter().all(|l| l.key == "retry-key"));
    // The gaps follow the backoff: at least the jittered lower bound (d/2) of each delay.
    let gap1 = Duration::from_millis(lines[1].at_ms - lines[0].at_ms);
    let gap2 = Duration::from_millis(lines[2].at_ms - lines[1].at_ms);
    assert!(
        gap1 >= min_delay_after(&retry, 1),
        "gap after attempt 1: {gap1:?}"
    );
    assert!(
        gap2 >= min_delay_after(&retry, 2),
        "gap after attempt 2: {gap2:?}"
    );
    // And not wildly more: the upper bound (d) plus the scheduler tick and slack.
    assert!(
        gap2 < Duration::from_millis(400 + 1000),
        "gap after attempt 2: {gap2:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permanent_failure_fails_the_task_and_releases_the_permit() {
    let server = RedisServer::start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let ledger = ledger_path(&dir);
    let faults = Faults {
        permanent_match: Some("invalid-number".into()),
        ..Faults::default()
    };
    let (run, permits) = start(&server, &ledger, faults).await;
    let key = "sms:invalid-number:u-1";
    let id = accepted(
        permits
            .accept(&request(key, Duration::from_secs(60), fast_retry()))
            .await
            .unwrap(),
    );
    wait_status(&permits, &id, TaskStatus::Failed, Duration::from_secs(10)).await;
    run.stop().await;
    assert_eq!(
        permits.task(&id).await.unwrap().unwrap().attempts,
        1,
        "no retry"
    );
    assert_eq!(
        permits.permit_owner(key).await.unwrap(),
        None,
        "permit released"
    );
    let again = accepted(
        permits
            .accept(&request(key, Duration::from_secs(60), fast_retry()))
            .await
            .unwrap(),
    );
    assert_ne!(again, id, "a new event with the same key is accepted again");
    let lines = read_ledger(&ledger);
    assert_eq!(lines.len(), 1);
    assert_eq!(lines[0].outcome, "permanent");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exhausted_attempts_make_the_task_dead_and_release_the_permit() {
    let server = RedisServer::start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let ledger = ledger_path(&dir);
    let (run, permits) = start(&server, &ledger, failing_first(100)).await;
    let retry = RetryPolicy {
        max_attempts: 3,
        initial: Duration::from_millis(50),
        ..fast_retry()
    };
    let id = accepted(
        permits
            .accept(&request("dead-key", Duration::from_secs(60), retry))
            .await
            .unwrap(),
    );
    wait_status(&permits, &id, TaskStatus::Dead, Duration::from_secs(10)).await;
    run.stop().await;
    let task = permits.task(&id).await.unwrap().unwrap();
    assert_eq!(task.attempts, 3);
    assert!(task.last_error.unwrap().contains("3 attempts failed"));
    assert_eq!(permits.permit_owner("dead-key").await.unwrap(), None);
    assert_eq!(read_ledger(&ledger).len(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_permit_outlives_retries_longer_than_its_window() {
    let server = RedisServer::start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let ledger = ledger_path(&dir);
    let (run, permits) = start(&server, &ledger, failing_first(2)).await;
    let window = Duration::from_millis(100);
    let retry = RetryPolicy {
        initial: Duration::from_millis(400),
        jitter: false,
        ..fast_retry()
    };
    let key = "short-window-key";
    let id = accepted(permits.accept(&request(key, window, retry)).await.unwrap());
    wait_status(&permits, &id, TaskStatus::RetryWait, Duration::from_secs(5)).await;
    // Past the window, in the middle of the retry schedule: still a duplicate.
    tokio::time::sleep(window * 2).await;
    let dup = permits.accept(&request(key, window, retry)).await.unwrap();
    assert_eq!(dup.task_id(), id);
    assert!(matches!(dup, Acceptance::Duplicate { .. }), "{dup:?}");
    wait_status(&permits, &id, TaskStatus::Sent, Duration::from_secs(10)).await;
    run.stop().await;
    let sent = sent_by_key(&read_ledger(&ledger));
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[key].len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn accepted_tasks_survive_a_redis_restart_and_get_sent_once() {
    let mut server = RedisServer::start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let ledger = ledger_path(&dir);
    let permits = server.permits(permit_config()).await.unwrap();
    let mut ids = Vec::new();
    // Accepted while no worker runs, then Redis restarts (SHUTDOWN + start, AOF).
    for i in 0..40 {
        let a = permits
            .accept(&request(
                &format!("r-{i}"),
                Duration::from_secs(600),
                fast_retry(),
            ))
            .await
            .unwrap();
        ids.push(accepted(a));
    }
    server.restart().await.unwrap();
    let (run, permits) = start(&server, &ledger, Faults::default()).await;
    for id in &ids {
        wait_status(&permits, id, TaskStatus::Sent, Duration::from_secs(15)).await;
    }
    // Redis restarts again under a running dispatcher; tasks accepted after it are sent too.
    server.restart().await.unwrap();
    let permits = server.permits(permit_config()).await.unwrap();
    for i in 40..60 {
        let a = permits
            .accept(&request(
                &format!("r-{i}"),
                Duration::from_secs(600),
                fast_retry(),
            ))
            .await
            .unwrap();
        ids.push(accepted(a));
    }
    for id in &ids {
        wait_status(&permits, id, TaskStatus::Sent, Duration::from_secs(15)).await;
    }
    run.stop().await;
    let sent = sent_by_key(&read_ledger(&ledger));
    assert_eq!(sent.len(), 60, "every task sent");
    assert!(sent.values().all(|v| v.len() == 1), "each exactly once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_finishes_and_records_the_send_in_flight() {
    let server = RedisServer::start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let ledger = ledger_path(&dir);
    let faults = Faults {
        send_delay: Duration::from_millis(500),
        ..Faults::default()
    };
    let (run, permits) = start(&server, &ledger, faults).await;
    let id = accepted(
        permits
            .accept(&request("inflight", Duration::from_secs(60), fast_retry()))
            .await
            .unwrap(),
    );
    wait_status(&permits, &id, TaskStatus::Sending, Duration::from_secs(5)).await;
    run.stop().await;
    let task = permits.task(&id).await.unwrap().unwrap();
    assert_eq!(task.status, TaskStatus::Sent, "recorded before stopping");
    assert_eq!(read_ledger(&ledger).len(), 1);
}
