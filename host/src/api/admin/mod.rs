//! `/admin`: what operators see and steer — plugins loaded, policies in force
//! (and the last refused change) and reload here; the tasks they act on
//! (held, failed and dead; requeue and settle; the search by idempotency key)
//! in [`tasks`]; the provider circuits of channels with `providers` in
//! [`providers`].

pub(crate) mod providers;
pub(crate) mod tasks;

use std::collections::BTreeMap;
use std::time::SystemTime;

use axum::Json;
use axum::extract::State;
use serde::Serialize;
use utoipa::ToSchema;

use super::AppState;
use super::model::Problem;
use super::problem::ApiError;
use crate::permit::millis;
use crate::plugin::Plugin;
use crate::route::policy::RetrySpec;

/// One loaded plugin.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct PluginView {
    /// `name@version`.
    pub id: String,
    /// Name.
    pub name: String,
    /// Version.
    pub version: String,
    /// `key-policy` or `channel`.
    pub world: String,
    /// One-line description from the plugin.
    pub description: String,
    /// Hex SHA-256 of the `.wasm` file.
    pub sha256: String,
    /// Calls since loaded (key policies; channels: not counted yet).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub calls: Option<u64>,
    /// Calls the plugin refused with its own error.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub refusals: Option<u64>,
    /// Calls that trapped or ran over a limit.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failures: Option<u64>,
    /// A channel's optional interfaces: `callbacks` (contract 2.1: its
    /// callbacks may carry opt-outs) and `extras` (2.2: its sends take the
    /// recipient's unsubscribe link). Empty for key policies.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub optional_exports: Vec<String>,
}

/// The plugins of the snapshot in force.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct PluginsView {
    /// Generation of the snapshot.
    pub generation: u64,
    /// Every loaded plugin.
    pub plugins: Vec<PluginView>,
    /// Plugin files refused at the last load, one line each.
    pub refused: Vec<String>,
}

/// A retry schedule.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct RetryView {
    /// Attempts in all.
    pub max_attempts: u32,
    /// First delay, ms.
    pub initial_ms: u64,
    /// Growth factor.
    pub factor: f64,
    /// Longest delay, ms.
    pub max_ms: u64,
    /// Jitter on.
    pub jitter: bool,
}

/// One channel's overrides.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct OverrideView {
    /// Its own window, ms.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub window_ms: Option<u64>,
    /// Its own retry schedule.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry: Option<RetryView>,
    /// The template its provider renders, instead of the event's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub template: Option<String>,
}

/// One policy in force.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct PolicyView {
    /// Business type.
    pub biz_type: String,
    /// The file.
    pub file: String,
    /// Key policy requirement, `name@req`.
    pub key_policy: String,
    /// The version it resolved to.
    pub key_policy_version: String,
    /// Params for the key policy.
    pub params: BTreeMap<String, String>,
    /// Channels.
    pub channels: Vec<String>,
    /// Dedup window, ms.
    pub window_ms: u64,
    /// Retry schedule.
    pub retry: RetryView,
    /// Fallback channel per channel.
    pub fallback: BTreeMap<String, String>,
    /// Per-channel overrides.
    pub(crate) overrides: BTreeMap<String, OverrideView>,
}

/// A refused reload.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct RefusalView {
    /// When (ms since the epoch).
    pub at_ms: u64,
    /// Every reason.
    pub errors: Vec<String>,
}

/// The policies in force.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct PoliciesView {
    /// Generation of the snapshot in force.
    pub generation: u64,
    /// When it was loaded (ms since the epoch).
    pub loaded_at_ms: u64,
    /// Every policy.
    pub policies: Vec<PolicyView>,
    /// The last refused reload since start.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_refused: Option<RefusalView>,
}

/// The answer to a reload.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct ReloadView {
    /// The generation now in force.
    pub generation: u64,
    /// What the reload's checks could not verify or the reload does not
    /// apply, one line each: a key policy or `params` change the corpus of
    /// recent events held no event to check on, `pushonce.toml` settings
    /// edited since start (`restart needed: ...`); empty otherwise.
    pub notes: Vec<String>,
}

fn epoch_ms(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

fn retry_view(r: &RetrySpec) -> RetryView {
    RetryView {
        max_attempts: r.max_attempts,
        initial_ms: millis(r.backoff.initial),
        factor: r.backoff.factor,
        max_ms: millis(r.backoff.max),
        jitter: r.backoff.jitter,
    }
}

/// The plugins loaded.
#[utoipa::path(get, path = "/admin/plugins", tag = "admin",
    responses(
        (status = 200, description = "Plugins of the snapshot in force", body = PluginsView),
        (status = 401, description = "Missing or wrong admin token", body = Problem, content_type = "application/problem+json"),
    ),
    security(("admin_token" = [])))]
pub(crate) async fn plugins(State(state): State<AppState>) -> Json<PluginsView> {
    let snapshot = state.live.current();
    let plugins = snapshot
        .registry
        .plugins()
        .into_iter()
        .map(|p| {
            let meta = p.meta().clone();
            let (stats, optional_exports) = match &p {
                Plugin::KeyPolicy(k) => (Some(k.stats()), Vec::new()),
                Plugin::Channel(c) => (None, optional_exports(c)),
            };
            PluginView {
                id: meta.id,
                name: meta.name,
                version: meta.version.to_string(),
                world: meta.world.to_string(),
                description: meta.description,
                sha256: meta.sha256,
                calls: stats.map(|s| s.calls),
                refusals: stats.map(|s| s.refusals),
                failures: stats.map(|s| s.failures),
                optional_exports,
            }
        })
        .collect();
    Json(PluginsView {
        generation: snapshot.generation,
        plugins,
        refused: snapshot.plugin_refusals.clone(),
    })
}

/// The optional interfaces a channel plugin exports.
fn optional_exports(plugin: &crate::plugin::ChannelPlugin) -> Vec<String> {
    let found = [
        (plugin.takes_opt_outs(), "callbacks"),
        (plugin.takes_extras(), "extras"),
    ];
    found
        .into_iter()
        .filter(|(yes, _)| *yes)
        .map(|(_, name)| name.to_string())
        .collect()
}

/// The policies in force and the last refused change.
#[utoipa::path(get, path = "/admin/policies", tag = "admin",
    responses(
        (status = 200, description = "Policies in force", body = PoliciesView),
        (status = 401, description = "Missing or wrong admin token", body = Problem, content_type = "application/problem+json"),
    ),
    security(("admin_token" = [])))]
pub(crate) async fn policies(State(state): State<AppState>) -> Json<PoliciesView> {
    let snapshot = state.live.current();
    let policies = snapshot
        .policies
        .by_biz_type
        .values()
        .map(|p| {
            let s = &p.spec;
            PolicyView {
                biz_type: s.biz_type.clone(),
                file: p.file.display().to_string(),
                key_policy: s.key_policy.clone(),
                key_policy_version: p.key_policy_version.to_string(),
                params: s.params.clone(),
                channels: s.channels.clone(),
                window_ms: millis(s.window),
                retry: retry_view(&s.retry),
                fallback: s.fallback.clone(),
                overrides: s
                    .overrides
                    .iter()
                    .map(|(c, o)| {
                        (
                            c.clone(),
                            OverrideView {
                                window_ms: o.window.map(millis),
                                retry: o.retry.as_ref().map(retry_view),
                                template: o.template.clone(),
                            },
                        )
                    })
                    .collect(),
            }
        })
        .collect();
    Json(PoliciesView {
        generation: snapshot.generation,
        loaded_at_ms: epoch_ms(snapshot.loaded_at),
        policies,
        last_refused: state.live.last_refused().map(|r| RefusalView {
            at_ms: epoch_ms(r.at),
            errors: r.errors,
        }),
    })
}

/// Reload plugins and policies from their directories; all or nothing, and
/// refused if a key policy upgrade within a major version would change keys.
#[utoipa::path(post, path = "/admin/reload", tag = "admin",
    responses(
        (status = 200, description = "Reloaded", body = ReloadView),
        (status = 401, description = "Missing or wrong admin token", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Refused; the running set stays in force", body = Problem, content_type = "application/problem+json"),
    ),
    security(("admin_token" = [])))]
pub(crate) async fn reload(State(state): State<AppState>) -> Result<Json<ReloadView>, ApiError> {
    // The same checked reload as file changes and SIGHUP: a key policy
    // upgrade that would change keys of recent events is refused.
    match (state.reload)().await {
        Ok(r) => Ok(Json(ReloadView {
            generation: r.generation,
            notes: r.notes,
        })),
        Err(refusal) => Err(ApiError::ReloadRefused(refusal.errors)),
    }
}
