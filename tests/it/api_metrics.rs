//! `/metrics` of a real `pushonce serve` process reflects what happened:
//! accepted and duplicate channels, refusals, the permit latency histogram,
//! plugin calls, the retry-queue depth read from Redis, and the dispatcher's
//! outcomes through the real channel plugins to the provider simulator.
//! The Prometheus recorder is global to a process, so the host runs in its
//! own: the other tests of this binary count into theirs.

use pushonce_tests::host::{order_shipped, repo_root};
use pushonce_tests::providers;
use pushonce_tests::redis::RedisServer;
use pushonce_tests::stack::{ServeConfig, ServeProcess, copy_dir};
use reqwest::StatusCode;
use serde_json::{Value, json};

/// A client's answer: status and body.
struct Answer {
    status: StatusCode,
    body: String,
}

/// `POST base/path` with a JSON body.
async fn post(client: &reqwest::Client, base: &str, path: &str, body: &Value) -> Answer {
    let res = client
        .post(format!("{base}{path}"))
        .json(body)
        .send()
        .await
        .unwrap();
    let status = res.status();
    Answer {
        status,
        body: res.text().await.unwrap(),
    }
}

/// The Prometheus text of `GET base/metrics`.
async fn metrics(client: &reqwest::Client, base: &str) -> String {
    let res = client.get(format!("{base}/metrics")).send().await.unwrap();
    res.error_for_status().unwrap().text().await.unwrap()
}

/// The value of the sample `name{labels}` in a Prometheus text, if present.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
        let (name, value) = l.rsplit_once(' ')?;
        (name == series).then(|| value.parse().ok())?
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_reflect_what_happened() {
    let redis = RedisServer::start().await.unwrap();
    let sim = providers::sim().await;
    let dir = tempfile::tempdir().unwrap();
    let policies = dir.path().join("policies");
    copy_dir(&repo_root().join("policies"), &policies).unwrap();
    let config = ServeConfig::new(&redis.url(), &sim);
    let mut host = ServeProcess::start(&config, dir.path(), &policies)
        .await
        .unwrap();
    let (client, base) = (reqwest::Client::new(), host.base().to_string());
    for _ in 0..3 {
        let a = post(&client, &base, "/v1/events", &order_shipped("o-m")).await;
        assert_eq!(a.status, StatusCode::ACCEPTED, "{}", a.body);
    }
    let bad = json!({"biz_type": "NOPE", "biz_id": "b", "user_id": "u"});
    assert_eq!(
        post(&client, &base, "/v1/events", &bad)
            .await
            .status
            .as_u16(),
        422
    );

    // A task waiting for a retry shows in the retry-queue depth (read from Redis).
    let mut conn = redis.manager().await.unwrap();
    let _: () = redis::cmd("ZADD")
        .arg("{po:0}:delayed")
        .arg(i64::MAX / 2)
        .arg("0-1-ffff")
        .query_async(&mut conn)
        .await
        .unwrap();

    let text = metrics(&client, &base).await;
    for channel in ["sms", "wechat", "app-push"] {
        assert_eq!(
            sample(
                &text,
                &format!("pushonce_accepted_total{{channel=\"{channel}\"}}")
            ),
            Some(1.0),
            "{text}"
        );
        assert_eq!(
            sample(
                &text,
                &format!("pushonce_duplicates_total{{channel=\"{channel}\"}}")
            ),
            Some(2.0),
            "{text}"
        );
    }
    assert_eq!(
        sample(&text, "pushonce_http_refused_total{status=\"422\"}"),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        sample(&text, "pushonce_permit_seconds_count"),
        Some(3.0),
        "{text}"
    );
    assert!(
        text.contains("pushonce_permit_seconds_bucket{le=\"0.005\"}"),
        "{text}"
    );
    assert_eq!(
        sample(&text, "pushonce_retry_queue_depth"),
        Some(1.0),
        "{text}"
    );
    assert!(
        sample(
            &text,
            "pushonce_plugin_calls_total{plugin=\"per-event@1.0.0\"}"
        )
        .unwrap_or(0.0)
            >= 9.0,
        "{text}"
    );
    assert_eq!(
        sample(&text, "pushonce_policy_generation"),
        Some(1.0),
        "{text}"
    );

    // A refused reload (a policy file that does not parse) is counted.
    let broken = policies.join("broken.toml");
    std::fs::write(&broken, "biz_type = \"X\"\nwindow = 24h\n").unwrap();
    let a = post(&client, &base, "/admin/reload", &json!({})).await;
    assert_eq!(a.status.as_u16(), 422, "{}", a.body);
    std::fs::remove_file(&broken).unwrap();

    // The dispatcher's outcomes: each accepted channel sent once, with its
    // send latency observed.
    let scrape = || async { metrics(&client, &base).await };
    let all_sent = pushonce_tests::wait_until(std::time::Duration::from_secs(20), || async {
        let text = scrape().await;
        ["sms", "wechat", "app-push"]
            .iter()
            .all(|c| sample(&text, &format!("pushonce_sent_total{{channel=\"{c}\"}}")) == Some(1.0))
    })
    .await;
    let text = scrape().await;
    assert!(all_sent.is_ok(), "{text}");
    assert_eq!(
        sample(&text, "pushonce_send_seconds_count{channel=\"sms\"}"),
        Some(1.0),
        "{text}"
    );
    assert!(
        sample(&text, "pushonce_policy_reload_refused_total").unwrap_or(0.0) >= 1.0,
        "{text}"
    );
    host.terminate(std::time::Duration::from_secs(20))
        .await
        .unwrap();
}
