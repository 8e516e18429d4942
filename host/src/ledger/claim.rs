//! Claim before send: the one synchronous ledger write of a task.

use std::sync::Arc;

use sha2::{Digest, Sha256};
use tokio::sync::{mpsc, oneshot};

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
    /// When the key's window ends, ms since the epoch: the row outlives it
    /// by the configured history ([`crate::ledger::retention`]). A later
    /// claim by the same task (a retry, a requeue) may push it later, never earlier.
    pub window_ends_ms: i64,
    /// When the task was accepted, ms since the epoch (the Redis clock, the
    /// task's `accepted_at`): kept in the row so a look-up from the ledger
    /// answers the accept's time, not the claim's.
    pub accepted_ms: i64,
}

/// The answer to a claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimAnswer {
    /// The key is this task's: send.
    Ours {
        /// This attempt's claim is the key's first: no earlier attempt of
        /// the task reached its claim, so none of them sent anything (a send
        /// never happens without its claim). False when an earlier attempt
        /// claimed it.
        first: bool,
    },
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
/// trip (the `DO UPDATE` makes `RETURNING` answer for an existing row too).
/// The owner's own re-claim (a retry, a requeue: a fresh window in Redis)
/// pushes the window's end later; another task's claim changes nothing.
const CLAIM_SQL: &str = "INSERT INTO deliveries \
    (key, task_id, channel, policy, recipient_digest, biz_type, biz_id, status, attempts, claimed_at, updated_at, window_ends_at, accepted_at, address_digest) \
    VALUES ($1, $2, $3, $4, $5, $6, $7, 'claimed', $8, $9, $9, $10, $11, $12) \
    ON CONFLICT (key) DO UPDATE SET window_ends_at = CASE \
    WHEN deliveries.task_id = excluded.task_id \
    AND (deliveries.window_ends_at IS NULL OR deliveries.window_ends_at < excluded.window_ends_at) \
    THEN excluded.window_ends_at ELSE deliveries.window_ends_at END \
    RETURNING task_id, status, attempts";

/// Claims waiting together, written in one transaction (group commit): one
/// fsync for all of them instead of one each.
/// Each claim with the [`recipient_digest`] of the address its message goes
/// to, when known (kept in the row's `address_digest`, for opt-outs by
/// address).
type Waiting = Vec<((Claim, Option<String>), Reply)>;

/// Where one claim's answer goes.
type Reply = oneshot::Sender<Result<ClaimAnswer, Arc<LedgerError>>>;

/// Most claims in one transaction.
const GROUP_MAX: usize = 64;

/// The queue of the group-committing claimer: each item the claims of one
/// caller (one, or a dispatcher's batch), kept in one transaction.
#[derive(Clone)]
pub(super) struct Claimer(mpsc::Sender<Waiting>);

impl Claimer {
    /// Starts the claimer task on `pool`.
    pub(super) fn spawn(pool: LedgerPool) -> Claimer {
        let (tx, mut rx) = mpsc::channel(1024);
        tokio::spawn(async move {
            let mut group: Waiting = Vec::with_capacity(GROUP_MAX);
            while let Some(first) = rx.recv().await {
                group.extend(first);
                // Whatever queued meanwhile joins (no waiting: an idle
                // ledger answers a lone claim at once); a batch is never split.
                while group.len() < GROUP_MAX {
                    match rx.try_recv() {
                        Ok(next) => group.extend(next),
                        Err(_) => break,
                    }
                }
                answer_group(&pool, &mut group).await;
            }
        });
        Claimer(tx)
    }

    /// Claims `c` with whatever other claims are waiting.
    pub(super) async fn claim(&self, c: &Claim) -> Result<ClaimAnswer, LedgerError> {
        self.claim_all(&[(c.clone(), None)])
            .await?
            .pop()
            .ok_or(LedgerError::WriterStopped)
    }

    /// Claims every one of `claims` (each with its address digest) in one
    /// transaction (with whatever other claims are waiting); answers in
    /// order. One fails only with all.
    pub(super) async fn claim_all(
        &self,
        claims: &[(Claim, Option<String>)],
    ) -> Result<Vec<ClaimAnswer>, LedgerError> {
        let mut waiting = Vec::with_capacity(claims.len());
        let mut replies = Vec::with_capacity(claims.len());
        for c in claims {
            let (tx, rx) = oneshot::channel();
            waiting.push((c.clone(), tx));
            replies.push(rx);
        }
        self.0
            .send(waiting)
            .await
            .map_err(|_| LedgerError::WriterStopped)?;
        let mut answers = Vec::with_capacity(replies.len());
        for rx in replies {
            answers.push(match rx.await {
                Ok(Ok(answer)) => answer,
                Ok(Err(e)) => return Err(LedgerError::Group(e)),
                Err(_) => return Err(LedgerError::WriterStopped),
            });
        }
        Ok(answers)
    }
}

/// Writes the group in one transaction and answers each waiter.
async fn answer_group(pool: &LedgerPool, group: &mut Waiting) {
    // One order of keys in every transaction: two instances' groups cannot
    // wait on each other's rows (a PostgreSQL deadlock).
    group.sort_by(|a, b| a.0.0.key.cmp(&b.0.0.key));
    match claim_all(pool, group).await {
        Ok(answers) => {
            for ((_, waiter), answer) in group.drain(..).zip(answers) {
                let _ = waiter.send(Ok(answer));
            }
        }
        Err(e) => {
            let e = Arc::new(e);
            for (_, waiter) in group.drain(..) {
                let _ = waiter.send(Err(e.clone()));
            }
        }
    }
}

async fn claim_all(pool: &LedgerPool, group: &Waiting) -> Result<Vec<ClaimAnswer>, LedgerError> {
    let mut answers = Vec::with_capacity(group.len());
    on_pool!(pool, p => {
        let mut tx = p.begin().await?;
        for ((c, address), _) in group {
            let (owner, status, attempts): (String, String, i32) = sqlx::query_as(CLAIM_SQL)
                .bind(&c.key)
                .bind(&c.task_id)
                .bind(&c.channel)
                .bind(&c.policy)
                .bind(&c.recipient_digest)
                .bind(&c.biz_type)
                .bind(&c.biz_id)
                .bind(c.attempt as i32)
                .bind(c.now_ms)
                .bind(c.window_ends_ms)
                .bind(c.accepted_ms)
                .bind(address)
                .fetch_one(&mut *tx)
                .await?;
            answers.push(if owner == c.task_id {
                // A new row holds the claiming attempt's number; a re-claim
                // leaves the number an earlier attempt (or its outcome) wrote.
                ClaimAnswer::Ours {
                    first: i64::from(attempts) == i64::from(c.attempt),
                }
            } else {
                ClaimAnswer::Taken { owner, status }
            });
        }
        tx.commit().await?;
    });
    Ok(answers)
}

/// A task cancelled before its first attempt (so before any claim of its
/// key): its row, written in place of a claim, `cancelled`, no attempt. A
/// row of the same task (an attempt given back unsent after its claim)
/// becomes `cancelled`; another task's row is left alone. The row then
/// guards the key like a claim until its window ends (the permit is kept).
const CANCELLED_SQL: &str = "INSERT INTO deliveries \
    (key, task_id, channel, policy, recipient_digest, biz_type, biz_id, status, attempts, claimed_at, updated_at, window_ends_at, accepted_at, last_error) \
    VALUES ($1, $2, $3, $4, $5, $6, $7, 'cancelled', 0, $8, $8, $9, $10, $11) \
    ON CONFLICT (key) DO UPDATE SET status = 'cancelled', updated_at = excluded.updated_at, \
    last_error = COALESCE(excluded.last_error, deliveries.last_error) \
    WHERE deliveries.task_id = excluded.task_id";

/// A task whose permit is released with nothing sent (cancelled, or failed
/// or dead before anything reached the provider): no row may stop the key's
/// next task (a re-post), so the row of the task's own claim goes.
const RELEASED_SQL: &str = "DELETE FROM deliveries WHERE key = $1 AND task_id = $2";

impl super::Ledger {
    /// Writes `c` (its `attempt` unused) as the row of a task cancelled
    /// (with `error`, why, when it was not the business's call), or, when
    /// its permit was `released`, takes out the task's own row, so a
    /// re-post of the key can claim it. True when written. A failure is
    /// logged.
    pub(crate) async fn write_cancelled(
        &self,
        c: &Claim,
        released: bool,
        error: Option<&str>,
    ) -> bool {
        let done: Result<(), LedgerError> = async {
            if released {
                return self.delete_own_row(&c.key, &c.task_id).await;
            }
            on_pool!(self.pool(), p => {
                sqlx::query(CANCELLED_SQL)
                    .bind(&c.key)
                    .bind(&c.task_id)
                    .bind(&c.channel)
                    .bind(&c.policy)
                    .bind(&c.recipient_digest)
                    .bind(&c.biz_type)
                    .bind(&c.biz_id)
                    .bind(c.now_ms)
                    .bind(c.window_ends_ms)
                    .bind(c.accepted_ms)
                    .bind(error)
                    .execute(p)
                    .await?;
            });
            Ok(())
        }
        .await;
        match done {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(task = %c.task_id, error = %e, "could not write the cancelled task to the ledger; it keeps Redis's retention");
                false
            }
        }
    }

    /// Takes out task `task_id`'s own row of `key` within `within`, before
    /// its permit is released with nothing sent (failed or dead before
    /// anything reached the provider), so the key's next task can claim it.
    /// True when done; false (logged) when the ledger did not confirm it:
    /// the permit must then stay, or a re-post would be accepted by Redis
    /// and refused by the claim.
    pub(crate) async fn release_confirmed(
        &self,
        key: &str,
        task_id: &str,
        within: std::time::Duration,
    ) -> bool {
        let otherwise = "the task's row stays, and its permit is kept for the window";
        super::confirmed_within(
            task_id,
            within,
            otherwise,
            self.delete_own_row(key, task_id),
        )
        .await
    }

    /// [`RELEASED_SQL`]: task `task_id`'s own row of `key`, if any, goes.
    async fn delete_own_row(&self, key: &str, task_id: &str) -> Result<(), LedgerError> {
        on_pool!(self.pool(), p => {
            sqlx::query(RELEASED_SQL)
                .bind(key)
                .bind(task_id)
                .execute(p)
                .await?;
        });
        Ok(())
    }
}
