//! The integration tests: one binary, one module per area.
//!
//! One binary links wasmtime, redis and sqlx once instead of once per area
//! (`cargo test` runs its tests two at a time on this project's machines).
//! The harness (`tests/harness`, the `pushonce_tests` library) is shared with
//! the benches and the chaos program, so it stays a library beside this binary.
//!
//! `cargo xtask test --quick` runs the modules that need only `redis-server`;
//! the ones it skips are listed in `xtask/src/main.rs` (`QUICK_SKIPS`) with
//! what each needs.

// Need only redis-server (and the plugins, the simulator, the `pushonce` binary).
mod api;
mod api_metrics;
mod bloom;
mod boundaries;
mod cancel;
mod caps;
mod channel_outbound;
mod channels;
mod cluster;
mod contract;
mod digest;
mod dispatch;
mod dispatch_batch;
mod dist;
mod docs;
mod doctor;
mod e2e;
mod email;
mod eviction;
mod hardening;
mod one_ledger;
mod ops_files;
mod outbound_tls;
mod permit;
mod plugins;
mod policies;
mod preferences;
mod properties;
mod provider_failover;
mod providers;
mod reconcile;
mod redis_embedded;
mod redis_processes;
mod redis_tls;
mod scheduled;
mod security;
mod sms_opt_out;
mod vanished;

// Need more: PostgreSQL, Chromium, the JavaScript and Python toolchains,
// schemathesis, or minutes of chaos.
mod chaos;
mod console;
mod failover;
mod languages;
mod ledger;
mod ledger_dispatch;
mod ledger_retention;
mod plugin_kit;
mod schemathesis;
