//! What the simulator remembers: the ledger of accepted messages (the
//! oracle), faults and their dice, stats, tokens and nonces.

use crate::{Faults, PROVIDERS, ReceiptConfig, SimState, now_ms};
use axum::{
    body::Body,
    http::{HeaderValue, StatusCode},
    response::Response,
};
use rand::{Rng, SeedableRng, rngs::StdRng};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

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
    /// `delivered` / `failed`.
    pub fn as_str(self) -> &'static str {
        match self {
            Delivery::Delivered => "delivered",
            Delivery::Failed => "failed",
        }
    }
}

/// One message a provider accepted: one message a user receives.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Accepted {
    /// The provider's message id (Aliyun `BizId`, WeChat `msgid`, FCM message
    /// name's last segment, `apns-id`, `webhook-id`, inbox id).
    pub id: String,
    /// The client reference it was sent with when the protocol carries one
    /// (Aliyun `OutId`, WeChat `client_msg_id`, `apns-id` as sent,
    /// `webhook-id`, inbox `Idempotency-Key`).
    pub reference: Option<String>,
    /// Phone number, openid, device token, webhook endpoint or inbox user.
    pub recipient: String,
    /// Template code or id (FCM: notification title; webhook: `type`).
    pub template: String,
    /// Template parameters as sent.
    pub params: Value,
    /// When it was accepted, ms since the Unix epoch.
    pub accepted_at_ms: u64,
    /// Resends answered without a new message (only where the provider
    /// dedupes: WeChat `client_msg_id` inside its window, webhook, inbox).
    pub replays: u32,
    /// Delivered, or failed after accept; what receipts and queries report.
    pub delivery: Delivery,
}

/// How a provider treats a resend of a reference it has seen.
#[derive(Debug, Clone, Copy)]
pub enum Dedupe {
    /// Every send is a new message (Aliyun, FCM, APNs).
    Never,
    /// The first message is answered again, for ever (inbox).
    Always,
    /// Deduplicated only within this window after the first (WeChat,
    /// webhook receivers).
    Within(Duration),
}

/// A message as a provider received it.
pub struct Incoming {
    /// Id chosen by the client and kept by the provider (`apns-id`); else one is made.
    pub id: Option<String>,
    /// See [`Accepted::reference`].
    pub reference: Option<String>,
    /// What a resend is recognised (and the message found) by, where the
    /// provider dedupes: the reference, scoped as the provider scopes it.
    pub key: Option<String>,
    /// See [`Accepted::recipient`].
    pub recipient: String,
    /// See [`Accepted::template`].
    pub template: String,
    /// See [`Accepted::params`].
    pub params: Value,
}

/// The outcome of [`Sim::accept`].
pub struct Outcome {
    /// The message's id (the first one's, for a replay).
    pub id: String,
    /// True if this was a deduplicated resend.
    pub replay: bool,
    /// A receipt to post for a new message, when receipts are configured.
    pub receipt: Option<(ReceiptConfig, Accepted)>,
}

/// WeChat tokens: which endpoint minted them, and until when they are valid.
#[derive(Debug, Clone)]
pub struct WechatToken {
    /// True for `stable_token`, false for `/cgi-bin/token`.
    pub stable: bool,
    /// Expires at (ms since epoch): errcode 42001 afterwards.
    pub expires_ms: u64,
    /// Invalidated by a newer token at (ms): errcode 40001 afterwards.
    pub revoked_ms: Option<u64>,
}

impl WechatToken {
    /// Neither expired nor revoked at `now` (ms).
    pub fn live(&self, now: u64) -> bool {
        self.expires_ms > now && self.revoked_ms.is_none_or(|r| r > now)
    }
}

/// Everything the simulator remembers, behind one lock.
pub struct Sim {
    /// Accepted messages per provider, in order of acceptance.
    pub ledger: BTreeMap<&'static str, Vec<Accepted>>,
    /// (provider, reference) → index of the latest message with it.
    by_reference: HashMap<(&'static str, String), usize>,
    /// Faults per provider.
    pub faults: BTreeMap<&'static str, Faults>,
    /// Receipt callbacks per provider.
    pub receipts: BTreeMap<&'static str, ReceiptConfig>,
    /// Requests seen per provider and outcome.
    pub stats: BTreeMap<String, u64>,
    /// WeChat access tokens.
    pub wechat_tokens: HashMap<String, WechatToken>,
    /// WeChat token calls per (endpoint, day number).
    pub wechat_token_calls: HashMap<(bool, u64), u32>,
    /// FCM OAuth access tokens and when each expires (ms).
    pub fcm_tokens: HashMap<String, u64>,
    /// The APNs provider token in use per connection: its `iat` and when it
    /// was first seen (ms).
    pub apns_tokens: HashMap<crate::tls::ConnectionId, (i64, u64)>,
    /// Aliyun signature nonces already used.
    pub aliyun_nonces: HashSet<String>,
    /// Inbox `Idempotency-Key`s whose first request is being processed.
    pub inbox_in_flight: HashSet<String>,
    /// SmsReport URLs that passed Aliyun's `GET` check.
    pub checked_report_urls: HashSet<String>,
    /// The last SmsUp `sequence_id` pushed.
    pub sms_up_sequence: u64,
    /// Source of ids and of fault dice; seeded for repeatable runs.
    pub rng: StdRng,
    /// Next numeric message id.
    next_id: u64,
    /// SES stored templates registered with the variables each uses
    /// ([`crate::SimState::ses_template`]); a template not here renders
    /// whatever its data.
    pub ses_templates: BTreeMap<String, Vec<String>>,
    /// What each SMS account has approved ([`crate::SmsApprovals`]).
    pub sms_approvals: BTreeMap<&'static str, crate::SmsApprovals>,
    /// The WeChat account's templates ([`crate::WechatTemplates`]).
    pub wechat_templates: crate::WechatTemplates,
}

/// What the dice said for one send.
pub enum Verdict {
    /// Refuse with a server error.
    ServerError,
    /// Refuse as rate limited.
    RateLimited,
    /// Refuse for good with this provider code.
    Permanent(String),
    /// Accept; `drop` cuts the answer off, `fail` answers a server error.
    Accept {
        /// Cut the answer off after accepting.
        drop: bool,
        /// Answer the provider's server error after accepting.
        fail: bool,
    },
    /// Cut the answer off without accepting.
    DropBeforeAccept,
}

impl Verdict {
    /// The stats outcome of the verdict (`accepted`, `5xx`, `429`...).
    pub fn outcome(&self) -> &'static str {
        match self {
            Verdict::ServerError => "5xx",
            Verdict::RateLimited => "429",
            Verdict::Permanent(_) => "permanent",
            Verdict::Accept { fail: true, .. } => "5xx_after_accept",
            Verdict::Accept { drop: true, .. } => "dropped_after_accept",
            Verdict::Accept { .. } => "accepted",
            Verdict::DropBeforeAccept => "dropped_before_accept",
        }
    }
}

impl Sim {
    /// An empty simulator whose dice start from `seed`.
    pub fn new(seed: u64) -> Self {
        Sim {
            ledger: PROVIDERS.iter().map(|p| (*p, Vec::new())).collect(),
            by_reference: HashMap::new(),
            faults: BTreeMap::new(),
            receipts: BTreeMap::new(),
            stats: BTreeMap::new(),
            wechat_tokens: HashMap::new(),
            wechat_token_calls: HashMap::new(),
            fcm_tokens: HashMap::new(),
            apns_tokens: HashMap::new(),
            aliyun_nonces: HashSet::new(),
            inbox_in_flight: HashSet::new(),
            checked_report_urls: HashSet::new(),
            sms_up_sequence: 0,
            rng: StdRng::seed_from_u64(seed),
            next_id: 1,
            ses_templates: BTreeMap::new(),
            sms_approvals: BTreeMap::new(),
            wechat_templates: crate::WechatTemplates::default(),
        }
    }

    /// Why `provider`'s account refuses `template` signed `sign`, counted
    /// `provider.unapproved` (see [`crate::SmsApprovals::refusal`]); `None`
    /// if it approved both (or approves nothing for `provider`, not an SMS one).
    pub fn unapproved(
        &mut self,
        provider: &str,
        template: &str,
        sign: Option<&str>,
    ) -> Option<crate::Unapproved> {
        let refusal = self
            .sms_approvals
            .get(provider)
            .and_then(|a| a.refusal(template, sign));
        if refusal.is_some() {
            self.count(provider, "unapproved");
        }
        refusal
    }

    /// Counts one `provider.outcome`.
    pub fn count(&mut self, provider: &str, outcome: &str) {
        *self
            .stats
            .entry(format!("{provider}.{outcome}"))
            .or_default() += 1;
    }

    /// Rolls the fault dice for one send to `recipient`, counted by its
    /// outcome ([`Verdict::outcome`]).
    pub fn roll(&mut self, provider: &'static str, recipient: &str) -> Verdict {
        let verdict = self.draw(provider, recipient);
        self.count(provider, verdict.outcome());
        verdict
    }

    /// Rolls the fault dice for one send to `recipient`, uncounted (the
    /// caller counts what the send came to).
    pub fn draw(&mut self, provider: &'static str, recipient: &str) -> Verdict {
        let f = self.faults.get(provider).cloned().unwrap_or_default();
        let verdict = if let Some(code) = f.permanent.get(recipient) {
            Verdict::Permanent(code.clone())
        } else if f.fail_next > 0 {
            if let Some(f) = self.faults.get_mut(provider) {
                f.fail_next -= 1;
            }
            Verdict::ServerError
        } else if f.drop_next > 0 {
            if let Some(f) = self.faults.get_mut(provider) {
                f.drop_next -= 1;
            }
            Verdict::Accept {
                drop: true,
                fail: false,
            }
        } else {
            self.roll_rates(&f)
        };
        match verdict {
            Verdict::ServerError if self.rng.random::<f64>() < f.error_after_accept => {
                Verdict::Accept {
                    drop: false,
                    fail: true,
                }
            }
            v => v,
        }
    }

    fn roll_rates(&mut self, f: &Faults) -> Verdict {
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
                fail: false,
            }
        }
    }

    /// Records a message, unless `dedupe` says its reference was seen.
    pub fn accept(&mut self, provider: &'static str, msg: Incoming, dedupe: Dedupe) -> Outcome {
        if let Some(id) = self.replay(provider, msg.key.as_deref(), dedupe) {
            self.count(provider, "replayed");
            return Outcome {
                id,
                replay: true,
                receipt: None,
            };
        }
        let id = msg.id.unwrap_or_else(|| self.new_id(provider));
        let receipts = self.receipts.get(provider).cloned();
        let delivery = match &receipts {
            Some(r) if r.fail_after_accept.contains(&msg.recipient) => Delivery::Failed,
            _ => Delivery::Delivered,
        };
        let accepted = Accepted {
            id: id.clone(),
            reference: msg.reference,
            recipient: msg.recipient,
            template: msg.template,
            params: msg.params,
            accepted_at_ms: now_ms(),
            replays: 0,
            delivery,
        };
        let list = self.ledger.entry(provider).or_default();
        if let Some(k) = msg.key {
            self.by_reference.insert((provider, k), list.len());
        }
        list.push(accepted.clone());
        Outcome {
            id,
            replay: false,
            receipt: receipts.map(|r| (r, accepted)),
        }
    }

    /// The id of the earlier message a resend replays, if the provider dedupes it.
    fn replay(
        &mut self,
        provider: &'static str,
        key: Option<&str>,
        dedupe: Dedupe,
    ) -> Option<String> {
        let window = match dedupe {
            Dedupe::Never => return None,
            Dedupe::Always => u64::MAX,
            Dedupe::Within(d) => d.as_millis() as u64,
        };
        let i = *self.by_reference.get(&(provider, key?.to_string()))?;
        let entry = self.ledger.get_mut(provider)?.get_mut(i)?;
        if now_ms().saturating_sub(entry.accepted_at_ms) > window {
            return None;
        }
        entry.replays += 1;
        Some(entry.id.clone())
    }

    fn new_id(&mut self, provider: &str) -> String {
        let n = self.next_id;
        self.next_id += 1;
        match provider {
            // BizId: digits and a `^0` suffix, like `900619746936498440^0`.
            "aliyun-sms" => format!("{:018}^0", 900_000_000_000_000_000u64 + n),
            // SerialNo: like `5000:1045710669157053657849499619`.
            "tencent-sms" => format!("2433:{:028}", 1_045_710_669_157_053_657u64 + n),
            // msgid: a number.
            "wechat" => (200_000_000 + n).to_string(),
            // The last segment of `projects/p/messages/0:...`.
            "fcm" => format!("0:{n}%{:016x}", self.rng.random::<u64>()),
            "apns" => uuid(self.rng.random()),
            _ => format!("{provider}-{n}"),
        }
    }

    /// The latest message recorded under `key`.
    pub fn find(&self, provider: &'static str, key: &str) -> Option<&Accepted> {
        let i = *self.by_reference.get(&(provider, key.to_string()))?;
        self.ledger.get(provider)?.get(i)
    }

    /// True if this status query of `provider` must fail (counted as `query_5xx`).
    pub fn query_fails(&mut self, provider: &'static str) -> bool {
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

    /// `Retry-After` seconds for `provider`'s 429/503 answers.
    pub fn retry_after(&self, provider: &str) -> u64 {
        self.faults
            .get(provider)
            .and_then(|f| f.retry_after_secs)
            .unwrap_or(1)
    }

    fn slow(&self, provider: &str) -> Duration {
        Duration::from_millis(self.faults.get(provider).map(|f| f.slow_ms).unwrap_or(0))
    }

    /// `provider`'s `slow_after_accept_ms`, read when a message has been
    /// taken (see [`linger`]).
    pub fn slow_after_accept(&self, provider: &str) -> Duration {
        Duration::from_millis(
            self.faults
                .get(provider)
                .map(|f| f.slow_after_accept_ms)
                .unwrap_or(0),
        )
    }

    /// Expires every WeChat and FCM token; returns how many.
    pub fn expire_tokens(&mut self) -> usize {
        for t in self.wechat_tokens.values_mut() {
            t.expires_ms = 0;
        }
        for exp in self.fcm_tokens.values_mut() {
            *exp = 0;
        }
        self.wechat_tokens.len() + self.fcm_tokens.len()
    }
}

/// A random UUID (version 4 layout) in its canonical lower-case text.
pub fn uuid(bits: u128) -> String {
    let b = (bits & !(0xf << 76) | (0x4 << 76)) & !(0x3 << 62) | (0x2 << 62);
    let h = format!("{b:032x}");
    format!(
        "{}-{}-{}-{}-{}",
        &h[..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..]
    )
}

/// A response whose status and headers go out, then the connection is cut
/// before the body ends: the client cannot tell whether the provider accepted.
pub fn cut_off() -> Response {
    let stream = futures_util::stream::once(async {
        Err::<axum::body::Bytes, std::io::Error>(std::io::Error::other("simulated connection drop"))
    });
    Response::builder()
        .status(StatusCode::OK)
        .header("content-type", "application/json")
        .body(Body::from_stream(stream))
        .expect("a valid literal response")
}

/// Adds `Retry-After: secs` to `response`.
pub fn with_retry_after(mut response: Response, secs: u64) -> Response {
    response
        .headers_mut()
        .insert("retry-after", HeaderValue::from(secs));
    response
}

/// Waits the provider's configured `slow_ms`.
pub async fn pause(state: &SimState, provider: &str) {
    let d = state.lock().slow(provider);
    if !d.is_zero() {
        tokio::time::sleep(d).await;
    }
}

/// `response`, marked to be held `after_accept` (a
/// [`Sim::slow_after_accept`] read under the lock right after the message
/// was recorded) before it goes out: the server's layer [`answer_late`]
/// waits, after the handler returned. The record is made before any wait,
/// so a client that gives up and drops the request (which cancels the
/// wait, not the record) leaves the message taken: a timeout may mean
/// "sent".
pub fn late(mut response: Response, after_accept: Duration) -> Response {
    if !after_accept.is_zero() {
        response.extensions_mut().insert(AnswerLate(after_accept));
    }
    response
}

/// The answer to a message just taken, held `after_accept` (see [`late`]):
/// cut off when `cut`, else `error` (a fault's 5xx) when there is one, else
/// `ok()`.
pub fn taken(
    cut: bool,
    error: Option<Response>,
    ok: impl FnOnce() -> Response,
    after_accept: Duration,
) -> Response {
    let answer = match (cut, error) {
        (true, _) => cut_off(),
        (false, Some(error)) => error,
        (false, None) => ok(),
    };
    late(answer, after_accept)
}

/// How long a response waits before it goes out ([`late`]).
#[derive(Debug, Clone, Copy)]
pub struct AnswerLate(pub Duration);

/// The layer over every provider route: holds a response marked by
/// [`late`] for its delay, then sends it.
pub async fn answer_late(
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let response = next.run(request).await;
    if let Some(AnswerLate(delay)) = response.extensions().get::<AnswerLate>().copied() {
        tokio::time::sleep(delay).await;
    }
    response
}
