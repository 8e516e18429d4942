//! What `wait_replicas` costs an accept, measured in one run (`cargo bench
//! -p pushonce-tests --bench replicas`): a real primary with a real replica
//! (`REPLICAOF`, on loopback), events of three channels accepted as the API
//! does (one pipeline per event), `CONCURRENCY` clients at once, first with
//! `wait_replicas = 0` (answered once the primary has the writes), then with
//! 1 (the pipeline ends with `WAIT 1`). Prints accepted events per second and
//! latency percentiles as ratios against the first row.

use std::time::{Duration, Instant};

use pushonce::permit::{AcceptRequest, PermitConfig, Permits, RetryPolicy};
use pushonce_tests::redis::RedisServer;

/// Events accepted per row.
const EVENTS: usize = 6000;
/// Channels per event (one accept script each, one pipeline per event).
const CHANNELS: usize = 3;
/// Clients posting at once.
const CONCURRENCY: usize = 16;

fn event(run: &str, i: usize) -> Vec<AcceptRequest> {
    ["sms", "wechat", "app-push"][..CHANNELS]
        .iter()
        .map(|channel| AcceptRequest {
            key: format!("push:per-event@1:{channel}:BENCH:{run}-{i}:u-{i}"),
            channel: channel.to_string(),
            window: Duration::from_secs(3600),
            biz_type: "BENCH".into(),
            biz_id: format!("{run}-{i}"),
            event_json: format!(r#"{{"user_id":"u-{i}"}}"#).into(),
            payload: r#"{"template":"t"}"#.into(),
            policy_name: "per-event".into(),
            policy_version: "1.0.0".into(),
            retry: RetryPolicy::default(),
            gate: Default::default(),
            recipient: None,
            send_at_ms: None,
        })
        .collect()
}

/// One row: events/s and the latency percentiles (p50, p99) of one event's accept.
struct Row {
    rate: f64,
    p50: Duration,
    p99: Duration,
}

/// Accepts `EVENTS` events with `wait_replicas`, `CONCURRENCY` at once.
async fn run(primary: &RedisServer, run: &'static str, wait_replicas: u32) -> Row {
    let permits = primary
        .permits(PermitConfig {
            wait_replicas,
            wait_replicas_timeout: Duration::from_secs(1),
            ..PermitConfig::default()
        })
        .await
        .unwrap();
    permits.prepare().await.unwrap();
    let started = Instant::now();
    let mut set = tokio::task::JoinSet::new();
    for w in 0..CONCURRENCY {
        let permits: Permits = permits.clone();
        set.spawn(async move {
            let mut latencies = Vec::new();
            for i in (w..EVENTS).step_by(CONCURRENCY) {
                let reqs = event(run, i);
                let t = Instant::now();
                permits.accept_batch(&reqs).await.expect("accepted");
                latencies.push(t.elapsed());
            }
            latencies
        });
    }
    let mut latencies = Vec::with_capacity(EVENTS);
    while let Some(done) = set.join_next().await {
        latencies.extend(done.unwrap());
    }
    let rate = EVENTS as f64 / started.elapsed().as_secs_f64();
    latencies.sort_unstable();
    let at = |q: f64| latencies[((latencies.len() - 1) as f64 * q) as usize];
    Row {
        rate,
        p50: at(0.50),
        p99: at(0.99),
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let primary = RedisServer::start().await.unwrap();
    let replica = RedisServer::start().await.unwrap();
    let mut conn = replica.manager().await.unwrap();
    redis::cmd("REPLICAOF")
        .arg("127.0.0.1")
        .arg(primary.port())
        .query_async::<()>(&mut conn)
        .await
        .unwrap();
    eprintln!("replicas bench: waiting for the replica's first sync");
    replica
        .wait_replica_synced(Duration::from_secs(30))
        .await
        .expect("the replica syncs from the primary within 30 s");

    eprintln!("replicas bench: {EVENTS} events without WAIT");
    let off = run(&primary, "off", 0).await;
    eprintln!("replicas bench: {EVENTS} events with WAIT 1");
    let on = run(&primary, "wait1", 1).await;

    println!(
        "wait_replicas benchmark: {EVENTS} events × {CHANNELS} channels, {CONCURRENCY} concurrent, one primary + one replica on loopback"
    );
    println!("| wait_replicas | events/s | vs 0 | p50 ms | p99 ms | p99 vs 0 |");
    println!("|---|---|---|---|---|---|");
    for (name, row) in [("0", &off), ("1", &on)] {
        println!(
            "| {name} | {:.0} | {:.2} | {:.2} | {:.2} | {:.2} |",
            row.rate,
            row.rate / off.rate,
            row.p50.as_secs_f64() * 1e3,
            row.p99.as_secs_f64() * 1e3,
            row.p99.as_secs_f64() / off.p99.as_secs_f64(),
        );
    }
}
