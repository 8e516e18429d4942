//! Channel plugin `app-push`: an FCM HTTP v1 style push API.
//!
//! `POST {endpoint}/v1/projects/{project}/messages:send` with
//! `{"message":{"token","notification":{"title":template},"data":params}}` and
//! an `Idempotency-Key` header (the provider's client message id: a resend
//! with the same key is not a second push). 200 sent (`name`); 404
//! `UNREGISTERED` / 400 `INVALID_ARGUMENT` permanent; 429, 500, 503 retryable;
//! a cut-off answer unknown. No status query. Receipts match by `reference`.

use channel_sdk::http::{self, HttpError};
use channel_sdk::{
    ChannelGuest, DeliveryStatus, Guest, Message, PluginInfo, ProviderCapabilities, Receipt,
    SendError, json_escape, params_json, require,
};
use serde_json::Value;

/// The plugin; its methods are the world's exports.
struct AppPush;

impl Guest for AppPush {
    fn describe() -> PluginInfo {
        PluginInfo {
            name: "app-push".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            description: env!("CARGO_PKG_DESCRIPTION").into(),
        }
    }
}

fn transport(e: HttpError) -> SendError {
    match e {
        HttpError::Denied(_) | HttpError::NotSent(_) => SendError::Retryable(e.to_string()),
        HttpError::MaybeSent(_) => SendError::Unknown(e.to_string()),
    }
}

impl ChannelGuest for AppPush {
    fn capabilities() -> ProviderCapabilities {
        ProviderCapabilities {
            honours_reference: true,
            can_query: false,
        }
    }

    fn send(msg: Message) -> Result<Receipt, SendError> {
        let endpoint = require("endpoint")?;
        let project = require("project")?;
        let body = format!(
            "{{\"message\":{{\"token\":{},\"notification\":{{\"title\":{}}},\"data\":{}}}}}",
            json_escape(&msg.recipient),
            json_escape(&msg.template),
            params_json(&msg.params)
        );
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
                }),
                None => Err(SendError::Unknown("200 without a message name".into())),
            },
            429 | 500 | 502 | 503 | 504 => {
                Err(SendError::Retryable(format!("{} {code}", resp.status)))
            }
            s => Err(SendError::Permanent(format!("{s} {code}"))),
        }
    }

    fn query(_key: String, _id: Option<String>) -> Result<DeliveryStatus, SendError> {
        Err(SendError::Retryable(
            "this provider has no status query".into(),
        ))
    }

    fn parse_callback(
        _headers: Vec<(String, String)>,
        body: Vec<u8>,
    ) -> Result<Vec<(String, DeliveryStatus)>, String> {
        channel_sdk::parse_receipts(&body, "reference")
    }
}

channel_sdk::export_channel!(AppPush);
