//! `/console/login` and `/console/logout`: sign in with the admin token and
//! a name (recorded with every action), sign out.

use std::time::SystemTime;

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use axum::{Extension, Form};
use maud::{Markup, html};
use serde::Deserialize;

use super::session::{self, Revoked, Signer};
use super::{Operator, layout, session_of};
use crate::api::AppState;
use crate::api::guard::Client;
use crate::api::guard::Failures;
use crate::api::log::escaped;

/// The sign-in form's fields.
#[derive(Debug, Deserialize)]
pub(crate) struct SignIn {
    /// Who signs in (recorded with every action).
    pub name: String,
    /// The admin token.
    pub token: String,
}

/// The sign-in form (or, signed in already, the overview).
pub(crate) async fn form(State(state): State<AppState>, req: Request) -> Response {
    if session_of(req.headers(), req.extensions(), &state).is_some() {
        return Redirect::to("/console/overview").into_response();
    }
    page(StatusCode::OK, None, state.admin_token.is_open())
}

/// Checks the token; sets the session cookie and goes to the overview.
pub(crate) async fn sign_in(
    State(state): State<AppState>,
    Extension(failures): Extension<Arc<Failures>>,
    client: Option<Extension<Client>>,
    headers: HeaderMap,
    Form(form): Form<SignIn>,
) -> Response {
    let Some(signer) = Signer::new(&state.admin_token) else {
        return page(StatusCode::FORBIDDEN, None, true);
    };
    let client = client.map(|Extension(c)| c.peer.ip());
    if let Err(e) = failures.check(client) {
        return e.into_response();
    }
    let name = form.name.trim();
    if name.is_empty() || name.len() > 200 {
        return page(
            StatusCode::UNPROCESSABLE_ENTITY,
            Some("Give your name (1 to 200 characters): every action is recorded with it."),
            false,
        );
    }
    if !state.admin_token.matches(form.token.trim()) {
        failures.failed(client);
        let client = client.map_or_else(|| "unknown".to_string(), |ip| ip.to_string());
        tracing::warn!(%client, by = %escaped(name), "console sign-in refused: wrong admin token");
        return page(StatusCode::UNAUTHORIZED, Some("Wrong admin token."), false);
    }
    let client = client.map_or_else(|| "unknown".to_string(), |ip| ip.to_string());
    tracing::info!(%client, by = %escaped(name), "console sign-in");
    let value = signer.issue(name, SystemTime::now());
    let cookie = session::set_cookie(&value, session::over_https(&headers));
    (
        [(header::SET_COOKIE, cookie)],
        Redirect::to("/console/overview"),
    )
        .into_response()
}

/// Ends the session on this host and clears its cookie (the CSRF guard
/// checked the form).
pub(crate) async fn sign_out(
    Operator(session): Operator,
    Extension(revoked): Extension<Arc<Revoked>>,
    headers: HeaderMap,
) -> Response {
    revoked.revoke(&session);
    tracing::info!(by = %escaped(&session.by), "console sign-out");
    (
        [(
            header::SET_COOKIE,
            session::clear_cookie(session::over_https(&headers)),
        )],
        Redirect::to("/console/login"),
    )
        .into_response()
}

fn page(status: StatusCode, error: Option<&str>, open: bool) -> Response {
    let body: Markup = html! {
        h1 { "Sign in to the pushonce console" }
        @if open {
            p class="error" role="alert" {
                "The console needs an admin token: set auth.admin_token_env and restart the host."
            }
        } @else {
            @if let Some(error) = error {
                p class="error" role="alert" { (error) }
            }
            form method="post" action="/console/login" {
                label for="name" { "Your name (recorded with every action)" }
                input type="text" id="name" name="name" required autocomplete="username";
                label for="token" { "Admin token" }
                input type="password" id="token" name="token" required autocomplete="current-password";
                p { button type="submit" { "Sign in" } }
            }
        }
    };
    (status, layout("Sign in", None, body)).into_response()
}
