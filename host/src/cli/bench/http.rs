//! `pushonce bench http`: the whole host measured the way its users see it,
//! against the floor Redis sets on the same machine in the same run. Starts an
//! embedded Redis (AOF on, as in production), the provider simulator (the
//! `provider-sim` binary, a separate process), and the host in-process
//! (`service::start` on 127.0.0.1:0, channel plugins sending to the
//! simulator); drives `POST /v1/events` from `pushonce bench load` run as a
//! separate process; prints one table where every rate is also a ratio to
//! `redis-benchmark`'s bare `SET NX PX` script at the same concurrency.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

use super::load::Report;
use super::permit::{self, Row};
use crate::config::{ChannelConfig, HostConfig};
use crate::permit::{PermitConfig, Permits};
use crate::route::Live;
use crate::send::plugin::PluginSender;
use crate::service::{self, ServiceOptions};
use crate::store::{RedisTarget, Store};

/// Arguments of `pushonce bench http`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Plugin directory (key policies and the four channel plugins) [default: $PUSHONCE_PLUGIN_DIR or target/plugins].
    #[arg(long)]
    plugin_dir: Option<PathBuf>,
    /// The `provider-sim` binary [default: next to this executable].
    #[arg(long)]
    sim: Option<PathBuf>,
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
    #[arg(long, default_value = "120s", value_parser = humantime::parse_duration)]
    drain_timeout: Duration,
    /// Skip the half-duplicate runs.
    #[arg(long)]
    no_dup: bool,
}

/// One line of the table.
struct Line {
    /// What was measured.
    what: String,
    /// Concurrency (0: not applicable).
    c: usize,
    /// Rate (unit in `what`).
    rate: f64,
    /// Latency percentiles, ms (NaN: not measured).
    p50: f64,
    p99: f64,
    p999: f64,
    /// The floor it is compared with.
    floor: f64,
    /// A remark.
    note: String,
}

/// Run `pushonce bench http`.
pub fn run(args: Args) -> anyhow::Result<()> {
    let tmp = PathBuf::from(format!("/tmp/pob-{}", std::process::id()));
    std::fs::create_dir_all(&tmp)?;
    let result = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(bench(&args, &tmp));
    let _ = std::fs::remove_dir_all(&tmp);
    result
}

/// The simulator child, killed when dropped.
struct SimProcess(Child);

impl Drop for SimProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn sibling(name: &str) -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe()?;
    Ok(exe.with_file_name(name))
}

fn start_sim(path: &Path) -> anyhow::Result<(SimProcess, String)> {
    let mut child = Command::new(path)
        .args(["--listen", "127.0.0.1:0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .with_context(|| {
            format!(
                "starting {} (build it: cargo build -p provider-sim)",
                path.display()
            )
        })?;
    let mut line = String::new();
    BufReader::new(child.stdout.take().context("simulator stdout")?).read_line(&mut line)?;
    let addr = line
        .trim()
        .strip_prefix("listening on ")
        .with_context(|| format!("unexpected simulator output {line:?}"))?
        .to_string();
    Ok((SimProcess(child), addr))
}

/// The two bench policies: one channel and four channels, per-event keys.
fn write_policies(dir: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir)?;
    for (file, biz_type, channels) in [
        ("bench-one.toml", "BENCH_ONE", r#"["sms"]"#),
        (
            "bench-four.toml",
            "BENCH_FOUR",
            r#"["inbox", "sms", "wechat", "app-push"]"#,
        ),
    ] {
        std::fs::write(
            dir.join(file),
            format!(
                "biz_type = \"{biz_type}\"\nkey_policy = \"per-event@^1\"\nchannels = {channels}\nwindow = \"24h\"\n\n[retry]\nmax_attempts = 5\nbackoff = {{ initial = \"1s\", factor = 2.0, max = \"1m\", jitter = true }}\n"
            ),
        )?;
    }
    Ok(())
}

fn channels(sim: &str) -> BTreeMap<String, ChannelConfig> {
    let endpoint = format!("http://{sim}");
    let mut out = BTreeMap::new();
    for (name, extra) in [
        ("inbox", vec![]),
        ("sms", vec![("sign_name", "pushonce")]),
        ("app-push", vec![("project", "pushonce-bench")]),
        ("wechat", vec![("app_id", "wx-bench")]),
    ] {
        let mut c = ChannelConfig::new(&format!("{name}@^1"));
        c.settings.insert("endpoint".into(), endpoint.clone());
        for (k, v) in extra {
            c.settings.insert(k.into(), v.into());
        }
        if name == "wechat" {
            c.secrets_from_env
                .insert("app_secret".into(), "BENCH_WECHAT_SECRET".into());
        }
        c.allowed_hosts = vec![sim.to_string()];
        out.insert(name.to_string(), c);
    }
    out
}

type HttpClient = Client<HttpConnector, Empty<Bytes>>;

async fn get_json(client: &HttpClient, url: &str) -> anyhow::Result<serde_json::Value> {
    let res = client.get(url.parse()?).await?;
    let bytes = res.into_body().collect().await?.to_bytes();
    Ok(serde_json::from_slice(&bytes)?)
}

/// Messages the simulator accepted so far, all providers.
async fn delivered(client: &HttpClient, sim: &str) -> anyhow::Result<u64> {
    let stats = get_json(client, &format!("http://{sim}/_sim/stats")).await?;
    Ok(stats
        .as_object()
        .map(|m| {
            m.iter()
                .filter(|(k, _)| k.ends_with(".accepted"))
                .filter_map(|(_, v)| v.as_u64())
                .sum()
        })
        .unwrap_or(0))
}

/// Waits until the simulator has `expected` messages; false on timeout.
async fn drain(
    client: &HttpClient,
    sim: &str,
    expected: u64,
    timeout: Duration,
) -> anyhow::Result<bool> {
    let until = Instant::now() + timeout;
    while delivered(client, sim).await? < expected {
        if Instant::now() > until {
            return Ok(false);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(true)
}

/// Runs the load generator as a separate process and reads its report.
#[allow(clippy::too_many_arguments)]
async fn load(
    url: &str,
    biz_type: &str,
    channels: &str,
    c: usize,
    requests: usize,
    duration: Duration,
    dup: bool,
    tag: &str,
    rate: f64,
) -> anyhow::Result<Report> {
    let mut cmd = tokio::process::Command::new(std::env::current_exe()?);
    cmd.args(["bench", "load", "--url", url, "--biz-type", biz_type])
        .args(["--channels", channels, "--tag", tag])
        .args(["--concurrency", &c.to_string()])
        .args(["--requests", &requests.to_string()])
        .args(["--duration", &format!("{}ms", duration.as_millis())])
        .args(["--rate", &rate.to_string()]);
    if dup {
        cmd.arg("--dup");
    }
    let out = cmd.output().await.context("running the load generator")?;
    if !out.status.success() {
        bail!(
            "load generator failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let report: Report = serde_json::from_slice(&out.stdout)
        .with_context(|| format!("load report {:?}", String::from_utf8_lossy(&out.stdout)))?;
    if let Some(e) = &report.first_error {
        eprintln!(
            "  ({} errors in {tag}; first: {})",
            report.errors,
            e.chars().take(300).collect::<String>()
        );
    }
    Ok(report)
}

/// `VmRSS` and `VmHWM` of this process, MiB.
fn rss() -> (f64, f64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
            .map(|kb| kb / 1024.0)
            .unwrap_or(f64::NAN)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// Cumulative counts of the host's permit-latency histogram, by bucket bound (s).
fn permit_buckets() -> Vec<(f64, f64)> {
    let text = crate::api::metrics::handle().render();
    let name = format!("{}_bucket{{le=\"", crate::api::metrics::PERMIT_SECONDS);
    text.lines()
        .filter_map(|l| {
            let rest = l.strip_prefix(&name)?;
            let (le, count) = rest.split_once("\"} ")?;
            let le = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().ok()?
            };
            Some((le, count.trim().parse().ok()?))
        })
        .collect()
}

/// The bucket bound (ms) under which fraction `q` of the calls between two snapshots fell.
fn bucket_quantile(before: &[(f64, f64)], after: &[(f64, f64)], q: f64) -> f64 {
    let delta: Vec<(f64, f64)> = after
        .iter()
        .map(|(le, n)| {
            let b = before
                .iter()
                .find(|(l, _)| l == le)
                .map(|(_, n)| *n)
                .unwrap_or(0.0);
            (*le, n - b)
        })
        .collect();
    let total = delta.last().map(|(_, n)| *n).unwrap_or(0.0);
    delta
        .iter()
        .find(|(_, n)| *n >= q * total)
        .map(|(le, _)| le * 1000.0)
        .unwrap_or(f64::NAN)
}

async fn bench(args: &Args, tmp: &Path) -> anyhow::Result<()> {
    let load_avg = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let sim_path = match &args.sim {
        Some(p) => p.clone(),
        None => sibling("provider-sim")?,
    };
    let (_sim, sim) = start_sim(&sim_path)?;
    let store = Store::open(&RedisTarget::Embedded {
        data_dir: tmp.join("redis"),
    })
    .await?;
    let redis_url = store.url().to_string();
    let mut conn = store.manager().await?;
    let version = permit::info_field(&mut conn, "server", "redis_version").await?;
    let aof = permit::info_field(&mut conn, "persistence", "aof_enabled").await?;

    // The host, in-process, channel plugins sending to the simulator.
    let policy_dir = tmp.join("policies");
    write_policies(&policy_dir)?;
    let plugin_dir = args.plugin_dir.clone().unwrap_or_else(|| {
        std::env::var_os("PUSHONCE_PLUGIN_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("target/plugins"))
    });
    let chans = channels(&sim);
    let config = HostConfig {
        listen: "127.0.0.1:0".parse()?,
        redis_url: Some(redis_url.clone()),
        data_dir: tmp.join("data"),
        plugin_dir,
        policy_dir,
        workers: args.workers,
        channels: chans.clone(),
        ..HostConfig::default()
    };
    let (rss_before, _) = rss();
    let live_cell: Arc<OnceLock<Arc<Live>>> = Arc::new(OnceLock::new());
    let source = {
        let cell = live_cell.clone();
        Arc::new(move || {
            cell.get()
                .expect("no task is sent before the host has started (fresh Redis)")
                .current()
                .registry
                .clone()
        })
    };
    let env = |var: &str| (var == "BENCH_WECHAT_SECRET").then(|| "bench-secret".to_string());
    let sender = PluginSender::new(&chans, source, env)?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let running = service::start(
        config,
        listener,
        ServiceOptions {
            env: Arc::new(env),
            sender: Some(Arc::new(sender)),
            ..ServiceOptions::default()
        },
    )
    .await?;
    let _ = live_cell.set(running.live().clone());
    let (rss_started, _) = rss();
    let url = format!("http://{}", running.addr());
    let client: HttpClient = Client::builder(TokioExecutor::new()).build_http();
    eprintln!("host on {url}, simulator on {sim}, redis {redis_url}");

    let mut lines: Vec<Line> = Vec::new();
    // The floor at each concurrency: redis-benchmark, bare SET NX PX script, unique keys.
    let mut floors: BTreeMap<usize, Row> = BTreeMap::new();
    for &c in &args.concurrency {
        let n = if c == 1 {
            args.floor_requests / 5
        } else {
            args.floor_requests
        };
        let row = permit::redis_benchmark(&redis_url, n.max(1), c, "benchfloor")?;
        eprintln!("floor c={c}: {:.0}/s", row.rate);
        floors.insert(c, row);
    }
    let floor_of = |c: usize| {
        floors
            .range(..=c)
            .next_back()
            .or_else(|| floors.iter().next())
            .map(|(_, r)| r.rate)
            .unwrap_or(f64::NAN)
    };
    for (c, r) in &floors {
        lines.push(Line {
            what: "redis-benchmark EVAL SET NX PX (floor), calls/s".into(),
            c: *c,
            rate: r.rate,
            p50: r.p50,
            p99: r.p99,
            p999: f64::NAN,
            floor: r.rate,
            note: "-P 1".into(),
        });
    }

    // The permit layer directly (own namespace, no consumer reads it).
    let pc = 64;
    let permits = Permits::new(
        conn.clone(),
        PermitConfig {
            namespace: "benchp".into(),
            ..PermitConfig::default()
        },
    );
    permits.prepare().await?;
    let script = permit::redis_benchmark_accept(&redis_url, args.floor_requests, pc, &permits)?;
    lines.push(Line {
        what: "redis-benchmark EVALSHA accept.lua, calls/s".into(),
        c: pc,
        rate: script.rate,
        p50: script.p50,
        p99: script.p99,
        p999: f64::NAN,
        floor: floor_of(pc),
        note: "-P 1".into(),
    });
    let n = args.floor_requests;
    let before = permit::used_memory(&mut conn).await?;
    let single = permit::host_accepts(&permits, n, pc, 1, "s").await?;
    let per_permit = permit::used_memory(&mut conn).await?.saturating_sub(before) as f64 / n as f64;
    lines.push(Line {
        what: "Permits::accept direct, permits/s".into(),
        c: pc,
        rate: single.rate,
        p50: single.p50,
        p99: single.p99,
        p999: f64::NAN,
        floor: floor_of(pc),
        note: "1 multiplexed conn".into(),
    });
    let batched = permit::host_accepts(&permits, n, pc, 16, "b").await?;
    lines.push(Line {
        what: "Permits::accept_batch x16 direct, permits/s".into(),
        c: pc,
        rate: batched.rate,
        p50: batched.p50,
        p99: batched.p99,
        p999: f64::NAN,
        floor: floor_of(pc),
        note: "latency per pipeline".into(),
    });

    let (rss_direct, _) = rss();
    // HTTP: accepted events/s and latency; the backlog is delivered between runs.
    let mut expected = delivered(&client, &sim).await?;
    let mut peak_one: f64 = 0.0;
    let mut kinds = vec![
        ("1 channel", "BENCH_ONE", "sms", false),
        (
            "4 channels",
            "BENCH_FOUR",
            "inbox,sms,wechat,app-push",
            false,
        ),
    ];
    if !args.no_dup {
        kinds.push(("1 channel, half dup", "BENCH_ONE", "sms", true));
        kinds.push((
            "4 channels, half dup",
            "BENCH_FOUR",
            "inbox,sms,wechat,app-push",
            true,
        ));
    }
    let mut drain_notes = Vec::new();
    for (i, (label, biz_type, chans, dup)) in kinds.iter().enumerate() {
        for &c in &args.concurrency {
            let tag = format!("h{i}c{c}");
            let r = load(
                &url,
                biz_type,
                chans,
                c,
                args.requests,
                args.duration,
                *dup,
                &tag,
                0.0,
            )
            .await?;
            let events = if *dup { r.ok / 2 } else { r.ok };
            let rate = events as f64 / r.elapsed_s;
            if !dup && *biz_type == "BENCH_ONE" {
                peak_one = peak_one.max(rate);
            }
            eprintln!(
                "http {label} c={c}: {:.0} req/s, {} accepted, {} duplicate, {} errors",
                r.rps, r.accepted, r.duplicates, r.errors
            );
            lines.push(Line {
                what: format!("HTTP /v1/events {label}, accepted events/s"),
                c,
                rate,
                p50: r.p50_ms,
                p99: r.p99_ms,
                p999: r.p999_ms,
                floor: floor_of(c),
                note: format!(
                    "{:.0} req/s, {} errors{}",
                    r.rps,
                    r.errors,
                    if *dup {
                        format!(", {} dup answers", r.duplicates)
                    } else {
                        String::new()
                    }
                ),
            });
            expected += r.accepted as u64;
            let t = Instant::now();
            if !drain(&client, &sim, expected, args.drain_timeout).await? {
                drain_notes.push(format!(
                    "{tag}: backlog not delivered in {:?}",
                    args.drain_timeout
                ));
                expected = delivered(&client, &sim).await?;
            } else {
                eprintln!("  delivered in {:.1} s", t.elapsed().as_secs_f64());
            }
        }
    }

    // Permit latency at half of the 1-channel peak (paced load, 64 connections).
    let half = (peak_one / 2.0).max(1.0);
    let buckets_before = permit_buckets();
    let r = load(
        &url,
        "BENCH_ONE",
        "sms",
        64,
        args.requests,
        args.duration,
        false,
        "half",
        half,
    )
    .await?;
    let buckets_after = permit_buckets();
    let permit_p50 = bucket_quantile(&buckets_before, &buckets_after, 0.50);
    let permit_p99 = bucket_quantile(&buckets_before, &buckets_after, 0.99);
    lines.push(Line {
        what: "HTTP 1 channel paced at half peak, events/s".into(),
        c: 64,
        rate: r.ok as f64 / r.elapsed_s,
        p50: r.p50_ms,
        p99: r.p99_ms,
        p999: r.p999_ms,
        floor: floor_of(64),
        note: format!("target {half:.0}/s"),
    });
    lines.push(Line {
        what: "  its permit pipeline (host histogram), ms".into(),
        c: 64,
        rate: f64::NAN,
        p50: permit_p50,
        p99: permit_p99,
        p999: f64::NAN,
        floor: f64::NAN,
        note: "bucket upper bounds".into(),
    });
    expected += r.accepted as u64;
    if !drain(&client, &sim, expected, args.drain_timeout).await? {
        drain_notes.push("half: backlog not delivered".into());
        expected = delivered(&client, &sim).await?;
    }

    // End to end: post → the simulator accepted the message.
    for (label, biz_type, chans, per) in [
        ("1 channel", "BENCH_ONE", "sms", 1),
        ("4 channels", "BENCH_FOUR", "inbox,sms,wechat,app-push", 4),
    ] {
        let tag = format!("e2e{per}");
        let r = load(
            &url,
            biz_type,
            chans,
            16,
            args.e2e_events,
            Duration::from_secs(60),
            false,
            &tag,
            0.0,
        )
        .await?;
        expected += r.accepted as u64;
        let all = drain(&client, &sim, expected, args.drain_timeout).await?;
        let ledger = get_json(&client, &format!("http://{sim}/_sim/ledger")).await?;
        let mut lat = Vec::new();
        let mut last = 0u64;
        for list in ledger.as_object().into_iter().flat_map(|m| m.values()) {
            for m in list.as_array().into_iter().flatten() {
                let at = m["accepted_at_ms"].as_u64().unwrap_or(0);
                if at < r.first_post_ms {
                    continue;
                }
                let text = m["params"].to_string();
                let posted = text.split("@@").nth(1).and_then(|t| t.parse::<u64>().ok());
                if let Some(p) = posted.filter(|p| *p >= r.first_post_ms) {
                    lat.push(at.saturating_sub(p));
                    last = last.max(at);
                }
            }
        }
        lat.sort_unstable();
        let pct = |q: f64| {
            lat.get(((lat.len() as f64 * q) as usize).min(lat.len().saturating_sub(1)))
                .map(|v| *v as f64)
                .unwrap_or(f64::NAN)
        };
        let span = last.saturating_sub(r.first_post_ms).max(1) as f64 / 1000.0;
        lines.push(Line {
            what: format!("end to end {label}: post → simulator, messages/s"),
            c: 16,
            rate: lat.len() as f64 / span,
            p50: pct(0.50),
            p99: pct(0.99),
            p999: pct(0.999),
            floor: floor_of(16),
            note: format!(
                "{} msgs of {} events{}",
                lat.len(),
                r.ok,
                if all { "" } else { ", NOT all delivered" }
            ),
        });
    }

    // Warm derive-key cost on the live registry.
    let snapshot = running.live().current();
    let plugin = snapshot.registry.resolve_key_policy("per-event@^1")?;
    let event = crate::cli::keys::sample_event();
    for _ in 0..1000 {
        plugin.derive_key(&event, "sms", &[])?;
    }
    let mut calls = Vec::with_capacity(50_000);
    for _ in 0..50_000 {
        let t = Instant::now();
        plugin.derive_key(&event, "sms", &[])?;
        calls.push(t.elapsed());
    }
    calls.sort_unstable();
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    let mean = calls.iter().sum::<Duration>() / calls.len() as u32;
    drop(snapshot);

    let (rss_now, rss_peak) = rss();
    let redis_rss = permit::info_field(&mut conn, "memory", "used_memory_rss").await?;

    println!(
        "pushonce bench http: redis {version} (aof_enabled={aof}, embedded), {} cores, loadavg at start {}",
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(0),
        load_avg
            .split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    );
    println!(
        "runs: ≤{} requests or ≤{:?} each; host workers={}; load generator = separate process, 1 thread",
        args.requests, args.duration, args.workers
    );
    let f = |v: f64, p: usize| {
        if v.is_nan() {
            "-".to_string()
        } else {
            format!("{v:.p$}")
        }
    };
    let mut rows = Vec::new();
    for l in &lines {
        rows.push([
            l.what.clone(),
            if l.c == 0 {
                "-".into()
            } else {
                l.c.to_string()
            },
            f(l.rate, 0),
            f(l.p50, 3),
            f(l.p99, 3),
            f(l.p999, 3),
            f(l.rate / l.floor, 3),
            l.note.clone(),
        ]);
    }
    crate::cli::plugins::print_table(
        &[
            "WHAT", "C", "RATE", "P50 MS", "P99 MS", "P999 MS", "VS FLOOR", "NOTE",
        ],
        &rows,
    );
    println!(
        "derive-key (per-event@1) warm call: mean {:.2} µs, p50 {:.2} µs, p99 {:.2} µs",
        us(mean),
        us(calls[calls.len() / 2]),
        us(calls[calls.len() * 99 / 100])
    );
    println!(
        "host RSS (in-process: the bench process = host + bench driver; load generator and simulator are separate): {rss_before:.1} MiB before the host started; {rss_started:.1} MiB once it serves (all plugins loaded, idle); {rss_direct:.1} MiB after the direct permit runs; {rss_now:.1} MiB after all HTTP runs (VmHWM peak {rss_peak:.1} MiB)"
    );
    println!(
        "redis memory per open permit (permit + task hash + stream entry + event index): {per_permit:.0} bytes (used_memory delta / {n}); redis used_memory_rss now {:.1} MiB",
        redis_rss.parse::<f64>().unwrap_or(0.0) / 1048576.0
    );
    for n in drain_notes {
        println!("note: {n}");
    }
    running.shutdown().await?;
    store.shutdown().await;
    Ok(())
}
