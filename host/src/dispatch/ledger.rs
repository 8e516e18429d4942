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
use crate::permit::{Attempt, Noted, Outcome};

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
    // Each row keeps the digest of the address it sends to, so an opt-out
    // by address (an SMS answered "TD") finds its users.
    let claims: Vec<(Claim, Option<String>)> = attempts
        .iter()
        .map(|a| {
            let address = a.task.sends().ok().map(|p| recipient_digest(&p.recipient));
            (a.task.claim(&a.task_id, a.number, now_ms()), address)
        })
        .collect();
    let mut wait = Duration::from_millis(20);
    loop {
        match ledger.claim_all_at(&claims).await {
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

/// Writes the outcome of an attempt to the ledger, when there is one
/// ([`crate::permit::note_outcome`]); an outcome that ends the task for good,
/// or releases its permit, is waited for at most a third of a lease.
pub(crate) async fn note_outcome(
    shared: &DispatchContext,
    attempt: &Attempt,
    outcome: &Outcome,
    ends: bool,
) -> Noted {
    let Some(ledger) = &shared.ledger else {
        return Noted::default();
    };
    let within = (shared.config.lease / 3).max(Duration::from_millis(10));
    crate::permit::note_outcome(ledger, attempt, outcome, ends, within, now_ms()).await
}
