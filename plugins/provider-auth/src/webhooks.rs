//! Standard Webhooks signatures (<https://github.com/standard-webhooks/standard-webhooks/blob/main/spec/standard-webhooks.md>,
//! sections "Signature scheme" and "Symmetric signatures"): `webhook-signature:
//! v1,<base64 HMAC-SHA256(key, "{id}.{timestamp}.{body}")>`, the key being the
//! base64 part of a `whsec_` secret.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;

use crate::{AuthError, hmac_sha256};

/// The `webhook-id` of a message: `msg_` and 32 hex digits of the key's
/// SHA-256, identical on every attempt (the spec's idempotency key).
pub fn message_id(idempotency_key: &str) -> String {
    format!("msg_{}", crate::key_digest(idempotency_key, 32))
}

/// The `webhook-signature` value (`v1,<base64>`) of `body` sent as `id` at
/// unix `timestamp`, under the `whsec_...` secret.
pub fn sign(secret: &str, id: &str, timestamp: u64, body: &[u8]) -> Result<String, AuthError> {
    let key = secret_key(secret)?;
    let mut signed = format!("{id}.{timestamp}.").into_bytes();
    signed.extend_from_slice(body);
    Ok(format!(
        "v1,{}",
        STANDARD.encode(hmac_sha256(&key, &signed))
    ))
}

/// The key bytes of a `whsec_<base64>` secret.
fn secret_key(secret: &str) -> Result<Vec<u8>, AuthError> {
    let bad = |why| AuthError::BadSecret {
        what: "the webhook secret",
        why,
    };
    let b64 = secret
        .strip_prefix("whsec_")
        .ok_or_else(|| bad("it does not start with `whsec_`"))?;
    let key = STANDARD
        .decode(b64)
        .map_err(|_| bad("the part after `whsec_` is not base64"))?;
    // Spec table "Signing secret": random, 24 to 64 bytes (192 to 512 bits).
    if !(24..=64).contains(&key.len()) {
        return Err(bad("the key is not 24 to 64 bytes long"));
    }
    Ok(key)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The specification's example (docs/providers.md, "Standard Webhooks").
    #[test]
    fn spec_vector() {
        let sig = sign(
            "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
            "msg_p5jXN8AQM9LWM0D4loKWxJek",
            1_614_265_330,
            br#"{"test": 2432232314}"#,
        )
        .unwrap();
        assert_eq!(sig, "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=");
    }

    #[test]
    fn bad_secrets_are_named_not_shown() {
        let e = sign("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "i", 1, b"").unwrap_err();
        assert!(e.to_string().contains("whsec_"));
        assert!(!e.to_string().contains("MfKQ9r8"));
        assert!(sign("whsec_!!!", "i", 1, b"").is_err());
        // 16 bytes: below the spec's 24.
        assert!(sign("whsec_MfKQ9r8GKYqrTwjUPD8ILA==", "i", 1, b"").is_err());
    }

    #[test]
    fn message_id_is_stable() {
        assert_eq!(message_id("k"), message_id("k"));
        assert!(message_id("k").starts_with("msg_"));
        assert_eq!(message_id("k").len(), 36);
    }
}
