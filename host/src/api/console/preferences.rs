//! `/console/preferences`: a recipient's preferences — what they switched
//! off, the categories no preference blocks — and their history: who
//! changed what, when, by which route (the same view as
//! `GET /v1/users/{user_id}/preferences`).

use axum::extract::{Query, State};
use axum::response::{IntoResponse, Response};
use maud::{Markup, html};
use serde::Deserialize;

use super::{Operator, layout, when};
use crate::api::AppState;
use crate::api::preferences::{PreferencesView, view};

/// The page's one field.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct Who {
    /// The user id.
    #[serde(default)]
    pub user_id: String,
}

/// The preferences page: the form and the user's preferences.
pub(crate) async fn page(
    State(state): State<AppState>,
    Operator(session): Operator,
    Query(who): Query<Who>,
) -> Response {
    let user = who.user_id.trim();
    let found = if user.is_empty() {
        None
    } else {
        Some(view(&state, user).await)
    };
    let body = html! {
        h1 { "Preferences" }
        form method="get" action="/console/preferences" {
            label for="user_id" { "User id" }
            input type="text" id="user_id" name="user_id" value=(user);
            p { button type="submit" id="show" { "Show" } }
        }
        @match found {
            None => {}
            Some(Ok(v)) => { (shown(&v)) }
            Some(Err(e)) => { p role="alert" class="error" { (e.to_string()) } }
        }
    };
    layout("Preferences", Some(&session), body).into_response()
}

/// A list of names, or `none`.
fn names(list: &[String]) -> String {
    if list.is_empty() {
        "none".into()
    } else {
        list.join(", ")
    }
}

fn shown(v: &PreferencesView) -> Markup {
    html! {
        section aria-labelledby="now" {
            h2 id="now" class="counts" { "User " (v.user_id) }
            dl id="preferences" {
                dt { "Channels off" } dd id="channels-off" { (names(&v.channels_off)) }
                dt { "Categories off" } dd id="categories-off" { (names(&v.categories_off)) }
                dt { "Mandatory (sent whatever is off)" } dd { (names(&v.mandatory)) }
                dt { "Last changed" } dd {
                    @match v.updated_at {
                        Some(at) => { (when(u64::try_from(at).unwrap_or(0))) }
                        None => { "never (nothing switched off)" }
                    }
                }
            }
        }
        div class="scroll" {
            table id="history" {
                caption { "History, newest first" }
                thead { tr {
                    th scope="col" { "When" } th scope="col" { "Route" } th scope="col" { "By" }
                    th scope="col" { "Action" } th scope="col" { "What changed" }
                } }
                tbody {
                    @for c in &v.history {
                        tr {
                            td { (when(u64::try_from(c.at).unwrap_or(0))) }
                            td { (c.route) }
                            td { (c.by) }
                            td { (c.action) }
                            td { (c.what) }
                        }
                    }
                }
            }
            @if v.history.is_empty() { p role="status" { "No change recorded." } }
        }
    }
}
