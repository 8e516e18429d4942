//! The delivery ledger does not grow forever, on both backends (SQLite, and
//! the binary's shared PostgreSQL): a row leaves once its key's window ended
//! and `ledger_history` passed after that, in batches; rows inside that time,
//! held tasks' rows and rows from before the ledger recorded windows stay.
//! Through a running host: a key inside its window is still refused after
//! Redis lost its permit (nothing is sent twice), and a row whose window and
//! history are over is removed, never before.

use std::time::Duration;

use pushonce::ledger::{Claim, ClaimAnswer, Ledger, LedgerPool, Update, now_ms, recipient_digest};
use pushonce::permit::TaskStatus;
use pushonce_tests::host::{Setup, TestHost, order_shipped};
use pushonce_tests::process::{read_ledger, sent_by_key};
use pushonce_tests::redis::RedisServer;
use pushonce_tests::wait_until;

use crate::ledger::{both, url};
use crate::ledger_dispatch::{accepted_task_ids, host_permits, wait_status};

/// A claim of `key` by `task` at 1 s whose window ends at `window_ends_ms`.
fn claim(key: &str, task: &str, window_ends_ms: i64) -> Claim {
    Claim {
        key: key.into(),
        task_id: task.into(),
        channel: "sms".into(),
        policy: "per-event@1.0.0".into(),
        recipient_digest: recipient_digest("u-1"),
        biz_type: "ORDER_SHIPPED".into(),
        biz_id: key.into(),
        attempt: 1,
        now_ms: 1_000,
        window_ends_ms,
        accepted_ms: 1_000,
    }
}

async fn claim_ours(ledger: &Ledger, key: &str, task: &str, window_ends_ms: i64) {
    let answer = ledger
        .claim(&claim(key, task, window_ends_ms))
        .await
        .unwrap();
    assert!(
        matches!(answer, ClaimAnswer::Ours { .. }),
        "{key}: {answer:?}"
    );
}

/// Writes `status` on `task`'s row of `key`, changed at `at_ms`.
async fn settle(ledger: &Ledger, key: &str, task: &str, status: &str, at_ms: i64) {
    let update = Update {
        key: key.into(),
        task_id: task.into(),
        status: status.into(),
        attempts: Some(1),
        provider_message_id: None,
        error: None,
        at_ms,
        operator_note: None,
    };
    ledger.update(update).await.unwrap();
}

/// Makes `key`'s row look claimed before the ledger recorded windows.
async fn forget_window(ledger: &Ledger, key: &str) {
    let sql = "UPDATE deliveries SET window_ends_at = NULL WHERE key = $1";
    let changed = match ledger.pool() {
        LedgerPool::Sqlite(p) => sqlx::query(sql)
            .bind(key)
            .execute(p)
            .await
            .map(|r| r.rows_affected()),
        LedgerPool::Postgres(p) => sqlx::query(sql)
            .bind(key)
            .execute(p)
            .await
            .map(|r| r.rows_affected()),
    };
    assert_eq!(changed.unwrap(), 1, "{key}");
}

/// The keys left in the ledger, sorted.
async fn keys_left(ledger: &Ledger) -> Vec<String> {
    let mut keys: Vec<String> = ledger
        .since(0)
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.key)
        .collect();
    keys.sort();
    keys
}

both!(rows_past_their_window_and_history_are_removed_in_batches);
async fn rows_past_their_window_and_history_are_removed_in_batches(backend: &str) {
    let (url, _keep) = url(backend).await;
    let ledger = Ledger::open(&url).await.unwrap();
    // More than two batches of rows whose windows ended at 10 s.
    let old = 2 * pushonce::ledger::retention::BATCH as usize + 500;
    let mut claims = tokio::task::JoinSet::new();
    for i in 0..old {
        let ledger = ledger.clone();
        claims.spawn(async move {
            claim_ours(&ledger, &format!("old-{i:05}"), &format!("T{i}"), 10_000).await
        });
    }
    claims.join_all().await;
    // Window ended at 20 s: inside its 30 s of history at 45 s.
    claim_ours(&ledger, "history", "H", 20_000).await;
    // Window still open at 45 s.
    claim_ours(&ledger, "open", "O", 50_000).await;
    // Window over, but the task changed at 20 s (settled late).
    claim_ours(&ledger, "late", "L", 10_000).await;
    settle(&ledger, "late", "L", "delivered", 20_000).await;
    // Window over, but held for an operator: its permit has no expiry.
    claim_ours(&ledger, "held", "U", 10_000).await;
    settle(&ledger, "held", "U", "unknown", 2_000).await;
    // Claimed before windows were recorded: kept until backfilled.
    claim_ours(&ledger, "legacy", "G", 10_000).await;
    ledger.flush().await.unwrap();
    forget_window(&ledger, "legacy").await;

    let removed = ledger
        .remove_expired(Duration::from_secs(30), 45_000)
        .await
        .unwrap();
    assert_eq!(removed, old as u64);
    assert_eq!(
        keys_left(&ledger).await,
        ["held", "history", "late", "legacy", "open"]
    );
    // Nothing more to remove at the same time; at 51 s "history" goes too.
    let again = ledger.remove_expired(Duration::from_secs(30), 45_000);
    assert_eq!(again.await.unwrap(), 0);
    let later = ledger.remove_expired(Duration::from_secs(30), 51_000);
    assert_eq!(later.await.unwrap(), 2, "history and late");
    assert_eq!(keys_left(&ledger).await, ["held", "legacy", "open"]);
    // A removed key is free: its window and history are over.
    claim_ours(&ledger, "old-00000", "T-new", 90_000).await;
}

both!(the_owners_next_claim_moves_the_window_end_later_and_no_other_claim_does);
async fn the_owners_next_claim_moves_the_window_end_later_and_no_other_claim_does(backend: &str) {
    let (url, _keep) = url(backend).await;
    let ledger = Ledger::open(&url).await.unwrap();
    let window_end = |task: &'static str| {
        let ledger = ledger.clone();
        async move {
            ledger
                .by_task(task)
                .await
                .unwrap()
                .unwrap()
                .window_ends_at_ms
        }
    };
    claim_ours(&ledger, "k", "A", 10_000).await;
    // A requeued task's next attempt: a fresh window in Redis.
    claim_ours(&ledger, "k", "A", 70_000).await;
    assert_eq!(window_end("A").await, Some(70_000));
    // An earlier end never shortens it.
    claim_ours(&ledger, "k", "A", 30_000).await;
    assert_eq!(window_end("A").await, Some(70_000));
    // Another task's claim is refused and changes nothing.
    let other = ledger.claim(&claim("k", "B", 99_000)).await.unwrap();
    assert!(matches!(other, ClaimAnswer::Taken { ref owner, .. } if owner == "A"));
    assert_eq!(window_end("A").await, Some(70_000));
    // A row from before windows were recorded gets one from its owner's next claim.
    forget_window(&ledger, "k").await;
    claim_ours(&ledger, "k", "A", 80_000).await;
    assert_eq!(window_end("A").await, Some(80_000));
}

/// One channel, the `per-event` key, a window of `window`.
fn policy(biz_type: &str, window: &str) -> String {
    format!(
        "biz_type = \"{biz_type}\"\nkey_policy = \"per-event@^1\"\nchannels = [\"sms\"]\nwindow = \"{window}\"\n"
    )
}

/// An event of `biz_type` (sent by SMS).
fn event(biz_type: &str, biz_id: &str) -> serde_json::Value {
    let mut e = order_shipped(biz_id);
    e["biz_type"] = biz_type.into();
    e
}

/// History kept after a window in the host test.
const HISTORY: Duration = Duration::from_secs(2);

both!(
    a_key_inside_its_window_is_refused_without_its_permit_and_rows_leave_after_window_and_history
);
async fn a_key_inside_its_window_is_refused_without_its_permit_and_rows_leave_after_window_and_history(
    backend: &str,
) {
    let redis = RedisServer::start().await.unwrap();
    let (ledger_url, _keep) = url(backend).await;
    let host = TestHost::start_with(
        &redis,
        Setup {
            ledger_url: (backend == "postgres").then(|| ledger_url.clone()),
            policies: Some(vec![
                ("brief.toml".into(), policy("BRIEF", "2s")),
                ("long.toml".into(), policy("LONG", "1h")),
            ]),
            configure: Some(Box::new(|c| c.ledger_history = HISTORY)),
            ..Setup::default()
        },
    )
    .await
    .unwrap();
    let ledger = Ledger::open(&host.ledger_url).await.unwrap();
    let permits = host_permits(&redis).await;
    let brief = accepted_task_ids(&host, &event("BRIEF", "b-1"))
        .await
        .remove(0);
    let long = accepted_task_ids(&host, &event("LONG", "l-1"))
        .await
        .remove(0);
    for id in [&brief, &long] {
        wait_status(&permits, id, TaskStatus::Sent).await;
    }
    // The row's window ends a window after the accept at the earliest.
    let accepted = permits.task(&brief).await.unwrap().unwrap().accepted_at_ms;
    let brief_gone_after = i64::try_from(accepted).unwrap() + ms(Duration::from_secs(2) + HISTORY);

    // The brief key's row leaves once its window and history are over, not before.
    let gone = wait_until(Duration::from_secs(30), || {
        let ledger = ledger.clone();
        let brief = brief.clone();
        async move { ledger.by_task(&brief).await.unwrap().is_none() }
    })
    .await;
    gone.expect("the brief key's row is removed after its window and history");
    let now = now_ms();
    assert!(
        now >= brief_gone_after,
        "removed at {now}, before its window and history ended at {brief_gone_after}"
    );

    // Redis loses the long key's permit inside its window (after removals
    // past the brief key's window and history ran); the re-post is accepted
    // again, and the ledger refuses it.
    let key = permits.task(&long).await.unwrap().unwrap().key;
    let mut conn = redis.manager().await.unwrap();
    redis::cmd("DEL")
        .arg(
            permits
                .layout()
                .permit_in(pushonce::permit::shard_of_task(&long).unwrap(), &key),
        )
        .query_async::<()>(&mut conn)
        .await
        .unwrap();
    let again = accepted_task_ids(&host, &event("LONG", "l-1"))
        .await
        .remove(0);
    assert_ne!(again, long, "Redis accepted the re-post as a new task");
    wait_status(&permits, &again, TaskStatus::DuplicatePrevented).await;
    let sent = sent_by_key(&read_ledger(&host.ledger()));
    assert_eq!(sent[&key].len(), 1, "sent once: {sent:?}");
    let kept = ledger
        .by_task(&long)
        .await
        .unwrap()
        .expect("the long key's row");
    assert_eq!(kept.status, "sent");
    host.shutdown().await.unwrap();
}

fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap()
}
