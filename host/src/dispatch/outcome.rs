//! What a channel's answer becomes: the outcome a worker records (sent,
//! retry, resend, held, failed with its fallback accepted first).

use super::lease::with_lease;
use super::{DispatchContext, backoff};
use crate::metric_names as names;
use crate::permit::{Attempt, Outcome};
use crate::send::{OutgoingMessage, SendOutcome, UnknownVerdict};

/// The outcome to record for the channel's answer `result` to `msg`.
pub(super) async fn outcome_of(
    shared: &DispatchContext,
    attempt: &Attempt,
    msg: &OutgoingMessage,
    result: SendOutcome,
) -> Outcome {
    match result {
        SendOutcome::Sent {
            provider_message_id,
            reference,
        } => Outcome::Sent {
            provider_message_id,
            reference,
        },
        SendOutcome::Retryable { reason, .. }
            if attempt.number >= attempt.task.retry.max_attempts =>
        {
            Outcome::Dead {
                reason: format!("{} attempts failed; last: {reason}", attempt.number),
            }
        }
        SendOutcome::Retryable { reason, after } => Outcome::Retry {
            delay: backoff::respecting_retry_after(
                backoff::random_delay_after(&attempt.task.retry, attempt.number),
                after,
                &attempt.task.retry,
            ),
            reason,
        },
        SendOutcome::Permanent(reason) => permanent(shared, attempt, reason).await,
        SendOutcome::Unknown(reason) => {
            let ended = OutgoingMessage {
                last_attempt_ended_ms: crate::ledger::now_ms().max(0) as u64,
                ..msg.clone()
            };
            let verdict = with_lease(shared, attempt, shared.sender.settle_unknown(&ended)).await;
            if verdict == UnknownVerdict::ResendMayDuplicate
                && attempt.number < attempt.task.retry.max_attempts
            {
                super::duplicates::note(&shared.permits, &attempt.task_id, &attempt.task.channel)
                    .await;
            }
            unknown(attempt, reason, verdict)
        }
    }
}

/// A permanent refusal: accept the payload's fallback task first (idempotent;
/// one the recipient switched off since the accept is passed over, and the
/// error says so), then the task is recorded `failed` (its permit released
/// if nothing was sent).
pub(super) async fn permanent(
    shared: &DispatchContext,
    attempt: &Attempt,
    reason: String,
) -> Outcome {
    let fallback = attempt.task.sends().ok().and_then(|p| p.fallback.clone());
    if let Some(fb) = fallback {
        match shared.permits.accept_fallback(&attempt.task, &fb).await {
            Ok(taken) => {
                if taken.accepted.is_some() {
                    metrics::counter!(names::FALLBACK, "channel" => attempt.task.channel.clone())
                        .increment(1);
                }
                return Outcome::Failed {
                    reason: format!("{reason}; {}", taken.note()),
                };
            }
            Err(e) => {
                // Not recorded failed without its fallback: try the whole thing again.
                tracing::warn!(task = %attempt.task_id, error = %e, "could not accept the fallback; retrying");
                return Outcome::Retry {
                    delay: backoff::random_delay_after(&attempt.task.retry, attempt.number),
                    reason: format!("{reason}; fallback not yet accepted: {e}"),
                };
            }
        }
    }
    Outcome::Failed { reason }
}

/// An unknown outcome, after the sender's verdict.
pub(super) fn unknown(attempt: &Attempt, reason: String, verdict: UnknownVerdict) -> Outcome {
    match verdict {
        UnknownVerdict::Sent {
            provider_message_id,
        } => Outcome::Sent {
            provider_message_id: provider_message_id.unwrap_or_default(),
            reference: None,
        },
        UnknownVerdict::Resend if attempt.number < attempt.task.retry.max_attempts => {
            Outcome::Resend {
                delay: backoff::random_delay_after(&attempt.task.retry, attempt.number),
                reason: format!("{reason}; resending with the same key"),
                by_reference: true,
            }
        }
        UnknownVerdict::ResendMayDuplicate if attempt.number < attempt.task.retry.max_attempts => {
            Outcome::Resend {
                delay: backoff::random_delay_after(&attempt.task.retry, attempt.number),
                reason: format!(
                    "{reason}; resending with the same key, which the provider cannot dedupe: a possible duplicate"
                ),
                by_reference: false,
            }
        }
        // Out of attempts, or nothing can tell: held, visibly, never released.
        UnknownVerdict::Resend | UnknownVerdict::ResendMayDuplicate | UnknownVerdict::Hold => {
            Outcome::Unknown { reason }
        }
    }
}
