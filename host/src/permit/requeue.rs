//! Requeue (`requeue.lua`): an operator sends a failed, dead or held task
//! again under the same key and task id, owner-checked.

use std::sync::LazyLock;

use redis::{Script, Value};

use super::scripts::{Call, Transition, script};
use super::{OperatorNote, PermitError, Permits, TaskStatus, array, millis, text, unexpected};

/// Send a failed or dead task again, owner-checked (`requeue.lua`).
pub(crate) static SCRIPT: LazyLock<Script> = LazyLock::new(|| script(include_str!("requeue.lua")));

/// The answer to [`Permits::requeue`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Requeue {
    /// The task is queued again under its key; it may make attempts up to `max_attempts`.
    Requeued {
        /// Attempts made before the requeue.
        attempts: u32,
        /// The task's new attempt limit (attempts made + its original budget).
        max_attempts: u32,
    },
    /// Another task owns the permit of this key now: nothing changed.
    Refused {
        /// The owner.
        owner: String,
    },
    /// The task is not `failed` or `dead`: nothing changed.
    NotRequeueable(TaskStatus),
    /// The task's message may be at the provider (an attempt's outcome was
    /// unknown and nothing settled it): requeued only with `force`.
    MaybeSent,
    /// No such task (never existed, or expired).
    Missing,
}

/// `requeue.lua`'s `KEYS` and `ARGV`.
struct RequeueArgs<'a> {
    /// KEYS[1]: the task hash.
    task: String,
    /// KEYS[2]: its permit.
    permit: String,
    /// KEYS[3]: the shard's ready stream.
    ready: String,
    /// KEYS[4]: the shard's failed-and-dead index.
    dead: String,
    /// KEYS[5]: the shard's awaiting index.
    awaiting: String,
    /// ARGV[1]: the task id.
    task_id: &'a str,
    /// ARGV[2]: how long an ended task is kept, ms.
    retention_ms: u64,
    /// ARGV[3]: requeue a task whose message may be at the provider.
    force: bool,
    /// ARGV[4], ARGV[5]: who and why, for `operator_log`.
    note: &'a OperatorNote,
}

impl Transition for RequeueArgs<'_> {
    const SCRIPT: &'static LazyLock<Script> = &SCRIPT;

    fn call(&self) -> Call<'_> {
        Call::default()
            .key(&*self.task)
            .key(&*self.permit)
            .key(&*self.ready)
            .key(&*self.dead)
            .key(&*self.awaiting)
            .arg(self.task_id)
            .num(self.retention_ms)
            .flag(self.force)
            .arg(&*self.note.by)
            .arg(&*self.note.why)
    }
}

impl Permits {
    /// Sends a `failed`, `dead` or held (`unknown`) task again under the same
    /// key and task id: re-takes the permit if it is free or still this
    /// task's, refuses if another task owns it (`requeue.lua`).
    /// `force` requeues a task whose message may already be at the provider,
    /// an `unknown` one always ([`Requeue::MaybeSent`] without it).
    pub async fn requeue(&self, task_id: &str, force: bool) -> Result<Requeue, PermitError> {
        self.requeue_by(task_id, force, &OperatorNote::default())
            .await
    }

    /// [`Permits::requeue`], recorded in the task's `operator_log` with who and why.
    pub(crate) async fn requeue_by(
        &self,
        task_id: &str,
        force: bool,
        note: &OperatorNote,
    ) -> Result<Requeue, PermitError> {
        let task_key = self.task_key(task_id)?;
        let shard = self.shard_of(task_id)?;
        let Some(key) = self.task_idempotency_key(&task_key).await? else {
            return Ok(Requeue::Missing);
        };
        let answer: Value = self
            .run(&RequeueArgs {
                permit: self.layout.permit_in(shard, &key),
                task: task_key,
                ready: self.layout.ready(shard),
                dead: self.layout.dead(shard),
                awaiting: self.layout.awaiting(shard),
                task_id,
                retention_ms: millis(self.config.retention).max(1),
                force,
                note,
            })
            .await?;
        let items = array(answer, "requeue")?;
        match text(items.first()).as_str() {
            "requeued" => Ok(Requeue::Requeued {
                attempts: text(items.get(1)).parse().unwrap_or(0),
                max_attempts: text(items.get(2)).parse().unwrap_or(0),
            }),
            "refused" => Ok(Requeue::Refused {
                owner: text(items.get(1)),
            }),
            "not_requeueable" => TaskStatus::parse(&text(items.get(1)))
                .map(Requeue::NotRequeueable)
                .ok_or_else(|| unexpected("requeue", &items)),
            "maybe_sent" => Ok(Requeue::MaybeSent),
            "missing" => Ok(Requeue::Missing),
            _ => Err(unexpected("requeue", &items)),
        }
    }
}
