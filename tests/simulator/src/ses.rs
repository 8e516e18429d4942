//! Amazon SES API v2 `SendEmail`, as documented
//! (<https://docs.aws.amazon.com/ses/latest/APIReference-V2/API_SendEmail.html>),
//! never kinder:
//!
//! - SigV4 (service `ses`, the simulator's region) checked from the request
//!   as received by [`crate::sigv4`], apart from the plugin's signer; a
//!   missing, malformed, unknown, mis-scoped, expired (more than 5 minutes
//!   off) or wrong signature is refused 403 (400 when incomplete) with the
//!   error type in `x-amzn-ErrorType` and `{"message": ...}`, as AWS's
//!   REST-JSON services answer.
//! - The body: `FromEmailAddress` at the verified identity
//!   ([`SES_IDENTITY`], else `MessageRejected` "Email address is not
//!   verified"), 1 to 50 `Destination` addresses, exactly one of `Simple`,
//!   `Raw`, `Template` content (`Raw` is not imitated: refused), a template
//!   named, `TemplateData` a JSON object of at most 262,144 characters,
//!   at most 15 `Headers` whose names are not the ones SES sets
//!   (`From`, `To`, `Subject`...) and appear once, values without line
//!   breaks. Anything else is `BadRequestException`.
//! - `SendEmail` has no idempotency token: every accepted request is a new
//!   email (and ledger entry) per recipient, its headers kept in `params`.
//! - Faults as for the other providers: `InternalFailure` 500,
//!   `TooManyRequestsException` 429, a permanent error type per recipient
//!   (`Faults::permanent`, e.g. `MessageRejected`), cut-off answers.
//! - The mailbox simulator
//!   (<https://docs.aws.amazon.com/ses/latest/DeveloperGuide/mailbox-simulator.html>):
//!   `success@`, `bounce@`, `complaint@`, `suppressionlist@` and `ooto@
//!   simulator.amazonses.com` (with `+label`): a Delivery notification for
//!   every delivered email, a Permanent bounce for `bounce@` (General) and
//!   `suppressionlist@` (OnSuppressionList), a Delivery then a Complaint
//!   for `complaint@`, published through [`crate::sns`].
//! - Rendering: a template registered with its variables
//!   ([`crate::SimState::ses_template`]) whose `TemplateData` lacks one is
//!   still answered 200 with a `MessageId`, as SES answers it, but not
//!   sent: no ledger entry, no Delivery, counted `rendering_failure` (not
//!   `accepted`). When the send named a `ConfigurationSetName`, a
//!   `Rendering Failure` event (event-publishing format) is published to the
//!   SNS subscription; without one, nothing is published — SES sends that
//!   event only through a configuration set's event destination
//!   (<https://repost.aws/knowledge-center/ses-sendtemplatedemail-delivery-failure>).
//!   Templates not registered render whatever their data.

use crate::ledger::{Dedupe, Incoming, Verdict, cut_off, late, pause};
use crate::{SimState, sigv4};
use axum::{
    Json, Router,
    body::Bytes,
    extract::State,
    http::{HeaderMap, Method, StatusCode, Uri},
    response::{IntoResponse, Response},
    routing::{get, post},
};
use rand::Rng;
use serde_json::{Value, json};
use std::collections::BTreeMap;

const PROVIDER: &str = "ses-email";

/// The simulated account's verified sending domain.
pub const SES_IDENTITY: &str = "mail.pushonce.test";

/// Header names SES sets itself: not accepted in `Headers`.
const SET_BY_SES: [&str; 12] = [
    "bcc",
    "cc",
    "content-disposition",
    "content-type",
    "date",
    "from",
    "message-id",
    "mime-version",
    "reply-to",
    "return-path",
    "subject",
    "to",
];

/// The SES and SNS routes.
pub fn routes() -> Router<SimState> {
    Router::new()
        .route("/v2/email/outbound-emails", post(send_email))
        .route("/sns/", get(crate::sns::routes::confirm_subscription))
        .route("/sns/{file}", get(crate::sns::routes::certificate))
}

/// An AWS error answer: status, error type (`x-amzn-ErrorType`), message
/// (`{"message": ...}`), as AWS's REST-JSON services answer.
#[derive(Debug)]
pub struct AwsError(pub StatusCode, pub String, pub String);

impl IntoResponse for AwsError {
    fn into_response(self) -> Response {
        let AwsError(status, kind, message) = self;
        (
            status,
            [("x-amzn-errortype", kind)],
            Json(json!({ "message": message })),
        )
            .into_response()
    }
}

/// An [`AwsError`].
pub(crate) fn error(status: StatusCode, kind: &str, message: impl Into<String>) -> AwsError {
    AwsError(status, kind.to_string(), message.into())
}

fn bad(message: impl Into<String>) -> AwsError {
    error(StatusCode::BAD_REQUEST, "BadRequestException", message)
}

/// A validated `SendEmail` request.
struct Email {
    from: String,
    to: Vec<String>,
    template: String,
    params: Value,
    /// `ConfigurationSetName`, if named.
    configuration_set: Option<String>,
}

/// Validates the body as `SendEmail` does, or answers its refusal.
fn validate(body: &[u8]) -> Result<Email, AwsError> {
    let v: Value =
        serde_json::from_slice(body).map_err(|_| bad("Request body is not valid JSON."))?;
    let s = |p: &str| v.pointer(p).and_then(Value::as_str).map(str::to_string);
    let from = s("/FromEmailAddress")
        .filter(|f| !f.is_empty())
        .ok_or_else(|| bad("Missing required parameter FromEmailAddress."))?;
    let list = |p: &str| -> Result<Vec<String>, AwsError> {
        match v.pointer(p) {
            None => Ok(vec![]),
            Some(Value::Array(a)) => a
                .iter()
                .map(|x| {
                    x.as_str()
                        .map(str::to_string)
                        .ok_or_else(|| bad(format!("{p} must hold strings.")))
                })
                .collect(),
            Some(_) => Err(bad(format!("{p} must be a list."))),
        }
    };
    let to = list("/Destination/ToAddresses")?;
    let all = to.len()
        + list("/Destination/CcAddresses")?.len()
        + list("/Destination/BccAddresses")?.len();
    if all == 0 || all > 50 {
        return Err(bad("A message must have 1 to 50 recipients."));
    }
    if let Some(a) = to
        .iter()
        .find(|a| !a.contains('@') || a.contains(['\r', '\n']))
    {
        return Err(bad(format!("Illegal address {a:?}.")));
    }
    let content = v
        .get("Content")
        .and_then(Value::as_object)
        .ok_or_else(|| bad("Missing required parameter Content."))?;
    if content.len() != 1 {
        return Err(bad(
            "Content must have exactly one of Simple, Raw or Template.",
        ));
    }
    let (template, data, headers) = match (content.get("Template"), content.get("Simple")) {
        (Some(t), None) => {
            let name = t
                .get("TemplateName")
                .or_else(|| t.get("TemplateArn"))
                .and_then(Value::as_str)
                .ok_or_else(|| bad("Template must name TemplateName or TemplateArn."))?;
            let data = t
                .get("TemplateData")
                .and_then(Value::as_str)
                .unwrap_or("{}");
            if data.chars().count() > 262_144 {
                return Err(bad("TemplateData is longer than 262144 characters."));
            }
            let data: Value = serde_json::from_str(data)
                .ok()
                .filter(Value::is_object)
                .ok_or_else(|| bad("TemplateData is not a JSON object."))?;
            (name.to_string(), data, t.get("Headers"))
        }
        (None, Some(simple)) => {
            let subject = simple
                .pointer("/Subject/Data")
                .and_then(Value::as_str)
                .ok_or_else(|| bad("Simple content needs Subject.Data."))?;
            (subject.to_string(), json!({}), simple.get("Headers"))
        }
        _ => {
            return Err(bad(
                "The simulator takes Simple or Template content, not Raw.",
            ));
        }
    };
    let headers = check_headers(headers)?;
    let domain = from.rsplit('@').next().unwrap_or("").trim_end_matches('>');
    if !domain.eq_ignore_ascii_case(SES_IDENTITY) {
        return Err(error(
            StatusCode::BAD_REQUEST,
            "MessageRejected",
            format!(
                "Email address is not verified. The following identities failed the check in region {}: {from}",
                "the simulator's region"
            ),
        ));
    }
    let params = json!({
        "From": from,
        "TemplateData": data,
        "Headers": headers,
        "ConfigurationSetName": v.get("ConfigurationSetName"),
    });
    Ok(Email {
        from,
        to,
        template,
        params,
        configuration_set: s("/ConfigurationSetName"),
    })
}

/// `Headers`: at most 15 `{Name, Value}`, names SES does not set, each once.
fn check_headers(headers: Option<&Value>) -> Result<Value, AwsError> {
    let Some(headers) = headers else {
        return Ok(json!([]));
    };
    let list = headers
        .as_array()
        .ok_or_else(|| bad("Headers must be a list."))?;
    if list.len() > 15 {
        return Err(bad("At most 15 headers may be given."));
    }
    let mut seen = BTreeMap::new();
    for h in list {
        let (Some(name), Some(value)) = (
            h.get("Name").and_then(Value::as_str),
            h.get("Value").and_then(Value::as_str),
        ) else {
            return Err(bad("A header needs a Name and a Value."));
        };
        if name.is_empty()
            || name.len() > 126
            || !name
                .bytes()
                .all(|b| (b'!'..=b'~').contains(&b) && b != b':')
        {
            return Err(bad(format!("Invalid header name {name:?}.")));
        }
        if value.is_empty() || value.len() > 870 || value.contains(['\r', '\n']) {
            return Err(bad(format!("Invalid value of header {name}.")));
        }
        let lower = name.to_ascii_lowercase();
        if SET_BY_SES.contains(&lower.as_str()) {
            return Err(bad(format!(
                "Header {name} is set by SES and cannot be given."
            )));
        }
        if seen.insert(lower, ()).is_some() {
            return Err(bad(format!("Header {name} appears more than once.")));
        }
    }
    Ok(headers.clone())
}

async fn send_email(
    State(state): State<SimState>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if let Err(refusal) = sigv4::check(&state, &method, &uri, &headers, &body) {
        state.lock().count(PROVIDER, "bad_signature");
        return refusal.into_response();
    }
    let email = match validate(&body) {
        Ok(e) => e,
        Err(refusal) => {
            state.lock().count(PROVIDER, "bad_request");
            return refusal.into_response();
        }
    };
    pause(&state, PROVIDER).await;
    let mut sim = state.lock();
    let verdict = sim.draw(PROVIDER, &email.to[0]);
    // The variable the stored template uses and the data lacks, if any.
    let unrendered = sim
        .ses_templates
        .get(&email.template)
        .and_then(|vars| crate::ses_notify::missing_variable(vars, &email.params["TemplateData"]))
        .map(str::to_string);
    match (&verdict, &unrendered) {
        (Verdict::Accept { .. }, Some(_)) => sim.count(PROVIDER, "rendering_failure"),
        _ => sim.count(PROVIDER, verdict.outcome()),
    }
    let server_error = || {
        error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "InternalFailure",
            "The request processing has failed because of an unknown error, exception or failure.",
        )
        .into_response()
    };
    match verdict {
        Verdict::ServerError => server_error(),
        Verdict::RateLimited => error(
            StatusCode::TOO_MANY_REQUESTS,
            "TooManyRequestsException",
            "Maximum sending rate exceeded.",
        )
        .into_response(),
        Verdict::Permanent(kind) => {
            error(StatusCode::BAD_REQUEST, &kind, "refused for this recipient").into_response()
        }
        Verdict::DropBeforeAccept => cut_off(),
        Verdict::Accept { drop, fail } => {
            let message_id = format!(
                "{:016x}-{}-000000",
                crate::now_ms() << 8,
                crate::ledger::uuid(sim.rng.random())
            );
            if let Some(variable) = unrendered {
                // Answered as sent; never sent: no ledger entry, no Delivery.
                std::mem::drop(sim);
                if let Some(set) = &email.configuration_set {
                    state.sns_publish(&crate::ses_notify::rendering_failure(
                        &message_id,
                        &email.from,
                        &email.to,
                        set,
                        &email.template,
                        &variable,
                    ));
                }
                if drop {
                    return cut_off();
                }
                if fail {
                    return server_error();
                }
                return Json(json!({ "MessageId": message_id })).into_response();
            }
            for to in &email.to {
                sim.accept(
                    PROVIDER,
                    Incoming {
                        id: Some(message_id.clone()),
                        reference: None,
                        key: None,
                        recipient: to.clone(),
                        template: email.template.clone(),
                        params: email.params.clone(),
                    },
                    Dedupe::Never,
                );
            }
            let after_accept = sim.slow_after_accept(PROVIDER);
            std::mem::drop(sim);
            for to in &email.to {
                for n in crate::ses_notify::notifications(&message_id, &email.from, to) {
                    state.sns_publish(&n);
                }
            }
            let answer = if drop {
                cut_off()
            } else if fail {
                server_error()
            } else {
                Json(json!({ "MessageId": message_id })).into_response()
            };
            late(answer, after_accept)
        }
    }
}
