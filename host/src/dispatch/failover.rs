//! Providers within a channel, on the attempt path: an attempt starts at the
//! task's provider (where its last request went; the channel's first
//! provider for a new task) and moves on to the next provider of the
//! channel, inside the same attempt, only when the sender says the provider
//! did not take the message for a reason of its own
//! ([`Handover::NotTaken`], decided in `send::providers`). The next
//! provider's name is written to the task (`Permits::mark_request_started_at`)
//! before its request goes, so an unknown outcome, or a worker that vanishes
//! mid-send, is settled at the provider that may have the message and never
//! handed on.

use super::DispatchContext;
use super::lease::with_lease;
use crate::metric_names as names;
use crate::permit::Attempt;
use crate::send::providers::Handover;
use crate::send::{OutgoingMessage, SendOutcome};

/// `msg` addressed to its task's provider, or, when the task has none (or
/// names one no longer configured), to where a new task starts (`start`:
/// the first provider whose circuit lets it through). A channel without
/// providers is left alone.
pub(super) fn at_provider(
    mut msg: OutgoingMessage,
    providers: &[String],
    start: impl FnOnce() -> Option<String>,
) -> OutgoingMessage {
    if providers.is_empty() {
        return msg;
    }
    let known = msg.provider.as_ref().is_some_and(|p| providers.contains(p));
    if !known {
        msg.provider = start().or_else(|| providers.first().cloned());
    }
    msg
}

/// Sends `msg` (already marked started at its provider) and, while the
/// provider refuses it before taking it for a reason of its own, at the
/// next provider of the channel, each marked before its request goes.
/// Returns the last outcome and the message as last sent (its `provider`).
/// The lease lost or Redis failing before a mark stops the failover: the
/// refusal is recorded as it is (a retry or a failure at that provider).
pub(super) async fn send_through_providers(
    shared: &DispatchContext,
    attempt: &Attempt,
    mut msg: OutgoingMessage,
) -> (SendOutcome, OutgoingMessage) {
    let providers = shared.sender.providers(&msg.channel);
    let mut refused: Vec<String> = Vec::new();
    loop {
        let (outcome, handover) =
            with_lease(shared, attempt, shared.sender.send_for_handover(&msg)).await;
        let tagged = |outcome: SendOutcome, msg: &OutgoingMessage| {
            if providers.is_empty() {
                outcome
            } else {
                with_provider(outcome, msg.provider.as_deref(), &refused)
            }
        };
        let from = msg.provider.clone().unwrap_or_default();
        let next = match handover {
            Handover::NotTaken(why) => next_provider(&providers, &from).map(|n| (n, why)),
            Handover::Stays => None,
        };
        let Some((next, why)) = next else {
            let outcome = tagged(outcome, &msg);
            return (outcome, msg);
        };
        match shared
            .permits
            .mark_request_started_at(attempt, shared.config.lease, &next)
            .await
        {
            Ok(Some(_)) => {}
            Ok(None) => {
                tracing::warn!(task = %attempt.task_id, "lease lost before failing over; not sent");
                let outcome = tagged(outcome, &msg);
                return (outcome, msg);
            }
            Err(e) => {
                tracing::warn!(task = %attempt.task_id, error = %e, "could not mark the failover; recorded at this provider");
                let outcome = tagged(outcome, &msg);
                return (outcome, msg);
            }
        }
        tracing::info!(task = %attempt.task_id, channel = %msg.channel, from = %from, to = %next, why,
            "provider did not take the message; failing over");
        metrics::counter!(names::FAILOVERS, "channel" => msg.channel.clone(), "from" => from.clone(), "to" => next.clone())
            .increment(1);
        refused.push(format!("{from}: {}", reason_of(&outcome)));
        msg.provider = Some(next);
    }
}

/// The provider after `current` in `providers`, if any.
fn next_provider(providers: &[String], current: &str) -> Option<String> {
    let at = providers.iter().position(|p| p == current)?;
    providers.get(at + 1).cloned()
}

/// The reason text of a refusal (empty for a send).
fn reason_of(outcome: &SendOutcome) -> &str {
    match outcome {
        SendOutcome::Sent { .. } => "",
        SendOutcome::Retryable { reason, .. }
        | SendOutcome::Permanent(reason)
        | SendOutcome::Unknown(reason) => reason,
    }
}

/// `outcome`'s reason prefixed with the provider it came from, and the
/// refusals of the providers before it in this attempt: the task's
/// `last_error` and the ledger's note say where each answer came from.
fn with_provider(outcome: SendOutcome, provider: Option<&str>, refused: &[String]) -> SendOutcome {
    let tag = |reason: String| {
        let mut text = format!("at {}: {reason}", provider.unwrap_or("?"));
        if !refused.is_empty() {
            text = format!("{text} (failed over after {})", refused.join("; "));
        }
        text
    };
    match outcome {
        SendOutcome::Sent { .. } => outcome,
        SendOutcome::Retryable { reason, after } => SendOutcome::Retryable {
            reason: tag(reason),
            after,
        },
        SendOutcome::Permanent(reason) => SendOutcome::Permanent(tag(reason)),
        SendOutcome::Unknown(reason) => SendOutcome::Unknown(tag(reason)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_next_provider_is_only_ever_further_down_the_list() {
        let p = vec!["a".to_string(), "b".to_string()];
        assert_eq!(next_provider(&p, "a").as_deref(), Some("b"));
        assert_eq!(next_provider(&p, "b"), None);
        assert_eq!(next_provider(&p, "gone"), None);
    }
}
