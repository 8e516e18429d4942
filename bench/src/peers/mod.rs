//! `pushonce-bench peers`: pushonce's `webhook` channel and Svix's server
//! (`svix/svix-webhooks`, built from a local checkout) side by side on this
//! machine, delivering the same messages to the same local HTTP receiver
//! (issue 30, item 3).
//!
//! Each peer gets its own stores (Svix: PostgreSQL and Redis; pushonce:
//! Redis and its SQLite ledger), then three runs against it, one after the
//! other: a warm-up, a clean run (`--messages` posted from `--concurrency`
//! tasks while the server delivers; rate, CPU per message and latency come
//! from it), and a crash run (the same number of new messages; the server
//! is killed with SIGKILL once a third of them arrived, started again at
//! once, and the receiver watched until every message arrived and nothing
//! more came for `--settle`; messages that arrived more than once are
//! counted). CPU is read from `/proc/<pid>/stat` (utime + stime) of the
//! server and its stores before and after the clean run.

mod cpu;
mod poster;
mod pushonce_stack;
mod receiver;
mod svix;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;
use poster::{MakeRequest, Posting};
use pushonce_tests::redis::RedisServer;
use receiver::Receiver;

/// Arguments of `pushonce-bench peers`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// A checkout of `svix/svix-webhooks`; its `server/` is built with
    /// `cargo build --release -p svix-server` unless `--svix-bin` is given.
    #[arg(long)]
    svix_src: PathBuf,
    /// Cargo target directory of that build (default `<svix-src>/server/target`).
    #[arg(long)]
    svix_target: Option<PathBuf>,
    /// A built `svix-server` to run instead of building one.
    #[arg(long)]
    svix_bin: Option<PathBuf>,
    /// Messages of the clean run and of the crash run, per peer.
    #[arg(long, default_value_t = 5_000)]
    messages: usize,
    /// Messages delivered before the clean run (not measured).
    #[arg(long, default_value_t = 200)]
    warmup: usize,
    /// Concurrent POSTs.
    #[arg(long, default_value_t = 16)]
    concurrency: usize,
    /// Dispatcher workers of pushonce.
    #[arg(long, default_value_t = 32)]
    workers: usize,
    /// Longest wait for a run's messages to arrive.
    #[arg(long, default_value = "600s", value_parser = humantime::parse_duration)]
    timeout: Duration,
    /// After the crash run's last message arrived: how long nothing more may
    /// arrive before the duplicates are counted.
    #[arg(long, default_value = "15s", value_parser = humantime::parse_duration)]
    settle: Duration,
    /// Peers to run, in this order.
    #[arg(long, value_delimiter = ',', default_value = "svix,pushonce")]
    peers: Vec<Which>,
}

/// A peer under test.
#[derive(Debug, Clone, Copy, PartialEq, clap::ValueEnum)]
enum Which {
    /// Svix's server.
    Svix,
    /// pushonce with its `webhook` channel.
    Pushonce,
}

/// A running peer.
enum Peer {
    Svix(svix::SvixStack),
    Pushonce(pushonce_stack::PushonceStack),
}

impl Peer {
    fn name(&self) -> &'static str {
        match self {
            Peer::Svix(_) => "svix",
            Peer::Pushonce(_) => "pushonce",
        }
    }

    fn poster(&self) -> MakeRequest {
        match self {
            Peer::Svix(s) => s.poster(),
            Peer::Pushonce(p) => p.poster(),
        }
    }

    /// CPU seconds so far of the server process and of its stores.
    fn cpu(&self) -> (f64, f64) {
        match self {
            Peer::Svix(s) => (s.pid().map_or(0.0, cpu::own_s), s.stores_cpu_s()),
            Peer::Pushonce(p) => (p.serve.pid().map_or(0.0, cpu::own_s), p.stores_cpu_s()),
        }
    }

    fn kill9(&mut self) {
        match self {
            Peer::Svix(s) => s.kill9(),
            Peer::Pushonce(p) => p.serve.kill9(),
        }
    }

    async fn restart(&mut self) -> anyhow::Result<()> {
        match self {
            Peer::Svix(s) => s.restart().await,
            Peer::Pushonce(p) => p.serve.restart().await,
        }
    }
}

/// The process id of `redis`'s server (`INFO server`).
async fn redis_pid(redis: &RedisServer) -> anyhow::Result<u32> {
    let mut conn = redis.manager().await?;
    let info: String = redis::cmd("INFO")
        .arg("server")
        .query_async(&mut conn)
        .await?;
    info.lines()
        .find_map(|l| l.strip_prefix("process_id:"))
        .and_then(|p| p.trim().parse().ok())
        .context("no process_id in INFO server")
}

/// One peer's row.
#[derive(Default)]
struct Row {
    /// Messages delivered in the clean run.
    delivered: usize,
    /// Distinct messages at the receiver per second, first POST to last first arrival.
    rate: f64,
    /// CPU µs per message: the server process.
    server_us: f64,
    /// CPU µs per message: its stores.
    stores_us: f64,
    /// POST answered 2xx → first arrival, ms.
    p50: f64,
    p99: f64,
    /// Messages that arrived before their POST's answer was read.
    early: usize,
    /// Crash run: messages that arrived more than once, extra arrivals, missing messages.
    dup: usize,
    /// Of those, messages whose arrivals all carried the same id header.
    dup_same_id: usize,
    extra: usize,
    missed: usize,
    /// Crash run: POSTs retried (refused while the server was down).
    retries: usize,
    /// What failed, if something did.
    error: Option<String>,
}

impl Row {
    fn cpu_us(&self) -> f64 {
        self.server_us + self.stores_us
    }

    /// Messages delivered per CPU-second of server + stores.
    fn per_cpu_s(&self) -> f64 {
        1e6 / self.cpu_us()
    }
}

/// Run `pushonce-bench peers`.
pub fn run(args: Args) -> anyhow::Result<()> {
    let tmp = std::env::temp_dir().join(format!("pushonce-bench-peers-{}", std::process::id()));
    std::fs::create_dir_all(&tmp)?;
    let result = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(measure(&args, &tmp));
    let _ = std::fs::remove_dir_all(&tmp);
    result
}

async fn measure(args: &Args, tmp: &Path) -> anyhow::Result<()> {
    let bin = match &args.svix_bin {
        Some(bin) => bin.clone(),
        None => {
            let target = args
                .svix_target
                .clone()
                .unwrap_or_else(|| args.svix_src.join("server/target"));
            svix::build(&args.svix_src, &target)?
        }
    };
    let load_start = super::http::load_avg();
    let base = Instant::now();
    let recv = Receiver::start(base).await?;
    eprintln!("receiver on {}", recv.addr);
    let mut rows = Vec::new();
    for &which in &args.peers {
        let dir = tmp.join(format!("{which:?}").to_lowercase());
        let row = match run_peer(args, which, &bin, &dir, &recv, base).await {
            Ok(row) => row,
            Err(e) => Row {
                error: Some(format!("{e:#}")),
                ..Row::default()
            },
        };
        rows.push((which, row));
    }
    print(args, &rows, &load_start, &recv);
    Ok(())
}

/// Starts one peer, runs the warm-up, the clean run and the crash run.
async fn run_peer(
    args: &Args,
    which: Which,
    bin: &Path,
    dir: &Path,
    recv: &Receiver,
    base: Instant,
) -> anyhow::Result<Row> {
    let mut peer = match which {
        Which::Svix => Peer::Svix(svix::SvixStack::start(bin, dir, &recv.url("/svix")).await?),
        Which::Pushonce => Peer::Pushonce(
            pushonce_stack::PushonceStack::start(dir, &recv.url("/pushonce"), args.workers).await?,
        ),
    };
    let name = peer.name();
    eprintln!("{name}: started");
    if args.warmup > 0 {
        let posting = Posting::start(
            args.warmup,
            args.concurrency,
            &format!("{name}-warm"),
            base,
            args.timeout,
            peer.poster(),
        )?;
        wait_arrived(
            recv,
            &format!("{name}-warm"),
            args.warmup,
            &posting,
            args.timeout,
            &format!("{name} warm-up"),
        )
        .await?;
        posting.finish().await?;
    }
    let mut row = clean_run(args, &peer, recv, base).await?;
    crash_run(args, &mut peer, recv, base, &mut row).await?;
    if let Peer::Pushonce(p) = &mut peer {
        p.serve.terminate(Duration::from_secs(30)).await?;
    }
    Ok(row)
}

/// Waits until `n` distinct messages of run `tag` arrived, printing progress every 5 s.
async fn wait_arrived(
    recv: &Receiver,
    tag: &str,
    n: usize,
    posting: &Posting,
    timeout: Duration,
    what: &str,
) -> anyhow::Result<()> {
    let start = Instant::now();
    let mut said = start;
    loop {
        let (distinct, _, _) = recv.count(tag);
        if distinct >= n {
            return Ok(());
        }
        anyhow::ensure!(
            start.elapsed() < timeout,
            "{what}: {distinct} of {n} messages at the receiver after {timeout:?} ({} accepted)",
            posting.accepted()
        );
        if said.elapsed() >= Duration::from_secs(5) {
            eprintln!(
                "  {what}: {} of {n} accepted, {distinct} at the receiver",
                posting.accepted()
            );
            said = Instant::now();
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The clean run: rate, CPU per message, latency.
async fn clean_run(
    args: &Args,
    peer: &Peer,
    recv: &Receiver,
    base: Instant,
) -> anyhow::Result<Row> {
    let name = peer.name();
    let tag = format!("{name}-clean");
    let n = args.messages;
    let before = peer.cpu();
    let t0 = base.elapsed();
    let posting = Posting::start(n, args.concurrency, &tag, base, args.timeout, peer.poster())?;
    wait_arrived(
        recv,
        &tag,
        n,
        &posting,
        args.timeout,
        &format!("{name} clean run"),
    )
    .await?;
    let after = peer.cpu();
    let answered = posting.finish().await?;
    let answered = answered.lock().unwrap();
    let arrivals = recv.of(&tag);
    let mut lat = Vec::with_capacity(n);
    let mut early = 0;
    let mut last = Duration::ZERO;
    for (seq, times) in &arrivals {
        let first = times.iter().map(|a| a.at).min().unwrap_or_default();
        last = last.max(first);
        if let Some(&ok) = answered.get(seq) {
            if first < ok {
                early += 1;
            }
            lat.push(first.saturating_sub(ok));
        }
    }
    lat.sort_unstable();
    let ms = |q: f64| crate::percentile(&lat, q).map_or(f64::NAN, |d| d.as_secs_f64() * 1e3);
    let delivered = arrivals.len();
    let per = |s: f64| s * 1e6 / delivered.max(1) as f64;
    eprintln!("{name}: clean run done, {delivered} messages");
    Ok(Row {
        delivered,
        rate: delivered as f64 / last.saturating_sub(t0).as_secs_f64(),
        server_us: per(after.0 - before.0),
        stores_us: per(after.1 - before.1),
        p50: ms(0.5),
        p99: ms(0.99),
        early,
        ..Row::default()
    })
}

/// The crash run: kill -9 once a third arrived, restart, count duplicates.
async fn crash_run(
    args: &Args,
    peer: &mut Peer,
    recv: &Receiver,
    base: Instant,
    row: &mut Row,
) -> anyhow::Result<()> {
    let name = peer.name();
    let tag = format!("{name}-kill");
    let n = args.messages;
    let posting = Posting::start(n, args.concurrency, &tag, base, args.timeout, peer.poster())?;
    wait_arrived(
        recv,
        &tag,
        n / 3,
        &posting,
        args.timeout,
        &format!("{name} crash run, before the kill"),
    )
    .await?;
    peer.kill9();
    let (at_kill, _, _) = recv.count(&tag);
    eprintln!("{name}: killed (SIGKILL) with {at_kill} of {n} at the receiver; starting it again");
    peer.restart().await?;
    let waited = wait_arrived(
        recv,
        &tag,
        n,
        &posting,
        args.timeout,
        &format!("{name} crash run, after the restart"),
    )
    .await;
    let retries = posting.retries.load(std::sync::atomic::Ordering::Relaxed);
    if waited.is_ok() {
        posting.finish().await?;
        // Nothing more may arrive for `settle`: a message redelivered late
        // (an unacknowledged queue entry, an expired lease) is counted.
        let start = Instant::now();
        loop {
            let (_, _, last) = recv.count(&tag);
            if base.elapsed().saturating_sub(last) >= args.settle || start.elapsed() > args.timeout
            {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    let arrivals = recv.of(&tag);
    row.dup = arrivals.values().filter(|t| t.len() > 1).count();
    row.dup_same_id = arrivals
        .values()
        .filter(|t| t.len() > 1 && t.iter().all(|a| a.id == t[0].id))
        .count();
    row.extra = arrivals.values().map(|t| t.len().saturating_sub(1)).sum();
    row.missed = n.saturating_sub(arrivals.len());
    row.retries = retries;
    eprintln!(
        "{name}: crash run done: {} distinct, {} received twice or more, {} missing",
        arrivals.len(),
        row.dup,
        row.missed
    );
    Ok(())
}

/// `git rev-parse HEAD` of this repository.
fn own_commit() -> String {
    svix::commit(Path::new(env!("CARGO_MANIFEST_DIR")))
}

/// Prints the header, the table and the ratio.
fn print(args: &Args, rows: &[(Which, Row)], load_start: &str, recv: &Receiver) {
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    println!(
        "pushonce-bench peers: pushonce {} ({}), svix-webhooks {}; {cores} cores, loadavg at start {load_start}, at end {}",
        own_commit(),
        if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        },
        svix::commit(&args.svix_src),
        super::http::load_avg()
    );
    println!(
        "per peer: {} warm-up messages, then a clean run of {} messages and a crash run of {} (SIGKILL of the server once a third arrived, restarted at once, then {:?} with nothing new); {} concurrent POSTs from the bench, each retried with its key until 2xx; one local HTTP/1.1 receiver in the bench process answering 200",
        args.warmup, args.messages, args.messages, args.settle, args.concurrency
    );
    println!(
        "svix: svix-server (queue and cache in Redis, PostgreSQL fsync on, SVIX_WHITELIST_SUBNETS=[127.0.0.1/32]), POST /api/v1/app/<app>/msg/ with idempotency-key; pushonce: pushonce serve, workers={}, webhook channel (allow_plaintext), POST /v1/events (biz_id = the key), Redis AOF everysec for both, SQLite ledger",
        args.workers
    );
    let table: Vec<[String; 12]> = rows
        .iter()
        .map(|(which, r)| {
            let name = format!("{which:?}").to_lowercase();
            if let Some(e) = &r.error {
                let mut cells: [String; 12] = Default::default();
                cells[0] = name;
                cells[11] = format!("FAILED: {e}");
                return cells;
            }
            [
                name,
                r.delivered.to_string(),
                format!("{:.0}", r.rate),
                format!("{:.0}", r.cpu_us()),
                format!("{:.0}", r.server_us),
                format!("{:.0}", r.stores_us),
                format!("{:.0}", r.per_cpu_s()),
                format!("{:.1}", r.p50),
                format!("{:.1}", r.p99),
                format!("{} ({} extra; {} same id)", r.dup, r.extra, r.dup_same_id),
                r.missed.to_string(),
                format!(
                    "{} arrived before their 2xx was read; crash run: {} POSTs retried",
                    r.early, r.retries
                ),
            ]
        })
        .collect();
    pushonce::cli::output::print_table(
        &[
            "PEER",
            "MESSAGES",
            "DELIVERED/S",
            "CPU µS/MSG",
            "SERVER µS",
            "STORES µS",
            "MSG PER CPU-S",
            "P50 MS",
            "P99 MS",
            "TWICE AFTER KILL -9",
            "MISSING",
            "NOTE",
        ],
        &table,
    );
    let ok = |w: Which| {
        rows.iter()
            .find(|(x, r)| *x == w && r.error.is_none())
            .map(|(_, r)| r)
    };
    if let (Some(p), Some(s)) = (ok(Which::Pushonce), ok(Which::Svix)) {
        println!(
            "pushonce / svix: messages per CPU-second {:.2}x (target >= 1.5x), delivered messages/s {:.2}x",
            p.per_cpu_s() / s.per_cpu_s(),
            p.rate / s.rate
        );
    }
    if recv.unnamed() > 0 {
        println!(
            "the receiver also got {} requests naming no message (data.seq)",
            recv.unnamed()
        );
    }
}
