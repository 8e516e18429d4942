//! One delivery ledger per Redis.
//!
//! The ledger's `UNIQUE (key)` claim is the last line of defence when a Redis
//! failover loses permits, but only between instances that claim in the same
//! ledger. With `ledger_url` unset every instance has its own SQLite file, so
//! several machines sharing one Redis would each stop only their own second
//! sends. Each instance therefore records its ledger's identity
//! ([`crate::ledger::Ledger::id`]) in Redis at start; the first one's stays,
//! and an instance whose ledger has another id refuses to start, naming
//! both, unless the operator opted in (`allow_separate_ledgers = true`).
//! `/readyz` compares again on every probe (a Redis replaced or flushed since
//! start holds another id, or none: then this instance records its own).

use crate::store::RedisConn;

/// Why this instance's ledger is refused, or the check could not be made.
#[derive(Debug, thiserror::Error)]
pub enum LedgerGuardError {
    /// Another instance on this Redis recorded another ledger.
    #[error(
        "this instance's delivery ledger ({backend}, id {ours}) is not the one the other \
         instances on this Redis use (id {theirs}, recorded in the Redis key {key}): on separate \
         ledgers no instance stops another's second send of a key whose permit a Redis failover \
         lost. Fix: give every instance the same ledger_url (a PostgreSQL shared by all; SQLite \
         only when every instance runs on one machine and names one file). If every instance \
         moved to a new ledger on purpose, delete {key} once they all name it. To run on a \
         ledger of its own anyway, set `allow_separate_ledgers = true`."
    )]
    Separate {
        /// `sqlite` or `postgres`.
        backend: &'static str,
        /// This instance's ledger id.
        ours: String,
        /// The id the Redis holds.
        theirs: String,
        /// The Redis key holding it.
        key: String,
    },
    /// Redis could not be asked.
    #[error("recording the ledger's identity in Redis: {0}")]
    Redis(#[from] redis::RedisError),
}

/// What the host accepts of the ledger the other instances on its Redis use.
#[derive(Debug, Clone)]
pub struct LedgerGuard {
    /// The Redis key of the shared id: `{<namespace>:meta}:ledger`.
    key: String,
    /// This instance's ledger: backend and id.
    ours: (&'static str, String),
    /// `allow_separate_ledgers`: another ledger is warned about, not refused.
    allow_separate: bool,
}

impl LedgerGuard {
    /// The guard of a ledger (`backend`, `id`) under the key namespace `namespace`.
    pub fn new(namespace: &str, backend: &'static str, id: &str, allow_separate: bool) -> Self {
        LedgerGuard {
            key: format!("{{{namespace}:meta}}:ledger"),
            ours: (backend, id.to_string()),
            allow_separate,
        }
    }

    /// Records this ledger's id in Redis unless one is there, then compares:
    /// another id is refused (warned about when the operator opted in).
    pub async fn check(&self, conn: &RedisConn) -> Result<(), LedgerGuardError> {
        let mut conn = conn.clone();
        let _recorded: redis::Value = redis::cmd("SET")
            .arg(&self.key)
            .arg(&self.ours.1)
            .arg("NX")
            .query_async(&mut conn)
            .await?;
        let theirs = self.recorded(&conn).await?;
        match self.refusal(theirs) {
            Some(refused) if !self.allow_separate => Err(refused),
            Some(refused) => {
                tracing::warn!("allow_separate_ledgers = true: {refused}");
                Ok(())
            }
            None => Ok(()),
        }
    }

    /// The ledger id the Redis records (`None`: no instance recorded one yet).
    pub async fn recorded(&self, conn: &RedisConn) -> Result<Option<String>, LedgerGuardError> {
        Ok(redis::cmd("GET")
            .arg(&self.key)
            .query_async(&mut conn.clone())
            .await?)
    }

    /// Why `theirs` (the id the Redis records) is not this ledger, if it is not.
    pub fn refusal(&self, theirs: Option<String>) -> Option<LedgerGuardError> {
        let (backend, ours) = &self.ours;
        match theirs {
            Some(theirs) if theirs != *ours => Some(LedgerGuardError::Separate {
                backend,
                ours: ours.clone(),
                theirs,
                key: self.key.clone(),
            }),
            _ => None,
        }
    }

    /// `allow_separate_ledgers`: another ledger is warned about, not refused.
    pub fn allows_separate(&self) -> bool {
        self.allow_separate
    }
}
