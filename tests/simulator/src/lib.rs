//! The provider simulator: one real HTTP server that imitates the four
//! providers pushonce sends through, so tests count duplicates and misses where
//! a user would — at the receiving end.
//!
//! - `sms`: an Aliyun-style SMS gateway (`POST /sms/SendSms`, `OutId` as the
//!   client reference, business error codes in a 200 body, `QuerySendDetails`).
//! - `wechat`: official-account template messages (`/cgi-bin/token`, then
//!   `/cgi-bin/message/template/send?access_token=`); like the real API it has
//!   no client reference and no status query, and its tokens expire.
//! - `app-push`: an FCM HTTP v1 style API (`/v1/projects/{p}/messages:send`),
//!   honouring an `Idempotency-Key` header as its client message id.
//! - `inbox`: the business's own in-site message service (`/inbox/v1/messages`,
//!   `Idempotency-Key` header, status by key).
//!
//! Faults are injected per provider through `POST /_sim/faults` (server
//! errors, rate limits, answers cut off after or *before* accepting, slow
//! answers, permanent refusals, failing status queries); `GET /_sim/ledger`
//! lists every message each provider accepted. A resend carrying an already
//! accepted client reference is answered with the first message's id and is
//! not a second ledger entry.
//!
//! Delivery receipts: `POST /_sim/receipts` gives a provider a callback URL
//! (pushonce's `/v1/receipts/{channel}`), a delay, an optional bearer secret
//! and the recipients whose messages fail after being accepted. Each newly
//! accepted message is then reported once, after the delay, in the format the
//! channel plugin's `parse-callback` reads —
//! `{"receipts":[{"reference","message_id","status"}]}` — retried with backoff
//! on a non-2xx answer or a connection error (bounded), counted in
//! `/_sim/stats` as `<provider>.receipt_posted` / `receipt_retried` /
//! `receipt_failed`. Status queries (SMS `QuerySendDetails`, inbox
//! `GET /inbox/v1/messages?idempotency_key=`) report a failed-after-accept
//! message as failed too.

use axum::{
    Json, Router,
    body::Body,
    extract::{Path, Query, State},
    http::{HeaderMap, StatusCode},
    response::{IntoResponse, Response},
    routing::{get, post},
};
use rand::{Rng, SeedableRng, rngs::StdRng};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The four providers the simulator imitates.
pub const PROVIDERS: [&str; 4] = ["sms", "wechat", "app-push", "inbox"];

/// Faults injected into one provider's send endpoint.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Faults {
    /// Share (0..=1) of sends answered with a server error, not accepted.
    pub fail_5xx: f64,
    /// Share of sends answered "rate limited", not accepted.
    pub fail_429: f64,
    /// Share of sends accepted, whose answer is then cut off mid-response.
    pub drop_after_accept: f64,
    /// Share of sends cut off *without* being accepted: the client sees the
    /// same broken answer as `drop_after_accept` (an unknown outcome), but
    /// the provider never got the message (no ledger entry).
    pub drop_before_accept: f64,
    /// Status queries (SMS `QuerySendDetails`, inbox `GET`) answer a server
    /// error while true.
    pub fail_queries: bool,
    /// The next N status queries answer a server error.
    pub fail_queries_next: u32,
    /// The next N sends get a server error, whatever the rates say.
    pub fail_next: u32,
    /// Delay before answering any send, in milliseconds.
    pub slow_ms: u64,
    /// Recipients refused for good, with the provider's error code for each
    /// (e.g. `isv.AMOUNT_NOT_ENOUGH` for SMS arrears, `43004` for WeChat unsubscribed).
    pub permanent: BTreeMap<String, String>,
}

/// Delivery receipts of one provider, set through `POST /_sim/receipts`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ReceiptConfig {
    /// Where receipts are posted, e.g. `http://127.0.0.1:PORT/v1/receipts/sms`.
    pub url: String,
    /// Delay between accepting a message and posting its receipt, in milliseconds.
    #[serde(default)]
    pub delay_ms: u64,
    /// Sent as `Authorization: Bearer <secret>` when set; never echoed back.
    #[serde(default, skip_serializing)]
    pub secret: Option<String>,
    /// Recipients whose messages are accepted, then fail (receipt and queries
    /// say `failed`).
    #[serde(default)]
    pub fail_after_accept: BTreeSet<String>,
}

/// What became of an accepted message at the provider.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Delivery {
    /// Reached the recipient.
    Delivered,
    /// Accepted, then failed (the recipient was in `fail_after_accept`).
    Failed,
}

impl Delivery {
    fn as_str(self) -> &'static str {
        match self {
            Delivery::Delivered => "delivered",
            Delivery::Failed => "failed",
        }
    }
}

/// Attempts at posting one receipt before giving up.
pub const RECEIPT_ATTEMPTS: u32 = 5;

/// One message a provider accepted.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Accepted {
    /// The provider's message id.
    pub id: String,
    /// The client reference it was sent with (SMS `OutId`, `Idempotency-Key`), if any.
    pub reference: Option<String>,
    /// Phone number, openid, device token or inbox user.
    pub recipient: String,
    /// Template code or id.
    pub template: String,
    /// Template parameters as sent.
    pub params: Value,
    /// When it was accepted, ms since the Unix epoch.
    pub accepted_at_ms: u64,
    /// Resends of the same reference answered without a new message.
    pub replays: u32,
    /// Delivered, or failed after accept; what receipts and queries report.
    pub delivery: Delivery,
}

/// Everything the simulator remembers, behind one lock.
struct Sim {
    /// Accepted messages per provider, in order of acceptance.
    ledger: BTreeMap<&'static str, Vec<Accepted>>,
    /// (provider, reference) → index into that provider's ledger.
    by_reference: HashMap<(&'static str, String), usize>,
    /// Faults per provider.
    faults: BTreeMap<&'static str, Faults>,
    /// Receipt callbacks per provider.
    receipts: BTreeMap<&'static str, ReceiptConfig>,
    /// Requests seen per provider and outcome, for tests and the operator.
    stats: BTreeMap<String, u64>,
    /// WeChat access tokens and when each expires (ms).
    tokens: HashMap<String, u64>,
    /// Lifetime of new WeChat tokens.
    token_ttl: Duration,
    /// Source of ids and of fault dice; seeded for repeatable runs.
    rng: StdRng,
    /// Next numeric message id.
    next_id: u64,
}

/// Configuration of a simulator instance.
#[derive(Debug, Clone)]
pub struct Config {
    /// Seed of the fault dice.
    pub seed: u64,
    /// Lifetime of WeChat access tokens.
    pub token_ttl: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            seed: 7,
            token_ttl: Duration::from_secs(7200),
        }
    }
}

/// Shared handle to the simulator's state.
#[derive(Clone)]
pub struct SimState {
    /// Everything remembered.
    sim: Arc<Mutex<Sim>>,
    /// Posts receipts (plain HTTP, no proxy).
    http: reqwest::Client,
}

impl SimState {
    /// A fresh simulator.
    pub fn new(config: Config) -> Self {
        let http = reqwest::Client::builder()
            .no_proxy()
            .timeout(Duration::from_secs(5))
            .build()
            .expect("a plain HTTP client builds");
        SimState {
            http,
            sim: Arc::new(Mutex::new(Sim {
                ledger: PROVIDERS.iter().map(|p| (*p, Vec::new())).collect(),
                by_reference: HashMap::new(),
                faults: BTreeMap::new(),
                receipts: BTreeMap::new(),
                stats: BTreeMap::new(),
                tokens: HashMap::new(),
                token_ttl: config.token_ttl,
                rng: StdRng::seed_from_u64(config.seed),
                next_id: 1,
            })),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Sim> {
        self.sim.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sets (or, with `None`, stops) the receipts of `provider`; false if unknown.
    pub fn set_receipts(&self, provider: &str, receipts: Option<ReceiptConfig>) -> bool {
        let Some(p) = PROVIDERS.iter().find(|p| **p == provider) else {
            return false;
        };
        let mut sim = self.lock();
        match receipts {
            Some(r) => sim.receipts.insert(p, r),
            None => sim.receipts.remove(p),
        };
        true
    }

    /// Sets the faults of `provider` (one of [`PROVIDERS`]); false if unknown.
    pub fn set_faults(&self, provider: &str, faults: Faults) -> bool {
        let Some(p) = PROVIDERS.iter().find(|p| **p == provider) else {
            return false;
        };
        self.lock().faults.insert(p, faults);
        true
    }

    /// Expires every WeChat access token issued so far (as time passing would).
    pub fn expire_tokens(&self) -> usize {
        let mut sim = self.lock();
        for exp in sim.tokens.values_mut() {
            *exp = 0;
        }
        sim.tokens.len()
    }

    /// Requests seen per `provider.outcome`.
    pub fn stats(&self) -> BTreeMap<String, u64> {
        self.lock().stats.clone()
    }

    /// Every message accepted, per provider.
    pub fn ledger(&self) -> BTreeMap<String, Vec<Accepted>> {
        self.lock()
            .ledger
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect()
    }
}

/// The simulator's routes.
pub fn app(state: SimState) -> Router {
    Router::new()
        .route("/sms/SendSms", post(sms_send))
        .route("/sms/QuerySendDetails", post(sms_query))
        .route("/cgi-bin/token", get(wechat_token))
        .route("/cgi-bin/message/template/send", post(wechat_send))
        .route("/v1/projects/{project}/messages:send", post(push_send))
        .route("/inbox/v1/messages", post(inbox_send).get(inbox_query))
        .route("/_sim/faults", post(set_faults).get(get_faults))
        .route("/_sim/receipts", post(set_receipts).get(get_receipts))
        .route("/_sim/ledger", get(ledger))
        .route("/_sim/stats", get(stats))
        .route("/_sim/wechat/expire-tokens", post(expire_tokens))
        .with_state(state)
}

/// Serves the simulator on `listener` until `shutdown` completes.
pub async fn run(
    listener: tokio::net::TcpListener,
    state: SimState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, app(state))
        .with_graceful_shutdown(shutdown)
        .await
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// What the dice said for one send.
enum Verdict {
    /// Refuse with a server error.
    ServerError,
    /// Refuse as rate limited.
    RateLimited,
    /// Refuse for good with this provider code.
    Permanent(String),
    /// Accept (or replay); `drop` cuts the answer off.
    Accept { drop: bool },
    /// Cut the answer off without accepting.
    DropBeforeAccept,
}

impl Sim {
    fn count(&mut self, provider: &str, outcome: &str) {
        *self
            .stats
            .entry(format!("{provider}.{outcome}"))
            .or_default() += 1;
    }

    fn roll(&mut self, provider: &'static str, recipient: &str) -> Verdict {
        let f = self.faults.get(provider).cloned().unwrap_or_default();
        let verdict = if let Some(code) = f.permanent.get(recipient) {
            Verdict::Permanent(code.clone())
        } else if f.fail_next > 0 {
            if let Some(f) = self.faults.get_mut(provider) {
                f.fail_next -= 1;
            }
            Verdict::ServerError
        } else {
            let x: f64 = self.rng.random();
            if x < f.fail_5xx {
                Verdict::ServerError
            } else if x < f.fail_5xx + f.fail_429 {
                Verdict::RateLimited
            } else if x < f.fail_5xx + f.fail_429 + f.drop_before_accept {
                Verdict::DropBeforeAccept
            } else {
                let y: f64 = self.rng.random();
                Verdict::Accept {
                    drop: y < f.drop_after_accept,
                }
            }
        };
        let outcome = match &verdict {
            Verdict::ServerError => "5xx",
            Verdict::RateLimited => "429",
            Verdict::Permanent(_) => "permanent",
            Verdict::Accept { drop: true } => "dropped_after_accept",
            Verdict::Accept { drop: false } => "accepted",
            Verdict::DropBeforeAccept => "dropped_before_accept",
        };
        self.count(provider, outcome);
        verdict
    }

    /// Records a message unless its reference was seen; returns its id,
    /// whether it was a replay, and the receipt to post for a new message
    /// when receipts are configured for `provider`.
    fn accept(
        &mut self,
        provider: &'static str,
        reference: Option<String>,
        recipient: String,
        template: String,
        params: Value,
    ) -> (String, bool, Option<ReceiptJob>) {
        if let Some(r) = &reference
            && let Some(&i) = self.by_reference.get(&(provider, r.clone()))
        {
            let entry = &mut self
                .ledger
                .get_mut(provider)
                .expect("every provider has a ledger")[i];
            entry.replays += 1;
            return (entry.id.clone(), true, None);
        }
        let id = format!("{provider}-{}", self.next_id);
        self.next_id += 1;
        let receipts = self.receipts.get(provider);
        let delivery = match receipts {
            Some(r) if r.fail_after_accept.contains(&recipient) => Delivery::Failed,
            _ => Delivery::Delivered,
        };
        let job = receipts.map(|r| {
            // The id the plugin got back from the send: WeChat's `msgid` is a number.
            let message_id = match provider {
                "wechat" => id.trim_start_matches("wechat-").to_string(),
                _ => id.clone(),
            };
            let mut entry = json!({
                "message_id": message_id,
                "recipient": recipient,
                "status": delivery.as_str(),
            });
            if let Some(r) = &reference {
                entry["reference"] = json!(r);
            }
            if delivery == Delivery::Failed {
                entry["error_code"] = json!("UNDELIVERABLE");
            }
            ReceiptJob {
                provider,
                url: r.url.clone(),
                secret: r.secret.clone(),
                delay: Duration::from_millis(r.delay_ms),
                body: json!({ "receipts": [entry] }),
            }
        });
        let list = self
            .ledger
            .get_mut(provider)
            .expect("every provider has a ledger");
        if let Some(r) = &reference {
            self.by_reference.insert((provider, r.clone()), list.len());
        }
        list.push(Accepted {
            id: id.clone(),
            reference,
            recipient,
            template,
            params,
            accepted_at_ms: now_ms(),
            replays: 0,
            delivery,
        });
        (id, false, job)
    }

    fn find(&self, provider: &'static str, reference: &str) -> Option<&Accepted> {
        let i = *self.by_reference.get(&(provider, reference.to_string()))?;
        self.ledger.get(provider)?.get(i)
    }

    /// True if this status query of `provider` must fail (counted as `query_5xx`).
    fn query_fails(&mut self, provider: &'static str) -> bool {
        let Some(f) = self.faults.get_mut(provider) else {
            return false;
        };
        let fail = f.fail_queries || f.fail_queries_next > 0;
        f.fail_queries_next = f.fail_queries_next.saturating_sub(1);
        if fail {
            self.count(provider, "query_5xx");
        }
        fail
    }

    fn slow(&self, provider: &str) -> Duration {
        Duration::from_millis(self.faults.get(provider).map(|f| f.slow_ms).unwrap_or(0))
    }
}

/// A response whose status and headers go out, then the connection is cut
/// before the body ends: the client cannot tell whether the provider accepted.
fn cut_off() -> Response {
    let stream = futures_util::stream::once(async {
        Err::<axum::body::Bytes, std::io::Error>(std::io::Error::other("simulated connection drop"))
    });
    Response::builder()
        .status(StatusCode::OK)
        .header("content-type", "application/json")
        .body(Body::from_stream(stream))
        .expect("a valid literal response")
}

async fn pause(state: &SimState, provider: &str) {
    let d = state.lock().slow(provider);
    if !d.is_zero() {
        tokio::time::sleep(d).await;
    }
}

// ---- Delivery receipts ----

/// One receipt to post.
struct ReceiptJob {
    /// Whose receipt it is (for the stats).
    provider: &'static str,
    /// Where to post it.
    url: String,
    /// Bearer secret, if configured.
    secret: Option<String>,
    /// Wait before the first attempt.
    delay: Duration,
    /// The callback body, in the plugin's format.
    body: Value,
}

impl SimState {
    /// Posts `job` in the background: after its delay, then retried with
    /// backoff (100 ms doubling, at most [`RECEIPT_ATTEMPTS`] attempts) until
    /// the receiver answers 2xx.
    fn spawn_receipt(&self, job: Option<ReceiptJob>) {
        let Some(job) = job else { return };
        let state = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep(job.delay).await;
            let mut backoff = Duration::from_millis(100);
            for attempt in 1..=RECEIPT_ATTEMPTS {
                let mut req = state.http.post(&job.url).json(&job.body);
                if let Some(s) = &job.secret {
                    req = req.bearer_auth(s);
                }
                let ok = match req.send().await {
                    Ok(r) => r.status().is_success(),
                    Err(_) => false,
                };
                if ok {
                    state.lock().count(job.provider, "receipt_posted");
                    return;
                }
                if attempt == RECEIPT_ATTEMPTS {
                    break;
                }
                state.lock().count(job.provider, "receipt_retried");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(2));
            }
            state.lock().count(job.provider, "receipt_failed");
        });
    }
}

// ---- SMS (Aliyun dysms style) ----

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct SmsSend {
    phone_numbers: String,
    #[serde(default)]
    sign_name: String,
    template_code: String,
    #[serde(default)]
    template_param: Value,
    #[serde(default)]
    out_id: Option<String>,
}

async fn sms_send(State(state): State<SimState>, Json(req): Json<SmsSend>) -> Response {
    pause(&state, "sms").await;
    let mut sim = state.lock();
    let request_id = format!("req-{}", sim.rng.random::<u32>());
    match sim.roll("sms", &req.phone_numbers) {
        Verdict::ServerError => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"Code": "ServiceUnavailable", "Message": "simulated outage", "RequestId": request_id})),
        )
            .into_response(),
        Verdict::RateLimited => Json(json!({
            "Code": "isv.BUSINESS_LIMIT_CONTROL", "Message": "rate limited", "RequestId": request_id
        }))
        .into_response(),
        Verdict::Permanent(code) => Json(json!({
            "Code": code, "Message": "refused for this recipient", "RequestId": request_id
        }))
        .into_response(),
        Verdict::DropBeforeAccept => cut_off(),
        Verdict::Accept { drop } => {
            let params = json!({"sign": req.sign_name, "params": req.template_param});
            let (id, _, job) =
                sim.accept("sms", req.out_id, req.phone_numbers, req.template_code, params);
            state.spawn_receipt(job);
            if drop {
                return cut_off();
            }
            Json(json!({"Code": "OK", "Message": "OK", "BizId": id, "RequestId": request_id}))
                .into_response()
        }
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct SmsQuery {
    out_id: String,
}

async fn sms_query(State(state): State<SimState>, Json(req): Json<SmsQuery>) -> Response {
    let mut sim = state.lock();
    if sim.query_fails("sms") {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"Code": "ServiceUnavailable", "Message": "simulated query outage"})),
        )
            .into_response();
    }
    let details: Vec<Value> = sim
        .find("sms", &req.out_id)
        .map(|m| {
            // SendStatus: 1 waiting, 2 failed, 3 delivered.
            let status = match m.delivery {
                Delivery::Delivered => 3,
                Delivery::Failed => 2,
            };
            json!({"OutId": req.out_id, "BizId": m.id, "SendStatus": status, "PhoneNum": m.recipient})
        })
        .into_iter()
        .collect();
    Json(json!({"Code": "OK", "SmsSendDetailDTOs": details})).into_response()
}

// ---- WeChat official account template messages ----

#[derive(Deserialize)]
struct TokenQuery {
    appid: String,
    secret: String,
}

async fn wechat_token(State(state): State<SimState>, Query(q): Query<TokenQuery>) -> Response {
    let mut sim = state.lock();
    if q.appid.is_empty() || q.secret.is_empty() {
        return Json(json!({"errcode": 40013, "errmsg": "invalid appid"})).into_response();
    }
    let token = format!("tok-{:016x}", sim.rng.random::<u64>());
    let ttl = sim.token_ttl;
    sim.tokens
        .insert(token.clone(), now_ms() + ttl.as_millis() as u64);
    sim.count("wechat", "token");
    Json(json!({"access_token": token, "expires_in": ttl.as_secs()})).into_response()
}

#[derive(Deserialize)]
struct AccessToken {
    access_token: String,
}

#[derive(Deserialize)]
struct WechatSend {
    touser: String,
    template_id: String,
    #[serde(default)]
    data: Value,
}

async fn wechat_send(
    State(state): State<SimState>,
    Query(q): Query<AccessToken>,
    Json(req): Json<WechatSend>,
) -> Response {
    pause(&state, "wechat").await;
    let mut sim = state.lock();
    match sim.tokens.get(&q.access_token) {
        None => {
            sim.count("wechat", "invalid_token");
            return Json(json!({"errcode": 40001, "errmsg": "invalid credential, access_token is invalid or not latest"})).into_response();
        }
        Some(&expires) if expires <= now_ms() => {
            sim.count("wechat", "expired_token");
            return Json(json!({"errcode": 42001, "errmsg": "access_token expired"}))
                .into_response();
        }
        Some(_) => {}
    }
    match sim.roll("wechat", &req.touser) {
        Verdict::ServerError => {
            Json(json!({"errcode": -1, "errmsg": "system error"})).into_response()
        }
        Verdict::RateLimited => {
            Json(json!({"errcode": 45009, "errmsg": "reach max api daily quota limit"}))
                .into_response()
        }
        Verdict::Permanent(code) => {
            let code: i64 = code.parse().unwrap_or(43004);
            Json(json!({"errcode": code, "errmsg": "require subscribe"})).into_response()
        }
        Verdict::DropBeforeAccept => cut_off(),
        Verdict::Accept { drop } => {
            let (id, _, job) = sim.accept("wechat", None, req.touser, req.template_id, req.data);
            state.spawn_receipt(job);
            if drop {
                return cut_off();
            }
            let msgid: u64 = id.trim_start_matches("wechat-").parse().unwrap_or(0);
            Json(json!({"errcode": 0, "errmsg": "ok", "msgid": msgid})).into_response()
        }
    }
}

async fn expire_tokens(State(state): State<SimState>) -> Response {
    let mut sim = state.lock();
    let n = sim.tokens.len();
    for exp in sim.tokens.values_mut() {
        *exp = 0;
    }
    Json(json!({"expired": n})).into_response()
}

// ---- App push (FCM HTTP v1 style) ----

#[derive(Deserialize)]
struct PushSend {
    message: PushMessage,
}

#[derive(Deserialize)]
struct PushMessage {
    token: String,
    #[serde(default)]
    data: Value,
    #[serde(default)]
    notification: Value,
}

fn fcm_error(status: StatusCode, name: &str, code: &str) -> Response {
    (
        status,
        Json(json!({"error": {"code": status.as_u16(), "status": name,
            "details": [{"@type": "type.googleapis.com/google.firebase.fcm.v1.FcmError", "errorCode": code}]}})),
    )
        .into_response()
}

async fn push_send(
    State(state): State<SimState>,
    Path(project): Path<String>,
    headers: HeaderMap,
    Json(req): Json<PushSend>,
) -> Response {
    pause(&state, "app-push").await;
    let reference = header(&headers, "idempotency-key");
    let mut sim = state.lock();
    match sim.roll("app-push", &req.message.token) {
        Verdict::ServerError => fcm_error(
            StatusCode::SERVICE_UNAVAILABLE,
            "UNAVAILABLE",
            "UNAVAILABLE",
        ),
        Verdict::RateLimited => fcm_error(
            StatusCode::TOO_MANY_REQUESTS,
            "RESOURCE_EXHAUSTED",
            "QUOTA_EXCEEDED",
        ),
        Verdict::Permanent(code) => fcm_error(StatusCode::NOT_FOUND, "NOT_FOUND", &code),
        Verdict::DropBeforeAccept => cut_off(),
        Verdict::Accept { drop } => {
            let template = req
                .message
                .notification
                .get("title")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string();
            let (id, _, job) = sim.accept(
                "app-push",
                reference,
                req.message.token,
                template,
                req.message.data,
            );
            state.spawn_receipt(job);
            if drop {
                return cut_off();
            }
            Json(json!({"name": format!("projects/{project}/messages/{id}")})).into_response()
        }
    }
}

// ---- Inbox (the business's own service) ----

#[derive(Deserialize)]
struct InboxSend {
    user_id: String,
    template: String,
    #[serde(default)]
    params: Value,
}

fn header(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
}

async fn inbox_send(
    State(state): State<SimState>,
    headers: HeaderMap,
    Json(req): Json<InboxSend>,
) -> Response {
    pause(&state, "inbox").await;
    let Some(key) = header(&headers, "idempotency-key") else {
        return (
            StatusCode::BAD_REQUEST,
            Json(json!({"error": "Idempotency-Key header is required"})),
        )
            .into_response();
    };
    let mut sim = state.lock();
    match sim.roll("inbox", &req.user_id) {
        Verdict::ServerError => (
            StatusCode::INTERNAL_SERVER_ERROR,
            Json(json!({"error": "simulated failure"})),
        )
            .into_response(),
        Verdict::RateLimited => (
            StatusCode::TOO_MANY_REQUESTS,
            Json(json!({"error": "slow down"})),
        )
            .into_response(),
        Verdict::Permanent(code) => (
            StatusCode::UNPROCESSABLE_ENTITY,
            Json(json!({"error": code})),
        )
            .into_response(),
        Verdict::DropBeforeAccept => cut_off(),
        Verdict::Accept { drop } => {
            let (id, replay, job) =
                sim.accept("inbox", Some(key), req.user_id, req.template, req.params);
            state.spawn_receipt(job);
            if drop {
                return cut_off();
            }
            let status = if replay {
                StatusCode::OK
            } else {
                StatusCode::CREATED
            };
            (
                status,
                [("idempotent-replayed", replay.to_string())],
                Json(json!({"id": id, "status": "accepted"})),
            )
                .into_response()
        }
    }
}

#[derive(Deserialize)]
struct InboxQuery {
    idempotency_key: String,
}

async fn inbox_query(State(state): State<SimState>, Query(q): Query<InboxQuery>) -> Response {
    let mut sim = state.lock();
    if sim.query_fails("inbox") {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"error": "simulated query outage"})),
        )
            .into_response();
    }
    match sim.find("inbox", &q.idempotency_key) {
        Some(m) => Json(json!({"id": m.id, "status": m.delivery.as_str()})).into_response(),
        None => (
            StatusCode::NOT_FOUND,
            Json(json!({"error": "no such message"})),
        )
            .into_response(),
    }
}

// ---- Control plane ----

async fn set_faults(
    State(state): State<SimState>,
    Json(req): Json<BTreeMap<String, Faults>>,
) -> Response {
    let mut sim = state.lock();
    for (provider, faults) in req {
        let Some(p) = PROVIDERS.iter().find(|p| **p == provider) else {
            return (
                StatusCode::UNPROCESSABLE_ENTITY,
                Json(json!({"error": format!("unknown provider `{provider}`; known: {}", PROVIDERS.join(", "))})),
            )
                .into_response();
        };
        sim.faults.insert(p, faults);
    }
    Json(json!({"ok": true})).into_response()
}

async fn get_faults(State(state): State<SimState>) -> Response {
    Json(state.lock().faults.clone()).into_response()
}

async fn ledger(State(state): State<SimState>) -> Response {
    Json(state.ledger()).into_response()
}

async fn stats(State(state): State<SimState>) -> Response {
    Json(state.lock().stats.clone()).into_response()
}

async fn set_receipts(
    State(state): State<SimState>,
    Json(req): Json<BTreeMap<String, Option<ReceiptConfig>>>,
) -> Response {
    if let Some(bad) = req.keys().find(|p| !PROVIDERS.contains(&p.as_str())) {
        return (
            StatusCode::UNPROCESSABLE_ENTITY,
            Json(json!({"error": format!("unknown provider `{bad}`; known: {}", PROVIDERS.join(", "))})),
        )
            .into_response();
    }
    if let Some((p, _)) = req.iter().find(|(_, r)| {
        r.as_ref()
            .is_some_and(|r| !r.url.starts_with("http://") && !r.url.starts_with("https://"))
    }) {
        return (
            StatusCode::UNPROCESSABLE_ENTITY,
            Json(json!({"error": format!("{p}: `url` must be an absolute http(s) URL")})),
        )
            .into_response();
    }
    for (provider, receipts) in req {
        state.set_receipts(&provider, receipts);
    }
    Json(json!({"ok": true})).into_response()
}

/// The receipt configuration per provider (secrets left out).
async fn get_receipts(State(state): State<SimState>) -> Response {
    Json(state.lock().receipts.clone()).into_response()
}
