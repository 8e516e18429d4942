//! Key policy `per-event`: one message per event and channel. The key body is
//! `<biz_type>:<biz_id>:<user_id>`, each part encoded by `key_util::part`;
//! the host adds `push:per-event@1:<channel>:` in front.

wit_bindgen::generate!({ world: "key-policy-plugin", path: "../../../wit" });

use exports::pushonce::plugin::key_policy::{Guest as KeyPolicy, KeyDecision};
use pushonce::plugin::types::Event;

/// The plugin; its methods are the world's exports.
struct PerEvent;

impl KeyPolicy for PerEvent {
    fn derive_key(
        event: Event,
        _channel: String,
        _params: Vec<(String, String)>,
    ) -> Result<KeyDecision, String> {
        for (field, value) in [
            ("biz_type", &event.biz_type),
            ("biz_id", &event.biz_id),
            ("user_id", &event.user_id),
        ] {
            if value.is_empty() {
                return Err(format!("event field `{field}` is empty"));
            }
        }
        let key = format!(
            "{}:{}:{}",
            key_util::part(&event.biz_type),
            key_util::part(&event.biz_id),
            key_util::part(&event.user_id)
        );
        Ok(KeyDecision {
            key,
            window_secs: None,
        })
    }
}

impl Guest for PerEvent {
    fn describe() -> PluginInfo {
        PluginInfo {
            name: "per-event".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            description: env!("CARGO_PKG_DESCRIPTION").into(),
        }
    }
}

export!(PerEvent);
