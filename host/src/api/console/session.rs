//! The console's session: a cookie that names the operator and carries an
//! HMAC-SHA256 made with a key derived from the admin token (never the
//! token itself), and the session's CSRF token, an HMAC of its nonce.
//!
//! The cookie is `HttpOnly; SameSite=Strict; Path=/console` and lasts
//! [`LIFETIME`], `Secure` too when the request came over HTTPS through a
//! proxy that says so ([`over_https`]); changing the admin token ends every
//! session. Sessions are stateless (any host of a fleet with the same token
//! accepts them); sign-out clears the browser's cookie and ends the session
//! on the host that signed it out ([`Revoked`]: its id is refused until it
//! would have expired).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use axum::http::{HeaderMap, header};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use hmac::{Hmac, Mac};
use sha2::Sha256;
use subtle::ConstantTimeEq;

use crate::api::Token;

/// The cookie's name.
pub(crate) const COOKIE: &str = "pushonce_console";

/// How long a session lasts.
pub(crate) const LIFETIME: Duration = Duration::from_secs(8 * 3600);

/// Purpose of the key derived from the admin token.
const PURPOSE: &str = "pushonce console session v1";

/// A signed-in operator.
#[derive(Debug, Clone)]
pub(crate) struct Session {
    /// The name given at sign-in (recorded with every action).
    pub by: String,
    /// The token each of this session's forms carries.
    pub csrf: String,
    /// The session's id (its nonce), what sign-out revokes.
    pub(crate) id: String,
    /// When it expires (seconds since the epoch).
    pub(crate) expires: u64,
}

/// Sessions signed out on this host, until they would have expired.
#[derive(Debug, Default)]
pub(crate) struct Revoked {
    /// Session id → its expiry (seconds since the epoch).
    ids: Mutex<HashMap<String, u64>>,
}

impl Revoked {
    /// Ends `session`: its cookie is refused from now on.
    pub(crate) fn revoke(&self, session: &Session) {
        let now = epoch_secs(SystemTime::now());
        let mut ids = self.ids.lock().unwrap_or_else(|e| e.into_inner());
        ids.retain(|_, expires| *expires > now);
        ids.insert(session.id.clone(), session.expires);
    }

    /// Whether `session` was signed out.
    pub(crate) fn is_revoked(&self, session: &Session) -> bool {
        let ids = self.ids.lock().unwrap_or_else(|e| e.into_inner());
        ids.contains_key(&session.id)
    }
}

/// Makes and checks sessions with the key of `token`.
pub(crate) struct Signer {
    key: [u8; 32],
}

impl Signer {
    /// A signer for `token`; `None` when the admin surface is open (the
    /// console then refuses to sign anyone in).
    pub(crate) fn new(token: &Token) -> Option<Signer> {
        token.derive_key(PURPOSE).map(|key| Signer { key })
    }

    fn mac(&self, parts: &[&[u8]]) -> [u8; 32] {
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&self.key)
            .expect("HMAC takes a key of any length");
        for part in parts {
            mac.update(part);
            mac.update(b"\n");
        }
        mac.finalize().into_bytes().into()
    }

    /// A new session for `by`: the cookie's value.
    pub(crate) fn issue(&self, by: &str, now: SystemTime) -> String {
        let expires = epoch_secs(now) + LIFETIME.as_secs();
        let nonce: [u8; 16] = rand::random();
        let payload = format!("{}.{expires}.{}", B64.encode(by), B64.encode(nonce));
        let mac = self.mac(&[b"session", payload.as_bytes()]);
        format!("{payload}.{}", B64.encode(mac))
    }

    /// The session of cookie value `value`, if its MAC checks and it has not expired.
    pub(crate) fn verify(&self, value: &str, now: SystemTime) -> Option<Session> {
        let (payload, mac) = value.rsplit_once('.')?;
        let presented = B64.decode(mac).ok()?;
        let expected = self.mac(&[b"session", payload.as_bytes()]);
        if !bool::from(presented.as_slice().ct_eq(&expected)) {
            return None;
        }
        let mut parts = payload.split('.');
        let by = String::from_utf8(B64.decode(parts.next()?).ok()?).ok()?;
        let expires: u64 = parts.next()?.parse().ok()?;
        let nonce = parts.next()?;
        if expires <= epoch_secs(now) {
            return None;
        }
        let csrf = B64.encode(self.mac(&[b"csrf", nonce.as_bytes()]));
        Some(Session {
            by,
            csrf,
            id: nonce.to_string(),
            expires,
        })
    }
}

fn epoch_secs(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// The console cookie's value in `headers`, if any.
pub(crate) fn cookie(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .find_map(|pair| {
            let (name, value) = pair.trim().split_once('=')?;
            (name == COOKIE).then(|| value.to_string())
        })
}

/// Whether the request came over HTTPS, as a TLS-terminating proxy says
/// (`X-Forwarded-Proto: https`, or `proto=https` in `Forwarded`): the host
/// itself serves plain HTTP. Trusting a client's word here is safe: it can
/// only make its own cookie `Secure`.
pub(crate) fn over_https(headers: &HeaderMap) -> bool {
    let said = |name: &str| {
        headers
            .get_all(name)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .map(str::to_ascii_lowercase)
            .collect::<Vec<_>>()
    };
    said("x-forwarded-proto")
        .iter()
        .any(|v| v.split(',').next().is_some_and(|p| p.trim() == "https"))
        || said("forwarded").iter().any(|v| {
            v.split([';', ','])
                .any(|pair| pair.trim().trim_matches('"') == "proto=https")
        })
}

/// `; Secure` when the request came over HTTPS.
fn secure(https: bool) -> &'static str {
    if https { "; Secure" } else { "" }
}

/// The `Set-Cookie` value that stores `value` for the session's lifetime.
pub(crate) fn set_cookie(value: &str, https: bool) -> String {
    format!(
        "{COOKIE}={value}; HttpOnly; SameSite=Strict; Path=/console; Max-Age={}{}",
        LIFETIME.as_secs(),
        secure(https)
    )
}

/// The `Set-Cookie` value that clears the cookie (sign-out).
pub(crate) fn clear_cookie(https: bool) -> String {
    format!(
        "{COOKIE}=; HttpOnly; SameSite=Strict; Path=/console; Max-Age=0{}",
        secure(https)
    )
}

/// Whether CSRF token `presented` is the session's (constant time).
pub(crate) fn csrf_matches(session: &Session, presented: &str) -> bool {
    bool::from(presented.as_bytes().ct_eq(session.csrf.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_verifies_only_with_its_token_and_before_it_expires() {
        let now = SystemTime::now();
        let signer = Signer::new(&Token::new(Some("s3cret"))).unwrap();
        let value = signer.issue("ana", now);
        assert!(!value.contains("s3cret"));
        let session = signer.verify(&value, now).unwrap();
        assert_eq!(session.by, "ana");
        assert!(csrf_matches(&session, &session.csrf.clone()));
        assert!(!csrf_matches(&session, "nope"));
        let other = Signer::new(&Token::new(Some("other"))).unwrap();
        assert!(other.verify(&value, now).is_none());
        assert!(signer.verify(&value, now + LIFETIME).is_none());
        let tampered = value.replacen(&B64.encode("ana"), &B64.encode("bob"), 1);
        assert!(signer.verify(&tampered, now).is_none());
        assert!(Signer::new(&Token::new(None)).is_none());
        let revoked = Revoked::default();
        assert!(!revoked.is_revoked(&session));
        revoked.revoke(&session);
        assert!(revoked.is_revoked(&signer.verify(&value, now).unwrap()));
        assert!(!revoked.is_revoked(&signer.verify(&signer.issue("ana", now), now).unwrap()));
    }

    #[test]
    fn https_as_a_proxy_says_it() {
        let h = |k: &str, v: &str| {
            let mut m = HeaderMap::new();
            m.insert(
                axum::http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
            m
        };
        assert!(over_https(&h("x-forwarded-proto", "https")));
        assert!(over_https(&h("x-forwarded-proto", "HTTPS, http")));
        assert!(over_https(&h(
            "forwarded",
            "for=1.2.3.4;proto=https;host=x"
        )));
        assert!(!over_https(&h("x-forwarded-proto", "http")));
        assert!(!over_https(&HeaderMap::new()));
        assert!(set_cookie("v", true).ends_with("; Secure"));
        assert!(!clear_cookie(false).contains("Secure"));
    }
}
