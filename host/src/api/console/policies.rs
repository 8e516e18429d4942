//! `/console/policies`: the policies in force with their versions and the
//! plugins with their load errors (`GET /admin/policies`,
//! `GET /admin/plugins`); a pasted candidate policy checked and diffed over
//! sampled real events ([`candidate::plan`]), then applied on an explicit
//! POST ([`candidate::apply`]: written into the policy directory, then the
//! reload of `POST /admin/reload`).

use axum::Form;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use maud::{Markup, html};
use serde::Deserialize;

use super::session::Session;
use super::{Operator, csrf_field, layout, when};
use crate::api::AppState;
use crate::api::admin::{PluginsView, PoliciesView, plugins, policies};
use crate::api::log::escaped;
use crate::corpus::{CORPUS_CHECK_LEN, recent_events};
use crate::event::Event;
use crate::route::candidate::{self, Planned};

/// Changed keys shown as examples.
const EXAMPLES: usize = 20;

/// The candidate form's fields (the CSRF token is checked by the guard).
#[derive(Debug, Deserialize)]
pub(crate) struct CandidateForm {
    /// The policy file's text.
    #[serde(default)]
    pub policy: String,
}

/// `?applied=` after an apply: the generation the reload put in force.
#[derive(Debug, Deserialize)]
pub(crate) struct AppliedQuery {
    /// The generation in force after the apply.
    pub applied: Option<u64>,
}

/// The page: policies, plugins and an empty candidate form.
pub(crate) async fn page(
    State(state): State<AppState>,
    Operator(session): Operator,
    Query(done): Query<AppliedQuery>,
) -> Response {
    let flash = done.applied.map(|g| {
        html! { p class="ok" role="status" { "Applied: the reload put generation " (g) " in force." } }
    });
    render(&state, &session, "", flash.unwrap_or_default())
        .await
        .into_response()
}

/// Checks and diffs the pasted policy; shows the result and, when it
/// checks, the apply button.
pub(crate) async fn check(
    State(state): State<AppState>,
    Operator(session): Operator,
    Form(form): Form<CandidateForm>,
) -> Response {
    let events = sampled_events(&state).await;
    let sampled = events.len();
    let (current, config, text) = (
        state.live.current(),
        state.live.config().clone(),
        form.policy.clone(),
    );
    let planned = tokio::task::spawn_blocking(move || {
        candidate::plan(&current, &config, &text, &events, EXAMPLES)
    })
    .await
    .unwrap_or_else(|e| Err(vec![format!("the check failed: {e}")]));
    let result = match &planned {
        Ok(plan) => planned_view(&session, plan, sampled, &form.policy),
        Err(errors) => refused_view("The policy does not check; nothing was written.", errors),
    };
    let status = match planned {
        Ok(_) => StatusCode::OK,
        Err(_) => StatusCode::UNPROCESSABLE_ENTITY,
    };
    (status, render(&state, &session, &form.policy, result).await).into_response()
}

/// Writes the pasted policy and reloads; refused, the page says why.
pub(crate) async fn apply(
    State(state): State<AppState>,
    Operator(session): Operator,
    Form(form): Form<CandidateForm>,
) -> Response {
    match candidate::apply(&state.live, &state.reload, &form.policy).await {
        Ok(applied) => {
            tracing::info!(by = %escaped(&session.by), file = %escaped(&applied.target.display().to_string()), "policy applied");
            Redirect::to(&format!("/console/policies?applied={}", applied.generation))
                .into_response()
        }
        Err(e) => {
            let lines: Vec<String> = e
                .to_string()
                .lines()
                .map(|l| l.trim().to_string())
                .collect();
            let result = refused_view("Not applied.", &lines);
            let page = render(&state, &session, &form.policy, result).await;
            (StatusCode::UNPROCESSABLE_ENTITY, page).into_response()
        }
    }
}

/// The recent real events a diff derives keys for (none if Redis cannot tell).
async fn sampled_events(state: &AppState) -> Vec<Event> {
    let mut conn = state.permits.connection();
    let namespace = state.permits.layout().namespace();
    recent_events(&mut conn, namespace, CORPUS_CHECK_LEN)
        .await
        .unwrap_or_else(|e| {
            tracing::warn!(error = %e, "could not read the event corpus; diffing over none");
            Vec::new()
        })
}

async fn render(state: &AppState, session: &Session, text: &str, result: Markup) -> Markup {
    let policies = policies(State(state.clone())).await.0;
    let plugins = plugins(State(state.clone())).await.0;
    let body = html! {
        h1 { "Policies and plugins" }
        (result)
        (candidate_form(session, text))
        (policies_view(&policies))
        (plugins_view(&plugins))
    };
    layout("Policies", Some(session), body)
}

fn candidate_form(session: &Session, text: &str) -> Markup {
    html! {
        section aria-labelledby="candidate-title" {
            h2 id="candidate-title" { "Try a policy file" }
            p { "Paste a policy file: it is checked as the loader checks it (with the other files of the policy directory, "
                "the plugins in force and this host's channels) and the keys of recent real events are compared. "
                "Nothing is written until you apply it." }
            form method="post" action="/console/policies/check" {
                (csrf_field(session))
                label for="policy" { "Policy file (TOML)" }
                textarea id="policy" name="policy" rows="12" cols="70" spellcheck="false" required { (text) }
                p { button type="submit" id="check-policy" { "Check and diff" } }
            }
        }
    }
}

fn refused_view(title: &str, errors: &[String]) -> Markup {
    html! {
        section class="confirm" role="alert" aria-labelledby="refused-title" {
            h2 id="refused-title" class="error" { (title) }
            ul class="refusal" { @for e in errors { li { (e) } } }
        }
    }
}

fn planned_view(session: &Session, plan: &Planned, sampled: usize, text: &str) -> Markup {
    let d = &plan.diff;
    html! {
        section class="plan" aria-labelledby="plan-title" {
            h2 id="plan-title" class="ok" { "The policy checks" }
            dl {
                dt { "Business type" } dd { (plan.biz_type) }
                dt { "Key policy" } dd { (plan.key_policy) }
                dt { "File" } dd { code { (plan.target.display()) } " " (if plan.replaces { "(replaces it)" } else { "(new)" }) }
                dt { "Keys" } dd class="diff-summary" { (d.summary()) " (of " (sampled) " recent events)" }
            }
            @if !d.examples.is_empty() {
                div class="scroll" { table class="diff" {
                    caption { "Keys that change" }
                    thead { tr { th scope="col" { "Event" } th scope="col" { "Channel" } th scope="col" { "Key now" } th scope="col" { "Key after" } } }
                    tbody { @for [event, channel, old, new] in &d.examples {
                        tr { td { (event) } td { (channel) } td { code { (old) } } td { code { (new) } } }
                    } }
                } }
            }
            @if !d.errors.is_empty() {
                details { summary { "Events without keys (" (d.errors.len()) ")" }
                    ul { @for e in &d.errors { li { (e) } } } }
            }
            form method="post" action="/console/policies/apply" {
                (csrf_field(session))
                input type="hidden" name="policy" value=(text);
                p {
                    button type="submit" id="apply-policy" { "Apply: write " (plan.target.display()) " and reload" }
                }
            }
        }
    }
}

fn policies_view(p: &PoliciesView) -> Markup {
    html! {
        section aria-labelledby="policies-title" {
            h2 id="policies-title" { "Policies in force" }
            p { "Generation " (p.generation) ", loaded " (when(p.loaded_at_ms)) "." }
            @if let Some(r) = &p.last_refused {
                @if r.at_ms >= p.loaded_at_ms {
                    p class="error" role="alert" { "The last reload was refused at " (when(r.at_ms)) "; this set stays in force:" }
                    ul { @for e in &r.errors { li { (e) } } }
                }
            }
            div class="scroll" { table class="policies" {
                thead { tr {
                    th scope="col" { "Business type" } th scope="col" { "Key policy" } th scope="col" { "Channels" }
                    th scope="col" { "Window" } th scope="col" { "Attempts" } th scope="col" { "File" }
                } }
                tbody { @for policy in &p.policies {
                    tr {
                        th scope="row" { (policy.biz_type) }
                        td { (policy.key_policy) " → " (policy.key_policy_version) }
                        td { (policy.channels.join(", ")) }
                        td { (humantime::format_duration(std::time::Duration::from_millis(policy.window_ms))) }
                        td class="n" { (policy.retry.max_attempts) }
                        td { code { (policy.file) } }
                    }
                } }
            } }
        }
    }
}

fn plugins_view(p: &PluginsView) -> Markup {
    html! {
        section aria-labelledby="plugins-title" {
            h2 id="plugins-title" { "Plugins" }
            div class="scroll" { table class="plugins" {
                thead { tr {
                    th scope="col" { "Plugin" } th scope="col" { "Kind" } th scope="col" { "Description" }
                    th scope="col" { "Calls" } th scope="col" { "Refusals" } th scope="col" { "Failures" }
                } }
                tbody { @for plugin in &p.plugins {
                    tr {
                        th scope="row" { (plugin.id) }
                        td { (plugin.world) }
                        td { (plugin.description) }
                        td class="n" { (count(plugin.calls)) }
                        td class="n" { (count(plugin.refusals)) }
                        td class="n" { (count(plugin.failures)) }
                    }
                } }
            } }
            @if p.refused.is_empty() {
                p { "No plugin file was refused at the last load." }
            } @else {
                h3 class="error" { "Plugin files refused at the last load" }
                ul role="alert" { @for r in &p.refused { li { (r) } } }
            }
        }
    }
}

fn count(n: Option<u64>) -> String {
    n.map(|n| n.to_string()).unwrap_or_else(|| "—".into())
}
