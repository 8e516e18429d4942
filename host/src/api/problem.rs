//! The API's one error type, [`ApiError`], answered as RFC 9457 problem
//! details (`application/problem+json`). Every refusal of the API goes
//! through it: the answer names the field, the plugin or the reason, and
//! carries the cause in a [`Refusal`] extension for the logging layer
//! (`api::log`), which decides the level.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

use super::model::{ChannelResult, Problem};
use crate::permit::PermitError;
use crate::route::plan::PlanError;

/// The media type of problem details.
pub(crate) const PROBLEM_JSON: &str = "application/problem+json";

/// How long a client should wait before retrying after a 503, in seconds.
pub(crate) const RETRY_AFTER_SECS: u64 = 1;

/// Why a request was refused or failed.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The body is not JSON (syntax error, truncated).
    #[error("malformed JSON: {0}")]
    BadJson(String),
    /// The body is not `application/json`.
    #[error("unsupported media type: {0}")]
    UnsupportedMediaType(String),
    /// The body is longer than the limit.
    #[error("request body larger than {limit} bytes")]
    TooLarge {
        /// The limit in bytes.
        limit: usize,
    },
    /// A field is missing, unknown, of the wrong type or has a value the API does not accept.
    #[error("{field}: {detail}")]
    Invalid {
        /// The field (dotted path).
        field: String,
        /// What is wrong with it.
        detail: String,
    },
    /// The key policy plugin refused the event or failed.
    #[error("key policy {plugin}: {detail}")]
    Plugin {
        /// `name@version`.
        plugin: String,
        /// The plugin's error.
        detail: String,
    },
    /// Missing or wrong bearer token.
    #[error("unauthorized: {0}")]
    Unauthorized(String),
    /// A provider callback whose signature or token does not verify.
    #[error("forbidden: {0}")]
    Forbidden(String),
    /// A host without tokens reached by a non-loopback `Host`, or a
    /// state-changing request from another origin (DNS rebinding, a
    /// cross-site form).
    #[error("refused origin: {0}")]
    OriginRefused(String),
    /// Too many failed sign-ins or wrong tokens from this client address:
    /// answered 429 with `Retry-After`.
    #[error("too many failed attempts from {client}; retry in {retry_after} s")]
    TooManyFailures {
        /// The client's address.
        client: std::net::IpAddr,
        /// Seconds until it may try again.
        retry_after: u64,
    },
    /// An extractor refused the request before its handler ran (e.g. a
    /// path segment that is not UTF-8 once percent-decoded).
    #[error("bad request: {detail}")]
    Rejected {
        /// The extractor's status (a 4xx).
        status: StatusCode,
        /// The extractor's words.
        detail: String,
    },
    /// A provider callback that is not a request the provider sends.
    #[error("malformed callback: {0}")]
    MalformedCallback(String),
    /// No such resource.
    #[error("not found: {0}")]
    NotFound(String),
    /// A request the route cannot read (e.g. an unsubscribe link that is
    /// not one, or a one-click POST without its body).
    #[error("bad request: {0}")]
    BadRequest(String),
    /// The resource existed but is no more (e.g. an expired unsubscribe link).
    #[error("gone: {0}")]
    Gone(String),
    /// The request conflicts with the current state (e.g. requeue refused).
    #[error("conflict: {0}")]
    Conflict(String),
    /// A reload was refused; the running policies stay in force.
    #[error("reload refused: {}", .0.join("; "))]
    ReloadRefused(Vec<String>),
    /// Redis is unreachable: retry later; `accepted` lists what was accepted before.
    #[error("service unavailable: {detail}")]
    Unavailable {
        /// What failed.
        detail: String,
        /// Channels known to be accepted before the failure.
        accepted: Option<Vec<ChannelResult>>,
    },
    /// The route exists but what it needs is not built yet.
    #[error("not implemented: {0}")]
    NotImplemented(String),
    /// The request took longer than the API's timeout.
    #[error("request timed out")]
    Timeout,
    /// No route accepts this method.
    #[error("method not allowed")]
    MethodNotAllowed,
    /// Redis answered something the host did not expect (not an outage).
    #[error("Redis answered unexpectedly")]
    Permit(#[source] PermitError),
    /// A payload the host built is not JSON.
    #[error("payload is not JSON")]
    PayloadJson(#[source] serde_json::Error),
    /// The channel plugin failed on a provider callback (the provider sends
    /// it again); the plugin's own words.
    #[error("callback handling failed: {0}")]
    CallbackFailed(String),
    /// An invariant of the host did not hold.
    #[error("bug: {0}")]
    Bug(&'static str),
    /// The HTTP layer could not read the request: a bad request line (400),
    /// a URI too long (414) or a head too large (431).
    #[error("bad HTTP request: {detail}")]
    Http {
        /// 400, 414 or 431.
        status: StatusCode,
        /// What could not be read.
        detail: &'static str,
    },
}

impl ApiError {
    /// A field error.
    pub fn invalid(field: impl Into<String>, detail: impl Into<String>) -> ApiError {
        ApiError::Invalid {
            field: field.into(),
            detail: detail.into(),
        }
    }

    /// Whether this is the host's own failure (answered 500, details logged
    /// and never echoed to the client).
    pub(crate) fn is_internal(&self) -> bool {
        matches!(
            self,
            ApiError::Permit(_)
                | ApiError::PayloadJson(_)
                | ApiError::CallbackFailed(_)
                | ApiError::Bug(_)
        )
    }

    /// What went wrong, in the words the client is shown.
    fn detail(&self) -> String {
        match self {
            e if e.is_internal() => "an internal error occurred; it was logged".into(),
            ApiError::BadJson(d)
            | ApiError::UnsupportedMediaType(d)
            | ApiError::Unauthorized(d)
            | ApiError::Forbidden(d)
            | ApiError::OriginRefused(d)
            | ApiError::MalformedCallback(d)
            | ApiError::NotFound(d)
            | ApiError::BadRequest(d)
            | ApiError::Gone(d)
            | ApiError::Conflict(d)
            | ApiError::NotImplemented(d) => d.clone(),
            ApiError::Invalid { detail, .. }
            | ApiError::Plugin { detail, .. }
            | ApiError::Unavailable { detail, .. }
            | ApiError::Rejected { detail, .. } => detail.clone(),
            ApiError::ReloadRefused(reasons) => reasons.join("; "),
            ApiError::Http { detail, .. } => detail.to_string(),
            other => other.to_string(),
        }
    }

    /// The error and its sources, one after the other: for the log.
    fn cause_chain(&self) -> String {
        let mut text = self.to_string();
        let mut source = std::error::Error::source(self);
        while let Some(e) = source {
            text.push_str(": ");
            text.push_str(&e.to_string());
            source = e.source();
        }
        text
    }

    /// The HTTP status of this error.
    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::BadJson(_) | ApiError::MalformedCallback(_) | ApiError::BadRequest(_) => {
                StatusCode::BAD_REQUEST
            }
            ApiError::Gone(_) => StatusCode::GONE,
            ApiError::Forbidden(_) | ApiError::OriginRefused(_) => StatusCode::FORBIDDEN,
            ApiError::TooManyFailures { .. } => StatusCode::TOO_MANY_REQUESTS,
            ApiError::UnsupportedMediaType(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ApiError::TooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::Invalid { .. } | ApiError::Plugin { .. } | ApiError::ReloadRefused(_) => {
                StatusCode::UNPROCESSABLE_ENTITY
            }
            ApiError::Unauthorized(_) => StatusCode::UNAUTHORIZED,
            ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::Conflict(_) => StatusCode::CONFLICT,
            ApiError::Unavailable { .. } => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::NotImplemented(_) => StatusCode::NOT_IMPLEMENTED,
            ApiError::Timeout => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::Permit(_)
            | ApiError::PayloadJson(_)
            | ApiError::CallbackFailed(_)
            | ApiError::Bug(_) => StatusCode::INTERNAL_SERVER_ERROR,
            ApiError::Http { status, .. } | ApiError::Rejected { status, .. } => *status,
        }
    }

    /// The problem details body of this error.
    pub fn problem(&self) -> Problem {
        let (slug, title) = match self {
            ApiError::BadJson(_) => ("malformed-json", "Malformed JSON"),
            ApiError::UnsupportedMediaType(_) => {
                ("unsupported-media-type", "Unsupported media type")
            }
            ApiError::TooLarge { .. } => ("body-too-large", "Request body too large"),
            ApiError::Invalid { .. } => ("invalid-field", "Invalid field"),
            ApiError::Plugin { .. } => ("key-policy-failed", "Key policy failed"),
            ApiError::Unauthorized(_) => ("unauthorized", "Unauthorized"),
            ApiError::Forbidden(_) => ("forbidden", "Forbidden"),
            ApiError::OriginRefused(_) => ("origin-refused", "Refused origin"),
            ApiError::TooManyFailures { .. } => ("too-many-failures", "Too many failed attempts"),
            ApiError::MalformedCallback(_) => ("malformed-callback", "Malformed callback"),
            ApiError::NotFound(_) => ("not-found", "Not found"),
            ApiError::BadRequest(_) => ("bad-request", "Bad request"),
            ApiError::Gone(_) => ("gone", "Gone"),
            ApiError::Conflict(_) => ("conflict", "Conflict"),
            ApiError::ReloadRefused(_) => ("reload-refused", "Reload refused"),
            ApiError::Unavailable { .. } => ("unavailable", "Service unavailable"),
            ApiError::NotImplemented(_) => ("not-implemented", "Not implemented"),
            ApiError::Timeout => ("timeout", "Request timed out"),
            ApiError::MethodNotAllowed => ("method-not-allowed", "Method not allowed"),
            ApiError::Permit(_)
            | ApiError::PayloadJson(_)
            | ApiError::CallbackFailed(_)
            | ApiError::Bug(_) => ("internal", "Internal error"),
            ApiError::Http { .. } => ("bad-http-request", "Bad HTTP request"),
            ApiError::Rejected { .. } => ("bad-request", "Bad request"),
        };
        let detail = self.detail();
        Problem {
            kind: format!("urn:pushonce:problem:{slug}"),
            title: title.to_string(),
            status: self.status().as_u16(),
            detail,
            field: match self {
                ApiError::Invalid { field, .. } => Some(field.clone()),
                _ => None,
            },
            plugin: match self {
                ApiError::Plugin { plugin, .. } => Some(plugin.clone()),
                _ => None,
            },
            errors: match self {
                ApiError::ReloadRefused(e) => Some(e.clone()),
                _ => None,
            },
            accepted: match self {
                ApiError::Unavailable { accepted, .. } => accepted.clone(),
                _ => None,
            },
        }
    }
}

impl From<PlanError> for ApiError {
    fn from(e: PlanError) -> ApiError {
        match e {
            PlanError::Invalid { field, detail } => ApiError::Invalid { field, detail },
            PlanError::Plugin { plugin, detail } => ApiError::Plugin { plugin, detail },
            PlanError::Busy { detail, .. } => ApiError::Unavailable {
                detail,
                accepted: None,
            },
            PlanError::PayloadJson(e) => ApiError::PayloadJson(e),
        }
    }
}

impl From<PermitError> for ApiError {
    fn from(e: PermitError) -> ApiError {
        match e {
            PermitError::Redis(e) if crate::eviction::is_out_of_memory(&e) => {
                ApiError::Unavailable {
                    detail: format!(
                        "Redis is out of memory: it refuses writes at its maxmemory \
                         (policy noeviction, so no permit is dropped to make room) ({e}); \
                         retry later, once memory is freed or maxmemory raised"
                    ),
                    accepted: None,
                }
            }
            PermitError::Redis(e) if redis_unavailable(&e) => ApiError::Unavailable {
                detail: format!("Redis is unavailable ({e}); retry later"),
                accepted: None,
            },
            e @ PermitError::NotReplicated { .. } => ApiError::Unavailable {
                detail: format!("{e}; post the event again: what was accepted answers `duplicate`"),
                accepted: None,
            },
            PermitError::BadTaskId(id) => ApiError::NotFound(format!("no task {id:?}")),
            other => ApiError::Permit(other),
        }
    }
}

/// Whether a Redis error means "Redis cannot be reached or cannot serve now"
/// (answer 503, retry later) rather than a bug.
pub(crate) fn redis_unavailable(e: &redis::RedisError) -> bool {
    use redis::{ErrorKind, ServerErrorKind};
    e.is_io_error()
        || e.is_timeout()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.is_unrecoverable_error()
        || matches!(
            e.kind(),
            ErrorKind::Server(
                ServerErrorKind::BusyLoading
                    | ServerErrorKind::TryAgain
                    | ServerErrorKind::ClusterDown
                    | ServerErrorKind::MasterDown
                    | ServerErrorKind::ReadOnly
            )
        )
}

/// The cause of a refusal, attached to its response for the logging layer
/// (never sent to the client).
#[derive(Debug, Clone)]
pub(crate) struct Refusal {
    /// The error's text (internal details included: for the log only).
    pub cause: std::sync::Arc<str>,
    /// Redis (or the request's time budget) failed for now: answered 503
    /// with `Retry-After`, an outage rather than a bug.
    pub unavailable: bool,
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        let refusal = Refusal {
            cause: self.cause_chain().into(),
            unavailable: matches!(self, ApiError::Unavailable { .. } | ApiError::Timeout),
        };
        let problem = self.problem();
        let body = serde_json::to_vec(&problem).unwrap_or_else(|_| b"{}".to_vec());
        let mut response = (status, body).into_response();
        response.extensions_mut().insert(refusal);
        let headers = response.headers_mut();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
        match self {
            ApiError::Unauthorized(_) => {
                headers.insert(
                    header::WWW_AUTHENTICATE,
                    HeaderValue::from_static("Bearer realm=\"pushonce\""),
                );
            }
            ApiError::Unavailable { .. } | ApiError::Timeout => {
                headers.insert(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_SECS));
            }
            ApiError::TooManyFailures { retry_after, .. } => {
                headers.insert(header::RETRY_AFTER, HeaderValue::from(retry_after.max(1)));
            }
            _ => {}
        }
        response
    }
}
