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

async fn load(args: Args) -> anyhow::Result<Report> {
    let c = args.concurrency.max(1);
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(c)
        .build_http();
    let uri: http::Uri = format!("{}/v1/events", args.url.trim_end_matches('/')).parse()?;
    let args = Arc::new(args);
    let next = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let first_post_ms = now_ms();
    let deadline = start + args.duration;
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..c {
        let (client, uri, args, next) = (client.clone(), uri.clone(), args.clone(), next.clone());
        set.spawn(async move {
            let mut r = Report::default();
            let mut lat: Vec<u32> = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= args.requests || Instant::now() >= deadline {
                    break;
                }
                let t0 = if args.rate > 0.0 {
                    let at = start + Duration::from_secs_f64(i as f64 / args.rate);
                    if at >= deadline {
                        break;
                    }
                    tokio::time::sleep_until(at.into()).await;
                    at
                } else {
                    Instant::now()
                };
                let req = http::Request::post(uri.clone())
                    .header("content-type", "application/json")
                    .body(Full::new(body(&args, i)))
                    .expect("a valid request");
                let answer = async {
                    let res = client.request(req).await?;
                    let status = res.status();
                    let bytes = res.into_body().collect().await?.to_bytes();
                    Ok::<_, anyhow::Error>((status, bytes))
                }
                .await;
                lat.push(t0.elapsed().as_micros().min(u32::MAX as u128) as u32);
                r.requests += 1;
                match answer {
                    Ok((status, bytes)) if status.as_u16() == 202 => {
                        r.ok += 1;
                        r.accepted += count(&bytes, br#""result":"accepted""#);
                        r.duplicates += count(&bytes, br#""result":"duplicate""#);
                    }
                    Ok((status, bytes)) => {
                        r.errors += 1;
                        r.first_error.get_or_insert_with(|| {
                            format!("{status}: {}", String::from_utf8_lossy(&bytes))
                        });
                    }
                    Err(e) => {
                        r.errors += 1;
                        r.first_error.get_or_insert_with(|| format!("{e:#}"));
                    }
                }
            }
            (r, lat)
        });
    }
    let mut total = Report::default();
    let mut lat: Vec<u32> = Vec::new();
    while let Some(res) = set.join_next().await {
        let (r, l) = res?;
        total.requests += r.requests;
        total.ok += r.ok;
        total.errors += r.errors;
        total.accepted += r.accepted;
        total.duplicates += r.duplicates;
        if total.first_error.is_none() {
            total.first_error = r.first_error;
        }
        lat.extend(l);
    }
    total.elapsed_s = start.elapsed().as_secs_f64();
    total.rps = total.requests as f64 / total.elapsed_s;
    total.first_post_ms = first_post_ms;
    lat.sort_unstable();
    let pct = |p: f64| {
        lat.get(((lat.len() as f64 * p) as usize).min(lat.len().saturating_sub(1)))
            .map(|us| f64::from(*us) / 1000.0)
            .unwrap_or(0.0)
    };
    total.p50_ms = pct(0.50);
    total.p99_ms = pct(0.99);
    total.p999_ms = pct(0.999);
    Ok(total)
}
