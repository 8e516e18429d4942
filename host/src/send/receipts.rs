//! Delivery receipts: a provider's callback, parsed by the channel's plugin
//! (`parse-callback`), settles the tasks it names — `delivered`, or `failed`
//! after the provider had accepted the message, which triggers the task's
//! fallback channel. The API's `POST /v1/receipts/{channel}` calls
//! [`apply_receipts`].
//!
//! A receipt names a message by idempotency key (providers that take a client
//! reference echo it) or by the provider's message id (looked up in the
//! index the dispatcher writes when a send succeeds). Crash safety: the
//! fallback task is accepted first (idempotent: its own key and permit),
//! then the receipt is recorded; a replayed callback changes nothing more.

use super::Payload;
use super::plugin::{InstanceError, PluginSender};
use crate::permit::{PermitError, Permits, Task, TaskStatus};
use crate::plugin::bindings::DeliveryStatus;

/// Why a callback could not be applied (a 4xx for the provider, or a 5xx
/// for `Redis`, so it retries).
#[derive(Debug, thiserror::Error)]
pub enum ReceiptError {
    /// The channel is unknown or its plugin is not loaded.
    #[error(transparent)]
    Instance(#[from] InstanceError),
    /// The plugin refused the callback (malformed), with its reason.
    #[error("channel {channel}: the callback was refused: {reason}")]
    Refused {
        /// The channel.
        channel: String,
        /// The plugin's reason (or the host's, if the call failed).
        reason: String,
    },
    /// Redis failed; nothing or part was applied (applying again is safe).
    #[error(transparent)]
    Permit(#[from] PermitError),
}

/// What one callback did.
#[derive(Debug, Default, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ReceiptReport {
    /// Entries in the callback.
    pub received: usize,
    /// Tasks settled now (`delivered` or `failed`).
    pub updated: usize,
    /// Entries whose task was already settled or not in `sent`/`unknown`.
    pub ignored: usize,
    /// Entries naming no known task (key or provider id).
    pub unmatched: Vec<String>,
    /// Entries that arrived before the send they confirm was recorded (the
    /// provider id is not indexed yet, or the task is still being sent): the
    /// provider should send the callback again later.
    pub not_yet: Vec<String>,
    /// Fallback tasks accepted because of failed-after-accept receipts.
    pub fallbacks: usize,
}

/// Applies one delivery callback of `channel`: `headers` and `body` as
/// received. Safe to call again with the same callback.
pub async fn apply_receipts(
    permits: &Permits,
    sender: &PluginSender,
    channel: &str,
    headers: &[(String, String)],
    body: &[u8],
) -> Result<ReceiptReport, ReceiptError> {
    let inst = sender.instance(channel, None)?;
    let refused = |reason: String| ReceiptError::Refused {
        channel: channel.to_string(),
        reason,
    };
    let entries = inst
        .parse_callback(headers.to_vec(), body.to_vec())
        .await
        .map_err(|e| refused(e.to_string()))?
        .value
        .map_err(refused)?;
    let mut report = ReceiptReport {
        received: entries.len(),
        ..ReceiptReport::default()
    };
    for (id, status) in entries {
        let delivered = match status {
            DeliveryStatus::Delivered => true,
            DeliveryStatus::Failed => false,
            DeliveryStatus::Pending | DeliveryStatus::Unknown => {
                report.ignored += 1;
                continue;
            }
        };
        // By idempotency key (the permit names its task from accept on), else
        // by the provider's id (indexed only after the send is recorded).
        let (task_id, by_key) = match permits.permit_owner(&id).await? {
            Some(t) => (Some(t), true),
            None => (permits.task_by_provider_id(channel, &id).await?, false),
        };
        let Some(task) = (match task_id {
            Some(t) => permits.task(&t).await?,
            None => None,
        }) else {
            if by_key {
                report.unmatched.push(id);
            } else {
                report.not_yet.push(id);
            }
            continue;
        };
        if task.channel != channel {
            report.ignored += 1;
            continue;
        }
        match task.status {
            TaskStatus::Sent | TaskStatus::Unknown => {}
            TaskStatus::Queued | TaskStatus::Sending | TaskStatus::RetryWait => {
                report.not_yet.push(id);
                continue;
            }
            _ => {
                report.ignored += 1;
                continue;
            }
        }
        let pmid = (id != task.key).then_some(id.as_str());
        let settled = settle_from_provider(permits, &task, delivered, pmid).await?;
        if settled.fallback {
            report.fallbacks += 1;
        }
        if settled.updated {
            report.updated += 1;
        } else {
            report.ignored += 1;
        }
    }
    Ok(report)
}

/// What [`settle_from_provider`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Settled {
    /// The task was `sent`/`unknown` and is now `delivered` or `failed`.
    pub updated: bool,
    /// A fallback task was accepted (or found already accepted).
    pub fallback: bool,
}

/// Settles a `sent` or `unknown` task from what its provider said (a receipt
/// or a status query): `delivered`, or `failed` after the provider accepted
/// it — then the payload's fallback is accepted first (idempotent: if the
/// host dies between the two writes, the next receipt or check finds the task
/// still `sent` and does both again; the second accept is a duplicate, not a
/// second task), and only then the failure recorded.
pub async fn settle_from_provider(
    permits: &Permits,
    task: &Task,
    delivered: bool,
    provider_message_id: Option<&str>,
) -> Result<Settled, PermitError> {
    let mut settled = Settled::default();
    if !delivered
        && let Some(fb) = serde_json::from_str::<Payload>(&task.payload)
            .ok()
            .and_then(|p| p.fallback)
    {
        crate::dispatch::fallback::accept_fallback(permits, task, &fb).await?;
        metrics::counter!("pushonce_fallback_total", "channel" => task.channel.clone())
            .increment(1);
        settled.fallback = true;
    }
    if permits
        .record_receipt(&task.id, delivered, provider_message_id)
        .await?
    {
        let name = if delivered {
            "pushonce_delivered_total"
        } else {
            "pushonce_failed_after_accept_total"
        };
        metrics::counter!(name, "channel" => task.channel.clone()).increment(1);
        settled.updated = true;
    }
    Ok(settled)
}
