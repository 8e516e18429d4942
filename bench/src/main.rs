//! `pushonce-bench`: benchmarks that print a table, one subcommand per
//! layer. A binary of its own so the product binary (`pushonce`) carries no
//! benchmark code; `http` runs the `pushonce` binary beside it as the host
//! under test.

mod anatomy;
mod dedup_memory;
mod http;
mod languages;
mod load;
mod peers;
mod permit;
mod plugins;
mod skew;

use clap::{Parser, Subcommand};

/// pushonce-bench: measures pushonce against the floor Redis sets, in one run.
#[derive(Debug, Parser)]
#[command(name = "pushonce-bench", version, about)]
struct Cli {
    #[command(subcommand)]
    what: What,
}

#[derive(Debug, Subcommand)]
enum What {
    /// Plugin calls: warm `derive-key` cost, cache load vs cold compile.
    Plugins(plugins::Args),
    /// Key policies per language (Rust, JavaScript, Python): size, compile, cache load, call, memory.
    Languages(languages::Args),
    /// The Redis permit layer against `redis-benchmark` on the same server.
    Permit(permit::Args),
    /// The whole host over HTTP (separate load generator process), against the Redis floor.
    Http(http::Args),
    /// pushonce's webhook channel and Svix's server side by side (needs a svix-webhooks checkout).
    Peers(peers::Args),
    /// Shard and master skew of a Zipf user mix on a Redis Cluster (no Redis needed).
    Skew(skew::Args),
    /// The HTTP load generator `http` runs as a separate process.
    #[command(hide = true)]
    Load(load::Args),
}

fn main() -> anyhow::Result<()> {
    pushonce::cli::init_logging();
    match Cli::parse().what {
        What::Plugins(a) => plugins::run(a),
        What::Languages(a) => languages::run(a),
        What::Permit(a) => permit::run(a),
        What::Http(a) => http::run(a),
        What::Load(a) => load::run(a),
        What::Skew(a) => skew::run(a),
        What::Peers(a) => peers::run(a),
    }
}

/// The value at quantile `q` (0..=1) of `sorted` (ascending), `None` when empty.
fn percentile<T: Copy>(sorted: &[T], q: f64) -> Option<T> {
    let i = ((sorted.len() as f64 * q) as usize).min(sorted.len().checked_sub(1)?);
    Some(sorted[i])
}
