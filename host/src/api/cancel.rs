//! `POST /v1/events/{biz_type}/{biz_id}/cancel`: the business takes an
//! event back. Every task of it (optionally one user's, one channel's)
//! whose first attempt has not begun is cancelled (`permit::Permits::cancel`,
//! decided against a worker's begin by the same status check, so exactly
//! one of them wins); the others are too late, each answered with its status.

use axum::Json;
use axum::extract::{FromRequest, Path, Request, State};
use axum::http::header;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::AppState;
use super::body::{check_json_media_type, parse_json};
use super::history;
use super::model::{MAX_ID, MAX_NAME, Problem, TaskView};
use super::problem::ApiError;
use crate::event::longer_than;
use crate::metric_names as names;
use crate::permit::{Cancel, PermitFate, Task, TaskStatus};

/// The body of a cancel (optional: no body cancels every task of the event).
#[derive(Debug, Default, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct CancelRequest {
    /// Only this user's tasks of the event.
    #[serde(default)]
    pub user_id: Option<String>,
    /// Only the task of this channel.
    #[serde(default)]
    pub channel: Option<String>,
    /// Release the cancelled tasks' permits (owner-checked), so a re-post of
    /// the event is accepted again; by default they stay for the window and
    /// a re-post is answered `duplicate`.
    #[serde(default)]
    pub release_permit: bool,
}

/// The answer to a cancel (200).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub(crate) struct CancelAnswer {
    /// Business type of the event.
    pub biz_type: String,
    /// Business id of the event.
    pub biz_id: String,
    /// One item per task of the event (per channel, per user), oldest first.
    pub channels: Vec<ChannelCancel>,
}

/// What a cancel did to one task.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub(crate) struct ChannelCancel {
    /// Channel.
    pub channel: String,
    /// The task.
    pub task_id: String,
    /// `cancelled` (never sent; also for a task cancelled before) or
    /// `too_late` (its first attempt had begun: see `status`).
    pub result: String,
    /// The task's status now: `cancelled`, or for `too_late` the status it
    /// had (`sending`, `retry_wait`, `sent`, `delivered`, `failed`, …).
    pub status: String,
    /// For a task cancelled by this call: its permit `kept` (for the window,
    /// a re-post is `duplicate`), `released` (a re-post is accepted), or
    /// `not_owner` (another task holds the key now).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub permit: Option<String>,
}

/// Cancel an event's tasks whose first attempt has not begun.
#[utoipa::path(
    post, path = "/v1/events/{biz_type}/{biz_id}/cancel", tag = "events",
    params(
        ("biz_type" = String, Path, description = "Business type"),
        ("biz_id" = String, Path, description = "Business id"),
    ),
    request_body(content = CancelRequest, content_type = "application/json", description = "Optional: which user's or channel's tasks, and whether to release their permits"),
    responses(
        (status = 200, description = "One item per task: cancelled or too_late (with its status)", body = CancelAnswer),
        (status = 400, description = "Malformed JSON", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Missing or wrong bearer token", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "unknown_event: no task of this event (or of that user or channel) is known", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "The event index is off (`event_index = false`): a task is found only once its first attempt began", body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "A body that is not application/json", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Bad field", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Redis or the ledger unavailable; retrying is safe (a cancelled task answers cancelled again)", body = Problem, content_type = "application/problem+json"),
    ),
    security(("api_token" = []))
)]
pub(crate) async fn cancel_event(
    State(state): State<AppState>,
    Path((biz_type, biz_id)): Path<(String, String)>,
    OptionalJson(req): OptionalJson<CancelRequest>,
) -> Result<Json<CancelAnswer>, ApiError> {
    let unknown = |what: &str| {
        ApiError::NotFound(format!(
            "unknown_event: no task of event {biz_type}/{biz_id}{what}"
        ))
    };
    if longer_than(&biz_type, MAX_ID) || longer_than(&biz_id, MAX_ID) {
        return Err(unknown(""));
    }
    check_filter("user_id", req.user_id.as_deref(), MAX_ID)?;
    check_filter("channel", req.channel.as_deref(), MAX_NAME)?;
    if !state.permits.config().event_index {
        return Err(ApiError::Conflict(
            "cancelling needs the event index (`event_index = true`): without it an event's \
             tasks are found through the delivery ledger, only once their first attempt began"
                .into(),
        ));
    }
    let wanted = |view: &TaskView| {
        let user = view.event.get("user_id").and_then(|v| v.as_str());
        req.user_id.as_deref().is_none_or(|u| Some(u) == user)
            && req.channel.as_deref().is_none_or(|c| c == view.channel)
    };
    let mut views = Vec::new();
    let mut channels = Vec::new();
    for id in state.permits.tasks_of_event(&biz_type, &biz_id).await? {
        let Some(task) = state.permits.task(&id).await? else {
            continue;
        };
        let view = TaskView::from(&task);
        if !wanted(&view) {
            continue;
        }
        let answer = cancel_task(&state, &task, &biz_id, req.release_permit, "api").await?;
        let item = |result: &str, status: TaskStatus, permit: Option<PermitFate>| ChannelCancel {
            channel: task.channel.clone(),
            task_id: id.clone(),
            result: result.into(),
            status: status.to_string(),
            permit: permit.map(|p| permit_name(p).into()),
        };
        match answer {
            Cancel::Cancelled(fate) | Cancel::Removed(fate) => {
                channels.push(item("cancelled", TaskStatus::Cancelled, Some(fate)));
            }
            Cancel::TooLate(TaskStatus::Cancelled) => {
                channels.push(item("cancelled", TaskStatus::Cancelled, None));
            }
            Cancel::TooLate(status) => channels.push(item("too_late", status, None)),
            // It left Redis since it was read: the ledger's row answers below.
            Cancel::Missing => continue,
        }
        views.push(view);
    }
    // Tasks that already left Redis (ended, the ledger holding them).
    let known = views.len();
    history::add_event_rows(
        &state,
        &biz_type,
        &biz_id,
        req.user_id.as_deref(),
        &mut views,
    )
    .await?;
    // (Their user was matched by digest: a ledger row holds no event.)
    let channel_ok = |v: &TaskView| req.channel.as_deref().is_none_or(|c| c == v.channel);
    for view in views.drain(known..).filter(|v| channel_ok(v)) {
        let result = if view.status == TaskStatus::Cancelled.as_str() {
            "cancelled"
        } else {
            "too_late"
        };
        channels.push(ChannelCancel {
            channel: view.channel,
            task_id: view.id,
            result: result.into(),
            status: view.status,
            permit: None,
        });
    }
    if channels.is_empty() {
        let mut what = String::new();
        if let Some(u) = &req.user_id {
            what.push_str(&format!(" for user {u:?}"));
        }
        if let Some(c) = &req.channel {
            what.push_str(&format!(" on channel {c:?}"));
        }
        return Err(unknown(&what));
    }
    Ok(Json(CancelAnswer {
        biz_type,
        biz_id,
        channels,
    }))
}

/// Cancels `task` (`permit::Permits::cancel`: for a digest and a non-empty
/// `biz_id`, that event's item only) on behalf of `by` (`api`, or the
/// console's operator); a task cancelled or an item taken out is counted,
/// logged and, for a whole task, noted in the ledger.
pub(crate) async fn cancel_task(
    state: &AppState,
    task: &Task,
    biz_id: &str,
    release: bool,
    by: &str,
) -> Result<Cancel, ApiError> {
    let answer = state.permits.cancel(&task.id, biz_id, release).await?;
    match answer {
        Cancel::Cancelled(fate) => {
            metrics::counter!(names::CANCELLED, "channel" => task.channel.clone()).increment(1);
            tracing::info!(task = %task.id, channel = %task.channel, permit = permit_name(fate), by, "cancelled before its first attempt");
            if let Some(ledger) = &state.ledger {
                state.permits.note_cancelled(ledger, task, fate, None).await;
            }
        }
        Cancel::Removed(fate) => {
            metrics::counter!(names::CANCELLED, "channel" => task.channel.clone()).increment(1);
            tracing::info!(task = %task.id, channel = %task.channel, biz_id, permit = permit_name(fate), by, "taken out of its digest before the digest's first attempt");
        }
        Cancel::TooLate(_) | Cancel::Missing => {}
    }
    Ok(answer)
}

/// A permit's fate as the answer names it.
fn permit_name(fate: PermitFate) -> &'static str {
    match fate {
        PermitFate::Kept | PermitFate::Retaken => "kept",
        PermitFate::Released => "released",
        PermitFate::NotOwner => "not_owner",
    }
}

/// A filter of the body: when given, held to the accept's text rule
/// (`event::check_text`: non-empty, at most `max` characters).
fn check_filter(field: &str, value: Option<&str>, max: usize) -> Result<(), ApiError> {
    match value {
        Some("") => Err(ApiError::invalid(field, "must not be empty when given")),
        Some(v) => crate::event::check_text(v, max).map_err(|why| ApiError::invalid(field, why)),
        None => Ok(()),
    }
}

/// A JSON body that may be left out: an empty body is `T::default()`; any
/// other is checked as [`super::body::JsonBody`] checks it (media type,
/// syntax, shape).
#[derive(Debug)]
pub(crate) struct OptionalJson<T>(pub T);

impl<S, T> FromRequest<S> for OptionalJson<T>
where
    S: Send + Sync,
    T: serde::de::DeserializeOwned + Default,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let media_type = req.headers().get(header::CONTENT_TYPE).cloned();
        let limit = req
            .extensions()
            .get::<super::body::BodyLimit>()
            .map(|l| l.0)
            .unwrap_or(0);
        let bytes = axum::body::Bytes::from_request(req, state)
            .await
            .map_err(|e| {
                if e.status() == axum::http::StatusCode::PAYLOAD_TOO_LARGE {
                    ApiError::TooLarge { limit }
                } else {
                    ApiError::BadJson(format!("could not read the body: {e}"))
                }
            })?;
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Ok(OptionalJson(T::default()));
        }
        check_json_media_type(media_type.as_ref())?;
        parse_json(&bytes).map(OptionalJson)
    }
}
