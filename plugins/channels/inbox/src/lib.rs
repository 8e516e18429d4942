//! Channel plugin `inbox`: the business's own in-site message service.
//!
//! `POST {endpoint}/inbox/v1/messages` with an `Idempotency-Key` header (the
//! task's idempotency key) and `{"user_id","template","params"}`; 201 (new) or
//! 200 (replay of the same key) is sent, 429 and 5xx are retryable, other 4xx
//! permanent, a cut-off answer unknown. Status by key:
//! `GET /inbox/v1/messages?idempotency_key=`. Receipts:
//! `{"receipts":[{"reference","message_id","status"}]}`, matched by reference.

use channel_sdk::http::{self, HttpError};
use channel_sdk::{
    ChannelGuest, DeliveryStatus, Guest, Message, PluginInfo, ProviderCapabilities, Receipt,
    SendError, params_json, require, url_encode,
};
use serde_json::Value;

/// The plugin; its methods are the world's exports.
struct Inbox;

impl Guest for Inbox {
    fn describe() -> PluginInfo {
        PluginInfo {
            name: "inbox".into(),
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

impl ChannelGuest for Inbox {
    fn capabilities() -> ProviderCapabilities {
        ProviderCapabilities {
            honours_reference: true,
            can_query: true,
        }
    }

    fn send(msg: Message) -> Result<Receipt, SendError> {
        let endpoint = require("endpoint")?;
        let body = format!(
            "{{\"user_id\":{},\"template\":{},\"params\":{}}}",
            channel_sdk::json_escape(&msg.recipient),
            channel_sdk::json_escape(&msg.template),
            params_json(&msg.params)
        );
        let resp = http::request(
            "POST",
            &format!("{endpoint}/inbox/v1/messages"),
            &[
                ("content-type", "application/json"),
                ("idempotency-key", &msg.idempotency_key),
            ],
            Some(body.as_bytes()),
        )
        .map_err(transport)?;
        let json: Value = serde_json::from_slice(&resp.body).unwrap_or(Value::Null);
        match resp.status {
            200 | 201 => match json.get("id").and_then(Value::as_str) {
                Some(id) => Ok(Receipt {
                    provider_message_id: id.to_string(),
                }),
                None => Err(SendError::Unknown(format!(
                    "status {} without a message id",
                    resp.status
                ))),
            },
            429 => Err(SendError::Retryable("429 rate limited".into())),
            s if s >= 500 => Err(SendError::Retryable(format!("{s} {}", resp.text()))),
            s => Err(SendError::Permanent(format!("{s} {}", resp.text()))),
        }
    }

    fn query(key: String, _id: Option<String>) -> Result<DeliveryStatus, SendError> {
        let endpoint = require("endpoint")?;
        let resp = http::request(
            "GET",
            &format!(
                "{endpoint}/inbox/v1/messages?idempotency_key={}",
                url_encode(&key)
            ),
            &[],
            None,
        )
        .map_err(|e| SendError::Retryable(e.to_string()))?;
        match resp.status {
            404 => Ok(DeliveryStatus::Unknown),
            200 => {
                let json: Value = serde_json::from_slice(&resp.body).unwrap_or(Value::Null);
                Ok(channel_sdk::status_of(
                    json.get("status").and_then(Value::as_str),
                ))
            }
            s => Err(SendError::Retryable(format!("query answered {s}"))),
        }
    }

    fn parse_callback(
        _headers: Vec<(String, String)>,
        body: Vec<u8>,
    ) -> Result<Vec<(String, DeliveryStatus)>, String> {
        channel_sdk::parse_receipts(&body, "reference")
    }
}

channel_sdk::export_channel!(Inbox);
