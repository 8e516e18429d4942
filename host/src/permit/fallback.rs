//! Fallback tasks: when a task's channel fails for good (a permanent refusal,
//! or a failed-after-accept receipt) and its payload names a fallback, the
//! fallback is accepted as a task of its own — its own key (the channel is in
//! the key), its own permit, fully described at accept time so no policy
//! lookup is needed. Accepting is idempotent: a second accept of the same
//! key is a duplicate, so callers accept the fallback *before* they record
//! the failure, and a crash between the two only repeats a harmless accept.
//! The fallback decision of a receipt or a status query is here too
//! ([`Permits::settle_from_provider`]); a worker's, on a permanent refusal,
//! in `dispatch/worker.rs`, through [`Permits::accept_fallback`].

use std::time::Duration;

use super::{AcceptRequest, Acceptance, Fallback, Gate, PermitError, Permits, Task};

impl Permits {
    /// Accepts `fallback` of `task` (a duplicate answer is success too).
    pub(crate) async fn accept_fallback(
        &self,
        task: &Task,
        fallback: &Fallback,
    ) -> Result<Acceptance, PermitError> {
        let payload = serde_json::to_string(&fallback.payload).unwrap_or_else(|_| "{}".into());
        let req = AcceptRequest {
            key: fallback.key.clone(),
            channel: fallback.channel.clone(),
            window: Duration::from_millis(fallback.window_ms.max(1)),
            biz_type: task.biz_type.clone(),
            biz_id: task.biz_id.clone(),
            event_json: task.event_json.as_str().into(),
            payload,
            policy_name: task.policy_name.clone(),
            policy_version: task.policy_version.clone(),
            retry: task.retry,
            // The fallback stands in for a message the caps and quiet hours
            // already let through: it is neither counted again nor held back.
            gate: Gate::default(),
            // The same recipient as the task's, so the fallback's key lands in
            // the shard a direct accept of it would take.
            recipient: recipient_of(&task.event_json),
            // Sent now: the task it stands in for was due already.
            send_at_ms: None,
        };
        let answer = self.accept(&req).await?;
        tracing::info!(task = %task.id, fallback = %answer.task_id(), channel = %fallback.channel, "fallback accepted");
        Ok(answer)
    }
}

/// The `user_id` of a stored event (`event::event_json`), if any.
fn recipient_of(event_json: &str) -> Option<String> {
    let event: serde_json::Value = serde_json::from_str(event_json).ok()?;
    Some(event.get("user_id")?.as_str()?.to_string())
}

/// What [`Permits::settle_from_provider`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProviderSettled {
    /// The task was `sent`/`unknown` and is now `delivered` or `failed`.
    pub updated: bool,
    /// A fallback task was accepted (or found already accepted).
    pub fallback: bool,
}

impl Permits {
    /// Settles a `sent` or `unknown` task from what its provider said (a
    /// receipt or a status query): `delivered`, or `failed` after the
    /// provider accepted it — then the payload's fallback is accepted first
    /// (idempotent: if the host dies between the two writes, the next
    /// receipt or check finds the task still `sent` and does both again; the
    /// second accept is a duplicate, not a second task), and only then the
    /// failure recorded (`receipt.lua`).
    pub(crate) async fn settle_from_provider(
        &self,
        task: &Task,
        delivered: bool,
        provider_message_id: Option<&str>,
    ) -> Result<ProviderSettled, PermitError> {
        let mut settled = ProviderSettled::default();
        if !delivered && let Some(fb) = task.sends().ok().and_then(|p| p.fallback.clone()) {
            self.accept_fallback(task, &fb).await?;
            metrics::counter!(crate::metric_names::FALLBACK, "channel" => task.channel.clone())
                .increment(1);
            settled.fallback = true;
        }
        if self
            .record_receipt(&task.id, delivered, provider_message_id)
            .await?
        {
            let name = if delivered {
                crate::metric_names::DELIVERED
            } else {
                crate::metric_names::FAILED_AFTER_ACCEPT
            };
            metrics::counter!(name, "channel" => task.channel.clone()).increment(1);
            settled.updated = true;
        }
        Ok(settled)
    }
}
