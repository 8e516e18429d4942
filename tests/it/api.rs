//! The HTTP API through a real listening host on 127.0.0.1, with a real
//! redis-server and the real key-policy plugins: accept then duplicate,
//! 200 concurrent posts of one event, every error case with its problem
//! body, 503 then a safe retry, auth, lookups, batch, reload, dead → requeue,
//! and the OpenAPI file against the served document.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use pushonce::api::ApiLimits;
use pushonce::send::{Faults, LedgerFileSender};
use pushonce_tests::host::{Setup, TestHost, order_shipped, repo_root};
use pushonce_tests::redis::RedisServer;
use pushonce_tests::wait_until;
use reqwest::StatusCode;
use serde_json::{Value, json};

fn results(body: &Value) -> Vec<(String, String, String)> {
    body["results"]
        .as_array()
        .unwrap_or_else(|| panic!("no results in {body}"))
        .iter()
        .map(|r| {
            (
                r["channel"].as_str().unwrap().to_string(),
                r["result"].as_str().unwrap().to_string(),
                r["task_id"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

/// Asserts a problem-details answer with `status` naming `field` (if given).
fn assert_problem(a: &pushonce_tests::host::Answer, status: u16, field: Option<&str>) {
    assert_eq!(a.status.as_u16(), status, "{:?}", a.body);
    assert_eq!(a.content_type(), "application/problem+json", "{:?}", a.body);
    assert_eq!(a.body["status"], status, "{}", a.body);
    assert!(
        a.body["type"]
            .as_str()
            .unwrap()
            .starts_with("urn:pushonce:problem:")
    );
    assert!(!a.body["detail"].as_str().unwrap().is_empty());
    if let Some(f) = field {
        assert_eq!(a.body["field"], f, "{}", a.body);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn accept_then_duplicate_then_lookups_and_delivery() {
    let redis = RedisServer::start().await.unwrap();
    let host = TestHost::start(&redis).await.unwrap();

    let first = host
        .post("/v1/events", &order_shipped("o-1"), None)
        .await
        .unwrap();
    assert_eq!(first.status, StatusCode::ACCEPTED, "{}", first.body);
    let got = results(&first.body);
    let channels: Vec<&str> = got.iter().map(|r| r.0.as_str()).collect();
    assert_eq!(channels, ["sms", "wechat", "app-push"]);
    assert!(got.iter().all(|r| r.1 == "accepted"), "{}", first.body);
    assert_eq!(
        first.body["results"][0]["key"],
        "push:per-event@1:sms:ORDER_SHIPPED:o-1:u-42"
    );

    let again = host
        .post("/v1/events", &order_shipped("o-1"), None)
        .await
        .unwrap();
    assert_eq!(again.status, StatusCode::ACCEPTED);
    for (a, b) in results(&again.body).iter().zip(&got) {
        assert_eq!(a.1, "duplicate", "{}", again.body);
        assert_eq!(a.2, b.2, "a duplicate names the first task");
    }
    assert!(again.body["results"][0]["status"].is_string());

    // The task, with its payload (recipient, template, params, fallback derived now).
    let sms_task = &got[0].2;
    let task = host
        .get(&format!("/v1/tasks/{sms_task}"), None)
        .await
        .unwrap();
    assert_eq!(task.status, StatusCode::OK, "{}", task.body);
    assert_eq!(task.body["channel"], "sms");
    assert_eq!(task.body["max_attempts"], 5);
    assert_eq!(task.body["window_ms"], 24 * 3600 * 1000);
    let payload = &task.body["payload"];
    assert_eq!(payload["recipient"], "+8613800000000");
    // The policy names SMS's own template; the fallback takes the event's.
    assert_eq!(payload["template"], "SMS_465910001");
    assert_eq!(payload["params"], json!([["order", "o-1"]]));
    assert_eq!(payload["fallback"]["channel"], "app-push");
    assert_eq!(
        payload["fallback"]["key"],
        "push:per-event@1:app-push:ORDER_SHIPPED:o-1:u-42"
    );
    assert_eq!(payload["fallback"]["payload"]["recipient"], "token-42");
    assert_eq!(payload["fallback"]["payload"]["template"], "SHIPPED_V1");
    assert_eq!(task.body["event"]["occurred_at"], 1_796_054_399_000u64);

    let event = host
        .get("/v1/events/ORDER_SHIPPED/o-1?user_id=u-42", None)
        .await
        .unwrap();
    assert_eq!(event.status, StatusCode::OK, "{}", event.body);
    assert_eq!(event.body["tasks"].as_array().unwrap().len(), 3);
    let other = host
        .get("/v1/events/ORDER_SHIPPED/o-1?user_id=u-7", None)
        .await
        .unwrap();
    assert_problem(&other, 404, None);

    // The dispatcher sends every task once through the development ledger.
    let ids: Vec<String> = got.iter().map(|r| r.2.clone()).collect();
    host.wait_sent(&ids, Duration::from_secs(20)).await.unwrap();
    let ledger = pushonce_tests::process::read_ledger(&host.ledger());
    assert_eq!(ledger.len(), 3, "{ledger:?}");

    // The key search finds the permit's owner; the corpus holds the event.
    let key = "push:per-event@1:wechat:ORDER_SHIPPED:o-1:u-42";
    let found = host
        .get(&format!("/admin/tasks?key={}", urlencode(key)), None)
        .await
        .unwrap();
    assert_eq!(found.status, StatusCode::OK, "{}", found.body);
    assert_eq!(found.body["owner"], got[1].2.as_str());
    assert_eq!(found.body["task"]["status"], "sent");
    let mut conn = redis.manager().await.unwrap();
    let recent = pushonce::corpus::recent_events(&mut conn, "po", 10)
        .await
        .unwrap();
    assert_eq!(recent.len(), 2, "both posts are sampled");
    assert_eq!(recent[0].biz_id, "o-1");

    host.shutdown().await.unwrap();
}

fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_event_posted_200_times_concurrently_is_accepted_once_per_channel() {
    let redis = RedisServer::start().await.unwrap();
    let host = Arc::new(TestHost::start(&redis).await.unwrap());
    let mut posts = tokio::task::JoinSet::new();
    for _ in 0..200 {
        let host = host.clone();
        posts.spawn(async move {
            host.post("/v1/events", &order_shipped("o-concurrent"), None)
                .await
                .unwrap()
        });
    }
    let mut accepted: HashMap<String, Vec<String>> = HashMap::new();
    let mut duplicates = 0;
    while let Some(answer) = posts.join_next().await {
        let answer = answer.unwrap();
        assert_eq!(answer.status, StatusCode::ACCEPTED, "{}", answer.body);
        for (channel, result, task) in results(&answer.body) {
            if result == "accepted" {
                accepted.entry(channel).or_default().push(task);
            } else {
                duplicates += 1;
            }
        }
    }
    assert_eq!(accepted.len(), 3, "{accepted:?}");
    assert!(accepted.values().all(|v| v.len() == 1), "{accepted:?}");
    assert_eq!(duplicates, 200 * 3 - 3);
    Arc::into_inner(host).unwrap().shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_refusal_is_a_problem_naming_the_field_or_plugin() {
    let redis = RedisServer::start().await.unwrap();
    let host = TestHost::start_with(
        &redis,
        Setup {
            limits: ApiLimits {
                body_bytes: 4096,
                batch_max: 3,
                ..ApiLimits::default()
            },
            ..Setup::default()
        },
    )
    .await
    .unwrap();
    let with = |patch: Value| {
        let mut e = order_shipped("o-bad");
        for (k, v) in patch.as_object().unwrap() {
            if v.is_null() {
                e.as_object_mut().unwrap().remove(k);
            } else {
                e[k] = v.clone();
            }
        }
        e
    };
    let cases: Vec<(Value, &str)> = vec![
        (with(json!({"biz_type": "NO_SUCH_TYPE"})), "biz_type"),
        (with(json!({"channels": ["inbox"]})), "channels[0]"),
        (with(json!({"channels": []})), "channels"),
        (with(json!({"biz_id": null})), "biz_id"),
        (with(json!({"biz_id": ""})), "biz_id"),
        (with(json!({"biz_id": "x".repeat(129)})), "biz_id"),
        (with(json!({"user_id": 42})), "user_id"),
        (with(json!({"colour": "red"})), "colour"),
        (
            with(json!({"recipients": {"wechat": "w", "app-push": "a"}})),
            "recipients.sms",
        ),
        (
            with(json!({"recipients": {"sms": "1", "wechat": "w", "app-push": "a", "fax": "f"}})),
            "recipients.fax",
        ),
        (with(json!({"occurred_at": "yesterday"})), "occurred_at"),
        (with(json!({"params": {"p": "v".repeat(1025)}})), "params.p"),
        (with(json!({"attributes": {"a": [1]}})), "attributes.a"),
    ];
    for (body, field) in cases {
        let a = host.post("/v1/events", &body, None).await.unwrap();
        assert_problem(&a, 422, Some(field));
    }

    // A failing key policy: the plugin's error, named.
    let interview = json!({"biz_type": "INTERVIEW_REMINDER", "biz_id": "i-1", "user_id": "u-1",
        "occurred_at": "2026-11-30T08:00:00Z", "recipients": {"sms": "1", "app-push": "t"}});
    let a = host.post("/v1/events", &interview, None).await.unwrap();
    assert_problem(&a, 422, None);
    assert!(
        a.body["plugin"]
            .as_str()
            .unwrap()
            .starts_with("per-user-per-job@1"),
        "{}",
        a.body
    );
    assert!(
        a.body["detail"].as_str().unwrap().contains("job_id"),
        "{}",
        a.body
    );

    // Malformed JSON, wrong media type, too large, unknown route, method.
    let raw = |body: &'static str, ct: &'static str| {
        host.client
            .post(host.url("/v1/events"))
            .header("content-type", ct)
            .body(body)
    };
    assert_problem(
        &host
            .send(raw("{\"biz_type\":", "application/json"))
            .await
            .unwrap(),
        400,
        None,
    );
    assert_problem(
        &host.send(raw("{}", "text/plain")).await.unwrap(),
        415,
        None,
    );
    assert_problem(
        &host
            .send(host.client.post(host.url("/v1/events")).body("{}"))
            .await
            .unwrap(),
        415,
        None,
    );
    let big = with(json!({"template": "t".repeat(5000)}));
    assert_problem(
        &host.post("/v1/events", &big, None).await.unwrap(),
        413,
        None,
    );
    assert_problem(&host.get("/v1/nothing", None).await.unwrap(), 404, None);
    assert_problem(&host.get("/v1/events", None).await.unwrap(), 405, None);
    assert_problem(
        &host.get("/v1/tasks/3-1-ffff", None).await.unwrap(),
        404,
        None,
    );
    assert_problem(
        &host.get("/v1/tasks/garbage", None).await.unwrap(),
        404,
        None,
    );

    // Batch: per-event results; too many events is refused whole.
    let batch = json!({"events": [order_shipped("o-b1"), with(json!({"biz_type": "NOPE"})), order_shipped("o-b1")]});
    let a = host.post("/v1/events:batch", &batch, None).await.unwrap();
    assert_eq!(a.status, StatusCode::OK, "{}", a.body);
    let items = a.body["results"].as_array().unwrap();
    assert_eq!(items[0]["status"], 202);
    assert_eq!(items[0]["accepted"]["results"][0]["result"], "accepted");
    assert_eq!(items[1]["status"], 422);
    assert_eq!(items[1]["problem"]["field"], "biz_type");
    assert_eq!(items[2]["accepted"]["results"][0]["result"], "duplicate");
    let four = json!({"events": [order_shipped("1"), order_shipped("2"), order_shipped("3"), order_shipped("4")]});
    assert_problem(
        &host.post("/v1/events:batch", &four, None).await.unwrap(),
        422,
        Some("events"),
    );
    assert_problem(
        &host
            .post("/v1/events:batch", &json!({"events": []}), None)
            .await
            .unwrap(),
        422,
        Some("events"),
    );
    let bad_item = json!({"events": [{"biz_type": "ORDER_SHIPPED"}]});
    let a = host
        .post("/v1/events:batch", &bad_item, None)
        .await
        .unwrap();
    assert_eq!(
        a.body["results"][0]["problem"]["field"], "events[0].biz_id",
        "{}",
        a.body
    );

    // Receipts: a callback the channel plugin cannot parse is a 400 naming why
    // (the `sms` channel is Aliyun SMS: its receipts are a JSON array).
    let a = host
        .send(
            host.client
                .post(host.url("/v1/receipts/sms/cb-sms-9d2e61f0a7c3b5d4e8f1"))
                .body("x"),
        )
        .await
        .unwrap();
    assert_problem(&a, 400, None);
    assert!(
        a.body["detail"]
            .as_str()
            .unwrap()
            .starts_with("not a JSON array of reports"),
        "{}",
        a.body
    );
    // No such channel, no token, a wrong token: the same 404, so the route
    // does not tell which channels exist.
    for path in [
        "/v1/receipts/fax/cb-sms-9d2e61f0a7c3b5d4e8f1",
        "/v1/receipts/sms",
        "/v1/receipts/sms/wrong-token",
    ] {
        let a = host
            .send(host.client.post(host.url(path)).body("x"))
            .await
            .unwrap();
        assert_problem(&a, 404, None);
        assert_eq!(a.body["detail"], "no such route", "{path}: {}", a.body);
    }
    host.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_down_is_503_and_the_retry_is_safe() {
    let mut redis = RedisServer::start().await.unwrap();
    let host = TestHost::start(&redis).await.unwrap();
    let mut sms_only = order_shipped("o-503");
    sms_only["channels"] = json!(["sms"]);
    let first = host.post("/v1/events", &sms_only, None).await.unwrap();
    assert_eq!(first.status, StatusCode::ACCEPTED, "{}", first.body);
    let sms_task = results(&first.body)[0].2.clone();

    redis.stop().await.unwrap();
    let down = host
        .post("/v1/events", &order_shipped("o-503"), None)
        .await
        .unwrap();
    assert_problem(&down, 503, None);
    assert!(down.headers.contains_key("retry-after"));
    assert_eq!(down.body["accepted"], json!([]), "{}", down.body);
    assert!(down.body["detail"].as_str().unwrap().contains("safe"));
    assert_problem(&host.get("/readyz", None).await.unwrap(), 503, None);
    assert_eq!(
        host.get("/healthz", None).await.unwrap().status,
        StatusCode::OK
    );

    redis.restart().await.unwrap();
    // The client reconnects on its own; retry until Redis answers (each 503 is safe).
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    let retry = loop {
        let a = host
            .post("/v1/events", &order_shipped("o-503"), None)
            .await
            .unwrap();
        if a.status == StatusCode::ACCEPTED {
            break a;
        }
        assert_problem(&a, 503, None);
        assert!(
            std::time::Instant::now() < deadline,
            "Redis did not come back"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let got = results(&retry.body);
    assert_eq!(got[0], ("sms".into(), "duplicate".into(), sms_task));
    assert_eq!(got[1].1, "accepted");
    assert_eq!(got[2].1, "accepted");
    assert_eq!(
        host.get("/readyz", None).await.unwrap().status,
        StatusCode::OK
    );
    host.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_guard_v1_admin_and_receipts() {
    let redis = RedisServer::start().await.unwrap();
    let env: HashMap<String, String> = [
        ("API_TOKEN", "api-secret"),
        ("ADMIN_TOKEN", "admin-secret"),
        ("CALLBACK_TOKEN_sms", "sms-path-token-7Hq2Zx9Lw4"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    let host = TestHost::start_with(
        &redis,
        Setup {
            env,
            auth: (Some("API_TOKEN".into()), Some("ADMIN_TOKEN".into())),
            ..Setup::default()
        },
    )
    .await
    .unwrap();
    let event = order_shipped("o-auth");
    for token in [None, Some("wrong"), Some("admin-secret")] {
        let a = host.post("/v1/events", &event, token).await.unwrap();
        assert_problem(&a, 401, None);
        assert!(
            a.headers["www-authenticate"]
                .to_str()
                .unwrap()
                .starts_with("Bearer")
        );
    }
    let a = host
        .post("/v1/events", &event, Some("api-secret"))
        .await
        .unwrap();
    assert_eq!(a.status, StatusCode::ACCEPTED, "{}", a.body);
    let task = results(&a.body)[0].2.clone();
    assert_problem(
        &host.get(&format!("/v1/tasks/{task}"), None).await.unwrap(),
        401,
        None,
    );
    assert_eq!(
        host.get(&format!("/v1/tasks/{task}"), Some("api-secret"))
            .await
            .unwrap()
            .status,
        StatusCode::OK
    );
    for token in [None, Some("api-secret")] {
        assert_problem(
            &host.get("/admin/policies", token).await.unwrap(),
            401,
            None,
        );
        let reload = host.post("/admin/reload", &json!({}), token).await.unwrap();
        assert_problem(&reload, 401, None);
    }
    assert_eq!(
        host.get("/admin/policies", Some("admin-secret"))
            .await
            .unwrap()
            .status,
        StatusCode::OK
    );
    // Receipts: the channel's path token, not a bearer token (providers send none).
    let receipt = |path: &str, bearer: Option<&'static str>| {
        let mut r = host.client.post(host.url(path)).body("{}");
        if let Some(t) = bearer {
            r = r.bearer_auth(t);
        }
        r
    };
    for (path, bearer) in [
        ("/v1/receipts/sms", None),
        ("/v1/receipts/sms", Some("api-secret")),
        ("/v1/receipts/sms/api-secret", None),
    ] {
        assert_problem(&host.send(receipt(path, bearer)).await.unwrap(), 404, None);
    }
    // With the channel's path token the callback reaches the plugin (which
    // refuses this one: it has no `receipts` array).
    let a = host
        .send(receipt("/v1/receipts/sms/sms-path-token-7Hq2Zx9Lw4", None))
        .await
        .unwrap();
    assert_problem(&a, 400, None);
    assert!(
        !a.body.to_string().contains("sms-path-token-7Hq2Zx9Lw4"),
        "the token is never echoed: {}",
        a.body
    );
    // Probes, metrics and the document are open.
    for path in ["/healthz", "/readyz", "/metrics", "/openapi.json"] {
        assert_eq!(
            host.get(path, None).await.unwrap().status,
            StatusCode::OK,
            "{path}"
        );
    }
    host.shutdown().await.unwrap();
}

const EXTRA_POLICY: &str = r#"
biz_type = "PASSWORD_CHANGED"
key_policy = "per-event@^1"
channels = ["inbox"]
window = "1h"
"#;

/// A channel plugin whose `describe` never answers holds neither the start
/// nor a reload: its file is refused by name after the load timeout, the
/// rest loads, and the next reload is free to run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_whose_describe_never_answers_is_refused_and_reloads_go_on() {
    let redis = RedisServer::start().await.unwrap();
    let setup = Setup {
        extra_plugins: vec![pushonce_tests::plugins::fixture("describe_waits")],
        ..Setup::default()
    };
    let host = tokio::time::timeout(Duration::from_secs(60), TestHost::start_with(&redis, setup))
        .await
        .expect("the host never started")
        .unwrap();
    let refused_file = |plugins: &Value| {
        plugins["refused"].as_array().unwrap().iter().any(|r| {
            let r = r.as_str().unwrap();
            r.contains("describe_waits.wasm") && r.contains("did not answer within")
        })
    };
    let plugins = host.get("/admin/plugins", None).await.unwrap();
    assert!(refused_file(&plugins.body), "{}", plugins.body);
    let mut generation = 1;
    for _ in 0..2 {
        let a = host.post("/admin/reload", &json!({}), None).await.unwrap();
        assert_eq!(a.status, StatusCode::OK, "{}", a.body);
        let now = a.body["generation"].as_u64().unwrap();
        assert!(now > generation, "{}", a.body);
        generation = now;
    }
    let plugins = host.get("/admin/plugins", None).await.unwrap();
    assert!(refused_file(&plugins.body), "{}", plugins.body);
    let a = host
        .post("/v1/events", &order_shipped("o-waits"), None)
        .await
        .unwrap();
    assert_eq!(a.status, StatusCode::ACCEPTED, "{}", a.body);
    host.shutdown().await.unwrap();
}

/// A key policy that refuses with 8 MiB of text costs the poster a problem
/// of a few KiB, its detail cut with a marker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_key_policy_refusal_is_answered_cut() {
    let redis = RedisServer::start().await.unwrap();
    let policy = "biz_type = \"LONG\"\nkey_policy = \"misbehave@^1\"\nchannels = [\"long-error\"]\nwindow = \"1h\"\n";
    let setup = Setup {
        extra_plugins: vec![pushonce_tests::plugins::fixture("misbehave")],
        policies: Some(vec![("long.toml".into(), policy.into())]),
        // A channel the misbehave policy refuses on (the inbox, renamed).
        configure: Some(Box::new(|config: &mut pushonce::config::HostConfig| {
            let inbox = config.channels["inbox"].clone();
            config.channels.insert("long-error".into(), inbox);
        })),
        ..Setup::default()
    };
    let host = TestHost::start_with(&redis, setup).await.unwrap();
    let event = json!({"biz_type": "LONG", "biz_id": "l-1", "user_id": "u-1", "occurred_at": 1796054399000u64});
    let a = host.post("/v1/events", &event, None).await.unwrap();
    assert_eq!(a.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", a.body);
    let body = a.body.to_string();
    assert!(body.len() < 16 << 10, "a problem of {} bytes", body.len());
    let detail = a.body["detail"].as_str().unwrap();
    assert!(detail.contains("refused: xxx"), "{detail:.200}");
    assert!(
        detail.ends_with("more bytes cut]"),
        "{}",
        &detail[detail.len() - 60..]
    );
    host.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_reload_takes_a_new_policy_and_refuses_a_bad_one() {
    let redis = RedisServer::start().await.unwrap();
    let host = TestHost::start(&redis).await.unwrap();
    let event = json!({"biz_type": "PASSWORD_CHANGED", "biz_id": "p-1", "user_id": "u-1", "occurred_at": 1796054399000u64});
    assert_problem(
        &host.post("/v1/events", &event, None).await.unwrap(),
        422,
        Some("biz_type"),
    );

    std::fs::write(host.policy_dir().join("password.toml"), EXTRA_POLICY).unwrap();
    let a = host.post("/admin/reload", &json!({}), None).await.unwrap();
    assert_eq!(a.status, StatusCode::OK, "{}", a.body);
    assert_eq!(a.body["generation"], 2);
    let a = host.post("/v1/events", &event, None).await.unwrap();
    assert_eq!(a.status, StatusCode::ACCEPTED, "{}", a.body);
    assert_eq!(results(&a.body)[0].0, "inbox");
    let task = host
        .get(&format!("/v1/tasks/{}", results(&a.body)[0].2), None)
        .await
        .unwrap();
    assert_eq!(
        task.body["payload"]["recipient"], "u-1",
        "inbox defaults to the user"
    );

    std::fs::write(host.policy_dir().join("broken.toml"), "biz_type = 1\n").unwrap();
    let a = host.post("/admin/reload", &json!({}), None).await.unwrap();
    assert_problem(&a, 422, None);
    assert!(
        a.body["errors"][0]
            .as_str()
            .unwrap()
            .contains("broken.toml"),
        "{}",
        a.body
    );
    let p = host.get("/admin/policies", None).await.unwrap();
    assert_eq!(p.body["generation"], 2);
    let in_repo = std::fs::read_dir(repo_root().join("policies"))
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .path()
                .extension()
                .is_some_and(|x| x == "toml")
        })
        .count();
    assert_eq!(
        p.body["policies"].as_array().unwrap().len(),
        in_repo + 1,
        "the repository's policies and the reloaded one"
    );
    assert!(
        p.body["last_refused"]["errors"][0]
            .as_str()
            .unwrap()
            .contains("broken.toml")
    );
    let plugins = host.get("/admin/plugins", None).await.unwrap();
    let ids: Vec<&str> = plugins.body["plugins"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert!(ids.contains(&"per-event"), "{}", plugins.body);
    let per_event = plugins.body["plugins"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "per-event")
        .unwrap();
    assert!(per_event["calls"].as_u64().unwrap() >= 1, "{per_event}");
    assert_eq!(per_event["world"], "key-policy");
    host.shutdown().await.unwrap();
}

async fn task_status(host: &TestHost, task: &str) -> String {
    let a = host.get(&format!("/v1/tasks/{task}"), None).await.unwrap();
    a.body["status"].as_str().unwrap_or("").to_string()
}

const ONE_ATTEMPT_POLICY: &str = r#"
biz_type = "ORDER_SHIPPED"
key_policy = "per-event@^1"
channels = ["sms"]
window = "1h"

[retry]
max_attempts = 1
"#;

/// A host whose policy allows one attempt, sending through a development
/// ledger with `faults`, and the SMS task of `order_shipped(biz_id)` once it
/// reached `status`. Fields drop in order: the host first.
struct OneAttempt {
    host: TestHost,
    task: String,
    dir: tempfile::TempDir,
    _redis: RedisServer,
}

impl OneAttempt {
    async fn reach(faults: Faults, biz_id: &str, status: &str) -> OneAttempt {
        let redis = RedisServer::start().await.unwrap();
        let dir = tempfile::tempdir().unwrap();
        let sender = LedgerFileSender::open(&dir.path().join("ledger.jsonl"), faults).unwrap();
        let host = TestHost::start_with(
            &redis,
            Setup {
                sender: Some(Arc::new(sender)),
                policies: Some(vec![("order.toml".into(), ONE_ATTEMPT_POLICY.into())]),
                ..Setup::default()
            },
        )
        .await
        .unwrap();
        let a = host
            .post("/v1/events", &order_shipped(biz_id), None)
            .await
            .unwrap();
        assert_eq!(a.status, StatusCode::ACCEPTED, "{}", a.body);
        let task = results(&a.body)[0].2.clone();
        let (h, t) = (&host, task.as_str());
        wait_until(Duration::from_secs(20), || async move {
            task_status(h, t).await == status
        })
        .await
        .unwrap_or_else(|e| panic!("task {task} never {status}: {e}"));
        OneAttempt {
            host,
            task,
            dir,
            _redis: redis,
        }
    }

    /// Stops the host, then the rest.
    async fn shutdown(self) {
        self.host.shutdown().await.unwrap();
    }

    /// The development ledger's file.
    fn ledger(&self) -> std::path::PathBuf {
        self.dir.path().join("ledger.jsonl")
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_task_is_listed_and_requeued_under_its_key() {
    let faults = Faults {
        fail_first: 1,
        ..Faults::default()
    };
    let one = OneAttempt::reach(faults, "o-dead", "dead").await;
    let (host, task, ledger) = (&one.host, &one.task, one.ledger());
    let (h, t) = (host, task.as_str());

    let dead = host.get("/admin/tasks/dead", None).await.unwrap();
    assert_eq!(dead.status, StatusCode::OK, "{}", dead.body);
    assert_eq!(
        dead.body["tasks"][0]["task"]["id"],
        task.as_str(),
        "{}",
        dead.body
    );
    assert_problem(
        &host.get("/admin/tasks/dead?limit=0", None).await.unwrap(),
        422,
        Some("limit"),
    );

    // Nothing was sent, so the permit was released: a requeue re-takes it.
    let r = host
        .post(&format!("/admin/tasks/{task}/requeue"), &json!({}), None)
        .await
        .unwrap();
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert_eq!(r.body["attempts"], 1);
    assert_eq!(r.body["max_attempts"], 2);
    wait_until(Duration::from_secs(20), || async move {
        task_status(h, t).await == "sent"
    })
    .await
    .unwrap();
    let lines = pushonce_tests::process::read_ledger(&ledger);
    let outcomes: Vec<(u32, &str)> = lines
        .iter()
        .map(|l| (l.attempt, l.outcome.as_str()))
        .collect();
    assert_eq!(outcomes, [(1, "retryable"), (2, "sent")]);
    assert!(
        lines.iter().all(|l| l.task_id == *task),
        "same task, same key"
    );
    let dead = host.get("/admin/tasks/dead", None).await.unwrap();
    assert_eq!(dead.body["tasks"], json!([]), "requeue empties the index");

    // Only failed or dead tasks are requeued; unknown tasks are 404.
    let again = host
        .post(&format!("/admin/tasks/{task}/requeue"), &json!({}), None)
        .await
        .unwrap();
    assert_problem(&again, 409, None);
    let none = host
        .post("/admin/tasks/1-1-00/requeue", &json!({}), None)
        .await
        .unwrap();
    assert_problem(&none, 404, None);
    // A bad query parameter is named, whichever it is.
    for (query, field) in [
        ("force=yes", "force"),
        ("by=alice&bogus=1", "bogus"),
        ("by=alice&by=bob", "by"),
    ] {
        let bad = host
            .post(
                &format!("/admin/tasks/{task}/requeue?{query}"),
                &json!({}),
                None,
            )
            .await
            .unwrap();
        assert_problem(&bad, 422, Some(field));
    }
    one.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_task_is_listed_with_its_cause() {
    let faults = Faults {
        unknown_match: Some("o-held".into()),
        ..Faults::default()
    };
    let one = OneAttempt::reach(faults, "o-held", "unknown").await;
    let (host, task) = (&one.host, &one.task);

    // Both the held list and its older name list unknown tasks.
    for path in ["/admin/tasks/held", "/admin/tasks/dead"] {
        let held = host.get(path, None).await.unwrap();
        assert_eq!(held.status, StatusCode::OK, "{}", held.body);
        let listed = &held.body["tasks"][0]["task"];
        assert_eq!(listed["id"], task.as_str(), "{path}: {}", held.body);
        assert_eq!(listed["status"], "unknown", "{}", held.body);
        assert_eq!(
            listed["held_cause"]["kind"], "cut_off_after_write",
            "{}",
            held.body
        );
        assert_eq!(
            listed["provider_answer"], "scripted: no answer",
            "{}",
            held.body
        );
    }
    let view = host.get(&format!("/v1/tasks/{task}"), None).await.unwrap();
    assert_eq!(view.body["held_cause"]["kind"], "cut_off_after_write");
    assert_eq!(view.body["maybe_sent"], true, "{}", view.body);
    assert!(
        view.body["held_cause"]["explanation"]
            .as_str()
            .is_some_and(|e| e.contains("may have the message")),
        "{}",
        view.body
    );
    mark_delivered_by_hand(host, task).await;
    give_up_by_hand(host).await;
    one.shutdown().await;
}

/// The operator log of task `id` as (by, action, why).
async fn operator_log(host: &TestHost, id: &str) -> Vec<(String, String, String)> {
    let view = host.get(&format!("/v1/tasks/{id}"), None).await.unwrap();
    view.body["operator_log"]
        .as_array()
        .unwrap_or_else(|| panic!("no operator_log: {}", view.body))
        .iter()
        .map(|s| {
            let field = |k: &str| s[k].as_str().unwrap_or_default().to_string();
            (field("by"), field("action"), field("why"))
        })
        .collect()
}

/// `POST /admin/tasks/{id}/mark-delivered`: `why` required (422); then
/// 200 with the task `delivered`, recorded with who and why; a delivered
/// task is not given up (409); no such task: 404.
async fn mark_delivered_by_hand(host: &TestHost, id: &str) {
    let path = format!("/admin/tasks/{id}/mark-delivered");
    let bare = host.post(&path, &json!({}), None).await.unwrap();
    assert_problem(&bare, 422, Some("why"));
    assert_eq!(task_status(host, id).await, "unknown", "nothing done");
    let marked = host
        .post(
            &format!("{path}?by=ana&why=the%20user%20has%20it"),
            &json!({}),
            None,
        )
        .await
        .unwrap();
    assert_eq!(marked.status, StatusCode::OK, "{}", marked.body);
    assert_eq!(
        marked.body["task"]["status"], "delivered",
        "{}",
        marked.body
    );
    assert_eq!(task_status(host, id).await, "delivered");
    assert_eq!(
        operator_log(host, id).await,
        [("ana".into(), "delivered".into(), "the user has it".into())]
    );
    let give_up = format!("/admin/tasks/{id}/give-up?why=too%20late");
    assert_problem(
        &host.post(&give_up, &json!({}), None).await.unwrap(),
        409,
        None,
    );
    let none = host
        .post("/admin/tasks/1-1-00/mark-delivered?why=x", &json!({}), None)
        .await
        .unwrap();
    assert_problem(&none, 404, None);
}

/// `POST /admin/tasks/{id}/give-up` on another held task: 200, the task
/// `failed`, off the held list, recorded (default `by`: `admin-api`).
async fn give_up_by_hand(host: &TestHost) {
    let a = host
        .post("/v1/events", &order_shipped("o-held-2"), None)
        .await
        .unwrap();
    let id = results(&a.body)[0].2.clone();
    let (h, t) = (host, id.as_str());
    wait_until(Duration::from_secs(20), || async move {
        task_status(h, t).await == "unknown"
    })
    .await
    .unwrap();
    let given_up = host
        .post(
            &format!("/admin/tasks/{id}/give-up?why=provider%20says%20never%20sent"),
            &json!({}),
            None,
        )
        .await
        .unwrap();
    assert_eq!(given_up.status, StatusCode::OK, "{}", given_up.body);
    assert_eq!(
        given_up.body["task"]["status"], "failed",
        "{}",
        given_up.body
    );
    assert_eq!(task_status(host, &id).await, "failed");
    assert_eq!(
        operator_log(host, &id).await,
        [(
            "admin-api".into(),
            "given_up".into(),
            "provider says never sent".into()
        )]
    );
    let held = host.get("/admin/tasks/held", None).await.unwrap();
    let listed: Vec<&str> = held.body["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["task"]["id"].as_str())
        .collect();
    assert!(
        !listed.contains(&id.as_str()),
        "off the held list: {listed:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openapi_file_is_the_served_document() {
    let redis = RedisServer::start().await.unwrap();
    let host = TestHost::start(&redis).await.unwrap();
    let served = host
        .client
        .get(host.url("/openapi.json"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let file = repo_root().join("openapi.json");
    if std::env::var("PUSHONCE_BLESS").is_ok_and(|v| v == "1") {
        std::fs::write(&file, &served).unwrap();
    }
    let in_repo = std::fs::read_to_string(&file).unwrap_or_default();
    assert!(
        in_repo == served,
        "openapi.json differs from the served document: regenerate it with \
         `PUSHONCE_BLESS=1 cargo test -p pushonce-tests --test it -- api::the_openapi_file` \
         or `pushonce openapi --out openapi.json`"
    );
    let doc: Value = serde_json::from_str(&served).unwrap();
    assert!(doc["openapi"].as_str().unwrap().starts_with("3.1"));
    assert!(doc["paths"]["/v1/events:batch"]["post"].is_object());
    host.shutdown().await.unwrap();
}
