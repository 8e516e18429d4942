//! `/console/overview`: the same [`Overview`](crate::api::overview::Overview)
//! as `GET /admin/overview`, as a page.

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use maud::{Markup, html};

use super::{Operator, error_page, layout, when};
use crate::api::AppState;
use crate::api::overview::{ChannelCounts, RECENT_WINDOW, overview};

/// The overview page.
pub(crate) async fn page(State(state): State<AppState>, Operator(session): Operator) -> Response {
    let view = match overview(&state).await {
        Ok(view) => view,
        Err(e) => return error_page(&session, e),
    };
    let reload = &view.reload;
    let body = html! {
        h1 { "Overview" }
        p { "Queues as Redis has them now; below, this host's counters over the last minutes and since it started." }
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
            dd { a href="/console/policies" { "generation " (reload.generation) ", " (reload.policies) " policies" } ", loaded " (when(reload.loaded_at_ms)) }
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
                @if !reload.notes.is_empty() {
                    p class="warn" { "The set in force was swapped in without these checks:" }
                    ul { @for note in &reload.notes { li { (note) } } }
                }
            }
        }
        (counts_table(&recent_caption(view.recent.seconds), "recent", &view.recent.channels))
        (counts_table("Per channel since this host started", "since-start", &view.channels))
    };
    layout("Overview", Some(&session), body).into_response()
}

/// The caption of the recent counters: the window, or the shorter span
/// covered while the host is younger.
fn recent_caption(seconds: u64) -> String {
    let window = RECENT_WINDOW.as_secs();
    if seconds + 15 >= window {
        format!("Per channel over the last {} minutes", window / 60)
    } else {
        format!(
            "Per channel over the last {seconds} s (the host is younger than {} minutes)",
            window / 60
        )
    }
}

/// One table of per-channel counters.
fn counts_table(caption: &str, class: &str, channels: &[ChannelCounts]) -> Markup {
    let title = format!("{class}-title");
    html! {
        h2 id=(title) class="counts" { (caption) }
        div class="scroll" {
            table class=(class) aria-labelledby=(title) {
                thead { tr {
                    th scope="col" { "Channel" } th scope="col" { "Sent" } th scope="col" { "Delivered" }
                    th scope="col" { "Failed" } th scope="col" { "Retrying" } th scope="col" { "Held" }
                    th scope="col" { "Dead" } th scope="col" { "Cancelled" }
                } }
                tbody {
                    @for c in channels {
                        tr {
                            th scope="row" { (c.channel) }
                            td class="n" { (c.sent) } td class="n" { (c.delivered) }
                            td class="n" { (c.failed) } td class="n" { (c.retrying) }
                            td class="n" { (c.held) } td class="n" { (c.dead) }
                            td class="n" { (c.cancelled) }
                        }
                    }
                }
            }
        }
    }
}
