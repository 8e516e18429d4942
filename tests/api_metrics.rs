//! `/metrics` reflects what happened, in its own test binary because the
//! Prometheus recorder is global to a process: accepted and duplicate
//! channels, refusals, the permit latency histogram, plugin calls, and the
//! retry-queue depth read from Redis, and the dispatcher's outcomes.

use pushonce_tests::host::{TestHost, order_shipped};
use pushonce_tests::redis::RedisServer;
use reqwest::StatusCode;
use serde_json::json;

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
    let host = TestHost::start(&redis).await.unwrap();
    for _ in 0..3 {
        let a = host
            .post("/v1/events", &order_shipped("o-m"), None)
            .await
            .unwrap();
        assert_eq!(a.status, StatusCode::ACCEPTED);
    }
    let bad = json!({"biz_type": "NOPE", "biz_id": "b", "user_id": "u"});
    assert_eq!(
        host.post("/v1/events", &bad, None)
            .await
            .unwrap()
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

    let text = host.metrics().await.unwrap();
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
    std::fs::write(
        host.policy_dir().join("broken.toml"),
        "biz_type = \"X\"\nwindow = 24h\n",
    )
    .unwrap();
    let a = host.post("/admin/reload", &json!({}), None).await.unwrap();
    assert_eq!(a.status.as_u16(), 422, "{:?}", a.body);
    std::fs::remove_file(host.policy_dir().join("broken.toml")).unwrap();

    // The dispatcher's outcomes: each accepted channel sent once, with its
    // send latency observed.
    let scrape = || async { host.metrics().await.unwrap() };
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
    host.shutdown().await.unwrap();
}
