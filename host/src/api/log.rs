//! The API's logging layer: one place counts every refusal
//! (`pushonce_http_refused_total{status}`) and decides how loud it is.
//!
//! A handler's [`ApiError`](super::ApiError) leaves its cause in a
//! [`Refusal`] extension of the response; this layer logs it: a 4xx at
//! `debug`, a 5xx at `error` — except a 503 with `Retry-After` because
//! Redis cannot serve for now (or the request's time budget ran out), which
//! is an outage, not a bug: the first of an episode is a warning, the rest
//! of it `debug`, and the first answer of a route that needs Redis that is
//! not such a 503 ends the episode with one `info` line counting what it
//! refused.
//!
//! Nothing secret and nothing forged reaches a log line from here: the path
//! is logged as [`loggable_path`] (a callback's path token replaced by
//! `***`), and every value a client chose goes through [`escaped`] (control
//! characters written as `\u{..}`, so a newline cannot start a forged line).

use std::borrow::Cow;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;

use super::problem::Refusal;

/// How many requests the current outage answered 503 (0: none going on).
#[derive(Debug, Default)]
pub(crate) struct Outage {
    /// 503s answered since the episode began.
    refused: AtomicU64,
}

impl Outage {
    /// Counts one more 503 of an outage; true when it begins the episode.
    fn refused(&self) -> bool {
        self.refused.fetch_add(1, Ordering::Relaxed) == 0
    }

    /// Ends the episode, if one was going on: how many requests it refused.
    fn end(&self) -> Option<u64> {
        if self.refused.load(Ordering::Relaxed) == 0 {
            return None;
        }
        Some(self.refused.swap(0, Ordering::Relaxed)).filter(|n| *n > 0)
    }
}

/// Logs each refusal at the level its event deserves (see the module doc).
pub(crate) async fn log_refusals(
    State(outage): State<Arc<Outage>>,
    req: Request,
    next: Next,
) -> Response {
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let logged = loggable_path(&path);
    let response = next.run(req).await;
    let status = response.status().as_u16();
    if response.extensions().get::<Refusal>().is_some() {
        metrics::counter!(crate::metric_names::REFUSED, "status" => status.to_string())
            .increment(1);
    }
    match response.extensions().get::<Refusal>() {
        Some(r) if r.unavailable => {
            let error = escaped(&r.cause);
            if outage.refused() {
                tracing::warn!(status, %method, path = %logged, %error, "unavailable: answering 503 with Retry-After until it recovers");
            } else {
                tracing::debug!(status, %method, path = %logged, %error, "unavailable");
            }
            return response;
        }
        Some(r) if response.status().is_server_error() => {
            let error = escaped(&r.cause);
            tracing::error!(status, %method, path = %logged, %error, "request failed");
        }
        Some(r) => {
            let error = escaped(&r.cause);
            tracing::debug!(status, %method, path = %logged, %error, "request refused");
        }
        None => {}
    }
    if needs_redis(&path)
        && let Some(refused) = outage.end()
    {
        tracing::info!(refused, "serving again after an outage");
    }
    response
}

/// The prefix of providers' callback routes: `<prefix><channel>/<token>[/<rest>]`.
const RECEIPTS: &str = "/v1/receipts/";
/// The prefix of one-click unsubscribe links: `<prefix><token>`.
const UNSUBSCRIBE: &str = "/v1/unsubscribe/";

/// `path` as it may be logged: an unsubscribe link's token replaced by
/// `***`; the segment after `/v1/receipts/<channel>/`
/// (a channel's callback path token, in whatever encoding it came) replaced
/// by `***`, and control characters escaped. Redacting by position, not by
/// value, also hides a wrong token's guess and every encoded form of a right one.
pub(crate) fn loggable_path(path: &str) -> Cow<'_, str> {
    if path.starts_with(UNSUBSCRIBE) {
        // The token opts its user out: as good as a password for that.
        return Cow::Owned(format!("{UNSUBSCRIBE}***"));
    }
    let Some(after) = path.strip_prefix(RECEIPTS) else {
        return escaped(path);
    };
    let Some((channel, rest)) = after.split_once('/') else {
        return escaped(path);
    };
    let tail = rest.find('/').map_or("", |i| &rest[i..]);
    let redacted = format!("{RECEIPTS}{channel}/***{tail}");
    Cow::Owned(escaped(&redacted).into_owned())
}

/// `value` with every control character (newline, carriage return, escape,
/// the C1 controls...) written as `\u{..}`: what a log line shows of
/// anything a client chose, so it cannot forge a line or drive a terminal.
pub(crate) fn escaped(value: &str) -> Cow<'_, str> {
    if !value.chars().any(char::is_control) {
        return Cow::Borrowed(value);
    }
    let mut out = String::with_capacity(value.len() + 8);
    for c in value.chars() {
        if c.is_control() {
            out.push_str(&format!("\\u{{{:x}}}", c as u32));
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// Whether answering `path` needs Redis: only such an answer shows an
/// outage is over (a probe that never asks Redis answers 200 during one).
fn needs_redis(path: &str) -> bool {
    !matches!(path, "/healthz" | "/metrics" | "/openapi.json")
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use axum::Router;
    use axum::body::Body;
    use axum::http::Request;
    use axum::middleware::from_fn_with_state;
    use axum::routing::get;
    use tower_service::Service;
    use tracing::{Level, Subscriber};
    use tracing_subscriber::layer::{Context, Layer, SubscriberExt};

    use super::{Outage, log_refusals};
    use crate::api::ApiError;

    /// Records the level of every event logged.
    #[derive(Clone, Default)]
    struct Levels(Arc<Mutex<Vec<Level>>>);

    impl<S: Subscriber> Layer<S> for Levels {
        fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
            let mut levels = self.0.lock().unwrap_or_else(|e| e.into_inner());
            levels.push(*event.metadata().level());
        }
    }

    fn unavailable() -> ApiError {
        ApiError::Unavailable {
            detail: "redis: connection refused".into(),
            accepted: None,
        }
    }

    #[tokio::test(flavor = "current_thread")]
    async fn an_outage_warns_once_per_episode_and_a_bug_is_an_error() {
        let levels = Levels::default();
        let _guard =
            tracing::subscriber::set_default(tracing_subscriber::registry().with(levels.clone()));
        let mut app = Router::new()
            .route("/v1/down", get(|| async { unavailable() }))
            .route("/v1/up", get(|| async { "ok" }))
            .route("/healthz", get(|| async { "ok" }))
            .route("/v1/bug", get(|| async { ApiError::Bug("a test's bug") }))
            .layer(from_fn_with_state(
                Arc::new(Outage::default()),
                log_refusals,
            ));
        let mut seen = |path: &str| {
            let req = Request::get(path).body(Body::empty()).unwrap();
            let answer = app.call(req);
            async move { answer.await.unwrap().status().as_u16() }
        };
        // An episode: three 503s, a probe that needs no Redis in between.
        for path in ["/v1/down", "/v1/down", "/healthz", "/v1/down"] {
            seen(path).await;
        }
        assert_eq!(seen("/v1/up").await, 200, "the episode ends");
        assert_eq!(seen("/v1/down").await, 503, "a new episode");
        assert_eq!(seen("/v1/bug").await, 500, "not an outage: ends it too");
        let levels = levels.0.lock().unwrap().clone();
        let count = |l: Level| levels.iter().filter(|x| **x == l).count();
        assert_eq!(count(Level::WARN), 2, "{levels:?}");
        assert_eq!(count(Level::DEBUG), 2, "{levels:?}");
        assert_eq!(count(Level::INFO), 2, "{levels:?}");
        assert_eq!(count(Level::ERROR), 1, "{levels:?}");
    }

    #[test]
    fn a_callback_token_and_control_characters_never_reach_a_log_line() {
        use super::{escaped, loggable_path};
        assert_eq!(
            loggable_path("/v1/receipts/sms/s3cr3t-token/extra"),
            "/v1/receipts/sms/***/extra"
        );
        assert_eq!(
            loggable_path("/v1/receipts/sms/s3cr3t"),
            "/v1/receipts/sms/***"
        );
        assert_eq!(loggable_path("/v1/receipts/sms"), "/v1/receipts/sms");
        assert_eq!(loggable_path("/v1/events/a/b"), "/v1/events/a/b");
        assert_eq!(escaped("ana\nINFO forged"), "ana\\u{a}INFO forged");
        assert_eq!(escaped("\u{1b}[31m"), "\\u{1b}[31m");
        assert_eq!(escaped("plain ü"), "plain ü");
    }

    #[test]
    fn an_episode_begins_once_and_ends_with_its_count() {
        let outage = Outage::default();
        assert_eq!(outage.end(), None);
        assert!(outage.refused());
        assert!(!outage.refused());
        assert!(!outage.refused());
        assert_eq!(outage.end(), Some(3));
        assert_eq!(outage.end(), None);
        assert!(outage.refused(), "a new episode");
    }
}
