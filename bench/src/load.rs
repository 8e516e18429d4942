//! `pushonce-bench load` (hidden): the HTTP load generator that `pushonce-bench
//! http` runs as a separate process. It posts unique events (or each event
//! twice) to `POST /v1/events` over keep-alive connections from C concurrent
//! tasks on ONE thread (so it takes at most one core), bounded by a count and
//! a time, loopback only, and prints one JSON line: requests, answers counted
//! by kind, rate and latency percentiles.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

/// Arguments of `pushonce-bench load`.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// The host's base URL, e.g. `http://127.0.0.1:8080` (loopback only).
    #[arg(long)]
    pub url: String,
    /// `biz_type` of the events (the bench policies route it).
    #[arg(long)]
    pub biz_type: String,
    /// Channels to give recipients for (comma separated).
    #[arg(long, value_delimiter = ',')]
    pub channels: Vec<String>,
    /// Concurrent requests (one keep-alive connection each).
    #[arg(long, default_value_t = 16)]
    pub concurrency: usize,
    /// At most this many requests.
    #[arg(long, default_value_t = 20_000)]
    pub requests: usize,
    /// At most this long.
    #[arg(long, default_value = "3s", value_parser = humantime::parse_duration)]
    pub duration: Duration,
    /// Post every event twice (request i carries event i/2): half are duplicates.
    #[arg(long)]
    pub dup: bool,
    /// Tag making this run's biz ids unique.
    #[arg(long)]
    pub tag: String,
    /// Paced at this many requests per second in total (0: as fast as answered).
    /// Latency is then measured from each request's scheduled time.
    #[arg(long, default_value_t = 0.0)]
    pub rate: f64,
}

/// What one load run saw; printed as one JSON line.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct Report {
    /// Requests answered (any status).
    pub requests: usize,
    /// Answers with status 202.
    pub ok: usize,
    /// Other statuses or transport errors.
    pub errors: usize,
    /// Channel results `accepted`.
    pub accepted: usize,
    /// Channel results `duplicate`.
    pub duplicates: usize,
    /// Wall time of the run, s.
    pub elapsed_s: f64,
    /// Requests per second.
    pub rps: f64,
    /// Latency percentiles, ms.
    pub p50_ms: f64,
    /// 99th percentile, ms.
    pub p99_ms: f64,
    /// 99.9th percentile, ms.
    pub p999_ms: f64,
    /// Post time of the first request, ms since the epoch.
    pub first_post_ms: u64,
    /// First error text seen, if any.
    pub first_error: Option<String>,
}

/// Run `pushonce-bench load`.
pub fn run(args: Args) -> anyhow::Result<()> {
    let host = args
        .url
        .strip_prefix("http://")
        .context("--url must be http://")?;
    if !(host.starts_with("127.") || host.starts_with("[::1]") || host.starts_with("localhost")) {
        bail!("the load generator only targets loopback addresses, not {host}");
    }
    let report = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(load(args))?;
    println!("{}", serde_json::to_string(&report)?);
    Ok(())
}

/// Milliseconds since the epoch.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// The JSON body of request `i`. The post time rides in a template parameter
/// as `@@<ms>@@`, so the provider simulator's ledger shows it.
fn body(args: &Args, i: usize) -> Bytes {
    let event = if args.dup { i / 2 } else { i };
    let recipients: Vec<String> = args
        .channels
        .iter()
        .map(|c| {
            let to = match c.as_str() {
                "sms" => format!("+86138{:08}", event % 100_000_000),
                "wechat" => format!("oBench{event}"),
                "app-push" => format!("device-token-{event}"),
                _ => format!("u{event}"),
            };
            format!(r#""{c}":"{to}""#)
        })
        .collect();
    Bytes::from(format!(
        r#"{{"biz_type":"{}","biz_id":"{}-{event}","user_id":"u{event}","template":"BENCH_T","recipients":{{{}}},"params":{{"t":"@@{}@@"}}}}"#,
        args.biz_type,
        args.tag,
        recipients.join(","),
        now_ms()
    ))
}

/// Counts non-overlapping occurrences of `needle` in `hay`.
fn count(hay: &[u8], needle: &[u8]) -> usize {
    hay.windows(needle.len()).filter(|w| *w == needle).count()
}

type LoadClient = Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>;

/// One load run, shared by its concurrent posting tasks.
struct PostingRun {
    /// The options.
    args: Args,
    /// The keep-alive client.
    client: LoadClient,
    /// `POST /v1/events` on the host.
    uri: http::Uri,
    /// The next request's number.
    next: AtomicUsize,
    /// When the run started, and when it must stop.
    start: Instant,
    deadline: Instant,
}

async fn load(args: Args) -> anyhow::Result<Report> {
    let c = args.concurrency.max(1);
    let shared = Arc::new(PostingRun {
        client: Client::builder(TokioExecutor::new())
            .pool_max_idle_per_host(c)
            .build_http(),
        uri: format!("{}/v1/events", args.url.trim_end_matches('/')).parse()?,
        next: AtomicUsize::new(0),
        start: Instant::now(),
        deadline: Instant::now() + args.duration,
        args,
    });
    let first_post_ms = now_ms();
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..c {
        set.spawn(post_until_done(shared.clone()));
    }
    let mut total = Report::default();
    let mut lat: Vec<u32> = Vec::new();
    while let Some(res) = set.join_next().await {
        let (r, l) = res?;
        total.add(r);
        lat.extend(l);
    }
    total.finish(shared.start.elapsed(), first_post_ms, lat);
    Ok(total)
}

/// One concurrent task: posts the next request until the count or the time
/// is used up; its counts and latencies (µs).
async fn post_until_done(shared: Arc<PostingRun>) -> (Report, Vec<u32>) {
    let mut r = Report::default();
    let mut lat: Vec<u32> = Vec::new();
    loop {
        let i = shared.next.fetch_add(1, Ordering::Relaxed);
        let Some(t0) = shared.start_of(i).await else {
            break;
        };
        let answer = shared.post(i).await;
        lat.push(t0.elapsed().as_micros().min(u32::MAX as u128) as u32);
        r.count(answer);
    }
    (r, lat)
}

impl PostingRun {
    /// When request `i` starts (paced: its slot, waited for), or `None` when
    /// the run is over.
    async fn start_of(&self, i: usize) -> Option<Instant> {
        if i >= self.args.requests || Instant::now() >= self.deadline {
            return None;
        }
        if self.args.rate <= 0.0 {
            return Some(Instant::now());
        }
        let at = self.start + Duration::from_secs_f64(i as f64 / self.args.rate);
        if at >= self.deadline {
            return None;
        }
        tokio::time::sleep_until(at.into()).await;
        Some(at)
    }

    /// Posts request `i`; its status and body.
    async fn post(&self, i: usize) -> anyhow::Result<(http::StatusCode, Bytes)> {
        let req = http::Request::post(self.uri.clone())
            .header("content-type", "application/json")
            .body(Full::new(body(&self.args, i)))?;
        let res = self.client.request(req).await?;
        let status = res.status();
        let bytes = res.into_body().collect().await?.to_bytes();
        Ok((status, bytes))
    }
}

impl Report {
    /// Counts one answer.
    fn count(&mut self, answer: anyhow::Result<(http::StatusCode, Bytes)>) {
        self.requests += 1;
        match answer {
            Ok((status, bytes)) if status.as_u16() == 202 => {
                self.ok += 1;
                self.accepted += count(&bytes, br#""result":"accepted""#);
                self.duplicates += count(&bytes, br#""result":"duplicate""#);
            }
            Ok((status, bytes)) => {
                self.errors += 1;
                self.first_error.get_or_insert_with(|| {
                    format!("{status}: {}", String::from_utf8_lossy(&bytes))
                });
            }
            Err(e) => {
                self.errors += 1;
                self.first_error.get_or_insert_with(|| format!("{e:#}"));
            }
        }
    }

    /// Adds another task's counts.
    fn add(&mut self, r: Report) {
        self.requests += r.requests;
        self.ok += r.ok;
        self.errors += r.errors;
        self.accepted += r.accepted;
        self.duplicates += r.duplicates;
        if self.first_error.is_none() {
            self.first_error = r.first_error;
        }
    }

    /// Rate and latency percentiles of the whole run.
    fn finish(&mut self, elapsed: Duration, first_post_ms: u64, mut lat: Vec<u32>) {
        self.elapsed_s = elapsed.as_secs_f64();
        self.rps = self.requests as f64 / self.elapsed_s;
        self.first_post_ms = first_post_ms;
        lat.sort_unstable();
        let ms = |q: f64| crate::percentile(&lat, q).map_or(0.0, |us| f64::from(us) / 1000.0);
        self.p50_ms = ms(0.50);
        self.p99_ms = ms(0.99);
        self.p999_ms = ms(0.999);
    }
}
