//! Metrics: the Prometheus recorder, the counters registered at zero, and
//! the scrape. Every metric's name and meaning is in [`crate::metric_names`].
//!
//! Counting goes through the `metrics` facade (`metrics::counter!`), so any
//! module (the dispatcher included) can count without knowing about the API;
//! the recorder installed here renders them at `GET /metrics`. Gauges that
//! live in Redis (retry-queue depth, dead tasks) and the plugin call counters
//! are read at scrape time.

use std::sync::OnceLock;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

use crate::metric_names::*;

/// Registers every [`PER_CHANNEL`](crate::metric_names::PER_CHANNEL) counter of each channel, and the unlabelled
/// counters, at zero (an increment by zero: a counter other code already
/// counted keeps its value).
pub(crate) fn register_channels<'a>(channels: impl IntoIterator<Item = &'a str>) {
    metrics::counter!(RELOAD_REFUSED).increment(0);
    for channel in channels {
        for name in PER_CHANNEL {
            metrics::counter!(*name, "channel" => channel.to_string()).increment(0);
        }
        for result in crate::send::Check::LABELS {
            metrics::counter!(CHECKS_TOTAL, "channel" => channel.to_string(), "result" => result)
                .increment(0);
        }
        for status in ["sent", "unknown"] {
            metrics::counter!(GAVE_UP_TOTAL, "channel" => channel.to_string(), "status" => status)
                .increment(0);
        }
    }
}

/// Registers `pushonce_capped_total` at zero for every cap of every policy
/// in force and each of its channels (a cap's series exists before its
/// first refusal, so a dashboard's rate starts at zero).
pub(crate) fn register_caps(policies: &crate::route::PolicySet) {
    for policy in policies.by_biz_type.values() {
        for cap in &policy.caps {
            for channel in &policy.spec.channels {
                metrics::counter!(CAPPED, "channel" => channel.clone(), "cap" => cap.name.clone())
                    .increment(0);
            }
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
pub fn prometheus_handle() -> PrometheusHandle {
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
