//! A Standard Webhooks receiver (the end of the line for the `webhook`
//! channel): `POST /webhook/{endpoint}`.
//!
//! As the specification tells receivers to: the `webhook-signature`
//! (`v1,<base64 HMAC-SHA256(key, "{id}.{timestamp}.{body}")>`, key = the
//! base64 part of the `whsec_` secret; several space-separated signatures
//! allowed) is verified, a `webhook-timestamp` more than 5 minutes off is
//! refused, and a `webhook-id` this endpoint received less than
//! [`crate::Config::webhook_dedupe_window`] ago (5 minutes, the spec's "save
//! the IDs in redis for 5 minutes") is acknowledged without a second delivery
//! (counted in [`crate::Accepted::replays`]); an older one is a new delivery.

use crate::ledger::{Dedupe, Incoming, Verdict, cut_off, pause, taken, with_retry_after};
use crate::{SimState, now_secs};
use axum::{
    Json, Router,
    body::Bytes,
    extract::{Path, State},
    http::{HeaderMap, StatusCode},
    response::{IntoResponse, Response},
    routing::post,
};
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use ring::hmac;
use serde_json::{Value, json};

const PROVIDER: &str = "webhook";
/// Largest accepted distance between `webhook-timestamp` and now.
pub const TOLERANCE_SECS: i64 = 5 * 60;

/// The routes.
pub fn routes() -> Router<SimState> {
    Router::new().route("/webhook/{endpoint}", post(receive))
}

fn key(secret: &str) -> Option<hmac::Key> {
    let key = STANDARD.decode(secret.strip_prefix("whsec_")?).ok()?;
    Some(hmac::Key::new(hmac::HMAC_SHA256, &key))
}

fn signed_content(id: &str, timestamp: &str, body: &[u8]) -> Vec<u8> {
    [format!("{id}.{timestamp}.").as_bytes(), body].concat()
}

/// `v1,<base64 signature>` of one message with a `whsec_` secret; `None` if
/// the secret is not `whsec_` + base64.
pub fn sign(secret: &str, id: &str, timestamp: &str, body: &[u8]) -> Option<String> {
    let tag = hmac::sign(&key(secret)?, &signed_content(id, timestamp, body));
    Some(format!("v1,{}", STANDARD.encode(tag)))
}

/// True if one of the space-separated `v1,<base64>` signatures matches
/// (compared in constant time by ring).
pub fn verify_signatures(
    secret: &str,
    id: &str,
    timestamp: &str,
    body: &[u8],
    signatures: &str,
) -> bool {
    let Some(key) = key(secret) else { return false };
    let content = signed_content(id, timestamp, body);
    signatures.split(' ').any(|s| {
        s.strip_prefix("v1,")
            .and_then(|b| STANDARD.decode(b).ok())
            .is_some_and(|tag| hmac::verify(&key, &content, &tag).is_ok())
    })
}

/// Why a delivery is refused before it is looked at.
fn verify(
    secret: &str,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<String, (StatusCode, &'static str)> {
    let get = |n: &str| headers.get(n).and_then(|v| v.to_str().ok());
    let (Some(id), Some(ts), Some(sigs)) = (
        get("webhook-id"),
        get("webhook-timestamp"),
        get("webhook-signature"),
    ) else {
        return Err((
            StatusCode::BAD_REQUEST,
            "missing webhook-id, webhook-timestamp or webhook-signature",
        ));
    };
    let at: i64 = ts.parse().map_err(|_| {
        (
            StatusCode::BAD_REQUEST,
            "webhook-timestamp is not unix seconds",
        )
    })?;
    if (now_secs() - at).abs() > TOLERANCE_SECS {
        return Err((
            StatusCode::BAD_REQUEST,
            "webhook-timestamp too far from now",
        ));
    }
    if !verify_signatures(secret, id, ts, body, sigs) {
        return Err((StatusCode::UNAUTHORIZED, "no matching signature"));
    }
    Ok(id.to_string())
}

fn answer(status: StatusCode, message: &str) -> Response {
    (status, Json(json!({ "error": message }))).into_response()
}

async fn receive(
    State(state): State<SimState>,
    Path(endpoint): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let id = match verify(&state.credentials().webhook_secret, &headers, &body) {
        Ok(id) => id,
        Err((status, why)) => {
            state.lock().count(PROVIDER, "bad_signature");
            return answer(status, why);
        }
    };
    let payload: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    pause(&state, PROVIDER).await;
    let mut sim = state.lock();
    let retry_after = sim.retry_after(PROVIDER);
    let server_error = || {
        with_retry_after(
            answer(StatusCode::SERVICE_UNAVAILABLE, "simulated outage"),
            retry_after,
        )
    };
    match sim.roll(PROVIDER, &endpoint) {
        Verdict::ServerError => server_error(),
        Verdict::RateLimited => with_retry_after(
            answer(StatusCode::TOO_MANY_REQUESTS, "slow down"),
            retry_after,
        ),
        Verdict::Permanent(code) => {
            let status = code
                .parse()
                .ok()
                .and_then(|c| StatusCode::from_u16(c).ok())
                .unwrap_or(StatusCode::GONE);
            answer(status, "refused for this endpoint")
        }
        Verdict::DropBeforeAccept => cut_off(),
        Verdict::Accept { drop: cut, fail } => {
            let outcome = sim.accept(
                PROVIDER,
                Incoming {
                    id: Some(id.clone()),
                    reference: Some(id.clone()),
                    key: Some(format!("{endpoint}\n{id}")),
                    recipient: endpoint,
                    template: payload["type"].as_str().unwrap_or("").to_string(),
                    params: payload["data"].clone(),
                },
                Dedupe::Within(state.config.webhook_dedupe_window),
            );
            let after_accept = sim.slow_after_accept(PROVIDER);
            drop(sim);
            let ok = || {
                (
                    StatusCode::OK,
                    Json(json!({"received": outcome.id, "duplicate": outcome.replay})),
                )
                    .into_response()
            };
            taken(cut, fail.then(server_error), ok, after_accept)
        }
    }
}

#[cfg(test)]
mod tests {
    /// The Standard Webhooks specification's example (docs/providers.md,
    /// "Standard Webhooks").
    #[test]
    fn standard_webhooks_vector() {
        assert_eq!(
            super::sign(
                "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
                "msg_p5jXN8AQM9LWM0D4loKWxJek",
                "1614265330",
                br#"{"test": 2432232314}"#
            )
            .as_deref(),
            Some("v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=")
        );
    }
}
