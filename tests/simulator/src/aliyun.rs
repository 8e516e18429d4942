//! Aliyun SMS, dysmsapi 2017-05-25, RPC style: `POST /?<params>` with the
//! action in `x-acs-action`, signed with V3 `ACS3-HMAC-SHA256` (recomputed
//! from the request as received), or the deprecated V2 HMAC-SHA1 signature in
//! the parameters. Date skew over 15 minutes and a reused nonce are refused.
//!
//! `SendSms` is not idempotent (Aliyun SMS API reference: the same request
//! twice sends twice; `OutId` is only echoed in receipts and queries): every
//! accepted request is a new ledger entry per phone number.
//! `QuerySendDetails` shows a message only after [`crate::Config::query_lag`].
//! A `TemplateCode` or `SignName` the account has not approved
//! ([`crate::SmsApprovals`]) is refused `isv.SMS_TEMPLATE_ILLEGAL` /
//! `isv.SMS_SIGNATURE_ILLEGAL` in an HTTP 200, and nothing is sent.

use crate::ledger::{Dedupe, Incoming, Verdict, cut_off, late, pause, with_retry_after};
use crate::{SimState, Unapproved, now_secs};
use axum::{
    Json,
    body::Bytes,
    http::{HeaderMap, Method, StatusCode, Uri},
    response::{IntoResponse, Response},
};
use base64::Engine;
use rand::Rng;
use ring::{digest, hmac};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::time::Duration;
use time::{OffsetDateTime, PrimitiveDateTime, UtcOffset, macros::format_description};

const PROVIDER: &str = "aliyun-sms";
const VERSION: &str = "2017-05-25";

/// An Aliyun error answer: HTTP status, `Code`, `Message`.
#[derive(Debug)]
pub struct AliyunError(pub StatusCode, pub &'static str, pub String);

impl AliyunError {
    fn bad(code: &'static str, message: impl Into<String>) -> Self {
        AliyunError(StatusCode::BAD_REQUEST, code, message.into())
    }

    fn into_response(self, request_id: &str) -> Response {
        let AliyunError(status, code, message) = self;
        (
            status,
            Json(
                json!({"RequestId": request_id, "HostId": "dysmsapi.aliyuncs.com",
                        "Code": code, "Message": message}),
            ),
        )
            .into_response()
    }
}

/// RFC 3986 percent-encoding as Aliyun signs it (unreserved kept, `%XX` upper case).
pub fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes.get(i + 1..i + 3).and_then(|h| {
            std::str::from_utf8(h)
                .ok()
                .and_then(|h| u8::from_str_radix(h, 16).ok())
        });
        match (bytes[i], hex) {
            (b'%', Some(v)) => {
                out.push(v);
                i += 3;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Decoded `k=v` pairs of a raw query string or form body.
pub fn parse_pairs(raw: &str) -> Vec<(String, String)> {
    raw.split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (percent_decode(k), percent_decode(v))
        })
        .collect()
}

/// The canonical query: pairs encoded, sorted, joined with `&`.
pub fn canonical_query(pairs: &[(String, String)]) -> String {
    let mut encoded: Vec<(String, String)> = pairs
        .iter()
        .map(|(k, v)| (percent_encode(k), percent_encode(v)))
        .collect();
    encoded.sort();
    encoded
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join("&")
}

fn sha256_hex(data: &[u8]) -> String {
    hex::encode(digest::digest(&digest::SHA256, data))
}

/// The V3 canonical request. `headers` are (lower-case name, value) of
/// exactly the signed headers.
pub fn v3_canonical_request(
    method: &str,
    path: &str,
    query: &[(String, String)],
    headers: &[(String, String)],
    body: &[u8],
) -> String {
    let mut headers = headers.to_vec();
    headers.sort();
    let canonical_headers: String = headers
        .iter()
        .map(|(k, v)| format!("{k}:{}\n", v.trim()))
        .collect();
    let signed: Vec<&str> = headers.iter().map(|(k, _)| k.as_str()).collect();
    format!(
        "{method}\n{path}\n{}\n{canonical_headers}\n{}\n{}",
        canonical_query(query),
        signed.join(";"),
        sha256_hex(body)
    )
}

/// The V3 signature (hex) of a canonical request.
pub fn v3_signature(secret: &str, canonical_request: &str) -> String {
    let to_sign = format!(
        "ACS3-HMAC-SHA256\n{}",
        sha256_hex(canonical_request.as_bytes())
    );
    let key = hmac::Key::new(hmac::HMAC_SHA256, secret.as_bytes());
    hex::encode(hmac::sign(&key, to_sign.as_bytes()))
}

/// True if `signature_hex` is the V3 signature of `canonical_request`
/// (compared in constant time by ring).
fn v3_verify(secret: &str, canonical_request: &str, signature_hex: &str) -> bool {
    let to_sign = format!(
        "ACS3-HMAC-SHA256\n{}",
        sha256_hex(canonical_request.as_bytes())
    );
    let key = hmac::Key::new(hmac::HMAC_SHA256, secret.as_bytes());
    hex::decode(signature_hex).is_ok_and(|tag| hmac::verify(&key, to_sign.as_bytes(), &tag).is_ok())
}

/// The V2 (HMAC-SHA1) signature, base64, of the parameters (without `Signature`).
pub fn v2_signature(method: &str, params: &[(String, String)], secret: &str) -> String {
    let to_sign = format!(
        "{method}&{}&{}",
        percent_encode("/"),
        percent_encode(&canonical_query(params))
    );
    let key = hmac::Key::new(
        hmac::HMAC_SHA1_FOR_LEGACY_USE_ONLY,
        format!("{secret}&").as_bytes(),
    );
    base64::engine::general_purpose::STANDARD.encode(hmac::sign(&key, to_sign.as_bytes()))
}

/// The parts of `Authorization: ACS3-HMAC-SHA256 Credential=..,SignedHeaders=..,Signature=..`.
struct Authorization {
    access_key_id: String,
    signed_headers: Vec<String>,
    signature: String,
}

fn parse_authorization(value: &str) -> Option<Authorization> {
    let rest = value.strip_prefix("ACS3-HMAC-SHA256 ")?;
    let mut fields = BTreeMap::new();
    for part in rest.split(',') {
        let (k, v) = part.trim().split_once('=')?;
        fields.insert(k, v);
    }
    Some(Authorization {
        access_key_id: fields.get("Credential")?.to_string(),
        signed_headers: fields
            .get("SignedHeaders")?
            .split(';')
            .map(str::to_string)
            .collect(),
        signature: fields.get("Signature")?.to_string(),
    })
}

fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

/// The request as received, for verification.
struct Request<'a> {
    method: &'a Method,
    uri: &'a Uri,
    headers: &'a HeaderMap,
    body: &'a [u8],
}

impl Request<'_> {
    /// `host` as sent: the Host header (HTTP/1.1) or `:authority` (HTTP/2).
    fn host(&self) -> String {
        header(self.headers, "host")
            .map(str::to_string)
            .or_else(|| self.uri.authority().map(|a| a.to_string()))
            .unwrap_or_default()
    }

    fn query(&self) -> Vec<(String, String)> {
        parse_pairs(self.uri.query().unwrap_or(""))
    }
}

/// Verifies a V3-signed request; returns its parameters and action.
fn verify_v3(
    state: &SimState,
    req: &Request,
    auth: &str,
) -> Result<(BTreeMap<String, String>, String), AliyunError> {
    let auth = parse_authorization(auth).ok_or_else(|| {
        AliyunError::bad(
            "IncompleteSignature",
            "The request signature does not conform to Aliyun standards.",
        )
    })?;
    let creds = state.credentials();
    if auth.access_key_id != creds.aliyun_access_key_id {
        return Err(AliyunError(
            StatusCode::NOT_FOUND,
            "InvalidAccessKeyId.NotFound",
            "Specified access key is not found.".into(),
        ));
    }
    let must_sign =
        |name: &str| name == "host" || name.starts_with("x-acs-") || name == "content-type";
    let present: Vec<String> = req
        .headers
        .keys()
        .map(|k| k.as_str().to_string())
        .chain(std::iter::once("host".to_string()))
        .filter(|k| must_sign(k))
        .collect();
    if let Some(missing) = present.iter().find(|h| !auth.signed_headers.contains(h)) {
        return Err(AliyunError::bad(
            "IncompleteSignature",
            format!("The header `{missing}` must be signed."),
        ));
    }
    let signed: Vec<(String, String)> = auth
        .signed_headers
        .iter()
        .map(|name| {
            let value = match name.as_str() {
                "host" => req.host(),
                n => header(req.headers, n).unwrap_or("").to_string(),
            };
            (name.clone(), value)
        })
        .collect();
    if header(req.headers, "x-acs-content-sha256") != Some(sha256_hex(req.body).as_str()) {
        return Err(AliyunError::bad(
            "SignatureDoesNotMatch",
            "x-acs-content-sha256 is not the SHA-256 of the body.",
        ));
    }
    let query = req.query();
    let canonical = v3_canonical_request(
        req.method.as_str(),
        req.uri.path(),
        &query,
        &signed,
        req.body,
    );
    if !v3_verify(&creds.aliyun_access_key_secret, &canonical, &auth.signature) {
        return Err(AliyunError::bad(
            "SignatureDoesNotMatch",
            "Specified signature does not match our calculation.",
        ));
    }
    check_fresh(
        state,
        header(req.headers, "x-acs-date"),
        header(req.headers, "x-acs-signature-nonce"),
    )?;
    if header(req.headers, "x-acs-version") != Some(VERSION) {
        return Err(AliyunError::bad(
            "InvalidVersion",
            "Specified parameter Version is not valid.",
        ));
    }
    let action = header(req.headers, "x-acs-action")
        .unwrap_or("")
        .to_string();
    Ok((query.into_iter().collect(), action))
}

/// Verifies a V2-signed request (parameters in the query, or a form body).
fn verify_v2(
    state: &SimState,
    req: &Request,
) -> Result<(BTreeMap<String, String>, String), AliyunError> {
    let mut pairs = req.query();
    if req.method == Method::POST {
        pairs.extend(parse_pairs(&String::from_utf8_lossy(req.body)));
    }
    let mut params: BTreeMap<String, String> = pairs.into_iter().collect();
    let signature = params.remove("Signature").unwrap_or_default();
    let creds = state.credentials();
    if params.get("AccessKeyId") != Some(&creds.aliyun_access_key_id) {
        return Err(AliyunError(
            StatusCode::NOT_FOUND,
            "InvalidAccessKeyId.NotFound",
            "Specified access key is not found.".into(),
        ));
    }
    let list: Vec<(String, String)> = params.clone().into_iter().collect();
    let expected = v2_signature(req.method.as_str(), &list, &creds.aliyun_access_key_secret);
    if params.get("SignatureMethod").map(String::as_str) != Some("HMAC-SHA1")
        || expected != signature
    {
        return Err(AliyunError::bad(
            "SignatureDoesNotMatch",
            "Specified signature does not match our calculation.",
        ));
    }
    check_fresh(
        state,
        params.get("Timestamp").map(String::as_str),
        params.get("SignatureNonce").map(String::as_str),
    )?;
    if params.get("Version").map(String::as_str) != Some(VERSION) {
        return Err(AliyunError::bad(
            "InvalidVersion",
            "Specified parameter Version is not valid.",
        ));
    }
    let action = params.get("Action").cloned().unwrap_or_default();
    Ok((params, action))
}

/// Refuses a date more than the allowed skew off, and a nonce seen before.
fn check_fresh(
    state: &SimState,
    date: Option<&str>,
    nonce: Option<&str>,
) -> Result<(), AliyunError> {
    let format = format_description!("[year]-[month]-[day]T[hour]:[minute]:[second]Z");
    let at = date
        .and_then(|d| PrimitiveDateTime::parse(d, format).ok())
        .ok_or_else(|| {
            AliyunError::bad(
                "InvalidTimeStamp.Format",
                "Specified time stamp or date value is not well formatted.",
            )
        })?
        .assume_utc()
        .unix_timestamp();
    if (now_secs() - at).unsigned_abs() > state.config.aliyun_max_skew.as_secs() {
        return Err(AliyunError::bad(
            "InvalidTimeStamp.Expired",
            "Specified time stamp or date value is expired.",
        ));
    }
    let nonce = nonce.filter(|n| !n.is_empty()).ok_or_else(|| {
        AliyunError::bad(
            "MissingSignatureNonce",
            "SignatureNonce is mandatory for this action.",
        )
    })?;
    if !state.lock().aliyun_nonces.insert(nonce.to_string()) {
        return Err(AliyunError::bad(
            "SignatureNonceUsed",
            "Specified signature nonce was used already.",
        ));
    }
    Ok(())
}

/// Everything is `POST /` (or GET for V2), routed here by [`crate::app`].
pub(crate) async fn handle(
    state: SimState,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let request_id = crate::ledger::uuid(rand::rng().random()).to_uppercase();
    let req = Request {
        method: &method,
        uri: &uri,
        headers: &headers,
        body: &body,
    };
    let verified = match header(&headers, "authorization") {
        Some(auth) => verify_v3(&state, &req, auth),
        None if req.query().iter().any(|(k, _)| k == "Signature")
            || method == Method::POST && !body.is_empty() =>
        {
            verify_v2(&state, &req)
        }
        None => Err(AliyunError::bad(
            "MissingAuthorization",
            "Authorization is mandatory.",
        )),
    };
    let (params, action) = match verified {
        Ok(v) => v,
        Err(e) => {
            state.lock().count(PROVIDER, "bad_signature");
            return e.into_response(&request_id);
        }
    };
    let answer = match action.as_str() {
        "SendSms" => send(&state, &params, &request_id).await,
        "QuerySendDetails" => query(&state, &params, &request_id),
        other => Err(AliyunError(
            StatusCode::NOT_FOUND,
            "InvalidAction.NotFound",
            format!("Specified api `{other}` is not found."),
        )),
    };
    answer.unwrap_or_else(|e| e.into_response(&request_id))
}

fn required<'a>(
    params: &'a BTreeMap<String, String>,
    name: &'static str,
    code: &'static str,
) -> Result<&'a str, AliyunError> {
    params
        .get(name)
        .map(String::as_str)
        .filter(|v| !v.is_empty())
        .ok_or_else(|| AliyunError::bad(code, format!("{name} is mandatory for this action.")))
}

fn ok_body(request_id: &str, code: &str, message: &str) -> Response {
    Json(json!({"Code": code, "Message": message, "RequestId": request_id})).into_response()
}

async fn send(
    state: &SimState,
    params: &BTreeMap<String, String>,
    request_id: &str,
) -> Result<Response, AliyunError> {
    let phones = required(params, "PhoneNumbers", "MissingPhoneNumbers")?;
    let sign = required(params, "SignName", "MissingSignName")?;
    let template = required(params, "TemplateCode", "MissingTemplateCode")?;
    let template_param: Value = match params.get("TemplateParam") {
        Some(p) => match serde_json::from_str::<Value>(p) {
            Ok(v) if v.is_object() => v,
            _ => {
                return Ok(ok_body(
                    request_id,
                    "isv.INVALID_JSON_PARAM",
                    "JSON参数不合法，只接受字符串值",
                ));
            }
        },
        None => json!({}),
    };
    let numbers: Vec<&str> = phones.split(',').map(str::trim).collect();
    if numbers.iter().any(|n| {
        n.is_empty()
            || !n
                .trim_start_matches('+')
                .bytes()
                .all(|b| b.is_ascii_digit())
    }) {
        return Ok(ok_body(
            request_id,
            "isv.MOBILE_NUMBER_ILLEGAL",
            "非法手机号",
        ));
    }
    // A template or sign name the account has not approved: refused in a
    // 200, nothing sent (docs/providers.md, "Aliyun SMS").
    let refusal = state.lock().unapproved(PROVIDER, template, Some(sign));
    match refusal {
        Some(Unapproved::SignName) => {
            return Ok(ok_body(
                request_id,
                "isv.SMS_SIGNATURE_ILLEGAL",
                "签名不合法(不存在或被拉黑)",
            ));
        }
        Some(Unapproved::Template) => {
            return Ok(ok_body(
                request_id,
                "isv.SMS_TEMPLATE_ILLEGAL",
                "模板不合法(不存在或被拉黑)",
            ));
        }
        None => {}
    }
    pause(state, PROVIDER).await;
    let mut sim = state.lock();
    let verdict = sim.roll(PROVIDER, phones);
    let retry_after = sim.retry_after(PROVIDER);
    let server_error = || {
        with_retry_after(
            AliyunError(
                StatusCode::SERVICE_UNAVAILABLE,
                "ServiceUnavailable",
                "The request has failed due to a temporary failure of the server.".into(),
            )
            .into_response(request_id),
            retry_after,
        )
    };
    Ok(match verdict {
        Verdict::ServerError => server_error(),
        Verdict::RateLimited => ok_body(request_id, "isv.BUSINESS_LIMIT_CONTROL", "业务限流"),
        Verdict::Permanent(code) => ok_body(request_id, &code, "refused for this recipient"),
        Verdict::DropBeforeAccept => cut_off(),
        Verdict::Accept { drop: cut, fail } => {
            let mut biz_id = None;
            let mut receipts = None;
            let mut accepted = Vec::new();
            for number in numbers {
                let outcome = sim.accept(
                    PROVIDER,
                    Incoming {
                        id: biz_id.clone(),
                        reference: params.get("OutId").cloned(),
                        key: None,
                        recipient: number.to_string(),
                        template: template.to_string(),
                        params: json!({"SignName": sign, "TemplateParam": template_param}),
                    },
                    Dedupe::Never,
                );
                biz_id = Some(outcome.id);
                if let Some((config, m)) = outcome.receipt {
                    receipts = Some(config);
                    accepted.push(m);
                }
            }
            let after_accept = sim.slow_after_accept(PROVIDER);
            std::mem::drop(sim);
            if let Some(config) = receipts {
                state.spawn_receipts(PROVIDER, config, accepted);
            }
            let answer = if cut {
                cut_off()
            } else if fail {
                server_error()
            } else {
                Json(json!({"Code": "OK", "Message": "OK", "BizId": biz_id, "RequestId": request_id}))
                    .into_response()
            };
            late(answer, after_accept)
        }
    })
}

/// China Standard Time, in which Aliyun reports dates.
fn china(at_ms: u64) -> OffsetDateTime {
    let offset = UtcOffset::from_hms(8, 0, 0).unwrap_or(UtcOffset::UTC);
    OffsetDateTime::from_unix_timestamp((at_ms / 1000) as i64)
        .unwrap_or(OffsetDateTime::UNIX_EPOCH)
        .to_offset(offset)
}

/// `yyyy-MM-dd HH:mm:ss`, China time.
pub fn china_time(at_ms: u64) -> String {
    let format = format_description!("[year]-[month]-[day] [hour]:[minute]:[second]");
    china(at_ms).format(format).unwrap_or_default()
}

fn query(
    state: &SimState,
    params: &BTreeMap<String, String>,
    request_id: &str,
) -> Result<Response, AliyunError> {
    let phone = required(params, "PhoneNumber", "MissingPhoneNumber")?;
    let date = required(params, "SendDate", "MissingSendDate")?;
    let size: usize = required(params, "PageSize", "MissingPageSize")?
        .parse()
        .ok()
        .filter(|n| (1..=50).contains(n))
        .ok_or_else(|| AliyunError::bad("InvalidPageSize", "PageSize must be between 1 and 50."))?;
    let page: usize = required(params, "CurrentPage", "MissingCurrentPage")?
        .parse()
        .ok()
        .filter(|n| *n >= 1)
        .ok_or_else(|| AliyunError::bad("InvalidCurrentPage", "CurrentPage must be at least 1."))?;
    let format = format_description!("[year][month][day]");
    let day = time::Date::parse(date, format)
        .map_err(|_| AliyunError::bad("InvalidSendDate", "SendDate must be yyyyMMdd."))?;
    let today = china(crate::now_ms()).date();
    if day > today || (today - day).whole_days() > 30 {
        return Ok(ok_body(
            request_id,
            "isv.INVALID_PARAMETERS",
            "SendDate must be within the last 30 days",
        ));
    }
    let mut sim = state.lock();
    if sim.query_fails(PROVIDER) {
        return Ok(with_retry_after(
            AliyunError(
                StatusCode::SERVICE_UNAVAILABLE,
                "ServiceUnavailable",
                "The request has failed due to a temporary failure of the server.".into(),
            )
            .into_response(request_id),
            sim.retry_after(PROVIDER),
        ));
    }
    sim.count(PROVIDER, "query");
    let visible_before = crate::now_ms().saturating_sub(state.config.query_lag.as_millis() as u64);
    let rows: Vec<Value> = sim.ledger[PROVIDER]
        .iter()
        // QuerySendDetails asks for the 11-digit number: a number sent with
        // a `+86` / `0086` / `86` prefix is found only by its 11 digits.
        .filter(|m| national(&m.recipient) == phone && china(m.accepted_at_ms).date() == day)
        .filter(|m| m.accepted_at_ms <= visible_before)
        .filter(|m| params.get("BizId").is_none_or(|b| *b == m.id))
        .map(|m| query_row(m, state.config.aliyun_report_after))
        .collect();
    let total = rows.len();
    let page_rows: Vec<Value> = rows
        .into_iter()
        .skip((page - 1) * size)
        .take(size)
        .collect();
    Ok(Json(
        json!({"Code": "OK", "Message": "OK", "RequestId": request_id, "TotalCount": total,
                   "SmsSendDetailDTOs": {"SmsSendDetailDTO": page_rows}}),
    )
    .into_response())
}

/// The 11-digit mainland number of a SendSms recipient (prefix `+86`,
/// `0086` or `86` dropped); other numbers as given.
fn national(number: &str) -> &str {
    for prefix in ["+86", "0086", "86"] {
        if let Some(rest) = number.strip_prefix(prefix)
            && rest.len() == 11
            && rest.starts_with('1')
        {
            return rest;
        }
    }
    number
}

/// A QuerySendDetails row: `SendStatus` 1 (waiting for the receipt) until
/// the delivery report is known, `report_after` after acceptance; then 3
/// (delivered) or 2 (failed).
fn query_row(m: &crate::Accepted, report_after: Duration) -> Value {
    let reported = m.accepted_at_ms + report_after.as_millis() as u64 <= crate::now_ms();
    let (status, err) = match m.delivery {
        _ if !reported => (1, ""),
        crate::Delivery::Delivered => (3, "DELIVERED"),
        crate::Delivery::Failed => (2, "UNDELIVERABLE"),
    };
    let sign = m.params["SignName"].as_str().unwrap_or("");
    json!({
        "PhoneNum": m.recipient,
        "SendStatus": status,
        "ErrCode": err,
        "TemplateCode": m.template,
        "Content": format!("【{sign}】{} {}", m.template, m.params["TemplateParam"]),
        "SendDate": china_time(m.accepted_at_ms),
        "ReceiveDate": china_time(m.accepted_at_ms + 1000),
        "OutId": m.reference,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    /// Aliyun "V3 request structure and signature": the documentation example.
    #[test]
    fn v3_documentation_vector() {
        let query = pairs(&[
            (
                "ImageId",
                "win2019_1809_x64_dtc_zh-cn_40G_alibase_20230811.vhd",
            ),
            ("RegionId", "cn-shanghai"),
        ]);
        let headers = pairs(&[
            ("host", "ecs.cn-shanghai.aliyuncs.com"),
            ("x-acs-action", "RunInstances"),
            ("x-acs-version", "2014-05-26"),
            ("x-acs-date", "2023-10-26T10:22:32Z"),
            ("x-acs-signature-nonce", "3156853299f313e23d1673dc12e1703d"),
            (
                "x-acs-content-sha256",
                "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
            ),
        ]);
        let canonical = v3_canonical_request("POST", "/", &query, &headers, b"");
        assert_eq!(
            sha256_hex(canonical.as_bytes()),
            "7ea06492da5221eba5297e897ce16e55f964061054b7695beedaac1145b1e259"
        );
        assert_eq!(
            v3_signature("YourAccessKeySecret", &canonical),
            "06563a9e1b43f5dfe96b81484da74bceab24a1d853912eee15083a6f0f3283c0"
        );
    }

    /// The V2 (HMAC-SHA1) documentation example.
    #[test]
    fn v2_documentation_vector() {
        let params = pairs(&[
            ("AccessKeyId", "testid"),
            ("Action", "DescribeDedicatedHosts"),
            ("Format", "JSON"),
            ("RegionId", "cn-beijing"),
            ("SignatureMethod", "HMAC-SHA1"),
            ("SignatureNonce", "edb2b34af0af9a6d14deaf7c1a5315eb"),
            ("SignatureVersion", "1.0"),
            ("Timestamp", "2023-03-13T08:34:30Z"),
            ("Version", "2014-05-26"),
        ]);
        assert_eq!(
            v2_signature("GET", &params, "testsecret"),
            "9NaGiOspFP5UPcwX8Iwt2YJXXuk="
        );
    }

    #[test]
    fn percent_encoding_is_rfc3986() {
        assert_eq!(percent_encode("a b*~+/"), "a%20b%2A~%2B%2F");
        assert_eq!(percent_decode("a%20b%2A~%2B"), "a b*~+");
    }
}
