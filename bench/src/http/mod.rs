//! `pushonce-bench http`: the whole host measured the way its users see it,
//! against the floor Redis sets on the same machine in the same run.
//!
//! Starts an embedded Redis (AOF on, as in production), the provider
//! simulator of the test harness (real TLS, each provider's documented
//! protocol, signatures verified), and the host as its own `pushonce serve`
//! process configured by the test harness (`ServeConfig`: the six real
//! channel plugins sending to the simulator); drives `POST /v1/events` from
//! `pushonce-bench load` run as a separate process; prints one table where
//! every rate is also a ratio to `redis-benchmark`'s bare `SET NX PX` script
//! at the same concurrency.
//!
//! Two phases, each with its own host process: `api` — the host with
//! `dispatch = false` (the accept path alone; its backlog is dropped with
//! `FLUSHALL` afterwards), then `full` — the host as deployed by default,
//! dispatching while it accepts, its backlog delivered between runs, and the
//! end-to-end rows. A run that fails is a table line with its error; the
//! other runs go on.

mod cost;
mod report;
mod runs;
mod stack;
mod targets;

pub(crate) use report::load_avg;

use std::collections::BTreeMap;

use anyhow::Context;
use std::path::Path;
use std::time::Duration;

use super::permit::{self, Row};
use pushonce::permit::{PermitConfig, Permits};
use report::Line;
use runs::PhaseRuns;
use stack::BenchStack;

/// Arguments of `pushonce-bench http`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Concurrencies of the HTTP runs (and of the floor).
    #[arg(long, value_delimiter = ',', default_value = "1,16,64,256")]
    concurrency: Vec<usize>,
    /// Longest HTTP run.
    #[arg(long, default_value = "3s", value_parser = humantime::parse_duration)]
    duration: Duration,
    /// Most requests per HTTP run.
    #[arg(long, default_value_t = 30_000)]
    requests: usize,
    /// Requests of each redis-benchmark run (a fifth of it at concurrency 1).
    #[arg(long, default_value_t = 100_000)]
    floor_requests: usize,
    /// Events of each end-to-end run.
    #[arg(long, default_value_t = 3_000)]
    e2e_events: usize,
    /// Dispatcher workers of the host.
    #[arg(long, default_value_t = 32)]
    workers: usize,
    /// Longest wait for the dispatcher to deliver a run's backlog before the next run.
    #[arg(long, default_value = "300s", value_parser = humantime::parse_duration)]
    drain_timeout: Duration,
    /// Skip the half-duplicate runs.
    #[arg(long)]
    no_dup: bool,
    /// The host in its lean configuration: `event_index = false` (the
    /// default: as shipped).
    #[arg(long)]
    lean: bool,
    /// Phases to run: `api` (host with `dispatch = false`: the accept path
    /// alone) and `full` (the host dispatching while it accepts, end to end).
    #[arg(long, value_delimiter = ',', default_value = "api,full")]
    phases: Vec<Phase>,
}

/// A phase: one host process and its runs.
#[derive(Debug, Clone, Copy, PartialEq, clap::ValueEnum)]
enum Phase {
    /// The host with `dispatch = false`: the accept path alone.
    Api,
    /// The host dispatching while it accepts; end-to-end rows.
    Full,
}

impl Phase {
    /// Its name on the command line and in the table.
    fn name(self) -> &'static str {
        match self {
            Phase::Api => "api",
            Phase::Full => "full",
        }
    }
}

/// Run `pushonce-bench http`.
pub fn run(args: Args) -> anyhow::Result<()> {
    let tmp = std::env::temp_dir().join(format!("pushonce-bench-http-{}", std::process::id()));
    std::fs::create_dir_all(&tmp)?;
    let result = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(measure_http(&args, &tmp));
    let _ = std::fs::remove_dir_all(&tmp);
    result
}

/// The floor at each concurrency: `redis-benchmark` running a bare `SET NX PX` script.
pub(super) struct Floors(BTreeMap<usize, Row>);

impl Floors {
    /// Measures the floor at every concurrency of the run.
    fn measure(redis_url: &str, args: &Args) -> anyhow::Result<Floors> {
        let mut floors = BTreeMap::new();
        for &c in &args.concurrency {
            let n = if c == 1 {
                args.floor_requests / 5
            } else {
                args.floor_requests
            };
            let row = permit::redis_benchmark(redis_url, n.max(1), c, "benchfloor")?;
            eprintln!("floor c={c}: {:.0}/s", row.rate);
            floors.insert(c, row);
        }
        Ok(Floors(floors))
    }

    /// The floor at concurrency `c` (the nearest measured below it).
    fn at(&self, c: usize) -> f64 {
        self.0
            .range(..=c)
            .next_back()
            .or_else(|| self.0.iter().next())
            .map(|(_, r)| r.rate)
            .unwrap_or(f64::NAN)
    }

    /// The floors as table lines.
    fn lines(&self) -> Vec<Line> {
        self.0
            .iter()
            .map(|(c, r)| Line {
                what: "redis-benchmark EVAL SET NX PX (floor), calls/s".into(),
                c: *c,
                rate: r.rate,
                p50: r.p50,
                p99: r.p99,
                p999: f64::NAN,
                floor: r.rate,
                redis_us: f64::NAN,
                host_us: f64::NAN,
                note: "-P 1".into(),
            })
            .collect()
    }
}

/// What the run found besides its table lines.
struct Notes {
    /// Redis memory per open permit, bytes.
    per_permit: f64,
    /// Per open permit of 4-channel events (the event stored once for four permits).
    per_permit_four: f64,
    /// Per open permit of 1-channel events from an empty Redis: with the
    /// embedded Redis's `hash-max-listpack-value` (1024), and with Redis's
    /// default (64), as an operator's own or a managed Redis has it.
    listpack: (f64, f64),
    /// Where the bytes of the first of those runs go, by key kind.
    anatomy: String,
    /// Per phase: host RSS once it serves (idle), after its runs, and its peak (MiB).
    rss: Vec<(Phase, f64, (f64, f64))>,
    /// The accept script's profile (Redis µs per call), with its error if it failed.
    profile: anyhow::Result<Vec<cost::ProfileLine>>,
    /// Redis memory a delivered message keeps, and Redis's commands per
    /// delivered message (phase full).
    delivered: Option<Delivered>,
}

/// What the 1-channel end-to-end run found: memory, and Redis's commands
/// per message with the number of messages.
type Delivered = (runs::DeliveredMemory, Option<cost::PerMessage>);

impl Default for Notes {
    fn default() -> Notes {
        Notes {
            per_permit: f64::NAN,
            per_permit_four: f64::NAN,
            listpack: (f64::NAN, f64::NAN),
            anatomy: String::new(),
            rss: Vec::new(),
            profile: Ok(Vec::new()),
            delivered: None,
        }
    }
}

async fn measure_http(args: &Args, tmp: &Path) -> anyhow::Result<()> {
    let load_start = report::load_avg();
    let mut stack = BenchStack::start(tmp).await?;
    eprintln!(
        "simulator on {}, redis {}",
        stack.sim.addr,
        stack.store.url()
    );
    let floors = Floors::measure(stack.store.url(), args)?;
    let mut lines = floors.lines();
    let mut notes = Notes::default();
    permit_layer(&mut stack, args, &floors, &mut lines, &mut notes).await;
    for &phase in &args.phases {
        match run_phase(&mut stack, args, &floors, phase).await {
            Ok((phase_lines, rss, delivered)) => {
                lines.extend(phase_lines);
                notes.rss.push(rss);
                notes.delivered = notes.delivered.take().or(delivered);
            }
            Err(e) => lines.push(Line::failed(format!("phase {}", phase.name()), 0, &e)),
        }
    }
    print_report(&mut stack, args, &lines, &notes, &load_start).await?;
    stack.store.shutdown().await;
    Ok(())
}

/// The permit layer alone: `accept.lua` under `redis-benchmark`, and through
/// the host's Redis layer one call at a time and in pipelines.
async fn permit_layer(
    stack: &mut BenchStack,
    args: &Args,
    floors: &Floors,
    lines: &mut Vec<Line>,
    notes: &mut Notes,
) {
    let pc = 64;
    let what = "accept.lua (redis-benchmark and Permits::accept direct)".to_string();
    if let Err(e) = permit_rows(stack, args, floors, pc, lines, notes).await {
        lines.push(Line::failed(what, pc, &e));
    }
    if let Err(e) = drop_everything(stack).await {
        lines.push(Line::failed("before the profile".into(), 0, &e));
    }
    eprintln!("profiling accept.lua (INFO commandstats; 5 scripts, 3 rounds) …");
    let permits = Permits::new(
        stack.conn.clone(),
        PermitConfig {
            namespace: "benchq".into(),
            ..PermitConfig::default()
        },
    );
    let url = stack.store.url().to_string();
    // Each row runs three times: half the requests each.
    let n = (args.floor_requests / 2).max(1);
    notes.profile = cost::accept_profile(&mut stack.conn, &url, n, pc, &permits).await;
    if let Err(e) = drop_everything(stack).await {
        lines.push(Line::failed("after the permit layer".into(), 0, &e));
    }
}

/// Bytes per open permit of `n` 1-channel accepts from an empty Redis,
/// with the embedded Redis's `hash-max-listpack-value` (1024) and with
/// Redis's default (64), as a Redis an operator brings has it; the setting
/// is restored after. Each run starts from `FLUSHALL`, so neither pays for
/// the other's dictionary growth.
async fn listpack_rows(
    stack: &mut BenchStack,
    permits: &Permits,
    n: usize,
    pc: usize,
) -> anyhow::Result<((f64, f64), String)> {
    let setting = "hash-max-listpack-value";
    let (_, raised): (String, String) = redis::cmd("CONFIG")
        .arg("GET")
        .arg(setting)
        .query_async(&mut stack.conn)
        .await?;
    let mut found = Vec::new();
    let mut anatomy = String::new();
    for value in [raised.clone(), "64".to_string()] {
        drop_everything(stack).await?;
        config_set(&mut stack.conn, setting, &value).await?;
        // Read again: accept.lua writes pieces of the setting's length.
        permits.prepare().await?;
        let before = permit::used_memory(&mut stack.conn).await?;
        let run = permit::host_accepts(permits, n, pc, 1, "d").await;
        let after = permit::used_memory(&mut stack.conn).await?;
        config_set(&mut stack.conn, setting, &raised).await?;
        run?;
        found.push(after.saturating_sub(before) as f64 / n as f64);
        if anatomy.is_empty() {
            let kinds =
                crate::anatomy::kinds(&mut stack.conn, permits.layout().namespace()).await?;
            anatomy = crate::anatomy::line(&kinds, n as u64);
        }
    }
    drop_everything(stack).await?;
    permits.prepare().await?;
    Ok(((found[0], found[1]), anatomy))
}

/// `CONFIG SET name value`.
async fn config_set(conn: &mut pushonce::RedisConn, name: &str, value: &str) -> anyhow::Result<()> {
    redis::cmd("CONFIG")
        .arg("SET")
        .arg(name)
        .arg(value)
        .query_async::<()>(conn)
        .await?;
    Ok(())
}

async fn permit_rows(
    stack: &mut BenchStack,
    args: &Args,
    floors: &Floors,
    pc: usize,
    lines: &mut Vec<Line>,
    notes: &mut Notes,
) -> anyhow::Result<()> {
    let permits = Permits::new(
        stack.conn.clone(),
        PermitConfig {
            namespace: "benchp".into(),
            ..PermitConfig::default()
        },
    );
    permits.prepare().await?;
    let n = args.floor_requests;
    let script = permit::redis_benchmark_accept(stack.store.url(), n, pc, &permits)?;
    let before = permit::used_memory(&mut stack.conn).await?;
    let single = permit::host_accepts(&permits, n, pc, 1, "s").await?;
    let after = permit::used_memory(&mut stack.conn).await?;
    notes.per_permit = after.saturating_sub(before) as f64 / n as f64;
    let events = (n / 4).max(1);
    let before = permit::used_memory(&mut stack.conn).await?;
    permit::host_event_accepts(&permits, events, pc, 4, "q").await?;
    let after = permit::used_memory(&mut stack.conn).await?;
    notes.per_permit_four = after.saturating_sub(before) as f64 / (4 * events) as f64;
    (notes.listpack, notes.anatomy) = listpack_rows(stack, &permits, n, pc).await?;
    let batched = permit::host_accepts(&permits, n, pc, 16, "b").await?;
    for (what, row, note) in [
        (
            "redis-benchmark EVALSHA accept.lua, calls/s",
            script,
            "-P 1",
        ),
        (
            "Permits::accept direct, permits/s",
            single,
            "1 multiplexed conn",
        ),
        (
            "Permits::accept_batch x16 direct, permits/s",
            batched,
            "latency per pipeline",
        ),
    ] {
        lines.push(Line {
            what: what.into(),
            c: pc,
            rate: row.rate,
            p50: row.p50,
            p99: row.p99,
            p999: f64::NAN,
            floor: floors.at(pc),
            redis_us: f64::NAN,
            host_us: f64::NAN,
            note: note.into(),
        });
    }
    Ok(())
}

/// One phase: starts its host, runs its HTTP runs, stops the host; then
/// (API only) drops the backlog so the next phase starts on an empty Redis.
async fn run_phase(
    stack: &mut BenchStack,
    args: &Args,
    floors: &Floors,
    phase: Phase,
) -> anyhow::Result<(Vec<Line>, (Phase, f64, (f64, f64)), Option<Delivered>)> {
    let dispatch = phase == Phase::Full;
    let name = phase.name();
    let mut host = stack.serve(name, args.workers, dispatch, args.lean).await?;
    eprintln!("host ({name}) on {}", host.base());
    let (rss_idle, _) = report::rss_of(host.pid());
    let mut runs = PhaseRuns {
        args,
        stack,
        floors,
        host: &host,
        dispatch,
        expected: stack.delivered(),
        delivered_memory: None,
        redis_per_message: None,
        api_commands: Vec::new(),
    };
    let mut lines = runs.lines().await;
    let delivered = runs
        .delivered_memory
        .take()
        .map(|m| (m, runs.redis_per_message.take()));
    for (what, per_event) in &runs.api_commands {
        per_event.print(what);
    }
    let rss_after = report::rss_of(host.pid());
    // A failure from here on is a line of its own: the phase's runs stay.
    let stop = host
        .terminate(Duration::from_secs(60))
        .await
        .with_context(|| format!("stopping the host of phase {name}"));
    if let Err(e) = stop {
        lines.push(Line::failed(format!("phase {name}, end"), 0, &e));
    }
    if !dispatch && let Err(e) = drop_everything(stack).await {
        lines.push(Line::failed(format!("phase {name}, end"), 0, &e));
    }
    Ok((lines, (phase, rss_idle, rss_after), delivered))
}

/// Empties Redis for what comes next: `FLUSHALL ASYNC` (a large Redis
/// answers at once), then waits until its background thread freed the keys
/// (`lazyfree_pending_objects` 0), so the next run does not share the CPU
/// with it.
async fn drop_everything(stack: &mut BenchStack) -> anyhow::Result<()> {
    redis::cmd("FLUSHALL")
        .arg("ASYNC")
        .query_async::<()>(&mut stack.conn)
        .await
        .context("emptying Redis (FLUSHALL ASYNC)")?;
    let what = "Redis to free the keys of FLUSHALL ASYNC";
    let fields = ["lazyfree_pending_objects"];
    cost::until_zero(
        &mut stack.conn,
        "memory",
        &fields,
        Duration::from_secs(120),
        what,
    )
    .await
}

/// Prints the header, the table and the notes.
async fn print_report(
    stack: &mut BenchStack,
    args: &Args,
    lines: &[Line],
    notes: &Notes,
    load_start: &str,
) -> anyhow::Result<()> {
    let conn = &mut stack.conn;
    let version = permit::info_field(conn, "server", "redis_version").await?;
    let aof = permit::info_field(conn, "persistence", "aof_enabled").await?;
    let redis_rss = permit::info_field(conn, "memory", "used_memory_rss").await?;
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    println!(
        "pushonce-bench http: redis {version} (aof_enabled={aof}, embedded), {cores} cores, loadavg at start {load_start}, at end {}",
        report::load_avg()
    );
    println!(
        "runs: ≤{} requests or ≤{:?} each; host = separate `pushonce serve` process, workers={} (phase api: dispatch = false; full: dispatching){}; channels = the real plugins over TLS to the simulator; load generator = separate process, 1 thread",
        args.requests,
        args.duration,
        args.workers,
        if args.lean {
            ", lean: event_index = false"
        } else {
            ", as shipped"
        }
    );
    report::print(lines);
    for (phase, idle, (after, peak)) in &notes.rss {
        println!(
            "host RSS, phase {} (the `pushonce serve` process alone, all plugins loaded): {idle:.1} MiB once it serves (idle); {after:.1} MiB after the phase's HTTP runs (VmHWM peak {peak:.1} MiB)",
            phase.name()
        );
    }
    println!(
        "redis memory per open permit (permit + task hash + stream entry + its event record, which is its index): {:.0} bytes (used_memory delta / {}); of 4-channel events (one record and index for four permits) {:.0} bytes; from an empty Redis, {:.0} bytes at the embedded Redis's hash-max-listpack-value 1024 and {:.0} at Redis's default 64; redis used_memory_rss now {:.1} MiB",
        notes.per_permit,
        args.floor_requests,
        notes.per_permit_four,
        notes.listpack.0,
        notes.listpack.1,
        redis_rss.parse::<f64>().unwrap_or(0.0) / 1048576.0
    );
    println!(
        "where an open permit's bytes go (1-channel events, hash-max-listpack-value 1024; MEMORY USAGE by key kind; a stream is one key per shard): {}",
        notes.anatomy
    );
    println!("warm derive-key cost: `pushonce-bench plugins` (the plugin layer alone)");
    if let Some((d, _)) = &notes.delivered {
        println!(
            "redis bytes kept per delivered message after it ended (1 channel, end-to-end run, its SMS receipts posted back): {:.0} bytes (mean of {}: permit {:.0} in used_memory per copy, {:.0} by MEMORY USAGE; task record {:.0}, event record {:.0} by MEMORY USAGE; {} of them still in Redis); used_memory delta over the run / messages: {:.0} bytes",
            d.kept(),
            d.sampled,
            d.permit_cost,
            d.permit,
            d.task,
            d.index,
            d.in_redis,
            d.per_message,
        );
        let others: Vec<String> = d.others.iter().map(|(k, n)| format!("{k} {n}")).collect();
        println!("  other keys in Redis after it: {}", others.join(", "));
        println!("  the growth over the run, per message: {}", d.growth);
    }
    println!();
    cost::print_profile(&notes.profile);
    if let Some((_, Some(per_message))) = &notes.delivered {
        println!();
        per_message.print("delivered, 1-channel end-to-end run");
    }
    println!();
    targets::print(lines, notes, args.lean);
    Ok(())
}
