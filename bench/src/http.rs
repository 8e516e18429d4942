//! `pushonce-bench http`: the whole host measured the way its users see it,
//! against the floor Redis sets on the same machine in the same run. Starts an
//! embedded Redis (AOF on, as in production), the provider simulator (the
//! `provider-sim` binary, a separate process), and the host as its own
//! `pushonce serve` process (a generated configuration: the channel plugins
//! send to the simulator); drives `POST /v1/events` from `pushonce-bench load`
//! run as a separate process; prints one table where every rate is also a
//! ratio to `redis-benchmark`'s bare `SET NX PX` script at the same
//! concurrency.
//!
//! Two phases, each with its own host process: `api` — the host with
//! `dispatch = false` (the accept path alone: no dispatcher competing for the
//! cores; its backlog is dropped with `FLUSHALL` afterwards), then `full` —
//! the host as deployed by default, dispatching while it accepts, its
//! backlog delivered between runs, and the end-to-end rows. The host's RSS is
//! its own process's.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

use tokio::io::AsyncBufReadExt;

use super::load::Report;
use super::permit::{self, Row};
use pushonce::config::HostConfig;
use pushonce::permit::{PermitConfig, Permits};
use pushonce::route::Live;
use pushonce::store::{RedisTarget, Store};

/// Arguments of `pushonce-bench http`.
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
    /// Phases to run: `api` (host with `dispatch = false`: the accept path
    /// alone) and `full` (the host dispatching while it accepts, end to end).
    #[arg(long, value_delimiter = ',', default_value = "api,full")]
    phases: Vec<String>,
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

/// Run `pushonce-bench http`.
pub fn run(args: Args) -> anyhow::Result<()> {
    let tmp = PathBuf::from(format!("/tmp/pob-{}", std::process::id()));
    std::fs::create_dir_all(&tmp)?;
    let result = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(measure_http(&args, &tmp));
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

/// A TOML string literal.
fn toml_str(s: &str) -> String {
    toml::Value::String(s.to_string()).to_string()
}

/// The host's configuration file: Redis at `redis_url`, the bench policies,
/// the four channels sending to the simulator at `sim`.
fn host_config(
    tmp: &Path,
    name: &str,
    redis_url: &str,
    plugin_dir: &Path,
    sim: &str,
    workers: usize,
    dispatch: bool,
) -> String {
    let dir = |p: PathBuf| toml_str(&p.to_string_lossy());
    let mut text = format!(
        "listen = \"127.0.0.1:0\"\nredis_url = {}\ndata_dir = {}\nplugin_dir = {}\npolicy_dir = {}\nworkers = {workers}\ndispatch = {dispatch}\n",
        toml_str(redis_url),
        dir(tmp.join(format!("data-{name}"))),
        dir(plugin_dir.to_path_buf()),
        dir(tmp.join("policies")),
    );
    let endpoint = toml_str(&format!("http://{sim}"));
    for (channel, extra) in [
        ("inbox", ""),
        ("sms", ", sign_name = \"pushonce\""),
        ("app-push", ", project = \"pushonce-bench\""),
        ("wechat", ", app_id = \"wx-bench\""),
    ] {
        text.push_str(&format!(
            "\n[channels.{channel}]\nplugin = \"{channel}@^1\"\nsettings = {{ endpoint = {endpoint}{extra} }}\nallowed_hosts = [{}]\n",
            toml_str(sim)
        ));
        if channel == "wechat" {
            text.push_str("secrets_from_env = { app_secret = \"BENCH_WECHAT_SECRET\" }\n");
        }
    }
    text
}

/// The host under test: a `pushonce serve` process (killed when dropped).
struct HostProcess {
    /// The process.
    child: tokio::process::Child,
    /// Its base URL.
    url: String,
}

impl HostProcess {
    /// Starts `pushonce serve --config <config>` and waits until it serves.
    async fn start(config: &Path, log: &Path) -> anyhow::Result<HostProcess> {
        let mut child = tokio::process::Command::new(sibling("pushonce")?)
            .args(["serve", "--config"])
            .arg(config)
            .env("BENCH_WECHAT_SECRET", "bench-secret")
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(log)?)
            .kill_on_drop(true)
            .spawn()
            .context("starting the host (pushonce serve)")?;
        let stdout = child.stdout.take().context("host stdout")?;
        let mut lines = tokio::io::BufReader::new(stdout).lines();
        let first = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
            .await
            .context("the host did not start within 60 s")??;
        let Some(url) = first
            .as_deref()
            .and_then(|l| l.trim().strip_prefix("pushonce listening on "))
        else {
            bail!(
                "the host did not start ({first:?}); its log: {}",
                std::fs::read_to_string(log).unwrap_or_default()
            );
        };
        Ok(HostProcess {
            url: url.to_string(),
            child,
        })
    }

    /// `VmRSS` and `VmHWM` of the host process, MiB.
    fn rss(&self) -> (f64, f64) {
        match self.child.id() {
            Some(pid) => rss_of(&format!("/proc/{pid}/status")),
            None => (f64::NAN, f64::NAN),
        }
    }

    /// Stops the host with SIGTERM (graceful) and waits for it.
    async fn stop(mut self) -> anyhow::Result<()> {
        if let Some(pid) = self.child.id() {
            let _ = Command::new("kill")
                .args(["-TERM", &pid.to_string()])
                .status();
        }
        if tokio::time::timeout(Duration::from_secs(60), self.child.wait())
            .await
            .is_err()
        {
            self.child.kill().await?;
        }
        Ok(())
    }
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
    cmd.args(["load", "--url", url, "--biz-type", biz_type])
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

/// `VmRSS` and `VmHWM` in a `/proc/<pid>/status` file, MiB.
fn rss_of(file: &str) -> (f64, f64) {
    let status = std::fs::read_to_string(file).unwrap_or_default();
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

/// Cumulative counts of the host's permit-latency histogram, by bucket bound
/// (s), from its `/metrics`.
async fn permit_buckets(client: &HttpClient, host: &str) -> anyhow::Result<Vec<(f64, f64)>> {
    let res = client.get(format!("{host}/metrics").parse()?).await?;
    let bytes = res.into_body().collect().await?.to_bytes();
    let text = String::from_utf8_lossy(&bytes);
    let name = format!("{}_bucket{{le=\"", pushonce::metric_names::PERMIT_SECONDS);
    Ok(text
        .lines()
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
        .collect())
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

/// What one phase's host measured besides its table lines.
struct PhaseReport {
    /// Host RSS once it serves, idle (MiB).
    rss_idle: f64,
    /// Host RSS after the phase's runs, and its peak (MiB).
    rss_after: (f64, f64),
}

/// What every phase shares: the options, the client, the simulator, the
/// floors, and the table and notes being written.
struct Phases<'a> {
    /// The options.
    args: &'a Args,
    /// HTTP client for the simulator and the host's `/metrics`.
    client: &'a HttpClient,
    /// The simulator's address.
    sim: &'a str,
    /// The floor at a concurrency.
    floor_of: &'a dyn Fn(usize) -> f64,
    /// The table's lines.
    lines: &'a mut Vec<Line>,
    /// Notes printed under the table.
    notes: &'a mut Vec<String>,
}

impl Phases<'_> {
    /// The HTTP runs of one phase against the host at `host`. `dispatch`: the
    /// host dispatches (its backlog is delivered between runs, end-to-end rows).
    async fn http_runs(&mut self, host: &HostProcess, dispatch: bool) -> anyhow::Result<()> {
        let (args, client, sim, floor_of) = (self.args, self.client, self.sim, self.floor_of);
        let url = &host.url;
        let phase = if dispatch { "" } else { "API only, " };
        let mut expected = delivered(client, sim).await?;
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
        if !args.no_dup && !dispatch {
            kinds.push(("1 channel, half dup", "BENCH_ONE", "sms", true));
            kinds.push((
                "4 channels, half dup",
                "BENCH_FOUR",
                "inbox,sms,wechat,app-push",
                true,
            ));
        }
        let p = if dispatch { "f" } else { "a" };
        for (i, (label, biz_type, chans, dup)) in kinds.iter().enumerate() {
            for &c in &args.concurrency {
                let tag = format!("{p}h{i}c{c}");
                let r = load(
                    url,
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
                    "http {phase}{label} c={c}: {:.0} req/s, {} accepted, {} duplicate, {} errors",
                    r.rps, r.accepted, r.duplicates, r.errors
                );
                self.lines.push(Line {
                    what: format!("HTTP /v1/events {label}, {phase}accepted events/s"),
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
                if dispatch {
                    expected += r.accepted as u64;
                    let t = Instant::now();
                    if !drain(client, sim, expected, args.drain_timeout).await? {
                        self.notes.push(format!(
                            "{tag}: backlog not delivered in {:?}",
                            args.drain_timeout
                        ));
                        expected = delivered(client, sim).await?;
                    } else {
                        eprintln!("  delivered in {:.1} s", t.elapsed().as_secs_f64());
                    }
                }
            }
        }

        // Permit latency at half of the 1-channel peak (paced load, 64 connections).
        let half = (peak_one / 2.0).max(1.0);
        let buckets_before = permit_buckets(client, url).await?;
        let r = load(
            url,
            "BENCH_ONE",
            "sms",
            64,
            args.requests,
            args.duration,
            false,
            &format!("{p}half"),
            half,
        )
        .await?;
        let buckets_after = permit_buckets(client, url).await?;
        let permit_p50 = bucket_quantile(&buckets_before, &buckets_after, 0.50);
        let permit_p99 = bucket_quantile(&buckets_before, &buckets_after, 0.99);
        self.lines.push(Line {
            what: format!("HTTP 1 channel, {phase}paced at half peak, events/s"),
            c: 64,
            rate: r.ok as f64 / r.elapsed_s,
            p50: r.p50_ms,
            p99: r.p99_ms,
            p999: r.p999_ms,
            floor: floor_of(64),
            note: format!("target {half:.0}/s"),
        });
        self.lines.push(Line {
            what: "  its permit pipeline (host histogram), ms".into(),
            c: 64,
            rate: f64::NAN,
            p50: permit_p50,
            p99: permit_p99,
            p999: f64::NAN,
            floor: f64::NAN,
            note: "bucket upper bounds".into(),
        });
        if !dispatch {
            return Ok(());
        }
        expected += r.accepted as u64;
        if !drain(client, sim, expected, args.drain_timeout).await? {
            self.notes.push("half: backlog not delivered".into());
            expected = delivered(client, sim).await?;
        }

        // End to end: post → the simulator accepted the message.
        for (label, biz_type, chans, per) in [
            ("1 channel", "BENCH_ONE", "sms", 1),
            ("4 channels", "BENCH_FOUR", "inbox,sms,wechat,app-push", 4),
        ] {
            let tag = format!("e2e{per}");
            let r = load(
                url,
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
            let all = drain(client, sim, expected, args.drain_timeout).await?;
            let ledger = get_json(client, &format!("http://{sim}/_sim/ledger")).await?;
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
            self.lines.push(Line {
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
        Ok(())
    }

    /// Runs one phase: starts its host, runs [`Phases::http_runs`], stops the host.
    async fn phase(
        &mut self,
        tmp: &Path,
        config: String,
        name: &str,
        dispatch: bool,
    ) -> anyhow::Result<PhaseReport> {
        let config_file = tmp.join(format!("{name}.toml"));
        std::fs::write(&config_file, config)?;
        let host = HostProcess::start(&config_file, &tmp.join(format!("{name}.log"))).await?;
        eprintln!("host ({name}) on {}", host.url);
        let (rss_idle, _) = host.rss();
        self.http_runs(&host, dispatch).await?;
        let rss_after = host.rss();
        host.stop().await?;
        Ok(PhaseReport {
            rss_idle,
            rss_after,
        })
    }
}

async fn measure_http(args: &Args, tmp: &Path) -> anyhow::Result<()> {
    let load_avg = || {
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    };
    let load_start = load_avg();
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

    let policy_dir = tmp.join("policies");
    write_policies(&policy_dir)?;
    let plugin_dir = args.plugin_dir.clone().unwrap_or_else(|| {
        std::env::var_os("PUSHONCE_PLUGIN_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("target/plugins"))
    });
    let plugin_dir = std::fs::canonicalize(&plugin_dir)
        .with_context(|| format!("plugin directory {}", plugin_dir.display()))?;
    let client: HttpClient = Client::builder(TokioExecutor::new()).build_http();
    eprintln!("simulator on {sim}, redis {redis_url}");

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

    // The host, as its own process, in each phase.
    let mut notes = Vec::new();
    let mut rss = Vec::new();
    let mut phases = Phases {
        args,
        client: &client,
        sim: &sim,
        floor_of: &floor_of,
        lines: &mut lines,
        notes: &mut notes,
    };
    for name in &args.phases {
        let dispatch = match name.as_str() {
            "api" => false,
            "full" => true,
            other => bail!("unknown phase {other:?} (api, full)"),
        };
        let config = host_config(
            tmp,
            name,
            &redis_url,
            &plugin_dir,
            &sim,
            args.workers,
            dispatch,
        );
        let report = phases.phase(tmp, config, name, dispatch).await?;
        rss.push((name.clone(), report));
        if !dispatch {
            // The API-only phase's backlog is not delivered: drop it, so the
            // next phase's host starts on an empty Redis (it prepares its
            // scripts and groups again).
            let _: () = redis::cmd("FLUSHALL").query_async(&mut conn).await?;
        }
    }

    // Warm derive-key cost, on a registry loaded in this process.
    let live = {
        let text = host_config(tmp, "bench", &redis_url, &plugin_dir, &sim, 1, false);
        let config = Arc::new(HostConfig::parse(Path::new("bench.toml"), &text)?);
        tokio::task::spawn_blocking(move || Live::load(config)).await??
    };
    let snapshot = live.current();
    let plugin = snapshot.registry.resolve_key_policy("per-event@^1")?;
    let event = pushonce::cli::inputs::sample_event();
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

    let redis_rss = permit::info_field(&mut conn, "memory", "used_memory_rss").await?;

    println!(
        "pushonce-bench http: redis {version} (aof_enabled={aof}, embedded), {} cores, loadavg at start {load_start}, at end {}",
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(0),
        load_avg()
    );
    println!(
        "runs: ≤{} requests or ≤{:?} each; host = separate `pushonce serve` process, workers={} (phase api: dispatch = false; full: dispatching); load generator = separate process, 1 thread",
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
    pushonce::cli::output::print_table(
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
    for (name, r) in &rss {
        println!(
            "host RSS, phase {name} (the `pushonce serve` process alone, all plugins loaded): {:.1} MiB once it serves (idle); {:.1} MiB after the phase's HTTP runs (VmHWM peak {:.1} MiB)",
            r.rss_idle, r.rss_after.0, r.rss_after.1
        );
    }
    println!(
        "redis memory per open permit (permit + task hash + stream entry + event index): {per_permit:.0} bytes (used_memory delta / {n}); redis used_memory_rss now {:.1} MiB",
        redis_rss.parse::<f64>().unwrap_or(0.0) / 1048576.0
    );
    for n in notes {
        println!("note: {n}");
    }
    store.shutdown().await;
    Ok(())
}
