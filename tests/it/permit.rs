//! The permit layer against a real redis-server: one task per key under
//! concurrency, fencing of lost leases, owner-checked release, permit
//! extension, retention, and no accepted task lost across a Redis restart.

use std::time::Duration;

use pushonce::permit::{
    AcceptRequest, Acceptance, Begin, CheckAction, CheckNote, HeldCause, Outcome, PermitConfig,
    PermitFate, Permits, RecordContext, Recorded, Requeue, RetryPolicy, TaskStatus, shard_of_task,
};
use pushonce_tests::cluster::RedisCluster;
use pushonce_tests::fixtures::{accept_request, one_shard_config, permit_config};
use pushonce_tests::redis::RedisServer;
use pushonce_tests::wait_until;

fn request(key: &str, window: Duration) -> AcceptRequest {
    AcceptRequest {
        window,
        biz_id: "o-1".into(),
        event_json: r#"{"biz_type":"ORDER_SHIPPED","biz_id":"o-1","user_id":"u-42"}"#.into(),
        payload: r#"{"template":"shipped"}"#.into(),
        ..accept_request(key)
    }
}

async fn begin(
    permits: &Permits,
    task_id: &str,
    lease: Duration,
) -> Box<pushonce::permit::Attempt> {
    match permits.begin_attempt(task_id, lease).await.unwrap() {
        Begin::Begun(a) => a,
        other => panic!("expected to begin, got {other:?}"),
    }
}

/// Begins an attempt as soon as the current lease (if any) runs out.
async fn begin_when_free(
    permits: &Permits,
    task_id: &str,
    lease: Duration,
) -> Box<pushonce::permit::Attempt> {
    let start = std::time::Instant::now();
    loop {
        match permits.begin_attempt(task_id, lease).await.unwrap() {
            Begin::Begun(a) => return a,
            Begin::Busy { .. } if start.elapsed() < Duration::from_secs(5) => {
                tokio::time::sleep(Duration::from_millis(20)).await
            }
            other => panic!("expected to begin, got {other:?}"),
        }
    }
}

fn accepted(a: &Acceptance) -> String {
    match a {
        Acceptance::Accepted { task_id } => task_id.clone(),
        other => panic!("expected accepted, got {other:?}"),
    }
}

/// A thousand accepts of one key at once over eight connections, on one
/// Redis and on a Redis Cluster: one task, 999 duplicates naming it, one
/// stream entry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_concurrent_accepts_of_one_key_make_one_task() {
    let server = RedisServer::start().await.unwrap();
    let cluster = RedisCluster::start(3).await.unwrap();
    let mut single = Vec::new();
    let mut clustered = Vec::new();
    for _ in 0..8 {
        single.push(server.permits(permit_config()).await.unwrap());
        clustered.push(cluster.permits(permit_config()).await.unwrap());
    }
    for (target, layers) in [("one Redis", single), ("a Redis Cluster", clustered)] {
        one_task_from_a_thousand_accepts(target, &layers).await;
    }
}

async fn one_task_from_a_thousand_accepts(target: &str, layers: &[Permits]) {
    let key = "push:per-event@1:sms:ORDER_SHIPPED:o-1:u-42";
    let mut set = tokio::task::JoinSet::new();
    for i in 0..1000 {
        let permits = layers[i % layers.len()].clone();
        let req = request(key, Duration::from_secs(60));
        set.spawn(async move { permits.accept(&req).await.unwrap() });
    }
    let mut answers = Vec::new();
    while let Some(a) = set.join_next().await {
        answers.push(a.unwrap());
    }
    let winners: Vec<&Acceptance> = answers
        .iter()
        .filter(|a| matches!(a, Acceptance::Accepted { .. }))
        .collect();
    assert_eq!(winners.len(), 1, "{target}: exactly one accepted");
    let task_id = winners[0].task_id().to_string();
    let duplicates = answers
        .iter()
        .filter(|a| matches!(a, Acceptance::Duplicate { task_id: t, status: Some(TaskStatus::Queued) } if *t == task_id))
        .count();
    assert_eq!(
        duplicates, 999,
        "{target}: 999 duplicates naming the same queued task"
    );
    let permits = &layers[0];
    assert_eq!(
        permits.permit_owner(key).await.unwrap().as_deref(),
        Some(task_id.as_str()),
        "{target}"
    );
    // One task record, one stream entry.
    let shard = permits.layout().shard_of(key);
    let len: usize = redis::cmd("XLEN")
        .arg(permits.layout().ready(shard))
        .query_async(&mut permits.connection())
        .await
        .unwrap();
    assert_eq!(len, 1, "{target}: one stream entry");
    let task = permits.task(&task_id).await.unwrap().unwrap();
    assert_eq!(task.key, key);
    assert_eq!(task.status, TaskStatus::Queued);
    assert_eq!(task.attempts, 0);
    assert_eq!(task.retry, RetryPolicy::default());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_accepts_in_one_pipeline_and_sees_duplicates_within_it() {
    let server = RedisServer::start().await.unwrap();
    let permits = server.permits(permit_config()).await.unwrap();
    let w = Duration::from_secs(60);
    let first = permits.accept(&request("k-0", w)).await.unwrap();
    let reqs: Vec<AcceptRequest> = ["k-0", "k-1", "k-2", "k-1"]
        .iter()
        .map(|k| request(k, w))
        .collect();
    let answers = permits.accept_batch(&reqs).await.unwrap();
    assert_eq!(
        answers[0],
        Acceptance::Duplicate {
            task_id: first.task_id().to_string(),
            status: Some(TaskStatus::Queued)
        }
    );
    let k1 = accepted(&answers[1]);
    accepted(&answers[2]);
    assert_eq!(
        answers[3],
        Acceptance::Duplicate {
            task_id: k1,
            status: Some(TaskStatus::Queued)
        }
    );
    // The event index finds the event's tasks across shards.
    let mut ids = permits
        .tasks_of_event("ORDER_SHIPPED", "o-1")
        .await
        .unwrap();
    ids.sort();
    assert_eq!(ids.len(), 3);
}

/// A redis-server, its permits, and one task accepted under `key` (a
/// 60 s window).
async fn one_task(key: &str) -> (RedisServer, Permits, String) {
    one_task_in(key, Duration::from_secs(60)).await
}

/// [`one_task`] with a window of `window`.
async fn one_task_in(key: &str, window: Duration) -> (RedisServer, Permits, String) {
    let server = RedisServer::start().await.unwrap();
    let permits = server.permits(permit_config()).await.unwrap();
    let id = accepted(&permits.accept(&request(key, window)).await.unwrap());
    (server, permits, id)
}

/// The task's entry in its shard's ready stream, read as `consumer` would.
async fn read_entry(permits: &Permits, id: &str, consumer: &str) -> pushonce::permit::Entry {
    let shard = shard_of_task(id).unwrap();
    let read: redis::streams::StreamReadReply = redis::cmd("XREADGROUP")
        .arg("GROUP")
        .arg(&permits.config().group)
        .arg(consumer)
        .arg("COUNT")
        .arg(1)
        .arg("STREAMS")
        .arg(permits.layout().ready(shard))
        .arg(">")
        .query_async(&mut permits.connection())
        .await
        .unwrap();
    pushonce::permit::Entry {
        shard,
        id: read.keys[0].ids[0].id.clone(),
        task_id: id.to_string(),
    }
}

/// A reclaimer may take an entry whose worker is still sending (a slow
/// send outlives the entry's idle time, not the lease), and the worker then
/// records a retry, acking the entry. Begun from that entry, the retry
/// would have no entry left in the stream (the promoted one is not written
/// while the task is `sending`): should its worker die, nothing would ever
/// find the task. The begin answers `gone` and changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_entry_acked_after_a_reclaimer_took_it_begins_nothing() {
    let key = "reclaimed-then-acked";
    let (_server, permits, id) = one_task(key).await;
    let entry = read_entry(&permits, &id, "worker-1").await;
    let lease = Duration::from_secs(5);
    let tasks = [(id.as_str(), entry.id.as_str())];
    let a = match permits.begin_attempts(&tasks, lease).await.unwrap().pop() {
        Some(Ok(Begin::Begun(a))) => a,
        other => panic!("expected to begin, got {other:?}"),
    };
    // The reclaimer takes the entry while the worker still sends.
    let claimed = reclaim_all(&permits, &permits.layout().ready(entry.shard)).await;
    assert_eq!(claimed.claimed.len(), 1);
    let retry = Outcome::Retry {
        delay: Duration::from_secs(30),
        reason: "quota".into(),
    };
    let recorded = permits.record(&a, &retry, Some(&entry)).await.unwrap();
    assert_eq!(recorded, Recorded::Done(PermitFate::Kept));
    let late = permits.begin_attempts(&tasks, lease).await.unwrap().pop();
    assert!(matches!(late, Some(Ok(Begin::Gone))), "{late:?}");
    let task = permits.task(&id).await.unwrap().unwrap();
    assert_eq!(task.status, TaskStatus::RetryWait);
    assert_eq!(task.attempts, 1, "no attempt was begun");
}

/// A record script that stops on an error (Redis keeps its writes so far,
/// no rollback) leaves the task's stream entry pending: a reclaimer finds
/// the task and decides from what the script wrote, so a task is never
/// stranded `sending` with no entry left to find it by.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_that_fails_midway_leaves_the_entry_for_a_reclaimer() {
    let key = "strand-key";
    let (_server, permits, id) = one_task(key).await;
    let entry = read_entry(&permits, &id, "worker-1").await;
    let stream = permits.layout().ready(entry.shard);
    let mut conn = permits.connection();
    let a = begin(&permits, &id, Duration::from_millis(300)).await;
    // A field the script reads no longer parses: `sent` stops on an error.
    let task = permits.layout().task(&id).unwrap();
    let _: () = redis::cmd("HSET")
        .arg(&task)
        .arg("at")
        .arg("not a number")
        .query_async(&mut conn)
        .await
        .unwrap();
    let sent = Outcome::Sent {
        provider_message_id: "p-1".into(),
        reference: None,
    };
    let err = permits.record(&a, &sent, Some(&entry)).await;
    assert!(err.is_err(), "the script stopped: {err:?}");
    let claimed = reclaim_all(&permits, &stream).await;
    let ids: Vec<&str> = claimed.claimed.iter().map(|e| e.id.as_str()).collect();
    assert_eq!(
        ids,
        [entry.id.as_str()],
        "the entry is still there to re-claim"
    );
    // The reclaimer's begin decides from what the script wrote before it
    // stopped (here `status = sent`): nothing to send, the entry is acked.
    let settled = permits
        .begin_attempt(&id, Duration::from_millis(300))
        .await
        .unwrap();
    assert!(
        matches!(settled, Begin::Settled(TaskStatus::Sent)),
        "{settled:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_whose_lease_was_lost_cannot_overwrite() {
    let key = "fence-key";
    let (_server, permits, id) = one_task_in(key, Duration::from_secs(60)).await;
    let lease = Duration::from_millis(300);
    let a = begin(&permits, &id, lease).await;
    assert_eq!(a.number, 1);
    assert!(!a.reclaimed);
    // While A's lease lives, nobody else may begin.
    assert!(matches!(
        permits.begin_attempt(&id, lease).await.unwrap(),
        Begin::Busy { .. }
    ));
    // A's lease runs out; B takes over.
    let b = begin_when_free(&permits, &id, lease).await;
    assert_eq!(b.number, 2);
    assert!(b.reclaimed, "B took over a stale lease");
    // A comes back: it can neither extend nor record.
    assert_eq!(permits.extend_lease(&a, lease).await.unwrap(), None);
    let fenced = permits
        .record(
            &a,
            &Outcome::Failed {
                reason: "late".into(),
            },
            None,
        )
        .await
        .unwrap();
    assert_eq!(
        fenced,
        Recorded::Fenced {
            status: Some(TaskStatus::Sending)
        }
    );
    assert_eq!(permits.permit_owner(key).await.unwrap(), Some(id.clone()));
    // B records.
    let done = permits
        .record(
            &b,
            &Outcome::Sent {
                provider_message_id: "p-1".into(),
                reference: None,
            },
            None,
        )
        .await
        .unwrap();
    assert_eq!(done, Recorded::Done(PermitFate::Kept));
    let task = permits.task(&id).await.unwrap().unwrap();
    assert_eq!(task.status, TaskStatus::Sent);
    assert_eq!(task.attempts, 2);
    assert!(task.maybe_sent);
    assert_eq!(task.provider_message_id.as_deref(), Some("p-1"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permanent_failure_with_nothing_sent_releases_the_permit() {
    let key = "perm-key";
    let (_server, permits, id) = one_task_in(key, Duration::from_secs(60)).await;
    let a = begin(&permits, &id, Duration::from_secs(5)).await;
    let rec = permits
        .record(
            &a,
            &Outcome::Failed {
                reason: "invalid number".into(),
            },
            None,
        )
        .await
        .unwrap();
    assert_eq!(rec, Recorded::Done(PermitFate::Released));
    assert_eq!(permits.permit_owner(key).await.unwrap(), None);
    let task = permits.task(&id).await.unwrap().unwrap();
    assert_eq!(task.status, TaskStatus::Failed);
    // A corrected re-trigger is accepted as a new task.
    let again = accepted(
        &permits
            .accept(&request(key, Duration::from_secs(60)))
            .await
            .unwrap(),
    );
    assert_ne!(again, id);
    // A permanent failure of a task that may have been sent (re-claimed) keeps the permit.
    let key2 = "perm-key-2";
    let id2 = accepted(
        &permits
            .accept(&request(key2, Duration::from_secs(60)))
            .await
            .unwrap(),
    );
    let lease = Duration::from_millis(200);
    let _dead_worker = begin(&permits, &id2, lease).await;
    let b = begin_when_free(&permits, &id2, lease).await;
    let rec = permits
        .record(
            &b,
            &Outcome::Failed {
                reason: "arrears".into(),
            },
            None,
        )
        .await
        .unwrap();
    assert_eq!(rec, Recorded::Done(PermitFate::Kept));
    assert_eq!(permits.permit_owner(key2).await.unwrap(), Some(id2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ended_tasks_get_retention_and_sent_permits_keep_the_window() {
    let key = "ret-key";
    let window = Duration::from_secs(600);
    let (server, permits, id) = one_task_in(key, window).await;
    let ttl = task_ttl(&server, &permits, &id).await;
    assert_eq!(ttl, -1, "a live task never expires");
    let a = begin(&permits, &id, Duration::from_secs(5)).await;
    // During the attempt the permit lasts past the lease by the grace (60 s) or the window, whichever is longer.
    let during = permits.permit_ttl(key).await.unwrap().unwrap().unwrap();
    assert!(during > 590_000, "{during}");
    permits
        .record(
            &a,
            &Outcome::Sent {
                provider_message_id: "p".into(),
                reference: None,
            },
            None,
        )
        .await
        .unwrap();
    let ttl = task_ttl(&server, &permits, &id).await;
    assert!(
        ttl > 3_590_000 && ttl <= 3_600_000,
        "task retention ttl {ttl}"
    );
    let permit = permits.permit_ttl(key).await.unwrap().unwrap().unwrap();
    assert!(permit > 590_000 && permit <= 600_000, "permit ttl {permit}");
    // A receipt settles it: delivered, still within retention.
    assert!(permits.record_receipt(&id, true, None).await.unwrap());
    let task = permits.task(&id).await.unwrap().unwrap();
    assert_eq!(task.status, TaskStatus::Delivered);
}

/// The task record's time to live, ms.
async fn task_ttl(server: &RedisServer, permits: &Permits, id: &str) -> i64 {
    let mut conn = server.manager().await.unwrap();
    redis::cmd("PTTL")
        .arg(permits.layout().task(id).unwrap())
        .query_async(&mut conn)
        .await
        .unwrap()
}

/// Whether `key` exists in `server`'s Redis.
async fn exists(server: &RedisServer, key: &str) -> bool {
    let mut conn = server.manager().await.unwrap();
    let n: i64 = redis::cmd("EXISTS")
        .arg(key)
        .query_async(&mut conn)
        .await
        .unwrap();
    n == 1
}

/// Accepts `key` (its own event: biz id = key) and begins its first attempt.
async fn begun(permits: &Permits, key: &str) -> (Box<pushonce::permit::Attempt>, String) {
    let req = AcceptRequest {
        biz_id: key.into(),
        ..request(key, Duration::from_secs(30))
    };
    let id = accepted(&permits.accept(&req).await.unwrap());
    let a = begin(permits, &id, Duration::from_secs(5)).await;
    let shard = shard_of_task(&id).unwrap();
    let index = format!(
        "{}:event:{}:{}",
        permits.layout().tag(shard),
        a.task.biz_type,
        a.task.biz_id
    );
    (a, index)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_that_ended_for_good_leaves_redis_once_the_ledger_holds_it_its_permit_stays() {
    let server = RedisServer::start().await.unwrap();
    let permits = server.permits(permit_config()).await.unwrap();
    let sent = || Outcome::Sent {
        provider_message_id: "p".into(),
        reference: None,
    };
    let hour = 3_590_000..=3_600_000;
    let in_ledger = |checkable| RecordContext {
        checkable,
        ledger_holds_outcome: true,
        ..RecordContext::default()
    };
    // Sent for good (nothing can confirm it later), the ledger holding it:
    // task hash and event index gone in the record itself, the permit kept
    // for the window, and a re-post is a duplicate of the task that left.
    let (a, index) = begun(&permits, "lv-final").await;
    permits
        .record_with(&a, &sent(), None, in_ledger(false))
        .await
        .unwrap();
    assert!(!exists(&server, &permits.layout().task(&a.task_id).unwrap()).await);
    assert!(
        !exists(&server, &index).await,
        "the emptied event index is deleted"
    );
    assert_eq!(permits.task(&a.task_id).await.unwrap(), None);
    let permit = permits
        .permit_ttl("lv-final")
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!((20_000..=30_000).contains(&permit), "permit ttl {permit}");
    let again = AcceptRequest {
        biz_id: "lv-final".into(),
        ..request("lv-final", Duration::from_secs(30))
    };
    assert_eq!(
        permits.accept(&again).await.unwrap(),
        Acceptance::Duplicate {
            task_id: a.task_id.clone(),
            status: None
        }
    );
    // The same outcome the ledger did not confirm: the retention, as before.
    let (a, index) = begun(&permits, "lv-unconfirmed").await;
    let context = RecordContext {
        checkable: false,
        ..RecordContext::default()
    };
    permits
        .record_with(&a, &sent(), None, context)
        .await
        .unwrap();
    assert!(hour.contains(&task_ttl(&server, &permits, &a.task_id).await));
    assert!(exists(&server, &index).await);
    // Sent and awaiting its receipt: in flight, it stays (the retention)…
    let (a, index) = begun(&permits, "lv-awaiting").await;
    permits
        .record_with(&a, &sent(), None, in_ledger(true))
        .await
        .unwrap();
    assert!(hour.contains(&task_ttl(&server, &permits, &a.task_id).await));
    assert!(
        permits
            .record_receipt(&a.task_id, true, None)
            .await
            .unwrap()
    );
    let task = permits.task(&a.task_id).await.unwrap().unwrap();
    assert_eq!(task.status, TaskStatus::Delivered);
    // …until the ledger holds the receipt's outcome: fenced by that status.
    assert!(!permits.forget(&task, "failed").await.unwrap());
    assert!(exists(&server, &permits.layout().task(&a.task_id).unwrap()).await);
    assert!(permits.forget(&task, "delivered").await.unwrap());
    assert!(!exists(&server, &permits.layout().task(&a.task_id).unwrap()).await);
    assert!(!exists(&server, &index).await);
    assert!(permits.permit_ttl("lv-awaiting").await.unwrap().is_some());
    // Failed with its fallback taken, the ledger holding it: it leaves, not
    // listed for operators; failed without one stays listed with the retention.
    let failed = || Outcome::Failed {
        reason: "refused".into(),
    };
    let (a, _) = begun(&permits, "lv-failed-fallback").await;
    permits
        .record_with(&a, &failed(), None, in_ledger(true))
        .await
        .unwrap();
    assert_eq!(permits.task(&a.task_id).await.unwrap(), None);
    let (b, _) = begun(&permits, "lv-failed").await;
    permits.record(&b, &failed(), None).await.unwrap();
    assert!(hour.contains(&task_ttl(&server, &permits, &b.task_id).await));
    let listed: Vec<String> = permits
        .dead_tasks(10)
        .await
        .unwrap()
        .into_iter()
        .map(|(id, _)| id)
        .collect();
    assert_eq!(listed, vec![b.task_id]);
    // Held tasks stay whatever the ledger holds.
    let (a, _) = begun(&permits, "lv-unknown").await;
    let unknown = Outcome::Unknown {
        reason: "cut off".into(),
    };
    permits
        .record_with(&a, &unknown, None, in_ledger(true))
        .await
        .unwrap();
    assert_eq!(task_ttl(&server, &permits, &a.task_id).await, -1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keeping_ended_tasks_is_an_opt_in_that_keeps_them_its_time() {
    let server = RedisServer::start().await.unwrap();
    let permits = server
        .permits(PermitConfig {
            keep_ended: Some(Duration::from_secs(60)),
            ..permit_config()
        })
        .await
        .unwrap();
    let minute = 50_000..=60_000;
    let (a, index) = begun(&permits, "kp-final").await;
    let context = RecordContext {
        checkable: false,
        ledger_holds_outcome: true,
        ..RecordContext::default()
    };
    let sent = Outcome::Sent {
        provider_message_id: "p".into(),
        reference: None,
    };
    permits.record_with(&a, &sent, None, context).await.unwrap();
    let ttl = task_ttl(&server, &permits, &a.task_id).await;
    assert!(minute.contains(&ttl), "sent for good: {ttl}");
    assert!(exists(&server, &index).await);
    let (a, _) = begun(&permits, "kp-receipt").await;
    permits.record(&a, &sent, None).await.unwrap();
    assert!(
        permits
            .record_receipt(&a.task_id, true, None)
            .await
            .unwrap()
    );
    let task = permits.task(&a.task_id).await.unwrap().unwrap();
    assert!(permits.forget(&task, "delivered").await.unwrap());
    let ttl = task_ttl(&server, &permits, &a.task_id).await;
    assert!(minute.contains(&ttl), "delivered by receipt: {ttl}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_outlives_a_retry_schedule_longer_than_its_window() {
    let key = "short-window";
    let window = Duration::from_millis(200);
    let (_server, permits, id) = one_task_in(key, window).await;
    let a = begin(&permits, &id, Duration::from_millis(500)).await;
    permits
        .record(
            &a,
            &Outcome::Retry {
                delay: Duration::from_secs(2),
                reason: "503".into(),
            },
            None,
        )
        .await
        .unwrap();
    // Well past the window, the retry still waits and the permit still guards the key.
    tokio::time::sleep(Duration::from_millis(600)).await;
    let ttl = permits.permit_ttl(key).await.unwrap().unwrap().unwrap();
    assert!(ttl > 60_000, "permit kept to due + grace, ttl {ttl}");
    let dup = permits.accept(&request(key, window)).await.unwrap();
    assert_eq!(
        dup,
        Acceptance::Duplicate {
            task_id: id.clone(),
            status: Some(TaskStatus::RetryWait)
        }
    );
    // The retry comes due and is promoted to the ready stream.
    let shard = permits.layout().shard_of(key);
    wait_until(Duration::from_secs(5), || {
        let permits = permits.clone();
        async move { permits.promote_due(shard, 10).await.unwrap() == 1 }
    })
    .await
    .unwrap();
    let b = begin(&permits, &id, Duration::from_secs(5)).await;
    assert_eq!(b.number, 2);
}

/// Waits until the permit of `key` has lapsed (no owner).
async fn wait_lapsed(permits: &Permits, key: &str) {
    wait_until(Duration::from_secs(5), || {
        let permits = permits.clone();
        async move { permits.permit_owner(key).await.unwrap().is_none() }
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_whose_permit_lapsed_and_was_retaken_is_superseded() {
    let key = "lapsed";
    let window = Duration::from_millis(100);
    let (_server, permits, old) = one_task_in(key, window).await;
    // Queued longer than its window (no worker ran): the permit lapses.
    wait_lapsed(&permits, key).await;
    let new = accepted(&permits.accept(&request(key, window)).await.unwrap());
    // The old task must not send: the newer one owns the key now.
    match permits
        .begin_attempt(&old, Duration::from_secs(5))
        .await
        .unwrap()
    {
        Begin::Superseded { by } => assert_eq!(by, new),
        other => panic!("expected superseded, got {other:?}"),
    }
    assert_eq!(
        permits.task(&old).await.unwrap().unwrap().status,
        TaskStatus::Superseded
    );
    begin(&permits, &new, Duration::from_secs(5)).await;
}

/// A message that goes out after its window (a backlog held it queued)
/// keeps its key a whole window from the send, as the ledger counts its
/// row's window from the claim: a re-post right after it is a duplicate,
/// not a second message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_send_keeps_its_key_a_window_from_the_send() {
    let key = "late-send";
    let window = Duration::from_millis(300);
    let (_server, permits, id) = one_task_in(key, window).await;
    wait_lapsed(&permits, key).await;
    // The worker comes at last: it takes the permit back and sends.
    let a = begin(&permits, &id, Duration::from_secs(5)).await;
    let sent = Outcome::Sent {
        provider_message_id: "p".into(),
        reference: None,
    };
    permits.record(&a, &sent, None).await.unwrap();
    let ttl = permits.permit_ttl(key).await.unwrap().flatten();
    assert!(
        ttl.is_some_and(|ms| ms > 200),
        "a window from the send: {ttl:?}"
    );
    let again = permits.accept(&request(key, window)).await.unwrap();
    assert_eq!(
        again,
        Acceptance::Duplicate {
            task_id: id.clone(),
            status: Some(TaskStatus::Sent)
        }
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_outcome_holds_the_permit_until_a_receipt() {
    let key = "unknown-key";
    let (_server, permits, id) = one_task_in(key, Duration::from_secs(30)).await;
    let a = begin(&permits, &id, Duration::from_secs(5)).await;
    permits
        .record(
            &a,
            &Outcome::Unknown {
                reason: "timeout after send".into(),
            },
            None,
        )
        .await
        .unwrap();
    assert_eq!(
        permits.permit_ttl(key).await.unwrap(),
        Some(None),
        "held without expiry"
    );
    assert!(matches!(
        permits
            .begin_attempt(&id, Duration::from_secs(5))
            .await
            .unwrap(),
        Begin::Settled(TaskStatus::Unknown)
    ));
    assert!(
        permits
            .record_receipt(&id, true, Some("p-9"))
            .await
            .unwrap()
    );
    let ttl = permits.permit_ttl(key).await.unwrap().unwrap().unwrap();
    assert!(ttl <= 30_000, "the window again, ttl {ttl}");
    let task = permits.task(&id).await.unwrap().unwrap();
    assert_eq!(task.status, TaskStatus::Delivered);
    assert_eq!(task.provider_message_id.as_deref(), Some("p-9"));
}

/// A task accepted, attempted once and recorded `outcome`, on a permit
/// layer whose awaiting entries are due at once.
async fn recorded(permits: &Permits, key: &str, outcome: Outcome) -> String {
    let id = accepted(
        &permits
            .accept(&request(key, Duration::from_secs(30)))
            .await
            .unwrap(),
    );
    let a = begin(permits, &id, Duration::from_secs(5)).await;
    permits.record(&a, &outcome, None).await.unwrap();
    id
}

fn due_at_once() -> PermitConfig {
    PermitConfig {
        check_sent_after: Duration::ZERO,
        check_unknown_after: Duration::ZERO,
        ..permit_config()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claimed_check_is_exclusive_and_its_outcome_fenced() {
    let server = RedisServer::start().await.unwrap();
    let permits = server.permits(due_at_once()).await.unwrap();
    let key = "awaiting-key";
    let unknown = Outcome::Unknown {
        reason: "timeout after send".into(),
    };
    let id = recorded(&permits, key, unknown).await;
    let shard = shard_of_task(&id).unwrap();
    let hold = Duration::from_secs(5);
    let first = permits
        .claim_checks(shard, 10, hold, "tok-a")
        .await
        .unwrap();
    assert_eq!(first.claimed.len(), 1, "{first:?}");
    assert_eq!(first.claimed[0].status, TaskStatus::Unknown);
    assert_eq!(first.claimed[0].checks, 1);
    assert_eq!(first.awaiting, 1);
    // Held for the first claimant: another instance finds nothing due.
    let second = permits
        .claim_checks(shard, 10, hold, "tok-b")
        .await
        .unwrap();
    assert!(second.claimed.is_empty(), "{second:?}");
    let task = permits.task(&id).await.unwrap().unwrap();
    // A stale token or a wrong status writes nothing.
    for (from, token) in [(TaskStatus::Unknown, "tok-b"), (TaskStatus::Sent, "tok-a")] {
        assert!(
            !permits
                .settle_check(
                    &task,
                    from,
                    token,
                    &CheckAction::Requeue { most: 1 },
                    "absent"
                )
                .await
                .unwrap()
        );
    }
    // The claimant re-queues it, once.
    for done in [true, false] {
        assert_eq!(
            permits
                .settle_check(
                    &task,
                    TaskStatus::Unknown,
                    "tok-a",
                    &CheckAction::Requeue { most: 1 },
                    "absent"
                )
                .await
                .unwrap(),
            done
        );
    }
    let task = permits.task(&id).await.unwrap().unwrap();
    assert_eq!(task.status, TaskStatus::Queued);
    assert!(task.maybe_sent);
    assert_eq!(task.retry.max_attempts, 5, "attempts left: {task:?}");
    assert_eq!(permits.awaiting_count(shard).await.unwrap(), 0);
    assert_eq!(permits.permit_owner(key).await.unwrap(), Some(id.clone()));
    assert!(
        permits.permit_ttl(key).await.unwrap().unwrap().is_some(),
        "the permit has an expiry again"
    );
    let ready: u64 = redis::cmd("XLEN")
        .arg(permits.layout().ready(shard))
        .query_async(&mut permits.connection())
        .await
        .unwrap();
    assert_eq!(ready, 2, "the accept's entry and one requeue entry");

    // Lost again: not re-queued past its limit (1 here).
    let a = begin(&permits, &id, Duration::from_secs(5)).await;
    let lost = Outcome::Unknown {
        reason: "no answer again".into(),
    };
    permits.record(&a, &lost, None).await.unwrap();
    let pass = permits
        .claim_checks(shard, 10, hold, "tok-c")
        .await
        .unwrap();
    assert_eq!(pass.claimed[0].requeues, 1, "{pass:?}");
    let task = permits.task(&id).await.unwrap().unwrap();
    assert!(
        !permits
            .settle_check(
                &task,
                TaskStatus::Unknown,
                "tok-c",
                &CheckAction::Requeue { most: 1 },
                "absent"
            )
            .await
            .unwrap()
    );
    assert_eq!(permits.awaiting_count(shard).await.unwrap(), 1);
    // Allowed a second re-queue, it goes back to the queue.
    assert!(
        permits
            .settle_check(
                &task,
                TaskStatus::Unknown,
                "tok-c",
                &CheckAction::Requeue { most: 2 },
                "absent"
            )
            .await
            .unwrap()
    );
    let task = permits.task(&id).await.unwrap().unwrap();
    assert_eq!(task.status, TaskStatus::Queued);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn receipts_and_checks_take_tasks_out_of_the_awaiting_index() {
    let server = RedisServer::start().await.unwrap();
    let permits = server.permits(due_at_once()).await.unwrap();
    let sent = Outcome::Sent {
        provider_message_id: "p-1".into(),
        reference: None,
    };
    let a = recorded(&permits, "await-sent", sent).await;
    let shard = shard_of_task(&a).unwrap();
    assert_eq!(permits.awaiting_count(shard).await.unwrap(), 1);
    assert!(permits.record_receipt(&a, true, None).await.unwrap());
    assert_eq!(permits.awaiting_count(shard).await.unwrap(), 0);

    // Unknown, nothing can tell: dead, listed, permit kept; requeue keeps the key.
    let unknown = Outcome::Unknown {
        reason: "no answer".into(),
    };
    let key = "await-dead";
    let d = recorded(&permits, key, unknown).await;
    let shard = shard_of_task(&d).unwrap();
    let pass = permits
        .claim_checks(shard, 10, Duration::from_secs(5), "t")
        .await
        .unwrap();
    assert_eq!(pass.claimed.len(), 1);
    let task = permits.task(&d).await.unwrap().unwrap();
    assert!(
        permits
            .settle_check(
                &task,
                TaskStatus::Unknown,
                "t",
                &CheckAction::Dead,
                "nothing can tell"
            )
            .await
            .unwrap()
    );
    assert_eq!(
        permits.task(&d).await.unwrap().map(|t| t.status),
        Some(TaskStatus::Dead)
    );
    assert_eq!(permits.awaiting_count(shard).await.unwrap(), 0);
    assert!(
        permits
            .dead_tasks(10)
            .await
            .unwrap()
            .iter()
            .any(|(id, _)| *id == d)
    );
    assert_eq!(permits.permit_owner(key).await.unwrap(), Some(d.clone()));
    assert_eq!(
        permits.requeue(&d, false).await.unwrap(),
        Requeue::MaybeSent
    );
    assert!(matches!(
        permits.requeue(&d, true).await.unwrap(),
        Requeue::Requeued { .. }
    ));
    assert_eq!(permits.permit_owner(key).await.unwrap(), Some(d.clone()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_restart_with_aof_loses_no_accepted_task() {
    let mut server = RedisServer::start().await.unwrap();
    let permits = server.permits(permit_config()).await.unwrap();
    let mut ids = Vec::new();
    for i in 0..200 {
        let a = permits
            .accept(&request(&format!("restart-{i}"), Duration::from_secs(600)))
            .await
            .unwrap();
        ids.push((format!("restart-{i}"), accepted(&a)));
    }
    server.restart().await.unwrap();
    let permits = server.permits(permit_config()).await.unwrap();
    let mut conn = server.manager().await.unwrap();
    let mut entries = 0usize;
    for shard in 0..permits.layout().shards() {
        let n: usize = redis::cmd("XLEN")
            .arg(permits.layout().ready(shard))
            .query_async(&mut conn)
            .await
            .unwrap();
        entries += n;
    }
    assert_eq!(entries, 200, "every ready entry survived");
    for (key, id) in &ids {
        assert_eq!(permits.permit_owner(key).await.unwrap().as_ref(), Some(id));
        assert_eq!(
            permits.task(id).await.unwrap().unwrap().status,
            TaskStatus::Queued
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_completed_checks_count_and_each_is_logged_beside_the_cause() {
    let server = RedisServer::start().await.unwrap();
    let permits = server.permits(due_at_once()).await.unwrap();
    let cut_off = Outcome::Unknown {
        reason: "no complete answer: cut off".into(),
    };
    let id = recorded(&permits, "counted-checks", cut_off).await;
    let shard = shard_of_task(&id).unwrap();
    let claim = |token: &'static str| {
        let permits = permits.clone();
        async move {
            permits
                .claim_checks(shard, 10, Duration::from_millis(1), token)
                .await
                .unwrap()
        }
    };
    // A check claimed and never recorded (its host died, Redis restarted)
    // does not count: the next claim is check 1 again.
    assert_eq!(claim("lost").await.claimed[0].checks, 1);
    let again = std::sync::Mutex::new(None);
    wait_until(Duration::from_secs(5), || async {
        let pass = claim("tok").await;
        let due = !pass.claimed.is_empty();
        if due {
            *again.lock().unwrap() = Some(pass);
        }
        due
    })
    .await
    .unwrap();
    let again = again.into_inner().unwrap().unwrap();
    assert_eq!(again.claimed[0].checks, 1, "{again:?}");
    let task = permits.task(&id).await.unwrap().unwrap();
    let note = CheckNote {
        asked: "nothing: no status query".into(),
        answer: "cannot_tell".into(),
        detail: "channel sms has no status query".into(),
    };
    let later = CheckAction::Later(Duration::from_secs(60));
    assert!(
        permits
            .settle_check_noting(&task, TaskStatus::Unknown, "tok", &later, "why", &note)
            .await
            .unwrap()
    );
    let task = permits.task(&id).await.unwrap().unwrap();
    assert_eq!(
        task.fields.get("reconcile_checks").map(String::as_str),
        Some("1")
    );
    let log = task.reconcile_log();
    assert_eq!(log.len(), 1, "{task:?}");
    assert_eq!(
        (log[0].check, log[0].asked.as_str(), log[0].action.as_str()),
        (1, "nothing: no status query", "later")
    );
    // The reconciler wrote its check; the attempt's cause is untouched.
    assert_eq!(task.held_cause, Some(HeldCause::CutOffAfterWrite));
    assert_eq!(
        task.provider_answer.as_deref(),
        Some("no complete answer: cut off")
    );
    let held = permits.held_tasks(10).await.unwrap();
    assert!(held.iter().any(|(t, _)| *t == id), "{held:?}");
}

/// A task of `key` whose first attempt's worker vanished (after marking its
/// request started, if `started`), re-claimed by the next begin once the
/// lease ran out: its id and that attempt.
async fn reclaimed_after_vanishing(
    permits: &Permits,
    key: &str,
    started: bool,
    lease: Duration,
) -> (String, Box<pushonce::permit::Attempt>) {
    let id = accepted(
        &permits
            .accept(&request(key, Duration::from_secs(30)))
            .await
            .unwrap(),
    );
    let first = begin(permits, &id, lease).await;
    if started {
        assert!(
            permits
                .mark_request_started(&first, lease)
                .await
                .unwrap()
                .is_some()
        );
    }
    let second = begin_when_free(permits, &id, Duration::from_secs(5)).await;
    assert!(second.reclaimed);
    (id, second)
}

/// A re-claimed attempt its worker gives back before it decided on the
/// vanished worker's send (its ledger claim stopped, or marking the request
/// failed) is re-claimed again by the next worker: the provider may still
/// have the first message, so the next attempt is never sent unchecked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reclaimed_attempt_given_back_is_reclaimed_again() {
    let server = RedisServer::start().await.unwrap();
    let permits = server.permits(permit_config()).await.unwrap();
    let lease = Duration::from_millis(100);
    // The first worker vanishes mid-send; the second re-claims and gives back.
    let (id, second) = reclaimed_after_vanishing(&permits, "reclaim-given-back", true, lease).await;
    permits
        .record(&second, &Outcome::Release, None)
        .await
        .unwrap();
    let task = permits.task(&id).await.unwrap().unwrap();
    assert_eq!(task.status, TaskStatus::Queued, "{task:?}");

    let third = begin(&permits, &id, lease).await;
    assert!(third.reclaimed, "given back, still a re-claim: {third:?}");
    assert_eq!(third.number, 2, "the given-back attempt is not counted");
    assert_eq!(
        third
            .task
            .fields
            .get("vanished_request_started")
            .map(String::as_str),
        Some("1"),
        "what the first re-claim found stays"
    );
    // Once an outcome is recorded the question is answered: a later
    // attempt is no re-claim.
    let retry = Outcome::Retry {
        delay: Duration::ZERO,
        reason: "provider busy".into(),
    };
    permits.record(&third, &retry, None).await.unwrap();
    let fourth = begin(&permits, &id, lease).await;
    assert!(!fourth.reclaimed, "{fourth:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reclaimed_attempt_says_whether_the_vanished_worker_had_started_its_send() {
    let server = RedisServer::start().await.unwrap();
    let permits = server.permits(permit_config()).await.unwrap();
    let lease = Duration::from_millis(100);
    for (key, started) in [("vanished-before", false), ("vanished-after", true)] {
        // The worker vanishes; another takes the task after its lease.
        let (id, second) = reclaimed_after_vanishing(&permits, key, started, lease).await;
        assert_eq!(
            second
                .task
                .fields
                .get("vanished_request_started")
                .map(String::as_str),
            Some(if started { "1" } else { "0" }),
            "{key}"
        );
        // Held as such, the cause kept beside the host's reason.
        let held = RecordContext {
            held: Some(HeldCause::WorkerVanished {
                request_started: started,
            }),
            ..RecordContext::default()
        };
        let outcome = Outcome::Unknown {
            reason: "the worker holding the lease died mid-send".into(),
        };
        permits
            .record_with(&second, &outcome, None, held)
            .await
            .unwrap();
        let task = permits.task(&id).await.unwrap().unwrap();
        assert_eq!(task.status, TaskStatus::Unknown);
        assert_eq!(task.held_cause, held.held, "{task:?}");
        assert_eq!(task.provider_answer, None, "no answer reached a worker");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sent_task_nothing_can_check_is_final_and_not_awaited() {
    let server = RedisServer::start().await.unwrap();
    let permits = server.permits(due_at_once()).await.unwrap();
    let key = "final-sent";
    let id = accepted(
        &permits
            .accept(&request(key, Duration::from_secs(30)))
            .await
            .unwrap(),
    );
    let a = begin(&permits, &id, Duration::from_secs(5)).await;
    let sent = Outcome::Sent {
        provider_message_id: "p-1".into(),
        reference: None,
    };
    let context = RecordContext {
        checkable: false,
        ..RecordContext::default()
    };
    permits.record_with(&a, &sent, None, context).await.unwrap();
    let shard = shard_of_task(&id).unwrap();
    assert_eq!(permits.awaiting_count(shard).await.unwrap(), 0);
    let pass = permits
        .claim_checks(shard, 10, Duration::from_secs(5), "t")
        .await
        .unwrap();
    assert!(pass.claimed.is_empty(), "{pass:?}");
    let task = permits.task(&id).await.unwrap().unwrap();
    assert_eq!(task.status, TaskStatus::Sent);
    assert!(!task.fields.contains_key("awaiting_since"), "{task:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_task_held_before_the_held_index_is_listed_at_its_next_claim() {
    let server = RedisServer::start().await.unwrap();
    let permits = server.permits(due_at_once()).await.unwrap();
    let unknown = Outcome::Unknown {
        reason: "no answer".into(),
    };
    let id = recorded(&permits, "held-before", unknown).await;
    let shard = shard_of_task(&id).unwrap();
    // As a task held by an older version: not in the held index.
    let _: () = redis::cmd("ZREM")
        .arg(permits.layout().held(shard))
        .arg(&id)
        .query_async(&mut permits.connection())
        .await
        .unwrap();
    assert!(permits.held_tasks(10).await.unwrap().is_empty());
    let pass = permits
        .claim_checks(shard, 10, Duration::from_secs(5), "t")
        .await
        .unwrap();
    assert_eq!(pass.claimed.len(), 1, "{pass:?}");
    let held = permits.held_tasks(10).await.unwrap();
    assert_eq!(held.len(), 1, "{held:?}");
    assert_eq!(held[0].0, id);
}

/// Layout 2: a key naming its recipient lands in the recipient's shard, a
/// key naming nobody in its own; a second accept of each meets the same
/// permit; look-ups by key alone find both, and every transition after the
/// accept (begin, record) names the permit through the task id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_naming_its_recipient_lives_in_the_recipients_shard() {
    let server = RedisServer::start().await.unwrap();
    let permits = server.permits(permit_config()).await.unwrap();
    let layout = permits.layout().clone();
    // A user whose shard differs from the key's, so the test can tell them apart.
    let (user, named) = (0..)
        .map(|i| {
            let user = format!("user {i}");
            let key = format!(
                "push:per-event@1:sms:ORDER:o-1:{}",
                pushonce::permit::keys::key_part(&user)
            );
            (user, key)
        })
        .find(|(user, key)| layout.recipient_shard(user) != layout.shard_of(key))
        .unwrap();
    let shared = "push:per-tenant-per-hour@1:sms:tenant=acme:2026-12-03T04";
    let for_user = |key: &str, user: &str| AcceptRequest {
        recipient: Some(user.to_string()),
        ..request(key, Duration::from_secs(60))
    };
    let a = accepted(&permits.accept(&for_user(&named, &user)).await.unwrap());
    assert_eq!(shard_of_task(&a), Some(layout.recipient_shard(&user)));
    let b = accepted(&permits.accept(&for_user(shared, &user)).await.unwrap());
    assert_eq!(shard_of_task(&b), Some(layout.shard_of(shared)));
    // Another user of the shared key meets the same permit.
    match permits.accept(&for_user(shared, "u-other")).await.unwrap() {
        Acceptance::Duplicate { task_id, .. } => assert_eq!(task_id, b),
        other => panic!("expected a duplicate, got {other:?}"),
    }
    match permits.accept(&for_user(&named, &user)).await.unwrap() {
        Acceptance::Duplicate { task_id, .. } => assert_eq!(task_id, a),
        other => panic!("expected a duplicate, got {other:?}"),
    }
    assert_eq!(permits.permit_owner(&named).await.unwrap(), Some(a.clone()));
    assert_eq!(permits.permit_owner(shared).await.unwrap(), Some(b.clone()));
    assert!(permits.permit_ttl(&named).await.unwrap().unwrap().is_some());
    // The transitions find the permit in the recipient's shard: a send
    // keeps it for the window, owned by the task.
    let attempt = begin(&permits, &a, Duration::from_secs(5)).await;
    let recorded = permits
        .record(
            &attempt,
            &Outcome::Failed {
                reason: "refused".into(),
            },
            None,
        )
        .await
        .unwrap();
    assert_eq!(recorded, Recorded::Done(PermitFate::Released));
    assert_eq!(permits.permit_owner(&named).await.unwrap(), None);
}

/// The keys of `server`'s Redis matching `pattern` (SCAN, test-sized data).
async fn keys_matching(server: &RedisServer, pattern: &str) -> Vec<String> {
    server.keys_matching(pattern).await.unwrap()
}

/// `PTTL` of `key` in `server`'s Redis (-1: no expiry, -2: gone).
async fn pttl(server: &RedisServer, key: &str) -> i64 {
    let mut conn = server.manager().await.unwrap();
    redis::cmd("PTTL")
        .arg(key)
        .query_async(&mut conn)
        .await
        .unwrap()
}

/// An event for four channels is stored once: one event record holds the
/// event and each channel's payload, the four task hashes only their own
/// state, and a look-up or an attempt sees each task whole. The record
/// lives as long as its tasks: without expiry while one is in flight or
/// held, then as long as the last one kept, and it leaves with the last.
/// Record, task hashes and event index stay listpacks (layout 4): values
/// over 64 bytes are kept in pieces and read back whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_is_stored_once_for_its_channels_and_leaves_with_its_last_task() {
    let server = RedisServer::start().await.unwrap();
    let permits = server.permits(permit_config()).await.unwrap();
    // 168 bytes: three pieces; the payloads two (sms, push) or one.
    let event: std::sync::Arc<str> = r#"{"biz_type":"ORDER_SHIPPED","biz_id":"o-once","user_id":"u-42","occurred_at_ms":1718000000000,"attributes":{"carrier":"SF","note":"a long enough text"}}"#.into();
    assert!(event.len() > 128);
    let channels = ["sms", "inbox", "push", "wechat"];
    let requests: Vec<AcceptRequest> = channels
        .iter()
        .map(|channel| {
            let key = format!("push:per-event@1:{channel}:ORDER_SHIPPED:o-once:u-42");
            AcceptRequest {
                channel: channel.to_string(),
                event_json: event.clone(),
                payload: payload_of(channel),
                biz_id: "o-once".into(),
                recipient: Some("u-42".into()),
                ..accept_request(&key)
            }
        })
        .collect();
    let ids: Vec<String> = permits
        .accept_batch(&requests)
        .await
        .unwrap()
        .iter()
        .map(accepted)
        .collect();
    let records = keys_matching(&server, "*:event:*").await;
    assert_eq!(records.len(), 1, "one event record: {records:?}");
    let record = &records[0];
    let mut conn = server.manager().await.unwrap();
    let fields: Vec<String> = redis::cmd("HKEYS")
        .arg(record)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(
        fields.iter().filter(|f| !f.starts_with('+')).count(),
        3 + channels.len(),
        "its text number, event, meta and 4 payloads, and their further pieces: {fields:?}"
    );
    assert!(fields.len() > 3 + channels.len(), "{fields:?}");
    let shard = shard_of_task(&ids[0]).unwrap();
    assert_eq!(
        record,
        &format!("{}:event:ORDER_SHIPPED:o-once", permits.layout().tag(shard)),
        "the record is named by the event: it is the event's index too"
    );
    let mut looked_up = permits
        .tasks_of_event("ORDER_SHIPPED", "o-once")
        .await
        .unwrap();
    looked_up.sort();
    let mut sorted = ids.clone();
    sorted.sort();
    assert_eq!(looked_up, sorted, "a look-up by event finds the four tasks");
    let mut packed = vec![record.clone()];
    packed.extend(ids.iter().map(|id| permits.layout().task(id).unwrap()));
    for key in &packed {
        let encoding: String = redis::cmd("OBJECT")
            .arg("ENCODING")
            .arg(key)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(encoding, "listpack", "{key}");
    }
    for (id, channel) in ids.iter().zip(channels) {
        let task_key = permits.layout().task(id).unwrap();
        let own: Vec<String> = redis::cmd("HKEYS")
            .arg(&task_key)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert!(
            !own.iter()
                .any(|f| f == "event" || f == "payload" || f == "spec"),
            "the task hash holds no copy of the event: {own:?}"
        );
        let task = permits.task(id).await.unwrap().unwrap();
        assert_eq!(task.event_json, &*event);
        assert_eq!(task.payload, payload_of(channel));
        assert_eq!(
            (task.channel.as_str(), task.biz_id.as_str()),
            (channel, "o-once")
        );
        assert_eq!(task.policy_name, "per-event");
        assert_eq!(task.retry, RetryPolicy::default());
    }
    // The same event again: four duplicates, no second record.
    for answer in permits.accept_batch(&requests).await.unwrap() {
        assert!(matches!(answer, Acceptance::Duplicate { .. }), "{answer:?}");
    }
    assert_eq!(keys_matching(&server, "*:event:*").await.len(), 1);

    let in_ledger = RecordContext {
        checkable: false,
        ledger_holds_outcome: true,
        ..RecordContext::default()
    };
    let sent = Outcome::Sent {
        provider_message_id: "p".into(),
        reference: None,
    };
    // Two channels sent for good leave Redis; the record stays, without
    // expiry, for the two still open, and an attempt sees its payload.
    for (id, request) in ids.iter().zip(&requests).take(2) {
        let a = begin(&permits, id, Duration::from_secs(5)).await;
        assert_eq!(a.task.payload, request.payload);
        assert_eq!(a.task.event_json, &*event);
        permits
            .record_with(&a, &sent, None, in_ledger)
            .await
            .unwrap();
        assert_eq!(permits.task(id).await.unwrap(), None);
    }
    assert_eq!(pttl(&server, record).await, -1);
    let left: Vec<String> = redis::cmd("HKEYS")
        .arg(record)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(
        !left
            .iter()
            .any(|f| f.contains(&*ids[0]) || f.contains(&*ids[1])),
        "the payloads of the tasks that left went, pieces and all: {left:?}"
    );
    // The third sent and awaiting its receipt (kept for the retention), the
    // fourth held: the record has no expiry while one is held.
    let third = begin(&permits, &ids[2], Duration::from_secs(5)).await;
    let awaiting = RecordContext {
        checkable: true,
        ..RecordContext::default()
    };
    permits
        .record_with(&third, &sent, None, awaiting)
        .await
        .unwrap();
    let fourth = begin(&permits, &ids[3], Duration::from_secs(5)).await;
    let unknown = Outcome::Unknown {
        reason: "cut off".into(),
    };
    permits
        .record_with(&fourth, &unknown, None, awaiting)
        .await
        .unwrap();
    assert_eq!(
        pttl(&server, record).await,
        -1,
        "a held task keeps its record"
    );
    // The held one delivered by a receipt: both kept for the retention, the
    // record as long as the last of them.
    assert!(permits.record_receipt(&ids[3], true, None).await.unwrap());
    let kept = pttl(&server, record).await;
    assert!((3_590_000..=3_600_000).contains(&kept), "record ttl {kept}");
    // Once the ledger holds their outcomes they leave, and so does the record.
    for id in &ids[2..] {
        let task = permits.task(id).await.unwrap().unwrap();
        if task.status == TaskStatus::Sent {
            assert!(permits.record_receipt(id, true, None).await.unwrap());
        }
        let task = permits.task(id).await.unwrap().unwrap();
        assert!(permits.forget(&task, "delivered").await.unwrap());
    }
    assert!(
        keys_matching(&server, "*:event:*").await.is_empty(),
        "the record left with its last task"
    );
    assert!(keys_matching(&server, "*:task:*").await.is_empty());
}

/// An event's record in a shard is shared by every accept of that event
/// there (layout 5: it is the event's index): a re-post naming another
/// channel names the text the record holds, and another user's event under
/// the same business ids (a different text) gets a text of its own; each
/// task sees its own event, and a look-up by event finds all three.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn accepts_of_one_event_share_its_record_each_task_keeping_its_own_text() {
    let server = RedisServer::start().await.unwrap();
    // One shard: both users' keys land in the same record.
    let permits = server.permits(one_shard_config()).await.unwrap();
    let event_of = |user: &str| -> std::sync::Arc<str> {
        format!(r#"{{"biz_type":"ORDER_SHIPPED","biz_id":"o-shared","user_id":"{user}","occurred_at_ms":1718000000000,"attributes":{{"carrier":"SF"}}}}"#).into()
    };
    let accept = |user: &str, channel: &str| AcceptRequest {
        channel: channel.to_string(),
        event_json: event_of(user),
        biz_id: "o-shared".into(),
        recipient: Some(user.to_string()),
        ..accept_request(&format!(
            "push:per-event@1:{channel}:ORDER_SHIPPED:o-shared:{user}"
        ))
    };
    let sms = accepted(&permits.accept(&accept("u-1", "sms")).await.unwrap());
    let push = accepted(&permits.accept(&accept("u-1", "push")).await.unwrap());
    let other = accepted(&permits.accept(&accept("u-2", "sms")).await.unwrap());
    let records = keys_matching(&server, "*:event:*").await;
    assert_eq!(records.len(), 1, "one record for the event: {records:?}");
    let mut conn = server.manager().await.unwrap();
    let fields: Vec<String> = redis::cmd("HKEYS")
        .arg(&records[0])
        .query_async(&mut conn)
        .await
        .unwrap();
    let texts: Vec<&String> = fields
        .iter()
        .filter(|f| f.starts_with('e') && !f.starts_with('+'))
        .collect();
    assert_eq!(texts.len(), 2, "one text per distinct event: {fields:?}");
    for (id, user) in [(&sms, "u-1"), (&push, "u-1"), (&other, "u-2")] {
        let task = permits.task(id).await.unwrap().unwrap();
        assert_eq!(task.event_json, &*event_of(user), "task {id}");
        assert_eq!(task.biz_id, "o-shared");
    }
    let mut found = permits
        .tasks_of_event("ORDER_SHIPPED", "o-shared")
        .await
        .unwrap();
    found.sort();
    let mut all = vec![sms.clone(), push.clone(), other.clone()];
    all.sort();
    assert_eq!(found, all);
    // u-1's two tasks are cancelled and leave; u-2's still finds its own text.
    for id in [&sms, &push] {
        permits.cancel(id, "o-shared", false).await.unwrap();
        let task = permits.task(id).await.unwrap().unwrap();
        assert!(permits.forget(&task, "cancelled").await.unwrap());
        assert_eq!(permits.task(id).await.unwrap(), None);
    }
    let task = permits.task(&other).await.unwrap().unwrap();
    assert_eq!(task.event_json, &*event_of("u-2"));
    assert_eq!(
        pttl(&server, &records[0]).await,
        -1,
        "an open task keeps it"
    );
    assert_eq!(
        permits
            .tasks_of_event("ORDER_SHIPPED", "o-shared")
            .await
            .unwrap(),
        vec![other.clone()]
    );
}

/// A channel's payload in the event test: over 64 bytes for two of them.
fn payload_of(channel: &str) -> String {
    if channel == "sms" || channel == "push" {
        format!(
            r#"{{"template":"shipped-{channel}","params":{{"order":"o-once","carrier":"SF","eta":"tomorrow"}}}}"#
        )
    } else {
        format!(r#"{{"template":"shipped-{channel}"}}"#)
    }
}

/// A namespace records the key layout version that writes it; a host of
/// this version refuses one whose marker names another, saying which and
/// how to move on, and takes it once the marker is cleared after a drain.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_of_another_layout_version_is_refused_by_name() {
    let server = RedisServer::start().await.unwrap();
    let permits = server.permits(permit_config()).await.unwrap();
    permits.prepare().await.unwrap();
    let marker = permits.layout().marker();
    let mut conn = server.manager().await.unwrap();
    let written: String = redis::cmd("GET")
        .arg(&marker)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(written, pushonce::permit::LAYOUT_VERSION.to_string());
    redis::cmd("SET")
        .arg(&marker)
        .arg("2")
        .query_async::<()>(&mut conn)
        .await
        .unwrap();
    let err = permits.prepare().await.unwrap_err().to_string();
    assert!(
        err.contains("layout version 2") && err.contains(&marker) && err.contains("drain"),
        "{err}"
    );
    redis::cmd("DEL")
        .arg(&marker)
        .query_async::<()>(&mut conn)
        .await
        .unwrap();
    permits.prepare().await.unwrap();
}

/// An event's channels accepted together in one shard share one ready
/// entry (one queue write per event, not per channel). The entry stays
/// pending until none of its tasks needs it: a worker that recorded one
/// channel and died sending the other leaves the entry to a reclaimer,
/// which finds the unfinished task; the entry goes once both are recorded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_events_channels_share_one_ready_entry_kept_until_none_needs_it() {
    let server = RedisServer::start().await.unwrap();
    let permits = server.permits(one_shard_config()).await.unwrap();
    let channel = |name: &str| AcceptRequest {
        channel: name.into(),
        recipient: Some("u-42".into()),
        ..request(
            &format!("push:per-event@1:{name}:ORDER_SHIPPED:o-1:u-42"),
            Duration::from_secs(60),
        )
    };
    let answers = permits
        .accept_batch(&[channel("sms"), channel("wechat")])
        .await
        .unwrap();
    let ids: Vec<String> = answers.iter().map(accepted).collect();
    let stream = permits.layout().ready(0);
    let mut conn = permits.connection();
    let entries = |consumer: &'static str| {
        let (permits, stream) = (permits.clone(), stream.clone());
        async move {
            let read: redis::streams::StreamReadReply = redis::cmd("XREADGROUP")
                .arg("GROUP")
                .arg(&permits.config().group)
                .arg(consumer)
                .arg("STREAMS")
                .arg(&stream)
                .arg(">")
                .query_async(&mut permits.connection())
                .await
                .unwrap();
            read.keys
                .iter()
                .flat_map(|k| &k.ids)
                .flat_map(|e| {
                    let tasks: String = e.get("task").unwrap_or_default();
                    pushonce::permit::Entry::of_stream_entry(0, &e.id, &tasks)
                })
                .collect::<Vec<_>>()
        }
    };
    let read = entries("worker-1").await;
    assert_eq!(
        read.iter().map(|e| e.task_id.clone()).collect::<Vec<_>>(),
        ids,
        "one entry names both tasks"
    );
    assert_eq!(read[0].id, read[1].id, "one entry: {read:?}");
    let lease = Duration::from_millis(300);
    let begun = permits
        .begin_attempts(&[(&ids[0], &read[0].id), (&ids[1], &read[1].id)], lease)
        .await
        .unwrap();
    let attempts: Vec<_> = begun
        .into_iter()
        .map(|b| match b {
            Ok(Begin::Begun(a)) => a,
            other => panic!("expected to begin, got {other:?}"),
        })
        .collect();
    let sent = Outcome::Sent {
        provider_message_id: "p-1".into(),
        reference: None,
    };
    permits
        .record(&attempts[0], &sent, Some(&read[0]))
        .await
        .unwrap();
    assert_eq!(
        pending_entries(&permits, &stream).await,
        1,
        "the entry waits for the other channel"
    );
    // worker-1 dies sending the second channel; a reclaimer takes the entry.
    reclaim_all(&permits, &stream).await;
    assert_eq!(
        permits.ack_entries(0, &[&read[0].id]).await.unwrap(),
        0,
        "not acked while a task of it is sending"
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    let again = loop {
        let answers = permits
            .begin_attempts(&[(&ids[0], &read[0].id), (&ids[1], &read[1].id)], lease)
            .await
            .unwrap();
        match &answers[..] {
            [Ok(Begin::Settled(_)), Ok(Begin::Begun(a))] => break a.clone(),
            [Ok(Begin::Settled(_)), Ok(Begin::Busy { .. })]
                if std::time::Instant::now() < deadline =>
            {
                tokio::time::sleep(Duration::from_millis(20)).await
            }
            other => panic!("expected the first settled and the second begun, got {other:?}"),
        }
    };
    assert!(
        again.reclaimed,
        "the second channel is re-claimed: {again:?}"
    );
    permits.record(&again, &sent, Some(&read[1])).await.unwrap();
    assert_eq!(
        pending_entries(&permits, &stream).await,
        0,
        "acked once both are recorded"
    );
    let len: usize = redis::cmd("XLEN")
        .arg(&stream)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(len, 0, "and deleted");
    for id in &ids {
        let task = permits.task(id).await.unwrap().unwrap();
        assert_eq!(task.status, TaskStatus::Sent, "{task:?}");
    }
}

/// How many entries of `stream` are read and not acked (`XPENDING`'s count).
async fn pending_entries(permits: &Permits, stream: &str) -> i64 {
    let summary: redis::Value = redis::cmd("XPENDING")
        .arg(stream)
        .arg(&permits.config().group)
        .query_async(&mut permits.connection())
        .await
        .unwrap();
    match summary {
        redis::Value::Array(items) => match items.first() {
            Some(redis::Value::Int(n)) => *n,
            other => panic!("XPENDING answered {other:?}"),
        },
        other => panic!("XPENDING answered {other:?}"),
    }
}

/// Every pending entry of `stream`, claimed by a consumer named "reclaimer"
/// (`XAUTOCLAIM … 0 0-0`: as if their workers died).
async fn reclaim_all(permits: &Permits, stream: &str) -> redis::streams::StreamAutoClaimReply {
    redis::cmd("XAUTOCLAIM")
        .arg(stream)
        .arg(&permits.config().group)
        .arg("reclaimer")
        .arg(0)
        .arg("0-0")
        .query_async(&mut permits.connection())
        .await
        .unwrap()
}
