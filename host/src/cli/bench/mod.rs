//! `pushonce bench`: benchmarks that print a table, one subcommand per layer.

pub mod http;
pub mod load;
pub mod permit;
pub mod plugins;

/// Arguments of `pushonce bench`.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    what: What,
}

#[derive(Debug, clap::Subcommand)]
enum What {
    /// Plugin calls: warm `derive-key` cost, cache load vs cold compile.
    Plugins(plugins::Args),
    /// The Redis permit layer against `redis-benchmark` on the same server.
    Permit(permit::Args),
    /// The whole host over HTTP (separate load generator process), against the Redis floor.
    Http(http::Args),
    /// The HTTP load generator `bench http` runs as a separate process.
    #[command(hide = true)]
    Load(load::Args),
}

/// Run `pushonce bench`.
pub fn run(args: Args) -> anyhow::Result<()> {
    match args.what {
        What::Plugins(a) => plugins::run(a),
        What::Permit(a) => permit::run(a),
        What::Http(a) => http::run(a),
        What::Load(a) => load::run(a),
    }
}
