//! The workers: each takes one entry's task lease, sends while keeping the
//! lease alive, and records the outcome (the reader, `reader.rs`, hands the
//! entries out).

use std::time::{Duration, Instant};

use super::lease::with_lease;
use super::{DispatchContext, backoff};
use crate::metric_names as names;
use crate::permit::{Attempt, Begin, Entry, HeldCause, Outcome, RecordContext, Recorded};
use crate::send::{OutgoingMessage, Payload, SendOutcome, UnknownVerdict};

/// Why a re-claimed task is held: its previous worker died mid-attempt and
/// the channel can neither find out nor make a resend harmless.
pub const RECLAIMED_REASON: &str =
    "the worker holding the lease died mid-send; the provider may have the message";

/// Handles one stream entry: begin, send, record. Never fails: a Redis error
/// leaves the entry pending, to be re-claimed after a lease.
pub(crate) async fn deliver(shared: &DispatchContext, entry: &Entry) {
    let started = Instant::now();
    let Some(attempt) = begin(shared, entry).await else {
        return;
    };
    if started.elapsed() >= shared.config.lease {
        // Redis answered so late that the lease may be over: do not send.
        tracing::warn!(task = %entry.task_id, "lease ran out before sending; left pending");
        return;
    }
    let Some(first_claim) = claim_in_ledger(shared, &attempt, entry).await else {
        return;
    };
    let msg = OutgoingMessage {
        task_id: attempt.task_id.clone(),
        attempt: attempt.number,
        ..OutgoingMessage::of_task(&attempt.task)
    };
    let providers = shared.sender.providers(&attempt.task.channel);
    let msg = super::failover::at_provider(msg, &providers, || {
        shared.sender.start_provider(&attempt.task.channel)
    });
    if attempt.reclaimed && !first_claim && !resend_reclaimed(shared, &attempt, &msg, entry).await {
        return;
    }
    if !attempt.reclaimed
        && attempt.task.maybe_sent
        && resent_by_reference(&attempt.task)
        && !first_claim
        && !resend_still_safe(shared, &attempt, &msg, entry).await
    {
        return;
    }
    if attempt.reclaimed && first_claim {
        // The vanished worker never reached its claim: it sent nothing.
        tracing::info!(task = %entry.task_id, attempt = attempt.number,
            "re-claimed from a vanished worker that never claimed the key in the ledger; sending");
    }
    if !mark_request_started(shared, &attempt, entry, msg.provider.as_deref()).await {
        return;
    }
    let (outcome, msg) = send(shared, &attempt, msg).await;
    let checkable = !matches!(outcome, Outcome::Sent { .. }) || shared.sender.can_check(&msg).await;
    // The ledger first: a task that ends for good leaves Redis as it is
    // recorded, once the ledger holds its outcome.
    let ends = ends_for_good(&attempt, &outcome, checkable);
    let ledger_holds_outcome = super::ledger::note_outcome(shared, &attempt, &outcome, ends).await;
    let context = RecordContext {
        checkable,
        held: None,
        ledger_holds_outcome,
    };
    if let Outcome::Sent {
        provider_message_id,
        reference,
    } = &outcome
    {
        // Indexed before the record makes the task visible as sent, so a
        // receipt or a reconciler check that settles it at once finds the
        // index and deletes it as the task leaves. Awaiting a receipt: kept
        // like the task; gone already: for the key's window, so a late
        // receipt still finds the ledger row.
        let keep = if ledger_holds_outcome {
            window_left(&attempt.task)
        } else {
            shared.permits.config().retention
        };
        index_ids(
            shared,
            &attempt,
            msg.provider.as_deref().unwrap_or(&attempt.task.channel),
            provider_message_id,
            reference.as_deref(),
            keep,
        )
        .await;
    }
    record_with(shared, &attempt, &outcome, entry, context).await;
}

/// Whether `outcome` ends the task for good, so that it may leave Redis once
/// the ledger holds it: `sent` on a channel that can confirm nothing later
/// (`checkable` false), or `failed` with the payload's fallback taken (a
/// permanent failure is recorded `failed` only after its fallback is accepted).
/// A task marked a possible duplicate stays (with the retention), where its
/// mark is shown: the ledger's row does not carry it.
fn ends_for_good(attempt: &Attempt, outcome: &Outcome, checkable: bool) -> bool {
    let marked = attempt.task.fields.get(super::duplicates::FIELD);
    if marked.is_some_and(|v| v == "1") {
        return false;
    }
    match outcome {
        Outcome::Sent { .. } => !checkable,
        Outcome::Failed { .. } => serde_json::from_str::<Payload>(&attempt.task.payload)
            .ok()
            .and_then(|p| p.fallback)
            .is_some(),
        _ => false,
    }
}

/// What is left of the task's window from now (host clock), at least a minute.
fn window_left(task: &crate::permit::Task) -> Duration {
    let now = crate::ledger::now_ms().max(0) as u64;
    let end = task.accepted_at_ms.saturating_add(task.window_ms);
    Duration::from_millis(end.saturating_sub(now)).max(Duration::from_secs(60))
}

/// Begins an attempt of the entry's task; `None` when there is nothing to
/// send now (the entry acked when the task needs no attempt, left pending
/// when Redis failed or another worker holds the lease).
async fn begin(shared: &DispatchContext, entry: &Entry) -> Option<Attempt> {
    let begin = match shared
        .permits
        .begin_attempt(&entry.task_id, &entry.key, shared.config.lease)
        .await
    {
        Ok(b) => b,
        Err(e) => {
            tracing::warn!(task = %entry.task_id, error = %e, "could not begin an attempt; left pending");
            return None;
        }
    };
    match begin {
        Begin::Begun(a) => return Some(*a),
        Begin::Busy { .. } => {
            // A live worker elsewhere holds the lease; it acks the entry when it records.
            tracing::debug!(task = %entry.task_id, "lease held elsewhere");
            return None;
        }
        Begin::Settled(status) => {
            tracing::debug!(task = %entry.task_id, %status, "nothing to send");
        }
        Begin::Superseded { by } => {
            tracing::info!(task = %entry.task_id, by = %by, "superseded by a newer task with the same key");
        }
        Begin::Missing => {
            tracing::warn!(task = %entry.task_id, "task record missing");
        }
    }
    ack(shared, entry).await;
    None
}

/// Sends the message under the lease (failing over between the channel's
/// providers, `failover.rs`) and turns the channel's answer into the outcome
/// to record (retry, dead, fallback, held or resent); with the message as
/// last sent (its provider).
async fn send(
    shared: &DispatchContext,
    attempt: &Attempt,
    msg: OutgoingMessage,
) -> (Outcome, OutgoingMessage) {
    let sending = Instant::now();
    let (result, msg) = super::failover::send_through_providers(shared, attempt, msg).await;
    metrics::histogram!(names::SEND_SECONDS, "channel" => msg.channel.clone())
        .record(sending.elapsed().as_secs_f64());
    let outcome = outcome_of(shared, attempt, &msg, result).await;
    (outcome, msg)
}

/// The outcome to record for the channel's answer `result` to `msg`.
async fn outcome_of(
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

/// A task re-claimed from a worker that vanished mid-attempt: the provider
/// may have the message, so decide as for an unknown outcome first. True
/// when it may be sent again; otherwise its outcome is recorded here (held
/// as [`HeldCause::WorkerVanished`], or sent if a query found it).
async fn resend_reclaimed(
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
fn resent_by_reference(task: &crate::permit::Task) -> bool {
    task.fields
        .get("resend_by")
        .is_some_and(|v| v == "reference")
}

/// Why a resend decided after an ambiguous answer is held when its turn comes.
pub const STALE_RESEND_REASON: &str = "an earlier attempt's answer was ambiguous, and its resend came past the provider's reference window";

/// A resend decided after an earlier attempt's ambiguous answer, looked at
/// again as its turn comes. One that leaned on the provider's dedupe (its
/// reference) may have been carried past the reference window by the retry
/// delay, and a resend past it is a new message: then it is decided anew,
/// as for an unknown outcome now (held, by default). One already counted as
/// a possible duplicate, still inside the window, or on a channel with a
/// status query (its resends follow the query), goes ahead. True when
/// it may be sent; otherwise its outcome is recorded here.
async fn resend_still_safe(
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
    // A channel with a status query resends only on what its query said
    // (the reconciler's re-queue, or the verdict just made): nothing to
    // look at again.
    if marked || shared.sender.dedupes(msg).await || shared.sender.can_check(msg).await {
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

/// Marks in Redis that this worker hands the message to its channel now, so
/// a worker re-claiming the task after this one vanished knows the request
/// may have been written. False when the mark could not be made (lease lost,
/// Redis unreachable): nothing is sent; the attempt is given back.
async fn mark_request_started(
    shared: &DispatchContext,
    attempt: &Attempt,
    entry: &Entry,
    provider: Option<&str>,
) -> bool {
    let marked = match provider {
        Some(p) => {
            shared
                .permits
                .mark_request_started_at(attempt, shared.config.lease, p)
                .await
        }
        None => {
            shared
                .permits
                .mark_request_started(attempt, shared.config.lease)
                .await
        }
    };
    match marked {
        Ok(Some(_)) => true,
        Ok(None) => {
            tracing::warn!(task = %attempt.task_id, "lease lost before sending; not sent");
            false
        }
        Err(e) => {
            tracing::warn!(task = %attempt.task_id, error = %e, "could not mark the send as started; not sent, the attempt is given back");
            record(shared, attempt, &Outcome::Release, entry).await;
            false
        }
    }
}

/// Indexes a sent message's provider id and reference (when not the key),
/// so a receipt naming either finds the task.
async fn index_ids(
    shared: &DispatchContext,
    attempt: &Attempt,
    channel: &str,
    provider_id: &str,
    reference: Option<&str>,
    keep: Duration,
) {
    let ids = [Some(provider_id), reference]
        .into_iter()
        .flatten()
        .filter(|id| !id.is_empty() && *id != attempt.task.key);
    for id in ids {
        if let Err(e) = shared
            .permits
            .index_provider_id(channel, id, &attempt.task_id, keep)
            .await
        {
            tracing::warn!(task = %attempt.task_id, error = %e, "could not index the provider message id");
        }
    }
}

/// Claims the task's key in the ledger before it is sent (see
/// [`super::ledger`]): whether this is the key's first claim (no earlier
/// attempt reached its claim, so none sent), or `None` when the task must
/// not be sent now: another
/// task owns the key (recorded `duplicate_prevented`), or the ledger stayed
/// unreachable until shutdown (the attempt given back). Waits, holding the
/// lease, while the ledger is down.
async fn claim_in_ledger(
    shared: &DispatchContext,
    attempt: &Attempt,
    entry: &Entry,
) -> Option<bool> {
    match with_lease(shared, attempt, super::ledger::claim(shared, attempt)).await {
        super::ledger::Claimed::Ours { first } => Some(first),
        super::ledger::Claimed::Taken { owner } => {
            let outcome = Outcome::DuplicatePrevented { owner };
            record(shared, attempt, &outcome, entry).await;
            None
        }
        super::ledger::Claimed::Stopped => {
            record(shared, attempt, &Outcome::Release, entry).await;
            None
        }
    }
}

/// A permanent refusal: accept the payload's fallback task first (idempotent),
/// then the task is recorded `failed` (its permit released if nothing was sent).
async fn permanent(shared: &DispatchContext, attempt: &Attempt, reason: String) -> Outcome {
    let fallback = serde_json::from_str::<Payload>(&attempt.task.payload)
        .ok()
        .and_then(|p| p.fallback);
    if let Some(fb) = fallback {
        match shared.permits.accept_fallback(&attempt.task, &fb).await {
            Ok(_) => {
                metrics::counter!(names::FALLBACK, "channel" => attempt.task.channel.clone())
                    .increment(1);
                return Outcome::Failed {
                    reason: format!("{reason}; fallback to {}", fb.channel),
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
fn unknown(attempt: &Attempt, reason: String, verdict: UnknownVerdict) -> Outcome {
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

/// Records an outcome, retrying Redis errors for up to one lease.
async fn record(shared: &DispatchContext, attempt: &Attempt, outcome: &Outcome, entry: &Entry) {
    record_with(shared, attempt, outcome, entry, RecordContext::default()).await;
}

/// [`record`] with what the worker knows beside the outcome.
async fn record_with(
    shared: &DispatchContext,
    attempt: &Attempt,
    outcome: &Outcome,
    entry: &Entry,
    context: RecordContext,
) {
    let deadline = Instant::now() + shared.config.lease;
    loop {
        match shared
            .permits
            .record_with(attempt, outcome, Some(entry), context)
            .await
        {
            Ok(Recorded::Done(fate)) => {
                tracing::debug!(task = %attempt.task_id, ?outcome, ?fate, "recorded");
                count(outcome, &attempt.task.channel);
                return;
            }
            Ok(Recorded::Fenced { status }) => {
                tracing::warn!(task = %attempt.task_id, ?status, "outcome fenced: the lease was lost");
                return;
            }
            Err(e) if Instant::now() < deadline => {
                tracing::warn!(task = %attempt.task_id, error = %e, "recording failed; retrying");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => {
                tracing::error!(task = %attempt.task_id, error = %e, "recording failed; the task will be re-claimed");
                return;
            }
        }
    }
}

/// Counts a recorded outcome per channel, for `/metrics`.
fn count(outcome: &Outcome, channel: &str) {
    let name = match outcome {
        Outcome::Sent { .. } => names::SENT,
        Outcome::Retry { .. } => names::RETRIED,
        Outcome::Resend { .. } => names::RESENT,
        Outcome::Unknown { .. } => names::UNKNOWN,
        Outcome::Failed { .. } => names::FAILED,
        Outcome::Dead { .. } => names::DEAD,
        Outcome::DuplicatePrevented { .. } => names::DUPLICATE_PREVENTED,
        Outcome::Release => return,
    };
    metrics::counter!(name, "channel" => channel.to_string()).increment(1);
}

/// Acks and deletes an entry whose task needs nothing more.
async fn ack(shared: &DispatchContext, entry: &Entry) {
    let mut conn = shared.permits.connection();
    let stream = shared.permits.layout().ready(entry.shard);
    let res: redis::RedisResult<()> = redis::pipe()
        .cmd("XACK")
        .arg(&stream)
        .arg(&shared.permits.config().group)
        .arg(&entry.id)
        .ignore()
        .cmd("XDEL")
        .arg(&stream)
        .arg(&entry.id)
        .ignore()
        .query_async(&mut conn)
        .await;
    if let Err(e) = res {
        tracing::warn!(entry = %entry.id, error = %e, "ack failed");
    }
}
