//! Channel plugin `apns`: Apple Push Notification service, HTTP/2 only (the
//! host negotiates it by ALPN).
//!
//! Auth: token-based ("Establishing a token-based connection to APNs",
//! <https://developer.apple.com/documentation/usernotifications/establishing-a-token-based-connection-to-apns>):
//! a JWT signed ES256 with the `.p8` key (header `alg`, `kid` = `key_id`;
//! claims `iss` = `team_id`, `iat`). Apple refuses tokens older than an hour
//! (`ExpiredProviderToken`) and refreshes more often than every 20 minutes
//! (`TooManyProviderTokenUpdates`), so one token is shared through the cache
//! for 50 minutes; on `ExpiredProviderToken` a new one is minted and the push
//! sent once more.
//!
//! Send: `POST /3/device/<device token>` ("Sending notification requests to
//! APNs", <https://developer.apple.com/documentation/usernotifications/sending-notification-requests-to-apns>)
//! with `authorization: bearer <JWT>`, `apns-topic` (setting `topic`),
//! `apns-push-type` (setting `push_type`, default `alert`), `apns-priority`
//! (setting `priority`, default 10), `apns-expiration` (now + setting
//! `expiration`, default 86400 s) and `apns-id`, a UUID derived from the
//! idempotency key. Body `{"aps":{"alert":{"title","body"}},"template":...,
//! <other params>}`. 200 sent (provider id = the `apns-id` answered). Errors
//! by `reason` ("Handling notification responses from APNs", table of reason
//! values; `provider_auth::apns::classify`): BadDeviceToken, Unregistered
//! (410) permanent; TooManyRequests retryable; InternalServerError,
//! ServiceUnavailable, Shutdown (500 / 503) unknown — Apple does not say
//! such a notification was not taken, so `on_unknown` decides, as for a
//! cut-off answer (docs/providers.md, "APNs").
//!
//! Capabilities: none. `apns-id` is only echoed back ("a canonical UUID that
//! is the unique ID for the notification"; nothing documents a dedupe on it),
//! and APNs has no status query and no delivery callback: a resend is a
//! second notification, so unknown outcomes follow the host's `on_unknown`.

use channel_sdk::provider::auth::{Class, apns, jwt};
use channel_sdk::provider::{Attempt, number_setting, refused_by, setting_or, with_token};
use channel_sdk::serde_json::{Value, json};
use channel_sdk::{Channel, Message, Receipt, SendError, http, now_ms, require};

/// The production endpoint; setting `endpoint` overrides it (sandbox:
/// `https://api.sandbox.push.apple.com`).
const ENDPOINT: &str = "https://api.push.apple.com";
/// How long one provider token is used: well inside Apple's hour, and not
/// refreshed more than once every 20 minutes.
const TOKEN_TTL_MS: u64 = 50 * 60 * 1000;

/// The plugin.
struct Apns;

impl Channel for Apns {
    fn send(msg: Message) -> Result<Receipt, SendError> {
        if msg.recipient.is_empty() || !msg.recipient.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(SendError::Permanent(
                "the recipient is not an APNs device token (hex)".into(),
            ));
        }
        let endpoint = setting_or("endpoint", ENDPOINT)
            .trim_end_matches('/')
            .to_string();
        let url = format!("{endpoint}/3/device/{}", msg.recipient);
        let apns_id = apns::apns_id(&msg.idempotency_key);
        let expiration = (now_ms() / 1000 + number_setting("expiration", 86_400)?).to_string();
        let priority = number_setting("priority", 10)?.to_string();
        let topic = require("topic")?;
        let push_type = setting_or("push_type", "alert");
        let body = apns::payload(&msg.template, &msg.params).to_string();
        let key_id = require("key_id")?;
        with_token(
            "APNs",
            &format!("provider_token:{key_id}"),
            || mint(&key_id),
            |token| {
                let bearer = format!("bearer {token}");
                let headers = [
                    ("authorization", bearer.as_str()),
                    ("apns-topic", topic.as_str()),
                    ("apns-push-type", push_type.as_str()),
                    ("apns-priority", priority.as_str()),
                    ("apns-expiration", expiration.as_str()),
                    ("apns-id", apns_id.as_str()),
                    ("content-type", "application/json"),
                ];
                match http::request("POST", &url, &headers, Some(body.as_bytes())) {
                    Ok(resp) => sent(&resp, &apns_id),
                    Err(e) => Attempt::Done(Err(e.into())),
                }
            },
        )
    }
}

/// What a push answer comes to.
fn sent(resp: &http::Response, apns_id: &str) -> Attempt<Receipt> {
    if resp.status == 200 {
        return Attempt::Done(Ok(Receipt {
            provider_message_id: resp.header("apns-id").unwrap_or(apns_id).to_string(),
            reference: Some(apns_id.to_string()),
        }));
    }
    let body = resp.json();
    let refusal = apns::classify(resp.status, body.get("reason").and_then(Value::as_str));
    match refusal.class {
        Class::Refresh => Attempt::TokenRefused(refusal),
        _ => Attempt::Done(Err(refused_by("APNs", &refusal, resp))),
    }
}

/// A new provider token and how long to share it (ms).
fn mint(key_id: &str) -> Result<(String, u64), SendError> {
    let header = json!({"alg": "ES256", "kid": key_id});
    let claims = json!({"iss": require("team_id")?, "iat": now_ms() / 1000});
    let token = jwt::encode(
        &header,
        &claims,
        jwt::es256,
        &require("private_key")?,
        "the APNs `private_key`",
    )
    .map_err(|e| SendError::Permanent(e.to_string()))?;
    Ok((token, TOKEN_TTL_MS))
}

channel_sdk::export_channel!(Apns);
