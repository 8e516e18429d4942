//! A policy's `[digest]`: when a digest is sent and what it carries.

use serde::Deserialize;
use std::time::Duration;

use super::check_window;

/// A policy's digest (`[digest]`): when the digest opened by an event is
/// sent, how many events' parameters it carries, and what a new event does
/// once the digest's first attempt has begun.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct DigestSpec {
    /// Send the digest this long after the event that opened it, e.g. `1h`.
    #[serde(default, with = "humantime_serde")]
    pub window: Option<Duration>,
    /// Or send it at this local time of day in the recipient's time zone
    /// (`tz`, `tz_attribute`), `HH:MM`, e.g. `20:00`: the first such time
    /// after the event that opened it.
    #[serde(default)]
    pub at: Option<String>,
    /// How many events' parameters the message carries (the count is
    /// always of all of them); 1 to 100, default 20.
    #[serde(default = "DigestSpec::default_max_items")]
    pub max_items: u32,
    /// The template of the digest message; default: the event's template.
    #[serde(default)]
    pub template: Option<String>,
    /// What an event does once the digest under its key has begun sending:
    /// `next` (the default) opens the next digest, `duplicate` is answered
    /// as a duplicate of the begun one.
    #[serde(default)]
    pub after_begin: AfterBegin,
}

/// What an event does once the digest under its key has begun sending.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum AfterBegin {
    /// It opens the next digest under the key.
    #[default]
    Next,
    /// It is a duplicate of the digest that began.
    Duplicate,
}

impl DigestSpec {
    fn default_max_items() -> u32 {
        20
    }

    /// Exactly one of `window` and `at`, and `max_items` in range.
    pub(super) fn check(&self) -> Result<(), (String, String)> {
        match (&self.window, &self.at) {
            (Some(_), Some(_)) | (None, None) => {
                return Err((
                    "digest".into(),
                    "needs exactly one of `window` (e.g. `\"1h\"`) and `at` (e.g. `\"20:00\"`)"
                        .into(),
                ));
            }
            (Some(w), None) => {
                check_window(w).map_err(|r| ("digest.window".to_string(), r))?;
            }
            (None, Some(at)) => {
                crate::caps::parse_clock(at).map_err(|r| ("digest.at".to_string(), r))?;
            }
        }
        if !(1..=100).contains(&self.max_items) {
            return Err((
                "digest.max_items".into(),
                format!("{} is not between 1 and 100", self.max_items),
            ));
        }
        Ok(())
    }
}
