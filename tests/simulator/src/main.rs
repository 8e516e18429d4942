//! The `provider-sim` binary: serves the simulated providers over TLS on a
//! loopback address (and the control API over plain HTTP on another), writes
//! the CA and the test keys where the host's channel config can name them,
//! and prints `listening on ADDR` once it accepts connections.

use anyhow::Context;
use clap::Parser;
use provider_sim::{Config, SimState};
use std::path::PathBuf;
use std::time::Duration;

/// Imitates Aliyun SMS, Tencent SMS, WeChat, FCM, APNs, Amazon SES (with its
/// SNS notifications), a Standard Webhooks receiver and
/// an inbox service on 127.0.0.1, over TLS with a CA generated at start.
#[derive(Debug, Parser)]
struct Args {
    /// Address of the TLS listener (port 0 picks a free one).
    #[arg(long, default_value = "127.0.0.1:9090")]
    listen: std::net::SocketAddr,
    /// Address of the plain-HTTP control listener (`/_sim/*`).
    #[arg(long, default_value = "127.0.0.1:9091")]
    control_listen: std::net::SocketAddr,
    /// Write the CA certificate (PEM) here: the channels' `ca_file`.
    #[arg(long)]
    ca_out: Option<PathBuf>,
    /// Write `fcm-service-account.json`, `apns-key.p8` and `credentials.json` here.
    #[arg(long)]
    keys_dir: Option<PathBuf>,
    /// Accept the credentials in this `credentials.json` (from an earlier
    /// `--keys-dir`) instead of generating new ones.
    #[arg(long)]
    credentials: Option<PathBuf>,
    /// Seed of the fault dice.
    #[arg(long, default_value_t = 7)]
    seed: u64,
    /// Lifetime of WeChat access tokens, in seconds.
    #[arg(long, default_value_t = 7200)]
    token_ttl_secs: u64,
    /// Lag before an Aliyun message shows in QuerySendDetails, in milliseconds.
    #[arg(long, default_value_t = 2000)]
    query_lag_ms: u64,
}

fn write_keys(state: &SimState, dir: &std::path::Path, base_url: &str) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let files = [
        (
            "fcm-service-account.json",
            state.service_account_json(base_url),
        ),
        (
            "apns-key.p8",
            state.credentials().apns_private_key_pem.clone(),
        ),
        (
            "credentials.json",
            serde_json::to_string_pretty(state.credentials())?,
        ),
    ];
    for (name, text) in files {
        let path = dir.join(name);
        std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
        println!("wrote {}", path.display());
    }
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let credentials = match &args.credentials {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading {}", path.display()))?;
            Some(
                serde_json::from_str(&text)
                    .with_context(|| format!("parsing {}", path.display()))?,
            )
        }
        None => None,
    };
    let state = SimState::try_new(Config {
        credentials,
        seed: args.seed,
        token_ttl: Duration::from_secs(args.token_ttl_secs),
        query_lag: Duration::from_millis(args.query_lag_ms),
        ..Config::default()
    })?;
    let listener = tokio::net::TcpListener::bind(args.listen).await?;
    let control = tokio::net::TcpListener::bind(args.control_listen).await?;
    let base_url = format!("https://{}", listener.local_addr()?);
    if let Some(path) = &args.ca_out {
        // Its folder may not exist yet (`target/sim` on a fresh clone).
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        state.write_ca(path)?;
        println!("wrote CA {}", path.display());
    }
    if let Some(dir) = &args.keys_dir {
        write_keys(&state, dir, &base_url)?;
    }
    println!("control on http://{}", control.local_addr()?);
    println!("listening on {}", listener.local_addr()?);
    tokio::spawn(provider_sim::run_control(control, state.clone(), async {
        let _ = tokio::signal::ctrl_c().await;
    }));
    provider_sim::run(listener, state, async {
        let _ = tokio::signal::ctrl_c().await;
    })
    .await?;
    Ok(())
}
