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
        .http
        .get(format!(
            "{}/cgi-bin/token?grant_type=client_credential&appid=wx1&secret=s",
            sim.base
        ))
        .send()
        .await
        .unwrap()
        .json()
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
