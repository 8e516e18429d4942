//! Channel plugin `webhook`: a customer's HTTPS endpoint, signed per the
//! Standard Webhooks specification 1.0.0
//! (<https://github.com/standard-webhooks/standard-webhooks/blob/main/spec/standard-webhooks.md>).
//!
//! Send: `POST <url>` with body `{"type": <template>, "timestamp": <RFC 3339>,
//! "data": {params}}` — `timestamp` is "when the event occurred (not
//! necessarily the same of when it was delivered)" (section "Payload
//! structure"): the task's accept time, which the host's task id carries
//! (`<shard>-<ms>-<random>`), so the body is the same on every attempt — and
//! the headers of the spec's section "Webhook
//! headers": `webhook-id` (`msg_` + a digest of the idempotency key, the same
//! on every attempt), `webhook-timestamp` (unix seconds of this attempt) and
//! `webhook-signature: v1,<base64 HMAC-SHA256(key, "{id}.{timestamp}.{body}")>`
//! (section "Signature scheme"; the key is the base64 part of the `whsec_`
//! secret). The recipient is an endpoint name mapped by setting
//! `endpoint.<name>`, or an absolute `https://` URL (the host's allowlist
//! decides whether it may be reached).
//!
//! Answers (spec section "Delivery success and failure": success is a 2xx,
//! "a failure in any other scenario", retried over a schedule): 2xx sent
//! (provider id = the webhook-id); 410 Gone permanent, the only status that
//! stops retrying ("no longer interested in receiving webhooks from this
//! source. Sender should disable the webhook endpoint"); 5xx unknown (the
//! receiver may have processed the event before failing: resent under the
//! same `webhook-id` when the operator declared that the receiver dedupes
//! it, see below); 3xx (redirects
//! are not followed), 401, 404, 429 and every other status retryable,
//! honouring `Retry-After`; a cut-off answer unknown. The secret must decode
//! to 24–64 bytes (table "Signing secret"). docs/providers.md, "Standard
//! Webhooks", cites each.
//!
//! Capability `honours_reference`, an operator's opt-in (2.1.0): the spec's
//! section "Webhook metadata" defines the id as "a unique identifier
//! associated with a specific event triggered, and it remains the same no
//! matter how many times a webhook that has failed is retried. The ID is
//! often used as an idempotency key", and "Verifying signatures" advises
//! consumers: "Use the `webhook-id` header as an idempotency key to prevent
//! accidentally processing the same webhook more than once (e.g. save the
//! IDs in redis for 5 minutes)". That is advice to the receiver, the
//! customer's own server, not something the spec makes it do: so the plugin
//! declares the reference only when the setting `dedupe_window` says how
//! long the receiver keeps ids (seconds, or `forever`; the spec's example
//! suggests 240, its 5 minutes less one for transit), and then
//! `reference_window_secs` is that. Without it, a cut-off or 5xx answer is
//! not resent under the id: the channel's `on_unknown` decides (hold by
//! default). No status query, no callbacks.

use channel_sdk::provider::auth::{Class, Refusal, time, webhooks};
use channel_sdk::provider::refused_by;
use channel_sdk::serde_json::json;
use channel_sdk::{
    Channel, Message, ProviderCapabilities, Receipt, SendError, http, now_ms, params_json, require,
    setting,
};

/// The plugin.
struct Webhook;

impl Channel for Webhook {
    fn capabilities() -> ProviderCapabilities {
        match dedupe_window() {
            Ok(Some(window)) => ProviderCapabilities {
                honours_reference: true,
                reference_window_secs: window,
                ..ProviderCapabilities::NONE
            },
            // Not declared, or not readable: the receiver is not known to dedupe.
            Ok(None) | Err(_) => ProviderCapabilities::NONE,
        }
    }

    fn send(msg: Message) -> Result<Receipt, SendError> {
        dedupe_window().map_err(SendError::Permanent)?;
        let url = endpoint(&msg.recipient)?;
        let secret = require("secret")?;
        let id = webhooks::message_id(&msg.idempotency_key);
        let now = now_ms();
        let occurred = accepted_ms(&msg.task_id).unwrap_or(now);
        let body = json!({
            "type": msg.template,
            "timestamp": time::iso8601(occurred),
            "data": params_json(&msg.params),
        })
        .to_string();
        let timestamp = now / 1000;
        let signature = webhooks::sign(&secret, &id, timestamp, body.as_bytes())
            .map_err(|e| SendError::Permanent(e.to_string()))?;
        let headers = [
            ("content-type", "application/json"),
            ("webhook-id", id.as_str()),
            ("webhook-timestamp", &timestamp.to_string()),
            ("webhook-signature", signature.as_str()),
        ];
        let resp = http::request("POST", &url, &headers, Some(body.as_bytes()))?;
        if (200..300).contains(&resp.status) {
            return Ok(Receipt {
                provider_message_id: id.clone(),
                reference: Some(id),
            });
        }
        Err(refused_by(
            "the webhook endpoint",
            &refusal(resp.status),
            &resp,
        ))
    }
}

/// A non-2xx answer per the spec: 410 stops, 5xx is ambiguous, every other
/// status is a failure to retry over the schedule.
fn refusal(status: u16) -> Refusal {
    let class = match status {
        410 => Class::Permanent,
        s if s >= 500 => Class::Unknown,
        _ => Class::Retryable,
    };
    Refusal::new(class, format!("status {status}"))
}

/// When the task was accepted (ms since the epoch), from the host's task id
/// `<shard>-<ms>-<random>`; `None` for an id of another form.
fn accepted_ms(task_id: &str) -> Option<u64> {
    let mut parts = task_id.splitn(3, '-');
    let (_shard, ms) = (parts.next()?, parts.next()?);
    parts.next()?;
    ms.parse().ok().filter(|&ms| ms > 0)
}

/// How long the receiver dedupes on `webhook-id`, as the operator declares
/// it (setting `dedupe_window`: seconds, or `forever` for `Some(None)`);
/// `None` when not declared: the receiver is not known to dedupe. A value
/// that is neither is an error naming the setting: the channel declares no
/// reference and refuses each send, so the mistake shows at the first one.
fn dedupe_window() -> Result<Option<Option<u32>>, String> {
    match setting("dedupe_window").as_deref().map(str::trim) {
        None | Some("") => Ok(None),
        Some("forever") => Ok(Some(None)),
        Some(secs) => secs.parse().map(|s| Some(Some(s))).map_err(|_| {
            format!(
                "channel setting `dedupe_window` is `{secs}`: \
                 a number of seconds or `forever` was expected"
            )
        }),
    }
}

/// The URL of `recipient`: setting `endpoint.<recipient>`, or the recipient
/// itself when it is an `https://` URL.
fn endpoint(recipient: &str) -> Result<String, SendError> {
    if let Some(url) = setting(&format!("endpoint.{recipient}")).filter(|u| !u.is_empty()) {
        return Ok(url);
    }
    if recipient.starts_with("https://") {
        return Ok(recipient.to_string());
    }
    let shown: String = recipient.chars().take(64).collect();
    let shown = shown.split(['?', '#']).next().unwrap_or_default();
    Err(SendError::Permanent(format!(
        "recipient `{shown}` is neither a configured endpoint name (setting `endpoint.<name>`) nor an https:// URL"
    )))
}

channel_sdk::export_channel!(Webhook);
