//! Fallback tasks: when a task's channel fails for good (a permanent refusal,
//! or a failed-after-accept receipt) and its payload names a fallback, the
//! fallback is accepted as a task of its own — its own key (the channel is in
//! the key), its own permit, fully described at accept time so no policy
//! lookup is needed. Accepting is idempotent: a second accept of the same
//! key is a duplicate, so callers accept the fallback *before* they record
//! the failure, and a crash between the two only repeats a harmless accept.
//! The recipient's preferences are read again first ([`OptOuts`]): a
//! fallback channel (or category) switched off since the event's accept is
//! passed over, as the accept passes over one switched off before it.
//! The same preferences stop an attempt whose recipient switched its channel
//! (or category) off since the accept (`opted_out.rs`).
//! The fallback decision of a receipt or a status query is here too
//! ([`Permits::settle_from_provider`]); a worker's, on a permanent refusal,
//! in `dispatch/worker.rs`, through [`Permits::accept_fallback`].

use std::time::Duration;

use futures_util::future::BoxFuture;

use super::{AcceptRequest, Fallback, Gate, PermitError, Permits, Task};

/// Why a recipient's preferences could not be read.
pub type OptOutsError = Box<dyn std::error::Error + Send + Sync>;

/// The recipients' preferences as they are now (the host's
/// `prefs::PreferenceCache`), read when a fallback is about to be accepted.
pub trait OptOuts: Send + Sync {
    /// What `user` switched off that stops a message of `category` on
    /// `channel` (`inbox`, `category marketing`), unless the category is
    /// mandatory; `None` when nothing does. `Err` when the preferences
    /// cannot be read.
    fn switched_off<'a>(
        &'a self,
        user: &'a str,
        channel: &'a str,
        category: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Option<String>, OptOutsError>>;

    /// What the policy in force for `biz_type` says of opt-outs (`None`:
    /// no policy for it now).
    fn policy_of(&self, biz_type: &str) -> Option<OptOutPolicy>;

    /// How stale the preferences an accept decided by may be: an attempt
    /// that begins within it of its accept is not checked again.
    fn bound(&self) -> Duration;
}

/// What a policy says of its messages' opt-outs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OptOutPolicy {
    /// The category it gives its messages (`None`: none).
    pub category: Option<String>,
    /// Whether a channel the recipient switched off hands the message to
    /// its fallback (`fallback_when_opted_out`).
    pub fallback_when_opted_out: bool,
}

/// What [`Permits::accept_fallback`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct FallbackTaken {
    /// The fallback channel accepted (or found accepted already), if any.
    pub(crate) accepted: Option<String>,
    /// The channels of the chain passed over before it, each with what the
    /// recipient switched off since the event's accept.
    pub(crate) passed: Vec<(String, String)>,
}

impl FallbackTaken {
    /// What the failed task's error says of its fallback, e.g. `fallback to
    /// sms not taken: the recipient switched sms off; fallback to wechat`.
    pub(crate) fn note(&self) -> String {
        let passed = self.passed.iter().map(|(channel, what)| {
            format!("fallback to {channel} not taken: the recipient switched {what} off")
        });
        let taken = self.accepted.iter().map(|c| format!("fallback to {c}"));
        passed.chain(taken).collect::<Vec<_>>().join("; ")
    }
}

impl Permits {
    /// Answers which channels' fallbacks the recipients switched off with
    /// `opt_outs` (without it, every fallback is accepted).
    pub fn with_opt_outs(mut self, opt_outs: std::sync::Arc<dyn OptOuts>) -> Permits {
        self.opt_outs = Some(opt_outs);
        self
    }

    /// Accepts `fallback` of `task` (a duplicate answer is success too), or
    /// the first one down its chain whose channel (or category) the
    /// recipient has not switched off.
    pub(crate) async fn accept_fallback(
        &self,
        task: &Task,
        fallback: &Fallback,
    ) -> Result<FallbackTaken, PermitError> {
        let recipient = recipient_of(&task.event_json);
        let mut taken = FallbackTaken::default();
        let mut next = Some(fallback);
        while let Some(fb) = next {
            if let Some(what) = self.switched_off(recipient.as_deref(), fb).await? {
                tracing::info!(task = %task.id, channel = %fb.channel, switched_off = %what, "fallback not taken: the recipient switched it off");
                taken.passed.push((fb.channel.clone(), what));
                next = fb.payload.fallback.as_deref();
                continue;
            }
            let answer = self.accept(&fallback_request(task, fb, recipient)).await?;
            tracing::info!(task = %task.id, fallback = %answer.task_id(), channel = %fb.channel, "fallback accepted");
            taken.accepted = Some(fb.channel.clone());
            break;
        }
        Ok(taken)
    }

    /// What `user` switched off that stops `fallback`, as read now.
    async fn switched_off(
        &self,
        user: Option<&str>,
        fallback: &Fallback,
    ) -> Result<Option<String>, PermitError> {
        let (Some(opt_outs), Some(user)) = (&self.opt_outs, user) else {
            return Ok(None);
        };
        opt_outs
            .switched_off(user, &fallback.channel, fallback.category.as_deref())
            .await
            .map_err(PermitError::Preferences)
    }
}

/// The accept of `fallback` standing in for `task`, for `recipient`.
fn fallback_request(task: &Task, fallback: &Fallback, recipient: Option<String>) -> AcceptRequest {
    AcceptRequest {
        key: fallback.key.clone(),
        channel: fallback.channel.clone(),
        window: Duration::from_millis(fallback.window_ms.max(1)),
        biz_type: task.biz_type.clone(),
        biz_id: task.biz_id.clone(),
        event_json: task.event_json.as_str().into(),
        payload: serde_json::to_string(&fallback.payload).unwrap_or_else(|_| "{}".into()),
        policy_name: task.policy_name.clone(),
        policy_version: task.policy_version.clone(),
        retry: task.retry,
        // The fallback stands in for a message the caps and quiet hours
        // already let through: it is neither counted again nor held back.
        gate: Gate::default(),
        // The same recipient as the task's, so the fallback's key lands in
        // the shard a direct accept of it would take.
        recipient,
        // Sent now: the task it stands in for was due already.
        send_at_ms: None,
    }
}

/// The `user_id` of a stored event (`event::event_json`), if any.
pub(super) fn recipient_of(event_json: &str) -> Option<String> {
    let event: serde_json::Value = serde_json::from_str(event_json).ok()?;
    Some(event.get("user_id")?.as_str()?.to_string())
}

/// What [`Permits::settle_from_provider`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProviderSettled {
    /// The task was `sent`/`unknown` and is now `delivered` or `failed`.
    pub updated: bool,
    /// A fallback task was accepted (or found already accepted).
    pub fallback: bool,
    /// The error recorded with the failure: why fallbacks were passed over
    /// (the recipient switched them off), for the ledger's row too.
    pub error: Option<String>,
}

impl Permits {
    /// Settles a `sent` or `unknown` task from what its provider said (a
    /// receipt or a status query): `delivered`, or `failed` after the
    /// provider accepted it — then the payload's fallback is accepted first
    /// (idempotent: if the host dies between the two writes, the next
    /// receipt or check finds the task still `sent` and does both again; the
    /// second accept is a duplicate, not a second task), and only then the
    /// failure recorded (`receipt.lua`), with why a fallback the recipient
    /// switched off was passed over as its error.
    pub(crate) async fn settle_from_provider(
        &self,
        task: &Task,
        delivered: bool,
        provider_message_id: Option<&str>,
    ) -> Result<ProviderSettled, PermitError> {
        let mut settled = ProviderSettled::default();
        let mut note = None;
        if !delivered && let Some(fb) = task.sends().ok().and_then(|p| p.fallback.clone()) {
            let taken = self.accept_fallback(task, &fb).await?;
            if taken.accepted.is_some() {
                metrics::counter!(crate::metric_names::FALLBACK, "channel" => task.channel.clone())
                    .increment(1);
                settled.fallback = true;
            }
            // Why a fallback was passed over is the failed task's error.
            note = (!taken.passed.is_empty()).then(|| taken.note());
        }
        if self
            .record_receipt_noting(&task.id, delivered, provider_message_id, note.as_deref())
            .await?
        {
            let name = if delivered {
                crate::metric_names::DELIVERED
            } else {
                crate::metric_names::FAILED_AFTER_ACCEPT
            };
            metrics::counter!(name, "channel" => task.channel.clone()).increment(1);
            settled.updated = true;
            settled.error = note;
        }
        Ok(settled)
    }
}
