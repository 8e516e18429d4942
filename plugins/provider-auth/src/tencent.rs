//! Tencent Cloud API 3.0 signature v3 (`TC3-HMAC-SHA256`), the SMS
//! (2021-01-11) error table, phone numbers and the delivery-report push.
//!
//! Signature: "Signature v3" of Tencent Cloud SMS
//! (<https://www.tencentcloud.com/document/product/382/40467>): canonical request =
//! `POST`, `/`, empty query, canonical headers (`content-type:..\nhost:..\n`,
//! lower-case names, trimmed values, sorted), signed header list, hex SHA-256
//! of the body; string to sign = `TC3-HMAC-SHA256\n<timestamp>\n<UTC
//! date>/<service>/tc3_request\n<hex SHA-256 of the canonical request>`; key =
//! HMAC chain `"TC3"+SecretKey` → date → service → `tc3_request`; signature =
//! hex HMAC of the string to sign. The date is the **UTC** date of the
//! timestamp (the page: "calls can succeed in the daytime ... but will
//! definitely fail at 00:00" otherwise).
//!
//! Errors: SendSms "错误码" (<https://cloud.tencent.com/document/api/382/55981>),
//! the SMS error-code list (<https://cloud.tencent.com/document/api/382/59177>)
//! and the common error codes (<https://cloud.tencent.com/document/api/382/52075>).

use crate::{Class, Refusal, hex, hmac_sha256, sha256_hex};

/// The algorithm name of signature v3.
pub const ALGORITHM: &str = "TC3-HMAC-SHA256";

/// One request to sign (POST, path `/`, no query: API 3.0 over JSON).
#[derive(Debug, Clone)]
pub struct Request<'a> {
    /// The `Host` as sent (`sms.tencentcloudapi.com`, or `127.0.0.1:PORT`).
    pub host: &'a str,
    /// The `Content-Type` as sent, e.g. `application/json; charset=utf-8`.
    pub content_type: &'a str,
    /// The service of the credential scope (`sms`).
    pub service: &'a str,
    /// `X-TC-Timestamp`: Unix seconds.
    pub timestamp: u64,
    /// The JSON body.
    pub body: &'a [u8],
}

/// A computed v3 signature.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Signed {
    /// Hex SHA-256 of the canonical request (the documentation shows it).
    pub hashed_canonical_request: String,
    /// Hex signature.
    pub signature: String,
    /// The `Authorization` header value.
    pub authorization: String,
}

/// `yyyy-MM-dd` (UTC) of a Unix timestamp in seconds: the credential scope's date.
pub fn utc_date(timestamp: u64) -> String {
    let (y, m, d, ..) = crate::time::civil(timestamp.saturating_mul(1000), 0);
    format!("{y:04}-{m:02}-{d:02}")
}

/// The canonical request of `req` (signed headers `content-type;host`).
pub fn canonical_request(req: &Request<'_>) -> String {
    format!(
        "POST\n/\n\ncontent-type:{}\nhost:{}\n\ncontent-type;host\n{}",
        req.content_type.trim().to_ascii_lowercase(),
        req.host.trim().to_ascii_lowercase(),
        sha256_hex(req.body)
    )
}

/// The hex signature of `string_to_sign` for `date` and `service`.
pub fn signature(secret_key: &str, date: &str, service: &str, string_to_sign: &str) -> String {
    let secret_date = hmac_sha256(format!("TC3{secret_key}").as_bytes(), date.as_bytes());
    let secret_service = hmac_sha256(&secret_date, service.as_bytes());
    let secret_signing = hmac_sha256(&secret_service, b"tc3_request");
    hex(&hmac_sha256(&secret_signing, string_to_sign.as_bytes()))
}

/// Signs `req` with the SecretId / SecretKey pair.
pub fn sign_v3(req: &Request<'_>, secret_id: &str, secret_key: &str) -> Signed {
    let hashed_canonical_request = sha256_hex(canonical_request(req).as_bytes());
    let date = utc_date(req.timestamp);
    let scope = format!("{date}/{}/tc3_request", req.service);
    let string_to_sign = format!(
        "{ALGORITHM}\n{}\n{scope}\n{hashed_canonical_request}",
        req.timestamp
    );
    let signature = signature(secret_key, &date, req.service, &string_to_sign);
    let authorization = format!(
        "{ALGORITHM} Credential={secret_id}/{scope}, SignedHeaders=content-type;host, Signature={signature}"
    );
    Signed {
        hashed_canonical_request,
        signature,
        authorization,
    }
}

/// The `SessionContext` of a message: 32 hex digits of the key's SHA-256.
/// Tencent echoes it in SendSms' answer ("server 会原样返回"), in pull results
/// and callbacks only when its SMS support has enabled that; it is never a
/// dedup key.
pub fn session_context(idempotency_key: &str) -> String {
    crate::key_digest(idempotency_key, 32)
}

/// The E.164 form the pull API asks for: SendSms takes a mainland number
/// as `+86…`, `0086…`, `86…` or the bare 11 digits (SendSms,
/// `PhoneNumberSet.N`); the pull API wants `+86…`. Anything else as given.
pub fn e164(recipient: &str) -> String {
    let n = recipient.trim();
    let mainland = |rest: &str| {
        rest.len() == 11 && rest.starts_with('1') && rest.bytes().all(|b| b.is_ascii_digit())
    };
    for prefix in ["+86", "0086", "86", ""] {
        if let Some(rest) = n.strip_prefix(prefix)
            && mainland(rest)
        {
            return format!("+86{rest}");
        }
    }
    n.to_string()
}

/// Sorts an error `Code` of SendSms (call-level `Response.Error.Code`, or a
/// per-number `SendStatusSet[].Code` other than `Ok`) by the documented
/// tables. Tencent's own failures (`InternalError*`) are unknown: the SMS
/// may have been taken ("请求下发短信超时" is advised to be retried, which is
/// not a statement that nothing was sent). Other unknown codes are
/// permanent: they refuse the request, and nothing says a retry would be taken.
pub fn classify(code: &str) -> Refusal {
    use Class::{Permanent, Retryable, Unknown};
    let r = |class| Refusal::new(class, code);
    match code {
        // Clock: refused before anything was taken.
        "AuthFailure.SignatureExpire" | "InternalError.RequestTimeException" => r(Retryable)
            .because("the host's clock is more than 5 minutes off Tencent's; fix the clock"),
        // API rate limits (common codes): not taken, later may work.
        c if c.starts_with("RequestLimitExceeded") => r(Retryable),
        // Frequency policies: not taken, lifted after their period (the
        // console adjusts them). The request for too many numbers is ours.
        "LimitExceeded.PhoneNumberCountLimit" => r(Permanent),
        c if c.starts_with("LimitExceeded.") => r(Retryable),
        // Marketing SMS only between 8:00 and 22:00.
        "FailedOperation.MarketingSendTimeConstraint" => r(Retryable),
        // Account: an operator must pay.
        "UnauthorizedOperation.SerivceSuspendDueToArrears" => {
            r(Permanent).because("the Tencent Cloud account is suspended for arrears")
        }
        "FailedOperation.InsufficientBalanceInSmsPackage" => {
            r(Permanent).because("the SMS package of the Tencent Cloud account is used up")
        }
        // Configuration at Tencent.
        "FailedOperation.SignatureIncorrectOrUnapproved" => {
            r(Permanent).because("the sign name (`sign_name`) is not approved for this account")
        }
        "FailedOperation.TemplateIncorrectOrUnapproved" => {
            r(Permanent).because("the template id is not approved or its parameters do not match")
        }
        "FailedOperation.TemplateUnapprovedOrNotExist" => r(Permanent)
            .because("the template id is not approved or does not exist on this account"),
        "UnauthorizedOperation.SmsSdkAppIdVerifyFail"
        | "UnauthorizedOperation.SdkAppIdIsDisabled"
        | "InvalidParameterValue.SdkAppIdNotExist" => {
            r(Permanent).because("the SMS application (`sdk_app_id`) is unknown or disabled")
        }
        "UnauthorizedOperation.RequestIpNotInWhitelist" => {
            r(Permanent).because("this host's IP address is not on the SMS application's allowlist")
        }
        "AuthFailure.SignatureFailure" => {
            r(Permanent).because("the request signature was refused: check `secret_key`")
        }
        "AuthFailure.SecretIdNotFound" | "AuthFailure.InvalidSecretId" => {
            r(Permanent).because("the SecretId is unknown or disabled: check `secret_id`")
        }
        c if c.starts_with("AuthFailure") => {
            r(Permanent).because("Tencent Cloud refused the credentials (CAM)")
        }
        "InternalError.RestApiInterfaceNotExist" => r(Permanent),
        // Tencent's own failures: nothing documents that the SMS was not
        // taken, so the answer is ambiguous.
        c if c.starts_with("InternalError") => r(Unknown),
        // Recipient, content, request: never.
        _ => r(Permanent),
    }
}

/// One entry of a delivery-report push or a pull result, as far as
/// settling it needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    /// Our `SessionContext` when the report carries one (`ext`), else
    /// Tencent's `SerialNo` (`sid`).
    pub id: String,
    /// `SUCCESS`: delivered to the handset.
    pub delivered: bool,
    /// `errmsg` (`DELIVRD` or the carrier's code).
    pub detail: Option<String>,
}

/// The entries of a delivery-report push body ("短信下发状态通知",
/// <https://cloud.tencent.com/document/api/382/59178>; en
/// <https://www.tencentcloud.com/document/api/382/43547>): a JSON array of
/// `{user_receive_time, nationcode, mobile, report_status, errmsg,
/// description, sid, ext}`, several per push; or what is wrong with it.
pub fn reports(body: &[u8]) -> Result<Vec<Report>, String> {
    let value: serde_json::Value =
        serde_json::from_slice(body).map_err(|e| format!("not JSON: {e}"))?;
    let list = match value {
        serde_json::Value::Array(list) => list,
        serde_json::Value::Object(o) if o.contains_key("text") => {
            return Err(
                "a reply (uplink SMS) push: this channel takes delivery reports only; configure the reply callback elsewhere"
                    .into(),
            );
        }
        _ => return Err("not a JSON array of delivery reports".into()),
    };
    list.iter().map(report).collect()
}

/// One delivery report.
fn report(v: &serde_json::Value) -> Result<Report, String> {
    let field = |k| {
        v.get(k)
            .and_then(serde_json::Value::as_str)
            .filter(|s| !s.is_empty())
    };
    let id = field("ext")
        .or_else(|| field("sid"))
        .ok_or("a report without `sid`")?;
    let delivered = match field("report_status") {
        Some("SUCCESS") => true,
        Some("FAIL") => false,
        _ => return Err("a report whose `report_status` is neither SUCCESS nor FAIL".into()),
    };
    Ok(Report {
        id: id.to_string(),
        delivered,
        detail: field("errmsg").map(str::to_string),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The published example of "Signature v3" (Tencent Cloud SMS, API
    /// documentation, <https://www.tencentcloud.com/document/product/382/40467>):
    /// CVM `DescribeInstances` at timestamp 1551113065, SecretKey
    /// `Gu5t9xGARNpq86cd98joQYCN3EXAMPLE`, the SecretId as the page prints it.
    #[test]
    fn signature_v3_documentation_vector() {
        let body = br#"{"Limit": 1, "Filters": [{"Values": ["\u672a\u547d\u540d"], "Name": "instance-name"}]}"#;
        assert_eq!(
            sha256_hex(body),
            "35e9c5b0e3ae67532d3c9f17ead6c90222632e5b1ff7f6e89887f1398934f064"
        );
        let req = Request {
            host: "cvm.tencentcloudapi.com",
            content_type: "application/json; charset=utf-8",
            service: "cvm",
            timestamp: 1_551_113_065,
            body,
        };
        assert_eq!(
            canonical_request(&req),
            "POST\n/\n\ncontent-type:application/json; charset=utf-8\nhost:cvm.tencentcloudapi.com\n\ncontent-type;host\n35e9c5b0e3ae67532d3c9f17ead6c90222632e5b1ff7f6e89887f1398934f064"
        );
        let signed = sign_v3(
            &req,
            "AKID**********************0123456789EXAMPLE",
            "Gu5t9xGARNpq86cd98joQYCN3EXAMPLE",
        );
        assert_eq!(
            signed.hashed_canonical_request,
            "5ffe6a04c0664d6b969fab9a13bdab201d63ee709638e2749d62a09ca18d7031"
        );
        assert_eq!(
            signed.signature,
            "72e494ea809ad7a8c8f7a4507b9bddcbaa8e581f516e8da2f66e2c5a96525168"
        );
        assert_eq!(
            signed.authorization,
            "TC3-HMAC-SHA256 Credential=AKID**********************0123456789EXAMPLE/2019-02-25/cvm/tc3_request, SignedHeaders=content-type;host, Signature=72e494ea809ad7a8c8f7a4507b9bddcbaa8e581f516e8da2f66e2c5a96525168"
        );
    }

    /// The page's warning: 1551113065 is already 2019-02-26 in UTC+8; the
    /// scope's date is the UTC one.
    #[test]
    fn the_scope_date_is_utc() {
        assert_eq!(utc_date(1_551_113_065), "2019-02-25");
        assert_eq!(utc_date(0), "1970-01-01");
    }

    /// The error table: code → class.
    #[test]
    fn error_table() {
        use Class::*;
        let table = [
            ("InternalError.Timeout", Unknown),
            ("InternalError.SendAndRecvFail", Unknown),
            ("InternalError.OtherError", Unknown),
            ("InternalError.UnknownError", Unknown),
            ("InternalError", Unknown),
            ("InternalError.RequestTimeException", Retryable),
            ("AuthFailure.SignatureExpire", Retryable),
            ("RequestLimitExceeded", Retryable),
            (
                "RequestLimitExceeded.GlobalRegionUinLimitExceeded",
                Retryable,
            ),
            ("LimitExceeded.PhoneNumberThirtySecondLimit", Retryable),
            ("LimitExceeded.PhoneNumberDailyLimit", Retryable),
            ("LimitExceeded.DeliveryFrequencyLimit", Retryable),
            ("LimitExceeded.PhoneNumberCountLimit", Permanent),
            (
                "UnauthorizedOperation.SerivceSuspendDueToArrears",
                Permanent,
            ),
            ("FailedOperation.InsufficientBalanceInSmsPackage", Permanent),
            ("InvalidParameterValue.IncorrectPhoneNumber", Permanent),
            ("FailedOperation.PhoneNumberInBlacklist", Permanent),
            ("FailedOperation.TemplateIncorrectOrUnapproved", Permanent),
            ("FailedOperation.TemplateUnapprovedOrNotExist", Permanent),
            ("AuthFailure.SignatureFailure", Permanent),
            ("AuthFailure.SecretIdNotFound", Permanent),
            (
                "UnsupportedOperation.ContainDomesticAndInternationalPhoneNumber",
                Permanent,
            ),
            ("FailedOperation.SomethingNew", Permanent),
        ];
        for (code, class) in table {
            assert_eq!(classify(code).class, class, "{code}");
        }
        assert!(
            classify("FailedOperation.TemplateUnapprovedOrNotExist")
                .cause
                .unwrap()
                .contains("does not exist")
        );
        assert!(
            classify("AuthFailure.SignatureFailure")
                .cause
                .unwrap()
                .contains("secret_key")
        );
    }

    /// The documentation's example push, a failure, a SessionContext echo and bad entries.
    #[test]
    fn delivery_reports() {
        let body = r#"[{"user_receive_time":"2015-10-17 08:03:04","nationcode":"86","mobile":"13xxxxxxxxx","report_status":"SUCCESS","errmsg":"DELIVRD","description":"用户短信送达成功","sid":"xxxxxxx"},
                      {"report_status":"FAIL","errmsg":"MK:0001","sid":"s2","ext":"ctx-2"}]"#;
        let got = reports(body.as_bytes()).unwrap();
        assert_eq!(got[0].id, "xxxxxxx");
        assert!(got[0].delivered);
        assert_eq!(got[0].detail.as_deref(), Some("DELIVRD"));
        assert_eq!(got[1].id, "ctx-2");
        assert!(!got[1].delivered);
        assert!(
            reports(br#"[{"report_status":"SUCCESS"}]"#)
                .unwrap_err()
                .contains("sid")
        );
        assert!(reports(br#"[{"sid":"1","report_status":"?"}]"#).is_err());
        assert!(
            reports(
                br#"{"extend":"","mobile":"1","nationcode":"86","sign":"s","text":"TD","time":1}"#
            )
            .unwrap_err()
            .contains("reply")
        );
    }

    #[test]
    fn numbers_for_the_pull_api_are_e164() {
        assert_eq!(e164("+8613800000001"), "+8613800000001");
        assert_eq!(e164("008613800000001"), "+8613800000001");
        assert_eq!(e164("8613800000001"), "+8613800000001");
        assert_eq!(e164("13800000001"), "+8613800000001");
        assert_eq!(e164("+85291234567"), "+85291234567");
        assert_eq!(session_context("k").len(), 32);
    }
}
