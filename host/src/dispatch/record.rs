//! The end of an attempt: its outcome recorded in Redis (a batch in one
//! script call), counted, and its stream entry acked when nothing more is due.

use std::time::{Duration, Instant};

use super::DispatchContext;
use crate::metric_names as names;
use crate::permit::{Attempt, Entry, Outcome, PermitFate, RecordContext, Recorded, ToRecord};

/// An outcome waiting for the batch's record.
pub(super) struct Pending<'a> {
    pub(super) attempt: &'a Attempt,
    pub(super) outcome: Outcome,
    pub(super) entry: &'a Entry,
    pub(super) context: RecordContext,
}

/// Records an outcome, retrying Redis errors for up to one lease.
pub(super) async fn record(
    shared: &DispatchContext,
    attempt: &Attempt,
    outcome: &Outcome,
    entry: &Entry,
) {
    record_with(shared, attempt, outcome, entry, RecordContext::default()).await;
}

/// [`record`] with what the worker knows beside the outcome.
pub(super) async fn record_with(
    shared: &DispatchContext,
    attempt: &Attempt,
    outcome: &Outcome,
    entry: &Entry,
    context: RecordContext,
) {
    let pending = Pending {
        attempt,
        outcome: outcome.clone(),
        entry,
        context,
    };
    record_batch(shared, vec![pending]).await;
}

/// Records the outcomes of a batch in one script call (each fenced by its
/// own lease), retrying Redis errors for up to one lease.
pub(super) async fn record_batch(shared: &DispatchContext, pending: Vec<Pending<'_>>) {
    if pending.is_empty() {
        return;
    }
    let deadline = Instant::now() + shared.config.lease;
    let records: Vec<ToRecord<'_>> = pending
        .iter()
        .map(|p| ToRecord {
            attempt: p.attempt,
            outcome: &p.outcome,
            entry: Some(p.entry),
            context: p.context,
        })
        .collect();
    loop {
        match shared.permits.record_all(&records).await {
            Ok(answers) => {
                for (p, answer) in pending.iter().zip(answers) {
                    let (attempt, outcome) = (p.attempt, &p.outcome);
                    match answer {
                        Ok(Recorded::Done(fate)) => {
                            tracing::debug!(task = %attempt.task_id, ?outcome, ?fate, "recorded");
                            count(outcome, &attempt.task.channel);
                            note_opted_out(shared, attempt, outcome, fate).await;
                        }
                        Ok(Recorded::Fenced { status }) => {
                            tracing::warn!(task = %attempt.task_id, ?status, "outcome fenced: the lease was lost");
                        }
                        Err(e) => {
                            tracing::error!(task = %attempt.task_id, error = %e, "recording failed; the task will be re-claimed");
                        }
                    }
                }
                return;
            }
            Err(e) if Instant::now() < deadline => {
                tracing::warn!(tasks = ?task_ids(&pending), error = %e, "recording failed; retrying");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => {
                tracing::error!(tasks = ?task_ids(&pending), error = %e, "recording failed; the tasks will be re-claimed");
                return;
            }
        }
    }
}

/// What the ledger row of a task an opt-out stopped adds to its reason
/// when the task kept its permit.
const KEPT_AFTER_OPT_OUT: &str =
    "its permit kept for the window: an earlier attempt may have reached the provider";

/// After a task an opt-out ended (`cancelled`): with nothing sent (its
/// permit released) it leaves the caps that counted it, as a cancelled one
/// does; and its ledger is written as a cancel's is
/// ([`crate::permit::Permits::note_cancelled`]): its row, with why (and
/// that its permit was kept), while it keeps its permit, else none.
async fn note_opted_out(
    shared: &DispatchContext,
    attempt: &Attempt,
    outcome: &Outcome,
    fate: PermitFate,
) {
    let Outcome::OptedOut { reason } = outcome else {
        return;
    };
    if fate == PermitFate::Released
        && let Err(e) = shared.permits.give_back_caps(&attempt.task).await
    {
        tracing::warn!(task = %attempt.task_id, error = %e, "could not give the stopped message's room in its caps back; they count it");
    }
    let Some(ledger) = &shared.ledger else {
        return;
    };
    let why = match fate {
        PermitFate::Kept => format!("{reason}; {KEPT_AFTER_OPT_OUT}"),
        _ => reason.clone(),
    };
    shared
        .permits
        .note_cancelled(ledger, &attempt.task, fate, Some(&why))
        .await;
}

/// The task ids of a batch, for its log lines.
fn task_ids<'a>(pending: &'a [Pending<'_>]) -> Vec<&'a str> {
    pending.iter().map(|p| p.attempt.task_id.as_str()).collect()
}

/// Counts a recorded outcome per channel, for `/metrics`.
pub(super) fn count(outcome: &Outcome, channel: &str) {
    let name = match outcome {
        Outcome::Sent { .. } => names::SENT,
        Outcome::Retry { .. } => names::RETRIED,
        Outcome::Resend { .. } => names::RESENT,
        Outcome::Unknown { .. } => names::UNKNOWN,
        Outcome::Failed { .. } => names::FAILED,
        Outcome::Dead { .. } => names::DEAD,
        Outcome::DuplicatePrevented { .. } => names::DUPLICATE_PREVENTED,
        Outcome::OptedOut { .. } => names::OPTED_OUT_AT_SEND,
        Outcome::Release => return,
    };
    metrics::counter!(name, "channel" => channel.to_string()).increment(1);
}

/// Acks and deletes entries whose tasks need nothing more (one script
/// call); an entry that also names a task still queued or sending stays
/// pending for it (`Permits::ack_entries`).
pub(super) async fn ack(shared: &DispatchContext, entries: &[&Entry]) {
    let Some(first) = entries.first() else {
        return;
    };
    let mut ids: Vec<&str> = entries.iter().map(|e| e.id.as_str()).collect();
    ids.sort_unstable();
    ids.dedup();
    if let Err(e) = shared.permits.ack_entries(first.shard, &ids).await {
        tracing::warn!(entries = ?ids, error = %e, "ack failed");
    }
}
