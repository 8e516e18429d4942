//! `/console/providers`: the provider circuits of every channel with
//! `providers` — the same [`ProvidersView`] as `GET /admin/providers`, of
//! the host process that serves the page (each process keeps its own).

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use maud::html;

use super::{Operator, layout, when};
use crate::api::AppState;
use crate::api::admin::providers::providers_view;

/// The providers page.
pub(crate) async fn page(State(state): State<AppState>, Operator(session): Operator) -> Response {
    let view = providers_view(&state);
    let body = html! {
        h1 { "Providers" }
        p {
            "The circuit of each provider of a channel with " code { "providers" } ", as host process "
            strong { (view.pid) } " sees it: each process keeps its own, fed by its own sends. "
            "While a circuit is open, new tasks of the channel start at the next provider; "
            "a task that has a provider stays with it."
        }
        @if view.channels.is_empty() {
            p role="status" { "No channel names providers." }
        }
        @for c in &view.channels {
            @let title = format!("providers-{}", c.channel);
            h2 id=(title) class="counts" {
                "Channel " (c.channel) ": opens after " (c.circuit_failures)
                " failures in a row, for " (format!("{:.1}", c.circuit_open_ms as f64 / 1000.0)) " s"
            }
            div class="scroll" {
                table class="providers" aria-labelledby=(title) {
                    thead { tr {
                        th scope="col" { "Provider" } th scope="col" { "Circuit" } th scope="col" { "Since" }
                        th scope="col" { "Failures in a row" } th scope="col" { "Last infrastructure failure" }
                    } }
                    tbody {
                        @for p in &c.providers {
                            tr data-provider=(p.provider) {
                                th scope="row" { (p.provider) }
                                td class={ "state " @if p.state == "closed" { "ok" } @else { "error" } } { (p.state) }
                                td { (when(p.since_ms)) }
                                td class="n" { (p.failures_in_a_row) }
                                td {
                                    @match &p.last_failure {
                                        Some(f) => { (when(f.at_ms)) ": " (f.reason) }
                                        None => { "none" }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    };
    layout("Providers", Some(&session), body).into_response()
}
