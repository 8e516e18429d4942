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
//! Faults are injected per provider through `POST /_sim/faults`; `GET /_sim/ledger`
//! lists every message each provider accepted. A resend carrying an already
//! accepted client reference is answered with the first message's id and is
//! not a second ledger entry.

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
use std::collections::{BTreeMap, HashMap};
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
    /// The next N sends get a server error, whatever the rates say.
    pub fail_next: u32,
    /// Delay before answering any send, in milliseconds.
    pub slow_ms: u64,
    /// Recipients refused for good, with the provider's error code for each
    /// (e.g. `isv.AMOUNT_NOT_ENOUGH` for SMS arrears, `43004` for WeChat unsubscribed).
    pub permanent: BTreeMap<String, String>,
}

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
}

/// Everything the simulator remembers, behind one lock.
struct Sim {
    /// Accepted messages per provider, in order of acceptance.
    ledger: BTreeMap<&'static str, Vec<Accepted>>,
    /// (provider, reference) → index into that provider's ledger.
    by_reference: HashMap<(&'static str, String), usize>,
    /// Faults per provider.
    faults: BTreeMap<&'static str, Faults>,
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
pub struct SimState(Arc<Mutex<Sim>>);

impl SimState {
    /// A fresh simulator.
    pub fn new(config: Config) -> Self {
        SimState(Arc::new(Mutex::new(Sim {
            ledger: PROVIDERS.iter().map(|p| (*p, Vec::new())).collect(),
            by_reference: HashMap::new(),
            faults: BTreeMap::new(),
            stats: BTreeMap::new(),
            tokens: HashMap::new(),
            token_ttl: config.token_ttl,
            rng: StdRng::seed_from_u64(config.seed),
            next_id: 1,
        })))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Sim> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
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
        };
        self.count(provider, outcome);
        verdict
    }

    /// Records a message unless its reference was seen; returns its id and
    /// whether it was a replay.
    fn accept(
        &mut self,
        provider: &'static str,
        reference: Option<String>,
        recipient: String,
        template: String,
        params: Value,
    ) -> (String, bool) {
        if let Some(r) = &reference
            && let Some(&i) = self.by_reference.get(&(provider, r.clone()))
        {
            let entry = &mut self
                .ledger
                .get_mut(provider)
                .expect("every provider has a ledger")[i];
            entry.replays += 1;
            return (entry.id.clone(), true);
        }
        let id = format!("{provider}-{}", self.next_id);
        self.next_id += 1;
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
        });
        (id, false)
    }

    fn find(&self, provider: &'static str, reference: &str) -> Option<&Accepted> {
        let i = *self.by_reference.get(&(provider, reference.to_string()))?;
        self.ledger.get(provider)?.get(i)
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
        Verdict::Accept { drop } => {
            let params = json!({"sign": req.sign_name, "params": req.template_param});
            let (id, _) = sim.accept("sms", req.out_id, req.phone_numbers, req.template_code, params);
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
    let sim = state.lock();
    let details: Vec<Value> = sim
        .find("sms", &req.out_id)
        .map(|m| json!({"OutId": req.out_id, "BizId": m.id, "SendStatus": 3, "PhoneNum": m.recipient}))
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
        Verdict::Accept { drop } => {
            let (id, _) = sim.accept("wechat", None, req.touser, req.template_id, req.data);
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
        Verdict::Accept { drop } => {
            let template = req
                .message
                .notification
                .get("title")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string();
            let (id, _) = sim.accept(
                "app-push",
                reference,
                req.message.token,
                template,
                req.message.data,
            );
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
        Verdict::Accept { drop } => {
            let (id, replay) =
                sim.accept("inbox", Some(key), req.user_id, req.template, req.params);
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
    match state.lock().find("inbox", &q.idempotency_key) {
        Some(m) => Json(json!({"id": m.id, "status": "delivered"})).into_response(),
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
