//! The ledger note of a transition: what the delivery ledger is told when
//! a task's status changes, and the task leaving Redis once the ledger
//! holds how it ended (`forget.lua`). Redis holds what is in flight; the
//! ledger is the history. Every caller (a worker's record, a receipt, a
//! reconciler check, an operator) goes through here, so the ledger is
//! written one way.

use std::time::Duration;

use super::{Attempt, Outcome, PermitFate, Permits, Task};
use crate::ledger::{Claim, Ledger, Update, now_ms, recipient_digest};

/// The task's operator log (one JSON line per step), when an operator acted on it.
pub(crate) fn operator_log(task: &Task) -> Option<String> {
    task.fields
        .get("operator_log")
        .filter(|log| !log.is_empty())
        .cloned()
}

/// The ledger update an attempt's `outcome` gives at `at_ms`; `None` for an
/// outcome the ledger does not record (a prevented duplicate: the ledger
/// names the key's owner already; a release: nothing happened; an opt-out:
/// [`Permits::note_cancelled`] writes it, as for a cancel).
fn outcome_update(attempt: &Attempt, outcome: &Outcome, at_ms: i64) -> Option<Update> {
    let (status, provider_message_id, error) = match outcome {
        Outcome::Sent {
            provider_message_id,
            ..
        } => ("sent", Some(provider_message_id.clone()), None),
        Outcome::Retry { reason, .. } | Outcome::Resend { reason, .. } => {
            ("retry_wait", None, Some(reason.clone()))
        }
        Outcome::Unknown { reason } => ("unknown", None, Some(reason.clone())),
        Outcome::Failed { reason } => ("failed", None, Some(reason.clone())),
        Outcome::Dead { reason } => ("dead", None, Some(reason.clone())),
        Outcome::DuplicatePrevented { .. } | Outcome::OptedOut { .. } | Outcome::Release => {
            return None;
        }
    };
    Some(Update {
        key: attempt.task.key.clone(),
        task_id: attempt.task_id.clone(),
        status: status.into(),
        attempts: Some(attempt.number),
        provider_message_id: provider_message_id.filter(|p| !p.is_empty()),
        error,
        at_ms,
        // An operator's steps (a requeue) go with the outcome: the ledger
        // keeps them once the task leaves Redis.
        operator_note: operator_log(&attempt.task),
    })
}

/// What the ledger holds once an attempt's outcome was noted
/// ([`note_outcome`]); without a ledger, nothing (the default).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Noted {
    /// The ledger confirmed an outcome that ends the task for good: the
    /// task may leave Redis as it is recorded
    /// ([`RecordContext::ledger_holds_outcome`](super::RecordContext)).
    pub(crate) holds_outcome: bool,
    /// The ledger may still hold the task's row of its key: its permit
    /// stays, whatever was sent ([`RecordContext::ledger_keeps_key`](super::RecordContext)).
    pub(crate) keeps_key: bool,
}

/// Whether recording `outcome` releases the task's permit (`record.lua`):
/// it ends failed or dead and nothing of it may have reached the provider
/// (a Bloom mode task's filter bits guard its key instead).
fn frees_key(attempt: &Attempt, outcome: &Outcome) -> bool {
    let task = &attempt.task;
    matches!(outcome, Outcome::Failed { .. } | Outcome::Dead { .. })
        && !task.ever_sent
        && !task.maybe_sent
        && task.fields.get("dedup").is_none_or(|d| d != "bloom")
}

/// Writes the outcome of an attempt to `ledger`, before Redis records it
/// (so a look-up never shows less than before). An outcome that ends the
/// task for good (`ends`: sent with nothing to await, failed with its
/// fallback taken) is waited for, at most `within`. One that releases the
/// permit with nothing sent takes the task's row out instead, at most
/// `within` (the task keeps Redis's retention, its history): a corrected
/// re-post is accepted by Redis and must not be refused by the claim.
/// Other outcomes are only queued for the batched writer.
pub(crate) async fn note_outcome(
    ledger: &Ledger,
    attempt: &Attempt,
    outcome: &Outcome,
    ends: bool,
    within: Duration,
    at_ms: i64,
) -> Noted {
    let kept = Noted {
        holds_outcome: false,
        keeps_key: true,
    };
    if frees_key(attempt, outcome) {
        let freed = ledger
            .release_confirmed(&attempt.task.key, &attempt.task_id, within)
            .await;
        return Noted {
            keeps_key: !freed,
            ..kept
        };
    }
    let Some(update) = outcome_update(attempt, outcome, at_ms) else {
        return kept;
    };
    if ends {
        return Noted {
            holds_outcome: ledger.update_confirmed(update, within).await,
            ..kept
        };
    }
    if let Err(e) = ledger.update(update).await {
        tracing::warn!(task = %attempt.task_id, error = %e, "could not queue the ledger update");
    }
    kept
}

/// How a task that ended in Redis ended, for its ledger row
/// ([`Permits::settle_and_forget`]).
#[derive(Debug, Clone, Default)]
pub(crate) struct Settlement<'a> {
    /// Its status: `delivered`, `failed`, or an operator's.
    pub(crate) status: &'a str,
    /// The last error recorded with it, if any (kept as is without).
    pub(crate) error: Option<String>,
    /// An operator's note, if any.
    pub(crate) note: Option<String>,
}

/// A task a provider's answer (a receipt) settled, for its ledger row
/// ([`Permits::note_receipts`]).
#[derive(Debug, Clone, PartialEq)]
pub struct SettledByProvider {
    /// The task as it was read before.
    pub task: Task,
    /// `delivered` or `failed`.
    pub status: &'static str,
    /// It ended for good: it leaves Redis once the ledger holds it.
    pub ends: bool,
    /// The error recorded with it (why its fallbacks were passed over), if any.
    pub error: Option<String>,
}

impl Permits {
    /// Writes a task that ended in Redis (a receipt, a reconciler check or
    /// an operator settled it `status`, with `error` as its last error when
    /// one was recorded) to `ledger` and, once the ledger
    /// confirms it and `leaves` (it ended for good), lets the task leave
    /// Redis ([`Permits::forget`]): the ledger is its history from then on.
    /// Unconfirmed, the task keeps Redis's retention. Errors are logged.
    pub(crate) async fn settle_and_forget(
        &self,
        ledger: &Ledger,
        task: &Task,
        settled: Settlement<'_>,
        leaves: bool,
    ) {
        // Without a note of its own, the operators' earlier steps (a requeue)
        // go to the ledger with the outcome: it keeps them once the task left.
        let note = settled.note.or_else(|| operator_log(task));
        if !ledger
            .write_settled(&task.key, &task.id, settled.status, settled.error, note)
            .await
            || !leaves
        {
            return;
        }
        if let Err(e) = self.forget(task, settled.status).await {
            tracing::warn!(task = %task.id, error = %e, "could not let the settled task leave Redis; it keeps the retention");
        }
    }

    /// Writes what one receipt settled to `ledger`: each task settled now
    /// (the task as it was, `delivered`|`failed`, whether it ended for good)
    /// through [`Permits::settle_and_forget`]; each one that had already
    /// left Redis (`late`: task id, status) only to its ledger row, Redis
    /// untouched (the task is not resurrected).
    pub(crate) async fn note_receipts(
        &self,
        ledger: &Ledger,
        channel: &str,
        settled: &[SettledByProvider],
        late: &[(String, &'static str)],
    ) {
        for s in settled {
            let how = Settlement {
                status: s.status,
                error: s.error.clone(),
                note: None,
            };
            self.settle_and_forget(ledger, &s.task, how, s.ends).await;
        }
        for (task_id, status) in late {
            ledger.settle_late(task_id, channel, status).await;
        }
    }

    /// Writes a task cancelled before its first attempt (`task` as it was
    /// read before [`Permits::cancel`], whose permit met `fate`), or one an
    /// opt-out stopped at its attempt (`error` saying so), to
    /// `ledger` and, once the ledger confirms it, lets the task leave Redis
    /// ([`Permits::forget`]). Its row is written only while the task keeps
    /// its permit: the row guards the key as the permit does, and a released
    /// key (or one another task holds) must stay claimable, so there the
    /// task's own row, if any, goes and the task keeps Redis's retention as
    /// its only record. Errors are logged.
    pub(crate) async fn note_cancelled(
        &self,
        ledger: &Ledger,
        task: &Task,
        fate: PermitFate,
        error: Option<&str>,
    ) {
        let row = task.claim(&task.id, 0, now_ms());
        let keeps_key = fate == PermitFate::Kept;
        if !ledger.write_cancelled(&row, !keeps_key, error).await || !keeps_key {
            return;
        }
        if let Err(e) = self.forget(task, "cancelled").await {
            tracing::warn!(task = %task.id, error = %e, "could not let the cancelled task leave Redis; it keeps the retention");
        }
    }
}

impl Task {
    /// This task's ledger row for `attempt` (0: none, a cancel) at `now`,
    /// as `task_id`: the key, who and what it is for, and the end of its
    /// window, counted from the latest of now, the accept and the first
    /// attempt's schedule (quiet hours or `send_at`), as `lib.lua`'s
    /// `window_end` counts the permit's.
    pub(crate) fn claim(&self, task_id: &str, attempt: u32, now: i64) -> Claim {
        let user = serde_json::from_str::<serde_json::Value>(&self.event_json)
            .ok()
            .and_then(|v| v.get("user_id").and_then(|u| u.as_str()).map(str::to_owned))
            .unwrap_or_default();
        let window = i64::try_from(self.window_ms).unwrap_or(i64::MAX);
        let accepted = i64::try_from(self.accepted_at_ms).unwrap_or(i64::MAX);
        let scheduled = self
            .fields
            .get("scheduled_for")
            .and_then(|s| s.parse::<i64>().ok())
            .unwrap_or(0);
        Claim {
            key: self.key.clone(),
            task_id: task_id.to_string(),
            channel: self.channel.clone(),
            policy: format!("{}@{}", self.policy_name, self.policy_version),
            recipient_digest: recipient_digest(&user),
            biz_type: self.biz_type.clone(),
            biz_id: self.biz_id.clone(),
            attempt,
            now_ms: now,
            window_ends_ms: now.max(accepted).max(scheduled).saturating_add(window),
            accepted_ms: accepted,
        }
    }
}
