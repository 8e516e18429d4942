//! APNs: the `apns-id` derived from a key and the reasons table.
//! Source: Apple, "Handling notification responses from APNs"
//! (<https://developer.apple.com/documentation/usernotifications/handling-notification-responses-from-apns>,
//! table "Values for the APNs JSON reason key") and
//! "Establishing a token-based connection to APNs" (token age ≤ 1 hour, not
//! refreshed more than once every 20 minutes); sideshow/apns2 `response.go`.

use crate::{Class, Refusal};

/// The `apns-id` of a message: a UUID (version nibble 8, RFC 9562 variant)
/// from the key's SHA-256, identical on every attempt. APNs only echoes it.
pub fn apns_id(idempotency_key: &str) -> String {
    let h = crate::key_digest(idempotency_key, 32).into_bytes();
    let mut s = String::from_utf8(h).unwrap_or_default();
    s.replace_range(12..13, "8");
    let variant = u8::from_str_radix(&s[16..17], 16).unwrap_or(0) & 0x3 | 0x8;
    s.replace_range(16..17, &format!("{variant:x}"));
    format!(
        "{}-{}-{}-{}-{}",
        &s[..8],
        &s[8..12],
        &s[12..16],
        &s[16..20],
        &s[20..]
    )
}

/// The notification payload: params `title` / `body` make `aps.alert`, the
/// others (but `aps`) and `template` are custom top-level keys.
pub fn payload(template: &str, params: &[(String, String)]) -> serde_json::Value {
    use serde_json::{Map, Value};
    let mut alert = Map::new();
    let mut root = Map::new();
    for (k, v) in params {
        let value = Value::String(v.clone());
        match k.as_str() {
            "title" | "body" => alert.insert(k.clone(), value),
            "aps" => None,
            _ => root.insert(k.clone(), value),
        };
    }
    root.insert("template".into(), Value::String(template.to_string()));
    root.insert("aps".into(), serde_json::json!({ "alert": alert }));
    Value::Object(root)
}

/// Sorts a non-200 answer by its `reason`, else by the status.
pub fn classify(status: u16, reason: Option<&str>) -> Refusal {
    use Class::{Permanent, Refresh, Retryable, Unknown};
    let r = |class| {
        Refusal::new(
            class,
            reason.map_or_else(|| status.to_string(), str::to_string),
        )
    };
    match reason {
        Some("ExpiredProviderToken") => r(Refresh),
        Some("InvalidProviderToken" | "MissingProviderToken") => r(Permanent)
            .because("the provider token was refused: check `team_id`, `key_id` and `private_key`"),
        Some("BadTopic" | "TopicDisallowed" | "DeviceTokenNotForTopic") => {
            r(Permanent).because("check `topic` (the app's bundle id)")
        }
        Some("TooManyProviderTokenUpdates" | "TooManyRequests") => r(Retryable),
        // 500 / 503: Apple does not say the notification was not taken.
        Some("InternalServerError" | "ServiceUnavailable" | "Shutdown") => r(Unknown),
        Some("BadDeviceToken" | "Unregistered" | "ExpiredToken") => r(Permanent),
        _ => r(crate::class_of_status(status)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payload_shape() {
        let p = |k: &str, v: &str| (k.to_string(), v.to_string());
        let body = payload("t", &[p("title", "Hi"), p("aps", "x"), p("order", "7")]);
        assert_eq!(
            body,
            serde_json::json!({"aps": {"alert": {"title": "Hi"}}, "order": "7", "template": "t"})
        );
    }

    /// The reasons table: (status, reason) → class.
    #[test]
    fn error_table() {
        use Class::*;
        let table = [
            (400, Some("BadDeviceToken"), Permanent),
            (410, Some("Unregistered"), Permanent),
            (403, Some("ExpiredProviderToken"), Refresh),
            (403, Some("InvalidProviderToken"), Permanent),
            (400, Some("DeviceTokenNotForTopic"), Permanent),
            (429, Some("TooManyRequests"), Retryable),
            (429, Some("TooManyProviderTokenUpdates"), Retryable),
            (500, Some("InternalServerError"), Unknown),
            (503, Some("ServiceUnavailable"), Unknown),
            (503, Some("Shutdown"), Unknown),
            (503, None, Unknown),
            (413, Some("PayloadTooLarge"), Permanent),
        ];
        for (status, reason, class) in table {
            assert_eq!(classify(status, reason).class, class, "{status} {reason:?}");
        }
    }

    #[test]
    fn apns_id_is_a_stable_uuid() {
        let id = apns_id("k");
        assert_eq!(id, apns_id("k"));
        assert_ne!(id, apns_id("l"));
        let parts: Vec<_> = id.split('-').map(str::len).collect();
        assert_eq!(parts, [8, 4, 4, 4, 12]);
        assert_eq!(&id[14..15], "8");
        assert!(matches!(&id[19..20], "8" | "9" | "a" | "b"));
    }
}
