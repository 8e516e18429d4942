//! The operator console at `/console`: server-rendered HTML pages over the
//! same functions as `/admin` (no build step, no script; every value is
//! escaped by `maud`), one file per page. Sign-in takes the admin token and
//! sets a signed session cookie ([`session`]); every POST must carry the
//! session's CSRF token and, when the browser sends one, a same-origin
//! `Origin` ([`guard`]). Every console answer carries [`HEADERS`]: a
//! content security policy allowing only the console's own stylesheet and
//! forms, no framing, no MIME sniffing, no caching.

pub(crate) mod held;
pub(crate) mod keys;
pub(crate) mod login;
pub(crate) mod lookup;
pub(crate) mod overview;
pub(crate) mod policies;
pub(crate) mod preferences;
pub(crate) mod providers;
pub(crate) mod session;
pub(crate) mod task;

use std::sync::{Arc, LazyLock};
use std::time::SystemTime;

use axum::body::{Body, to_bytes};
use axum::extract::{FromRequestParts, Request, State};
use axum::http::request::Parts;
use axum::http::{Extensions, HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::{Next, from_fn_with_state};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::{Extension, Router};
use maud::{DOCTYPE, Markup, html};

use super::AppState;
use super::problem::ApiError;
use session::{Revoked, Session, Signer};

/// The console's routes (merged into the API's router).
pub(crate) fn routes(state: AppState) -> Router<AppState> {
    Router::new()
        .route(
            "/console",
            get(|| async { Redirect::to("/console/overview") }),
        )
        .route("/console/login", get(login::form).post(login::sign_in))
        .route("/console/logout", post(login::sign_out))
        .route("/console/overview", get(overview::page))
        .route("/console/held", get(held::page))
        .route("/console/providers", get(providers::page))
        .route("/console/lookup", get(lookup::page))
        .route("/console/preferences", get(preferences::page))
        .route("/console/policies", get(policies::page))
        .route("/console/policies/check", post(policies::check))
        .route("/console/policies/apply", post(policies::apply))
        .route("/console/keys", get(keys::page).post(keys::explore))
        .route("/console/tasks/{id}", get(task::page))
        .route("/console/tasks/{id}/requeue", post(task::requeue))
        .route(
            "/console/tasks/{id}/mark-delivered",
            post(task::mark_delivered),
        )
        .route("/console/tasks/{id}/give-up", post(task::give_up))
        .route("/console/tasks/{id}/cancel", post(task::cancel))
        .layer(from_fn_with_state(state, guard))
        .layer(Extension(Arc::new(Revoked::default())))
        .layer(axum::middleware::from_fn(headers))
}

/// The content security policy of console pages: nothing but the console's
/// own inline stylesheet (by its hash), forms posting to this origin, no
/// framing, no scripts.
static CSP: LazyLock<String> = LazyLock::new(|| {
    use base64::Engine;
    use sha2::Digest;
    let hash = base64::engine::general_purpose::STANDARD.encode(sha2::Sha256::digest(STYLE));
    format!(
        "default-src 'none'; style-src 'sha256-{hash}'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    )
});

/// The headers of every console answer besides the policy.
pub(crate) const HEADERS: [(&str, &str); 4] = [
    ("x-frame-options", "DENY"),
    ("x-content-type-options", "nosniff"),
    ("cache-control", "no-store"),
    ("referrer-policy", "same-origin"),
];

/// Middleware: sets [`CSP`] and [`HEADERS`] on every console answer.
async fn headers(req: Request, next: Next) -> Response {
    let mut response = next.run(req).await;
    let h = response.headers_mut();
    if let Ok(csp) = HeaderValue::from_str(&CSP) {
        h.insert(header::CONTENT_SECURITY_POLICY, csp);
    }
    for (name, value) in HEADERS {
        h.insert(name, HeaderValue::from_static(value));
    }
    response
}

/// The signed-in operator of a page; without a valid session the page
/// answers a redirect to the sign-in form.
pub(crate) struct Operator(pub Session);

impl FromRequestParts<AppState> for Operator {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Response> {
        session_of(&parts.headers, &parts.extensions, state)
            .map(Operator)
            .ok_or_else(|| Redirect::to("/console/login").into_response())
    }
}

/// The session of a request's cookie, if it verifies and was not signed out.
fn session_of(headers: &HeaderMap, extensions: &Extensions, state: &AppState) -> Option<Session> {
    let signer = Signer::new(&state.admin_token)?;
    let session = signer.verify(&session::cookie(headers)?, SystemTime::now())?;
    let revoked = extensions
        .get::<Arc<Revoked>>()
        .is_some_and(|r| r.is_revoked(&session));
    (!revoked).then_some(session)
}

/// Middleware of every console route: a POST must come from this origin
/// (when the browser says where it comes from) and, except the sign-in
/// form, carry the session's CSRF token in its `csrf` field. Refused: 403.
async fn guard(State(state): State<AppState>, req: Request, next: Next) -> Response {
    if req.method() != Method::POST {
        return next.run(req).await;
    }
    if !same_origin(req.headers()) {
        return refused("cross-origin POST refused");
    }
    if req.uri().path() == "/console/login" {
        return next.run(req).await;
    }
    let Some(session) = session_of(req.headers(), req.extensions(), &state) else {
        return Redirect::to("/console/login").into_response();
    };
    let (parts, body) = req.into_parts();
    let Ok(bytes) = to_bytes(body, state.limits.body_bytes).await else {
        return refused("form too large");
    };
    let presented = form_urlencoded::parse(&bytes)
        .find(|(k, _)| k == "csrf")
        .map(|(_, v)| v.into_owned())
        .unwrap_or_default();
    if !session::csrf_matches(&session, &presented) {
        return refused("missing or wrong CSRF token: reload the page and try again");
    }
    next.run(Request::from_parts(parts, Body::from(bytes)))
        .await
}

/// False when `Origin` names another host than `Host` (no `Origin`: true;
/// SameSite=Strict and the CSRF token still apply).
fn same_origin(headers: &HeaderMap) -> bool {
    let Some(origin) = headers.get(header::ORIGIN).and_then(|v| v.to_str().ok()) else {
        return true;
    };
    let host = headers.get(header::HOST).and_then(|v| v.to_str().ok());
    let origin_host = origin.split_once("://").map(|(_, rest)| rest);
    matches!((origin_host, host), (Some(o), Some(h)) if o.eq_ignore_ascii_case(h))
}

fn refused(why: &str) -> Response {
    let body = layout("Refused", None, html! { p role="alert" { (why) } });
    (StatusCode::FORBIDDEN, body).into_response()
}

/// An admin function's refusal as a page: its status and its words.
pub(crate) fn error_page(session: &Session, err: ApiError) -> Response {
    let status = err.status();
    let body = layout(
        "Not done",
        Some(session),
        html! {
            h1 { "Not done" }
            p role="alert" class="error" { (err.to_string()) }
            p { a href="/console/held" { "Back to held tasks" } }
        },
    );
    (status, body).into_response()
}

/// The page frame: title, navigation (when signed in), styles.
pub(crate) fn layout(title: &str, session: Option<&Session>, content: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · pushonce console" }
                style { (maud::PreEscaped(STYLE)) }
            }
            body {
                a class="skip" href="#main" { "Skip to content" }
                @if let Some(session) = session {
                    header {
                        nav aria-label="Console" {
                            a href="/console/overview" { "Overview" }
                            a href="/console/held" { "Held tasks" }
                            a href="/console/providers" { "Providers" }
                            a href="/console/lookup" { "Look-up" }
                            a href="/console/preferences" { "Preferences" }
                            a href="/console/policies" { "Policies" }
                            a href="/console/keys" { "Key explorer" }
                        }
                        form method="post" action="/console/logout" class="logout" {
                            (csrf_field(session))
                            span { "Signed in as " strong { (session.by) } }
                            button type="submit" { "Sign out" }
                        }
                    }
                }
                main id="main" { (content) }
            }
        }
    }
}

/// The hidden CSRF field every console form carries.
pub(crate) fn csrf_field(session: &Session) -> Markup {
    html! { input type="hidden" name="csrf" value=(session.csrf); }
}

/// A time in ms since the epoch as RFC 3339 (UTC, seconds).
pub(crate) fn when(ms: u64) -> String {
    let t = SystemTime::UNIX_EPOCH + std::time::Duration::from_millis(ms);
    humantime::format_rfc3339_seconds(t).to_string()
}

const STYLE: &str = include_str!("console.css");
