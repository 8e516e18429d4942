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
//!   notifications), `Content-Type: text/plain; charset=UTF-8`.
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

use crate::{SimState, ledger::uuid, now_ms};
use base64::Engine;
use rand::Rng;
use serde::Deserialize;
use serde_json::{Value, json};
use std::sync::{Mutex, OnceLock};

const PROVIDER: &str = "ses-email";

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

impl SimState {
    /// Subscribes `config.url` to the topic: posts a `SubscriptionConfirmation`
    /// (retried as SNS does); returns the topic.
    pub fn sns_subscribe(&self, config: SnsConfig) -> String {
        let region = &self.config.ses_region;
        let topic_arn = config
            .topic_arn
            .clone()
            .unwrap_or_else(|| format!("arn:aws:sns:{region}:123456789012:ses-notifications"));
        let token = hex::encode(rand::rng().random::<[u8; 32]>());
        let sub = Subscription {
            config: config.clone(),
            topic_arn: topic_arn.clone(),
            token: token.clone(),
            confirmed: false,
        };
        *self.sns.sub.lock().unwrap_or_else(|e| e.into_inner()) = Some(sub);
        let subscribe_url = format!(
            "{}/sns/?Action=ConfirmSubscription&TopicArn={}&Token={token}",
            self.sns.base(),
            crate::aliyun::percent_encode(&topic_arn)
        );
        let m = json!({
            "Type": "SubscriptionConfirmation",
            "MessageId": uuid(rand::rng().random()),
            "Token": token,
            "TopicArn": topic_arn,
            "Message": format!("You have chosen to subscribe to the topic {topic_arn}.\nTo confirm the subscription, visit the SubscribeURL included in this message."),
            "SubscribeURL": subscribe_url,
            "Timestamp": timestamp(),
        });
        self.spawn_sns(config.url, m, config.signature_version, Tamper::None);
        topic_arn
    }

    /// Publishes an SES notification to the topic, if the subscription is
    /// confirmed (else counted `sns_unconfirmed` and dropped).
    pub(crate) fn sns_publish(&self, ses_notification: &Value) {
        let sub = self
            .sns
            .sub
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let Some(sub) = sub.filter(|s| s.confirmed) else {
            self.lock().count(PROVIDER, "sns_unconfirmed");
            return;
        };
        let m = self.notification(&sub.topic_arn, ses_notification);
        self.spawn_sns(
            sub.config.url,
            m,
            sub.config.signature_version,
            Tamper::None,
        );
    }

    /// A `Notification` message of `topic_arn` carrying `message`.
    fn notification(&self, topic_arn: &str, message: &Value) -> Value {
        let text = match message {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        json!({
            "Type": "Notification",
            "MessageId": uuid(rand::rng().random()),
            "TopicArn": topic_arn,
            "Message": text,
            "Timestamp": timestamp(),
            "UnsubscribeURL": format!("{}/sns/?Action=Unsubscribe&SubscriptionArn={topic_arn}:{}",
                self.sns.base(), uuid(rand::rng().random())),
        })
    }

    /// Posts one notification carrying `message` to `url` (default: the
    /// subscription's), signed with `version`, spoiled as `tamper` says,
    /// once, whatever the subscription's state; the endpoint's status.
    pub async fn sns_push(
        &self,
        url: Option<String>,
        message: &Value,
        version: u8,
        tamper: Tamper,
    ) -> Result<u16, String> {
        let sub = self
            .sns
            .sub
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let topic = sub
            .as_ref()
            .map(|s| s.topic_arn.clone())
            .unwrap_or_else(|| {
                format!(
                    "arn:aws:sns:{}:123456789012:ses-notifications",
                    self.config.ses_region
                )
            });
        let url = url
            .or_else(|| sub.map(|s| s.config.url))
            .ok_or("no `url` and no subscription")?;
        let m = self.notification(&topic, message);
        self.post_sns(&url, m, version, tamper).await
    }

    /// Posts `m` in the background, retried as SNS's default policy does.
    fn spawn_sns(&self, url: String, m: Value, version: u8, tamper: Tamper) {
        let state = self.clone();
        tokio::spawn(async move {
            for attempt in 0..=3u32 {
                if attempt > 0 {
                    state.lock().count(PROVIDER, "sns_retried");
                    tokio::time::sleep(state.config.sns_retry_delay).await;
                }
                if let Ok(status) = state.post_sns(&url, m.clone(), version, tamper).await
                    && (200..300).contains(&status)
                {
                    state.lock().count(PROVIDER, "sns_posted");
                    return;
                }
            }
            state.lock().count(PROVIDER, "sns_failed");
        });
    }

    /// Signs and posts `m` once; the endpoint's status.
    async fn post_sns(
        &self,
        url: &str,
        mut m: Value,
        version: u8,
        tamper: Tamper,
    ) -> Result<u16, String> {
        sign(&self.sns, &mut m, version)?;
        match tamper {
            Tamper::None => {}
            Tamper::Body => {
                let text =
                    m["Message"]
                        .as_str()
                        .unwrap_or("")
                        .replacen("Permanent", "Transient", 1);
                m["Message"] = json!(format!("{text} "));
            }
            Tamper::Signature => {
                let s = m["Signature"].as_str().unwrap_or("").to_string();
                let flipped = if s.starts_with('A') { "B" } else { "A" };
                m["Signature"] = json!(format!("{flipped}{}", &s[1.min(s.len())..]));
            }
        }
        let kind = m["Type"].as_str().unwrap_or("").to_string();
        let mut req = self
            .http
            .post(url)
            .header("content-type", "text/plain; charset=UTF-8")
            .header("user-agent", "Amazon Simple Notification Service Agent")
            .header("x-amz-sns-message-type", &kind)
            .header(
                "x-amz-sns-message-id",
                m["MessageId"].as_str().unwrap_or(""),
            )
            .header("x-amz-sns-topic-arn", m["TopicArn"].as_str().unwrap_or(""));
        if kind == "Notification" {
            let arn = format!(
                "{}:{}",
                m["TopicArn"].as_str().unwrap_or(""),
                "sim-subscription"
            );
            req = req.header("x-amz-sns-subscription-arn", arn);
        }
        let resp = req
            .body(m.to_string())
            .send()
            .await
            .map_err(|e| e.without_url().to_string())?;
        Ok(resp.status().as_u16())
    }
}

pub(crate) mod routes;

#[cfg(test)]
mod tests;
