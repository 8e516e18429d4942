//! History once a task left Redis: the task and event lookups fall back to
//! the delivery ledger's rows for tasks Redis no longer has (a task that
//! ended leaves Redis once the ledger holds its outcome; docs/ledger.md).

use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::AppState;
use super::model::{OperatorStepView, Problem, TaskView};
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
pub(crate) async fn task(state: &AppState, id: &str) -> Result<Option<TaskView>, ApiError> {
    let Some(ledger) = &state.ledger else {
        return Ok(None);
    };
    Ok(ledger.by_task(id).await?.map(|row| view(&row)))
}

/// Adds to `tasks` the event's tasks the ledger has that are not listed yet
/// (only `user_id`'s when given: compared by digest): each as Redis has it
/// while it does, else as the ledger last wrote it.
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
            // Without the event index (`event_index = false`) a task Redis
            // still has is found here.
            tasks.push(freshest(state, &row).await?);
        }
    }
    Ok(())
}

/// Most tasks one look-up by user answers.
const USER_TASKS_MAX: u32 = 500;

/// Query of `GET /admin/users/{user_id}/tasks`.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct UserTasksQuery {
    /// Most tasks to return, newest first (1–500, default 50).
    #[serde(default = "default_user_tasks")]
    pub limit: u32,
}

fn default_user_tasks() -> u32 {
    50
}

/// A user's tasks.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct UserTasks {
    /// The user id asked for.
    pub user_id: String,
    /// Newest first: as Redis has them now, else as the ledger last wrote them.
    pub tasks: Vec<TaskView>,
}

/// A user's tasks, newest first, found through the delivery ledger (every
/// task that reached a send attempt; one only queued is not there yet).
#[utoipa::path(get, path = "/admin/users/{user_id}/tasks", tag = "admin",
    params(("user_id" = String, Path, description = "The user id"), UserTasksQuery),
    responses(
        (status = 200, description = "The user's tasks", body = UserTasks),
        (status = 401, description = "Missing or wrong admin token", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Bad limit", body = Problem, content_type = "application/problem+json"),
        (status = 501, description = "The delivery ledger is off", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Redis or the ledger unavailable", body = Problem, content_type = "application/problem+json"),
    ),
    security(("admin_token" = [])))]
pub(crate) async fn get_user_tasks(
    State(state): State<AppState>,
    Path(user_id): Path<String>,
    query: Result<Query<UserTasksQuery>, QueryRejection>,
) -> Result<Json<UserTasks>, ApiError> {
    let Query(query) = query.map_err(|e| ApiError::invalid("limit", e.body_text()))?;
    if !(1..=USER_TASKS_MAX).contains(&query.limit) {
        return Err(ApiError::invalid(
            "limit",
            format!("between 1 and {USER_TASKS_MAX}"),
        ));
    }
    let tasks = user_tasks(&state, &user_id, query.limit).await?;
    Ok(Json(UserTasks { user_id, tasks }))
}

/// The newest `limit` tasks of `user_id`: the ledger's rows, each replaced
/// by Redis's task while Redis still has it (fresher, with event and history).
pub(crate) async fn user_tasks(
    state: &AppState,
    user_id: &str,
    limit: u32,
) -> Result<Vec<TaskView>, ApiError> {
    let Some(ledger) = &state.ledger else {
        return Err(ApiError::NotImplemented(
            "a look-up by user needs the delivery ledger (ledger_url is off)".into(),
        ));
    };
    let rows = ledger
        .by_recipient(&recipient_digest(user_id), limit)
        .await?;
    let mut tasks = Vec::with_capacity(rows.len());
    for row in rows {
        tasks.push(freshest(state, &row).await?);
    }
    Ok(tasks)
}

/// A ledger row's task as Redis has it while Redis still has it (fresher,
/// with event and history), else as the ledger last wrote it.
async fn freshest(state: &AppState, row: &LedgerRow) -> Result<TaskView, ApiError> {
    let live = state.permits.task(&row.task_id).await?;
    Ok(live.map_or_else(|| view(row), |t| TaskView::from(&t)))
}

/// A ledger row as a task view (no event, payload or schedule).
fn view(row: &LedgerRow) -> TaskView {
    let ms = |v: i64| u64::try_from(v).unwrap_or(0);
    let ended = matches!(
        row.status.as_str(),
        "sent" | "delivered" | "failed" | "dead"
    );
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
        window_ms: row
            .window_ends_at_ms
            .map_or(0, |end| ms(end.saturating_sub(row.claimed_at_ms))),
        // The accept's time, as Redis gave it (rows claimed before the
        // ledger kept it: the claim's).
        accepted_at: ms(row.accepted_at_ms.unwrap_or(row.claimed_at_ms)),
        updated_at: Some(ms(row.updated_at_ms)),
        sent_at: None,
        finished_at: ended.then(|| ms(row.updated_at_ms)),
        next_due: None,
        scheduled_for: None,
        last_error: row.last_error.clone(),
        provider_message_id: row.provider_message_id.clone(),
        reference: None,
        first_attempt_at: None,
        last_attempt_at: None,
        requeues: 0,
        duplicate_of: None,
        ever_sent: matches!(row.status.as_str(), "sent" | "delivered"),
        maybe_sent: false,
        possible_duplicate: false,
        held_cause: None,
        provider_answer: None,
        provider: None,
        provider_log: Vec::new(),
        reconcile_log: Vec::new(),
        operator_log: row
            .operator_note
            .as_deref()
            .map(parse_operator_log)
            .unwrap_or_default()
            .into_iter()
            .map(OperatorStepView::from)
            .collect(),
        digest: None,
        from_ledger: true,
        event: serde_json::Value::Null,
        payload: serde_json::Value::Null,
    }
}
