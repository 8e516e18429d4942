//! Amazon SNS as the simulated SES publishes through it: one topic, one
//! HTTP(S) subscription (the host's channel callback URL), its own RSA key
//! and a self-signed certificate served at a `SigningCertURL` under
//! `<base>/sns/`, every message signed as SNS signs it.
//!
//! - Messages: "HTTP/HTTPS notification JSON format" and "HTTP/HTTPS
//!   subscription confirmation JSON format"
//!   (<https://docs.aws.amazon.com/sns/latest/dg/http-notification-json.html>),
//!   posted with `x-amz-sns-message-type`, `x-amz-sns-message-id`,
//!   `x-amz-sns-topic-arn` (and `x-amz-sns-subscription-arn` for
//!   notifications), `Content-Type: text/plain; charset=UTF-8` ("HTTP/HTTPS
//!   headers", <https://docs.aws.amazon.com/sns/latest/dg/http-header.html>);
//!   a retried message keeps its `MessageId`.
//! - Signature ("Verifying the signatures of Amazon SNS messages",
//!   <https://docs.aws.amazon.com/sns/latest/dg/sns-verify-signature-of-message.html>):
//!   the documented string to sign, RSASSA-PKCS1-v1_5 with SHA-1
//!   (`SignatureVersion` 1, the default of a topic) or SHA-256 (2), by
//!   `ring`, apart from the plugin's `rsa` verification.
//! - Subscribing (`POST /_sim/ses/sns`) posts a `SubscriptionConfirmation`;
//!   notifications go out only once its `SubscribeURL` was fetched
//!   (`GET <base>/sns/?Action=ConfirmSubscription&TopicArn&Token`), as SNS
//!   delivers nothing to a pending subscription.
//! - Delivery retries: a post not answered 2xx is posted again up to 3
//!   times, [`crate::Config::sns_retry_delay`] apart (SNS's default HTTP/S
//!   policy: "up to three retries with a delay between failed attempts set
//!   at 20 seconds").
//!
//! Counted as `ses-email.sns_posted` / `sns_retried` / `sns_failed` /
//! `sns_unconfirmed` / `sns_confirmed`.

use crate::now_ms;
use base64::Engine;
use serde::Deserialize;
use serde_json::{Value, json};
use std::sync::{Mutex, OnceLock};

const PROVIDER: &str = "ses-email";

/// The topic a subscription gets when it names none: SES's notifications
/// in region `region` of the simulator's account.
pub fn default_topic_arn(region: &str) -> String {
    format!("arn:aws:sns:{region}:123456789012:ses-notifications")
}

/// The SNS key and certificate, the base URL and the subscription.
#[derive(Default)]
pub struct Sns {
    /// `https://127.0.0.1:PORT` of the TLS listener, set when it starts.
    base: OnceLock<String>,
    /// The signing key (PKCS#8 DER) and its certificate (PEM), made on first use.
    key: OnceLock<Result<(Vec<u8>, String), String>>,
    /// The one subscription.
    sub: Mutex<Option<Subscription>>,
    /// Every `SubscribeURL` fetched.
    confirmations: Mutex<Vec<String>>,
}

/// The subscription, as set through the control API.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SnsConfig {
    /// The endpoint (the host's callback URL of the email channel).
    pub url: String,
    /// `SignatureVersion`: 1 (SNS's default) or 2.
    #[serde(default = "one")]
    pub signature_version: u8,
    /// The topic; default `arn:aws:sns:<region>:123456789012:ses-notifications`.
    #[serde(default)]
    pub topic_arn: Option<String>,
}

fn one() -> u8 {
    1
}

#[derive(Debug, Clone)]
struct Subscription {
    config: SnsConfig,
    topic_arn: String,
    token: String,
    confirmed: bool,
}

/// How a pushed message is spoiled (control API), to test the endpoint's check.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Tamper {
    /// Signed as SNS signs it.
    #[default]
    None,
    /// One character of the signature changed.
    Signature,
    /// The `Message` changed after signing.
    Body,
}

impl Sns {
    /// Records the TLS listener's address.
    pub fn set_base(&self, base: String) {
        let _ = self.base.set(base);
    }

    fn base(&self) -> String {
        self.base.get().cloned().unwrap_or_default()
    }

    /// The `SigningCertURL` of the key.
    pub fn cert_url(&self) -> String {
        format!(
            "{}/sns/SimpleNotificationService-{}.pem",
            self.base(),
            self.cert_id()
        )
    }

    fn cert_id(&self) -> String {
        match self.key() {
            Ok((der, _)) => {
                hex::encode(&ring::digest::digest(&ring::digest::SHA256, &der).as_ref()[..16])
            }
            Err(_) => "none".into(),
        }
    }

    /// The key and certificate (generated once).
    fn key(&self) -> Result<(Vec<u8>, String), String> {
        self.key.get_or_init(make_key).clone()
    }

    /// The certificate PEM served at `name`, if it is the key's.
    pub fn cert_named(&self, name: &str) -> Option<String> {
        let want = format!("SimpleNotificationService-{}.pem", self.cert_id());
        (name == want)
            .then(|| self.key().ok().map(|(_, pem)| pem))
            .flatten()
    }

    /// Confirms the subscription whose token is `token`; true if it was it.
    pub fn confirm(&self, url: String, topic: &str, token: &str) -> bool {
        let mut sub = self.sub.lock().unwrap_or_else(|e| e.into_inner());
        let ok = match sub.as_mut() {
            Some(s) if s.token == token && s.topic_arn == topic => {
                s.confirmed = true;
                true
            }
            _ => false,
        };
        if ok {
            self.confirmations
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(url);
        }
        ok
    }

    /// Every `SubscribeURL` fetched so far.
    pub fn confirmations(&self) -> Vec<String> {
        self.confirmations
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The subscription's topic, if subscribed.
    pub fn topic(&self) -> Option<String> {
        let sub = self.sub.lock().unwrap_or_else(|e| e.into_inner());
        sub.as_ref().map(|s| s.topic_arn.clone())
    }
}

/// A new RSA 2048 key (PKCS#8 DER) and a self-signed certificate for it.
fn make_key() -> Result<(Vec<u8>, String), String> {
    use rsa::pkcs8::EncodePrivateKey;
    let key = rsa::PrivateKey::new(&mut getrandom::SysRng, 2048).map_err(|e| e.to_string())?;
    let der = key
        .to_pkcs8_der()
        .map_err(|e| e.to_string())?
        .as_bytes()
        .to_vec();
    let pem = key
        .to_pkcs8_pem(rsa::pkcs8::LineEnding::LF)
        .map_err(|e| e.to_string())?;
    let pair = rcgen::KeyPair::from_pkcs8_pem_and_sign_algo(&pem, &rcgen::PKCS_RSA_SHA256)
        .map_err(|e| e.to_string())?;
    let mut params = rcgen::CertificateParams::new(vec!["sns.amazonaws.com".to_string()])
        .map_err(|e| e.to_string())?;
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "sns.amazonaws.com");
    let cert = params.self_signed(&pair).map_err(|e| e.to_string())?;
    Ok((der, cert.pem()))
}

/// The string SNS signs for `m` (a message object without its signature).
pub fn string_to_sign(m: &Value) -> String {
    let kind = m["Type"].as_str().unwrap_or("");
    let names: &[&str] = if kind == "Notification" {
        &[
            "Message",
            "MessageId",
            "Subject",
            "Timestamp",
            "TopicArn",
            "Type",
        ]
    } else {
        &[
            "Message",
            "MessageId",
            "SubscribeURL",
            "Timestamp",
            "Token",
            "TopicArn",
            "Type",
        ]
    };
    names
        .iter()
        .filter_map(|n| {
            m.get(*n)
                .and_then(Value::as_str)
                .map(|v| format!("{n}\n{v}\n"))
        })
        .collect()
}

/// Signs `m` in place (`SignatureVersion`, `Signature`, `SigningCertURL`):
/// RSASSA-PKCS1-v1_5 over the string to sign with SHA-1 (version 1) or
/// SHA-256 (2). `ring` signs no SHA-1, so the `rsa` crate does.
fn sign(sns: &Sns, m: &mut Value, version: u8) -> Result<(), String> {
    use rsa::pkcs8::DecodePrivateKey;
    let (der, _) = sns.key()?;
    let key = rsa::PrivateKey::from_pkcs8_der(&der).map_err(|e| e.to_string())?;
    let data = string_to_sign(m);
    let sig = match version {
        2 => key.pkcs1v15_sign::<rsa::sha2::Sha256>(data.as_bytes()),
        _ => key.pkcs1v15_sign::<sha1::Sha1>(data.as_bytes()),
    }
    .map_err(|e| e.to_string())?;
    m["SignatureVersion"] = json!(version.to_string());
    m["Signature"] = json!(base64::engine::general_purpose::STANDARD.encode(sig));
    m["SigningCertURL"] = json!(sns.cert_url());
    Ok(())
}

/// `YYYY-MM-DDTHH:MM:SS.mmmZ`.
fn timestamp() -> String {
    let now = time::OffsetDateTime::from_unix_timestamp_nanos(now_ms() as i128 * 1_000_000)
        .unwrap_or(time::OffsetDateTime::UNIX_EPOCH);
    let format = time::macros::format_description!(
        "[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:3]Z"
    );
    now.format(format).unwrap_or_default()
}

mod deliver;
pub(crate) mod routes;

#[cfg(test)]
mod tests;
