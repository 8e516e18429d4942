//! Where the bytes of open permits go: every key of one namespace grouped
//! by its kind (the name segment after the hash tag: `permit`, `task`,
//! `ev`, `event`, `ready`, …), with `MEMORY USAGE` summed per kind and
//! divided by the permits open. Streams are one key per shard, so their
//! bytes are shared by their entries.

use std::collections::BTreeMap;

use pushonce::store::RedisConn;

/// One kind of key: how many there are and their `MEMORY USAGE` in all.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Kind {
    /// Keys of this kind.
    pub keys: u64,
    /// Their `MEMORY USAGE ... SAMPLES 0`, summed.
    pub bytes: u64,
}

/// The kinds of namespace `ns`'s keys, by name.
pub(crate) async fn kinds(
    conn: &mut RedisConn,
    ns: &str,
) -> anyhow::Result<BTreeMap<String, Kind>> {
    let keys = crate::permit::scan_keys(conn, &format!("{{{ns}:*"), usize::MAX).await?;
    let mut found: BTreeMap<String, Kind> = BTreeMap::new();
    for chunk in keys.chunks(1000) {
        let mut pipe = redis::pipe();
        for key in chunk {
            pipe.cmd("MEMORY")
                .arg("USAGE")
                .arg(key)
                .arg("SAMPLES")
                .arg(0);
        }
        let sizes: Vec<Option<u64>> = pipe.query_async(conn).await?;
        for (key, size) in chunk.iter().zip(sizes) {
            let kind = found.entry(kind_of(key).to_string()).or_default();
            kind.keys += 1;
            kind.bytes += size.unwrap_or(0);
        }
    }
    Ok(found)
}

/// The kind of a key: the segment after its hash tag (`{po:3}:task:…` → `task`).
fn kind_of(key: &str) -> &str {
    let rest = key.split_once("}:").map_or(key, |(_, rest)| rest);
    rest.split(':').next().unwrap_or(rest)
}

/// One line: each kind's bytes per open permit (`permits`), largest first.
pub(crate) fn line(kinds: &BTreeMap<String, Kind>, permits: u64) -> String {
    let mut rows: Vec<(&String, &Kind)> = kinds.iter().collect();
    rows.sort_by_key(|(_, k)| std::cmp::Reverse(k.bytes));
    let total: u64 = rows.iter().map(|(_, k)| k.bytes).sum();
    let parts: Vec<String> = rows
        .iter()
        .map(|(name, k)| {
            format!(
                "{name} {:.0} ({} keys)",
                k.bytes as f64 / permits.max(1) as f64,
                k.keys
            )
        })
        .collect();
    format!(
        "{:.0} bytes of MEMORY USAGE per open permit: {}",
        total as f64 / permits.max(1) as f64,
        parts.join(", ")
    )
}
