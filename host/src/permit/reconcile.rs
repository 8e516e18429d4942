//! Reconcile (`reconcile.lua`): apply what a reconciler check of a `sent`
//! or `unknown` task decided, fenced by the status the check started from
//! and by its claim's token. Delivered / failed go through `receipt.lua`.

use std::sync::LazyLock;
use std::time::Duration;

use redis::{Script, Value};

use super::scripts::{Call, Transition, script};
use super::{PermitError, Permits, Task, TaskStatus, array, millis, text, unexpected};

/// Apply what a reconciler check decided, fenced by its claim (`reconcile.lua`).
pub(crate) static SCRIPT: LazyLock<Script> =
    LazyLock::new(|| script(include_str!("reconcile.lua")));

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

/// `reconcile.lua`'s `KEYS` and `ARGV`, named (see the script's header).
struct ReconcileArgs<'a> {
    /// KEYS[1]: the task hash.
    task: String,
    /// KEYS[2]: its permit.
    permit: String,
    /// KEYS[3]: the shard's awaiting index.
    awaiting: String,
    /// KEYS[4]: the shard's ready stream.
    ready: String,
    /// KEYS[5]: the shard's failed-and-dead index.
    dead: String,
    /// ARGV[1]: the task id.
    task_id: &'a str,
    /// ARGV[2]: the claim's token.
    token: &'a str,
    /// ARGV[3]: the status the check started from.
    from: TaskStatus,
    /// ARGV[4]: the action's name.
    action: &'static str,
    /// ARGV[5]: when to check again, ms (later, sent).
    after_ms: u64,
    /// ARGV[6]: how long an ended task is kept, ms.
    retention_ms: u64,
    /// ARGV[7]: how far past a due time the permit is kept, ms.
    grace_ms: u64,
    /// ARGV[8]: why.
    reason: &'a str,
    /// ARGV[9]: the provider's message id, or empty.
    provider_id: &'a str,
    /// ARGV[10]: most re-queues one task may have (requeue).
    most_requeues: u32,
    /// ARGV[11] .. ARGV[13]: what the check asked and was answered.
    note: &'a CheckNote,
}

impl Transition for ReconcileArgs<'_> {
    const SCRIPT: &'static LazyLock<Script> = &SCRIPT;

    fn call(&self) -> Call<'_> {
        Call::default()
            .key(&*self.task)
            .key(&*self.permit)
            .key(&*self.awaiting)
            .key(&*self.ready)
            .key(&*self.dead)
            .arg(self.task_id)
            .arg(self.token)
            .arg(self.from.as_str())
            .arg(self.action)
            .num(self.after_ms)
            .num(self.retention_ms)
            .num(self.grace_ms)
            .arg(self.reason)
            .arg(self.provider_id)
            .num(self.most_requeues)
            .arg(&*self.note.asked)
            .arg(&*self.note.answer)
            .arg(&*self.note.detail)
    }
}

impl Permits {
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
        let shard = self.shard_of(&task.id)?;
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
        let answer: Value = self
            .run(&ReconcileArgs {
                task: self.task_key(&task.id)?,
                permit: self.layout.permit_in(shard, &task.key),
                awaiting: self.layout.awaiting(shard),
                ready: self.layout.ready(shard),
                dead: self.layout.dead(shard),
                task_id: &task.id,
                token,
                from,
                action: action.name(),
                after_ms: after,
                retention_ms: millis(self.config.retention).max(1),
                grace_ms: millis(self.config.grace),
                reason,
                provider_id,
                most_requeues,
                note,
            })
            .await?;
        let items = array(answer, "reconcile")?;
        match text(items.first()).as_str() {
            "done" => Ok(true),
            "fenced" => Ok(false),
            _ => Err(unexpected("reconcile", &items)),
        }
    }
}
