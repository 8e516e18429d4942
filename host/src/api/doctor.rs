//! `GET /admin/doctor`: the checks of `pushonce doctor` on the running
//! host's own Redis connection, ledger, plugins and environment.

use axum::Json;
use axum::extract::State;

use super::AppState;
use super::model::Problem;
use crate::doctor::{self, Deployment, Report};

/// The deployment checked as an operator would before going live: Redis,
/// the ledger, plugins, channels, tokens; `ok` is false when a check failed.
#[utoipa::path(get, path = "/admin/doctor", tag = "admin",
    responses(
        (status = 200, description = "One entry per check, with what to do about a failure", body = Report),
        (status = 401, description = "Missing or wrong admin token", body = Problem, content_type = "application/problem+json"),
    ),
    security(("admin_token" = [])))]
pub(crate) async fn get_doctor(State(state): State<AppState>) -> Json<Report> {
    let env = |var: &str| std::env::var(var).ok();
    let live = state.live.clone();
    let deployment = Deployment {
        config: live.config(),
        env: &env,
        redis: Ok(&state.permits),
        ledger: state.ledger.as_ref().map(|l| Ok(l.pool())),
        live: Ok(&live),
    };
    Json(doctor::examine(&deployment).await)
}
