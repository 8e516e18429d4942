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
    kinds_matching(conn, &format!("{{{ns}:*")).await
}

/// The kinds of the keys matching `pattern`, by name.
async fn kinds_matching(
    conn: &mut RedisConn,
    pattern: &str,
) -> anyhow::Result<BTreeMap<String, Kind>> {
    let keys = crate::permit::scan_keys(conn, pattern, usize::MAX).await?;
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

/// `INFO memory` fields that split `used_memory` into what keys hold and
/// what Redis holds beside them.
const MEMORY_FIELDS: [&str; 6] = [
    "used_memory",
    "used_memory_dataset",
    "used_memory_overhead",
    "mem_aof_buffer",
    "mem_clients_normal",
    "used_memory_scripts",
];

/// Redis's memory at one moment: the `INFO memory` split and every key by
/// kind.
pub(crate) struct Snapshot {
    /// [`MEMORY_FIELDS`], in order (0 when this Redis does not report one).
    fields: Vec<i64>,
    /// Every key by kind.
    kinds: BTreeMap<String, Kind>,
    /// `MEMORY STATS`, its integers by their (dotted) names.
    stats: BTreeMap<String, i64>,
}

/// The integers of a `MEMORY STATS` reply (name/value pairs, nested), by
/// their names joined with dots.
fn flatten(prefix: &str, v: &redis::Value, out: &mut BTreeMap<String, i64>) {
    let redis::Value::Array(items) = v else {
        return;
    };
    for pair in items.chunks(2) {
        let [name, value] = pair else { continue };
        let name = match name {
            redis::Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
            redis::Value::SimpleString(s) => s.clone(),
            _ => continue,
        };
        let name = format!("{prefix}{name}");
        match value {
            redis::Value::Int(n) => {
                out.insert(name, *n);
            }
            redis::Value::Array(_) => flatten(&format!("{name}."), value, out),
            _ => {}
        }
    }
}

impl Snapshot {
    /// How many keys of `kind` there were.
    pub(crate) fn keys_of(&self, kind: &str) -> u64 {
        self.kinds.get(kind).map_or(0, |k| k.keys)
    }

    /// Reads every key, then the split.
    pub(crate) async fn take(conn: &mut RedisConn) -> anyhow::Result<Snapshot> {
        // The keys first: a SCAN deletes the expired keys it meets, so the
        // memory read after it holds no key no one could read any more.
        let kinds = kinds_matching(conn, "*").await?;
        let info: String = redis::cmd("INFO").arg("memory").query_async(conn).await?;
        let fields = MEMORY_FIELDS
            .iter()
            .map(|name| {
                crate::permit::field_of(&info, name)
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0)
            })
            .collect();
        let stats: redis::Value = redis::cmd("MEMORY").arg("STATS").query_async(conn).await?;
        let mut flat = BTreeMap::new();
        flatten("", &stats, &mut flat);
        Ok(Snapshot {
            stats: flat,
            fields,
            kinds,
        })
    }

    /// One line: how each field and each kind of key grew from `before` to
    /// this snapshot, per message (`messages`), signed.
    pub(crate) fn growth_since(&self, before: &Snapshot, messages: usize) -> String {
        let per = |d: i64| d as f64 / messages.max(1) as f64;
        let fields: Vec<String> = MEMORY_FIELDS
            .iter()
            .zip(self.fields.iter().zip(&before.fields))
            .map(|(name, (a, b))| format!("{name} {:+.0}", per(a - b)))
            .collect();
        let names: std::collections::BTreeSet<&String> =
            self.kinds.keys().chain(before.kinds.keys()).collect();
        let kinds: Vec<String> = names
            .into_iter()
            .map(|name| {
                let a = self.kinds.get(name).copied().unwrap_or_default();
                let b = before.kinds.get(name).copied().unwrap_or_default();
                format!(
                    "{name} {:+.0} ({:+} keys)",
                    per(a.bytes as i64 - b.bytes as i64),
                    a.keys as i64 - b.keys as i64
                )
            })
            .collect();
        let stats: Vec<String> = self
            .stats
            .iter()
            .filter_map(|(name, a)| {
                let d = a - before.stats.get(name).copied().unwrap_or(0);
                (d != 0).then(|| format!("{name} {:+.0}", per(d)))
            })
            .collect();
        format!(
            "INFO memory: {}; MEMORY STATS: {}; MEMORY USAGE by key kind: {}",
            fields.join(", "),
            stats.join(", "),
            kinds.join(", ")
        )
    }
}
