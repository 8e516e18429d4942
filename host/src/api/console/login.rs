//! `/console/login` and `/console/logout`: sign in with the admin token and
//! a name (recorded with every action), sign out.

use std::time::SystemTime;

use std::sync::Arc;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use axum::{Extension, Form};
use maud::{Markup, html};
use serde::Deserialize;

use super::session::{self, Signer};
use super::{layout, session_of};
use crate::api::AppState;
use crate::api::guard::Failures;
use crate::api::log::escaped;
use crate::listener::Client;

/// The sign-in form's fields.
#[derive(Debug, Deserialize)]
pub struct SignIn {
    /// Who signs in (recorded with every action).
    pub name: String,
    /// The admin token.
    pub token: String,
}

/// The sign-in form (or, signed in already, the overview).
pub async fn form(State(state): State<AppState>, headers: HeaderMap) -> Response {
    if session_of(&headers, &state).is_some() {
        return Redirect::to("/console/overview").into_response();
    }
    page(StatusCode::OK, None, state.admin_token.is_open())
}

/// Checks the token; sets the session cookie and goes to the overview.
pub async fn sign_in(
    State(state): State<AppState>,
    Extension(failures): Extension<Arc<Failures>>,
    client: Option<Extension<Client>>,
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
    let cookie = session::set_cookie(&signer.issue(name, SystemTime::now()));
    (
        [(header::SET_COOKIE, cookie)],
        Redirect::to("/console/overview"),
    )
        .into_response()
}

/// Clears the session cookie (the CSRF guard checked the form).
pub(crate) async fn sign_out() -> Response {
    (
        [(header::SET_COOKIE, session::clear_cookie())],
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
