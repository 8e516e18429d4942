//! Recipient preferences (`[preferences]`): which categories no preference
//! blocks, how stale a host's view of a user's preferences may be, and
//! which token may change them (`docs/preferences.md`).

use std::time::Duration;

use serde::Deserialize;

use super::{ConfigError, invalid};

/// Shortest `cache_ttl` accepted: shorter reads the database for nearly every event.
pub(crate) const MIN_CACHE_TTL: Duration = Duration::from_millis(100);
/// Longest `cache_ttl` accepted: a change must take effect within seconds.
pub(crate) const MAX_CACHE_TTL: Duration = Duration::from_secs(60);

/// Recipient preferences (`[preferences]`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PreferencesConfig {
    /// Categories no preference blocks (a policy's `category`), e.g.
    /// `["security"]`: an event of such a policy is sent on every channel
    /// it names even to a user who switched the category or the channel off.
    pub mandatory: Vec<String>,
    /// How long an instance may answer events from the preferences it last
    /// read of a user (default `"2s"`, from 100ms to 60s): a change takes
    /// effect at once on the instance that took it and within this bound
    /// on every other.
    #[serde(with = "humantime_serde")]
    pub cache_ttl: Duration,
    /// Whether the API token (`auth.api_token_env`) may change a user's
    /// preferences (`PUT`, `DELETE`); default `false`: only the admin token
    /// may, and the API token may read them.
    pub api_token_writes: bool,
}

impl Default for PreferencesConfig {
    fn default() -> Self {
        PreferencesConfig {
            mandatory: Vec::new(),
            cache_ttl: Duration::from_secs(2),
            api_token_writes: false,
        }
    }
}

/// Whether `name` is a well-formed category name: 1 to 64 of `a-z`, `0-9`,
/// `_` and `-`. The text of the refusal otherwise.
pub fn check_category(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "`{}` is not a category name (1 to 64 of a-z, 0-9, `_`, `-`)",
            name.chars().take(64).collect::<String>()
        ))
    }
}

impl PreferencesConfig {
    /// The bound of the cache and the mandatory categories' names.
    pub(crate) fn check(&self) -> Result<(), ConfigError> {
        if self.cache_ttl < MIN_CACHE_TTL || self.cache_ttl > MAX_CACHE_TTL {
            return Err(invalid(
                "preferences.cache_ttl",
                &format!(
                    "{} is not between 100ms and 60s (how stale another instance's view of a \
                     user's preferences may be)",
                    humantime::format_duration(self.cache_ttl)
                ),
            ));
        }
        for (i, name) in self.mandatory.iter().enumerate() {
            check_category(name)
                .map_err(|reason| invalid(&format!("preferences.mandatory[{i}]"), &reason))?;
            if self.mandatory[..i].contains(name) {
                return Err(invalid(
                    &format!("preferences.mandatory[{i}]"),
                    &format!("`{name}` is listed twice"),
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::HostConfig;
    use std::path::Path;
    use std::time::Duration;

    fn parse(text: &str) -> Result<HostConfig, String> {
        let c = HostConfig::parse(Path::new("pushonce.toml"), text).map_err(|e| e.to_string())?;
        c.check().map_err(|e| e.to_string())?;
        Ok(c)
    }

    #[test]
    fn the_section_reads_and_defaults() {
        let c = parse("").unwrap();
        assert_eq!(c.preferences.cache_ttl, Duration::from_secs(2));
        assert!(c.preferences.mandatory.is_empty() && !c.preferences.api_token_writes);
        let c = parse(
            "[preferences]\nmandatory = [\"security\"]\ncache_ttl = \"500ms\"\napi_token_writes = true\n",
        )
        .unwrap();
        assert_eq!(c.preferences.mandatory, ["security"]);
        assert_eq!(c.preferences.cache_ttl, Duration::from_millis(500));
        assert!(c.preferences.api_token_writes);
    }

    #[test]
    fn silly_values_are_refused_naming_the_field() {
        for (text, field) in [
            (
                "[preferences]\ncache_ttl = \"0s\"\n",
                "preferences.cache_ttl:",
            ),
            (
                "[preferences]\ncache_ttl = \"1h\"\n",
                "preferences.cache_ttl:",
            ),
            (
                "[preferences]\nmandatory = [\"Security Codes\"]\n",
                "preferences.mandatory[0]:",
            ),
            (
                "[preferences]\nmandatory = [\"a\", \"a\"]\n",
                "preferences.mandatory[1]:",
            ),
            ("[preferences]\nmandatroy = []\n", "mandatroy"),
        ] {
            let err = parse(text).unwrap_err();
            assert!(err.contains(field), "{text}: {err}");
        }
    }
}
