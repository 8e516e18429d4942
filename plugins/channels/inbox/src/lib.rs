//! Channel plugin `inbox`: the business's own in-site message service.
//!
//! `POST {endpoint}/inbox/v1/messages` with an `Idempotency-Key` header (the
//! task's idempotency key) and `{"user_id","template","params"}`; 201 (new) or
//! 200 (replay of the same key) is sent; 429 retryable (honouring
//! `Retry-After`); 409 retryable: a replay while the first request with the
//! key is still in flight, as the IETF draft "The Idempotency-Key HTTP Header
//! Field" answers it (docs/providers.md, "Inbox") — the first may yet
//! succeed, and a later replay gets its answer; 5xx unknown (the service may
//! have stored the message: resent under the key, which it dedupes); other
//! 4xx permanent; a cut-off answer unknown. Status by key:
//! `GET /inbox/v1/messages?idempotency_key=`. Receipts:
//! `{"receipts":[{"reference","message_id","status"}]}`, matched by reference.
//!
//! Capabilities: the inbox service is ours, and its contract is this doc:
//! it dedupes on `Idempotency-Key` for good and answers the status by key at
//! once (no lag).

use channel_sdk::callback::{self, pushonce_receipts, status_of};
use channel_sdk::{CallbackAnswer, CallbackError, CallbackRequest, Channel, DeliveryStatus};
use channel_sdk::{Message, ProviderCapabilities, Receipt, SendError, SentMessage};
use channel_sdk::{http, params_json, provider::post_json, require, serde_json::json, url_encode};

/// The plugin.
struct Inbox;

impl Channel for Inbox {
    fn capabilities() -> ProviderCapabilities {
        ProviderCapabilities::NONE
            .reference(None)
            .query(0)
            .callbacks()
    }

    fn send(msg: Message) -> Result<Receipt, SendError> {
        let url = format!("{}/inbox/v1/messages", require("endpoint")?);
        let body = json!({"user_id": msg.recipient, "template": msg.template, "params": params_json(&msg.params)});
        let resp = post_json(&url, &[("idempotency-key", &msg.idempotency_key)], &body)?;
        if resp.status == 409 {
            let why =
                "the inbox answered 409: a request with this Idempotency-Key is still in flight";
            return Err(SendError::retry_after(why, resp.retry_after_ms()));
        }
        if !matches!(resp.status, 200 | 201) {
            return Err(resp.refusal("the inbox"));
        }
        resp.receipt("id", Some(msg.idempotency_key))
    }

    fn query(msg: SentMessage) -> Result<DeliveryStatus, SendError> {
        let (endpoint, key) = (require("endpoint")?, url_encode(&msg.idempotency_key));
        let url = format!("{endpoint}/inbox/v1/messages?idempotency_key={key}");
        let resp = http::get(&url).map_err(|e| SendError::retryable(e.to_string()))?;
        match resp.status {
            404 => Ok(DeliveryStatus::Unknown),
            200 => Ok(status_of(resp.json_str("status").as_deref())),
            s => Err(SendError::retryable(format!("query answered {s}"))),
        }
    }

    fn handle_callback(req: CallbackRequest) -> Result<CallbackAnswer, CallbackError> {
        let reply = callback::json(&json!({"ok": true}));
        Ok(callback::answer(
            pushonce_receipts(&req.body, "reference")?,
            reply,
        ))
    }
}

channel_sdk::export_channel!(Inbox);
