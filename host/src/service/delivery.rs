//! The delivery half of a host: the dispatcher (supervised: started again
//! after an error) and the reconciler, both stopped after the API.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::error::ServiceError;
use crate::config::HostConfig;
use crate::dispatch::{DispatchConfig, DispatchError, Dispatcher, default_consumer_name};
use crate::ledger::Ledger;
use crate::permit::Permits;
use crate::reconcile::Reconciler;
use crate::send::Sender;
use crate::store::{RedisClient, Store};

/// The dispatcher and the reconciler of this process, running (neither in
/// an API-only instance, `dispatch = false`).
pub(super) struct Delivery {
    /// The supervised dispatcher.
    dispatching: Option<JoinHandle<Result<(), DispatchError>>>,
    /// The reconciler.
    reconciling: Option<JoinHandle<()>>,
}

impl Delivery {
    /// Waits for both to stop (after their stop signal was sent).
    pub(super) async fn stop(self) -> Result<(), ServiceError> {
        let dispatched = match self.dispatching {
            Some(task) => task.await,
            None => Ok(Ok(())),
        };
        let reconciled = match self.reconciling {
            Some(task) => task.await,
            None => Ok(()),
        };
        dispatched??;
        reconciled?;
        Ok(())
    }
}

/// Starts the dispatcher and the reconciler; both stop on `stop` (sent
/// after the API stopped).
pub(super) fn spawn_delivery(
    config: &HostConfig,
    store: &Store,
    permits: Permits,
    sender: Arc<dyn Sender>,
    ledger: Option<Ledger>,
    block: Duration,
    stop: watch::Receiver<bool>,
) -> Delivery {
    if !config.dispatch {
        tracing::info!("dispatch = false: API only, no dispatcher or reconciler in this process");
        return Delivery {
            dispatching: None,
            reconciling: None,
        };
    }
    let reconciling = tokio::spawn(
        Reconciler::new(permits.clone(), sender.clone(), config.reconcile.clone())
            .with_ledger(ledger.clone())
            .run(stop.clone()),
    );
    let dispatching = tokio::spawn(supervise(
        store.client().clone(),
        permits,
        sender,
        ledger,
        DispatchConfig {
            workers: config.workers,
            batch: config.dispatch_batch,
            lease: config.lease,
            block,
            consumer: default_consumer_name(),
            ..DispatchConfig::default()
        },
        stop,
    ));
    Delivery {
        dispatching: Some(dispatching),
        reconciling: Some(reconciling),
    }
}

/// Runs the dispatcher until shutdown, starting it again (after a pause) if
/// it stops with an error — e.g. Redis was unreachable while it prepared —
/// so the API never runs without workers.
async fn supervise(
    client: RedisClient,
    permits: Permits,
    sender: Arc<dyn Sender>,
    ledger: Option<Ledger>,
    config: DispatchConfig,
    mut stop: watch::Receiver<bool>,
) -> Result<(), DispatchError> {
    loop {
        let mut dispatcher = Dispatcher::new(
            client.clone(),
            permits.clone(),
            sender.clone(),
            config.clone(),
            stop.clone(),
        );
        if let Some(ledger) = &ledger {
            dispatcher = dispatcher.with_ledger(ledger.clone());
        }
        match dispatcher.run().await {
            Ok(()) => return Ok(()),
            Err(e) if *stop.borrow() => return Err(e),
            Err(e) => {
                tracing::error!(error = %e, "dispatcher stopped; starting it again in 1 s");
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                    _ = stop.changed() => return Ok(()),
                }
            }
        }
    }
}
