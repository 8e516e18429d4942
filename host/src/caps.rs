//! Frequency caps, quiet hours and recipients' time zones as operators write
//! them: cap groups in the host configuration (`[caps.<group>]`), a
//! policy's own caps, `quiet`, `tz`. Parsed and checked here; applied inside
//! the accept script (`permit/accept.lua`, see `docs/caps.md`).

use serde::Deserialize;
use std::time::Duration;

/// Milliseconds in a day.
pub const DAY_MS: i64 = 86_400_000;

/// One frequency cap: at most `max` messages to one user per period.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct CapSpec {
    /// Most messages allowed in one period (at least 1).
    pub max: u32,
    /// A rolling window, e.g. `6h`: at most `max` messages in any span this
    /// long. Exclusive with `per_day`.
    #[serde(default, with = "humantime_serde")]
    pub window: Option<Duration>,
    /// Count per calendar day in the recipient's time zone instead (the
    /// count starts again at their midnight). Exclusive with `window`.
    #[serde(default)]
    pub per_day: bool,
    /// `channel` (the default): one count per user and channel; `user`: one
    /// count per user across every channel the cap applies to.
    #[serde(default)]
    pub scope: CapScope,
}

/// What one count of a cap covers.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum CapScope {
    /// One count per user and channel.
    #[default]
    Channel,
    /// One count per user across channels.
    User,
}

impl CapSpec {
    /// Checks the cap alone; the error names the field (relative to the cap).
    pub fn check(&self) -> Result<(), (String, String)> {
        if self.max == 0 {
            return Err(("max".into(), "must be at least 1".into()));
        }
        match (self.window, self.per_day) {
            (Some(_), true) => Err((
                "window".into(),
                "give either `window` (rolling) or `per_day = true`, not both".into(),
            )),
            (None, false) => Err((
                "window".into(),
                "required: a rolling `window` such as \"24h\", or `per_day = true`".into(),
            )),
            (Some(w), false) if w < Duration::from_secs(1) => {
                Err(("window".into(), "must be at least 1s".into()))
            }
            (Some(w), false) if w > MAX_CAP_WINDOW => {
                Err(("window".into(), "must be at most 366 days".into()))
            }
            _ => Ok(()),
        }
    }
}

/// Longest rolling window a cap may ask for.
pub const MAX_CAP_WINDOW: Duration = Duration::from_secs(366 * 24 * 3600);

/// Quiet hours as written: `{ from = "22:00", to = "08:00" }`, local time of the recipient.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct QuietSpec {
    /// Start of the quiet time, `HH:MM` (24 h clock).
    pub from: String,
    /// End of the quiet time, `HH:MM`; earlier than `from` means it ends the next day.
    pub to: String,
}

/// Quiet hours parsed: milliseconds after local midnight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuietHours {
    /// Start (ms after midnight).
    pub from_ms: i64,
    /// End (ms after midnight).
    pub to_ms: i64,
}

impl QuietSpec {
    /// The window in ms after midnight, or what is wrong (naming `from` or `to`).
    pub fn parse(&self) -> Result<QuietHours, (String, String)> {
        let from_ms = parse_clock(&self.from).map_err(|r| ("from".to_string(), r))?;
        let to_ms = parse_clock(&self.to).map_err(|r| ("to".to_string(), r))?;
        if from_ms == to_ms {
            return Err(("to".into(), "equals `from`: an empty window".into()));
        }
        Ok(QuietHours { from_ms, to_ms })
    }
}

/// `HH:MM` as ms after midnight.
pub(crate) fn parse_clock(text: &str) -> Result<i64, String> {
    let bad = || format!("`{text}` is not a time of day `HH:MM` (00:00 to 23:59)");
    let (h, m) = text.split_once(':').ok_or_else(bad)?;
    if h.len() != 2 || m.len() != 2 {
        return Err(bad());
    }
    let h: i64 = h.parse().map_err(|_| bad())?;
    let m: i64 = m.parse().map_err(|_| bad())?;
    if !(0..24).contains(&h) || !(0..60).contains(&m) {
        return Err(bad());
    }
    Ok((h * 60 + m) * 60_000)
}

/// A time zone as a fixed offset from UTC, in ms: `UTC`, `Z`, `+08:00`,
/// `-05:30`. Named zones (with their daylight-saving rules) are not
/// supported; the error says so.
pub fn parse_offset(text: &str) -> Result<i64, String> {
    if matches!(text, "UTC" | "Z" | "utc") {
        return Ok(0);
    }
    let bad = || {
        format!(
            "`{text}` is not a fixed UTC offset such as `+08:00` or `UTC` \
             (named zones are not supported)"
        )
    };
    let sign = match text.chars().next() {
        Some('+') => 1,
        Some('-') => -1,
        _ => return Err(bad()),
    };
    let (h, m) = text[1..].split_once(':').ok_or_else(bad)?;
    if h.len() != 2 || m.len() != 2 {
        return Err(bad());
    }
    let h: i64 = h.parse().map_err(|_| bad())?;
    let m: i64 = m.parse().map_err(|_| bad())?;
    if h > 14 || m >= 60 {
        return Err(bad());
    }
    Ok(sign * (h * 60 + m) * 60_000)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_parse_and_named_zones_are_refused() {
        assert_eq!(parse_offset("UTC"), Ok(0));
        assert_eq!(parse_offset("+08:00"), Ok(8 * 3_600_000));
        assert_eq!(parse_offset("-05:30"), Ok(-(5 * 60 + 30) * 60_000));
        assert!(
            parse_offset("Europe/Paris")
                .unwrap_err()
                .contains("named zones")
        );
        assert!(parse_offset("+8").is_err());
        assert!(parse_offset("+15:00").is_err());
    }

    #[test]
    fn quiet_hours_parse() {
        let q = QuietSpec {
            from: "22:00".into(),
            to: "08:00".into(),
        };
        assert_eq!(
            q.parse(),
            Ok(QuietHours {
                from_ms: 22 * 3_600_000,
                to_ms: 8 * 3_600_000
            })
        );
        let bad = QuietSpec {
            from: "24:00".into(),
            to: "08:00".into(),
        };
        assert_eq!(bad.parse().unwrap_err().0, "from");
    }

    #[test]
    fn caps_need_exactly_one_period() {
        let cap = |window: Option<Duration>, per_day| CapSpec {
            max: 3,
            window,
            per_day,
            scope: CapScope::Channel,
        };
        assert!(cap(Some(Duration::from_secs(60)), false).check().is_ok());
        assert!(cap(None, true).check().is_ok());
        assert!(cap(None, false).check().is_err());
        assert!(cap(Some(Duration::from_secs(60)), true).check().is_err());
    }
}
