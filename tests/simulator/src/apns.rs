//! APNs provider API: HTTP/2 only, `POST /3/device/{device-token}`.
//!
//! The provider token (`authorization: bearer <JWT ES256>`, header `kid` =
//! key id, claims `iss` = team id, `iat`) is verified with the team key's
//! public half; `ExpiredProviderToken` (403) once its `iat` is older than an
//! hour; `TooManyProviderTokenUpdates` (429) for a new token on a connection
//! less than 20 minutes after that connection's previous one. An HTTP/1.1 request is refused (505): Apple
//! serves HTTP/2 only. No dedupe: `apns-id` is echoed, a resend is a second
//! notification.

use crate::ledger::{Dedupe, Incoming, Verdict, cut_off, pause, taken, with_retry_after};
use crate::tls::ConnectionId;
use crate::{SimState, now_ms, now_secs};
use axum::{
    Extension, Json, Router,
    body::Bytes,
    extract::{Path, State},
    http::{HeaderMap, HeaderValue, StatusCode, Version},
    response::{IntoResponse, Response},
    routing::post,
};
use serde_json::{Value, json};

const PROVIDER: &str = "apns";

/// The routes.
pub fn routes() -> Router<SimState> {
    Router::new().route("/3/device/{device}", post(send))
}

fn reason(status: StatusCode, reason: &str) -> Response {
    (status, Json(json!({ "reason": reason }))).into_response()
}

/// A refusal before the send is looked at: status and Apple's `reason`.
struct Refusal(StatusCode, &'static str);

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        reason(self.0, self.1)
    }
}

fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

/// Verifies the provider token; `Err` is Apple's answer.
fn check_provider_token(
    state: &SimState,
    connection: ConnectionId,
    headers: &HeaderMap,
) -> Result<(), Refusal> {
    let forbidden = |r: &'static str| Refusal(StatusCode::FORBIDDEN, r);
    let token = header(headers, "authorization")
        .and_then(|v| {
            v.strip_prefix("bearer ")
                .or_else(|| v.strip_prefix("Bearer "))
        })
        .ok_or_else(|| forbidden("MissingProviderToken"))?;
    let jwt = crate::jwt::parse(token).ok_or_else(|| forbidden("InvalidProviderToken"))?;
    let creds = state.credentials();
    let well_formed = jwt.header["alg"] == "ES256"
        && jwt.header["kid"] == json!(creds.apns_key_id)
        && jwt.claims["iss"] == json!(creds.apns_team_id);
    if !well_formed
        || !crate::jwt::verify_es256(
            &state.keys.apns_public,
            jwt.signing_input.as_bytes(),
            &jwt.signature,
        )
    {
        return Err(forbidden("InvalidProviderToken"));
    }
    let iat = jwt.claims["iat"]
        .as_i64()
        .ok_or_else(|| forbidden("InvalidProviderToken"))?;
    if now_secs() - iat > state.config.apns_token_max_age.as_secs() as i64 {
        return Err(forbidden("ExpiredProviderToken"));
    }
    let mut sim = state.lock();
    match sim.apns_tokens.get(&connection).copied() {
        Some((seen, _)) if seen == iat => Ok(()),
        Some((_, since))
            if now_ms().saturating_sub(since)
                < state.config.apns_min_token_interval.as_millis() as u64 =>
        {
            Err(Refusal(
                StatusCode::TOO_MANY_REQUESTS,
                "TooManyProviderTokenUpdates",
            ))
        }
        _ => {
            sim.apns_tokens.insert(connection, (iat, now_ms()));
            Ok(())
        }
    }
}

fn valid_apns_id(id: &str) -> bool {
    let groups: Vec<&str> = id.split('-').collect();
    groups.iter().map(|g| g.len()).eq([8, 4, 4, 4, 12])
        && groups
            .iter()
            .all(|g| g.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// Checks the request's form: topic, device token, `apns-id`, payload.
fn check_request(headers: &HeaderMap, device: &str, body: &[u8]) -> Result<Value, Refusal> {
    let bad = |r: &'static str| Refusal(StatusCode::BAD_REQUEST, r);
    if header(headers, "apns-topic").is_none_or(str::is_empty) {
        return Err(bad("MissingTopic"));
    }
    const PUSH_TYPES: [&str; 8] = [
        "alert",
        "background",
        "location",
        "voip",
        "complication",
        "fileprovider",
        "mdm",
        "liveactivity",
    ];
    if header(headers, "apns-push-type").is_some_and(|t| !PUSH_TYPES.contains(&t)) {
        return Err(bad("InvalidPushType"));
    }
    if device.len() != 64 || !device.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(bad("BadDeviceToken"));
    }
    if header(headers, "apns-id").is_some_and(|id| !valid_apns_id(id)) {
        return Err(bad("BadMessageId"));
    }
    if body.is_empty() {
        return Err(bad("PayloadEmpty"));
    }
    if body.len() > 4096 {
        return Err(Refusal(StatusCode::PAYLOAD_TOO_LARGE, "PayloadTooLarge"));
    }
    serde_json::from_slice::<Value>(body)
        .ok()
        .filter(|v| v["aps"].is_object())
        .ok_or_else(|| bad("BadPayload"))
}

async fn send(
    State(state): State<SimState>,
    Path(device): Path<String>,
    version: Version,
    connection: Option<Extension<ConnectionId>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if version != Version::HTTP_2 {
        state.lock().count(PROVIDER, "http1_refused");
        return reason(StatusCode::HTTP_VERSION_NOT_SUPPORTED, "HTTP/2 required");
    }
    if let Err(refused) = check_provider_token(
        &state,
        connection.map_or(ConnectionId(u64::MAX), |c| c.0),
        &headers,
    ) {
        let outcome = match refused.1 {
            "ExpiredProviderToken" => "expired_token",
            _ => "bad_token",
        };
        state.lock().count(PROVIDER, outcome);
        return refused.into_response();
    }
    let payload = match check_request(&headers, &device, &body) {
        Ok(p) => p,
        Err(refused) => return refused.into_response(),
    };
    pause(&state, PROVIDER).await;
    let mut sim = state.lock();
    let retry_after = sim.retry_after(PROVIDER);
    let server_error = || {
        with_retry_after(
            reason(StatusCode::SERVICE_UNAVAILABLE, "ServiceUnavailable"),
            retry_after,
        )
    };
    match sim.roll(PROVIDER, &device) {
        Verdict::ServerError => server_error(),
        Verdict::RateLimited => with_retry_after(
            reason(StatusCode::TOO_MANY_REQUESTS, "TooManyRequests"),
            retry_after,
        ),
        Verdict::Permanent(code) if code == "Unregistered" => (
            StatusCode::GONE,
            Json(json!({"reason": "Unregistered", "timestamp": now_ms()})),
        )
            .into_response(),
        Verdict::Permanent(code) => reason(StatusCode::BAD_REQUEST, &code),
        Verdict::DropBeforeAccept => cut_off(),
        Verdict::Accept { drop: cut, fail } => {
            let sent_id = header(&headers, "apns-id").map(str::to_string);
            let outcome = sim.accept(
                PROVIDER,
                Incoming {
                    id: sent_id.clone(),
                    reference: sent_id,
                    key: None,
                    recipient: device,
                    template: payload["aps"]["alert"]["title"]
                        .as_str()
                        .unwrap_or("")
                        .to_string(),
                    params: payload,
                },
                Dedupe::Never,
            );
            let after_accept = sim.slow_after_accept(PROVIDER);
            drop(sim);
            let ok = || {
                let mut ok = StatusCode::OK.into_response();
                if let Ok(v) = HeaderValue::from_str(&outcome.id) {
                    ok.headers_mut().insert("apns-id", v);
                }
                ok
            };
            taken(cut, fail.then(server_error), ok, after_accept)
        }
    }
}
