//! `/v1`: events in (single and batch), tasks and events out.
//!
//! A request's fields are checked and its event parsed here; the event is
//! planned by `route::plan` through the snapshot in force (one
//! `live.current()` per request: routed by `biz_type`, a key derived per
//! channel and per fallback channel, the payload built); then every
//! channel's permit is taken in ONE pipelined `accept_batch` — for a batch,
//! one pipeline for all its events.

use std::collections::BTreeMap;
use std::time::Instant;

use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;

use super::AppState;
use super::body::{JsonBody, from_value};
use super::history;
use super::log::escaped;
use super::model::Problem;
use super::model::*;
use super::problem::ApiError;
use crate::event::{
    Event, OccurredAt as At, YearRange, longer_than, occurred_at_within, send_at_within,
};
use crate::permit::{AcceptRequest, Acceptance};
use crate::route::Snapshot;
use crate::route::plan::{PlanRequest, PlannedEvent};

/// Accept one event.
#[utoipa::path(
    post, path = "/v1/events", tag = "events",
    request_body(content = EventRequest, content_type = "application/json"),
    responses(
        (status = 202, description = "One result per channel: accepted, duplicate or capped", body = EventAccepted),
        (status = 400, description = "Malformed JSON", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Missing or wrong bearer token", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "Body too large", body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "Not application/json", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Unknown biz_type, channel not allowed, bad field, key policy failed", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Redis unavailable; retry (safe: accepted channels answer duplicate)", body = Problem, content_type = "application/problem+json"),
    ),
    security(("api_token" = []))
)]
pub(crate) async fn post_event(
    State(state): State<AppState>,
    JsonBody(req): JsonBody<EventRequest>,
) -> Result<impl IntoResponse, ApiError> {
    let snapshot = state.live.current();
    validate(&req)?;
    let preferences = preferences_for(&state, &snapshot, std::iter::once(&req)).await?;
    let planned = plan(&snapshot, &state, req, now_ms(), &preferences)?;
    let mut answers = accept(&state, std::slice::from_ref(&planned))
        .await
        .map_err(|e| match e {
            ApiError::Unavailable { detail, .. } => ApiError::Unavailable {
                detail: format!(
                    "{detail}; none of this event's channels is known to be accepted; \
                     retrying the same event is safe (channels already accepted answer duplicate)"
                ),
                accepted: Some(Vec::new()),
            },
            other => other,
        })?;
    let accepted = answers.pop().expect("one answer per event");
    Ok((StatusCode::ACCEPTED, Json(accepted)))
}

/// Accept many events in one request; one Redis pipeline for all.
#[utoipa::path(
    post, path = "/v1/events:batch", tag = "events",
    request_body(content = BatchRequest, content_type = "application/json"),
    responses(
        (status = 200, description = "One item per event: 202 with results, or a 4xx problem", body = BatchResponse),
        (status = 400, description = "Malformed JSON", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Missing or wrong bearer token", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "Body too large", body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "Not application/json", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Not a batch, empty, or more events than allowed", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Redis unavailable; retry the batch (safe)", body = Problem, content_type = "application/problem+json"),
    ),
    security(("api_token" = []))
)]
pub(crate) async fn post_batch(
    State(state): State<AppState>,
    JsonBody(batch): JsonBody<BatchRequest>,
) -> Result<Json<BatchResponse>, ApiError> {
    let max = state.limits.batch_max;
    if batch.events.is_empty() {
        return Err(ApiError::invalid("events", "must hold at least one event"));
    }
    if batch.events.len() > max {
        return Err(ApiError::invalid(
            "events",
            format!("{} events; at most {max} per batch", batch.events.len()),
        ));
    }
    let snapshot = state.live.current();
    let now = now_ms();
    let mut items: Vec<BatchItem> = Vec::with_capacity(batch.events.len());
    let mut planned = Vec::new();
    let mut planned_index = Vec::new();
    let parsed: Vec<Result<EventRequest, ApiError>> = batch
        .events
        .into_iter()
        .map(|value| {
            let req = if value.is_object() {
                from_value::<EventRequest>(value)
            } else {
                Err(ApiError::invalid("body", "must be a JSON object"))
            };
            req.and_then(|req| validate(&req).map(|()| req))
        })
        .collect();
    let valid = parsed.iter().filter_map(|r| r.as_ref().ok());
    let preferences = preferences_for(&state, &snapshot, valid).await?;
    for (index, result) in parsed.into_iter().enumerate() {
        let result = result
            .map_err(|e| prefix_field(e, index))
            .and_then(|req| plan(&snapshot, &state, req, now, &preferences));
        match result {
            Ok(p) => {
                planned_index.push(index);
                planned.push(p);
                items.push(BatchItem {
                    index,
                    status: 202,
                    accepted: None,
                    problem: None,
                });
            }
            Err(e) => {
                let problem = e.problem();
                tracing::debug!(index, error = %escaped(&e.to_string()), "batch event refused");
                items.push(BatchItem {
                    index,
                    status: problem.status,
                    accepted: None,
                    problem: Some(problem),
                });
            }
        }
    }
    if !planned.is_empty() {
        let answers = accept(&state, &planned).await?;
        for (index, answer) in planned_index.into_iter().zip(answers) {
            items[index].accepted = Some(answer);
        }
    }
    Ok(Json(BatchResponse { results: items }))
}

fn prefix_field(e: ApiError, index: usize) -> ApiError {
    match e {
        ApiError::Invalid { field, detail } => ApiError::Invalid {
            field: format!("events[{index}].{field}"),
            detail,
        },
        other => other,
    }
}

/// One task.
#[utoipa::path(
    get, path = "/v1/tasks/{id}", tag = "tasks",
    params(("id" = String, Path, description = "Task id")),
    responses(
        (status = 200, description = "The task", body = TaskView),
        (status = 401, description = "Missing or wrong bearer token", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such task (or it expired)", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Redis unavailable", body = Problem, content_type = "application/problem+json"),
    ),
    security(("api_token" = []))
)]
pub(crate) async fn get_task(
    state: State<AppState>,
    id: Path<String>,
) -> Result<Json<TaskView>, ApiError> {
    let Json(view) = task(state, id).await?;
    Ok(Json(view.without_unsubscribe_links()))
}

/// One task as an operator sees it (the console): [`get_task`] with its
/// payload's unsubscribe links.
pub(crate) async fn task(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<TaskView>, ApiError> {
    if id.len() > 64 {
        return Err(ApiError::NotFound("no such task".into()));
    }
    if let Some(task) = state.permits.task(&id).await? {
        return Ok(Json(TaskView::from(&task)));
    }
    match history::task(&state, &id).await? {
        Some(view) => Ok(Json(view)),
        None => Err(ApiError::NotFound(format!("no task {id:?}"))),
    }
}

/// The tasks of one event, every channel.
#[utoipa::path(
    get, path = "/v1/events/{biz_type}/{biz_id}", tag = "tasks",
    params(
        ("biz_type" = String, Path, description = "Business type"),
        ("biz_id" = String, Path, description = "Business id"),
        EventQuery,
    ),
    responses(
        (status = 200, description = "The event's tasks, and its channels answered opted_out", body = EventTasks),
        (status = 401, description = "Missing or wrong bearer token", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No task of this event (or they expired)", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Bad query", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Redis unavailable", body = Problem, content_type = "application/problem+json"),
    ),
    security(("api_token" = []))
)]
pub(crate) async fn get_event(
    state: State<AppState>,
    path: Path<(String, String)>,
    query: Result<Query<EventQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<EventTasks>, ApiError> {
    let Json(mut event) = event(state, path, query).await?;
    event.tasks = event
        .tasks
        .into_iter()
        .map(TaskView::without_unsubscribe_links)
        .collect();
    Ok(Json(event))
}

/// The tasks of one event as an operator sees them (the console):
/// [`get_event`] with their payloads' unsubscribe links.
pub(crate) async fn event(
    State(state): State<AppState>,
    Path((biz_type, biz_id)): Path<(String, String)>,
    query: Result<Query<EventQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<EventTasks>, ApiError> {
    let Query(query) = query.map_err(|e| ApiError::invalid("query", e.body_text()))?;
    if longer_than(&biz_type, MAX_ID) || longer_than(&biz_id, MAX_ID) {
        return Err(ApiError::NotFound(format!(
            "no task of event {biz_type}/{biz_id}"
        )));
    }
    let ids = state.permits.tasks_of_event(&biz_type, &biz_id).await?;
    let mut tasks = Vec::new();
    for id in ids {
        if let Some(task) = state.permits.task(&id).await? {
            let view = TaskView::from(&task);
            let user = view.event.get("user_id").and_then(|v| v.as_str());
            if query.user_id.as_deref().is_none_or(|u| Some(u) == user) {
                tasks.push(view);
            }
        }
    }
    history::add_event_rows(
        &state,
        &biz_type,
        &biz_id,
        query.user_id.as_deref(),
        &mut tasks,
    )
    .await?;
    let opted_out = super::preferences::opted_out_of_event(
        &state,
        &biz_type,
        &biz_id,
        query.user_id.as_deref(),
    )
    .await?;
    if tasks.is_empty() && opted_out.is_empty() {
        let why = if state.permits.config().event_index {
            ""
        } else {
            " (the event index is off: a task is listed once it reached a send attempt)"
        };
        return Err(ApiError::NotFound(format!(
            "no task of event {biz_type}/{biz_id}{why}"
        )));
    }
    tasks.sort_by(|a, b| a.accepted_at.cmp(&b.accepted_at).then(a.id.cmp(&b.id)));
    Ok(Json(EventTasks {
        biz_type,
        biz_id,
        tasks,
        opted_out,
    }))
}

/// Milliseconds since the epoch, host clock.
fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Checks a text field: non-empty, at most `max` characters, no control
/// characters (`event::check_text`), naming the field.
fn check_text(field: &str, value: &str, max: usize) -> Result<(), ApiError> {
    crate::event::check_text(value, max).map_err(|why| ApiError::invalid(field, why))
}

/// Checks the request's fields against the limits.
fn validate(req: &EventRequest) -> Result<(), ApiError> {
    check_text("biz_type", &req.biz_type, MAX_ID)?;
    check_text("biz_id", &req.biz_id, MAX_ID)?;
    check_text("user_id", &req.user_id, MAX_ID)?;
    if let Some(t) = &req.template {
        check_text("template", t, MAX_ID)?;
    }
    if let Some(channels) = &req.channels {
        check_channels(channels)?;
    }
    check_entries("params", &text_lengths(&req.params), MAX_VALUE)?;
    check_entries("recipients", &text_lengths(&req.recipients), MAX_RECIPIENT)?;
    let attributes: Vec<(&str, Option<usize>)> = req
        .attributes
        .iter()
        .map(|(k, v)| match v {
            AttributeValue::Text(t) => (k.as_str(), Some(t.len())),
            _ => (k.as_str(), None),
        })
        .collect();
    check_entries("attributes", &attributes, MAX_VALUE)
}

/// Each entry's name and its value's length.
fn text_lengths(map: &BTreeMap<String, String>) -> Vec<(&str, Option<usize>)> {
    map.iter()
        .map(|(k, v)| (k.as_str(), Some(v.len())))
        .collect()
}

/// The request's channel list: at least one, at most [`MAX_CHANNELS`].
fn check_channels(channels: &[String]) -> Result<(), ApiError> {
    if channels.is_empty() {
        return Err(ApiError::invalid(
            "channels",
            "must name at least one channel when given",
        ));
    }
    if channels.len() > MAX_CHANNELS {
        return Err(ApiError::invalid(
            "channels",
            format!("{} channels; at most {MAX_CHANNELS}", channels.len()),
        ));
    }
    Ok(())
}

/// A map of the request (`map`): at most [`MAX_ENTRIES`] entries, names of at
/// most [`MAX_NAME`] bytes, text values (their length, when text) of at most
/// `max_value` bytes.
fn check_entries(
    map: &str,
    entries: &[(&str, Option<usize>)],
    max_value: usize,
) -> Result<(), ApiError> {
    if entries.len() > MAX_ENTRIES {
        return Err(ApiError::invalid(
            map,
            format!("{} entries; at most {MAX_ENTRIES}", entries.len()),
        ));
    }
    for (k, len) in entries {
        if k.len() > MAX_NAME {
            return Err(ApiError::invalid(
                map,
                format!("a name is {} bytes long; at most {MAX_NAME}", k.len()),
            ));
        }
        if let Some(len) = len.filter(|len| *len > max_value) {
            return Err(ApiError::invalid(
                format!("{map}.{k}"),
                format!("is {len} bytes long; at most {max_value}"),
            ));
        }
    }
    Ok(())
}

/// The event of the request (`occurred_at` defaults to `now`), built from
/// its typed fields: attribute values as the JSON form writes them, so the
/// API and the CLI give an event the same keys.
fn to_event(req: &EventRequest, now: u64, years: YearRange) -> Result<Event, ApiError> {
    let at = match &req.occurred_at {
        None => At::Millis(now),
        Some(OccurredAt::Millis(ms)) => At::Millis(*ms),
        Some(OccurredAt::Text(t)) => At::Text(t),
    };
    let occurred_at_ms =
        occurred_at_within(at, years).map_err(|reason| ApiError::invalid("occurred_at", reason))?;
    let attributes = req
        .attributes
        .iter()
        .map(|(k, v)| (k.clone(), v.as_text()))
        .collect();
    Ok(Event {
        biz_type: req.biz_type.clone(),
        biz_id: req.biz_id.clone(),
        user_id: req.user_id.clone(),
        occurred_at_ms,
        attributes,
    })
}

/// The preferences of the users of `requests` whose business type has a
/// policy (an event refused as unknown reads none, and is refused 422 even
/// while the preferences cannot be read).
async fn preferences_for<'r>(
    state: &AppState,
    snapshot: &Snapshot,
    requests: impl Iterator<Item = &'r EventRequest>,
) -> Result<super::preferences::UserPreferences, ApiError> {
    let users: Vec<&str> = requests
        .filter(|req| snapshot.policies.get(&req.biz_type).is_some())
        .map(|req| req.user_id.as_str())
        .collect();
    super::preferences::of_users(state, &users).await
}

/// Parses the event of a request whose fields were checked (`validate`) and
/// plans it (`route::plan`) with its user's preferences.
fn plan(
    snapshot: &Snapshot,
    state: &AppState,
    req: EventRequest,
    now: u64,
    preferences: &super::preferences::UserPreferences,
) -> Result<PlannedEvent, ApiError> {
    let event = to_event(&req, now, state.limits.occurred_at_years)?;
    let send_at_ms = req
        .send_at
        .as_deref()
        .map(|text| send_at_within(text, now, state.limits.send_at))
        .transpose()
        .map_err(|reason| ApiError::invalid("send_at", reason))?;
    let request = PlanRequest {
        event,
        channels: req.channels.as_deref(),
        template: req.template.as_deref(),
        params: &req.params,
        recipients: &req.recipients,
        send_at_ms,
        now_ms: now,
        preferences: preferences
            .get(&req.user_id)
            .map(|p| state.preferences.verdict(p)),
        unsubscribe: state
            .unsubscribe
            .as_deref()
            .map(|links| crate::route::plan::LinkWriter {
                links,
                mandatory: state.preferences.mandatory(),
            }),
    };
    Ok(crate::route::plan::plan(
        snapshot,
        &state.live.config().channels,
        request,
    )?)
}

/// Takes the permits of every channel of every event in one pipeline (with
/// the corpus samples the sampler lets through), counts the outcome, and
/// answers per event.
async fn accept(state: &AppState, events: &[PlannedEvent]) -> Result<Vec<EventAccepted>, ApiError> {
    let requests: Vec<&AcceptRequest> = events
        .iter()
        .flat_map(|e| e.channels.iter().map(|p| &p.request))
        .collect();
    let namespace = state.permits.layout().namespace().to_string();
    let extra: Vec<redis::Cmd> = events
        .iter()
        .filter(|_| state.corpus.sample())
        .flat_map(|e| crate::corpus::corpus_commands(&namespace, &e.event_json))
        .collect();
    let started = Instant::now();
    let answers = state
        .permits
        .accept_batch_with(requests.iter().copied(), &extra)
        .await;
    metrics::histogram!(crate::metric_names::PERMIT_SECONDS)
        .record(started.elapsed().as_secs_f64());
    let answers = answers?;
    let mut answers = answers.into_iter();
    let mut out = Vec::with_capacity(events.len());
    for event in events {
        let mut results = Vec::with_capacity(event.channels.len());
        for planned in &event.channels {
            let answer = answers
                .next()
                .ok_or(ApiError::Bug("Redis gave fewer answers than requests"))?;
            let result = channel_result(planned, answer);
            results.push(result);
        }
        for skipped in &event.opted_out {
            let result = super::preferences::opted_out_result(state, event, skipped);
            results.insert(skipped.at.min(results.len()), result);
        }
        out.push(EventAccepted {
            biz_type: event.biz_type.clone(),
            biz_id: event.biz_id.clone(),
            user_id: event.user_id.clone(),
            results,
        });
    }
    Ok(out)
}

/// Counts an accepted or duplicate answer by dedup mode (permit or bloom).
fn count_dedup_answer(planned: &crate::route::plan::Planned, answer: &Acceptance) {
    let kind = match answer {
        Acceptance::Accepted { .. } | Acceptance::Deferred { .. } => "accepted",
        Acceptance::Duplicate { .. } => "duplicate",
        Acceptance::Capped { .. } | Acceptance::Digested { .. } => return,
    };
    let mode = match planned.request.gate.bloom {
        Some(_) => "bloom",
        None => "permit",
    };
    metrics::counter!(crate::metric_names::DEDUP_ANSWERS,
        "channel" => planned.channel.clone(), "mode" => mode, "answer" => kind)
    .increment(1);
}

/// One channel's answer, counted in the metrics.
fn channel_result(planned: &crate::route::plan::Planned, answer: Acceptance) -> ChannelResult {
    let channel = planned.channel.clone();
    let mut result = ChannelResult {
        channel: channel.clone(),
        result: ResultKind::Accepted,
        task_id: String::new(),
        key: planned.request.key.clone(),
        status: None,
        cap: None,
        next_allowed_at: None,
        scheduled_for: None,
    };
    count_dedup_answer(planned, &answer);
    match answer {
        Acceptance::Accepted { task_id } => {
            metrics::counter!(crate::metric_names::ACCEPTED, "channel" => channel).increment(1);
            result.task_id = task_id;
        }
        Acceptance::Deferred {
            task_id,
            scheduled_for_ms,
        } => {
            metrics::counter!(crate::metric_names::ACCEPTED, "channel" => channel.clone())
                .increment(1);
            // Scheduled for the send_at itself or a digest's due time, or
            // for the end of the quiet hours it (or now) fell in.
            let by = if planned.request.send_at_ms == Some(scheduled_for_ms)
                || planned.request.gate.digest.is_some()
            {
                crate::metric_names::SCHEDULED
            } else {
                crate::metric_names::QUIET_DEFERRED
            };
            metrics::counter!(by, "channel" => channel).increment(1);
            result.task_id = task_id;
            result.scheduled_for = Some(scheduled_for_ms);
        }
        Acceptance::Digested {
            task_id,
            scheduled_for_ms,
        } => {
            metrics::counter!(crate::metric_names::DIGESTED, "channel" => channel).increment(1);
            result.result = ResultKind::Digested;
            result.task_id = task_id;
            result.scheduled_for = Some(scheduled_for_ms);
        }
        Acceptance::Duplicate { task_id, status } => {
            metrics::counter!(crate::metric_names::DUPLICATES, "channel" => channel).increment(1);
            result.result = ResultKind::Duplicate;
            result.task_id = task_id;
            result.status = status.map(|s| s.to_string());
        }
        Acceptance::Capped {
            cap,
            next_allowed_ms,
        } => {
            metrics::counter!(crate::metric_names::CAPPED, "channel" => channel, "cap" => cap.clone())
                .increment(1);
            result.result = ResultKind::Capped;
            result.cap = Some(cap);
            result.next_allowed_at = Some(next_allowed_ms);
        }
    }
    result
}
