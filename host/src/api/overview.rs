//! `GET /admin/overview`: what an operator looks at first — per channel
//! sent / delivered / failed / retried / held / dead since the host started
//! (the host's own counters, as `/metrics` renders them), the retry queue,
//! the tasks waiting for an operator, the reconciler's lag and the last
//! policy reload. The console's overview page shows the same [`Overview`].

use std::collections::BTreeMap;

use axum::Json;
use axum::extract::State;
use serde::Serialize;
use utoipa::ToSchema;

use super::AppState;
use super::model::Problem;
use super::problem::ApiError;
use crate::metric_names as m;

/// One channel's counters since this host started.
#[derive(Debug, Default, Clone, Serialize, ToSchema)]
pub struct ChannelCounts {
    /// Channel name.
    pub channel: String,
    /// Messages the provider accepted.
    pub sent: u64,
    /// Messages confirmed delivered.
    pub delivered: u64,
    /// Tasks failed for good.
    pub failed: u64,
    /// Attempts that will be retried.
    pub retrying: u64,
    /// Tasks held `unknown` for an operator.
    pub held: u64,
    /// Tasks that ran out of retries.
    pub dead: u64,
}

/// The last reload of policies and plugins.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ReloadState {
    /// Generation in force.
    pub generation: u64,
    /// When it was loaded (ms since the epoch).
    pub loaded_at_ms: u64,
    /// Policies in force.
    pub policies: usize,
    /// The last refused reload since start, newer than the set in force.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub refused_at_ms: Option<u64>,
    /// Why it was refused, one reason a line.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub refused: Vec<String>,
}

/// What an operator looks at first.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Overview {
    /// Per channel counters since this host started, by channel name.
    pub channels: Vec<ChannelCounts>,
    /// Tasks waiting for a retry (every shard).
    pub retry_queue_depth: u64,
    /// Tasks held `unknown` now (every shard).
    pub held_now: u64,
    /// Failed and dead tasks in the operators' index now.
    pub failed_or_dead_now: u64,
    /// How late the reconciler's oldest due check was at its last pass (s), if it ran.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reconcile_lag_seconds: Option<f64>,
    /// The policies in force and the last refused reload.
    pub reload: ReloadState,
}

/// The overview.
#[utoipa::path(get, path = "/admin/overview", tag = "admin",
    responses(
        (status = 200, description = "Counters, queues and the last reload", body = Overview),
        (status = 401, description = "Missing or wrong admin token", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Redis unavailable", body = Problem, content_type = "application/problem+json"),
    ),
    security(("admin_token" = [])))]
pub async fn get_overview(State(state): State<AppState>) -> Result<Json<Overview>, ApiError> {
    overview(&state).await.map(Json)
}

/// Computes the overview (the JSON endpoint and the console page both show it).
pub async fn overview(state: &AppState) -> Result<Overview, ApiError> {
    let retry_queue_depth = state.permits.retry_queue_depth().await?;
    let held_now = state.permits.held_count().await?;
    let failed_or_dead_now = state.permits.dead_count().await?;
    let text = state.metrics.render();
    Ok(Overview {
        channels: channel_counts(&text),
        retry_queue_depth,
        held_now,
        failed_or_dead_now,
        reconcile_lag_seconds: samples(&text, m::LAG_SECONDS)
            .into_iter()
            .map(|(_, v)| v)
            .reduce(f64::max),
        reload: reload_state(state),
    })
}

fn reload_state(state: &AppState) -> ReloadState {
    let snapshot = state.live.current();
    let loaded_at_ms = epoch_ms(snapshot.loaded_at);
    let refusal = state
        .live
        .last_refused()
        .filter(|r| epoch_ms(r.at) >= loaded_at_ms);
    ReloadState {
        generation: snapshot.generation,
        loaded_at_ms,
        policies: snapshot.policies.by_biz_type.len(),
        refused_at_ms: refusal.as_ref().map(|r| epoch_ms(r.at)),
        refused: refusal.map(|r| r.errors).unwrap_or_default(),
    }
}

fn epoch_ms(t: std::time::SystemTime) -> u64 {
    t.duration_since(std::time::SystemTime::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Which counter of [`ChannelCounts`] a metric adds to.
type Field = fn(&mut ChannelCounts) -> &mut u64;

/// The per-channel counters of the rendered exposition `text`.
fn channel_counts(text: &str) -> Vec<ChannelCounts> {
    let mut by_channel: BTreeMap<String, ChannelCounts> = BTreeMap::new();
    let fields: [(&str, Field); 6] = [
        (m::SENT, |c| &mut c.sent),
        (m::DELIVERED, |c| &mut c.delivered),
        (m::FAILED, |c| &mut c.failed),
        (m::RETRIED, |c| &mut c.retrying),
        (m::UNKNOWN, |c| &mut c.held),
        (m::DEAD, |c| &mut c.dead),
    ];
    for (name, field) in fields {
        for (labels, value) in samples(text, name) {
            let Some(channel) = label(&labels, "channel") else {
                continue;
            };
            let counts = by_channel
                .entry(channel.clone())
                .or_insert_with(|| ChannelCounts {
                    channel,
                    ..ChannelCounts::default()
                });
            *field(counts) += value as u64;
        }
    }
    by_channel.into_values().collect()
}

/// `(labels, value)` of every sample of metric `name` in exposition `text`.
fn samples(text: &str, name: &str) -> Vec<(String, f64)> {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| {
            let rest = line.strip_prefix(name)?;
            let (labels, value) = match rest.strip_prefix('{') {
                Some(inner) => inner.split_once("} ")?,
                None => ("", rest.strip_prefix(' ')?),
            };
            Some((labels.to_string(), value.trim().parse().ok()?))
        })
        .collect()
}

/// The value of label `key` in `a="x",b="y"` (values without quotes or commas).
fn label(labels: &str, key: &str) -> Option<String> {
    labels.split(',').find_map(|pair| {
        let (k, v) = pair.split_once('=')?;
        (k.trim() == key).then(|| v.trim().trim_matches('"').to_string())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_are_read_per_channel() {
        let text = "# TYPE pushonce_sent_total counter\n\
            pushonce_sent_total{channel=\"sms\"} 3\n\
            pushonce_sent_total{channel=\"wechat\"} 2\n\
            pushonce_sent_total_other{channel=\"sms\"} 9\n\
            pushonce_unknown_total{channel=\"wechat\"} 1\n\
            pushonce_reconcile_lag_seconds 0.25\n";
        let counts = channel_counts(text);
        assert_eq!(counts.len(), 2);
        assert_eq!((counts[0].channel.as_str(), counts[0].sent), ("sms", 3));
        assert_eq!((counts[1].sent, counts[1].held), (2, 1));
        assert_eq!(samples(text, m::LAG_SECONDS), [(String::new(), 0.25)]);
    }
}
