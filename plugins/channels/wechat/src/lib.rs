//! Channel plugin `wechat`: WeChat official-account template messages.
//!
//! An access token is fetched with `app_id` + `app_secret`
//! (`GET /cgi-bin/token`), cached in the instance until 5 minutes before it
//! expires, and refreshed when a send answers 40001 (invalid) or 42001
//! (expired) — then the send is retried once. Send:
//! `POST /cgi-bin/message/template/send?access_token=` with
//! `{"touser","template_id","data":{k:{"value":v}}}`; errcode 0 sent (`msgid`),
//! 43004 (not subscribed) and 40003 (bad openid) permanent, -1 (busy) and
//! 45009 (quota) retryable, a cut-off answer unknown. Like the real API there is
//! no client reference and no status query: an unknown stays unknown (the
//! host's `on_unknown` decides). Receipts match by `message_id` (msgid).
//!
//! Contract 2 (`pushonce:channel@2`), ported as is against the test
//! simulator's invented receipt shape; the real-provider plugin replaces it.

use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use channel_sdk::callback::{self, pushonce_receipts};
use channel_sdk::http::{self, HttpError};
use channel_sdk::{
    CallbackAnswer, CallbackError, CallbackRequest, Channel, Message, ProviderCapabilities,
    Receipt, SendError, require, url_encode,
};
use serde_json::{Map, Value, json};

/// The plugin.
struct Wechat;

/// The cached access token and when it stops being used (ms since the epoch).
static TOKEN: Mutex<Option<(String, u64)>> = Mutex::new(None);

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// A valid cached token, or a new one.
fn token(endpoint: &str, refresh: bool) -> Result<String, SendError> {
    let mut cached = TOKEN.lock().unwrap_or_else(|e| e.into_inner());
    if !refresh
        && let Some((t, until)) = cached.as_ref()
        && *until > now_ms()
    {
        return Ok(t.clone());
    }
    let app_id = require("app_id")?;
    let secret = require("app_secret")?;
    let resp = http::request(
        "GET",
        &format!(
            "{endpoint}/cgi-bin/token?grant_type=client_credential&appid={}&secret={}",
            url_encode(&app_id),
            url_encode(&secret)
        ),
        &[],
        None,
    )
    .map_err(|e| SendError::retryable(format!("token: {e}")))?;
    let json: Value = serde_json::from_slice(&resp.body).unwrap_or(Value::Null);
    match json.get("access_token").and_then(Value::as_str) {
        Some(t) => {
            let ttl = json
                .get("expires_in")
                .and_then(Value::as_u64)
                .unwrap_or(7200);
            let until = now_ms() + ttl.saturating_sub(300).max(1) * 1000;
            *cached = Some((t.to_string(), until));
            Ok(t.to_string())
        }
        None => {
            *cached = None;
            let code = json.get("errcode").and_then(Value::as_i64).unwrap_or(0);
            // Never echo the answer: it could mention the credentials.
            Err(SendError::retryable(format!(
                "token refused (errcode {code})"
            )))
        }
    }
}

fn transport(e: HttpError) -> SendError {
    match e {
        HttpError::Denied(_) | HttpError::NotSent(_) => SendError::retryable(e.to_string()),
        HttpError::MaybeSent(_) => SendError::Unknown(e.to_string()),
    }
}

impl Channel for Wechat {
    fn capabilities() -> ProviderCapabilities {
        ProviderCapabilities {
            callbacks: true,
            ..ProviderCapabilities::NONE
        }
    }

    fn send(msg: Message) -> Result<Receipt, SendError> {
        let endpoint = require("endpoint")?;
        let data: Map<String, Value> = msg
            .params
            .iter()
            .map(|(k, v)| (k.clone(), json!({ "value": v })))
            .collect();
        let body =
            json!({"touser": msg.recipient, "template_id": msg.template, "data": data}).to_string();
        let mut refreshed = false;
        loop {
            let t = token(&endpoint, refreshed)?;
            let resp = http::request(
                "POST",
                &format!(
                    "{endpoint}/cgi-bin/message/template/send?access_token={}",
                    url_encode(&t)
                ),
                &[("content-type", "application/json")],
                Some(body.as_bytes()),
            )
            .map_err(transport)?;
            if resp.status >= 500 {
                return Err(SendError::retry_after(
                    format!("status {}", resp.status),
                    resp.retry_after_ms(),
                ));
            }
            let json: Value = serde_json::from_slice(&resp.body).unwrap_or(Value::Null);
            let code = json.get("errcode").and_then(Value::as_i64).unwrap_or(-1);
            let text = json.get("errmsg").and_then(Value::as_str).unwrap_or("");
            match code {
                0 => {
                    let id = json.get("msgid").map(|v| v.to_string()).unwrap_or_default();
                    return Ok(Receipt {
                        provider_message_id: id,
                        reference: None,
                    });
                }
                40001 | 42001 if !refreshed => {
                    // The token was refused before anything was sent: refresh, retry once.
                    refreshed = true;
                }
                43004 | 40003 => return Err(SendError::Permanent(format!("{code}: {text}"))),
                _ => return Err(SendError::retryable(format!("{code}: {text}"))),
            }
        }
    }

    fn handle_callback(req: CallbackRequest) -> Result<CallbackAnswer, CallbackError> {
        let settled = pushonce_receipts(&req.body, "message_id")?;
        Ok(callback::answer(
            settled,
            callback::json(&json!({"ok": true})),
        ))
    }
}

channel_sdk::export_channel!(Wechat);
