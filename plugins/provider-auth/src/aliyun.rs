//! Aliyun OpenAPI signature V3 (`ACS3-HMAC-SHA256`) and the SMS error table.
//!
//! Signature: Aliyun "V3 request structure and signature"
//! (<https://help.aliyun.com/zh/sdk/product-overview/v3-request-structure-and-signature>,
//! sections "CanonicalRequest", "StringToSign", "Authorization"), as in
//! aliyun/darabonba-openapi-util `service.go`:
//! canonical request = method, path, sorted RFC 3986 query, canonical headers
//! (`host`, `content-type`, every `x-acs-*`; lower case, sorted, `k:v\n`),
//! signed header list, hex SHA-256 of the body; string to sign =
//! `ACS3-HMAC-SHA256\n` + hex SHA-256 of the canonical request; signature =
//! hex HMAC-SHA256(secret, string to sign).
//!
//! Errors: SendSms API reference, "错误码" (<https://help.aliyun.com/zh/sms/developer-reference/api-dysmsapi-2017-05-25-sendsms>)
//! and the SMS error-code list (<https://help.aliyun.com/zh/sms/developer-reference/api-error-codes>).

use crate::{Class, Refusal, canonical_headers, canonical_query, hex, hmac_sha256, sha256_hex};

/// The algorithm name of signature V3.
pub const ALGORITHM: &str = "ACS3-HMAC-SHA256";

/// One request to sign.
#[derive(Debug, Clone)]
pub struct Request<'a> {
    /// `POST`, `GET`...
    pub method: &'a str,
    /// The path, `/` for RPC-style APIs.
    pub path: &'a str,
    /// Query parameters (unencoded; encoded and sorted here).
    pub query: &'a [(String, String)],
    /// Headers to sign: `host`, `x-acs-*` and `content-type` when present
    /// (names in any case; values as sent).
    pub headers: &'a [(String, String)],
    /// The body (empty for RPC style with every parameter in the query).
    pub body: &'a [u8],
}

/// A computed V3 signature.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Signed {
    /// Hex SHA-256 of the canonical request (the documentation shows it).
    pub hashed_canonical_request: String,
    /// Hex signature.
    pub signature: String,
    /// The `Authorization` header value.
    pub authorization: String,
}

/// Signs `req` with the access key pair.
pub fn sign_v3(req: &Request<'_>, access_key_id: &str, secret: &str) -> Signed {
    let (canonical_headers, signed_headers) = canonical_headers(
        req.headers
            .iter()
            .map(|(k, v)| (k.to_ascii_lowercase(), v.trim().to_string()))
            .filter(|(k, _)| k == "host" || k == "content-type" || k.starts_with("x-acs-"))
            .collect(),
    );
    let canonical_request = format!(
        "{}\n{}\n{}\n{}\n{}\n{}",
        req.method,
        req.path,
        canonical_query(req.query),
        canonical_headers,
        signed_headers,
        sha256_hex(req.body)
    );
    let hashed_canonical_request = sha256_hex(canonical_request.as_bytes());
    let string_to_sign = format!("{ALGORITHM}\n{hashed_canonical_request}");
    let signature = hex(&hmac_sha256(secret.as_bytes(), string_to_sign.as_bytes()));
    let authorization = format!(
        "{ALGORITHM} Credential={access_key_id},SignedHeaders={signed_headers},Signature={signature}"
    );
    Signed {
        hashed_canonical_request,
        signature,
        authorization,
    }
}

/// The `OutId` of a message: 32 hex digits of the key's SHA-256 (Aliyun
/// only echoes it, in receipts and QuerySendDetails rows).
pub fn out_id(idempotency_key: &str) -> String {
    crate::key_digest(idempotency_key, 32)
}

/// Sorts a `Code` other than `OK` (from a 200 body or an error status) by
/// the SMS error table (docs/providers.md, "Aliyun SMS"). Aliyun's own
/// failures (`isp.*`, `ServiceUnavailable*`) are unknown: the SMS may have
/// been taken. Other unknown codes are permanent: they refuse the request,
/// and nothing says a retry would be taken.
pub fn classify(code: &str) -> Refusal {
    use Class::{Permanent, Retryable, Unknown};
    let r = |class| Refusal::new(class, code);
    match code {
        // Flow control and quotas that reset: later may work.
        "isv.BUSINESS_LIMIT_CONTROL" | "Throttling.User" | "isv.DAY_LIMIT_CONTROL" => r(Retryable),
        "SignatureNonceUsed" => r(Retryable),
        "InvalidTimeStamp.Expired" => r(Retryable)
            .because("the host's clock is more than 15 minutes off Aliyun's; fix the clock"),
        // Credentials before the `isp.` arm: RAM_PERMISSION_DENY is an `isp.` code.
        c if c.starts_with("Forbidden") || c == "isp.RAM_PERMISSION_DENY" => {
            r(Permanent).because("the access key may not call dysmsapi (RAM policy)")
        }
        // Aliyun's own failures: nothing documents that the SMS was not
        // taken (docs/providers.md, "Aliyun SMS"), so the answer is ambiguous.
        c if c.starts_with("isp.") || c.starts_with("ServiceUnavailable") => r(Unknown),
        // Account, content, recipient: never.
        "isv.AMOUNT_NOT_ENOUGH" => r(Permanent).because("the Aliyun account is out of credit"),
        "isv.OUT_OF_SERVICE" => r(Permanent).because("the Aliyun account is suspended (arrears)"),
        "isv.MOBILE_NUMBER_ILLEGAL"
        | "isv.SMS_CONTENT_ILLEGAL"
        | "isv.MONTH_LIMIT_CONTROL"
        | "isv.BLACK_KEY_CONTROL_LIMIT"
        | "isv.TEMPLATE_MISSING_PARAMETERS"
        | "isv.INVALID_PARAMETERS"
        | "isv.INVALID_JSON_PARAM"
        | "isv.PARAM_LENGTH_LIMIT"
        | "isv.MOBILE_COUNT_OVER_LIMIT" => r(Permanent),
        "isv.SMS_TEMPLATE_ILLEGAL" => {
            r(Permanent).because("the template code is not approved for this account")
        }
        "isv.SMS_SIGNATURE_ILLEGAL" | "isv.SMS_SIGN_ILLEGAL" => {
            r(Permanent).because("the sign name (`sign_name`) is not approved for this account")
        }
        // Credentials: an operator must act.
        "SignatureDoesNotMatch" | "IncompleteSignature" => {
            r(Permanent).because("the request signature was refused: check `access_key_secret`")
        }
        c if c.starts_with("InvalidAccessKeyId") => {
            r(Permanent).because("the access key id is unknown or disabled: check `access_key_id`")
        }
        _ => r(Permanent),
    }
}

/// The number QuerySendDetails asks for: SendSms takes `+86`, `0086` and
/// `86` prefixes, QuerySendDetails the 11-digit mainland number
/// (docs/providers.md, "Aliyun SMS"). A mainland number with one of those
/// prefixes loses it; anything else is asked as given.
pub fn query_number(recipient: &str) -> &str {
    let n = recipient.trim();
    for prefix in ["+86", "0086", "86"] {
        if let Some(rest) = n.strip_prefix(prefix)
            && rest.len() == 11
            && rest.starts_with('1')
            && rest.bytes().all(|b| b.is_ascii_digit())
        {
            return rest;
        }
    }
    n
}

/// What a `SendStatus` of a QuerySendDetails row means: 1 waiting for the
/// handset's receipt, 2 failed, 3 delivered.
pub fn send_status(code: i64) -> Option<crate::aliyun::Status> {
    match code {
        1 => Some(Status::Pending),
        2 => Some(Status::Failed),
        3 => Some(Status::Delivered),
        _ => None,
    }
}

/// A message's state in QuerySendDetails rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Status {
    /// Failed (a later row may still say delivered).
    Failed,
    /// Waiting for the handset's receipt.
    Pending,
    /// Delivered.
    Delivered,
}

/// One entry of an SmsReport push, as far as settling it needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    /// Our `out_id` when the report carries one, else Aliyun's `biz_id`.
    pub id: String,
    /// `success`: delivered to the handset.
    pub delivered: bool,
    /// `err_code` (`DELIVERED` or the carrier's code).
    pub err_code: Option<String>,
}

/// The entries of an SmsReport push body (a JSON array,
/// <https://help.aliyun.com/zh/sms/developer-reference/smsreport-2>), or what
/// is wrong with it.
pub fn reports(body: &[u8]) -> Result<Vec<Report>, String> {
    let list: Vec<serde_json::Value> =
        serde_json::from_slice(body).map_err(|e| format!("not a JSON array of reports: {e}"))?;
    list.iter().map(report).collect()
}

/// One SmsReport entry.
fn report(v: &serde_json::Value) -> Result<Report, String> {
    let field = |k| {
        v.get(k)
            .and_then(serde_json::Value::as_str)
            .filter(|s| !s.is_empty())
    };
    let id = field("out_id")
        .or_else(|| field("biz_id"))
        .ok_or("a report without `out_id` or `biz_id`")?;
    let delivered = v
        .get("success")
        .and_then(serde_json::Value::as_bool)
        .ok_or("a report without `success`")?;
    Ok(Report {
        id: id.to_string(),
        delivered,
        err_code: field("err_code").map(str::to_string),
    })
}

/// One entry of an SmsUp push: a user's reply to an SMS
/// (<https://help.aliyun.com/zh/sms/developer-reference/smsup-http>).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Uplink {
    /// `phone_number`: who replied, as Aliyun writes it (the 11 digits of a
    /// mainland number).
    pub phone_number: String,
    /// `content`: the reply's text.
    pub content: String,
    /// `sequence_id` (documented as a string, formerly a number), as text.
    pub sequence_id: String,
}

/// Whether an SMS push body holds SmsUp entries (a user's replies: each has
/// `content`) rather than SmsReport's receipts. An empty array is neither: it
/// is answered as a receipt push with nothing in it.
pub fn is_uplink_push(body: &[u8]) -> bool {
    serde_json::from_slice::<Vec<serde_json::Value>>(body)
        .ok()
        .and_then(|list| list.first().map(|v| v.get("content").is_some()))
        .unwrap_or(false)
}

/// The entries of an SmsUp push body (a JSON array of `{phone_number,
/// content, send_time, dest_code, sequence_id}`), or what is wrong with it,
/// naming the entry and the field.
pub fn uplinks(body: &[u8]) -> Result<Vec<Uplink>, String> {
    let list: Vec<serde_json::Value> = serde_json::from_slice(body)
        .map_err(|e| format!("SmsUp: not a JSON array of replies: {e}"))?;
    list.iter()
        .enumerate()
        .map(|(i, v)| uplink(v).map_err(|e| format!("SmsUp entry [{i}]: {e}")))
        .collect()
}

/// One SmsUp entry.
fn uplink(v: &serde_json::Value) -> Result<Uplink, String> {
    if !v.is_object() {
        return Err("not an object".into());
    }
    let text = |k: &str| -> Result<String, String> {
        match v.get(k) {
            Some(serde_json::Value::String(s)) => Ok(s.clone()),
            Some(serde_json::Value::Number(n)) => Ok(n.to_string()),
            Some(_) => Err(format!("`{k}` is not a string")),
            None => Err(format!("`{k}` is missing")),
        }
    };
    let phone_number = text("phone_number")?;
    if phone_number.trim().is_empty() {
        return Err("`phone_number` is empty".into());
    }
    let content = text("content")?;
    text("send_time")?;
    text("dest_code")?;
    let sequence_id = text("sequence_id")?;
    Ok(Uplink {
        phone_number: phone_number.trim().to_string(),
        content,
        sequence_id,
    })
}

/// The forms a mainland number may have been given to SendSms in (`+86`,
/// `0086`, `86` or no prefix, "手机号码格式", SendSms), the 11 digits first;
/// any other number as it is.
pub fn number_forms(phone_number: &str) -> Vec<String> {
    let n = query_number(phone_number);
    if n.len() == 11 && n.starts_with('1') && n.bytes().all(|b| b.is_ascii_digit()) {
        vec![
            n.to_string(),
            format!("+86{n}"),
            format!("0086{n}"),
            format!("86{n}"),
        ]
    } else {
        vec![n.to_string()]
    }
}

/// Whether a reply's `content` is one of the unsubscribe `words`: compared
/// trimmed and case-insensitively (`td`, ` TD `, `退订`).
pub fn is_unsubscribe(content: &str, words: &[String]) -> bool {
    let c = content.trim();
    words
        .iter()
        .any(|w| !w.trim().is_empty() && w.trim().to_lowercase() == c.to_lowercase())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(k: &str, v: &str) -> (String, String) {
        (k.to_string(), v.to_string())
    }

    /// The documentation's own example (docs/providers.md, "Aliyun SMS"; Aliyun "V3 request
    /// structure and signature", section "示例").
    #[test]
    fn v3_documentation_vector() {
        let query = [
            s(
                "ImageId",
                "win2019_1809_x64_dtc_zh-cn_40G_alibase_20230811.vhd",
            ),
            s("RegionId", "cn-shanghai"),
        ];
        let headers = [
            s("host", "ecs.cn-shanghai.aliyuncs.com"),
            s("x-acs-action", "RunInstances"),
            s("x-acs-version", "2014-05-26"),
            s("x-acs-date", "2023-10-26T10:22:32Z"),
            s("x-acs-signature-nonce", "3156853299f313e23d1673dc12e1703d"),
            s("x-acs-content-sha256", &sha256_hex(b"")),
        ];
        let req = Request {
            method: "POST",
            path: "/",
            query: &query,
            headers: &headers,
            body: b"",
        };
        let signed = sign_v3(&req, "YourAccessKeyId", "YourAccessKeySecret");
        assert_eq!(
            signed.hashed_canonical_request,
            "7ea06492da5221eba5297e897ce16e55f964061054b7695beedaac1145b1e259"
        );
        assert_eq!(
            signed.signature,
            "06563a9e1b43f5dfe96b81484da74bceab24a1d853912eee15083a6f0f3283c0"
        );
        assert_eq!(
            signed.authorization,
            "ACS3-HMAC-SHA256 Credential=YourAccessKeyId,SignedHeaders=host;x-acs-action;x-acs-content-sha256;x-acs-date;x-acs-signature-nonce;x-acs-version,Signature=06563a9e1b43f5dfe96b81484da74bceab24a1d853912eee15083a6f0f3283c0"
        );
    }

    #[test]
    fn canonical_query_sorts_and_encodes() {
        let q = [
            s("b", "x y"),
            s("TemplateParam", "{\"code\":\"1\"}"),
            s("a", "~*"),
        ];
        assert_eq!(
            canonical_query(&q),
            "TemplateParam=%7B%22code%22%3A%221%22%7D&a=~%2A&b=x%20y"
        );
    }

    /// The SendSms error table: code → class.
    #[test]
    fn error_table() {
        use Class::*;
        let table = [
            ("isv.AMOUNT_NOT_ENOUGH", Permanent),
            ("isv.OUT_OF_SERVICE", Permanent),
            ("isv.MOBILE_NUMBER_ILLEGAL", Permanent),
            ("isv.SMS_CONTENT_ILLEGAL", Permanent),
            ("isv.SMS_TEMPLATE_ILLEGAL", Permanent),
            ("isv.SMS_SIGNATURE_ILLEGAL", Permanent),
            ("isv.MONTH_LIMIT_CONTROL", Permanent),
            ("isv.BUSINESS_LIMIT_CONTROL", Retryable),
            ("isv.DAY_LIMIT_CONTROL", Retryable),
            ("Throttling.User", Retryable),
            ("isp.SYSTEM_ERROR", Unknown),
            ("ServiceUnavailable", Unknown),
            ("isp.RAM_PERMISSION_DENY", Permanent),
            ("Forbidden.RAM", Permanent),
            ("SignatureNonceUsed", Retryable),
            ("InvalidTimeStamp.Expired", Retryable),
            ("SignatureDoesNotMatch", Permanent),
            ("IncompleteSignature", Permanent),
            ("InvalidAccessKeyId.NotFound", Permanent),
            ("isv.SOMETHING_NEW", Permanent),
        ];
        for (code, class) in table {
            assert_eq!(classify(code).class, class, "{code}");
        }
        assert!(
            classify("SignatureDoesNotMatch")
                .cause
                .unwrap()
                .contains("access_key_secret")
        );
    }

    /// The documentation's example push, plus a failure and a bad entry.
    #[test]
    fn sms_reports() {
        let body = r#"[{"phone_number":"1381111****","send_time":"2017-01-01 00:00:00","report_time":"2017-01-01 00:00:00","success":true,"err_code":"DELIVERED","err_msg":"用户接收成功","sms_size":"1","biz_id":"12345","out_id":"67890"},
                      {"phone_number":"1","success":false,"err_code":"MK:0001","biz_id":"999","out_id":""}]"#;
        let got = reports(body.as_bytes()).unwrap();
        assert_eq!(got[0].id, "67890");
        assert!(got[0].delivered);
        assert_eq!(got[0].err_code.as_deref(), Some("DELIVERED"));
        assert_eq!(got[1].id, "999");
        assert!(!got[1].delivered);
        assert!(
            reports(br#"[{"success":true}]"#)
                .unwrap_err()
                .contains("out_id")
        );
        assert!(reports(br#"{"a":1}"#).is_err());
    }

    #[test]
    fn query_numbers_are_the_11_digits() {
        assert_eq!(query_number("+8613800000001"), "13800000001");
        assert_eq!(query_number("008613800000001"), "13800000001");
        assert_eq!(query_number("8613800000001"), "13800000001");
        assert_eq!(query_number("13800000001"), "13800000001");
        // Not a mainland number behind the prefix: left alone.
        assert_eq!(query_number("+85291234567"), "+85291234567");
        assert_eq!(query_number("8612345"), "8612345");
    }

    #[test]
    fn send_status_codes() {
        assert_eq!(send_status(1), Some(Status::Pending));
        assert_eq!(send_status(2), Some(Status::Failed));
        assert_eq!(send_status(3), Some(Status::Delivered));
        assert_eq!(send_status(0), None);
        assert_eq!(out_id("k").len(), 32);
    }

    /// The documentation's example push (SmsUp, "参数示例"), with
    /// `sequence_id` as a string and, as an older page shows it, a number.
    #[test]
    fn smsup_entries_as_documented() {
        let body = br#"[{"phone_number":"1381111****","content":"TD","send_time":"2017-09-01 00:00:00","dest_code":"1234","sequence_id":"1234567890"},
            {"phone_number":"13800000042","content":" td ","send_time":"2017-09-01 00:00:00","dest_code":"1234","sequence_id":1234567891}]"#;
        assert!(is_uplink_push(body));
        let ups = uplinks(body).unwrap();
        assert_eq!(ups.len(), 2);
        assert_eq!(ups[1].sequence_id, "1234567891");
        assert_eq!(ups[1].content, " td ");
        let words: Vec<String> = ["TD", "T", "退订"].map(String::from).to_vec();
        assert!(is_unsubscribe(&ups[1].content, &words));
        assert!(is_unsubscribe("退订", &words));
        assert!(!is_unsubscribe("TDX", &words));
        assert!(!is_uplink_push(br#"[{"biz_id":"1","success":true}]"#));
        assert!(!is_uplink_push(b"[]"));
        assert_eq!(
            uplinks(br#"[{"phone_number":"13800000042","send_time":"x","dest_code":"1","sequence_id":"1"}]"#)
                .unwrap_err(),
            "SmsUp entry [0]: `content` is missing"
        );
        assert!(
            uplinks(b"{}")
                .unwrap_err()
                .starts_with("SmsUp: not a JSON array")
        );
        assert_eq!(
            number_forms("13800000042"),
            [
                "13800000042",
                "+8613800000042",
                "008613800000042",
                "8613800000042"
            ]
        );
        assert_eq!(number_forms("+85291234567"), ["+85291234567"]);
    }
}
