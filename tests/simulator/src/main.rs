//! The `provider-sim` binary: serves the provider simulator on a loopback
//! address and prints `listening on ADDR` once it accepts connections.

use clap::Parser;
use provider_sim::{Config, SimState};
use std::time::Duration;

/// Imitates the SMS, WeChat, app-push and inbox providers on 127.0.0.1.
#[derive(Debug, Parser)]
struct Args {
    /// Address to listen on (port 0 picks a free one).
    #[arg(long, default_value = "127.0.0.1:9090")]
    listen: std::net::SocketAddr,
    /// Seed of the fault dice.
    #[arg(long, default_value_t = 7)]
    seed: u64,
    /// Lifetime of WeChat access tokens, in seconds.
    #[arg(long, default_value_t = 7200)]
    token_ttl_secs: u64,
}

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let args = Args::parse();
    let listener = tokio::net::TcpListener::bind(args.listen).await?;
    println!("listening on {}", listener.local_addr()?);
    let state = SimState::new(Config {
        seed: args.seed,
        token_ttl: Duration::from_secs(args.token_ttl_secs),
    });
    provider_sim::run(listener, state, async {
        let _ = tokio::signal::ctrl_c().await;
    })
    .await
}
