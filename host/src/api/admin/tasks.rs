//! `/admin/tasks`: the tasks operators act on — held, failed and dead ones
//! listed, requeued and settled (with who and why, kept in the ledger), and
//! the task holding an idempotency key's permit.

use axum::Json;
use axum::extract::{Path, Query, RawQuery, State};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use crate::api::AppState;
use crate::api::body::parse_query;
use crate::api::log::escaped;
use crate::api::model::{Problem, TaskView};
use crate::api::problem::ApiError;
use crate::permit::{OperatorNote, Requeue, Settle, Settled, Task};

/// One held, failed or dead task.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct DeadTask {
    /// When it ended, or for a held (`unknown`) one when it was held (ms since the epoch).
    pub ended_at_ms: u64,
    /// The task.
    pub task: TaskView,
}

/// Held, failed and dead tasks, newest first.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct DeadTasks {
    /// The tasks.
    pub tasks: Vec<DeadTask>,
}

/// `?limit=` of the held-task listing.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct DeadQuery {
    /// At most this many (1..=1000, default 100).
    #[param(minimum = 1, maximum = 1000)]
    pub limit: Option<usize>,
}

/// `?force=` of a requeue.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct RequeueQuery {
    /// Requeue even if the task's message may already be at the provider
    /// (an attempt's outcome was unknown and nothing settled it): the
    /// operator accepts that the user may get it twice. Default false.
    pub force: Option<bool>,
    /// Who requeues it (recorded on the task; default `admin-api`).
    #[param(max_length = 200)]
    pub by: Option<String>,
    /// Why (recorded on the task).
    #[param(max_length = 2000)]
    pub why: Option<String>,
}

/// `?by=&why=` of an operator's settle (mark delivered, give up).
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct SettleQuery {
    /// Who settles it (recorded on the task; default `admin-api`).
    #[param(max_length = 200)]
    pub by: Option<String>,
    /// Why, e.g. "the user confirmed they got it" (required, recorded on the task).
    #[param(min_length = 1, max_length = 2000)]
    pub why: String,
}

/// The answer to a settle: the task as it is now.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct SettleView {
    /// The task, settled.
    pub task: TaskView,
}

/// The answer to a requeue.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct RequeueView {
    /// The task, queued again under its key.
    pub task_id: String,
    /// Attempts made before.
    pub attempts: u32,
    /// Attempts now allowed in all.
    pub max_attempts: u32,
}

/// `?key=` of the task search.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct KeyQuery {
    /// The full idempotency key, `push:<policy>@<major>:<channel>:<body>`.
    #[param(min_length = 1, max_length = 512)]
    pub key: String,
}

/// The permit of a key and the task holding it.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct KeySearch {
    /// The key.
    pub key: String,
    /// The task id holding the permit.
    pub owner: String,
    /// Milliseconds the permit still lives; absent when held without expiry.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub permit_ttl_ms: Option<u64>,
    /// The owner task (absent if its record expired).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub task: Option<TaskView>,
}

/// Every task an operator must look at, newest first: held (`unknown`),
/// failed and dead. The same list as `/admin/tasks/held`.
#[utoipa::path(get, path = "/admin/tasks/dead", tag = "admin",
    params(DeadQuery),
    responses(
        (status = 200, description = "Held (unknown), failed and dead tasks", body = DeadTasks),
        (status = 401, description = "Missing or wrong admin token", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Bad limit", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Redis unavailable", body = Problem, content_type = "application/problem+json"),
    ),
    security(("admin_token" = [])))]
pub(crate) async fn dead_tasks(
    state: State<AppState>,
    query: Result<Query<DeadQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<DeadTasks>, ApiError> {
    list_held(state, query).await
}

/// Every task an operator must look at, newest first: held (`unknown`,
/// with its cause, the provider's last answer and the reconciler's log),
/// failed and dead.
#[utoipa::path(get, path = "/admin/tasks/held", tag = "admin",
    params(DeadQuery),
    responses(
        (status = 200, description = "Held (unknown), failed and dead tasks", body = DeadTasks),
        (status = 401, description = "Missing or wrong admin token", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Bad limit", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Redis unavailable", body = Problem, content_type = "application/problem+json"),
    ),
    security(("admin_token" = [])))]
pub(crate) async fn held_tasks(
    state: State<AppState>,
    query: Result<Query<DeadQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<DeadTasks>, ApiError> {
    list_held(state, query).await
}

async fn list_held(
    State(state): State<AppState>,
    query: Result<Query<DeadQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<DeadTasks>, ApiError> {
    let Query(query) = query.map_err(|e| ApiError::invalid("limit", e.body_text()))?;
    let limit = query.limit.unwrap_or(100);
    if !(1..=1000).contains(&limit) {
        return Err(ApiError::invalid("limit", "must be in 1..=1000"));
    }
    let mut tasks = Vec::new();
    for (id, ended_at_ms) in state.permits.held_tasks(limit).await? {
        if let Some(task) = state.permits.task(&id).await? {
            tasks.push(DeadTask {
                ended_at_ms,
                task: TaskView::from(&task),
            });
        }
    }
    Ok(Json(DeadTasks { tasks }))
}

/// Send a failed or dead task again under its key (owner-checked).
#[utoipa::path(post, path = "/admin/tasks/{id}/requeue", tag = "admin",
    params(("id" = String, Path, description = "Task id"), RequeueQuery),
    responses(
        (status = 200, description = "Queued again", body = RequeueView),
        (status = 422, description = "A malformed query", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Missing or wrong admin token", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such task", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "Not failed/dead, another task owns the key's permit, or the message may be at the provider already (repeat with force=true)", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Redis unavailable", body = Problem, content_type = "application/problem+json"),
    ),
    security(("admin_token" = [])))]
pub(crate) async fn requeue(
    State(state): State<AppState>,
    Path(id): Path<String>,
    RawQuery(query): RawQuery,
) -> Result<Json<RequeueView>, ApiError> {
    let query: RequeueQuery = parse_query(query.as_deref())?;
    let note = operator_note(query.by, query.why.unwrap_or_default())?;
    requeue_task(&state, &id, query.force.unwrap_or(false), &note)
        .await
        .map(Json)
}

/// Requeues task `id` for an operator (`note`: who and why, recorded on
/// the task); the admin API and the console both act through this.
pub(crate) async fn requeue_task(
    state: &AppState,
    id: &str,
    force: bool,
    note: &OperatorNote,
) -> Result<RequeueView, ApiError> {
    if id.len() > 64 {
        return Err(ApiError::NotFound("no such task".into()));
    }
    let answer = state.permits.requeue_by(id, force, note).await?;
    if answer == Requeue::Missing {
        return Err(left_redis(state, id).await);
    }
    requeue_answer(id, answer, note)
}

/// What a requeue's answer means for an operator: the view, or why not.
pub(crate) fn requeue_answer(
    id: &str,
    answer: Requeue,
    note: &OperatorNote,
) -> Result<RequeueView, ApiError> {
    match answer {
        Requeue::Requeued {
            attempts,
            max_attempts,
        } => {
            tracing::info!(task = %escaped(id), attempts, max_attempts, by = %escaped(&note.by), "task requeued by an operator");
            Ok(RequeueView {
                task_id: id.to_string(),
                attempts,
                max_attempts,
            })
        }
        Requeue::Refused { owner } => Err(ApiError::Conflict(format!(
            "task {owner} now holds the permit of this task's key; requeueing would send twice"
        ))),
        Requeue::NotRequeueable(status) => Err(ApiError::Conflict(format!(
            "task {id} is {status}; only failed, dead or held (unknown) tasks are requeued"
        ))),
        Requeue::MaybeSent => Err(ApiError::Conflict(format!(
            "task {id}'s message may already be at the provider (an attempt's outcome was unknown and nothing has settled it); \
             requeueing can send it twice. Check with the provider or the user, then repeat with ?force=true to send again"
        ))),
        Requeue::Missing => Err(ApiError::NotFound(format!("no task {id:?}"))),
    }
}

/// Who acts and why, checked: `by` defaults to `admin-api`; both bounded.
pub(crate) fn operator_note(by: Option<String>, why: String) -> Result<OperatorNote, ApiError> {
    let by = by
        .map(|b| b.trim().to_string())
        .filter(|b| !b.is_empty())
        .unwrap_or_else(|| "admin-api".into());
    if by.len() > 200 {
        return Err(ApiError::invalid("by", "must be at most 200 bytes"));
    }
    if why.len() > 2000 {
        return Err(ApiError::invalid("why", "must be at most 2000 bytes"));
    }
    Ok(OperatorNote {
        by,
        why: why.trim().to_string(),
    })
}

/// Mark a held, failed or dead (or sent) task delivered without a send:
/// the operator confirmed with the user or the provider that it arrived.
#[utoipa::path(post, path = "/admin/tasks/{id}/mark-delivered", tag = "admin",
    params(("id" = String, Path, description = "Task id"), SettleQuery),
    responses(
        (status = 200, description = "Delivered; recorded on the task with who and why", body = SettleView),
        (status = 401, description = "Missing or wrong admin token", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such task", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "Not held, failed, dead or sent, or another task owns the key's permit", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "A malformed query (why is required)", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Redis unavailable", body = Problem, content_type = "application/problem+json"),
    ),
    security(("admin_token" = [])))]
pub(crate) async fn mark_delivered(
    State(state): State<AppState>,
    Path(id): Path<String>,
    RawQuery(query): RawQuery,
) -> Result<Json<SettleView>, ApiError> {
    settle_from_query(&state, &id, Settle::Delivered, query).await
}

/// Give up a held, failed or dead task: nobody will send it; it becomes
/// `failed` and leaves the held list (its permit kept for the window).
#[utoipa::path(post, path = "/admin/tasks/{id}/give-up", tag = "admin",
    params(("id" = String, Path, description = "Task id"), SettleQuery),
    responses(
        (status = 200, description = "Given up; recorded on the task with who and why", body = SettleView),
        (status = 401, description = "Missing or wrong admin token", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such task", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "Not held, failed or dead, or another task owns the key's permit", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "A malformed query (why is required)", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Redis unavailable", body = Problem, content_type = "application/problem+json"),
    ),
    security(("admin_token" = [])))]
pub(crate) async fn give_up(
    State(state): State<AppState>,
    Path(id): Path<String>,
    RawQuery(query): RawQuery,
) -> Result<Json<SettleView>, ApiError> {
    settle_from_query(&state, &id, Settle::GivenUp, query).await
}

/// The two settle endpoints: the operator's note from the query, then [`settle_task`].
async fn settle_from_query(
    state: &AppState,
    id: &str,
    how: Settle,
    query: Option<String>,
) -> Result<Json<SettleView>, ApiError> {
    let query: SettleQuery = parse_query(query.as_deref())?;
    let note = operator_note(query.by, query.why)?;
    settle_task(state, id, how, &note)
        .await
        .map(|task| Json(SettleView { task }))
}

/// Writes a task an operator settled to the delivery ledger (when there is
/// one), with the operator's step, so the history keeps who and why; once
/// the ledger holds it, the task leaves Redis (it ended for good).
async fn note_in_ledger(state: &AppState, task: &Task) {
    let Some(ledger) = &state.ledger else {
        return;
    };
    // Every step (an earlier requeue too), as the task keeps them.
    let Some(note) = crate::permit::operator_log(task) else {
        return;
    };
    let settled = crate::permit::Settlement {
        status: task.status.as_str(),
        error: None,
        note: Some(note),
    };
    state
        .permits
        .settle_and_forget(ledger, task, settled, true)
        .await;
}

/// Settles task `id` for an operator; the admin API and the console both
/// act through this. Answers the task as it is now.
pub(crate) async fn settle_task(
    state: &AppState,
    id: &str,
    how: Settle,
    note: &OperatorNote,
) -> Result<TaskView, ApiError> {
    if note.why.is_empty() {
        return Err(ApiError::invalid(
            "why",
            "say why (it is recorded on the task)",
        ));
    }
    if id.len() > 64 {
        return Err(ApiError::NotFound("no such task".into()));
    }
    match state.permits.settle(id, how, note).await? {
        Settled::Settled(status) => {
            tracing::info!(task = %escaped(id), %status, by = %escaped(&note.by), "task settled by an operator");
            let task = state.permits.task(id).await?;
            let task = task.ok_or_else(|| ApiError::NotFound(format!("no task {id:?}")))?;
            note_in_ledger(state, &task).await;
            Ok(TaskView::from(&task))
        }
        Settled::Refused { owner } => Err(ApiError::Conflict(format!(
            "task {owner} now holds the permit of this task's key; settle that task instead"
        ))),
        Settled::NotSettleable(status) => Err(ApiError::Conflict(format!(
            "task {id} is {status}; only held, failed or dead tasks (or sent ones, to mark delivered) are settled by hand"
        ))),
        Settled::Missing => Err(left_redis(state, id).await),
    }
}

/// The answer for a task Redis does not have: 409 naming its final status
/// when it ended and left Redis (the ledger has it: nothing to act on), 404
/// when nothing knows it.
async fn left_redis(state: &AppState, id: &str) -> ApiError {
    match crate::api::history::task(state, id).await {
        Ok(Some(view)) => ApiError::Conflict(format!(
            "task {id} ended {} and left Redis (the delivery ledger keeps its history); there is nothing to act on",
            view.status
        )),
        Ok(None) => ApiError::NotFound(format!("no task {id:?}")),
        Err(e) => e,
    }
}

/// The task holding the permit of an idempotency key.
#[utoipa::path(get, path = "/admin/tasks", tag = "admin",
    params(KeyQuery),
    responses(
        (status = 200, description = "The permit and its task", body = KeySearch),
        (status = 401, description = "Missing or wrong admin token", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No permit for this key", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Missing key", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Redis unavailable", body = Problem, content_type = "application/problem+json"),
    ),
    security(("admin_token" = [])))]
pub(crate) async fn task_by_key(
    State(state): State<AppState>,
    query: Result<Query<KeyQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<KeySearch>, ApiError> {
    let Query(query) = query.map_err(|e| ApiError::invalid("key", e.body_text()))?;
    if query.key.is_empty() || query.key.len() > 512 {
        return Err(ApiError::invalid("key", "must be 1..=512 bytes"));
    }
    let Some(owner) = state.permits.permit_owner(&query.key).await? else {
        return Err(ApiError::NotFound("no permit is held for this key".into()));
    };
    let ttl = state.permits.permit_ttl(&query.key).await?.flatten();
    let task = match state.permits.task(&owner).await {
        Ok(t) => t.map(|t| TaskView::from(&t)),
        Err(crate::permit::PermitError::BadTaskId(_)) => None,
        Err(e) => return Err(e.into()),
    };
    Ok(Json(KeySearch {
        key: query.key,
        owner,
        permit_ttl_ms: ttl,
        task,
    }))
}
