//! The ledger as history: lookups after Redis's retention dropped a task,
//! and the rows since a time for audits (`pushonce ledger export`).

use serde::Serialize;

use super::pool::on_pool;
use super::{Ledger, LedgerError};

/// One row of the ledger, as read back.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LedgerRow {
    /// The idempotency key.
    pub key: String,
    /// The task that owns it.
    pub task_id: String,
    /// Channel name.
    pub channel: String,
    /// Key policy as `name@version`.
    pub policy: String,
    /// SHA-256 (hex) of the recipient id.
    pub recipient_digest: String,
    /// Business type of the event.
    pub biz_type: String,
    /// Business id of the event.
    pub biz_id: String,
    /// Last status written (`claimed`, `sending`, `sent`, `delivered`, …).
    pub status: String,
    /// Attempts begun.
    pub attempts: u32,
    /// The provider's message id, if one was given.
    pub provider_message_id: Option<String>,
    /// The last error, if any.
    pub last_error: Option<String>,
    /// When the key was claimed, ms since the epoch.
    pub claimed_at_ms: i64,
    /// When the row last changed, ms since the epoch.
    pub updated_at_ms: i64,
    /// Who settled the task by hand and why, when an operator did.
    pub operator_note: Option<String>,
    /// When the key's window ends, ms since the epoch (`None` on rows
    /// claimed before the ledger recorded it): the row is removed
    /// `ledger_history` after this.
    pub window_ends_at_ms: Option<i64>,
    /// When its task was accepted, ms since the epoch (the Redis clock);
    /// `None` on rows written before the ledger recorded it.
    pub accepted_at_ms: Option<i64>,
}

type Tuple = (
    String,
    String,
    String,
    String,
    String,
    String,
    String,
    String,
    i32,
    Option<String>,
    Option<String>,
    i64,
    i64,
    Option<String>,
    Option<i64>,
    Option<i64>,
);

const COLUMNS: &str = "SELECT key, task_id, channel, policy, recipient_digest, biz_type, biz_id, \
    status, attempts, provider_message_id, last_error, claimed_at, updated_at, operator_note, \
    window_ends_at, accepted_at \
    FROM deliveries ";

fn row(t: Tuple) -> LedgerRow {
    LedgerRow {
        key: t.0,
        task_id: t.1,
        channel: t.2,
        policy: t.3,
        recipient_digest: t.4,
        biz_type: t.5,
        biz_id: t.6,
        status: t.7,
        attempts: t.8.max(0) as u32,
        provider_message_id: t.9,
        last_error: t.10,
        claimed_at_ms: t.11,
        updated_at_ms: t.12,
        operator_note: t.13,
        window_ends_at_ms: t.14,
        accepted_at_ms: t.15,
    }
}

impl Ledger {
    /// The row owned by `task_id`, if the task claimed a key.
    pub async fn by_task(&self, task_id: &str) -> Result<Option<LedgerRow>, LedgerError> {
        let sql = format!("{COLUMNS}WHERE task_id = $1");
        let found: Option<Tuple> = on_pool!(self.pool(), p => {
            sqlx::query_as(&sql).bind(task_id).fetch_optional(p).await?
        });
        Ok(found.map(row))
    }

    /// The rows of one business event (every channel).
    pub async fn by_event(
        &self,
        biz_type: &str,
        biz_id: &str,
    ) -> Result<Vec<LedgerRow>, LedgerError> {
        let sql = format!("{COLUMNS}WHERE biz_type = $1 AND biz_id = $2 ORDER BY claimed_at");
        let rows: Vec<Tuple> = on_pool!(self.pool(), p => {
            sqlx::query_as(&sql).bind(biz_type).bind(biz_id).fetch_all(p).await?
        });
        Ok(rows.into_iter().map(row).collect())
    }

    /// The newest `limit` rows of the user whose id has `digest`
    /// ([`crate::ledger::recipient_digest`]), newest claim first.
    pub async fn by_recipient(
        &self,
        digest: &str,
        limit: u32,
    ) -> Result<Vec<LedgerRow>, LedgerError> {
        let sql =
            format!("{COLUMNS}WHERE recipient_digest = $1 ORDER BY claimed_at DESC, key LIMIT $2");
        let rows: Vec<Tuple> = on_pool!(self.pool(), p => {
            sqlx::query_as(&sql).bind(digest).bind(i64::from(limit)).fetch_all(p).await?
        });
        Ok(rows.into_iter().map(row).collect())
    }

    /// The rows changed at or after `since_ms`, oldest change first.
    pub async fn since(&self, since_ms: i64) -> Result<Vec<LedgerRow>, LedgerError> {
        let sql = format!("{COLUMNS}WHERE updated_at >= $1 ORDER BY updated_at, key");
        let rows: Vec<Tuple> = on_pool!(self.pool(), p => {
            sqlx::query_as(&sql).bind(since_ms).fetch_all(p).await?
        });
        Ok(rows.into_iter().map(row).collect())
    }
}
