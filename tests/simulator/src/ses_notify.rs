//! The SES notifications an accepted email leads to, in the format of
//! "Amazon SNS notification contents for Amazon SES"
//! (<https://docs.aws.amazon.com/ses/latest/dg/notification-contents.html>),
//! chosen by the mailbox simulator's addresses ("Testing email sending in Amazon SES",
//! <https://docs.aws.amazon.com/ses/latest/DeveloperGuide/mailbox-simulator.html>):
//!
//! | To (`+label` allowed) | Notifications |
//! |---|---|
//! | `bounce@simulator.amazonses.com` | Bounce, `Permanent` / `General`, status 5.1.1 |
//! | `suppressionlist@simulator.amazonses.com` | Bounce, `Permanent` / `OnSuppressionList` |
//! | `complaint@simulator.amazonses.com` | Delivery, then Complaint (`abuse`) |
//! | any other address (`success@`, `ooto@`...) | Delivery |

use serde_json::{Value, json};

/// The mailbox simulator's domain.
pub const SIMULATOR_DOMAIN: &str = "simulator.amazonses.com";

/// The mailbox simulator's scenario of `to`, by its local part without a label.
fn scenario(to: &str) -> Option<String> {
    let (local, domain) = to.rsplit_once('@')?;
    if !domain.eq_ignore_ascii_case(SIMULATOR_DOMAIN) {
        return None;
    }
    Some(
        local
            .split('+')
            .next()
            .unwrap_or(local)
            .to_ascii_lowercase(),
    )
}

/// `mail` of a notification.
fn mail(message_id: &str, from: &str, to: &str) -> Value {
    json!({
        "timestamp": now(),
        "source": from,
        "sourceArn": format!("arn:aws:ses:us-east-1:123456789012:identity/{}", crate::ses::SES_IDENTITY),
        "sendingAccountId": "123456789012",
        "messageId": message_id,
        "destination": [to],
    })
}

fn now() -> String {
    let now = time::OffsetDateTime::now_utc();
    let format = time::macros::format_description!(
        "[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:3]Z"
    );
    now.format(format).unwrap_or_default()
}

fn feedback_id() -> String {
    format!(
        "{:016x}-{}-000000",
        crate::now_ms(),
        crate::ledger::uuid(rand::random())
    )
}

/// A Delivery notification.
pub fn delivery(message_id: &str, from: &str, to: &str) -> Value {
    json!({
        "notificationType": "Delivery",
        "mail": mail(message_id, from, to),
        "delivery": {
            "timestamp": now(),
            "processingTimeMillis": 546,
            "recipients": [to],
            "smtpResponse": "250 ok:  Message accepted",
            "reportingMTA": "a8-70.smtp-out.amazonses.com",
        },
    })
}

/// A Bounce notification of `kind` / `sub_type` for `to`.
pub fn bounce(message_id: &str, from: &str, to: &str, kind: &str, sub_type: &str) -> Value {
    json!({
        "notificationType": "Bounce",
        "mail": mail(message_id, from, to),
        "bounce": {
            "bounceType": kind,
            "bounceSubType": sub_type,
            "bouncedRecipients": [{
                "emailAddress": to,
                "action": "failed",
                "status": "5.1.1",
                "diagnosticCode": "smtp; 550 5.1.1 user unknown",
            }],
            "timestamp": now(),
            "feedbackId": feedback_id(),
            "reportingMTA": "dsn; a8-70.smtp-out.amazonses.com",
        },
    })
}

/// A Complaint notification from `to`.
pub fn complaint(message_id: &str, from: &str, to: &str) -> Value {
    json!({
        "notificationType": "Complaint",
        "mail": mail(message_id, from, to),
        "complaint": {
            "complainedRecipients": [{"emailAddress": to}],
            "timestamp": now(),
            "feedbackId": feedback_id(),
            "userAgent": "Amazon SES Mailbox Simulator",
            "complaintFeedbackType": "abuse",
            "arrivalDate": now(),
        },
    })
}

/// The first of `variables` that `data` (the `TemplateData` object) lacks:
/// a name, or a dotted path into nested objects (`user.name`). A key whose
/// value is `null` is present.
pub fn missing_variable<'a>(variables: &'a [String], data: &Value) -> Option<&'a str> {
    variables
        .iter()
        .find(|v| v.split('.').try_fold(data, |at, key| at.get(key)).is_none())
        .map(String::as_str)
}

/// A `Rendering Failure` event in the event-publishing format ("Contents of
/// event data that Amazon SES publishes to Amazon SNS",
/// <https://docs.aws.amazon.com/ses/latest/dg/event-publishing-retrieving-sns-contents.html>:
/// `eventType`, `mail`, and `failure` with `errorMessage` and
/// `templateName`), for an email `message_id` whose template `template`
/// uses `variable`, absent from its data; the error message as in AWS's
/// knowledge-center example
/// (<https://repost.aws/knowledge-center/ses-sendtemplatedemail-delivery-failure>).
pub fn rendering_failure(
    message_id: &str,
    from: &str,
    to: &[String],
    configuration_set: &str,
    template: &str,
    variable: &str,
) -> Value {
    let mut mail = mail(message_id, from, "");
    mail["destination"] = json!(to);
    mail["headersTruncated"] = json!(false);
    mail["tags"] = json!({ "ses:configuration-set": [configuration_set] });
    json!({
        "eventType": "Rendering Failure",
        "mail": mail,
        "failure": {
            "errorMessage": format!("Attribute '{variable}' is not present in the rendering data."),
            "templateName": template,
        },
    })
}

/// What SES publishes for an email `message_id` accepted for `to`.
pub fn notifications(message_id: &str, from: &str, to: &str) -> Vec<Value> {
    match scenario(to).as_deref() {
        Some("bounce") => vec![bounce(message_id, from, to, "Permanent", "General")],
        Some("suppressionlist") => vec![bounce(
            message_id,
            from,
            to,
            "Permanent",
            "OnSuppressionList",
        )],
        Some("complaint") => vec![
            delivery(message_id, from, to),
            complaint(message_id, from, to),
        ],
        _ => vec![delivery(message_id, from, to)],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mailbox_simulator_addresses() {
        let kinds = |to: &str| -> Vec<String> {
            notifications("m", "a@b", to)
                .iter()
                .map(|n| n["notificationType"].as_str().unwrap().to_string())
                .collect()
        };
        assert_eq!(kinds("bounce@simulator.amazonses.com"), ["Bounce"]);
        assert_eq!(kinds("bounce+x1@simulator.amazonses.com"), ["Bounce"]);
        assert_eq!(
            kinds("complaint@simulator.amazonses.com"),
            ["Delivery", "Complaint"]
        );
        assert_eq!(kinds("success@simulator.amazonses.com"), ["Delivery"]);
        assert_eq!(kinds("bounce@example.com"), ["Delivery"]);
        let b = &notifications("m", "a@b", "suppressionlist@simulator.amazonses.com")[0];
        assert_eq!(b["bounce"]["bounceSubType"], "OnSuppressionList");
        assert_eq!(b["mail"]["messageId"], "m");
    }

    #[test]
    fn a_missing_variable_is_found_by_name_or_path() {
        let vars: Vec<String> = ["name", "user.color"].map(String::from).to_vec();
        let data = json!({"name": "Ada", "user": {"color": null}});
        assert_eq!(missing_variable(&vars, &data), None);
        let data = json!({"name": "Ada", "user": {}});
        assert_eq!(missing_variable(&vars, &data), Some("user.color"));
        assert_eq!(missing_variable(&vars, &json!({})), Some("name"));
        assert_eq!(missing_variable(&[], &json!({})), None);
    }

    #[test]
    fn a_rendering_failure_is_an_event_publishing_record() {
        let to = vec!["u@example.com".to_string()];
        let e = rendering_failure(
            "m1",
            "a@b",
            &to,
            "pushonce",
            "ExampleTemplate",
            "favoritecolor",
        );
        assert!(e.get("notificationType").is_none(), "{e}");
        assert_eq!(e["eventType"], "Rendering Failure");
        assert_eq!(e["mail"]["messageId"], "m1");
        assert_eq!(e["mail"]["destination"], json!(["u@example.com"]));
        assert_eq!(
            e["mail"]["tags"]["ses:configuration-set"],
            json!(["pushonce"])
        );
        assert_eq!(
            e["failure"],
            json!({
                "errorMessage": "Attribute 'favoritecolor' is not present in the rendering data.",
                "templateName": "ExampleTemplate",
            })
        );
    }
}
