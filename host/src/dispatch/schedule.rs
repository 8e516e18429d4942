//! The retry scheduler: promotes due retries from every shard's delayed set
//! to its ready stream (one script per shard per tick, atomic per entry).
//! Every process runs one; two promoting the same shard cannot duplicate an
//! entry because the script removes what it promotes in the same call.

use std::sync::Arc;

use super::{DispatchContext, pause};

/// Runs until shutdown.
pub(crate) async fn run(shared: Arc<DispatchContext>) {
    let batch = shared.config.promote_batch.max(1);
    while !pause(&shared, shared.config.promote_every).await {
        for shard in 0..shared.permits.layout().shards() {
            loop {
                match shared.permits.promote_due(shard, batch).await {
                    Ok(n) if n >= batch => continue,
                    Ok(_) => break,
                    Err(e) => {
                        tracing::warn!(shard, error = %e, "promoting due retries failed");
                        break;
                    }
                }
            }
        }
    }
}
