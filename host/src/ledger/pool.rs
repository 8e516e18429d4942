//! The two backends behind one type: a SQLite or a PostgreSQL pool, each
//! with its own migration directory (the dialects differ in integer widths).

use std::borrow::Cow;
use std::str::FromStr;
use std::time::Duration;

use sqlx::migrate::{Migration, MigrationType, Migrator};
use sqlx::postgres::{PgPool, PgPoolOptions};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions};

use super::LedgerError;

/// How long a connection attempt or a pool checkout waits: a ledger that
/// does not answer makes sends wait, it must not hang them for long.
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(2);

/// A migration: version, description, SQL.
type Step = (i64, &'static str, &'static str);

/// The SQLite schema's migrations, in order (embedded: the binary needs no
/// files beside it; `sqlx::migrate!` would need sqlx's macros).
const SQLITE_MIGRATIONS: &[Step] = &[
    (
        1,
        "deliveries",
        include_str!("../../migrations/sqlite/0001_deliveries.sql"),
    ),
    (
        2,
        "operators",
        include_str!("../../migrations/sqlite/0002_operators.sql"),
    ),
    (
        3,
        "window ends",
        include_str!("../../migrations/sqlite/0003_window_ends.sql"),
    ),
    (
        4,
        "identity",
        include_str!("../../migrations/sqlite/0004_identity.sql"),
    ),
    (
        5,
        "preferences",
        include_str!("../../migrations/sqlite/0005_preferences.sql"),
    ),
    (
        6,
        "accepted at",
        include_str!("../../migrations/sqlite/0006_accepted_at.sql"),
    ),
    (
        7,
        "addresses",
        include_str!("../../migrations/sqlite/0007_addresses.sql"),
    ),
];

/// The PostgreSQL schema's migrations, in order.
const POSTGRES_MIGRATIONS: &[Step] = &[
    (
        1,
        "deliveries",
        include_str!("../../migrations/postgres/0001_deliveries.sql"),
    ),
    (
        2,
        "operators",
        include_str!("../../migrations/postgres/0002_operators.sql"),
    ),
    (
        3,
        "window ends",
        include_str!("../../migrations/postgres/0003_window_ends.sql"),
    ),
    (
        4,
        "identity",
        include_str!("../../migrations/postgres/0004_identity.sql"),
    ),
    (
        5,
        "preferences",
        include_str!("../../migrations/postgres/0005_preferences.sql"),
    ),
    (
        6,
        "accepted at",
        include_str!("../../migrations/postgres/0006_accepted_at.sql"),
    ),
    (
        7,
        "addresses",
        include_str!("../../migrations/postgres/0007_addresses.sql"),
    ),
];

/// A migrator running `steps` (each in its own transaction, under sqlx's
/// migration lock, so instances starting together apply each once).
fn migrator(steps: &[Step]) -> Migrator {
    let migrations = steps
        .iter()
        .map(|(version, description, sql)| {
            Migration::new(
                *version,
                Cow::Borrowed(*description),
                MigrationType::Simple,
                Cow::Borrowed(*sql),
                false,
            )
        })
        .collect::<Vec<_>>();
    Migrator {
        migrations: Cow::Owned(migrations),
        ignore_missing: false,
        locking: true,
        no_tx: false,
    }
}

/// An exclusive lock on `<database>.migrate-lock`, held while the SQLite
/// migrations run: sqlx takes no lock on SQLite, and two processes starting
/// on a new file would both find migration 1 pending and the second would fail
/// with `table deliveries already exists`. Released when dropped (or when the
/// process dies: the operating system drops the lock with the file).
struct MigrationLock(Option<std::fs::File>);

/// How long an instance waits for another one's migrations.
const MIGRATION_LOCK_WAIT: Duration = Duration::from_secs(60);

impl MigrationLock {
    /// Waits for the lock of the database `file` (no lock for an in-memory
    /// database, which no other process can open).
    async fn acquire(file: &std::path::Path) -> Result<MigrationLock, LedgerError> {
        if file.as_os_str().is_empty() || file == std::path::Path::new(":memory:") {
            return Ok(MigrationLock(None));
        }
        let mut path = file.as_os_str().to_owned();
        path.push(".migrate-lock");
        let path = std::path::PathBuf::from(path);
        let lock_err = |e: std::io::Error| LedgerError::MigrationLock {
            path: path.clone(),
            reason: e.to_string(),
        };
        let handle = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(lock_err)?;
        let deadline = tokio::time::Instant::now() + MIGRATION_LOCK_WAIT;
        loop {
            match handle.try_lock() {
                Ok(()) => return Ok(MigrationLock(Some(handle))),
                Err(std::fs::TryLockError::WouldBlock) => {}
                Err(std::fs::TryLockError::Error(e)) => return Err(lock_err(e)),
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(lock_err(std::io::Error::other(format!(
                    "another instance held it for over {}s",
                    MIGRATION_LOCK_WAIT.as_secs()
                ))));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for MigrationLock {
    fn drop(&mut self) {
        if let Some(file) = &self.0 {
            let _ = file.unlock();
        }
    }
}

/// A pool on one of the supported databases.
#[derive(Clone, Debug)]
pub enum LedgerPool {
    /// The embedded default: a file in `data_dir`, WAL journal.
    Sqlite(SqlitePool),
    /// Shared by every instance.
    Postgres(PgPool),
}

/// Runs `$body` with `$p` bound to the concrete pool (the SQL is the same
/// text on both: `$N` parameters, `ON CONFLICT`, `RETURNING`).
macro_rules! on_pool {
    ($pool:expr, $p:ident => $body:expr) => {
        match $pool {
            $crate::ledger::LedgerPool::Sqlite($p) => $body,
            $crate::ledger::LedgerPool::Postgres($p) => $body,
        }
    };
}
pub(crate) use on_pool;

impl LedgerPool {
    /// Connects to `url`: `sqlite:<path>` (created if missing) or `postgres://…`.
    pub async fn connect(url: &str) -> Result<LedgerPool, LedgerError> {
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            let pool = PgPoolOptions::new()
                .max_connections(16)
                .acquire_timeout(ACQUIRE_TIMEOUT)
                .connect_lazy(url)?;
            return Ok(LedgerPool::Postgres(pool));
        }
        if url.starts_with("sqlite:") {
            let options = SqliteConnectOptions::from_str(url)?
                .create_if_missing(true)
                .journal_mode(SqliteJournalMode::Wal)
                .busy_timeout(ACQUIRE_TIMEOUT);
            // One connection: SQLite has one writer at a time anyway, and
            // concurrent writers of one process would otherwise meet as
            // `database is locked` after the busy timeout (measured with 16
            // claimers); other processes on the same file still wait on the
            // busy timeout.
            let pool = SqlitePoolOptions::new()
                .max_connections(1)
                .acquire_timeout(ACQUIRE_TIMEOUT)
                .connect_with(options)
                .await?;
            return Ok(LedgerPool::Sqlite(pool));
        }
        // No password in the error: it is logged and printed at start.
        Err(LedgerError::BadUrl(crate::store::redact(url)))
    }

    /// A pool for reads that must not wait behind the claims and the
    /// writer (the accept path's preference reads): on SQLite a second pool
    /// of its own on the same file (WAL: readers do not wait for the
    /// writer); on PostgreSQL this pool.
    pub(crate) fn for_reads(&self) -> LedgerPool {
        match self {
            LedgerPool::Sqlite(p) => {
                let options = (*p.connect_options()).clone();
                LedgerPool::Sqlite(
                    SqlitePoolOptions::new()
                        .max_connections(4)
                        .acquire_timeout(ACQUIRE_TIMEOUT)
                        .connect_lazy_with(options),
                )
            }
            LedgerPool::Postgres(_) => self.clone(),
        }
    }

    /// `sqlite` or `postgres`.
    pub fn backend(&self) -> &'static str {
        match self {
            LedgerPool::Sqlite(_) => "sqlite",
            LedgerPool::Postgres(_) => "postgres",
        }
    }

    /// Applies the backend's migrations (`host/migrations/<backend>/`).
    ///
    /// Instances starting together apply each migration once: on
    /// PostgreSQL under sqlx's advisory lock; on SQLite, whose sqlx lock is
    /// a no-op, under an exclusive lock on a file beside the database
    /// ([`MigrationLock`]).
    pub(crate) async fn migrate(&self) -> Result<(), LedgerError> {
        match self {
            LedgerPool::Sqlite(p) => {
                let file = p.connect_options().get_filename().to_path_buf();
                let _lock = MigrationLock::acquire(&file).await?;
                migrator(SQLITE_MIGRATIONS).run(p).await?;
            }
            LedgerPool::Postgres(p) => migrator(POSTGRES_MIGRATIONS).run(p).await?,
        }
        Ok(())
    }

    /// The migrations of this binary the ledger has not applied (version,
    /// description), and the versions it has that this binary does not know
    /// (a newer host applied them). Reads `_sqlx_migrations` (none applied
    /// when it is missing); applies nothing (`pushonce doctor`).
    pub(crate) async fn migration_gaps(
        &self,
    ) -> Result<(Vec<(i64, &'static str)>, Vec<i64>), LedgerError> {
        let steps = match self {
            LedgerPool::Sqlite(_) => SQLITE_MIGRATIONS,
            LedgerPool::Postgres(_) => POSTGRES_MIGRATIONS,
        };
        let applied: Vec<i64> = on_pool!(self, p => {
            let table = sqlx::query("SELECT 1 FROM _sqlx_migrations LIMIT 1")
                .fetch_optional(p)
                .await;
            if table.is_err() {
                Vec::new()
            } else {
                sqlx::query_as::<_, (i64,)>("SELECT version FROM _sqlx_migrations WHERE success")
                    .fetch_all(p)
                    .await?
                    .into_iter()
                    .map(|(v,)| v)
                    .collect()
            }
        });
        let pending = steps
            .iter()
            .filter(|(v, _, _)| !applied.contains(v))
            .map(|(v, d, _)| (*v, *d))
            .collect();
        let unknown = applied
            .into_iter()
            .filter(|v| !steps.iter().any(|(known, _, _)| known == v))
            .collect();
        Ok((pending, unknown))
    }

    /// `SELECT 1`.
    pub async fn ping(&self) -> Result<(), LedgerError> {
        on_pool!(self, p => {
            sqlx::query("SELECT 1").execute(p).await?;
        });
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_mistyped_ledger_url_is_named_without_its_password() {
        let err = LedgerPool::connect("postgress://u:s3cret@db.example/x")
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains("ledger_url"), "{err}");
        assert!(err.contains("db.example/x"), "{err}");
        assert!(!err.contains("s3cret"), "{err}");
    }
}
