//! History after Redis's retention: the task and event lookups fall back to
//! the delivery ledger's rows for tasks Redis no longer has.

use super::AppState;
use super::model::{OperatorStepView, TaskView};
use super::problem::ApiError;
use crate::ledger::{LedgerError, LedgerRow, recipient_digest};
use crate::permit::parse_operator_log;

impl From<LedgerError> for ApiError {
    fn from(e: LedgerError) -> ApiError {
        ApiError::Unavailable {
            detail: format!("ledger unavailable: {e}"),
            accepted: None,
        }
    }
}

/// The ledger's row of task `id` as a view, if the ledger is on and has it.
pub async fn task(state: &AppState, id: &str) -> Result<Option<TaskView>, ApiError> {
    let Some(ledger) = &state.ledger else {
        return Ok(None);
    };
    Ok(ledger.by_task(id).await?.map(|row| view(&row)))
}

/// Adds to `tasks` the ledger's rows of the event whose tasks Redis no
/// longer has (only `user_id`'s when given: compared by digest).
pub(crate) async fn add_event_rows(
    state: &AppState,
    biz_type: &str,
    biz_id: &str,
    user_id: Option<&str>,
    tasks: &mut Vec<TaskView>,
) -> Result<(), ApiError> {
    let Some(ledger) = &state.ledger else {
        return Ok(());
    };
    let digest = user_id.map(recipient_digest);
    for row in ledger.by_event(biz_type, biz_id).await? {
        let known = tasks.iter().any(|t| t.id == row.task_id);
        let user_ok = digest.as_ref().is_none_or(|d| *d == row.recipient_digest);
        if !known && user_ok {
            tasks.push(view(&row));
        }
    }
    Ok(())
}

/// A ledger row as a task view (no event, payload or schedule).
fn view(row: &LedgerRow) -> TaskView {
    let ms = |v: i64| u64::try_from(v).unwrap_or(0);
    TaskView {
        id: row.task_id.clone(),
        key: row.key.clone(),
        channel: row.channel.clone(),
        status: row.status.clone(),
        biz_type: row.biz_type.clone(),
        biz_id: row.biz_id.clone(),
        attempts: row.attempts,
        max_attempts: 0,
        key_policy: row.policy.clone(),
        window_ms: 0,
        accepted_at: ms(row.claimed_at_ms),
        updated_at: Some(ms(row.updated_at_ms)),
        sent_at: None,
        finished_at: None,
        next_due: None,
        scheduled_for: None,
        last_error: row.last_error.clone(),
        provider_message_id: row.provider_message_id.clone(),
        reference: None,
        first_attempt_at: None,
        last_attempt_at: None,
        requeues: 0,
        duplicate_of: None,
        ever_sent: false,
        maybe_sent: false,
        held_cause: None,
        provider_answer: None,
        reconcile_log: Vec::new(),
        operator_log: row
            .operator_note
            .as_deref()
            .map(parse_operator_log)
            .unwrap_or_default()
            .into_iter()
            .map(OperatorStepView::from)
            .collect(),
        from_ledger: true,
        event: serde_json::Value::Null,
        payload: serde_json::Value::Null,
    }
}
