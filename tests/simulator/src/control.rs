//! The control API (`/_sim/*`): faults, receipts, ledger, stats, token
//! expiry, the CA, WeChat's URL check, SES's stored templates, the SMS
//! accounts' approved templates and sign names and the WeChat account's
//! templates. Credentials are not served: tests
//! read them from [`crate::SimState::credentials`], the binary writes them
//! to files (`--keys-dir`). Served on the TLS listener and, for
//! clients without TLS, on a plain-HTTP loopback listener ([`crate::run_control`]).

use crate::{
    Faults, PROVIDERS, ReceiptConfig, SMS_PROVIDERS, SimState, SmsApprovals, WechatTemplates,
    provider_name, receipts,
};
use axum::{
    Json, Router,
    extract::State,
    http::StatusCode,
    response::{IntoResponse, Response},
    routing::{get, post},
};
use serde::Deserialize;
use serde_json::json;
use std::collections::BTreeMap;

/// The control routes.
pub fn routes() -> Router<SimState> {
    Router::new()
        .route("/_sim/faults", post(set_faults).get(get_faults))
        .route("/_sim/receipts", post(set_receipts).get(get_receipts))
        .route("/_sim/ledger", get(ledger))
        .route("/_sim/stats", get(stats))
        .route("/_sim/expire-tokens", post(expire_tokens))
        .route("/_sim/wechat/expire-tokens", post(expire_tokens))
        .route("/_sim/ca.pem", get(ca))
        .route("/_sim/wechat/verify-url", post(wechat_verify_url))
        .route("/_sim/aliyun/sms-up", post(aliyun_sms_up))
        .route("/_sim/ses/sns", post(ses_sns).get(ses_sns_state))
        .route("/_sim/ses/notify", post(ses_notify))
        .route("/_sim/ses/templates", post(ses_template))
        .route(
            "/_sim/sms-approvals",
            post(set_sms_approvals).get(get_sms_approvals),
        )
        .route(
            "/_sim/wechat-templates",
            post(set_wechat_templates).get(get_wechat_templates),
        )
}

/// `POST /_sim/wechat-templates`: `{"templates": {"<template_id>":
/// ["thing1", ..], ..}}` replaces the WeChat account's templates
/// ([`SimState::set_wechat_templates`]); a list no account could have (an
/// empty id, a keyword that is no data key) is refused 422, naming it.
async fn set_wechat_templates(
    State(state): State<SimState>,
    Json(req): Json<WechatTemplates>,
) -> Response {
    if let Some(problem) = req.problem() {
        return unprocessable(problem);
    }
    state.set_wechat_templates(req);
    Json(json!({"ok": true})).into_response()
}

/// `GET /_sim/wechat-templates`: the WeChat account's templates.
async fn get_wechat_templates(State(state): State<SimState>) -> Response {
    Json(state.wechat_templates()).into_response()
}

/// `POST /_sim/sms-approvals`: `{"aliyun-sms": {"templates": [..],
/// "sign_names": [..]}, ...}` replaces what each named SMS account has
/// approved ([`SimState::set_sms_approvals`]).
async fn set_sms_approvals(
    State(state): State<SimState>,
    Json(req): Json<BTreeMap<String, SmsApprovals>>,
) -> Response {
    set_each(
        req,
        |p, _| {
            (!SMS_PROVIDERS.contains(&p)).then(|| {
                format!(
                    "`{p}` is not an SMS provider; those that approve templates and sign names: {}",
                    SMS_PROVIDERS.join(", ")
                )
            })
        },
        |p, approvals| {
            state.set_sms_approvals(p, approvals);
        },
    )
}

/// Sets each provider's entry of `req` with `set`, or none of them when
/// `refuse` finds one wrong (its reason answered 422).
fn set_each<T>(
    req: BTreeMap<String, T>,
    refuse: impl Fn(&str, &T) -> Option<String>,
    mut set: impl FnMut(&str, T),
) -> Response {
    if let Some(reason) = req.iter().find_map(|(p, v)| refuse(p, v)) {
        return unprocessable(reason);
    }
    for (provider, value) in req {
        set(&provider, value);
    }
    Json(json!({"ok": true})).into_response()
}

/// `GET /_sim/sms-approvals`: what each SMS account has approved.
async fn get_sms_approvals(State(state): State<SimState>) -> Response {
    Json(state.sms_approvals()).into_response()
}

/// An SES stored template and the variables it uses.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TemplateRequest {
    /// `TemplateName`.
    name: String,
    /// The variables (`name`, or `user.name` for a nested attribute).
    variables: Vec<String>,
}

/// `POST /_sim/ses/templates`: registers a stored template with the
/// variables it uses ([`SimState::ses_template`]).
async fn ses_template(State(state): State<SimState>, Json(req): Json<TemplateRequest>) -> Response {
    if req.name.is_empty() {
        return unprocessable("`name` must not be empty".into());
    }
    let variables: Vec<&str> = req.variables.iter().map(String::as_str).collect();
    state.ses_template(&req.name, &variables);
    Json(json!({ "name": req.name, "variables": req.variables })).into_response()
}

/// `POST /_sim/ses/sns`: subscribes an endpoint to the SES topic (SNS posts
/// its `SubscriptionConfirmation` at once); `{"topic_arn": ...}`.
async fn ses_sns(
    State(state): State<SimState>,
    Json(req): Json<crate::sns::SnsConfig>,
) -> Response {
    if !req.url.starts_with("http://") && !req.url.starts_with("https://") {
        return unprocessable("`url` must be an absolute http(s) URL".into());
    }
    if !matches!(req.signature_version, 1 | 2) {
        return unprocessable("`signature_version` must be 1 or 2".into());
    }
    let topic = state.sns_subscribe(req);
    Json(json!({ "topic_arn": topic })).into_response()
}

/// `GET /_sim/ses/sns`: the topic and every `SubscribeURL` fetched.
async fn ses_sns_state(State(state): State<SimState>) -> Response {
    Json(json!({
        "topic_arn": state.sns.topic(),
        "confirmations": state.sns_confirmations(),
    }))
    .into_response()
}

/// A notification to push once, as SNS would, or spoiled.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NotifyRequest {
    /// Where to post (default: the subscription's endpoint).
    #[serde(default)]
    url: Option<String>,
    /// The `Message`: an SES notification (an object, or its text).
    message: serde_json::Value,
    /// `SignatureVersion`, 1 or 2 (default 1).
    #[serde(default)]
    signature_version: Option<u8>,
    /// `none` (default), `signature` or `body`.
    #[serde(default)]
    tamper: crate::sns::Tamper,
}

/// `POST /_sim/ses/notify`: posts one SNS notification now, once;
/// `{"status": <the endpoint's status>}`.
async fn ses_notify(State(state): State<SimState>, Json(req): Json<NotifyRequest>) -> Response {
    let version = req.signature_version.unwrap_or(1);
    if !matches!(version, 1 | 2) {
        return unprocessable("`signature_version` must be 1 or 2".into());
    }
    match state
        .sns_push(req.url, &req.message, version, req.tamper)
        .await
    {
        Ok(status) => Json(json!({ "status": status })).into_response(),
        Err(e) => (
            StatusCode::BAD_GATEWAY,
            Json(json!({ "error": format!("the notification could not be posted: {e}") })),
        )
            .into_response(),
    }
}

/// A user's reply to an Aliyun SMS, to push as SmsUp.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SmsUpRequest {
    /// Where Aliyun pushes SmsUp (the console's "上行消息" URL).
    url: String,
    /// Who replies.
    phone_number: String,
    /// The reply, e.g. `TD`.
    content: String,
}

/// `POST /_sim/aliyun/sms-up`: pushes the reply as Aliyun's SmsUp does
/// (counted `aliyun-sms.sms_up_posted` once answered).
async fn aliyun_sms_up(State(state): State<SimState>, Json(req): Json<SmsUpRequest>) -> Response {
    if !req.url.starts_with("http://") && !req.url.starts_with("https://") {
        return unprocessable("`url` must be an absolute http(s) URL".into());
    }
    state.push_sms_up(&req.url, &req.phone_number, &req.content);
    Json(json!({"ok": true})).into_response()
}

fn unprocessable(message: String) -> Response {
    (
        StatusCode::UNPROCESSABLE_ENTITY,
        Json(json!({ "error": message })),
    )
        .into_response()
}

async fn set_faults(
    State(state): State<SimState>,
    Json(req): Json<BTreeMap<String, Faults>>,
) -> Response {
    set_each(
        req,
        |p, _| {
            provider_name(p)
                .is_none()
                .then(|| format!("unknown provider `{p}`; known: {}", PROVIDERS.join(", ")))
        },
        |p, faults| {
            state.set_faults(p, faults);
        },
    )
}

async fn get_faults(State(state): State<SimState>) -> Response {
    Json(state.lock().faults.clone()).into_response()
}

async fn ledger(State(state): State<SimState>) -> Response {
    Json(state.ledger()).into_response()
}

async fn stats(State(state): State<SimState>) -> Response {
    Json(state.stats()).into_response()
}

async fn expire_tokens(State(state): State<SimState>) -> Response {
    Json(json!({"expired": state.expire_tokens()})).into_response()
}

async fn set_receipts(
    State(state): State<SimState>,
    Json(req): Json<BTreeMap<String, Option<ReceiptConfig>>>,
) -> Response {
    if let Some(bad) = req.keys().find(|p| receipts::provider(p).is_none()) {
        return unprocessable(format!(
            "provider `{bad}` sends no receipts; those that do: {}",
            receipts::WITH_RECEIPTS.join(", ")
        ));
    }
    if let Some((p, _)) = req.iter().find(|(_, r)| {
        r.as_ref()
            .is_some_and(|r| !r.url.starts_with("http://") && !r.url.starts_with("https://"))
    }) {
        return unprocessable(format!("{p}: `url` must be an absolute http(s) URL"));
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

async fn ca(State(state): State<SimState>) -> Response {
    (
        [("content-type", "application/x-pem-file")],
        state.ca_pem().to_string(),
    )
        .into_response()
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct VerifyUrl {
    /// The server URL to check.
    url: String,
    /// The WeChat token to sign with (default: the simulator's callback token).
    #[serde(default)]
    token: Option<String>,
}

/// Runs WeChat's server-URL check against `url`: `{"echoed": bool}`.
async fn wechat_verify_url(State(state): State<SimState>, Json(req): Json<VerifyUrl>) -> Response {
    match state
        .wechat_verify_url(&req.url, req.token.as_deref())
        .await
    {
        Ok(echoed) => Json(json!({ "echoed": echoed })).into_response(),
        Err(e) => (
            StatusCode::BAD_GATEWAY,
            Json(json!({ "error": format!("the URL check could not reach the server: {}", e.without_url()) })),
        )
            .into_response(),
    }
}
