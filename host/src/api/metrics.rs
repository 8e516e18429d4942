//! Metrics: names, the Prometheus recorder, and the scrape.
//!
//! Counting goes through the `metrics` facade (`metrics::counter!`), so any
//! module (the dispatcher included) can count without knowing about the API;
//! the recorder installed here renders them at `GET /metrics`. Gauges that
//! live in Redis (retry-queue depth, dead tasks) and the plugin call counters
//! are read at scrape time.
//!
//! Emitted by the API: `pushonce_accepted_total{channel}`,
//! `pushonce_duplicates_total{channel}`, `pushonce_http_refused_total{status}`,
//! `pushonce_permit_seconds` (histogram of one pipelined accept), and at
//! scrape `pushonce_retry_queue_depth`, `pushonce_failed_or_dead_tasks`,
//! `pushonce_plugin_calls_total{plugin}`, `pushonce_plugin_failures_total{plugin}`,
//! `pushonce_plugin_refusals_total{plugin}`, `pushonce_policy_generation`;
//! `route::live` counts `pushonce_policy_reload_refused_total`.
//! For the dispatcher to emit (same facade, label `channel`):
//! `pushonce_sent_total`, `pushonce_delivered_total`, `pushonce_failed_total`,
//! `pushonce_retried_total`, `pushonce_fallback_total`, `pushonce_dead_total`,
//! `pushonce_unknown_total`, `pushonce_duplicate_prevented_total` (the
//! delivery ledger stopped a send Redis had let through: Redis lost a
//! permit), and the histogram `pushonce_send_seconds`.
//! The reconciler (`crate::reconcile`) emits
//! `pushonce_reconcile_checks_total{channel,result}`,
//! `pushonce_reconcile_gave_up_total{channel,status}`, and each pass the
//! gauges `pushonce_reconcile_lag_seconds` and `pushonce_awaiting_tasks`.

use std::sync::OnceLock;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

/// Channels accepted (new task).
pub const ACCEPTED: &str = "pushonce_accepted_total";
/// Channels answered duplicate (permit held).
pub const DUPLICATES: &str = "pushonce_duplicates_total";
/// Requests refused or failed, by HTTP status.
pub const REFUSED: &str = "pushonce_http_refused_total";
/// Seconds of one pipelined accept (all channels of a request).
pub const PERMIT_SECONDS: &str = "pushonce_permit_seconds";
/// Tasks waiting for a retry (ZCARD of every shard's delayed set).
pub const RETRY_QUEUE_DEPTH: &str = "pushonce_retry_queue_depth";
/// Failed and dead tasks in the operators' index.
pub const FAILED_OR_DEAD: &str = "pushonce_failed_or_dead_tasks";
/// Calls of a plugin since it was loaded.
pub const PLUGIN_CALLS: &str = "pushonce_plugin_calls_total";
/// Calls of a plugin that trapped or ran over a limit.
pub const PLUGIN_FAILURES: &str = "pushonce_plugin_failures_total";
/// Calls a plugin answered with its own error.
pub const PLUGIN_REFUSALS: &str = "pushonce_plugin_refusals_total";
/// Generation of the policies and plugins in force.
pub const POLICY_GENERATION: &str = "pushonce_policy_generation";

/// Counters labelled by `channel`, registered at zero for every configured
/// channel when a host starts ([`register_channels`]), so dashboards and
/// alert rules find every series from the first scrape (a `rate()` over a
/// series that appears only at its first increment misses that increment).
pub const PER_CHANNEL: &[&str] = &[
    ACCEPTED,
    DUPLICATES,
    "pushonce_sent_total",
    "pushonce_delivered_total",
    "pushonce_failed_total",
    "pushonce_retried_total",
    "pushonce_resent_total",
    "pushonce_unknown_total",
    "pushonce_dead_total",
    "pushonce_fallback_total",
    "pushonce_duplicate_prevented_total",
];

/// Reloads refused (counted by `route::live`).
pub const RELOAD_REFUSED: &str = "pushonce_policy_reload_refused_total";

/// Registers every [`PER_CHANNEL`] counter of each channel, and the unlabelled
/// counters, at zero (an increment by zero: a counter other code already
/// counted keeps its value).
pub fn register_channels<'a>(channels: impl IntoIterator<Item = &'a str>) {
    metrics::counter!(RELOAD_REFUSED).increment(0);
    for channel in channels {
        for name in PER_CHANNEL {
            metrics::counter!(*name, "channel" => channel.to_string()).increment(0);
        }
        for result in crate::send::Check::LABELS {
            metrics::counter!(crate::reconcile::CHECKS_TOTAL, "channel" => channel.to_string(), "result" => result)
                .increment(0);
        }
        for status in ["sent", "unknown"] {
            metrics::counter!(crate::reconcile::GAVE_UP_TOTAL, "channel" => channel.to_string(), "status" => status)
                .increment(0);
        }
    }
}

/// Histogram buckets in seconds (0.25 ms .. 5 s).
const BUCKETS: [f64; 14] = [
    0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0,
];

static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();

/// How often histogram samples are folded into their buckets.
const UPKEEP_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

/// The process's Prometheus recorder, installed as the global `metrics`
/// recorder on first use (one per process: several hosts started in one test
/// process share it).
pub fn handle() -> PrometheusHandle {
    HANDLE
        .get_or_init(|| {
            let recorder = PrometheusBuilder::new()
                .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), &BUCKETS)
                .expect("static, non-empty buckets")
                .build_recorder();
            let handle = recorder.handle();
            if metrics::set_global_recorder(recorder).is_err() {
                tracing::warn!("a metrics recorder was already installed; /metrics shows only what this one records");
            }
            // Histogram samples wait in a buffer until they are folded into
            // the buckets, which a scrape of /metrics does; without a scrape
            // the buffer grows with every request (8 bytes a sample). Fold
            // them every few seconds whatever the scrapes.
            let upkeep = handle.clone();
            let spawned = std::thread::Builder::new()
                .name("metrics-upkeep".into())
                .spawn(move || {
                    loop {
                        std::thread::sleep(UPKEEP_EVERY);
                        upkeep.run_upkeep();
                    }
                });
            if let Err(e) = spawned {
                tracing::warn!(error = %e, "no metrics upkeep thread: histogram samples wait for a scrape");
            }
            handle
        })
        .clone()
}
