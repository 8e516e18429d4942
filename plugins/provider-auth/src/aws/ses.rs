//! Amazon SES API v2: the `SendEmail` request body, its error table, and
//! the SES notifications SNS delivers.
//!
//! `SendEmail`: `POST /v2/email/outbound-emails`, JSON
//! (<https://docs.aws.amazon.com/ses/latest/APIReference-V2/API_SendEmail.html>),
//! answered `200 {"MessageId": "..."}`. Content is a stored template
//! (`Content.Template { TemplateName, TemplateData, Headers }`,
//! <https://docs.aws.amazon.com/ses/latest/APIReference-V2/API_Template.html>):
//! `Headers` is documented on `Template` (0 to 15 `MessageHeader`s), added
//! with `Simple.Headers` on 2024-03-05 ("Adds support for providing custom
//! headers within SendEmail and SendBulkEmail for SESv2").
//!
//! Errors ("Errors" of the same page): `AccountSuspendedException`,
//! `BadRequestException`, `LimitExceededException`,
//! `MailFromDomainNotVerifiedException`, `MessageRejected`,
//! `NotFoundException`, `SendingPausedException` (400/404) and
//! `TooManyRequestsException` (429); the type is in the `x-amzn-ErrorType`
//! header (and `__type` of some bodies). See [`classify`].
//!
//! Notifications: "Amazon SNS notification contents for Amazon SES"
//! (<https://docs.aws.amazon.com/ses/latest/dg/notification-contents.html>):
//! a JSON object with `notificationType` (`Bounce`, `Complaint`,
//! `Delivery`), `mail` (`messageId`: the `SendEmail` `MessageId`), and
//! `bounce` (`bounceType` `Undetermined` / `Permanent` / `Transient`,
//! `bounceSubType`, `bouncedRecipients[].emailAddress`), `complaint`
//! (`complainedRecipients[].emailAddress`, `complaintFeedbackType`) or
//! `delivery` (`recipients`). Unknown fields are ignored, as the page asks.
//!
//! Event publishing through a configuration set ("Contents of event data
//! that Amazon SES publishes to Amazon SNS",
//! <https://docs.aws.amazon.com/ses/latest/dg/event-publishing-retrieving-sns-contents.html>)
//! writes `eventType` instead of `notificationType`, and adds event types
//! the identity's notifications never carry; two of them say SES did not
//! send the email at all, though `SendEmail` answered a `MessageId`:
//! - `Rendering Failure` (object `failure`: `errorMessage`, `templateName`):
//!   the template data lacks a variable the template uses
//!   (<https://repost.aws/knowledge-center/ses-sendtemplatedemail-delivery-failure>,
//!   e.g. "Attribute 'favoritecolor' is not present in the rendering data.");
//! - `Reject` (object `reject`, its `reason`): "SES accepted the email, but
//!   determined that it contained a virus and didn't attempt to deliver it"
//!   (`REJECT`, <https://docs.aws.amazon.com/ses/latest/APIReference-V2/API_EventDestination.html>).
//!
//! Both are read as [`Notice::NotSent`].

use serde_json::{Value, json};

use crate::{Class, Refusal};

/// One email to send with a stored template.
#[derive(Debug, Clone)]
pub struct SendEmail<'a> {
    /// `FromEmailAddress` (a verified identity).
    pub from: &'a str,
    /// The one `Destination.ToAddresses` entry.
    pub to: &'a str,
    /// `TemplateName`: the template stored in SES.
    pub template: &'a str,
    /// `TemplateData`: the template's variables (serialised as a JSON string).
    pub data: &'a Value,
    /// `Headers` (name, value), e.g. `List-Unsubscribe`.
    pub headers: &'a [(String, String)],
    /// `ConfigurationSetName`, when configured.
    pub configuration_set: Option<&'a str>,
}

/// At most this many `Headers` on a `Template` (API_Template, "Array Members").
pub const MAX_HEADERS: usize = 15;

/// The `SendEmail` request body of `email`.
pub fn send_email_body(email: &SendEmail<'_>) -> Value {
    let headers: Vec<Value> = email
        .headers
        .iter()
        .map(|(name, value)| json!({"Name": name, "Value": value}))
        .collect();
    let mut template = json!({
        "TemplateName": email.template,
        "TemplateData": email.data.to_string(),
    });
    if !headers.is_empty() {
        template["Headers"] = Value::Array(headers);
    }
    let mut body = json!({
        "FromEmailAddress": email.from,
        "Destination": {"ToAddresses": [email.to]},
        "Content": {"Template": template},
    });
    if let Some(set) = email.configuration_set {
        body["ConfigurationSetName"] = json!(set);
    }
    body
}

/// The RFC 8058 one-click headers for an unsubscribe `url`, in the order the
/// SES one-click guidance gives (`List-Unsubscribe` first).
pub fn one_click_headers(url: &str) -> Vec<(String, String)> {
    vec![
        ("List-Unsubscribe".into(), format!("<{url}>")),
        (
            "List-Unsubscribe-Post".into(),
            "List-Unsubscribe=One-Click".into(),
        ),
    ]
}

/// The error type of a refusal: the `x-amzn-ErrorType` header up to its
/// first `:`, else the body's `__type` after its last `#`, else `code`.
pub fn error_type(header: Option<&str>, body: &[u8]) -> Option<String> {
    if let Some(h) = header.map(|h| h.split(':').next().unwrap_or(h).trim())
        && !h.is_empty()
    {
        return Some(h.to_string());
    }
    let v: Value = serde_json::from_slice(body).ok()?;
    let t = v
        .get("__type")
        .or_else(|| v.get("code"))
        .or_else(|| v.get("Code"))?
        .as_str()?;
    Some(t.rsplit('#').next().unwrap_or(t).to_string())
}

/// Sorts a refused `SendEmail` by status and error type. A 5xx is unknown
/// whatever its type (the request was written: SES documents no 5xx as "not
/// sent"); 429, `TooManyRequestsException` and `LimitExceededException`
/// retryable; the documented content, identity and account refusals and
/// the credential errors permanent, with the operator's cause; anything
/// else permanent.
pub fn classify(status: u16, error_type: Option<&str>) -> Refusal {
    use Class::{Permanent, Retryable, Unknown};
    let code = error_type.unwrap_or("").trim_end_matches("Exception");
    let r = |class| {
        Refusal::new(
            class,
            match error_type {
                Some(t) => format!("{t} (status {status})"),
                None => format!("status {status}"),
            },
        )
    };
    if status >= 500 {
        return r(Unknown);
    }
    match code {
        "TooManyRequests" | "LimitExceeded" | "Throttling" => r(Retryable),
        _ if status == 429 => r(Retryable),
        "MessageRejected" => r(Permanent),
        "MailFromDomainNotVerified" => {
            r(Permanent).because("the MAIL FROM domain of the sending identity is not verified")
        }
        "AccountSuspended" => r(Permanent).because("the SES account may no longer send email"),
        "SendingPaused" => {
            r(Permanent).because("sending is paused for the account or the configuration set")
        }
        "NotFound" => r(Permanent).because("the template or configuration set does not exist"),
        "BadRequest" => r(Permanent),
        "SignatureDoesNotMatch" | "InvalidSignature" | "IncompleteSignature" => r(Permanent)
            .because("the request signature was refused: check `secret_access_key` and `region`"),
        "UnrecognizedClient" | "InvalidClientTokenId" => {
            r(Permanent).because("the access key id is unknown: check `access_key_id`")
        }
        "AccessDenied" => r(Permanent).because("the access key may not call ses:SendEmail (IAM)"),
        "RequestExpired" => r(Retryable).because("the host's clock is more than 5 minutes off"),
        _ => r(Permanent),
    }
}

/// What an SES notification says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Notice {
    /// The receiving server accepted the email.
    Delivery {
        /// `mail.messageId`.
        message_id: String,
    },
    /// The email bounced.
    Bounce {
        /// `mail.messageId`.
        message_id: String,
        /// `bounceType`.
        kind: BounceKind,
        /// `bounceSubType`, e.g. `General`, `NoEmail`, `Suppressed`.
        sub_type: String,
        /// `bouncedRecipients[].emailAddress`.
        recipients: Vec<String>,
    },
    /// A recipient marked the email as spam.
    Complaint {
        /// `mail.messageId`.
        message_id: String,
        /// `complainedRecipients[].emailAddress`.
        recipients: Vec<String>,
        /// `complaintFeedbackType`, when the report has one (`abuse`...).
        feedback_type: Option<String>,
    },
    /// SES took the request (it answered a `MessageId`) but did not send
    /// the email: a `Rendering Failure` or a `Reject` event.
    NotSent {
        /// `mail.messageId`.
        message_id: String,
        /// Which event said so.
        kind: NotSentKind,
        /// Why, in SES's words: `failure.errorMessage` (with
        /// `failure.templateName`) or `reject.reason`.
        reason: String,
    },
}

/// Why SES did not send an email it had answered a `MessageId` for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotSentKind {
    /// `Rendering Failure`: the template could not be rendered with the
    /// template data (e.g. a variable is missing).
    RenderingFailure,
    /// `Reject`: SES found a virus and did not attempt delivery.
    Reject,
}

impl NotSentKind {
    /// The event type as SES writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            NotSentKind::RenderingFailure => "Rendering Failure",
            NotSentKind::Reject => "Reject",
        }
    }
}

/// A bounce's `bounceType`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BounceKind {
    /// A hard bounce: remove the address ("unlikely that you'll be able to
    /// send email to that recipient in the future").
    Permanent,
    /// A soft bounce (mailbox full, message too large...).
    Transient,
    /// The receiving server did not say why.
    Undetermined,
}

/// Reads an SES notification (an SNS `Message`), or says what is wrong.
/// Configuration-set event publishing writes `eventType` instead of
/// `notificationType` around the same objects: both are read, and so are
/// its `Rendering Failure` and `Reject` events ([`Notice::NotSent`]).
pub fn notice(message: &str) -> Result<Notice, String> {
    let v: Value =
        serde_json::from_str(message).map_err(|e| format!("not an SES notification: {e}"))?;
    let s = |v: &Value, path: &str| v.pointer(path).and_then(Value::as_str).map(str::to_string);
    let kind = s(&v, "/notificationType")
        .or_else(|| s(&v, "/eventType"))
        .ok_or("an SES notification without `notificationType`")?;
    let message_id =
        s(&v, "/mail/messageId").ok_or("an SES notification without `mail.messageId`")?;
    let addresses = |list: &str| -> Vec<String> {
        v.pointer(list)
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(|r| s(r, "/emailAddress")).collect())
            .unwrap_or_default()
    };
    match kind.as_str() {
        "Delivery" => Ok(Notice::Delivery { message_id }),
        "Bounce" => {
            let kind = match s(&v, "/bounce/bounceType").as_deref() {
                Some("Permanent") => BounceKind::Permanent,
                Some("Transient") => BounceKind::Transient,
                Some("Undetermined") => BounceKind::Undetermined,
                other => return Err(format!("a bounce whose `bounceType` is {other:?}")),
            };
            Ok(Notice::Bounce {
                message_id,
                kind,
                sub_type: s(&v, "/bounce/bounceSubType").unwrap_or_default(),
                recipients: addresses("/bounce/bouncedRecipients"),
            })
        }
        "Complaint" => Ok(Notice::Complaint {
            message_id,
            recipients: addresses("/complaint/complainedRecipients"),
            feedback_type: s(&v, "/complaint/complaintFeedbackType"),
        }),
        "Rendering Failure" => {
            let message = s(&v, "/failure/errorMessage")
                .unwrap_or_else(|| "no `failure.errorMessage`".to_string());
            let reason = match s(&v, "/failure/templateName") {
                Some(t) => format!("{message} (template {t})"),
                None => message,
            };
            Ok(Notice::NotSent {
                message_id,
                kind: NotSentKind::RenderingFailure,
                reason,
            })
        }
        "Reject" => Ok(Notice::NotSent {
            message_id,
            kind: NotSentKind::Reject,
            reason: s(&v, "/reject/reason").unwrap_or_else(|| "no `reject.reason`".to_string()),
        }),
        other => Err(format!("an SES notification of type {other:?}")),
    }
}

#[cfg(test)]
mod tests;
