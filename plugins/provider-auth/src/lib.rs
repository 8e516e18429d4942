//! Pure-Rust pieces of the real providers' protocols, shared by pushonce's
//! channel plugins: request signatures (Aliyun V3, Tencent Cloud TC3, AWS
//! SigV4, Standard Webhooks, WeChat's callback check, Amazon SNS messages),
//! JWTs (RS256 for FCM's OAuth2 assertion, ES256 for APNs' provider token), references derived from an idempotency key, UTC
//! timestamps, and each provider's error table. No `wit-bindgen` and no I/O,
//! so everything here is unit-tested natively
//! (`cargo test -p provider-auth --target-dir ../target/plugins-native`)
//! and builds unchanged for `wasm32-wasip2`.

pub mod aliyun;
pub mod apns;
pub mod aws;
pub mod fcm;
pub mod jwt;
pub mod tencent;
pub mod time;
pub mod webhooks;
pub mod wechat;

use sha2::{Digest, Sha256};

/// What a provider's refusal means for the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// Not accepted; a later attempt may succeed (rate limited, quota).
    Retryable,
    /// An answer that does not say whether the provider took the message: a
    /// 5xx or a "system busy" code came back after the request was written,
    /// and gateways answer so after their backend accepted (no provider in
    /// docs/providers.md documents a 5xx as "not sent"). Decided as for a
    /// cut-off answer: by the channel's reference, status query or `on_unknown`.
    Unknown,
    /// Not accepted and never will be (bad recipient, unsubscribed, arrears,
    /// bad credentials).
    Permanent,
    /// The access token was refused: fetch a new one and send again once.
    Refresh,
}

/// A refusal sorted by the provider's error table: its class, the provider's
/// own code, and for operators a cause to fix when the code names one
/// (credentials, allowlists, clock).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// What the host may do next.
    pub class: Class,
    /// The provider's code, e.g. `isv.AMOUNT_NOT_ENOUGH` or `43004`.
    pub code: String,
    /// What an operator must fix, when the code says.
    pub cause: Option<&'static str>,
}

impl Refusal {
    /// A refusal of `class` with the provider's `code` and no operator cause.
    pub fn new(class: Class, code: impl Into<String>) -> Refusal {
        Refusal {
            class,
            code: code.into(),
            cause: None,
        }
    }

    /// A refusal known only by its HTTP status (see [`class_of_status`]).
    pub fn of_status(status: u16) -> Refusal {
        Refusal::new(class_of_status(status), format!("status {status}"))
    }

    /// The same refusal with an operator-facing cause.
    pub fn because(mut self, cause: &'static str) -> Refusal {
        self.cause = Some(cause);
        self
    }
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.cause {
            Some(cause) => write!(f, "{} ({cause})", self.code),
            None => f.write_str(&self.code),
        }
    }
}

/// The class of a bare HTTP status: 429 retryable (a refusal before the
/// message was taken), 5xx unknown (see [`Class::Unknown`]), other statuses
/// permanent (the caller has already taken 2xx as success).
pub fn class_of_status(status: u16) -> Class {
    match status {
        429 => Class::Retryable,
        s if s >= 500 => Class::Unknown,
        _ => Class::Permanent,
    }
}

/// Why a signature or token could not be made.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    /// A secret is not in the expected form (the secret itself is never shown).
    #[error("{what} is not valid: {why}")]
    BadSecret {
        /// Which secret, e.g. "the webhook secret".
        what: &'static str,
        /// What is wrong with it.
        why: &'static str,
    },
    /// A PEM private key could not be read (its content is never shown).
    #[error("{what} is not a PKCS#8 PEM private key of the expected kind")]
    BadKey {
        /// Which key, e.g. "the service account's private_key".
        what: &'static str,
        /// The parser's error.
        #[source]
        source: pkcs8_error::Error,
    },
    /// The RSA signing operation failed.
    #[error("RS256 signing failed")]
    Rsa(#[source] rsa::Error),
}

/// The PKCS#8 error type the key parsers share.
pub mod pkcs8_error {
    pub use rsa::pkcs8::Error;
}

/// Lower-case hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(DIGITS[usize::from(b >> 4)] as char);
        out.push(DIGITS[usize::from(b & 15)] as char);
    }
    out
}

/// Hex SHA-256 of `data`.
pub fn sha256_hex(data: &[u8]) -> String {
    hex(&Sha256::digest(data))
}

/// A reference derived from an idempotency key: the first `len` hex digits
/// (at most 64) of its SHA-256. Identical on every attempt of one task.
pub fn key_digest(key: &str, len: usize) -> String {
    let mut h = sha256_hex(key.as_bytes());
    h.truncate(len.min(64));
    h
}

/// HMAC-SHA256 of `data` under `key`.
pub fn hmac_sha256(key: &[u8], data: &[u8]) -> Vec<u8> {
    use hmac::{KeyInit, Mac};
    let mut mac = <hmac::Hmac<Sha256> as KeyInit>::new_from_slice(key)
        .expect("HMAC takes keys of any length");
    mac.update(data);
    mac.finalize().into_bytes().to_vec()
}

/// Compares two byte strings in time independent of where they differ, with
/// `subtle` (whose comparison the optimiser cannot turn into an early exit);
/// only a difference in length, which is public, shows.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    use subtle::ConstantTimeEq;
    a.ct_eq(b).into()
}

/// RFC 3986 percent-encoding (unreserved characters kept, `%XX` upper case),
/// as Aliyun's V3 canonical query and every query string here need.
pub fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push('%');
            out.push_str(&hex(&[b]).to_ascii_uppercase());
        }
    }
    out
}

/// The canonical query string of the SigV4 family (AWS SigV4, and Aliyun
/// V3, which follows it): RFC 3986-encoded `k=v`, sorted by name then
/// value, `&`-joined (the same string serves as a request's own query).
pub fn canonical_query(params: &[(String, String)]) -> String {
    let mut pairs: Vec<(String, String)> = params
        .iter()
        .map(|(k, v)| (percent_encode(k), percent_encode(v)))
        .collect();
    pairs.sort();
    pairs
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join("&")
}

/// The canonical headers and the signed-header list of the SigV4 family:
/// `headers` (names lower case, values as signed) sorted, each
/// `name:value\n`; their names `;`-joined.
pub fn canonical_headers(mut headers: Vec<(String, String)>) -> (String, String) {
    headers.sort();
    let canonical = headers.iter().map(|(k, v)| format!("{k}:{v}\n")).collect();
    let signed = headers
        .iter()
        .map(|(k, _)| k.as_str())
        .collect::<Vec<_>>()
        .join(";");
    (canonical, signed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_digest_is_stable_and_bounded() {
        assert_eq!(key_digest("k", 8), key_digest("k", 8));
        assert_ne!(key_digest("k", 32), key_digest("l", 32));
        assert_eq!(key_digest("k", 100).len(), 64);
        assert_eq!(
            sha256_hex(b""),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }

    #[test]
    fn percent_encoding_is_rfc3986() {
        assert_eq!(percent_encode("a b~c*/é"), "a%20b~c%2A%2F%C3%A9");
    }

    #[test]
    fn status_classes() {
        assert_eq!(class_of_status(429), Class::Retryable);
        assert_eq!(class_of_status(503), Class::Unknown);
        assert_eq!(class_of_status(500), Class::Unknown);
        assert_eq!(class_of_status(410), Class::Permanent);
        assert_eq!(class_of_status(400), Class::Permanent);
    }
}
