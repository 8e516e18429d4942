//! The lease of an attempt in flight, kept alive while the attempt waits on
//! its provider (shared by the worker and the providers' failover).

use std::time::Duration;

use super::DispatchContext;
use crate::permit::Attempt;

/// Runs `send` (a send or a status query), extending the lease every third
/// of it while it is in flight.
pub(super) async fn with_lease<T>(
    shared: &DispatchContext,
    attempt: &Attempt,
    send: impl std::future::Future<Output = T>,
) -> T {
    let lease = shared.config.lease;
    let every = (lease / 3).max(Duration::from_millis(10));
    tokio::pin!(send);
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    loop {
        tokio::select! {
            outcome = &mut send => return outcome,
            _ = tick.tick() => match shared.permits.extend_lease(attempt, lease).await {
                Ok(Some(_)) => {}
                Ok(None) => tracing::warn!(task = %attempt.task_id, "lease lost while sending; the outcome will be fenced"),
                Err(e) => tracing::warn!(task = %attempt.task_id, error = %e, "could not extend the lease"),
            },
        }
    }
}
