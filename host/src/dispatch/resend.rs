//! An attempt that may repeat one the provider may already have: a task
//! re-claimed from a vanished worker, or a resend decided after an
//! ambiguous answer, looked at again before it goes.

use super::DispatchContext;
use super::lease::with_lease;
use super::outcome::unknown;
use super::record::{record, record_with};
use crate::permit::{Attempt, Entry, HeldCause, RecordContext};
use crate::send::{OutgoingMessage, UnknownVerdict};

/// Why a re-claimed task is held: its previous worker died mid-attempt and
/// the channel can neither find out nor make a resend harmless.
pub const RECLAIMED_REASON: &str =
    "the worker holding the lease died mid-send; the provider may have the message";

/// A task re-claimed from a worker that vanished mid-attempt: the provider
/// may have the message, so decide as for an unknown outcome first. True
/// when it may be sent again; otherwise its outcome is recorded here (held
/// as [`HeldCause::WorkerVanished`], or sent if a query found it).
pub(super) async fn resend_reclaimed(
    shared: &DispatchContext,
    attempt: &Attempt,
    msg: &OutgoingMessage,
    entry: &Entry,
) -> bool {
    let request_started = attempt
        .task
        .fields
        .get("vanished_request_started")
        .is_none_or(|v| v != "0");
    tracing::info!(task = %entry.task_id, attempt = attempt.number, request_started, "re-claimed from a vanished worker");
    let verdict = with_lease(shared, attempt, shared.sender.settle_unknown(msg)).await;
    if verdict == UnknownVerdict::ResendMayDuplicate {
        super::duplicates::note(&shared.permits, &attempt.task_id, &attempt.task.channel).await;
        return true;
    }
    if verdict == UnknownVerdict::Resend {
        return true;
    }
    let outcome = unknown(attempt, RECLAIMED_REASON.to_string(), verdict);
    let context = RecordContext {
        held: Some(HeldCause::WorkerVanished { request_started }),
        ..RecordContext::default()
    };
    super::ledger::note_outcome(shared, attempt, &outcome, false).await;
    record_with(shared, attempt, &outcome, entry, context).await;
    false
}

/// Whether `task` waits for a resend the worker decided on the provider's
/// dedupe (`record.lua` marks it `resend_by` = `reference`; an operator's or
/// the reconciler's re-queue clears the mark).
pub(super) fn resent_by_reference(task: &crate::permit::Task) -> bool {
    task.fields
        .get("resend_by")
        .is_some_and(|v| v == "reference")
}

/// Why a resend decided after an ambiguous answer is held when its turn comes.
pub(crate) const STALE_RESEND_REASON: &str = "an earlier attempt's answer was ambiguous, and its resend came past the provider's reference window";

/// A resend decided after an earlier attempt's ambiguous answer, looked at
/// again as its turn comes. One that leaned on the provider's dedupe (its
/// reference) may have been carried past the reference window by the retry
/// delay, and a resend past it is a new message: then it is decided anew,
/// as for an unknown outcome now (held, by default; a channel with a status
/// query asks it again). One already counted as a possible duplicate, or
/// still inside the window, goes ahead. True when it may be sent; otherwise
/// its outcome is recorded here.
pub(super) async fn resend_still_safe(
    shared: &DispatchContext,
    attempt: &Attempt,
    msg: &OutgoingMessage,
    entry: &Entry,
) -> bool {
    let marked = attempt
        .task
        .fields
        .get(super::duplicates::FIELD)
        .is_some_and(|v| v == "1");
    // Only a resend that leaned on the reference is marked so; past the
    // window the reference protects nothing, so a channel with a status
    // query is looked at again too, whatever its query said before.
    if marked || shared.sender.dedupes(msg).await {
        return true;
    }
    let verdict = with_lease(shared, attempt, shared.sender.settle_unknown(msg)).await;
    match verdict {
        UnknownVerdict::Resend => return true,
        UnknownVerdict::ResendMayDuplicate => {
            super::duplicates::note(&shared.permits, &attempt.task_id, &attempt.task.channel).await;
            return true;
        }
        UnknownVerdict::Sent { .. } | UnknownVerdict::Hold => {}
    }
    tracing::info!(task = %entry.task_id, attempt = attempt.number, ?verdict,
        "a resend after an ambiguous answer came past the provider's reference window; not sent");
    let outcome = unknown(attempt, STALE_RESEND_REASON.to_string(), verdict);
    super::ledger::note_outcome(shared, attempt, &outcome, false).await;
    record(shared, attempt, &outcome, entry).await;
    false
}
