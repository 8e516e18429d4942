//! Fallback tasks: when a task's channel fails for good (a permanent refusal,
//! or a failed-after-accept receipt) and its payload names a fallback, the
//! fallback is accepted as a task of its own — its own key (the channel is in
//! the key), its own permit, fully described at accept time so no policy
//! lookup is needed. Accepting is idempotent: a second accept of the same
//! key is a duplicate, so callers accept the fallback *before* they record
//! the failure, and a crash between the two only repeats a harmless accept.

use std::time::Duration;

use super::Fallback;
use crate::permit::{AcceptRequest, Acceptance, PermitError, Permits, Task};

/// Accepts `fallback` of `task` (a duplicate answer is success too).
pub(crate) async fn accept_fallback(
    permits: &Permits,
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
        event_json: task.event_json.clone(),
        payload,
        policy_name: task.policy_name.clone(),
        policy_version: task.policy_version.clone(),
        retry: task.retry,
        // The fallback stands in for a message the caps and quiet hours
        // already let through: it is neither counted again nor held back.
        gate: crate::permit::Gate::default(),
        // The same recipient as the task's, so the fallback's key lands in
        // the shard a direct accept of it would take.
        recipient: recipient_of(&task.event_json),
    };
    let answer = permits.accept(&req).await?;
    tracing::info!(task = %task.id, fallback = %answer.task_id(), channel = %fallback.channel, "fallback accepted");
    Ok(answer)
}

/// The `user_id` of a stored event (`route::plan::event_json`), if any.
fn recipient_of(event_json: &str) -> Option<String> {
    let event: serde_json::Value = serde_json::from_str(event_json).ok()?;
    Some(event.get("user_id")?.as_str()?.to_string())
}
