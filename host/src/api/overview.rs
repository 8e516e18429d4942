//! `GET /admin/overview`: what an operator looks at first — per channel
//! sent / delivered / failed / retried / held / dead since the host started
//! (the host's own counters, as `/metrics` renders them) and over the last
//! minutes ([`Recent`]: a small ring of snapshots of those counters, taken
//! every [`SAMPLE_EVERY`] by [`spawn_sampler`]), the retry queue,
//! the tasks waiting for an operator, the reconciler's lag and the last
//! policy reload. The console's overview page shows the same [`Overview`].

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Mutex, Weak};
use std::time::{Duration, Instant};

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
    /// Tasks made `dead`: out of retries, or held until the reconciler's
    /// checks ran out.
    pub dead: u64,
    /// Tasks cancelled before their first attempt.
    pub cancelled: u64,
}

/// The per-channel counters over the last minutes.
#[derive(Debug, Default, Clone, Serialize, ToSchema)]
pub struct RecentCounts {
    /// The span they cover, in seconds: [`RECENT_WINDOW`], or less while
    /// the host is younger.
    pub seconds: u64,
    /// Per channel, by channel name.
    pub channels: Vec<ChannelCounts>,
}

/// The last reload of policies and plugins.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub(crate) struct ReloadState {
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
    /// What the checks of the reload that put the set in force could not
    /// verify or it does not apply, one line each (e.g. a key policy change
    /// with no recent event to check on, `restart needed: ...`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

/// What an operator looks at first.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub(crate) struct Overview {
    /// Per channel counters since this host started, by channel name.
    pub channels: Vec<ChannelCounts>,
    /// The same counters over the last minutes.
    pub recent: RecentCounts,
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
pub(crate) async fn get_overview(
    State(state): State<AppState>,
) -> Result<Json<Overview>, ApiError> {
    overview(&state).await.map(Json)
}

/// Computes the overview (the JSON endpoint and the console page both show it).
pub(crate) async fn overview(state: &AppState) -> Result<Overview, ApiError> {
    let retry_queue_depth = state.permits.retry_queue_depth().await?;
    let held_now = state.permits.held_count().await?;
    let failed_or_dead_now = state.permits.dead_count().await?;
    let text = state.metrics.render();
    let channels = channel_counts(&text);
    Ok(Overview {
        recent: state.recent.since(Instant::now(), &channels),
        channels,
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
        notes: snapshot.notes.clone(),
    }
}

fn epoch_ms(t: std::time::SystemTime) -> u64 {
    t.duration_since(std::time::SystemTime::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Which counter of [`ChannelCounts`] a metric adds to.
type Field = fn(&mut ChannelCounts) -> &mut u64;

/// A metric, the one label value its samples must have (if any), and the
/// counter they add to.
type Source = (&'static str, Option<(&'static str, &'static str)>, Field);

/// The per-channel counters of the rendered exposition `text`. Dead counts
/// both ways to `dead`: retries exhausted (the dispatcher) and a held task
/// whose checks ran out (the reconciler's give-up of an `unknown` task).
pub(crate) fn channel_counts(text: &str) -> Vec<ChannelCounts> {
    let mut by_channel: BTreeMap<String, ChannelCounts> = BTreeMap::new();
    let fields: [Source; 8] = [
        (m::SENT, None, |c| &mut c.sent),
        (m::DELIVERED, None, |c| &mut c.delivered),
        (m::FAILED, None, |c| &mut c.failed),
        (m::RETRIED, None, |c| &mut c.retrying),
        (m::UNKNOWN, None, |c| &mut c.held),
        (m::DEAD, None, |c| &mut c.dead),
        (m::CANCELLED, None, |c| &mut c.cancelled),
        (m::GAVE_UP_TOTAL, Some(("status", "unknown")), |c| {
            &mut c.dead
        }),
    ];
    for (name, only, field) in fields {
        for (labels, value) in samples(text, name) {
            let Some(channel) = label(&labels, "channel") else {
                continue;
            };
            if only.is_some_and(|(k, v)| label(&labels, k).as_deref() != Some(v)) {
                continue;
            }
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

/// How far back the overview's recent counters reach.
pub(crate) const RECENT_WINDOW: Duration = Duration::from_secs(5 * 60);

/// How often [`spawn_sampler`] snapshots the counters.
pub(crate) const SAMPLE_EVERY: Duration = Duration::from_secs(10);

/// Snapshots of the per-channel counters of the last [`RECENT_WINDOW`],
/// oldest first: the recent counters are now's minus the oldest's.
#[derive(Debug, Default)]
pub struct Recent {
    samples: Mutex<VecDeque<(Instant, Vec<ChannelCounts>)>>,
}

impl Recent {
    /// Keeps `counts` as the snapshot at `at`; forgets those older than the window.
    pub fn record(&self, at: Instant, counts: Vec<ChannelCounts>) {
        let mut samples = self.samples.lock().unwrap_or_else(|e| e.into_inner());
        samples.push_back((at, counts));
        while samples
            .front()
            .is_some_and(|(t, _)| at.saturating_duration_since(*t) > RECENT_WINDOW)
        {
            samples.pop_front();
        }
    }

    /// The counters `now` minus the oldest snapshot within the window.
    pub fn since(&self, now: Instant, now_counts: &[ChannelCounts]) -> RecentCounts {
        let samples = self.samples.lock().unwrap_or_else(|e| e.into_inner());
        let Some((at, base)) = samples
            .iter()
            .find(|(t, _)| now.saturating_duration_since(*t) <= RECENT_WINDOW)
        else {
            return RecentCounts::default();
        };
        let channels = now_counts
            .iter()
            .map(|c| {
                let before = base.iter().find(|b| b.channel == c.channel);
                difference(c, before)
            })
            .collect();
        RecentCounts {
            seconds: now.saturating_duration_since(*at).as_secs(),
            channels,
        }
    }
}

/// `now` minus `before` (absent: zero), counter by counter.
fn difference(now: &ChannelCounts, before: Option<&ChannelCounts>) -> ChannelCounts {
    let zero = ChannelCounts::default();
    let b = before.unwrap_or(&zero);
    ChannelCounts {
        channel: now.channel.clone(),
        sent: now.sent.saturating_sub(b.sent),
        delivered: now.delivered.saturating_sub(b.delivered),
        failed: now.failed.saturating_sub(b.failed),
        retrying: now.retrying.saturating_sub(b.retrying),
        held: now.held.saturating_sub(b.held),
        dead: now.dead.saturating_sub(b.dead),
        cancelled: now.cancelled.saturating_sub(b.cancelled),
    }
}

/// Snapshots the host's counters into `recent` now and every
/// [`SAMPLE_EVERY`], until `recent` is dropped with the API's state.
pub(crate) fn spawn_sampler(
    recent: Weak<Recent>,
    metrics: metrics_exporter_prometheus::PrometheusHandle,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(SAMPLE_EVERY);
        loop {
            tick.tick().await;
            let Some(recent) = recent.upgrade() else {
                return;
            };
            recent.record(Instant::now(), channel_counts(&metrics.render()));
        }
    })
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

    #[test]
    fn dead_counts_retries_exhausted_and_held_tasks_given_up() {
        let text = "pushonce_dead_total{channel=\"wechat\"} 2\n\
            pushonce_reconcile_gave_up_total{channel=\"wechat\",status=\"unknown\"} 3\n\
            pushonce_reconcile_gave_up_total{channel=\"wechat\",status=\"sent\"} 7\n";
        assert_eq!(channel_counts(text)[0].dead, 5);
    }

    fn sent(channel: &str, sent: u64) -> Vec<ChannelCounts> {
        vec![ChannelCounts {
            channel: channel.into(),
            sent,
            ..ChannelCounts::default()
        }]
    }

    #[test]
    fn recent_counts_are_now_minus_the_oldest_snapshot_of_the_window() {
        let recent = Recent::default();
        let t0 = Instant::now();
        assert_eq!(recent.since(t0, &sent("sms", 4)).seconds, 0);
        recent.record(t0, sent("sms", 10));
        recent.record(t0 + Duration::from_secs(60), sent("sms", 25));
        let now = t0 + Duration::from_secs(120);
        let r = recent.since(now, &sent("sms", 40));
        assert_eq!((r.seconds, r.channels[0].sent), (120, 30));
        // Past the window, the first snapshot is forgotten.
        let later = t0 + RECENT_WINDOW + Duration::from_secs(30);
        recent.record(later, sent("sms", 50));
        let r = recent.since(later, &sent("sms", 50));
        assert_eq!(
            (r.seconds, r.channels[0].sent),
            (RECENT_WINDOW.as_secs() - 30, 25)
        );
        // A channel without a snapshot counts from zero.
        assert_eq!(recent.since(later, &sent("inbox", 3)).channels[0].sent, 3);
    }
}
