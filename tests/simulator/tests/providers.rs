//! The simulator behaves like the providers it imitates: client references
//! deduplicate, faults are injected as configured, WeChat tokens expire, and
//! the ledger counts what was accepted — over real HTTP on 127.0.0.1.

use provider_sim::{Config, SimState};
use serde_json::{Value, json};

struct Sim {
    base: String,
    state: SimState,
    http: reqwest::Client,
}

async fn start() -> Sim {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let state = SimState::new(Config::default());
    tokio::spawn(provider_sim::run(
        listener,
        state.clone(),
        std::future::pending(),
    ));
    Sim {
        base,
        state,
        http: reqwest::Client::new(),
    }
}

impl Sim {
    async fn post(&self, path: &str, body: Value) -> reqwest::Result<(u16, Value)> {
        let r = self
            .http
            .post(format!("{}{path}", self.base))
            .json(&body)
            .send()
            .await?;
        let status = r.status().as_u16();
        Ok((status, r.json().await?))
    }

    async fn get(&self, path: &str) -> reqwest::Result<Value> {
        self.http
            .get(format!("{}{path}", self.base))
            .send()
            .await?
            .json()
            .await
    }

    fn count(&self, provider: &str) -> usize {
        self.state.ledger()[provider].len()
    }
}

fn sms(out_id: &str, phone: &str) -> Value {
    json!({"PhoneNumbers": phone, "SignName": "Shop", "TemplateCode": "SMS_1",
           "TemplateParam": {"order": "o-1"}, "OutId": out_id})
}

#[tokio::test]
async fn sms_out_id_makes_a_resend_harmless() {
    let sim = start().await;
    let (_, a) = sim
        .post("/sms/SendSms", sms("k1", "13800000001"))
        .await
        .unwrap();
    let (_, b) = sim
        .post("/sms/SendSms", sms("k1", "13800000001"))
        .await
        .unwrap();
    assert_eq!(a["Code"], "OK");
    assert_eq!(
        a["BizId"], b["BizId"],
        "the same OutId answers the same message"
    );
    assert_eq!(sim.count("sms"), 1);
    assert_eq!(sim.state.ledger()["sms"][0].replays, 1);
    let (_, q) = sim
        .post("/sms/QuerySendDetails", json!({"OutId": "k1"}))
        .await
        .unwrap();
    assert_eq!(q["SmsSendDetailDTOs"][0]["BizId"], a["BizId"]);
    let (_, q) = sim
        .post("/sms/QuerySendDetails", json!({"OutId": "never"}))
        .await
        .unwrap();
    assert_eq!(q["SmsSendDetailDTOs"].as_array().unwrap().len(), 0);
}

#[tokio::test]
async fn injected_faults_refuse_without_accepting() {
    let sim = start().await;
    let (s, _) = sim
        .post(
            "/_sim/faults",
            json!({"sms": {"fail_next": 2, "permanent": {"13800000009": "isv.AMOUNT_NOT_ENOUGH"}}}),
        )
        .await
        .unwrap();
    assert_eq!(s, 200);
    for _ in 0..2 {
        let (s, body) = sim
            .post("/sms/SendSms", sms("k2", "13800000001"))
            .await
            .unwrap();
        assert_eq!(
            (s, body["Code"].as_str()),
            (503, Some("ServiceUnavailable"))
        );
    }
    let (_, body) = sim
        .post("/sms/SendSms", sms("k3", "13800000009"))
        .await
        .unwrap();
    assert_eq!(body["Code"], "isv.AMOUNT_NOT_ENOUGH");
    assert_eq!(sim.count("sms"), 0, "refused sends are not in the ledger");
    let (_, body) = sim
        .post("/sms/SendSms", sms("k2", "13800000001"))
        .await
        .unwrap();
    assert_eq!(body["Code"], "OK");
    assert_eq!(sim.count("sms"), 1);
    let (s, body) = sim.post("/_sim/faults", json!({"fax": {}})).await.unwrap();
    assert_eq!(s, 422);
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("unknown provider `fax`")
    );
}

#[tokio::test]
async fn accept_then_drop_leaves_one_message_and_a_client_that_cannot_tell() {
    let sim = start().await;
    sim.post("/_sim/faults", json!({"inbox": {"drop_after_accept": 1.0}}))
        .await
        .unwrap();
    let send = || {
        sim.http
            .post(format!("{}/inbox/v1/messages", sim.base))
            .header("Idempotency-Key", "push:per-event@1:inbox:x")
            .json(&json!({"user_id": "u-1", "template": "shipped"}))
            .send()
    };
    let first = match send().await {
        Ok(r) => r.bytes().await.map(|_| ()),
        Err(e) => Err(e),
    };
    assert!(first.is_err(), "the answer must be cut off");
    sim.post("/_sim/faults", json!({"inbox": {}}))
        .await
        .unwrap();
    let again = send().await.unwrap();
    assert_eq!(
        again.status().as_u16(),
        200,
        "a replay answers 200, not 201"
    );
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    assert_eq!(sim.count("inbox"), 1);
    let missing = sim
        .http
        .post(format!("{}/inbox/v1/messages", sim.base))
        .json(&json!({"user_id": "u-1", "template": "t"}))
        .send()
        .await
        .unwrap();
    assert_eq!(missing.status().as_u16(), 400);
}

#[tokio::test]
async fn wechat_tokens_expire_and_sends_have_no_reference() {
    let sim = start().await;
    let token: Value = sim
        .get("/cgi-bin/token?grant_type=client_credential&appid=wx1&secret=s")
        .await
        .unwrap();
    let token = token["access_token"].as_str().unwrap().to_string();
    let msg =
        json!({"touser": "openid-1", "template_id": "T1", "data": {"order": {"value": "o-1"}}});
    let path = format!("/cgi-bin/message/template/send?access_token={token}");
    let (_, a) = sim.post(&path, msg.clone()).await.unwrap();
    assert_eq!(a["errcode"], 0);
    let (_, b) = sim.post(&path, msg.clone()).await.unwrap();
    assert_eq!(b["errcode"], 0);
    assert_eq!(
        sim.count("wechat"),
        2,
        "WeChat has no client reference: a resend is a second message"
    );
    sim.post("/_sim/wechat/expire-tokens", json!({}))
        .await
        .unwrap();
    let (_, c) = sim.post(&path, msg).await.unwrap();
    assert_eq!(c["errcode"], 42001);
    assert_eq!(sim.count("wechat"), 2);
}

#[tokio::test]
async fn app_push_maps_unregistered_and_quota_like_fcm() {
    let sim = start().await;
    sim.post(
        "/_sim/faults",
        json!({"app-push": {"fail_429": 1.0, "permanent": {"dead-token": "UNREGISTERED"}}}),
    )
    .await
    .unwrap();
    let body = json!({"message": {"token": "dead-token", "notification": {"title": "t"}}});
    let (s, e) = sim
        .post("/v1/projects/p1/messages:send", body)
        .await
        .unwrap();
    assert_eq!(
        (s, e["error"]["details"][0]["errorCode"].as_str()),
        (404, Some("UNREGISTERED"))
    );
    let body = json!({"message": {"token": "tok-1", "notification": {"title": "t"}}});
    let (s, e) = sim
        .post("/v1/projects/p1/messages:send", body.clone())
        .await
        .unwrap();
    assert_eq!(
        (s, e["error"]["status"].as_str()),
        (429, Some("RESOURCE_EXHAUSTED"))
    );
    sim.post("/_sim/faults", json!({"app-push": {}}))
        .await
        .unwrap();
    let (s, ok) = sim
        .post("/v1/projects/p1/messages:send", body)
        .await
        .unwrap();
    assert_eq!(s, 200);
    assert!(
        ok["name"]
            .as_str()
            .unwrap()
            .starts_with("projects/p1/messages/")
    );
    assert_eq!(sim.count("app-push"), 1);
}

// ---- Delivery receipts ----

/// One callback as the receiver saw it.
#[derive(Debug, Clone)]
struct Arrived {
    path: String,
    authorization: Option<String>,
    body: Value,
}

/// A tiny receiver on 127.0.0.1 recording every callback; it answers 503 to
/// the first `refuse_first` of them.
struct Receiver {
    base: String,
    seen: std::sync::Arc<std::sync::Mutex<Vec<Arrived>>>,
}

async fn receiver(refuse_first: usize) -> Receiver {
    use axum::{extract::State, http::HeaderMap, http::Uri};
    type Seen = std::sync::Arc<std::sync::Mutex<Vec<Arrived>>>;
    let seen: Seen = Default::default();
    let calls = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let app = axum::Router::new()
        .fallback(axum::routing::post(
            move |State(seen): State<Seen>, uri: Uri, headers: HeaderMap, body: String| {
                let calls = calls.clone();
                async move {
                    seen.lock().unwrap().push(Arrived {
                        path: uri.path().to_string(),
                        authorization: headers
                            .get("authorization")
                            .map(|v| v.to_str().unwrap().to_string()),
                        body: serde_json::from_str(&body).unwrap_or(Value::Null),
                    });
                    if calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst) < refuse_first {
                        axum::http::StatusCode::SERVICE_UNAVAILABLE
                    } else {
                        axum::http::StatusCode::OK
                    }
                }
            },
        ))
        .with_state(seen.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    Receiver { base, seen }
}

impl Receiver {
    fn arrived(&self) -> Vec<Arrived> {
        self.seen.lock().unwrap().clone()
    }
}

/// Polls `check` every 20 ms; panics with `what` after 10 s.
async fn wait_for(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !check() {
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

impl Sim {
    fn stat(&self, key: &str) -> u64 {
        self.state.stats().get(key).copied().unwrap_or(0)
    }
}

#[tokio::test]
async fn receipts_are_posted_once_per_message_in_the_plugins_format() {
    let sim = start().await;
    let rx = receiver(0).await;
    let mut config = serde_json::Map::new();
    for (provider, channel) in [
        ("sms", "sms"),
        ("wechat", "wechat"),
        ("app-push", "app-push"),
        ("inbox", "inbox"),
    ] {
        config.insert(
            provider.into(),
            json!({"url": format!("{}/v1/receipts/{channel}", rx.base), "delay_ms": 50,
                   "secret": "rcpt-secret", "fail_after_accept": ["13800000066", "u-fail"]}),
        );
    }
    let (s, _) = sim
        .post("/_sim/receipts", Value::Object(config))
        .await
        .unwrap();
    assert_eq!(s, 200);
    let shown: Value = sim.get("/_sim/receipts").await.unwrap();
    assert_eq!(shown["sms"]["delay_ms"], 50);
    assert!(
        !shown.to_string().contains("rcpt-secret"),
        "the secret is not echoed: {shown}"
    );

    // SMS: one delivered, one failed after accept; a resend of the same OutId
    // is neither a message nor a receipt.
    let (_, ok) = sim
        .post("/sms/SendSms", sms("out-1", "13800000001"))
        .await
        .unwrap();
    sim.post("/sms/SendSms", sms("out-1", "13800000001"))
        .await
        .unwrap();
    let (_, bad) = sim
        .post("/sms/SendSms", sms("out-2", "13800000066"))
        .await
        .unwrap();
    // Inbox: delivered and failed, by Idempotency-Key.
    for (key, user) in [("key-ok", "u-1"), ("key-bad", "u-fail")] {
        let r = sim
            .http
            .post(format!("{}/inbox/v1/messages", sim.base))
            .header("Idempotency-Key", key)
            .json(&json!({"user_id": user, "template": "shipped"}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 201);
    }
    // App push with an Idempotency-Key; WeChat with a numeric msgid.
    let r = sim
        .http
        .post(format!("{}/v1/projects/p1/messages:send", sim.base))
        .header("Idempotency-Key", "push-key-1")
        .json(&json!({"message": {"token": "tok-1", "notification": {"title": "t"}}}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let token: Value = sim.get("/cgi-bin/token?appid=wx1&secret=s").await.unwrap();
    let (_, wx) = sim
        .post(
            &format!(
                "/cgi-bin/message/template/send?access_token={}",
                token["access_token"].as_str().unwrap()
            ),
            json!({"touser": "openid-1", "template_id": "T1", "data": {}}),
        )
        .await
        .unwrap();
    assert_eq!(wx["errcode"], 0);

    wait_for("six receipts", || rx.arrived().len() >= 6).await;
    // Nothing more comes (the replay posted none): every counted receipt arrived.
    wait_for("the posted counts", || {
        ["sms", "inbox", "app-push", "wechat"]
            .iter()
            .map(|p| sim.stat(&format!("{p}.receipt_posted")))
            .sum::<u64>()
            == 6
    })
    .await;
    let arrived = rx.arrived();
    assert_eq!(arrived.len(), 6, "{arrived:#?}");
    for a in &arrived {
        assert_eq!(a.authorization.as_deref(), Some("Bearer rcpt-secret"));
        assert_eq!(a.body["receipts"].as_array().unwrap().len(), 1, "{a:?}");
    }
    let find = |path: &str, field: &str, value: &str| -> Value {
        arrived
            .iter()
            .find(|a| a.path == path && a.body["receipts"][0][field] == value)
            .unwrap_or_else(|| panic!("no receipt at {path} with {field}={value}: {arrived:#?}"))
            .body["receipts"][0]
            .clone()
    };
    let r = find(
        "/v1/receipts/sms",
        "message_id",
        ok["BizId"].as_str().unwrap(),
    );
    assert_eq!(
        (r["status"].as_str(), r["reference"].as_str()),
        (Some("delivered"), Some("out-1"))
    );
    let r = find(
        "/v1/receipts/sms",
        "message_id",
        bad["BizId"].as_str().unwrap(),
    );
    assert_eq!(r["status"], "failed");
    assert_eq!(
        find("/v1/receipts/inbox", "reference", "key-ok")["status"],
        "delivered"
    );
    assert_eq!(
        find("/v1/receipts/inbox", "reference", "key-bad")["status"],
        "failed"
    );
    assert_eq!(
        find("/v1/receipts/app-push", "reference", "push-key-1")["status"],
        "delivered"
    );
    let r = find(
        "/v1/receipts/wechat",
        "message_id",
        &wx["msgid"].to_string(),
    );
    assert_eq!(r["status"], "delivered");
    assert!(
        r.get("reference").is_none(),
        "WeChat has no client reference"
    );

    // Queries agree with the receipts.
    let (_, q) = sim
        .post("/sms/QuerySendDetails", json!({"OutId": "out-2"}))
        .await
        .unwrap();
    assert_eq!(q["SmsSendDetailDTOs"][0]["SendStatus"], 2, "failed: {q}");
    let (_, q) = sim
        .post("/sms/QuerySendDetails", json!({"OutId": "out-1"}))
        .await
        .unwrap();
    assert_eq!(q["SmsSendDetailDTOs"][0]["SendStatus"], 3, "delivered: {q}");
    for (key, want) in [("key-ok", "delivered"), ("key-bad", "failed")] {
        let q: Value = sim
            .get(&format!("/inbox/v1/messages?idempotency_key={key}"))
            .await
            .unwrap();
        assert_eq!(q["status"], want, "{key}: {q}");
    }
    assert_eq!(
        sim.state.ledger()["sms"][1].delivery,
        provider_sim::Delivery::Failed
    );
}

#[tokio::test]
async fn receipts_are_retried_with_backoff_and_given_up_when_bounded() {
    let sim = start().await;
    // A receiver that refuses twice, then accepts: posted once after two retries.
    let rx = receiver(2).await;
    sim.post(
        "/_sim/receipts",
        json!({"sms": {"url": format!("{}/v1/receipts/sms", rx.base)}}),
    )
    .await
    .unwrap();
    sim.post("/sms/SendSms", sms("r-1", "13800000001"))
        .await
        .unwrap();
    wait_for("the receipt to be posted", || {
        sim.stat("sms.receipt_posted") == 1
    })
    .await;
    assert_eq!(rx.arrived().len(), 3);
    assert_eq!(rx.arrived()[0].authorization, None, "no secret configured");
    assert_eq!(sim.stat("sms.receipt_retried"), 2);
    assert_eq!(sim.stat("sms.receipt_failed"), 0);

    // Nobody listening: a bounded number of attempts, then counted as failed.
    let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let dead = closed.local_addr().unwrap();
    drop(closed);
    sim.post(
        "/_sim/receipts",
        json!({"inbox": {"url": format!("http://{dead}/v1/receipts/inbox")}}),
    )
    .await
    .unwrap();
    let r = sim
        .http
        .post(format!("{}/inbox/v1/messages", sim.base))
        .header("Idempotency-Key", "k-dead")
        .json(&json!({"user_id": "u-1", "template": "t"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 201);
    wait_for("the receipt to be given up", || {
        sim.stat("inbox.receipt_failed") == 1
    })
    .await;
    assert_eq!(
        sim.stat("inbox.receipt_retried"),
        u64::from(provider_sim::RECEIPT_ATTEMPTS - 1)
    );
    assert_eq!(sim.stat("inbox.receipt_posted"), 0);

    // Switched off (null): no more receipts; bad configurations are refused.
    let (s, _) = sim
        .post("/_sim/receipts", json!({"sms": null}))
        .await
        .unwrap();
    assert_eq!(s, 200);
    sim.post("/sms/SendSms", sms("r-2", "13800000002"))
        .await
        .unwrap();
    assert_eq!(sim.count("sms"), 2);
    let (s, body) = sim
        .post(
            "/_sim/receipts",
            json!({"fax": {"url": "http://127.0.0.1:1/"}}),
        )
        .await
        .unwrap();
    assert_eq!(s, 422);
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("unknown provider `fax`")
    );
    let (s, _) = sim
        .post("/_sim/receipts", json!({"sms": {"url": "ftp://x"}}))
        .await
        .unwrap();
    assert_eq!(s, 422);
}
