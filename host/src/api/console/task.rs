//! `/console/tasks/{id}`: one task with its evidence, its audit and the
//! operator's actions — requeue (with the explicit confirmation the API's
//! `force` stands for), mark delivered, give up — all through the admin
//! API's own functions, recorded on the task with who, when and why — and
//! cancel, for a task whose first attempt has not begun (a digest with all
//! its events). A digest task lists the events it gathered.

use axum::Form;
use axum::extract::{Path, Query, State};
use axum::response::{IntoResponse, Redirect, Response};
use maud::{Markup, html};
use serde::Deserialize;

use super::session::Session;
use super::{Operator, csrf_field, error_page, layout, when};
use crate::api::admin::tasks::{operator_note, requeue_answer, settle_task};
use crate::api::model::TaskView;
use crate::api::{AppState, cancel, events};
use crate::permit::{Cancel, Requeue, Settle};

/// `?done=` after an action.
#[derive(Debug, Deserialize)]
pub(crate) struct Done {
    /// `requeued`, `delivered`, `given_up` or `cancelled`.
    pub done: Option<String>,
}

/// The fields of an action's form (the CSRF token is checked by the guard).
#[derive(Debug, Deserialize)]
pub(crate) struct ActionForm {
    /// Why, in the operator's words (recorded on the task).
    #[serde(default)]
    pub why: String,
    /// `yes` once the operator confirmed a requeue that may send twice.
    pub force: Option<String>,
}

/// The task page.
pub(crate) async fn page(
    State(state): State<AppState>,
    Operator(session): Operator,
    Path(id): Path<String>,
    Query(done): Query<Done>,
) -> Response {
    let task = match events::task(State(state), Path(id)).await {
        Ok(task) => task.0,
        Err(e) => return error_page(&session, e),
    };
    let flash = match done.done.as_deref() {
        Some("requeued") => Some("Requeued: it will be sent again."),
        Some("delivered") => Some("Marked delivered: settled without a send."),
        Some("given_up") => Some("Given up: nobody will send it."),
        Some("cancelled") => Some("Cancelled: it will never be sent."),
        Some("too_late") => Some("Too late to cancel: its first attempt had begun."),
        _ => None,
    };
    let body = html! {
        @if let Some(flash) = flash { p class="ok" role="status" { (flash) } }
        (card(&session, &task))
    };
    layout(&format!("Task {}", task.id), Some(&session), body).into_response()
}

/// Requeue; when the message may already be at the provider, first the
/// confirmation page, then (with `force=yes`) the forced requeue.
pub(crate) async fn requeue(
    State(state): State<AppState>,
    Operator(session): Operator,
    Path(id): Path<String>,
    Form(form): Form<ActionForm>,
) -> Response {
    let note = match operator_note(Some(session.by.clone()), form.why.clone()) {
        Ok(note) => note,
        Err(e) => return error_page(&session, e),
    };
    let force = form.force.as_deref() == Some("yes");
    let answer = match state.permits.requeue_by(&id, force, &note).await {
        Ok(answer) => answer,
        Err(e) => return error_page(&session, e.into()),
    };
    if answer == Requeue::MaybeSent {
        return confirm(&session, &id, &form.why);
    }
    match requeue_answer(&id, answer, &note) {
        Ok(_) => done(&id, "requeued"),
        Err(e) => error_page(&session, e),
    }
}

/// Mark delivered without a send.
pub(crate) async fn mark_delivered(
    state: State<AppState>,
    operator: Operator,
    id: Path<String>,
    form: Form<ActionForm>,
) -> Response {
    settle(state, operator, id, form, Settle::Delivered).await
}

/// Give up.
pub(crate) async fn give_up(
    state: State<AppState>,
    operator: Operator,
    id: Path<String>,
    form: Form<ActionForm>,
) -> Response {
    settle(state, operator, id, form, Settle::GivenUp).await
}

async fn settle(
    State(state): State<AppState>,
    Operator(session): Operator,
    Path(id): Path<String>,
    Form(form): Form<ActionForm>,
    how: Settle,
) -> Response {
    let note = match operator_note(Some(session.by.clone()), form.why) {
        Ok(note) => note,
        Err(e) => return error_page(&session, e),
    };
    match settle_task(&state, &id, how, &note).await {
        Ok(_) => done(&id, how.as_str()),
        Err(e) => error_page(&session, e),
    }
}

/// Cancel a task whose first attempt has not begun (a digest task with
/// every event it holds); its permit stays for the window.
pub(crate) async fn cancel(
    State(state): State<AppState>,
    Operator(session): Operator,
    Path(id): Path<String>,
) -> Response {
    let task = match state.permits.task(&id).await {
        Ok(Some(task)) => task,
        Ok(None) => {
            return error_page(
                &session,
                crate::api::ApiError::NotFound(format!("no task {id}")),
            );
        }
        Err(e) => return error_page(&session, e.into()),
    };
    // No business id: the whole task, not one event of a digest.
    match cancel::cancel_task(&state, &task, "", false, &session.by).await {
        Ok(Cancel::Cancelled(_)) => done(&id, "cancelled"),
        Ok(_) => done(&id, "too_late"),
        Err(e) => error_page(&session, e),
    }
}

fn done(id: &str, what: &str) -> Response {
    let id: String =
        percent_encoding::utf8_percent_encode(id, percent_encoding::NON_ALPHANUMERIC).to_string();
    Redirect::to(&format!("/console/tasks/{id}?done={what}")).into_response()
}

/// The explicit confirmation of a requeue that may send the message twice.
fn confirm(session: &Session, id: &str, why: &str) -> Response {
    let body = html! {
        section class="confirm" aria-labelledby="confirm-title" {
            h1 id="confirm-title" { "The message may already be at the provider — send anyway?" }
            p {
                "An attempt of task " code { (id) } "'s outcome was unknown and nothing could settle it: "
                "the provider may have the message, and sending again may deliver it twice. "
                "Check with the provider or the user first; if it arrived, mark it delivered instead."
            }
            form method="post" action={ "/console/tasks/" (id) "/requeue" } {
                (csrf_field(session))
                input type="hidden" name="force" value="yes";
                label for="why-confirm" { "Why (recorded on the task)" }
                textarea id="why-confirm" name="why" rows="2" cols="50" { (why) }
                p {
                    button type="submit" id="send-anyway" { "Send anyway" }
                    " "
                    a href={ "/console/tasks/" (id) } { "Cancel" }
                }
            }
        }
    };
    layout("Send anyway?", Some(session), body).into_response()
}

/// One task: what it is, why it is held, what was tried, what operators
/// did, and the actions.
pub(crate) fn card(session: &Session, task: &TaskView) -> Markup {
    html! {
        article class="task" id={ "task-" (task.id) } {
            h2 { a href={ "/console/tasks/" (task.id) } { "Task " (task.id) } }
            dl {
                dt { "Status" } dd class="status" { (task.status) }
                dt { "Channel" } dd { (task.channel) }
                dt { "Event" } dd { (task.biz_type) " / " (task.biz_id) }
                dt { "Key" } dd { code { (task.key) } }
                dt { "Attempts" } dd { (task.attempts) " of " (task.max_attempts) }
                @if let Some(cause) = &task.held_cause {
                    dt { "Held because" } dd class="cause" { (cause.kind) ": " (cause.explanation) }
                }
                @if let Some(answer) = &task.provider_answer {
                    dt { "Provider's answer" } dd { code { (answer) } }
                }
                @if let Some(error) = &task.last_error {
                    dt { "Last error" } dd { (error) }
                }
                @if task.maybe_sent && !task.ever_sent {
                    dt { "Warning" } dd class="warn" { "the message may already be at the provider" }
                }
                @if let Some(digest) = &task.digest {
                    dt { "Digest" } dd class="digest" { (digest.count) " events" }
                }
            }
            @if let Some(digest) = &task.digest {
                div class="scroll" { table class="digest-items" {
                    caption { "Events in this digest (the first " (digest.items.len()) ", in the order they joined)" }
                    thead { tr { th { "Business id" } th { "Parameters" } } }
                    tbody { @for item in &digest.items {
                        tr {
                            td { (item["biz_id"].as_str().unwrap_or_default()) }
                            td { code { (item["params"]) } }
                        }
                    } }
                } }
            }
            @if !task.reconcile_log.is_empty() {
                details {
                    summary { "Reconciler's checks (" (task.reconcile_log.len()) ")" }
                    div class="scroll" { table {
                        thead { tr { th { "When" } th { "Asked" } th { "Answer" } th { "Did" } } }
                        tbody { @for s in &task.reconcile_log {
                            tr { td { (when(s.at)) } td { (s.asked) } td { (s.answer) " " (s.detail) } td { (s.action) } }
                        } }
                    } }
                }
            }
            @if !task.operator_log.is_empty() {
                div class="scroll" { table class="audit" {
                    caption { "Operator actions" }
                    thead { tr { th { "When" } th { "Who" } th { "Action" } th { "Why" } } }
                    tbody { @for s in &task.operator_log {
                        tr { td { (when(s.at)) } td { (s.by) } td { (s.action) } td { (s.why) } }
                    } }
                } }
            }
            (actions(session, task))
        }
    }
}

fn actions(session: &Session, task: &TaskView) -> Markup {
    let status = task.status.as_str();
    let requeueable = matches!(status, "failed" | "dead" | "unknown");
    let settleable = matches!(status, "unknown" | "failed" | "dead");
    let deliverable = settleable || status == "sent";
    let cancellable = status == "queued" && task.attempts == 0;
    html! {
        @if requeueable || deliverable || cancellable {
            div class="actions" {
                @if cancellable {
                    form method="post" action={ "/console/tasks/" (task.id) "/cancel" } {
                        (csrf_field(session))
                        button type="submit" class="cancel" { "Cancel before it is sent" }
                    }
                }
                @if requeueable { (action(session, task, "requeue", "Requeue", "Why send it again")) }
                @if deliverable { (action(session, task, "mark-delivered", "Mark delivered", "How you know it arrived")) }
                @if settleable { (action(session, task, "give-up", "Give up", "Why nobody will send it")) }
            }
        }
    }
}

fn action(session: &Session, task: &TaskView, path: &str, label: &str, why: &str) -> Markup {
    let field = format!("why-{path}-{}", task.id);
    html! {
        form method="post" action={ "/console/tasks/" (task.id) "/" (path) } {
            (csrf_field(session))
            label for=(field) { (why) }
            input type="text" id=(field) name="why" required[path != "requeue"];
            button type="submit" class=(path) { (label) }
        }
    }
}
