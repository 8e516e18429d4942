//! `SendEmail` (SES API v2, `POST /v2/email/outbound-emails`), signed with
//! SigV4 (service `ses`), content a stored template with the message's
//! headers (`provider_auth::aws::ses`).

use channel_sdk::provider::auth::aws::{ses, sigv4};
use channel_sdk::provider::auth::sha256_hex;
use channel_sdk::provider::{authority, provider_template, refused_by};
use channel_sdk::{Message, Receipt, SendError, http, now_ms, params_json};

use crate::settings::SendSettings;

/// The API path of `SendEmail`.
const PATH: &str = "/v2/email/outbound-emails";

/// Sends `msg` with the extra email `headers` (e.g. the one-click
/// unsubscribe pair); the receipt's provider id is SES's `MessageId`, which
/// its notifications name as `mail.messageId`.
pub fn send(msg: &Message, headers: &[(String, String)]) -> Result<Receipt, SendError> {
    let to = msg.recipient.trim();
    if !to.contains('@') || to.contains(['\r', '\n', ',']) {
        return Err(SendError::Permanent(
            "the recipient is not one email address".into(),
        ));
    }
    if msg.template.trim().is_empty() {
        return Err(SendError::Permanent(
            "the message names no template (SES TemplateName)".into(),
        ));
    }
    if headers.len() > ses::MAX_HEADERS {
        return Err(SendError::Permanent(format!(
            "{} headers; SES takes at most {}",
            headers.len(),
            ses::MAX_HEADERS
        )));
    }
    let s = SendSettings::read()?;
    let data = params_json(&msg.params);
    let template = provider_template(&msg.template);
    let body = ses::send_email_body(&ses::SendEmail {
        from: &s.from,
        to,
        template: &template,
        data: &data,
        headers,
        configuration_set: s.configuration_set.as_deref(),
    })
    .to_string();
    let resp = post(&s, body.as_bytes())?;
    if resp.status == 200 {
        return resp.receipt("MessageId", None);
    }
    let kind = ses::error_type(resp.header("x-amzn-errortype"), &resp.body);
    let mut refusal = ses::classify(resp.status, kind.as_deref());
    let json = resp.json();
    let said = json
        .get("message")
        .or_else(|| json.get("Message"))
        .and_then(|m| m.as_str().map(str::to_string));
    if let Some(said) = said {
        let said: String = said.chars().take(200).collect();
        refusal.code = format!("{}: {said}", refusal.code);
    }
    Err(refused_by("Amazon SES", &refusal, &resp))
}

/// POSTs `body` to `SendEmail`, signed.
fn post(s: &SendSettings, body: &[u8]) -> Result<http::Response, SendError> {
    let host = authority(&s.endpoint).ok_or_else(|| {
        SendError::Permanent("channel setting `endpoint` is not an absolute URL".into())
    })?;
    let amz_date = sigv4::amz_date(now_ms());
    let payload_hash = sha256_hex(body);
    let mut headers = vec![
        ("content-type".to_string(), "application/json".to_string()),
        ("x-amz-date".to_string(), amz_date.clone()),
        ("x-amz-content-sha256".to_string(), payload_hash),
    ];
    let mut to_sign = headers.clone();
    to_sign.push(("host".to_string(), host.to_string()));
    let signed = sigv4::sign(
        &sigv4::Request {
            method: "POST",
            path: PATH,
            query: &[],
            headers: &to_sign,
            body,
        },
        &sigv4::Scope {
            access_key_id: &s.access_key_id,
            secret_access_key: &s.secret_access_key,
            region: &s.region,
            service: "ses",
            amz_date: &amz_date,
        },
    );
    headers.push(("authorization".to_string(), signed.authorization));
    let refs: Vec<(&str, &str)> = headers
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    Ok(http::request(
        "POST",
        &format!("{}{PATH}", s.endpoint),
        &refs,
        Some(body),
    )?)
}
