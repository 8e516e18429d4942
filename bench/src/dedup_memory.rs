//! `pushonce-bench permit --memory-keys N`: Redis memory of the dedup state
//! per key, permit mode against Bloom mode, measured at N keys (`INFO
//! used_memory` deltas) and projected to 10 M (both grow linearly: a permit
//! per key; filter bits per key at a fixed rate).
//!
//! Permit mode: what stays for the whole window once a task ended and its
//! record expired: one permit string per key (`SET … PX`, as `accept.lua`
//! writes it; `INFO used_memory` delta). Bloom mode: the shard filters sized
//! for N keys at 0.001, with the N keys' bits set through `bloom.lua` (the
//! accept script's own bit functions; `MEMORY USAGE` of the filters); the
//! steady state holds two generations (this period's filter and the
//! previous one's). Task records and stream entries are the same in
//! both modes and not counted here.

use pushonce::permit::{BloomSizing, Permits};
use pushonce::store::RedisConn;

use crate::permit::{request, used_memory};

/// Keys written per pipeline (small: the query buffer counts in `used_memory`).
const CHUNK: usize = 1_000;
/// The false-positive rate of the measured Bloom filters.
const RATE: f64 = 0.001;
/// The projection's key count.
const PROJECTED: f64 = 10_000_000.0;

/// One measured mode.
struct Measured {
    what: &'static str,
    bytes: f64,
}

/// Measures and prints the table for `n` keys.
pub(crate) async fn run(conn: &mut RedisConn, permits: &Permits, n: usize) -> anyhow::Result<()> {
    let keys: Vec<String> = (0..n).map(|i| request("m", i).key).collect();
    let before = used_memory(conn).await?;
    write_permits(conn, permits, &keys).await?;
    let permit = (used_memory(conn).await? - before) as f64;
    let (sizing, filters) = write_filters(permits, &keys).await?;
    let bloom = memory_usage(conn, &filters).await? as f64;
    print(
        n,
        &[
            Measured {
                what: "permit mode: one permit string per key",
                bytes: permit,
            },
            Measured {
                what: "bloom mode: one filter generation",
                bytes: bloom,
            },
            Measured {
                what: "bloom mode: two generations (steady state)",
                bytes: 2.0 * bloom,
            },
        ],
    );
    println!(
        "bloom filters: {} shards, each m = {} bits, k = {} (sized for {n} keys at {RATE}, half per filter)",
        permits.layout().shards(),
        sizing.bits,
        sizing.hashes
    );
    Ok(())
}

/// One permit per key, as the accept script leaves it (24 h expiry).
async fn write_permits(
    conn: &mut RedisConn,
    permits: &Permits,
    keys: &[String],
) -> anyhow::Result<()> {
    let layout = permits.layout();
    for chunk in keys.chunks(CHUNK) {
        let mut pipe = redis::pipe();
        for key in chunk {
            let shard = layout.shard_of(key);
            let owner = format!("{shard}-1764650000000-{:016x}", rand_id(key));
            pipe.cmd("SET")
                .arg(layout.permit_in(shard, key))
                .arg(owner)
                .arg("PX")
                .arg(86_400_000)
                .ignore();
        }
        let () = pipe.query_async(conn).await?;
    }
    Ok(())
}

/// Every key's bits in its shard's current filter, sized for all keys.
async fn write_filters(
    permits: &Permits,
    keys: &[String],
) -> anyhow::Result<(BloomSizing, Vec<String>)> {
    let layout = permits.layout();
    let sizing = BloomSizing::per_shard(keys.len() as u64, RATE, layout.shards())?;
    let mut filters = Vec::new();
    let mut by_shard: Vec<Vec<String>> = vec![Vec::new(); usize::from(layout.shards())];
    for key in keys {
        by_shard[usize::from(layout.shard_of(key))].push(key.clone());
    }
    for (shard, keys) in by_shard.iter().enumerate() {
        let [filter, _] = layout.bloom(shard as u16, "BENCH:sms", 86_400_000, &sizing);
        for chunk in keys.chunks(CHUNK) {
            permits.bloom_keys(&filter, &sizing, chunk, true).await?;
        }
        filters.push(filter);
    }
    Ok((sizing, filters))
}

/// `MEMORY USAGE` of `keys` added up: a filter is one string, so this is
/// its allocation (an `INFO used_memory` delta of ~2 MB drowns in the
/// client buffers of the pipelines that wrote it).
async fn memory_usage(conn: &mut RedisConn, keys: &[String]) -> anyhow::Result<u64> {
    let mut total = 0;
    for key in keys {
        total += crate::permit::memory_usage(conn, key).await?;
    }
    Ok(total)
}

/// A task id's random part, derived from the key (no RNG needed).
fn rand_id(key: &str) -> u64 {
    key.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    })
}

fn print(n: usize, rows: &[Measured]) {
    let mb = |b: f64| b / 1_048_576.0;
    println!(
        "| {:<44} | {:>10} | {:>9} | {:>10} | {:>15} |",
        "dedup state", "at keys", "MB", "bytes/key", "MB at 10 M keys"
    );
    println!(
        "|{:-<46}|{:->12}|{:->11}|{:->12}|{:->17}|",
        "", "", "", "", ""
    );
    for r in rows {
        let per_key = r.bytes / n as f64;
        println!(
            "| {:<44} | {:>10} | {:>9.1} | {:>10.2} | {:>15.0} |",
            r.what,
            n,
            mb(r.bytes),
            per_key,
            mb(per_key * PROJECTED)
        );
    }
    println!(
        "bloom (two generations) / permit: {:.3}x the memory",
        rows[2].bytes / rows[0].bytes
    );
}
