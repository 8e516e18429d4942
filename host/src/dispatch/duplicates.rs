//! Possible duplicates: a resend after an ambiguous answer (cut off, a 5xx,
//! a worker that vanished mid-send) on a channel that cannot dedupe it (it
//! honours no reference, or its window is over, and `on_unknown = "resend"`
//! or a status query found nothing). The provider may already have the
//! first message, so the user may get two.
//!
//! Each is counted as `pushonce_possible_duplicates_total{channel}` and the
//! task's hash gets `possible_duplicate = 1`, shown as `possible_duplicate`
//! by `GET /v1/tasks/{id}`. Marked once the resend is decided: by a worker
//! (still holding the task's lease) or by the reconciler re-queueing an
//! `unknown` task its status query did not find.

use crate::metric_names as names;
use crate::permit::Permits;

/// The task hash's field that marks a possible duplicate (`1`).
pub const FIELD: &str = crate::permit::POSSIBLE_DUPLICATE;

/// Counts a resend of `task_id` on `channel` the provider cannot dedupe and
/// marks the task (a lifecycle script, `permit/duplicate.lua`). A Redis
/// error only loses the mark (logged): the count and the resend stand.
pub(crate) async fn note(permits: &Permits, task_id: &str, channel: &str) {
    metrics::counter!(names::POSSIBLE_DUPLICATES, "channel" => channel.to_string()).increment(1);
    tracing::warn!(task = %task_id, %channel,
        "resending after an ambiguous answer on a channel that cannot dedupe: a possible duplicate");
    match permits.mark_possible_duplicate(task_id).await {
        Ok(true) => {}
        Ok(false) => {
            tracing::warn!(task = %task_id, "the task left Redis before it could be marked a possible duplicate");
        }
        Err(e) => {
            tracing::warn!(task = %task_id, error = %e, "could not mark the task a possible duplicate");
        }
    }
}
