//! Command-line subcommands of the `pushonce` binary, one module each.
//!
//! `main.rs` parses arguments with clap and calls `run` of the chosen module;
//! each module returns `anyhow::Result` because this is the binary's edge.

pub(crate) mod channel_kit;
pub(crate) mod channel_script;
pub mod doctor;
pub mod inputs;
pub mod keys;
pub mod ledger;
pub mod openapi;
pub mod output;
pub(crate) mod plugin_build;
pub(crate) mod plugin_test;
pub mod plugins;
pub mod policies;
pub(crate) mod scaffold;
pub mod serve;
pub mod worker;

/// Logs to stderr at `RUST_LOG`'s levels (`info` when unset): what every
/// binary of the project (`pushonce`, `pushonce-bench`) starts with.
pub fn init_logging() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
}
