//! One-click unsubscribe links (RFC 8058): a signed, expiring token naming a
//! user and what to switch off, written into a message's `List-Unsubscribe`
//! header and redeemed by `POST /v1/unsubscribe/{token}` without any login
//! (`docs/preferences.md`).
//!
//! A token is `<user>.<kind>.<name>.<expires>.<mac>`: the user id and the
//! name in base64url, the kind `c` (a category) or `h` (a channel), the
//! expiry in seconds since the epoch, and an HMAC-SHA256 over the rest with
//! the host's unsubscribe secret. Nothing is stored per link: any instance
//! holding the secret checks any link.

use std::time::{Duration, SystemTime};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use hmac::{Hmac, Mac};
use sha2::Sha256;
use subtle::ConstantTimeEq;

/// Shortest secret accepted, bytes: a MAC key must not be guessable.
pub const MIN_SECRET_BYTES: usize = 32;
/// Longest token checked, characters; a longer one is refused unread.
const MAX_TOKEN: usize = 1024;

/// What a link switches off.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// A category of messages (a policy's `category`), on every channel.
    Category(String),
    /// A channel instance, for every category.
    Channel(String),
}

impl Target {
    fn kind(&self) -> &'static str {
        match self {
            Target::Category(_) => "c",
            Target::Channel(_) => "h",
        }
    }

    /// The category's or channel's name.
    pub fn name(&self) -> &str {
        match self {
            Target::Category(n) | Target::Channel(n) => n,
        }
    }
}

/// A link that checked: who opts out of what, and until when it was good.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unsubscribe {
    /// The user who opts out.
    pub user_id: String,
    /// What they switch off.
    pub target: Target,
    /// When the link stops working (seconds since the epoch).
    pub expires_at: u64,
}

/// Why a token is refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum LinkError {
    /// Not a token of this host's shape.
    #[error("the unsubscribe link is malformed: {0}")]
    Malformed(&'static str),
    /// Its MAC does not check with this host's secret: forged or altered.
    #[error(
        "the unsubscribe link's signature does not match: it was not issued by this service, or it was altered"
    )]
    Forged,
    /// It checked, but its time is over.
    #[error("the unsubscribe link expired at {expired_at} (seconds since the epoch)")]
    Expired {
        /// When it expired (seconds since the epoch).
        expired_at: u64,
    },
}

/// `[unsubscribe] secret_env` names a variable that is unset or shorter
/// than [`MIN_SECRET_BYTES`]: `serve` refuses to start, doctor fails its
/// `unsubscribe.secret` check.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error(
    "unsubscribe.secret_env: the variable {variable} is {found}: set it to a random secret of at least {min} bytes (the same on every instance), or remove `secret_env` to write no unsubscribe links"
)]
pub struct SecretError {
    /// The variable `secret_env` names.
    pub variable: String,
    /// What it holds instead (`unset or empty`, `12 bytes long`).
    pub found: String,
    /// The shortest secret accepted.
    pub min: usize,
}

/// Writes and checks unsubscribe links with one secret.
#[derive(Clone)]
pub struct UnsubscribeLinks {
    key: Vec<u8>,
    base_url: String,
    ttl: Duration,
}

impl std::fmt::Debug for UnsubscribeLinks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UnsubscribeLinks")
            .field("base_url", &self.base_url)
            .field("ttl", &self.ttl)
            .finish_non_exhaustive()
    }
}

impl UnsubscribeLinks {
    /// The links `[unsubscribe]` configures, their secret read through
    /// `env` from the variable `secret_env` names: `None` when `secret_env`
    /// is unset (no links written); that variable unset, empty or shorter
    /// than [`MIN_SECRET_BYTES`] is refused.
    pub fn from_config(
        settings: &crate::config::UnsubscribeConfig,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Option<UnsubscribeLinks>, SecretError> {
        let Some(variable) = &settings.secret_env else {
            return Ok(None);
        };
        let secret = env(variable).unwrap_or_default();
        if secret.len() < MIN_SECRET_BYTES {
            return Err(SecretError {
                variable: variable.clone(),
                found: if secret.is_empty() {
                    "unset or empty".into()
                } else {
                    format!("{} bytes long", secret.len())
                },
                min: MIN_SECRET_BYTES,
            });
        }
        let base_url = settings.base_url.as_deref().unwrap_or_default();
        Ok(Some(UnsubscribeLinks::new(
            secret.as_bytes(),
            base_url,
            settings.link_ttl,
        )))
    }

    /// Links signed with `secret` (at least [`MIN_SECRET_BYTES`]), under
    /// `base_url` (the host as the recipients' mail systems reach it, e.g.
    /// `https://push.example.com`), each good for `ttl`.
    pub fn new(secret: &[u8], base_url: &str, ttl: Duration) -> UnsubscribeLinks {
        UnsubscribeLinks {
            key: secret.to_vec(),
            base_url: base_url.trim_end_matches('/').to_string(),
            ttl,
        }
    }

    /// The URL of a link for `user_id` switching `target` off, written at `now`.
    pub fn link(&self, user_id: &str, target: &Target, now: SystemTime) -> String {
        format!(
            "{}/v1/unsubscribe/{}",
            self.base_url,
            self.token(user_id, target, now)
        )
    }

    /// The token of [`UnsubscribeLinks::link`] alone.
    pub fn token(&self, user_id: &str, target: &Target, now: SystemTime) -> String {
        let expires = epoch_secs(now) + self.ttl.as_secs();
        self.sign(user_id, target, expires)
    }

    fn sign(&self, user_id: &str, target: &Target, expires: u64) -> String {
        let payload = format!(
            "{}.{}.{}.{expires}",
            B64.encode(user_id),
            target.kind(),
            B64.encode(target.name())
        );
        format!("{payload}.{}", B64.encode(self.mac(&payload)))
    }

    fn mac(&self, payload: &str) -> [u8; 32] {
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&self.key)
            .expect("HMAC takes a key of any length");
        mac.update(b"pushonce-unsubscribe\n");
        mac.update(payload.as_bytes());
        mac.finalize().into_bytes().into()
    }

    /// What `token` switches off, if it was signed with this secret and has
    /// not expired at `now`. The MAC is checked before anything is read.
    pub fn verify(&self, token: &str, now: SystemTime) -> Result<Unsubscribe, LinkError> {
        if token.len() > MAX_TOKEN {
            return Err(LinkError::Malformed(
                "longer than any link this service writes",
            ));
        }
        let (payload, mac) = token
            .rsplit_once('.')
            .ok_or(LinkError::Malformed("no signature"))?;
        let presented = B64
            .decode(mac)
            .map_err(|_| LinkError::Malformed("the signature is not base64url"))?;
        if !bool::from(presented.as_slice().ct_eq(&self.mac(payload))) {
            return Err(LinkError::Forged);
        }
        let found = parse(payload).ok_or(LinkError::Malformed("its fields do not parse"))?;
        if found.expires_at <= epoch_secs(now) {
            return Err(LinkError::Expired {
                expired_at: found.expires_at,
            });
        }
        Ok(found)
    }
}

/// The fields of a payload whose MAC checked.
fn parse(payload: &str) -> Option<Unsubscribe> {
    let mut parts = payload.split('.');
    let user_id = text(parts.next()?)?;
    let kind = parts.next()?;
    let name = text(parts.next()?)?;
    let expires_at = parts.next()?.parse().ok()?;
    if parts.next().is_some() {
        return None;
    }
    let target = match kind {
        "c" => Target::Category(name),
        "h" => Target::Channel(name),
        _ => return None,
    };
    Some(Unsubscribe {
        user_id,
        target,
        expires_at,
    })
}

fn text(b64: &str) -> Option<String> {
    String::from_utf8(B64.decode(b64).ok()?).ok()
}

fn epoch_secs(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY: Duration = Duration::from_secs(86_400);

    fn links() -> UnsubscribeLinks {
        UnsubscribeLinks::new(&[7; 32], "https://push.example.com/", 30 * DAY)
    }

    #[test]
    fn a_link_checks_until_it_expires() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let target = Target::Category("marketing".into());
        let url = links().link("u-1.é", &target, now);
        let token = url
            .strip_prefix("https://push.example.com/v1/unsubscribe/")
            .expect("the link is under the base URL");
        let found = links()
            .verify(token, now + 29 * DAY)
            .expect("good for 30 days");
        assert_eq!(found.user_id, "u-1.é");
        assert_eq!(found.target, target);
        assert_eq!(
            links().verify(token, now + 30 * DAY),
            Err(LinkError::Expired {
                expired_at: 1_800_000_000 + 30 * 86_400
            })
        );
    }

    #[test]
    fn an_altered_or_foreign_link_is_forged() {
        let now = SystemTime::now();
        let token = links().token("u-1", &Target::Channel("email".into()), now);
        let other = UnsubscribeLinks::new(&[8; 32], "https://push.example.com", 30 * DAY);
        assert_eq!(other.verify(&token, now), Err(LinkError::Forged));
        let (payload, mac) = token.rsplit_once('.').unwrap();
        let as_another_user = payload.replacen(&B64.encode("u-1"), &B64.encode("u-2"), 1);
        assert_eq!(
            links().verify(&format!("{as_another_user}.{mac}"), now),
            Err(LinkError::Forged)
        );
        assert!(matches!(
            links().verify("nonsense", now),
            Err(LinkError::Malformed(_))
        ));
    }
}
