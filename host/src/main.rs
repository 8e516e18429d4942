//! The `pushonce` binary: parses the command line and runs one subcommand.
//! This is the only place where errors become `anyhow` and exit codes.

use clap::{Parser, Subcommand};
use pushonce::cli;

/// mimalloc instead of the system allocator (feature `mimalloc`).
#[cfg(feature = "mimalloc")]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// pushonce: push delivery exactly once per channel.
#[derive(Debug, Parser)]
#[command(name = "pushonce", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// List or check plugin files.
    Plugins(cli::plugins::Args),
    /// Print the idempotency key each channel would get for an event (dry run).
    Keys(cli::keys::Args),
    /// Validate policy files, or compare the keys of two policy sets.
    Policies(cli::policies::Args),
    /// Development and test only: dispatcher workers whose sender sends
    /// nothing (it records each message in a file and marks it sent);
    /// refused without --dev-sender.
    Worker(cli::worker::Args),
    /// Run the whole host: HTTP API, dispatcher workers, embedded Redis if no URL.
    Serve(cli::serve::Args),
    /// Print the HTTP API's OpenAPI document.
    Openapi(cli::openapi::Args),
    /// The delivery ledger: export rows for audits.
    Ledger(cli::ledger::Args),
    /// Check a deployment before going live: Redis, ledger, plugins, channels, tokens.
    Doctor(cli::doctor::Args),
}

fn main() -> anyhow::Result<()> {
    cli::init_logging();
    match Cli::parse().command {
        Command::Plugins(args) => cli::plugins::run(args),
        Command::Keys(args) => cli::keys::run(args),
        Command::Policies(args) => cli::policies::run(args),
        Command::Worker(args) => cli::worker::run(args),
        Command::Serve(args) => cli::serve::run(args),
        Command::Openapi(args) => cli::openapi::run(args),
        Command::Ledger(args) => cli::ledger::run(args),
        Command::Doctor(args) => cli::doctor::run(args),
    }
}
