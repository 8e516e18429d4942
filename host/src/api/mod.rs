//! The HTTP API (axum): the front door for business services (`/v1`), the
//! operators (`/admin`), providers' callbacks (`/v1/receipts`), probes,
//! metrics and the OpenAPI document.
//!
//! This is the only module that knows HTTP: handlers translate between JSON
//! and the host's own types (`route`, `derive`, `permit`, `send`), and every
//! refusal is an [`ApiError`] answered as RFC 9457 problem details.
//! [`app`] builds the router from an [`AppState`]; `service` serves it.

pub(crate) mod admin;
pub(crate) mod auth;
pub(crate) mod body;
pub(crate) mod cancel;
pub(crate) mod console;
pub(crate) mod doctor;
pub(crate) mod events;
pub(crate) mod guard;
pub(crate) mod history;
pub(crate) mod log;
pub mod metrics;
pub(crate) mod model;
pub(crate) mod openapi;
pub(crate) mod ops;
pub(crate) mod overview;
pub(crate) mod preferences;
pub(crate) mod problem;
pub(crate) mod receipts;
pub(crate) mod unsubscribe;

use std::sync::Arc;
use std::time::Duration;

use axum::Extension;
use axum::Router;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::middleware::{Next, from_fn_with_state};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};

pub use auth::Token;
pub(crate) use problem::ApiError;
pub use receipts::{ReceiptHandler, SharedReceiptHandler};

use crate::permit::Permits;
use crate::route::Live;

/// Limits of the API.
#[derive(Debug, Clone, Copy)]
pub struct ApiLimits {
    /// Largest request body in bytes (default 256 KiB); larger is 413.
    pub body_bytes: usize,
    /// Most events in one `POST /v1/events:batch` (default 100).
    pub batch_max: usize,
    /// Longest a request may take (default 10 s); then 503 with `Retry-After`.
    pub request_timeout: Duration,
    /// Years an event's `occurred_at` may fall in (default 2000–2100); outside is 422.
    pub occurred_at_years: crate::event::YearRange,
    /// How far from now an event's `send_at` may be (default 5 min back, 30 days ahead); outside is 422.
    pub send_at: crate::event::SendAtBounds,
}

impl Default for ApiLimits {
    fn default() -> Self {
        ApiLimits {
            body_bytes: 256 * 1024,
            batch_max: 100,
            request_timeout: Duration::from_secs(10),
            occurred_at_years: crate::event::YearRange::default(),
            send_at: crate::event::SendAtBounds::default(),
        }
    }
}

/// What every handler shares: one `Arc`, so the clone axum makes for every
/// request (and every `State` extractor) is one reference count, not a copy
/// of each field (the permit layer's strings, tokens, handles).
#[derive(Clone)]
pub struct AppState(Arc<SharedState>);

impl AppState {
    /// The state shared by every handler.
    pub fn new(shared: SharedState) -> AppState {
        AppState(Arc::new(shared))
    }
}

impl std::ops::Deref for AppState {
    type Target = SharedState;

    fn deref(&self) -> &SharedState {
        &self.0
    }
}

/// The fields of [`AppState`].
pub struct SharedState {
    /// The policies and plugins in force (one `current()` per request).
    pub live: Arc<Live>,
    /// The permit layer.
    pub permits: Permits,
    /// The delivery ledger (`None`: off): readiness, and history after Redis's retention.
    pub ledger: Option<crate::ledger::Ledger>,
    /// That ledger is the one the other instances on this Redis use (`None`: ledger off).
    pub ledger_guard: Option<crate::ledger_guard::LedgerGuard>,
    /// What readiness accepts of Redis's `maxmemory-policy` (read on every probe).
    pub eviction: crate::eviction::EvictionGuard,
    /// Limits.
    pub limits: ApiLimits,
    /// Token of `/v1` (open when unset).
    pub api_token: Token,
    /// Token of `/admin` (open when unset).
    pub admin_token: Token,
    /// The channels whose callbacks are served, and how (absent: closed).
    pub callbacks: receipts::CallbackGates,
    /// Provider callbacks' handler; `None` answers 501.
    pub receipts: Option<SharedReceiptHandler>,
    /// Runs one checked reload of plugins and policies (`POST /admin/reload`).
    pub reload: crate::route::watch::Reloader,
    /// The Prometheus recorder's handle.
    pub metrics: metrics_exporter_prometheus::PrometheusHandle,
    /// Which accepted events are sampled into the corpus of recent events.
    pub corpus: Arc<crate::corpus::CorpusSampler>,
    /// Snapshots of the per-channel counters of the last minutes (the overview).
    pub recent: Arc<overview::Recent>,
    /// The provider circuits of this process's channels with `providers`
    /// (`/admin/providers`, the console).
    pub provider_health: crate::send::circuit::ProviderHealth,
    /// Recipients' preferences as this instance reads them (the accept
    /// path, `/v1/users/{user_id}/preferences`).
    pub preferences: Arc<crate::prefs::PreferenceCache>,
    /// Whether the API token may change preferences (`[preferences] api_token_writes`).
    pub preferences_api_writes: bool,
    /// The signer of one-click unsubscribe links (`None`: `[unsubscribe]`
    /// not configured, `/v1/unsubscribe/{token}` answers 404).
    pub unsubscribe: Option<Arc<crate::unsubscribe::UnsubscribeLinks>>,
}

/// The router of the whole API.
pub fn app(state: AppState) -> Router {
    let v1 = Router::new()
        .route("/v1/events", post(events::post_event))
        .route("/v1/events:batch", post(events::post_batch))
        .route("/v1/events/{biz_type}/{biz_id}", get(events::get_event))
        .route(
            "/v1/events/{biz_type}/{biz_id}/cancel",
            post(cancel::cancel_event),
        )
        .route("/v1/tasks/{id}", get(events::get_task))
        .route_layer(from_fn_with_state(state.api_token.clone(), auth::require));
    let preferences = Router::new()
        .route(
            "/v1/users/{user_id}/preferences",
            put(preferences::put_preferences)
                .get(preferences::get_preferences)
                .delete(preferences::delete_preferences),
        )
        .route_layer(from_fn_with_state(state.clone(), preferences::authorise));
    let admin = Router::new()
        .route("/admin/overview", get(overview::get_overview))
        .route("/admin/plugins", get(admin::plugins))
        .route("/admin/providers", get(admin::providers::providers))
        .route("/admin/doctor", get(doctor::get_doctor))
        .route("/admin/policies", get(admin::policies))
        .route("/admin/reload", post(admin::reload))
        .route("/admin/tasks", get(admin::tasks::task_by_key))
        .route("/admin/users/{user_id}/tasks", get(history::get_user_tasks))
        .route("/admin/tasks/dead", get(admin::tasks::dead_tasks))
        .route("/admin/tasks/held", get(admin::tasks::held_tasks))
        .route("/admin/tasks/{id}/requeue", post(admin::tasks::requeue))
        .route(
            "/admin/tasks/{id}/mark-delivered",
            post(admin::tasks::mark_delivered),
        )
        .route("/admin/tasks/{id}/give-up", post(admin::tasks::give_up))
        .route_layer(from_fn_with_state(state.admin_token.clone(), auth::require));
    let open = Router::new()
        .route(
            "/v1/unsubscribe/{token}",
            post(unsubscribe::post_unsubscribe).get(unsubscribe::get_unsubscribe),
        )
        .route(
            "/v1/receipts/{channel}",
            get(receipts::open_receipt).post(receipts::open_receipt),
        )
        .route(
            "/v1/receipts/{channel}/{*rest}",
            get(receipts::receipt).post(receipts::receipt),
        )
        .route("/healthz", get(ops::healthz))
        .route("/readyz", get(ops::readyz))
        .route("/metrics", get(ops::metrics))
        .route("/openapi.json", get(openapi::openapi));
    let limits = state.limits;
    let tokenless = state.api_token.is_open() || state.admin_token.is_open();
    Router::new()
        .merge(v1)
        .merge(preferences)
        .merge(admin)
        .merge(open)
        .merge(console::routes(state.clone()))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(state)
        .layer(axum::middleware::from_fn(plain_rejections_as_problems))
        .layer(from_fn_with_state(tokenless, guard::loopback_only))
        .layer(Extension(Arc::new(guard::Failures::default())))
        .layer(DefaultBodyLimit::max(limits.body_bytes))
        .layer(Extension(body::BodyLimit(limits.body_bytes)))
        .layer(from_fn_with_state(limits.request_timeout, timeout))
        .layer(from_fn_with_state(
            limits.body_bytes,
            body::refuse_declared_oversize,
        ))
        .layer(from_fn_with_state(
            Arc::new(log::Outage::default()),
            log::log_refusals,
        ))
}

/// Answers an extractor's own rejection (a 4xx in `text/plain`, e.g. a path
/// segment that is not UTF-8 once percent-decoded) as problem+json, its
/// text the detail, like every other refusal of the API. A callback's answer
/// is the channel plugin's, in the provider's format: left alone.
async fn plain_rejections_as_problems(req: Request, next: Next) -> Response {
    if req.uri().path().starts_with("/v1/receipts") {
        return next.run(req).await;
    }
    let response = next.run(req).await;
    let plain = response
        .headers()
        .get(axum::http::header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"text/plain"));
    let status = response.status();
    if !plain
        || !status.is_client_error()
        || response.extensions().get::<problem::Refusal>().is_some()
    {
        return response;
    }
    let bytes = axum::body::to_bytes(response.into_body(), 4096)
        .await
        .unwrap_or_default();
    let detail = String::from_utf8_lossy(&bytes).into_owned();
    ApiError::Rejected { status, detail }.into_response()
}

async fn not_found() -> ApiError {
    ApiError::NotFound("no such route".into())
}

async fn method_not_allowed() -> ApiError {
    ApiError::MethodNotAllowed
}

/// Answers 503 (problem, `Retry-After`) when a request takes longer than `limit`.
/// The request's future is dropped, which is safe: a permit script either ran
/// whole in Redis or not at all, and a retry of the event is answered `duplicate`.
async fn timeout(State(limit): State<Duration>, req: Request, next: Next) -> Response {
    match tokio::time::timeout(limit, next.run(req)).await {
        Ok(response) => response,
        Err(_) => ApiError::Timeout.into_response(),
    }
}
