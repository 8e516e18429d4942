//! The simulator behaves like the providers it imitates, over real TLS on
//! 127.0.0.1 with a client that trusts only the generated CA. The signing
//! code here is written from the providers' documentation, independently of
//! the simulator's verifiers and of the plugins.

use base64::Engine;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use provider_sim::{Config, Delivery, Faults, ReceiptConfig, SimState};
use ring::{digest, hmac, rand::SystemRandom, signature};
use rustls::pki_types::{PrivatePkcs8KeyDer, pem::PemObject};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

struct Sim {
    /// `https://127.0.0.1:PORT`.
    base: String,
    /// `http://127.0.0.1:PORT` of the plain control listener.
    control: String,
    state: SimState,
    /// Trusts the simulator's CA; HTTP/2 or HTTP/1.1 by ALPN.
    http: reqwest::Client,
    /// The same, HTTP/1.1 only.
    http1: reqwest::Client,
}

async fn start_with(config: Config) -> Sim {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let control = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let state = SimState::new(config);
    let base = format!("https://{addr}");
    let control_base = format!("http://{}", control.local_addr().unwrap());
    tokio::spawn(provider_sim::run(
        listener,
        state.clone(),
        std::future::pending(),
    ));
    tokio::spawn(provider_sim::run_control(
        control,
        state.clone(),
        std::future::pending(),
    ));
    let client = |http1: bool| tls_client(&state, addr, http1);
    Sim {
        base,
        control: control_base,
        http: client(false),
        http1: client(true),
        state,
    }
}

/// A client trusting only the simulator's CA, `api.push.apple.com` resolved
/// to it; HTTP/2 or HTTP/1.1 by ALPN, or HTTP/1.1 only.
fn tls_client(state: &SimState, addr: std::net::SocketAddr, http1: bool) -> reqwest::Client {
    let ca = reqwest::Certificate::from_pem(state.ca_pem().as_bytes()).unwrap();
    let mut b = reqwest::Client::builder()
        .no_proxy()
        .add_root_certificate(ca)
        .resolve("api.push.apple.com", addr)
        .timeout(Duration::from_secs(10));
    if http1 {
        b = b.http1_only();
    }
    b.build().unwrap()
}

async fn start() -> Sim {
    start_with(Config {
        aliyun_report_after: Duration::from_millis(0),
        aliyun_repush_minute: Duration::from_millis(50),
        ..Config::default()
    })
    .await
}

impl Sim {
    fn count(&self, provider: &str) -> usize {
        self.state.ledger()[provider].len()
    }

    fn stat(&self, key: &str) -> u64 {
        self.state.stats().get(key).copied().unwrap_or(0)
    }

    fn port(&self) -> &str {
        self.base.rsplit(':').next().unwrap()
    }
}

async fn json_of(r: reqwest::Response) -> (u16, Value) {
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

/// Polls `check` every 20 ms; panics with `what` after 10 s.
async fn wait_for(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

// ---- Aliyun: a V3 signing client written from the documentation ----

fn rfc3986(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

fn hex_sha256(data: &[u8]) -> String {
    hex::encode(digest::digest(&digest::SHA256, data))
}

struct AliyunCall<'a> {
    action: &'a str,
    params: Vec<(&'a str, String)>,
    date: String,
    nonce: String,
    secret: String,
    key_id: String,
}

impl<'a> AliyunCall<'a> {
    fn new(sim: &Sim, action: &'a str, params: &[(&'a str, &str)]) -> Self {
        let c = sim.state.credentials();
        AliyunCall {
            action,
            params: params.iter().map(|(k, v)| (*k, v.to_string())).collect(),
            date: acs_date(0),
            nonce: format!("{:032x}", rand_u128()),
            secret: c.aliyun_access_key_secret.clone(),
            key_id: c.aliyun_access_key_id.clone(),
        }
    }

    /// Sends over HTTP/2 (ALPN's choice).
    async fn send(&self, sim: &Sim) -> (u16, Value) {
        self.send_with(sim, &sim.http).await
    }

    async fn send_with(&self, sim: &Sim, client: &reqwest::Client) -> (u16, Value) {
        let mut query: Vec<(String, String)> = self
            .params
            .iter()
            .map(|(k, v)| (rfc3986(k), rfc3986(v)))
            .collect();
        query.sort();
        let query: String = query
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join("&");
        let body_hash = hex_sha256(b"");
        let headers = [
            ("host", format!("127.0.0.1:{}", sim.port())),
            ("x-acs-action", self.action.to_string()),
            ("x-acs-content-sha256", body_hash.clone()),
            ("x-acs-date", self.date.clone()),
            ("x-acs-signature-nonce", self.nonce.clone()),
            ("x-acs-version", "2017-05-25".to_string()),
        ];
        let canonical_headers: String = headers.iter().map(|(k, v)| format!("{k}:{v}\n")).collect();
        let signed = headers
            .iter()
            .map(|(k, _)| *k)
            .collect::<Vec<_>>()
            .join(";");
        let canonical = format!("POST\n/\n{query}\n{canonical_headers}\n{signed}\n{body_hash}");
        let to_sign = format!("ACS3-HMAC-SHA256\n{}", hex_sha256(canonical.as_bytes()));
        let key = hmac::Key::new(hmac::HMAC_SHA256, self.secret.as_bytes());
        let sig = hex::encode(hmac::sign(&key, to_sign.as_bytes()));
        let mut req = client.post(format!("{}/?{query}", sim.base)).header(
            "authorization",
            format!(
                "ACS3-HMAC-SHA256 Credential={},SignedHeaders={signed},Signature={sig}",
                self.key_id
            ),
        );
        for (k, v) in headers.iter().skip(1) {
            req = req.header(*k, v);
        }
        json_of(req.send().await.unwrap()).await
    }
}

fn rand_u128() -> u128 {
    let mut b = [0u8; 16];
    ring::rand::SecureRandom::fill(&SystemRandom::new(), &mut b).unwrap();
    u128::from_le_bytes(b)
}

fn acs_date(offset_secs: i64) -> String {
    let t = time::OffsetDateTime::from_unix_timestamp(now() + offset_secs).unwrap();
    t.format(time::macros::format_description!(
        "[year]-[month]-[day]T[hour]:[minute]:[second]Z"
    ))
    .unwrap()
}

fn china_day() -> String {
    let t = time::OffsetDateTime::from_unix_timestamp(now() + 8 * 3600).unwrap();
    t.format(time::macros::format_description!("[year][month][day]"))
        .unwrap()
}

fn send_sms<'a>(sim: &Sim, phone: &'a str, out_id: &'a str) -> AliyunCall<'a> {
    AliyunCall::new(
        sim,
        "SendSms",
        &[
            ("PhoneNumbers", phone),
            ("SignName", "pushonce"),
            ("TemplateCode", "SMS_1"),
            ("TemplateParam", r#"{"order":"o-1"}"#),
            ("OutId", out_id),
        ],
    )
}

/// A SendSms with `sign` and `template`.
fn send_sms_signed<'a>(
    sim: &Sim,
    phone: &'a str,
    sign: &'a str,
    template: &'a str,
) -> AliyunCall<'a> {
    AliyunCall::new(
        sim,
        "SendSms",
        &[
            ("PhoneNumbers", phone),
            ("SignName", sign),
            ("TemplateCode", template),
            ("TemplateParam", r#"{"order":"o-1"}"#),
        ],
    )
}

/// Aliyun refuses a template or sign name the account has not approved
/// (`isv.SMS_TEMPLATE_ILLEGAL`, `isv.SMS_SIGNATURE_ILLEGAL`: "该账号下找不到对应模板/签名"),
/// its business code in an HTTP 200 without a `BizId`, and sends nothing.
#[tokio::test]
async fn aliyun_refuses_an_unapproved_template_or_sign_name_and_sends_nothing() {
    let sim = start().await;
    let cases = [
        ("pushonce", "SMS_404404", "isv.SMS_TEMPLATE_ILLEGAL"),
        ("NotOurSign", "SMS_1", "isv.SMS_SIGNATURE_ILLEGAL"),
    ];
    for (sign, template, code) in cases {
        let (status, body) = send_sms_signed(&sim, "13800000001", sign, template)
            .send(&sim)
            .await;
        assert_eq!((status, body["Code"].as_str()), (200, Some(code)), "{body}");
        assert!(body.get("BizId").is_none(), "no message id: {body}");
    }
    assert_eq!(sim.count("aliyun-sms"), 0, "no SMS reaches the phone");
    let (_, ok) = send_sms_signed(&sim, "13800000001", "pushonce", "SMS_1")
        .send(&sim)
        .await;
    assert_eq!(ok["Code"], "OK", "the approved pair is sent: {ok}");
    assert_eq!(sim.count("aliyun-sms"), 1);
}

/// `POST /_sim/sms-approvals` replaces what an SMS account approved: a
/// template approved there is sent, one no longer approved is refused.
#[tokio::test]
async fn the_sms_approvals_are_set_through_the_control_api() {
    let sim = start().await;
    let plain = reqwest::Client::builder().no_proxy().build().unwrap();
    let set = |body: Value| {
        plain
            .post(format!("{}/_sim/sms-approvals", sim.control))
            .json(&body)
            .send()
    };
    let r = set(json!({"wechat": {"templates": [], "sign_names": []}}))
        .await
        .unwrap();
    assert_eq!(r.status(), 422, "WeChat approves no SMS templates");
    let r = set(json!({"aliyun-sms": {"templates": ["SMS_777"], "sign_names": ["Shop"]}}))
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let (_, ok) = send_sms_signed(&sim, "13800000001", "Shop", "SMS_777")
        .send(&sim)
        .await;
    assert_eq!(ok["Code"], "OK", "{ok}");
    let (_, refused) = send_sms_signed(&sim, "13800000001", "Shop", "SMS_1")
        .send(&sim)
        .await;
    assert_eq!(refused["Code"], "isv.SMS_TEMPLATE_ILLEGAL", "{refused}");
    let (_, approvals) = json_of(
        plain
            .get(format!("{}/_sim/sms-approvals", sim.control))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(approvals["aliyun-sms"]["templates"], json!(["SMS_777"]));
    assert!(
        approvals["tencent-sms"]["sign_names"]
            .as_array()
            .unwrap()
            .contains(&json!("pushonce")),
        "Tencent's account unchanged: {approvals}"
    );
    assert_eq!(sim.count("aliyun-sms"), 1);
    assert_eq!(sim.stat("aliyun-sms.unapproved"), 1);
}

#[tokio::test]
async fn aliyun_signed_send_is_accepted_and_the_same_out_id_twice_is_two_sms() {
    let sim = start().await;
    let (s1, a) = send_sms(&sim, "13800000001", "k1").send(&sim).await;
    // HTTP/1.1 this time: `host` is the Host header instead of `:authority`.
    let (s2, b) = send_sms(&sim, "13800000001", "k1")
        .send_with(&sim, &sim.http1)
        .await;
    assert_eq!((s1, s2), (200, 200));
    assert_eq!(
        (a["Code"].as_str(), b["Code"].as_str()),
        (Some("OK"), Some("OK"))
    );
    assert_ne!(a["BizId"], b["BizId"], "SendSms is not idempotent");
    let ledger = &sim.state.ledger()["aliyun-sms"];
    assert_eq!(ledger.len(), 2, "two SMS reach the phone");
    assert_eq!(ledger[0].reference.as_deref(), Some("k1"));
    assert_eq!(ledger[0].params["TemplateParam"]["order"], "o-1");
}

#[tokio::test]
async fn aliyun_refuses_forged_stale_replayed_and_unknown_key_requests() {
    let sim = start().await;
    let mut forged = send_sms(&sim, "13800000001", "k1");
    forged.secret = "not-the-secret".into();
    assert_eq!(forged.send(&sim).await.1["Code"], "SignatureDoesNotMatch");
    let mut unknown = send_sms(&sim, "13800000001", "k1");
    unknown.key_id = "LTAInobody".into();
    let (status, body) = unknown.send(&sim).await;
    assert_eq!(
        (status, body["Code"].as_str()),
        (404, Some("InvalidAccessKeyId.NotFound"))
    );
    let mut stale = send_sms(&sim, "13800000001", "k1");
    stale.date = acs_date(-16 * 60);
    let (status, body) = stale.send(&sim).await;
    assert_eq!(
        (status, body["Code"].as_str()),
        (400, Some("InvalidTimeStamp.Expired"))
    );
    let first = send_sms(&sim, "13800000001", "k1");
    assert_eq!(first.send(&sim).await.1["Code"], "OK");
    let (status, body) = first.send(&sim).await;
    assert_eq!(
        (status, body["Code"].as_str()),
        (400, Some("SignatureNonceUsed"))
    );
    let unsigned = sim
        .http
        .post(format!("{}/?PhoneNumbers=1", sim.base))
        .send()
        .await
        .unwrap();
    assert_eq!(json_of(unsigned).await.1["Code"], "MissingAuthorization");
    assert_eq!(
        sim.count("aliyun-sms"),
        1,
        "only the good request sent an SMS"
    );
}

/// The deprecated V2 signature (HMAC-SHA1 over `GET&%2F&<query>`), which
/// dysmsapi still accepts.
#[tokio::test]
async fn aliyun_accepts_a_v2_signed_request() {
    let sim = start().await;
    let c = sim.state.credentials();
    let nonce = format!("{:032x}", rand_u128());
    let date = acs_date(0);
    let mut params = vec![
        ("AccessKeyId", c.aliyun_access_key_id.as_str()),
        ("Action", "SendSms"),
        ("Format", "JSON"),
        ("OutId", "v2-1"),
        ("PhoneNumbers", "13800000001"),
        ("SignName", "pushonce"),
        ("SignatureMethod", "HMAC-SHA1"),
        ("SignatureNonce", nonce.as_str()),
        ("SignatureVersion", "1.0"),
        ("TemplateCode", "SMS_1"),
        ("TemplateParam", r#"{"order":"o-1"}"#),
        ("Timestamp", date.as_str()),
        ("Version", "2017-05-25"),
    ];
    params.sort();
    let query = params
        .iter()
        .map(|(k, v)| format!("{}={}", rfc3986(k), rfc3986(v)))
        .collect::<Vec<_>>()
        .join("&");
    let to_sign = format!("GET&%2F&{}", rfc3986(&query));
    let key = hmac::Key::new(
        hmac::HMAC_SHA1_FOR_LEGACY_USE_ONLY,
        format!("{}&", c.aliyun_access_key_secret).as_bytes(),
    );
    let sig = STANDARD.encode(hmac::sign(&key, to_sign.as_bytes()));
    let url = format!("{}/?{query}&Signature={}", sim.base, rfc3986(&sig));
    let (status, body) = json_of(sim.http.get(&url).send().await.unwrap()).await;
    assert_eq!((status, body["Code"].as_str()), (200, Some("OK")), "{body}");
    let (_, again) = json_of(sim.http.get(&url).send().await.unwrap()).await;
    assert_eq!(again["Code"], "SignatureNonceUsed");
    assert_eq!(sim.count("aliyun-sms"), 1);
}

#[tokio::test]
async fn aliyun_faults_answer_like_aliyun() {
    let sim = start().await;
    let permanent = BTreeMap::from([(
        "13800000009".to_string(),
        "isv.AMOUNT_NOT_ENOUGH".to_string(),
    )]);
    sim.state.set_faults(
        "aliyun-sms",
        Faults {
            fail_next: 1,
            retry_after_secs: Some(7),
            permanent,
            ..Faults::default()
        },
    );
    let (status, body) = send_sms(&sim, "13800000001", "k").send(&sim).await;
    assert_eq!(
        (status, body["Code"].as_str()),
        (503, Some("ServiceUnavailable"))
    );
    let (status, body) = send_sms(&sim, "13800000009", "k").send(&sim).await;
    assert_eq!(
        (status, body["Code"].as_str()),
        (200, Some("isv.AMOUNT_NOT_ENOUGH"))
    );
    sim.state.set_faults(
        "aliyun-sms",
        Faults {
            fail_429: 1.0,
            ..Faults::default()
        },
    );
    let (status, body) = send_sms(&sim, "13800000001", "k").send(&sim).await;
    assert_eq!(
        (status, body["Code"].as_str()),
        (200, Some("isv.BUSINESS_LIMIT_CONTROL"))
    );
    let (_, body) = send_sms(&sim, "1380000000x", "k").send(&sim).await;
    assert_eq!(body["Code"], "isv.MOBILE_NUMBER_ILLEGAL");
    assert_eq!(
        sim.count("aliyun-sms"),
        0,
        "refused sends are not in the ledger"
    );
}

#[tokio::test]
async fn aliyun_query_shows_a_message_only_after_the_lag() {
    let sim = start_with(Config {
        query_lag: Duration::from_millis(400),
        aliyun_report_after: Duration::from_millis(1200),
        ..Config::default()
    })
    .await;
    let (_, sent) = send_sms(&sim, "13800000001", "out-1").send(&sim).await;
    let day = china_day();
    let query = |phone: &'static str| {
        AliyunCall::new(
            &sim,
            "QuerySendDetails",
            &[
                ("PhoneNumber", phone),
                ("SendDate", &day),
                ("PageSize", "10"),
                ("CurrentPage", "1"),
            ],
        )
    };
    let (_, lagging) = query("13800000001").send(&sim).await;
    assert_eq!(lagging["Code"], "OK");
    assert_eq!(lagging["TotalCount"], 0, "not visible yet");
    let deadline = Instant::now() + Duration::from_secs(10);
    let visible = loop {
        let (_, q) = query("13800000001").send(&sim).await;
        if q["TotalCount"] == 1 {
            break q;
        }
        assert!(Instant::now() < deadline, "message never became visible");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let row = &visible["SmsSendDetailDTOs"]["SmsSendDetailDTO"][0];
    assert_eq!(
        (row["OutId"].as_str(), row["SendStatus"].as_i64()),
        (Some("out-1"), Some(1)),
        "waiting for the receipt first"
    );
    let reported = loop {
        let (_, q) = query("13800000001").send(&sim).await;
        let row = q["SmsSendDetailDTOs"]["SmsSendDetailDTO"][0].clone();
        if row["SendStatus"] != 1 {
            break row;
        }
        assert!(Instant::now() < deadline, "the report never came");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(reported["SendStatus"], 3, "{reported}");
    let row = &reported;
    assert_eq!(row["PhoneNum"], "13800000001");
    assert!(sent["BizId"].is_string());
    let (_, absent) = query("13900000000").send(&sim).await;
    assert_eq!(absent["TotalCount"], 0);
    sim.state.set_faults(
        "aliyun-sms",
        Faults {
            fail_queries_next: 1,
            ..Faults::default()
        },
    );
    assert_eq!(query("13800000001").send(&sim).await.0, 503);
    let (_, bad) = AliyunCall::new(
        &sim,
        "QuerySendDetails",
        &[
            ("PhoneNumber", "1"),
            ("SendDate", &day),
            ("PageSize", "51"),
            ("CurrentPage", "1"),
        ],
    )
    .send(&sim)
    .await;
    assert_eq!(bad["Code"], "InvalidPageSize");
}

// ---- Receipts ----

#[derive(Debug, Clone)]
struct Arrived {
    query: String,
    body: String,
}

/// A receiver on 127.0.0.1 recording every callback; it answers `refuse`
/// to the first `refuse_first` of them and `ok` afterwards.
struct Receiver {
    url: String,
    seen: Arc<Mutex<Vec<Arrived>>>,
}

async fn receiver(refuse_first: usize, refuse: (u16, &'static str), ok: &'static str) -> Receiver {
    let seen: Arc<Mutex<Vec<Arrived>>> = Default::default();
    let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let log = seen.clone();
    // A GET is Aliyun's check of the URL: answered as SmsReport wants.
    let check = || async { r#"{"code":0,"msg":"成功"}"# };
    let app = axum::Router::new().fallback(axum::routing::get(check).post(
        move |uri: axum::http::Uri, body: String| {
            let calls = calls.clone();
            let log = log.clone();
            async move {
                log.lock().unwrap().push(Arrived {
                    query: uri.query().unwrap_or("").to_string(),
                    body,
                });
                let status = |s| axum::http::StatusCode::from_u16(s).unwrap();
                if calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst) < refuse_first {
                    (status(refuse.0), refuse.1)
                } else {
                    (status(200), ok)
                }
            }
        },
    ));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/v1/receipts/x", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    Receiver { url, seen }
}

impl Receiver {
    fn arrived(&self) -> Vec<Arrived> {
        self.seen.lock().unwrap().clone()
    }
}

fn receipts_to(rx: &Receiver, fail: &[&str]) -> ReceiptConfig {
    ReceiptConfig {
        url: rx.url.clone(),
        delay_ms: 10,
        secret: None,
        fail_after_accept: fail.iter().map(|s| s.to_string()).collect(),
        wechat_mode: Default::default(),
    }
}

/// Aliyun checks the SmsReport URL with a `GET` before it pushes there: a
/// URL that fails the check (here, a route that takes only POST) gets no
/// report, the check is made again before each re-push, at 1, 5 and 10
/// of the simulator's minutes, and the report is then given up.
#[tokio::test]
async fn aliyun_pushes_no_report_to_a_url_that_fails_its_get_check() {
    let sim = start().await;
    let seen: Arc<Mutex<Vec<Instant>>> = Default::default();
    let log = seen.clone();
    let app = axum::Router::new().fallback(axum::routing::post(move || {
        log.lock().unwrap().push(Instant::now());
        async { r#"{"code":0,"msg":"成功"}"# }
    }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/v1/receipts/x", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    let config = ReceiptConfig {
        url,
        delay_ms: 0,
        secret: None,
        fail_after_accept: Default::default(),
        wechat_mode: Default::default(),
    };
    assert!(sim.state.set_receipts("aliyun-sms", Some(config)));
    let started = Instant::now();
    send_sms(&sim, "13800000001", "nocheck-1").send(&sim).await;
    wait_for("the report given up", || {
        sim.stat("aliyun-sms.receipt_failed") == 1
    })
    .await;
    assert_eq!(
        sim.stat("aliyun-sms.probe_failed"),
        4,
        "checked before each push"
    );
    assert_eq!(sim.stat("aliyun-sms.receipt_posted"), 0);
    assert!(seen.lock().unwrap().is_empty(), "no report pushed");
    // 1 + 5 + 10 minutes of 50 ms.
    assert!(started.elapsed() >= Duration::from_millis(800));
}

#[tokio::test]
async fn aliyun_receipts_are_sms_report_arrays_retried_until_code_0() {
    let sim = start().await;
    let rx = receiver(
        1,
        (200, r#"{"code":1,"msg":"busy"}"#),
        r#"{"code":0,"msg":"成功"}"#,
    )
    .await;
    assert!(
        sim.state
            .set_receipts("aliyun-sms", Some(receipts_to(&rx, &["13800000002"])))
    );
    send_sms(&sim, "13800000001", "ok-1").send(&sim).await;
    wait_for(
        "the refused receipt retried and the second accepted",
        || sim.stat("aliyun-sms.receipt_posted") == 1,
    )
    .await;
    send_sms(&sim, "13800000002", "bad-1").send(&sim).await;
    wait_for("the failed-after-accept receipt", || {
        sim.stat("aliyun-sms.receipt_posted") == 2
    })
    .await;
    assert_eq!(sim.stat("aliyun-sms.receipt_retried"), 1);
    let arrived = rx.arrived();
    assert_eq!(arrived.len(), 3, "one retry, then one post per message");
    let first: Value = serde_json::from_str(&arrived[1].body).unwrap();
    let report = &first[0];
    assert_eq!(
        (report["phone_number"].as_str(), report["success"].as_bool()),
        (Some("13800000001"), Some(true))
    );
    assert_eq!(report["out_id"], "ok-1");
    assert_eq!(
        report["biz_id"],
        json!(sim.state.ledger()["aliyun-sms"][0].id)
    );
    for field in [
        "send_time",
        "report_time",
        "err_code",
        "err_msg",
        "sms_size",
    ] {
        assert!(report.get(field).is_some(), "SmsReport has {field}");
    }
    let failed: Value = serde_json::from_str(&arrived[2].body).unwrap();
    assert_eq!(failed[0]["success"], false);
    send_sms(&sim, "13800000003,13800000004", "two-1")
        .send(&sim)
        .await;
    wait_for("the batch", || sim.stat("aliyun-sms.receipt_posted") == 3).await;
    let batch: Value = serde_json::from_str(&rx.arrived()[3].body).unwrap();
    let phones: Vec<&str> = batch
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["phone_number"].as_str().unwrap())
        .collect();
    assert_eq!(
        phones,
        ["13800000003", "13800000004"],
        "one push carries both reports"
    );
    assert_eq!(
        batch[0]["biz_id"], batch[1]["biz_id"],
        "one BizId per request"
    );
    assert_eq!(
        sim.state.ledger()["aliyun-sms"][1].delivery,
        Delivery::Failed
    );
    assert!(
        !sim.state.set_receipts("fcm", Some(receipts_to(&rx, &[]))),
        "FCM has no receipts"
    );
}

// ---- WeChat ----

async fn wechat_token(sim: &Sim, rotate: bool) -> (u16, Value) {
    let c = sim.state.credentials();
    let r = if rotate {
        sim.http
            .get(format!("{}/cgi-bin/token", sim.base))
            .query(&[
                ("grant_type", "client_credential"),
                ("appid", &c.wechat_appid),
                ("secret", &c.wechat_secret),
            ])
            .send()
    } else {
        sim.http
            .post(format!("{}/cgi-bin/stable_token", sim.base))
            .json(&json!({"grant_type": "client_credential", "appid": c.wechat_appid, "secret": c.wechat_secret, "force_refresh": false}))
            .send()
    };
    json_of(r.await.unwrap()).await
}

async fn wechat_send(sim: &Sim, token: &str, openid: &str, client_msg_id: Option<&str>) -> Value {
    let mut body = json!({"touser": openid, "template_id": "TPL", "data": {"k": {"value": "v"}}});
    if let Some(id) = client_msg_id {
        body["client_msg_id"] = json!(id);
    }
    wechat_post(sim, token, &body).await
}

/// Posts `body` to the template send API with `token`; the answer's JSON.
async fn wechat_post(sim: &Sim, token: &str, body: &Value) -> Value {
    let r = sim
        .http
        .post(format!("{}/cgi-bin/message/template/send", sim.base))
        .query(&[("access_token", token)])
        .json(body)
        .send()
        .await
        .unwrap();
    json_of(r).await.1
}

fn token_of(v: &(u16, Value)) -> String {
    v.1["access_token"].as_str().unwrap().to_string()
}

#[tokio::test]
async fn wechat_stable_token_stays_and_cgi_token_rotates_with_an_overlap() {
    let sim = start_with(Config {
        wechat_rotation_overlap: Duration::from_millis(300),
        wechat_token_daily_cap: 3,
        ..Config::default()
    })
    .await;
    let s1 = token_of(&wechat_token(&sim, false).await);
    let s2 = token_of(&wechat_token(&sim, false).await);
    assert_eq!(s1, s2, "stable_token does not rotate");
    let r1 = token_of(&wechat_token(&sim, true).await);
    let r2 = token_of(&wechat_token(&sim, true).await);
    assert_ne!(r1, r2);
    assert_eq!(
        wechat_send(&sim, &r1, "o-1", None).await["errcode"],
        0,
        "the old token works during the overlap"
    );
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(
        wechat_send(&sim, &r1, "o-1", None).await["errcode"],
        40001,
        "rotated out"
    );
    assert_eq!(wechat_send(&sim, &r2, "o-1", None).await["errcode"], 0);
    assert_eq!(
        wechat_send(&sim, &s1, "o-1", None).await["errcode"],
        0,
        "the stable token is untouched"
    );
    wechat_token(&sim, true).await;
    assert_eq!(
        wechat_token(&sim, true).await.1["errcode"],
        45009,
        "daily cap"
    );
    assert!(sim.state.expire_tokens() >= 2);
    assert_eq!(wechat_send(&sim, &s1, "o-1", None).await["errcode"], 42001);
    let s3 = token_of(&wechat_token(&sim, false).await);
    assert_ne!(s3, s1, "a new stable token after expiry");
    assert_eq!(
        wechat_send(&sim, "not-a-token", "o-1", None).await["errcode"],
        40014
    );
    let c = sim.state.credentials();
    let (_, bad) = json_of(
        sim.http
            .post(format!("{}/cgi-bin/stable_token", sim.base))
            .json(&json!({"grant_type": "client_credential", "appid": c.wechat_appid, "secret": "wrong"}))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(bad["errcode"], 40125);
}

#[tokio::test]
async fn wechat_client_msg_id_dedupes_per_openid_inside_its_window_only() {
    let sim = start_with(Config {
        wechat_client_msg_id_window: Duration::from_millis(500),
        ..Config::default()
    })
    .await;
    let token = token_of(&wechat_token(&sim, false).await);
    let a = wechat_send(&sim, &token, "o-1", Some("m-1")).await;
    let b = wechat_send(&sim, &token, "o-1", Some("m-1")).await;
    assert_eq!(a["msgid"], b["msgid"]);
    assert_eq!(sim.count("wechat"), 1);
    wechat_send(&sim, &token, "o-2", Some("m-1")).await;
    assert_eq!(sim.count("wechat"), 2, "another openid is another message");
    wechat_send(&sim, &token, "o-1", None).await;
    wechat_send(&sim, &token, "o-1", None).await;
    assert_eq!(
        sim.count("wechat"),
        4,
        "without client_msg_id a resend is a second message"
    );
    tokio::time::sleep(Duration::from_millis(600)).await;
    let c = wechat_send(&sim, &token, "o-1", Some("m-1")).await;
    assert_ne!(a["msgid"], c["msgid"]);
    assert_eq!(
        sim.count("wechat"),
        5,
        "outside the window it is a new message"
    );
    sim.state.set_faults(
        "wechat",
        Faults {
            fail_next: 1,
            permanent: BTreeMap::from([("o-9".into(), "43004".into())]),
            ..Faults::default()
        },
    );
    assert_eq!(wechat_send(&sim, &token, "o-1", None).await["errcode"], -1);
    assert_eq!(
        wechat_send(&sim, &token, "o-9", None).await["errcode"],
        43004
    );
}

/// A template send of `template_id` with `data` to openid `o-1`.
async fn wechat_send_template(sim: &Sim, token: &str, template_id: &str, data: Value) -> Value {
    let body = json!({"touser": "o-1", "template_id": template_id, "data": data});
    wechat_post(sim, token, &body).await
}

/// WeChat refuses a `template_id` the account does not have (errcode
/// 40037) and a `data` that leaves a keyword of the template without a
/// value (47003, naming it), and sends nothing; keys the template does not
/// use are no refusal.
#[tokio::test]
async fn wechat_refuses_a_template_the_account_lacks_or_data_missing_a_keyword_and_sends_nothing() {
    let sim = start().await;
    let token = token_of(&wechat_token(&sim, false).await);
    let unknown = wechat_send_template(&sim, &token, "TPL-404", json!({"k": {"value": "v"}})).await;
    assert_eq!(
        (unknown["errcode"].as_i64(), unknown["errmsg"].as_str()),
        (Some(40037), Some("invalid template_id")),
        "{unknown}"
    );
    assert!(unknown.get("msgid").is_none(), "no message id: {unknown}");
    let plain = reqwest::Client::builder().no_proxy().build().unwrap();
    let set = plain
        .post(format!("{}/_sim/wechat-templates", sim.control))
        .json(&json!({"templates": {"WX_SHIPPED": ["thing1", "time2"]}}))
        .send()
        .await
        .unwrap();
    assert_eq!(set.status(), 200);
    let lacking = [
        json!({"thing1": {"value": "o-1"}}),
        json!({"thing1": {"value": "o-1"}, "time2": {"value": ""}}),
        json!({"thing1": {"value": "o-1"}, "time2": "2026-12-05"}),
    ];
    for data in lacking {
        let refused = wechat_send_template(&sim, &token, "WX_SHIPPED", data.clone()).await;
        assert_eq!(refused["errcode"], 47003, "{data}: {refused}");
        assert_eq!(
            refused["errmsg"], "argument invalid! data.time2.value is empty",
            "names the keyword: {refused}"
        );
    }
    assert!(
        sim.state.ledger()["wechat"].is_empty(),
        "nothing reaches a user"
    );
    assert_eq!(sim.stat("wechat.template_refused"), 4);
    let full = json!({"thing1": {"value": "o-1"}, "time2": {"value": "2026-12-05"},
                      "first": {"value": "not in the template"}});
    let sent = wechat_send_template(&sim, &token, "WX_SHIPPED", full).await;
    assert_eq!(sent["errcode"], 0, "an extra key is no refusal: {sent}");
    assert_eq!(sim.count("wechat"), 1);
}

/// `POST /_sim/wechat-templates` replaces the account's templates; a list
/// no account could have is refused 422 naming the fault, and changes
/// nothing.
#[tokio::test]
async fn the_wechat_templates_are_set_through_the_control_api() {
    let sim = start().await;
    let plain = reqwest::Client::builder().no_proxy().build().unwrap();
    let url = format!("{}/_sim/wechat-templates", sim.control);
    let set = |body: Value| plain.post(&url).json(&body).send();
    let bad = [
        (
            json!({"templates": {"WX": ["thing1.DATA"]}}),
            "`thing1.DATA`: name it without `.DATA`",
        ),
        (
            json!({"templates": {"WX": ["thing 1"]}}),
            "keyword `thing 1` is not a data key",
        ),
        (
            json!({"templates": {" ": []}}),
            "`template_id` must not be empty",
        ),
        (json!({"template": {"WX": []}}), "unknown field `template`"),
        (json!({"templates": ["WX"]}), "templates"),
    ];
    for (body, names) in bad {
        let r = set(body.clone()).await.unwrap();
        assert_eq!(r.status(), 422, "{body}");
        let text = r.text().await.unwrap();
        assert!(text.contains(names), "{body}: {text}");
    }
    let (_, before) = json_of(plain.get(&url).send().await.unwrap()).await;
    assert!(
        before["templates"]["TPL-SHIPPED"].is_array(),
        "the defaults stand after the refusals: {before}"
    );
    let r = set(json!({"templates": {"WX_NEW": ["thing1"]}}))
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let (_, after) = json_of(plain.get(&url).send().await.unwrap()).await;
    assert_eq!(after, json!({"templates": {"WX_NEW": ["thing1"]}}));
    let token = token_of(&wechat_token(&sim, false).await);
    let gone = wechat_send_template(&sim, &token, "TPL-SHIPPED", json!({})).await;
    assert_eq!(gone["errcode"], 40037, "no longer the account's: {gone}");
    let sent =
        wechat_send_template(&sim, &token, "WX_NEW", json!({"thing1": {"value": "x"}})).await;
    assert_eq!(sent["errcode"], 0, "{sent}");
    assert_eq!(sim.count("wechat"), 1);
}

fn sha1_signature(token: &str, timestamp: &str, nonce: &str) -> String {
    let mut parts = [token, timestamp, nonce];
    parts.sort();
    hex::encode(digest::digest(
        &digest::SHA1_FOR_LEGACY_USE_ONLY,
        parts.concat().as_bytes(),
    ))
}

#[tokio::test]
async fn wechat_receipts_are_signed_xml_events_retried_until_success() {
    let sim = start().await;
    let rx = receiver(1, (200, "fail"), "success").await;
    assert!(
        sim.state
            .set_receipts("wechat", Some(receipts_to(&rx, &["o-bad"])))
    );
    let token = token_of(&wechat_token(&sim, false).await);
    let sent = wechat_send(&sim, &token, "o-1", None).await;
    wechat_send(&sim, &token, "o-bad", None).await;
    wait_for("both receipts accepted", || {
        sim.stat("wechat.receipt_posted") == 2
    })
    .await;
    assert_eq!(sim.stat("wechat.receipt_retried"), 1);
    let arrived = rx.arrived();
    let token = &sim.state.credentials().wechat_callback_token;
    for a in &arrived {
        let q: BTreeMap<String, String> = url_pairs(&a.query);
        assert_eq!(
            q["signature"],
            sha1_signature(token, &q["timestamp"], &q["nonce"]),
            "signed with the callback token"
        );
        assert!(
            a.body
                .contains("<Event><![CDATA[TEMPLATESENDJOBFINISH]]></Event>")
        );
    }
    let ok = arrived
        .iter()
        .find(|a| a.body.contains("<FromUserName><![CDATA[o-1]]>"))
        .unwrap();
    assert!(
        ok.body
            .contains(&format!("<MsgID>{}</MsgID>", sent["msgid"]))
    );
    assert!(ok.body.contains("<Status><![CDATA[success]]></Status>"));
    let bad = arrived.iter().find(|a| a.body.contains("o-bad")).unwrap();
    assert!(
        bad.body
            .contains("<Status><![CDATA[failed:user block]]></Status>")
    );
}

/// Opens a safe-mode `Encrypt` as WeChat's page describes (written out here,
/// apart from the simulator's encryption): AES-256-CBC under
/// base64-decode(key + "="), IV = its first 16 bytes, PKCS#7 to 32 bytes,
/// then random(16) + length (4, big-endian) + message + AppID.
fn wechat_open(encoding_aes_key: &str, encrypt: &str) -> (String, String) {
    use aes::cipher::{BlockCipherDecrypt, KeyInit};
    let lenient = base64::engine::GeneralPurpose::new(
        &base64::alphabet::STANDARD,
        base64::engine::GeneralPurposeConfig::new().with_decode_allow_trailing_bits(true),
    );
    let key: [u8; 32] = lenient
        .decode(format!("{encoding_aes_key}="))
        .unwrap()
        .try_into()
        .unwrap();
    let mut data = STANDARD.decode(encrypt).unwrap();
    assert_eq!(data.len() % 32, 0, "whole 32-byte blocks");
    let cipher = aes::Aes256::new(&key.into());
    let mut prev: Vec<u8> = key[..16].to_vec();
    for block in data.chunks_exact_mut(16) {
        let cipher_block = block.to_vec();
        let mut b = aes::Block::try_from(&*block).unwrap();
        cipher.decrypt_block(&mut b);
        for (out, (p, c)) in block.iter_mut().zip(prev.iter().zip(b.iter())) {
            *out = p ^ c;
        }
        prev = cipher_block;
    }
    let pad = usize::from(*data.last().unwrap());
    assert!((1..=32).contains(&pad), "padding {pad}");
    assert!(
        data[data.len() - pad..]
            .iter()
            .all(|b| usize::from(*b) == pad)
    );
    data.truncate(data.len() - pad);
    let len = u32::from_be_bytes(data[16..20].try_into().unwrap()) as usize;
    let msg = String::from_utf8(data[20..20 + len].to_vec()).unwrap();
    let appid = String::from_utf8(data[20 + len..].to_vec()).unwrap();
    (msg, appid)
}

/// In safe mode the push carries only `ToUserName` and `Encrypt`; in
/// compatible mode the event's fields beside `Encrypt`; both add
/// `encrypt_type=aes` and a `msg_signature` over `Encrypt`, which opens to
/// the event and the account's AppID.
#[tokio::test]
async fn wechat_encrypted_modes_push_the_event_encrypted_and_signed_over_it() {
    use provider_sim::WechatMode;
    for mode in [WechatMode::Safe, WechatMode::Compatible] {
        let sim = start().await;
        let rx = receiver(0, (200, ""), "success").await;
        let config = ReceiptConfig {
            wechat_mode: mode,
            ..receipts_to(&rx, &[])
        };
        assert!(sim.state.set_receipts("wechat", Some(config)));
        let token = token_of(&wechat_token(&sim, false).await);
        let sent = wechat_send(&sim, &token, "o-1", None).await;
        wait_for("the receipt accepted", || {
            sim.stat("wechat.receipt_posted") == 1
        })
        .await;
        let arrived = rx.arrived().remove(0);
        let creds = sim.state.credentials();
        let q = url_pairs(&arrived.query);
        assert_eq!(q["encrypt_type"], "aes", "{mode:?}");
        assert_eq!(q["openid"], "o-1");
        let start = arrived.body.find("<Encrypt><![CDATA[").unwrap() + 18;
        let len = arrived.body[start..].find("]]>").unwrap();
        let encrypt = &arrived.body[start..start + len];
        let mut parts = [
            creds.wechat_callback_token.as_str(),
            q["timestamp"].as_str(),
            q["nonce"].as_str(),
            encrypt,
        ];
        parts.sort();
        let expected = hex::encode(digest::digest(
            &digest::SHA1_FOR_LEGACY_USE_ONLY,
            parts.concat().as_bytes(),
        ));
        assert_eq!(q["msg_signature"], expected, "{mode:?}");
        let (msg, appid) = wechat_open(&creds.wechat_encoding_aes_key, encrypt);
        assert_eq!(appid, creds.wechat_appid);
        assert!(msg.contains("<Event><![CDATA[TEMPLATESENDJOBFINISH]]></Event>"));
        assert!(msg.contains(&format!("<MsgID>{}</MsgID>", sent["msgid"])));
        let plain_fields = arrived.body.contains("<MsgID>");
        assert_eq!(
            plain_fields,
            mode == WechatMode::Compatible,
            "{}",
            arrived.body
        );
    }
}

#[tokio::test]
async fn wechat_url_check_signs_the_get_and_expects_the_echostr_back() {
    let sim = start().await;
    let token = sim.state.credentials().wechat_callback_token.clone();
    let app = axum::Router::new().route(
        "/wx",
        axum::routing::get(move |uri: axum::http::Uri| {
            let token = token.clone();
            async move {
                let q = url_pairs(uri.query().unwrap_or(""));
                let ok = q["signature"] == sha1_signature(&token, &q["timestamp"], &q["nonce"]);
                if ok {
                    q["echostr"].clone()
                } else {
                    "bad signature".into()
                }
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/wx", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    assert!(sim.state.wechat_verify_url(&url, None).await.unwrap());
    assert!(
        !sim.state
            .wechat_verify_url(&url, Some("another-token"))
            .await
            .unwrap()
    );
}

fn url_pairs(q: &str) -> BTreeMap<String, String> {
    q.split('&')
        .filter_map(|p| p.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

// ---- FCM ----

fn jws(header: &Value, claims: &Value, sign: impl Fn(&[u8]) -> Vec<u8>) -> String {
    let input = format!(
        "{}.{}",
        URL_SAFE_NO_PAD.encode(header.to_string()),
        URL_SAFE_NO_PAD.encode(claims.to_string())
    );
    let sig = sign(input.as_bytes());
    format!("{input}.{}", URL_SAFE_NO_PAD.encode(sig))
}

fn rs256(pem: &str) -> impl Fn(&[u8]) -> Vec<u8> {
    let der = PrivatePkcs8KeyDer::from_pem_slice(pem.as_bytes()).unwrap();
    let key = signature::RsaKeyPair::from_pkcs8(der.secret_pkcs8_der()).unwrap();
    move |msg| {
        let mut sig = vec![0; key.public().modulus_len()];
        key.sign(
            &signature::RSA_PKCS1_SHA256,
            &SystemRandom::new(),
            msg,
            &mut sig,
        )
        .unwrap();
        sig
    }
}

async fn fcm_token(sim: &Sim, tweak: impl Fn(&mut Value)) -> (u16, Value) {
    let sa: Value = serde_json::from_str(&sim.state.service_account_json(&sim.base)).unwrap();
    let iat = now();
    let mut claims = json!({"iss": sa["client_email"], "scope": "https://www.googleapis.com/auth/firebase.messaging",
                            "aud": sa["token_uri"], "iat": iat, "exp": iat + 3600});
    tweak(&mut claims);
    let header = json!({"alg": "RS256", "typ": "JWT", "kid": sa["private_key_id"]});
    let assertion = jws(&header, &claims, rs256(sa["private_key"].as_str().unwrap()));
    post_assertion(sim, &sa, &assertion).await
}

/// The OAuth jwt-bearer grant: the assertion POSTed as a form to `token_uri`.
async fn post_assertion(sim: &Sim, sa: &Value, assertion: &str) -> (u16, Value) {
    let r = sim
        .http
        .post(sa["token_uri"].as_str().unwrap())
        .form(&[
            ("grant_type", "urn:ietf:params:oauth:grant-type:jwt-bearer"),
            ("assertion", assertion),
        ])
        .send()
        .await
        .unwrap();
    json_of(r).await
}

async fn fcm_send(sim: &Sim, bearer: &str, device: &str) -> reqwest::Response {
    let message =
        json!({"token": device, "notification": {"title": "Shipped"}, "data": {"order": "o-1"}});
    fcm_post(sim, bearer, json!({ "message": message })).await
}

async fn fcm_post(sim: &Sim, bearer: &str, body: Value) -> reqwest::Response {
    let project = &sim.state.credentials().fcm_project_id;
    sim.http
        .post(format!("{}/v1/projects/{project}/messages:send", sim.base))
        .bearer_auth(bearer)
        .json(&body)
        .send()
        .await
        .unwrap()
}

#[tokio::test]
async fn fcm_oauth_verifies_the_assertion_and_sends_need_a_live_token() {
    let sim = start().await;
    let (status, tok) = fcm_token(&sim, |_| {}).await;
    assert_eq!(status, 200, "{tok}");
    assert_eq!(
        (tok["token_type"].as_str(), tok["expires_in"].as_u64()),
        (Some("Bearer"), Some(3599))
    );
    let bearer = tok["access_token"].as_str().unwrap().to_string();
    let (status, first) = json_of(fcm_send(&sim, &bearer, "dev-1").await).await;
    assert_eq!(status, 200);
    assert!(first["name"].as_str().unwrap().starts_with(&format!(
        "projects/{}/messages/",
        sim.state.credentials().fcm_project_id
    )));
    let (_, second) = json_of(fcm_send(&sim, &bearer, "dev-1").await).await;
    assert_ne!(first["name"], second["name"]);
    assert_eq!(
        sim.count("fcm"),
        2,
        "no reference: a resend is a second notification"
    );
    let dry = json!({"validate_only": true, "message": {"token": "dev-1"}});
    assert_eq!(fcm_post(&sim, &bearer, dry).await.status(), 200);
    assert_eq!(sim.count("fcm"), 2, "validate_only delivers nothing");
    let (status, forged) = fcm_token(&sim, |c| {
        c["iss"] = json!("someone@else.iam.gserviceaccount.com")
    })
    .await;
    assert_eq!(
        (status, forged["error"].as_str()),
        (400, Some("invalid_grant"))
    );
    let (_, long) = fcm_token(&sim, |c| c["exp"] = json!(now() + 7200)).await;
    assert_eq!(long["error"], "invalid_grant");
    let (_, scope) = fcm_token(&sim, |c| {
        c["scope"] = json!("https://www.googleapis.com/auth/cloud-platform.read-only")
    })
    .await;
    assert_eq!(scope["error"], "invalid_scope");
    let (status, _) = json_of(fcm_send(&sim, "ya29.made-up", "dev-1").await).await;
    assert_eq!(status, 401);
    sim.state.expire_tokens();
    let (status, expired) = json_of(fcm_send(&sim, &bearer, "dev-1").await).await;
    assert_eq!(
        (status, expired["error"]["status"].as_str()),
        (401, Some("UNAUTHENTICATED"))
    );
    let fresh = fcm_token(&sim, |_| {}).await.1["access_token"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(
        fcm_send(&sim, &fresh, "dev-1").await.status(),
        200,
        "a refreshed token works"
    );
}

/// The signature check itself: one flipped bit in the signature is refused.
#[tokio::test]
async fn fcm_assertion_with_a_tampered_signature_is_refused() {
    let sim = start().await;
    let sa: Value = serde_json::from_str(&sim.state.service_account_json(&sim.base)).unwrap();
    let header = json!({"alg": "RS256", "typ": "JWT", "kid": sa["private_key_id"]});
    let claims = json!({"iss": sa["client_email"], "scope": "https://www.googleapis.com/auth/firebase.messaging",
                        "aud": sa["token_uri"], "iat": now(), "exp": now() + 600});
    let sign = rs256(sa["private_key"].as_str().unwrap());
    let assertion = jws(&header, &claims, |m| {
        let mut s = sign(m);
        s[10] ^= 1;
        s
    });
    let (status, body) = post_assertion(&sim, &sa, &assertion).await;
    assert_eq!(
        (status, body["error_description"].as_str()),
        (400, Some("Invalid JWT Signature."))
    );
    assert_eq!(sim.stat("fcm.token"), 0);
}

#[tokio::test]
async fn fcm_errors_carry_fcm_error_details_and_retry_after() {
    let sim = start().await;
    let bearer = fcm_token(&sim, |_| {}).await.1["access_token"]
        .as_str()
        .unwrap()
        .to_string();
    sim.state.set_faults(
        "fcm",
        Faults {
            fail_429: 1.0,
            retry_after_secs: Some(9),
            permanent: BTreeMap::from([("gone".into(), "UNREGISTERED".into())]),
            ..Faults::default()
        },
    );
    let r = fcm_send(&sim, &bearer, "dev-1").await;
    assert_eq!(r.headers()["retry-after"], "9");
    let (status, body) = json_of(r).await;
    assert_eq!(
        (status, body["error"]["details"][0]["errorCode"].as_str()),
        (429, Some("QUOTA_EXCEEDED"))
    );
    let (status, body) = json_of(fcm_send(&sim, &bearer, "gone").await).await;
    assert_eq!(
        (status, body["error"]["details"][0]["errorCode"].as_str()),
        (404, Some("UNREGISTERED"))
    );
    assert_eq!(
        body["error"]["details"][0]["@type"],
        "type.googleapis.com/google.firebase.fcm.v1.FcmError"
    );
    sim.state.set_faults(
        "fcm",
        Faults {
            fail_5xx: 1.0,
            ..Faults::default()
        },
    );
    let r = fcm_send(&sim, &bearer, "dev-1").await;
    assert_eq!(
        (r.status().as_u16(), r.headers().contains_key("retry-after")),
        (503, true)
    );
    assert_eq!(sim.count("fcm"), 0);
}

// ---- APNs ----

fn es256(pem: &str) -> impl Fn(&[u8]) -> Vec<u8> {
    let der = PrivatePkcs8KeyDer::from_pem_slice(pem.as_bytes()).unwrap();
    let rng = SystemRandom::new();
    let key = signature::EcdsaKeyPair::from_pkcs8(
        &signature::ECDSA_P256_SHA256_FIXED_SIGNING,
        der.secret_pkcs8_der(),
        &rng,
    )
    .unwrap();
    move |msg| {
        key.sign(&SystemRandom::new(), msg)
            .unwrap()
            .as_ref()
            .to_vec()
    }
}

fn apns_jwt(sim: &Sim, iat: i64, pem: &str) -> String {
    let c = sim.state.credentials();
    jws(
        &json!({"alg": "ES256", "kid": c.apns_key_id}),
        &json!({"iss": c.apns_team_id, "iat": iat}),
        es256(pem),
    )
}

const DEVICE: &str = "6c1ad4b3e3a3b8a9e9f0f61a7f8b9c0d1e2f3a4b5c6d7e8f9a0b1c2d3e4f5a6b";

async fn apns_send(
    sim: &Sim,
    client: &reqwest::Client,
    jwt: &str,
    device: &str,
) -> (u16, Option<String>, Value) {
    let port = sim.port();
    let r = client
        .post(format!(
            "https://api.push.apple.com:{port}/3/device/{device}"
        ))
        .header("authorization", format!("bearer {jwt}"))
        .header("apns-topic", "com.example.shop")
        .header("apns-push-type", "alert")
        .header("apns-id", "123e4567-e89b-12d3-a456-426614174000")
        .json(&json!({"aps": {"alert": {"title": "Shipped", "body": "o-1"}}}))
        .send()
        .await
        .unwrap();
    let id = r
        .headers()
        .get("apns-id")
        .map(|v| v.to_str().unwrap().to_string());
    let status = r.status().as_u16();
    (status, id, r.json().await.unwrap_or(Value::Null))
}

#[tokio::test]
async fn apns_verifies_es256_tokens_over_http2_and_never_dedupes() {
    let sim = start_with(Config {
        apns_min_token_interval: Duration::ZERO,
        ..Config::default()
    })
    .await;
    let pem = sim.state.credentials().apns_private_key_pem.clone();
    let jwt = apns_jwt(&sim, now(), &pem);
    let (status, id, _) = apns_send(&sim, &sim.http, &jwt, DEVICE).await;
    assert_eq!(
        (status, id.as_deref()),
        (200, Some("123e4567-e89b-12d3-a456-426614174000"))
    );
    apns_send(&sim, &sim.http, &jwt, DEVICE).await;
    assert_eq!(
        sim.count("apns"),
        2,
        "apns-id is no dedup key: a resend is a second notification"
    );
    let http1_by_name = sim
        .http1
        .post(format!(
            "https://api.push.apple.com:{}/3/device/{DEVICE}",
            sim.port()
        ))
        .send()
        .await;
    assert!(
        http1_by_name.is_err(),
        "api.push.apple.com offers only h2: the handshake fails"
    );
    let http1_by_ip = sim
        .http1
        .post(format!("{}/3/device/{DEVICE}", sim.base))
        .header("authorization", format!("bearer {jwt}"))
        .send()
        .await
        .unwrap();
    assert_eq!(http1_by_ip.status(), 505, "HTTP/1.1 refused by IP too");
    let other = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)
        .unwrap()
        .serialize_pem();
    let (status, _, body) =
        apns_send(&sim, &sim.http, &apns_jwt(&sim, now(), &other), DEVICE).await;
    assert_eq!(
        (status, body["reason"].as_str()),
        (403, Some("InvalidProviderToken"))
    );
    let (status, _, body) =
        apns_send(&sim, &sim.http, &apns_jwt(&sim, now() - 3601, &pem), DEVICE).await;
    assert_eq!(
        (status, body["reason"].as_str()),
        (403, Some("ExpiredProviderToken"))
    );
    let (status, _, body) = apns_send(&sim, &sim.http, &jwt, "not-hex").await;
    assert_eq!(
        (status, body["reason"].as_str()),
        (400, Some("BadDeviceToken"))
    );
    sim.state.set_faults(
        "apns",
        Faults {
            permanent: BTreeMap::from([(DEVICE.into(), "Unregistered".into())]),
            ..Faults::default()
        },
    );
    let (status, _, body) = apns_send(&sim, &sim.http, &jwt, DEVICE).await;
    assert_eq!(
        (status, body["reason"].as_str()),
        (410, Some("Unregistered"))
    );
    assert!(body["timestamp"].is_number());
    sim.state.set_faults(
        "apns",
        Faults {
            fail_429: 1.0,
            ..Faults::default()
        },
    );
    let (status, _, body) = apns_send(&sim, &sim.http, &jwt, DEVICE).await;
    assert_eq!(
        (status, body["reason"].as_str()),
        (429, Some("TooManyRequests"))
    );
    assert_eq!(sim.count("apns"), 2);
}

#[tokio::test]
async fn apns_refuses_provider_token_updates_more_often_than_every_20_minutes() {
    let sim = start().await;
    let pem = sim.state.credentials().apns_private_key_pem.clone();
    assert_eq!(
        apns_send(&sim, &sim.http, &apns_jwt(&sim, now() - 5, &pem), DEVICE)
            .await
            .0,
        200
    );
    let (status, _, body) = apns_send(&sim, &sim.http, &apns_jwt(&sim, now(), &pem), DEVICE).await;
    assert_eq!(
        (status, body["reason"].as_str()),
        (429, Some("TooManyProviderTokenUpdates"))
    );
    let addr = format!("127.0.0.1:{}", sim.port()).parse().unwrap();
    let other_connection = tls_client(&sim.state, addr, false);
    let (status, _, _) = apns_send(
        &sim,
        &other_connection,
        &apns_jwt(&sim, now(), &pem),
        DEVICE,
    )
    .await;
    assert_eq!(status, 200, "the limit is per connection");
}

// ---- Standard Webhooks receiver ----

fn webhook_request(
    sim: &Sim,
    id: &str,
    ts: i64,
    secret: &str,
    body: &str,
) -> reqwest::RequestBuilder {
    let key = STANDARD
        .decode(secret.strip_prefix("whsec_").unwrap())
        .unwrap();
    let mac = hmac::sign(
        &hmac::Key::new(hmac::HMAC_SHA256, &key),
        format!("{id}.{ts}.{body}").as_bytes(),
    );
    sim.http
        .post(format!("{}/webhook/orders", sim.base))
        .header("webhook-id", id)
        .header("webhook-timestamp", ts.to_string())
        .header("webhook-signature", format!("v1,{}", STANDARD.encode(mac)))
        .header("content-type", "application/json")
        .body(body.to_string())
}

#[tokio::test]
async fn webhook_receiver_verifies_signatures_and_dedupes_by_id() {
    let sim = start().await;
    let secret = sim.state.credentials().webhook_secret.clone();
    let body =
        r#"{"type":"order.shipped","timestamp":"2026-12-01T00:00:00Z","data":{"order":"o-1"}}"#;
    for _ in 0..2 {
        let r = webhook_request(&sim, "msg_1", now(), &secret, body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    }
    let ledger = &sim.state.ledger()["webhook"];
    assert_eq!(ledger.len(), 1, "the same webhook-id is delivered once");
    assert_eq!(
        (ledger[0].replays, ledger[0].template.as_str()),
        (1, "order.shipped")
    );
    let forged = webhook_request(
        &sim,
        "msg_2",
        now(),
        "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
        body,
    )
    .send()
    .await
    .unwrap();
    assert_eq!(forged.status(), 401);
    let stale = webhook_request(&sim, "msg_3", now() - 301, &secret, body)
        .send()
        .await
        .unwrap();
    assert_eq!(stale.status(), 400);
    sim.state.set_faults(
        "webhook",
        Faults {
            fail_next: 1,
            ..Faults::default()
        },
    );
    let r = webhook_request(&sim, "msg_4", now(), &secret, body)
        .send()
        .await
        .unwrap();
    assert_eq!(
        (r.status().as_u16(), r.headers().contains_key("retry-after")),
        (503, true)
    );
    assert_eq!(sim.count("webhook"), 1);
}

// ---- Inbox and the control API ----

async fn inbox_send(sim: &Sim, key: &str, user: &str) -> reqwest::Response {
    sim.http
        .post(format!("{}/inbox/v1/messages", sim.base))
        .header("Idempotency-Key", key)
        .json(&json!({"user_id": user, "template": "shipped"}))
        .send()
        .await
        .unwrap()
}

#[tokio::test]
async fn inbox_receipts_carry_the_key_and_are_given_up_when_bounded() {
    let sim = start().await;
    let rx = receiver(1, (503, "down"), "").await;
    let config = ReceiptConfig {
        secret: Some("s3cret".into()),
        ..receipts_to(&rx, &["u-bad"])
    };
    assert!(sim.state.set_receipts("inbox", Some(config)));
    inbox_send(&sim, "k-1", "u-1").await;
    wait_for("the receipt after one refusal", || {
        sim.stat("inbox.receipt_posted") == 1
    })
    .await;
    let body: Value = serde_json::from_str(&rx.arrived()[1].body).unwrap();
    let r = &body["receipts"][0];
    assert_eq!(
        (r["reference"].as_str(), r["status"].as_str()),
        (Some("k-1"), Some("delivered"))
    );
    assert_eq!(r["message_id"], json!(sim.state.ledger()["inbox"][0].id));

    let down = receiver(usize::MAX, (503, "down"), "").await;
    sim.state
        .set_receipts("inbox", Some(receipts_to(&down, &["u-bad"])));
    inbox_send(&sim, "k-2", "u-bad").await;
    wait_for("the receipt given up", || {
        sim.stat("inbox.receipt_failed") == 1
    })
    .await;
    assert_eq!(down.arrived().len() as u32, provider_sim::RECEIPT_ATTEMPTS);
    let failed: Value = serde_json::from_str(&down.arrived()[0].body).unwrap();
    assert_eq!(failed["receipts"][0]["status"], "failed");
}

#[tokio::test]
async fn inbox_honours_idempotency_keys_and_a_cut_off_answer_leaves_one_message() {
    let sim = start().await;
    sim.state.set_faults(
        "inbox",
        Faults {
            drop_after_accept: 1.0,
            ..Faults::default()
        },
    );
    let send = || {
        sim.http
            .post(format!("{}/inbox/v1/messages", sim.base))
            .header("Idempotency-Key", "k-1")
            .json(&json!({"user_id": "u-1", "template": "shipped"}))
            .send()
    };
    let first = match send().await {
        Ok(r) => r.bytes().await.map(|_| ()),
        Err(e) => Err(e),
    };
    assert!(first.is_err(), "the answer was cut off");
    assert_eq!(sim.count("inbox"), 1);
    sim.state.set_faults("inbox", Faults::default());
    let r = send().await.unwrap();
    assert_eq!(
        (
            r.status().as_u16(),
            r.headers()["idempotent-replayed"].to_str().unwrap()
        ),
        (200, "true")
    );
    assert_eq!(sim.count("inbox"), 1);
    let q = sim
        .http
        .get(format!(
            "{}/inbox/v1/messages?idempotency_key=k-1",
            sim.base
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(json_of(q).await.1["status"], "delivered");
}

#[tokio::test]
async fn the_control_api_is_served_over_plain_http_and_tls() {
    let sim = start().await;
    let plain = reqwest::Client::builder().no_proxy().build().unwrap();
    let r = plain
        .post(format!("{}/_sim/faults", sim.control))
        .json(&json!({"fax": {}}))
        .send()
        .await
        .unwrap();
    let (status, body) = json_of(r).await;
    assert_eq!(status, 422);
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("unknown provider `fax`")
    );
    let r = plain
        .post(format!("{}/_sim/faults", sim.control))
        .json(&json!({"apns": {"fail_next": 1}}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let (_, ledger) = json_of(
        sim.http
            .get(format!("{}/_sim/ledger", sim.base))
            .send()
            .await
            .unwrap(),
    )
    .await;
    for p in provider_sim::PROVIDERS {
        assert!(ledger[p].is_array(), "{p} in the ledger");
    }
    let r = plain
        .post(format!("{}/_sim/receipts", sim.control))
        .json(&json!({"apns": {"url": "http://127.0.0.1:1/"}}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 422, "APNs sends no receipts");
    let ca = plain
        .get(format!("{}/_sim/ca.pem", sim.control))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(ca, sim.state.ca_pem());
}

#[tokio::test]
async fn given_credentials_are_the_ones_accepted() {
    let first = start().await;
    let kept = first.state.credentials().clone();
    let sim = start_with(Config {
        credentials: Some(kept.clone()),
        ..Config::default()
    })
    .await;
    assert_eq!(
        sim.state.credentials().fcm_private_key_pem,
        kept.fcm_private_key_pem
    );
    assert_eq!(
        fcm_token(&sim, |_| {}).await.0,
        200,
        "the kept RSA key verifies"
    );
    let jwt = apns_jwt(&sim, now(), &kept.apns_private_key_pem);
    assert_eq!(
        apns_send(&sim, &sim.http, &jwt, DEVICE).await.0,
        200,
        "the kept P-256 key verifies"
    );
    assert!(
        !format!("{kept:?}").contains(&kept.wechat_secret),
        "Debug hides secrets"
    );
}

// ---- Tencent Cloud SMS: a signature v3 client written from the documentation ----

/// HMAC-SHA256 of `data` under `key`.
fn hmac256(key: &[u8], data: &str) -> Vec<u8> {
    hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, key), data.as_bytes())
        .as_ref()
        .to_vec()
}

/// `yyyy-MM-dd` in UTC of Unix seconds (days since the epoch → civil date).
fn utc_day(secs: i64) -> String {
    let z = secs.div_euclid(86_400) + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}")
}

/// One Tencent API 3.0 call, with what a test may spoil.
struct TencentCall {
    action: &'static str,
    body: Value,
    secret_id: String,
    secret_key: String,
    timestamp: i64,
    /// The credential scope's date (default: the UTC date of `timestamp`).
    date: Option<String>,
    version: &'static str,
}

impl TencentCall {
    fn new(sim: &Sim, action: &'static str, body: Value) -> Self {
        let c = sim.state.credentials();
        TencentCall {
            action,
            body,
            secret_id: c.tencent_secret_id.clone(),
            secret_key: c.tencent_secret_key.clone(),
            timestamp: now(),
            date: None,
            version: "2021-01-11",
        }
    }

    /// Signs as "Signature v3" says: canonical request, string to sign,
    /// derived key, `Authorization`.
    async fn send(&self, sim: &Sim) -> reqwest::Response {
        let payload = self.body.to_string();
        let host = format!("127.0.0.1:{}", sim.port());
        let content_type = "application/json; charset=utf-8";
        let canonical = format!(
            "POST\n/\n\ncontent-type:{content_type}\nhost:{host}\n\ncontent-type;host\n{}",
            hex_sha256(payload.as_bytes())
        );
        let date = self.date.clone().unwrap_or_else(|| utc_day(self.timestamp));
        let scope = format!("{date}/sms/tc3_request");
        let to_sign = format!(
            "TC3-HMAC-SHA256\n{}\n{scope}\n{}",
            self.timestamp,
            hex_sha256(canonical.as_bytes())
        );
        let k = hmac256(format!("TC3{}", self.secret_key).as_bytes(), &date);
        let k = hmac256(&k, "sms");
        let k = hmac256(&k, "tc3_request");
        let signature = hex::encode(hmac256(&k, &to_sign));
        let auth = format!(
            "TC3-HMAC-SHA256 Credential={}/{scope}, SignedHeaders=content-type;host, Signature={signature}",
            self.secret_id
        );
        sim.http1
            .post(format!("{}/", sim.base))
            .header("authorization", auth)
            .header("content-type", content_type)
            .header("x-tc-action", self.action)
            .header("x-tc-version", self.version)
            .header("x-tc-timestamp", self.timestamp.to_string())
            .header("x-tc-region", "ap-guangzhou")
            .body(payload)
            .send()
            .await
            .unwrap()
    }
}

fn tencent_send(sim: &Sim, phones: &[&str], context: &str) -> TencentCall {
    let body = json!({
        "PhoneNumberSet": phones,
        "SmsSdkAppId": sim.state.credentials().tencent_sdk_app_id,
        "TemplateId": "1110",
        "SignName": "pushonce",
        "TemplateParamSet": ["4370"],
        "SessionContext": context,
    });
    TencentCall::new(sim, "SendSms", body)
}

fn tencent_pull(sim: &Sim, phone: &str) -> TencentCall {
    let body = json!({
        "BeginTime": now() - 3600,
        "Offset": 0,
        "Limit": 100,
        "PhoneNumber": phone,
        "SmsSdkAppId": sim.state.credentials().tencent_sdk_app_id,
    });
    TencentCall::new(sim, "PullSmsSendStatusByPhoneNumber", body)
}

/// `Response.Error.Code` of an answer (Tencent answers errors with HTTP 200).
fn tencent_error(v: &(u16, Value)) -> Option<&str> {
    assert_eq!(v.0, 200, "Tencent answers errors with 200: {v:?}");
    v.1["Response"]["Error"]["Code"].as_str()
}

async fn start_tencent(echo: bool) -> Sim {
    start_with(Config {
        tencent_report_after: Duration::from_millis(300),
        tencent_echo_session_context: echo,
        ..Config::default()
    })
    .await
}

/// Tencent refuses a `TemplateId` or `SignName` the account has not
/// approved: each number's `SendStatusSet` entry says
/// `FailedOperation.TemplateIncorrectOrUnapproved` /
/// `FailedOperation.SignatureIncorrectOrUnapproved` inside the HTTP 200,
/// without a `SerialNo` or a fee, and nothing is sent.
#[tokio::test]
async fn tencent_refuses_an_unapproved_template_or_sign_name_per_number_and_sends_nothing() {
    let sim = start_tencent(false).await;
    let cases = [
        (
            "TemplateId",
            "404404",
            "FailedOperation.TemplateIncorrectOrUnapproved",
        ),
        (
            "SignName",
            "NotOurSign",
            "FailedOperation.SignatureIncorrectOrUnapproved",
        ),
    ];
    for (field, value, code) in cases {
        let mut call = tencent_send(&sim, &["+8613800000001", "+8613800000002"], "ctx-u");
        call.body[field] = json!(value);
        let (status, v) = json_of(call.send(&sim).await).await;
        assert_eq!(status, 200, "{v}");
        assert!(
            v["Response"]["Error"].is_null(),
            "not a call-level error: {v}"
        );
        let set = v["Response"]["SendStatusSet"].as_array().unwrap();
        assert_eq!(set.len(), 2, "{v}");
        for entry in set {
            assert_eq!(entry["Code"], code, "{v}");
            assert_eq!(entry["SerialNo"], "", "{v}");
            assert_eq!(entry["Fee"], 0, "{v}");
        }
    }
    assert_eq!(sim.count("tencent-sms"), 0, "no SMS reaches a phone");
}

#[tokio::test]
async fn tencent_results_are_per_number_inside_a_200_and_the_same_context_twice_is_two_sms() {
    let sim = start_tencent(false).await;
    let (status, v) = json_of(
        tencent_send(&sim, &["+8613800000001", "+86abc"], "ctx-1")
            .send(&sim)
            .await,
    )
    .await;
    assert_eq!(status, 200);
    let set = v["Response"]["SendStatusSet"].as_array().unwrap();
    assert_eq!(set[0]["Code"], "Ok");
    assert_eq!(set[0]["SessionContext"], "ctx-1", "echoed");
    let serial = set[0]["SerialNo"].as_str().unwrap();
    assert!(serial.contains(':'), "{serial}");
    assert_eq!(set[1]["Code"], "InvalidParameterValue.IncorrectPhoneNumber");
    assert_eq!(set[1]["SerialNo"], "");
    // No idempotency: the same request again is a second SMS.
    let (_, again) = json_of(
        tencent_send(&sim, &["13800000001"], "ctx-1")
            .send(&sim)
            .await,
    )
    .await;
    assert_eq!(again["Response"]["SendStatusSet"][0]["Code"], "Ok");
    assert_ne!(again["Response"]["SendStatusSet"][0]["SerialNo"], serial);
    assert_eq!(sim.count("tencent-sms"), 2);
    assert!(v["Response"]["RequestId"].is_string());
}

#[tokio::test]
async fn tencent_refuses_forged_stale_misdated_and_unknown_id_requests() {
    let sim = start_tencent(false).await;
    let mut forged = tencent_send(&sim, &["13800000001"], "c");
    forged.secret_key = "not-the-key".into();
    let mut stale = tencent_send(&sim, &["13800000001"], "c");
    stale.timestamp = now() - 400;
    let mut unknown = tencent_send(&sim, &["13800000001"], "c");
    unknown.secret_id = "AKIDunknown".into();
    // A scope dated by a local clock (UTC+8 is a day ahead near midnight UTC).
    let mut misdated = tencent_send(&sim, &["13800000001"], "c");
    misdated.date = Some(utc_day(now() + 86_400));
    let mut old_version = tencent_send(&sim, &["13800000001"], "c");
    old_version.version = "2019-07-11";
    for (call, code) in [
        (forged, "AuthFailure.SignatureFailure"),
        (stale, "AuthFailure.SignatureExpire"),
        (unknown, "AuthFailure.SecretIdNotFound"),
        (misdated, "AuthFailure.SignatureFailure"),
        (old_version, "NoSuchVersion"),
    ] {
        let v = json_of(call.send(&sim).await).await;
        assert_eq!(tencent_error(&v), Some(code), "{v:?}");
    }
    assert_eq!(sim.count("tencent-sms"), 0);
    let mut wrong_app = tencent_send(&sim, &["13800000001"], "c");
    wrong_app.body["SmsSdkAppId"] = json!("1400000000");
    let v = json_of(wrong_app.send(&sim).await).await;
    assert_eq!(
        tencent_error(&v),
        Some("InvalidParameterValue.SdkAppIdNotExist")
    );
}

#[tokio::test]
async fn tencent_faults_answer_like_tencent() {
    let sim = start_tencent(false).await;
    let send = |ctx: &'static str| tencent_send(&sim, &["13800000001"], ctx);
    // InternalError.Timeout before the message was taken...
    sim.state.set_faults(
        "tencent-sms",
        Faults {
            fail_next: 1,
            ..Faults::default()
        },
    );
    let v = json_of(send("a").send(&sim).await).await;
    assert_eq!(tencent_error(&v), Some("InternalError.Timeout"));
    assert_eq!(sim.count("tencent-sms"), 0);
    // ...and after it: the same answer, and the SMS goes out.
    sim.state.set_faults(
        "tencent-sms",
        Faults {
            fail_next: 1,
            error_after_accept: 1.0,
            ..Faults::default()
        },
    );
    let v = json_of(send("b").send(&sim).await).await;
    assert_eq!(tencent_error(&v), Some("InternalError.Timeout"));
    assert_eq!(sim.count("tencent-sms"), 1);
    assert_eq!(sim.stat("tencent-sms.5xx_after_accept"), 1);
    // A cloud-API outage: the gateway's 502, after taking the SMS here.
    sim.state.set_faults(
        "tencent-sms",
        Faults {
            fail_next: 1,
            error_after_accept: 1.0,
            gateway_errors: true,
            ..Faults::default()
        },
    );
    let r = send("g").send(&sim).await;
    assert_eq!(r.status(), 502);
    assert_eq!(sim.count("tencent-sms"), 2);
    sim.state.set_faults(
        "tencent-sms",
        Faults {
            fail_429: 1.0,
            ..Faults::default()
        },
    );
    let v = json_of(send("c").send(&sim).await).await;
    assert_eq!(tencent_error(&v), Some("RequestLimitExceeded"));
    sim.state.set_faults(
        "tencent-sms",
        Faults {
            permanent: [(
                "13800000001".to_string(),
                "UnauthorizedOperation.SerivceSuspendDueToArrears".to_string(),
            )]
            .into(),
            ..Faults::default()
        },
    );
    let (status, v) = json_of(send("d").send(&sim).await).await;
    assert_eq!(status, 200);
    assert_eq!(
        v["Response"]["SendStatusSet"][0]["Code"],
        "UnauthorizedOperation.SerivceSuspendDueToArrears"
    );
    assert_eq!(sim.count("tencent-sms"), 2, "nothing more was taken");
}

#[tokio::test]
async fn tencent_pull_shows_receipts_only_and_echoes_the_context_only_when_enabled() {
    for echo in [false, true] {
        let sim = start_tencent(echo).await;
        let (_, v) = json_of(
            tencent_send(&sim, &["13800000001"], "ctx-p")
                .send(&sim)
                .await,
        )
        .await;
        let serial = v["Response"]["SendStatusSet"][0]["SerialNo"].clone();
        // Accepted, no receipt yet: the pull API does not show it.
        let (_, early) = json_of(tencent_pull(&sim, "+8613800000001").send(&sim).await).await;
        assert_eq!(early["Response"]["PullSmsSendStatusSet"], json!([]));
        tokio::time::sleep(Duration::from_millis(400)).await;
        let (_, late) = json_of(tencent_pull(&sim, "+8613800000001").send(&sim).await).await;
        let row = &late["Response"]["PullSmsSendStatusSet"][0];
        assert_eq!(row["SerialNo"], serial);
        assert_eq!(row["ReportStatus"], "SUCCESS");
        assert_eq!(row["SessionContext"], if echo { "ctx-p" } else { "" });
        let mut bad = tencent_pull(&sim, "+8613800000001");
        bad.body["Offset"] = json!(5);
        let v = json_of(bad.send(&sim).await).await;
        assert_eq!(tencent_error(&v), Some("InvalidParameterValue"));
    }
}

#[tokio::test]
async fn tencent_receipts_are_unsigned_arrays_retried_twice() {
    let sim = start_tencent(false).await;
    let rx = receiver(
        1,
        (200, r#"{"result":1,"errmsg":"busy"}"#),
        r#"{"result":0,"errmsg":"OK"}"#,
    )
    .await;
    assert!(
        sim.state
            .set_receipts("tencent-sms", Some(receipts_to(&rx, &["13800000002"])))
    );
    tencent_send(&sim, &["13800000001", "13800000002"], "ctx-r")
        .send(&sim)
        .await;
    wait_for("the refused push retried and accepted", || {
        sim.stat("tencent-sms.receipt_posted") == 1
    })
    .await;
    assert_eq!(sim.stat("tencent-sms.receipt_retried"), 1);
    let arrived = rx.arrived();
    assert_eq!(arrived.len(), 2);
    assert_eq!(arrived[1].query, "", "no signature in the URL");
    let body: Value = serde_json::from_str(&arrived[1].body).unwrap();
    let ledger = &sim.state.ledger()["tencent-sms"];
    assert_eq!(body[0]["sid"], json!(ledger[0].id));
    assert_eq!(body[0]["report_status"], "SUCCESS");
    assert_eq!(body[1]["report_status"], "FAIL");
    assert!(
        body[0].get("ext").is_none(),
        "no SessionContext echo unless enabled"
    );
    for field in [
        "user_receive_time",
        "nationcode",
        "mobile",
        "errmsg",
        "description",
    ] {
        assert!(body[0].get(field).is_some(), "the push has {field}");
    }
    // A receiver that never answers `result` 0 gets three pushes, then none.
    let never = receiver(usize::MAX, (500, "no"), "").await;
    assert!(
        sim.state
            .set_receipts("tencent-sms", Some(receipts_to(&never, &[])))
    );
    tencent_send(&sim, &["13800000003"], "ctx-s")
        .send(&sim)
        .await;
    wait_for("given up", || sim.stat("tencent-sms.receipt_failed") == 1).await;
    assert_eq!(never.arrived().len(), 3, "the push and two retries");
}

#[tokio::test]
async fn wechat_answers_a_taken_send_with_a_bare_200_or_a_replay_with_any_errcode() {
    let sim = start().await;
    let token = token_of(&wechat_token(&sim, false).await);
    sim.state.set_faults(
        "wechat",
        Faults {
            empty_200_next: 1,
            replay_errcode: Some(99999),
            ..Faults::default()
        },
    );
    let first = wechat_send(&sim, &token, "o-1", Some("m-1")).await;
    assert_eq!(first, json!({}), "HTTP 200 `{{}}`, no errcode");
    assert_eq!(sim.count("wechat"), 1, "taken all the same");
    let replay = wechat_send(&sim, &token, "o-1", Some("m-1")).await;
    assert_eq!(replay["errcode"], 99999, "{replay}");
    let ledger = &sim.state.ledger()["wechat"];
    assert_eq!(ledger.len(), 1, "a deduplicated resend: {ledger:?}");
    assert_eq!(ledger[0].replays, 1);
    let other = wechat_send(&sim, &token, "o-2", Some("m-2")).await;
    assert_eq!(other["errcode"], 0, "a new message gets its msgid: {other}");
}

/// A send to WeChat by a client that gives up after 300 ms.
async fn wechat_send_giving_up(sim: &Sim, token: &str, client_msg_id: &str) -> bool {
    let body = json!({"touser": "o-1", "template_id": "TPL", "client_msg_id": client_msg_id,
                      "data": {"k": {"value": "v"}}});
    sim.http
        .post(format!("{}/cgi-bin/message/template/send", sim.base))
        .query(&[("access_token", token)])
        .json(&body)
        .timeout(Duration::from_millis(300))
        .send()
        .await
        .is_err_and(|e| e.is_timeout())
}

#[tokio::test]
async fn a_send_answered_late_after_the_provider_took_it_is_sent_though_the_client_timed_out() {
    let sim = start().await;
    let token = token_of(&wechat_token(&sim, false).await);
    // Late before taking it: nothing is taken while the client waits.
    sim.state.set_faults(
        "wechat",
        Faults {
            slow_ms: 5000,
            ..Faults::default()
        },
    );
    assert!(wechat_send_giving_up(&sim, &token, "m-before").await);
    // Late after taking it: the timeout means "sent".
    sim.state.set_faults(
        "wechat",
        Faults {
            slow_after_accept_ms: 1000,
            ..Faults::default()
        },
    );
    assert!(wechat_send_giving_up(&sim, &token, "m-after").await);
    assert_eq!(sim.count("wechat"), 1, "taken before the answer");
    assert_eq!(
        sim.state.ledger()["wechat"][0].reference.as_deref(),
        Some("m-after"),
        "the send answered late after it was taken, not the one delayed before"
    );
}
