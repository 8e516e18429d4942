//! Channel plugin `app-push`: an FCM HTTP v1 style push API.
//!
//! `POST {endpoint}/v1/projects/{project}/messages:send` with
//! `{"message":{"token","notification":{"title":template},"data":params}}` and
//! an `Idempotency-Key` header (the provider's client message id: a resend
//! with the same key is not a second push). 200 sent (`name`); 404
//! `UNREGISTERED` / 400 `INVALID_ARGUMENT` permanent; 429, 500, 503 retryable;
//! a cut-off answer unknown. No status query. Receipts match by `reference`.
//!
//! Contract 2 (`pushonce:channel@2`), ported as is against the test
//! simulator's invented provider, which dedupes on `Idempotency-Key` for good.

use channel_sdk::callback::{self, pushonce_receipts};
use channel_sdk::http::{self, HttpError};
use channel_sdk::{
    CallbackAnswer, CallbackError, CallbackRequest, Channel, Message, ProviderCapabilities,
    Receipt, SendError, params_json, require,
};
use serde_json::{Value, json};

/// The plugin.
struct AppPush;

fn transport(e: HttpError) -> SendError {
    match e {
        HttpError::Denied(_) | HttpError::NotSent(_) => SendError::retryable(e.to_string()),
        HttpError::MaybeSent(_) => SendError::Unknown(e.to_string()),
    }
}

impl Channel for AppPush {
    fn capabilities() -> ProviderCapabilities {
        ProviderCapabilities {
            honours_reference: true,
            callbacks: true,
            ..ProviderCapabilities::NONE
        }
    }

    fn send(msg: Message) -> Result<Receipt, SendError> {
        let endpoint = require("endpoint")?;
        let project = require("project")?;
        let body = json!({"message": {
            "token": msg.recipient,
            "notification": {"title": msg.template},
            "data": params_json(&msg.params),
        }})
        .to_string();
        let resp = http::request(
            "POST",
            &format!("{endpoint}/v1/projects/{project}/messages:send"),
            &[
                ("content-type", "application/json"),
                ("idempotency-key", &msg.idempotency_key),
            ],
            Some(body.as_bytes()),
        )
        .map_err(transport)?;
        let json: Value = serde_json::from_slice(&resp.body).unwrap_or(Value::Null);
        let code = json
            .pointer("/error/details/0/errorCode")
            .or_else(|| json.pointer("/error/status"))
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        match resp.status {
            200 => match json.get("name").and_then(Value::as_str) {
                Some(name) => Ok(Receipt {
                    provider_message_id: name.rsplit('/').next().unwrap_or(name).to_string(),
                    reference: Some(msg.idempotency_key.clone()),
                }),
                None => Err(SendError::Unknown("200 without a message name".into())),
            },
            429 | 500 | 502 | 503 | 504 => Err(SendError::retry_after(
                format!("{} {code}", resp.status),
                resp.retry_after_ms(),
            )),
            s => Err(SendError::Permanent(format!("{s} {code}"))),
        }
    }

    fn handle_callback(req: CallbackRequest) -> Result<CallbackAnswer, CallbackError> {
        let settled = pushonce_receipts(&req.body, "reference")?;
        Ok(callback::answer(
            settled,
            callback::json(&json!({"ok": true})),
        ))
    }
}

channel_sdk::export_channel!(AppPush);
