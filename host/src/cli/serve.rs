//! `pushonce serve [--config FILE]`: the whole host — embedded Redis (when no
//! URL), plugins and policies, dispatcher workers and the HTTP API. Prints
//! `pushonce listening on http://ADDR` once it serves. SIGTERM / Ctrl-C: stop
//! taking requests, finish those in flight, stop the workers (attempts in
//! flight are finished and recorded). SIGHUP: reload plugins and policies.

use std::path::PathBuf;

use anyhow::Context;
use tokio::signal::unix::{SignalKind, signal};

use crate::config::HostConfig;
use crate::route::watch::Trigger;
use crate::service::{self, ServiceOptions};

/// Arguments of `pushonce serve`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Configuration file [default: ./pushonce.toml when it exists].
    #[arg(long, env = "PUSHONCE_CONFIG")]
    config: Option<PathBuf>,
}

/// Run `pushonce serve`.
pub fn run(args: Args) -> anyhow::Result<()> {
    crate::files::private_files();
    let config = HostConfig::load(args.config.as_deref())?;
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(serve(config))
}

async fn serve(config: HostConfig) -> anyhow::Result<()> {
    // Before binding: a refused address is never exposed, not even briefly.
    config.check_exposure(config.listen, |v| std::env::var(v).ok())?;
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("listening on {}", config.listen))?;
    let running = service::start(config, listener, ServiceOptions::default()).await?;
    println!("pushonce listening on http://{}", running.addr());
    let stopper = running.stopper();
    let reload = running.reload_trigger();
    let mut term = signal(SignalKind::terminate()).context("SIGTERM handler")?;
    let mut hup = signal(SignalKind::hangup()).context("SIGHUP handler")?;
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = term.recv() => break,
                _ = tokio::signal::ctrl_c() => break,
                _ = hup.recv() => {
                    // The reload loop logs the outcome; a full channel already
                    // holds a pending reload.
                    let _ = reload.try_send(Trigger::Signal);
                }
            }
        }
        tracing::info!("stopping");
        let _ = stopper.send(true);
    });
    running.wait().await?;
    Ok(())
}
