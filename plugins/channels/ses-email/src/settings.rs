//! The channel instance's settings, read through the host's `config` import.
//!
//! - `region` (required): the SES region, e.g. `eu-west-1`; it names the
//!   SigV4 scope and the default endpoints.
//! - `access_key_id`, `secret_access_key` (required to send; the secret from
//!   the environment variable `secrets_from_env` names).
//! - `from` (required to send): `FromEmailAddress`, a verified identity.
//! - `configuration_set` (optional, but needed to see rendering failures):
//!   `ConfigurationSetName`. SES publishes `Rendering Failure` and `Reject`
//!   events (an email it answered a `MessageId` for and never sent) only
//!   through a configuration set's event destination: name a set whose SNS
//!   event destination (the topic the channel's callback URL is subscribed
//!   to) includes Rendering Failure, Reject, Delivery, Bounce and
//!   Complaint. Without it such an email stays `sent` forever.
//! - `endpoint` (default `https://email.<region>.amazonaws.com`).
//! - `template.<name>` (optional): the SES `TemplateName` for messages
//!   naming template `<name>` (1.2.0); a template not mapped goes as it is.
//! - `sns_endpoint` (default `https://sns.<region>.amazonaws.com`): a
//!   `SigningCertURL` or `SubscribeURL` must be `https://` under it.
//! - `topic_arns` (required for callbacks, comma separated): the only
//!   topics whose messages are taken. SNS signs every topic's messages with
//!   the same certificates, so a valid signature says only that SNS sent
//!   the message, not from whose topic: without this setting any AWS
//!   account could subscribe the callback URL to a topic of its own and
//!   post forged bounces and complaints. A callback is refused until it is
//!   set (1.2.0; before, any topic was taken).

use channel_sdk::provider::setting_or;
use channel_sdk::{SendError, require, setting};

/// What sending needs.
pub struct SendSettings {
    /// `region`.
    pub region: String,
    /// `access_key_id`.
    pub access_key_id: String,
    /// `secret_access_key`.
    pub secret_access_key: String,
    /// `from`.
    pub from: String,
    /// `configuration_set`.
    pub configuration_set: Option<String>,
    /// `endpoint`, without a trailing `/`.
    pub endpoint: String,
}

impl SendSettings {
    /// The settings, or a permanent error naming the missing one.
    pub fn read() -> Result<SendSettings, SendError> {
        let region = require("region")?;
        let endpoint = setting_or("endpoint", &format!("https://email.{region}.amazonaws.com"));
        Ok(SendSettings {
            access_key_id: require("access_key_id")?,
            secret_access_key: require("secret_access_key")?,
            from: require("from")?,
            configuration_set: setting("configuration_set").filter(|s| !s.trim().is_empty()),
            endpoint: endpoint.trim_end_matches('/').to_string(),
            region,
        })
    }
}

/// Why a callback is refused while `topic_arns` is unset.
const NO_TOPICS: &str = "channel setting `topic_arns` is not configured: name the SNS topic(s) \
     of the configuration set's event destination (comma separated); SNS signs every topic's \
     messages alike, so without it any AWS account's topic could post notifications here";

/// What verifying a callback needs.
pub struct CallbackSettings {
    /// `sns_endpoint`, without a trailing `/`.
    pub sns_endpoint: String,
    /// `topic_arns`, never empty.
    pub topic_arns: Vec<String>,
}

impl CallbackSettings {
    /// The settings, or what is missing (the callback is then refused).
    pub fn read() -> Result<CallbackSettings, String> {
        let endpoint = match setting("sns_endpoint").filter(|s| !s.is_empty()) {
            Some(e) => e,
            None => {
                let region = setting("region")
                    .filter(|s| !s.is_empty())
                    .ok_or("channel setting `region` (or `sns_endpoint`) is not configured")?;
                format!("https://sns.{region}.amazonaws.com")
            }
        };
        let topic_arns: Vec<String> = setting("topic_arns")
            .unwrap_or_default()
            .split(',')
            .map(|t| t.trim().to_string())
            .filter(|t| !t.is_empty())
            .collect();
        if topic_arns.is_empty() {
            return Err(NO_TOPICS.into());
        }
        Ok(CallbackSettings {
            sns_endpoint: endpoint.trim_end_matches('/').to_string(),
            topic_arns,
        })
    }
}
