//! Channel plugin `aliyun-sms`: Aliyun SMS, API dysmsapi 2017-05-25, RPC
//! style over HTTPS, signed with signature V3 (`ACS3-HMAC-SHA256`, see
//! `provider_auth::aliyun`).
//!
//! Send: `SendSms` (<https://help.aliyun.com/zh/sms/developer-reference/api-dysmsapi-2017-05-25-sendsms>)
//! with `PhoneNumbers`, `SignName`, `TemplateCode` (the message's template,
//! or the setting `template.<it>` when set: 2.2.0), `TemplateParam` (a string
//! holding JSON) and `OutId` = 32 hex digits of the idempotency key's SHA-256,
//! every parameter in the query of `POST /`, empty body. `Code` `OK` is sent
//! (provider id = `BizId`); other codes follow the error table in
//! `provider_auth::aliyun::classify` (SendSms "错误码" and the SMS API error
//! codes page); a 5xx, `isp.*` or `ServiceUnavailable*` unknown (Aliyun does
//! not say such an SMS was not taken: decided by the status query, as a
//! cut-off answer is); a cut-off answer unknown. Facts and sources:
//! docs/providers.md, "Aliyun SMS".
//!
//! Capabilities:
//! - `honours_reference = false`: SendSms is not idempotent — the same OutId
//!   twice is two SMS; `OutId` is only echoed back ("外部流水扩展字段", SendSms
//!   request parameters; docs/providers.md, "Aliyun SMS").
//! - `can_query = true`: `QuerySendDetails`
//!   (<https://help.aliyun.com/zh/sms/developer-reference/api-dysmsapi-2017-05-25-querysenddetails>)
//!   by `PhoneNumber` (the 11-digit number: a `+86` / `0086` / `86` prefix
//!   SendSms takes is dropped, `aliyun::query_number`) + `SendDate` (`yyyyMMdd`, China Standard Time, ≤ 30 days
//!   back) + `BizId` when known, 50 rows a page; rows are matched by `OutId`,
//!   `SendStatus` 1 waiting / 2 failed / 3 delivered. How soon a sent message
//!   shows in the query is not documented, so a message the query does not
//!   find is believed absent only past a conservative not-found horizon:
//!   `query_lag_secs`, the setting `query_lag` (default 1,200 s: it also
//!   outlasts SmsReport's re-pushes 1, 5 and 10 minutes after a failed push,
//!   so the receipt is waited for before a resend). Until then the host holds
//!   the task; receipts and later checks settle it.
//! - `callbacks = true`: SmsReport, HTTP batch push
//!   (<https://help.aliyun.com/zh/sms/developer-reference/smsreport-2>): a JSON
//!   array of `{phone_number, send_time, report_time, success, err_code,
//!   err_msg, sms_size, biz_id, out_id}`, answered `{"code":0,"msg":"成功"}`
//!   (Aliyun checks that `code` is a number and the status is 200; else it
//!   pushes again after 1, 5, 10 minutes). A GET on the callback URL is
//!   Aliyun's connectivity check before SmsReport can be enabled: answered
//!   the same way, at once. The push carries **no signature**
//!   (none is documented), so the unguessable path token of the channel's
//!   callback URL is the only gate. Reports may repeat ("回执消息无法保证幂等性"):
//!   settlements are idempotent at the host.
//! - Opt-outs: SmsUp, HTTP batch push
//!   (<https://help.aliyun.com/zh/sms/developer-reference/smsup-http>): the
//!   users' replies, a JSON array of `{phone_number, content, send_time,
//!   dest_code, sequence_id}`, answered `{"code":0,"msg":"接收成功"}` (else
//!   re-pushed after 1, 5 and 10 minutes). Told apart from SmsReport by its
//!   entries' `content`, so both pushes may use the channel's one callback
//!   URL. A reply that is one of the unsubscribe words (setting
//!   `unsubscribe_words`, comma separated, default `TD,T,退订`; compared
//!   trimmed and case-insensitively) is an opt-out of this channel by the
//!   number, in each form SendSms takes it (`aliyun::number_forms`); other
//!   replies are acknowledged and change nothing. A malformed push is
//!   refused naming the entry and the field.

use channel_sdk::callback::{self, answer};
use channel_sdk::provider::auth::aliyun::{self, Status};
use channel_sdk::provider::auth::{Refusal, sha256_hex, time};
use channel_sdk::provider::{
    authority, nonce, number_setting, provider_template, refused_by, setting_or,
};
use channel_sdk::serde_json::{Value, json};
use channel_sdk::{
    CallbackAnswer, CallbackError, CallbackOutcome, CallbackRequest, Channel, DeliveryStatus,
    Message, OptOut, OptOutRoute, OptOutSubject, ProviderCapabilities, Receipt, SendError,
    SentMessage, Settlement, http, now_ms, params_json, require, setting,
};

/// The real endpoint; setting `endpoint` overrides it.
const ENDPOINT: &str = "https://dysmsapi.aliyuncs.com";
/// Rows per QuerySendDetails page (the API's maximum).
const PAGE_SIZE: usize = 50;
/// Pages read per date (500 messages to one number in a day; Aliyun's
/// per-number flow control allows far fewer). Past it the query says it
/// could not tell rather than "absent".
const MAX_PAGES: usize = 10;
/// The default not-found horizon (setting `query_lag`), in seconds: see the
/// module documentation.
const QUERY_LAG_SECS: u64 = 1200;
/// The default unsubscribe words (setting `unsubscribe_words`).
const UNSUBSCRIBE_WORDS: &str = "TD,T,退订";
/// China Standard Time, in which `SendDate` is given.
const CST: i64 = 8 * 3600;

/// The plugin.
struct AliyunSms;

impl Channel for AliyunSms {
    fn capabilities() -> ProviderCapabilities {
        let lag = number_setting("query_lag", QUERY_LAG_SECS).unwrap_or(QUERY_LAG_SECS);
        ProviderCapabilities {
            honours_reference: false,
            can_query: true,
            query_lag_secs: u32::try_from(lag).unwrap_or(u32::MAX),
            callbacks: true,
            ..ProviderCapabilities::NONE
        }
    }

    fn send(msg: Message) -> Result<Receipt, SendError> {
        let out_id = aliyun::out_id(&msg.idempotency_key);
        let params = [
            ("PhoneNumbers", msg.recipient.clone()),
            ("SignName", require("sign_name")?),
            ("TemplateCode", provider_template(&msg.template)),
            ("TemplateParam", params_json(&msg.params).to_string()),
            ("OutId", out_id.clone()),
        ];
        let body = call("SendSms", &params)?;
        match body.get("BizId").and_then(Value::as_str) {
            Some(biz_id) => Ok(Receipt {
                provider_message_id: biz_id.to_string(),
                reference: Some(out_id),
            }),
            None => Err(SendError::Unknown(
                "SendSms answered OK without a BizId".into(),
            )),
        }
    }

    fn query(msg: SentMessage) -> Result<DeliveryStatus, SendError> {
        let out_id = msg
            .reference
            .clone()
            .unwrap_or_else(|| aliyun::out_id(&msg.idempotency_key));
        let mut dates = vec![time::ymd(msg.first_attempt_ms, CST)];
        let last = time::ymd(msg.last_attempt_ms, CST);
        if !dates.contains(&last) {
            dates.push(last);
        }
        let mut best: Option<Status> = None;
        for date in &dates {
            best = best.max(status_on(&msg, date, &out_id).map_err(as_retryable)?);
        }
        Ok(match best {
            Some(Status::Delivered) => DeliveryStatus::Delivered,
            Some(Status::Pending) => DeliveryStatus::Pending,
            Some(Status::Failed) => DeliveryStatus::Failed,
            None => DeliveryStatus::Unknown,
        })
    }

    fn handle_callback(req: CallbackRequest) -> Result<CallbackAnswer, CallbackError> {
        let ok = || callback::json(&json!({"code": 0, "msg": "成功"}));
        if req.method == "GET" {
            // Aliyun's connectivity check of the callback URL, made before
            // SmsReport can be enabled: answered as a push is.
            return Ok(answer(vec![], ok()));
        }
        if req.method != "POST" {
            return Err(CallbackError::Malformed("SmsReport is a POST".into()));
        }
        let settled = aliyun::reports(&req.body)
            .map_err(CallbackError::Malformed)?
            .into_iter()
            .map(|r| Settlement {
                id: r.id,
                status: if r.delivered {
                    DeliveryStatus::Delivered
                } else {
                    DeliveryStatus::Failed
                },
                detail: r.err_code,
            })
            .collect();
        Ok(answer(settled, ok()))
    }

    fn handle_callback_with_opt_outs(
        req: CallbackRequest,
    ) -> Result<CallbackOutcome, CallbackError> {
        if req.method != "POST" || !aliyun::is_uplink_push(&req.body) {
            return Self::handle_callback(req).map(|a| CallbackOutcome {
                settlements: a.settlements,
                opt_outs: Vec::new(),
                reply: a.reply,
            });
        }
        let words: Vec<String> = setting("unsubscribe_words")
            .unwrap_or_else(|| UNSUBSCRIBE_WORDS.to_string())
            .split(',')
            .map(|w| w.trim().to_string())
            .filter(|w| !w.is_empty())
            .collect();
        let opt_outs = aliyun::uplinks(&req.body)
            .map_err(CallbackError::Malformed)?
            .into_iter()
            .filter(|up| aliyun::is_unsubscribe(&up.content, &words))
            .map(|up| OptOut {
                subject: OptOutSubject::Address(aliyun::number_forms(&up.phone_number)),
                category: None,
                route: OptOutRoute::Reply,
                detail: Some(format!(
                    "SmsUp reply {:?} (sequence_id {})",
                    up.content.trim(),
                    up.sequence_id
                )),
            })
            .collect();
        Ok(CallbackOutcome {
            settlements: Vec::new(),
            opt_outs,
            reply: callback::json(&json!({"code": 0, "msg": "接收成功"})),
        })
    }
}

/// The best status of the rows for `out_id` sent on `date`.
fn status_on(msg: &SentMessage, date: &str, out_id: &str) -> Result<Option<Status>, SendError> {
    let mut best = None;
    for page in 1..=MAX_PAGES {
        let mut params = vec![
            (
                "PhoneNumber",
                aliyun::query_number(&msg.recipient).to_string(),
            ),
            ("SendDate", date.to_string()),
            ("PageSize", PAGE_SIZE.to_string()),
            ("CurrentPage", page.to_string()),
        ];
        if let Some(biz_id) = &msg.provider_message_id {
            params.push(("BizId", biz_id.clone()));
        }
        let body = call("QuerySendDetails", &params)?;
        let rows = body
            .pointer("/SmsSendDetailDTOs/SmsSendDetailDTO")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let mine = rows
            .iter()
            .filter(|r| r.get("OutId").and_then(Value::as_str) == Some(out_id))
            .filter_map(|r| send_status(r.get("SendStatus")?));
        best = best.max(mine.max());
        if rows.len() < PAGE_SIZE || best == Some(Status::Delivered) {
            return Ok(best);
        }
    }
    match best {
        Some(_) => Ok(best),
        None => Err(SendError::retryable(format!(
            "QuerySendDetails lists more than {} messages to this number on {date}; not all were read",
            MAX_PAGES * PAGE_SIZE
        ))),
    }
}

/// A row's `SendStatus` (a number, or a string holding one).
fn send_status(v: &Value) -> Option<Status> {
    let code = v.as_i64().or_else(|| v.as_str()?.trim().parse().ok())?;
    aliyun::send_status(code)
}

/// A query that could not tell: asking again later is always safe.
fn as_retryable(e: SendError) -> SendError {
    match e {
        SendError::Unknown(m) | SendError::Permanent(m) => SendError::retryable(m),
        retry => retry,
    }
}

/// Calls `action` with `params`, signed V3; the answer's JSON when `Code` is `OK`.
fn call(action: &str, params: &[(&str, String)]) -> Result<Value, SendError> {
    let endpoint = setting_or("endpoint", ENDPOINT);
    let endpoint = endpoint.trim_end_matches('/');
    let host = authority(endpoint).ok_or_else(|| {
        SendError::Permanent("channel setting `endpoint` is not an absolute URL".into())
    })?;
    let query: Vec<(String, String)> = params
        .iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect();
    let headers = signed_headers(action, host, &query)?;
    let header_refs: Vec<(&str, &str)> = headers
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let url = format!(
        "{endpoint}/?{}",
        channel_sdk::provider::auth::canonical_query(&query)
    );
    let resp = http::request("POST", &url, &header_refs, Some(b""))?;
    let body = resp.json();
    let code = body.get("Code").and_then(Value::as_str);
    match (resp.status, code) {
        (200, Some("OK")) => Ok(body),
        // A 5xx is ambiguous (`Class::Unknown`); its `Code`, when it has one, says more.
        (s, None) if s >= 500 => Err(refused_by("Aliyun", &Refusal::of_status(s), &resp)),
        (_, Some(code)) => Err(refused_by("Aliyun", &aliyun::classify(code), &resp)),
        (200, None) => Err(SendError::Unknown(format!(
            "{action} answered 200 without a Code"
        ))),
        (s, None) => Err(SendError::Permanent(format!(
            "Aliyun answered {action} with status {s} and no Code"
        ))),
    }
}

/// The `x-acs-*` headers and `Authorization` of one call (`host` is signed
/// as the authority the host sends, not sent as a header).
fn signed_headers(
    action: &str,
    host: &str,
    query: &[(String, String)],
) -> Result<Vec<(String, String)>, SendError> {
    let key_id = require("access_key_id")?;
    let secret = require("access_key_secret")?;
    let mut headers = vec![
        ("x-acs-action".to_string(), action.to_string()),
        ("x-acs-version".to_string(), "2017-05-25".to_string()),
        ("x-acs-date".to_string(), time::iso8601(now_ms())),
        ("x-acs-signature-nonce".to_string(), nonce()),
        ("x-acs-content-sha256".to_string(), sha256_hex(b"")),
    ];
    let mut to_sign = headers.clone();
    to_sign.push(("host".to_string(), host.to_string()));
    let req = aliyun::Request {
        method: "POST",
        path: "/",
        query,
        headers: &to_sign,
        body: b"",
    };
    let signed = aliyun::sign_v3(&req, &key_id, &secret);
    headers.push(("authorization".to_string(), signed.authorization));
    Ok(headers)
}

channel_sdk::export_channel!(AliyunSms);
