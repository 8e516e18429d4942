//! Amazon SNS messages posted to an HTTP(S) subscription, and their
//! signatures.
//!
//! Format: "Parsing message formats" / "HTTP/HTTPS notification JSON
//! format" (<https://docs.aws.amazon.com/sns/latest/dg/http-notification-json.html>,
//! <https://docs.aws.amazon.com/sns/latest/dg/http-subscription-confirmation-json.html>):
//! a JSON body with `Type` (`Notification`, `SubscriptionConfirmation`,
//! `UnsubscribeConfirmation`, also sent as the `x-amz-sns-message-type`
//! header), `MessageId`, `TopicArn`, `Message`, `Timestamp`,
//! `SignatureVersion`, `Signature` (base64), `SigningCertURL`; a
//! notification may have `Subject`; a confirmation has `Token` and
//! `SubscribeURL`.
//!
//! Signature: "Verifying the signatures of Amazon SNS messages"
//! (<https://docs.aws.amazon.com/sns/latest/dg/sns-verify-signature-of-message.html>,
//! and its page "Verifying the signature of an Amazon SNS message when using
//! HTTP query-based requests"): the string to sign is, for a
//! `Notification`, `Message`, `MessageId`, `Subject` (only if present),
//! `Timestamp`, `TopicArn`, `Type`; for a `SubscriptionConfirmation` or
//! `UnsubscribeConfirmation`, `Message`, `MessageId`, `SubscribeURL`,
//! `Timestamp`, `Token`, `TopicArn`, `Type` — each as its name, a newline,
//! its value, a newline. `SignatureVersion` 1 signs it with SHA1withRSA, 2
//! with SHA256withRSA (RSASSA-PKCS1-v1_5), verified with the public key of
//! the X.509 certificate at `SigningCertURL`, which must be fetched over
//! HTTPS from Amazon SNS ([`check_url`]: under the configured SNS endpoint).

use base64::Engine;
use serde_json::Value;

/// What an SNS message is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A message published to the topic.
    Notification,
    /// Asks the endpoint to confirm the subscription (GET `SubscribeURL`).
    SubscriptionConfirmation,
    /// The subscription was deleted.
    UnsubscribeConfirmation,
}

impl Kind {
    /// The `Type` value.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Notification => "Notification",
            Kind::SubscriptionConfirmation => "SubscriptionConfirmation",
            Kind::UnsubscribeConfirmation => "UnsubscribeConfirmation",
        }
    }
}

/// One SNS message as posted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// `Type`.
    pub kind: Kind,
    /// `MessageId`.
    pub message_id: String,
    /// `TopicArn`.
    pub topic_arn: String,
    /// `Subject`, when the notification has one.
    pub subject: Option<String>,
    /// `Message`: for SES notifications, their JSON as a string.
    pub message: String,
    /// `Timestamp` (ISO 8601).
    pub timestamp: String,
    /// `Token` of a confirmation.
    pub token: Option<String>,
    /// `SubscribeURL` of a confirmation.
    pub subscribe_url: Option<String>,
    /// `SignatureVersion`: `1` or `2`.
    pub signature_version: String,
    /// `Signature`, base64.
    pub signature: String,
    /// `SigningCertURL`.
    pub signing_cert_url: String,
}

/// Why an SNS message is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SnsError {
    /// Not an SNS message: bad JSON, a field missing or not a string.
    #[error("not an SNS message: {0}")]
    Malformed(String),
    /// A URL of the message is not `https://` under the SNS endpoint.
    #[error("{0}")]
    BadUrl(String),
    /// The signing certificate cannot be read, or holds no RSA key.
    #[error("the signing certificate is not usable: {0}")]
    BadCertificate(String),
    /// A `SignatureVersion` other than 1 and 2.
    #[error("SignatureVersion {0:?} is not 1 or 2")]
    UnsupportedVersion(String),
    /// The signature does not verify: forged or altered.
    #[error("the signature does not verify (forged or altered message)")]
    BadSignature,
}

/// Parses an SNS message body.
pub fn parse(body: &[u8]) -> Result<Message, SnsError> {
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| SnsError::Malformed(format!("the body is not JSON: {e}")))?;
    let field = |k: &str| -> Result<Option<String>, SnsError> {
        match v.get(k) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(_) => Err(SnsError::Malformed(format!("`{k}` is not a string"))),
        }
    };
    let required =
        |k: &str| field(k)?.ok_or_else(|| SnsError::Malformed(format!("`{k}` is missing")));
    let kind = match required("Type")?.as_str() {
        "Notification" => Kind::Notification,
        "SubscriptionConfirmation" => Kind::SubscriptionConfirmation,
        "UnsubscribeConfirmation" => Kind::UnsubscribeConfirmation,
        other => return Err(SnsError::Malformed(format!("unknown `Type` {other:?}"))),
    };
    let confirmation = kind != Kind::Notification;
    let for_confirmation = |k: &str| -> Result<Option<String>, SnsError> {
        if confirmation {
            required(k).map(Some)
        } else {
            Ok(None)
        }
    };
    Ok(Message {
        kind,
        message_id: required("MessageId")?,
        topic_arn: required("TopicArn")?,
        subject: if confirmation {
            None
        } else {
            field("Subject")?
        },
        message: required("Message")?,
        timestamp: required("Timestamp")?,
        token: for_confirmation("Token")?,
        subscribe_url: for_confirmation("SubscribeURL")?,
        signature_version: required("SignatureVersion")?,
        signature: required("Signature")?,
        signing_cert_url: required("SigningCertURL")?,
    })
}

impl Message {
    /// The string SNS signed (see the module documentation).
    pub fn string_to_sign(&self) -> String {
        let mut fields: Vec<(&str, &str)> = vec![("Message", &self.message)];
        fields.push(("MessageId", &self.message_id));
        match self.kind {
            Kind::Notification => {
                if let Some(subject) = &self.subject {
                    fields.push(("Subject", subject));
                }
                fields.push(("Timestamp", &self.timestamp));
            }
            _ => {
                fields.push(("SubscribeURL", self.subscribe_url.as_deref().unwrap_or("")));
                fields.push(("Timestamp", &self.timestamp));
                fields.push(("Token", self.token.as_deref().unwrap_or("")));
            }
        }
        fields.push(("TopicArn", &self.topic_arn));
        fields.push(("Type", self.kind.as_str()));
        fields.iter().map(|(k, v)| format!("{k}\n{v}\n")).collect()
    }
}

/// Verifies `msg`'s signature with the public key of the PEM certificate
/// `cert_pem` (fetched from its `SigningCertURL`, checked by [`check_url`]).
pub fn verify(msg: &Message, cert_pem: &str) -> Result<(), SnsError> {
    let key = public_key(cert_pem)?;
    let signature = base64::engine::general_purpose::STANDARD
        .decode(msg.signature.trim())
        .map_err(|_| SnsError::BadSignature)?;
    let data = msg.string_to_sign();
    let verified = match msg.signature_version.as_str() {
        "1" => key.pkcs1v15_verify::<sha1::Sha1>(data.as_bytes(), &signature),
        "2" => key.pkcs1v15_verify::<sha2::Sha256>(data.as_bytes(), &signature),
        other => return Err(SnsError::UnsupportedVersion(other.to_string())),
    };
    verified.map_err(|_| SnsError::BadSignature)
}

/// The RSA public key of a PEM X.509 certificate.
pub fn public_key(cert_pem: &str) -> Result<rsa::PublicKey, SnsError> {
    use rsa::pkcs8::DecodePublicKey;
    use x509_cert::der::{DecodePem, Encode};
    let bad = |e: String| SnsError::BadCertificate(e);
    let cert = x509_cert::Certificate::from_pem(cert_pem.trim().as_bytes())
        .map_err(|e| bad(format!("not a PEM X.509 certificate ({e})")))?;
    let spki = cert
        .tbs_certificate()
        .subject_public_key_info()
        .to_der()
        .map_err(|e| bad(e.to_string()))?;
    rsa::PublicKey::from_public_key_der(&spki)
        .map_err(|e| bad(format!("its key is not an RSA public key ({e})")))
}

/// Checks that `url` (a `SigningCertURL` or `SubscribeURL`) is `https://`
/// on the host of `endpoint` (the channel's SNS endpoint, by default
/// `https://sns.<region>.amazonaws.com`) and under its path: a message
/// naming any other place is not from that SNS.
pub fn check_url(what: &str, url: &str, endpoint: &str) -> Result<(), SnsError> {
    let bad = |why: &str| SnsError::BadUrl(format!("{what} {why}"));
    let (url_host, url_path) = split_https(url).ok_or_else(|| bad("is not an https:// URL"))?;
    let (ep_host, ep_path) = split_https(endpoint)
        .ok_or_else(|| SnsError::BadUrl("the SNS endpoint is not an https:// URL".into()))?;
    if !url_host.eq_ignore_ascii_case(ep_host) {
        return Err(bad("is not on the SNS endpoint's host"));
    }
    let prefix = ep_path.trim_end_matches('/');
    let under = url_path
        .strip_prefix(prefix)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with(['/', '?']));
    if !under {
        return Err(bad("is not under the SNS endpoint's path"));
    }
    Ok(())
}

/// The authority and the path (with query) of an `https://` URL; `None`
/// for another scheme or an authority with user info.
fn split_https(url: &str) -> Option<(&str, &str)> {
    let rest = url.strip_prefix("https://")?;
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, path) = rest.split_at(end);
    if authority.is_empty() || authority.contains('@') || path.contains('#') {
        return None;
    }
    Some((authority, path))
}

#[cfg(test)]
mod tests;
