//! Settle (`settle.lua`): an operator settles a held, failed or dead task
//! without a send, owner- and state-checked.

use std::sync::LazyLock;

use redis::{Script, Value};

use super::scripts::{Call, Transition, script};
use super::{OperatorNote, PermitError, Permits, TaskStatus, array, millis, text, unexpected};

/// Settle a task without a send by an operator: delivered or given up (`settle.lua`).
pub(crate) static SCRIPT: LazyLock<Script> = LazyLock::new(|| script(include_str!("settle.lua")));

/// How an operator settles a task without a send ([`Permits::settle`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settle {
    /// The message arrived (the operator confirmed it): `delivered`.
    Delivered,
    /// Nobody will send it: `failed`, off the operators' lists.
    GivenUp,
}

impl Settle {
    /// Its name in `settle.lua` and `operator_log`.
    pub fn as_str(self) -> &'static str {
        match self {
            Settle::Delivered => "delivered",
            Settle::GivenUp => "given_up",
        }
    }
}

/// The answer to [`Permits::settle`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Settled {
    /// Settled: the task's status now.
    Settled(TaskStatus),
    /// Another task owns the permit of this key now: nothing changed.
    Refused {
        /// The owner.
        owner: String,
    },
    /// The task is not held, failed or dead (nor `sent`, to deliver): nothing changed.
    NotSettleable(TaskStatus),
    /// No such task (never existed, or expired).
    Missing,
}

/// `settle.lua`'s `KEYS` and `ARGV`.
struct SettleArgs<'a> {
    /// KEYS[1]: the task hash.
    task: String,
    /// KEYS[2]: its permit.
    permit: String,
    /// KEYS[3]: the shard's failed-and-dead index.
    dead: String,
    /// KEYS[4]: the shard's awaiting index (the held index is named after it).
    awaiting: String,
    /// ARGV[1]: the task id.
    task_id: &'a str,
    /// ARGV[2]: how.
    how: Settle,
    /// ARGV[3]: how long an ended task is kept, ms.
    retention_ms: u64,
    /// ARGV[4], ARGV[5]: who and why, for `operator_log`.
    note: &'a OperatorNote,
}

impl Transition for SettleArgs<'_> {
    const SCRIPT: &'static LazyLock<Script> = &SCRIPT;

    fn call(&self) -> Call<'_> {
        Call::default()
            .key(&*self.task)
            .key(&*self.permit)
            .key(&*self.dead)
            .key(&*self.awaiting)
            .arg(self.task_id)
            .arg(self.how.as_str())
            .num(self.retention_ms)
            .arg(&*self.note.by)
            .arg(&*self.note.why)
    }
}

impl Permits {
    /// Settles a held, failed or dead task without a send (`settle.lua`):
    /// [`Settle::Delivered`] (also from `sent`) or [`Settle::GivenUp`]
    /// (`failed`); owner-checked, the permit kept for the window, recorded
    /// in the task's `operator_log` with who and why.
    pub async fn settle(
        &self,
        task_id: &str,
        how: Settle,
        note: &OperatorNote,
    ) -> Result<Settled, PermitError> {
        let task_key = self.task_key(task_id)?;
        let shard = self.shard_of(task_id)?;
        let Some(key) = self.task_idempotency_key(&task_key).await? else {
            return Ok(Settled::Missing);
        };
        let answer: Value = self
            .run(&SettleArgs {
                permit: self.layout.permit_in(shard, &key),
                task: task_key,
                dead: self.layout.dead(shard),
                awaiting: self.layout.awaiting(shard),
                task_id,
                how,
                retention_ms: millis(self.config.retention).max(1),
                note,
            })
            .await?;
        let items = array(answer, "settle")?;
        let status = || TaskStatus::parse(&text(items.get(1)));
        match text(items.first()).as_str() {
            "settled" => status()
                .map(Settled::Settled)
                .ok_or_else(|| unexpected("settle", &items)),
            "refused" => Ok(Settled::Refused {
                owner: text(items.get(1)),
            }),
            "not_settleable" => status()
                .map(Settled::NotSettleable)
                .ok_or_else(|| unexpected("settle", &items)),
            "missing" => Ok(Settled::Missing),
            _ => Err(unexpected("settle", &items)),
        }
    }
}
