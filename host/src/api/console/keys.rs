//! `/console/keys`: the key explorer. Paste an event (the JSON of
//! `POST /v1/events`, or just `biz_type`, `biz_id`, `user_id`,
//! `occurred_at`, `attributes`) and see the idempotency key and window each
//! channel would get under each policy in force
//! ([`explore::keys_under_each`], the derivation of `pushonce keys`).

use axum::Form;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use maud::{Markup, html};
use serde::Deserialize;

use super::session::Session;
use super::{Operator, csrf_field, layout};
use crate::api::AppState;
use crate::event::event_from_json_within;
use crate::route::explore::{PolicyKeys, keys_under_each};

/// An example event, the empty form's placeholder.
const EXAMPLE: &str = r#"{"biz_type": "ORDER_SHIPPED", "biz_id": "o-1", "user_id": "u-42", "occurred_at": "2026-11-30T08:00:00Z"}"#;

/// The explorer's form (the CSRF token is checked by the guard).
#[derive(Debug, Deserialize)]
pub(crate) struct EventForm {
    /// The event's JSON.
    #[serde(default)]
    pub event: String,
}

/// The empty explorer.
pub(crate) async fn page(Operator(session): Operator) -> Response {
    render(&session, "", html! {}).into_response()
}

/// The keys of the pasted event, or what is wrong with it.
pub(crate) async fn explore(
    State(state): State<AppState>,
    Operator(session): Operator,
    Form(form): Form<EventForm>,
) -> Response {
    let event = match event_from_json_within(&form.event, state.limits.occurred_at_years) {
        Ok(event) => event,
        Err(e) => {
            let error = html! {
                p class="error" role="alert" id="event-error" { "Not an event: " (e.to_string()) }
            };
            let page = render(&session, &form.event, error);
            return (StatusCode::UNPROCESSABLE_ENTITY, page).into_response();
        }
    };
    let snapshot = state.live.current();
    let found = tokio::task::spawn_blocking(move || keys_under_each(&snapshot, &event))
        .await
        .unwrap_or_default();
    render(&session, &form.event, results(&found)).into_response()
}

fn render(session: &Session, text: &str, result: Markup) -> Markup {
    let body = html! {
        h1 { "Key explorer" }
        p { "The idempotency key each channel would get under each policy in force. Nothing is sent or stored." }
        form method="post" action="/console/keys" {
            (csrf_field(session))
            label for="event" { "Event (JSON: biz_type, biz_id, user_id, occurred_at, attributes)" }
            textarea id="event" name="event" rows="6" cols="70" spellcheck="false" required placeholder=(EXAMPLE) { (text) }
            p { button type="submit" id="derive" { "Show keys" } }
        }
        (result)
    };
    layout("Key explorer", Some(session), body)
}

fn results(found: &[PolicyKeys]) -> Markup {
    html! {
        @if found.is_empty() { p role="status" { "No policy is in force." } }
        @for policy in found {
            section class="keys" aria-label={ "Policy " (policy.biz_type) } {
                h2 {
                    "Policy " (policy.biz_type)
                    @if policy.routes_event { " — routes this event" }
                }
                @match &policy.plugin {
                    Err(e) => { p class="error" { "Key policy: " (e) } }
                    Ok(id) => {
                        p { "Key policy " code { (id) } }
                        div class="scroll" { table {
                            thead { tr { th scope="col" { "Channel" } th scope="col" { "Key" } th scope="col" { "Window" } } }
                            tbody { @for (channel, key) in &policy.keys {
                                tr {
                                    th scope="row" { (channel) }
                                    @match key {
                                        Ok((key, window)) => {
                                            td { code class="key" { (key) } }
                                            td { (humantime::format_duration(*window)) }
                                        }
                                        Err(e) => { td class="error" colspan="2" { "no key: " (e) } }
                                    }
                                }
                            } }
                        } }
                    }
                }
            }
        }
    }
}
