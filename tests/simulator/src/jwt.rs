//! Compact JWS (JWT) parsing and the two signature checks the providers do:
//! RS256 (Google's OAuth token endpoint) and ES256 (APNs), with ring.

use crate::tls::RsaPublic;
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ring::signature::{self, RsaPublicKeyComponents, UnparsedPublicKey};
use serde_json::Value;

/// A JWT split into its parts.
pub struct Jwt<'a> {
    /// The decoded JOSE header.
    pub header: Value,
    /// The decoded claims.
    pub claims: Value,
    /// `base64url(header) "." base64url(claims)`: what was signed.
    pub signing_input: &'a str,
    /// The decoded signature.
    pub signature: Vec<u8>,
}

/// Splits and decodes a compact JWS; `None` if it is not one.
pub fn parse(token: &str) -> Option<Jwt<'_>> {
    let (signing_input, sig) = token.rsplit_once('.')?;
    let (header, claims) = signing_input.split_once('.')?;
    let json = |part: &str| -> Option<Value> {
        serde_json::from_slice(&URL_SAFE_NO_PAD.decode(part).ok()?).ok()
    };
    Some(Jwt {
        header: json(header)?,
        claims: json(claims)?,
        signing_input,
        signature: URL_SAFE_NO_PAD.decode(sig).ok()?,
    })
}

/// True if `sig` is a valid RSASSA-PKCS1-v1_5 SHA-256 signature of `input`.
pub fn verify_rs256(key: &RsaPublic, input: &[u8], sig: &[u8]) -> bool {
    RsaPublicKeyComponents {
        n: &key.n,
        e: &key.e,
    }
    .verify(&signature::RSA_PKCS1_2048_8192_SHA256, input, sig)
    .is_ok()
}

/// True if `sig` (JWS form: r ‖ s, 64 bytes) is a valid ECDSA P-256 SHA-256
/// signature of `input` by the uncompressed public point `key`.
pub fn verify_es256(key: &[u8], input: &[u8], sig: &[u8]) -> bool {
    UnparsedPublicKey::new(&signature::ECDSA_P256_SHA256_FIXED, key)
        .verify(input, sig)
        .is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    const N: &str = "ofgWCuLjybRlzo0tZWJjNiuSfb4p4fAkd_wWJcyQoTbji9k0l8W26mPddxHmfHQp-Vaw-4qPCJrcS2mJPMEzP1Pt0Bm4d4QlL-yRT-SFd2lZS-pCgNMsD1W_YpRPEwOWvG6b32690r2jZ47soMZo9wGzjb_7OMg0LOL-bSf63kpaSHSXndS5z5rexMdbBYUsLA9e-KXBdQOS-UTo7WTBEMa2R2CapHg665xsmtdVMTBQY4uDZlxvb3qCo5ZwKh9kG4LT6_I5IhlJH7aGhyxXFvUK-DWNmoudF8NAco9_h9iaGNj8q2ethFkMLs91kzk2PAcDTW9gb54h4FRWyuXpoQ";
    const JWS: &str = "eyJhbGciOiJSUzI1NiJ9.eyJpc3MiOiJqb2UiLA0KICJleHAiOjEzMDA4MTkzODAsDQogImh0dHA6Ly9leGFtcGxlLmNvbS9pc19yb290Ijp0cnVlfQ.cC4hiUPoj9Eetdgtv3hF80EGrhuB__dzERat0XF9g2VtQgr9PJbu3XOiZj5RZmh7AAuHIm4Bh-0Qc_lF5YKt_O8W2Fp5jujGbds9uJdbF9CUAr7t1dnZcAcQjbKBYNX4BAynRFdiuB--f_nZLgrnbyTyWzO75vRK5h6xBArLIARNPvkSjtQBMHlb1L07Qe7K0GarZRmB_eSN9383LcOLn6_dO--xi12jzDwusC-eOkHWEsqtFZESc6BfI7noOPqvhJ1phCnvWh6IeYI2w9QOYEUipUTI8np6LbgGY9Fs98rqVt5AXLIhWkWywlVmtVrBp0igcN_IoypGlUPQGe77Rw";

    /// RFC 7515 Appendix A.2: the RS256 example verifies with its key, and
    /// a changed claim does not.
    #[test]
    fn rfc7515_a2_rs256_vector() {
        let key = RsaPublic {
            n: URL_SAFE_NO_PAD.decode(N).unwrap(),
            e: URL_SAFE_NO_PAD.decode("AQAB").unwrap(),
        };
        let jwt = parse(JWS).unwrap();
        assert_eq!(jwt.header["alg"], "RS256");
        assert_eq!(jwt.claims["iss"], "joe");
        assert_eq!(jwt.claims["exp"], 1300819380);
        assert!(verify_rs256(
            &key,
            jwt.signing_input.as_bytes(),
            &jwt.signature
        ));
        let forged = jwt
            .signing_input
            .replace("eyJpc3MiOiJqb2Ui", "eyJpc3MiOiJqb2Ei");
        assert!(!verify_rs256(&key, forged.as_bytes(), &jwt.signature));
    }
}
