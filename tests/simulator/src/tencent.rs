//! Tencent Cloud SMS, API 2021-01-11 over API 3.0: `POST /` with a JSON
//! body, the action in `X-TC-Action`, signed with signature v3
//! (`TC3-HMAC-SHA256`, recomputed from the request as received: the
//! credential scope's date must be the UTC date of `X-TC-Timestamp`, which
//! may be at most 5 minutes off). Every error is an HTTP 200 with
//! `Response.Error.{Code,Message}`, as Tencent answers.
//!
//! - `SendSms` is not idempotent (no dedupe parameter; `SessionContext` is
//!   only echoed): every accepted request is a new ledger entry per number,
//!   its id a `SerialNo`. Each number's result is a `SendStatusSet` entry of
//!   the HTTP 200: `Ok`, or its error code (`InvalidParameterValue.IncorrectPhoneNumber`,
//!   or a code from [`crate::Faults::permanent`]). A `TemplateId` or
//!   `SignName` the account has not approved ([`crate::SmsApprovals`]) is
//!   every number's `FailedOperation.TemplateIncorrectOrUnapproved` /
//!   `FailedOperation.SignatureIncorrectOrUnapproved`, nothing sent. Server faults answer
//!   `InternalError.Timeout` (before or, with `error_after_accept`, after the
//!   message was taken), or with [`crate::Faults::gateway_errors`] the
//!   gateway's HTTP 502; rate limits `RequestLimitExceeded`.
//! - `PullSmsSendStatusByPhoneNumber` lists delivery **receipts** only: a
//!   message shows once its report is known
//!   ([`crate::Config::tencent_report_after`]); before, nothing shows.
//!   `SessionContext` is echoed in receipts only when
//!   [`crate::Config::tencent_echo_session_context`] (Tencent's support must
//!   enable it; off by default).
//! - Receipts are the status push ([`crate::receipts`]): a JSON array, no signature.

use crate::ledger::{Dedupe, Incoming, Verdict, cut_off, late, pause};
use crate::{SimState, Unapproved, now_ms, now_secs};
use axum::{
    Json,
    body::Bytes,
    http::{HeaderMap, Method, Uri},
    response::{IntoResponse, Response},
};
use rand::Rng;
use ring::{digest, hmac};
use serde_json::{Value, json};

const PROVIDER: &str = "tencent-sms";
const VERSION: &str = "2021-01-11";
/// The clock skew Tencent accepts ("超过五分钟").
const MAX_SKEW_SECS: i64 = 300;
/// The pull API's reach (7 days).
const PULL_REACH_SECS: i64 = 7 * 86_400;

/// A Tencent error: `Code`, `Message`.
struct TencentError(&'static str, String);

impl TencentError {
    fn new(code: &'static str, message: impl Into<String>) -> Self {
        TencentError(code, message.into())
    }
}

/// The answer Tencent gives for any error: HTTP 200, `Response.Error`.
fn error_response(request_id: &str, e: TencentError) -> Response {
    Json(json!({"Response": {"Error": {"Code": e.0, "Message": e.1}, "RequestId": request_id}}))
        .into_response()
}

fn ok_response(request_id: &str, mut body: Value) -> Response {
    body["RequestId"] = json!(request_id);
    Json(json!({ "Response": body })).into_response()
}

fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

fn sha256_hex(data: &[u8]) -> String {
    hex::encode(digest::digest(&digest::SHA256, data))
}

/// `yyyy-MM-dd` (UTC) of Unix seconds.
pub fn utc_date(secs: i64) -> String {
    let format = time::macros::format_description!("[year]-[month]-[day]");
    time::OffsetDateTime::from_unix_timestamp(secs)
        .unwrap_or(time::OffsetDateTime::UNIX_EPOCH)
        .format(format)
        .unwrap_or_default()
}

/// The derived signing key of `date` and `service`.
fn signing_key(secret_key: &str, date: &str, service: &str) -> hmac::Key {
    let step = |key: &[u8], data: &str| {
        hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, key), data.as_bytes())
            .as_ref()
            .to_vec()
    };
    let k = step(format!("TC3{secret_key}").as_bytes(), date);
    let k = step(&k, service);
    let k = step(&k, "tc3_request");
    hmac::Key::new(hmac::HMAC_SHA256, &k)
}

/// The hex signature of `string_to_sign` (for tests of the documentation's vector).
pub fn signature(secret_key: &str, date: &str, service: &str, string_to_sign: &str) -> String {
    let key = signing_key(secret_key, date, service);
    hex::encode(hmac::sign(&key, string_to_sign.as_bytes()))
}

/// The canonical request of a `POST /` with `headers` = (lower-case name,
/// value) of exactly the signed headers.
pub fn canonical_request(headers: &[(String, String)], body: &[u8]) -> String {
    let mut headers = headers.to_vec();
    headers.sort();
    let canonical: String = headers
        .iter()
        .map(|(k, v)| format!("{k}:{}\n", v.trim().to_ascii_lowercase()))
        .collect();
    let signed: Vec<&str> = headers.iter().map(|(k, _)| k.as_str()).collect();
    format!(
        "POST\n/\n\n{canonical}\n{}\n{}",
        signed.join(";"),
        sha256_hex(body)
    )
}

/// The parts of `Authorization: TC3-HMAC-SHA256 Credential=id/date/service/tc3_request, SignedHeaders=.., Signature=..`.
struct Authorization {
    secret_id: String,
    date: String,
    service: String,
    signed_headers: Vec<String>,
    signature: String,
}

fn parse_authorization(value: &str) -> Option<Authorization> {
    let rest = value.strip_prefix("TC3-HMAC-SHA256 ")?;
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
    let mut scope = credential?.split('/');
    let (secret_id, date, service, end) =
        (scope.next()?, scope.next()?, scope.next()?, scope.next()?);
    (end == "tc3_request" && scope.next().is_none()).then_some(())?;
    Some(Authorization {
        secret_id: secret_id.to_string(),
        date: date.to_string(),
        service: service.to_string(),
        signed_headers: signed?.split(';').map(str::to_string).collect(),
        signature: signature?.to_string(),
    })
}

/// Verifies the request's signature v3 and common headers; its action.
fn verify(
    state: &SimState,
    method: &Method,
    uri: &Uri,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<String, TencentError> {
    if method != Method::POST || uri.path() != "/" || uri.query().is_some() {
        return Err(TencentError::new(
            "InvalidParameter",
            "the simulator takes API 3.0 as POST / with a JSON body",
        ));
    }
    let auth = header(headers, "authorization")
        .and_then(parse_authorization)
        .ok_or_else(|| {
            TencentError::new(
                "AuthFailure.InvalidAuthorization",
                "Authorization is not in TencentCloud's format.",
            )
        })?;
    let creds = state.credentials();
    if auth.secret_id != creds.tencent_secret_id {
        return Err(TencentError::new(
            "AuthFailure.SecretIdNotFound",
            "The SecretId is not found, please ensure that your SecretId is correct.",
        ));
    }
    let timestamp: i64 = header(headers, "x-tc-timestamp")
        .and_then(|t| t.parse().ok())
        .ok_or_else(|| TencentError::new("MissingParameter", "X-TC-Timestamp is missing."))?;
    if (now_secs() - timestamp).abs() > MAX_SKEW_SECS {
        return Err(TencentError::new(
            "AuthFailure.SignatureExpire",
            "Signature expired. Timestamp and server time cannot differ by more than 5 minutes.",
        ));
    }
    for must in ["content-type", "host"] {
        if !auth.signed_headers.iter().any(|h| h == must) {
            return Err(TencentError::new(
                "AuthFailure.InvalidAuthorization",
                format!("SignedHeaders must contain `{must}`."),
            ));
        }
    }
    let host = header(headers, "host")
        .map(str::to_string)
        .or_else(|| uri.authority().map(|a| a.to_string()))
        .unwrap_or_default();
    let signed: Vec<(String, String)> = auth
        .signed_headers
        .iter()
        .map(|name| {
            let value = match name.as_str() {
                "host" => host.clone(),
                n => header(headers, n).unwrap_or("").to_string(),
            };
            (name.clone(), value)
        })
        .collect();
    let canonical = canonical_request(&signed, body);
    let to_sign = format!(
        "TC3-HMAC-SHA256\n{timestamp}\n{}/{}/tc3_request\n{}",
        auth.date,
        auth.service,
        sha256_hex(canonical.as_bytes())
    );
    let key = signing_key(&creds.tencent_secret_key, &auth.date, &auth.service);
    let verified = hex::decode(&auth.signature)
        .is_ok_and(|tag| hmac::verify(&key, to_sign.as_bytes(), &tag).is_ok());
    if !verified || auth.date != utc_date(timestamp) || auth.service != "sms" {
        return Err(TencentError::new(
            "AuthFailure.SignatureFailure",
            "The provided credentials could not be validated. Please check your signature is correct.",
        ));
    }
    if header(headers, "x-tc-version") != Some(VERSION) {
        return Err(TencentError::new(
            "NoSuchVersion",
            "The requested version does not exist.",
        ));
    }
    if header(headers, "x-tc-region").is_none_or(str::is_empty) {
        return Err(TencentError::new(
            "MissingParameter",
            "The Region parameter is required.",
        ));
    }
    Ok(header(headers, "x-tc-action").unwrap_or("").to_string())
}

/// `POST /` with `X-TC-Action`.
pub async fn handle(
    state: SimState,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let request_id = crate::ledger::uuid(rand::rng().random());
    let action = match verify(&state, &method, &uri, &headers, &body) {
        Ok(a) => a,
        Err(e) => {
            state.lock().count(PROVIDER, "bad_signature");
            return error_response(&request_id, e);
        }
    };
    let Ok(params) = serde_json::from_slice::<Value>(&body) else {
        return error_response(
            &request_id,
            TencentError::new("InvalidParameter", "The request body is not JSON."),
        );
    };
    let answer = match action.as_str() {
        "SendSms" => send(&state, &params, &request_id).await,
        "PullSmsSendStatusByPhoneNumber" => pull(&state, &params, &request_id),
        other => Err(TencentError::new(
            "InvalidAction",
            format!("The action `{other}` does not exist."),
        )),
    };
    answer.unwrap_or_else(|e| error_response(&request_id, e))
}

/// The E.164 form of a number SendSms takes (`+86…`, `0086…`, `86…` or 11
/// mainland digits), or `None` when it is not a phone number.
pub fn e164(n: &str) -> Option<String> {
    let mainland =
        |r: &str| r.len() == 11 && r.starts_with('1') && r.bytes().all(|b| b.is_ascii_digit());
    for prefix in ["+86", "0086", "86", ""] {
        if let Some(rest) = n.strip_prefix(prefix)
            && mainland(rest)
        {
            return Some(format!("+86{rest}"));
        }
    }
    let digits = n.strip_prefix('+')?;
    (!digits.starts_with("86")
        && (6..=15).contains(&digits.len())
        && digits.bytes().all(|b| b.is_ascii_digit()))
    .then(|| n.to_string())
}

fn app_id_ok(state: &SimState, params: &Value) -> Result<(), TencentError> {
    match params.get("SmsSdkAppId").and_then(Value::as_str) {
        Some(id) if id == state.credentials().tencent_sdk_app_id => Ok(()),
        Some(_) => Err(TencentError::new(
            "InvalidParameterValue.SdkAppIdNotExist",
            "SdkAppId does not exist.",
        )),
        None => Err(TencentError::new(
            "MissingParameter",
            "SmsSdkAppId is required.",
        )),
    }
}

async fn send(
    state: &SimState,
    params: &Value,
    request_id: &str,
) -> Result<Response, TencentError> {
    let numbers: Vec<String> = params
        .get("PhoneNumberSet")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default();
    if numbers.is_empty() {
        return Err(TencentError::new(
            "MissingParameter.EmptyPhoneNumberSet",
            "The PhoneNumberSet is empty.",
        ));
    }
    if numbers.len() > 200 {
        return Err(TencentError::new(
            "LimitExceeded.PhoneNumberCountLimit",
            "More than 200 phone numbers in one request.",
        ));
    }
    app_id_ok(state, params)?;
    let template = params
        .get("TemplateId")
        .and_then(Value::as_str)
        .filter(|t| !t.is_empty())
        .ok_or_else(|| TencentError::new("MissingParameter", "TemplateId is required."))?;
    let sign = params.get("SignName").and_then(Value::as_str).unwrap_or("");
    let domestic = numbers
        .iter()
        .any(|n| e164(n).is_some_and(|e| e.starts_with("+86")));
    if domestic && sign.is_empty() {
        return Err(TencentError::new(
            "MissingParameter",
            "SignName is required for mainland China numbers.",
        ));
    }
    let template_params = params.get("TemplateParamSet").cloned().unwrap_or(json!([]));
    let context = params
        .get("SessionContext")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let refusal = state
        .lock()
        .unapproved(PROVIDER, template, Some(sign).filter(|s| !s.is_empty()));
    if let Some(refusal) = refusal {
        // A template or sign name the account has not approved: each
        // number's result says so inside the HTTP 200, nothing is sent
        // (docs/providers.md, "Tencent Cloud SMS").
        let (code, message) = match refusal {
            Unapproved::SignName => (
                "FailedOperation.SignatureIncorrectOrUnapproved",
                "签名未审批或格式错误。",
            ),
            Unapproved::Template => (
                "FailedOperation.TemplateIncorrectOrUnapproved",
                "模板未审批或内容不匹配。",
            ),
        };
        let statuses: Vec<Value> = numbers
            .iter()
            .map(|n| send_status(n, &context, code, message, ""))
            .collect();
        return Ok(ok_response(
            request_id,
            json!({ "SendStatusSet": statuses }),
        ));
    }
    pause(state, PROVIDER).await;
    let mut sim = state.lock();
    let valid: Vec<&String> = numbers.iter().filter(|n| e164(n).is_some()).collect();
    let verdict = match valid.first() {
        Some(first) => sim.roll(PROVIDER, first),
        None => Verdict::Accept {
            drop: false,
            fail: false,
        },
    };
    let timeout = || {
        TencentError::new(
            "InternalError.Timeout",
            "请求下发短信超时,请参考60008错误详解。",
        )
    };
    let permanent = sim
        .faults
        .get(PROVIDER)
        .map(|f| f.permanent.clone())
        .unwrap_or_default();
    let gateway = sim.faults.get(PROVIDER).is_some_and(|f| f.gateway_errors);
    let server_error = move |request_id: &str| -> Response {
        if gateway {
            (
                axum::http::StatusCode::BAD_GATEWAY,
                [("content-type", "text/html")],
                "<html><body><h1>502 Bad Gateway</h1></body></html>",
            )
                .into_response()
        } else {
            error_response(request_id, timeout())
        }
    };
    let (cut, fail) = match verdict {
        Verdict::ServerError => return Ok(server_error(request_id)),
        Verdict::RateLimited => {
            return Err(TencentError::new(
                "RequestLimitExceeded",
                "Your current request times equals to `3000` in a second.",
            ));
        }
        Verdict::DropBeforeAccept => return Ok(cut_off()),
        Verdict::Permanent(_) => (false, false),
        Verdict::Accept { drop, fail } => (drop, fail),
    };
    let mut statuses = Vec::new();
    let mut receipts = None;
    let mut accepted = Vec::new();
    let mut took_any = false;
    for number in &numbers {
        let status = |code: &str, message: &str, serial: &str| {
            send_status(number, &context, code, message, serial)
        };
        if e164(number).is_none() {
            statuses.push(status(
                "InvalidParameterValue.IncorrectPhoneNumber",
                "手机号格式错误",
                "",
            ));
            continue;
        }
        if let Some(code) = permanent.get(number.as_str()) {
            statuses.push(status(code, "refused for this number", ""));
            continue;
        }
        let outcome = sim.accept(
            PROVIDER,
            Incoming {
                id: None,
                reference: Some(context.clone()).filter(|c| !c.is_empty()),
                key: None,
                recipient: number.clone(),
                template: template.to_string(),
                params: json!({"SignName": sign, "TemplateParamSet": template_params}),
            },
            Dedupe::Never,
        );
        took_any = true;
        statuses.push(status("Ok", "send success", &outcome.id));
        if let Some((config, m)) = outcome.receipt {
            receipts = Some(config);
            accepted.push(m);
        }
    }
    let after_accept = if took_any {
        sim.slow_after_accept(PROVIDER)
    } else {
        std::time::Duration::ZERO
    };
    std::mem::drop(sim);
    if let Some(config) = receipts {
        state.spawn_receipts(PROVIDER, config, accepted);
    }
    let answer = if cut {
        cut_off()
    } else if fail {
        server_error(request_id)
    } else {
        ok_response(request_id, json!({ "SendStatusSet": statuses }))
    };
    Ok(late(answer, after_accept))
}

/// One number's `SendStatusSet` entry: `Fee` 1 when it was sent (a
/// `serial`), 0 when refused.
fn send_status(number: &str, context: &str, code: &str, message: &str, serial: &str) -> Value {
    json!({"SerialNo": serial, "PhoneNumber": e164(number).unwrap_or_else(|| number.to_string()),
           "Fee": if serial.is_empty() { 0 } else { 1 }, "SessionContext": context,
           "Code": code, "Message": message, "IsoCode": "CN"})
}

fn pull(state: &SimState, params: &Value, request_id: &str) -> Result<Response, TencentError> {
    app_id_ok(state, params)?;
    let phone = params
        .get("PhoneNumber")
        .and_then(Value::as_str)
        .ok_or_else(|| TencentError::new("MissingParameter", "PhoneNumber is required."))?;
    let begin = params
        .get("BeginTime")
        .and_then(Value::as_i64)
        .ok_or_else(|| TencentError::new("MissingParameter", "BeginTime is required."))?;
    if begin < now_secs() - PULL_REACH_SECS {
        return Err(TencentError::new(
            "InvalidParameterValue",
            "BeginTime may be at most 7 days back.",
        ));
    }
    let end = params.get("EndTime").and_then(Value::as_i64);
    if params.get("Offset").and_then(Value::as_i64) != Some(0) {
        return Err(TencentError::new(
            "InvalidParameterValue",
            "Offset must be 0.",
        ));
    }
    let limit = params
        .get("Limit")
        .and_then(Value::as_u64)
        .filter(|l| (1..=100).contains(l))
        .ok_or_else(|| TencentError::new("InvalidParameterValue", "Limit must be 1 to 100."))?;
    let mut sim = state.lock();
    if sim.query_fails(PROVIDER) {
        return Err(TencentError::new("InternalError", "内部错误。"));
    }
    sim.count(PROVIDER, "query");
    let reported_by = now_ms().saturating_sub(state.config.tencent_report_after.as_millis() as u64);
    let echo = state.config.tencent_echo_session_context;
    let rows: Vec<Value> = sim.ledger[PROVIDER]
        .iter()
        // Receipts only: a message whose report is not known yet is in no API.
        .filter(|m| m.accepted_at_ms <= reported_by)
        .filter(|m| e164(&m.recipient).as_deref() == Some(phone))
        .filter(|m| (m.accepted_at_ms / 1000) as i64 >= begin)
        .filter(|m| end.is_none_or(|e| (m.accepted_at_ms / 1000) as i64 <= e))
        .take(limit as usize)
        .map(|m| {
            let ok = m.delivery == crate::Delivery::Delivered;
            json!({
                "UserReceiveTime": (m.accepted_at_ms + 1000) / 1000,
                "CountryCode": "86",
                "SubscriberNumber": phone.trim_start_matches("+86"),
                "PhoneNumber": phone,
                "SerialNo": m.id,
                "ReportStatus": if ok { "SUCCESS" } else { "FAIL" },
                "Description": if ok { "DELIVRD" } else { "UNDELIV" },
                "SessionContext": if echo { m.reference.clone().unwrap_or_default() } else { String::new() },
            })
        })
        .collect();
    Ok(ok_response(
        request_id,
        json!({ "PullSmsSendStatusSet": rows }),
    ))
}

/// One entry of the status push, as Tencent posts it (`ext` only when the
/// SessionContext echo is enabled).
pub fn report(m: &crate::Accepted, echo: bool) -> Value {
    let ok = m.delivery == crate::Delivery::Delivered;
    let number = e164(&m.recipient).unwrap_or_else(|| m.recipient.clone());
    let mut entry = json!({
        "user_receive_time": crate::aliyun::china_time(crate::now_ms()),
        "nationcode": "86",
        "mobile": number.trim_start_matches("+86"),
        "report_status": if ok { "SUCCESS" } else { "FAIL" },
        "errmsg": if ok { "DELIVRD" } else { "UNDELIV" },
        "description": if ok { "用户短信送达成功" } else { "用户短信未送达" },
        "sid": m.id,
    });
    if echo && let Some(r) = &m.reference {
        entry["ext"] = json!(r);
    }
    entry
}

#[cfg(test)]
mod tests {
    use super::*;

    /// "Signature v3", the documentation's example (CVM DescribeInstances).
    #[test]
    fn documentation_vector() {
        let headers = [
            (
                "content-type".to_string(),
                "application/json; charset=utf-8".to_string(),
            ),
            ("host".to_string(), "cvm.tencentcloudapi.com".to_string()),
        ];
        let body = br#"{"Limit": 1, "Filters": [{"Values": ["\u672a\u547d\u540d"], "Name": "instance-name"}]}"#;
        let canonical = canonical_request(&headers, body);
        let hashed = sha256_hex(canonical.as_bytes());
        assert_eq!(
            hashed,
            "5ffe6a04c0664d6b969fab9a13bdab201d63ee709638e2749d62a09ca18d7031"
        );
        let to_sign = format!("TC3-HMAC-SHA256\n1551113065\n2019-02-25/cvm/tc3_request\n{hashed}");
        assert_eq!(
            signature(
                "Gu5t9xGARNpq86cd98joQYCN3EXAMPLE",
                "2019-02-25",
                "cvm",
                &to_sign
            ),
            "72e494ea809ad7a8c8f7a4507b9bddcbaa8e581f516e8da2f66e2c5a96525168"
        );
        assert_eq!(utc_date(1_551_113_065), "2019-02-25");
    }

    #[test]
    fn numbers() {
        assert_eq!(e164("13800000001").as_deref(), Some("+8613800000001"));
        assert_eq!(e164("008613800000001").as_deref(), Some("+8613800000001"));
        assert_eq!(e164("+85291234567").as_deref(), Some("+85291234567"));
        assert_eq!(e164("+86abc"), None);
        assert_eq!(e164("+8612"), None);
        assert_eq!(e164("12345"), None);
    }
}
