//! The simulated Amazon SES and SNS as a client sees them: a signed
//! `SendEmail` is accepted and recorded with its headers; every refusal SES
//! documents comes back with its status, `x-amzn-ErrorType` and message;
//! notifications wait for the subscription's confirmation, then arrive
//! signed, with SNS's headers.

use axum::{Router, body::Bytes, http::HeaderMap, routing::post};
use provider_sim::{Config, Faults, SimState, sigv4};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

struct Sim {
    base: String,
    state: SimState,
    http: reqwest::Client,
}

async fn start() -> Sim {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let state = SimState::new(Config {
        sns_retry_delay: Duration::from_millis(50),
        ..Config::default()
    });
    tokio::spawn(provider_sim::run(
        listener,
        state.clone(),
        std::future::pending(),
    ));
    let ca = reqwest::Certificate::from_pem(state.ca_pem().as_bytes()).unwrap();
    let http = reqwest::Client::builder()
        .no_proxy()
        .add_root_certificate(ca)
        .build()
        .unwrap();
    Sim {
        base: format!("https://{addr}"),
        state,
        http,
    }
}

/// `YYYYMMDDTHHMMSSZ` of `at`.
fn amz_date(at: SystemTime) -> String {
    let t = time::OffsetDateTime::from(at);
    let f = time::macros::format_description!("[year][month][day]T[hour][minute][second]Z");
    t.format(f).unwrap()
}

impl Sim {
    /// POSTs `body` to SendEmail signed with `secret` at `at`; the body sent
    /// may differ from the one signed (`sent`).
    async fn send_signed(
        &self,
        secret: &str,
        at: SystemTime,
        signed: &Value,
        sent: &Value,
    ) -> (u16, String, Value) {
        let c = self.state.credentials();
        let host = self.base.trim_start_matches("https://").to_string();
        let date = amz_date(at);
        let body = signed.to_string();
        let headers = [
            ("host".to_string(), host),
            ("x-amz-date".to_string(), date.clone()),
        ];
        let canonical = sigv4::canonical_request(
            "POST",
            "/v2/email/outbound-emails",
            "",
            &headers,
            body.as_bytes(),
        );
        let mut auth = sigv4::Authorization {
            access_key_id: c.aws_access_key_id.clone(),
            date: date[..8].to_string(),
            region: "us-east-1".into(),
            service: "ses".into(),
            signed_headers: vec!["host".into(), "x-amz-date".into()],
            signature: String::new(),
        };
        auth.signature = sigv4::signature(secret, &date, &auth, &canonical);
        let authorization = format!(
            "AWS4-HMAC-SHA256 Credential={}/{}/us-east-1/ses/aws4_request, SignedHeaders=host;x-amz-date, Signature={}",
            auth.access_key_id, auth.date, auth.signature
        );
        let r = self
            .http
            .post(format!("{}/v2/email/outbound-emails", self.base))
            .header("x-amz-date", date)
            .header("authorization", authorization)
            .header("content-type", "application/json")
            .body(sent.to_string())
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        let kind = r
            .headers()
            .get("x-amzn-errortype")
            .map(|v| v.to_str().unwrap().to_string())
            .unwrap_or_default();
        (status, kind, r.json().await.unwrap_or(Value::Null))
    }

    async fn send(&self, body: &Value) -> (u16, String, Value) {
        let secret = self.state.credentials().aws_secret_access_key.clone();
        self.send_signed(&secret, SystemTime::now(), body, body)
            .await
    }

    fn emails(&self) -> Vec<provider_sim::Accepted> {
        self.state.ledger()["ses-email"].clone()
    }
}

/// A templated email to `to` with `headers`.
fn email(to: &str, headers: Value) -> Value {
    json!({
        "FromEmailAddress": format!("noreply@{}", provider_sim::ses::SES_IDENTITY),
        "Destination": {"ToAddresses": [to]},
        "Content": {"Template": {
            "TemplateName": "welcome",
            "TemplateData": "{\"name\":\"Ana\"}",
            "Headers": headers,
        }},
    })
}

fn one_click() -> Value {
    json!([
        {"Name": "List-Unsubscribe", "Value": "<https://push.example/v1/unsubscribe/t>"},
        {"Name": "List-Unsubscribe-Post", "Value": "List-Unsubscribe=One-Click"},
    ])
}

#[tokio::test]
async fn a_signed_send_is_recorded_with_its_headers_and_every_refusal_is_sess() {
    let sim = start().await;
    let (status, _, body) = sim.send(&email("ana@example.com", one_click())).await;
    assert_eq!(status, 200, "{body}");
    let id = body["MessageId"].as_str().unwrap().to_string();
    let emails = sim.emails();
    assert_eq!(emails.len(), 1);
    assert_eq!(emails[0].id, id);
    assert_eq!(emails[0].template, "welcome");
    assert_eq!(emails[0].params["Headers"], one_click());
    assert_eq!(emails[0].params["TemplateData"], json!({"name": "Ana"}));
    // No idempotency: the same request again is a second email.
    assert_eq!(
        sim.send(&email("ana@example.com", one_click())).await.0,
        200
    );
    assert_eq!(sim.emails().len(), 2);

    let good = email("ana@example.com", json!([]));
    let now = SystemTime::now();
    let mut altered = good.clone();
    altered["Destination"]["ToAddresses"] = json!(["eve@example.com"]);
    let cases = [
        (
            sim.send_signed("wrong-secret", now, &good, &good).await,
            403,
            "SignatureDoesNotMatchException",
        ),
        (
            sim.send_signed(
                &sim.state.credentials().aws_secret_access_key,
                now,
                &good,
                &altered,
            )
            .await,
            403,
            "SignatureDoesNotMatchException",
        ),
        (
            sim.send_signed(
                &sim.state.credentials().aws_secret_access_key,
                now - Duration::from_secs(600),
                &good,
                &good,
            )
            .await,
            403,
            "InvalidSignatureException",
        ),
    ];
    for ((status, kind, body), want, want_kind) in cases {
        assert_eq!((status, kind.as_str()), (want, want_kind), "{body}");
        assert!(body["message"].is_string(), "{body}");
    }
    let r = sim
        .http
        .post(format!("{}/v2/email/outbound-emails", sim.base))
        .json(&good)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 403, "unsigned");

    let mut bad_from = good.clone();
    bad_from["FromEmailAddress"] = json!("me@unverified.example");
    let fifteen_plus: Vec<Value> = (0..16)
        .map(|i| json!({"Name": format!("X-N{i}"), "Value": "v"}))
        .collect();
    let refusals = [
        (
            email(
                "ana@example.com",
                json!([{"Name": "From", "Value": "x@y.z"}]),
            ),
            "BadRequestException",
        ),
        (
            email("ana@example.com", json!(fifteen_plus)),
            "BadRequestException",
        ),
        (
            email(
                "ana@example.com",
                json!([{"Name": "List-Unsubscribe", "Value": "<a>"}, {"Name": "list-unsubscribe", "Value": "<b>"}]),
            ),
            "BadRequestException",
        ),
        (
            email(
                "ana@example.com",
                json!([{"Name": "X-A", "Value": "a\r\nBcc: eve@example.com"}]),
            ),
            "BadRequestException",
        ),
        (email("not-an-address", json!([])), "BadRequestException"),
        (bad_from, "MessageRejected"),
        (
            json!({"FromEmailAddress": "noreply@mail.pushonce.test", "Destination": {"ToAddresses": ["a@b.c"]}}),
            "BadRequestException",
        ),
    ];
    for (body, want) in refusals {
        let (status, kind, answer) = sim.send(&body).await;
        assert_eq!((status, kind.as_str()), (400, want), "{body} → {answer}");
    }
    assert_eq!(sim.emails().len(), 2, "nothing refused was recorded");
}

#[tokio::test]
async fn faults_answer_as_ses_does() {
    let sim = start().await;
    sim.state.set_faults(
        "ses-email",
        Faults {
            permanent: BTreeMap::from([(
                "gone@example.com".to_string(),
                "AccountSuspendedException".to_string(),
            )]),
            fail_next: 1,
            ..Faults::default()
        },
    );
    let (status, kind, _) = sim.send(&email("ana@example.com", json!([]))).await;
    assert_eq!((status, kind.as_str()), (500, "InternalFailure"));
    let (status, kind, _) = sim.send(&email("gone@example.com", json!([]))).await;
    assert_eq!((status, kind.as_str()), (400, "AccountSuspendedException"));
    sim.state.set_faults(
        "ses-email",
        Faults {
            fail_429: 1.0,
            ..Faults::default()
        },
    );
    let (status, kind, _) = sim.send(&email("ana@example.com", json!([]))).await;
    assert_eq!((status, kind.as_str()), (429, "TooManyRequestsException"));
    assert!(sim.emails().is_empty());
}

/// What an endpoint received: SNS's headers and body.
type Received = Arc<Mutex<Vec<(HeaderMap, Value)>>>;

async fn endpoint() -> (String, Received) {
    let got: Received = Arc::default();
    let keep = got.clone();
    let app = Router::new().route(
        "/sns",
        post(move |headers: HeaderMap, body: Bytes| {
            let keep = keep.clone();
            async move {
                keep.lock()
                    .unwrap()
                    .push((headers, serde_json::from_slice(&body).unwrap()));
                "ok"
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/sns", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, got)
}

async fn wait_for(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A receiving endpoint subscribed to the simulated SNS topic (signature
/// version 2), once its `SubscriptionConfirmation` came: the topic's ARN and
/// what the endpoint received.
async fn subscribed(sim: &Sim) -> (String, Received) {
    let (url, got) = endpoint().await;
    let topic = sim.state.sns_subscribe(provider_sim::sns::SnsConfig {
        url,
        signature_version: 2,
        topic_arn: None,
    });
    wait_for("the confirmation", || got.lock().unwrap().len() == 1).await;
    (topic, got)
}

#[tokio::test]
async fn notifications_wait_for_the_confirmation_then_come_signed() {
    let sim = start().await;
    let (topic, got) = subscribed(&sim).await;
    let (headers, confirmation) = got.lock().unwrap()[0].clone();
    assert_eq!(
        headers["x-amz-sns-message-type"],
        "SubscriptionConfirmation"
    );
    assert_eq!(confirmation["TopicArn"], topic.as_str());
    assert_eq!(confirmation["SignatureVersion"], "2");

    // Unconfirmed: a bounce is not delivered.
    assert_eq!(
        sim.send(&email("bounce@simulator.amazonses.com", json!([])))
            .await
            .0,
        200
    );
    assert_eq!(sim.state.stats()["ses-email.sns_unconfirmed"], 1);

    // The SubscribeURL confirms it; its certificate is served.
    let subscribe = confirmation["SubscribeURL"].as_str().unwrap();
    let r = sim.http.get(subscribe).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 200);
    assert_eq!(sim.state.sns_confirmations().len(), 1);
    let cert_url = confirmation["SigningCertURL"].as_str().unwrap();
    let pem = sim
        .http
        .get(cert_url)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(pem.starts_with("-----BEGIN CERTIFICATE-----"), "{pem}");

    let (_, _, sent) = sim
        .send(&email("bounce+1@simulator.amazonses.com", json!([])))
        .await;
    wait_for("the bounce", || got.lock().unwrap().len() == 2).await;
    let (headers, n) = got.lock().unwrap()[1].clone();
    assert_eq!(headers["x-amz-sns-message-type"], "Notification");
    assert_eq!(headers["x-amz-sns-topic-arn"], topic.as_str());
    let notice: Value = serde_json::from_str(n["Message"].as_str().unwrap()).unwrap();
    assert_eq!(notice["notificationType"], "Bounce");
    assert_eq!(notice["bounce"]["bounceType"], "Permanent");
    assert_eq!(notice["mail"]["messageId"], sent["MessageId"]);
    assert_eq!(
        notice["bounce"]["bouncedRecipients"][0]["emailAddress"],
        "bounce+1@simulator.amazonses.com"
    );
    assert!(n["Signature"].as_str().is_some_and(|s| !s.is_empty()));
}

/// `email(to)` with `data` as its `TemplateData` and, when given, a
/// `ConfigurationSetName`.
fn email_with(to: &str, data: Value, configuration_set: Option<&str>) -> Value {
    let mut body = email(to, json!([]));
    body["Content"]["Template"]["TemplateData"] = json!(data.to_string());
    if let Some(set) = configuration_set {
        body["ConfigurationSetName"] = json!(set);
    }
    body
}

/// A registered template whose data lacks a variable: answered 200 with a
/// `MessageId` as SES answers it, never sent (no ledger entry, no Delivery,
/// not counted accepted); a `Rendering Failure` event is published, signed,
/// only when the send named a configuration set.
#[tokio::test]
async fn a_template_missing_a_variable_is_answered_but_never_sent() {
    let sim = start().await;
    sim.state
        .ses_template("welcome", &["name", "favoritecolor"]);
    let (topic, got) = subscribed(&sim).await;
    let confirmation = got.lock().unwrap()[0].1.clone();
    let subscribe = confirmation["SubscribeURL"].as_str().unwrap();
    assert_eq!(sim.http.get(subscribe).send().await.unwrap().status(), 200);
    let to = "success@simulator.amazonses.com";
    let kinds = |got: &Received| -> Vec<String> {
        got.lock().unwrap()[1..]
            .iter()
            .map(|(_, n)| {
                let m: Value = serde_json::from_str(n["Message"].as_str().unwrap()).unwrap();
                m["eventType"]
                    .as_str()
                    .or(m["notificationType"].as_str())
                    .unwrap()
                    .to_string()
            })
            .collect()
    };

    // No configuration set: the MessageId, and then nothing at all.
    let (status, _, answer) = sim
        .send(&email_with(to, json!({"name": "Ana"}), None))
        .await;
    assert_eq!(status, 200, "{answer}");
    assert!(answer["MessageId"].as_str().is_some_and(|m| !m.is_empty()));
    assert!(sim.emails().is_empty(), "not sent, so not in the ledger");
    // A complete email after it is sent and delivered: its Delivery is the
    // only notification there is.
    let (status, _, good) = sim
        .send(&email_with(
            to,
            json!({"name": "Ana", "favoritecolor": "teal"}),
            Some("pushonce"),
        ))
        .await;
    assert_eq!(status, 200);
    wait_for("the delivery", || got.lock().unwrap().len() == 2).await;
    assert_eq!(kinds(&got), ["Delivery"]);
    assert_eq!(sim.emails().len(), 1);
    assert_eq!(sim.emails()[0].id, good["MessageId"].as_str().unwrap());

    // With a configuration set: the MessageId, then a signed Rendering
    // Failure event for it, and still no Delivery.
    let (status, _, failed) = sim
        .send(&email_with(to, json!({"name": "Ana"}), Some("pushonce")))
        .await;
    assert_eq!(status, 200);
    wait_for("the rendering failure", || got.lock().unwrap().len() == 3).await;
    let (headers, n) = got.lock().unwrap()[2].clone();
    assert_eq!(headers["x-amz-sns-message-type"], "Notification");
    assert_eq!(headers["x-amz-sns-topic-arn"], topic.as_str());
    assert_eq!(n["SignatureVersion"], "2");
    assert!(n["Signature"].as_str().is_some_and(|s| !s.is_empty()));
    let event: Value = serde_json::from_str(n["Message"].as_str().unwrap()).unwrap();
    assert_eq!(event["eventType"], "Rendering Failure");
    assert!(event.get("notificationType").is_none(), "{event}");
    assert_eq!(event["mail"]["messageId"], failed["MessageId"]);
    assert_eq!(
        event["failure"]["errorMessage"],
        "Attribute 'favoritecolor' is not present in the rendering data."
    );
    assert_eq!(event["failure"]["templateName"], "welcome");
    assert_eq!(kinds(&got), ["Delivery", "Rendering Failure"]);
    assert_eq!(
        sim.emails().len(),
        1,
        "the failed email is not in the ledger"
    );
    let stats = sim.state.stats();
    assert_eq!(stats["ses-email.accepted"], 1, "{stats:?}");
    assert_eq!(stats["ses-email.rendering_failure"], 2, "{stats:?}");

    // A template not registered renders whatever its data (today's way).
    let mut other = email_with(to, json!({}), None);
    other["Content"]["Template"]["TemplateName"] = json!("receipt");
    assert_eq!(sim.send(&other).await.0, 200);
    assert_eq!(sim.emails().len(), 2);
}

/// The control API registers a template as `SimState::ses_template` does.
#[tokio::test]
async fn templates_are_registered_through_the_control_api() {
    let sim = start().await;
    let r = sim
        .http
        .post(format!("{}/_sim/ses/templates", sim.base))
        .json(&json!({"name": "welcome", "variables": ["name", "favoritecolor"]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let empty = sim
        .http
        .post(format!("{}/_sim/ses/templates", sim.base))
        .json(&json!({"name": "", "variables": []}))
        .send()
        .await
        .unwrap();
    assert_eq!(empty.status().as_u16(), 422);
    let to = "success@simulator.amazonses.com";
    let (status, _, answer) = sim
        .send(&email_with(to, json!({"name": "Ana"}), None))
        .await;
    assert_eq!(status, 200, "{answer}");
    assert!(sim.emails().is_empty());
    assert_eq!(sim.state.stats()["ses-email.rendering_failure"], 1);
}
