//! The small SDK for pushonce channel plugins (`wasm32-wasip2`).
//!
//! - [`bindings`]: the `channel-plugin` world of `wit/plugin.wit`, generated
//!   once here; a plugin implements [`Guest`] and [`ChannelGuest`] and calls
//!   `channel_sdk::export_channel!(MyPlugin);`.
//! - [`http`]: a blocking HTTP/1 client over `wasi:http/outgoing-handler` whose
//!   errors say whether the request may have reached the provider
//!   ([`http::HttpError::NotSent`] vs [`http::HttpError::MaybeSent`]) — the
//!   difference between `retryable` and `unknown`.
//! - [`setting`] / [`require`]: the channel instance's settings (secrets
//!   included) through the host's `config` import.
//! - [`json_escape`], [`url_encode`]: the little text encoding plugins need.

pub mod http;

/// The generated bindings of the `channel-plugin` world.
pub mod bindings {
    wit_bindgen::generate!({
        world: "channel-plugin",
        path: "../../wit",
        pub_export_macro: true,
        export_macro_name: "export_channel",
        default_bindings_module: "channel_sdk::bindings",
        generate_all,
    });
}

pub use bindings::Guest;
pub use bindings::export_channel;
pub use bindings::exports::pushonce::plugin::channel::{
    DeliveryStatus, Guest as ChannelGuest, Message, ProviderCapabilities, Receipt, SendError,
};
pub use bindings::pushonce::plugin::types::PluginInfo;

/// The setting `name` of this channel instance, if configured.
pub fn setting(name: &str) -> Option<String> {
    bindings::pushonce::plugin::config::get(name)
}

/// The setting `name`, or a permanent error naming the missing setting (never its value).
pub fn require(name: &str) -> Result<String, SendError> {
    setting(name)
        .filter(|v| !v.is_empty())
        .ok_or_else(|| SendError::Permanent(format!("channel setting `{name}` is not configured")))
}

/// `s` as a JSON string literal, quotes included.
pub fn json_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Percent-encodes `s` for a URL query component (RFC 3986 unreserved kept).
pub fn url_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Template parameters as a JSON object `{"k":"v",...}` (order kept).
pub fn params_json(params: &[(String, String)]) -> String {
    let body: Vec<String> = params
        .iter()
        .map(|(k, v)| format!("{}:{}", json_escape(k), json_escape(v)))
        .collect();
    format!("{{{}}}", body.join(","))
}

/// A delivery status word of a receipt or a status answer: `delivered`,
/// `failed`, `accepted`/`pending` (not yet known), anything else unknown.
pub fn status_of(s: Option<&str>) -> DeliveryStatus {
    match s {
        Some("delivered") => DeliveryStatus::Delivered,
        Some("failed") => DeliveryStatus::Failed,
        Some("accepted") | Some("pending") => DeliveryStatus::Pending,
        _ => DeliveryStatus::Unknown,
    }
}

/// Parses the receipt callback shape the shipped plugins share,
/// `{"receipts":[{"<by>": "...", "status": "delivered"|"failed"|...}]}`, into
/// (the `by` field of each receipt, its status). `by` is `reference` for
/// providers that echo the idempotency key, `message_id` for those that name
/// their own message id.
pub fn parse_receipts(body: &[u8], by: &str) -> Result<Vec<(String, DeliveryStatus)>, String> {
    let json: serde_json::Value =
        serde_json::from_slice(body).map_err(|e| format!("not JSON: {e}"))?;
    let list = json
        .get("receipts")
        .and_then(serde_json::Value::as_array)
        .ok_or("no `receipts` array")?;
    list.iter()
        .map(|r| {
            let id = r
                .get(by)
                .and_then(serde_json::Value::as_str)
                .ok_or_else(|| format!("a receipt without `{by}`"))?;
            Ok((
                id.to_string(),
                status_of(r.get("status").and_then(serde_json::Value::as_str)),
            ))
        })
        .collect()
}
