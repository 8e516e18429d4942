//! Begin (`begin.lua`): a worker claims a lease on a task for one attempt.

use std::sync::LazyLock;
use std::time::Duration;

use redis::{Script, Value};

use super::listing::pairs;
use super::scripts::{Call, Transition, script};
use super::{PermitError, Permits, Task, TaskStatus, array, millis, text, unexpected};

/// Claim a lease for an attempt (`begin.lua`).
pub(crate) static SCRIPT: LazyLock<Script> = LazyLock::new(|| script(include_str!("begin.lua")));

/// An attempt a worker has begun: it holds the lease until `lease_until_ms`.
#[derive(Debug, Clone)]
pub struct Attempt {
    /// The task id.
    pub task_id: String,
    /// The fencing token of this lease; every later change must present it.
    pub token: String,
    /// Attempt number, 1 for the first.
    pub number: u32,
    /// End of the lease, Redis clock (ms since the epoch).
    pub lease_until_ms: u64,
    /// True when the lease was taken over from a worker that died mid-attempt.
    pub reclaimed: bool,
    /// The task as it was when the lease was taken.
    pub task: Task,
}

/// The answer to [`Permits::begin_attempt`].
#[derive(Debug, Clone)]
pub enum Begin {
    /// The lease is ours: send.
    Begun(Box<Attempt>),
    /// Another worker holds a live lease until this time (Redis clock, ms).
    Busy {
        /// End of that lease.
        lease_until_ms: u64,
    },
    /// Nothing to send: the task is in this status.
    Settled(TaskStatus),
    /// The permit belongs to a newer task with the same key; this one is now `superseded`.
    Superseded {
        /// The owner of the permit.
        by: String,
    },
    /// The task record does not exist (expired or never written).
    Missing,
    /// The worker's stream entry is gone: the task was recorded, and the
    /// entry acked, after this worker read or re-claimed it. Nothing to do.
    Gone,
}

/// What `extend.lua` takes first: `KEYS[1..2]` and `ARGV[1..4]`.
pub(super) struct Lease<'a> {
    /// KEYS[1]: the task hash.
    pub(super) task: String,
    /// KEYS[2]: its permit.
    pub(super) permit: String,
    /// ARGV[1]: the task id.
    pub(super) task_id: &'a str,
    /// ARGV[2]: the lease's fencing token.
    pub(super) token: &'a str,
    /// ARGV[3]: the lease from now, ms.
    pub(super) lease_ms: u64,
    /// ARGV[4]: how far past the lease end the permit is kept, ms.
    pub(super) grace_ms: u64,
}

impl Lease<'_> {
    /// Its part of the call, in the scripts' order.
    pub(super) fn call(&self) -> Call<'_> {
        Call::default()
            .key(&*self.task)
            .key(&*self.permit)
            .arg(self.task_id)
            .arg(self.token)
            .num(self.lease_ms)
            .num(self.grace_ms)
    }
}

/// `begin.lua`'s `KEYS` and `ARGV` for one task.
struct BeginArgs<'a> {
    /// KEYS[1]: the task hash (its permit is named from its `key` field, in the same slot).
    task: String,
    /// KEYS[2]: the shard's ready stream.
    ready: String,
    /// ARGV[1]: the task id.
    task_id: &'a str,
    /// ARGV[2]: the lease's fencing token.
    token: &'a str,
    /// ARGV[3]: the lease from now, ms.
    lease_ms: u64,
    /// ARGV[4]: how far past the lease end the permit is kept, ms.
    grace_ms: u64,
    /// ARGV[5]: how long a superseded task is kept, ms.
    retention_ms: u64,
    /// ARGV[6]: the stream entry the worker holds, or empty.
    entry_id: &'a str,
}

impl Transition for BeginArgs<'_> {
    const SCRIPT: &'static LazyLock<Script> = &SCRIPT;

    fn call(&self) -> Call<'_> {
        Call::default()
            .key(&*self.task)
            .key(&*self.ready)
            .arg(self.task_id)
            .arg(self.token)
            .num(self.lease_ms)
            .num(self.grace_ms)
            .num(self.retention_ms)
            .arg(self.entry_id)
    }
}

impl Permits {
    /// Claims a lease of `lease` on the task for one attempt, if it is
    /// `queued`, `retry_wait`, or `sending` under a lease that ran out. The
    /// permit (named by the task's idempotency key, read in the script) is
    /// extended past the lease end by the grace.
    /// Begun without a stream entry: a caller outside the dispatcher, whose
    /// attempt nothing re-claims should it vanish.
    pub async fn begin_attempt(
        &self,
        task_id: &str,
        lease: Duration,
    ) -> Result<Begin, PermitError> {
        self.begin_attempts(&[(task_id, "")], lease)
            .await?
            .pop()
            .unwrap_or_else(|| Err(unexpected("begin", &[])))
    }

    /// [`Permits::begin_attempt`] for several tasks of one shard in one
    /// script call, each `(task id, stream entry id)`: each task's
    /// answer is its own, in order (a malformed task id is its own error).
    /// A task whose entry (when given) is no longer in its shard's ready
    /// stream is [`Begin::Gone`] and unchanged: every attempt begun from an
    /// entry has that entry pending, for a reclaimer should its worker die.
    /// The call fails as a whole only when Redis did not answer.
    pub async fn begin_attempts(
        &self,
        tasks: &[(&str, &str)],
        lease: Duration,
    ) -> Result<Vec<Result<Begin, PermitError>>, PermitError> {
        let tokens: Vec<String> = tasks
            .iter()
            .map(|_| format!("{:016x}", rand::random::<u64>()))
            .collect();
        let mut out: Vec<Option<Result<Begin, PermitError>>> = Vec::with_capacity(tasks.len());
        let mut args = Vec::with_capacity(tasks.len());
        let mut asked = Vec::with_capacity(tasks.len());
        for (i, ((task_id, entry_id), token)) in tasks.iter().zip(&tokens).enumerate() {
            let named = self
                .shard_of(task_id)
                .and_then(|shard| Ok((self.task_key(task_id)?, self.layout.ready(shard))));
            match named {
                Ok((task, ready)) => {
                    out.push(None);
                    asked.push(i);
                    args.push(BeginArgs {
                        task,
                        ready,
                        task_id,
                        token,
                        lease_ms: millis(lease).max(1),
                        grace_ms: millis(self.config.grace),
                        retention_ms: millis(self.config.retention).max(1),
                        entry_id,
                    });
                }
                Err(e) => out.push(Some(Err(e))),
            }
        }
        if !args.is_empty() {
            let answers = self.run_batch(&args, "begin").await?;
            for (i, answer) in asked.into_iter().zip(answers) {
                out[i] = Some(begun(tasks[i].0, &tokens[i], answer));
            }
        }
        Ok(out
            .into_iter()
            .map(|a| a.unwrap_or_else(|| Err(unexpected("begin", &[]))))
            .collect())
    }
}

/// One task's answer of `begin.lua`.
fn begun(task_id: &str, token: &str, answer: Value) -> Result<Begin, PermitError> {
    let mut items = array(answer, "begin")?;
    let tag = text(items.first());
    match tag.as_str() {
        "begun" => {
            let number = text(items.get(1)).parse().unwrap_or(0);
            let lease_until_ms = text(items.get(2)).parse().unwrap_or(0);
            let reclaimed = text(items.get(3)) == "1";
            // Taken out of the answer, not cloned: every attempt reads them.
            let mut take = |i: usize| items.get_mut(i).map(|v| std::mem::replace(v, Value::Nil));
            let mut fields = pairs(take(4));
            // What the task takes from its event record: the event, its payload.
            fields.extend(pairs(take(5)));
            let task = Task::from_fields(task_id, fields).ok_or(PermitError::Unexpected {
                script: "begin",
                answer: "task without status".into(),
            })?;
            Ok(Begin::Begun(Box::new(Attempt {
                task_id: task_id.to_string(),
                token: token.to_string(),
                number,
                lease_until_ms,
                reclaimed,
                task,
            })))
        }
        "busy" => Ok(Begin::Busy {
            lease_until_ms: text(items.get(1)).parse().unwrap_or(0),
        }),
        "settled" => TaskStatus::parse(&text(items.get(1)))
            .map(Begin::Settled)
            .ok_or_else(|| unexpected("begin", &items)),
        "superseded" => Ok(Begin::Superseded {
            by: text(items.get(1)),
        }),
        "missing" => Ok(Begin::Missing),
        "gone" => Ok(Begin::Gone),
        _ => Err(unexpected("begin", &items)),
    }
}
