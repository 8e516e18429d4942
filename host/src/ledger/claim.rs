//! Claim before send: the one synchronous ledger write of a task.

use sha2::{Digest, Sha256};

use super::pool::on_pool;
use super::{LedgerError, LedgerPool};

/// What a worker claims before the first attempt of a task.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    /// The idempotency key (the row's unique key).
    pub key: String,
    /// The task that wants to send it.
    pub task_id: String,
    /// Channel name.
    pub channel: String,
    /// Key policy as `name@version`.
    pub policy: String,
    /// [`recipient_digest`] of the recipient; never the recipient itself.
    pub recipient_digest: String,
    /// Business type of the event.
    pub biz_type: String,
    /// Business id of the event.
    pub biz_id: String,
    /// The attempt about to be made (1 for the first).
    pub attempt: u32,
    /// Now, ms since the epoch.
    pub now_ms: i64,
}

/// The answer to a claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimAnswer {
    /// The key is this task's (claimed now, or by an earlier attempt of it): send.
    Ours,
    /// Another task claimed the key first: it was accepted before and may
    /// have been sent; this task must not send.
    Taken {
        /// The task that owns the key.
        owner: String,
        /// That task's status in the ledger.
        status: String,
    },
}

/// SHA-256 (hex) of a recipient id, so the ledger can tell whether two rows
/// went to the same user without holding who the user is.
pub fn recipient_digest(recipient: &str) -> String {
    hex::encode(Sha256::digest(recipient.as_bytes()))
}

/// Insert, or on conflict the existing row's owner: one statement, one round
/// trip (the no-op `DO UPDATE` makes `RETURNING` answer for an existing row too).
const CLAIM_SQL: &str = "INSERT INTO deliveries \
    (key, task_id, channel, policy, recipient_digest, biz_type, biz_id, status, attempts, claimed_at, updated_at) \
    VALUES ($1, $2, $3, $4, $5, $6, $7, 'claimed', $8, $9, $9) \
    ON CONFLICT (key) DO UPDATE SET key = excluded.key \
    RETURNING task_id, status";

pub(super) async fn claim(pool: &LedgerPool, c: &Claim) -> Result<ClaimAnswer, LedgerError> {
    let (owner, status): (String, String) = on_pool!(pool, p => {
        sqlx::query_as(CLAIM_SQL)
            .bind(&c.key)
            .bind(&c.task_id)
            .bind(&c.channel)
            .bind(&c.policy)
            .bind(&c.recipient_digest)
            .bind(&c.biz_type)
            .bind(&c.biz_id)
            .bind(c.attempt as i32)
            .bind(c.now_ms)
            .fetch_one(p)
            .await?
    });
    Ok(if owner == c.task_id {
        ClaimAnswer::Ours
    } else {
        ClaimAnswer::Taken { owner, status }
    })
}
