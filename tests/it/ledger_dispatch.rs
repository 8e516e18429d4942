//! The dispatcher with the delivery ledger, against a real redis-server:
//! a task whose key the ledger holds for another task (Redis lost that
//! task's permit) is not sent and ends `duplicate_prevented`; while the
//! ledger (a real PostgreSQL) is down no task is sent, a shutdown gives the
//! waiting attempts back uncounted, and everything is sent once, exactly
//! once, when it is back.

use std::time::Duration;

use pushonce::ledger::Ledger;
use pushonce::permit::{AcceptRequest, Acceptance, PermitConfig, Permits, TaskStatus};
use pushonce::send::Faults;
use pushonce_tests::dispatcher::RunningDispatcher;
use pushonce_tests::fixtures::{accept_request, permit_config};
use pushonce_tests::postgres::PostgresServer;
use pushonce_tests::process::{read_ledger, sent_by_key};
use pushonce_tests::redis::RedisServer;
use pushonce_tests::wait_until;

fn request(key: &str) -> AcceptRequest {
    AcceptRequest {
        window: Duration::from_secs(3600),
        event_json: r#"{"user_id":"u-1"}"#.into(),
        ..accept_request(key)
    }
}

async fn accept(permits: &Permits, key: &str) -> String {
    match permits.accept(&request(key)).await.unwrap() {
        Acceptance::Accepted { task_id } => task_id,
        other => panic!("{key} not accepted: {other:?}"),
    }
}

pub(crate) async fn wait_status(permits: &Permits, id: &str, status: TaskStatus) {
    let ok = wait_until(Duration::from_secs(20), || {
        let (permits, id) = (permits.clone(), id.to_string());
        async move { permits.task(&id).await.unwrap().map(|t| t.status) == Some(status) }
    })
    .await;
    if ok.is_err() {
        panic!(
            "task {id} never reached {status}: {:?}",
            permits.task(id).await.unwrap()
        );
    }
}

/// Posts `event` to `host`, expects 202, and answers its task ids.
pub(crate) async fn accepted_task_ids(
    host: &pushonce_tests::host::TestHost,
    event: &serde_json::Value,
) -> Vec<String> {
    let answer = host.post("/v1/events", event, None).await.unwrap();
    assert_eq!(
        answer.status,
        reqwest::StatusCode::ACCEPTED,
        "{}",
        answer.body
    );
    answer.task_ids()
}

/// The permit layer as a test host sees it (four shards).
pub(crate) async fn host_permits(redis: &RedisServer) -> Permits {
    redis
        .permits(PermitConfig {
            shards: 4,
            ..permit_config()
        })
        .await
        .unwrap()
}

/// Drops task `id`'s record from Redis, as its retention would.
async fn forget_task(redis: &RedisServer, permits: &Permits, id: &str) {
    let mut conn = redis.manager().await.unwrap();
    redis::cmd("DEL")
        .arg(permits.layout().task(id).unwrap())
        .query_async::<()>(&mut conn)
        .await
        .unwrap();
    assert!(permits.task(id).await.unwrap().is_none());
}

fn dispatcher(
    redis: &RedisServer,
    permits: &Permits,
    file: &std::path::Path,
    ledger: &Ledger,
) -> RunningDispatcher {
    RunningDispatcher::start_claiming(
        redis.client(),
        permits.clone(),
        file,
        Faults::default(),
        4,
        Duration::from_secs(1),
        Some(ledger.clone()),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_whose_key_the_ledger_holds_for_another_is_not_sent() {
    let redis = RedisServer::start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("sent.jsonl");
    let ledger = Ledger::open(&Ledger::sqlite_url(dir.path())).await.unwrap();
    let permits = redis.permits(permit_config()).await.unwrap();
    let first = accept(&permits, "order-1:sms").await;
    let running = dispatcher(&redis, &permits, &file, &ledger);
    wait_status(&permits, &first, TaskStatus::Sent).await;
    running.stop().await;
    // Redis forgets everything it acknowledged (what a failover to a
    // lagging replica does to the permits), and the event is re-posted.
    let mut conn = redis.manager().await.unwrap();
    redis::cmd("FLUSHALL")
        .query_async::<()>(&mut conn)
        .await
        .unwrap();
    permits.prepare().await.unwrap();
    let second = accept(&permits, "order-1:sms").await;
    assert_ne!(first, second, "Redis accepted the re-post as a new task");
    let running = dispatcher(&redis, &permits, &file, &ledger);
    wait_status(&permits, &second, TaskStatus::DuplicatePrevented).await;
    running.stop().await;
    let task = permits.task(&second).await.unwrap().unwrap();
    assert_eq!(
        task.fields.get("duplicate_of"),
        Some(&first),
        "the true owner is named"
    );
    let sent = sent_by_key(&read_ledger(&file));
    assert_eq!(sent["order-1:sms"].len(), 1, "sent once: {sent:?}");
    ledger.flush().await.unwrap();
    let row = ledger
        .by_task(&first)
        .await
        .unwrap()
        .expect("the owner's row");
    assert_eq!(row.status, "sent");
}

/// A task refused for good with nothing sent releases its permit so a
/// corrected re-post is accepted; the ledger lets the key go with it, so
/// that re-post is sent (not stopped as a duplicate by the old row).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_refused_with_nothing_sent_frees_its_key_for_the_corrected_repost() {
    let redis = RedisServer::start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("sent.jsonl");
    let ledger = Ledger::open(&Ledger::sqlite_url(dir.path())).await.unwrap();
    let permits = redis.permits(permit_config()).await.unwrap();
    let key = "order-7:sms";
    let first = accept(&permits, key).await;
    // The provider refuses it for good (a bad template, say).
    let refusing = RunningDispatcher::start_claiming(
        redis.client(),
        permits.clone(),
        &file,
        Faults {
            permanent_match: Some("order-7".into()),
            ..Faults::default()
        },
        4,
        Duration::from_secs(1),
        Some(ledger.clone()),
    );
    wait_status(&permits, &first, TaskStatus::Failed).await;
    refusing.stop().await;
    assert_eq!(permits.permit_owner(key).await.unwrap(), None, "released");

    // Corrected, the event is posted again: accepted, and sent.
    let again = accept(&permits, key).await;
    let running = dispatcher(&redis, &permits, &file, &ledger);
    wait_until(Duration::from_secs(20), || {
        let (permits, again) = (permits.clone(), again.clone());
        async move {
            let status = permits.task(&again).await.unwrap().map(|t| t.status);
            status.is_some_and(|s| s != TaskStatus::Queued && s != TaskStatus::Sending)
        }
    })
    .await
    .unwrap();
    running.stop().await;
    let task = permits.task(&again).await.unwrap().unwrap();
    assert_eq!(task.status, TaskStatus::Sent, "{task:?}");
    assert_eq!(sent_by_key(&read_ledger(&file))[key].len(), 1);
    // The first task's history stays in Redis for the retention.
    let failed = permits.task(&first).await.unwrap().unwrap();
    assert_eq!(failed.status, TaskStatus::Failed);
}

/// A task claimed its key in the ledger, failed with nothing sent, and waited
/// for its retry past its permit (window and grace: a backlog, a stopped
/// dispatcher); the business service's re-post was then accepted by Redis as
/// a new task. The ledger refuses the re-post's claim, so the first task must
/// be the one to send: the message goes out once, not zero times. With
/// `first_begins_first`, the first task's retry comes before the re-post's
/// attempt and finds the re-post holding the permit (it is superseded, then
/// queued again when the re-post is refused).
async fn lapsed_claim_then_repost(first_begins_first: bool) {
    let redis = RedisServer::start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("sent.jsonl");
    let ledger = Ledger::open(&Ledger::sqlite_url(dir.path())).await.unwrap();
    let permits = redis
        .permits(PermitConfig {
            grace: Duration::from_millis(100),
            ..permit_config()
        })
        .await
        .unwrap();
    let key = "order-9:sms";
    let short = |key: &str| AcceptRequest {
        window: Duration::from_millis(300),
        retry: pushonce::permit::RetryPolicy {
            initial: Duration::from_millis(200),
            jitter: false,
            ..Default::default()
        },
        ..request(key)
    };
    let first = match permits.accept(&short(key)).await.unwrap() {
        Acceptance::Accepted { task_id } => task_id,
        other => panic!("not accepted: {other:?}"),
    };
    // Its first attempt claims the key and fails with nothing sent.
    let failing = RunningDispatcher::start_claiming(
        redis.client(),
        permits.clone(),
        &file,
        Faults {
            fail_first: 1,
            ..Faults::default()
        },
        4,
        Duration::from_secs(1),
        Some(ledger.clone()),
    );
    wait_status(&permits, &first, TaskStatus::RetryWait).await;
    failing.stop().await;
    wait_until(Duration::from_secs(10), || {
        let permits = permits.clone();
        async move { permits.permit_owner(key).await.unwrap().is_none() }
    })
    .await
    .expect("the permit lapses");
    let second = match permits.accept(&short(key)).await.unwrap() {
        Acceptance::Accepted { task_id } => task_id,
        other => panic!("the re-post was not accepted: {other:?}"),
    };
    if first_begins_first {
        let begun = permits
            .begin_attempt(&first, Duration::from_secs(5))
            .await
            .unwrap();
        assert!(
            matches!(begun, pushonce::permit::Begin::Superseded { .. }),
            "{begun:?}"
        );
    }
    let running = dispatcher(&redis, &permits, &file, &ledger);
    wait_status(&permits, &second, TaskStatus::DuplicatePrevented).await;
    wait_status(&permits, &first, TaskStatus::Sent).await;
    running.stop().await;
    let sent = sent_by_key(&read_ledger(&file));
    assert_eq!(sent.get(key).map(Vec::len), Some(1), "sent once: {sent:?}");
    assert_eq!(
        sent[key][0].task_id, first,
        "by the task that holds the key"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claimed_task_whose_permit_lapsed_sends_once_when_the_repost_is_refused() {
    lapsed_claim_then_repost(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claimed_task_superseded_by_a_refused_repost_is_queued_again_and_sends_once() {
    lapsed_claim_then_repost(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn while_the_ledger_is_down_nothing_is_sent_and_all_is_sent_once_after() {
    let redis = RedisServer::start().await.unwrap();
    let mut pg = PostgresServer::start(false).await.unwrap();
    let url = pg.database().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("sent.jsonl");
    let ledger = Ledger::open(&url).await.unwrap();
    let permits = redis.permits(permit_config()).await.unwrap();
    pg.stop().unwrap();
    let mut ids = Vec::new();
    for i in 0..12 {
        ids.push(accept(&permits, &format!("down-{i}:sms")).await);
    }
    let running = dispatcher(&redis, &permits, &file, &ledger);
    // The workers took tasks and wait for a claim.
    let waiting = wait_until(Duration::from_secs(20), || {
        let (permits, ids, ledger) = (permits.clone(), ids.clone(), ledger.clone());
        async move {
            let mut sending = 0;
            for id in &ids {
                if permits.task(id).await.unwrap().unwrap().status == TaskStatus::Sending {
                    sending += 1;
                }
            }
            // Four workers (and the reclaimer, for entries read but not yet
            // begun) hold tasks while they wait.
            sending >= 4 && ledger.unavailable().is_some()
        }
    })
    .await;
    waiting.expect("four workers wait for the ledger");
    assert!(
        read_ledger(&file).is_empty(),
        "nothing sent without a claim"
    );
    // A shutdown meanwhile gives the attempts back, uncounted.
    running.stop().await;
    for id in &ids {
        let task = permits.task(id).await.unwrap().unwrap();
        assert_eq!(
            (task.status, task.attempts),
            (TaskStatus::Queued, 0),
            "{id}"
        );
    }
    assert!(
        read_ledger(&file).is_empty(),
        "nothing sent without a claim"
    );
    pg.start_again().await.unwrap();
    let running = dispatcher(&redis, &permits, &file, &ledger);
    for id in &ids {
        wait_status(&permits, id, TaskStatus::Sent).await;
    }
    running.stop().await;
    let sent = sent_by_key(&read_ledger(&file));
    assert_eq!(sent.len(), 12);
    assert!(sent.values().all(|v| v.len() == 1), "each once: {sent:?}");
    ledger.check().await.unwrap();
    assert!(ledger.unavailable().is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lookups_fall_back_to_the_ledger_after_redis_retention() {
    use pushonce_tests::host::{TestHost, order_shipped};
    let redis = RedisServer::start().await.unwrap();
    let host = TestHost::start(&redis).await.unwrap();
    let ids = accepted_task_ids(&host, &order_shipped("o-h")).await;
    // Sent, and the outcome written to the ledger (batched, so wait for it).
    let permits = host_permits(&redis).await;
    for id in &ids {
        wait_status(&permits, id, TaskStatus::Sent).await;
    }
    // Retention: the task records and the event index expire in Redis.
    for id in &ids {
        forget_task(&redis, &permits, id).await;
    }
    for id in &ids {
        let path = format!("/v1/tasks/{id}");
        let got = wait_until(Duration::from_secs(10), || {
            let fut = host.get(&path, None);
            async move {
                let a = fut.await.unwrap();
                a.status == reqwest::StatusCode::OK
                    && a.body["status"] == "sent"
                    && a.body["from_ledger"] == true
            }
        })
        .await;
        got.unwrap_or_else(|_| panic!("task {id} not found in the ledger"));
    }
    let event = host
        .get("/v1/events/ORDER_SHIPPED/o-h", None)
        .await
        .unwrap();
    assert_eq!(event.status, reqwest::StatusCode::OK, "{}", event.body);
    let tasks = event.body["tasks"].as_array().unwrap();
    assert_eq!(tasks.len(), 3, "{}", event.body);
    assert!(
        tasks
            .iter()
            .all(|t| t["from_ledger"] == true && t["status"] == "sent")
    );
    let mine = host
        .get("/v1/events/ORDER_SHIPPED/o-h?user_id=u-42", None)
        .await
        .unwrap();
    assert_eq!(
        mine.body["tasks"].as_array().map(Vec::len),
        Some(3),
        "{}",
        mine.body
    );
    let other = host
        .get("/v1/events/ORDER_SHIPPED/o-h?user_id=u-7", None)
        .await
        .unwrap();
    assert_eq!(
        other.status,
        reqwest::StatusCode::NOT_FOUND,
        "{}",
        other.body
    );
    host.shutdown().await.unwrap();
}

/// A look-up answered from the ledger gives each task's `accepted_at` as
/// Redis gave it (the accept's time), not the time its key was claimed in
/// the ledger: here every claim comes 1.5 s after the accept (`send_at`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lookup_from_the_ledger_gives_the_accepts_time_as_redis_did() {
    use pushonce_tests::host::{TestHost, order_shipped};
    let redis = RedisServer::start().await.unwrap();
    let host = TestHost::start(&redis).await.unwrap();
    let send_at = std::time::SystemTime::now() + Duration::from_millis(1500);
    let mut event = order_shipped("o-at");
    event["send_at"] = humantime::format_rfc3339_millis(send_at).to_string().into();
    let ids = accepted_task_ids(&host, &event).await;
    assert_eq!(ids.len(), 3);
    let mut live = Vec::new();
    for id in &ids {
        let view = host.get(&format!("/v1/tasks/{id}"), None).await.unwrap();
        assert_eq!(view.body["status"], "queued", "{}", view.body);
        assert_ne!(view.body["from_ledger"], true, "{}", view.body);
        live.push(view.body["accepted_at"].clone());
    }
    let permits = host_permits(&redis).await;
    for id in &ids {
        wait_status(&permits, id, TaskStatus::Sent).await;
        forget_task(&redis, &permits, id).await;
    }
    for (id, accepted_at) in ids.iter().zip(&live) {
        let path = format!("/v1/tasks/{id}");
        let answered = wait_until(Duration::from_secs(10), || {
            let fut = host.get(&path, None);
            async move { fut.await.unwrap().body["from_ledger"] == true }
        })
        .await;
        answered.unwrap_or_else(|_| panic!("task {id} not found in the ledger"));
        let view = host.get(&path, None).await.unwrap();
        assert_eq!(
            &view.body["accepted_at"], accepted_at,
            "the ledger's accepted_at of {id} is Redis's: {}",
            view.body
        );
    }
    let event = host
        .get("/v1/events/ORDER_SHIPPED/o-at", None)
        .await
        .unwrap();
    for task in event.body["tasks"].as_array().unwrap() {
        let i = ids.iter().position(|id| task["id"] == id.as_str()).unwrap();
        assert_eq!(task["from_ledger"], true, "{task}");
        assert_eq!(task["accepted_at"], live[i], "{task}");
    }
    host.shutdown().await.unwrap();
}

/// The keys of `redis` matching `pattern` (`SCAN`, every one).
/// Waits until each of `ids` is answered `status` from the ledger (it left
/// Redis), within `deadline` each, and checks Redis no longer has its task.
async fn wait_left_redis(
    host: &pushonce_tests::host::TestHost,
    permits: &Permits,
    ids: &[String],
    status: &str,
    deadline: Duration,
) {
    for id in ids {
        let path = format!("/v1/tasks/{id}");
        let left = wait_until(deadline, || {
            let fut = host.get(&path, None);
            async move {
                let a = fut.await.unwrap();
                a.body["status"] == status && a.body["from_ledger"] == true
            }
        })
        .await;
        if left.is_err() {
            panic!("{id}: {}", host.get(&path, None).await.unwrap().body);
        }
        assert!(permits.task(id).await.unwrap().is_none());
    }
}

async fn scan(redis: &RedisServer, pattern: &str) -> Vec<String> {
    redis.keys_matching(pattern).await.unwrap()
}

/// The field names of a task view (optional fields are written when known).
fn fields(task: &serde_json::Value) -> std::collections::BTreeSet<String> {
    task.as_object().unwrap().keys().cloned().collect()
}

/// Asserts that `from_ledger` (a task view answered from the ledger) has
/// every field `live` (the same kind of view from Redis, in flight) has,
/// except the attempt and send times only Redis keeps (`live` may have been
/// read after the send: the dispatcher can be that quick).
fn same_shape(from_ledger: &serde_json::Value, live: &serde_json::Value) {
    let have = fields(from_ledger);
    let missing: Vec<String> = fields(live)
        .into_iter()
        .filter(|f| {
            !have.contains(f)
                && !["first_attempt_at", "last_attempt_at", "sent_at"].contains(&f.as_str())
        })
        .collect();
    assert!(missing.is_empty(), "missing {missing:?} in {from_ledger}");
}

/// A delivered message leaves Redis once the ledger holds its outcome: its
/// task hash, its event index and its provider-id entry are gone, only its
/// permit stays for the window (a re-post is still a duplicate), and every
/// look-up answers from the ledger with the same shape as from Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delivered_tasks_leave_redis_only_their_permits_stay_and_lookups_answer_from_the_ledger() {
    use pushonce_tests::host::{Setup, TestHost, order_shipped};
    let redis = RedisServer::start().await.unwrap();
    let host = TestHost::start_with(
        &redis,
        Setup {
            // The reconciler asks "the provider" (the development ledger) soon
            // after the send, and it answers delivered.
            configure: Some(Box::new(|c| {
                c.reconcile.sent_age = Duration::from_millis(200);
                c.reconcile.every = Duration::from_millis(100);
            })),
            ..Setup::default()
        },
    )
    .await
    .unwrap();
    let ids = accepted_task_ids(&host, &order_shipped("o-left")).await;
    assert_eq!(ids.len(), 3);
    // In flight, from Redis.
    let live = host
        .get(&format!("/v1/tasks/{}", ids[0]), None)
        .await
        .unwrap();
    assert_eq!(live.status, reqwest::StatusCode::OK, "{}", live.body);
    assert_eq!(live.body["from_ledger"], serde_json::Value::Null);
    let permits = host_permits(&redis).await;
    wait_left_redis(&host, &permits, &ids, "delivered", Duration::from_secs(20)).await;
    let after = host
        .get(&format!("/v1/tasks/{}", ids[0]), None)
        .await
        .unwrap();
    same_shape(&after.body, &live.body);
    assert_eq!(after.body["channel"], live.body["channel"]);
    assert_eq!(after.body["key"], live.body["key"]);
    // Redis keeps the permits (for the window) and nothing else of them (the
    // provider-id entries go just after the task, in their own shard).
    for pattern in ["*:task:*", "*:event:*", "*:pmid:*"] {
        let gone = wait_until(Duration::from_secs(10), || {
            let redis = &redis;
            async move { scan(redis, pattern).await.is_empty() }
        })
        .await;
        assert!(gone.is_ok(), "{pattern}: {:?}", scan(&redis, pattern).await);
    }
    let kept = scan(&redis, "*:permit:*").await;
    assert_eq!(kept.len(), 3, "{kept:?}");
    let mut conn = redis.manager().await.unwrap();
    for permit in &kept {
        let ttl: i64 = redis::cmd("PTTL")
            .arg(permit)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert!(ttl > 60_000, "{permit}: {ttl}");
    }
    // A re-post inside the window: duplicates of the tasks that left.
    let again = host
        .post("/v1/events", &order_shipped("o-left"), None)
        .await
        .unwrap();
    assert_eq!(
        again.status,
        reqwest::StatusCode::ACCEPTED,
        "{}",
        again.body
    );
    let mut dups = again.task_ids();
    dups.sort();
    let mut want = ids.clone();
    want.sort();
    assert_eq!(dups, want, "{}", again.body);
    assert!(
        again.body["results"]
            .as_array()
            .unwrap()
            .iter()
            .all(|r| r["result"] == "duplicate"),
        "{}",
        again.body
    );
    // The event and the user's tasks, from the ledger.
    let event = host
        .get("/v1/events/ORDER_SHIPPED/o-left", None)
        .await
        .unwrap();
    assert_eq!(event.status, reqwest::StatusCode::OK, "{}", event.body);
    let tasks = event.body["tasks"].as_array().unwrap();
    assert_eq!(tasks.len(), 3, "{}", event.body);
    for t in tasks {
        assert_eq!(t["status"], "delivered", "{t}");
        assert_eq!(t["from_ledger"], true, "{t}");
        same_shape(t, &live.body);
    }
    let mine = host.get("/admin/users/u-42/tasks", None).await.unwrap();
    assert_eq!(mine.status, reqwest::StatusCode::OK, "{}", mine.body);
    let listed = mine.body["tasks"].as_array().unwrap();
    assert_eq!(listed.len(), 3, "{}", mine.body);
    assert!(
        listed
            .iter()
            .all(|t| t["status"] == "delivered" && t["from_ledger"] == true)
    );
    host.shutdown().await.unwrap();
}

/// Sent for good (a channel nothing can confirm later): the task leaves
/// Redis in the record itself, once the ledger holds `sent`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_sent_for_good_leaves_redis_as_it_is_recorded() {
    use pushonce_tests::host::{Setup, TestHost, order_shipped};
    let redis = RedisServer::start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let sender = CannotTell(
        pushonce::send::LedgerFileSender::open(&dir.path().join("sent.jsonl"), Faults::default())
            .unwrap(),
    );
    let host = TestHost::start_with(
        &redis,
        Setup {
            sender: Some(std::sync::Arc::new(sender)),
            ..Setup::default()
        },
    )
    .await
    .unwrap();
    let ids = accepted_task_ids(&host, &order_shipped("o-final")).await;
    let permits = host_permits(&redis).await;
    wait_left_redis(&host, &permits, &ids, "sent", Duration::from_secs(20)).await;
    assert_eq!(scan(&redis, "*:task:*").await, Vec::<String>::new());
    assert_eq!(scan(&redis, "*:event:*").await, Vec::<String>::new());
    assert_eq!(scan(&redis, "*:permit:*").await.len(), 3);
    host.shutdown().await.unwrap();
}

/// Sent, awaiting a receipt that never comes, on a channel whose status
/// query keeps saying "pending": once the reconciler stops checking it
/// (`max_checks`), the task ended — it leaves Redis as it is recorded in
/// the ledger, and look-ups answer `sent` from the ledger.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sent_task_no_longer_checked_leaves_redis_once_the_ledger_holds_it() {
    use pushonce_tests::host::{Setup, TestHost, order_shipped};
    let redis = RedisServer::start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let sender = Pending(
        pushonce::send::LedgerFileSender::open(&dir.path().join("sent.jsonl"), Faults::default())
            .unwrap(),
    );
    let host = TestHost::start_with(
        &redis,
        Setup {
            sender: Some(std::sync::Arc::new(sender)),
            configure: Some(Box::new(|c| {
                c.reconcile.sent_age = Duration::from_millis(100);
                c.reconcile.every = Duration::from_millis(100);
                c.reconcile.max_checks = 2;
                c.reconcile.backoff.initial = Duration::from_millis(100);
                c.reconcile.backoff.max = Duration::from_millis(100);
            })),
            ..Setup::default()
        },
    )
    .await
    .unwrap();
    let ids = accepted_task_ids(&host, &order_shipped("o-untracked")).await;
    let permits = host_permits(&redis).await;
    wait_left_redis(&host, &permits, &ids, "sent", Duration::from_secs(30)).await;
    assert_eq!(scan(&redis, "*:task:*").await, Vec::<String>::new());
    assert_eq!(scan(&redis, "*:event:*").await, Vec::<String>::new());
    assert_eq!(scan(&redis, "*:permit:*").await.len(), 3);
    host.shutdown().await.unwrap();
}

/// Sent with a fallback, its status query saying "waiting" until the
/// reconciler stops checking it (`max_checks`): a receipt may still report
/// it failed, so it stays in Redis, and when the provider's report comes
/// (failed) the fallback is taken: the inbox gets the message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sent_task_no_longer_checked_keeps_its_fallback_for_a_late_failed_receipt() {
    use pushonce_tests::stack::{get_json, post_json};
    let redis = RedisServer::start().await.unwrap();
    let sim = pushonce_tests::providers::sim().await;
    let dir = tempfile::tempdir().unwrap();
    let policy = "biz_type = \"ORDER_SHIPPED\"\nkey_policy = \"per-event@^1\"\nchannels = [\"sms\"]\n\
                  window = \"1h\"\n[fallback]\nsms = \"inbox\"\n";
    let host = serve_order_shipped(&redis, &sim, dir.path(), policy, |config| {
        config.ledger_url = Some(redis.ledger_url());
        config.extra =
            "[reconcile]\nevery = \"100ms\"\nsent_age = \"100ms\"\nmax_checks = 1\n".into();
    })
    .await;
    let phone = "+8613800000077";
    sim.send_receipts_to(host.base(), 0, &[phone]);
    let event = serde_json::json!({
        "biz_type": "ORDER_SHIPPED", "biz_id": "o-late", "user_id": "u-late",
        "recipients": {"sms": phone, "inbox": "u-late"},
    });
    let client = reqwest::Client::new();
    post_json(&client, host.base(), &event).await;
    let url = host.url("/v1/events/ORDER_SHIPPED/o-late");
    let fell_back = wait_until(Duration::from_secs(30), || async {
        let Some(view) = get_json(&client, &url).await else {
            return false;
        };
        let status = |channel: &str| {
            view["tasks"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|t| t["channel"] == channel)
                .map(|t| t["status"].as_str().unwrap_or("").to_string())
        };
        status("sms").as_deref() == Some("failed")
            && status("inbox").is_some_and(|s| s == "sent" || s == "delivered")
    })
    .await;
    assert!(
        fell_back.is_ok(),
        "{:?}; log:\n{}",
        get_json(&client, &url).await,
        host.log()
    );
    assert_eq!(sim.ledger("inbox").len(), 1);
    assert!(
        host.log().contains("no longer checked"),
        "the reconciler gave up before the report came"
    );
}

/// `pushonce serve` on `redis` and `sim` in `dir`, with `policy` as its one
/// policy file; `tweak` adjusts its config first.
async fn serve_order_shipped(
    redis: &RedisServer,
    sim: &pushonce_tests::providers::Sim,
    dir: &std::path::Path,
    policy: &str,
    tweak: impl FnOnce(&mut pushonce_tests::stack::ServeConfig),
) -> pushonce_tests::stack::ServeProcess {
    let policies = dir.join("policies");
    std::fs::create_dir_all(&policies).unwrap();
    std::fs::write(policies.join("order-shipped.toml"), policy).unwrap();
    let mut config = pushonce_tests::stack::ServeConfig::new(&redis.url(), sim);
    tweak(&mut config);
    pushonce_tests::stack::ServeProcess::start(&config, dir, &policies)
        .await
        .unwrap()
}

/// The development ledger playing a provider whose status query never
/// settles a message (it says "pending" for good) and that sends no receipt.
struct Pending(pushonce::send::LedgerFileSender);

impl pushonce::send::Sender for Pending {
    fn send<'a>(
        &'a self,
        msg: &'a pushonce::send::OutgoingMessage,
    ) -> std::pin::Pin<Box<dyn Future<Output = pushonce::send::SendOutcome> + Send + 'a>> {
        self.0.send(msg)
    }

    fn check<'a>(
        &'a self,
        _: &'a pushonce::send::OutgoingMessage,
        _: Option<&'a str>,
    ) -> std::pin::Pin<Box<dyn Future<Output = pushonce::send::Check> + Send + 'a>> {
        Box::pin(async { pushonce::send::Check::CannotTell("pending at the provider".into()) })
    }

    fn takes_receipts<'a>(
        &'a self,
        _: &'a pushonce::send::OutgoingMessage,
    ) -> std::pin::Pin<Box<dyn Future<Output = bool> + Send + 'a>> {
        Box::pin(async { false })
    }
}

/// While the ledger is down, `/readyz` names it and accepts continue for
/// users whose preferences the instance read within `[preferences]
/// cache_ttl`; an event for a user it did not is refused with 503 naming
/// the preferences store (never sent to a user whose opt-out could not be
/// read; `docs/preferences.md`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_names_a_ledger_that_is_down_while_accepts_continue() {
    use pushonce_tests::host::{Setup, TestHost, order_shipped};
    let redis = RedisServer::start().await.unwrap();
    let mut pg = PostgresServer::start(false).await.unwrap();
    let url = pg.database().await.unwrap();
    let setup = Setup {
        ledger_url: Some(url),
        configure: Some(Box::new(|c| {
            c.preferences.cache_ttl = Duration::from_secs(60);
        })),
        ..Setup::default()
    };
    let host = TestHost::start_with(&redis, setup).await.unwrap();
    assert_eq!(
        host.get("/readyz", None).await.unwrap().status,
        reqwest::StatusCode::OK
    );
    // The instance reads (and holds) u-42's preferences.
    let warm = host
        .post("/v1/events", &order_shipped("o-warm"), None)
        .await
        .unwrap();
    assert_eq!(warm.status, reqwest::StatusCode::ACCEPTED, "{}", warm.body);
    pg.stop().unwrap();
    let ready = host.get("/readyz", None).await.unwrap();
    assert_eq!(
        ready.status,
        reqwest::StatusCode::SERVICE_UNAVAILABLE,
        "{}",
        ready.body
    );
    assert!(
        ready.body["detail"]
            .as_str()
            .unwrap_or("")
            .starts_with("ledger unavailable"),
        "{}",
        ready.body
    );
    let accepted = host
        .post("/v1/events", &order_shipped("o-down"), None)
        .await
        .unwrap();
    assert_eq!(
        accepted.status,
        reqwest::StatusCode::ACCEPTED,
        "{}",
        accepted.body
    );
    let mut unread = order_shipped("o-unread");
    unread["user_id"] = "u-43".into();
    let refused = host.post("/v1/events", &unread, None).await.unwrap();
    assert_eq!(
        refused.status,
        reqwest::StatusCode::SERVICE_UNAVAILABLE,
        "{}",
        refused.body
    );
    assert!(
        refused.body["detail"]
            .as_str()
            .unwrap_or("")
            .contains("the preferences store"),
        "{}",
        refused.body
    );
    assert!(
        refused.headers.contains_key("retry-after"),
        "{:?}",
        refused.headers
    );
    pg.start_again().await.unwrap();
    let back = wait_until(Duration::from_secs(20), || {
        let fut = host.get("/readyz", None);
        async move { fut.await.unwrap().status == reqwest::StatusCode::OK }
    })
    .await;
    back.expect("ready again once the ledger is back");
    host.shutdown().await.unwrap();
}

/// The development ledger playing a provider that neither dedupes a resend
/// nor answers a status query (as WeChat's template messages): an unknown
/// outcome holds the task for an operator.
/// A channel nothing can confirm later: no status query, no receipts.
struct CannotTell(pushonce::send::LedgerFileSender);

impl pushonce::send::Sender for CannotTell {
    fn send<'a>(
        &'a self,
        msg: &'a pushonce::send::OutgoingMessage,
    ) -> std::pin::Pin<Box<dyn Future<Output = pushonce::send::SendOutcome> + Send + 'a>> {
        self.0.send(msg)
    }

    fn can_check<'a>(
        &'a self,
        _: &'a pushonce::send::OutgoingMessage,
    ) -> std::pin::Pin<Box<dyn Future<Output = bool> + Send + 'a>> {
        Box::pin(async { false })
    }

    fn takes_receipts<'a>(
        &'a self,
        _: &'a pushonce::send::OutgoingMessage,
    ) -> std::pin::Pin<Box<dyn Future<Output = bool> + Send + 'a>> {
        Box::pin(async { false })
    }
}

/// Held (`unknown`) tasks through the admin API: a requeue without `force`
/// is refused (the message may be at the provider), a forced one sends
/// again under the same key; mark delivered and give up settle without a
/// send, and the ledger keeps who and why after Redis's retention.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operators_requeue_and_settle_held_tasks_and_the_ledger_keeps_who_and_why() {
    use pushonce_tests::host::{Setup, TestHost, order_shipped};
    let redis = RedisServer::start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let sent_file = dir.path().join("sent.jsonl");
    let sender = CannotTell(
        pushonce::send::LedgerFileSender::open(
            &sent_file,
            Faults {
                unknown_match: Some("o-held".into()),
                ..Faults::default()
            },
        )
        .unwrap(),
    );
    let host = TestHost::start_with(
        &redis,
        Setup {
            sender: Some(std::sync::Arc::new(sender)),
            // Nothing checks the held tasks while the operators act.
            configure: Some(Box::new(|c| {
                c.reconcile.unknown_age = Duration::from_secs(3600)
            })),
            ..Setup::default()
        },
    )
    .await
    .unwrap();
    let ids = accepted_task_ids(&host, &order_shipped("o-held")).await;
    let permits = host_permits(&redis).await;
    for id in &ids {
        wait_status(&permits, id, TaskStatus::Unknown).await;
    }
    let (requeued, delivered, given_up) = (&ids[0], &ids[1], &ids[2]);

    let blind = host
        .post(
            &format!("/admin/tasks/{requeued}/requeue"),
            &serde_json::json!({}),
            None,
        )
        .await
        .unwrap();
    assert_eq!(
        blind.status,
        reqwest::StatusCode::CONFLICT,
        "{}",
        blind.body
    );
    assert!(
        blind.body["detail"]
            .as_str()
            .unwrap()
            .contains("may already be at the provider"),
        "{}",
        blind.body
    );
    let forced = host
        .post(
            &format!("/admin/tasks/{requeued}/requeue?force=true&by=alice&why=provider+lost+it"),
            &serde_json::json!({}),
            None,
        )
        .await
        .unwrap();
    assert_eq!(forced.status, reqwest::StatusCode::OK, "{}", forced.body);
    let key = permits.task(requeued).await.unwrap().unwrap().key;
    let attempts_of = |key: String| {
        let file = sent_file.clone();
        move || {
            let key = key.clone();
            let file = file.clone();
            async move { read_ledger(&file).iter().filter(|l| l.key == key).count() == 2 }
        }
    };
    wait_until(Duration::from_secs(20), attempts_of(key))
        .await
        .expect("the forced requeue sent the held task a second time");

    let marked = host
        .post(
            &format!("/admin/tasks/{delivered}/mark-delivered?by=bob&why=the+user+has+it"),
            &serde_json::json!({}),
            None,
        )
        .await
        .unwrap();
    assert_eq!(marked.status, reqwest::StatusCode::OK, "{}", marked.body);
    assert_eq!(
        marked.body["task"]["status"], "delivered",
        "{}",
        marked.body
    );
    let gave_up = host
        .post(
            &format!("/admin/tasks/{given_up}/give-up?by=carol&why=user+left"),
            &serde_json::json!({}),
            None,
        )
        .await
        .unwrap();
    assert_eq!(gave_up.status, reqwest::StatusCode::OK, "{}", gave_up.body);
    assert_eq!(gave_up.body["task"]["status"], "failed", "{}", gave_up.body);
    let again = host
        .post(
            &format!("/admin/tasks/{delivered}/give-up?why=too+late"),
            &serde_json::json!({}),
            None,
        )
        .await
        .unwrap();
    assert_eq!(
        again.status,
        reqwest::StatusCode::CONFLICT,
        "{}",
        again.body
    );

    // Settled by an operator, the tasks leave Redis once the ledger holds
    // them (held, they stayed); the ledger says who and why, and acting on
    // one again is refused naming how it ended.
    for (id, status, by, action) in [
        (delivered, "delivered", "bob", "delivered"),
        (given_up, "failed", "carol", "given_up"),
    ] {
        let gone = wait_until(Duration::from_secs(10), || {
            let (permits, id) = (permits.clone(), id.to_string());
            async move { permits.task(&id).await.unwrap().is_none() }
        })
        .await;
        assert!(gone.is_ok(), "{id} stayed in Redis after it was settled");
        let path = format!("/v1/tasks/{id}");
        let seen = wait_until(Duration::from_secs(10), || {
            let fut = host.get(&path, None);
            async move {
                let a = fut.await.unwrap();
                a.body["from_ledger"] == true
                    && a.body["status"] == status
                    && a.body["operator_log"][0]["by"] == by
                    && a.body["operator_log"][0]["action"] == action
            }
        })
        .await;
        if seen.is_err() {
            panic!("{id}: {}", host.get(&path, None).await.unwrap().body);
        }
    }
    // Neither settled task was sent again.
    let lines = read_ledger(&sent_file);
    for id in [delivered, given_up] {
        assert_eq!(
            lines.iter().filter(|l| &l.task_id == id).count(),
            1,
            "{lines:?}"
        );
    }
    // The user's tasks: from Redis while it has them, else from the ledger.
    let mine = host.get("/admin/users/u-42/tasks", None).await.unwrap();
    assert_eq!(mine.status, reqwest::StatusCode::OK, "{}", mine.body);
    let tasks = mine.body["tasks"].as_array().unwrap();
    let found = |id: &str| tasks.iter().find(|t| t["id"] == id).cloned();
    assert_eq!(tasks.len(), 3, "{}", mine.body);
    assert_eq!(
        found(requeued).unwrap()["from_ledger"],
        serde_json::Value::Null
    );
    assert_eq!(found(delivered).unwrap()["from_ledger"], true);
    assert_eq!(found(given_up).unwrap()["status"], "failed");
    let nobody = host.get("/admin/users/u-7/tasks", None).await.unwrap();
    assert_eq!(
        nobody.body["tasks"],
        serde_json::json!([]),
        "{}",
        nobody.body
    );
    let bad = host
        .get("/admin/users/u-42/tasks?limit=0", None)
        .await
        .unwrap();
    assert_eq!(
        bad.status,
        reqwest::StatusCode::UNPROCESSABLE_ENTITY,
        "{}",
        bad.body
    );
    assert!(
        bad.body["detail"]
            .as_str()
            .unwrap()
            .contains("between 1 and"),
        "{}",
        bad.body
    );
    host.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_event_index_event_lookups_come_through_the_ledger() {
    use pushonce_tests::host::{Setup, TestHost, order_shipped};
    let redis = RedisServer::start().await.unwrap();
    let setup = Setup {
        configure: Some(Box::new(|c| c.event_index = false)),
        ..Setup::default()
    };
    let host = TestHost::start_with(&redis, setup).await.unwrap();
    let ids = accepted_task_ids(&host, &order_shipped("o-x")).await;
    assert_eq!(ids.len(), 3);
    let permits = host_permits(&redis).await;
    for id in &ids {
        wait_status(&permits, id, TaskStatus::Sent).await;
    }
    // Each task is found through its ledger row, shown as Redis has it.
    let event = host
        .get("/v1/events/ORDER_SHIPPED/o-x", None)
        .await
        .unwrap();
    assert_eq!(event.status, reqwest::StatusCode::OK, "{}", event.body);
    let tasks = event.body["tasks"].as_array().unwrap();
    let mut found: Vec<&str> = tasks.iter().map(|t| t["id"].as_str().unwrap()).collect();
    found.sort_unstable();
    let mut want: Vec<&str> = ids.iter().map(String::as_str).collect();
    want.sort_unstable();
    assert_eq!(found, want);
    assert!(
        tasks
            .iter()
            .all(|t| t["from_ledger"] != true && t["status"] == "sent" && t["event"].is_object()),
        "{}",
        event.body
    );
    // After Redis's retention, from the ledger.
    for id in &ids {
        forget_task(&redis, &permits, id).await;
    }
    let event = host
        .get("/v1/events/ORDER_SHIPPED/o-x", None)
        .await
        .unwrap();
    let tasks = event.body["tasks"].as_array().unwrap();
    assert_eq!(tasks.len(), 3, "{}", event.body);
    assert!(tasks.iter().all(|t| t["from_ledger"] == true));
    // An event none of whose tasks reached a send attempt is not found, and
    // the answer says why.
    let none = host
        .get("/v1/events/ORDER_SHIPPED/o-never", None)
        .await
        .unwrap();
    assert_eq!(none.status, reqwest::StatusCode::NOT_FOUND);
    assert!(
        none.body.to_string().contains("the event index is off"),
        "{}",
        none.body
    );
    host.shutdown().await.unwrap();
}

/// What a message keeps in Redis once it ended is its permit, and no
/// provider-id index entry: an SMS sent through a provider instance of a
/// channel with providers (`sms` → Aliyun, Tencent) is indexed under that
/// instance, where its receipt looks it up, and the entry goes, under the
/// same name, once the receipt settled it delivered (it was deleted under
/// the channel's name, and stayed for the retention); an FCM message
/// (`app-push`: no receipts, no status query) is not indexed at all (its
/// entry stayed for the window, with nothing to look it up).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ended_messages_keep_their_permits_and_no_provider_id_entries() {
    use pushonce_tests::stack::{get_json, post_json};
    let redis = RedisServer::start().await.unwrap();
    let sim = pushonce_tests::providers::sim().await;
    let dir = tempfile::tempdir().unwrap();
    let policy = "biz_type = \"ORDER_SHIPPED\"\nkey_policy = \"per-event@^1\"\nchannels = [\"sms\", \"app-push\"]\nwindow = \"1h\"\n";
    let host = serve_order_shipped(&redis, &sim, dir.path(), policy, |config| {
        config.channels = sim.toml_with_sms_providers(5, "5s");
    })
    .await;
    sim.send_sms_provider_receipts_to(host.base(), 0);
    let event = serde_json::json!({
        "biz_type": "ORDER_SHIPPED", "biz_id": "o-pmid", "user_id": "u-pmid",
        "recipients": {"sms": "+8613800000042", "app-push": "device-token-pmid"},
    });
    let client = reqwest::Client::new();
    let answer = post_json(&client, host.base(), &event).await;
    let task_of = |channel: &str| {
        answer["results"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|r| r["channel"] == channel)
            .and_then(|r| r["task_id"].as_str())
            .unwrap_or_else(|| panic!("no {channel} task: {answer}"))
            .to_string()
    };
    for (channel, ended) in [("sms", "delivered"), ("app-push", "sent")] {
        let url = host.url(&format!("/v1/tasks/{}", task_of(channel)));
        let left = wait_until(Duration::from_secs(30), || async {
            get_json(&client, &url)
                .await
                .is_some_and(|v| v["status"] == ended && v["from_ledger"] == true)
        })
        .await;
        assert!(
            left.is_ok(),
            "{channel}: {:?}; log:\n{}",
            get_json(&client, &url).await,
            host.log()
        );
    }
    let gone = wait_until(Duration::from_secs(10), || async {
        scan(&redis, "*:pmid:*").await.is_empty()
    })
    .await;
    assert!(gone.is_ok(), "{:?}", scan(&redis, "*:pmid:*").await);
    assert_eq!(scan(&redis, "*:permit:*").await.len(), 2);
}
