//! The business's own in-site message service (`/inbox/v1/messages`): our
//! own API, so it honours the `Idempotency-Key` header (a resend with a known
//! key answers the first message, `idempotent-replayed: true`) and answers
//! status by key (`GET /inbox/v1/messages?idempotency_key=`). A request whose
//! key is already being processed (a concurrent replay) gets 409 Conflict, as
//! the IETF draft "The Idempotency-Key HTTP Header Field" has it; the
//! `slow_ms` fault keeps a request in flight that long.

use crate::SimState;
use crate::ledger::{Dedupe, Incoming, Verdict, cut_off, late, pause, with_retry_after};
use axum::{
    Json, Router,
    extract::{Query, State},
    http::{HeaderMap, StatusCode},
    response::{IntoResponse, Response},
    routing::post,
};
use serde::Deserialize;
use serde_json::{Value, json};

const PROVIDER: &str = "inbox";

/// The routes.
pub fn routes() -> Router<SimState> {
    Router::new().route("/inbox/v1/messages", post(send).get(query))
}

#[derive(Deserialize)]
struct InboxSend {
    user_id: String,
    template: String,
    #[serde(default)]
    params: Value,
}

fn error(status: StatusCode, message: &str) -> Response {
    (status, Json(json!({ "error": message }))).into_response()
}

async fn send(
    State(state): State<SimState>,
    headers: HeaderMap,
    Json(req): Json<InboxSend>,
) -> Response {
    let Some(key) = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
    else {
        return error(
            StatusCode::BAD_REQUEST,
            "Idempotency-Key header is required",
        );
    };
    let Some(_in_flight) = InFlight::start(&state, &key) else {
        return error(
            StatusCode::CONFLICT,
            "a request with this Idempotency-Key is still being processed",
        );
    };
    pause(&state, PROVIDER).await;
    let mut sim = state.lock();
    let retry_after = sim.retry_after(PROVIDER);
    match sim.roll(PROVIDER, &req.user_id) {
        Verdict::ServerError => error(StatusCode::INTERNAL_SERVER_ERROR, "simulated failure"),
        Verdict::RateLimited => with_retry_after(
            error(StatusCode::TOO_MANY_REQUESTS, "slow down"),
            retry_after,
        ),
        Verdict::Permanent(code) => error(StatusCode::UNPROCESSABLE_ENTITY, &code),
        Verdict::DropBeforeAccept => cut_off(),
        Verdict::Accept { drop: cut, fail } => {
            let outcome = sim.accept(
                PROVIDER,
                Incoming {
                    id: None,
                    reference: Some(key.clone()),
                    key: Some(key),
                    recipient: req.user_id,
                    template: req.template,
                    params: req.params,
                },
                Dedupe::Always,
            );
            let after_accept = sim.slow_after_accept(PROVIDER);
            drop(sim);
            if let Some(r) = outcome.receipt {
                state.spawn_receipt(PROVIDER, r);
            }
            if cut {
                return late(cut_off(), after_accept);
            }
            if fail {
                let failure = error(StatusCode::INTERNAL_SERVER_ERROR, "simulated failure");
                return late(failure, after_accept);
            }
            let status = if outcome.replay {
                StatusCode::OK
            } else {
                StatusCode::CREATED
            };
            let answer = (
                status,
                [("idempotent-replayed", outcome.replay.to_string())],
                Json(json!({"id": outcome.id, "status": "accepted"})),
            );
            late(answer.into_response(), after_accept)
        }
    }
}

/// A key being processed; released when the request's answer is made (or
/// the request is dropped).
struct InFlight {
    state: SimState,
    key: String,
}

impl InFlight {
    /// Marks `key` in flight; `None` (counted `conflict`) if it already is.
    fn start(state: &SimState, key: &str) -> Option<InFlight> {
        let mut sim = state.lock();
        if !sim.inbox_in_flight.insert(key.to_string()) {
            sim.count(PROVIDER, "conflict");
            return None;
        }
        sim.count(PROVIDER, "in_flight");
        Some(InFlight {
            state: state.clone(),
            key: key.to_string(),
        })
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.state.lock().inbox_in_flight.remove(&self.key);
    }
}

#[derive(Deserialize)]
struct InboxQuery {
    idempotency_key: String,
}

async fn query(State(state): State<SimState>, Query(q): Query<InboxQuery>) -> Response {
    let mut sim = state.lock();
    if sim.query_fails(PROVIDER) {
        return error(StatusCode::SERVICE_UNAVAILABLE, "simulated query outage");
    }
    match sim.find(PROVIDER, &q.idempotency_key) {
        Some(m) => Json(json!({"id": m.id, "status": m.delivery.as_str()})).into_response(),
        None => error(StatusCode::NOT_FOUND, "no such message"),
    }
}
