//! Channel plugin `tencent-sms`: Tencent Cloud SMS, API 2021-01-11, API 3.0
//! over HTTPS (`POST /`, JSON body, `X-TC-*` headers), signed with signature
//! v3 (`TC3-HMAC-SHA256`, see `provider_auth::tencent`). Facts and sources:
//! docs/providers.md, "Tencent Cloud SMS".
//!
//! Send: `SendSms` (<https://cloud.tencent.com/document/api/382/55981>) with
//! one number in `PhoneNumberSet`, `SmsSdkAppId` (setting `sdk_app_id`),
//! `TemplateId` (the message's template, or the setting `template.<it>`
//! when set: 1.1.0), `SignName` (setting `sign_name`,
//! required for mainland numbers), `TemplateParamSet` (the parameters'
//! values, in order: Tencent's templates are positional) and
//! `SessionContext` = 32 hex digits of the idempotency key's SHA-256 (only
//! echoed: "server 会原样返回"). A call-level failure is
//! `Response.Error.Code`; otherwise the number's own result is
//! `Response.SendStatusSet[].Code` inside the HTTP 200: `Ok` is sent
//! (provider id = `SerialNo`), any other code follows the table in
//! `provider_auth::tencent::classify`. `InternalError.*` (among them
//! `InternalError.Timeout`, "请求下发短信超时", and
//! `InternalError.SendAndRecvFail`), a gateway 5xx and a cut-off answer are
//! **unknown**: Tencent says to retry, never that nothing was sent.
//!
//! Capabilities:
//! - `honours_reference = false`: SendSms has no idempotency parameter;
//!   `SessionContext` is echoed, never deduplicated.
//! - `can_query = true`, `query_lag_secs = u32::MAX`:
//!   `PullSmsSendStatusByPhoneNumber`
//!   (<https://www.tencentcloud.com/document/api/382/40518>) lists the
//!   delivery **receipts** of one number (`BeginTime` at most 7 days back,
//!   `Offset` 0, `Limit` ≤ 100); a receipt matched by `SerialNo` (or by
//!   `SessionContext` where Tencent echoes it) settles the task delivered
//!   (`ReportStatus` `SUCCESS`) or failed (`FAIL`). A message accepted but
//!   not yet receipted is in no API, and no maximum receipt delay is
//!   documented, so "no receipt" never proves "not accepted": the query
//!   answers `unknown`, and the declared lag (`u32::MAX` s, the not-found
//!   horizon never ends) makes the host hold it, never resend.
//! - `callbacks = true`: "短信下发状态通知"
//!   (<https://cloud.tencent.com/document/api/382/59178>; en
//!   <https://www.tencentcloud.com/document/api/382/43547>): a POSTed JSON
//!   array of `{user_receive_time, nationcode, mobile, report_status,
//!   errmsg, description, sid, ext}`, answered `{"result":0,"errmsg":"OK"}`.
//!   The push carries **no signature** (none is documented): the
//!   unguessable path token of the channel's callback URL is the only gate.
//!   Reports settle by `ext` (our `SessionContext`, present only where
//!   Tencent's support enabled it) else `sid` (= `SerialNo`); a repeated
//!   report settles nothing twice (settlements are idempotent at the host).
//!   A reply (uplink) push is refused: this channel takes delivery reports only.

use channel_sdk::callback::{self, answer};
use channel_sdk::provider::auth::Refusal;
use channel_sdk::provider::auth::tencent::{self, Report};
use channel_sdk::provider::{authority, provider_template, refused_by, setting_or};
use channel_sdk::serde_json::{Value, json};
use channel_sdk::{
    CallbackAnswer, CallbackError, CallbackRequest, Channel, DeliveryStatus, Message,
    ProviderCapabilities, Receipt, SendError, SentMessage, Settlement, http, now_ms, require,
    setting,
};

/// The real endpoint; setting `endpoint` overrides it.
const ENDPOINT: &str = "https://sms.tencentcloudapi.com";
/// The API version of every call.
const VERSION: &str = "2021-01-11";
/// The service of the credential scope.
const SERVICE: &str = "sms";
/// The default region (a required common parameter); setting `region`.
const REGION: &str = "ap-guangzhou";
/// The content type sent, and signed.
const CONTENT_TYPE: &str = "application/json; charset=utf-8";
/// How far back the pull API reaches (7 days), less a minute of margin.
const PULL_REACH_SECS: u64 = 7 * 86_400 - 60;

/// The plugin.
struct TencentSms;

impl Channel for TencentSms {
    fn capabilities() -> ProviderCapabilities {
        ProviderCapabilities {
            honours_reference: false,
            can_query: true,
            // Receipts only: "not found" is never believed (see the module doc).
            query_lag_secs: u32::MAX,
            callbacks: true,
            ..ProviderCapabilities::NONE
        }
    }

    fn send(msg: Message) -> Result<Receipt, SendError> {
        let context = tencent::session_context(&msg.idempotency_key);
        let mut body = json!({
            "PhoneNumberSet": [msg.recipient],
            "SmsSdkAppId": require("sdk_app_id")?,
            "TemplateId": provider_template(&msg.template),
            "TemplateParamSet": msg.params.iter().map(|(_, v)| v.clone()).collect::<Vec<_>>(),
            "SessionContext": context,
        });
        if let Some(sign) = setting("sign_name").filter(|s| !s.is_empty()) {
            body["SignName"] = json!(sign);
        }
        let answer = call("SendSms", &body)?;
        let Some(status) = answer
            .get("SendStatusSet")
            .and_then(Value::as_array)
            .and_then(|set| set.first())
        else {
            return Err(SendError::Unknown(
                "SendSms answered without a SendStatusSet".into(),
            ));
        };
        match status.get("Code").and_then(Value::as_str) {
            Some("Ok") => match status.get("SerialNo").and_then(Value::as_str) {
                Some(serial) if !serial.is_empty() => Ok(Receipt {
                    provider_message_id: serial.to_string(),
                    reference: Some(context),
                }),
                _ => Err(SendError::Unknown(
                    "SendSms answered Ok without a SerialNo".into(),
                )),
            },
            Some(code) => Err(refused("SendSms", &tencent::classify(code))),
            None => Err(SendError::Unknown(
                "SendSms answered a SendStatus without a Code".into(),
            )),
        }
    }

    fn query(msg: SentMessage) -> Result<DeliveryStatus, SendError> {
        let now = now_ms() / 1000;
        let begin = (msg.first_attempt_ms / 1000)
            .saturating_sub(60)
            .max(now.saturating_sub(PULL_REACH_SECS));
        let body = json!({
            "BeginTime": begin,
            "Offset": 0,
            "Limit": 100,
            "PhoneNumber": tencent::e164(&msg.recipient),
            "SmsSdkAppId": require("sdk_app_id").map_err(as_retryable)?,
        });
        let answer = call("PullSmsSendStatusByPhoneNumber", &body).map_err(as_retryable)?;
        let serial = msg.provider_message_id.as_deref();
        let context = msg
            .reference
            .clone()
            .unwrap_or_else(|| tencent::session_context(&msg.idempotency_key));
        let receipts = answer
            .get("PullSmsSendStatusSet")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let mine = receipts.iter().filter(|r| {
            let field = |k| r.get(k).and_then(Value::as_str).filter(|s| !s.is_empty());
            (serial.is_some() && field("SerialNo") == serial)
                || field("SessionContext") == Some(context.as_str())
        });
        let mut best = None;
        for r in mine {
            match r.get("ReportStatus").and_then(Value::as_str) {
                Some("SUCCESS") => return Ok(DeliveryStatus::Delivered),
                Some("FAIL") => best = Some(DeliveryStatus::Failed),
                _ => {}
            }
        }
        // No receipt: Tencent shows no accepted-but-unreceipted message, so
        // this is `unknown`, which the declared lag keeps from ever meaning "absent".
        Ok(best.unwrap_or(DeliveryStatus::Unknown))
    }

    fn handle_callback(req: CallbackRequest) -> Result<CallbackAnswer, CallbackError> {
        if req.method != "POST" {
            return Err(CallbackError::Malformed(
                "Tencent's status push is a POST".into(),
            ));
        }
        let settled = tencent::reports(&req.body)
            .map_err(CallbackError::Malformed)?
            .into_iter()
            .map(
                |Report {
                     id,
                     delivered,
                     detail,
                 }| Settlement {
                    id,
                    status: if delivered {
                        DeliveryStatus::Delivered
                    } else {
                        DeliveryStatus::Failed
                    },
                    detail,
                },
            )
            .collect();
        Ok(answer(
            settled,
            callback::json(&json!({"result": 0, "errmsg": "OK"})),
        ))
    }
}

/// A query that could not tell: asking again later is always safe.
fn as_retryable(e: SendError) -> SendError {
    match e {
        SendError::Unknown(m) | SendError::Permanent(m) => SendError::retryable(m),
        retry => retry,
    }
}

/// The error of a refusal `r` to `action`.
fn refused(action: &str, r: &Refusal) -> SendError {
    channel_sdk::provider::refused(&format!("Tencent Cloud ({action})"), r, None)
}

/// Calls `action` with `body`, signed v3; the answer's `Response` when it
/// holds no `Error`.
fn call(action: &str, body: &Value) -> Result<Value, SendError> {
    let endpoint = setting_or("endpoint", ENDPOINT);
    let endpoint = endpoint.trim_end_matches('/');
    let host = authority(endpoint).ok_or_else(|| {
        SendError::Permanent("channel setting `endpoint` is not an absolute URL".into())
    })?;
    let secret_id = require("secret_id")?;
    let secret_key = require("secret_key")?;
    let region = setting_or("region", REGION);
    let payload = body.to_string();
    let timestamp = now_ms() / 1000;
    let signed = tencent::sign_v3(
        &tencent::Request {
            host,
            content_type: CONTENT_TYPE,
            service: SERVICE,
            timestamp,
            body: payload.as_bytes(),
        },
        &secret_id,
        &secret_key,
    );
    let timestamp = timestamp.to_string();
    let headers = [
        ("content-type", CONTENT_TYPE),
        ("authorization", signed.authorization.as_str()),
        ("x-tc-action", action),
        ("x-tc-version", VERSION),
        ("x-tc-timestamp", timestamp.as_str()),
        ("x-tc-region", region.as_str()),
    ];
    let url = format!("{endpoint}/");
    let resp = http::request("POST", &url, &headers, Some(payload.as_bytes()))?;
    let json = resp.json();
    let response = json.get("Response");
    let code = response
        .and_then(|r| r.pointer("/Error/Code"))
        .and_then(Value::as_str);
    match (resp.status, code, response) {
        (_, Some(code), _) => Err(refused(action, &tencent::classify(code))),
        (200, None, Some(r)) => Ok(r.clone()),
        // A gateway's 5xx says nothing of the message (`Class::Unknown`).
        (s, None, _) if s >= 500 => Err(refused_by(
            &format!("Tencent Cloud ({action})"),
            &Refusal::of_status(s),
            &resp,
        )),
        (200, None, None) => Err(SendError::Unknown(format!(
            "{action} answered 200 without a Response"
        ))),
        (s, None, _) => Err(SendError::Permanent(format!(
            "Tencent Cloud answered {action} with status {s} and no error code"
        ))),
    }
}

channel_sdk::export_channel!(TencentSms);
