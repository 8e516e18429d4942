//! The SendEmail body, the error table and the notifications of the SES
//! documentation ("Amazon SNS notification examples for Amazon SES").

use super::*;

#[test]
fn send_email_body_uses_the_stored_template_with_headers() {
    let data = json!({"code": "1234"});
    let headers = one_click_headers("https://push.example/v1/unsubscribe/t0k");
    let body = send_email_body(&SendEmail {
        from: "noreply@mail.example",
        to: "user@example.com",
        template: "login-code",
        data: &data,
        headers: &headers,
        configuration_set: Some("pushonce"),
    });
    assert_eq!(
        body,
        json!({
            "FromEmailAddress": "noreply@mail.example",
            "Destination": {"ToAddresses": ["user@example.com"]},
            "Content": {"Template": {
                "TemplateName": "login-code",
                "TemplateData": "{\"code\":\"1234\"}",
                "Headers": [
                    {"Name": "List-Unsubscribe", "Value": "<https://push.example/v1/unsubscribe/t0k>"},
                    {"Name": "List-Unsubscribe-Post", "Value": "List-Unsubscribe=One-Click"}
                ]
            }},
            "ConfigurationSetName": "pushonce"
        })
    );
    let plain = send_email_body(&SendEmail {
        from: "a@b.c",
        to: "d@e.f",
        template: "t",
        data: &data,
        headers: &[],
        configuration_set: None,
    });
    assert!(plain["Content"]["Template"].get("Headers").is_none());
    assert!(plain.get("ConfigurationSetName").is_none());
}

#[test]
fn error_types_from_header_or_body() {
    assert_eq!(
        error_type(
            Some("MessageRejected:http://internal.amazon.com/coral/com.amazon.coral.service/"),
            b""
        )
        .as_deref(),
        Some("MessageRejected")
    );
    assert_eq!(
        error_type(
            None,
            br#"{"__type":"com.amazon#TooManyRequestsException","message":"x"}"#
        )
        .as_deref(),
        Some("TooManyRequestsException")
    );
    assert_eq!(error_type(None, b"<html>"), None);
}

#[test]
fn error_table() {
    use Class::*;
    let table = [
        (400, Some("MessageRejected"), Permanent),
        (400, Some("MailFromDomainNotVerifiedException"), Permanent),
        (400, Some("AccountSuspendedException"), Permanent),
        (400, Some("SendingPausedException"), Permanent),
        (400, Some("BadRequestException"), Permanent),
        (404, Some("NotFoundException"), Permanent),
        (429, Some("TooManyRequestsException"), Retryable),
        (400, Some("LimitExceededException"), Retryable),
        (429, None, Retryable),
        (500, Some("InternalFailure"), Unknown),
        (503, None, Unknown),
        (503, Some("MessageRejected"), Unknown),
        (403, Some("SignatureDoesNotMatchException"), Permanent),
        (403, Some("UnrecognizedClientException"), Permanent),
        (400, Some("SomethingNew"), Permanent),
    ];
    for (status, kind, class) in table {
        assert_eq!(classify(status, kind).class, class, "{status} {kind:?}");
    }
    assert!(
        classify(403, Some("SignatureDoesNotMatchException"))
            .cause
            .unwrap()
            .contains("secret_access_key")
    );
    assert_eq!(
        classify(400, Some("MessageRejected")).code,
        "MessageRejected (status 400)"
    );
}

/// "Amazon SNS notification examples for Amazon SES": a bounce with a DSN,
/// a complaint with a feedback report, a delivery (abridged to the fields
/// read, plus one unknown field).
#[test]
fn documented_notifications() {
    let bounce = r#"{"notificationType":"Bounce","bounce":{"bounceType":"Permanent","reportingMTA":"dns; email.example.com","bouncedRecipients":[{"emailAddress":"jane@example.com","status":"5.1.1","action":"failed","diagnosticCode":"smtp; 550 5.1.1 <jane@example.com>... User"}],"bounceSubType":"General","timestamp":"2016-01-27T14:59:38.237Z","feedbackId":"00000138111222aa-33322211-cccc-cccc-cccc-ddddaaaa068a-000000","remoteMtaIp":"127.0.2.0"},"mail":{"timestamp":"2016-01-27T14:59:38.237Z","source":"john@example.com","messageId":"00000138111222aa-33322211-cccc-cccc-cccc-ddddaaaa0680-000000","destination":["jane@example.com"],"somethingNew":1}}"#;
    assert_eq!(
        notice(bounce),
        Ok(Notice::Bounce {
            message_id: "00000138111222aa-33322211-cccc-cccc-cccc-ddddaaaa0680-000000".into(),
            kind: BounceKind::Permanent,
            sub_type: "General".into(),
            recipients: vec!["jane@example.com".into()],
        })
    );
    let complaint = r#"{"notificationType":"Complaint","complaint":{"userAgent":"AnyCompany Feedback Loop (V0.01)","complainedRecipients":[{"emailAddress":"richard@example.com"}],"complaintFeedbackType":"abuse","arrivalDate":"2016-01-27T14:59:38.237Z","timestamp":"2016-01-27T14:59:38.237Z","feedbackId":"000001378603177f-18c07c78-fa81-4a58-9dd1-fedc3cb8f49a-000000"},"mail":{"timestamp":"2016-01-27T14:59:38.237Z","messageId":"000001378603177f-7a5433e7-8edb-42ae-af10-f0181f34d6ee-000000","source":"john@example.com","destination":["richard@example.com"]}}"#;
    assert_eq!(
        notice(complaint),
        Ok(Notice::Complaint {
            message_id: "000001378603177f-7a5433e7-8edb-42ae-af10-f0181f34d6ee-000000".into(),
            recipients: vec!["richard@example.com".into()],
            feedback_type: Some("abuse".into()),
        })
    );
    let delivery = r#"{"notificationType":"Delivery","mail":{"timestamp":"2016-01-27T14:59:38.237Z","messageId":"0000014644fe5ef6-9a483358-9170-4cb4-a269-f5dcdf415321-000000","source":"john@example.com","destination":["jane@example.com"]},"delivery":{"timestamp":"2016-01-27T14:59:38.237Z","recipients":["jane@example.com"],"processingTimeMillis":546,"reportingMTA":"a8-70.smtp-out.amazonses.com","smtpResponse":"250 ok:  Message 64111812 accepted","remoteMtaIp":"127.0.2.0"}}"#;
    assert_eq!(
        notice(delivery),
        Ok(Notice::Delivery {
            message_id: "0000014644fe5ef6-9a483358-9170-4cb4-a269-f5dcdf415321-000000".into()
        })
    );
    let event = r#"{"eventType":"Delivery","mail":{"messageId":"m1"}}"#;
    assert_eq!(
        notice(event),
        Ok(Notice::Delivery {
            message_id: "m1".into()
        })
    );
    assert!(notice(r#"{"notificationType":"Open","mail":{"messageId":"m"}}"#).is_err());
    assert!(
        notice(r#"{"notificationType":"Bounce","mail":{}}"#)
            .unwrap_err()
            .contains("messageId")
    );
    assert!(notice("nope").is_err());
}

/// Event publishing's `Rendering Failure` (the AWS knowledge-center
/// example, "ses-sendtemplatedemail-delivery-failure", whose `mail` is
/// elided there: filled in here in the shape of the event-publishing
/// examples' Bounce record) and `Reject` (event
/// type and `reject` object per "Contents of event data that Amazon SES
/// publishes to Amazon SNS"; the `reason` text here is illustrative):
/// both say SES did not send the email.
#[test]
fn rendering_failure_and_reject_events_say_not_sent() {
    let rendering = r#"{"eventType":"Rendering Failure","mail":{"timestamp":"2018-01-22T18:43:06.197Z","source":"sender@example.com","sourceArn":"arn:aws:ses:us-east-1:123456789012:identity/sender@example.com","sendingAccountId":"123456789012","messageId":"EXAMPLE7c191be45-e9aedb9a-02f9-4d12-a87d-dd0099a07f8a-000000","destination":["recipient@example.com"],"headersTruncated":false,"tags":{"ses:configuration-set":["ConfigSet"]}},"failure":{"errorMessage":"Attribute 'favoritecolor' is not present in the rendering data.","templateName":"ExampleTemplate"}}"#;
    assert_eq!(
        notice(rendering),
        Ok(Notice::NotSent {
            message_id: "EXAMPLE7c191be45-e9aedb9a-02f9-4d12-a87d-dd0099a07f8a-000000".into(),
            kind: NotSentKind::RenderingFailure,
            reason: "Attribute 'favoritecolor' is not present in the rendering data. (template ExampleTemplate)".into(),
        })
    );
    let reject = r#"{"eventType":"Reject","mail":{"timestamp":"2016-10-14T17:38:15.211Z","source":"sender@example.com","sendingAccountId":"123456789012","messageId":"EXAMPLE7c191be45-e9aedb9a-02f9-4d12-a87d-dd0099a07f8a-000000","destination":["recipient@example.com"]},"reject":{"reason":"Bad content"}}"#;
    assert_eq!(
        notice(reject),
        Ok(Notice::NotSent {
            message_id: "EXAMPLE7c191be45-e9aedb9a-02f9-4d12-a87d-dd0099a07f8a-000000".into(),
            kind: NotSentKind::Reject,
            reason: "Bad content".into(),
        })
    );
    // Without its object, the event still says "not sent", with no reason.
    let bare = notice(r#"{"eventType":"Rendering Failure","mail":{"messageId":"m"}}"#).unwrap();
    assert!(
        matches!(&bare, Notice::NotSent { kind: NotSentKind::RenderingFailure, reason, .. } if reason.contains("errorMessage")),
        "{bare:?}"
    );
    // The event types that say nothing about the outcome stay unread.
    for other in ["Send", "Open", "Click", "DeliveryDelay", "Subscription"] {
        let text = format!(r#"{{"eventType":"{other}","mail":{{"messageId":"m"}}}}"#);
        assert!(notice(&text).is_err(), "{other}");
    }
    assert_eq!(NotSentKind::RenderingFailure.as_str(), "Rendering Failure");
}
