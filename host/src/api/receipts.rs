//! `POST /v1/receipts/{channel}`: provider delivery callbacks.
//!
//! The route and its authentication (a shared secret per channel, from the
//! environment variable named by `receipt_secret_env`) live here; what a
//! callback means is the channel plugin's `parse-callback`, reached through
//! [`ReceiptHandler`] — a seam with plain types (no HTTP types); the host's
//! handler (in `service`) hands the body to the channel plugin and settles
//! the tasks. Without a handler the route answers 501.

use std::sync::Arc;

use axum::Json;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use serde::Serialize;
use utoipa::ToSchema;

use super::AppState;
use super::problem::{ApiError, Problem};
use crate::send::BoxFuture;

/// Handles one provider callback of a channel: parse it (the channel
/// plugin's `parse-callback`) and settle the tasks it names. Returns how
/// many tasks were settled, or why not.
pub trait ReceiptHandler: Send + Sync {
    /// `channel` is a configured channel; `headers` are lower-cased names
    /// with their (lossily decoded) values; `body` is the raw body.
    fn handle<'a>(
        &'a self,
        channel: &'a str,
        headers: Vec<(String, String)>,
        body: Vec<u8>,
    ) -> BoxFuture<'a, Result<usize, ReceiptRefusal>>;
}

/// Why a callback was not applied.
#[derive(Debug)]
pub enum ReceiptRefusal {
    /// The callback itself is wrong (answered 422: resending it will not help).
    Refused(String),
    /// Redis failed: answered 503 (or 500), so the provider sends it again;
    /// applying a callback twice is safe.
    Unavailable(crate::permit::PermitError),
    /// Some entries confirm sends not recorded yet (the receipt overtook the
    /// dispatcher): answered 503 with `Retry-After`, the rest was applied.
    NotYet(String),
}

/// A shared handler.
pub type SharedReceiptHandler = Arc<dyn ReceiptHandler>;

/// The answer to a receipt.
#[derive(Debug, Serialize, ToSchema)]
pub struct ReceiptAnswer {
    /// Tasks settled by this callback.
    pub settled: usize,
}

/// A provider's delivery callback.
#[utoipa::path(post, path = "/v1/receipts/{channel}", tag = "receipts",
    params(("channel" = String, Path, description = "Channel instance, e.g. `sms`")),
    request_body(content = Vec<u8>, description = "The provider's callback, as it sends it", content_type = "application/octet-stream"),
    responses(
        (status = 200, description = "Parsed and applied", body = ReceiptAnswer),
        (status = 401, description = "Missing or wrong channel secret", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such channel", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "Body too large", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "The plugin refused the callback", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Redis unavailable, or the callback names a send not recorded yet: send it again (applying it twice is safe)", body = Problem, content_type = "application/problem+json"),
    ),
    security(("receipt_secret" = [])))]
pub async fn receipt(
    State(state): State<AppState>,
    Path(channel): Path<String>,
    headers: HeaderMap,
    body: Result<Bytes, axum::extract::rejection::BytesRejection>,
) -> Result<Json<ReceiptAnswer>, ApiError> {
    let Some(token) = state.receipt_tokens.get(&channel) else {
        return Err(ApiError::NotFound(format!(
            "no channel `{}` on this host",
            channel.chars().take(64).collect::<String>()
        )));
    };
    token.check(&headers)?;
    let body = body.map_err(|e| {
        if e.status() == axum::http::StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::TooLarge {
                limit: state.limits.body_bytes,
            }
        } else {
            ApiError::BadJson(format!("could not read the body: {e}"))
        }
    })?;
    let Some(handler) = &state.receipts else {
        return Err(ApiError::NotImplemented(format!(
            "channel plugin does not parse callbacks yet (channel `{channel}`)"
        )));
    };
    let headers: Vec<(String, String)> = headers
        .iter()
        .filter(|(name, _)| *name != axum::http::header::AUTHORIZATION)
        .map(|(k, v)| {
            (
                k.as_str().to_string(),
                String::from_utf8_lossy(v.as_bytes()).into_owned(),
            )
        })
        .collect();
    match handler.handle(&channel, headers, body.to_vec()).await {
        Ok(settled) => Ok(Json(ReceiptAnswer { settled })),
        Err(ReceiptRefusal::Refused(reason)) => Err(ApiError::invalid("body", reason)),
        Err(ReceiptRefusal::Unavailable(e)) => Err(ApiError::from(e)),
        Err(ReceiptRefusal::NotYet(detail)) => Err(ApiError::Unavailable {
            detail,
            accepted: None,
        }),
    }
}
