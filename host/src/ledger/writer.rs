//! The batched writer: updates after the claim (attempts, outcomes,
//! receipts, reconciler answers) go through a bounded queue to one task that
//! writes them in one transaction per batch — up to [`WriterConfig::batch`]
//! rows, or whatever arrived within [`WriterConfig::linger`] — so the ledger
//! is not one round trip per send. A batch that fails is retried (the
//! ledger may be down) until it is written; the queue then fills and
//! pushers wait: nothing is dropped.

use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use super::pool::on_pool;
use super::{LedgerError, LedgerPool};

/// Settings of the writer.
#[derive(Debug, Clone)]
pub(crate) struct WriterConfig {
    /// Updates queued at most before pushers wait.
    pub queue: usize,
    /// Most rows per transaction.
    pub batch: usize,
    /// How long the writer waits for more rows after the first of a batch.
    pub linger: Duration,
}

impl Default for WriterConfig {
    fn default() -> Self {
        WriterConfig {
            queue: 8192,
            batch: 256,
            linger: Duration::from_millis(5),
        }
    }
}

/// A change of the row of `key`, applied only while `task_id` owns it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Update {
    /// The row's key.
    pub key: String,
    /// The task that owns it (a row owned by another task is left alone).
    pub task_id: String,
    /// New status (`sending`, `sent`, `delivered`, `failed`, …).
    pub status: String,
    /// Attempts so far, when known.
    pub attempts: Option<u32>,
    /// The provider's message id, when known.
    pub provider_message_id: Option<String>,
    /// The last error, when there is one.
    pub error: Option<String>,
    /// When, ms since the epoch.
    pub at_ms: i64,
    /// Who settled the task by hand and why, when an operator did.
    pub operator_note: Option<String>,
}

enum Job {
    Row(Update),
    Flush(oneshot::Sender<()>),
}

/// The queue's sending side.
#[derive(Clone)]
pub(super) struct WriterHandle(mpsc::Sender<Job>);

impl WriterHandle {
    pub(super) async fn push(&self, update: Update) -> Result<(), LedgerError> {
        self.0
            .send(Job::Row(update))
            .await
            .map_err(|_| LedgerError::WriterStopped)
    }

    pub(super) async fn flush(&self) -> Result<(), LedgerError> {
        let (tx, rx) = oneshot::channel();
        self.0
            .send(Job::Flush(tx))
            .await
            .map_err(|_| LedgerError::WriterStopped)?;
        rx.await.map_err(|_| LedgerError::WriterStopped)
    }
}

/// Starts the writer task on `pool`; it ends when every handle is dropped,
/// after writing what was queued.
pub(super) fn spawn(pool: LedgerPool, config: WriterConfig) -> WriterHandle {
    let (tx, rx) = mpsc::channel(config.queue.max(1));
    tokio::spawn(run(pool, config, rx));
    WriterHandle(tx)
}

async fn run(pool: LedgerPool, config: WriterConfig, mut rx: mpsc::Receiver<Job>) {
    let mut rows = Vec::with_capacity(config.batch);
    let mut waiters = Vec::new();
    while let Some(first) = rx.recv().await {
        take(first, &mut rows, &mut waiters);
        let deadline = tokio::time::Instant::now() + config.linger;
        while rows.len() < config.batch && waiters.is_empty() {
            match tokio::time::timeout_at(deadline, rx.recv()).await {
                Ok(Some(job)) => take(job, &mut rows, &mut waiters),
                _ => break,
            }
        }
        write_until_done(&pool, &rows).await;
        rows.clear();
        for w in waiters.drain(..) {
            let _ = w.send(());
        }
    }
}

fn take(job: Job, rows: &mut Vec<Update>, waiters: &mut Vec<oneshot::Sender<()>>) {
    match job {
        Job::Row(u) => rows.push(u),
        Job::Flush(w) => waiters.push(w),
    }
}

/// Writes `rows`, retrying with a growing pause while the ledger fails.
async fn write_until_done(pool: &LedgerPool, rows: &[Update]) {
    let mut pause = Duration::from_millis(50);
    while let Err(e) = write(pool, rows).await {
        tracing::warn!(error = %e, rows = rows.len(), "ledger batch write failed; retrying");
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_secs(2));
    }
}

/// The owner's row only, and never backwards in time: instances' writers
/// flush independently, so a worker's older `unknown` may reach the database
/// after another instance's newer `delivered` (a receipt that raced it); the
/// later change stands (`updated_at`, the host clocks').
const UPDATE_SQL: &str = "UPDATE deliveries SET status = $3, \
    attempts = COALESCE($4, attempts), \
    provider_message_id = COALESCE($5, provider_message_id), \
    last_error = COALESCE($6, last_error), updated_at = $7, \
    operator_note = COALESCE($8, operator_note) \
    WHERE key = $1 AND task_id = $2 AND updated_at <= $7";

/// One transaction for the whole batch.
async fn write(pool: &LedgerPool, rows: &[Update]) -> Result<(), LedgerError> {
    if rows.is_empty() {
        return Ok(());
    }
    on_pool!(pool, p => {
        let mut tx = p.begin().await?;
        for u in rows {
            sqlx::query(UPDATE_SQL)
                .bind(&u.key)
                .bind(&u.task_id)
                .bind(&u.status)
                .bind(u.attempts.map(|a| a as i32))
                .bind(&u.provider_message_id)
                .bind(&u.error)
                .bind(u.at_ms)
                .bind(&u.operator_note)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
    });
    Ok(())
}
