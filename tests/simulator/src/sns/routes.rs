//! SNS's own endpoints under `<base>/sns/`: `ConfirmSubscription` (the
//! `SubscribeURL`) and the signing certificate (the `SigningCertURL`).

use crate::SimState;
use axum::{
    extract::{Path, Query, State},
    http::{StatusCode, Uri},
    response::{IntoResponse, Response},
};
use std::collections::BTreeMap;

const PROVIDER: &str = "ses-email";

/// `GET /sns/?Action=ConfirmSubscription&TopicArn&Token`: SNS's answer.
pub(crate) async fn confirm_subscription(
    State(state): State<SimState>,
    uri: Uri,
    Query(q): Query<BTreeMap<String, String>>,
) -> Response {
    let (Some("ConfirmSubscription"), Some(topic), Some(token)) = (
        q.get("Action").map(String::as_str),
        q.get("TopicArn"),
        q.get("Token"),
    ) else {
        return (StatusCode::BAD_REQUEST, "<ErrorResponse><Error><Type>Sender</Type><Code>InvalidParameter</Code><Message>Invalid parameter</Message></Error></ErrorResponse>").into_response();
    };
    if !state.sns.confirm(uri.to_string(), topic, token) {
        return (StatusCode::BAD_REQUEST, "<ErrorResponse><Error><Type>Sender</Type><Code>InvalidParameter</Code><Message>Invalid token</Message></Error></ErrorResponse>").into_response();
    }
    state.lock().count(PROVIDER, "sns_confirmed");
    let xml = format!(
        "<ConfirmSubscriptionResponse><ConfirmSubscriptionResult><SubscriptionArn>{topic}:sim-subscription</SubscriptionArn></ConfirmSubscriptionResult></ConfirmSubscriptionResponse>"
    );
    ([("content-type", "text/xml")], xml).into_response()
}

/// `GET /sns/SimpleNotificationService-<id>.pem`: the signing certificate.
pub(crate) async fn certificate(
    State(state): State<SimState>,
    Path(file): Path<String>,
) -> Response {
    match state.sns.cert_named(&file) {
        Some(pem) => ([("content-type", "application/x-x509-ca-cert")], pem).into_response(),
        None => StatusCode::NOT_FOUND.into_response(),
    }
}
