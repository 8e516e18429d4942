//! `pushonce-bench permit`: the host's accept script against the floor set by
//! `redis-benchmark` running a bare `SET NX PX` script on the same server in
//! the same run; prints permits/s, p50/p99 latency and Redis memory per open permit.

use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use pushonce::permit::{AcceptRequest, Acceptance, PermitConfig, Permits, RetryPolicy};
use pushonce::store::{RedisConn, RedisTarget, Store};

/// Arguments of `pushonce-bench permit`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Redis URL to measure; without it an embedded redis-server is started in a temporary directory.
    #[arg(long)]
    redis: Option<String>,
    /// Requests per measurement.
    #[arg(long, default_value_t = 100_000)]
    requests: usize,
    /// Concurrent clients (redis-benchmark connections; host tasks on one multiplexed connection).
    #[arg(long, default_value_t = 50)]
    concurrency: usize,
    /// Accepts per pipeline in the batch measurement.
    #[arg(long, default_value_t = 16)]
    batch: usize,
    /// Shards of the key layout.
    #[arg(long, default_value_t = 16)]
    shards: u16,
    /// Keys of the dedup memory table (permit mode vs Bloom mode); 0 skips it.
    #[arg(long, default_value_t = 0)]
    memory_keys: usize,
}

/// One row of the table.
pub(super) struct Row {
    /// What was measured.
    pub what: String,
    /// Permits (script calls) per second.
    pub rate: f64,
    /// Median latency in ms.
    pub p50: f64,
    /// 99th percentile latency in ms.
    pub p99: f64,
}

/// Run `pushonce-bench permit`.
pub fn run(args: Args) -> anyhow::Result<()> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(measure_permits(args))
}

async fn measure_permits(args: Args) -> anyhow::Result<()> {
    let n = args.requests.max(1);
    let c = args.concurrency.max(1);
    let tmp = std::env::temp_dir().join(format!("pushonce-bench-{}", std::process::id()));
    let target = match &args.redis {
        Some(url) => RedisTarget::Url(url.clone()),
        None => RedisTarget::Embedded {
            data_dir: tmp.clone(),
        },
    };
    let store = Store::open(&target).await?;
    let mut conn = store.manager().await?;
    let version = info_field(&mut conn, "server", "redis_version").await?;
    let aof = info_field(&mut conn, "persistence", "aof_enabled").await?;

    let ns = format!("bench{}", std::process::id());
    let (rows, memory) = measure_rows(&store, &mut conn, &args, &ns).await?;
    let given = if args.redis.is_some() {
        "given URL"
    } else {
        "embedded"
    };
    println!(
        "pushonce-bench permit: redis {version} (aof_enabled={aof}), {given}, requests={n}, concurrency={c}, shards={}",
        args.shards
    );
    print_rows(&rows);
    println!(
        "memory per open permit (permit + task hash + stream entry + event record): {:.0} bytes; floor key alone: {:.0} bytes (INFO used_memory delta / {n})",
        memory.per_permit, memory.floor_key
    );
    println!(
        "accept with a cap / without: {:.2}x the rate; memory per capped accept {:.0} bytes (the cap's zset member included)",
        rows[4].rate / rows[2].rate,
        memory.per_capped
    );
    println!(
        "accept.lua with a cap / without under redis-benchmark (Redis alone): {:.2}x the rate",
        rows[6].rate / rows[1].rate
    );
    println!(
        "accept in bloom mode / permit mode: {:.2}x the rate; memory per open bloom accept {:.0} bytes (task, stream entry, index; no permit)",
        rows[5].rate / rows[2].rate,
        memory.per_bloom
    );
    println!(
        "p50/p99 of batch rows are per pipeline of {}; redis-benchmark latencies are its own (-P 1, {c} connections)",
        args.batch.max(1)
    );

    if args.memory_keys > 0 {
        let permits = bench_permits(&conn, &args, &ns).await?;
        crate::dedup_memory::run(&mut conn, &permits, args.memory_keys).await?;
    }
    if args.redis.is_some() {
        // Leave a shared Redis as found: drop this run's keys.
        cleanup(&mut conn, &ns).await?;
    }
    store.shutdown().await;
    let _ = std::fs::remove_dir_all(&tmp);
    Ok(())
}

/// Redis memory per key of the run, bytes (`INFO used_memory` deltas).
struct Memory {
    /// Per open permit (permit + task hash + stream entry + event record).
    per_permit: f64,
    /// Per key of the floor's bare `SET NX PX`.
    floor_key: f64,
    /// Per accept under one rolling cap (the cap's zset member included).
    per_capped: f64,
    /// Per accept in Bloom mode (no permit; the filters' share included).
    per_bloom: f64,
}

/// The six rows: the floor, the accept script under redis-benchmark, the
/// host's accept one call at a time, in pipelines, under a cap and in Bloom
/// mode; and the memory per key.
async fn measure_rows(
    store: &Store,
    conn: &mut RedisConn,
    args: &Args,
    ns: &str,
) -> anyhow::Result<([Row; 7], Memory)> {
    let (n, c, batch) = (
        args.requests.max(1),
        args.concurrency.max(1),
        args.batch.max(1),
    );
    let (floor, floor_key) =
        per_key(conn, n, async { redis_benchmark(store.url(), n, c, ns) }).await?;
    let permits = bench_permits(conn, args, ns).await?;
    let script_floor = redis_benchmark_accept(store.url(), n, c, &permits)?;
    let script_capped = redis_benchmark_capped_accept(store.url(), n, c, &permits)?;
    let (single, per_permit) = per_key(conn, n, host_accepts(&permits, n, c, 1, "s")).await?;
    let batched = host_accepts(&permits, n, c, batch, "b").await?;
    let (capped, per_capped) = per_key(conn, n, host_accepts(&permits, n, c, 1, "c")).await?;
    let (bloom, per_bloom) = per_key(conn, n, host_accepts(&permits, n, c, 1, "f")).await?;
    let rows = [
        named("redis-benchmark EVAL SET NX PX (floor)", floor),
        named("redis-benchmark EVALSHA accept.lua (same)", script_floor),
        named("host accept.lua, 1 multiplexed conn", single),
        named(format!("host accept_batch x{batch}, 1 conn"), batched),
        named("host accept.lua + 1 rolling cap, 1 conn", capped),
        named("host accept.lua bloom mode, 1 conn", bloom),
        named("redis-benchmark EVALSHA accept.lua + 1 cap", script_capped),
    ];
    let memory = Memory {
        per_permit,
        floor_key,
        per_capped,
        per_bloom,
    };
    Ok((rows, memory))
}

/// The permit layer under this run's namespace, its scripts loaded.
async fn bench_permits(conn: &RedisConn, args: &Args, ns: &str) -> anyhow::Result<Permits> {
    let permits = Permits::new(
        conn.clone(),
        PermitConfig {
            namespace: ns.to_string(),
            shards: args.shards,
            ..PermitConfig::default()
        },
    );
    permits.prepare().await?;
    Ok(permits)
}

/// Runs `step`, and the Redis memory it added per key (`n` keys).
async fn per_key<T>(
    conn: &mut RedisConn,
    n: usize,
    step: impl std::future::Future<Output = anyhow::Result<T>>,
) -> anyhow::Result<(T, f64)> {
    let before = used_memory(conn).await?;
    let out = step.await?;
    let added = used_memory(conn).await?.saturating_sub(before);
    Ok((out, added as f64 / n as f64))
}

fn named(what: impl Into<String>, row: Row) -> Row {
    Row {
        what: what.into(),
        ..row
    }
}

/// The table: each row against the floor (first row) and the accept script under redis-benchmark (second row).
fn print_rows(rows: &[Row]) {
    println!(
        "| {:<42} | {:>10} | {:>7} | {:>7} | {:>8} | {:>9} |",
        "what", "permits/s", "p50 ms", "p99 ms", "vs floor", "vs script"
    );
    println!(
        "|{:-<44}|{:->12}|{:->9}|{:->9}|{:->10}|{:->11}|",
        "", "", "", "", "", ""
    );
    for r in rows {
        println!(
            "| {:<42} | {:>10.0} | {:>7.3} | {:>7.3} | {:>8.2} | {:>9.2} |",
            r.what,
            r.rate,
            r.p50,
            r.p99,
            r.rate / rows[0].rate,
            r.rate / rows[1].rate
        );
    }
}

/// Runs `n` accepts (in pipelines of `batch`) from `c` concurrent tasks; latency per call.
pub(super) async fn host_accepts(
    permits: &Permits,
    n: usize,
    c: usize,
    batch: usize,
    tag: &str,
) -> anyhow::Result<Row> {
    let calls = n.div_ceil(batch);
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let start = Instant::now();
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..c {
        let permits = permits.clone();
        let next = next.clone();
        let tag = tag.to_string();
        set.spawn(async move {
            let mut lat = Vec::with_capacity(calls / c + 1);
            loop {
                let call = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if call >= calls {
                    break;
                }
                let reqs: Vec<AcceptRequest> = (call * batch..((call + 1) * batch).min(n))
                    .map(|i| request(&tag, i))
                    .collect();
                let t = Instant::now();
                let answers = if batch == 1 {
                    vec![permits.accept(&reqs[0]).await?]
                } else {
                    permits.accept_batch(&reqs).await?
                };
                lat.push(t.elapsed());
                if let Some(a) = answers
                    .iter()
                    .find(|a| !matches!(a, Acceptance::Accepted { .. }))
                {
                    bail!("a unique key was not accepted: {a:?}");
                }
            }
            Ok::<_, anyhow::Error>(lat)
        });
    }
    let mut lat: Vec<Duration> = Vec::with_capacity(calls);
    while let Some(res) = set.join_next().await {
        lat.extend(res??);
    }
    let elapsed = start.elapsed();
    lat.sort_unstable();
    let pct = |q: f64| crate::percentile(&lat, q).map_or(0.0, |d| d.as_secs_f64() * 1000.0);
    Ok(Row {
        what: String::new(),
        rate: n as f64 / elapsed.as_secs_f64(),
        p50: pct(0.50),
        p99: pct(0.99),
    })
}

/// The accepts of event `i` on `channels` channels (sms, inbox, push,
/// wechat, in that order): the requests share the event's text and name
/// its user in their keys, so they are one event in one shard.
pub(super) fn event_requests(tag: &str, i: usize, channels: usize) -> Vec<AcceptRequest> {
    let base = request(tag, i);
    ["sms", "inbox", "push", "wechat"]
        .iter()
        .take(channels)
        .map(|channel| AcceptRequest {
            key: base.key.replace(":sms:", &format!(":{channel}:")),
            channel: channel.to_string(),
            ..base.clone()
        })
        .collect()
}

/// Accepts `events` events of `channels` channels each, one `accept_batch`
/// per event, `c` at a time; fails if one is not accepted whole.
pub(super) async fn host_event_accepts(
    permits: &Permits,
    events: usize,
    c: usize,
    channels: usize,
    tag: &str,
) -> anyhow::Result<()> {
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..c {
        let permits = permits.clone();
        let next = next.clone();
        let tag = tag.to_string();
        set.spawn(async move {
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if i >= events {
                    return Ok::<_, anyhow::Error>(());
                }
                let answers = permits
                    .accept_batch(&event_requests(&tag, i, channels))
                    .await?;
                if let Some(a) = answers
                    .iter()
                    .find(|a| !matches!(a, Acceptance::Accepted { .. }))
                {
                    bail!("a unique key was not accepted: {a:?}");
                }
            }
        });
    }
    while let Some(res) = set.join_next().await {
        res??;
    }
    Ok(())
}

/// A realistic accept of a unique key.
pub(super) fn request(tag: &str, i: usize) -> AcceptRequest {
    let biz_id = format!("o-{tag}{i}");
    let user = format!("u-{}", i % 100_000);
    AcceptRequest {
        key: format!("push:per-event@1:sms:ORDER_SHIPPED:{biz_id}:{user}"),
        channel: "sms".into(),
        window: Duration::from_secs(24 * 3600),
        biz_type: "ORDER_SHIPPED".into(),
        biz_id: biz_id.clone(),
        // The text the host writes for a posted event (`event::event_json`).
        event_json: pushonce::event::event_json(&pushonce::event::Event {
            biz_type: "ORDER_SHIPPED".into(),
            biz_id: biz_id.clone(),
            user_id: user.clone(),
            occurred_at_ms: 1_718_000_000_000,
            attributes: vec![("carrier".into(), "SF".into())],
        })
        .into(),
        payload: format!(
            r#"{{"template":"order_shipped","params":{{"order":"{biz_id}","carrier":"SF"}}}}"#
        ),
        policy_name: "per-event".into(),
        policy_version: "1.0.0".into(),
        retry: RetryPolicy::default(),
        gate: gate_of(tag, &user),
        recipient: Some(user.clone()),
        send_at_ms: None,
    }
}

/// No cap and the permit mode, except for the bloom row (tag `f`) and the capped row (tag `c`): one rolling 24 h cap per
/// user and channel with room for every request (so every accept checks,
/// trims and counts, and none is refused).
fn gate_of(tag: &str, user: &str) -> pushonce::permit::Gate {
    if tag == "f" {
        // The bloom row: filters sized for a million keys at 0.001.
        return pushonce::permit::Gate {
            bloom: Some(pushonce::permit::BloomCheck {
                filter: "ORDER_SHIPPED:sms".into(),
                items: 1_000_000,
                false_positive: 0.001,
            }),
            ..Default::default()
        };
    }
    if tag != "c" {
        return pushonce::permit::Gate::default();
    }
    pushonce::permit::Gate {
        caps: vec![pushonce::permit::CapCheck {
            name: "bench".into(),
            subject: format!("{user}:sms"),
            max: 1_000_000,
            period: pushonce::permit::CapPeriod::Rolling(Duration::from_secs(24 * 3600)),
        }],
        quiet: None,
        bloom: None,
        digest: None,
    }
}

/// redis-benchmark running the host's accept script by SHA with the
/// benchmark's request shape; `__rand_int__` makes every key unique.
pub(super) fn redis_benchmark_accept(
    url: &str,
    n: usize,
    c: usize,
    permits: &Permits,
) -> anyhow::Result<Row> {
    run_redis_benchmark(url, n, c, &accept_command(permits))
}

/// [`redis_benchmark_accept`] under one rolling cap per (random) user with
/// room for every request: Redis's own cost of checking, trimming and
/// counting a cap.
pub(super) fn redis_benchmark_capped_accept(
    url: &str,
    n: usize,
    c: usize,
    permits: &Permits,
) -> anyhow::Result<Row> {
    let req = AcceptRequest {
        gate: gate_of("c", "u-__rand_int__"),
        ..request("g__rand_int__", 0)
    };
    run_redis_benchmark(url, n, c, &accept_command_of(permits, &[req]))
}

/// The command line of [`redis_benchmark_accept`]: `EVALSHA` of the accept
/// script with the benchmark's request shape, every key unique.
pub(super) fn accept_command(permits: &Permits) -> Vec<String> {
    accept_command_of(permits, &[request("f__rand_int__", 0)])
}

/// [`accept_command`] of one event on `channels` channels (one script call).
pub(super) fn event_accept_command(permits: &Permits, channels: usize) -> Vec<String> {
    accept_command_of(permits, &event_requests("f__rand_int__", 0, channels))
}

/// `EVALSHA` of the accept script with `reqs`' keys and arguments (one
/// event's channels, in the shard of the first).
fn accept_command_of(permits: &Permits, reqs: &[AcceptRequest]) -> Vec<String> {
    let Some(req) = reqs.first() else {
        return Vec::new();
    };
    let shard = permits
        .layout()
        .shard_for(&req.key, req.recipient.as_deref());
    let task_ids: Vec<String> = (0..reqs.len())
        .map(|i| format!("{shard}-{i}-__rand_int__"))
        .collect();
    let reqs: Vec<&AcceptRequest> = reqs.iter().collect();
    let (mut keys, args) = permits.accept_keys_and_args(&reqs, &task_ids);
    // A permit is named by its key's digest, which hides the key's
    // `__rand_int__`: the name gets it back in place of the digest's tail
    // (same length), so each call still takes a permit of its own.
    for req in &reqs {
        let name = permits.layout().permit_in(shard, &req.key);
        let digest = pushonce::permit::keys::permit_digest(&req.key);
        if let Some(k) = keys.iter_mut().find(|k| **k == name) {
            let tag = &name[..name.len() - digest.len()];
            *k = format!("{tag}{}__rand_int__", &digest[..20]);
        }
    }
    let mut command = vec![
        "EVALSHA".to_string(),
        pushonce::permit::accept::SCRIPT.get_hash().to_string(),
        keys.len().to_string(),
    ];
    command.extend(keys);
    command.extend(args);
    command
}

/// Runs redis-benchmark (a bare SET NX PX script) against the server behind `url`.
pub(super) fn redis_benchmark(url: &str, n: usize, c: usize, ns: &str) -> anyhow::Result<Row> {
    let command = [
        "EVAL".to_string(),
        "return redis.call('SET',KEYS[1],ARGV[1],'NX','PX',ARGV[2])".to_string(),
        "1".to_string(),
        format!("{ns}:floor:__rand_int__"),
        "v".to_string(),
        "600000".to_string(),
    ];
    run_redis_benchmark(url, n, c, &command)
}

/// Runs `redis-benchmark -n N -c C -P 1 -r 10^9 --csv <command…>`; returns its rate and latencies.
pub(super) fn run_redis_benchmark(
    url: &str,
    n: usize,
    c: usize,
    command: &[String],
) -> anyhow::Result<Row> {
    let mut cmd = Command::new("redis-benchmark");
    if let Some(path) = url
        .strip_prefix("redis+unix://")
        .or_else(|| url.strip_prefix("unix://"))
    {
        cmd.arg("-s")
            .arg(PathBuf::from(path.split('?').next().unwrap_or(path)));
    } else {
        cmd.arg("-u").arg(url);
    }
    cmd.args(["-n", &n.to_string(), "-c", &c.to_string(), "-P", "1"])
        .args(["-r", "1000000000", "--csv"])
        .args(command);
    let out = cmd
        .output()
        .context("running redis-benchmark (Debian/Ubuntu: apt-get install redis-tools)")?;
    if !out.status.success() {
        bail!(
            "redis-benchmark failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let text = String::from_utf8_lossy(&out.stdout);
    // "test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms","p95_latency_ms","p99_latency_ms","max_latency_ms"
    let row = text
        .lines()
        .rev()
        .find(|l| l.starts_with('"') && !l.starts_with("\"test\""))
        .with_context(|| format!("no result in redis-benchmark output: {text}"))?;
    // The test name may hold quotes and commas (JSON arguments): read the 7 numbers from the end.
    let mut cols: Vec<f64> = row
        .rsplitn(8, ',')
        .take(7)
        .map(|s| s.trim_matches('"').parse().unwrap_or(0.0))
        .collect();
    cols.reverse();
    if cols.len() < 6 {
        bail!("unexpected redis-benchmark row: {row}");
    }
    Ok(Row {
        what: String::new(),
        rate: cols[0],
        p50: cols[3],
        p99: cols[5],
    })
}

/// `MEMORY USAGE key SAMPLES 0`, bytes (0 for a missing key).
pub(super) async fn memory_usage(conn: &mut RedisConn, key: &str) -> anyhow::Result<u64> {
    let bytes: Option<u64> = redis::cmd("MEMORY")
        .arg("USAGE")
        .arg(key)
        .arg("SAMPLES")
        .arg(0)
        .query_async(conn)
        .await?;
    Ok(bytes.unwrap_or(0))
}

pub(super) async fn used_memory(conn: &mut RedisConn) -> anyhow::Result<u64> {
    Ok(info_field(conn, "memory", "used_memory").await?.parse()?)
}

pub(super) async fn info_field(
    conn: &mut RedisConn,
    section: &str,
    name: &str,
) -> anyhow::Result<String> {
    let info: String = redis::cmd("INFO").arg(section).query_async(conn).await?;
    field_of(&info, name)
        .map(str::to_string)
        .with_context(|| format!("INFO {section} has no {name}"))
}

/// The value of field `name` in an `INFO` answer (`name:value` lines).
pub(super) fn field_of<'a>(info: &'a str, name: &str) -> Option<&'a str> {
    info.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
        .map(str::trim)
}

/// Deletes every key of this run (SCAN + UNLINK).
async fn cleanup(conn: &mut RedisConn, ns: &str) -> anyhow::Result<()> {
    for pattern in [format!("{ns}:floor:*"), format!("{{{ns}:*")] {
        let keys = scan_keys(conn, &pattern, usize::MAX).await?;
        for chunk in keys.chunks(1000) {
            redis::cmd("UNLINK")
                .arg(chunk)
                .query_async::<()>(conn)
                .await?;
        }
    }
    Ok(())
}

/// Up to `most` keys matching `pattern` (`SCAN`).
pub(crate) async fn scan_keys(
    conn: &mut RedisConn,
    pattern: &str,
    most: usize,
) -> anyhow::Result<Vec<String>> {
    let mut found = Vec::new();
    let mut cursor: u64 = 0;
    loop {
        let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(10_000)
            .query_async(conn)
            .await?;
        found.extend(keys);
        if next == 0 || found.len() >= most {
            found.truncate(most);
            return Ok(found);
        }
        cursor = next;
    }
}
