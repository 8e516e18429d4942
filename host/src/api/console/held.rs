//! `/console/held`: every task an operator must look at (held `unknown`,
//! failed, dead — `GET /admin/tasks/held`), filterable by channel and cause,
//! each with its evidence, audit and actions.

use axum::extract::{Query, State};
use axum::response::{IntoResponse, Response};
use maud::html;
use serde::Deserialize;

use super::task::card;
use super::{Operator, error_page, layout};
use crate::api::AppState;
use crate::api::admin::tasks::{DeadQuery, held_tasks};

/// Most tasks the page lists.
const LIMIT: usize = 500;

/// The causes an operator filters by, with their labels.
const CAUSES: &[(&str, &str)] = &[
    ("cut_off_after_write", "Cut-off answer"),
    ("worker_vanished", "Worker vanished mid-send"),
    ("query_could_not_tell", "Query could not tell"),
    ("retries_exhausted", "Retries exhausted"),
    ("none", "No recorded cause"),
];

/// `?channel=&cause=`.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct Filter {
    /// Only this channel (empty: all).
    #[serde(default)]
    pub channel: String,
    /// Only this cause kind (empty: all; `none`: without a cause).
    #[serde(default)]
    pub cause: String,
}

/// The held list.
pub(crate) async fn page(
    State(state): State<AppState>,
    Operator(session): Operator,
    Query(filter): Query<Filter>,
) -> Response {
    let query = Ok(Query(DeadQuery { limit: Some(LIMIT) }));
    let all = match held_tasks(State(state), query).await {
        Ok(list) => list.0.tasks,
        Err(e) => return error_page(&session, e),
    };
    let mut channels: Vec<&str> = all.iter().map(|t| t.task.channel.as_str()).collect();
    channels.sort_unstable();
    channels.dedup();
    let shown: Vec<_> = all
        .iter()
        .filter(|t| filter.channel.is_empty() || t.task.channel == filter.channel)
        .filter(|t| {
            let kind = t
                .task
                .held_cause
                .as_ref()
                .map_or("none", |c| c.kind.as_str());
            filter.cause.is_empty() || kind == filter.cause
        })
        .collect();
    let body = html! {
        h1 { "Held and dead tasks" }
        form method="get" action="/console/held" class="filter" {
            label for="channel" { "Channel" }
            select id="channel" name="channel" {
                option value="" { "all" }
                @for c in &channels { option value=(c) selected[*c == filter.channel] { (c) } }
            }
            label for="cause" { "Cause" }
            select id="cause" name="cause" {
                option value="" { "all" }
                @for (kind, label) in CAUSES { option value=(kind) selected[*kind == filter.cause] { (label) } }
            }
            " " button type="submit" { "Filter" }
        }
        p role="status" { (shown.len()) " of " (all.len()) " tasks" }
        @for t in &shown { (card(&session, &t.task)) }
    };
    layout("Held tasks", Some(&session), body).into_response()
}
