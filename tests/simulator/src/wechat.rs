//! WeChat official account: access tokens and template messages.
//!
//! - `POST /cgi-bin/stable_token` `{grant_type, appid, secret, force_refresh}`:
//!   the same token until it expires (normal mode); `force_refresh` mints a
//!   new one and invalidates the previous.
//! - `GET /cgi-bin/token?grant_type=client_credential&appid&secret`: a new
//!   token each call; the previous one stays valid for
//!   [`crate::Config::wechat_rotation_overlap`] (5 minutes), then errcode 40001.
//! - Each endpoint answers errcode 45009 after
//!   [`crate::Config::wechat_token_daily_cap`] calls a day.
//! - `POST /cgi-bin/message/template/send?access_token=`: errcode 40001
//!   (unknown or rotated-out token), 42001 (expired), 40014 (malformed).
//!   `client_msg_id`: the template-message documentation says "for the same
//!   openid + client_msg_id only one message is sent, valid for 10 minutes,
//!   beyond 10 minutes not guaranteed"; so a resend inside
//!   [`crate::Config::wechat_client_msg_id_window`] is answered with the first
//!   `msgid` and is not a second message; after it, it is a new message.
//!   (What the real API answers to such a resend is undocumented: the
//!   fault `replay_errcode` answers it with any errcode instead.)
//! - The account's templates ([`WechatTemplates`], `/_sim/wechat-templates`):
//!   a `template_id` the account does not have is refused errcode 40037
//!   ("invalid template_id"), a `data` without a non-empty `value` for one
//!   of its template's keywords errcode 47003 ("argument invalid!
//!   data.<keyword>.value is empty"); nothing is sent, nothing recorded
//!   (docs/providers.md, "WeChat"). Keys the template does not use are
//!   accepted (WeChat filters them out of what the user sees); the
//!   ledger records `data` as sent.
//! - Faults of its own: `empty_200_next` answers a taken send HTTP 200 `{}`
//!   (no `errcode`, as a proxy might); `replay_errcode` (above).

use crate::ledger::{Dedupe, Incoming, Verdict, WechatToken, cut_off, late, pause};
use crate::{SimState, now_ms};
use axum::{
    Json, Router,
    body::Bytes,
    extract::{Query, State},
    response::{IntoResponse, Response},
    routing::{get, post},
};
use rand::Rng;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet, HashMap};

const PROVIDER: &str = "wechat";

/// The routes.
pub fn routes() -> Router<SimState> {
    Router::new()
        .route("/cgi-bin/token", get(token))
        .route("/cgi-bin/stable_token", post(stable_token))
        .route("/cgi-bin/message/template/send", post(send))
}

fn errcode(code: i64, msg: &str) -> Response {
    Json(json!({"errcode": code, "errmsg": msg})).into_response()
}

/// A WeChat error answer: errcode, errmsg.
struct Errcode(i64, &'static str);

impl IntoResponse for Errcode {
    fn into_response(self) -> Response {
        errcode(self.0, self.1)
    }
}

/// Checks appid/secret and the daily cap of one token endpoint.
fn admit(state: &SimState, stable: bool, appid: &str, secret: &str) -> Result<(), Errcode> {
    let creds = state.credentials();
    if appid != creds.wechat_appid {
        return Err(Errcode(40013, "invalid appid"));
    }
    if secret != creds.wechat_secret {
        return Err(Errcode(40125, "invalid appsecret"));
    }
    let day = now_ms() / 86_400_000;
    let mut sim = state.lock();
    let calls = sim.wechat_token_calls.entry((stable, day)).or_default();
    if *calls >= state.config.wechat_token_daily_cap {
        sim.count(PROVIDER, "token_capped");
        return Err(Errcode(45009, "reach max api daily quota limit"));
    }
    *calls += 1;
    Ok(())
}

fn mint(state: &SimState, stable: bool) -> (String, u64) {
    let mut sim = state.lock();
    let token = format!("{:032x}", sim.rng.random::<u128>());
    let ttl = state.config.token_ttl;
    let expires_ms = now_ms() + ttl.as_millis() as u64;
    sim.wechat_tokens.insert(
        token.clone(),
        WechatToken {
            stable,
            expires_ms,
            revoked_ms: None,
        },
    );
    sim.count(PROVIDER, "token");
    (token, ttl.as_secs())
}

/// The parameters of both token endpoints (query of `/cgi-bin/token`, JSON
/// body of `stable_token`).
#[derive(Deserialize)]
struct TokenRequest {
    #[serde(default)]
    grant_type: String,
    #[serde(default)]
    appid: String,
    #[serde(default)]
    secret: String,
    /// `stable_token` only.
    #[serde(default)]
    force_refresh: bool,
}

/// `/cgi-bin/token`: rotates; the previous tokens keep a short overlap.
async fn token(State(state): State<SimState>, Query(q): Query<TokenRequest>) -> Response {
    if q.grant_type != "client_credential" {
        return errcode(40002, "invalid grant_type");
    }
    if let Err(r) = admit(&state, false, &q.appid, &q.secret) {
        return r.into_response();
    }
    let overlap_end = now_ms() + state.config.wechat_rotation_overlap.as_millis() as u64;
    for t in state
        .lock()
        .wechat_tokens
        .values_mut()
        .filter(|t| !t.stable)
    {
        t.revoked_ms = Some(t.revoked_ms.unwrap_or(u64::MAX).min(overlap_end));
    }
    let (token, expires_in) = mint(&state, false);
    Json(json!({"access_token": token, "expires_in": expires_in})).into_response()
}

/// `/cgi-bin/stable_token`: the current token while valid (normal mode).
async fn stable_token(State(state): State<SimState>, body: Bytes) -> Response {
    let Ok(req) = serde_json::from_slice::<TokenRequest>(&body) else {
        return errcode(47001, "data format error");
    };
    if req.grant_type != "client_credential" {
        return errcode(40002, "invalid grant_type");
    }
    if let Err(r) = admit(&state, true, &req.appid, &req.secret) {
        return r.into_response();
    }
    let now = now_ms();
    {
        let mut sim = state.lock();
        let current = sim
            .wechat_tokens
            .iter_mut()
            .filter(|(_, t)| t.stable && t.live(now))
            .max_by_key(|(_, t)| t.expires_ms);
        match current {
            Some((_, t)) if req.force_refresh => t.revoked_ms = Some(now),
            Some((token, t)) => {
                let body =
                    json!({"access_token": token, "expires_in": (t.expires_ms - now) / 1000});
                return Json(body).into_response();
            }
            None => {}
        }
    }
    let (token, expires_in) = mint(&state, true);
    Json(json!({"access_token": token, "expires_in": expires_in})).into_response()
}

#[derive(Deserialize)]
struct TemplateSend {
    touser: String,
    template_id: String,
    #[serde(default)]
    client_msg_id: Option<String>,
    #[serde(default)]
    data: Value,
}

/// Checks the access token: `None` if valid, else the errcode answer.
fn check_token(state: &SimState, query: &HashMap<String, String>) -> Option<Response> {
    let mut sim = state.lock();
    let Some(token) = query.get("access_token") else {
        sim.count(PROVIDER, "invalid_token");
        return Some(errcode(41001, "access_token missing"));
    };
    if token.len() != 32 || !token.bytes().all(|b| b.is_ascii_hexdigit()) {
        sim.count(PROVIDER, "invalid_token");
        return Some(errcode(40014, "invalid access_token"));
    }
    let now = now_ms();
    match sim.wechat_tokens.get(token).cloned() {
        Some(t) if t.live(now) => None,
        Some(t) if t.revoked_ms.is_none_or(|r| r > now) => {
            sim.count(PROVIDER, "expired_token");
            Some(errcode(42001, "access_token expired"))
        }
        _ => {
            sim.count(PROVIDER, "invalid_token");
            Some(errcode(
                40001,
                "invalid credential, access_token is invalid or not latest",
            ))
        }
    }
}

async fn send(
    State(state): State<SimState>,
    Query(query): Query<HashMap<String, String>>,
    body: Bytes,
) -> Response {
    if let Some(refused) = check_token(&state, &query) {
        return refused;
    }
    let Ok(req) = serde_json::from_slice::<TemplateSend>(&body) else {
        return errcode(47001, "data format error");
    };
    if req.touser.is_empty() {
        return errcode(40003, "invalid openid");
    }
    // A template the account does not have, or data that does not fill
    // it: refused, nothing sent (docs/providers.md, "WeChat").
    let refusal = {
        let mut sim = state.lock();
        let refusal = sim.wechat_templates.refusal(&req.template_id, &req.data);
        if refusal.is_some() {
            sim.count(PROVIDER, "template_refused");
        }
        refusal
    };
    match refusal {
        Some(TemplateRefusal::NotOnAccount) => return errcode(40037, "invalid template_id"),
        Some(TemplateRefusal::EmptyKeyword(k)) => {
            return errcode(47003, &format!("argument invalid! data.{k}.value is empty"));
        }
        None => {}
    }
    pause(&state, PROVIDER).await;
    let mut sim = state.lock();
    match sim.roll(PROVIDER, &req.touser) {
        Verdict::ServerError => errcode(-1, "system error"),
        Verdict::RateLimited => errcode(45009, "reach max api daily quota limit"),
        Verdict::Permanent(code) => {
            errcode(code.parse().unwrap_or(43004), "refused for this recipient")
        }
        Verdict::DropBeforeAccept => cut_off(),
        Verdict::Accept { drop: cut, fail } => {
            // Deduplicated per openid + client_msg_id, inside the window.
            let key = req
                .client_msg_id
                .as_ref()
                .map(|id| format!("{}\n{id}", req.touser));
            let dedupe = Dedupe::Within(state.config.wechat_client_msg_id_window);
            let outcome = sim.accept(
                PROVIDER,
                Incoming {
                    id: None,
                    reference: req.client_msg_id,
                    key,
                    recipient: req.touser,
                    template: req.template_id,
                    params: req.data,
                },
                dedupe,
            );
            let after_accept = sim.slow_after_accept(PROVIDER);
            let faults = sim.faults.entry(PROVIDER).or_default();
            let empty = faults.empty_200_next > 0;
            faults.empty_200_next = faults.empty_200_next.saturating_sub(1);
            let replay_errcode = faults.replay_errcode.filter(|_| outcome.replay);
            drop(sim);
            if let Some(r) = outcome.receipt {
                state.spawn_receipt(PROVIDER, r);
            }
            let answer = if cut {
                cut_off()
            } else if fail {
                errcode(-1, "system error")
            } else if empty {
                Json(json!({})).into_response()
            } else if let Some(code) = replay_errcode {
                errcode(code, "simulated answer to a client_msg_id replay")
            } else {
                let msgid: u64 = outcome.id.parse().unwrap_or(0);
                Json(json!({"errcode": 0, "errmsg": "ok", "msgid": msgid})).into_response()
            };
            late(answer, after_accept)
        }
    }
}

/// The templates the simulated official account has in its template
/// library, each with the keywords its content uses (`{{thing1.DATA}}` is
/// keyword `thing1`). A send naming another `template_id` is refused
/// errcode 40037; one whose `data` does not give each keyword a non-empty
/// `value` (`{"thing1": {"value": "…"}}`) errcode 47003; nothing is sent.
/// Set at start ([`crate::Config::wechat_templates`]) or through `POST
/// /_sim/wechat-templates` ([`crate::SimState::set_wechat_templates`]).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct WechatTemplates {
    /// Each `template_id` the account has, with the keywords its content
    /// uses (none: any `data` fills it).
    pub templates: BTreeMap<String, BTreeSet<String>>,
}

impl Default for WechatTemplates {
    /// Every name in [`crate::TEST_TEMPLATES`] and [`crate::TEST_BIZ_TYPES`]
    /// (the templates and event types the repository's tests, chaos run,
    /// benchmarks and dev configuration send, to WeChat as to SMS), without
    /// keywords.
    fn default() -> Self {
        WechatTemplates {
            templates: crate::TEST_TEMPLATES
                .iter()
                .chain(crate::TEST_BIZ_TYPES)
                .map(|t| (t.to_string(), BTreeSet::new()))
                .collect(),
        }
    }
}

/// Why the account refuses a template send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TemplateRefusal {
    /// errcode 40037: the account has no such template.
    NotOnAccount,
    /// errcode 47003: `data` gives this keyword of the template no
    /// non-empty `value`.
    EmptyKeyword(String),
}

impl WechatTemplates {
    /// Why the account refuses a send of `template_id` with `data`; `None`
    /// if it has the template and `data` fills each of its keywords.
    pub fn refusal(&self, template_id: &str, data: &Value) -> Option<TemplateRefusal> {
        let Some(keywords) = self.templates.get(template_id) else {
            return Some(TemplateRefusal::NotOnAccount);
        };
        let filled = |k: &str| match data.get(k).and_then(|item| item.get("value")) {
            Some(Value::String(v)) => !v.is_empty(),
            Some(Value::Null) | None => false,
            Some(_) => true,
        };
        keywords
            .iter()
            .find(|k| !filled(k))
            .map(|k| TemplateRefusal::EmptyKeyword(k.clone()))
    }

    /// What makes this list no account's template library, naming the
    /// template and keyword at fault; `None` if nothing does.
    pub fn problem(&self) -> Option<String> {
        for (id, keywords) in &self.templates {
            if id.trim().is_empty() {
                return Some("a `template_id` must not be empty".into());
            }
            for k in keywords {
                if let Some(bare) = k.strip_suffix(".DATA") {
                    return Some(format!(
                        "template `{id}`: keyword `{k}`: name it without `.DATA` \
                         (the content's `{{{{{k}}}}}` is the data key `{bare}`)"
                    ));
                }
                if k.is_empty() || !k.chars().all(|c| c.is_alphanumeric() || c == '_') {
                    return Some(format!(
                        "template `{id}`: keyword `{k}` is not a data key \
                         (letters, digits and `_`, e.g. `thing1`)"
                    ));
                }
            }
        }
        None
    }
}
