//! Publishing through the simulated SNS: the subscription and its
//! `SubscriptionConfirmation`, SES notifications once it is confirmed, a
//! one-off (possibly spoiled) push, and posting with SNS's retries.

use super::{PROVIDER, SnsConfig, Subscription, Tamper, sign, timestamp};
use crate::{SimState, ledger::uuid};
use rand::Rng;
use serde_json::{Value, json};

impl SimState {
    /// Subscribes `config.url` to the topic: posts a `SubscriptionConfirmation`
    /// (retried as SNS does); returns the topic.
    pub fn sns_subscribe(&self, config: SnsConfig) -> String {
        let region = &self.config.ses_region;
        let topic_arn = config
            .topic_arn
            .clone()
            .unwrap_or_else(|| super::default_topic_arn(region));
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
            .unwrap_or_else(|| super::default_topic_arn(&self.config.ses_region));
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
