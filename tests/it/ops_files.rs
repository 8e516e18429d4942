//! The operators' files in `docs/ops/` — the Grafana dashboard and the
//! Prometheus alert rules — name only series a real host exports: a host
//! is started, sends one event, and every `pushonce_*` name the files use
//! must be in its `/metrics`.

use std::collections::BTreeSet;
use std::time::Duration;

use pushonce_tests::host::{TestHost, order_shipped, repo_root};
use pushonce_tests::redis::RedisServer;
use pushonce_tests::wait_until;

/// Every `pushonce_…` metric name in `text`.
fn names_in(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find("pushonce_") {
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        names.insert(tail[..end].to_string());
        rest = &tail[end..];
    }
    names
}

#[tokio::test]
async fn the_dashboard_and_the_alert_rules_use_only_exported_series() {
    let dashboard_text =
        std::fs::read_to_string(repo_root().join("docs/ops/grafana-dashboard.json")).unwrap();
    let alerts =
        std::fs::read_to_string(repo_root().join("docs/ops/prometheus-alerts.yml")).unwrap();

    // The dashboard is valid JSON whose every panel queries something.
    let dashboard: serde_json::Value = serde_json::from_str(&dashboard_text).unwrap();
    let panels = dashboard["panels"].as_array().unwrap();
    assert!(panels.len() >= 8, "{} panels", panels.len());
    let mut exprs = String::new();
    for p in panels {
        let targets = p["targets"].as_array().unwrap();
        assert!(!targets.is_empty(), "panel {} has no query", p["title"]);
        for t in targets {
            let e = t["expr"].as_str().unwrap();
            assert!(e.contains("pushonce_"), "panel {}: {e}", p["title"]);
            exprs.push_str(e);
            exprs.push('\n');
        }
    }
    // Each alert rule has an expression, a severity and a summary.
    let rules: Vec<&str> = alerts.split("- alert:").skip(1).collect();
    assert!(rules.len() >= 8, "{} rules", rules.len());
    for rule in &rules {
        let name = rule.lines().next().unwrap_or_default().trim();
        for part in ["expr:", "severity:", "summary:"] {
            assert!(rule.contains(part), "alert {name} lacks {part}");
        }
    }

    // A host that sent one message exports every name the files use.
    let redis = RedisServer::start().await.unwrap();
    let host = TestHost::start(&redis).await.unwrap();
    let a = host
        .post("/v1/events", &order_shipped("o-ops"), None)
        .await
        .unwrap();
    assert_eq!(a.status.as_u16(), 202);
    let refused = host
        .post("/v1/events", &serde_json::json!({"biz_type": "NOPE"}), None)
        .await
        .unwrap();
    assert_eq!(refused.status.as_u16(), 422);
    let metrics = || async { host.metrics().await.unwrap() };
    wait_until(Duration::from_secs(20), || async {
        let text = metrics().await;
        text.contains("pushonce_send_seconds_bucket")
            && text.contains("pushonce_reconcile_lag_seconds")
    })
    .await
    .expect("a send was recorded and the reconciler made a pass");
    let exported = metrics().await;
    let exported_names = names_in(&exported);
    let used = names_in(&exprs)
        .into_iter()
        .chain(names_in(&alerts))
        .collect::<BTreeSet<_>>();
    let missing: Vec<&String> = used.difference(&exported_names).collect();
    assert!(
        missing.is_empty(),
        "used by docs/ops but not exported: {missing:?}\n/metrics:\n{exported}"
    );
}
