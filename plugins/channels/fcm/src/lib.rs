//! Channel plugin `fcm`: Firebase Cloud Messaging, HTTP v1 API.
//!
//! Auth: OAuth2 for server-to-server applications
//! (<https://developers.google.com/identity/protocols/oauth2/service-account>,
//! "Preparing to make an authorized API call" / "Creating a JWT"): a JWT
//! signed RS256 with the service account's `private_key` (header `kid` =
//! `private_key_id`; claims `iss` = `client_email`, `scope` =
//! `https://www.googleapis.com/auth/firebase.messaging`, `aud` = the token
//! URL, `iat`, `exp` = `iat` + 3600) is exchanged at the token URL
//! (`grant_type=urn:ietf:params:oauth:grant-type:jwt-bearer`) for an access
//! token, kept in the shared cache until 5 minutes before `expires_in`. A 401
//! on a send mints a new one and sends once more.
//!
//! Send: `POST /v1/projects/{project_id}/messages:send` with
//! `{"message":{"token":<recipient>,"notification":{"title","body"}?,"data":{...}}}`
//! (<https://firebase.google.com/docs/reference/fcm/rest/v1/projects.messages/send>):
//! params `title` / `body` make the notification; every param and
//! `template` go in `data`. 200 sent (provider id = `name`). Errors by the
//! `errorCode` of the `FcmError` detail (`provider_auth::fcm::classify`,
//! <https://firebase.google.com/docs/reference/fcm/rest/v1/ErrorCode>):
//! UNREGISTERED / INVALID_ARGUMENT / SENDER_ID_MISMATCH / THIRD_PARTY_AUTH_ERROR
//! permanent; QUOTA_EXCEEDED retryable, honouring `Retry-After`;
//! UNAVAILABLE / INTERNAL (and any 5xx) unknown — FCM does not say such a
//! message was not taken, so `on_unknown` decides, as for a cut-off answer
//! (docs/providers.md, "FCM").
//!
//! Capabilities: none. The send API takes no client reference (the `Message`
//! resource has no idempotency field) and offers no per-message status query
//! or delivery callback (same reference pages): a resend is a second
//! notification, so unknown outcomes follow the host's `on_unknown`.

use channel_sdk::provider::auth::{self, Class, fcm, jwt};
use channel_sdk::provider::{
    Attempt, post_form, post_json, refused_by, setting_or, token_answer, with_token,
};
use channel_sdk::serde_json::{self, Value, json};
use channel_sdk::{Channel, Message, Receipt, SendError, http, now_ms, require, setting};

/// The real send endpoint; setting `endpoint` overrides it.
const ENDPOINT: &str = "https://fcm.googleapis.com";
/// Google's token URL, when neither setting `token_endpoint` nor the key's
/// `token_uri` names one.
const TOKEN_URL: &str = "https://oauth2.googleapis.com/token";

/// The plugin.
struct Fcm;

/// The fields of a service-account key file this plugin uses.
struct ServiceAccount {
    client_email: String,
    private_key: String,
    private_key_id: String,
    token_uri: String,
    project_id: String,
}

impl Channel for Fcm {
    fn send(msg: Message) -> Result<Receipt, SendError> {
        let sa = service_account()?;
        let endpoint = setting_or("endpoint", ENDPOINT)
            .trim_end_matches('/')
            .to_string();
        let url = format!("{endpoint}/v1/projects/{}/messages:send", sa.project_id);
        let body = json!({ "message": fcm::message(&msg.recipient, &msg.template, &msg.params) });
        let cache_key = format!("oauth2:{}", auth::key_digest(&sa.client_email, 16));
        with_token(
            "FCM",
            &cache_key,
            || mint(&sa),
            |token| {
                let bearer = format!("Bearer {token}");
                match post_json(&url, &[("authorization", &bearer)], &body) {
                    Ok(resp) => sent(&resp),
                    Err(e) => Attempt::Done(Err(e.into())),
                }
            },
        )
    }
}

/// What a send answer comes to.
fn sent(resp: &http::Response) -> Attempt<Receipt> {
    let body = resp.json();
    if resp.status == 200 {
        return Attempt::Done(match body.get("name").and_then(Value::as_str) {
            Some(name) => Ok(Receipt {
                provider_message_id: name.to_string(),
                reference: None,
            }),
            None => Err(SendError::Unknown(
                "FCM answered 200 without a message name".into(),
            )),
        });
    }
    let refusal = fcm::classify(resp.status, &body);
    match refusal.class {
        Class::Refresh => Attempt::TokenRefused(refusal),
        _ => Attempt::Done(Err(refused_by("FCM", &refusal, resp))),
    }
}

/// The service account of setting `service_account` (the key file's JSON).
fn service_account() -> Result<ServiceAccount, SendError> {
    let raw = require("service_account")?;
    let bad = |why: &str| SendError::Permanent(format!("channel setting `service_account` {why}"));
    let json: Value = serde_json::from_str(&raw).map_err(|_| bad("is not JSON"))?;
    let field = |k: &str| json.get(k).and_then(Value::as_str).map(str::to_string);
    let need = |k: &str| field(k).ok_or_else(|| bad(&format!("has no `{k}`")));
    let project_id = setting("project_id")
        .filter(|p| !p.is_empty())
        .map_or_else(|| need("project_id"), Ok)?;
    if !project_id
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b':' | b'.'))
    {
        return Err(bad(
            "names a project id with characters outside [A-Za-z0-9-:.]",
        ));
    }
    Ok(ServiceAccount {
        client_email: need("client_email")?,
        private_key: need("private_key")?,
        private_key_id: need("private_key_id")?,
        token_uri: setting("token_endpoint")
            .filter(|u| !u.is_empty())
            .or_else(|| field("token_uri"))
            .unwrap_or_else(|| TOKEN_URL.to_string()),
        project_id,
    })
}

/// A new access token for `sa` and how long to keep it (ms).
fn mint(sa: &ServiceAccount) -> Result<(String, u64), SendError> {
    let iat = now_ms() / 1000;
    let header = json!({"alg": "RS256", "typ": "JWT", "kid": sa.private_key_id});
    let claims = json!({
        "iss": sa.client_email,
        "scope": fcm::SCOPE,
        "aud": sa.token_uri,
        "iat": iat,
        "exp": iat + 3600,
    });
    let assertion = jwt::encode(
        &header,
        &claims,
        jwt::rs256,
        &sa.private_key,
        "the service account's private_key",
    )
    .map_err(|e| SendError::Permanent(e.to_string()))?;
    let resp = post_form(
        &sa.token_uri,
        &[
            ("grant_type", "urn:ietf:params:oauth:grant-type:jwt-bearer"),
            ("assertion", &assertion),
        ],
    )
    .map_err(|e| SendError::retryable(format!("token endpoint: {e}")))?;
    if let Some(token) = token_answer(&resp, 3599) {
        return Ok(token);
    }
    let error = resp
        .json()
        .get("error")
        .and_then(Value::as_str)
        .unwrap_or("no error code")
        .to_string();
    let refusal = auth::Refusal::new(
        auth::class_of_status(resp.status),
        format!("status {} ({error})", resp.status),
    );
    let refusal = match refusal.class {
        Class::Permanent => {
            refusal.because("the service account key was refused: check `service_account`")
        }
        _ => refusal,
    };
    Err(refused_by("the OAuth2 token endpoint", &refusal, &resp))
}

channel_sdk::export_channel!(Fcm);
