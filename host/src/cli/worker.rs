//! `pushonce worker --dev-sender`: dispatcher workers for development and
//! tests. They send nothing: the development sender only appends each
//! message to a file (`--ledger`) and answers as the faults on the command
//! line say, so a task it takes is recorded sent without any provider ever
//! seeing it. Without `--dev-sender` it refuses to start, and it reads no
//! `PUSHONCE_*` variable, so an operator who sourced a production
//! environment cannot take real tasks with it by accident. More delivery
//! capacity is another `pushonce serve` (with `dispatch = true`).
//!
//! Stops on SIGTERM or Ctrl-C: no new entries are read, the attempts in flight
//! finish and are recorded. `kill -9` is survived by the other instances.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio::sync::watch;

use crate::dispatch::{DispatchConfig, Dispatcher, default_consumer_name};
use crate::permit::{PermitConfig, Permits};
use crate::send::{Faults, LedgerFileSender};
use crate::store::{RedisTarget, Store};

/// Arguments of `pushonce worker` (boxed: they are many, and `main`'s command enum stays small).
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The options themselves.
    #[command(flatten)]
    options: Box<Options>,
}

/// The options of `pushonce worker`.
#[derive(Debug, clap::Args)]
struct Options {
    /// Required: run with the development sender, which sends nothing (it
    /// records each message in --ledger and marks its task sent).
    #[arg(long)]
    dev_sender: bool,
    /// Redis URL (`redis://`, `redis+unix://`); without it an embedded
    /// redis-server is started. Never read from `PUSHONCE_REDIS_URL`.
    #[arg(long)]
    redis: Option<String>,
    /// A Redis Cluster instead: node URLs (`redis://host:port`), separated by commas.
    #[arg(long, value_delimiter = ',', conflicts_with = "redis")]
    redis_cluster: Vec<String>,
    /// The delivery ledger every send is claimed in (`sqlite:<path>` or
    /// `postgres://…`, the same for every instance); without it none (as
    /// `ledger_url = "off"`: unsafe against a Redis failover that loses permits).
    #[arg(long)]
    ledger_url: Option<String>,
    /// Data directory of the embedded redis-server.
    #[arg(long, default_value = "data/redis")]
    data_dir: PathBuf,
    /// Namespace inside every Redis hash tag.
    #[arg(long, default_value = "po")]
    namespace: String,
    /// Number of shards (must match every other instance).
    #[arg(long, default_value_t = 16)]
    shards: u16,
    /// Worker tasks in this process.
    #[arg(long, default_value_t = 8)]
    workers: usize,
    /// Most ready entries taken from one shard per read and handled as one batch (0 counts as 1).
    #[arg(long, default_value_t = crate::dispatch::DEFAULT_BATCH)]
    batch: usize,
    /// Lease of one attempt.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    lease: Duration,
    /// How long one XREADGROUP blocks.
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    block: Duration,
    /// How often due retries are promoted.
    #[arg(long, default_value = "250ms", value_parser = humantime::parse_duration)]
    promote_every: Duration,
    /// How long ended tasks are kept.
    #[arg(long, default_value = "7days", value_parser = humantime::parse_duration)]
    retention: Duration,
    /// How far past a lease end or retry due time a permit is kept.
    #[arg(long, default_value = "5m", value_parser = humantime::parse_duration)]
    grace: Duration,
    /// Ledger file of the development sender (one JSON line per send call).
    #[arg(long, default_value = "data/ledger.jsonl")]
    ledger: PathBuf,
    /// Fault: attempts 1..=K of every task fail retryably.
    #[arg(long, default_value_t = 0)]
    fail_first: u32,
    /// Fault: keys containing this text fail permanently.
    #[arg(long)]
    permanent_match: Option<String>,
    /// Fault: keys containing this text get no answer (outcome unknown).
    #[arg(long)]
    unknown_match: Option<String>,
    /// Fault: delay before the provider takes a message.
    #[arg(long, default_value = "0s", value_parser = humantime::parse_duration)]
    send_delay: Duration,
    /// Fault: delay after the provider took a message, before answering.
    #[arg(long, default_value = "0s", value_parser = humantime::parse_duration)]
    hold_after_send: Duration,
}

/// Why `pushonce worker` refuses to start without `--dev-sender`.
const NEEDS_DEV_SENDER: &str = "pushonce worker sends nothing: it is a development and test worker whose sender only appends each message to a file (--ledger) and marks its task sent, so a real task it takes is never delivered. To add delivery capacity, run another `pushonce serve` (dispatch = true) instead; to run this worker for development or tests, pass --dev-sender";

/// Run `pushonce worker`.
pub fn run(args: Args) -> anyhow::Result<()> {
    if !args.options.dev_sender {
        anyhow::bail!(NEEDS_DEV_SENDER);
    }
    crate::files::private_files();
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(serve(*args.options))
}

async fn serve(args: Options) -> anyhow::Result<()> {
    let store = Store::open(&redis_target(&args)).await?;
    let permits = Permits::new(store.manager().await?, permit_config(&args));
    // No opt-in here: a worker refuses an evicting Redis (see `eviction`).
    let never_evicting = crate::eviction::EvictionGuard {
        allow_evicting: false,
        ledger: false,
    };
    never_evicting.check(&permits.connection()).await?;
    let sender = open_file_sender(&args)?;
    let (stop_tx, stop_rx) = watch::channel(false);
    tokio::spawn(async move {
        wait_for_signal().await;
        tracing::info!("stopping: finishing attempts in flight");
        let _ = stop_tx.send(true);
    });
    let dispatcher = Dispatcher::new(
        store.client().clone(),
        permits,
        Arc::new(sender),
        dispatch_config(&args),
        stop_rx,
    );
    let dispatcher = match &args.ledger_url {
        Some(url) if url != "off" => dispatcher.with_ledger(
            crate::ledger::Ledger::open(url)
                .await
                .context("opening the delivery ledger")?,
        ),
        _ => dispatcher,
    };
    let result = dispatcher.run().await;
    store.shutdown().await;
    Ok(result?)
}

/// The Redis named on the command line, else the embedded one.
fn redis_target(args: &Options) -> RedisTarget {
    match &args.redis {
        Some(url) => RedisTarget::Url(url.clone()),
        None if !args.redis_cluster.is_empty() => RedisTarget::Cluster(args.redis_cluster.clone()),
        None => RedisTarget::Embedded {
            data_dir: args.data_dir.clone(),
        },
    }
}

fn permit_config(args: &Options) -> PermitConfig {
    PermitConfig {
        namespace: args.namespace.clone(),
        shards: args.shards,
        retention: args.retention,
        grace: args.grace,
        ..PermitConfig::default()
    }
}

fn dispatch_config(args: &Options) -> DispatchConfig {
    DispatchConfig {
        workers: args.workers,
        batch: args.batch.max(1),
        lease: args.lease,
        block: args.block,
        consumer: default_consumer_name(),
        promote_every: args.promote_every,
        ..DispatchConfig::default()
    }
}

/// The sender that appends each message to the file `--ledger`, with the
/// faults asked for on the command line.
fn open_file_sender(args: &Options) -> anyhow::Result<LedgerFileSender> {
    if let Some(dir) = args.ledger.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let faults = Faults {
        fail_first: args.fail_first,
        permanent_match: args.permanent_match.clone(),
        unknown_match: args.unknown_match.clone(),
        send_delay: args.send_delay,
        hold_after_send: args.hold_after_send,
    };
    LedgerFileSender::open(&args.ledger, faults)
        .with_context(|| format!("opening the ledger {}", args.ledger.display()))
}

async fn wait_for_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
