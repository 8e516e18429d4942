//! Command-line subcommands of the `pushonce` binary, one module each.
//!
//! `main.rs` parses arguments with clap and calls `run` of the chosen module;
//! each module returns `anyhow::Result` because this is the binary's edge.

pub mod inputs;
pub mod keys;
pub mod ledger;
pub mod openapi;
pub mod output;
pub mod plugins;
pub mod policies;
pub mod serve;
pub mod worker;
