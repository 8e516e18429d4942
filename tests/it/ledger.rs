//! The delivery ledger's own suite, one set of test functions run against
//! both backends: SQLite (a file in a temporary directory) and PostgreSQL
//! (the binary's shared server, a database per test). A key is claimed once;
//! re-claims by the owner succeed; updates are batched and owner-checked;
//! history lookups and the export read them back; two `Ledger`s on one
//! database racing for the same keys give each key exactly one owner.

use std::future::Future;

use pushonce::ledger::{Claim, ClaimAnswer, Ledger, Update, recipient_digest};
use pushonce_tests::postgres::PostgresServer;

/// A fresh ledger URL of `backend` and what keeps it alive.
pub(crate) async fn url(backend: &str) -> (String, Option<tempfile::TempDir>) {
    match backend {
        "sqlite" => {
            let dir = tempfile::tempdir().unwrap();
            (Ledger::sqlite_url(dir.path()), Some(dir))
        }
        _ => {
            let pg = PostgresServer::shared().await.expect("postgres starts");
            (pg.database().await.expect("a database"), None)
        }
    }
}

fn claim(key: &str, task: &str) -> Claim {
    Claim {
        key: key.into(),
        task_id: task.into(),
        channel: "sms".into(),
        policy: "per-event@1.0.0".into(),
        recipient_digest: recipient_digest("+8613800000000"),
        biz_type: "ORDER_SHIPPED".into(),
        biz_id: "o-1".into(),
        attempt: 1,
        now_ms: 1_000,
        window_ends_ms: 61_000,
        accepted_ms: 1_000,
    }
}

fn update(key: &str, task: &str, status: &str, at_ms: i64) -> Update {
    Update {
        key: key.into(),
        task_id: task.into(),
        status: status.into(),
        attempts: Some(1),
        provider_message_id: Some(format!("pm-{key}")),
        error: None,
        at_ms,
        operator_note: None,
    }
}

/// Runs `f` against each backend, as two tests (also used by `ledger_retention`).
macro_rules! both {
    ($name:ident) => {
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn sqlite() {
                super::$name("sqlite").await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn postgres() {
                super::$name("postgres").await
            }
        }
    };
}
pub(crate) use both;

both!(a_key_is_claimed_once_and_its_owner_may_claim_again);
async fn a_key_is_claimed_once_and_its_owner_may_claim_again(backend: &str) {
    let (url, _keep) = url(backend).await;
    let ledger = Ledger::open(&url).await.unwrap();
    assert_eq!(ledger.backend(), backend);
    assert_eq!(
        ledger.claim(&claim("k1", "A")).await.unwrap(),
        ClaimAnswer::Ours { first: true }
    );
    // An attempt whose claim's answer was lost claims again: still the first.
    assert_eq!(
        ledger.claim(&claim("k1", "A")).await.unwrap(),
        ClaimAnswer::Ours { first: true },
        "the same attempt's claim made twice is still the key's first"
    );
    // A retry or a re-claim of the same task finds its own claim, made by
    // an earlier attempt (one that may have sent).
    let mut again = claim("k1", "A");
    again.attempt = 2;
    assert_eq!(
        ledger.claim(&again).await.unwrap(),
        ClaimAnswer::Ours { first: false }
    );
    // Another task with the same key: Redis lost A's permit.
    assert_eq!(
        ledger.claim(&claim("k1", "B")).await.unwrap(),
        ClaimAnswer::Taken {
            owner: "A".into(),
            status: "claimed".into()
        }
    );
    assert_eq!(
        ledger.claim(&claim("k2", "B")).await.unwrap(),
        ClaimAnswer::Ours { first: true }
    );
    // Opening it again (migrations already applied) keeps the rows.
    let reopened = Ledger::open(&url).await.unwrap();
    assert_eq!(reopened.by_task("A").await.unwrap().unwrap().key, "k1");
}
both!(updates_are_batched_owner_checked_and_read_back);
async fn updates_are_batched_owner_checked_and_read_back(backend: &str) {
    let (url, _keep) = url(backend).await;
    let ledger = Ledger::open(&url).await.unwrap();
    for i in 0..300 {
        let key = format!("k{i}");
        assert_eq!(
            ledger.claim(&claim(&key, &format!("T{i}"))).await.unwrap(),
            ClaimAnswer::Ours { first: true }
        );
    }
    for i in 0..300 {
        ledger
            .update(update(
                &format!("k{i}"),
                &format!("T{i}"),
                "sent",
                2_000 + i,
            ))
            .await
            .unwrap();
    }
    // Not the owner: ignored.
    ledger
        .update(update("k0", "intruder", "failed", 9_000))
        .await
        .unwrap();
    // Older than the row's last change: ignored. Two instances' writers
    // (a worker's `unknown`, another's receipt `delivered`) may flush in
    // either order; the later change stands.
    ledger
        .update(update("k1", "T1", "delivered", 2_100))
        .await
        .unwrap();
    ledger.flush().await.unwrap();
    ledger
        .update(update("k1", "T1", "unknown", 2_050))
        .await
        .unwrap();
    ledger.flush().await.unwrap();
    let row = ledger.by_task("T7").await.unwrap().expect("T7 has a row");
    assert_eq!(row.key, "k7");
    assert_eq!(row.status, "sent");
    assert_eq!(row.provider_message_id.as_deref(), Some("pm-k7"));
    assert_eq!(row.policy, "per-event@1.0.0");
    assert_eq!(row.recipient_digest, recipient_digest("+8613800000000"));
    assert_ne!(row.recipient_digest, "+8613800000000");
    assert_eq!(ledger.by_task("T0").await.unwrap().unwrap().status, "sent");
    assert_eq!(
        ledger.by_task("T1").await.unwrap().unwrap().status,
        "delivered",
        "an older update flushed later does not undo a newer one"
    );
    assert!(ledger.by_task("intruder").await.unwrap().is_none());
    assert_eq!(
        ledger.by_event("ORDER_SHIPPED", "o-1").await.unwrap().len(),
        300
    );
    let recent = ledger.since(2_290).await.unwrap();
    let keys: Vec<&str> = recent.iter().map(|r| r.key.as_str()).collect();
    assert_eq!(
        keys,
        [
            "k290", "k291", "k292", "k293", "k294", "k295", "k296", "k297", "k298", "k299"
        ]
    );
}

both!(two_instances_racing_for_the_same_keys_give_each_key_one_owner);
async fn two_instances_racing_for_the_same_keys_give_each_key_one_owner(backend: &str) {
    let (url, _keep) = url(backend).await;
    let a = Ledger::open(&url).await.unwrap();
    let b = Ledger::open(&url).await.unwrap();
    let race = |ledger: Ledger, task: &'static str| async move {
        let mut ours = Vec::new();
        for i in 0..100 {
            let answer = ledger
                .claim(&claim(&format!("race{i}"), &format!("{task}{i}")))
                .await
                .unwrap();
            if answer == (ClaimAnswer::Ours { first: true }) {
                ours.push(i);
            }
        }
        ours
    };
    let (ta, tb) = tokio::join!(spawned(race(a, "A")), spawned(race(b, "B")));
    let mut all: Vec<i32> = ta.iter().chain(tb.iter()).copied().collect();
    all.sort();
    assert_eq!(
        all,
        (0..100).collect::<Vec<_>>(),
        "each key exactly one owner"
    );
}

async fn spawned<T: Send + 'static>(f: impl Future<Output = T> + Send + 'static) -> T {
    tokio::spawn(f).await.unwrap()
}

both!(instances_starting_together_on_a_new_ledger_all_come_up);
/// Ten `pushonce` processes opening one new ledger at the same moment (each
/// applies the migrations first), and ten more started as the first ones
/// close: every one comes up, and the schema is there once. On SQLite, sqlx
/// takes no migration lock; without the host's own, some of them failed with
/// `table deliveries already exists`. A connection opening while the file's
/// last one cleans up its WAL is answered `database is locked` at once,
/// without the busy timeout (seen in CI); opening retries it.
async fn instances_starting_together_on_a_new_ledger_all_come_up(backend: &str) {
    let (url, _keep) = url(backend).await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("pushonce.toml");
    std::fs::write(&config, format!("ledger_url = {url:?}\n")).unwrap();
    let bin = pushonce_tests::process::pushonce_bin().unwrap();
    let start = || {
        tokio::process::Command::new(&bin)
            .args(["ledger", "export", "--since", "1h", "--config"])
            .arg(&config)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    };
    let mut first: Vec<_> = (0..10).map(|_| start()).collect();
    let mut outputs = vec![first.remove(0).wait_with_output().await.unwrap()];
    let second: Vec<_> = (0..10).map(|_| start()).collect();
    for child in first.into_iter().chain(second) {
        outputs.push(child.wait_with_output().await.unwrap());
    }
    for (i, out) in outputs.iter().enumerate() {
        assert!(
            out.status.success(),
            "instance {i} failed to open the ledger: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let ledger = Ledger::open(&url).await.unwrap();
    assert_eq!(
        ledger.claim(&claim("after-start", "t1")).await.unwrap(),
        ClaimAnswer::Ours { first: true },
        "the ledger works after the racing starts"
    );
}
