//! Key derivation: runs a key-policy plugin and composes the full idempotency
//! key `push:<policy>@<major>:<channel>:<body>` (e.g.
//! `push:per-event@1:sms:ORDER_SHIPPED:o-1:u-42`). The plugin decides only the
//! body; the host adds the policy name, its major version and the channel, so
//! a key can never collide across policies, majors or channels, and validates
//! the body (1..=200 bytes of `[A-Za-z0-9._:@+=/-]`).
//!
//! Also the dry run ([`dry_run`]: `pushonce keys` and the console's key
//! explorer).

use crate::event::Event;
use crate::plugin::{CallError, KeyPolicyPlugin, PluginRegistry, ResolveError};

/// The longest key body a plugin may return, in bytes.
pub(crate) const MAX_BODY: usize = 200;
/// The longest channel name, in bytes.
pub(crate) const MAX_CHANNEL: usize = 32;

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

/// One channel's outcome in a dry run: the channel and its key or why not.
pub type ChannelKey = (String, Result<DerivedKey, DeriveError>);

/// A dry run of key derivation (`pushonce keys`, the console's key
/// explorer): resolves `policy` (`NAME@REQ`) and derives the key of every
/// channel. Returns the plugin's `name@version` and one result per
/// channel, in order.
pub fn dry_run(
    registry: &PluginRegistry,
    policy: &str,
    event: &Event,
    channels: &[String],
    params: &[(String, String)],
) -> Result<(String, Vec<ChannelKey>), ResolveError> {
    let plugin = registry.resolve_key_policy(policy)?;
    let results = channels
        .iter()
        .map(|c| (c.clone(), derive(&plugin, event, c, params)))
        .collect();
    Ok((plugin.id().to_string(), results))
}

/// `push:<policy>@<major>:<channel>:<body>`.
pub(crate) fn compose(policy: &str, major: u64, channel: &str, body: &str) -> String {
    format!("push:{policy}@{major}:{channel}:{body}")
}

/// A channel name usable in a key: 1..=32 bytes of `[a-z0-9-]`.
pub(crate) fn valid_channel(channel: &str) -> bool {
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

#[cfg(test)]
mod tests {
    use super::*;

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
