//! Cancel (`cancel.lua`): a task whose first attempt has not begun ends
//! `cancelled` and is never sent; decided against `begin.lua` by the task's
//! status, so a cancel racing a worker has exactly one winner.

use std::sync::LazyLock;

use redis::{Script, Value};

use super::scripts::{Call, Transition, script};
use super::{PermitError, PermitFate, Permits, TaskStatus, array, millis, text, unexpected};

/// Cancel a task before its first attempt (`cancel.lua`).
pub(crate) static SCRIPT: LazyLock<Script> = LazyLock::new(|| script(include_str!("cancel.lua")));

/// The answer to [`Permits::cancel`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cancel {
    /// The task is `cancelled`; what became of its permit: kept for the
    /// window, released (asked for, or a Bloom mode task), or another
    /// task's (left alone).
    Cancelled(PermitFate),
    /// Its first attempt had begun (or it ended before): nothing changed.
    TooLate(TaskStatus),
    /// A digest task holding other events too: this event's item was
    /// taken out (the digest sends the others); what became of its item
    /// mark (kept: a re-post stays a duplicate; released: asked for).
    Removed(PermitFate),
    /// No such task (never existed, or it left Redis).
    Missing,
}

/// `cancel.lua`'s `KEYS` and `ARGV`.
struct CancelArgs<'a> {
    /// KEYS[1]: the task hash.
    task: String,
    /// KEYS[2]: its permit.
    permit: String,
    /// KEYS[3]: the shard's delayed set (quiet hours hold first attempts there).
    delayed: String,
    /// KEYS[4]: the shard's ready stream.
    ready: String,
    /// KEYS[5]: the shard's awaiting index (the held index is named after it).
    awaiting: String,
    /// KEYS[6..]: the cap sets counting the task (its `caps` field).
    caps: Vec<String>,
    /// ARGV[1]: the task id.
    task_id: &'a str,
    /// ARGV[2]: release the permit (owner-checked) instead of keeping it for the window.
    release: bool,
    /// ARGV[3]: how long the cancelled task is kept while Redis is its only record, ms.
    retention_ms: u64,
    /// ARGV[4]: the ready streams' consumer group.
    group: &'a str,
    /// ARGV[5]: the business id of the event cancelled.
    biz_id: &'a str,
}

impl Transition for CancelArgs<'_> {
    const SCRIPT: &'static LazyLock<Script> = &SCRIPT;

    fn call(&self) -> Call<'_> {
        Call::default()
            .key(&*self.task)
            .key(&*self.permit)
            .key(&*self.delayed)
            .key(&*self.ready)
            .key(&*self.awaiting)
            .keys(self.caps.iter().cloned())
            .arg(self.task_id)
            .flag(self.release)
            .num(self.retention_ms)
            .arg(self.group)
            .arg(self.biz_id)
    }
}

impl Permits {
    /// Cancels task `task_id` if its first attempt has not begun (`queued`,
    /// no attempt counted): it ends `cancelled`, leaves the delayed set and
    /// the ready stream, and its permit stays for the window unless
    /// `release` (then deleted, owner-checked, so a re-post is accepted).
    /// Never sent, it leaves the cap sets that counted it; a digest
    /// cancelled whole leaves its key's digest head (the next event opens
    /// the next digest).
    /// The task keeps the retention; [`Permits::note_cancelled`] writes the
    /// ledger and lets it leave. A digest task holding other events than
    /// event `biz_id` only loses that event ([`Cancel::Removed`]).
    pub async fn cancel(
        &self,
        task_id: &str,
        biz_id: &str,
        release: bool,
    ) -> Result<Cancel, PermitError> {
        let task_key = self.task_key(task_id)?;
        let shard = self.shard_of(task_id)?;
        // The key names the permit; `caps` the sets counting the task
        // (accept.lua writes both once, at accept).
        let (key, caps): (Option<String>, Option<String>) = redis::cmd("HMGET")
            .arg(&task_key)
            .arg("key")
            .arg("caps")
            .query_async(&mut self.conn.clone())
            .await?;
        let Some(key) = key else {
            return Ok(Cancel::Missing);
        };
        let answer: Value = self
            .run(&CancelArgs {
                permit: self.layout.permit_in(shard, &key),
                task: task_key,
                delayed: self.layout.delayed(shard),
                ready: self.layout.ready(shard),
                awaiting: self.layout.awaiting(shard),
                caps: caps
                    .as_deref()
                    .map(|c| c.split('\n').map(str::to_string).collect())
                    .unwrap_or_default(),
                task_id,
                release,
                retention_ms: millis(self.config.retention).max(1),
                group: &self.config.group,
                biz_id,
            })
            .await?;
        let items = array(answer, "cancel")?;
        match text(items.first()).as_str() {
            "cancelled" => Ok(Cancel::Cancelled(match text(items.get(1)).as_str() {
                "kept" => PermitFate::Kept,
                "released" => PermitFate::Released,
                _ => PermitFate::NotOwner,
            })),
            "removed" => Ok(Cancel::Removed(if text(items.get(1)) == "released" {
                PermitFate::Released
            } else {
                PermitFate::Kept
            })),
            "too_late" => TaskStatus::parse(&text(items.get(1)))
                .map(Cancel::TooLate)
                .ok_or_else(|| unexpected("cancel", &items)),
            "missing" => Ok(Cancel::Missing),
            _ => Err(unexpected("cancel", &items)),
        }
    }
}
