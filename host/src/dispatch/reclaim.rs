//! The reclaimer: takes over entries whose worker died (in any process) with
//! `XAUTOCLAIM`, once they were idle longer than a lease, and processes them.
//!
//! The begin script decides whether the task really is abandoned (its lease
//! ran out); an entry whose task is still leased is left pending.

use std::sync::Arc;
use std::time::Duration;

use redis::streams::StreamAutoClaimReply;
use tokio::task::JoinSet;

use super::{DispatchContext, pause, worker};
use crate::permit::Entry;

/// Most entries claimed per `XAUTOCLAIM` call.
const CLAIM_BATCH: usize = 64;

/// Runs until shutdown.
pub(crate) async fn run(shared: Arc<DispatchContext>) {
    let every = shared
        .config
        .reclaim_every
        .unwrap_or(shared.config.lease / 2)
        .max(Duration::from_millis(50));
    // Idle longer than a lease, plus slack for the begin script's own clock read.
    let min_idle = shared.config.lease + Duration::from_millis(250);
    while !pause(&shared, every).await {
        for shard in 0..shared.permits.layout().shards() {
            if shared.stopping() {
                break;
            }
            let entries = match claim(&shared, shard, min_idle).await {
                Ok(e) => e,
                Err(e) => {
                    tracing::warn!(shard, error = %e, "XAUTOCLAIM failed");
                    continue;
                }
            };
            if entries.is_empty() {
                continue;
            }
            tracing::info!(shard, n = entries.len(), "re-claimed idle entries");
            for entry in &entries {
                tracing::debug!(task = %entry.task_id, entry = %entry.id, "re-claimed");
            }
            // In batches like the reader's, at most `workers` entries in flight.
            let batch = shared.config.batch.clamp(1, shared.config.workers.max(1));
            let mut set = JoinSet::new();
            for chunk in entries.chunks(batch) {
                let owned = shared.clone();
                let chunk = chunk.to_vec();
                set.spawn(async move { worker::deliver_batch(&owned, &chunk).await });
                while set.len() * batch >= shared.config.workers.max(1) {
                    let _ = set.join_next().await;
                }
            }
            while set.join_next().await.is_some() {}
        }
    }
}

/// Claims every entry of `shard` idle longer than `min_idle` for this consumer.
async fn claim(
    shared: &DispatchContext,
    shard: u16,
    min_idle: Duration,
) -> redis::RedisResult<Vec<Entry>> {
    let stream = shared.permits.layout().ready(shard);
    let mut conn = shared.permits.connection();
    let mut start = "0-0".to_string();
    let mut out = Vec::new();
    loop {
        let reply: StreamAutoClaimReply = redis::cmd("XAUTOCLAIM")
            .arg(&stream)
            .arg(&shared.permits.config().group)
            .arg(&shared.config.consumer)
            .arg(crate::permit::millis(min_idle))
            .arg(&start)
            .arg("COUNT")
            .arg(CLAIM_BATCH)
            .query_async(&mut conn)
            .await?;
        for id in reply.claimed {
            let tasks = super::reader::field(id.map.get("task"));
            out.extend(Entry::of_stream_entry(shard, &id.id, &tasks));
        }
        if reply.next_stream_id == "0-0" || out.len() >= 10 * CLAIM_BATCH {
            return Ok(out);
        }
        start = reply.next_stream_id;
    }
}
