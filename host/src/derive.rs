//! Key derivation: runs a key-policy plugin and composes the full idempotency
//! key `push:<policy>@<major>:<channel>:<body>` (e.g.
//! `push:per-event@1:sms:ORDER_SHIPPED:o-1:u-42`). The plugin decides only the
//! body; the host adds the policy name, its major version and the channel, so
//! a key can never collide across policies, majors or channels, and validates
//! the body (1..=200 bytes of `[A-Za-z0-9._:@+=/-]`).
//!
//! Also the JSON form of an event (`event_from_json`), shared by the CLI's
//! dry run and the HTTP API.

use serde::Deserialize;

use crate::plugin::{CallError, Event, KeyPolicyPlugin};

/// The longest key body a plugin may return, in bytes.
pub const MAX_BODY: usize = 200;
/// The longest channel name, in bytes.
pub const MAX_CHANNEL: usize = 32;

/// The key one channel gets for one event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DerivedKey {
    /// The channel, e.g. `sms`.
    pub channel: String,
    /// The full idempotency key, `push:<policy>@<major>:<channel>:<body>`.
    pub key: String,
    /// The window the policy asked for, in seconds; `None` keeps the policy file's.
    pub window_secs: Option<u32>,
    /// The plugin that derived it, `name@version`.
    pub plugin: String,
}

/// Why no key was derived.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeriveError {
    /// The plugin call failed (refused the input, trapped, over budget).
    #[error(transparent)]
    Call(#[from] CallError),
    /// The channel name is not usable in a key.
    #[error("channel `{channel}` is not a channel name (1..=32 of [a-z0-9-])")]
    BadChannel {
        /// The channel as given.
        channel: String,
    },
    /// The plugin returned a key body the host does not accept.
    #[error("plugin {plugin} returned a bad key `{body}`: {reason}")]
    BadKey {
        /// `name@version`.
        plugin: String,
        /// The body (cut to 80 bytes, escaped).
        body: String,
        /// What is wrong with it.
        reason: String,
    },
}

/// Runs `plugin` for `event` on `channel` and composes the full key.
pub fn derive(
    plugin: &KeyPolicyPlugin,
    event: &Event,
    channel: &str,
    params: &[(String, String)],
) -> Result<DerivedKey, DeriveError> {
    if !valid_channel(channel) {
        return Err(DeriveError::BadChannel {
            channel: channel.escape_debug().to_string(),
        });
    }
    let decision = plugin.derive_key(event, channel, params)?;
    let meta = plugin.meta();
    validate_body(&decision.key).map_err(|reason| DeriveError::BadKey {
        plugin: meta.id.clone(),
        body: shorten(&decision.key),
        reason,
    })?;
    Ok(DerivedKey {
        channel: channel.to_string(),
        key: compose(&meta.name, meta.version.major, channel, &decision.key),
        window_secs: decision.window_secs,
        plugin: meta.id.clone(),
    })
}

/// `push:<policy>@<major>:<channel>:<body>`.
pub fn compose(policy: &str, major: u64, channel: &str, body: &str) -> String {
    format!("push:{policy}@{major}:{channel}:{body}")
}

/// A channel name usable in a key: 1..=32 bytes of `[a-z0-9-]`.
pub fn valid_channel(channel: &str) -> bool {
    (1..=MAX_CHANNEL).contains(&channel.len())
        && channel
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

/// Checks a plugin's key body: 1..=200 bytes of `[A-Za-z0-9._:@+=/-]`.
pub fn validate_body(body: &str) -> Result<(), String> {
    if body.is_empty() {
        return Err("it is empty".into());
    }
    if body.len() > MAX_BODY {
        return Err(format!(
            "it is {} bytes long (at most {MAX_BODY})",
            body.len()
        ));
    }
    if let Some(c) = body.chars().find(|c| !allowed_in_body(*c)) {
        return Err(format!(
            "it contains {c:?} (allowed: A-Z a-z 0-9 . _ : @ + = / -)"
        ));
    }
    Ok(())
}

fn allowed_in_body(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | ':' | '@' | '+' | '=' | '/' | '-')
}

fn shorten(s: &str) -> String {
    let mut end = s.len().min(80);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    let cut = if end < s.len() { "…" } else { "" };
    format!("{}{cut}", s[..end].escape_debug())
}

/// Why an event's JSON was not accepted.
#[derive(Debug, thiserror::Error)]
pub enum EventError {
    /// Not JSON, or not the event's shape.
    #[error("event JSON: {0}")]
    Json(#[from] serde_json::Error),
    /// A field has a value the host does not accept.
    #[error("event field `{field}`: {reason}")]
    Field {
        /// The field's name.
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },
}

/// The JSON form of an event:
/// `{"biz_type", "biz_id", "user_id", "occurred_at", "attributes": {..}}`,
/// `occurred_at` being an RFC 3339 string or milliseconds since the epoch.
#[derive(Debug, Deserialize)]
pub struct EventJson {
    /// Business type, e.g. `ORDER_SHIPPED`.
    pub biz_type: String,
    /// The business's id of the subject, e.g. an order id.
    pub biz_id: String,
    /// The user the notification is for.
    pub user_id: String,
    /// When it happened: RFC 3339 string or epoch milliseconds.
    pub occurred_at: serde_json::Value,
    /// Free-form attributes; values must be strings, numbers or booleans.
    #[serde(default)]
    pub attributes: serde_json::Map<String, serde_json::Value>,
}

/// Parses an event from its JSON text.
pub fn event_from_json(text: &str) -> Result<Event, EventError> {
    event_from_parsed(serde_json::from_str(text)?)
}

/// Converts the parsed JSON form into the plugins' `Event`.
pub fn event_from_parsed(json: EventJson) -> Result<Event, EventError> {
    let occurred_at_ms = match &json.occurred_at {
        serde_json::Value::Number(n) => n.as_u64().ok_or_else(|| EventError::Field {
            field: "occurred_at",
            reason: format!("{n} is not a whole number of milliseconds since 1970"),
        })?,
        serde_json::Value::String(s) => {
            parse_rfc3339_ms(s).map_err(|reason| EventError::Field {
                field: "occurred_at",
                reason,
            })?
        }
        other => {
            return Err(EventError::Field {
                field: "occurred_at",
                reason: format!("expected an RFC 3339 string or epoch milliseconds, got {other}"),
            });
        }
    };
    let mut attributes = Vec::with_capacity(json.attributes.len());
    for (k, v) in json.attributes {
        let value = match v {
            serde_json::Value::String(s) => s,
            serde_json::Value::Number(n) => n.to_string(),
            serde_json::Value::Bool(b) => b.to_string(),
            other => {
                return Err(EventError::Field {
                    field: "attributes",
                    reason: format!("`{k}` must be a string, number or boolean, got {other}"),
                });
            }
        };
        attributes.push((k, value));
    }
    Ok(Event {
        biz_type: json.biz_type,
        biz_id: json.biz_id,
        user_id: json.user_id,
        occurred_at_ms,
        attributes,
    })
}

/// Parses an RFC 3339 timestamp (`2026-11-30T15:59:59Z`,
/// `2026-11-30T23:59:59.5+08:00`) into milliseconds since the epoch.
pub fn parse_rfc3339_ms(s: &str) -> Result<u64, String> {
    let bad = || format!("`{s}` is not an RFC 3339 time like `2026-11-30T15:59:59Z`");
    let b = s.as_bytes();
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || !matches!(b[10], b'T' | b't' | b' ') {
        return Err(bad());
    }
    if b[13] != b':' || b[16] != b':' {
        return Err(bad());
    }
    let num = |r: std::ops::Range<usize>| -> Result<i64, String> {
        let part = &s[r];
        if part.bytes().all(|c| c.is_ascii_digit()) {
            part.parse().map_err(|_| bad())
        } else {
            Err(bad())
        }
    };
    let (year, month, day) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (hour, minute, second) = (num(11..13)?, num(14..16)?, num(17..19)?);
    let mut i = 19;
    let mut millis = 0i64;
    if b.get(i) == Some(&b'.') {
        let start = i + 1;
        i = start;
        while i < b.len() && b[i].is_ascii_digit() {
            i += 1;
        }
        if i == start {
            return Err(bad());
        }
        let frac = &s[start..i.min(start + 3)];
        millis = frac.parse::<i64>().map_err(|_| bad())? * 10i64.pow(3 - frac.len() as u32);
    }
    let offset_secs = match &s[i..] {
        "Z" | "z" => 0,
        tz if tz.len() == 6 && tz.as_bytes()[3] == b':' => {
            let sign = match tz.as_bytes()[0] {
                b'+' => 1,
                b'-' => -1,
                _ => return Err(bad()),
            };
            sign * (num(i + 1..i + 3)? * 3600 + num(i + 4..i + 6)? * 60)
        }
        _ => return Err(bad()),
    };
    let days_in_month = match month {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        2 if (year % 4 == 0 && year % 100 != 0) || year % 400 == 0 => 29,
        2 => 28,
        _ => return Err(bad()),
    };
    if day < 1 || day > days_in_month || hour > 23 || minute > 59 || second > 60 {
        return Err(bad());
    }
    let secs = days_from_civil(year, month, day) * 86_400 + hour * 3600 + minute * 60 + second
        - offset_secs;
    let ms = secs * 1000 + millis;
    u64::try_from(ms).map_err(|_| format!("`{s}` is before 1970"))
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339() {
        assert_eq!(parse_rfc3339_ms("1970-01-01T00:00:00Z"), Ok(0));
        assert_eq!(
            parse_rfc3339_ms("2026-11-30T15:59:59Z"),
            Ok(1_796_054_399_000)
        );
        assert_eq!(
            parse_rfc3339_ms("2026-11-30T23:59:59.250+08:00"),
            Ok(1_796_054_399_250)
        );
        assert_eq!(
            parse_rfc3339_ms("2000-02-29T00:00:00Z"),
            Ok(951_782_400_000)
        );
        assert!(parse_rfc3339_ms("2001-02-29T00:00:00Z").is_err());
        assert!(parse_rfc3339_ms("2026-11-30 15:59:59").is_err());
        assert!(parse_rfc3339_ms("1969-12-31T23:59:59Z").is_err());
    }

    #[test]
    fn bodies() {
        assert!(validate_body("ORDER_SHIPPED:o-1:u-42").is_ok());
        assert!(validate_body("").is_err());
        assert!(validate_body("a b").unwrap_err().contains("' '"));
        assert!(validate_body(&"x".repeat(201)).is_err());
        assert!(validate_body(&"x".repeat(200)).is_ok());
    }

    #[test]
    fn channels() {
        assert!(valid_channel("app-push"));
        assert!(!valid_channel("SMS"));
        assert!(!valid_channel("a:b"));
        assert!(!valid_channel(""));
    }
}
