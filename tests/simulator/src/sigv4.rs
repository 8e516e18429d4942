//! AWS Signature Version 4 as the simulated SES checks it, written apart
//! from the plugin's signer (`provider_auth::aws::sigv4`) so that one's
//! mistake is not the other's: the canonical request is rebuilt from the
//! request as received (method, path, raw query re-encoded and sorted, the
//! headers the `Authorization` names, the SHA-256 of the body as received),
//! the string to sign and the signing key chain as the IAM User Guide's
//! "Create a signed AWS API request" gives them
//! (<https://docs.aws.amazon.com/IAM/latest/UserGuide/create-signed-request.html>).

use axum::http::{HeaderMap, Method, StatusCode, Uri};
use ring::{digest, hmac};

/// The parts of `Authorization: AWS4-HMAC-SHA256 Credential=<id>/<date>/<region>/<service>/aws4_request, SignedHeaders=<list>, Signature=<hex>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Authorization {
    /// The access key id.
    pub access_key_id: String,
    /// The scope's date, `YYYYMMDD`.
    pub date: String,
    /// The scope's region.
    pub region: String,
    /// The scope's service.
    pub service: String,
    /// The signed header names, as listed.
    pub signed_headers: Vec<String>,
    /// The hex signature.
    pub signature: String,
}

/// Parses an `Authorization` header value; `None` when it is not SigV4.
pub fn parse_authorization(value: &str) -> Option<Authorization> {
    let rest = value.strip_prefix("AWS4-HMAC-SHA256 ")?;
    let mut credential = None;
    let mut signed = None;
    let mut signature = None;
    for part in rest.split(',') {
        let (k, v) = part.trim().split_once('=')?;
        match k {
            "Credential" => credential = Some(v),
            "SignedHeaders" => signed = Some(v),
            "Signature" => signature = Some(v),
            _ => return None,
        }
    }
    let scope: Vec<&str> = credential?.split('/').collect();
    let [id, date, region, service, "aws4_request"] = scope.as_slice() else {
        return None;
    };
    Some(Authorization {
        access_key_id: id.to_string(),
        date: date.to_string(),
        region: region.to_string(),
        service: service.to_string(),
        signed_headers: signed?.split(';').map(str::to_string).collect(),
        signature: signature?.to_string(),
    })
}

fn sha256_hex(data: &[u8]) -> String {
    hex::encode(digest::digest(&digest::SHA256, data))
}

/// The canonical request of a request as received. `headers` are the
/// signed headers' (lower-case name, value as received), in any order.
pub fn canonical_request(
    method: &str,
    path: &str,
    raw_query: &str,
    headers: &[(String, String)],
    body: &[u8],
) -> String {
    // SigV4's canonical query is Aliyun V3's (V3 follows SigV4):
    // RFC 3986-encoded pairs, sorted, `&`-joined.
    let query = crate::aliyun::canonical_query(&crate::aliyun::parse_pairs(raw_query));
    let mut headers: Vec<(String, String)> = headers
        .iter()
        .map(|(k, v)| {
            let v = v.split_whitespace().collect::<Vec<_>>().join(" ");
            (k.to_ascii_lowercase(), v)
        })
        .collect();
    headers.sort();
    let canonical: String = headers.iter().map(|(k, v)| format!("{k}:{v}\n")).collect();
    let names: Vec<&str> = headers.iter().map(|(k, _)| k.as_str()).collect();
    let path = if path.is_empty() { "/" } else { path };
    format!(
        "{method}\n{path}\n{query}\n{canonical}\n{}\n{}",
        names.join(";"),
        sha256_hex(body)
    )
}

/// The string to sign and the signing key of `canonical` at `amz_date` in
/// the scope of `auth`.
fn to_sign_and_key(
    secret: &str,
    amz_date: &str,
    auth: &Authorization,
    canonical: &str,
) -> (String, hmac::Key) {
    let scope = format!(
        "{}/{}/{}/aws4_request",
        auth.date, auth.region, auth.service
    );
    let to_sign = format!(
        "AWS4-HMAC-SHA256\n{amz_date}\n{scope}\n{}",
        sha256_hex(canonical.as_bytes())
    );
    let mac = |key: &[u8], data: &str| {
        hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, key), data.as_bytes())
            .as_ref()
            .to_vec()
    };
    let mut key = mac(format!("AWS4{secret}").as_bytes(), &auth.date);
    for part in [auth.region.as_str(), auth.service.as_str(), "aws4_request"] {
        key = mac(&key, part);
    }
    (to_sign, hmac::Key::new(hmac::HMAC_SHA256, &key))
}

/// The hex signature of `canonical` at `amz_date` in the scope of `auth`.
pub fn signature(secret: &str, amz_date: &str, auth: &Authorization, canonical: &str) -> String {
    let (to_sign, key) = to_sign_and_key(secret, amz_date, auth, canonical);
    hex::encode(hmac::sign(&key, to_sign.as_bytes()))
}

/// True if `auth`'s signature is that of `canonical` (compared by ring in
/// constant time).
pub fn verify(secret: &str, amz_date: &str, auth: &Authorization, canonical: &str) -> bool {
    let (to_sign, key) = to_sign_and_key(secret, amz_date, auth, canonical);
    hex::decode(&auth.signature)
        .is_ok_and(|tag| hmac::verify(&key, to_sign.as_bytes(), &tag).is_ok())
}

/// Checks the request's SigV4 signature, or answers as AWS does.
pub(crate) fn check(
    state: &crate::SimState,
    method: &Method,
    uri: &Uri,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<(), crate::ses::AwsError> {
    let forbidden = |kind: &str, m: &str| crate::ses::error(StatusCode::FORBIDDEN, kind, m);
    let header = |n: &str| headers.get(n).and_then(|v| v.to_str().ok());
    let auth = header("authorization").ok_or_else(|| {
        forbidden(
            "MissingAuthenticationTokenException",
            "Missing Authentication Token",
        )
    })?;
    let auth = parse_authorization(auth).ok_or_else(|| {
        crate::ses::error(StatusCode::BAD_REQUEST, "IncompleteSignatureException", "Authorization header requires 'Credential', 'Signature' and 'SignedHeaders' parameters.")
    })?;
    let creds = state.credentials();
    if auth.access_key_id != creds.aws_access_key_id {
        return Err(forbidden(
            "UnrecognizedClientException",
            "The security token included in the request is invalid.",
        ));
    }
    if auth.service != "ses" || auth.region != state.config.ses_region {
        return Err(forbidden(
            "SignatureDoesNotMatchException",
            &format!(
                "Credential should be scoped to a valid region and to correct service: 'ses' in '{}'.",
                state.config.ses_region
            ),
        ));
    }
    if !auth.signed_headers.iter().any(|h| h == "host") {
        return Err(forbidden(
            "SignatureDoesNotMatchException",
            "'Host' or ':authority' must be a 'SignedHeader' in the AWS Authorization.",
        ));
    }
    let amz_date = header("x-amz-date").ok_or_else(|| {
        crate::ses::error(
            StatusCode::BAD_REQUEST,
            "IncompleteSignatureException",
            "Authorization header requires existence of either a 'X-Amz-Date' or a 'Date' header.",
        )
    })?;
    let format = time::macros::format_description!("[year][month][day]T[hour][minute][second]Z");
    let at = time::PrimitiveDateTime::parse(amz_date, format)
        .map_err(|_| forbidden("SignatureDoesNotMatchException", "Invalid X-Amz-Date."))?
        .assume_utc()
        .unix_timestamp();
    if (crate::now_secs() - at).abs() > 300 {
        return Err(forbidden(
            "InvalidSignatureException",
            "Signature expired: the request time is more than 5 minutes from the current time.",
        ));
    }
    if !amz_date.starts_with(&auth.date) {
        return Err(forbidden(
            "SignatureDoesNotMatchException",
            "Date in Credential scope does not match YYYYMMDD from ISO-8601 version of date from HTTP.",
        ));
    }
    let signed: Vec<(String, String)> = auth
        .signed_headers
        .iter()
        .map(|n| {
            let v = match n.as_str() {
                "host" => header("host")
                    .map(str::to_string)
                    .or_else(|| uri.authority().map(|a| a.to_string())),
                n => header(n).map(str::to_string),
            };
            (n.clone(), v.unwrap_or_default())
        })
        .collect();
    let canonical = canonical_request(
        method.as_str(),
        uri.path(),
        uri.query().unwrap_or(""),
        &signed,
        body,
    );
    if !verify(&creds.aws_secret_access_key, amz_date, &auth, &canonical) {
        return Err(forbidden(
            "SignatureDoesNotMatchException",
            "The request signature we calculated does not match the signature you provided. Check your AWS Secret Access Key and signing method. Consult the service documentation for details.",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The AWS SigV4 test suite, `get-vanilla-query-order-key-case`
    /// (<https://docs.aws.amazon.com/general/latest/gr/signature-v4-test-suite.html>).
    #[test]
    fn test_suite_vector() {
        let auth = parse_authorization(
            "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, SignedHeaders=host;x-amz-date, Signature=b97d918cfa904a5beff61c982a1b6f458b799221646efd99d3219ec94cdf2500",
        )
        .unwrap();
        assert_eq!(auth.service, "service");
        let headers = [
            ("host".to_string(), "example.amazonaws.com".to_string()),
            ("x-amz-date".to_string(), "20150830T123600Z".to_string()),
        ];
        let canonical = canonical_request("GET", "/", "Param2=value2&Param1=value1", &headers, b"");
        let secret = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY";
        assert_eq!(
            signature(secret, "20150830T123600Z", &auth, &canonical),
            auth.signature
        );
        assert!(verify(secret, "20150830T123600Z", &auth, &canonical));
        assert!(!verify(secret, "20150830T123601Z", &auth, &canonical));
        assert!(parse_authorization("AWS4-HMAC-SHA256 Credential=a/b/c, Signature=x").is_none());
    }
}
