//! `/v1/unsubscribe/{token}`: one-click unsubscribe (RFC 8058). A mail
//! system `POST`s `List-Unsubscribe=One-Click` to the link in a message's
//! `List-Unsubscribe` header; the link's signed token names the user and
//! the category (or channel) to switch off, so no login is asked. A `GET`
//! (a person who opened the link, or a scanner fetching it) changes
//! nothing: it answers a page whose button makes that `POST`.
//!
//! The change is recorded in the user's preference history with the route
//! `unsubscribe_link` (`docs/preferences.md`).

use std::time::SystemTime;

use axum::Json;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, header};
use maud::{DOCTYPE, Markup, html};
use serde::Serialize;
use utoipa::ToSchema;

use super::AppState;
use super::model::Problem;
use super::preferences::{check_user, ledger};
use super::problem::ApiError;
use crate::ledger::preferences::{ChangeRoute, Preferences};
use crate::unsubscribe::{LinkError, Target, Unsubscribe, UnsubscribeLinks};

/// The one key/value pair of a one-click POST (RFC 8058, section 3.1).
const ONE_CLICK: (&str, &str) = ("List-Unsubscribe", "One-Click");

/// What a one-click unsubscribe switched off.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub(crate) struct UnsubscribedView {
    /// The user the link was written for.
    pub user_id: String,
    /// `category` or `channel`.
    pub kind: String,
    /// The category or channel now switched off for that user.
    pub name: String,
}

/// Switches a category (or channel) off for the user a one-click
/// unsubscribe link names; no token or login besides the link.
#[utoipa::path(
    post, path = "/v1/unsubscribe/{token}", tag = "preferences",
    params(("token" = String, Path, description = "The signed token of a `List-Unsubscribe` link")),
    request_body(content = String, content_type = "application/x-www-form-urlencoded", description = "`List-Unsubscribe=One-Click` (or the same field as multipart/form-data)"),
    responses(
        (status = 200, description = "Switched off and recorded in the user's preference history (again: unchanged)", body = UnsubscribedView),
        (status = 400, description = "Not a link of this service, or the body is not `List-Unsubscribe=One-Click`", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "The link's signature does not match (forged or altered)", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "This host writes no unsubscribe links (`[unsubscribe] secret_env` unset)", body = Problem, content_type = "application/problem+json"),
        (status = 410, description = "The link expired", body = Problem, content_type = "application/problem+json"),
        (status = 501, description = "The delivery ledger is off", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "The ledger's database unavailable; nothing changed", body = Problem, content_type = "application/problem+json"),
    ),
    security(())
)]
pub(crate) async fn post_unsubscribe(
    State(state): State<AppState>,
    Path(token): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Json<UnsubscribedView>, ApiError> {
    let found = checked_link(&state, &token)?;
    require_one_click(&headers, &body)?;
    check_user(&found.user_id)?;
    ledger(&state)?;
    let off = match &found.target {
        Target::Category(name) => Preferences::off(&[], &[name]),
        Target::Channel(name) => Preferences::off(&[name], &[]),
    };
    state
        .preferences
        .switch_off(
            &found.user_id,
            off,
            "unsubscribe link",
            ChangeRoute::UnsubscribeLink,
        )
        .await?;
    tracing::info!(kind = kind(&found.target), name = %found.target.name(), "one-click unsubscribe");
    Ok(Json(UnsubscribedView {
        user_id: found.user_id,
        kind: kind(&found.target).to_string(),
        name: found.target.name().to_string(),
    }))
}

/// A page asking to confirm the unsubscribe: a `GET` changes nothing (mail
/// scanners fetch links), its button makes the one-click `POST`.
#[utoipa::path(
    get, path = "/v1/unsubscribe/{token}", tag = "preferences",
    params(("token" = String, Path, description = "The signed token of a `List-Unsubscribe` link")),
    responses(
        (status = 200, description = "An HTML page with the button that unsubscribes", content_type = "text/html"),
        (status = 400, description = "Not a link of this service", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "The link's signature does not match", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "This host writes no unsubscribe links", body = Problem, content_type = "application/problem+json"),
        (status = 410, description = "The link expired", body = Problem, content_type = "application/problem+json"),
    ),
    security(())
)]
pub(crate) async fn get_unsubscribe(
    State(state): State<AppState>,
    Path(token): Path<String>,
) -> Result<Markup, ApiError> {
    let found = checked_link(&state, &token)?;
    let what = match &found.target {
        Target::Category(name) => format!("messages of the category “{name}”"),
        Target::Channel(name) => format!("messages on the channel “{name}”"),
    };
    Ok(html! {
        (DOCTYPE)
        html lang="en" {
            head { meta charset="utf-8"; title { "Unsubscribe" } }
            body {
                h1 { "Unsubscribe" }
                p { "Stop " (what) "?" }
                form method="post" {
                    input type="hidden" name=(ONE_CLICK.0) value=(ONE_CLICK.1);
                    button type="submit" { "Unsubscribe" }
                }
            }
        }
    })
}

/// The link's fields, if this host writes links and the token checks.
fn checked_link(state: &AppState, token: &str) -> Result<Unsubscribe, ApiError> {
    let links: &UnsubscribeLinks = state.unsubscribe.as_deref().ok_or_else(|| {
        ApiError::NotFound(
            "this host writes no unsubscribe links ([unsubscribe] secret_env is not set)".into(),
        )
    })?;
    links.verify(token, SystemTime::now()).map_err(|e| match e {
        LinkError::Malformed(_) => ApiError::BadRequest(e.to_string()),
        LinkError::Forged => ApiError::Forbidden(e.to_string()),
        LinkError::Expired { .. } => ApiError::Gone(e.to_string()),
    })
}

/// RFC 8058's body: `List-Unsubscribe=One-Click`, form-urlencoded or as a
/// multipart/form-data field.
fn require_one_click(headers: &HeaderMap, body: &[u8]) -> Result<(), ApiError> {
    let multipart = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("multipart/form-data"));
    let found = if multipart {
        multipart_has_one_click(body)
    } else {
        form_urlencoded::parse(body).any(|(k, v)| k == ONE_CLICK.0 && v == ONE_CLICK.1)
    };
    if found {
        Ok(())
    } else {
        Err(ApiError::BadRequest(format!(
            "a one-click unsubscribe is a POST whose body is `{}={}` (RFC 8058)",
            ONE_CLICK.0, ONE_CLICK.1
        )))
    }
}

/// Whether a multipart/form-data body has the field `List-Unsubscribe` with
/// the value `One-Click` (a part's headers, a blank line, its value).
fn multipart_has_one_click(body: &[u8]) -> bool {
    let text = String::from_utf8_lossy(body);
    let disposition = format!("name=\"{}\"", ONE_CLICK.0);
    text.split("\r\n\r\n")
        .zip(text.split("\r\n\r\n").skip(1))
        .any(|(head, rest)| {
            head.contains(&disposition) && rest.split("\r\n").next() == Some(ONE_CLICK.1)
        })
}

fn kind(target: &Target) -> &'static str {
    match target {
        Target::Category(_) => "category",
        Target::Channel(_) => "channel",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_one_click_body_is_read_in_both_encodings() {
        let form = HeaderMap::new();
        assert!(require_one_click(&form, b"List-Unsubscribe=One-Click").is_ok());
        assert!(require_one_click(&form, b"other=1&List-Unsubscribe=One-Click").is_ok());
        assert!(require_one_click(&form, b"").is_err());
        assert!(require_one_click(&form, b"List-Unsubscribe=Two-Clicks").is_err());
        let mut multipart = HeaderMap::new();
        multipart.insert(
            header::CONTENT_TYPE,
            "multipart/form-data; boundary=b".parse().unwrap(),
        );
        let body = b"--b\r\nContent-Disposition: form-data; name=\"List-Unsubscribe\"\r\n\r\nOne-Click\r\n--b--\r\n";
        assert!(require_one_click(&multipart, body).is_ok());
        let other =
            b"--b\r\nContent-Disposition: form-data; name=\"x\"\r\n\r\nOne-Click\r\n--b--\r\n";
        assert!(require_one_click(&multipart, other).is_err());
    }
}
