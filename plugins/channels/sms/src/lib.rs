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

use channel_sdk::http::{self, HttpError};
use channel_sdk::{
    ChannelGuest, DeliveryStatus, Guest, Message, PluginInfo, ProviderCapabilities, Receipt,
    SendError, json_escape, params_json, require, setting,
};
use serde_json::Value;
use sha2::{Digest, Sha256};

/// The plugin; its methods are the world's exports.
struct Sms;

impl Guest for Sms {
    fn describe() -> PluginInfo {
        PluginInfo {
            name: "sms".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            description: env!("CARGO_PKG_DESCRIPTION").into(),
        }
    }
}

/// The provider reference of an idempotency key (OutId is length-limited).
fn out_id(key: &str) -> String {
    let d = Sha256::digest(key.as_bytes());
    d[..16].iter().map(|b| format!("{b:02x}")).collect()
}

fn transport(e: HttpError) -> SendError {
    match e {
        HttpError::Denied(_) | HttpError::NotSent(_) => SendError::Retryable(e.to_string()),
        HttpError::MaybeSent(_) => SendError::Unknown(e.to_string()),
    }
}

impl ChannelGuest for Sms {
    fn capabilities() -> ProviderCapabilities {
        ProviderCapabilities {
            honours_reference: true,
            can_query: true,
        }
    }

    fn send(msg: Message) -> Result<Receipt, SendError> {
        let endpoint = require("endpoint")?;
        let sign = setting("sign_name").unwrap_or_default();
        let body = format!(
            "{{\"PhoneNumbers\":{},\"SignName\":{},\"TemplateCode\":{},\"TemplateParam\":{},\"OutId\":{}}}",
            json_escape(&msg.recipient),
            json_escape(&sign),
            json_escape(&msg.template),
            params_json(&msg.params),
            json_escape(&out_id(&msg.idempotency_key))
        );
        let resp = http::request(
            "POST",
            &format!("{endpoint}/sms/SendSms"),
            &[("content-type", "application/json")],
            Some(body.as_bytes()),
        )
        .map_err(transport)?;
        if resp.status >= 500 || resp.status == 429 {
            return Err(SendError::Retryable(format!(
                "{} {}",
                resp.status,
                resp.text()
            )));
        }
        let json: Value = serde_json::from_slice(&resp.body).unwrap_or(Value::Null);
        let code = json.get("Code").and_then(Value::as_str).unwrap_or("");
        let message = json.get("Message").and_then(Value::as_str).unwrap_or("");
        match code {
            "OK" => match json.get("BizId").and_then(Value::as_str) {
                Some(id) => Ok(Receipt {
                    provider_message_id: id.to_string(),
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
            "" => Err(SendError::Retryable(format!(
                "status {} without a business code",
                resp.status
            ))),
            _ => Err(SendError::Retryable(format!("{code}: {message}"))),
        }
    }

    fn query(key: String, _id: Option<String>) -> Result<DeliveryStatus, SendError> {
        let endpoint = require("endpoint")?;
        let body = format!("{{\"OutId\":{}}}", json_escape(&out_id(&key)));
        let resp = http::request(
            "POST",
            &format!("{endpoint}/sms/QuerySendDetails"),
            &[("content-type", "application/json")],
            Some(body.as_bytes()),
        )
        .map_err(|e| SendError::Retryable(e.to_string()))?;
        let json: Value = serde_json::from_slice(&resp.body).unwrap_or(Value::Null);
        if json.get("Code").and_then(Value::as_str) != Some("OK") {
            return Err(SendError::Retryable(format!(
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

    fn parse_callback(
        _headers: Vec<(String, String)>,
        body: Vec<u8>,
    ) -> Result<Vec<(String, DeliveryStatus)>, String> {
        channel_sdk::parse_receipts(&body, "message_id")
    }
}

channel_sdk::export_channel!(Sms);
