//! The event: the one domain type an accepted business event is, from the
//! API and the CLI to the plugin boundary (where `plugin` converts it to the
//! WIT record), and its JSON form, read by the API, the CLI and the corpus and
//! written into event records.

use std::collections::BTreeMap;

use serde::Deserialize;

/// Longest `biz_type`, `biz_id`, `user_id`, `template`, in characters (the
/// API checks requests against it; an opt-out naming a longer user is refused).
pub(crate) const MAX_ID: usize = 128;

/// What is wrong with a text field, if anything: empty, more than `max`
/// characters, or holding control characters (the API's event fields and a
/// policy's template names are held to the same rule).
pub(crate) fn check_text(value: &str, max: usize) -> Result<(), String> {
    if value.is_empty() {
        return Err("must not be empty".into());
    }
    let chars = value.chars().count();
    if chars > max {
        return Err(format!("is {chars} characters long; at most {max}"));
    }
    if value.chars().any(char::is_control) {
        return Err("must not contain control characters".into());
    }
    Ok(())
}

/// Whether `value` is longer than `max` characters: the measure
/// [`check_text`] accepts by, so a look-up refuses only what no accept took.
pub(crate) fn longer_than(value: &str, max: usize) -> bool {
    value.chars().nth(max).is_some()
}

/// A business event, as the host checked it: what key policies see and
/// what payloads are built from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// The business type that routes the event to a policy, e.g. `ORDER_SHIPPED`.
    pub biz_type: String,
    /// The business's own id of the event's subject, e.g. an order id.
    pub biz_id: String,
    /// The user the notification is for.
    pub user_id: String,
    /// When the business event happened, ms since the Unix epoch (UTC).
    pub occurred_at_ms: u64,
    /// Free-form attributes, in the order posted; values as text.
    pub attributes: Vec<(String, String)>,
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

/// The years (inclusive, UTC) an event's `occurred_at` may fall in: a date
/// outside is refused as implausible (a typo, seconds given as milliseconds).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct YearRange {
    /// First year accepted.
    pub from: i32,
    /// Last year accepted.
    pub to: i32,
}

impl YearRange {
    /// Every year since the epoch a time can be written in (RFC 3339 has
    /// four-digit years): no plausibility bound.
    pub(crate) const ANY: YearRange = YearRange {
        from: 1970,
        to: 9999,
    };
}

impl Default for YearRange {
    /// 2000–2100.
    fn default() -> Self {
        YearRange {
            from: 2000,
            to: 2100,
        }
    }
}

/// How far from now an event's `send_at` may be: not more than `grace` in
/// the past (a clock a little behind, a retried request), not more than
/// `horizon` ahead (a permit and a task wait in Redis until then).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SendAtBounds {
    /// How far in the past `send_at` may be (it is then sent at once).
    #[serde(with = "humantime_serde")]
    pub grace: std::time::Duration,
    /// How far ahead `send_at` may be.
    #[serde(with = "humantime_serde")]
    pub horizon: std::time::Duration,
}

impl Default for SendAtBounds {
    /// 5 minutes of grace, 30 days ahead.
    fn default() -> Self {
        SendAtBounds {
            grace: std::time::Duration::from_secs(5 * 60),
            horizon: std::time::Duration::from_secs(30 * 24 * 3600),
        }
    }
}

/// An event's `send_at` (RFC 3339 text) in ms since the epoch, checked
/// against `bounds` around `now_ms`; the error says which bound it broke
/// and by how much.
pub fn send_at_within(text: &str, now_ms: u64, bounds: SendAtBounds) -> Result<u64, String> {
    let at = parse_rfc3339_ms(text)?;
    let grace = u64::try_from(bounds.grace.as_millis()).unwrap_or(u64::MAX);
    let horizon = u64::try_from(bounds.horizon.as_millis()).unwrap_or(u64::MAX);
    let span =
        |ms: u64| humantime::format_duration(std::time::Duration::from_millis(ms / 1000 * 1000));
    if at.saturating_add(grace) < now_ms {
        return Err(format!(
            "`{}` is {} in the past; at most {} (`send_at.grace` in pushonce.toml)",
            text.escape_debug(),
            span(now_ms - at),
            humantime::format_duration(bounds.grace)
        ));
    }
    if at > now_ms.saturating_add(horizon) {
        return Err(format!(
            "`{}` is {} ahead; at most {} (`send_at.horizon` in pushonce.toml)",
            text.escape_debug(),
            span(at - now_ms),
            humantime::format_duration(bounds.horizon)
        ));
    }
    Ok(at)
}

/// Parses an event from its JSON text; `occurred_at` within 2000–2100.
pub fn event_from_json(text: &str) -> Result<Event, EventError> {
    event_from_json_within(text, YearRange::default())
}

/// Parses an event from its JSON text; `occurred_at` within `years`.
pub(crate) fn event_from_json_within(text: &str, years: YearRange) -> Result<Event, EventError> {
    event_from_parsed(serde_json::from_str(text)?, years)
}

/// Converts the parsed JSON form into the plugins' `Event`; `occurred_at`
/// must fall within `years`.
pub(crate) fn event_from_parsed(json: EventJson, years: YearRange) -> Result<Event, EventError> {
    let occurred_at_ms =
        occurred_at_ms(&json.occurred_at, years).map_err(|reason| EventError::Field {
            field: "occurred_at",
            reason,
        })?;
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

/// `occurred_at` (RFC 3339 text or epoch milliseconds) in milliseconds since
/// the epoch, checked against `years`.
fn occurred_at_ms(value: &serde_json::Value, years: YearRange) -> Result<u64, String> {
    let at = match value {
        serde_json::Value::Number(n) => match n.as_u64() {
            Some(ms) => OccurredAt::Millis(ms),
            None => return Err(not_millis(n)),
        },
        serde_json::Value::String(s) => OccurredAt::Text(s),
        other => {
            return Err(format!(
                "expected an RFC 3339 string or epoch milliseconds, got {other}"
            ));
        }
    };
    occurred_at_within(at, years)
}

/// When an event happened, as posted.
#[derive(Debug, Clone, Copy)]
pub enum OccurredAt<'a> {
    /// Milliseconds since the epoch.
    Millis(u64),
    /// An RFC 3339 time.
    Text(&'a str),
}

/// `at` in milliseconds since the epoch, checked against `years`.
pub fn occurred_at_within(at: OccurredAt<'_>, years: YearRange) -> Result<u64, String> {
    let at = match at {
        OccurredAt::Millis(ms) => i128::from(ms)
            .checked_mul(1_000_000)
            .and_then(|ns| time::OffsetDateTime::from_unix_timestamp_nanos(ns).ok())
            .ok_or_else(|| not_millis(ms))?,
        OccurredAt::Text(s) => parse_rfc3339(s)?,
    };
    // `checked_`: an offset can carry 9999-12-31 past the last year `time` holds.
    let Some(utc) = at.checked_to_offset(time::UtcOffset::UTC) else {
        return Err("is after the year 9999 in UTC".to_string());
    };
    let year = utc.year();
    if !(years.from..=years.to).contains(&year) {
        return Err(format!(
            "year {year} is outside the accepted years {}..={} (`occurred_at_years` in pushonce.toml)",
            years.from, years.to
        ));
    }
    unix_ms(at).ok_or_else(|| "is before 1970".to_string())
}

/// The error for a number that is no time.
fn not_millis(n: impl std::fmt::Display) -> String {
    format!("{n} is not a whole number of milliseconds since 1970")
}

/// Parses an RFC 3339 timestamp (`2026-11-30T15:59:59Z`,
/// `2026-11-30T23:59:59.5+08:00`) with the `time` crate.
fn parse_rfc3339(s: &str) -> Result<time::OffsetDateTime, String> {
    time::OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339).map_err(|e| {
        format!(
            "`{}` is not an RFC 3339 time like `2026-11-30T15:59:59Z` ({e})",
            s.escape_debug()
        )
    })
}

fn unix_ms(at: time::OffsetDateTime) -> Option<u64> {
    u64::try_from(at.unix_timestamp_nanos() / 1_000_000).ok()
}

/// Parses an RFC 3339 timestamp into milliseconds since the epoch (any
/// year from 1970).
pub fn parse_rfc3339_ms(s: &str) -> Result<u64, String> {
    unix_ms(parse_rfc3339(s)?).ok_or_else(|| format!("`{}` is before 1970", s.escape_debug()))
}

/// The event as stored in tasks and in the corpus: the JSON form
/// [`event_from_json`] reads back. Serialized straight from borrowed
/// fields (no `serde_json::Value` tree: this runs for every event); fields
/// and attributes come out sorted by name and a repeated attribute keeps its
/// last value, as the `Value` form did.
pub fn event_json(event: &Event) -> String {
    #[derive(serde::Serialize)]
    struct Stored<'a> {
        attributes: BTreeMap<&'a str, &'a str>,
        biz_id: &'a str,
        biz_type: &'a str,
        occurred_at: u64,
        user_id: &'a str,
    }
    serde_json::to_string(&Stored {
        attributes: event
            .attributes
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect(),
        biz_id: &event.biz_id,
        biz_type: &event.biz_type,
        occurred_at: event.occurred_at_ms,
        user_id: &event.user_id,
    })
    .expect("string fields always serialize")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn send_at_is_checked_against_the_grace_and_the_horizon() {
        let bounds = SendAtBounds::default();
        let now = parse_rfc3339_ms("2026-11-30T12:00:00Z").unwrap();
        let at = |t: &str| send_at_within(t, now, bounds);
        assert_eq!(at("2026-11-30T12:00:05Z"), Ok(now + 5000));
        assert_eq!(at("2026-11-30T20:00:05.5+08:00"), Ok(now + 5500));
        // Within the grace: accepted (sent at once), its own time kept.
        assert_eq!(at("2026-11-30T11:55:00Z"), Ok(now - 300_000));
        assert_eq!(
            at("2026-12-30T12:00:00Z"),
            Ok(now + 30 * 86_400_000),
            "the horizon itself is inside"
        );
        let past = at("2026-11-30T11:54:59Z").unwrap_err();
        assert!(past.contains("is 5m 1s in the past; at most 5m"), "{past}");
        assert!(past.contains("send_at.grace"), "{past}");
        let far = at("2026-12-30T12:00:01Z").unwrap_err();
        assert!(far.contains("is 30days 1s ahead; at most 30days"), "{far}");
        assert!(far.contains("send_at.horizon"), "{far}");
        for bad in [
            "tomorrow",
            "2026-11-30",
            "2026-11-30T12:00:00",
            "1796054400000",
        ] {
            let e = at(bad).unwrap_err();
            assert!(e.contains("is not an RFC 3339 time"), "{bad}: {e}");
        }
        let tight = SendAtBounds {
            grace: std::time::Duration::ZERO,
            horizon: std::time::Duration::from_secs(60),
        };
        assert!(send_at_within("2026-11-30T11:59:59.999Z", now, tight).is_err());
        assert_eq!(
            send_at_within("2026-11-30T12:01:00Z", now, tight),
            Ok(now + 60_000)
        );
    }

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
        assert!(parse_rfc3339_ms("2026-11-30T15:59:€Z").is_err());
    }

    fn at(value: serde_json::Value, years: YearRange) -> Result<u64, String> {
        occurred_at_ms(&value, years)
    }

    #[test]
    fn occurred_at_is_bounded_by_the_years() {
        let d = YearRange::default();
        assert_eq!(at("2026-11-30T15:59:59Z".into(), d), Ok(1_796_054_399_000));
        assert_eq!(at(1_796_054_399_000u64.into(), d), Ok(1_796_054_399_000));
        assert!(
            at("1999-12-31T23:59:59Z".into(), d)
                .unwrap_err()
                .contains("year 1999")
        );
        assert!(
            at("2101-01-01T00:00:00Z".into(), d)
                .unwrap_err()
                .contains("2000..=2100")
        );
        assert!(at(0u64.into(), d).unwrap_err().contains("year 1970"));
        assert_eq!(at(0u64.into(), YearRange::ANY), Ok(0));
        assert!(at(u64::MAX.into(), YearRange::ANY).is_err());
        assert!(
            at("2026-11-30T15:59:€Z".into(), d)
                .unwrap_err()
                .contains("RFC 3339")
        );
        assert!(at((-1i64).into(), d).is_err());
        assert!(at(1.5.into(), d).is_err());
        // An offset that carries the last day past year 9999 in UTC: an error, not a panic.
        for years in [d, YearRange::ANY] {
            assert!(
                at("9999-12-31T23:59:59-01:00".into(), years)
                    .unwrap_err()
                    .contains("after the year 9999")
            );
        }
    }

    #[test]
    fn the_json_form_reads_back_as_written() {
        let event = Event {
            biz_type: "ORDER_SHIPPED".into(),
            biz_id: "o-1".into(),
            user_id: "u-42".into(),
            occurred_at_ms: 1_796_054_399_000,
            attributes: vec![("b".into(), "2".into()), ("a".into(), "x\"y".into())],
        };
        let mut sorted = event.clone();
        sorted.attributes.sort();
        assert_eq!(event_from_json(&event_json(&event)).unwrap(), sorted);
    }
}

/// "No panic on any input": the event parser over arbitrary text and
/// arbitrary `occurred_at` values.
#[cfg(test)]
mod properties {
    use super::*;
    use proptest::prelude::*;

    fn event_with(occurred_at: serde_json::Value) -> EventJson {
        serde_json::from_value(serde_json::json!({
            "biz_type": "T", "biz_id": "b", "user_id": "u", "occurred_at": occurred_at
        }))
        .expect("the event's shape")
    }

    /// Accepted inside the years, or refused naming `occurred_at`.
    fn check(value: serde_json::Value) -> Result<(), TestCaseError> {
        match event_from_parsed(event_with(value), YearRange::default()) {
            Ok(e) => prop_assert!((946_684_800_000..4_133_980_800_000).contains(&e.occurred_at_ms)),
            Err(EventError::Field { field, .. }) => prop_assert_eq!(field, "occurred_at"),
            Err(e) => prop_assert!(false, "{e}"),
        }
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        #[test]
        fn any_text_is_an_event_or_an_error(text in any::<String>()) {
            let _ = event_from_json(&text);
        }

        #[test]
        fn any_occurred_at_string_is_accepted_or_refused_by_name(s in any::<String>()) {
            check(s.into())?;
        }

        #[test]
        fn near_rfc3339_strings_are_accepted_or_refused_by_name(
            s in "[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt ][0-9]{2}:[0-9]{2}:.{0,3}[0-9.]{0,12}(Z|z|[+-][0-9]{2}:[0-9]{2}|.{0,2})"
        ) {
            check(s.into())?;
        }

        #[test]
        fn any_number_is_accepted_or_refused_by_name(u in any::<u64>(), i in any::<i64>(), f in any::<f64>()) {
            check(u.into())?;
            check(i.into())?;
            check(serde_json::json!(f))?;
        }
    }
}
