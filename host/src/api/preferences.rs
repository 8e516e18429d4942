//! `/v1/users/{user_id}/preferences`: a recipient's preferences — the
//! channels and categories they switched off — read, replaced and cleared
//! (`docs/preferences.md`), and how the accept path reads them
//! ([`of_users`], through the instance's `prefs::PreferenceCache`).
//!
//! Who may: reading takes the API token or the admin token; changing takes
//! the admin token, or the API token too when `[preferences]
//! api_token_writes = true`. Every change is recorded with the token kind
//! that made it and the route (`api`).

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, Request, State};
use axum::http::Method;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::AppState;
use super::model::{ChannelResult, MAX_ID, OptedOutView, Problem, ResultKind};
use super::problem::ApiError;
use crate::ledger::opted_out::OptedOutAnswer;
use crate::ledger::preferences::{ChangeRoute, Edit, PreferenceChange, Preferences};
use crate::route::plan::{OptedOut, PlannedEvent};

/// Most channels or categories one document may switch off.
const MAX_NAMES: usize = 64;
/// Most changes a `GET` lists.
const HISTORY: u32 = 50;

/// The preferences of the users of one request, by user id.
pub(crate) type UserPreferences = HashMap<String, Arc<Preferences>>;

/// The preferences of `users` for the accept path; 503 when they cannot be
/// read (nothing is accepted: an event is never sent to a user whose
/// opt-out could not be read).
pub(crate) async fn of_users(
    state: &AppState,
    users: &[&str],
) -> Result<UserPreferences, ApiError> {
    state
        .preferences
        .of_users(users)
        .await
        .map_err(|e| ApiError::Unavailable {
            detail: format!("{e}; nothing was accepted, retry the request"),
            accepted: None,
        })
}

/// The answer for a channel of `event` the recipient switched off,
/// counted and queued for the event look-up's record.
pub(crate) fn opted_out_result(
    state: &AppState,
    event: &PlannedEvent,
    skipped: &OptedOut,
) -> ChannelResult {
    metrics::counter!(crate::metric_names::OPTED_OUT, "channel" => skipped.channel.clone())
        .increment(1);
    state.preferences.record(OptedOutAnswer {
        biz_type: event.biz_type.clone(),
        biz_id: event.biz_id.clone(),
        user_digest: crate::ledger::recipient_digest(&event.user_id),
        channel: skipped.channel.clone(),
        key: skipped.key.clone(),
        at_ms: crate::ledger::now_ms(),
    });
    ChannelResult {
        channel: skipped.channel.clone(),
        result: ResultKind::OptedOut,
        task_id: String::new(),
        key: skipped.key.clone(),
        status: None,
        cap: None,
        next_allowed_at: None,
        scheduled_for: None,
    }
}

/// The channels of event `biz_type`/`biz_id` answered `opted_out` (only
/// `user_id`'s when given), as recorded in the ledger (none with it off).
pub(crate) async fn opted_out_of_event(
    state: &AppState,
    biz_type: &str,
    biz_id: &str,
    user_id: Option<&str>,
) -> Result<Vec<OptedOutView>, ApiError> {
    let Some(ledger) = state.preferences.ledger() else {
        return Ok(Vec::new());
    };
    let digest = user_id.map(crate::ledger::recipient_digest);
    Ok(ledger
        .opted_out_of_event(biz_type, biz_id)
        .await?
        .into_iter()
        .filter(|a| digest.as_ref().is_none_or(|d| *d == a.user_digest))
        .map(|a| OptedOutView {
            channel: a.channel,
            key: a.key,
            at: a.at_ms,
        })
        .collect())
}

/// The token kind of a request to the preferences routes, set by [`authorise`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct Caller(pub &'static str);

/// Middleware of the preferences routes: a read takes the API or the admin
/// token, a change the admin token (or the API token with
/// `api_token_writes`). A wrong token is 401 and counts against the
/// client's failures (429 past them), as on `/v1` and `/admin`.
pub(crate) async fn authorise(
    State(state): State<AppState>,
    mut req: Request,
    next: Next,
) -> Response {
    let guard = match super::guard::TokenGuard::of(&req) {
        Ok(guard) => guard,
        Err(refused) => return refused.into_response(),
    };
    let write = req.method() != Method::GET && req.method() != Method::HEAD;
    let headers = req.headers();
    let caller = if state.admin_token.check(headers).is_ok() {
        Ok("admin token")
    } else if state.api_token.check(headers).is_ok() {
        if write && !state.preferences_api_writes {
            Err(ApiError::Forbidden(
                "the API token may read preferences but not change them: use the admin \
                 token, or set [preferences] api_token_writes = true"
                    .into(),
            ))
        } else {
            Ok("api token")
        }
    } else {
        guard.refused(&req);
        Err(ApiError::Unauthorized(
            "missing or wrong bearer token (the API or the admin token)".into(),
        ))
    };
    match caller {
        Ok(kind) => {
            req.extensions_mut().insert(Caller(kind));
            next.run(req).await
        }
        Err(e) => e.into_response(),
    }
}

/// A user's preferences: `PUT /v1/users/{user_id}/preferences`.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct PreferencesRequest {
    /// Channels (the host's channel instances) on which the user gets
    /// nothing, e.g. `["sms"]`; absent: none.
    #[serde(default)]
    #[schema(max_items = 64, example = json!(["sms"]))]
    pub channels_off: Vec<String>,
    /// Categories (a policy's `category`) the user gets nothing of, e.g.
    /// `["marketing"]`; absent: none. A mandatory category is stored but
    /// blocks nothing.
    #[serde(default)]
    #[schema(max_items = 64, example = json!(["marketing"]))]
    pub categories_off: Vec<String>,
}

/// A user's preferences and their history.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub(crate) struct PreferencesView {
    /// The user.
    pub user_id: String,
    /// Channels on which the user gets nothing, sorted.
    pub channels_off: Vec<String>,
    /// Categories the user gets nothing of, sorted.
    pub categories_off: Vec<String>,
    /// Categories no preference blocks (`[preferences] mandatory`): sent
    /// on every channel whatever is switched off.
    pub mandatory: Vec<String>,
    /// When they last changed (ms since the epoch); absent: never set.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub updated_at: Option<i64>,
    /// The changes, newest first (the latest 50).
    pub history: Vec<ChangeView>,
}

/// One change of a user's preferences.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub(crate) struct ChangeView {
    /// When (ms since the epoch).
    pub at: i64,
    /// By which route: `api`, `unsubscribe_link` (later also `sms_reply`, `email_bounce`).
    pub route: String,
    /// By whom: `admin token`, `api token`, or the route's own name.
    pub by: String,
    /// `replace` (PUT), `clear` (DELETE) or `switch_off`.
    pub action: String,
    /// What changed, e.g. `channels off +sms; categories off -marketing`.
    pub what: String,
    /// Channels off after the change.
    pub channels_off: Vec<String>,
    /// Categories off after the change.
    pub categories_off: Vec<String>,
}

impl From<PreferenceChange> for ChangeView {
    fn from(c: PreferenceChange) -> ChangeView {
        ChangeView {
            at: c.at_ms,
            route: c.route,
            by: c.by,
            action: c.action,
            what: c.what,
            channels_off: c.after.channels_off.into_iter().collect(),
            categories_off: c.after.categories_off.into_iter().collect(),
        }
    }
}

/// The ledger, or 501 when it is off (preferences live in its database).
pub(super) fn ledger(state: &AppState) -> Result<&crate::ledger::Ledger, ApiError> {
    state.preferences.ledger().ok_or_else(|| {
        ApiError::NotImplemented(
            "preferences are stored in the delivery ledger's database, and ledger_url is \"off\""
                .into(),
        )
    })
}

/// A user id as events carry it: 1 to 128 characters, no control characters.
pub(super) fn check_user(user_id: &str) -> Result<(), ApiError> {
    let chars = user_id.chars().count();
    if chars == 0 || chars > MAX_ID || user_id.chars().any(char::is_control) {
        return Err(ApiError::invalid(
            "user_id",
            format!("must be 1 to {MAX_ID} characters without control characters"),
        ));
    }
    Ok(())
}

/// `user_id`'s preferences and their latest changes.
pub(crate) async fn view(state: &AppState, user_id: &str) -> Result<PreferencesView, ApiError> {
    let ledger = ledger(state)?;
    let stored = ledger.preferences(user_id).await?;
    let history = ledger.preference_history(user_id, HISTORY).await?;
    let (preferences, updated_at) = match stored {
        Some(s) => (s.preferences, Some(s.updated_at_ms)),
        None => (Preferences::default(), None),
    };
    Ok(PreferencesView {
        user_id: user_id.to_string(),
        channels_off: preferences.channels_off.into_iter().collect(),
        categories_off: preferences.categories_off.into_iter().collect(),
        mandatory: state.preferences.mandatory().iter().cloned().collect(),
        updated_at,
        history: history.into_iter().map(ChangeView::from).collect(),
    })
}

/// The document checked: known channels, well-formed categories that a
/// policy in force (or `mandatory`) names, each at most once.
fn checked(state: &AppState, req: PreferencesRequest) -> Result<Preferences, ApiError> {
    let channels = &state.live.config().channels;
    let snapshot = state.live.current();
    let categories: BTreeSet<&str> = snapshot
        .policies
        .by_biz_type
        .values()
        .filter_map(|p| p.spec.category.as_deref())
        .chain(state.preferences.mandatory().iter().map(String::as_str))
        .collect();
    for (field, names) in [
        ("channels_off", &req.channels_off),
        ("categories_off", &req.categories_off),
    ] {
        if names.len() > MAX_NAMES {
            return Err(ApiError::invalid(
                field,
                format!("{} names; at most {MAX_NAMES}", names.len()),
            ));
        }
        for (i, name) in names.iter().enumerate() {
            let shown: String = name.chars().take(64).collect();
            let field = format!("{field}[{i}]");
            if names[..i].contains(name) {
                return Err(ApiError::invalid(
                    field,
                    format!("`{shown}` is listed twice"),
                ));
            }
            if field.starts_with("channels_off") {
                if !channels.contains_key(name) {
                    let known: Vec<&str> = channels.keys().map(String::as_str).collect();
                    return Err(ApiError::invalid(
                        field,
                        format!(
                            "`{shown}` is not a channel of this host (its channels: {})",
                            known.join(", ")
                        ),
                    ));
                }
            } else {
                crate::config::check_category(name).map_err(|r| ApiError::invalid(&field, r))?;
                if !categories.contains(name.as_str()) {
                    let known: Vec<&str> = categories.iter().copied().collect();
                    return Err(ApiError::invalid(
                        field,
                        format!(
                            "no policy in force has category `{shown}` (categories: {})",
                            if known.is_empty() {
                                "none".to_string()
                            } else {
                                known.join(", ")
                            }
                        ),
                    ));
                }
            }
        }
    }
    Ok(Preferences {
        channels_off: req.channels_off.into_iter().collect(),
        categories_off: req.categories_off.into_iter().collect(),
    })
}

/// Writes `edit` (recorded with `caller` and the `api` route) and makes
/// this instance see it at once.
async fn change(
    state: &AppState,
    user_id: &str,
    edit: Edit,
    caller: Caller,
) -> Result<PreferencesView, ApiError> {
    let ledger = ledger(state)?;
    let change = ledger
        .change_preferences(user_id, &edit, caller.0, ChangeRoute::Api)
        .await?;
    state.preferences.remember(user_id, change.after);
    view(state, user_id).await
}

/// A user's preferences.
#[utoipa::path(
    get, path = "/v1/users/{user_id}/preferences", tag = "preferences",
    params(("user_id" = String, Path, description = "The user, as events name it")),
    responses(
        (status = 200, description = "What the user switched off (nothing when never set), and the changes", body = PreferencesView),
        (status = 401, description = "Missing or wrong bearer token (the API or the admin token)", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Bad user id", body = Problem, content_type = "application/problem+json"),
        (status = 501, description = "The delivery ledger is off", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "The ledger's database unavailable", body = Problem, content_type = "application/problem+json"),
    ),
    security(("api_token" = []), ("admin_token" = []))
)]
pub(crate) async fn get_preferences(
    State(state): State<AppState>,
    Path(user_id): Path<String>,
) -> Result<Json<PreferencesView>, ApiError> {
    check_user(&user_id)?;
    Ok(Json(view(&state, &user_id).await?))
}

/// Replaces a user's preferences (the whole document); takes effect at
/// once on this instance and within `[preferences] cache_ttl` on every other.
#[utoipa::path(
    put, path = "/v1/users/{user_id}/preferences", tag = "preferences",
    params(("user_id" = String, Path, description = "The user, as events name it")),
    request_body(content = PreferencesRequest, content_type = "application/json"),
    responses(
        (status = 200, description = "Stored and recorded in the history", body = PreferencesView),
        (status = 400, description = "Malformed JSON", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Missing or wrong bearer token", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "The API token may not change preferences (`api_token_writes` is off)", body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "Not application/json", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Unknown channel or category, a name twice, a bad user id or field", body = Problem, content_type = "application/problem+json"),
        (status = 501, description = "The delivery ledger is off", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "The ledger's database unavailable; nothing changed", body = Problem, content_type = "application/problem+json"),
    ),
    security(("admin_token" = []), ("api_token" = []))
)]
pub(crate) async fn put_preferences(
    State(state): State<AppState>,
    axum::Extension(caller): axum::Extension<Caller>,
    Path(user_id): Path<String>,
    super::body::JsonBody(req): super::body::JsonBody<PreferencesRequest>,
) -> Result<Json<PreferencesView>, ApiError> {
    check_user(&user_id)?;
    let preferences = checked(&state, req)?;
    Ok(Json(
        change(&state, &user_id, Edit::Replace(preferences), caller).await?,
    ))
}

/// Clears a user's preferences (back to the defaults: nothing switched
/// off); recorded in the history.
#[utoipa::path(
    delete, path = "/v1/users/{user_id}/preferences", tag = "preferences",
    params(("user_id" = String, Path, description = "The user, as events name it")),
    responses(
        (status = 200, description = "Cleared and recorded in the history", body = PreferencesView),
        (status = 401, description = "Missing or wrong bearer token", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "The API token may not change preferences (`api_token_writes` is off)", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Bad user id", body = Problem, content_type = "application/problem+json"),
        (status = 501, description = "The delivery ledger is off", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "The ledger's database unavailable; nothing changed", body = Problem, content_type = "application/problem+json"),
    ),
    security(("admin_token" = []), ("api_token" = []))
)]
pub(crate) async fn delete_preferences(
    State(state): State<AppState>,
    axum::Extension(caller): axum::Extension<Caller>,
    Path(user_id): Path<String>,
) -> Result<Json<PreferencesView>, ApiError> {
    check_user(&user_id)?;
    Ok(Json(change(&state, &user_id, Edit::Clear, caller).await?))
}
