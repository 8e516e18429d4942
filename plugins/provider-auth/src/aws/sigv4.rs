//! AWS Signature Version 4 (`AWS4-HMAC-SHA256`), as the IAM User Guide's
//! "Create a signed AWS API request"
//! (<https://docs.aws.amazon.com/IAM/latest/UserGuide/create-signed-request.html>)
//! describes it:
//!
//! 1. canonical request = method, canonical URI (each path segment
//!    URI-encoded), canonical query (names and values URI-encoded, sorted by
//!    name), canonical headers (lower-case names, values trimmed with inner
//!    runs of spaces made one, sorted, each `name:value\n`), signed headers
//!    (`;`-joined), hex SHA-256 of the payload;
//! 2. string to sign = `AWS4-HMAC-SHA256`, the request date
//!    (`YYYYMMDDTHHMMSSZ`), the credential scope
//!    (`YYYYMMDD/region/service/aws4_request`), hex SHA-256 of the canonical
//!    request, one per line;
//! 3. signing key = HMAC chain `"AWS4" + secret` → date → region → service →
//!    `aws4_request`; signature = hex HMAC-SHA256(signing key, string to sign);
//! 4. `Authorization: AWS4-HMAC-SHA256 Credential=<key id>/<scope>,
//!    SignedHeaders=<list>, Signature=<hex>`.
//!
//! Tested against the AWS Signature Version 4 test suite
//! (<https://docs.aws.amazon.com/general/latest/gr/signature-v4-test-suite.html>,
//! case `get-vanilla-query-order-key-case`) and the IAM `ListUsers` example
//! of the same guide.

use crate::{canonical_headers, canonical_query, hex, hmac_sha256, percent_encode, sha256_hex};

/// The algorithm name.
pub const ALGORITHM: &str = "AWS4-HMAC-SHA256";

/// One request to sign.
#[derive(Debug, Clone)]
pub struct Request<'a> {
    /// `POST`, `GET`...
    pub method: &'a str,
    /// The path, not yet encoded (`/v2/email/outbound-emails`).
    pub path: &'a str,
    /// Query parameters, not yet encoded.
    pub query: &'a [(String, String)],
    /// The headers to sign, `host` and `x-amz-date` among them (names in any
    /// case, values as sent).
    pub headers: &'a [(String, String)],
    /// The payload.
    pub body: &'a [u8],
}

/// Where and as whom a request is signed.
#[derive(Debug, Clone, Copy)]
pub struct Scope<'a> {
    /// The access key id (`AKIA...`).
    pub access_key_id: &'a str,
    /// The secret access key.
    pub secret_access_key: &'a str,
    /// The region, e.g. `us-east-1`.
    pub region: &'a str,
    /// The service's signing name, e.g. `ses`.
    pub service: &'a str,
    /// The request time, `YYYYMMDDTHHMMSSZ` (the `x-amz-date` header).
    pub amz_date: &'a str,
}

/// A computed signature and the texts it was computed from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Signed {
    /// The canonical request (step 1).
    pub canonical_request: String,
    /// The string to sign (step 2).
    pub string_to_sign: String,
    /// The hex signature (step 3).
    pub signature: String,
    /// The `Authorization` header value (step 4).
    pub authorization: String,
}

/// `YYYYMMDDTHHMMSSZ` of `ms` since the epoch (UTC): `x-amz-date`.
pub fn amz_date(ms: u64) -> String {
    let (y, mo, d, h, mi, s) = crate::time::civil(ms, 0);
    format!("{y:04}{mo:02}{d:02}T{h:02}{mi:02}{s:02}Z")
}

/// The canonical URI: every segment of `path` URI-encoded, `/` kept.
pub fn canonical_uri(path: &str) -> String {
    if path.is_empty() {
        return "/".into();
    }
    path.split('/')
        .map(percent_encode)
        .collect::<Vec<_>>()
        .join("/")
}

/// A header value as signed: trimmed, inner runs of spaces made one.
fn canonical_value(v: &str) -> String {
    v.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The signing key of `secret` for `date` (`YYYYMMDD`), `region`, `service`.
pub fn signing_key(secret: &str, date: &str, region: &str, service: &str) -> Vec<u8> {
    let k_date = hmac_sha256(format!("AWS4{secret}").as_bytes(), date.as_bytes());
    let k_region = hmac_sha256(&k_date, region.as_bytes());
    let k_service = hmac_sha256(&k_region, service.as_bytes());
    hmac_sha256(&k_service, b"aws4_request")
}

/// Signs `req` in `scope`.
pub fn sign(req: &Request<'_>, scope: &Scope<'_>) -> Signed {
    let (canonical_headers, signed_headers) = canonical_headers(
        req.headers
            .iter()
            .map(|(k, v)| (k.to_ascii_lowercase(), canonical_value(v)))
            .collect(),
    );
    let canonical_request = format!(
        "{}\n{}\n{}\n{}\n{}\n{}",
        req.method,
        canonical_uri(req.path),
        canonical_query(req.query),
        canonical_headers,
        signed_headers,
        sha256_hex(req.body)
    );
    let date = scope.amz_date.get(..8).unwrap_or(scope.amz_date);
    let credential_scope = format!("{date}/{}/{}/aws4_request", scope.region, scope.service);
    let string_to_sign = format!(
        "{ALGORITHM}\n{}\n{credential_scope}\n{}",
        scope.amz_date,
        sha256_hex(canonical_request.as_bytes())
    );
    let key = signing_key(scope.secret_access_key, date, scope.region, scope.service);
    let signature = hex(&hmac_sha256(&key, string_to_sign.as_bytes()));
    let authorization = format!(
        "{ALGORITHM} Credential={}/{credential_scope}, SignedHeaders={signed_headers}, Signature={signature}",
        scope.access_key_id
    );
    Signed {
        canonical_request,
        string_to_sign,
        signature,
        authorization,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(k: &str, v: &str) -> (String, String) {
        (k.to_string(), v.to_string())
    }

    const SECRET: &str = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY";

    /// The AWS SigV4 test suite, `get-vanilla-query-order-key-case`:
    /// `GET /?Param2=value2&Param1=value1`, `Host: example.amazonaws.com`,
    /// `X-Amz-Date: 20150830T123600Z`, key `AKIDEXAMPLE`, scope
    /// `us-east-1/service`.
    #[test]
    fn test_suite_get_vanilla_query_order_key_case() {
        let query = [s("Param2", "value2"), s("Param1", "value1")];
        let headers = [
            s("Host", "example.amazonaws.com"),
            s("X-Amz-Date", "20150830T123600Z"),
        ];
        let req = Request {
            method: "GET",
            path: "/",
            query: &query,
            headers: &headers,
            body: b"",
        };
        let signed = sign(
            &req,
            &Scope {
                access_key_id: "AKIDEXAMPLE",
                secret_access_key: SECRET,
                region: "us-east-1",
                service: "service",
                amz_date: "20150830T123600Z",
            },
        );
        assert_eq!(
            signed.authorization,
            "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, SignedHeaders=host;x-amz-date, Signature=b97d918cfa904a5beff61c982a1b6f458b799221646efd99d3219ec94cdf2500"
        );
    }

    /// The IAM `ListUsers` example of the Signature Version 4 guide: its
    /// hashed canonical request and signature.
    #[test]
    fn iam_list_users_example() {
        let query = [s("Action", "ListUsers"), s("Version", "2010-05-08")];
        let headers = [
            s(
                "Content-Type",
                "application/x-www-form-urlencoded; charset=utf-8",
            ),
            s("Host", "iam.amazonaws.com"),
            s("X-Amz-Date", "20150830T123600Z"),
        ];
        let req = Request {
            method: "GET",
            path: "/",
            query: &query,
            headers: &headers,
            body: b"",
        };
        let signed = sign(
            &req,
            &Scope {
                access_key_id: "AKIDEXAMPLE",
                secret_access_key: SECRET,
                region: "us-east-1",
                service: "iam",
                amz_date: "20150830T123600Z",
            },
        );
        assert_eq!(
            sha256_hex(signed.canonical_request.as_bytes()),
            "f536975d06c0309214f805bb90ccff089219ecd68b2577efef23edd43b7e1a59"
        );
        assert_eq!(
            hex(&signing_key(SECRET, "20150830", "us-east-1", "iam")),
            "c4afb1cc5771d871763a393e44b703571b55cc28424d1a5e86da6ed3c154a4b9"
        );
        assert_eq!(
            signed.signature,
            "5d672d79c15b13162d9279b0855cfba6789a8edb4c82c400e06b5924a6f2b5d7"
        );
    }

    #[test]
    fn dates_and_values() {
        assert_eq!(amz_date(1_440_938_160_000), "20150830T123600Z");
        assert_eq!(canonical_value("  a   b  c "), "a b c");
        assert_eq!(
            canonical_uri("/v2/email/outbound-emails"),
            "/v2/email/outbound-emails"
        );
        assert_eq!(canonical_uri("/a b"), "/a%20b");
    }
}
