//! Retention: a row leaves the ledger once its key's window has ended and
//! the configured history (`ledger_history`) has passed after that. Until
//! its window ends the row is the last line of defence for its key (a claim
//! of the key by another task is refused even when Redis lost the permit);
//! after it the row is history, for look-ups and audits.
//!
//! Removal runs off the hot path: a background task ([`Ledger::start_retention`])
//! wakes on an interval and deletes in bounded batches ([`BATCH`] rows per
//! statement, [`PAUSE`] between statements), so a claim waits behind one
//! batch at most (SQLite has one connection; PostgreSQL locks one batch's
//! rows at a time). Both backends run the same SQL.

use std::time::Duration;

use super::pool::on_pool;
use super::{Ledger, LedgerError, LedgerPool, now_ms};

/// Most rows one statement removes.
pub const BATCH: i64 = 1000;

/// The pause between two full batches (claims are written in between).
const PAUSE: Duration = Duration::from_millis(50);

/// One batch of rows whose window ended and whose last change are both at or
/// before `$1`. A row without a window's end (claimed before the ledger
/// recorded it) never matches; neither does a held (`unknown`) task's row:
/// its permit has no expiry until it is settled, and the settling writes the
/// row again. The outer conditions repeat the inner ones so a row changed
/// meanwhile (PostgreSQL re-checks them on the newest version) is kept.
const REMOVE_SQL: &str = "DELETE FROM deliveries WHERE key IN (\
    SELECT key FROM deliveries \
    WHERE window_ends_at <= $1 AND updated_at <= $1 AND status <> 'unknown' \
    LIMIT $2) \
    AND window_ends_at <= $1 AND updated_at <= $1 AND status <> 'unknown'";

/// The background removal of one process; stops when dropped.
#[derive(Debug)]
pub struct Retention(tokio::task::JoinHandle<()>);

impl Drop for Retention {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl Ledger {
    /// Removes, as of `now_ms`, every row whose key's window ended more than
    /// `keep` before, a batch at a time with a pause between full batches;
    /// answers how many rows went.
    pub async fn remove_expired(&self, keep: Duration, now_ms: i64) -> Result<u64, LedgerError> {
        remove_expired(self.pool(), cutoff(keep, now_ms)).await
    }

    /// Starts removing expired rows in the background, every
    /// [`interval`] of `keep`; a failure is logged and tried again next round.
    pub fn start_retention(&self, keep: Duration) -> Retention {
        let pool = self.pool().clone();
        Retention(tokio::spawn(async move {
            loop {
                tokio::time::sleep(interval(keep)).await;
                match remove_expired(&pool, cutoff(keep, now_ms())).await {
                    Ok(0) => {}
                    Ok(rows) => {
                        tracing::info!(rows, "ledger rows past their window and history removed")
                    }
                    Err(e) => tracing::warn!(error = %e,
                        "ledger retention: removing expired rows failed; trying again next round"),
                }
            }
        }))
    }
}

/// How often the background removal runs: a quarter of `keep`, between
/// 100 ms and a minute (a row outlives its history by at most that).
pub fn interval(keep: Duration) -> Duration {
    (keep / 4).clamp(Duration::from_millis(100), Duration::from_secs(60))
}

/// The latest window end (and last change) a removable row may have.
fn cutoff(keep: Duration, now_ms: i64) -> i64 {
    now_ms.saturating_sub(i64::try_from(keep.as_millis()).unwrap_or(i64::MAX))
}

async fn remove_expired(pool: &LedgerPool, cutoff: i64) -> Result<u64, LedgerError> {
    let mut removed = 0;
    loop {
        let batch = remove_batch(pool, cutoff).await?;
        removed += batch;
        if batch < BATCH as u64 {
            return Ok(removed);
        }
        tokio::time::sleep(PAUSE).await;
    }
}

async fn remove_batch(pool: &LedgerPool, cutoff: i64) -> Result<u64, LedgerError> {
    let done = on_pool!(pool, p => {
        sqlx::query(REMOVE_SQL)
            .bind(cutoff)
            .bind(BATCH)
            .execute(p)
            .await?
            .rows_affected()
    });
    Ok(done)
}
