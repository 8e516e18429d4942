//! Probes and observability: `/healthz`, `/readyz`, `/metrics`, `/openapi.json`.

use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use serde::Serialize;
use utoipa::ToSchema;

use super::AppState;
use super::model::Problem;
use super::problem::ApiError;
use crate::metric_names as m;
use crate::plugin::Plugin;

/// How long `/readyz` waits for Redis to answer `PING`.
const PING_TIMEOUT: Duration = Duration::from_secs(1);

/// The answer of the probes.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct Health {
    /// `ok`.
    pub status: String,
    /// Generation of the policies and plugins in force (readiness only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub generation: Option<u64>,
    /// Number of policies in force (readiness only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub policies: Option<usize>,
}

/// The process is up.
#[utoipa::path(get, path = "/healthz", tag = "ops",
    responses((status = 200, description = "Up", body = Health)))]
pub(crate) async fn healthz() -> Json<Health> {
    Json(Health {
        status: "ok".into(),
        generation: None,
        policies: None,
    })
}

/// Redis and the delivery ledger answer and policies and plugins are loaded.
#[utoipa::path(get, path = "/readyz", tag = "ops",
    responses(
        (status = 200, description = "Ready", body = Health),
        (status = 503, description = "Redis or the ledger unreachable, or Redis evicts keys (maxmemory-policy)", body = Problem, content_type = "application/problem+json"),
    ))]
pub(crate) async fn readyz(State(state): State<AppState>) -> Result<Json<Health>, ApiError> {
    let mut conn = state.permits.connection();
    let ping = tokio::time::timeout(
        PING_TIMEOUT,
        redis::cmd("PING").query_async::<String>(&mut conn),
    )
    .await;
    match ping {
        Ok(Ok(_)) => {}
        Ok(Err(e)) => {
            return Err(ApiError::Unavailable {
                detail: format!("Redis does not answer PING: {e}"),
                accepted: None,
            });
        }
        Err(_) => {
            return Err(ApiError::Unavailable {
                detail: format!("Redis did not answer PING within {PING_TIMEOUT:?}"),
                accepted: None,
            });
        }
    }
    check_eviction(&state).await?;
    check_ledger(&state).await?;
    check_one_ledger(&state).await?;
    let snapshot = state.live.current();
    Ok(Json(Health {
        status: "ok".into(),
        generation: Some(snapshot.generation),
        policies: Some(snapshot.policies.by_biz_type.len()),
    }))
}

/// Redis does not evict (a reconnect may have reached a server configured
/// otherwise than at start): 503 naming its policy and the fix when it does.
async fn check_eviction(state: &AppState) -> Result<(), ApiError> {
    let conn = state.permits.connection();
    ready_within(
        state.eviction.check(&conn),
        "Redis did not tell its maxmemory-policy",
    )
    .await
}

/// The other instances on this Redis claim in the same ledger: 503 naming
/// both ledgers when they do not (a Redis replaced since start may hold
/// another's).
async fn check_one_ledger(state: &AppState) -> Result<(), ApiError> {
    let Some(guard) = &state.ledger_guard else {
        return Ok(());
    };
    let conn = state.permits.connection();
    ready_within(
        guard.check(&conn),
        "Redis did not answer the ledger identity check",
    )
    .await
}

/// Runs one readiness check against Redis under [`PING_TIMEOUT`]: 503 with
/// its error, or with `silent` when it did not answer in time.
async fn ready_within<E: std::fmt::Display>(
    check: impl std::future::Future<Output = Result<(), E>>,
    silent: &str,
) -> Result<(), ApiError> {
    let detail = match tokio::time::timeout(PING_TIMEOUT, check).await {
        Ok(Ok(())) => return Ok(()),
        Ok(Err(e)) => e.to_string(),
        Err(_) => format!("{silent} within {PING_TIMEOUT:?}"),
    };
    Err(ApiError::Unavailable {
        detail,
        accepted: None,
    })
}

/// The ledger answers (no send happens without a claim in it): 503 naming
/// why when it does not; accepts still go to Redis meanwhile.
async fn check_ledger(state: &AppState) -> Result<(), ApiError> {
    let Some(ledger) = &state.ledger else {
        return Ok(());
    };
    let detail = match tokio::time::timeout(PING_TIMEOUT, ledger.check()).await {
        Ok(Ok(())) => return Ok(()),
        Ok(Err(e)) => format!("ledger unavailable: {e}; sends wait, accepts continue"),
        Err(_) => format!(
            "ledger unavailable: no answer within {PING_TIMEOUT:?}; sends wait, accepts continue"
        ),
    };
    Err(ApiError::Unavailable {
        detail,
        accepted: None,
    })
}

/// Prometheus text exposition.
#[utoipa::path(get, path = "/metrics", tag = "ops",
    responses((status = 200, description = "Prometheus text format", body = String, content_type = "text/plain")))]
pub(crate) async fn metrics(State(state): State<AppState>) -> impl IntoResponse {
    // Gauges read from Redis; a Redis failure leaves the last values.
    if let Ok(n) = state.permits.retry_queue_depth().await {
        metrics::gauge!(m::RETRY_QUEUE_DEPTH).set(n as f64);
    }
    if let Ok(n) = state.permits.dead_count().await {
        metrics::gauge!(m::FAILED_OR_DEAD).set(n as f64);
    }
    let snapshot = state.live.current();
    metrics::gauge!(m::POLICY_GENERATION).set(snapshot.generation as f64);
    for plugin in snapshot.registry.plugins() {
        if let Plugin::KeyPolicy(p) = plugin {
            let stats = p.stats();
            let id = p.id().to_string();
            metrics::counter!(m::PLUGIN_CALLS, "plugin" => id.clone()).absolute(stats.calls);
            metrics::counter!(m::PLUGIN_FAILURES, "plugin" => id.clone()).absolute(stats.failures);
            metrics::counter!(m::PLUGIN_REFUSALS, "plugin" => id).absolute(stats.refusals);
        }
    }
    state.metrics.run_upkeep();
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        state.metrics.render(),
    )
}
