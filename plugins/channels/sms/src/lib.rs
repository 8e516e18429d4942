//! Channel plugin `sms`: an SMS gateway in the style of Aliyun's dysms API.
//!
//! `POST {endpoint}/sms/SendSms` with `PhoneNumbers`, `SignName`,
//! `TemplateCode`, `TemplateParam` and `OutId` — the first 32 hex digits of
//! SHA-256 of the idempotency key, the provider's client reference (a resend
//! with the same `OutId` is not a second SMS). Business codes come in a 200
//! body: `OK` sent (`BizId`); `isv.AMOUNT_NOT_ENOUGH` (arrears) and
//! `isv.MOBILE_NUMBER_ILLEGAL` permanent; `isv.BUSINESS_LIMIT_CONTROL`
//! retryable; 5xx retryable; a cut-off answer unknown. Status:
//! `POST /sms/QuerySendDetails` by `OutId`. Receipts match by `message_id` (BizId).
//!
//! Contract 2 (`pushonce:channel@2`), ported as is: the provider this
//! plugin speaks to is the test simulator's invented gateway, whose contract
//! is this doc (it dedupes on `OutId` for good and its query has no lag).

use channel_sdk::callback::{self, pushonce_receipts};
use channel_sdk::http::{self, HttpError};
use channel_sdk::{
    CallbackAnswer, CallbackError, CallbackRequest, Channel, DeliveryStatus, Message,
    ProviderCapabilities, Receipt, SendError, SentMessage, params_json, require, setting,
};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

/// The plugin.
struct Sms;

/// The provider reference of an idempotency key (OutId is length-limited).
fn out_id(key: &str) -> String {
    let d = Sha256::digest(key.as_bytes());
    d[..16].iter().map(|b| format!("{b:02x}")).collect()
}

fn transport(e: HttpError) -> SendError {
    match e {
        HttpError::Denied(_) | HttpError::NotSent(_) => SendError::retryable(e.to_string()),
        HttpError::MaybeSent(_) => SendError::Unknown(e.to_string()),
    }
}

impl Channel for Sms {
    fn capabilities() -> ProviderCapabilities {
        ProviderCapabilities {
            honours_reference: true,
            can_query: true,
            callbacks: true,
            ..ProviderCapabilities::NONE
        }
    }

    fn send(msg: Message) -> Result<Receipt, SendError> {
        let endpoint = require("endpoint")?;
        let sign = setting("sign_name").unwrap_or_default();
        let reference = out_id(&msg.idempotency_key);
        let body = json!({
            "PhoneNumbers": msg.recipient,
            "SignName": sign,
            "TemplateCode": msg.template,
            "TemplateParam": params_json(&msg.params),
            "OutId": reference,
        })
        .to_string();
        let resp = http::request(
            "POST",
            &format!("{endpoint}/sms/SendSms"),
            &[("content-type", "application/json")],
            Some(body.as_bytes()),
        )
        .map_err(transport)?;
        if resp.status >= 500 || resp.status == 429 {
            return Err(SendError::retry_after(
                format!("{} {}", resp.status, resp.text()),
                resp.retry_after_ms(),
            ));
        }
        let json: Value = serde_json::from_slice(&resp.body).unwrap_or(Value::Null);
        let code = json.get("Code").and_then(Value::as_str).unwrap_or("");
        let message = json.get("Message").and_then(Value::as_str).unwrap_or("");
        match code {
            "OK" => match json.get("BizId").and_then(Value::as_str) {
                Some(id) => Ok(Receipt {
                    provider_message_id: id.to_string(),
                    reference: Some(reference),
                }),
                None => Err(SendError::Unknown("OK without a BizId".into())),
            },
            "isv.AMOUNT_NOT_ENOUGH"
            | "isv.MOBILE_NUMBER_ILLEGAL"
            | "isv.SMS_TEMPLATE_ILLEGAL"
            | "isv.SMS_SIGNATURE_ILLEGAL"
            | "isv.BLACK_KEY_CONTROL_LIMIT" => {
                Err(SendError::Permanent(format!("{code}: {message}")))
            }
            "" => Err(SendError::retryable(format!(
                "status {} without a business code",
                resp.status
            ))),
            _ => Err(SendError::retryable(format!("{code}: {message}"))),
        }
    }

    fn query(msg: SentMessage) -> Result<DeliveryStatus, SendError> {
        let endpoint = require("endpoint")?;
        let reference = msg
            .reference
            .unwrap_or_else(|| out_id(&msg.idempotency_key));
        let body = json!({ "OutId": reference }).to_string();
        let resp = http::request(
            "POST",
            &format!("{endpoint}/sms/QuerySendDetails"),
            &[("content-type", "application/json")],
            Some(body.as_bytes()),
        )
        .map_err(|e| SendError::retryable(e.to_string()))?;
        let json: Value = serde_json::from_slice(&resp.body).unwrap_or(Value::Null);
        if json.get("Code").and_then(Value::as_str) != Some("OK") {
            return Err(SendError::retryable(format!(
                "query answered {}",
                resp.status
            )));
        }
        let first = json
            .get("SmsSendDetailDTOs")
            .and_then(Value::as_array)
            .and_then(|l| l.first().cloned());
        Ok(
            match first.and_then(|d| d.get("SendStatus").and_then(Value::as_i64)) {
                None => DeliveryStatus::Unknown,
                Some(3) => DeliveryStatus::Delivered,
                Some(2) => DeliveryStatus::Failed,
                Some(_) => DeliveryStatus::Pending,
            },
        )
    }

    fn handle_callback(req: CallbackRequest) -> Result<CallbackAnswer, CallbackError> {
        let settled = pushonce_receipts(&req.body, "message_id")?;
        Ok(callback::answer(
            settled,
            callback::json(&json!({"ok": true})),
        ))
    }
}

channel_sdk::export_channel!(Sms);
