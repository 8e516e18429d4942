//! Delivery receipts: a provider's request to a channel's callback URL is
//! handed whole to the channel's plugin (`handle-callback`), which verifies
//! it and says what it settles and what to answer; the settlements settle
//! the tasks they name — `delivered`, or `failed` after the provider had
//! accepted the message, which triggers the task's fallback channel. The
//! API's `/v1/receipts/{channel}/{token}` calls [`handle_callback`].
//!
//! A settlement names a message by idempotency key (providers that take a
//! client reference echo it), by the reference, or by the provider's message
//! id (both looked up in the index the dispatcher writes when a send
//! succeeds). Crash safety: the fallback task is accepted first (idempotent:
//! its own key and permit), then the receipt is recorded; a replayed
//! callback changes nothing more. A settlement naming no task is answered
//! "not yet" (503: the send may not be recorded yet) only while that id was
//! first seen less than the unmatched grace ago; after it, it is accepted
//! and counted as unmatched.

use std::time::Duration;

use super::plugin::{InstanceError, PluginSender};
use crate::permit::{PermitError, Permits, SettledByProvider, Task, TaskStatus};
use crate::plugin::bindings::{
    CallbackError, CallbackReply, CallbackRequest, DeliveryStatus, OptOut, Settlement,
};

/// Unmatched ids are remembered this long after their grace, so a replay
/// soon after is not answered 503 again.
const UNMATCHED_MEMORY: Duration = Duration::from_secs(24 * 3600);

/// Why a callback could not be applied.
#[derive(Debug, thiserror::Error)]
pub enum ReceiptError {
    /// The channel is unknown or its plugin is not loaded.
    #[error(transparent)]
    Instance(#[from] InstanceError),
    /// The signature or token does not verify (403); nothing settled.
    #[error("channel {channel}: the callback does not verify: {reason}")]
    Forbidden {
        /// The channel.
        channel: String,
        /// The plugin's reason (secrets redacted).
        reason: String,
    },
    /// Not a request this provider sends (400); nothing settled.
    #[error("channel {channel}: the callback is malformed: {reason}")]
    Malformed {
        /// The channel.
        channel: String,
        /// The plugin's reason (secrets redacted).
        reason: String,
    },
    /// The plugin call failed (trap, budget); nothing settled (500: the
    /// provider sends it again).
    #[error("channel {channel}: the plugin failed on the callback: {reason}")]
    Failed {
        /// The channel.
        channel: String,
        /// What failed (secrets redacted).
        reason: String,
    },
    /// Redis failed; nothing or part was applied (applying again is safe).
    #[error(transparent)]
    Permit(#[from] PermitError),
}

/// What one callback did.
#[derive(Debug, Default, Clone, PartialEq, serde::Serialize)]
pub struct ReceiptReport {
    /// Entries in the callback.
    pub received: usize,
    /// Tasks settled now (`delivered` or `failed`).
    pub updated: usize,
    /// Entries whose task was already settled or not in `sent`/`unknown`.
    pub ignored: usize,
    /// Entries naming no known task, past the unmatched grace.
    pub unmatched: Vec<String>,
    /// Entries that arrived before the send they confirm was recorded (the
    /// id is not indexed yet and was first seen inside the grace, or the
    /// task is still being sent): the provider should send the callback
    /// again later.
    pub not_yet: Vec<String>,
    /// Fallback tasks accepted because of failed-after-accept receipts.
    pub fallbacks: usize,
    /// The tasks settled now: (the task as it was, `delivered`|`failed`,
    /// whether it ended for good: delivered, or failed with its fallback
    /// taken), for the delivery ledger's history; once the ledger holds it,
    /// a task that ended for good leaves Redis.
    #[serde(skip)]
    pub settled: Vec<SettledByProvider>,
    /// Entries naming a task that already left Redis (its outcome is in the
    /// delivery ledger): (task id, `delivered`|`failed`), for the ledger's
    /// row to be updated; Redis is not touched (the task is not resurrected).
    #[serde(skip)]
    pub late: Vec<(String, &'static str)>,
}

/// What a handled callback settled, and what to answer the provider.
#[derive(Debug, Clone)]
pub struct CallbackOutcome {
    /// The plugin's answer for the provider.
    pub reply: CallbackReply,
    /// What it settled.
    pub report: ReceiptReport,
    /// The opt-outs it carries (contract 2.1), their `detail` redacted; the
    /// caller stores them before answering the provider.
    pub opt_outs: Vec<OptOut>,
}

/// Handles one request to `channel`'s callback URL: the plugin verifies it
/// and names the settlements, which are applied. Safe to call again with the
/// same request. `grace`: how long an id matching no task is "not yet".
pub async fn handle_callback(
    permits: &Permits,
    sender: &PluginSender,
    channel: &str,
    req: CallbackRequest,
    grace: Duration,
) -> Result<CallbackOutcome, ReceiptError> {
    let inst = sender.instance(channel, None)?;
    let redacted = |text: String| (channel.to_string(), sender.redact(channel, &text));
    let answer = match inst.handle_callback(req).await {
        Ok(a) => a.value,
        Err(e) => {
            let (channel, reason) = redacted(e.to_string());
            return Err(ReceiptError::Failed { channel, reason });
        }
    };
    let answer = match answer {
        Ok(a) => a,
        Err(CallbackError::Forbidden(r)) => {
            let (channel, reason) = redacted(r);
            return Err(ReceiptError::Forbidden { channel, reason });
        }
        Err(CallbackError::Malformed(r)) => {
            let (channel, reason) = redacted(r);
            return Err(ReceiptError::Malformed { channel, reason });
        }
    };
    let report = apply_settlements(permits, channel, &answer.settlements, grace).await?;
    let opt_outs = answer
        .opt_outs
        .into_iter()
        .map(|mut o| {
            o.detail = o.detail.map(|d| sender.redact(channel, &d));
            o
        })
        .collect();
    Ok(CallbackOutcome {
        reply: answer.reply,
        report,
        opt_outs,
    })
}

/// Settles the tasks `settlements` name (see the module doc).
pub(crate) async fn apply_settlements(
    permits: &Permits,
    channel: &str,
    settlements: &[Settlement],
    grace: Duration,
) -> Result<ReceiptReport, PermitError> {
    let mut report = ReceiptReport {
        received: settlements.len(),
        ..ReceiptReport::default()
    };
    for s in settlements {
        let applied = apply_one(permits, channel, s, grace).await?;
        report.count(&s.id, applied);
    }
    Ok(report)
}

/// What became of one settlement.
enum Applied {
    /// Nothing to settle: a pending or unknown status, another channel's
    /// task, or a task not in `sent`/`unknown`.
    Ignored,
    /// Too early: the task is still being sent, or its id is not indexed yet.
    NotYet,
    /// No task has that id, past the unmatched grace.
    Unmatched,
    /// The id names a task that already left Redis.
    Gone { task_id: String, delivered: bool },
    /// Handed to the permit layer.
    Settled {
        task: Box<Task>,
        delivered: bool,
        settled: crate::permit::ProviderSettled,
    },
}

/// Settles the task one settlement names, if it is waiting for one.
async fn apply_one(
    permits: &Permits,
    channel: &str,
    s: &Settlement,
    grace: Duration,
) -> Result<Applied, PermitError> {
    let delivered = match s.status {
        DeliveryStatus::Delivered => true,
        DeliveryStatus::Failed => false,
        DeliveryStatus::Pending | DeliveryStatus::Unknown => return Ok(Applied::Ignored),
    };
    let task = match find_task(permits, channel, &s.id).await? {
        Found::Task(task) => task,
        Found::Gone(task_id) => return Ok(Applied::Gone { task_id, delivered }),
        Found::Nothing => return unmatched(permits, channel, &s.id, grace).await,
    };
    // On a channel with providers, the callback route is the provider
    // instance's: only the provider the task's request went to settles it.
    if task.sent_through() != channel {
        return Ok(Applied::Ignored);
    }
    match task.status {
        TaskStatus::Sent | TaskStatus::Unknown => {}
        TaskStatus::Queued | TaskStatus::Sending | TaskStatus::RetryWait => {
            return Ok(Applied::NotYet);
        }
        _ => return Ok(Applied::Ignored),
    }
    let named_by_key = s.id == task.key || Some(&s.id) == task.reference.as_ref();
    let pmid = (!named_by_key).then_some(s.id.as_str());
    let settled = permits.settle_from_provider(&task, delivered, pmid).await?;
    if settled.updated {
        // A receipt that came before the record left a note of when; done with it.
        permits.matched(channel, &s.id).await?;
    }
    Ok(Applied::Settled {
        task,
        delivered,
        settled,
    })
}

/// A settlement naming no task: too early while its id was first seen
/// inside the grace, else unmatched (and counted).
async fn unmatched(
    permits: &Permits,
    channel: &str,
    id: &str,
    grace: Duration,
) -> Result<Applied, PermitError> {
    let age = permits
        .unmatched_age(channel, id, grace + UNMATCHED_MEMORY)
        .await?;
    if Duration::from_millis(age) < grace {
        return Ok(Applied::NotYet);
    }
    metrics::counter!(crate::metric_names::RECEIPTS_UNMATCHED, "channel" => channel.to_string())
        .increment(1);
    Ok(Applied::Unmatched)
}

impl ReceiptReport {
    /// Counts what became of the settlement naming `id`.
    fn count(&mut self, id: &str, applied: Applied) {
        match applied {
            Applied::Ignored => self.ignored += 1,
            Applied::Gone { task_id, delivered } => {
                let status = if delivered { "delivered" } else { "failed" };
                self.late.push((task_id, status));
            }
            Applied::NotYet => self.not_yet.push(id.to_string()),
            Applied::Unmatched => self.unmatched.push(id.to_string()),
            Applied::Settled {
                task,
                delivered,
                settled,
            } => {
                self.fallbacks += usize::from(settled.fallback);
                if !settled.updated {
                    self.ignored += 1;
                    return;
                }
                self.updated += 1;
                self.settled.push(SettledByProvider {
                    task: *task,
                    status: if delivered { "delivered" } else { "failed" },
                    ends: delivered || settled.fallback,
                    error: settled.error,
                });
            }
        }
    }
}

/// The task a settlement names: by idempotency key (the permit names its
/// task from accept on), else by reference or provider id (indexed after
/// the send is recorded).
async fn find_task(permits: &Permits, channel: &str, id: &str) -> Result<Found, PermitError> {
    let task_id = match permits.permit_owner(id).await? {
        Some(t) => Some(t),
        None => permits.task_by_provider_id(channel, id).await?,
    };
    let Some(task_id) = task_id else {
        return Ok(Found::Nothing);
    };
    Ok(match permits.task(&task_id).await? {
        Some(task) => Found::Task(Box::new(task)),
        None => Found::Gone(task_id),
    })
}

/// What a settlement's id names.
enum Found {
    /// A task in Redis.
    Task(Box<Task>),
    /// A task that left Redis (its permit or provider-id entry outlives it).
    Gone(String),
    /// Nothing known.
    Nothing,
}
