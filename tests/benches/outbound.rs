//! Outbound send cost over HTTPS (HTTP/1.1 and HTTP/2, pooled) against plain
//! HTTP, through the real `wasi:http` hooks of a channel instance
//! (`OutboundHooks::send_request`, called directly: policy check, the
//! instance's pooled client, rustls, hyper; no plugin call around it).
//!
//! One local server implementation (harness `tls`: hyper serving h1 and h2)
//! on 127.0.0.1, three listeners: plain HTTP, HTTPS offering only
//! `http/1.1`, HTTPS offering `h2` and `http/1.1`. Each mode sends the same
//! number of small POSTs from `CONCURRENCY` tasks sharing one client (one
//! channel instance), reading each response to the end. Prints sends/s, mean
//! and p99 latency, the ratio of throughput to plain HTTP, and TLS
//! handshakes per 1,000 sends (about the pool size, not 1,000).
//!
//! `cargo bench -p pushonce-tests --bench outbound [-- SENDS CONCURRENCY]`

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use pushonce::config::ChannelConfig;
use pushonce::plugin::HttpClient;
use pushonce::plugin::http::OutboundHooks;
use pushonce_tests::tls::{Alpn, TestCa, TestServer};
use wasmtime_wasi_http::{WasiBody, WasiHttpHooks};

/// One mode's measurements.
struct Row {
    what: &'static str,
    sends: usize,
    elapsed: Duration,
    latencies: Vec<Duration>,
    handshakes: u64,
}

fn request(url: &str) -> http::Request<WasiBody> {
    let body = Full::new(Bytes::from_static(
        br#"{"to":"+8613800000000","text":"hi"}"#,
    ))
    .map_err(|never| match never {})
    .boxed_unsync();
    http::Request::post(url)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(body)
        .unwrap()
}

/// Sends `sends` POSTs to `url` from `concurrency` tasks over one client.
async fn run(
    what: &'static str,
    config: &ChannelConfig,
    url: String,
    sends: usize,
    concurrency: usize,
) -> Row {
    let policy = Arc::new(config.outbound_policy().unwrap());
    let client = HttpClient::new(&policy);
    let start = Instant::now();
    let mut tasks = Vec::new();
    for w in 0..concurrency {
        let mut hooks = OutboundHooks {
            policy: policy.clone(),
            client: Some(client.clone()),
            log: Arc::default(),
        };
        let url = url.clone();
        let n = sends / concurrency + usize::from(w < sends % concurrency);
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::with_capacity(n);
            for _ in 0..n {
                let t = Instant::now();
                let fut = hooks.send_request(request(&url), None, Box::new(async { Ok(()) }));
                let (resp, _) = Box::into_pin(fut).await.expect("the send works");
                assert_eq!(resp.status(), 200);
                resp.into_body()
                    .collect()
                    .await
                    .expect("the answer arrives");
                lat.push(t.elapsed());
            }
            lat
        }));
    }
    let mut latencies = Vec::with_capacity(sends);
    for t in tasks {
        latencies.extend(t.await.unwrap());
    }
    Row {
        what,
        sends,
        elapsed: start.elapsed(),
        latencies,
        handshakes: client.tls_handshakes(),
    }
}

fn print(rows: &mut [Row], concurrency: usize) {
    let base = rows[0].sends as f64 / rows[0].elapsed.as_secs_f64();
    println!(
        "{:<34} {:>5} {:>7} {:>10} {:>9} {:>9} {:>8} {:>10} {:>16}",
        "WHAT",
        "C",
        "SENDS",
        "SENDS/S",
        "MEAN µs",
        "P99 µs",
        "VS PLAIN",
        "HANDSHAKES",
        "HANDSHAKES/1000"
    );
    for r in rows.iter_mut() {
        r.latencies.sort();
        let rate = r.sends as f64 / r.elapsed.as_secs_f64();
        let mean = r.latencies.iter().sum::<Duration>() / r.latencies.len() as u32;
        let p99 = r.latencies[(r.latencies.len() * 99 / 100).min(r.latencies.len() - 1)];
        println!(
            "{:<34} {:>5} {:>7} {:>10.0} {:>9} {:>9} {:>8.3} {:>10} {:>16.1}",
            r.what,
            concurrency,
            r.sends,
            rate,
            mean.as_micros(),
            p99.as_micros(),
            rate / base,
            r.handshakes,
            r.handshakes as f64 * 1000.0 / r.sends as f64
        );
    }
}

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let sends = args.first().copied().unwrap_or(20_000);
    let concurrency = args.get(1).copied().unwrap_or(16);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let dir = tempfile::tempdir().unwrap();
        let ca = TestCa::new("pushonce bench CA");
        let leaf = ca.leaf(&["127.0.0.1"]);
        let plain = TestServer::plain("127.0.0.1").await;
        let h1 = TestServer::https("127.0.0.1", &leaf, Alpn::H1Only).await;
        let h2 = TestServer::https("127.0.0.1", &leaf, Alpn::H2AndH1).await;
        let config = |addr: std::net::SocketAddr| {
            let mut c = ChannelConfig::new("bench@^1");
            c.allowed_hosts = vec![addr.to_string()];
            c.allow_plaintext = true;
            c.ca_file = Some(ca.write(dir.path(), "ca.pem"));
            c
        };
        // Warm-up (page cache, allocator, first handshakes are not measured).
        let warm = TestServer::https("127.0.0.1", &leaf, Alpn::H2AndH1).await;
        let url = format!("https://{}/send", warm.addr);
        let _ = run("warm-up", &config(warm.addr), url, 200, 4).await;
        let modes = [
            ("plain HTTP/1.1 (allow_plaintext)", "http", &plain),
            ("HTTPS HTTP/1.1 (pooled)", "https", &h1),
            ("HTTPS HTTP/2 (ALPN h2, pooled)", "https", &h2),
        ];
        let mut rows = Vec::new();
        for (what, scheme, server) in modes {
            let url = format!("{scheme}://{}/send", server.addr);
            rows.push(run(what, &config(server.addr), url, sends, concurrency).await);
        }
        let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
        println!(
            "outbound bench: {sends} POSTs per mode, {concurrency} tasks over one channel instance's client, hooks called directly; loadavg at end {}",
            load.split_whitespace().take(3).collect::<Vec<_>>().join(" ")
        );
        print(&mut rows, concurrency);
        for (row, server) in rows.iter().zip([&plain, &h1, &h2]) {
            assert_eq!(server.requests().len(), row.sends, "{}", row.what);
        }
    });
}
