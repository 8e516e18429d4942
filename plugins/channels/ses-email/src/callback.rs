//! SNS's posts to the channel's callback URL: verified, then a subscription
//! confirmed, or an SES notification turned into settlements and opt-outs.
//!
//! Every message is refused (`forbidden`, 403) unless its `SigningCertURL`
//! is `https://` under `sns_endpoint`, its topic is allowed (`topic_arns`)
//! and its signature verifies with that certificate. A certificate that
//! cannot be fetched answers 503, so SNS delivers the message again.

use channel_sdk::callback::reply;
use channel_sdk::provider::auth::aws::ses::{self, BounceKind, Notice};
use channel_sdk::provider::auth::aws::sns::{self, Kind};
use channel_sdk::{
    CallbackError, CallbackReply, CallbackRequest, DeliveryStatus, Settlement, http,
};

use crate::bindings::exports::pushonce::channel::callbacks::{
    CallbackOutcome, OptOut, OptOutRoute, OptOutSubject,
};
use crate::cert::{self, CertError};
use crate::settings::CallbackSettings;

/// Handles one SNS post.
pub fn handle(req: CallbackRequest) -> Result<CallbackOutcome, CallbackError> {
    use CallbackError::{Forbidden, Malformed};
    if req.method != "POST" {
        return Err(Malformed("SNS posts its messages (POST)".into()));
    }
    let msg = sns::parse(&req.body).map_err(|e| Malformed(e.to_string()))?;
    match req.header("x-amz-sns-message-type") {
        Some(t) if t == msg.kind.as_str() => {}
        Some(t) => {
            return Err(Malformed(format!(
                "x-amz-sns-message-type {t:?} is not the body's Type {:?}",
                msg.kind.as_str()
            )));
        }
        None => return Err(Malformed("no x-amz-sns-message-type header".into())),
    }
    let settings = CallbackSettings::read().map_err(Forbidden)?;
    sns::check_url(
        "SigningCertURL",
        &msg.signing_cert_url,
        &settings.sns_endpoint,
    )
    .map_err(|e| Forbidden(e.to_string()))?;
    if !settings.topic_arns.contains(&msg.topic_arn) {
        return Err(Forbidden(format!(
            "topic {} is not in the channel's topic_arns",
            msg.topic_arn
        )));
    }
    let pem = match cert::certificate(&msg.signing_cert_url) {
        Ok(pem) => pem,
        Err(CertError::Unavailable(why)) => {
            return Ok(outcome(
                vec![],
                vec![],
                again(&format!(
                    "the signing certificate could not be fetched: {why}"
                )),
            ));
        }
        Err(CertError::Unusable(e)) => return Err(Forbidden(e.to_string())),
    };
    sns::verify(&msg, &pem).map_err(|e| Forbidden(e.to_string()))?;
    match msg.kind {
        Kind::SubscriptionConfirmation => confirm(&msg, &settings),
        Kind::UnsubscribeConfirmation => Ok(outcome(vec![], vec![], ok())),
        Kind::Notification => notification(&msg.message),
    }
}

/// Confirms the subscription: GET its `SubscribeURL` (under the endpoint).
fn confirm(
    msg: &sns::Message,
    settings: &CallbackSettings,
) -> Result<CallbackOutcome, CallbackError> {
    let url = msg.subscribe_url.as_deref().unwrap_or_default();
    sns::check_url("SubscribeURL", url, &settings.sns_endpoint)
        .map_err(|e| CallbackError::Forbidden(e.to_string()))?;
    let answer = match http::get(url) {
        Ok(r) if r.status == 200 => ok(),
        Ok(r) => again(&format!("ConfirmSubscription answered status {}", r.status)),
        Err(e) => again(&format!("ConfirmSubscription failed: {e}")),
    };
    Ok(outcome(vec![], vec![], answer))
}

/// An SES notification: Delivery settles delivered; a bounce settles
/// failed, and a permanent one opts each bounced address out; a complaint
/// opts each complaining address out and settles nothing; a `Rendering
/// Failure` or `Reject` event (SES never sent the email) settles failed —
/// the receipt the host treats as failed for good — and opts nobody out
/// (the address did nothing wrong).
fn notification(message: &str) -> Result<CallbackOutcome, CallbackError> {
    let notice = ses::notice(message).map_err(CallbackError::Malformed)?;
    let settle = |id: String, status, detail: Option<String>| Settlement { id, status, detail };
    let (settlements, opt_outs) = match notice {
        Notice::Delivery { message_id } => (
            vec![settle(message_id, DeliveryStatus::Delivered, None)],
            vec![],
        ),
        Notice::Bounce {
            message_id,
            kind,
            sub_type,
            recipients,
        } => {
            let detail = format!("SES bounce {kind:?}/{sub_type}");
            let opt_outs = match kind {
                BounceKind::Permanent => opt_outs(&recipients, &detail),
                BounceKind::Transient | BounceKind::Undetermined => vec![],
            };
            (
                vec![settle(message_id, DeliveryStatus::Failed, Some(detail))],
                opt_outs,
            )
        }
        Notice::Complaint {
            recipients,
            feedback_type,
            ..
        } => {
            let detail = format!(
                "SES complaint ({})",
                feedback_type.as_deref().unwrap_or("no feedback type")
            );
            (vec![], opt_outs(&recipients, &detail))
        }
        Notice::NotSent {
            message_id,
            kind,
            reason,
        } => {
            let detail = format!("SES {} (not sent): {reason}", kind.as_str());
            (
                vec![settle(message_id, DeliveryStatus::Failed, Some(detail))],
                vec![],
            )
        }
    };
    Ok(outcome(settlements, opt_outs, ok()))
}

/// One opt-out of this channel per address, by the address as SES reports
/// it and its lower-case form (the form it may have been sent to).
fn opt_outs(addresses: &[String], detail: &str) -> Vec<OptOut> {
    addresses
        .iter()
        .map(|a| {
            let mut forms = vec![a.clone()];
            let lower = a.to_ascii_lowercase();
            if lower != *a {
                forms.push(lower);
            }
            OptOut {
                subject: OptOutSubject::Address(forms),
                category: None,
                route: OptOutRoute::Bounce,
                detail: Some(detail.to_string()),
            }
        })
        .collect()
}

fn outcome(
    settlements: Vec<Settlement>,
    opt_outs: Vec<OptOut>,
    reply: CallbackReply,
) -> CallbackOutcome {
    CallbackOutcome {
        settlements,
        opt_outs,
        reply,
    }
}

/// 200: SNS counts any 2xx as delivered.
fn ok() -> CallbackReply {
    reply(200, "text/plain; charset=utf-8", b"ok".to_vec())
}

/// 503: SNS delivers the message again (its delivery policy's retries).
fn again(why: &str) -> CallbackReply {
    let mut r = reply(503, "text/plain; charset=utf-8", why.as_bytes().to_vec());
    r.headers.push(("retry-after".into(), "20".into()));
    r
}
