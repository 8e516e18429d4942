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
use crate::ledger::{Claim, ClaimAnswer, now_ms, recipient_digest};
use crate::permit::{Attempt, Outcome};

/// One attempt's answer of [`claim_batch`].
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

/// Claims the attempts' keys (a batch's: one transaction), waiting
/// (retrying with a growing pause up to [`RETRY_MAX`]) while the ledger
/// does not answer: no send without a claim. Each answer is its own:
/// another task owning one key stops that task only.
pub(crate) async fn claim_batch(shared: &DispatchContext, attempts: &[&Attempt]) -> Vec<Claimed> {
    let Some(ledger) = &shared.ledger else {
        return attempts
            .iter()
            .map(|_| Claimed::Ours { first: false })
            .collect();
    };
    let claims: Vec<Claim> = attempts.iter().map(|a| claim_of(a)).collect();
    let mut wait = Duration::from_millis(20);
    loop {
        match ledger.claim_all(&claims).await {
            Ok(answers) => {
                return answers
                    .into_iter()
                    .zip(attempts)
                    .map(|(answer, attempt)| match answer {
                        ClaimAnswer::Ours { first } => Claimed::Ours { first },
                        ClaimAnswer::Taken { owner, status } => {
                            tracing::warn!(task = %attempt.task_id, owner = %owner, owner_status = %status,
                                channel = %attempt.task.channel,
                                "duplicate prevented: the ledger holds this key for another task (Redis lost its permit)");
                            Claimed::Taken { owner }
                        }
                    })
                    .collect();
            }
            Err(e) => {
                tracing::warn!(tasks = attempts.len(), error = %e, "ledger unavailable; the send waits for a claim");
                if pause(shared, wait).await {
                    return attempts.iter().map(|_| Claimed::Stopped).collect();
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

/// Writes the outcome of an attempt to the ledger, when there is one
/// ([`crate::permit::note_outcome`]); an outcome that ends the task for good
/// is waited for at most a third of a lease. True when the ledger confirmed
/// it, and the task may leave Redis as it is recorded.
pub(crate) async fn note_outcome(
    shared: &DispatchContext,
    attempt: &Attempt,
    outcome: &Outcome,
    ends: bool,
) -> bool {
    let Some(ledger) = &shared.ledger else {
        return false;
    };
    let within = (shared.config.lease / 3).max(Duration::from_millis(10));
    crate::permit::note_outcome(ledger, attempt, outcome, ends, within, now_ms()).await
}
