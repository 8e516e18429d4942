//! Compact JWS / JWT (RFC 7515 / RFC 7519) with RS256 (RSASSA-PKCS1-v1_5
//! over SHA-256, RFC 7518 §3.3) and ES256 (ECDSA P-256 over SHA-256,
//! RFC 7518 §3.4: the signature is `r || s`, 64 bytes). Keys are PKCS#8 PEM,
//! as Google service-account files and Apple `.p8` keys hold them. Both
//! signatures are deterministic (PKCS#1 v1.5; ECDSA with RFC 6979 nonces),
//! so no randomness is needed.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;

use crate::AuthError;

/// `base64url(header) . base64url(payload)`.
fn signing_input(header: &[u8], payload: &[u8]) -> String {
    format!(
        "{}.{}",
        URL_SAFE_NO_PAD.encode(header),
        URL_SAFE_NO_PAD.encode(payload)
    )
}

/// The compact JWS of `payload` under `header`, signed RS256 with the PKCS#8
/// PEM RSA key `pem` (`what` names the key in errors; its content never appears).
pub fn rs256(
    header: &[u8],
    payload: &[u8],
    pem: &str,
    what: &'static str,
) -> Result<String, AuthError> {
    use rsa::pkcs8::DecodePrivateKey;
    let key = rsa::PrivateKey::from_pkcs8_pem(pem)
        .map_err(|source| AuthError::BadKey { what, source })?;
    let input = signing_input(header, payload);
    let sig = key
        .pkcs1v15_sign::<sha2::Sha256>(input.as_bytes())
        .map_err(AuthError::Rsa)?;
    Ok(format!("{input}.{}", URL_SAFE_NO_PAD.encode(sig)))
}

/// The compact JWS of `payload` under `header`, signed ES256 with the PKCS#8
/// PEM P-256 key `pem`.
pub fn es256(
    header: &[u8],
    payload: &[u8],
    pem: &str,
    what: &'static str,
) -> Result<String, AuthError> {
    use p256::ecdsa::signature::Signer;
    use p256::pkcs8::DecodePrivateKey;
    let key = p256::ecdsa::SigningKey::from_pkcs8_pem(pem)
        .map_err(|source| AuthError::BadKey { what, source })?;
    let input = signing_input(header, payload);
    let sig: p256::ecdsa::Signature = key.sign(input.as_bytes());
    Ok(format!(
        "{input}.{}",
        URL_SAFE_NO_PAD.encode(sig.to_bytes())
    ))
}

/// A signing function: `rs256` or `es256`.
pub type Signer = fn(&[u8], &[u8], &str, &'static str) -> Result<String, AuthError>;

/// A JWT of `claims` with `header`, both JSON values, signed by `sign`
/// (`rs256` or `es256`).
pub fn encode(
    header: &serde_json::Value,
    claims: &serde_json::Value,
    sign: Signer,
    pem: &str,
    what: &'static str,
) -> Result<String, AuthError> {
    sign(
        header.to_string().as_bytes(),
        claims.to_string().as_bytes(),
        pem,
        what,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const RSA_A2: &str = include_str!("../tests/data/rfc7515-a2-rsa.pem");
    const EC_A3: &str = include_str!("../tests/data/rfc7515-a3-p256.pem");
    const EC_A3_PUB: &str = include_str!("../tests/data/rfc7515-a3-p256.pub.pem");

    /// RFC 7515 Appendix A.2: the exact JWS (the PEM is the appendix's JWK
    /// re-encoded as PKCS#8).
    #[test]
    fn rs256_rfc7515_a2() {
        let payload =
            b"{\"iss\":\"joe\",\r\n \"exp\":1300819380,\r\n \"http://example.com/is_root\":true}";
        let jws = rs256(br#"{"alg":"RS256"}"#, payload, RSA_A2, "the test key").unwrap();
        assert_eq!(
            jws,
            "eyJhbGciOiJSUzI1NiJ9.eyJpc3MiOiJqb2UiLA0KICJleHAiOjEzMDA4MTkzODAsDQogImh0dHA6Ly9leGFtcGxlLmNvbS9pc19yb290Ijp0cnVlfQ.cC4hiUPoj9Eetdgtv3hF80EGrhuB__dzERat0XF9g2VtQgr9PJbu3XOiZj5RZmh7AAuHIm4Bh-0Qc_lF5YKt_O8W2Fp5jujGbds9uJdbF9CUAr7t1dnZcAcQjbKBYNX4BAynRFdiuB--f_nZLgrnbyTyWzO75vRK5h6xBArLIARNPvkSjtQBMHlb1L07Qe7K0GarZRmB_eSN9383LcOLn6_dO--xi12jzDwusC-eOkHWEsqtFZESc6BfI7noOPqvhJ1phCnvWh6IeYI2w9QOYEUipUTI8np6LbgGY9Fs98rqVt5AXLIhWkWywlVmtVrBp0igcN_IoypGlUPQGe77Rw"
        );
    }

    /// ES256 with the RFC 7515 A.3 key: signed, then verified with the
    /// public key; RFC 6979 makes it deterministic.
    #[test]
    fn es256_sign_then_verify() {
        use p256::ecdsa::signature::Verifier;
        use p256::pkcs8::DecodePublicKey;
        let header = br#"{"alg":"ES256","kid":"ABC123DEFG"}"#;
        let claims = br#"{"iss":"DEF123GHIJ","iat":1437179036}"#;
        let jws = es256(header, claims, EC_A3, "the test key").unwrap();
        assert_eq!(jws, es256(header, claims, EC_A3, "the test key").unwrap());
        let (input, sig) = jws.rsplit_once('.').unwrap();
        let sig =
            p256::ecdsa::Signature::from_slice(&URL_SAFE_NO_PAD.decode(sig).unwrap()).unwrap();
        let public = p256::ecdsa::VerifyingKey::from_public_key_pem(EC_A3_PUB).unwrap();
        public.verify(input.as_bytes(), &sig).unwrap();
        assert!(public.verify(b"tampered", &sig).is_err());
    }

    #[test]
    fn bad_keys_are_named_not_shown() {
        let e = rs256(b"{}", b"{}", EC_A3, "the service account's private_key").unwrap_err();
        assert!(e.to_string().contains("private_key"));
        assert!(!e.to_string().contains("BEGIN"));
        assert!(es256(b"{}", b"{}", "garbage", "k").is_err());
    }
}
