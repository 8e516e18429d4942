//! `/console/overview`: the same [`Overview`](crate::api::overview::Overview)
//! as `GET /admin/overview`, as a page.

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use maud::html;

use super::{Operator, error_page, layout, when};
use crate::api::AppState;
use crate::api::overview::overview;

/// The overview page.
pub async fn page(State(state): State<AppState>, Operator(session): Operator) -> Response {
    let view = match overview(&state).await {
        Ok(view) => view,
        Err(e) => return error_page(&session, e),
    };
    let reload = &view.reload;
    let body = html! {
        h1 { "Overview" }
        p { "Counters since this host started; queues as Redis has them now." }
        div class="scroll" {
            table {
                caption { "Per channel" }
                thead { tr {
                    th scope="col" { "Channel" } th scope="col" { "Sent" } th scope="col" { "Delivered" }
                    th scope="col" { "Failed" } th scope="col" { "Retrying" } th scope="col" { "Held" }
                    th scope="col" { "Dead" }
                } }
                tbody {
                    @for c in &view.channels {
                        tr {
                            th scope="row" { (c.channel) }
                            td class="n" { (c.sent) } td class="n" { (c.delivered) }
                            td class="n" { (c.failed) } td class="n" { (c.retrying) }
                            td class="n" { (c.held) } td class="n" { (c.dead) }
                        }
                    }
                }
            }
        }
        dl {
            dt { "Retry queue" } dd { (view.retry_queue_depth) " tasks waiting for a retry" }
            dt { "Held now" }
            dd { a href="/console/held" { (view.held_now) " held, " (view.failed_or_dead_now) " failed or dead" } }
            dt { "Reconciliation lag" }
            dd { @match view.reconcile_lag_seconds {
                Some(s) => { (format!("{s:.1}")) " s at the last pass" }
                None => { "no pass yet" }
            } }
            dt { "Policies" }
            dd { "generation " (reload.generation) ", " (reload.policies) " policies, loaded " (when(reload.loaded_at_ms)) }
            dt { "Last reload" }
            dd {
                @if reload.refused.is_empty() {
                    span class="ok" { "ok" }
                } @else {
                    span class="error" role="alert" {
                        "refused at " (when(reload.refused_at_ms.unwrap_or(0))) "; the set above stays in force:"
                    }
                    ul { @for reason in &reload.refused { li { (reason) } } }
                }
            }
        }
    };
    layout("Overview", Some(&session), body).into_response()
}
