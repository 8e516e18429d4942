//! The reconciler's side of the permit layer: the per-shard index of tasks
//! awaiting confirmation (`{ns:shard}:awaiting`), claiming its due entries
//! (`claim.lua`) and applying what a check decided (`reconcile.lua`), both
//! one script on one shard.

use std::time::Duration;

use redis::Value;

use super::{
    PermitError, Permits, Task, TaskStatus, array, millis, scripts, shard_of_task, text, unexpected,
};

/// One task a reconciler claimed for a check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claimed {
    /// The task id.
    pub task_id: String,
    /// Its status when claimed (`sent` or `unknown`); the check's outcome is fenced by it.
    pub status: TaskStatus,
    /// This check's number since the task entered the index: the checks
    /// completed before it (recorded by `reconcile.lua`; a check lost to a
    /// crash or a Redis restart does not count) plus one.
    pub checks: u32,
    /// Times the reconciler re-queued it already (the provider never got it).
    pub requeues: u32,
}

/// What one claim on one shard found and took.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimPass {
    /// Redis clock at the claim, ms since the epoch.
    pub now_ms: u64,
    /// When the oldest entry of the index was (or is) due, before the claim; `None` if empty.
    pub oldest_due_ms: Option<u64>,
    /// Entries in the index after the claim (claimed ones included).
    pub awaiting: u64,
    /// The entries taken, held for this reconciler until `now_ms + hold`.
    pub claimed: Vec<Claimed>,
}

impl ClaimPass {
    /// How late the oldest due entry was (0 when none was due).
    pub fn lag(&self) -> Duration {
        let late = self
            .oldest_due_ms
            .map_or(0, |due| self.now_ms.saturating_sub(due));
        Duration::from_millis(late)
    }
}

/// What a check decided, besides delivered / failed (those go through
/// [`Permits::record_receipt`], as a receipt would).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CheckAction {
    /// Check again after this delay (pending, or nothing could tell).
    Later(Duration),
    /// Stop checking a `sent` task (checks exhausted); it stays `sent`.
    Untrack,
    /// `unknown` → `sent`: the provider has it; no resend.
    Sent {
        /// The provider's id, when known.
        provider_message_id: Option<String>,
    },
    /// `unknown` → `queued`: the provider never got it; sent again under the
    /// same key and task, unless it was re-queued `most` times already
    /// (the script fences a second check racing the first).
    Requeue {
        /// Re-queues one task may have in all (`[reconcile] max_requeues`).
        most: u32,
    },
    /// `unknown` → `dead`: checks exhausted, nothing could tell; listed for operators.
    Dead,
}

/// What one check asked and was answered, for the task's `reconcile_log`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CheckNote {
    /// What was asked: `status query`, or why nothing could be asked.
    pub asked: String,
    /// The answer's label (`pending`, `absent`, `cannot_tell`, …).
    pub answer: String,
    /// The answer's detail (a failed query's error), or empty.
    pub detail: String,
}

impl CheckAction {
    fn name(&self) -> &'static str {
        match self {
            CheckAction::Later(_) => "later",
            CheckAction::Untrack => "untrack",
            CheckAction::Sent { .. } => "sent",
            CheckAction::Requeue { .. } => "requeue",
            CheckAction::Dead => "dead",
        }
    }
}

impl Permits {
    /// Takes up to `limit` due entries of `shard`'s awaiting index: each is
    /// re-scored to now + `hold` (no other reconciler takes it meanwhile),
    /// its task gets the claim's `token` (checks are counted when recorded).
    pub async fn claim_checks(
        &self,
        shard: u16,
        limit: usize,
        hold: Duration,
        token: &str,
    ) -> Result<ClaimPass, PermitError> {
        let answer: Value = scripts::CLAIM
            .key(self.layout.awaiting(shard))
            .arg(limit.max(1))
            .arg(millis(hold).max(1))
            .arg(token)
            .arg(self.layout.task_prefix(shard))
            .invoke_async(&mut self.conn.clone())
            .await?;
        let items = array(answer, "claim")?;
        let claimed = match items.get(3) {
            Some(Value::Array(list)) => list
                .iter()
                .map(|entry| {
                    let Value::Array(e) = entry else {
                        return Err(unexpected("claim", &items));
                    };
                    Ok(Claimed {
                        task_id: text(e.first()),
                        status: TaskStatus::parse(&text(e.get(1)))
                            .ok_or_else(|| unexpected("claim", &items))?,
                        checks: text(e.get(2)).parse::<u32>().unwrap_or(0) + 1,
                        requeues: text(e.get(3)).parse().unwrap_or(0),
                    })
                })
                .collect::<Result<Vec<_>, _>>()?,
            _ => return Err(unexpected("claim", &items)),
        };
        Ok(ClaimPass {
            now_ms: text(items.first()).parse().unwrap_or(0),
            oldest_due_ms: text(items.get(1)).parse::<f64>().ok().map(|f| f as u64),
            awaiting: text(items.get(2)).parse().unwrap_or(0),
            claimed,
        })
    }

    /// Applies what a check of `task` (claimed in status `from` with `token`)
    /// decided. Returns false when fenced: the task moved on (a receipt, an
    /// operator) or another claim took it; nothing was written.
    pub async fn settle_check(
        &self,
        task: &Task,
        from: TaskStatus,
        token: &str,
        action: &CheckAction,
        reason: &str,
    ) -> Result<bool, PermitError> {
        self.settle_check_noting(task, from, token, action, reason, &CheckNote::default())
            .await
    }

    /// [`Permits::settle_check`], with what the check asked and was
    /// answered, appended to the task's `reconcile_log`.
    pub async fn settle_check_noting(
        &self,
        task: &Task,
        from: TaskStatus,
        token: &str,
        action: &CheckAction,
        reason: &str,
        note: &CheckNote,
    ) -> Result<bool, PermitError> {
        let shard =
            shard_of_task(&task.id).ok_or_else(|| PermitError::BadTaskId(task.id.clone()))?;
        let most_requeues = match action {
            CheckAction::Requeue { most } => *most,
            _ => 0,
        };
        let (after, provider_id) = match action {
            CheckAction::Later(d) => (millis(*d), ""),
            CheckAction::Sent {
                provider_message_id,
            } => (
                millis(self.config.check_sent_after),
                provider_message_id.as_deref().unwrap_or(""),
            ),
            _ => (0, ""),
        };
        let answer: Value = scripts::RECONCILE
            .key(self.task_key(&task.id)?)
            .key(self.layout.permit_in(shard, &task.key))
            .key(self.layout.awaiting(shard))
            .key(self.layout.ready(shard))
            .key(self.layout.dead(shard))
            .arg(&task.id)
            .arg(token)
            .arg(from.as_str())
            .arg(action.name())
            .arg(after)
            .arg(millis(self.config.retention).max(1))
            .arg(millis(self.config.grace))
            .arg(reason)
            .arg(provider_id)
            .arg(most_requeues)
            .arg(&note.asked)
            .arg(&note.answer)
            .arg(&note.detail)
            .invoke_async(&mut self.conn.clone())
            .await?;
        let items = array(answer, "reconcile")?;
        match text(items.first()).as_str() {
            "done" => Ok(true),
            "fenced" => Ok(false),
            _ => Err(unexpected("reconcile", &items)),
        }
    }

    /// Entries of `shard`'s awaiting index (`ZCARD`, one shard).
    pub async fn awaiting_count(&self, shard: u16) -> Result<u64, PermitError> {
        Ok(redis::cmd("ZCARD")
            .arg(self.layout.awaiting(shard))
            .query_async(&mut self.conn.clone())
            .await?)
    }
}
