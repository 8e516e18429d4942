//! The reader: takes up to `batch` entries from every shard's ready stream
//! and hands each shard's entries to one batch task
//! ([`super::worker::deliver_batch`]), at most `workers` entries in flight at once.
//!
//! On one Redis, one `XREADGROUP … BLOCK` over every shard's stream
//! on the reader's own connection. On a Redis Cluster a command must not
//! cross hash slots and a blocking command would stall a multiplexed
//! connection, so the reader polls: one non-blocking `XREADGROUP` per shard,
//! all shards at once on the shared cluster connection, pausing between
//! empty rounds for a time that doubles up to [`CLUSTER_POLL_MAX`].

use std::sync::Arc;
use std::time::Duration;

use redis::Value;
use redis::streams::StreamReadReply;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;

use super::worker::deliver_batch;
use super::{DispatchContext, pause};
use crate::permit::Entry;
use crate::store::RedisConn;

/// Longest pause between two empty polling rounds on a cluster (bounds the
/// latency an idle cluster reader adds; at 16 shards, at most 320 cheap
/// reads a second per process while idle).
pub(crate) const CLUSTER_POLL_MAX: Duration = Duration::from_millis(50);

/// The reader loop: waits for a free worker slot, reads (`COUNT` up to
/// `batch` per stream, no more than the free slots), and hands each shard's
/// entries to one batch task as soon as a slot per entry is free. Runs until shutdown, then waits for the
/// attempts in flight; an entry already read is always finished. `conn` is
/// the reader's own blocking connection on one Redis, the shared cluster
/// connection on a cluster.
pub(crate) async fn run(shared: Arc<DispatchContext>, mut conn: RedisConn) {
    let layout = shared.permits.layout().clone();
    let streams: Vec<String> = (0..layout.shards()).map(|s| layout.ready(s)).collect();
    let slots = Arc::new(Semaphore::new(shared.config.workers.max(1)));
    let mut running = JoinSet::new();
    let mut idle = Duration::ZERO;
    while !shared.stopping() {
        // Read only when a worker is free, so read entries do not queue here.
        let Ok(first) = slots.clone().acquire_owned().await else {
            break;
        };
        if shared.stopping() {
            break;
        }
        while running.try_join_next().is_some() {}
        // As many per shard as there are free slots (a batch waits for its
        // slots, so one larger than the free ones would wait here).
        let count = shared
            .config
            .batch
            .min(slots.available_permits() + 1)
            .max(1);
        let entries = match read(&shared, &mut conn, &streams, count).await {
            Ok(entries) => entries,
            Err(e) => {
                drop(first);
                if after_read_error(&shared, &e).await {
                    break;
                }
                continue;
            }
        };
        if conn.is_cluster() && entries.is_empty() {
            // Nothing anywhere: wait a little longer each empty round.
            idle = (idle * 2).clamp(Duration::from_millis(2), CLUSTER_POLL_MAX);
            drop(first);
            if pause(&shared, idle).await {
                break;
            }
            continue;
        }
        idle = Duration::ZERO;
        if !hand_out(&shared, entries, first, &slots, &mut running).await {
            return;
        }
    }
    while running.join_next().await.is_some() {}
    tracing::debug!("reader stopped");
}

/// One read of every shard's ready stream: a blocking read on one Redis,
/// a poll per shard on a cluster.
async fn read(
    shared: &DispatchContext,
    conn: &mut RedisConn,
    streams: &[String],
    count: usize,
) -> redis::RedisResult<Vec<Entry>> {
    if conn.is_cluster() {
        poll_each_shard(shared, conn, streams, count).await
    } else {
        read_all_shards(shared, conn, streams, count).await
    }
}

/// Recreates the consumer groups of a Redis that lost them (flushed, or
/// restarted without AOF), else warns; then pauses. True when stopping.
async fn after_read_error(shared: &DispatchContext, e: &redis::RedisError) -> bool {
    if e.code() == Some("NOGROUP") {
        let _ = shared.permits.ensure_groups().await;
    } else {
        tracing::warn!(error = %e, "reading the ready streams failed");
    }
    pause(shared, Duration::from_millis(200)).await
}

/// Hands each shard's entries to one batch task, the first batch on the
/// slot already held and as many more as it has entries, the others as
/// slots free up. False when the slots were closed.
async fn hand_out(
    shared: &Arc<DispatchContext>,
    entries: Vec<Entry>,
    first: OwnedSemaphorePermit,
    slots: &Arc<Semaphore>,
    running: &mut JoinSet<()>,
) -> bool {
    let mut first = Some(first);
    // An entry may name several tasks (an event's channels), so a batch may
    // hold more tasks than there are slots: it takes all of them then.
    let all = shared.config.workers.max(1);
    for batch in by_shard(entries) {
        let need = u32::try_from(batch.len().min(all)).unwrap_or(u32::MAX);
        let slot = match first.take() {
            Some(mut held) => {
                if need > 1 {
                    match slots.clone().acquire_many_owned(need - 1).await {
                        Ok(more) => held.merge(more),
                        Err(_) => return false,
                    }
                }
                held
            }
            None => match slots.clone().acquire_many_owned(need).await {
                Ok(p) => p,
                Err(_) => return false,
            },
        };
        let shared = shared.clone();
        running.spawn(async move {
            deliver_batch(&shared, &batch).await;
            drop(slot);
        });
    }
    true
}

/// Entries grouped by shard (a batch touches one shard's hash tag), in the
/// order their shards first appear.
fn by_shard(entries: Vec<Entry>) -> Vec<Vec<Entry>> {
    let mut batches: Vec<Vec<Entry>> = Vec::new();
    for entry in entries {
        match batches.iter_mut().find(|b| b[0].shard == entry.shard) {
            Some(batch) => batch.push(entry),
            None => batches.push(vec![entry]),
        }
    }
    batches
}

/// The `XREADGROUP` of this consumer for new entries of `streams`, up to
/// `count` each, blocking up to `block` when given.
fn xreadgroup(
    shared: &DispatchContext,
    block: Option<Duration>,
    streams: &[String],
    count: usize,
) -> redis::Cmd {
    let mut cmd = redis::cmd("XREADGROUP");
    cmd.arg("GROUP")
        .arg(&shared.permits.config().group)
        .arg(&shared.config.consumer)
        .arg("COUNT")
        .arg(count.max(1));
    if let Some(block) = block {
        cmd.arg("BLOCK").arg(crate::permit::millis(block).max(1));
    }
    cmd.arg("STREAMS").arg(streams);
    for _ in streams {
        cmd.arg(">");
    }
    cmd
}

/// One Redis: one blocking read over every shard's stream.
async fn read_all_shards(
    shared: &DispatchContext,
    conn: &mut RedisConn,
    streams: &[String],
    count: usize,
) -> redis::RedisResult<Vec<Entry>> {
    let reply: Option<StreamReadReply> =
        xreadgroup(shared, Some(shared.config.block), streams, count)
            .query_async(conn)
            .await?;
    Ok(entries_of(reply))
}

/// A cluster: one non-blocking read per shard, all at once. A shard whose
/// node cannot answer is skipped this round (its entries wait, or are
/// re-claimed); the read fails only when every shard failed.
async fn poll_each_shard(
    shared: &DispatchContext,
    conn: &RedisConn,
    streams: &[String],
    count: usize,
) -> redis::RedisResult<Vec<Entry>> {
    let mut reads = JoinSet::new();
    for stream in streams {
        let cmd = xreadgroup(shared, None, std::slice::from_ref(stream), count);
        let mut conn = conn.clone();
        reads.spawn(async move { cmd.query_async::<Option<StreamReadReply>>(&mut conn).await });
    }
    let (mut entries, mut last_error, mut failed) = (Vec::new(), None, 0);
    while let Some(joined) = reads.join_next().await {
        match joined {
            Ok(Ok(reply)) => entries.extend(entries_of(reply)),
            Ok(Err(e)) => {
                failed += 1;
                last_error = Some(e);
            }
            Err(e) => tracing::error!(error = %e, "a shard read panicked"),
        }
    }
    match last_error {
        Some(e) if failed == streams.len() => Err(e),
        Some(e) => {
            if e.code() == Some("NOGROUP") {
                let _ = shared.permits.ensure_groups().await;
            } else {
                tracing::warn!(error = %e, failed, "reading some shards' ready streams failed");
            }
            Ok(entries)
        }
        None => Ok(entries),
    }
}

/// The entries of an `XREADGROUP` reply.
fn entries_of(reply: Option<StreamReadReply>) -> Vec<Entry> {
    let mut out = Vec::new();
    for stream in reply.map(|r| r.keys).unwrap_or_default() {
        let Some(shard) = shard_of_stream(&stream.key) else {
            continue;
        };
        for id in stream.ids {
            out.extend(Entry::of_stream_entry(
                shard,
                &id.id,
                &field(id.map.get("task")),
            ));
        }
    }
    out
}

/// The shard of a ready stream's name `{ns:<shard>}:ready`.
fn shard_of_stream(name: &str) -> Option<u16> {
    let inner = name.strip_prefix('{')?.split_once('}')?.0;
    inner.rsplit_once(':')?.1.parse().ok()
}

pub(super) fn field(v: Option<&Value>) -> String {
    match v {
        Some(Value::BulkString(b)) => String::from_utf8_lossy(b).into_owned(),
        Some(Value::SimpleString(s)) => s.clone(),
        _ => String::new(),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn stream_names_give_their_shard() {
        assert_eq!(super::shard_of_stream("{po:12}:ready"), Some(12));
        assert_eq!(super::shard_of_stream("{a:b:3}:ready"), Some(3));
        assert_eq!(super::shard_of_stream("ready"), None);
    }
}
