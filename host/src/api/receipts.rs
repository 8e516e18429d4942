//! `GET`/`POST /v1/receipts/{channel}/{token}[/{rest}]`: providers' delivery
//! callbacks (and URL checks such as WeChat's `echostr`), and the users'
//! replies some providers push there (Aliyun's SmsUp: opt-outs).
//!
//! Closed by default: a channel is served only when it has a path token
//! (`callback_token_env`: the provider calls the URL with the token in it,
//! since real providers send no bearer token) or the operator opened it
//! (`open_callbacks = true`: `/v1/receipts/{channel}[/{rest}]`). A wrong
//! token, a closed channel and an unknown one all answer the same 404, so
//! the route does not reveal which channels exist. Tokens are compared in
//! constant time (digests) and never logged or echoed.
//!
//! What a callback means is the channel plugin's `handle-callback`, reached
//! through [`ReceiptHandler`] — a seam with plain types; its reply goes back
//! to the provider as the plugin said (status, a safe set of headers, body).

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::AppState;
use super::problem::ApiError;
use crate::send::BoxFuture;

/// A provider's request to a channel's callback URL, as it arrived.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProviderRequest {
    /// `GET`, `POST`, ...
    pub method: String,
    /// The path after the channel's callback prefix (token excluded), often empty.
    pub path: String,
    /// The raw query string, without `?`.
    pub query: String,
    /// Lower-case header names and their (lossily decoded) values.
    pub headers: Vec<(String, String)>,
    /// The body.
    pub body: Vec<u8>,
}

/// The answer the provider expects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProviderReply {
    /// Status code.
    pub status: u16,
    /// Headers (only [`REPLY_HEADERS`] are passed on).
    pub headers: Vec<(String, String)>,
    /// Body.
    pub body: Vec<u8>,
}

/// Headers a plugin's reply may set; others are dropped (a plugin cannot
/// set cookies, CORS or caching rules on the host's origin).
pub(crate) const REPLY_HEADERS: &[&str] = &["content-type", "retry-after"];

/// Handles one provider callback of a channel: the plugin verifies it and
/// names what it settles, the host settles, and the plugin's reply is
/// returned.
pub trait ReceiptHandler: Send + Sync {
    /// `channel` is a configured channel whose callbacks are open to this request.
    fn handle<'a>(
        &'a self,
        channel: &'a str,
        req: ProviderRequest,
    ) -> BoxFuture<'a, Result<ProviderReply, ReceiptRefusal>>;
}

/// Why a callback was not applied.
#[derive(Debug)]
pub enum ReceiptRefusal {
    /// The signature or token does not verify (403); nothing settled.
    Forbidden(String),
    /// Not a request the provider sends (400); nothing settled.
    Malformed(String),
    /// The plugin failed on it (500); the provider sends it again.
    Failed(String),
    /// Redis failed: answered 503, so the provider sends it again; applying
    /// a callback twice is safe.
    Unavailable(crate::permit::PermitError),
    /// Some entries confirm sends not recorded yet: answered 503 with
    /// `Retry-After`, the rest was applied.
    NotYet(String),
    /// The callback's opt-outs could not be stored (the ledger's database
    /// did not answer): 503, so the provider pushes again.
    OptOutsUnstored(String),
}

/// A shared handler.
pub type SharedReceiptHandler = Arc<dyn ReceiptHandler>;

/// How a channel's callbacks are reached.
#[derive(Clone)]
pub enum CallbackGate {
    /// Only with this path token (its SHA-256 digest).
    Token([u8; 32]),
    /// Without a token (`open_callbacks = true`).
    Open,
}

impl std::fmt::Debug for CallbackGate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            CallbackGate::Token(_) => "CallbackGate::Token",
            CallbackGate::Open => "CallbackGate::Open",
        })
    }
}

impl CallbackGate {
    /// A gate for path token `token`.
    pub fn token(token: &str) -> CallbackGate {
        CallbackGate::Token(Sha256::digest(token.as_bytes()).into())
    }
}

/// The served channels and their gates (a channel absent is closed).
pub(crate) type CallbackGates = Arc<BTreeMap<String, CallbackGate>>;

/// A provider callback to an open channel (`open_callbacks = true`).
#[utoipa::path(post, path = "/v1/receipts/{channel}", tag = "receipts",
    params(("channel" = String, Path, description = "Channel instance, e.g. `sms`")),
    request_body(content = Vec<u8>, description = "The provider's callback, as it sends it", content_type = "application/octet-stream"),
    responses(
        (status = 200, description = "Handled (its settlements applied and its opt-outs stored): the channel plugin's reply, in the provider's format"),
        (status = 400, description = "Not a request this provider sends; nothing settled", body = super::model::Problem, content_type = "application/problem+json"),
        (status = 403, description = "The signature does not verify; nothing settled", body = super::model::Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such channel, or its callbacks are closed", body = super::model::Problem, content_type = "application/problem+json"),
        (status = 503, description = "Redis unavailable, the callback names a send not recorded yet, or the opt-outs it carries could not be stored: send it again", body = super::model::Problem, content_type = "application/problem+json"),
    ))]
pub(crate) async fn open_receipt(
    State(state): State<AppState>,
    Path(channel): Path<String>,
    method: Method,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
    body: Result<Bytes, axum::extract::rejection::BytesRejection>,
) -> Response {
    let req = Incoming {
        method,
        query,
        headers,
        body,
    };
    respond(&state, &channel, None, req).await
}

/// A provider callback: `{token}` is the channel's path token (for an open
/// channel, the first segment of the path), `{rest}` the path after it.
#[utoipa::path(post, path = "/v1/receipts/{channel}/{token}", tag = "receipts",
    params(
        ("channel" = String, Path, description = "Channel instance, e.g. `sms`"),
        ("token" = String, Path, description = "The channel's callback path token (`callback_token_env`)"),
    ),
    request_body(content = Vec<u8>, description = "The provider's callback, as it sends it", content_type = "application/octet-stream"),
    responses(
        (status = 200, description = "Handled (its settlements applied and its opt-outs stored): the channel plugin's reply, in the provider's format"),
        (status = 400, description = "Not a request this provider sends; nothing settled", body = super::model::Problem, content_type = "application/problem+json"),
        (status = 403, description = "The signature does not verify; nothing settled", body = super::model::Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such channel, a wrong token, or callbacks closed", body = super::model::Problem, content_type = "application/problem+json"),
        (status = 503, description = "Redis unavailable, the callback names a send not recorded yet, or the opt-outs it carries could not be stored: send it again", body = super::model::Problem, content_type = "application/problem+json"),
    ))]
pub(crate) async fn receipt(
    State(state): State<AppState>,
    Path((channel, rest)): Path<(String, String)>,
    method: Method,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
    body: Result<Bytes, axum::extract::rejection::BytesRejection>,
) -> Response {
    let req = Incoming {
        method,
        query,
        headers,
        body,
    };
    respond(&state, &channel, Some(&rest), req).await
}

/// The parts of a request the handlers pass on.
struct Incoming {
    method: Method,
    query: Option<String>,
    headers: HeaderMap,
    body: Result<Bytes, axum::extract::rejection::BytesRejection>,
}

async fn respond(state: &AppState, channel: &str, rest: Option<&str>, req: Incoming) -> Response {
    match serve(state, channel, rest, req).await {
        Ok(reply) => reply_response(reply),
        Err(e) => e.into_response(),
    }
}

/// Opens the gate (`rest` starts with the token for a token channel), reads
/// the body and hands the request to the handler.
async fn serve(
    state: &AppState,
    channel: &str,
    rest: Option<&str>,
    req: Incoming,
) -> Result<ProviderReply, ApiError> {
    let path = open_gate(state, channel, rest)?;
    let body = req.body.map_err(|e| body_error(state, &e))?;
    let Some(handler) = &state.receipts else {
        return Err(ApiError::NotImplemented(
            "this host has no callback handler".into(),
        ));
    };
    let request = ProviderRequest {
        method: req.method.as_str().to_string(),
        path,
        query: req.query.unwrap_or_default(),
        headers: header_pairs(&req.headers),
        body: body.to_vec(),
    };
    handler.handle(channel, request).await.map_err(|refusal| {
        log_refusal(channel, &refusal);
        refusal_error(refusal)
    })
}

/// A refused callback in the log, with the plugin's reason: the provider
/// sees only the status, and an operator's misconfigured setting (a topic,
/// a token) shows up here first.
fn log_refusal(channel: &str, refusal: &ReceiptRefusal) {
    let (what, why) = match refusal {
        ReceiptRefusal::Forbidden(why) => ("refused (403)", why),
        ReceiptRefusal::Malformed(why) => ("refused as malformed (400)", why),
        ReceiptRefusal::Failed(why) => ("failed in its plugin (500)", why),
        // Redis or the ledger: logged where they failed, and the provider retries.
        ReceiptRefusal::Unavailable(_)
        | ReceiptRefusal::NotYet(_)
        | ReceiptRefusal::OptOutsUnstored(_) => return,
    };
    tracing::warn!(channel, why = %why, "callback {what}");
}

/// The path after the channel's gate: anything for an open channel, the
/// rest after a matching token for a token channel; else not found (a
/// wrong token and an unknown channel look the same).
fn open_gate(state: &AppState, channel: &str, rest: Option<&str>) -> Result<String, ApiError> {
    let not_found = || ApiError::NotFound("no such route".into());
    match (state.callbacks.get(channel), rest) {
        (Some(CallbackGate::Open), rest) => Ok(rest.unwrap_or("").to_string()),
        (Some(CallbackGate::Token(expected)), Some(rest)) => {
            let (token, path) = rest.split_once('/').unwrap_or((rest, ""));
            let digest: [u8; 32] = Sha256::digest(token.as_bytes()).into();
            if !bool::from(digest.ct_eq(expected)) {
                return Err(not_found());
            }
            Ok(path.to_string())
        }
        _ => Err(not_found()),
    }
}

fn body_error(state: &AppState, e: &axum::extract::rejection::BytesRejection) -> ApiError {
    if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
        ApiError::TooLarge {
            limit: state.limits.body_bytes,
        }
    } else {
        ApiError::MalformedCallback(format!("could not read the body: {e}"))
    }
}

/// The request's headers as (name, value) text, as the plugin sees them.
fn header_pairs(headers: &HeaderMap) -> Vec<(String, String)> {
    headers
        .iter()
        .map(|(k, v)| {
            (
                k.as_str().to_string(),
                String::from_utf8_lossy(v.as_bytes()).into_owned(),
            )
        })
        .collect()
}

fn refusal_error(refusal: ReceiptRefusal) -> ApiError {
    match refusal {
        ReceiptRefusal::Forbidden(r) => ApiError::Forbidden(r),
        ReceiptRefusal::Malformed(r) => ApiError::MalformedCallback(r),
        ReceiptRefusal::Failed(r) => ApiError::CallbackFailed(r),
        ReceiptRefusal::Unavailable(e) => ApiError::from(e),
        ReceiptRefusal::NotYet(detail) | ReceiptRefusal::OptOutsUnstored(detail) => {
            ApiError::Unavailable {
                detail,
                accepted: None,
            }
        }
    }
}

/// The plugin's reply as an HTTP response: its status (500 if invalid), the
/// allowed headers, its body.
fn reply_response(reply: ProviderReply) -> Response {
    let status = StatusCode::from_u16(reply.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut response = Response::new(Body::from(reply.body));
    *response.status_mut() = status;
    for (name, value) in reply.headers {
        let lower = name.to_ascii_lowercase();
        if !REPLY_HEADERS.contains(&lower.as_str()) {
            continue;
        }
        if let (Ok(n), Ok(v)) = (
            HeaderName::from_bytes(lower.as_bytes()),
            HeaderValue::from_str(&value),
        ) {
            response.headers_mut().insert(n, v);
        }
    }
    response
}
