//! Channel plugin `inbox`: the business's own in-site message service.
//!
//! `POST {endpoint}/inbox/v1/messages` with an `Idempotency-Key` header (the
//! task's idempotency key) and `{"user_id","template","params"}`; 201 (new) or
//! 200 (replay of the same key) is sent, 429 and 5xx are retryable (honouring
//! `Retry-After`), other 4xx permanent, a cut-off answer unknown. Status by key:
//! `GET /inbox/v1/messages?idempotency_key=`. Receipts:
//! `{"receipts":[{"reference","message_id","status"}]}`, matched by reference.
//!
//! Capabilities: the inbox service is ours, and its contract is this doc:
//! it dedupes on `Idempotency-Key` for good and answers the status by key at
//! once (no lag).

use channel_sdk::callback::{self, pushonce_receipts, status_of};
use channel_sdk::http;
use channel_sdk::serde_json::{Value, json};
use channel_sdk::{
    CallbackAnswer, CallbackError, CallbackRequest, Channel, DeliveryStatus, Message,
    ProviderCapabilities, Receipt, SendError, SentMessage, params_json, require, url_encode,
};

/// The plugin.
struct Inbox;

impl Channel for Inbox {
    fn capabilities() -> ProviderCapabilities {
        ProviderCapabilities {
            honours_reference: true,
            can_query: true,
            callbacks: true,
            ..ProviderCapabilities::NONE
        }
    }

    fn send(msg: Message) -> Result<Receipt, SendError> {
        let endpoint = require("endpoint")?;
        let body = json!({"user_id": msg.recipient, "template": msg.template, "params": params_json(&msg.params)});
        let resp = http::request(
            "POST",
            &format!("{endpoint}/inbox/v1/messages"),
            &[
                ("content-type", "application/json"),
                ("idempotency-key", &msg.idempotency_key),
            ],
            Some(body.to_string().as_bytes()),
        )?;
        match resp.status {
            200 | 201 => match resp.json().get("id").and_then(Value::as_str) {
                Some(id) => Ok(Receipt {
                    provider_message_id: id.to_string(),
                    reference: Some(msg.idempotency_key),
                }),
                None => Err(SendError::Unknown(format!(
                    "status {} without a message id",
                    resp.status
                ))),
            },
            s if s == 429 || s >= 500 => Err(SendError::retry_after(
                format!("status {s}"),
                resp.retry_after_ms(),
            )),
            s => Err(SendError::Permanent(format!("{s} {}", resp.text()))),
        }
    }

    fn query(msg: SentMessage) -> Result<DeliveryStatus, SendError> {
        let endpoint = require("endpoint")?;
        let url = format!(
            "{endpoint}/inbox/v1/messages?idempotency_key={}",
            url_encode(&msg.idempotency_key)
        );
        let resp = http::request("GET", &url, &[], None)
            .map_err(|e| SendError::retryable(e.to_string()))?;
        match resp.status {
            404 => Ok(DeliveryStatus::Unknown),
            200 => Ok(status_of(resp.json().get("status").and_then(Value::as_str))),
            s => Err(SendError::retryable(format!("query answered {s}"))),
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

channel_sdk::export_channel!(Inbox);
