//! One-click unsubscribe links (`[unsubscribe]`): the secret that signs
//! them, the URL they point at, and how long they work
//! (`docs/preferences.md`, RFC 8058).

use std::time::Duration;

use serde::Deserialize;

use super::{ConfigError, invalid};

/// Shortest `link_ttl` accepted. The US CAN-SPAM Act asks that an opt-out
/// mechanism work for at least 30 days after a message is sent.
pub(crate) const MIN_LINK_TTL: Duration = Duration::from_secs(30 * 86_400);

/// One-click unsubscribe links (`[unsubscribe]`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct UnsubscribeConfig {
    /// Environment variable holding the secret that signs links (at least
    /// 32 bytes; every instance needs the same one). Unset: no link is
    /// written, and `/v1/unsubscribe/{token}` answers 404.
    pub secret_env: Option<String>,
    /// The host as recipients' mail systems reach it, e.g.
    /// `https://push.example.com`: links are
    /// `<base_url>/v1/unsubscribe/<token>`. Required with `secret_env`.
    pub base_url: Option<String>,
    /// How long a link works after its message was written (default 60
    /// days, at least 30).
    #[serde(with = "humantime_serde")]
    pub link_ttl: Duration,
}

impl Default for UnsubscribeConfig {
    fn default() -> Self {
        UnsubscribeConfig {
            secret_env: None,
            base_url: None,
            link_ttl: Duration::from_secs(60 * 86_400),
        }
    }
}

impl UnsubscribeConfig {
    /// Whether the host writes one-click unsubscribe links (`secret_env` set).
    pub fn writes_links(&self) -> bool {
        self.secret_env.is_some()
    }

    /// A base URL with `secret_env`, an http(s) one, and a long enough `link_ttl`.
    pub(crate) fn check(&self) -> Result<(), ConfigError> {
        if self.link_ttl < MIN_LINK_TTL {
            return Err(invalid(
                "unsubscribe.link_ttl",
                &format!(
                    "{} is shorter than 30 days (an opt-out link must keep working for 30 days after its message)",
                    humantime::format_duration(self.link_ttl)
                ),
            ));
        }
        match (&self.secret_env, &self.base_url) {
            (Some(_), None) => Err(invalid(
                "unsubscribe.base_url",
                "is required with `secret_env`: the URL recipients' mail systems reach this host at, e.g. \"https://push.example.com\"",
            )),
            (_, Some(url)) if !(url.starts_with("https://") || url.starts_with("http://")) => {
                Err(invalid(
                    "unsubscribe.base_url",
                    &format!("`{url}` is not an http:// or https:// URL"),
                ))
            }
            _ => Ok(()),
        }
    }
}
