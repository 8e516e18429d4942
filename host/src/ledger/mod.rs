//! The delivery ledger: one row per idempotency key, `UNIQUE (key)`, in SQL
//! (SQLite embedded by default, PostgreSQL shared by every instance). The
//! last line of defence against a Redis that lost acknowledged permits (an
//! asynchronous replica promoted after a failover): before the first send
//! of a task the dispatcher claims its key here ([`Ledger::claim`]); a key
//! already claimed by another task means that task was accepted and sent
//! before, and this one must not send. Outcomes after the claim go through
//! a batched background writer ([`writer`]); the rows are also the durable
//! history that Redis's retention drops ([`history`]), kept for a
//! configured time after each key's window ends ([`retention`]).

pub mod claim;
pub mod history;
pub(crate) mod identity;
pub mod opted_out;
mod pool;
pub mod preferences;
pub mod retention;
pub mod writer;

use std::sync::{Arc, Mutex};
use std::time::Duration;

pub use claim::{Claim, ClaimAnswer, recipient_digest};
pub use history::LedgerRow;
pub use pool::LedgerPool;
pub use retention::Retention;
pub use writer::Update;

/// How long a settlement written outside the worker (a receipt, a
/// reconciler check, an operator) waits for the ledger to confirm it before
/// the task is left in Redis with its retention instead of leaving.
pub const CONFIRM_WITHIN: Duration = Duration::from_secs(5);

/// Now, ms since the epoch (the host's clock: ledger times are for audits).
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// Errors of the ledger.
#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    /// The database refused or could not be reached.
    #[error("ledger database: {0}")]
    Sql(#[from] sqlx::Error),
    /// Applying the schema's migrations failed.
    #[error("ledger migrations: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// The lock that serialises SQLite migrations between instances could
    /// not be taken.
    #[error(
        "ledger migrations: cannot lock {path:?} (instances starting together take turns on it): {reason}"
    )]
    MigrationLock {
        /// The lock file beside the database.
        path: std::path::PathBuf,
        /// Why.
        reason: String,
    },
    /// A `ledger_url` that names no supported database.
    #[error("ledger_url {0:?} is neither sqlite:… nor postgres://…")]
    BadUrl(String),
    /// The background writer stopped (the process is shutting down).
    #[error("the ledger writer has stopped")]
    WriterStopped,
    /// The group of claims this one was written with failed.
    #[error("{0}")]
    Group(#[source] Arc<LedgerError>),
}

/// How long opening retries a SQLite ledger that answers `database is
/// locked` at once (see [`opened_while_busy`]).
const OPEN_BUSY_WAIT: Duration = Duration::from_secs(30);

/// Connects, migrates and reads the identity, again while SQLite answers
/// `database is locked` without waiting its busy timeout: it does so to a
/// connection that opens while the last other connection of the file is
/// cleaning up its WAL, or while another recovers one
/// (<https://www.sqlite.org/wal.html#sometimes_queries_return_sqlite_busy_in_wal_mode>).
/// That happens when instances and `pushonce ledger export` start and stop
/// together on one file; a connection already open is never the last one,
/// so only opening needs this.
async fn opened_while_busy(url: &str) -> Result<(LedgerPool, String), LedgerError> {
    let deadline = tokio::time::Instant::now() + OPEN_BUSY_WAIT;
    loop {
        let attempt = async {
            let pool = LedgerPool::connect(url).await?;
            pool.migrate().await?;
            let id = identity::read_or_create(&pool).await?;
            Ok::<_, LedgerError>((pool, id))
        };
        match attempt.await {
            Err(e) if e.is_sqlite_busy() && tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            done => return done,
        }
    }
}

impl LedgerError {
    /// SQLite's `database is locked` (`SQLITE_BUSY` or one of its extended codes).
    fn is_sqlite_busy(&self) -> bool {
        let sql = match self {
            LedgerError::Sql(e) => e,
            LedgerError::Migrate(
                sqlx::migrate::MigrateError::Execute(e)
                | sqlx::migrate::MigrateError::ExecuteMigration(e, _),
            ) => e,
            LedgerError::Group(inner) => return inner.is_sqlite_busy(),
            _ => return false,
        };
        const SQLITE_BUSY: i64 = 5;
        let sqlx::Error::Database(d) = sql else {
            return false;
        };
        d.try_downcast_ref::<sqlx::sqlite::SqliteError>().is_some()
            && d.code()
                .and_then(|c| c.parse::<i64>().ok())
                .is_some_and(|c| c & 0xff == SQLITE_BUSY)
    }
}

/// The ledger of one process (cheap to clone): the pool, the batched
/// writer's queue and the last health observed.
#[derive(Clone)]
pub struct Ledger {
    pool: LedgerPool,
    /// Reads of the accept path (`LedgerPool::for_reads`).
    reads: LedgerPool,
    claimer: claim::Claimer,
    writer: writer::WriterHandle,
    health: Arc<Mutex<Option<String>>>,
    id: Arc<str>,
}

impl std::fmt::Debug for Ledger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ledger")
            .field("backend", &self.pool.backend())
            .finish()
    }
}

impl Ledger {
    /// Opens the ledger at `url` (`sqlite:<path>` or `postgres://…`),
    /// applies the migrations and starts the batched writer.
    pub async fn open(url: &str) -> Result<Ledger, LedgerError> {
        let (pool, id) = opened_while_busy(url).await?;
        let writer = writer::spawn(pool.clone(), writer::WriterConfig::default());
        Ok(Ledger {
            id: id.into(),
            claimer: claim::Claimer::spawn(pool.clone()),
            reads: pool.for_reads(),
            pool,
            writer,
            health: Arc::new(Mutex::new(None)),
        })
    }

    /// The SQLite ledger file in `data_dir` (`ledger.sqlite3`, WAL).
    pub fn sqlite_url(data_dir: &std::path::Path) -> String {
        format!("sqlite:{}", data_dir.join("ledger.sqlite3").display())
    }

    /// `sqlite` or `postgres`.
    pub fn backend(&self) -> &'static str {
        self.pool.backend()
    }

    /// The ledger's identity: a random id written into it by the first
    /// instance that opened it, the same for every instance sharing it.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The pool, for lookups and export.
    pub fn pool(&self) -> &LedgerPool {
        &self.pool
    }

    /// Claims `claim.key` for `claim.task_id` (insert; on conflict, the
    /// owner): one synchronous write, committed together with the claims
    /// of other workers waiting at the same moment. Records the ledger's health.
    pub async fn claim(&self, claim: &Claim) -> Result<ClaimAnswer, LedgerError> {
        let answer = self.claimer.claim(claim).await;
        self.observe(answer.as_ref().err());
        answer
    }

    /// Claims each of `claims` like [`Ledger::claim`], all in one
    /// transaction (a dispatcher's batch); answers in order.
    pub async fn claim_all(&self, claims: &[Claim]) -> Result<Vec<ClaimAnswer>, LedgerError> {
        let claims: Vec<(Claim, Option<String>)> =
            claims.iter().map(|c| (c.clone(), None)).collect();
        self.claim_all_at(&claims).await
    }

    /// [`Ledger::claim_all`] of claims each with the [`recipient_digest`] of
    /// the address its message goes to (`None`: not known), kept in the row
    /// so that an opt-out by address finds its users
    /// ([`Ledger::users_at_addresses`]).
    pub async fn claim_all_at(
        &self,
        claims: &[(Claim, Option<String>)],
    ) -> Result<Vec<ClaimAnswer>, LedgerError> {
        let answer = self.claimer.claim_all(claims).await;
        self.observe(answer.as_ref().err());
        answer
    }

    /// Queues an update of a claimed row for the batched writer (waits
    /// while the queue is full).
    pub async fn update(&self, update: Update) -> Result<(), LedgerError> {
        self.writer.push(update).await
    }

    /// Writes the settlement of a task by a receipt, the reconciler
    /// (`delivered`, `failed`, `dead`; `error`: the last error recorded with
    /// it, else the row's stays) or an operator (`note`: who and why)
    /// and waits, at most [`CONFIRM_WITHIN`], until it is written: true when
    /// it is (the task may then leave Redis). A failure is logged (the ledger
    /// is history here: the claim is what guards sends); the writer keeps
    /// retrying what it queued.
    pub(crate) async fn write_settled(
        &self,
        key: &str,
        task_id: &str,
        status: &str,
        error: Option<String>,
        note: Option<String>,
    ) -> bool {
        let update = Update {
            key: key.to_string(),
            task_id: task_id.to_string(),
            status: status.to_string(),
            attempts: None,
            provider_message_id: None,
            error,
            at_ms: now_ms(),
            operator_note: note,
        };
        self.update_confirmed(update, CONFIRM_WITHIN).await
    }

    /// A receipt naming a task that already left Redis: its ledger row, if
    /// it is `channel`'s and still `sent` or `unknown` (the task ended sent
    /// for good, or the receipt raced its record), becomes `status`. Redis is
    /// not touched (the task is not resurrected). A task whose payload has a
    /// fallback does not leave while a receipt may still fail it
    /// (`dispatch/worker.rs`, `ends_for_good`), so no fallback is lost
    /// here. True when written.
    pub(crate) async fn settle_late(&self, task_id: &str, channel: &str, status: &str) -> bool {
        let row = match self.by_task(task_id).await {
            Ok(Some(row)) => row,
            Ok(None) => return false,
            Err(e) => {
                tracing::warn!(task = %task_id, error = %e, "could not read the ledger row of a late receipt");
                return false;
            }
        };
        if row.channel != channel || !matches!(row.status.as_str(), "sent" | "unknown") {
            return false;
        }
        tracing::info!(task = %task_id, %status, "late receipt for a task that left Redis: ledger row updated");
        self.write_settled(&row.key, task_id, status, None, None)
            .await
    }

    /// Queues `update` and waits until it is written, at most `within`: true
    /// when it is. On a timeout or an error (logged) the update stays queued
    /// and the writer keeps retrying it.
    pub async fn update_confirmed(&self, update: Update, within: Duration) -> bool {
        let task = update.task_id.clone();
        let work = async {
            self.update(update).await?;
            self.flush().await
        };
        confirmed_within(&task, within, "the task keeps Redis's retention", work).await
    }

    /// Waits until every update queued so far is written (tests, shutdown).
    pub async fn flush(&self) -> Result<(), LedgerError> {
        self.writer.flush().await
    }

    /// Why the ledger is unusable, if the last claim or check failed.
    pub fn unavailable(&self) -> Option<String> {
        self.health.lock().map(|h| h.clone()).unwrap_or(None)
    }

    /// Checks the database answers (`SELECT 1`) and records the result.
    pub async fn check(&self) -> Result<(), LedgerError> {
        let res = self.pool.ping().await;
        self.observe(res.as_ref().err());
        res
    }

    fn observe(&self, error: Option<&LedgerError>) {
        if let Ok(mut h) = self.health.lock() {
            *h = error.map(|e| e.to_string());
        }
    }
}

/// `work` done within `within`: true. An error or a timeout is logged for
/// `task` with what it means (`otherwise`), and is false.
pub(crate) async fn confirmed_within(
    task: &str,
    within: Duration,
    otherwise: &str,
    work: impl std::future::Future<Output = Result<(), LedgerError>>,
) -> bool {
    match tokio::time::timeout(within, work).await {
        Ok(Ok(())) => true,
        Ok(Err(e)) => {
            tracing::warn!(task, error = %e, "the ledger write failed; {otherwise}");
            false
        }
        Err(_) => {
            tracing::warn!(
                task,
                ?within,
                "the ledger did not confirm the write in time; {otherwise}"
            );
            false
        }
    }
}
