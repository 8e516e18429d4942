//! Dispatcher: workers that claim tasks from the ready streams and send them.
//!
//! One [`Dispatcher`] per host process runs:
//! - a reader ([`reader`]) and up to `workers` attempts in flight ([`worker`]): the reader takes
//!   up to `batch` entries per shard from every shard's ready stream with `XREADGROUP` (its own
//!   connection, short `BLOCK`; on a cluster one non-blocking read per shard)
//!   when a worker is free, and hands each shard's entries to one batch task; a batch begins
//!   its attempts (a lease each) in one script call, claims their keys in the ledger in one
//!   transaction, calls the [`Sender`] for all at once, and records the outcomes (which ack
//!   the entries) in one script call;
//! - a reclaimer ([`reclaim`]): `XAUTOCLAIM`s entries idle longer than a lease
//!   (their worker died, in any process) and begins them again;
//! - a retry scheduler ([`schedule`]): promotes due retries from each shard's
//!   delayed set to its ready stream.
//!
//! Outcomes: `sent`; `retryable` → backoff; `permanent` → the payload's
//! fallback task is accepted ([`Permits::accept_fallback`](crate::permit::Permits::accept_fallback)) and the task recorded `failed`;
//! `unknown` → the sender's verdict ([`crate::send::Sender::settle_unknown`]):
//! recorded sent (a query found it), resent with the same key after a
//! backoff (reference honoured / query says absent / `on_unknown = "resend"`),
//! or held as `unknown`. A resend the provider cannot dedupe is counted and
//! marked on the task as a possible duplicate ([`duplicates`]).
//!
//! Nothing in Redis is per process except the consumer name, so any number of
//! processes may share one Redis. Shutdown (a `watch` channel turning `true`):
//! workers stop reading, finish the attempt in flight and record it.

pub mod backoff;
pub mod duplicates;
mod failover;
mod lease;
pub mod ledger;
mod opted_out;
mod outcome;
mod reader;
pub mod reclaim;
mod record;
mod resend;
pub mod schedule;
pub mod worker;

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::ledger::Ledger;
use crate::permit::{PermitError, Permits};
use crate::send::Sender;
use crate::store::{RedisClient, StoreError};

/// Errors that stop a dispatcher.
#[derive(Debug, thiserror::Error)]
pub enum DispatchError {
    /// Preparing scripts or consumer groups failed.
    #[error(transparent)]
    Permit(#[from] PermitError),
    /// A worker could not open its connection.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A dispatcher task panicked.
    #[error("dispatcher task failed: {0}")]
    Join(#[from] tokio::task::JoinError),
}

/// Settings of a dispatcher.
#[derive(Debug, Clone)]
pub struct DispatchConfig {
    /// Attempts in flight at once in this process (default 8).
    pub workers: usize,
    /// Most entries one read takes from one shard's ready stream, handled
    /// as one batch (one script call per step; default 16, at most `workers`).
    pub batch: usize,
    /// Lease of one attempt; extended every third of it while a send is in
    /// flight, and an entry idle longer than it is re-claimed (default 30 s).
    pub lease: Duration,
    /// How long one `XREADGROUP` blocks on one Redis (a cluster is polled, see
    /// [`reader::CLUSTER_POLL_MAX`]); also bounds how fast shutdown is noticed (default 1 s).
    pub block: Duration,
    /// This process's consumer name in every group (unique per process).
    pub consumer: String,
    /// How often due retries are promoted (default 250 ms).
    pub promote_every: Duration,
    /// Most retries promoted per shard per script call (default 100).
    pub promote_batch: usize,
    /// How often idle entries are re-claimed (default: half a lease).
    pub reclaim_every: Option<Duration>,
}

impl Default for DispatchConfig {
    fn default() -> Self {
        DispatchConfig {
            workers: 8,
            batch: DEFAULT_BATCH,
            lease: Duration::from_secs(30),
            block: Duration::from_secs(1),
            consumer: default_consumer_name(),
            promote_every: Duration::from_millis(250),
            promote_batch: 100,
            reclaim_every: None,
        }
    }
}

/// Default of [`DispatchConfig::batch`] (and of the host's `dispatch_batch`).
pub const DEFAULT_BATCH: usize = 16;

/// A consumer name unique to this process: `<hostname>-<pid>-<random>`.
pub(crate) fn default_consumer_name() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "host".into());
    format!(
        "{host}-{}-{:06x}",
        std::process::id(),
        rand::random::<u32>() & 0xff_ffff
    )
}

/// What every dispatcher task shares.
pub(crate) struct DispatchContext {
    /// The permit layer (script calls on the shared connection).
    pub permits: Permits,
    /// Where attempts go.
    pub sender: Arc<dyn Sender>,
    /// Settings.
    pub config: DispatchConfig,
    /// For opening the reader's own blocking connection (one Redis only).
    pub client: RedisClient,
    /// Turns true on shutdown.
    pub shutdown: watch::Receiver<bool>,
    /// The delivery ledger every first send is claimed in (`None`: off, unsafe).
    pub ledger: Option<Ledger>,
}

impl DispatchContext {
    pub(crate) fn stopping(&self) -> bool {
        *self.shutdown.borrow()
    }
}

/// The dispatcher of one process.
pub struct Dispatcher {
    /// Everything its tasks share.
    shared: Arc<DispatchContext>,
}

impl Dispatcher {
    /// A dispatcher sending through `sender`; `client` (a `redis::Client` or
    /// a [`RedisClient`]) opens the reader's connection.
    pub fn new(
        client: impl Into<RedisClient>,
        permits: Permits,
        sender: Arc<dyn Sender>,
        config: DispatchConfig,
        shutdown: watch::Receiver<bool>,
    ) -> Dispatcher {
        Dispatcher {
            shared: Arc::new(DispatchContext {
                permits,
                sender,
                config,
                client: client.into(),
                shutdown,
                ledger: None,
            }),
        }
    }

    /// Claims every task's key in `ledger` before sending it (see [`ledger`]).
    pub fn with_ledger(mut self, ledger: Ledger) -> Dispatcher {
        if let Some(shared) = Arc::get_mut(&mut self.shared) {
            shared.ledger = Some(ledger);
        }
        self
    }

    /// Runs until shutdown: loads scripts, creates consumer groups, then runs
    /// the workers, the reclaimer and the retry scheduler.
    pub async fn run(self) -> Result<(), DispatchError> {
        let shared = self.shared;
        shared.permits.prepare().await?;
        tracing::info!(
            consumer = %shared.config.consumer,
            workers = shared.config.workers,
            batch = shared.config.batch,
            shards = shared.permits.layout().shards(),
            lease = ?shared.config.lease,
            "dispatcher started"
        );
        let mut set = JoinSet::new();
        // One Redis: the reader blocks in XREADGROUP, so its own connection,
        // with a timeout longer than the block. A cluster: the reader polls
        // without blocking, on the shared connection.
        let conn = if shared.permits.connection().is_cluster() {
            shared.permits.connection()
        } else {
            shared
                .client
                .connect(shared.config.block + Duration::from_secs(5))
                .await?
        };
        set.spawn(reader::run(shared.clone(), conn));
        set.spawn(reclaim::run(shared.clone()));
        set.spawn(schedule::run(shared.clone()));
        while let Some(res) = set.join_next().await {
            res?;
        }
        tracing::info!("dispatcher stopped");
        Ok(())
    }
}

/// Sleeps for `d` or until shutdown; returns true if shutting down.
pub(crate) async fn pause(shared: &DispatchContext, d: Duration) -> bool {
    let mut rx = shared.shutdown.clone();
    if *rx.borrow() {
        return true;
    }
    tokio::select! {
        _ = tokio::time::sleep(d) => *rx.borrow(),
        _ = rx.changed() => true,
    }
}
