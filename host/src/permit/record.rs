//! Record (`record.lua`): the outcome of an attempt, fenced by its lease
//! token; acks the attempt's stream entry in the same script.

use std::sync::LazyLock;
use std::time::Duration;

use redis::{Script, Value};

use super::scripts::{Call, Transition, script};
use super::{
    Attempt, HeldCause, PermitError, Permits, RecordContext, TaskStatus, array, millis, text,
    unexpected,
};

/// Record an attempt's outcome (`record.lua`).
pub(crate) static SCRIPT: LazyLock<Script> = LazyLock::new(|| script(include_str!("record.lua")));

/// The outcome of an attempt, to record.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// The provider accepted the message.
    Sent {
        /// The provider's id for it.
        provider_message_id: String,
        /// The client reference the plugin gave the provider, if its receipt named one.
        reference: Option<String>,
    },
    /// Failed retryably: try again after `delay`.
    Retry {
        /// Backoff before the next attempt.
        delay: Duration,
        /// Why it failed.
        reason: String,
    },
    /// Sent with no answer, and a resend with the same key is safe: try again
    /// after `delay`, like `Retry`, but remember the provider may have it
    /// (`maybe_sent`, so a later failure keeps the permit for the window).
    Resend {
        /// Backoff before the next attempt.
        delay: Duration,
        /// What happened.
        reason: String,
        /// The resend is safe because the provider dedupes the same client
        /// reference (inside its window): the task is marked `resend_by` =
        /// `reference` so the worker decides again if it comes due past it.
        by_reference: bool,
    },
    /// Sent with no answer: hold for reconciliation.
    Unknown {
        /// What happened.
        reason: String,
    },
    /// Refused for good: `failed`.
    Failed {
        /// The provider's reason.
        reason: String,
    },
    /// Attempts exhausted: `dead`.
    Dead {
        /// The last failure.
        reason: String,
    },
    /// The ledger names another task as the owner of this key: Redis lost
    /// that task's permit (a failover) and this task must never send. Ends
    /// `duplicate_prevented`; the permit, if this task holds it, is kept for
    /// the window so later re-posts are answered `duplicate`.
    DuplicatePrevented {
        /// The owner of the key in the ledger.
        owner: String,
    },
    /// The recipient switched the channel (or the message's category) off
    /// since the accept (`opted_out.rs`): nothing is sent, the attempt is
    /// uncounted and the task ends `cancelled`. The permit is released,
    /// unless an earlier attempt may have reached the provider (then it is
    /// kept for the window).
    OptedOut {
        /// What the recipient switched off, as the task's error says it.
        reason: String,
    },
    /// Nothing was sent and the attempt is given back (the ledger could not
    /// be reached before shutdown): the task returns to `queued` with its
    /// attempt uncounted, its stream entry left pending to be re-claimed.
    Release,
}

/// What became of the permit when an outcome was recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PermitFate {
    /// Still held (for the window, a retry, or while unknown).
    Kept,
    /// Released (deleted owner-checked): the task ended with nothing sent.
    Released,
    /// It had lapsed and was taken back for the window (the task was sent).
    Retaken,
    /// Another task owns it; left alone.
    NotOwner,
}

/// The answer to [`Permits::record`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Recorded {
    /// The outcome was written.
    Done(PermitFate),
    /// The lease was lost (another worker took over, or the task moved on): nothing was written.
    Fenced {
        /// The task's status at that moment (`None` if it is gone).
        status: Option<TaskStatus>,
    },
}

/// One task of a stream entry a worker is processing; the record script
/// acks the entry once no task it names needs it (`lib.lua`'s `ack_entry`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Shard of the stream.
    pub shard: u16,
    /// Stream entry id.
    pub id: String,
    /// The task (one of those the entry names).
    pub task_id: String,
}

impl Entry {
    /// One per task that ready entry `id` of `shard` names in its `task`
    /// field `tasks`: one id, or an event's tasks accepted together in one
    /// shard, space-separated (`accept.lua`). None for an empty field.
    pub fn of_stream_entry(shard: u16, id: &str, tasks: &str) -> Vec<Entry> {
        tasks
            .split_whitespace()
            .map(|task| Entry {
                shard,
                id: id.to_string(),
                task_id: task.to_string(),
            })
            .collect()
    }
}

/// `record.lua`'s `KEYS` and `ARGV`, named (see the script's header).
struct RecordArgs<'a> {
    /// KEYS[1]: the task hash.
    task: String,
    /// KEYS[2]: its permit.
    permit: String,
    /// KEYS[3]: the shard's ready stream.
    ready: String,
    /// KEYS[4]: the shard's delayed set.
    delayed: String,
    /// KEYS[5]: the shard's awaiting index.
    awaiting: String,
    /// ARGV[1]: the task id.
    task_id: &'a str,
    /// ARGV[2]: the lease's fencing token.
    token: &'a str,
    /// ARGV[3]: the outcome's name, ARGV[8] its retry delay, ARGV[9] the
    /// provider's id, ARGV[10] its reason, ARGV[13] its client reference.
    outcome: OutcomeArgs<'a>,
    /// ARGV[4]: the stream entry to ack, or empty.
    entry_id: &'a str,
    /// ARGV[5]: the consumer group.
    group: &'a str,
    /// ARGV[6]: how long an ended task is kept, ms.
    retention_ms: u64,
    /// ARGV[7]: how far past a lease or due time the permit is kept, ms.
    grace_ms: u64,
    /// ARGV[11]: when a `sent` task is first checked, ms; `None` (`-1`):
    /// its channel cannot confirm it, `sent` is final.
    check_sent_after_ms: Option<u64>,
    /// ARGV[12]: when an `unknown` task is first checked, ms.
    check_unknown_after_ms: u64,
    /// ARGV[14]: why an `unknown` or `dead` task is held (JSON), or empty.
    held_cause: String,
    /// ARGV[15]: the provider's last answer as the plugin saw it, or empty.
    provider_answer: &'a str,
    /// ARGV[16]: what a task that ended for good keeps once the ledger
    /// holds its outcome, ms (0: it leaves); `None` (empty): the ledger
    /// does not hold it, it keeps the retention.
    ended_keep_ms: Option<u64>,
    /// ARGV[17]: `1` when a `failed` or `dead` task keeps its permit even
    /// with nothing sent (the ledger may still hold its row of the key).
    keep_permit: bool,
}

impl Transition for RecordArgs<'_> {
    const SCRIPT: &'static LazyLock<Script> = &SCRIPT;

    fn call(&self) -> Call<'_> {
        Call::default()
            .key(&*self.task)
            .key(&*self.permit)
            .key(&*self.ready)
            .key(&*self.delayed)
            .key(&*self.awaiting)
            .arg(self.task_id)
            .arg(self.token)
            .arg(self.outcome.name)
            .arg(self.entry_id)
            .arg(self.group)
            .num(self.retention_ms)
            .num(self.grace_ms)
            .num(self.outcome.delay)
            .arg(self.outcome.provider_id)
            .arg(self.outcome.reason)
            .num_or(self.check_sent_after_ms, "-1")
            .num(self.check_unknown_after_ms)
            .arg(self.outcome.reference)
            .arg(&*self.held_cause)
            .arg(self.provider_answer)
            .num_or(self.ended_keep_ms, "")
            .arg(if self.keep_permit { "1" } else { "0" })
    }
}

impl Permits {
    /// Records the outcome of an attempt, fenced by its lease token, and acks
    /// its stream entry (when given) in the same script.
    pub async fn record(
        &self,
        attempt: &Attempt,
        outcome: &Outcome,
        entry: Option<&Entry>,
    ) -> Result<Recorded, PermitError> {
        self.record_with(attempt, outcome, entry, RecordContext::default())
            .await
    }

    /// Records an outcome like [`Permits::record`], with what the worker
    /// knows beside it: whether a `sent` message can be checked later
    /// (else it is not awaited), and why an `unknown` or `dead` one is held
    /// (else derived from the outcome: `unknown` is
    /// [`HeldCause::CutOffAfterWrite`], `dead` [`HeldCause::RetriesExhausted`]).
    pub async fn record_with(
        &self,
        attempt: &Attempt,
        outcome: &Outcome,
        entry: Option<&Entry>,
        context: RecordContext,
    ) -> Result<Recorded, PermitError> {
        self.record_all(&[ToRecord {
            attempt,
            outcome,
            entry,
            context,
        }])
        .await?
        .pop()
        .unwrap_or_else(|| Err(unexpected("record", &[])))
    }

    /// [`Permits::record_with`] for attempts of one shard's tasks in one
    /// script call: each outcome fenced by its own lease token and written
    /// as if alone; one answer each, in order. The call fails as a whole
    /// only when Redis did not answer (then nothing or everything of it was
    /// written: a script runs whole).
    pub async fn record_all(
        &self,
        records: &[ToRecord<'_>],
    ) -> Result<Vec<Result<Recorded, PermitError>>, PermitError> {
        if records.is_empty() {
            return Ok(Vec::new());
        }
        let held: Vec<(String, &str)> = records
            .iter()
            .map(|r| held_of(r.outcome, r.context.held))
            .collect();
        let args = records
            .iter()
            .zip(&held)
            .map(|(r, (held_cause, provider_answer))| {
                let attempt = r.attempt;
                let shard = self.shard_of(&attempt.task_id)?;
                Ok(RecordArgs {
                    task: self.task_key(&attempt.task_id)?,
                    permit: self.layout.permit_in(shard, &attempt.task.key),
                    ready: self.layout.ready(shard),
                    delayed: self.layout.delayed(shard),
                    awaiting: self.layout.awaiting(shard),
                    task_id: &attempt.task_id,
                    token: &attempt.token,
                    outcome: OutcomeArgs::of(r.outcome),
                    entry_id: r.entry.map(|e| e.id.as_str()).unwrap_or(""),
                    group: &self.config.group,
                    retention_ms: millis(self.config.retention).max(1),
                    grace_ms: millis(self.config.grace),
                    check_sent_after_ms: r
                        .context
                        .checkable
                        .then(|| millis(self.config.check_sent_after)),
                    check_unknown_after_ms: millis(self.config.check_unknown_after),
                    held_cause: held_cause.clone(),
                    provider_answer,
                    ended_keep_ms: r.context.ledger_holds_outcome.then(|| self.ended_keep_ms()),
                    keep_permit: r.context.ledger_keeps_key,
                })
            })
            .collect::<Result<Vec<_>, PermitError>>()?;
        Ok(self
            .run_batch(&args, "record")
            .await?
            .into_iter()
            .map(|answer| recorded(array(answer, "record")?))
            .collect())
    }
}

/// One outcome to record with [`Permits::record_all`].
#[derive(Debug, Clone, Copy)]
pub struct ToRecord<'a> {
    /// The attempt (its lease token fences the record).
    pub attempt: &'a Attempt,
    /// What came of it.
    pub outcome: &'a Outcome,
    /// The stream entry to ack with it, if any.
    pub entry: Option<&'a Entry>,
    /// What the worker knows beside the outcome.
    pub context: RecordContext,
}

/// The held cause (JSON, or '' when the outcome holds nothing) and the
/// provider's last answer recorded with `outcome`.
fn held_of(outcome: &Outcome, given: Option<HeldCause>) -> (String, &str) {
    let (derived, answer) = match outcome {
        Outcome::Unknown { reason } => (HeldCause::CutOffAfterWrite, reason.as_str()),
        Outcome::Dead { reason } => (HeldCause::RetriesExhausted, reason.as_str()),
        _ => return (String::new(), ""),
    };
    let cause = given.unwrap_or(derived);
    let answer = match cause {
        // No answer reached this worker: the reason is the host's own words.
        HeldCause::WorkerVanished { .. } | HeldCause::QueryCouldNotTell => "",
        HeldCause::CutOffAfterWrite | HeldCause::RetriesExhausted => answer,
    };
    (cause.to_json(), answer)
}

/// The arguments of `record.lua` that come from an attempt's outcome.
struct OutcomeArgs<'a> {
    /// The outcome's name in the script.
    name: &'static str,
    /// Delay before the next attempt, ms.
    delay: u64,
    /// The provider's message id (sent).
    provider_id: &'a str,
    /// Why (or, for a prevented duplicate, the owner).
    reason: &'a str,
    /// The client reference it was sent with (sent).
    reference: &'a str,
}

impl<'a> OutcomeArgs<'a> {
    fn of(outcome: &'a Outcome) -> OutcomeArgs<'a> {
        let args = |name, delay, provider_id, reason| OutcomeArgs {
            name,
            delay,
            provider_id,
            reason,
            reference: "",
        };
        match outcome {
            Outcome::Sent {
                provider_message_id,
                reference,
            } => OutcomeArgs {
                reference: reference.as_deref().unwrap_or(""),
                ..args("sent", 0, provider_message_id.as_str(), "")
            },
            Outcome::Retry { delay, reason } => args("retry", millis(*delay), "", reason.as_str()),
            Outcome::Resend {
                delay,
                reason,
                by_reference,
            } => args(
                if *by_reference {
                    "resend_by_reference"
                } else {
                    "resend"
                },
                millis(*delay),
                "",
                reason.as_str(),
            ),
            Outcome::Unknown { reason } => args("unknown", 0, "", reason.as_str()),
            Outcome::Failed { reason } => args("failed", 0, "", reason.as_str()),
            Outcome::Dead { reason } => args("dead", 0, "", reason.as_str()),
            Outcome::DuplicatePrevented { owner } => {
                args("duplicate_prevented", 0, "", owner.as_str())
            }
            Outcome::OptedOut { reason } => args("opted_out", 0, "", reason.as_str()),
            Outcome::Release => args("release", 0, "", ""),
        }
    }
}

/// `record.lua`'s answer.
fn recorded(items: Vec<Value>) -> Result<Recorded, PermitError> {
    match text(items.first()).as_str() {
        "recorded" => Ok(Recorded::Done(match text(items.get(1)).as_str() {
            "kept" => PermitFate::Kept,
            "released" => PermitFate::Released,
            "retaken" => PermitFate::Retaken,
            _ => PermitFate::NotOwner,
        })),
        "fenced" => Ok(Recorded::Fenced {
            status: TaskStatus::parse(&text(items.get(1))),
        }),
        _ => Err(unexpected("record", &items)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::permit::scripts::Arg;

    /// The named fields land where `record.lua`'s header says: ARGV[11]
    /// `-1` for a sent task nobody can check, ARGV[13] the reference,
    /// ARGV[16] empty when the ledger does not hold the outcome, ARGV[17]
    /// `1` when the permit is kept.
    #[test]
    fn record_args_follow_the_scripts_positions() {
        let outcome = Outcome::Sent {
            provider_message_id: "pm-1".into(),
            reference: Some("ref-1".into()),
        };
        let args = RecordArgs {
            task: "T".into(),
            permit: "P".into(),
            ready: "R".into(),
            delayed: "D".into(),
            awaiting: "A".into(),
            task_id: "t-1",
            token: "tok",
            outcome: OutcomeArgs::of(&outcome),
            entry_id: "1-0",
            group: "g",
            retention_ms: 6,
            grace_ms: 7,
            check_sent_after_ms: None,
            check_unknown_after_ms: 12,
            held_cause: String::new(),
            provider_answer: "",
            ended_keep_ms: None,
            keep_permit: true,
        };
        let call = args.call();
        assert_eq!(call.keys, ["T", "P", "R", "D", "A"]);
        let argv: Vec<String> = call.args.iter().map(Arg::to_text).collect();
        assert_eq!(
            argv,
            [
                "t-1", "tok", "sent", "1-0", "g", "6", "7", "0", "pm-1", "", "-1", "12", "ref-1",
                "", "", "", "1"
            ]
        );
    }
}
