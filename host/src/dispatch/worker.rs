//! The workers: each takes one entry's task lease, sends while keeping the
//! lease alive, and records the outcome (the reader, `reader.rs`, hands the
//! entries out).

use std::time::{Duration, Instant};

use super::DispatchContext;
use super::outcome::outcome_of;
use super::record::{Pending, ack, record_batch};
pub use super::resend::RECLAIMED_REASON;
use super::resend::{resend_reclaimed, resend_still_safe, resent_by_reference};
use crate::metric_names as names;
use crate::permit::{Attempt, Begin, Entry, Outcome, RecordContext};
use crate::send::OutgoingMessage;

/// Handles entries of one shard's ready stream as a batch: one `begin`
/// script call for all, their ledger claims in one transaction, one mark
/// that their sends start, their sends at once, and one `record` script
/// call for their outcomes. Each task keeps its own lease, owner checks and
/// ledger-before-send order, and its outcome is its own: a batch saves
/// round trips and script calls, and is never a unit of failure. Never
/// fails: a Redis error leaves the entries pending, to be re-claimed.
pub(crate) async fn deliver_batch(shared: &DispatchContext, entries: &[Entry]) {
    let started = Instant::now();
    let begun = begin_batch(shared, entries).await;
    if begun.is_empty() {
        return;
    }
    if started.elapsed() >= shared.config.lease {
        // Redis answered so late that the leases may be over: do not send.
        for (attempt, _) in &begun {
            tracing::warn!(task = %attempt.task_id, "lease ran out before sending; left pending");
        }
        return;
    }
    let attempts: Vec<&Attempt> = begun.iter().map(|(a, _)| a).collect();
    // Every lease of the batch is kept alive until its outcome is recorded:
    // a task whose send ended waits for the batch's record.
    let records = with_leases(shared, &attempts, attempt_batch(shared, &begun)).await;
    record_batch(shared, records).await;
}

/// Claims, marks and sends the begun attempts of a batch (but those whose
/// recipient switched them off since the accept: `opted_out.rs`); the
/// outcomes to record, the ledger holding each one's note already. An attempt whose
/// outcome was recorded on the way (a resend decided against), or that
/// must not be recorded (its lease lost), has none.
async fn attempt_batch<'a>(
    shared: &DispatchContext,
    begun: &'a [(Attempt, &'a Entry)],
) -> Vec<Pending<'a>> {
    let (begun, mut pending) = super::opted_out::stop_opted_out(shared, begun).await;
    let attempts: Vec<&Attempt> = begun.iter().map(|(a, _)| a).collect();
    let claims = super::ledger::claim_batch(shared, &attempts).await;
    let mut checks = Vec::new();
    for ((attempt, entry), claim) in begun.into_iter().zip(claims) {
        let outcome = match claim {
            super::ledger::Claimed::Ours { first } => {
                checks.push(may_send(shared, attempt, entry, first));
                continue;
            }
            super::ledger::Claimed::Taken { owner } => Outcome::DuplicatePrevented { owner },
            super::ledger::Claimed::Stopped => Outcome::Release,
        };
        pending.push(Pending {
            attempt,
            outcome,
            entry,
            context: RecordContext::default(),
        });
    }
    let sendable: Vec<(&Attempt, &Entry, OutgoingMessage)> = futures_util::future::join_all(checks)
        .await
        .into_iter()
        .flatten()
        .collect();
    if sendable.is_empty() {
        return pending;
    }
    // Each request's provider (on a channel with providers) is written
    // with the mark, before the request goes.
    let marking: Vec<(&Attempt, &str)> = sendable
        .iter()
        .map(|(a, _, msg)| (*a, msg.provider.as_deref().unwrap_or("")))
        .collect();
    let marked = match shared
        .permits
        .mark_requests_started(&marking, shared.config.lease)
        .await
    {
        Ok(marked) => marked,
        Err(e) => {
            for (attempt, entry, _) in sendable {
                tracing::warn!(task = %attempt.task_id, error = %e, "could not mark the send as started; not sent, the attempt is given back");
                pending.push(Pending {
                    attempt,
                    outcome: Outcome::Release,
                    entry,
                    context: RecordContext::default(),
                });
            }
            return pending;
        }
    };
    let sends = sendable
        .into_iter()
        .zip(marked)
        .filter_map(|((attempt, entry, msg), lease)| {
            if lease.is_none() {
                tracing::warn!(task = %attempt.task_id, "lease lost before sending; not sent");
                return None;
            }
            Some(async move {
                let (outcome, context, indexed) = send_and_note(shared, attempt, msg).await;
                let pending = Pending {
                    attempt,
                    outcome,
                    entry,
                    context,
                };
                (pending, indexed)
            })
        });
    let sent = futures_util::future::join_all(sends).await;
    // Indexed before the record makes the tasks visible as sent, so a
    // receipt or a reconciler check that settles one at once finds the
    // index and deletes it as the task leaves.
    index_ids(shared, &sent).await;
    pending.extend(sent.into_iter().map(|(p, _)| p));
    pending
}

/// What decides, after the claim, whether an attempt may send: a task
/// re-claimed from a vanished worker, or a resend after an ambiguous answer,
/// is looked at again (its outcome recorded here when it may not). The
/// message to send, or `None`.
async fn may_send<'a>(
    shared: &DispatchContext,
    attempt: &'a Attempt,
    entry: &'a Entry,
    first_claim: bool,
) -> Option<(&'a Attempt, &'a Entry, OutgoingMessage)> {
    let msg = OutgoingMessage {
        task_id: attempt.task_id.clone(),
        attempt: attempt.number,
        ..OutgoingMessage::of_task(&attempt.task)
    };
    let providers = shared.sender.providers(&attempt.task.channel);
    let msg = super::failover::at_provider(msg, &providers, || {
        shared.sender.start_provider(&attempt.task.channel)
    });
    if attempt.reclaimed && !first_claim && !resend_reclaimed(shared, attempt, &msg, entry).await {
        return None;
    }
    if !attempt.reclaimed
        && attempt.task.maybe_sent
        && resent_by_reference(&attempt.task)
        && !first_claim
        && !resend_still_safe(shared, attempt, &msg, entry).await
    {
        return None;
    }
    if attempt.reclaimed && first_claim {
        // The vanished worker never reached its claim: it sent nothing.
        tracing::info!(task = %entry.task_id, attempt = attempt.number,
            "re-claimed from a vanished worker that never claimed the key in the ledger; sending");
    }
    Some((attempt, entry, msg))
}

/// Where and for how long a sent message's ids are indexed: under the
/// channel or provider instance that sent it (its receipts come to that
/// instance's route), for the time given; not at all when its provider
/// posts no receipts (nothing would look them up).
struct Indexed {
    under: String,
    keep: Duration,
    for_receipts: bool,
}

/// Sends one message of a batch and writes its outcome to the ledger (the
/// ledger first: a task that ends for good leaves Redis as it is recorded,
/// once the ledger holds its outcome); the outcome, what the record needs
/// beside it, and where and how long a sent message's ids stay indexed.
async fn send_and_note(
    shared: &DispatchContext,
    attempt: &Attempt,
    msg: OutgoingMessage,
) -> (Outcome, RecordContext, Indexed) {
    let (outcome, msg) = send(shared, attempt, msg).await;
    let sent = matches!(outcome, Outcome::Sent { .. });
    let checkable = !sent || shared.sender.can_check(&msg).await;
    let for_receipts = sent && shared.sender.takes_receipts(&msg).await;
    // A sent message a receipt may still report failed keeps its task (and
    // its payload's fallback) while the fallback could be needed.
    let may_fail_later = for_receipts && !checkable;
    let ends = ends_for_good(attempt, &outcome, checkable, may_fail_later);
    let noted = super::ledger::note_outcome(shared, attempt, &outcome, ends).await;
    let ledger_holds_outcome = noted.holds_outcome;
    let context = RecordContext {
        checkable,
        held: None,
        ledger_holds_outcome,
        ledger_keeps_key: noted.keeps_key,
    };
    // Awaiting a receipt: kept like the task; gone already: for the key's
    // window, so a late receipt still finds the ledger row.
    let keep = if ledger_holds_outcome {
        window_left(&attempt.task)
    } else {
        shared.permits.config().retention
    };
    let under = msg.provider.unwrap_or_else(|| attempt.task.channel.clone());
    let indexed = Indexed {
        under,
        keep,
        for_receipts,
    };
    (outcome, context, indexed)
}

/// Whether `outcome` ends the task for good, so that it may leave Redis once
/// the ledger holds it: `sent` on a channel that can confirm nothing later
/// (`checkable` false) — unless a receipt may still report it failed
/// (`may_fail_later`) and its payload has a fallback, which must then still
/// be there to take (`settle_from_provider`) — or `failed` with the
/// payload's fallback taken (a permanent failure is recorded `failed` only
/// after its fallback is accepted). A task marked a possible duplicate stays
/// (with the retention), where its mark is shown: the ledger's row does not
/// carry it.
fn ends_for_good(
    attempt: &Attempt,
    outcome: &Outcome,
    checkable: bool,
    may_fail_later: bool,
) -> bool {
    let marked = attempt.task.fields.get(super::duplicates::FIELD);
    if marked.is_some_and(|v| v == "1") {
        return false;
    }
    let has_fallback = || attempt.task.sends().is_ok_and(|p| p.fallback.is_some());
    match outcome {
        Outcome::Sent { .. } => {
            let may_need_fallback = may_fail_later && has_fallback();
            !checkable && !may_need_fallback
        }
        Outcome::Failed { .. } => has_fallback(),
        _ => false,
    }
}

/// What is left of the task's window from now (host clock), at least a minute.
fn window_left(task: &crate::permit::Task) -> Duration {
    let now = crate::ledger::now_ms().max(0) as u64;
    let end = task.accepted_at_ms.saturating_add(task.window_ms);
    Duration::from_millis(end.saturating_sub(now)).max(Duration::from_secs(60))
}

/// Begins an attempt of each entry's task in one script call: the attempts
/// begun, with their entries. An entry whose task needs no attempt is
/// acked; one whose task another worker holds, or that Redis could not
/// begin, is left pending; one acked meanwhile is dropped.
async fn begin_batch<'e>(
    shared: &DispatchContext,
    entries: &'e [Entry],
) -> Vec<(Attempt, &'e Entry)> {
    let tasks: Vec<(&str, &str)> = entries
        .iter()
        .map(|e| (e.task_id.as_str(), e.id.as_str()))
        .collect();
    let answers = match shared
        .permits
        .begin_attempts(&tasks, shared.config.lease)
        .await
    {
        Ok(answers) => answers,
        Err(e) => {
            tracing::warn!(tasks = entries.len(), error = %e, "could not begin attempts; left pending");
            return Vec::new();
        }
    };
    let mut begun = Vec::with_capacity(entries.len());
    let mut done = Vec::new();
    for (entry, answer) in entries.iter().zip(answers) {
        match answer {
            Ok(Begin::Begun(a)) => begun.push((*a, entry)),
            Ok(Begin::Busy { .. }) => {
                // A live worker elsewhere holds the lease; it acks the entry when it records.
                tracing::debug!(task = %entry.task_id, "lease held elsewhere");
            }
            Ok(Begin::Settled(status)) => {
                tracing::debug!(task = %entry.task_id, %status, "nothing to send");
                done.push(entry);
            }
            Ok(Begin::Superseded { by }) => {
                tracing::info!(task = %entry.task_id, by = %by, "superseded by a newer task with the same key");
                done.push(entry);
            }
            Ok(Begin::Missing) => {
                tracing::warn!(task = %entry.task_id, "task record missing");
                done.push(entry);
            }
            Ok(Begin::Gone) => {
                tracing::debug!(task = %entry.task_id, entry = %entry.id, "entry acked meanwhile; nothing to do");
            }
            Err(e) => {
                tracing::warn!(task = %entry.task_id, error = %e, "could not begin an attempt; left pending");
            }
        }
    }
    ack(shared, &done).await;
    begun
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

/// Indexes the sent messages' provider ids and references (when not the
/// key), so a receipt naming either finds the task: one round trip for the
/// batch. A message whose provider posts no receipts is not indexed.
async fn index_ids(shared: &DispatchContext, sent: &[(Pending<'_>, Indexed)]) {
    let mut ids = Vec::new();
    for (p, indexed) in sent {
        let Outcome::Sent {
            provider_message_id,
            reference,
        } = &p.outcome
        else {
            continue;
        };
        if !indexed.for_receipts {
            continue;
        }
        let task = &p.attempt.task;
        ids.extend(
            [Some(provider_message_id.as_str()), reference.as_deref()]
                .into_iter()
                .flatten()
                .filter(|id| !id.is_empty() && *id != task.key)
                .map(|id| {
                    let task_id = p.attempt.task_id.as_str();
                    (indexed.under.as_str(), id, task_id, indexed.keep)
                }),
        );
    }
    if ids.is_empty() {
        return;
    }
    if let Err(e) = shared.permits.index_provider_ids(&ids).await {
        tracing::warn!(tasks = sent.len(), error = %e, "could not index the provider message ids");
    }
}

/// Runs `work`, extending the lease of every attempt in `attempts` (one
/// script call for all) every third of a lease while it is in flight.
async fn with_leases<T>(
    shared: &DispatchContext,
    attempts: &[&Attempt],
    work: impl std::future::Future<Output = T>,
) -> T {
    let lease = shared.config.lease;
    let every = (lease / 3).max(Duration::from_millis(10));
    tokio::pin!(work);
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    loop {
        tokio::select! {
            done = &mut work => return done,
            _ = tick.tick() => {
                // A lost lease here is a task already recorded on the way
                // (or taken over): its own record is fenced.
                if let Err(e) = shared.permits.extend_leases(attempts, lease).await {
                    tracing::warn!(tasks = attempts.len(), error = %e, "could not extend the leases of a batch");
                }
            }
        }
    }
}
