//! A `Dispatcher` running in this process for a test, sending to a
//! development ledger, against one Redis or a cluster; stopped with `stop`.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use pushonce::dispatch::{DispatchConfig, Dispatcher};
use pushonce::ledger::Ledger;
use pushonce::permit::Permits;
use pushonce::send::{Faults, LedgerFileSender};
use pushonce::store::RedisClient;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// A dispatcher running in this process.
pub struct RunningDispatcher {
    stop: watch::Sender<bool>,
    handle: JoinHandle<()>,
}

impl RunningDispatcher {
    /// Starts a dispatcher on `permits` (its `client` opens the reader's
    /// connection on one Redis) with `workers` workers and `lease`, sending
    /// to the ledger file `ledger` with `faults`; short reads and promotions
    /// (200 ms block, 20 ms promote) so tests run fast.
    pub fn start(
        client: impl Into<RedisClient>,
        permits: Permits,
        ledger: &Path,
        faults: Faults,
        workers: usize,
        lease: Duration,
    ) -> RunningDispatcher {
        Self::start_claiming(client, permits, ledger, faults, workers, lease, None)
    }

    /// [`RunningDispatcher::start`] claiming every send in the delivery
    /// ledger `claims` when given.
    pub fn start_claiming(
        client: impl Into<RedisClient>,
        permits: Permits,
        ledger: &Path,
        faults: Faults,
        workers: usize,
        lease: Duration,
        claims: Option<Ledger>,
    ) -> RunningDispatcher {
        let sender = LedgerFileSender::open(ledger, faults).expect("the ledger opens");
        let (stop, rx) = watch::channel(false);
        let mut dispatcher = Dispatcher::new(
            client,
            permits,
            Arc::new(sender),
            DispatchConfig {
                workers,
                lease,
                block: Duration::from_millis(200),
                promote_every: Duration::from_millis(20),
                ..DispatchConfig::default()
            },
            rx,
        );
        if let Some(claims) = claims {
            dispatcher = dispatcher.with_ledger(claims);
        }
        let handle = tokio::spawn(async move { dispatcher.run().await.expect("dispatcher runs") });
        RunningDispatcher { stop, handle }
    }

    /// Asks it to stop and waits (20 s deadline) until it did.
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        tokio::time::timeout(Duration::from_secs(20), self.handle)
            .await
            .expect("dispatcher stops within 20 s")
            .expect("dispatcher task did not panic");
    }
}
