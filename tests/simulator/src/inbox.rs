//! The business's own in-site message service (`/inbox/v1/messages`): our
//! own API, so it honours the `Idempotency-Key` header (a resend with a known
//! key answers the first message, `idempotent-replayed: true`) and answers
//! status by key (`GET /inbox/v1/messages?idempotency_key=`).

use crate::SimState;
use crate::ledger::{Dedupe, Incoming, Verdict, cut_off, pause, with_retry_after};
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
    pause(&state, PROVIDER).await;
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
        Verdict::Accept { drop: cut } => {
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
            drop(sim);
            if let Some(r) = outcome.receipt {
                state.spawn_receipt(PROVIDER, r);
            }
            if cut {
                return cut_off();
            }
            let status = if outcome.replay {
                StatusCode::OK
            } else {
                StatusCode::CREATED
            };
            (
                status,
                [("idempotent-replayed", outcome.replay.to_string())],
                Json(json!({"id": outcome.id, "status": "accepted"})),
            )
                .into_response()
        }
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
