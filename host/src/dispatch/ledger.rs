//! The dispatcher's side of the delivery ledger ([`crate::ledger`]): the
//! claim before a send, and the outcome written after it.
//!
//! Redis's permit stops duplicates as long as Redis keeps what it
//! acknowledged. A replica promoted after a failover may not have the
//! permit of a task that was accepted (and sent); the business service's
//! re-post is then accepted again as a new task. Its claim finds the key
//! owned by the first task: it ends `duplicate_prevented` without sending.

use std::time::Duration;

use super::{DispatchContext, pause};
use crate::ledger::{Claim, ClaimAnswer, Ledger, Update, now_ms, recipient_digest};
use crate::permit::{Attempt, Outcome, Permits, Task};

/// The answer of [`claim`].
pub(crate) enum Claimed {
    /// The key is this task's (or no ledger is configured): send.
    Ours {
        /// No earlier attempt of the task claimed the key, so none sent
        /// anything (false without a ledger: nothing tells).
        first: bool,
    },
    /// Another task owns the key: do not send.
    Taken {
        /// That task.
        owner: String,
    },
    /// Shutting down before the ledger answered: give the attempt back.
    Stopped,
}

/// Longest pause between two claims while the ledger is down.
const RETRY_MAX: Duration = Duration::from_secs(1);

/// Claims the attempt's key, waiting (retrying with a growing pause up to
/// [`RETRY_MAX`]) while the ledger does not answer: no send without a claim.
pub(crate) async fn claim(shared: &DispatchContext, attempt: &Attempt) -> Claimed {
    let Some(ledger) = &shared.ledger else {
        return Claimed::Ours { first: false };
    };
    let claim = claim_of(attempt);
    let mut wait = Duration::from_millis(20);
    loop {
        match ledger.claim(&claim).await {
            Ok(ClaimAnswer::Ours { first }) => return Claimed::Ours { first },
            Ok(ClaimAnswer::Taken { owner, status }) => {
                tracing::warn!(task = %attempt.task_id, owner = %owner, owner_status = %status,
                    channel = %attempt.task.channel,
                    "duplicate prevented: the ledger holds this key for another task (Redis lost its permit)");
                return Claimed::Taken { owner };
            }
            Err(e) => {
                tracing::warn!(task = %attempt.task_id, error = %e, "ledger unavailable; the send waits for a claim");
                if pause(shared, wait).await {
                    return Claimed::Stopped;
                }
                wait = (wait * 2).min(RETRY_MAX);
            }
        }
    }
}

/// The claim of an attempt.
fn claim_of(attempt: &Attempt) -> Claim {
    let task = &attempt.task;
    let user = serde_json::from_str::<serde_json::Value>(&task.event_json)
        .ok()
        .and_then(|v| v.get("user_id").and_then(|u| u.as_str()).map(str::to_owned))
        .unwrap_or_default();
    let now = now_ms();
    Claim {
        key: task.key.clone(),
        task_id: attempt.task_id.clone(),
        channel: task.channel.clone(),
        policy: format!("{}@{}", task.policy_name, task.policy_version),
        recipient_digest: recipient_digest(&user),
        biz_type: task.biz_type.clone(),
        biz_id: task.biz_id.clone(),
        attempt: attempt.number,
        now_ms: now,
        window_ends_ms: window_end(task, now),
    }
}

/// When the window of the attempt's key ends: a window from now, or from
/// the accept if Redis's clock put that later. The permit lives at most that
/// long unless held (a retry's or a requeue's claim pushes the end again).
fn window_end(task: &crate::permit::Task, now: i64) -> i64 {
    let window = i64::try_from(task.window_ms).unwrap_or(i64::MAX);
    let accepted = i64::try_from(task.accepted_at_ms).unwrap_or(i64::MAX);
    now.max(accepted).saturating_add(window)
}

/// Writes the outcome of an attempt to the ledger, before Redis records it
/// (so a look-up never shows less than before). An outcome that ends the
/// task for good (`ends`: sent with nothing to await, failed with its
/// fallback taken) is waited for, at most a third of a lease: true when the
/// ledger confirmed it, and the task may leave Redis as it is recorded.
/// Other outcomes are only queued for the batched writer (false).
pub(crate) async fn note_outcome(
    shared: &DispatchContext,
    attempt: &Attempt,
    outcome: &Outcome,
    ends: bool,
) -> bool {
    let Some(ledger) = &shared.ledger else {
        return false;
    };
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
        Outcome::DuplicatePrevented { .. } | Outcome::Release => return false,
    };
    let update = Update {
        key: attempt.task.key.clone(),
        task_id: attempt.task_id.clone(),
        status: status.into(),
        attempts: Some(attempt.number),
        provider_message_id: provider_message_id.filter(|p| !p.is_empty()),
        error,
        at_ms: now_ms(),
        // An operator's steps (a requeue) go with the outcome: the ledger
        // keeps them once the task leaves Redis.
        operator_note: operator_log(&attempt.task),
    };
    if ends {
        let within = (shared.config.lease / 3).max(Duration::from_millis(10));
        return ledger.update_confirmed(update, within).await;
    }
    if let Err(e) = ledger.update(update).await {
        tracing::warn!(task = %attempt.task_id, error = %e, "could not queue the ledger update");
    }
    false
}

/// The task's operator log (one JSON line per step), when an operator acted on it.
pub(crate) fn operator_log(task: &Task) -> Option<String> {
    task.fields
        .get("operator_log")
        .filter(|log| !log.is_empty())
        .cloned()
}

/// Writes a task that ended in Redis (a receipt, a reconciler check or an
/// operator settled it `status`) to `ledger` and, once the ledger confirms
/// it and `leaves` (it ended for good), lets the task leave Redis
/// ([`Permits::forget`]): the ledger is its history from then on.
/// Unconfirmed, the task keeps Redis's retention. Errors are logged.
pub(crate) async fn settle_and_forget(
    ledger: &Ledger,
    permits: &Permits,
    task: &Task,
    status: &str,
    note: Option<String>,
    leaves: bool,
) {
    // Without a note of its own, the operators' earlier steps (a requeue)
    // go to the ledger with the outcome: it keeps them once the task left.
    let note = note.or_else(|| operator_log(task));
    if !ledger
        .write_settled(&task.key, &task.id, status, note)
        .await
        || !leaves
    {
        return;
    }
    if let Err(e) = permits.forget(task, status).await {
        tracing::warn!(task = %task.id, error = %e, "could not let the settled task leave Redis; it keeps the retention");
    }
}
