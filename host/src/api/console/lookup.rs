//! `/console/lookup`: a task by id, an event's tasks (biz_type + biz_id,
//! optionally one user's), the task holding an idempotency key, or a user's
//! latest tasks — through `GET /v1/tasks/{id}`,
//! `GET /v1/events/{biz_type}/{biz_id}`, `GET /admin/tasks?key=` and
//! `GET /admin/users/{user_id}/tasks`.

use axum::extract::{Path, Query, State};
use axum::response::{IntoResponse, Response};
use maud::{Markup, html};
use serde::Deserialize;

use super::session::Session;
use super::task::card;
use super::{Operator, layout, when};
use crate::api::admin::tasks::{KeyQuery, task_by_key};
use crate::api::model::{EventQuery, OptedOutView, TaskView};
use crate::api::{ApiError, AppState, events, history};

/// Most tasks a look-up by user shows.
const USER_TASKS: u32 = 100;

/// The look-up form's fields (each optional; the first given is used).
#[derive(Debug, Default, Deserialize)]
pub(crate) struct Find {
    /// A task id.
    #[serde(default)]
    pub task: String,
    /// Business type of an event.
    #[serde(default)]
    pub biz_type: String,
    /// Business id of an event.
    #[serde(default)]
    pub biz_id: String,
    /// Only this user's tasks of the event.
    #[serde(default)]
    pub user_id: String,
    /// An idempotency key.
    #[serde(default)]
    pub key: String,
}

/// The look-up page: the form and what it found.
pub(crate) async fn page(
    State(state): State<AppState>,
    Operator(session): Operator,
    Query(find): Query<Find>,
) -> Response {
    let found = search(&state, &find).await;
    let body = html! {
        h1 { "Look-up" }
        (form(&find))
        @match found {
            None => {}
            Some(Ok((tasks, opted_out))) => {
                (results(&session, &tasks))
                (opted_out_list(&opted_out))
            }
            Some(Err(e)) => { p role="alert" class="error" { (e.to_string()) } }
        }
        @let user = find.user_id.trim();
        @if !user.is_empty() {
            p { a id="user-preferences" href={ "/console/preferences?" (user_query(user)) } {
                "Preferences of " (user) " and their history"
            } }
        }
    };
    layout("Look-up", Some(&session), body).into_response()
}

/// `user_id=<user>`, encoded for a link.
fn user_query(user: &str) -> String {
    form_urlencoded::Serializer::new(String::new())
        .append_pair("user_id", user)
        .finish()
}

/// An event's channels answered `opted_out`.
fn opted_out_list(opted_out: &[OptedOutView]) -> Markup {
    html! {
        @if !opted_out.is_empty() {
            section aria-labelledby="opted-out" {
                h2 id="opted-out" class="counts" { "Channels answered opted_out (no task)" }
                ul {
                    @for o in opted_out {
                        li class="opted-out" {
                            strong { (o.channel) } ": opted out at " (when(u64::try_from(o.at).unwrap_or(0)))
                            " (key " code { (o.key) } ")"
                        }
                    }
                }
            }
        }
    }
}

/// The tasks `find` names (and an event's channels answered `opted_out`);
/// `None` when nothing was asked.
async fn search(state: &AppState, find: &Find) -> Option<Result<Found, ApiError>> {
    if let Some(found) = search_event(state, find).await {
        return Some(found);
    }
    find_tasks(state, find)
        .await
        .map(|found| found.map(|tasks| (tasks, Vec::new())))
}

/// What a look-up found: tasks, and an event's channels answered `opted_out`.
type Found = (Vec<TaskView>, Vec<OptedOutView>);

/// An event's tasks and opted-out channels, when `find` names an event (and no task id).
async fn search_event(state: &AppState, find: &Find) -> Option<Result<Found, ApiError>> {
    if !find.task.trim().is_empty()
        || find.biz_type.trim().is_empty()
        || find.biz_id.trim().is_empty()
    {
        return None;
    }
    let path = Path((find.biz_type.trim().into(), find.biz_id.trim().into()));
    let user_id = Some(find.user_id.trim().to_string()).filter(|u| !u.is_empty());
    let event = events::event(
        State(state.clone()),
        path,
        Ok(Query(EventQuery { user_id })),
    )
    .await;
    Some(event.map(|e| (e.0.tasks, e.0.opted_out)))
}

/// The tasks `find` names; `None` when nothing was asked.
async fn find_tasks(state: &AppState, find: &Find) -> Option<Result<Vec<TaskView>, ApiError>> {
    let state = State(state.clone());
    if !find.task.trim().is_empty() {
        let task = events::task(state, Path(find.task.trim().to_string())).await;
        return Some(task.map(|t| vec![t.0]));
    }
    if !find.biz_type.trim().is_empty() && !find.biz_id.trim().is_empty() {
        let path = Path((find.biz_type.trim().into(), find.biz_id.trim().into()));
        let user_id = Some(find.user_id.trim().to_string()).filter(|u| !u.is_empty());
        let event = events::event(state, path, Ok(Query(EventQuery { user_id }))).await;
        return Some(event.map(|e| e.0.tasks));
    }
    if !find.key.trim().is_empty() {
        let key = Ok(Query(KeyQuery {
            key: find.key.trim().to_string(),
        }));
        let found = task_by_key(state, key).await;
        return Some(found.map(|k| k.0.task.into_iter().collect()));
    }
    if !find.user_id.trim().is_empty() {
        return Some(history::user_tasks(&state, find.user_id.trim(), USER_TASKS).await);
    }
    None
}

fn form(find: &Find) -> Markup {
    html! {
        form method="get" action="/console/lookup" {
            fieldset {
                legend { "By task id" }
                label for="task" { "Task id" }
                input type="text" id="task" name="task" value=(find.task);
            }
            fieldset {
                legend { "By event" }
                label for="biz_type" { "Business type" }
                input type="text" id="biz_type" name="biz_type" value=(find.biz_type);
                label for="biz_id" { "Business id" }
                input type="text" id="biz_id" name="biz_id" value=(find.biz_id);
                label for="user_id" { "User id (with an event: only their tasks of it; alone: their latest tasks)" }
                input type="text" id="user_id" name="user_id" value=(find.user_id);
            }
            fieldset {
                legend { "By idempotency key" }
                label for="key" { "Key" }
                input type="text" id="key" name="key" value=(find.key);
            }
            p { button type="submit" id="find" { "Find" } }
        }
    }
}

fn results(session: &Session, tasks: &[TaskView]) -> Markup {
    html! {
        p role="status" { (tasks.len()) " tasks" }
        @for task in tasks { (card(session, task)) }
    }
}
