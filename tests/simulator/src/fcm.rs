//! FCM HTTP v1 and Google's OAuth2 token endpoint.
//!
//! - `POST /token` (form `grant_type=urn:ietf:params:oauth:grant-type:jwt-bearer`,
//!   `assertion=<JWT>`): the RS256 assertion is verified against the service
//!   account's public key; `kid`, `iss`, `aud`, `scope`, `iat`/`exp`
//!   (≤ 1 hour, not expired) checked as Google documents; answers
//!   `{"access_token","expires_in":3599,"token_type":"Bearer"}`.
//! - `POST /v1/projects/{p}/messages:send` needs `Authorization: Bearer` with a
//!   valid, unexpired token (else 401 UNAUTHENTICATED). No client reference
//!   and no dedupe: a resend is a second notification. `validate_only: true`
//!   is checked and answered without delivering anything.
//! - Errors: `{"error":{"code","message","status","details":[FcmError]}}`;
//!   429 QUOTA_EXCEEDED and 503 UNAVAILABLE carry `Retry-After`.

use crate::ledger::{Dedupe, Incoming, Verdict, cut_off, pause, taken, with_retry_after};
use crate::{Credentials, SimState, now_ms, now_secs};
use axum::{
    Json, Router,
    body::Bytes,
    extract::{Path, State},
    http::{HeaderMap, StatusCode, Uri},
    response::{IntoResponse, Response},
    routing::post,
};
use rand::Rng;
use serde_json::{Value, json};

const PROVIDER: &str = "fcm";
/// The OAuth scope FCM needs.
pub const SCOPE: &str = "https://www.googleapis.com/auth/firebase.messaging";
/// Google's real token URI (accepted as `aud` besides the URI as called).
pub const GOOGLE_TOKEN_URI: &str = "https://oauth2.googleapis.com/token";
const JWT_BEARER: &str = "urn:ietf:params:oauth:grant-type:jwt-bearer";

/// The routes.
pub fn routes() -> Router<SimState> {
    Router::new()
        .route("/token", post(token))
        .route("/v1/projects/{project}/messages:send", post(send))
}

/// The service-account key JSON, `token_uri` = `{base_url}/token`.
pub fn service_account(creds: &Credentials, base_url: &str) -> Value {
    json!({
        "type": "service_account",
        "project_id": creds.fcm_project_id,
        "private_key_id": creds.fcm_private_key_id,
        "private_key": creds.fcm_private_key_pem,
        "client_email": creds.fcm_client_email,
        "client_id": "100000000000000000001",
        "auth_uri": "https://accounts.google.com/o/oauth2/auth",
        "token_uri": format!("{}/token", base_url.trim_end_matches('/')),
    })
}

fn oauth_error(error: &str, description: &str) -> Response {
    (
        StatusCode::BAD_REQUEST,
        Json(json!({"error": error, "error_description": description})),
    )
        .into_response()
}

/// An OAuth error: `error` and `error_description`.
struct OAuthError(&'static str, &'static str);

impl IntoResponse for OAuthError {
    fn into_response(self) -> Response {
        oauth_error(self.0, self.1)
    }
}

/// Checks the assertion's signature and claims; `Err` is the OAuth answer.
fn check_assertion(state: &SimState, assertion: &str, token_uri: &str) -> Result<(), OAuthError> {
    let invalid = |d: &'static str| OAuthError("invalid_grant", d);
    let jwt = crate::jwt::parse(assertion).ok_or_else(|| invalid("Invalid JWT: not a JWS."))?;
    let creds = state.credentials();
    if jwt.header["alg"] != "RS256" {
        return Err(invalid("Invalid JWT: alg must be RS256."));
    }
    if jwt.header["kid"] != json!(creds.fcm_private_key_id) {
        return Err(invalid("Invalid JWT Signature."));
    }
    if !crate::jwt::verify_rs256(
        &state.keys.fcm_public,
        jwt.signing_input.as_bytes(),
        &jwt.signature,
    ) {
        return Err(invalid("Invalid JWT Signature."));
    }
    let c = &jwt.claims;
    if c["iss"] != json!(creds.fcm_client_email) {
        return Err(invalid(
            "Invalid issuer: the client_email is not the service account's.",
        ));
    }
    let aud = c["aud"].as_str().unwrap_or("");
    if aud != token_uri && aud != GOOGLE_TOKEN_URI {
        return Err(invalid("Invalid JWT: Failed audience check."));
    }
    let (iat, exp) = (
        c["iat"].as_i64().unwrap_or(0),
        c["exp"].as_i64().unwrap_or(0),
    );
    let now = now_secs();
    if exp <= iat || exp - iat > 3600 || exp <= now || iat > now + 60 {
        return Err(invalid(
            "Invalid JWT: Token must be a short-lived token (60 minutes) and in a reasonable timeframe. Check your iat and exp values in the JWT claim.",
        ));
    }
    let scopes = c["scope"].as_str().unwrap_or("");
    if !scopes.split(' ').any(|s| s == SCOPE) {
        return Err(OAuthError(
            "invalid_scope",
            "Invalid OAuth scope or ID token audience provided.",
        ));
    }
    Ok(())
}

async fn token(
    State(state): State<SimState>,
    headers: HeaderMap,
    uri: Uri,
    body: Bytes,
) -> Response {
    let form: std::collections::HashMap<String, String> =
        crate::aliyun::parse_pairs(&String::from_utf8_lossy(&body).replace('+', " "))
            .into_iter()
            .collect();
    if form.get("grant_type").map(String::as_str) != Some(JWT_BEARER) {
        return oauth_error("unsupported_grant_type", "Invalid grant_type.");
    }
    let host = headers
        .get("host")
        .and_then(|h| h.to_str().ok())
        .map(str::to_string)
        .or_else(|| uri.authority().map(|a| a.to_string()))
        .unwrap_or_default();
    let token_uri = format!("https://{host}/token");
    if let Err(refused) = check_assertion(
        &state,
        form.get("assertion").map(String::as_str).unwrap_or(""),
        &token_uri,
    ) {
        state.lock().count(PROVIDER, "bad_assertion");
        return refused.into_response();
    }
    let mut sim = state.lock();
    let token = format!("ya29.sim{:032x}", sim.rng.random::<u128>());
    let ttl = state.config.fcm_token_ttl;
    sim.fcm_tokens
        .insert(token.clone(), now_ms() + ttl.as_millis() as u64);
    sim.count(PROVIDER, "token");
    Json(json!({"access_token": token, "expires_in": ttl.as_secs(), "token_type": "Bearer"}))
        .into_response()
}

/// An FCM error answer; `fcm_code` adds the FcmError detail.
pub fn fcm_error(
    status: StatusCode,
    name: &str,
    message: &str,
    fcm_code: Option<&str>,
) -> Response {
    let mut error = json!({"code": status.as_u16(), "message": message, "status": name});
    if let Some(code) = fcm_code {
        error["details"] = json!([{"@type": "type.googleapis.com/google.firebase.fcm.v1.FcmError", "errorCode": code}]);
    }
    (status, Json(json!({ "error": error }))).into_response()
}

/// The status and canonical name an FcmError code comes with.
fn status_of(code: &str) -> (StatusCode, &'static str) {
    match code {
        "UNREGISTERED" => (StatusCode::NOT_FOUND, "NOT_FOUND"),
        "SENDER_ID_MISMATCH" => (StatusCode::FORBIDDEN, "PERMISSION_DENIED"),
        "THIRD_PARTY_AUTH_ERROR" => (StatusCode::UNAUTHORIZED, "UNAUTHENTICATED"),
        "QUOTA_EXCEEDED" => (StatusCode::TOO_MANY_REQUESTS, "RESOURCE_EXHAUSTED"),
        "UNAVAILABLE" => (StatusCode::SERVICE_UNAVAILABLE, "UNAVAILABLE"),
        "INTERNAL" => (StatusCode::INTERNAL_SERVER_ERROR, "INTERNAL"),
        _ => (StatusCode::BAD_REQUEST, "INVALID_ARGUMENT"),
    }
}

fn unauthenticated() -> Response {
    fcm_error(
        StatusCode::UNAUTHORIZED,
        "UNAUTHENTICATED",
        "Request had invalid authentication credentials. Expected OAuth 2 access token, login cookie or other valid authentication credential.",
        None,
    )
}

/// Checks the Bearer token: `None` if valid and unexpired.
fn check_bearer(state: &SimState, headers: &HeaderMap) -> Option<Response> {
    let bearer = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    let mut sim = state.lock();
    match bearer.and_then(|t| sim.fcm_tokens.get(t).copied()) {
        Some(exp) if exp > now_ms() => None,
        Some(_) => {
            sim.count(PROVIDER, "expired_token");
            Some(unauthenticated())
        }
        None => {
            sim.count(PROVIDER, "invalid_token");
            Some(unauthenticated())
        }
    }
}

async fn send(
    State(state): State<SimState>,
    Path(project): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if let Some(refused) = check_bearer(&state, &headers) {
        return refused;
    }
    if project != state.credentials().fcm_project_id {
        return fcm_error(
            StatusCode::FORBIDDEN,
            "PERMISSION_DENIED",
            "Permission 'cloudmessaging.messages.create' denied on resource.",
            None,
        );
    }
    let request = serde_json::from_slice::<Value>(&body).unwrap_or(Value::Null);
    let message = request.get("message").cloned();
    let Some((device, message)) = message
        .as_ref()
        .and_then(|m| Some((m["token"].as_str()?.to_string(), m)))
    else {
        return fcm_error(
            StatusCode::BAD_REQUEST,
            "INVALID_ARGUMENT",
            "Request contains an invalid argument.",
            Some("INVALID_ARGUMENT"),
        );
    };
    if request["validate_only"] == json!(true) {
        // Checked, not delivered: FCM answers a fake message name.
        let name = format!("projects/{project}/messages/fake_message_id");
        return Json(json!({ "name": name })).into_response();
    }
    pause(&state, PROVIDER).await;
    let mut sim = state.lock();
    let retry_after = sim.retry_after(PROVIDER);
    let server_error = || {
        with_retry_after(
            fcm_error(
                StatusCode::SERVICE_UNAVAILABLE,
                "UNAVAILABLE",
                "The service is currently unavailable.",
                Some("UNAVAILABLE"),
            ),
            retry_after,
        )
    };
    match sim.roll(PROVIDER, &device) {
        Verdict::ServerError => server_error(),
        Verdict::RateLimited => with_retry_after(
            fcm_error(
                StatusCode::TOO_MANY_REQUESTS,
                "RESOURCE_EXHAUSTED",
                "Quota exceeded.",
                Some("QUOTA_EXCEEDED"),
            ),
            retry_after,
        ),
        Verdict::Permanent(code) => {
            let (status, name) = status_of(&code);
            fcm_error(
                status,
                name,
                "Refused for this registration token.",
                Some(&code),
            )
        }
        Verdict::DropBeforeAccept => cut_off(),
        Verdict::Accept { drop: cut, fail } => {
            let title = message["notification"]["title"]
                .as_str()
                .unwrap_or("")
                .to_string();
            let outcome = sim.accept(
                PROVIDER,
                Incoming {
                    id: None,
                    reference: None,
                    key: None,
                    recipient: device,
                    template: title,
                    params: message["data"].clone(),
                },
                Dedupe::Never,
            );
            let after_accept = sim.slow_after_accept(PROVIDER);
            drop(sim);
            let ok = || {
                Json(json!({"name": format!("projects/{project}/messages/{}", outcome.id)}))
                    .into_response()
            };
            taken(cut, fail.then(server_error), ok, after_accept)
        }
    }
}
