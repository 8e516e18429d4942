//! The delivery ledger's cost, measured in one run (`cargo bench -p
//! pushonce-tests --bench ledger`, or `cargo run --release -p
//! pushonce-tests --bin …` equivalents): end-to-end sends per second of an
//! in-process dispatcher with the ledger off, on SQLite and on PostgreSQL
//! (fsync on, a real server), as ratios against "off"; then the ledger
//! alone: claims per second (the synchronous write), batched outcome rows
//! per second, and bytes per row on disk. Prints a table.

use std::time::{Duration, Instant};

use pushonce::ledger::{Claim, Ledger, Update, recipient_digest};
use pushonce::permit::{AcceptRequest, PermitConfig, RetryPolicy};
use pushonce::send::Faults;
use pushonce_tests::dispatcher::RunningDispatcher;
use pushonce_tests::postgres::PostgresServer;
use pushonce_tests::redis::RedisServer;
use pushonce_tests::wait_until;

/// Tasks sent end to end per backend.
const TASKS: usize = 3000;
/// Ledger rows claimed and updated per backend.
const ROWS: usize = 5000;
/// Concurrent claimers (like workers).
const CONCURRENCY: usize = 16;

fn request(i: usize, run: &str) -> AcceptRequest {
    AcceptRequest {
        key: format!("bench:{run}:{i}"),
        channel: "sms".into(),
        window: Duration::from_secs(3600),
        biz_type: "BENCH".into(),
        biz_id: format!("{run}-{i}"),
        event_json: r#"{"user_id":"u-1"}"#.into(),
        payload: r#"{"template":"t"}"#.into(),
        policy_name: "per-event".into(),
        policy_version: "1.0.0".into(),
        retry: RetryPolicy::default(),
        gate: Default::default(),
        recipient: None,
        send_at_ms: None,
    }
}

/// Accepts `TASKS` tasks, then times a dispatcher sending them all.
async fn sends_per_second(redis: &RedisServer, run: &str, ledger: Option<Ledger>) -> f64 {
    let permits = redis.permits(PermitConfig::default()).await.unwrap();
    let reqs: Vec<AcceptRequest> = (0..TASKS).map(|i| request(i, run)).collect();
    for chunk in reqs.chunks(500) {
        permits.accept_batch(chunk).await.unwrap();
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("sent.jsonl");
    let started = Instant::now();
    let running = RunningDispatcher::start_claiming(
        redis.client(),
        permits.clone(),
        &file,
        Faults::default(),
        CONCURRENCY,
        Duration::from_secs(30),
        ledger,
    );
    wait_until(Duration::from_secs(300), || {
        let file = file.clone();
        async move {
            std::fs::read_to_string(&file)
                .map(|t| t.lines().count() >= TASKS)
                .unwrap_or(false)
        }
    })
    .await
    .expect("every task sent");
    let rate = TASKS as f64 / started.elapsed().as_secs_f64();
    running.stop().await;
    rate
}

/// Claims then updates `ROWS` rows, `CONCURRENCY` claimers at once: (claims/s, updates/s).
async fn rows_per_second(ledger: &Ledger) -> (f64, f64) {
    let started = Instant::now();
    let mut set = tokio::task::JoinSet::new();
    for w in 0..CONCURRENCY {
        let ledger = ledger.clone();
        set.spawn(async move {
            for i in (w..ROWS).step_by(CONCURRENCY) {
                ledger.claim(&claim(i)).await.unwrap();
            }
        });
    }
    while set.join_next().await.is_some() {}
    let claims = ROWS as f64 / started.elapsed().as_secs_f64();
    let started = Instant::now();
    for i in 0..ROWS {
        ledger.update(update(i)).await.unwrap();
    }
    ledger.flush().await.unwrap();
    (claims, ROWS as f64 / started.elapsed().as_secs_f64())
}

fn claim(i: usize) -> Claim {
    Claim {
        key: format!("push:per-event@1:sms:BENCH:row-{i}:u-{i}"),
        task_id: format!("{}-1764561600000-{i:08x}", i % 16),
        channel: "sms".into(),
        policy: "per-event@1.0.0".into(),
        recipient_digest: recipient_digest(&format!("u-{i}")),
        biz_type: "BENCH".into(),
        biz_id: format!("row-{i}"),
        attempt: 1,
        now_ms: 1_764_561_600_000,
        window_ends_ms: 1_764_561_600_000 + 86_400_000,
        accepted_ms: 1_764_561_600_000,
    }
}

fn update(i: usize) -> Update {
    let c = claim(i);
    Update {
        key: c.key,
        task_id: c.task_id,
        status: "sent".into(),
        attempts: Some(1),
        provider_message_id: Some(format!("pm-{i:016x}")),
        error: None,
        at_ms: 1_764_561_601_000,
        operator_note: None,
    }
}

/// Bytes on disk per row: SQLite file (+ WAL) size, PostgreSQL's table with indexes.
async fn bytes_per_row(
    ledger: &Ledger,
    sqlite_dir: Option<&std::path::Path>,
    pg_url: Option<&str>,
) -> f64 {
    if let Some(dir) = sqlite_dir {
        // Into the main file first: a WAL not yet checkpointed is not the row's size.
        if let pushonce::ledger::LedgerPool::Sqlite(pool) = ledger.pool() {
            sqlx::query("PRAGMA wal_checkpoint(TRUNCATE)")
                .execute(pool)
                .await
                .unwrap();
        }
        let size: u64 = std::fs::read_dir(dir)
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| {
                e.file_name()
                    .to_string_lossy()
                    .starts_with("ledger.sqlite3")
            })
            .map(|e| e.metadata().map(|m| m.len()).unwrap_or(0))
            .sum();
        return size as f64 / ROWS as f64;
    }
    let pool = sqlx::PgPool::connect(pg_url.unwrap()).await.unwrap();
    let (size,): (i64,) = sqlx::query_as("SELECT pg_total_relation_size('deliveries')")
        .fetch_one(&pool)
        .await
        .unwrap();
    size as f64 / ROWS as f64
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let redis = RedisServer::start().await.unwrap();
    let pg = PostgresServer::start(true).await.unwrap();
    let sqlite_dir = tempfile::tempdir().unwrap();
    let sqlite = Ledger::open(&Ledger::sqlite_url(sqlite_dir.path()))
        .await
        .unwrap();
    let pg_url = pg.database().await.unwrap();
    let postgres = Ledger::open(&pg_url).await.unwrap();

    let off = sends_per_second(&redis, "off", None).await;
    let on_sqlite = sends_per_second(&redis, "sqlite", Some(sqlite.clone())).await;
    let on_pg = sends_per_second(&redis, "postgres", Some(postgres.clone())).await;

    let rows_dir = tempfile::tempdir().unwrap();
    let rows_sqlite = Ledger::open(&Ledger::sqlite_url(rows_dir.path()))
        .await
        .unwrap();
    let rows_pg_url = pg.database().await.unwrap();
    let rows_pg = Ledger::open(&rows_pg_url).await.unwrap();
    let (sq_claims, sq_updates) = rows_per_second(&rows_sqlite).await;
    let (pg_claims, pg_updates) = rows_per_second(&rows_pg).await;
    let sq_bytes = bytes_per_row(&rows_sqlite, Some(rows_dir.path()), None).await;
    let pg_bytes = bytes_per_row(&rows_pg, None, Some(&rows_pg_url)).await;

    println!(
        "ledger benchmark: {TASKS} tasks end to end, {CONCURRENCY} workers, LedgerFileSender; {ROWS} rows"
    );
    println!("| ledger | sends/s | vs off | claims/s | outcome rows/s (batched) | bytes/row |");
    println!("|---|---|---|---|---|---|");
    println!("| off | {off:.0} | 1.00 | — | — | — |");
    println!(
        "| SQLite (WAL) | {on_sqlite:.0} | {:.2} | {sq_claims:.0} | {sq_updates:.0} | {sq_bytes:.0} |",
        on_sqlite / off
    );
    println!(
        "| PostgreSQL (fsync on) | {on_pg:.0} | {:.2} | {pg_claims:.0} | {pg_updates:.0} | {pg_bytes:.0} |",
        on_pg / off
    );
}
