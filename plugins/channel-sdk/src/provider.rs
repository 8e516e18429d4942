//! What every real-provider plugin needs beyond a bare request: JSON and form
//! requests, the provider's refusal turned into a [`SendError`] (honouring
//! `Retry-After`), an access token shared through the cache with one refresh
//! when the provider refuses it, random nonces, and settings with defaults.
//! The pure parts (signatures, JWTs, error tables) live in `provider-auth`,
//! re-exported here as [`auth`].

pub use provider_auth as auth;
use provider_auth::{Class, Refusal};

use crate::http::{self, HttpError, Response};
use crate::{SendError, cache, setting};

/// POSTs `body` as JSON to `url` with extra `headers`.
pub fn post_json(
    url: &str,
    headers: &[(&str, &str)],
    body: &serde_json::Value,
) -> Result<Response, HttpError> {
    let mut all = vec![("content-type", "application/json")];
    all.extend_from_slice(headers);
    http::request("POST", url, &all, Some(body.to_string().as_bytes()))
}

/// POSTs `fields` as `application/x-www-form-urlencoded` to `url`.
pub fn post_form(url: &str, fields: &[(&str, &str)]) -> Result<Response, HttpError> {
    let body = fields
        .iter()
        .map(|(k, v)| format!("{}={}", auth::percent_encode(k), auth::percent_encode(v)))
        .collect::<Vec<_>>()
        .join("&");
    let headers = [("content-type", "application/x-www-form-urlencoded")];
    http::request("POST", url, &headers, Some(body.as_bytes()))
}

/// The error for a refusal `r` from `provider`: retryable (with the answer's
/// `Retry-After` when given), permanent, unknown (an ambiguous answer: the
/// provider may have the message), or — a token refused even right after a
/// refresh — retryable. The text holds the provider's code and the
/// operator cause, never a secret or a URL.
pub fn refused(provider: &str, r: &Refusal, retry_after_ms: Option<u64>) -> SendError {
    let reason = format!("{provider} refused the message: {r}");
    match r.class {
        Class::Retryable => SendError::retry_after(reason, retry_after_ms),
        Class::Permanent => SendError::Permanent(reason),
        Class::Unknown => SendError::Unknown(reason),
        Class::Refresh => SendError::retryable(format!("{reason}, even with a fresh access token")),
    }
}

/// [`refused`] with the `Retry-After` of `resp`.
pub fn refused_by(provider: &str, r: &Refusal, resp: &Response) -> SendError {
    refused(provider, r, resp.retry_after_ms())
}

/// What one call with an access token came to.
pub enum Attempt<T> {
    /// Done: accepted, or refused for a reason a new token would not change.
    Done(Result<T, SendError>),
    /// The provider refused the token itself (expired, invalid): nothing was
    /// accepted, so the call may be made again with a new token.
    TokenRefused(Refusal),
}

/// Calls `call` with the access token shared under `cache_key` (minted by
/// `mint`: the token and its lifetime in ms); when `provider` refuses that
/// token, mints a new one in its place and calls once more.
pub fn with_token<T>(
    provider: &str,
    cache_key: &str,
    mint: impl Fn() -> Result<(String, u64), SendError>,
    mut call: impl FnMut(&str) -> Attempt<T>,
) -> Result<T, SendError> {
    // A token request carries no message: whatever its answer, nothing was sent.
    let mint = || mint().map_err(not_sent);
    let token = shared_token(cache_key, None, &mint)?;
    if let Attempt::Done(result) = call(&token) {
        return result;
    }
    let fresh = shared_token(cache_key, Some(&token), &mint)?;
    match call(&fresh) {
        Attempt::Done(result) => result,
        Attempt::TokenRefused(again) => Err(refused(provider, &again, None)),
    }
}

/// An error of a call that carried no message (a token request): an
/// ambiguous answer there is only retryable.
pub fn not_sent(e: SendError) -> SendError {
    match e {
        SendError::Unknown(reason) => SendError::retryable(reason),
        other => other,
    }
}

/// The token under `key` unless it is `stale`; else a newly minted one,
/// stored with compare-and-set so that concurrent instances agree on one
/// token (the loser uses the winner's). Without a cache the minted token is
/// used unshared.
pub fn shared_token(
    key: &str,
    stale: Option<&str>,
    mint: &impl Fn() -> Result<(String, u64), SendError>,
) -> Result<String, SendError> {
    let seen = match cache::get(key) {
        Ok(Some(cached)) if Some(cached.as_str()) != stale => return Ok(cached),
        Ok(seen) => seen,
        Err(_) => return mint().map(|(token, _)| token),
    };
    let (token, ttl_ms) = mint()?;
    match cache::compare_and_set(key, seen.as_deref(), &token, ttl_ms.max(1)) {
        Ok(false) => match cache::get(key) {
            Ok(Some(winner)) if Some(winner.as_str()) != stale => Ok(winner),
            _ => Ok(token),
        },
        _ => Ok(token),
    }
}

/// The `access_token` of an OAuth2-style token answer (200 only) and how
/// long to keep it: its `expires_in` (else `default_secs`) less 5 minutes,
/// at least one. `None` when the answer holds no token.
pub fn token_answer(resp: &Response, default_secs: u64) -> Option<(String, u64)> {
    let body = resp.json();
    let token = body.get("access_token")?.as_str()?;
    if resp.status != 200 {
        return None;
    }
    let secs = body
        .get("expires_in")
        .and_then(serde_json::Value::as_u64)
        .unwrap_or(default_secs);
    Some((token.to_string(), secs.saturating_sub(300).max(60) * 1000))
}

/// 32 random hex digits (a request nonce).
pub fn nonce() -> String {
    let mut bytes = [0u8; 16];
    if getrandom::fill(&mut bytes).is_err() {
        // No randomness from the host: the time and a counter stay unique
        // within this instance, and the instance id comes from the stack.
        use std::sync::atomic::{AtomicU64, Ordering};
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let seed = format!(
            "{}:{}",
            crate::now_ms(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        );
        return auth::key_digest(&seed, 32);
    }
    auth::hex(&bytes)
}

/// The setting `name`, or `default` when not configured.
pub fn setting_or(name: &str, default: &str) -> String {
    setting(name)
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| default.to_string())
}

/// The template this provider renders for a message's `template`: the
/// setting `template.<template>` when the channel instance maps it, else
/// `template` itself. Two providers of one channel (docs/channels.md,
/// "Providers within a channel") name the same message each by their own
/// id, e.g. `template.order_shipped = "SMS_465910001"` for Aliyun and
/// `"2084672"` for Tencent.
pub fn provider_template(template: &str) -> String {
    setting_or(&format!("template.{template}"), template)
}

/// The setting `name` as a whole number, or `default`; a value that is not a
/// number is a permanent error naming the setting.
pub fn number_setting(name: &str, default: u64) -> Result<u64, SendError> {
    match setting(name).filter(|v| !v.is_empty()) {
        None => Ok(default),
        Some(v) => v.trim().parse().map_err(|_| {
            SendError::Permanent(format!("channel setting `{name}` is not a whole number"))
        }),
    }
}

/// The authority (`host[:port]`) of an absolute URL, as the host sends it in
/// `Host` / `:authority`.
pub fn authority(url: &str) -> Option<&str> {
    let rest = url.split_once("://")?.1;
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    Some(&rest[..end]).filter(|a| !a.is_empty())
}
