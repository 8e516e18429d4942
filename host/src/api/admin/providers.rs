//! `GET /admin/providers`: the provider circuits of every channel with
//! `providers` (issue 37, item 3), each provider in the channel's order with
//! its circuit's state, since when, and the last infrastructure failure's
//! reason. A circuit is kept per host process (`send::circuit`): the answer
//! is the circuits of the process that served the request, named by its
//! process id; another instance may see its providers differently.

use std::time::SystemTime;

use axum::Json;
use axum::extract::State;
use serde::Serialize;
use utoipa::ToSchema;

use super::epoch_ms;
use crate::api::AppState;
use crate::api::model::Problem;
use crate::permit::millis;
use crate::send::circuit::{ChannelHealth, CircuitView};

/// The last infrastructure failure seen at a provider.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub(crate) struct FailureView {
    /// When (ms since the epoch).
    pub at_ms: u64,
    /// The reason the send gave (a timeout, a 5xx, a connect error, arrears),
    /// secrets redacted, at most 500 characters.
    pub reason: String,
}

/// One provider of a channel and its circuit in this process.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub(crate) struct ProviderView {
    /// The provider instance (a `[channels.*]` entry with a plugin).
    pub provider: String,
    /// `closed` (sending), `open` (new tasks start at the next provider) or
    /// `half-open` (one real message at a time tries it).
    pub state: String,
    /// Since when it is in that state (ms since the epoch): opened, turned
    /// half-open, closed again; for a circuit that never opened, when this
    /// process started.
    pub since_ms: u64,
    /// Infrastructure failures in a row now.
    pub failures_in_a_row: u32,
    /// The last infrastructure failure (or arrears) seen at this provider by
    /// this process, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_failure: Option<FailureView>,
}

/// One channel with `providers`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub(crate) struct ChannelProvidersView {
    /// The channel.
    pub channel: String,
    /// Infrastructure failures in a row that open a circuit (`circuit_failures`).
    pub circuit_failures: u32,
    /// How long a circuit stays open before a half-open try, ms (`circuit_open`).
    pub circuit_open_ms: u64,
    /// Its providers in order of preference.
    pub providers: Vec<ProviderView>,
}

/// The provider circuits of this host process.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub(crate) struct ProvidersView {
    /// The process whose circuits these are: each host process keeps its
    /// own, fed by its own sends.
    pub pid: u32,
    /// Every channel with `providers`, by name (empty when none has).
    pub channels: Vec<ChannelProvidersView>,
}

fn ms(t: SystemTime) -> u64 {
    epoch_ms(t)
}

fn provider_view(c: &CircuitView) -> ProviderView {
    ProviderView {
        provider: c.provider.clone(),
        state: c.state.as_str().to_string(),
        since_ms: ms(c.since),
        failures_in_a_row: c.failures_in_a_row,
        last_failure: c.last_failure.as_ref().map(|(at, reason)| FailureView {
            at_ms: ms(*at),
            reason: reason.clone(),
        }),
    }
}

fn channel_view(c: &ChannelHealth) -> ChannelProvidersView {
    ChannelProvidersView {
        channel: c.channel.clone(),
        circuit_failures: c.circuit_failures,
        circuit_open_ms: millis(c.circuit_open),
        providers: c.providers.iter().map(provider_view).collect(),
    }
}

/// The provider circuits of this process (the JSON answer and the console page).
pub(crate) fn providers_view(state: &AppState) -> ProvidersView {
    ProvidersView {
        pid: std::process::id(),
        channels: state
            .provider_health
            .view()
            .iter()
            .map(channel_view)
            .collect(),
    }
}

/// The provider circuits of every channel with `providers`, in the host
/// process that answers (each process keeps its own).
#[utoipa::path(get, path = "/admin/providers", tag = "admin",
    responses(
        (status = 200, description = "Each channel's providers in order, with their circuits in this process", body = ProvidersView),
        (status = 401, description = "Missing or wrong admin token", body = Problem, content_type = "application/problem+json"),
    ),
    security(("admin_token" = [])))]
pub(crate) async fn providers(State(state): State<AppState>) -> Json<ProvidersView> {
    Json(providers_view(&state))
}
