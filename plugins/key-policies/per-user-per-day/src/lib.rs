//! Key policy `per-user-per-day`: at most one message per user and channel per
//! calendar day. The key body is `<user_id>:<YYYY-MM-DD>`, the date of the
//! event's `occurred-at-ms` in the fixed offset given by param `tz` (`+08:00`;
//! default `+00:00`). Pure integer date math: no clock is read.

wit_bindgen::generate!({ world: "key-policy-plugin", path: "../../../wit" });

use exports::pushonce::plugin::key_policy::{Guest as KeyPolicy, KeyDecision};
use pushonce::plugin::types::Event;

/// The plugin; its methods are the world's exports.
struct PerUserPerDay;

impl KeyPolicy for PerUserPerDay {
    fn derive_key(
        event: Event,
        _channel: String,
        params: Vec<(String, String)>,
    ) -> Result<KeyDecision, String> {
        let tz = key_util::param(&params, "tz").unwrap_or("+00:00");
        let offset = key_util::parse_offset(tz).ok_or_else(|| {
            format!("param `tz`: `{tz}` is not a fixed UTC offset like `+08:00` (at most ±18:00)")
        })?;
        if event.user_id.is_empty() {
            return Err("event field `user_id` is empty".into());
        }
        let key = format!(
            "{}:{}",
            key_util::part(&event.user_id),
            key_util::local_date(event.occurred_at_ms, offset)
        );
        Ok(KeyDecision {
            key,
            window_secs: None,
        })
    }
}

impl Guest for PerUserPerDay {
    fn describe() -> PluginInfo {
        PluginInfo {
            name: "per-user-per-day".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            description: env!("CARGO_PKG_DESCRIPTION").into(),
        }
    }
}

export!(PerUserPerDay);
